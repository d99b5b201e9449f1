//! Runtime features of a complete MCP server, independent of the conformance fixtures:
//! completions with a real handler, readable resource templates and binary resources,
//! progress of a synchronous call on its response SSE stream (and never on a listen stream; a
//! task's progress is its `statusMessage`), and SEP-2243 `x-mcp-header` argument mirroring
//! checked against the body, with base64-encoded values.
//!
//! The HTTP tests run a real server on 127.0.0.1:0 with the small HTTP/1.1 client of
//! `support/raw_http.rs`, so that they see the exact bytes on the wire.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use base64::Engine as _;
use mcp_tasks::catalog::{
    Completion, CompletionRef, GetPromptResult, PromptDescriptor, Resource, ResourceContents,
    ResourceTemplate, completer_fn, prompt_fn,
};
use mcp_tasks::store::{Durability, StoreOptions};
use mcp_tasks::tool::{CallToolResult, TaskPolicy, Tool, ToolDescriptor, ToolError, tool_fn};
use mcp_tasks::transport::http::{self, HttpConfig};
use mcp_tasks::{Owner, Runtime, RuntimeBuilder, StartError};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

use crate::support;

use support::raw_http::{mcp_headers, post, post_sse, post_with, with};
use support::{VERSION, WAIT};

const TASKS: &str = "io.modelcontextprotocol/tasks";

// ---------------------------------------------------------------------------------------------
// Messages

fn request(id: u64, method: &str, mut params: Value, caps: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": caps,
    });
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

fn call(id: u64, tool: &str, arguments: Value) -> Value {
    request(
        id,
        "tools/call",
        json!({ "name": tool, "arguments": arguments }),
        json!({}),
    )
}

fn with_progress_token(mut message: Value, token: Value) -> Value {
    message["params"]["_meta"]["progressToken"] = token;
    message
}

