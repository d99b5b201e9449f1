//! Replicas over PostgreSQL under the faults production brings, one deterministic schedule
//! each, in process: two processes with one node id, replicas started with different lease
//! TTLs, a replica whose clock is 20 minutes ahead, a replica paused inside a transaction
//! (its row lock held), and database outages longer than the lease TTL. Each test has a
//! schema of its own (crates/mcp-tasks-cli/tests/pg).
#![cfg(feature = "postgres")]

use crate::pg;
use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mcp_tasks::clock::{CLOCK_SKEW_WARNING, Clock, SystemClock};
use mcp_tasks::store::postgres::SessionBounds;
use mcp_tasks::store::{PostgresStore, Store, StoreError, TaskStore};
use mcp_tasks::tool::{CallToolResult, TaskPolicy, ToolDescriptor, tool_fn};
use mcp_tasks::{Runtime, RuntimeBuilder, RuntimeConfig};
use serde_json::{Value, json};
use support::embedded::{call, create, get, wait_status};

fn builder(store: Store) -> RuntimeBuilder {
    let mut config = RuntimeConfig::default();
    config.restart_backoff = Duration::from_millis(10);
    Runtime::builder_with_store(store).config(config)
}

/// `hold`: on node a it runs until `release`; on any other node it completes at once.
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

/// Waits until `store` reads task `task`'s lease as held by `want`.
async fn owner_is(store: &PostgresStore, task: &str, want: &str) {
    for _ in 0..600 {
        let lease = store.lease_of(task).await.unwrap().unwrap();
        if lease.owner.as_deref() == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{want} never took {task} over");
}

/// X4: a second process started with the node id of a live one is refused with a one-line
/// error and changes nothing (the node's row still names the first process); once the first
/// is gone (killed: its heartbeat stops without a clean close), the node id starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_a_live_node_id_is_refused() {
    let Some(pg) = pg::fresh().await else { return };
    // Long enough that a loaded machine does not delay a heartbeat past two thirds of it (the
    // second process would then take the first for gone).
    let ttl = Duration::from_secs(3);
    let first = PostgresStore::open(&pg.url, pg.options("a", ttl))
        .await
        .unwrap();
    let client = pg.client().await;
    let instance = || async {
        client
            .query_one("SELECT instance FROM mcp_nodes WHERE node_id = 'a'", &[])
            .await
            .unwrap()
            .get::<_, Option<String>>(0)
    };
    let running = instance().await;
    assert!(running.is_some());
    let second = PostgresStore::open(&pg.url, pg.options("a", ttl)).await;
    let err = second.expect_err("a second live process with node id a must be refused");
    assert!(
        matches!(&err, StoreError::NodeIdInUse { node, .. } if node == "a"),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        !message.contains('\n') && message.contains("node id `a` is in use"),
        "{message}"
    );
    // The first process still runs as the node id.
    assert!(!first.is_closed());
    assert_eq!(instance().await, running);
    // Killed (no clean close: its row stays, its heartbeat stops): the id starts again.
    drop(first);
    let started = std::time::Instant::now();
    let again = PostgresStore::open(&pg.url, pg.options("a", ttl))
        .await
        .expect("the node id of a process that is gone starts again");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    again.close().await;
    pg.drop().await;
}

/// X8: the lease TTL is the cluster's: a replica started with another one while a node is
/// live is refused (it would take every task from the healthy nodes); with no live node, the
/// new TTL replaces the stored one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_another_lease_ttl_is_refused_while_the_cluster_runs() {
    let Some(pg) = pg::fresh().await else { return };
    let a = PostgresStore::open(&pg.url, pg.options("a", Duration::from_secs(15)))
        .await
        .unwrap();
    let err = PostgresStore::open(&pg.url, pg.options("b", Duration::from_secs(1)))
        .await
        .expect_err("a replica with another lease TTL must be refused");
    match &err {
        StoreError::LeaseTtlMismatch {
            stored,
            requested,
            live,
            ..
        } => {
            assert_eq!(*stored, Duration::from_secs(15));
            assert_eq!(*requested, Duration::from_secs(1));
            assert_eq!(live, "a");
        }
        other => panic!("{other:?}"),
    }
    assert!(!err.to_string().contains('\n'), "{err}");
    // The same TTL joins.
    let b = PostgresStore::open(&pg.url, pg.options("b", Duration::from_secs(15)))
        .await
        .unwrap();
    b.close().await;
    // Nobody live: a new TTL is adopted by the cluster, and then enforced.
    a.close().await;
    let c = PostgresStore::open(&pg.url, pg.options("c", Duration::from_secs(2)))
        .await
        .expect("with no live node the TTL may change");
    let err = PostgresStore::open(&pg.url, pg.options("d", Duration::from_secs(15)))
        .await
        .expect_err("the new TTL is the cluster's now");
    assert!(
        matches!(err, StoreError::LeaseTtlMismatch { stored, .. } if stored == Duration::from_secs(2))
    );
    c.close().await;
    pg.drop().await;
}

