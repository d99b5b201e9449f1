//! Wire goldens: every kind of message the server emits, produced by a real [`Runtime`],
//! compared (after normalizing volatile fields) with the pretty-printed files in
//! `crates/mcp-tasks-cli/tests/data/wire/`, and validated un-normalized against the official JSON Schemas in
//! `crates/mcp-tasks-cli/tests/data/schema/` (core `2026-07-28` and the `io.modelcontextprotocol/tasks` extension).
//!
//! Missing or changed goldens: review the change, then regenerate with
//! `MCP_TASKS_BLESS=1 cargo test -p mcp-tasks-cli --test it wire_golden::` and check the files in.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use mcp_tasks::tool::{
    CallToolResult, InputRequest, TaskPolicy, ToolDescriptor, ToolError, tool_fn,
};
use mcp_tasks::{Owner, Runtime};
use mcp_tasks_testkit::demo::generate_report;
use serde_json::{Value, json};
use tokio::sync::Notify;

// ---------------------------------------------------------------------------------------------
// Constants
// ---------------------------------------------------------------------------------------------

const SERVER_NAME: &str = "wire-golden-server";
const SERVER_VERSION: &str = "1.0.0";
const PROTOCOL_VERSION: &str = "2026-07-28";
const TASKS_EXT: &str = "io.modelcontextprotocol/tasks";
const KEY_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const KEY_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
const KEY_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
const KEY_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
const KEY_RELATED_TASK: &str = "io.modelcontextprotocol/related-task";
/// A well-formed task id that no runtime ever issues in these tests.
const UNKNOWN_TASK_ID: &str = "tsk_00000000000000000000000000000000";
/// Keys of the legacy (`2025-11-25`) task wire that must never appear in task objects.
const FORBIDDEN_TASK_KEYS: &[&str] = &["ttl", "pollInterval", "task", "requestState"];
/// Upper bound for every wait on a task's status.
const POLL_LIMIT: Duration = Duration::from_secs(10);
const BLESS_ENV: &str = "MCP_TASKS_BLESS";

/// Every golden file this test owns (`crates/mcp-tasks-cli/tests/data/wire/<name>.json`).
const ALL_GOLDENS: &[&str] = &[
    "discover_result",
    "tools_list_result",
    "tools_call_sync_result",
    "tools_call_sync_is_error_result",
    "tools_call_create_task_result",
    "tasks_get_working",
    "tasks_cancel_result",
    "tasks_get_cancelled",
    "tasks_get_input_required",
    "tasks_update_result",
    "tasks_get_completed",
    "tasks_get_completed_is_error",
    "tasks_get_failed",
    "error_parse",
    "error_invalid_request",
    "error_invalid_request_batch",
    "error_method_not_found",
    "error_invalid_params_missing_meta",
    "error_invalid_params_unknown_task",
    "error_invalid_params_unknown_tool",
    "error_missing_capability_tasks_get",
    "error_missing_capability_tools_call",
    "error_unsupported_protocol_version",
    "tools_call_input_required_result",
    "tools_call_after_input_result",
    "subscriptions_acknowledged_notification",
    "tasks_status_notification",
    "subscriptions_listen_result",
    "prompts_list_result",
    "prompts_get_input_required_result",
    "prompts_get_result",
    "resources_list_result",
    "resources_templates_list_result",
    "resources_read_result",
    "completion_complete_result",
    "resources_read_blob_result",
    "resources_read_template_result",
    "error_resource_not_found",
    "tools_call_rich_content_result",
    "prompts_get_rich_content_result",
    "progress_notification",
];

// ---------------------------------------------------------------------------------------------
// Schemas
// ---------------------------------------------------------------------------------------------

/// Which schema file a definition comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Doc {
    /// `core-2026-07-28.schema.json`
    Core,
    /// `tasks-ext.schema.json`
    Tasks,
}

impl Doc {
    fn file(self) -> &'static str {
        match self {
            Doc::Core => "core-2026-07-28.schema.json",
            Doc::Tasks => "tasks-ext.schema.json",
        }
    }
}

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("data")
}

fn schema_doc(doc: Doc) -> &'static Value {
    static CORE: OnceLock<Value> = OnceLock::new();
    static TASKS: OnceLock<Value> = OnceLock::new();
    let cell = match doc {
        Doc::Core => &CORE,
        Doc::Tasks => &TASKS,
    };
    cell.get_or_init(|| {
        let path = data_dir().join("schema").join(doc.file());
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read schema {}: {e}", path.display()));
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("schema {} is not JSON: {e}", path.display()))
    })
}

/// Compiled validators per (document, definition).
type ValidatorCache = Mutex<HashMap<(Doc, String), Arc<jsonschema::Validator>>>;

/// A validator for `#/$defs/<def>` of `doc`: the whole schema document (so every local
/// `#/$defs/...` reference resolves) with a root `$ref` to the wanted definition. Compiled
/// validators are cached per (document, definition).
fn validator(doc: Doc, def: &str) -> Arc<jsonschema::Validator> {
    static CACHE: OnceLock<ValidatorCache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(v) = cache.lock().unwrap().get(&(doc, def.to_owned())) {
        return v.clone();
    }
    let mut schema = schema_doc(doc).clone();
    assert!(
        schema["$defs"].get(def).is_some(),
        "{} has no definition `{def}`",
        doc.file()
    );
    schema["$ref"] = json!(format!("#/$defs/{def}"));
    let compiled = jsonschema::validator_for(&schema)
        .unwrap_or_else(|e| panic!("cannot compile {}#/$defs/{def}: {e}", doc.file()));
    let compiled = Arc::new(compiled);
    cache
        .lock()
        .unwrap()
        .insert((doc, def.to_owned()), compiled.clone());
    compiled
}

/// The schema errors of `instance` against `doc#/$defs/def` (empty when valid).
fn schema_errors(doc: Doc, def: &str, instance: &Value) -> Vec<String> {
    validator(doc, def)
        .iter_errors(instance)
        .map(|e| format!("at `{}`: {e}", e.instance_path()))
        .collect()
}

#[track_caller]
pub(crate) fn assert_valid(doc: Doc, def: &str, instance: &Value, what: &str) {
    let errors = schema_errors(doc, def, instance);
    assert!(
        errors.is_empty(),
        "{what} does not validate against {}#/$defs/{def}:\n  {}\nmessage:\n{}",
        doc.file(),
        errors.join("\n  "),
        pretty(instance)
    );
}

#[track_caller]
fn assert_invalid(doc: Doc, def: &str, instance: &Value, what: &str) {
    assert!(
        !schema_errors(doc, def, instance).is_empty(),
        "{what} was accepted by {}#/$defs/{def} but must be rejected:\n{}",
        doc.file(),
        pretty(instance)
    );
}

// ---------------------------------------------------------------------------------------------
// Goldens
// ---------------------------------------------------------------------------------------------

fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).expect("JSON values serialize");
    s.push('\n');
    s
}

