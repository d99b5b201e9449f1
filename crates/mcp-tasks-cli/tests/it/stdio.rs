//! The stdio transport end to end: the real binary (`mcp-tasks serve --stdio`) as a child
//! process, driven over its stdin/stdout with newline-delimited JSON-RPC. Every wait is
//! bounded, so a broken server fails a test instead of hanging it.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const TASKS: &str = "io.modelcontextprotocol/tasks";
const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
/// The longest wait for one message.
const MESSAGE_WAIT: Duration = Duration::from_secs(10);
/// The longest wait for a task to reach a status (the outline alone takes 1.5 s).
const STATUS_WAIT: Duration = Duration::from_secs(30);
/// How fast the process must exit once its stdin is closed.
const EXIT_WAIT: Duration = Duration::from_secs(10);

fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": { "extensions": { TASKS: {} } },
        "io.modelcontextprotocol/clientInfo": { "name": "stdio-test", "version": "0" }
    })
}

fn request(id: Value, method: &str, mut params: Value) -> Value {
    params["_meta"] = meta();
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

/// The server process and what it wrote so far.
struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Stdout lines, parsed (an `Err` holds a line that is not JSON).
    lines: Receiver<Result<Value, String>>,
    /// Messages read but not consumed yet, oldest first.
    backlog: VecDeque<Value>,
    stderr: Arc<Mutex<String>>,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = dir.path().join("s.redb");
        let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-tasks"))
            .arg("serve")
            .arg("--stdio")
            .arg("--store")
            .arg(&store)
            .env("RUST_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let parsed = serde_json::from_str::<Value>(&line).map_err(|_| line);
                if tx.send(parsed).is_err() {
                    break;
                }
            }
        });
        let mut stderr_pipe = child.stderr.take().expect("piped stderr");
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Self {
            stdin: child.stdin.take(),
            child,
            lines,
            backlog: VecDeque::new(),
            stderr,
            _dir: dir,
        }
    }

    fn write_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin.write_all(bytes).expect("the server reads its stdin");
        stdin.flush().expect("flush stdin");
    }

    fn send(&mut self, message: &Value) {
        let mut line = serde_json::to_vec(message).unwrap();
        line.push(b'\n');
        self.write_raw(&line);
    }

    /// The next message from stdout, or `None` after `timeout`.
    fn read(&mut self, timeout: Duration) -> Option<Value> {
        match self.lines.recv_timeout(timeout) {
            Ok(Ok(message)) => {
                assert!(message.is_object(), "not a JSON object: {message}");
                Some(message)
            }
            Ok(Err(line)) => panic!("the server wrote a line that is not JSON: {line:?}"),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => panic!("the server closed its stdout"),
        }
    }

    /// The first message (backlog first) that satisfies `want`; the others stay queued.
    fn wait_for(&mut self, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.backlog.iter().position(&want) {
            return self.backlog.remove(i).unwrap();
        }
        let deadline = Instant::now() + MESSAGE_WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(message) = self.read(left) else {
                panic!(
                    "no {what} within {MESSAGE_WAIT:?}; unconsumed: {:?}",
                    self.backlog
                );
            };
            if want(&message) {
                return message;
            }
            self.backlog.push_back(message);
        }
    }

    /// Sends a request and returns its response.
    fn call(&mut self, id: Value, method: &str, params: Value) -> Value {
        self.send(&request(id.clone(), method, params));
        self.response(&id)
    }

    fn response(&mut self, id: &Value) -> Value {
        self.wait_for(&format!("response to {id}"), |m| {
            m.get("id") == Some(id) && m.get("method").is_none()
        })
    }

    /// Polls `tasks/get` until the task is `want` (or terminal); returns the last result.
    fn poll_until(&mut self, id: u64, task: &str, want: &str) -> Value {
        let deadline = Instant::now() + STATUS_WAIT;
        loop {
            let r = self.call(json!(id), "tasks/get", json!({ "taskId": task }));
            let result = r
                .get("result")
                .unwrap_or_else(|| panic!("tasks/get failed: {r}"))
                .clone();
            let status = result["status"].as_str().unwrap_or_default();
            if status == want {
                return result;
            }
            assert!(
                !["completed", "failed", "cancelled"].contains(&status),
                "the task ended {status} instead of becoming {want}: {result}"
            );
            assert!(
                Instant::now() < deadline,
                "the task did not become {want} within {STATUS_WAIT:?}"
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Messages that arrive within `window` and are not consumed otherwise.
    fn drain(&mut self, window: Duration) -> Vec<Value> {
        let deadline = Instant::now() + window;
        let mut out: Vec<Value> = self.backlog.drain(..).collect();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return out;
            }
            if let Some(m) = self.read(left) {
                out.push(m);
            }
        }
    }

    /// Closes stdin and waits (bounded) for the process to exit.
    fn close_and_wait(&mut self) -> ExitStatus {
        drop(self.stdin.take());
        let deadline = Instant::now() + EXIT_WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not exit within {EXIT_WAIT:?} of its stdin closing"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if thread::panicking() {
            eprintln!(
                "--- server stderr ---\n{}",
                self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
            );
        }
    }
}

