//! Streamable HTTP transport (MCP `2026-07-28` transports, SEP-2243): one `POST` endpoint, JSON or SSE
//! responses, `202` for notifications, `405` for every other method.
//!
//! The transport only extracts, decodes and maps: the era entry (`era::Entry`) tells the
//! protocol eras apart and handles legacy sessions, and the dispatcher
//! ([`RuntimeHandle::dispatch`]) validates the envelope, compares the routing headers with the
//! body and chooses the HTTP status of every JSON-RPC answer. What happens here, in order
//! (steps 1 to 4 are tower layers around the route, in `http/guards.rs`):
//!
//! 1. `Host` not allowed, or `Origin` present and not allowed (DNS rebinding), either sent
//!    twice, or a `Host` port that is not a port number → `403`; a method other than `POST`
//!    (or `GET`/`DELETE` with an `Mcp-Session-Id`) → `405`;
//! 2. the [`HttpConfig::authenticator`] runs on the request head, before any of the body is
//!    read: no or a bad credential → `401`, a credential without a scope that
//!    [`HttpConfig::resource`] requires (and not the read-only [`crate::auth::READ_ONLY_SCOPE`])
//!    → `403`, both with `WWW-Authenticate: Bearer
//!    resource_metadata="…"` (RFC 6750 §3, RFC 9728 §5.1); the verifier unavailable → `503`;
//! 3. more connections of this caller than [`ServeOptions::max_connections_per_principal`],
//!    or more than [`HttpConfig::max_requests_per_principal`] requests of this caller in
//!    progress (an open SSE stream counts until it closes) → `429` with `Retry-After`;
//! 4. body larger than [`HttpConfig::max_body_bytes`] → `413`; not received within
//!    [`HttpConfig::body_timeout`] → `408`; a read-only credential's message that changes
//!    something (`tools/call`, `tasks/update`, `tasks/cancel`, ...) → `403`
//!    `insufficient_scope`;
//! 5. `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` are trimmed and `=?base64?…?=`-decoded
//!    into [`RoutingHeaders`], `Mcp-Session-Id` is read, and the message goes to the era entry;
//! 6. its outcome: nothing → `202` (no body), one reply → its status with one compact JSON
//!    body, a stream → `200 text/event-stream`, one message per `data:` line, keep-alive
//!    comments in between (legacy streams with event ids).
//!
//! The dispatch runs on its own tokio task: a client that drops its connection while a
//! `tools/call` is in flight never interrupts task creation half-way (the task is committed
//! *and* started, or not created at all). Closing an SSE response drops its
//! message stream, which ends the `subscriptions/listen` request (and its subscriber) but
//! never a task.
//!
//! `GET /.well-known/oauth-protected-resource[/path]` serves the RFC 9728 metadata of
//! [`HttpConfig::resource`] when one is set (without authentication, as clients need it to
//! find the authorization server).
//!
//! Sessions do not exist in `2026-07-28`: modern requests never get an `Mcp-Session-Id`, and
//! their SSE events carry no ids. The same endpoint also serves `2025-11-25` and
//! `2025-06-18` clients: `initialize`, and every message that carries an `Mcp-Session-Id` and
//! does not declare the `2026-07-28` era, go to the legacy adapter ([`crate::legacy`]; the
//! HTTP side, with `GET` streams, `Last-Event-ID` and `DELETE`, is in `http/legacy.rs`).

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use base64::Engine as _;
use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::Value;

use crate::auth::{Anonymous, Authenticator, Identity, ProtectedResource};
use crate::era::Outcome;
use crate::protocol::RoutingHeaders;
use crate::runtime::RuntimeHandle;
use crate::task::Owner;
use crate::wire::error::{RpcError, code};
use crate::wire::jsonrpc;

/// The `MCP-Protocol-Version` request header.
pub const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";
/// The `Mcp-Method` request header.
pub const METHOD_HEADER: &str = "mcp-method";
/// The `Mcp-Name` request header.
pub const NAME_HEADER: &str = "mcp-name";
/// The prefix of the `Mcp-Param-{Name}` headers that mirror tool arguments (SEP-2243).
pub const PARAM_HEADER_PREFIX: &str = "mcp-param-";

