//! The runtime over the PostgreSQL store: the protocol round trip, restarts resuming from the
//! journal on another node, schema versions, leases with fencing (in process), and the
//! database going away and coming back. Each test has a schema of its own (crates/mcp-tasks-cli/tests/pg).
#![cfg(feature = "postgres")]

use crate::pg;
use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use mcp_tasks::store::{Cluster, PostgresOptions, PostgresStore, Store, StoreError, TaskStore};
use mcp_tasks::tool::{CallToolResult, InputRequest, TaskPolicy, ToolDescriptor, tool_fn};
use mcp_tasks::{Owner, Runtime, RuntimeBuilder, RuntimeConfig};
use serde_json::{Value, json};
use support::embedded::{call, create, get, req, wait_status};

/// `journaled`: one journaled step (counted in `runs`), then asks for `confirm`, then
/// completes with the step's value and the answer.
fn journaled(runs: Arc<AtomicUsize>) -> Arc<dyn mcp_tasks::tool::Tool> {
    tool_fn(
        ToolDescriptor::new("journaled", "a step, then a question").task_policy(TaskPolicy::Always),
        move |ctx, _| {
            let runs = runs.clone();
            async move {
                let n = ctx
                    .step("prepare", || async move {
                        Ok(runs.fetch_add(1, Ordering::SeqCst) + 1)
                    })
                    .await?;
                let schema = json!({
                    "type": "object",
                    "properties": { "confirm": { "type": "boolean" } },
                    "required": ["confirm"]
                });
                let answer = ctx
                    .input("confirm", InputRequest::elicit_form("Sure?", schema))
                    .await?;
                Ok(CallToolResult::text(format!(
                    "step run {n}; answer {answer}"
                )))
            }
        },
    )
}

