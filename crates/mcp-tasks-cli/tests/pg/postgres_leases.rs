//! Leases that a node loses or forgets without writing, over the PostgreSQL store, in
//! process (two nodes on one schema, crates/mcp-tasks-cli/tests/pg): a node notices a lease it lost although its
//! actor waits for input and never writes (a listen on it then follows the record, and it
//! never shows an older state than `tasks/get` there); a creation whose commit
//! acknowledgement was lost is run anyway; a request its sender gave up waiting for is
//! withdrawn, and never applied later.
#![cfg(feature = "postgres")]

use crate::pg;
use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_tasks::store::{Cluster, PostgresOptions, PostgresStore, Store};
use mcp_tasks::tool::{CallToolResult, InputRequest, TaskPolicy, ToolDescriptor, tool_fn};
use mcp_tasks::{Owner, Runtime, RuntimeBuilder, RuntimeConfig};
use serde_json::{Value, json};
use support::embedded::{call, create, get, req, wait_status};
use support::eventually;

/// `two_questions`: asks for `k0`, then for `k1`, then completes with both answers.
fn two_questions() -> Arc<dyn mcp_tasks::tool::Tool> {
    tool_fn(
        ToolDescriptor::new("two_questions", "two questions, one after the other")
            .task_policy(TaskPolicy::Always),
        move |ctx, _| async move {
            let schema = json!({
                "type": "object",
                "properties": { "ok": { "type": "boolean" } },
                "required": ["ok"]
            });
            let k0 = ctx
                .input("k0", InputRequest::elicit_form("First?", schema.clone()))
                .await?;
            let k1 = ctx
                .input("k1", InputRequest::elicit_form("Second?", schema))
                .await?;
            Ok(CallToolResult::text(format!("k0 {k0}; k1 {k1}")))
        },
    )
}

fn answer(task: &str, key: &str) -> Value {
    json!({ "taskId": task, "inputResponses": { key: { "action": "accept", "content": { "ok": true } } } })
}

fn options(pg: &pg::Pg, node: &str, ttl: Duration, poll: Duration) -> PostgresOptions {
    let mut options = pg.options(node, ttl);
    options.poll_interval = poll;
    options
}

async fn node(pg: &pg::Pg, name: &str, ttl: Duration) -> (Runtime, Arc<PostgresStore>) {
    let store = Arc::new(
        PostgresStore::open(&pg.url, options(pg, name, ttl, Duration::from_millis(200)))
            .await
            .unwrap(),
    );
    let mut config = RuntimeConfig::default();
    config.restart_backoff = Duration::from_millis(10);
    let rt = builder(Store::from_backend(store.clone()), config)
        .tool(two_questions())
        .tool(mcp_tasks_testkit::fixtures::bench::sleep_task_on(Some(
            name.into(),
        )))
        .start()
        .await
        .unwrap();
    (rt, store)
}

fn builder(store: Store, config: RuntimeConfig) -> RuntimeBuilder {
    Runtime::builder_with_store(store).config(config)
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

/// The next task state of a listen stream within `bound`; `None` if none came.
async fn next_state(stream: &mut mcp_tasks::MessageStream, bound: Duration) -> Option<Value> {
    use futures::StreamExt;
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let message = tokio::time::timeout_at(deadline, stream.next())
            .await
            .ok()?
            .expect("the stream is open");
        if message["method"] == "notifications/tasks" {
            return Some(message["params"].clone());
        }
    }
}

