//! The gateway's tool: one upstream tool called from a task's actor, with the crash rule.
//!
//! Before the upstream is called the task's journal records the step [`CALL_STEP`]; a run of
//! the tool that finds it recorded knows that an earlier run called the upstream and did not
//! finish (the gateway stopped, crashed, or another replica took the task over). Unless the
//! upstream task id was recorded too ([`TASK_STEP`]: the call is then followed, not repeated),
//! the call runs again only for a tool declared idempotent; any other ends `failed` with a
//! message saying so.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use tracing::Instrument;

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
    let interrupted = started_before && ctx.recorded(TASK_STEP).is_none();
    // Whether the tool may run twice is known from the configuration alone, unless the
    // upstream's annotations count: those are known once it is connected (and listed).
    let known_now = !upstream.config.trust_annotations;
    if interrupted && known_now {
        repeat_or_fail(&upstream, &remote, &exposed)?;
    }
    // Connected before the call is marked: a stop while the upstream is still unreachable has
    // called nothing.
    let link = upstream.connected().await.map_err(|e| {
        count_error(&name, e.kind());
        ToolError::Rpc(e.to_rpc())
    })?;
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
    let hooks = ContextHooks {
        ctx: &ctx,
        inputs: AtomicU32::new(0),
    };
    metrics::counter!(super::UPSTREAM_CALLS, "upstream" => name.clone()).increment(1);
    let started = Instant::now();
    let outcome = link
        .call(CallSpec {
            name: &remote,
            arguments,
            hooks: &hooks,
            task_support: upstream.task_support(&remote),
        })
        .await;
    metrics::histogram!(super::UPSTREAM_CALL_DURATION, "upstream" => name.clone())
        .record(started.elapsed().as_secs_f64());
    match outcome {
        Ok(result) => Ok(call_tool_result(result)),
        Err(CallError::Tool(e)) => Err(e),
        Err(CallError::Upstream(e)) => {
            count_error(&name, e.kind());
            tracing::warn!(error = %e, "upstream call failed");
            Err(ToolError::Rpc(e.to_rpc()))
        }
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
        Box::pin(self.ctx.progress(progress, total, message))
    }

    fn status<'a>(&'a self, message: &'a str) -> BoxFuture<'a, Result<(), ToolError>> {
        Box::pin(self.ctx.set_status(message))
    }

    fn input<'a>(
        &'a self,
        key: Option<&'a str>,
        request: Value,
    ) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            if let Some(cap) = capability(&request)
                && !self
                    .ctx
                    .client_capabilities()
                    .get(cap)
                    .is_some_and(Value::is_object)
            {
                return Err(ToolError::Rpc(RpcError::internal(format!(
                    "the task's client did not declare the `{cap}` capability, so the gateway cannot ask it"
                ))));
            }
            let key = match key {
                Some(k) => k.to_owned(),
                None => format!("input-{}", self.inputs.fetch_add(1, Ordering::Relaxed) + 1),
            };
            self.ctx.input(&key, InputRequest::raw(request)).await
        })
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
        Box::pin(async move {
            let id = id.to_owned();
            self.ctx
                .step(TASK_STEP, || async move { Ok(id) })
                .await
                .map(drop)
        })
    }
}
