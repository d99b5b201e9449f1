//! Memory under abuse: one authenticated principal hammers `mcp-tasks serve` (default quotas)
//! with task creations and `subscriptions/listen` streams until every request is refused, and
//! the server's resident memory is read from `/proc` along the way.
//!
//! Run with `cargo bench --bench abuse` (release binary, Linux). Options (after `--`):
//!
//! - `--pad BYTES`: size of a padding argument in every creation (default: both 0 and
//!   1,000,000, one fresh server each);
//! - `--clients N`: concurrent connections creating tasks (default 8);
//! - `--legacy`: only the legacy-era scenario (see [`run_legacy`]).
//! - `--disk-only`: only the disk-quota scenario.
//!
//! The disk-quota scenario ([`disk_quota`]): tasks that finish at once, with 1,000,000-byte
//! arguments, created at the allowed rate until `storedBytes` refuses them; it prints the
//! tasks stored, the quota that refused them, the store file's length and the disk it takes
//! (its allocated blocks: redb grows its file with `ftruncate`, so the part not yet written
//! takes none), each with its ratio to the 256 MiB quota, the growth of both and the bytes
//! the server wrote to storage (`/proc/PID/io`) per finished task over tasks 11 to 30, and
//! the server's peak resident set (`VmHWM`). The
//! legacy scenario prints the store file too.
//!
//! Nothing here asserts a figure; `docs/BENCHMARKS.md` records them.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const TOKEN: &str = "mallory-bench-token";
/// Another principal's token, whose latency the legacy scenario measures.
const VICTIM: &str = "carol-bench-token";

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The bytes process `pid` has caused to be written to storage (`write_bytes` of
/// `/proc/PID/io`): the store's commits, page for page.
fn written_bytes(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities":
            { "extensions": { "io.modelcontextprotocol/tasks": {} } },
    })
}

struct Server {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// The size of the store file, bytes.
    fn store_bytes(&self) -> u64 {
        std::fs::metadata(self._dir.path().join("abuse.redb"))
            .map(|m| m.len())
            .unwrap_or(0)
    }

    /// The disk the store file takes, bytes: its allocated blocks (`st_blocks`), which a
    /// file grown by `ftruncate` and not yet written does not have (redb grows its file so).
    fn store_disk_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(self._dir.path().join("abuse.redb"))
            .map(|m| m.blocks() * 512)
            .unwrap_or(0)
    }
}

fn start() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let digest: String = Sha256::digest(TOKEN.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let victim: String = Sha256::digest(VICTIM.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[tokens]]\nsha256 = \"{digest}\"\ntenant = \"bench\"\nprincipal = \"mallory\"\n\
                 [[tokens]]\nsha256 = \"{victim}\"\ntenant = \"bench\"\nprincipal = \"carol\"\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-tasks"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--fixtures",
            "bench",
            "--store",
        ])
        .arg(dir.path().join("abuse.redb"))
        .arg("--auth-tokens")
        .arg(&tokens)
        .env("RUST_LOG", "warn,mcp_tasks=info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("the release binary");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("serve logs its address").unwrap();
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.trim_end_matches("/mcp").trim().parse().unwrap();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Server {
        child,
        addr,
        _dir: dir,
    }
}

