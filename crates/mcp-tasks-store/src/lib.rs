// On docs.rs (nightly, `--cfg docsrs`): each item gated by a feature says which.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![forbid(unsafe_code)]
//! Where tasks are persisted: the [`TaskStore`] trait and its backends. The store of
//! [mcp-tasks](https://crates.io/crates/mcp-tasks), which re-exports this crate as
//! `mcp_tasks::store`; it names no type of the runtime above it (a record is bytes, indexed
//! by the entries each write carries or, for records that come without them, by the
//! [`Indexer`] its user hands in).
//!
//! The store keeps opaque snapshot bytes keyed by task id, with the indexes the runtime
//! maintains through [`WriteOp::Put`] (live tasks, due times for the expiry reaper, the
//! sequence number for compare-and-set, the owner and listing entries) and a small meta table.
//! It never decodes a snapshot itself: where the runtime handed no owner and listing entries
//! (converting a store written before those indexes, and the administration commands that
//! copy records) it asks the [`Indexer`]. Every write is a [`Store::commit`] of a batch of
//! [`WriteOp`]s that is durable when it returns.
//!
//! Backends:
//!
//! - `RedbStore` (feature `redb`, on by default; `redb/`): one redb file owned by one
//!   process, one writer thread with group commit, fail-stop on a failed fsync.
//! - [`MemoryStore`]: nothing survives the process; for tests and for measuring what
//!   durability costs.
//! - `PostgresStore` (feature `postgres`; `postgres/`): one database shared by several
//!   replicas, with per-node leases and fencing (see docs/SCALE-OUT.md).
//!
//! [`Store`] is the cheap-to-clone handle the runtime holds, over any of them (or a host's own
//! [`TaskStore`]).
//!
//! The seam: [`TaskStore`] is what every backend implements; what only some backends do is a
//! capability reached through an accessor that answers `None` by default:
//! [`TaskStore::index`] ([`Index`]: the owner index, usage and the listing, which every
//! backend here keeps), [`TaskStore::cluster`] ([`Cluster`]: leases, fencing checks and
//! signalling of a store shared by replicas) and [`TaskStore::inspector`]
//! ([`inspect::Inspector`]: reading an open store for the `store …` commands). Each backend
//! keeps its code, inspection included, in its own folder, one concern per file.

mod clock;
mod cluster;
mod error;
pub mod flow;
mod handle;
pub mod inspect;
pub mod listing;
mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redb")]
pub(crate) mod redb;
pub mod telemetry;

use std::fmt;
use std::sync::Arc;

#[cfg(feature = "redb")]
use ::redb::StorageBackend;
use futures::future::BoxFuture;

#[cfg(feature = "redb")]
pub use self::redb::RedbStore;
pub use clock::ReferenceClock;
pub use cluster::{Cluster, Reconciled, RemoteCommand, Wakeup};
pub use error::{Cause, StoreError};
pub use handle::Store;
pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::{Lease, PostgresOptions, PostgresStore};

/// Every kind of store this build reaches by location (`mcp-tasks store …`, `serve --store`),
/// in the order they are asked whether a location is theirs: **a backend registers here, one
/// line**, and keeps everything else in its folder. A location none of them claims names a
/// backend this build lacks ([`kind_of`] says which feature it needs). Records a command
/// writes without their index entries (a migration's) are indexed by `indexer`.
pub fn kinds(indexer: &Arc<dyn Indexer>) -> Vec<Arc<dyn inspect::StoreKind>> {
    let _ = indexer;
    vec![
        #[cfg(feature = "postgres")]
        Arc::new(postgres::inspect::PostgresKind {
            indexer: indexer.clone(),
        }),
        #[cfg(feature = "redb")]
        Arc::new(redb::inspect::RedbKind {
            indexer: indexer.clone(),
        }),
    ]
}

