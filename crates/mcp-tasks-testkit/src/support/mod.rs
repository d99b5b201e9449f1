//! What the integration tests of `mcp-tasks-cli` share (feature `test-support`, which only
//! that crate's `[dev-dependencies]` enable): compiled once here rather than in each of the
//! three test executables (`tests/it`, `tests/pg`, `tests/crash`).
//!
//! This module itself is a small HTTP/1.1 client over a raw socket for the authentication and
//! quota suites, so that they see the exact status line, headers and body bytes, plus the
//! processes the tests run: a test in a process of its own ([`own_process`]) and the gateway
//! tests' upstream MCP servers ([`upstreams_dir`], [`python_upstream`]). The sub-modules: the
//! store a suite runs on ([`backend`], with [`on_both_stores!`](crate::on_both_stores)),
//! PostgreSQL for the tests (`pg`, feature `postgres`), requests to an embedded runtime
//! ([`embedded`]), the crash simulations' seeded driver, checker and simulated disk
//! ([`sim`]; the workload they drive is [`crate::sim`]), and the store conformance suite every
//! backend runs ([`store_conformance`]).

pub mod backend;
pub mod embedded;
#[cfg(feature = "postgres")]
pub mod pg;
pub mod sim;
pub mod store_conformance;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The protocol version the requests declare.
pub const VERSION: &str = "2026-07-28";
/// How long a test waits for an answer, a process or a port before it fails.
pub const WAIT: Duration = Duration::from_secs(30);

/// `_meta` of a `2026-07-28` request that declares the Tasks extension.
pub fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities":
            { "extensions": { "io.modelcontextprotocol/tasks": {} } },
    })
}

/// A JSON-RPC request with [`meta`] in its params.
pub fn request(id: Value, method: &str, mut params: Value) -> Value {
    params["_meta"] = meta();
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

/// One HTTP response: status, headers, the whole body (or, for SSE, what was read so far).
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The headers, in the order received.
    pub headers: Vec<(String, String)>,
    /// The body (or, for SSE, what was read so far).
    pub body: Vec<u8>,
    /// The connection, still open after an SSE response's first event.
    pub stream: Option<BufReader<TcpStream>>,
}

impl Response {
    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON; panics, showing the body, when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "a JSON body ({e}), status {}: {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// The MCP headers a conforming client sends for `body`, plus a bearer token.
pub fn headers_for(body: &Value, token: Option<&str>) -> Vec<(String, String)> {
    let method = body["method"].as_str().unwrap_or_default();
    let mut h = vec![
        ("MCP-Protocol-Version".to_owned(), VERSION.to_owned()),
        ("Mcp-Method".to_owned(), method.to_owned()),
    ];
    let name = match method {
        "tools/call" => body["params"]["name"].as_str(),
        "tasks/get" | "tasks/update" | "tasks/cancel" => body["params"]["taskId"].as_str(),
        _ => None,
    };
    if let Some(name) = name {
        h.push(("Mcp-Name".to_owned(), name.to_owned()));
    }
    if let Some(token) = token {
        h.push(("Authorization".to_owned(), format!("Bearer {token}")));
    }
    h
}

/// Sends one request on a new connection and reads the response. An SSE response is read up
/// to its first event, and the connection is kept in [`Response::stream`].
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Response {
    tokio::time::timeout(WAIT, async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n",
            addr.port()
        );
        head.push_str("Content-Type: application/json\r\n");
        head.push_str("Accept: application/json, text/event-stream\r\n");
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        for (n, v) in headers {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(body).await.unwrap();
        read_response(BufReader::new(stream)).await
    })
    .await
    .expect("a timely response")
}

/// Reads one response from `reader`: a body of `Content-Length` bytes, or chunks up to the
/// first complete SSE event (the connection is then kept in [`Response::stream`]).
pub async fn read_response(mut reader: BufReader<TcpStream>) -> Response {
    let mut line = String::new();
    reader.read_line(&mut line).await.unwrap();
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a status line, got {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).await.unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (n, v) = l.split_once(':').expect("a header line");
        headers.push((n.trim().to_owned(), v.trim().to_owned()));
    }
    let mut response = Response {
        status,
        headers,
        body: Vec::new(),
        stream: None,
    };
    let chunked = response
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    if let Some(len) = response.header("content-length") {
        let mut body = vec![0; len.parse().unwrap()];
        reader.read_exact(&mut body).await.unwrap();
        response.body = body;
    } else if chunked {
        // Read chunks until one holds a complete SSE event (or the body ends).
        loop {
            line.clear();
            if reader.read_line(&mut line).await.unwrap() == 0 {
                break;
            }
            let size = usize::from_str_radix(line.trim(), 16).expect("a chunk size");
            let mut data = vec![0; size + 2];
            reader.read_exact(&mut data).await.unwrap();
            data.truncate(size);
            response.body.extend(data);
            if size == 0 || response.body.windows(2).any(|w| w == b"\n\n") {
                break;
            }
        }
        response.stream = Some(reader);
    }
    response
}

/// POSTs a JSON-RPC message to `/mcp` with a conforming client's headers and `token`.
pub async fn post(addr: SocketAddr, token: Option<&str>, body: &Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap();
    send(addr, "POST", "/mcp", &headers_for(body, token), &bytes).await
}

