//! An upstream on Streamable HTTP, either era.
//!
//! The gateway first asks `server/discover` (MCP `2026-07-28`): a server that answers it is
//! called statelessly, each request carrying its `_meta`; an input request comes back as an
//! `input_required` result (core MRTR) and is asked of the task's client, then the call is
//! repeated with the answers; a server with the Tasks extension runs the call as its own task,
//! which the gateway records and follows (and, after a restart, follows again rather than
//! calling twice). Any other answer means a `2025-11-25` server: `initialize`, an
//! `Mcp-Session-Id` session, each call a `POST` whose event stream carries its progress and
//! the server's requests, answered by `POST`s of their responses.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use reqwest::StatusCode;
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};
use tokio::sync::{Notify, oneshot};

use super::config::{Upstream, UpstreamEra};
use super::error::UpstreamError;
use super::link::{self, CallError, CallSpec, Inbound, Link, Reply};
use super::rounds::{self, Position, Round};
use crate::client::transport::SseStream;
use crate::tool::ToolError;
use crate::wire::{PROTOCOL_VERSION, TASKS_EXTENSION, keys};

/// Largest JSON response body read.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// Which revision the upstream speaks.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Era {
    /// `2026-07-28`: stateless; whether it has the Tasks extension.
    Stateless { tasks: bool },
    /// `2025-11-25` (or the revision `initialize` settled on) with a session; whether it runs
    /// tool calls as tasks.
    Session { version: String, tasks: bool },
}

/// A connection to an HTTP upstream.
pub(crate) struct HttpLink {
    upstream: String,
    url: String,
    /// For every request but a session-era call: a read waiting longer than the timeout fails.
    client: reqwest::Client,
    /// For a session-era call's POST: its stream is silent while the task waits for its
    /// client's input, or when the server sends the call's progress on the standalone stream;
    /// `link::drive` watches the call's silence instead.
    call_client: reqwest::Client,
    headers: HeaderMap,
    timeout: Duration,
    era: Era,
    session: Mutex<Option<String>>,
    next_id: AtomicU64,
    refresh: Arc<Notify>,
    /// The calls in flight by request id (= progress token): some servers send a call's
    /// progress on the session's standalone stream rather than the call's own.
    calls: Mutex<std::collections::HashMap<u64, link::InboundTx>>,
    /// Cancelled when the link is dropped: its standalone stream then closes.
    stop: tokio_util::sync::CancellationToken,
    /// How long the upstream keeps a round's `requestState` (stateless era).
    state_ttl: Option<Duration>,
    /// A stateless link of an upstream that may also speak `2025-11-25` (`--upstream-era
    /// auto`): the session its tools that ask for input imperatively are called in.
    fallback: Option<Fallback>,
}

/// The `2025-11-25` session of a dual-era upstream, opened when a tool first needs it.
struct Fallback {
    config: Upstream,
    url: String,
    refresh: Arc<Notify>,
    link: tokio::sync::OnceCell<Arc<HttpLink>>,
    /// The tools that refused to ask for input on a stateless call.
    tools: Mutex<std::collections::BTreeSet<String>>,
}

impl Drop for HttpLink {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// What one POST brought back.
enum Reply1 {
    Accepted,
    Message(Value),
    Stream(SseStream),
    /// 404 on a request with a session: the server forgot it.
    SessionGone,
}

impl HttpLink {
    /// Finds the upstream's era (or takes the configured one) and, for a session-era server,
    /// opens a session.
    pub(crate) async fn connect(
        config: &Upstream,
        url: &str,
        refresh: Arc<Notify>,
    ) -> Result<Arc<Self>, UpstreamError> {
        let mut link = Self::new(config, url, refresh.clone())?;
        let stateless = match config.era {
            UpstreamEra::Session => None,
            _ => link.discover().await?,
        };
        match stateless {
            Some(tasks) => {
                link.era = Era::Stateless { tasks };
                if config.era == UpstreamEra::Auto {
                    link.fallback = Some(Fallback {
                        config: config.clone(),
                        url: url.to_owned(),
                        refresh,
                        link: tokio::sync::OnceCell::new(),
                        tools: Mutex::new(std::collections::BTreeSet::new()),
                    });
                }
            }
            None if config.era == UpstreamEra::Stateless => {
                return Err(link.protocol(
                    "it does not answer server/discover as a 2026-07-28 server (--upstream-era 2026-07-28)",
                ));
            }
            None => link.open_session().await?,
        }
        Ok(link.start())
    }

    /// A `2025-11-25` session with the upstream, whatever else it speaks.
    async fn connect_session(
        config: &Upstream,
        url: &str,
        refresh: Arc<Notify>,
    ) -> Result<Arc<Self>, UpstreamError> {
        let mut link = Self::new(config, url, refresh)?;
        link.open_session().await?;
        Ok(link.start())
    }

    async fn open_session(&mut self) -> Result<(), UpstreamError> {
        self.era = Era::Session {
            version: link::SESSION_VERSION.into(),
            tasks: false,
        };
        let (version, tasks) = self.initialize().await?;
        self.era = Era::Session { version, tasks };
        Ok(())
    }

    /// The connected link; a session's standalone stream followed.
    fn start(self) -> Arc<Self> {
        let link = Arc::new(self);
        if matches!(link.era, Era::Session { .. }) {
            let stop = link.stop.clone();
            let weak = Arc::downgrade(&link);
            tokio::spawn(async move {
                tokio::select! {
                    () = listen(weak) => {}
                    () = stop.cancelled() => {}
                }
            });
        }
        tracing::info!(upstream = %link.upstream, era = link.era(), "upstream connected");
        link
    }