/// Configuration of the HTTP transport. `Default` serves `/mcp` to local callers, every one of
/// them the anonymous principal: set an [`HttpConfig::authenticator`] before serving anyone
/// else.
#[derive(Clone)]
#[non_exhaustive]
pub struct HttpConfig {
    /// The endpoint's path (default `/mcp`).
    pub path: String,
    /// Allowed `Origin`s besides local ones, exactly as browsers send them
    /// (`https://app.example`, compared case-insensitively). Local origins
    /// (`http(s)://localhost|127.0.0.1|[::1]`, any port) are always allowed; `"*"` allows all.
    pub allowed_origins: Vec<String>,
    /// Allowed `Host` names besides `localhost`, `127.0.0.1` and `[::1]` (any port). An entry
    /// without a port matches any port; `"*"` allows every host (behind a trusted proxy).
    pub allowed_hosts: Vec<String>,
    /// Largest accepted request body (default 4 MiB); larger ones get `413`.
    pub max_body_bytes: usize,
    /// Whether a missing `Mcp-Name` on `tasks/get|update|cancel` is rejected (`-32020`).
    pub strict_headers: bool,
    /// Interval of SSE keep-alive comments (default 15 s; zero disables them).
    pub keep_alive: Duration,
    /// Requests one owner may have in progress at once, open SSE streams included; more are
    /// `429`. Unlimited by default (an embedder decides; `mcp-tasks serve` uses 64).
    pub max_requests_per_principal: usize,
    /// How long a client may take to send a request's body once its head arrived (default
    /// 30 s); slower is `408`.
    pub body_timeout: Duration,
    /// How long the rest of a legacy (`2025-11-25`) response stream is kept coming after its
    /// client went away, for a `GET` with `Last-Event-ID` to resume it (default 30 s); after
    /// that the request stops (an abandoned `tasks/result` stops following its task).
    pub legacy_resume_grace: Duration,
    /// Authenticates each request (default [`Anonymous`]: everyone is
    /// [`crate::Owner::anonymous`]).
    pub authenticator: Arc<dyn Authenticator>,
    /// This server as an OAuth protected resource: its canonical URI, authorization servers
    /// and required scopes. When set, refusals point at its metadata document, which is
    /// served, and every request must carry its scopes.
    pub resource: Option<ProtectedResource>,
    /// Refused bearer tokens one address (or one claimed principal) may send within
    /// [`HttpConfig::auth_failure_window`] before its requests are `429` without being checked
    /// (default 10; 0 turns throttling off): [`crate::auth::FailureThrottle`].
    pub max_auth_failures: u32,
    /// The window [`HttpConfig::max_auth_failures`] counts in (default 60 s).
    pub auth_failure_window: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            path: "/mcp".to_owned(),
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            max_body_bytes: 4 * 1024 * 1024,
            strict_headers: false,
            keep_alive: Duration::from_secs(15),
            max_requests_per_principal: usize::MAX,
            body_timeout: Duration::from_secs(30),
            legacy_resume_grace: Duration::from_secs(30),
            authenticator: Arc::new(Anonymous),
            resource: None,
            max_auth_failures: 10,
            auth_failure_window: Duration::from_secs(60),
        }
    }
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConfig")
            .field("path", &self.path)
            .field("allowed_origins", &self.allowed_origins)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("strict_headers", &self.strict_headers)
            .field("keep_alive", &self.keep_alive)
            .field(
                "max_requests_per_principal",
                &self.max_requests_per_principal,
            )
            .field("body_timeout", &self.body_timeout)
            .field("legacy_resume_grace", &self.legacy_resume_grace)
            .field("resource", &self.resource)
            .field("max_auth_failures", &self.max_auth_failures)
            .field("auth_failure_window", &self.auth_failure_window)
            .finish_non_exhaustive()
    }
}

impl HttpConfig {
    /// Sets the endpoint's path (default `/mcp`).
    pub fn path(mut self, path: impl Into<String>) -> Self {
        self.path = path.into();
        self
    }

    /// Allows one more `Origin` (e.g. `https://app.example`).
    pub fn allow_origin(mut self, origin: impl Into<String>) -> Self {
        self.allowed_origins.push(origin.into());
        self
    }