/// The kind of store `location` names: the first registered kind ([`kinds`]) that claims
/// it, else a kind that refuses every operation, naming the cargo feature that would serve it
/// (a `postgres://` URL without `postgres`, a path without `redb`).
pub fn kind_of(location: &str, indexer: &Arc<dyn Indexer>) -> Arc<dyn inspect::StoreKind> {
    if let Some(kind) = kinds(indexer).into_iter().find(|k| k.claims(location)) {
        return kind;
    }
    let (name, message) = if location.starts_with("postgres://")
        || location.starts_with("postgresql://")
    {
        (
            "postgres",
            "this build has no PostgreSQL support (cargo feature `postgres`)",
        )
    } else if inspect::is_url(location) {
        (
            "unknown",
            "no store of this build is reached by this kind of URL (postgres:// and postgresql:// name PostgreSQL databases; anything else is a path to a redb file)",
        )
    } else {
        (
            "redb",
            "this build has no redb support (cargo feature `redb`)",
        )
    };
    Arc::new(inspect::Unsupported { name, message })
}

/// The meta key of the boot epoch (u64, little endian), incremented by every [`Store::open`].
pub const META_BOOT_EPOCH: &str = "boot_epoch";

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

/// The default of [`StoreOptions::cache_size`]: 8 MiB. A small cache keeps what an idle
/// server holds small (it fills with the pages that writes leave behind); a store read at
/// random across many stored tasks gains from a larger one (docs/BENCHMARKS.md, "redb's page
/// cache: memory against reads").
pub const DEFAULT_CACHE_SIZE: usize = 8 * 1024 * 1024;

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
    /// it; reads past it go to the operating system's page cache. Default 8 MiB
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
    /// How the records of a store written before the owner and listing indexes are indexed
    /// when it is converted ([`Indexer`]). Default [`NoIndexer`]: such a store is refused
    /// ([`StoreError::NeedsIndexer`]); the runtime sets its own.
    pub indexer: Arc<dyn Indexer>,
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
            indexer: Arc::new(NoIndexer),
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
        /// ([`Index::owned`], [`Index::usage`]). Never changes over a task's life;
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

/// How a record's index entries are read from its bytes: what the store's user (the runtime,
/// which alone knows what a record is) hands in. The store writes the owner and listing
/// entries that come with each [`WriteOp::Put`]; it asks an indexer only for records that come
/// without them: converting a store written before those indexes existed (an old redb layout,
/// an old PostgreSQL schema), and the administration commands that copy records between
/// stores (`store migrate`). Without one ([`NoIndexer`]) such records stay unindexed where
/// unindexed is safe, and a conversion that would have to index them refuses with
/// [`StoreError::NeedsIndexer`] instead.
pub trait Indexer: Send + Sync + fmt::Debug + 'static {
    /// The owner entry of `record`; `None` for bytes that do not decode as a record.
    fn owner(&self, record: &[u8]) -> Option<OwnerEntry>;
    /// The listing entry of `record`; `None` for bytes that do not decode as a record.
    fn listing(&self, record: &[u8]) -> Option<listing::Listing>;
    /// Whether this indexer reads records at all ([`NoIndexer`] does not).
    fn reads_records(&self) -> bool {
        true
    }
}

/// The indexer of a store opened without one: it reads nothing
/// ([`Indexer::reads_records`] is `false`).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoIndexer;

impl Indexer for NoIndexer {
    fn owner(&self, _: &[u8]) -> Option<OwnerEntry> {
        None
    }
    fn listing(&self, _: &[u8]) -> Option<listing::Listing> {
        None
    }
    fn reads_records(&self) -> bool {
        false
    }
}

/// Where a page of [`Index::owned`] starts: after this entry in (creation time, id)
/// order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct OwnedCursor {
    /// The creation time of the last entry of the previous page.
    pub created_ms: u64,
    /// Its id.
    pub id: String,
}

/// One entry of a [`Index::owned`] page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedRecord {
    /// The task id.
    pub id: String,
    /// When it was created (its place in the owner index).
    pub created_ms: u64,
    /// The snapshot bytes.
    pub bytes: Vec<u8>,
}

/// What one owner holds in a store: [`Index::usage`].
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