fn builder(store: Store) -> RuntimeBuilder {
    let mut config = RuntimeConfig::default();
    config.restart_backoff = Duration::from_millis(10);
    Runtime::builder_with_store(store).config(config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_get_update_cancel_and_restart_on_another_node() {
    let Some(pg) = pg::fresh().await else { return };
    let runs = Arc::new(AtomicUsize::new(0));
    let ttl = Duration::from_secs(5);
    let a = Store::postgres(&pg.url, pg.options("a", ttl))
        .await
        .unwrap();
    let rt = builder(a)
        .tool(journaled(runs.clone()))
        .tool(mcp_tasks_testkit::fixtures::bench::sleep_task_on(Some(
            "a".into(),
        )))
        .start()
        .await
        .unwrap();
    // Durable before return: the record is in the database when the handle comes back.
    let task = create(&rt, "journaled", json!({})).await;
    let waiting = wait_status(&rt, &task, "input_required").await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(waiting["inputRequests"]["confirm"].is_object(), "{waiting}");
    let sleeper = create(&rt, "sleep_task", json!({ "ms": 600_000 })).await;
    let cancelled = call(&rt, "tasks/cancel", json!({ "taskId": sleeper })).await;
    assert!(cancelled.get("result").is_some(), "{cancelled}");
    wait_status(&rt, &sleeper, "cancelled").await;
    // A clean shutdown hands the leases over at once.
    rt.shutdown().await;

    let b = Store::postgres(&pg.url, pg.options("b", ttl))
        .await
        .unwrap();
    let rt = builder(b)
        .tool(journaled(runs.clone()))
        .start()
        .await
        .unwrap();
    let again = wait_status(&rt, &task, "input_required").await;
    assert_eq!(again["inputRequests"], waiting["inputRequests"]);
    let r = call(
        &rt,
        "tasks/update",
        json!({ "taskId": task, "inputResponses": { "confirm": { "action": "accept", "content": { "confirm": true } } } }),
    )
    .await;
    assert!(r.get("result").is_some(), "{r}");
    let done = wait_status(&rt, &task, "completed").await;
    let text = done["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("step run 1;"), "{text}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the committed step is not run again on the node that took the task over"
    );
    let (stored, live) = mcp_tasks::internals::runtime_store(&rt)
        .counts()
        .await
        .unwrap();
    assert_eq!((stored, live), (2, 0));
    rt.shutdown().await;
    pg.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_and_left_alone() {
    let Some(pg) = pg::fresh().await else { return };
    let opts = pg.options("a", Duration::from_secs(5));
    let store = PostgresStore::open(&pg.url, opts.clone()).await.unwrap();
    store.close().await;
    let client = pg.client().await;
    client
        .batch_execute("INSERT INTO mcp_schema (version) VALUES (99)")
        .await
        .unwrap();
    match PostgresStore::open(&pg.url, opts).await {
        Err(e @ StoreError::SchemaTooNew { found: 99, .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("upgrade mcp-tasks"), "{msg}");
            assert!(!msg.contains("password"), "{msg}");
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    let versions: i64 = client
        .query_one("SELECT count(*) FROM mcp_schema", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        versions,
        mcp_tasks::store::postgres::SCHEMA_VERSION + 1,
        "nothing was changed"
    );
    pg.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_node_ids_are_clear_errors() {
    let e = PostgresStore::open("postgres://u@h:notaport/db", PostgresOptions::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("does not parse"), "{e}");
    let Some(pg) = pg::fresh().await else { return };
    let mut opts = pg.options("a", Duration::from_secs(5));
    opts.node_id = Some("no spaces".into());
    let e = PostgresStore::open(&pg.url, opts).await.unwrap_err();
    assert!(e.to_string().contains("invalid node id"), "{e}");
    // A search_path naming a schema that does not exist says how to fix it.
    let url = format!("{}?options=-c%20search_path%3Dno_such_schema_x", pg.url);
    let mut opts = pg.options("a", Duration::from_secs(5));
    opts.schema = None;
    let e = PostgresStore::open(&url, opts).await.unwrap_err();
    assert!(e.to_string().contains("CREATE SCHEMA"), "{e}");
    pg.drop().await;
}

/// `hold`: on node a, waits until `release` is set and then completes (late); on node b,
/// completes at once. The result names the node.
fn hold(node: &'static str, release: Arc<AtomicBool>) -> Arc<dyn mcp_tasks::tool::Tool> {
    tool_fn(
        ToolDescriptor::new("hold", "completes on b, holds on a").task_policy(TaskPolicy::Always),
        move |_ctx, _| {
            let release = release.clone();
            async move {
                if node == "a" {
                    while !release.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                Ok(CallToolResult::text(format!("done on node {node}")))
            }
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_past_its_lease_is_fenced_after_the_takeover() {
    let Some(pg) = pg::fresh().await else { return };
    let ttl = Duration::from_millis(600);
    let release = Arc::new(AtomicBool::new(false));
    let a_store = Arc::new(
        PostgresStore::open(&pg.url, pg.options("a", ttl))
            .await
            .unwrap(),
    );
    let a = builder(Store::from_backend(a_store.clone()))
        .tool(hold("a", release.clone()))
        .start()
        .await
        .unwrap();
    let b_store = Store::postgres(&pg.url, pg.options("b", ttl))
        .await
        .unwrap();
    let b = builder(b_store)
        .tool(hold("b", release.clone()))
        .start()
        .await
        .unwrap();

    let task = create(&a, "hold", json!({})).await;
    assert!(a_store.holds(&task));
    // Node a stops renewing its lease (as if paused); b takes the task over and completes it.
    mcp_tasks::internals::pg_faults::pause_heartbeat(&a_store, true);
    let done = wait_status(&b, &task, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], "done on node b");
    // Any replica answers with the committed state, a's included.
    assert_eq!(get(&a, &task).await["result"], done);
    let client = pg.client().await;
    let row = client
        .query_one(
            "SELECT seq, owner_node, lease_epoch FROM mcp_tasks WHERE id = $1",
            &[&task],
        )
        .await
        .unwrap();
    let (seq, owner, epoch): (i64, String, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(owner, "b");
    assert!(epoch >= 2, "the takeover bumped the epoch: {epoch}");

    // Node a wakes up: its tool completes late, and its write is refused (fenced).
    mcp_tasks::internals::pg_faults::pause_heartbeat(&a_store, false);
    release.store(true, Ordering::SeqCst);
    for _ in 0..100 {
        if !a_store.holds(&task) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!a_store.holds(&task), "node a learnt that it was fenced");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = client
        .query_one(
            "SELECT seq, owner_node, lease_epoch FROM mcp_tasks WHERE id = $1",
            &[&task],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            after.get::<_, i64>(0),
            after.get::<_, String>(1),
            after.get::<_, i64>(2)
        ),
        (seq, owner, epoch),
        "the record never changes after the fenced write"
    );
    assert_eq!(get(&a, &task).await["result"], done);
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}

/// `lastUpdatedAt` orders a task's states across nodes: node a's clock is a minute ahead of
/// node b's; b takes a's task over and completes it, and the completion is still later than
/// the `working` state a wrote (b's own clock would have given it an earlier time, and the
/// state machine's `max` alone the same one, so a client could not order the two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_by_a_node_whose_clock_is_behind_still_moves_last_updated_at_forward() {
    let Some(pg) = pg::fresh().await else { return };
    let ttl = Duration::from_millis(600);
    let release = Arc::new(AtomicBool::new(false));
    const T: u64 = 1_800_000_000_000;
    let a_store = Arc::new(
        PostgresStore::open(&pg.url, pg.options("a", ttl))
            .await
            .unwrap(),
    );
    let a = builder(Store::from_backend(a_store.clone()))
        .clock(Arc::new(mcp_tasks::clock::ManualClock::new(T + 60_000)))
        .tool(hold("a", release.clone()))
        .start()
        .await
        .unwrap();
    let b = builder(
        Store::postgres(&pg.url, pg.options("b", ttl))
            .await
            .unwrap(),
    )
    .clock(Arc::new(mcp_tasks::clock::ManualClock::new(T)))
    .tool(hold("b", release.clone()))
    .start()
    .await
    .unwrap();

    let task = create(&a, "hold", json!({})).await;
    let working = get(&a, &task).await["result"].clone();
    assert_eq!(working["status"], "working");
    mcp_tasks::internals::pg_faults::pause_heartbeat(&a_store, true);
    let done = wait_status(&b, &task, "completed").await;
    let ms = |v: &Value| {
        let s = v["lastUpdatedAt"].as_str().unwrap().to_owned();
        let t = time::OffsetDateTime::parse(&s, &time::format_description::well_known::Rfc3339)
            .unwrap();
        u64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap()
    };
    assert_eq!(ms(&working), T + 60_000, "{working}");
    assert_eq!(
        ms(&done),
        T + 60_001,
        "one millisecond after the state it replaces: {done}"
    );
    release.store(true, Ordering::SeqCst);
    mcp_tasks::internals::pg_faults::pause_heartbeat(&a_store, false);
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}

/// Options of node `node` whose polling fallback is `poll`.
fn polling(pg: &pg::Pg, node: &str, ttl: Duration, poll: Duration) -> PostgresOptions {
    let mut options = pg.options(node, ttl);
    options.poll_interval = poll;
    options
}

fn confirm(task: &str) -> Value {
    json!({ "taskId": task, "inputResponses": { "confirm": { "action": "accept", "content": { "confirm": true } } } })
}

/// Two nodes a and b over one schema, both with the `journaled` and `sleep_task` tools, and
/// the polling fallback `poll`.
async fn pair(
    pg: &pg::Pg,
    poll: Duration,
    runs: &Arc<AtomicUsize>,
) -> (Runtime, Arc<PostgresStore>, Runtime, Arc<PostgresStore>) {
    pair_named(pg, poll, runs, ["a", "b"]).await
}

/// [`pair`] with these node ids.
async fn pair_named(
    pg: &pg::Pg,
    poll: Duration,
    runs: &Arc<AtomicUsize>,
    names: [&str; 2],
) -> (Runtime, Arc<PostgresStore>, Runtime, Arc<PostgresStore>) {
    let ttl = Duration::from_secs(10);
    let mut nodes = Vec::new();
    for node in names {
        let store = Arc::new(
            PostgresStore::open(&pg.url, polling(pg, node, ttl, poll))
                .await
                .unwrap(),
        );
        let rt = builder(Store::from_backend(store.clone()))
            .tool(journaled(runs.clone()))
            .tool(mcp_tasks_testkit::fixtures::bench::sleep_task_on(Some(
                node.into(),
            )))
            .start()
            .await
            .unwrap();
        nodes.push((rt, store));
    }
    let (b, b_store) = nodes.pop().unwrap();
    let (a, a_store) = nodes.pop().unwrap();
    (a, a_store, b, b_store)
}

/// The polling fallback is set to a minute: an update and a cancel sent to b for tasks a runs
/// are answered (by a's actors, after a's durable write) far sooner, so the notification
/// woke a. Neither task changed hands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_on_another_replica_reaches_the_owner_by_notification() {
    let Some(pg) = pg::fresh().await else { return };
    let runs = Arc::new(AtomicUsize::new(0));
    let poll = Duration::from_secs(60);
    let (a, a_store, b, b_store) = pair(&pg, poll, &runs).await;
    let task = create(&a, "journaled", json!({})).await;
    wait_status(&a, &task, "input_required").await;
    let bound = Duration::from_secs(20);
    let r = tokio::time::timeout(bound, call(&b, "tasks/update", confirm(&task)))
        .await
        .expect("answered well before the 60 s polling fallback: the notification woke the owner");
    assert!(r.get("result").is_some(), "{r}");
    // The ack follows a's durable write: the answer is in the record every node reads.
    let after = get(&b, &task).await;
    assert_ne!(after["result"]["status"], "input_required", "{after}");
    let done = wait_status(&b, &task, "completed").await;
    assert_eq!(get(&a, &task).await["result"], done);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the step ran once");
    let lease = b_store.lease_of(&task).await.unwrap().unwrap();
    assert_eq!(
        (lease.owner.as_deref(), lease.epoch),
        (Some("a"), 1),
        "applied by its owner, not taken over"
    );

    let sleeper = create(&a, "sleep_task", json!({ "ms": 600_000 })).await;
    let r = tokio::time::timeout(
        bound,
        call(&b, "tasks/cancel", json!({ "taskId": sleeper })),
    )
    .await
    .expect("cancel answered well before the polling fallback");
    assert!(r.get("result").is_some(), "{r}");
    let stored = get(&b, &sleeper).await;
    assert!(
        stored["result"]["status"] == "cancelled" || stored["result"]["status"] == "working",
        "{stored}"
    );
    wait_status(&b, &sleeper, "cancelled").await;
    let lease = a_store.lease_of(&sleeper).await.unwrap().unwrap();
    assert_eq!((lease.owner.as_deref(), lease.epoch), (Some("a"), 1));

    // An answer the owner refuses comes back to b's caller as the owner's error.
    let other = create(&a, "journaled", json!({})).await;
    wait_status(&a, &other, "input_required").await;
    let invalid = json!({ "taskId": other, "inputResponses": { "confirm": { "action": "accept", "content": { "confirm": "not a boolean" } } } });
    let bad = call(&b, "tasks/update", invalid.clone()).await;
    let local = call(&a, "tasks/update", invalid).await;
    assert!(local["error"]["code"].is_i64(), "a refuses it: {local}");
    assert_eq!(bad["error"], local["error"], "b: {bad}; a: {local}");
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}

/// With the owner's notifications lost, a request recorded by another node still reaches it
/// at its next poll; with the follower's lost, a listen stream still gets every state up to
/// the terminal one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_notification_only_delays() {
    let Some(pg) = pg::fresh().await else { return };
    let runs = Arc::new(AtomicUsize::new(0));
    let (a, a_store, b, b_store) = pair(&pg, Duration::from_millis(700), &runs).await;
    let task = create(&a, "journaled", json!({})).await;
    wait_status(&a, &task, "input_required").await;
    mcp_tasks::internals::pg_faults::lose_notifications(&a_store, true);
    mcp_tasks::internals::pg_faults::lose_notifications(&b_store, true);
    let mut stream = listen(&b, &task).await;
    let first = next_task_state(&mut stream).await;
    assert_eq!(first["status"], "input_required", "{first}");
    let r = call(&b, "tasks/update", confirm(&task)).await;
    assert!(r.get("result").is_some(), "{r}");
    let lease = b_store.lease_of(&task).await.unwrap().unwrap();
    assert_eq!((lease.owner.as_deref(), lease.epoch), (Some("a"), 1));
    let mut last = first;
    while last["status"] != "completed" {
        let next = next_task_state(&mut stream).await;
        assert_ne!(next, last, "no state twice");
        last = next;
    }
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}

/// A listen stream on b follows a task a runs: with a polling fallback of a minute, the
/// completion arrives far sooner (by notification), and states only go forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_on_another_replica_follows_by_notification() {
    let Some(pg) = pg::fresh().await else { return };
    let runs = Arc::new(AtomicUsize::new(0));
    let (a, _a_store, b, _b_store) = pair(&pg, Duration::from_secs(60), &runs).await;
    let task = create(&a, "journaled", json!({})).await;
    wait_status(&a, &task, "input_required").await;
    let mut stream = listen(&b, &task).await;
    let first = next_task_state(&mut stream).await;
    assert_eq!(first["status"], "input_required", "{first}");
    let r = call(&a, "tasks/update", confirm(&task)).await;
    assert!(r.get("result").is_some(), "{r}");
    let bound = Duration::from_secs(20);
    let completed = tokio::time::timeout(bound, async {
        loop {
            let state = next_task_state(&mut stream).await;
            if state["status"] == "completed" {
                return state;
            }
        }
    })
    .await
    .expect("the completion reached b's listen well before the 60 s polling fallback");
    assert_eq!(
        completed["result"]["content"][0]["text"],
        get(&a, &task).await["result"]["result"]["content"][0]["text"]
    );
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}

/// Catch-up after a reconnection: b's listen follows a task a runs, with a polling fallback
/// of a minute; the notification of its completion is lost, then PostgreSQL ends b's
/// listening connection. b reconnects, and its catch-up read delivers the completion far
/// sooner than the poll would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnected_listener_catches_up_with_what_it_missed() {
    let Some(pg) = pg::fresh().await else { return };
    let runs = Arc::new(AtomicUsize::new(0));
    // b's node id is unique to this test: its listening connection is found by its name
    // among those of the tests running beside it.
    let b_node = format!("b-{}", pg.schema);
    let (a, _a_store, b, b_store) =
        pair_named(&pg, Duration::from_secs(60), &runs, ["a", &b_node]).await;
    let task = create(&a, "journaled", json!({})).await;
    wait_status(&a, &task, "input_required").await;
    for _ in 0..200 {
        if b_store.is_listening() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(b_store.is_listening());
    let mut stream = listen(&b, &task).await;
    assert_eq!(
        next_task_state(&mut stream).await["status"],
        "input_required"
    );
    mcp_tasks::internals::pg_faults::lose_notifications(&b_store, true);
    let r = call(&a, "tasks/update", confirm(&task)).await;
    assert!(r.get("result").is_some(), "{r}");
    wait_status(&a, &task, "completed").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    mcp_tasks::internals::pg_faults::lose_notifications(&b_store, false);
    let client = pg.client().await;
    let ended: i64 = client
        .query_one(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE application_name = $1) t",
            &[&format!("mcp-tasks {b_node} (listen)")],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ended, 1, "b's listening connection was ended");
    let completed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let state = next_task_state(&mut stream).await;
            if state["status"] == "completed" {
                return state;
            }
        }
    })
    .await
    .expect("the catch-up after the reconnection delivered the completion before the 60 s poll");
    assert_eq!(completed["status"], "completed");
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}

async fn listen(rt: &Runtime, task: &str) -> mcp_tasks::MessageStream {
    let msg = req(
        7,
        "subscriptions/listen",
        json!({ "notifications": { "taskIds": [task] } }),
        true,
    );
    match rt
        .handle()
        .dispatch_json(msg, &mcp_tasks::RequestContext::new(Owner::anonymous()))
        .await
    {
        mcp_tasks::Dispatched::Stream(s) => s,
        other => panic!("listen did not stream: {other:?}"),
    }
}

/// The next `notifications/tasks` of a listen stream (the acknowledgement skipped).
async fn next_task_state(stream: &mut mcp_tasks::MessageStream) -> Value {
    use futures::StreamExt;
    loop {
        let message = tokio::time::timeout(Duration::from_secs(90), stream.next())
            .await
            .expect("a message within 90 s")
            .expect("the stream is open");
        if message["method"] == "notifications/tasks" {
            return message["params"].clone();
        }
    }
}

/// Two nodes expire tasks with a short time to live: the deletions of the finished ones are
/// the sweep leader's alone (the other node deletes none), and one node leads at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_tasks_are_swept_by_one_node() {
    let Some(pg) = pg::fresh().await else { return };
    let ttl = Duration::from_secs(10);
    let mut nodes = Vec::new();
    for node in ["a", "b"] {
        let store = Arc::new(
            PostgresStore::open(&pg.url, pg.options(node, ttl))
                .await
                .unwrap(),
        );
        let mut config = RuntimeConfig::default();
        config.reaper_interval = Duration::from_millis(20);
        config.expired_retention = Duration::from_millis(1);
        config.default_ttl = Some(Duration::from_millis(300));
        let rt = Runtime::builder_with_store(Store::from_backend(store.clone()))
            .config(config)
            .tool(mcp_tasks_testkit::fixtures::bench::sleep_task_on(Some(
                node.into(),
            )))
            .start()
            .await
            .unwrap();
        nodes.push((rt, store));
    }
    // Wait for a leader.
    for _ in 0..200 {
        if nodes.iter().any(|(_, s)| s.is_sweep_leader()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let leaders = nodes.iter().filter(|(_, s)| s.is_sweep_leader()).count();
    assert_eq!(leaders, 1, "exactly one sweep leader");
    let per_node = 20;
    let mut tasks = Vec::new();
    for (rt, _) in &nodes {
        for _ in 0..per_node {
            let r = call(
                rt,
                "tools/call",
                json!({ "name": "sleep_task", "arguments": { "ms": 1 } }),
            )
            .await;
            tasks.push(r["result"]["taskId"].as_str().expect("a task").to_owned());
        }
    }
    let client = pg.client().await;
    let mut left = i64::MAX;
    for _ in 0..600 {
        left = client
            .query_one("SELECT count(*) FROM mcp_tasks", &[])
            .await
            .unwrap()
            .get(0);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left, 0, "every task was deleted");
    let deleted: Vec<u64> = nodes.iter().map(|(_, s)| s.deleted_tasks()).collect();
    assert_eq!(
        deleted.iter().sum::<u64>(),
        tasks.len() as u64,
        "{deleted:?}"
    );
    assert!(
        deleted.contains(&0),
        "one node swept everything, the other nothing: {deleted:?}"
    );
    for (rt, _) in nodes {
        rt.shutdown().await;
    }
    pg.drop().await;
}

/// A TCP proxy to PostgreSQL that a test can cut (every connection dropped, new ones
/// refused) and restore.
struct Proxy {
    port: u16,
    down: tokio::sync::watch::Sender<bool>,
}

async fn proxy(target: &str) -> Proxy {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (down, rx) = tokio::sync::watch::channel(false);
    let target = target.to_owned();
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                return;
            };
            if *rx.borrow() {
                continue; // refused: dropped at once
            }
            let target = target.clone();
            let mut rx = rx.clone();
            tokio::spawn(async move {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                    return;
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    _ = rx.wait_for(|down| *down) => {}
                }
            });
        }
    });
    Proxy { port, down }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_going_away_answers_32603_and_service_resumes() {
    let Some(pg) = pg::fresh().await else { return };
    let server = pg::server();
    let hostport = server.rsplit('@').next().unwrap().to_owned();
    let proxy = proxy(&hostport).await;
    let url = pg
        .url
        .replace(&hostport, &format!("127.0.0.1:{}", proxy.port));
    let mut opts = pg.options("a", Duration::from_secs(30));
    opts.connect_timeout = Duration::from_secs(1);
    let rt = builder(Store::postgres(&url, opts).await.unwrap())
        .tool(mcp_tasks_testkit::fixtures::bench::sleep_task_on(Some(
            "a".into(),
        )))
        .start()
        .await
        .unwrap();
    let before = create(&rt, "sleep_task", json!({ "ms": 0 })).await;
    wait_status(&rt, &before, "completed").await;

    proxy.down.send_replace(true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    for method in ["get", "create"] {
        let r = if method == "get" {
            get(&rt, &before).await
        } else {
            call(
                &rt,
                "tools/call",
                json!({ "name": "sleep_task", "arguments": { "ms": 0 } }),
            )
            .await
        };
        assert_eq!(r["error"]["code"], -32603, "{method}: {r}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(msg.contains("unavailable"), "{method}: {msg}");
        assert!(
            !msg.contains("127.0.0.1"),
            "no addresses in client errors: {msg}"
        );
    }
    assert!(
        mcp_tasks::internals::runtime_store(&rt)
            .unavailable()
            .is_some()
    );

    proxy.down.send_replace(false);
    // Service resumes without a restart; nothing acknowledged was lost.
    let mut resumed = None;
    for _ in 0..100 {
        let r = call(
            &rt,
            "tools/call",
            json!({ "name": "sleep_task", "arguments": { "ms": 0 } }),
        )
        .await;
        if r.get("result").is_some() {
            resumed = Some(r["result"]["taskId"].as_str().unwrap().to_owned());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = resumed.expect("service resumed once the database was back");
    wait_status(&rt, &after, "completed").await;
    let old = wait_status(&rt, &before, "completed").await;
    assert_eq!(old["result"]["content"][0]["text"], "Slept 0 ms on node a.");
    rt.shutdown().await;
    pg.drop().await;
}

fn put(id: &str, seq: u64, live: bool) -> mcp_tasks::store::WriteOp {
    mcp_tasks::store::WriteOp::Put {
        id: id.to_owned(),
        bytes: vec![seq as u8],
        constant_tail: 0,
        live,
        due_ms: None,
        seq: Some(seq),
        expect: if seq == 1 {
            mcp_tasks::store::Expect::Absent
        } else {
            mcp_tasks::store::Expect::Seq(seq - 1)
        },
        owner: None,
        listing: None,
    }
}

/// The fence itself, where the sequence number alone would not refuse the write: node b
/// claimed the task (epoch bumped) but has not written yet when node a writes. With the
/// test-only switch that skips the lease check, a's write goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_epoch_refuses_a_write_the_sequence_number_would_let_through() {
    let Some(pg) = pg::fresh().await else { return };
    let ttl = Duration::from_millis(300);
    for skip in [false, true] {
        let id = format!("tsk_fence_{skip}");
        let mut a_opts = pg.options("a", ttl);
        a_opts.unsafe_skip_fencing = skip;
        let a = PostgresStore::open(&pg.url, a_opts).await.unwrap();
        let b = PostgresStore::open(&pg.url, pg.options("b", ttl))
            .await
            .unwrap();
        a.commit(vec![put(&id, 1, true)]).await.unwrap();
        assert!(a.holds(&id) && !b.holds(&id));
        mcp_tasks::internals::pg_faults::pause_heartbeat(&a, true);
        let mut claimed = Vec::new();
        for _ in 0..100 {
            claimed = b.claim_orphans("", 16).await.unwrap();
            if !claimed.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(claimed.len(), 1, "b took the orphan over");
        assert!(b.holds(&id));
        let late = a.commit(vec![put(&id, 2, true)]).await;
        if skip {
            assert!(
                late.is_ok(),
                "without the fence the stale write lands: {late:?}"
            );
        } else {
            assert!(
                matches!(late, Err(StoreError::Fenced { .. })),
                "fenced: {late:?}"
            );
            assert!(!a.holds(&id));
            assert_eq!(a.get(&id).await.unwrap(), Some(vec![1]), "nothing written");
            // The new owner writes on.
            b.commit(vec![put(&id, 2, false)]).await.unwrap();
        }
        // The first replica's meta value wins (the requestState key of a new store).
        for (store, value) in [(&a, b"from a".to_vec()), (&b, b"from b".to_vec())] {
            store
                .commit(vec![mcp_tasks::store::WriteOp::PutMetaIfAbsent {
                    key: format!("k_{skip}"),
                    value,
                }])
                .await
                .unwrap();
        }
        assert_eq!(
            b.meta_get(&format!("k_{skip}")).await.unwrap(),
            Some(b"from a".to_vec())
        );
        // A meta key is deleted for every replica.
        a.commit(vec![mcp_tasks::store::WriteOp::DeleteMeta {
            key: format!("k_{skip}"),
        }])
        .await
        .unwrap();
        assert_eq!(b.meta_get(&format!("k_{skip}")).await.unwrap(), None);
        // Meta keys are listed by prefix, a page at a time, for every replica.
        let prefix = format!("p_{skip}/");
        let ops = ["3", "1", "2"]
            .iter()
            .map(|k| mcp_tasks::store::WriteOp::PutMeta {
                key: format!("{prefix}{k}"),
                value: k.as_bytes().to_vec(),
            })
            .chain([mcp_tasks::store::WriteOp::PutMeta {
                key: format!("p_{skip}"),
                value: Vec::new(),
            }])
            .collect();
        a.commit(ops).await.unwrap();
        let first = b.meta_page(&prefix, None, 2).await.unwrap();
        let want = |ks: &[&str]| -> Vec<(String, Vec<u8>)> {
            ks.iter()
                .map(|k| (format!("{prefix}{k}"), k.as_bytes().to_vec()))
                .collect()
        };
        assert_eq!(first, want(&["1", "2"]));
        let rest = b.meta_page(&prefix, Some(&first[1].0), 2).await.unwrap();
        assert_eq!(rest, want(&["3"]));
        assert_eq!(
            b.meta_page(&prefix, Some(&rest[0].0), 2).await.unwrap(),
            Vec::new()
        );
        b.close().await;
        a.close().await;
    }
    pg.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_demo_shows_the_takeover_and_the_refused_late_completion() {
    let Some(pg) = pg::fresh().await else { return };
    let mut out = Vec::new();
    mcp_tasks_testkit::replicas_demo::run(&pg.url, &mut out)
        .await
        .unwrap();
    let out = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 8, "{out}");
    assert!(
        lines[1].contains("(lease: owner a, epoch 1, seq 1)"),
        "{out}"
    );
    assert!(lines[3].contains("(lease: owner b, epoch 2"), "{out}");
    assert!(lines[4].contains("\"Slept 1000 ms on node b.\""), "{out}");
    assert!(lines[5].contains("refused: fenced"), "{out}");
    assert_eq!(
        lines[7],
        "the task was completed once, by b; the record never changed after that"
    );
    pg.drop().await;
}

/// The restart budget is the cluster's, not a node's: a task whose node stops without
/// releasing it (here: stops heartbeating for good, as a crashed replica, or one paused that
/// never wakes) counts a run each time another node takes it over, and is given up once the
/// budget is spent, whichever node that is; a clean shutdown's release counts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeovers_of_lapsed_leases_spend_one_cluster_wide_restart_budget() {
    let Some(pg) = pg::fresh().await else { return };
    // Long enough that a loaded machine does not miss heartbeats (a spurious lapse would
    // count a run too).
    let ttl = Duration::from_millis(1500);
    let hang = || {
        tool_fn(
            ToolDescriptor::new("hang", "never ends").task_policy(TaskPolicy::Always),
            |_ctx, _| async {
                std::future::pending::<()>().await;
                Ok(CallToolResult::text("unreachable"))
            },
        )
    };
    let node = |name: &'static str| {
        let pg = &pg;
        let hang = hang();
        async move {
            let store = Arc::new(
                PostgresStore::open(&pg.url, pg.options(name, ttl))
                    .await
                    .unwrap(),
            );
            let mut config = RuntimeConfig::default();
            config.restart_budget = 1;
            config.restart_backoff = Duration::from_millis(10);
            let rt = Runtime::builder_with_store(Store::from_backend(store.clone()))
                .config(config)
                .tool(hang)
                .start()
                .await
                .unwrap();
            (rt, store)
        }
    };
    let owner_is = |store: Arc<PostgresStore>, task: String, want: &'static str| async move {
        for _ in 0..400 {
            let lease = store.lease_of(&task).await.unwrap().unwrap();
            if lease.owner.as_deref() == Some(want) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{want} never took {task} over");
    };
    let (a, _a_store) = node("a").await;
    let (b, b_store) = node("b").await;
    let task = create(&a, "hang", json!({})).await;
    // A clean shutdown releases the task: b's claim does not count.
    a.shutdown().await;
    owner_is(b_store.clone(), task.clone(), "b").await;
    // b stops heartbeating: c takes the task over, which counts the run b had (2 of 2).
    let (c, c_store) = node("c").await;
    mcp_tasks::internals::pg_faults::pause_heartbeat(&b_store, true);
    owner_is(c_store.clone(), task.clone(), "c").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let working = get(&c, &task).await;
    assert_eq!(working["result"]["status"], "working", "{working}");
    // c stops too: whoever takes the task over next finds the budget spent.
    mcp_tasks::internals::pg_faults::pause_heartbeat(&c_store, true);
    let (d, _d_store) = node("d").await;
    let failed = wait_status(&d, &task, "failed").await;
    let message = failed["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("given up") && message.contains("stopped without releasing it"),
        "{message}"
    );
    for rt in [b, c, d] {
        rt.shutdown().await;
    }
    pg.drop().await;
}

/// Orphans are claimed in id order past a cursor: batches that go on past the previous one's
/// greatest id take every orphan exactly once and then none (a takeover reads each row once,
/// `cargo bench --bench takeover` measures it), and a cursor past every id claims nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_claimed_in_id_order_past_a_cursor_each_once() {
    let Some(pg) = pg::fresh().await else { return };
    let ttl = Duration::from_millis(300);
    let a = PostgresStore::open(&pg.url, pg.options("a", ttl))
        .await
        .unwrap();
    let b = PostgresStore::open(&pg.url, pg.options("b", ttl))
        .await
        .unwrap();
    let ids: Vec<String> = (0..40).map(|n| format!("tsk_orphan_{n:02}")).collect();
    let ops = ids.iter().map(|id| put(id, 1, true)).collect();
    a.commit(ops).await.unwrap();
    mcp_tasks::internals::pg_faults::pause_heartbeat(&a, true);
    // Nothing past the greatest id, even once the lease has lapsed.
    let mut none = Vec::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        none = b.claim_orphans("tsk_orphan_99", 16).await.unwrap();
    }
    assert!(none.is_empty(), "{none:?}");
    // The lease has lapsed: batches of 16 from the start.
    let mut claimed: Vec<String> = Vec::new();
    let mut after = String::new();
    let mut sizes = Vec::new();
    loop {
        let batch = b.claim_orphans(&after, 16).await.unwrap();
        sizes.push(batch.len());
        let Some(last) = batch.iter().map(|(id, _)| id.clone()).max() else {
            break;
        };
        assert!(batch.iter().all(|(id, _)| id.as_str() > after.as_str()));
        claimed.extend(batch.into_iter().map(|(id, _)| id));
        after = last;
    }
    assert_eq!(sizes, vec![16, 16, 8, 0]);
    assert_eq!(claimed, ids, "each orphan once, in id order");
    assert!(ids.iter().all(|id| b.holds(id)));
    a.close().await;
    b.close().await;
    pg.drop().await;
}

/// The store conformance suite every backend runs (`support::store_conformance`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_conforms() {
    let Some(pg) = pg::fresh().await else { return };
    let store = Store::postgres(&pg.url, pg.options("a", Duration::from_secs(30)))
        .await
        .unwrap();
    support::store_conformance::check(&store).await;
    store.close().await;
    pg.drop().await;
}
