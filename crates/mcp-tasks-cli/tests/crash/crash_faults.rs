//! Storage faults: disk full and I/O errors during commits (the requests of that batch fail
//! with -32603 and a clear message, the store reopens, nothing acknowledged is lost), a store
//! that cannot be reopened (clean errors, clean shutdown), and corrupt or truncated store files
//! at start (a clear error naming the file, never silent data loss).
//!
//! `MCP_TASKS_SEED=<seed>` replays one seed of the fault simulation.

use crate::sim;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcp_tasks::clock::Clock;
use mcp_tasks::store::{Store, StoreOptions};
use mcp_tasks::{Owner, Runtime, RuntimeConfig};
use mcp_tasks_testkit::sim::{JobSpec, SideEffect, SideEffects, StrictClock, TOOL};
use serde_json::{Value, json};
use sim::checker::{Allow, Ev, History, check};
use sim::disk::{Fault, SimDisk};
use sim::driver::{Conn, Driver, DriverConfig, InProc, request};
use sim::power::{self, MemLog};
use sim::{Rng, env_u64, seeds};

#[derive(Default)]
struct Log(Mutex<Vec<SideEffect>>);

impl SideEffects for Log {
    fn record(&self, task: &str, step: &str, value: &str) -> bool {
        self.0.lock().unwrap().push(SideEffect {
            task: task.to_owned(),
            step: step.to_owned(),
            value: value.to_owned(),
        });
        true
    }
}

/// Tasks waiting for input park at once: the faults hit passivated tasks being woken too.
fn config() -> RuntimeConfig {
    let mut c = RuntimeConfig::default();
    c.cancel_grace = Duration::from_millis(500);
    c.restart_backoff = Duration::from_millis(10);
    c.passivate_after = Some(Duration::ZERO);
    c
}

async fn start_on(disk: &SimDisk, name: &str, log: &Arc<Log>, clock: &Arc<StrictClock>) -> Runtime {
    start_on_with(disk, name, log, clock, config()).await
}

async fn start_on_with(
    disk: &SimDisk,
    name: &str,
    log: &Arc<Log>,
    clock: &Arc<StrictClock>,
    config: RuntimeConfig,
) -> Runtime {
    let builder = Runtime::builder(name)
        .store_backend(disk.factory())
        .clock(clock.clone() as Arc<dyn Clock>)
        .config(config);
    mcp_tasks_testkit::sim::install_with(builder, log.clone())
        .start()
        .await
        .expect("the runtime starts on a healthy disk")
}

async fn read_store(name: &str, disk: &SimDisk) -> Result<Vec<(String, Vec<u8>)>, String> {
    let store =
        Store::open_with_backend_async(name.into(), disk.factory(), StoreOptions::default())
            .await
            .map_err(|e| e.to_string())?;
    let tasks = store.tasks().await.map_err(|e| e.to_string());
    store.close().await;
    tasks
}

/// A client that records every error response, to check what a failed batch answers.
struct Recording {
    inner: InProc,
    errors: Arc<Mutex<Vec<Value>>>,
}

impl Conn for Recording {
    fn call(&self, message: Value) -> futures::future::BoxFuture<'static, Result<Value, String>> {
        let errors = self.errors.clone();
        let fut = self.inner.call(message);
        Box::pin(async move {
            let r = fut.await;
            if let Ok(v) = &r
                && let Some(e) = v.get("error")
            {
                errors.lock().unwrap().push(e.clone());
            }
            r
        })
    }

    fn listen(
        &self,
        message: Value,
    ) -> futures::future::BoxFuture<
        'static,
        Result<futures::stream::BoxStream<'static, Value>, String>,
    > {
        self.inner.listen(message)
    }
}

/// What one fault seed did.
struct FaultRun {
    report: sim::checker::Report,
    hits: u64,
    failed_syncs: u64,
    halted: bool,
    errors: usize,
    problems: Vec<String>,
}

