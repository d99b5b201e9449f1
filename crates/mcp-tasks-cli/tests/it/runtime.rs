//! Behaviour of the runtime through the embedding API: several runtimes in one process,
//! supervision, cancellation, expiry, synchronous calls and the demo.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use mcp_tasks::clock::ManualClock;
use mcp_tasks::store::StoreError;
use mcp_tasks::tool::{CallToolResult, TaskPolicy, ToolDescriptor, ToolError, tool_fn};
use mcp_tasks::{Owner, Runtime, RuntimeConfig, StartError};
use serde_json::{Value, json};

use crate::backend;
#[cfg(feature = "postgres")]
use crate::support;

use backend::Place;
use support::embedded::{call, create, get, req, wait_status};

fn forever() -> Arc<dyn mcp_tasks::tool::Tool> {
    tool_fn(
        ToolDescriptor::new("forever", "never ends").task_policy(TaskPolicy::Always),
        |_ctx, _| async {
            std::future::pending::<()>().await;
            Ok(CallToolResult::text("unreachable"))
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runtimes_in_one_process_do_not_interfere() {
    let dir = tempfile::tempdir().unwrap();
    let a = Runtime::builder(dir.path().join("a.redb"))
        .tool(forever())
        .start()
        .await
        .unwrap();
    let b = Runtime::builder(dir.path().join("b.redb"))
        .tool(forever())
        .start()
        .await
        .unwrap();
    let ta = create(&a, "forever", json!({})).await;
    let tb = create(&b, "forever", json!({})).await;
    assert_eq!(get(&a, &ta).await["result"]["status"], "working");
    assert_eq!(get(&b, &tb).await["result"]["status"], "working");
    // Each runtime knows only its own tasks.
    assert_eq!(get(&a, &tb).await["error"]["code"], -32602);
    assert_eq!(get(&b, &ta).await["error"]["code"], -32602);
    assert_eq!((a.live_tasks(), b.live_tasks()), (1, 1));
    a.shutdown().await;
    assert_eq!(
        get(&b, &tb).await["result"]["status"],
        "working",
        "b survives a's shutdown"
    );
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_an_open_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("one.redb");
    let first = Runtime::builder(&path).start().await.unwrap();
    let err = Runtime::builder(&path)
        .start()
        .await
        .err()
        .expect("second open must fail");
    assert!(
        matches!(err, StartError::Store(StoreError::AlreadyOpen { .. })),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("one.redb"),
        "the error names the file: {text}"
    );
    first.shutdown().await;
    let again = Runtime::builder(&path)
        .start()
        .await
        .expect("reopens after shutdown");
    again.shutdown().await;
}

on_both_stores! {
async fn a_failing_task_actor_is_restarted_then_given_up(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let tool = tool_fn(
        ToolDescriptor::new("crashy", "panics").task_policy(TaskPolicy::Always),
        move |_ctx, _| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                panic!("boom");
            }
        },
    );
    let mut config = RuntimeConfig::default();
    config.restart_budget = 2;
    config.restart_backoff = Duration::from_millis(10);
    let rt = place.builder("s").await
        .config(config)
        .tool(tool)
        .start()
        .await
        .unwrap();
    let task = create(&rt, "crashy", json!({})).await;
    let failed = wait_status(&rt, &task, "failed").await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "first run plus two restarts"
    );
    assert_eq!(failed["error"]["code"], -32603);
    let message = failed["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("given up") && message.contains("boom"),
        "{message}"
    );
    assert_eq!(rt.live_tasks(), 0);
    rt.shutdown().await;
    place.finish().await;
}
}

