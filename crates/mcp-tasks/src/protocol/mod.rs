//! The dispatcher: one JSON-RPC message and the caller's identity in, nothing, one JSON-RPC
//! response, or a stream of messages out. It validates in the order the official conformance suite expects, routes
//! to the task actors, the supervisor and the subscriber actors, and maps every internal error
//! to a JSON-RPC error through the `From` impls of `errors.rs`.
//!
//! It is not an actor on purpose: requests are handled concurrently on the caller's tokio
//! task, so neither validation nor store reads serialize the server. Per-task ordering comes
//! from the task actors.

mod catalog;
mod errors;
mod listen;
mod pages;
mod tasks;
mod tools;

pub(crate) use tasks::TaskCursor;

/// The longest `ttlMs` of a `tools/list` whose tools may change while the runtime runs.
const CHANGING_TOOLS_TTL_MS: u64 = 10_000;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::BoxStream;
use ractor::ActorRef;
use serde_json::{Map, Value};
use tracing::Instrument;

use crate::actor::SupervisorMsg;
use crate::shared::Shared;
use crate::task::json::{Shape, TaskResult};
use crate::task::{Owner, TaskRecord};
use crate::tool::registry::HeaderParam;
use crate::wire::error::{RpcError, http_status};
use crate::wire::jsonrpc::{self, Incoming};
use crate::wire::meta::RequestMeta;
use crate::wire::params::ListParams;
use crate::wire::{methods, results};

/// The routing headers of a Streamable HTTP request, already decoded (`=?base64?…?=`) and
/// trimmed. `None` members were absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutingHeaders {
    /// `MCP-Protocol-Version`.
    pub protocol_version: Option<String>,
    /// `Mcp-Method`.
    pub method: Option<String>,
    /// `Mcp-Name` (the tool or prompt name, resource URI or task id the body names).
    pub name: Option<String>,
    /// `Mcp-Param-{Name}` headers (SEP-2243), by `Name` in lower case, decoded and trimmed.
    pub params: BTreeMap<String, String>,
}

/// Who sends a message and how, as established by the transport (authentication is the
/// host's job).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestContext {
    /// Who sends the message (from authentication; every task is scoped to it).
    pub owner: Owner,
    /// HTTP routing headers to check against the body; `None` for transports without headers.
    pub headers: Option<RoutingHeaders>,
    /// Whether a missing `Mcp-Name` on `tasks/*` is `-32020` (by default it is accepted: the
    /// body is authoritative and some clients omit it).
    pub strict_headers: bool,
    /// Whether the transport can send request-scoped notifications (`notifications/progress`)
    /// before the response ([`Dispatched::Stream`]): an HTTP client that accepts
    /// `text/event-stream`, stdio. Without it a request is always answered with one response.
    pub streams: bool,
}

impl RequestContext {
    /// A context without transport headers (in process, stdio).
    pub fn new(owner: Owner) -> Self {
        Self {
            owner,
            headers: None,
            strict_headers: false,
            streams: false,
        }
    }

    /// Says whether the transport can stream request-scoped notifications before the
    /// response (see [`RequestContext::streams`]).
    pub fn with_streams(mut self, streams: bool) -> Self {
        self.streams = streams;
        self
    }

    /// The context of an HTTP request with its routing headers.
    pub fn http(owner: Owner, headers: RoutingHeaders, strict_headers: bool) -> Self {
        Self {
            owner,
            headers: Some(headers),
            strict_headers,
            streams: false,
        }
    }
}

/// The answer to one request: the JSON-RPC response and the HTTP status a transport should
/// use for it.
#[derive(Debug, Clone)]
pub struct Reply {
    body: Body,
    /// The HTTP status a transport should answer with.
    pub http_status: u16,
}

/// A response as a `Value`, or already serialized (task objects are written straight from
/// their record: see `task::json::TaskResult`).
#[derive(Debug, Clone)]
enum Body {
    Value(Value),
    Json(Vec<u8>),
}

