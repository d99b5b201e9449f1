//! The task domain: identifiers, owners, the task record and its pure state machine.
//!
//! Nothing in this module does IO. Every change to a task is expressed as an [`Event`]
//! applied to a [`TaskRecord`] by [`apply`], which either refuses the event, reports that it
//! changes nothing, or returns the next record with its sequence number raised by one.
//! The actors persist exactly the records this function returns.

mod answer;
mod id;
/// The flat task objects of the wire.
pub mod json;
mod machine;

pub use id::{Owner, TaskId, TaskIdError};
pub use machine::{Event, TransitionError, apply};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;

/// The five statuses of the Tasks extension (Tasks extension, SEP-2663: data types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskStatus {
    /// `working`: the tool is running (or waits to be restarted after a crash).
    Working,
    /// `input_required`: the tool waits for the client's answers (`tasks/update`) to the
    /// task's `inputRequests`.
    InputRequired,
    /// `completed` (final): the tool returned a `CallToolResult`, possibly with
    /// `isError: true`.
    Completed,
    /// `failed` (final): the tool ended with a JSON-RPC error, ran out of restarts or hit a
    /// limit; the task's `error` says which.
    Failed,
    /// `cancelled` (final): a `tasks/cancel` was honoured.
    Cancelled,
}

impl TaskStatus {
    /// `completed`, `failed` and `cancelled` are final: no event changes them.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Working => "working",
            Self::InputRequired => "input_required",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Reads the wire spelling ([`as_str`](Self::as_str) backwards); `None` for anything else.
    pub fn from_wire(s: &str) -> Option<Self> {
        [
            Self::Working,
            Self::InputRequired,
            Self::Completed,
            Self::Failed,
            Self::Cancelled,
        ]
        .into_iter()
        .find(|status| status.as_str() == s)
    }

    /// Whether the state machine allows moving from `self` to `next` (Tasks extension, SEP-2663: state machine): every
    /// non-terminal status may become any status (staying put records a new status message
    /// or a journaled step); a terminal status never changes.
    pub fn may_become(self, _next: TaskStatus) -> bool {
        !self.is_terminal()
    }
}

/// The most entries [`TaskRecord::history`] keeps: the creation and the latest 31 changes.
pub const MAX_HISTORY: usize = 32;

/// The longest status message, in bytes, an entry of [`TaskRecord::history`] keeps; a longer
/// one is cut at the last char boundary at or before it.
pub const MAX_HISTORY_MESSAGE: usize = 240;

/// One status change of a task: an entry of [`TaskRecord::history`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// When the task took `status`: the record's `last_updated_at_ms` after the change (its
    /// `created_at_ms` for the creation). Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The status the task took.
    pub status: TaskStatus,
    /// The status message the task took with it, cut to at most [`MAX_HISTORY_MESSAGE`]
    /// bytes (the record's `status_message` keeps the whole message while it is current).
    pub message: Option<String>,
}

impl Transition {
    /// An entry for `status` taken at `at_ms` with `message`, cut to at most
    /// [`MAX_HISTORY_MESSAGE`] bytes at a char boundary.
    pub fn new(at_ms: u64, status: TaskStatus, message: Option<&str>) -> Self {
        Self {
            at_ms,
            status,
            message: message.map(|m| {
                let mut end = m.len().min(MAX_HISTORY_MESSAGE);
                while !m.is_char_boundary(end) {
                    end -= 1;
                }
                m[..end].to_owned()
            }),
        }
    }
}

/// A JSON-RPC error object as the task keeps it (`failed` tasks carry one).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

/// How a task ended, when it ended with an outcome of the tool.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskOutcome {
    /// The tool produced a `CallToolResult` (also with `isError: true`): the task is `completed`.
    Result(Value),
    /// The tool produced a JSON-RPC error: the task is `failed`.
    Error(TaskError),
}

