//! Per-principal quotas: what one owner may hold at once and how fast it may create tasks, so
//! that one abusive or broken client cannot exhaust the memory of a server others share.
//!
//! `Quotas::default()` holds the limits recommended for a shared server (what `mcp-tasks
//! serve` uses); a [`crate::RuntimeConfig`] starts with [`Quotas::unlimited`], so an embedder
//! opts in with [`crate::RuntimeBuilder::quotas`].
//!
//! | quota | protects | default |
//! |---|---|---|
//! | [`Quotas::max_live_tasks`] | memory: each live task holds an actor and its record (~10–14 KB plus its arguments) until it finishes or expires; one parked while it waits for input (`RuntimeConfig::passivate_after`) about 1 KB, and still counts | 1,000 |
//! | [`Quotas::max_live_argument_bytes`] | memory: a live task's arguments stay in memory (several copies: record, snapshot, tool) until it ends | 64 MiB of JSON |
//! | [`Quotas::create_rate`] / [`Quotas::create_burst`] | the store writer and the reaper (each creation is a commit, each expiry another) | 20/s, bursts of 100 |
//! | [`Quotas::max_listens`] | memory and file descriptors: each open `subscriptions/listen` holds a stream and a subscriber actor | 16 |
//! | [`Quotas::max_listen_task_ids`] | memory and fan-out: each followed id holds a follower (~700 B) and costs a send per update | 4,096 across all listens |
//! | [`Quotas::max_sessions`] | memory and fan-out: each legacy (`2025-11-25`) session held in a process keeps its streams (up to 1,024 messages each) and the tasks it follows | 64 |
//! | [`Quotas::max_session_records`] | disk: legacy sessions with a stored record (log level, resource subscriptions, ended), each at most 16 KiB | 256 |
//! | [`Quotas::max_stored_bytes`] | disk: every stored task of the owner, finished ones included until the reaper deletes them after their retention | 256 MiB |
//!
//! Owners are counted separately: one principal at its limits does not reduce anyone else's.
//! A refusal is [`QuotaError`], answered as JSON-RPC [`crate::wire::error::code::QUOTA_EXCEEDED`]
//! (HTTP `429` with `Retry-After`); nothing is stored for the refused request. The HTTP
//! transport adds the limits that are not about the owner's state (request body size,
//! connections, concurrent requests per principal, timeouts).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::task::Owner;

/// Per-owner limits. `Default` keeps a large host alive under one abusive client; raise them
/// for trusted bulk users.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Quotas {
    /// Live (not yet finished) tasks one owner may have.
    pub max_live_tasks: usize,
    /// Bytes of arguments (as JSON) across one owner's live tasks.
    pub max_live_argument_bytes: u64,
    /// Sustained task creations per second per owner (a token bucket refilled at this rate).
    pub create_rate: f64,
    /// Creations one owner may make at once before the rate applies.
    pub create_burst: u32,
    /// Open `subscriptions/listen` streams per owner.
    pub max_listens: usize,
    /// Task ids followed across all of one owner's open listens.
    pub max_listen_task_ids: usize,
    /// Legacy (`2025-11-25`) sessions one owner may have held in one process at once. At the
    /// limit a new or returning session takes the place of the owner's least recently used
    /// session that has no open stream and no request waiting for the client; when every
    /// one has, it is refused.
    pub max_sessions: usize,
    /// Legacy sessions of one owner with a stored record (set by `logging/setLevel`,
    /// `resources/subscribe` and `DELETE`, removed when the session expires).
    pub max_session_records: usize,
    /// Bytes one owner may have in the store: the records of all its tasks, live and finished
    /// (a finished task keeps its arguments and result until the reaper deletes it, at the
    /// end of its retention). Checked at each creation against the store's per-owner usage
    /// ([`crate::store::Store::usage`]), which every commit keeps exact.
    pub max_stored_bytes: u64,
}

impl Default for Quotas {
    fn default() -> Self {
        Self {
            max_live_tasks: 1000,
            max_live_argument_bytes: 64 * 1024 * 1024,
            create_rate: 20.0,
            create_burst: 100,
            max_listens: 16,
            max_listen_task_ids: 4096,
            max_sessions: 64,
            max_session_records: 256,
            max_stored_bytes: DEFAULT_MAX_STORED_BYTES,
        }
    }
}

