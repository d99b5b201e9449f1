//! The admin socket: how `mcp-tasks store …` reads a redb store that a running server holds.
//!
//! redb lets one process open a file, so a server that runs on `tasks.redb` listens on the
//! Unix socket `tasks.redb.admin.sock` beside it (`0600`: only the store's owner can
//! connect, as only they can read the file; bound in a private `0700` directory and renamed
//! into place, so it never exists with wider permissions, whatever the umask). A command connects, writes one JSON request
//! line, and reads one JSON response line. The server answers from read transactions of its
//! own — the same code the command runs on a file no server holds — so an answer never blocks
//! the server's writer and never changes the store. Only reading commands are served (and
//! `backup`, which writes a new file, never the store); nothing here can change a task.
//!
//! Unix only; elsewhere (or when the path is too long for a socket address) the server runs
//! without it and the commands ask the operator to stop the server first.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use super::{AdminError, Filter, Inspector, Location};
use crate::store::Store;

/// Longest request line accepted (a filter is small).
const MAX_REQUEST: usize = 64 * 1024;

/// What a command asks a running server.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", content = "arg", rename_all = "snake_case")]
pub(crate) enum Request {
    Stats,
    List(Filter),
    Show(String),
    Verify,
    Backup(PathBuf),
    PurgeDryRun(Filter),
    UsageByOwner,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Response {
    Ok(serde_json::Value),
    NoSuchTask(String),
    Error(String),
}

/// The socket path of the store at `store`: `<store>.admin.sock`.
pub fn socket_path(store: &Path) -> PathBuf {
    crate::store::inspect::admin_socket_path(store)
}

/// Asks the server that holds `location` (a redb file) through its admin socket.
pub(crate) async fn ask<T: DeserializeOwned>(
    location: &Location,
    request: Request,
) -> Result<T, AdminError> {
    let Some(path) = location.store_kind().admin_socket(location.as_str()) else {
        return Err(AdminError::Invalid(format!(
            "a {} store has no admin socket",
            location.kind()
        )));
    };
    let held = |detail: String| AdminError::InUse {
        path: location.display(),
        detail,
    };
    #[cfg(unix)]
    {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        if !path.exists() {
            return Err(held(format!(
                "it has no admin socket ({} is missing: a server started with `serve --no-admin-socket`, one older than this command, or one on a path too long for a socket); stop the server to read the file directly, or restart it without `--no-admin-socket`",
                path.display()
            )));
        }
        let sock_err = |detail: String| AdminError::Socket {
            path: path.clone(),
            detail,
        };
        let mut stream = tokio::net::UnixStream::connect(&path)
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::ConnectionRefused => held(format!(
                    "its admin socket {} does not answer (is the server stopped while still holding the file?)",
                    path.display()
                )),
                _ => sock_err(e.to_string()),
            })?;
        let mut line = serde_json::to_vec(&request).map_err(|e| sock_err(e.to_string()))?;
        line.push(b'\n');
        stream
            .write_all(&line)
            .await
            .map_err(|e| sock_err(e.to_string()))?;
        let mut reader = BufReader::new(stream);
        let mut answer = String::new();
        reader
            .read_line(&mut answer)
            .await
            .map_err(|e| sock_err(e.to_string()))?;
        if answer.is_empty() {
            return Err(sock_err(
                "the server closed the connection without answering".into(),
            ));
        }
        match serde_json::from_str::<Response>(&answer)
            .map_err(|e| sock_err(format!("unreadable answer: {e}")))?
        {
            Response::Ok(v) => {
                serde_json::from_value(v).map_err(|e| sock_err(format!("unexpected answer: {e}")))
            }
            Response::NoSuchTask(id) => Err(AdminError::NoSuchTask(id)),
            Response::Error(message) => Err(AdminError::Remote(message)),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = request;
        Err(held(format!(
            "admin sockets need Unix ({}); stop the server to read the file directly",
            path.display()
        )))
    }
}

