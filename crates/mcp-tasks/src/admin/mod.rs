//! Operating a store without writing code: `mcp-tasks store …`.
//!
//! An operator's view of what a store holds — counts by status and tool, one task in full,
//! lists with filters — and the care it needs: a consistent backup while the server runs,
//! compaction, an integrity check, migration between redb and PostgreSQL, purging what an
//! operator decides must go. This is deliberately not a protocol method (the MCP Tasks
//! extension has no `tasks/list` for clients): it reads the store directly.
//!
//! How each backend is reached:
//!
//! - **redb, no server running:** the file is opened read-only (a shared lock) for the reading
//!   commands, and writable for `compact`, `purge`, `verify`'s integrity check and a
//!   migration's target. Nothing is changed by a reading command.
//! - **redb held by a running server:** redb lets one process hold the file, so the reading
//!   commands (`stats`, `list`, `show`, `verify` without the page check, `backup`) go through
//!   the server's admin socket, `<store>.admin.sock` beside the file (see [`socket`]): the
//!   server runs them in read transactions of its own, which never block its writer. Commands
//!   that write (`compact`, `purge`, migrating from or to the file) refuse while it is held.
//! - **PostgreSQL:** read directly with one connection; `purge` and `migrate` refuse while a
//!   node's heartbeat is fresh (a replica could be running the tasks).

mod backup;
mod compact;
mod list;
mod migrate;
mod purge;
mod show;
pub mod socket;
mod stats;
mod verify;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::persist;
use crate::store::inspect::StoreKind;
use crate::task::TaskRecord;

pub use backup::backup;
pub use compact::compact;
pub use list::list;
pub(crate) use list::list_of;
pub use migrate::migrate;
pub use purge::purge;
pub(crate) use purge::select;
pub use show::show;
pub(crate) use show::show_of;
pub use stats::{stats, usage_by_owner};
pub(crate) use stats::{stats_of, usage_of};
pub use verify::verify;
pub(crate) use verify::verify_of;

pub use crate::store::inspect::{
    AdminError, BackupReport, CompactReport, Lease, NodeInfo, OldestLive, Space, StatsReport,
    VerifyReport,
};
pub(crate) use crate::store::inspect::{Inspector, Row, SCAN_BATCH};

/// Where a store is: a path to a redb file or a PostgreSQL URL, with the kind of store that
/// serves it (the registered backend that claims it; see `store::kinds`).
#[derive(Clone)]
pub struct Location {
    kind: std::sync::Arc<dyn StoreKind>,
    text: String,
}

impl Location {
    /// A `postgres://…` or `postgresql://…` URL names a PostgreSQL database, anything else
    /// that is not a URL a redb file. A location of a backend this build lacks still parses:
    /// every command on it then says which cargo feature it needs.
    pub fn parse(s: &str) -> Location {
        Location {
            kind: crate::store::kind_of(s, &crate::persist::task_indexer()),
            text: s.to_owned(),
        }
    }

    /// The location as it may be printed (a URL without its password).
    pub fn display(&self) -> String {
        self.kind.display(&self.text)
    }

    /// The kind of store: `redb`, `postgres` (or the name of a backend this build lacks).
    pub fn kind(&self) -> &'static str {
        self.kind.name()
    }

    /// Whether the store is shared by replicas (each `serve` on it has a node id).
    pub fn is_shared(&self) -> bool {
        self.kind.is_shared()
    }

    /// The location as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    fn store_kind(&self) -> &dyn StoreKind {
        &*self.kind
    }
}

impl PartialEq for Location {
    fn eq(&self, other: &Self) -> bool {
        self.kind.name() == other.kind.name() && self.text == other.text
    }
}

impl Eq for Location {}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Location({}: {})", self.kind.name(), self.display())
    }
}