    /// Allows one more `Host` name (e.g. `mcp.example.com`, any port).
    pub fn allow_host(mut self, host: impl Into<String>) -> Self {
        self.allowed_hosts.push(host.into());
        self
    }

    /// Sets the largest request body (`413` beyond).
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    /// Sets whether a `tasks/*` request without `Mcp-Name` is `-32020`.
    pub fn strict_headers(mut self, strict: bool) -> Self {
        self.strict_headers = strict;
        self
    }

    /// Sets the interval of SSE keep-alive comments.
    pub fn keep_alive(mut self, interval: Duration) -> Self {
        self.keep_alive = interval;
        self
    }

    /// Sets how many requests one principal may have in progress (`429` beyond).
    pub fn max_requests_per_principal(mut self, n: usize) -> Self {
        self.max_requests_per_principal = n;
        self
    }

    /// Sets how long a request body may take to arrive (`408` beyond).
    pub fn body_timeout(mut self, timeout: Duration) -> Self {
        self.body_timeout = timeout;
        self
    }

    /// Sets the authenticator (see [`crate::auth`]).
    pub fn authenticator(mut self, authenticator: Arc<dyn Authenticator>) -> Self {
        self.authenticator = authenticator;
        self
    }

    /// Declares this server an OAuth protected resource (RFC 9728).
    pub fn resource(mut self, resource: ProtectedResource) -> Self {
        self.resource = Some(resource);
        self
    }

    /// Throttles refused bearer tokens: `max_failures` per address or claimed principal within
    /// `window`, then `429` until the window passes (0 turns it off).
    pub fn auth_throttle(mut self, max_failures: u32, window: Duration) -> Self {
        self.max_auth_failures = max_failures;
        self.auth_failure_window = window;
        self
    }
}

mod guards;
mod legacy;

pub use legacy::SESSION_HEADER;

/// The state of the MCP route: the era entry and what the guards need.
struct Endpoint {
    handle: RuntimeHandle,
    config: HttpConfig,
    /// The one entry of both protocol eras.
    entry: crate::era::Entry,
    /// Requests in progress per owner.
    in_flight: std::sync::Mutex<HashMap<Owner, usize>>,
    /// Refused bearer tokens per address and claimed principal.
    throttle: crate::auth::FailureThrottle,
}