    fn new(config: &Upstream, url: &str, refresh: Arc<Notify>) -> Result<Self, UpstreamError> {
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            // Checked by `Upstream::check`.
            if let (Ok(n), Ok(mut v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                v.set_sensitive(true);
                headers.append(n, v);
            }
        }
        // The upstream's timeout is a bound on its silence, not on a call's length: a read
        // that waits longer fails (a call's stream is also watched by `link::drive`).
        let build = |read_timeout: Option<Duration>| {
            // Streamable HTTP needs no redirect: following one would hand the headers, the
            // session and the tenant's request to another origin.
            let mut builder = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(Duration::from_secs(10).min(config.timeout))
                .user_agent(concat!("mcp-tasks-gateway/", env!("CARGO_PKG_VERSION")));
            if let Some(t) = read_timeout {
                builder = builder.read_timeout(t);
            }
            builder.build().map_err(|e| UpstreamError::Unreachable {
                upstream: config.name.clone(),
                reason: format!("cannot set up an HTTP client: {e}"),
            })
        };
        Ok(Self {
            upstream: config.name.clone(),
            url: url.to_owned(),
            client: build(Some(config.timeout))?,
            call_client: build(None)?,
            headers,
            timeout: config.timeout,
            era: Era::Stateless { tasks: false },
            session: Mutex::new(None),
            next_id: AtomicU64::new(1),
            refresh,
            calls: Mutex::new(std::collections::HashMap::new()),
            stop: tokio_util::sync::CancellationToken::new(),
            state_ttl: config.state_ttl,
            fallback: None,
        })
    }

    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn unreachable(&self, e: &reqwest::Error) -> UpstreamError {
        if e.is_timeout() && !e.is_connect() {
            return UpstreamError::Timeout {
                upstream: self.upstream.clone(),
                seconds: self.timeout.as_secs_f64(),
            };
        }
        let mut reason = if e.is_connect() {
            "the connection failed".to_owned()
        } else if e.is_timeout() {
            "the request timed out".to_owned()
        } else {
            "the request failed".to_owned()
        };
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            if let Some(io) = s.downcast_ref::<std::io::Error>() {
                reason = match io.kind() {
                    std::io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
                    kind => format!("{reason} ({kind})"),
                };
                break;
            }
            source = s.source();
        }
        // A connect error means the request was never sent (reqwest only reports a failure
        // to connect as such); anything else may have reached the upstream.
        if e.is_connect() {
            UpstreamError::NotSent {
                upstream: self.upstream.clone(),
                reason,
            }
        } else {
            UpstreamError::Unreachable {
                upstream: self.upstream.clone(),
                reason,
            }
        }
    }

