//! The gateway's tool: one upstream tool called from a task's actor, with the crash rule.
//!
//! Before the upstream is called the task's journal records the step [`CALL_STEP`]; a run of
//! the tool that finds it recorded knows that an earlier run called the upstream and did not
//! finish (the gateway stopped, crashed, or another replica took the task over). Unless the
//! upstream task id was recorded too ([`TASK_STEP`]: the call is then followed, not repeated),
//! the call runs again only for a tool declared idempotent; any other ends `failed` with a
//! message saying so.
//!
//! Within one run, a call whose connection fails is tried again ([`Retry`]): whatever the
//! tool when the request never reached the upstream ([`UpstreamError::NotSent`]), and when it
//! may have, only for a tool declared idempotent or a call that follows a recorded upstream
//! task. The journal is not touched (`gateway.call` is recorded once); a repeated call asks
//! its input under the same keys (`input-1`, …), so it gets the answers already given.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use tracing::Instrument;

use super::error::UpstreamError;
use super::link::{CallError, CallSpec, Hooks};
use super::upstream::UpstreamState;
use crate::tool::{
    CallToolResult, InputRequest, Tool, ToolContext, ToolDescriptor, ToolError, ToolFuture,
};
use crate::wire::error::RpcError;

/// The journal step recorded before the upstream is called: when, and which upstream (the
/// console shows it).
pub(crate) const CALL_STEP: &str = "gateway.call";
/// The journal step holding the upstream's task id, when the upstream runs the call as a task.
pub(crate) const TASK_STEP: &str = "gateway.upstream-task";

/// One upstream tool, as the gateway serves it.
pub(crate) struct GatewayTool {
    pub(crate) descriptor: ToolDescriptor,
    pub(crate) upstream: Arc<UpstreamState>,
    /// The tool's name upstream.
    pub(crate) remote: String,
}

impl Tool for GatewayTool {
    fn descriptor(&self) -> &ToolDescriptor {
        &self.descriptor
    }

    fn call(&self, ctx: ToolContext, arguments: Map<String, Value>) -> ToolFuture {
        let upstream = self.upstream.clone();
        let remote = self.remote.clone();
        let exposed = self.descriptor.name.clone();
        let span = tracing::info_span!("upstream call", upstream = %upstream.name(), tool = %remote, task = ctx.task_id().map(|t| t.as_str().to_owned()));
        Box::pin(run(upstream, remote, exposed, ctx, arguments).instrument(span))
    }
}

