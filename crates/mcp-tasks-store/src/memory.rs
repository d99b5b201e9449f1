//! The in-memory backend: the same semantics as the redb store (compare-and-set on the
//! sequence number, all-or-nothing jobs, the live and due indexes) with nothing written to
//! disk. For tests, and for measuring what durability costs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use futures::future::BoxFuture;

use super::listing::{
    self, ListedStatus, ListedTask, Listing, ListingCount, ListingCursor, ListingFilter,
    ListingIndex, ListingPage, ThroughputBucket, ThroughputKind,
};
use super::{
    Expect, OwnedCursor, OwnedRecord, OwnerEntry, StoreError, StoreFuture, StoreStats, TaskStore,
    Usage, WriteOp,
};

/// A store that keeps everything in memory: nothing survives the process.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<State>,
    closed: AtomicBool,
    commits: AtomicU64,
    ops: AtomicU64,
    /// Task records looked up by id (`get`, and each id of `get_many`).
    reads: AtomicU64,
}

#[derive(Debug, Default, Clone)]
struct State {
    tasks: BTreeMap<String, Vec<u8>>,
    seq: HashMap<String, u64>,
    live: BTreeSet<String>,
    due: BTreeSet<(u64, String)>,
    due_by_id: HashMap<String, u64>,
    meta: BTreeMap<String, Vec<u8>>,
    /// id → (owner, created_ms, stored bytes) of every indexed task.
    owner_of: HashMap<String, (String, u64, u64)>,
    /// (owner, created_ms, id): the owner index.
    by_owner: BTreeSet<(String, u64, String)>,
    usage: HashMap<String, Usage>,
    /// id → the listing of every indexed task (it needs the owner entry).
    listed: HashMap<String, Listing>,
    /// (owner, tool, status) → tasks.
    listing_counts: BTreeMap<(String, String, ListedStatus), u64>,
    /// (minute, kind) → count.
    throughput: BTreeMap<(u64, ThroughputKind), u64>,
}

impl State {
    /// Takes task `id` out of the owner index and its owner's usage; returns its entry.
    fn unindex(&mut self, id: &str) -> Option<OwnerEntry> {
        let (owner, created_ms, size) = self.owner_of.remove(id)?;
        self.by_owner
            .remove(&(owner.clone(), created_ms, id.to_owned()));
        if let Some(usage) = self.usage.get_mut(&owner) {
            usage.add(size, -1);
            if usage.tasks == 0 {
                self.usage.remove(&owner);
            }
        }
        Some(OwnerEntry { owner, created_ms })
    }

    /// Puts task `id` of `size` stored bytes into the owner index and its owner's usage.
    fn index(&mut self, id: &str, entry: OwnerEntry, size: u64) {
        self.by_owner
            .insert((entry.owner.clone(), entry.created_ms, id.to_owned()));
        self.usage
            .entry(entry.owner.clone())
            .or_default()
            .add(size, 1);
        self.owner_of
            .insert(id.to_owned(), (entry.owner, entry.created_ms, size));
    }