on_both_stores! {
async fn cancellation_is_cooperative_with_a_grace_period(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let polite = tool_fn(
        ToolDescriptor::new("polite", "stops when asked").task_policy(TaskPolicy::Always),
        |ctx, _| async move {
            ctx.cancelled().await;
            Err(ToolError::Cancelled)
        },
    );
    let stubborn = tool_fn(
        ToolDescriptor::new("stubborn", "ignores cancel").task_policy(TaskPolicy::Always),
        |_ctx, _| async {
            std::future::pending::<()>().await;
            Ok(CallToolResult::text("unreachable"))
        },
    );
    let mut config = RuntimeConfig::default();
    config.cancel_grace = Duration::from_millis(200);
    let rt = place.builder("c").await
        .config(config)
        .tools([polite, stubborn])
        .start()
        .await
        .unwrap();

    let p = create(&rt, "polite", json!({})).await;
    let ack = call(&rt, "tasks/cancel", json!({ "taskId": p })).await;
    assert_eq!(ack["result"]["resultType"], "complete");
    for field in ["taskId", "status", "result", "error", "inputRequests"] {
        assert!(
            ack["result"].get(field).is_none(),
            "the ack carries no {field}"
        );
    }
    wait_status(&rt, &p, "cancelled").await;

    let s = create(&rt, "stubborn", json!({})).await;
    call(&rt, "tasks/cancel", json!({ "taskId": s })).await;
    let cancelled = wait_status(&rt, &s, "cancelled").await;
    assert!(
        cancelled["statusMessage"]
            .as_str()
            .unwrap()
            .contains("grace"),
        "{cancelled}"
    );

    // Cancelling a finished task acknowledges and changes nothing.
    let before = get(&rt, &s).await;
    let again = call(&rt, "tasks/cancel", json!({ "taskId": s })).await;
    assert_eq!(again["result"]["resultType"], "complete");
    assert_eq!(get(&rt, &s).await, before);
    rt.shutdown().await;
    place.finish().await;
}
}

on_both_stores! {
async fn expiry_fails_live_tasks_then_forgets_them(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let clock = ManualClock::new(1_800_000_000_000);
    let mut config = RuntimeConfig::default();
    config.default_ttl = Some(Duration::from_secs(60));
    config.expired_retention = Duration::from_secs(600);
    config.reaper_interval = Duration::from_millis(10);
    let rt = place.builder("e").await
        .config(config)
        .clock(Arc::new(clock.clone()))
        .tool(forever())
        .start()
        .await
        .unwrap();
    let task = create(&rt, "forever", json!({})).await;
    assert_eq!(get(&rt, &task).await["result"]["ttlMs"], 60_000);

    // Never early: one millisecond before the ttl the task is still there and working.
    clock.advance(59_999);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(get(&rt, &task).await["result"]["status"], "working");

    // At the ttl it reads as expired (to its owner), and the reaper fails it.
    clock.advance(1);
    let expired = get(&rt, &task).await;
    assert_eq!(expired["error"]["code"], -32602);
    assert!(
        expired["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expired"),
        "{expired}"
    );
    for _ in 0..200 {
        if rt.live_tasks() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(rt.live_tasks(), 0, "the reaper stopped the expired task");
    let stored = mcp_tasks::internals::runtime_store(&rt)
        .get(&task)
        .await
        .unwrap()
        .expect("kept during retention");
    let record = mcp_tasks::internals::persist::decode(&stored).unwrap();
    assert_eq!(record.status, mcp_tasks::TaskStatus::Failed);

    // Another principal cannot tell an expired task from an unknown one.
    let foreign = rt
        .handle_json(
            req(2, "tasks/get", json!({ "taskId": task }), true),
            &Owner::new("t", "mallory"),
        )
        .await
        .unwrap();
    assert!(
        foreign["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not found"),
        "{foreign}"
    );

    // After the retention the record is deleted: not found.
    clock.advance(600_000);
    for _ in 0..200 {
        if mcp_tasks::internals::runtime_store(&rt).get(&task).await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let gone = get(&rt, &task).await;
    assert!(
        gone["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not found"),
        "{gone}"
    );

    // A malformed id says so.
    let bad = get(&rt, "not-a-task").await;
    assert_eq!(bad["error"]["code"], -32602);
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .contains("malformed"),
        "{bad}"
    );
    rt.shutdown().await;
    place.finish().await;
}
}

on_both_stores! {
async fn task_policy_decides_per_call(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let greet = tool_fn(
        ToolDescriptor::new("greet", "says hello")
            .task_policy(TaskPolicy::Never)
            .input_schema(json!({ "type": "object", "properties": { "name": { "type": "string" } }, "required": ["name"] })),
        |_ctx, args| async move { Ok(CallToolResult::text(format!("Hello, {}!", args["name"].as_str().unwrap_or("")))) },
    );
    let maybe = tool_fn(
        ToolDescriptor::new("maybe", "a task when possible"),
        |ctx, _| async move {
            Ok(CallToolResult::text(if ctx.task_id().is_some() {
                "as a task"
            } else {
                "inline"
            }))
        },
    );
    let rt = place.builder("p").await
        .tools([greet, maybe, forever()])
        .start()
        .await
        .unwrap();
    let owner = Owner::anonymous();
    let call_with = |tool: &str, args: Value, tasks: bool| {
        req(
            1,
            "tools/call",
            json!({ "name": tool, "arguments": args }),
            tasks,
        )
    };

    let r = rt
        .handle_json(call_with("greet", json!({ "name": "Ada" }), true), &owner)
        .await
        .unwrap();
    assert_eq!(r["result"]["content"][0]["text"], "Hello, Ada!");
    assert_eq!(r["result"]["resultType"], "complete");

    let r = rt
        .handle_json(call_with("maybe", json!({}), false), &owner)
        .await
        .unwrap();
    assert_eq!(r["result"]["content"][0]["text"], "inline");
    let r = rt
        .handle_json(call_with("maybe", json!({}), true), &owner)
        .await
        .unwrap();
    assert_eq!(r["result"]["resultType"], "task");
    let task = r["result"]["taskId"].as_str().unwrap().to_owned();
    let done = wait_status(&rt, &task, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], "as a task");
    assert_eq!(done["result"]["resultType"], "complete");

    let r = rt
        .handle_json(call_with("forever", json!({}), false), &owner)
        .await
        .unwrap();
    assert_eq!(r["error"]["code"], -32021);
    assert_eq!(
        r["error"]["data"]["requiredCapabilities"],
        json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } })
    );
    rt.shutdown().await;
    place.finish().await;
}
}

