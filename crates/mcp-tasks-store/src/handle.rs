//! [`Store`], the cheap-to-clone handle the runtime holds over any [`TaskStore`].

use std::fmt;
#[cfg(feature = "redb")]
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "redb")]
use crate::{BackendFactory, RedbStore, StoreOptions};
use crate::{
    Cause, Cluster, Index, MAX_PAGE, MemoryStore, OwnedCursor, OwnedRecord, Reconciled, StoreError,
    StoreStats, TaskStore, Usage, Wakeup, WriteOp, listing, no_listing, records_within_bytes,
};
#[cfg(feature = "postgres")]
use crate::{PostgresOptions, PostgresStore};

/// The store the runtime persists through: a cheap-to-clone handle on a [`TaskStore`].
#[derive(Clone)]
pub struct Store {
    inner: Arc<dyn TaskStore>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("store", &self.inner.describe())
            .field("boot_epoch", &self.inner.boot_epoch())
            .field("stats", &self.inner.stats())
            .finish_non_exhaustive()
    }
}

impl Store {
    /// A handle on any backend (a host's own, or one opened by hand).
    pub fn from_backend(backend: Arc<dyn TaskStore>) -> Store {
        Store { inner: backend }
    }

    #[cfg(feature = "redb")]
    /// Opens (or creates) a redb store file (feature `redb`); see [`RedbStore::open`].
    /// Blocking: call it from
    /// `spawn_blocking` or before the runtime starts (or use [`Store::open_async`]).
    pub fn open(path: &Path, options: StoreOptions) -> Result<Store, StoreError> {
        Ok(Self::from_backend(Arc::new(RedbStore::open(
            path, options,
        )?)))
    }

    #[cfg(feature = "redb")]
    /// A redb store on a [`StorageBackend`](redb::StorageBackend) instead of a file (feature `redb`); see
    /// [`RedbStore::open_with_backend`].
    pub fn open_with_backend(
        label: &Path,
        factory: BackendFactory,
        options: StoreOptions,
    ) -> Result<Store, StoreError> {
        Ok(Self::from_backend(Arc::new(RedbStore::open_with_backend(
            label, factory, options,
        )?)))
    }

    #[cfg(feature = "redb")]
    /// [`Store::open`] on the blocking pool (feature `redb`).
    pub async fn open_async(path: PathBuf, options: StoreOptions) -> Result<Store, StoreError> {
        Ok(Self::from_backend(Arc::new(
            RedbStore::open_async(path, options).await?,
        )))
    }

    #[cfg(feature = "redb")]
    /// [`Store::open_with_backend`] on the blocking pool (feature `redb`).
    pub async fn open_with_backend_async(
        label: PathBuf,
        factory: BackendFactory,
        options: StoreOptions,
    ) -> Result<Store, StoreError> {
        Ok(Self::from_backend(Arc::new(
            RedbStore::open_with_backend_async(label, factory, options).await?,
        )))
    }

    /// A fresh in-memory store (nothing survives the process).
    pub fn memory() -> Store {
        Self::from_backend(Arc::new(MemoryStore::new()))
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn TaskStore> {
        &self.inner
    }

    /// Names the store in logs (a path, or a URL without its password).
    pub fn describe(&self) -> String {
        self.inner.describe()
    }

    /// The boot epoch this open recorded (1 for a new store, +1 per open).
    pub fn boot_epoch(&self) -> u64 {
        self.inner.boot_epoch()
    }

    /// Commits `ops` durably and returns once the transaction holding them has committed.
    /// The redb backend group-commits: its writer drains every queued job, applies them in
    /// one write transaction and one commit, then acks each waiter.
    ///
    /// On failure nothing of this call is stored. A job whose [`Expect`](crate::Expect) fails gets
    /// [`StoreError::Conflict`](crate::StoreError::Conflict) (or [`StoreError::Fenced`](crate::StoreError::Fenced) on a shared store whose lease moved)
    /// and nothing of it is stored.
    pub async fn commit(&self, ops: Vec<WriteOp>) -> Result<(), StoreError> {
        if ops.is_empty() {
            return Ok(());
        }
        self.inner.commit(ops).await
    }

    /// The snapshot bytes of task `id`.
    pub async fn get(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(id).await
    }

    /// The snapshot bytes of each of `ids`, read together.
    pub async fn get_many(&self, ids: Vec<String>) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.inner.get_many(ids).await
    }

    /// All (id, bytes) of live tasks, ordered by id, via the live index only.
    pub async fn live(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.inner.live().await
    }

