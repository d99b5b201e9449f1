//! The clock of a store shared by replicas: [`ReferenceClock`].

/// How much the monotonic clock is assumed to drift from the reference between two samples
/// (100 ppm, far above what a real oscillator does): the uncertainty of a sample grows by it.
const DRIFT_PER_MS: f64 = 1e-4;

/// The clock of a store shared by replicas (the database's `now()`), sampled by the store at
/// each heartbeat and carried forward between samples with this process's monotonic clock.
///
/// Every replica reading it gets the database's time within the uncertainty of its best
/// sample (half the round trip of the statement that read it, plus the drift since), whatever
/// its own wall clock says: expiry, the reaper's due query and retention then agree across
/// replicas.
#[derive(Debug, Default)]
pub struct ReferenceClock {
    sample: std::sync::Mutex<Option<Sample>>,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    /// The reference's time, in ms since the Unix epoch, at `at`.
    ms: u64,
    at: std::time::Instant,
    /// Half the round trip of the read.
    half_rtt: std::time::Duration,
}

impl Sample {
    fn uncertainty_ms(&self, now: std::time::Instant) -> f64 {
        let age = now.saturating_duration_since(self.at).as_secs_f64() * 1000.0;
        self.half_rtt.as_secs_f64() * 1000.0 + age * DRIFT_PER_MS
    }
}

impl ReferenceClock {
    /// A reference clock with no sample yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a reading `ms` of the reference taken by a request sent at `sent` whose answer
    /// came at `received`. Kept if it is more precise than the sample held (a slow round trip
    /// does not replace a recent fast one).
    pub fn record(&self, ms: u64, sent: std::time::Instant, received: std::time::Instant) {
        let rtt = received.saturating_duration_since(sent);
        let new = Sample {
            ms,
            at: sent + rtt / 2,
            half_rtt: rtt / 2,
        };
        let mut slot = self.sample.lock().unwrap_or_else(|e| e.into_inner());
        let keep_old =
            slot.is_some_and(|old| old.uncertainty_ms(received) < new.uncertainty_ms(received));
        if !keep_old {
            *slot = Some(new);
        }
    }

    /// The reference's time now, in ms since the Unix epoch, with its uncertainty in ms;
    /// `None` before the first sample.
    pub fn now(&self) -> Option<(u64, u64)> {
        let sample = (*self.sample.lock().unwrap_or_else(|e| e.into_inner()))?;
        let now = std::time::Instant::now();
        let elapsed = now.saturating_duration_since(sample.at);
        let ms = sample
            .ms
            .saturating_add(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX));
        Some((ms, sample.uncertainty_ms(now).ceil() as u64))
    }
}

/// This process's wall clock, in ms since the Unix epoch (0 before the epoch).
#[cfg(feature = "postgres")]
pub(crate) fn system_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn the_reference_is_carried_forward_and_the_most_precise_sample_kept() {
        let reference = ReferenceClock::new();
        assert_eq!(reference.now(), None);
        let sent = Instant::now();
        reference.record(1_000_000, sent, sent + Duration::from_millis(10));
        let (ms, uncertainty) = reference.now().unwrap();
        // Taken at the middle of the round trip, carried forward since.
        assert!((1_000_000..1_000_000 + 1_000).contains(&ms), "{ms}");
        assert!((5..=6).contains(&uncertainty), "{uncertainty}");
        // A slower read does not replace it.
        reference.record(9_000_000, sent, sent + Duration::from_millis(400));
        assert!(reference.now().unwrap().0 < 1_001_000);
        // A faster one does.
        reference.record(2_000_000, sent, sent + Duration::from_millis(2));
        let (ms, uncertainty) = reference.now().unwrap();
        assert!((2_000_000..2_001_000).contains(&ms), "{ms}");
        assert!(uncertainty <= 2, "{uncertainty}");
    }
}
