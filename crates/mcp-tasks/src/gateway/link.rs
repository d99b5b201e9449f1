//! A connection to an upstream, whatever its era and transport: the [`Link`] trait the
//! gateway's tools call through, the [`Hooks`] through which a call reaches its task (progress,
//! input, cancellation, the journal), and the loop that drives one call of a session-era
//! (`2025-11-25`) upstream, shared by stdio and HTTP.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use tokio::sync::{Notify, oneshot};

use super::error::UpstreamError;
use crate::tool::ToolError;
use crate::wire::error::RpcError;

/// The protocol revision the gateway speaks to session-era upstreams.
pub(crate) const SESSION_VERSION: &str = "2025-11-25";

/// Why a call of an upstream tool produced no result.
#[derive(Debug)]
pub(crate) enum CallError {
    /// The upstream failed (unreachable, silent, an error).
    Upstream(UpstreamError),
    /// The task did: cancelled, its input could not be asked, the runtime failed.
    Tool(ToolError),
}

impl From<UpstreamError> for CallError {
    fn from(e: UpstreamError) -> Self {
        Self::Upstream(e)
    }
}

impl From<ToolError> for CallError {
    fn from(e: ToolError) -> Self {
        Self::Tool(e)
    }
}

/// What a call may do to the task (or synchronous call) it runs in.
pub(crate) trait Hooks: Send + Sync {
    /// Whether the call runs in a durable task (input can be asked; upstream tasks followed).
    fn is_task(&self) -> bool;
    /// The upstream reported progress.
    fn progress<'a>(
        &'a self,
        progress: f64,
        total: Option<f64>,
        message: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), ToolError>>;
    /// Sets the task's `statusMessage` (an upstream task's own).
    fn status<'a>(&'a self, message: &'a str) -> BoxFuture<'a, Result<(), ToolError>>;
    /// Asks the task's client `request` (an `InputRequest`: `method` and `params`) under
    /// `key`, or under the next numbered key; resolves with the answer.
    fn input<'a>(
        &'a self,
        key: Option<&'a str>,
        request: Value,
    ) -> BoxFuture<'a, Result<Value, ToolError>>;
    /// Resolves when the task's client asks to cancel.
    fn cancelled(&self) -> BoxFuture<'_, ()>;
    /// The upstream task this call follows, recorded by an earlier run.
    fn upstream_task(&self) -> Option<String>;
    /// Records the upstream task this call follows (durably, before following it).
    fn remember_task<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ToolError>>;
    /// The value recorded under `name` by an earlier run (a task's journal) or round (a
    /// synchronous call's `requestState`); hooks without a journal have none.
    fn recorded(&self, name: &str) -> Option<Value> {
        let _ = name;
        None
    }
    /// Records `value` under `name` unless recorded already (see [`Self::recorded`]); hooks
    /// without a journal keep nothing.
    fn carry<'a>(&'a self, name: &'a str, value: Value) -> BoxFuture<'a, Result<(), ToolError>> {
        let _ = (name, value);
        Box::pin(async { Ok(()) })
    }
    /// [`Self::input`] under `key`, the task's `statusMessage` set to `status` when it is
    /// asked.
    fn input_with_status<'a>(
        &'a self,
        key: &'a str,
        request: Value,
        status: String,
    ) -> BoxFuture<'a, Result<Value, ToolError>> {
        let _ = status;
        self.input(Some(key), request)
    }
}

/// One call of an upstream tool.
pub(crate) struct CallSpec<'a> {
    /// The tool's name as the upstream lists it.
    pub(crate) name: &'a str,
    pub(crate) arguments: Map<String, Value>,
    pub(crate) hooks: &'a dyn Hooks,
    /// The tool's `execution.taskSupport` as the upstream listed it (`2025-11-25`:
    /// `forbidden`, `optional`, `required`), if it did.
    pub(crate) task_support: Option<String>,
    /// Whether the tool may run twice ([`super::upstream::UpstreamState::idempotent`]).
    pub(crate) repeatable: bool,
}

/// A connection to one upstream.
pub(crate) trait Link: Send + Sync + 'static {
    /// The upstream's `tools/list`, every page.
    fn list_tools(&self, limits: ListLimits) -> BoxFuture<'_, Result<Vec<Value>, UpstreamError>>;
    /// Calls a tool; resolves with its `CallToolResult`.
    fn call<'a>(&'a self, spec: CallSpec<'a>) -> BoxFuture<'a, Result<Value, CallError>>;
    /// Resolves when the connection is gone for good (a new one must be made).
    fn closed(&self) -> BoxFuture<'_, ()>;
    /// `2025-11-25` or `2026-07-28`, for the log.
    fn era(&self) -> &'static str;
}

