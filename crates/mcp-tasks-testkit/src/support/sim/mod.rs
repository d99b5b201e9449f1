//! Shared parts of the crash-and-restart simulations (see docs/CRASH-TESTING.md):
//! a seeded random source, the history of what a client did and saw, the one checker every
//! simulation runs, the seeded workload driver, and a simulated disk (redb `StorageBackend`).
//! The tool the workload calls and its side-effect log are the test kit's [`crate::sim`];
//! the suites that run the simulations are `mcp-tasks-cli`'s `tests/crash` and `tests/pg`.

pub mod checker;
pub mod disk;
pub mod driver;
pub mod http;
pub mod linear;
pub mod power;
pub mod process;

use std::time::Duration;

/// SplitMix64: small, seedable, good enough for choosing workloads and fault points.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    /// The next number of the stream.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi` (`lo` when the range is empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.next_u64() % (hi - lo)
        }
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
    }

    /// An item chosen uniformly (`None` when there is none).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            None
        } else {
            let i = self.range(0, items.len() as u64) as usize;
            items.get(i)
        }
    }

    /// A child generator for an independent purpose (keeps streams stable when one purpose
    /// draws more or fewer numbers).
    pub fn fork(&mut self, purpose: u64) -> Rng {
        Rng::new(self.next_u64() ^ purpose.wrapping_mul(0xD6E8_FEB8_6659_FD93))
    }
}

/// `MCP_TASKS_SEED`: replay exactly this seed (decimal or 0x-hex) instead of the generated ones.
pub fn replay_seed() -> Option<u64> {
    let raw = std::env::var("MCP_TASKS_SEED").ok()?;
    let raw = raw.trim();
    let parsed = match raw.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => raw.parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("MCP_TASKS_SEED={raw:?} is not a u64: {e}")))
}

/// `MCP_TASKS_SOAK_SECS`: run a suite for this long instead of its CI budget.
pub fn soak() -> Option<Duration> {
    let raw = std::env::var("MCP_TASKS_SOAK_SECS").ok()?;
    let secs: u64 = raw
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("MCP_TASKS_SOAK_SECS={raw:?} is not a number: {e}"));
    Some(Duration::from_secs(secs))
}

/// A number from the environment, or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// The seeds of one run: `MCP_TASKS_SEED` alone, or `count` seeds derived from `base`
/// (`MCP_TASKS_BASE_SEED` overrides `base`, so a whole run can be repeated).
pub fn seeds(base: u64, count: u64) -> Vec<u64> {
    if let Some(seed) = replay_seed() {
        return vec![seed];
    }
    let base = env_u64("MCP_TASKS_BASE_SEED", base);
    let mut rng = Rng::new(base);
    (0..count).map(|_| rng.next_u64()).collect()
}

/// An endless stream of seeds derived from `base` (`MCP_TASKS_BASE_SEED` overrides it), for
/// soak runs; just `MCP_TASKS_SEED` when it is set.
pub fn seed_stream(base: u64) -> Box<dyn Iterator<Item = u64> + Send> {
    if let Some(seed) = replay_seed() {
        return Box::new(std::iter::once(seed));
    }
    let mut rng = Rng::new(env_u64("MCP_TASKS_BASE_SEED", base));
    Box::new(std::iter::from_fn(move || Some(rng.next_u64())))
}
