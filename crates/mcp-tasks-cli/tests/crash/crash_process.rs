//! Process harness: the real `mcp-tasks serve --fixtures crash` binary on a redb file, driven
//! over Streamable HTTP by the seeded workload (crates/mcp-tasks-testkit/src/support/sim/driver.rs), SIGKILLed at seeded
//! moments (sometimes SIGSTOPped and SIGCONTed first, sometimes only paused), restarted on the
//! same store, and judged by the one checker (crates/mcp-tasks-testkit/src/support/sim/checker.rs). Between a kill and the
//! restart the harness opens the store file itself and records what is durable.
//!
//! `MCP_TASKS_SEED=<seed>` replays a run; `MCP_TASKS_KILL_CYCLES=<n>` sets the number of kill
//! cycles (default 220); `MCP_TASKS_SOAK_SECS=<s>` runs cycles for that long instead.
#![cfg(unix)]

use crate::sim;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcp_tasks::store::{Store, StoreOptions};
use mcp_tasks_testkit::sim::FileSideEffects;
use sim::checker::{Allow, Ev, History, check};
use sim::driver::{Alive, Conn, Driver, DriverConfig, always_alive};
use sim::http::Http;
use sim::process::{record_durable, signal};
use sim::{Rng, env_u64, seeds, soak};

// ---------------------------------------------------------------------------------------------
// The server process
// ---------------------------------------------------------------------------------------------

struct Server {
    child: Child,
    addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

/// The kill cycles test durability, not the restart budget: a task killed many times in a row
/// before it could make progress must not be given up there.
const KILL_CYCLE_BUDGET: &str = "1000000";

/// A server for kill cycle `cycle`: every other cycle's server parks a task as soon as it
/// waits for input (passivation at once), the others keep the default (30 s: its actor stays;
/// tasks found waiting at start are parked).
fn spawn_server(store: &Path, effects: &Path, cycle: u64) -> Result<Server, String> {
    let passivate_after = if cycle % 2 == 1 { "0s" } else { "30s" };
    spawn_server_with(
        store,
        effects,
        &[
            "--restart-budget",
            KILL_CYCLE_BUDGET,
            "--passivate-after",
            passivate_after,
        ],
    )
}

fn spawn_server_with(store: &Path, effects: &Path, extra: &[&str]) -> Result<Server, String> {
    // MCP_TASKS_BIN: run a copy of the binary (a long soak while the crate is rebuilt).
    let bin = std::env::var("MCP_TASKS_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_mcp-tasks").to_owned());
    let mut child = Command::new(bin)
        .args(["serve", "--listen", "127.0.0.1:0", "--fixtures", "crash"])
        .arg("--store")
        .arg(store)
        .arg("--side-effects")
        .arg(effects)
        .args(extra)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the server: {e}"))?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let l = log.clone();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.split("listening on http://").nth(1)
                && let Some(addr) = rest.strip_suffix("/mcp")
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(addr.trim().to_owned());
            }
            let mut l = l.lock().unwrap();
            if l.len() > 200 {
                l.remove(0);
            }
            l.push(line);
        }
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(addr) => Ok(Server {
            child,
            addr: addr
                .parse()
                .map_err(|e| format!("bad address {addr}: {e}"))?,
            log,
        }),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!(
                "the server did not start listening; its log:\n{}",
                log.lock().unwrap().join("\n")
            ))
        }
    }
}

/// Opens the store file of a stopped server, returns every task; then waits until the wall
/// clock has passed every stored `lastUpdatedAt`, so that the next server's timestamps are later.
async fn read_durable(path: &Path, history: &History, epoch: u32) -> Result<(), String> {
    // Read a copy: the restarted server must recover the file a crash left, itself.
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".inspect");
    let copy = path.with_file_name(name);
    std::fs::copy(path, &copy).map_err(|e| format!("cannot copy the store: {e}"))?;
    let store = Store::open_async(copy.clone(), StoreOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let tasks = store.tasks().await.map_err(|e| e.to_string());
    store.close().await;
    let _ = std::fs::remove_file(&copy);
    let tasks = tasks?;
    record_durable(history, epoch, tasks).await;
    Ok(())
}

#[derive(Debug, Default)]
struct Figures {
    kills: u64,
    stops: u64,
    pauses: u64,
    requests: u64,
    notifications: u64,
}

