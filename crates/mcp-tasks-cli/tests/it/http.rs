//! The Streamable HTTP transport over a real socket on 127.0.0.1: routing-header rules,
//! status codes, SSE framing of `subscriptions/listen`, ownership on listen, tasks outliving
//! their connection, many listeners, and a listener that never reads.
//!
//! The client is a deliberately small HTTP/1.1 client (`support/raw_http.rs`), so that the
//! tests see the exact bytes on the wire (status line, headers, chunked SSE body).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::future::BoxFuture;
use mcp_tasks::auth::{self, AuthError, Identity};
use mcp_tasks::store::{Durability, StoreOptions};
use mcp_tasks::tool::{
    CallToolResult, PrepareFuture, TaskPolicy, Tool, ToolContext, ToolDescriptor, ToolError,
    ToolFuture, tool_fn,
};
use mcp_tasks::transport::http::{self, HttpConfig};
use mcp_tasks::{Owner, Runtime};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::support;

use support::raw_http::{
    SUB_ID, Sse, is_terminal, mcp_headers, post, post_with, send, send_on, with, without,
};
use support::{VERSION, WAIT};

// ---------------------------------------------------------------------------------------------
// Messages

fn meta(tasks: bool) -> Value {
    let caps = if tasks {
        json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } })
    } else {
        json!({})
    };
    json!({
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": { "name": "http-test", "version": "1" }
    })
}

fn request(id: Value, method: &str, mut params: Value) -> Value {
    params["_meta"] = meta(true);
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

/// Opens `subscriptions/listen` for `task_ids` with request id `id`.
async fn listen_on(stream: TcpStream, id: Value, task_ids: &[&str], extra: &[(&str, &str)]) -> Sse {
    let body = request(
        id,
        "subscriptions/listen",
        json!({ "notifications": { "taskIds": task_ids } }),
    );
    let mut headers = mcp_headers(&body);
    for (n, v) in extra {
        headers.push(((*n).to_owned(), (*v).to_owned()));
    }
    let bytes = serde_json::to_vec(&body).unwrap();
    send_on(stream, "POST", "/mcp", &headers, &bytes)
        .await
        .sse()
}

async fn listen(addr: SocketAddr, id: Value, task_ids: &[&str]) -> Sse {
    listen_on(TcpStream::connect(addr).await.unwrap(), id, task_ids, &[]).await
}

/// A task object as `tasks/get` shows it, without `_meta` and `resultType`.
fn task_object(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("_meta");
        o.remove("resultType");
    }
    v
}

// ---------------------------------------------------------------------------------------------
// Server

struct Server {
    addr: SocketAddr,
    rt: Option<Runtime>,
    stop: Option<oneshot::Sender<()>>,
    serving: JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

async fn runtime(dir: &tempfile::TempDir, tools: Vec<Arc<dyn Tool>>) -> Runtime {
    Runtime::builder(dir.path().join("tasks.redb"))
        .tools(tools)
        .store_options(StoreOptions {
            durability: Durability::None,
            ..StoreOptions::default()
        })
        .start()
        .await
        .unwrap()
}

fn spawn_serve(
    listener: TcpListener,
    router: axum::Router,
) -> (oneshot::Sender<()>, JoinHandle<std::io::Result<()>>) {
    let (tx, rx) = oneshot::channel::<()>();
    let serving = tokio::spawn(http::serve(listener, router, async {
        let _ = rx.await;
    }));
    (tx, serving)
}

async fn start_on(listener: TcpListener, tools: Vec<Arc<dyn Tool>>, config: HttpConfig) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&dir, tools).await;
    let addr = listener.local_addr().unwrap();
    let (stop, serving) = spawn_serve(listener, http::router(rt.handle(), config));
    Server {
        addr,
        rt: Some(rt),
        stop: Some(stop),
        serving,
        _dir: dir,
    }
}

async fn start(tools: Vec<Arc<dyn Tool>>, config: HttpConfig) -> Server {
    start_on(
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
        tools,
        config,
    )
    .await
}