on_both_stores! {
async fn declined_approval_is_a_safe_completed_outcome(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let rt = place.builder("d").await
        .tool(mcp_tasks_testkit::demo::generate_report(Duration::from_millis(10)))
        .start()
        .await
        .unwrap();
    let task = create(&rt, "generate_report", json!({ "size": "small" })).await;
    wait_status(&rt, &task, "input_required").await;
    let answer =
        json!({ "taskId": task, "inputResponses": { "approve_outline": { "action": "decline" } } });
    call(&rt, "tasks/update", answer).await;
    let done = wait_status(&rt, &task, "completed").await;
    assert_eq!(done["result"]["isError"], false);
    assert_eq!(
        done["result"]["structuredContent"],
        json!({ "size": "small", "approved": false })
    );

    let task = create(&rt, "generate_report", json!({ "size": "small" })).await;
    wait_status(&rt, &task, "input_required").await;
    let answer =
        json!({ "taskId": task, "inputResponses": { "approve_outline": { "action": "cancel" } } });
    call(&rt, "tasks/update", answer).await;
    wait_status(&rt, &task, "cancelled").await;
    rt.shutdown().await;
    place.finish().await;
}
}

/// The demo's six `id=` lines, as people compare them: each exactly this, in this order, with
/// the explanations on lines of their own.
const DEMO_ID_LINES: [&str; 6] = [
    "id=0 resultType=complete status=ack",
    "id=1 resultType=task status=working",
    "id=2 resultType=complete status=working",
    "id=3 resultType=complete status=input_required",
    "id=4 resultType=complete status=ack",
    "id=5 resultType=complete status=completed",
];

fn id_lines(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with("id=")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_prints_the_six_id_lines_of_the_sequence() {
    let expected = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/demo-output.txt"
    ))
    .unwrap();
    assert_eq!(id_lines(&expected), DEMO_ID_LINES);
    // The README shows the same output, line for line.
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let shown = readme
        .split("cargo run --release -- demo\n```\n\n```text\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the README shows the demo's output after its command");
    assert_eq!(shown, expected);
    for _ in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let mut out = Vec::new();
        mcp_tasks_testkit::demo::run(&dir.path().join("demo.redb"), false, &mut out)
            .await
            .unwrap();
        let out = String::from_utf8(out).unwrap();
        assert_eq!(id_lines(&out), DEMO_ID_LINES);
        assert_eq!(out, expected);
    }
}

#[test]
fn the_binary_plays_the_demo() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-tasks"))
        .arg("demo")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/demo-output.txt"
    ))
    .unwrap();
    assert_eq!(
        id_lines(&String::from_utf8_lossy(&out.stdout)),
        DEMO_ID_LINES
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
}

// ---------------------------------------------------------------------------------------------
// Limits and input answers
// ---------------------------------------------------------------------------------------------

