//! Where tasks are persisted: the [`TaskStore`] trait and its backends.
//!
//! The store keeps opaque snapshot bytes keyed by task id, with the indexes the runtime
//! maintains through [`WriteOp::Put`] (live tasks, due times for the expiry reaper, the
//! sequence number for compare-and-set, the owner and listing entries) and a small meta table.
//! It decodes a snapshot in one case only: to derive a record's owner and listing entries where
//! the runtime handed none (converting a store written before those indexes, and the
//! administration commands that copy records). Every
//! write is a [`Store::commit`] of a batch of [`WriteOp`]s that is durable when it returns.
//!
//! Backends:
//!
//! - `RedbStore` (feature `redb`, on by default; `store/redb/`): one redb file owned by one
//!   process, one writer thread with group commit, fail-stop on a failed fsync.
//! - [`MemoryStore`]: nothing survives the process; for tests and for measuring what
//!   durability costs.
//! - `PostgresStore` (feature `postgres`; `store/postgres/`): one database shared by several
//!   replicas, with per-node leases and fencing (see docs/SCALE-OUT.md).
//!
//! [`Store`] is the cheap-to-clone handle the runtime holds, over any of them (or a host's own
//! [`TaskStore`]).
//!
//! The seam: [`TaskStore`] is what every backend implements; what only some backends do is a
//! capability reached through an accessor that answers `None` by default:
//! [`TaskStore::cluster`] ([`Cluster`]: leases, fencing checks and signalling of a store
//! shared by replicas) and [`TaskStore::inspector`] ([`inspect::Inspector`]: reading an open
//! store for the `store …` commands). Each backend keeps its code, inspection included, in
//! its own folder.

pub mod flow;
pub mod inspect;
pub mod listing;
mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redb")]
pub(crate) mod redb;

use std::fmt;
#[cfg(feature = "redb")]
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "redb")]
use ::redb::StorageBackend;
use futures::future::BoxFuture;

#[cfg(feature = "redb")]
pub use self::redb::RedbStore;
pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::{Lease, PostgresOptions, PostgresStore};

/// Every kind of store this build reaches by location (`mcp-tasks store …`, `serve --store`),
/// in the order they are asked whether a location is theirs: **a backend registers here, one
/// line**, and keeps everything else in its folder. A location none of them claims names a
/// backend this build lacks ([`kind_of`] says which feature it needs).
pub(crate) fn kinds() -> &'static [&'static dyn inspect::StoreKind] {
    &[
        #[cfg(feature = "postgres")]
        &postgres::inspect::PostgresKind,
        #[cfg(feature = "redb")]
        &redb::inspect::RedbKind,
    ]
}

