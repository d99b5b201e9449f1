//! Wall-clock time for task timestamps and expiry, replaceable in tests and simulations.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch. Task timestamps (`createdAt`, `lastUpdatedAt`) and
    /// expiry (`ttlMs`) are computed from it; it need not be monotonic.
    fn now_ms(&self) -> u64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to (tests, seeded simulations).
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self(Arc::new(AtomicU64::new(start_ms)))
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `ms`.
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// How far a replica's clock may be from the shared store's before it is logged as a
/// warning. Decisions never depend on it: on a shared store they use the store's clock.
pub const CLOCK_SKEW_WARNING: std::time::Duration = std::time::Duration::from_secs(1);

pub use crate::store::ReferenceClock;

/// The runtime's clock on a store shared by replicas: the store's [`ReferenceClock`], so that
/// every replica decides about time (expiry, retention, the reaper) on one clock. The
/// replica's own clock is read beside it only to tell how far off it is: beyond
/// [`CLOCK_SKEW_WARNING`] a warning is logged (once, and again once it is back within the
/// bound), and decisions still use the store's time. Before the store's first sample (there
/// always is one once a PostgreSQL store is open) it reads the local clock.
pub struct StoreClock {
    local: Arc<dyn Clock>,
    reference: Arc<ReferenceClock>,
    /// The local clock minus the reference's, in ms, as last read.
    offset_ms: std::sync::atomic::AtomicI64,
    warned: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for StoreClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreClock")
            .field("offset_ms", &self.offset_ms())
            .finish_non_exhaustive()
    }
}

impl StoreClock {
    /// The store's clock `reference`, beside this replica's `local` one.
    pub fn new(local: Arc<dyn Clock>, reference: Arc<ReferenceClock>) -> Self {
        Self {
            local,
            reference,
            offset_ms: std::sync::atomic::AtomicI64::new(0),
            warned: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// How far this replica's clock is ahead of the store's (negative: behind), in ms, as
    /// last read.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }
}

impl Clock for StoreClock {
    fn now_ms(&self) -> u64 {
        let local = self.local.now_ms();
        let Some((reference, uncertainty)) = self.reference.now() else {
            return local;
        };
        let offset = i64::try_from(i128::from(local) - i128::from(reference)).unwrap_or(i64::MAX);
        self.offset_ms.store(offset, Ordering::Relaxed);
        let bound = CLOCK_SKEW_WARNING.as_millis() as u64;
        let off = offset.unsigned_abs().saturating_sub(uncertainty);
        if off > bound {
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    offset_ms = offset,
                    uncertainty_ms = uncertainty,
                    "this replica's clock is off from the shared store's by more than {} ms; expiry, retention and timestamps use the store's clock",
                    bound
                );
            }
        } else if offset.unsigned_abs() < bound / 2 && self.warned.swap(false, Ordering::Relaxed) {
            tracing::info!(
                offset_ms = offset,
                "this replica's clock agrees with the shared store's again"
            );
        }
        reference
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_store_clock_reads_the_reference_and_measures_the_local_offset() {
        let local = ManualClock::new(5_000_000);
        let reference = Arc::new(ReferenceClock::new());
        let clock = StoreClock::new(Arc::new(local.clone()), reference.clone());
        // No sample yet: the local clock.
        assert_eq!(clock.now_ms(), 5_000_000);
        let sent = Instant::now();
        reference.record(3_800_000, sent, sent);
        let now = clock.now_ms();
        assert!((3_800_000..3_801_000).contains(&now), "{now}");
        let offset = clock.offset_ms();
        assert!((1_199_000..=1_200_000).contains(&offset), "{offset}");
        // The local clock jumping changes the offset, never the time decided by.
        local.advance(3_600_000);
        let later = clock.now_ms();
        assert!((now..now + 1_000).contains(&later), "{later}");
        assert!(clock.offset_ms() > 4_790_000);
    }
}
