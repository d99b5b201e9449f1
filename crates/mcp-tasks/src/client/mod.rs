//! An MCP `2026-07-28` client for servers with the Tasks extension (`io.modelcontextprotocol/tasks`):
//! ours or anyone's.
//!
//! ```no_run
//! # async fn demo() -> Result<(), mcp_tasks::client::ClientError> {
//! use mcp_tasks::client::{CallOutcome, Client};
//! use serde_json::json;
//!
//! let client = Client::http("http://127.0.0.1:8080/mcp")?.build().await?;
//! match client.call_tool("generate_report", json!({ "size": "small" })).await? {
//!     CallOutcome::Complete(result) => println!("{result}"),
//!     CallOutcome::Task(task) => {
//!         let done = task.wait().await?; // polls, honouring `pollIntervalMs`
//!         println!("{:?}: {:?}", done.status, done.result);
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! - Transports: Streamable HTTP ([`HttpTransport`], with an optional bearer token) or a
//!   [`crate::RuntimeHandle`] in the same process ([`InProcessTransport`]); any other through
//!   the [`Transport`] trait.
//! - [`Client::call_tool`] answers core MRTR rounds (`input_required`) with the
//!   [`InputHandler`] and returns the complete result or a [`TaskHandle`].
//! - [`TaskHandle::wait`] polls until the task is terminal and answers its `inputRequests`
//!   through the input handler, each key once; [`TaskHandle::watch`] follows the task over
//!   `subscriptions/listen`, reconnecting after a dropped stream, or by polling when the
//!   server does not acknowledge the task.
//! - Read-only and idempotent calls (`server/discover`, `tools/list`, `tasks/get`,
//!   `tasks/update`, `tasks/cancel`) are retried with exponential backoff after transport
//!   errors; `tools/call` never is (it may create a task).
//! - [`ClientBuilder::handle_store`] keeps the tasks the client created in a small redb file:
//!   a restarted client lists them ([`Client::saved_tasks`]) and resumes them
//!   ([`Client::resume`]).
//!
//! Server quirks the client tolerates: a missing `resultType` on results is read as
//! `"complete"`; missing optional task fields (`statusMessage`, `pollIntervalMs`, `ttlMs`,
//! timestamps) are `None`/empty; a server without `subscriptions/listen` (`-32601`) or one
//! that does not acknowledge a task id is polled instead.

mod error;
mod store;
pub(crate) mod transport;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::{BoxStream, Stream};
use serde_json::{Map, Value, json};

pub use error::ClientError;
pub use store::{HandleStore, SavedTask};
pub use transport::{HttpTransport, InProcessTransport, Response, Transport};

use crate::runtime::RuntimeHandle;
use crate::task::{Owner, TaskStatus};
use crate::wire::error::RpcError;
use crate::wire::{PROTOCOL_VERSION, TASKS_EXTENSION, keys, methods};

/// The poll interval used when a task does not suggest one.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Poll intervals a server suggests are clamped to this range.
const POLL_RANGE: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(60));
/// Core MRTR rounds of one `tools/call` before the client gives up.
const MAX_MRTR_ROUNDS: usize = 16;
/// `tools/list` pages before the client gives up.
const MAX_PAGES: usize = 1000;

// ---------------------------------------------------------------------------------------------
// Tasks and tools as the client sees them

/// A task as `tasks/get` or `notifications/tasks` reported it (a `DetailedTask`).
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// The task's id.
    pub task_id: String,
    /// Its status.
    pub status: TaskStatus,
    /// Its `statusMessage`.
    pub status_message: Option<String>,
    /// ISO 8601, as the server sent it (empty when it omitted it).
    pub created_at: String,
    /// ISO 8601, as the server sent it (empty when it omitted it).
    pub last_updated_at: String,
    /// `None`: unlimited (or not given).
    pub ttl_ms: Option<u64>,
    /// The polling interval the server suggests.
    pub poll_interval_ms: Option<u64>,
    /// Outstanding input requests (`input_required`), key → `{method, params}`.
    pub input_requests: Map<String, Value>,
    /// The `CallToolResult` of a `completed` task.
    pub result: Option<Value>,
    /// The JSON-RPC error of a `failed` task.
    pub error: Option<RpcError>,
    /// The task object as received, without `_meta` and `resultType`.
    pub raw: Value,
}

impl Task {
    /// Reads a task object (`CreateTaskResult`, `GetTaskResult` or the params of
    /// `notifications/tasks`).
    pub fn from_value(value: &Value) -> Result<Self, ClientError> {
        let obj = value
            .as_object()
            .ok_or_else(|| ClientError::Protocol(format!("a task must be an object: {value}")))?;
        let str_of = |k: &str| obj.get(k).and_then(Value::as_str).map(str::to_owned);
        let task_id = str_of("taskId")
            .ok_or_else(|| ClientError::Protocol(format!("a task without `taskId`: {value}")))?;
        let status_text = str_of("status")
            .ok_or_else(|| ClientError::Protocol(format!("task {task_id} has no `status`")))?;
        let status = TaskStatus::from_wire(&status_text).ok_or_else(|| {
            ClientError::Protocol(format!(
                "task {task_id} has an unknown status `{status_text}`"
            ))
        })?;
        let error = obj.get("error").and_then(|e| {
            Some(RpcError {
                code: e.get("code")?.as_i64()?,
                message: e
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                data: e.get("data").cloned(),
            })
        });
        let mut raw = obj.clone();
        raw.remove("_meta");
        raw.remove("resultType");
        Ok(Self {
            status,
            status_message: str_of("statusMessage"),
            created_at: str_of("createdAt").unwrap_or_default(),
            last_updated_at: str_of("lastUpdatedAt").unwrap_or_default(),
            ttl_ms: obj.get("ttlMs").and_then(Value::as_u64),
            poll_interval_ms: obj.get("pollIntervalMs").and_then(Value::as_u64),
            input_requests: obj
                .get("inputRequests")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            result: obj.get("result").cloned(),
            error,
            raw: Value::Object(raw),
            task_id,
        })
    }