/// A wall clock `ahead_ms` ahead of the system's.
struct Ahead(u64);

impl Clock for Ahead {
    fn now_ms(&self) -> u64 {
        SystemClock.now_ms() + self.0
    }
}

/// X5: node b's clock is 20 minutes ahead, the tasks' TTL is 15 minutes. b neither reports a
/// live task as expired nor fails it as expired when it takes it over seconds into its life:
/// on a shared store every decision about time uses the database's clock; b measures how far
/// off it is (and logs a warning).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_clock_is_ahead_does_not_expire_live_tasks() {
    let Some(pg) = pg::fresh().await else { return };
    let ttl = Duration::from_millis(1500);
    const AHEAD: u64 = 20 * 60 * 1000;
    let release = Arc::new(AtomicBool::new(false));
    let mut config = RuntimeConfig::default();
    config.default_ttl = Some(Duration::from_secs(15 * 60));
    config.reaper_interval = Duration::from_millis(50);
    let a_store = Arc::new(
        PostgresStore::open(&pg.url, pg.options("a", ttl))
            .await
            .unwrap(),
    );
    let a = builder(Store::from_backend(a_store.clone()))
        .config(config.clone())
        .tool(hold("a", release.clone()))
        .start()
        .await
        .unwrap();
    let b = builder(
        Store::postgres(&pg.url, pg.options("b", ttl))
            .await
            .unwrap(),
    )
    .config(config)
    .local_clock(Arc::new(Ahead(AHEAD)))
    .tool(hold("b", release.clone()))
    .start()
    .await
    .unwrap();

    let task = create(&a, "hold", json!({})).await;
    // b reads the task as live (by its own clock it would be 5 minutes past its expiry).
    let seen = get(&b, &task).await;
    assert_eq!(seen["result"]["status"], "working", "{seen}");
    let offset = b.clock_offset_ms().expect("b decides by the store's clock");
    assert!(
        offset.abs_diff(AHEAD as i64) < 5_000,
        "b measured its clock {offset} ms ahead"
    );
    assert!(
        offset.unsigned_abs() > CLOCK_SKEW_WARNING.as_millis() as u64,
        "beyond the bound that is logged"
    );
    let own = a.clock_offset_ms().expect("a too");
    assert!(
        own.unsigned_abs() < CLOCK_SKEW_WARNING.as_millis() as u64,
        "{own}"
    );
    // a stops heartbeating; b takes the task over seconds into its 15 minutes and runs it.
    mcp_tasks::internals::pg_faults::pause_heartbeat(&a_store, true);
    let done = wait_status(&b, &task, "completed").await;
    assert_eq!(
        done["result"]["content"][0]["text"], "done on node b",
        "{done}"
    );
    // The reaper of the skewed replica leaves a fresh task alone too.
    let other = create(&b, "hold", json!({})).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fresh = wait_status(&b, &other, "completed").await;
    assert_eq!(
        fresh["result"]["content"][0]["text"], "done on node b",
        "{fresh}"
    );
    release.store(true, Ordering::SeqCst);
    mcp_tasks::internals::pg_faults::pause_heartbeat(&a_store, false);
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}

