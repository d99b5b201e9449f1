//! The single writer thread and group commit: every queued job is applied in one write
//! transaction with one commit (one fsync), then every waiter is acknowledged.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use redb::{Database, ReadableTable, WriteTransaction};
use tokio::sync::oneshot;

use super::file::{SyncFailure, Target};
use super::schema::{
    DUE, LIVE, ListingTables, META, OldDue, OwnerTables, RecordHeader, TAIL_APART_MIN, TAILS,
    TASKS, forget_tail, old_due, replace_due,
};
use super::{Counters, DbState, RecordCache, panic_message, redb_cause};
use crate::listing::Listing;
use crate::{Cause, Durability, Expect, OwnerEntry, StoreError, WriteOp};

/// One [`RedbStore::commit`] call waiting on the writer.
pub(super) struct Job {
    pub(super) ops: Vec<WriteOp>,
    pub(super) ack: oneshot::Sender<Result<(), StoreError>>,
}

/// The single writer: owns all write transactions, and reopens the database after an I/O error.
pub(super) struct Writer {
    pub(super) db: Arc<RwLock<DbState>>,
    pub(super) target: Target,
    pub(super) rx: mpsc::Receiver<Job>,
    pub(super) durability: Durability,
    /// See [`StoreOptions::quick_repair`](crate::StoreOptions::quick_repair).
    pub(super) quick_repair: bool,
    pub(super) max_batch_ops: usize,
    pub(super) verify_on_open: bool,
    pub(super) cache_size: usize,
    /// See [`StoreOptions::unsafe_reopen_after_sync_failure`].
    pub(super) reopen_after_sync_failure: bool,
    pub(super) sync_failure: Arc<SyncFailure>,
    pub(super) halt: tokio::sync::watch::Sender<Option<String>>,
    pub(super) counters: Arc<Counters>,
    /// The record cache: every id a batch wrote is dropped before the batch is acknowledged.
    pub(super) records: Arc<RecordCache>,
    pub(super) path: PathBuf,
    #[cfg(test)]
    pub(super) hooks: Arc<super::tests_support::Hooks>,
}