/// The default of [`Quotas::max_stored_bytes`]: 256 MiB.
pub const DEFAULT_MAX_STORED_BYTES: u64 = 256 * 1024 * 1024;

impl Quotas {
    /// No limits at all (a single trusted user, tests).
    pub fn unlimited() -> Self {
        Self {
            max_live_tasks: usize::MAX,
            max_live_argument_bytes: u64::MAX,
            create_rate: f64::INFINITY,
            create_burst: u32::MAX,
            max_listens: usize::MAX,
            max_listen_task_ids: usize::MAX,
            max_sessions: usize::MAX,
            max_session_records: usize::MAX,
            max_stored_bytes: u64::MAX,
        }
    }
}

/// Which quota refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuotaKind {
    /// [`Quotas::max_live_tasks`]: the owner has that many unfinished tasks.
    LiveTasks,
    /// [`Quotas::max_live_argument_bytes`]: the arguments of the owner's unfinished tasks
    /// would exceed it.
    LiveArgumentBytes,
    /// [`Quotas::create_rate`] / [`Quotas::create_burst`]: the owner creates tasks faster
    /// than the rate allows.
    CreateRate,
    /// [`Quotas::max_listens`]: the owner has that many open `subscriptions/listen` streams.
    Listens,
    /// [`Quotas::max_listen_task_ids`]: the owner's open listens follow that many task ids.
    ListenTaskIds,
    /// The HTTP transport's limit of requests one principal may have in flight at once.
    ConcurrentRequests,
    /// [`Quotas::max_sessions`]: the owner's legacy sessions held in this process all have
    /// an open stream or a request waiting for the client.
    Sessions,
    /// [`Quotas::max_session_records`]: the owner has that many legacy sessions with a
    /// stored record.
    SessionRecords,
    /// [`Quotas::max_stored_bytes`]: the owner's stored tasks, finished ones included, would
    /// exceed it.
    StoredBytes,
    /// The HTTP server's limit of connections one principal may hold at once.
    Connections,
}

impl QuotaKind {
    /// The name used in error data and logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::LiveTasks => "liveTasks",
            Self::LiveArgumentBytes => "liveArgumentBytes",
            Self::CreateRate => "createRate",
            Self::Listens => "listens",
            Self::ListenTaskIds => "listenTaskIds",
            Self::ConcurrentRequests => "concurrentRequests",
            Self::Sessions => "sessions",
            Self::SessionRecords => "sessionRecords",
            Self::StoredBytes => "storedBytes",
            Self::Connections => "connections",
        }
    }
}

/// A request refused by a quota.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}", self.message())]
pub struct QuotaError {
    /// Which quota refused.
    pub kind: QuotaKind,
    /// The quota's limit.
    pub limit: u64,
    /// When trying again may succeed.
    pub retry_after: Duration,
}

impl QuotaError {
    fn message(&self) -> String {
        match self.kind {
            QuotaKind::LiveTasks => format!(
                "you already have {} unfinished tasks, the most allowed; wait for some to finish or cancel them",
                self.limit
            ),
            QuotaKind::LiveArgumentBytes => format!(
                "the arguments of your unfinished tasks would exceed {} bytes; wait for some to finish or cancel them",
                self.limit
            ),
            QuotaKind::CreateRate => format!(
                "tasks are being created faster than the allowed {} per second",
                self.limit
            ),
            QuotaKind::Listens => format!(
                "you already have {} open subscriptions/listen streams, the most allowed; close one first",
                self.limit
            ),
            QuotaKind::ListenTaskIds => format!(
                "your open subscriptions/listen streams would follow more than {} tasks in total",
                self.limit
            ),
            QuotaKind::ConcurrentRequests => format!(
                "you already have {} requests in progress, the most allowed",
                self.limit
            ),
            QuotaKind::Sessions => format!(
                "you already have {} sessions with an open stream or a pending request, the most allowed; close one or end it with DELETE",
                self.limit
            ),
            QuotaKind::SessionRecords => format!(
                "you already have {} sessions with stored settings or subscriptions, the most allowed; end some with DELETE or wait for them to expire",
                self.limit
            ),
            QuotaKind::StoredBytes => format!(
                "your stored tasks (finished ones included, until their retention ends) would exceed {} bytes; wait for finished tasks to be deleted",
                self.limit
            ),
            QuotaKind::Connections => format!(
                "you already hold {} open connections, the most allowed; reuse one (keep-alive) or close one",
                self.limit
            ),
        }
    }