impl Server {
    fn rt(&self) -> &Runtime {
        self.rt.as_ref().unwrap()
    }

    /// Graceful stop: listen streams end, the transport drains, the runtime shuts down.
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

/// Serves a second router on the same runtime (as a host app embedding it twice would).
async fn also_serve(server: &Server, config: HttpConfig) -> (SocketAddr, oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, _serving) = spawn_serve(listener, http::router(server.rt().handle(), config));
    (addr, stop)
}

// ---------------------------------------------------------------------------------------------
// Tools

fn echo() -> Arc<dyn Tool> {
    tool_fn(
        ToolDescriptor::new("echo", "echoes its arguments").task_policy(TaskPolicy::Never),
        |_ctx, args| async move { Ok(CallToolResult::text(Value::Object(args).to_string())) },
    )
}

/// A task tool that waits until `gate` reaches 1, sets a status, waits for 2, then completes.
fn staged(name: &str, gate: watch::Receiver<u32>) -> Arc<dyn Tool> {
    tool_fn(
        ToolDescriptor::new(name, "waits for the test, twice")
            .task_policy(TaskPolicy::Always)
            .initial_status_message("waiting"),
        move |ctx: ToolContext, _| {
            let mut gate = gate.clone();
            async move {
                let _ = gate.wait_for(|g| *g >= 1).await;
                ctx.set_status("phase 1").await?;
                let _ = gate.wait_for(|g| *g >= 2).await;
                Ok(CallToolResult::text("released").with_structured(json!({ "ok": true })))
            }
        },
    )
}

/// A task tool that sleeps `ms` and completes.
fn quick() -> Arc<dyn Tool> {
    tool_fn(
        ToolDescriptor::new("quick", "finishes after a short while")
            .task_policy(TaskPolicy::Always),
        |_ctx, _| async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(CallToolResult::text("done"))
        },
    )
}

/// A task tool that waits for its gate, then sets `count` different status messages of
/// `size` bytes and completes.
fn chatty(gate: watch::Receiver<u32>) -> Arc<dyn Tool> {
    tool_fn(
        ToolDescriptor::new("chatty", "many status transitions").task_policy(TaskPolicy::Always),
        move |ctx: ToolContext, args: Map<String, Value>| {
            let mut gate = gate.clone();
            async move {
                let count = args.get("count").and_then(Value::as_u64).unwrap_or(10);
                let size = args.get("size").and_then(Value::as_u64).unwrap_or(10) as usize;
                let _ = gate.wait_for(|g| *g >= 1).await;
                let pad = "x".repeat(size);
                for i in 0..count {
                    ctx.set_status(format!("{i:06} {pad}")).await?;
                }
                Ok(CallToolResult::text(format!("{count} statuses")))
            }
        },
    )
}

async fn create(addr: SocketAddr, tool: &str) -> String {
    create_as(addr, tool, json!({}), None).await
}

async fn create_as(
    addr: SocketAddr,
    tool: &str,
    arguments: Value,
    principal: Option<&str>,
) -> String {
    let body = request(
        json!(1),
        "tools/call",
        json!({ "name": tool, "arguments": arguments }),
    );
    let mut headers = mcp_headers(&body);
    if let Some(p) = principal {
        headers.push(("X-Test-Principal".into(), p.into()));
    }
    let (status, r) = post_with(addr, headers, &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["resultType"], "task", "{r}");
    r["result"]["taskId"].as_str().unwrap().to_owned()
}

async fn get_as(addr: SocketAddr, task: &str, principal: Option<&str>) -> (u16, Value) {
    let body = request(json!("g"), "tasks/get", json!({ "taskId": task }));
    let mut headers = mcp_headers(&body);
    if let Some(p) = principal {
        headers.push(("X-Test-Principal".into(), p.into()));
    }
    post_with(addr, headers, &body).await
}

async fn get(addr: SocketAddr, task: &str) -> Value {
    let (status, r) = get_as(addr, task, None).await;
    assert_eq!(status, 200, "{r}");
    r["result"].clone()
}

