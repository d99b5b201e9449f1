//! The gateway when its upstream goes away and comes back (docs/GATEWAY.md, "Retry rules"):
//! an in-process Streamable HTTP server of the session era (`2025-11-25`, written here, so
//! these tests need no install) that a test stops as `kill -9` would (its runtime dropped:
//! every connection closes at once, nothing listens) and starts again on the same port with
//! a fresh memory (its sessions forgotten). The gateway is the `mcp-tasks` binary.
//!
//! The upstream's tools: `work` and `charge` report progress every 200 ms for `steps` steps,
//! then answer; `ask` elicits a name and greets it. Every test declares `work` idempotent and
//! not `charge`; the upstream counts the calls it got of each.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use mcp_tasks::TaskStatus;
use mcp_tasks::client::{Task, TaskHandle};
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::gateway::{Gateway, free_port, start_task, terminal, wait_for, wait_port, wait_tools};

/// The calls the upstream got, by tool, over all its lives.
#[derive(Default)]
struct Seen {
    calls: Mutex<BTreeMap<String, usize>>,
}

impl Seen {
    fn calls(&self, tool: &str) -> usize {
        lock(&self.calls).get(tool).copied().unwrap_or(0)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One life of the upstream: what it forgets when it is killed.
struct Life {
    seen: Arc<Seen>,
    sessions: Mutex<HashSet<String>>,
    /// Its elicitations waiting for their response, by request id.
    asked: Mutex<HashMap<String, oneshot::Sender<Value>>>,
    next: AtomicU64,
}

/// The upstream, up or down, always on one port.
struct Upstream {
    port: u16,
    seen: Arc<Seen>,
    running: Option<(oneshot::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl Upstream {
    fn start() -> Self {
        let mut up = Self {
            port: 0,
            seen: Arc::new(Seen::default()),
            running: None,
        };
        up.restart();
        up
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Starts a new life on the same port (the first on a free one).
    fn restart(&mut self) {
        assert!(self.running.is_none(), "already up");
        let (port_tx, port_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let life = Arc::new(Life {
            seen: self.seen.clone(),
            sessions: Mutex::new(HashSet::new()),
            asked: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        });
        let port = self.port;
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                // SO_REUSEADDR: the connections the last life closed wait in TIME_WAIT.
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.set_reuseaddr(true).unwrap();
                socket.bind(([127, 0, 0, 1], port).into()).unwrap();
                let listener = socket.listen(128).unwrap();
                port_tx.send(listener.local_addr().unwrap().port()).unwrap();
                let app = axum::Router::new()
                    .route("/mcp", axum::routing::post(mcp).get(no_stream))
                    .with_state(life);
                tokio::select! {
                    _ = axum::serve(listener, app) => {}
                    _ = stopped => {}
                }
            });
            // Every connection's task is dropped here, mid-stream: the sockets close at once.
            rt.shutdown_background();
        });
        self.port = port_rx.recv().unwrap();
        self.running = Some((stop, thread));
    }

    /// Stops it at once, as `kill -9` would: streams broken, nothing listening.
    fn kill(&mut self) {
        if let Some((stop, thread)) = self.running.take() {
            let _ = stop.send(());
            let _ = thread.join();
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn no_stream() -> StatusCode {
    StatusCode::METHOD_NOT_ALLOWED
}

fn json_response(message: Value) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        message.to_string(),
    )
        .into_response()
}

fn result(id: &Value, result: Value) -> Response {
    json_response(json!({ "jsonrpc": "2.0", "id": id, "result": result }))
}

fn text(id: &Value, text: String) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": {
        "content": [{ "type": "text", "text": text }] } })
}