/// X6: node a is paused inside a write transaction (here: a raw session holds the task's row
/// lock, as a's would) past its lease. A cancel sent to b answers promptly ("busy, retry")
/// instead of blocking b's supervisor behind the lock, a new task on b starts and completes
/// meanwhile, and once the lock is gone the retried cancel takes effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_does_not_wait_for_a_row_a_paused_replica_keeps_locked() {
    let Some(pg) = pg::fresh().await else { return };
    let ttl = Duration::from_millis(900);
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
    let b = builder(
        Store::postgres(&pg.url, pg.options("b", ttl))
            .await
            .unwrap(),
    )
    .tool(hold("b", release.clone()))
    .start()
    .await
    .unwrap();
    let task = create(&a, "hold", json!({})).await;

    let locker = pg.client().await;
    locker.batch_execute("BEGIN").await.unwrap();
    locker
        .query_one(
            "SELECT seq FROM mcp_tasks WHERE id = $1 FOR UPDATE",
            &[&task],
        )
        .await
        .unwrap();
    mcp_tasks::internals::pg_faults::pause_heartbeat(&a_store, true);
    tokio::time::sleep(ttl * 2).await;

    let bound = Duration::from_secs(10);
    let answer = tokio::time::timeout(bound, call(&b, "tasks/cancel", json!({ "taskId": task })))
        .await
        .expect("the cancel is answered, not blocked behind the row lock");
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("locked"), "{message}");
    // b's supervisor is not wedged: a new task starts and completes.
    let fresh = tokio::time::timeout(bound, create(&b, "hold", json!({})))
        .await
        .expect("a new task is created");
    let done = tokio::time::timeout(bound, wait_status(&b, &fresh, "completed"))
        .await
        .expect("a new task runs while the other row is locked");
    assert_eq!(done["result"]["content"][0]["text"], "done on node b");

    // The paused transaction ends (PostgreSQL ends it after its idle timeout): the task is
    // taken over (by b's claim loop or the retried cancel, whichever comes first) and ends;
    // the retried cancel is acknowledged.
    locker.batch_execute("ROLLBACK").await.unwrap();
    let mut answer = Value::Null;
    for _ in 0..100 {
        answer = call(&b, "tasks/cancel", json!({ "taskId": task })).await;
        // A takeover racing b's own claim of the orphan may ask to retry shortly.
        let retry = answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("retry"));
        if !retry {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(answer.get("error").is_none(), "{answer}");
    let mut ended = Value::Null;
    for _ in 0..400 {
        ended = get(&b, &task).await;
        if matches!(
            ended["result"]["status"].as_str(),
            Some("cancelled" | "completed")
        ) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        matches!(
            ended["result"]["status"].as_str(),
            Some("cancelled" | "completed")
        ),
        "{ended}"
    );
    assert_eq!(
        a_store
            .lease_of(&task)
            .await
            .unwrap()
            .unwrap()
            .owner
            .as_deref(),
        Some("b")
    );
    release.store(true, Ordering::SeqCst);
    mcp_tasks::internals::pg_faults::pause_heartbeat(&a_store, false);
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}