impl Reply {
    fn ok(id: &Value, result: Value) -> Self {
        Self {
            body: Body::Value(jsonrpc::result_response(id, result)),
            http_status: 200,
        }
    }

    /// A task object answered straight from its record.
    fn task(id: &Value, result: &crate::task::json::TaskResult<'_>) -> Self {
        let body = match jsonrpc::result_response_bytes(id, result) {
            Ok(bytes) => Body::Json(bytes),
            // Not expected (every key is a string); the tree builder says the same.
            Err(e) => {
                tracing::error!(error = %e, "a task object could not be serialized directly");
                let value = match result.shape {
                    Shape::Created => crate::task::json::create_task(result.record, result.server),
                    Shape::Detailed => crate::task::json::get_task(result.record, result.server),
                };
                Body::Value(jsonrpc::result_response(id, value))
            }
        };
        Self {
            body,
            http_status: 200,
        }
    }

    pub(crate) fn error(id: Option<&Value>, error: &RpcError) -> Self {
        Self {
            body: Body::Value(jsonrpc::error_response(id, error)),
            http_status: http_status(error.code),
        }
    }

    /// The JSON-RPC response (parsed when it was built serialized).
    pub fn body(&self) -> Cow<'_, Value> {
        match &self.body {
            Body::Value(v) => Cow::Borrowed(v),
            Body::Json(bytes) => Cow::Owned(parse_own(bytes)),
        }
    }

    /// The JSON-RPC response as a `Value`.
    pub fn into_body(self) -> Value {
        match self.body {
            Body::Value(v) => v,
            Body::Json(bytes) => parse_own(&bytes),
        }
    }

    /// The JSON-RPC response serialized (compact, one line).
    pub fn into_bytes(self) -> Vec<u8> {
        match self.body {
            // Serializing a `Value` cannot fail (its keys are strings).
            Body::Value(v) => serde_json::to_vec(&v).unwrap_or_default(),
            Body::Json(bytes) => bytes,
        }
    }
}

/// Two replies are equal when their responses are the same JSON and their statuses agree.
impl PartialEq for Reply {
    fn eq(&self, other: &Self) -> bool {
        self.http_status == other.http_status && self.body() == other.body()
    }
}

/// Bytes this crate serialized itself, back into a `Value`.
fn parse_own(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| {
        tracing::error!(error = %e, "a serialized response does not parse again");
        Value::Null
    })
}

/// A stream of JSON-RPC messages that answers one request. For `subscriptions/listen`: the
/// acknowledgement first, then notifications; when the server shuts down, the request's
/// result last. For a synchronous `tools/call` that reports progress: its
/// `notifications/progress`, then the response. Dropping it cancels the request.
pub struct MessageStream {
    inner: BoxStream<'static, Value>,
}

impl MessageStream {
    pub(crate) fn new(inner: BoxStream<'static, Value>) -> Self {
        Self { inner }
    }
}

impl Stream for MessageStream {
    type Item = Value;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Value>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl std::fmt::Debug for MessageStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MessageStream")
    }
}

/// What a transport sends back for one incoming message.
#[derive(Debug)]
pub enum Dispatched {
    /// A notification: nothing is sent (HTTP `202 Accepted`).
    Accepted,
    /// One JSON-RPC response.
    Reply(Reply),
    /// Several messages scoped to the request (HTTP: an SSE response).
    Stream(MessageStream),
}

impl Dispatched {
    /// The single response, if this is one.
    pub fn into_reply(self) -> Option<Reply> {
        match self {
            Dispatched::Reply(r) => Some(r),
            _ => None,
        }
    }
}

/// What a request produces before it is wrapped in an envelope.
enum Answer {
    Result(Value),
    /// A task object, written straight from its record.
    Task(Arc<TaskRecord>, Shape),
    Stream(MessageStream),
}

/// One runtime's dispatcher.
pub(crate) struct Dispatcher {
    pub(crate) shared: Arc<Shared>,
    pub(crate) supervisor: ActorRef<SupervisorMsg>,
}