async fn post(client: &reqwest::Client, addr: SocketAddr, body: &Value) -> reqwest::Response {
    let method = body["method"].as_str().unwrap();
    let mut request = client
        .post(format!("http://{addr}/mcp"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", method)
        .bearer_auth(TOKEN)
        .body(serde_json::to_vec(body).unwrap());
    if let Some(name) = body["params"]["name"].as_str() {
        request = request.header("Mcp-Name", name);
    }
    request.send().await.expect("a response")
}

struct Outcome {
    created: usize,
    refused_rate: usize,
    refused_final: String,
    create_secs: f64,
    listens: usize,
    listen_ids: usize,
    refused_listen: String,
    rss_start: u64,
    rss_created: u64,
    rss_listening: u64,
    hwm: u64,
}

async fn run(pad: usize, clients: usize) -> Outcome {
    let server = start();
    let pid = server.child.id();
    let addr = server.addr;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_start = rss_kib(pid, "VmRSS:");
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .build()
        .unwrap();

    // Creations until a quota other than the rate refuses them all.
    let created = Arc::new(AtomicUsize::new(0));
    let refused_rate = Arc::new(AtomicUsize::new(0));
    let ids = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..clients {
        let (client, created, refused_rate, ids) = (
            client.clone(),
            created.clone(),
            refused_rate.clone(),
            ids.clone(),
        );
        workers.push(tokio::spawn(async move {
            let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": "sleep_task", "arguments": { "ms": 3_600_000u64, "pad": "x".repeat(pad) },
                "_meta": meta() } });
            loop {
                let response = post(&client, addr, &body).await;
                let status = response.status().as_u16();
                let retry: u64 = response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(1);
                let reply: Value =
                    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
                match status {
                    200 => {
                        created.fetch_add(1, Ordering::Relaxed);
                        let id = reply["result"]["taskId"].as_str().unwrap().to_owned();
                        ids.lock().unwrap().push(id);
                    }
                    429 if reply["error"]["data"]["quota"] == "createRate" => {
                        refused_rate.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(retry.min(1) * 50)).await;
                    }
                    429 => return reply["error"]["data"]["quota"].as_str().unwrap().to_owned(),
                    other => panic!("unexpected status {other}: {reply}"),
                }
            }
        }));
    }
    let mut refused_final = String::new();
    for w in workers {
        refused_final = w.await.unwrap();
    }
    let create_secs = started.elapsed().as_secs_f64();
    let rss_created = rss_kib(pid, "VmRSS:");

    // Listens, each naming up to 1,024 of the tasks, until refused; kept open, never read.
    let ids = ids.lock().unwrap().clone();
    let mut open = Vec::new();
    let mut listen_ids = 0;
    let refused_listen = loop {
        let chunk: Vec<&String> = ids
            .iter()
            .skip(listen_ids % ids.len().max(1))
            .take(1024)
            .collect();
        let body = json!({ "jsonrpc": "2.0", "id": open.len() + 1, "method": "subscriptions/listen",
            "params": { "notifications": { "taskIds": chunk }, "_meta": meta() } });
        let response = post(&client, addr, &body).await;
        if response.status().as_u16() == 429 {
            let reply: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
            break reply["error"]["data"]["quota"].as_str().unwrap().to_owned();
        }
        assert_eq!(response.status().as_u16(), 200);
        listen_ids += chunk.len();
        open.push(response);
        if open.len() > 10_000 {
            break "none".to_owned();
        }
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_listening = rss_kib(pid, "VmRSS:");
    let hwm = rss_kib(pid, "VmHWM:");
    let listens = open.len();
    drop(open);
    Outcome {
        created: created.load(Ordering::Relaxed),
        refused_rate: refused_rate.load(Ordering::Relaxed),
        refused_final,
        create_secs,
        listens,
        listen_ids,
        refused_listen,
        rss_start,
        rss_created,
        rss_listening,
        hwm,
    }
}

// ---------------------------------------------------------------------------------------------
// Legacy era (2025-11-25 sessions)

const LEGACY: &str = "2025-11-25";

