//! The redb backend: one file, one writer OS thread, group commit.
//!
//! It keeps opaque snapshot bytes keyed by task id and the index tables that the runtime
//! maintains through [`WriteOp::Put`]. The tables of layout 6 (today's, recorded as
//! `schema_version` in `meta`) are defined, with their key and value formats, in `schema.rs`:
//! `tasks` (id → a record header — flags, sequence number, due time, and the owner entry —
//! then the snapshot bytes), `live` (ids of non-terminal tasks, read at start to rehydrate),
//! `due` (`(due_ms, id)` for the reaper), `meta` (schema version, boot epoch, ...), `owners`
//! and `usage` (the owner index and the per-owner usage), `listing_index` and
//! `listing_counters` (the operator console's listing), `tails` (a record's last bytes kept
//! apart, below). A newer layout is refused unchanged
//! with [`StoreError::SchemaTooNew`](crate::StoreError::SchemaTooNew) by a server and by the `store …` commands.
//!
//! The sequence number (for compare-and-set) and the due time live in the record's header, so
//! a `Put` writes `tasks`, and `live` and `due` only when they change; the compare-and-set
//! reads the sequence number from the stored record's header (one lookup), and the old due
//! entry comes from the same header: a commit's cost is set by the number of tables it
//! touches.
//!
//! **Constant tails (layout 6).** A `Put` says how many of its bytes' last ones never change
//! for that id (`constant_tail`: a task's arguments, `persist::encode_parts`). When they are
//! at least `schema::TAIL_APART_MIN` (4 KiB), the record keeps its other bytes in `tasks`
//! (its header's bit 3 gives the tail's length) and the tail goes to `tails`, written by the
//! put that first stores it and never by the task's later transitions: a finished task with
//! 1 MiB of arguments writes them once, not once per transition. Every read joins them, a put
//! that keeps its bytes whole and a delete remove the tail, and the owner's usage counts it
//! (`a_constant_tail_is_written_once_and_read_back_whole`). Smaller tails stay in the record,
//! where they cost no pages of another table.
//!
//! **Owner index and usage (layout 3).** A `Put` may carry an [`OwnerEntry`](crate::OwnerEntry) (the owner's key,
//! `store::owner_key`: the tenant's length, `:`, tenant, principal; and the creation time); the
//! runtime sends it with every record. It is kept in the record header (flag bit 2), in
//! `owners` (`(owner, created_ms, id)`) and in `usage` (owner → tasks, bytes: each record counts
//! its id plus its stored value). The writer moves both in the transaction that changes the
//! record (the old value's header says whose it was), so they are exact after a crash; counters
//! kept in the commit rather than recomputed keep an open as cheap as before.
//!
//! **The listing index (layouts 4 and 5).** A `Put` may carry a listing (`listing.rs`:
//! tool, status, status message cut to 240 bytes, last update). Layout 5 keeps the entries by
//! creation time, status and tool as three key prefixes of `listing_index`, and the counters
//! per (owner, tool, status) and the one-minute throughput buckets as two key prefixes of
//! `listing_counters`, because a commit pays pages for every table it writes
//! (`schema::ListingTables`). The counters a group commit changes are kept in memory while its
//! ops apply and written once each before it commits, so every writer that opens
//! `ListingTables` or `OwnerTables` (the writer thread, the layout conversions, `store
//! migrate`/`purge`) calls their `flush` before `commit`, or the counters it changed are lost
//! (`counters_of_one_batch_are_those_of_one_commit_per_write`;
//! `the_listing_index_follows_puts_and_deletes`).
//!
//! **Older layouts** are converted by the first writable open, in the transaction that records
//! the boot epoch (a crash leaves the old layout whole; one info line with the number of
//! records; every record is written anew before the old pages are free, so a conversion needs
//! free disk of about the file's size; its time and memory at 1M records are in
//! docs/BENCHMARKS.md). Layout 1 had bare snapshots in `tasks`, the sequence number in `seq`
//! and the reverse of `due` in `due_by_id`; layout 2 had no owner index (a record's owner is
//! read from its snapshot, `store::owner_of_snapshot`; a record that does not decode stays in
//! nobody's index); layout 3 had no listing (read from each snapshot); layout 4 had the listing
//! in four tables (copied); layout 5 had no `tails` (created, nothing else changes). `store stats`, `list`, `show`, `verify` and `backup` read any layout
//! as it is, and `store purge` and a `store migrate` into an existing file convert it in their
//! own write transaction.
//!
//! **Failures.** A failed fsync halts the store for good (fail-stop, [`StoreError::Halted`](crate::StoreError::Halted)).
//! Any other failed commit (a full disk) makes the writer reopen the database
//! (`recovery.rs`), recovering the last durable commit without a second whole-file check and
//! never recreating a missing file; if that fails the store is *unavailable* and every later
//! write tries again. Opening checks every page's checksum unless told not to.
//! `RedbStore::open_with_backend` runs the store on any redb `StorageBackend` (the crash
//! simulations' disk). Client-facing errors never name the file.
//!
//! Writes go through [`RedbStore::commit`]: the ops are queued to a dedicated writer thread
//! that drains everything queued, applies all of it in one write transaction with one commit
//! (one fsync), and only then acknowledges every waiter. Reads never block tokio workers: a
//! point read of one record goes to the store's two reader threads, which serve whatever is
//! queued in one read transaction (`reader.rs`), other reads run in `spawn_blocking`; a task
//! read again is answered from the record cache without a read transaction (`cache.rs`: filled
//! by reads, emptied by the writer before it acknowledges).
//!
//! The concerns live in their own files: `schema.rs` (tables, opening and creating the file,
//! the storage backends that notice a failed fsync), `writer.rs` (the writer thread and group
//! commit), `read.rs` (read transactions), `reader.rs` (the reader threads), `cache.rs` (the
//! record cache), `recovery.rs` (reopening after an I/O error).

