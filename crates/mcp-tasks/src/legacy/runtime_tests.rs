//! The legacy adapter over a real runtime: what following tasks costs (one watcher per task,
//! let go when the last follower goes) and what session records the store keeps.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::clock::ManualClock;
use crate::runtime::Runtime;
use crate::store::{Durability, StoreOptions};
use crate::tool::{CallToolResult, ToolDescriptor, tool_fn};

async fn runtime(dir: &Path, quotas: crate::quota::Quotas) -> Runtime {
    runtime_at(dir, quotas, ManualClock::new(START_MS)).await
}

const START_MS: u64 = 1_800_000_000_000;

async fn runtime_at(dir: &Path, quotas: crate::quota::Quotas, clock: ManualClock) -> Runtime {
    Runtime::builder(dir.join("legacy.redb"))
        .clock(Arc::new(clock))
        .store_options(StoreOptions {
            durability: Durability::None,
            ..StoreOptions::default()
        })
        .quotas(quotas)
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

/// A new admitted session of `owner`.
fn session(legacy: &Arc<Legacy>, owner: &Owner) -> Session {
    let init = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": { "protocolVersion": "2025-11-25", "capabilities": {} } });
    let (_, session) = legacy.initialize(&init, owner).unwrap();
    legacy.live(&session, owner).unwrap();
    session
}

async fn request(
    legacy: &Arc<Legacy>,
    session: &Session,
    owner: &Owner,
    method: &str,
    params: Value,
) -> Value {
    let message = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    let state = legacy.state(session).await;
    match legacy.handle(session, &state, owner, message, true).await {
        LegacyOutcome::Reply(reply) => reply,
        _ => panic!("one reply expected for {method}"),
    }
}

async fn forever_task(legacy: &Arc<Legacy>, session: &Session, owner: &Owner) -> String {
    let created = request(
        legacy,
        session,
        owner,
        "tools/call",
        json!({ "name": "forever", "arguments": {}, "task": {} }),
    )
    .await;
    created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {created}"))
        .to_owned()
}

/// Waits (bounded) until `f` holds.
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what} did not happen within 5 s");
}

#[tokio::test]
async fn many_sessions_following_one_task_share_one_watcher() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(dir.path(), crate::quota::Quotas::unlimited()).await;
    let legacy = Legacy::new(rt.handle());
    let bob = Owner::new("acme", "bob");
    let first = session(&legacy, &bob);
    let task = forever_task(&legacy, &first, &bob).await;
    // The review's reproduction, scaled: many sessions call tasks/get on the same task.
    let sessions: Vec<Session> = (0..64).map(|_| session(&legacy, &bob)).collect();
    for s in &sessions {
        for _ in 0..3 {
            let got = request(&legacy, s, &bob, "tasks/get", json!({ "taskId": task })).await;
            assert_eq!(got["result"]["status"], "working", "{got}");
        }
    }
    assert_eq!(legacy.watcher_counts(), (1, 1), "one watcher for the task");
    assert_eq!(legacy.watchers.followers(&task), (65, 0));
    // Every session got the task's status on its standing stream from that one watcher.
    for s in &sessions {
        let live = legacy.live(s, &bob).unwrap();
        until("the status notification", || {
            live.standing.has_any("notifications/tasks/status")
        })
        .await;
    }
    // Sessions that end let go; the last one stops the watcher.
    for s in &sessions {
        legacy.end(s).await.unwrap();
    }
    assert_eq!(legacy.watchers.followers(&task), (1, 0));
    legacy.forget(&first);
    assert_eq!(legacy.watcher_counts(), (0, 1), "no follower, no watcher");
    rt.shutdown().await;
}

#[tokio::test]
async fn a_watcher_stops_with_its_task_and_its_sessions_let_go() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(dir.path(), crate::quota::Quotas::unlimited()).await;
    let legacy = Legacy::new(rt.handle());
    let bob = Owner::new("acme", "bob");
    let s = session(&legacy, &bob);
    let task = forever_task(&legacy, &s, &bob).await;
    let live = legacy.live(&s, &bob).unwrap();
    assert_eq!((live.followed(), legacy.watcher_counts()), (1, (1, 1)));
    let cancelled = request(&legacy, &s, &bob, "tasks/cancel", json!({ "taskId": task })).await;
    assert_eq!(cancelled["result"]["status"], "cancelled", "{cancelled}");
    until("the watcher stops", || legacy.watcher_counts().0 == 0).await;
    assert_eq!(live.followed(), 0);
    rt.shutdown().await;
}

