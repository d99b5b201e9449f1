//! The redb store: one file, one writer OS thread, group commit.
//!
//! The store knows nothing about tasks. It keeps opaque snapshot bytes keyed by task id and
//! three index tables that the runtime maintains through [`WriteOp::Put`]:
//!
//! | table       | key              | value    | purpose                                        |
//! |-------------|------------------|----------|------------------------------------------------|
//! | `tasks`     | id               | bytes    | the latest snapshot of every stored task       |
//! | `live`      | id               | `()`     | non-terminal tasks, read at start to rehydrate |
//! | `due`       | `(due_ms, id)`   | `()`     | when the reaper must next look at a task       |
//! | `due_by_id` | id               | `due_ms` | reverse of `due`, so a re-put replaces it      |
//! | `seq`       | id               | u64      | version of the snapshot, for compare-and-set   |
//! | `meta`      | key              | bytes    | schema version, boot epoch, ...                |
//!
//! Writes go through [`Store::commit`]: the ops are queued to a dedicated writer thread that
//! drains everything queued, applies all of it in one write transaction with one commit (one
//! fsync), and only then acknowledges every waiter. Reads run in `spawn_blocking` so they never
//! block tokio workers.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redb::{
    Database, DatabaseError, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    StorageBackend, StorageError, TableDefinition, WriteTransaction,
};
use tokio::sync::oneshot;

#[cfg(test)]
mod tests;

/// id → snapshot bytes.
const TASKS: TableDefinition<&str, &[u8]> = TableDefinition::new("tasks");
/// ids of non-terminal tasks.
const LIVE: TableDefinition<&str, ()> = TableDefinition::new("live");
/// (due_ms, id) for the expiry reaper.
const DUE: TableDefinition<(u64, &str), ()> = TableDefinition::new("due");
/// id → due_ms, the reverse of [`DUE`].
const DUE_BY_ID: TableDefinition<&str, u64> = TableDefinition::new("due_by_id");
/// id → sequence number of the stored snapshot, for conditional writes ([`Expect`]).
const SEQ: TableDefinition<&str, u64> = TableDefinition::new("seq");
/// Free-form metadata.
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// The meta key of the boot epoch (u64, little endian), incremented by every [`Store::open`].
pub const META_BOOT_EPOCH: &str = "boot_epoch";

/// Errors of the store boundary.
///
/// `Clone` because one failed group commit is reported to every waiter of that batch.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store was closed with [`Store::close`].
    #[error("the task store is closed")]
    Closed,
    /// The file is already open, in this process or in another one.
    #[error(
        "the task store {} is already open (by this process or another one); only one may open it at a time",
        path.display()
    )]
    AlreadyOpen { path: PathBuf },
    /// The file could not be opened or initialised (permissions, missing directory, I/O, ...).
    #[error("cannot open the task store {}: {detail}", path.display())]
    Open { path: PathBuf, detail: String },
    /// The file is not a redb database or is damaged. It is left untouched.
    #[error(
        "the task store {} is corrupt or not a redb database ({detail}); the file was left untouched",
        path.display()
    )]
    Corrupt { path: PathBuf, detail: String },
    /// A write transaction failed; none of the ops of that batch (or job) are stored.
    #[error("committing to the task store failed: {0}")]
    Commit(String),
    /// The store stopped for good after a failed fsync (fail-stop): nothing is written or read
    /// any more, because the OS may have dropped the writes of the failed sync while still
    /// showing them to readers. Restart the process (see [`Store::halted`]).
    #[error(
        "the task store {} stopped after a failed fsync and accepts no more writes ({detail}); restart the process",
        path.display()
    )]
    Halted { path: PathBuf, detail: String },
    /// A conditional write found another sequence number than the one it was based on: some
    /// other writer changed the task first. Nothing of the job is stored.
    #[error("task {id} changed concurrently: expected sequence {expected:?}, found {found:?}")]
    Conflict {
        id: String,
        expected: Option<u64>,
        found: Option<u64>,
    },
    /// A read transaction failed.
    #[error("reading the task store failed: {0}")]
    Read(String),
    /// An I/O error made the store unusable and reopening it failed; every write tries to reopen
    /// it again first. Nothing acknowledged before the error is lost.
    #[error(
        "the task store {} is unavailable after an I/O error and could not be reopened: {detail}",
        path.display()
    )]
    Unavailable { path: PathBuf, detail: String },
}

/// Makes a fresh [`StorageBackend`] over the same bytes, for [`Store::open_with_backend`]. Called
/// once at open and again whenever the store reopens after an I/O error (redb answers
/// `PreviousIo` to everything until then).
pub type BackendFactory = Arc<dyn Fn() -> std::io::Result<Box<dyn StorageBackend>> + Send + Sync>;

/// Where the bytes of a store live.
#[derive(Clone)]
enum Target {
    File(PathBuf),
    Backend {
        label: PathBuf,
        factory: BackendFactory,
    },
}

impl Target {
    fn path(&self) -> &Path {
        match self {
            Target::File(p) => p,
            Target::Backend { label, .. } => label,
        }
    }
}

/// A `Box<dyn StorageBackend>` as a `StorageBackend` (redb takes `impl StorageBackend`).
#[derive(Debug)]
struct BoxedBackend(Box<dyn StorageBackend>);

impl StorageBackend for BoxedBackend {
    fn len(&self) -> std::io::Result<u64> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.0.write(offset, data)
    }
    fn close(&self) -> std::io::Result<()> {
        self.0.close()
    }
    fn try_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.0.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.0.try_lock_shared_range(start, end)
    }
    fn lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.0.lock_range(start, end)
    }
    fn lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.0.lock_shared_range(start, end)
    }
    fn unlock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.0.unlock_range(start, end)
    }
    fn query_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.0.query_lock_range(start, end)
    }
}

