//! The operator console at scale, and what an open console costs the MCP endpoint.
//!
//! ```sh
//! cargo bench --bench console                                   # 1M stored tasks on redb
//! cargo bench --bench console -- --stored 100000 --requests 20
//! cargo bench --bench console -- --store postgres://postgres@127.0.0.1:5432/postgres --finished-only
//! cargo bench --bench console -- --only load --rounds 3          # the MCP load part only
//! cargo bench --bench console -- --only streams --store postgres://postgres@127.0.0.1:5432/postgres
//! ```
//!
//! **Scale.** `--stored` finished and live tasks (4 tools, 100 owners, the five statuses —
//! 80 % completed, 10 % failed, 5 % cancelled, 3 % working, 2 % input_required — created over
//! the last day, each with a status message) are written straight into a store (a fresh redb
//! file under `target/`, or the PostgreSQL database of `--store`, in a schema of its own that
//! is dropped at the end, `VACUUM ANALYZE`d after the fill as autovacuum would have), with
//! their listing entries, as the runtime writes them. Then
//! `mcp-tasks serve --console-listen` opens it and each console request below is timed
//! `--requests` times (a first page, then the next pages through `next`): p50, p95, max.
//!
//! **Load.** `mcp-tasks serve --fixtures bench --no-quotas --console-listen` on a fresh redb
//! file; 16 clients run `--lifecycles` task lifecycles (`sleep_task {"ms":0}`, then
//! `tasks/get` until it is terminal), alternately with the console closed and with it open —
//! a live stream (`/api/events`) read to the end and, every 500 ms, `/api/overview` and a
//! page of `/api/tasks`, as an open overview page does — for `--rounds` rounds each.
//! Lifecycles/s of both and their ratio.
//!
//! **Streams** (`--only streams`, PostgreSQL: `--store` is required). `serve` on the
//! database with static tokens; carol (not admin) holds `--streams` live streams open
//! (default 400; `--console-max-streams` raised to allow them) while alice, another tenant, runs
//! create → `tasks/get` → cancel cycles (`sleep_task`) for `--seconds` (default 10) from 4
//! clients; the `tasks/get` latencies, p50 / p95 / max, with carol's streams closed and open,
//! alternately for `--rounds` rounds, and the median change of p95. Every stream of a node
//! is fed by its one follower of the cluster's commits: the streams' cost should not grow with
//! their number. Nothing here asserts speed.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{client, create_sleep, free_port, on_client_thread, wait_ready};
use mcp_tasks::internals::persist;
use mcp_tasks::internals::task::{Event, Owner, TaskError, TaskId, TaskOutcome, TaskRecord, apply};
use mcp_tasks::store::{Durability, Expect, Store, StoreOptions, WriteOp};
use serde_json::json;

const USAGE: &str = "usage: cargo bench --bench console -- [--stored N] [--requests N] \
                     [--store postgres://…] [--finished-only] [--lifecycles N] [--rounds N] [--only scale|load|streams] \
                     [--streams N] [--seconds N]";

struct Args {
    stored: usize,
    requests: usize,
    store: Option<String>,
    lifecycles: usize,
    rounds: usize,
    /// Fill finished tasks only (the 5 % live ones completed instead): a store whose live
    /// tasks all wait for a new node to claim them measures that node's start, not the console.
    finished_only: bool,
    scale: bool,
    load: bool,
    streams: bool,
    /// Carol's open streams (`--only streams`).
    stream_count: usize,
    /// Seconds of alice's load per measurement (`--only streams`).
    seconds: u64,
}