/// Which tasks a `list` or `purge` selects. Empty fields select everything.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Filter {
    /// Any of these statuses (wire spelling: `working`, `input_required`, `completed`,
    /// `failed`, `cancelled`).
    #[serde(default)]
    pub status: Vec<String>,
    /// This tool.
    #[serde(default)]
    pub tool: Option<String>,
    /// This tenant (of the task's owner).
    #[serde(default)]
    pub tenant: Option<String>,
    /// Created more than this long ago (milliseconds).
    #[serde(default)]
    pub older_than_ms: Option<u64>,
    /// At most this many tasks (`list`: a page; the default is 100).
    #[serde(default)]
    pub limit: Option<usize>,
    /// Only ids after this one (the `next` cursor of the previous page).
    #[serde(default)]
    pub after: Option<String>,
}

impl Filter {
    fn matches(&self, record: &TaskRecord, now_ms: u64) -> bool {
        (self.status.is_empty() || self.status.iter().any(|s| s == record.status.as_str()))
            && self.tool.as_ref().is_none_or(|t| *t == record.tool)
            && self
                .tenant
                .as_ref()
                .is_none_or(|t| *t == record.owner.tenant)
            && self
                .older_than_ms
                .is_none_or(|age| now_ms.saturating_sub(record.created_at_ms) > age)
    }
}

/// One line of `store list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSummary {
    /// The task id.
    pub id: String,
    /// Its status (`working`, `input_required`, …).
    pub status: String,
    /// Its tool.
    pub tool: String,
    /// Its owner's tenant.
    pub tenant: String,
    /// Created, in milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Last updated, in milliseconds since the Unix epoch.
    pub last_updated_at_ms: u64,
    /// Its sequence number.
    pub seq: u64,
    /// The status message, if any.
    pub status_message: Option<String>,
}

impl TaskSummary {
    fn of(record: &TaskRecord) -> Self {
        Self {
            id: record.id.to_string(),
            status: record.status.as_str().to_owned(),
            tool: record.tool.clone(),
            tenant: record.owner.tenant.clone(),
            created_at_ms: record.created_at_ms,
            last_updated_at_ms: record.last_updated_at_ms,
            seq: record.seq,
            status_message: record.status_message.clone(),
        }
    }
}

/// A page of `store list`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ListPage {
    /// The tasks, by id.
    pub tasks: Vec<TaskSummary>,
    /// Pass as `after` (`--after`) for the next page; `None` at the end.
    pub next: Option<String>,
    /// Records of the scanned range that do not decode (see `store verify`).
    pub undecodable: Vec<String>,
}

/// `store show`: one task in full.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskDetail {
    /// The summary line.
    pub summary: TaskSummary,
    /// The owner (tenant and principal).
    pub owner: Value,
    /// The snapshot encoding version of the stored bytes.
    pub snapshot_version: u32,
    /// Bytes of the stored snapshot.
    pub snapshot_bytes: usize,
    /// The arguments of the call.
    pub arguments: Value,
    /// Time to live from creation (ms); `None` = unlimited.
    pub ttl_ms: Option<u64>,
    /// When it expires (ms since the epoch).
    pub expires_at_ms: Option<u64>,
    /// When the reaper next looks at it (ms since the epoch).
    pub due_ms: Option<u64>,
    /// Runs of the tool since the task last made progress (the restart budget counts them).
    pub attempts: u32,
    /// Whether a client asked for cancellation.
    pub cancel_requested: bool,
    /// Committed steps, by name, with their recorded results.
    pub journal: BTreeMap<String, Value>,
    /// The attempt each committed step succeeded in, by step name: the run of the tool since
    /// the previous progress (1 = first run; 3 = two runs before it were lost to crashes, so
    /// the step may have executed up to three times). A step committed by a build older than
    /// snapshot format version 3 has no entry.
    pub step_attempts: BTreeMap<String, u32>,
    /// Every input key ever issued.
    pub input_keys_issued: Vec<String>,
    /// Keys still waiting for an answer, with their requests.
    pub input_requests_pending: BTreeMap<String, Value>,
    /// Answers received, by key.
    pub input_answers: BTreeMap<String, Value>,
    /// The outcome of a finished task (its result or error).
    pub outcome: Option<Value>,
    /// The lease on a shared store.
    pub lease: Option<Lease>,
}

