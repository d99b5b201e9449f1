//! The `2025-11-25` (and `2025-06-18`) surface: an adapter at the edge that lets clients of
//! the session-based revisions use this server, on the same endpoint and over the same
//! durable tasks as `2026-07-28` clients.
//!
//! Era detection (MCP `2026-07-28`, versioning): a request that declares
//! `_meta["io.modelcontextprotocol/protocolVersion"]`, or is `server/discover`, is modern and
//! goes to the dispatcher untouched. `initialize` starts a legacy session; a message carrying a
//! legacy session (HTTP `Mcp-Session-Id`, or a stdio connection that opened with
//! `initialize`) is legacy. Everything else is modern, exactly as without this module.
//!
//! Every legacy request becomes runtime operations, never legacy branches inside the runtime:
//! most are the modern request with the session's `_meta` added (protocol version,
//! capabilities, client info, log level) and the modern result translated back; core MRTR
//! `input_required` rounds become server-to-client requests whose responses feed the next
//! round; a task-augmented `tools/call` is a modern task creation; `tasks/result` follows the
//! task through `subscriptions/listen`; `tasks/list` is an owner-scoped read of the store:
//!
//! | Legacy message | Runtime operation |
//! |---|---|
//! | `initialize` | none: a signed session id (no store write) |
//! | `notifications/initialized`, `notifications/cancelled` | none (accepted) |
//! | `ping` | none (`{}`) |
//! | `logging/setLevel` | `meta` write of the session state; later calls carry `_meta.logLevel` |
//! | `resources/subscribe`, `resources/unsubscribe` | `meta` write of the session state |
//! | `tools/list` | modern `tools/list`, plus `execution.taskSupport` from each tool's `TaskPolicy` |
//! | `tools/call` | modern `tools/call`; each `input_required` round → server-to-client requests, their responses → the next round's `inputResponses` + `requestState` |
//! | `tools/call` with `params.task` | modern `tools/call` declaring the Tasks extension (durable creation) → nested `CreateTaskResult`; the session follows the task's watcher |
//! | `tasks/get` | modern `tasks/get` → legacy `Task`; the session follows the task's watcher |
//! | `tasks/result` | modern `tasks/get`, then the task's watcher until terminal; input requests on the response stream |
//! | `tasks/list` | `Dispatcher::owned_tasks` (owner-scoped store read, paginated) |
//! | `tasks/cancel` | modern `tasks/get` (terminal → `-32602`), modern `tasks/cancel`, modern `tasks/get` until terminal (at most the cancel grace) |
//! | response to `mcp-tasks/task/{id}/{key}` | modern `tasks/update` with `inputResponses: {key: result}` |
//! | response to `mcp-tasks/call/{n}` | hands the answer to the waiting synchronous call |
//! | `prompts/*`, `resources/list|read|templates/list`, `completion/complete` | the modern method |
//! | `GET` (standing stream, `Last-Event-ID`), `DELETE` | hub read; `meta` write (the record replaced by an `ended` tombstone, the owner's index) |

pub(crate) mod hub;
pub(crate) mod session;
pub(crate) mod sweep;
mod tasks;
pub(crate) mod watch;

use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{StreamExt, future};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use crate::protocol::{Dispatched, RequestContext};
use crate::quota::QuotaError;
use crate::runtime::RuntimeHandle;
use crate::shared::Shared;
use crate::store::WriteOp;
use crate::task::Owner;
use crate::tool::TaskPolicy;
use crate::wire::error::RpcError;
use crate::wire::{self, LogLevel, TASKS_EXTENSION, keys, methods};

pub(crate) use hub::Live;
#[cfg(feature = "http")]
pub(crate) use hub::parse_event_id;
#[cfg(feature = "http")]
pub(crate) use session::SessionError;
pub(crate) use session::{Session, SessionState};

/// The legacy protocol versions this server negotiates, newest first.
pub const LEGACY_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18"];

/// How long a session id is accepted after `initialize`.
const SESSION_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// How long a synchronous call waits for the client to answer one of its input requests.
const INPUT_TIMEOUT: Duration = Duration::from_secs(600);
/// Messages of one legacy request waiting to be written.
const STREAM_BUFFER: usize = 64;
/// The id prefix of server-to-client requests of synchronous calls.
const CALL_REQUEST_PREFIX: &str = "mcp-tasks/call/";
/// The id prefix of server-to-client requests of tasks: `mcp-tasks/task/{taskId}/{key}`.
const TASK_REQUEST_PREFIX: &str = "mcp-tasks/task/";
/// The `_meta` key that ties a message to a task (`2025-11-25` tasks).
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// Whether a message declares the `2026-07-28` era: it is `server/discover`, or its
/// `params._meta` names a protocol version.
pub fn is_modern(message: &Value) -> bool {
    message.get("method").and_then(Value::as_str) == Some(methods::DISCOVER)
        || message
            .pointer("/params/_meta")
            .and_then(Value::as_object)
            .is_some_and(|m| m.contains_key(keys::PROTOCOL_VERSION))
}