async fn legacy_post(
    client: &reqwest::Client,
    addr: SocketAddr,
    session: Option<&str>,
    body: &Value,
) -> reqwest::Response {
    let mut request = client
        .post(format!("http://{addr}/mcp"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .bearer_auth(TOKEN)
        .body(serde_json::to_vec(body).unwrap());
    if let Some(s) = session {
        request = request
            .header("Mcp-Session-Id", s)
            .header("MCP-Protocol-Version", LEGACY);
    }
    request.send().await.expect("a response")
}

/// A new legacy session's id, or the quota that refused it.
async fn legacy_session(client: &reqwest::Client, addr: SocketAddr) -> Result<String, String> {
    let init = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": { "protocolVersion": LEGACY, "capabilities": {} } });
    let response = legacy_post(client, addr, None, &init).await;
    if response.status().as_u16() == 429 {
        let reply: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        return Err(reply["error"]["data"]["quota"]
            .as_str()
            .unwrap_or("?")
            .to_owned());
    }
    assert_eq!(response.status().as_u16(), 200);
    Ok(response.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned())
}

/// CPU seconds the process used so far (user + system).
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Fields 14 and 15 of stat(5), counted after the command name.
    (ticks(11) + ticks(12)) / 100.0
}

struct LegacyOutcome {
    tasks: usize,
    abandoned: usize,
    sessions: usize,
    refused: String,
    gets: usize,
    cpu_idle: f64,
    victim_ms: f64,
    rss_start: u64,
    rss_after: u64,
    hwm: u64,
    store_bytes: u64,
}

/// The review's legacy reproduction at the default quotas: one principal makes `tasks` live
/// tasks, abandons `abandoned` `tasks/result` requests (each client gives up after 200 ms),
/// then opens up to `attempts` sessions, each with its standing GET stream held open and
/// never read, and calls `tasks/get` on every task in every session. Then, with the attacker
/// idle, the server's CPU use over 3 s and another principal's `tools/list` latency.
async fn run_legacy(tasks: usize, abandoned: usize, attempts: usize) -> LegacyOutcome {
    let server = start();
    let pid = server.child.id();
    let addr = server.addr;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_start = rss_kib(pid, "VmRSS:");
    let client = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..tasks {
        let body = json!({ "jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
            "name": "sleep_task", "arguments": { "ms": 3_600_000u64 }, "_meta": meta() } });
        let reply: Value =
            serde_json::from_slice(&post(&client, addr, &body).await.bytes().await.unwrap())
                .unwrap();
        ids.push(reply["result"]["taskId"].as_str().unwrap().to_owned());
    }

    // Abandoned tasks/result requests.
    let first = legacy_session(&client, addr).await.expect("a session");
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let waits = (0..abandoned).map(|i| {
        let (impatient, first, task) =
            (impatient.clone(), first.clone(), ids[i % ids.len()].clone());
        async move {
            let body = json!({ "jsonrpc": "2.0", "id": i, "method": "tasks/result",
                "params": { "taskId": task } });
            let request = impatient
                .post(format!("http://{addr}/mcp"))
                .header("Content-Type", "application/json")
                .header("Accept", "application/json, text/event-stream")
                .header("Mcp-Session-Id", &first)
                .header("MCP-Protocol-Version", LEGACY)
                .bearer_auth(TOKEN)
                .body(serde_json::to_vec(&body).unwrap());
            let _ = request.send().await;
        }
    });
    // At most 32 at once (the principal may have 64 requests in progress).
    let mut waits: Vec<_> = waits.map(Box::pin).collect();
    while !waits.is_empty() {
        let rest = waits.split_off(waits.len().min(32));
        futures::future::join_all(waits).await;
        waits = rest;
    }

    // Sessions with an open, unread stream, each following every task.
    let mut streams = Vec::new();
    let mut gets = 0;
    let mut refused = "none".to_owned();
    for _ in 0..attempts {
        let session = match legacy_session(&client, addr).await {
            Ok(s) => s,
            Err(quota) => {
                refused = quota;
                break;
            }
        };
        let get = client
            .get(format!("http://{addr}/mcp"))
            .header("Accept", "text/event-stream")
            .header("Mcp-Session-Id", &session)
            .header("MCP-Protocol-Version", LEGACY)
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("a response");
        if get.status().as_u16() == 429 {
            let reply: Value = serde_json::from_slice(&get.bytes().await.unwrap()).unwrap();
            refused = reply["error"]["data"]["quota"]
                .as_str()
                .unwrap_or("?")
                .to_owned();
            break;
        }
        streams.push(get);
        for task in &ids {
            let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tasks/get",
                "params": { "taskId": task } });
            let r = legacy_post(&client, addr, Some(&session), &body).await;
            if r.status().as_u16() == 200 {
                gets += 1;
            }
        }
    }
    let sessions = streams.len();

    // The attacker is idle: what does the server still do?
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = cpu_secs(pid);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cpu_idle = (cpu_secs(pid) - before) / 3.0;
    let victim = reqwest::Client::new();
    let mut times = Vec::new();
    for i in 0..50 {
        let body = json!({ "jsonrpc": "2.0", "id": i, "method": "tools/list", "params": { "_meta": meta() } });
        let started = Instant::now();
        let response = victim
            .post(format!("http://{addr}/mcp"))
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2026-07-28")
            .header("Mcp-Method", "tools/list")
            .bearer_auth(VICTIM)
            .body(serde_json::to_vec(&body).unwrap())
            .send()
            .await
            .expect("a response");
        assert_eq!(response.status().as_u16(), 200);
        let _ = response.bytes().await;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    let rss_after = rss_kib(pid, "VmRSS:");
    let hwm = rss_kib(pid, "VmHWM:");
    let store_bytes = server.store_bytes();
    drop(streams);
    LegacyOutcome {
        tasks,
        abandoned,
        sessions,
        refused,
        gets,
        cpu_idle,
        victim_ms: times[times.len() / 2],
        rss_start,
        rss_after,
        hwm,
        store_bytes,
    }
}

