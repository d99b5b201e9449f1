//! The tasks this command line created, kept in a small redb file (the client library's
//! [`HandleStore`]) so that `mcp-tasks ls` can list them with their last known status.
//!
//! Each command opens the file only for the moment it reads or writes it (redb lets one
//! process hold it at a time), so that a long `watch` never keeps another command out. A
//! command that cannot record a task warns and goes on: the task exists on the server
//! whatever the local list says.

use std::path::PathBuf;
use std::time::Duration;

use mcp_tasks::client::{ClientError, HandleStore, HttpTransport, SavedTask, Task, Transport};
use serde_json::{Value, json};

use super::{Connection, Failure, code, connect, print_json, print_table};

/// Tries to open a file another command holds, 100 ms apart.
const OPEN_TRIES: u32 = 30;

/// The handle store's path: --handle-store / MCP_TASKS_HANDLE_STORE, else under the XDG
/// state directory; `None` when set to an empty value or when no home is known.
fn path(conn: &Connection) -> Option<PathBuf> {
    match &conn.handle_store {
        Some(p) if p.is_empty() => None,
        Some(p) => Some(PathBuf::from(p)),
        None => {
            let state = std::env::var_os("XDG_STATE_HOME")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME")
                        .filter(|s| !s.is_empty())
                        .map(|h| PathBuf::from(h).join(".local").join("state"))
                })?;
            Some(state.join("mcp-tasks").join("tasks.redb"))
        }
    }
}

async fn open(path: &PathBuf) -> Result<HandleStore, ClientError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && let Err(e) = tokio::fs::create_dir_all(dir).await
    {
        return Err(ClientError::Store {
            message: format!("cannot create {}", dir.display()),
            source: Box::new(e),
        });
    }
    let mut tries = 0;
    loop {
        match HandleStore::open(path).await {
            Ok(store) => return Ok(store),
            // Most likely another command holds the file for a moment.
            Err(_) if tries + 1 < OPEN_TRIES => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Records a task `call` just created.
pub async fn remember(conn: &Connection, endpoint: &str, tool: &str, args: &Value, task: &Task) {
    let Some(path) = path(conn) else { return };
    let saved = SavedTask {
        version: 1,
        task_id: task.task_id.clone(),
        endpoint: endpoint.to_owned(),
        tool: tool.to_owned(),
        arguments: args.clone(),
        created_at_ms: now_ms(),
        status: task.status.as_str().to_owned(),
        answered: Vec::new(),
    };
    let result = match open(&path).await {
        Ok(store) => store.put(saved).await,
        Err(e) => Err(e),
    };
    if let Err(e) = result {
        eprintln!(
            "warning: task {} is not in the list of `mcp-tasks ls`: {e}",
            task.task_id
        );
    }
}

/// Records the status last seen of a task in the list (nothing when it is not there).
pub async fn record_status(conn: &Connection, endpoint: &str, task: &Task) {
    set_status(conn, endpoint, &task.task_id, task.status.as_str()).await;
}

async fn set_status(conn: &Connection, endpoint: &str, task_id: &str, status: &str) {
    let Some(path) = path(conn) else { return };
    let status = status.to_owned();
    let result = match open(&path).await {
        Ok(store) => {
            store
                .update(endpoint, task_id, move |s| s.status = status)
                .await
        }
        Err(e) => Err(e),
    };
    if let Err(e) = result {
        tracing::warn!(task = task_id, error = %e, "cannot record the task's status");
    }
}

fn created(ms: u64) -> String {
    let secs = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| ms.to_string())
}

/// `mcp-tasks ls`.
pub async fn ls(conn: &Connection, refresh: bool, all: bool, quiet: bool) -> Result<u8, Failure> {
    let endpoint = HttpTransport::new(&conn.url)?.endpoint();
    let Some(path) = path(conn) else {
        return Err(super::usage(
            "no handle store: --handle-store (MCP_TASKS_HANDLE_STORE) is empty and no home \
             directory is known",
        ));
    };
    let mut tasks = if tokio::fs::try_exists(&path).await.unwrap_or(false) {
        let store = open(&path).await?;
        store.list((!all).then_some(endpoint.as_str())).await?
    } else {
        Vec::new()
    };
    // Refreshed tasks' status messages, by id (a queued task says so there).
    let mut messages: std::collections::HashMap<String, Option<String>> = Default::default();
    if refresh {
        let client = connect(conn).await?;
        for saved in tasks.iter_mut().filter(|t| t.endpoint == endpoint) {
            let status = match client.resume(&saved.task_id).await?.get().await {
                Ok(task) => {
                    messages.insert(saved.task_id.clone(), task.status_message.clone());
                    task.status.as_str().to_owned()
                }
                Err(ClientError::UnknownTask { .. } | ClientError::MalformedTaskId { .. }) => {
                    "gone".to_owned()
                }
                Err(ClientError::TaskExpired { .. }) => "expired".to_owned(),
                Err(e) => return Err(e.into()),
            };
            if status != saved.status {
                set_status(conn, &endpoint, &saved.task_id, &status).await;
                saved.status = status;
            }
        }
    }
    if conn.json {
        print_json(&Value::Array(
            tasks
                .iter()
                .map(|t| {
                    let mut row = json!({
                        "taskId": t.task_id,
                        "status": t.status,
                        "tool": t.tool,
                        "arguments": t.arguments,
                        "createdAt": created(t.created_at_ms),
                        "server": t.endpoint,
                    });
                    if let Some(message) = messages.get(&t.task_id) {
                        row["statusMessage"] = json!(message);
                    }
                    row
                })
                .collect(),
        ));
        return Ok(code::COMPLETED);
    }
    let mut out = std::io::stdout().lock();
    if quiet {
        for t in &tasks {
            let _ = std::io::Write::write_all(&mut out, format!("{}\n", t.task_id).as_bytes());
        }
        return Ok(code::COMPLETED);
    }
    if tasks.is_empty() {
        eprintln!(
            "no tasks created from here{} (the list is kept in {})",
            if all { "" } else { " on this server" },
            path.display()
        );
        return Ok(code::COMPLETED);
    }
    // A task waiting in a server's flow-control queue shows it beside its status.
    let status = |t: &SavedTask| match messages.get(&t.task_id) {
        Some(Some(m)) if t.status == "working" && m.starts_with("queued: ") => {
            format!("{} ({m})", t.status)
        }
        _ => t.status.clone(),
    };
    if all {
        let rows: Vec<[String; 5]> = tasks
            .iter()
            .map(|t| {
                [
                    t.task_id.clone(),
                    status(t),
                    t.tool.clone(),
                    created(t.created_at_ms),
                    t.endpoint.clone(),
                ]
            })
            .collect();
        print_table(
            &mut out,
            ["TASK", "STATUS", "TOOL", "CREATED", "SERVER"],
            &rows,
        );
    } else {
        let rows: Vec<[String; 4]> = tasks
            .iter()
            .map(|t| {
                [
                    t.task_id.clone(),
                    status(t),
                    t.tool.clone(),
                    created(t.created_at_ms),
                ]
            })
            .collect();
        print_table(&mut out, ["TASK", "STATUS", "TOOL", "CREATED"], &rows);
    }
    Ok(code::COMPLETED)
}