/// Something a session-era upstream sent about one call.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// `notifications/progress` for the call's progress token.
    Progress {
        progress: f64,
        total: Option<f64>,
        message: Option<String>,
    },
    /// A request of the server (`elicitation/create`, `sampling/createMessage`,
    /// `roots/list`, `ping`) made while the call runs.
    Request {
        id: Value,
        method: String,
        params: Value,
    },
}

impl Inbound {
    /// Reads a progress notification's params.
    pub(crate) fn progress(params: &Value) -> Option<Self> {
        Some(Self::Progress {
            progress: params.get("progress")?.as_f64()?,
            total: params.get("total").and_then(Value::as_f64),
            message: params
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_owned),
        })
    }
}

/// Most requests of an upstream queued for one call while it handles another (or waits for
/// its client's answer to one); more are refused.
pub(crate) const MAX_QUEUED_REQUESTS: usize = 16;

/// At most one progress report of a call reaches its task per this interval (each is a commit
/// of the task); the latest report wins.
pub(crate) const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);

/// The progress of one call on its way to the task, coalesced: a report is relayed at once when
/// none was in the last [`PROGRESS_INTERVAL`], else held (the latest wins) until
/// [`Self::due`], when [`Self::flush`] relays it. A call that stops polling (it waits for its
/// client's answer) relays nothing meanwhile.
pub(crate) struct ProgressGate {
    held: Option<(f64, Option<f64>, Option<String>)>,
    next: tokio::time::Instant,
}

impl ProgressGate {
    pub(crate) fn new() -> Self {
        Self {
            held: None,
            next: tokio::time::Instant::now(),
        }
    }

    /// Whether a report is held back.
    pub(crate) fn holds(&self) -> bool {
        self.held.is_some()
    }

    /// When a held report may be relayed.
    pub(crate) fn due(&self) -> tokio::time::Instant {
        self.next
    }

    /// A report of the upstream: relayed now, or held.
    pub(crate) async fn offer(
        &mut self,
        hooks: &dyn Hooks,
        progress: f64,
        total: Option<f64>,
        message: Option<String>,
    ) -> Result<(), ToolError> {
        if self.held.is_none() && tokio::time::Instant::now() >= self.next {
            self.relay(hooks, progress, total, message).await
        } else {
            self.held = Some((progress, total, message));
            Ok(())
        }
    }

    /// Relays the held report, if any.
    pub(crate) async fn flush(&mut self, hooks: &dyn Hooks) -> Result<(), ToolError> {
        match self.held.take() {
            Some((progress, total, message)) => self.relay(hooks, progress, total, message).await,
            None => Ok(()),
        }
    }

    async fn relay(
        &mut self,
        hooks: &dyn Hooks,
        progress: f64,
        total: Option<f64>,
        message: Option<String>,
    ) -> Result<(), ToolError> {
        hooks.progress(progress, total, message.as_deref()).await?;
        self.next = tokio::time::Instant::now() + PROGRESS_INTERVAL;
        Ok(())
    }
}

/// What an upstream sent about one call and the call has not taken yet: the latest progress
/// (a newer one replaces it) and at most [`MAX_QUEUED_REQUESTS`] requests.
#[derive(Default)]
struct Queue {
    progress: Option<Inbound>,
    requests: VecDeque<Inbound>,
    /// The call ended: nothing more is taken.
    ended: bool,
}

#[derive(Default)]
struct InboxShared {
    queue: Mutex<Queue>,
    ready: Notify,
}

/// Where the transport puts what an upstream sent about one call ([`inbound`]).
#[derive(Clone)]
pub(crate) struct InboundTx(Arc<InboxShared>);

/// Where the call takes it from ([`inbound`]).
pub(crate) struct InboundRx(Arc<InboxShared>);

/// Why an upstream's request for a call was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The call ended.
    Ended,
    /// [`MAX_QUEUED_REQUESTS`] of its requests wait already.
    Full,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ended => f.write_str("the call it belongs to has ended"),
            Self::Full => write!(f, "{MAX_QUEUED_REQUESTS} requests of the call wait already"),
        }
    }
}

/// A bounded queue of one call's [`Inbound`] messages: progress collapsed to the latest,
/// requests up to [`MAX_QUEUED_REQUESTS`]. Whatever an upstream floods, a call holds a
/// bounded amount of it.
pub(crate) fn inbound() -> (InboundTx, InboundRx) {
    let shared = Arc::new(InboxShared::default());
    (InboundTx(shared.clone()), InboundRx(shared))
}

fn lock_queue(shared: &InboxShared) -> std::sync::MutexGuard<'_, Queue> {
    shared.queue.lock().unwrap_or_else(|e| e.into_inner())
}

