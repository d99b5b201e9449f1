//! In-process restart tests: tasks in every status survive a restart of the runtime on the
//! same redb file, byte for byte on the wire, and live tasks resume from their journal.
//!
//! Tools coordinate with the test through counters and gates (`Probe`) that both runtime
//! instances share: the tool closures of both instances capture the same `Arc`s, so a counter
//! counts executions across restarts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcp_tasks::store::StoreError;
use mcp_tasks::tool::{CallToolResult, InputRequest, Tool, ToolDescriptor, ToolError, tool_fn};
use mcp_tasks::{Owner, Runtime, RuntimeConfig, StartError};
use serde_json::{Value, json};
use tokio::sync::watch;

/// Bound of every wait in these tests.
const WAIT: Duration = Duration::from_secs(10);
/// How long the crash variant retries opening a file the dropped runtime may still hold.
const REOPEN_RETRY: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// Shared probes: counters, gates and a step log
// ---------------------------------------------------------------------------------------------

/// A future that never resolves until the test opens the gate.
#[derive(Clone)]
struct Gate(Arc<watch::Sender<bool>>);

impl Gate {
    fn new() -> Self {
        Self(Arc::new(watch::channel(false).0))
    }

    fn open(&self) {
        self.0.send_replace(true);
    }

    async fn wait(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives as long as this gate, so this only returns once opened.
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// A timestamped log of what the tools and the test did; printed when a test fails.
#[derive(Clone)]
struct StepLog {
    start: Instant,
    lines: Arc<Mutex<Vec<String>>>,
}

impl StepLog {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            lines: Arc::default(),
        }
    }

    fn log(&self, line: impl Into<String>) {
        let line = format!(
            "{:>8.3}s {}",
            self.start.elapsed().as_secs_f64(),
            line.into()
        );
        self.lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(line);
    }

    fn dump(&self) -> String {
        self.lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .join("\n")
    }
}

/// Prints the store path and the step log if the test panics.
struct FailureReport {
    name: &'static str,
    path: PathBuf,
    log: StepLog,
}

impl Drop for FailureReport {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "\n=== {} failed ===\nstore: {}\nstep log:\n{}\n",
                self.name,
                self.path.display(),
                self.log.dump()
            );
        }
    }
}

fn count(c: &AtomicUsize) -> usize {
    c.load(SeqCst)
}

/// Everything the tools of the restart test share with the test, across both runtimes.
struct Probe {
    log: StepLog,
    /// `block`: entries into its never-ending step, and the gate that ends it.
    block_entries: AtomicUsize,
    block_gate: Gate,
    /// `five_steps`: executions of each step's body (counted on entry).
    steps: [Arc<AtomicUsize>; 5],
    /// `five_steps`: times step 3 got past its gate.
    step3_passed: AtomicUsize,
    step3_gate: Gate,
    /// Invocations of the other tools.
    two_inputs_calls: AtomicUsize,
    ok_calls: AtomicUsize,
    fail_calls: AtomicUsize,
    ask_calls: AtomicUsize,
}

impl Probe {
    fn new(log: StepLog) -> Arc<Self> {
        Arc::new(Self {
            log,
            block_entries: AtomicUsize::new(0),
            block_gate: Gate::new(),
            steps: std::array::from_fn(|_| Arc::new(AtomicUsize::new(0))),
            step3_passed: AtomicUsize::new(0),
            step3_gate: Gate::new(),
            two_inputs_calls: AtomicUsize::new(0),
            ok_calls: AtomicUsize::new(0),
            fail_calls: AtomicUsize::new(0),
            ask_calls: AtomicUsize::new(0),
        })
    }

    fn step_counts(&self) -> Vec<usize> {
        self.steps.iter().map(|c| count(c)).collect()
    }
}

fn form(message: &str, field: &str) -> InputRequest {
    InputRequest::elicit_form(
        message,
        json!({
            "type": "object",
            "properties": { field: { "type": "string" } },
            "required": [field]
        }),
    )
}