    /// Whole seconds for a `Retry-After` header (at least 1).
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after.as_secs_f64().ceil().max(1.0) as u64
    }
}

/// Number of remembered owners above which idle ones are swept on the next creation.
const SWEEP_AT: usize = 4096;

#[derive(Default)]
struct OwnerState {
    /// Creations admitted but not yet running (between the check and the actor's start),
    /// and the bytes of their arguments.
    pending_creates: usize,
    pending_bytes: u64,
    tokens: f64,
    refilled: Option<Instant>,
    listens: usize,
    listen_ids: usize,
}

impl OwnerState {
    fn is_idle(&self) -> bool {
        self.pending_creates == 0 && self.listens == 0 && self.listen_ids == 0
    }
}

/// The counters of one runtime.
pub(crate) struct QuotaTracker {
    quotas: Quotas,
    owners: Mutex<HashMap<Owner, OwnerState>>,
}

/// Holds an admitted creation's place until the task's actor runs (then the live count has it).
pub(crate) struct CreatePermit {
    tracker: Arc<QuotaTracker>,
    owner: Owner,
    bytes: u64,
}

impl Drop for CreatePermit {
    fn drop(&mut self) {
        let bytes = self.bytes;
        self.tracker.release(&self.owner, |s| {
            s.pending_creates = s.pending_creates.saturating_sub(1);
            s.pending_bytes = s.pending_bytes.saturating_sub(bytes);
        });
    }
}

/// Holds an open listen's place and its ids; dropped with the listen stream.
pub(crate) struct ListenPermit {
    tracker: Arc<QuotaTracker>,
    owner: Owner,
    ids: usize,
}

impl Drop for ListenPermit {
    fn drop(&mut self) {
        let ids = self.ids;
        self.tracker.release(&self.owner, |s| {
            s.listens = s.listens.saturating_sub(1);
            s.listen_ids = s.listen_ids.saturating_sub(ids);
        });
    }
}

impl QuotaTracker {
    pub(crate) fn new(quotas: Quotas) -> Self {
        Self {
            quotas,
            owners: Mutex::new(HashMap::new()),
        }
    }

    /// The limits this tracker applies.
    pub(crate) fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Owner, OwnerState>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn release(&self, owner: &Owner, f: impl FnOnce(&mut OwnerState)) {
        let mut owners = self.lock();
        if let Some(state) = owners.get_mut(owner) {
            f(state);
            // A full bucket and nothing held: forget the owner (the map stays bounded by the
            // owners that are active).
            let full = state.refilled.is_none_or(|t| {
                t.elapsed().as_secs_f64() * self.quotas.create_rate
                    >= f64::from(self.quotas.create_burst)
            });
            if state.is_idle() && full {
                owners.remove(owner);
            }
        }
    }

    /// Admits one task creation with `bytes` of arguments for `owner`, whose running tasks
    /// are `(count, argument bytes)` now.
    pub(crate) fn admit_create(
        self: &Arc<Self>,
        owner: &Owner,
        (live, live_bytes): (usize, u64),
        bytes: u64,
        now: Instant,
    ) -> Result<CreatePermit, QuotaError> {
        let q = &self.quotas;
        let mut owners = self.lock();
        if owners.len() >= SWEEP_AT {
            // Forget owners that hold nothing and whose bucket has refilled.
            let full_after = Duration::from_secs_f64(
                (f64::from(q.create_burst) / q.create_rate).clamp(0.0, 86_400.0),
            );
            owners.retain(|_, s| {
                !s.is_idle()
                    || s.refilled
                        .is_some_and(|t| now.saturating_duration_since(t) < full_after)
            });
        }
        let state = owners.entry(owner.clone()).or_default();
        if live.saturating_add(state.pending_creates) >= q.max_live_tasks {
            return Err(QuotaError {
                kind: QuotaKind::LiveTasks,
                limit: q.max_live_tasks as u64,
                retry_after: Duration::from_secs(10),
            });
        }
        let total = live_bytes
            .saturating_add(state.pending_bytes)
            .saturating_add(bytes);
        if total > q.max_live_argument_bytes {
            return Err(QuotaError {
                kind: QuotaKind::LiveArgumentBytes,
                limit: q.max_live_argument_bytes,
                retry_after: Duration::from_secs(10),
            });
        }
        // Token bucket: starts full, refills at `create_rate`.
        let burst = f64::from(q.create_burst);
        let tokens = match state.refilled {
            None => burst,
            Some(at) => (state.tokens
                + now.saturating_duration_since(at).as_secs_f64() * q.create_rate)
                .min(burst),
        };
        if tokens < 1.0 {
            let wait = (1.0 - tokens) / q.create_rate;
            state.tokens = tokens;
            state.refilled = Some(now);
            return Err(QuotaError {
                kind: QuotaKind::CreateRate,
                limit: q.create_rate.ceil() as u64,
                retry_after: Duration::from_secs_f64(wait.clamp(0.001, 3600.0)),
            });
        }
        state.tokens = tokens - 1.0;
        state.refilled = Some(now);
        state.pending_creates += 1;
        state.pending_bytes += bytes;
        Ok(CreatePermit {
            tracker: self.clone(),
            owner: owner.clone(),
            bytes,
        })
    }

