//! The one entry of both protocol eras: every transport hands each message here, with what it
//! knows of the request in a transport-neutral [`Context`], and writes the [`Outcome`].
//!
//! Era detection lives here and nowhere else ([`Era::of`]): `initialize` without a session
//! opens a legacy (`2025-11-25`, `2025-06-18`) session; a message that comes with a legacy
//! session and does not declare the `2026-07-28` era belongs to it; everything else is modern
//! and goes to the dispatcher untouched. How a session travels is the transport's
//! [`Binding`]: a stdio connection *is* its session once it opened with `initialize`; over
//! HTTP (feature `http`) it is the `Mcp-Session-Id` header, which this module resolves,
//! creates and ends, and whose streams it makes resumable.
//!
//! The transports keep only their own concerns: reading and framing messages, HTTP headers
//! and status codes, SSE.

use std::sync::Arc;
#[cfg(feature = "http")]
use std::time::Duration;

use futures::stream::BoxStream;
use serde_json::Value;
#[cfg(feature = "http")]
use tokio_util::bytes::Bytes;

use crate::legacy::{self, Legacy, LegacyOutcome, Live, Session};
use crate::protocol::{Dispatched, MessageStream, Reply, RequestContext, RoutingHeaders};
use crate::runtime::RuntimeHandle;
use crate::task::Owner;
use crate::wire::error::RpcError;
use crate::wire::jsonrpc;

/// Which era a message belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Era {
    /// `2026-07-28`: the dispatcher, untouched.
    Modern,
    /// A legacy `initialize` that comes without a session: it opens one.
    Initialize,
    /// A message of a legacy session.
    Legacy,
}

impl Era {
    /// The era of `message`. `marked` says whether the message comes marked as a session's
    /// (a stdio connection with a session, an HTTP request with an `Mcp-Session-Id` header),
    /// `session` whether that mark names one (a header that is not empty).
    pub(crate) fn of(message: &Value, marked: bool, session: bool) -> Self {
        if legacy::is_initialize(message) && !session {
            Era::Initialize
        } else if legacy::is_initialize(message) || (marked && !legacy::is_modern(message)) {
            Era::Legacy
        } else {
            Era::Modern
        }
    }

    /// The era of a message still in bytes. Decided without parsing when neither marker can
    /// be there, so modern traffic pays nothing; `None` (modern) when the bytes do not parse:
    /// the dispatcher answers them. Otherwise the parsed message comes along.
    #[cfg(feature = "http")]
    fn of_bytes(body: &[u8], marked: bool, session: bool) -> (Self, Option<Value>) {
        if !marked && !contains(body, b"initialize") {
            return (Era::Modern, None);
        }
        match serde_json::from_slice::<Value>(body) {
            Ok(message) if message.is_object() => match Era::of(&message, marked, session) {
                Era::Modern => (Era::Modern, None),
                era => (era, Some(message)),
            },
            _ => (Era::Modern, None),
        }
    }
}

#[cfg(feature = "http")]
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// What a transport hands to the entry.
pub(crate) enum Message {
    /// A message as received (HTTP `POST`).
    #[cfg(feature = "http")]
    Bytes(Bytes),
    /// A message already parsed (a stdio line).
    Json(Value),
    /// Open the session's standing stream, or resume one of its streams after an event id
    /// (HTTP `GET`, `Last-Event-ID`).
    #[cfg(feature = "http")]
    OpenStream {
        /// The last event the client received.
        last_event_id: Option<String>,
    },
    /// End the session (HTTP `DELETE`).
    #[cfg(feature = "http")]
    EndSession,
}

/// How a legacy session travels with messages.
pub(crate) enum Binding {
    /// The connection is the session, once `initialize` opened one (stdio).
    Connection(Option<Session>),
    /// A session id with each message (HTTP `Mcp-Session-Id`).
    #[cfg(feature = "http")]
    Id(SessionId),
}

/// A session id as a request carries it, with what goes with it.
#[cfg(feature = "http")]
pub(crate) struct SessionId {
    /// Whether the request carries the header at all (possibly empty).
    pub(crate) present: bool,
    /// Its value, trimmed, when not empty.
    pub(crate) id: Option<String>,
    /// The `MCP-Protocol-Version` the request declares, if any.
    pub(crate) protocol_version: Option<String>,
    /// How long the rest of a response stream is kept coming after its reader went away.
    pub(crate) resume_grace: Duration,
}

