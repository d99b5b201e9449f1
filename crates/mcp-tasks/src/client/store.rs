//! Durable task handles: a small redb file of the tasks a client created, so that a client
//! that restarts can list them and pick them up again ([`super::Client::saved_tasks`],
//! [`super::Client::resume`]).
//!
//! One table, keyed by `endpoint NUL task id`; each value is a JSON object with a format
//! version (`"v": 1`), so that a newer client can still read what an older one wrote. Every
//! call runs on the blocking pool; redb locks the file, so one process uses it at a time.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ClientError;

const TASKS: TableDefinition<&str, &[u8]> = TableDefinition::new("client_tasks");

/// What the client remembers of a task it created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedTask {
    /// The format version of this record.
    #[serde(rename = "v")]
    pub version: u32,
    /// The task's id.
    pub task_id: String,
    /// The server, as [`super::Transport::endpoint`] names it.
    pub endpoint: String,
    /// The tool called.
    pub tool: String,
    /// Its arguments.
    pub arguments: Value,
    /// When the client created the task (milliseconds since the Unix epoch, client clock).
    pub created_at_ms: u64,
    /// The last status the client saw.
    pub status: String,
    /// Input keys the client has answered (never answered twice, across restarts too).
    #[serde(default)]
    pub answered: Vec<String>,
}

/// The file of durable handles. Cheap to clone.
#[derive(Clone)]
pub struct HandleStore {
    db: Arc<Database>,
    path: PathBuf,
}

impl std::fmt::Debug for HandleStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandleStore")
            .field("path", &self.path)
            .finish()
    }
}

fn store_err(path: &Path, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> ClientError {
    ClientError::Store {
        message: path.display().to_string(),
        source: e.into(),
    }
}

fn panicked(e: tokio::task::JoinError) -> ClientError {
    ClientError::Store {
        message: "the store task panicked".into(),
        source: Box::new(e),
    }
}

fn key(endpoint: &str, task_id: &str) -> String {
    format!("{endpoint}\u{0}{task_id}")
}

impl HandleStore {
    /// Opens (or creates) the file at `path`.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, ClientError> {
        let path = path.as_ref().to_owned();
        tokio::task::spawn_blocking(move || {
            let db = Database::create(&path).map_err(|e| store_err(&path, e))?;
            let tx = db.begin_write().map_err(|e| store_err(&path, e))?;
            tx.open_table(TASKS).map_err(|e| store_err(&path, e))?;
            tx.commit().map_err(|e| store_err(&path, e))?;
            Ok(Self {
                db: Arc::new(db),
                path,
            })
        })
        .await
        .map_err(panicked)?
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database, &Path) -> Result<T, ClientError> + Send + 'static,
    ) -> Result<T, ClientError> {
        let db = self.db.clone();
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || f(&db, &path))
            .await
            .map_err(panicked)?
    }

    /// Inserts or replaces a record.
    pub async fn put(&self, task: SavedTask) -> Result<(), ClientError> {
        self.blocking(move |db, path| {
            let bytes = serde_json::to_vec(&task).map_err(|e| store_err(path, e))?;
            let tx = db.begin_write().map_err(|e| store_err(path, e))?;
            {
                let mut table = tx.open_table(TASKS).map_err(|e| store_err(path, e))?;
                table
                    .insert(
                        key(&task.endpoint, &task.task_id).as_str(),
                        bytes.as_slice(),
                    )
                    .map_err(|e| store_err(path, e))?;
            }
            tx.commit().map_err(|e| store_err(path, e))
        })
        .await
    }

    /// The record of one task.
    pub async fn get(
        &self,
        endpoint: &str,
        task_id: &str,
    ) -> Result<Option<SavedTask>, ClientError> {
        let k = key(endpoint, task_id);
        self.blocking(move |db, path| {
            let tx = db.begin_read().map_err(|e| store_err(path, e))?;
            let table = tx.open_table(TASKS).map_err(|e| store_err(path, e))?;
            match table.get(k.as_str()).map_err(|e| store_err(path, e))? {
                Some(v) => decode(path, v.value()).map(Some),
                None => Ok(None),
            }
        })
        .await
    }

    /// Changes one record in place (no-op when it is absent).
    pub async fn update(
        &self,
        endpoint: &str,
        task_id: &str,
        change: impl FnOnce(&mut SavedTask) + Send + 'static,
    ) -> Result<(), ClientError> {
        let k = key(endpoint, task_id);
        self.blocking(move |db, path| {
            let tx = db.begin_write().map_err(|e| store_err(path, e))?;
            {
                let mut table = tx.open_table(TASKS).map_err(|e| store_err(path, e))?;
                let current = match table.get(k.as_str()).map_err(|e| store_err(path, e))? {
                    Some(v) => Some(decode(path, v.value())?),
                    None => None,
                };
                if let Some(mut task) = current {
                    change(&mut task);
                    let bytes = serde_json::to_vec(&task).map_err(|e| store_err(path, e))?;
                    table
                        .insert(k.as_str(), bytes.as_slice())
                        .map_err(|e| store_err(path, e))?;
                }
            }
            tx.commit().map_err(|e| store_err(path, e))
        })
        .await
    }

    /// Every record of `endpoint` (all of them with `None`), oldest first.
    pub async fn list(&self, endpoint: Option<&str>) -> Result<Vec<SavedTask>, ClientError> {
        let endpoint = endpoint.map(str::to_owned);
        self.blocking(move |db, path| {
            let tx = db.begin_read().map_err(|e| store_err(path, e))?;
            let table = tx.open_table(TASKS).map_err(|e| store_err(path, e))?;
            let mut out = Vec::new();
            for entry in table.iter().map_err(|e| store_err(path, e))? {
                let (_, v) = entry.map_err(|e| store_err(path, e))?;
                let task = decode(path, v.value())?;
                if endpoint.as_deref().is_none_or(|e| e == task.endpoint) {
                    out.push(task);
                }
            }
            out.sort_by(|a, b| (a.created_at_ms, &a.task_id).cmp(&(b.created_at_ms, &b.task_id)));
            Ok(out)
        })
        .await
    }

    /// Forgets one task; `true` when it was there.
    pub async fn remove(&self, endpoint: &str, task_id: &str) -> Result<bool, ClientError> {
        let k = key(endpoint, task_id);
        self.blocking(move |db, path| {
            let tx = db.begin_write().map_err(|e| store_err(path, e))?;
            let removed = {
                let mut table = tx.open_table(TASKS).map_err(|e| store_err(path, e))?;
                table
                    .remove(k.as_str())
                    .map_err(|e| store_err(path, e))?
                    .is_some()
            };
            tx.commit().map_err(|e| store_err(path, e))?;
            Ok(removed)
        })
        .await
    }
}

fn decode(path: &Path, bytes: &[u8]) -> Result<SavedTask, ClientError> {
    let task: SavedTask = serde_json::from_slice(bytes).map_err(|e| store_err(path, e))?;
    if task.version != 1 {
        return Err(store_err(
            path,
            format!(
                "a handle record has format version {}, this client reads 1",
                task.version
            ),
        ));
    }
    Ok(task)
}