/// Remembers the first failed sync of the store's backends (shared by every reopen).
#[derive(Debug, Default)]
struct SyncFailure(Mutex<Option<String>>);

impl SyncFailure {
    fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A backend that records failed syncs in a [`SyncFailure`]. redb reports a failed fsync like
/// any other I/O error of a commit; the store must tell them apart, because after a failed
/// fsync Linux may have dropped the written pages (marked clean, never written) while still
/// serving them from the page cache: reopening and going on would build on bytes that are not
/// on disk. A failed *write* (disk full) is safe to recover from by reopening.
#[derive(Debug)]
struct SyncWatch {
    inner: BoxedBackend,
    failure: Arc<SyncFailure>,
}

impl StorageBackend for SyncWatch {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        let result = self.inner.sync_data();
        if let Err(e) = &result {
            let mut slot = self.failure.0.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                *slot = Some(format!("fsync failed: {e}"));
            }
        }
        result
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.inner.write(offset, data)
    }
    fn close(&self) -> std::io::Result<()> {
        self.inner.close()
    }
    fn try_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.inner.unlock_range(start, end)
    }
    fn query_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

/// The database as readers and the writer find it.
enum DbState {
    Open(Arc<Database>),
    /// An I/O error poisoned the database and reopening it failed (the detail says why).
    Broken(String),
    /// A sync failed: fail-stop, never reopened (the detail says why).
    Halted(String),
    Closed,
}

/// How hard a commit waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Every group commit is fsynced before it is acknowledged (the default).
    #[default]
    Immediate,
    /// Commits are not fsynced (redb `Durability::None`); a crash may lose them. Tests and
    /// benchmarks only. [`Store::close`] still makes them durable.
    None,
}

/// Options of [`Store::open`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// See [`Durability`]; default [`Durability::Immediate`].
    pub durability: Durability,
    /// Upper bound of ops per write transaction; a single larger job still commits alone.
    /// Default 4096.
    pub max_batch_ops: usize,
    /// Verify the checksum of every page when the file is opened (redb's integrity check), so
    /// that a file damaged outside redb is refused with [`StoreError::Corrupt`] instead of
    /// being trusted (a plain open of a cleanly closed file reads damaged bytes as data).
    /// Costs one read of the whole file per open. Default `true`.
    pub verify_on_open: bool,
    /// **Unsafe; for the crash suite only.** After a failed fsync, reopen the file and go on
    /// instead of stopping (the behaviour this crate had before it became fail-stop). On Linux
    /// this can acknowledge commits that build on pages that never reach the disk; the crash
    /// suite keeps it to show that its checker catches exactly that. Default `false`.
    #[doc(hidden)]
    pub unsafe_reopen_after_sync_failure: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            durability: Durability::Immediate,
            max_batch_ops: 4096,
            verify_on_open: true,
            unsafe_reopen_after_sync_failure: false,
        }
    }
}

/// The precondition of a [`WriteOp::Put`] (compare-and-set on the stored sequence number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// No check (meta-like records, tests).
    Any,
    /// The id must not be stored yet (a task's creation).
    Absent,
    /// The stored record must be at this sequence number: the writer read that version and
    /// computed its write from it. A record stored without a sequence number (a file written
    /// before the `seq` table existed) passes once; its write records the number.
    Seq(u64),
}

/// One write of a [`Store::commit`] batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    /// Insert or replace the snapshot of task `id`. `live` = the task is non-terminal (kept in
    /// the live index for rehydration, removed from it when false). `due_ms` = when the expiry
    /// reaper must next look at this task (None = never); replaces any earlier due entry of
    /// this id.
    ///
    /// `seq` is the writer's version of the record (a task's sequence number), kept in the
    /// `seq` table; `expect` is checked against the stored version inside the write
    /// transaction (compare-and-set): a job whose expectation fails is not applied and gets
    /// [`StoreError::Conflict`], while the rest of its batch commits.
    Put {
        id: String,
        bytes: Vec<u8>,
        live: bool,
        due_ms: Option<u64>,
        seq: Option<u64>,
        expect: Expect,
    },
    /// Remove the task and all its index entries.
    Delete { id: String },
    /// Replace the due entry of a stored task (None = never due) without touching its bytes.
    /// The reaper uses it to quarantine a record it cannot decode.
    SetDue { id: String, due_ms: Option<u64> },
    /// Set a key in the meta table.
    PutMeta { key: String, value: Vec<u8> },
}

/// Counters since open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Successful write transactions of the writer thread (the boot-epoch commit of
    /// [`Store::open`] is not counted).
    pub commits: u64,
    /// Ops in those transactions.
    pub ops: u64,
}

#[derive(Debug, Default)]
struct Counters {
    commits: AtomicU64,
    ops: AtomicU64,
}

/// One [`Store::commit`] call waiting on the writer.
struct Job {
    ops: Vec<WriteOp>,
    ack: oneshot::Sender<Result<(), StoreError>>,
}

