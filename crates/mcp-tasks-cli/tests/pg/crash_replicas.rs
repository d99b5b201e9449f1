//! Replica crash and partition suite: three `mcp-tasks serve --fixtures crash` replicas over
//! one PostgreSQL schema, driven over Streamable HTTP by the seeded workload
//! (crates/mcp-tasks-testkit/src/support/sim/driver.rs) with every request sent to a replica picked at random (create on one,
//! get/update/cancel/listen on others), while replicas are killed with SIGKILL (and restarted,
//! under the same node id or a new one) or paused with SIGSTOP/SIGCONT, sometimes past their
//! lease (the dangerous case: the paused replica wakes after its tasks were taken over). After
//! every fault cycle the harness reads the tasks table and records what is durable; the one
//! checker (crates/mcp-tasks-testkit/src/support/sim/checker.rs) judges the history.
//!
//! On replicas steps are at-least-once *across nodes*: a replica that was paused in the
//! middle of a step finishes it after the new owner committed the same step (its commit is
//! then refused), so `StepReExecuted` is allowed here; everything else is checked as on one
//! node. Without fencing (`serve --unsafe-skip-fencing`, test-only) the same workload ends
//! with a stale replica's record written over a newer one, which the checker reports.
//!
//! The main suite's replicas also share a flow-control limit (`--max-running '*=3'`): a slot
//! held by a replica that was killed or paused past its lease must come back with the lease,
//! or tasks stay queued and the final settle (every task finishes) fails.
//!
//! `MCP_TASKS_SEED=<seed>` replays a run; `MCP_TASKS_REPLICA_CYCLES=<n>` sets the number of
//! fault cycles (default 24); `MCP_TASKS_SOAK_SECS=<s>` runs cycles for that long instead.
#![cfg(all(unix, feature = "postgres"))]

use crate::pg;
use crate::sim;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use mcp_tasks_testkit::sim::FileSideEffects;
use serde_json::Value;
use sim::checker::{Allow, History, Kind, Report, check};
use sim::driver::{Alive, Conn, Driver, DriverConfig, always_alive, tag_replica};
use sim::http::Http;
use sim::process::{record_durable, signal};
use sim::{Rng, env_u64, seeds, soak};

const REPLICAS: usize = 3;
const LEASE_TTL: &str = "1s";
/// The flow-control limit of the main suite's replicas (`--max-running`), for the cluster.
const FLOW_LIMIT: &str = "*=3";

struct Replica {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Replica {
    fn drop(&mut self) {
        signal(&self.child, libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(store: &str, node: &str, effects: &Path, unfenced: bool, flow: bool) -> Replica {
    // MCP_TASKS_BIN: run a copy of the binary (a long soak while the crate is rebuilt).
    let bin = std::env::var("MCP_TASKS_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_mcp-tasks").to_owned());
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--fixtures", "crash"])
        .args([
            "--store",
            store,
            "--node-id",
            node,
            "--lease-ttl",
            LEASE_TTL,
        ])
        .args(["--restart-budget", "1000000", "--no-quotas"])
        .arg("--side-effects")
        .arg(effects)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if unfenced {
        cmd.arg("--unsafe-skip-fencing");
    }
    if flow {
        // A cluster-wide limit the workload fills: a slot leaked by a killed or paused
        // replica would leave tasks queued for ever, which the final settle reports.
        cmd.args(["--max-running", FLOW_LIMIT, "--replica-poll", "250ms"]);
    }
    let mut child = cmd.spawn().expect("start mcp-tasks serve");
    let stderr = child.stderr.take().unwrap();
    // Every line of the replica's log, appended to `<node>.log` beside the side-effect log
    // (kept when the check fails).
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(effects.with_file_name(format!("{node}.log")))
        .ok();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        let mut head = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(file) = log.as_mut() {
                use std::io::Write;
                let _ = writeln!(file, "{line}");
            }
            if let Some(rest) = line.split("listening on http://").nth(1)
                && let Some(addr) = rest.strip_suffix("/mcp")
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(Ok(addr.trim().to_owned()));
            }
            if tx.is_some() && head.len() < 50 {
                head.push(line);
            }
        }
        if let Some(tx) = tx {
            let _ = tx.send(Err(head.join("\n")));
        }
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(addr)) => Replica {
            child,
            addr: addr.parse().unwrap(),
        },
        other => {
            let _ = child.kill();
            panic!("replica {node} did not start: {other:?}");
        }
    }
}

