//! Flow control across replicas on one PostgreSQL schema: a limit holds for the cluster, not
//! per node (observed inside the tool, two runtimes in one process); a replica killed with
//! `kill -9` while it holds every slot frees them with its lease, and the other runs the queue
//! (two `serve` processes); a start rate holds for the cluster within its stated tolerance.
#![cfg(feature = "postgres")]

use crate::pg;
use crate::replicas::Replica;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcp_tasks::quota::FlowLimits;
use mcp_tasks::store::{PostgresStore, Store};
use mcp_tasks::tool::{CallToolResult, TaskPolicy, ToolDescriptor, tool_fn};
use mcp_tasks::{Runtime, RuntimeConfig};
use serde_json::{Value, json};

use crate::support::embedded::{create, get};

/// `work {ms}`: sleeps, counting how many of its runs overlap over every node of the process,
/// and when each started.
fn work(
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    starts: Arc<Mutex<Vec<Instant>>>,
) -> Arc<dyn mcp_tasks::tool::Tool> {
    tool_fn(
        ToolDescriptor::new("work", "sleeps ms milliseconds").task_policy(TaskPolicy::Always),
        move |_, args| {
            let (running, most, starts) = (running.clone(), most.clone(), starts.clone());
            async move {
                let now = running.fetch_add(1, SeqCst) + 1;
                most.fetch_max(now, SeqCst);
                starts.lock().unwrap().push(Instant::now());
                let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                running.fetch_sub(1, SeqCst);
                Ok(CallToolResult::text("worked"))
            }
        },
    )
}

struct Cluster {
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    starts: Arc<Mutex<Vec<Instant>>>,
}

impl Cluster {
    fn new() -> Self {
        Self {
            running: Arc::default(),
            most: Arc::default(),
            starts: Arc::default(),
        }
    }

    async fn node(&self, pg: &pg::Pg, name: &str, limits: FlowLimits) -> Runtime {
        let mut options = pg.options(name, Duration::from_secs(2));
        options.poll_interval = Duration::from_millis(200);
        let store = PostgresStore::open(&pg.url, options).await.unwrap();
        Runtime::builder_with_store(Store::from_backend(Arc::new(store)))
            .config(RuntimeConfig::default())
            .tool(work(
                self.running.clone(),
                self.most.clone(),
                self.starts.clone(),
            ))
            .flow_limits(limits)
            .start()
            .await
            .unwrap()
    }
}

