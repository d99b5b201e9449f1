//! The power-loss simulation of one seed, shared by the power-loss suite and the failpoint
//! suite: the runtime runs in process on a [`SimDisk`]; each incarnation ends in a power loss
//! (at a seeded disk op, at a failpoint, or after its actions); the store is reopened from the
//! crash image; after the last crash the faults stop and every task must finish.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcp_tasks::clock::Clock;
use mcp_tasks::store::{Store, StoreOptions};
use mcp_tasks::{Runtime, RuntimeConfig};

use super::Rng;
use super::checker::{Allow, Ev, History, Report, check};
use super::disk::SimDisk;
use super::driver::{Driver, DriverConfig, InProc};
use crate::sim::{SideEffect, SideEffects, StrictClock};

/// Where the power goes in an incarnation (besides the end of its actions).
#[derive(Clone)]
pub enum CrashPlan {
    /// At a seeded write, set_len or sync among the next `window` disk ops.
    AtOp {
        /// How many disk ops the crash point is drawn from.
        window: u64,
    },
    /// When the test's failpoint callback calls [`CrashSwitch::fire`].
    External,
}

/// Lets code outside the seed (a failpoint callback) cut the power of the current incarnation,
/// and counts the callback's hits per incarnation.
#[derive(Clone, Default)]
pub struct CrashSwitch {
    disk: Arc<Mutex<Option<SimDisk>>>,
    hits: Arc<std::sync::atomic::AtomicU64>,
}