/// Sends each request to a replica picked at random among those not killed.
struct Spread {
    addrs: Arc<Mutex<Vec<Option<SocketAddr>>>>,
    rng: Mutex<Rng>,
}

impl Spread {
    fn pick(&self) -> Option<SocketAddr> {
        let up: Vec<SocketAddr> = self
            .addrs
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .copied()
            .collect();
        self.rng.lock().unwrap().pick(&up).copied()
    }
}

/// Each answer and streamed message is tagged with the replica that sent it, for the history.
impl Conn for Spread {
    fn call(&self, message: Value) -> BoxFuture<'static, Result<Value, String>> {
        match self.pick() {
            Some(addr) => {
                let call = Http { addr }.call(message);
                Box::pin(async move { call.await.map(|v| tag_replica(v, &addr.to_string())) })
            }
            None => Box::pin(async { Err("no replica is up".to_owned()) }),
        }
    }

    fn listen(
        &self,
        message: Value,
    ) -> BoxFuture<'static, Result<BoxStream<'static, Value>, String>> {
        match self.pick() {
            Some(addr) => {
                let listen = Http { addr }.listen(message);
                Box::pin(async move {
                    let replica = addr.to_string();
                    listen
                        .await
                        .map(|stream| stream.map(move |m| tag_replica(m, &replica)).boxed())
                })
            }
            None => Box::pin(async { Err("no replica is up".to_owned()) }),
        }
    }
}

/// Records the tasks table as durable for `epoch`, then waits until the wall clock passed
/// every stored `lastUpdatedAt` (so later observations are strictly newer).
async fn read_durable(pg: &pg::Pg, history: &History, epoch: u32) {
    let client = pg.client().await;
    let rows = client
        .query("SELECT id, bytes FROM mcp_tasks ORDER BY id", &[])
        .await
        .expect("read the tasks table");
    let tasks: Vec<(String, Vec<u8>)> = rows.into_iter().map(|r| (r.get(0), r.get(1))).collect();
    record_durable(history, epoch, tasks).await;
}

#[derive(Debug, Default)]
struct Figures {
    kills: u64,
    pauses: u64,
    long_pauses: u64,
    /// PostgreSQL stopped and started again (runs on a private cluster only).
    db_restarts: u64,
    requests: u64,
}

/// How the replicas of a run are started.
#[derive(Clone, Copy)]
struct Setup {
    /// `--unsafe-skip-fencing` (the negative control).
    unfenced: bool,
    /// A cluster-wide flow-control limit ([`FLOW_LIMIT`]).
    flow: bool,
}