/// The durable store. Cheap to clone; all clones share one database and one writer thread.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    boot_epoch: u64,
    /// The database for reads and writes. Readers and the writer clone the `Arc` for one
    /// transaction; the writer swaps it when it reopens the file after an I/O error, and
    /// [`Store::close`] waits until it holds the last reference.
    db: Arc<RwLock<DbState>>,
    /// The writer's queue; `None` once closed. Dropping it (also when the last clone of the
    /// store is dropped) lets the writer finish what is queued and exit.
    tx: RwLock<Option<mpsc::Sender<Job>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Serialises [`Store::close`] calls, so that each returns only once the file is released.
    close_lock: tokio::sync::Mutex<()>,
    counters: Arc<Counters>,
    /// `Some(detail)` once the store halted after a failed fsync.
    halted: tokio::sync::watch::Receiver<Option<String>>,
    #[cfg(test)]
    test_hooks: Arc<tests_support::Hooks>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.inner.path)
            .field("boot_epoch", &self.inner.boot_epoch)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (or creates) the store file. Blocking: call it from `spawn_blocking` or before the
    /// runtime starts (or use [`Store::open_async`]).
    ///
    /// - A missing file is created atomically: initialised in `<name>.creating` beside it,
    ///   renamed into place, and the directory fsynced (redb does not), so a crash never leaves
    ///   a half-initialised store.
    /// - An existing file must be a redb database; a corrupt, truncated or foreign file gives
    ///   [`StoreError::Corrupt`] (or [`StoreError::Open`]) naming the file, and is never
    ///   recreated or overwritten. An *empty* (0 byte) file is initialised as a new database.
    /// - A file already open (also in this process) gives [`StoreError::AlreadyOpen`].
    ///
    /// Creates the tables, increments the boot epoch in meta and commits it durably, then starts
    /// the writer thread.
    pub fn open(path: &Path, options: StoreOptions) -> Result<Store, StoreError> {
        Self::open_inner(Target::File(path.to_path_buf()), options)
    }

    /// Like [`Store::open`] on a redb [`StorageBackend`] instead of a file (simulated disks,
    /// fault injection). `label` names the store in errors and logs. `factory` is called once
    /// now and again whenever the store reopens after an I/O error; each backend it returns
    /// must see the bytes the previous one left.
    pub fn open_with_backend(
        label: &Path,
        factory: BackendFactory,
        options: StoreOptions,
    ) -> Result<Store, StoreError> {
        Self::open_inner(
            Target::Backend {
                label: label.to_path_buf(),
                factory,
            },
            options,
        )
    }

    /// [`Store::open`] on the blocking pool.
    pub async fn open_async(path: PathBuf, options: StoreOptions) -> Result<Store, StoreError> {
        Self::open_target_async(Target::File(path), options).await
    }

    /// [`Store::open_with_backend`] on the blocking pool.
    pub async fn open_with_backend_async(
        label: PathBuf,
        factory: BackendFactory,
        options: StoreOptions,
    ) -> Result<Store, StoreError> {
        Self::open_target_async(Target::Backend { label, factory }, options).await
    }

    async fn open_target_async(target: Target, options: StoreOptions) -> Result<Store, StoreError> {
        let path = target.path().to_path_buf();
        match tokio::task::spawn_blocking(move || Store::open_inner(target, options)).await {
            Ok(result) => result,
            Err(e) => Err(StoreError::Open {
                path,
                detail: format!("the open task failed: {e}"),
            }),
        }
    }

    fn open_inner(target: Target, options: StoreOptions) -> Result<Store, StoreError> {
        let path = target.path().to_path_buf();
        let open_err = |detail: String| StoreError::Open {
            path: path.clone(),
            detail,
        };
        if let Target::File(file) = &target {
            warn_if_readable_by_others(file);
        }
        let sync_failure = Arc::new(SyncFailure::default());
        let db = open_database(&target, options.verify_on_open, true, &sync_failure)?;
        let boot_epoch = init_tables_and_boot(&db, &path, true)?;
        if let Some(detail) = sync_failure.get() {
            return Err(StoreError::Halted { path, detail });
        }

        let db = Arc::new(RwLock::new(DbState::Open(Arc::new(db))));
        let counters = Arc::new(Counters::default());
        let (halt_tx, halted) = tokio::sync::watch::channel(None);
        let (tx, rx) = mpsc::channel::<Job>();
        #[cfg(test)]
        let test_hooks = Arc::new(tests_support::Hooks::default());
        let writer = Writer {
            db: Arc::clone(&db),
            target,
            rx,
            durability: options.durability,
            max_batch_ops: options.max_batch_ops.max(1),
            verify_on_open: options.verify_on_open,
            reopen_after_sync_failure: options.unsafe_reopen_after_sync_failure,
            sync_failure,
            halt: halt_tx,
            counters: Arc::clone(&counters),
            path: path.clone(),
            #[cfg(test)]
            hooks: Arc::clone(&test_hooks),
        };
        let handle = std::thread::Builder::new()
            .name("mcp-tasks-store-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| open_err(format!("cannot start the writer thread: {e}")))?;

        tracing::info!(path = %path.display(), boot_epoch, "task store opened");
        Ok(Store {
            inner: Arc::new(Inner {
                path,
                boot_epoch,
                db,
                tx: RwLock::new(Some(tx)),
                writer: Mutex::new(Some(handle)),
                close_lock: tokio::sync::Mutex::new(()),
                counters,
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
            Err(_) => Err(StoreError::Commit(
                "the writer thread stopped before acknowledging the commit".into(),
            )),
        }
    }

    /// The snapshot bytes of task `id`.
    pub async fn get(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let id = id.to_owned();
        self.read(move |txn| {
            let tasks = txn.open_table(TASKS)?;
            Ok(tasks.get(id.as_str())?.map(|v| v.value().to_vec()))
        })
        .await
    }

    /// The snapshot bytes of each of `ids`, in one read transaction.
    pub async fn get_many(&self, ids: Vec<String>) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.read(move |txn| {
            let tasks = txn.open_table(TASKS)?;
            ids.iter()
                .map(|id| Ok(tasks.get(id.as_str())?.map(|v| v.value().to_vec())))
                .collect()
        })
        .await
    }

    /// All (id, bytes) of live tasks, ordered by id, via the live index only.
    pub async fn live(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.read(|txn| {
            let live = txn.open_table(LIVE)?;
            let tasks = txn.open_table(TASKS)?;
            let mut out = Vec::with_capacity(usize::try_from(live.len()?).unwrap_or(0));
            for entry in live.iter()? {
                let (id, _) = entry?;
                let id = id.value();
                match tasks.get(id)? {
                    Some(bytes) => out.push((id.to_owned(), bytes.value().to_vec())),
                    None => tracing::warn!(id, "live index names a task that is not stored"),
                }
            }
            Ok(out)
        })
        .await
    }

    /// Ids whose due_ms <= `now_ms`, earliest first (ties by id), at most `limit`.
    pub async fn due(&self, now_ms: u64, limit: usize) -> Result<Vec<String>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.read(move |txn| {
            let due = txn.open_table(DUE)?;
            let mut out = Vec::new();
            for entry in due.iter()? {
                let (key, _) = entry?;
                let (at, id) = key.value();
                if at > now_ms || out.len() >= limit {
                    break;
                }
                out.push(id.to_owned());
            }
            Ok(out)
        })
        .await
    }

    /// The earliest due_ms in the index, if any.
    pub async fn next_due(&self) -> Result<Option<u64>, StoreError> {
        self.read(|txn| {
            let due = txn.open_table(DUE)?;
            Ok(due.first()?.map(|(k, _)| k.value().0))
        })
        .await
    }

    /// A value of the meta table.
    pub async fn meta_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = key.to_owned();
        self.read(move |txn| {
            let meta = txn.open_table(META)?;
            Ok(meta.get(key.as_str())?.map(|v| v.value().to_vec()))
        })
        .await
    }

    /// Every stored task (id, bytes), ordered by id. Reads the whole table: for checks and
    /// tools, not for serving requests.
    pub async fn tasks(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.read(|txn| {
            let tasks = txn.open_table(TASKS)?;
            let mut out = Vec::with_capacity(usize::try_from(tasks.len()?).unwrap_or(0));
            for entry in tasks.iter()? {
                let (id, bytes) = entry?;
                out.push((id.value().to_owned(), bytes.value().to_vec()));
            }
            Ok(out)
        })
        .await
    }

    /// Number of stored tasks and of live tasks.
    pub async fn counts(&self) -> Result<(u64, u64), StoreError> {
        self.read(|txn| {
            let tasks = txn.open_table(TASKS)?;
            let live = txn.open_table(LIVE)?;
            Ok((tasks.len()?, live.len()?))
        })
        .await
    }

    /// Counters since open.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            commits: self.inner.counters.commits.load(Ordering::Relaxed),
            ops: self.inner.counters.ops.load(Ordering::Relaxed),
        }
    }

    /// Whether [`Store::close`] was called (on any clone).
    pub fn is_closed(&self) -> bool {
        matches!(
            *self.inner.db.read().unwrap_or_else(|e| e.into_inner()),
            DbState::Closed
        )
    }

    /// `Some(detail)` once the store has halted after a failed fsync (fail-stop): it writes
    /// and reads nothing more, and every call answers [`StoreError::Halted`]. The process
    /// must restart; a server should exit non-zero (see [`Store::wait_halted`]).
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

    /// Runs a read transaction on the blocking pool.
    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&redb::ReadTransaction) -> Result<T, redb::Error> + Send + 'static,
    {
        let mut nudged = false;
        let db = loop {
            let broken = match &*self.inner.db.read().unwrap_or_else(|e| e.into_inner()) {
                DbState::Open(db) => break Arc::clone(db),
                DbState::Closed => return Err(StoreError::Closed),
                // What the page cache shows may not be on disk: reads stop too.
                DbState::Halted(detail) => {
                    return Err(StoreError::Halted {
                        path: self.inner.path.clone(),
                        detail: detail.clone(),
                    });
                }
                DbState::Broken(detail) => detail.clone(),
            };
            if nudged {
                return Err(StoreError::Unavailable {
                    path: self.inner.path.clone(),
                    detail: broken,
                });
            }
            // Only the writer reopens: ask it to try now (reads must not wait for a write).
            nudged = true;
            self.send(Vec::new()).await.ok();
        };
        let path = self.inner.path.clone();
        let task = tokio::task::spawn_blocking(move || {
            let run = || -> Result<T, redb::Error> {
                let txn = db.begin_read()?;
                f(&txn)
            };
            match catch_unwind(AssertUnwindSafe(run)) {
                Ok(result) => result.map_err(|e| {
                    tracing::error!(path = %path.display(), error = %e, "reading the task store failed");
                    StoreError::Read(e.to_string())
                }),
                Err(panic) => {
                    let msg = panic_message(&panic);
                    tracing::error!(path = %path.display(), panic = %msg, "redb panicked in a read");
                    Err(StoreError::Read(format!("redb panicked: {msg}")))
                }
            }
        });
        match task.await {
            Ok(result) => result,
            Err(e) => Err(StoreError::Read(format!("the read task failed: {e}"))),
        }
    }
}

