//! Passivation (`RuntimeConfig::passivate_after`): a task waiting for input is parked without
//! an actor and resumes exactly where it was — its input keys, its journal, its listeners —
//! when it is answered, cancelled, expired, or after a restart of the runtime. On redb and on
//! PostgreSQL.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use mcp_tasks::clock::ManualClock;
use mcp_tasks::tool::{CallToolResult, InputRequest, TaskPolicy, ToolDescriptor, tool_fn};
use mcp_tasks::{Dispatched, MessageStream, Owner, RequestContext, Runtime, RuntimeConfig};
use serde_json::{Value, json};

use crate::backend;
#[cfg(feature = "postgres")]
use crate::support;

use backend::Place;
use support::embedded::{call, create, get, req, wait_status};

/// How often the tool was started and how often its recorded steps ran.
#[derive(Default)]
struct Counts {
    starts: AtomicUsize,
    prep: AtomicUsize,
    middle: AtomicUsize,
}

fn form(message: &str) -> InputRequest {
    InputRequest::elicit_form(
        message,
        json!({ "type": "object", "properties": { "text": { "type": "string" } } }),
    )
}

/// `two_questions`: a recorded step, a first question, a second recorded step, a second
/// question; completes with both answers and the two steps' values.
fn two_questions(counts: Arc<Counts>, stay_active: bool) -> Arc<dyn mcp_tasks::tool::Tool> {
    let mut descriptor =
        ToolDescriptor::new("two_questions", "asks twice").task_policy(TaskPolicy::Always);
    if stay_active {
        descriptor = descriptor.stay_active_while_waiting();
    }
    tool_fn(descriptor, move |ctx, _| {
        let counts = counts.clone();
        async move {
            counts.starts.fetch_add(1, Ordering::SeqCst);
            let prep: u64 = ctx
                .step("prep", || async {
                    Ok(counts.prep.fetch_add(1, Ordering::SeqCst) as u64 + 100)
                })
                .await?;
            let first = ctx.input("first", form("first?")).await?;
            let middle: u64 = ctx
                .step("middle", || async {
                    Ok(counts.middle.fetch_add(1, Ordering::SeqCst) as u64 + 200)
                })
                .await?;
            let second = ctx.input("second", form("second?")).await?;
            Ok(CallToolResult::text(format!(
                "{prep} {} {middle} {}",
                first["content"]["text"].as_str().unwrap_or_default(),
                second["content"]["text"].as_str().unwrap_or_default()
            )))
        }
    })
}

fn answer(text: &str) -> Value {
    json!({ "action": "accept", "content": { "text": text } })
}

async fn update(rt: &Runtime, task: &str, key: &str, text: &str) -> Value {
    let r = call(
        rt,
        "tasks/update",
        json!({ "taskId": task, "inputResponses": { key: answer(text) } }),
    )
    .await;
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    r
}