/// The JSON-RPC message of the first SSE event of a listen response.
pub fn first_event(response: &Response) -> Value {
    let text = String::from_utf8_lossy(&response.body);
    let data = text
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap_or_else(|| panic!("an SSE event: {text}"));
    serde_json::from_str(data).unwrap()
}

/// The hex SHA-256 of a token, as a token file stores it.
pub fn sha256_hex(token: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A token file entry.
pub fn token_entry(token: &str, tenant: &str, principal: &str, scopes: &[&str]) -> String {
    format!(
        "[[tokens]]\nsha256 = \"{}\"\ntenant = \"{tenant}\"\nprincipal = \"{principal}\"\nscopes = {}\n\n",
        sha256_hex(token),
        serde_json::to_string(scopes).unwrap()
    )
}

/// Waits (bounded) until `done` holds, looking every 20 ms; fails naming `what` past `bound`.
pub async fn eventually(what: &str, bound: Duration, mut done: impl AsyncFnMut() -> bool) {
    let started = std::time::Instant::now();
    while !done().await {
        assert!(started.elapsed() < bound, "{what}: not within {bound:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs the calling test alone in a child process of its test executable, for a test that
/// needs the process to itself (it installs a process-wide `metrics` recorder and counts
/// exactly): the integration tests share one executable, and the other tests running beside
/// it would add to its counts. In the child (marked by an environment variable) this returns
/// `true` and the test runs its body; in the parent it runs the child, fails if the child
/// failed (with its output), and returns `false`: the caller then returns.
///
/// `test` is the test's path inside the executable (`module::name`).
pub async fn own_process(test: &str) -> bool {
    const CHILD: &str = "MCP_TASKS_TEST_OWN_PROCESS";
    if std::env::var(CHILD).is_ok_and(|t| t == test) {
        return true;
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    let output = tokio::process::Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, test)
        .output()
        .await
        .expect("run the test executable");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{test} in its own process: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    false
}

/// Where `scripts/upstreams.sh` installed the upstream MCP servers of the gateway tests
/// (`MCP_TASKS_UPSTREAMS_DIR`, by default `~/.cache/mcp-tasks-upstreams`), or `None` after
/// saying that the test skips; with `MCP_TASKS_REQUIRE_UPSTREAMS=1` (CI) a missing install
/// fails the test instead.
pub fn upstreams_dir() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let dir = std::env::var_os("MCP_TASKS_UPSTREAMS_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/mcp-tasks-upstreams"))
        })?;
    if dir.join("bin/server-everything").exists()
        && dir.join("venv/bin/python").exists()
        && dir.join("fastmcp-venv/bin/python").exists()
    {
        return Some(dir);
    }
    if std::env::var("MCP_TASKS_REQUIRE_UPSTREAMS").as_deref() == Ok("1") {
        panic!(
            "the upstream MCP servers are not installed in {} (run scripts/upstreams.sh)",
            dir.display()
        );
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: the upstream MCP servers are not installed in {} (scripts/upstreams.sh installs them)",
        dir.display()
    );
    None
}

/// The Python upstream of the gateway tests (`crates/mcp-tasks-cli/tests/upstream/python_server.py`) over HTTP on
/// a free port, its side effects appended to `side_effects`; killed when dropped. Returns the
/// process and its MCP URL.
pub fn python_upstream(
    dir: &std::path::Path,
    side_effects: &std::path::Path,
) -> (KillOnDrop, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = python_upstream_on(dir, port, side_effects);
    (child, format!("http://127.0.0.1:{port}/mcp"))
}

/// [`python_upstream`] on a given port.
pub fn python_upstream_on(
    dir: &std::path::Path,
    port: u16,
    side_effects: &std::path::Path,
) -> KillOnDrop {
    script_upstream(
        &dir.join("venv/bin/python"),
        "python_server.py",
        port,
        side_effects,
    )
}

/// The FastMCP 4.x upstream of the gateway tests (`crates/mcp-tasks-cli/tests/upstream/fastmcp_server.py`) over
/// HTTP on `port`, its side effects appended to `side_effects`; killed when dropped.
pub fn fastmcp_upstream_on(
    dir: &std::path::Path,
    port: u16,
    side_effects: &std::path::Path,
) -> KillOnDrop {
    script_upstream(
        &dir.join("fastmcp-venv/bin/python"),
        "fastmcp_server.py",
        port,
        side_effects,
    )
}

/// `python crates/mcp-tasks-cli/tests/upstream/SCRIPT http PORT`, its side effects appended to `side_effects`, once
/// it listens.
fn script_upstream(
    python: &std::path::Path,
    script: &str,
    port: u16,
    side_effects: &std::path::Path,
) -> KillOnDrop {
    // The scripts are the command line's test data, beside its tests (this crate is never
    // built outside the workspace: it is not published).
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../mcp-tasks-cli/tests/upstream")
        .join(script);
    let child = std::process::Command::new(python)
        .arg(path)
        .args(["http", &port.to_string()])
        .env("SIDE_EFFECTS", side_effects)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {script}: {e}"));
    let deadline = std::time::Instant::now() + WAIT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "{script} did not start listening on port {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    KillOnDrop(child)
}

/// A child process killed (and reaped) when dropped.
pub struct KillOnDrop(pub std::process::Child);

impl KillOnDrop {
    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill9(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.kill9();
    }
}