/// The single writer: owns all write transactions, and reopens the database after an I/O error.
struct Writer {
    db: Arc<RwLock<DbState>>,
    target: Target,
    rx: mpsc::Receiver<Job>,
    durability: Durability,
    max_batch_ops: usize,
    verify_on_open: bool,
    /// See [`StoreOptions::unsafe_reopen_after_sync_failure`].
    reopen_after_sync_failure: bool,
    sync_failure: Arc<SyncFailure>,
    halt: tokio::sync::watch::Sender<Option<String>>,
    counters: Arc<Counters>,
    path: PathBuf,
    #[cfg(test)]
    hooks: Arc<tests_support::Hooks>,
}

impl Writer {
    fn run(self) {
        let mut pending: Option<Job> = None;
        loop {
            let first = match pending.take() {
                Some(job) => job,
                // Disconnected: every sender is gone (closed, or last Store dropped) and the
                // queue is drained.
                None => match self.rx.recv() {
                    Ok(job) => job,
                    Err(_) => break,
                },
            };
            #[cfg(test)]
            drop(self.hooks.gate.lock().unwrap_or_else(|e| e.into_inner()));

            let mut ops = first.ops.len();
            let mut batch = vec![first];
            while ops < self.max_batch_ops {
                match self.rx.try_recv() {
                    Ok(job) if ops + job.ops.len() > self.max_batch_ops => {
                        pending = Some(job);
                        break;
                    }
                    Ok(job) => {
                        ops += job.ops.len();
                        batch.push(job);
                    }
                    Err(_) => break,
                }
            }
            self.commit_batch(batch);
        }
        tracing::debug!(path = %self.path.display(), "store writer stopped");
    }