/// The kind of store `location` names: the first registered kind that claims it, else a
/// kind that refuses every operation, naming the cargo feature that would serve it (a
/// `postgres://` URL without `postgres`, a path without `redb`).
pub(crate) fn kind_of(location: &str) -> &'static dyn inspect::StoreKind {
    static NO_POSTGRES: inspect::Unsupported = inspect::Unsupported {
        name: "postgres",
        message: "this build has no PostgreSQL support (cargo feature `postgres`)",
    };
    static NO_REDB: inspect::Unsupported = inspect::Unsupported {
        name: "redb",
        message: "this build has no redb support (cargo feature `redb`)",
    };
    static UNKNOWN_URL: inspect::Unsupported = inspect::Unsupported {
        name: "unknown",
        message: "no store of this build is reached by this kind of URL (postgres:// and postgresql:// name PostgreSQL databases; anything else is a path to a redb file)",
    };
    if let Some(kind) = kinds().iter().find(|k| k.claims(location)) {
        return *kind;
    }
    if location.starts_with("postgres://") || location.starts_with("postgresql://") {
        &NO_POSTGRES
    } else if inspect::is_url(location) {
        &UNKNOWN_URL
    } else {
        &NO_REDB
    }
}

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
    AlreadyOpen {
        /// The store's file.
        path: PathBuf,
    },
    /// The file could not be opened or initialised (permissions, missing directory, I/O, ...).
    #[error("cannot open the task store {}: {detail}", path.display())]
    Open {
        /// The store's file (or the redacted URL of a database).
        path: PathBuf,
        /// The underlying error.
        detail: String,
    },
    /// The file is not a redb database or is damaged. It is left untouched.
    #[error(
        "the task store {} is corrupt or not a redb database ({detail}); the file was left untouched",
        path.display()
    )]
    Corrupt {
        /// The store's file.
        path: PathBuf,
        /// What redb reported.
        detail: String,
    },
    /// A write transaction failed; none of the ops of that batch (or job) are stored.
    #[error("committing to the task store failed: {0}")]
    Commit(#[source] Cause),
    /// The store stopped for good after a failed fsync (fail-stop): nothing is written or read
    /// any more, because the OS may have dropped the writes of the failed sync while still
    /// showing them to readers. Restart the process (see [`Store::halted`]).
    #[error(
        "the task store {} stopped after a failed fsync and accepts no more writes ({detail}); restart the process",
        path.display()
    )]
    Halted {
        /// The store's file.
        path: PathBuf,
        /// The error of the failed sync.
        detail: String,
    },
    /// A conditional write found another sequence number than the one it was based on: some
    /// other writer changed the task first. Nothing of the job is stored.
    #[error("task {id} changed concurrently: expected sequence {expected:?}, found {found:?}")]
    Conflict {
        /// The task id.
        id: String,
        /// The sequence number the write was based on (`None`: the task must not exist yet).
        expected: Option<u64>,
        /// The sequence number stored (`None`: no such task).
        found: Option<u64>,
    },
    /// A read transaction failed.
    #[error("reading the task store failed: {0}")]
    Read(#[source] Cause),
    /// An I/O error made the store unusable and reopening it failed; every write tries to reopen
    /// it again first. Nothing acknowledged before the error is lost.
    #[error(
        "the task store {} is unavailable after an I/O error and could not be reopened: {detail}",
        path.display()
    )]
    Unavailable {
        /// The store's file (or the redacted URL of a database).
        path: PathBuf,
        /// Why the reopen failed.
        detail: String,
    },
    /// A store shared by several nodes refused the write of a task whose lease this node no
    /// longer holds: another node took the task over (this node's heartbeat lapsed). Nothing of
    /// the job is stored; the writer must stop without side effects (it is *fenced*).
    #[error("task {id} is leased to another node: this node's write was refused (fenced)")]
    Fenced {
        /// The task id.
        id: String,
    },
    /// A statement waited for a row lock held by another session longer than allowed (or
    /// would have, with `NOWAIT`): typically a replica paused inside a transaction. Nothing was
    /// changed; the same request can succeed later (the server ends such a transaction once it
    /// idles past its timeout).
    #[error("the task store is busy: {detail}; nothing was changed, retry later")]
    Busy {
        /// What was locked.
        detail: String,
    },
    /// Another live process runs with this node id (its heartbeat is renewed): two processes
    /// must never share one. Nothing was changed.
    #[error(
        "node id `{node}` is in use by another live process on {store} (its heartbeat is renewed); give every replica its own --node-id"
    )]
    NodeIdInUse {
        /// The store (a redacted URL).
        store: String,
        /// The node id.
        node: String,
    },
    /// The lease TTL differs from the one the live replicas of the cluster share (stored in
    /// the database). Nothing was changed.
    #[error(
        "the replicas on {store} share a lease TTL of {stored:?} but this one was started with {requested:?} (live nodes: {live}); start it with the same --lease-ttl, or stop every replica to change it"
    )]
    LeaseTtlMismatch {
        /// The store (a redacted URL).
        store: String,
        /// The TTL the cluster uses.
        stored: std::time::Duration,
        /// The TTL this replica was given.
        requested: std::time::Duration,
        /// The live nodes, comma-separated.
        live: String,
    },
    /// The store's schema was written by a newer version of mcp-tasks; nothing was changed.
    #[error(
        "the task store {store} has schema version {found}, newer than the {supported} this build supports; upgrade mcp-tasks (nothing was changed)"
    )]
    SchemaTooNew {
        /// The store (a redacted URL).
        store: String,
        /// The version found in the store.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
}

/// What went wrong underneath a [`StoreError::Commit`] or [`StoreError::Read`]: the backend's
/// own error (redb's, PostgreSQL's, an I/O error), kept as the `source()` chain, or a
/// description where there is no error value (a panic inside redb, a stopped writer thread).
///
/// Cheap to clone (shared): one failed group commit is reported to every waiter of its batch.
#[derive(Clone)]
pub struct Cause {
    message: Arc<str>,
    source: CauseSource,
}

