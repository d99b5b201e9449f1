//! Result shapes (the task objects are in `task::json`). Every result carries `resultType` and
//! `_meta["io.modelcontextprotocol/serverInfo"]`; task objects are flat (Tasks extension, SEP-2663).

use serde_json::{Map, Value, json};

use super::{ServerInfo, TASKS_EXTENSION, keys};

/// Cache hints of `server/discover` and list results (SEP-2549).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheHints {
    /// How long a client may cache the result, in milliseconds.
    pub ttl_ms: u64,
    /// Whether the result is the same for every caller (shared caches may keep it).
    pub public: bool,
}

impl Default for CacheHints {
    fn default() -> Self {
        Self {
            ttl_ms: 300_000,
            public: true,
        }
    }
}

/// `result` with the server's identity added to its `_meta`.
pub(crate) fn with_server_info(mut result: Map<String, Value>, server: &ServerInfo) -> Value {
    let meta = result
        .entry("_meta")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(meta) = meta {
        meta.insert(keys::SERVER_INFO.to_owned(), server.to_json());
    }
    Value::Object(result)
}

/// The members of `v`, or none when it is not an object.
pub(crate) fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The empty `{"resultType":"complete"}` acknowledgement of `tasks/update` and `tasks/cancel`.
pub fn ack(server: &ServerInfo) -> Value {
    with_server_info(obj(json!({ "resultType": "complete" })), server)
}

/// `DiscoverResult`.
pub fn discover(
    server: &ServerInfo,
    capabilities: Map<String, Value>,
    instructions: Option<&str>,
    hints: CacheHints,
) -> Value {
    let mut r = obj(json!({
        "resultType": "complete",
        "supportedVersions": super::SUPPORTED_VERSIONS,
        "capabilities": capabilities,
    }));
    if let Some(i) = instructions {
        r.insert("instructions".into(), Value::String(i.to_owned()));
    }
    insert_hints(&mut r, hints);
    with_server_info(r, server)
}

/// The server capabilities this runtime advertises: tools, and the Tasks extension.
pub fn capabilities() -> Map<String, Value> {
    obj(json!({ "tools": {}, "extensions": { TASKS_EXTENSION: {} } }))
}

/// A list result (`tools`, `prompts`, `resources`, `resourceTemplates`) of one page, with
/// cache hints.
pub fn list(server: &ServerInfo, key: &str, items: Vec<Value>, hints: CacheHints) -> Value {
    let mut r = obj(json!({ "resultType": "complete" }));
    r.insert(key.to_owned(), Value::Array(items));
    insert_hints(&mut r, hints);
    with_server_info(r, server)
}

/// `ReadResourceResult`, with cache hints.
pub fn read_resource(server: &ServerInfo, contents: Vec<Value>, hints: CacheHints) -> Value {
    let mut r = obj(json!({ "resultType": "complete", "contents": contents }));
    insert_hints(&mut r, hints);
    with_server_info(r, server)
}

/// `GetPromptResult`.
pub fn get_prompt(server: &ServerInfo, result: Value) -> Value {
    let mut r = obj(json!({ "resultType": "complete" }));
    r.extend(obj(result));
    with_server_info(r, server)
}

/// `CompleteResult`: `completion` is the `{values, total?, hasMore?}` object.
pub fn complete(server: &ServerInfo, completion: Value) -> Value {
    let r = obj(json!({ "resultType": "complete", "completion": completion }));
    with_server_info(r, server)
}

/// A `notifications/progress` message for `token`.
pub fn progress_notification(
    token: &Value,
    progress: f64,
    total: Option<f64>,
    message: Option<&str>,
) -> Value {
    let mut params = obj(json!({ "progressToken": token, "progress": progress }));
    if let Some(t) = total {
        params.insert("total".into(), json!(t));
    }
    if let Some(m) = message {
        params.insert("message".into(), json!(m));
    }
    json!({ "jsonrpc": "2.0", "method": "notifications/progress", "params": params })
}

/// A `notifications/message` log message at `level`.
pub fn log_notification(level: super::LogLevel, logger: Option<&str>, data: Value) -> Value {
    let mut params = obj(json!({ "level": level.as_str(), "data": data }));
    if let Some(l) = logger {
        params.insert("logger".into(), json!(l));
    }
    json!({ "jsonrpc": "2.0", "method": "notifications/message", "params": params })
}

/// Core MRTR `InputRequiredResult`: the outstanding requests and the signed state.
pub fn input_required(
    server: &ServerInfo,
    requests: Map<String, Value>,
    request_state: String,
) -> Value {
    let r = obj(json!({
        "resultType": "input_required",
        "inputRequests": requests,
        "requestState": request_state,
    }));
    with_server_info(r, server)
}

fn insert_hints(r: &mut Map<String, Value>, hints: CacheHints) {
    r.insert("ttlMs".into(), json!(hints.ttl_ms));
    r.insert(
        "cacheScope".into(),
        json!(if hints.public { "public" } else { "private" }),
    );
}

/// A `CallToolResult` as it leaves the server: the tool's object with
/// `resultType: "complete"` and the server's identity in `_meta` added. A value that is not an
/// object becomes a text result (tools built through [`crate::tool`] always return objects).
pub fn call_tool_result(server: &ServerInfo, result: Value) -> Value {
    let mut r = match result {
        Value::Object(m) => m,
        other => obj(json!({ "content": [{ "type": "text", "text": other.to_string() }] })),
    };
    r.insert("resultType".into(), json!("complete"));
    r.entry("content").or_insert_with(|| json!([]));
    with_server_info(r, server)
}
