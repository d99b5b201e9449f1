//! Point reads on the store's own reader threads.
//!
//! A `tasks/get` of a task that is neither live nor in the record cache reads one record.
//! On tokio's blocking pool every such read woke a pool thread and put it back to sleep: under
//! load most of the server's time went to those wake-ups (`perf`: about 30% of the CPU of
//! random reads at 1M stored tasks in futex waits and wakes of the pool). Here a point read is
//! queued to [`READER_THREADS`] threads that drain the queue: a thread that finds reads waiting
//! serves all of them (up to [`MAX_BATCH`]) in one read transaction and sleeps only when the
//! queue is empty. Two threads, so that one read waiting for the disk does not hold up every
//! other. Other reads (rehydration, the reaper's index scans, store administration) still
//! run on the blocking pool: they are rare and may be long.
//!
//! A read is queued with the database it must read (taken by the caller, with the same state
//! checks as every read) and the record cache's epoch taken before it was queued, so the
//! cache rule of `cache.rs` holds unchanged: the read transaction begins after the epoch was
//! taken.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use redb::{Database, ReadableDatabase};
use tokio::sync::oneshot;

use super::RecordCache;
use super::read::{ReadFailure, failed_read};
use super::schema::{TASKS, open_tails, record_bytes};
use crate::StoreError;

/// Reader threads per store.
const READER_THREADS: usize = 2;

/// At most this many reads share one read transaction.
const MAX_BATCH: usize = 64;

/// One queued point read.
pub(super) struct PointRead {
    pub(super) db: Arc<Database>,
    pub(super) id: String,
    /// The record cache's epoch when the read was queued (see `RecordCache::fill`).
    pub(super) epoch: u64,
    pub(super) reply: oneshot::Sender<Result<Option<Vec<u8>>, StoreError>>,
}

/// Starts the reader threads; they stop when every sender of the returned queue is dropped
/// (with the store) and the queue is drained.
pub(super) fn start(
    records: Arc<RecordCache>,
    path: PathBuf,
) -> std::io::Result<mpsc::Sender<PointRead>> {
    let (tx, rx) = mpsc::channel::<PointRead>();
    let rx = Arc::new(Mutex::new(rx));
    for n in 0..READER_THREADS {
        let rx = Arc::clone(&rx);
        let records = Arc::clone(&records);
        let path = path.clone();
        std::thread::Builder::new()
            .name(format!("mcp-tasks-store-reader-{n}"))
            .spawn(move || run(&rx, &records, &path))?;
    }
    Ok(tx)
}

fn run(rx: &Mutex<mpsc::Receiver<PointRead>>, records: &RecordCache, path: &std::path::Path) {
    loop {
        let batch = {
            // One thread waits on the queue at a time; it takes what is there and lets the
            // other thread wait while it serves.
            let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
            let Ok(first) = rx.recv() else { return };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(read) => batch.push(read),
                    Err(_) => break,
                }
            }
            batch
        };
        serve(batch, records, path);
    }
}

/// Answers every read of `batch`: consecutive reads of the same database share one read
/// transaction. Never panics: a panic inside redb fails the reads it left unanswered.
fn serve(batch: Vec<PointRead>, records: &RecordCache, path: &std::path::Path) {
    let mut reads = batch.into_iter().peekable();
    while let Some(first) = reads.next() {
        let mut group = vec![first];
        while let Some(next) = reads.next_if(|r| Arc::ptr_eq(&r.db, &group[0].db)) {
            group.push(next);
        }
        let db = Arc::clone(&group[0].db);
        let mut pending: Vec<Option<PointRead>> = group.into_iter().map(Some).collect();
        let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<(), redb::Error> {
            let txn = db.begin_read()?;
            let tasks = txn.open_table(TASKS)?;
            let tails = open_tails(&txn)?;
            for slot in pending.iter_mut() {
                let Some(read) = slot.take() else { continue };
                let found = match tasks.get(read.id.as_str()) {
                    Ok(found) => found,
                    Err(e) => {
                        // Put back: answered with the error below, with the rest.
                        *slot = Some(read);
                        return Err(e.into());
                    }
                };
                let answer = match found {
                    None => None,
                    Some(v) => {
                        let bytes = match record_bytes(&read.id, v.value(), tails.as_ref()) {
                            Ok(bytes) => bytes,
                            Err(e) => {
                                *slot = Some(read);
                                return Err(e.into());
                            }
                        };
                        records.fill(&read.id, &bytes, read.epoch);
                        Some(bytes)
                    }
                };
                let _ = read.reply.send(Ok(answer));
            }
            Ok(())
        }));
        let error = match outcome {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => failed_read(path, ReadFailure::Redb(e)),
            Err(panic) => failed_read(path, ReadFailure::Panic(&*panic)),
        };
        for read in pending.into_iter().flatten() {
            let _ = read.reply.send(Err(error.clone()));
        }
    }
}