    /// The database to write to; after an I/O error that the last reopen did not cure, tries to
    /// reopen it first.
    fn database(&self) -> Result<Arc<Database>, StoreError> {
        let detail = match &*self.db.read().unwrap_or_else(|e| e.into_inner()) {
            DbState::Open(db) => return Ok(Arc::clone(db)),
            DbState::Closed => return Err(StoreError::Closed),
            DbState::Halted(detail) => {
                return Err(StoreError::Halted {
                    path: self.path.clone(),
                    detail: detail.clone(),
                });
            }
            DbState::Broken(detail) => detail.clone(),
        };
        tracing::info!(path = %self.path.display(), previous = %detail, "retrying to reopen the task store");
        self.reopen();
        match &*self.db.read().unwrap_or_else(|e| e.into_inner()) {
            DbState::Open(db) => Ok(Arc::clone(db)),
            DbState::Closed => Err(StoreError::Closed),
            DbState::Halted(detail) => Err(StoreError::Halted {
                path: self.path.clone(),
                detail: detail.clone(),
            }),
            DbState::Broken(detail) => Err(StoreError::Unavailable {
                path: self.path.clone(),
                detail: detail.clone(),
            }),
        }
    }

    /// Applies `batch` in one transaction and acks every job.
    fn commit_batch(&self, batch: Vec<Job>) {
        let (opss, acks): (Vec<Vec<WriteOp>>, Vec<_>) =
            batch.into_iter().map(|j| (j.ops, j.ack)).unzip();
        let (results, poisoned) = match self.database() {
            // Only reopen requests (see `Store::send`): nothing to write.
            Ok(_) if opss.iter().all(Vec::is_empty) => (vec![Ok(()); opss.len()], false),
            Ok(db) => apply_jobs_inner(&db, &self.path, self.durability, &opss, &self.counters),
            Err(e) => (vec![Err(e); opss.len()], false),
        };
        if let Some(detail) = self.sync_failure.get()
            && !self.reopen_after_sync_failure
        {
            // Fail-stop: the OS may have dropped the pages of the failed sync while still
            // serving them from its cache, so neither reopening nor going on is safe. Nothing
            // more is written or read; the process must restart (and recover from the disk).
            let halted = StoreError::Halted {
                path: self.path.clone(),
                detail: detail.clone(),
            };
            tracing::error!(path = %self.path.display(), %detail,
                "FATAL: an fsync of the task store failed; the store stops (fail-stop) and acknowledges nothing more. Restart the process (after dropping the page cache or rebooting if the disk is suspect); redb recovers from what is on disk");
            *self.db.write().unwrap_or_else(|e| e.into_inner()) = DbState::Halted(detail.clone());
            self.halt.send_replace(Some(detail));
            for ack in acks {
                let _ = ack.send(Err(halted.clone()));
            }
            return;
        }
        if poisoned {
            // redb answers `PreviousIo` to everything after an I/O error until the file is
            // reopened; reopening also rolls back to the last durable commit. The waiters of
            // this batch learn of the failure first (they may retry after the reopen).
            for (ack, result) in acks.into_iter().zip(results) {
                let _ = ack.send(result);
            }
            if self.reopen_after_sync_failure {
                *self
                    .sync_failure
                    .0
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = None;
            }
            self.reopen();
            return;
        }
        for (ack, result) in acks.into_iter().zip(results) {
            // The waiter may have given up (dropped its future); the commit stands regardless.
            let _ = ack.send(result);
        }
    }

