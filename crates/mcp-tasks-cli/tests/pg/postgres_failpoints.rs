//! Schedules over two PostgreSQL nodes in process that need a failpoint or a breaker to be
//! exact (the library's feature `failpoints`, on in every test build). Failpoints are
//! process-global, so each test runs in a process of its own (`support::own_process`) and,
//! there, holds `fail::FailScenario` (`cargo test --test pg postgres_failpoints::` alone).
#![cfg(feature = "postgres")]

use crate::pg;
use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use fail::FailScenario;
use mcp_tasks::store::{Cluster, PostgresStore, Store};
use mcp_tasks::tool::{CallToolResult, InputRequest, TaskPolicy, ToolDescriptor, tool_fn};
use mcp_tasks::{Runtime, RuntimeConfig};
use serde_json::{Value, json};
use support::embedded::{call, create, get, wait_status};
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

async fn node(pg: &pg::Pg, name: &str, ttl: Duration) -> (Runtime, Arc<PostgresStore>) {
    let mut options = pg.options(name, ttl);
    options.poll_interval = Duration::from_millis(200);
    let store = Arc::new(PostgresStore::open(&pg.url, options).await.unwrap());
    let mut config = RuntimeConfig::default();
    config.restart_backoff = Duration::from_millis(10);
    let rt = Runtime::builder_with_store(Store::from_backend(store.clone()))
        .config(config)
        .tool(two_questions())
        .start()
        .await
        .unwrap();
    (rt, store)
}

/// Whether the task `r` (a `tasks/get` answer) waits for input `key`.
fn waits_for(r: &Value, key: &str) -> bool {
    r["result"]["inputRequests"].get(key).is_some()
}

/// Nodes a and b (lease TTL 3 s), a task on a waiting for `k0`, and a's lease valid for
/// reads from memory.
async fn a_reads_a_waiting_task_from_memory(
    pg: &pg::Pg,
) -> (Runtime, Arc<PostgresStore>, Runtime, String) {
    let ttl = Duration::from_secs(3);
    let (a, a_store) = node(pg, "a", ttl).await;
    let (b, _b_store) = node(pg, "b", ttl).await;
    let task = create(&a, "two_questions", json!({})).await;
    wait_status(&a, &task, "input_required").await;
    eventually(
        "a's lease valid for reads",
        Duration::from_secs(10),
        async || a_store.reads_from_memory(&task),
    )
    .await;
    (a, a_store, b, task)
}

/// Sends the answer to `key` of `task` to `node` in the background.
fn answer_in_background(
    node: &Runtime,
    task: &str,
    key: &str,
) -> tokio::task::JoinHandle<Option<Value>> {
    let node = node.handle();
    let msg = support::embedded::req(1, "tasks/update", answer(task, key), true);
    tokio::spawn(async move { node.handle_json(msg, &mcp_tasks::Owner::anonymous()).await })
}

/// Waits until a read on `node` shows `key` of `task` answered.
async fn wait_until_read_answered(node: &Runtime, task: &str, key: &str) {
    eventually(
        &format!("a read shows the answer to {key}"),
        Duration::from_secs(10),
        async || !waits_for(&get(node, task).await, key),
    )
    .await;
}