    /// `server/discover`: `Some(has_tasks)` from a `2026-07-28` server, `None` from any other.
    async fn discover(&self) -> Result<Option<bool>, UpstreamError> {
        let message = self.stateless_message(self.id(), "server/discover", Map::new(), false);
        let reply = match self.post(&message, None).await {
            Ok(reply) => reply,
            Err(UpstreamError::Http { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Ok(response) = self.response_of(reply, &message["id"]).await else {
            return Ok(None);
        };
        let Ok(result) = link::decode(&self.upstream, response) else {
            return Ok(None);
        };
        let modern = result
            .get("supportedVersions")
            .and_then(Value::as_array)
            .is_some_and(|v| v.iter().any(|v| v == PROTOCOL_VERSION));
        Ok(modern.then(|| {
            result
                .pointer("/capabilities/extensions")
                .and_then(|e| e.get(TASKS_EXTENSION))
                .is_some()
        }))
    }

    /// `initialize` and `notifications/initialized`; returns the negotiated revision and
    /// whether the server runs tool calls as tasks.
    async fn initialize(&self) -> Result<(String, bool), UpstreamError> {
        *lock(&self.session) = None;
        let message = link::initialize_request(self.id());
        let reply = self.post(&message, None).await?;
        let session = match &reply {
            (_, Some(session)) => Some(session.clone()),
            _ => None,
        };
        let result = link::decode(
            &self.upstream,
            self.response_of(reply, &message["id"]).await?,
        )?;
        *lock(&self.session) = session;
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or(link::SESSION_VERSION)
            .to_owned();
        let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        self.post(&initialized, Some(&version)).await?;
        Ok((version, link::runs_tools_as_tasks(&result)))
    }

    /// One POST: the reply and the session id the server set, if any.
    async fn post(
        &self,
        message: &Value,
        version: Option<&str>,
    ) -> Result<(Reply1, Option<String>), UpstreamError> {
        self.post_via(&self.client, self.timeout, message, version)
            .await
    }

    /// One POST with `client`, its event stream failing after `idle` without a byte.
    async fn post_via(
        &self,
        client: &reqwest::Client,
        idle: Duration,
        message: &Value,
        version: Option<&str>,
    ) -> Result<(Reply1, Option<String>), UpstreamError> {
        let mut request = client
            .post(&self.url)
            .headers(self.headers.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream");
        let session = lock(&self.session).clone();
        match &self.era {
            Era::Stateless { .. } => {
                request = request.header("MCP-Protocol-Version", PROTOCOL_VERSION);
                if let Some(method) = message.get("method").and_then(Value::as_str) {
                    request = request.header("Mcp-Method", method);
                    let name = crate::wire::methods::named_member(method)
                        .and_then(|m| message.get("params").and_then(|p| p.get(m)))
                        .and_then(Value::as_str);
                    if let Some(name) = name {
                        request = request
                            .header("Mcp-Name", crate::client::transport::header_value(name));
                    }
                }
            }
            Era::Session { version: v, .. } => {
                if let Some(v) = version.or(session.as_ref().map(|_| v.as_str())) {
                    request = request.header("MCP-Protocol-Version", v);
                }
                if let Some(s) = &session {
                    request = request.header("Mcp-Session-Id", s);
                }
            }
        }
        // A request that does no work (discovery, `tools/list`, a notification…) also has a
        // total deadline: bytes dripped slower than the read timeout cannot hold it open. A
        // call, or a task's polling, is bounded by its silence instead.
        let method = message.get("method").and_then(Value::as_str);
        if message.get("id").is_none()
            || matches!(
                method,
                Some("server/discover" | "initialize" | "tools/list" | "ping")
            )
        {
            request = request.timeout(self.timeout);
        }
        let response = request
            .body(message.to_string())
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        let set_session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if status == StatusCode::ACCEPTED {
            return Ok((Reply1::Accepted, set_session));
        }
        if status == StatusCode::NOT_FOUND && session.is_some() {
            return Ok((Reply1::SessionGone, set_session));
        }
        let is_sse = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        if status.is_success() && is_sse {
            let url = self.upstream.clone();
            let seconds = self.timeout.as_secs_f64();
            let chunks = response.bytes_stream().map(move |r| {
                r.map_err(|e| {
                    if e.is_timeout() {
                        crate::client::ClientError::Timeout {
                            url: url.clone(),
                            seconds,
                        }
                    } else {
                        crate::client::ClientError::Io {
                            url: url.clone(),
                            reason: "the event stream broke".into(),
                            source: None,
                        }
                    }
                })
            });
            return Ok((
                Reply1::Stream(
                    SseStream::new(chunks.boxed(), idle, self.upstream.clone())
                        .max_event(MAX_BODY)
                        .comments_are_activity(false),
                ),
                set_session,
            ));
        }
        let body = self.body(response).await?;
        // A forgotten session is 404 (the binding's rule); some servers answer 400 naming it.
        if status == StatusCode::BAD_REQUEST
            && session.is_some()
            && String::from_utf8_lossy(&body)
                .to_ascii_lowercase()
                .contains("session")
        {
            return Ok((Reply1::SessionGone, set_session));
        }
        if let Ok(value) = serde_json::from_slice::<Value>(&body)
            && value.get("jsonrpc").is_some()
        {
            return Ok((Reply1::Message(value), set_session));
        }
        if !status.is_success() {
            let hint = (status == StatusCode::NOT_FOUND)
                .then(|| super::error::not_found_hint(&self.url))
                .flatten();
            if hint.is_some()
                && let Some(url) = super::error::suggested_url(&self.url)
            {
                tracing::warn!(upstream = %self.upstream, suggestion = %url,
                    "the upstream answered HTTP 404 and its URL has no path: did you mean {url}?");
            }
            return Err(UpstreamError::Http {
                upstream: self.upstream.clone(),
                status: status.as_u16(),
                hint,
            });
        }
        Err(UpstreamError::Protocol {
            upstream: self.upstream.clone(),
            reason: format!("HTTP {status} with a body that is not JSON-RPC"),
        })
    }

    async fn body(&self, mut response: reqwest::Response) -> Result<Vec<u8>, UpstreamError> {
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| self.unreachable(&e))? {
            if body.len() + chunk.len() > MAX_BODY {
                return Err(UpstreamError::Protocol {
                    upstream: self.upstream.clone(),
                    reason: format!("a response over {MAX_BODY} bytes"),
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// The response to request `id` in what a POST brought back (other messages on its
    /// stream are taken as the standalone stream's: [`Self::standalone`]).
    async fn response_of(
        &self,
        reply: (Reply1, Option<String>),
        id: &Value,
    ) -> Result<Value, UpstreamError> {
        match reply.0 {
            Reply1::Message(m) => Ok(m),
            Reply1::Stream(mut s) => {
                while let Some(m) = s.next().await {
                    let m = m.map_err(|e| stream_error(&self.upstream, self.timeout, e))?;
                    if m.get("id") == Some(id) && m.get("method").is_none() {
                        return Ok(m);
                    }
                    self.standalone(&m);
                }
                Err(self.ended())
            }
            Reply1::Accepted => Err(UpstreamError::Protocol {
                upstream: self.upstream.clone(),
                reason: "a request was accepted without an answer".into(),
            }),
            Reply1::SessionGone => Err(UpstreamError::Http {
                upstream: self.upstream.clone(),
                status: 404,
                hint: None,
            }),
        }
    }

    fn ended(&self) -> UpstreamError {
        UpstreamError::Unreachable {
            upstream: self.upstream.clone(),
            reason: "the response stream ended without the response".into(),
        }
    }

    /// A message on the session's standalone stream: a changed tool list, or progress of a
    /// call in flight (by its token).
    fn standalone(&self, message: &Value) {
        match message.get("method").and_then(Value::as_str) {
            Some("notifications/tools/list_changed") => self.refresh.notify_one(),
            Some("notifications/progress") => {
                let params = message.get("params").cloned().unwrap_or_default();
                let token = params.get("progressToken").and_then(Value::as_u64);
                if let (Some(token), Some(event)) = (token, Inbound::progress(&params))
                    && let Some(call) = lock(&self.calls).get(&token)
                {
                    let _ = call.send(event);
                }
            }
            Some(m) => {
                tracing::debug!(upstream = %self.upstream, method = m, "upstream message ignored")
            }
            None => {}
        }
    }

    /// A session-era request; on a forgotten session, a new one and the request again (it
    /// did not run: the server refused it unknown).
    async fn session_request(&self, make: impl Fn(u64) -> Value) -> Result<Value, UpstreamError> {
        for _ in 0..2 {
            let message = make(self.id());
            let reply = self.post(&message, None).await?;
            if matches!(reply.0, Reply1::SessionGone) {
                tracing::info!(upstream = %self.upstream, "upstream session expired; initializing again");
                self.initialize().await?;
                continue;
            }
            let response = self.response_of(reply, &message["id"]).await?;
            return link::decode(&self.upstream, response);
        }
        Err(UpstreamError::Http {
            upstream: self.upstream.clone(),
            status: 404,
            hint: None,
        })
    }

    /// A `2026-07-28` request with its `_meta`.
    fn stateless_message(
        &self,
        id: u64,
        method: &str,
        mut params: Map<String, Value>,
        tasks: bool,
    ) -> Value {
        let mut capabilities = json!({ "elicitation": { "form": {} }, "sampling": {} });
        if tasks {
            capabilities["extensions"] = json!({ (TASKS_EXTENSION): {} });
        }
        params.insert(
            "_meta".into(),
            json!({
                (keys::PROTOCOL_VERSION): PROTOCOL_VERSION,
                (keys::CLIENT_CAPABILITIES): capabilities,
                (keys::CLIENT_INFO): { "name": "mcp-tasks-gateway", "version": env!("CARGO_PKG_VERSION") },
            }),
        );
        json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
    }

    async fn stateless_request(
        &self,
        method: &str,
        params: Map<String, Value>,
        tasks: bool,
    ) -> Result<Value, UpstreamError> {
        let message = self.stateless_message(self.id(), method, params, tasks);
        let reply = self.post(&message, None).await?;
        let response = self.response_of(reply, &message["id"]).await?;
        link::decode(&self.upstream, response)
    }

    async fn request(
        &self,
        method: &str,
        params: Map<String, Value>,
    ) -> Result<Value, UpstreamError> {
        match self.era {
            Era::Stateless { .. } => self.stateless_request(method, params, false).await,
            Era::Session { .. } => {
                self.session_request(
                    |id| json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }),
                )
                .await
            }
        }
    }

    /// A session-era request driven to its response (`link::drive`): its POST's stream
    /// pumped into the request's events.
    async fn session_drive(
        &self,
        method: &str,
        params: Value,
        hooks: &dyn link::Hooks,
        timeout: Duration,
    ) -> Result<Value, CallError> {
        let mut attempt = 0;
        let (id, reply) = loop {
            let id = self.id();
            let mut params = params.clone();
            params["_meta"] = json!({ "progressToken": id });
            let message = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
            let reply = self
                .post_via(&self.call_client, UNBOUNDED_IDLE, &message, None)
                .await?;
            if matches!(reply.0, Reply1::SessionGone) && attempt == 0 {
                attempt += 1;
                self.initialize().await?;
                continue;
            }
            break (id, reply);
        };
        let (tx, rx) = oneshot::channel();
        let (events_tx, events) = link::inbound();
        lock(&self.calls).insert(id, events_tx.clone());
        let _forget = Forget { link: self, id };
        match reply.0 {
            Reply1::Stream(mut stream) => {
                let key = json!(id);
                let me = self.upstream.clone();
                let timeout = self.timeout;
                let refresh = self.refresh.clone();
                tokio::spawn(async move {
                    let mut tx = Some(tx);
                    while let Some(m) = stream.next().await {
                        let m = match m {
                            Ok(m) => m,
                            Err(e) => {
                                if let Some(tx) = tx.take() {
                                    let _ = tx.send(Err(stream_error(&me, timeout, e)));
                                }
                                break;
                            }
                        };
                        if m.get("id") == Some(&key) && m.get("method").is_none() {
                            if let Some(tx) = tx.take() {
                                let _ = tx.send(Ok(m));
                            }
                            break;
                        }
                        route_detached(&me, &refresh, &m, &events_tx);
                    }
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(Err(UpstreamError::Unreachable {
                            upstream: me,
                            reason: "the response stream ended without the response".into(),
                        }));
                    }
                });
            }
            other => {
                let response = self.response_of((other, None), &json!(id)).await;
                let _ = tx.send(response);
            }
        }
        link::drive(&self.upstream, self, id, rx, events, hooks, timeout).await
    }

    /// A stateless call: core MRTR rounds (each `input_required` result recorded before its
    /// input is asked, so a later run resumes there: [`rounds`]), or the upstream's own task
    /// followed to its end.
    async fn stateless_call(&self, spec: CallSpec<'_>, tasks: bool) -> Result<Value, CallError> {
        let hooks = spec.hooks;
        let as_task = tasks && hooks.is_task();
        if hooks.is_task()
            && let Some(task_id) = hooks.upstream_task()
        {
            tracing::info!(upstream = %self.upstream, task = ?task_id, "following the upstream task again");
            return self.follow(&task_id, hooks).await;
        }
        let mut params = Map::new();
        params.insert("name".into(), json!(spec.name));
        params.insert("arguments".into(), Value::Object(spec.arguments));
        let (mut epoch, mut number) = match rounds::position(hooks) {
            Position::Fresh { epoch } => (epoch, 1),
            // The crash rule let the call run again: from round 1, apart from the last run's.
            Position::Sent { epoch } => (epoch + 1, 1),
            Position::Waiting { epoch, round } => {
                tracing::info!(upstream = %self.upstream, round = round.number, "resuming at the upstream's input round");
                self.answer_round(hooks, epoch, &round, &mut params).await?;
                (epoch, round.number + 1)
            }
        };
        let mut started_again = false;
        while number <= rounds::MAX_ROUNDS {
            let result = tokio::select! {
                r = self.send_round(number, &params, as_task, hooks) => r,
                () = hooks.cancelled() => return Err(CallError::Tool(ToolError::Cancelled)),
            };
            let result = match result {
                Err(CallError::Upstream(e)) if number > 1 && refuses_request_state(&e) => {
                    // The upstream no longer takes the state it gave (it restarted with a new
                    // key, or the state expired early): the round cannot go on. A tool safe
                    // to repeat is called again from round 1 — the answers already given are
                    // given again; any other fails, saying why.
                    if !spec.repeatable || started_again {
                        return Err(CallError::Upstream(UpstreamError::StateExpired {
                            upstream: self.upstream.clone(),
                            reason: format!(
                                "no longer accepts the state of input round {} ({e}): it restarted, or the state expired; the call was not made again{}",
                                number - 1,
                                if started_again {
                                    ""
                                } else {
                                    " because the tool is not declared idempotent"
                                }
                            ),
                        }));
                    }
                    tracing::warn!(upstream = %self.upstream, round = number - 1, "the upstream refused its own requestState; calling the idempotent tool again from round 1");
                    started_again = true;
                    epoch += 1;
                    number = 1;
                    params.remove("inputResponses");
                    params.remove("requestState");
                    continue;
                }
                other => other?,
            };
            match result.get("resultType").and_then(Value::as_str) {
                Some("task") => {
                    let task_id = result
                        .get("taskId")
                        .and_then(Value::as_str)
                        .ok_or_else(|| self.protocol("a task result without a taskId"))?
                        .to_owned();
                    hooks.remember_task(&task_id).await?;
                    tracing::info!(upstream = %self.upstream, task = ?task_id, "the upstream runs the call as its task");
                    return self.follow(&task_id, hooks).await;
                }
                Some("input_required") => {
                    let round = Round {
                        number,
                        requests: link::input_requests(&result),
                        state: result.get("requestState").filter(|s| !s.is_null()).cloned(),
                        asked_at_ms: crate::clock::Clock::now_ms(&crate::clock::SystemClock),
                    };
                    if round.requests.is_empty() && round.state.is_none() {
                        return Err(self
                            .protocol(
                                "an input_required result without inputRequests or requestState",
                            )
                            .into());
                    }
                    rounds::record(hooks, epoch, &round).await?;
                    self.answer_round(hooks, epoch, &round, &mut params).await?;
                    number += 1;
                }
                _ => return Ok(strip(result)),
            }
        }
        Err(self
            .protocol(&format!(
                "asked for input more than {} times in one call",
                rounds::MAX_ROUNDS
            ))
            .into())
    }

    /// Asks the client a recorded round's requests (an answer already given comes back at
    /// once) before the upstream's state of the round expires, records that the answers go
    /// out, and puts them and the round's `requestState` in the next call's `params`.
    async fn answer_round(
        &self,
        hooks: &dyn link::Hooks,
        epoch: u32,
        round: &Round,
        params: &mut Map<String, Value>,
    ) -> Result<(), CallError> {
        let now = || crate::clock::Clock::now_ms(&crate::clock::SystemClock);
        let deadline = round.deadline_ms(self.state_ttl);
        let ttl_s = self.state_ttl.map_or(0.0, |t| t.as_secs_f64());
        let expired = |d| CallError::Upstream(rounds::expired(&self.upstream, d, ttl_s));
        let status = rounds::waiting_message(&self.upstream, deadline);
        let mut answers = Map::new();
        for (key, request) in &round.requests {
            let our_key = round.our_key(key);
            let ask = hooks.input_with_status(&our_key, request.clone(), status.clone());
            let answer = match deadline {
                Some(d) => {
                    let left = d.saturating_sub(now());
                    if left == 0 && hooks.recorded(&our_key).is_none() {
                        return Err(expired(d));
                    }
                    match tokio::time::timeout(Duration::from_millis(left), ask).await {
                        Ok(answer) => answer?,
                        Err(_) => {
                            tracing::warn!(upstream = %self.upstream, round = round.number, "the upstream's state of an input round expired before the answer came");
                            return Err(expired(d));
                        }
                    }
                }
                None => ask.await?,
            };
            answers.insert(key.clone(), answer);
        }
        // Answered after the deadline (the answers were given in time but the call resumes
        // late, after a restart): the upstream would refuse the state.
        if let Some(d) = deadline
            && now() >= d
        {
            return Err(expired(d));
        }
        rounds::record_answered(hooks, epoch, round.number).await?;
        params.insert("inputResponses".into(), Value::Object(answers));
        match &round.state {
            Some(state) => params.insert("requestState".into(), state.clone()),
            None => params.remove("requestState"),
        };
        Ok(())
    }

    /// Round `number` of a call. The answers of a round after the first are marked sent
    /// before they go (`rounds`), so the tool's own retry of a call that never reached the
    /// upstream would start from round 1 again: such a round is sent again here instead,
    /// within the upstream's timeout.
    async fn send_round(
        &self,
        number: u32,
        params: &Map<String, Value>,
        as_task: bool,
        hooks: &dyn link::Hooks,
    ) -> Result<Value, CallError> {
        let since = tokio::time::Instant::now();
        let mut delay = Duration::from_millis(100);
        loop {
            match self.stateless_round(params, as_task, hooks).await {
                Err(CallError::Upstream(e @ UpstreamError::NotSent { .. }))
                    if number > 1 && since.elapsed() < self.timeout =>
                {
                    tracing::info!(upstream = %self.upstream, round = number, error = %e, retry_in_ms = delay.as_millis() as u64, "the answers of an input round did not reach the upstream; sending them again");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                other => return other,
            }
        }
    }

    /// One stateless `tools/call` with a `progressToken`: its progress, on the response's
    /// event stream, reaches the task as it comes (and, being bytes on the stream, keeps the
    /// call alive past the timeout); resolves with its result.
    async fn stateless_round(
        &self,
        params: &Map<String, Value>,
        as_task: bool,
        hooks: &dyn link::Hooks,
    ) -> Result<Value, CallError> {
        let id = self.id();
        let mut message = self.stateless_message(id, "tools/call", params.clone(), as_task);
        message["params"]["_meta"]["progressToken"] = json!(id);
        let reply = self.post(&message, None).await?;
        let key = json!(id);
        let response = match reply.0 {
            Reply1::Stream(mut stream) => {
                // Progress coalesced as a session-era call's (`link::ProgressGate`).
                let mut gate = link::ProgressGate::new();
                loop {
                    let m = tokio::select! {
                        m = stream.next() => m,
                        () = tokio::time::sleep_until(gate.due()), if gate.holds() => {
                            gate.flush(hooks).await?;
                            continue;
                        }
                    };
                    let m = match m {
                        Some(Ok(m)) => m,
                        Some(Err(e)) => {
                            return Err(stream_error(&self.upstream, self.timeout, e).into());
                        }
                        None => return Err(self.ended().into()),
                    };
                    if m.get("id") == Some(&key) && m.get("method").is_none() {
                        break m;
                    }
                    let params = m.get("params").cloned().unwrap_or_default();
                    if m.get("method").and_then(Value::as_str) == Some("notifications/progress")
                        && params.get("progressToken") == Some(&key)
                    {
                        if let Some(Inbound::Progress {
                            progress,
                            total,
                            message,
                        }) = Inbound::progress(&params)
                        {
                            gate.offer(hooks, progress, total, message).await?;
                        }
                        continue;
                    }
                    self.standalone(&m);
                }
            }
            other => self.response_of((other, None), &key).await?,
        };
        Ok(link::decode(&self.upstream, response)?)
    }

    /// The `2025-11-25` session of a dual-era upstream, opened if need be.
    async fn session_of<'f>(
        &self,
        fallback: &'f Fallback,
    ) -> Result<&'f Arc<HttpLink>, UpstreamError> {
        fallback
            .link
            .get_or_try_init(|| {
                HttpLink::connect_session(&fallback.config, &fallback.url, fallback.refresh.clone())
            })
            .await
    }

    fn protocol(&self, reason: &str) -> UpstreamError {
        UpstreamError::Protocol {
            upstream: self.upstream.clone(),
            reason: reason.to_owned(),
        }
    }

    /// Polls the upstream's task until it ends: its input requests asked of our task's
    /// client (each key once) and answered with `tasks/update`, a cancellation sent with
    /// `tasks/cancel`.
    async fn follow(&self, task_id: &str, hooks: &dyn link::Hooks) -> Result<Value, CallError> {
        let mut answered = std::collections::BTreeSet::new();
        let mut cancel_sent = false;
        let mut last_message: Option<String> = None;
        loop {
            let mut params = Map::new();
            params.insert("taskId".into(), json!(task_id));
            let task = self.task_get(&params).await?;
            // The upstream task's statusMessage is the gateway task's.
            if let Some(message) = task.get("statusMessage").and_then(Value::as_str)
                && last_message.as_deref() != Some(message)
                && !matches!(
                    task.get("status").and_then(Value::as_str),
                    Some("completed" | "failed" | "cancelled")
                )
            {
                hooks.status(message).await?;
                last_message = Some(message.to_owned());
            }
            let status = task
                .get("status")
                .and_then(Value::as_str)
                .unwrap_or_default();
            match status {
                "completed" => {
                    return Ok(strip(task.get("result").cloned().unwrap_or_default()));
                }
                "failed" => {
                    let error = task.get("error").cloned().unwrap_or_default();
                    return Err(link::rpc_error(&self.upstream, &error).into());
                }
                "cancelled" => return Err(CallError::Tool(ToolError::Cancelled)),
                "input_required" if !cancel_sent => {
                    let requests = link::input_requests(&task);
                    let mut answers = Map::new();
                    for (key, request) in requests {
                        if answered.contains(&key) {
                            continue;
                        }
                        let answer = tokio::select! {
                            a = hooks.input(Some(&key), request) => a,
                            () = hooks.cancelled() => Err(ToolError::Cancelled),
                        };
                        match answer {
                            Ok(a) => {
                                answered.insert(key.clone());
                                answers.insert(key, a);
                            }
                            Err(ToolError::Cancelled) => break,
                            Err(e) => return Err(e.into()),
                        }
                    }
                    if !answers.is_empty() {
                        let mut update = params.clone();
                        update.insert("inputResponses".into(), Value::Object(answers));
                        self.stateless_request("tasks/update", update, true).await?;
                        continue;
                    }
                }
                _ => {}
            }
            let interval = task
                .get("pollIntervalMs")
                .and_then(Value::as_u64)
                .unwrap_or(1000)
                .clamp(250, 30_000);
            if cancel_sent {
                tokio::time::sleep(Duration::from_millis(interval)).await;
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(interval)) => {}
                () = hooks.cancelled() => {
                    self.stateless_request("tasks/cancel", params, true).await?;
                    cancel_sent = true;
                }
            }
        }
    }
}

/// An upstream error for a broken event stream: silence past the timeout, or a lost
/// connection.
fn stream_error(upstream: &str, timeout: Duration, e: crate::client::ClientError) -> UpstreamError {
    match e {
        crate::client::ClientError::Timeout { .. } => UpstreamError::Timeout {
            upstream: upstream.to_owned(),
            seconds: timeout.as_secs_f64(),
        },
        crate::client::ClientError::Protocol(reason) => UpstreamError::Protocol {
            upstream: upstream.to_owned(),
            reason,
        },
        _ => UpstreamError::Unreachable {
            upstream: upstream.to_owned(),
            reason: "the response stream broke".into(),
        },
    }
}

/// Removes a call's route when it ends, however it ends.
struct Forget<'a> {
    link: &'a HttpLink,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(&self.link.calls).remove(&self.id);
    }
}

impl HttpLink {
    /// `tasks/get` of a followed upstream task. The task lives on upstream whatever happens
    /// here, so an unreachable upstream is asked again (backing off up to 10 s) until it has
    /// been unreachable for longer than its timeout.
    async fn task_get(&self, params: &Map<String, Value>) -> Result<Value, UpstreamError> {
        let since = tokio::time::Instant::now();
        let mut delay = Duration::from_millis(250);
        loop {
            match self
                .stateless_request("tasks/get", params.clone(), true)
                .await
            {
                Err(
                    e @ (UpstreamError::NotSent { .. }
                    | UpstreamError::Unreachable { .. }
                    | UpstreamError::Http { .. }),
                ) if since.elapsed() < self.timeout => {
                    tracing::warn!(upstream = %self.upstream, error = %e.to_string().escape_debug(), "cannot read the upstream task; asking again");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
                other => return other,
            }
        }
    }
}

/// The idle bound of a session-era call's stream: none to speak of (`link::drive` bounds the
/// call's silence, pausing while the task waits for input).
const UNBOUNDED_IDLE: Duration = Duration::from_secs(30 * 24 * 3600);

/// Whether an upstream's error refuses the `requestState` the gateway echoed (`-32602`
/// naming it: "Invalid or expired requestState" from the MCP Python SDK and FastMCP).
fn refuses_request_state(e: &UpstreamError) -> bool {
    matches!(e, UpstreamError::Rpc { code: -32602, message, .. }
        if message.to_ascii_lowercase().contains("requeststate"))
}

/// Whether a stateless call's result is a dual-era server's refusal to ask for input with a
/// server-initiated request (FastMCP 4.x answers `ctx.elicit()` on a `2026-07-28` call with a
/// tool error saying so): such a tool needs a `2025-11-25` session.
fn refuses_imperative_input(result: &Value) -> bool {
    if result.get("isError").and_then(Value::as_bool) != Some(true) {
        return false;
    }
    let text = result
        .get("content")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .and_then(|c| c.get("text"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_ascii_lowercase();
    text.contains("2026-07-28")
        && (text.contains("server-initiated") || text.contains("elicit"))
        && text.contains("unavailable")
}

/// A `CallToolResult` without what the wire layer adds again (`resultType`, `_meta`).
fn strip(mut result: Value) -> Value {
    if let Some(r) = result.as_object_mut() {
        r.remove("resultType");
        r.remove("_meta");
    }
    result
}

/// [`HttpLink::route`] for a stream pumped apart from its link.
fn route_detached(upstream: &str, refresh: &Notify, message: &Value, events: &link::InboundTx) {
    let method = message.get("method").and_then(Value::as_str);
    let params = message.get("params").cloned().unwrap_or_default();
    match (method, message.get("id")) {
        (Some("notifications/tools/list_changed"), None) => refresh.notify_one(),
        (Some("notifications/progress"), None) => {
            if let Some(event) = Inbound::progress(&params) {
                let _ = events.send(event);
            }
        }
        (Some(m), Some(id)) => {
            let request = Inbound::Request {
                id: id.clone(),
                method: m.to_owned(),
                params,
            };
            if let Err(why) = events.send(request) {
                tracing::warn!(upstream, method = m, %why, "upstream request dropped");
            }
        }
        (Some(m), None) => tracing::debug!(upstream, method = m, "upstream message ignored"),
        (None, _) => {}
    }
}

/// The session's standalone event stream (`GET`), for `notifications/tools/list_changed`; a
/// server without one (405) is refreshed on reconnect only.
async fn listen(link: std::sync::Weak<HttpLink>) {
    let mut delay = Duration::from_secs(1);
    loop {
        let Some(me) = link.upgrade() else { return };
        let session = lock(&me.session).clone();
        let Era::Session { version, .. } = &me.era else {
            return;
        };
        // Without a read timeout: the stream is silent whenever the server has nothing to say.
        let mut request = me
            .call_client
            .get(&me.url)
            .headers(me.headers.clone())
            .header(header::ACCEPT, "text/event-stream")
            .header("MCP-Protocol-Version", version.as_str());
        if let Some(s) = &session {
            request = request.header("Mcp-Session-Id", s);
        }
        let response = request.send().await;
        let ok = matches!(&response, Ok(r) if r.status().is_success());
        if let Ok(r) = &response
            && (r.status() == StatusCode::METHOD_NOT_ALLOWED)
        {
            tracing::debug!(upstream = %me.upstream, "upstream has no standalone event stream");
            return;
        }
        if ok && let Ok(r) = response {
            delay = Duration::from_secs(1);
            let name = me.upstream.clone();
            let weak = Arc::downgrade(&me);
            drop(me);
            let mut stream = SseStream::new(
                r.bytes_stream()
                    .map(|c| {
                        c.map_err(|e| crate::client::ClientError::Io {
                            url: String::new(),
                            reason: e.to_string(),
                            source: None,
                        })
                    })
                    .boxed(),
                Duration::from_secs(24 * 3600),
                name.clone(),
            );
            while let Some(Ok(m)) = stream.next().await {
                let Some(me) = weak.upgrade() else { return };
                me.standalone(&m);
            }
        } else {
            drop(me);
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(60));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl link::SessionDriver for HttpLink {
    fn drive<'a>(
        &'a self,
        method: &'a str,
        params: Value,
        hooks: &'a dyn link::Hooks,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Value, CallError>> {
        Box::pin(self.session_drive(method, params, hooks, timeout))
    }

    fn request<'a>(
        &'a self,
        method: &'a str,
        params: Value,
    ) -> BoxFuture<'a, Result<Value, UpstreamError>> {
        let params = params.as_object().cloned().unwrap_or_default();
        Box::pin(HttpLink::request(self, method, params))
    }

    fn upstream(&self) -> &str {
        &self.upstream
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn has_tasks(&self) -> bool {
        matches!(self.era, Era::Session { tasks: true, .. })
    }
}

impl Reply for HttpLink {
    fn send(&self, message: Value) -> BoxFuture<'_, Result<(), UpstreamError>> {
        Box::pin(async move {
            match self.post(&message, None).await?.0 {
                Reply1::SessionGone => Err(UpstreamError::Http {
                    upstream: self.upstream.clone(),
                    status: 404,
                    hint: None,
                }),
                _ => Ok(()),
            }
        })
    }
}

impl Link for HttpLink {
    fn list_tools(
        &self,
        limits: link::ListLimits,
    ) -> BoxFuture<'_, Result<Vec<Value>, UpstreamError>> {
        Box::pin(link::list_all(&self.upstream, limits, |params| {
            self.request("tools/list", params)
        }))
    }

    fn call<'a>(&'a self, spec: CallSpec<'a>) -> BoxFuture<'a, Result<Value, CallError>> {
        Box::pin(async move {
            let Era::Stateless { tasks } = self.era else {
                return link::session_call(self, spec).await;
            };
            let Some(fallback) = &self.fallback else {
                return self.stateless_call(spec, tasks).await;
            };
            if lock(&fallback.tools).contains(spec.name) {
                let session = self.session_of(fallback).await?;
                return link::session_call(session.as_ref(), spec).await;
            }
            let (name, arguments, hooks, task_support, repeatable) = (
                spec.name,
                spec.arguments.clone(),
                spec.hooks,
                spec.task_support.clone(),
                spec.repeatable,
            );
            match self.stateless_call(spec, tasks).await {
                Ok(result) if refuses_imperative_input(&result) => {
                    let session = match self.session_of(fallback).await {
                        Ok(session) => session,
                        Err(e) => {
                            // Not a dual-era server after all: its refusal is the answer.
                            tracing::warn!(upstream = %self.upstream, tool = %name.escape_debug(), error = %e.to_string().escape_debug(),
                                "the tool asks for input with a server-initiated request, which the upstream refuses on a stateless call, and a 2025-11-25 session with it cannot be opened");
                            return Ok(result);
                        }
                    };
                    lock(&fallback.tools).insert(name.to_owned());
                    tracing::warn!(upstream = %self.upstream, tool = %name.escape_debug(),
                        "the tool asks for input the 2025-11-25 way (a server-initiated request), which the upstream refuses on a stateless call: calling it again, and from now on, in a 2025-11-25 session");
                    let spec = CallSpec {
                        name,
                        arguments,
                        hooks,
                        task_support,
                        repeatable,
                    };
                    link::session_call(session.as_ref(), spec).await
                }
                other => other,
            }
        })
    }

    fn closed(&self) -> BoxFuture<'_, ()> {
        // HTTP has no connection to lose: a failed request says the upstream is down.
        Box::pin(futures::future::pending())
    }

    fn era(&self) -> &'static str {
        match self.era {
            Era::Stateless { .. } => PROTOCOL_VERSION,
            Era::Session { .. } => link::SESSION_VERSION,
        }
    }
}