/// The most entries one [`Index::owned`] call returns,
/// whatever its caller asks: a page is what a request may hold in memory at once.
pub const MAX_PAGE: usize = 1000;

/// The record bytes past which one [`Index::owned`] call stops filling its page: the
/// page ends with the record that reaches this sum (a page always holds at least one record,
/// so a caller paging on from its last record always progresses). Records may be megabytes
/// each (their arguments and results), and a page of [`MAX_PAGE`] of them is what one
/// request would hold in memory.
pub const MAX_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// How many records of a page, of these sizes in order, fit [`MAX_PAGE_BYTES`] as
/// [`Index::owned`] counts: every record whose predecessors hold less than the bound
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

    /// The capability of indexes ([`Index`]): owners, usage, the listing. `None` (the
    /// default) for a host's own store that keeps none.
    fn index(&self) -> Option<&dyn Index> {
        None
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
    fn inspector(&self) -> Option<&dyn inspect::Inspector> {
        None
    }
}

/// The capability of indexes ([`TaskStore::index`]): the tasks of each owner, what each owner
/// holds, and the listing the console pages through, all kept by the commits that write the
/// records (from the entries each [`WriteOp::Put`] carries), so they are exact after a crash
/// and, on a shared store, the same for every replica. Every backend of this crate has it.
/// A host's own store without it serves no legacy `tasks/list` and no console listing, and
/// no disk quota applies to it.
pub trait Index: Send + Sync {
    /// One page of the tasks of `owner` (an [`owner_key`]), in (creation time, id) order,
    /// after `after`, at most `limit` (capped at [`MAX_PAGE`]) and, past its first record,
    /// no record once the page holds [`MAX_PAGE_BYTES`] of record bytes: a page may thus be
    /// shorter than `limit` with more to follow (the caller pages on after its last record
    /// until a page comes back empty or short of both bounds). Reads the owner index and
    /// the records of this page only: the cost does not depend on what other owners store.
    fn owned<'a>(
        &'a self,
        owner: &'a str,
        after: Option<OwnedCursor>,
        limit: usize,
    ) -> StoreFuture<'a, Vec<OwnedRecord>>;
    /// What `owner` (an [`owner_key`]) holds: its stored tasks and their bytes, finished
    /// ones included until the reaper deletes them. Kept with the records in the same
    /// transaction, so it is exact after a crash and, on a shared store, for every replica.
    fn usage<'a>(&'a self, owner: &'a str) -> StoreFuture<'a, Usage>;
    /// The usage of every owner that holds something, by [`owner_key`].
    fn usage_by_owner(&self) -> StoreFuture<'_, Vec<(String, Usage)>>;
    /// One page of the listing index ([`listing`]): the tasks `filter` keeps, newest first,
    /// after `after`, at most `limit` (capped at [`listing::MAX_LISTING_PAGE`]), looking at
    /// no more than `budget` index entries (the page then says where to go on). Reads one
    /// index (the owner's, the tool's, the status's or every task's: [`listing::ListingFilter::index`])
    /// from the cursor on: its cost is the entries it looks at, not the store's size.
    fn listing<'a>(
        &'a self,
        filter: &'a listing::ListingFilter,
        after: Option<listing::ListingCursor>,
        limit: usize,
        budget: usize,
    ) -> StoreFuture<'a, listing::ListingPage>;
    /// The stored tasks counted by (owner, tool, status), kept in the commits' transactions
    /// (exact after a crash, the same for every replica). Owner-tool-status triples with no
    /// task are left out.
    fn listing_counts(&self) -> StoreFuture<'_, Vec<listing::ListingCount>>;
    /// The throughput buckets ([`listing::ThroughputBucket`]) of the minutes from `since_ms`
    /// on (empty buckets left out).
    fn throughput(&self, since_ms: u64) -> StoreFuture<'_, Vec<listing::ThroughputBucket>>;
}

/// The error of a store without the listing index.
fn no_listing() -> StoreError {
    StoreError::Read(Cause::message("this store has no listing index"))
}