mod cache;
mod file;
pub(crate) mod inspect;
mod layout;
mod read;
mod reader;
mod recovery;
pub(crate) mod schema;
mod writer;

/// A redb error as a [`Cause`]. redb's errors do not chain their sources, so an I/O error
/// inside one is put underneath explicitly (a caller can reach the `std::io::Error`).
fn redb_cause(error: impl Into<redb::Error>) -> Cause {
    let error: redb::Error = error.into();
    let message = error.to_string();
    match error {
        redb::Error::Io(io) => Cause::context(message, io),
        other => Cause::of(other),
    }
}

#[cfg(test)]
mod tests;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use redb::Database;
use tokio::sync::oneshot;

use futures::future::BoxFuture;

use super::{BackendFactory, Cause, StoreError, StoreFuture, StoreOptions, StoreStats, WriteOp};
#[cfg(test)]
use super::{Durability, Expect};
use cache::RecordCache;
use file::{SyncFailure, Target, init_tables_and_boot, open_database, warn_if_readable_by_others};
#[cfg(test)]
use schema::*;
#[cfg(test)]
use writer::apply_jobs;
use writer::{Job, Writer};

/// The database as readers and the writer find it.
pub(super) enum DbState {
    Open(Arc<Database>),
    /// An I/O error poisoned the database and reopening it failed (the detail says why).
    Broken(String),
    /// A sync failed: fail-stop, never reopened (the detail says why).
    Halted(String),
    Closed,
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) commits: AtomicU64,
    pub(super) ops: AtomicU64,
}

