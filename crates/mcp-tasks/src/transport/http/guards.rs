//! The guards of the MCP route, as layers around it, in the order they run:
//!
//! 1. [`observe`]: times the request, counts refusals (`telemetry::refused`), logs it;
//! 2. [`check_host_and_origin`]: DNS-rebinding protection, `403`;
//! 3. [`allow_methods`]: `POST`, or `GET`/`DELETE` of a legacy session, else `405`;
//! 4. [`authenticate`]: the authenticator on the head alone, `401`/`403`/`503`; `429` for
//!    an address or claimed principal with too many refused tokens;
//! 5. [`bind_connection`]: the caller's connections, `429` (connection closed);
//! 6. [`limit_in_flight`]: the caller's requests in progress, `429`;
//! 7. [`read_body`]: a `POST` body bounded in size (`413`) and time (`408`);
//! 8. [`refuse_writes`]: a read-only credential's write, `403 insufficient_scope`.
//!
//! A refusal carries its [`Kind`] for the log line of [`observe`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::middleware::{Next, from_fn, from_fn_with_state};
use axum::response::Response;
use axum::routing::MethodRouter;
use futures::StreamExt;
use serde_json::Value;

use super::{
    Endpoint, HttpConfig, METHOD_HEADER, check_host, check_origin, json_response, legacy,
    transport_error,
};
use crate::auth::{AuthError, Identity};
use crate::task::Owner;
use crate::wire::error::RpcError;
use crate::wire::jsonrpc;

/// `route` behind the guards.
pub(super) fn guarded(
    route: MethodRouter<Arc<Endpoint>>,
    endpoint: &Arc<Endpoint>,
) -> MethodRouter<Arc<Endpoint>> {
    let state = endpoint.clone();
    // Each layer wraps the ones added before it: the last added runs first.
    route
        .layer(from_fn_with_state(state.clone(), refuse_writes))
        .layer(from_fn_with_state(state.clone(), read_body))
        .layer(from_fn_with_state(state.clone(), limit_in_flight))
        .layer(from_fn(bind_connection))
        .layer(from_fn_with_state(state.clone(), authenticate))
        .layer(from_fn(allow_methods))
        .layer(from_fn_with_state(state, check_host_and_origin))
        .layer(from_fn(observe))
}

/// What answered a request, for the log line of [`observe`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Kind(pub(super) &'static str);

/// The body of a `POST`, read by [`read_body`].
#[derive(Debug, Clone)]
pub(super) struct BodyBytes(pub(super) Bytes);