fn parse_args() -> Args {
    let mut args = Args {
        stored: 1_000_000,
        requests: 40,
        store: None,
        lifecycles: 3000,
        rounds: 3,
        finished_only: false,
        scale: true,
        load: true,
        streams: false,
        stream_count: 400,
        seconds: 10,
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
            "--stored" => args.stored = num("--stored", it.next()),
            "--requests" => args.requests = num("--requests", it.next()),
            "--lifecycles" => args.lifecycles = num("--lifecycles", it.next()),
            "--rounds" => args.rounds = num("--rounds", it.next()),
            "--streams" => args.stream_count = num("--streams", it.next()),
            "--seconds" => args.seconds = num("--seconds", it.next()) as u64,
            "--store" => args.store = it.next(),
            "--finished-only" => args.finished_only = true,
            "--only" => match it.next().as_deref() {
                Some("scale") => args.load = false,
                Some("load") => args.scale = false,
                Some("streams") => {
                    (args.scale, args.load, args.streams) = (false, false, true);
                }
                other => fail(format!("--only scale|load|streams, not {other:?}")),
            },
            "--bench" => {}
            other => fail(format!("unknown argument {other}")),
        }
    }
    args
}

/// A `serve` child process, killed when dropped.
struct Server {
    child: Child,
    mcp: String,
    console: String,
}

impl Server {
    fn start(store: &str, extra: &[&str]) -> Server {
        let server = Server::spawn(store, extra);
        wait_ready(
            &server.mcp,
            Duration::from_secs(600),
            Duration::from_millis(50),
        );
        server
    }