/// Everything mcp-tasks knows about one task. This is the state a task actor owns and the
/// value every snapshot persists (through the versioned envelope in `persist`).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRecord {
    pub id: TaskId,
    pub owner: Owner,
    /// The tool this task runs, and the arguments it was called with.
    pub tool: String,
    pub arguments: Value,
    /// The client capabilities declared on the creating request. Shared: the runtime hands
    /// the tasks created with the same capabilities one value (see `TaskRecord::new`).
    pub client_capabilities: Arc<Value>,
    pub status: TaskStatus,
    pub status_message: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    pub last_updated_at_ms: u64,
    /// Time to live from creation; `None` is unlimited.
    pub ttl_ms: Option<u64>,
    pub poll_interval_ms: Option<u64>,
    /// Grows by one with every persisted transition, starting at 1 for the created task.
    pub seq: u64,
    /// Input requests still waiting for an answer, by key (JSON `InputRequest` objects).
    pub pending_inputs: BTreeMap<String, Value>,
    /// Every key ever issued for this task: keys are never reused.
    pub issued_keys: BTreeSet<String>,
    /// Answers received for issued keys; they replay into the tool after a restart.
    pub answers: BTreeMap<String, Value>,
    /// Recorded results of journaled steps, by step name.
    pub journal: BTreeMap<String, Value>,
    /// The attempt each journaled step committed in, by step name: the value of
    /// [`attempts`](Self::attempts) when the step's result was recorded (1 = the tool ran once
    /// since the previous progress; 3 = two runs before it were lost to crashes, so the step
    /// may have executed up to three times). Steps recorded before snapshot format version 3
    /// have no entry; 0 means the record's attempt counter predates format version 2.
    pub step_attempts: BTreeMap<String, u32>,
    /// Set once the task is `completed` or `failed`.
    pub outcome: Option<TaskOutcome>,
    /// A client asked for cancellation; the tool sees it cooperatively.
    pub cancel_requested: bool,
    /// Runs of the tool started since the task last made progress, the current one included:
    /// 1 at creation and again whenever the tool records a new step or asks for input; raised
    /// before the tool of a `working` task is started again after a crash, a kill or a panic
    /// (not after a clean shutdown). The runtime fails the task instead of starting a run
    /// beyond `1 + RuntimeConfig::restart_budget`, so a tool that brings the whole process
    /// down cannot loop forever across restarts. 0 in snapshots written before it existed.
    pub attempts: u32,
    /// The task's status changes, oldest first: the creation (`working`, at `created_at_ms`,
    /// with the status message it was created with), then one entry for every change of
    /// `status` that [`apply`] made, at the `last_updated_at_ms` of that change with the status
    /// message it set. Changes of the message alone, steps and restarts add nothing. At most
    /// [`MAX_HISTORY`] entries: past it the oldest entry after the creation is dropped, so the
    /// creation and the latest changes stay. A record read from a snapshot older than format
    /// version 4 carries a reconstructed history (see `persist`).
    pub history: Vec<Transition>,
}

impl TaskRecord {
    /// A freshly created task, `working`, at sequence number 1.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: TaskId,
        owner: Owner,
        tool: String,
        arguments: Value,
        client_capabilities: impl Into<Arc<Value>>,
        now_ms: u64,
        ttl_ms: Option<u64>,
        poll_interval_ms: Option<u64>,
        status_message: Option<String>,
    ) -> Self {
        let history = vec![Transition::new(
            now_ms,
            TaskStatus::Working,
            status_message.as_deref(),
        )];
        Self {
            id,
            owner,
            tool,
            arguments,
            client_capabilities: client_capabilities.into(),
            status: TaskStatus::Working,
            status_message,
            created_at_ms: now_ms,
            last_updated_at_ms: now_ms,
            ttl_ms,
            poll_interval_ms,
            seq: 1,
            pending_inputs: BTreeMap::new(),
            issued_keys: BTreeSet::new(),
            answers: BTreeMap::new(),
            journal: BTreeMap::new(),
            step_attempts: BTreeMap::new(),
            outcome: None,
            cancel_requested: false,
            attempts: 1,
            history,
        }
    }

    /// The instant (ms since epoch) from which the task counts as expired, if it ever does.
    pub fn expires_at_ms(&self) -> Option<u64> {
        self.ttl_ms
            .map(|ttl| self.created_at_ms.saturating_add(ttl))
    }

    /// Appends the record's current status, at its `last_updated_at_ms` with its status
    /// message, to [`history`](Self::history), dropping the oldest entry after the creation
    /// when it would hold more than [`MAX_HISTORY`].
    fn record_transition(&mut self) {
        self.history.push(Transition::new(
            self.last_updated_at_ms,
            self.status,
            self.status_message.as_deref(),
        ));
        while self.history.len() > MAX_HISTORY {
            self.history.remove(1);
        }
    }

    /// Whether the task is past `createdAt + ttlMs` at `now_ms`.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms().is_some_and(|at| now_ms >= at)
    }
}

#[cfg(test)]
mod status_tests {
    use super::TaskStatus;

    #[test]
    fn wire_spellings_round_trip() {
        for s in [
            "working",
            "input_required",
            "completed",
            "failed",
            "cancelled",
        ] {
            assert_eq!(TaskStatus::from_wire(s).map(TaskStatus::as_str), Some(s));
        }
        assert_eq!(TaskStatus::from_wire("Working"), None);
        assert_eq!(TaskStatus::from_wire(""), None);
    }
}