/// Whether a message is a legacy `initialize` request.
pub fn is_initialize(message: &Value) -> bool {
    message.get("method").and_then(Value::as_str) == Some("initialize")
        && message.get("id").is_some()
        && !is_modern(message)
}

/// What the adapter sends back for one legacy message.
pub(crate) enum LegacyOutcome {
    /// A notification or a response from the client: nothing (HTTP `202`).
    Accepted,
    /// One JSON-RPC response.
    Reply(Value),
    /// Messages for the request (notifications, server-to-client requests), the response last.
    Stream(BoxStream<'static, Value>),
}

/// The legacy adapter of one runtime.
pub(crate) struct Legacy {
    handle: RuntimeHandle,
    shared: Arc<Shared>,
    #[cfg(feature = "http")]
    codec: session::SessionCodec,
    hub: hub::Hub,
    watchers: Arc<watch::Watchers>,
    /// Writers of session records, one per owner at a time (striped by owner).
    record_locks: Vec<tokio::sync::Mutex<()>>,
    /// Where the sweep of expired session records stopped; one sweep at a time.
    sweep: tokio::sync::Mutex<sweep::Cursors>,
}

impl Legacy {
    pub(crate) fn new(handle: RuntimeHandle) -> Arc<Self> {
        let shared = handle.shared().clone();
        #[cfg(feature = "http")]
        let key = shared
            .request_state
            .derive_key("mcp-tasks legacy session v1");
        let legacy = Arc::new(Self {
            handle,
            #[cfg(feature = "http")]
            codec: session::SessionCodec::new(key),
            hub: hub::Hub::new(shared.quotas.quotas().max_sessions),
            shared,
            watchers: Arc::default(),
            record_locks: (0..32).map(|_| tokio::sync::Mutex::new(())).collect(),
            sweep: tokio::sync::Mutex::default(),
        });
        // Records of sessions whose owner never writes again are deleted by this sweep.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(sweep::sweep_periodically(Arc::downgrade(&legacy)));
        }
        legacy
    }

    /// The in-process state of `owner`'s session, made on first use; refused when the owner
    /// holds [`crate::quota::Quotas::max_sessions`] sessions that are all in use.
    pub(crate) fn live(&self, session: &Session, owner: &Owner) -> Result<Arc<Live>, QuotaError> {
        self.hub.live(&session.nonce, owner, &session.version)
    }

    /// Tasks watched in this process now, and watchers started since this adapter was made.
    #[cfg(test)]
    pub(crate) fn watcher_counts(&self) -> (usize, u64) {
        (self.watchers.active(), self.watchers.started())
    }

    // -----------------------------------------------------------------------------------
    // Sessions

    /// Answers `initialize`: the response and the new session (its id is
    /// [`Legacy::session_id`]). A malformed request is an error response and no session.
    pub(crate) fn initialize(
        &self,
        message: &Value,
        owner: &Owner,
    ) -> Result<(Value, Session), Value> {
        let id = message.get("id").cloned().unwrap_or(Value::Null);
        let params = message.get("params").and_then(Value::as_object);
        let requested = params
            .and_then(|p| p.get("protocolVersion"))
            .and_then(Value::as_str);
        let Some(requested) = requested else {
            return Err(error_response(
                &id,
                &RpcError::invalid_params("`protocolVersion` is required"),
            ));
        };
        let capabilities = match params.and_then(|p| p.get("capabilities")) {
            Some(Value::Object(c)) => c.clone(),
            None => Map::new(),
            Some(_) => {
                return Err(error_response(
                    &id,
                    &RpcError::invalid_params("`capabilities` must be an object"),
                ));
            }
        };
        let client_info = params
            .and_then(|p| p.get("clientInfo"))
            .filter(|i| {
                i.get("name").is_some_and(Value::is_string)
                    && i.get("version").is_some_and(Value::is_string)
            })
            .cloned();
        // Version negotiation (lifecycle of 2025-06-18 and 2025-11-25): a version we speak is
        // echoed, any other gets our latest legacy version.
        let version = LEGACY_VERSIONS
            .iter()
            .find(|v| **v == requested)
            .copied()
            .unwrap_or(LEGACY_VERSIONS[0]);
        let lifetime = u64::try_from(SESSION_LIFETIME.as_millis()).unwrap_or(u64::MAX);
        let session = Session::new(
            owner,
            version,
            capabilities,
            client_info,
            self.shared.now_ms().saturating_add(lifetime),
        );
        let server = &self.shared.config.server_info;
        let mut result = json!({
            "protocolVersion": version,
            "capabilities": self.capabilities(version),
            "serverInfo": { "name": server.name, "version": server.version },
        });
        if let Some(i) = &self.shared.config.instructions {
            result["instructions"] = json!(i);
        }
        tracing::info!(version, principal = %owner.log_id(), "legacy session started");
        Ok((
            json!({ "jsonrpc": "2.0", "id": id, "result": result }),
            session,
        ))
    }