/// A tool that asks for a confirmation (a boolean form) and reports it.
fn confirm() -> Arc<dyn mcp_tasks::tool::Tool> {
    tool_fn(
        ToolDescriptor::new("confirm", "asks for a confirmation").task_policy(TaskPolicy::Always),
        |ctx, _| async move {
            let schema = json!({
                "type": "object",
                "properties": { "confirm": { "type": "boolean" } },
                "required": ["confirm"]
            });
            let answer = ctx
                .input(
                    "confirm",
                    mcp_tasks::tool::InputRequest::elicit_form("Sure?", schema),
                )
                .await?;
            Ok(CallToolResult::text(answer.to_string()))
        },
    )
}

/// The tools of the limit tests: `size` returns a text of `len` bytes, `steps` records `n`
/// steps of `len` bytes each, `twice` uses one step name twice, `status` sets a status
/// message and completes.
fn limit_tools() -> Vec<Arc<dyn mcp_tasks::tool::Tool>> {
    let size = tool_fn(
        ToolDescriptor::new("size", "a result of `len` bytes").task_policy(TaskPolicy::Always),
        |_ctx, args| async move {
            let len = args["len"].as_u64().unwrap_or(0) as usize;
            Ok(CallToolResult::text("x".repeat(len)))
        },
    );
    let steps = tool_fn(
        ToolDescriptor::new("steps", "n steps of len bytes").task_policy(TaskPolicy::Always),
        |ctx, args| async move {
            let n = args["n"].as_u64().unwrap_or(0);
            let len = args["len"].as_u64().unwrap_or(0) as usize;
            for i in 0..n {
                ctx.step(&format!("s{i}"), || async { Ok("y".repeat(len)) })
                    .await?;
            }
            Ok(CallToolResult::text("done"))
        },
    );
    let twice = tool_fn(
        ToolDescriptor::new("twice", "one step name twice").task_policy(TaskPolicy::Always),
        |ctx, _| async move {
            ctx.step("a", || async { Ok(1) }).await?;
            ctx.step("a", || async { Ok(2) }).await?;
            Ok(CallToolResult::text("unreachable"))
        },
    );
    let status = tool_fn(
        ToolDescriptor::new("status", "sets a status, then completes")
            .task_policy(TaskPolicy::Always),
        |ctx, _| async move {
            ctx.set_status("Computing.").await?;
            Ok(CallToolResult::text("done"))
        },
    );
    vec![size, steps, twice, status, confirm()]
}

async fn limited_runtime(place: &Place) -> Runtime {
    let mut config = RuntimeConfig::default();
    config.limits.max_argument_bytes = 100;
    config.limits.max_input_response_bytes = 200;
    config.limits.max_result_bytes = 300;
    config.limits.max_journal_bytes = 50;
    config.limits.max_steps = 2;
    place
        .builder("limits")
        .await
        .config(config)
        .tools(limit_tools())
        .start()
        .await
        .unwrap()
}

async fn error_of(rt: &Runtime, method: &str, params: Value) -> (i64, String) {
    let r = call(rt, method, params).await;
    let e = &r["error"];
    assert!(e.is_object(), "expected an error: {r}");
    (
        e["code"].as_i64().unwrap(),
        e["message"].as_str().unwrap().to_owned(),
    )
}

on_both_stores! {
/// Every limit on what a client sends: the exact error, and nothing stored.
async fn client_limits_are_refused_with_the_limit_named_and_nothing_stored(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let rt = limited_runtime(&place).await;
    // `{"len":"…"}` over 100 bytes of JSON text.
    let big = "z".repeat(100);
    let arguments = json!({ "len": big });
    let len = serde_json::to_vec(&arguments).unwrap().len();
    let (code, message) = error_of(
        &rt,
        "tools/call",
        json!({ "name": "size", "arguments": arguments }),
    )
    .await;
    assert_eq!(code, -32602);
    assert_eq!(
        message,
        format!(
            "Invalid params: `arguments` is {len} bytes; the limit is 100 (limits.max_argument_bytes)"
        )
    );
    assert_eq!(mcp_tasks::internals::runtime_store(&rt).counts().await.unwrap(), (0, 0), "nothing stored");

    // inputResponses over 200 bytes: refused, the key stays answerable.
    let task = create(&rt, "confirm", json!({})).await;
    wait_status(&rt, &task, "input_required").await;
    let before = mcp_tasks::internals::runtime_store(&rt).get(&task).await.unwrap();
    let responses = json!({ "confirm": { "action": "accept", "content": { "confirm": true, "pad": "p".repeat(200) } } });
    let len = serde_json::to_vec(&responses).unwrap().len();
    let (code, message) = error_of(
        &rt,
        "tasks/update",
        json!({ "taskId": task, "inputResponses": responses }),
    )
    .await;
    assert_eq!(code, -32602);
    assert_eq!(
        message,
        format!(
            "Invalid params: `inputResponses` is {len} bytes; the limit is 200 (limits.max_input_response_bytes)"
        )
    );
    assert_eq!(
        mcp_tasks::internals::runtime_store(&rt).get(&task).await.unwrap(),
        before,
        "no stored change"
    );
    let ok = call(
        &rt,
        "tasks/update",
        json!({ "taskId": task, "inputResponses": { "confirm": { "action": "accept", "content": { "confirm": true } } } }),
    )
    .await;
    assert_eq!(ok["result"]["resultType"], "complete", "{ok}");
    wait_status(&rt, &task, "completed").await;
    rt.shutdown().await;
    place.finish().await;
}
}

