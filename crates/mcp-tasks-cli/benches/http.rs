//! The load benchmark of the performance table in `docs/BENCHMARKS.md`: task lifecycles,
//! creations and `tasks/get` over real HTTP, driven by this crate's own client
//! (`mcp_tasks::client`), plus the same runtime in process on redb and on the in-memory store
//! (what durability costs).
//!
//! ```sh
//! cargo bench --bench http                                  # mcp-tasks only
//! cargo bench --bench http -- --peer http://127.0.0.1:18961/mcp   # and a peer, interleaved
//! cargo bench --bench http -- --only inprocess              # the in-process part only
//! ```
//!
//! Options (after `--`): `--peer URL` (another MCP `2026-07-28` server with a `sleep_task
//! {ms}` tool, measured in the same run, workload by workload), or `--peer-cmd 'CMD {port}'`
//! (the peer started by the bench, a fresh process for every repetition, on a free port put
//! in place of `{port}`; its endpoint `http://127.0.0.1:{port}/mcp`), `--reps N` (default 3,
//! the median is printed; the servers take turns going first from one repetition to the
//! next), `--tasks1 N` / `--tasks16 N` (lifecycles per measurement at 1 and 16
//! clients, default 500 / 3000), `--secs S` (length of the create and get runs, default 8),
//! `--only http|inprocess`.
//!
//! The servers are `mcp-tasks serve --fixtures bench --no-quotas` started as child processes,
//! one on a fresh redb file under `target/` with the default durability (every commit
//! fsync'd), one with `--store memory` (nothing written: the runtime alone, like for like
//! with a peer that keeps its tasks in memory). Each
//! client is a task of one single-threaded tokio runtime on its own OS thread (like the
//! external load generator's default), with its own `Client` (one keep-alive connection) and
//! no retries. A lifecycle is `tools/call` of `sleep_task {"ms":0}`, then `tasks/get` at once
//! again until the task is terminal. Nothing here asserts speed.

mod common;
mod conditions;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{client, create_sleep, free_port, on_client_thread, wait_ready};
use mcp_tasks::store::Store;
use mcp_tasks::{Owner, Runtime};
use serde_json::{Value, json};

const USAGE: &str = "usage: cargo bench --bench http -- [--peer URL | --peer-cmd 'CMD {port}'] [--reps N] [--tasks1 N] \
                     [--tasks16 N] [--secs S] [--only http|inprocess]";

struct Args {
    peer: Option<String>,
    peer_cmd: Option<String>,
    reps: usize,
    tasks1: usize,
    tasks16: usize,
    secs: f64,
    http: bool,
    inprocess: bool,
}

fn parse_args() -> Args {
    let mut args = Args {
        peer: None,
        peer_cmd: None,
        reps: 3,
        tasks1: 500,
        tasks16: 3000,
        secs: 8.0,
        http: true,
        inprocess: true,
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
            "--peer" => args.peer = Some(it.next().unwrap_or_else(|| fail("--peer URL".into()))),
            "--peer-cmd" => match it.next() {
                Some(cmd) if cmd.contains("{port}") => args.peer_cmd = Some(cmd),
                _ => fail("--peer-cmd 'CMD {port}' (the command must take the port)".into()),
            },
            "--reps" => args.reps = num("--reps", it.next()),
            "--tasks1" => args.tasks1 = num("--tasks1", it.next()),
            "--tasks16" => args.tasks16 = num("--tasks16", it.next()),
            "--secs" => args.secs = num("--secs", it.next()) as f64,
            "--only" => match it.next().as_deref() {
                Some("http") => args.inprocess = false,
                Some("inprocess") => args.http = false,
                _ => fail("--only http|inprocess".into()),
            },
            other => fail(format!("unknown argument {other:?}")),
        }
    }
    if args.peer.is_some() && args.peer_cmd.is_some() {
        fail("--peer and --peer-cmd exclude each other".into());
    }
    args
}