impl Endpoint {
    fn in_flight(&self) -> std::sync::MutexGuard<'_, HashMap<Owner, usize>> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The MCP endpoint as an axum router, to serve with [`serve`] or to mount in a host app.
///
/// It answers at the configured path (`/mcp` by default) with the guards of [`HttpConfig`]
/// (`Host`/`Origin` checks, the authenticator, body and concurrency limits), and, when a
/// protected resource is configured, serves its OAuth protected-resource metadata. It also
/// answers the probes `GET /healthz` ([`healthz`]) and `GET /readyz`
/// ([`RuntimeHandle::ready`], [`readiness_response`]), without authentication and without
/// task data.
///
/// ```
/// use mcp_tasks::client::Client;
/// use mcp_tasks::store::Store;
/// use mcp_tasks::transport::http::{router, serve, HttpConfig};
/// use mcp_tasks::Runtime;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let runtime = Runtime::builder_with_store(Store::memory()).start().await?;
/// // The MCP endpoint beside the host's own routes.
/// let app = axum::Router::new()
///     .route("/health", axum::routing::get(|| async { "ok" }))
///     .merge(router(runtime.handle(), HttpConfig::default()));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let url = format!("http://{}/mcp", listener.local_addr()?);
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let server = tokio::spawn(serve(listener, app, async { stopped.await.ok(); }));
///
/// let client = Client::http(&url)?.build().await?;
/// assert!(client.discover().await?.supports_tasks());
///
/// // A graceful stop: listen streams end first, then the server, then the runtime.
/// runtime.begin_shutdown();
/// stop.send(()).ok();
/// server.await??;
/// runtime.shutdown().await;
/// # Ok(())
/// # }
/// ```
pub fn router(handle: RuntimeHandle, config: HttpConfig) -> Router {
    let path = config.path.clone();
    let endpoint = Arc::new(Endpoint {
        entry: crate::era::Entry::new(handle.clone()),
        handle,
        throttle: crate::auth::FailureThrottle::new(
            config.max_auth_failures,
            config.auth_failure_window,
        ),
        config,
        in_flight: std::sync::Mutex::new(HashMap::new()),
    });
    let mut router = Router::new()
        .route(&path, guards::guarded(any(mcp), &endpoint))
        .route(HEALTHZ, get(healthz))
        .route(READYZ, get(readyz));
    if let Some(resource) = &endpoint.config.resource {
        let specific = resource.metadata_path();
        router = router.route(&specific, get(resource_metadata));
        if specific != WELL_KNOWN {
            router = router.route(WELL_KNOWN, get(resource_metadata));
        }
    }
    router.with_state(endpoint)
}

/// The RFC 9728 well-known prefix.
const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

/// The liveness probe's path: `200 ok` whenever the process answers.
pub const HEALTHZ: &str = "/healthz";
/// The readiness probe's path: `200 ready` once the runtime can serve
/// ([`RuntimeHandle::ready`]), `503` with the reason otherwise.
pub const READYZ: &str = "/readyz";

/// `GET /healthz`: the process answers. No authentication, no `Host`/`Origin` check and no
/// task data (the same holds for `GET /readyz`): a probe learns only that the server is up.
pub async fn healthz() -> Response {
    probe(StatusCode::OK, "ok".to_owned())
}

/// The answer to `GET /readyz` for a readiness outcome: `200 ready`, or `503 not ready: WHY`
/// (the store's state, never task data).
pub fn readiness_response(ready: Result<(), String>) -> Response {
    readiness_report(ready, &[])
}

/// [`readiness_response`] with `details` after its first line, one a line (the tool sources'
/// state: [`RuntimeHandle::tool_sources_readiness`]). They do not change the status.
pub fn readiness_report(ready: Result<(), String>, details: &[String]) -> Response {
    let (status, mut body) = match ready {
        Ok(()) => (StatusCode::OK, "ready".to_owned()),
        Err(why) => {
            tracing::debug!(%why, "readiness probe: not ready");
            (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}"))
        }
    };
    for line in details {
        body.push('\n');
        body.push_str(line);
    }
    probe(status, body)
}

async fn readyz(State(endpoint): State<Arc<Endpoint>>) -> Response {
    readiness_report(
        endpoint.handle.ready().await,
        &endpoint.handle.tool_sources_readiness(),
    )
}

fn probe(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body + "\n",
    )
        .into_response()
}