#[derive(Clone)]
enum CauseSource {
    /// No underlying error value.
    None,
    /// The cause *is* this error: its message is shown, its own source continues the chain.
    Is(Arc<dyn std::error::Error + Send + Sync + 'static>),
    /// This error underlies a message of its own.
    Under(Arc<dyn std::error::Error + Send + Sync + 'static>),
}

impl Cause {
    /// The cause is `error` (its message, then its own sources).
    pub fn of(error: impl std::error::Error + Send + Sync + 'static) -> Cause {
        Cause {
            message: error.to_string().into(),
            source: CauseSource::Is(Arc::new(error)),
        }
    }

    /// A cause with no error value underneath.
    pub fn message(message: impl Into<String>) -> Cause {
        Cause {
            message: message.into().into(),
            source: CauseSource::None,
        }
    }

    /// A description of its own, with `error` underneath it.
    pub fn context(
        message: impl Into<String>,
        error: impl std::error::Error + Send + Sync + 'static,
    ) -> Cause {
        Cause {
            message: message.into().into(),
            source: CauseSource::Under(Arc::new(error)),
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::fmt::Debug for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Cause");
        d.field("message", &self.message);
        match &self.source {
            CauseSource::None => {}
            CauseSource::Is(e) | CauseSource::Under(e) => {
                d.field("error", e);
            }
        }
        d.finish()
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.source {
            CauseSource::None => None,
            CauseSource::Is(e) => e.source(),
            CauseSource::Under(e) => Some(e.as_ref()),
        }
    }
}

/// Makes a fresh [`StorageBackend`] over the same bytes, for [`Store::open_with_backend`]. Called
/// once at open and again whenever the store reopens after an I/O error (redb answers
/// `PreviousIo` to everything until then). Feature `redb`.
#[cfg(feature = "redb")]
pub type BackendFactory = Arc<dyn Fn() -> std::io::Result<Box<dyn StorageBackend>> + Send + Sync>;

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

/// The default of [`StoreOptions::cache_size`]: 64 MiB.
pub const DEFAULT_CACHE_SIZE: usize = 64 * 1024 * 1024;

/// The default of [`StoreOptions::record_cache_size`]: 8 MiB.
pub const DEFAULT_RECORD_CACHE_SIZE: usize = 8 * 1024 * 1024;

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
    /// Bytes of redb's page cache (redb store only): pages read or written stay in memory
    /// up to this size, so the server's memory does not grow with the stored tasks beyond
    /// it; reads past it go to the operating system's page cache. Default 64 MiB
    /// ([`DEFAULT_CACHE_SIZE`]).
    pub cache_size: usize,
    /// Bytes of the record cache (redb store only): the snapshots of recently read tasks, so
    /// that a task read again (a client polling a finished task) is answered from memory
    /// without a read transaction. Filled by reads only; every write of a task drops its entry
    /// before the write is acknowledged, so a read that begins after an acknowledged write
    /// never returns an older snapshot. Counted apart from [`StoreOptions::cache_size`]; 0
    /// turns it off. Default 8 MiB ([`DEFAULT_RECORD_CACHE_SIZE`]).
    pub record_cache_size: usize,
    /// redb's quick repair (redb store only): every commit also saves the allocator state and
    /// commits in two phases, so that opening the file after a crash does not walk the whole
    /// file to rebuild that state. Restarts after `kill -9` or a power loss then take about as
    /// long as a clean start, whatever the size of the file, if
    /// [`StoreOptions::verify_on_open`] is off too (that check reads the whole file in any
    /// case); each commit costs more (docs/BENCHMARKS.md measures both). Default `false`.
    pub quick_repair: bool,
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
            cache_size: DEFAULT_CACHE_SIZE,
            record_cache_size: DEFAULT_RECORD_CACHE_SIZE,
            quick_repair: false,
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
        /// The task id.
        id: String,
        /// The encoded task record.
        bytes: Vec<u8>,
        /// How many of `bytes`' last bytes are the same in every put of this id (a task's
        /// arguments: `persist::encode_parts`); 0 = none. A store may keep them apart and
        /// write them only when they are not stored yet: redb does for a tail of at least
        /// 4 KiB (`store::redb`), PostgreSQL and the memory store keep records whole. The
        /// writer guarantees they never change; a put with a different length replaces them.
        constant_tail: usize,
        /// Whether the task is unfinished (indexed for rehydration at start).
        live: bool,
        /// When the reaper should look at the task (expiry), in ms since the epoch.
        due_ms: Option<u64>,
        /// The record's sequence number, stored for the next write's [`Expect::Seq`].
        seq: Option<u64>,
        /// The precondition checked inside the write transaction.
        expect: Expect,
        /// The task's owner and creation time, for the owner index and the per-owner usage
        /// ([`TaskStore::owned`], [`TaskStore::usage`]). Never changes over a task's life;
        /// `None` keeps whatever the store holds (a record written without one is in no
        /// owner's index and counted for nobody).
        owner: Option<OwnerEntry>,
        /// What the listing index keeps of the task (its tool, status, message, last update):
        /// [`listing`]. Needs the owner entry (stored or in this put); `None` keeps whatever
        /// the store holds.
        listing: Option<listing::Listing>,
    },
    /// Remove the task and all its index entries.
    Delete {
        /// The task id.
        id: String,
    },
    /// Replace the due entry of a stored task (None = never due) without touching its bytes.
    /// The reaper uses it to quarantine a record it cannot decode.
    SetDue {
        /// The task id.
        id: String,
        /// The new due time in ms since the epoch.
        due_ms: Option<u64>,
    },
    /// Set a key in the meta table.
    PutMeta {
        /// The meta key.
        key: String,
        /// The value.
        value: Vec<u8>,
    },
    /// Set a key in the meta table unless it is set already (the first writer wins: replicas
    /// starting together agree on one value; read it back after the commit).
    PutMetaIfAbsent {
        /// The meta key.
        key: String,
        /// The value stored if the key is absent.
        value: Vec<u8>,
    },
    /// Remove a key from the meta table (nothing if it is absent).
    DeleteMeta {
        /// The meta key.
        key: String,
    },
}

impl WriteOp {
    /// The task this op writes (`None` for meta keys): the redb store drops it from its
    /// record cache.
    #[cfg(feature = "redb")]
    pub(crate) fn task_id(&self) -> Option<&str> {
        match self {
            WriteOp::Put { id, .. } | WriteOp::Delete { id } | WriteOp::SetDue { id, .. } => {
                Some(id)
            }
            WriteOp::PutMeta { .. }
            | WriteOp::PutMetaIfAbsent { .. }
            | WriteOp::DeleteMeta { .. } => None,
        }
    }
}

/// Who a stored task belongs to, as the store indexes it: [`WriteOp::Put::owner`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OwnerEntry {
    /// The owner's key ([`owner_key`]): what the index and the usage counters are keyed by.
    pub owner: String,
    /// When the task was created (ms since the epoch): the owner index is ordered by it.
    pub created_ms: u64,
}