    /// Whether [`Quotas::max_stored_bytes`] limits anything (the store's usage is read only
    /// then).
    pub(crate) fn limits_stored_bytes(&self) -> bool {
        self.quotas.max_stored_bytes < u64::MAX
    }

    /// Checks a creation with `bytes` of arguments for `owner`, who has `stored` bytes in the
    /// store, against [`Quotas::max_stored_bytes`]; creations admitted but not committed yet
    /// count too.
    pub(crate) fn check_stored(
        &self,
        owner: &Owner,
        stored: u64,
        bytes: u64,
    ) -> Result<(), QuotaError> {
        let limit = self.quotas.max_stored_bytes;
        let pending = self.lock().get(owner).map_or(0, |s| s.pending_bytes);
        if stored.saturating_add(pending).saturating_add(bytes) > limit {
            return Err(QuotaError {
                kind: QuotaKind::StoredBytes,
                limit,
                retry_after: Duration::from_secs(60),
            });
        }
        Ok(())
    }

    /// Admits one listen following `ids` tasks for `owner`.
    pub(crate) fn admit_listen(
        self: &Arc<Self>,
        owner: &Owner,
        ids: usize,
    ) -> Result<ListenPermit, QuotaError> {
        let q = &self.quotas;
        let mut owners = self.lock();
        let state = owners.entry(owner.clone()).or_default();
        let refuse = |kind, limit: usize| QuotaError {
            kind,
            limit: limit as u64,
            retry_after: Duration::from_secs(10),
        };
        if state.listens >= q.max_listens {
            let e = refuse(QuotaKind::Listens, q.max_listens);
            if state.is_idle() {
                owners.remove(owner);
            }
            return Err(e);
        }
        if state.listen_ids.saturating_add(ids) > q.max_listen_task_ids {
            let e = refuse(QuotaKind::ListenTaskIds, q.max_listen_task_ids);
            if state.is_idle() {
                owners.remove(owner);
            }
            return Err(e);
        }
        state.listens += 1;
        state.listen_ids += ids;
        Ok(ListenPermit {
            tracker: self.clone(),
            owner: owner.clone(),
            ids,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker(q: Quotas) -> Arc<QuotaTracker> {
        Arc::new(QuotaTracker::new(q))
    }

    #[test]
    fn live_tasks_count_pending_creations_per_owner() {
        let t = tracker(Quotas {
            max_live_tasks: 2,
            ..Quotas::unlimited()
        });
        let alice = Owner::new("acme", "alice");
        let now = Instant::now();
        let a = t.admit_create(&alice, (0, 0), 1, now).unwrap();
        let b = t.admit_create(&alice, (0, 0), 1, now).unwrap();
        let e = t.admit_create(&alice, (0, 0), 1, now).err().unwrap();
        assert_eq!(e.kind, QuotaKind::LiveTasks);
        // Another owner, even with the same principal name, is counted apart.
        t.admit_create(&Owner::new("globex", "alice"), (0, 0), 1, now)
            .unwrap();
        drop((a, b));
        assert!(t.admit_create(&alice, (1, 1), 1, now).is_ok());
        assert!(t.admit_create(&alice, (2, 2), 1, now).is_err());
    }

    #[test]
    fn argument_bytes_of_live_tasks_are_bounded() {
        let t = tracker(Quotas {
            max_live_argument_bytes: 100,
            ..Quotas::unlimited()
        });
        let o = Owner::anonymous();
        let now = Instant::now();
        let a = t.admit_create(&o, (0, 0), 60, now).unwrap();
        let e = t.admit_create(&o, (0, 0), 41, now).err().unwrap();
        assert_eq!(e.kind, QuotaKind::LiveArgumentBytes);
        assert!(t.admit_create(&o, (0, 0), 40, now).is_ok());
        drop(a);
        // Once running, the task's bytes are counted by the live set instead.
        assert!(t.admit_create(&o, (1, 60), 41, now).is_err());
        assert!(t.admit_create(&o, (1, 60), 40, now).is_ok());
    }

    #[test]
    fn the_create_rate_is_a_token_bucket() {
        let t = tracker(Quotas {
            create_rate: 10.0,
            create_burst: 3,
            ..Quotas::unlimited()
        });
        let o = Owner::anonymous();
        let now = Instant::now();
        for _ in 0..3 {
            t.admit_create(&o, (0, 0), 1, now).unwrap();
        }
        let e = t.admit_create(&o, (0, 0), 1, now).err().unwrap();
        assert_eq!(e.kind, QuotaKind::CreateRate);
        assert_eq!(e.retry_after_secs(), 1);
        assert!(e.retry_after <= Duration::from_millis(100));
        // 100 ms later one token is back, not two.
        let later = now + Duration::from_millis(100);
        t.admit_create(&o, (0, 0), 1, later).unwrap();
        assert!(t.admit_create(&o, (0, 0), 1, later).is_err());
    }

    #[test]
    fn listens_and_their_ids_are_bounded_and_released() {
        let t = tracker(Quotas {
            max_listens: 2,
            max_listen_task_ids: 10,
            ..Quotas::unlimited()
        });
        let o = Owner::anonymous();
        let a = t.admit_listen(&o, 6).unwrap();
        assert_eq!(
            t.admit_listen(&o, 5).err().unwrap().kind,
            QuotaKind::ListenTaskIds
        );
        let b = t.admit_listen(&o, 4).unwrap();
        assert_eq!(
            t.admit_listen(&o, 0).err().unwrap().kind,
            QuotaKind::Listens
        );
        drop(a);
        let _c = t.admit_listen(&o, 6).unwrap();
        drop(b);
        assert!(t.lock().contains_key(&o));
    }

    #[test]
    fn stored_bytes_count_pending_creations() {
        let t = tracker(Quotas {
            max_stored_bytes: 1000,
            ..Quotas::unlimited()
        });
        assert!(t.limits_stored_bytes());
        assert!(!tracker(Quotas::unlimited()).limits_stored_bytes());
        let o = Owner::anonymous();
        let now = Instant::now();
        t.check_stored(&o, 900, 100).unwrap();
        let e = t.check_stored(&o, 900, 101).err().unwrap();
        assert_eq!((e.kind, e.limit), (QuotaKind::StoredBytes, 1000));
        assert!(e.to_string().contains("1000 bytes"), "{e}");
        let pending = t.admit_create(&o, (0, 0), 300, now).unwrap();
        assert!(t.check_stored(&o, 600, 200).is_err());
        drop(pending);
        t.check_stored(&o, 600, 200).unwrap();
    }

    #[test]
    fn idle_owners_are_forgotten() {
        let t = tracker(Quotas::default());
        let o = Owner::anonymous();
        drop(t.admit_listen(&o, 3).unwrap());
        assert!(t.lock().is_empty());
    }
}

/// Flow control: how many tasks may *run* at once, per tool, over all tools and per owner.
/// A call over a limit is not refused: its task is created (durable before its handle, as
/// any task) and waits `working`, its `statusMessage` `queued: N ahead`, until a slot frees.
/// A freed slot goes to the owners with queued work in turn (round-robin), each owner's own
/// tasks in creation order. See docs/SERVE.md, "Flow control".
///
/// Empty by default: no limit, and no cost. A tool's own
/// [`ToolDescriptor::max_running`](method@crate::tool::ToolDescriptor::max_running) applies unless a limit here names the tool.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct FlowLimits {
    /// Running tasks at most per tool, by tool name.
    pub per_tool: std::collections::BTreeMap<String, u32>,
    /// Running tasks at most over all tools together (`--max-running '*=N'`).
    pub all_tools: Option<u32>,
    /// Running tasks at most per owner (tenant and principal), over all tools.
    pub per_owner: Option<u32>,
    /// Running tasks at most per flow group, by group name: the tools whose
    /// [`ToolDescriptor::flow_group`](method@crate::tool::ToolDescriptor::flow_group) names it,
    /// together. The gateway puts each upstream's tools in the group `upstream:NAME`
    /// (`serve --upstream-max-running NAME=N`).
    pub per_group: std::collections::BTreeMap<String, u32>,
    /// Starts per second at most, per tool (`serve --max-starts TOOL=R/s`): a token bucket
    /// that holds one token (no burst), so that in any span of `T` seconds at most
    /// `R × T + 1` tasks of the tool start; the others wait queued.
    pub max_starts: std::collections::BTreeMap<String, f64>,
}

/// A flow-control limit that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FlowLimitError {
    /// Not `TOOL=N`.
    #[error(
        "`{0}` is not TOOL=N (a tool name, or `*` for all tools together, then `=` and a count)"
    )]
    Syntax(String),
    /// The count is not a whole number from 1 up.
    #[error("the limit in `{0}` is not a whole number of running tasks from 1 up")]
    Count(String),
    /// Not `TOOL=R/s` with a positive rate.
    #[error(
        "`{0}` is not TOOL=R/s (a tool name, `=`, a positive number of starts and `/s`, `/m` or `/h`)"
    )]
    Rate(String),
}