    /// Moves the listing of task `id`, owned by `entry`, to `new` (`None`: the task is
    /// deleted), with its counters and throughput.
    fn relist(&mut self, id: &str, entry: &OwnerEntry, new: Option<Listing>) {
        let old = self.listed.remove(id);
        if let Some(old) = &old {
            let key = (entry.owner.clone(), old.tool.clone(), old.status);
            if let Some(n) = self.listing_counts.get_mut(&key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.listing_counts.remove(&key);
                }
            }
        }
        let Some(new) = new else { return };
        for (minute, kind) in listing::throughput_of(old.as_ref(), &new, entry.created_ms) {
            *self.throughput.entry((minute, kind)).or_default() += 1;
            let oldest = minute.saturating_sub(listing::THROUGHPUT_RETENTION_MS);
            self.throughput.retain(|(m, _), _| *m >= oldest);
        }
        *self
            .listing_counts
            .entry((entry.owner.clone(), new.tool.clone(), new.status))
            .or_default() += 1;
        self.listed.insert(id.to_owned(), new);
    }

    fn set_due(&mut self, id: &str, due_ms: Option<u64>) {
        if let Some(old) = self.due_by_id.remove(id) {
            self.due.remove(&(old, id.to_owned()));
        }
        if let Some(at) = due_ms {
            self.due.insert((at, id.to_owned()));
            self.due_by_id.insert(id.to_owned(), at);
        }
    }

    /// The conflict of a job, if its preconditions do not hold.
    fn conflict(&self, job: &[WriteOp]) -> Option<StoreError> {
        for op in job {
            if let WriteOp::Put { id, expect, .. } = op {
                let exists = self.tasks.contains_key(id);
                let found = self.seq.get(id).copied();
                let bad = match *expect {
                    Expect::Any => None,
                    Expect::Absent if exists => Some((None, found)),
                    Expect::Absent => None,
                    Expect::Seq(n) => match (exists, found) {
                        (true, Some(f)) if f == n => None,
                        (true, None) => None,
                        (_, f) => Some((Some(n), f)),
                    },
                };
                if let Some((expected, found)) = bad {
                    return Some(StoreError::Conflict {
                        id: id.clone(),
                        expected,
                        found,
                    });
                }
            }
        }
        None
    }

    fn apply(&mut self, op: WriteOp) {
        match op {
            WriteOp::Put {
                id,
                bytes,
                // Kept whole: memory holds one copy either way.
                constant_tail: _,
                live,
                due_ms,
                seq,
                expect: _,
                owner,
                listing,
            } => {
                let size = (id.len() + bytes.len()) as u64;
                let old = self.unindex(&id);
                if let Some(entry) = owner.or(old) {
                    if let Some(listing) = listing {
                        self.relist(&id, &entry, Some(listing));
                    }
                    self.index(&id, entry, size);
                }
                match seq {
                    Some(seq) => self.seq.insert(id.clone(), seq),
                    None => self.seq.remove(&id),
                };
                if live {
                    self.live.insert(id.clone());
                } else {
                    self.live.remove(&id);
                }
                self.set_due(&id, due_ms);
                self.tasks.insert(id, bytes);
            }
            WriteOp::Delete { id } => {
                if let Some(entry) = self.unindex(&id) {
                    self.relist(&id, &entry, None);
                }
                self.tasks.remove(&id);
                self.live.remove(&id);
                self.seq.remove(&id);
                self.set_due(&id, None);
            }
            WriteOp::SetDue { id, due_ms } => {
                let due_ms = due_ms.filter(|_| self.tasks.contains_key(&id));
                self.set_due(&id, due_ms);
            }
            WriteOp::PutMetaIfAbsent { key, value } => {
                self.meta.entry(key).or_insert(value);
            }
            WriteOp::PutMeta { key, value } => {
                self.meta.insert(key, value);
            }
            WriteOp::DeleteMeta { key } => {
                self.meta.remove(&key);
            }
        }
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// Task records looked up by id since creation (`get`, and each id of `get_many`): what
    /// a request cost in store reads, for tests.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    fn state(&self) -> Result<MutexGuard<'_, State>, StoreError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(StoreError::Closed);
        }
        Ok(self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn commit_now(&self, ops: Vec<WriteOp>) -> Result<(), StoreError> {
        let mut state = self.state()?;
        if let Some(conflict) = state.conflict(&ops) {
            return Err(conflict);
        }
        let n = ops.len() as u64;
        for op in ops {
            state.apply(op);
        }
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.ops.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }
}

