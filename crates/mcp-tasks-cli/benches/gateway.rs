//! The gateway in front of a stdio upstream under a burst: 20 concurrent `read_text_file`
//! calls of the official `@modelcontextprotocol/server-filesystem` (installed by
//! `scripts/upstreams.sh`) through `mcp-tasks serve --upstream-command`, against the same 20
//! sent at once on one direct stdio session of that server. Reported in `docs/BENCHMARKS.md`
//! ("A stdio upstream under a burst").
//!
//! ```sh
//! scripts/upstreams.sh
//! cargo bench --bench gateway
//! cargo bench --bench gateway -- --bursts 20 --calls 20 --file-kib 16
//! ```
//!
//! Options (after `--`): `--bursts N` (bursts measured after the first, default 10; the
//! median is printed), `--calls N` (calls in a burst, default 20), `--file-kib N` (the size of
//! the file read, default 16), `--processes N` (the gateway's `--upstream-processes`, default
//! its own default), `--memory` (the gateway's tasks on `--store memory` instead of a redb
//! file: what the task machinery costs without its commits).
//!
//! Each burst is `--calls` requests sent at once and timed until the last answer:
//!
//! - *direct*: one stdio session of server-filesystem (one process), the requests written
//!   one after another on its stdin with distinct ids, the answers read from its stdout;
//! - *gateway, synchronous*: `tools/call` over HTTP from a client without the Tasks extension
//!   (passed through), one connection per call;
//! - *gateway, as tasks*: `tools/call` from a client with the Tasks extension (a durable task
//!   on a redb file with the default durability), then `tasks/get` every 5 ms until it is
//!   terminal;
//! - *gateway, as tasks, listened*: the same tasks followed as a client that does not poll
//!   does (`TaskHandle::watch`: `subscriptions/listen`, the terminal state pushed as it is
//!   committed).
//!
//! The first burst of each path is printed apart; then the bench waits 2 s (a process the
//! gateway started in the background during it finishes starting) and runs five unmeasured
//! bursts (the new processes warm up) before the measured ones. The processes the gateway
//! started are counted from its log (`upstream process started`).
//! Nothing here asserts speed.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mcp_tasks::client::{CallOutcome, Client, RetryPolicy};
use serde_json::{Value, json};

const USAGE: &str = "usage: cargo bench --bench gateway -- [--bursts N] [--calls N] [--file-kib N] [--processes N] [--memory]";

struct Args {
    bursts: usize,
    calls: usize,
    file_kib: usize,
    processes: Option<usize>,
    memory: bool,
}

fn parse_args() -> Args {
    let mut args = Args {
        bursts: 10,
        calls: 20,
        file_kib: 16,
        processes: None,
        memory: false,
    };
    let mut it = std::env::args().skip(1);
    let fail = |msg: String| -> ! {
        eprintln!("{msg}\n{USAGE}");
        std::process::exit(2);
    };
    let num = |name: &str, v: Option<String>| -> usize {
        match v.as_deref().map(str::parse::<usize>) {
            Some(Ok(n)) if n > 0 => n,
            _ => fail(format!("{name} needs a positive integer")),
        }
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--bench" => {}
            "--bursts" => args.bursts = num("--bursts", it.next()),
            "--calls" => args.calls = num("--calls", it.next()),
            "--file-kib" => args.file_kib = num("--file-kib", it.next()),
            "--processes" => args.processes = Some(num("--processes", it.next())),
            "--memory" => args.memory = true,
            other => fail(format!("unknown argument `{other}`")),
        }
    }
    args
}

/// `scripts/upstreams.sh`'s launcher of server-filesystem.
fn server_filesystem() -> PathBuf {
    let dir = std::env::var_os("MCP_TASKS_UPSTREAMS_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/mcp-tasks-upstreams"))
        })
        .expect("HOME or MCP_TASKS_UPSTREAMS_DIR");
    let launcher = dir.join("bin/server-filesystem");
    if !launcher.exists() {
        eprintln!(
            "server-filesystem is not installed in {} (run scripts/upstreams.sh)",
            dir.display()
        );
        std::process::exit(2);
    }
    launcher
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

// ---- Direct: one stdio session.

struct Direct {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
    next: u64,
}

