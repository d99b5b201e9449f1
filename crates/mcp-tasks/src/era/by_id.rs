//! Legacy sessions whose id travels with each request (HTTP `Mcp-Session-Id`): resolving
//! the id, ending the session, and resumable streams.
//!
//! - A legacy request without an id is `400`; an id that does not verify for the caller,
//!   expired or was ended is `404` (the client starts a new session).
//! - A request's messages go into a resumable log read by its response; every event has an
//!   id (`{stream}-{seq}`) and, when the reader goes away, the rest waits there for a
//!   resumption after its last event. A log nobody reads for the resume grace stops its
//!   request (an abandoned `tasks/result` stops following its task).
//! - A caller whose sessions all have an open stream or a request waiting gets `429`.

use futures::StreamExt;
use serde_json::Value;

use super::{Context, Entry, Outcome, SessionId, failed};
use crate::legacy::{self, LEGACY_VERSIONS, LegacyOutcome, Session, SessionState};
use crate::task::Owner;
use crate::wire::error::{RpcError, code};

impl Entry {
    /// A message of the session `id` names.
    pub(super) async fn by_id(
        &self,
        id: &SessionId,
        message: Value,
        ctx: &Context,
    ) -> (Outcome, &'static str) {
        if let Some(refusal) = version_refusal(id) {
            return (refusal, "legacy-version");
        }
        let (session, state) = match self.resolve(id, &ctx.owner).await {
            Ok(found) => found,
            Err(refusal) => return (refusal, "legacy-session"),
        };
        let live = match self.legacy.live(&session, &ctx.owner) {
            Ok(live) => live,
            Err(e) => return (quota_refusal(e), "legacy-session"),
        };
        // `tasks/result` only reads: when its client goes away before the answer, it stops
        // (and lets go of the task it follows).
        let reads_only = message.get("method").and_then(Value::as_str) == Some("tasks/result");
        // The request runs on its own task: a client that disconnects cannot cut it in half.
        let legacy = self.legacy.clone();
        let (owner, streams) = (ctx.owner.clone(), ctx.streams);
        let handled = tokio::spawn(async move {
            legacy
                .handle(&session, &state, &owner, message, streams)
                .await
        });
        let mut stop_if_gone = AbortOnDrop(reads_only.then(|| handled.abort_handle()));
        let handled = handled.await;
        stop_if_gone.0 = None;
        match handled {
            Ok(LegacyOutcome::Accepted) => (Outcome::Accepted, "legacy-accepted"),
            Ok(LegacyOutcome::Reply(body)) => (Outcome::Json(body), "legacy-json"),
            Ok(LegacyOutcome::Stream(messages)) => {
                // The messages go into a resumable log, read by this response; if the client
                // disconnects, the rest waits there for a resumption.
                let log = live.open_stream();
                let events = log.read(Some(1)).boxed();
                tokio::spawn(fill_log(log, messages, id.resume_grace));
                (Outcome::Events(events), "legacy-sse")
            }
            Err(e) => {
                tracing::error!(error = %e, "a legacy request failed");
                (failed(), "legacy-json")
            }
        }
    }

    /// The session's standing stream, or the rest of one of its streams after
    /// `last_event_id`.
    pub(super) async fn open_stream(
        &self,
        ctx: Context,
        last_event_id: Option<&str>,
    ) -> (Outcome, &'static str) {
        let session = match self.session_of(&ctx).await {
            Ok(session) => session,
            Err(refused) => return refused,
        };
        if !ctx.streams {
            let error = RpcError::new(
                code::INVALID_REQUEST,
                "Not Acceptable: a GET stream needs Accept: text/event-stream",
            );
            return (Outcome::refused(406, error), "legacy-get");
        }
        let live = match self.legacy.live(&session, &ctx.owner) {
            Ok(live) => live,
            Err(e) => return (quota_refusal(e), "legacy-get"),
        };
        let resume = last_event_id
            .and_then(legacy::parse_event_id)
            .and_then(|(stream, seq)| live.stream(stream).map(|log| (log, seq)));
        let events = match resume {
            Some((log, seq)) => log.read(Some(seq + 1)).boxed(),
            None => live.standing.read(None).boxed(),
        };
        (Outcome::Events(events), "legacy-get")
    }

