//! Converting a store file of an older table layout to this build's ([`upgrade_layout`]), in
//! the caller's write transaction: a server's first open, or a `store …` command that writes.

use std::path::Path;

use redb::{ReadableTable, ReadableTableMetadata, StorageError, TableHandle, WriteTransaction};

use super::schema::*;
use crate::{Indexer, StoreError};

/// The layout version recorded in `meta` (1 when the key is absent). `Err` holds a
/// description of a malformed value.
pub(crate) fn stored_schema_version(value: Option<&[u8]>) -> Result<u64, String> {
    match value {
        None => Ok(1),
        Some(bytes) => <[u8; 8]>::try_from(bytes)
            .map(u64::from_le_bytes)
            .map_err(|_| {
                format!(
                    "meta \"{META_SCHEMA_VERSION}\" has {} bytes, expected 8",
                    bytes.len()
                )
            }),
    }
}

/// Why [`upgrade_layout`] did not bring a store to [`SCHEMA_VERSION`].
#[derive(Debug)]
pub(crate) enum LayoutError {
    /// The store has a newer layout (the version found); nothing was changed.
    TooNew(u64),
    /// The recorded version or a layout-1 record is malformed.
    Corrupt(String),
    /// redb failed.
    Redb(redb::Error),
    /// Converting from this layout (the version found) reads the records, and no
    /// [`Indexer`] reads them.
    NeedsIndexer(u64),
}

impl From<StorageError> for LayoutError {
    fn from(e: StorageError) -> Self {
        LayoutError::Redb(e.into())
    }
}

impl From<redb::TableError> for LayoutError {
    fn from(e: redb::TableError) -> Self {
        LayoutError::Redb(e.into())
    }
}

impl LayoutError {
    /// As a [`StoreError`] of the store at `path`.
    pub(crate) fn into_store_error(self, path: &Path) -> StoreError {
        match self {
            LayoutError::TooNew(found) => StoreError::SchemaTooNew {
                store: path.display().to_string(),
                found: i64::try_from(found).unwrap_or(i64::MAX),
                supported: SCHEMA_VERSION as i64,
            },
            LayoutError::Corrupt(detail) => StoreError::Corrupt {
                path: path.to_path_buf(),
                detail,
            },
            LayoutError::NeedsIndexer(found) => StoreError::NeedsIndexer {
                store: path.display().to_string(),
                what: format!("table layout {found}"),
            },
            LayoutError::Redb(e) => StoreError::Open {
                path: path.to_path_buf(),
                detail: format!("initialising the tables failed: {e}"),
            },
        }
    }
}

/// How many records a layout-1 conversion reads before writing them back (bounds its memory).
const MIGRATION_CHUNK: usize = 1024;

/// Brings the store of `txn` to layout [`SCHEMA_VERSION`] inside that transaction, creating
/// the tables of a new store: the caller's commit makes the change, so a crash leaves the old
/// layout whole. Returns the number of records converted (`None` when nothing was
/// converted). A newer layout is refused before anything is written.
///
/// Layout 1 → 2: every `tasks` value gets its [`RecordHeader`] from `seq` and `due_by_id`
/// (a task without a `seq` entry, stored before sequence numbers were kept, gets none); the
/// `due` entries of ids no longer stored are removed; `seq` and `due_by_id` are deleted.
///
/// Layout 2 → 3: every record gets its owner and creation time in its header, read from its
/// snapshot, and its entry in [`OWNERS`] and [`USAGE`]. A record whose snapshot does not
/// decode gets none (it is in no owner's index and counted for nobody; the reaper
/// quarantines it).
///
/// Layout 3 → 4: [`convert_v3`], which writes layout 5's tables directly.
///
/// Layout 4 → 5: [`convert_v4`].
///
/// Conversions from layouts 2 and 3 read the records' owners and listings with `indexer`; a
/// store of such a layout that holds records is refused ([`LayoutError::NeedsIndexer`],
/// nothing changed) when `indexer` reads none ([`crate::NoIndexer`]).
pub(crate) fn upgrade_layout(
    txn: &WriteTransaction,
    indexer: &dyn Indexer,
) -> Result<Option<u64>, LayoutError> {
    let tables: std::collections::HashSet<String> =
        txn.list_tables()?.map(|t| t.name().to_owned()).collect();
    let mut meta = txn.open_table(META)?;
    let (found, recorded) = {
        let value = meta.get(META_SCHEMA_VERSION)?;
        let found = stored_schema_version(value.as_ref().map(|v| v.value()))
            .map_err(LayoutError::Corrupt)?;
        (found, value.is_some())
    };
    if found > SCHEMA_VERSION {
        return Err(LayoutError::TooNew(found));
    }
    // A file without the key and without tables is new (or an empty redb file): nothing to
    // convert.
    let existing = recorded || tables.contains(TASKS.name());
    if found < 4 && existing && !indexer.reads_records() && tables.contains(TASKS.name()) {
        let tasks = txn.open_table(TASKS)?;
        if !tasks.is_empty()? {
            return Err(LayoutError::NeedsIndexer(found));
        }
    }
    let mut converted = None;
    if found < 2 && existing {
        converted = Some(convert_v1(txn, &tables)?);
    }
    if found < 3 && existing {
        converted = Some(convert_v2(txn, indexer)?);
    }
    if found < 4 && existing {
        converted = Some(convert_v3(txn, indexer)?);
    }
    if found == 4 && existing {
        converted = Some(convert_v4(txn, &tables)?);
    }
    if found != SCHEMA_VERSION || !recorded {
        meta.insert(META_SCHEMA_VERSION, SCHEMA_VERSION.to_le_bytes().as_slice())?;
    }
    txn.open_table(TASKS)?;
    txn.open_table(TAILS)?;
    txn.open_table(LIVE)?;
    txn.open_table(DUE)?;
    txn.open_table(OWNERS)?;
    txn.open_table(USAGE)?;
    ListingTables::open(txn)?;
    Ok(converted)
}

