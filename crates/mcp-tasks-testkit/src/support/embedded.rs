//! Requests to a runtime embedded in the test process (no transport): the helpers the
//! runtime, PostgreSQL and store administration suites share.

use std::time::Duration;

use mcp_tasks::{Owner, Runtime};
use serde_json::{Value, json};

/// `_meta` of a `2026-07-28` request; `tasks` = the client declares the Tasks extension.
pub fn meta(tasks: bool) -> Value {
    let caps = if tasks {
        json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } })
    } else {
        json!({})
    };
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps
    })
}

/// A JSON-RPC request with `meta(tasks)` in its params.
pub fn req(id: u64, method: &str, mut params: Value, tasks: bool) -> Value {
    params["_meta"] = meta(tasks);
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

/// Calls `method` as the anonymous owner, with the Tasks extension declared.
pub async fn call(rt: &Runtime, method: &str, params: Value) -> Value {
    rt.handle_json(req(1, method, params, true), &Owner::anonymous())
        .await
        .expect("a response")
}

/// Creates a task of `tool`; returns its id.
pub async fn create(rt: &Runtime, tool: &str, arguments: Value) -> String {
    let r = call(
        rt,
        "tools/call",
        json!({ "name": tool, "arguments": arguments }),
    )
    .await;
    assert_eq!(r["result"]["resultType"], "task", "{r}");
    r["result"]["taskId"].as_str().unwrap().to_owned()
}

/// `tasks/get`.
pub async fn get(rt: &Runtime, task: &str) -> Value {
    call(rt, "tasks/get", json!({ "taskId": task })).await
}

/// Polls until the task has `status` (bounded; real time because tools run on real timers).
pub async fn wait_status(rt: &Runtime, task: &str, status: &str) -> Value {
    for _ in 0..800 {
        let r = get(rt, task).await;
        if r["result"]["status"] == status {
            return r["result"].clone();
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("task {task} never became {status}: {}", get(rt, task).await);
}
