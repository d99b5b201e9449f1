//! What store administration reads, backend by backend: the [`Inspector`] a backend hands the
//! `store …` commands for one store, and the types they exchange.
//!
//! Lives beside the backends (not in the library's `admin` module, which builds the commands on
//! it) so that each backend's folder holds its own inspection code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::{StoreError, Usage};

/// A boxed future of an inspection.
pub type InspectFuture<'a, T> = BoxFuture<'a, Result<T, AdminError>>;

/// One store opened for inspection (a file opened read-only, a database connection, or a
/// running server's own store): what the reading `store …` commands need from a backend.
/// Reached through [`crate::TaskStore::inspector`] on an open store (a running
/// server's admin socket), or opened by the backend's own code from a location.
pub trait Inspector: Send + Sync {
    /// At most `limit` rows (and about [`SCAN_BYTES`] of records, at least one) after id
    /// `after`, by id.
    fn scan(&self, after: Option<String>, limit: usize) -> InspectFuture<'_, Vec<Row>>;
    /// The row of task `id`.
    fn row<'a>(&'a self, id: &'a str) -> InspectFuture<'a, Option<Row>>;
    /// Index entries that disagree with the stored tasks (none for a backend that keeps its
    /// indexes in the task rows).
    fn index_problems(&self) -> InspectFuture<'_, Vec<String>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    /// Backend facts: everything of [`StatsReport`] that is not counted from the records.
    fn facts(&self, now_ms: u64) -> InspectFuture<'_, StatsReport>;
    /// The usage counters per owner key; `None` when the store's layout keeps none.
    fn usage_by_owner(&self) -> InspectFuture<'_, Option<Vec<(String, Usage)>>>;
    /// The file a running server's admin socket is named after (`None`: no socket).
    fn socket_file(&self) -> Option<PathBuf> {
        None
    }
    /// A consistent copy of the store into the new file `to` (a backend that is a file).
    fn backup<'a>(&'a self, to: &'a Path) -> InspectFuture<'a, BackupReport> {
        let _ = to;
        Box::pin(async {
            Err(AdminError::Unsupported(
                "this store cannot be backed up by copying it".into(),
            ))
        })
    }
}