impl Dispatcher {
    /// Handles one raw message.
    pub(crate) async fn handle(&self, bytes: &[u8], ctx: &RequestContext) -> Dispatched {
        match jsonrpc::parse(bytes) {
            Ok(incoming) => self.handle_incoming(incoming, ctx).await,
            Err(rejection) => {
                Dispatched::Reply(Reply::error(rejection.id.as_ref(), &rejection.error))
            }
        }
    }

    /// Handles one message that is already JSON.
    pub(crate) async fn handle_value(&self, value: Value, ctx: &RequestContext) -> Dispatched {
        match jsonrpc::from_value(value) {
            Ok(incoming) => self.handle_incoming(incoming, ctx).await,
            Err(rejection) => {
                Dispatched::Reply(Reply::error(rejection.id.as_ref(), &rejection.error))
            }
        }
    }

    async fn handle_incoming(&self, incoming: Incoming, ctx: &RequestContext) -> Dispatched {
        match incoming {
            Incoming::Notification { method, .. } => {
                tracing::debug!(%method, "notification accepted");
                Dispatched::Accepted
            }
            Incoming::Request { id, method, params } => {
                let started = std::time::Instant::now();
                let label = crate::telemetry::method_label(&method);
                let task = params
                    .as_ref()
                    .and_then(|p| p.get("taskId"))
                    .and_then(Value::as_str);
                // OpenTelemetry semantic conventions for MCP: a server span named
                // `{mcp.method.name} {target}` (`otel.*` fields name it when exported).
                let span = tracing::info_span!(
                    "mcp.request",
                    "otel.name" = %crate::telemetry::span_name(label, params.as_ref()),
                    "otel.kind" = "server",
                    "mcp.method.name" = label,
                    "jsonrpc.request.id" = %id,
                    "gen_ai.tool.name" = crate::telemetry::tool_name(label, params.as_ref()),
                    "mcp.task.id" = task,
                    principal = %ctx.owner.log_id(),
                    "rpc.jsonrpc.error_code" = tracing::field::Empty,
                    "error.type" = tracing::field::Empty,
                );
                let answer = self
                    .request(&id, &method, params.as_ref(), ctx)
                    .instrument(span.clone())
                    .await;
                if let Err(error) = &answer {
                    span.record("rpc.jsonrpc.error_code", error.code);
                    span.record("error.type", error.code.to_string());
                }
                crate::telemetry::operation(
                    label,
                    answer.as_ref().err().map(|e| e.code),
                    started.elapsed(),
                );
                match answer {
                    Ok(Answer::Result(result)) => Dispatched::Reply(Reply::ok(&id, result)),
                    Ok(Answer::Task(record, shape)) => Dispatched::Reply(Reply::task(
                        &id,
                        &TaskResult {
                            record: &record,
                            server: &self.shared.config.server_info,
                            shape,
                        },
                    )),
                    Ok(Answer::Stream(stream)) => Dispatched::Stream(stream),
                    Err(error) => {
                        tracing::debug!(%method, code = error.code, message = %error.message, "request failed");
                        Dispatched::Reply(Reply::error(Some(&id), &error))
                    }
                }
            }
        }
    }

    /// Streamable HTTP transport (SEP-2243): the `MCP-Protocol-Version` header equals the body's version.
    fn check_version_header(
        &self,
        meta: &RequestMeta,
        ctx: &RequestContext,
    ) -> Result<(), RpcError> {
        let Some(headers) = &ctx.headers else {
            return Ok(());
        };
        match &headers.protocol_version {
            None => Err(RpcError::header_mismatch(
                "the MCP-Protocol-Version header is missing",
            )),
            Some(v) if *v != meta.protocol_version => Err(RpcError::header_mismatch(format!(
                "MCP-Protocol-Version header `{v}` differs from the body's `{}`",
                meta.protocol_version
            ))),
            Some(_) => Ok(()),
        }
    }