    #[cfg(feature = "http")]
    /// The `Mcp-Session-Id` of a session.
    pub(crate) fn session_id(&self, session: &Session) -> String {
        self.codec.encode(session)
    }

    #[cfg(feature = "http")]
    /// The session of an `Mcp-Session-Id` sent by `owner`, with its current state; any
    /// failure means the session does not exist for this caller (HTTP `404`).
    pub(crate) async fn resolve(
        &self,
        id: &str,
        owner: &Owner,
    ) -> Result<(Session, SessionState), SessionError> {
        let session = self.codec.decode(id, owner, self.shared.now_ms())?;
        let state = self.state(&session).await;
        if state.ended {
            return Err(SessionError::Ended);
        }
        Ok((session, state))
    }

    /// The session's mutable state (defaults when never written or unreadable).
    pub(crate) async fn state(&self, session: &Session) -> SessionState {
        match self.shared.store.meta_get(&session.state_key()).await {
            Ok(Some(bytes)) => SessionState::decode(&bytes).unwrap_or_default(),
            Ok(None) => SessionState::default(),
            Err(e) => {
                tracing::warn!(error = %e, "could not read a legacy session's state");
                SessionState::default()
            }
        }
    }

    /// Changes the session's stored state with `change` (which returns `false` when there is
    /// nothing to write) and keeps the owner's index of session records: expired records go,
    /// a session new to the index is refused past
    /// [`crate::quota::Quotas::max_session_records`] (ended sessions are kept apart, at most
    /// [`session::MAX_ENDED_RECORDS`], the earliest to expire giving way), and a record never
    /// exceeds [`session::MAX_RECORD_BYTES`]. One writer per owner at a time in this process.
    async fn update_state(
        &self,
        session: &Session,
        change: impl FnOnce(&mut SessionState) -> Result<bool, RpcError>,
    ) -> Result<(), RpcError> {
        let index_key = session.index_key();
        let stripe = session::stripe(&index_key, self.record_locks.len());
        let _one_writer = self.record_locks[stripe].lock().await;
        let mut state = self.state(session).await;
        if !change(&mut state)? {
            return Ok(());
        }
        state.expires_at_ms = session.expires_at_ms;
        let value = state.encode();
        if value.len() > session::MAX_RECORD_BYTES {
            return Err(RpcError::invalid_params(format!(
                "a session's settings and subscriptions may take at most {} bytes",
                session::MAX_RECORD_BYTES
            )));
        }
        let mut index = match self.shared.store.meta_get(&index_key).await? {
            Some(bytes) => session::RecordIndex::decode(&bytes),
            None => session::RecordIndex::default(),
        };
        let limit = self.shared.quotas.quotas().max_session_records;
        let gone = index.admit(
            &session.nonce,
            session.expires_at_ms,
            state.ended,
            self.shared.now_ms(),
            limit,
        )?;
        let mut ops: Vec<WriteOp> = gone
            .iter()
            .map(|nonce| WriteOp::DeleteMeta {
                key: session::state_key_of(nonce),
            })
            .collect();
        ops.push(WriteOp::PutMeta {
            key: session.state_key(),
            value,
        });
        ops.push(WriteOp::PutMeta {
            key: index_key,
            value: index.encode(),
        });
        self.shared.store.commit(ops).await?;
        Ok(())
    }