on_both_stores! {
/// Every limit on what a tool produces: the task ends `failed` with -32603 naming the limit.
async fn tool_limits_fail_the_task_with_the_limit_named(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let rt = limited_runtime(&place).await;
    let result_len = serde_json::to_vec(&CallToolResult::text("x".repeat(400)).to_json())
        .unwrap()
        .len();
    let cases = [
        (
            "size",
            json!({ "len": 400 }),
            format!(
                "Internal error: the tool's result is {result_len} bytes; the limit is 300 (limits.max_result_bytes)"
            ),
        ),
        (
            "steps",
            json!({ "n": 3, "len": 1 }),
            "Internal error: step `s2` would be step 3 of the task; the limit is 2 (limits.max_steps)"
                .to_owned(),
        ),
        (
            "steps",
            json!({ "n": 1, "len": 60 }),
            // "s0" + the JSON string of 60 bytes (62 with its quotes).
            "Internal error: step `s0` would make the task's journal 64 bytes; the limit is 50 (limits.max_journal_bytes)"
                .to_owned(),
        ),
        (
            "twice",
            json!({}),
            "Internal error: step name `a` is used twice in one task; step names are journal keys and must be unique per task"
                .to_owned(),
        ),
    ];
    for (tool, arguments, expected) in cases {
        let task = create(&rt, tool, arguments.clone()).await;
        let failed = wait_status(&rt, &task, "failed").await;
        assert_eq!(
            failed["error"]["code"], -32603,
            "{tool} {arguments}: {failed}"
        );
        assert_eq!(
            failed["error"]["message"],
            expected.as_str(),
            "{tool} {arguments}"
        );
    }
    // Within the limits the same tools complete.
    for (tool, arguments) in [
        ("size", json!({ "len": 10 })),
        ("steps", json!({ "n": 2, "len": 5 })),
    ] {
        let task = create(&rt, tool, arguments).await;
        wait_status(&rt, &task, "completed").await;
    }
    rt.shutdown().await;
    place.finish().await;
}
}

