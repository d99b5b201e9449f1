//! The redb side of store administration: reading a file (read-only when no server holds it,
//! or through the running server's own database), and the offline writes (compact, purge,
//! migration target).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{
    Database, DatabaseError, ReadOnlyDatabase, ReadOnlyTable, ReadTransaction, ReadableDatabase,
    ReadableTable, ReadableTableMetadata, StorageError, TableDefinition, TableError,
    WriteTransaction,
};

use super::file::{create_atomically, create_private_file};
use super::layout::{stored_schema_version, upgrade_layout};
use super::schema::{
    DUE, LISTING_COUNTERS, LISTING_INDEX, LIVE, ListingTables, META, META_SCHEMA_VERSION, OWNERS,
    OwnerTables, RecordHeader, SCHEMA_VERSION, TAILS, TASKS, USAGE, V1_DUE_BY_ID, V1_SEQ,
    V4_LISTING, V4_LISTING_BY, V4_LISTING_COUNTS, V4_THROUGHPUT, forget_tail, old_due,
    record_bytes, replace_due,
};
use crate::Indexer;
use crate::META_BOOT_EPOCH;
use crate::RedbStore;
use crate::inspect::{
    AdminError, BackupReport, CompactReport, Dump, InspectFuture, Inspector, PageCheck, Row,
    SCAN_BATCH, SCAN_BYTES, Space, StatsReport,
};
/// redb's default page size, used to turn page counts into bytes.
const PAGE_SIZE: u64 = 4096;

/// The database a reader reads.
enum Db {
    /// Opened read-only by this process (no server holds the file).
    ReadOnly(Arc<ReadOnlyDatabase>),
    /// Opened writable by this process: the file needed recovery, which a read-only open
    /// cannot do, or the command writes.
    Writable(Arc<Database>),
    /// The running server's store (admin socket).
    Server(RedbStore),
}

/// A redb store opened for reading.
pub(crate) struct RedbReader {
    path: PathBuf,
    db: Db,
}

fn redb_err(path: &Path, e: impl std::fmt::Display) -> AdminError {
    AdminError::Redb {
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}

/// Maps an error of opening a file to what the operator should hear.
fn open_error(path: &Path, e: DatabaseError) -> AdminError {
    let shown = path.display().to_string();
    match e {
        DatabaseError::DatabaseAlreadyOpen | DatabaseError::LockProtocolMismatch => {
            AdminError::InUse {
                path: shown,
                detail: "another process has it open".into(),
            }
        }
        DatabaseError::UpgradeRequired(v) => AdminError::NotAStore {
            path: shown,
            detail: format!("a redb file of an older format ({v}) this build cannot read"),
        },
        DatabaseError::Storage(StorageError::Corrupted(detail)) => AdminError::NotAStore {
            path: shown,
            detail: format!("not a redb database, or a damaged one ({detail})"),
        },
        DatabaseError::Storage(StorageError::Io(io))
            if io.kind() == std::io::ErrorKind::InvalidData =>
        {
            AdminError::NotAStore {
                path: shown,
                detail: format!("not a redb database ({io})"),
            }
        }
        other => redb_err(path, other),
    }
}

/// Runs blocking redb work off the tokio workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, AdminError> + Send + 'static,
) -> Result<T, AdminError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| AdminError::Invalid(format!("a blocking task failed: {e}")))?
}

fn check_exists(path: &Path) -> Result<(), AdminError> {
    match path.try_exists() {
        Ok(true) if path.is_file() => Ok(()),
        Ok(true) => Err(AdminError::NotAStore {
            path: path.display().to_string(),
            detail: "not a file".into(),
        }),
        Ok(false) => Err(AdminError::NotFound(path.to_path_buf())),
        Err(e) => Err(redb_err(path, e)),
    }
}

/// The table layout version a store records (1 when it records none).
fn schema_version(path: &Path, txn: &ReadTransaction) -> Result<u64, AdminError> {
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        Err(TableError::TableDoesNotExist(_)) => return Ok(1),
        Err(e) => return Err(redb_err(path, e)),
    };
    let value = meta
        .get(META_SCHEMA_VERSION)
        .map_err(|e| redb_err(path, e))?;
    stored_schema_version(value.as_ref().map(|v| v.value())).map_err(|detail| {
        AdminError::NotAStore {
            path: path.display().to_string(),
            detail,
        }
    })
}

/// The store's layout must be one this build knows (checked first: a newer layout may have
/// changed the tables' types), and its tables must exist (an empty redb file of another
/// program has none).
fn check_tables(path: &Path, txn: &ReadTransaction) -> Result<(), AdminError> {
    let found = schema_version(path, txn)?;
    if found > SCHEMA_VERSION {
        return Err(AdminError::SchemaTooNew {
            store: path.display().to_string(),
            found: i64::try_from(found).unwrap_or(i64::MAX),
            supported: SCHEMA_VERSION as i64,
        });
    }
    match txn.open_table(TASKS) {
        Ok(_) => Ok(()),
        Err(TableError::TableDoesNotExist(_)) => Err(AdminError::NotAStore {
            path: path.display().to_string(),
            detail: "a redb database without the `tasks` table".into(),
        }),
        Err(TableError::TableTypeMismatch { .. }) => Err(AdminError::NotAStore {
            path: path.display().to_string(),
            detail: "a redb database whose `tasks` table has other types".into(),
        }),
        Err(e) => Err(redb_err(path, e)),
    }
}