async fn mcp(State(life): State<Arc<Life>>, headers: HeaderMap, body: Bytes) -> Response {
    let message: Value = serde_json::from_slice(&body).unwrap_or_default();
    let id = message["id"].clone();
    let method = message["method"].as_str();
    let session = headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match method {
        // Not a 2026-07-28 server: the gateway opens a session.
        Some("server/discover") => json_response(json!({ "jsonrpc": "2.0", "id": id,
            "error": { "code": -32601, "message": "Method not found" } })),
        Some("initialize") => {
            let session = format!("s{}", life.next.fetch_add(1, Ordering::Relaxed));
            lock(&life.sessions).insert(session.clone());
            let mut response = result(
                &id,
                json!({
                    "protocolVersion": "2025-11-25",
                    "capabilities": { "tools": {} },
                    "serverInfo": { "name": "restartable", "version": "1" }
                }),
            );
            response
                .headers_mut()
                .insert("mcp-session-id", session.parse().unwrap());
            response
        }
        // A session of an earlier life (or none): forgotten.
        _ if !session.is_some_and(|s| lock(&life.sessions).contains(&s)) => {
            StatusCode::NOT_FOUND.into_response()
        }
        // The response to one of its elicitations.
        None => {
            let key = id.as_str().unwrap_or_default().to_owned();
            if let Some(tx) = lock(&life.asked).remove(&key) {
                let _ = tx.send(message["result"].clone());
            }
            StatusCode::ACCEPTED.into_response()
        }
        Some(_) if id.is_null() => StatusCode::ACCEPTED.into_response(),
        Some("tools/list") => {
            let steps =
                json!({ "type": "object", "properties": { "steps": { "type": "integer" } } });
            result(
                &id,
                json!({ "tools": [
                    { "name": "work", "inputSchema": steps },
                    { "name": "charge", "inputSchema": steps },
                    { "name": "ask", "inputSchema": { "type": "object" } },
                ] }),
            )
        }
        Some("tools/call") => call(life, id, &message["params"]),
        Some(_) => json_response(json!({ "jsonrpc": "2.0", "id": id,
            "error": { "code": -32601, "message": "Method not found" } })),
    }
}

/// A call: its messages on an event stream.
fn call(life: Arc<Life>, id: Value, params: &Value) -> Response {
    let name = params["name"].as_str().unwrap_or_default().to_owned();
    *lock(&life.seen.calls).entry(name.clone()).or_default() += 1;
    let token = params["_meta"]["progressToken"].clone();
    let steps = params["arguments"]["steps"].as_u64().unwrap_or(1);
    let (tx, rx) = mpsc::unbounded_channel::<Value>();
    tokio::spawn(async move {
        if name == "ask" {
            let key = format!("e{}", life.next.fetch_add(1, Ordering::Relaxed));
            let (answer_tx, answer) = oneshot::channel();
            lock(&life.asked).insert(key.clone(), answer_tx);
            let _ = tx.send(
                json!({ "jsonrpc": "2.0", "id": key, "method": "elicitation/create",
                "params": { "message": "Your name?", "requestedSchema": { "type": "object",
                    "properties": { "name": { "type": "string" } }, "required": ["name"] } } }),
            );
            let Ok(answer) = answer.await else { return };
            let who = answer["content"]["name"].as_str().unwrap_or("?").to_owned();
            let _ = tx.send(text(&id, format!("hello {who}")));
            return;
        }
        for step in 1..=steps {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _ = tx.send(
                json!({ "jsonrpc": "2.0", "method": "notifications/progress",
                "params": { "progressToken": token, "progress": step, "total": steps,
                    "message": format!("step {step}/{steps}") } }),
            );
        }
        let _ = tx.send(text(&id, format!("{name} done")));
    });
    let events = futures::stream::unfold(rx, |mut rx| async move {
        let message = rx.recv().await?;
        Some((
            Ok::<_, std::convert::Infallible>(Bytes::from(format!("data: {message}\n\n"))),
            rx,
        ))
    });
    (
        [(header::CONTENT_TYPE, "text/event-stream")],
        Body::from_stream(events),
    )
        .into_response()
}

/// A gateway in front of `up` (`work` declared idempotent) with `--upstream-timeout timeout`,
/// its metrics on `metrics_port` when given.
fn gateway(
    dir: &std::path::Path,
    up: &Upstream,
    timeout: &str,
    metrics_port: Option<u16>,
) -> Gateway {
    let mut args = vec![
        "--upstream".to_owned(),
        format!("up={}", up.url()),
        "--upstream-idempotent".to_owned(),
        "work".to_owned(),
        "--upstream-timeout".to_owned(),
        timeout.to_owned(),
    ];
    if let Some(port) = metrics_port {
        args.extend(["--metrics-listen".to_owned(), format!("127.0.0.1:{port}")]);
    }
    let gw = Gateway::start(&dir.join("gw.redb"), &args);
    if let Some(port) = metrics_port {
        wait_port(port);
    }
    gw
}