/// Bounded database calls, seen in the store's own statements: its connections carry
/// `lock_timeout` and `statement_timeout` ([`SessionBounds`] for the lease TTL: 1 s and 5 s at
/// a 900 ms TTL). A write of node a's actor that waits for a row lock another session holds
/// fails after `lock_timeout` as "locked … retry" (without it, it would wait for the
/// statement timeout); a write that runs longer than `statement_timeout` (a test trigger
/// sleeps 30 s in it) is cancelled by the server after that bound (without it, it would run
/// the 30 s). Both answer `-32603`. A command whose commit failed is given once more to a
/// fresh actor (the failed one stopped, as after any failed commit), so the request waits at
/// most twice the bound. Once the cause is gone, the retried requests are applied.
/// (`idle_in_transaction_session_timeout`:
/// `crates/mcp-tasks-cli/tests/pg/postgres_failpoints.rs::a_transaction_left_open_by_a_frozen_node_releases_its_row_locks_within_the_bound`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stores_statements_are_bounded_by_its_session_timeouts() {
    let Some(pg) = pg::fresh().await else { return };
    let ttl = Duration::from_millis(900);
    let bounds = SessionBounds::for_lease_ttl(ttl);
    assert_eq!(
        (bounds.lock, bounds.statement),
        (Duration::from_secs(1), Duration::from_secs(5))
    );
    let release = Arc::new(AtomicBool::new(false));
    // `hold` ignores cancellation: its tasks end when the cancel grace is over.
    let mut config = RuntimeConfig::default();
    config.restart_backoff = Duration::from_millis(10);
    config.cancel_grace = Duration::from_millis(200);
    let a = builder(
        Store::postgres(&pg.url, pg.options("a", ttl))
            .await
            .unwrap(),
    )
    .config(config)
    .tool(hold("a", release.clone()))
    .start()
    .await
    .unwrap();
    let locked = create(&a, "hold", json!({})).await;
    let slow = create(&a, "hold", json!({})).await;
    let raw = pg.client().await;
    // Cancels `task` on a: the answer, and how long it took.
    let cancel = async |task: &str| -> (Value, Duration) {
        let started = Instant::now();
        let answer = tokio::time::timeout(
            Duration::from_secs(20),
            call(&a, "tasks/cancel", json!({ "taskId": task })),
        )
        .await
        .unwrap_or_else(|_| panic!("the cancel of {task} was not answered within 20 s"));
        (answer, started.elapsed())
    };

    // lock_timeout: another session holds the row lock of `locked`.
    raw.batch_execute("BEGIN").await.unwrap();
    raw.query_one(
        "SELECT seq FROM mcp_tasks WHERE id = $1 FOR UPDATE",
        &[&locked],
    )
    .await
    .unwrap();
    let (answer, waited) = cancel(&locked).await;
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("locked"), "{message}");
    assert!(
        waited >= bounds.lock - Duration::from_millis(100) && waited < bounds.statement,
        "the request waited {waited:?} for the row lock (lock_timeout {:?}, twice at most)",
        bounds.lock
    );
    raw.batch_execute("ROLLBACK").await.unwrap();

    // statement_timeout: a write of `slow` runs a trigger that sleeps 30 s.
    raw.batch_execute(&format!(
        "CREATE FUNCTION slow_write() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN PERFORM pg_sleep(30); RETURN NEW; END $$;
         CREATE TRIGGER slow_write BEFORE UPDATE ON mcp_tasks FOR EACH ROW
           WHEN (NEW.id = '{slow}') EXECUTE FUNCTION slow_write();"
    ))
    .await
    .unwrap();
    let (answer, waited) = cancel(&slow).await;
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert!(
        waited >= bounds.statement - Duration::from_millis(100)
            && waited < bounds.statement * 2 + Duration::from_secs(5),
        "the request took {waited:?} (statement_timeout {:?}, twice at most; the trigger sleeps 30 s)",
        bounds.statement
    );
    raw.batch_execute("DROP TRIGGER slow_write ON mcp_tasks")
        .await
        .unwrap();

    // Both causes gone: the retried cancels are applied.
    for task in [&locked, &slow] {
        let mut answer = Value::Null;
        for _ in 0..100 {
            answer = call(&a, "tasks/cancel", json!({ "taskId": task })).await;
            if answer.get("error").is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(answer.get("error").is_none(), "{answer}");
        wait_status(&a, task, "cancelled").await;
    }
    release.store(true, Ordering::SeqCst);
    a.shutdown().await;
    pg.drop().await;
}

/// A node of `pg` with lease TTL `ttl`, a restart budget of 1 and the tool `hang` (never
/// ends): its runtime and its store.
async fn hang_node(pg: &pg::Pg, name: &str, ttl: Duration) -> (Runtime, Arc<PostgresStore>) {
    let store = Arc::new(
        PostgresStore::open(&pg.url, pg.options(name, ttl))
            .await
            .unwrap(),
    );
    let mut config = RuntimeConfig::default();
    config.restart_budget = 1;
    config.restart_backoff = Duration::from_millis(10);
    let hang = tool_fn(
        ToolDescriptor::new("hang", "never ends").task_policy(TaskPolicy::Always),
        |_ctx, _| async {
            std::future::pending::<()>().await;
            Ok(CallToolResult::text("unreachable"))
        },
    );
    let rt = Runtime::builder_with_store(Store::from_backend(store.clone()))
        .config(config)
        .tool(hang)
        .start()
        .await
        .unwrap();
    (rt, store)
}