    /// Whether the task ended (`completed`, `failed` or `cancelled`).
    pub fn is_terminal(&self) -> bool {
        self.status.is_terminal()
    }

    /// The poll interval the server suggests, clamped to a sane range.
    pub fn poll_interval(&self) -> Duration {
        self.poll_interval_ms
            .map(Duration::from_millis)
            .unwrap_or(DEFAULT_POLL_INTERVAL)
            .clamp(POLL_RANGE.0, POLL_RANGE.1)
    }

    /// Whether `self` is a newer observation than `older` (a terminal state is never
    /// followed by another; an earlier `lastUpdatedAt` is stale).
    fn supersedes(&self, older: &Task) -> bool {
        if older.is_terminal() || self.raw == older.raw {
            return false;
        }
        match (
            timestamp(&self.last_updated_at),
            timestamp(&older.last_updated_at),
        ) {
            (Some(new), Some(old)) => new >= old || self.is_terminal(),
            _ => true,
        }
    }
}

fn timestamp(s: &str) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()
}

/// A tool as `tools/list` describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolInfo {
    /// The tool's name.
    pub name: String,
    /// Its title.
    pub title: Option<String>,
    /// Its description.
    pub description: Option<String>,
    /// Its `inputSchema`.
    pub input_schema: Value,
    /// The tool object as received.
    pub raw: Value,
}

/// What `server/discover` said.
#[derive(Debug, Clone, PartialEq)]
pub struct Discovery {
    /// The protocol versions the server supports.
    pub supported_versions: Vec<String>,
    /// The server's capabilities.
    pub capabilities: Value,
    /// The server's instructions.
    pub instructions: Option<String>,
    /// `_meta["io.modelcontextprotocol/serverInfo"]`, when given.
    pub server_info: Option<Value>,
    /// The result as received.
    pub raw: Value,
}

impl Discovery {
    /// Whether the server advertises the Tasks extension.
    pub fn supports_tasks(&self) -> bool {
        self.capabilities
            .get("extensions")
            .and_then(|e| e.get(TASKS_EXTENSION))
            .is_some()
    }
}

/// The answer to [`Client::call_tool`].
#[derive(Debug)]
pub enum CallOutcome {
    /// The tool answered at once: its `CallToolResult`.
    Complete(Value),
    /// The server made a task of the call.
    Task(TaskHandle),
}

// ---------------------------------------------------------------------------------------------
// Input handler

/// Answers the input requests of tools (elicitation, sampling, roots): core MRTR rounds of
/// `tools/call` and a task's `inputRequests` in [`TaskHandle::wait`].
pub trait InputHandler: Send + Sync + 'static {
    /// Answers one request `{method, params}` (`elicitation/create`,
    /// `sampling/createMessage`, `roots/list`, …) asked under `key`: the `InputResponse`
    /// (e.g. `{"action":"accept","content":{…}}`), or `None` to leave it unanswered.
    fn answer<'a>(&'a self, key: &'a str, request: &'a Value) -> BoxFuture<'a, Option<Value>>;

    /// The client capabilities this handler can serve; declared in every request
    /// (default: elicitation, sampling and roots).
    fn capabilities(&self) -> Value {
        json!({ "elicitation": {}, "sampling": {}, "roots": {} })
    }
}

/// An [`InputHandler`] from a closure `(key, request) -> future of Option<response>`.
pub fn input_handler<F, Fut>(f: F) -> Arc<dyn InputHandler>
where
    F: Fn(String, Value) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Option<Value>> + Send + 'static,
{
    struct FnHandler<F>(F);
    impl<F, Fut> InputHandler for FnHandler<F>
    where
        F: Fn(String, Value) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Option<Value>> + Send + 'static,
    {
        fn answer<'a>(&'a self, key: &'a str, request: &'a Value) -> BoxFuture<'a, Option<Value>> {
            Box::pin((self.0)(key.to_owned(), request.clone()))
        }
    }
    Arc::new(FnHandler(f))
}

// ---------------------------------------------------------------------------------------------
// Retries

/// Retries of idempotent calls after transport errors: `attempts` tries in all, waiting
/// `initial`, then twice as long each time up to `max` (with ±25 % jitter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries in all (the first included).
    pub attempts: u32,
    /// The first wait.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 6,
            initial: Duration::from_millis(200),
            max: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// No retries.
    pub fn none() -> Self {
        Self {
            attempts: 1,
            ..Self::default()
        }
    }

    fn delay(&self, retry: u32) -> Duration {
        let base = self
            .initial
            .saturating_mul(2u32.saturating_pow(retry.min(16)))
            .min(self.max);
        let mut byte = [0u8; 1];
        let jitter = if getrandom::fill(&mut byte).is_ok() {
            f64::from(byte[0]) / 255.0 * 0.5 + 0.75
        } else {
            1.0
        };
        base.mul_f64(jitter)
    }
}

fn idempotent(method: &str) -> bool {
    matches!(
        method,
        methods::DISCOVER
            | methods::TOOLS_LIST
            | methods::PROMPTS_LIST
            | methods::RESOURCES_LIST
            | methods::RESOURCES_TEMPLATES_LIST
            | methods::TASKS_GET
            // The server ignores keys that are not outstanding, so a repeated update is a
            // no-op; a repeated cancel is acknowledged like the first.
            | methods::TASKS_UPDATE
            | methods::TASKS_CANCEL
    )
}