/// The redb store. Cheap to clone; all clones share one database and one writer thread.
#[derive(Clone)]
pub struct RedbStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    boot_epoch: u64,
    /// The database for reads and writes. Readers and the writer clone the `Arc` for one
    /// transaction; the writer swaps it when it reopens the file after an I/O error, and
    /// [`RedbStore::close`] waits until it holds the last reference.
    db: Arc<RwLock<DbState>>,
    /// The writer's queue; `None` once closed. Dropping it (also when the last clone of the
    /// store is dropped) lets the writer finish what is queued and exit.
    tx: RwLock<Option<mpsc::Sender<Job>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// The reader threads' queue of point reads (`reader.rs`); they stop when the store is
    /// dropped.
    readers: mpsc::Sender<reader::PointRead>,
    /// Serialises [`RedbStore::close`] calls, so that each returns only once the file is released.
    close_lock: tokio::sync::Mutex<()>,
    counters: Arc<Counters>,
    /// Recently read snapshots (see `cache.rs`); the writer drops what it writes.
    records: Arc<RecordCache>,
    /// `Some(detail)` once the store halted after a failed fsync.
    halted: tokio::sync::watch::Receiver<Option<String>>,
    #[cfg(test)]
    test_hooks: Arc<tests_support::Hooks>,
}

