//! Opening the store file: creating it atomically with private permissions, redb's storage
//! backends that tell a failed fsync apart from other I/O errors, the tables' creation and the
//! boot epoch at each open.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use redb::{Database, DatabaseError, ReadableTable, StorageBackend, StorageError};

use super::layout::{stored_schema_version, upgrade_layout};
use super::panic_message;
use super::schema::*;
use crate::{BackendFactory, Indexer, META_BOOT_EPOCH, StoreError};

/// Where the bytes of a store live.
#[derive(Clone)]
pub(super) enum Target {
    File(PathBuf),
    Backend {
        label: PathBuf,
        factory: BackendFactory,
    },
}

impl Target {
    pub(super) fn path(&self) -> &Path {
        match self {
            Target::File(p) => p,
            Target::Backend { label, .. } => label,
        }
    }
}

/// A `Box<dyn StorageBackend>` as a `StorageBackend` (redb takes `impl StorageBackend`).
#[derive(Debug)]
pub(super) struct BoxedBackend(Box<dyn StorageBackend>);

impl StorageBackend for BoxedBackend {
    fn len(&self) -> std::io::Result<u64> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.0.write(offset, data)
    }
    fn close(&self) -> std::io::Result<()> {
        self.0.close()
    }
    fn try_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.0.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.0.try_lock_shared_range(start, end)
    }
    fn lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.0.lock_range(start, end)
    }
    fn lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.0.lock_shared_range(start, end)
    }
    fn unlock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.0.unlock_range(start, end)
    }
    fn query_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.0.query_lock_range(start, end)
    }
}

/// Remembers the first failed sync of the store's backends (shared by every reopen).
#[derive(Debug, Default)]
pub(super) struct SyncFailure(pub(super) Mutex<Option<String>>);

impl SyncFailure {
    pub(super) fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A backend that records failed syncs in a [`SyncFailure`]. redb reports a failed fsync like
/// any other I/O error of a commit; the store must tell them apart, because after a failed
/// fsync Linux may have dropped the written pages (marked clean, never written) while still
/// serving them from the page cache: reopening and going on would build on bytes that are not
/// on disk. A failed *write* (disk full) is safe to recover from by reopening.
#[derive(Debug)]
pub(super) struct SyncWatch {
    inner: BoxedBackend,
    failure: Arc<SyncFailure>,
}

impl StorageBackend for SyncWatch {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        let result = self.inner.sync_data();
        if let Err(e) = &result {
            let mut slot = self.failure.0.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                *slot = Some(format!("fsync failed: {e}"));
            }
        }
        result
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.inner.write(offset, data)
    }
    fn close(&self) -> std::io::Result<()> {
        self.inner.close()
    }
    fn try_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.inner.unlock_range(start, end)
    }
    fn query_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