impl InboundTx {
    /// Queues `event`: a progress report replaces the one not taken yet; a request is
    /// refused when the call ended or is full.
    pub(crate) fn send(&self, event: Inbound) -> Result<(), Refused> {
        {
            let mut queue = lock_queue(&self.0);
            if queue.ended {
                return Err(Refused::Ended);
            }
            match event {
                p @ Inbound::Progress { .. } => queue.progress = Some(p),
                r @ Inbound::Request { .. } => {
                    if queue.requests.len() >= MAX_QUEUED_REQUESTS {
                        return Err(Refused::Full);
                    }
                    queue.requests.push_back(r);
                }
            }
        }
        self.0.ready.notify_one();
        Ok(())
    }
}

impl InboundRx {
    /// The next message: a queued request first, else the latest progress; waits for one.
    pub(crate) async fn recv(&mut self) -> Inbound {
        loop {
            let ready = self.0.ready.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            {
                let mut queue = lock_queue(&self.0);
                if let Some(request) = queue.requests.pop_front() {
                    return request;
                }
                if let Some(progress) = queue.progress.take() {
                    return progress;
                }
            }
            ready.await;
        }
    }
}

impl Drop for InboundRx {
    fn drop(&mut self) {
        let mut queue = lock_queue(&self.0);
        queue.ended = true;
        queue.requests.clear();
        queue.progress = None;
    }
}

/// How a session-era call answers the upstream's requests and tells it of a cancellation.
pub(crate) trait Reply: Send + Sync {
    /// Sends one JSON-RPC message (a response or a notification) to the upstream.
    fn send(&self, message: Value) -> BoxFuture<'_, Result<(), UpstreamError>>;
}

/// A JSON-RPC error object of the upstream (a response's, or a failed task's) as
/// [`UpstreamError::Rpc`].
pub(crate) fn rpc_error(upstream: &str, error: &Value) -> UpstreamError {
    UpstreamError::Rpc {
        upstream: upstream.to_owned(),
        code: error
            .get("code")
            .and_then(Value::as_i64)
            .unwrap_or(crate::wire::error::code::INTERNAL_ERROR),
        message: error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("(no message)")
            .to_owned(),
        data: error.get("data").cloned().map(Box::new),
    }
}

/// The result of a JSON-RPC response message, or its error as [`UpstreamError::Rpc`].
pub(crate) fn decode(upstream: &str, response: Value) -> Result<Value, UpstreamError> {
    if let Some(error) = response.get("error") {
        return Err(rpc_error(upstream, error));
    }
    match response.get("result") {
        Some(r @ Value::Object(_)) => Ok(r.clone()),
        _ => Err(UpstreamError::Protocol {
            upstream: upstream.to_owned(),
            reason: "a response without a result object".into(),
        }),
    }
}

/// Drives one session-era call until its response: relays progress and the upstream's
/// requests to the task, sends `notifications/cancelled` when the task is cancelled or the
/// upstream stays silent past `timeout` (time spent waiting for the client does not count).
///
/// Progress is coalesced: at most one report per [`PROGRESS_INTERVAL`] reaches the task (the
/// latest; one held back is relayed when the interval is over), and none while the task
/// waits for its client's answer (the latest is relayed after it).
pub(crate) async fn drive(
    upstream: &str,
    reply: &dyn Reply,
    id: u64,
    response: oneshot::Receiver<Result<Value, UpstreamError>>,
    mut events: InboundRx,
    hooks: &dyn Hooks,
    timeout: Duration,
) -> Result<Value, CallError> {
    tokio::pin!(response);
    let silent = tokio::time::sleep(timeout);
    tokio::pin!(silent);
    let mut gate = ProgressGate::new();
    loop {
        tokio::select! {
            r = &mut response => {
                let message = r.map_err(|_| UpstreamError::Unreachable {
                    upstream: upstream.to_owned(),
                    reason: "the connection closed during the call".into(),
                })??;
                return Ok(decode(upstream, message)?);
            }
            () = tokio::time::sleep_until(gate.due()), if gate.holds() => {
                gate.flush(hooks).await?;
            }
            event = events.recv() => {
                match event {
                    Inbound::Progress { progress, total, message } => {
                        gate.offer(hooks, progress, total, message).await?;
                    }
                    Inbound::Request { id: request_id, method, params } => {
                        // The call's response is watched meanwhile: an upstream that goes
                        // away while the task waits for its client ends the call now, not
                        // when someone answers.
                        let answer = tokio::select! {
                            a = answer_request(upstream, hooks, &method, params) => a,
                            () = hooks.cancelled() => Err(Answer::Cancelled),
                            r = &mut response => return ended_while_asking(upstream, r),
                        };
                        let message = match answer {
                            Ok(result) => json!({ "jsonrpc": "2.0", "id": request_id, "result": result }),
                            Err(Answer::Refused(e)) => json!({ "jsonrpc": "2.0", "id": request_id, "error": e.to_json() }),
                            Err(Answer::Cancelled) => {
                                cancel(reply, id, "the task was cancelled").await;
                                return Err(CallError::Tool(ToolError::Cancelled));
                            }
                            Err(Answer::Failed(e)) => {
                                cancel(reply, id, "the gateway could not record the task's input").await;
                                return Err(CallError::Tool(e));
                            }
                        };
                        reply.send(message).await.map_err(after_sent)?;
                    }
                }
                silent.as_mut().reset(tokio::time::Instant::now() + timeout);
            }
            () = hooks.cancelled() => {
                cancel(reply, id, "the task was cancelled").await;
                return Err(CallError::Tool(ToolError::Cancelled));
            }
            () = &mut silent => {
                cancel(reply, id, "the gateway's timeout for this upstream passed").await;
                return Err(CallError::Upstream(UpstreamError::Timeout {
                    upstream: upstream.to_owned(),
                    seconds: timeout.as_secs_f64(),
                }));
            }
        }
    }
}