/// Opens `path` writable (redb recovers an uncleanly closed file). `AlreadyOpen` means a
/// server holds it.
fn open_writable(path: &Path) -> Result<Database, AdminError> {
    check_exists(path)?;
    // A writable open rewrites redb's header: look first (read-only) whether this is a store
    // this build may change at all. A file that needs recovery cannot be opened read-only;
    // its tables are checked after the writable open below.
    match ReadOnlyDatabase::open(path) {
        Ok(db) => {
            let txn = db.begin_read().map_err(|e| redb_err(path, e))?;
            check_tables(path, &txn)?;
        }
        Err(DatabaseError::RepairAborted) => {}
        Err(e) => return Err(open_error(path, e)),
    }
    let db = Database::builder()
        .open(path)
        .map_err(|e| open_error(path, e))?;
    let txn = db.begin_read().map_err(|e| redb_err(path, e))?;
    check_tables(path, &txn)?;
    drop(txn);
    Ok(db)
}

impl RedbReader {
    /// Opens `path` for reading. [`AdminError::InUse`] when a server holds it.
    pub(crate) async fn open(path: &Path) -> Result<RedbReader, AdminError> {
        let path = path.to_path_buf();
        blocking(move || {
            check_exists(&path)?;
            let db = match ReadOnlyDatabase::open(&path) {
                Ok(db) => Db::ReadOnly(Arc::new(db)),
                // The file was not closed cleanly (a crash, a kill): a read-only open cannot
                // recover it. Recover it as a server's start would.
                Err(DatabaseError::RepairAborted) => {
                    tracing::warn!(path = %path.display(),
                        "the store was not closed cleanly; redb recovers it (as a server start would)");
                    Db::Writable(Arc::new(open_writable(&path)?))
                }
                Err(e) => return Err(open_error(&path, e)),
            };
            let reader = RedbReader { path, db };
            reader.read_blocking(check_tables)??;
            Ok(reader)
        })
        .await
    }

    /// A reader over a running server's store (its admin socket).
    pub(crate) fn server(store: RedbStore, path: PathBuf) -> RedbReader {
        RedbReader {
            path,
            db: Db::Server(store),
        }
    }

    /// `f` in one read transaction, on the calling (blocking) thread. Not for `Db::Server`.
    fn read_blocking<T>(
        &self,
        f: impl FnOnce(&Path, &ReadTransaction) -> T,
    ) -> Result<T, AdminError> {
        let txn = match &self.db {
            Db::ReadOnly(db) => db.begin_read(),
            Db::Writable(db) => db.begin_read(),
            Db::Server(_) => {
                return Err(AdminError::Invalid(
                    "a server's store is read asynchronously".into(),
                ));
            }
        }
        .map_err(|e| redb_err(&self.path, e))?;
        Ok(f(&self.path, &txn))
    }

