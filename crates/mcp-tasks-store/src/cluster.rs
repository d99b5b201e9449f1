//! The capability of a store shared by replicas ([`Cluster`], reached by
//! [`TaskStore::cluster`](crate::TaskStore::cluster)): leases, fencing checks, cross-node
//! signalling, and what they exchange.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::{StoreFuture, flow, listing};

/// What [`Cluster::reconcile`] found (a store shared by replicas).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reconciled {
    /// Tasks this process held whose lease the store no longer gives it (another node took
    /// them over, or finished them): they are no longer held, and their local actors must
    /// stop, even if they never write again (an actor waiting for input).
    pub lost: Vec<String>,
    /// Live tasks the store leases to this node that this process did not know it held (a
    /// creation whose commit succeeded but whose acknowledgement was lost): claimed anew for
    /// this process (lease epoch + 1), with their bytes, to be run from the stored record.
    pub forgotten: Vec<(String, Vec<u8>)>,
    /// Tasks this process took over from a lapsed lease, counting an attempt against their
    /// restart budget, whose previous owner has since renewed its heartbeat in the same
    /// process: it was paused (a stop of the world, a frozen VM), not crashed, so the attempt
    /// is given back. Reported once each.
    pub paused: Vec<String>,
}

/// A wake-up hint from a shared store: [`Wakeup::notified`] completes when something it
/// watches may have changed on another node (or the store reconnected and everything should
/// be read again). A hint only: it can be lost, so a waiter also polls
/// ([`Cluster::poll_interval`]); a wake-up that fires between the watch's creation and the
/// wait is kept, not lost.
pub struct Wakeup {
    notify: Arc<tokio::sync::Notify>,
    // Dropped after `notify`: unregisters the watch.
    _registration: Option<Box<dyn Send + Sync>>,
}

impl fmt::Debug for Wakeup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wakeup").finish_non_exhaustive()
    }
}

impl Wakeup {
    /// A wake-up over `notify`; `registration` is dropped with it (a backend's unregistering
    /// guard).
    pub fn new(
        notify: Arc<tokio::sync::Notify>,
        registration: Option<Box<dyn Send + Sync>>,
    ) -> Wakeup {
        Wakeup {
            notify,
            _registration: registration,
        }
    }

    /// Waits for the next wake-up (or returns at once for one that fired since the last
    /// wait).
    pub async fn notified(&self) {
        self.notify.notified().await
    }
}

/// A `tasks/update` or `tasks/cancel` recorded for the node that runs the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteCommand {
    /// The command's sequence number (its key in the store).
    pub seq: u64,
    /// The task it is for.
    pub task_id: String,
    /// The command, encoded by the runtime.
    pub body: Vec<u8>,
}

