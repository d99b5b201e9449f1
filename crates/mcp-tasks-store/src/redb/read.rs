//! Reads: a point read of one record goes to the store's reader threads (`reader.rs`), every
//! other read runs one redb read transaction on the blocking pool.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use tokio::sync::oneshot;

use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata};

use super::reader::PointRead;
use std::ops::Bound;

use super::schema::{
    BY_STATUS, BY_TOOL, DUE, LISTING_COUNTERS, LISTING_INDEX, LIVE, META, OWNERS, StoredListing,
    TASKS, USAGE, bucket_key, created_key, open_tails, record_bytes, tasks_key,
};
use super::{DbState, RedbStore, panic_message, redb_cause};
use crate::listing::{
    self, ListedStatus, ListedTask, ListingCount, ListingCursor, ListingFilter, ListingIndex,
    ListingPage, ThroughputBucket, ThroughputKind,
};
use crate::{Cause, MAX_PAGE, MAX_PAGE_BYTES, OwnedCursor, OwnedRecord, StoreError, Usage};

impl RedbStore {
    /// The snapshot bytes of task `id` (without the header its record is stored with).
    ///
    /// A task read before is answered from the record cache (see `cache.rs`) while the store
    /// is open; otherwise, and for a task not stored, a reader thread reads it (`reader.rs`).
    pub async fn get(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let records = &self.inner.records;
        if self.is_open()
            && let Some(bytes) = records.get(id)
        {
            return Ok(Some(bytes.to_vec()));
        }
        // Taken before the read transaction begins: see `RecordCache::fill`.
        let epoch = records.epoch();
        let db = self.database().await?;
        let (reply, answer) = oneshot::channel();
        let read = PointRead {
            db,
            id: id.to_owned(),
            epoch,
            reply,
        };
        // The reader threads live as long as the store: a refused send is a bug, not a state.
        self.inner
            .readers
            .send(read)
            .map_err(|_| StoreError::Read(Cause::message("the store's reader threads are gone")))?;
        answer.await.unwrap_or_else(|_| {
            Err(StoreError::Read(Cause::message(
                "the store's reader thread failed while serving the read",
            )))
        })
    }