on_both_stores! {
/// Malformed answers to an elicitation: -32602 with the exact reason, no stored change, and
/// the key is still answerable afterwards.
async fn malformed_input_answers_are_refused_and_do_not_use_up_the_key(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let rt = place.builder("answers").await
        .tool(confirm())
        .start()
        .await
        .unwrap();
    let task = create(&rt, "confirm", json!({})).await;
    wait_status(&rt, &task, "input_required").await;
    let prefix = "Invalid params: the response for input key `confirm`";
    let cases = [
        (json!(5), "must be a JSON object"),
        (
            json!({ "content": { "confirm": true } }),
            "needs `action` (accept, decline or cancel)",
        ),
        (
            json!({ "action": "bogus", "content": { "confirm": true } }),
            "has an invalid `action` \"bogus\": it must be accept, decline or cancel",
        ),
        (
            json!({ "action": "accept", "content": { "confirm": "yes" } }),
            "has `content.confirm` not matching the requestedSchema: \"yes\" is not of type \"boolean\"",
        ),
        (
            json!({ "action": "accept" }),
            "accepts a form elicitation without `content`",
        ),
        (
            json!({ "action": "decline", "content": "no" }),
            "has a `content` that is not an object: \"no\"",
        ),
    ];
    let before = mcp_tasks::internals::runtime_store(&rt).get(&task).await.unwrap();
    for (answer, reason) in cases {
        let (code, message) = error_of(
            &rt,
            "tasks/update",
            json!({ "taskId": task, "inputResponses": { "confirm": answer } }),
        )
        .await;
        assert_eq!(code, -32602, "{answer}");
        assert_eq!(message, format!("{prefix} {reason}"), "{answer}");
        assert_eq!(
            mcp_tasks::internals::runtime_store(&rt).get(&task).await.unwrap(),
            before,
            "no stored change"
        );
        let g = get(&rt, &task).await;
        assert_eq!(g["result"]["status"], "input_required", "{g}");
        assert!(g["result"]["inputRequests"]["confirm"].is_object(), "{g}");
    }
    let ok = call(
        &rt,
        "tasks/update",
        json!({ "taskId": task, "inputResponses": { "confirm": { "action": "accept", "content": { "confirm": true } } } }),
    )
    .await;
    assert_eq!(ok["result"]["resultType"], "complete", "{ok}");
    let done = wait_status(&rt, &task, "completed").await;
    // The terminal task keeps no status message of its waiting state.
    assert!(done.get("statusMessage").is_none(), "{done}");
    rt.shutdown().await;
    place.finish().await;
}
}

on_both_stores! {
/// A completed task shows no status message of an earlier state.
async fn a_completed_task_keeps_no_stale_status_message(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let rt = limited_runtime(&place).await;
    let task = create(&rt, "status", json!({})).await;
    let done = wait_status(&rt, &task, "completed").await;
    assert!(done.get("statusMessage").is_none(), "{done}");
    rt.shutdown().await;
    place.finish().await;
}
}

on_both_stores! {
/// A live task whose tool is not registered at start does not fail: it waits (it can still be
/// answered and cancelled) and runs once a start registers the tool again.
async fn a_task_whose_tool_is_missing_at_start_waits_for_it(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let mut config = RuntimeConfig::default();
    config.cancel_grace = Duration::from_millis(50);
    let rt = place.builder("missing").await
        .config(config.clone())
        .tool(confirm())
        .tool(forever())
        .start()
        .await
        .unwrap();
    let waiting = create(&rt, "confirm", json!({})).await;
    wait_status(&rt, &waiting, "input_required").await;
    let working = create(&rt, "forever", json!({})).await;
    rt.shutdown().await;

    // A deployment that lost both tools.
    let rt = place.builder("missing").await
        .config(config.clone())
        .start()
        .await
        .unwrap();
    assert_eq!(
        get(&rt, &waiting).await["result"]["status"],
        "input_required"
    );
    assert_eq!(get(&rt, &working).await["result"]["status"], "working");
    let ok = call(
        &rt,
        "tasks/update",
        json!({ "taskId": waiting, "inputResponses": { "confirm": { "action": "accept", "content": { "confirm": true } } } }),
    )
    .await;
    assert_eq!(ok["result"]["resultType"], "complete", "{ok}");
    assert_eq!(get(&rt, &waiting).await["result"]["status"], "working");
    let ack = call(&rt, "tasks/cancel", json!({ "taskId": working })).await;
    assert_eq!(ack["result"]["resultType"], "complete", "{ack}");
    wait_status(&rt, &working, "cancelled").await;
    rt.shutdown().await;

    // The tool is back: the waiting task runs with its recorded answer.
    let rt = place.builder("missing").await
        .config(config)
        .tool(confirm())
        .start()
        .await
        .unwrap();
    let done = wait_status(&rt, &waiting, "completed").await;
    assert_eq!(
        done["result"]["content"][0]["text"],
        json!({ "action": "accept", "content": { "confirm": true } }).to_string()
    );
    rt.shutdown().await;
    place.finish().await;
}
}