/// `store stats --by-owner`: what each principal keeps in the store, from the usage counters
/// the store keeps with its records (no record is read). These are the figures the disk
/// quota (`serve --max-stored-bytes`) compares with its limit.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OwnerUsageReport {
    /// `redb` or `postgres`.
    pub backend: String,
    /// The location (a URL without password).
    pub location: String,
    /// Whether the figures came from a running server (its admin socket).
    pub via_server: bool,
    /// Each owner holding something, largest first (ties by tenant, then principal).
    pub owners: Vec<OwnerUsage>,
}

/// One line of [`OwnerUsageReport`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct OwnerUsage {
    /// The tenant.
    pub tenant: String,
    /// The principal within the tenant.
    pub principal: String,
    /// Stored tasks, live and finished (until the reaper deletes them).
    pub tasks: u64,
    /// Their stored bytes.
    pub bytes: u64,
}

/// `store migrate`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MigrateReport {
    /// The source.
    pub from: String,
    /// The target.
    pub to: String,
    /// Tasks written to the target (new or replaced).
    pub tasks: u64,
    /// Of them, live (resumable on the target).
    pub live: u64,
    /// Meta entries carried over.
    pub meta: u64,
    /// Tasks the target already held byte-identical (a re-run).
    pub unchanged: u64,
}

/// `store purge`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PurgeReport {
    /// The tasks selected (removed unless `dry_run`).
    pub tasks: Vec<TaskSummary>,
    /// Whether nothing was removed.
    pub dry_run: bool,
}

/// The default page of `store list`.
pub const DEFAULT_LIST_LIMIT: usize = 100;
/// The largest page of `store list` (a larger `--limit` is lowered to it; page on with
/// `--after`): what one answer holds in memory, also in a running server's.
pub const MAX_LIST_LIMIT: usize = 1000;
/// A store opened for reading.
pub(crate) type Reader = Box<dyn Inspector>;

/// Opens `location` for reading; `Ok(None)` when a running server holds the redb file (ask it
/// through its socket).
async fn open_reader(location: &Location) -> Result<Option<Reader>, AdminError> {
    location.store_kind().open(location.as_str()).await
}

/// A store a running server holds, and no socket to ask it through.
fn held(location: &Location) -> AdminError {
    AdminError::InUse {
        path: location.display(),
        detail: "it has no admin socket to answer through; stop the server or start it with its admin socket".into(),
    }
}

fn now_ms() -> u64 {
    crate::clock::Clock::now_ms(&crate::clock::SystemClock)
}

/// Decodes a stored snapshot for reporting.
fn decode(row: &Row) -> Result<TaskRecord, String> {
    persist::decode(&row.bytes).map_err(|e| e.to_string())
}

/// Without the `postgres` feature, every PostgreSQL location answers this.
/// A duration such as `90s`, `15m`, `2h`, `7d` or `250ms` (for `--older-than`): the syntax of
/// [`crate::units::parse_duration`], which it calls (a unit is required; overflow is refused).
pub fn parse_age(s: &str) -> Result<Duration, String> {
    crate::units::parse_duration(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::inspect::redact_url;

    #[test]
    fn urls_lose_their_password() {
        assert_eq!(
            redact_url("postgres://app:secret@db:5432/tasks"),
            "postgres://app@db:5432/tasks"
        );
        assert_eq!(redact_url("postgres://db/tasks"), "postgres://db/tasks");
        #[cfg(feature = "postgres")]
        assert!(Location::parse("postgresql://u@h/d").is_shared());
        assert_eq!(Location::parse("postgresql://u@h/d").kind(), "postgres");
        assert_eq!(Location::parse("t.redb").kind(), "redb");
        assert!(!Location::parse("t.redb").is_shared());
        assert_eq!(Location::parse("mysql://h/d").kind(), "unknown");
        assert_eq!(
            Location::parse("postgres://app:secret@db/tasks").display(),
            "postgres://app@db/tasks"
        );
    }

    #[test]
    fn ages_parse_with_units() {
        assert_eq!(parse_age("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_age("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_age("2d").unwrap(), Duration::from_secs(172_800));
        assert!(parse_age("15").unwrap_err().contains("unit"));
        assert!(parse_age("3w").unwrap_err().contains("unknown unit"));
        assert!(parse_age("m").is_err());
        assert!(parse_age("99999999999999999999d").is_err());
    }
}