/// One measurement: a rate and, when it has latencies, their p50 and p99 in ms.
#[derive(Clone, Copy, Default)]
struct Measure {
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summarize(rate: f64, mut latencies: Vec<f64>) -> Measure {
    latencies.sort_by(f64::total_cmp);
    Measure {
        rate,
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
    }
}

fn median(mut runs: Vec<Measure>) -> Measure {
    runs.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    runs[runs.len() / 2]
}

/// `concurrency` clients share `tasks` lifecycles; rate = lifecycles/s, latency = time to
/// terminal.
fn lifecycles(url: &str, concurrency: usize, tasks: usize) -> Measure {
    let url = url.to_owned();
    on_client_thread(move || {
        Box::pin(async move {
            let mut clients = Vec::new();
            for _ in 0..concurrency {
                clients.push(client(&url, Duration::from_secs(30)).await);
            }
            let started = Instant::now();
            let workers = clients.into_iter().enumerate().map(|(c, client)| {
                let share = tasks / concurrency + usize::from(c < tasks % concurrency);
                async move {
                    let mut latencies = Vec::with_capacity(share);
                    for _ in 0..share {
                        let t = Instant::now();
                        let handle = create_sleep(&client, 0).await;
                        loop {
                            let task = handle.get().await.expect("tasks/get");
                            if task.is_terminal() {
                                assert_eq!(task.status.as_str(), "completed", "{task:?}");
                                break;
                            }
                        }
                        latencies.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                    latencies
                }
            });
            let latencies: Vec<f64> = futures::future::join_all(workers)
                .await
                .into_iter()
                .flatten()
                .collect();
            summarize(tasks as f64 / started.elapsed().as_secs_f64(), latencies)
        })
    })
}

/// `concurrency` clients create tasks for `secs`; rate = creations/s, latency = `tools/call`.
fn creates(url: &str, concurrency: usize, secs: f64) -> Measure {
    let url = url.to_owned();
    on_client_thread(move || {
        Box::pin(async move {
            let mut clients = Vec::new();
            for _ in 0..concurrency {
                clients.push(client(&url, Duration::from_secs(30)).await);
            }
            let deadline = Instant::now() + Duration::from_secs_f64(secs);
            let started = Instant::now();
            let workers = clients.into_iter().map(|client| async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    create_sleep(&client, 0).await;
                    latencies.push(t.elapsed().as_secs_f64() * 1e3);
                }
                latencies
            });
            let latencies: Vec<f64> = futures::future::join_all(workers)
                .await
                .into_iter()
                .flatten()
                .collect();
            summarize(
                latencies.len() as f64 / started.elapsed().as_secs_f64(),
                latencies,
            )
        })
    })
}

/// One completed task read by `concurrency` clients for `secs` (after 1 s of warm-up); rate =
/// requests/s.
fn gets(url: &str, concurrency: usize, secs: f64) -> Measure {
    let url = url.to_owned();
    on_client_thread(move || {
        Box::pin(async move {
            let first = client(&url, Duration::from_secs(30)).await;
            let handle = create_sleep(&first, 0).await;
            while !handle.get().await.expect("tasks/get").is_terminal() {}
            let id = handle.id().to_owned();
            let mut clients = Vec::new();
            for _ in 0..concurrency {
                clients.push(client(&url, Duration::from_secs(30)).await);
            }
            let warm = Instant::now() + Duration::from_secs(1);
            let deadline = warm + Duration::from_secs_f64(secs);
            let workers = clients.into_iter().map(|client| {
                let id = id.clone();
                async move {
                    let handle = client.resume(&id).await.expect("resume");
                    let mut latencies = Vec::new();
                    loop {
                        let t = Instant::now();
                        let task = handle.get().await.expect("tasks/get");
                        assert!(task.is_terminal());
                        let now = Instant::now();
                        if now >= deadline {
                            break;
                        }
                        if now >= warm {
                            latencies.push((now - t).as_secs_f64() * 1e3);
                        }
                    }
                    latencies
                }
            });
            let latencies: Vec<f64> = futures::future::join_all(workers)
                .await
                .into_iter()
                .flatten()
                .collect();
            summarize(latencies.len() as f64 / secs, latencies)
        })
    })
}