/// The tools of the restart test. Called once per runtime; every instance shares `probe`.
fn restart_tools(probe: &Arc<Probe>) -> Vec<Arc<dyn Tool>> {
    let p = probe.clone();
    let block = tool_fn(
        ToolDescriptor::new("block", "Waits inside a step until told."),
        move |ctx, _| {
            let p = p.clone();
            async move {
                let v: String = ctx
                    .step("wait", {
                        let p = p.clone();
                        move || async move {
                            let n = p.block_entries.fetch_add(1, SeqCst) + 1;
                            p.log.log(format!("block: step `wait` entered (#{n})"));
                            p.block_gate.wait().await;
                            p.log.log("block: step `wait` released");
                            Ok("released".to_owned())
                        }
                    })
                    .await?;
                Ok(CallToolResult::text(v.clone()).with_structured(json!({ "wait": v })))
            }
        },
    );

    let p = probe.clone();
    let five = tool_fn(
        ToolDescriptor::new(
            "five_steps",
            "Five journaled steps; step 3 waits on a gate.",
        ),
        move |ctx, _| {
            let p = p.clone();
            async move {
                let mut out = Vec::new();
                for i in 0..5usize {
                    let p = p.clone();
                    let v: usize = ctx
                        .step(&format!("step{}", i + 1), move || async move {
                            let n = p.steps[i].fetch_add(1, SeqCst) + 1;
                            p.log
                                .log(format!("five_steps: step{} executing (#{n})", i + 1));
                            if i == 2 {
                                p.step3_gate.wait().await;
                                p.step3_passed.fetch_add(1, SeqCst);
                                p.log.log("five_steps: step3 passed its gate");
                            }
                            Ok(i + 1)
                        })
                        .await?;
                    out.push(v);
                }
                Ok(CallToolResult::text("all five steps done")
                    .with_structured(json!({ "steps": out })))
            }
        },
    );

    let p = probe.clone();
    let two = tool_fn(
        ToolDescriptor::new("two_inputs", "Asks for two inputs at once."),
        move |ctx, _| {
            let p = p.clone();
            async move {
                let n = p.two_inputs_calls.fetch_add(1, SeqCst) + 1;
                p.log.log(format!("two_inputs: invoked (#{n})"));
                let answers = ctx
                    .inputs(BTreeMap::from([
                        ("alpha".to_owned(), form("First value?", "a")),
                        ("beta".to_owned(), form("Second value?", "b")),
                    ]))
                    .await?;
                p.log.log("two_inputs: got both answers");
                Ok(CallToolResult::text("got both answers")
                    .with_structured(json!({ "alpha": answers["alpha"], "beta": answers["beta"] })))
            }
        },
    );

    let p = probe.clone();
    let ok = tool_fn(
        ToolDescriptor::new("ok", "Completes at once."),
        move |_, _| {
            let p = p.clone();
            async move {
                p.ok_calls.fetch_add(1, SeqCst);
                p.log.log("ok: invoked");
                Ok(CallToolResult::text("fine").with_structured(json!({ "ok": true })))
            }
        },
    );

    let p = probe.clone();
    let fail = tool_fn(
        ToolDescriptor::new("fail", "Fails at once."),
        move |_, _| {
            let p = p.clone();
            async move {
                p.fail_calls.fetch_add(1, SeqCst);
                p.log.log("fail: invoked");
                Err(ToolError::rpc(-32603, "deliberate failure"))
            }
        },
    );

    let p = probe.clone();
    let ask = tool_fn(
        ToolDescriptor::new("ask_one", "Asks for one input."),
        move |ctx, _| {
            let p = p.clone();
            async move {
                p.ask_calls.fetch_add(1, SeqCst);
                p.log.log("ask_one: invoked");
                let r = ctx.input("confirm", form("Confirm?", "c")).await;
                p.log
                    .log(format!("ask_one: input returned ok={}", r.is_ok()));
                let v = r?;
                Ok(CallToolResult::text("confirmed").with_structured(json!({ "confirm": v })))
            }
        },
    );

    vec![block, five, two, ok, fail, ask]
}