    /// `f` in one read transaction, off the tokio workers.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Path, &ReadTransaction) -> Result<T, AdminError> + Send + 'static,
    ) -> Result<T, AdminError> {
        let path = self.path.clone();
        match &self.db {
            Db::ReadOnly(db) => {
                let db = Arc::clone(db);
                blocking(move || {
                    let txn = db.begin_read().map_err(|e| redb_err(&path, e))?;
                    f(&path, &txn)
                })
                .await
            }
            Db::Writable(db) => {
                let db = Arc::clone(db);
                blocking(move || {
                    let txn = db.begin_read().map_err(|e| redb_err(&path, e))?;
                    f(&path, &txn)
                })
                .await
            }
            Db::Server(store) => store
                .read_txn(move |txn| Ok(f(&path, txn)))
                .await
                .map_err(AdminError::Store)?,
        }
    }

    pub(crate) async fn scan(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<Row>, AdminError> {
        self.read(move |path, txn| {
            let err = |e: &dyn std::fmt::Display| redb_err(path, e);
            let tasks = txn.open_table(TASKS).map_err(|e| err(&e))?;
            let indexes = Indexes::open(path, txn)?;
            let range = match &after {
                Some(a) => tasks.range::<&str>((
                    std::ops::Bound::Excluded(a.as_str()),
                    std::ops::Bound::Unbounded,
                )),
                None => tasks.range::<&str>(..),
            }
            .map_err(|e| err(&e))?;
            let mut out = Vec::new();
            let mut held = 0;
            for entry in range.take(limit) {
                let (id, bytes) = entry.map_err(|e| err(&e))?;
                held += bytes.value().len();
                out.push(indexes.row(path, id.value(), bytes.value())?);
                if held >= SCAN_BYTES {
                    break;
                }
            }
            Ok(out)
        })
        .await
    }

    pub(crate) async fn row(&self, id: &str) -> Result<Option<Row>, AdminError> {
        let id = id.to_owned();
        self.read(move |path, txn| {
            let err = |e: &dyn std::fmt::Display| redb_err(path, e);
            let tasks = txn.open_table(TASKS).map_err(|e| err(&e))?;
            let Some(bytes) = tasks.get(id.as_str()).map_err(|e| err(&e))? else {
                return Ok(None);
            };
            let indexes = Indexes::open(path, txn)?;
            indexes.row(path, &id, bytes.value()).map(Some)
        })
        .await
    }

    pub(crate) async fn facts(&self, _now_ms: u64) -> Result<StatsReport, AdminError> {
        let via_server = matches!(self.db, Db::Server(_));
        let file_bytes = std::fs::metadata(&self.path).ok().map(|m| m.len());
        let location = self.path.display().to_string();
        let (boot_epoch, used, schema) = self
            .read(move |path, txn| {
                let err = |e: &dyn std::fmt::Display| redb_err(path, e);
                let schema = schema_version(path, txn)?;
                let meta = txn.open_table(META).map_err(|e| err(&e))?;
                let epoch = meta
                    .get(META_BOOT_EPOCH)
                    .map_err(|e| err(&e))?
                    .and_then(|v| <[u8; 8]>::try_from(v.value()).ok())
                    .map(u64::from_le_bytes);
                let mut pages = 0u64;
                // Every table the file has (a layout-1 file also has `seq` and `due_by_id`, a
                // layout-4 file the four listing tables).
                macro_rules! add {
                    ($t:expr) => {{
                        if let Some(table) = open_optional(path, txn, $t)? {
                            let s = table.stats().map_err(|e| err(&e))?;
                            pages += s.leaf_pages() + s.branch_pages();
                        }
                    }};
                }
                add!(TASKS);
                add!(TAILS);
                add!(LIVE);
                add!(DUE);
                add!(META);
                add!(V1_DUE_BY_ID);
                add!(V1_SEQ);
                add!(OWNERS);
                add!(USAGE);
                add!(LISTING_INDEX);
                add!(LISTING_COUNTERS);
                add!(V4_LISTING);
                add!(V4_LISTING_BY);
                add!(V4_LISTING_COUNTS);
                add!(V4_THROUGHPUT);
                Ok((epoch, pages * PAGE_SIZE, schema))
            })
            .await?;
        Ok(StatsReport {
            backend: "redb".into(),
            location,
            via_server,
            schema_version: i64::try_from(schema).unwrap_or(i64::MAX),
            boot_epoch,
            space: Space {
                file_bytes,
                used_bytes: Some(used),
                free_bytes: file_bytes.map(|f| f.saturating_sub(used)),
                tables: BTreeMap::new(),
            },
            ..StatsReport::default()
        })
    }

    /// The per-owner usage table, by owner key; `None` for a file of a layout before it
    /// (converted by the next writable open).
    pub(crate) async fn usage_by_owner(
        &self,
    ) -> Result<Option<Vec<(String, crate::Usage)>>, AdminError> {
        self.read(|path, txn| {
            let err = |e: &dyn std::fmt::Display| redb_err(path, e);
            let Some(table) = open_optional(path, txn, USAGE)? else {
                return Ok(None);
            };
            let mut out = Vec::new();
            for entry in table.iter().map_err(|e| err(&e))? {
                let (owner, v) = entry.map_err(|e| err(&e))?;
                let (tasks, bytes) = v.value();
                out.push((owner.value().to_owned(), crate::Usage { tasks, bytes }));
            }
            Ok(Some(out))
        })
        .await
    }

    /// Index entries that name no stored task.
    pub(crate) async fn index_problems(&self) -> Result<Vec<String>, AdminError> {
        self.read(|path, txn| {
            let err = |e: &dyn std::fmt::Display| redb_err(path, e);
            let tasks = txn.open_table(TASKS).map_err(|e| err(&e))?;
            let mut problems = Vec::new();
            // Ids an index names that are not stored.
            let mut orphans = |index: &str, ids: Vec<String>| -> Result<(), AdminError> {
                for id in ids {
                    if tasks.get(id.as_str()).map_err(|e| err(&e))?.is_none() {
                        problems.push(format!("the {index} index names {id} which is not stored"));
                    }
                }
                Ok(())
            };
            let live = txn.open_table(LIVE).map_err(|e| err(&e))?;
            orphans("live", ids_of(path, &live)?)?;
            if let Some(tails) = open_optional(path, txn, TAILS)? {
                orphans("tails", ids_of(path, &tails)?)?;
            }
            let due = txn.open_table(DUE).map_err(|e| err(&e))?;
            if schema_version(path, txn)? < 2 {
                let due_by_id = txn.open_table(V1_DUE_BY_ID).map_err(|e| err(&e))?;
                let ids = due_by_id
                    .iter()
                    .map_err(|e| err(&e))?
                    .map(|e| e.map(|(id, _)| id.value().to_owned()).map_err(|e| err(&e)))
                    .collect::<Result<Vec<_>, _>>()?;
                orphans("expiry", ids)?;
                for entry in due.iter().map_err(|e| err(&e))? {
                    let (key, _) = entry.map_err(|e| err(&e))?;
                    let (at, id) = key.value();
                    if due_by_id.get(id).map_err(|e| err(&e))?.map(|v| v.value()) != Some(at) {
                        problems.push(format!(
                            "the expiry index entry ({at}, {id}) has no reverse entry"
                        ));
                    }
                }
            } else {
                // Layout 2: the due time is in the record's header; the index must hold
                // exactly that entry for every record, and none for an id not stored.
                let mut indexed = std::collections::HashMap::<String, u64>::new();
                for entry in due.iter().map_err(|e| err(&e))? {
                    let (key, _) = entry.map_err(|e| err(&e))?;
                    let (at, id) = key.value();
                    let header = match tasks.get(id).map_err(|e| err(&e))? {
                        None => {
                            problems
                                .push(format!("the expiry index names {id} which is not stored"));
                            continue;
                        }
                        Some(value) => RecordHeader::decode(value.value()).map(|(h, _)| h),
                    };
                    match header {
                        Ok(header) if header.due_ms == Some(at) => {
                            indexed.insert(id.to_owned(), at);
                        }
                        Ok(_) => problems.push(format!(
                            "the expiry index entry ({at}, {id}) differs from the task's due time"
                        )),
                        Err(detail) => problems.push(format!("the record of {id}: {detail}")),
                    }
                }
                for entry in tasks.iter().map_err(|e| err(&e))? {
                    let (id, value) = entry.map_err(|e| err(&e))?;
                    if let Ok((header, _)) = RecordHeader::decode(value.value())
                        && let Some(at) = header.due_ms
                        && indexed.get(id.value()) != Some(&at)
                    {
                        problems.push(format!(
                            "{} is due at {at} but the expiry index has no such entry",
                            id.value()
                        ));
                    }
                }
            }
            Ok(problems)
        })
        .await
    }

    /// A consistent copy in one read transaction, verified by reopening it.
    pub(crate) async fn backup(&self, to: &Path) -> Result<BackupReport, AdminError> {
        let to = to.to_path_buf();
        let via_server = matches!(self.db, Db::Server(_));
        let target = to.clone();
        let (tasks, meta) = self
            .read(move |path, txn| copy_into(path, txn, &target))
            .await?;
        // Verify the copy by opening it and counting what it holds.
        let check = to.clone();
        let copied = blocking(move || {
            let db = ReadOnlyDatabase::open(&check).map_err(|e| open_error(&check, e))?;
            let txn = db.begin_read().map_err(|e| redb_err(&check, e))?;
            let t = txn.open_table(TASKS).map_err(|e| redb_err(&check, e))?;
            t.len().map_err(|e| redb_err(&check, e))
        })
        .await?;
        if copied != tasks {
            return Err(AdminError::Invalid(format!(
                "the backup {} holds {copied} tasks, the source {tasks}; it is not usable",
                to.display()
            )));
        }
        let bytes = std::fs::metadata(&to).map(|m| m.len()).unwrap_or(0);
        Ok(BackupReport {
            to: to.display().to_string(),
            tasks,
            meta,
            bytes,
            via_server,
        })
    }

    /// Every row and meta entry (a migration's source).
    pub(crate) async fn dump(&self) -> Result<Dump, AdminError> {
        let meta = self
            .read(|path, txn| {
                let err = |e: &dyn std::fmt::Display| redb_err(path, e);
                let meta = txn.open_table(META).map_err(|e| err(&e))?;
                let mut out = Vec::new();
                for entry in meta.iter().map_err(|e| err(&e))? {
                    let (k, v) = entry.map_err(|e| err(&e))?;
                    // The layout version describes this file, not the data: a target keeps
                    // its own.
                    if k.value() != META_SCHEMA_VERSION {
                        out.push((k.value().to_owned(), v.value().to_vec()));
                    }
                }
                Ok(out)
            })
            .await?;
        let mut rows = Vec::new();
        let mut after = None;
        loop {
            let batch = self.scan(after.clone(), SCAN_BATCH).await?;
            let Some(last) = batch.last() else { break };
            after = Some(last.id.clone());
            rows.extend(batch);
        }
        Ok(Dump { rows, meta })
    }
}

