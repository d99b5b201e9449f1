//! Power-loss simulation: the runtime runs in process on a simulated disk (a redb
//! `StorageBackend` keeping the durable image apart from the live one). At a seeded write or
//! sync the power goes: the disk keeps what was synced plus a seeded choice of the unsynced
//! writes (the last one possibly torn). The store is reopened from that image, the runtime
//! rehydrates, the workload goes on; after the last crash the faults stop and every task must
//! finish. One checker (crates/mcp-tasks-testkit/src/support/sim/checker.rs) judges every seed.
//!
//! `MCP_TASKS_SEED=<seed>` replays one seed; `MCP_TASKS_POWER_SEEDS=<n>` sets the number of
//! seeds (default 1200); `MCP_TASKS_SOAK_SECS=<s>` runs seeds for that long instead.

use crate::sim;

use std::time::{Duration, Instant};

use futures::StreamExt;
use mcp_tasks::store::StoreOptions;
use sim::checker::Kind;
use sim::power::{Breakage, CRASH_WINDOW, CrashPlan, SeedRun, run_seed, run_seed_with};
use sim::{env_u64, seed_stream, seeds, soak};

fn tokio_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs seeds (`parallel` at a time) until `count` are done or `until` passes.
fn run_many(
    seeds: Box<dyn Iterator<Item = u64> + Send>,
    until: Option<Instant>,
    breakage: Breakage,
) -> Vec<(u64, SeedRun)> {
    let parallel = env_u64("MCP_TASKS_PARALLEL", 4) as usize;
    tokio_rt().block_on(async move {
        futures::stream::iter(seeds)
            .take_while(|_| futures::future::ready(until.is_none_or(|t| Instant::now() < t)))
            .map(|seed| async move {
                let t = Instant::now();
                let run = tokio::spawn(run_seed(seed, breakage))
                    .await
                    .unwrap_or_else(|e| panic!("seed {seed:#x} panicked: {e}"));
                if t.elapsed() > Duration::from_secs(5) {
                    eprintln!("seed {seed:#x} took {:.1}s", t.elapsed().as_secs_f64());
                }
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
    let (list, until): (Box<dyn Iterator<Item = u64> + Send>, _) = match soak() {
        Some(d) => (seed_stream(0x00C0_FFEE), Some(started + d)),
        None => (
            Box::new(seeds(0x00C0_FFEE, env_u64("MCP_TASKS_POWER_SEEDS", 1200)).into_iter()),
            None,
        ),
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
            "\nseed {seed:#x} FAILED: {}\nreplay: MCP_TASKS_SEED={seed:#x} cargo test -p mcp-tasks-cli --test crash crash_power::power_loss_seeds_keep_every_invariant -- --nocapture",
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

/// The same workload with redb's quick repair (`StoreOptions::quick_repair`) and without the
/// check on open (`verify_on_open: false`): commits save the allocator state in two phases,
/// and the opens after the power losses take the quick path. Fewer seeds (`MCP_TASKS_QUICK_REPAIR_SEEDS`, default 120): the option changes how
/// redb commits and recovers, not the runtime.
#[test]
fn power_loss_seeds_with_quick_repair_keep_every_invariant() {
    let started = Instant::now();
    let count = env_u64("MCP_TASKS_QUICK_REPAIR_SEEDS", 120);
    let runs = tokio_rt().block_on(async move {
        futures::stream::iter(seeds(0x0051_CC4E, count))
            .map(|seed| async move {
                // The combination that makes restarts fast: no walk of the file at all.
                let options = StoreOptions {
                    quick_repair: true,
                    verify_on_open: false,
                    ..StoreOptions::default()
                };
                let plan = CrashPlan::AtOp {
                    window: CRASH_WINDOW,
                };
                let run = tokio::spawn(run_seed_with(seed, Breakage::None, plan, None, options))
                    .await
                    .unwrap_or_else(|e| panic!("seed {seed:#x} panicked: {e}"));
                (seed, run)
            })
            .buffer_unordered(env_u64("MCP_TASKS_PARALLEL", 4) as usize)
            .collect::<Vec<_>>()
            .await
    });
    let crashes: u32 = runs.iter().map(|(_, r)| r.crashes).sum();
    let failed: Vec<_> = runs.iter().filter(|(_, r)| !r.report.is_clean()).collect();
    eprintln!(
        "power loss with quick repair: {} seeds, {crashes} power losses, {} failing seeds, {:.1}s",
        runs.len(),
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    for (seed, run) in failed.iter().take(5) {
        eprintln!("\nseed {seed:#x} FAILED: {}", run.report.summary(10));
    }
    assert!(crashes > 0);
    assert!(
        failed.is_empty(),
        "{} of {} power-loss seeds with quick repair violated an invariant",
        failed.len(),
        runs.len()
    );
}

/// The checker can fail: a disk whose fsync lies loses acknowledged work at the next power
/// loss, and the checker must say so.
#[test]
fn a_lying_fsync_is_caught() {
    let runs = run_many(
        Box::new(seeds(0x00BA_DF5C, 16).into_iter()),
        None,
        Breakage::LyingSyncs,
    );
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