/// The call's end, come while one of the upstream's requests waited for the task's client:
/// its response (the upstream answered anyway), or the upstream gone.
fn ended_while_asking(
    upstream: &str,
    r: Result<Result<Value, UpstreamError>, oneshot::error::RecvError>,
) -> Result<Value, CallError> {
    let gone = |reason: &str| UpstreamError::Unreachable {
        upstream: upstream.to_owned(),
        reason: format!("it went away while the task waited for input ({reason})"),
    };
    match r {
        Ok(Ok(message)) => Ok(decode(upstream, message)?),
        Ok(Err(
            UpstreamError::Unreachable { reason, .. } | UpstreamError::NotSent { reason, .. },
        )) => Err(gone(&reason).into()),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(gone("the connection closed").into()),
    }
}

/// An error of a message sent during a call (its request went before it): the call may have
/// reached the upstream, whatever this message's fate.
fn after_sent(e: UpstreamError) -> UpstreamError {
    match e {
        UpstreamError::NotSent { upstream, reason } => {
            UpstreamError::Unreachable { upstream, reason }
        }
        other => other,
    }
}

/// Tells the upstream that the gateway gave up on request `id` (best effort: the call ends
/// either way).
async fn cancel(reply: &dyn Reply, id: u64, reason: &str) {
    let message = json!({
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": { "requestId": id, "reason": reason }
    });
    if let Err(e) = reply.send(message).await {
        tracing::debug!(error = %e, "could not send notifications/cancelled upstream");
    }
}

/// Why an upstream's request gets no result.
enum Answer {
    /// Refused with this error (the call goes on).
    Refused(RpcError),
    /// The task was cancelled meanwhile.
    Cancelled,
    /// The runtime failed to record the input request.
    Failed(ToolError),
}

/// The result for a request the upstream made during a call: `ping` at once; an input
/// request (`elicitation/create`, `sampling/createMessage`, `roots/list`) becomes the task's
/// input request and its answer the result; anything else is refused.
async fn answer_request(
    upstream: &str,
    hooks: &dyn Hooks,
    method: &str,
    mut params: Value,
) -> Result<Value, Answer> {
    match method {
        "ping" => Ok(json!({})),
        "elicitation/create" | "sampling/createMessage" | "roots/list" => {
            if !hooks.is_task() {
                return Err(Answer::Refused(RpcError::internal(format!(
                    "the gateway cannot relay `{method}` from upstream `{upstream}`: the client called this tool without the Tasks extension (call it as a task to answer input)"
                ))));
            }
            // 2025-11-25 allows a form elicitation without `mode`; 2026-07-28 wants it.
            if method == "elicitation/create"
                && let Some(p) = params.as_object_mut()
                && !p.contains_key("mode")
                && p.contains_key("requestedSchema")
            {
                p.insert("mode".into(), json!("form"));
            }
            let request = json!({ "method": method, "params": params });
            match hooks.input(None, request).await {
                Ok(answer) => Ok(answer),
                Err(ToolError::Cancelled) => Err(Answer::Cancelled),
                Err(ToolError::Rpc(e)) => Err(Answer::Refused(e)),
                Err(e) => Err(Answer::Failed(e)),
            }
        }
        other => Err(Answer::Refused(RpcError::method_not_found(other))),
    }
}

