//! The expiry reaper, driven pass by pass with a manual clock.

use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::clock::ManualClock;
use crate::store::{Durability, Expect};
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
    let mut config = RuntimeConfig::default();
    config.default_ttl = Some(ttl);
    config.expired_retention = retention;
    // The test runs the passes itself.
    config.reaper_interval = Duration::from_secs(3600);
    let mut options = StoreOptions::default();
    options.durability = Durability::None;
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
    let (_stop_tx, stop) = watch::channel(false);
    // 1,000 creations per simulated second, in steps of 100 ms, for 8 simulated seconds; one
    // reaper run (passes back to back) per step.
    let (mut stored, mut sizes, mut deleted) = (Vec::new(), Vec::new(), 0);
    for step in 0..80 {
        create_many(&rt, "instant", 100).await;
        clock.advance(100);
        let total = reap_due(&shared, &stop).await.unwrap();
        assert_eq!(total.quarantined, 0);
        deleted += total.deleted;
        if step % 10 == 9 {
            let (tasks, _live) = rt.store().counts().await.unwrap();
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
    // The file stops growing once deletions free as many pages as creations use.
    let (mid, end) = (sizes[3], sizes[7]);
    assert!(
        end <= mid + mid / 4,
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
    let (_stop_tx, stop) = watch::channel(false);
    // A record from "a newer build": first in the expiry index.
    let poison = "tsk_00000000000000000000000000000000";
    rt.store()
        .commit(vec![WriteOp::Put {
            id: poison.into(),
            bytes: vec![0xff, 0xff, 0xff, 0x07, 1, 2, 3],
            live: true,
            due_ms: Some(START_MS),
            seq: Some(1),
            expect: Expect::Absent,
        }])
        .await
        .unwrap();
    create_many(&rt, "forever", 20).await;
    create_many(&rt, "instant", 20).await;
    clock.advance(10_000);
    let first = reap_due(&shared, &stop).await.unwrap();
    assert_eq!(first.quarantined, 1, "{first:?}");
    assert_eq!(first.expired, 20, "every live task expired: {first:?}");
    // The poisoned record is left in place but no longer due.
    assert!(rt.store().get(poison).await.unwrap().is_some());
    clock.advance(10_000);
    let second = reap_due(&shared, &stop).await.unwrap();
    assert_eq!(second.quarantined, 0, "{second:?}");
    assert_eq!(second.deleted, 40, "{second:?}");
    let (tasks, _) = rt.store().counts().await.unwrap();
    assert_eq!(tasks, 1, "only the poisoned record is left");
    rt.shutdown().await;
}