impl Inspector for RedbReader {
    fn scan(&self, after: Option<String>, limit: usize) -> InspectFuture<'_, Vec<Row>> {
        Box::pin(RedbReader::scan(self, after, limit))
    }

    fn row<'a>(&'a self, id: &'a str) -> InspectFuture<'a, Option<Row>> {
        Box::pin(RedbReader::row(self, id))
    }

    fn index_problems(&self) -> InspectFuture<'_, Vec<String>> {
        Box::pin(RedbReader::index_problems(self))
    }

    fn facts(&self, now_ms: u64) -> InspectFuture<'_, StatsReport> {
        Box::pin(RedbReader::facts(self, now_ms))
    }

    fn usage_by_owner(&self) -> InspectFuture<'_, Option<Vec<(String, crate::Usage)>>> {
        Box::pin(RedbReader::usage_by_owner(self))
    }

    fn socket_file(&self) -> Option<PathBuf> {
        matches!(self.db, Db::Server(_)).then(|| self.path.clone())
    }

    fn backup<'a>(&'a self, to: &'a Path) -> InspectFuture<'a, BackupReport> {
        Box::pin(RedbReader::backup(self, to))
    }
}

/// A running server's store read for its admin socket ([`crate::TaskStore::inspector`]):
/// each request through a reader of the open database (the server's reader threads and
/// transactions), so reads see exactly what the server committed.
impl Inspector for RedbStore {
    fn scan(&self, after: Option<String>, limit: usize) -> InspectFuture<'_, Vec<Row>> {
        let reader = self.reader();
        Box::pin(async move { reader.scan(after, limit).await })
    }

    fn row<'a>(&'a self, id: &'a str) -> InspectFuture<'a, Option<Row>> {
        let reader = self.reader();
        Box::pin(async move { reader.row(id).await })
    }

    fn index_problems(&self) -> InspectFuture<'_, Vec<String>> {
        let reader = self.reader();
        Box::pin(async move { reader.index_problems().await })
    }

    fn facts(&self, now_ms: u64) -> InspectFuture<'_, StatsReport> {
        let reader = self.reader();
        Box::pin(async move { reader.facts(now_ms).await })
    }

    fn usage_by_owner(&self) -> InspectFuture<'_, Option<Vec<(String, crate::Usage)>>> {
        let reader = self.reader();
        Box::pin(async move { reader.usage_by_owner().await })
    }

    fn socket_file(&self) -> Option<PathBuf> {
        Some(self.path().to_owned())
    }

    fn backup<'a>(&'a self, to: &'a Path) -> InspectFuture<'a, BackupReport> {
        let reader = self.reader();
        Box::pin(async move { reader.backup(to).await })
    }
}

