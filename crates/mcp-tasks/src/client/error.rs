//! The client's typed errors: one variant per JSON-RPC error code of MCP `2026-07-28`, one per
//! kind of HTTP failure, and the client's own (protocol violations, the handle store).

use serde_json::Value;

use crate::wire::error::{RpcError, code};

/// Everything a client call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    // --- transport -----------------------------------------------------------------------
    /// The URL given to the client cannot be used.
    #[error("invalid server URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why it cannot be used (not `http`/`https`, unparsable, credentials in it, ...).
        reason: String,
    },
    /// No connection could be made (refused, unreachable, DNS failure).
    #[error("cannot connect to {url}: {reason}")]
    Connect {
        /// The endpoint URL the client was talking to.
        url: String,
        /// The innermost cause in words (e.g. "connection refused (is the server running on
        /// that address?)").
        reason: String,
        /// The HTTP client's error, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The connection broke while sending or reading (reset, closed, truncated body).
    #[error("connection to {url} failed: {reason}")]
    Io {
        /// The endpoint URL the client was talking to.
        url: String,
        /// What broke, in words.
        reason: String,
        /// The HTTP client's error, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// No response in time.
    #[error("no response from {url} within {seconds:.1} s")]
    Timeout {
        /// The endpoint URL the client was talking to.
        url: String,
        /// The timeout that elapsed.
        seconds: f64,
    },
    /// `401 Unauthorized`; `resource_metadata` is the OAuth protected-resource metadata URL of
    /// the server's `WWW-Authenticate` challenge, when it gave one.
    #[error("{url} requires authentication (401){}", resource_metadata_hint(.resource_metadata, .token_sent))]
    Unauthorized {
        /// The endpoint URL the client was talking to.
        url: String,
        /// The `resource_metadata` parameter of the challenge (RFC 9728), where an OAuth client
        /// finds the authorization server.
        resource_metadata: Option<String>,
        /// The whole `WWW-Authenticate` header, when present.
        www_authenticate: Option<String>,
        /// Whether this request carried a bearer token (so the token was refused, rather than
        /// missing).
        token_sent: bool,
    },
    /// `403 Forbidden` (e.g. a `Host` or `Origin` the server does not accept, or a token
    /// without the right scope).
    #[error("{url} refused the request (403): {body}")]
    Forbidden {
        /// The endpoint URL the client was talking to.
        url: String,
        /// The response body (the server's explanation), as text.
        body: String,
    },
    /// Any other HTTP status without a JSON-RPC answer in its body.
    #[error("{url} answered HTTP {status}: {body}")]
    Http {
        /// The endpoint URL the client was talking to.
        url: String,
        /// The HTTP status code.
        status: u16,
        /// The response body, as text.
        body: String,
    },

    // --- JSON-RPC errors answered by the server --------------------------------------------
    /// `-32700`.
    #[error("the server could not parse the request: {}", .0.message)]
    ParseError(Box<RpcError>),
    /// `-32600`.
    #[error("the server rejected the request envelope: {}", .0.message)]
    InvalidRequest(Box<RpcError>),
    /// `-32601`: the server does not implement the method.
    #[error("the server does not implement `{method}`: {}", .error.message)]
    MethodNotFound {
        /// The method the client called.
        method: String,
        /// The server's error object.
        error: Box<RpcError>,
    },
    /// `-32602` that is not one of the cases below.
    #[error("invalid params: {}", detail(.0))]
    InvalidParams(Box<RpcError>),
    /// `-32602` on `tools/call` for a tool the server does not list. `available` is the
    /// server's tool list when it could be fetched.
    #[error("unknown tool `{name}`{}", available_hint(.available))]
    UnknownTool {
        /// The tool name the client called.
        name: String,
        /// The names the server lists (empty when the list could not be fetched).
        available: Vec<String>,
        /// The server's error object.
        error: Box<RpcError>,
    },
    /// `-32602` on a task method: no such task for this caller (never created, purged, or
    /// another principal's).
    #[error("unknown task `{task_id}`: {}", detail(.error))]
    UnknownTask {
        /// The task id the client asked about.
        task_id: String,
        /// The server's error object.
        error: Box<RpcError>,
    },
    /// `-32602` on a task method whose message says the id is not even of the server's form
    /// (so it cannot name any task, purged or not).
    #[error("`{task_id}` is not a task id: {}", detail(.error))]
    MalformedTaskId {
        /// The id as given.
        task_id: String,
        /// The server's error object.
        error: Box<RpcError>,
    },
    /// `-32602` on `tasks/update` for a known task: the server refused the responses (one does
    /// not fit its request's schema, lacks `action`, ...). Nothing was applied; the task still
    /// waits.
    #[error("the answer to task `{task_id}` was refused: {}", detail(.error))]
    InvalidAnswer {
        /// The task id the client answered.
        task_id: String,
        /// The server's error object (its message says which key and why).
        error: Box<RpcError>,
    },
    /// The client was asked to answer input keys the task is not waiting for (see
    /// `TaskHandle::answer_outstanding`). Servers acknowledge and ignore such keys, as
    /// the Tasks extension says they should, so the client checks before it sends; nothing
    /// was sent.
    #[error(
        "task `{task_id}` is not waiting for {}{}",
        quoted(.keys),
        waiting_hint(.status, .waiting)
    )]
    UnknownInputKey {
        /// The task id.
        task_id: String,
        /// The keys given that the task does not wait for.
        keys: Vec<String>,
        /// The task's status when it was checked (`input_required`, `working`, ...).
        status: String,
        /// The keys the task waits for (empty unless `status` is `input_required`).
        waiting: Vec<String>,
    },
    /// `-32602` on a task method whose message says the task has expired.
    #[error("task `{task_id}` has expired: {}", detail(.error))]
    TaskExpired {
        /// The task id the client asked about.
        task_id: String,
        /// The server's error object.
        error: Box<RpcError>,
    },
    /// `-32603`.
    #[error("the server failed internally: {}", .0.message)]
    Internal(Box<RpcError>),
    /// `-32020`: routing headers and body disagree.
    #[error("header mismatch: {}", .0.message)]
    HeaderMismatch(Box<RpcError>),
    /// `-32021`: the request needs a client capability this client did not declare.
    #[error("the server needs client capabilities {required}: {}", .error.message)]
    MissingCapability {
        /// `data.requiredCapabilities`: a `ClientCapabilities` object of what is missing.
        required: Box<Value>,
        /// The server's error object.
        error: Box<RpcError>,
    },
    /// `-32022`: the server does not implement this protocol version.
    #[error("the server does not support protocol version {requested} (it supports {supported:?})")]
    UnsupportedVersion {
        /// The protocol version the client sent.
        requested: String,
        /// The versions the server named in `data.supported`.
        supported: Vec<String>,
        /// The server's error object.
        error: Box<RpcError>,
    },
    /// Any other JSON-RPC error code.
    #[error("JSON-RPC error {}: {}", .0.code, .0.message)]
    Rpc(Box<RpcError>),

    // --- the client's own -----------------------------------------------------------------
    /// The server answered something that is not a valid MCP response.
    #[error("invalid response from the server: {0}")]
    Protocol(String),
    /// A synchronous `tools/call` needs input (core MRTR) and no input handler answered it.
    #[error("the call needs input that no input handler provided: {}", keys_of(.requests))]
    InputRequired {
        /// The server's `inputRequests`, by key.
        requests: serde_json::Map<String, Value>,
    },
    /// The local file of durable task handles failed.
    #[error("task handle store: {message}: {source}")]
    Store {
        /// What the store was doing (names the file).
        message: String,
        /// The underlying error (redb's, or the blocking task's).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn resource_metadata_hint(url: &Option<String>, token_sent: &bool) -> String {
    let mut s = String::new();
    if *token_sent {
        s.push_str("; the token was not accepted");
    } else {
        s.push_str("; pass a bearer token");
    }
    if let Some(url) = url {
        s.push_str("; authorization server metadata: ");
        s.push_str(url);
    }
    s
}