/// X3b of the scale-out review (the `LostUpdate`), in process and exact. Node a runs a task
/// waiting for `k0`; node b takes its lease (as its claim does once a's lease lapsed), and
/// the answer to `k0` goes through b, which then asks for `k1`. a's actor, left from the lease
/// it lost, still waits for `k0`: it never wrote, so it was never fenced, and a still
/// believes it holds the task. The answer to `k1` then reaches a's actor with the breaker
/// `break::skip_is_behind` on, as a request does when the record moves right after the
/// dispatcher compared it with the actor (the check-then-act window). The actor knows no
/// `k1`, so the update changes nothing there; acknowledging it would lose it (the row stays
/// `input_required` with `k1` pending). The acknowledgement that writes nothing is checked
/// against the lease in the database instead, refused as fenced, and the request goes to b,
/// which applies it: acknowledged means applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_reaching_an_actor_from_a_lost_lease_is_applied_not_dropped() {
    if !crate::support::own_process(
        "postgres_failpoints::an_answer_reaching_an_actor_from_a_lost_lease_is_applied_not_dropped",
    )
    .await
    {
        return;
    }
    let Some(pg) = pg::fresh().await else { return };
    let scenario = FailScenario::setup();
    // A minute: no periodic reconciliation (every 20 s) stops a's actor during the test.
    let ttl = Duration::from_secs(60);
    let (a, a_store) = node(&pg, "a", ttl).await;
    let (b, b_store) = node(&pg, "b", ttl).await;
    let task = create(&a, "two_questions", json!({})).await;
    wait_status(&a, &task, "input_required").await;

    assert!(pg.take_over(&b_store, &task, "a").await.is_some());
    let r = call(&b, "tasks/update", answer(&task, "k0")).await;
    assert!(r.get("result").is_some(), "{r}");
    let waiting = wait_status(&b, &task, "input_required").await;
    assert!(waiting["inputRequests"].get("k1").is_some(), "{waiting}");
    assert!(
        a_store.holds(&task),
        "a never learnt that it lost the lease"
    );

    fail::cfg("break::skip_is_behind", "return").unwrap();
    let r = call(&a, "tasks/update", answer(&task, "k1")).await;
    fail::remove("break::skip_is_behind");
    assert!(r.get("result").is_some(), "{r}");
    // Acknowledged: so applied, at once (b's durable write came before the ack).
    let started = Instant::now();
    let state = get(&b, &task).await["result"].clone();
    assert_ne!(
        state["status"], "input_required",
        "the acknowledged answer to k1 was dropped: {state}"
    );
    let done = wait_status(&b, &task, "completed").await;
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(
        done["result"]["content"][0]["text"],
        r#"k0 {"action":"accept","content":{"ok":true}}; k1 {"action":"accept","content":{"ok":true}}"#
    );
    assert!(!a_store.holds(&task), "a learnt that it lost the lease");
    scenario.teardown();
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}

/// The same window on the other path: the answer is recorded in the database by a third node
/// for the node the row names, and that node's inbox gives it to a stale actor. Node a lost
/// the task's lease to b (which then asked for `k1`) and claimed it back, but its actor is
/// still the one from its first lease, waiting for `k0` (the replacement a claim starts had
/// not happened yet). The answer to `k1`, sent to node c, goes through a's inbox to that
/// actor with the breaker `break::skip_is_behind` on. The confirmation of the acknowledgement
/// finds the record moved under a's own lease (a conflict): a's actor is rebuilt from the
/// record, the command stays recorded and is applied at a's next poll, and only then does c
/// acknowledge. Without the confirmation c acknowledges an answer that was dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_recorded_for_a_node_whose_actor_is_stale_is_applied_not_dropped() {
    if !crate::support::own_process("postgres_failpoints::an_answer_recorded_for_a_node_whose_actor_is_stale_is_applied_not_dropped").await {
        return;
    }
    let Some(pg) = pg::fresh().await else { return };
    let scenario = FailScenario::setup();
    let ttl = Duration::from_secs(60);
    let (a, a_store) = node(&pg, "a", ttl).await;
    let (b, b_store) = node(&pg, "b", ttl).await;
    let (c, _c_store) = node(&pg, "c", ttl).await;
    let task = create(&a, "two_questions", json!({})).await;
    wait_status(&a, &task, "input_required").await;

    assert!(pg.take_over(&b_store, &task, "a").await.is_some());
    let r = call(&b, "tasks/update", answer(&task, "k0")).await;
    assert!(r.get("result").is_some(), "{r}");
    let waiting = wait_status(&b, &task, "input_required").await;
    assert!(waiting["inputRequests"].get("k1").is_some(), "{waiting}");
    // a claims the task back; its actor from the first lease still waits for k0.
    assert!(pg.take_over(&a_store, &task, "b").await.is_some());

    fail::cfg("break::skip_is_behind", "return").unwrap();
    let r = call(&c, "tasks/update", answer(&task, "k1")).await;
    fail::remove("break::skip_is_behind");
    assert!(r.get("result").is_some(), "{r}");
    let state = get(&c, &task).await["result"].clone();
    assert_ne!(
        state["status"], "input_required",
        "the acknowledged answer to k1 was dropped: {state}"
    );
    let done = wait_status(&c, &task, "completed").await;
    assert_eq!(
        done["result"]["content"][0]["text"],
        r#"k0 {"action":"accept","content":{"ok":true}}; k1 {"action":"accept","content":{"ok":true}}"#
    );
    scenario.teardown();
    a.shutdown().await;
    b.shutdown().await;
    c.shutdown().await;
    pg.drop().await;
}