impl FlowLimits {
    /// No limit (the default).
    pub fn none() -> Self {
        Self::default()
    }

    /// Whether no limit is set here.
    pub fn is_empty(&self) -> bool {
        self.per_tool.is_empty()
            && self.all_tools.is_none()
            && self.per_owner.is_none()
            && self.per_group.is_empty()
            && self.max_starts.is_empty()
    }

    /// Adds a start rate written `TOOL=R/s` (also `R/m`, `R/h`; `R` a positive number), as
    /// `serve --max-starts` takes it.
    pub fn add_rate(&mut self, spec: &str) -> Result<(), FlowLimitError> {
        let (tool, rate) = parse_rate(spec)?;
        self.max_starts.insert(tool.to_owned(), rate);
        Ok(())
    }

    /// Adds a limit of a flow group written `GROUP=N`.
    pub fn add_group(&mut self, spec: &str) -> Result<(), FlowLimitError> {
        let (group, count) = parse_limit(spec)?;
        self.per_group.insert(group.to_owned(), count);
        Ok(())
    }

    /// Adds a limit written `TOOL=N` (`*=N`: all tools together), as `serve --max-running`
    /// takes it. `N` must be at least 1.
    pub fn add(&mut self, spec: &str) -> Result<(), FlowLimitError> {
        let (tool, count) = parse_limit(spec)?;
        if tool == "*" {
            self.all_tools = Some(count);
        } else {
            self.per_tool.insert(tool.to_owned(), count);
        }
        Ok(())
    }
}