    /// Ids whose due_ms <= `now_ms`, earliest first (ties by id), at most `limit`.
    pub async fn due(&self, now_ms: u64, limit: usize) -> Result<Vec<String>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.inner.due(now_ms, limit).await
    }

    /// The earliest due_ms in the index, if any.
    pub async fn next_due(&self) -> Result<Option<u64>, StoreError> {
        self.inner.next_due().await
    }

    /// A value of the meta table.
    pub async fn meta_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.meta_get(key).await
    }

    /// One page of the meta keys under `prefix`; see [`TaskStore::meta_page`].
    pub async fn meta_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.inner
            .meta_page(prefix, after, limit.min(MAX_PAGE))
            .await
    }

    /// Every stored task (id, bytes), ordered by id. Reads the whole table: for checks and
    /// tools, not for serving requests.
    pub async fn tasks(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.inner.tasks().await
    }

    /// Number of stored tasks and of live tasks.
    pub async fn counts(&self) -> Result<(u64, u64), StoreError> {
        self.inner.counts().await
    }

    /// One page of an owner's tasks; see [`Index::owned`].
    pub async fn owned(
        &self,
        owner: &str,
        after: Option<OwnedCursor>,
        limit: usize,
    ) -> Result<Vec<OwnedRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let Some(index) = self.inner.index() else {
            return Err(StoreError::Read(Cause::message(
                "this store has no owner index",
            )));
        };
        let mut page = index.owned(owner, after, limit.min(MAX_PAGE)).await?;
        // A host's backend may not stop at the byte bound: its page is cut here, so that
        // what the caller holds on is bounded whichever backend answered.
        page.truncate(records_within_bytes(page.iter().map(|r| r.bytes.len())));
        Ok(page)
    }

    /// What an owner holds; see [`Index::usage`].
    /// A store without [`Index`] answers nothing stored: no disk quota applies to it.
    pub async fn usage(&self, owner: &str) -> Result<Usage, StoreError> {
        match self.inner.index() {
            Some(index) => index.usage(owner).await,
            None => Ok(Usage::default()),
        }
    }

    /// The usage of every owner; see [`Index::usage_by_owner`].
    pub async fn usage_by_owner(&self) -> Result<Vec<(String, Usage)>, StoreError> {
        match self.inner.index() {
            Some(index) => index.usage_by_owner().await,
            None => Ok(Vec::new()),
        }
    }

    /// [`Index::listing`].
    pub async fn listing(
        &self,
        filter: &listing::ListingFilter,
        after: Option<listing::ListingCursor>,
        limit: usize,
        budget: usize,
    ) -> Result<listing::ListingPage, StoreError> {
        self.index()?.listing(filter, after, limit, budget).await
    }

    /// [`Index::listing_counts`].
    pub async fn listing_counts(&self) -> Result<Vec<listing::ListingCount>, StoreError> {
        self.index()?.listing_counts().await
    }

    /// [`Index::throughput`].
    pub async fn throughput(
        &self,
        since_ms: u64,
    ) -> Result<Vec<listing::ThroughputBucket>, StoreError> {
        self.index()?.throughput(since_ms).await
    }

    /// The store's [`Index`]; [`StoreError::Read`] for a store without one (the console
    /// cannot list it).
    fn index(&self) -> Result<&dyn Index, StoreError> {
        self.inner.index().ok_or_else(no_listing)
    }

    /// [`TaskStore::stored_bytes`].
    pub async fn stored_bytes(&self) -> Result<Option<u64>, StoreError> {
        self.inner.stored_bytes().await
    }

    /// Counters since open.
    pub fn stats(&self) -> StoreStats {
        self.inner.stats()
    }

    /// Whether [`Store::close`](crate::Store::close) was called (on any clone).
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// `Some(detail)` once the store has halted for good (the redb backend after a failed
    /// fsync: fail-stop): it writes and reads nothing more, and every call answers
    /// [`StoreError::Halted`]. The process must restart; a server should exit non-zero (see
    /// [`Store::wait_halted`]).
    pub fn halted(&self) -> Option<String> {
        self.inner.halted()
    }

    /// Waits until the store halts and returns why (pending forever on a healthy store).
    pub async fn wait_halted(&self) -> String {
        self.inner.wait_halted().await
    }

    /// `Some(detail)` while the store is unusable after an error that retrying has not cured
    /// yet (every write tries again first).
    pub fn unavailable(&self) -> Option<String> {
        self.inner.unavailable()
    }

    /// Whether the store can serve now; see [`TaskStore::ready`] (`Err(why)` otherwise).
    pub async fn ready(&self) -> Result<(), String> {
        self.inner.ready().await
    }

    /// Finishes the queued work and releases the store (for redb: the file can be opened
    /// again in this process once this returns). Later calls on any clone return
    /// [`StoreError::Closed`]. Idempotent.
    pub async fn close(&self) {
        self.inner.close().await
    }

    /// Whether other processes write this store too (replicas: it has a
    /// [`TaskStore::cluster`](crate::TaskStore::cluster)). Then a task's latest state is the store's, not a local
    /// actor's snapshot, and writes are fenced by leases.
    pub fn is_shared(&self) -> bool {
        self.inner.cluster().is_some()
    }

    /// This process's node id on a shared store.
    pub fn node_id(&self) -> Option<&str> {
        self.inner.cluster().map(|c| c.node_id())
    }

    /// The live tasks this process runs at start: every live task ([`Store::live`]) of a
    /// store owned by one process; see [`Cluster::claim_live`] for a shared one.
    pub async fn claim_live(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        match self.inner.cluster() {
            Some(cluster) => cluster.claim_live().await,
            None => self.inner.live().await,
        }
    }

    /// Claims orphaned live tasks (always none for a store owned by one process); see
    /// [`Cluster::claim_orphans`].
    pub async fn claim_orphans(
        &self,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        match self.inner.cluster() {
            Some(cluster) => cluster.claim_orphans(after, limit).await,
            None => Ok(Vec::new()),
        }
    }

    /// Whether this process holds the lease of task `id` (always for a store owned by one
    /// process); see [`Cluster::holds`].
    pub fn holds(&self, id: &str) -> bool {
        self.inner.cluster().is_none_or(|c| c.holds(id))
    }

    /// See [`Cluster::reads_from_memory`] (`true` on a store owned by one process).
    pub fn reads_from_memory(&self, id: &str) -> bool {
        self.inner.cluster().is_none_or(|c| c.reads_from_memory(id))
    }

    /// How often the runtime claims orphans (`None`: never, a store owned by one process);
    /// see [`Cluster::claim_interval`].
    pub fn claim_interval(&self) -> Option<Duration> {
        self.inner.cluster().map(|c| c.claim_interval())
    }

    /// Takes the lease of one live task (a store owned by one process just reads it); see
    /// [`Cluster::claim_one`].
    pub async fn claim_one(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self.inner.cluster() {
            Some(cluster) => cluster.claim_one(id).await,
            None => self.inner.get(id).await,
        }
    }

    /// Whether a claim took task `id` from a lapsed lease (never on a store owned by one
    /// process: the runtime knows whether its previous run crashed); see
    /// [`Cluster::took_from_lapsed`].
    pub fn took_from_lapsed(&self, id: &str) -> bool {
        self.inner.cluster().is_some_and(|c| c.took_from_lapsed(id))
    }

    /// The capability of a store shared by replicas; see [`TaskStore::cluster`](crate::TaskStore::cluster).
    pub fn cluster(&self) -> Option<&dyn Cluster> {
        self.inner.cluster()
    }

    /// Confirms a lease without writing (at no cost on a store owned by one process); see
    /// [`Cluster::confirm_lease`].
    pub async fn confirm_lease(&self, id: &str, seq: u64) -> Result<(), StoreError> {
        match self.inner.cluster() {
            Some(cluster) => cluster.confirm_lease(id, seq).await,
            None => Ok(()),
        }
    }

    /// Compares held leases with the stored ones (nothing on a store owned by one process);
    /// see [`Cluster::reconcile`].
    pub async fn reconcile(&self) -> Result<Reconciled, StoreError> {
        match self.inner.cluster() {
            Some(cluster) => cluster.reconcile().await,
            None => Ok(Reconciled::default()),
        }
    }

    /// Wakes when a reconciliation is due early (`None` for a store owned by one process);
    /// see [`Cluster::watch_reconcile`].
    pub fn watch_reconcile(&self) -> Option<Wakeup> {
        self.inner.cluster().map(|c| c.watch_reconcile())
    }

    /// Opens a PostgreSQL store shared by replicas; see [`PostgresStore::open`].
    #[cfg(feature = "postgres")]
    pub async fn postgres(url: &str, options: PostgresOptions) -> Result<Store, StoreError> {
        Ok(Self::from_backend(Arc::new(
            PostgresStore::open(url, options).await?,
        )))
    }
}
