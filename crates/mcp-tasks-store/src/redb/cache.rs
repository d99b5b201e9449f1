//! The record cache: recently read snapshots, so that repeated reads of a stored task (a
//! client polling a finished task) are answered without a read transaction on the blocking
//! pool. Bounded in bytes ([`StoreOptions::record_cache_size`]), filled only by reads, and
//! never ahead of the file: the writer thread drops every id a batch wrote before it
//! acknowledges the batch, and empties the cache when it reopens the file or halts.
//!
//! A read that raced with a commit must not put back what the commit replaced. Every drop
//! bumps an epoch; a reader takes the epoch *before* it begins its read transaction and may
//! fill the cache only if the epoch has not moved since. If a commit that wrote the id landed
//! after the read transaction began (so the read saw the older value), its drop comes after
//! the reader took the epoch: either it has happened (the epoch moved, nothing is put back)
//! or it has not yet (the value is put back, and the drop removes it before the commit is
//! acknowledged).
//!
//! Eviction is two generations: new entries go to the young map; when it holds half the
//! budget it becomes the old map (the previous old map is dropped); a hit in the old map moves
//! the entry back to the young one. So the cache holds at most about the budget, and what is
//! read again survives.
//!
//! [`StoreOptions::record_cache_size`]: crate::StoreOptions::record_cache_size

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes counted per entry besides its id and snapshot: the two hash-table slots' share, the
/// `Arc` header, the allocations' rounding.
const ENTRY_OVERHEAD: usize = 96;

/// See the module documentation.
pub(super) struct RecordCache {
    /// Bytes for one generation (half the budget); 0 = the cache is off.
    generation_bytes: usize,
    state: Mutex<State>,
    hits: AtomicU64,
}

#[derive(Default)]
struct State {
    epoch: u64,
    young: HashMap<Box<str>, Arc<[u8]>>,
    young_bytes: usize,
    old: HashMap<Box<str>, Arc<[u8]>>,
}

fn cost(id: &str, bytes: &[u8]) -> usize {
    id.len() + bytes.len() + ENTRY_OVERHEAD
}

impl RecordCache {
    /// A cache of at most about `budget` bytes (0: off).
    pub(super) fn new(budget: usize) -> Self {
        Self {
            generation_bytes: budget / 2,
            state: Mutex::new(State::default()),
            hits: AtomicU64::new(0),
        }
    }

    fn enabled(&self) -> bool {
        self.generation_bytes > 0
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached snapshot of `id`.
    pub(super) fn get(&self, id: &str) -> Option<Arc<[u8]>> {
        if !self.enabled() {
            return None;
        }
        let mut state = self.state();
        let found = match state.young.get(id) {
            Some(bytes) => Some(Arc::clone(bytes)),
            None => {
                let (key, bytes) = state.old.remove_entry(id)?;
                let found = Arc::clone(&bytes);
                state.put_young(key, bytes, self.generation_bytes);
                Some(found)
            }
        };
        drop(state);
        self.hits.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// The epoch to pass to [`RecordCache::fill`]; take it before the read transaction begins.
    pub(super) fn epoch(&self) -> u64 {
        if !self.enabled() {
            return 0;
        }
        self.state().epoch
    }

    /// Keeps what a read found for `id`, unless a write dropped anything since `epoch`.
    pub(super) fn fill(&self, id: &str, bytes: &[u8], epoch: u64) {
        if !self.enabled() || cost(id, bytes) > self.generation_bytes {
            return;
        }
        let bytes: Arc<[u8]> = Arc::from(bytes);
        let mut state = self.state();
        if state.epoch != epoch {
            return;
        }
        state.old.remove(id);
        state.put_young(id.into(), bytes, self.generation_bytes);
    }

    /// Drops the entries of `ids` (the writer, after a batch that wrote them and before it
    /// acknowledges it).
    pub(super) fn drop_ids<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        if !self.enabled() {
            return;
        }
        let mut state = self.state();
        state.epoch += 1;
        for id in ids {
            if let Some(bytes) = state.young.remove(id) {
                state.young_bytes -= cost(id, &bytes);
            }
            state.old.remove(id);
        }
    }

    /// Drops everything (the file was reopened, or the store halted).
    pub(super) fn clear(&self) {
        if !self.enabled() {
            return;
        }
        let mut state = self.state();
        state.epoch += 1;
        state.young = HashMap::new();
        state.young_bytes = 0;
        state.old = HashMap::new();
    }

    /// Reads answered from the cache since the store was opened.
    pub(super) fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Bytes held, as [`RecordCache`] counts them (tests).
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        let state = self.state();
        state.young_bytes + state.old.iter().map(|(k, v)| cost(k, v)).sum::<usize>()
    }
}