/// What a transport knows of a request besides the message.
pub(crate) struct Context {
    /// Who sends it.
    pub(crate) owner: Owner,
    /// Whether the transport can send several messages for one request.
    pub(crate) streams: bool,
    /// How a legacy session travels.
    pub(crate) binding: Binding,
    /// The routing headers as read (HTTP); `None` for a transport without headers.
    pub(crate) routing: Option<Result<RoutingHeaders, RpcError>>,
    /// Whether a missing `Mcp-Name` on `tasks/*` is refused.
    pub(crate) strict_headers: bool,
    /// When set, a modern request runs on its own task, to its end even if its client goes
    /// away, and holds this until then (HTTP: the caller's place among its requests in
    /// progress).
    #[cfg(feature = "http")]
    pub(crate) hold: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl Context {
    /// The context of a transport without headers (stdio).
    pub(crate) fn new(owner: Owner, streams: bool, binding: Binding) -> Self {
        Self {
            owner,
            streams,
            binding,
            routing: None,
            strict_headers: false,
            #[cfg(feature = "http")]
            hold: None,
        }
    }
}

/// What the transport writes.
pub(crate) enum Outcome {
    /// Nothing (a notification, a response of the client; HTTP `202`).
    Accepted,
    /// The dispatcher's answer, with its HTTP status.
    Reply(Reply),
    /// A modern request's messages, the response last.
    Stream(MessageStream),
    /// A legacy answer: one JSON-RPC message (HTTP `200`).
    Json(Value),
    /// `initialize` opened a session: its response, the session, its id (HTTP) and its
    /// in-process state (whose standing stream a connection forwards).
    Opened {
        /// The `initialize` response.
        body: Value,
        /// The new session.
        session: Box<Session>,
        /// Its `Mcp-Session-Id` when the binding is by id.
        #[cfg(feature = "http")]
        id: Option<String>,
        /// Its in-process state.
        live: Arc<Live>,
    },
    /// A legacy request's messages on its connection, the response last.
    Messages(BoxStream<'static, Value>),
    /// The session ended (HTTP `200` without a body).
    #[cfg(feature = "http")]
    Ended,
    /// A legacy stream that can be resumed: each message with its event id.
    #[cfg(feature = "http")]
    Events(BoxStream<'static, (String, Value)>),
    /// Refused, or failed, before any answer: the HTTP status, the error (sent without an
    /// id) and the `Retry-After` seconds, if any.
    #[cfg(feature = "http")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The error.
        error: RpcError,
        /// Seconds for `Retry-After`.
        retry_after: Option<u64>,
    },
}

impl Outcome {
    #[cfg(feature = "http")]
    fn refused(status: u16, error: RpcError) -> Self {
        Outcome::Refused {
            status,
            error,
            retry_after: None,
        }
    }
}

/// The entry of one runtime for one transport.
pub(crate) struct Entry {
    handle: RuntimeHandle,
    legacy: Arc<Legacy>,
}

impl Entry {
    pub(crate) fn new(handle: RuntimeHandle) -> Self {
        Self {
            legacy: Legacy::new(handle.clone()),
            handle,
        }
    }

    /// Handles one message of either era: the outcome to write and a label for the
    /// transport's log.
    pub(crate) async fn handle(&self, message: Message, ctx: Context) -> (Outcome, &'static str) {
        match message {
            #[cfg(feature = "http")]
            Message::Bytes(body) => {
                let (marked, session) = ctx.binding.marks();
                match Era::of_bytes(&body, marked, session) {
                    (Era::Modern, _) | (_, None) => self.modern(Incoming::Bytes(body), ctx).await,
                    (era, Some(message)) => self.legacy(era, message, ctx).await,
                }
            }
            Message::Json(message) => {
                let (marked, session) = ctx.binding.marks();
                match Era::of(&message, marked, session) {
                    Era::Modern => self.modern(Incoming::Json(message), ctx).await,
                    era => self.legacy(era, message, ctx).await,
                }
            }
            #[cfg(feature = "http")]
            Message::OpenStream { last_event_id } => {
                self.open_stream(ctx, last_event_id.as_deref()).await
            }
            #[cfg(feature = "http")]
            Message::EndSession => self.end_session(ctx).await,
        }
    }