async fn run(
    seed: u64,
    cycles: u64,
    until: Option<Instant>,
    dir: &Path,
) -> (sim::checker::Report, Figures) {
    let mut rng = Rng::new(seed);
    let store = dir.join("tasks.redb");
    let effects = dir.join("side-effects.log");
    let history = Arc::new(History::default());
    let cfg = DriverConfig {
        max_tasks: 300,
        max_delay_ms: 20,
        ..DriverConfig::default()
    };
    let mut driver = Driver::new(rng.fork(1), history.clone(), cfg);
    let mut figures = Figures::default();
    let mut epoch = 0u32;
    let alive: Alive = always_alive();
    let mut server = spawn_server(&store, &effects, 0).unwrap_or_else(|e| panic!("{e}"));
    let mut cycle = 0;
    loop {
        let more = match until {
            Some(t) => Instant::now() < t,
            None => cycle < cycles,
        };
        if !more {
            break;
        }
        cycle += 1;
        // The workload runs while, at a seeded moment, the server is paused, or stopped and
        // killed, or just killed.
        let conn = Http { addr: server.addr };
        let kill_at = Duration::from_millis(rng.range(5, 250));
        let mode = rng.range(0, 10);
        let pause = Duration::from_millis(rng.range(20, 300));
        let killed = Arc::new(AtomicBool::new(false));
        let pid_child = &server.child;
        let pid = pid_child.id();
        let k = killed.clone();
        let killer = tokio::spawn(async move {
            tokio::time::sleep(kill_at).await;
            let sig = |s| unsafe {
                libc::kill(pid as libc::pid_t, s);
            };
            match mode {
                // SIGSTOP … SIGCONT, then carry on: a pause, not a crash.
                0..2 => {
                    sig(libc::SIGSTOP);
                    tokio::time::sleep(pause).await;
                    sig(libc::SIGCONT);
                    tokio::time::sleep(kill_at).await;
                    sig(libc::SIGKILL);
                }
                // Stopped, then killed while stopped.
                2..4 => {
                    sig(libc::SIGSTOP);
                    tokio::time::sleep(pause).await;
                    sig(libc::SIGKILL);
                }
                _ => sig(libc::SIGKILL),
            }
            k.store(true, Ordering::SeqCst);
        });
        let until_killed: Alive = {
            let k = killed.clone();
            Arc::new(move || !k.load(Ordering::SeqCst))
        };
        while until_killed() {
            driver.act(&conn, epoch, &alive).await;
        }
        let _ = killer.await;
        match mode {
            0..2 => {
                figures.pauses += 1;
            }
            2..4 => figures.stops += 1,
            _ => {}
        }
        figures.kills += 1;
        let status = server.child.wait();
        assert!(status.is_ok(), "waiting for the killed server failed");
        if let Err(e) = read_durable(&store, &history, epoch).await {
            history.push(Ev::ReopenFailed { epoch, error: e });
            break;
        }
        epoch += 1;
        server = match spawn_server(&store, &effects, cycle) {
            Ok(s) => s,
            Err(e) => {
                history.push(Ev::ReopenFailed {
                    epoch,
                    error: e.clone(),
                });
                panic!("seed {seed:#x}: restart {epoch} failed: {e}");
            }
        };
    }
    // Faults stop: a last stretch of work, then every task must finish (liveness).
    let conn = Http { addr: server.addr };
    driver.run(&conn, epoch, 50, &alive).await;
    driver
        .settle(&conn, epoch, Duration::from_secs(60), &alive)
        .await;
    driver.stop_listeners();
    signal(&server.child, libc::SIGTERM);
    let _ = server.child.wait();
    if let Err(e) = read_durable(&store, &history, epoch).await {
        history.push(Ev::ReopenFailed { epoch, error: e });
    }
    figures.requests = driver.counts.requests;
    figures.notifications = driver.counts.notifications;
    let effects = FileSideEffects::read(&effects).unwrap();
    let _ = server.log;
    (
        check(&history.events(), &effects, &Allow::default()),
        figures,
    )
}