/// `mcp-tasks serve --fixtures bench --no-quotas` on a free port; killed on drop.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    /// On `store`: a redb file, or `memory` (`serve --store memory`).
    fn start(store: &Path) -> Server {
        let port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_mcp-tasks"))
            .args(["serve", "--fixtures", "bench", "--no-quotas", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--store")
            .arg(store)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("starting mcp-tasks serve");
        Server::ready(child, port)
    }
}

impl Server {
    /// `child`, once its MCP endpoint on `port` answers.
    fn ready(child: Child, port: u16) -> Server {
        let url = format!("http://127.0.0.1:{port}/mcp");
        let server = Server { child, url };
        wait_ready(
            &server.url,
            Duration::from_secs(60),
            Duration::from_millis(20),
        );
        server
    }

    /// The peer of `--peer-cmd`, started on a free port (`{port}` in the command).
    fn peer(cmd: &str) -> Server {
        let port = free_port();
        let line = cmd.replace("{port}", &port.to_string());
        let child = Command::new("sh")
            .args(["-c", &format!("exec {line}")])
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting the peer `{line}`: {e}"));
        Server::ready(child, port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Clone, Copy)]
enum Workload {
    Lifecycle1,
    Lifecycle16,
    Create16,
    Get16,
}

impl Workload {
    const ALL: [Workload; 4] = [
        Workload::Lifecycle16,
        Workload::Lifecycle1,
        Workload::Create16,
        Workload::Get16,
    ];

    fn name(self) -> &'static str {
        match self {
            Workload::Lifecycle1 => "full lifecycle, 1 client (lifecycles/s)",
            Workload::Lifecycle16 => "full lifecycle, 16 clients (lifecycles/s)",
            Workload::Create16 => "creates only, 16 clients (creations/s)",
            Workload::Get16 => "`tasks/get` on one task, 16 clients (requests/s)",
        }
    }

    fn run(self, url: &str, args: &Args) -> Measure {
        match self {
            Workload::Lifecycle1 => lifecycles(url, 1, args.tasks1),
            Workload::Lifecycle16 => lifecycles(url, 16, args.tasks16),
            Workload::Create16 => creates(url, 16, args.secs),
            Workload::Get16 => gets(url, 16, args.secs),
        }
    }
}

fn fmt(m: &Measure) -> String {
    if m.p50_ms > 0.0 {
        format!(
            "{:.0} (p50 {:.2} ms, p99 {:.2} ms)",
            m.rate, m.p50_ms, m.p99_ms
        )
    } else {
        format!("{:.0}", m.rate)
    }
}

fn http_part(args: &Args, dir: &Path, fdatasync_p50: Option<Duration>) {
    println!("## over HTTP (this crate's client, single-threaded, one connection per client)\n");
    let n = Workload::ALL.len();
    let mut durable: Vec<Vec<Measure>> = vec![Vec::new(); n];
    let mut memory: Vec<Vec<Measure>> = vec![Vec::new(); n];
    let mut peer: Vec<Vec<Measure>> = vec![Vec::new(); n];
    for rep in 0..args.reps {
        // Fresh stores (and a fresh peer with `--peer-cmd`) per repetition; the servers run
        // the whole repetition. Each workload runs on every server, one after the other, and
        // the server that goes first changes from one repetition to the next.
        let on_disk = Server::start(&dir.join(format!("http-{rep}.redb")));
        let in_memory = Server::start(Path::new("memory"));
        let started_peer = args.peer_cmd.as_deref().map(Server::peer);
        let peer_url = started_peer
            .as_ref()
            .map(|p| p.url.clone())
            .or_else(|| args.peer.clone());
        for (i, w) in Workload::ALL.iter().enumerate() {
            for turn in 0..3 {
                match (rep + turn) % 3 {
                    0 => {
                        let m = w.run(&on_disk.url, args);
                        println!("rep {rep} mcp-tasks durable {}: {}", w.name(), fmt(&m));
                        durable[i].push(m);
                    }
                    1 => {
                        let m = w.run(&in_memory.url, args);
                        println!("rep {rep} mcp-tasks memory  {}: {}", w.name(), fmt(&m));
                        memory[i].push(m);
                    }
                    _ => {
                        if let Some(url) = &peer_url {
                            let m = w.run(url, args);
                            println!("rep {rep} peer              {}: {}", w.name(), fmt(&m));
                            peer[i].push(m);
                        }
                    }
                }
            }
        }
    }
    println!(
        "\n| workload | mcp-tasks (durable) | mcp-tasks (`--store memory`) | peer | durable / peer | memory / peer |\n|---|---|---|---|---|---|"
    );
    for (i, w) in Workload::ALL.iter().enumerate() {
        let a = median(durable[i].clone());
        let b = median(memory[i].clone());
        match peer[i].is_empty() {
            true => println!("| {} | {} | {} | – | – | – |", w.name(), fmt(&a), fmt(&b)),
            false => {
                let c = median(peer[i].clone());
                println!(
                    "| {} | {} | {} | {} | {:.2} | {:.2} |",
                    w.name(),
                    fmt(&a),
                    fmt(&b),
                    fmt(&c),
                    a.rate / c.rate,
                    b.rate / c.rate
                );
            }
        }
    }
    println!();
    // The physical bound of a durable lifecycle at one client (`sleep_task {"ms":0}`: the
    // tool's tick is 0): one `fdatasync` of the pages a completion writes, measured above;
    // beside it the same runtime's lifecycle in memory plus the two commits' syncs (creation
    // and completion), which counts what the requests themselves cost.
    let one = Workload::ALL
        .iter()
        .position(|w| matches!(w, Workload::Lifecycle1))
        .expect("the one-client lifecycle is a workload");
    if let (Some(sync), false) = (fdatasync_p50, durable[one].is_empty()) {
        let p50 = median_p50(&durable[one]);
        let sync = sync.as_secs_f64() * 1000.0;
        println!(
            "durable lifecycle at 1 client: p50 {p50:.3} ms; bound (tool tick 0 ms + one fdatasync p50) {sync:.3} ms: p50 / bound = {:.2}",
            p50 / sync
        );
        if !memory[one].is_empty() {
            let floor = median_p50(&memory[one]) + 2.0 * sync;
            println!(
                "  against the in-memory lifecycle p50 + two fdatasyncs ({floor:.3} ms): {:.2}\n",
                p50 / floor
            );
        }
    }
}

/// The median of the measurements' p50 latencies.
fn median_p50(measures: &[Measure]) -> f64 {
    let mut p50s: Vec<f64> = measures.iter().map(|m| m.p50_ms).collect();
    p50s.sort_by(f64::total_cmp);
    p50s[p50s.len() / 2]
}

/// In process: lifecycles through `RuntimeHandle::handle_json` (no HTTP), `concurrency`
/// clients on their own single-threaded runtime and OS thread (as over HTTP, so that polling
/// clients do not occupy the runtime's workers); (lifecycles/s, store commits per lifecycle).
fn in_process(
    rt: &tokio::runtime::Runtime,
    store: Store,
    concurrency: usize,
    tasks: usize,
) -> (f64, f64) {
    let runtime = rt.block_on(async {
        mcp_tasks_testkit::fixtures::bench::install(Runtime::builder_with_store(store))
            .quotas(mcp_tasks::quota::Quotas::unlimited())
            .start()
            .await
            .expect("runtime start")
    });
    let handle = runtime.handle();
    let commits_before = mcp_tasks::internals::runtime_store(&runtime)
        .stats()
        .commits;
    let started = Instant::now();
    on_client_thread(move || {
        Box::pin(async move {
            let owner = Owner::new("bench", "client");
            let meta = json!({
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {
                    "extensions": { "io.modelcontextprotocol/tasks": {} }
                }
            });
            let workers = (0..concurrency).map(|c| {
                let handle = handle.clone();
                let owner = owner.clone();
                let meta = meta.clone();
                let share = tasks / concurrency + usize::from(c < tasks % concurrency);
                async move {
                    for i in 0..share {
                        let created = handle
                            .handle_json(
                                json!({ "jsonrpc": "2.0", "id": i, "method": "tools/call",
                                    "params": { "name": "sleep_task", "arguments": {"ms": 0},
                                                "_meta": meta } }),
                                &owner,
                            )
                            .await
                            .expect("a response");
                        let task = created["result"]["taskId"]
                            .as_str()
                            .unwrap_or_else(|| panic!("not a task: {created}"))
                            .to_owned();
                        loop {
                            let got: Value = handle
                                .handle_json(
                                    json!({ "jsonrpc": "2.0", "id": i, "method": "tasks/get",
                                        "params": { "taskId": task, "_meta": meta } }),
                                    &owner,
                                )
                                .await
                                .expect("a response");
                            match got["result"]["status"].as_str() {
                                Some("completed") => break,
                                Some("working") => tokio::task::yield_now().await,
                                other => panic!("unexpected status {other:?}: {got}"),
                            }
                        }
                    }
                }
            });
            futures::future::join_all(workers).await;
        })
    });
    let rate = tasks as f64 / started.elapsed().as_secs_f64();
    let commits = mcp_tasks::internals::runtime_store(&runtime)
        .stats()
        .commits
        - commits_before;
    rt.block_on(runtime.shutdown());
    (rate, commits as f64 / tasks as f64)
}

fn inprocess_part(args: &Args, dir: &Path) {
    println!(
        "## in process (RuntimeHandle::handle_json, no HTTP): redb against the in-memory store\n"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut rows = Vec::new();
    for (concurrency, tasks) in [(1, args.tasks1), (16, args.tasks16)] {
        let mut redb = Vec::new();
        let mut memory = Vec::new();
        let mut commits = 0.0;
        for rep in 0..args.reps {
            let path = dir.join(format!("inproc-{concurrency}-{rep}.redb"));
            let store = Store::open(&path, Default::default()).expect("store");
            let (r, c) = in_process(&rt, store, concurrency, tasks);
            let (m, _) = in_process(&rt, Store::memory(), concurrency, tasks);
            println!(
                "rep {rep} C={concurrency}: redb {r:.0}/s ({c:.2} commits per lifecycle), memory {m:.0}/s"
            );
            redb.push(Measure {
                rate: r,
                ..Default::default()
            });
            memory.push(Measure {
                rate: m,
                ..Default::default()
            });
            commits = c;
        }
        rows.push((concurrency, median(redb).rate, median(memory).rate, commits));
    }
    println!(
        "\n| clients | redb (lifecycles/s) | memory (lifecycles/s) | redb / memory | commits per lifecycle (redb, last rep) |\n|---:|---:|---:|---:|---:|"
    );
    for (c, r, m, commits) in rows {
        println!("| {c} | {r:.0} | {m:.0} | {:.2} | {commits:.2} |", r / m);
    }
    println!();
}

fn main() {
    let args = parse_args();
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target");
    std::fs::create_dir_all(&target).expect("creating target/");
    let dir = tempfile::Builder::new()
        .prefix("bench-http-")
        .tempdir_in(&target)
        .expect("creating the temp dir under target/");
    let fdatasync_p50 = conditions::print(
        dir.path(),
        "the durable server: redb, every commit fsync'd before it is acknowledged (Durability::Immediate); `--store memory`: nothing written",
    );
    println!(
        "mcp-tasks load benchmark: {} reps, {} / {} lifecycles at 1 / 16 clients, {} s runs, peer: {}\n",
        args.reps,
        args.tasks1,
        args.tasks16,
        args.secs,
        args.peer
            .as_deref()
            .or(args.peer_cmd.as_deref())
            .unwrap_or("none")
    );
    if args.http {
        http_part(&args, dir.path(), fdatasync_p50);
    }
    if args.inprocess {
        inprocess_part(&args, dir.path());
    }
}