    #[cfg(feature = "http")]
    /// Ends a session (HTTP `DELETE`): its id answers `404` from now on, everywhere. What the
    /// session stored (log level, subscriptions) is deleted; a tombstone of a few bytes says
    /// it ended until the id expires, when it is deleted too.
    pub(crate) async fn end(&self, session: &Session) -> Result<(), RpcError> {
        self.update_state(session, |state| {
            *state = SessionState {
                ended: true,
                ..SessionState::default()
            };
            Ok(true)
        })
        .await?;
        self.hub.end(&session.nonce);
        tracing::info!("legacy session ended");
        Ok(())
    }

    /// Forgets a session's in-process state without ending it (its connection closed).
    pub(crate) fn forget(&self, session: &Session) {
        self.hub.end(&session.nonce);
    }

    /// The capabilities of `initialize`: what is registered, logging, and (from
    /// `2025-11-25`) task-augmented `tools/call` with `tasks/list` and `tasks/cancel`.
    fn capabilities(&self, version: &str) -> Value {
        let catalog = &self.shared.catalog;
        let mut caps = json!({ "tools": { "listChanged": false }, "logging": {} });
        if catalog.has_prompts() {
            caps["prompts"] = json!({ "listChanged": false });
        }
        if catalog.has_resources() {
            caps["resources"] = json!({ "subscribe": true, "listChanged": false });
        }
        if catalog.has_completions() {
            caps["completions"] = json!({});
        }
        if version >= "2025-11-25" {
            caps["tasks"] = json!({
                "list": {}, "cancel": {}, "requests": { "tools": { "call": {} } }
            });
        }
        caps
    }

    // -----------------------------------------------------------------------------------
    // Messages

    /// Handles one legacy message of an established session. `streams` says whether the
    /// transport can send several messages for a request (an HTTP client that accepts
    /// `text/event-stream`, stdio).
    pub(crate) async fn handle(
        self: &Arc<Self>,
        session: &Session,
        state: &SessionState,
        owner: &Owner,
        message: Value,
        streams: bool,
    ) -> LegacyOutcome {
        let method = message
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let id = message.get("id").cloned();
        let Some(method) = method else {
            // A response to one of our requests.
            self.client_response(session, owner, message).await;
            return LegacyOutcome::Accepted;
        };
        let Some(id) = id else {
            tracing::debug!(%method, "legacy notification");
            return LegacyOutcome::Accepted;
        };
        let params = match message.get("params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(p)) => p.clone(),
            Some(_) => {
                return LegacyOutcome::Reply(error_response(
                    &id,
                    &RpcError::invalid_params("`params` must be an object"),
                ));
            }
        };
        let ctx = Call {
            legacy: self.clone(),
            session: session.clone(),
            state: state.clone(),
            owner: owner.clone(),
            id: id.clone(),
            streams,
        };
        let answer = match method.as_str() {
            "initialize" => Err(RpcError::invalid_request(
                "the session is already initialized",
            )),
            "ping" => Ok(json!({})),
            "logging/setLevel" => self.set_level(session, &params).await,
            "resources/subscribe" => self.subscribe(session, &params, true).await,
            "resources/unsubscribe" => self.subscribe(session, &params, false).await,
            "tasks/get" => ctx.get_task(&params).await,
            "tasks/list" => ctx.list_tasks(&params).await,
            "tasks/cancel" => ctx.cancel_task(&params).await,
            "tasks/result" => return ctx.task_result(params).await,
            methods::TOOLS_CALL => return ctx.call_tool(params).await,
            methods::TOOLS_LIST => ctx.list_tools(params).await,
            methods::PROMPTS_GET => return ctx.rounds(methods::PROMPTS_GET, params, false).await,
            methods::PROMPTS_LIST
            | methods::RESOURCES_LIST
            | methods::RESOURCES_TEMPLATES_LIST
            | methods::RESOURCES_READ
            | methods::COMPLETION_COMPLETE => ctx.forward_once(&method, params).await,
            other => Err(RpcError::method_not_found(other)),
        };
        LegacyOutcome::Reply(match answer {
            Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
            Err(e) => error_response(&id, &e),
        })
    }

    async fn set_level(
        &self,
        session: &Session,
        params: &Map<String, Value>,
    ) -> Result<Value, RpcError> {
        let level = params
            .get("level")
            .and_then(Value::as_str)
            .and_then(LogLevel::from_wire)
            .ok_or_else(|| {
                RpcError::invalid_params(
                    "`level` must be one of debug, info, notice, warning, error, critical, \
                     alert, emergency",
                )
            })?;
        self.update_state(session, |state| {
            let level = Some(level.as_str().to_owned());
            let changed = state.log_level != level;
            state.log_level = level;
            Ok(changed)
        })
        .await?;
        Ok(json!({}))
    }