impl fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.inner.path)
            .field("boot_epoch", &self.inner.boot_epoch)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl RedbStore {
    /// Opens (or creates) the store file. Blocking: call it from `spawn_blocking` or before the
    /// runtime starts (or use [`RedbStore::open_async`]).
    ///
    /// - A missing file is created atomically: initialised in `<name>.creating` beside it,
    ///   renamed into place, and the directory fsynced (redb does not), so a crash never leaves
    ///   a half-initialised store.
    /// - An existing file must be a redb database; a corrupt, truncated or foreign file gives
    ///   [`StoreError::Corrupt`] (or [`StoreError::Open`]) naming the file, and is never
    ///   recreated or overwritten. An *empty* (0 byte) file is initialised as a new database.
    /// - A file already open (also in this process) gives [`StoreError::AlreadyOpen`].
    ///
    /// Creates the tables (converting a file of table layout 1 to layout 2, logged once with
    /// the number of records), increments the boot epoch in meta and commits it durably in one
    /// transaction, then starts the writer thread.
    pub fn open(path: &Path, options: StoreOptions) -> Result<RedbStore, StoreError> {
        Self::open_inner(Target::File(path.to_path_buf()), options)
    }

    /// Like [`RedbStore::open`] on a redb [`redb::StorageBackend`] instead of a file (simulated disks,
    /// fault injection). `label` names the store in errors and logs. `factory` is called once
    /// now and again whenever the store reopens after an I/O error; each backend it returns
    /// must see the bytes the previous one left.
    pub fn open_with_backend(
        label: &Path,
        factory: BackendFactory,
        options: StoreOptions,
    ) -> Result<RedbStore, StoreError> {
        Self::open_inner(
            Target::Backend {
                label: label.to_path_buf(),
                factory,
            },
            options,
        )
    }

    /// [`RedbStore::open`] on the blocking pool.
    pub async fn open_async(path: PathBuf, options: StoreOptions) -> Result<RedbStore, StoreError> {
        Self::open_target_async(Target::File(path), options).await
    }

    /// [`RedbStore::open_with_backend`] on the blocking pool.
    pub async fn open_with_backend_async(
        label: PathBuf,
        factory: BackendFactory,
        options: StoreOptions,
    ) -> Result<RedbStore, StoreError> {
        Self::open_target_async(Target::Backend { label, factory }, options).await
    }

    async fn open_target_async(
        target: Target,
        options: StoreOptions,
    ) -> Result<RedbStore, StoreError> {
        let path = target.path().to_path_buf();
        match tokio::task::spawn_blocking(move || RedbStore::open_inner(target, options)).await {
            Ok(result) => result,
            Err(e) => Err(StoreError::Open {
                path,
                detail: format!("the open task failed: {e}"),
            }),
        }
    }

    fn open_inner(target: Target, options: StoreOptions) -> Result<RedbStore, StoreError> {
        let path = target.path().to_path_buf();
        let open_err = |detail: String| StoreError::Open {
            path: path.clone(),
            detail,
        };
        if let Target::File(file) = &target {
            warn_if_readable_by_others(file);
        }
        let sync_failure = Arc::new(SyncFailure::default());
        let db = open_database(
            &target,
            options.verify_on_open,
            options.cache_size,
            true,
            &sync_failure,
        )?;
        let boot_epoch =
            init_tables_and_boot(&db, &path, true, options.quick_repair, &*options.indexer)?;
        if let Some(detail) = sync_failure.get() {
            return Err(StoreError::Halted { path, detail });
        }

        let db = Arc::new(RwLock::new(DbState::Open(Arc::new(db))));
        let counters = Arc::new(Counters::default());
        let records = Arc::new(RecordCache::new(options.record_cache_size));
        let (halt_tx, halted) = tokio::sync::watch::channel(None);
        let (tx, rx) = mpsc::channel::<Job>();
        #[cfg(test)]
        let test_hooks = Arc::new(tests_support::Hooks::default());
        let writer = Writer {
            db: Arc::clone(&db),
            target,
            rx,
            durability: options.durability,
            quick_repair: options.quick_repair,
            max_batch_ops: options.max_batch_ops.max(1),
            verify_on_open: options.verify_on_open,
            cache_size: options.cache_size,
            reopen_after_sync_failure: options.unsafe_reopen_after_sync_failure,
            sync_failure,
            halt: halt_tx,
            counters: Arc::clone(&counters),
            records: Arc::clone(&records),
            path: path.clone(),
            #[cfg(test)]
            hooks: Arc::clone(&test_hooks),
        };
        let readers = reader::start(Arc::clone(&records), path.clone())
            .map_err(|e| open_err(format!("cannot start the reader threads: {e}")))?;
        let handle = std::thread::Builder::new()
            .name("mcp-tasks-store-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| open_err(format!("cannot start the writer thread: {e}")))?;

        tracing::info!(path = %path.display(), boot_epoch, "task store opened");
        Ok(RedbStore {
            inner: Arc::new(Inner {
                path,
                boot_epoch,
                db,
                tx: RwLock::new(Some(tx)),
                writer: Mutex::new(Some(handle)),
                readers,
                close_lock: tokio::sync::Mutex::new(()),
                counters,
                records,
                halted,
                #[cfg(test)]
                test_hooks,
            }),
        })
    }

    /// The file of this store.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The boot epoch this open recorded (1 for a new file, +1 per open).
    pub fn boot_epoch(&self) -> u64 {
        self.inner.boot_epoch
    }

    /// Commits `ops` durably (group commit) and returns once the transaction holding them has
    /// committed. The writer drains every queued job (whole jobs, up to `max_batch_ops` ops per
    /// transaction), applies them in one write transaction and one commit, then acks each waiter.
    ///
    /// On failure nothing of this call is stored. A failed commit (e.g. I/O) gives every job of
    /// its batch the same [`StoreError::Commit`]; the writer stays up for later jobs, but note
    /// that redb answers `PreviousIo` to every write after an I/O error until the file is
    /// reopened. A job whose ops fail to *apply* (e.g. a value too large) fails alone: the rest of
    /// its batch is retried job by job.
    pub async fn commit(&self, ops: Vec<WriteOp>) -> Result<(), StoreError> {
        if ops.is_empty() {
            return Ok(());
        }
        self.send(ops).await
    }

    /// Queues `ops` for the writer and waits for its answer. Empty `ops` only ask the writer to
    /// reopen the database if an I/O error broke it.
    async fn send(&self, ops: Vec<WriteOp>) -> Result<(), StoreError> {
        let (ack, rx) = oneshot::channel();
        {
            let tx = self.inner.tx.read().unwrap_or_else(|e| e.into_inner());
            let Some(tx) = tx.as_ref() else {
                return Err(StoreError::Closed);
            };
            tx.send(Job { ops, ack }).map_err(|_| StoreError::Closed)?;
        }
        #[cfg(test)]
        self.inner
            .test_hooks
            .enqueued
            .fetch_add(1, Ordering::SeqCst);
        match rx.await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Commit(Cause::message(
                "the writer thread stopped before acknowledging the commit",
            ))),
        }
    }

    /// Counters since open.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            commits: self.inner.counters.commits.load(Ordering::Relaxed),
            ops: self.inner.counters.ops.load(Ordering::Relaxed),
            cached_reads: self.inner.records.hits(),
        }
    }

    /// Whether [`RedbStore::close`] was called (on any clone).
    pub fn is_closed(&self) -> bool {
        matches!(
            *self.inner.db.read().unwrap_or_else(|e| e.into_inner()),
            DbState::Closed
        )
    }

    /// `Some(detail)` once the store has halted after a failed fsync (fail-stop): it writes
    /// and reads nothing more, and every call answers [`StoreError::Halted`]. The process
    /// must restart; a server should exit non-zero (see [`RedbStore::wait_halted`]).
    pub fn halted(&self) -> Option<String> {
        self.inner.halted.borrow().clone()
    }

    /// Waits until the store halts after a failed fsync and returns why (pending forever on a
    /// healthy store).
    pub async fn wait_halted(&self) -> String {
        let mut rx = self.inner.halted.clone();
        loop {
            if let Some(detail) = rx.borrow_and_update().clone() {
                return detail;
            }
            if rx.changed().await.is_err() {
                // The writer is gone (closed) without halting.
                std::future::pending::<()>().await;
            }
        }
    }

    /// `Some(detail)` while the store is unusable after an I/O error that reopening did not
    /// cure (every write tries again first).
    pub fn unavailable(&self) -> Option<String> {
        match &*self.inner.db.read().unwrap_or_else(|e| e.into_inner()) {
            DbState::Broken(detail) => Some(detail.clone()),
            _ => None,
        }
    }

    /// Stops the writer thread after it has finished the queued work, waits for in-flight reads
    /// to release the database, and closes it, so the same file can be opened again in this
    /// process once this returns. Later calls on any clone return [`StoreError::Closed`].
    /// Idempotent; concurrent calls all return after the file is released.
    pub async fn close(&self) {
        let _serial = self.inner.close_lock.lock().await;
        let tx = self
            .inner
            .tx
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let writer = self
            .inner
            .writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if tx.is_none() && writer.is_none() && self.is_closed() {
            return;
        }
        drop(tx);
        let path = self.inner.path.clone();
        let slot = Arc::clone(&self.inner.db);
        let work = move || {
            if let Some(writer) = writer
                && writer.join().is_err()
            {
                tracing::error!(path = %path.display(), "the store writer thread panicked");
            }
            // Taken only once the writer is gone: it may swap the database while it reopens.
            let db = std::mem::replace(
                &mut *slot.write().unwrap_or_else(|e| e.into_inner()),
                DbState::Closed,
            );
            if let DbState::Open(mut db) = db {
                // Readers hold clones only for the length of one read transaction.
                let db = loop {
                    match Arc::try_unwrap(db) {
                        Ok(db) => break db,
                        Err(shared) => {
                            db = shared;
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                };
                if let Err(e) = db.close() {
                    tracing::error!(path = %path.display(), error = %e, "closing the task store failed");
                }
            }
            tracing::info!(path = %path.display(), "task store closed");
        };
        if let Err(e) = tokio::task::spawn_blocking(work).await {
            tracing::error!(error = %e, "the store close task failed");
        }
    }
}

pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_owned()
    }
}