async fn run(
    upstream: Arc<UpstreamState>,
    remote: String,
    exposed: String,
    ctx: ToolContext,
    arguments: Map<String, Value>,
) -> Result<CallToolResult, ToolError> {
    let name = upstream.name().to_owned();
    let in_task = ctx.task_id().is_some();
    let started_before = in_task && ctx.recorded(CALL_STEP).is_some();
    let journal = ContextHooks {
        ctx: &ctx,
        inputs: AtomicU32::new(0),
        reached: AtomicBool::new(false),
    };
    // A call that stopped while its `2026-07-28` upstream waited for input has nothing in
    // flight upstream: it resumes at that round (`rounds`), whatever the tool.
    let interrupted = started_before
        && ctx.recorded(TASK_STEP).is_none()
        && super::rounds::position(&journal).may_be_in_flight();
    // Whether the tool may run twice is known from the configuration alone, unless the
    // upstream's annotations count: those are known once it is connected (and listed).
    let known_now = !upstream.config.trust_annotations;
    if interrupted && known_now {
        repeat_or_fail(&upstream, &remote, &exposed)?;
    }
    let timeout = upstream.config.timeout;
    let mut retry = Retry::new(timeout);
    let mut first = true;
    loop {
        // Connected before the call is marked: a stop while the upstream is still unreachable
        // has called nothing. No connection now starts the wait for one (up to the timeout).
        let link = match upstream.link_now() {
            Some(link) => link,
            None => {
                let deadline = retry.deadline();
                let connected = tokio::select! {
                    c = upstream.connected_by(deadline) => c,
                    () = ctx.cancelled() => return Err(ToolError::Cancelled),
                };
                match connected {
                    Ok(link) => link,
                    Err(e) => {
                        count_error(&name, e.kind());
                        return Err(retry.gave_up(&e, &exposed));
                    }
                }
            }
        };
        if first {
            first = false;
            if interrupted && !known_now {
                repeat_or_fail(&upstream, &remote, &exposed)?;
            }
            if in_task && !started_before {
                let now = crate::clock::Clock::now_ms(&crate::clock::SystemClock);
                let called = name.clone();
                ctx.step(CALL_STEP, || async move {
                    Ok(json!({ "startedAtMs": now, "upstream": called }))
                })
                .await?;
            }
        }
        // One per attempt: a repeated call numbers its input requests from `input-1` again.
        let hooks = ContextHooks {
            ctx: &ctx,
            inputs: AtomicU32::new(0),
            reached: AtomicBool::new(false),
        };
        metrics::counter!(super::UPSTREAM_CALLS, "upstream" => name.clone()).increment(1);
        let started = Instant::now();
        let outcome = link
            .call(CallSpec {
                name: &remote,
                arguments: arguments.clone(),
                hooks: &hooks,
                task_support: upstream.task_support(&remote),
                repeatable: upstream.idempotent(&remote),
            })
            .await;
        metrics::histogram!(super::UPSTREAM_CALL_DURATION, "upstream" => name.clone())
            .record(started.elapsed().as_secs_f64());
        let e = match outcome {
            Ok(result) => return Ok(call_tool_result(result)),
            Err(CallError::Tool(e)) => return Err(e),
            Err(CallError::Upstream(e)) => e,
        };
        count_error(&name, e.kind());
        let reached = hooks.reached.load(Ordering::Relaxed);
        if reached || started.elapsed() >= timeout {
            // This attempt worked for a while: its failure starts a new outage.
            retry.reset();
        }
        // Whether sending the call again is safe: it never reached the upstream, or the
        // tool may run twice, or only a recorded upstream task is followed (read again).
        let never_sent = matches!(e, UpstreamError::NotSent { .. }) && !reached;
        if !never_sent {
            retry.sent = true;
        }
        let repeatable =
            upstream.idempotent(&remote) || (in_task && ctx.recorded(TASK_STEP).is_some());
        let broken = matches!(
            e,
            UpstreamError::NotSent { .. } | UpstreamError::Unreachable { .. }
        );
        if !broken {
            tracing::warn!(error = %e, "upstream call failed");
            return Err(ToolError::Rpc(e.to_rpc()));
        }
        if !never_sent && !repeatable {
            tracing::warn!(error = %e, "upstream call broke; not repeated (the tool is not declared idempotent)");
            return Err(ToolError::Rpc(RpcError::internal(format!(
                "{e}; the call of `{exposed}` may or may not have taken effect upstream, and it was not repeated because the tool is not declared idempotent"
            ))));
        }
        let Some(delay) = retry.next() else {
            tracing::warn!(error = %e, waited_ms = retry.waited().as_millis() as u64, "upstream call failed; gave up retrying at the upstream's timeout");
            return Err(retry.gave_up(&e, &exposed));
        };
        metrics::counter!(super::UPSTREAM_RETRIES, "upstream" => name.clone()).increment(1);
        tracing::info!(error = %e, attempt = retry.attempts + 1, retry_in_ms = delay.as_millis() as u64, never_sent, "upstream call failed; calling again");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = ctx.cancelled() => return Err(ToolError::Cancelled),
        }
    }
}

/// When to call again after a broken connection: waits of [`Retry::FIRST`] doubling up to
/// [`Retry::MAX`], each ±50 % at random, until the upstream's timeout has passed since the
/// first failure.
struct Retry {
    timeout: Duration,
    /// The first failure (or the first wait for a connection).
    since: Option<tokio::time::Instant>,
    /// Retries so far.
    attempts: u32,
    /// Whether an attempt may have reached the upstream (for the final error).
    sent: bool,
}

impl Retry {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(2);

    fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            since: None,
            attempts: 0,
            sent: false,
        }
    }

    /// The end of the window, which starts now if it has not yet.
    fn deadline(&mut self) -> tokio::time::Instant {
        *self.since.get_or_insert_with(tokio::time::Instant::now) + self.timeout
    }

    /// Forgets the failures so far (the next one starts a new window); an attempt that may
    /// have reached the upstream is remembered.
    fn reset(&mut self) {
        self.since = None;
        self.attempts = 0;
    }

    fn waited(&self) -> Duration {
        self.since.map_or(Duration::ZERO, |s| s.elapsed())
    }

    /// The wait before the next attempt, cut at the deadline (the last attempt is made at
    /// it); `None` once the deadline has passed.
    fn next(&mut self) -> Option<Duration> {
        let deadline = self.deadline();
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return None;
        }
        let base = Self::FIRST
            .saturating_mul(2u32.saturating_pow(self.attempts.min(16)))
            .min(Self::MAX);
        self.attempts += 1;
        let mut byte = [0u8; 1];
        let jitter = if getrandom::fill(&mut byte).is_ok() {
            0.5 + f64::from(byte[0]) / 255.0
        } else {
            1.0
        };
        Some(base.mul_f64(jitter).min(left))
    }

    /// The error of a call given up at the deadline, saying how long the gateway waited and
    /// whether the call may have reached the upstream.
    fn gave_up(&self, e: &UpstreamError, exposed: &str) -> ToolError {
        let waited = self.waited().as_secs_f64();
        let what = if self.sent || !matches!(e, UpstreamError::NotSent { .. }) {
            format!(
                "the gateway called `{exposed}` again for {waited:.1} s (its timeout) without an answer; it may or may not have taken effect upstream"
            )
        } else {
            format!(
                "the gateway waited {waited:.1} s for it (its timeout) and the call of `{exposed}` never reached it"
            )
        };
        ToolError::Rpc(RpcError::internal(format!("{e}; {what}")))
    }
}

/// The crash rule for a call an earlier run started and did not finish: `Ok` to call again
/// (the tool is declared idempotent), else the error the task fails with.
fn repeat_or_fail(upstream: &UpstreamState, remote: &str, exposed: &str) -> Result<(), ToolError> {
    if upstream.idempotent(remote) {
        tracing::info!(tool = %exposed, "the upstream call was in flight when the gateway stopped; calling the idempotent tool again");
        return Ok(());
    }
    tracing::warn!(tool = %exposed, "the upstream call was in flight when the gateway stopped; the task fails");
    Err(ToolError::Rpc(RpcError::internal(format!(
        "The gateway restarted while the call of `{exposed}` on upstream `{}` was in flight; it may or may not have taken effect upstream, and it was not repeated because the tool is not declared idempotent.",
        upstream.name()
    ))))
}

fn count_error(upstream: &str, kind: &'static str) {
    metrics::counter!(super::UPSTREAM_ERRORS, "upstream" => upstream.to_owned(), "kind" => kind)
        .increment(1);
}

/// An upstream's `CallToolResult` as ours.
fn call_tool_result(result: Value) -> CallToolResult {
    CallToolResult {
        content: result
            .get("content")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
        structured_content: result.get("structuredContent").cloned(),
        is_error: result.get("isError").and_then(Value::as_bool) == Some(true),
    }
}

/// The client capability an input request needs.
fn capability(request: &Value) -> Option<&'static str> {
    match request.get("method").and_then(Value::as_str) {
        Some("elicitation/create") => Some("elicitation"),
        Some("sampling/createMessage") => Some("sampling"),
        Some("roots/list") => Some("roots"),
        _ => None,
    }
}

/// [`Hooks`] over the call's [`ToolContext`].
struct ContextHooks<'a> {
    ctx: &'a ToolContext,
    /// Input requests asked in this run (numbered keys `input-1`, `input-2`, …: a repeated
    /// idempotent call gets the answers already given, in order).
    inputs: AtomicU32,
    /// Whether the upstream showed it got the call: progress, a status, an input request, its
    /// task. A later request of the same call that is not sent does not make the call unsent.
    reached: AtomicBool,
}

impl ContextHooks<'_> {
    fn mark_reached(&self) {
        self.reached.store(true, Ordering::Relaxed);
    }
}