/// X2 of the scale-out review, in process. Node a runs a task that waits for input; a stops
/// renewing its lease (as if paused) and b takes the task over; a resumes. a's actor writes
/// nothing, so no write of it is ever fenced. The answers go through b and complete the
/// task. Then `tasks/get` on a says `completed`, a listen opened on a afterwards starts at
/// `completed` (never an older state than `tasks/get` on the same node), a listen opened on a
/// before the takeover ends with `completed` too, and a notices that it no longer holds the
/// task (its actor stopped). Without the reconciliation of held leases and the check of a
/// local actor against the record, a's listens stayed at `input_required` for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_on_the_old_owner_follows_the_task_another_node_completed() {
    let Some(pg) = pg::fresh().await else { return };
    let ttl = Duration::from_millis(900);
    let (a, a_store) = node(&pg, "a", ttl).await;
    let (b, b_store) = node(&pg, "b", ttl).await;
    let task = create(&a, "two_questions", json!({})).await;
    wait_status(&a, &task, "input_required").await;
    let mut early = listen(&a, &task).await;
    let first = next_state(&mut early, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(first["status"], "input_required", "{first}");

    mcp_tasks::internals::pg_faults::pause_heartbeat(&a_store, true);
    eventually(
        "b took the task over",
        Duration::from_secs(30),
        async || b_store.holds(&task),
    )
    .await;
    mcp_tasks::internals::pg_faults::pause_heartbeat(&a_store, false);
    for key in ["k0", "k1"] {
        let r = call(&b, "tasks/update", answer(&task, key)).await;
        assert!(r.get("result").is_some(), "{r}");
        if key == "k0" {
            let waiting = wait_status(&b, &task, "input_required").await;
            assert!(waiting["inputRequests"].get("k1").is_some(), "{waiting}");
        }
    }
    let done = wait_status(&b, &task, "completed").await;
    assert_eq!(get(&a, &task).await["result"], done, "tasks/get on a");

    // Opened now on a, whose actor (if it still runs) is behind: it starts at the record.
    let mut late = listen(&a, &task).await;
    let state = next_state(&mut late, Duration::from_secs(20))
        .await
        .expect("a listen on a sends a state");
    assert_eq!(
        state["status"], "completed",
        "a listen on a went back behind tasks/get on a: {state}"
    );
    // The listen opened before the takeover ends with the completion, never going backwards.
    let mut last = first;
    while last["status"] != "completed" {
        let next = next_state(&mut early, Duration::from_secs(20))
            .await
            .unwrap_or_else(|| panic!("the early listen on a stayed at {last}"));
        last = next;
    }
    assert_eq!(last["result"], done["result"]);
    eventually(
        "a noticed that it no longer holds the task",
        Duration::from_secs(20),
        async || !a_store.holds(&task),
    )
    .await;
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}

/// A renewal of a node's lease that is in flight while another node looks for lapsed leases
/// keeps the node's tasks with it. Node a runs a task waiting for input; its heartbeat stops,
/// and a renewal of it stays open (its node row locked by a transaction) past the lease TTL.
/// b's periodic claims and a request reaching b (which would take the task over) leave the
/// task with a meanwhile: "busy, retry". The renewal commits; the task is still a's, at its
/// epoch, and the answer sent through b reaches it. Before, a claim whose snapshot predated
/// the renewal took the task anyway and could commit after a's reconciliation of its leases:
/// a then answered reads from its memory of a task b was changing (a lost update in the
/// history checker of the replica crash suite).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_in_flight_keeps_the_task_with_its_node() {
    let Some(pg) = pg::fresh().await else { return };
    let ttl = Duration::from_millis(900);
    let (a, a_store) = node(&pg, "a", ttl).await;
    let (b, b_store) = node(&pg, "b", ttl).await;
    let task = create(&a, "two_questions", json!({})).await;
    wait_status(&a, &task, "input_required").await;
    let epoch = a_store.lease_of(&task).await.unwrap().unwrap().epoch;

    mcp_tasks::internals::pg_faults::pause_heartbeat(&a_store, true);
    let mut renewing = pg.client().await;
    let renewal = renewing.transaction().await.unwrap();
    renewal
        .execute(
            "UPDATE mcp_nodes SET heartbeat_at = heartbeat_at WHERE node_id = 'a'",
            &[],
        )
        .await
        .unwrap();
    // Three TTLs: a's last heartbeat is long past, and b has looked for orphans many times.
    tokio::time::sleep(ttl * 3).await;
    assert!(
        !b_store.holds(&task),
        "b claimed the task of a node whose renewal was in flight"
    );
    let r = call(&b, "tasks/update", answer(&task, "k0")).await;
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        r["error"]["code"] == -32603 && message.contains("retry"),
        "a request reaching b while a's renewal is in flight is answered busy: {r}"
    );

    renewal
        .execute(
            "UPDATE mcp_nodes SET heartbeat_at = clock_timestamp() WHERE node_id = 'a'",
            &[],
        )
        .await
        .unwrap();
    renewal.commit().await.unwrap();
    mcp_tasks::internals::pg_faults::pause_heartbeat(&a_store, false);
    tokio::time::sleep(ttl).await;
    let lease = a_store.lease_of(&task).await.unwrap().unwrap();
    assert_eq!(
        (lease.owner.as_deref(), lease.epoch),
        (Some("a"), epoch),
        "the task stayed with a, at its epoch"
    );
    let r = call(&b, "tasks/update", answer(&task, "k0")).await;
    assert!(r.get("result").is_some(), "{r}");
    eventually(
        "a asked its second question",
        Duration::from_secs(20),
        async || {
            get(&a, &task).await["result"]["inputRequests"]
                .get("k1")
                .is_some()
        },
    )
    .await;
    assert!(!b_store.holds(&task), "b never took the task");
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}

