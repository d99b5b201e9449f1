//! The expiry reaper, driven pass by pass with a manual clock.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::clock::ManualClock;
use crate::store::{Durability, Expect};
use crate::task::TaskRecord;
use crate::tool::{CallToolResult, TaskPolicy, ToolDescriptor, tool_fn};

const START_MS: u64 = 1_800_000_000_000;

fn create_request(id: u64, tool: &str) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {
            "name": tool, "arguments": {},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities":
                    { "extensions": { "io.modelcontextprotocol/tasks": {} } }
            }
        }
    })
}

async fn start(dir: &Path, clock: &ManualClock, ttl: Duration, retention: Duration) -> Runtime {
    let config = RuntimeConfig {
        default_ttl: Some(ttl),
        expired_retention: retention,
        // The test runs the passes itself.
        reaper_interval: Duration::from_secs(3600),
        ..RuntimeConfig::default()
    };
    let options = StoreOptions {
        durability: Durability::None,
        ..StoreOptions::default()
    };
    Runtime::builder(dir.join("reaper.redb"))
        .clock(Arc::new(clock.clone()))
        .config(config)
        .store_options(options)
        .tool(tool_fn(
            ToolDescriptor::new("instant", "completes at once").task_policy(TaskPolicy::Always),
            |_ctx, _| async { Ok(CallToolResult::text("done")) },
        ))
        .tool(tool_fn(
            ToolDescriptor::new("forever", "never ends").task_policy(TaskPolicy::Always),
            |_ctx, _| async {
                std::future::pending::<()>().await;
                Ok(CallToolResult::text("unreachable"))
            },
        ))
        .start()
        .await
        .unwrap()
}

async fn create_many(rt: &Runtime, tool: &str, n: u64) {
    let handle = rt.handle();
    let calls = (0..n).map(|i| {
        let handle = handle.clone();
        async move {
            let r = handle
                .handle_json(create_request(i, tool), &Owner::anonymous())
                .await
                .unwrap();
            assert_eq!(r["result"]["resultType"], "task", "{r}");
        }
    });
    futures::future::join_all(calls).await;
}

fn file_len(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("reaper.redb")).unwrap().len()
}

/// Sustained creation far above the old ceiling (256 per pass) with a short time to live: the
/// stored tasks and the file size level off, because each pass deletes everything due in one
/// commit and passes run back to back while full batches are due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sustained_creation_with_a_short_ttl_levels_off() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START_MS);
    let rt = start(
        dir.path(),
        &clock,
        Duration::from_secs(1),
        Duration::from_secs(1),
    )
    .await;
    let shared = rt.dispatcher.shared.clone();
    let supervisor = rt.dispatcher.supervisor.clone();
    let (_stop_tx, stop) = watch::channel(false);
    // 1,000 creations per simulated second, in steps of 100 ms, for 8 simulated seconds; one
    // reaper run (passes back to back) per step.
    let (mut stored, mut sizes, mut deleted) = (Vec::new(), Vec::new(), 0);
    for step in 0..80 {
        create_many(&rt, "instant", 100).await;
        clock.advance(100);
        let total = reap_due(&shared, &supervisor, &stop).await.unwrap();
        assert_eq!(total.quarantined, 0);
        deleted += total.deleted;
        if step % 10 == 9 {
            let (tasks, _live) = rt.shared_store().counts().await.unwrap();
            stored.push(tasks);
            sizes.push(file_len(dir.path()));
        }
    }
    eprintln!(
        "stored tasks per simulated second: {stored:?}; file sizes: {sizes:?}; deleted {deleted}"
    );
    // At 1,000/s, a task is stored for its ttl plus retention (2 s) plus one step: at most
    // 2,200 tasks, from the third second on.
    let bound = 1000 * 2 + 200;
    assert!(
        stored[2..].iter().all(|n| *n <= bound),
        "stored tasks must level off below {bound}: {stored:?}"
    );
    assert!(deleted > 5_000, "the reaper deleted {deleted}");
    // The file stops growing once deletions free as many pages as creations use. redb grows a
    // file by doubling a region, and with the owner index a record takes more pages: one more
    // doubling after the third second may come while the freed pages settle (seen on a loaded
    // machine), but no more. Without page reuse the writes of seconds 4 to 8 (more than all
    // those before) would double the file at least twice.
    let (mid, end) = (sizes[3], sizes[7]);
    assert!(
        end <= 2 * mid + mid / 4,
        "the store file must level off: {sizes:?}"
    );
    rt.shutdown().await;
}

