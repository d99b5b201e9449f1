//! The store at scale: `tasks/get` as the store grows, memory per live and per stored task,
//! and the time to ready after `kill -9` with many stored and live tasks.
//!
//! ```sh
//! cargo bench --bench scale                                       # 1M stored, 10k live
//! cargo bench --bench scale -- --stored 100000 --live 1000 --secs 5
//! cargo bench --bench scale -- --cache-size 64MiB                 # passed to serve (default 8MiB)
//! cargo bench --bench scale -- --quick-repair                     # passed to serve
//! cargo bench --bench scale -- --only parked --parked 100000      # tasks waiting for input
//! cargo bench --bench scale -- --only returned --returned 20000   # memory given back
//! ```
//!
//! Phases, each against `mcp-tasks serve --fixtures bench --no-quotas` started as a child
//! process (default durability: every commit fsync'd):
//!
//! 1. **Empty store.** `tasks/get` of one completed task for `--secs` at 16 clients; RSS.
//! 2. **Live tasks.** `--live` `sleep_task {"ms": 86400000}` tasks created over HTTP (each
//!    keeps an actor and a parked tool future); RSS before and after: bytes per live task.
//! 3. **Fill.** The server stops; `--stored` completed tasks are written straight into the
//!    same file (batches of 4,096 snapshots with their index entries, as the runtime writes
//!    them, not fsync'd; the store is closed cleanly at the end).
//! 4. **Large store.** The server starts on it: time to ready (the first `server/discover`
//!    answered), RSS; `tasks/get` of one completed task, then of random stored tasks; RSS.
//!    The ratios are against a *control*: a second server, started beside it on a new empty
//!    store, whose one completed task is read in the same way right before and right after
//!    (their mean), so that both sides are measured by the benchmark process in the same
//!    state (phase 1 runs before it has written a million records; its ratio is printed too).
//! 5. **After `kill -9`.** The server is killed with SIGKILL and started again: time to
//!    ready, with the default `--verify-on-open true` and with `false`.
//! 6. **Tasks waiting for input** (`--parked`, default 100,000; `--only parked` runs this
//!    phase alone). Two servers on fresh stores: one parks a task as soon as it waits
//!    (`--passivate-after 0s`, what the default `30s` comes to once the wait is that old),
//!    the other never does (`--passivate-after never`: every waiting task keeps its actor and
//!    its tool's future). Each first completes 1,000 `wait_input` tasks (a warm-up, so that
//!    allocator and caches are at their working size), then `--parked` `wait_input` tasks are
//!    created (8 clients) and left waiting: RSS above the warmed server, per waiting task.
//!    Then answering one: 5 rounds alternating between the servers of 100 tasks each at one
//!    client (`tasks/update`, then `tasks/get` until `completed`): p50/p99 of that time, parked
//!    against active. Last, the parking server is stopped cleanly and started again: its
//!    waiting tasks are parked at start without an actor; time to ready, RSS above an empty
//!    server's start.
//! 7. **Memory given back** (`--only returned`; `--returned`, default 20,000). One server with
//!    the default flags (a waiting task parks after 30 s): 1,000 `wait_input` tasks completed
//!    (the warm-up), then `--returned` left waiting; RSS above the warmed server right after
//!    they asked and `--after` seconds later (default 60: they have all been parked by then),
//!    per waiting task.
//!
//! Clients are this crate's `mcp_tasks::client` on a single-threaded tokio runtime on its own
//! OS thread, one connection each. Nothing here asserts speed.

mod common;
mod conditions;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{client, create_live, create_sleep, free_port, on_client_thread, wait_ready};
use mcp_tasks::internals::persist;
use mcp_tasks::internals::task::{Event, Owner, TaskId, TaskOutcome, TaskRecord, apply};
use mcp_tasks::store::{Durability, Expect, Store, StoreOptions, WriteOp};
use serde_json::json;

const USAGE: &str = "usage: cargo bench --bench scale -- [--stored N] [--live N] [--secs S] \
                     [--parked N] [--only parked|returned] [--returned N] [--after S] [--cache-size SIZE] [--record-cache-size SIZE] \
                     [--quick-repair] [--keep]";