/// The caller's place among its requests in progress, held by the request (and its
/// response stream) until it ends.
#[derive(Clone)]
pub(super) struct Hold(#[allow(dead_code)] Arc<InFlight>);

/// `response`, refused by a guard for `kind`.
fn refuse(mut response: Response, kind: &'static str) -> Response {
    response.extensions_mut().insert(Kind(kind));
    response
}

async fn observe(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method_header = request
        .headers()
        .get(METHOD_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let response = next.run(request).await;
    // 429s are counted where quota refusals are made (every transport); the others here.
    crate::telemetry::refused(response.status().as_u16());
    let kind = response.extensions().get::<Kind>().map_or("", |k| k.0);
    tracing::debug!(
        method = %method_header,
        status = response.status().as_u16(),
        kind,
        elapsed_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        "MCP HTTP request"
    );
    response
}

/// DNS-rebinding protection: `Host` and `Origin`.
async fn check_host_and_origin(
    State(endpoint): State<Arc<Endpoint>>,
    request: Request,
    next: Next,
) -> Response {
    let config = &endpoint.config;
    if let Err(why) = check_host(
        request.headers(),
        request.uri().authority(),
        &config.allowed_hosts,
    ) {
        return refuse(transport_error(StatusCode::FORBIDDEN, None, &why), "host");
    }
    if let Err(why) = check_origin(request.headers(), &config.allowed_origins) {
        return refuse(transport_error(StatusCode::FORBIDDEN, None, &why), "origin");
    }
    next.run(request).await
}

/// Every MCP message is its own `POST`; `GET` and `DELETE` exist for legacy sessions only.
async fn allow_methods(request: Request, next: Next) -> Response {
    let method = request.method();
    let session_request = (method == Method::GET || method == Method::DELETE)
        && legacy::session_header(request.headers()).is_some();
    if method == Method::POST || session_request {
        return next.run(request).await;
    }
    let mut response = transport_error(
        StatusCode::METHOD_NOT_ALLOWED,
        None,
        &format!("{method} is not supported: every MCP message is its own POST"),
    );
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    refuse(response, "method")
}

/// Who is calling, from the head alone: nothing unauthenticated is buffered. The
/// [`Identity`] goes into the request's extensions.
async fn authenticate(
    State(endpoint): State<Arc<Endpoint>>,
    request: Request,
    next: Next,
) -> Response {
    let (mut parts, body) = request.into_parts();
    match identify(&endpoint, &parts).await {
        Ok(identity) => {
            parts.extensions.insert(identity);
            next.run(Request::from_parts(parts, body)).await
        }
        Err(refusal) => refuse(refusal, "unauthorized"),
    }
}

/// The caller's connections, bounded (when [`super::serve_with`] serves the request).
async fn bind_connection(request: Request, next: Next) -> Response {
    match connection_refusal(&request) {
        Some(refusal) => refuse(refusal, "too-many-connections"),
        None => next.run(request).await,
    }
}

/// The caller's requests in progress, bounded; an open SSE stream counts until it closes,
/// and a request its client abandoned until it ends (see [`Hold`]).
async fn limit_in_flight(
    State(endpoint): State<Arc<Endpoint>>,
    mut request: Request,
    next: Next,
) -> Response {
    let owner = request
        .extensions()
        .get::<Identity>()
        .map_or_else(Owner::anonymous, |i| i.owner.clone());
    let Some(in_flight) = begin_request(&endpoint, &owner) else {
        return refuse(too_many(&endpoint.config), "too-many");
    };
    let hold = Hold(Arc::new(in_flight));
    request.extensions_mut().insert(hold.clone());
    let response = next.run(request).await;
    drop(hold);
    response
}

/// A `POST` body, bounded in size and time, into the request's extensions ([`BodyBytes`]).
async fn read_body(
    State(endpoint): State<Arc<Endpoint>>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let config = &endpoint.config;
    let (mut parts, body) = request.into_parts();
    let read = tokio::time::timeout(
        config.body_timeout,
        collect_body(&parts.headers, body, config.max_body_bytes),
    )
    .await;
    let refusal = match read {
        Ok(Ok(bytes)) => {
            parts.extensions.insert(BodyBytes(bytes));
            return next.run(Request::from_parts(parts, Body::empty())).await;
        }
        Err(_) => body_refusal(config, None),
        Ok(Err(e)) => body_refusal(config, Some(e)),
    };
    refuse(refusal.0, refusal.1)
}

/// The refusal of a body that did not arrive in time (`None`) or could not be read.
fn body_refusal(config: &HttpConfig, error: Option<BodyError>) -> (Response, &'static str) {
    let (status, why, kind) = match error {
        None => (
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s",
                config.body_timeout.as_secs_f64()
            ),
            "body-timeout",
        ),
        Some(BodyError::TooLarge) => (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body exceeds the limit of {} bytes",
                config.max_body_bytes
            ),
            "too-large",
        ),
        Some(BodyError::Read(e)) => (
            StatusCode::BAD_REQUEST,
            format!("the request body could not be read: {e}"),
            "body",
        ),
    };
    (transport_error(status, None, &why), kind)
}