    /// Streamable HTTP transport (SEP-2243): `Mcp-Method` and `Mcp-Name` agree with the body.
    fn check_routing_headers(
        &self,
        method: &str,
        params: Option<&Map<String, Value>>,
        ctx: &RequestContext,
    ) -> Result<(), RpcError> {
        let Some(headers) = &ctx.headers else {
            return Ok(());
        };
        match &headers.method {
            None => {
                return Err(RpcError::header_mismatch(
                    "the Mcp-Method header is missing",
                ));
            }
            Some(m) if m != method => {
                return Err(RpcError::header_mismatch(format!(
                    "Mcp-Method header `{m}` differs from the body's method `{method}`"
                )));
            }
            Some(_) => {}
        }
        let Some(member) = methods::named_member(method) else {
            return Ok(());
        };
        let body = params.and_then(|p| p.get(member)).and_then(Value::as_str);
        match (&headers.name, body) {
            (Some(name), Some(body)) if name != body => {
                return Err(RpcError::header_mismatch(format!(
                    "Mcp-Name header `{name}` differs from the body's `{member}`"
                )));
            }
            (Some(_), _) => {}
            (None, _) if member == "taskId" && !ctx.strict_headers => {
                tracing::debug!(%method, "Mcp-Name header missing; the body is authoritative");
            }
            (None, _) => {
                return Err(RpcError::header_mismatch("the Mcp-Name header is missing"));
            }
        }
        if method == methods::TOOLS_CALL
            && let Some(tool) = body
        {
            let arguments = params
                .and_then(|p| p.get("arguments"))
                .and_then(Value::as_object);
            check_param_headers(&self.shared.tools.header_params(tool), arguments, headers)?;
        }
        Ok(())
    }

    async fn request(
        &self,
        id: &Value,
        method: &str,
        params: Option<&Map<String, Value>>,
        ctx: &RequestContext,
    ) -> Result<Answer, RpcError> {
        // Removed methods answer -32601 whatever else is wrong with the request, so that a
        // client of an older revision learns that the method is gone.
        if methods::REMOVED.contains(&method) {
            return Err(RpcError::method_not_found(method));
        }
        let meta = RequestMeta::from_params(params)?;
        self.check_version_header(&meta, ctx)?;
        meta.check_version()?;
        self.check_routing_headers(method, params, ctx)?;
        let shared = &self.shared;
        let server = &shared.config.server_info;
        let hints = shared.config.cache_hints;
        let result = match method {
            methods::DISCOVER => results::discover(
                server,
                self.capabilities(),
                shared.config.instructions.as_deref(),
                hints,
            ),
            methods::TOOLS_LIST => {
                let cursor = ListParams::parse(params)?.cursor;
                let (tools, next) = pages::tools_page(shared.tools.list(), cursor.as_deref())?;
                // Tools a source changes (a gateway's upstream appearing) are not cached
                // for as long as a fixed set.
                let hints = if shared.tools.changes() {
                    crate::wire::results::CacheHints {
                        ttl_ms: hints.ttl_ms.min(CHANGING_TOOLS_TTL_MS),
                        ..hints
                    }
                } else {
                    hints
                };
                let mut list = results::list(server, "tools", tools, hints);
                if let (Some(next), Some(fields)) = (next, list.as_object_mut()) {
                    fields.insert("nextCursor".into(), Value::String(next));
                }
                list
            }
            methods::TOOLS_CALL => return self.call_tool(id, params, &meta, ctx).await,
            methods::TASKS_GET | methods::TASKS_UPDATE | methods::TASKS_CANCEL => {
                if !meta.declares_tasks() {
                    return Err(RpcError::tasks_extension_required());
                }
                match method {
                    methods::TASKS_GET => {
                        let record = self.get_task(params, ctx).await?;
                        return Ok(Answer::Task(record, Shape::Detailed));
                    }
                    methods::TASKS_UPDATE => self.update_task(params, ctx).await?,
                    _ => self.cancel_task(params, ctx).await?,
                }
            }
            methods::SUBSCRIPTIONS_LISTEN => {
                return self
                    .listen(id, params, &meta, ctx)
                    .await
                    .map(Answer::Stream);
            }
            methods::PROMPTS_LIST if shared.catalog.has_prompts() => {
                single_page(params)?;
                results::list(server, "prompts", shared.catalog.prompts(), hints)
            }
            methods::PROMPTS_GET if shared.catalog.has_prompts() => {
                self.get_prompt(params, &meta, ctx).await?
            }
            methods::RESOURCES_LIST if shared.catalog.has_resources() => {
                single_page(params)?;
                results::list(server, "resources", shared.catalog.resources(), hints)
            }
            methods::RESOURCES_TEMPLATES_LIST if shared.catalog.has_resources() => {
                single_page(params)?;
                results::list(
                    server,
                    "resourceTemplates",
                    shared.catalog.templates(),
                    hints,
                )
            }
            methods::RESOURCES_READ if shared.catalog.has_resources() => {
                self.read_resource(params, ctx).await?
            }
            methods::COMPLETION_COMPLETE if shared.catalog.has_completions() => {
                self.complete(params, ctx).await?
            }
            other => return Err(RpcError::method_not_found(other)),
        };
        Ok(Answer::Result(result))
    }

