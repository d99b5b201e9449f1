//! The flow-control table of a store shared by replicas ([`Cluster::flow_round`]): the entries
//! that hold or wait for a running-task slot, and the start-rate buckets. The store keeps them
//! and serialises the rounds that change them; which entry runs is the runtime's decision,
//! handed in as a [`FlowPlanner`].
//!
//! [`Cluster::flow_round`]: super::Cluster::flow_round

/// One entry of the table: a live task (or a synchronous call) that holds a slot or waits
/// for one.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowRow {
    /// The task's id (or the call's key).
    pub key: String,
    /// The node that entered it (set by the store).
    pub node: String,
    /// The entering node's token for this entry: a leave names it, so that a late leave of an
    /// earlier entry of the same key does not remove a newer one.
    pub token: u64,
    /// Whether `key` is a task (its entry goes with the task's lease) rather than a call.
    pub task: bool,
    /// The owner key (tenant and principal).
    pub owner: String,
    /// The tool.
    pub tool: String,
    /// The task's creation time (ms): the queue's order.
    pub created_ms: u64,
    /// The counters it takes a place in, each with its capacity.
    pub counters: Vec<(String, u32)>,
    /// The start-rate bucket it takes a token from, with the bucket's starts per second.
    pub rate: Option<(String, f64)>,
    /// Its start number once it holds its slot; `None` while it waits.
    pub started: Option<u64>,
}

/// The state of one start-rate bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowBucket {
    /// The bucket's name.
    pub name: String,
    /// Its tokens at `at_ms`.
    pub tokens: f64,
    /// When `tokens` was measured (ms, the store's clock).
    pub at_ms: u64,
}

/// What one node brings to a round.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlowRound {
    /// Entries to add (or to take over: an entry of the same key is replaced).
    pub enter: Vec<FlowRow>,
    /// Entries of this node to remove, by key and token.
    pub leave: Vec<(String, u64)>,
}

/// The table as a round sees it, after the removal of the entries whose node or lease is gone.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlowTable {
    /// Every entry.
    pub rows: Vec<FlowRow>,
    /// Every bucket.
    pub buckets: Vec<FlowBucket>,
    /// The store's clock (ms since the epoch).
    pub now_ms: u64,
}

/// The planner's decision in a round.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlowDecision {
    /// The waiting entries that start, by key, with their start numbers.
    pub started: Vec<(String, u64)>,
    /// The buckets to write back.
    pub buckets: Vec<FlowBucket>,
}

/// Decides a round: which waiting entries of the table start.
pub type FlowPlanner = dyn Fn(&FlowTable) -> FlowDecision + Send + Sync;
