//! Streamable HTTP for legacy (`2025-11-25`, `2025-06-18`) sessions on the same endpoint.
//!
//! - `POST` `initialize` (without `Mcp-Session-Id`): the response carries the new
//!   `Mcp-Session-Id`; every later message of the session must carry it (a legacy request
//!   without it is `400`), and an id that does not verify for the caller, expired or was ended
//!   is `404` (the client starts a new session).
//! - `POST` of a notification or of a response to a server-to-client request: `202`.
//! - `POST` of a request: one JSON response, or an SSE stream when the request sends
//!   notifications or server-to-client requests before its response. Every SSE event has an
//!   id (`{stream}-{seq}`); the stream goes on when the client disconnects, and `GET` with
//!   `Last-Event-ID` resumes it after that event. A stream nobody reads for
//!   [`super::HttpConfig::legacy_resume_grace`] stops (an abandoned `tasks/result` stops
//!   following its task).
//! - A caller whose [`crate::quota::Quotas::max_sessions`] sessions all have an open stream
//!   or a request waiting for it gets `429` with `Retry-After` for another one.
//! - `GET` with `Mcp-Session-Id`: the session's standing stream (task status notifications,
//!   input requests of its tasks); one reader at a time, a newer one replaces the older.
//! - `DELETE` with `Mcp-Session-Id`: ends the session.
//!
//! JSON-RPC errors of legacy requests travel with `200`, as those revisions expect.

use std::sync::Arc;
use std::time::Duration;