    /// A server with authentication: ready once `/readyz` answers 200 (`server/discover`
    /// would need a token).
    fn start_authenticated(store: &str, extra: &[&str]) -> Server {
        let server = Server::spawn(store, extra);
        let addr = server
            .mcp
            .trim_start_matches("http://")
            .trim_end_matches("/mcp")
            .to_owned();
        let ready = || -> std::io::Result<bool> {
            use std::io::{Read, Write};
            let mut stream = std::net::TcpStream::connect(&addr)?;
            write!(
                stream,
                "GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
            )?;
            let mut head = [0u8; 12];
            stream.read_exact(&mut head)?;
            Ok(&head[9..12] == b"200")
        };
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            if ready().unwrap_or(false) {
                return server;
            }
            assert!(Instant::now() < deadline, "the server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn spawn(store: &str, extra: &[&str]) -> Server {
        let (port, console_port) = (free_port(), free_port());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-tasks"));
        cmd.args([
            "serve",
            "--fixtures",
            "bench",
            "--no-quotas",
            "--store",
            store,
        ])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--console-listen", &format!("127.0.0.1:{console_port}")])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
        let child = cmd.spawn().expect("starting mcp-tasks serve");
        let mcp = format!("http://127.0.0.1:{port}/mcp");
        Server {
            child,
            mcp,
            console: format!("http://127.0.0.1:{console_port}"),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

const TOOLS: [&str; 4] = ["sleep_task", "echo", "report", "import"];

/// Writes `n` tasks into `store` as the runtime writes them; returns one id for the text
/// search.
fn fill(store: &Store, n: usize, finished_only: bool) -> String {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let now = now_ms();
    let day = 86_400_000u64;
    let mut batch = Vec::with_capacity(4096);
    let started = Instant::now();
    let mut some_id = String::new();
    for i in 0..n {
        let created_at = now - day + (i as u64 * day) / n as u64;
        let owner = Owner::new("acme", format!("user{}", i % 100));
        let tool = TOOLS[i % TOOLS.len()];
        let created = TaskRecord::new(
            TaskId::generate(),
            owner,
            tool.into(),
            json!({ "n": i }),
            json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } }),
            created_at,
            Some(2 * day),
            Some(1000),
            Some(format!("step {} of batch {}", i % 7, i / 1000)),
        );
        // Independent of the owner (i % 100) and the tool (i % 4).
        let roll = (i / 100 + i / 7) % 100;
        let roll = if finished_only && roll >= 95 { 0 } else { roll };
        let record = if roll < 80 {
            let result = json!({ "content": [{ "type": "text", "text": "ok" }] });
            apply(&created, Event::Finish(TaskOutcome::Result(result)), created_at + 5).expect("finish")
        } else if roll < 90 {
            let error = TaskError { code: -32603, message: "the disk is full".into(), data: None };
            apply(&created, Event::Finish(TaskOutcome::Error(error)), created_at + 5).expect("fail")
        } else if roll < 95 {
            apply(&created, Event::Cancelled { status_message: None }, created_at + 5).expect("cancel")
        } else if roll < 98 {
            Some(created.clone())
        } else {
            let request = json!({ "method": "elicitation/create", "params": { "mode": "form",
                "message": "Approve?", "requestedSchema": { "type": "object", "properties": {} } } });
            apply(
                &created,
                Event::RequestInputs {
                    requests: [("approve".to_owned(), request)].into_iter().collect(),
                    status_message: Some("Waiting for approval".into()),
                },
                created_at + 5,
            )
            .expect("input")
        }
        .expect("a change");
        if i == n / 2 {
            some_id = record.id.as_str().to_owned();
        }
        batch.push(WriteOp::Put {
            id: record.id.as_str().to_owned(),
            bytes: persist::encode(&record).expect("encode"),
            constant_tail: 0,
            live: !record.status.is_terminal(),
            due_ms: Some(created_at + 2 * day),
            seq: Some(record.seq),
            expect: Expect::Any,
            owner: Some(mcp_tasks::store::OwnerEntry {
                owner: mcp_tasks::store::owner_key(&record.owner.tenant, &record.owner.principal),
                created_ms: record.created_at_ms,
            }),
            listing: Some(mcp_tasks::internals::listing_of(&record)),
        });
        if batch.len() == 4096 || i + 1 == n {
            rt.block_on(store.commit(std::mem::take(&mut batch)))
                .expect("commit");
        }
        if (i + 1) % 200_000 == 0 {
            eprintln!(
                "  … {} written ({:.0} s)",
                i + 1,
                started.elapsed().as_secs_f64()
            );
        }
    }
    rt.block_on(store.close());
    eprintln!(
        "filled {n} tasks in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    some_id
}

/// p50, p95, max of `ms`.
fn percentiles(mut ms: Vec<f64>) -> (f64, f64, f64) {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
    (at(0.5), at(0.95), *ms.last().unwrap_or(&0.0))
}

/// Times `requests` GETs of `path` (a list walks on through `next`).
async fn time_requests(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    requests: usize,
) -> (f64, f64, f64, u64) {
    let mut ms = Vec::with_capacity(requests);
    let mut cursor: Option<String> = None;
    let mut rows = 0u64;
    for _ in 0..requests {
        let mut url = format!("{base}{path}");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let t = Instant::now();
        let response = http.get(&url).send().await.expect("the console answers");
        assert!(
            response.status().is_success(),
            "{url}: {}",
            response.status()
        );
        let body: serde_json::Value =
            serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        rows += body["tasks"].as_array().map_or(0, |a| a.len() as u64);
        cursor = body["next"].as_str().map(str::to_owned);
    }
    let (p50, p95, max) = percentiles(ms);
    (p50, p95, max, rows)
}

fn scale(args: &Args) {
    let (location, dir, schema) = match &args.store {
        Some(url) => {
            let schema = format!("console_bench_{}", std::process::id());
            let url = format!(
                "{url}{}options=-csearch_path%3D{schema}",
                if url.contains('?') { "&" } else { "?" }
            );
            (url, None, Some(schema))
        }
        None => {
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("console-bench-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("bench dir");
            (
                dir.join("tasks.redb").display().to_string(),
                Some(dir),
                None,
            )
        }
    };
    if let (Some(schema), Some(url)) = (&schema, &args.store) {
        let sql = format!("CREATE SCHEMA IF NOT EXISTS {schema}");
        let status = Command::new("psql")
            .args([url.as_str(), "-qc", &sql])
            .status();
        assert!(
            status.is_ok_and(|s| s.success()),
            "psql could not create the schema"
        );
    }
    let store = if location.starts_with("postgres") {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(Store::postgres(
            &location,
            mcp_tasks::store::PostgresOptions::default(),
        ))
        .expect("opening PostgreSQL")
    } else {
        Store::open(
            std::path::Path::new(&location),
            StoreOptions {
                durability: Durability::None,
                ..StoreOptions::default()
            },
        )
        .expect("opening the store to fill it")
    };
    eprintln!("filling {} tasks into {location} …", args.stored);
    let some_id = fill(&store, args.stored, args.finished_only);
    drop(store);
    if let (Some(schema), Some(url)) = (&schema, &args.store) {
        // A million rows written in minutes: what autovacuum would have done by the time an
        // operator looks (statistics for the planner, the counters' dead rows gone), done now
        // rather than halfway through the measurement.
        let started = Instant::now();
        let sql = format!(
            "VACUUM ANALYZE {schema}.mcp_tasks, {schema}.mcp_listing_counts, {schema}.mcp_throughput"
        );
        let status = Command::new("psql")
            .args([url.as_str(), "-qc", &sql])
            .status();
        assert!(status.is_ok_and(|s| s.success()), "psql could not vacuum");
        eprintln!("VACUUM ANALYZE in {:.1} s", started.elapsed().as_secs_f64());
    }
    let server = Server::start(&location, &[]);
    let from = now_ms() - 6 * 3_600_000;
    let to = now_ms() - 5 * 3_600_000;
    let fragment = &some_id[4..14];
    let queries: Vec<(&str, String)> = vec![
        ("overview", "/api/overview?".into()),
        ("every task", "/api/tasks?limit=50".into()),
        (
            "status=input_required (2 %)",
            "/api/tasks?status=input_required&limit=50".into(),
        ),
        (
            "status=completed (80 %)",
            "/api/tasks?status=completed&limit=50".into(),
        ),
        ("tool=echo (25 %)", "/api/tasks?tool=echo&limit=50".into()),
        (
            "owner=acme/user7 (1 %)",
            "/api/tasks?owner=acme/user7&limit=50".into(),
        ),
        (
            "created in one hour",
            format!("/api/tasks?from={from}&to={to}&limit=50"),
        ),
        (
            "owner + status=failed",
            "/api/tasks?owner=acme/user7&status=failed&limit=50".into(),
        ),
        ("q=disk (text, 10 %)", "/api/tasks?q=disk&limit=50".into()),
        (
            "q=<an id> (text, 1 task)",
            format!("/api/tasks?q={fragment}&limit=50"),
        ),
        (
            "count status=working",
            "/api/tasks/count?status=working".into(),
        ),
    ];
    let requests = args.requests;
    let base = server.console.clone();
    let rows = on_client_thread(move || {
        Box::pin(async move {
            let http = reqwest::Client::new();
            let mut rows = Vec::new();
            for (name, path) in queries {
                // One request first, untimed: the page cache warms as it would for a user.
                let _ = http.get(format!("{base}{path}")).send().await;
                let r = time_requests(&http, &base, &path, requests).await;
                rows.push((name, r));
            }
            rows
        })
    });
    println!(
        "\nconsole requests at {} stored tasks ({}; {} requests each, paging on through `next`)",
        args.stored,
        if args.store.is_some() {
            "PostgreSQL"
        } else {
            "redb"
        },
        requests
    );
    println!("| request | p50 ms | p95 ms | max ms | rows returned |");
    println!("|---|---:|---:|---:|---:|");
    for (name, (p50, p95, max, rows)) in rows {
        println!("| {name} | {p50:.1} | {p95:.1} | {max:.1} | {rows} |");
    }
    drop(server);
    if let Some(dir) = dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    if let (Some(schema), Some(url)) = (schema, &args.store) {
        let _ = Command::new("psql")
            .args([
                url.as_str(),
                "-qc",
                &format!("DROP SCHEMA {schema} CASCADE"),
            ])
            .status();
    }
}

/// `concurrency` clients run `tasks` lifecycles; lifecycles/s.
fn lifecycles(url: &str, concurrency: usize, tasks: usize) -> f64 {
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
                    for _ in 0..share {
                        let handle = create_sleep(&client, 0).await;
                        while !handle.get().await.expect("tasks/get").is_terminal() {}
                    }
                }
            });
            futures::future::join_all(workers).await;
            tasks as f64 / started.elapsed().as_secs_f64()
        })
    })
}

