//! The metrics the store records itself (with the `metrics` facade, like the rest of
//! mcp-tasks: a host's recorder receives them).

#[cfg(any(feature = "redb", feature = "postgres"))]
use std::time::Duration;

/// `mcp_tasks_store_commit_duration_seconds`: how long one group commit took.
pub const STORE_COMMIT_DURATION: &str = "mcp_tasks_store_commit_duration_seconds";
/// `mcp_tasks_store_commit_batch_ops`: how many operations one group commit carried.
pub const STORE_COMMIT_BATCH_OPS: &str = "mcp_tasks_store_commit_batch_ops";

/// One group commit of `ops` operations.
#[cfg(any(feature = "redb", feature = "postgres"))]
pub(crate) fn commit(elapsed: Duration, ops: usize) {
    metrics::histogram!(STORE_COMMIT_DURATION).record(elapsed.as_secs_f64());
    metrics::histogram!(STORE_COMMIT_BATCH_OPS).record(ops as f64);
}
