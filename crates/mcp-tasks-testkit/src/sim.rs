//! The workload of the crash-and-restart simulations (`docs/CRASH-TESTING.md`): a tool with
//! several journaled steps whose side effects are appended to a log, optional input requests
//! and an optional failure, plus a strictly increasing clock.
//!
//! The side-effect log is what proves that a journaled step whose result was committed never
//! runs again (ARCHITECTURE.md, "steps are at-least-once, committed results exactly-once"): every execution of a step body appends one line `task step value` with a
//! fresh random `value`, and the step returns that value, so the journal names the execution
//! whose result it committed; a later line for the same task and step is a re-execution.
//!
//! [`StrictClock`] makes every time the process hands out distinct and increasing. (A task's
//! own `lastUpdatedAt` grows with every change a client sees whatever the clock: the state
//! machine takes `max(now, previous + 1)`.)

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value, json};

use mcp_tasks::RuntimeBuilder;
use mcp_tasks::clock::{Clock, SystemClock};
use mcp_tasks::tool::{
    CallToolResult, InputRequest, TaskPolicy, Tool, ToolDescriptor, ToolError, tool_fn,
};

/// The name of the workload tool.
pub const TOOL: &str = "sim_job";

/// Where step executions are recorded.
pub trait SideEffects: Send + Sync + 'static {
    /// Records that step `step` of task `task` ran and produced `value`. `false` means the
    /// process counts as dead (a simulated power loss): the step then never finishes.
    fn record(&self, task: &str, step: &str, value: &str) -> bool;
}

/// One recorded step execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SideEffect {
    /// The task.
    pub task: String,
    /// The step name.
    pub step: String,
    /// The value the step produced.
    pub value: String,
}

impl SideEffect {
    /// The line as written to a side-effect file.
    pub fn line(&self) -> String {
        format!("{} {} {}\n", self.task, self.step, self.value)
    }

    /// Reads one line of a side-effect file; `None` for a malformed (e.g. torn) line.
    pub fn parse(line: &str) -> Option<Self> {
        let mut parts = line.split(' ');
        let (task, step, value) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || value.is_empty() {
            return None;
        }
        Some(Self {
            task: task.to_owned(),
            step: step.to_owned(),
            value: value.to_owned(),
        })
    }
}

/// Appends side effects to a file, one `write` per line (`O_APPEND`), so a killed process
/// leaves whole lines. The file is opened on first use.
pub struct FileSideEffects {
    path: PathBuf,
    file: Mutex<Option<File>>,
}

impl FileSideEffects {
    /// Side effects appended to the file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            file: Mutex::new(None),
        }
    }

    /// Every well-formed line of a side-effect file, in order (a missing file is empty).
    pub fn read(path: &Path) -> std::io::Result<Vec<SideEffect>> {
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(text.lines().filter_map(SideEffect::parse).collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}

impl SideEffects for FileSideEffects {
    fn record(&self, task: &str, step: &str, value: &str) -> bool {
        let line = SideEffect {
            task: task.to_owned(),
            step: step.to_owned(),
            value: value.to_owned(),
        }
        .line();
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if file.is_none() {
            match OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
            {
                Ok(f) => *file = Some(f),
                Err(e) => {
                    tracing::error!(path = %self.path.display(), error = %e, "cannot open the side-effect file");
                    return true;
                }
            }
        }
        if let Some(f) = file.as_mut()
            && let Err(e) = f.write_all(line.as_bytes())
        {
            tracing::error!(path = %self.path.display(), error = %e, "cannot append to the side-effect file");
        }
        true
    }
}

/// A clock that never returns the same millisecond twice and never goes back:
/// `max(base, last + 1)`.
pub struct StrictClock {
    base: Arc<dyn Clock>,
    last: AtomicU64,
}

impl StrictClock {
    /// A strict clock over `base`.
    pub fn new(base: Arc<dyn Clock>) -> Self {
        Self {
            base,
            last: AtomicU64::new(0),
        }
    }

    /// Over the system clock.
    pub fn system() -> Self {
        Self::new(Arc::new(SystemClock))
    }
}

impl Clock for StrictClock {
    fn now_ms(&self) -> u64 {
        let now = self.base.now_ms();
        let mut last = self.last.load(Ordering::SeqCst);
        loop {
            let next = now.max(last.saturating_add(1));
            match self
                .last
                .compare_exchange(last, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return next,
                Err(seen) => last = seen,
            }
        }
    }
}

/// Adds the workload tool, recording side effects to the file `side_effects`, and a
/// [`StrictClock`] over the system clock as the process's local clock: on a store shared by
/// replicas, time is still decided by the store's clock as in production
/// ([`RuntimeBuilder::local_clock`]), so the replica crash suite runs the production time path.
pub fn install(builder: RuntimeBuilder, side_effects: PathBuf) -> RuntimeBuilder {
    builder
        .local_clock(Arc::new(StrictClock::system()))
        .tool(job_tool(Arc::new(FileSideEffects::new(side_effects))))
        .tool(abort_tool())
}

/// The name of the poison-pill tool of the binary's crash fixtures.
pub const ABORT_TOOL: &str = "abort_job";

/// A tool that aborts the whole process `delayMs` (default 300) after each of its runs starts:
/// the poison pill of the restart-budget test (its task must end `failed` after the budget
/// instead of crashing the server at every start).
fn abort_tool() -> Arc<dyn Tool> {
    let schema = json!({
        "type": "object",
        "properties": { "delayMs": { "type": "integer", "minimum": 0, "maximum": 60000 } },
        "additionalProperties": false
    });
    tool_fn(
        ToolDescriptor::new(
            ABORT_TOOL,
            "Crash-simulation poison pill: aborts the process shortly after every start.",
        )
        .input_schema(schema)
        .task_policy(TaskPolicy::Always),
        |_ctx, args: Map<String, Value>| async move {
            let delay = args.get("delayMs").and_then(Value::as_u64).unwrap_or(300);
            tokio::time::sleep(Duration::from_millis(delay)).await;
            tracing::error!("abort_job: aborting the process on purpose");
            std::process::abort();
        },
    )
}

/// Adds the workload tool with any side-effect sink (the clock is left as it is).
pub fn install_with(builder: RuntimeBuilder, side_effects: Arc<dyn SideEffects>) -> RuntimeBuilder {
    builder.tool(job_tool(side_effects))
}

/// The arguments of one [`TOOL`] call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    /// Journaled steps `s0`, `s1`, … (1 to 16).
    pub steps: u32,
    /// After these steps the tool asks for input under key `k{i}` (answered with a form
    /// `{"v": string}`).
    pub inputs: BTreeSet<u32>,
    /// Whether the tool ends with a JSON-RPC error (the task `failed`) instead of a result.
    pub fail: bool,
    /// How long each step body sleeps after recording its side effect (before its commit).
    pub delay_ms: u64,
}