/// Bounded database calls (X6 of the scale-out review: a frozen peer holding a row lock). A
/// node stopped in the middle of a transaction that holds a task's row lock — here its group
/// commit, held inside the transaction by the failpoint `store::group_commit` for 25 s, far
/// past every bound — does not keep the lock: each store connection sets
/// `idle_in_transaction_session_timeout` (`SessionBounds::idle`, max(TTL, 5 s)), so the
/// database ends the idle transaction and the row can be locked again within that bound, long
/// before the node wakes. A raw session on a thread and runtime of its own watches the lock
/// (the frozen node blocks one of the test runtime's workers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_left_open_by_a_frozen_node_releases_its_row_locks_within_the_bound() {
    if !crate::support::own_process("postgres_failpoints::a_transaction_left_open_by_a_frozen_node_releases_its_row_locks_within_the_bound").await {
        return;
    }
    let Some(pg) = pg::fresh().await else { return };
    let scenario = FailScenario::setup();
    let ttl = Duration::from_secs(3);
    // `SessionBounds::for_lease_ttl(3 s).idle`: max(TTL, 5 s).
    let idle = Duration::from_secs(5);
    let (a, _a_store) = node(&pg, "a", ttl).await;
    let task = create(&a, "two_questions", json!({})).await;
    wait_status(&a, &task, "input_required").await;

    // The watcher: how long the row stays locked once it is seen locked.
    let url = format!("{}?options=-c%20search_path%3D{}", pg.url, pg.schema);
    let id = task.clone();
    let watcher = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            let start = Instant::now();
            let mut locked_at = None;
            loop {
                let tx = client.transaction().await.unwrap();
                let locked = match tx
                    .query(
                        "SELECT id FROM mcp_tasks WHERE id = $1 FOR UPDATE NOWAIT",
                        &[&id],
                    )
                    .await
                {
                    Ok(_) => false,
                    Err(e) if e.code().is_some_and(|c| c.code() == "55P03") => true,
                    Err(e) => panic!("locking the row: {e}"),
                };
                let _ = tx.rollback().await;
                match (locked, locked_at) {
                    (true, None) => locked_at = Some(Instant::now()),
                    (false, Some(at)) => return Ok::<Duration, String>(at.elapsed()),
                    _ => {}
                }
                if start.elapsed() > Duration::from_secs(60) {
                    return Err(format!("locked {}", locked_at.is_some()));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    });

    // The next group commit (the answer's) stops inside its transaction, the row updated.
    fail::cfg("store::group_commit", "1*sleep(25000)").unwrap();
    let answering = tokio::spawn({
        let handle = a.handle();
        let task = task.clone();
        async move {
            let request = support::embedded::req(1, "tasks/update", answer(&task, "k0"), true);
            let _ = handle
                .handle_json(request, &mcp_tasks::Owner::anonymous())
                .await;
        }
    });
    let held = tokio::task::spawn_blocking(move || watcher.join().unwrap())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the row lock was never seen held and then released: {e}"));
    fail::remove("store::group_commit");
    assert!(
        held < idle + Duration::from_secs(5),
        "the frozen transaction kept the row locked for {held:?} (bound {idle:?})"
    );
    let _ = tokio::time::timeout(Duration::from_secs(40), answering).await;
    scenario.teardown();
    a.shutdown().await;
    pg.drop().await;
}

/// Issue: reads from the lease holder's memory. Node a holds a task's lease (valid: its
/// heartbeat renews it), so its `tasks/get` answers from its actor's committed snapshot. A
/// commit of a's actor is durable — node b reads the new record from the store — but a's actor
/// has not published it yet (the failpoint `task::after_commit` holds it there). A read on a
/// must not answer the older snapshot then: it waits for the commit in flight (or reads the
/// store). Without the actor's in-flight flag a answers `k0` pending after b showed it
/// answered: a read going backwards across replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_holder_never_answers_older_than_the_store() {
    if !crate::support::own_process(
        "postgres_failpoints::the_lease_holder_never_answers_older_than_the_store",
    )
    .await
    {
        return;
    }
    let Some(pg) = pg::fresh().await else { return };
    let scenario = FailScenario::setup();
    let (a, _a_store, b, task) = a_reads_a_waiting_task_from_memory(&pg).await;
    fail::cfg("task::after_commit", "1*sleep(1500)").unwrap();
    let answering = answer_in_background(&a, &task, "k0");
    // The store has the answer's commit (k0 no longer pending) while a's actor is held
    // after it, before it publishes.
    wait_until_read_answered(&b, &task, "k0").await;
    let on_a = get(&a, &task).await;
    assert!(
        !waits_for(&on_a, "k0"),
        "a answered an older state than the store's: {on_a}"
    );
    fail::remove("task::after_commit");
    let _ = answering.await;
    scenario.teardown();
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}