/// The `initialize` request the gateway sends a session-era upstream: it can answer
/// elicitation and sampling (relayed to the task's client); it declares no roots.
pub(crate) fn initialize_request(id: u64) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "initialize",
        "params": {
            "protocolVersion": SESSION_VERSION,
            "capabilities": { "elicitation": { "form": {} }, "sampling": {} },
            "clientInfo": { "name": "mcp-tasks-gateway", "version": env!("CARGO_PKG_VERSION") }
        }
    })
}

/// The `inputRequests` of an `input_required` result or task (none when absent).
pub(crate) fn input_requests(v: &Value) -> Map<String, Value> {
    v.get("inputRequests")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// Most pages of `tools/list` read from one upstream (a loop guard).
const MAX_PAGES: usize = 100;

/// The bounds of one upstream's tool list: its tools, and their bytes as JSON.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ListLimits {
    pub(crate) tools: usize,
    pub(crate) bytes: usize,
}

/// Counts the bytes written to it.
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every page of `tools/list`, each asked with `page(params)` (`{}`, then `{"cursor": …}`);
/// refused as soon as it passes `limits` (a page is read whole first: the transport bounds
/// its size).
pub(crate) async fn list_all<F, Fut>(
    upstream: &str,
    limits: ListLimits,
    page: F,
) -> Result<Vec<Value>, UpstreamError>
where
    F: Fn(Map<String, Value>) -> Fut,
    Fut: std::future::Future<Output = Result<Value, UpstreamError>>,
{
    let mut tools = Vec::new();
    let mut bytes = ByteCount(0);
    let mut params = Map::new();
    for _ in 0..MAX_PAGES {
        let mut result = page(params.clone()).await?;
        if let Some(Value::Array(listed)) = result.get_mut("tools").map(Value::take) {
            if tools.len() + listed.len() > limits.tools {
                return Err(UpstreamError::TooManyTools {
                    upstream: upstream.to_owned(),
                    reason: format!("more than {}", limits.tools),
                });
            }
            for tool in &listed {
                let _ = serde_json::to_writer(&mut bytes, tool);
            }
            if bytes.0 > limits.bytes {
                return Err(UpstreamError::TooManyTools {
                    upstream: upstream.to_owned(),
                    reason: format!("more than {} bytes", limits.bytes),
                });
            }
            tools.extend(listed);
        }
        match result.get("nextCursor").and_then(Value::as_str) {
            Some(cursor) => params.insert("cursor".into(), json!(cursor)),
            None => break,
        };
    }
    Ok(tools)
}

/// A session-era (`2025-11-25`) connection, as [`session_call`] uses it.
pub(crate) trait SessionDriver: Reply {
    /// Sends request `method` (with `_meta.progressToken`) and drives it to its response.
    fn drive<'a>(
        &'a self,
        method: &'a str,
        params: Value,
        hooks: &'a dyn Hooks,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Value, CallError>>;
    /// A plain request and its result.
    fn request<'a>(
        &'a self,
        method: &'a str,
        params: Value,
    ) -> BoxFuture<'a, Result<Value, UpstreamError>>;
    /// The upstream's name.
    fn upstream(&self) -> &str;
    /// Its silence bound.
    fn timeout(&self) -> Duration;
    /// Whether it runs `tools/call` as a task (its `initialize` said so).
    fn has_tasks(&self) -> bool;
}

/// Whether an `initialize` result declares the `2025-11-25` experimental tasks for
/// `tools/call` (`capabilities.tasks.requests.tools.call`).
pub(crate) fn runs_tools_as_tasks(initialize: &Value) -> bool {
    initialize
        .pointer("/capabilities/tasks/requests/tools/call")
        .is_some_and(Value::is_object)
}

/// The silence bound of `tasks/result`: none to speak of (the task runs upstream, durably or
/// not, as long as it takes; a lost connection still ends the wait).
const TASK_RESULT_IDLE: Duration = Duration::from_secs(30 * 24 * 3600);

