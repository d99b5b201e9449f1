//! The errors of the store boundary: [`StoreError`] and the [`Cause`] under it.

use std::path::PathBuf;
use std::sync::Arc;

/// Errors of the store boundary.
///
/// `Clone` because one failed group commit is reported to every waiter of that batch.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store was closed with [`Store::close`](crate::Store::close).
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
    /// showing them to readers. Restart the process (see [`Store::halted`](crate::Store::halted)).
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
    /// The store was written before its owner or listing index existed, and converting it
    /// means reading its records, but it was opened without an [`Indexer`](crate::Indexer); nothing was
    /// changed. Open it through the runtime (which hands in how its records are indexed) or
    /// with [`StoreOptions::indexer`](crate::StoreOptions::indexer) / `PostgresOptions::indexer` set.
    #[error(
        "the task store {store} has {what}, older than its owner and listing indexes; converting it reads its records, and it was opened without an indexer (open it through the mcp-tasks runtime or the `mcp-tasks` command; nothing was changed)"
    )]
    NeedsIndexer {
        /// The store (a path or a redacted URL).
        store: String,
        /// What was found ("table layout 2", "schema version 3").
        what: String,
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
