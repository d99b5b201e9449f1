//! `tools/call`: synchronous calls and task creation.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use serde_json::{Map, Value};

use super::request_state::Binding;
use super::{Dispatcher, RequestContext};
use crate::actor::SupervisorMsg;
use crate::error::RpcError;
use crate::task::{TaskId, TaskRecord};
use crate::tool::{TaskPolicy, ToolContext, ToolError};
use crate::wire::meta::RequestMeta;
use crate::wire::params::CallToolParams;
use crate::wire::{methods, results};

impl Dispatcher {
    /// The inline context of one core MRTR round: the answers carried in a verified
    /// `requestState` plus this round's `inputResponses` (which win).
    pub(super) fn mrtr_context(
        &self,
        binding: &Binding<'_>,
        request_state: Option<&str>,
        input_responses: Option<Map<String, Value>>,
        capabilities: Value,
    ) -> Result<ToolContext, RpcError> {
        let mut responses = Map::new();
        if let Some(state) = request_state {
            let earlier = self
                .shared
                .request_state
                .verify(state, binding, self.shared.now_ms())?;
            responses.extend(earlier);
        }
        responses.extend(input_responses.unwrap_or_default());
        Ok(ToolContext::for_request(
            binding.owner.clone(),
            capabilities,
            responses,
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
        let state =
            self.shared
                .request_state
                .sign(binding, ctx.consumed_answers(), self.shared.now_ms());
        results::input_required(
            &self.shared.config.server_info,
            requests.into_iter().collect(),
            state,
        )
    }

    pub(super) async fn call_tool(
        &self,
        params: Option<&Map<String, Value>>,
        meta: &RequestMeta,
        ctx: &RequestContext,
    ) -> Result<Value, RpcError> {
        let call = CallToolParams::parse(params)?;
        self.shared.config.limits.check_arguments(&call.arguments)?;
        if let Some(responses) = &call.input_responses {
            self.shared.config.limits.check_input_responses(responses)?;
        }
        let tool = self
            .shared
            .tools
            .get(&call.name)
            .cloned()
            .ok_or_else(|| RpcError::invalid_params(format!("Unknown tool: {}", call.name)))?;
        let descriptor = tool.descriptor();
        let as_task = match descriptor.task_policy {
            TaskPolicy::Never => false,
            TaskPolicy::WhenSupported => meta.declares_tasks(),
            TaskPolicy::Always if meta.declares_tasks() => true,
            TaskPolicy::Always => return Err(RpcError::tasks_extension_required()),
        };
        self.shared.tools.validate(&call.name, &call.arguments)?;
        let capabilities = Value::Object(meta.client_capabilities.clone());
        let server = &self.shared.config.server_info;
        let binding = Binding {
            owner: &ctx.owner,
            method: methods::TOOLS_CALL,
            name: &call.name,
            arguments: &call.arguments,
        };
        let tool_ctx = self.mrtr_context(
            &binding,
            call.request_state.as_deref(),
            call.input_responses.clone(),
            capabilities.clone(),
        )?;

        if !as_task {
            let outcome = AssertUnwindSafe(tool.call(tool_ctx.clone(), call.arguments.clone()))
                .catch_unwind()
                .await;
            return match outcome {
                Ok(Ok(result)) => Ok(results::call_tool_result(server, result.to_json())),
                Ok(Err(ToolError::InputRequired(requests))) => {
                    Ok(self.input_required(&binding, &tool_ctx, requests))
                }
                Ok(Err(e)) => Err(e.into()),
                Err(_) => Err(RpcError::internal(format!("tool `{}` panicked", call.name))),
            };
        }

        let prepared = AssertUnwindSafe(tool.prepare(tool_ctx.clone(), call.arguments.clone()))
            .catch_unwind()
            .await;
        let arguments = match prepared {
            Ok(Ok(arguments)) => arguments,
            Ok(Err(ToolError::InputRequired(requests))) => {
                return Ok(self.input_required(&binding, &tool_ctx, requests));
            }
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Err(RpcError::internal(format!("tool `{}` panicked", call.name))),
        };

        let config = &self.shared.config;
        let ttl_ms = descriptor.ttl_ms.or_else(|| {
            config
                .default_ttl
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        });
        let poll_ms = u64::try_from(config.poll_interval.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let record = TaskRecord::new(
            TaskId::generate(),
            ctx.owner.clone(),
            call.name.clone(),
            Value::Object(arguments),
            capabilities,
            self.shared.now_ms(),
            ttl_ms,
            Some(poll_ms),
            descriptor.initial_status_message.clone(),
        );
        // Durable before return: the handle leaves only after the commit holding the task.
        // Commit and actor start run detached, so a caller that goes away mid-request (an HTTP
        // client disconnecting) cannot leave a stored task without its actor.
        let record = Arc::new(record);
        let shared = self.shared.clone();
        let supervisor = self.supervisor.clone();
        let detached = record.clone();
        tokio::spawn(async move {
            shared.commit(&detached).await?;
            #[cfg(feature = "failpoints")]
            fail::fail_point!("create::after_commit");
            let spawned = supervisor
                .call(|port| SupervisorMsg::Spawn(detached.clone(), port), None)
                .await;
            if !matches!(spawned, Ok(ractor::rpc::CallResult::Success(Ok(())))) {
                // The task is stored; it runs once an actor is ensured (next touch or start).
                tracing::error!(task = %detached.id, "task stored but its actor did not start");
            }
            Ok::<(), RpcError>(())
        })
        .await
        .map_err(|e| RpcError::internal(format!("task creation was interrupted: {e}")))??;
        tracing::debug!(task = %record.id, tool = %record.tool, owner = %record.owner, "task created");
        Ok(results::create_task(&record, server))
    }
}