    /// The snapshot bytes of each of `ids`, in one read transaction.
    pub async fn get_many(&self, ids: Vec<String>) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.read(move |txn| {
            let tasks = txn.open_table(TASKS)?;
            let tails = open_tails(txn)?;
            ids.iter()
                .map(|id| {
                    Ok(match tasks.get(id.as_str())? {
                        Some(v) => Some(record_bytes(id, v.value(), tails.as_ref())?),
                        None => None,
                    })
                })
                .collect()
        })
        .await
    }

    /// Whether the database is open for reads (not closed, halted or being reopened).
    fn is_open(&self) -> bool {
        matches!(
            *self.inner.db.read().unwrap_or_else(|e| e.into_inner()),
            DbState::Open(_)
        )
    }

    /// All (id, bytes) of live tasks, ordered by id, via the live index only.
    pub async fn live(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.read(|txn| {
            let live = txn.open_table(LIVE)?;
            let tasks = txn.open_table(TASKS)?;
            let tails = open_tails(txn)?;
            let mut out = Vec::with_capacity(usize::try_from(live.len()?).unwrap_or(0));
            for entry in live.iter()? {
                let (id, _) = entry?;
                let id = id.value();
                match tasks.get(id)? {
                    Some(bytes) => out.push((
                        id.to_owned(),
                        record_bytes(id, bytes.value(), tails.as_ref())?,
                    )),
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

    /// One page of the meta table under `prefix`, in key order after `after`, at most
    /// `limit` (capped at [`MAX_PAGE`]): a range of the table, nothing past the page.
    pub async fn meta_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let prefix = prefix.to_owned();
        let after = after.filter(|a| *a >= prefix.as_str()).map(str::to_owned);
        let limit = limit.min(MAX_PAGE);
        self.read(move |txn| {
            use std::ops::Bound;
            let meta = txn.open_table(META)?;
            let start = match &after {
                Some(a) => Bound::Excluded(a.as_str()),
                None => Bound::Included(prefix.as_str()),
            };
            let mut out = Vec::new();
            for entry in meta.range::<&str>((start, Bound::Unbounded))? {
                let (key, value) = entry?;
                let key = key.value();
                if !key.starts_with(prefix.as_str()) || out.len() >= limit {
                    break;
                }
                out.push((key.to_owned(), value.value().to_vec()));
            }
            Ok(out)
        })
        .await
    }

    /// Every stored task (id, bytes), ordered by id. Reads the whole table: for checks and
    /// tools, not for serving requests.
    pub async fn tasks(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.read(|txn| {
            let tasks = txn.open_table(TASKS)?;
            let tails = open_tails(txn)?;
            let mut out = Vec::with_capacity(usize::try_from(tasks.len()?).unwrap_or(0));
            for entry in tasks.iter()? {
                let (id, bytes) = entry?;
                let id = id.value();
                out.push((
                    id.to_owned(),
                    record_bytes(id, bytes.value(), tails.as_ref())?,
                ));
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

    /// One page of the tasks of `owner` (an owner key) in (creation time, id) order after
    /// `after`, at most `limit` (capped at [`MAX_PAGE`]) and no record once the page holds
    /// [`MAX_PAGE_BYTES`]: a range of the owner index, then the records of that page.
    /// Nothing of another owner is read.
    pub async fn owned(
        &self,
        owner: &str,
        after: Option<OwnedCursor>,
        limit: usize,
    ) -> Result<Vec<OwnedRecord>, StoreError> {
        let owner = owner.to_owned();
        let limit = limit.min(MAX_PAGE);
        self.read(move |txn| {
            let owners = match txn.open_table(OWNERS) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            let tasks = txn.open_table(TASKS)?;
            let tails = open_tails(txn)?;
            let (created, id) = match &after {
                Some(a) => (a.created_ms, a.id.as_str()),
                None => (0, ""),
            };
            let from = (owner.as_str(), created, id);
            let start = match &after {
                Some(_) => Bound::Excluded(from),
                None => Bound::Included(from),
            };
            let mut out = Vec::new();
            let mut held = 0usize;
            for entry in owners.range::<(&str, u64, &str)>((start, Bound::Unbounded))? {
                let (key, _) = entry?;
                let (entry_owner, created_ms, id) = key.value();
                if entry_owner != owner || out.len() >= limit || held >= MAX_PAGE_BYTES {
                    break;
                }
                match tasks.get(id)? {
                    Some(value) => {
                        let bytes = record_bytes(id, value.value(), tails.as_ref())?;
                        held = held.saturating_add(bytes.len());
                        out.push(OwnedRecord {
                            id: id.to_owned(),
                            created_ms,
                            bytes,
                        });
                    }
                    None => tracing::warn!(id, "the owner index names a task that is not stored"),
                }
            }
            Ok(out)
        })
        .await
    }

    /// What `owner` (an owner key) holds: stored tasks and their bytes.
    pub async fn usage(&self, owner: &str) -> Result<Usage, StoreError> {
        let owner = owner.to_owned();
        self.read(move |txn| {
            let usage = match txn.open_table(USAGE) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Usage::default()),
                Err(e) => return Err(e.into()),
            };
            Ok(usage
                .get(owner.as_str())?
                .map(|v| {
                    let (tasks, bytes) = v.value();
                    Usage { tasks, bytes }
                })
                .unwrap_or_default())
        })
        .await
    }

    /// The usage of every owner that holds something, by owner key.
    pub async fn usage_by_owner(&self) -> Result<Vec<(String, Usage)>, StoreError> {
        self.read(usage_table).await
    }

    /// One page of the listing index (`Index::listing`): a reverse range of the index the
    /// filter names, each entry's listing looked up under the creation index (one lookup;
    /// none for the walk of every task, whose index holds the listing).
    pub async fn listing(
        &self,
        filter: &ListingFilter,
        after: Option<ListingCursor>,
        limit: usize,
        budget: usize,
    ) -> Result<ListingPage, StoreError> {
        let filter = filter.clone();
        self.read(move |txn| {
            let entries = match txn.open_table(LISTING_INDEX) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(ListingPage::default()),
                Err(e) => return Err(e.into()),
            };
            let (from, to) = filter.walk_bounds(after.as_ref());
            if from >= to {
                return Ok(ListingPage::default());
            }
            let after = after.as_ref();
            let lookup = |created_ms: u64, id: &str| -> Result<Option<ListedTask>, redb::Error> {
                Ok(entries
                    .get(created_key(created_ms, id))?
                    .and_then(|v| StoredListing::decode(v.value()))
                    .and_then(|e| e.task(created_ms, id)))
            };
            let keep = |r: Result<Option<ListedTask>, redb::Error>| r.transpose();
            match filter.index() {
                ListingIndex::Created => {
                    let walk = entries
                        .range(created_key(from, "")..created_key(to, ""))?
                        .rev()
                        .filter_map(|e| {
                            keep(e.map_err(redb::Error::from).map(|(k, v)| {
                                let (_, _, created_ms, id) = k.value();
                                if !listing::before_cursor(created_ms, id, after) {
                                    return None;
                                }
                                StoredListing::decode(v.value())
                                    .and_then(|e| e.task(created_ms, id))
                            }))
                        });
                    listing::fill_page(walk, &filter, limit, budget)
                }
                ListingIndex::Owner(owner) => {
                    let owners = txn.open_table(OWNERS)?;
                    let walk = owners
                        .range((owner, from, "")..(owner, to, ""))?
                        .rev()
                        .filter_map(|e| {
                            keep(e.map_err(redb::Error::from).and_then(|(k, _)| {
                                let (_, created_ms, id) = k.value();
                                if !listing::before_cursor(created_ms, id, after) {
                                    return Ok(None);
                                }
                                lookup(created_ms, id)
                            }))
                        });
                    listing::fill_page(walk, &filter, limit, budget)
                }
                index @ (ListingIndex::Tool(_) | ListingIndex::Status(_)) => {
                    let (kind, value) = match index {
                        ListingIndex::Tool(tool) => (BY_TOOL, tool),
                        ListingIndex::Status(status) => (BY_STATUS, status.as_str()),
                        _ => unreachable!("matched above"),
                    };
                    let walk = entries
                        .range((kind, value, from, "")..(kind, value, to, ""))?
                        .rev()
                        .filter_map(|e| {
                            keep(e.map_err(redb::Error::from).and_then(|(k, _)| {
                                let (_, _, created_ms, id) = k.value();
                                if !listing::before_cursor(created_ms, id, after) {
                                    return Ok(None);
                                }
                                lookup(created_ms, id)
                            }))
                        });
                    listing::fill_page(walk, &filter, limit, budget)
                }
            }
        })
        .await
    }

    /// The listing counters (`Index::listing_counts`).
    pub async fn listing_counts(&self) -> Result<Vec<ListingCount>, StoreError> {
        self.read(|txn| {
            let counts = match txn.open_table(LISTING_COUNTERS) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            let mut out = Vec::new();
            for entry in counts.range(tasks_key("", "", 0)..bucket_key(0, 0))? {
                let (k, v) = entry?;
                let (_, owner, tool, _, status) = k.value();
                if let Some(status) = ListedStatus::from_code(status) {
                    out.push(ListingCount {
                        owner: owner.to_owned(),
                        tool: tool.to_owned(),
                        status,
                        tasks: v.value(),
                    });
                }
            }
            Ok(out)
        })
        .await
    }

    /// The throughput buckets from `since_ms` on (`Index::throughput`).
    pub async fn throughput(&self, since_ms: u64) -> Result<Vec<ThroughputBucket>, StoreError> {
        self.read(move |txn| {
            let buckets = match txn.open_table(LISTING_COUNTERS) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            let mut out = Vec::new();
            let from = bucket_key(listing::minute_of(since_ms), 0);
            for entry in buckets.range(from..=bucket_key(u64::MAX, u8::MAX))? {
                let (k, v) = entry?;
                let (_, _, _, minute_ms, kind) = k.value();
                if let Some(kind) = ThroughputKind::from_code(kind) {
                    out.push(ThroughputBucket {
                        minute_ms,
                        kind,
                        count: v.value(),
                    });
                }
            }
            Ok(out)
        })
        .await
    }

    /// The file's length.
    pub async fn stored_bytes(&self) -> Result<Option<u64>, StoreError> {
        Ok(tokio::fs::metadata(&self.inner.path)
            .await
            .ok()
            .map(|m| m.len()))
    }

    /// Runs `f` in one read transaction on the blocking pool (store administration reads the
    /// running server's store through it: see `admin::socket`).
    pub(crate) async fn read_txn<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&redb::ReadTransaction) -> Result<T, redb::Error> + Send + 'static,
    {
        self.read(f).await
    }

    /// Runs a read transaction on the blocking pool.
    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&redb::ReadTransaction) -> Result<T, redb::Error> + Send + 'static,
    {
        let db = self.database().await?;
        let path = self.inner.path.clone();
        let task = tokio::task::spawn_blocking(move || {
            let run = || -> Result<T, redb::Error> {
                let txn = db.begin_read()?;
                f(&txn)
            };
            catch_unwind(AssertUnwindSafe(run))
                .map_err(|panic| failed_read(&path, ReadFailure::Panic(&*panic)))?
                .map_err(|e| failed_read(&path, ReadFailure::Redb(e)))
        });
        match task.await {
            Ok(result) => result,
            Err(e) => Err(StoreError::Read(Cause::context("the read task failed", e))),
        }
    }

    /// The database to read, as every read checks it: an error when the store is closed or
    /// halted, or broken by an I/O error that the writer (asked once to reopen) has not cured.
    async fn database(&self) -> Result<Arc<redb::Database>, StoreError> {
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
        Ok(db)
    }
}

/// Every entry of the [`USAGE`] table of `txn`, by owner key (none when the table does not
/// exist: a file of an older layout).
pub(crate) fn usage_table(
    txn: &redb::ReadTransaction,
) -> Result<Vec<(String, Usage)>, redb::Error> {
    let usage = match txn.open_table(USAGE) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for entry in usage.iter()? {
        let (owner, v) = entry?;
        let (tasks, bytes) = v.value();
        out.push((owner.value().to_owned(), Usage { tasks, bytes }));
    }
    Ok(out)
}

/// Why a read transaction failed.
pub(super) enum ReadFailure<'a> {
    /// redb answered an error.
    Redb(redb::Error),
    /// redb panicked (caught by `catch_unwind`).
    Panic(&'a (dyn std::any::Any + Send)),
}

/// Logs a failed read of the store at `path` and says it as the error every reader gets.
pub(super) fn failed_read(path: &std::path::Path, failure: ReadFailure<'_>) -> StoreError {
    match failure {
        ReadFailure::Redb(e) => {
            tracing::error!(path = %path.display(), error = %e, "reading the task store failed");
            StoreError::Read(redb_cause(e))
        }
        ReadFailure::Panic(panic) => {
            let msg = panic_message(panic);
            tracing::error!(path = %path.display(), panic = %msg, "redb panicked in a read");
            StoreError::Read(Cause::message(format!("redb panicked: {msg}")))
        }
    }
}
