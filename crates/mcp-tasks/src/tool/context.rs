//! The context a tool runs in: journaled steps, durable input requests, status messages and
//! cooperative cancellation.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use super::ToolError;
use crate::task::{Event, Owner, TaskId, TaskRecord, TaskStatus};
pub use crate::wire::LogLevel;

/// One request for client input (`InputRequest` of MRTR): an `elicitation/create`,
/// `sampling/createMessage` or `roots/list` request without `jsonrpc` and `id`.
#[derive(Debug, Clone, PartialEq)]
pub struct InputRequest(Value);

impl InputRequest {
    /// A form-mode elicitation: `message` and a flat `requestedSchema` object.
    pub fn elicit_form(message: impl Into<String>, requested_schema: Value) -> Self {
        Self(json!({
            "method": "elicitation/create",
            "params": { "mode": "form", "message": message.into(), "requestedSchema": requested_schema }
        }))
    }

    /// Any input request object, as given.
    pub fn raw(request: Value) -> Self {
        Self(request)
    }

    /// The request object as JSON.
    pub fn into_json(self) -> Value {
        self.0
    }
}

/// What the user did with an elicitation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElicitAction {
    /// `accept`: the user submitted the form; `content` holds the answer.
    Accept,
    /// `decline`: the user explicitly refused to answer.
    Decline,
    /// `cancel`: the user dismissed the request without choosing.
    Cancel,
}

/// An `ElicitResult` read from a client's input response.
#[derive(Debug, Clone, PartialEq)]
pub struct ElicitResponse {
    /// What the user did.
    pub action: ElicitAction,
    /// The form's answer (empty unless accepted).
    pub content: Map<String, Value>,
}

impl ElicitResponse {
    /// Reads an `ElicitResult`. An unreadable response counts as `cancel`, the safe outcome.
    pub fn from_json(v: &Value) -> Self {
        let action = match v.get("action").and_then(Value::as_str) {
            Some("accept") => ElicitAction::Accept,
            Some("decline") => ElicitAction::Decline,
            _ => ElicitAction::Cancel,
        };
        let content = v
            .get("content")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        Self { action, content }
    }
}

/// Where a running tool's events go: its task actor, which commits them before answering.
/// A trait so that the tool layer does not name the actor layer above it.
pub(crate) trait EventSink: Send + Sync {
    /// Records `event` durably; resolves once it is committed (or refused).
    fn record(&self, event: Event) -> futures::future::BoxFuture<'_, Result<(), ToolError>>;
}

/// The link between a running tool and its task actor.
pub(crate) struct TaskLink {
    pub(crate) events: Box<dyn EventSink>,
    pub(crate) snapshots: watch::Receiver<Arc<TaskRecord>>,
    pub(crate) limits: crate::limits::Limits,
}

enum Mode {
    Task(TaskLink),
    /// Boxed: a live task's context is kept for as long as its tool runs, a synchronous
    /// call's only for the request.
    Inline(Box<InlineInputs>),
}

/// The most bytes (as JSON) a synchronous call carries from one MRTR round to the next
/// ([`ToolContext::carry`]): a task's journal's default bound.
const MAX_CARRIED_BYTES: usize = 4 << 20;

/// Input of a synchronous call: the answers the client sent with this round of core MRTR
/// (`inputResponses`, plus those carried in a verified `requestState`).
struct InlineInputs {
    responses: Map<String, Value>,
    consumed: std::sync::Mutex<BTreeMap<String, Value>>,
    /// Values the tool's earlier rounds carried forward (a verified `requestState`'s), and
    /// those this round adds ([`ToolContext::carry`]): the next round's `requestState` holds
    /// them all.
    carried: std::sync::Mutex<BTreeMap<String, Value>>,
}

/// The client capability an input request needs (`elicitation/create` needs `elicitation`).
fn capability_for(request: &Value) -> Option<&'static str> {
    match request.get("method").and_then(Value::as_str) {
        Some("elicitation/create") => Some("elicitation"),
        Some("sampling/createMessage") => Some("sampling"),
        Some("roots/list") => Some("roots"),
        _ => None,
    }
}

