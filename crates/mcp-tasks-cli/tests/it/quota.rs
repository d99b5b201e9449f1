//! Per-principal quotas and connection limits over real HTTP on 127.0.0.1: each limit
//! answers `429` with `Retry-After` and JSON-RPC `-32010` (or its own HTTP status for body
//! size and time), stores nothing for the refused request, and leaves other principals alone;
//! half-open connections time out and a legitimate request still gets through.

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_tasks::auth::{self, Identity};
use mcp_tasks::quota::Quotas;
use mcp_tasks::store::{Durability, StoreOptions};
use mcp_tasks::tool::{CallToolResult, InputRequest, TaskPolicy, Tool, ToolDescriptor, tool_fn};
use mcp_tasks::transport::http::{self, HttpConfig, ServeOptions};
use mcp_tasks::{Owner, Runtime};
use serde_json::{Value, json};
use support::{Response, first_event, post, request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

const QUOTA_EXCEEDED: i64 = -32010;

struct Server {
    addr: SocketAddr,
    rt: Option<Runtime>,
    stop: Option<oneshot::Sender<()>>,
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Server {
    fn rt(&self) -> &Runtime {
        self.rt.as_ref().unwrap()
    }

    async fn stored(&self) -> usize {
        mcp_tasks::internals::runtime_store(self.rt())
            .tasks()
            .await
            .unwrap()
            .len()
    }

    async fn stop(mut self) {
        let rt = self.rt.take().unwrap();
        rt.begin_shutdown();
        let _ = self.stop.take().unwrap().send(());
        let _ = tokio::time::timeout(support::WAIT, &mut self.serving).await;
        rt.shutdown().await;
    }
}

/// A task tool that waits for an answer (so its task stays live).
fn waiting() -> Arc<dyn Tool> {
    tool_fn(
        ToolDescriptor::new("wait", "waits for an answer").task_policy(TaskPolicy::Always),
        |ctx, _| async move {
            let answer = ctx
                .input(
                    "go",
                    InputRequest::elicit_form("Go?", json!({ "type": "object" })),
                )
                .await?;
            Ok(CallToolResult::text(format!("{answer}")))
        },
    )
}

/// The bearer token is the principal's name (tenant `t`).
fn by_token() -> Arc<dyn auth::Authenticator> {
    auth::from_fn(|parts| {
        let token = auth::bearer_token(&parts.headers)
            .ok()
            .flatten()
            .map(str::to_owned);
        async move {
            match token {
                Some(name) => Ok(Identity::new(Owner::new("t", name))),
                None => Err(auth::AuthError::Missing),
            }
        }
    })
}

async fn start(quotas: Quotas, config: HttpConfig, options: ServeOptions) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::builder(dir.path().join("tasks.redb"))
        .tool(waiting())
        .quotas(quotas)
        .store_options(StoreOptions {
            durability: Durability::None,
            ..StoreOptions::default()
        })
        .start()
        .await
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, rx) = oneshot::channel::<()>();
    let router = http::router(rt.handle(), config.authenticator(by_token()));
    let serving = tokio::spawn(http::serve_with(listener, router, options, async {
        let _ = rx.await;
    }));
    Server {
        addr,
        rt: Some(rt),
        stop: Some(stop),
        serving,
        _dir: dir,
    }
}

fn create_body() -> Value {
    request(
        json!(1),
        "tools/call",
        json!({ "name": "wait", "arguments": {} }),
    )
}

fn listen_body(tasks: &[&str]) -> Value {
    request(
        json!(5),
        "subscriptions/listen",
        json!({ "notifications": { "taskIds": tasks } }),
    )
}

async fn create(addr: SocketAddr, who: &str) -> Response {
    post(addr, Some(who), &create_body()).await
}

fn task_id(r: &Response) -> String {
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["result"]["taskId"].as_str().unwrap().to_owned()
}

/// A 429 with `Retry-After` and a `-32010` error naming `quota`.
fn assert_refused(r: &Response, quota: &str) -> u64 {
    assert_eq!(r.status, 429, "{}", String::from_utf8_lossy(&r.body));
    let retry: u64 = r
        .header("retry-after")
        .expect("a Retry-After header")
        .parse()
        .expect("Retry-After in seconds");
    assert!(retry >= 1);
    let body = r.json();
    assert_eq!(body["error"]["code"], QUOTA_EXCEEDED, "{body}");
    assert_eq!(body["error"]["data"]["quota"], quota, "{body}");
    assert_eq!(body["error"]["data"]["retryAfterSeconds"], retry, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Quota exceeded: "),
        "{body}"
    );
    retry
}