impl TaskStore for MemoryStore {
    fn describe(&self) -> String {
        "memory".to_owned()
    }
    fn boot_epoch(&self) -> u64 {
        1
    }
    fn commit(&self, ops: Vec<WriteOp>) -> StoreFuture<'_, ()> {
        Box::pin(std::future::ready(self.commit_now(ops)))
    }
    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Vec<u8>>> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        Box::pin(std::future::ready(
            self.state().map(|s| s.tasks.get(id).cloned()),
        ))
    }
    fn get_many(&self, ids: Vec<String>) -> StoreFuture<'_, Vec<Option<Vec<u8>>>> {
        self.reads.fetch_add(ids.len() as u64, Ordering::Relaxed);
        Box::pin(std::future::ready(self.state().map(|s| {
            ids.iter().map(|id| s.tasks.get(id).cloned()).collect()
        })))
    }
    fn live(&self) -> StoreFuture<'_, Vec<(String, Vec<u8>)>> {
        Box::pin(std::future::ready(self.state().map(|s| {
            s.live
                .iter()
                .filter_map(|id| s.tasks.get(id).map(|b| (id.clone(), b.clone())))
                .collect()
        })))
    }
    fn due(&self, now_ms: u64, limit: usize) -> StoreFuture<'_, Vec<String>> {
        Box::pin(std::future::ready(self.state().map(|s| {
            s.due
                .iter()
                .take_while(|(at, _)| *at <= now_ms)
                .take(limit)
                .map(|(_, id)| id.clone())
                .collect()
        })))
    }
    fn next_due(&self) -> StoreFuture<'_, Option<u64>> {
        Box::pin(std::future::ready(
            self.state().map(|s| s.due.first().map(|(at, _)| *at)),
        ))
    }
    fn meta_get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Vec<u8>>> {
        Box::pin(std::future::ready(
            self.state().map(|s| s.meta.get(key).cloned()),
        ))
    }
    fn meta_page<'a>(
        &'a self,
        prefix: &'a str,
        after: Option<&'a str>,
        limit: usize,
    ) -> StoreFuture<'a, Vec<(String, Vec<u8>)>> {
        use std::ops::Bound;
        let start = match after {
            Some(a) if a >= prefix => Bound::Excluded(a),
            _ => Bound::Included(prefix),
        };
        Box::pin(std::future::ready(self.state().map(|s| {
            s.meta
                .range::<str, _>((start, Bound::Unbounded))
                .take_while(|(k, _)| k.starts_with(prefix))
                .take(limit.min(super::MAX_PAGE))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })))
    }
    fn tasks(&self) -> StoreFuture<'_, Vec<(String, Vec<u8>)>> {
        Box::pin(std::future::ready(self.state().map(|s| {
            s.tasks
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })))
    }
    fn counts(&self) -> StoreFuture<'_, (u64, u64)> {
        Box::pin(std::future::ready(
            self.state()
                .map(|s| (s.tasks.len() as u64, s.live.len() as u64)),
        ))
    }
    fn stats(&self) -> StoreStats {
        StoreStats {
            commits: self.commits.load(Ordering::Relaxed),
            ops: self.ops.load(Ordering::Relaxed),
            cached_reads: 0,
        }
    }
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
    fn halted(&self) -> Option<String> {
        None
    }
    fn wait_halted(&self) -> BoxFuture<'_, String> {
        Box::pin(std::future::pending())
    }
    fn unavailable(&self) -> Option<String> {
        None
    }
    fn close(&self) -> BoxFuture<'_, ()> {
        self.closed.store(true, Ordering::SeqCst);
        Box::pin(std::future::ready(()))
    }

    fn index(&self) -> Option<&dyn crate::Index> {
        Some(self)
    }
}