fn text_of(task: &Task) -> String {
    task.result.as_ref().map_or(String::new(), |r| {
        r["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    })
}

fn error_of(task: &Task) -> String {
    task.error
        .as_ref()
        .map_or(String::new(), |e| e.message.clone())
}

/// The number of seconds `message` gives after `prefix`.
fn seconds_after(message: &str, prefix: &str) -> f64 {
    message
        .split(prefix)
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no `{prefix}N s` in: {message}"))
}

/// Waits until the upstream got `n` calls of `tool`.
async fn wait_calls(up: &Upstream, tool: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while up.seen.calls(tool) < n {
        assert!(
            Instant::now() < deadline,
            "{tool}: {} calls, not {n}",
            up.seen.calls(tool)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of the series `name{upstream="up"}` on the gateway's `/metrics` (0 if absent).
async fn metric(port: u16, name: &str) -> f64 {
    let body = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}{{upstream=\"up\"}} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

async fn started(task: &TaskHandle) {
    wait_for(task, "progress", |t| {
        t.status_message
            .as_deref()
            .is_some_and(|m| m.starts_with("step"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_restarted_during_a_call_costs_an_idempotent_tool_nothing_and_fails_another() {
    let mut up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let gw = gateway(dir.path(), &up, "10s", Some(metrics_port));
    let client = gw.client().await;
    wait_tools(&client, &["work", "charge"]).await;

    // Declared idempotent: killed mid-call and back a second later, the call is made again
    // (on a new session) and the task completes.
    let task = start_task(&client, "work", json!({ "steps": 10 })).await;
    started(&task).await;
    up.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    up.restart();
    let done = wait_for(&task, "work after the restart", terminal).await;
    assert_eq!(done.status, TaskStatus::Completed, "{done:?}\n{}", gw.log());
    assert_eq!(text_of(&done), "work done");
    assert_eq!(up.seen.calls("work"), 2, "called again once");
    assert!(
        metric(metrics_port, "mcp_tasks_upstream_retries_total").await >= 1.0,
        "retries counted"
    );
    assert!(gw.log().contains("calling again"), "{}", gw.log());

    // Not declared: the broken call fails at once, naming the upstream, and is not repeated.
    let task = start_task(&client, "charge", json!({ "steps": 10 })).await;
    started(&task).await;
    up.kill();
    let failed = wait_for(&task, "charge after the kill", terminal).await;
    up.restart();
    assert_eq!(failed.status, TaskStatus::Failed, "{failed:?}");
    let error = failed.error.as_ref().unwrap();
    assert_eq!(error.code, -32603);
    for part in [
        "upstream `up` is unreachable",
        "the call of `charge` may or may not have taken effect upstream",
        "not declared idempotent",
    ] {
        assert!(error.message.contains(part), "{part}: {}", error.message);
    }
    assert!(
        !error.message.contains("127.0.0.1"),
        "no internals: {}",
        error.message
    );
    assert_eq!(up.seen.calls("charge"), 1, "not called again");
    drop(gw);

    // Declared idempotent, but not back within `--upstream-timeout 2s`: failed after it,
    // saying that the call may have taken effect (the first try reached the upstream).
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), &up, "2s", None);
    let client = gw.client().await;
    wait_tools(&client, &["work"]).await;
    let task = start_task(&client, "work", json!({ "steps": 10 })).await;
    started(&task).await;
    up.kill();
    let since = Instant::now();
    let failed = wait_for(&task, "work with the upstream gone", terminal).await;
    let waited = since.elapsed();
    assert_eq!(failed.status, TaskStatus::Failed, "{failed:?}");
    let message = error_of(&failed);
    for part in [
        "upstream `up` is unreachable",
        "it may or may not have taken effect upstream",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    let said = seconds_after(&message, "the gateway called `work` again for ");
    assert!((2.0..10.0).contains(&said), "{said}: {message}");
    assert!(waited >= Duration::from_secs(2), "failed after {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_made_while_the_upstream_is_down_waits_for_it_up_to_the_timeout() {
    let mut up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), &up, "10s", None);
    let client = gw.client().await;
    wait_tools(&client, &["charge"]).await;

    // Down when the call is made: nothing reached it, so even a tool not declared
    // idempotent waits for it, and is called once it is back.
    up.kill();
    let task = start_task(&client, "charge", json!({ "steps": 1 })).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let waiting = task.get().await.unwrap();
    assert_eq!(
        waiting.status,
        TaskStatus::Working,
        "still waiting for the upstream: {waiting:?}"
    );
    assert_eq!(up.seen.calls("charge"), 0);
    up.restart();
    let done = wait_for(&task, "charge once the upstream is back", terminal).await;
    assert_eq!(done.status, TaskStatus::Completed, "{done:?}\n{}", gw.log());
    assert_eq!(text_of(&done), "charge done");
    assert_eq!(up.seen.calls("charge"), 1);
    drop(gw);

    // Down for longer than the timeout: the call fails after it, saying so.
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), &up, "2s", None);
    let client = gw.client().await;
    wait_tools(&client, &["charge"]).await;
    up.kill();
    let since = Instant::now();
    let task = start_task(&client, "charge", json!({ "steps": 1 })).await;
    let failed = wait_for(&task, "charge with the upstream down", terminal).await;
    let waited = since.elapsed();
    assert_eq!(failed.status, TaskStatus::Failed, "{failed:?}");
    let message = error_of(&failed);
    for part in [
        "upstream `up` is unreachable: connection refused",
        "the call of `charge` never reached it",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    // How long it waited, as the message says: the timeout, from the first refusal.
    let said = seconds_after(&message, "the gateway waited ");
    assert!((2.0..10.0).contains(&said), "{said}: {message}");
    assert!(
        waited >= Duration::from_secs(2),
        "failed after {waited:?}, before the timeout"
    );
    assert_eq!(up.seen.calls("charge"), 1, "the failed call never arrived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_killed_while_its_task_waits_for_input_ends_the_wait() {
    let mut up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    // A timeout far longer than the test: the task fails because the break is seen.
    let gw = gateway(dir.path(), &up, "5m", None);
    let client = gw.client().await;
    wait_tools(&client, &["ask"]).await;

    // Not declared idempotent: failed as soon as the upstream is gone, nobody answering.
    let task = start_task(&client, "ask", json!({})).await;
    wait_for(&task, "input", |t| t.status == TaskStatus::InputRequired).await;
    up.kill();
    let since = Instant::now();
    let failed = wait_for(&task, "ask after the kill", terminal).await;
    let took = since.elapsed();
    assert_eq!(failed.status, TaskStatus::Failed, "{failed:?}");
    let message = error_of(&failed);
    for part in [
        "upstream `up` is unreachable: it went away while the task waited for input",
        "may or may not have taken effect",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    assert!(failed.input_requests.is_empty(), "{failed:?}");
    assert!(took < Duration::from_secs(10), "failed after {took:?}");
    up.restart();
    drop(gw);

    // Declared idempotent (here with `--upstream-idempotent ask`): called again once the
    // upstream is back; the question keeps its key, and the answer reaches the new call.
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &dir.path().join("gw.redb"),
        &[
            "--upstream".into(),
            format!("up={}", up.url()),
            "--upstream-idempotent".into(),
            "ask".into(),
            "--upstream-timeout".into(),
            "10s".into(),
        ],
    );
    let client = gw.client().await;
    wait_tools(&client, &["ask"]).await;
    let before = up.seen.calls("ask");
    let task = start_task(&client, "ask", json!({})).await;
    wait_for(&task, "input", |t| t.status == TaskStatus::InputRequired).await;
    up.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    up.restart();
    wait_calls(&up, "ask", before + 2).await;
    let waiting = wait_for(&task, "input again", |t| {
        t.status == TaskStatus::InputRequired
    })
    .await;
    assert_eq!(
        waiting.input_requests.keys().collect::<Vec<_>>(),
        ["input-1"],
        "{waiting:?}"
    );
    task.answer(Map::from_iter([(
        "input-1".to_owned(),
        json!({ "action": "accept", "content": { "name": "Ada" } }),
    )]))
    .await
    .unwrap();
    let done = wait_for(&task, "ask answered", terminal).await;
    assert_eq!(done.status, TaskStatus::Completed, "{done:?}\n{}", gw.log());
    assert_eq!(text_of(&done), "hello Ada");
    assert_eq!(up.seen.calls("ask"), before + 2);
}

#[test]
fn the_fixture_answers_like_a_session_era_server() {
    // The upstream refuses a request of a forgotten session with 404 (what makes the gateway
    // open a new one after a restart), and nothing listens while it is down.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut up = Upstream::start();
    let url = up.url();
    let post = |session: Option<&str>, body: Value| {
        let url = url.clone();
        let session = session.map(str::to_owned);
        rt.block_on(async move {
            let mut request = reqwest::Client::new()
                .post(url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(body.to_string());
            if let Some(s) = session {
                request = request.header("mcp-session-id", s);
            }
            request.send().await
        })
    };
    let init = post(
        None,
        json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {} }),
    )
    .unwrap();
    let session = init.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let list = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {} });
    assert_eq!(post(Some(&session), list.clone()).unwrap().status(), 200);
    up.kill();
    assert!(post(Some(&session), list.clone()).unwrap_err().is_connect());
    up.restart();
    assert_eq!(post(Some(&session), list).unwrap().status(), 404);
}

/// The pid the gateway's log gives for the last upstream process it started.
fn last_pid(log: &str) -> Option<i32> {
    log.lines()
        .rev()
        .filter(|l| l.contains("upstream process started"))
        .find_map(|l| {
            l.split("pid=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_upstream_killed_while_its_task_waits_for_input_ends_the_wait() {
    // The Python SDK server over stdio (scripts/upstreams.sh; skipped without it).
    let Some(dir) = crate::support::upstreams_dir() else {
        return;
    };
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstream/python_server.py");
    let command = format!(
        "py={} {} stdio",
        dir.join("venv/bin/python").display(),
        script.display()
    );
    let tmp = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &tmp.path().join("gw.redb"),
        &[
            "--upstream-command".into(),
            command,
            "--upstream-timeout".into(),
            "5m".into(),
        ],
    );
    let client = gw.client().await;
    wait_tools(&client, &["ask"]).await;
    let task = start_task(&client, "ask", json!({ "question": "Who?" })).await;
    wait_for(&task, "input", |t| t.status == TaskStatus::InputRequired).await;
    // One process so far (it listed the tools and takes the call): kill -9 it.
    let pid = last_pid(&gw.log()).unwrap_or_else(|| panic!("no pid in:\n{}", gw.log()));
    // SAFETY: kill(2) on a pid the gateway started and logged; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let since = Instant::now();
    let failed = wait_for(&task, "ask after the kill", terminal).await;
    let took = since.elapsed();
    assert_eq!(failed.status, TaskStatus::Failed, "{failed:?}");
    let message = error_of(&failed);
    for part in [
        "upstream `py` is unreachable: it went away while the task waited for input (its process exited)",
        "may or may not have taken effect",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    assert!(took < Duration::from_secs(10), "failed after {took:?}");
}

/// `mcp-tasks serve --fixtures conformance` (a `2026-07-28` upstream with Tasks) on `port`.
fn conformance_upstream(port: u16, store: &std::path::Path) -> crate::support::KillOnDrop {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-tasks"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--store"])
        .arg(store)
        .args([
            "--no-admin-socket",
            "--no-quotas",
            "--fixtures",
            "conformance",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the upstream");
    wait_port(port);
    crate::support::KillOnDrop(child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_upstream_down_at_call_time_is_waited_for() {
    // The `2026-07-28` era: each request its own POST, nothing kept between them.
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let store = dir.path().join("upstream.redb");
    let mut upstream = conformance_upstream(port, &store);
    let gw = Gateway::start(
        &dir.path().join("gw.redb"),
        &[
            "--upstream".into(),
            format!("inner=http://127.0.0.1:{port}/mcp"),
            "--upstream-timeout".into(),
            "10s".into(),
        ],
    );
    let client = gw.client().await;
    wait_tools(&client, &["greet"]).await;
    upstream.kill9();
    // `greet` is not declared idempotent: it waits because nothing reached the upstream.
    let task = start_task(&client, "greet", json!({ "name": "Mo" })).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let waiting = task.get().await.unwrap();
    assert_eq!(waiting.status, TaskStatus::Working, "{waiting:?}");
    let _upstream = conformance_upstream(port, &store);
    let done = wait_for(&task, "greet once the upstream is back", terminal).await;
    assert_eq!(done.status, TaskStatus::Completed, "{done:?}\n{}", gw.log());
    assert_eq!(text_of(&done), "Hello, Mo!");
}