fn quotas() -> Quotas {
    Quotas::unlimited()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_tasks_per_principal() {
    let mut q = quotas();
    q.max_live_tasks = 3;
    let server = start(q, HttpConfig::default(), ServeOptions::default()).await;
    let addr = server.addr;
    let mut tasks = Vec::new();
    for _ in 0..3 {
        tasks.push(task_id(&create(addr, "alice").await));
    }
    let r = create(addr, "alice").await;
    assert_refused(&r, "liveTasks");
    assert_eq!(r.json()["error"]["data"]["limit"], 3);
    assert_eq!(
        server.stored().await,
        3,
        "nothing stored for the refused call"
    );

    // Another principal has its own allowance.
    task_id(&create(addr, "bob").await);

    // A finished task frees its place.
    let cancel = request(json!(2), "tasks/cancel", json!({ "taskId": tasks[0] }));
    assert_eq!(post(addr, Some("alice"), &cancel).await.status, 200);
    let deadline = Instant::now() + support::WAIT;
    loop {
        let r = create(addr, "alice").await;
        if r.status == 200 {
            break;
        }
        assert_refused(&r, "liveTasks");
        assert!(Instant::now() < deadline, "the place is never freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argument_bytes_of_live_tasks_per_principal() {
    let mut q = quotas();
    q.max_live_argument_bytes = 10_000;
    let server = start(q, HttpConfig::default(), ServeOptions::default()).await;
    let addr = server.addr;
    let big = |n: usize| {
        request(
            json!(1),
            "tools/call",
            json!({ "name": "wait", "arguments": { "pad": "x".repeat(n) } }),
        )
    };
    task_id(&post(addr, Some("alice"), &big(6_000)).await);
    let r = post(addr, Some("alice"), &big(6_000)).await;
    assert_refused(&r, "liveArgumentBytes");
    assert_eq!(
        server.stored().await,
        1,
        "nothing stored for the refused call"
    );
    task_id(&post(addr, Some("alice"), &big(1_000)).await);
    task_id(&post(addr, Some("bob"), &big(6_000)).await);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_create_rate_per_principal() {
    let mut q = quotas();
    q.create_rate = 0.5;
    q.create_burst = 2;
    let server = start(q, HttpConfig::default(), ServeOptions::default()).await;
    let addr = server.addr;
    task_id(&create(addr, "alice").await);
    task_id(&create(addr, "alice").await);
    let r = create(addr, "alice").await;
    let retry = assert_refused(&r, "createRate");
    assert!(
        retry <= 2,
        "one token comes back within 2 s at 0.5/s: {retry}"
    );
    assert_eq!(
        server.stored().await,
        2,
        "nothing stored for the refused call"
    );
    task_id(&create(addr, "bob").await);
    // Reads are not creations.
    let discover = request(json!(3), "server/discover", json!({}));
    assert_eq!(post(addr, Some("alice"), &discover).await.status, 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_listens_and_their_task_ids_per_principal() {
    let mut q = quotas();
    q.max_listens = 2;
    q.max_listen_task_ids = 3;
    let server = start(q, HttpConfig::default(), ServeOptions::default()).await;
    let addr = server.addr;
    let a = task_id(&create(addr, "alice").await);
    let b = task_id(&create(addr, "alice").await);

    let first = post(addr, Some("alice"), &listen_body(&[&a, &b])).await;
    assert_eq!(
        first_event(&first)["params"]["notifications"]["taskIds"],
        json!([a, b])
    );
    // Two more ids would follow 4 > 3 tasks.
    let r = post(addr, Some("alice"), &listen_body(&[&a, &b])).await;
    assert_refused(&r, "listenTaskIds");
    assert_eq!(r.json()["id"], 5, "the refusal answers the listen request");
    let second = post(addr, Some("alice"), &listen_body(&[&a])).await;
    assert_eq!(second.status, 200);
    // A third listen, even for nothing.
    let r = post(addr, Some("alice"), &listen_body(&[])).await;
    assert_refused(&r, "listens");
    // bob is not affected.
    let bobs = post(addr, Some("bob"), &listen_body(&[])).await;
    assert_eq!(bobs.status, 200);

    // Closing a listen gives its place back.
    drop(first);
    let deadline = Instant::now() + support::WAIT;
    loop {
        let r = post(addr, Some("alice"), &listen_body(&[&b])).await;
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 429);
        assert!(
            Instant::now() < deadline,
            "a closed listen never frees its place"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop((second, bobs));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_progress_per_principal() {
    let config = HttpConfig::default().max_requests_per_principal(2);
    let server = start(quotas(), config, ServeOptions::default()).await;
    let addr = server.addr;
    // Two open listen streams are two requests in progress.
    let l1 = post(addr, Some("alice"), &listen_body(&[])).await;
    let l2 = post(addr, Some("alice"), &listen_body(&[])).await;
    assert_eq!((l1.status, l2.status), (200, 200));
    let r = create(addr, "alice").await;
    assert_refused(&r, "concurrentRequests");
    assert_eq!(server.stored().await, 0);
    assert_eq!(create(addr, "bob").await.status, 200);
    drop(l1);
    let deadline = Instant::now() + support::WAIT;
    while create(addr, "alice").await.status != 200 {
        assert!(
            Instant::now() < deadline,
            "a closed stream never frees its place"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(l2);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_are_bounded_in_size_and_time() {
    let config = HttpConfig::default()
        .max_body_bytes(1024)
        .body_timeout(Duration::from_millis(300));
    let server = start(quotas(), config, ServeOptions::default()).await;
    let addr = server.addr;
    let mut big = create_body();
    big["params"]["arguments"] = json!({ "pad": "x".repeat(2000) });
    let r = post(addr, Some("alice"), &big).await;
    assert_eq!(r.status, 413);
    assert_eq!(server.stored().await, 0);

    // A body that never completes: 408 once the body timeout passes.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer alice\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"jsonrpc\"",
        addr.port()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let r = tokio::time::timeout(
        support::WAIT,
        support::read_response(tokio::io::BufReader::new(stream)),
    )
    .await
    .expect("an answer once the body timeout passes");
    assert_eq!(r.status, 408);
    server.stop().await;
}

/// Opens a connection that sends half a request head and never more.
async fn half_open(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
        .await
        .unwrap();
    s
}

/// Whether the server closed `s` (EOF or reset) within `within`.
async fn closed_by_server(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // A 408 (or other) response before the close.
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_loris_connections_time_out_and_a_real_client_gets_through() {
    let options = ServeOptions::default()
        .max_connections(8)
        .header_read_timeout(Duration::from_millis(500));
    let server = start(quotas(), HttpConfig::default(), options).await;
    let addr = server.addr;
    let mut attackers = Vec::new();
    for _ in 0..8 {
        attackers.push(half_open(addr).await);
    }
    // Every half-open connection is closed by the server after the header timeout.
    for s in &mut attackers {
        assert!(
            closed_by_server(s, Duration::from_secs(10)).await,
            "a half-open connection is never closed"
        );
    }
    // With the slots free again, a legitimate request succeeds.
    let discover = request(json!(1), "server/discover", json!({}));
    let r = post(addr, Some("alice"), &discover).await;
    assert_eq!(r.status, 200);

    // An idle keep-alive connection is closed the same way.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    assert!(closed_by_server(&mut idle, Duration::from_secs(10)).await);

    // A connection over the limit closes the oldest idle unauthenticated one to make room,
    // and the server stays usable.
    let mut holders = Vec::new();
    for _ in 0..8 {
        holders.push(half_open(addr).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _extra = TcpStream::connect(addr).await.unwrap();
    assert!(closed_by_server(&mut holders[0], Duration::from_millis(400)).await);
    drop(holders);
    let deadline = Instant::now() + support::WAIT;
    loop {
        let stream = TcpStream::connect(addr).await.unwrap();
        let body = serde_json::to_vec(&discover).unwrap();
        let mut head = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            addr.port(),
            body.len()
        );
        for (n, v) in support::headers_for(&discover, Some("alice")) {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let mut stream = stream;
        if stream.write_all(head.as_bytes()).await.is_ok() && stream.write_all(&body).await.is_ok()
        {
            let mut buf = Vec::new();
            let _ =
                tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut buf)).await;
            if buf.starts_with(b"HTTP/1.1 200") {
                break;
            }
        }
        assert!(Instant::now() < deadline, "the server never recovers");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}

/// A connection from `ip` (a loopback address: 127.0.0.0/8 is all local on Linux).
async fn connect_from(ip: &str, addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(format!("{ip}:0").parse().unwrap())
        .expect("binding a loopback source address");
    socket.connect(addr).await.unwrap()
}

/// Sends `body` as `who` on `stream` (kept alive) and reads the answer.
async fn post_on(
    stream: &mut TcpStream,
    addr: SocketAddr,
    who: &str,
    body: &Value,
) -> (u16, Value, bool) {
    try_post_on(stream, addr, who, body).await.unwrap()
}

/// [`post_on`], with the connection's failure (closed by the server before it answered) as
/// an error instead of a panic.
async fn try_post_on(
    stream: &mut TcpStream,
    addr: SocketAddr,
    who: &str,
    body: &Value,
) -> std::io::Result<(u16, Value, bool)> {
    use tokio::io::AsyncBufReadExt;
    let bytes = serde_json::to_vec(body).unwrap();
    let mut head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
        addr.port(),
        bytes.len()
    );
    for (n, v) in support::headers_for(body, Some(who)) {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&bytes).await?;
    let mut reader = tokio::io::BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not a status line: {line:?}")))?;
    let (mut length, mut close) = (0usize, false);
    loop {
        line.clear();
        reader.read_line(&mut line).await?;
        if line == "\r\n" {
            break;
        }
        let (name, value) = line.split_once(':').unwrap();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.trim().parse().unwrap();
        }
        if name.eq_ignore_ascii_case("connection") && value.trim().eq_ignore_ascii_case("close") {
            close = true;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await?;
    Ok((status, serde_json::from_slice(&body).unwrap(), close))
}

/// How many of `streams` the server still holds open (not closed within a short while).
async fn still_open(streams: &mut [TcpStream]) -> usize {
    let checks = streams
        .iter_mut()
        .map(|s| closed_by_server(s, Duration::from_millis(300)));
    futures::future::join_all(checks)
        .await
        .into_iter()
        .filter(|closed| !closed)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_connections_cannot_take_every_slot() {
    let options = ServeOptions::default()
        .max_connections(16)
        .max_unauthenticated_per_address(4)
        .header_read_timeout(Duration::from_secs(60));
    let server = start(quotas(), HttpConfig::default(), options).await;
    let addr = server.addr;
    let discover = request(json!(1), "server/discover", json!({}));

    // One address opens 40 connections and never authenticates: it keeps 4.
    let mut attacker = Vec::new();
    for i in 0..40 {
        let mut s = connect_from("127.0.0.2", addr).await;
        if i % 2 == 0 {
            // Half of them trickle a request head, half send nothing.
            s.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                .await
                .unwrap();
        }
        attacker.push(s);
    }
    // Meanwhile an authenticated client from another address is served, every time.
    for _ in 0..20 {
        let r = post(addr, Some("alice"), &discover).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    assert_eq!(still_open(&mut attacker).await, 4);

    // Eight addresses with 4 idle connections each fill every slot (16) and more: the
    // oldest idle unauthenticated connections make room for the authenticated client.
    let mut many = Vec::new();
    for a in 0..8 {
        for _ in 0..4 {
            many.push(connect_from(&format!("127.0.1.{}", a + 1), addr).await);
        }
    }
    for _ in 0..20 {
        let r = post(addr, Some("alice"), &discover).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    assert!(still_open(&mut many).await <= 16);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_principal() {
    let options = ServeOptions::default()
        .max_connections(3)
        .max_connections_per_principal(2)
        .header_read_timeout(Duration::from_secs(60));
    let server = start(quotas(), HttpConfig::default(), options).await;
    let addr = server.addr;
    let discover = request(json!(1), "server/discover", json!({}));

    // alice holds two keep-alive connections; each serves several requests.
    let mut alice = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        for _ in 0..2 {
            let (status, body, _) = post_on(&mut s, addr, "alice", &discover).await;
            assert_eq!(status, 200, "{body}");
        }
        alice.push(s);
    }
    // A third is refused with 429 (quota `connections`) and closed after the answer.
    let mut third = TcpStream::connect(addr).await.unwrap();
    let (status, body, close) = post_on(&mut third, addr, "alice", &discover).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], QUOTA_EXCEEDED, "{body}");
    assert_eq!(body["error"]["data"]["quota"], "connections", "{body}");
    assert!(close, "the refused connection is closed");
    assert!(closed_by_server(&mut third, Duration::from_secs(5)).await);

    // Another principal is served meanwhile.
    let mut bob = TcpStream::connect(addr).await.unwrap();
    let (status, body, _) = post_on(&mut bob, addr, "bob", &discover).await;
    assert_eq!(status, 200, "{body}");

    // Every slot is now held by an authenticated connection: one more is closed at once
    // (authenticated connections are never closed to make room).
    let mut extra = TcpStream::connect(addr).await.unwrap();
    assert!(closed_by_server(&mut extra, Duration::from_secs(5)).await);
    let (status, _, _) = post_on(&mut alice[0], addr, "alice", &discover).await;
    assert_eq!(status, 200);

    // Once alice closes one, she may open another.
    drop(alice.pop());
    let deadline = Instant::now() + support::WAIT;
    loop {
        let mut s = TcpStream::connect(addr).await.unwrap();
        // Until the server has seen her close, a new connection may be closed at once.
        let (status, _, _) = match tokio::time::timeout(
            Duration::from_secs(2),
            try_post_on(&mut s, addr, "alice", &discover),
        )
        .await
        {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) | Err(_) => (0, Value::Null, true),
        };
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "alice never gets her connection back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}
