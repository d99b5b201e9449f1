//! What the process-level crash suites (`crash_process.rs`, `crash_replicas.rs`) share:
//! signals to a server child process, and recording what a stopped server left durable.

use std::process::Child;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::checker::History;

/// Sends `sig` (`libc::SIGKILL`, `SIGSTOP`, ...) to a child process.
pub fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// The wall clock in milliseconds since the Unix epoch (what task timestamps use).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Records `tasks` (the whole tasks table of a stopped server) as durable for `epoch`, then
/// waits until the wall clock passed every stored `lastUpdatedAt`, so that later observations
/// (the next server's timestamps) are strictly newer.
pub async fn record_durable(history: &History, epoch: u32, tasks: Vec<(String, Vec<u8>)>) {
    let mut max = 0;
    for (_, bytes) in &tasks {
        if let Ok(r) = mcp_tasks::internals::persist::decode(bytes) {
            max = max.max(r.last_updated_at_ms);
        }
    }
    history.durable(epoch, tasks);
    while now_ms() <= max {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