// ---------------------------------------------------------------------------------------------
// Client

enum Target {
    Http {
        url: String,
        token: Option<String>,
        idle: Option<Duration>,
    },
    Custom(Arc<dyn Transport>),
}

/// Configures a [`Client`].
pub struct ClientBuilder {
    target: Target,
    handler: Option<Arc<dyn InputHandler>>,
    capabilities: Option<Value>,
    client_info: Value,
    retry: RetryPolicy,
    timeout: Duration,
    store: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let endpoint = match &self.target {
            Target::Http { url, .. } => url.clone(),
            Target::Custom(t) => t.endpoint(),
        };
        f.debug_struct("ClientBuilder")
            .field("endpoint", &endpoint)
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    fn new(target: Target) -> Self {
        Self {
            target,
            handler: None,
            capabilities: None,
            client_info: json!({ "name": "mcp-tasks-client", "version": env!("CARGO_PKG_VERSION") }),
            retry: RetryPolicy::default(),
            timeout: Duration::from_secs(30),
            store: None,
        }
    }

    /// Sends `Authorization: Bearer <token>` (HTTP only).
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        if let Target::Http { token: t, .. } = &mut self.target {
            *t = Some(token.into());
        }
        self
    }

    /// How long an SSE stream may stay silent before it counts as dropped (HTTP only;
    /// default 90 s).
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        if let Target::Http { idle, .. } = &mut self.target {
            *idle = Some(timeout);
        }
        self
    }

    /// Answers input requests (MRTR rounds, and task `inputRequests` in
    /// [`TaskHandle::wait`]).
    pub fn input_handler(mut self, handler: Arc<dyn InputHandler>) -> Self {
        self.handler = Some(handler);
        self
    }

    /// The client capabilities declared on every request, replacing the default (the Tasks
    /// extension plus what the input handler serves). The Tasks extension is always added.
    pub fn capabilities(mut self, capabilities: Value) -> Self {
        self.capabilities = Some(capabilities);
        self
    }

    /// `_meta["io.modelcontextprotocol/clientInfo"]`.
    pub fn client_info(mut self, name: impl Into<String>, version: impl Into<String>) -> Self {
        self.client_info = json!({ "name": name.into(), "version": version.into() });
        self
    }

    /// Retries of idempotent calls after transport errors.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The longest a request may take (default 30 s); listen streams are not bounded.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Keeps the tasks this client creates in the redb file at `path`.
    pub fn handle_store(mut self, path: impl AsRef<Path>) -> Self {
        self.store = Some(path.as_ref().to_owned());
        self
    }

    /// Builds the client (and opens the handle store, if one was set).
    pub async fn build(self) -> Result<Client, ClientError> {
        let transport: Arc<dyn Transport> = match self.target {
            Target::Http { url, token, idle } => {
                let mut t = HttpTransport::new(&url)?;
                if let Some(token) = token {
                    t = t.bearer_token(token);
                }
                if let Some(idle) = idle {
                    t = t.idle_timeout(idle);
                }
                Arc::new(t)
            }
            Target::Custom(t) => t,
        };
        let mut capabilities = self.capabilities.unwrap_or_else(|| {
            self.handler
                .as_ref()
                .map(|h| h.capabilities())
                .unwrap_or_else(|| json!({}))
        });
        if !capabilities.is_object() {
            capabilities = json!({});
        }
        if !capabilities.get("extensions").is_some_and(Value::is_object) {
            capabilities["extensions"] = json!({});
        }
        capabilities["extensions"][TASKS_EXTENSION] = json!({});
        let store = match self.store {
            Some(path) => Some(HandleStore::open(path).await?),
            None => None,
        };
        Ok(Client {
            inner: Arc::new(Inner {
                endpoint: transport.endpoint(),
                transport,
                capabilities,
                client_info: self.client_info,
                handler: self.handler,
                retry: self.retry,
                timeout: self.timeout,
                store,
                next_id: AtomicU64::new(1),
                answered: Mutex::new(HashMap::new()),
            }),
        })
    }
}

/// An MCP client. Cheap to clone; every clone shares the transport and the handle store.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    transport: Arc<dyn Transport>,
    endpoint: String,
    capabilities: Value,
    client_info: Value,
    handler: Option<Arc<dyn InputHandler>>,
    retry: RetryPolicy,
    timeout: Duration,
    store: Option<HandleStore>,
    next_id: AtomicU64,
    /// Input keys answered per task id, shared by every handle of the task.
    answered: Mutex<HashMap<String, HashSet<String>>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.inner.endpoint)
            .finish()
    }
}

impl Client {
    /// A client of the Streamable HTTP endpoint at `url`.
    pub fn http(url: &str) -> Result<ClientBuilder, ClientError> {
        // Validate now, so that a bad URL is reported where it is given.
        HttpTransport::new(url)?;
        Ok(ClientBuilder::new(Target::Http {
            url: url.to_owned(),
            token: None,
            idle: None,
        }))
    }

    /// A client of a runtime in the same process, calling as `owner`.
    pub fn in_process(handle: RuntimeHandle, owner: Owner) -> ClientBuilder {
        ClientBuilder::new(Target::Custom(Arc::new(InProcessTransport::new(
            handle, owner,
        ))))
    }

    /// A client over any [`Transport`].
    pub fn with_transport(transport: Arc<dyn Transport>) -> ClientBuilder {
        ClientBuilder::new(Target::Custom(transport))
    }

    /// The server, as the transport names it.
    pub fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    fn meta(&self) -> Value {
        json!({
            (keys::PROTOCOL_VERSION): PROTOCOL_VERSION,
            (keys::CLIENT_CAPABILITIES): self.inner.capabilities,
            (keys::CLIENT_INFO): self.inner.client_info,
        })
    }