fn error_code(message: &Value) -> i64 {
    message["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error response: {message}"))
}

fn subscription_of(message: &Value) -> Option<&Value> {
    message
        .pointer("/params/_meta")
        .and_then(|m| m.get(SUBSCRIPTION_ID))
}

/// Starts `generate_report {size: "large"}` and returns the task id.
fn create_report(server: &mut Server, id: u64) -> String {
    let r = server.call(
        json!(id),
        "tools/call",
        json!({ "name": "generate_report", "arguments": { "size": "large" } }),
    );
    assert_eq!(r["result"]["resultType"], "task", "{r}");
    assert_eq!(r["result"]["status"], "working", "{r}");
    r["result"]["taskId"]
        .as_str()
        .expect("a task id")
        .to_owned()
}

fn approve(server: &mut Server, id: u64, task: &str) {
    let r = server.call(
        json!(id),
        "tasks/update",
        json!({
            "taskId": task,
            "inputResponses": {
                "approve_outline": { "action": "accept", "content": { "approved": true } }
            }
        }),
    );
    assert!(r.get("result").is_some(), "tasks/update failed: {r}");
}

#[test]
fn the_demo_sequence_over_stdio() {
    let mut server = Server::start();

    let r = server.call(json!(0), "server/discover", json!({}));
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    assert!(
        r["result"]["capabilities"]["extensions"][TASKS].is_object(),
        "{r}"
    );

    let task = create_report(&mut server, 1);

    let r = server.call(json!(2), "tasks/get", json!({ "taskId": task }));
    assert_eq!(r["result"]["status"], "working", "{r}");

    let result = server.poll_until(3, &task, "input_required");
    assert!(
        result["inputRequests"]["approve_outline"].is_object(),
        "{result}"
    );

    approve(&mut server, 4, &task);

    let result = server.poll_until(5, &task, "completed");
    assert_eq!(
        result["result"]["structuredContent"],
        json!({ "size": "large", "approved": true }),
        "{result}"
    );

    for (id, method) in [(6, "tasks/result"), (7, "tasks/list")] {
        let r = server.call(json!(id), method, json!({ "taskId": task }));
        assert_eq!(error_code(&r), -32601, "{method}: {r}");
    }

    let status = server.close_and_wait();
    assert!(status.success(), "exit status {status}");
}

#[test]
fn listen_streams_and_their_cancellation() {
    let mut server = Server::start();
    let task = create_report(&mut server, 1);

    // A listen stream that follows the task to the end.
    server.send(&request(
        json!("watch"),
        "subscriptions/listen",
        json!({ "notifications": { "taskIds": [task] } }),
    ));
    let first = server.wait_for("the first message of `watch`", |m| {
        subscription_of(m) == Some(&json!("watch"))
    });
    assert_eq!(
        first["method"], "notifications/subscriptions/acknowledged",
        "the acknowledgement comes first: {first}"
    );
    assert_eq!(
        first["params"]["notifications"]["taskIds"],
        json!([task]),
        "{first}"
    );

    // A second stream on the same task, cancelled as soon as it has reported once.
    server.send(&request(
        json!(77),
        "subscriptions/listen",
        json!({ "notifications": { "taskIds": [task] } }),
    ));
    let ack = server.wait_for("the acknowledgement of listen 77", |m| {
        subscription_of(m) == Some(&json!(77))
    });
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    let working = server.wait_for("a notification of listen 77", |m| {
        subscription_of(m) == Some(&json!(77))
    });
    assert_eq!(working["method"], "notifications/tasks", "{working}");
    assert_eq!(working["params"]["status"], "working", "{working}");
    // The id `"77"` (a string) is another request: cancelling it must not end listen 77.
    server.send(&json!({
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": { "requestId": "77-other", "reason": "unrelated" }
    }));
    server.send(&json!({
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": { "requestId": 77, "reason": "done listening" }
    }));

    // Drive the task to its end; collect everything `watch` says on the way.
    server.poll_until(2, &task, "input_required");
    approve(&mut server, 3, &task);
    server.poll_until(4, &task, "completed");

    let mut statuses = Vec::new();
    loop {
        let n = server.wait_for("a notification of `watch`", |m| {
            subscription_of(m) == Some(&json!("watch"))
        });
        assert_eq!(n["method"], "notifications/tasks", "{n}");
        assert_eq!(n["params"]["taskId"], json!(task), "{n}");
        assert!(n.get("id").is_none(), "a notification has no id: {n}");
        let status = n["params"]["status"].as_str().unwrap().to_owned();
        statuses.push(status.clone());
        if status == "completed" {
            assert_eq!(
                n["params"]["result"]["structuredContent"],
                json!({ "size": "large", "approved": true }),
                "{n}"
            );
            break;
        }
        assert!(
            ["working", "input_required"].contains(&status.as_str()),
            "unexpected status {status}: {n}"
        );
    }
    assert!(
        statuses.contains(&"input_required".to_owned()),
        "`watch` reported {statuses:?}"
    );

    // Nothing more for the cancelled stream, nor anything after the terminal notification.
    let late = server.drain(Duration::from_millis(500));
    for m in &late {
        assert_ne!(
            subscription_of(m),
            Some(&json!(77)),
            "listen 77 reported after its cancellation: {m}"
        );
        assert_ne!(
            subscription_of(m),
            Some(&json!("watch")),
            "`watch` reported after the terminal notification: {m}"
        );
    }

    // The server still answers, and the open stream does not keep it alive past EOF.
    let r = server.call(json!(5), "server/discover", json!({}));
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    let status = server.close_and_wait();
    assert!(status.success(), "exit status {status}");
}