    /// Ends the session: its id is refused from now on, everywhere.
    pub(super) async fn end_session(&self, ctx: Context) -> (Outcome, &'static str) {
        let session = match self.session_of(&ctx).await {
            Ok(session) => session,
            Err(refused) => return refused,
        };
        match self.legacy.end(&session).await {
            Ok(()) => (Outcome::Ended, "legacy-delete"),
            Err(e) => (Outcome::refused(500, e), "legacy-delete"),
        }
    }

    /// The session a `GET` or `DELETE` names, or what to answer instead.
    async fn session_of(&self, ctx: &Context) -> Result<Session, (Outcome, &'static str)> {
        let super::Binding::Id(id) = &ctx.binding else {
            let error = RpcError::new(code::INVALID_REQUEST, "this transport has no session ids");
            return Err((Outcome::refused(400, error), "legacy-session"));
        };
        if let Some(refusal) = version_refusal(id) {
            return Err((refusal, "legacy-version"));
        }
        match self.resolve(id, &ctx.owner).await {
            Ok((session, _state)) => Ok(session),
            Err(refusal) => Err((refusal, "legacy-session")),
        }
    }

    /// Resolves the session of a request, or the refusal to send.
    async fn resolve(
        &self,
        id: &SessionId,
        owner: &Owner,
    ) -> Result<(Session, SessionState), Outcome> {
        let Some(id) = &id.id else {
            return Err(Outcome::refused(
                400,
                RpcError::new(
                    code::INVALID_REQUEST,
                    "Bad Request: the Mcp-Session-Id header is required after initialize",
                ),
            ));
        };
        match self.legacy.resolve(id, owner).await {
            Ok(found) => Ok(found),
            Err(e) => {
                tracing::info!(principal = %owner.log_id(), reason = %e, "legacy session id refused (404)");
                Err(not_found())
            }
        }
    }
}

/// Writes a legacy request's `messages` into its resumable `log` until they end, or until
/// nobody read or resumed the log for `grace` (the request stops then: its follower of a task
/// lets go).
async fn fill_log(
    log: std::sync::Arc<crate::legacy::hub::StreamLog>,
    mut messages: futures::stream::BoxStream<'static, Value>,
    grace: std::time::Duration,
) {
    let mut abandoned = std::pin::pin!(log.unread_for(grace));
    loop {
        tokio::select! {
            message = messages.next() => match message {
                Some(message) => {
                    log.push(message);
                }
                None => break,
            },
            () = &mut abandoned => {
                tracing::debug!("an unread legacy response stream stopped");
                break;
            }
        }
    }
    drop(messages);
    log.finish();
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

/// The `404` of a session id that is not accepted. The reason (another caller's session, a
/// signature that does not verify, expired, ended) is only logged: the answer is the same
/// for every one.
fn not_found() -> Outcome {
    Outcome::refused(
        404,
        RpcError::new(
            code::INVALID_REQUEST,
            "Session not found; send initialize to start a new session",
        ),
    )
}

/// `429` with `Retry-After` for a session refused by a quota.
fn quota_refusal(e: crate::quota::QuotaError) -> Outcome {
    Outcome::Refused {
        status: 429,
        retry_after: Some(e.retry_after_secs()),
        error: RpcError::from(e),
    }
}

/// A declared protocol version, when present, must be a legacy version we speak; the `400`
/// to send when it is not.
fn version_refusal(id: &SessionId) -> Option<Outcome> {
    match id.protocol_version.as_deref().map(str::trim) {
        None => None,
        Some(v) if LEGACY_VERSIONS.contains(&v) => None,
        Some(v) => Some(Outcome::refused(
            400,
            RpcError::new(
                code::INVALID_REQUEST,
                format!(
                    "Bad Request: unsupported MCP-Protocol-Version `{v}` for a session (supported: {})",
                    LEGACY_VERSIONS.join(", ")
                ),
            ),
        )),
    }
}