async fn resource_metadata(State(endpoint): State<Arc<Endpoint>>, request: Request) -> Response {
    let config = &endpoint.config;
    if let Err(why) = check_host(
        request.headers(),
        request.uri().authority(),
        &config.allowed_hosts,
    ) {
        crate::telemetry::refused(StatusCode::FORBIDDEN.as_u16());
        return transport_error(StatusCode::FORBIDDEN, None, &why);
    }
    match &config.resource {
        Some(resource) => {
            let mut doc = resource.document();
            if doc.get("authorization_servers").is_none() {
                let servers = config.authenticator.authorization_servers();
                if !servers.is_empty() {
                    doc["authorization_servers"] = serde_json::json!(servers);
                }
            }
            json_response(StatusCode::OK, &doc)
        }
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// Serves `router` on `listener` with the default [`ServeOptions`] until `shutdown`
/// resolves, then drains open requests.
///
/// Open `subscriptions/listen` streams hold the drain until they end: call
/// [`crate::Runtime::begin_shutdown`] before (or when) `shutdown` resolves so that they send
/// their result and close.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, router, ServeOptions::default(), shutdown).await
}

pub use super::server::{ServeOptions, serve_with};

/// The MCP route, behind its [`guards`]: the request, authenticated and (for a `POST`) read,
/// goes to the era entry, and its outcome becomes the response.
async fn mcp(State(endpoint): State<Arc<Endpoint>>, request: Request) -> Response {
    let (mut parts, _body) = request.into_parts();
    let owner = match parts.extensions.remove::<Identity>() {
        Some(identity) => identity.owner,
        None => Owner::anonymous(),
    };
    let hold = parts.extensions.remove::<guards::Hold>();
    let message = match parts.method {
        Method::GET => crate::era::Message::OpenStream {
            last_event_id: legacy::last_event_id(&parts.headers),
        },
        Method::DELETE => crate::era::Message::EndSession,
        _ => crate::era::Message::Bytes(
            parts
                .extensions
                .remove::<guards::BodyBytes>()
                .map(|b| b.0)
                .unwrap_or_default(),
        ),
    };
    let config = &endpoint.config;
    let ctx = crate::era::Context {
        owner,
        streams: accepts_event_stream(&parts.headers),
        binding: crate::era::Binding::Id(legacy::session_id(
            &parts.headers,
            config.legacy_resume_grace,
        )),
        routing: Some(routing_headers(&parts.headers)),
        strict_headers: config.strict_headers,
        hold: hold
            .clone()
            .map(|h| Box::new(h) as Box<dyn std::any::Any + Send + Sync>),
    };
    let (outcome, kind) = endpoint.entry.handle(message, ctx).await;
    let mut response = respond(outcome, config.keep_alive, hold);
    response.extensions_mut().insert(guards::Kind(kind));
    response
}

/// The response for an outcome of the era entry.
fn respond(outcome: Outcome, keep_alive: Duration, hold: Option<guards::Hold>) -> Response {
    match outcome {
        Outcome::Accepted => StatusCode::ACCEPTED.into_response(),
        Outcome::Reply(reply) => {
            let status = StatusCode::from_u16(reply.http_status)
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let retry_after = (status == StatusCode::TOO_MANY_REQUESTS).then(|| {
                reply.body()["error"]["data"]["retryAfterSeconds"]
                    .as_u64()
                    .unwrap_or(1)
            });
            let mut response = json_bytes_response(status, reply.into_bytes());
            if let Some(secs) = retry_after {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            }
            response
        }
        Outcome::Stream(stream) => sse_response(
            stream.map(|m| Event::default().data(sse_data(&m))).boxed(),
            keep_alive,
            hold,
        ),
        Outcome::Json(body) => json_response(StatusCode::OK, &body),
        Outcome::Opened { body, id, .. } => {
            let mut response = json_response(StatusCode::OK, &body);
            if let Some(value) = id.and_then(|id| HeaderValue::from_str(&id).ok()) {
                response
                    .headers_mut()
                    .insert(HeaderName::from_static(SESSION_HEADER), value);
            }
            response
        }
        // Only a connection (stdio) is handed a legacy request's messages as they are.
        Outcome::Messages(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        Outcome::Ended => StatusCode::OK.into_response(),
        Outcome::Events(events) => legacy::sse_response(events, keep_alive, hold),
        Outcome::Refused {
            status,
            error,
            retry_after,
        } => {
            let mut response =
                json_response(status_code(status), &jsonrpc::error_response(None, &error));
            if let Some(secs) = retry_after {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            }
            response
        }
    }
}

fn status_code(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

// ---------------------------------------------------------------------------------------------
// Host and Origin

/// Whether `host` (a host name or IP literal, brackets kept for IPv6) is a loopback name.
fn is_local_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost") || host == "127.0.0.1" || host == "[::1]"
}

/// The host part of an authority `host[:port]` (IPv6 literals keep their brackets).
fn host_part(authority: &str) -> &str {
    if authority.starts_with('[') {
        match authority.find(']') {
            Some(end) => &authority[..=end],
            None => authority,
        }
    } else {
        authority
            .rsplit_once(':')
            .map_or(authority, |(host, _port)| host)
    }
}

/// DNS-rebinding protection, shared by the MCP endpoint and the console: the request's `Host`
/// (or, without one, its URI's authority) must be a loopback name or one of `allowed_hosts`
/// (`name` for any port, `name:port`, or `*` for every host).
pub(crate) fn check_host(
    headers: &HeaderMap,
    authority: Option<&axum::http::uri::Authority>,
    allowed_hosts: &[String],
) -> Result<(), String> {
    let value = single(headers, &header::HOST, "Host")?;
    if allowed_hosts.iter().any(|h| h == "*") {
        return Ok(());
    }
    let host = match value {
        Some(value) => value
            .to_str()
            .map_err(|_| "Forbidden: the Host header is malformed".to_owned())?
            .trim()
            .to_owned(),
        None => match authority {
            Some(a) => a.as_str().to_owned(),
            None => return Err("Forbidden: the Host header is missing".to_owned()),
        },
    };
    if !valid_port(&host) {
        return Err(format!(
            "Forbidden: Host `{host}` has a port that is not a number from 0 to 65535"
        ));
    }
    let name = host_part(&host);
    let allowed = is_local_host(name)
        || allowed_hosts
            .iter()
            .any(|h| h.eq_ignore_ascii_case(&host) || h.eq_ignore_ascii_case(name));
    if allowed {
        Ok(())
    } else {
        Err(format!("Forbidden: Host `{host}` is not allowed"))
    }
}

/// The only value of header `name`: a header sent twice is refused, as proxies and this
/// server could otherwise read different ones (RFC 9110 §5.3 allows repeating only
/// list-valued fields, which `Host` and `Origin` are not).
fn single<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
    display: &str,
) -> Result<Option<&'a HeaderValue>, String> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(format!(
            "Forbidden: the {display} header appears more than once"
        ));
    }
    Ok(first)
}