fn print_legacy(rt: &tokio::runtime::Runtime) {
    println!();
    println!(
        "| live tasks | abandoned tasks/result | sessions held (tasks/get) | refused by | server CPU, attacker idle | victim tools/list median | RSS start | after | peak (VmHWM) | store file |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let o = rt.block_on(run_legacy(20, 200, 640));
    println!(
        "| {} | {} | {} ({}) | {} | {:.1} % | {:.2} ms | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.1} MiB |",
        o.tasks,
        o.abandoned,
        o.sessions,
        o.gets,
        o.refused,
        o.cpu_idle * 100.0,
        o.victim_ms,
        o.rss_start as f64 / 1024.0,
        o.rss_after as f64 / 1024.0,
        o.hwm as f64 / 1024.0,
        o.store_bytes as f64 / (1024.0 * 1024.0),
    );
}

fn arg(name: &str) -> Option<usize> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("a number"))
}

/// What one principal can store at the default quotas.
struct DiskOutcome {
    created: usize,
    refused_by: String,
    seconds: f64,
    file_bytes: u64,
    /// The disk the store file takes at the end (its allocated blocks).
    disk_bytes: u64,
    /// The server's peak resident set (`VmHWM`), KiB.
    hwm: u64,
    /// The store file's growth per finished task over tasks 11 to 30 (after a warm-up of 10).
    growth_per_task: u64,
    /// The growth of the disk it takes per finished task over the same tasks.
    disk_growth_per_task: u64,
    /// The bytes the server wrote to storage per finished task over the same tasks.
    written_per_task: u64,
}