/// Creates the tables (converting an older layout, its records indexed by `indexer`),
/// increments the boot epoch (when `bump`) and commits durably (with redb's quick repair when
/// `quick_repair`, see `StoreOptions::quick_repair`). Returns the epoch.
pub(super) fn init_tables_and_boot(
    db: &Database,
    path: &Path,
    bump: bool,
    quick_repair: bool,
    indexer: &dyn Indexer,
) -> Result<u64, StoreError> {
    let fail = |e: &dyn fmt::Display| StoreError::Open {
        path: path.to_path_buf(),
        detail: format!("initialising the tables failed: {e}"),
    };
    let run = || -> Result<u64, StoreError> {
        let mut txn = db.begin_write().map_err(|e| fail(&e))?;
        txn.set_quick_repair(quick_repair);
        let epoch = {
            // The layout first: a newer layout may have changed the other tables' types.
            // Returning drops the transaction, so a refused store is not changed, and a
            // converted one is converted in the same commit as the boot epoch.
            let started = std::time::Instant::now();
            if let Some(records) =
                upgrade_layout(&txn, indexer).map_err(|e| e.into_store_error(path))?
            {
                tracing::info!(
                    path = %path.display(),
                    records,
                    millis = started.elapsed().as_millis() as u64,
                    "converted the task store to table layout {SCHEMA_VERSION}"
                );
            }
            let mut meta = txn.open_table(META).map_err(|e| fail(&e))?;
            let previous = match meta.get(META_BOOT_EPOCH).map_err(|e| fail(&e))? {
                None => 0,
                Some(v) => {
                    let bytes: [u8; 8] = v.value().try_into().map_err(|_| StoreError::Corrupt {
                        path: path.to_path_buf(),
                        detail: format!(
                            "meta \"{META_BOOT_EPOCH}\" has {} bytes, expected 8",
                            v.value().len()
                        ),
                    })?;
                    u64::from_le_bytes(bytes)
                }
            };
            if bump {
                let epoch = previous.checked_add(1).ok_or_else(|| StoreError::Corrupt {
                    path: path.to_path_buf(),
                    detail: format!("meta \"{META_BOOT_EPOCH}\" is at its maximum"),
                })?;
                meta.insert(META_BOOT_EPOCH, epoch.to_le_bytes().as_slice())
                    .map_err(|e| fail(&e))?;
                epoch
            } else {
                previous
            }
        };
        txn.commit().map_err(|e| fail(&e))?;
        Ok(epoch)
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(r) => r,
        Err(panic) => Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: format!(
                "redb panicked while initialising it: {}",
                panic_message(&panic)
            ),
        }),
    }
}

/// Opens (or creates) the database of `target`; never panics (redb may panic on a file damaged
/// outside redb).
///
/// - A missing file is created atomically ([`create_atomically`]).
/// - An existing file must be a redb database; a corrupt, truncated or foreign file gives
///   [`StoreError::Corrupt`] (or [`StoreError::Open`]) naming the file, and is never recreated
///   or overwritten.
pub(super) fn open_database(
    target: &Target,
    verify: bool,
    cache_size: usize,
    create: bool,
    sync_failure: &Arc<SyncFailure>,
) -> Result<Database, StoreError> {
    let path = target.path();
    let open_err = |detail: String| StoreError::Open {
        path: path.to_path_buf(),
        detail,
    };
    let backend: Box<dyn StorageBackend> = match target {
        Target::File(path) => {
            let existed = path
                .try_exists()
                .map_err(|e| open_err(format!("cannot check whether the file exists: {e}")))?;
            if !existed {
                if !create {
                    return Err(open_err(
                        "the file is gone; it is not recreated empty".to_owned(),
                    ));
                }
                create_atomically(path)?;
            } else {
                refuse_newer_layout(path)?;
            }
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|e| open_err(e.to_string()))?;
            Box::new(redb::backends::FileBackend::new(file).map_err(|e| map_open_error(path, e))?)
        }
        Target::Backend { factory, .. } => {
            factory().map_err(|e| open_err(format!("the storage backend: {e}")))?
        }
    };
    let backend = SyncWatch {
        inner: BoxedBackend(backend),
        failure: Arc::clone(sync_failure),
    };
    let opened = catch_unwind(AssertUnwindSafe(|| {
        redb::Builder::new()
            .set_check_integrity_on_open(verify)
            .set_cache_size(cache_size)
            .create_with_backend(backend)
    }));
    let db = match opened {
        Ok(Ok(db)) => db,
        Ok(Err(e)) => return Err(map_open_error(path, e)),
        Err(panic) => {
            return Err(StoreError::Corrupt {
                path: path.to_path_buf(),
                detail: format!("redb panicked while opening it: {}", panic_message(&panic)),
            });
        }
    };
    Ok(db)
}