impl Writer {
    pub(super) fn run(self) {
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
    /// Applies `batch` in one transaction and acks every job.
    fn commit_batch(&self, batch: Vec<Job>) {
        let (opss, acks): (Vec<Vec<WriteOp>>, Vec<_>) =
            batch.into_iter().map(|j| (j.ops, j.ack)).unzip();
        let (results, poisoned) = match self.database() {
            // Only reopen requests (see `RedbStore::send`): nothing to write.
            Ok(_) if opss.iter().all(Vec::is_empty) => (vec![Ok(()); opss.len()], false),
            Ok(db) => {
                let mode = CommitMode {
                    durability: self.durability,
                    quick_repair: self.quick_repair,
                };
                apply_jobs_inner(&db, &self.path, mode, &opss, &self.counters)
            }
            Err(e) => (vec![Err(e); opss.len()], false),
        };
        // Whatever became of the batch (a job refused by its precondition wrote nothing, but
        // dropping too much is harmless), no reader may be answered from the cache with what
        // these ids held before it: drop them before anyone is acknowledged.
        self.records
            .drop_ids(opss.iter().flatten().filter_map(WriteOp::task_id));
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
            self.records.clear();
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
}

/// Applies every job of `jobs` in one write transaction with one commit and returns one result
/// per job. If applying fails (not committing), the transaction is aborted and each job is
/// retried in its own transaction so that one bad job does not fail the others. Never panics:
/// a panic inside redb becomes a [`StoreError::Commit`].
#[cfg(test)]
pub(super) fn apply_jobs(
    db: &Database,
    path: &Path,
    durability: Durability,
    jobs: &[Vec<WriteOp>],
    counters: &Counters,
) -> Vec<Result<(), StoreError>> {
    let mode = CommitMode {
        durability,
        quick_repair: false,
    };
    apply_jobs_inner(db, path, mode, jobs, counters).0
}

/// [`apply_jobs`], plus whether a transaction failed to begin or commit (after which the
/// database must be reopened).
fn apply_jobs_inner(
    db: &Database,
    path: &Path,
    mode: CommitMode,
    jobs: &[Vec<WriteOp>],
    counters: &Counters,
) -> (Vec<Result<(), StoreError>>, bool) {
    let ops: usize = jobs.iter().map(Vec::len).sum();
    let _span = tracing::debug_span!("store.group_commit", jobs = jobs.len(), ops).entered();
    let started = Instant::now();
    match guarded(path, || one_transaction(db, mode, jobs)) {
        Ok(results) => {
            counters.commits.fetch_add(1, Ordering::Relaxed);
            counters.ops.fetch_add(ops as u64, Ordering::Relaxed);
            crate::telemetry::commit(started.elapsed(), ops);
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
                        return Err(StoreError::Commit(Cause::message(
                            "not attempted after an I/O error in the same batch",
                        )));
                    }
                    let (mut r, p) =
                        apply_jobs_inner(db, path, mode, std::slice::from_ref(job), counters);
                    poisoned |= p;
                    r.pop()
                        .unwrap_or_else(|| Err(StoreError::Commit(Cause::message("no result"))))
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
    Apply(Cause),
    Commit(Cause),
}

fn guarded<T>(path: &Path, f: impl FnOnce() -> Result<T, Failure>) -> Result<T, Failure> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(panic) => {
            let msg = panic_message(&panic);
            tracing::error!(path = %path.display(), panic = %msg, "redb panicked in a write");
            Err(Failure::Commit(Cause::message(format!(
                "redb panicked: {msg}"
            ))))
        }
    }
}

/// How a write transaction commits.
#[derive(Clone, Copy)]
struct CommitMode {
    durability: Durability,
    /// redb's quick repair: the allocator state is saved with the commit (and the commit is
    /// two-phase), so that the open after a crash need not walk the whole file.
    quick_repair: bool,
}

fn one_transaction(
    db: &Database,
    mode: CommitMode,
    jobs: &[Vec<WriteOp>],
) -> Result<Vec<Result<(), StoreError>>, Failure> {
    let mut txn = db
        .begin_write()
        .map_err(|e| Failure::Commit(redb_cause(e)))?;
    txn.set_quick_repair(mode.quick_repair);
    if mode.durability == Durability::None {
        txn.set_durability(redb::Durability::None)
            .map_err(|e| Failure::Commit(redb_cause(e)))?;
    }
    let results = apply_jobs_to(&txn, jobs).map_err(|e| match e {
        // redb latches an I/O error: the database must be reopened like after a failed commit.
        redb::Error::Io(_) | redb::Error::PreviousIo => Failure::Commit(redb_cause(e)),
        other => Failure::Apply(redb_cause(other)),
    })?;
    // Inside a group commit: the ops are applied, the commit has not started.
    #[cfg(feature = "failpoints")]
    fail::fail_point!("store::group_commit", |arg| {
        Err(Failure::Commit(Cause::message(format!(
            "failpoint store::group_commit: {}",
            arg.unwrap_or_default()
        ))))
    });
    txn.commit().map_err(|e| Failure::Commit(redb_cause(e)))?;
    Ok(results)
}

/// The header of the stored record of `id`, `None` when it is not stored. A damaged header is
/// an error: a conditional write cannot be judged against it, and its due entry is unknown.
fn stored_header(
    tasks: &redb::Table<&str, &[u8]>,
    id: &str,
) -> Result<Option<RecordHeader>, redb::Error> {
    match tasks.get(id)? {
        None => Ok(None),
        Some(value) => RecordHeader::decode(value.value())
            .map(|(header, _)| Some(header))
            .map_err(|detail| {
                redb::Error::Corrupted(format!("the stored record of task {id}: {detail}"))
            }),
    }
}

/// Applies every job whose preconditions hold (checked against the transaction, so a job sees
/// the writes of the jobs before it); a job whose precondition fails is skipped whole and
/// answered [`StoreError::Conflict`].
///
/// A `Put` writes the `tasks` record (header and snapshot), and touches `live` and `due` only
/// when they change: every table a transaction writes costs its commit pages.
fn apply_jobs_to(
    txn: &WriteTransaction,
    jobs: &[Vec<WriteOp>],
) -> Result<Vec<Result<(), StoreError>>, redb::Error> {
    let mut tables = JobTables {
        tasks: txn.open_table(TASKS)?,
        tails: txn.open_table(TAILS)?,
        live: txn.open_table(LIVE)?,
        due: txn.open_table(DUE)?,
        meta: txn.open_table(META)?,
        owners: OwnerTables::open(txn)?,
        listing: ListingTables::open(txn)?,
    };
    let mut results = Vec::with_capacity(jobs.len());
    'jobs: for job in jobs {
        for op in job {
            if let Some(conflict) = tables.conflict(op)? {
                results.push(Err(conflict));
                continue 'jobs;
            }
        }
        for op in job {
            tables.apply(op)?;
        }
        results.push(Ok(()));
    }
    // The counters the batch changed, once each (kept in memory while the ops applied).
    tables.owners.flush()?;
    tables.listing.flush()?;
    Ok(results)
}