/// An open console page: the live stream read to the end, and the overview and a list page
/// every 500 ms, until `stop`. Returns the events and requests it saw.
fn open_console(
    base: String,
    stop: Arc<AtomicBool>,
    events: Arc<AtomicU64>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                use futures::StreamExt;
                let http = reqwest::Client::new();
                let stream = http
                    .get(format!("{base}/api/events"))
                    .send()
                    .await
                    .expect("events");
                let mut body = stream.bytes_stream();
                let counter = events.clone();
                let stop2 = stop.clone();
                let reader = tokio::spawn(async move {
                    while !stop2.load(Ordering::Relaxed) {
                        match tokio::time::timeout(Duration::from_millis(200), body.next()).await {
                            Ok(Some(Ok(chunk))) => {
                                // `event: task` and `event: resync` lines.
                                let n = chunk.windows(7).filter(|w| w == b"event: ").count();
                                counter.fetch_add(n as u64, Ordering::Relaxed);
                            }
                            Ok(_) => break,
                            Err(_) => {}
                        }
                    }
                });
                let mut requests = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for path in ["/api/overview", "/api/tasks?limit=50"] {
                        if let Ok(r) = http.get(format!("{base}{path}")).send().await {
                            let _ = r.bytes().await;
                        }
                        requests += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                let _ = reader.await;
                requests
            })
    })
}