    fn message(&self, method: &str, mut params: Map<String, Value>) -> (Value, Value) {
        params.insert("_meta".into(), self.meta());
        let id = json!(self.inner.next_id.fetch_add(1, Ordering::Relaxed));
        let msg = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        (id, msg)
    }

    /// Sends one request and returns its result object; retries idempotent methods after
    /// transport errors.
    pub async fn request(
        &self,
        method: &str,
        params: Map<String, Value>,
    ) -> Result<Value, ClientError> {
        let name = methods::named_member(method)
            .and_then(|m| params.get(m))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let attempts = if idempotent(method) {
            self.inner.retry.attempts.max(1)
        } else {
            1
        };
        let mut attempt = 0;
        loop {
            let (id, msg) = self.message(method, params.clone());
            match self.request_once(method, name.as_deref(), &id, msg).await {
                Err(e) if e.is_transport() && attempt + 1 < attempts => {
                    let delay = self.inner.retry.delay(attempt);
                    tracing::debug!(method, error = %e, ?delay, "retrying");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn request_once(
        &self,
        method: &str,
        name: Option<&str>,
        id: &Value,
        msg: Value,
    ) -> Result<Value, ClientError> {
        let exchange = async {
            match self.inner.transport.send(msg).await? {
                Response::Message(v) => Ok(v),
                Response::Stream(mut s) => {
                    while let Some(m) = s.next().await {
                        let m = m?;
                        if m.get("id") == Some(id) {
                            return Ok(m);
                        }
                    }
                    Err(ClientError::Protocol(format!(
                        "the response stream of `{method}` ended without its response"
                    )))
                }
                Response::Accepted => Err(ClientError::Protocol(format!(
                    "the server accepted the `{method}` request without answering it"
                ))),
            }
        };
        let response = tokio::time::timeout(self.inner.timeout, exchange)
            .await
            .map_err(|_| ClientError::Timeout {
                url: self.inner.endpoint.clone(),
                seconds: self.inner.timeout.as_secs_f64(),
            })??;
        decode_response(method, name, id, response)
    }

    /// `server/discover`.
    pub async fn discover(&self) -> Result<Discovery, ClientError> {
        let r = self.request(methods::DISCOVER, Map::new()).await?;
        Ok(Discovery {
            supported_versions: r
                .get("supportedVersions")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
            capabilities: r.get("capabilities").cloned().unwrap_or_else(|| json!({})),
            instructions: r
                .get("instructions")
                .and_then(Value::as_str)
                .map(str::to_owned),
            server_info: r
                .get("_meta")
                .and_then(|m| m.get(keys::SERVER_INFO))
                .cloned(),
            raw: r,
        })
    }

    /// `tools/list`, every page (following `nextCursor`).
    pub async fn list_tools(&self) -> Result<Vec<ToolInfo>, ClientError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        let mut seen = HashSet::new();
        for _ in 0..MAX_PAGES {
            let mut params = Map::new();
            if let Some(c) = &cursor {
                params.insert("cursor".into(), json!(c));
            }
            let page = self.request(methods::TOOLS_LIST, params).await?;
            let items = page
                .get("tools")
                .and_then(Value::as_array)
                .ok_or_else(|| ClientError::Protocol("`tools/list` without `tools`".into()))?;
            for t in items {
                let Some(name) = t.get("name").and_then(Value::as_str) else {
                    return Err(ClientError::Protocol(format!("a tool without a name: {t}")));
                };
                tools.push(ToolInfo {
                    name: name.to_owned(),
                    title: t.get("title").and_then(Value::as_str).map(str::to_owned),
                    description: t
                        .get("description")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    input_schema: t.get("inputSchema").cloned().unwrap_or(Value::Null),
                    raw: t.clone(),
                });
            }
            match page.get("nextCursor").and_then(Value::as_str) {
                Some(next) if !next.is_empty() => {
                    if !seen.insert(next.to_owned()) {
                        return Err(ClientError::Protocol(format!(
                            "`tools/list` returned the cursor `{next}` twice"
                        )));
                    }
                    cursor = Some(next.to_owned());
                }
                _ => return Ok(tools),
            }
        }
        Err(ClientError::Protocol(format!(
            "`tools/list` has more than {MAX_PAGES} pages"
        )))
    }

    /// `tools/call`: the complete result, or a handle of the task the server created. Core
    /// MRTR rounds (`input_required`) are answered with the input handler; without one, or
    /// when it leaves a request unanswered, the call fails with
    /// [`ClientError::InputRequired`]. Never retried.
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
    ) -> Result<CallOutcome, ClientError> {
        let arguments = match arguments {
            Value::Null => json!({}),
            Value::Object(_) => arguments,
            other => {
                let error = RpcError::invalid_params(format!(
                    "tool arguments must be a JSON object, not {}",
                    crate::wire::jsonrpc::kind(&other)
                ));
                return Err(ClientError::InvalidParams(Box::new(error)));
            }
        };
        let mut responses: Option<Map<String, Value>> = None;
        let mut state: Option<String> = None;
        for _ in 0..MAX_MRTR_ROUNDS {
            let mut params = Map::new();
            params.insert("name".into(), json!(name));
            params.insert("arguments".into(), arguments.clone());
            if let Some(r) = responses.take() {
                params.insert("inputResponses".into(), Value::Object(r));
            }
            if let Some(s) = state.take() {
                params.insert("requestState".into(), json!(s));
            }
            let result = match self.request(methods::TOOLS_CALL, params).await {
                Ok(r) => r,
                Err(ClientError::InvalidParams(error)) => {
                    return Err(self.unknown_tool_or(name, error).await);
                }
                Err(e) => return Err(e),
            };
            match result.get("resultType").and_then(Value::as_str) {
                Some("task") => {
                    let task = Task::from_value(&result)?;
                    return self.task_created(task, name, &arguments).await;
                }
                Some("input_required") => {
                    state = result
                        .get("requestState")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                    responses = Some(self.answer_round(&result).await?);
                }
                None | Some("complete") => return Ok(CallOutcome::Complete(result)),
                Some(other) => {
                    return Err(ClientError::Protocol(format!(
                        "`tools/call` answered an unknown resultType `{other}`"
                    )));
                }
            }
        }
        Err(ClientError::Protocol(format!(
            "`{name}` still asked for input after {MAX_MRTR_ROUNDS} rounds"
        )))
    }

    /// The handle of a task `tools/call` created, saved in the handle store if there is one.
    async fn task_created(
        &self,
        task: Task,
        tool: &str,
        arguments: &Value,
    ) -> Result<CallOutcome, ClientError> {
        let handle = self.handle(task.task_id.clone());
        if let Some(store) = &self.inner.store {
            store
                .put(SavedTask {
                    version: 1,
                    task_id: task.task_id.clone(),
                    endpoint: self.inner.endpoint.clone(),
                    tool: tool.to_owned(),
                    arguments: arguments.clone(),
                    created_at_ms: now_ms(),
                    status: task.status.as_str().to_owned(),
                    answered: Vec::new(),
                })
                .await?;
        }
        *handle.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        Ok(CallOutcome::Task(handle))
    }

    /// The answers of the input handler to one `input_required` round of a call;
    /// [`ClientError::InputRequired`] with the requests it left unanswered.
    async fn answer_round(&self, result: &Value) -> Result<Map<String, Value>, ClientError> {
        let requests = result
            .get("inputRequests")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let mut answers = Map::new();
        if let Some(handler) = &self.inner.handler {
            for (key, request) in &requests {
                if let Some(answer) = handler.answer(key, request).await {
                    answers.insert(key.clone(), answer);
                }
            }
        }
        let missing: Map<String, Value> = requests
            .iter()
            .filter(|(k, _)| !answers.contains_key(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !missing.is_empty() {
            return Err(ClientError::InputRequired { requests: missing });
        }
        Ok(answers)
    }

    /// A `-32602` of `tools/call`: an unknown tool (with the server's list) when the tool is
    /// not listed, else the server's message.
    async fn unknown_tool_or(&self, name: &str, error: Box<RpcError>) -> ClientError {
        match self.list_tools().await {
            Ok(tools) if !tools.iter().any(|t| t.name == name) => ClientError::UnknownTool {
                name: name.to_owned(),
                available: tools.into_iter().map(|t| t.name).collect(),
                error,
            },
            _ => ClientError::InvalidParams(error),
        }
    }

    fn handle(&self, task_id: String) -> TaskHandle {
        TaskHandle {
            client: self.clone(),
            id: task_id,
            last: Arc::new(Mutex::new(None)),
        }
    }

    /// A handle of a task known by id (e.g. printed by another process). With a handle
    /// store, the keys it already answered are loaded so none is answered twice.
    pub async fn resume(&self, task_id: &str) -> Result<TaskHandle, ClientError> {
        if let Some(store) = &self.inner.store
            && let Some(saved) = store.get(&self.inner.endpoint, task_id).await?
        {
            self.answered_keys(task_id).extend(saved.answered);
        }
        Ok(self.handle(task_id.to_owned()))
    }

    /// The tasks this client (or an earlier run with the same handle store) created on this
    /// server, oldest first. Empty without a handle store.
    pub async fn saved_tasks(&self) -> Result<Vec<SavedTask>, ClientError> {
        match &self.inner.store {
            Some(store) => store.list(Some(&self.inner.endpoint)).await,
            None => Ok(Vec::new()),
        }
    }

    /// Removes a task from the handle store; `true` when it was there.
    pub async fn forget(&self, task_id: &str) -> Result<bool, ClientError> {
        self.answered_keys(task_id).clear();
        match &self.inner.store {
            Some(store) => store.remove(&self.inner.endpoint, task_id).await,
            None => Ok(false),
        }
    }

    fn answered_keys(&self, task_id: &str) -> AnsweredGuard<'_> {
        AnsweredGuard {
            guard: self
                .inner
                .answered
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
            task_id: task_id.to_owned(),
        }
    }
}

struct AnsweredGuard<'a> {
    guard: std::sync::MutexGuard<'a, HashMap<String, HashSet<String>>>,
    task_id: String,
}

impl AnsweredGuard<'_> {
    fn set(&mut self) -> &mut HashSet<String> {
        self.guard.entry(self.task_id.clone()).or_default()
    }

    fn extend(mut self, keys: impl IntoIterator<Item = String>) {
        self.set().extend(keys);
    }

    fn clear(mut self) {
        self.guard.remove(&self.task_id);
    }

    fn contains(&mut self, key: &str) -> bool {
        self.set().contains(key)
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Reads a JSON-RPC response: its result object, or the typed error.
fn decode_response(
    method: &str,
    name: Option<&str>,
    id: &Value,
    response: Value,
) -> Result<Value, ClientError> {
    if let Some(got) = response.get("id")
        && got != id
    {
        return Err(ClientError::Protocol(format!(
            "a response to request {got} arrived for request {id}"
        )));
    }
    if let Some(error) = response.get("error") {
        let error = RpcError {
            code: error.get("code").and_then(Value::as_i64).ok_or_else(|| {
                ClientError::Protocol(format!("an error without an integer code: {error}"))
            })?,
            message: error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            data: error.get("data").cloned(),
        };
        return Err(ClientError::from_rpc(method, name, error));
    }
    match response.get("result") {
        Some(r @ Value::Object(_)) => Ok(r.clone()),
        Some(other) => Err(ClientError::Protocol(format!(
            "the result of `{method}` is not an object: {other}"
        ))),
        None => Err(ClientError::Protocol(format!(
            "the response to `{method}` has neither `result` nor `error`"
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// Task handles

/// A task on the server. Cheap to clone.
#[derive(Clone)]
pub struct TaskHandle {
    client: Client,
    id: String,
    last: Arc<Mutex<Option<Task>>>,
}

impl std::fmt::Debug for TaskHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskHandle").field("id", &self.id).finish()
    }
}

impl TaskHandle {
    /// The task's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The last state this handle saw (the `CreateTaskResult` at first).
    pub fn last_seen(&self) -> Option<Task> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn id_params(&self) -> Map<String, Value> {
        let mut p = Map::new();
        p.insert("taskId".into(), json!(self.id));
        p
    }

    /// `tasks/get` (retried after transport errors).
    pub async fn get(&self) -> Result<Task, ClientError> {
        let r = self
            .client
            .request(methods::TASKS_GET, self.id_params())
            .await?;
        let task = Task::from_value(&r)?;
        if task.task_id != self.id {
            return Err(ClientError::Protocol(format!(
                "`tasks/get` of {} answered task {}",
                self.id, task.task_id
            )));
        }
        self.observe(&task).await;
        Ok(task)
    }

    /// Records a state seen: the handle's latest, and its status in the handle store.
    async fn observe(&self, task: &Task) {
        let changed = {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            let changed = last.as_ref().is_none_or(|l| l.status != task.status);
            *last = Some(task.clone());
            changed
        };
        if changed && let Some(store) = &self.client.inner.store {
            let status = task.status.as_str().to_owned();
            if let Err(e) = store
                .update(&self.client.inner.endpoint, &self.id, move |s| {
                    s.status = status;
                })
                .await
            {
                tracing::warn!(task = %self.id, error = %e, "cannot record the task's status");
            }
        }
    }

    /// `tasks/update` with `responses` (input key → response). Keys this client already
    /// answered are left out, so that each key is answered once; returns the keys sent.
    pub async fn answer(&self, responses: Map<String, Value>) -> Result<Vec<String>, ClientError> {
        let fresh: Map<String, Value> = {
            let mut answered = self.client.answered_keys(&self.id);
            responses
                .into_iter()
                .filter(|(k, _)| !answered.contains(k))
                .collect()
        };
        if fresh.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = fresh.keys().cloned().collect();
        let mut params = self.id_params();
        params.insert("inputResponses".into(), Value::Object(fresh));
        self.client.request(methods::TASKS_UPDATE, params).await?;
        self.client.answered_keys(&self.id).extend(keys.clone());
        if let Some(store) = &self.client.inner.store {
            let sent = keys.clone();
            store
                .update(&self.client.inner.endpoint, &self.id, move |s| {
                    for k in sent {
                        if !s.answered.contains(&k) {
                            s.answered.push(k);
                        }
                    }
                })
                .await?;
        }
        Ok(keys)
    }

    /// [`TaskHandle::answer`] after checking with `tasks/get` that the task waits for every
    /// key given: a key it does not wait for fails with [`ClientError::UnknownInputKey`]
    /// (naming the keys it waits for) and nothing is sent. The Tasks extension has servers
    /// acknowledge and ignore such keys (a typo would otherwise be dropped in silence), so
    /// the check is the client's. A key answered between the check and the update is still
    /// ignored by the server.
    pub async fn answer_outstanding(
        &self,
        responses: Map<String, Value>,
    ) -> Result<Vec<String>, ClientError> {
        let task = self.get().await?;
        let waiting: Vec<String> = if task.status == TaskStatus::InputRequired {
            task.input_requests.keys().cloned().collect()
        } else {
            Vec::new()
        };
        let unknown: Vec<String> = responses
            .keys()
            .filter(|k| !waiting.contains(k))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            return Err(ClientError::UnknownInputKey {
                task_id: self.id.clone(),
                keys: unknown,
                status: task.status.as_str().to_owned(),
                waiting,
            });
        }
        // The keys are outstanding: send them even if this client answered them before (the
        // server re-issued them, or an earlier answer was refused).
        {
            let mut answered = self.client.answered_keys(&self.id);
            for k in responses.keys() {
                answered.set().remove(k);
            }
        }
        self.answer(responses).await
    }

    /// `tasks/cancel`. Cooperative: the task may still end otherwise; follow it with
    /// [`TaskHandle::wait`] or [`TaskHandle::watch`].
    pub async fn cancel(&self) -> Result<(), ClientError> {
        self.client
            .request(methods::TASKS_CANCEL, self.id_params())
            .await
            .map(|_| ())
    }

    /// Polls `tasks/get` until the task is terminal, sleeping the task's `pollIntervalMs`
    /// between polls, and answers `inputRequests` through the input handler (each key
    /// once). Returns the terminal task, or the `input_required` task when some request
    /// has no answer (no handler, or the handler returned `None`): answer it with
    /// [`TaskHandle::answer`] and wait again.
    pub async fn wait(&self) -> Result<Task, ClientError> {
        loop {
            let task = self.get().await?;
            if task.is_terminal() {
                return Ok(task);
            }
            if task.status == TaskStatus::InputRequired {
                let pending: Vec<(String, Value)> = {
                    let mut answered = self.client.answered_keys(&self.id);
                    task.input_requests
                        .iter()
                        .filter(|(k, _)| !answered.contains(k))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                };
                if !pending.is_empty() {
                    let mut answers = Map::new();
                    if let Some(handler) = &self.client.inner.handler {
                        for (key, request) in &pending {
                            if let Some(a) = handler.answer(key, request).await {
                                answers.insert(key.clone(), a);
                            }
                        }
                    }
                    let complete = answers.len() == pending.len();
                    if !answers.is_empty() {
                        self.answer(answers).await?;
                    }
                    if !complete {
                        return Ok(task);
                    }
                    continue;
                }
            }
            tokio::time::sleep(task.poll_interval()).await;
        }
    }

    /// Follows the task until it is terminal: a stream of every state seen, the current one
    /// first and the terminal one last. Uses `subscriptions/listen` when the server
    /// acknowledges the task, reconnecting (and re-reading the task) after a dropped
    /// stream; polls at `pollIntervalMs` otherwise. Input requests are reported, not
    /// answered. An error ends the stream.
    pub fn watch(&self) -> TaskWatch {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let handle = self.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = handle.run_watch(&tx).await {
                let _ = tx.send(Err(e)).await;
            }
        });
        TaskWatch { rx, task }
    }

    async fn run_watch(
        &self,
        tx: &tokio::sync::mpsc::Sender<Result<Task, ClientError>>,
    ) -> Result<(), ClientError> {
        let mut watcher = Emitter { last: None, tx };
        if watcher.emit(self.get().await?).await {
            return Ok(());
        }
        let mut listen = true;
        let mut drops: u32 = 0;
        loop {
            if !listen {
                let interval = watcher.interval();
                tokio::time::sleep(interval).await;
                if watcher.emit(self.get().await?).await {
                    return Ok(());
                }
                continue;
            }
            let stream = match self.listen().await {
                Ok(Some(stream)) => stream,
                Ok(None) => {
                    tracing::debug!(task = %self.id, "listen did not acknowledge the task; polling");
                    listen = false;
                    continue;
                }
                Err(e) if e.is_transport() => {
                    drops += 1;
                    // Re-reading the task (with retries) reconnects or gives up.
                    if watcher.emit(self.get().await?).await {
                        return Ok(());
                    }
                    tokio::time::sleep(self.client.inner.retry.delay(drops.min(8))).await;
                    continue;
                }
                Err(e) => {
                    tracing::debug!(task = %self.id, error = %e, "listen refused; polling");
                    listen = false;
                    continue;
                }
            };
            // Catch up on what happened before the subscription started.
            if watcher.emit(self.get().await?).await {
                return Ok(());
            }
            let mut stream = stream;
            while let Some(message) = stream.next().await {
                let Ok(message) = message else { break };
                if message.get("method").and_then(Value::as_str) != Some("notifications/tasks") {
                    if message.get("id").is_some() {
                        // The listen's own result: the server ended the stream.
                        break;
                    }
                    continue;
                }
                let Some(params) = message.get("params") else {
                    continue;
                };
                if params.get("taskId").and_then(Value::as_str) != Some(self.id.as_str()) {
                    continue;
                }
                let task = Task::from_value(params)?;
                self.observe(&task).await;
                if watcher.emit(task).await {
                    return Ok(());
                }
                drops = 0;
            }
            drop(stream);
            // Dropped before the end: read the task so a final state reached meanwhile is
            // not lost, then listen again.
            drops += 1;
            tracing::debug!(task = %self.id, drops, "listen stream ended early; reconnecting");
            if watcher.emit(self.get().await?).await {
                return Ok(());
            }
            tokio::time::sleep(self.client.inner.retry.delay(drops.min(8))).await;
        }
    }

    /// Opens `subscriptions/listen` for this task: the stream after an acknowledgement that
    /// names the task, `None` when the server acknowledged without it or ended at once.
    async fn listen(
        &self,
    ) -> Result<Option<BoxStream<'static, Result<Value, ClientError>>>, ClientError> {
        let mut params = Map::new();
        params.insert("notifications".into(), json!({ "taskIds": [self.id] }));
        let (id, msg) = self.client.message(methods::SUBSCRIPTIONS_LISTEN, params);
        let timeout = self.client.inner.timeout;
        let timed_out = || ClientError::Timeout {
            url: self.client.inner.endpoint.clone(),
            seconds: timeout.as_secs_f64(),
        };
        let response = tokio::time::timeout(timeout, self.client.inner.transport.send(msg))
            .await
            .map_err(|_| timed_out())??;
        let mut stream = match response {
            Response::Message(m) => {
                decode_response(methods::SUBSCRIPTIONS_LISTEN, None, &id, m)?;
                return Ok(None);
            }
            Response::Accepted => return Ok(None),
            Response::Stream(s) => s,
        };
        let first = tokio::time::timeout(timeout, stream.next())
            .await
            .map_err(|_| timed_out())?;
        let Some(first) = first else {
            return Ok(None);
        };
        let first = first?;
        if first.get("id").is_some() {
            decode_response(methods::SUBSCRIPTIONS_LISTEN, None, &id, first)?;
            return Ok(None);
        }
        if first.get("method").and_then(Value::as_str)
            != Some("notifications/subscriptions/acknowledged")
        {
            return Err(ClientError::Protocol(format!(
                "a listen stream must start with its acknowledgement, not {first}"
            )));
        }
        let acknowledged = first
            .pointer("/params/notifications/taskIds")
            .and_then(Value::as_array)
            .is_some_and(|ids| ids.iter().any(|v| v.as_str() == Some(self.id.as_str())));
        Ok(acknowledged.then_some(stream))
    }
}

/// Sends each newer state to a watcher; reports whether the last one was terminal.
struct Emitter<'a> {
    last: Option<Task>,
    tx: &'a tokio::sync::mpsc::Sender<Result<Task, ClientError>>,
}

impl Emitter<'_> {
    async fn emit(&mut self, task: Task) -> bool {
        let newer = self.last.as_ref().is_none_or(|l| task.supersedes(l));
        if newer {
            let terminal = task.is_terminal();
            self.last = Some(task.clone());
            if self.tx.send(Ok(task)).await.is_err() {
                return true; // nobody is watching any more
            }
            return terminal;
        }
        self.last.as_ref().is_some_and(Task::is_terminal)
    }

