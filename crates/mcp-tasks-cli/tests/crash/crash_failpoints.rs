//! Failpoints at the dangerous spots (feature `failpoints`): each one is exercised by a
//! power-loss simulation that cuts the power exactly there (or, for the group commit, also
//! fails the batch), and the one checker judges the seeds. The test-only breakers
//! (`break::reply_before_commit`, `break::skip_step_journal`) must make the checker fail.
//!
//! The library's `failpoints` feature is on in every test build (the test crate's
//! dev-dependency). Failpoints are process-global, so each test runs in a process of its own
//! (`support::own_process`) and, there, holds `fail::FailScenario`: `cargo test` runs them
//! with the rest (`cargo test --test crash crash_failpoints::` alone).

use crate::sim;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use fail::FailScenario;
use mcp_tasks::store::StoreOptions;
use sim::checker::Kind;
use sim::power::{Breakage, CrashPlan, CrashSwitch, SeedRun, run_seed_with};
use sim::{env_u64, seeds};

fn seed_count() -> u64 {
    env_u64("MCP_TASKS_FAILPOINT_SEEDS", 40)
}

/// Runs seeds that cut the power at the `nth` hit (seeded, 1..=`max_nth`) of failpoint `name`
/// in each incarnation. Returns the runs and how often the failpoint fired a crash.
async fn crash_at_failpoint(name: &str, base: u64, max_nth: u64) -> (Vec<(u64, SeedRun)>, u64) {
    crash_at_failpoint_after(name, base, max_nth, 0).await
}

/// [`crash_at_failpoint`], holding the failing thread `delay_ms` before the power goes.
async fn crash_at_failpoint_after(
    name: &str,
    base: u64,
    max_nth: u64,
    delay_ms: u64,
) -> (Vec<(u64, SeedRun)>, u64) {
    let switch = CrashSwitch::default();
    let fired = Arc::new(AtomicU64::new(0));
    let target = Arc::new(AtomicU64::new(1));
    {
        let (switch, fired, target) = (switch.clone(), fired.clone(), target.clone());
        fail::cfg_callback(name, move || {
            if switch.hit() == target.load(Ordering::SeqCst) {
                fired.fetch_add(1, Ordering::SeqCst);
                if delay_ms > 0 {
                    std::thread::sleep(std::time::Duration::from_millis(delay_ms));
                }
                switch.fire();
            }
        })
        .unwrap();
    }
    let mut runs = Vec::new();
    for seed in seeds(base, seed_count()) {
        // Every incarnation of this seed crashes at the same seeded hit count.
        target.store(1 + seed % max_nth, Ordering::SeqCst);
        let run = run_seed_with(
            seed,
            Breakage::None,
            CrashPlan::External,
            Some(switch.clone()),
            StoreOptions::default(),
        )
        .await;
        runs.push((seed, run));
    }
    fail::remove(name);
    (runs, fired.load(Ordering::SeqCst))
}