// ---------------------------------------------------------------------------------------------
// A tiny JSON-RPC client
// ---------------------------------------------------------------------------------------------

fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": { "extensions": { "io.modelcontextprotocol/tasks": {} } }
    })
}

async fn rpc(rt: &Runtime, method: &str, mut params: Value) -> Value {
    params["_meta"] = meta();
    // One fixed request id: responses of the same request are then comparable as a whole.
    let request = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    rt.handle_json(request.clone(), &Owner::anonymous())
        .await
        .unwrap_or_else(|| panic!("no response to {request}"))
}

fn result(response: &Value) -> &Value {
    assert!(
        response.get("error").is_none(),
        "unexpected error response: {response}"
    );
    &response["result"]
}

async fn call_tool(rt: &Runtime, log: &StepLog, name: &str) -> String {
    let r = rpc(rt, "tools/call", json!({ "name": name, "arguments": {} })).await;
    let r = result(&r);
    assert_eq!(
        r["resultType"], "task",
        "tools/call {name} did not create a task: {r}"
    );
    let id = r["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("no taskId: {r}"))
        .to_owned();
    log.log(format!("test: created {name} task {id}"));
    id
}

async fn get(rt: &Runtime, id: &str) -> Value {
    rpc(rt, "tasks/get", json!({ "taskId": id })).await
}

async fn update(rt: &Runtime, log: &StepLog, id: &str, responses: Value) {
    log.log(format!("test: tasks/update {id} {responses}"));
    let r = rpc(
        rt,
        "tasks/update",
        json!({ "taskId": id, "inputResponses": responses }),
    )
    .await;
    assert_eq!(result(&r)["resultType"], "complete", "{r}");
}

async fn cancel(rt: &Runtime, log: &StepLog, id: &str) {
    log.log(format!("test: tasks/cancel {id}"));
    let r = rpc(rt, "tasks/cancel", json!({ "taskId": id })).await;
    assert_eq!(result(&r)["resultType"], "complete", "{r}");
}

fn status(response: &Value) -> &str {
    response["result"]["status"].as_str().unwrap_or("<none>")
}

fn input_keys(response: &Value) -> Vec<String> {
    response["result"]["inputRequests"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// Polls `tasks/get` until `pred` holds (at most [`WAIT`]); returns the last response.
async fn wait_task(
    rt: &Runtime,
    log: &StepLog,
    id: &str,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let r = get(rt, id).await;
        if pred(&r) {
            log.log(format!("test: task {id} is {what}"));
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "task {id} did not become {what} within {WAIT:?}; last tasks/get: {r}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_status(rt: &Runtime, log: &StepLog, id: &str, want: &str) -> Value {
    wait_task(rt, log, id, want, |r| status(r) == want).await
}

/// Polls `cond` until it holds (at most [`WAIT`]).
async fn wait_until(log: &StepLog, what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "not reached within {WAIT:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    log.log(format!("test: reached: {what}"));
}

async fn wait_live(rt: &Runtime, log: &StepLog, want: usize) {
    wait_until(log, &format!("live_tasks() == {want}"), || {
        rt.live_tasks() == want
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Starting and stopping runtimes
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Stop {
    /// `Runtime::shutdown().await`.
    Shutdown,
    /// Drop the `Runtime` value without shutting it down (an in-process "crash").
    Drop,
}

async fn start(path: &Path, tools: Vec<Arc<dyn Tool>>, config: RuntimeConfig) -> Runtime {
    Runtime::builder(path)
        .tools(tools)
        .config(config)
        .start()
        .await
        .unwrap_or_else(|e| panic!("runtime did not start on {}: {e}", path.display()))
}

/// Starts a runtime, retrying for up to [`REOPEN_RETRY`] while the file is still open.
/// Returns the runtime and how long the file stayed locked.
async fn start_retrying(
    path: &Path,
    tools: impl Fn() -> Vec<Arc<dyn Tool>>,
    config: RuntimeConfig,
    log: &StepLog,
) -> (Runtime, Duration) {
    let began = Instant::now();
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match Runtime::builder(path)
            .tools(tools())
            .config(config.clone())
            .start()
            .await
        {
            Ok(rt) => {
                let waited = began.elapsed();
                log.log(format!(
                    "test: reopened after {attempts} attempt(s), {waited:?}"
                ));
                return (rt, waited);
            }
            Err(StartError::Store(StoreError::AlreadyOpen { .. }))
                if began.elapsed() < REOPEN_RETRY =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!(
                "FINDING: reopening {} after dropping the runtime without shutdown failed after \
                 {attempts} attempts over {:?}: {e}",
                path.display(),
                began.elapsed()
            ),
        }
    }
}

async fn stop(rt: Runtime, how: Stop, log: &StepLog) {
    log.log(format!("test: stopping runtime ({how:?})"));
    match how {
        Stop::Shutdown => rt.shutdown().await,
        Stop::Drop => drop(rt),
    }
}

// ---------------------------------------------------------------------------------------------
// The restart test, in two variants
// ---------------------------------------------------------------------------------------------

/// Ids of the tasks of the restart test, one per status.
struct Tasks {
    working: String,
    input: String,
    half: String,
    completed: String,
    failed: String,
    cancelled: String,
}

impl Tasks {
    fn all(&self) -> [(&'static str, &str); 6] {
        [
            ("working", &self.working),
            ("input_required (partly answered)", &self.input),
            ("half-done", &self.half),
            ("completed", &self.completed),
            ("failed", &self.failed),
            ("cancelled", &self.cancelled),
        ]
    }
}

async fn restart_keeps_every_task(name: &'static str, how: Stop) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tasks.redb");
    let log = StepLog::new();
    let _report = FailureReport {
        name,
        path: path.clone(),
        log: log.clone(),
    };
    let probe = Probe::new(log.clone());
    let answer_alpha = json!({ "action": "accept", "content": { "a": "first answer" } });
    let answer_beta = json!({ "action": "accept", "content": { "b": "second answer" } });

    // ---- First run: one task in every status. ----
    log.log(format!("test: starting runtime #1 on {}", path.display()));
    let rt = start(&path, restart_tools(&probe), RuntimeConfig::default()).await;

    let tasks = Tasks {
        working: call_tool(&rt, &log, "block").await,
        input: call_tool(&rt, &log, "two_inputs").await,
        half: call_tool(&rt, &log, "five_steps").await,
        completed: call_tool(&rt, &log, "ok").await,
        failed: call_tool(&rt, &log, "fail").await,
        cancelled: call_tool(&rt, &log, "ask_one").await,
    };

    // working: the tool sits inside its step.
    wait_until(&log, "block entered its step", || {
        count(&probe.block_entries) == 1
    })
    .await;
    wait_status(&rt, &log, &tasks.working, "working").await;

    // input_required with two keys, one of them answered.
    let r = wait_status(&rt, &log, &tasks.input, "input_required").await;
    assert_eq!(
        input_keys(&r),
        ["alpha", "beta"],
        "both keys are asked at once: {r}"
    );
    update(&rt, &log, &tasks.input, json!({ "alpha": answer_alpha })).await;
    let r = get(&rt, &tasks.input).await;
    assert_eq!(
        status(&r),
        "input_required",
        "a partial answer keeps the task input_required: {r}"
    );
    assert_eq!(
        input_keys(&r),
        ["beta"],
        "only the unanswered key is still asked: {r}"
    );

    // half-done: steps 1-2 committed, step 3 blocked on its gate.
    wait_until(&log, "five_steps is blocked in step 3", || {
        count(&probe.steps[2]) == 1
    })
    .await;
    assert_eq!(probe.step_counts(), [1, 1, 1, 0, 0]);
    wait_status(&rt, &log, &tasks.half, "working").await;

    // completed and failed.
    let r = wait_status(&rt, &log, &tasks.completed, "completed").await;
    assert_eq!(
        r["result"]["result"]["structuredContent"],
        json!({ "ok": true }),
        "{r}"
    );
    let r = wait_status(&rt, &log, &tasks.failed, "failed").await;
    assert_eq!(r["result"]["error"]["code"], -32603, "{r}");
    assert_eq!(r["result"]["error"]["message"], "deliberate failure", "{r}");

    // cancelled while input_required.
    wait_status(&rt, &log, &tasks.cancelled, "input_required").await;
    cancel(&rt, &log, &tasks.cancelled).await;
    wait_status(&rt, &log, &tasks.cancelled, "cancelled").await;

    // Terminal actors passivate: only the three live tasks keep an actor.
    wait_live(&rt, &log, 3).await;

    let mut before = BTreeMap::new();
    for (label, id) in tasks.all() {
        let r = get(&rt, id).await;
        log.log(format!("test: before restart, {label}: {r}"));
        before.insert(id.to_owned(), r);
    }

    // ---- Restart on the same file with the same tools. ----
    stop(rt, how, &log).await;
    log.log("test: starting runtime #2");
    let rt = match how {
        Stop::Shutdown => start(&path, restart_tools(&probe), RuntimeConfig::default()).await,
        Stop::Drop => {
            let tools = || restart_tools(&probe);
            let (rt, waited) = start_retrying(&path, tools, RuntimeConfig::default(), &log).await;
            eprintln!("[{name}] the dropped runtime released the store after {waited:?}");
            rt
        }
    };
    let live_at_start = (rt.live_tasks(), rt.parked_tasks());
    log.log(format!(
        "test: (live_tasks(), parked_tasks()) right after start() returned: {live_at_start:?}"
    ));

    // Every task answers exactly as before, immediately...
    for (label, id) in tasks.all() {
        let r = get(&rt, id).await;
        assert_eq!(
            r, before[id],
            "{label} task {id} changed across the restart"
        );
    }
    // ...and the live ones have actors again, and their tools ran up to where they were; the
    // one waiting for input is parked without an actor until it is answered (passivation).
    wait_live(&rt, &log, 2).await;
    assert_eq!(rt.parked_tasks(), 1, "the task waiting for input is parked");
    wait_until(&log, "block re-entered its step", || {
        count(&probe.block_entries) == 2
    })
    .await;
    wait_until(&log, "five_steps is blocked in step 3 again", || {
        count(&probe.steps[2]) == 2
    })
    .await;
    assert_eq!(
        count(&probe.two_inputs_calls),
        1,
        "parked: its tool does not run"
    );
    assert_eq!(
        probe.step_counts(),
        [1, 1, 2, 0, 0],
        "committed steps 1-2 must be replayed, not re-run"
    );
    assert_eq!(count(&probe.step3_passed), 0);
    // Rehydrating and re-running the tools did not change any task.
    for (label, id) in tasks.all() {
        let r = get(&rt, id).await;
        assert_eq!(
            r, before[id],
            "{label} task {id} changed after its tool resumed"
        );
    }
    assert_eq!(
        rt.live_tasks() + rt.parked_tasks(),
        3,
        "live_tasks() + parked_tasks() must equal the number of non-terminal tasks"
    );
    // Terminal tasks are not run again.
    assert_eq!(count(&probe.ok_calls), 1);
    assert_eq!(count(&probe.fail_calls), 1);
    assert_eq!(count(&probe.ask_calls), 1);

    // The half-done task finishes once its gate opens: steps 1-2 ran once in total,
    // step 3 once past its gate, steps 4-5 once.
    log.log("test: opening the step-3 gate");
    probe.step3_gate.open();
    let r = wait_status(&rt, &log, &tasks.half, "completed").await;
    assert_eq!(
        r["result"]["result"]["structuredContent"],
        json!({ "steps": [1, 2, 3, 4, 5] }),
        "{r}"
    );
    assert_eq!(probe.step_counts(), [1, 1, 2, 1, 1]);
    assert_eq!(count(&probe.step3_passed), 1);

    // The partly answered task: a repeated answer for the answered key is ignored; answering
    // the remaining key completes it, and the tool saw both answers.
    update(
        &rt,
        &log,
        &tasks.input,
        json!({ "alpha": { "action": "accept", "content": { "a": "late" } } }),
    )
    .await;
    assert_eq!(
        get(&rt, &tasks.input).await,
        before[&tasks.input],
        "an answered key must be ignored"
    );
    // The answer woke the parked task: its tool runs again up to the remaining key.
    wait_until(&log, "two_inputs re-invoked", || {
        count(&probe.two_inputs_calls) == 2
    })
    .await;
    update(&rt, &log, &tasks.input, json!({ "beta": answer_beta })).await;
    let r = wait_status(&rt, &log, &tasks.input, "completed").await;
    assert_eq!(
        r["result"]["result"]["structuredContent"],
        json!({ "alpha": answer_alpha, "beta": answer_beta }),
        "the tool must see both answers: {r}"
    );
    assert_eq!(count(&probe.two_inputs_calls), 2);

    // The working task was not committed, so its step runs again after the restart (twice in
    // total) and finishes once released.
    log.log("test: opening the block gate");
    probe.block_gate.open();
    let r = wait_status(&rt, &log, &tasks.working, "completed").await;
    assert_eq!(
        r["result"]["result"]["structuredContent"],
        json!({ "wait": "released" }),
        "{r}"
    );
    assert_eq!(count(&probe.block_entries), 2);

    // Terminal tasks stayed as they were, also after late commands.
    cancel(&rt, &log, &tasks.completed).await;
    cancel(&rt, &log, &tasks.failed).await;
    update(
        &rt,
        &log,
        &tasks.cancelled,
        json!({ "confirm": { "action": "accept", "content": { "c": "x" } } }),
    )
    .await;
    for (label, id) in [
        ("completed", &tasks.completed),
        ("failed", &tasks.failed),
        ("cancelled", &tasks.cancelled),
    ] {
        assert_eq!(
            get(&rt, id).await,
            before[id.as_str()],
            "terminal {label} task {id} changed"
        );
    }
    assert_eq!(count(&probe.ask_calls), 1);
    wait_live(&rt, &log, 0).await;

    assert_eq!(
        live_at_start,
        (2, 1),
        "[{name}] Runtime::start() returns after rehydration: every live task has its actor, \
         but the one waiting for input, which is parked"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_after_shutdown_keeps_every_task() {
    restart_keeps_every_task("restart_after_shutdown_keeps_every_task", Stop::Shutdown).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_after_drop_without_shutdown_keeps_every_task() {
    restart_keeps_every_task(
        "restart_after_drop_without_shutdown_keeps_every_task",
        Stop::Drop,
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// A cancellation request survives a restart
// ---------------------------------------------------------------------------------------------

/// A tool that ignores cancellation: it records whether it sees a cancellation request when it
/// starts, then waits for its gate (outside any step), and only then honours the request.
struct Stubborn {
    log: StepLog,
    name: &'static str,
    /// `ctx.is_cancelled()` at the start of every invocation.
    seen: Mutex<Vec<bool>>,
    gate: Gate,
}

impl Stubborn {
    fn new(log: &StepLog, name: &'static str) -> Arc<Self> {
        Arc::new(Self {
            log: log.clone(),
            name,
            seen: Mutex::default(),
            gate: Gate::new(),
        })
    }

    fn seen(&self) -> Vec<bool> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn tool(self: &Arc<Self>) -> Arc<dyn Tool> {
        let s = self.clone();
        tool_fn(
            ToolDescriptor::new(self.name, "Ignores cancellation until its gate opens."),
            move |ctx, _| {
                let s = s.clone();
                async move {
                    let cancelled = ctx.is_cancelled();
                    s.seen
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(cancelled);
                    s.log
                        .log(format!("{}: invoked, is_cancelled() = {cancelled}", s.name));
                    s.gate.wait().await;
                    let cancelled = ctx.is_cancelled();
                    s.log.log(format!(
                        "{}: gate open, is_cancelled() = {cancelled}",
                        s.name
                    ));
                    if cancelled {
                        Err(ToolError::Cancelled)
                    } else {
                        Ok(CallToolResult::text("not cancelled"))
                    }
                }
            },
        )
    }
}

fn grace(d: Duration) -> RuntimeConfig {
    let mut c = RuntimeConfig::default();
    c.cancel_grace = d;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_request_survives_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tasks.redb");
    let log = StepLog::new();
    let _report = FailureReport {
        name: "cancel_request_survives_restart",
        path: path.clone(),
        log: log.clone(),
    };
    let a = Stubborn::new(&log, "stubborn_a");
    let b = Stubborn::new(&log, "stubborn_b");
    let tools = || vec![a.tool(), b.tool()];
    let long = Duration::from_secs(3600);

    // Run 1: both tasks working, cancellation requested, tools ignore it (long grace).
    log.log(format!("test: starting runtime #1 on {}", path.display()));
    let rt = start(&path, tools(), grace(long)).await;
    let ta = call_tool(&rt, &log, "stubborn_a").await;
    let tb = call_tool(&rt, &log, "stubborn_b").await;
    wait_until(&log, "both stubborn tools started", || {
        a.seen().len() == 1 && b.seen().len() == 1
    })
    .await;
    assert_eq!((a.seen(), b.seen()), (vec![false], vec![false]));
    cancel(&rt, &log, &ta).await;
    cancel(&rt, &log, &tb).await;
    let before_a = wait_status(&rt, &log, &ta, "working").await;
    let before_b = wait_status(&rt, &log, &tb, "working").await;
    rt.shutdown().await;

    // Run 2 (long grace): the rehydrated tools see the cancellation request at once.
    log.log("test: starting runtime #2");
    let rt = start(&path, tools(), grace(long)).await;
    assert_eq!(
        get(&rt, &ta).await,
        before_a,
        "task a changed across the restart"
    );
    assert_eq!(
        get(&rt, &tb).await,
        before_b,
        "task b changed across the restart"
    );
    wait_until(&log, "both stubborn tools re-invoked", || {
        a.seen().len() == 2 && b.seen().len() == 2
    })
    .await;
    assert_eq!(
        a.seen(),
        [false, true],
        "the cancellation request must be visible after a restart"
    );
    assert_eq!(
        b.seen(),
        [false, true],
        "the cancellation request must be visible after a restart"
    );
    wait_live(&rt, &log, 2).await;
    assert_eq!(
        get(&rt, &ta).await,
        before_a,
        "task a changed after its tool resumed"
    );
    assert_eq!(
        get(&rt, &tb).await,
        before_b,
        "task b changed after its tool resumed"
    );
    // a honours the request once its gate opens.
    a.gate.open();
    let r = wait_status(&rt, &log, &ta, "cancelled").await;
    assert_eq!(r["result"]["statusMessage"], "Cancelled.", "{r}");
    wait_live(&rt, &log, 1).await;
    rt.shutdown().await;

    // Run 3 (short grace): b never honours the request; the grace period, re-armed at
    // rehydration, cancels it.
    log.log("test: starting runtime #3");
    let rt = start(&path, tools(), grace(Duration::from_millis(300))).await;
    assert_eq!(
        get(&rt, &ta).await,
        r,
        "the cancelled task changed across the restart"
    );
    let r = wait_status(&rt, &log, &tb, "cancelled").await;
    assert_eq!(
        r["result"]["statusMessage"], "Cancelled: the tool did not stop within the grace period.",
        "{r}"
    );
    wait_until(&log, "stubborn_b re-invoked a second time", || {
        b.seen().len() == 3
    })
    .await;
    assert_eq!(b.seen(), [false, true, true]);
    assert_eq!(a.seen().len(), 2, "a terminal task's tool is not run again");
    wait_live(&rt, &log, 0).await;
    rt.shutdown().await;
}
