//! `prompts/get` (with core MRTR), `resources/read` and `completion/complete`.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use serde_json::{Map, Value};

use super::{Dispatcher, RequestContext};
use crate::catalog::{Catalog, Completion, CompletionRef, CompletionRequest};
use crate::shared::request_state::Binding;
use crate::tool::ToolError;
use crate::wire::error::RpcError;
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
            self.mrtr_context(&binding, request_state, input_responses, capabilities, None)?;
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

    /// `resources/read`: a registered resource, or a URI a readable template matches. A URI
    /// nothing serves (or a reader that finds nothing) is `-32602` with the URI in `data`
    /// (SEP-2164): never a result with empty `contents`.
    pub(super) async fn read_resource(
        &self,
        params: Option<&Map<String, Value>>,
        ctx: &RequestContext,
    ) -> Result<Value, RpcError> {
        let uri = string_member(params, "uri")?;
        let catalog = &self.shared.catalog;
        let contents = if let Some(resource) = catalog.resource(&uri) {
            vec![resource.contents()]
        } else if let Some((reader, request)) = catalog.match_template(&uri, &ctx.owner) {
            let read = AssertUnwindSafe(Catalog::read_template(reader, request))
                .catch_unwind()
                .await;
            match read {
                Ok(Ok(contents)) => contents.iter().map(|c| c.to_json()).collect(),
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => {
                    return Err(RpcError::internal(format!(
                        "the reader of `{uri}` panicked"
                    )));
                }
            }
        } else {
            Vec::new()
        };
        if contents.is_empty() {
            return Err(RpcError::resource_not_found(&uri));
        }
        Ok(results::read_resource(
            &self.shared.config.server_info,
            contents,
            self.shared.config.cache_hints,
        ))
    }

    /// The `ref` of a `completion/complete` request: a known prompt and one of its
    /// arguments, or a known template and one of its variables.
    fn completion_ref(
        &self,
        params: Option<&Map<String, Value>>,
    ) -> Result<CompletionRef, RpcError> {
        let catalog = &self.shared.catalog;
        let reference = object_member(params, "ref")?
            .ok_or_else(|| RpcError::invalid_params("`ref` is required"))?;
        let reference = match string_at(Some(&reference), "type", "ref.type")?.as_str() {
            "ref/prompt" => {
                let name = string_at(Some(&reference), "name", "ref.name")?;
                let prompt = catalog
                    .prompt(&name)
                    .ok_or_else(|| RpcError::invalid_params(format!("Unknown prompt: {name}")))?;
                let argument = argument_name(params)?;
                if !prompt
                    .descriptor()
                    .arguments
                    .iter()
                    .any(|a| a.name == argument)
                {
                    return Err(RpcError::invalid_params(format!(
                        "prompt `{name}` has no argument `{argument}`"
                    )));
                }
                CompletionRef::Prompt(name)
            }
            "ref/resource" => {
                let uri = string_at(Some(&reference), "uri", "ref.uri")?;
                let template = catalog.template(&uri).ok_or_else(|| {
                    RpcError::invalid_params(format!("Unknown resource template: {uri}"))
                })?;
                let argument = argument_name(params)?;
                if !template.uri_template.contains(&format!("{{{argument}}}")) {
                    return Err(RpcError::invalid_params(format!(
                        "resource template `{uri}` has no variable `{argument}`"
                    )));
                }
                CompletionRef::ResourceTemplate(uri)
            }
            other => {
                return Err(RpcError::invalid_params(format!(
                    "`ref.type` must be `ref/prompt` or `ref/resource`, not `{other}`"
                )));
            }
        };
        Ok(reference)
    }

    /// `completion/complete` for a prompt argument or a template variable. A known prompt or
    /// template without a completer gets no values; an unknown one, or an argument it does
    /// not declare, is `-32602`.
    pub(super) async fn complete(
        &self,
        params: Option<&Map<String, Value>>,
        ctx: &RequestContext,
    ) -> Result<Value, RpcError> {
        let catalog = &self.shared.catalog;
        let reference = self.completion_ref(params)?;
        let argument = object_member(params, "argument")?.unwrap_or_default();
        let name = string_at(Some(&argument), "name", "argument.name")?;
        let value = string_at(Some(&argument), "value", "argument.value")?;
        let context = completion_context(params)?;
        let completion = match catalog.completer(&reference) {
            None => Completion::default(),
            Some(completer) => {
                let request = CompletionRequest {
                    reference,
                    argument: name,
                    value,
                    context,
                    owner: ctx.owner.clone(),
                };
                match AssertUnwindSafe(completer(request)).catch_unwind().await {
                    Ok(Ok(completion)) => completion.capped(),
                    Ok(Err(e)) => return Err(e.into()),
                    Err(_) => return Err(RpcError::internal("the completer panicked")),
                }
            }
        };
        Ok(results::complete(
            &self.shared.config.server_info,
            completion.to_json(),
        ))
    }
}

/// The `context.arguments` of a `completion/complete` request (strings only).
fn completion_context(
    params: Option<&Map<String, Value>>,
) -> Result<BTreeMap<String, String>, RpcError> {
    let mut context = BTreeMap::new();
    if let Some(c) = object_member(params, "context")?
        && let Some(arguments) = object_member(Some(&c), "arguments")?
    {
        for (k, v) in arguments {
            let Value::String(v) = v else {
                return Err(RpcError::invalid_params(format!(
                    "`context.arguments.{k}` must be a string, not {}",
                    kind(&v)
                )));
            };
            context.insert(k, v);
        }
    }
    Ok(context)
}

/// `argument.name` of a `completion/complete` request.
fn argument_name(params: Option<&Map<String, Value>>) -> Result<String, RpcError> {
    let argument = object_member(params, "argument")?
        .ok_or_else(|| RpcError::invalid_params("`argument` is required"))?;
    string_at(Some(&argument), "name", "argument.name")
}

fn string_member(params: Option<&Map<String, Value>>, key: &str) -> Result<String, RpcError> {
    string_at(params, key, key)
}

/// The string member `key` of `map`, named `path` in errors.
fn string_at(map: Option<&Map<String, Value>>, key: &str, path: &str) -> Result<String, RpcError> {
    match map.and_then(|p| p.get(key)) {
        Some(Value::String(s)) if s.len() <= limits::MAX_NAME_LEN * 16 => Ok(s.clone()),
        Some(Value::String(_)) => Err(RpcError::invalid_params(format!("`{path}` is too long"))),
        Some(other) => Err(RpcError::invalid_params(format!(
            "`{path}` must be a string, not {}",
            kind(other)
        ))),
        None => Err(RpcError::invalid_params(format!("`{path}` is required"))),
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