#[tokio::test]
async fn an_abandoned_tasks_result_lets_go_of_its_task() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(dir.path(), crate::quota::Quotas::unlimited()).await;
    let legacy = Legacy::new(rt.handle());
    let bob = Owner::new("acme", "bob");
    let s = session(&legacy, &bob);
    let task = forever_task(&legacy, &s, &bob).await;
    legacy.forget(&s); // only the tasks/result requests follow the task from now on
    assert_eq!(legacy.watcher_counts().0, 0);
    let s = session(&legacy, &bob);
    let mut waiting = Vec::new();
    for _ in 0..20 {
        let (legacy, s, bob, task) = (legacy.clone(), s.clone(), bob.clone(), task.clone());
        waiting.push(tokio::spawn(async move {
            request(&legacy, &s, &bob, "tasks/result", json!({ "taskId": task })).await
        }));
    }
    until("20 tasks/result follow the task", || {
        legacy.watchers.followers(&task) == (0, 20)
    })
    .await;
    assert_eq!(
        legacy.watcher_counts(),
        (1, 2),
        "one watcher for all of them"
    );
    // The clients go away (the HTTP transport aborts an unanswered tasks/result).
    for w in &waiting {
        w.abort();
    }
    until("the watcher stops", || legacy.watcher_counts().0 == 0).await;
    let live = legacy.live(&s, &bob).unwrap();
    assert!(!live.has_result_stream(&task));
    rt.shutdown().await;
}

async fn record(rt: &Runtime, key: &str) -> Option<Vec<u8>> {
    rt.handle().shared().store.meta_get(key).await.unwrap()
}

#[tokio::test]
async fn session_records_are_bounded_deleted_on_delete_and_at_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START_MS);
    let quotas = crate::quota::Quotas {
        max_session_records: 2,
        ..crate::quota::Quotas::unlimited()
    };
    let rt = runtime_at(dir.path(), quotas, clock.clone()).await;
    let legacy = Legacy::new(rt.handle());
    let bob = Owner::new("acme", "bob");
    let (a, b, c) = (
        session(&legacy, &bob),
        session(&legacy, &bob),
        session(&legacy, &bob),
    );
    // The review's reproduction, scaled: subscriptions of 2 KB until the record is full.
    let uri = |i: usize| format!("test://{i:04}/{}", "x".repeat(2000));
    let mut refused = None;
    for i in 0..256 {
        let r = request(
            &legacy,
            &a,
            &bob,
            "resources/subscribe",
            json!({ "uri": uri(i) }),
        )
        .await;
        if r.get("error").is_some() {
            refused = Some((i, r));
            break;
        }
    }
    let (i, refusal) = refused.expect("a full record refuses more subscriptions");
    assert!(i < 10, "refused after {i} subscriptions of 2 KB");
    assert_eq!(refusal["error"]["code"], -32602, "{refusal}");
    let stored = record(&rt, &a.state_key()).await.unwrap();
    assert!(
        stored.len() <= session::MAX_RECORD_BYTES,
        "{}",
        stored.len()
    );
    // A second session with a record is fine; a third is over max_session_records.
    let set = |s: &Session| {
        let (legacy, s, bob) = (legacy.clone(), s.clone(), bob.clone());
        async move {
            request(
                &legacy,
                &s,
                &bob,
                "logging/setLevel",
                json!({ "level": "info" }),
            )
            .await
        }
    };
    assert!(set(&b).await.get("result").is_some());
    let over = set(&c).await;
    assert_eq!(
        over["error"]["code"],
        crate::wire::error::code::QUOTA_EXCEEDED,
        "{over}"
    );
    assert_eq!(over["error"]["data"]["quota"], "sessionRecords", "{over}");
    assert_eq!(
        record(&rt, &c.state_key()).await,
        None,
        "nothing stored for the refusal"
    );
    // DELETE: what the session stored is gone; a tombstone keeps the id answering 404.
    legacy.end(&a).await.unwrap();
    let tombstone = record(&rt, &a.state_key()).await.unwrap();
    assert!(
        tombstone.len() <= 64,
        "{}",
        String::from_utf8_lossy(&tombstone)
    );
    assert_eq!(legacy.state(&a).await.subscriptions, Vec::<String>::new());
    let id = legacy.session_id(&a);
    assert_eq!(
        legacy.resolve(&id, &bob).await.err(),
        Some(SessionError::Ended)
    );
    // Ending made room for c.
    assert!(set(&c).await.get("result").is_some());
    // Once the ids expired, the owner's next write deletes every record of theirs.
    clock.advance(SESSION_LIFETIME.as_millis() as u64 + 1_000);
    let d = session(&legacy, &bob);
    assert!(set(&d).await.get("result").is_some());
    for s in [&a, &b, &c] {
        assert_eq!(record(&rt, &s.state_key()).await, None);
    }
    let index = session::RecordIndex::decode(&record(&rt, &d.index_key()).await.unwrap());
    assert_eq!(index.len(), 1, "only d is listed");
    rt.shutdown().await;
}