struct Inner {
    owner: Owner,
    client_capabilities: Capabilities,
    task_id: Option<TaskId>,
    mode: Mode,
    /// Step names used by this run of the tool (a name used twice is a bug of the tool).
    steps: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Boxed, for the same reason as [`Mode::Inline`].
    progress: Option<Box<RequestSink>>,
}

/// The client capabilities a context answers with: a task's are its record's (shared, not
/// copied: a live task keeps its context for as long as its tool runs).
struct Capabilities(Arc<Value>);

impl Capabilities {
    fn get(&self) -> &Value {
        &self.0
    }
}

/// Where the request-scoped notifications of a synchronous call go, on the response stream
/// of that request (never anywhere else): `notifications/progress` for the request's
/// `progressToken`, `notifications/message` at or above the request's `logLevel`.
pub(crate) struct RequestSink {
    token: Option<Value>,
    log_level: Option<LogLevel>,
    messages: tokio::sync::mpsc::Sender<Value>,
    /// The last progress sent: values must increase.
    last: std::sync::Mutex<Option<f64>>,
}

impl RequestSink {
    pub(crate) fn new(
        token: Option<Value>,
        log_level: Option<LogLevel>,
        messages: tokio::sync::mpsc::Sender<Value>,
    ) -> Self {
        Self {
            token,
            log_level,
            messages,
            last: std::sync::Mutex::new(None),
        }
    }
}

/// A progress figure as text: integers without a fraction.
fn figure(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        format!("{value}")
    }
}

/// What a step knows about itself: pass [`StepKey::idempotency_key`] to the outside world so
/// that an effect that ran but whose result was not recorded is not applied twice when the
/// step runs again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepKey {
    task: Option<TaskId>,
    step: String,
    attempt: u32,
}

impl StepKey {
    /// `"<task id>/<step name>"`: the same for every execution of this step of this task,
    /// across restarts, and different for every other step and task. In a synchronous call
    /// (no task, nothing journaled) it is `None`.
    pub fn idempotency_key(&self) -> Option<String> {
        self.task
            .as_ref()
            .map(|t| format!("{}/{}", t.as_str(), self.step))
    }

    /// The task this step belongs to (`None` in a synchronous call).
    pub fn task_id(&self) -> Option<&TaskId> {
        self.task.as_ref()
    }

    /// The step's name.
    pub fn step(&self) -> &str {
        &self.step
    }

