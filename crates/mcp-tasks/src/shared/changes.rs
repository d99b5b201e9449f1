//! What the runtime tells observers of every task at once (the operator console): a
//! [`TaskChange`] for each commit of a task record, sent after the commit returned (so every
//! change is a committed one, like the snapshots subscribers follow), and how the last start
//! went ([`Recovery`]).

use std::sync::Arc;

use tokio::sync::broadcast;

use crate::store::listing::Listing;
use crate::task::{Owner, TaskRecord};

/// How many changes a slow observer may fall behind before it is told it lagged.
const CHANGES_CAPACITY: usize = 4096;

/// One committed change of a task, as a list row shows it.
#[cfg_attr(not(feature = "console"), allow(dead_code))]
#[derive(Debug, Clone)]
pub(crate) struct TaskChange {
    pub(crate) id: String,
    pub(crate) owner: Arc<Owner>,
    pub(crate) created_ms: u64,
    pub(crate) listing: Listing,
    /// Whether it completed with a result of `isError: true` (a tool error).
    pub(crate) is_error: bool,
}

/// Whether `record` completed with a `CallToolResult` of `isError: true`: a tool error,
/// which the Tasks extension reports as `completed` (the console marks it as an error).
pub(crate) fn tool_error(record: &TaskRecord) -> bool {
    matches!(&record.outcome, Some(crate::task::TaskOutcome::Result(r))
        if r.get("isError") == Some(&serde_json::Value::Bool(true)))
}

/// The channel of [`TaskChange`]s: sending costs nothing while nobody listens.
#[derive(Debug)]
pub(crate) struct Changes {
    sender: broadcast::Sender<TaskChange>,
}

impl Default for Changes {
    fn default() -> Self {
        Changes {
            sender: broadcast::channel(CHANGES_CAPACITY).0,
        }
    }
}

impl Changes {
    /// Tells every observer that `record` was committed.
    pub(crate) fn committed(&self, record: &TaskRecord) {
        if self.sender.receiver_count() == 0 {
            return;
        }
        let _ = self.sender.send(TaskChange {
            id: record.id.as_str().to_owned(),
            owner: Arc::new(record.owner.clone()),
            created_ms: record.created_at_ms,
            listing: crate::persist::listing_of(record),
            is_error: tool_error(record),
        });
    }

    /// A receiver of the changes committed from now on.
    #[cfg_attr(not(feature = "console"), allow(dead_code))]
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<TaskChange> {
        self.sender.subscribe()
    }
}

/// How the runtime's last start went: when it started, how long the rehydration of the
/// stored live tasks took, and how many it rehydrated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Recovery {
    pub(crate) started_ms: u64,
    pub(crate) took_ms: u64,
    pub(crate) rehydrated: u64,
}