impl RedbStore {
    /// A reader of this open store, for one admin request.
    fn reader(&self) -> RedbReader {
        RedbReader::server(self.clone(), self.path().to_owned())
    }
}

/// Every key of a table keyed by task id.
fn ids_of<V: redb::Value + 'static>(
    path: &Path,
    table: &ReadOnlyTable<&'static str, V>,
) -> Result<Vec<String>, AdminError> {
    let err = |e: &dyn std::fmt::Display| redb_err(path, e);
    table
        .iter()
        .map_err(|e| err(&e))?
        .map(|e| e.map(|(id, _)| id.value().to_owned()).map_err(|e| err(&e)))
        .collect()
}

/// A table that a store may lack (`seq` and `due_by_id` exist only in layout 1; a layout-1
/// file written before sequence numbers were kept has no `seq`; `tails` only from layout 6).
fn open_optional<K: redb::Key + 'static, V: redb::Value + 'static>(
    path: &Path,
    txn: &ReadTransaction,
    table: TableDefinition<K, V>,
) -> Result<Option<ReadOnlyTable<K, V>>, AdminError> {
    match txn.open_table(table) {
        Ok(t) => Ok(Some(t)),
        Err(TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(redb_err(path, e)),
    }
}

/// Where a [`Row`] finds its facts beside the snapshot bytes: the record header (layout 2) or
/// the layout-1 index tables.
struct Indexes {
    live: ReadOnlyTable<&'static str, ()>,
    /// Layout 6: the records' tails kept apart.
    tails: Option<ReadOnlyTable<&'static str, &'static [u8]>>,
    /// Layout 1: `due_by_id` and `seq`, when the file has them.
    v1: Option<(Option<IdTable>, Option<IdTable>)>,
}

/// A layout-1 index table: id → u64.
type IdTable = ReadOnlyTable<&'static str, u64>;

impl Indexes {
    fn open(path: &Path, txn: &ReadTransaction) -> Result<Indexes, AdminError> {
        let live = txn.open_table(LIVE).map_err(|e| redb_err(path, e))?;
        let v1 = if schema_version(path, txn)? < 2 {
            Some((
                open_optional(path, txn, V1_DUE_BY_ID)?,
                open_optional(path, txn, V1_SEQ)?,
            ))
        } else {
            None
        };
        let tails = open_optional(path, txn, TAILS)?;
        Ok(Indexes { live, tails, v1 })
    }

    /// The row of `id` from its `tasks` value. A layout-2 record with a damaged header keeps
    /// its bytes whole (they fail to decode, naming the task).
    fn row(&self, path: &Path, id: &str, value: &[u8]) -> Result<Row, AdminError> {
        let err = |e: redb::StorageError| redb_err(path, e);
        let (bytes, due_ms, seq) = match &self.v1 {
            Some((due, seq)) => {
                let get = |t: &Option<IdTable>| match t {
                    Some(t) => t.get(id).map(|v| v.map(|v| v.value())),
                    None => Ok(None),
                };
                (
                    value.to_vec(),
                    get(due).map_err(err)?,
                    get(seq).map_err(err)?,
                )
            }
            None => match RecordHeader::decode(value) {
                Ok((header, _)) => (
                    record_bytes(id, value, self.tails.as_ref()).map_err(err)?,
                    header.due_ms,
                    header.seq,
                ),
                Err(_) => (value.to_vec(), None, None),
            },
        };
        Ok(Row {
            id: id.to_owned(),
            bytes,
            due_ms,
            live: self.live.get(id).map_err(err)?.is_some(),
            seq,
            lease: None,
        })
    }
}

/// Copies every table of `txn` into a new file at `to` (created `0600`, never overwritten).
fn copy_into(path: &Path, txn: &ReadTransaction, to: &Path) -> Result<(u64, u64), AdminError> {
    let err = |e: &dyn std::fmt::Display| redb_err(path, e);
    let terr = |e: &dyn std::fmt::Display| redb_err(to, e);
    create_private_file(to)
        .map_err(|e| AdminError::Invalid(format!("cannot create {}: {e}", to.display())))?;
    let result = (|| {
        let db = Database::create(to).map_err(|e| terr(&e))?;
        let w = db.begin_write().map_err(|e| terr(&e))?;
        let mut tasks = 0;
        let mut metas = 0;
        {
            macro_rules! copy {
                ($t:expr, $count:expr) => {{
                    let src = txn.open_table($t).map_err(|e| err(&e))?;
                    let mut dst = w.open_table($t).map_err(|e| terr(&e))?;
                    for entry in src.iter().map_err(|e| err(&e))? {
                        let (k, v) = entry.map_err(|e| err(&e))?;
                        dst.insert(k.value(), v.value()).map_err(|e| terr(&e))?;
                        $count += 1;
                    }
                }};
            }
            // Every table the source has: the copy keeps its layout.
            let mut ignored = 0u64;
            copy!(TASKS, tasks);
            copy!(META, metas);
            copy!(LIVE, ignored);
            copy!(DUE, ignored);
            if open_optional(path, txn, V1_DUE_BY_ID)?.is_some() {
                copy!(V1_DUE_BY_ID, ignored);
            }
            if open_optional(path, txn, V1_SEQ)?.is_some() {
                copy!(V1_SEQ, ignored);
            }
            if open_optional(path, txn, TAILS)?.is_some() {
                copy!(TAILS, ignored);
            }
            let _ = ignored;
        }
        w.commit().map_err(|e| terr(&e))?;
        drop(db);
        Ok((tasks, metas))
    })();
    if result.is_err() {
        // Never leave a half-written backup behind.
        let _ = std::fs::remove_file(to);
    }
    result
}

/// `store verify`'s page check on a file no server holds: redb's integrity check, and a reader
/// on the checked file (to decode every record and check the indexes) with what the check
/// found. [`AdminError::InUse`] when a server holds it.
pub(crate) async fn check_pages(path: &Path) -> Result<(RedbReader, Option<String>), AdminError> {
    let p = path.to_path_buf();
    let (db, problem) = blocking(move || {
        let mut db = open_writable(&p)?;
        let problem = match db.check_integrity() {
            Ok(true) => None,
            Ok(false) => Some("redb found damaged pages and repaired the file".to_owned()),
            Err(e) => Some(format!("redb's page check failed: {e}")),
        };
        Ok((db, problem))
    })
    .await?;
    let reader = RedbReader {
        path: path.to_path_buf(),
        db: Db::Writable(Arc::new(db)),
    };
    Ok((reader, problem))
}

/// `store compact` (offline).
pub(crate) async fn compact(path: &Path) -> Result<CompactReport, AdminError> {
    let p = path.to_path_buf();
    blocking(move || {
        let before_bytes = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        let mut db = match open_writable(&p) {
            Err(AdminError::InUse { path, .. }) => {
                return Err(AdminError::InUse {
                    path,
                    detail: "store compact needs the file for itself; stop the server first (nothing was changed)".into(),
                });
            }
            other => other?,
        };
        while db.compact().map_err(|e| redb_err(&p, e))? {}
        drop(db);
        let after_bytes = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        Ok(CompactReport {
            before_bytes,
            after_bytes,
        })
    })
    .await
}

/// Removes tasks and all their index entries, in one durable commit (offline).
pub(crate) async fn delete(
    path: &Path,
    ids: Vec<String>,
    indexer: Arc<dyn Indexer>,
) -> Result<(), AdminError> {
    let p = path.to_path_buf();
    blocking(move || {
        let db = match open_writable(&p) {
            Err(AdminError::InUse { path, .. }) => {
                return Err(AdminError::InUse {
                    path,
                    detail: "store purge needs the file for itself; stop the server first (nothing was changed)".into(),
                });
            }
            other => other?,
        };
        let err = |e: &dyn std::fmt::Display| redb_err(&p, e);
        let w = db.begin_write().map_err(|e| err(&e))?;
        upgrade(&p, &w, &*indexer)?;
        {
            let mut tasks = w.open_table(TASKS).map_err(|e| err(&e))?;
            let mut live = w.open_table(LIVE).map_err(|e| err(&e))?;
            let mut due = w.open_table(DUE).map_err(|e| err(&e))?;
            let mut tails = w.open_table(TAILS).map_err(|e| err(&e))?;
            let mut owners = OwnerTables::open(&w).map_err(|e| err(&e))?;
            let mut listing = ListingTables::open(&w).map_err(|e| err(&e))?;
            for id in &ids {
                let removed = tasks.remove(id.as_str()).map_err(|e| err(&e))?;
                if let Some(value) = &removed {
                    owners
                        .account(id, value.value(), -1)
                        .map_err(|e| err(&e))?;
                    listing.forget(id, value.value()).map_err(|e| err(&e))?;
                    forget_tail(&mut tails, id, value.value()).map_err(|e| err(&e))?;
                }
                let old = old_due(removed.as_ref().map(|v| v.value()));
                live.remove(id.as_str()).map_err(|e| err(&e))?;
                replace_due(&mut due, id, old, None).map_err(|e| err(&e))?;
            }
            owners.flush().map_err(|e| err(&e))?;
            listing.flush().map_err(|e| err(&e))?;
        }
        w.commit().map_err(|e| err(&e))?;
        Ok(())
    })
    .await
}

/// Everything a file holds, for a migration. Refuses a file a server holds.
pub(crate) async fn dump(path: &Path) -> Result<Dump, AdminError> {
    match RedbReader::open(path).await {
        Ok(reader) => reader.dump().await,
        Err(AdminError::InUse { path, .. }) => Err(AdminError::InUse {
            path,
            detail: "store migrate needs the source for itself; stop the server first (nothing was changed)".into(),
        }),
        Err(e) => Err(e),
    }
}

/// Writes a dump into a redb file (created when missing), in one durable commit. Returns
/// (tasks written, tasks already identical).
pub(crate) async fn load(
    path: &Path,
    dump: Dump,
    indexer: Arc<dyn Indexer>,
) -> Result<(u64, u64), AdminError> {
    let p = path.to_path_buf();
    blocking(move || {
        if !p.exists() {
            // A new store, created the way a server creates one (atomically, 0600).
            create_atomically(&p).map_err(AdminError::Store)?;
        }
        let db = match open_writable(&p) {
            Err(AdminError::InUse { path, .. }) => {
                return Err(AdminError::InUse {
                    path,
                    detail: "store migrate needs the target for itself; stop the server first (nothing was changed)".into(),
                });
            }
            other => other?,
        };
        let err = |e: &dyn std::fmt::Display| redb_err(&p, e);
        let w = db.begin_write().map_err(|e| err(&e))?;
        upgrade(&p, &w, &*indexer)?;
        let mut written = 0;
        let mut unchanged = 0;
        {
            let mut tasks = w.open_table(TASKS).map_err(|e| err(&e))?;
            let mut live = w.open_table(LIVE).map_err(|e| err(&e))?;
            let mut due = w.open_table(DUE).map_err(|e| err(&e))?;
            let mut meta = w.open_table(META).map_err(|e| err(&e))?;
            let mut tails = w.open_table(TAILS).map_err(|e| err(&e))?;
            let mut owners = OwnerTables::open(&w).map_err(|e| err(&e))?;
            let mut listing = ListingTables::open(&w).map_err(|e| err(&e))?;
            for row in &dump.rows {
                let id = row.id.as_str();
                // Written whole (a migration does not know which bytes never change).
                let value = RecordHeader {
                    seq: row.seq,
                    due_ms: row.due_ms,
                    owner: indexer.owner(&row.bytes),
                    tail: None,
                }
                .encode(&row.bytes);
                let (same, old) = match tasks.get(id).map_err(|e| err(&e))? {
                    Some(v) => {
                        let same = v.value() == value.as_slice();
                        if !same {
                            owners.account(id, v.value(), -1).map_err(|e| err(&e))?;
                            listing.forget(id, v.value()).map_err(|e| err(&e))?;
                            forget_tail(&mut tails, id, v.value()).map_err(|e| err(&e))?;
                        }
                        (same, old_due(Some(v.value())))
                    }
                    None => (false, old_due(None)),
                };
                if same {
                    unchanged += 1;
                } else {
                    owners.account(id, &value, 1).map_err(|e| err(&e))?;
                    listing
                        .remember(id, &value, &*indexer)
                        .map_err(|e| err(&e))?;
                    tasks.insert(id, value.as_slice()).map_err(|e| err(&e))?;
                    written += 1;
                }
                if row.live {
                    live.insert(id, ()).map_err(|e| err(&e))?;
                } else {
                    live.remove(id).map_err(|e| err(&e))?;
                }
                replace_due(&mut due, id, old, row.due_ms).map_err(|e| err(&e))?;
            }
            owners.flush().map_err(|e| err(&e))?;
            listing.flush().map_err(|e| err(&e))?;
            for (key, value) in &dump.meta {
                if key == META_SCHEMA_VERSION {
                    continue; // the target's own (written when it was created)
                }
                if key == META_BOOT_EPOCH {
                    // Never move a boot epoch backwards: keep the larger one.
                    let theirs = <[u8; 8]>::try_from(value.as_slice()).map(u64::from_le_bytes).unwrap_or(0);
                    let ours = meta
                        .get(key.as_str())
                        .map_err(|e| err(&e))?
                        .and_then(|v| <[u8; 8]>::try_from(v.value()).ok())
                        .map(u64::from_le_bytes)
                        .unwrap_or(0);
                    let epoch = theirs.max(ours);
                    meta.insert(key.as_str(), epoch.to_le_bytes().as_slice())
                        .map_err(|e| err(&e))?;
                } else {
                    meta.insert(key.as_str(), value.as_slice()).map_err(|e| err(&e))?;
                }
            }
        }
        w.commit().map_err(|e| err(&e))?;
        Ok((written, unchanged))
    })
    .await
}

/// Brings the file of `w` to this build's layout in the same transaction as a command's
/// writes (a layout-1 file is converted, as a server's start would convert it).
fn upgrade(path: &Path, w: &WriteTransaction, indexer: &dyn Indexer) -> Result<(), AdminError> {
    match upgrade_layout(w, indexer) {
        Ok(Some(records)) => {
            tracing::info!(path = %path.display(), records,
                "converted the task store to table layout {SCHEMA_VERSION}");
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => Err(AdminError::Store(e.into_store_error(path))),
    }
}

/// redb files as the `store …` commands reach them: every location that is not a URL is a
/// path to one. A file a running server holds is read through its admin socket. Records a
/// command writes without their index entries (a migration's) are indexed by `indexer`.
pub(crate) struct RedbKind {
    pub(crate) indexer: Arc<dyn Indexer>,
}

impl crate::inspect::StoreKind for RedbKind {
    fn name(&self) -> &'static str {
        "redb"
    }

    fn claims(&self, location: &str) -> bool {
        !crate::inspect::is_url(location)
    }

    fn open<'a>(&'a self, location: &'a str) -> InspectFuture<'a, Option<Box<dyn Inspector>>> {
        Box::pin(async move {
            match RedbReader::open(Path::new(location)).await {
                Ok(reader) => Ok(Some(Box::new(reader) as Box<dyn Inspector>)),
                Err(AdminError::InUse { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    fn admin_socket(&self, location: &str) -> Option<PathBuf> {
        Some(crate::inspect::admin_socket_path(Path::new(location)))
    }

    fn open_exclusive<'a>(
        &'a self,
        location: &'a str,
        what: &'static str,
    ) -> InspectFuture<'a, Box<dyn Inspector>> {
        Box::pin(async move {
            match RedbReader::open(Path::new(location)).await {
                Ok(reader) => Ok(Box::new(reader) as Box<dyn Inspector>),
                Err(AdminError::InUse { path, .. }) => Err(AdminError::InUse {
                    path,
                    detail: format!(
                        "{what} needs the file for itself; stop the server first (nothing was changed)"
                    ),
                }),
                Err(e) => Err(e),
            }
        })
    }

    fn delete<'a>(&'a self, location: &'a str, ids: Vec<String>) -> InspectFuture<'a, ()> {
        Box::pin(delete(Path::new(location), ids, self.indexer.clone()))
    }

    fn dump<'a>(&'a self, location: &'a str) -> InspectFuture<'a, Dump> {
        Box::pin(dump(Path::new(location)))
    }

    fn load<'a>(&'a self, location: &'a str, dump: Dump) -> InspectFuture<'a, (u64, u64)> {
        Box::pin(load(Path::new(location), dump, self.indexer.clone()))
    }

    fn compact<'a>(&'a self, location: &'a str) -> InspectFuture<'a, CompactReport> {
        Box::pin(compact(Path::new(location)))
    }

    /// [`AdminError::InUse`] when a server holds the file: it makes the copy (admin socket).
    fn backup<'a>(&'a self, location: &'a str, to: &'a Path) -> InspectFuture<'a, BackupReport> {
        Box::pin(async move {
            RedbReader::open(Path::new(location))
                .await?
                .backup(to)
                .await
        })
    }

    /// [`AdminError::InUse`] when a server holds the file (it verifies the records instead).
    fn check_pages<'a>(&'a self, location: &'a str) -> InspectFuture<'a, Option<PageCheck>> {
        Box::pin(async move {
            let (reader, problem) = check_pages(Path::new(location)).await?;
            Ok(Some(PageCheck {
                reader: Box::new(reader),
                problem,
            }))
        })
    }
}
