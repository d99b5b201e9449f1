//! Power-loss simulation: the runtime runs in process on a simulated disk (a redb
//! `StorageBackend` keeping the durable image apart from the live one). At a seeded write or
//! sync the power goes: the disk keeps what was synced plus a seeded choice of the unsynced
//! writes (the last one possibly torn). The store is reopened from that image, the runtime
//! rehydrates, the workload goes on; after the last crash the faults stop and every task must
//! finish. One checker (tests/sim/checker.rs) judges every seed.
//!
//! `MCP_TASKS_SEED=<seed>` replays one seed; `MCP_TASKS_POWER_SEEDS=<n>` sets the number of
//! seeds (default 1200); `MCP_TASKS_SOAK_SECS=<s>` runs seeds for that long instead.

mod sim;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use mcp_tasks::clock::Clock;
use mcp_tasks::sim::{SideEffect, SideEffects, StrictClock};
use mcp_tasks::store::{Store, StoreOptions};
use mcp_tasks::{Runtime, RuntimeConfig};
use sim::checker::{Allow, Ev, History, Kind, Report, check};
use sim::disk::SimDisk;
use sim::driver::{Alive, Driver, DriverConfig, InProc};
use sim::{Rng, env_u64, seeds, soak};

/// The side-effect log of one seed: survives the simulated power losses (it is the outside
/// world); a dead incarnation's steps cannot append to it.
#[derive(Default)]
pub struct MemLog {
    inner: Mutex<(Vec<SideEffect>, Option<u32>)>,
}

impl MemLog {
    fn begin(&self, epoch: u32) {
        self.inner.lock().unwrap().1 = Some(epoch);
    }

    fn kill(&self) {
        self.inner.lock().unwrap().1 = None;
    }

    fn effects(&self) -> Vec<SideEffect> {
        self.inner.lock().unwrap().0.clone()
    }
}

struct Incarnation {
    log: Arc<MemLog>,
    epoch: u32,
}

impl SideEffects for Incarnation {
    fn record(&self, task: &str, step: &str, value: &str) -> bool {
        let mut g = self.log.inner.lock().unwrap();
        if g.1 != Some(self.epoch) {
            return false;
        }
        g.0.push(SideEffect {
            task: task.to_owned(),
            step: step.to_owned(),
            value: value.to_owned(),
        });
        true
    }
}

fn config() -> RuntimeConfig {
    let mut c = RuntimeConfig::default();
    c.cancel_grace = Duration::from_millis(500);
    c.restart_backoff = Duration::from_millis(10);
    c.reaper_interval = Duration::from_millis(200);
    c
}

fn label(seed: u64) -> PathBuf {
    PathBuf::from(format!("simdisk-{seed:#018x}.redb"))
}

async fn start(
    seed: u64,
    disk: &SimDisk,
    clock: &Arc<StrictClock>,
    log: &Arc<MemLog>,
    epoch: u32,
) -> Result<Runtime, String> {
    let builder = Runtime::builder(label(seed))
        .store_backend(disk.factory())
        .clock(clock.clone() as Arc<dyn Clock>)
        .config(config());
    let sink = Arc::new(Incarnation {
        log: log.clone(),
        epoch,
    });
    mcp_tasks::sim::install_with(builder, sink)
        .start()
        .await
        .map_err(|e| e.to_string())
}

/// Opens the store on `disk` (recovering it), reads every task, closes it.
async fn read_store(seed: u64, disk: &SimDisk) -> Result<Vec<(String, Vec<u8>)>, String> {
    let store =
        Store::open_with_backend_async(label(seed), disk.factory(), StoreOptions::default())
            .await
            .map_err(|e| e.to_string())?;
    let tasks = store.tasks().await.map_err(|e| e.to_string());
    store.close().await;
    tasks
}

/// How a seed's run is broken on purpose (checker self-tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breakage {
    None,
    /// The disk acknowledges syncs without making anything durable (a lying fsync).
    LyingSyncs,
}

#[derive(Debug, Default)]
pub struct SeedRun {
    pub report: Report,
    pub crashes: u32,
    pub crashes_mid_run: u32,
    pub ops: u64,
}

/// How many disk ops (writes, set_len, syncs) a crash point is drawn from. An incarnation of
/// the default workload issues a few hundred; crash points past its end become a power cut
/// once the workload's actions are done.
const CRASH_WINDOW: u64 = 300;
const ACTIONS: usize = 40;