/// A read-only credential (`tasks:read`) reads, in both eras.
async fn refuse_writes(
    State(endpoint): State<Arc<Endpoint>>,
    request: Request,
    next: Next,
) -> Response {
    let extensions = request.extensions();
    if let (Some(identity), Some(body)) =
        (extensions.get::<Identity>(), extensions.get::<BodyBytes>())
        && let Some(refusal) = refuse_write(&endpoint.config, identity, &body.0)
    {
        return refuse(refusal, "read-only");
    }
    next.run(request).await
}

// ---------------------------------------------------------------------------------------------
// Requests in progress

/// Counts one more request of `owner`, unless it has the most allowed.
fn begin_request(endpoint: &Arc<Endpoint>, owner: &Owner) -> Option<InFlight> {
    let mut map = endpoint.in_flight();
    let n = map.entry(owner.clone()).or_default();
    if *n >= endpoint.config.max_requests_per_principal {
        return None;
    }
    *n += 1;
    Some(InFlight {
        endpoint: endpoint.clone(),
        owner: owner.clone(),
    })
}

/// One request in progress; dropped when its response (or SSE stream) is done.
pub(super) struct InFlight {
    endpoint: Arc<Endpoint>,
    owner: Owner,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut map = self.endpoint.in_flight();
        if let Some(n) = map.get_mut(&self.owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.owner);
            }
        }
    }
}

/// `429` for a caller with too many requests in progress.
fn too_many(config: &HttpConfig) -> Response {
    quota_refusal(
        crate::quota::QuotaKind::ConcurrentRequests,
        config.max_requests_per_principal,
    )
}

/// Counts the request's connection (when [`serve_with`] serves it) for the caller's
/// principal; the `429` to send (quota `connections`, the connection closed after the answer)
/// when the principal already holds its most connections.
fn connection_refusal(request: &Request) -> Option<Response> {
    let identity = request.extensions().get::<Identity>()?;
    let slot = request
        .extensions()
        .get::<super::super::server::ConnectionSlot>()?;
    let refused = slot.authenticated(&identity.owner).err()?;
    tracing::info!("request refused: the principal holds its most connections");
    let mut response = quota_refusal(crate::quota::QuotaKind::Connections, refused.limit);
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    Some(response)
}

/// `429` with `Retry-After: 1` for a transport-level quota.
fn quota_refusal(kind: crate::quota::QuotaKind, limit: usize) -> Response {
    let error = RpcError::from(crate::quota::QuotaError {
        kind,
        limit: limit as u64,
        retry_after: Duration::from_secs(1),
    });
    let mut response = json_response(
        StatusCode::TOO_MANY_REQUESTS,
        &jsonrpc::error_response(None, &error),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

// ---------------------------------------------------------------------------------------------
// Refusals

/// The caller's identity, or the `401`/`403`/`429`/`503` refusal to send. A refused bearer
/// token counts against its address and claimed principal ([`crate::auth::FailureThrottle`]);
/// once they are over the limit, requests carrying a credential are `429` unchecked.
async fn identify(
    endpoint: &Endpoint,
    parts: &axum::http::request::Parts,
) -> Result<Identity, Response> {
    let config = &endpoint.config;
    let address = peer_address(parts);
    let claimed = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::auth::claimed_principal);
    let carries_credential = parts.headers.contains_key(header::AUTHORIZATION);
    if carries_credential
        && let Err(retry_after) = endpoint.throttle.check(address, claimed.as_deref())
    {
        crate::telemetry::auth_failure("mcp", "throttled");
        tracing::info!(
            address = ?address,
            claimed = ?claimed,
            "request refused: too many refused credentials from this address or for this principal"
        );
        return Err(throttled(retry_after));
    }
    let result = config.authenticator.authenticate(parts).await;
    let result = result.and_then(|identity| match &config.resource {
        // A read-only credential is admitted; what it asks for is checked once the message
        // is read.
        Some(resource) => identity.access(&resource.scopes).map(|_| identity),
        None => Ok(identity),
    });
    let error = match result {
        Ok(identity) => return Ok(identity),
        Err(error) => error,
    };
    if let AuthError::InvalidToken(_) = error {
        endpoint.throttle.failed(address, claimed.as_deref());
        crate::telemetry::auth_failure("mcp", "invalid_token");
    }
    tracing::info!(reason = %error, address = ?address, claimed = ?claimed, "request refused by authentication");
    Err(auth_refusal(config, &error, None))
}

/// The TCP peer's address of a request, when the server that accepted it says
/// (`ConnectInfo<SocketAddr>`: [`super::serve_with`] and axum's
/// `into_make_service_with_connect_info` set it).
pub(crate) fn peer_address(parts: &axum::http::request::Parts) -> Option<std::net::IpAddr> {
    parts
        .extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip())
}