    /// Forgets the in-process state of a connection's session (the connection closed; the
    /// session's tasks stay).
    pub(crate) fn forget(&self, session: &Session) {
        self.legacy.forget(session);
    }

    // -----------------------------------------------------------------------------------
    // Modern

    async fn modern(&self, message: Incoming, ctx: Context) -> (Outcome, &'static str) {
        let request = match ctx.routing {
            None => RequestContext::new(ctx.owner),
            Some(Ok(headers)) => RequestContext::http(ctx.owner, headers, ctx.strict_headers),
            // A malformed routing header is -32020 for a request; a notification and an
            // unreadable message get the dispatcher's usual answer.
            Some(Err(error)) => match message.request_id() {
                Some(id) => return (Outcome::Reply(Reply::error(Some(&id), &error)), "json"),
                None => {
                    RequestContext::http(ctx.owner, RoutingHeaders::default(), ctx.strict_headers)
                }
            },
        };
        let request = request.with_streams(ctx.streams);
        #[cfg(feature = "http")]
        let dispatched = match ctx.hold {
            None => message.dispatch(&self.handle, &request).await,
            Some(hold) => match self.detached(message, request, hold).await {
                Some(dispatched) => dispatched,
                None => return (failed(), "json"),
            },
        };
        #[cfg(not(feature = "http"))]
        let dispatched = message.dispatch(&self.handle, &request).await;
        match dispatched {
            Dispatched::Accepted => (Outcome::Accepted, "accepted"),
            Dispatched::Reply(reply) => (Outcome::Reply(reply), "json"),
            Dispatched::Stream(stream) => (Outcome::Stream(stream), "sse"),
        }
    }

    /// Dispatches on its own task, which runs to completion even if the client goes away
    /// meanwhile and keeps `hold` until then; `None` when that task failed.
    #[cfg(feature = "http")]
    async fn detached(
        &self,
        message: Incoming,
        request: RequestContext,
        hold: Box<dyn std::any::Any + Send + Sync>,
    ) -> Option<Dispatched> {
        let handle = self.handle.clone();
        let detached = tokio::spawn(async move {
            let dispatched = message.dispatch(&handle, &request).await;
            drop(hold);
            dispatched
        });
        detached
            .await
            .inspect_err(|e| tracing::error!(error = %e, "the dispatcher task failed"))
            .ok()
    }

    // -----------------------------------------------------------------------------------
    // Legacy

    async fn legacy(&self, era: Era, message: Value, ctx: Context) -> (Outcome, &'static str) {
        if era == Era::Initialize {
            return self.initialize(&message, &ctx);
        }
        match ctx.binding {
            Binding::Connection(Some(session)) => {
                let state = self.legacy.state(&session).await;
                let handled = self
                    .legacy
                    .handle(&session, &state, &ctx.owner, message, ctx.streams)
                    .await;
                let outcome = match handled {
                    LegacyOutcome::Accepted => Outcome::Accepted,
                    LegacyOutcome::Reply(body) => Outcome::Json(body),
                    LegacyOutcome::Stream(messages) => Outcome::Messages(messages),
                };
                (outcome, "legacy")
            }
            // Never: a connection without a session marks no message as legacy.
            Binding::Connection(None) => self.modern(Incoming::Json(message), ctx).await,
            #[cfg(feature = "http")]
            Binding::Id(ref id) => self.by_id(id, message, &ctx).await,
        }
    }

    /// Answers `initialize`: a new session, unless the caller's quota of sessions is used up.
    fn initialize(&self, message: &Value, ctx: &Context) -> (Outcome, &'static str) {
        let (body, session) = match self.legacy.initialize(message, &ctx.owner) {
            Ok(opened) => opened,
            Err(body) => return (Outcome::Json(body), "legacy-json"),
        };
        let live = match self.legacy.live(&session, &ctx.owner) {
            Ok(live) => live,
            Err(e) => {
                return (
                    self.session_refused(&ctx.binding, message, e),
                    "legacy-initialize",
                );
            }
        };
        let opened = Outcome::Opened {
            body,
            #[cfg(feature = "http")]
            id: match &ctx.binding {
                Binding::Connection(_) => None,
                Binding::Id(_) => Some(self.legacy.session_id(&session)),
            },
            session: Box::new(session),
            live,
        };
        (opened, "legacy-initialize")
    }