on_both_stores! {
/// A live task already past its expiry when the runtime starts is expired, not run again.
async fn a_task_past_its_expiry_at_start_is_expired_not_run(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let clock = ManualClock::new(1_800_000_000_000);
    let runs = Arc::new(AtomicUsize::new(0));
    let tool = || {
        let runs = runs.clone();
        tool_fn(
            ToolDescriptor::new("counted", "counts its runs, never ends")
                .task_policy(TaskPolicy::Always),
            move |_ctx, _| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    std::future::pending::<()>().await;
                    Ok(CallToolResult::text("unreachable"))
                }
            },
        )
    };
    let mut config = RuntimeConfig::default();
    config.default_ttl = Some(Duration::from_secs(10));
    config.reaper_interval = Duration::from_secs(3600);
    let start = || async {
        place
            .builder("late")
            .await
            .clock(Arc::new(clock.clone()))
            .config(config.clone())
            .tool(tool())
            .start()
            .await
    };
    let rt = start().await.unwrap();
    let task = create(&rt, "counted", json!({})).await;
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    rt.shutdown().await;
    clock.advance(20_000);
    let rt = start().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let record = loop {
        let bytes = mcp_tasks::internals::runtime_store(&rt).get(&task).await.unwrap().unwrap();
        let record = mcp_tasks::internals::persist::decode(&bytes).unwrap();
        if record.status.is_terminal() {
            break record;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never expired: {record:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(record.status, mcp_tasks::TaskStatus::Failed);
    assert_eq!(record.status_message.as_deref(), Some("Task has expired."));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the expired task's tool did not run again"
    );
    let (code, message) = error_of(&rt, "tasks/get", json!({ "taskId": task })).await;
    assert_eq!(
        (code, message.as_str()),
        (
            -32602,
            "Invalid params: Failed to retrieve task: Task has expired"
        )
    );
    rt.shutdown().await;
    place.finish().await;
}
}

on_both_stores! {
/// A step's idempotency key is the same for every execution of the step (task id and step
/// name); its attempt says whether an earlier run may already have had the step's effect.
async fn a_step_gets_a_stable_idempotency_key_and_its_attempt(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let tool = tool_fn(
        ToolDescriptor::new("charge", "charges once, idempotently").task_policy(TaskPolicy::Always),
        move |ctx, _| {
            let counter = counter.clone();
            async move {
                let seen = ctx
                    .step_with_key("charge", |key| async move {
                        // The first execution dies after its effect, before its commit.
                        if counter.fetch_add(1, Ordering::SeqCst) == 0 {
                            panic!("crash after the effect");
                        }
                        Ok(format!(
                            "{}#{}",
                            key.idempotency_key().unwrap_or_default(),
                            key.attempt()
                        ))
                    })
                    .await?;
                Ok(CallToolResult::text(seen))
            }
        },
    );
    let mut config = RuntimeConfig::default();
    config.restart_backoff = Duration::from_millis(10);
    let rt = place.builder("key").await
        .config(config)
        .tool(tool)
        .start()
        .await
        .unwrap();
    let task = create(&rt, "charge", json!({})).await;
    let done = wait_status(&rt, &task, "completed").await;
    assert_eq!(
        done["result"]["content"][0]["text"],
        format!("{task}/charge#2")
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the step ran again: at-least-once"
    );
    rt.shutdown().await;
    place.finish().await;
}
}