fn load(args: &Args) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("console-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench dir");
    let server = Server::start(&dir.join("tasks.redb").display().to_string(), &[]);
    // Warm up.
    lifecycles(&server.mcp, 16, 300);
    let (mut closed, mut open) = (Vec::new(), Vec::new());
    let mut seen = (0u64, 0u64);
    for round in 0..args.rounds {
        for console_open in if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        } {
            if console_open {
                let stop = Arc::new(AtomicBool::new(false));
                let events = Arc::new(AtomicU64::new(0));
                let page = open_console(server.console.clone(), stop.clone(), events.clone());
                std::thread::sleep(Duration::from_millis(200));
                open.push(lifecycles(&server.mcp, 16, args.lifecycles));
                stop.store(true, Ordering::Relaxed);
                let requests = page.join().expect("console page");
                seen.0 += events.load(Ordering::Relaxed);
                seen.1 += requests;
            } else {
                closed.push(lifecycles(&server.mcp, 16, args.lifecycles));
            }
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (c, o) = (median(closed.clone()), median(open.clone()));
    println!(
        "\nMCP lifecycles at 16 clients with the console closed and open (redb, fsync per commit; {} rounds, median)",
        args.rounds
    );
    println!("| console | lifecycles/s (rounds) | median |");
    println!("|---|---|---:|");
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("| closed | {} | {c:.0} |", fmt(&closed));
    println!(
        "| open (live stream + overview and list every 500 ms) | {} | {o:.0} |",
        fmt(&open)
    );
    println!(
        "open/closed: {:.2}× ({} live events and {} page requests served meanwhile)",
        o / c,
        seen.0,
        seen.1
    );
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

/// `tasks/get` latencies (ms) of alice's create → get → cancel cycles for `seconds`.
fn tenant_gets(url: &str, seconds: u64) -> Vec<f64> {
    let url = url.to_owned();
    on_client_thread(move || {
        Box::pin(async move {
            let mut clients = Vec::new();
            for _ in 0..4 {
                let client = mcp_tasks::client::Client::http(&url)
                    .expect("client")
                    .retry(mcp_tasks::client::RetryPolicy::none())
                    .timeout(Duration::from_secs(30))
                    .bearer_token("alice-token")
                    .build()
                    .await
                    .expect("client build");
                clients.push(client);
            }
            let until = Instant::now() + Duration::from_secs(seconds);
            let workers = clients.into_iter().map(|client| async move {
                let mut gets = Vec::new();
                while Instant::now() < until {
                    let handle = create_sleep(&client, 600_000).await;
                    let started = Instant::now();
                    handle.get().await.expect("tasks/get");
                    gets.push(started.elapsed().as_secs_f64() * 1000.0);
                    handle.cancel().await.expect("tasks/cancel");
                }
                gets
            });
            futures::future::join_all(workers)
                .await
                .into_iter()
                .flatten()
                .collect()
        })
    })
}

/// Carol's `n` live streams, read until `stop`; how many opened.
fn carol_streams(
    base: String,
    n: usize,
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                use futures::StreamExt;
                let http = reqwest::Client::new();
                let mut readers = Vec::new();
                for _ in 0..n {
                    let response = http
                        .get(format!("{base}/api/events"))
                        .header("authorization", "Bearer carol-token")
                        .send()
                        .await
                        .expect("events");
                    assert_eq!(response.status(), 200, "a stream of carol's opens");
                    opened.fetch_add(1, Ordering::Relaxed);
                    let stop = stop.clone();
                    readers.push(tokio::spawn(async move {
                        let mut body = response.bytes_stream();
                        while !stop.load(Ordering::Relaxed) {
                            if let Ok(None | Some(Err(_))) =
                                tokio::time::timeout(Duration::from_millis(200), body.next()).await
                            {
                                break;
                            }
                        }
                    }));
                }
                futures::future::join_all(readers).await;
            })
    })
}