    /// A session refused by the quota of sessions: an error response on a connection,
    /// `429` with `Retry-After` over HTTP.
    fn session_refused(
        &self,
        binding: &Binding,
        message: &Value,
        e: crate::quota::QuotaError,
    ) -> Outcome {
        match binding {
            Binding::Connection(_) => {
                let id = message.get("id").cloned().unwrap_or(Value::Null);
                Outcome::Json(jsonrpc::error_response(Some(&id), &RpcError::from(e)))
            }
            #[cfg(feature = "http")]
            Binding::Id(_) => Outcome::Refused {
                status: 429,
                retry_after: Some(e.retry_after_secs()),
                error: RpcError::from(e),
            },
        }
    }
}

/// The `500` of a request whose task failed.
#[cfg(feature = "http")]
fn failed() -> Outcome {
    Outcome::Refused {
        status: 500,
        error: RpcError::internal("the request could not be completed"),
        retry_after: None,
    }
}

impl Binding {
    /// Whether messages come marked as a session's, and whether the mark names one.
    fn marks(&self) -> (bool, bool) {
        match self {
            Binding::Connection(session) => (session.is_some(), session.is_some()),
            #[cfg(feature = "http")]
            Binding::Id(id) => (id.present, id.id.is_some()),
        }
    }
}

/// A modern message, as received or parsed.
enum Incoming {
    #[cfg(feature = "http")]
    Bytes(Bytes),
    Json(Value),
}

impl Incoming {
    async fn dispatch(self, handle: &RuntimeHandle, ctx: &RequestContext) -> Dispatched {
        match self {
            #[cfg(feature = "http")]
            Incoming::Bytes(body) => handle.dispatch(&body, ctx).await,
            Incoming::Json(message) => handle.dispatch_json(message, ctx).await,
        }
    }

    /// The id of a request; `None` for a notification or an unreadable message.
    fn request_id(&self) -> Option<Value> {
        match self {
            #[cfg(feature = "http")]
            Incoming::Bytes(body) => match jsonrpc::parse(body) {
                Ok(jsonrpc::Incoming::Request { id, .. }) => Some(id),
                _ => None,
            },
            Incoming::Json(message) => {
                let bytes = serde_json::to_vec(message).ok()?;
                match jsonrpc::parse(&bytes) {
                    Ok(jsonrpc::Incoming::Request { id, .. }) => Some(id),
                    _ => None,
                }
            }
        }
    }
}

#[cfg(feature = "http")]
mod by_id;

#[cfg(all(test, feature = "http"))]
mod tests {
    use super::*;

    fn era_of_bytes(body: &[u8], marked: bool) -> Era {
        Era::of_bytes(body, marked, marked).0
    }

    #[test]
    fn only_initialize_or_a_session_is_legacy() {
        let init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}"#;
        assert_eq!(era_of_bytes(init, false), Era::Initialize);
        assert_eq!(era_of_bytes(init, true), Era::Legacy);
        // An empty session header names no session: initialize still opens one.
        assert_eq!(Era::of_bytes(init, true, false).0, Era::Initialize);
        let modern_init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        assert_eq!(era_of_bytes(modern_init, false), Era::Modern);
        let list = br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
        assert_eq!(era_of_bytes(list, false), Era::Modern);
        assert_eq!(era_of_bytes(list, true), Era::Legacy);
        let modern = br#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        assert_eq!(era_of_bytes(modern, true), Era::Modern);
        let discover = br#"{"jsonrpc":"2.0","id":2,"method":"server/discover"}"#;
        assert_eq!(era_of_bytes(discover, true), Era::Modern);
        assert_eq!(era_of_bytes(b"[1]", true), Era::Modern);
        assert_eq!(era_of_bytes(b"{", true), Era::Modern);
    }
}