impl State {
    fn put_young(&mut self, id: Box<str>, bytes: Arc<[u8]>, generation_bytes: usize) {
        let id_len = id.len();
        self.young_bytes += id_len + bytes.len() + ENTRY_OVERHEAD;
        if let Some(previous) = self.young.insert(id, bytes) {
            self.young_bytes -= id_len + previous.len() + ENTRY_OVERHEAD;
        }
        if self.young_bytes > generation_bytes {
            self.old = std::mem::take(&mut self.young);
            self.young_bytes = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cached(cache: &RecordCache, id: &str) -> Option<Vec<u8>> {
        cache.get(id).map(|b| b.to_vec())
    }

    #[test]
    fn a_read_fills_and_a_write_drops() {
        let cache = RecordCache::new(1 << 20);
        assert_eq!(cached(&cache, "a"), None);
        let epoch = cache.epoch();
        cache.fill("a", b"one", epoch);
        assert_eq!(cached(&cache, "a"), Some(b"one".to_vec()));
        assert_eq!(cache.hits(), 1);
        cache.drop_ids(["a"]);
        assert_eq!(cached(&cache, "a"), None);
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn a_read_older_than_a_write_is_not_kept() {
        let cache = RecordCache::new(1 << 20);
        // The reader takes the epoch, its transaction sees the old value; a commit of "a"
        // lands and the writer drops "a" before the reader fills.
        let epoch = cache.epoch();
        cache.drop_ids(["a"]);
        cache.fill("a", b"old", epoch);
        assert_eq!(cached(&cache, "a"), None);
        // A write of another id also refuses the fill (the epoch is one for all ids).
        let epoch = cache.epoch();
        cache.drop_ids(["b"]);
        cache.fill("a", b"old", epoch);
        assert_eq!(cached(&cache, "a"), None);
        // After a clear too.
        let epoch = cache.epoch();
        cache.clear();
        cache.fill("a", b"old", epoch);
        assert_eq!(cached(&cache, "a"), None);
    }

    #[test]
    fn bounded_and_what_is_read_again_survives() {
        let budget = 64 * 1024;
        let cache = RecordCache::new(budget);
        let value = vec![7u8; 400];
        cache.fill("hot", &value, cache.epoch());
        for i in 0..10_000 {
            cache.fill(&format!("task-{i}"), &value, cache.epoch());
            assert!(cache.bytes() <= budget + cost("task-10000", &value));
            assert!(cache.get("hot").is_some(), "evicted after {i} fills");
        }
        assert!(cache.bytes() >= budget / 4);
        // Refilling an id replaces its entry and keeps the count right.
        for _ in 0..100 {
            cache.fill("hot", &value, cache.epoch());
        }
        cache.drop_ids(["hot"]);
        assert_eq!(cached(&cache, "hot"), None);
        cache.clear();
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn zero_budget_is_off() {
        let cache = RecordCache::new(0);
        cache.fill("a", b"one", cache.epoch());
        assert_eq!(cached(&cache, "a"), None);
        assert_eq!(cache.hits(), 0);
        let small = RecordCache::new(200);
        small.fill("a", &[0u8; 300], small.epoch());
        assert_eq!(
            cached(&small, "a"),
            None,
            "an entry larger than a generation"
        );
    }
}