fn available_hint(available: &[String]) -> String {
    if available.is_empty() {
        String::new()
    } else {
        format!("; the server has: {}", available.join(", "))
    }
}

/// The server's message without a leading "Invalid params:" (the variant already says it).
fn detail(error: &RpcError) -> &str {
    let m = error.message.trim();
    match m.get(..15) {
        Some(head) if head.eq_ignore_ascii_case("invalid params:") => m[15..].trim_start(),
        _ => m,
    }
}

fn quoted(keys: &[String]) -> String {
    let list = keys
        .iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if keys.len() == 1 {
        format!("input {list}")
    } else {
        format!("inputs {list}")
    }
}

fn waiting_hint(status: &str, waiting: &[String]) -> String {
    if waiting.is_empty() {
        format!("; it is {status} and waits for no input")
    } else {
        format!("; it waits for: {}", waiting.join(", "))
    }
}

fn keys_of(requests: &serde_json::Map<String, Value>) -> String {
    requests.keys().cloned().collect::<Vec<_>>().join(", ")
}

impl ClientError {
    /// Turns a JSON-RPC error object of a response to `method` into its typed variant.
    /// `name` is the tool name or task id the request was about.
    pub(crate) fn from_rpc(method: &str, name: Option<&str>, error: RpcError) -> Self {
        let error = Box::new(error);
        match error.code {
            code::PARSE_ERROR => Self::ParseError(error),
            code::INVALID_REQUEST => Self::InvalidRequest(error),
            code::METHOD_NOT_FOUND => Self::MethodNotFound {
                method: method.to_owned(),
                error,
            },
            code::INVALID_PARAMS => match (method, name) {
                (m, Some(id)) if m.starts_with("tasks/") => Self::task_error(m, id, error),
                _ => Self::InvalidParams(error),
            },
            code::INTERNAL_ERROR => Self::Internal(error),
            code::HEADER_MISMATCH => Self::HeaderMismatch(error),
            code::MISSING_REQUIRED_CLIENT_CAPABILITY => Self::MissingCapability {
                required: Box::new(
                    error
                        .data
                        .as_ref()
                        .and_then(|d| d.get("requiredCapabilities"))
                        .cloned()
                        .unwrap_or(Value::Null),
                ),
                error,
            },
            code::UNSUPPORTED_PROTOCOL_VERSION => {
                let data = error.data.clone().unwrap_or(Value::Null);
                Self::UnsupportedVersion {
                    requested: data
                        .get("requested")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    supported: data
                        .get("supported")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(|v| v.as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default(),
                    error,
                }
            }
            _ => Self::Rpc(error),
        }
    }

    /// A `-32602` of a task method about task `task_id`, by what its message says. The Tasks
    /// extension gives every such failure the same code, so the message is all there is:
    /// "expired", "malformed"/"invalid task id", and "not found"/"unknown task"/"no such
    /// task" are recognised; any other `-32602` of `tasks/update` is a refused answer (its
    /// only other parameter is `inputResponses`), and of `tasks/get`/`tasks/cancel` an unknown
    /// task (their only parameter is the id).
    fn task_error(method: &str, id: &str, error: Box<RpcError>) -> Self {
        let task_id = id.to_owned();
        let m = error.message.to_ascii_lowercase();
        let says = |words: &[&str]| words.iter().any(|w| m.contains(w));
        if says(&["expired"]) {
            Self::TaskExpired { task_id, error }
        } else if says(&["malformed", "invalid task id", "invalid taskid"]) {
            Self::MalformedTaskId { task_id, error }
        } else if says(&[
            "not found",
            "unknown task",
            "no such task",
            "does not exist",
        ]) {
            Self::UnknownTask { task_id, error }
        } else if method == crate::wire::methods::TASKS_UPDATE {
            Self::InvalidAnswer { task_id, error }
        } else {
            Self::UnknownTask { task_id, error }
        }
    }

    /// The JSON-RPC error the server answered, for the variants that carry one.
    pub fn rpc_error(&self) -> Option<&RpcError> {
        match self {
            Self::ParseError(e)
            | Self::InvalidRequest(e)
            | Self::InvalidParams(e)
            | Self::Internal(e)
            | Self::HeaderMismatch(e)
            | Self::Rpc(e) => Some(e),
            Self::MethodNotFound { error, .. }
            | Self::UnknownTool { error, .. }
            | Self::UnknownTask { error, .. }
            | Self::MalformedTaskId { error, .. }
            | Self::InvalidAnswer { error, .. }
            | Self::TaskExpired { error, .. }
            | Self::MissingCapability { error, .. }
            | Self::UnsupportedVersion { error, .. } => Some(error),
            _ => None,
        }
    }

    /// Whether the request may not have reached the server or its answer was lost: the
    /// failures a retry of an idempotent call can fix.
    pub fn is_transport(&self) -> bool {
        match self {
            Self::Connect { .. } | Self::Io { .. } | Self::Timeout { .. } => true,
            Self::Http { status, .. } => matches!(status, 502..=504),
            _ => false,
        }
    }
}