/// Replaces the volatile fields: every `taskId` becomes `"tsk_<id>"`, every `createdAt` /
/// `lastUpdatedAt` becomes `"<timestamp>"`.
fn normalize(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("taskId", Value::String(_)) => json!("tsk_<id>"),
                        ("createdAt" | "lastUpdatedAt", Value::String(_)) => json!("<timestamp>"),
                        ("requestState", Value::String(_)) => json!("<requestState>"),
                        ("taskIds", Value::Array(ids)) => {
                            Value::Array(ids.iter().map(|_| json!("tsk_<id>")).collect())
                        }
                        _ => normalize(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

fn blessing() -> bool {
    std::env::var(BLESS_ENV).is_ok_and(|v| v == "1")
}

/// Compares messages with their golden files; collects every problem and reports them all at
/// the end of a test.
#[derive(Default)]
struct Goldens {
    problems: Vec<String>,
}

impl Goldens {
    fn check(&mut self, name: &str, message: &Value) {
        assert!(
            ALL_GOLDENS.contains(&name),
            "golden `{name}` is not listed in ALL_GOLDENS"
        );
        let path = data_dir().join("wire").join(format!("{name}.json"));
        let actual = normalize(message);
        let actual_text = pretty(&actual);
        let bless = blessing();
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let expected: Value = match serde_json::from_str(&text) {
                    Ok(v) => v,
                    Err(e) if bless => {
                        eprintln!("re-blessing unreadable golden {}: {e}", path.display());
                        Value::Null
                    }
                    Err(e) => {
                        self.problems
                            .push(format!("golden {} is not JSON: {e}", path.display()));
                        return;
                    }
                };
                if expected == actual && text == actual_text {
                    return;
                }
                if bless {
                    write_golden(&path, &actual_text);
                } else if expected != actual {
                    self.problems.push(format!(
                        "wire message `{name}` differs from {}\n--- expected\n{}--- actual\n{}",
                        path.display(),
                        pretty(&expected),
                        actual_text
                    ));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if bless {
                    write_golden(&path, &actual_text);
                } else {
                    self.problems.push(format!(
                        "golden {} is missing; actual message:\n{actual_text}",
                        path.display()
                    ));
                }
            }
            Err(e) => self
                .problems
                .push(format!("cannot read golden {}: {e}", path.display())),
        }
    }

    #[track_caller]
    fn finish(self) {
        assert!(
            self.problems.is_empty(),
            "{}\n\nIf the change is intended, regenerate the goldens with \
             `{BLESS_ENV}=1 cargo test -p mcp-tasks-cli --test it wire_golden::` and review the diff.",
            self.problems.join("\n\n")
        );
    }
}

fn write_golden(path: &std::path::Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("golden paths have a parent"))
        .expect("create tests/data/wire");
    std::fs::write(path, text)
        .unwrap_or_else(|e| panic!("cannot write golden {}: {e}", path.display()));
    eprintln!("blessed {}", path.display());
}

// ---------------------------------------------------------------------------------------------
// Test tools
// ---------------------------------------------------------------------------------------------

/// `greet {name}`: never a task; `Hello, {name}!`.
fn greet() -> Arc<dyn mcp_tasks::tool::Tool> {
    let d = ToolDescriptor::new("greet", "Greets someone by name. Always synchronous.")
        .input_schema(json!({
            "type": "object",
            "properties": { "name": { "type": "string" } },
            "required": ["name"]
        }))
        .task_policy(TaskPolicy::Never);
    tool_fn(d, |_ctx, args| async move {
        let name = args
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("world")
            .to_owned();
        Ok(CallToolResult::text(format!("Hello, {name}!")))
    })
}

/// `lookup {key}`: never a task; always a tool-level error (`isError: true`).
fn lookup() -> Arc<dyn mcp_tasks::tool::Tool> {
    let d = ToolDescriptor::new(
        "lookup",
        "Looks a record up. Always synchronous; unknown keys are tool errors.",
    )
    .input_schema(json!({
        "type": "object",
        "properties": { "key": { "type": "string" } },
        "required": ["key"]
    }))
    .task_policy(TaskPolicy::Never);
    tool_fn(d, |_ctx, args| async move {
        let key = args
            .get("key")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        Ok(CallToolResult::error_text(format!(
            "No record named `{key}`."
        )))
    })
}

/// `wait_for_signal`: always a task; stays `working` until `signal` is notified (then
/// completes) or the task is cancelled.
fn wait_for_signal(signal: Arc<Notify>) -> Arc<dyn mcp_tasks::tool::Tool> {
    let d = ToolDescriptor::new(
        "wait_for_signal",
        "Waits until the test releases it or the task is cancelled.",
    )
    .task_policy(TaskPolicy::Always)
    .initial_status_message("Waiting for the signal.");
    tool_fn(d, move |ctx, _args| {
        let signal = signal.clone();
        async move {
            tokio::select! {
                () = signal.notified() => Ok(CallToolResult::text("Signal received.")),
                () = ctx.cancelled() => Err(ToolError::Cancelled),
            }
        }
    })
}

/// `protocol_error_job`: always a task; ends with a JSON-RPC error (task `failed`).
fn protocol_error_job() -> Arc<dyn mcp_tasks::tool::Tool> {
    let d = ToolDescriptor::new("protocol_error_job", "Always fails with a JSON-RPC error.")
        .task_policy(TaskPolicy::Always);
    tool_fn(d, |_ctx, _args| async move {
        Err(ToolError::rpc(-32603, "The backend rejected the job."))
    })
}