/// X7: three database outages, each longer than the lease TTL, on a cluster of two healthy
/// nodes: after each, one node takes the task over from the other (whose heartbeat lapsed),
/// and with a restart budget of 1 the task is still running afterwards: an outage is not a
/// crash. (A lapse without an outage still counts:
/// `crates/mcp-tasks-cli/tests/pg/postgres.rs::takeovers_of_lapsed_leases_spend_one_cluster_wide_restart_budget`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_outages_longer_than_the_lease_ttl_do_not_spend_the_restart_budget() {
    let Some(pg) = pg::fresh().await else { return };
    let ttl = Duration::from_millis(1500);
    let node = |name: &'static str| hang_node(&pg, name, ttl);
    let (a, a_store) = node("a").await;
    let (b, b_store) = node("b").await;
    let task = create(&a, "hang", json!({})).await;
    let mut owner = ("a", &a, &a_store);
    let mut other = ("b", &b, &b_store);
    for outage in 1..=3 {
        // The database goes away for both nodes, longer than the TTL.
        mcp_tasks::internals::pg_faults::simulate_outage(&a_store, true);
        mcp_tasks::internals::pg_faults::simulate_outage(&b_store, true);
        tokio::time::sleep(ttl * 2).await;
        // It comes back for the other node first, which takes the task over.
        mcp_tasks::internals::pg_faults::simulate_outage(other.2, false);
        owner_is(other.2, &task, other.0).await;
        mcp_tasks::internals::pg_faults::simulate_outage(owner.2, false);
        std::mem::swap(&mut owner, &mut other);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let seen = get(owner.1, &task).await;
        assert_eq!(
            seen["result"]["status"], "working",
            "after outage {outage}: {seen}"
        );
    }
    let lease = a_store.lease_of(&task).await.unwrap().unwrap();
    assert!(lease.epoch >= 4, "three takeovers: {lease}");
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}

/// The attempt count in the stored record of `task`.
async fn stored_attempts(store: &PostgresStore, task: &str) -> u32 {
    let bytes = store.get(task).await.unwrap().expect("the task is stored");
    mcp_tasks::internals::persist::decode(&bytes)
        .unwrap()
        .attempts
}

/// A pause is not a crash either: a node that stops heartbeating past its lease (a stop of
/// the world, a frozen VM) and then renews its heartbeat in the same process had its task
/// taken over, and the takeover counted an attempt, but the node that took it over gives the
/// attempt back once it sees the renewed heartbeat. With a restart budget of 1, the task
/// survives three such pauses, each of the two nodes pausing in turn (without the refund it
/// is given up at the second takeover). A node that never comes back keeps its takeover
/// counted: `crates/mcp-tasks-cli/tests/pg/postgres.rs::takeovers_of_lapsed_leases_spend_one_cluster_wide_restart_budget`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pauses_past_the_lease_do_not_spend_the_restart_budget() {
    let Some(pg) = pg::fresh().await else { return };
    let ttl = Duration::from_millis(1500);
    let node = |name: &'static str| hang_node(&pg, name, ttl);
    let (a, a_store) = node("a").await;
    let (b, b_store) = node("b").await;
    let task = create(&a, "hang", json!({})).await;
    let mut owner = ("a", &a, &a_store);
    let mut other = ("b", &b, &b_store);
    for pause in 1..=3 {
        mcp_tasks::internals::pg_faults::pause_heartbeat(owner.2, true);
        owner_is(other.2, &task, other.0).await;
        let seen = get(other.1, &task).await;
        assert_eq!(
            seen["result"]["status"], "working",
            "after pause {pause}: {seen}"
        );
        // The paused node wakes (the same process): the takeover's attempt is given back.
        mcp_tasks::internals::pg_faults::pause_heartbeat(owner.2, false);
        let mut attempts = 0;
        for _ in 0..400 {
            attempts = stored_attempts(other.2, &task).await;
            if attempts == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert_eq!(
            attempts, 1,
            "after pause {pause}: the attempt was not given back"
        );
        std::mem::swap(&mut owner, &mut other);
    }
    let seen = get(owner.1, &task).await;
    assert_eq!(seen["result"]["status"], "working", "{seen}");
    let lease = a_store.lease_of(&task).await.unwrap().unwrap();
    assert!(lease.epoch >= 4, "three takeovers: {lease}");
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}