    /// Tools and the Tasks extension always; prompts, resources and completions when
    /// registered.
    fn capabilities(&self) -> Map<String, Value> {
        let mut caps = results::capabilities();
        if self.shared.catalog.has_prompts() {
            caps.insert("prompts".into(), Value::Object(Map::new()));
        }
        if self.shared.catalog.has_resources() {
            caps.insert("resources".into(), Value::Object(Map::new()));
        }
        if self.shared.catalog.has_completions() {
            caps.insert("completions".into(), Value::Object(Map::new()));
        }
        caps
    }
}

/// SEP-2243: every `x-mcp-header` argument present in the body is mirrored in its
/// `Mcp-Param-*` header with the same value, and no such header comes without its argument.
/// Strings compare exactly (after the transport's `=?base64?…?=` decoding), numbers
/// numerically, booleans as `true`/`false`. A `null` argument counts as absent.
fn check_param_headers(
    declared: &[HeaderParam],
    arguments: Option<&Map<String, Value>>,
    headers: &RoutingHeaders,
) -> Result<(), RpcError> {
    for param in declared {
        let body = arguments
            .and_then(|a| a.get(&param.argument))
            .filter(|v| !v.is_null());
        let header = headers.params.get(&param.header.to_ascii_lowercase());
        let name = &param.header;
        match (body, header) {
            (None, None) => {}
            (Some(_), None) => {
                return Err(RpcError::header_mismatch(format!(
                    "the Mcp-Param-{name} header is missing (argument `{}` is in the body)",
                    param.argument
                )));
            }
            (None, Some(_)) => {
                return Err(RpcError::header_mismatch(format!(
                    "the Mcp-Param-{name} header is present but argument `{}` is not",
                    param.argument
                )));
            }
            (Some(body), Some(header)) => {
                let same = match body {
                    Value::String(s) => s == header,
                    Value::Bool(b) => header == if *b { "true" } else { "false" },
                    Value::Number(n) => match (n.as_i64(), header.parse::<i64>()) {
                        (Some(a), Ok(b)) => a == b,
                        _ => n
                            .as_f64()
                            .zip(header.parse::<f64>().ok())
                            .is_some_and(|(a, b)| a == b),
                    },
                    // Schema validation rejects other types later; they cannot be mirrored.
                    _ => true,
                };
                if !same {
                    return Err(RpcError::header_mismatch(format!(
                        "the Mcp-Param-{name} header differs from argument `{}`",
                        param.argument
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Lists but `tools/list` have one page: a cursor is never valid.
fn single_page(params: Option<&Map<String, Value>>) -> Result<(), RpcError> {
    if ListParams::parse(params)?.cursor.is_some() {
        return Err(RpcError::invalid_params(
            "invalid cursor: the list has one page",
        ));
    }
    Ok(())
}