/// The store key of the owner `(tenant, principal)`: the tenant's length in bytes, `:`, the
/// tenant, then the principal. Unambiguous (`("a", "b:c")` and `("a:b", "c")` differ) and
/// ordered by tenant length first, which only matters for the order of `store stats
/// --by-owner`. [`parse_owner_key`] is its inverse.
pub fn owner_key(tenant: &str, principal: &str) -> String {
    format!("{}:{tenant}{principal}", tenant.len())
}

/// The `(tenant, principal)` of an [`owner_key`]; `None` for a malformed key.
pub fn parse_owner_key(key: &str) -> Option<(&str, &str)> {
    let (len, rest) = key.split_once(':')?;
    let len: usize = len.parse().ok()?;
    if !rest.is_char_boundary(len.min(rest.len())) || len > rest.len() {
        return None;
    }
    Some(rest.split_at(len))
}

/// The owner entry of a snapshot, read from the snapshot itself (the conversion of a store
/// written before the owner index, and administration commands that write records they
/// did not get an owner entry for). `None` for a snapshot that does not decode.
#[cfg(any(feature = "redb", feature = "postgres"))]
pub(crate) fn owner_of_snapshot(snapshot: &[u8]) -> Option<OwnerEntry> {
    let record = crate::persist::decode(snapshot).ok()?;
    Some(OwnerEntry {
        owner: owner_key(&record.owner.tenant, &record.owner.principal),
        created_ms: record.created_at_ms,
    })
}

/// The listing of a snapshot, read from the snapshot itself (the conversion of a store
/// written before the listing index, and administration commands that write records they
/// did not get a listing for). `None` for a snapshot that does not decode.
#[cfg(any(feature = "redb", feature = "postgres"))]
pub(crate) fn listing_of_snapshot(snapshot: &[u8]) -> Option<listing::Listing> {
    let record = crate::persist::decode(snapshot).ok()?;
    Some(listing_of(&record))
}

/// What the listing index keeps of `record`.
pub(crate) fn listing_of(record: &crate::task::TaskRecord) -> listing::Listing {
    use crate::task::TaskStatus;
    let status = match record.status {
        TaskStatus::Working => listing::ListedStatus::Working,
        TaskStatus::InputRequired => listing::ListedStatus::InputRequired,
        TaskStatus::Completed => listing::ListedStatus::Completed,
        TaskStatus::Failed => listing::ListedStatus::Failed,
        TaskStatus::Cancelled => listing::ListedStatus::Cancelled,
    };
    listing::Listing::new(
        record.tool.as_str(),
        status,
        record.status_message.as_deref(),
        record.last_updated_at_ms,
    )
}

/// Where a page of [`TaskStore::owned`] starts: after this entry in (creation time, id)
/// order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct OwnedCursor {
    /// The creation time of the last entry of the previous page.
    pub created_ms: u64,
    /// Its id.
    pub id: String,
}

/// One entry of a [`TaskStore::owned`] page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedRecord {
    /// The task id.
    pub id: String,
    /// When it was created (its place in the owner index).
    pub created_ms: u64,
    /// The snapshot bytes.
    pub bytes: Vec<u8>,
}

/// What one owner holds in a store: [`TaskStore::usage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    /// Stored tasks (live and finished, until the reaper deletes them).
    pub tasks: u64,
    /// Their stored bytes: each record's id and value as the backend stores it.
    pub bytes: u64,
}

impl Usage {
    /// `self` with one record of `bytes` added (`sign` > 0) or removed.
    pub(crate) fn add(&mut self, bytes: u64, sign: i8) {
        if sign > 0 {
            self.tasks = self.tasks.saturating_add(1);
            self.bytes = self.bytes.saturating_add(bytes);
        } else {
            self.tasks = self.tasks.saturating_sub(1);
            self.bytes = self.bytes.saturating_sub(bytes);
        }
    }
}

/// The most entries one [`TaskStore::owned`] call returns,
/// whatever its caller asks: a page is what a request may hold in memory at once.
pub const MAX_PAGE: usize = 1000;

/// The record bytes past which one [`TaskStore::owned`] call stops filling its page: the
/// page ends with the record that reaches this sum (a page always holds at least one record,
/// so a caller paging on from its last record always progresses). Records may be megabytes
/// each (their arguments and results), and a page of [`MAX_PAGE`] of them is what one
/// request would hold in memory.
pub const MAX_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// How many records of a page, of these sizes in order, fit [`MAX_PAGE_BYTES`] as
/// [`TaskStore::owned`] counts: every record whose predecessors hold less than the bound
/// (the first always).
pub(crate) fn records_within_bytes(sizes: impl IntoIterator<Item = usize>) -> usize {
    let mut held = 0usize;
    let mut n = 0;
    for size in sizes {
        if held >= MAX_PAGE_BYTES {
            break;
        }
        held = held.saturating_add(size);
        n += 1;
    }
    n
}

/// Counters since open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Successful write transactions of the writer thread (the boot-epoch commit of
    /// [`Store::open`] is not counted).
    pub commits: u64,
    /// Ops in those transactions.
    pub ops: u64,
    /// Reads of a task answered from the record cache (redb store only, see
    /// [`StoreOptions::record_cache_size`]).
    pub cached_reads: u64,
}

/// A boxed future of a store operation.
pub type StoreFuture<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