/// The layout-4 → 5 conversion of [`upgrade_layout`]; returns the number of listed records.
/// Every entry of the four listing tables of layout 4 is copied as it is into
/// [`LISTING_INDEX`] and [`LISTING_COUNTERS`] (the indexes and counter kinds renumbered),
/// then those tables are deleted.
fn convert_v4(
    txn: &WriteTransaction,
    tables: &std::collections::HashSet<String>,
) -> Result<u64, LayoutError> {
    let mut converted = 0u64;
    {
        let mut index = txn.open_table(LISTING_INDEX)?;
        let mut counters = txn.open_table(LISTING_COUNTERS)?;
        if tables.contains(V4_LISTING.name()) {
            let old = txn.open_table(V4_LISTING)?;
            for entry in old.iter()? {
                let (k, v) = entry?;
                let (created_ms, id) = k.value();
                index.insert(created_key(created_ms, id), v.value())?;
                converted += 1;
            }
        }
        if tables.contains(V4_LISTING_BY.name()) {
            let old = txn.open_table(V4_LISTING_BY)?;
            for entry in old.iter()? {
                let (k, _) = entry?;
                let (by, value, created_ms, id) = k.value();
                let by = match by {
                    V4_BY_STATUS => BY_STATUS,
                    V4_BY_TOOL => BY_TOOL,
                    other => {
                        return Err(LayoutError::Corrupt(format!(
                            "the layout-4 table listing_by has an entry of unknown index {other}"
                        )));
                    }
                };
                index.insert((by, value, created_ms, id), [].as_slice())?;
            }
        }
        if tables.contains(V4_LISTING_COUNTS.name()) {
            let old = txn.open_table(V4_LISTING_COUNTS)?;
            for entry in old.iter()? {
                let (k, v) = entry?;
                let (owner, tool, status) = k.value();
                counters.insert(tasks_key(owner, tool, status), v.value())?;
            }
        }
        if tables.contains(V4_THROUGHPUT.name()) {
            let old = txn.open_table(V4_THROUGHPUT)?;
            for entry in old.iter()? {
                let (k, v) = entry?;
                let (minute, kind) = k.value();
                counters.insert(bucket_key(minute, kind), v.value())?;
            }
        }
    }
    if tables.contains(V4_LISTING.name()) {
        txn.delete_table(V4_LISTING)?;
    }
    if tables.contains(V4_LISTING_BY.name()) {
        txn.delete_table(V4_LISTING_BY)?;
    }
    if tables.contains(V4_LISTING_COUNTS.name()) {
        txn.delete_table(V4_LISTING_COUNTS)?;
    }
    if tables.contains(V4_THROUGHPUT.name()) {
        txn.delete_table(V4_THROUGHPUT)?;
    }
    Ok(converted)
}

/// The layout-3 → 4 conversion of [`upgrade_layout`] (written in layout 5's tables); returns
/// the number of records. Every record whose header names an owner gets its listing entries,
/// read from its snapshot (a snapshot that does not decode gets none). The throughput of the
/// past is not known: its buckets start empty.
fn convert_v3(txn: &WriteTransaction, indexer: &dyn Indexer) -> Result<u64, LayoutError> {
    let tasks = txn.open_table(TASKS)?;
    let mut listing = ListingTables::open(txn)?;
    let mut converted = 0u64;
    for entry in tasks.iter()? {
        let (k, v) = entry?;
        converted += 1;
        let Ok((header, snapshot)) = RecordHeader::decode(v.value()) else {
            continue;
        };
        let (Some(owner), Some(new)) = (header.owner, indexer.listing(snapshot)) else {
            continue;
        };
        let id = k.value();
        let entry = StoredListing::new(&owner.owner, &new);
        listing
            .move_entries(id, owner.created_ms, None, Some(&entry))
            .map_err(LayoutError::Redb)?;
        listing
            .index
            .insert(created_key(owner.created_ms, id), entry.encode().as_slice())?;
    }
    listing.flush().map_err(LayoutError::Redb)?;
    Ok(converted)
}