/// `TOOL=N` → (`TOOL`, `N`), `N` ≥ 1.
pub fn parse_limit(spec: &str) -> Result<(&str, u32), FlowLimitError> {
    let Some((tool, count)) = spec.split_once('=') else {
        return Err(FlowLimitError::Syntax(spec.to_owned()));
    };
    let tool = tool.trim();
    if tool.is_empty() {
        return Err(FlowLimitError::Syntax(spec.to_owned()));
    }
    match count.trim().parse::<u32>() {
        Ok(n) if n >= 1 => Ok((tool, n)),
        _ => Err(FlowLimitError::Count(spec.to_owned())),
    }
}

/// `TOOL=R/s` (or `/m`, `/h`) → (`TOOL`, starts per second), `R` > 0.
pub fn parse_rate(spec: &str) -> Result<(&str, f64), FlowLimitError> {
    let bad = || FlowLimitError::Rate(spec.to_owned());
    let (tool, rate) = spec.split_once('=').ok_or_else(bad)?;
    let tool = tool.trim();
    if tool.is_empty() || tool == "*" {
        return Err(bad());
    }
    let (count, per) = rate.trim().split_once('/').ok_or_else(bad)?;
    let seconds = match per.trim() {
        "s" | "sec" | "second" => 1.0,
        "m" | "min" | "minute" => 60.0,
        "h" | "hour" => 3600.0,
        _ => return Err(bad()),
    };
    match count.trim().parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 => Ok((tool, n / seconds)),
        _ => Err(bad()),
    }
}