/// Whether the port of an authority `host[:port]`, if it has one, is a decimal number a TCP
/// port can be (RFC 3986 §3.2.3 allows an empty port; a browser never sends one).
fn valid_port(authority: &str) -> bool {
    let after_host = if authority.starts_with('[') {
        match authority.find(']') {
            Some(end) => &authority[end + 1..],
            None => return false,
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') => return port_number(port),
            Some(_) => return false,
            None => "",
        }
    };
    match after_host.strip_prefix(':') {
        Some(port) => port_number(port),
        None => after_host.is_empty(),
    }
}

fn port_number(port: &str) -> bool {
    !port.is_empty()
        && port.len() <= 5
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u32>().is_ok_and(|p| p <= 65_535)
}

/// The `Origin` check beside [`check_host`]: absent, local (`http(s)://` a loopback name), or
/// one of `allowed_origins` (`*` for all).
pub(crate) fn check_origin(headers: &HeaderMap, allowed_origins: &[String]) -> Result<(), String> {
    let Some(value) = single(headers, &header::ORIGIN, "Origin")? else {
        return Ok(());
    };
    let origin = value
        .to_str()
        .map_err(|_| "Forbidden: the Origin header is malformed".to_owned())?
        .trim();
    let origin = origin.strip_suffix('/').unwrap_or(origin);
    let local = origin.split_once("://").is_some_and(|(scheme, authority)| {
        (scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https"))
            && !authority.contains(['/', '@'])
            && valid_port(authority)
            && is_local_host(host_part(authority))
    });
    let allowed = local
        || allowed_origins.iter().any(|o| {
            o == "*" || {
                let o = o.trim();
                o.strip_suffix('/')
                    .unwrap_or(o)
                    .eq_ignore_ascii_case(origin)
            }
        });
    if allowed {
        Ok(())
    } else {
        Err(format!("Forbidden: Origin `{origin}` is not allowed"))
    }
}

// ---------------------------------------------------------------------------------------------
// Body

/// Whether the client accepts an SSE response (`Accept` lists `text/event-stream`): only then
/// may a request other than `subscriptions/listen` be answered with request-scoped
/// notifications before its response.
fn accepts_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            let media = range.split(';').next().unwrap_or_default().trim();
            media.eq_ignore_ascii_case("text/event-stream")
        })
}

// ---------------------------------------------------------------------------------------------
// Routing headers

/// Reads the routing headers: each at most once, trimmed, `=?base64?…?=` decoded; with the
/// `Mcp-Param-*` headers of SEP-2243.
pub fn routing_headers(headers: &HeaderMap) -> Result<RoutingHeaders, RpcError> {
    let mut params = BTreeMap::new();
    for name in headers.keys() {
        // Header names are lower case in a `HeaderMap`.
        if let Some(param) = name.as_str().strip_prefix(PARAM_HEADER_PREFIX)
            && let Some(value) = header_value(headers, name, name.as_str())?
        {
            params.insert(param.to_owned(), value);
        }
    }
    Ok(RoutingHeaders {
        protocol_version: header_value(
            headers,
            &HeaderName::from_static(PROTOCOL_VERSION_HEADER),
            "MCP-Protocol-Version",
        )?,
        method: header_value(
            headers,
            &HeaderName::from_static(METHOD_HEADER),
            "Mcp-Method",
        )?,
        name: header_value(headers, &HeaderName::from_static(NAME_HEADER), "Mcp-Name")?,
        params,
    })
}

