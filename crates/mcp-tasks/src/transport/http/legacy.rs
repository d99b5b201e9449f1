//! Streamable HTTP for legacy (`2025-11-25`, `2025-06-18`) sessions on the same endpoint: the
//! HTTP side only (the `Mcp-Session-Id` and `Last-Event-ID` headers, SSE events with ids);
//! sessions themselves are the era entry's (`era::Entry`).
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

use std::time::Duration;

use axum::http::header::HeaderMap;
use axum::response::Response;
use axum::response::sse::Event;
use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::Value;

use super::guards::Hold;
use crate::era::SessionId;

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

/// The session id of a request for the era entry, with the protocol version it declares.
pub(super) fn session_id(headers: &HeaderMap, resume_grace: Duration) -> SessionId {
    SessionId {
        present: headers.contains_key(SESSION_HEADER),
        id: session_header(headers),
        protocol_version: headers
            .get(super::PROTOCOL_VERSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_owned()),
        resume_grace,
    }
}

/// The `Last-Event-ID` of a `GET` that resumes a stream.
pub(super) fn last_event_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get(LAST_EVENT_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The session's SSE response: each event with its id (for `Last-Event-ID`), through the
/// transport's one SSE body.
pub(super) fn sse_response(
    events: BoxStream<'static, (String, Value)>,
    keep_alive: Duration,
    hold: Option<Hold>,
) -> Response {
    let framed = events.map(|(id, message)| event(&id, &message)).boxed();
    super::sse_response(framed, keep_alive, hold)
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
    use axum::response::IntoResponse;

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
