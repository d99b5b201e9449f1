//! Recovery: after an I/O error redb answers `PreviousIo` to everything until the database
//! is reopened; reopening rolls it back to its last durable commit. A failed fsync is never
//! recovered from here (fail-stop, see `writer.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use redb::Database;

use super::DbState;
use super::file::{init_tables_and_boot, open_database};
use super::writer::Writer;
use crate::StoreError;

impl Writer {
    /// reopen it first.
    pub(super) fn database(&self) -> Result<Arc<Database>, StoreError> {
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

    /// Closes the database and opens it again (redb repairs it back to its last durable
    /// commit). On failure the store is [`DbState::Broken`] until a later write reopens it.
    pub(super) fn reopen(&self) {
        let old = std::mem::replace(
            &mut *self.db.write().unwrap_or_else(|e| e.into_inner()),
            DbState::Broken("reopening after an I/O error".into()),
        );
        // Reopening rolls back to the last durable commit: what was read before may be gone.
        self.records.clear();
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
        let reopened = open_database(
            &self.target,
            false,
            self.cache_size,
            false,
            &self.sync_failure,
        )
        // Converted when first opened: a reopen never converts, so it reads no record.
        .and_then(|db| {
            init_tables_and_boot(&db, &self.path, false, self.quick_repair, &crate::NoIndexer)
                .map(|_| db)
        });
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