/// The meta keys under `prefix`, all of them (the test stores are small).
async fn keys(rt: &Runtime, prefix: &str) -> Vec<String> {
    let handle = rt.handle();
    let page = handle.shared().store.meta_page(prefix, None, 1000);
    page.await.unwrap().into_iter().map(|(k, _)| k).collect()
}

#[tokio::test]
async fn expired_session_records_of_an_owner_who_never_returns_are_swept() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START_MS);
    let quotas = crate::quota::Quotas {
        max_session_records: 4,
        ..crate::quota::Quotas::unlimited()
    };
    let rt = runtime_at(dir.path(), quotas, clock.clone()).await;
    let legacy = Legacy::new(rt.handle());
    // Bob opens sessions that store records, ends one (a tombstone), and never returns.
    let bob = Owner::new("acme", "bob");
    let bobs: Vec<Session> = (0..3).map(|_| session(&legacy, &bob)).collect();
    for (i, s) in bobs.iter().enumerate() {
        let r = request(
            &legacy,
            s,
            &bob,
            "resources/subscribe",
            json!({ "uri": format!("test://{i}/{}", "x".repeat(1000)) }),
        )
        .await;
        assert!(r.get("result").is_some(), "{r}");
    }
    legacy.end(&bobs[0]).await.unwrap();
    // Alice's session, opened later, outlives Bob's.
    clock.advance(SESSION_LIFETIME.as_millis() as u64 / 2);
    let alice = Owner::new("acme", "alice");
    let a = session(&legacy, &alice);
    let r = request(
        &legacy,
        &a,
        &alice,
        "logging/setLevel",
        json!({ "level": "info" }),
    )
    .await;
    assert!(r.get("result").is_some(), "{r}");
    assert_eq!(keys(&rt, session::STATE_PREFIX).await.len(), 4);
    assert_eq!(keys(&rt, session::INDEX_PREFIX).await.len(), 2);

    // Before any id expired, a sweep deletes nothing.
    let swept = legacy.sweep_records(1000).await.unwrap();
    assert_eq!((swept.records, swept.indexes, swept.complete), (0, 0, true));
    assert_eq!(keys(&rt, session::STATE_PREFIX).await.len(), 4);

    // Once Bob's ids expired, sweeps of two keys each (a walk over several sweeps) delete
    // every record of his, the tombstone and his index, and nothing of Alice's.
    clock.advance(SESSION_LIFETIME.as_millis() as u64 / 2 + 1_000);
    let mut sweeps = 0;
    loop {
        let swept = legacy.sweep_records(2).await.unwrap();
        assert!(swept.read <= 2, "{swept:?}");
        sweeps += 1;
        if swept.complete {
            break;
        }
        assert!(sweeps < 20, "the walk ends");
    }
    assert!(sweeps > 1, "a budget of two keys takes several sweeps");
    // A full walk after the one that went past the deletions leaves nothing of Bob's.
    legacy.sweep_records(1000).await.unwrap();
    for s in &bobs {
        assert_eq!(record(&rt, &s.state_key()).await, None);
    }
    assert_eq!(record(&rt, &bobs[0].index_key()).await, None, "Bob's index");
    assert_eq!(keys(&rt, session::STATE_PREFIX).await, vec![a.state_key()]);
    assert_eq!(keys(&rt, session::INDEX_PREFIX).await, vec![a.index_key()]);
    assert_eq!(legacy.state(&a).await.log_level.as_deref(), Some("info"));

    // The adapter sweeps on its own, on a timer: once Alice's id expired too, the store
    // keeps no session record at all.
    clock.advance(SESSION_LIFETIME.as_millis() as u64);
    tokio::time::pause();
    // Each turn lets a sweep start (virtual time) and run (the store's reads and writes take
    // real time): bounded turns, no real sleep.
    for _ in 0..500 {
        if keys(&rt, session::STATE_PREFIX).await.is_empty()
            && keys(&rt, session::INDEX_PREFIX).await.is_empty()
        {
            break;
        }
        tokio::time::sleep(sweep::SWEEP_EVERY).await;
    }
    assert_eq!(keys(&rt, session::STATE_PREFIX).await, Vec::<String>::new());
    assert_eq!(keys(&rt, session::INDEX_PREFIX).await, Vec::<String>::new());
    tokio::time::resume();
    rt.shutdown().await;
}
