//! `mcp-tasks demo --replicas 2 --store postgres://…`: two replicas over one PostgreSQL
//! database, step by step: replica a starts a task and pauses past its lease, replica b takes
//! the task over and completes it, a wakes and its late completion is refused by the fence.
//!
//! Runs in a fresh schema of the given database (dropped at the end), in this process: the
//! pause is a's heartbeat stopping while its tool is held, as a `SIGSTOP` would.

use std::io::Write;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use mcp_tasks::store::{Cluster, PostgresOptions, PostgresStore, Store, TaskStore};
use mcp_tasks::tool::{CallToolResult, TaskPolicy, Tool, ToolDescriptor, ToolError, tool_fn};
use mcp_tasks::{Owner, Runtime};

/// Why the replica demo failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicasDemoError {
    /// Writing the report failed.
    #[error("writing the demo output failed: {0}")]
    Io(#[from] std::io::Error),
    /// The database or a replica failed.
    #[error("{0}")]
    Failed(String),
}

fn failed(e: impl std::fmt::Display) -> ReplicasDemoError {
    ReplicasDemoError::Failed(e.to_string())
}

/// `sleep_task` for the demo: sleeps `ms`, then (on a paused node) waits until it wakes; the
/// result names the node.
fn sleep_task(node: &'static str, paused: Arc<AtomicBool>) -> Arc<dyn Tool> {
    let descriptor = ToolDescriptor::new("sleep_task", "Sleeps `ms` milliseconds.")
        .input_schema(json!({
            "type": "object",
            "properties": { "ms": { "type": "integer", "minimum": 0 } },
            "required": ["ms"]
        }))
        .task_policy(TaskPolicy::Always);
    tool_fn(descriptor, move |ctx, args| {
        let paused = paused.clone();
        async move {
            let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(0);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                _ = ctx.cancelled() => return Err(ToolError::Cancelled),
            }
            while paused.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(CallToolResult::text(format!(
                "Slept {ms} ms on node {node}."
            )))
        }
    })
}

fn request(method: &str, params: Value) -> Value {
    let mut params = params;
    params["_meta"] = crate::demo::client_meta();
    json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params })
}

async fn get(rt: &Runtime, task: &str) -> Result<Value, ReplicasDemoError> {
    let r = rt
        .handle_json(
            request("tasks/get", json!({ "taskId": task })),
            &Owner::anonymous(),
        )
        .await
        .ok_or_else(|| failed("no answer to tasks/get"))?;
    r.get("result")
        .cloned()
        .ok_or_else(|| failed(format!("tasks/get failed: {r}")))
}

fn lease_text(lease: Option<mcp_tasks::store::Lease>) -> String {
    lease.map_or_else(|| "not stored".to_owned(), |l| l.to_string())
}