    fn interval(&self) -> Duration {
        self.last
            .as_ref()
            .map_or(DEFAULT_POLL_INTERVAL, Task::poll_interval)
    }
}

/// The states of a watched task ([`TaskHandle::watch`]). Dropping it stops watching (the
/// task goes on on the server).
pub struct TaskWatch {
    rx: tokio::sync::mpsc::Receiver<Result<Task, ClientError>>,
    task: tokio::task::JoinHandle<()>,
}

impl Stream for TaskWatch {
    type Item = Result<Task, ClientError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for TaskWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::fmt::Debug for TaskWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TaskWatch")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(status: &str, updated: &str) -> Task {
        Task::from_value(&json!({
            "taskId": "t", "status": status, "createdAt": "2026-01-01T00:00:00Z",
            "lastUpdatedAt": updated, "ttlMs": null
        }))
        .unwrap()
    }

    #[test]
    fn newer_states_supersede_older_ones() {
        let a = task("working", "2026-01-01T00:00:01.000Z");
        let b = task("input_required", "2026-01-01T00:00:02.000Z");
        let done = task("completed", "2026-01-01T00:00:03.000Z");
        assert!(b.supersedes(&a));
        assert!(!a.supersedes(&b), "stale");
        assert!(!a.supersedes(&a.clone()), "same");
        assert!(!b.supersedes(&done), "nothing after terminal");
        assert!(done.supersedes(&b));
    }

    #[test]
    fn tasks_tolerate_missing_optional_fields() {
        let t = Task::from_value(&json!({ "taskId": "x", "status": "working" })).unwrap();
        assert_eq!(t.ttl_ms, None);
        assert_eq!(t.poll_interval(), DEFAULT_POLL_INTERVAL);
        assert!(Task::from_value(&json!({ "taskId": "x", "status": "paused" })).is_err());
        assert!(Task::from_value(&json!({ "status": "working" })).is_err());
    }

    #[test]
    fn poll_intervals_are_clamped() {
        let mut t = task("working", "2026-01-01T00:00:01Z");
        t.poll_interval_ms = Some(0);
        assert_eq!(t.poll_interval(), POLL_RANGE.0);
        t.poll_interval_ms = Some(3_600_000);
        assert_eq!(t.poll_interval(), POLL_RANGE.1);
        t.poll_interval_ms = Some(250);
        assert_eq!(t.poll_interval(), Duration::from_millis(250));
    }

    #[test]
    fn only_idempotent_methods_are_retried() {
        assert!(idempotent("tasks/get"));
        assert!(!idempotent("tools/call"));
        assert!(!idempotent("subscriptions/listen"));
    }

    #[test]
    fn rpc_errors_are_typed() {
        let e = decode_response(
            "tasks/get",
            Some("tsk_1"),
            &json!(1),
            json!({"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"Failed to retrieve task: Task not found"}}),
        )
        .unwrap_err();
        assert!(matches!(e, ClientError::UnknownTask { ref task_id, .. } if task_id == "tsk_1"));
        let e = decode_response(
            "tasks/get",
            Some("tsk_1"),
            &json!(1),
            json!({"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"Task has expired"}}),
        )
        .unwrap_err();
        assert!(matches!(e, ClientError::TaskExpired { .. }));
        let refused = |method: &str, message: &str| {
            let e = decode_response(
                method,
                Some("tsk_1"),
                &json!(5),
                json!({"jsonrpc":"2.0","id":5,"error":{"code":-32602,"message":message}}),
            )
            .unwrap_err();
            (e.to_string(), e)
        };
        let (text, e) = refused(
            "tasks/update",
            "Invalid params: the response for input key `k` needs `action`",
        );
        assert!(matches!(e, ClientError::InvalidAnswer { .. }), "{e:?}");
        assert_eq!(
            text,
            "the answer to task `tsk_1` was refused: the response for input key `k` needs `action`"
        );
        let (_, e) = refused(
            "tasks/update",
            "Invalid params: Failed to retrieve task: Task not found",
        );
        assert!(matches!(e, ClientError::UnknownTask { .. }), "{e:?}");
        let (text, e) = refused("tasks/get", "Invalid params: malformed task id: expected …");
        assert!(matches!(e, ClientError::MalformedTaskId { .. }), "{e:?}");
        assert_eq!(
            text,
            "`tsk_1` is not a task id: malformed task id: expected …"
        );
        // Another server's wording: on get and cancel the id is the only parameter.
        let (_, e) = refused("tasks/cancel", "bad taskId");
        assert!(matches!(e, ClientError::UnknownTask { .. }), "{e:?}");
        let (text, e) = refused("tools/call", "Invalid params: `x` is required");
        assert!(matches!(e, ClientError::InvalidParams(_)), "{e:?}");
        assert_eq!(text, "invalid params: `x` is required");
        let e = decode_response(
            "x",
            None,
            &json!(2),
            json!({"jsonrpc":"2.0","id":2,"error":{"code":-32022,"message":"no","data":{"supported":["2026-07-28"],"requested":"v9"}}}),
        )
        .unwrap_err();
        assert!(
            matches!(e, ClientError::UnsupportedVersion { ref supported, ref requested, .. } if supported == &["2026-07-28"] && requested == "v9")
        );
        let e = decode_response(
            "x",
            None,
            &json!(3),
            json!({"jsonrpc":"2.0","id":4,"result":{}}),
        )
        .unwrap_err();
        assert!(matches!(e, ClientError::Protocol(_)));
    }
}