/// A listening admin socket; removes its file when dropped.
pub struct AdminSocket {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl AdminSocket {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for AdminSocket {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Starts the admin socket of `store` (held by this process) if its backend has one (a redb
/// file: `<store>.admin.sock`); `Ok(None)` for other stores. For `Runtime::admin_socket`.
pub(crate) fn serve_store(store: &Store) -> Result<Option<AdminSocket>, AdminError> {
    match store.backend().inspector().and_then(|i| i.socket_file()) {
        Some(file) => bind(store.clone(), &file).map(Some),
        None => Ok(None),
    }
}

/// Starts answering admin requests for `store` (held by this process) on its socket.
/// A stale socket file (a server that crashed) is replaced: this process holds the store's
/// lock, so no other server can be using it.
#[cfg(unix)]
pub(crate) fn bind(store: Store, store_path: &Path) -> Result<AdminSocket, AdminError> {
    let path = socket_path(store_path);
    let sock_err = |detail: String| AdminError::Socket {
        path: path.clone(),
        detail,
    };
    match std::fs::remove_file(&path) {
        Ok(()) => tracing::debug!(path = %path.display(), "removed a stale admin socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(sock_err(format!("cannot remove the old socket: {e}"))),
    }
    let listener = bind_owner_only(&path, |_| {}).map_err(|e| sock_err(e.to_string()))?;
    let task = tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "admin socket accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            // The socket is bound only for a store that has an inspector (`serve_store`).
            let store = store.clone();
            tokio::spawn(async move {
                let Some(reader) = store.backend().inspector() else {
                    return;
                };
                if let Err(e) = serve_one(stream, reader).await {
                    tracing::debug!(error = %e, "admin socket connection failed");
                }
            });
        }
    });
    tracing::info!(path = %path.display(), "admin socket listening (mcp-tasks store … reads the live store through it)");
    Ok(AdminSocket { path, task })
}

/// Binds a Unix socket at `path` that is never reachable by anyone but this user, whatever the
/// process's umask: it is bound inside a new directory beside `path` created `0700` (a umask
/// can only narrow that), set `0600` there, and then renamed to `path` (an atomic rename in
/// the same directory), so `path` appears with its final mode. Binding at `path` and then
/// changing the mode would leave a window in which a socket made with a permissive umask
/// accepts anyone's connection. A umask set around the bind would be process-wide (racing
/// every other thread that creates files), and a peer-credential check would need a
/// platform-specific call on each connection; the private directory needs neither.
/// `before_publish` sees the bound socket inside its directory, before the rename (tests).
#[cfg(unix)]
fn bind_owner_only(
    path: &Path,
    before_publish: impl FnOnce(&Path),
) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    use std::sync::atomic::{AtomicU32, Ordering};
    static STAGINGS: AtomicU32 = AtomicU32::new(0);
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // Short, so that a path that fits a socket address fits here too.
    let staging = parent.join(format!(
        ".adm{:x}-{:x}",
        std::process::id(),
        STAGINGS.fetch_add(1, Ordering::Relaxed)
    ));
    let mut builder = std::fs::DirBuilder::new();
    builder.mode(0o700);
    if let Err(e) = builder.create(&staging) {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(e);
        }
        // Left by an earlier process with this id that crashed: never reuse it, replace it.
        std::fs::remove_dir_all(&staging)?;
        builder.create(&staging)?;
    }
    let bound = (|| {
        let staged = staging.join("s");
        let listener = tokio::net::UnixListener::bind(&staged)?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
        before_publish(&staged);
        std::fs::rename(&staged, path)?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&staging);
    bound
}

#[cfg(not(unix))]
pub(crate) fn bind(_store: Store, store_path: &Path) -> Result<AdminSocket, AdminError> {
    Err(AdminError::Unsupported(format!(
        "no admin socket for {} (Unix only)",
        store_path.display()
    )))
}

#[cfg(unix)]
async fn serve_one(stream: tokio::net::UnixStream, reader: &dyn Inspector) -> std::io::Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read.take(MAX_REQUEST as u64))
        .read_line(&mut line)
        .await?;
    let response = match serde_json::from_str::<Request>(&line) {
        Ok(request) => answer(reader, request).await,
        Err(e) => Response::Error(format!("unreadable request: {e}")),
    };
    let mut out = serde_json::to_vec(&response).unwrap_or_else(|e| {
        format!("{{\"error\":\"the answer does not serialise: {e}\"}}").into_bytes()
    });
    out.push(b'\n');
    write.write_all(&out).await?;
    write.shutdown().await
}

async fn answer(reader: &dyn Inspector, request: Request) -> Response {
    let now = super::now_ms();
    let result = match request {
        Request::Stats => super::stats_of(reader, now).await.map(|mut r| {
            r.via_server = true;
            to_value(&r)
        }),
        Request::List(filter) => super::list_of(reader, &filter, now)
            .await
            .map(|r| to_value(&r)),
        Request::Show(id) => super::show_of(reader, &id).await.map(|r| to_value(&r)),
        Request::Verify => super::verify_of(reader).await.map(|r| to_value(&r)),
        Request::Backup(to) => match reader {
            r if to.is_absolute() && !to.exists() => r.backup(&to).await.map(|r| to_value(&r)),
            _ if to.exists() => Err(AdminError::Invalid(format!(
                "{} exists; a backup never overwrites a file",
                to.display()
            ))),
            _ => Err(AdminError::Invalid(
                "a backup target must be an absolute path".into(),
            )),
        },
        Request::UsageByOwner => super::usage_of(reader).await.map(|mut r| {
            r.via_server = true;
            to_value(&r)
        }),
        Request::PurgeDryRun(filter) => super::select(reader, &filter, now).await.map(|tasks| {
            to_value(&super::PurgeReport {
                tasks,
                dry_run: true,
            })
        }),
    };
    match result {
        Ok(v) => Response::Ok(v),
        Err(AdminError::NoSuchTask(id)) => Response::NoSuchTask(id),
        Err(e) => Response::Error(e.to_string()),
    }
}

fn to_value<T: Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};

    use super::*;

    /// The socket is bound and restricted where nobody else can reach it, and appears at its
    /// path already `0600`: there is no moment at which its path accepts anyone else's
    /// connection, whatever the umask.
    #[tokio::test]
    async fn the_admin_socket_appears_with_its_final_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb.admin.sock");
        let mut seen = false;
        let listener = bind_owner_only(&path, |staged| {
            assert!(
                !path.exists(),
                "nothing at the final path before the rename"
            );
            let parent = staged.parent().unwrap();
            assert!(parent.starts_with(dir.path()) && parent != dir.path());
            let dir_mode = std::fs::metadata(parent).unwrap().permissions().mode();
            assert_eq!(dir_mode & 0o077, 0, "a private directory: {dir_mode:o}");
            let mode = std::fs::symlink_metadata(staged)
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
            seen = true;
        })
        .unwrap();
        assert!(seen);
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // The renamed socket still listens, and the staging directory is gone.
        let (connected, accepted) =
            tokio::join!(tokio::net::UnixStream::connect(&path), listener.accept());
        connected.unwrap();
        accepted.unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("t.redb.admin.sock")]);
    }
}