/// A kind of store, as the `store …` commands reach it: by its location (a path or a URL)
/// rather than open in a runtime. Each backend's folder implements it beside its
/// [`Inspector`]; `store::kinds` (internal) lists them, one line per backend, and the first
/// that [claims](StoreKind::claims) a location serves it.
///
/// The offline operations default to a refusal naming the store's kind, for a backend that
/// has no such thing (PostgreSQL is not a file to back up or compact).
pub trait StoreKind: Send + Sync + 'static {
    /// Its name in messages and reports (`redb`, `postgres`).
    fn name(&self) -> &'static str;
    /// Whether `location` names a store of this kind.
    fn claims(&self, location: &str) -> bool;
    /// `location` as it may be printed (a URL without its password).
    fn display(&self, location: &str) -> String {
        if is_url(location) {
            redact_url(location)
        } else {
            location.to_owned()
        }
    }
    /// Whether stores of this kind are shared by replicas (each `serve` needs a node id).
    fn is_shared(&self) -> bool {
        false
    }
    /// A reader for the reading commands; `Ok(None)` when a running server holds the store
    /// and must be asked through its [admin socket](StoreKind::admin_socket) instead.
    fn open<'a>(&'a self, location: &'a str) -> InspectFuture<'a, Option<Box<dyn Inspector>>>;
    /// The admin socket a server holding the store at `location` answers on (`None`: the
    /// store can be read while servers run, or this kind has no socket).
    fn admin_socket(&self, location: &str) -> Option<PathBuf> {
        let _ = location;
        None
    }
    /// A reader for a command that is about to change the store (`what`, e.g. `store purge`):
    /// refuses while a server or replica may be running its tasks.
    fn open_exclusive<'a>(
        &'a self,
        location: &'a str,
        what: &'static str,
    ) -> InspectFuture<'a, Box<dyn Inspector>>;
    /// Deletes tasks `ids` (after [`StoreKind::open_exclusive`] allowed it).
    fn delete<'a>(&'a self, location: &'a str, ids: Vec<String>) -> InspectFuture<'a, ()>;
    /// Every task and meta entry, for `store migrate` (refuses while the store is in use).
    fn dump<'a>(&'a self, location: &'a str) -> InspectFuture<'a, Dump>;
    /// Writes a dump into the store (created if missing); `(written, unchanged)`.
    fn load<'a>(&'a self, location: &'a str, dump: Dump) -> InspectFuture<'a, (u64, u64)>;
    /// `store compact`: gives free space back.
    fn compact<'a>(&'a self, location: &'a str) -> InspectFuture<'a, CompactReport> {
        let _ = location;
        let name = self.name();
        Box::pin(async move {
            Err(AdminError::Unsupported(format!(
                "store compact does not apply to a {name} store"
            )))
        })
    }
    /// `store backup`: a consistent copy into the new file `to`.
    fn backup<'a>(&'a self, location: &'a str, to: &'a Path) -> InspectFuture<'a, BackupReport> {
        let _ = (location, to);
        let name = self.name();
        Box::pin(async move {
            Err(AdminError::Unsupported(format!(
                "store backup does not apply to a {name} store"
            )))
        })
    }
    /// For `store verify`: the store's own integrity check (redb's page checksums) with a
    /// reader of the store it leaves open; `Ok(None)` when this kind has no such check (the
    /// records and indexes are still verified).
    fn check_pages<'a>(&'a self, location: &'a str) -> InspectFuture<'a, Option<PageCheck>> {
        let _ = location;
        Box::pin(async { Ok(None) })
    }
}

/// What a store's own integrity check found ([`StoreKind::check_pages`]), with a reader of
/// the store it leaves open for the rest of `store verify`.
pub struct PageCheck {
    /// The store, open for reading.
    pub reader: Box<dyn Inspector>,
    /// The problem the check found, if any.
    pub problem: Option<String>,
}

/// The kind of a location no backend of this build claims: every operation refuses with
/// `message` (which names the cargo feature that would serve it, where there is one).
pub(crate) struct Unsupported {
    /// The name reports give it.
    pub(crate) name: &'static str,
    /// Why it cannot be opened.
    pub(crate) message: &'static str,
}

impl Unsupported {
    fn refuse<T: Send + 'static>(&self) -> InspectFuture<'static, T> {
        let message = self.message;
        Box::pin(async move { Err(AdminError::Unsupported(message.into())) })
    }
}

impl StoreKind for Unsupported {
    fn name(&self) -> &'static str {
        self.name
    }
    fn claims(&self, _location: &str) -> bool {
        true
    }
    fn open<'a>(&'a self, _location: &'a str) -> InspectFuture<'a, Option<Box<dyn Inspector>>> {
        self.refuse()
    }
    fn open_exclusive<'a>(
        &'a self,
        _location: &'a str,
        _what: &'static str,
    ) -> InspectFuture<'a, Box<dyn Inspector>> {
        self.refuse()
    }
    fn delete<'a>(&'a self, _location: &'a str, _ids: Vec<String>) -> InspectFuture<'a, ()> {
        self.refuse()
    }
    fn dump<'a>(&'a self, _location: &'a str) -> InspectFuture<'a, Dump> {
        self.refuse()
    }
    fn load<'a>(&'a self, _location: &'a str, _dump: Dump) -> InspectFuture<'a, (u64, u64)> {
        self.refuse()
    }
    fn compact<'a>(&'a self, _location: &'a str) -> InspectFuture<'a, CompactReport> {
        self.refuse()
    }
    fn backup<'a>(&'a self, _location: &'a str, _to: &'a Path) -> InspectFuture<'a, BackupReport> {
        self.refuse()
    }
}