/// Kill cycles per run: each run has its own store, seed and history (bounded memory and
/// checking time; a soak is many runs).
const CYCLES_PER_RUN: u64 = 55;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_and_sigstop_cycles_keep_every_invariant() {
    let started = Instant::now();
    let replay = sim::replay_seed();
    let mut seed_rng = Rng::new(seeds(0x5EED_0001, 1)[0]);
    let until = soak().map(|d| started + d);
    let cycles = env_u64("MCP_TASKS_KILL_CYCLES", 220);
    let mut total = Figures::default();
    let (mut runs, mut tasks, mut observations, mut effects) = (0u64, 0, 0, 0);
    let mut done = 0;
    loop {
        let more = match until {
            Some(t) => Instant::now() < t,
            None => done < cycles,
        };
        if !more || (replay.is_some() && runs == 1) {
            break;
        }
        let seed = replay.unwrap_or_else(|| seed_rng.next_u64());
        let n = match until {
            Some(_) => CYCLES_PER_RUN,
            None => CYCLES_PER_RUN.min(cycles.saturating_sub(done)).max(1),
        };
        let dir = tempfile::tempdir().unwrap();
        let (report, f) = run(seed, n, None, dir.path()).await;
        runs += 1;
        done += f.kills;
        total.kills += f.kills;
        total.pauses += f.pauses;
        total.stops += f.stops;
        total.requests += f.requests;
        total.notifications += f.notifications;
        tasks += report.tasks;
        observations += report.observations;
        effects += report.step_executions;
        eprintln!(
            "kill -9 run {runs}: seed {seed:#x}: {} cycles, {}",
            f.kills,
            report.summary(0)
        );
        assert!(
            report.is_clean(),
            "seed {seed:#x}: {}\nreplay: MCP_TASKS_SEED={seed:#x} cargo test -p mcp-tasks-cli --test crash crash_process:: -- --nocapture\nstore kept at {}",
            report.summary(20),
            {
                let kept: PathBuf = dir.keep();
                kept.display().to_string()
            }
        );
    }
    eprintln!(
        "kill -9: {runs} runs, {} kill cycles ({} with a SIGSTOP/SIGCONT pause first, {} killed while stopped), {} requests, {} notifications, {tasks} tasks, {observations} observations, {effects} step executions, 0 violations; {:.1}s",
        total.kills,
        total.pauses,
        total.stops,
        total.requests,
        total.notifications,
        started.elapsed().as_secs_f64()
    );
}

/// A poison pill: a tool that aborts the whole process shortly after every start. The task's
/// attempt counter is persisted before each restart of its tool, so after the restart budget
/// (3 restarts, the default) the next start fails the task instead of running it, and the
/// server stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_aborts_the_process_ends_failed_after_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("poison.redb");
    let effects = dir.path().join("effects.log");
    // The default budget (3 restarts).
    let mut server = spawn_server_with(&store, &effects, &[]).expect("the first start");
    let created = Http { addr: server.addr }
        .call(sim::driver::request(
            1,
            "tools/call",
            serde_json::json!({ "name": mcp_tasks_testkit::sim::ABORT_TOOL, "arguments": { "delayMs": 500 } }),
        ))
        .await
        .expect("the creation is answered before the abort");
    let task = created["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("not a task: {created}"))
        .to_owned();
    let mut aborts = 0;
    let failed = loop {
        // The tool aborts the process; a server that stays up has failed the task.
        let deadline = Instant::now() + Duration::from_secs(5);
        let exited = loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                break Some(status);
            }
            if Instant::now() > deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        match exited {
            Some(status) => {
                assert!(!status.success(), "the tool aborts the process: {status:?}");
                aborts += 1;
                assert!(aborts <= 6, "the poison pill was restarted {aborts} times");
            }
            None => {
                let got = Http { addr: server.addr }
                    .call(sim::driver::request(
                        2,
                        "tasks/get",
                        serde_json::json!({ "taskId": task }),
                    ))
                    .await
                    .expect("tasks/get");
                break got;
            }
        }
        // Restart on the same store (a start may itself be cut by the abort).
        server = loop {
            match spawn_server_with(&store, &effects, &[]) {
                Ok(s) => break s,
                Err(_) => {
                    aborts += 1;
                    assert!(aborts <= 6, "the poison pill was restarted {aborts} times");
                }
            }
        };
    };
    signal(&server.child, libc::SIGTERM);
    let _ = server.child.wait();
    eprintln!("poison pill: {aborts} aborts, then {failed}");
    assert_eq!(aborts, 4, "the first run and 3 restarts abort");
    assert_eq!(failed["result"]["status"], "failed", "{failed}");
    assert_eq!(failed["result"]["error"]["code"], -32603, "{failed}");
    assert_eq!(
        failed["result"]["error"]["message"],
        "The task was given up: its tool was started 4 times without making progress, each run ending in a crash, a kill or a panic.",
        "{failed}"
    );
}