struct Args {
    stored: usize,
    live: usize,
    /// Tasks left waiting for input in phase 6 (0: skipped).
    parked: usize,
    /// Run phase 6 only.
    only_parked: bool,
    /// Tasks of phase 7 (memory given back).
    returned: usize,
    /// Run phase 7 only.
    only_returned: bool,
    /// Seconds phase 7 waits after the tasks asked.
    after: u64,
    secs: f64,
    cache_size: Option<String>,
    record_cache_size: Option<String>,
    /// Pass `--quick-repair` to every start of the server.
    quick_repair: bool,
    /// Keep the store file (its path is printed) for profiling by hand.
    keep: bool,
}

fn parse_args() -> Args {
    let mut args = Args {
        stored: 1_000_000,
        live: 10_000,
        parked: 100_000,
        only_parked: false,
        returned: 20_000,
        only_returned: false,
        after: 60,
        secs: 5.0,
        cache_size: None,
        record_cache_size: None,
        keep: false,
        quick_repair: false,
    };
    let mut it = std::env::args().skip(1);
    let fail = |msg: String| -> ! {
        eprintln!("{msg}\n{USAGE}");
        std::process::exit(2);
    };
    let num = |name: &str, v: Option<String>| -> usize {
        match v.as_deref().map(str::parse::<usize>) {
            Some(Ok(n)) => n,
            _ => fail(format!("{name} needs an integer")),
        }
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--bench" => {}
            "--stored" => args.stored = num("--stored", it.next()),
            "--live" => args.live = num("--live", it.next()),
            "--parked" => args.parked = num("--parked", it.next()),
            "--only" => match it.next().as_deref() {
                Some("parked") => args.only_parked = true,
                Some("returned") => args.only_returned = true,
                other => fail(format!(
                    "--only takes `parked` or `returned`, not {other:?}"
                )),
            },
            "--returned" => args.returned = num("--returned", it.next()).max(1),
            "--after" => args.after = num("--after", it.next()) as u64,
            "--secs" => args.secs = num("--secs", it.next()).max(1) as f64,
            "--cache-size" => {
                args.cache_size = Some(it.next().unwrap_or_else(|| fail("--cache-size".into())))
            }
            "--keep" => args.keep = true,
            "--quick-repair" => args.quick_repair = true,
            "--record-cache-size" => {
                args.record_cache_size = Some(
                    it.next()
                        .unwrap_or_else(|| fail("--record-cache-size needs a size".into())),
                )
            }
            other => fail(format!("unknown argument {other:?}")),
        }
    }
    args
}

struct Server {
    child: Child,
    url: String,
    ready_s: f64,
}

impl Server {
    fn start(store: &Path, args: &Args, extra: &[&str]) -> Server {
        let port = free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-tasks"));
        cmd.args([
            "serve",
            "--fixtures",
            "bench",
            "--no-quotas",
            "--no-admin-socket",
        ])
        .args(["--task-ttl", "1d", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--store")
        .arg(store)
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null());
        if let Some(size) = &args.cache_size {
            cmd.args(["--cache-size", size]);
        }
        if args.quick_repair {
            cmd.arg("--quick-repair");
        }
        if let Some(size) = &args.record_cache_size {
            cmd.args(["--record-cache-size", size]);
        }
        let started = Instant::now();
        let child = cmd.spawn().expect("starting mcp-tasks serve");
        let url = format!("http://127.0.0.1:{port}/mcp");
        wait_ready(&url, Duration::from_secs(600), Duration::from_millis(5));
        Server {
            child,
            url,
            ready_s: started.elapsed().as_secs_f64(),
        }
    }

    /// Resident memory (VmRSS) in bytes.
    fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }

    fn kill9(mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }

    fn stop(mut self) {
        // SIGTERM: a clean shutdown.
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// `tasks/get` requests/s and p50/p99 ms of `concurrency` clients for `secs` seconds, each
/// request for one of `ids` (round robin from a per-client offset).
fn gets(url: &str, ids: Vec<String>, concurrency: usize, secs: f64) -> (f64, f64, f64) {
    let url = url.to_owned();
    on_client_thread(move || {
        Box::pin(async move {
            let mut clients = Vec::new();
            for _ in 0..concurrency {
                clients.push(client(&url, Duration::from_secs(60)).await);
            }
            let warm = Instant::now() + Duration::from_millis(500);
            let deadline = warm + Duration::from_secs_f64(secs);
            let ids = std::sync::Arc::new(ids);
            let workers = clients.into_iter().enumerate().map(|(c, client)| {
                let ids = ids.clone();
                async move {
                    let mut latencies = Vec::new();
                    let mut i = c * 7919;
                    loop {
                        let handle = client.resume(&ids[i % ids.len()]).await.expect("resume");
                        i += 1;
                        let t = Instant::now();
                        let task = handle.get().await.expect("tasks/get");
                        assert!(task.is_terminal(), "{task:?}");
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
            let mut latencies: Vec<f64> = futures::future::join_all(workers)
                .await
                .into_iter()
                .flatten()
                .collect();
            latencies.sort_by(f64::total_cmp);
            let pick = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
            (latencies.len() as f64 / secs, pick(0.5), pick(0.99))
        })
    })
}

/// One completed task, created and awaited over HTTP; its id.
fn one_completed(url: &str) -> String {
    let url = url.to_owned();
    on_client_thread(move || {
        Box::pin(async move {
            let client = client(&url, Duration::from_secs(60)).await;
            let handle = create_sleep(&client, 0).await;
            while !handle.get().await.expect("tasks/get").is_terminal() {}
            handle.id().to_owned()
        })
    })
}

/// Writes `n` completed tasks of the anonymous owner into the store at `path`, as the
/// runtime would have (snapshot, live and expiry index entries); their ids.
fn fill(path: &Path, n: usize) -> Vec<String> {
    let options = StoreOptions {
        durability: Durability::None,
        ..StoreOptions::default()
    };
    let store = Store::open(path, options).expect("opening the store to fill it");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let day = 86_400_000;
    let retention = 3_600_000;
    let mut ids = Vec::with_capacity(n);
    let mut batch = Vec::with_capacity(4096);
    let started = Instant::now();
    for i in 0..n {
        let created = TaskRecord::new(
            TaskId::generate(),
            Owner::anonymous(),
            "sleep_task".into(),
            json!({ "ms": 0 }),
            json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } }),
            now,
            Some(day),
            Some(1000),
            None,
        );
        let result = json!({ "content": [{ "type": "text", "text": "Slept 0 ms." }] });
        let done = apply(
            &created,
            Event::Finish(TaskOutcome::Result(result)),
            now + 1,
        )
        .expect("finish")
        .expect("a change");
        ids.push(done.id.as_str().to_owned());
        batch.push(WriteOp::Put {
            id: done.id.as_str().to_owned(),
            bytes: persist::encode(&done).expect("encode"),
            constant_tail: 0,
            live: false,
            due_ms: Some(now + day + retention),
            seq: Some(done.seq),
            expect: Expect::Any,
            owner: Some(mcp_tasks::store::OwnerEntry {
                owner: mcp_tasks::store::owner_key(&done.owner.tenant, &done.owner.principal),
                created_ms: done.created_at_ms,
            }),
            listing: Some(mcp_tasks::internals::listing_of(&done)),
        });
        if batch.len() == 4096 || i + 1 == n {
            rt.block_on(store.commit(std::mem::take(&mut batch)))
                .expect("commit");
        }
        if (i + 1) % 200_000 == 0 {
            eprintln!(
                "  filled {} in {:.1} s",
                i + 1,
                started.elapsed().as_secs_f64()
            );
        }
    }
    rt.block_on(store.close());
    ids
}

fn main() {
    let args = parse_args();
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target");
    std::fs::create_dir_all(&target).expect("creating target/");
    let dir = tempfile::Builder::new()
        .prefix("bench-scale-")
        .tempdir_in(&target)
        .expect("creating the temp dir under target/");
    let path = dir.path().join("scale.redb");
    conditions::print(
        dir.path(),
        "redb: every commit fsync'd before it is acknowledged (Durability::Immediate); the fill writes without fsync and closes the store cleanly",
    );
    println!(
        "mcp-tasks scale benchmark: {} stored, {} live, {} s get runs, cache size {}, record cache size {}, quick repair {}\n",
        args.stored,
        args.live,
        args.secs,
        args.cache_size.as_deref().unwrap_or("default"),
        args.record_cache_size.as_deref().unwrap_or("default"),
        if args.quick_repair { "on" } else { "off" }
    );

    if args.only_parked {
        parked_phase(dir.path(), &args);
        return;
    }
    if args.only_returned {
        returned_phase(dir.path(), &args);
        return;
    }

    // 1. Empty store.
    let server = Server::start(&path, &args, &[]);
    println!(
        "empty store: ready in {:.3} s, RSS {:.1} MiB",
        server.ready_s,
        mib(server.rss())
    );
    let first = one_completed(&server.url);
    let (rate0, p50, p99) = gets(&server.url, vec![first.clone()], 16, args.secs);
    println!("empty store: tasks/get one task: {rate0:.0}/s (p50 {p50:.2} ms, p99 {p99:.2} ms)");

    // 2. Live tasks.
    let before = server.rss();
    let t = Instant::now();
    let live = create_live(&server.url, args.live);
    let after = server.rss();
    println!(
        "{} live tasks created in {:.1} s: RSS {:.1} -> {:.1} MiB, {:.0} bytes per live task",
        live.len(),
        t.elapsed().as_secs_f64(),
        mib(before),
        mib(after),
        (after.saturating_sub(before)) as f64 / live.len().max(1) as f64
    );
    server.stop();

    // 3. Fill.
    let t = Instant::now();
    let mut ids = fill(&path, args.stored);
    println!(
        "filled {} completed tasks in {:.1} s; file {:.0} MiB",
        args.stored,
        t.elapsed().as_secs_f64(),
        mib(std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0))
    );
    ids.push(first.clone());

    // 4. Large store.
    let server = Server::start(&path, &args, &[]);
    let rss_start = server.rss();
    println!(
        "{} stored + {} live (after a clean stop): ready in {:.3} s, RSS {:.1} MiB",
        ids.len(),
        live.len(),
        server.ready_s,
        mib(rss_start)
    );
    let control = Server::start(&dir.path().join("control.redb"), &args, &[]);
    let control_task = one_completed(&control.url);
    let (before, p50, p99) = gets(&control.url, vec![control_task.clone()], 16, args.secs);
    println!(
        "control (empty store, started now): tasks/get one task: {before:.0}/s (p50 {p50:.2} ms, p99 {p99:.2} ms)"
    );
    let (rate1, p50, p99) = gets(&server.url, vec![first.clone()], 16, args.secs);
    println!("large store: tasks/get one task: {rate1:.0}/s (p50 {p50:.2} ms, p99 {p99:.2} ms)");
    let (rate2, p50, p99) = gets(&server.url, ids.clone(), 16, args.secs);
    let rss_random = server.rss();
    println!(
        "large store: tasks/get random stored tasks: {rate2:.0}/s (p50 {p50:.2} ms, p99 {p99:.2} ms); RSS {:.1} MiB",
        mib(rss_random)
    );
    let (after, p50, p99) = gets(&control.url, vec![control_task], 16, args.secs);
    println!("control again: tasks/get one task: {after:.0}/s (p50 {p50:.2} ms, p99 {p99:.2} ms)");
    control.stop();
    let control_rate = (before + after) / 2.0;
    println!(
        "large store against the control: one task {:.2}x, random stored tasks {:.2}x (phase 1's empty store: {:.2}x, {:.2}x)",
        rate1 / control_rate,
        rate2 / control_rate,
        rate1 / rate0,
        rate2 / rate0
    );

    // 5. After kill -9.
    server.kill9();
    let server = Server::start(&path, &args, &[]);
    println!(
        "after kill -9 (verify on open): ready in {:.3} s, RSS {:.1} MiB",
        server.ready_s,
        mib(server.rss())
    );
    server.kill9();
    let server = Server::start(&path, &args, &["--verify-on-open", "false"]);
    println!(
        "after kill -9 (--verify-on-open false): ready in {:.3} s, RSS {:.1} MiB",
        server.ready_s,
        mib(server.rss())
    );
    server.stop();
    if args.parked > 0 {
        parked_phase(dir.path(), &args);
    }
    if args.keep {
        let kept = dir.keep();
        println!("store kept: {}", kept.join("scale.redb").display());
    }
}

/// A client of `url` as [`common::client`] makes it, declaring that it can be asked for a form
/// (what `wait_input` asks).
async fn answering_client(url: &str) -> mcp_tasks::client::Client {
    mcp_tasks::client::Client::http(url)
        .expect("client")
        .retry(mcp_tasks::client::RetryPolicy::none())
        .timeout(Duration::from_secs(60))
        .capabilities(json!({ "elicitation": {} }))
        .build()
        .await
        .expect("client build")
}

/// `wait_input`, which must become a task; its handle.
async fn create_waiting(client: &mcp_tasks::client::Client) -> mcp_tasks::client::TaskHandle {
    match client
        .call_tool("wait_input", json!({}))
        .await
        .expect("tools/call")
    {
        mcp_tasks::client::CallOutcome::Task(handle) => handle,
        mcp_tasks::client::CallOutcome::Complete(r) => {
            panic!("wait_input did not become a task: {r}")
        }
    }
}

/// Polls `handle` until its task has `status`.
async fn until(handle: &mcp_tasks::client::TaskHandle, status: mcp_tasks::TaskStatus) {
    loop {
        let task = handle.get().await.expect("tasks/get");
        if task.status == status {
            return;
        }
        assert!(
            !task.is_terminal(),
            "ended before {status:?}: {:?}",
            task.raw
        );
    }
}

/// Answers the waiting task of `handle` and polls until it completed; the time it took, ms.
async fn answer_and_complete(handle: &mcp_tasks::client::TaskHandle) -> f64 {
    let t = Instant::now();
    let mut answer = serde_json::Map::new();
    answer.insert(
        "answer".into(),
        json!({ "action": "accept", "content": { "text": "yes" } }),
    );
    handle.answer(answer).await.expect("tasks/update");
    until(handle, mcp_tasks::TaskStatus::Completed).await;
    t.elapsed().as_secs_f64() * 1e3
}

/// Creates `n` `wait_input` tasks with 8 clients and waits until each asks for its input;
/// their ids. `answered` = answer each at once (the warm-up).
fn create_waiting_tasks(url: &str, n: usize, answered: bool) -> Vec<String> {
    let url = url.to_owned();
    on_client_thread(move || {
        Box::pin(async move {
            let workers = (0..8).map(|c| {
                let url = url.clone();
                async move {
                    let client = answering_client(&url).await;
                    let mut ids = Vec::new();
                    for _ in 0..(n / 8 + usize::from(c < n % 8)) {
                        let handle = create_waiting(&client).await;
                        until(&handle, mcp_tasks::TaskStatus::InputRequired).await;
                        if answered {
                            answer_and_complete(&handle).await;
                        }
                        ids.push(handle.id().to_owned());
                    }
                    ids
                }
            });
            futures::future::join_all(workers)
                .await
                .into_iter()
                .flatten()
                .collect()
        })
    })
}

/// Answers each of `ids` in turn at one client; the times from answer to `completed`, ms.
fn answer_each(url: &str, ids: Vec<String>) -> Vec<f64> {
    let url = url.to_owned();
    on_client_thread(move || {
        Box::pin(async move {
            let client = answering_client(&url).await;
            let mut times = Vec::with_capacity(ids.len());
            for id in ids {
                let handle = client.resume(&id).await.expect("resume");
                times.push(answer_and_complete(&handle).await);
            }
            times
        })
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

/// Phase 7: the memory of tasks waiting for input, once parked, given back to the system.
fn returned_phase(dir: &Path, args: &Args) {
    let n = args.returned;
    println!(
        "\n{n} tasks waiting for input with the default flags (parked after 30 s): memory given back"
    );
    let server = Server::start(&dir.join("returned.redb"), args, &[]);
    let empty = server.rss();
    create_waiting_tasks(&server.url, 1_000, true);
    std::thread::sleep(Duration::from_millis(500));
    let before = server.rss();
    let t = Instant::now();
    create_waiting_tasks(&server.url, n, false);
    let took = t.elapsed().as_secs_f64();
    let asked = server.rss();
    std::thread::sleep(Duration::from_secs(args.after));
    let later = server.rss();
    let per = |rss: u64| rss.saturating_sub(before) as f64 / n as f64;
    println!(
        "  empty {:.1} MiB, warmed {:.1} MiB; {n} created and waiting in {took:.1} s: RSS {:.1} MiB ({:.0} bytes per task above the warmed server); {} s later {:.1} MiB ({:.0} bytes per task)",
        mib(empty),
        mib(before),
        mib(asked),
        per(asked),
        args.after,
        mib(later),
        per(later),
    );
    server.stop();
}

/// Phase 6: what a task waiting for input costs, parked and with its actor.
fn parked_phase(dir: &Path, args: &Args) {
    let n = args.parked.max(1);
    println!("\n{n} tasks waiting for input (`wait_input`), parked at once against never parked:");
    let parking_path = dir.join("parking.redb");
    let start_parking =
        |args: &Args| Server::start(&parking_path, args, &["--passivate-after", "0s"]);
    let parking = start_parking(args);
    let rss_empty_start = parking.rss();
    let active = Server::start(
        &dir.join("active.redb"),
        args,
        &["--passivate-after", "never"],
    );
    let mut per_task = Vec::new();
    for (name, server) in [("parked", &parking), ("active", &active)] {
        create_waiting_tasks(&server.url, 1_000, true);
        std::thread::sleep(Duration::from_millis(500));
        let before = server.rss();
        let t = Instant::now();
        let ids = create_waiting_tasks(&server.url, n, false);
        let took = t.elapsed().as_secs_f64();
        // The last ones park right after their commit: give them a moment.
        std::thread::sleep(Duration::from_millis(1_000));
        let after = server.rss();
        let bytes = after.saturating_sub(before) as f64 / n as f64;
        println!(
            "  {name}: {n} created and waiting in {took:.1} s: RSS {:.1} -> {:.1} MiB above the warmed server, {bytes:.0} bytes per waiting task",
            mib(before),
            mib(after),
        );
        per_task.push(ids);
    }
    let (parked_ids, active_ids) = (&per_task[0], &per_task[1]);
    let (mut parked_times, mut active_times) = (Vec::new(), Vec::new());
    for round in 0..5 {
        let take = |ids: &Vec<String>| ids[round * 100..(round + 1) * 100].to_vec();
        if n < 500 {
            break;
        }
        if round % 2 == 0 {
            parked_times.extend(answer_each(&parking.url, take(parked_ids)));
            active_times.extend(answer_each(&active.url, take(active_ids)));
        } else {
            active_times.extend(answer_each(&active.url, take(active_ids)));
            parked_times.extend(answer_each(&parking.url, take(parked_ids)));
        }
    }
    if !parked_times.is_empty() {
        parked_times.sort_by(f64::total_cmp);
        active_times.sort_by(f64::total_cmp);
        let (pp50, pp99) = (
            percentile(&parked_times, 0.5),
            percentile(&parked_times, 0.99),
        );
        let (ap50, ap99) = (
            percentile(&active_times, 0.5),
            percentile(&active_times, 0.99),
        );
        println!(
            "  answer to completed, 500 each, 1 client, alternating: parked p50 {pp50:.2} ms p99 {pp99:.2} ms; active p50 {ap50:.2} ms p99 {ap99:.2} ms; parked / active p50 {:.2}x",
            pp50 / ap50
        );
    }
    active.stop();
    parking.stop();
    let parking = start_parking(args);
    let rss = parking.rss();
    println!(
        "  parking server restarted (clean stop) with {} waiting: ready in {:.3} s, RSS {:.1} MiB, {:.0} bytes per waiting task above an empty server's start ({:.1} MiB)",
        n.saturating_sub(500),
        parking.ready_s,
        mib(rss),
        rss.saturating_sub(rss_empty_start) as f64 / n.saturating_sub(500).max(1) as f64,
        mib(rss_empty_start)
    );
    parking.stop();
}