/// A call of a session-era upstream: a plain `tools/call`, or — when the call runs in a task,
/// the upstream runs tool calls as tasks and the tool allows it — a task-augmented one
/// (`2025-11-25` experimental tasks): the upstream's task id recorded in the journal, then
/// `tasks/result` (which carries the task's input requests) until its result, its
/// `statusMessage` copied from `tasks/get` meanwhile, `tasks/cancel` on cancellation. A run
/// that finds the task id recorded asks `tasks/result` again instead of calling twice.
pub(crate) async fn session_call(
    driver: &dyn SessionDriver,
    spec: CallSpec<'_>,
) -> Result<Value, CallError> {
    let hooks = spec.hooks;
    let support = spec.task_support.as_deref();
    // A recorded upstream task is followed whatever the listing says now (after a restart
    // the tools may not be listed yet).
    let as_task = hooks.is_task()
        && (hooks.upstream_task().is_some()
            || driver.has_tasks() && matches!(support, Some("optional" | "required")));
    if !as_task {
        let params = json!({ "name": spec.name, "arguments": spec.arguments });
        return driver
            .drive("tools/call", params, hooks, driver.timeout())
            .await;
    }
    let task_id = match hooks.upstream_task() {
        Some(id) => {
            tracing::info!(upstream = driver.upstream(), task = ?id, "following the upstream task again");
            id
        }
        None => {
            let params = json!({ "name": spec.name, "arguments": spec.arguments, "task": {} });
            let created = driver
                .drive("tools/call", params, hooks, driver.timeout())
                .await?;
            let id = created
                .pointer("/task/taskId")
                .and_then(Value::as_str)
                .ok_or_else(|| UpstreamError::Protocol {
                    upstream: driver.upstream().to_owned(),
                    reason: "a task-augmented call answered without a task".into(),
                })?
                .to_owned();
            hooks.remember_task(&id).await?;
            tracing::info!(upstream = driver.upstream(), task = ?id, "the upstream runs the call as its task");
            id
        }
    };
    let result = driver.drive(
        "tasks/result",
        json!({ "taskId": task_id }),
        hooks,
        TASK_RESULT_IDLE,
    );
    let status = copy_status(driver, &task_id, hooks);
    let outcome = tokio::select! {
        r = result => r,
        () = status => unreachable_status(),
    };
    match outcome {
        Err(CallError::Tool(ToolError::Cancelled)) => {
            if let Err(e) = driver
                .request("tasks/cancel", json!({ "taskId": task_id }))
                .await
            {
                tracing::debug!(error = %e, "tasks/cancel upstream failed");
            }
            Err(CallError::Tool(ToolError::Cancelled))
        }
        Ok(mut result) => {
            if let Some(r) = result.as_object_mut() {
                r.remove("_meta");
            }
            Ok(result)
        }
        other => other,
    }
}

/// The status copier never ends; this marks the branch that cannot be taken.
fn unreachable_status() -> Result<Value, CallError> {
    Err(CallError::Tool(ToolError::runtime(
        "the status follower ended",
    )))
}