/// A live task of another owner answers like an unknown id (`-32602`, the same message)
/// after the same work: one store read each, for `tasks/get`, `tasks/cancel`,
/// `tasks/update` and a listen's task ids, so the time of the answer cannot tell the two
/// apart. The owner of a live task is served from memory.
/// Another owner's stored record is not decoded past its owner: a record whose first
/// fields (version, id, owner) are sound but whose body is cut short answers another owner
/// exactly as an unknown id does, while its owner, whose read decodes the whole record,
/// gets the decode failure. Without the owner check before the decode, the foreign caller
/// would get that failure too (and pay for the decode of every argument and result).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_record_is_not_decoded_past_its_owner() {
    use mcp_tasks::internals::task::{TaskId, TaskRecord};
    use mcp_tasks::store::{Expect, OwnerEntry, Store, TaskStore, WriteOp, owner_key};
    let memory = Arc::new(mcp_tasks::store::MemoryStore::new());
    let rt = Runtime::builder_with_store(Store::from_backend(memory.clone()))
        .tool(forever())
        .start()
        .await
        .unwrap();
    let alice = Owner::new("acme", "alice");
    let id = format!("tsk_{}", "1".repeat(32));
    let record = TaskRecord::new(
        TaskId::parse(&id).unwrap(),
        alice.clone(),
        "forever".into(),
        json!({ "pad": "x".repeat(1000) }),
        Value::Null,
        1,
        Some(3_600_000),
        None,
        None,
    );
    let mut bytes = mcp_tasks::internals::persist::encode(&record).unwrap();
    bytes.truncate(bytes.len() - 1);
    assert!(mcp_tasks::internals::persist::decode(&bytes).is_err());
    assert_eq!(
        mcp_tasks::internals::persist::decode_owner(&bytes).unwrap(),
        alice
    );
    memory
        .commit(vec![WriteOp::Put {
            id: id.clone(),
            bytes,
            constant_tail: 0,
            live: false,
            due_ms: None,
            seq: Some(1),
            expect: Expect::Absent,
            owner: Some(OwnerEntry {
                owner: owner_key("acme", "alice"),
                created_ms: 1,
            }),
            listing: None,
        }])
        .await
        .unwrap();
    let unknown = format!("tsk_{}", "0".repeat(32));
    async fn ask(rt: &Runtime, id: &str, who: &Owner) -> Value {
        rt.handle_json(req(1, "tasks/get", json!({ "taskId": id }), true), who)
            .await
            .expect("a response")
    }
    let mallory = Owner::new("other", "mallory");
    let foreign = ask(&rt, &id, &mallory).await;
    let missing = ask(&rt, &unknown, &mallory).await;
    assert_eq!(
        foreign, missing,
        "a foreign record reads like an unknown id"
    );
    assert_eq!(missing["error"]["code"], -32602, "{missing}");
    let own = ask(&rt, &id, &alice).await;
    assert!(own.get("error").is_some(), "{own}");
    assert_ne!(own, missing, "the owner's read decodes the record: {own}");
    rt.shutdown().await;
}

#[tokio::test]
async fn a_foreign_task_costs_the_store_read_an_unknown_id_costs() {
    let memory = Arc::new(mcp_tasks::store::MemoryStore::new());
    let gate = Arc::new(tokio::sync::Notify::new());
    let waits = {
        let gate = gate.clone();
        tool_fn(
            ToolDescriptor::new("waits", "runs until released").task_policy(TaskPolicy::Always),
            move |_ctx, _args| {
                let gate = gate.clone();
                async move {
                    gate.notified().await;
                    Ok(CallToolResult::text("done"))
                }
            },
        )
    };
    let rt = Runtime::builder_with_store(mcp_tasks::store::Store::from_backend(memory.clone()))
        .tool(waits)
        .start()
        .await
        .unwrap();
    let task = create(&rt, "waits", json!({})).await;
    wait_status(&rt, &task, "working").await;
    let unknown = format!("tsk_{}", "0".repeat(32));
    let mallory = Owner::new("other", "mallory");
    let as_mallory = |method: &str, id: &str| {
        let params = match method {
            "subscriptions/listen" => json!({ "notifications": { "taskIds": [id] } }),
            "tasks/update" => json!({ "taskId": id, "inputResponses": {} }),
            _ => json!({ "taskId": id }),
        };
        req(1, method, params, true)
    };
    for method in [
        "tasks/get",
        "tasks/cancel",
        "tasks/update",
        "subscriptions/listen",
    ] {
        let mut answers = Vec::new();
        let mut reads = Vec::new();
        for id in [task.as_str(), unknown.as_str()] {
            let before = memory.reads();
            let answer = match rt
                .handle()
                .dispatch_json(
                    as_mallory(method, id),
                    &mcp_tasks::RequestContext::new(mallory.clone()),
                )
                .await
            {
                mcp_tasks::Dispatched::Reply(reply) => reply.body().into_owned(),
                mcp_tasks::Dispatched::Stream(mut stream) => {
                    use futures::StreamExt;
                    stream.next().await.expect("the acknowledgement")
                }
                mcp_tasks::Dispatched::Accepted => panic!("{method} is a request"),
            };
            reads.push(memory.reads() - before);
            answers.push(answer);
        }
        assert_eq!(
            answers[0], answers[1],
            "{method}: a foreign task reads like an unknown id"
        );
        assert_eq!(
            reads[0], reads[1],
            "{method}: the same store reads for both"
        );
        assert!(
            reads[0] >= 1,
            "{method}: an unknown id is looked up in the store"
        );
    }
    // The owner's own live task is served from memory.
    let before = memory.reads();
    assert_eq!(get(&rt, &task).await["result"]["status"], "working");
    assert_eq!(memory.reads(), before);
    gate.notify_one();
    wait_status(&rt, &task, "completed").await;
    rt.shutdown().await;
}