fn assert_clean(name: &str, runs: &[(u64, SeedRun)], fired: u64) {
    let crashes: u32 = runs.iter().map(|(_, r)| r.crashes_mid_run).sum();
    eprintln!(
        "failpoint {name}: {} seeds, the failpoint cut the power {fired} times ({crashes} incarnations ended by it)",
        runs.len()
    );
    for (seed, run) in runs {
        assert!(
            run.report.is_clean(),
            "failpoint {name}, seed {seed:#x}: {}\nreplay: MCP_TASKS_SEED={seed:#x} cargo test --test crash crash_failpoints::",
            run.report.summary(10)
        );
    }
    assert!(fired > 0, "failpoint {name} was never reached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_after_commit_before_reply() {
    if !crate::support::own_process("crash_failpoints::power_loss_after_commit_before_reply").await
    {
        return;
    }
    let scenario = FailScenario::setup();
    let (runs, fired) = crash_at_failpoint("task::after_commit", 0xAF7E_0001, 20).await;
    assert_clean("task::after_commit", &runs, fired);
    let (runs, fired) = crash_at_failpoint("create::after_commit", 0xAF7E_0002, 6).await;
    assert_clean("create::after_commit", &runs, fired);
    scenario.teardown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_between_a_step_and_its_commit() {
    if !crate::support::own_process("crash_failpoints::power_loss_between_a_step_and_its_commit")
        .await
    {
        return;
    }
    let scenario = FailScenario::setup();
    let (runs, fired) = crash_at_failpoint("step::before_commit", 0x57E9_0001, 12).await;
    assert_clean("step::before_commit", &runs, fired);
    // Steps cut off before their commit run again (that is allowed and must be visible).
    let executions: usize = runs.iter().map(|(_, r)| r.effects).sum();
    eprintln!("step::before_commit: {executions} step executions in all");
    scenario.teardown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_during_rehydration() {
    if !crate::support::own_process("crash_failpoints::power_loss_during_rehydration").await {
        return;
    }
    let scenario = FailScenario::setup();
    let (runs, fired) = crash_at_failpoint("supervisor::rehydrate", 0x4E4D_0001, 4).await;
    assert_clean("supervisor::rehydrate", &runs, fired);
    scenario.teardown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_inside_a_group_commit() {
    if !crate::support::own_process("crash_failpoints::power_loss_inside_a_group_commit").await {
        return;
    }
    let scenario = FailScenario::setup();
    let (runs, fired) = crash_at_failpoint("store::group_commit", 0x6C0D_0001, 30).await;
    assert_clean("store::group_commit", &runs, fired);
    scenario.teardown();
}

/// A group commit that fails (the failpoint returns an error) fails every request of its batch
/// with -32603; the store reopens and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_group_commit_fails_its_batch_and_recovers() {
    if !crate::support::own_process(
        "crash_failpoints::a_failing_group_commit_fails_its_batch_and_recovers",
    )
    .await
    {
        return;
    }
    let scenario = FailScenario::setup();
    let mut failures = 0;
    for (i, seed) in seeds(0x6C0D_0002, seed_count()).into_iter().enumerate() {
        // Fail 1 group commit in 10 (seeded by the test order), power losses as usual.
        fail::cfg(
            "store::group_commit",
            &format!("{}%return(injected)", 5 + i % 10),
        )
        .unwrap();
        let run = run_seed_with(
            seed,
            Breakage::None,
            CrashPlan::AtOp {
                window: sim::power::CRASH_WINDOW,
            },
            None,
            StoreOptions::default(),
        )
        .await;
        fail::remove("store::group_commit");
        if !run.report.is_clean() {
            failures += 1;
            eprintln!(
                "seed {seed:#x}: {}\nreplay: MCP_TASKS_SEED={seed:#x} cargo test --test crash crash_failpoints::a_failing_group_commit",
                run.report.summary(10)
            );
        }
    }
    assert_eq!(
        failures, 0,
        "seeds with a failing group commit violated an invariant"
    );
    scenario.teardown();
}

/// Breaker 1: publishing a transition before its commit. A power loss then loses states that
/// clients saw: the checker must report it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_catches_reply_before_commit() {
    if !crate::support::own_process("crash_failpoints::the_checker_catches_reply_before_commit")
        .await
    {
        return;
    }
    let scenario = FailScenario::setup();
    fail::cfg("break::reply_before_commit", "return").unwrap();
    // Crash right after the publish, before the commit: at the failpoint after the commit of
    // the *previous* transition is too late, so cut the power inside the group commit.
    let (runs, _) = crash_at_failpoint_after("store::group_commit", 0xB4D0_0001, 30, 30).await;
    fail::remove("break::reply_before_commit");
    let caught: Vec<_> = runs
        .iter()
        .filter(|(_, r)| r.report.has(Kind::ObservedNotDurable))
        .collect();
    eprintln!(
        "reply before commit: {} of {} seeds caught; e.g. {}",
        caught.len(),
        runs.len(),
        caught
            .first()
            .map(|(s, r)| format!("seed {s:#x}: {}", r.report.summary(2)))
            .unwrap_or_default()
    );
    assert!(
        !caught.is_empty(),
        "the checker must report observed-but-not-durable states when replies precede commits"
    );
    scenario.teardown();
}

/// Breaker 2: skipping the step journal. Committed steps run again after every restart: the
/// side-effect log proves it and the checker must report it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_catches_a_skipped_step_journal() {
    if !crate::support::own_process("crash_failpoints::the_checker_catches_a_skipped_step_journal")
        .await
    {
        return;
    }
    let scenario = FailScenario::setup();
    fail::cfg("break::skip_step_journal", "return").unwrap();
    let mut caught = 0;
    let mut example = String::new();
    let list = seeds(0xB4D0_0002, 16);
    for seed in &list {
        let run = run_seed_with(
            *seed,
            Breakage::None,
            CrashPlan::AtOp {
                window: sim::power::CRASH_WINDOW,
            },
            None,
            StoreOptions::default(),
        )
        .await;
        if run.report.has(Kind::StepReExecuted) {
            caught += 1;
            if example.is_empty() {
                example = format!("seed {seed:#x}: {}", run.report.summary(2));
            }
        }
    }
    fail::remove("break::skip_step_journal");
    eprintln!(
        "skipped step journal: {caught} of {} seeds caught; e.g. {example}",
        list.len()
    );
    assert!(
        caught > 0,
        "the checker must report re-executed steps when the journal is skipped"
    );
    scenario.teardown();
}