/// Waits until the runtime has `parked` parked tasks and `active` task actors.
async fn wait_parked(rt: &Runtime, parked: usize, active: usize) {
    for _ in 0..400 {
        if rt.parked_tasks() == parked && rt.live_tasks() == active {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "expected {parked} parked and {active} active, found {} parked and {} active",
        rt.parked_tasks(),
        rt.live_tasks()
    );
}

/// Waits until the task asks for `key`.
async fn wait_asking(rt: &Runtime, task: &str, key: &str) -> Value {
    for _ in 0..400 {
        let r = get(rt, task).await;
        if r["result"]["inputRequests"].get(key).is_some() {
            return r["result"].clone();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("task {task} never asked for {key}: {}", get(rt, task).await);
}

fn parking_config() -> RuntimeConfig {
    let mut config = RuntimeConfig::default();
    config.passivate_after = Some(Duration::ZERO);
    config
}

async fn listen(rt: &Runtime, task: &str) -> MessageStream {
    let msg = req(
        7,
        "subscriptions/listen",
        json!({ "notifications": { "taskIds": [task] } }),
        true,
    );
    match rt
        .handle()
        .dispatch_json(msg, &RequestContext::new(Owner::anonymous()))
        .await
    {
        Dispatched::Stream(s) => s,
        other => panic!("listen did not stream: {other:?}"),
    }
}

/// The next `notifications/tasks` of `stream` (the acknowledgement skipped).
async fn next_notification(stream: &mut MessageStream) -> Value {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("a message within 10 s")
            .expect("the stream is open");
        if message["method"] == "notifications/tasks" {
            return message["params"].clone();
        }
    }
}

/// Notifications until one with `status` asking for `key` (or without `key`: any with
/// `status`).
async fn notified(stream: &mut MessageStream, status: &str, key: Option<&str>) -> Value {
    loop {
        let n = next_notification(stream).await;
        if n["status"] == status && key.is_none_or(|k| n["inputRequests"].get(k).is_some()) {
            return n;
        }
        assert_ne!(n["status"], "completed", "finished before {status}: {n}");
    }
}

/// Starts `builder` with `two_questions` and one task of it, and waits until the task asks
/// its first question and is parked (the builder's configuration parks at once); the
/// runtime, the task's id and its state then.
async fn parked_at_first_question(
    builder: mcp_tasks::RuntimeBuilder,
    counts: &Arc<Counts>,
) -> (Runtime, String, Value) {
    let rt = builder
        .tool(two_questions(counts.clone(), false))
        .start()
        .await
        .unwrap();
    let task = create(&rt, "two_questions", json!({})).await;
    let asking = wait_asking(&rt, &task, "first").await;
    wait_parked(&rt, 1, 0).await;
    (rt, task, asking)
}

on_both_stores! {
async fn a_parked_task_resumes_where_it_was_when_answered(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let counts = Arc::new(Counts::default());
    let builder = place.builder("p").await.config(parking_config());
    let (rt, task, asking) = parked_at_first_question(builder, &counts).await;
    assert_eq!(asking["status"], "input_required");
    // Parked: read from the store, exactly the state it parked in.
    assert_eq!(get(&rt, &task).await["result"], asking);

    // A listener that starts while the task is parked gets its state, then what follows.
    let mut stream = listen(&rt, &task).await;
    let first = notified(&mut stream, "input_required", Some("first")).await;
    assert_eq!(first["taskId"], task.as_str());

    update(&rt, &task, "first", "one").await;
    let second = wait_asking(&rt, &task, "second").await;
    assert!(second["inputRequests"].get("first").is_none(), "{second}");
    notified(&mut stream, "input_required", Some("second")).await;
    wait_parked(&rt, 1, 0).await;
    assert_eq!(counts.starts.load(Ordering::SeqCst), 2, "started again by the answer");

    // An answer for a key no longer pending changes nothing and wakes nothing for long.
    update(&rt, &task, "first", "again").await;
    assert_eq!(get(&rt, &task).await["result"]["inputRequests"], second["inputRequests"]);

    update(&rt, &task, "second", "two").await;
    let done = wait_status(&rt, &task, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], "100 one 200 two", "{done}");
    let n = notified(&mut stream, "completed", None).await;
    assert_eq!(n["result"]["content"][0]["text"], "100 one 200 two");
    // Each recorded step ran once, however often the tool started.
    assert_eq!(counts.prep.load(Ordering::SeqCst), 1);
    assert_eq!(counts.middle.load(Ordering::SeqCst), 1);
    assert!(counts.starts.load(Ordering::SeqCst) >= 3);
    wait_parked(&rt, 0, 0).await;
    rt.shutdown().await;
    place.finish().await;
}
}

on_both_stores! {
async fn a_parked_task_is_cancelled(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let counts = Arc::new(Counts::default());
    let builder = place.builder("c").await.config(parking_config());
    let (rt, task, _) = parked_at_first_question(builder, &counts).await;
    let ack = call(&rt, "tasks/cancel", json!({ "taskId": task })).await;
    assert_eq!(ack["result"]["resultType"], "complete", "{ack}");
    wait_status(&rt, &task, "cancelled").await;
    wait_parked(&rt, 0, 0).await;
    assert_eq!(counts.prep.load(Ordering::SeqCst), 1);
    rt.shutdown().await;
    place.finish().await;
}
}

on_both_stores! {
async fn a_parked_task_expires(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let clock = ManualClock::new(1_800_000_000_000);
    let mut config = parking_config();
    config.default_ttl = Some(Duration::from_secs(60));
    config.reaper_interval = Duration::from_millis(10);
    let counts = Arc::new(Counts::default());
    let builder = place.builder("e").await
        .config(config)
        .clock(Arc::new(clock.clone()));
    let (rt, task, _) = parked_at_first_question(builder, &counts).await;
    clock.advance(60_000);
    wait_parked(&rt, 0, 0).await;
    let stored = mcp_tasks::internals::runtime_store(&rt)
        .get(&task)
        .await
        .unwrap()
        .expect("kept during retention");
    let record = mcp_tasks::internals::persist::decode(&stored).unwrap();
    assert_eq!(record.status, mcp_tasks::TaskStatus::Failed);
    // Expired by its actor without running the tool again.
    assert_eq!(counts.starts.load(Ordering::SeqCst), 1);
    rt.shutdown().await;
    place.finish().await;
}
}

on_both_stores! {
async fn a_task_waiting_at_a_restart_is_parked_and_resumes(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let counts = Arc::new(Counts::default());
    // First run: passivation off, the task waits with its actor.
    let mut config = RuntimeConfig::default();
    config.passivate_after = None;
    let rt = place.builder("r").await
        .config(config)
        .tool(two_questions(counts.clone(), false))
        .start()
        .await
        .unwrap();
    let task = create(&rt, "two_questions", json!({})).await;
    wait_asking(&rt, &task, "first").await;
    update(&rt, &task, "first", "one").await;
    let asking = wait_asking(&rt, &task, "second").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!((rt.parked_tasks(), rt.live_tasks()), (0, 1), "never passivated");
    rt.shutdown().await;

    // Second run (the default: passivation on): parked at start, nothing runs.
    let rt = place.builder("r").await
        .tool(two_questions(counts.clone(), false))
        .start()
        .await
        .unwrap();
    assert_eq!((rt.parked_tasks(), rt.live_tasks()), (1, 0));
    assert_eq!(counts.starts.load(Ordering::SeqCst), 1);
    assert_eq!(get(&rt, &task).await["result"], asking);
    update(&rt, &task, "second", "two").await;
    let done = wait_status(&rt, &task, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], "100 one 200 two", "{done}");
    assert_eq!(counts.prep.load(Ordering::SeqCst), 1);
    assert_eq!(counts.middle.load(Ordering::SeqCst), 1);
    assert_eq!(counts.starts.load(Ordering::SeqCst), 2);
    rt.shutdown().await;
    place.finish().await;
}
}

