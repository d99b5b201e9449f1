//! Flow control: running-task limits that queue instead of refusing (`RuntimeBuilder::
//! max_running`, `serve --max-running`). Time is tokio's paused time where the tools only
//! sleep, so the durations asserted are exact, not measured.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcp_tasks::clock::ManualClock;
use mcp_tasks::store::Store;
use mcp_tasks::tool::{CallToolResult, TaskPolicy, ToolDescriptor, tool_fn};
use mcp_tasks::{Owner, Runtime, RuntimeConfig};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::support::embedded::{call, get, req};

const BIN: &str = env!("CARGO_BIN_EXE_mcp-tasks");

/// A tool that sleeps one second, counting how many of its runs overlap (observed inside).
type Counter = Arc<AtomicUsize>;
type Starts = Arc<Mutex<Vec<String>>>;

fn sleeper(
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    starts: Arc<Mutex<Vec<String>>>,
) -> Arc<dyn mcp_tasks::tool::Tool> {
    tool_fn(
        ToolDescriptor::new("sleep1", "sleeps one second")
            .task_policy(TaskPolicy::Always)
            .initial_status_message("sleeping"),
        move |ctx, args| {
            let (running, most, starts): (Counter, Counter, Starts) =
                (running.clone(), most.clone(), starts.clone());
            async move {
                let now = running.fetch_add(1, SeqCst) + 1;
                most.fetch_max(now, SeqCst);
                let who = args.get("who").and_then(Value::as_str).unwrap_or("");
                starts
                    .lock()
                    .unwrap()
                    .push(format!("{who}:{}", ctx.owner().principal));
                tokio::time::sleep(Duration::from_secs(1)).await;
                running.fetch_sub(1, SeqCst);
                Ok(CallToolResult::text("slept"))
            }
        },
    )
}

fn owner(principal: &str) -> Owner {
    Owner {
        tenant: "t".into(),
        principal: principal.into(),
    }
}

async fn create_as(rt: &Runtime, who: &Owner, tool: &str, arguments: Value) -> String {
    let r = rt
        .handle_json(
            req(
                1,
                "tools/call",
                json!({ "name": tool, "arguments": arguments }),
                true,
            ),
            who,
        )
        .await
        .expect("a response");
    assert_eq!(r["result"]["resultType"], "task", "{r}");
    r["result"]["taskId"].as_str().unwrap().to_owned()
}

async fn get_as(rt: &Runtime, who: &Owner, task: &str) -> Value {
    let r = rt
        .handle_json(req(1, "tasks/get", json!({ "taskId": task }), true), who)
        .await
        .expect("a response");
    r["result"].clone()
}