/// `429` with `Retry-After` for a throttled credential.
pub(crate) fn throttled(retry_after: Duration) -> Response {
    let mut response = transport_error(
        StatusCode::TOO_MANY_REQUESTS,
        None,
        &format!(
            "Too many refused credentials from this address or for this principal: retry in {} s",
            retry_after.as_secs()
        ),
    );
    if let Ok(value) = HeaderValue::from_str(&retry_after.as_secs().to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

/// Whether `identity` may only read on this server.
fn read_only(config: &HttpConfig, identity: &Identity) -> bool {
    let required = config.resource.as_ref().map_or(&[][..], |r| &r.scopes[..]);
    identity.is_read_only(required)
}

/// `403 insufficient_scope` for a read-only caller whose message `body` changes something;
/// `None` when it only reads.
fn refuse_write(config: &HttpConfig, identity: &Identity, body: &[u8]) -> Option<Response> {
    if !read_only(config, identity) {
        return None;
    }
    let message: Value = serde_json::from_slice(body).ok()?;
    if !crate::auth::is_write(&message) {
        return None;
    }
    let what = message
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or("an answer to the server's request");
    tracing::info!(
        method = %crate::telemetry::method_label(what),
        "request refused: a read-only credential asked for a write"
    );
    let required = config
        .resource
        .as_ref()
        .map(|r| r.scopes.clone())
        .unwrap_or_default();
    let message = format!(
        "Forbidden: the bearer token grants `{}` only, and {what} changes a task",
        crate::auth::READ_ONLY_SCOPE
    );
    Some(auth_refusal(
        config,
        &AuthError::InsufficientScope(required),
        Some(message),
    ))
}

/// The `401`/`403`/`503` response for `error` (`message` replaces the default text).
fn auth_refusal(config: &HttpConfig, error: &AuthError, message: Option<String>) -> Response {
    let (status, default_message) = match error {
        AuthError::InsufficientScope(_) => (StatusCode::FORBIDDEN, format!("Forbidden: {error}")),
        AuthError::Unavailable(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("Service unavailable: {error}"),
        ),
        _ => (StatusCode::UNAUTHORIZED, format!("Unauthorized: {error}")),
    };
    let message = message.unwrap_or(default_message);
    let mut response = transport_error(status, None, &message);
    let challenge = match &config.resource {
        Some(resource) => resource.challenge(error),
        None => match error {
            AuthError::InvalidToken(_) => "Bearer error=\"invalid_token\"".to_owned(),
            AuthError::InsufficientScope(_) => "Bearer error=\"insufficient_scope\"".to_owned(),
            _ => "Bearer".to_owned(),
        },
    };
    if status != StatusCode::SERVICE_UNAVAILABLE
        && let Ok(value) = HeaderValue::from_str(&challenge)
    {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    }
    response
}

// ---------------------------------------------------------------------------------------------
// Body

enum BodyError {
    TooLarge,
    Read(axum::Error),
}

async fn collect_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, BodyError> {
    if let Some(length) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        && length > limit as u64
    {
        return Err(BodyError::TooLarge);
    }
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(BodyError::Read)?;
        if buf.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buf))
}