use axum::http::header::{HeaderMap, HeaderName, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::Value;

use super::{Endpoint, InFlight, accepts_event_stream, json_response, transport_error};
use crate::legacy::{self, LEGACY_VERSIONS, LegacyOutcome, Session, SessionState};
use crate::quota::QuotaError;
use crate::task::Owner;
use crate::wire::error::RpcError;

/// The `Mcp-Session-Id` header.
pub const SESSION_HEADER: &str = "mcp-session-id";
/// The `Last-Event-ID` header.
const LAST_EVENT_ID: &str = "last-event-id";

/// The session id a request carries, if any.
pub(super) fn session_header(headers: &HeaderMap) -> Option<String> {
    headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// Whether a `POST` body belongs to the legacy surface: it opens a session, or it comes with
/// a session id and does not declare the `2026-07-28` era. Decided without parsing when
/// neither marker can be there, so modern traffic pays nothing.
pub(super) fn is_legacy_post(headers: &HeaderMap, body: &[u8]) -> Option<Value> {
    let has_session = headers.contains_key(SESSION_HEADER);
    if !has_session && !contains(body, b"initialize") {
        return None;
    }
    let message: Value = serde_json::from_slice(body).ok()?;
    if !message.is_object() {
        return None;
    }
    if legacy::is_initialize(&message) || (has_session && !legacy::is_modern(&message)) {
        Some(message)
    } else {
        None
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The `404` of a session id that is not accepted. The reason (another caller's session, a
/// signature that does not verify, expired, ended) is only logged: the body is the same for
/// every one.
fn not_found() -> Response {
    transport_error(
        StatusCode::NOT_FOUND,
        None,
        "Session not found; send initialize to start a new session",
    )
}

/// `429` with `Retry-After` for a session refused by a quota.
fn quota_refusal(e: QuotaError) -> Response {
    let secs = e.retry_after_secs();
    let body = crate::wire::jsonrpc::error_response(None, &RpcError::from(e));
    let mut response = json_response(StatusCode::TOO_MANY_REQUESTS, &body);
    response
        .headers_mut()
        .insert(axum::http::header::RETRY_AFTER, HeaderValue::from(secs));
    response
}

fn session_id_header(id: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(id).ok()
}

/// Resolves the session of a request, or the refusal to send.
async fn resolve(
    endpoint: &Endpoint,
    headers: &HeaderMap,
    owner: &Owner,
) -> Result<(Session, SessionState), Response> {
    let Some(id) = session_header(headers) else {
        return Err(transport_error(
            StatusCode::BAD_REQUEST,
            None,
            "Bad Request: the Mcp-Session-Id header is required after initialize",
        ));
    };
    match endpoint.legacy.resolve(&id, owner).await {
        Ok(found) => Ok(found),
        Err(e) => {
            tracing::info!(principal = %owner.log_id(), reason = %e, "legacy session id refused (404)");
            Err(not_found())
        }
    }
}

/// A `MCP-Protocol-Version` header, when present, must name a legacy version we speak; the
/// `400` to send when it does not.
fn version_refusal(headers: &HeaderMap) -> Option<Response> {
    match headers
        .get(super::PROTOCOL_VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
    {
        None => None,
        Some(v) if LEGACY_VERSIONS.contains(&v) => None,
        Some(v) => Some(transport_error(
            StatusCode::BAD_REQUEST,
            None,
            &format!(
                "Bad Request: unsupported MCP-Protocol-Version `{v}` for a session (supported: {})",
                LEGACY_VERSIONS.join(", ")
            ),
        )),
    }
}

/// A legacy `POST`.
pub(super) async fn post(
    endpoint: &Arc<Endpoint>,
    headers: &HeaderMap,
    owner: Owner,
    message: Value,
    in_flight: InFlight,
) -> (Response, &'static str) {
    if legacy::is_initialize(&message) && session_header(headers).is_none() {
        return match endpoint.legacy.initialize(&message, &owner) {
            Ok((body, session)) => {
                if let Err(e) = endpoint.legacy.live(&session, &owner) {
                    return (quota_refusal(e), "legacy-initialize");
                }
                let id = endpoint.legacy.session_id(&session);
                let mut response = json_response(StatusCode::OK, &body);
                if let Some(value) = session_id_header(&id) {
                    response
                        .headers_mut()
                        .insert(HeaderName::from_static(SESSION_HEADER), value);
                }
                (response, "legacy-initialize")
            }
            Err(body) => (json_response(StatusCode::OK, &body), "legacy-json"),
        };
    }
    if let Some(refusal) = version_refusal(headers) {
        return (refusal, "legacy-version");
    }
    let (session, state) = match resolve(endpoint, headers, &owner).await {
        Ok(found) => found,
        Err(refusal) => return (refusal, "legacy-session"),
    };
    let streams = accepts_event_stream(headers);
    let legacy = endpoint.legacy.clone();
    let live = match legacy.live(&session, &owner) {
        Ok(live) => live,
        Err(e) => return (quota_refusal(e), "legacy-session"),
    };
    // `tasks/result` only reads: when its client goes away before the answer, it stops (and
    // lets go of the task it follows).
    let reads_only = message.get("method").and_then(Value::as_str) == Some("tasks/result");
    // The request runs on its own task: a client that disconnects cannot cut it in half.
    let handled = tokio::spawn(async move {
        legacy
            .handle(&session, &state, &owner, message, streams)
            .await
    });
    let mut stop_if_gone = AbortOnDrop(reads_only.then(|| handled.abort_handle()));
    let handled = handled.await;
    stop_if_gone.0 = None;
    match handled {
        Ok(LegacyOutcome::Accepted) => (StatusCode::ACCEPTED.into_response(), "legacy-accepted"),
        Ok(LegacyOutcome::Reply(body)) => (json_response(StatusCode::OK, &body), "legacy-json"),
        Ok(LegacyOutcome::Stream(messages)) => {
            // The messages go into a resumable log, read by this response; if the client
            // disconnects, the rest waits there for a GET with Last-Event-ID.
            let log = live.open_stream();
            let events = log.read(Some(1)).boxed();
            let writer = log.clone();
            let grace = endpoint.config.legacy_resume_grace;
            tokio::spawn(async move {
                let mut messages = messages;
                let mut abandoned = std::pin::pin!(writer.unread_for(grace));
                loop {
                    tokio::select! {
                        message = messages.next() => match message {
                            Some(message) => {
                                writer.push(message);
                            }
                            None => break,
                        },
                        () = &mut abandoned => {
                            // Nobody read or resumed the stream for the grace: the request
                            // stops (its follower of a task lets go).
                            tracing::debug!("an unread legacy response stream stopped");
                            break;
                        }
                    }
                }
                drop(messages);
                writer.finish();
            });
            (
                sse_response(events, endpoint.config.keep_alive, in_flight),
                "legacy-sse",
            )
        }
        Err(e) => {
            tracing::error!(error = %e, "a legacy request failed");
            let error = RpcError::internal("the request could not be completed");
            let body = crate::wire::jsonrpc::error_response(None, &error);
            (
                json_response(StatusCode::INTERNAL_SERVER_ERROR, &body),
                "legacy-json",
            )
        }
    }
}

/// Aborts a task when dropped (the request's client went away before its answer).
struct AbortOnDrop(Option<tokio::task::AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// A legacy `GET` (the standing stream, or a resumption) or `DELETE`.
pub(super) async fn get_or_delete(
    endpoint: &Arc<Endpoint>,
    method: &Method,
    headers: &HeaderMap,
    owner: Owner,
    in_flight: InFlight,
) -> (Response, &'static str) {
    if let Some(refusal) = version_refusal(headers) {
        return (refusal, "legacy-version");
    }
    let (session, _state) = match resolve(endpoint, headers, &owner).await {
        Ok(found) => found,
        Err(refusal) => return (refusal, "legacy-session"),
    };
    if method == Method::DELETE {
        return match endpoint.legacy.end(&session).await {
            Ok(()) => (StatusCode::OK.into_response(), "legacy-delete"),
            Err(e) => {
                let body = crate::wire::jsonrpc::error_response(None, &e);
                (
                    json_response(StatusCode::INTERNAL_SERVER_ERROR, &body),
                    "legacy-delete",
                )
            }
        };
    }
    if !accepts_event_stream(headers) {
        return (
            transport_error(
                StatusCode::NOT_ACCEPTABLE,
                None,
                "Not Acceptable: a GET stream needs Accept: text/event-stream",
            ),
            "legacy-get",
        );
    }
    let live = match endpoint.legacy.live(&session, &owner) {
        Ok(live) => live,
        Err(e) => return (quota_refusal(e), "legacy-get"),
    };
    let resume = headers
        .get(LAST_EVENT_ID)
        .and_then(|v| v.to_str().ok())
        .and_then(legacy::parse_event_id)
        .and_then(|(stream, seq)| live.stream(stream).map(|log| (log, seq)));
    let events = match resume {
        Some((log, seq)) => log.read(Some(seq + 1)).boxed(),
        None => live.standing.read(None).boxed(),
    };
    (
        sse_response(events, endpoint.config.keep_alive, in_flight),
        "legacy-get",
    )
}

/// The session's SSE response: each event with its id (for `Last-Event-ID`), through the
/// transport's one SSE body.
fn sse_response(
    events: BoxStream<'static, (String, Value)>,
    keep_alive: Duration,
    in_flight: InFlight,
) -> Response {
    let framed = events.map(|(id, message)| event(&id, &message)).boxed();
    super::sse_response(framed, keep_alive, in_flight)
}

/// One SSE event with its id (`{stream}-{seq}`, ASCII digits and a dash), carrying one
/// JSON-RPC message on a single `data:` line.
fn event(id: &str, message: &Value) -> Event {
    Event::default()
        .id(id)
        .event("message")
        .data(super::sse_data(message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_initialize_or_a_session_is_legacy() {
        let none = HeaderMap::new();
        let init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}"#;
        assert!(is_legacy_post(&none, init).is_some());
        let modern_init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        assert!(is_legacy_post(&none, modern_init).is_none());
        let list = br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
        assert!(is_legacy_post(&none, list).is_none());
        let mut with = HeaderMap::new();
        with.insert(SESSION_HEADER, HeaderValue::from_static("mcs1.x.y"));
        assert!(is_legacy_post(&with, list).is_some());
        let modern = br#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        assert!(is_legacy_post(&with, modern).is_none());
        let discover = br#"{"jsonrpc":"2.0","id":2,"method":"server/discover"}"#;
        assert!(is_legacy_post(&with, discover).is_none());
    }

    #[tokio::test]
    async fn events_carry_their_id() {
        let events = futures::stream::iter([
            Ok::<_, std::convert::Infallible>(event("3-7", &serde_json::json!({"a":1}))),
            Ok(event("3-8", &serde_json::json!({"b":"two\nlines"}))),
        ]);
        let body = axum::response::sse::Sse::new(events)
            .into_response()
            .into_body();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            "id: 3-7\nevent: message\ndata: {\"a\":1}\n\n\
             id: 3-8\nevent: message\ndata: {\"b\":\"two\\nlines\"}\n\n"
        );
    }
}