impl crate::TaskStore for RedbStore {
    fn inspector(&self) -> Option<&dyn crate::inspect::Inspector> {
        Some(self)
    }

    fn describe(&self) -> String {
        self.inner.path.display().to_string()
    }
    fn boot_epoch(&self) -> u64 {
        RedbStore::boot_epoch(self)
    }
    fn commit(&self, ops: Vec<WriteOp>) -> StoreFuture<'_, ()> {
        Box::pin(RedbStore::commit(self, ops))
    }
    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Vec<u8>>> {
        Box::pin(RedbStore::get(self, id))
    }
    fn get_many(&self, ids: Vec<String>) -> StoreFuture<'_, Vec<Option<Vec<u8>>>> {
        Box::pin(RedbStore::get_many(self, ids))
    }
    fn live(&self) -> StoreFuture<'_, Vec<(String, Vec<u8>)>> {
        Box::pin(RedbStore::live(self))
    }
    fn due(&self, now_ms: u64, limit: usize) -> StoreFuture<'_, Vec<String>> {
        Box::pin(RedbStore::due(self, now_ms, limit))
    }
    fn next_due(&self) -> StoreFuture<'_, Option<u64>> {
        Box::pin(RedbStore::next_due(self))
    }
    fn meta_get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Vec<u8>>> {
        Box::pin(RedbStore::meta_get(self, key))
    }
    fn meta_page<'a>(
        &'a self,
        prefix: &'a str,
        after: Option<&'a str>,
        limit: usize,
    ) -> StoreFuture<'a, Vec<(String, Vec<u8>)>> {
        Box::pin(RedbStore::meta_page(self, prefix, after, limit))
    }
    fn tasks(&self) -> StoreFuture<'_, Vec<(String, Vec<u8>)>> {
        Box::pin(RedbStore::tasks(self))
    }
    fn counts(&self) -> StoreFuture<'_, (u64, u64)> {
        Box::pin(RedbStore::counts(self))
    }
    fn stored_bytes(&self) -> StoreFuture<'_, Option<u64>> {
        Box::pin(RedbStore::stored_bytes(self))
    }
    fn stats(&self) -> StoreStats {
        RedbStore::stats(self)
    }
    fn is_closed(&self) -> bool {
        RedbStore::is_closed(self)
    }
    fn halted(&self) -> Option<String> {
        RedbStore::halted(self)
    }
    fn wait_halted(&self) -> BoxFuture<'_, String> {
        Box::pin(RedbStore::wait_halted(self))
    }
    fn unavailable(&self) -> Option<String> {
        RedbStore::unavailable(self)
    }
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(RedbStore::close(self))
    }

    fn index(&self) -> Option<&dyn crate::Index> {
        Some(self)
    }
}