/// What the runtime persists through: every task record, its indexes and meta.
///
/// Object-safe (the runtime holds an `Arc<dyn TaskStore>` in a [`Store`]). A backend must:
///
/// - make a [`TaskStore::commit`] durable before it returns `Ok`, and apply each call's ops
///   all or nothing;
/// - check every [`WriteOp::Put`]'s [`Expect`] against the stored sequence number in the same
///   transaction as the write, refusing a stale job alone with [`StoreError::Conflict`];
/// - on a store shared by several processes (one with a [`TaskStore::cluster`]), also refuse
///   the write of a task whose lease this process does not hold with [`StoreError::Fenced`].
///
/// What only some backends do is reached through capability accessors that answer `None` by
/// default: [`TaskStore::cluster`] (leases and signalling of a store shared by replicas) and
/// [`TaskStore::inspector`] (reading an open store for the `store …` commands).
pub trait TaskStore: Send + Sync + 'static {
    /// Names the store in logs (a path, or a URL without its password).
    fn describe(&self) -> String;
    /// The boot epoch this open recorded (1 for a new store, +1 per open).
    fn boot_epoch(&self) -> u64;
    /// Commits `ops` durably; see [`Store::commit`].
    fn commit(&self, ops: Vec<WriteOp>) -> StoreFuture<'_, ()>;
    /// The snapshot bytes of task `id`.
    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Vec<u8>>>;
    /// The snapshot bytes of each of `ids`, read together.
    fn get_many(&self, ids: Vec<String>) -> StoreFuture<'_, Vec<Option<Vec<u8>>>>;
    /// All (id, bytes) of live tasks, ordered by id, via the live index only.
    fn live(&self) -> StoreFuture<'_, Vec<(String, Vec<u8>)>>;
    /// Ids whose due time is at or before `now_ms`, earliest first (ties by id), at most
    /// `limit`.
    fn due(&self, now_ms: u64, limit: usize) -> StoreFuture<'_, Vec<String>>;
    /// The earliest due time in the index, if any.
    fn next_due(&self) -> StoreFuture<'_, Option<u64>>;
    /// A value of the meta table.
    fn meta_get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Vec<u8>>>;
    /// One page of the meta table: the (key, value) pairs whose key starts with `prefix`, in
    /// key order, after `after` (exclusive), at most `limit` (capped at [`MAX_PAGE`]). Reads
    /// this page only; a caller walks a prefix page by page with the last key as `after`.
    ///
    /// The default (a host's own backend written before it) answers [`StoreError::Read`]:
    /// the records such a store keeps under a prefix are not swept.
    fn meta_page<'a>(
        &'a self,
        prefix: &'a str,
        after: Option<&'a str>,
        limit: usize,
    ) -> StoreFuture<'a, Vec<(String, Vec<u8>)>> {
        let _ = (prefix, after, limit);
        Box::pin(async {
            Err(StoreError::Read(Cause::message(
                "this store cannot list its meta table",
            )))
        })
    }
    /// Every stored task (id, bytes), ordered by id: for checks and tools, not for serving.
    fn tasks(&self) -> StoreFuture<'_, Vec<(String, Vec<u8>)>>;
    /// Number of stored tasks and of live tasks.
    fn counts(&self) -> StoreFuture<'_, (u64, u64)>;
    /// One page of the tasks of `owner` (an [`owner_key`]), in (creation time, id) order,
    /// after `after`, at most `limit` (capped at [`MAX_PAGE`]) and, past its first record,
    /// no record once the page holds [`MAX_PAGE_BYTES`] of record bytes: a page may thus be
    /// shorter than `limit` with more to follow (the caller pages on after its last record
    /// until a page comes back empty or short of both bounds). Reads the owner index and
    /// the records of this page only: the cost does not depend on what other owners store.
    ///
    /// The default (a host's own backend written before the index) answers
    /// [`StoreError::Read`]: such a store cannot serve the legacy `tasks/list`. Every backend
    /// of this crate answers from its index.
    fn owned<'a>(
        &'a self,
        owner: &'a str,
        after: Option<OwnedCursor>,
        limit: usize,
    ) -> StoreFuture<'a, Vec<OwnedRecord>> {
        let _ = (owner, after, limit);
        Box::pin(async {
            Err(StoreError::Read(Cause::message(
                "this store has no owner index",
            )))
        })
    }
    /// What `owner` (an [`owner_key`]) holds: its stored tasks and their bytes, finished
    /// ones included until the reaper deletes them. Kept with the records in the same
    /// transaction, so it is exact after a crash and, on a shared store, for every replica.
    /// The default (a host's own backend) answers nothing stored: no disk quota applies.
    fn usage<'a>(&'a self, owner: &'a str) -> StoreFuture<'a, Usage> {
        let _ = owner;
        Box::pin(async { Ok(Usage::default()) })
    }
    /// The usage of every owner that holds something, by [`owner_key`].
    fn usage_by_owner(&self) -> StoreFuture<'_, Vec<(String, Usage)>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    /// One page of the listing index ([`listing`]): the tasks `filter` keeps, newest first,
    /// after `after`, at most `limit` (capped at [`listing::MAX_LISTING_PAGE`]), looking at
    /// no more than `budget` index entries (the page then says where to go on). Reads one
    /// index (the owner's, the tool's, the status's or every task's: [`listing::ListingFilter::index`])
    /// from the cursor on: its cost is the entries it looks at, not the store's size.
    ///
    /// The default (a host's own backend) answers [`StoreError::Read`]: the console cannot
    /// list such a store.
    fn listing<'a>(
        &'a self,
        filter: &'a listing::ListingFilter,
        after: Option<listing::ListingCursor>,
        limit: usize,
        budget: usize,
    ) -> StoreFuture<'a, listing::ListingPage> {
        let _ = (filter, after, limit, budget);
        Box::pin(async { Err(no_listing()) })
    }
    /// The stored tasks counted by (owner, tool, status), kept in the commits' transactions
    /// (exact after a crash, the same for every replica). Owner-tool-status triples with no
    /// task are left out.
    fn listing_counts(&self) -> StoreFuture<'_, Vec<listing::ListingCount>> {
        Box::pin(async { Err(no_listing()) })
    }
    /// The throughput buckets ([`listing::ThroughputBucket`]) of the minutes from `since_ms`
    /// on (empty buckets left out).
    fn throughput(&self, since_ms: u64) -> StoreFuture<'_, Vec<listing::ThroughputBucket>> {
        let _ = since_ms;
        Box::pin(async { Err(no_listing()) })
    }
    /// The bytes the store takes (the file, or the database's tables); `None` when unknown.
    fn stored_bytes(&self) -> StoreFuture<'_, Option<u64>> {
        Box::pin(async { Ok(None) })
    }
    /// Counters since open.
    fn stats(&self) -> StoreStats;
    /// Whether [`TaskStore::close`] was called.
    fn is_closed(&self) -> bool;
    /// `Some(detail)` once the store stopped for good (fail-stop); the process must restart.
    fn halted(&self) -> Option<String>;
    /// Waits until the store halts and returns why (pending forever on a healthy store).
    fn wait_halted(&self) -> BoxFuture<'_, String>;
    /// `Some(detail)` while the store is unusable and being retried.
    fn unavailable(&self) -> Option<String>;
    /// Finishes queued work and releases the store; later calls answer [`StoreError::Closed`].
    fn close(&self) -> BoxFuture<'_, ()>;

    /// Whether the store can serve now (a readiness probe): `Err(why)` when it is closed,
    /// halted or unavailable. The default checks those three states; a shared store also
    /// checks its database and this node's lease. Cheap enough to call on every probe.
    fn ready(&self) -> BoxFuture<'_, Result<(), String>> {
        let state = if self.is_closed() {
            Err("the task store is closed".to_owned())
        } else if let Some(detail) = self.halted() {
            Err(format!("the task store halted: {detail}"))
        } else if let Some(detail) = self.unavailable() {
            Err(format!("the task store is unavailable: {detail}"))
        } else {
            Ok(())
        };
        Box::pin(std::future::ready(state))
    }

    /// The capability of a store shared by replicas: leases, fencing and cross-node
    /// signalling ([`Cluster`]). `None` (the default) for a store owned by one process: the
    /// runtime then runs every live task itself and never claims, confirms or reconciles.
    fn cluster(&self) -> Option<&dyn Cluster> {
        None
    }
    /// The capability of inspection: a reader of this open store for the `store …`
    /// commands (a running server's admin socket answers through it). `None` (the default)
    /// for a store the commands reach by other means (a database they connect to) or not at
    /// all (memory).
    fn inspector(&self) -> Option<Box<dyn inspect::Inspector>> {
        None
    }
}