/// `confirm_delete {filename}`: always a task; asks for confirmation (`input_required`) and
/// ends `completed` with `isError: true` when the client declines.
fn confirm_delete() -> Arc<dyn mcp_tasks::tool::Tool> {
    let d = ToolDescriptor::new("confirm_delete", "Deletes a file after confirmation.")
        .input_schema(json!({
            "type": "object",
            "properties": { "filename": { "type": "string" } },
            "required": ["filename"]
        }))
        .task_policy(TaskPolicy::Always);
    tool_fn(d, |ctx, args| async move {
        let filename = args
            .get("filename")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let answer = ctx
            .input(
                "confirm",
                InputRequest::elicit_form(
                    format!("Delete {filename}?"),
                    json!({
                        "type": "object",
                        "properties": { "confirm": { "type": "boolean" } },
                        "required": ["confirm"]
                    }),
                ),
            )
            .await?;
        let confirmed = answer["action"] == "accept" && answer["content"]["confirm"] == true;
        if confirmed {
            Ok(CallToolResult::text(format!("Deleted {filename}.")))
        } else {
            Ok(CallToolResult::error_text(format!(
                "Deletion of {filename} was not confirmed."
            )))
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

struct Harness {
    runtime: Runtime,
    owner: Owner,
    _dir: tempfile::TempDir,
}

fn client_meta(tasks: bool) -> Value {
    let caps = if tasks {
        json!({ "extensions": { TASKS_EXT: {} } })
    } else {
        json!({})
    };
    json!({
        KEY_PROTOCOL_VERSION: PROTOCOL_VERSION,
        KEY_CLIENT_CAPABILITIES: caps,
        KEY_CLIENT_INFO: { "name": "wire-golden-client", "version": "1.0.0" }
    })
}

impl Harness {
    async fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let runtime = Runtime::builder(dir.path().join("tasks.redb"))
            .server_info(SERVER_NAME, SERVER_VERSION)
            .tool(greet())
            .tool(lookup())
            .tool(wait_for_signal(Arc::new(Notify::new())))
            .tool(protocol_error_job())
            .tool(confirm_delete())
            .tool(generate_report(Duration::from_millis(10)))
            .start()
            .await
            .expect("runtime starts");
        Self {
            runtime,
            owner: Owner::anonymous(),
            _dir: dir,
        }
    }

    async fn start_with_signal(signal: Arc<Notify>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let runtime = Runtime::builder(dir.path().join("tasks.redb"))
            .server_info(SERVER_NAME, SERVER_VERSION)
            .tool(wait_for_signal(signal))
            .start()
            .await
            .expect("runtime starts");
        Self {
            runtime,
            owner: Owner::anonymous(),
            _dir: dir,
        }
    }

    /// Sends one raw JSON message; expects a response.
    async fn send_json(&self, message: Value) -> Value {
        tokio::time::timeout(
            POLL_LIMIT,
            self.runtime.handle_json(message.clone(), &self.owner),
        )
        .await
        .unwrap_or_else(|_| panic!("no answer within {POLL_LIMIT:?} to {message}"))
        .unwrap_or_else(|| panic!("no response to {message}"))
    }

    /// Sends raw bytes; expects a response.
    async fn send_bytes(&self, bytes: &[u8]) -> Value {
        tokio::time::timeout(POLL_LIMIT, self.runtime.handle_message(bytes, &self.owner))
            .await
            .expect("answer in time")
            .unwrap_or_else(|| panic!("no response to {}", String::from_utf8_lossy(bytes)))
            .into_body()
    }

    /// A request with the standard per-request `_meta` (declaring the Tasks extension when
    /// `tasks`).
    async fn request(&self, id: u64, method: &str, mut params: Value, tasks: bool) -> Value {
        params["_meta"] = client_meta(tasks);
        self.send_json(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
            .await
    }

    /// `tools/call` declaring the extension; returns the response.
    async fn call(&self, id: u64, tool: &str, arguments: Value) -> Value {
        self.request(
            id,
            "tools/call",
            json!({ "name": tool, "arguments": arguments }),
            true,
        )
        .await
    }

    /// `tools/call` that must create a task: checks the `CreateTaskResult` and returns the
    /// response and the task id.
    async fn create_task(&self, id: u64, tool: &str, arguments: Value) -> (Value, String) {
        let resp = self.call(id, tool, arguments).await;
        check_create_task_response(&resp, id);
        let task_id = resp["result"]["taskId"].as_str().unwrap().to_owned();
        (resp, task_id)
    }

    async fn get(&self, id: u64, task_id: &str) -> Value {
        self.request(id, "tasks/get", json!({ "taskId": task_id }), true)
            .await
    }

    /// Polls `tasks/get` (same request id) until the task has status `want`; checks and
    /// returns that response. Fails on errors, on another terminal status and after
    /// [`POLL_LIMIT`].
    async fn poll_until(&self, id: u64, task_id: &str, want: &str) -> Value {
        let deadline = Instant::now() + POLL_LIMIT;
        loop {
            let resp = self.get(id, task_id).await;
            assert!(
                resp.get("error").is_none(),
                "tasks/get failed while waiting for `{want}`: {resp}"
            );
            let status = resp["result"]["status"].as_str().unwrap_or_default();
            if status == want {
                check_get_task_response(&resp, id, want);
                return resp;
            }
            assert!(
                !["completed", "failed", "cancelled"].contains(&status),
                "task ended `{status}` while waiting for `{want}`: {resp}"
            );
            assert!(
                Instant::now() < deadline,
                "task did not become `{want}` within {POLL_LIMIT:?}; last: {resp}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Structural checks shared by all messages
// ---------------------------------------------------------------------------------------------

/// A successful response: envelope, echoed id, `resultType`, server identity in `_meta`.
#[track_caller]
fn check_result_response(resp: &Value, id: u64) {
    assert_valid(Doc::Core, "JSONRPCResultResponse", resp, "result response");
    assert_valid(Doc::Core, "JSONRPCMessage", resp, "result response");
    assert_eq!(resp["jsonrpc"], "2.0", "{resp}");
    assert_eq!(
        resp["id"],
        json!(id),
        "the response must echo the request id: {resp}"
    );
    assert!(resp.get("error").is_none(), "unexpected error: {resp}");
    let result = &resp["result"];
    assert_valid(Doc::Core, "Result", result, "result");
    assert!(
        result["resultType"].is_string(),
        "every result carries `resultType`: {resp}"
    );
    assert_eq!(
        result["_meta"][KEY_SERVER_INFO],
        json!({ "name": SERVER_NAME, "version": SERVER_VERSION }),
        "every result carries `_meta[\"{KEY_SERVER_INFO}\"]`: {resp}"
    );
    assert_valid(
        Doc::Core,
        "Implementation",
        &result["_meta"][KEY_SERVER_INFO],
        "serverInfo",
    );
}

/// An error response: envelope, echoed id (or no `id` at all, never `null`), error object.
#[track_caller]
fn check_error_response(resp: &Value, id: Option<Value>, code: i64) {
    assert_valid(Doc::Core, "JSONRPCErrorResponse", resp, "error response");
    assert_valid(Doc::Core, "JSONRPCMessage", resp, "error response");
    assert_eq!(resp["jsonrpc"], "2.0", "{resp}");
    assert!(resp.get("result").is_none(), "{resp}");
    match id {
        Some(id) => assert_eq!(resp["id"], id, "the error must echo the request id: {resp}"),
        None => assert!(
            resp.get("id").is_none(),
            "an unreadable id is omitted, never null: {resp}"
        ),
    }
    assert_eq!(resp["error"]["code"], json!(code), "{resp}");
    assert!(
        resp["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{resp}"
    );
    let typed = match code {
        -32700 => Some("ParseError"),
        -32600 => Some("InvalidRequestError"),
        -32601 => Some("MethodNotFoundError"),
        -32602 => Some("InvalidParamsError"),
        -32603 => Some("InternalError"),
        _ => None,
    };
    if let Some(def) = typed {
        assert_valid(Doc::Core, def, &resp["error"], "error object");
    }
    match code {
        -32021 => {
            assert_valid(
                Doc::Core,
                "MissingRequiredClientCapabilityError",
                resp,
                "-32021 response",
            );
            assert!(
                resp["error"]["data"]["requiredCapabilities"].is_object(),
                "requiredCapabilities is a ClientCapabilities object: {resp}"
            );
            assert_valid(
                Doc::Core,
                "ClientCapabilities",
                &resp["error"]["data"]["requiredCapabilities"],
                "requiredCapabilities",
            );
        }
        -32022 => assert_valid(
            Doc::Core,
            "UnsupportedProtocolVersionError",
            resp,
            "-32022 response",
        ),
        _ => {}
    }
}

/// No legacy key anywhere inside a task object.
#[track_caller]
fn assert_no_forbidden_keys(v: &Value, path: &str) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                assert!(
                    !FORBIDDEN_TASK_KEYS.contains(&k.as_str()),
                    "forbidden key `{k}` at `{path}`"
                );
                assert_no_forbidden_keys(child, &format!("{path}/{k}"));
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                assert_no_forbidden_keys(child, &format!("{path}/{i}"));
            }
        }
        _ => {}
    }
}

/// The flat `Task` fields every task object has.
#[track_caller]
fn check_task_fields(task: &Value) {
    assert_no_forbidden_keys(task, "");
    assert_valid(Doc::Tasks, "Task", task, "task object");
    let id = task["taskId"].as_str().expect("taskId is a string");
    assert!(
        id.starts_with("tsk_") && id.len() == 36,
        "unexpected task id shape {id}"
    );
    for key in ["createdAt", "lastUpdatedAt"] {
        let ts = task[key]
            .as_str()
            .unwrap_or_else(|| panic!("{key}: {task}"));
        time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339)
            .unwrap_or_else(|e| panic!("{key} {ts:?} is not RFC 3339: {e}"));
    }
    match &task["ttlMs"] {
        Value::Null => {}
        v => assert!(
            v.as_u64().is_some_and(|t| t > 0),
            "ttlMs is null or positive: {task}"
        ),
    }
    if let Some(p) = task.get("pollIntervalMs") {
        assert!(
            p.as_u64().is_some_and(|p| p > 0),
            "pollIntervalMs is positive: {task}"
        );
    }
}

#[track_caller]
fn check_create_task_response(resp: &Value, id: u64) {
    check_result_response(resp, id);
    let result = &resp["result"];
    assert_valid(Doc::Tasks, "CreateTaskResult", result, "CreateTaskResult");
    assert_eq!(result["resultType"], "task", "{resp}");
    check_task_fields(result);
    for key in ["result", "error", "inputRequests"] {
        assert!(
            result.get(key).is_none(),
            "CreateTaskResult carries `{key}`: {resp}"
        );
    }
}

#[track_caller]
fn check_get_task_response(resp: &Value, id: u64, status: &str) {
    check_result_response(resp, id);
    let result = &resp["result"];
    assert_valid(Doc::Tasks, "GetTaskResult", result, "GetTaskResult");
    assert_valid(Doc::Tasks, "DetailedTask", result, "DetailedTask");
    assert_eq!(result["resultType"], "complete", "{resp}");
    assert_eq!(result["status"], status, "{resp}");
    check_task_fields(result);
    let variant = match status {
        "working" => "WorkingTask",
        "input_required" => "InputRequiredTask",
        "completed" => "CompletedTask",
        "failed" => "FailedTask",
        "cancelled" => "CancelledTask",
        other => panic!("unknown status {other}"),
    };
    assert_valid(Doc::Tasks, variant, result, variant);
    let has = |k: &str| result.get(k).is_some();
    assert_eq!(has("inputRequests"), status == "input_required", "{resp}");
    assert_eq!(has("result"), status == "completed", "{resp}");
    assert_eq!(has("error"), status == "failed", "{resp}");
    match status {
        "input_required" => {
            let requests = result["inputRequests"].as_object().expect("an object");
            assert!(!requests.is_empty(), "{resp}");
            assert_valid(
                Doc::Core,
                "InputRequests",
                &result["inputRequests"],
                "inputRequests",
            );
            assert_valid(
                Doc::Tasks,
                "InputRequests",
                &result["inputRequests"],
                "inputRequests",
            );
        }
        "completed" => {
            let inner = &result["result"];
            assert_valid(
                Doc::Core,
                "CallToolResult",
                inner,
                "nested completed result",
            );
            assert!(
                inner["_meta"].get(KEY_RELATED_TASK).is_none(),
                "no related-task _meta on an inlined result: {resp}"
            );
        }
        "failed" => assert_valid(Doc::Tasks, "Error", &result["error"], "task error"),
        _ => {}
    }
}

/// The empty acknowledgement of `tasks/update` / `tasks/cancel`.
#[track_caller]
fn check_ack_response(resp: &Value, id: u64, def: &str) {
    check_result_response(resp, id);
    let result = &resp["result"];
    assert_valid(Doc::Tasks, def, result, def);
    assert_valid(Doc::Core, "EmptyResult", result, def);
    assert_eq!(result["resultType"], "complete", "{resp}");
    for key in [
        "taskId",
        "status",
        "result",
        "error",
        "inputRequests",
        "createdAt",
    ] {
        assert!(result.get(key).is_none(), "{def} carries `{key}`: {resp}");
    }
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discover_list_and_synchronous_calls() {
    let h = Harness::start().await;
    let mut goldens = Goldens::default();

    let discover = h.request(1, "server/discover", json!({}), true).await;
    check_result_response(&discover, 1);
    assert_valid(
        Doc::Core,
        "DiscoverResultResponse",
        &discover,
        "discover response",
    );
    assert_valid(
        Doc::Core,
        "DiscoverResult",
        &discover["result"],
        "DiscoverResult",
    );
    let result = &discover["result"];
    assert_eq!(result["resultType"], "complete");
    assert_eq!(result["capabilities"]["extensions"][TASKS_EXT], json!({}));
    assert!(
        result["capabilities"].get("tasks").is_none(),
        "no v1 `capabilities.tasks`"
    );
    assert!(
        result.get("serverInfo").is_none(),
        "serverInfo lives in _meta"
    );
    goldens.check("discover_result", &discover);

    let list = h.request(2, "tools/list", json!({}), true).await;
    check_result_response(&list, 2);
    assert_valid(
        Doc::Core,
        "ListToolsResultResponse",
        &list,
        "tools/list response",
    );
    assert_valid(
        Doc::Core,
        "ListToolsResult",
        &list["result"],
        "ListToolsResult",
    );
    for tool in list["result"]["tools"].as_array().unwrap() {
        assert_valid(Doc::Core, "Tool", tool, "tool");
        assert!(
            tool.get("execution").is_none(),
            "no legacy execution: {tool}"
        );
    }
    goldens.check("tools_list_result", &list);

    // A `TaskPolicy::Never` tool answers synchronously even when the client declares tasks.
    let sync = h.call(3, "greet", json!({ "name": "Ada" })).await;
    check_result_response(&sync, 3);
    assert_valid(
        Doc::Core,
        "CallToolResultResponse",
        &sync,
        "tools/call response",
    );
    assert_valid(
        Doc::Core,
        "CallToolResult",
        &sync["result"],
        "CallToolResult",
    );
    assert_eq!(sync["result"]["resultType"], "complete");
    assert_eq!(sync["result"]["content"][0]["text"], "Hello, Ada!");
    assert!(sync["result"].get("taskId").is_none());
    goldens.check("tools_call_sync_result", &sync);

    let is_error = h.call(4, "lookup", json!({ "key": "nope" })).await;
    check_result_response(&is_error, 4);
    assert_valid(
        Doc::Core,
        "CallToolResultResponse",
        &is_error,
        "tools/call response",
    );
    assert_valid(
        Doc::Core,
        "CallToolResult",
        &is_error["result"],
        "CallToolResult",
    );
    assert_eq!(is_error["result"]["isError"], true);
    goldens.check("tools_call_sync_is_error_result", &is_error);

    // Without the extension declared the synchronous answer is the same shape.
    let plain = h
        .request(
            5,
            "tools/call",
            json!({ "name": "greet", "arguments": { "name": "Ada" } }),
            false,
        )
        .await;
    check_result_response(&plain, 5);
    assert_valid(
        Doc::Core,
        "CallToolResult",
        &plain["result"],
        "CallToolResult",
    );

    h.runtime.shutdown().await;
    goldens.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_responses() {
    let h = Harness::start().await;
    let mut goldens = Goldens::default();

    // -32700: the id cannot be read, so there is none.
    let parse = h.send_bytes(br#"{"jsonrpc":"2.0","id":1,"method":"#).await;
    check_error_response(&parse, None, -32700);
    goldens.check("error_parse", &parse);

    // -32600: a malformed envelope with a readable id, and a batch (no id).
    let invalid = h
        .send_json(json!({ "jsonrpc": "1.0", "id": 10, "method": "tools/list", "params": {} }))
        .await;
    check_error_response(&invalid, Some(json!(10)), -32600);
    goldens.check("error_invalid_request", &invalid);
    let batch = h.send_json(json!([])).await;
    check_error_response(&batch, None, -32600);
    goldens.check("error_invalid_request_batch", &batch);

    // -32601: a method removed from 2026-07-28.
    let not_found = h
        .request(
            11,
            "tasks/result",
            json!({ "taskId": UNKNOWN_TASK_ID }),
            true,
        )
        .await;
    check_error_response(&not_found, Some(json!(11)), -32601);
    goldens.check("error_method_not_found", &not_found);
    let unknown = h.request(12, "unknown/method", json!({}), true).await;
    check_error_response(&unknown, Some(json!(12)), -32601);

    // -32602: missing `_meta`, unknown task, unknown tool.
    let missing_meta = h
        .send_json(
            json!({ "jsonrpc": "2.0", "id": "m-1", "method": "server/discover", "params": {} }),
        )
        .await;
    check_error_response(&missing_meta, Some(json!("m-1")), -32602);
    goldens.check("error_invalid_params_missing_meta", &missing_meta);

    let unknown_task = h.get(13, UNKNOWN_TASK_ID).await;
    check_error_response(&unknown_task, Some(json!(13)), -32602);
    goldens.check("error_invalid_params_unknown_task", &unknown_task);
    for (id, method, params) in [
        (14, "tasks/cancel", json!({ "taskId": UNKNOWN_TASK_ID })),
        (
            15,
            "tasks/update",
            json!({ "taskId": UNKNOWN_TASK_ID, "inputResponses": {} }),
        ),
        (16, "tasks/get", json!({ "taskId": "gate-test" })),
    ] {
        let resp = h.request(id, method, params, true).await;
        check_error_response(&resp, Some(json!(id)), -32602);
    }

    let unknown_tool = h.call(17, "no_such_tool", json!({})).await;
    check_error_response(&unknown_tool, Some(json!(17)), -32602);
    goldens.check("error_invalid_params_unknown_tool", &unknown_tool);

    // -32021: tasks/* and a task-only tool without the extension declared.
    let gated = h
        .request(18, "tasks/get", json!({ "taskId": "gate-test" }), false)
        .await;
    check_error_response(&gated, Some(json!(18)), -32021);
    assert_eq!(
        gated["error"]["data"]["requiredCapabilities"],
        json!({ "extensions": { TASKS_EXT: {} } })
    );
    goldens.check("error_missing_capability_tasks_get", &gated);
    for (id, method) in [(19, "tasks/update"), (20, "tasks/cancel")] {
        let resp = h
            .request(
                id,
                method,
                json!({ "taskId": "gate-test", "inputResponses": {} }),
                false,
            )
            .await;
        check_error_response(&resp, Some(json!(id)), -32021);
    }
    let required = h
        .request(
            21,
            "tools/call",
            json!({ "name": "generate_report", "arguments": { "size": "small" } }),
            false,
        )
        .await;
    check_error_response(&required, Some(json!(21)), -32021);
    assert_eq!(
        required["error"]["data"]["requiredCapabilities"]["extensions"][TASKS_EXT],
        json!({})
    );
    goldens.check("error_missing_capability_tools_call", &required);

    // -32022: an unsupported protocol version.
    let mut meta = client_meta(true);
    meta[KEY_PROTOCOL_VERSION] = json!("v999.0.0");
    let version = h
        .send_json(json!({
            "jsonrpc": "2.0", "id": 22, "method": "server/discover", "params": { "_meta": meta }
        }))
        .await;
    check_error_response(&version, Some(json!(22)), -32022);
    assert_eq!(version["error"]["data"]["requested"], "v999.0.0");
    let discover = h.request(23, "server/discover", json!({}), true).await;
    let supported = discover["result"]["supportedVersions"].as_array().unwrap();
    for v in version["error"]["data"]["supported"].as_array().unwrap() {
        assert!(
            supported.contains(v),
            "{v} is not advertised by server/discover"
        );
    }
    goldens.check("error_unsupported_protocol_version", &version);

    // Notifications never get a response.
    let notification =
        json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": {} });
    assert_eq!(h.runtime.handle_json(notification, &h.owner).await, None);

    h.runtime.shutdown().await;
    goldens.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_working_then_cancelled() {
    let h = Harness::start().await;
    let mut goldens = Goldens::default();

    let (created, task) = h.create_task(30, "wait_for_signal", json!({})).await;
    assert_eq!(created["result"]["status"], "working");
    goldens.check("tools_call_create_task_result", &created);

    // Durable before return: an immediate tasks/get resolves, and the tool holds it working.
    let working = h.get(31, &task).await;
    check_get_task_response(&working, 31, "working");
    assert_eq!(working["result"]["taskId"], json!(task));
    goldens.check("tasks_get_working", &working);

    let ack = h
        .request(32, "tasks/cancel", json!({ "taskId": task }), true)
        .await;
    check_ack_response(&ack, 32, "CancelTaskResult");
    goldens.check("tasks_cancel_result", &ack);

    let cancelled = h.poll_until(33, &task, "cancelled").await;
    goldens.check("tasks_get_cancelled", &cancelled);

    // Cancelling a terminal task acknowledges the same way.
    let again = h
        .request(34, "tasks/cancel", json!({ "taskId": task }), true)
        .await;
    check_ack_response(&again, 34, "CancelTaskResult");
    assert_eq!(again["result"], ack["result"]);

    h.runtime.shutdown().await;
    goldens.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_released_by_signal_completes() {
    let signal = Arc::new(Notify::new());
    let h = Harness::start_with_signal(signal.clone()).await;

    let (_, task) = h.create_task(40, "wait_for_signal", json!({})).await;
    let working = h.get(41, &task).await;
    check_get_task_response(&working, 41, "working");
    signal.notify_one();
    let done = h.poll_until(42, &task, "completed").await;
    assert_eq!(
        done["result"]["result"]["content"][0]["text"],
        "Signal received."
    );
    assert_eq!(done["result"]["result"]["isError"], false);

    h.runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_input_required_update_completed() {
    let h = Harness::start().await;
    let mut goldens = Goldens::default();

    let (_, task) = h
        .create_task(50, "generate_report", json!({ "size": "small" }))
        .await;

    let input = h.poll_until(51, &task, "input_required").await;
    let request = &input["result"]["inputRequests"][mcp_tasks_testkit::demo::APPROVE_OUTLINE];
    assert_eq!(request["method"], "elicitation/create", "{input}");
    assert_valid(Doc::Tasks, "InputRequest", request, "input request");
    assert_valid(Doc::Core, "ElicitRequest", request, "input request");
    goldens.check("tasks_get_input_required", &input);

    let update = h
        .request(
            52,
            "tasks/update",
            json!({
                "taskId": task,
                "inputResponses": {
                    mcp_tasks_testkit::demo::APPROVE_OUTLINE: { "action": "accept", "content": { "approved": true } }
                }
            }),
            true,
        )
        .await;
    check_ack_response(&update, 52, "UpdateTaskResult");
    goldens.check("tasks_update_result", &update);

    let completed = h.poll_until(53, &task, "completed").await;
    let inner = &completed["result"]["result"];
    assert_eq!(inner["isError"], false, "{completed}");
    assert_eq!(
        inner["structuredContent"],
        json!({ "size": "small", "approved": true })
    );
    goldens.check("tasks_get_completed", &completed);

    // Late answers (unknown keys) to a finished task are acknowledged and ignored.
    let late = h
        .request(
            54,
            "tasks/update",
            json!({ "taskId": task, "inputResponses": { "unknown-key": { "ignored": true } } }),
            true,
        )
        .await;
    check_ack_response(&late, 54, "UpdateTaskResult");
    assert_eq!(late["result"], update["result"]);

    h.runtime.shutdown().await;
    goldens.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_completed_with_tool_error() {
    let h = Harness::start().await;
    let mut goldens = Goldens::default();

    let (_, task) = h
        .create_task(60, "confirm_delete", json!({ "filename": "notes.txt" }))
        .await;
    let input = h.poll_until(61, &task, "input_required").await;
    assert_eq!(
        input["result"]["inputRequests"]["confirm"]["method"],
        "elicitation/create"
    );
    let update = h
        .request(
            62,
            "tasks/update",
            json!({ "taskId": task, "inputResponses": { "confirm": { "action": "decline" } } }),
            true,
        )
        .await;
    check_ack_response(&update, 62, "UpdateTaskResult");

    // A tool-level error is a completed task whose result has isError: true.
    let completed = h.poll_until(63, &task, "completed").await;
    assert_eq!(
        completed["result"]["result"]["isError"], true,
        "{completed}"
    );
    goldens.check("tasks_get_completed_is_error", &completed);

    h.runtime.shutdown().await;
    goldens.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_failed_with_protocol_error() {
    let h = Harness::start().await;
    let mut goldens = Goldens::default();

    let (_, task) = h.create_task(70, "protocol_error_job", json!({})).await;
    let failed = h.poll_until(71, &task, "failed").await;
    assert_eq!(
        failed["result"]["error"],
        json!({ "code": -32603, "message": "The backend rejected the job." })
    );
    goldens.check("tasks_get_failed", &failed);

    h.runtime.shutdown().await;
    goldens.finish();
}

/// Negative controls: the validators built here do reject wrong messages, so the positive
/// checks above mean something.
#[test]
fn schema_validators_reject_invalid_messages() {
    let meta = json!({ KEY_SERVER_INFO: { "name": "s", "version": "1" } });
    let create = json!({
        "resultType": "task",
        "taskId": "tsk_0123456789abcdef0123456789abcdef",
        "status": "working",
        "createdAt": "2026-07-28T10:00:00Z",
        "lastUpdatedAt": "2026-07-28T10:00:00Z",
        "ttlMs": 60000,
        "pollIntervalMs": 1000,
        "_meta": meta
    });
    assert_valid(
        Doc::Tasks,
        "CreateTaskResult",
        &create,
        "a good CreateTaskResult",
    );

    let mut no_id = create.clone();
    no_id.as_object_mut().unwrap().remove("taskId");
    assert_invalid(
        Doc::Tasks,
        "CreateTaskResult",
        &no_id,
        "CreateTaskResult without taskId",
    );
    let mut no_ttl = create.clone();
    no_ttl.as_object_mut().unwrap().remove("ttlMs");
    assert_invalid(
        Doc::Tasks,
        "CreateTaskResult",
        &no_ttl,
        "CreateTaskResult without ttlMs",
    );
    let mut complete = create.clone();
    complete["resultType"] = json!("complete");
    assert_invalid(
        Doc::Tasks,
        "CreateTaskResult",
        &complete,
        "CreateTaskResult with resultType complete",
    );
    let mut bad_status = create.clone();
    bad_status["status"] = json!("running");
    assert_invalid(
        Doc::Tasks,
        "CreateTaskResult",
        &bad_status,
        "CreateTaskResult with an unknown status",
    );

    let mut get = create.clone();
    get["resultType"] = json!("complete");
    assert_valid(
        Doc::Tasks,
        "GetTaskResult",
        &get,
        "a good working GetTaskResult",
    );
    get["status"] = json!("completed");
    assert_invalid(
        Doc::Tasks,
        "GetTaskResult",
        &get,
        "completed GetTaskResult without result",
    );
    get["status"] = json!("failed");
    assert_invalid(
        Doc::Tasks,
        "GetTaskResult",
        &get,
        "failed GetTaskResult without error",
    );
    get["status"] = json!("input_required");
    assert_invalid(
        Doc::Tasks,
        "GetTaskResult",
        &get,
        "input_required GetTaskResult without inputRequests",
    );
    let mut task_typed = create.clone();
    task_typed["status"] = json!("working");
    assert_invalid(
        Doc::Tasks,
        "GetTaskResult",
        &task_typed,
        "GetTaskResult with resultType task",
    );

    assert_invalid(
        Doc::Tasks,
        "UpdateTaskResult",
        &json!({ "resultType": "task" }),
        "ack with resultType task",
    );
    assert_invalid(
        Doc::Tasks,
        "CancelTaskResult",
        &json!({}),
        "ack without resultType",
    );
    assert_invalid(
        Doc::Core,
        "CallToolResult",
        &json!({ "resultType": "complete" }),
        "CallToolResult without content",
    );
    assert_invalid(
        Doc::Core,
        "CallToolResult",
        &json!({ "resultType": "complete", "content": [], "_meta": { KEY_SERVER_INFO: { "name": "s" } } }),
        "CallToolResult with a serverInfo lacking version",
    );
    assert_invalid(
        Doc::Core,
        "JSONRPCErrorResponse",
        &json!({ "jsonrpc": "2.0", "id": null, "error": { "code": -32700, "message": "x" } }),
        "error response with a null id",
    );
    assert_invalid(
        Doc::Core,
        "MissingRequiredClientCapabilityError",
        &json!({
            "jsonrpc": "2.0", "id": 1,
            "error": { "code": -32021, "message": "x", "data": { "requiredCapabilities": ["tasks"] } }
        }),
        "-32021 with an array of capabilities",
    );
    assert_invalid(
        Doc::Core,
        "UnsupportedProtocolVersionError",
        &json!({
            "jsonrpc": "2.0", "id": 1,
            "error": { "code": -32022, "message": "x", "data": { "supported": ["2026-07-28"] } }
        }),
        "-32022 without data.requested",
    );
    assert_invalid(
        Doc::Core,
        "DiscoverResult",
        &json!({ "resultType": "complete", "supportedVersions": [], "capabilities": {} }),
        "DiscoverResult without cache hints",
    );
}

/// Every file in `crates/mcp-tasks-cli/tests/data/wire/` belongs to a message checked above (no stale goldens).
#[test]
fn no_stale_goldens() {
    let dir = data_dir().join("wire");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    let known: BTreeSet<String> = ALL_GOLDENS.iter().map(|n| format!("{n}.json")).collect();
    let stale: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".json") && !known.contains(name))
        .collect();
    assert!(
        stale.is_empty(),
        "stale golden files in {}: {stale:?} (remove them or add them to ALL_GOLDENS)",
        dir.display()
    );
}

// ---------------------------------------------------------------------------------------------
// Core MRTR, subscriptions, prompts and resources
// ---------------------------------------------------------------------------------------------

fn ask_name() -> Arc<dyn mcp_tasks::tool::Tool> {
    tool_fn(
        ToolDescriptor::new("ask_name", "Asks for a name, then greets.")
            .task_policy(TaskPolicy::Never),
        |ctx, _| async move {
            let answer = ctx
                .input(
                    "user_name",
                    InputRequest::elicit_form(
                        "What is your name?",
                        json!({ "type": "object", "properties": { "name": { "type": "string" } }, "required": ["name"] }),
                    ),
                )
                .await?;
            let name = answer["content"]["name"].as_str().unwrap_or("?").to_owned();
            Ok(CallToolResult::text(format!("Hello, {name}!")))
        },
    )
}

fn request_with(id: u64, method: &str, mut params: Value, caps: Value) -> Value {
    params["_meta"] = json!({
        KEY_PROTOCOL_VERSION: PROTOCOL_VERSION,
        KEY_CLIENT_CAPABILITIES: caps,
        KEY_CLIENT_INFO: { "name": "wire-golden-client", "version": "1.0.0" }
    });
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mrtr_subscriptions_prompts_and_resources() {
    use mcp_tasks::catalog::{
        GetPromptResult, PromptDescriptor, Resource, ResourceTemplate, prompt_fn,
    };

    let dir = tempfile::tempdir().expect("tempdir");
    let prompt = prompt_fn(
        PromptDescriptor::new("summarize", "Summarizes with the user's context."),
        |ctx, _| async move {
            let answer = ctx
                .input(
                    "user_context",
                    InputRequest::elicit_form(
                        "What context should the prompt use?",
                        json!({ "type": "object", "properties": { "context": { "type": "string" } } }),
                    ),
                )
                .await?;
            let context = answer["content"]["context"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            Ok(GetPromptResult::user_text(format!(
                "Summarize with context: {context}"
            )))
        },
    );
    let runtime = Runtime::builder(dir.path().join("tasks.redb"))
        .server_info(SERVER_NAME, SERVER_VERSION)
        .tool(ask_name())
        .tool(generate_report(Duration::from_millis(10)))
        .prompt(prompt)
        .resource(Resource::text(
            "test://static-text",
            "static-text",
            "Static text.",
        ))
        .resource_template(
            ResourceTemplate::new("test://items/{id}", "item")
                .description("One item by id.")
                .mime_type("text/plain"),
        )
        .start()
        .await
        .expect("runtime starts");
    let owner = Owner::anonymous();
    let caps = json!({ "elicitation": {}, "extensions": { TASKS_EXT: {} } });
    let mut goldens = Goldens::default();
    let send = |id: u64, method: &'static str, params: Value| {
        let msg = request_with(id, method, params, caps.clone());
        let runtime = &runtime;
        let owner = &owner;
        async move { runtime.handle_json(msg, owner).await.expect("a response") }
    };

    // Core MRTR on tools/call: input_required, then the answer.
    let r = send(
        1,
        "tools/call",
        json!({ "name": "ask_name", "arguments": {} }),
    )
    .await;
    check_result_response(&r, 1);
    assert_valid(
        Doc::Core,
        "InputRequiredResult",
        &r["result"],
        "input_required result",
    );
    assert_eq!(r["result"]["resultType"], "input_required");
    goldens.check("tools_call_input_required_result", &r);
    let state = r["result"]["requestState"].clone();
    let r = send(
        2,
        "tools/call",
        json!({ "name": "ask_name", "arguments": {}, "requestState": state,
                "inputResponses": { "user_name": { "action": "accept", "content": { "name": "Ada" } } } }),
    )
    .await;
    check_result_response(&r, 2);
    assert_valid(
        Doc::Core,
        "CallToolResult",
        &r["result"],
        "call result after input",
    );
    goldens.check("tools_call_after_input_result", &r);

    // Prompts.
    let r = send(3, "prompts/list", json!({})).await;
    check_result_response(&r, 3);
    assert_valid(Doc::Core, "ListPromptsResult", &r["result"], "prompts/list");
    goldens.check("prompts_list_result", &r);
    let r = send(4, "prompts/get", json!({ "name": "summarize" })).await;
    check_result_response(&r, 4);
    assert_valid(
        Doc::Core,
        "InputRequiredResult",
        &r["result"],
        "prompts/get input_required",
    );
    goldens.check("prompts_get_input_required_result", &r);
    let state = r["result"]["requestState"].clone();
    let r = send(
        5,
        "prompts/get",
        json!({ "name": "summarize", "requestState": state,
                "inputResponses": { "user_context": { "action": "accept", "content": { "context": "wire" } } } }),
    )
    .await;
    check_result_response(&r, 5);
    assert_valid(Doc::Core, "GetPromptResult", &r["result"], "prompts/get");
    goldens.check("prompts_get_result", &r);

    // Resources.
    for (id, method, def, name) in [
        (
            6,
            "resources/list",
            "ListResourcesResult",
            "resources_list_result",
        ),
        (
            7,
            "resources/templates/list",
            "ListResourceTemplatesResult",
            "resources_templates_list_result",
        ),
    ] {
        let r = send(id, method, json!({})).await;
        check_result_response(&r, id);
        assert_valid(Doc::Core, def, &r["result"], method);
        goldens.check(name, &r);
    }
    let r = send(8, "resources/read", json!({ "uri": "test://static-text" })).await;
    check_result_response(&r, 8);
    assert_valid(
        Doc::Core,
        "ReadResourceResult",
        &r["result"],
        "resources/read",
    );
    goldens.check("resources_read_result", &r);

    // A task and a listen on it: acknowledgement, then notifications/tasks.
    let r = send(
        9,
        "tools/call",
        json!({ "name": "generate_report", "arguments": { "size": "small" } }),
    )
    .await;
    let task = r["result"]["taskId"].as_str().expect("a task").to_owned();
    let listen = request_with(
        10,
        "subscriptions/listen",
        json!({ "notifications": { "taskIds": [task] } }),
        caps.clone(),
    );
    let mcp_tasks::Dispatched::Stream(mut stream) = runtime
        .handle()
        .dispatch_json(listen, &mcp_tasks::RequestContext::new(owner.clone()))
        .await
    else {
        panic!("listen must stream");
    };
    let ack = next_message(&mut stream).await;
    assert_valid(
        Doc::Core,
        "SubscriptionsAcknowledgedNotification",
        &ack,
        "acknowledgement",
    );
    assert_valid(Doc::Core, "JSONRPCMessage", &ack, "acknowledgement");
    goldens.check("subscriptions_acknowledged_notification", &ack);
    let mut last = next_message(&mut stream).await;
    while last["params"]["status"] != "input_required" {
        assert_valid(
            Doc::Tasks,
            "TaskStatusNotification",
            &last,
            "notifications/tasks",
        );
        last = next_message(&mut stream).await;
    }
    assert_valid(
        Doc::Tasks,
        "TaskStatusNotification",
        &last,
        "notifications/tasks",
    );
    assert_valid(Doc::Core, "JSONRPCMessage", &last, "notifications/tasks");
    goldens.check("tasks_status_notification", &last);
    runtime.begin_shutdown();
    let done = next_message(&mut stream).await;
    assert_valid(
        Doc::Core,
        "SubscriptionsListenResultResponse",
        &done,
        "listen result",
    );
    goldens.check("subscriptions_listen_result", &done);
    goldens.finish();
    runtime.shutdown().await;
}

async fn next_message(stream: &mut mcp_tasks::MessageStream) -> Value {
    use futures::StreamExt;
    tokio::time::timeout(POLL_LIMIT, stream.next())
        .await
        .expect("a message in time")
        .expect("the stream is open")
}

/// Completions, binary and templated resources, rich tool and prompt content, the
/// resource-not-found error and a progress notification: goldens validated against the core
/// schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_resources_rich_content_and_progress() {
    use mcp_tasks::catalog::{
        Completion, CompletionRef, GetPromptResult, PromptDescriptor, PromptMessage, Resource,
        ResourceContents, ResourceTemplate, completer_fn, prompt_fn,
    };
    use mcp_tasks::content;
    use mcp_tasks::internals::protocol::{Dispatched, RequestContext};
    use mcp_tasks::tool::TaskPolicy;

    let dir = tempfile::tempdir().expect("tempdir");
    let rich = tool_fn(
        ToolDescriptor::new("rich", "Returns every kind of content.")
            .task_policy(TaskPolicy::Never),
        |ctx, _| async move {
            ctx.progress(1.0, Some(2.0), Some("half way")).await?;
            Ok(CallToolResult::new(vec![
                content::text("text"),
                content::image(b"\x89PNG", "image/png"),
                content::audio(b"RIFF", "audio/wav"),
                content::resource_link("test://linked", "linked"),
                content::embedded(&ResourceContents::blob(
                    "test://embedded",
                    "application/octet-stream",
                    vec![0, 1, 2],
                )),
            ]))
        },
    );
    let prompt = prompt_fn(
        PromptDescriptor::new("trip", "Plans a trip.").argument("city", "Where to.", true),
        |_, args| async move {
            let city = args["city"].as_str().unwrap_or_default().to_owned();
            Ok(GetPromptResult::new(vec![
                PromptMessage::user(content::image(b"\x89PNG", "image/png")),
                PromptMessage::assistant(content::embedded(&ResourceContents::text(
                    "test://guide",
                    "text/plain",
                    format!("A guide to {city}."),
                ))),
            ])
            .description("A trip."))
        },
    );
    let runtime = Runtime::builder(dir.path().join("tasks.redb"))
        .server_info(SERVER_NAME, SERVER_VERSION)
        .tool(rich)
        .prompt(prompt)
        .completion(
            CompletionRef::Prompt("trip".into()),
            completer_fn(|request| async move {
                Ok(Completion::matching(
                    ["paris", "park", "rome"],
                    &request.value,
                ))
            }),
        )
        .resource(Resource::blob(
            "test://blob",
            "blob",
            "application/octet-stream",
            vec![0xde, 0xad, 0xbe, 0xef],
        ))
        .resource_template(ResourceTemplate::new("test://notes/{id}", "note").reader(
            |request| async move {
                Ok(vec![ResourceContents::text(
                    request.uri,
                    "text/plain",
                    format!("Note {}.", request.variables["id"]),
                )])
            },
        ))
        .start()
        .await
        .expect("runtime starts");
    let owner = Owner::anonymous();
    let caps = json!({});
    let mut goldens = Goldens::default();
    let send = |id: u64, method: &'static str, params: Value| {
        let msg = request_with(id, method, params, caps.clone());
        let runtime = &runtime;
        let owner = &owner;
        async move { runtime.handle_json(msg, owner).await.expect("a response") }
    };

    let r = send(
        1,
        "completion/complete",
        json!({ "ref": { "type": "ref/prompt", "name": "trip" },
                "argument": { "name": "city", "value": "pa" } }),
    )
    .await;
    check_result_response(&r, 1);
    assert_valid(
        Doc::Core,
        "CompleteResult",
        &r["result"],
        "completion/complete",
    );
    goldens.check("completion_complete_result", &r);

    let r = send(2, "resources/read", json!({ "uri": "test://blob" })).await;
    check_result_response(&r, 2);
    assert_valid(Doc::Core, "ReadResourceResult", &r["result"], "blob read");
    goldens.check("resources_read_blob_result", &r);

    let r = send(3, "resources/read", json!({ "uri": "test://notes/7" })).await;
    check_result_response(&r, 3);
    assert_valid(
        Doc::Core,
        "ReadResourceResult",
        &r["result"],
        "template read",
    );
    goldens.check("resources_read_template_result", &r);

    let r = send(4, "resources/read", json!({ "uri": "test://nothing" })).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert_eq!(r["error"]["data"]["uri"], "test://nothing", "{r}");
    assert_valid(Doc::Core, "JSONRPCErrorResponse", &r, "resource not found");
    goldens.check("error_resource_not_found", &r);

    let r = send(5, "tools/call", json!({ "name": "rich", "arguments": {} })).await;
    check_result_response(&r, 5);
    assert_valid(Doc::Core, "CallToolResult", &r["result"], "rich content");
    goldens.check("tools_call_rich_content_result", &r);

    let r = send(
        6,
        "prompts/get",
        json!({ "name": "trip", "arguments": { "city": "Rome" } }),
    )
    .await;
    check_result_response(&r, 6);
    assert_valid(Doc::Core, "GetPromptResult", &r["result"], "rich prompt");
    goldens.check("prompts_get_rich_content_result", &r);

    // The progress notification, as a streaming transport receives it before the response.
    let mut msg = request_with(
        7,
        "tools/call",
        json!({ "name": "rich", "arguments": {} }),
        caps.clone(),
    );
    msg["params"]["_meta"]["progressToken"] = json!("p-7");
    let ctx = RequestContext::new(owner.clone()).with_streams(true);
    let Dispatched::Stream(mut stream) = runtime.handle().dispatch_json(msg, &ctx).await else {
        panic!("a call with a progressToken that reports progress streams");
    };
    use futures::StreamExt as _;
    let progress = stream.next().await.expect("a progress notification");
    assert_valid(Doc::Core, "ProgressNotification", &progress, "progress");
    goldens.check("progress_notification", &progress);
    let response = stream.next().await.expect("the response");
    check_result_response(&response, 7);
    assert!(
        stream.next().await.is_none(),
        "the response ends the stream"
    );

    goldens.finish();
    runtime.shutdown().await;
}