/// The lease holder's snapshot after a commit whose outcome is unknown. Node a holds a task
/// waiting for `k0` and answers reads from memory. The commit of the answer to `k0` reaches
/// the database, but its acknowledgement is lost (the store's test hook reports it failed):
/// the store is ahead of a's actor, which fails and is replaced from the store by the
/// supervisor — at once here, seconds later when the supervisor is busy restarting tasks
/// through a database outage (as in the replica crash suite); the failpoint
/// `task::after_failed_commit` holds the actor in that window. A read on a must not answer
/// the actor's older snapshot then (`k0` pending after b showed it answered): the snapshot
/// of an actor whose commit failed is never served from memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_holder_whose_commit_ack_was_lost_never_answers_its_older_snapshot() {
    if !crate::support::own_process(
        "postgres_failpoints::a_lease_holder_whose_commit_ack_was_lost_never_answers_its_older_snapshot",
    )
    .await
    {
        return;
    }
    let Some(pg) = pg::fresh().await else { return };
    let scenario = FailScenario::setup();
    let (a, a_store, b, task) = a_reads_a_waiting_task_from_memory(&pg).await;
    fail::cfg("task::after_failed_commit", "1*sleep(1500)").unwrap();
    mcp_tasks::internals::pg_faults::lose_commit_acks(&a_store, 1);
    let answering = answer_in_background(&a, &task, "k0");
    wait_until_read_answered(&b, &task, "k0").await;
    let on_a = get(&a, &task).await;
    assert!(
        !waits_for(&on_a, "k0"),
        "a answered its actor's snapshot from before a commit that the store holds: {on_a}"
    );
    fail::remove("task::after_failed_commit");
    // Either answer is right: the lost acknowledgement's error, or the acknowledgement of the
    // retry that found the answer in the store.
    let answered = answering.await.unwrap().expect("an answer");
    assert!(
        answered.get("result").is_some() || answered["error"]["code"] == -32603,
        "{answered}"
    );
    // The actor is replaced from the store: the task goes on to its second question.
    eventually("a asks k1", Duration::from_secs(20), async || {
        waits_for(&get(&a, &task).await, "k1")
    })
    .await;
    scenario.teardown();
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}

/// A claim's record handed to the supervisor after a request started the task here. Node b
/// runs a task waiting for `k0` and stops renewing its lease; node a claims the task as an
/// orphan, and the failpoint `runtime::before_claimed` holds the claimed record before it
/// reaches a's supervisor. Meanwhile the answer to `k0` reaches a, which holds the lease now:
/// it starts an actor from the row, which commits the answer and asks `k1`. When the claimed
/// record (still waiting for `k0`) arrives, it must not replace that actor: before, a ran the
/// task from the older record and answered reads with `k0` pending after acknowledging it
/// (the `UpdateNotVisible` of the replica crash suite); now the actor is stopped and waited
/// for, and the task runs from the row read after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_handed_over_late_never_replaces_a_newer_actor() {
    if !crate::support::own_process(
        "postgres_failpoints::a_claim_handed_over_late_never_replaces_a_newer_actor",
    )
    .await
    {
        return;
    }
    let Some(pg) = pg::fresh().await else { return };
    let scenario = FailScenario::setup();
    let ttl = Duration::from_millis(900);
    let (a, a_store) = node(&pg, "a", ttl).await;
    let (b, b_store) = node(&pg, "b", ttl).await;
    let task = create(&b, "two_questions", json!({})).await;
    wait_status(&b, &task, "input_required").await;
    fail::cfg("runtime::before_claimed", "1*return(2500)").unwrap();
    mcp_tasks::internals::pg_faults::pause_heartbeat(&b_store, true);
    eventually("a claims b's task", Duration::from_secs(20), async || {
        a_store.holds(&task)
    })
    .await;
    // Claimed, the record not yet handed over (the failpoint holds it for 2.5 s).
    let r = call(&a, "tasks/update", answer(&task, "k0")).await;
    assert!(r.get("result").is_some(), "{r}");
    eventually("a asks k1", Duration::from_secs(10), async || {
        waits_for(&get(&a, &task).await, "k1")
    })
    .await;
    // The claimed record arrives: reads on a never go back to `k0` pending.
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        let r = get(&a, &task).await;
        assert!(
            !waits_for(&r, "k0"),
            "a went back to the claimed record, older than the answer it acknowledged: {r}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    fail::remove("runtime::before_claimed");
    let r = call(&a, "tasks/update", answer(&task, "k1")).await;
    assert!(r.get("result").is_some(), "{r}");
    let done = wait_status(&a, &task, "completed").await;
    assert_eq!(
        done["result"]["content"][0]["text"],
        r#"k0 {"action":"accept","content":{"ok":true}}; k1 {"action":"accept","content":{"ok":true}}"#
    );
    mcp_tasks::internals::pg_faults::pause_heartbeat(&b_store, false);
    scenario.teardown();
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}