    async fn subscribe(
        &self,
        session: &Session,
        params: &Map<String, Value>,
        on: bool,
    ) -> Result<Value, RpcError> {
        let uri = params
            .get("uri")
            .and_then(Value::as_str)
            .filter(|u| !u.is_empty() && u.len() <= 2048)
            .ok_or_else(|| RpcError::invalid_params("`uri` must be a non-empty string"))?;
        self.update_state(session, |state| {
            let known = state.subscriptions.iter().any(|u| u == uri);
            if on && !known {
                if state.subscriptions.len() >= 256 {
                    return Err(RpcError::invalid_params(
                        "a session may subscribe to at most 256 resources",
                    ));
                }
                state.subscriptions.push(uri.to_owned());
            } else if !on && known {
                state.subscriptions.retain(|u| u != uri);
            } else {
                return Ok(false);
            }
            Ok(true)
        })
        .await?;
        Ok(json!({}))
    }

    /// A response of the client to one of our requests: it answers a synchronous call's
    /// input round (in this process) or a task's input request (any process: the id names
    /// the task and the key, and the answer goes through `tasks/update`).
    async fn client_response(&self, session: &Session, owner: &Owner, message: Value) {
        let Some(id) = message.get("id").and_then(Value::as_str).map(str::to_owned) else {
            tracing::debug!("a client response without a string id ignored");
            return;
        };
        if let Some(rest) = id.strip_prefix(TASK_REQUEST_PREFIX)
            && let Some((task, key)) = rest.split_once('/')
        {
            let live = match self.live(session, owner) {
                Ok(live) => live,
                Err(e) => {
                    tracing::info!(task, key, error = %e, "an answer to a task's input request was not taken");
                    return;
                }
            };
            let Some(result) = message.get("result").filter(|r| r.is_object()) else {
                tracing::info!(task, key, error = %message["error"], "the client refused an input request of a task; it will be asked again");
                live.unmark_sent(task, key);
                return;
            };
            let update = json!({
                "jsonrpc": "2.0", "id": "mcp-tasks/answer", "method": methods::TASKS_UPDATE,
                "params": {
                    "taskId": task,
                    "inputResponses": { key: result },
                    "_meta": modern_meta(session, None, true),
                }
            });
            let ctx = RequestContext::new(owner.clone());
            let outcome = self.handle.dispatch_json(update, &ctx).await;
            if let Some(reply) = outcome.into_reply()
                && let Some(error) = reply.body().get("error")
            {
                tracing::info!(task, key, %error, "an answer to a task's input request was refused");
                live.unmark_sent(task, key);
            }
            return;
        }
        if id.starts_with(CALL_REQUEST_PREFIX) {
            if !self
                .live(session, owner)
                .is_ok_and(|live| live.respond(&id, message))
            {
                tracing::debug!(%id, "a response for a request nobody waits for ignored");
            }
            return;
        }
        tracing::debug!(%id, "a response to an unknown request ignored");
    }
}

/// One legacy request being handled.
struct Call {
    legacy: Arc<Legacy>,
    session: Session,
    state: SessionState,
    owner: Owner,
    id: Value,
    streams: bool,
}

/// The modern `_meta` of a request made on behalf of a legacy session.
fn modern_meta(session: &Session, state: Option<&SessionState>, tasks: bool) -> Value {
    let mut caps = session.capabilities.clone();
    if tasks {
        let ext = caps
            .entry("extensions")
            .or_insert_with(|| Value::Object(Map::new()));
        if !ext.is_object() {
            *ext = Value::Object(Map::new());
        }
        if let Some(ext) = ext.as_object_mut() {
            ext.insert(TASKS_EXTENSION.to_owned(), json!({}));
        }
    } else if let Some(ext) = caps.get_mut("extensions").and_then(Value::as_object_mut) {
        ext.remove(TASKS_EXTENSION);
    }
    if caps.get("extensions").is_some_and(|e| !e.is_object()) {
        caps.remove("extensions");
    }
    let mut meta = Map::new();
    meta.insert(keys::PROTOCOL_VERSION.into(), json!(wire::PROTOCOL_VERSION));
    meta.insert(keys::CLIENT_CAPABILITIES.into(), Value::Object(caps));
    if let Some(info) = &session.client_info {
        meta.insert(keys::CLIENT_INFO.into(), info.clone());
    }
    if let Some(level) = state.and_then(SessionState::level) {
        meta.insert(keys::LOG_LEVEL.into(), json!(level.as_str()));
    }
    Value::Object(meta)
}

fn error_response(id: &Value, error: &RpcError) -> Value {
    wire::jsonrpc::error_response(Some(id), error)
}