#[test]
fn malformed_lines_get_errors_and_the_server_goes_on() {
    let mut server = Server::start();

    // Not JSON.
    server.write_raw(b"this is not json\n");
    let r = server.wait_for("the parse error", |m| m.get("error").is_some());
    assert_eq!(error_code(&r), -32700, "{r}");
    assert!(r.get("id").is_none(), "no id when none could be read: {r}");

    // Invalid UTF-8 inside a string.
    server.write_raw(b"{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"x\xff\xfe\"}\n");
    let r = server.wait_for("the UTF-8 error", |m| m.get("error").is_some());
    assert_eq!(error_code(&r), -32700, "{r}");
    assert!(r.get("id").is_none(), "{r}");

    // A line longer than 4 MiB, in pieces.
    let piece = vec![b'a'; 1024 * 1024];
    server.write_raw(b"{\"jsonrpc\":\"2.0\",\"id\":10,\"method\":\"");
    for _ in 0..5 {
        server.write_raw(&piece);
    }
    server.write_raw(b"\"}\n");
    let r = server.wait_for("the over-long error", |m| m.get("error").is_some());
    assert_eq!(error_code(&r), -32600, "{r}");
    assert!(r.get("id").is_none(), "{r}");

    // A batch, and an envelope with a readable id but a bad method.
    server.write_raw(b"[]\n");
    let r = server.wait_for("the batch error", |m| m.get("error").is_some());
    assert_eq!(error_code(&r), -32600, "{r}");
    server.write_raw(b"{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":5}\n");
    let r = server.response(&json!(11));
    assert_eq!(error_code(&r), -32600, "{r}");

    // Blank lines and CRLF are fine; a notification gets no answer.
    server.write_raw(b"\n   \r\n");
    server.send(&json!({ "jsonrpc": "2.0", "method": "notifications/whatever" }));
    let mut line = serde_json::to_vec(&request(json!(12), "server/discover", json!({}))).unwrap();
    line.extend_from_slice(b"\r\n");
    server.write_raw(&line);
    let r = server.response(&json!(12));
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    assert!(
        server.backlog.is_empty(),
        "unexpected messages: {:?}",
        server.backlog
    );

    let r = server.call(json!(13), "tools/list", json!({}));
    assert_eq!(r["result"]["tools"][0]["name"], "generate_report", "{r}");

    // A last line without a newline is still handled before the process exits.
    let last = serde_json::to_vec(&request(json!(14), "server/discover", json!({}))).unwrap();
    server.write_raw(&last);
    drop(server.stdin.take());
    let r = server.response(&json!(14));
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    let status = server.close_and_wait();
    assert!(status.success(), "exit status {status}");
    let extra: Vec<_> = server.lines.try_iter().collect();
    assert!(extra.is_empty(), "unexpected output: {extra:?}");
}

#[test]
fn concurrent_requests_answer_in_any_order_and_eof_waits_for_them() {
    let mut server = Server::start();
    // Many requests in one write: every one is answered exactly once, even though stdin
    // closes right after them.
    let mut batch = Vec::new();
    for id in 0..50 {
        let method = if id % 2 == 0 {
            "server/discover"
        } else {
            "tools/list"
        };
        batch.extend(serde_json::to_vec(&request(json!(id), method, json!({}))).unwrap());
        batch.push(b'\n');
    }
    server.write_raw(&batch);
    drop(server.stdin.take());
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..50 {
        let m = server
            .read(MESSAGE_WAIT)
            .expect("a response for every request");
        assert!(m.get("result").is_some(), "{m}");
        assert!(
            seen.insert(m["id"].as_i64().unwrap()),
            "answered twice: {m}"
        );
    }
    let status = server.close_and_wait();
    assert!(status.success(), "exit status {status}");
}