    /// Closes the database and opens it again (redb repairs it back to its last durable
    /// commit). On failure the store is [`DbState::Broken`] until a later write reopens it.
    fn reopen(&self) {
        let old = std::mem::replace(
            &mut *self.db.write().unwrap_or_else(|e| e.into_inner()),
            DbState::Broken("reopening after an I/O error".into()),
        );
        if let DbState::Open(mut db) = old {
            // Readers hold clones only for the length of one read transaction.
            let started = Instant::now();
            let db = loop {
                match Arc::try_unwrap(db) {
                    Ok(db) => break Some(db),
                    Err(shared) if started.elapsed() < Duration::from_secs(10) => {
                        db = shared;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(_) => break None,
                }
            };
            match db {
                Some(db) => {
                    if let Err(e) = db.close() {
                        tracing::debug!(path = %self.path.display(), error = %e, "closing the failed database");
                    }
                }
                None => {
                    let detail = "a reader did not release the failed database".to_owned();
                    tracing::error!(path = %self.path.display(), %detail);
                    *self.db.write().unwrap_or_else(|e| e.into_inner()) = DbState::Broken(detail);
                    return;
                }
            }
        }
        // The file was verified when it was opened; an in-process reopen after a failed write
        // does not read it whole again. A file that disappeared is not recreated empty.
        let _ = self.verify_on_open;
        let reopened = open_database(&self.target, false, false, &self.sync_failure)
            .and_then(|db| init_tables_and_boot(&db, &self.path, false).map(|_| db));
        let state = match reopened {
            Ok(db) => {
                tracing::warn!(path = %self.path.display(), "task store reopened after an I/O error");
                DbState::Open(Arc::new(db))
            }
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "reopening the task store failed");
                DbState::Broken(e.to_string())
            }
        };
        *self.db.write().unwrap_or_else(|e| e.into_inner()) = state;
    }
}

/// Applies every job of `jobs` in one write transaction with one commit and returns one result
/// per job. If applying fails (not committing), the transaction is aborted and each job is
/// retried in its own transaction so that one bad job does not fail the others. Never panics:
/// a panic inside redb becomes a [`StoreError::Commit`].
#[cfg(test)]
fn apply_jobs(
    db: &Database,
    path: &Path,
    durability: Durability,
    jobs: &[Vec<WriteOp>],
    counters: &Counters,
) -> Vec<Result<(), StoreError>> {
    apply_jobs_inner(db, path, durability, jobs, counters).0
}

/// [`apply_jobs`], plus whether a transaction failed to begin or commit (after which the
/// database must be reopened).
fn apply_jobs_inner(
    db: &Database,
    path: &Path,
    durability: Durability,
    jobs: &[Vec<WriteOp>],
    counters: &Counters,
) -> (Vec<Result<(), StoreError>>, bool) {
    let ops: usize = jobs.iter().map(Vec::len).sum();
    let started = Instant::now();
    match guarded(path, || one_transaction(db, durability, jobs)) {
        Ok(results) => {
            counters.commits.fetch_add(1, Ordering::Relaxed);
            counters.ops.fetch_add(ops as u64, Ordering::Relaxed);
            tracing::debug!(
                jobs = jobs.len(),
                ops,
                micros = started.elapsed().as_micros() as u64,
                "store group commit"
            );
            (results, false)
        }
        Err(Failure::Apply(e)) if jobs.len() > 1 => {
            tracing::warn!(path = %path.display(), error = %e, jobs = jobs.len(),
                "applying a group commit failed; retrying its jobs one by one");
            let mut poisoned = false;
            let results = jobs
                .iter()
                .map(|job| {
                    if poisoned {
                        return Err(StoreError::Commit(
                            "not attempted after an I/O error in the same batch".into(),
                        ));
                    }
                    let (mut r, p) =
                        apply_jobs_inner(db, path, durability, std::slice::from_ref(job), counters);
                    poisoned |= p;
                    r.pop()
                        .unwrap_or_else(|| Err(StoreError::Commit("no result".into())))
                })
                .collect();
            (results, poisoned)
        }
        Err(failure) => {
            let (e, poisoned) = match failure {
                Failure::Apply(e) => (e, false),
                Failure::Commit(e) => (e, true),
            };
            let err = StoreError::Commit(e);
            tracing::error!(path = %path.display(), error = %err, jobs = jobs.len(), ops, "store commit failed");
            (vec![Err(err); jobs.len()], poisoned)
        }
    }
}

/// Why a transaction failed: while applying ops (the transaction was aborted) or while
/// beginning or committing it (maybe an I/O error: the batch's outcome is reported to all its
/// jobs, and the database is reopened).
enum Failure {
    Apply(String),
    Commit(String),
}

fn guarded<T>(path: &Path, f: impl FnOnce() -> Result<T, Failure>) -> Result<T, Failure> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(panic) => {
            let msg = panic_message(&panic);
            tracing::error!(path = %path.display(), panic = %msg, "redb panicked in a write");
            Err(Failure::Commit(format!("redb panicked: {msg}")))
        }
    }
}

fn one_transaction(
    db: &Database,
    durability: Durability,
    jobs: &[Vec<WriteOp>],
) -> Result<Vec<Result<(), StoreError>>, Failure> {
    let mut txn = db
        .begin_write()
        .map_err(|e| Failure::Commit(e.to_string()))?;
    if durability == Durability::None {
        txn.set_durability(redb::Durability::None)
            .map_err(|e| Failure::Commit(e.to_string()))?;
    }
    let results = apply_jobs_to(&txn, jobs).map_err(|e| match e {
        // redb latches an I/O error: the database must be reopened like after a failed commit.
        redb::Error::Io(_) | redb::Error::PreviousIo => Failure::Commit(e.to_string()),
        other => Failure::Apply(other.to_string()),
    })?;
    // Inside a group commit: the ops are applied, the commit has not started.
    #[cfg(feature = "failpoints")]
    fail::fail_point!("store::group_commit", |arg| {
        Err(Failure::Commit(format!(
            "failpoint store::group_commit: {}",
            arg.unwrap_or_default()
        )))
    });
    txn.commit().map_err(|e| Failure::Commit(e.to_string()))?;
    Ok(results)
}