impl CrashSwitch {
    /// Cuts the power of the current incarnation now (nothing when none is armed).
    pub fn fire(&self) {
        if let Some(d) = self.disk.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            d.crash_now();
        }
    }

    /// Counts one hit of this incarnation; returns the count (from 1).
    pub fn hit(&self) -> u64 {
        self.hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
    }

    fn arm(&self, disk: Option<SimDisk>) {
        *self.disk.lock().unwrap_or_else(|e| e.into_inner()) = disk;
        self.hits.store(0, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The side-effect log of one seed: survives the simulated power losses (it is the outside
/// world); a dead incarnation's steps cannot append to it.
#[derive(Default)]
pub struct MemLog {
    inner: Mutex<(Vec<SideEffect>, Option<u32>)>,
}

impl MemLog {
    /// Incarnation `epoch` begins: its steps' side effects count.
    pub fn begin(&self, epoch: u32) {
        self.inner.lock().unwrap().1 = Some(epoch);
    }

    /// The current incarnation died: its steps' side effects no longer count.
    pub fn kill(&self) {
        self.inner.lock().unwrap().1 = None;
    }

    /// The side effects recorded so far.
    pub fn effects(&self) -> Vec<SideEffect> {
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

/// The runtime's configuration for incarnation `epoch`: every other incarnation parks a task
/// as soon as it waits for input (passivation at once), the others keep the default (its
/// actor stays; tasks found waiting at start are parked).
fn config(epoch: u32) -> RuntimeConfig {
    let mut c = RuntimeConfig::default();
    c.cancel_grace = Duration::from_millis(500);
    c.restart_backoff = Duration::from_millis(10);
    c.reaper_interval = Duration::from_millis(200);
    if epoch % 2 == 1 {
        c.passivate_after = Some(Duration::ZERO);
    }
    c
}

/// The store's path for `seed` (a name only: the bytes are on the [`SimDisk`]).
pub fn label(seed: u64) -> PathBuf {
    PathBuf::from(format!("simdisk-{seed:#018x}.redb"))
}

/// Starts the runtime of incarnation `epoch` on `disk` with store `options`.
pub async fn start_runtime_with(
    seed: u64,
    disk: &SimDisk,
    clock: &Arc<StrictClock>,
    log: &Arc<MemLog>,
    epoch: u32,
    options: StoreOptions,
) -> Result<Runtime, String> {
    let builder = Runtime::builder(label(seed))
        .store_options(options)
        .store_backend(disk.factory())
        .clock(clock.clone() as Arc<dyn Clock>)
        .config(config(epoch));
    let sink = Arc::new(Incarnation {
        log: log.clone(),
        epoch,
    });
    crate::sim::install_with(builder, sink)
        .start()
        .await
        .map_err(|e| e.to_string())
}

/// Opens the store on `disk` (recovering it), reads every task, closes it.
pub async fn read_store(seed: u64, disk: &SimDisk) -> Result<Vec<(String, Vec<u8>)>, String> {
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
    /// Nothing broken.
    None,
    /// The disk acknowledges syncs without making anything durable (a lying fsync).
    LyingSyncs,
}

/// What one seed's run came to.
#[derive(Debug, Default)]
pub struct SeedRun {
    /// The checker's verdict.
    pub report: Report,
    /// Power losses (every incarnation but the last).
    pub crashes: u32,
    /// Power losses while the incarnation's actions ran (at the crash point or a failpoint),
    /// not after them.
    pub crashes_mid_run: u32,
    /// Disk ops (writes, set_len, syncs) over all incarnations.
    pub ops: u64,
    /// Step executions (side effects) and journaled steps in the final store.
    pub effects: usize,
}

/// How many disk ops (writes, set_len, syncs) a crash point is drawn from. An incarnation of
/// the default workload issues a few hundred; crash points past its end become a power cut
/// once the workload's actions are done.
pub const CRASH_WINDOW: u64 = 300;
const ACTIONS: usize = 40;

/// Runs `seed`: power lost at seeded disk ops ([`CrashPlan::AtOp`] over [`CRASH_WINDOW`]), default
/// store options.
pub async fn run_seed(seed: u64, breakage: Breakage) -> SeedRun {
    run_seed_with(
        seed,
        breakage,
        CrashPlan::AtOp {
            window: CRASH_WINDOW,
        },
        None,
        StoreOptions::default(),
    )
    .await
}

/// [`run_seed`] with a crash plan; `switch` (if any) is armed with each incarnation's disk;
/// every incarnation opens the store with `options`.
pub async fn run_seed_with(
    seed: u64,
    breakage: Breakage,
    plan: CrashPlan,
    switch: Option<CrashSwitch>,
    options: StoreOptions,
) -> SeedRun {
    let mut rng = Rng::new(seed);
    let clock = Arc::new(StrictClock::system());
    let history = Arc::new(History::default());
    let log = Arc::new(MemLog::default());
    let crashes = rng.range(1, 4) as u32;
    // The store file exists before the first incarnation: a missing file is created
    // atomically (initialised aside, then renamed), which a backend cannot model.
    let mut disk = SimDisk::new();
    if let Err(error) = read_store(seed, &disk).await {
        history.push(Ev::ReopenFailed { epoch: 0, error });
    }
    let mut driver = Driver::new(rng.fork(1), history.clone(), DriverConfig::default());
    let mut run = SeedRun::default();
    for epoch in 0..=crashes {
        let last = epoch == crashes;
        log.begin(epoch);
        if let Some(s) = &switch {
            s.arm((!last).then(|| disk.clone()));
        }
        if !last {
            if let CrashPlan::AtOp { window } = plan {
                disk.crash_after(rng.range(1, window));
            }
            let l = log.clone();
            disk.on_crash(move || l.kill());
        }
        let ops_before = disk.ops();
        // A start that fails without a crash (an injected commit failure) is retried, as an
        // operator or a service manager would. A start makes several commits, each failing
        // at the injected rate (up to 14 %): 20 attempts make a run of failed starts
        // negligible (four, as before, failed a seed now and then).
        let mut started =
            start_runtime_with(seed, &disk, &clock, &log, epoch, options.clone()).await;
        for _ in 0..19 {
            if started.is_ok() || disk.crashed() {
                break;
            }
            started = start_runtime_with(seed, &disk, &clock, &log, epoch, options.clone()).await;
        }
        match started {
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
                let alive = disk.alive();
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
        // Read the durable state from a copy: the next incarnation must recover the crash
        // image itself.
        let copy = SimDisk::from_image(if last {
            disk.live_image()
        } else {
            disk.durable_image()
        });
        match read_store(seed, &copy).await {
            Ok(tasks) => history.durable(epoch, tasks),
            Err(error) => {
                history.push(Ev::ReopenFailed { epoch, error });
                break;
            }
        }
    }
    run.effects = log.effects().len();
    run.report = check(&history.events(), &log.effects(), &Allow::default());
    run
}