impl Direct {
    fn start(launcher: &Path, root: &Path) -> Self {
        let mut child = Command::new(launcher)
            .arg(root)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start server-filesystem");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut me = Self {
            child,
            out,
            next: 1,
        };
        let init = json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": { "name": "bench", "version": "1" }
        });
        me.burst("initialize", &[init]);
        me.send(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }));
        me
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{message}").expect("write");
        stdin.flush().expect("flush");
    }

    /// Sends one request of `method` per params at once; returns when every answer came.
    fn burst(&mut self, method: &str, params: &[Value]) -> Duration {
        let started = Instant::now();
        let first = self.next;
        for p in params {
            let id = self.next;
            self.next += 1;
            self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": p }));
        }
        let mut left = params.len();
        while left > 0 {
            let mut line = String::new();
            assert!(
                self.out.read_line(&mut line).expect("read") > 0,
                "server-filesystem closed"
            );
            let Ok(m) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if m.get("method").is_none()
                && m["id"]
                    .as_u64()
                    .is_some_and(|id| id >= first && id < self.next)
            {
                assert!(m.get("result").is_some(), "an error: {m}");
                left -= 1;
            }
        }
        started.elapsed()
    }
}

impl Drop for Direct {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- Through the gateway.

struct Gateway {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Gateway {
    fn start(
        dir: &Path,
        launcher: &Path,
        root: &Path,
        processes: Option<usize>,
        memory: bool,
    ) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let log = dir.join("gateway.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-tasks"));
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--store"]);
        if memory {
            cmd.arg("memory");
        } else {
            cmd.arg(dir.join("gw.redb"));
        }
        cmd.args(["--no-admin-socket", "--no-quotas", "--upstream-command"])
            .arg(format!(
                "fs={} {}",
                shlex::try_quote(&launcher.display().to_string()).expect("a path"),
                shlex::try_quote(&root.display().to_string()).expect("a path")
            ))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"));
        if let Some(n) = processes {
            cmd.args(["--upstream-processes", &n.to_string()]);
        }
        let child = cmd.spawn().expect("start mcp-tasks serve");
        Self {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
            log,
        }
    }

    fn processes(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .matches("upstream process started")
            .count()
    }
}

async fn client(url: &str) -> Client {
    Client::http(url)
        .expect("client")
        .retry(RetryPolicy::none())
        .timeout(Duration::from_secs(60))
        .build()
        .await
        .expect("client build")
}

/// Waits until the gateway lists `read_text_file`.
async fn wait_listed(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(c) = Client::http(url)
            .expect("client")
            .retry(RetryPolicy::none())
            .build()
            .await
            && let Ok(tools) = c.list_tools().await
            && tools.iter().any(|t| t.name == "read_text_file")
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the gateway never listed the tools"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One synchronous `tools/call` (no Tasks extension: passed through).
async fn sync_call(http: &reqwest::Client, url: &str, path: &str) {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": { "name": "read_text_file", "arguments": { "path": path }, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}
        } }
    });
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "read_text_file")
        .body(body.to_string())
        .send()
        .await
        .expect("tools/call");
    let answer: Value =
        serde_json::from_slice(&response.bytes().await.expect("body")).expect("JSON");
    assert!(
        answer["result"]["content"].is_array() && answer["result"]["isError"] != true,
        "{answer}"
    );
}

/// `tools/call` of `read_text_file` as a task: its handle.
async fn start_task(client: &Client, path: &str) -> mcp_tasks::client::TaskHandle {
    let CallOutcome::Task(task) = client
        .call_tool("read_text_file", json!({ "path": path }))
        .await
        .expect("tools/call")
    else {
        panic!("not a task")
    };
    task
}