fn text(result: &Value) -> String {
    result["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

/// Plays the demo against the database at `url` and writes each step to `out`.
pub async fn run(url: &str, out: &mut impl Write) -> Result<(), ReplicasDemoError> {
    let config = tokio_postgres::Config::from_str(url)
        .map_err(|e| failed(format!("the PostgreSQL URL does not parse: {e}")))?;
    let mut suffix = [0u8; 4];
    getrandom::fill(&mut suffix).map_err(failed)?;
    let schema = format!("mcp_tasks_demo_{:08x}", u32::from_le_bytes(suffix));
    let result = play(url, &schema, out).await;
    // The demo leaves nothing behind.
    if let Ok((client, conn)) = config.connect(tokio_postgres::NoTls).await {
        let conn = tokio::spawn(conn);
        let _ = client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .await;
        drop(client);
        let _ = conn.await;
    }
    result
}

async fn play(url: &str, schema: &str, out: &mut impl Write) -> Result<(), ReplicasDemoError> {
    let ttl = Duration::from_secs(2);
    let options = |node: &str| PostgresOptions {
        node_id: Some(node.to_owned()),
        lease_ttl: ttl,
        schema: Some(schema.to_owned()),
        pool_size: 4,
        ..PostgresOptions::default()
    };
    let paused = Arc::new(AtomicBool::new(false));
    let a_store = Arc::new(
        PostgresStore::open(url, options("a"))
            .await
            .map_err(failed)?,
    );
    let b_store = Arc::new(
        PostgresStore::open(url, options("b"))
            .await
            .map_err(failed)?,
    );
    let a = Runtime::builder_with_store(Store::from_backend(a_store.clone()))
        .tool(sleep_task("a", paused.clone()))
        .start()
        .await
        .map_err(failed)?;
    let b = Runtime::builder_with_store(Store::from_backend(b_store.clone()))
        .tool(sleep_task("b", Arc::new(AtomicBool::new(false))))
        .start()
        .await
        .map_err(failed)?;
    writeln!(
        out,
        "replicas a and b share {}, lease TTL {ttl:?}",
        a_store.describe()
    )?;

    let created = a
        .handle_json(
            request(
                "tools/call",
                json!({ "name": "sleep_task", "arguments": { "ms": 1000 } }),
            ),
            &Owner::anonymous(),
        )
        .await
        .ok_or_else(|| failed("no answer to tools/call"))?;
    let task = created["result"]["taskId"]
        .as_str()
        .ok_or_else(|| failed(format!("tools/call did not create a task: {created}")))?
        .to_owned();
    let lease = lease_text(a_store.lease_of(&task).await.map_err(failed)?);
    writeln!(
        out,
        "1. a: tools/call sleep_task {{ms: 1000}} -> task {task} (lease: {lease})"
    )?;

    // a pauses: no heartbeat, and its tool will not finish until it wakes.
    paused.store(true, Ordering::SeqCst);
    mcp_tasks::internals::pg_faults::pause_heartbeat(&a_store, true);
    let paused_at = Instant::now();
    writeln!(
        out,
        "2. a pauses (no heartbeat; its tool is held, as under SIGSTOP)"
    )?;

    let deadline = Instant::now() + Duration::from_secs(30);
    while !b_store.holds(&task) {
        if Instant::now() > deadline {
            return Err(failed("b never took the task over"));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lease = lease_text(b_store.lease_of(&task).await.map_err(failed)?);
    writeln!(
        out,
        "3. b: took the task over {:.1} s after a paused (lease: {lease})",
        paused_at.elapsed().as_secs_f64()
    )?;
    let done = loop {
        let r = get(&b, &task).await?;
        if r["status"] == "completed" {
            break r;
        }
        if Instant::now() > deadline {
            return Err(failed(format!("b never completed the task: {r}")));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    writeln!(out, "4. b: task completed: \"{}\"", text(&done))?;

    // a wakes: its tool finishes, and its completion is refused.
    mcp_tasks::internals::pg_faults::pause_heartbeat(&a_store, false);
    paused.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    while a_store.holds(&task) {
        if Instant::now() > deadline {
            return Err(failed("a's late completion was never attempted"));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    writeln!(
        out,
        "5. a wakes: its tool completes (\"Slept 1000 ms on node a.\"), and the write is refused: fenced (a no longer holds the lease)"
    )?;
    let from_a = get(&a, &task).await?;
    let from_b = get(&b, &task).await?;
    let lease = lease_text(b_store.lease_of(&task).await.map_err(failed)?);
    writeln!(
        out,
        "6. a: tasks/get -> {} \"{}\"; b: tasks/get -> {} \"{}\" (lease: {lease})",
        from_a["status"].as_str().unwrap_or(""),
        text(&from_a),
        from_b["status"].as_str().unwrap_or(""),
        text(&from_b),
    )?;
    let unchanged = from_a == done && from_b == done;
    writeln!(
        out,
        "{}",
        if unchanged {
            "the task was completed once, by b; the record never changed after that"
        } else {
            "UNEXPECTED: the record changed after b completed the task"
        }
    )?;
    a.shutdown().await;
    b.shutdown().await;
    if unchanged {
        Ok(())
    } else {
        Err(failed("the fence did not hold"))
    }
}