/// X9 of the scale-out review: the acknowledgement of a creation's commit is lost (the
/// store's test hook reports the committed transaction failed). The client gets `-32603`,
/// the row is live and leased to the node, which did not know it held it. The node
/// reconciles its leases with the rows right after a commit whose outcome is unknown (the
/// lease TTL here is a minute, so the periodic pass would come 20 s later), claims the row
/// anew and runs the task to its end: it is never left `working` with nobody running it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_whose_commit_ack_was_lost_still_runs() {
    let Some(pg) = pg::fresh().await else { return };
    let (a, a_store) = node(&pg, "a", Duration::from_secs(60)).await;
    mcp_tasks::internals::pg_faults::lose_commit_acks(&a_store, 1);
    let r = call(
        &a,
        "tools/call",
        json!({ "name": "sleep_task", "arguments": { "ms": 50 } }),
    )
    .await;
    assert_eq!(r["error"]["code"], -32603, "{r}");
    let client = pg.client().await;
    let row = client
        .query_one("SELECT id, live, owner_node FROM mcp_tasks", &[])
        .await
        .unwrap();
    let task: String = row.get(0);
    assert_eq!(
        (row.get::<_, bool>(1), row.get::<_, String>(2)),
        (true, "a".to_owned()),
        "the creation committed although its acknowledgement was lost"
    );
    let started = Instant::now();
    let done = wait_status(&a, &task, "completed").await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "run soon after the failed commit, not at the periodic reconciliation: {:?}",
        started.elapsed()
    );
    assert_eq!(
        done["result"]["content"][0]["text"],
        "Slept 50 ms on node a."
    );
    let lease = a_store.lease_of(&task).await.unwrap().unwrap();
    assert_eq!(lease.owner.as_deref(), Some("a"));
    assert!(lease.epoch >= 2, "claimed anew: {lease}");
    a.shutdown().await;
    pg.drop().await;
}

/// A request recorded for a node that never takes it (a live node id whose process runs no
/// inbox) is withdrawn when its sender stops waiting: the sender's `-32603` says it was not
/// applied, nothing of it stays recorded, and the node that takes the task over later does
/// not apply it (before, the request stayed recorded for 10 minutes, was applied by whoever
/// took the task over, and the error said it would be).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_nobody_took_is_withdrawn_and_never_applied() {
    let Some(pg) = pg::fresh().await else { return };
    let ttl = Duration::from_millis(900);
    let (a, _a_store) = node(&pg, "a", ttl).await;
    let (b, _b_store) = node(&pg, "b", ttl).await;
    let task = create(&a, "two_questions", json!({})).await;
    wait_status(&a, &task, "input_required").await;
    // The task is leased to node z, whose heartbeat stays fresh but which runs no inbox.
    let client = pg.client().await;
    client
        .execute(
            "INSERT INTO mcp_nodes (node_id, started_at, heartbeat_at)
             VALUES ('z', now(), now() + interval '1 hour')",
            &[],
        )
        .await
        .unwrap();
    client
        .execute(
            "UPDATE mcp_tasks SET owner_node = 'z', lease_epoch = lease_epoch + 1 WHERE id = $1",
            &[&task],
        )
        .await
        .unwrap();
    let r = call(&b, "tasks/cancel", json!({ "taskId": task })).await;
    let message = r["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(r["error"]["code"], -32603, "{r}");
    assert!(
        message.contains("withdrawn and not applied"),
        "the sender is told the request was not applied: {message}"
    );
    let left: i64 = client
        .query_one("SELECT count(*) FROM mcp_commands", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "nothing of the withdrawn request stays recorded");
    // z's lease lapses: a or b takes the task over, and it still waits for its answer.
    client
        .execute(
            "UPDATE mcp_nodes SET heartbeat_at = now() - interval '1 hour' WHERE node_id = 'z'",
            &[],
        )
        .await
        .unwrap();
    eventually(
        "a live node took the task over",
        Duration::from_secs(30),
        async || {
            let owner: Option<String> = client
                .query_one("SELECT owner_node FROM mcp_tasks WHERE id = $1", &[&task])
                .await
                .unwrap()
                .get(0);
            owner.as_deref().is_some_and(|o| o != "z")
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let state = get(&b, &task).await["result"].clone();
    assert_eq!(state["status"], "input_required", "{state}");
    // Now the same request is answered and applied.
    let r = call(&b, "tasks/cancel", json!({ "taskId": task })).await;
    assert!(r.get("result").is_some(), "{r}");
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}