/// The error of a store without the listing index.
fn no_listing() -> StoreError {
    StoreError::Read(Cause::message("this store has no listing index"))
}

/// What [`Cluster::reconcile`] found (a store shared by replicas).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reconciled {
    /// Tasks this process held whose lease the store no longer gives it (another node took
    /// them over, or finished them): they are no longer held, and their local actors must
    /// stop, even if they never write again (an actor waiting for input).
    pub lost: Vec<String>,
    /// Live tasks the store leases to this node that this process did not know it held (a
    /// creation whose commit succeeded but whose acknowledgement was lost): claimed anew for
    /// this process (lease epoch + 1), with their bytes, to be run from the stored record.
    pub forgotten: Vec<(String, Vec<u8>)>,
    /// Tasks this process took over from a lapsed lease, counting an attempt against their
    /// restart budget, whose previous owner has since renewed its heartbeat in the same
    /// process: it was paused (a stop of the world, a frozen VM), not crashed, so the attempt
    /// is given back. Reported once each.
    pub paused: Vec<String>,
}

/// A wake-up hint from a shared store: [`Wakeup::notified`] completes when something it
/// watches may have changed on another node (or the store reconnected and everything should
/// be read again). A hint only: it can be lost, so a waiter also polls
/// ([`Cluster::poll_interval`]); a wake-up that fires between the watch's creation and the
/// wait is kept, not lost.
pub struct Wakeup {
    notify: Arc<tokio::sync::Notify>,
    // Dropped after `notify`: unregisters the watch.
    _registration: Option<Box<dyn Send + Sync>>,
}

impl fmt::Debug for Wakeup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wakeup").finish_non_exhaustive()
    }
}

impl Wakeup {
    /// A wake-up over `notify`; `registration` is dropped with it (a backend's unregistering
    /// guard).
    pub fn new(
        notify: Arc<tokio::sync::Notify>,
        registration: Option<Box<dyn Send + Sync>>,
    ) -> Wakeup {
        Wakeup {
            notify,
            _registration: registration,
        }
    }