    /// The task's attempt when the step started (see `TaskRecord::attempts`): 1 unless an
    /// earlier run of the tool ended in a crash, a kill or a panic before recording progress,
    /// in which case this step may already have had its effect once. (A clean shutdown does
    /// not raise it, although it also stops a step in the middle: use the idempotency key.)
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

/// Handed to every tool call. Cheap to clone.
///
/// In a task it is the tool's link to its durable record: [`ToolContext::step`] journals a
/// result so a restarted task does not redo the work, [`ToolContext::elicit`] and
/// [`ToolContext::input`] put the task in `input_required` until the client answers, and
/// [`ToolContext::set_status`] / [`ToolContext::progress`] update its `statusMessage`; each is
/// committed before it returns. In a synchronous call the same methods work inside the
/// request (core MRTR for input, `notifications/progress` for progress).
///
/// A task that asks the user a typed question, driven by the in-process client (whose input
/// handler answers like a user would):
///
/// ```
/// use mcp_tasks::client::{input_handler, CallOutcome, Client};
/// use mcp_tasks::store::Store;
/// use mcp_tasks::tool::{typed_tool, CallToolResult, Elicited, TaskPolicy, ToolDescriptor};
/// use mcp_tasks::{Owner, Runtime};
/// use serde_json::json;
///
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Deploy {
///     service: String,
/// }
///
/// /// The question: the elicitation's `requestedSchema` is derived from it.
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Approval {
///     /// How many replicas to start.
///     replicas: u32,
/// }
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let deploy = typed_tool(
///     ToolDescriptor::new("deploy", "Deploys a service once approved.").task_policy(TaskPolicy::Always),
///     |ctx, Deploy { service }| async move {
///         // Journaled: after a restart the recorded version is returned, not fetched again.
///         let version: String = ctx.step("resolve", || async { Ok("v42".to_owned()) }).await?;
///         let question = format!("Deploy {service} {version}?");
///         Ok(match ctx.elicit::<Approval>("approve", question).await? {
///             Elicited::Accepted(Approval { replicas }) => {
///                 CallToolResult::text(format!("{service} {version} on {replicas} replicas"))
///             }
///             Elicited::Declined | Elicited::Cancelled => CallToolResult::text("not deployed"),
///         })
///     },
/// );
/// let runtime = Runtime::builder_with_store(Store::memory()).tool(deploy).start().await?;
/// let client = Client::in_process(runtime.handle(), Owner::anonymous())
///     .input_handler(input_handler(|_key, _request| async {
///         Some(json!({ "action": "accept", "content": { "replicas": 3 } }))
///     }))
///     .build()
///     .await?;
/// let CallOutcome::Task(task) = client.call_tool("deploy", json!({ "service": "api" })).await? else {
///     panic!("`deploy` always runs as a task");
/// };
/// let done = task.wait().await?; // answers the elicitation through the input handler
/// assert_eq!(done.result.unwrap()["content"][0]["text"], "api v42 on 3 replicas");
/// runtime.shutdown().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ToolContext {
    inner: Arc<Inner>,
}

impl ToolContext {
    pub(crate) fn for_task(record: &Arc<TaskRecord>, link: TaskLink) -> Self {
        Self {
            inner: Arc::new(Inner {
                owner: record.owner.clone(),
                client_capabilities: Capabilities(record.client_capabilities.clone()),
                task_id: Some(record.id.clone()),
                mode: Mode::Task(link),
                steps: Default::default(),
                progress: None,
            }),
        }
    }

    /// A context for a synchronous call without input responses: steps run directly and
    /// nothing is journaled; an input request ends the round with an `input_required` result.
    pub fn inline(owner: Owner, client_capabilities: Value) -> Self {
        Self::for_request(
            owner,
            client_capabilities,
            Map::new(),
            BTreeMap::new(),
            None,
        )
    }

    /// A context for one round of a synchronous call (core MRTR) with the answers known so far
    /// and, when the caller asked for it, where progress goes.
    pub(crate) fn for_request(
        owner: Owner,
        client_capabilities: impl Into<Arc<Value>>,
        responses: Map<String, Value>,
        carried: BTreeMap<String, Value>,
        progress: Option<RequestSink>,
    ) -> Self {
        let inputs = InlineInputs {
            responses,
            consumed: Default::default(),
            carried: std::sync::Mutex::new(carried),
        };
        Self {
            inner: Arc::new(Inner {
                owner,
                client_capabilities: Capabilities(client_capabilities.into()),
                task_id: None,
                mode: Mode::Inline(Box::new(inputs)),
                steps: Default::default(),
                progress: progress.map(Box::new),
            }),
        }
    }

    /// The answers this round used (they travel to the next round in `requestState`).
    pub(crate) fn consumed_answers(&self) -> BTreeMap<String, Value> {
        match &self.inner.mode {
            Mode::Inline(inputs) => inputs
                .consumed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            Mode::Task(_) => BTreeMap::new(),
        }
    }

    /// What this round of a synchronous call carries to the next in its `requestState`
    /// ([`Self::carry`]; empty in a task).
    pub(crate) fn carried(&self) -> BTreeMap<String, Value> {
        match &self.inner.mode {
            Mode::Inline(inputs) => inputs
                .carried
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            Mode::Task(_) => BTreeMap::new(),
        }
    }

    /// The task this call runs in, if it is one.
    pub fn task_id(&self) -> Option<&TaskId> {
        self.inner.task_id.as_ref()
    }

    /// Who called the tool.
    pub fn owner(&self) -> &Owner {
        &self.inner.owner
    }

    /// The client capabilities declared on the request that started the call.
    pub fn client_capabilities(&self) -> &Value {
        self.inner.client_capabilities.get()
    }

    fn snapshot(&self) -> Option<Arc<TaskRecord>> {
        match &self.inner.mode {
            Mode::Task(link) => Some(link.snapshots.borrow().clone()),
            Mode::Inline(_) => None,
        }
    }

    async fn record(&self, event: Event) -> Result<(), ToolError> {
        let Mode::Task(link) = &self.inner.mode else {
            return Ok(());
        };
        link.events.record(event).await
    }

    /// The value the task's journal holds for step `name` — in a synchronous call, the value
    /// an earlier round carried ([`Self::carry`]) — or `None` when no run of the tool
    /// recorded it yet.
    #[cfg_attr(not(feature = "gateway"), allow(dead_code))]
    pub(crate) fn recorded(&self, name: &str) -> Option<Value> {
        match &self.inner.mode {
            Mode::Task(_) => self
                .snapshot()
                .and_then(|snap| snap.journal.get(name).cloned()),
            Mode::Inline(inputs) => inputs
                .carried
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(name)
                .cloned(),
        }
    }

    /// Records `value` under `name` unless a value is recorded there already: in a task, a
    /// journaled step (committed before this returns); in a synchronous call, a value carried
    /// to the call's next MRTR rounds in their signed `requestState`, so a round resumes where
    /// the last one stopped instead of running from the start. The gateway keeps an
    /// upstream's own input rounds this way.
    #[cfg_attr(not(feature = "gateway"), allow(dead_code))]
    pub(crate) async fn carry(&self, name: &str, value: Value) -> Result<(), ToolError> {
        match &self.inner.mode {
            Mode::Task(_) => self.step(name, || async move { Ok(value) }).await.map(drop),
            Mode::Inline(inputs) => {
                let mut carried = inputs.carried.lock().unwrap_or_else(|e| e.into_inner());
                if carried.contains_key(name) {
                    return Ok(());
                }
                // The client echoes all of it with the next round: bounded like a task's
                // journal (`Limits::max_journal_bytes` by default).
                let len = carried
                    .iter()
                    .map(|(k, v)| k.len().saturating_add(crate::limits::json_len(v)))
                    .fold(
                        name.len().saturating_add(crate::limits::json_len(&value)),
                        usize::saturating_add,
                    );
                if len > MAX_CARRIED_BYTES {
                    return Err(ToolError::Rpc(crate::wire::error::RpcError::internal(
                        format!(
                            "`{name}` would make what this call carries to its next round {len} bytes; the limit is {MAX_CARRIED_BYTES}"
                        ),
                    )));
                }
                carried.insert(name.to_owned(), value);
                Ok(())
            }
        }
    }

    /// A journaled step: runs `f` and commits its result under `name` before returning; when
    /// the tool runs again after a restart and the journal has `name`, the recorded value is
    /// returned and `f` is not called.
    ///
    /// **Steps are at-least-once, committed results exactly-once.** If the process dies (or a
    /// commit fails) after `f` ran but before its result was committed, `f` runs again in the
    /// next run. A step with an effect on the outside world (a payment, an email) must make
    /// that effect idempotent: use [`ToolContext::step_with_key`] and pass the key along.
    ///
    /// Step names are journal keys: each name may be used once per task; using a name twice
    /// in one run of the tool is an error (`-32603`, the task fails if the tool returns it). A
    /// step that fails is not recorded and runs again next time. In a synchronous call
    /// (no task) nothing is journaled: `f` runs on every call and every MRTR round.
    pub async fn step<T, F, Fut>(&self, name: &str, f: F) -> Result<T, ToolError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, ToolError>>,
    {
        self.step_with_key(name, |_| f()).await
    }

    /// [`ToolContext::step`], handing `f` the step's [`StepKey`] (task id, step name, attempt)
    /// to pass to the outside world as an idempotency key.
    pub async fn step_with_key<T, F, Fut>(&self, name: &str, f: F) -> Result<T, ToolError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(StepKey) -> Fut,
        Fut: Future<Output = Result<T, ToolError>>,
    {
        let fresh = self
            .inner
            .steps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned());
        if !fresh {
            return Err(ToolError::Rpc(crate::wire::error::RpcError::internal(
                format!(
                    "step name `{name}` is used twice in one task; step names are journal keys and \
                 must be unique per task"
                ),
            )));
        }
        let mut attempt = 1;
        if let Some(snap) = self.snapshot() {
            #[cfg(feature = "failpoints")]
            let recorded = if crate::failpoints::breaker("break::skip_step_journal") {
                None // Deliberately broken (test-only): a committed step runs again.
            } else {
                snap.journal.get(name)
            };
            #[cfg(not(feature = "failpoints"))]
            let recorded = snap.journal.get(name);
            if let Some(recorded) = recorded {
                return serde_json::from_value(recorded.clone()).map_err(|e| {
                    ToolError::runtime_caused(
                        format!("the recorded value of step `{name}` no longer decodes"),
                        e,
                    )
                });
            }
            if snap.cancel_requested || snap.status.is_terminal() {
                return Err(ToolError::Cancelled);
            }
            // A step over the step limit does not even start.
            if let Mode::Task(link) = &self.inner.mode {
                link.limits
                    .check_step(&snap.journal, name, &Value::Null)
                    .map_err(ToolError::Rpc)?;
            }
            attempt = snap.attempts.max(1);
        }
        let key = StepKey {
            task: self.inner.task_id.clone(),
            step: name.to_owned(),
            attempt,
        };
        let value = f(key).await?;
        #[cfg(feature = "failpoints")]
        fail::fail_point!("step::before_commit");
        if let (Some(snap), Mode::Task(link)) = (self.snapshot(), &self.inner.mode) {
            let json = serde_json::to_value(&value).map_err(|e| {
                ToolError::runtime_caused(
                    format!("the value of step `{name}` does not serialize"),
                    e,
                )
            })?;
            // Over a limit, the tool gets an error it can return (the task then fails).
            link.limits
                .check_step(&snap.journal, name, &json)
                .map_err(ToolError::Rpc)?;
            self.record(Event::StepCompleted {
                name: name.to_owned(),
                value: json,
            })
            .await?;
        }
        Ok(value)
    }

    /// Asks the client for input under `key` and waits for the answer (the task is
    /// `input_required` meanwhile). Keys are unique over the task's lifetime; after a restart
    /// an answered key returns its recorded answer at once.
    pub async fn input(&self, key: &str, request: InputRequest) -> Result<Value, ToolError> {
        self.input_with_status(key, request, None).await
    }

    /// [`Self::input`], setting the task's `statusMessage` in the same transition when the
    /// request is issued.
    pub(crate) async fn input_with_status(
        &self,
        key: &str,
        request: InputRequest,
        status_message: Option<String>,
    ) -> Result<Value, ToolError> {
        let mut answers = self
            .ask(BTreeMap::from([(key.to_owned(), request)]), status_message)
            .await?;
        answers
            .remove(key)
            .ok_or_else(|| ToolError::runtime(format!("no answer for `{key}`")))
    }

    /// A typed form elicitation under `key`: the `requestedSchema` is derived from `T` (see
    /// [`super::elicitation_schema_for`]), the answer comes back as `T`, or as the user's
    /// decline or cancel. Durable like [`ToolContext::input`]: a task waits in
    /// `input_required`, and after a restart an answered key returns its answer at once. An
    /// accepted answer that does not fit `T` is `-32602` naming the key.
    pub async fn elicit<T>(
        &self,
        key: &str,
        message: impl Into<String>,
    ) -> Result<super::Elicited<T>, ToolError>
    where
        T: schemars::JsonSchema + DeserializeOwned,
    {
        let request = InputRequest::elicit_form(message, super::elicitation_schema_for::<T>());
        let answer = ElicitResponse::from_json(&self.input(key, request).await?);
        Ok(match answer.action {
            ElicitAction::Accept => super::Elicited::Accepted(super::typed::from_validated(
                &format!("the answer to `{key}` does not fit its requested schema"),
                Value::Object(answer.content),
            )?),
            ElicitAction::Decline => super::Elicited::Declined,
            ElicitAction::Cancel => super::Elicited::Cancelled,
        })
    }

    /// Asks for several inputs at once; returns when every key is answered. A partial answer
    /// keeps the task `input_required`.
    pub async fn inputs(
        &self,
        requests: BTreeMap<String, InputRequest>,
    ) -> Result<BTreeMap<String, Value>, ToolError> {
        self.ask(requests, None).await
    }

    async fn ask(
        &self,
        requests: BTreeMap<String, InputRequest>,
        status_message: Option<String>,
    ) -> Result<BTreeMap<String, Value>, ToolError> {
        let link = match &self.inner.mode {
            Mode::Task(link) => link,
            Mode::Inline(inputs) => return self.inline_inputs(inputs, requests),
        };
        let keys: Vec<String> = requests.keys().cloned().collect();
        let snap = link.snapshots.borrow().clone();
        let all_answered = keys.iter().all(|k| snap.answers.contains_key(k));
        if !all_answered && (snap.cancel_requested || snap.status.is_terminal()) {
            return Err(ToolError::Cancelled);
        }
        let fresh: BTreeMap<String, Value> = requests
            .into_iter()
            .filter(|(k, _)| !snap.issued_keys.contains(k))
            .map(|(k, r)| (k, r.into_json()))
            .collect();
        if let Some(k) = keys.iter().find(|k| {
            snap.issued_keys.contains(*k)
                && !snap.answers.contains_key(*k)
                && !snap.pending_inputs.contains_key(*k)
        }) {
            return Err(ToolError::runtime(format!(
                "input key `{k}` was superseded and cannot be asked again"
            )));
        }
        if !fresh.is_empty() {
            self.record(Event::RequestInputs {
                requests: fresh,
                status_message,
            })
            .await?;
        }
        let mut rx = link.snapshots.clone();
        let done = rx
            .wait_for(|r| {
                keys.iter().all(|k| r.answers.contains_key(k))
                    || r.status.is_terminal()
                    || r.cancel_requested
            })
            .await
            .map_err(|_| ToolError::runtime("the task actor stopped"))?
            .clone();
        if keys.iter().all(|k| done.answers.contains_key(k)) {
            Ok(keys
                .into_iter()
                .filter_map(|k| done.answers.get(&k).map(|v| (k, v.clone())))
                .collect())
        } else {
            Err(ToolError::Cancelled)
        }
    }

    /// One round of core MRTR: answered keys return their answers; if any key is unanswered
    /// the call ends with `input_required` for the missing ones. A request the client has no
    /// capability for is `-32021` naming that capability.
    fn inline_inputs(
        &self,
        inputs: &InlineInputs,
        requests: BTreeMap<String, InputRequest>,
    ) -> Result<BTreeMap<String, Value>, ToolError> {
        let mut answers = BTreeMap::new();
        let mut missing = BTreeMap::new();
        for (key, request) in requests {
            let request = request.into_json();
            if let Some(cap) = capability_for(&request)
                && !self
                    .inner
                    .client_capabilities
                    .get()
                    .get(cap)
                    .is_some_and(Value::is_object)
            {
                return Err(ToolError::Rpc(
                    crate::wire::error::RpcError::missing_capability(
                        json!({ cap: {} }),
                        format!("input `{key}` needs the client capability `{cap}`"),
                    ),
                ));
            }
            match inputs.responses.get(&key) {
                Some(answer) if answer.is_object() => {
                    answers.insert(key, answer.clone());
                }
                _ => {
                    missing.insert(key, request);
                }
            }
        }
        inputs
            .consumed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(answers.iter().map(|(k, v)| (k.clone(), v.clone())));
        if missing.is_empty() {
            Ok(answers)
        } else {
            Err(ToolError::InputRequired(missing))
        }
    }

    /// Sets the task's `statusMessage` (committed before this returns).
    pub async fn set_status(&self, message: impl Into<String>) -> Result<(), ToolError> {
        self.record(Event::StatusMessage(Some(message.into())))
            .await
    }

    /// Reports how far the call got (`progress` should grow with every report; `total` when
    /// known).
    ///
    /// - In a synchronous call whose request carried `_meta.progressToken`, the caller gets
    ///   `notifications/progress` on the response stream of that request (an SSE response
    ///   over HTTP) before the result. A report whose `progress` does not exceed the last one
    ///   is not sent (MCP requires increasing values); reports are dropped rather than queued
    ///   without bound when the caller reads slowly.
    /// - In a task, progress becomes the task's `statusMessage` (`message`, or
    ///   `"{progress}/{total}"`), committed before this returns, like [`Self::set_status`]:
    ///   the Tasks extension carries no progress notifications.
    /// - Otherwise nobody asked, and nothing happens.
    pub async fn progress(
        &self,
        progress: f64,
        total: Option<f64>,
        message: Option<&str>,
    ) -> Result<(), ToolError> {
        if !progress.is_finite() || total.is_some_and(|t| !t.is_finite()) {
            return Err(ToolError::runtime(format!(
                "progress must be a finite number (got {progress}, total {total:?})"
            )));
        }
        if let Mode::Task(_) = &self.inner.mode {
            let status = match (message, total) {
                (Some(m), _) => m.to_owned(),
                (None, Some(t)) => format!("{}/{}", figure(progress), figure(t)),
                (None, None) => figure(progress),
            };
            return self.set_status(status).await;
        }
        let Some((sink, token)) = self
            .inner
            .progress
            .as_ref()
            .and_then(|s| s.token.as_ref().map(|t| (s, t)))
        else {
            return Ok(());
        };
        {
            let mut last = sink.last.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|l| progress <= l) {
                tracing::debug!(progress, last = ?*last, "progress did not increase; not sent");
                return Ok(());
            }
            *last = Some(progress);
        }
        let notification =
            crate::wire::results::progress_notification(token, progress, total, message);
        if let Err(e) = sink.messages.try_send(notification) {
            tracing::debug!(error = %e, "progress notification dropped");
        }
        Ok(())
    }

    /// Sends a log message (`notifications/message`) about this call to the client.
    ///
    /// Only a synchronous call whose request asked for log messages
    /// (`_meta["io.modelcontextprotocol/logLevel"]`) at `level` or a less severe level gets
    /// it, on the response stream of that request. Tasks carry no log messages (the Tasks
    /// extension supports no request-scoped notifications on tasks); without a level nobody
    /// asked and nothing is sent. Like progress, messages are dropped rather than queued
    /// without bound when the caller reads slowly.
    pub fn log(&self, level: LogLevel, logger: Option<&str>, data: Value) {
        let Some(sink) = &self.inner.progress else {
            return;
        };
        match sink.log_level {
            Some(min) if level >= min => {}
            _ => return,
        }
        let notification = crate::wire::results::log_notification(level, logger, data);
        if let Err(e) = sink.messages.try_send(notification) {
            tracing::debug!(error = %e, "log notification dropped");
        }
    }

    /// Whether a client asked to cancel the task.
    pub fn is_cancelled(&self) -> bool {
        self.snapshot()
            .is_some_and(|s| s.cancel_requested || s.status == TaskStatus::Cancelled)
    }

    /// Resolves when a client asks to cancel the task (never, for a synchronous call).
    pub async fn cancelled(&self) {
        match &self.inner.mode {
            Mode::Task(link) => {
                let mut rx = link.snapshots.clone();
                if rx
                    .wait_for(|r| r.cancel_requested || r.status.is_terminal())
                    .await
                    .is_err()
                {
                    futures::future::pending::<()>().await;
                }
            }
            Mode::Inline(_) => futures::future::pending::<()>().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn a_synchronous_call_carries_values_to_its_next_round_within_a_bound() {
        let ctx = ToolContext::inline(Owner::anonymous(), json!({}));
        ctx.carry("round-1", json!({ "state": "s1" }))
            .await
            .unwrap();
        // Recorded once: a second value under the name changes nothing.
        ctx.carry("round-1", json!("other")).await.unwrap();
        assert_eq!(ctx.recorded("round-1"), Some(json!({ "state": "s1" })));
        assert_eq!(ctx.carried().len(), 1);
        let big = json!("x".repeat(MAX_CARRIED_BYTES));
        let refused = ctx.carry("round-2", big).await.unwrap_err();
        assert!(
            matches!(&refused, ToolError::Rpc(e) if e.message.contains("the limit is")),
            "{refused:?}"
        );
        assert_eq!(ctx.recorded("round-2"), None);
    }
}
