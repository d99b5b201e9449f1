//! Memory given back: the server returns the heap that a burst of tasks freed to the system.
//!
//! glibc's allocator keeps what a program frees for its next allocations: after thousands of
//! task actors stop at once (tasks waiting for input parked after `--passivate-after`, or a
//! burst of tasks finishing), the process keeps their pages resident although nothing uses
//! them. Every [`INTERVAL`] this looks at the number of task actors; when it has fallen by
//! [`BURST`] or more since its high-water mark, `malloc_trim(0)` hands the free pages of every
//! arena back (`madvise`), on a blocking thread, and the mark starts again from there. A steady
//! load, whose actor count only wobbles, never triggers it. `serve --no-malloc-trim` turns it
//! off. `cargo bench --bench scale -- --only returned` measures what it gives back
//! (docs/BENCHMARKS.md).
//!
//! This is the binary's policy: a library user keeps their own allocator and its settings
//! (docs/SERVE.md says what to pick).

use std::time::Duration;

/// How often the actor count is looked at.
pub(crate) const INTERVAL: Duration = Duration::from_secs(5);
/// The fall in task actors that makes a trim worth it.
pub(crate) const BURST: usize = 256;

/// Whether a trim is due, given the actors' high-water mark since the last trim and the count
/// now; the new mark.
pub(crate) fn due(high: usize, now: usize) -> (bool, usize) {
    if high.saturating_sub(now) >= BURST {
        (true, now)
    } else {
        (false, high.max(now))
    }
}

/// Trims after each burst of stopped actors of `handle`'s runtime, until the task is aborted.
pub(crate) fn spawn(handle: mcp_tasks::RuntimeHandle) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut high = handle.live_tasks();
        let mut tick = tokio::time::interval(INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = handle.live_tasks();
            let (trim, mark) = due(high, now);
            high = mark;
            if trim {
                let released = tokio::task::spawn_blocking(trim_heap)
                    .await
                    .unwrap_or(false);
                tracing::debug!(actors = now, released, "memory: free heap pages given back");
            }
        }
    })
}

/// `malloc_trim(0)`: whether glibc gave memory back.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_heap() -> bool {
    // SAFETY: `malloc_trim` only walks the allocator's own free lists under its locks; it
    // takes no pointer from us and is safe to call from any thread at any time.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Other allocators give memory back by themselves (or not at all): nothing to do.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_heap() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_stopped_actors_triggers_one_trim() {
        // Rising: no trim, the mark follows.
        assert_eq!(due(0, 1_000), (false, 1_000));
        // A small wobble: none.
        assert_eq!(due(1_000, 900), (false, 1_000));
        // A burst: trim, and the mark starts again from the count now.
        assert_eq!(due(1_000, 1_000 - BURST), (true, 1_000 - BURST));
        assert_eq!(due(20_000, 0), (true, 0));
        assert_eq!(due(0, 0), (false, 0));
    }
}