/// Polls `tasks/get` until the task is terminal (bounded, real time).
async fn wait_terminal(addr: SocketAddr, task: &str, principal: Option<&str>) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, r) = get_as(addr, task, principal).await;
        assert_eq!(status, 200, "{r}");
        if is_terminal(&r["result"]["status"]) {
            return r["result"].clone();
        }
        assert!(Instant::now() < deadline, "task {task} never finished: {r}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn principal_auth() -> Arc<dyn auth::Authenticator> {
    auth::from_fn(|parts| {
        let owner = match parts
            .headers
            .get("x-test-principal")
            .and_then(|v| v.to_str().ok())
        {
            Some(p) => Owner::new("test", p),
            None => Owner::anonymous(),
        };
        async move { Ok(Identity::new(owner)) }
    })
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
// Tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_headers_are_checked_against_the_body() {
    let (_gate_tx, gate) = watch::channel(0);
    let server = start(vec![echo(), staged("staged", gate)], HttpConfig::default()).await;
    let addr = server.addr;
    let call = request(
        json!(1),
        "tools/call",
        json!({ "name": "echo", "arguments": { "a": 1 } }),
    );
    let task = create(addr, "staged").await;
    let get_body = request(json!("x"), "tasks/get", json!({ "taskId": task }));

    let mismatch = |what: &'static str, (status, r): (u16, Value), id: Value| {
        assert_eq!((status, code(&r)), (400, -32020), "{what}: {r}");
        assert_eq!(r["id"], id, "{what}: the error echoes the id");
    };
    // MCP-Protocol-Version differs, or is missing.
    let h = with(mcp_headers(&call), "MCP-Protocol-Version", "2025-06-18");
    mismatch(
        "version mismatch",
        post_with(addr, h, &call).await,
        json!(1),
    );
    let h = without(mcp_headers(&call), "MCP-Protocol-Version");
    mismatch("version missing", post_with(addr, h, &call).await, json!(1));
    // Mcp-Method differs, or is missing.
    let h = with(mcp_headers(&call), "Mcp-Method", "tools/list");
    mismatch("method mismatch", post_with(addr, h, &call).await, json!(1));
    let h = without(mcp_headers(&call), "Mcp-Method");
    mismatch("method missing", post_with(addr, h, &call).await, json!(1));
    // Mcp-Name differs on tools/call and tasks/get.
    let h = with(mcp_headers(&call), "Mcp-Name", "other");
    mismatch("tools/call name", post_with(addr, h, &call).await, json!(1));
    let h = with(
        mcp_headers(&get_body),
        "Mcp-Name",
        "00000000-0000-0000-0000-000000000000",
    );
    mismatch(
        "tasks/get name",
        post_with(addr, h, &get_body).await,
        json!("x"),
    );
    // Mcp-Name is required on tools/call.
    let h = without(mcp_headers(&call), "Mcp-Name");
    mismatch(
        "tools/call name missing",
        post_with(addr, h, &call).await,
        json!(1),
    );
    // Invalid base64 in a sentinel.
    let h = with(mcp_headers(&call), "Mcp-Name", "=?base64?***?=");
    mismatch("bad base64", post_with(addr, h, &call).await, json!(1));
    // Several values of one routing header.
    let mut h = mcp_headers(&call);
    h.push(("mcp-name".into(), "echo".into()));
    mismatch(
        "duplicate header",
        post_with(addr, h, &call).await,
        json!(1),
    );

    // Sentinel values that decode to the body's value are fine, names are case-insensitive,
    // and values are trimmed.
    let ok = |what: &'static str, (status, r): (u16, Value)| {
        assert_eq!(status, 200, "{what}: {r}");
        assert_eq!(r["result"]["resultType"], "complete", "{what}: {r}");
    };
    let h = with(mcp_headers(&call), "Mcp-Name", &b64("echo"));
    ok("base64 tool name", post_with(addr, h, &call).await);
    let h = with(mcp_headers(&get_body), "Mcp-Name", &b64(&task));
    ok("base64 task id", post_with(addr, h, &get_body).await);
    let h = vec![
        ("mcp-protocol-version".into(), format!("  {VERSION} ")),
        ("MCP-METHOD".into(), "\ttools/call ".into()),
        ("mcp-NAME".into(), " echo\t".into()),
    ];
    ok("padded values", post_with(addr, h, &call).await);
    let h = with(
        mcp_headers(&call),
        "Mcp-Name",
        &format!(" {} ", b64("echo")),
    );
    ok("padded sentinel", post_with(addr, h, &call).await);
    // A non-ASCII name travels as a sentinel.
    let uni = request(
        json!(2),
        "tools/call",
        json!({ "name": "échø", "arguments": {} }),
    );
    let h = with(mcp_headers(&uni), "Mcp-Name", &b64("échø"));
    let (status, r) = post_with(addr, h, &uni).await;
    assert_eq!(
        (status, code(&r)),
        (400, -32602),
        "unknown tool, past the headers: {r}"
    );

    // A missing Mcp-Name on tasks/get is accepted by default (the body is authoritative) …
    let h = without(mcp_headers(&get_body), "Mcp-Name");
    ok(
        "tasks/get without Mcp-Name",
        post_with(addr, h.clone(), &get_body).await,
    );
    // … and rejected by a strict endpoint on the same runtime.
    let (strict, stop) = also_serve(&server, HttpConfig::default().strict_headers(true)).await;
    mismatch("strict", post_with(strict, h, &get_body).await, json!("x"));
    ok("strict with Mcp-Name", post(strict, &get_body).await);
    let _ = stop.send(());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_codes() {
    let server = start(
        vec![echo()],
        HttpConfig::default()
            .max_body_bytes(2048)
            .allow_origin("https://app.example"),
    )
    .await;
    let addr = server.addr;

    // 200 with one compact JSON response; no session id, even when the client sends one.
    let list = request(json!(1), "tools/list", json!({}));
    let mut h = mcp_headers(&list);
    h.push(("Mcp-Session-Id".into(), "abc".into()));
    h.push(("Last-Event-ID".into(), "5".into()));
    let bytes = serde_json::to_vec(&list).unwrap();
    let resp = send(addr, "POST", &h, &bytes).await;
    assert!(resp.header("mcp-session-id").is_none());
    let (status, r) = resp.json().await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["tools"][0]["name"], "echo");

    // 400: missing _meta (-32602), missing capability (-32021), unsupported version (-32022).
    let no_meta = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {} });
    let (status, r) = post(addr, &no_meta).await;
    assert_eq!((status, code(&r)), (400, -32602), "{r}");
    let mut gated = request(json!(3), "tasks/get", json!({ "taskId": "gate-test" }));
    gated["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({});
    let (status, r) = post(addr, &gated).await;
    assert_eq!((status, code(&r)), (400, -32021), "{r}");
    let mut v999 = request(json!(4), "server/discover", json!({}));
    v999["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("v999.0.0");
    let h = with(mcp_headers(&v999), "MCP-Protocol-Version", "v999.0.0");
    let (status, r) = post_with(addr, h, &v999).await;
    assert_eq!((status, code(&r)), (400, -32022), "{r}");
    assert_eq!(r["error"]["data"]["requested"], "v999.0.0");
    // 400 for a parse error, without an id.
    let resp = send(addr, "POST", &[], b"{not json").await;
    let (status, r) = resp.json().await;
    assert_eq!((status, code(&r)), (400, -32700), "{r}");
    assert!(r.get("id").is_none());

    // 404 for an unknown method.
    let (status, r) = post(addr, &request(json!(5), "nope/nothing", json!({}))).await;
    assert_eq!((status, code(&r)), (404, -32601), "{r}");
    assert_eq!(r["id"], 5);

    // 202 and no body for a notification.
    let note = json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": 1 } });
    let bytes = serde_json::to_vec(&note).unwrap();
    let resp = send(addr, "POST", &mcp_headers(&note), &bytes).await;
    assert_eq!(resp.status, 202);
    assert!(resp.body().await.is_empty());

    // 405 with `Allow: POST` for GET and DELETE.
    for method in ["GET", "DELETE"] {
        let resp = send(addr, method, &[], b"").await;
        assert_eq!(resp.status, 405, "{method}");
        assert_eq!(resp.header("allow"), Some("POST"), "{method}");
    }

    // 413 over the body limit (declared length, and a chunked body without one).
    let big = request(
        json!(6),
        "tools/call",
        json!({ "name": "echo", "arguments": { "pad": "y".repeat(4096) } }),
    );
    let (status, r) = post(addr, &big).await;
    assert_eq!(status, 413, "{r}");
    assert_eq!(code(&r), -32600);
    assert!(r.get("id").is_none());
    {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let payload = serde_json::to_vec(&big).unwrap();
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
            payload.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(&payload).await.unwrap();
        stream.write_all(b"\r\n0\r\n\r\n").await.unwrap();
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        assert!(line.starts_with("HTTP/1.1 413"), "{line}");
    }

    // 403 for a foreign Origin and a foreign Host; local and listed ones pass.
    let discover = request(json!(7), "server/discover", json!({}));
    for (name, value, expected) in [
        ("Origin", "https://evil.example", 403),
        ("Origin", "null", 403),
        ("Host", "evil.example.com", 403),
        ("Host", "evil.example.com:80", 403),
        ("Origin", "http://localhost:6274", 200),
        ("Origin", "https://app.example", 200),
        ("Host", "localhost", 200),
        ("Host", "[::1]:9", 200),
    ] {
        let h = with(mcp_headers(&discover), name, value);
        let (status, r) = post_with(addr, h, &discover).await;
        assert_eq!(status, expected, "{name}: {value}: {r}");
        if expected == 403 {
            assert!(
                r["error"]["message"].as_str().unwrap().contains(value),
                "{r}"
            );
        }
    }
    // 403 for a Host or an Origin sent twice (even with equal, allowed values) and for a Host
    // whose port is not a port number.
    for (name, first, second) in [
        ("Host", "localhost", "localhost"),
        ("Host", "localhost", "evil.example.com"),
        ("Origin", "http://localhost", "http://localhost"),
        ("Origin", "https://app.example", "https://evil.example"),
    ] {
        let mut h = with(mcp_headers(&discover), name, first);
        h.push((name.to_owned(), second.to_owned()));
        let (status, r) = post_with(addr, h, &discover).await;
        assert_eq!(status, 403, "{name} twice: {r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("appears more than once"),
            "{r}"
        );
    }
    for host in ["localhost:http", "localhost:65536", "127.0.0.1:1:2"] {
        let h = with(mcp_headers(&discover), "Host", host);
        assert_eq!(post_with(addr, h, &discover).await.0, 403, "Host {host}");
    }
    // The conformance DNS-rebinding probe: foreign Host with a matching Origin.
    let h = with(
        with(mcp_headers(&discover), "Host", "evil.example.com"),
        "Origin",
        "http://evil.example.com",
    );
    assert_eq!(post_with(addr, h, &discover).await.0, 403);

    // 401 when the authenticator refuses.
    let (guarded, stop) = also_serve(
        &server,
        HttpConfig::default().authenticator(auth::from_fn(|parts| {
            let good = parts
                .headers
                .get("authorization")
                .is_some_and(|v| v.as_bytes() == b"Bearer good");
            async move {
                if good {
                    Ok(Identity::new(Owner::new("t", "alice")))
                } else {
                    Err(AuthError::InvalidToken("not good".into()))
                }
            }
        })),
    )
    .await;
    let (status, r) = post(guarded, &discover).await;
    assert_eq!(status, 401, "{r}");
    assert!(r["error"].is_object(), "{r}");
    let h = with(mcp_headers(&discover), "Authorization", "Bearer bad");
    assert_eq!(post_with(guarded, h, &discover).await.0, 401);
    let h = with(mcp_headers(&discover), "Authorization", "Bearer good");
    assert_eq!(post_with(guarded, h, &discover).await.0, 200);
    let _ = stop.send(());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_streams_acknowledgement_then_task_snapshots() {
    let (gate_tx, gate) = watch::channel(0);
    let server = start(
        vec![staged("staged", gate)],
        HttpConfig::default().keep_alive(Duration::from_millis(100)),
    )
    .await;
    let addr = server.addr;
    let task = create(addr, "staged").await;

    // A numeric id stays a number.
    let id = json!(7);
    let mut sse = listen(addr, id.clone(), &[&task, "not-a-task"]).await;
    let ack = sse.ack(&id).await;
    assert_eq!(ack["params"]["notifications"]["taskIds"], json!([task]));
    // A string id stays a string, on a concurrent listen.
    let sid = json!("7");
    let mut other = listen(addr, sid.clone(), &[&task]).await;
    other.ack(&sid).await;

    // The current snapshot first; each one equals what tasks/get shows at that point.
    let first = sse.next_timely().await.unwrap();
    assert_eq!(first["method"], "notifications/tasks", "{first}");
    assert_eq!(first["params"]["_meta"][SUB_ID], id);
    assert_eq!(first["params"]["status"], "working");
    assert_eq!(first["params"]["statusMessage"], "waiting");
    assert_eq!(
        task_object(&first["params"]),
        task_object(&get(addr, &task).await)
    );

    gate_tx.send(1).unwrap();
    let second = sse.next_timely().await.unwrap();
    assert_eq!(second["params"]["statusMessage"], "phase 1", "{second}");
    assert_eq!(
        task_object(&second["params"]),
        task_object(&get(addr, &task).await)
    );

    // Keep-alive comments flow while nothing happens (`next` skips them; the raw lines
    // show them).
    tokio::time::sleep(Duration::from_millis(250)).await;
    let line = tokio::time::timeout(WAIT, sse.line())
        .await
        .unwrap()
        .unwrap();
    assert!(line.starts_with(':'), "a keep-alive comment, got {line:?}");

    gate_tx.send(2).unwrap();
    let rest = sse.until_terminal(&id, &task).await;
    let terminal = rest.last().unwrap();
    assert_eq!(terminal["params"]["status"], "completed");
    let got = wait_terminal(addr, &task, None).await;
    assert_eq!(got["result"]["structuredContent"], json!({ "ok": true }));
    assert_eq!(task_object(&terminal["params"]), task_object(&got));
    let seen = other.until_terminal(&sid, &task).await;
    assert_eq!(
        task_object(&seen.last().unwrap()["params"]),
        task_object(&got)
    );

    // A listen still open at shutdown gets its result and ends, and the server drains.
    let lid = json!(99);
    let mut idle = listen(addr, lid.clone(), &[]).await;
    idle.ack(&lid).await;
    let stopping = tokio::spawn(server.stop());
    let last = idle.next_timely().await.expect("the listen result");
    assert_eq!(last["id"], lid);
    assert_eq!(last["result"]["resultType"], "complete");
    assert_eq!(last["result"]["_meta"][SUB_ID], lid);
    assert!(idle.next_timely().await.is_none(), "the stream ends");
    tokio::time::timeout(WAIT, stopping).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_ignores_another_principals_task() {
    let (alice_tx, alice_gate) = watch::channel(0);
    let (bob_tx, bob_gate) = watch::channel(0);
    let server = start(
        vec![
            staged("alice_tool", alice_gate),
            staged("bob_tool", bob_gate),
        ],
        HttpConfig::default().authenticator(principal_auth()),
    )
    .await;
    let addr = server.addr;
    let alices = create_as(addr, "alice_tool", json!({}), Some("alice")).await;
    let bobs = create_as(addr, "bob_tool", json!({}), Some("bob")).await;
    // Bob cannot read Alice's task …
    let (status, r) = get_as(addr, &alices, Some("bob")).await;
    assert_eq!((status, code(&r)), (400, -32602), "{r}");

    // … nor listen to it: it is left out of the acknowledgement like an unknown id.
    let id = json!(1);
    let stream = TcpStream::connect(addr).await.unwrap();
    let mut sse = listen_on(
        stream,
        id.clone(),
        &[&alices, &bobs],
        &[("X-Test-Principal", "bob")],
    )
    .await;
    let ack = sse.ack(&id).await;
    assert_eq!(ack["params"]["notifications"]["taskIds"], json!([bobs]));

    // Alice's task runs to its end first, then Bob's.
    alice_tx.send(2).unwrap();
    wait_terminal(addr, &alices, Some("alice")).await;
    bob_tx.send(2).unwrap();
    let seen = sse.until_terminal(&id, &bobs).await;
    assert!(
        seen.iter().all(|n| n["params"]["taskId"] == bobs),
        "only Bob's task: {seen:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_outlives_a_dropped_connection() {
    let server = start(vec![quick()], HttpConfig::default()).await;
    let addr = server.addr;
    // Read the response head only, then drop the connection (as the conformance client
    // aborts every connection right after reading).
    let body = request(
        json!(1),
        "tools/call",
        json!({ "name": "quick", "arguments": {} }),
    );
    let bytes = serde_json::to_vec(&body).unwrap();
    let resp = send(addr, "POST", &mcp_headers(&body), &bytes).await;
    assert_eq!(resp.status, 200);
    let (_, r) = resp.json().await; // the connection is dropped with the response
    let task = r["result"]["taskId"].as_str().unwrap().to_owned();
    let done = wait_terminal(addr, &task, None).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "done");
    server.stop().await;
}

/// A task tool whose `prepare` (run inside the `tools/call` request, before the task is
/// created) waits for the test.
struct SlowPrepare {
    descriptor: ToolDescriptor,
    entered: Arc<tokio::sync::Notify>,
    gate: watch::Receiver<u32>,
    ran: Arc<AtomicUsize>,
}

impl Tool for SlowPrepare {
    fn descriptor(&self) -> &ToolDescriptor {
        &self.descriptor
    }

    fn call(&self, _ctx: ToolContext, _args: Map<String, Value>) -> ToolFuture {
        let ran = self.ran.clone();
        Box::pin(async move {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok(CallToolResult::text("ran"))
        })
    }

    fn prepare(&self, _ctx: ToolContext, args: Map<String, Value>) -> PrepareFuture {
        let entered = self.entered.clone();
        let mut gate = self.gate.clone();
        let f: BoxFuture<'static, Result<Map<String, Value>, ToolError>> = Box::pin(async move {
            entered.notify_one();
            let _ = gate.wait_for(|g| *g >= 1).await;
            Ok(args)
        });
        f
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_completes_when_its_client_disconnects() {
    let entered = Arc::new(tokio::sync::Notify::new());
    let ran = Arc::new(AtomicUsize::new(0));
    let (gate_tx, gate) = watch::channel(0);
    let tool = Arc::new(SlowPrepare {
        descriptor: ToolDescriptor::new("slow", "slow to start").task_policy(TaskPolicy::Always),
        entered: entered.clone(),
        gate,
        ran: ran.clone(),
    });
    let server = start(vec![tool], HttpConfig::default()).await;
    let body = request(
        json!(1),
        "tools/call",
        json!({ "name": "slow", "arguments": {} }),
    );
    let bytes = serde_json::to_vec(&body).unwrap();
    let mut head = format!(
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n",
        bytes.len()
    );
    for (n, v) in mcp_headers(&body) {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&bytes).await.unwrap();
    tokio::time::timeout(WAIT, entered.notified())
        .await
        .unwrap();
    drop(stream); // the client goes away while the request is being handled
    tokio::time::sleep(Duration::from_millis(200)).await;
    gate_tx.send(1).unwrap();
    // The request still ran to its end: the task was created and its tool ran.
    let deadline = Instant::now() + WAIT;
    while ran.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the task never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_listeners_receive_the_terminal_snapshot() {
    const LISTENERS: usize = 1000;
    let (gate_tx, gate) = watch::channel(0);
    let server = start(vec![staged("staged", gate)], HttpConfig::default()).await;
    let addr = server.addr;
    let task = create(addr, "staged").await;
    let started = Instant::now();

    // Open the listens 50 at a time (one HTTP/1 connection each), each up to its ack.
    let mut open = Vec::with_capacity(LISTENERS);
    for batch in 0..LISTENERS / 50 {
        let mut joins = Vec::new();
        for i in 0..50 {
            let task = task.clone();
            let id = json!(batch * 50 + i);
            joins.push(tokio::spawn(async move {
                let mut sse = listen(addr, id.clone(), &[&task]).await;
                sse.ack(&id).await;
                (id, sse)
            }));
        }
        for j in joins {
            open.push(j.await.unwrap());
        }
    }
    gate_tx.send(2).unwrap();
    let mut readers = Vec::with_capacity(LISTENERS);
    for (id, mut sse) in open {
        let task = task.clone();
        readers.push(tokio::spawn(async move {
            let seen = sse.until_terminal(&id, &task).await;
            seen.last().unwrap()["params"].clone()
        }));
    }
    let expected = task_object(&wait_terminal(addr, &task, None).await);
    for r in readers {
        let terminal = tokio::time::timeout(WAIT, r).await.unwrap().unwrap();
        assert_eq!(task_object(&terminal), expected);
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_never_reads_stays_bounded() {
    const STATUSES: u64 = 5000;
    // Small socket buffers on both ends, so that the kernel holds only a few messages and
    // what the reader finally gets shows the server's own buffering.
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_send_buffer_size(8 * 1024).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1024).unwrap();
    let (gate_tx, gate) = watch::channel(0);
    let server = start_on(listener, vec![chatty(gate)], HttpConfig::default()).await;
    let addr = server.addr;
    let task = create_as(
        addr,
        "chatty",
        json!({ "count": STATUSES, "size": 1024 }),
        None,
    )
    .await;

    let client = TcpSocket::new_v4().unwrap();
    client.set_recv_buffer_size(8 * 1024).unwrap();
    let stream = client.connect(addr).await.unwrap();
    let id = json!("slow-reader");
    let mut sse = listen_on(stream, id.clone(), &[&task], &[]).await; // headers only

    gate_tx.send(1).unwrap();
    // The task goes through every transition and the server keeps answering promptly.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut slowest = Duration::ZERO;
    let done = loop {
        let t = Instant::now();
        let r = get(addr, &task).await;
        slowest = slowest.max(t.elapsed());
        if is_terminal(&r["status"]) {
            break r;
        }
        assert!(Instant::now() < deadline, "the task never finished: {r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(done["status"], "completed");
    assert!(
        slowest < Duration::from_secs(2),
        "a tasks/get took {slowest:?}"
    );
    let t = Instant::now();
    let (status, _) = post(addr, &request(json!(2), "tools/list", json!({}))).await;
    assert_eq!(status, 200);
    assert!(t.elapsed() < Duration::from_secs(2));

    // Now read: the acknowledgement, a bounded number of snapshots (latest wins), the end.
    sse.ack(&id).await;
    let seen = sse.until_terminal(&id, &task).await;
    let terminal = seen.last().unwrap();
    assert_eq!(task_object(&terminal["params"]), task_object(&done));
    assert!(
        seen.len() < 200,
        "a slow reader gets a bounded number of snapshots, got {}",
        seen.len()
    );
    // Snapshots never go backwards.
    let messages: Vec<&str> = seen
        .iter()
        .filter_map(|n| n["params"]["statusMessage"].as_str())
        .collect();
    assert!(messages.windows(2).all(|w| w[0] <= w[1]), "in order");
    eprintln!(
        "slow reader: {} of {STATUSES} transitions delivered",
        seen.len()
    );
    server.stop().await;
}