/// Refuses, before the writable open rewrites redb's header, a file whose layout version is
/// newer than this build's, so that such a file is left exactly as it was. Anything else a
/// read-only open cannot judge (a file needing recovery, a damaged or foreign one) is left to
/// the writable open, which reports or recovers it.
fn refuse_newer_layout(path: &Path) -> Result<(), StoreError> {
    let found = catch_unwind(AssertUnwindSafe(|| -> Option<u64> {
        use redb::ReadableDatabase;
        let db = redb::ReadOnlyDatabase::open(path).ok()?;
        let txn = db.begin_read().ok()?;
        let meta = txn.open_table(META).ok()?;
        let value = meta.get(META_SCHEMA_VERSION).ok()?;
        stored_schema_version(value.as_ref().map(|v| v.value())).ok()
    }));
    match found {
        Ok(Some(found)) if found > SCHEMA_VERSION => Err(StoreError::SchemaTooNew {
            store: path.display().to_string(),
            found: i64::try_from(found).unwrap_or(i64::MAX),
            supported: SCHEMA_VERSION as i64,
        }),
        _ => Ok(()),
    }
}

/// Creates an empty file that only its owner can read and write (`0600` on Unix).
pub(crate) fn create_private_file(path: &Path) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path).map(drop)
}

/// Logs a warning when an existing store file can be read by other users (it holds task data
/// and the `requestState` signing key).
pub(super) fn warn_if_readable_by_others(path: &Path) {
    #[cfg(unix)]
    if let Ok(meta) = std::fs::metadata(path) {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                mode = format!("{mode:o}"),
                "the store file is accessible to other users: it holds every task's data and the requestState signing key; run `chmod 600` on it"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// Creates a new store file so that a crash never leaves a half-initialised one at `path`:
/// the database is initialised (tables created, committed durably) in a temporary file beside
/// it, which is then renamed into place, and the directory is fsynced.
pub(crate) fn create_atomically(path: &Path) -> Result<(), StoreError> {
    let open_err = |detail: String| StoreError::Open {
        path: path.to_path_buf(),
        detail,
    };
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".creating");
    let tmp = path.with_file_name(name);
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(open_err(format!("cannot remove {}: {e}", tmp.display()))),
    }
    // The store holds every task's arguments, answers and results and the key that signs
    // `requestState`: it is created readable by its owner only. redb initialises an empty
    // existing file, so the file is made first with the right mode.
    create_private_file(&tmp)
        .map_err(|e| open_err(format!("cannot create {}: {e}", tmp.display())))?;
    let created = catch_unwind(AssertUnwindSafe(|| redb::Builder::new().create(&tmp)));
    let db = match created {
        Ok(Ok(db)) => db,
        Ok(Err(e)) => return Err(map_open_error(path, e)),
        Err(panic) => {
            return Err(open_err(format!(
                "redb panicked while creating it: {}",
                panic_message(&panic)
            )));
        }
    };
    // A new file: nothing to convert.
    init_tables_and_boot(&db, path, false, false, &crate::NoIndexer)?;
    db.close()
        .map_err(|e| open_err(format!("closing the new file failed: {e}")))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        open_err(format!(
            "cannot move the new file {} into place: {e}",
            tmp.display()
        ))
    })?;
    sync_parent_dir(path).map_err(|e| {
        open_err(format!(
            "created the file but could not fsync its directory: {e}"
        ))
    })
}

pub(super) fn map_open_error(path: &Path, e: DatabaseError) -> StoreError {
    let path = path.to_path_buf();
    match e {
        DatabaseError::DatabaseAlreadyOpen => StoreError::AlreadyOpen { path },
        DatabaseError::Storage(StorageError::Corrupted(detail)) => {
            StoreError::Corrupt { path, detail }
        }
        DatabaseError::Storage(StorageError::Io(io))
            if io.kind() == std::io::ErrorKind::InvalidData =>
        {
            StoreError::Corrupt {
                path,
                detail: io.to_string(),
            }
        }
        DatabaseError::UpgradeRequired(v) => StoreError::Open {
            path,
            detail: format!("the file has redb format version {v} and needs an upgrade"),
        },
        other => StoreError::Open {
            path,
            detail: other.to_string(),
        },
    }
}

/// fsyncs the directory holding `path`, so that a newly created file's entry survives a crash.
pub(super) fn sync_parent_dir(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        std::fs::File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        // Directories cannot be opened for fsync on this platform.
        let _ = path;
        Ok(())
    }
}