/// A record that does not decode is quarantined (logged, taken out of the expiry index, left
/// in place) and does not stop the expiry or deletion of the others, also when it is first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_record_does_not_stop_the_reaper() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START_MS);
    let rt = start(
        dir.path(),
        &clock,
        Duration::from_secs(10),
        Duration::from_secs(10),
    )
    .await;
    let shared = rt.dispatcher.shared.clone();
    let supervisor = rt.dispatcher.supervisor.clone();
    let (_stop_tx, stop) = watch::channel(false);
    // A record from "a newer build": first in the expiry index.
    let poison = "tsk_00000000000000000000000000000000";
    rt.shared_store()
        .commit(vec![WriteOp::Put {
            id: poison.into(),
            bytes: vec![0xff, 0xff, 0xff, 0x07, 1, 2, 3],
            constant_tail: 0,
            live: true,
            due_ms: Some(START_MS),
            seq: Some(1),
            expect: Expect::Absent,
            owner: None,
            listing: None,
        }])
        .await
        .unwrap();
    create_many(&rt, "forever", 20).await;
    create_many(&rt, "instant", 20).await;
    // The instant tasks finish (their actors stop) before the clock moves.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while rt.live_tasks() > 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "instant tasks never finished"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    clock.advance(10_000);
    let first = reap_due(&shared, &supervisor, &stop).await.unwrap();
    assert_eq!(first.quarantined, 1, "{first:?}");
    assert_eq!(first.expired, 20, "every live task expired: {first:?}");
    // The poisoned record is left in place but no longer due.
    assert!(rt.shared_store().get(poison).await.unwrap().is_some());
    clock.advance(10_000);
    let second = reap_due(&shared, &supervisor, &stop).await.unwrap();
    assert_eq!(second.quarantined, 0, "{second:?}");
    assert_eq!(second.deleted, 40, "{second:?}");
    let (tasks, _) = rt.shared_store().counts().await.unwrap();
    assert_eq!(tasks, 1, "only the poisoned record is left");
    rt.shutdown().await;
}

/// A seeded xorshift generator shared by the runs of a tool.
struct Rng(std::sync::Mutex<u64>);

impl Rng {
    fn next(&self) -> u64 {
        let mut s = self.0.lock().unwrap();
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }
}