/// The admin socket of a server holding the store file `store`: `<store>.admin.sock`.
pub fn admin_socket_path(store: &Path) -> PathBuf {
    let mut name = store.as_os_str().to_owned();
    name.push(".admin.sock");
    PathBuf::from(name)
}

/// Whether `location` is a URL (`scheme://…`) rather than a path.
pub(crate) fn is_url(location: &str) -> bool {
    location.split_once("://").is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    })
}

/// A URL without the password of its user info.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((user_info, host)) => {
            let user = user_info.split(':').next().unwrap_or("");
            format!("{scheme}://{user}@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

/// Said of a missing file named `memory`: the in-memory store of `serve` is no file.
fn memory_hint(path: &std::path::Path) -> &'static str {
    if path == std::path::Path::new("memory") {
        " (`serve --store memory` keeps its tasks in the server's memory, where no store command can read them)"
    } else {
        ""
    }
}

/// Errors of the store administration commands. Each is one line an operator can act on;
/// nothing was modified when one is returned (unless it says otherwise).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// No file at the path.
    #[error("{}: no such store file{}", .0.display(), memory_hint(.0))]
    NotFound(PathBuf),
    /// The file exists but is not an mcp-tasks store.
    #[error("{path} is not an mcp-tasks store: {detail}")]
    NotAStore {
        /// The location.
        path: String,
        /// Why.
        detail: String,
    },
    /// A running server holds the store and the command needs it for itself (or the server
    /// has no admin socket).
    #[error("{path} is held by a running mcp-tasks server: {detail}")]
    InUse {
        /// The location.
        path: String,
        /// What to do.
        detail: String,
    },
    /// The store was written by a newer mcp-tasks.
    #[error(
        "{store} has schema version {found}, newer than the {supported} this build supports; upgrade mcp-tasks (nothing was changed)"
    )]
    SchemaTooNew {
        /// The location.
        store: String,
        /// The version found.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// No task with this id.
    #[error("no task {0} in this store")]
    NoSuchTask(String),
    /// A bad argument (a malformed id, a target that exists, …).
    #[error("{0}")]
    Invalid(String),
    /// The store failed underneath.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// redb failed.
    #[error("{path}: {detail}")]
    Redb {
        /// The file.
        path: String,
        /// redb's message.
        detail: String,
    },
    /// PostgreSQL failed.
    #[error("{store}: {detail}")]
    Postgres {
        /// The redacted URL.
        store: String,
        /// The server's message.
        detail: String,
    },
    /// The running server refused or failed the request (its message).
    #[error("the running server: {0}")]
    Remote(String),
    /// The admin socket of a running server failed.
    #[error("the admin socket {}: {detail}", path.display())]
    Socket {
        /// The socket path.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
    /// This build lacks what the command needs.
    #[error("{0}")]
    Unsupported(String),
}

/// One stored task as the store keeps it.
#[derive(Debug, Clone)]
pub struct Row {
    /// The task id.
    pub id: String,
    /// The snapshot bytes.
    pub bytes: Vec<u8>,
    /// Its due time in the reaper's index.
    pub due_ms: Option<u64>,
    /// In the live index.
    pub live: bool,
    /// The stored sequence number (compare-and-set).
    pub seq: Option<u64>,
    /// Its lease on a shared store.
    pub lease: Option<Lease>,
}

/// Who holds a task on a shared (PostgreSQL) store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The node that runs the task (`None`: unclaimed, any node may take it).
    pub node: Option<String>,
    /// The lease epoch: bumped by every claim; writes are fenced on it.
    pub epoch: u64,
}

