//! `tools/call`: synchronous calls (with progress on the response stream) and task creation.

use std::collections::{BTreeMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::{Answer, Dispatcher, MessageStream, RequestContext};
use crate::actor::SupervisorMsg;
use crate::shared::Shared;
use crate::shared::flow::{Entry, Slot};
use crate::shared::request_state::Binding;
use crate::task::{TaskId, TaskRecord};
use crate::tool::context::RequestSink;
use crate::tool::{TaskPolicy, Tool, ToolContext, ToolError};
use crate::wire::error::RpcError;
use crate::wire::jsonrpc;
use crate::wire::meta::RequestMeta;
use crate::wire::params::CallToolParams;
use crate::wire::{methods, results};

/// Progress notifications of one synchronous call waiting to be written; beyond this, new
/// reports are dropped (progress is advisory; the result never is).
const PROGRESS_BUFFER: usize = 64;

/// The `input_required` result that ends an MRTR round, with a fresh signed state carrying
/// every answer used so far.
fn input_required_result(
    shared: &Shared,
    binding: &Binding<'_>,
    ctx: &ToolContext,
    requests: BTreeMap<String, Value>,
) -> Value {
    let state = shared.request_state.sign(
        binding,
        ctx.consumed_answers(),
        ctx.carried(),
        shared.now_ms(),
    );
    results::input_required(
        &shared.config.server_info,
        requests.into_iter().collect(),
        state,
    )
}

/// Runs a synchronous call to its result (a `CallToolResult` or an `input_required` round).
async fn run_sync(
    shared: &Shared,
    tool: Arc<dyn Tool>,
    tool_ctx: ToolContext,
    binding: Binding<'_>,
) -> Result<Value, RpcError> {
    let outcome = AssertUnwindSafe(tool.call(tool_ctx.clone(), binding.arguments.clone()))
        .catch_unwind()
        .await;
    match outcome {
        Ok(Ok(result)) => Ok(results::call_tool_result(
            &shared.config.server_info,
            result.to_json(),
        )),
        Ok(Err(ToolError::InputRequired(requests))) => {
            Ok(input_required_result(shared, &binding, &tool_ctx, requests))
        }
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(RpcError::internal(format!(
            "tool `{}` panicked",
            binding.name
        ))),
    }
}

/// What a synchronous call with progress produces next.
enum Step {
    Progress(Value),
    Done(Result<Value, RpcError>),
}

/// A synchronous call running on its own tokio task, with its progress notifications.
/// Dropping it (the caller closed the response stream) cancels the call.
struct SyncCall {
    progress: mpsc::Receiver<Value>,
    call: Option<JoinHandle<Result<Value, RpcError>>>,
    queued: VecDeque<Step>,
}

impl SyncCall {
    async fn next(&mut self) -> Option<Step> {
        if let Some(step) = self.queued.pop_front() {
            return Some(step);
        }
        let call = self.call.as_mut()?;
        tokio::select! {
            biased;
            Some(message) = self.progress.recv() => Some(Step::Progress(message)),
            joined = call => {
                self.call = None;
                // Reports sent just before the end still go out, before the result.
                while let Ok(message) = self.progress.try_recv() {
                    self.queued.push_back(Step::Progress(message));
                }
                let done = joined.unwrap_or_else(|e| {
                    Err(RpcError::internal(format!("the tool call did not finish: {e}")))
                });
                self.queued.push_back(Step::Done(done));
                self.queued.pop_front()
            }
        }
    }
}

impl Drop for SyncCall {
    fn drop(&mut self) {
        if let Some(call) = &self.call {
            call.abort();
        }
    }
}

impl Dispatcher {
    /// The inline context of one core MRTR round: the answers carried in a verified
    /// `requestState` plus this round's `inputResponses` (which win), and what the tool
    /// carried from its earlier rounds (never overridden by the client).
    pub(super) fn mrtr_context(
        &self,
        binding: &Binding<'_>,
        request_state: Option<&str>,
        input_responses: Option<Map<String, Value>>,
        capabilities: impl Into<Arc<Value>>,
        progress: Option<RequestSink>,
    ) -> Result<ToolContext, RpcError> {
        let mut responses = Map::new();
        let mut carried = BTreeMap::new();
        if let Some(state) = request_state {
            let earlier = self
                .shared
                .request_state
                .verify(state, binding, self.shared.now_ms())?;
            responses.extend(earlier.answers);
            carried = earlier.carried;
        }
        responses.extend(input_responses.unwrap_or_default());
        Ok(ToolContext::for_request(
            binding.owner.clone(),
            capabilities,
            responses,
            carried,
            progress,
        ))
    }

    /// The `input_required` result that ends an MRTR round, with a fresh signed state
    /// carrying every answer used so far.
    pub(super) fn input_required(
        &self,
        binding: &Binding<'_>,
        ctx: &ToolContext,
        requests: BTreeMap<String, Value>,
    ) -> Value {
        input_required_result(&self.shared, binding, ctx, requests)
    }

    /// `tools/call`. A synchronous call whose request carries a `progressToken` or a
    /// `logLevel`, on a transport that can stream, answers with a stream as soon as the tool
    /// reports progress or logs: the `notifications/progress` and `notifications/message`,
    /// then the response. Without a report it is one response.
    pub(super) async fn call_tool(
        &self,
        id: &Value,
        params: Option<&Map<String, Value>>,
        meta: &RequestMeta,
        ctx: &RequestContext,
    ) -> Result<Answer, RpcError> {
        let call = CallToolParams::parse(params)?;
        self.shared.config.limits.check_arguments(&call.arguments)?;
        if let Some(responses) = &call.input_responses {
            self.shared.config.limits.check_input_responses(responses)?;
        }
        let tool = self
            .shared
            .tools
            .get(&call.name)
            .ok_or_else(|| self.shared.tools.unknown(&call.name))?;
        let as_task = match tool.descriptor().task_policy {
            TaskPolicy::Never => false,
            TaskPolicy::WhenSupported => meta.declares_tasks(),
            TaskPolicy::Always if meta.declares_tasks() => true,
            TaskPolicy::Always => return Err(RpcError::tasks_extension_required()),
        };
        self.shared.tools.validate(&call.name, &call.arguments)?;
        let capabilities = self.shared.capabilities.share(&meta.client_capabilities);
        if as_task {
            self.create_task(call, tool, capabilities, ctx).await
        } else {
            self.call_sync(id, call, tool, capabilities, meta, ctx)
                .await
        }
    }

    /// A synchronous call: its result, or (when the request asks for reports on a transport
    /// that can stream) its reports as they come, then its response.
    async fn call_sync(
        &self,
        id: &Value,
        call: CallToolParams,
        tool: Arc<dyn Tool>,
        capabilities: Arc<Value>,
        meta: &RequestMeta,
        ctx: &RequestContext,
    ) -> Result<Answer, RpcError> {
        let binding = tools_call_binding(&ctx.owner, &call);
        let wants_stream =
            ctx.streams && (meta.progress_token.is_some() || meta.log_level.is_some());
        let (sink, progress) = if wants_stream {
            let (tx, rx) = mpsc::channel(PROGRESS_BUFFER);
            let sink = RequestSink::new(meta.progress_token.clone(), meta.log_level, tx);
            (Some(sink), Some(rx))
        } else {
            (None, None)
        };
        let tool_ctx = self.mrtr_context(
            &binding,
            call.request_state.as_deref(),
            call.input_responses.clone(),
            capabilities,
            sink,
        )?;
        // Over a running-task limit, a synchronous call waits for a slot while its request
        // is open (its caller going away takes it out of the queue).
        let slot = self.sync_slot(&call.name, &tool, &ctx.owner).await?;
        let Some(progress) = progress else {
            let answer = run_sync(&self.shared, tool, tool_ctx, binding).await;
            drop(slot);
            return answer.map(Answer::Result);
        };
        let shared = self.shared.clone();
        let owner = ctx.owner.clone();
        let handle = tokio::spawn(async move {
            let binding = tools_call_binding(&owner, &call);
            let answer = run_sync(&shared, tool, tool_ctx, binding).await;
            drop(slot);
            answer
        });
        let sync_call = SyncCall {
            progress,
            call: Some(handle),
            queued: VecDeque::new(),
        };
        with_progress(id.clone(), sync_call).await
    }

    /// The flow-control slot of a synchronous call of `tool` (`None`: no limit applies),
    /// waited for in the queue when the limits are full.
    async fn sync_slot(
        &self,
        name: &str,
        tool: &Arc<dyn Tool>,
        owner: &crate::task::Owner,
    ) -> Result<Option<Slot>, RpcError> {
        let flow = &self.shared.flow;
        if !flow.active() {
            return Ok(None);
        }
        let key = format!("call:{}", crate::task::TaskId::generate());
        let entry = flow
            .enter(
                &key,
                false,
                name,
                Some(tool.descriptor()),
                owner,
                self.shared.now_ms(),
            )
            .resolve()
            .await;
        match entry {
            Entry::Free | Entry::Pending { .. } => Ok(None),
            Entry::Running(slot) => Ok(Some(slot)),
            Entry::Queued { ticket, slot, .. } => {
                let slot = slot
                    .await
                    .map_err(|_| RpcError::internal("the flow-control queue went away"))?;
                drop(ticket);
                Ok(Some(slot))
            }
        }
    }

    /// A task: prepared by its tool (which may end the round with `input_required`),
    /// admitted by the quotas, then stored and started; the handle leaves once it is durable.
    async fn create_task(
        &self,
        call: CallToolParams,
        tool: Arc<dyn Tool>,
        capabilities: Arc<Value>,
        ctx: &RequestContext,
    ) -> Result<Answer, RpcError> {
        let binding = tools_call_binding(&ctx.owner, &call);
        let tool_ctx = self.mrtr_context(
            &binding,
            call.request_state.as_deref(),
            call.input_responses.clone(),
            capabilities.clone(),
            None,
        )?;
        let prepared = AssertUnwindSafe(tool.prepare(tool_ctx.clone(), call.arguments.clone()))
            .catch_unwind()
            .await;
        let arguments = match prepared {
            Ok(Ok(arguments)) => arguments,
            Ok(Err(ToolError::InputRequired(requests))) => {
                return Ok(Answer::Result(
                    self.input_required(&binding, &tool_ctx, requests),
                ));
            }
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Err(RpcError::internal(format!("tool `{}` panicked", call.name))),
        };
        // Collected anew: the record keeps the arguments for the task's whole life, and a
        // cloned map carries the spare capacity of its source.
        let arguments = Value::Object(arguments.into_iter().collect());
        let permit = self.admit_task(&ctx.owner, &arguments).await?;
        let descriptor = tool.descriptor();
        let config = &self.shared.config;
        let ttl_ms = descriptor.ttl_ms.or_else(|| {
            config
                .default_ttl
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        });
        let poll_ms = u64::try_from(config.poll_interval.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        // The id's time is the task's `createdAt`: both from the runtime's clock.
        let now = self.shared.now_ms();
        let record = Arc::new(TaskRecord::new(
            TaskId::at(now),
            ctx.owner.clone(),
            call.name.clone(),
            arguments,
            capabilities,
            now,
            ttl_ms,
            Some(poll_ms),
            descriptor.initial_status_message.clone(),
        ));
        self.commit_and_spawn(record.clone(), permit).await?;
        tracing::debug!(task = %record.id, tool = %record.tool, principal = %record.owner.log_id(), "task created");
        tracing::Span::current().record("mcp.task.id", record.id.as_str());
        crate::telemetry::transition(record.status);
        Ok(Answer::Task(record, crate::task::json::Shape::Created))
    }

    /// The quotas of a new task with `arguments`, before anything is stored: a refused
    /// creation leaves no trace.
    async fn admit_task(
        &self,
        owner: &crate::task::Owner,
        arguments: &Value,
    ) -> Result<crate::quota::CreatePermit, RpcError> {
        let argument_bytes = crate::limits::json_len(arguments) as u64;
        if self.shared.quotas.limits_stored_bytes() {
            // The disk quota: what the owner already stores, finished tasks included.
            let key = crate::store::owner_key(&owner.tenant, &owner.principal);
            let stored = self.shared.store.usage(&key).await?.bytes;
            self.shared
                .quotas
                .check_stored(owner, stored, argument_bytes)?;
        }
        Ok(self.shared.quotas.admit_create(
            owner,
            self.shared.live.usage_of(owner),
            argument_bytes,
            std::time::Instant::now(),
        )?)
    }

    /// Stores a new task and starts its actor. Durable before return: the handle leaves only
    /// after the commit holding the task. The actor is spawned while the commit is in flight
    /// (it starts the tool and waits for the commit's outcome before it handles anything or
    /// becomes visible to readers), and this returns as soon as the commit does, without
    /// waiting for the spawn. Commit and spawn run detached, so a caller that goes away
    /// mid-request (an HTTP client disconnecting) cannot leave a stored task without its
    /// actor.
    async fn commit_and_spawn(
        &self,
        record: Arc<TaskRecord>,
        permit: crate::quota::CreatePermit,
    ) -> Result<(), RpcError> {
        let shared = self.shared.clone();
        let supervisor = self.supervisor.clone();
        let (answer_tx, answer_rx) = oneshot::channel::<Result<(), RpcError>>();
        tokio::spawn(async move {
            let (created_tx, created_rx) = oneshot::channel::<bool>();
            let id = record.id.clone();
            let spawn = supervisor.call(
                |port| SupervisorMsg::Spawn(record.clone(), created_rx, port),
                None,
            );
            let commit = async {
                let committed = shared.commit(&record).await;
                #[cfg(feature = "failpoints")]
                fail::fail_point!("create::after_commit");
                let _ = created_tx.send(committed.is_ok());
                let ok = committed.is_ok();
                let _ = answer_tx.send(committed.map_err(RpcError::from));
                ok
            };
            let (spawned, committed) = futures::future::join(spawn, commit).await;
            if committed && !matches!(spawned, Ok(ractor::rpc::CallResult::Success(Ok(())))) {
                // The task is stored; it runs once an actor is ensured (next touch or start).
                tracing::error!(task = %id, "task stored but its actor did not start");
            }
            // The actor runs (the live count has the task) or the creation failed.
            drop(permit);
        });
        answer_rx
            .await
            .map_err(|_| RpcError::internal("task creation was interrupted"))?
    }
}

/// The binding of a `tools/call`'s signed request state: owner, tool and arguments.
fn tools_call_binding<'a>(owner: &'a crate::task::Owner, call: &'a CallToolParams) -> Binding<'a> {
    Binding {
        owner,
        method: methods::TOOLS_CALL,
        name: &call.name,
        arguments: &call.arguments,
    }
}

/// The answer of a synchronous call that may report progress: its result when it ends
/// without a report, else a stream of its reports then its response.
async fn with_progress(id: Value, mut sync_call: SyncCall) -> Result<Answer, RpcError> {
    match sync_call.next().await {
        Some(Step::Done(done)) => done.map(Answer::Result),
        Some(Step::Progress(first)) => {
            let rest = futures::stream::unfold(sync_call, move |mut sync_call| {
                let id = id.clone();
                async move {
                    let message = match sync_call.next().await? {
                        Step::Progress(message) => message,
                        Step::Done(Ok(result)) => jsonrpc::result_response(&id, result),
                        Step::Done(Err(e)) => jsonrpc::error_response(Some(&id), &e),
                    };
                    Some((message, sync_call))
                }
            });
            let stream = futures::stream::once(async move { first }).chain(rest);
            Ok(Answer::Stream(MessageStream::new(stream.boxed())))
        }
        None => Err(RpcError::internal("the tool call ended without a result")),
    }
}