fn code(r: &Value) -> i64 {
    r["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("an error: {r}"))
}

fn b64(s: &str) -> String {
    format!(
        "=?base64?{}?=",
        base64::engine::general_purpose::STANDARD.encode(s)
    )
}

// ---------------------------------------------------------------------------------------------
// Runtimes and servers

fn builder(dir: &tempfile::TempDir) -> RuntimeBuilder {
    Runtime::builder(dir.path().join("tasks.redb")).store_options(StoreOptions {
        durability: Durability::None,
        ..StoreOptions::default()
    })
}

struct Server {
    addr: SocketAddr,
    rt: Option<Runtime>,
    stop: Option<oneshot::Sender<()>>,
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

async fn serve(dir: tempfile::TempDir, rt: Runtime) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let serving = tokio::spawn(http::serve(
        listener,
        http::router(rt.handle(), HttpConfig::default()),
        async {
            let _ = rx.await;
        },
    ));
    Server {
        addr,
        rt: Some(rt),
        stop: Some(tx),
        serving,
        _dir: dir,
    }
}

impl Server {
    async fn stop(mut self) {
        let rt = self.rt.take().unwrap();
        rt.begin_shutdown();
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(WAIT, &mut self.serving)
            .await
            .expect("the transport drains in time")
            .unwrap()
            .unwrap();
        rt.shutdown().await;
    }
}

// ---------------------------------------------------------------------------------------------
// Completions

fn cities() -> Vec<String> {
    let mut all: Vec<String> = ["paris", "park city", "parma", "rome", "roma"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    all.extend((0..150).map(|i| format!("town {i:03}")));
    all
}

fn trip_prompt() -> Arc<dyn mcp_tasks::catalog::Prompt> {
    prompt_fn(
        PromptDescriptor::new("trip", "Plans a trip.")
            .argument("country", "The country.", true)
            .argument("city", "The city.", true),
        |_, args| async move {
            Ok(GetPromptResult::user_text(format!(
                "Go to {}.",
                args["city"]
            )))
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_with_a_real_handler() {
    let dir = tempfile::tempdir().unwrap();
    let rt = builder(&dir)
        .prompt(trip_prompt())
        .prompt(prompt_fn(
            PromptDescriptor::new("plain", "No completer.").argument("x", "x", false),
            |_, _| async { Ok(GetPromptResult::user_text("plain")) },
        ))
        .resource_template(ResourceTemplate::new("db://{table}/{row}", "row"))
        .completion(
            CompletionRef::Prompt("trip".into()),
            completer_fn(|request| async move {
                // The context narrows the candidates: a country already chosen.
                let italy = request.context.get("country").map(String::as_str) == Some("it");
                let candidates = cities()
                    .into_iter()
                    .filter(|c| !italy || c.starts_with("r") || c == "parma");
                match request.argument.as_str() {
                    "city" => Ok(Completion::matching(candidates, &request.value)),
                    "country" => Ok(Completion::matching(["fr", "it"], &request.value)),
                    _ => Err(ToolError::rpc(-32602, "no such argument")),
                }
            }),
        )
        .completion(
            CompletionRef::ResourceTemplate("db://{table}/{row}".into()),
            completer_fn(|request| async move {
                assert_eq!(request.owner, Owner::anonymous());
                Ok(Completion::matching(["users", "orders"], &request.value))
            }),
        )
        .start()
        .await
        .unwrap();
    let owner = Owner::anonymous();
    let ask = |id: u64, params: Value| {
        let msg = request(id, "completion/complete", params, json!({}));
        let rt = &rt;
        let owner = &owner;
        async move { rt.handle_json(msg, owner).await.unwrap() }
    };

    let discover = rt
        .handle_json(request(0, "server/discover", json!({}), json!({})), &owner)
        .await
        .unwrap();
    assert_eq!(discover["result"]["capabilities"]["completions"], json!({}));

    let r = ask(
        1,
        json!({ "ref": { "type": "ref/prompt", "name": "trip" },
                "argument": { "name": "city", "value": "par" } }),
    )
    .await;
    assert_eq!(
        r["result"]["completion"],
        json!({ "values": ["paris", "park city", "parma"], "total": 3, "hasMore": false }),
        "{r}"
    );
    assert_eq!(r["result"]["resultType"], "complete");

    // Context arguments reach the handler.
    let r = ask(
        2,
        json!({ "ref": { "type": "ref/prompt", "name": "trip" },
                "argument": { "name": "city", "value": "par" },
                "context": { "arguments": { "country": "it" } } }),
    )
    .await;
    assert_eq!(r["result"]["completion"]["values"], json!(["parma"]), "{r}");

    // More than 100 values: truncated, with the total and hasMore.
    let r = ask(
        3,
        json!({ "ref": { "type": "ref/prompt", "name": "trip" },
                "argument": { "name": "city", "value": "town" } }),
    )
    .await;
    let completion = &r["result"]["completion"];
    assert_eq!(completion["values"].as_array().unwrap().len(), 100, "{r}");
    assert_eq!(completion["total"], 150);
    assert_eq!(completion["hasMore"], true);

    // Template variables.
    let r = ask(
        4,
        json!({ "ref": { "type": "ref/resource", "uri": "db://{table}/{row}" },
                "argument": { "name": "table", "value": "o" } }),
    )
    .await;
    assert_eq!(
        r["result"]["completion"]["values"],
        json!(["orders"]),
        "{r}"
    );

    // A prompt without a completer has no suggestions.
    let r = ask(
        5,
        json!({ "ref": { "type": "ref/prompt", "name": "plain" },
                "argument": { "name": "x", "value": "a" } }),
    )
    .await;
    assert_eq!(r["result"]["completion"]["values"], json!([]), "{r}");

    // Unknown prompts, templates and arguments, malformed requests: -32602.
    for (id, params) in [
        (
            6,
            json!({ "ref": { "type": "ref/prompt", "name": "nope" }, "argument": { "name": "x", "value": "" } }),
        ),
        (
            7,
            json!({ "ref": { "type": "ref/prompt", "name": "trip" }, "argument": { "name": "zip", "value": "" } }),
        ),
        (
            8,
            json!({ "ref": { "type": "ref/resource", "uri": "db://{x}" }, "argument": { "name": "x", "value": "" } }),
        ),
        (
            9,
            json!({ "ref": { "type": "ref/resource", "uri": "db://{table}/{row}" }, "argument": { "name": "col", "value": "" } }),
        ),
        (
            10,
            json!({ "ref": { "type": "ref/tool", "name": "trip" }, "argument": { "name": "city", "value": "" } }),
        ),
        (
            11,
            json!({ "ref": { "type": "ref/prompt", "name": "trip" }, "argument": { "name": "city" } }),
        ),
        (12, json!({ "argument": { "name": "city", "value": "" } })),
        (
            13,
            json!({ "ref": { "type": "ref/prompt", "name": "trip" }, "argument": { "name": "city", "value": "" },
                    "context": { "arguments": { "country": 1 } } }),
        ),
    ] {
        let r = ask(id, params.clone()).await;
        assert_eq!(code(&r), -32602, "{params} → {r}");
    }
    // A handler's own error.
    let r = ask(
        14,
        json!({ "ref": { "type": "ref/prompt", "name": "trip" }, "argument": { "name": "country", "value": "f" } }),
    )
    .await;
    assert_eq!(r["result"]["completion"]["values"], json!(["fr"]), "{r}");
    rt.shutdown().await;

    // Without completers, the capability is absent and the method unknown.
    let dir = tempfile::tempdir().unwrap();
    let rt = builder(&dir).prompt(trip_prompt()).start().await.unwrap();
    let discover = rt
        .handle_json(request(0, "server/discover", json!({}), json!({})), &owner)
        .await
        .unwrap();
    assert!(
        discover["result"]["capabilities"]
            .get("completions")
            .is_none()
    );
    let r = rt
        .handle_json(
            request(
                1,
                "completion/complete",
                json!({ "ref": { "type": "ref/prompt", "name": "trip" },
                        "argument": { "name": "city", "value": "p" } }),
                json!({}),
            ),
            &owner,
        )
        .await
        .unwrap();
    assert_eq!(code(&r), -32601, "{r}");
    rt.shutdown().await;

    // A completer for something not registered stops the start.
    let dir = tempfile::tempdir().unwrap();
    let started = builder(&dir)
        .completion(
            CompletionRef::Prompt("ghost".into()),
            completer_fn(|_| async { Ok(Completion::default()) }),
        )
        .start()
        .await;
    assert!(matches!(started, Err(StartError::Catalog(_))));
}

// ---------------------------------------------------------------------------------------------
// Resources

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_are_readable_and_binary_resources_are_base64() {
    let dir = tempfile::tempdir().unwrap();
    let rt = builder(&dir)
        .resource(Resource::blob(
            "test://logo",
            "logo",
            "image/png",
            vec![0x89, b'P', b'N', b'G'],
        ))
        .resource(Resource::text(
            "test://notes/fixed",
            "fixed",
            "A registered resource wins.",
        ))
        .resource_template(
            ResourceTemplate::new("test://notes/{id}", "note")
                .mime_type("text/plain")
                .reader(|request| async move {
                    let id = &request.variables["id"];
                    match id.as_str() {
                        "missing" => Ok(Vec::new()),
                        "secret" => Err(ToolError::rpc(-32602, "Invalid params: not yours")),
                        "panic" => panic!("a reader bug"),
                        _ => Ok(vec![ResourceContents::text(
                            request.uri.clone(),
                            "text/plain",
                            format!("Note {id}."),
                        )]),
                    }
                }),
        )
        .resource_template(
            ResourceTemplate::new("test://blobs/{name}.bin", "blob").reader(|request| async move {
                Ok(vec![ResourceContents::blob(
                    request.uri,
                    "application/octet-stream",
                    request.variables["name"].as_bytes().to_vec(),
                )])
            }),
        )
        .resource_template(ResourceTemplate::new("test://listed/{id}", "listed only"))
        .start()
        .await
        .unwrap();
    let owner = Owner::anonymous();
    let read = |id: u64, uri: &str| {
        let msg = request(id, "resources/read", json!({ "uri": uri }), json!({}));
        let rt = &rt;
        let owner = &owner;
        async move { rt.handle_json(msg, owner).await.unwrap() }
    };

    let r = read(1, "test://logo").await;
    assert_eq!(
        r["result"]["contents"],
        json!([{ "uri": "test://logo", "mimeType": "image/png", "blob": "iVBORw==" }]),
        "{r}"
    );
    let r = read(2, "test://notes/42").await;
    assert_eq!(
        r["result"]["contents"],
        json!([{ "uri": "test://notes/42", "mimeType": "text/plain", "text": "Note 42." }]),
        "{r}"
    );
    // Variables are percent-decoded.
    let r = read(3, "test://notes/a%20b").await;
    assert_eq!(r["result"]["contents"][0]["text"], "Note a b.", "{r}");
    let r = read(4, "test://notes/fixed").await;
    assert_eq!(
        r["result"]["contents"][0]["text"],
        "A registered resource wins."
    );
    let r = read(5, "test://blobs/abc.bin").await;
    assert_eq!(r["result"]["contents"][0]["blob"], "YWJj", "{r}");
    assert!(r["result"]["ttlMs"].is_u64() && r["result"]["cacheScope"].is_string());

    // Nothing there: -32602 with the URI (never empty contents).
    for (id, uri) in [
        (6, "test://notes/missing"),
        (7, "test://notes/1/2"),
        (8, "test://listed/1"),
        (9, "test://elsewhere"),
    ] {
        let r = read(id, uri).await;
        assert_eq!(code(&r), -32602, "{uri}: {r}");
        assert_eq!(r["error"]["data"]["uri"], uri, "{r}");
    }
    // A reader's own error, and a reader that panics.
    let r = read(10, "test://notes/secret").await;
    assert_eq!(r["error"]["message"], "Invalid params: not yours", "{r}");
    let r = read(11, "test://notes/panic").await;
    assert_eq!(code(&r), -32603, "{r}");

    let r = rt
        .handle_json(
            request(12, "resources/templates/list", json!({}), json!({})),
            &owner,
        )
        .await
        .unwrap();
    assert_eq!(
        r["result"]["resourceTemplates"].as_array().unwrap().len(),
        3
    );
    rt.shutdown().await;

    // A readable template this runtime cannot match stops the start.
    let dir = tempfile::tempdir().unwrap();
    let started = builder(&dir)
        .resource_template(
            ResourceTemplate::new("test://{+path}", "path").reader(|_| async { Ok(Vec::new()) }),
        )
        .start()
        .await;
    assert!(matches!(started, Err(StartError::Catalog(_))));
}

// ---------------------------------------------------------------------------------------------
// Progress

/// Reports 1, 2 (twice: the repeat is not sent) and 3 of 3, then waits for `gate` if given.
fn counting(name: &str, policy: TaskPolicy, gate: Option<watch::Receiver<bool>>) -> Arc<dyn Tool> {
    tool_fn(
        ToolDescriptor::new(name, "Counts to three.").task_policy(policy),
        move |ctx, _| {
            let gate = gate.clone();
            async move {
                ctx.progress(1.0, Some(3.0), Some("one")).await?;
                ctx.progress(2.0, Some(3.0), None).await?;
                ctx.progress(2.0, Some(3.0), None).await?;
                ctx.progress(3.0, Some(3.0), None).await?;
                if let Some(mut gate) = gate {
                    let _ = gate.wait_for(|open| *open).await;
                }
                Ok(CallToolResult::text("counted"))
            }
        },
    )
}

/// Sets its flag when dropped: held by a call that never finishes, it tells that the call's
/// future was dropped (cancelled).
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn hanging(dropped: Arc<AtomicBool>) -> Arc<dyn Tool> {
    tool_fn(
        ToolDescriptor::new("hanging", "Reports progress, then never finishes.")
            .task_policy(TaskPolicy::Never),
        move |ctx, _| {
            let dropped = dropped.clone();
            async move {
                let flag = DropFlag(dropped);
                ctx.progress(1.0, None, None).await?;
                std::future::pending::<()>().await;
                drop(flag);
                Ok(CallToolResult::text("never"))
            }
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_reaches_the_caller_on_the_response_stream() {
    let dropped = Arc::new(AtomicBool::new(false));
    let dir = tempfile::tempdir().unwrap();
    let rt = builder(&dir)
        .tool(counting("count", TaskPolicy::Never, None))
        .tool(hanging(dropped.clone()))
        .start()
        .await
        .unwrap();
    let server = serve(dir, rt).await;
    let addr = server.addr;

    // A progressToken and an Accept that lists text/event-stream: the notifications, then the
    // response, on the response's SSE stream.
    let body = with_progress_token(call(1, "count", json!({})), json!("tok-1"));
    let events = post_sse(addr, &body).await.events().await;
    assert_eq!(events.len(), 4, "{events:?}");
    let expected = [
        json!({ "progressToken": "tok-1", "progress": 1.0, "total": 3.0, "message": "one" }),
        json!({ "progressToken": "tok-1", "progress": 2.0, "total": 3.0 }),
        json!({ "progressToken": "tok-1", "progress": 3.0, "total": 3.0 }),
    ];
    for (event, params) in events.iter().zip(&expected) {
        assert_eq!(event["method"], "notifications/progress", "{event}");
        assert!(event.get("id").is_none());
        assert_eq!(&event["params"], params);
    }
    assert_eq!(events[3]["id"], 1);
    assert_eq!(events[3]["result"]["content"][0]["text"], "counted");

    // An integer token keeps its type.
    let body = with_progress_token(call(2, "count", json!({})), json!(77));
    let events = post_sse(addr, &body).await.events().await;
    assert_eq!(events[0]["params"]["progressToken"], 77);

    // Without a token, or when the client accepts JSON only: one JSON response.
    let body = call(3, "count", json!({}));
    let (status, r) = post(addr, &body).await;
    assert_eq!(
        (status, &r["result"]["content"][0]["text"]),
        (200, &json!("counted"))
    );
    let body = with_progress_token(call(4, "count", json!({})), json!("tok-4"));
    let (status, r) = post_with(
        addr,
        with(mcp_headers(&body), "Accept", "application/json"),
        &body,
    )
    .await;
    assert_eq!((status, &r["id"]), (200, &json!(4)), "{r}");

    // Errors found before the call runs keep their JSON answer and status.
    let body = with_progress_token(call(5, "nope", json!({})), json!("tok-5"));
    let (status, r) = post(addr, &body).await;
    assert_eq!((status, code(&r)), (400, -32602), "{r}");
    // An ill-typed token is invalid params.
    let body = with_progress_token(call(6, "count", json!({})), json!(1.5));
    let (status, r) = post(addr, &body).await;
    assert_eq!((status, code(&r)), (400, -32602), "{r}");

    // Closing the response stream cancels the call: the tool's future is dropped.
    let body = with_progress_token(call(7, "hanging", json!({})), json!("tok-7"));
    let mut response = post_sse(addr, &body).await;
    let first = response
        .next_timely()
        .await
        .expect("a progress notification");
    assert_eq!(first["method"], "notifications/progress");
    drop(response);
    tokio::time::timeout(WAIT, async {
        while !dropped.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the call is cancelled when its stream closes");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_is_never_sent_on_a_listen_stream_and_is_a_tasks_status_message() {
    let (open, gate) = watch::channel(false);
    let dir = tempfile::tempdir().unwrap();
    let rt = builder(&dir)
        .tool(counting(
            "count_task",
            TaskPolicy::Always,
            Some(gate.clone()),
        ))
        .tool(counting("count", TaskPolicy::Never, None))
        .start()
        .await
        .unwrap();
    let server = serve(dir, rt).await;
    let addr = server.addr;
    let tasks = json!({ "extensions": { TASKS: {} } });

    // A task of a tool that reports progress; the client asked for progress too.
    let body = with_progress_token(
        request(
            1,
            "tools/call",
            json!({ "name": "count_task", "arguments": {} }),
            tasks.clone(),
        ),
        json!("task-token"),
    );
    let (status, created) = post(addr, &body).await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let task = created["result"]["taskId"].as_str().unwrap().to_owned();

    // Listen on it.
    let listen = request(
        2,
        "subscriptions/listen",
        json!({ "notifications": { "taskIds": [task] } }),
        tasks.clone(),
    );
    let mut stream = post_sse(addr, &listen).await;
    let ack = stream.next_timely().await.unwrap();
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");

    // The task's progress becomes its statusMessage: "3/3" once it counted.
    let get = request(3, "tasks/get", json!({ "taskId": task }), tasks.clone());
    tokio::time::timeout(WAIT, async {
        loop {
            let (_, r) = post(addr, &get).await;
            if r["result"]["statusMessage"] == "3/3" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the task reports its progress as its statusMessage");

    // A synchronous call with progress meanwhile: its notifications go to its own stream.
    let body = with_progress_token(call(4, "count", json!({})), json!("sync-token"));
    let events = post_sse(addr, &body).await.events().await;
    assert_eq!(events.len(), 4);

    let _ = open.send(true);
    let mut seen = Vec::new();
    loop {
        let n = stream
            .next_timely()
            .await
            .expect("the listen stream stays open");
        assert_ne!(n["method"], "notifications/progress", "{n}");
        assert_eq!(n["method"], "notifications/tasks", "{n}");
        let done = n["params"]["status"] == "completed";
        seen.push(n);
        if done {
            break;
        }
    }
    let messages: Vec<&Value> = seen
        .iter()
        .filter_map(|n| n["params"].get("statusMessage"))
        .collect();
    assert!(messages.contains(&&json!("3/3")), "{seen:?}");
    drop(stream);
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// SEP-2243 custom headers

fn mirrored() -> Arc<dyn Tool> {
    tool_fn(
        ToolDescriptor::new("mirrored", "Arguments mirrored in headers.")
            .input_schema(json!({
                "type": "object",
                "properties": {
                    "region": { "type": "string", "x-mcp-header": "Region" },
                    "priority": { "type": "integer", "x-mcp-header": "Priority" },
                    "ratio": { "type": "number", "x-mcp-header": "Ratio" },
                    "verbose": { "type": "boolean", "x-mcp-header": "Verbose" },
                    "query": { "type": "string" }
                },
                "required": ["region"]
            }))
            .task_policy(TaskPolicy::Never),
        |_, args| async move { Ok(CallToolResult::text(format!("region={}", args["region"]))) },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_mirroring_is_checked_against_the_body() {
    let dir = tempfile::tempdir().unwrap();
    let rt = builder(&dir).tool(mirrored()).start().await.unwrap();
    let server = serve(dir, rt).await;
    let addr = server.addr;

    // The schema is listed as written, annotations included.
    let (_, list) = post(addr, &request(1, "tools/list", json!({}), json!({}))).await;
    assert_eq!(
        list["result"]["tools"][0]["inputSchema"]["properties"]["region"]["x-mcp-header"],
        "Region"
    );

    let body = |region: &str, extra: Value| {
        let mut arguments = json!({ "region": region, "query": "q" });
        for (k, v) in extra.as_object().unwrap() {
            arguments[k] = v.clone();
        }
        call(2, "mirrored", arguments)
    };
    let accepted = |status: u16, r: &Value| status == 200 && r.get("result").is_some();
    let rejected = |status: u16, r: &Value| status == 400 && code(r) == -32020;

    // What, the message, the Mcp-Param-* headers, whether it is accepted.
    type Case = (&'static str, Value, Vec<(&'static str, String)>, bool);
    let cases: Vec<Case> = vec![
        (
            "plain value",
            body("eu-west", json!({})),
            vec![("Mcp-Param-Region", "eu-west".into())],
            true,
        ),
        (
            "base64 of a non-ASCII value",
            body("héllo wörld", json!({})),
            vec![("Mcp-Param-Region", b64("héllo wörld"))],
            true,
        ),
        (
            "base64 of surrounding spaces",
            body("  padded  ", json!({})),
            vec![("Mcp-Param-Region", b64("  padded  "))],
            true,
        ),
        (
            "whitespace around the header value",
            body("eu", json!({})),
            vec![("Mcp-Param-Region", "   eu\t".into())],
            true,
        ),
        (
            "header name in another case",
            body("eu", json!({})),
            vec![("mcp-param-REGION", "eu".into())],
            true,
        ),
        (
            "numbers compare numerically, booleans as true/false",
            body(
                "eu",
                json!({ "priority": 7, "ratio": 0.5, "verbose": true }),
            ),
            vec![
                ("Mcp-Param-Region", "eu".into()),
                ("Mcp-Param-Priority", "7".into()),
                ("Mcp-Param-Ratio", "0.50".into()),
                ("Mcp-Param-Verbose", "true".into()),
            ],
            true,
        ),
        (
            "a literal that looks like base64",
            body("ZXU=", json!({})),
            vec![("Mcp-Param-Region", "ZXU=".into())],
            true,
        ),
        (
            "a different value",
            body("eu", json!({})),
            vec![("Mcp-Param-Region", "us".into())],
            false,
        ),
        (
            "a value in another case",
            body("eu", json!({})),
            vec![("Mcp-Param-Region", "EU".into())],
            false,
        ),
        (
            "the header is missing",
            body("eu", json!({})),
            vec![],
            false,
        ),
        (
            "a header without its argument",
            body("eu", json!({})),
            vec![
                ("Mcp-Param-Region", "eu".into()),
                ("Mcp-Param-Priority", "1".into()),
            ],
            false,
        ),
        (
            "a number that differs",
            body("eu", json!({ "priority": 7 })),
            vec![
                ("Mcp-Param-Region", "eu".into()),
                ("Mcp-Param-Priority", "8".into()),
            ],
            false,
        ),
        (
            "a boolean in another spelling",
            body("eu", json!({ "verbose": true })),
            vec![
                ("Mcp-Param-Region", "eu".into()),
                ("Mcp-Param-Verbose", "True".into()),
            ],
            false,
        ),
        (
            "base64 without its padding",
            body("Hello", json!({})),
            vec![("Mcp-Param-Region", "=?base64?SGVsbG8?=".into())],
            false,
        ),
        (
            "base64 with characters outside the alphabet",
            body("Hello", json!({})),
            vec![("Mcp-Param-Region", "=?base64?SGVs!!!bG8=?=".into())],
            false,
        ),
        (
            "base64 of a different value",
            body("Hello", json!({})),
            vec![("Mcp-Param-Region", b64("Hallo"))],
            false,
        ),
    ];
    for (what, message, params, ok) in cases {
        let mut headers = mcp_headers(&message);
        for (n, v) in &params {
            headers.push(((*n).to_owned(), v.clone()));
        }
        let (status, r) = post_with(addr, headers, &message).await;
        if ok {
            assert!(accepted(status, &r), "{what}: {status} {r}");
        } else {
            assert!(rejected(status, &r), "{what}: {status} {r}");
        }
    }

    // A null argument needs no header: it passes the header check and fails, as it should,
    // the schema (`verbose` is a boolean).
    let message = body("eu", json!({ "verbose": null }));
    let headers = with(mcp_headers(&message), "Mcp-Param-Region", "eu");
    let (status, r) = post_with(addr, headers, &message).await;
    assert_eq!((status, code(&r)), (400, -32602), "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("verbose"),
        "{r}"
    );

    // Mcp-Name with whitespace around it is accepted too.
    let message = body("eu", json!({}));
    let headers = with(
        with(mcp_headers(&message), "Mcp-Name", "  mirrored  "),
        "Mcp-Param-Region",
        "eu",
    );
    let (status, r) = post_with(addr, headers, &message).await;
    assert!(accepted(status, &r), "{status} {r}");
    server.stop().await;

    // Without HTTP there are no headers to compare.
    let dir = tempfile::tempdir().unwrap();
    let rt = builder(&dir).tool(mirrored()).start().await.unwrap();
    let r = rt
        .handle_json(body("eu", json!({ "priority": 1 })), &Owner::anonymous())
        .await
        .unwrap();
    assert_eq!(r["result"]["content"][0]["text"], "region=\"eu\"", "{r}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_listed_in_registration_order_with_their_schemas_as_written() {
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "$defs": { "id": { "$anchor": "idDef", "type": "string", "pattern": "^[a-z]+$" } },
        "properties": { "id": { "$ref": "#/$defs/id" }, "n": { "type": "integer" } },
        "if": { "required": ["n"] },
        "then": { "properties": { "n": { "minimum": 1 } } },
        "else": { "required": ["id"] },
        "additionalProperties": false
    });
    let dir = tempfile::tempdir().unwrap();
    let rt = builder(&dir)
        .tool(tool_fn(
            ToolDescriptor::new("zeta", "Registered first.")
                .input_schema(schema.clone())
                .task_policy(TaskPolicy::Never),
            |_, _| async { Ok(CallToolResult::text("ok")) },
        ))
        .tool(tool_fn(
            ToolDescriptor::new("alpha", "Registered second."),
            |_, _| async { Ok(CallToolResult::text("ok")) },
        ))
        .start()
        .await
        .unwrap();
    let owner = Owner::anonymous();
    let r = rt
        .handle_json(request(1, "tools/list", json!({}), json!({})), &owner)
        .await
        .unwrap();
    let tools = r["result"]["tools"].as_array().unwrap();
    assert_eq!(tools[0]["name"], "zeta");
    assert_eq!(tools[1]["name"], "alpha");
    assert_eq!(tools[0]["inputSchema"], schema);
    // The 2020-12 keywords are enforced, not only listed.
    for (args, ok) in [
        (json!({ "id": "abc" }), true),
        (json!({ "n": 2 }), true),
        (json!({ "n": 0 }), false),
        (json!({}), false),
        (json!({ "id": "ABC" }), false),
        (json!({ "id": "abc", "extra": 1 }), false),
    ] {
        let r = rt
            .handle_json(call(2, "zeta", args.clone()), &owner)
            .await
            .unwrap();
        assert_eq!(r.get("result").is_some(), ok, "{args}: {r}");
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_over_stdio_precedes_the_response_even_at_end_of_input() {
    use mcp_tasks::transport::stdio;
    let dir = tempfile::tempdir().unwrap();
    let rt = builder(&dir)
        .tool(counting("count", TaskPolicy::Never, None))
        .start()
        .await
        .unwrap();
    let (mut client_in, server_in) = tokio::io::duplex(64 * 1024);
    let (server_out, client_out) = tokio::io::duplex(64 * 1024);
    let serving = tokio::spawn(stdio::serve(
        rt.handle(),
        Owner::anonymous(),
        server_in,
        server_out,
    ));
    let body = with_progress_token(call(1, "count", json!({})), json!("stdio-token"));
    let mut line = serde_json::to_vec(&body).unwrap();
    line.push(b'\n');
    client_in.write_all(&line).await.unwrap();
    // End of input right away: the call in flight still gets its notifications and response.
    drop(client_in);
    let mut lines = BufReader::new(client_out).lines();
    let mut messages = Vec::new();
    while let Some(line) = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("output in time")
        .unwrap()
    {
        messages.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    let methods: Vec<&Value> = messages.iter().map(|m| &m["method"]).collect();
    assert_eq!(
        methods,
        [
            &json!("notifications/progress"),
            &json!("notifications/progress"),
            &json!("notifications/progress"),
            &Value::Null
        ],
        "{messages:?}"
    );
    assert_eq!(messages[0]["params"]["progressToken"], "stdio-token");
    assert_eq!(messages[3]["id"], 1);
    assert_eq!(messages[3]["result"]["content"][0]["text"], "counted");
    tokio::time::timeout(WAIT, serving)
        .await
        .expect("serving ends")
        .unwrap()
        .unwrap();
    rt.shutdown().await;
}