/// A modern result as a legacy one: without `resultType`, the cache hints (`ttlMs` with
/// `cacheScope`; a task's own `ttlMs` stays) and the server's identity in `_meta` (legacy
/// clients have it from `initialize`).
fn legacy_result(mut result: Value) -> Value {
    if let Some(r) = result.as_object_mut() {
        r.remove("resultType");
        if r.remove("cacheScope").is_some() {
            r.remove("ttlMs");
        }
        let empty_meta = match r.get_mut("_meta").and_then(Value::as_object_mut) {
            Some(meta) => {
                meta.remove(keys::SERVER_INFO);
                meta.is_empty()
            }
            None => false,
        };
        if empty_meta {
            r.remove("_meta");
        }
    }
    result
}

/// A modern JSON-RPC response as a legacy one (results translated, errors as they are).
fn legacy_response(mut response: Value) -> Value {
    if let Some(result) = response.get_mut("result") {
        *result = legacy_result(result.take());
    }
    response
}

/// An `InputRequest` (`{method, params}`) as the server-to-client request `id` of a session
/// of `version`, tied to `task` if any.
fn server_request(id: &str, request: &Value, version: &str, task: Option<&str>) -> Value {
    let method = request.get("method").cloned().unwrap_or(Value::Null);
    let mut params = request
        .get("params")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if version < "2025-11-25" && method == "elicitation/create" {
        // The elicitation `mode` arrived with 2025-11-25; older clients only know forms.
        params.remove("mode");
    }
    if let Some(task) = task {
        let meta = params
            .entry("_meta")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(meta) = meta.as_object_mut() {
            meta.insert(RELATED_TASK.into(), json!({ "taskId": task }));
        }
    }
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

/// The final JSON-RPC response among the messages of a modern outcome, sending the others
/// (request-scoped notifications) to `out`.
async fn final_response(outcome: Dispatched, out: Option<&mpsc::Sender<Value>>) -> Value {
    match outcome {
        Dispatched::Reply(reply) => reply.into_body(),
        Dispatched::Accepted => json!({ "jsonrpc": "2.0", "result": {} }),
        Dispatched::Stream(mut stream) => {
            let mut last = Value::Null;
            while let Some(message) = stream.next().await {
                if message.get("method").is_some() {
                    if let Some(out) = out {
                        let _ = out.send(message).await;
                    }
                } else {
                    last = message;
                }
            }
            last
        }
    }
}

impl Call {
    fn ctx(&self, streams: bool) -> RequestContext {
        RequestContext::new(self.owner.clone()).with_streams(streams)
    }

    /// The modern request `method` with `params` and the session's `_meta`.
    fn modern(&self, method: &str, mut params: Map<String, Value>, tasks: bool) -> Value {
        let mut meta = modern_meta(&self.session, Some(&self.state), tasks);
        // Keep the client's own `_meta` (a progress token) under ours.
        if let Some(Value::Object(theirs)) = params.remove("_meta")
            && let Some(m) = meta.as_object_mut()
        {
            for (k, v) in theirs {
                m.entry(k).or_insert(v);
            }
        }
        params.insert("_meta".into(), meta);
        json!({ "jsonrpc": "2.0", "id": self.id, "method": method, "params": params })
    }

    /// A request answered with one modern response.
    async fn forward_once(
        &self,
        method: &str,
        params: Map<String, Value>,
    ) -> Result<Value, RpcError> {
        let request = self.modern(method, params, false);
        let response = final_response(
            self.legacy
                .handle
                .dispatch_json(request, &self.ctx(false))
                .await,
            None,
        )
        .await;
        into_result(response)
    }

    /// `tools/list` with each tool's `execution.taskSupport`.
    async fn list_tools(&self, params: Map<String, Value>) -> Result<Value, RpcError> {
        let mut result = self.forward_once(methods::TOOLS_LIST, params).await?;
        if let Some(tools) = result.get_mut("tools").and_then(Value::as_array_mut) {
            for tool in tools {
                let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
                let support = match self
                    .legacy
                    .shared
                    .tools
                    .get(name)
                    .map(|t| t.descriptor().task_policy)
                {
                    Some(TaskPolicy::Always) => "required",
                    Some(TaskPolicy::WhenSupported) => "optional",
                    _ => "forbidden",
                };
                if let Some(t) = tool.as_object_mut() {
                    t.insert("execution".into(), json!({ "taskSupport": support }));
                }
            }
        }
        Ok(result)
    }

    /// `tools/call`: task-augmented (`params.task`) or synchronous, with the tool's task
    /// support checked as 2025-11-25 requires.
    async fn call_tool(self, mut params: Map<String, Value>) -> LegacyOutcome {
        let task = params.remove("task");
        let as_task = task.is_some() && self.session.version.as_str() >= "2025-11-25";
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let policy = self
            .legacy
            .shared
            .tools
            .get(name)
            .map(|t| t.descriptor().task_policy);
        let refusal = match (policy, as_task) {
            (Some(TaskPolicy::Never), true) => Some(format!(
                "tool `{name}` does not support task-augmented calls (execution.taskSupport is \"forbidden\")"
            )),
            (Some(TaskPolicy::Always), false) => Some(format!(
                "tool `{name}` must be called as a task (execution.taskSupport is \"required\")"
            )),
            _ => None,
        };
        if let Some(message) = refusal {
            let error = RpcError::new(crate::wire::error::code::METHOD_NOT_FOUND, message);
            return LegacyOutcome::Reply(error_response(&self.id, &error));
        }
        self.rounds(methods::TOOLS_CALL, params, as_task).await
    }

    /// A request that may take several core MRTR rounds: every `input_required` round
    /// becomes server-to-client requests, and their responses feed the next round. A task
    /// handle becomes a legacy `CreateTaskResult`.
    async fn rounds(self, method: &str, params: Map<String, Value>, tasks: bool) -> LegacyOutcome {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let method = method.to_owned();
        let id = self.id.clone();
        tokio::spawn(async move {
            let response = match self.run_rounds(&method, params, tasks, &tx).await {
                Ok(response) => response,
                Err(e) => error_response(&id, &e),
            };
            let _ = tx.send(response).await;
        });
        one_or_stream(rx).await
    }

    async fn run_rounds(
        &self,
        method: &str,
        mut params: Map<String, Value>,
        tasks: bool,
        out: &mpsc::Sender<Value>,
    ) -> Result<Value, RpcError> {
        let live = self.legacy.live(&self.session, &self.owner)?;
        let mut ended = live.ended.subscribe();
        loop {
            let request = self.modern(method, params.clone(), tasks);
            let outcome = self
                .legacy
                .handle
                .dispatch_json(request, &self.ctx(self.streams))
                .await;
            let response = final_response(outcome, Some(out)).await;
            let result = match response.get("result") {
                Some(r) => r,
                None => return Ok(response),
            };
            match result.get("resultType").and_then(Value::as_str) {
                Some("input_required") => {}
                Some("task") => {
                    let task = tasks::legacy_task(result);
                    if let Some(task_id) = result.get("taskId").and_then(Value::as_str) {
                        self.legacy.watch(&self.session, &self.owner, task_id);
                    }
                    return Ok(
                        json!({ "jsonrpc": "2.0", "id": self.id, "result": { "task": task } }),
                    );
                }
                _ => return Ok(legacy_response(response)),
            }
            if !self.streams {
                return Err(RpcError::invalid_request(
                    "this request needs input from the client, which requires a response \
                     stream: accept text/event-stream",
                ));
            }
            let (responses, state) = self.ask_client(&live, result, out, &mut ended).await?;
            params.insert("inputResponses".into(), Value::Object(responses));
            match state {
                Some(s) => params.insert("requestState".into(), s),
                None => params.remove("requestState"),
            };
        }
    }

    /// Sends one round's input requests to the client as server-to-client requests and
    /// collects its answers: the `inputResponses` of the next round, and its `requestState`.
    async fn ask_client(
        &self,
        live: &Live,
        result: &Value,
        out: &mpsc::Sender<Value>,
        ended: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<(Map<String, Value>, Option<Value>), RpcError> {
        let requests = result
            .get("inputRequests")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let state = result.get("requestState").cloned();
        let mut waits = Vec::new();
        let mut keys = Vec::new();
        for (key, request) in &requests {
            let (rid, rx) = live.expect_response(CALL_REQUEST_PREFIX);
            let message = server_request(&rid, request, &self.session.version, None);
            if out.send(message).await.is_err() {
                live.forget_request(&rid);
                return Err(RpcError::internal("the client went away"));
            }
            keys.push((key.clone(), rid));
            waits.push(rx);
        }
        let answered = tokio::select! {
            answers = tokio::time::timeout(INPUT_TIMEOUT, future::join_all(waits)) => answers,
            _ = ended.wait_for(|e| *e) => {
                return Err(RpcError::invalid_request("the session ended"));
            }
        };
        let Ok(answers) = answered else {
            for (_, rid) in &keys {
                live.forget_request(rid);
            }
            return Err(RpcError::internal(format!(
                "the client did not answer the input requests within {} s",
                INPUT_TIMEOUT.as_secs()
            )));
        };
        let mut responses = Map::new();
        for ((key, _), answer) in keys.into_iter().zip(answers) {
            let Ok(message) = answer else {
                return Err(RpcError::invalid_request("the session ended"));
            };
            match message.get("result") {
                Some(result) if result.is_object() => {
                    responses.insert(key, result.clone());
                }
                _ => {
                    let error = message.get("error").cloned().unwrap_or(Value::Null);
                    return Err(RpcError::internal(format!(
                        "the client refused the input request `{key}`: {error}"
                    )));
                }
            }
        }
        Ok((responses, state))
    }

    /// `tasks/get` etc. share the modern `tasks/get` as their first step.
    async fn modern_get(&self, task: &str) -> Result<Value, RpcError> {
        let mut params = Map::new();
        params.insert("taskId".into(), json!(task));
        let request = self.modern(methods::TASKS_GET, params, true);
        let response = final_response(
            self.legacy
                .handle
                .dispatch_json(request, &self.ctx(false))
                .await,
            None,
        )
        .await;
        into_result(response)
    }
}

/// The result of a JSON-RPC response, or its error.
fn into_result(response: Value) -> Result<Value, RpcError> {
    if let Some(result) = response.get("result") {
        return Ok(legacy_result(result.clone()));
    }
    let error = response.get("error").cloned().unwrap_or(Value::Null);
    let code = error
        .get("code")
        .and_then(Value::as_i64)
        .unwrap_or(crate::wire::error::code::INTERNAL_ERROR);
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("the request failed")
        .to_owned();
    let mut e = RpcError::new(code, message);
    e.data = error.get("data").cloned();
    Err(e)
}

/// One response when the request produced just that, a stream otherwise.
async fn one_or_stream(mut rx: mpsc::Receiver<Value>) -> LegacyOutcome {
    let Some(first) = rx.recv().await else {
        return LegacyOutcome::Reply(json!({
            "jsonrpc": "2.0", "id": null,
            "error": { "code": crate::wire::error::code::INTERNAL_ERROR, "message": "the request ended without a response" }
        }));
    };
    if first.get("method").is_none() {
        return LegacyOutcome::Reply(first);
    }
    let rest = futures::stream::unfold(rx, |mut rx| async move {
        let message = rx.recv().await?;
        Some((message, rx))
    });
    LegacyOutcome::Stream(
        futures::stream::once(async move { first })
            .chain(rest)
            .boxed(),
    )
}

#[cfg(test)]
mod runtime_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_lose_modern_fields_but_tasks_keep_their_ttl() {
        let list = json!({ "resultType": "complete", "tools": [], "ttlMs": 300000,
            "cacheScope": "public", "_meta": { keys::SERVER_INFO: {} } });
        assert_eq!(legacy_result(list), json!({ "tools": [] }));
        let task = json!({ "resultType": "complete", "taskId": "t", "ttlMs": 60000,
            "_meta": { keys::SERVER_INFO: {}, "other": 1 } });
        assert_eq!(
            legacy_result(task),
            json!({ "taskId": "t", "ttlMs": 60000, "_meta": { "other": 1 } })
        );
    }

    #[test]
    fn era_detection() {
        let modern = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list",
            "params": { "_meta": { keys::PROTOCOL_VERSION: "2026-07-28" } } });
        assert!(is_modern(&modern));
        assert!(is_modern(
            &json!({ "jsonrpc": "2.0", "id": 1, "method": "server/discover" })
        ));
        let init = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": { "protocolVersion": "2025-11-25" } });
        assert!(!is_modern(&init) && is_initialize(&init));
        let note = json!({ "jsonrpc": "2.0", "method": "initialize" });
        assert!(!is_initialize(&note));
    }

    #[test]
    fn server_requests_fit_the_session_version() {
        let ask = json!({ "method": "elicitation/create",
            "params": { "mode": "form", "message": "m", "requestedSchema": {} } });
        let old = server_request("r1", &ask, "2025-06-18", None);
        assert!(old["params"].get("mode").is_none());
        let new = server_request("r1", &ask, "2025-11-25", Some("tsk_1"));
        assert_eq!(new["params"]["mode"], "form");
        assert_eq!(new["params"]["_meta"][RELATED_TASK]["taskId"], "tsk_1");
        assert_eq!(new["id"], "r1");
    }
}