/// Applies every job whose preconditions hold (checked against the transaction, so a job sees
/// the writes of the jobs before it); a job whose precondition fails is skipped whole and
/// answered [`StoreError::Conflict`].
fn apply_jobs_to(
    txn: &WriteTransaction,
    jobs: &[Vec<WriteOp>],
) -> Result<Vec<Result<(), StoreError>>, redb::Error> {
    let mut tasks = txn.open_table(TASKS)?;
    let mut live = txn.open_table(LIVE)?;
    let mut due = txn.open_table(DUE)?;
    let mut due_by_id = txn.open_table(DUE_BY_ID)?;
    let mut seqs = txn.open_table(SEQ)?;
    let mut meta = txn.open_table(META)?;
    let mut results = Vec::with_capacity(jobs.len());
    'jobs: for job in jobs {
        for op in job {
            if let WriteOp::Put { id, expect, .. } = op {
                let id = id.as_str();
                let stored = || -> Result<(bool, Option<u64>), redb::Error> {
                    let exists = tasks.get(id)?.is_some();
                    Ok((exists, seqs.get(id)?.map(|v| v.value())))
                };
                let conflict = match *expect {
                    Expect::Any => None,
                    Expect::Absent => match stored()? {
                        (false, _) => None,
                        (true, found) => Some((None, found)),
                    },
                    Expect::Seq(n) => match stored()? {
                        (true, Some(found)) if found == n => None,
                        // Stored before sequence numbers were kept: accepted once.
                        (true, None) => None,
                        (_, found) => Some((Some(n), found)),
                    },
                };
                if let Some((expected, found)) = conflict {
                    results.push(Err(StoreError::Conflict {
                        id: id.to_owned(),
                        expected,
                        found,
                    }));
                    continue 'jobs;
                }
            }
        }
        for op in job {
            match op {
                WriteOp::Put {
                    id,
                    bytes,
                    live: is_live,
                    due_ms,
                    seq,
                    expect: _,
                } => {
                    let id = id.as_str();
                    tasks.insert(id, bytes.as_slice())?;
                    match seq {
                        Some(seq) => {
                            seqs.insert(id, *seq)?;
                        }
                        None => {
                            seqs.remove(id)?;
                        }
                    }
                    if *is_live {
                        live.insert(id, ())?;
                    } else {
                        live.remove(id)?;
                    }
                    let old = due_by_id.remove(id)?.map(|v| v.value());
                    if let Some(old) = old {
                        due.remove((old, id))?;
                    }
                    if let Some(at) = *due_ms {
                        due.insert((at, id), ())?;
                        due_by_id.insert(id, at)?;
                    }
                }
                WriteOp::Delete { id } => {
                    let id = id.as_str();
                    tasks.remove(id)?;
                    live.remove(id)?;
                    seqs.remove(id)?;
                    let old = due_by_id.remove(id)?.map(|v| v.value());
                    if let Some(old) = old {
                        due.remove((old, id))?;
                    }
                }
                WriteOp::SetDue { id, due_ms } => {
                    let id = id.as_str();
                    let old = due_by_id.remove(id)?.map(|v| v.value());
                    if let Some(old) = old {
                        due.remove((old, id))?;
                    }
                    if let Some(at) = *due_ms
                        && tasks.get(id)?.is_some()
                    {
                        due.insert((at, id), ())?;
                        due_by_id.insert(id, at)?;
                    }
                }
                WriteOp::PutMeta { key, value } => {
                    meta.insert(key.as_str(), value.as_slice())?;
                }
            }
        }
        results.push(Ok(()));
    }
    Ok(results)
}

/// Creates the tables, increments the boot epoch (when `bump`) and commits durably. Returns the
/// epoch.
fn init_tables_and_boot(db: &Database, path: &Path, bump: bool) -> Result<u64, StoreError> {
    let fail = |e: &dyn fmt::Display| StoreError::Open {
        path: path.to_path_buf(),
        detail: format!("initialising the tables failed: {e}"),
    };
    let run = || -> Result<u64, StoreError> {
        let txn = db.begin_write().map_err(|e| fail(&e))?;
        let epoch = {
            txn.open_table(TASKS).map_err(|e| fail(&e))?;
            txn.open_table(LIVE).map_err(|e| fail(&e))?;
            txn.open_table(DUE).map_err(|e| fail(&e))?;
            txn.open_table(DUE_BY_ID).map_err(|e| fail(&e))?;
            txn.open_table(SEQ).map_err(|e| fail(&e))?;
            let mut meta = txn.open_table(META).map_err(|e| fail(&e))?;
            let previous = match meta.get(META_BOOT_EPOCH).map_err(|e| fail(&e))? {
                None => 0,
                Some(v) => {
                    let bytes: [u8; 8] = v.value().try_into().map_err(|_| StoreError::Corrupt {
                        path: path.to_path_buf(),
                        detail: format!(
                            "meta \"{META_BOOT_EPOCH}\" has {} bytes, expected 8",
                            v.value().len()
                        ),
                    })?;
                    u64::from_le_bytes(bytes)
                }
            };
            if bump {
                let epoch = previous.checked_add(1).ok_or_else(|| StoreError::Corrupt {
                    path: path.to_path_buf(),
                    detail: format!("meta \"{META_BOOT_EPOCH}\" is at its maximum"),
                })?;
                meta.insert(META_BOOT_EPOCH, epoch.to_le_bytes().as_slice())
                    .map_err(|e| fail(&e))?;
                epoch
            } else {
                previous
            }
        };
        txn.commit().map_err(|e| fail(&e))?;
        Ok(epoch)
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(r) => r,
        Err(panic) => Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: format!(
                "redb panicked while initialising it: {}",
                panic_message(&panic)
            ),
        }),
    }
}

