//! Legacy (`2025-11-25`) clients over stdio: the real binary (`mcp-tasks serve --stdio
//! --fixtures conformance`) as a child process. The connection that opens with `initialize`
//! is the session; server-to-client requests and task notifications are lines between the
//! responses, and the client's responses are lines too. The server is killed (SIGKILL) in
//! the middle of two tasks and started again on the same store with a new session: both
//! tasks finish.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Value>,
    backlog: VecDeque<Value>,
}

impl Server {
    fn start(store: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-tasks"))
            .args(["serve", "--stdio", "--fixtures", "conformance", "--store"])
            .arg(store)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the binary starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let message: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|_| panic!("a line that is not JSON: {line:?}"));
                if tx.send(message).is_err() {
                    break;
                }
            }
        });
        Self {
            stdin: child.stdin.take(),
            child,
            lines,
            backlog: VecDeque::new(),
        }
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().unwrap();
        let mut line = serde_json::to_vec(message).unwrap();
        line.push(b'\n');
        stdin.write_all(&line).unwrap();
        stdin.flush().unwrap();
    }

    /// The first message (backlog first) that satisfies `want`; the others stay queued.
    fn wait_for(&mut self, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.backlog.iter().position(&want) {
            return self.backlog.remove(i).unwrap();
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(m) if want(&m) => return m,
                Ok(m) => self.backlog.push_back(m),
                Err(RecvTimeoutError::Timeout) => panic!("no {what} within {WAIT:?}"),
                Err(RecvTimeoutError::Disconnected) => panic!("stdout closed before {what}"),
            }
        }
    }

    fn call(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        self.wait_for(&format!("the response to {method}"), |m| {
            m.get("id") == Some(&json!(id)) && m.get("method").is_none()
        })
    }

    fn result(&mut self, id: u64, method: &str, params: Value) -> Value {
        let r = self.call(id, method, params);
        assert!(r.get("error").is_none(), "{method}: {r}");
        r["result"].clone()
    }

    fn initialize(&mut self) -> Value {
        let init = self.result(
            0,
            "initialize",
            json!({ "protocolVersion": "2025-11-25",
                    "capabilities": { "elicitation": {}, "tasks": { "list": {}, "cancel": {} } },
                    "clientInfo": { "name": "legacy-stdio-test", "version": "1" } }),
        );
        self.send(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }));
        init
    }

    fn answer(&mut self, request: &Value, result: Value) {
        self.send(&json!({ "jsonrpc": "2.0", "id": request["id"], "result": result }));
    }

    /// Kills the process (SIGKILL): no shutdown of any kind.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Closes stdin and waits for a clean exit.
    fn stop(mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "exit status {status}");
                return;
            }
            assert!(Instant::now() < deadline, "the server did not exit");
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn legacy_session_on_stdio_with_tasks_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.redb");
    let mut server = Server::start(&store);
    let init = server.initialize();
    assert_eq!(init["protocolVersion"], "2025-11-25");
    assert!(init["capabilities"]["tasks"]["list"].is_object());
    assert_eq!(server.result(1, "ping", json!({})), json!({}));

    // A modern request on the same connection stays modern.
    let modern = server.call(
        2,
        "tasks/list",
        json!({ "_meta": { "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                           "io.modelcontextprotocol/clientCapabilities": {} } }),
    );
    assert_eq!(modern["error"]["code"], -32601);

    // A synchronous call asks through a server-to-client request line.
    server.send(&json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": { "name": "test_elicitation", "arguments": { "message": "Who?" } } }));
    let ask = server.wait_for("the elicitation", |m| m["method"] == "elicitation/create");
    server.answer(
        &ask,
        json!({ "action": "accept", "content": { "username": "u", "email": "e" } }),
    );
    let done = server.wait_for("the call's response", |m| m.get("id") == Some(&json!(3)));
    assert!(done["result"]["content"][0]["text"].is_string(), "{done}");

    // A task that asks for input: its status and its question arrive as lines.
    let create = server.result(
        4,
        "tools/call",
        json!({ "name": "confirm_delete", "arguments": { "filename": "b.txt" }, "task": {} }),
    );
    let task = create["task"]["taskId"].as_str().unwrap().to_owned();
    server.wait_for("a status notification", |m| {
        m["method"] == "notifications/tasks/status" && m["params"]["taskId"] == task.as_str()
    });
    let ask = server.wait_for("the task's elicitation", |m| {
        m["method"] == "elicitation/create"
            && m["params"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"]
                == task.as_str()
    });
    assert!(ask["id"].as_str().unwrap().contains(&task));

    // Another task that just works.
    let slow = server.result(
        5,
        "tools/call",
        json!({ "name": "slow_compute", "arguments": { "seconds": 1, "label": "s" }, "task": {} }),
    )["task"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();

    // A crash (SIGKILL), then a new process on the same store and a new session.
    server.kill();
    let mut server = Server::start(&store);
    server.initialize();
    let got = server.result(6, "tasks/get", json!({ "taskId": task }));
    assert_eq!(got["status"], "input_required");
    let list = server.result(7, "tasks/list", json!({}));
    let ids: Vec<&str> = list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["taskId"].as_str())
        .collect();
    assert!(
        ids.contains(&task.as_str()) && ids.contains(&slow.as_str()),
        "{list}"
    );

    // tasks/result blocks until done; the question comes again and the answer resumes it.
    server.send(
        &json!({ "jsonrpc": "2.0", "id": 8, "method": "tasks/result",
        "params": { "taskId": task } }),
    );
    let ask = server.wait_for("the elicitation again", |m| {
        m["method"] == "elicitation/create"
    });
    server.answer(
        &ask,
        json!({ "action": "accept", "content": { "confirm": true } }),
    );
    let done = server.wait_for("the task's result", |m| m.get("id") == Some(&json!(8)));
    assert_eq!(
        done["result"]["content"][0]["text"], "Deleted b.txt.",
        "{done}"
    );

    let done = server.result(9, "tasks/result", json!({ "taskId": slow }));
    assert!(
        done["content"][0]["text"].as_str().unwrap().contains("`s`"),
        "{done}"
    );
    let r = server.call(10, "tasks/cancel", json!({ "taskId": slow }));
    assert_eq!(
        r["error"]["code"], -32602,
        "a finished task cannot be cancelled"
    );
    server.stop();
}