/// One run: `cycles` fault cycles (or until `until`) with its own schema and history.
async fn run(
    pg: &pg::Pg,
    seed: u64,
    cycles: u64,
    until: Option<Instant>,
    setup: Setup,
    dir: &Path,
    cluster: Option<Arc<pg::PrivateCluster>>,
) -> (Report, Figures) {
    let Setup { unfenced, flow } = setup;
    let mut rng = Rng::new(seed);
    let store = pg.url_with_schema();
    let effects = dir.join("side-effects.log");
    let history = Arc::new(History::default());
    let cfg = DriverConfig {
        max_tasks: 120,
        // Steps long enough that a pause often lands inside one.
        max_delay_ms: if unfenced { 400 } else { 150 },
        request_timeout: Duration::from_secs(4),
        ..DriverConfig::default()
    };
    let mut driver = Driver::new(rng.fork(1), history.clone(), cfg);
    let mut figures = Figures::default();
    let mut nodes: Vec<String> = (0..REPLICAS).map(|i| format!("n{i}")).collect();
    let mut replicas: Vec<Replica> = nodes
        .iter()
        .map(|n| spawn(&store, n, &effects, unfenced, flow))
        .collect();
    let addrs = Arc::new(Mutex::new(
        replicas.iter().map(|r| Some(r.addr)).collect::<Vec<_>>(),
    ));
    let conn = Spread {
        addrs: addrs.clone(),
        rng: Mutex::new(rng.fork(2)),
    };
    let alive: Alive = always_alive();
    let mut epoch = 0u32;
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
        let victim = rng.range(0, REPLICAS as u64) as usize;
        let at = Duration::from_millis(rng.range(50, 400));
        // Without fencing only pauses past the lease matter; with it, every kind of fault;
        // on a private cluster, a third of the cycles restart PostgreSQL itself.
        let mode = if unfenced {
            0
        } else if cluster.is_some() && rng.chance(33) {
            10
        } else {
            rng.range(0, 10)
        };
        let crash_db = rng.chance(50);
        let db = cluster.clone();
        let pause = Duration::from_millis(if rng.chance(50) || unfenced {
            rng.range(1300, 2600) // past the 1 s lease: the replica's tasks are taken over
        } else {
            rng.range(50, 600)
        });
        let pid = replicas[victim].child.id();
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let a = addrs.clone();
        let fault = tokio::spawn(async move {
            tokio::time::sleep(at).await;
            let sig = |s| unsafe {
                libc::kill(pid as libc::pid_t, s);
            };
            match mode {
                // PostgreSQL stops (fast, or immediate: recovery from the WAL) and starts
                // again after the pause; the replicas keep running.
                10 => {
                    if let Some(db) = db {
                        let stopper = db.clone();
                        tokio::task::spawn_blocking(move || {
                            if crash_db {
                                stopper.crash_server()
                            } else {
                                stopper.stop_server()
                            }
                        })
                        .await
                        .expect("stop PostgreSQL");
                        tokio::time::sleep(pause).await;
                        tokio::task::spawn_blocking(move || db.start_server())
                            .await
                            .expect("start PostgreSQL");
                    }
                }
                // SIGSTOP … SIGCONT: the replica stays, paused (requests to it wait).
                0..5 => {
                    sig(libc::SIGSTOP);
                    tokio::time::sleep(pause).await;
                    sig(libc::SIGCONT);
                }
                // Killed (sometimes while stopped): restarted below.
                _ => {
                    if mode < 7 {
                        sig(libc::SIGSTOP);
                        tokio::time::sleep(pause).await;
                    }
                    a.lock().unwrap()[victim] = None;
                    sig(libc::SIGKILL);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            d.store(true, Ordering::SeqCst);
        });
        while !done.load(Ordering::SeqCst) {
            driver.act(&conn, epoch, &alive).await;
        }
        let _ = fault.await;
        if mode == 10 {
            figures.db_restarts += 1;
        } else if mode >= 5 {
            figures.kills += 1;
            let _ = replicas[victim].child.wait();
            // Back under the same node id (it claims its own tasks at once) or a new one
            // (its old tasks are orphans until the lease lapses).
            if rng.chance(50) {
                nodes[victim] = format!("n{victim}c{cycle}");
            }
            replicas[victim] = spawn(&store, &nodes[victim], &effects, unfenced, flow);
            addrs.lock().unwrap()[victim] = Some(replicas[victim].addr);
        } else {
            figures.pauses += 1;
            if pause > Duration::from_secs(1) {
                figures.long_pauses += 1;
            }
        }
        driver.stop_listeners();
        read_durable(pg, &history, epoch).await;
        epoch += 1;
    }
    // Faults stop: a last stretch of work, then every task must finish (liveness).
    driver.run(&conn, epoch, 40, &alive).await;
    driver
        .settle(&conn, epoch, Duration::from_secs(60), &alive)
        .await;
    driver.stop_listeners();
    read_durable(pg, &history, epoch).await;
    figures.requests = driver.counts.requests;
    drop(replicas);
    let effects = FileSideEffects::read(&effects).unwrap_or_default();
    let allow = Allow {
        cross_node_step_reexecution: true,
        ..Allow::default()
    };
    (check(&history.events(), &effects, &allow), figures)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_killed_and_paused_past_their_lease_keep_every_invariant() {
    let started = Instant::now();
    let until = soak().map(|d| started + d);
    let cycles = env_u64("MCP_TASKS_REPLICA_CYCLES", 24);
    let seed = seeds(0x5EED_0A11, 1)[0];
    let Some(pg) = pg::fresh().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let (report, f) = run(
        &pg,
        seed,
        cycles,
        until,
        Setup {
            unfenced: false,
            flow: true,
        },
        dir.path(),
        None,
    )
    .await;
    eprintln!(
        "replicas: seed {seed:#x}, {REPLICAS} replicas sharing --max-running {FLOW_LIMIT}, {} kills, {} pauses ({} past the lease), {} requests: {}; {:.1}s",
        f.kills,
        f.pauses,
        f.long_pauses,
        f.requests,
        report.summary(20),
        started.elapsed().as_secs_f64()
    );
    assert!(
        report.is_clean(),
        "seed {seed:#x} (replay with MCP_TASKS_SEED={seed:#x}): {}; {}",
        report.summary(20),
        keep_logs(dir)
    );
    pg.drop().await;
}

/// The negative control: the same workload and faults with writes that skip the lease check.
/// A replica that wakes after its lease lapsed then writes its stale record over the new
/// owner's, and what the checker sees depends on what the new owner had done by then: a
/// finished task whose outcome changed (`TerminalChanged`), a sequence number holding two
/// records (`SeqBackwards`), a journal or a cancel flag that shrank (`Journal`), a lost
/// answer or cancellation. Any safety violation proves the point, since the fenced run of
/// the same workload has none. Whether a paused replica wakes in time to overwrite anything
/// is a matter of timing, so up to three seeds are tried before the test fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fencing_a_stale_replica_overwrites_newer_work() {
    const ATTEMPTS: u64 = 3;
    let mut clean = Vec::new();
    for seed in seeds(0xBAD_0F0E, ATTEMPTS) {
        let Some(pg) = pg::fresh().await else { return };
        let dir = tempfile::tempdir().unwrap();
        let (report, f) = run(
            &pg,
            seed,
            8,
            None,
            Setup {
                unfenced: true,
                flow: false,
            },
            dir.path(),
            None,
        )
        .await;
        pg.drop().await;
        let kinds: BTreeSet<Kind> = report.safety().map(|v| v.kind).collect();
        eprintln!(
            "unfenced replicas: seed {seed:#x}, {} pauses past the lease, violations of kinds {kinds:?}: {}",
            f.long_pauses,
            report.summary(5)
        );
        if !kinds.is_empty() {
            return;
        }
        clean.push(format!("{seed:#x}"));
    }
    panic!(
        "without fencing no stale replica overwrote anything in {ATTEMPTS} runs (seeds {}); the checker should have reported it",
        clean.join(", ")
    );
}

/// The same workload and faults with PostgreSQL itself restarting in a third of the cycles
/// (stopped fast, or immediately as in a crash, and started again after up to 2.6 s, past
/// the 1 s lease), on a private cluster so that the shared server is never touched. Requests
/// fail meanwhile; nothing acknowledged may be lost, and every invariant holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_and_postgres_restarts_keep_every_invariant() {
    let started = Instant::now();
    let until = soak().map(|d| started + d);
    let cycles = env_u64("MCP_TASKS_REPLICA_CYCLES", 24);
    let seed = seeds(0x5EED_0DB5, 1)[0];
    let Some(cluster) = pg::PrivateCluster::start() else {
        return;
    };
    let cluster = Arc::new(cluster);
    let pg = cluster.fresh().await;
    let dir = tempfile::tempdir().unwrap();
    let (report, f) = run(
        &pg,
        seed,
        cycles,
        until,
        Setup {
            unfenced: false,
            flow: false,
        },
        dir.path(),
        Some(cluster.clone()),
    )
    .await;
    eprintln!(
        "replicas and PostgreSQL restarts: seed {seed:#x}, {REPLICAS} replicas, {} PostgreSQL restarts, {} kills, {} pauses ({} past the lease), {} requests: {}; {:.1}s",
        f.db_restarts,
        f.kills,
        f.pauses,
        f.long_pauses,
        f.requests,
        report.summary(20),
        started.elapsed().as_secs_f64()
    );
    assert!(f.db_restarts > 0 || cycles < 4, "PostgreSQL was restarted");
    assert!(
        report.is_clean(),
        "seed {seed:#x} (replay with MCP_TASKS_SEED={seed:#x}): {}; {}",
        report.summary(20),
        keep_logs(dir)
    );
}

/// Keeps a failed run's folder (each replica's log, `<node>.log`, and the side-effect log)
/// and says where it is.
fn keep_logs(dir: tempfile::TempDir) -> String {
    format!("the replicas' logs are kept in {}", dir.keep().display())
}