/// Opens (or creates) the database of `target`; never panics (redb may panic on a file damaged
/// outside redb).
///
/// - A missing file is created atomically ([`create_atomically`]).
/// - An existing file must be a redb database; a corrupt, truncated or foreign file gives
///   [`StoreError::Corrupt`] (or [`StoreError::Open`]) naming the file, and is never recreated
///   or overwritten.
fn open_database(
    target: &Target,
    verify: bool,
    create: bool,
    sync_failure: &Arc<SyncFailure>,
) -> Result<Database, StoreError> {
    let path = target.path();
    let open_err = |detail: String| StoreError::Open {
        path: path.to_path_buf(),
        detail,
    };
    let backend: Box<dyn StorageBackend> = match target {
        Target::File(path) => {
            let existed = path
                .try_exists()
                .map_err(|e| open_err(format!("cannot check whether the file exists: {e}")))?;
            if !existed {
                if !create {
                    return Err(open_err(
                        "the file is gone; it is not recreated empty".to_owned(),
                    ));
                }
                create_atomically(path)?;
            }
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|e| open_err(e.to_string()))?;
            Box::new(redb::backends::FileBackend::new(file).map_err(|e| map_open_error(path, e))?)
        }
        Target::Backend { factory, .. } => {
            factory().map_err(|e| open_err(format!("the storage backend: {e}")))?
        }
    };
    let backend = SyncWatch {
        inner: BoxedBackend(backend),
        failure: Arc::clone(sync_failure),
    };
    let opened = catch_unwind(AssertUnwindSafe(|| {
        redb::Builder::new()
            .set_check_integrity_on_open(verify)
            .create_with_backend(backend)
    }));
    let db = match opened {
        Ok(Ok(db)) => db,
        Ok(Err(e)) => return Err(map_open_error(path, e)),
        Err(panic) => {
            return Err(StoreError::Corrupt {
                path: path.to_path_buf(),
                detail: format!("redb panicked while opening it: {}", panic_message(&panic)),
            });
        }
    };
    Ok(db)
}

/// Creates an empty file that only its owner can read and write (`0600` on Unix).
fn create_private_file(path: &Path) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path).map(drop)
}

/// Logs a warning when an existing store file can be read by other users (it holds task data
/// and the `requestState` signing key).
fn warn_if_readable_by_others(path: &Path) {
    #[cfg(unix)]
    if let Ok(meta) = std::fs::metadata(path) {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                mode = format!("{mode:o}"),
                "the store file is accessible to other users: it holds every task's data and the requestState signing key; run `chmod 600` on it"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// Creates a new store file so that a crash never leaves a half-initialised one at `path`:
/// the database is initialised (tables created, committed durably) in a temporary file beside
/// it, which is then renamed into place, and the directory is fsynced.
fn create_atomically(path: &Path) -> Result<(), StoreError> {
    let open_err = |detail: String| StoreError::Open {
        path: path.to_path_buf(),
        detail,
    };
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".creating");
    let tmp = path.with_file_name(name);
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(open_err(format!("cannot remove {}: {e}", tmp.display()))),
    }
    // The store holds every task's arguments, answers and results and the key that signs
    // `requestState`: it is created readable by its owner only. redb initialises an empty
    // existing file, so the file is made first with the right mode.
    create_private_file(&tmp)
        .map_err(|e| open_err(format!("cannot create {}: {e}", tmp.display())))?;
    let created = catch_unwind(AssertUnwindSafe(|| redb::Builder::new().create(&tmp)));
    let db = match created {
        Ok(Ok(db)) => db,
        Ok(Err(e)) => return Err(map_open_error(path, e)),
        Err(panic) => {
            return Err(open_err(format!(
                "redb panicked while creating it: {}",
                panic_message(&panic)
            )));
        }
    };
    init_tables_and_boot(&db, path, false)?;
    db.close()
        .map_err(|e| open_err(format!("closing the new file failed: {e}")))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        open_err(format!(
            "cannot move the new file {} into place: {e}",
            tmp.display()
        ))
    })?;
    sync_parent_dir(path).map_err(|e| {
        open_err(format!(
            "created the file but could not fsync its directory: {e}"
        ))
    })
}

fn map_open_error(path: &Path, e: DatabaseError) -> StoreError {
    let path = path.to_path_buf();
    match e {
        DatabaseError::DatabaseAlreadyOpen => StoreError::AlreadyOpen { path },
        DatabaseError::Storage(StorageError::Corrupted(detail)) => {
            StoreError::Corrupt { path, detail }
        }
        DatabaseError::Storage(StorageError::Io(io))
            if io.kind() == std::io::ErrorKind::InvalidData =>
        {
            StoreError::Corrupt {
                path,
                detail: io.to_string(),
            }
        }
        DatabaseError::UpgradeRequired(v) => StoreError::Open {
            path,
            detail: format!("the file has redb format version {v} and needs an upgrade"),
        },
        other => StoreError::Open {
            path,
            detail: other.to_string(),
        },
    }
}

/// fsyncs the directory holding `path`, so that a newly created file's entry survives a crash.
fn sync_parent_dir(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        std::fs::File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        // Directories cannot be opened for fsync on this platform.
        let _ = path;
        Ok(())
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_owned()
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