/// The tables one write transaction changes, open for the whole batch.
struct JobTables<'t> {
    tasks: redb::Table<'t, &'static str, &'static [u8]>,
    tails: redb::Table<'t, &'static str, &'static [u8]>,
    live: redb::Table<'t, &'static str, ()>,
    due: redb::Table<'t, (u64, &'static str), ()>,
    meta: redb::Table<'t, &'static str, &'static [u8]>,
    owners: OwnerTables<'t>,
    listing: ListingTables<'t>,
}

impl JobTables<'_> {
    /// The conflict a `Put`'s precondition finds in the stored record (one lookup: the
    /// sequence number is in the record's header); `None` when it holds or `op` has none.
    fn conflict(&self, op: &WriteOp) -> Result<Option<StoreError>, redb::Error> {
        let WriteOp::Put { id, expect, .. } = op else {
            return Ok(None);
        };
        let id = id.as_str();
        let conflict = match *expect {
            Expect::Any => None,
            Expect::Absent => stored_header(&self.tasks, id)?.map(|header| (None, header.seq)),
            Expect::Seq(n) => match stored_header(&self.tasks, id)? {
                Some(RecordHeader {
                    seq: Some(found), ..
                }) if found == n => None,
                // Stored before sequence numbers were kept: accepted once.
                Some(RecordHeader { seq: None, .. }) => None,
                Some(header) => Some((Some(n), header.seq)),
                None => Some((Some(n), None)),
            },
        };
        Ok(conflict.map(|(expected, found)| StoreError::Conflict {
            id: id.to_owned(),
            expected,
            found,
        }))
    }

    /// Writes one operation of a job whose preconditions held.
    fn apply(&mut self, op: &WriteOp) -> Result<(), redb::Error> {
        match op {
            WriteOp::Put {
                id,
                bytes,
                constant_tail,
                live,
                due_ms,
                seq,
                expect: _,
                owner,
                listing,
            } => self.put(
                id.as_str(),
                bytes,
                *constant_tail,
                *live,
                *due_ms,
                *seq,
                owner.as_ref(),
                listing.as_ref(),
            ),
            WriteOp::Delete { id } => self.delete(id.as_str()),
            WriteOp::SetDue { id, due_ms } => self.set_due(id.as_str(), *due_ms),
            WriteOp::PutMetaIfAbsent { key, value } => {
                if self.meta.get(key.as_str())?.is_none() {
                    self.meta.insert(key.as_str(), value.as_slice())?;
                }
                Ok(())
            }
            WriteOp::PutMeta { key, value } => {
                self.meta.insert(key.as_str(), value.as_slice())?;
                Ok(())
            }
            WriteOp::DeleteMeta { key } => {
                self.meta.remove(key.as_str())?;
                Ok(())
            }
        }
    }

    /// A `Put`: the record with its header; its constant tail, `live`, `due`, the owner's
    /// tables and the listing only where they change.
    ///
    /// A constant tail of at least [`TAIL_APART_MIN`] bytes goes to [`TAILS`], written only
    /// when the stored record has no tail of that length (the task's creation): its later
    /// transitions rewrite the rest of the record alone. A put that keeps its bytes whole
    /// removes a tail the record had.
    #[allow(clippy::too_many_arguments)]
    fn put(
        &mut self,
        id: &str,
        bytes: &[u8],
        constant_tail: usize,
        is_live: bool,
        due_ms: Option<u64>,
        seq: Option<u64>,
        owner: Option<&OwnerEntry>,
        listing: Option<&Listing>,
    ) -> Result<(), redb::Error> {
        // The old due time and owner come from the header of the record this put replaces
        // (a put without an owner keeps the stored one).
        let (old, previous, old_tail) = {
            let stored = self.tasks.get(id)?;
            let value = stored.as_ref().map(|v| v.value());
            let header = value.and_then(|v| RecordHeader::decode(v).ok().map(|(h, _)| h));
            let previous = value.map(|v| {
                let owner = header.as_ref().and_then(|h| h.owner.clone());
                (
                    owner,
                    v.len() + header.as_ref().map_or(0, RecordHeader::tail_len),
                )
            });
            (old_due(value), previous, header.and_then(|h| h.tail))
        };
        let tail = (constant_tail >= TAIL_APART_MIN && constant_tail <= bytes.len())
            .then(|| u32::try_from(constant_tail).ok())
            .flatten();
        let header = RecordHeader {
            seq,
            due_ms,
            owner: owner
                .cloned()
                .or_else(|| previous.as_ref().and_then(|(o, _)| o.clone())),
            tail,
        };
        let value = match tail {
            Some(len) => {
                let (head, rest) = bytes.split_at(bytes.len() - len as usize);
                if old_tail != Some(len) {
                    self.tails.insert(id, rest)?;
                }
                header.encode(head)
            }
            None => {
                if old_tail.is_some() {
                    self.tails.remove(id)?;
                }
                header.encode(bytes)
            }
        };
        if let (Some(listing), Some(entry)) = (listing, &header.owner) {
            // A record keeps its owner entry for life; were it to change, the old entry goes.
            if let Some((Some(old), _)) = &previous
                && old.created_ms != entry.created_ms
            {
                self.listing.relist(id, old.created_ms, &old.owner, None)?;
            }
            self.listing
                .relist(id, entry.created_ms, &entry.owner, Some(listing))?;
        }
        self.owners.replace(id, previous, &value)?;
        self.tasks.insert(id, value.as_slice())?;
        if is_live {
            if self.live.get(id)?.is_none() {
                self.live.insert(id, ())?;
            }
        } else if self.live.get(id)?.is_some() {
            self.live.remove(id)?;
        }
        replace_due(&mut self.due, id, old, due_ms)
    }

    /// A `Delete`: the record, its live and due entries, and its share of the owner's usage.
    fn delete(&mut self, id: &str) -> Result<(), redb::Error> {
        let removed = self.tasks.remove(id)?;
        if let Some(value) = &removed {
            self.owners.account(id, value.value(), -1)?;
            self.listing.forget(id, value.value())?;
            forget_tail(&mut self.tails, id, value.value())?;
        }
        let old = old_due(removed.as_ref().map(|v| v.value()));
        if self.live.get(id)?.is_some() {
            self.live.remove(id)?;
        }
        replace_due(&mut self.due, id, old, None)
    }

    /// A `SetDue`. Only a stored task has a due entry: a task that is not stored has none (a
    /// delete removes it with the record). A good record keeps its due time in its header; a
    /// damaged one (the reaper quarantines records it cannot decode) is left as it is, and
    /// only its due entries change.
    fn set_due(&mut self, id: &str, due_ms: Option<u64>) -> Result<(), redb::Error> {
        let rewritten = match self.tasks.get(id)? {
            None => None,
            Some(value) => match RecordHeader::decode(value.value()) {
                Ok((header, snapshot)) => (header.due_ms != due_ms).then(|| {
                    let old = header.due_ms;
                    let new = RecordHeader { due_ms, ..header };
                    (OldDue::Known(old), Some(new.encode(snapshot)))
                }),
                Err(_) => Some((OldDue::Damaged, None)),
            },
        };
        if let Some((old, value)) = rewritten {
            if let Some(value) = value {
                // The header's size does not change with the due time: the owner's usage stays
                // as it is.
                self.tasks.insert(id, value.as_slice())?;
            }
            replace_due(&mut self.due, id, old, due_ms)?;
        }
        Ok(())
    }
}
