//! The dispatcher: one JSON-RPC message and the caller's identity in, zero or one JSON-RPC
//! response out. It validates in the digest's order (§2.5), routes to the task actors and the
//! supervisor, and maps every internal error to a JSON-RPC error through `crate::error`.
//!
//! It is not an actor on purpose: requests are handled concurrently on the caller's tokio
//! task, so neither validation nor store reads serialize the server. Per-task ordering comes
//! from the task actors.

mod tasks;
mod tools;

use std::sync::Arc;

use ractor::ActorRef;
use serde_json::{Map, Value};

use crate::actor::{Shared, SupervisorMsg};
use crate::error::{RpcError, http_status};
use crate::task::Owner;
use crate::wire::jsonrpc::{self, Incoming};
use crate::wire::meta::RequestMeta;
use crate::wire::params::ListParams;
use crate::wire::{methods, results};

/// Who sends a message, as established by the transport (authentication is the host's job).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestContext {
    pub owner: Owner,
}

impl RequestContext {
    pub fn new(owner: Owner) -> Self {
        Self { owner }
    }
}

/// The answer to one request: the JSON-RPC response and the HTTP status a transport should
/// use for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub body: Value,
    pub http_status: u16,
}

impl Reply {
    fn ok(id: &Value, result: Value) -> Self {
        Self {
            body: jsonrpc::result_response(id, result),
            http_status: 200,
        }
    }

    fn error(id: Option<&Value>, error: &RpcError) -> Self {
        Self {
            body: jsonrpc::error_response(id, error),
            http_status: http_status(error.code),
        }
    }
}

/// One runtime's dispatcher.
pub(crate) struct Dispatcher {
    pub(crate) shared: Arc<Shared>,
    pub(crate) supervisor: ActorRef<SupervisorMsg>,
}

impl Dispatcher {
    /// Handles one raw message. `None` for notifications (no response is ever sent).
    pub(crate) async fn handle(&self, bytes: &[u8], ctx: &RequestContext) -> Option<Reply> {
        match jsonrpc::parse(bytes) {
            Ok(incoming) => self.handle_incoming(incoming, ctx).await,
            Err(rejection) => Some(Reply::error(rejection.id.as_ref(), &rejection.error)),
        }
    }

    /// Handles one message that is already JSON.
    pub(crate) async fn handle_value(&self, value: Value, ctx: &RequestContext) -> Option<Reply> {
        match jsonrpc::from_value(value) {
            Ok(incoming) => self.handle_incoming(incoming, ctx).await,
            Err(rejection) => Some(Reply::error(rejection.id.as_ref(), &rejection.error)),
        }
    }

    async fn handle_incoming(&self, incoming: Incoming, ctx: &RequestContext) -> Option<Reply> {
        match incoming {
            Incoming::Notification { method, .. } => {
                tracing::debug!(%method, "notification accepted");
                None
            }
            Incoming::Request { id, method, params } => {
                let reply = match self.request(&method, params.as_ref(), ctx).await {
                    Ok(result) => Reply::ok(&id, result),
                    Err(error) => {
                        tracing::debug!(%method, code = error.code, message = %error.message, "request failed");
                        Reply::error(Some(&id), &error)
                    }
                };
                Some(reply)
            }
        }
    }

    async fn request(
        &self,
        method: &str,
        params: Option<&Map<String, Value>>,
        ctx: &RequestContext,
    ) -> Result<Value, RpcError> {
        // Removed methods answer -32601 whatever else is wrong with the request, so that a
        // client of an older revision learns that the method is gone.
        if methods::REMOVED.contains(&method) {
            return Err(RpcError::method_not_found(method));
        }
        let meta = RequestMeta::from_params(params)?;
        meta.check_version()?;
        let server = &self.shared.config.server_info;
        match method {
            methods::DISCOVER => Ok(results::discover(
                server,
                results::capabilities(),
                self.shared.config.instructions.as_deref(),
                self.shared.config.cache_hints,
            )),
            methods::TOOLS_LIST => {
                if ListParams::parse(params)?.cursor.is_some() {
                    return Err(RpcError::invalid_params(
                        "invalid cursor: the tool list has one page",
                    ));
                }
                Ok(results::tools_list(
                    server,
                    self.shared.tools.list(),
                    self.shared.config.cache_hints,
                ))
            }
            methods::TOOLS_CALL => self.call_tool(params, &meta, ctx).await,
            methods::TASKS_GET | methods::TASKS_UPDATE | methods::TASKS_CANCEL => {
                if !meta.declares_tasks() {
                    return Err(RpcError::tasks_extension_required());
                }
                match method {
                    methods::TASKS_GET => self.get_task(params, ctx).await,
                    methods::TASKS_UPDATE => self.update_task(params, ctx).await,
                    _ => self.cancel_task(params, ctx).await,
                }
            }
            other => Err(RpcError::method_not_found(other)),
        }
    }
}
