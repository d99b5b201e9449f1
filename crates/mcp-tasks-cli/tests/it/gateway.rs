//! The gateway (`serve --upstream URL`, `--upstream-command 'CMD'`) against real upstream
//! MCP servers, installed from their registries at pinned versions by `scripts/upstreams.sh`:
//! the official reference server `@modelcontextprotocol/server-everything` (npm) over stdio and
//! over Streamable HTTP, a server written with the official MCP Python SDK 1.x
//! (`tests/upstream/python_server.py`), and `mcp-tasks serve` itself as an upstream that has
//! the Tasks extension. Every test runs the `mcp-tasks` binary as a process.
//!
//! Without the upstreams installed the tests print that they skip; with
//! `MCP_TASKS_REQUIRE_UPSTREAMS=1` (CI) they fail instead.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::KillOnDrop;
use mcp_tasks::TaskStatus;
use mcp_tasks::client::{CallOutcome, Client, Task, TaskHandle};
use serde_json::{Map, Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_mcp-tasks");
/// Bound of every wait.
const WAIT: Duration = Duration::from_secs(30);

/// Where `scripts/upstreams.sh` installed the upstreams, if it did.
struct Upstreams {
    dir: PathBuf,
}

fn upstreams() -> Option<Upstreams> {
    crate::support::upstreams_dir().map(|dir| Upstreams { dir })
}

impl Upstreams {
    fn everything(&self) -> String {
        self.dir.join("bin/server-everything").display().to_string()
    }

    /// The Python server over HTTP on a free port: the process and its URL.
    fn start_python(&self, side_effects: &Path) -> (KillOnDrop, String) {
        crate::support::python_upstream(&self.dir, side_effects)
    }

    /// server-everything over Streamable HTTP on `port`.
    fn start_everything_http(&self, port: u16) -> Proc {
        let child = Command::new(self.everything())
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start server-everything");
        wait_port(port);
        KillOnDrop(child)
    }
}

use crate::support::KillOnDrop as Proc;

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

pub(crate) fn wait_port(port: u16) {
    let deadline = Instant::now() + WAIT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `mcp-tasks serve` with `args`, on a free port and the redb file `store`.
pub(crate) struct Gateway {
    pub(crate) proc: Proc,
    pub(crate) url: String,
    log: PathBuf,
}

impl Gateway {
    pub(crate) fn start(store: &Path, args: &[String]) -> Self {
        Self::start_on(free_port(), store, args)
    }

    pub(crate) fn start_on(port: u16, store: &Path, args: &[String]) -> Self {
        Self::start_with_env(port, store, args, &[])
    }

    fn start_with_env(port: u16, store: &Path, args: &[String], env: &[(&str, &str)]) -> Self {
        let log = store.with_extension(format!("{port}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log file");
        let child = Command::new(BIN)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--store"])
            .arg(store)
            .args(["--no-admin-socket", "--no-quotas"])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start mcp-tasks serve");
        wait_port(port);
        Self {
            proc: Proc(child),
            url: format!("http://127.0.0.1:{port}/mcp"),
            log,
        }
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) async fn client(&self) -> Client {
        Client::http(&self.url)
            .unwrap()
            .capabilities(json!({ "elicitation": {}, "sampling": {} }))
            .build()
            .await
            .unwrap()
    }
}

/// Polls `tools/list` until every name in `names` is listed; returns the tools.
pub(crate) async fn wait_tools(client: &Client, names: &[&str]) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let tools = client
            .request("tools/list", Map::new())
            .await
            .map(|r| r["tools"].as_array().cloned().unwrap_or_default())
            .unwrap_or_default();
        let listed = |n: &&str| tools.iter().any(|t| t["name"] == **n);
        if names.iter().all(listed) {
            return tools;
        }
        assert!(
            Instant::now() < deadline,
            "tools {names:?} not listed: {tools:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) async fn start_task(client: &Client, tool: &str, arguments: Value) -> TaskHandle {
    match client.call_tool(tool, arguments).await.unwrap() {
        CallOutcome::Task(task) => task,
        CallOutcome::Complete(result) => panic!("{tool} answered at once: {result}"),
    }
}

/// Polls the task until `done` holds (or [`WAIT`] passes).
pub(crate) async fn wait_for(task: &TaskHandle, what: &str, done: impl Fn(&Task) -> bool) -> Task {
    let deadline = Instant::now() + WAIT;
    loop {
        let t = task.get().await.unwrap();
        if done(&t) {
            return t;
        }
        assert!(Instant::now() < deadline, "{what}: the task is still {t:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Answers `key` of the task with `response` (`tasks/update`).
pub(crate) async fn answer(task: &TaskHandle, key: &str, response: Value) {
    task.answer(Map::from_iter([(key.to_owned(), response)]))
        .await
        .unwrap();
}

pub(crate) fn terminal(t: &Task) -> bool {
    matches!(
        t.status,
        TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled
    )
}

pub(crate) fn text(result: &Value) -> String {
    result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------------------------
// A direct session with server-everything on stdio: what a client of the upstream sees.

struct Direct {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
    next: u64,
}

impl Direct {
    fn start(program: &str) -> Self {
        let mut child = Command::new(program)
            .arg("stdio")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut me = Self {
            child,
            out,
            next: 1,
        };
        me.request(
            "initialize",
            json!({
                "protocolVersion": "2025-11-25",
                "capabilities": { "elicitation": { "form": {} }, "sampling": {} },
                "clientInfo": { "name": "direct", "version": "1" }
            }),
        );
        me.send(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }));
        me
    }

    fn send(&mut self, message: Value) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        loop {
            let mut line = String::new();
            assert!(
                self.out.read_line(&mut line).unwrap() > 0,
                "server-everything closed"
            );
            let Ok(m) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if m["id"] == json!(id) && m.get("method").is_none() {
                return m["result"].clone();
            }
        }
    }
}

impl Drop for Direct {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn stdio_upstream_lists_and_answers_like_a_direct_call() {
    let Some(up) = upstreams() else { return };
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &dir.path().join("gw.redb"),
        &[
            "--upstream-command".into(),
            format!("everything={}", up.everything()),
        ],
    );
    let client = gw.client().await;
    let listed = wait_tools(&client, &["echo", "get-sum", "trigger-elicitation-request"]).await;
    let mut direct = Direct::start(&up.everything());
    // The direct list is fetched after the deferred tools registered (they follow
    // notifications/initialized).
    std::thread::sleep(Duration::from_millis(300));
    let upstream_tools = direct.request("tools/list", json!({}))["tools"]
        .as_array()
        .unwrap()
        .clone();
    for tool in &upstream_tools {
        let name = tool["name"].as_str().unwrap();
        let ours = listed
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("{name} is not listed by the gateway"));
        for field in [
            "title",
            "description",
            "inputSchema",
            "outputSchema",
            "annotations",
        ] {
            assert_eq!(ours.get(field), tool.get(field), "{name}.{field}");
        }
    }
    // The gateway's own wire, against the official schemas.
    use crate::wire_golden::{Doc, assert_valid};
    let list = client.request("tools/list", Map::new()).await.unwrap();
    assert_valid(
        Doc::Core,
        "ListToolsResult",
        &list,
        "the gateway's tools/list",
    );
    // Upstream tools come and go: clients are not told to cache them for long.
    assert_eq!(list["ttlMs"], 10_000, "{list}");
    let call = json!({ "name": "echo", "arguments": { "message": "wire" } });
    let created = client
        .request("tools/call", call.as_object().unwrap().clone())
        .await
        .unwrap();
    assert_valid(
        Doc::Tasks,
        "CreateTaskResult",
        &created,
        "the gateway's CreateTaskResult",
    );
    let id = created["taskId"].as_str().unwrap();
    let get = json!({ "taskId": id });
    let deadline = Instant::now() + WAIT;
    let got = loop {
        let got = client
            .request("tasks/get", get.as_object().unwrap().clone())
            .await
            .unwrap();
        if got["status"] == "completed" {
            break got;
        }
        assert!(Instant::now() < deadline, "{got}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_valid(
        Doc::Tasks,
        "GetTaskResult",
        &got,
        "the gateway's GetTaskResult",
    );
    assert_valid(
        Doc::Core,
        "CallToolResult",
        &got["result"],
        "the upstream's result",
    );

    for (tool, args) in [
        ("echo", json!({ "message": "hello" })),
        ("get-sum", json!({ "a": 2, "b": 40 })),
        ("get-structured-content", json!({ "location": "Chicago" })),
    ] {
        let expected = direct.request("tools/call", json!({ "name": tool, "arguments": args }));
        let task = start_task(&client, tool, args.clone()).await;
        let done = wait_for(&task, tool, terminal).await;
        assert_eq!(done.status, TaskStatus::Completed, "{tool}: {done:?}");
        let result = done.result.unwrap();
        assert_eq!(result["content"], expected["content"], "{tool}");
        assert_eq!(
            result.get("structuredContent"),
            expected.get("structuredContent"),
            "{tool}"
        );
    }
}

#[tokio::test]
async fn stdio_progress_input_and_cancellation_reach_the_task() {
    let Some(up) = upstreams() else { return };
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &dir.path().join("gw.redb"),
        &[
            "--upstream-command".into(),
            format!("everything={}", up.everything()),
        ],
    );
    let client = gw.client().await;
    wait_tools(
        &client,
        &[
            "trigger-long-running-operation",
            "trigger-elicitation-request",
        ],
    )
    .await;

    // Progress becomes the statusMessage.
    let task = start_task(
        &client,
        "trigger-long-running-operation",
        json!({ "duration": 2, "steps": 4 }),
    )
    .await;
    let seen = wait_for(&task, "progress", |t| {
        t.status_message
            .as_deref()
            .is_some_and(|m| m.ends_with("/4"))
    })
    .await;
    assert_eq!(seen.status, TaskStatus::Working);
    let done = wait_for(&task, "long-running", terminal).await;
    assert_eq!(done.status, TaskStatus::Completed);
    assert!(text(&done.result.unwrap()).contains("Long running operation completed"));

    // Two elicitations at once: each on a process of its own, each asked of its own task,
    // with the upstream's schema kept.
    let first = start_task(&client, "trigger-elicitation-request", json!({})).await;
    let second = start_task(&client, "trigger-elicitation-request", json!({})).await;
    for task in [&first, &second] {
        let waiting = wait_for(task, "input", |t| t.status == TaskStatus::InputRequired).await;
        let request = &waiting.input_requests["input-1"];
        assert_eq!(request["method"], "elicitation/create");
        assert_eq!(
            request["params"]["requestedSchema"]["required"],
            json!(["name"])
        );
        assert_eq!(request["params"]["mode"], "form");
    }
    // An answer that does not fit the requested schema is refused; the task still waits.
    let bad = first
        .answer(Map::from_iter([(
            "input-1".to_owned(),
            json!({ "action": "accept", "content": { "check": true } }),
        )]))
        .await;
    assert!(
        bad.is_err(),
        "an answer without the required `name` is refused: {bad:?}"
    );
    answer(
        &first,
        "input-1",
        json!({ "action": "accept", "content": { "name": "Ada" } }),
    )
    .await;
    answer(&second, "input-1", json!({ "action": "decline" })).await;
    let a = wait_for(&first, "first", terminal).await;
    let b = wait_for(&second, "second", terminal).await;
    assert!(
        text(a.result.as_ref().unwrap()).contains("Name: Ada"),
        "{a:?}"
    );
    assert!(
        text(b.result.as_ref().unwrap()).contains("declined"),
        "{b:?}"
    );

    // A sampling request is relayed the same way.
    let sample = start_task(
        &client,
        "trigger-sampling-request",
        json!({ "prompt": "Say hi", "maxTokens": 20 }),
    )
    .await;
    let waiting = wait_for(&sample, "sampling", |t| {
        t.status == TaskStatus::InputRequired
    })
    .await;
    assert_eq!(
        waiting.input_requests["input-1"]["method"],
        "sampling/createMessage"
    );
    answer(&sample, "input-1", json!({ "role": "assistant", "content": { "type": "text", "text": "hi there" }, "model": "test-model", "stopReason": "endTurn" })).await;
    let sampled = wait_for(&sample, "sampled", terminal).await;
    assert!(
        text(sampled.result.as_ref().unwrap()).contains("hi there"),
        "{sampled:?}"
    );

    // tasks/cancel stops the call (notifications/cancelled upstream).
    let long = start_task(
        &client,
        "trigger-long-running-operation",
        json!({ "duration": 60, "steps": 60 }),
    )
    .await;
    wait_for(&long, "started", |t| t.status_message.is_some()).await;
    long.cancel().await.unwrap();
    let cancelled = wait_for(&long, "cancel", terminal).await;
    assert_eq!(cancelled.status, TaskStatus::Cancelled, "{cancelled:?}");
}

#[tokio::test]
async fn a_call_without_the_tasks_extension_passes_through() {
    let Some(up) = upstreams() else { return };
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &dir.path().join("gw.redb"),
        &["--upstream-command".into(), up.everything() + " stdio"],
    );
    let client = gw.client().await;
    wait_tools(&client, &["echo"]).await;
    let response = reqwest::Client::new()
        .post(&gw.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "echo")
        .body(
            json!({
                "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": { "name": "echo", "arguments": { "message": "direct" }, "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {}
                } }
            })
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(body["result"]["resultType"], "complete", "{body}");
    assert_eq!(text(&body["result"]), "Echo: direct");
}

#[tokio::test]
async fn a_stdio_upstream_gets_its_own_environment_not_the_gateways() {
    let Some(up) = upstreams() else { return };
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start_with_env(
        free_port(),
        &dir.path().join("gw.redb"),
        &[
            "--upstream-command".into(),
            up.everything() + " stdio",
            "--upstream-env".into(),
            "GIVEN=to-the-upstream".into(),
        ],
        &[("GATEWAY_SECRET", "s3cret")],
    );
    let client = gw.client().await;
    wait_tools(&client, &["get-env"]).await;
    let task = start_task(&client, "get-env", json!({})).await;
    let env = text(&wait_for(&task, "get-env", terminal).await.result.unwrap());
    assert!(env.contains("to-the-upstream"), "{env}");
    assert!(env.contains("\"PATH\""), "{env}");
    assert!(
        !env.contains("s3cret"),
        "the gateway's environment leaked: {env}"
    );
}

#[tokio::test]
async fn http_upstream_of_the_session_era() {
    let Some(up) = upstreams() else { return };
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _everything = up.start_everything_http(port);
    let gw = Gateway::start(
        &dir.path().join("gw.redb"),
        &[
            "--upstream".into(),
            format!("everything=http://127.0.0.1:{port}/mcp"),
        ],
    );
    let client = gw.client().await;
    wait_tools(&client, &["echo", "trigger-elicitation-request"]).await;
    let echo = start_task(&client, "echo", json!({ "message": "over http" })).await;
    let done = wait_for(&echo, "echo", terminal).await;
    assert_eq!(text(&done.result.unwrap()), "Echo: over http");

    let task = start_task(
        &client,
        "trigger-long-running-operation",
        json!({ "duration": 2, "steps": 4 }),
    )
    .await;
    wait_for(&task, "progress", |t| {
        t.status_message
            .as_deref()
            .is_some_and(|m| m.ends_with("/4"))
    })
    .await;
    assert_eq!(
        wait_for(&task, "done", terminal).await.status,
        TaskStatus::Completed
    );

    let ask = start_task(&client, "trigger-elicitation-request", json!({})).await;
    wait_for(&ask, "input", |t| t.status == TaskStatus::InputRequired).await;
    answer(
        &ask,
        "input-1",
        json!({ "action": "accept", "content": { "name": "Grace" } }),
    )
    .await;
    let done = wait_for(&ask, "answered", terminal).await;
    assert!(
        text(done.result.as_ref().unwrap()).contains("Name: Grace"),
        "{done:?}"
    );
}

#[tokio::test]
async fn python_sdk_upstream_over_http() {
    let Some(up) = upstreams() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (_py, url) = up.start_python(&dir.path().join("effects"));
    let gw = Gateway::start(
        &dir.path().join("gw.redb"),
        &["--upstream".into(), format!("py={url}")],
    );
    let client = gw.client().await;
    wait_tools(&client, &["slow", "ask", "echo", "fail"]).await;

    // The Python SDK sends progress on the session's standalone stream.
    let slow = start_task(&client, "slow", json!({ "seconds": 2, "steps": 4 })).await;
    wait_for(&slow, "progress", |t| {
        t.status_message
            .as_deref()
            .is_some_and(|m| m.starts_with("step "))
    })
    .await;
    let done = wait_for(&slow, "slow", terminal).await;
    assert_eq!(text(&done.result.unwrap()), "slept 2s in 4 steps");

    let ask = start_task(&client, "ask", json!({ "question": "Who?" })).await;
    let waiting = wait_for(&ask, "input", |t| t.status == TaskStatus::InputRequired).await;
    assert_eq!(
        waiting.input_requests["input-1"]["params"]["message"],
        "Who?"
    );
    answer(
        &ask,
        "input-1",
        json!({ "action": "accept", "content": { "name": "Lin" } }),
    )
    .await;
    assert_eq!(
        text(&wait_for(&ask, "ask", terminal).await.result.unwrap()),
        "hello Lin"
    );

    let echo = start_task(&client, "echo", json!({ "message": "m" })).await;
    let result = wait_for(&echo, "echo", terminal).await.result.unwrap();
    assert_eq!(result["structuredContent"], json!({ "result": "m" }));

    let fail = start_task(&client, "fail", json!({})).await;
    let failed = wait_for(&fail, "fail", terminal).await;
    assert_eq!(
        failed.status,
        TaskStatus::Completed,
        "a tool error is a result"
    );
    assert_eq!(failed.result.unwrap()["isError"], true);
}

/// Runs of the Python server's `slow` tool recorded in its side-effect file: (starts, ends).
fn runs(path: &Path) -> (usize, usize) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    (
        text.lines().filter(|l| l.starts_with("slow start")).count(),
        text.lines().filter(|l| l.starts_with("slow end")).count(),
    )
}

#[tokio::test]
async fn kill_9_during_a_call_repeats_an_idempotent_tool_and_fails_another() {
    let Some(up) = upstreams() else { return };
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects");
    let (_py, url) = up.start_python(&effects);
    let upstream = vec!["--upstream".to_owned(), format!("py={url}")];
    let store = dir.path().join("gw.redb");

    // Not declared idempotent: after the restart the task fails, saying why.
    let mut gw = Gateway::start(&store, &upstream);
    let client = gw.client().await;
    wait_tools(&client, &["slow"]).await;
    let task = start_task(&client, "slow", json!({ "seconds": 3, "steps": 3 })).await;
    let id = task.id().to_owned();
    wait_for(&task, "started", |t| t.status_message.is_some()).await;
    gw.proc.kill9();
    let gw = Gateway::start(&store, &upstream);
    let client = gw.client().await;
    let task = client.resume(&id).await.unwrap();
    let failed = wait_for(&task, "after the restart", terminal).await;
    assert_eq!(failed.status, TaskStatus::Failed, "{failed:?}");
    let error = failed.error.unwrap();
    assert_eq!(error.code, -32603);
    assert!(
        error.message.contains("restarted while the call"),
        "{}",
        error.message
    );
    assert!(
        error.message.contains("may or may not have taken effect"),
        "{}",
        error.message
    );
    assert!(failed.status_message.unwrap().contains("restarted"));
    assert_eq!(runs(&effects).0, 1, "not called again");
    drop(gw);

    // Declared idempotent: called again from the start, and it completes.
    let mut with = upstream.clone();
    with.extend(["--upstream-idempotent".to_owned(), "slow".to_owned()]);
    let mut gw = Gateway::start(&store, &with);
    let client = gw.client().await;
    wait_tools(&client, &["slow"]).await;
    let task = start_task(&client, "slow", json!({ "seconds": 3, "steps": 3 })).await;
    let id = task.id().to_owned();
    wait_for(&task, "started", |t| t.status_message.is_some()).await;
    gw.proc.kill9();
    let gw = Gateway::start(&store, &with);
    let client = gw.client().await;
    let task = client.resume(&id).await.unwrap();
    let done = wait_for(&task, "after the restart", terminal).await;
    assert_eq!(done.status, TaskStatus::Completed, "{done:?}\n{}", gw.log());
    assert_eq!(runs(&effects).0, 3, "the idempotent call ran twice");
}

#[tokio::test]
async fn an_upstream_down_at_start_appears_and_one_killed_mid_call_fails_the_task_by_name() {
    let Some(up) = upstreams() else { return };
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let gw = Gateway::start(
        &dir.path().join("gw.redb"),
        &[
            "--upstream".into(),
            format!("py=http://127.0.0.1:{port}/mcp"),
            "--upstream-timeout".into(),
            "10s".into(),
        ],
    );
    let client = gw.client().await;
    // Serving with no upstream yet: an empty tool list.
    let tools = client.request("tools/list", Map::new()).await.unwrap();
    assert_eq!(tools["tools"], json!([]));
    let mut py = crate::support::python_upstream_on(&up.dir, port, &dir.path().join("effects"));
    wait_tools(&client, &["slow"]).await;

    let task = start_task(&client, "slow", json!({ "seconds": 20, "steps": 20 })).await;
    wait_for(&task, "started", |t| t.status_message.is_some()).await;
    py.kill9();
    let failed = wait_for(&task, "upstream killed", terminal).await;
    assert_eq!(failed.status, TaskStatus::Failed, "{failed:?}");
    let error = failed.error.unwrap();
    assert_eq!(error.code, -32603);
    assert!(error.message.contains("upstream `py`"), "{}", error.message);
    assert!(
        !error.message.contains("127.0.0.1"),
        "no internals: {}",
        error.message
    );
}

#[tokio::test]
async fn an_upstream_with_tasks_is_followed_across_a_gateway_restart() {
    let Some(_up) = upstreams() else { return };
    let dir = tempfile::tempdir().unwrap();
    // The upstream: mcp-tasks itself, 2026-07-28 with the Tasks extension.
    let upstream_port = free_port();
    let _upstream = Gateway::start_on(
        upstream_port,
        &dir.path().join("upstream.redb"),
        &["--fixtures".into(), "conformance".into()],
    );
    let store = dir.path().join("gw.redb");
    let args = vec![
        "--upstream".to_owned(),
        format!("inner=http://127.0.0.1:{upstream_port}/mcp"),
    ];
    let mut gw = Gateway::start(&store, &args);
    let client = gw.client().await;
    wait_tools(&client, &["confirm_delete"]).await;
    let task = start_task(&client, "confirm_delete", json!({ "filename": "a.txt" })).await;
    let id = task.id().to_owned();
    let waiting = wait_for(&task, "input", |t| t.status == TaskStatus::InputRequired).await;
    assert_eq!(
        waiting.input_requests["confirm"]["method"],
        "elicitation/create"
    );
    // The upstream task's statusMessage is the gateway task's.
    assert_eq!(
        waiting.status_message.as_deref(),
        Some("Waiting for confirmation."),
        "{waiting:?}"
    );

    // The gateway dies while its task waits for the upstream task's input.
    gw.proc.kill9();
    let gw = Gateway::start(&store, &args);
    let client = gw.client().await;
    let task = client.resume(&id).await.unwrap();
    let waiting = wait_for(&task, "input after the restart", |t| {
        t.status == TaskStatus::InputRequired
    })
    .await;
    assert!(
        waiting.input_requests.contains_key("confirm"),
        "{waiting:?}"
    );
    answer(
        &task,
        "confirm",
        json!({ "action": "accept", "content": { "confirm": true } }),
    )
    .await;
    let done = wait_for(&task, "done", terminal).await;
    assert_eq!(done.status, TaskStatus::Completed, "{done:?}\n{}", gw.log());
    assert_eq!(text(done.result.as_ref().unwrap()), "Deleted a.txt.");
    assert!(
        gw.log().contains("following the upstream task again"),
        "{}",
        gw.log()
    );
}

#[tokio::test]
async fn a_stateless_upstream_asks_for_input_through_input_required_results() {
    let Some(_up) = upstreams() else { return };
    let dir = tempfile::tempdir().unwrap();
    let upstream_port = free_port();
    let _upstream = Gateway::start_on(
        upstream_port,
        &dir.path().join("upstream.redb"),
        &["--fixtures".into(), "conformance".into()],
    );
    let gw = Gateway::start(
        &dir.path().join("gw.redb"),
        &[
            "--upstream".into(),
            format!("inner=http://127.0.0.1:{upstream_port}/mcp"),
        ],
    );
    let client = gw.client().await;
    let tool = "test_input_required_result_elicitation";
    wait_tools(&client, &[tool]).await;
    // The upstream answers this tool synchronously, asking through core MRTR: its round's
    // request becomes the task's, the answer goes back with the upstream's requestState.
    let task = start_task(&client, tool, json!({})).await;
    let waiting = wait_for(&task, "input", |t| t.status == TaskStatus::InputRequired).await;
    assert_eq!(
        waiting.input_requests["round1-user_name"]["method"],
        "elicitation/create"
    );
    answer(
        &task,
        "round1-user_name",
        json!({ "action": "accept", "content": { "name": "Mo" } }),
    )
    .await;
    let done = wait_for(&task, "answered", terminal).await;
    assert_eq!(
        text(done.result.as_ref().unwrap()),
        "Hello, Mo!",
        "{done:?}"
    );
}

#[tokio::test]
async fn a_call_waiting_for_input_at_a_crash_fails_and_a_silent_upstream_times_out() {
    let Some(up) = upstreams() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (_py, url) = up.start_python(&dir.path().join("effects"));
    let args = vec![
        "--upstream".to_owned(),
        format!("py={url}"),
        "--upstream-timeout".to_owned(),
        "1s".to_owned(),
    ];
    let store = dir.path().join("gw.redb");
    let mut gw = Gateway::start(&store, &args);
    let client = gw.client().await;
    wait_tools(&client, &["ask", "slow"]).await;

    // Waiting for the client's input does not count against the timeout (the call's stream
    // is silent meanwhile)...
    let ask = start_task(&client, "ask", json!({})).await;
    wait_for(&ask, "input", |t| t.status == TaskStatus::InputRequired).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    answer(
        &ask,
        "input-1",
        json!({ "action": "accept", "content": { "name": "Late" } }),
    )
    .await;
    let late = wait_for(&ask, "a late answer", terminal).await;
    assert_eq!(
        text(late.result.as_ref().unwrap()),
        "hello Late",
        "{late:?}"
    );
    // ...nor does a call whose progress comes on the session's other stream (the Python SDK's
    // way) while its own stays silent for longer than the timeout.
    let slow = start_task(&client, "slow", json!({ "seconds": 3, "steps": 6 })).await;
    let done = wait_for(&slow, "slow with progress", terminal).await;
    assert_eq!(done.status, TaskStatus::Completed, "{done:?}");

    let ask = start_task(&client, "ask", json!({})).await;
    wait_for(&ask, "input", |t| t.status == TaskStatus::InputRequired).await;
    // ...and a crash while it waits follows the rule of a call in flight: `ask` is not
    // declared idempotent, so it fails.
    let id = ask.id().to_owned();
    gw.proc.kill9();
    let gw = Gateway::start(&store, &args);
    let client = gw.client().await;
    let ask = client.resume(&id).await.unwrap();
    let failed = wait_for(&ask, "after the restart", terminal).await;
    assert_eq!(failed.status, TaskStatus::Failed, "{failed:?}");
    assert!(
        failed
            .error
            .unwrap()
            .message
            .contains("restarted while the call")
    );

    // An upstream silent for longer than --upstream-timeout (one step of 3 s, no progress
    // before it ends) fails the task, naming the upstream.
    wait_tools(&client, &["slow"]).await;
    let slow = start_task(&client, "slow", json!({ "seconds": 3, "steps": 1 })).await;
    let failed = wait_for(&slow, "timeout", terminal).await;
    assert_eq!(failed.status, TaskStatus::Failed, "{failed:?}");
    let error = failed.error.unwrap();
    assert_eq!(error.code, -32603);
    assert!(
        error
            .message
            .contains("upstream `py` did not answer within 1 s"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn a_legacy_client_reaches_the_upstream_through_the_dual_era_endpoint() {
    let Some(up) = upstreams() else { return };
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &dir.path().join("gw.redb"),
        &["--upstream-command".into(), up.everything() + " stdio"],
    );
    wait_tools(&gw.client().await, &["echo"]).await;
    let mut legacy = crate::support::legacy::Client::new(&gw.url);
    legacy.initialize(json!({})).await;
    let tools = legacy.result(1, "tools/list", json!({})).await;
    let echo = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "echo")
        .expect("echo listed in the session");
    assert_eq!(echo["execution"]["taskSupport"], "optional");
    // Synchronously, then as a 2025-11-25 task read with tasks/result.
    let result = legacy
        .result(
            2,
            "tools/call",
            json!({ "name": "echo", "arguments": { "message": "old" } }),
        )
        .await;
    assert_eq!(text(&result), "Echo: old");
    let created = legacy
        .result(
            3,
            "tools/call",
            json!({ "name": "get-sum", "arguments": { "a": 1, "b": 2 }, "task": {} }),
        )
        .await;
    let id = created["task"]["taskId"]
        .as_str()
        .expect("a task")
        .to_owned();
    let done = legacy
        .result(4, "tasks/result", json!({ "taskId": id }))
        .await;
    assert_eq!(text(&done), "The sum of 1 and 2 is 3.");
}

#[tokio::test]
async fn an_upstream_with_2025_tasks_runs_the_call_as_its_task() {
    let Some(up) = upstreams() else { return };
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("gw.redb");
    let args = vec!["--upstream-command".to_owned(), up.everything() + " stdio"];
    let mut gw = Gateway::start(&store, &args);
    let client = gw.client().await;
    wait_tools(&client, &["simulate-research-query"]).await;

    // server-everything requires a task-augmented call for this tool (2025-11-25 experimental
    // tasks): its statusMessage is copied, its elicitation (queued on tasks/result) asked.
    let task = start_task(
        &client,
        "simulate-research-query",
        json!({ "topic": "rust", "ambiguous": true }),
    )
    .await;
    wait_for(&task, "a stage", |t| {
        t.status_message
            .as_deref()
            .is_some_and(|m| m.ends_with("..."))
    })
    .await;
    let waiting = wait_for(&task, "input", |t| t.status == TaskStatus::InputRequired).await;
    assert_eq!(
        waiting.input_requests["input-1"]["params"]["requestedSchema"]["required"],
        json!(["interpretation"])
    );
    answer(
        &task,
        "input-1",
        json!({ "action": "accept", "content": { "interpretation": "historical" } }),
    )
    .await;
    let done = wait_for(&task, "report", terminal).await;
    assert_eq!(done.status, TaskStatus::Completed, "{done:?}");
    assert!(text(done.result.as_ref().unwrap()).contains("# Research Report: rust (historical)"));
    assert!(
        gw.log().contains("the upstream runs the call as its task"),
        "{}",
        gw.log()
    );

    // A restart while it waits: the recorded upstream task is asked for again, not called
    // twice. This upstream kept it in the memory of the process that went with the gateway,
    // so it is gone, and the task fails with the upstream's answer.
    let task = start_task(
        &client,
        "simulate-research-query",
        json!({ "topic": "go", "ambiguous": true }),
    )
    .await;
    let id = task.id().to_owned();
    wait_for(&task, "input", |t| t.status == TaskStatus::InputRequired).await;
    gw.proc.kill9();
    let gw = Gateway::start(&store, &args);
    let client = gw.client().await;
    let task = client.resume(&id).await.unwrap();
    let ended = wait_for(&task, "after the restart", terminal).await;
    assert_eq!(ended.status, TaskStatus::Failed, "{ended:?}");
    assert!(ended.error.unwrap().message.contains("upstream `upstream`"));
    assert!(
        gw.log().contains("following the upstream task again"),
        "{}",
        gw.log()
    );
}

#[tokio::test]
async fn an_idempotent_hint_counts_only_when_annotations_are_trusted() {
    let Some(up) = upstreams() else { return };
    let dir = tempfile::tempdir().unwrap();
    // `trigger-long-running-operation` says `idempotentHint: true`.
    for (trusted, expected) in [(false, TaskStatus::Failed), (true, TaskStatus::Completed)] {
        let store = dir.path().join(format!("gw-{trusted}.redb"));
        let mut args = vec!["--upstream-command".to_owned(), up.everything() + " stdio"];
        if trusted {
            args.push("--trust-upstream-annotations".to_owned());
        }
        let mut gw = Gateway::start(&store, &args);
        let client = gw.client().await;
        wait_tools(&client, &["trigger-long-running-operation"]).await;
        let task = start_task(
            &client,
            "trigger-long-running-operation",
            json!({ "duration": 2, "steps": 4 }),
        )
        .await;
        let id = task.id().to_owned();
        wait_for(&task, "started", |t| t.status_message.is_some()).await;
        gw.proc.kill9();
        let gw = Gateway::start(&store, &args);
        let task = gw.client().await.resume(&id).await.unwrap();
        let ended = wait_for(&task, "after the restart", terminal).await;
        assert_eq!(
            ended.status,
            expected,
            "trusted: {trusted}: {ended:?}\n{}",
            gw.log()
        );
    }
}

#[tokio::test]
async fn a_stdio_upstream_runs_at_most_its_processes_and_further_calls_wait() {
    let Some(up) = upstreams() else { return };
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &dir.path().join("gw.redb"),
        &[
            "--upstream-command".into(),
            up.everything() + " stdio",
            "--upstream-processes".into(),
            "1".into(),
        ],
    );
    let client = gw.client().await;
    wait_tools(&client, &["trigger-elicitation-request"]).await;
    let first = start_task(&client, "trigger-elicitation-request", json!({})).await;
    wait_for(&first, "input", |t| t.status == TaskStatus::InputRequired).await;
    // The one process is held by the first call, waiting for its answer: the second call
    // waits for it (still working, nothing asked yet).
    let second = start_task(&client, "trigger-elicitation-request", json!({})).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(second.get().await.unwrap().status, TaskStatus::Working);
    assert!(gw.log().contains("no more may start"), "{}", gw.log());
    answer(&first, "input-1", json!({ "action": "decline" })).await;
    assert_eq!(
        wait_for(&first, "first", terminal).await.status,
        TaskStatus::Completed
    );
    wait_for(&second, "its turn", |t| {
        t.status == TaskStatus::InputRequired
    })
    .await;
    answer(&second, "input-1", json!({ "action": "decline" })).await;
    assert_eq!(
        wait_for(&second, "second", terminal).await.status,
        TaskStatus::Completed
    );
    assert!(
        !gw.log().contains("starting another"),
        "one process only: {}",
        gw.log()
    );
}

#[tokio::test]
async fn a_burst_of_calls_on_a_stdio_upstream_starts_at_most_the_default_processes() {
    let Some(up) = upstreams() else { return };
    let dir = tempfile::tempdir().unwrap();
    let console = free_port();
    let gw = Gateway::start(
        &dir.path().join("gw.redb"),
        &[
            "--upstream-command".into(),
            up.everything() + " stdio",
            "--console-listen".into(),
            format!("127.0.0.1:{console}"),
        ],
    );
    let client = gw.client().await;
    wait_tools(&client, &["echo"]).await;
    // 20 calls at once, each as a task of its own.
    let tasks = futures::future::join_all(
        (0..20).map(|i| start_task(&client, "echo", json!({ "message": format!("m{i}") }))),
    )
    .await;
    for (i, task) in tasks.iter().enumerate() {
        let done = wait_for(task, "echo", terminal).await;
        assert_eq!(done.status, TaskStatus::Completed, "{done:?}");
        assert_eq!(text(&done.result.unwrap()), format!("Echo: m{i}"));
    }
    // A second burst: the calls of the first told the pool how long a call takes, so these
    // wait about that long for a busy process and then have more started (in the
    // background, while the running one serves them).
    let again = futures::future::join_all(
        (0..20).map(|i| start_task(&client, "echo", json!({ "message": format!("n{i}") }))),
    )
    .await;
    for task in &again {
        let done = wait_for(task, "echo", terminal).await;
        assert_eq!(done.status, TaskStatus::Completed, "{done:?}");
    }
    crate::support::eventually(
        "the pool grows past its first process",
        Duration::from_secs(30),
        async || gw.log().matches("upstream process started").count() >= 2,
    )
    .await;
    // The gateway logs each process it starts: the first, and at most 3 more (the default
    // --upstream-processes is 4), however many calls came at once.
    let log = gw.log();
    let started = log.matches("upstream process started").count();
    assert!(
        (2..=mcp_tasks::gateway::DEFAULT_MAX_PROCESSES).contains(&started),
        "{started} processes for 40 calls:\n{log}"
    );
    assert_eq!(mcp_tasks::gateway::DEFAULT_MAX_PROCESSES, 4);
    // The console's page of a task says which upstream it went to.
    let url = format!("http://127.0.0.1:{console}/api/tasks/{}", tasks[0].id());
    let page: Value =
        serde_json::from_str(&reqwest::get(url).await.unwrap().text().await.unwrap()).unwrap();
    assert_eq!(page["upstream"], "upstream", "{page}");
    assert_eq!(page["isError"], false, "{page}");
    // /readyz says the upstream is connected, with its era and its tool count.
    let (status, body) = readyz(&gw).await;
    assert_eq!(status, 200, "{body}");
    let line = body
        .lines()
        .find(|l| l.starts_with("upstream upstream: "))
        .unwrap_or_else(|| panic!("{body}"));
    assert!(
        line.starts_with("upstream upstream: connected, era 2025-11-25, "),
        "{line}"
    );
    assert!(
        line.ends_with(" tools") && !line.contains(", 0 tools"),
        "{line}"
    );
}

/// `GET /readyz` of the gateway: its status and body.
pub(crate) async fn readyz(gw: &Gateway) -> (u16, String) {
    let response = reqwest::get(gw.url.replace("/mcp", "/readyz"))
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// A synchronous `tools/call` of `tool` as raw JSON-RPC: the response's body.
pub(crate) async fn raw_call(gw: &Gateway, tool: &str) -> Value {
    let response = reqwest::Client::new()
        .post(&gw.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .body(
            json!({
                "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": { "name": tool, "arguments": {}, "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {}
                } }
            })
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

/// Waits until the gateway's log contains `text` (or fails after [`WAIT`]); returns the log.
pub(crate) async fn wait_log(gw: &Gateway, text: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let log = gw.log();
        if log.contains(text) {
            return log;
        }
        assert!(Instant::now() < deadline, "no `{text}`: {log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_command_that_cannot_start_is_named_and_its_tools_say_the_upstream_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &dir.path().join("gw.redb"),
        &[
            "--upstream-command".into(),
            "fs=mcp-server-filesystem-not-installed /srv/data --token=ARG-SECRET-1".into(),
            "--upstream-env".into(),
            "API_KEY=ENV-SECRET-2".into(),
        ],
    );
    // The log names the upstream and the program, not its arguments nor its environment.
    let log = wait_log(
        &gw,
        "its command `mcp-server-filesystem-not-installed` was not found on PATH",
    )
    .await;
    assert!(log.contains("upstream=fs"), "{log}");
    for secret in ["ARG-SECRET-1", "ENV-SECRET-2", "/srv/data"] {
        assert!(!log.contains(secret), "{secret} leaked: {log}");
    }
    // A call of any tool while it is down: the upstream is down, and why; not "Unknown tool".
    let body = raw_call(&gw, "read_text_file").await;
    assert_eq!(body["error"]["code"], -32603, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("upstream `fs` is down (it last failed with: upstream `fs` is unreachable: its command `mcp-server-filesystem-not-installed` was not found on PATH)"),
        "{message}"
    );
    assert!(!message.contains("SECRET"), "{message}");
    // The server is still ready (it serves its tasks); /readyz says what is wrong.
    let (status, body) = readyz(&gw).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("ready\n"), "{body}");
    assert!(
        body.contains("upstream fs: connecting, last error: upstream `fs` is unreachable: its command `mcp-server-filesystem-not-installed` was not found on PATH"),
        "{body}"
    );
    assert!(!body.contains("SECRET"), "{body}");
}