impl Hooks for ContextHooks<'_> {
    fn is_task(&self) -> bool {
        self.ctx.task_id().is_some()
    }

    fn progress<'a>(
        &'a self,
        progress: f64,
        total: Option<f64>,
        message: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), ToolError>> {
        self.mark_reached();
        Box::pin(self.ctx.progress(progress, total, message))
    }

    fn status<'a>(&'a self, message: &'a str) -> BoxFuture<'a, Result<(), ToolError>> {
        self.mark_reached();
        Box::pin(self.ctx.set_status(message))
    }

    fn input<'a>(
        &'a self,
        key: Option<&'a str>,
        request: Value,
    ) -> BoxFuture<'a, Result<Value, ToolError>> {
        self.mark_reached();
        Box::pin(self.ask(key, request, None))
    }

    fn input_with_status<'a>(
        &'a self,
        key: &'a str,
        request: Value,
        status: String,
    ) -> BoxFuture<'a, Result<Value, ToolError>> {
        self.mark_reached();
        Box::pin(self.ask(Some(key), request, Some(status)))
    }

    fn cancelled(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.ctx.cancelled())
    }

    fn upstream_task(&self) -> Option<String> {
        self.ctx
            .recorded(TASK_STEP)
            .and_then(|v| v.as_str().map(str::to_owned))
    }

    fn remember_task<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ToolError>> {
        self.mark_reached();
        Box::pin(async move {
            let id = id.to_owned();
            self.ctx
                .step(TASK_STEP, || async move { Ok(id) })
                .await
                .map(drop)
        })
    }

    fn recorded(&self, name: &str) -> Option<Value> {
        self.ctx.recorded(name)
    }

    fn carry<'a>(&'a self, name: &'a str, value: Value) -> BoxFuture<'a, Result<(), ToolError>> {
        Box::pin(self.ctx.carry(name, value))
    }
}

impl ContextHooks<'_> {
    /// Asks the client `request` under `key` (or the next numbered key), when it declared the
    /// capability the request needs.
    async fn ask(
        &self,
        key: Option<&str>,
        request: Value,
        status: Option<String>,
    ) -> Result<Value, ToolError> {
        if let Some(cap) = capability(&request)
            && !self
                .ctx
                .client_capabilities()
                .get(cap)
                .is_some_and(Value::is_object)
        {
            let who = if self.ctx.task_id().is_some() {
                "the task's client"
            } else {
                "the client"
            };
            return Err(ToolError::Rpc(RpcError::internal(format!(
                "{who} did not declare the `{cap}` capability, so the gateway cannot ask it"
            ))));
        }
        let key = match key {
            Some(k) => k.to_owned(),
            None => format!("input-{}", self.inputs.fetch_add(1, Ordering::Relaxed) + 1),
        };
        self.ctx
            .input_with_status(&key, InputRequest::raw(request), status)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn retries_back_off_with_jitter_up_to_the_timeout_from_the_first_failure() {
        let mut retry = Retry::new(Duration::from_secs(10));
        let start = tokio::time::Instant::now();
        let mut waits = Vec::new();
        while let Some(wait) = retry.next() {
            waits.push(wait);
            tokio::time::sleep(wait).await;
        }
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(10),
            "ends at the timeout"
        );
        assert_eq!(retry.waited(), Duration::from_secs(10));
        // 100 ms doubling up to 2 s, each ±50 % (the last cut at the deadline).
        let (last, full) = waits.split_last().unwrap();
        for (i, wait) in full.iter().enumerate() {
            let base = (Retry::FIRST * 2u32.pow(i as u32)).min(Retry::MAX);
            assert!(
                *wait >= base / 2 && *wait <= base * 3 / 2,
                "wait {i}: {wait:?} for {base:?}"
            );
        }
        assert!(*last <= Retry::MAX * 3 / 2);
        assert!((6..=40).contains(&waits.len()), "{waits:?}");
        let e = UpstreamError::NotSent {
            upstream: "up".into(),
            reason: "connection refused".into(),
        };
        let ToolError::Rpc(gave_up) = retry.gave_up(&e, "charge") else {
            panic!("an RPC error")
        };
        assert_eq!(
            gave_up.message,
            "Internal error: upstream `up` is unreachable: connection refused; the gateway waited 10.0 s for it (its timeout) and the call of `charge` never reached it"
        );
        // Once an attempt may have reached the upstream, the end says so, whatever the last.
        retry.sent = true;
        let ToolError::Rpc(gave_up) = retry.gave_up(&e, "work") else {
            panic!("an RPC error")
        };
        assert!(
            gave_up.message.ends_with("the gateway called `work` again for 10.0 s (its timeout) without an answer; it may or may not have taken effect upstream"),
            "{}",
            gave_up.message
        );
        // A new outage starts a new window, from the first wait again.
        retry.reset();
        let first = retry.next().unwrap();
        assert!(first <= Retry::FIRST * 3 / 2, "{first:?}");
    }
}