/// One call as a task, polled every 5 ms until terminal.
async fn task_call(client: &Client, path: &str) {
    let task = start_task(client, path).await;
    loop {
        let t = task.get().await.expect("tasks/get");
        if t.is_terminal() {
            assert_eq!(t.status, mcp_tasks::TaskStatus::Completed, "{t:?}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One call as a task, followed with `subscriptions/listen` until terminal.
async fn listened_task_call(client: &Client, path: &str) {
    use futures::StreamExt;
    let mut watch = start_task(client, path).await.watch();
    while let Some(t) = watch.next().await {
        let t = t.expect("watch");
        if t.is_terminal() {
            assert_eq!(t.status, mcp_tasks::TaskStatus::Completed, "{t:?}");
            return;
        }
    }
    panic!("the watch ended before the task did");
}

async fn listened_task_burst(clients: &[Client], path: &str) -> Duration {
    let started = Instant::now();
    futures::future::join_all(clients.iter().map(|c| listened_task_call(c, path))).await;
    started.elapsed()
}

/// Bursts run after the first and before the measured ones: a process the pool started in
/// the background during the first burst is warm by then (Node compiles a server's code on
/// its first calls).
const WARM_UP: usize = 5;

/// After a first burst: time for the processes it had started to finish starting.
async fn settle() {
    tokio::time::sleep(Duration::from_secs(2)).await;
}

async fn sync_burst(http: &reqwest::Client, url: &str, path: &str, calls: usize) -> Duration {
    let started = Instant::now();
    futures::future::join_all((0..calls).map(|_| sync_call(http, url, path))).await;
    started.elapsed()
}

async fn task_burst(clients: &[Client], path: &str) -> Duration {
    let started = Instant::now();
    futures::future::join_all(clients.iter().map(|c| task_call(c, path))).await;
    started.elapsed()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = parse_args();
    let launcher = server_filesystem();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path().join("files");
    std::fs::create_dir_all(&root).expect("files");
    let file = root.join("notes.txt");
    let line = "The quick brown fox jumps over the lazy dog. 0123456789\n";
    let text: String = line.repeat(args.file_kib * 1024 / line.len() + 1);
    std::fs::write(&file, &text[..args.file_kib * 1024]).expect("the file");
    // The path as the server sees it (it resolves symbolic links of its root).
    let root = root.canonicalize().expect("root");
    let path = root.join("notes.txt").display().to_string();
    println!(
        "{} concurrent read_text_file calls of a {} KiB file, {} bursts (median) after the first",
        args.calls, args.file_kib, args.bursts
    );

    // Direct.
    let mut direct = Direct::start(&launcher, &root);
    let params: Vec<Value> = (0..args.calls)
        .map(|_| json!({ "name": "read_text_file", "arguments": { "path": path } }))
        .collect();
    let first = direct.burst("tools/call", &params);
    let direct_times: Vec<Duration> = (0..args.bursts)
        .map(|_| direct.burst("tools/call", &params))
        .collect();
    drop(direct);
    let direct_median = median(direct_times);
    println!(
        "direct, one stdio session (1 process):  first {}, median {}",
        ms(first),
        ms(direct_median)
    );

    // Through the gateway, synchronous.
    let gw = Gateway::start(dir.path(), &launcher, &root, args.processes, args.memory);
    wait_listed(&gw.url).await;
    let http = reqwest::Client::new();
    let report = Report {
        gw: &gw,
        bursts: args.bursts,
        direct: direct_median,
    };
    report
        .path("synchronous", || {
            sync_burst(&http, &gw.url, &path, args.calls)
        })
        .await;

    // Through the gateway, as tasks (the same gateway, its processes started).
    let kind = if args.memory { "in-memory" } else { "durable" };
    let mut clients = Vec::new();
    for _ in 0..args.calls {
        clients.push(client(&gw.url).await);
    }
    report
        .path(&format!("as {kind} tasks"), || task_burst(&clients, &path))
        .await;
    // The same, followed with subscriptions/listen instead of polls.
    report
        .path(&format!("as {kind} tasks, listened"), || {
            listened_task_burst(&clients, &path)
        })
        .await;
}

/// How one path through the gateway is measured and printed.
struct Report<'a> {
    gw: &'a Gateway,
    bursts: usize,
    direct: Duration,
}

impl Report<'_> {
    /// The first burst (printed apart), a pause, the warm-up, then the measured bursts.
    async fn path<F: Future<Output = Duration>>(&self, name: &str, burst: impl Fn() -> F) {
        let first = burst().await;
        settle().await;
        for _ in 0..WARM_UP {
            burst().await;
        }
        let mut times = Vec::new();
        for _ in 0..self.bursts {
            times.push(burst().await);
        }
        let median = median(times);
        println!(
            "gateway, {name} ({} processes): first {}, median {} ({:.2}× direct)",
            self.gw.processes(),
            ms(first),
            ms(median),
            median.as_secs_f64() / self.direct.as_secs_f64()
        );
    }
}