/// The layout-2 → 3 conversion of [`upgrade_layout`]; returns the number of records. Reads
/// and rewrites one record at a time (records may be large).
fn convert_v2(txn: &WriteTransaction, indexer: &dyn Indexer) -> Result<u64, LayoutError> {
    let mut tasks = txn.open_table(TASKS)?;
    let mut owners = OwnerTables::open(txn)?;
    let mut converted = 0u64;
    let mut after: Option<String> = None;
    loop {
        let next = {
            let mut range = match &after {
                Some(a) => tasks.range::<&str>((
                    std::ops::Bound::Excluded(a.as_str()),
                    std::ops::Bound::Unbounded,
                ))?,
                None => tasks.range::<&str>(..)?,
            };
            match range.next() {
                Some(entry) => {
                    let (k, v) = entry?;
                    Some((k.value().to_owned(), v.value().to_vec()))
                }
                None => None,
            }
        };
        let Some((id, value)) = next else { break };
        if let Ok((mut header, snapshot)) = RecordHeader::decode(&value) {
            if header.owner.is_none() {
                header.owner = indexer.owner(snapshot);
            }
            let rewritten = header.encode(snapshot);
            if rewritten != value {
                tasks.insert(id.as_str(), rewritten.as_slice())?;
            }
            owners
                .account(&id, &rewritten, 1)
                .map_err(LayoutError::Redb)?;
        }
        converted += 1;
        after = Some(id);
    }
    owners.flush().map_err(LayoutError::Redb)?;
    Ok(converted)
}

/// The layout-1 → 2 conversion of [`upgrade_layout`]; returns the number of records.
fn convert_v1(
    txn: &WriteTransaction,
    tables: &std::collections::HashSet<String>,
) -> Result<u64, LayoutError> {
    let mut converted = 0u64;
    {
        let mut tasks = txn.open_table(TASKS)?;
        let seqs = tables
            .contains(V1_SEQ.name())
            .then(|| txn.open_table(V1_SEQ))
            .transpose()?;
        let due_by_id = tables
            .contains(V1_DUE_BY_ID.name())
            .then(|| txn.open_table(V1_DUE_BY_ID))
            .transpose()?;
        let mut after: Option<String> = None;
        loop {
            let chunk: Vec<(String, Vec<u8>)> = {
                let range = match &after {
                    Some(a) => tasks.range::<&str>((
                        std::ops::Bound::Excluded(a.as_str()),
                        std::ops::Bound::Unbounded,
                    ))?,
                    None => tasks.range::<&str>(..)?,
                };
                range
                    .take(MIGRATION_CHUNK)
                    .map(|e| e.map(|(k, v)| (k.value().to_owned(), v.value().to_vec())))
                    .collect::<Result<_, _>>()?
            };
            for (id, snapshot) in &chunk {
                let header = RecordHeader {
                    seq: match &seqs {
                        Some(t) => t.get(id.as_str())?.map(|v| v.value()),
                        None => None,
                    },
                    due_ms: match &due_by_id {
                        Some(t) => t.get(id.as_str())?.map(|v| v.value()),
                        None => None,
                    },
                    owner: None,
                    tail: None,
                };
                tasks.insert(id.as_str(), header.encode(snapshot).as_slice())?;
                converted += 1;
            }
            if chunk.len() < MIGRATION_CHUNK {
                break;
            }
            after = chunk.last().map(|(id, _)| id.clone());
        }
        // `due` entries of ids that are not stored (layout 1 could leave them beside an
        // orphaned `due_by_id` entry) would name nothing once `due_by_id` is gone.
        if let Some(due_by_id) = &due_by_id {
            let mut due = txn.open_table(DUE)?;
            let mut orphans = Vec::new();
            for entry in due_by_id.iter()? {
                let (id, at) = entry?;
                if tasks.get(id.value())?.is_none() {
                    orphans.push((at.value(), id.value().to_owned()));
                }
            }
            for (at, id) in &orphans {
                due.remove((*at, id.as_str()))?;
            }
        }
    }
    if tables.contains(V1_SEQ.name()) {
        txn.delete_table(V1_SEQ)?;
    }
    if tables.contains(V1_DUE_BY_ID.name()) {
        txn.delete_table(V1_DUE_BY_ID)?;
    }
    Ok(converted)
}