impl JobSpec {
    /// The `sim_job` arguments of this job.
    pub fn to_arguments(&self) -> Value {
        json!({
            "steps": self.steps,
            "inputs": self.inputs.iter().collect::<Vec<_>>(),
            "fail": self.fail,
            "delayMs": self.delay_ms,
        })
    }

    /// Reads the arguments of a call (missing or ill-typed members take their defaults).
    pub fn from_arguments(args: &Map<String, Value>) -> Self {
        let n = |k: &str| args.get(k).and_then(Value::as_u64).unwrap_or(0);
        Self {
            steps: u32::try_from(n("steps").clamp(1, 16)).unwrap_or(1),
            inputs: args
                .get("inputs")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_u64)
                        .filter_map(|i| u32::try_from(i).ok())
                        .collect()
                })
                .unwrap_or_default(),
            fail: args.get("fail").and_then(Value::as_bool).unwrap_or(false),
            delay_ms: n("delayMs").min(10_000),
        }
    }
}

/// The key the tool asks under after step `i`.
pub fn input_key(step: u32) -> String {
    format!("k{step}")
}

/// The step name of step `i`.
pub fn step_name(step: u32) -> String {
    format!("s{step}")
}

fn fresh_value() -> String {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        static FALLBACK: AtomicU64 = AtomicU64::new(1);
        bytes = FALLBACK.fetch_add(1, Ordering::SeqCst).to_le_bytes();
    }
    format!("{:016x}", u64::from_le_bytes(bytes))
}

fn job_tool(sink: Arc<dyn SideEffects>) -> Arc<dyn Tool> {
    let schema = json!({
        "type": "object",
        "properties": {
            "steps": { "type": "integer", "minimum": 1, "maximum": 16 },
            "inputs": { "type": "array", "items": { "type": "integer", "minimum": 0 } },
            "fail": { "type": "boolean" },
            "delayMs": { "type": "integer", "minimum": 0 }
        },
        "required": ["steps"]
    });
    tool_fn(
        ToolDescriptor::new(
            TOOL,
            "Crash-simulation workload: journaled steps with logged side effects, optional inputs.",
        )
        .task_policy(TaskPolicy::Always)
        .input_schema(schema),
        move |ctx, args| {
            let sink = sink.clone();
            async move {
                let spec = JobSpec::from_arguments(&args);
                let task = ctx
                    .task_id()
                    .map_or_else(|| "inline".to_owned(), |t| t.as_str().to_owned());
                let mut values = Vec::new();
                let mut answers = Map::new();
                for i in 0..spec.steps {
                    let name = step_name(i);
                    let (sink, task, step, delay) =
                        (sink.clone(), task.clone(), name.clone(), spec.delay_ms);
                    let value: String = ctx
                        .step(&name, move || async move {
                            let value = fresh_value();
                            if !sink.record(&task, &step, &value) {
                                // The simulated process is dead: this execution never ends.
                                futures::future::pending::<()>().await;
                            }
                            if delay > 0 {
                                tokio::time::sleep(Duration::from_millis(delay)).await;
                            }
                            Ok(value)
                        })
                        .await?;
                    values.push(Value::String(value));
                    if spec.inputs.contains(&i) {
                        let key = input_key(i);
                        let request = InputRequest::elicit_form(
                            format!("Value for step {i}?"),
                            json!({
                                "type": "object",
                                "properties": { "v": { "type": "string" } },
                                "required": ["v"]
                            }),
                        );
                        let answer = ctx.input(&key, request).await?;
                        answers.insert(key, answer);
                    }
                    if i % 2 == 1 {
                        ctx.set_status(format!("step {} of {} done", i + 1, spec.steps))
                            .await?;
                    }
                }
                if spec.fail {
                    return Err(ToolError::rpc(-32000, "sim_job failed as asked"));
                }
                Ok(CallToolResult::text("sim_job done")
                    .with_structured(json!({ "steps": values, "answers": answers })))
            }
        },
    )
}