/// The disk-quota scenario: one client creates finished tasks (`sleep_task` of 0 ms) with
/// `pad` bytes of arguments, waiting out `createRate` refusals, until another quota refuses.
async fn disk_quota(pad: usize) -> DiskOutcome {
    let server = start();
    let addr = server.addr;
    let client = reqwest::Client::new();
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "sleep_task", "arguments": { "ms": 0, "pad": "x".repeat(pad) },
        "_meta": meta() } });
    let started = Instant::now();
    let mut created = 0;
    let (mut after_warm_up, mut after_twenty) = (0, 0);
    let (mut disk_warm_up, mut disk_twenty) = (0, 0);
    let (mut written_warm_up, mut written_twenty) = (0, 0);
    let refused_by = loop {
        let response = post(&client, addr, &body).await;
        let status = response.status().as_u16();
        let reply: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        match status {
            200 => {
                created += 1;
                // A `sleep_task` of 0 ms finishes at once; its completion is committed
                // before its `tasks/get` reads `completed`, so wait for that.
                if created == 10 || created == 30 {
                    let id = reply["result"]["taskId"].as_str().unwrap().to_owned();
                    wait_finished(&client, addr, &id).await;
                    if created == 10 {
                        after_warm_up = server.store_bytes();
                        disk_warm_up = server.store_disk_bytes();
                        written_warm_up = written_bytes(server.child.id());
                    } else {
                        after_twenty = server.store_bytes();
                        disk_twenty = server.store_disk_bytes();
                        written_twenty = written_bytes(server.child.id());
                    }
                }
            }
            429 if reply["error"]["data"]["quota"] == "createRate" => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            429 => break reply["error"]["data"]["quota"].as_str().unwrap().to_owned(),
            other => panic!("unexpected status {other}: {reply}"),
        }
        if created > 100_000 {
            break "none".to_owned();
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let file_bytes = server.store_bytes();
    let disk_bytes = server.store_disk_bytes();
    let hwm = rss_kib(server.child.id(), "VmHWM:");
    DiskOutcome {
        created,
        refused_by,
        seconds,
        file_bytes,
        disk_bytes,
        hwm,
        growth_per_task: after_twenty.saturating_sub(after_warm_up) / 20,
        disk_growth_per_task: disk_twenty.saturating_sub(disk_warm_up) / 20,
        written_per_task: written_twenty.saturating_sub(written_warm_up) / 20,
    }
}

/// Polls `tasks/get` of `id` until the task is finished.
async fn wait_finished(client: &reqwest::Client, addr: SocketAddr, id: &str) {
    let body = json!({ "jsonrpc": "2.0", "id": 2, "method": "tasks/get",
        "params": { "taskId": id, "_meta": meta() } });
    for _ in 0..1000 {
        let response = post(client, addr, &body).await;
        let reply: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        if matches!(
            reply["result"]["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        ) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("task {id} never finished");
}

/// Prints the disk-quota scenario's table.
fn disk_quota_section(rt: &tokio::runtime::Runtime) {
    println!();
    println!(
        "| pad (bytes) | finished tasks stored | refused by | seconds | store file | file ÷ quota | disk it takes (÷ quota) | file growth per task (11–30) | disk growth per task (11–30) | written per task (11–30) | peak (VmHWM) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let pad = 1_000_000;
    let o = rt.block_on(disk_quota(pad));
    const MIB: f64 = 1024.0 * 1024.0;
    println!(
        "| {pad} | {} | {} | {:.1} | {:.1} MiB | {:.2} (256 MiB) | {:.1} MiB ({:.2}) | {:.2} MiB | {:.2} MiB | {:.2} MiB | {:.1} MiB |",
        o.created,
        o.refused_by,
        o.seconds,
        o.file_bytes as f64 / MIB,
        o.file_bytes as f64 / (256.0 * MIB),
        o.disk_bytes as f64 / MIB,
        o.disk_bytes as f64 / (256.0 * MIB),
        o.growth_per_task as f64 / MIB,
        o.disk_growth_per_task as f64 / MIB,
        o.written_per_task as f64 / MIB,
        o.hwm as f64 / 1024.0,
    );
}

fn main() {
    if std::env::args().any(|a| a == "--disk-only") {
        let rt = tokio::runtime::Runtime::new().unwrap();
        disk_quota_section(&rt);
        return;
    }
    let clients = arg("--clients").unwrap_or(8);
    let pads = match arg("--pad") {
        Some(p) => vec![p],
        None => vec![0, 1_000_000],
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    if std::env::args().any(|a| a == "--legacy") {
        print_legacy(&rt);
        return;
    }
    println!(
        "| pad (bytes) | tasks created | refused by | rate refusals | seconds | listens open (ids) | listen refused by | RSS start | after creates | with listens | peak (VmHWM) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for pad in pads {
        let o = rt.block_on(run(pad, clients));
        println!(
            "| {pad} | {} | {} | {} | {:.1} | {} ({}) | {} | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.1} MiB |",
            o.created,
            o.refused_final,
            o.refused_rate,
            o.create_secs,
            o.listens,
            o.listen_ids,
            o.refused_listen,
            o.rss_start as f64 / 1024.0,
            o.rss_created as f64 / 1024.0,
            o.rss_listening as f64 / 1024.0,
            o.hwm as f64 / 1024.0,
        );
    }
    print_legacy(&rt);
    disk_quota_section(&rt);
}