async fn wait_completed(rt: &Runtime, task: &str, bound: Duration) -> Value {
    let deadline = Instant::now() + bound;
    loop {
        let r = get(rt, task).await;
        if r["result"]["status"] == "completed" {
            return r;
        }
        assert!(Instant::now() < deadline, "task {task} not completed: {r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two replicas share one limit of 2: ten one-second tasks, five created on each, never run
/// more than two at once over both (observed inside the tool), all complete, and take at
/// least five seconds. Without cluster-wide slots each node would run two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_limit_of_two() {
    let Some(pg) = pg::fresh().await else { return };
    let cluster = Cluster::new();
    let mut limits = FlowLimits::none();
    limits.add("work=2").unwrap();
    let a = cluster.node(&pg, "a", limits.clone()).await;
    let b = cluster.node(&pg, "b", limits).await;
    let began = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..10 {
        let rt = if i % 2 == 0 { &a } else { &b };
        tasks.push((i % 2, create(rt, "work", json!({ "ms": 1000 })).await));
    }
    // Those over the limit say so (each once its first round answered: a creation is
    // answered before it).
    let mut seen_queued = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_millis(1_500);
    while Instant::now() < deadline {
        for (n, task) in &tasks {
            let r = get(if *n == 0 { &a } else { &b }, task).await;
            if r["result"]["statusMessage"]
                .as_str()
                .is_some_and(|m| m.starts_with("queued: "))
            {
                seen_queued.insert(task.clone());
            }
        }
    }
    assert!(
        seen_queued.len() >= 6,
        "{} of 10 seen queued",
        seen_queued.len()
    );
    for (n, task) in &tasks {
        wait_completed(if *n == 0 { &a } else { &b }, task, Duration::from_secs(60)).await;
    }
    assert_eq!(
        cluster.most.load(SeqCst),
        2,
        "never more than two over both"
    );
    assert!(
        began.elapsed() >= Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );
    a.shutdown().await;
    b.shutdown().await;
    let client = pg.client().await;
    let left: i64 = client
        .query_one("SELECT count(*) FROM mcp_flow", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "every slot was given back");
    drop(client);
    pg.drop().await;
}

/// A start rate of 4/s for the cluster: 24 tasks created at once over two replicas start at
/// most `4 × T + 1` (and one more, the tolerance of a grant delivered late by a node's
/// round) in any span of `T` seconds, and the rate is reached (the 17th start within 5 s
/// of the first, give or take the poll interval).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_rate_holds_for_the_cluster() {
    let Some(pg) = pg::fresh().await else { return };
    let cluster = Cluster::new();
    let mut limits = FlowLimits::none();
    limits.add_rate("work=4/s").unwrap();
    let a = cluster.node(&pg, "a", limits.clone()).await;
    let b = cluster.node(&pg, "b", limits).await;
    let mut tasks = Vec::new();
    for i in 0..24 {
        let rt = if i % 2 == 0 { &a } else { &b };
        tasks.push((i % 2, create(rt, "work", json!({ "ms": 0 })).await));
    }
    for (n, task) in &tasks {
        wait_completed(if *n == 0 { &a } else { &b }, task, Duration::from_secs(60)).await;
    }
    let mut at = cluster.starts.lock().unwrap().clone();
    at.sort();
    assert_eq!(at.len(), 24);
    for (i, x) in at.iter().enumerate() {
        for (j, y) in at.iter().enumerate().skip(i + 1) {
            let span = y.duration_since(*x).as_secs_f64();
            let starts = (j - i + 1) as f64;
            assert!(
                starts <= 4.0 * span + 2.0,
                "{starts} starts within {span:.3} s"
            );
        }
    }
    let reached = at[16].duration_since(at[0]);
    assert!(reached <= Duration::from_millis(5_000), "{reached:?}");
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}

/// `kill -9` of the replica holding both slots of a limit of 2: its slots go with its lease,
/// and within the lease TTL (and the other's poll interval) the other replica starts its
/// queued tasks, and finishes all of them. (That no more
/// than two run at once is observed inside the tool by `two_replicas_share_one_limit_of_two`;
/// from outside, a dead replica's tasks still read `working` until they are taken over.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_with_both_slots_frees_them_with_its_lease() {
    let Some(pg) = pg::fresh().await else { return };
    let store = pg.url_with_schema();
    let tools = [
        "--fixtures",
        "bench",
        "--max-running",
        "sleep_task=2",
        "--replica-poll",
        "200ms",
    ];
    let a = Replica::spawn_with(&store, "a", "1s", &tools);
    let b = Replica::spawn_with(&store, "b", "1s", &tools);
    let create = async |r: &Replica, ms: u64| {
        let created = r
            .call(
                "tools/call",
                json!({ "name": "sleep_task", "arguments": { "ms": ms } }),
            )
            .await;
        created["result"]["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("no task: {created}"))
            .to_owned()
    };
    let held = [create(&a, 60_000).await, create(&a, 60_000).await];
    // A creation answers before its task's flow-control round: wait until a's two hold the
    // slots.
    let client = pg.client().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let running: i64 = client
            .query_one(
                "SELECT count(*) FROM mcp_flow WHERE started IS NOT NULL AND node_id = 'a'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if running == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "a's tasks never held both slots");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(client);
    let mut queue = Vec::new();
    for _ in 0..3 {
        queue.push(create(&b, 300).await);
    }
    let message = |r: &Value| r["result"]["statusMessage"].as_str().map(str::to_owned);
    for task in &queue {
        // The queued message is committed just after the task's creation.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = b.get(task).await;
            if message(&r).is_some_and(|m| m.starts_with("queued: ")) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "b's tasks wait for a's slots: {r}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for task in &queue {
        let r = b.get(task).await;
        assert_eq!(r["result"]["status"], "working", "still queued: {r}");
    }
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let killed = Instant::now();
    // b's queue runs: its three short tasks complete (the taken-over ones are cancelled as
    // soon as they are seen running, so that they do not hold the slots for a minute).
    let mut done = Vec::new();
    let deadline = killed + Duration::from_secs(30);
    let mut first_started: Option<Duration> = None;
    let mut cancelled: Vec<String> = Vec::new();
    while done.len() < queue.len() {
        assert!(
            Instant::now() < deadline,
            "b's queue did not run after the kill"
        );
        for task in held.iter().chain(&queue) {
            let r = b.get(task).await;
            let working = r["result"]["status"] == "working"
                && !message(&r).is_some_and(|m| m.starts_with("queued: "));
            if held.contains(task) && working && !cancelled.contains(task) {
                let c = b.call("tasks/cancel", json!({ "taskId": task })).await;
                if c.get("error").is_none() {
                    cancelled.push(task.clone());
                }
            }
            if queue.contains(task) && (working || r["result"]["status"] == "completed") {
                first_started.get_or_insert(killed.elapsed());
            }
            if queue.contains(task) && r["result"]["status"] == "completed" && !done.contains(task)
            {
                done.push(task.clone());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // a's slots come back when its lease lapses (at most the TTL after the kill), at b's next
    // round (poll 200 ms): 4 s of slack for a loaded machine.
    let first = first_started.unwrap();
    assert!(
        first < Duration::from_secs(5),
        "b's first queued task started {first:?} after the kill (lease TTL 1 s)"
    );
    drop(b);
    pg.drop().await;
}

/// The queued tasks of a replica killed with `kill -9` are taken over in their order: under a
/// limit of 1, a runs a long task and queues three short ones; once a is killed, b takes all
/// four over, the long one (the oldest) runs first and is cancelled as soon as b runs it, and
/// the three then run one at a time, oldest first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_tasks_of_a_killed_replica_are_taken_over_in_order() {
    let Some(pg) = pg::fresh().await else { return };
    let store = pg.url_with_schema();
    let tools = [
        "--fixtures",
        "bench",
        "--max-running",
        "sleep_task=1",
        "--replica-poll",
        "200ms",
    ];
    let mut a = Replica::spawn_with(&store, "a", "1s", &tools);
    let b = Replica::spawn_with(&store, "b", "1s", &tools);
    let create = async |r: &Replica, ms: u64| {
        let created = r
            .call(
                "tools/call",
                json!({ "name": "sleep_task", "arguments": { "ms": ms } }),
            )
            .await;
        created["result"]["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("no task: {created}"))
            .to_owned()
    };
    let long = create(&a, 60_000).await;
    let mut queue = Vec::new();
    for _ in 0..3 {
        queue.push(create(&a, 400).await);
        // Distinct creation times: the order to keep is unambiguous.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let message = |r: &Value| r["result"]["statusMessage"].as_str().map(str::to_owned);
    for task in &queue {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = a.get(task).await;
            if message(&r).is_some_and(|m| m.starts_with("queued: ")) {
                break;
            }
            assert!(Instant::now() < deadline, "a queues its short tasks: {r}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let mut cancelled = false;
    let mut order: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while order.len() < queue.len() {
        assert!(
            Instant::now() < deadline,
            "b did not run a's queue: {order:?}"
        );
        if !cancelled {
            let r = b.get(&long).await;
            if r["result"]["status"] == "working"
                && !message(&r).is_some_and(|m| m.starts_with("queued: "))
            {
                let c = b.call("tasks/cancel", json!({ "taskId": long })).await;
                cancelled = c.get("error").is_none();
            }
        }
        for task in &queue {
            let r = b.get(task).await;
            let started = r["result"]["status"] != "working"
                || !message(&r).is_some_and(|m| m.starts_with("queued: "));
            if started && !order.contains(task) {
                order.push(task.clone());
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(order, queue, "started in their creation order");
    for task in &queue {
        let deadline = Instant::now() + Duration::from_secs(30);
        while b.get(task).await["result"]["status"] != "completed" {
            assert!(Instant::now() < deadline, "{task} did not complete");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    drop(b);
    pg.drop().await;
}