/// Expiry (the reaper, and tasks found expired when their actor restarts) and giving up (the
/// restart budget) race actor restarts of panicking tools, over many seeds. Every task's
/// record, as the runtime serves it (live snapshot or store), is sampled all along: the
/// sequence number never goes backwards and a terminal record never changes.
///
/// Without the second look at the live map in `Shared::load_as`, about one run in twelve saw a
/// task served `failed` (seq n+1) and then `working` (seq n): a read that went to the store
/// while a new actor's first commit was in flight (docs/CRASH-TESTING.md). More seeds:
/// `MCP_TASKS_RACE_SEEDS=n cargo test --lib racing`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_and_give_up_racing_restarts_never_change_a_terminal_state() {
    let seeds: u64 = std::env::var("MCP_TASKS_RACE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for seed in 1..=seeds {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(START_MS);
        let rng = Arc::new(Rng(std::sync::Mutex::new(
            seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        )));
        let config = RuntimeConfig {
            default_ttl: Some(Duration::from_secs(1)),
            restart_budget: 1,
            restart_backoff: Duration::from_millis(1),
            reaper_interval: Duration::from_secs(3600),
            ..RuntimeConfig::default()
        };
        let options = StoreOptions {
            durability: Durability::None,
            ..StoreOptions::default()
        };
        let tool_rng = rng.clone();
        let rt = Runtime::builder(dir.path().join("race.redb"))
            .clock(Arc::new(clock.clone()))
            .config(config)
            .store_options(options)
            .tool(tool_fn(
                ToolDescriptor::new("flaky", "panics or works, by the seed")
                    .task_policy(TaskPolicy::Always),
                move |ctx, _| {
                    let rng = tool_rng.clone();
                    async move {
                        for i in 0..(rng.next() % 4) {
                            tokio::time::sleep(Duration::from_micros(rng.next() % 500)).await;
                            ctx.step(&format!("s{i}"), || async { Ok(i) }).await?;
                        }
                        if rng.next().is_multiple_of(3) {
                            panic!("flaky tool panics");
                        }
                        tokio::time::sleep(Duration::from_millis(rng.next() % 5)).await;
                        Ok(CallToolResult::text("done"))
                    }
                },
            ))
            .start()
            .await
            .unwrap();
        let shared = rt.dispatcher.shared.clone();
        let supervisor = rt.dispatcher.supervisor.clone();
        let handle = rt.handle();
        let mut ids = Vec::new();
        for i in 0..8 {
            let r = handle
                .handle_json(create_request(i, "flaky"), &Owner::anonymous())
                .await
                .unwrap();
            ids.push(crate::task::TaskId::parse(r["result"]["taskId"].as_str().unwrap()).unwrap());
        }
        // The observer samples every task until told to stop.
        let (stop_tx, stop) = watch::channel(false);
        let observer = {
            let shared = shared.clone();
            let ids = ids.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut seen: HashMap<String, (u64, Option<Arc<TaskRecord>>)> = HashMap::new();
                let mut violations = Vec::new();
                loop {
                    let done = *stop.borrow();
                    for id in &ids {
                        let Ok(Some(record)) = shared.load(id).await else {
                            continue;
                        };
                        let entry = seen.entry(id.to_string()).or_insert((0, None));
                        if record.seq < entry.0 {
                            violations.push(format!("{id}: seq {} after {}", record.seq, entry.0));
                        }
                        if let Some(terminal) = &entry.1
                            && **terminal != *record
                        {
                            violations.push(format!(
                                "{id}: terminal {} (seq {}) became {} (seq {})",
                                terminal.status.as_str(),
                                terminal.seq,
                                record.status.as_str(),
                                record.seq
                            ));
                        }
                        entry.0 = entry.0.max(record.seq);
                        if record.status.is_terminal() && entry.1.is_none() {
                            entry.1 = Some(record.clone());
                        }
                    }
                    if done {
                        return (violations, seen);
                    }
                    tokio::task::yield_now().await;
                }
            })
        };
        // Let restarts get under way, then expire everything while they run, with reaper
        // passes racing them.
        tokio::time::sleep(Duration::from_millis(rng.next() % 15)).await;
        clock.advance(1_000);
        let (_reaper_stop_tx, reaper_stop) = watch::channel(false);
        for _ in 0..(1 + rng.next() % 3) {
            let _ = reap_due(&shared, &supervisor, &reaper_stop).await;
            tokio::time::sleep(Duration::from_micros(rng.next() % 2_000)).await;
        }
        // Whatever is left expires at the next passes.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let _ = reap_due(&shared, &supervisor, &reaper_stop).await;
            let mut all = true;
            for id in &ids {
                let r = shared.load(id).await.unwrap().unwrap();
                all &= r.status.is_terminal();
            }
            if all {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "seed {seed}: tasks never ended"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        stop_tx.send(true).unwrap();
        let (violations, seen) = observer.await.unwrap();
        assert!(
            violations.is_empty(),
            "seed {seed}: {violations:#?}\nreplay: MCP_TASKS_RACE_SEEDS={seed} cargo test --lib racing"
        );
        for (_, (_, terminal)) in seen {
            if let Some(t) = terminal {
                let key = match &t.outcome {
                    Some(crate::task::TaskOutcome::Error(e)) if e.message.contains("expired") => {
                        "failed (expired)"
                    }
                    Some(crate::task::TaskOutcome::Error(e)) if e.message.contains("given up") => {
                        "failed (given up)"
                    }
                    _ => t.status.as_str(),
                };
                *outcomes.entry(key.to_owned()).or_default() += 1;
            }
        }
        rt.shutdown().await;
    }
    eprintln!("race outcomes over {seeds} seeds: {outcomes:?}");
    assert!(outcomes.contains_key("failed (expired)"), "{outcomes:?}");
}