/// `store stats`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StatsReport {
    /// `redb` or `postgres`.
    pub backend: String,
    /// The location (a URL without password).
    pub location: String,
    /// Whether the figures came from a running server (its admin socket).
    pub via_server: bool,
    /// Schema version (PostgreSQL migrations) or table layout version (redb).
    pub schema_version: i64,
    /// Snapshot encoding versions of the stored records, with their counts.
    pub snapshot_versions: BTreeMap<String, u64>,
    /// The boot epoch (incremented by every open by a server).
    pub boot_epoch: Option<u64>,
    /// Stored tasks.
    pub tasks: u64,
    /// By status.
    pub by_status: BTreeMap<String, u64>,
    /// By tool.
    pub by_tool: BTreeMap<String, u64>,
    /// Non-terminal tasks.
    pub live: u64,
    /// Live tasks past their expiry (the reaper fails them at its next pass).
    pub due_for_expiry: u64,
    /// Finished tasks whose reaper entry is due (deleted at the reaper's next pass).
    pub due_for_deletion: u64,
    /// The oldest live task.
    pub oldest_live: Option<OldestLive>,
    /// Records that do not decode.
    pub undecodable: u64,
    /// Bytes of all stored snapshots.
    pub snapshot_bytes: u64,
    /// redb: the file; PostgreSQL: table sizes.
    pub space: Space,
    /// Nodes known to a shared store, with the age of their last heartbeat.
    pub nodes: Vec<NodeInfo>,
}

/// The oldest live task.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct OldestLive {
    /// Its id.
    pub id: String,
    /// Created (ms since the epoch).
    pub created_at_ms: u64,
    /// Its status.
    pub status: String,
}

/// Space used by a store.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Space {
    /// redb: the file size.
    pub file_bytes: Option<u64>,
    /// redb: bytes in pages that tables use (the rest of the file is free or redb's own).
    pub used_bytes: Option<u64>,
    /// redb: `file_bytes - used_bytes`, what `store compact` can give back at most.
    pub free_bytes: Option<u64>,
    /// PostgreSQL: total size of each table (with indexes and TOAST).
    pub tables: BTreeMap<String, u64>,
}

/// A node of a shared store.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The node id.
    pub node: String,
    /// Seconds since its last heartbeat.
    pub heartbeat_age_s: f64,
    /// Live tasks it holds.
    pub live_tasks: u64,
}

/// `store verify`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct VerifyReport {
    /// Records read.
    pub records: u64,
    /// Ids of records that do not decode, with why.
    pub undecodable: BTreeMap<String, String>,
    /// Index entries that name no stored task, or stored tasks missing from an index.
    pub index_problems: Vec<String>,
    /// Whether redb's page checksums were verified (needs the file for itself: not while a
    /// server holds it).
    pub pages_checked: bool,
    /// What redb's check found (`None` when it passed or did not run).
    pub pages_problem: Option<String>,
}

impl VerifyReport {
    /// No problem found.
    pub fn is_clean(&self) -> bool {
        self.undecodable.is_empty()
            && self.index_problems.is_empty()
            && self.pages_problem.is_none()
    }
}

/// `store backup`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BackupReport {
    /// The copy.
    pub to: String,
    /// Tasks copied.
    pub tasks: u64,
    /// Meta entries copied.
    pub meta: u64,
    /// Size of the copy.
    pub bytes: u64,
    /// Whether a running server made it (in one of its read transactions).
    pub via_server: bool,
}

/// `store compact`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CompactReport {
    /// File size before.
    pub before_bytes: u64,
    /// File size after.
    pub after_bytes: u64,
}

/// Records read per batch when scanning (at most; see [`SCAN_BYTES`]). A scan ends with an
/// empty batch.
pub const SCAN_BATCH: usize = 1024;

/// Bytes of records one scan batch holds at most (at least one record): records may be
/// megabytes each, and a running server answers `stats` and `list` in its own memory.
pub const SCAN_BYTES: usize = 16 * 1024 * 1024;

/// Everything a store holds, for a migration: every task row and every meta entry.
pub struct Dump {
    /// Every task row.
    pub rows: Vec<Row>,
    /// Every meta entry.
    pub meta: Vec<(String, Vec<u8>)>,
}