on_both_stores! {
async fn a_parked_task_still_counts_against_its_owners_live_quota(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let mut config = parking_config();
    let mut quotas = mcp_tasks::quota::Quotas::unlimited();
    quotas.max_live_tasks = 1;
    config.quotas = quotas;
    let builder = place.builder("q").await.config(config);
    let (rt, _, _) = parked_at_first_question(builder, &Arc::default()).await;
    let refused = call(&rt, "tools/call", json!({ "name": "two_questions", "arguments": {} })).await;
    assert_eq!(refused["error"]["code"], -32010, "{refused}");
    rt.shutdown().await;
    place.finish().await;
}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_stays_active_is_never_parked() {
    let dir = tempfile::tempdir().unwrap();
    let counts = Arc::new(Counts::default());
    let rt = Runtime::builder(dir.path().join("s.redb"))
        .config(parking_config())
        .tool(two_questions(counts.clone(), true))
        .start()
        .await
        .unwrap();
    let task = create(&rt, "two_questions", json!({})).await;
    wait_asking(&rt, &task, "first").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!((rt.parked_tasks(), rt.live_tasks()), (0, 1));
    rt.shutdown().await;
    // Nor at a restart.
    let rt = Runtime::builder(dir.path().join("s.redb"))
        .config(parking_config())
        .tool(two_questions(counts.clone(), true))
        .start()
        .await
        .unwrap();
    assert_eq!((rt.parked_tasks(), rt.live_tasks()), (0, 1));
    update(&rt, &task, "first", "one").await;
    wait_asking(&rt, &task, "second").await;
    rt.shutdown().await;
}
