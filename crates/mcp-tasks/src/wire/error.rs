//! The JSON-RPC error object and the error codes of JSON-RPC 2.0 and MCP `2026-07-28`.
//!
//! Pure wire data: the mapping from the runtime's typed errors to these codes lives in one
//! place, the dispatcher (`protocol::errors`).

use serde_json::{Value, json};

/// JSON-RPC and MCP `2026-07-28` error codes (base protocol and SEP-2243).
pub mod code {
    /// JSON-RPC: invalid JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// JSON-RPC: not a valid request object.
    pub const INVALID_REQUEST: i64 = -32600;
    /// JSON-RPC: the method does not exist (or was removed from the protocol).
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// JSON-RPC: invalid method parameters.
    pub const INVALID_PARAMS: i64 = -32602;
    /// JSON-RPC: internal error.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// MCP (SEP-2243): a transport header disagrees with the body.
    pub const HEADER_MISMATCH: i64 = -32020;
    /// MCP: the request needs a capability or extension the client did not declare.
    pub const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
    /// MCP: the requested protocol version is not supported.
    pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
    /// A per-principal quota refused the request (HTTP `429`). JSON-RPC leaves
    /// -32000..-32099 to implementations and MCP reserves -32020..-32099 for itself; -32000,
    /// -32001 and -32002 are used by MCP SDKs (connection closed, request timeout, resource
    /// not found), so this runtime uses -32010, unused by the MCP specification and its SDKs.
    pub const QUOTA_EXCEEDED: i64 = -32010;
}

/// A JSON-RPC error object ready for the wire.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("JSON-RPC error {code}: {message}")]
pub struct RpcError {
    /// The error code (see [`code`]).
    pub code: i64,
    /// A short description.
    pub message: String,
    /// Additional data, if any.
    pub data: Option<Value>,
}

impl RpcError {
    /// An error with a code and a message.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// Adds `data`.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// `-32700`.
    pub fn parse_error(detail: impl std::fmt::Display) -> Self {
        Self::new(code::PARSE_ERROR, format!("Parse error: {detail}"))
    }

    /// `-32600`.
    pub fn invalid_request(detail: impl std::fmt::Display) -> Self {
        Self::new(code::INVALID_REQUEST, format!("Invalid request: {detail}"))
    }

    /// `-32601` naming the method.
    pub fn method_not_found(method: &str) -> Self {
        Self::new(
            code::METHOD_NOT_FOUND,
            format!("Method not found: {method}"),
        )
    }

    /// `-32602`.
    pub fn invalid_params(detail: impl std::fmt::Display) -> Self {
        Self::new(code::INVALID_PARAMS, format!("Invalid params: {detail}"))
    }

    /// `-32603`.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        Self::new(code::INTERNAL_ERROR, format!("Internal error: {detail}"))
    }

    /// `-32021` with `data.requiredCapabilities` as a `ClientCapabilities` object.
    pub fn missing_capability(required: Value, detail: impl std::fmt::Display) -> Self {
        Self::new(
            code::MISSING_REQUIRED_CLIENT_CAPABILITY,
            format!("Missing required client capability: {detail}"),
        )
        .with_data(json!({ "requiredCapabilities": required }))
    }

    /// `-32021` naming the Tasks extension.
    pub fn tasks_extension_required() -> Self {
        Self::missing_capability(
            json!({ "extensions": { super::TASKS_EXTENSION: {} } }),
            format!(
                "this request needs the {} extension",
                super::TASKS_EXTENSION
            ),
        )
    }

    /// `-32022` with the supported versions and the one requested.
    pub fn unsupported_version(requested: &str) -> Self {
        Self::new(
            code::UNSUPPORTED_PROTOCOL_VERSION,
            format!("Unsupported protocol version: {requested}"),
        )
        .with_data(json!({
            "supported": super::SUPPORTED_VERSIONS,
            "requested": requested,
        }))
    }

    /// `-32020`: a transport header disagrees with the body or is missing.
    pub fn header_mismatch(detail: impl std::fmt::Display) -> Self {
        Self::new(code::HEADER_MISMATCH, format!("Header mismatch: {detail}"))
    }

    /// `-32602` for a URI no resource or template serves, with the URI in `data` (SEP-2164).
    pub fn resource_not_found(uri: &str) -> Self {
        Self::invalid_params(format!("Resource not found: {uri}")).with_data(json!({ "uri": uri }))
    }

    /// The unknown-task answer, also given for another principal's task.
    pub fn task_not_found() -> Self {
        Self::invalid_params("Failed to retrieve task: Task not found")
    }

    /// The answer for an expired task, given to its owner only.
    pub fn task_expired() -> Self {
        Self::invalid_params("Failed to retrieve task: Task has expired")
    }

    /// The error object as JSON.
    pub fn to_json(&self) -> Value {
        let mut obj = json!({ "code": self.code, "message": self.message });
        if let Some(data) = &self.data {
            obj["data"] = data.clone();
        }
        obj
    }
}

/// The HTTP status a transport uses for a JSON-RPC error code (Streamable HTTP transport, SEP-2243).
pub fn http_status(error_code: i64) -> u16 {
    match error_code {
        code::METHOD_NOT_FOUND => 404,
        code::PARSE_ERROR
        | code::INVALID_REQUEST
        | code::INVALID_PARAMS
        | code::HEADER_MISMATCH
        | code::MISSING_REQUIRED_CLIENT_CAPABILITY
        | code::UNSUPPORTED_PROTOCOL_VERSION => 400,
        code::QUOTA_EXCEEDED => 429,
        _ => 500,
    }
}