pub async fn run_seed(seed: u64, breakage: Breakage) -> SeedRun {
    let mut rng = Rng::new(seed);
    let clock = Arc::new(StrictClock::system());
    let history = Arc::new(History::default());
    let log = Arc::new(MemLog::default());
    let crashes = rng.range(1, 4) as u32;
    let mut disk = SimDisk::new();
    let mut driver = Driver::new(rng.fork(1), history.clone(), DriverConfig::default());
    let mut run = SeedRun::default();
    for epoch in 0..=crashes {
        let last = epoch == crashes;
        log.begin(epoch);
        if !last {
            disk.crash_after(rng.range(1, CRASH_WINDOW));
            let l = log.clone();
            disk.on_crash(move || l.kill());
        }
        let ops_before = disk.ops();
        match start(seed, &disk, &clock, &log, epoch).await {
            Err(e) => {
                if !disk.crashed() {
                    history.push(Ev::ReopenFailed { epoch, error: e });
                    break;
                }
            }
            Ok(rt) => {
                if breakage == Breakage::LyingSyncs && epoch == 0 {
                    disk.set_lying_syncs(true);
                }
                let conn = InProc(rt.handle());
                let alive: Alive = {
                    let d = disk.clone();
                    Arc::new(move || !d.crashed())
                };
                driver.run(&conn, epoch, ACTIONS, &alive).await;
                if last {
                    driver
                        .settle(&conn, epoch, Duration::from_secs(20), &alive)
                        .await;
                    driver.stop_listeners();
                    rt.shutdown().await;
                } else {
                    if disk.crashed() {
                        run.crashes_mid_run += 1;
                    }
                    disk.crash_now();
                    driver.stop_listeners();
                    drop(rt);
                }
            }
        }
        run.ops += disk.ops() - ops_before;
        if !last {
            run.crashes += 1;
            disk = SimDisk::from_image(disk.crash_image(&mut rng));
        }
        match read_store(seed, &disk).await {
            Ok(tasks) => history.durable(epoch, tasks),
            Err(error) => {
                history.push(Ev::ReopenFailed { epoch, error });
                break;
            }
        }
    }
    run.report = check(&history.events(), &log.effects(), &Allow::default());
    run
}

fn tokio_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs seeds (`parallel` at a time) until `count` are done or `until` passes.
fn run_many(
    seeds: Vec<u64>,
    until: Option<Instant>,
    breakage: Breakage,
) -> Vec<(u64, SeedRun)> {
    let parallel = env_u64("MCP_TASKS_PARALLEL", 4) as usize;
    tokio_rt().block_on(async move {
        futures::stream::iter(seeds)
            .take_while(|_| futures::future::ready(until.is_none_or(|t| Instant::now() < t)))
            .map(|seed| async move {
                let run = tokio::spawn(run_seed(seed, breakage))
                    .await
                    .unwrap_or_else(|e| panic!("seed {seed:#x} panicked: {e}"));
                (seed, run)
            })
            .buffer_unordered(parallel)
            .collect::<Vec<_>>()
            .await
    })
}

#[test]
fn power_loss_seeds_keep_every_invariant() {
    let started = Instant::now();
    let (list, until) = match soak() {
        Some(d) => (seeds(0x00C0_FFEE, u64::MAX >> 1), Some(started + d)),
        None => (seeds(0x00C0_FFEE, env_u64("MCP_TASKS_POWER_SEEDS", 1200)), None),
    };
    let runs = run_many(list, until, Breakage::None);
    let (mut crashes, mut mid, mut ops, mut tasks, mut obs, mut effects) = (0, 0, 0, 0, 0, 0);
    let mut failed = Vec::new();
    for (seed, run) in &runs {
        crashes += u64::from(run.crashes);
        mid += u64::from(run.crashes_mid_run);
        ops += run.ops;
        tasks += run.report.tasks;
        obs += run.report.observations;
        effects += run.report.step_executions;
        if !run.report.is_clean() {
            failed.push((*seed, run));
        }
    }
    eprintln!(
        "power loss: {} seeds, {} power losses ({} in the middle of the workload), {} disk ops, {} tasks, {} observations, {} step executions, {} failing seeds, {:.1}s",
        runs.len(),
        crashes,
        mid,
        ops,
        tasks,
        obs,
        effects,
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    for (seed, run) in failed.iter().take(5) {
        eprintln!(
            "\nseed {seed:#x} FAILED: {}\nreplay: MCP_TASKS_SEED={seed:#x} cargo test --test crash_power power_loss_seeds_keep_every_invariant -- --nocapture",
            run.report.summary(10)
        );
    }
    assert!(
        failed.is_empty(),
        "{} of {} power-loss seeds violated an invariant; first: {:#x}",
        failed.len(),
        runs.len(),
        failed[0].0
    );
}

/// The checker can fail: a disk whose fsync lies loses acknowledged work at the next power
/// loss, and the checker must say so.
#[test]
fn a_lying_fsync_is_caught() {
    let runs = run_many(seeds(0x0BAD_F5C, 16), None, Breakage::LyingSyncs);
    let caught: Vec<_> = runs
        .iter()
        .filter(|(_, r)| {
            r.report.has(Kind::LostCreation)
                || r.report.has(Kind::ObservedNotDurable)
                || r.report.has(Kind::LostUpdate)
                || r.report.has(Kind::Reopen)
        })
        .collect();
    eprintln!(
        "lying fsync: {} of {} seeds caught; e.g. {}",
        caught.len(),
        runs.len(),
        caught
            .first()
            .map(|(s, r)| format!("seed {s:#x}: {}", r.report.summary(3)))
            .unwrap_or_default()
    );
    assert!(
        caught.len() * 2 >= runs.len(),
        "the checker must report lost acknowledged work when fsync lies (caught {} of {})",
        caught.len(),
        runs.len()
    );
}