impl crate::Index for MemoryStore {
    fn owned<'a>(
        &'a self,
        owner: &'a str,
        after: Option<OwnedCursor>,
        limit: usize,
    ) -> StoreFuture<'a, Vec<OwnedRecord>> {
        use std::ops::Bound;
        let limit = limit.min(super::MAX_PAGE);
        Box::pin(std::future::ready(self.state().map(|s| {
            let from = match after {
                Some(a) => Bound::Excluded((owner.to_owned(), a.created_ms, a.id)),
                None => Bound::Included((owner.to_owned(), 0, String::new())),
            };
            let mut out = Vec::new();
            let mut held = 0usize;
            let index = s
                .by_owner
                .range((from, Bound::Unbounded))
                .take_while(|(o, _, _)| o == owner);
            for (_, created_ms, id) in index {
                if out.len() >= limit || held >= super::MAX_PAGE_BYTES {
                    break;
                }
                if let Some(bytes) = s.tasks.get(id) {
                    held = held.saturating_add(bytes.len());
                    out.push(OwnedRecord {
                        id: id.clone(),
                        created_ms: *created_ms,
                        bytes: bytes.clone(),
                    });
                }
            }
            out
        })))
    }

    fn usage<'a>(&'a self, owner: &'a str) -> StoreFuture<'a, Usage> {
        Box::pin(std::future::ready(
            self.state()
                .map(|s| s.usage.get(owner).copied().unwrap_or_default()),
        ))
    }

    fn listing<'a>(
        &'a self,
        filter: &'a ListingFilter,
        after: Option<ListingCursor>,
        limit: usize,
        budget: usize,
    ) -> StoreFuture<'a, ListingPage> {
        Box::pin(async move {
            let state = self.state()?;
            let (from, to) = filter.walk_bounds(after.as_ref());
            let mut walk: Vec<ListedTask> = state
                .listed
                .iter()
                .filter_map(|(id, listing)| {
                    let (owner, created_ms, _) = state.owner_of.get(id)?;
                    let task = ListedTask {
                        id: id.clone(),
                        owner: owner.clone(),
                        created_ms: *created_ms,
                        listing: listing.clone(),
                    };
                    let in_index = match filter.index() {
                        ListingIndex::Created => true,
                        ListingIndex::Owner(o) => task.owner == o,
                        ListingIndex::Tool(t) => task.listing.tool == t,
                        ListingIndex::Status(s) => task.listing.status == s,
                    };
                    (in_index
                        && (from..to).contains(&task.created_ms)
                        && listing::before_cursor(task.created_ms, &task.id, after.as_ref()))
                    .then_some(task)
                })
                .collect();
            walk.sort_by_key(|t| std::cmp::Reverse(t.cursor()));
            listing::fill_page(walk.into_iter().map(Ok), filter, limit, budget)
        })
    }

    fn listing_counts(&self) -> StoreFuture<'_, Vec<ListingCount>> {
        Box::pin(async move {
            Ok(self
                .state()?
                .listing_counts
                .iter()
                .map(|((owner, tool, status), n)| ListingCount {
                    owner: owner.clone(),
                    tool: tool.clone(),
                    status: *status,
                    tasks: *n,
                })
                .collect())
        })
    }

    fn throughput(&self, since_ms: u64) -> StoreFuture<'_, Vec<ThroughputBucket>> {
        Box::pin(async move {
            Ok(self
                .state()?
                .throughput
                .range((listing::minute_of(since_ms), ThroughputKind::Created)..)
                .map(|((minute_ms, kind), count)| ThroughputBucket {
                    minute_ms: *minute_ms,
                    kind: *kind,
                    count: *count,
                })
                .collect())
        })
    }

    fn usage_by_owner(&self) -> StoreFuture<'_, Vec<(String, Usage)>> {
        Box::pin(std::future::ready(self.state().map(|s| {
            let mut all: Vec<(String, Usage)> =
                s.usage.iter().map(|(k, v)| (k.clone(), *v)).collect();
            all.sort_by(|a, b| a.0.cmp(&b.0));
            all
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Index;

    #[tokio::test]
    async fn meta_pages_walk_one_prefix_in_key_order() {
        let store = MemoryStore::new();
        let keys = ["a", "a/3", "a/1", "ab", "b/1", "a/2"];
        let ops = keys
            .iter()
            .map(|k| WriteOp::PutMeta {
                key: (*k).into(),
                value: k.as_bytes().to_vec(),
            })
            .collect();
        store.commit(ops).await.unwrap();
        let page = |after: Option<&'static str>, limit| {
            let store = &store;
            async move {
                let page = store.meta_page("a/", after, limit).await.unwrap();
                page.into_iter()
                    .map(|(k, v)| {
                        assert_eq!(k.as_bytes(), v.as_slice());
                        k
                    })
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(page(None, 2).await, ["a/1", "a/2"]);
        assert_eq!(page(Some("a/2"), 2).await, ["a/3"]);
        assert_eq!(page(Some("a/3"), 2).await, Vec::<String>::new());
        assert_eq!(page(Some("0"), 9).await, ["a/1", "a/2", "a/3"]);
        assert_eq!(page(None, usize::MAX).await.len(), 3);
    }

    fn put(id: &str, seq: u64, expect: Expect, live: bool, due: Option<u64>) -> WriteOp {
        WriteOp::Put {
            id: id.to_owned(),
            bytes: vec![seq as u8],
            constant_tail: 0,
            live,
            due_ms: due,
            seq: Some(seq),
            expect,
            owner: None,
            listing: None,
        }
    }

    #[tokio::test]
    async fn compare_and_set_and_indexes() {
        let store = MemoryStore::new();
        store
            .commit(vec![put("a", 1, Expect::Absent, true, Some(10))])
            .await
            .unwrap();
        let again = store
            .commit(vec![put("a", 1, Expect::Absent, true, None)])
            .await;
        assert!(matches!(again, Err(StoreError::Conflict { .. })));
        let stale = store
            .commit(vec![put("a", 3, Expect::Seq(2), true, None)])
            .await;
        assert!(matches!(
            stale,
            Err(StoreError::Conflict {
                expected: Some(2),
                found: Some(1),
                ..
            })
        ));
        store
            .commit(vec![put("a", 2, Expect::Seq(1), false, Some(20))])
            .await
            .unwrap();
        assert_eq!(store.get("a").await.unwrap(), Some(vec![2]));
        assert!(store.live().await.unwrap().is_empty());
        assert!(store.due(19, 10).await.unwrap().is_empty());
        assert_eq!(store.due(20, 10).await.unwrap(), vec!["a".to_owned()]);
        assert_eq!(store.counts().await.unwrap(), (1, 0));
        store
            .commit(vec![WriteOp::Delete { id: "a".into() }])
            .await
            .unwrap();
        assert_eq!(store.next_due().await.unwrap(), None);
        for value in [b"first".to_vec(), b"second".to_vec()] {
            store
                .commit(vec![WriteOp::PutMetaIfAbsent {
                    key: "k".into(),
                    value,
                }])
                .await
                .unwrap();
        }
        assert_eq!(store.meta_get("k").await.unwrap(), Some(b"first".to_vec()));
        store
            .commit(vec![WriteOp::DeleteMeta { key: "k".into() }])
            .await
            .unwrap();
        assert_eq!(store.meta_get("k").await.unwrap(), None);
        store.close().await;
        assert!(matches!(store.get("a").await, Err(StoreError::Closed)));
    }

    /// The owner index pages one owner in (creation time, id) order; the usage follows puts
    /// (a put without an owner keeps it) and deletes.
    #[tokio::test]
    async fn the_owner_index_and_usage() {
        let store = MemoryStore::new();
        let owned = |id: &str, owner: &str, created_ms: u64| WriteOp::Put {
            id: id.to_owned(),
            bytes: vec![0; 10],
            constant_tail: 0,
            live: true,
            due_ms: None,
            seq: Some(1),
            expect: Expect::Absent,
            owner: Some(OwnerEntry {
                owner: owner.to_owned(),
                created_ms,
            }),
            listing: None,
        };
        store
            .commit(vec![
                owned("c", "alice", 1),
                owned("a", "alice", 2),
                owned("b", "alice", 1),
                owned("z", "bob", 0),
            ])
            .await
            .unwrap();
        let page = store.owned("alice", None, 2).await.unwrap();
        let ids: Vec<&str> = page.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, vec!["b", "c"]);
        let after = OwnedCursor {
            created_ms: 1,
            id: "c".into(),
        };
        let rest = store.owned("alice", Some(after), 2).await.unwrap();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].id, "a");
        assert_eq!(
            store.usage("alice").await.unwrap(),
            Usage {
                tasks: 3,
                bytes: 33
            }
        );
        store
            .commit(vec![put("a", 2, Expect::Seq(1), false, None)])
            .await
            .unwrap();
        assert_eq!(
            store.usage("alice").await.unwrap(),
            Usage {
                tasks: 3,
                bytes: 24
            }
        );
        store
            .commit(vec![WriteOp::Delete { id: "a".into() }])
            .await
            .unwrap();
        assert_eq!(store.usage("alice").await.unwrap().tasks, 2);
        assert_eq!(store.usage_by_owner().await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_conflicting_job_stores_nothing() {
        let store = MemoryStore::new();
        let job = vec![
            put("b", 1, Expect::Absent, true, None),
            put("c", 5, Expect::Seq(4), true, None),
        ];
        assert!(store.commit(job).await.is_err());
        assert_eq!(store.counts().await.unwrap(), (0, 0));
    }
}