/// One seed: the workload runs while a seeded window of disk ops fails (ENOSPC on writes, EIO
/// on syncs, with Linux semantics: the writes of a failed sync are dropped). A failed write
/// makes the store reopen and go on; a failed sync halts it (fail-stop). The process then
/// "exits" and the machine loses power (the restart sees what is really on disk); the next
/// incarnation recovers, and every task must finish.
async fn fault_seed(seed: u64) -> FaultRun {
    let mut rng = Rng::new(seed);
    let clock = Arc::new(StrictClock::system());
    let history = Arc::new(History::default());
    let log = Arc::new(MemLog::default());
    let options = StoreOptions::default();
    let mut disk = SimDisk::new();
    if let Err(error) = power::read_store(seed, &disk).await {
        history.push(Ev::ReopenFailed { epoch: 0, error });
    }
    let name = power::label(seed).display().to_string();
    let errors = Arc::new(Mutex::new(Vec::new()));
    let mut driver = Driver::new(rng.fork(1), history.clone(), DriverConfig::default());
    let (mut hits, mut failed_syncs, mut halted) = (0, 0, false);
    for epoch in 0..2u32 {
        let last = epoch == 1;
        log.begin(epoch);
        if !last {
            let l = log.clone();
            disk.on_crash(move || l.kill());
        }
        let rt = match power::start_runtime_with(seed, &disk, &clock, &log, epoch, options.clone())
            .await
        {
            Ok(rt) => rt,
            Err(error) => {
                history.push(Ev::ReopenFailed { epoch, error });
                break;
            }
        };
        let conn = Recording {
            inner: InProc(rt.handle()),
            errors: errors.clone(),
        };
        let alive = disk.alive();
        if last {
            driver.run(&conn, epoch, 10, &alive).await;
            driver
                .settle(&conn, epoch, Duration::from_secs(20), &alive)
                .await;
            driver.stop_listeners();
            rt.shutdown().await;
        } else {
            driver.run(&conn, epoch, 15, &alive).await;
            // Faults: one or two windows of failing ops, and in half of the seeds one failed
            // fsync.
            if rng.chance(50) {
                disk.fail_next_syncs(1);
            }
            for _ in 0..rng.range(1, 3) {
                let from = disk.ops() + rng.range(1, 60);
                disk.add_fault(Fault {
                    from,
                    count: rng.range(1, 40),
                });
            }
            driver.run(&conn, epoch, 40, &alive).await;
            hits = disk.faults_hit();
            failed_syncs = disk.failed_syncs();
            halted = mcp_tasks::internals::runtime_store(&rt).halted().is_some();
            // Fail-stop: the process exits (a halted store acknowledges nothing more); the
            // restart is modelled as a power cycle, so it finds what is really on disk.
            disk.crash_now();
            driver.stop_listeners();
            drop(rt);
            disk = SimDisk::from_image(disk.crash_image(&mut rng));
        }
        let copy = SimDisk::from_image(if last {
            disk.live_image()
        } else {
            disk.durable_image()
        });
        match power::read_store(seed, &copy).await {
            Ok(tasks) => history.durable(epoch, tasks),
            Err(error) => {
                history.push(Ev::ReopenFailed { epoch, error });
                break;
            }
        }
    }
    let mut problems = Vec::new();
    for e in errors.lock().unwrap().iter() {
        let code = e.get("code").and_then(Value::as_i64);
        let msg = e.get("message").and_then(Value::as_str).unwrap_or("");
        let store_error = msg.contains("task store");
        if store_error && code != Some(-32603) {
            problems.push(format!("a store failure answered {e}, not -32603"));
        }
        if msg.contains(&name) {
            problems.push(format!("an error tells the client the store's path: {e}"));
        }
    }
    if std::env::var("MCP_TASKS_DEBUG").is_ok() {
        let mut distinct: Vec<String> = errors
            .lock()
            .unwrap()
            .iter()
            .map(|e| e["message"].as_str().unwrap_or("").to_owned())
            .collect();
        distinct.sort();
        distinct.dedup();
        eprintln!("seed {seed:#x} error messages: {distinct:#?}");
    }
    let errs = errors.lock().unwrap().len();
    FaultRun {
        report: check(&history.events(), &log.effects(), &Allow::default()),
        hits,
        failed_syncs,
        halted,
        errors: errs,
        problems,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_and_io_errors_fail_the_batch_and_the_store_recovers() {
    let started = Instant::now();
    let list = seeds(0xD15C_F011, env_u64("MCP_TASKS_FAULT_SEEDS", 40));
    let (mut hits, mut errors, mut syncs, mut halts, mut failed) = (0, 0, 0, 0, Vec::new());
    for seed in &list {
        let run = fault_seed(*seed).await;
        hits += run.hits;
        errors += run.errors;
        syncs += run.failed_syncs;
        halts += u64::from(run.halted);
        if run.failed_syncs > 0 && !run.halted {
            failed.push(format!(
                "seed {seed:#x}: an fsync failed but the store did not halt"
            ));
        }
        if !run.report.is_clean() || !run.problems.is_empty() {
            failed.push(format!(
                "seed {seed:#x}: {}\n  {}\n  replay: MCP_TASKS_SEED={seed:#x} cargo test -p mcp-tasks-cli --test crash crash_faults::disk_full",
                run.report.summary(8),
                run.problems.join("\n  ")
            ));
        }
    }
    eprintln!(
        "storage faults: {} seeds, {hits} failed disk ops ({syncs} failed fsyncs, {halts} fail-stops), {errors} error responses, {} failing seeds, {:.1}s",
        list.len(),
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(hits > 0, "the fault windows were never hit");
    assert!(halts > 0, "no seed hit a failed fsync");
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// One run of the scenario of [`reopening_after_a_failed_fsync_is_caught_by_the_checker`].
async fn reopen_scenario(seed: u64, unsafe_reopen: bool) -> sim::checker::Report {
    let mut rng = Rng::new(seed);
    let clock = Arc::new(StrictClock::system());
    let history = Arc::new(History::default());
    let log = Arc::new(MemLog::default());
    let options = StoreOptions {
        unsafe_reopen_after_sync_failure: unsafe_reopen,
        ..StoreOptions::default()
    };
    let disk = SimDisk::new();
    power::read_store(seed, &disk).await.unwrap();
    log.begin(0);
    let rt = power::start_runtime_with(seed, &disk, &clock, &log, 0, options)
        .await
        .unwrap();
    let spec = JobSpec {
        steps: 1,
        inputs: [0].into_iter().collect(),
        fail: false,
        delay_ms: 0,
    };
    let handle = rt.handle();
    let create = |n: u64| {
        let handle = handle.clone();
        let spec = spec.clone();
        async move {
            let message = request(
                n,
                "tools/call",
                json!({ "name": TOOL, "arguments": spec.to_arguments() }),
            );
            handle
                .handle_json(message, &Owner::anonymous())
                .await
                .unwrap()
        }
    };
    let acked = |r: &Value, epoch: u32| {
        if let Some(task) = r["result"]["taskId"].as_str() {
            history.push(Ev::CreateAcked {
                task: task.to_owned(),
                epoch,
                spec: spec.clone(),
            });
        }
    };
    // Enough tasks for the tasks table to span many pages; then wait until they all wait for
    // input, so that the next commit is the burst below.
    let mut ids = Vec::new();
    for n in 0..80 {
        let r = create(n).await;
        acked(&r, 0);
        ids.extend(r["result"]["taskId"].as_str().map(str::to_owned));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    for id in &ids {
        loop {
            let g = handle
                .handle_json(
                    request(1, "tasks/get", json!({ "taskId": id })),
                    &Owner::anonymous(),
                )
                .await
                .unwrap();
            if g["result"]["status"] == "input_required" {
                break;
            }
            assert!(Instant::now() < deadline, "never input_required: {g}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    // A creation whose fsync fails: the pages of its commit are dropped.
    disk.fail_next_syncs(1);
    let failed = create(100).await;
    acked(&failed, 0);
    if std::env::var("MCP_TASKS_DEBUG").is_ok() {
        eprintln!(
            "failed creation: {failed}, failed syncs {}, halted {:?}",
            disk.failed_syncs(),
            mcp_tasks::internals::runtime_store(&rt).halted()
        );
    }
    // Work acknowledged after the failed fsync (refused by a fail-stop store): cancellations
    // of the oldest tasks. Task ids sort by creation time, so these commits rewrite the first
    // pages of each table and leave the last ones, which the failed creation wrote, as the
    // failed commit left them (a newer creation would write them again, on a good sync).
    for (n, id) in ids.iter().enumerate().take(rng.range(3, 8) as usize) {
        history.push(Ev::CancelSent { task: id.clone() });
        let r = handle
            .handle_json(
                request(200 + n as u64, "tasks/cancel", json!({ "taskId": id })),
                &Owner::anonymous(),
            )
            .await
            .unwrap();
        if r.get("result").is_some() {
            history.push(Ev::CancelAcked {
                task: id.clone(),
                epoch: 0,
            });
        }
    }
    disk.crash_now();
    drop(rt);
    let image = SimDisk::from_image(disk.crash_image(&mut rng));
    match power::read_store(seed, &image).await {
        Ok(tasks) => history.durable(0, tasks),
        Err(error) => history.push(Ev::ReopenFailed { epoch: 0, error }),
    }
    check(&history.events(), &log.effects(), &Allow::default())
}

/// The checker catches the old behaviour: reopening the store after a failed fsync and going
/// on, on a disk with Linux semantics (the writes of a failed sync are dropped), acknowledges
/// commits on top of pages that never reach the disk; after a power loss the store does not
/// open or has lost tasks it had acknowledged. The fail-stop store passes the same scenario.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopening_after_a_failed_fsync_is_caught_by_the_checker() {
    let list = seeds(0x0E10_5EED, env_u64("MCP_TASKS_REOPEN_SEEDS", 12));
    let mut caught = Vec::new();
    for seed in &list {
        let old = reopen_scenario(*seed, true).await;
        if !old.is_clean() {
            caught.push(format!("seed {seed:#x}: {}", old.summary(2)));
        }
        let new = reopen_scenario(*seed, false).await;
        assert!(
            new.is_clean(),
            "seed {seed:#x}: the fail-stop store fails the checker: {}",
            new.summary(8)
        );
    }
    eprintln!(
        "reopen after a failed fsync: {} of {} seeds caught; e.g. {}",
        caught.len(),
        list.len(),
        caught.first().cloned().unwrap_or_default()
    );
    assert!(
        caught.len() * 3 >= list.len(),
        "the checker must catch the reopen after a failed fsync in a third of the seeds at least: {caught:?}"
    );
}

/// The exact answer of a creation whose group commit hits a full disk, and recovery after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_creation_with_a_clear_message_and_then_recovers() {
    let disk = SimDisk::new();
    let log = Arc::new(Log::default());
    let clock = Arc::new(StrictClock::system());
    let rt = start_on(&disk, "full.redb", &log, &clock).await;
    let spec = JobSpec {
        steps: 1,
        inputs: Default::default(),
        fail: false,
        delay_ms: 0,
    };
    let create = || {
        request(
            1,
            "tools/call",
            json!({ "name": TOOL, "arguments": spec.to_arguments() }),
        )
    };
    disk.add_fault(Fault {
        from: disk.ops() + 1,
        count: 3,
    });
    let r = rt.handle_json(create(), &Owner::anonymous()).await.unwrap();
    assert_eq!(r["error"]["code"], -32603, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        !msg.contains("full.redb") && msg.contains("committing to the task store failed"),
        "the message says what failed, without the store's path: {msg}"
    );
    eprintln!("a full disk answers: {msg}");
    // The actor started beside the failed creation commit (its tool may have begun) stops
    // and leaves nothing live behind.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while rt.live_tasks() != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the actor of a creation that was not committed must stop ({} live)",
            rt.live_tasks()
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // The faults are over: the store reopens and the next creation is durable.
    let mut ok = None;
    for _ in 0..5 {
        let r = rt.handle_json(create(), &Owner::anonymous()).await.unwrap();
        if r.get("result").is_some() {
            ok = Some(r);
            break;
        }
    }
    let r = ok.expect("the runtime recovers after the disk has room again");
    let id = r["result"]["taskId"].as_str().unwrap().to_owned();
    rt.shutdown().await;
    let tasks = read_store("full.redb", &SimDisk::from_image(disk.live_image()))
        .await
        .unwrap();
    assert!(
        tasks.iter().any(|(t, _)| *t == id),
        "the acknowledged task is stored"
    );
}

/// A failed fsync halts the store (fail-stop): the batch and every later write and store read
/// answer -32603 saying so, `Store::halted` reports it, and the runtime still shuts down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_halts_the_store() {
    let disk = SimDisk::new();
    let log = Arc::new(Log::default());
    let clock = Arc::new(StrictClock::system());
    let rt = start_on(&disk, "eio.redb", &log, &clock).await;
    let spec = JobSpec {
        steps: 1,
        inputs: [0].into_iter().collect(),
        fail: false,
        delay_ms: 0,
    };
    let create = |id: u64| {
        request(
            id,
            "tools/call",
            json!({ "name": TOOL, "arguments": spec.to_arguments() }),
        )
    };
    let r = rt
        .handle_json(create(1), &Owner::anonymous())
        .await
        .unwrap();
    let id = r["result"]["taskId"].as_str().unwrap().to_owned();
    // A finished task, read twice (the second read from the record cache).
    let quick = JobSpec {
        steps: 1,
        inputs: Default::default(),
        fail: false,
        delay_ms: 0,
    };
    let r = rt
        .handle_json(
            request(
                10,
                "tools/call",
                json!({ "name": TOOL, "arguments": quick.to_arguments() }),
            ),
            &Owner::anonymous(),
        )
        .await
        .unwrap();
    let done = r["result"]["taskId"].as_str().unwrap().to_owned();
    let get_done = || request(11, "tasks/get", json!({ "taskId": done }));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let g = rt
            .handle_json(get_done(), &Owner::anonymous())
            .await
            .unwrap();
        if g["result"]["status"] == "completed" {
            break;
        }
        assert!(Instant::now() < deadline, "{g}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Once its actor is gone it is read from the store, then from the record cache.
    let before = mcp_tasks::internals::runtime_store(&rt)
        .stats()
        .cached_reads;
    while mcp_tasks::internals::runtime_store(&rt)
        .stats()
        .cached_reads
        == before
    {
        let g = rt
            .handle_json(get_done(), &Owner::anonymous())
            .await
            .unwrap();
        assert_eq!(g["result"]["status"], "completed", "{g}");
        assert!(
            Instant::now() < deadline,
            "never read from the record cache"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let store = mcp_tasks::internals::runtime_store(&rt).clone();
    let waiter = tokio::spawn(async move { store.wait_halted().await });
    disk.fail_next_syncs(1);
    let r = rt
        .handle_json(create(2), &Owner::anonymous())
        .await
        .unwrap();
    assert_eq!(r["error"]["code"], -32603, "{r}");
    let msg = r["error"]["message"].as_str().unwrap().to_owned();
    assert_eq!(
        msg,
        "Internal error: the task store failed: the task store stopped after a failed fsync and accepts no more writes; the server must be restarted"
    );
    let detail = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("wait_halted resolves")
        .unwrap();
    assert!(detail.contains("fsync failed"), "{detail}");
    assert!(mcp_tasks::internals::runtime_store(&rt).halted().is_some());
    // Nothing more is acknowledged, also after the disk is healthy again.
    for n in 3..6 {
        let r = rt
            .handle_json(create(n), &Owner::anonymous())
            .await
            .unwrap();
        assert_eq!(r["error"]["message"], msg.as_str(), "{r}");
    }
    // Reads stop too, also of what the record cache holds.
    let g = rt
        .handle_json(get_done(), &Owner::anonymous())
        .await
        .unwrap();
    assert_eq!(g["error"]["code"], -32603, "{g}");
    let u = rt
        .handle_json(
            request(7, "tasks/cancel", json!({ "taskId": id })),
            &Owner::anonymous(),
        )
        .await
        .unwrap();
    assert_eq!(u["error"]["code"], -32603, "{u}");
    let stopped = tokio::time::timeout(Duration::from_secs(30), rt.shutdown()).await;
    assert!(stopped.is_ok(), "shutdown must finish on a halted store");
    assert_eq!(disk.failed_syncs(), 1);
}

/// A store whose disk never comes back: every write answers -32603 "unavailable", reads of
/// what is in memory still work, and the runtime shuts down cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_reopen_fails_cleanly_and_shuts_down() {
    let disk = SimDisk::new();
    let log = Arc::new(Log::default());
    let clock = Arc::new(StrictClock::system());
    // The task keeps its actor while it waits: what is in memory stays readable on a dead
    // disk. (A parked task is read from the store: on a dead disk that read fails.)
    let mut config = config();
    config.passivate_after = None;
    let rt = start_on_with(&disk, "dead.redb", &log, &clock, config).await;
    let spec = JobSpec {
        steps: 2,
        inputs: [0].into_iter().collect(),
        fail: false,
        delay_ms: 0,
    };
    let r = rt
        .handle_json(
            request(
                1,
                "tools/call",
                json!({ "name": TOOL, "arguments": spec.to_arguments() }),
            ),
            &Owner::anonymous(),
        )
        .await
        .unwrap();
    let id = r["result"]["taskId"].as_str().unwrap().to_owned();
    // Let it reach input_required.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let g = rt
            .handle_json(
                request(2, "tasks/get", json!({ "taskId": id })),
                &Owner::anonymous(),
            )
            .await
            .unwrap();
        if g["result"]["status"] == "input_required" {
            break;
        }
        assert!(Instant::now() < deadline, "never input_required: {g}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    disk.add_fault(Fault {
        from: disk.ops() + 1,
        count: u64::MAX / 2,
    });
    let mut messages = Vec::new();
    for i in 0..3 {
        let r = rt
            .handle_json(
                request(
                    10 + i,
                    "tools/call",
                    json!({ "name": TOOL, "arguments": spec.to_arguments() }),
                ),
                &Owner::anonymous(),
            )
            .await
            .unwrap();
        assert_eq!(r["error"]["code"], -32603, "{r}");
        messages.push(r["error"]["message"].as_str().unwrap().to_owned());
    }
    eprintln!("a dead disk answers: {messages:?}");
    assert!(
        messages.iter().skip(1).any(|m| m.contains("unavailable")),
        "later writes say the store is unavailable: {messages:?}"
    );
    assert!(
        messages.iter().all(|m| !m.contains("dead.redb")),
        "no message tells the client the store's path: {messages:?}"
    );
    // What is in memory can still be read (the live task's committed snapshot).
    let g = rt
        .handle_json(
            request(20, "tasks/get", json!({ "taskId": id })),
            &Owner::anonymous(),
        )
        .await
        .unwrap();
    assert_eq!(g["result"]["status"], "input_required", "{g}");
    let stopped = tokio::time::timeout(Duration::from_secs(30), rt.shutdown()).await;
    assert!(stopped.is_ok(), "shutdown must finish on a dead disk");
}

// ---------------------------------------------------------------------------------------------
// Corrupt and truncated store files at start
// ---------------------------------------------------------------------------------------------

/// Makes a store file with `n` finished tasks and one live one; returns their `tasks/get`
/// results.
async fn make_store(path: &Path, effects: &Path) -> Vec<(String, Value)> {
    let rt = mcp_tasks_testkit::sim::install(Runtime::builder(path), effects.to_path_buf())
        .start()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for (i, inputs) in [vec![], vec![], vec![0u32], vec![]].into_iter().enumerate() {
        let spec = JobSpec {
            steps: 3,
            inputs: inputs.into_iter().collect(),
            fail: i == 3,
            delay_ms: 0,
        };
        let r = rt
            .handle_json(
                request(
                    1,
                    "tools/call",
                    json!({ "name": TOOL, "arguments": spec.to_arguments() }),
                ),
                &Owner::anonymous(),
            )
            .await
            .unwrap();
        ids.push(r["result"]["taskId"].as_str().unwrap().to_owned());
    }
    let mut out = Vec::new();
    for id in ids {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let g = rt
                .handle_json(
                    request(2, "tasks/get", json!({ "taskId": id })),
                    &Owner::anonymous(),
                )
                .await
                .unwrap();
            let s = g["result"]["status"].as_str().unwrap_or("").to_owned();
            if s != "working" {
                out.push((id.clone(), g["result"].clone()));
                break;
            }
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    rt.shutdown().await;
    out
}

/// Opens the damaged `path`: either a clear error naming the file, or every task reads
/// exactly as before (`Ok(true)`); `Err(description)` for anything else.
async fn open_damaged(
    path: &Path,
    effects: &Path,
    before: &[(String, Value)],
) -> Result<bool, String> {
    let started = mcp_tasks_testkit::sim::install(Runtime::builder(path), effects.to_path_buf())
        .start()
        .await;
    let rt = match started {
        Err(e) => {
            let msg = e.to_string();
            return if msg.contains(&path.display().to_string()) {
                Ok(false)
            } else {
                Err(format!("the start error does not name the file: {msg}"))
            };
        }
        Ok(rt) => rt,
    };
    let mut lost = Vec::new();
    for (id, want) in before {
        let g = rt
            .handle_json(
                request(3, "tasks/get", json!({ "taskId": id })),
                &Owner::anonymous(),
            )
            .await
            .unwrap();
        let got = &g["result"];
        // A live task may have moved on (its tool resumed); finished ones must be identical.
        let finished = want["status"] != "input_required";
        if got.is_null() || (finished && got != want) {
            lost.push(format!("{id}: was {want}, now {g}"));
        }
    }
    rt.shutdown().await;
    if lost.is_empty() {
        Ok(true)
    } else {
        Err(format!(
            "opened without an error but lost data: {}",
            lost.join("; ")
        ))
    }
}

fn copy_to(dir: &Path, original: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::copy(original, &p).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_store_file_is_a_clear_error_never_silent_loss() {
    let dir = tempfile::tempdir().unwrap();
    let original = dir.path().join("tasks.redb");
    let effects = dir.path().join("effects.log");
    let before = make_store(&original, &effects).await;
    let len = std::fs::metadata(&original).unwrap().len();
    let mut rng = Rng::new(7);
    let mut cuts: Vec<u64> = vec![1, 100, 511, 4096, len / 2, len - 1];
    cuts.extend((0..10).map(|_| rng.range(1, len)));
    let (mut errors, mut intact) = (0, 0);
    for (i, cut) in cuts.iter().enumerate() {
        let p = copy_to(dir.path(), &original, &format!("cut{i}.redb"));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(*cut)
            .unwrap();
        match open_damaged(&p, &effects, &before).await {
            Ok(false) => errors += 1,
            Ok(true) => intact += 1,
            Err(e) => panic!("truncated to {cut} of {len} bytes: {e}"),
        }
    }
    eprintln!(
        "truncation: {} cuts of a {len}-byte store: {errors} clear errors, {intact} opened intact",
        cuts.len()
    );
    assert!(errors > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_store_file_is_a_clear_error_never_silent_loss() {
    let dir = tempfile::tempdir().unwrap();
    let original = dir.path().join("tasks.redb");
    let effects = dir.path().join("effects.log");
    let before = make_store(&original, &effects).await;
    let bytes = std::fs::read(&original).unwrap();
    // The header (magic number) overwritten: a clear error naming the file.
    let p = copy_to(dir.path(), &original, "header.redb");
    let mut damaged = bytes.clone();
    damaged[..16].copy_from_slice(b"not a redb file!");
    std::fs::write(&p, &damaged).unwrap();
    assert_eq!(open_damaged(&p, &effects, &before).await, Ok(false));
    // Garbage instead of a store.
    let p = dir.path().join("garbage.redb");
    std::fs::write(&p, b"{\"this\": \"is json, not redb\"}").unwrap();
    assert_eq!(open_damaged(&p, &effects, &before).await, Ok(false));
    // Seeded byte flips anywhere: a clear error, or everything intact.
    let flips = env_u64("MCP_TASKS_FLIP_SEEDS", 40);
    let mut rng = Rng::new(replay_or(0xF11B));
    let (mut errors, mut intact) = (0, 0);
    let mut failures = Vec::new();
    for i in 0..flips {
        let p = copy_to(dir.path(), &original, &format!("flip{i}.redb"));
        let mut damaged = bytes.clone();
        let at = rng.range(0, damaged.len() as u64) as usize;
        damaged[at] ^= 1 << rng.range(0, 8);
        std::fs::write(&p, &damaged).unwrap();
        match open_damaged(&p, &effects, &before).await {
            Ok(false) => errors += 1,
            Ok(true) => intact += 1,
            Err(e) => failures.push(format!("flip at byte {at}: {e}")),
        }
    }
    eprintln!(
        "corruption: {flips} single-bit flips in a {}-byte store: {errors} clear errors, {intact} opened intact, {} silent losses",
        bytes.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn replay_or(default: u64) -> u64 {
    sim::replay_seed().unwrap_or(default)
}