/// Waits (in steps of 50 ms of the test's time) until `task` has `status`.
async fn until_status(rt: &Runtime, who: &Owner, task: &str, status: &str) -> Value {
    for _ in 0..20_000 {
        let r = get_as(rt, who, task).await;
        if r["status"] == status {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "task {task} never became {status}: {}",
        get_as(rt, who, task).await
    );
}

#[tokio::test(start_paused = true)]
async fn a_limit_of_two_runs_ten_one_second_tasks_two_at_a_time() {
    let (running, most, starts): (Counter, Counter, Starts) =
        (Arc::default(), Arc::default(), Arc::default());
    let rt = Runtime::builder_with_store(Store::memory())
        .tool(sleeper(running, most.clone(), starts))
        .max_running("sleep1", 2)
        .start()
        .await
        .unwrap();
    let me = Owner::anonymous();
    let began = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..10 {
        tasks.push(create_as(&rt, &me, "sleep1", json!({ "who": format!("{i}") })).await);
    }
    // Every call was answered with its task at once; two run, eight wait, saying their place.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (i, task) in tasks.iter().enumerate() {
        let r = get_as(&rt, &me, task).await;
        assert_eq!(r["status"], "working", "{r}");
        let expected = if i < 2 {
            "sleeping".to_owned()
        } else {
            format!("queued: {} ahead", i - 2)
        };
        assert_eq!(r["statusMessage"], expected.as_str(), "task {i}: {r}");
    }
    for task in &tasks {
        until_status(&rt, &me, task, "completed").await;
    }
    let took = began.elapsed();
    assert_eq!(most.load(SeqCst), 2, "never more than two running");
    assert!(took >= Duration::from_secs(5), "{took:?}");
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn another_owners_first_task_waits_for_one_turnover_not_for_a_backlog() {
    let (running, most, starts): (Counter, Counter, Starts) = (
        Arc::default(),
        Arc::default(),
        Arc::new(Mutex::new(Vec::new())),
    );
    let rt = Runtime::builder_with_store(Store::memory())
        .tool(sleeper(running, most.clone(), starts.clone()))
        .max_running("sleep1", 1)
        .start()
        .await
        .unwrap();
    let (a, b) = (owner("a"), owner("b"));
    for i in 0..100 {
        create_as(&rt, &a, "sleep1", json!({ "who": format!("{i}") })).await;
    }
    let began = tokio::time::Instant::now();
    let bs = create_as(&rt, &b, "sleep1", json!({ "who": "first" })).await;
    let queued = get_as(&rt, &b, &bs).await;
    assert_eq!(queued["statusMessage"], "queued: 0 ahead", "{queued}");
    until_status(&rt, &b, &bs, "completed").await;
    // A's running task ends within a second; B's runs next, for a second.
    assert!(
        began.elapsed() <= Duration::from_millis(2100),
        "{:?}",
        began.elapsed()
    );
    let starts = starts.lock().unwrap().clone();
    assert_eq!(starts[..2], ["0:a", "first:b"], "{starts:?}");
    assert_eq!(most.load(SeqCst), 1);
    rt.shutdown().await;
}

/// A tool that waits for the test to open its gate, logging each start.
fn gated(
    name: &str,
    gate: watch::Sender<bool>,
    starts: Arc<Mutex<Vec<String>>>,
) -> Arc<dyn mcp_tasks::tool::Tool> {
    let gate = Arc::new(gate);
    tool_fn(
        ToolDescriptor::new(name, "waits for the test").task_policy(TaskPolicy::WhenSupported),
        move |_ctx, args| {
            let (gate, starts) = (gate.clone(), starts.clone());
            async move {
                let who = args
                    .get("who")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                starts.lock().unwrap().push(who);
                let _ = gate.subscribe().wait_for(|open| *open).await;
                Ok(CallToolResult::text("done"))
            }
        },
    )
}

#[tokio::test(start_paused = true)]
async fn queued_tasks_cancelled_or_expired_end_without_running() {
    let clock = ManualClock::new(1_800_000_000_000);
    let mut config = RuntimeConfig::default();
    config.reaper_interval = Duration::from_millis(10);
    let (gate, starts) = (watch::channel(false).0, Arc::new(Mutex::new(Vec::new())));
    let rt = Runtime::builder_with_store(Store::memory())
        .config(config)
        .clock(Arc::new(clock.clone()))
        .tool(gated("job", gate.clone(), starts.clone()))
        .tool(tool_fn(
            ToolDescriptor::new("short", "lives one minute")
                .task_policy(TaskPolicy::Always)
                .ttl_ms(60_000),
            {
                let starts = starts.clone();
                move |_ctx, _| {
                    let starts = starts.clone();
                    async move {
                        starts.lock().unwrap().push("short".into());
                        Ok(CallToolResult::text("ran"))
                    }
                }
            },
        ))
        .max_running("*", 1)
        .start()
        .await
        .unwrap();
    let me = Owner::anonymous();
    let first = create_as(&rt, &me, "job", json!({ "who": "first" })).await;
    let cancelled = create_as(&rt, &me, "job", json!({ "who": "cancelled" })).await;
    let expires = create_as(&rt, &me, "short", json!({})).await;
    assert_eq!(
        get(&rt, &cancelled).await["result"]["statusMessage"],
        "queued: 0 ahead"
    );
    assert_eq!(
        get(&rt, &expires).await["result"]["statusMessage"],
        "queued: 1 ahead"
    );

    let r = call(&rt, "tasks/cancel", json!({ "taskId": cancelled })).await;
    assert!(r.get("error").is_none(), "{r}");
    let done = until_status(&rt, &me, &cancelled, "cancelled").await;
    assert_eq!(
        done["statusMessage"],
        "Cancelled while queued: the tool never ran."
    );

    clock.advance(61_000);
    // An expired task answers every request "Task has expired".
    let mut expired = Value::Null;
    for _ in 0..1000 {
        expired = get(&rt, &expires).await;
        if expired["error"].is_object() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        expired["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("expired"),
        "{expired}"
    );

    gate.send_replace(true);
    until_status(&rt, &me, &first, "completed").await;
    // A queued task that ended gave its place back: the next task runs at once.
    let later = create_as(&rt, &me, "job", json!({ "who": "later" })).await;
    until_status(&rt, &me, &later, "completed").await;
    assert_eq!(
        *starts.lock().unwrap(),
        ["first", "later"],
        "neither queued task ran"
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_synchronous_call_over_the_limit_waits_for_a_slot() {
    let (gate, starts) = (watch::channel(false).0, Arc::new(Mutex::new(Vec::new())));
    let rt = Arc::new(
        Runtime::builder_with_store(Store::memory())
            .tool(gated("job", gate.clone(), starts.clone()))
            .max_running("job", 1)
            .start()
            .await
            .unwrap(),
    );
    let sync = |who: &'static str| {
        let rt = rt.clone();
        tokio::spawn(async move {
            rt.handle_json(
                req(
                    1,
                    "tools/call",
                    json!({ "name": "job", "arguments": { "who": who } }),
                    false,
                ),
                &Owner::anonymous(),
            )
            .await
        })
    };
    let one = sync("one");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let two = sync("two");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(*starts.lock().unwrap(), ["one"], "the second call waits");
    assert!(!two.is_finished());
    // A client that takes tasks is answered with one, queued.
    let task = create_as(&rt, &Owner::anonymous(), "job", json!({ "who": "task" })).await;
    assert_eq!(
        get(&rt, &task).await["result"]["statusMessage"],
        "queued: 1 ahead"
    );
    gate.send_replace(true);
    for call in [one, two] {
        let r = call.await.unwrap().expect("a response");
        assert_eq!(r["result"]["content"][0]["text"], "done", "{r}");
    }
    until_status(&rt, &Owner::anonymous(), &task, "completed").await;
    assert_eq!(*starts.lock().unwrap(), ["one", "two", "task"]);
    match Arc::try_unwrap(rt) {
        Ok(rt) => rt.shutdown().await,
        Err(_) => panic!("the runtime is still shared"),
    }
}

/// Polls (real time) until `task`'s `statusMessage` is `message`.
async fn until_message(rt: &Runtime, task: &str, message: &str) {
    for _ in 0..400 {
        if get(rt, task).await["result"]["statusMessage"] == message {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("task {task} never said {message}: {}", get(rt, task).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_the_queue_in_order_and_runs_no_queued_task_twice() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.redb");
    let starts = Arc::new(Mutex::new(Vec::new()));
    let gate = watch::channel(false).0;
    let start = |gate: &watch::Sender<bool>| {
        Runtime::builder(&path)
            .tool(gated("job", gate.clone(), starts.clone()))
            .max_running("job", 1)
            .start()
    };
    let rt = start(&gate).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..5 {
        tasks.push(
            crate::support::embedded::create(&rt, "job", json!({ "who": format!("{i}") })).await,
        );
        // Distinct creation times: the queue's order is creation time, then id.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    crate::support::embedded::wait_status(&rt, &tasks[0], "working").await;
    for (i, task) in tasks.iter().enumerate().skip(1) {
        until_message(&rt, task, &format!("queued: {} ahead", i - 1)).await;
    }
    assert_eq!(*starts.lock().unwrap(), ["0"]);
    rt.shutdown().await;

    let rt = start(&gate).await.unwrap();
    for (i, task) in tasks.iter().enumerate().skip(1) {
        until_message(&rt, task, &format!("queued: {} ahead", i - 1)).await;
    }
    // The interrupted 0 runs again; the queued ones stay queued.
    for _ in 0..400 {
        if starts.lock().unwrap().len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(*starts.lock().unwrap(), ["0", "0"]);
    gate.send_replace(true);
    for task in &tasks {
        crate::support::embedded::wait_status(&rt, task, "completed").await;
    }
    // The interrupted run of 0 runs again (at least once, as after any restart); the queued
    // tasks run once each, in their order.
    assert_eq!(*starts.lock().unwrap(), ["0", "0", "1", "2", "3", "4"]);
    for task in &tasks[1..] {
        assert_eq!(get(&rt, task).await["result"]["statusMessage"], Value::Null);
    }
    rt.shutdown().await;
}

/// `--max-starts sleep1=2/s` (`FlowLimits::add_rate`): 30 tasks created at once start at
/// most `2 × T + 1` in any span of `T` seconds (observed inside the tool, on the test's paused
/// clock), and the rate is reached: the 21st start is within 10 s of the first.
#[tokio::test(start_paused = true)]
async fn a_start_rate_holds_over_ten_seconds() {
    let started: Arc<Mutex<Vec<tokio::time::Instant>>> = Arc::default();
    let seen = started.clone();
    let tool = tool_fn(
        ToolDescriptor::new("quick", "returns at once").task_policy(TaskPolicy::Always),
        move |_, _| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(tokio::time::Instant::now());
                Ok(CallToolResult::text("done"))
            }
        },
    );
    let rt = Runtime::builder_with_store(Store::memory())
        .tool(tool)
        .max_starts("quick", 2.0)
        .start()
        .await
        .unwrap();
    let me = Owner::anonymous();
    let mut tasks = Vec::new();
    for _ in 0..30 {
        tasks.push(create_as(&rt, &me, "quick", json!({})).await);
    }
    let r = get_as(&rt, &me, &tasks[29]).await;
    assert!(
        r["statusMessage"]
            .as_str()
            .is_some_and(|m| m.starts_with("queued: ")),
        "{r}"
    );
    for task in &tasks {
        until_status(&rt, &me, task, "completed").await;
    }
    let mut at = started.lock().unwrap().clone();
    at.sort();
    assert_eq!(at.len(), 30);
    for (i, a) in at.iter().enumerate() {
        for (j, b) in at.iter().enumerate().skip(i + 1) {
            let span = b.duration_since(*a).as_secs_f64();
            let starts = (j - i + 1) as f64;
            assert!(
                starts <= 2.0 * span + 1.0 + 1e-9,
                "{starts} starts within {span} s"
            );
        }
    }
    assert!(
        at[20].duration_since(at[0]) <= Duration::from_millis(10_050),
        "the rate is reached: {:?}",
        at[20].duration_since(at[0])
    );
    rt.shutdown().await;
}

/// A flow group (`ToolDescriptor::flow_group`, `RuntimeBuilder::max_running_group`; the
/// gateway's `--upstream-max-running`): two tools of one group with a limit of 1 never run at
/// once (observed inside them), a tool outside the group is not held back.
#[tokio::test(start_paused = true)]
async fn a_flow_group_holds_its_tools_together() {
    let running: Counter = Arc::default();
    let most: Counter = Arc::default();
    let tool = |name: &str, group: Option<&str>| {
        let (running, most) = (running.clone(), most.clone());
        let mut descriptor =
            ToolDescriptor::new(name, "sleeps a second").task_policy(TaskPolicy::Always);
        if let Some(g) = group {
            descriptor = descriptor.flow_group(g);
        }
        let grouped = group.is_some();
        tool_fn(descriptor, move |_, _| {
            let (running, most) = (running.clone(), most.clone());
            async move {
                if grouped {
                    let now = running.fetch_add(1, SeqCst) + 1;
                    most.fetch_max(now, SeqCst);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                if grouped {
                    running.fetch_sub(1, SeqCst);
                }
                Ok(CallToolResult::text("slept"))
            }
        })
    };
    let rt = Runtime::builder_with_store(Store::memory())
        .tool(tool("a", Some("upstream:u")))
        .tool(tool("b", Some("upstream:u")))
        .tool(tool("c", None))
        .max_running_group("upstream:u", 1)
        .start()
        .await
        .unwrap();
    let me = Owner::anonymous();
    let began = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for name in ["a", "b", "a", "b"] {
        tasks.push(create_as(&rt, &me, name, json!({})).await);
    }
    let free = create_as(&rt, &me, "c", json!({})).await;
    until_status(&rt, &me, &free, "completed").await;
    assert!(
        began.elapsed() < Duration::from_millis(1_500),
        "c is not in the group"
    );
    for task in &tasks {
        until_status(&rt, &me, task, "completed").await;
    }
    assert_eq!(most.load(SeqCst), 1, "one of the group at a time");
    assert!(began.elapsed() >= Duration::from_secs(4));
    rt.shutdown().await;
}

#[test]
fn bad_max_running_values_are_clear_errors() {
    for (value, says) in [
        ("foo=0", "from 1 up"),
        ("foo=abc", "from 1 up"),
        ("foo", "TOOL=N"),
        ("=3", "TOOL=N"),
    ] {
        let out = Command::new(BIN)
            .args(["serve", "--max-running", value])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{value}: {stderr}");
        assert!(
            stderr.contains(says) && stderr.contains(value),
            "{value}: {stderr}"
        );
    }
    // The same checks for the environment variable and a `--config` file's key.
    let out = Command::new(BIN)
        .args(["serve"])
        .env("MCP_TASKS_MAX_RUNNING", "a=1,b=0")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("b=0"), "{stderr}");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(&config, "max-running = [\"a=1\", \"x=abc\"]\n").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("x=abc") && stderr.contains("from 1 up"),
        "{stderr}"
    );
    let out = Command::new(BIN)
        .args(["serve", "--max-running-per-owner", "0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    for (args, says) in [
        (&["--max-starts", "foo=0/s"][..], "TOOL=R/s"),
        (&["--max-starts", "foo=3"][..], "TOOL=R/s"),
        (&["--upstream-max-running", "up=0"][..], "from 1 up"),
        (
            &["--upstream-max-running", "up=2"][..],
            "give them with --upstream or --upstream-command",
        ),
        (
            &[
                "--upstream-max-running",
                "nope=2",
                "--upstream",
                "a=http://127.0.0.1:9/mcp",
            ][..],
            "no upstream is named `nope` (the upstreams: a)",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(BIN)
            .arg("serve")
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--store"])
            .arg(dir.path().join("s.redb"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_overview_shows_each_limits_use_and_the_list_the_queued_tasks() {
    use crate::console::{http, serve};
    use mcp_tasks::console::Console;

    let dir = tempfile::tempdir().unwrap();
    let (gate, starts) = (watch::channel(false).0, Arc::new(Mutex::new(Vec::new())));
    let rt = Runtime::builder(dir.path().join("console.redb"))
        .tool(gated("job", gate.clone(), starts.clone()))
        .max_running("job", 1)
        .max_running_per_owner(5)
        .start()
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..3 {
        tasks.push(
            crate::support::embedded::create(&rt, "job", json!({ "who": format!("{i}") })).await,
        );
    }
    until_message(&rt, &tasks[2], "queued: 1 ahead").await;
    let console = serve(Console::new(&rt)).await;
    let (status, o, _) = http(
        reqwest::Method::GET,
        &format!("{}/api/overview", console.base),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200, "{o}");
    assert_eq!(
        o["flow"]["tools"],
        json!([{ "tool": "job", "limit": 1, "maxStartsPerSecond": null, "running": 1, "queued": 2 }]),
        "{o}"
    );
    assert_eq!(o["flow"]["perOwner"]["limit"], 5);
    assert_eq!(o["flow"]["owners"][0]["running"], 1, "{o}");
    assert_eq!(o["flow"]["owners"][0]["queued"], 2, "{o}");
    let (_, list, _) = http(
        reqwest::Method::GET,
        &format!("{}/api/tasks?q=queued", console.base),
        &[],
        None,
    )
    .await;
    assert_eq!(list["tasks"].as_array().map(Vec::len), Some(2), "{list}");
    gate.send_replace(true);
    for task in &tasks {
        crate::support::embedded::wait_status(&rt, task, "completed").await;
    }
    drop(console);
    rt.shutdown().await;
}