fn header_value(
    headers: &HeaderMap,
    name: &HeaderName,
    display: &str,
) -> Result<Option<String>, RpcError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(RpcError::header_mismatch(format!(
            "the {display} header appears more than once"
        )));
    }
    let text = std::str::from_utf8(value.as_bytes()).map_err(|_| {
        RpcError::header_mismatch(format!(
            "the {display} header is not UTF-8 (use =?base64?…?= for non-ASCII values)"
        ))
    })?;
    let text = text.trim_matches([' ', '\t']);
    decode_sentinel(text)
        .map(Some)
        .map_err(|why| RpcError::header_mismatch(format!("the {display} header {why}")))
}

/// Decodes a `=?base64?{base64 of UTF-8}?=` value; other values are returned as they are.
pub fn decode_sentinel(value: &str) -> Result<String, &'static str> {
    const PREFIX: &str = "=?base64?";
    const SUFFIX: &str = "?=";
    let is_sentinel = value.len() >= PREFIX.len() + SUFFIX.len()
        && value
            .get(..PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(PREFIX))
        && value.ends_with(SUFFIX);
    if !is_sentinel {
        return Ok(value.to_owned());
    }
    let encoded = &value[PREFIX.len()..value.len() - SUFFIX.len()];
    // Standard alphabet with canonical padding: SEP-2243 rejects a missing `=` as invalid.
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| "holds invalid base64")?;
    String::from_utf8(bytes).map_err(|_| "decodes to bytes that are not UTF-8")
}

// ---------------------------------------------------------------------------------------------
// Responses

fn json_response(status: StatusCode, body: &Value) -> Response {
    // Serializing a `Value` cannot fail; compact output is always a single line.
    json_bytes_response(status, serde_json::to_vec(body).unwrap_or_default())
}

/// A JSON response of serialized bytes.
fn json_bytes_response(status: StatusCode, bytes: Vec<u8>) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        bytes,
    )
        .into_response()
}

/// A transport-level refusal (401, 403, 405, 413, 503) with a JSON-RPC error body.
fn transport_error(status: StatusCode, id: Option<&Value>, message: &str) -> Response {
    let error = RpcError::new(code::INVALID_REQUEST, message);
    json_response(status, &jsonrpc::error_response(id, &error))
}

/// A `text/event-stream` response (axum's [`Sse`]) of `events`, each carrying one JSON-RPC
/// message on a single `data:` line, with a `: keep-alive` comment after every `keep_alive` of
/// silence (none when zero). Dropping the body drops `events` (and what it holds) and releases
/// the caller's place among the requests in flight (`hold`). Both eras' streams are written through it.
fn sse_response(
    events: BoxStream<'static, Event>,
    keep_alive: Duration,
    hold: Option<guards::Hold>,
) -> Response {
    let events = events.map(move |event| {
        let _hold = &hold;
        Ok::<_, Infallible>(event)
    });
    // Proxies (nginx) would otherwise buffer the stream.
    let headers = [(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    )];
    if keep_alive.is_zero() {
        (headers, Sse::new(events)).into_response()
    } else {
        let keep_alive = KeepAlive::new().interval(keep_alive).text("keep-alive");
        (headers, Sse::new(events).keep_alive(keep_alive)).into_response()
    }
}