    /// Waits for the next wake-up (or returns at once for one that fired since the last
    /// wait).
    pub async fn notified(&self) {
        self.notify.notified().await
    }
}

/// A `tasks/update` or `tasks/cancel` recorded for the node that runs the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteCommand {
    /// The command's sequence number (its key in the store).
    pub seq: u64,
    /// The task it is for.
    pub task_id: String,
    /// The command, encoded by the runtime.
    pub body: Vec<u8>,
}

/// The capability of a store shared by replicas ([`TaskStore::cluster`], see
/// docs/SCALE-OUT.md): per-node leases on live tasks (claims, fencing checks, reconciliation)
/// and cross-node signalling: wake-ups when another node commits a task, and requests for a task recorded durably for the node that
/// runs it, which answers them. Notifications are hints (PostgreSQL `NOTIFY` carrying ids
/// only); the store's rows are the truth, and every waiter polls as a fallback.
pub trait Cluster: Send + Sync {
    /// This process's node id.
    fn node_id(&self) -> &str;
    /// The live tasks this process runs at start: the ones no live node holds (and those
    /// this node id held before), *claimed*: their lease epochs are bumped.
    fn claim_live(&self) -> StoreFuture<'_, Vec<(String, Vec<u8>)>>;
    /// Claims at most `limit` live tasks whose node stopped renewing its lease (orphans),
    /// the first ones in id order past `after` (`""`: from the first), bumping their lease
    /// epochs; the runtime then runs them from their journal. A claimer that goes on past
    /// the greatest id of a full batch looks at each task once, so the claims of a takeover
    /// read rows in proportion to the orphans, not to their square; a task skipped (its row
    /// locked) is claimed at a later round from `""`.
    fn claim_orphans<'a>(
        &'a self,
        after: &'a str,
        limit: usize,
    ) -> StoreFuture<'a, Vec<(String, Vec<u8>)>>;
    /// Whether this process holds the lease of task `id`.
    fn holds(&self, id: &str) -> bool;
    /// How often the runtime looks for orphans to claim.
    fn claim_interval(&self) -> Duration;
    /// Takes the lease of live task `id` for this process (bumping its epoch) and returns its
    /// bytes; `None` if it is not stored or not live. Used when a request for a task reaches a
    /// node that does not run it and no live node holds it. Taken only from no node, this
    /// node, or a node whose lease lapsed: a task whose node renewed its lease since the
    /// caller looked is refused with [`StoreError::Busy`] (the request is retried and reaches
    /// that node), as is one whose row another session holds locked.
    fn claim_one<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Vec<u8>>>;
    /// Whether this process's claim of task `id` took it from a node that stopped without
    /// releasing it (crashed, killed, or paused past its lease), so that the run it had going
    /// counts against the task's restart budget. Answered once per claim.
    fn took_from_lapsed(&self, id: &str) -> bool;
    /// Confirms that this process still holds the lease of task `id` and that the stored
    /// record is at sequence number `seq`, without writing: an actor acknowledging a request
    /// that changes nothing checks it first, since only a write is fenced. Answers
    /// [`StoreError::Fenced`] when the lease moved (or [`StoreError::Conflict`] when the
    /// record moved under this process's own lease).
    fn confirm_lease<'a>(&'a self, id: &'a str, seq: u64) -> StoreFuture<'a, ()>;
    /// Compares the leases this process believes it holds with the ones the store records for
    /// it: see [`Reconciled`].
    fn reconcile(&self) -> StoreFuture<'_, Reconciled>;
    /// Wakes when a reconciliation is due sooner than the next claim interval (a commit
    /// whose outcome is unknown failed).
    fn watch_reconcile(&self) -> Wakeup;
    /// How often a waiter reads the store again when no wake-up came (the fallback for a
    /// lost notification).
    fn poll_interval(&self) -> Duration;
    /// How long a node may go without a heartbeat before its tasks are taken over.
    fn lease_ttl(&self) -> Duration;
    /// Wakes when task `id` may have been committed by any node, or a command for it was
    /// answered.
    fn watch_task(&self, id: &str) -> Wakeup;
    /// Wakes when commands may wait for this node ([`Cluster::inbox`]).
    fn watch_inbox(&self) -> Wakeup;
    /// Records `body` durably as a command for live task `id` and signals the node that holds
    /// its lease. `None` (nothing recorded) when no other live node holds it: the caller takes
    /// the task over instead.
    fn send_command<'a>(&'a self, id: &'a str, body: Vec<u8>) -> StoreFuture<'a, Option<u64>>;
    /// The answer of command `seq` once the node running its task gave one (the command is
    /// then forgotten); `None` while it waits.
    fn take_answer(&self, seq: u64) -> StoreFuture<'_, Option<Vec<u8>>>;
    /// Forgets command `seq` whatever its state (its task finished, nobody needs it any more).
    fn forget_command(&self, seq: u64) -> StoreFuture<'_, ()>;
    /// Unanswered commands for tasks this node holds, oldest first.
    fn inbox(&self) -> StoreFuture<'_, Vec<RemoteCommand>>;
    /// Marks command `seq` as taken by this node before it applies it; `false` when it was
    /// withdrawn by its sender (or answered) meanwhile: it must not be applied.
    fn take_command(&self, seq: u64) -> StoreFuture<'_, bool>;
    /// Withdraws command `seq` if no node has taken it yet (its sender gives up waiting);
    /// `true` = withdrawn: no node applies it, ever.
    fn withdraw_command(&self, seq: u64) -> StoreFuture<'_, bool>;
    /// Records the answer of command `seq` (for task `task_id`) and wakes its sender.
    fn answer_command<'a>(
        &'a self,
        seq: u64,
        task_id: &'a str,
        answer: Vec<u8>,
    ) -> StoreFuture<'a, ()>;
    /// The store's own clock (a database's `now()`), which every replica's decisions about
    /// time use instead of its local clock; `None`: the local clocks are trusted.
    fn reference_clock(&self) -> Option<Arc<crate::clock::ReferenceClock>> {
        None
    }
    /// The replicas with a heartbeat row, with the live tasks each holds the lease of (the
    /// operator console's overview).
    fn nodes(&self) -> StoreFuture<'_, Vec<listing::NodeInfo>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    /// Who holds the lease of task `id`, at which epoch; `None` when it is not stored.
    fn lease_of<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<listing::LeaseInfo>> {
        let _ = id;
        Box::pin(async { Ok(None) })
    }
    /// The ids of tasks any node commits, as the store's notifications carry them (hints:
    /// a receiver that lags misses some and is told so by the channel). `None` when the
    /// store does not signal them. The operator console follows every replica's tasks
    /// through it.
    fn watch_commits(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        None
    }
    /// One round of cluster-wide flow control, in one transaction that no other round runs
    /// beside: removes `round.leave` (this node's entries, by key and token), adds
    /// `round.enter` for this node, removes every entry whose node stopped heartbeating or
    /// whose task is no longer live under that node's lease (so a slot is held by a lease,
    /// never by a process's memory alone), asks `plan` which waiting entries start, records
    /// its decision, and signals the other nodes when a slot was freed or given to one of
    /// theirs. Answers the table as decided.
    fn flow_round<'a>(
        &'a self,
        round: flow::FlowRound,
        plan: &'a flow::FlowPlanner,
    ) -> StoreFuture<'a, flow::FlowTable>;
    /// Wakes when another node freed a slot or gave one to this node's entries.
    fn watch_flow(&self) -> Wakeup;
    /// Whether this node may answer a read of task `id` from its own committed snapshot: it
    /// holds the task's lease, and the lease is valid by a safety margin on this process's
    /// monotonic clock, counted from when its last acknowledged renewal was *sent* (no other
    /// node can take the task over before that renewal's time plus the TTL). `false` (the
    /// default): every read goes to the store.
    fn reads_from_memory(&self, id: &str) -> bool {
        let _ = id;
        false
    }
}

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
    /// A redb store on a [`StorageBackend`] instead of a file (feature `redb`); see
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
    /// On failure nothing of this call is stored. A job whose [`Expect`] fails gets
    /// [`StoreError::Conflict`] (or [`StoreError::Fenced`] on a shared store whose lease moved)
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

    /// One page of an owner's tasks; see [`TaskStore::owned`].
    pub async fn owned(
        &self,
        owner: &str,
        after: Option<OwnedCursor>,
        limit: usize,
    ) -> Result<Vec<OwnedRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut page = self.inner.owned(owner, after, limit.min(MAX_PAGE)).await?;
        // A host's backend may not stop at the byte bound: its page is cut here, so that
        // what the caller holds on is bounded whichever backend answered.
        page.truncate(records_within_bytes(page.iter().map(|r| r.bytes.len())));
        Ok(page)
    }

    /// What an owner holds; see [`TaskStore::usage`].
    pub async fn usage(&self, owner: &str) -> Result<Usage, StoreError> {
        self.inner.usage(owner).await
    }

    /// The usage of every owner; see [`TaskStore::usage_by_owner`].
    pub async fn usage_by_owner(&self) -> Result<Vec<(String, Usage)>, StoreError> {
        self.inner.usage_by_owner().await
    }

    /// [`TaskStore::listing`].
    pub async fn listing(
        &self,
        filter: &listing::ListingFilter,
        after: Option<listing::ListingCursor>,
        limit: usize,
        budget: usize,
    ) -> Result<listing::ListingPage, StoreError> {
        self.inner.listing(filter, after, limit, budget).await
    }

    /// [`TaskStore::listing_counts`].
    pub async fn listing_counts(&self) -> Result<Vec<listing::ListingCount>, StoreError> {
        self.inner.listing_counts().await
    }

    /// [`TaskStore::throughput`].
    pub async fn throughput(
        &self,
        since_ms: u64,
    ) -> Result<Vec<listing::ThroughputBucket>, StoreError> {
        self.inner.throughput(since_ms).await
    }

    /// [`TaskStore::stored_bytes`].
    pub async fn stored_bytes(&self) -> Result<Option<u64>, StoreError> {
        self.inner.stored_bytes().await
    }

    /// Counters since open.
    pub fn stats(&self) -> StoreStats {
        self.inner.stats()
    }

    /// Whether [`Store::close`] was called (on any clone).
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
    /// [`TaskStore::cluster`]). Then a task's latest state is the store's, not a local
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

    /// The capability of a store shared by replicas; see [`TaskStore::cluster`].
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