fn streams(args: &Args) {
    let Some(url) = args.store.clone() else {
        eprintln!("--only streams needs --store postgres://…\n{USAGE}");
        std::process::exit(2);
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("console-streams-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench dir");
    let tokens = dir.join("tokens.toml");
    let entry = |token: &str, tenant: &str, principal: &str| {
        use sha2::Digest;
        let hash: String = sha2::Sha256::digest(token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!(
            "[[tokens]]\nsha256 = \"{hash}\"\ntenant = \"{tenant}\"\nprincipal = \"{principal}\"\n\n"
        )
    };
    std::fs::write(
        &tokens,
        [
            entry("alice-token", "acme", "alice"),
            entry("carol-token", "globex", "carol"),
        ]
        .concat(),
    )
    .expect("the token file");
    let max = args.stream_count.to_string();
    let server = Server::start_authenticated(
        &url,
        &[
            "--auth-tokens",
            &tokens.display().to_string(),
            "--console-max-streams",
            &max,
        ],
    );
    // Warm up.
    tenant_gets(&server.mcp, 2);
    let (mut closed, mut open) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        for streams_open in if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        } {
            if streams_open {
                let stop = Arc::new(AtomicBool::new(false));
                let opened = Arc::new(AtomicU64::new(0));
                let carol = carol_streams(
                    server.console.clone(),
                    args.stream_count,
                    stop.clone(),
                    opened.clone(),
                );
                while opened.load(Ordering::Relaxed) < args.stream_count as u64 {
                    std::thread::sleep(Duration::from_millis(50));
                }
                open.push(percentiles(tenant_gets(&server.mcp, args.seconds)));
                stop.store(true, Ordering::Relaxed);
                carol.join().expect("carol's streams");
            } else {
                closed.push(percentiles(tenant_gets(&server.mcp, args.seconds)));
            }
        }
    }
    println!(
        "\nAnother tenant's tasks/get while carol (not admin) holds {} console streams (PostgreSQL, one replica; {} rounds of {} s)",
        args.stream_count, args.rounds, args.seconds
    );
    println!("| carol's streams | tasks/get p50 / p95 / max, ms, per round |");
    println!("|---|---|");
    let fmt = |v: &[(f64, f64, f64)]| {
        v.iter()
            .map(|(a, b, c)| format!("{a:.1} / {b:.1} / {c:.1}"))
            .collect::<Vec<_>>()
            .join("; ")
    };
    println!("| closed | {} |", fmt(&closed));
    println!("| {} open | {} |", args.stream_count, fmt(&open));
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let p95 = |v: &[(f64, f64, f64)]| median(v.iter().map(|p| p.1).collect());
    println!(
        "median p95: {:.1} ms closed, {:.1} ms open: moved by {:+.1} ms",
        p95(&closed),
        p95(&open),
        p95(&open) - p95(&closed)
    );
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

fn main() {
    let args = parse_args();
    if args.scale {
        scale(&args);
    }
    if args.load {
        load(&args);
    }
    if args.streams {
        streams(&args);
    }
}