impl crate::Index for RedbStore {
    fn owned<'a>(
        &'a self,
        owner: &'a str,
        after: Option<crate::OwnedCursor>,
        limit: usize,
    ) -> StoreFuture<'a, Vec<crate::OwnedRecord>> {
        Box::pin(RedbStore::owned(self, owner, after, limit))
    }

    fn usage<'a>(&'a self, owner: &'a str) -> StoreFuture<'a, crate::Usage> {
        Box::pin(RedbStore::usage(self, owner))
    }

    fn usage_by_owner(&self) -> StoreFuture<'_, Vec<(String, crate::Usage)>> {
        Box::pin(RedbStore::usage_by_owner(self))
    }

    fn listing<'a>(
        &'a self,
        filter: &'a crate::listing::ListingFilter,
        after: Option<crate::listing::ListingCursor>,
        limit: usize,
        budget: usize,
    ) -> StoreFuture<'a, crate::listing::ListingPage> {
        Box::pin(RedbStore::listing(self, filter, after, limit, budget))
    }

    fn listing_counts(&self) -> StoreFuture<'_, Vec<crate::listing::ListingCount>> {
        Box::pin(RedbStore::listing_counts(self))
    }

    fn throughput(&self, since_ms: u64) -> StoreFuture<'_, Vec<crate::listing::ThroughputBucket>> {
        Box::pin(RedbStore::throughput(self, since_ms))
    }
}

#[cfg(test)]
mod tests_support {
    use std::sync::Mutex;
    use std::sync::atomic::AtomicU64;

    /// Test-only hooks to make group commit deterministic.
    #[derive(Default)]
    pub(super) struct Hooks {
        /// The writer takes (and releases) this lock after receiving the first job of a batch
        /// and before draining the queue; a test holding it lets jobs pile up.
        pub gate: Mutex<()>,
        /// Jobs sent to the writer.
        pub enqueued: AtomicU64,
    }
}