/// One JSON-RPC message as compact JSON, which never contains a raw newline (strings escape
/// it), so it fits one SSE `data:` line.
fn sse_data(message: &Value) -> String {
    serde_json::to_string(message).unwrap_or_else(|_| "null".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinels_decode() {
        assert_eq!(decode_sentinel("plain").unwrap(), "plain");
        assert_eq!(decode_sentinel("=?base64?aMOpbGxv?=").unwrap(), "héllo");
        assert_eq!(decode_sentinel("=?BASE64?aMOpbGxv?=").unwrap(), "héllo");
        assert_eq!(decode_sentinel("=?base64?ZWNobw==?=").unwrap(), "echo");
        // SEP-2243: missing padding and characters outside the alphabet are invalid.
        assert!(decode_sentinel("=?base64?ZWNobw?=").is_err());
        assert!(decode_sentinel("=?base64?SGVsbG8?=").is_err());
        assert!(decode_sentinel("=?base64?SGVs!!!bG8=?=").is_err());
        assert!(decode_sentinel("=?base64?!!!?=").is_err());
        // Without both the prefix and the suffix a value is literal.
        assert_eq!(decode_sentinel("SGVsbG8=").unwrap(), "SGVsbG8=");
        assert_eq!(
            decode_sentinel("=?base64?SGVsbG8=").unwrap(),
            "=?base64?SGVsbG8="
        );
        assert!(decode_sentinel("=?base64?/w==?=").is_err()); // 0xff is not UTF-8
    }

    #[test]
    fn routing_headers_are_trimmed_and_single() {
        let mut h = HeaderMap::new();
        h.insert(
            "MCP-Protocol-Version",
            HeaderValue::from_static(" 2026-07-28\t"),
        );
        h.insert("mcp-method", HeaderValue::from_static("tools/call"));
        let r = routing_headers(&h).unwrap();
        assert_eq!(r.protocol_version.as_deref(), Some("2026-07-28"));
        assert_eq!(r.method.as_deref(), Some("tools/call"));
        assert_eq!(r.name, None);
        h.append("Mcp-Name", HeaderValue::from_static("a"));
        h.append("Mcp-Name", HeaderValue::from_static("b"));
        assert_eq!(routing_headers(&h).unwrap_err().code, code::HEADER_MISMATCH);
    }

    #[test]
    fn hosts_and_origins() {
        let config = HttpConfig::default()
            .allow_host("mcp.example.com")
            .allow_origin("https://app.example");
        let host = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, HeaderValue::from_static(v));
            check_host(&h, None, &config.allowed_hosts).is_ok()
        };
        assert!(host("localhost:3000"));
        assert!(host("127.0.0.1"));
        assert!(host("[::1]:8080"));
        assert!(host("LOCALHOST"));
        assert!(host("mcp.example.com:443"));
        assert!(!host("evil.example.com"));
        assert!(!host("localhost.evil.example"));
        assert!(!host("127.0.0.1.evil.example:80"));
        // The port part must be a port number.
        assert!(!host("localhost:"));
        assert!(!host("localhost:http"));
        assert!(!host("localhost:65536"));
        assert!(!host("localhost:80:80"));
        assert!(!host("[::1]x"));
        assert!(!host("[::1]:8080x"));
        assert!(!host("mcp.example.com:+443"));
        assert!(host("localhost:65535"));
        // A Host or Origin header sent twice is refused, whatever the values.
        let mut twice = HeaderMap::new();
        twice.append(header::HOST, HeaderValue::from_static("localhost"));
        twice.append(header::HOST, HeaderValue::from_static("localhost"));
        assert!(check_host(&twice, None, &config.allowed_hosts).is_err());
        let mut twice = HeaderMap::new();
        twice.append(header::ORIGIN, HeaderValue::from_static("http://localhost"));
        twice.append(header::ORIGIN, HeaderValue::from_static("http://localhost"));
        assert!(check_origin(&twice, &config.allowed_origins).is_err());
        let origin = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::ORIGIN, HeaderValue::from_static(v));
            check_origin(&h, &config.allowed_origins).is_ok()
        };
        assert!(origin("http://localhost:5173"));
        assert!(origin("https://127.0.0.1"));
        assert!(origin("http://[::1]:1"));
        assert!(origin("https://app.example"));
        assert!(!origin("https://app.example:8443"));
        assert!(!origin("https://evil.example"));
        assert!(!origin("null"));
        assert!(!origin("http://localhost@evil.example"));
        assert!(!origin("file://localhost"));
        assert!(!origin("http://localhost:99999"));
        assert!(!origin("http://localhost:"));
        assert!(check_origin(&HeaderMap::new(), &config.allowed_origins).is_ok());
    }
}