/// Copies the upstream task's `statusMessage` to ours, polling `tasks/get` at the task's
/// `pollInterval` (at least every 250 ms, at most every 30 s); never returns.
async fn copy_status(driver: &dyn SessionDriver, task_id: &str, hooks: &dyn Hooks) {
    let mut last: Option<String> = None;
    loop {
        let mut interval = Duration::from_secs(1);
        match driver
            .request("tasks/get", json!({ "taskId": task_id }))
            .await
        {
            Ok(task) => {
                let task = task.get("task").unwrap_or(&task).clone();
                if let Some(ms) = task.get("pollInterval").and_then(Value::as_u64) {
                    interval = Duration::from_millis(ms.clamp(250, 30_000));
                }
                let working = matches!(
                    task.get("status").and_then(Value::as_str),
                    Some("working" | "input_required")
                );
                if let Some(message) = task.get("statusMessage").and_then(Value::as_str)
                    && working
                    && last.as_deref() != Some(message)
                {
                    let _ = hooks.status(message).await;
                    last = Some(message.to_owned());
                }
            }
            Err(e) => tracing::debug!(error = %e, "tasks/get upstream failed"),
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    /// Hooks that count what reaches the task: progress reports (and any made while an
    /// input request waits for its answer), input requests.
    #[derive(Default)]
    struct Counting {
        progress: Mutex<Vec<f64>>,
        waiting: AtomicBool,
        during_wait: AtomicUsize,
        inputs: AtomicUsize,
        answer: Notify,
    }

    impl Hooks for Counting {
        fn is_task(&self) -> bool {
            true
        }
        fn progress<'a>(
            &'a self,
            progress: f64,
            _total: Option<f64>,
            _message: Option<&'a str>,
        ) -> BoxFuture<'a, Result<(), ToolError>> {
            if self.waiting.load(std::sync::atomic::Ordering::SeqCst) {
                self.during_wait
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            self.progress.lock().unwrap().push(progress);
            Box::pin(async { Ok(()) })
        }
        fn status<'a>(&'a self, _message: &'a str) -> BoxFuture<'a, Result<(), ToolError>> {
            Box::pin(async { Ok(()) })
        }
        fn input<'a>(
            &'a self,
            _key: Option<&'a str>,
            _request: Value,
        ) -> BoxFuture<'a, Result<Value, ToolError>> {
            Box::pin(async move {
                // The first input waits for the test's answer; the others are answered at once.
                if self
                    .inputs
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                    == 0
                {
                    self.waiting
                        .store(true, std::sync::atomic::Ordering::SeqCst);
                    self.answer.notified().await;
                    self.waiting
                        .store(false, std::sync::atomic::Ordering::SeqCst);
                }
                Ok(json!({ "action": "decline" }))
            })
        }
        fn cancelled(&self) -> BoxFuture<'_, ()> {
            Box::pin(futures::future::pending())
        }
        fn upstream_task(&self) -> Option<String> {
            None
        }
        fn remember_task<'a>(&'a self, _id: &'a str) -> BoxFuture<'a, Result<(), ToolError>> {
            Box::pin(async { Ok(()) })
        }
    }

    /// Counts the messages sent to the upstream.
    #[derive(Default)]
    struct Sent(AtomicUsize);

    impl Reply for Sent {
        fn send(&self, _message: Value) -> BoxFuture<'_, Result<(), UpstreamError>> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async { Ok(()) })
        }
    }

    fn progress(n: usize) -> Inbound {
        Inbound::Progress {
            progress: n as f64,
            total: None,
            message: Some("x".repeat(1024)),
        }
    }

    fn elicitation(id: usize) -> Inbound {
        Inbound::Request {
            id: json!(id),
            method: "elicitation/create".into(),
            params: json!({ "message": "?", "requestedSchema": { "type": "object" } }),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_progress_flood_reaches_the_task_at_most_every_interval() {
        let hooks = Counting::default();
        let sent = Sent::default();
        let (tx, rx) = inbound();
        let (done_tx, done) = oneshot::channel();
        // 1,000 reports in 1 s, then the response.
        tokio::spawn(async move {
            for n in 1..=1000 {
                tx.send(progress(n)).unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let _ = done_tx.send(Ok(json!({ "jsonrpc": "2.0", "id": 1, "result": {} })));
        });
        let result = drive("up", &sent, 1, done, rx, &hooks, Duration::from_secs(60)).await;
        assert!(result.is_ok(), "{result:?}");
        let reached = hooks.progress.lock().unwrap().clone();
        // 1 s / 250 ms: the first at once, then one per interval.
        assert!((2..=5).contains(&reached.len()), "{reached:?}");
        assert_eq!(reached[0], 1.0);
        assert!(reached.windows(2).all(|w| w[0] < w[1]), "{reached:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_reaches_the_task_while_it_waits_for_input_and_the_queue_is_bounded() {
        let hooks = Arc::new(Counting::default());
        let sent = Sent::default();
        let (tx, rx) = inbound();
        let (done_tx, done) = oneshot::channel();
        let flood = {
            let hooks = hooks.clone();
            tokio::spawn(async move {
                tx.send(elicitation(0)).unwrap();
                while !hooks.waiting.load(std::sync::atomic::Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                // While the task waits: 10,000 reports (10 MiB of messages) and 100 requests.
                let mut refused = 0;
                for n in 1..=10_000 {
                    tx.send(progress(n)).unwrap();
                    if n % 100 == 0 && tx.send(elicitation(n)) == Err(Refused::Full) {
                        refused += 1;
                    }
                    if n % 1000 == 0 {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                hooks.answer.notify_one();
                tokio::time::sleep(Duration::from_secs(1)).await;
                let _ = done_tx.send(Ok(json!({ "jsonrpc": "2.0", "id": 1, "result": {} })));
                (refused, tx)
            })
        };
        let result = drive("up", &sent, 1, done, rx, &*hooks, Duration::from_secs(60)).await;
        assert!(result.is_ok(), "{result:?}");
        let (refused, tx) = flood.await.unwrap();
        assert_eq!(
            refused,
            100 - MAX_QUEUED_REQUESTS,
            "the queue holds 16 requests"
        );
        assert_eq!(
            hooks.inputs.load(std::sync::atomic::Ordering::SeqCst),
            1 + MAX_QUEUED_REQUESTS
        );
        assert_eq!(
            hooks.during_wait.load(std::sync::atomic::Ordering::SeqCst),
            0
        );
        // After the answer: the latest report, once.
        assert_eq!(*hooks.progress.lock().unwrap(), [10_000.0]);
        // Every request answered upstream (the first and the 16 queued).
        assert_eq!(
            sent.0.load(std::sync::atomic::Ordering::SeqCst),
            1 + MAX_QUEUED_REQUESTS
        );
        // The call ended: its queue takes nothing more.
        assert_eq!(tx.send(elicitation(1)), Err(Refused::Ended));
    }

    /// Sends nothing anywhere.
    struct NoReply;

    impl Reply for NoReply {
        fn send(&self, _message: Value) -> BoxFuture<'_, Result<(), UpstreamError>> {
            Box::pin(async { Ok(()) })
        }
    }

    /// A task whose client never answers and never cancels.
    struct NobodyAnswers;

    impl Hooks for NobodyAnswers {
        fn is_task(&self) -> bool {
            true
        }
        fn progress<'a>(
            &'a self,
            _progress: f64,
            _total: Option<f64>,
            _message: Option<&'a str>,
        ) -> BoxFuture<'a, Result<(), ToolError>> {
            Box::pin(async { Ok(()) })
        }
        fn status<'a>(&'a self, _message: &'a str) -> BoxFuture<'a, Result<(), ToolError>> {
            Box::pin(async { Ok(()) })
        }
        fn input<'a>(
            &'a self,
            _key: Option<&'a str>,
            _request: Value,
        ) -> BoxFuture<'a, Result<Value, ToolError>> {
            Box::pin(futures::future::pending())
        }
        fn cancelled(&self) -> BoxFuture<'_, ()> {
            Box::pin(futures::future::pending())
        }
        fn upstream_task(&self) -> Option<String> {
            None
        }
        fn remember_task<'a>(&'a self, _id: &'a str) -> BoxFuture<'a, Result<(), ToolError>> {
            Box::pin(async { Ok(()) })
        }
    }

    /// `drive` of a call that asks for input, its response coming `after` as `response`.
    async fn asking(
        after: Duration,
        response: Result<Value, UpstreamError>,
    ) -> Result<Value, CallError> {
        let (tx, rx) = oneshot::channel();
        let (events_tx, events) = inbound();
        assert!(
            events_tx
                .send(Inbound::Request {
                    id: json!("e1"),
                    method: "elicitation/create".into(),
                    params: json!({ "message": "Your name?", "requestedSchema": { "type": "object" } }),
                })
                .is_ok()
        );
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let _ = tx.send(response);
        });
        // A silence bound far beyond the test: only the response can end it.
        let silent = Duration::from_secs(24 * 3600);
        drive("up", &NoReply, 1, rx, events, &NobodyAnswers, silent).await
    }

    #[tokio::test(start_paused = true)]
    async fn an_upstream_gone_while_the_task_waits_for_input_ends_the_call_then() {
        let started = tokio::time::Instant::now();
        let gone = UpstreamError::Unreachable {
            upstream: "up".into(),
            reason: "its process exited".into(),
        };
        let e = asking(Duration::from_secs(60), Err(gone))
            .await
            .unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(60), "when it broke");
        let CallError::Upstream(e) = e else {
            panic!("{e:?}")
        };
        assert!(matches!(e, UpstreamError::Unreachable { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "upstream `up` is unreachable: it went away while the task waited for input (its process exited)"
        );
        // A response channel dropped without a word says the same.
        let (tx, rx) = oneshot::channel::<Result<Value, UpstreamError>>();
        drop(tx);
        let e = ended_while_asking("up", rx.await).unwrap_err();
        assert!(format!("{e:?}").contains("went away while the task waited for input"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_upstream_that_answers_while_the_task_waits_for_input_ends_the_call_with_it() {
        let answer = json!({ "jsonrpc": "2.0", "id": 1, "result": { "content": [] } });
        let result = asking(Duration::from_secs(5), Ok(answer)).await.unwrap();
        assert_eq!(result, json!({ "content": [] }));
    }

    #[tokio::test]
    async fn an_endless_tool_list_stops_at_its_bounds() {
        // Every page has 5,000 tools and a next cursor: refused at the third page.
        let pages = std::sync::atomic::AtomicUsize::new(0);
        let page = |_params: Map<String, Value>| {
            pages.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tools: Vec<Value> = (0..5_000)
                .map(|i| json!({ "name": format!("t{i}") }))
                .collect();
            async move { Ok(json!({ "tools": tools, "nextCursor": "more" })) }
        };
        let limits = ListLimits {
            tools: 10_000,
            bytes: 16 << 20,
        };
        let e = list_all("up", limits, page).await.unwrap_err();
        assert!(matches!(e, UpstreamError::TooManyTools { .. }), "{e}");
        assert_eq!(pages.load(std::sync::atomic::Ordering::Relaxed), 3);
        // The bytes bound: about 15 bytes a tool.
        let pages = std::sync::atomic::AtomicUsize::new(0);
        let page = |_params: Map<String, Value>| {
            pages.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tools: Vec<Value> = (0..100)
                .map(|i| json!({ "name": format!("t{i}") }))
                .collect();
            async move { Ok(json!({ "tools": tools, "nextCursor": "more" })) }
        };
        let limits = ListLimits {
            tools: 10_000,
            bytes: 4096,
        };
        let e = list_all("up", limits, page).await.unwrap_err();
        assert!(e.to_string().contains("more than 4096 bytes"), "{e}");
        assert!(pages.load(std::sync::atomic::Ordering::Relaxed) <= 4);
    }
}
