//! `subscriptions/listen` through the embedding API: acknowledgement first, committed
//! snapshots as `notifications/tasks`, ownership, latest-wins backpressure, shutdown.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use mcp_tasks::tool::{CallToolResult, TaskPolicy, ToolDescriptor, tool_fn};
use mcp_tasks::{Dispatched, MessageStream, Owner, RequestContext, Runtime};
use serde_json::{Value, json};

use crate::backend;
#[cfg(feature = "postgres")]
use backend::Place;
use tokio::sync::Notify;

fn request(id: Value, method: &str, mut params: Value, tasks: bool) -> Value {
    let caps = if tasks {
        json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } })
    } else {
        json!({})
    };
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps
    });
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

async fn call(rt: &Runtime, owner: &Owner, method: &str, params: Value) -> Value {
    rt.handle_json(request(json!(1), method, params, true), owner)
        .await
        .expect("a response")
}

async fn listen(rt: &Runtime, owner: &Owner, id: Value, task_ids: &[&str]) -> MessageStream {
    let msg = request(
        id,
        "subscriptions/listen",
        json!({ "notifications": { "taskIds": task_ids } }),
        true,
    );
    match rt
        .handle()
        .dispatch_json(msg, &RequestContext::new(owner.clone()))
        .await
    {
        Dispatched::Stream(s) => s,
        other => panic!("listen did not stream: {other:?}"),
    }
}

async fn next(stream: &mut MessageStream) -> Value {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("a message within 10 s")
        .expect("the stream is open")
}

/// A tool that sets `steps` status messages, waiting for `gate` before finishing.
fn stepper(gate: Arc<Notify>) -> Arc<dyn mcp_tasks::tool::Tool> {
    tool_fn(
        ToolDescriptor::new("stepper", "changes its status message many times")
            .task_policy(TaskPolicy::Always)
            .input_schema(
                json!({ "type": "object", "properties": { "steps": { "type": "integer" } } }),
            ),
        move |ctx, args| {
            let gate = gate.clone();
            async move {
                gate.notified().await;
                let steps = args.get("steps").and_then(Value::as_u64).unwrap_or(0);
                for i in 0..steps {
                    ctx.set_status(format!("step {i}")).await?;
                }
                Ok(CallToolResult::text("done"))
            }
        },
    )
}

async fn start(place: &Place, gate: Arc<Notify>) -> Runtime {
    place
        .builder("l")
        .await
        .tool(stepper(gate))
        .start()
        .await
        .unwrap()
}

fn strip(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("_meta");
        o.remove("resultType");
    }
    v
}

on_both_stores! {
async fn acknowledgement_first_then_committed_snapshots(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let gate = Arc::new(Notify::new());
    let rt = start(&place, gate.clone()).await;
    let me = Owner::anonymous();
    let created = call(
        &rt,
        &me,
        "tools/call",
        json!({ "name": "stepper", "arguments": { "steps": 3 } }),
    )
    .await;
    let task = created["result"]["taskId"].as_str().unwrap().to_owned();

    let mut stream = listen(
        &rt,
        &me,
        json!(42),
        &[&task, "tsk_00000000000000000000000000000000", "junk"],
    )
    .await;
    let ack = next(&mut stream).await;
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(
        ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        json!(42)
    );
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([task]),
        "only known own tasks are agreed"
    );

    // The current snapshot comes at once, equal to what tasks/get returns.
    let first = next(&mut stream).await;
    assert_eq!(first["method"], "notifications/tasks");
    assert_eq!(
        first["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        json!(42)
    );
    let get = call(&rt, &me, "tasks/get", json!({ "taskId": task })).await;
    assert_eq!(strip(first["params"].clone()), strip(get["result"].clone()));

    gate.notify_one();
    let mut last = first;
    while last["params"]["status"] != "completed" {
        let n = next(&mut stream).await;
        assert_eq!(
            n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
            json!(42)
        );
        assert!(n["params"]["lastUpdatedAt"].as_str() >= last["params"]["lastUpdatedAt"].as_str());
        last = n;
    }
    let get = call(&rt, &me, "tasks/get", json!({ "taskId": task })).await;
    assert_eq!(strip(last["params"].clone()), strip(get["result"].clone()));
    assert_eq!(last["params"]["result"]["content"][0]["text"], "done");

    // Shutdown ends the stream with the listen result.
    rt.begin_shutdown();
    let done = next(&mut stream).await;
    assert_eq!(done["id"], json!(42));
    assert_eq!(done["result"]["resultType"], "complete");
    assert_eq!(
        done["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        json!(42)
    );
    assert!(
        tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .unwrap()
            .is_none()
    );
    rt.shutdown().await;
    place.finish().await;
}
}

on_both_stores! {
async fn other_principals_tasks_are_not_acknowledged(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let rt = start(&place, Arc::new(Notify::new())).await;
    let alice = Owner::new("t", "alice");
    let mallory = Owner::new("t", "mallory");
    let created = call(
        &rt,
        &alice,
        "tools/call",
        json!({ "name": "stepper", "arguments": {} }),
    )
    .await;
    let task = created["result"]["taskId"].as_str().unwrap().to_owned();
    let mut stream = listen(&rt, &mallory, json!("sub-1"), &[&task]).await;
    let ack = next(&mut stream).await;
    assert_eq!(ack["params"]["notifications"]["taskIds"], json!([]));
    assert_eq!(
        ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        json!("sub-1")
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), stream.next())
            .await
            .is_err(),
        "nothing about alice's task"
    );

    // Without the extension, asking for task notifications is -32021.
    let msg = request(
        json!(7),
        "subscriptions/listen",
        json!({ "notifications": { "taskIds": [task] } }),
        false,
    );
    let reply = rt.handle_json(msg, &alice).await.unwrap();
    assert_eq!(reply["error"]["code"], -32021);
    rt.shutdown().await;
    place.finish().await;
}
}

on_both_stores! {
async fn a_reader_that_lags_gets_the_latest_snapshot_and_the_terminal_one(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let gate = Arc::new(Notify::new());
    let rt = start(&place, gate.clone()).await;
    let me = Owner::anonymous();
    let created = call(
        &rt,
        &me,
        "tools/call",
        json!({ "name": "stepper", "arguments": { "steps": 2000 } }),
    )
    .await;
    let task = created["result"]["taskId"].as_str().unwrap().to_owned();
    let mut stream = listen(&rt, &me, json!(9), &[&task]).await;
    gate.notify_one();
    // Do not read while the task makes 2,000 transitions (each one fsynced: on a loaded
    // 2-core machine this takes well over ten seconds, so the bound is generous).
    let mut completed = false;
    for _ in 0..4800 {
        let r = call(&rt, &me, "tasks/get", json!({ "taskId": task })).await;
        if r["result"]["status"] == "completed" {
            completed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(completed, "the task did not complete within two minutes");
    let mut received = 0;
    loop {
        let n = next(&mut stream).await;
        if n["method"] == "notifications/tasks" {
            received += 1;
            if n["params"]["status"] == "completed" {
                break;
            }
        }
    }
    assert!(
        received < 100,
        "intermediate snapshots were coalesced, got {received}"
    );
    rt.shutdown().await;
    place.finish().await;
}
}
