//! `prompts/get` (with core MRTR) and `resources/read`.

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use serde_json::{Map, Value};

use super::request_state::Binding;
use super::{Dispatcher, RequestContext};
use crate::error::RpcError;
use crate::tool::ToolError;
use crate::wire::jsonrpc::kind;
use crate::wire::meta::RequestMeta;
use crate::wire::{limits, methods, results};

impl Dispatcher {
    pub(super) async fn get_prompt(
        &self,
        params: Option<&Map<String, Value>>,
        meta: &RequestMeta,
        ctx: &RequestContext,
    ) -> Result<Value, RpcError> {
        let name = string_member(params, "name")?;
        let prompt = self
            .shared
            .catalog
            .prompt(&name)
            .cloned()
            .ok_or_else(|| RpcError::invalid_params(format!("Unknown prompt: {name}")))?;
        let arguments = object_member(params, "arguments")?.unwrap_or_default();
        for argument in prompt.descriptor().arguments.iter().filter(|a| a.required) {
            if !arguments.contains_key(&argument.name) {
                return Err(RpcError::invalid_params(format!(
                    "prompt `{name}` needs the argument `{}`",
                    argument.name
                )));
            }
        }
        let request_state = match params.and_then(|p| p.get("requestState")) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.as_str()),
            Some(other) => {
                return Err(RpcError::invalid_params(format!(
                    "`requestState` must be a string, not {}",
                    kind(other)
                )));
            }
        };
        let input_responses = object_member(params, "inputResponses")?;
        let binding = Binding {
            owner: &ctx.owner,
            method: methods::PROMPTS_GET,
            name: &name,
            arguments: &arguments,
        };
        let capabilities = Value::Object(meta.client_capabilities.clone());
        let prompt_ctx =
            self.mrtr_context(&binding, request_state, input_responses, capabilities)?;
        match AssertUnwindSafe(prompt.get(prompt_ctx.clone(), arguments.clone()))
            .catch_unwind()
            .await
        {
            Ok(Ok(result)) => Ok(results::get_prompt(
                &self.shared.config.server_info,
                result.to_json(),
            )),
            Ok(Err(ToolError::InputRequired(requests))) => {
                Ok(self.input_required(&binding, &prompt_ctx, requests))
            }
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(RpcError::internal(format!("prompt `{name}` panicked"))),
        }
    }

    pub(super) fn read_resource(
        &self,
        params: Option<&Map<String, Value>>,
    ) -> Result<Value, RpcError> {
        let uri = string_member(params, "uri")?;
        let resource = self
            .shared
            .catalog
            .resource(&uri)
            .ok_or_else(|| RpcError::invalid_params(format!("Resource not found: {uri}")))?;
        Ok(results::read_resource(
            &self.shared.config.server_info,
            vec![resource.contents()],
            self.shared.config.cache_hints,
        ))
    }
}

fn string_member(params: Option<&Map<String, Value>>, key: &str) -> Result<String, RpcError> {
    match params.and_then(|p| p.get(key)) {
        Some(Value::String(s)) if s.len() <= limits::MAX_NAME_LEN * 16 => Ok(s.clone()),
        Some(Value::String(_)) => Err(RpcError::invalid_params(format!("`{key}` is too long"))),
        Some(other) => Err(RpcError::invalid_params(format!(
            "`{key}` must be a string, not {}",
            kind(other)
        ))),
        None => Err(RpcError::invalid_params(format!("`{key}` is required"))),
    }
}

fn object_member(
    params: Option<&Map<String, Value>>,
    key: &str,
) -> Result<Option<Map<String, Value>>, RpcError> {
    match params.and_then(|p| p.get(key)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o.clone())),
        Some(other) => Err(RpcError::invalid_params(format!(
            "`{key}` must be an object, not {}",
            kind(other)
        ))),
    }
}