/// The capability of a store shared by replicas ([`TaskStore::cluster`](crate::TaskStore::cluster), see
/// docs/SCALE-OUT.md): per-node leases on live tasks (claims, fencing checks, reconciliation)
/// and cross-node signalling: wake-ups when another node commits a task, and requests for a task recorded durably for the node that
/// runs it, which answers them. Notifications are hints (PostgreSQL `NOTIFY` carrying ids
/// only); the store's rows are the truth, and every waiter polls as a fallback.
pub trait Cluster: Send + Sync {
    /// This process's node id.
    fn node_id(&self) -> &str;
    /// The live tasks this process runs at start: the ones no live node holds (and those
    /// this node id held before), *claimed*: their lease epochs are bumped.
    fn claim_live(&self) -> StoreFuture<'_, Vec<(String, Vec<u8>)>>;
    /// Claims at most `limit` live tasks whose node stopped renewing its lease (orphans),
    /// the first ones in id order past `after` (`""`: from the first), bumping their lease
    /// epochs; the runtime then runs them from their journal. A claimer that goes on past
    /// the greatest id of a full batch looks at each task once, so the claims of a takeover
    /// read rows in proportion to the orphans, not to their square; a task skipped (its row
    /// locked) is claimed at a later round from `""`.
    fn claim_orphans<'a>(
        &'a self,
        after: &'a str,
        limit: usize,
    ) -> StoreFuture<'a, Vec<(String, Vec<u8>)>>;
    /// Whether this process holds the lease of task `id`.
    fn holds(&self, id: &str) -> bool;
    /// How often the runtime looks for orphans to claim.
    fn claim_interval(&self) -> Duration;
    /// Takes the lease of live task `id` for this process (bumping its epoch) and returns its
    /// bytes; `None` if it is not stored or not live. Used when a request for a task reaches a
    /// node that does not run it and no live node holds it. Taken only from no node, this
    /// node, or a node whose lease lapsed: a task whose node renewed its lease since the
    /// caller looked is refused with [`StoreError::Busy`](crate::StoreError::Busy) (the request is retried and reaches
    /// that node), as is one whose row another session holds locked.
    fn claim_one<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Vec<u8>>>;
    /// Whether this process's claim of task `id` took it from a node that stopped without
    /// releasing it (crashed, killed, or paused past its lease), so that the run it had going
    /// counts against the task's restart budget. Answered once per claim.
    fn took_from_lapsed(&self, id: &str) -> bool;
    /// Confirms that this process still holds the lease of task `id` and that the stored
    /// record is at sequence number `seq`, without writing: an actor acknowledging a request
    /// that changes nothing checks it first, since only a write is fenced. Answers
    /// [`StoreError::Fenced`](crate::StoreError::Fenced) when the lease moved (or [`StoreError::Conflict`](crate::StoreError::Conflict) when the
    /// record moved under this process's own lease).
    fn confirm_lease<'a>(&'a self, id: &'a str, seq: u64) -> StoreFuture<'a, ()>;
    /// Compares the leases this process believes it holds with the ones the store records for
    /// it: see [`Reconciled`].
    fn reconcile(&self) -> StoreFuture<'_, Reconciled>;
    /// Wakes when a reconciliation is due sooner than the next claim interval (a commit
    /// whose outcome is unknown failed).
    fn watch_reconcile(&self) -> Wakeup;
    /// How often a waiter reads the store again when no wake-up came (the fallback for a
    /// lost notification).
    fn poll_interval(&self) -> Duration;
    /// How long a node may go without a heartbeat before its tasks are taken over.
    fn lease_ttl(&self) -> Duration;
    /// Wakes when task `id` may have been committed by any node, or a command for it was
    /// answered.
    fn watch_task(&self, id: &str) -> Wakeup;
    /// Wakes when commands may wait for this node ([`Cluster::inbox`]).
    fn watch_inbox(&self) -> Wakeup;
    /// Records `body` durably as a command for live task `id` and signals the node that holds
    /// its lease. `None` (nothing recorded) when no other live node holds it: the caller takes
    /// the task over instead.
    fn send_command<'a>(&'a self, id: &'a str, body: Vec<u8>) -> StoreFuture<'a, Option<u64>>;
    /// The answer of command `seq` once the node running its task gave one (the command is
    /// then forgotten); `None` while it waits.
    fn take_answer(&self, seq: u64) -> StoreFuture<'_, Option<Vec<u8>>>;
    /// Forgets command `seq` whatever its state (its task finished, nobody needs it any more).
    fn forget_command(&self, seq: u64) -> StoreFuture<'_, ()>;
    /// Unanswered commands for tasks this node holds, oldest first.
    fn inbox(&self) -> StoreFuture<'_, Vec<RemoteCommand>>;
    /// Marks command `seq` as taken by this node before it applies it; `false` when it was
    /// withdrawn by its sender (or answered) meanwhile: it must not be applied.
    fn take_command(&self, seq: u64) -> StoreFuture<'_, bool>;
    /// Withdraws command `seq` if no node has taken it yet (its sender gives up waiting);
    /// `true` = withdrawn: no node applies it, ever.
    fn withdraw_command(&self, seq: u64) -> StoreFuture<'_, bool>;
    /// Records the answer of command `seq` (for task `task_id`) and wakes its sender.
    fn answer_command<'a>(
        &'a self,
        seq: u64,
        task_id: &'a str,
        answer: Vec<u8>,
    ) -> StoreFuture<'a, ()>;
    /// The store's own clock (a database's `now()`), which every replica's decisions about
    /// time use instead of its local clock; `None`: the local clocks are trusted.
    fn reference_clock(&self) -> Option<Arc<crate::clock::ReferenceClock>> {
        None
    }
    /// The replicas with a heartbeat row, with the live tasks each holds the lease of (the
    /// operator console's overview).
    fn nodes(&self) -> StoreFuture<'_, Vec<listing::NodeInfo>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    /// Who holds the lease of task `id`, at which epoch; `None` when it is not stored.
    fn lease_of<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<listing::LeaseInfo>> {
        let _ = id;
        Box::pin(async { Ok(None) })
    }
    /// The ids of tasks any node commits, as the store's notifications carry them (hints:
    /// a receiver that lags misses some and is told so by the channel). `None` when the
    /// store does not signal them. The operator console follows every replica's tasks
    /// through it.
    fn watch_commits(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        None
    }
    /// One round of cluster-wide flow control, in one transaction that no other round runs
    /// beside: removes `round.leave` (this node's entries, by key and token), adds
    /// `round.enter` for this node, removes every entry whose node stopped heartbeating or
    /// whose task is no longer live under that node's lease (so a slot is held by a lease,
    /// never by a process's memory alone), asks `plan` which waiting entries start, records
    /// its decision, and signals the other nodes when a slot was freed or given to one of
    /// theirs. Answers the table as decided.
    fn flow_round<'a>(
        &'a self,
        round: flow::FlowRound,
        plan: &'a flow::FlowPlanner,
    ) -> StoreFuture<'a, flow::FlowTable>;
    /// Wakes when another node freed a slot or gave one to this node's entries.
    fn watch_flow(&self) -> Wakeup;
    /// Whether this node may answer a read of task `id` from its own committed snapshot: it
    /// holds the task's lease, and the lease is valid by a safety margin on this process's
    /// monotonic clock, counted from when its last acknowledged renewal was *sent* (no other
    /// node can take the task over before that renewal's time plus the TTL). `false` (the
    /// default): every read goes to the store.
    fn reads_from_memory(&self, id: &str) -> bool {
        let _ = id;
        false
    }
}
