//! Hostile and malformed input, sent as raw bytes through `Runtime::handle_message`.
//!
//! One table of malformed messages. Every row names the JSON-RPC error it must get (or that it
//! must get no response at all), optionally the HTTP status and a substring of the message,
//! and which `id` the error must echo. Around the table: real tasks are created first, and
//! after the table the store counts and every task's `tasks/get` answer must be unchanged.
//! Another owner probing the real task ids must get exactly the unknown-id answer.

use std::time::Duration;

use mcp_tasks::Owner;
use mcp_tasks::tool::{CallToolResult, InputRequest, TaskPolicy, ToolDescriptor, tool_fn};
use mcp_tasks::{Reply, Runtime};
use serde_json::{Map, Value, json};

const TASKS_EXT: &str = "io.modelcontextprotocol/tasks";
const PV: &str = "io.modelcontextprotocol/protocolVersion";
const CAPS: &str = "io.modelcontextprotocol/clientCapabilities";
const INFO: &str = "io.modelcontextprotocol/clientInfo";
const VERSION: &str = "2026-07-28";

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const MISSING_CAPABILITY: i64 = -32021;
const UNSUPPORTED_VERSION: i64 = -32022;

/// A well-formed task id that no task has.
const UNKNOWN_TASK: &str = "tsk_0123456789abcdef0123456789abcdef";

// ---------------------------------------------------------------------------------------------
// Message builders
// ---------------------------------------------------------------------------------------------

/// The per-request `_meta`, with or without the Tasks extension declared.
fn meta(tasks: bool) -> Value {
    let caps = if tasks {
        json!({ "extensions": { TASKS_EXT: {} } })
    } else {
        json!({})
    };
    json!({ PV: VERSION, CAPS: caps, INFO: { "name": "bad-input-test", "version": "1" } })
}

/// `extra` with a valid `_meta` added.
fn with_meta(tasks: bool, extra: Value) -> Value {
    let mut p = extra;
    p["_meta"] = meta(tasks);
    p
}

/// `_meta` built from the given members only.
fn meta_of(members: Value) -> Value {
    json!({ "_meta": members })
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("serializable")
}

fn request(id: &Value, method: &str, params: Value) -> Vec<u8> {
    bytes(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
}

fn notification(method: &str, params: Value) -> Vec<u8> {
    bytes(&json!({ "jsonrpc": "2.0", "method": method, "params": params }))
}

// ---------------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------------

type Check = Box<dyn Fn(&Value) -> Result<(), String> + Send + Sync>;

enum Expect {
    /// An error response with this code.
    Error(i64),
    /// An error response with one of these codes.
    AnyError(&'static [i64]),
    /// Either a successful result or an error with this code (never a panic or no answer).
    OkOr(i64),
    /// No response at all (a notification).
    NoResponse,
}

enum IdRule {
    /// The error response must carry exactly this `id`.
    Echo(Value),
    /// The request id was not readable: the response must have no `id` member.
    Absent,
    /// Not applicable (no response expected).
    None,
}

struct Row {
    name: String,
    bytes: Vec<u8>,
    expect: Expect,
    http: Option<u16>,
    contains: Option<String>,
    id: IdRule,
    /// Extra checks on the `error` object.
    check: Option<Check>,
}

impl Row {
    /// An error row whose id cannot be read (or that has none).
    fn err(name: impl Into<String>, bytes: Vec<u8>, code: i64) -> Self {
        Self {
            name: name.into(),
            bytes,
            expect: Expect::Error(code),
            http: None,
            contains: None,
            id: IdRule::Absent,
            check: None,
        }
    }

    /// A request row: an error that must echo `id`.
    fn req(name: impl Into<String>, id: Value, method: &str, params: Value, code: i64) -> Self {
        let bytes = request(&id, method, params);
        Self {
            id: IdRule::Echo(id),
            ..Self::err(name, bytes, code)
        }
    }

    /// A message that must get no response.
    fn silent(name: impl Into<String>, bytes: Vec<u8>) -> Self {
        Self {
            expect: Expect::NoResponse,
            id: IdRule::None,
            ..Self::err(name, bytes, 0)
        }
    }

    fn id(mut self, id: Value) -> Self {
        self.id = IdRule::Echo(id);
        self
    }

    fn expect(mut self, expect: Expect) -> Self {
        self.expect = expect;
        self
    }

    fn http(mut self, status: u16) -> Self {
        self.http = Some(status);
        self
    }

    fn contains(mut self, text: impl Into<String>) -> Self {
        self.contains = Some(text.into());
        self
    }

    fn check(mut self, f: impl Fn(&Value) -> Result<(), String> + Send + Sync + 'static) -> Self {
        self.check = Some(Box::new(f));
        self
    }
}

/// The HTTP status every error code maps to (base protocol error codes; Streamable HTTP, SEP-2243).
fn default_http(code: i64) -> u16 {
    match code {
        METHOD_NOT_FOUND => 404,
        PARSE_ERROR | INVALID_REQUEST | INVALID_PARAMS | MISSING_CAPABILITY
        | UNSUPPORTED_VERSION | -32020 => 400,
        _ => 500,
    }
}

fn tasks_capability_data(error: &Value) -> Result<(), String> {
    let required = &error["data"]["requiredCapabilities"];
    if !required.is_object() {
        return Err(format!(
            "data.requiredCapabilities must be an object: {error}"
        ));
    }
    let ext = &required["extensions"][TASKS_EXT];
    if ext != &json!({}) {
        return Err(format!(
            "data.requiredCapabilities.extensions[{TASKS_EXT}] must be {{}}: {error}"
        ));
    }
    Ok(())
}

fn unsupported_version_data(requested: &'static str) -> impl Fn(&Value) -> Result<(), String> {
    move |error: &Value| {
        let data = &error["data"];
        let supported = data["supported"]
            .as_array()
            .ok_or_else(|| format!("data.supported must be an array: {error}"))?;
        if supported.is_empty() || !supported.iter().all(Value::is_string) {
            return Err(format!(
                "data.supported must be a non-empty array of strings: {error}"
            ));
        }
        if !supported.contains(&json!(VERSION)) {
            return Err(format!("data.supported must list {VERSION}: {error}"));
        }
        if data["requested"] != json!(requested) {
            return Err(format!("data.requested must echo {requested:?}: {error}"));
        }
        Ok(())
    }
}

/// `depth` nested arrays around `inner`, as raw JSON text.
fn nested_arrays(depth: usize, inner: &str) -> String {
    let mut s = String::with_capacity(depth * 2 + inner.len());
    s.push_str(&"[".repeat(depth));
    s.push_str(inner);
    s.push_str(&"]".repeat(depth));
    s
}

struct Ids {
    /// An `input_required` task of `count_slowly`.
    waiting: String,
    /// A `working` task of `generate_report`.
    working: String,
    /// A `completed` task of `instant`.
    completed: String,
}

fn table(ids: &Ids) -> Vec<Row> {
    let mut rows = Vec::new();
    let ok_call = with_meta(
        false,
        json!({ "name": "echo", "arguments": { "text": "hi" } }),
    );
    let list = with_meta(false, json!({}));

    // --- JSON parse errors (-32700): the id is never readable. -------------------------------
    rows.push(
        Row::err(
            "invalid JSON",
            br#"{jsonrpc: "2.0", id: 1}"#.to_vec(),
            PARSE_ERROR,
        )
        .http(400),
    );
    let whole = request(&json!(1), "tools/list", list.clone());
    rows.push(Row::err(
        "truncated JSON",
        whole[..whole.len() / 2].to_vec(),
        PARSE_ERROR,
    ));
    rows.push(Row::err(
        "truncated by one byte",
        whole[..whole.len() - 1].to_vec(),
        PARSE_ERROR,
    ));
    rows.push(Row::err("empty body", Vec::new(), PARSE_ERROR).http(400));
    rows.push(Row::err(
        "whitespace only",
        b" \r\n\t ".to_vec(),
        PARSE_ERROR,
    ));
    rows.push(Row::err(
        "non-UTF-8 bytes",
        b"\xff\xfe\xfd\x00\x80".to_vec(),
        PARSE_ERROR,
    ));
    rows.push(Row::err(
        "invalid UTF-8 inside a string",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/\xc3\x28list\"}".to_vec(),
        PARSE_ERROR,
    ));
    rows.push(Row::err(
        "lone surrogate escape",
        br#"{"jsonrpc":"2.0","id":1,"method":"\ud800"}"#.to_vec(),
        PARSE_ERROR,
    ));
    rows.push(Row::err(
        "UTF-8 byte order mark",
        [b"\xef\xbb\xbf".as_slice(), &whole].concat(),
        PARSE_ERROR,
    ));
    rows.push(Row::err(
        "trailing garbage",
        [whole.as_slice(), b" x"].concat(),
        PARSE_ERROR,
    ));
    rows.push(Row::err(
        "two concatenated messages",
        [whole.clone(), whole.clone()].concat(),
        PARSE_ERROR,
    ));
    rows.push(Row::err(
        "NaN literal",
        br#"{"jsonrpc":"2.0","id":NaN,"method":"x"}"#.to_vec(),
        PARSE_ERROR,
    ));

    // --- Not a single request object (-32600). --------------------------------------------------
    rows.push(Row::err("JSON number", b"42".to_vec(), INVALID_REQUEST).http(400));
    rows.push(Row::err(
        "JSON string",
        br#""tools/list""#.to_vec(),
        INVALID_REQUEST,
    ));
    rows.push(Row::err("JSON null", b"null".to_vec(), INVALID_REQUEST));
    rows.push(Row::err("JSON boolean", b"true".to_vec(), INVALID_REQUEST));
    rows.push(
        Row::err(
            "batch of two requests",
            bytes(&json!([
                { "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": list.clone() },
                { "jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": list.clone() }
            ])),
            INVALID_REQUEST,
        )
        .contains("batch"),
    );
    rows.push(Row::err("empty batch", b"[]".to_vec(), INVALID_REQUEST));

    // --- Envelope (-32600): the id is echoed when it could be read. ---------------------------
    rows.push(
        Row::err(
            "wrong jsonrpc version",
            bytes(&json!({ "jsonrpc": "1.0", "id": 7, "method": "tools/list", "params": list })),
            INVALID_REQUEST,
        )
        .id(json!(7))
        .contains("jsonrpc"),
    );
    rows.push(
        Row::err(
            "jsonrpc as a number",
            bytes(&json!({ "jsonrpc": 2.0, "id": "s-1", "method": "tools/list", "params": list })),
            INVALID_REQUEST,
        )
        .id(json!("s-1")),
    );
    rows.push(
        Row::err(
            "missing jsonrpc",
            bytes(&json!({ "id": 8, "method": "tools/list", "params": list })),
            INVALID_REQUEST,
        )
        .id(json!(8))
        .contains("jsonrpc"),
    );
    for (name, id) in [
        ("null id", json!(null)),
        ("float id", json!(1.5)),
        ("boolean id", json!(true)),
        ("object id", json!({ "n": 1 })),
        ("array id", json!([1])),
        ("over-long string id", json!("i".repeat(257))),
        ("integer id beyond u64", json!(1e20)),
    ] {
        let msg =
            bytes(&json!({ "jsonrpc": "2.0", "id": id, "method": "tools/list", "params": list }));
        rows.push(Row::err(name, msg, INVALID_REQUEST).contains("`id`"));
    }
    rows.push(Row::err(
        "float id written as 1.0",
        br#"{"jsonrpc":"2.0","id":1.0,"method":"tools/list","params":{}}"#.to_vec(),
        INVALID_REQUEST,
    ));
    rows.push(
        Row::err(
            "method not a string",
            bytes(&json!({ "jsonrpc": "2.0", "id": 9, "method": 42, "params": list })),
            INVALID_REQUEST,
        )
        .id(json!(9))
        .contains("`method`"),
    );
    rows.push(
        Row::err(
            "method null",
            bytes(&json!({ "jsonrpc": "2.0", "id": 10, "method": null, "params": list })),
            INVALID_REQUEST,
        )
        .id(json!(10)),
    );
    rows.push(
        Row::err(
            "method missing",
            bytes(&json!({ "jsonrpc": "2.0", "id": 11, "params": list })),
            INVALID_REQUEST,
        )
        .id(json!(11))
        .contains("`method`"),
    );
    rows.push(
        Row::err(
            "method empty",
            bytes(&json!({ "jsonrpc": "2.0", "id": 12, "method": "", "params": list })),
            INVALID_REQUEST,
        )
        .id(json!(12)),
    );
    rows.push(
        Row::err(
            "method over-long",
            bytes(&json!({ "jsonrpc": "2.0", "id": 13, "method": "m".repeat(10_000), "params": list })),
            INVALID_REQUEST,
        )
        .id(json!(13))
        .contains("longer"),
    );
    rows.push(
        Row::err(
            "a response sent by the client",
            bytes(&json!({ "jsonrpc": "2.0", "id": 14, "result": { "resultType": "complete" } })),
            INVALID_REQUEST,
        )
        .id(json!(14))
        .contains("responses"),
    );
    for (name, params) in [
        ("params an array", json!([list.clone()])),
        ("params a string", json!("params")),
        ("params null", json!(null)),
    ] {
        rows.push(
            Row::err(
                name,
                bytes(&json!({ "jsonrpc": "2.0", "id": -3, "method": "tools/list", "params": params })),
                INVALID_REQUEST,
            )
            .id(json!(-3))
            .contains("`params`"),
        );
    }

    // --- Required `_meta` (-32602, HTTP 400). -------------------------------------------------
    rows.push(
        Row::err(
            "missing params",
            bytes(&json!({ "jsonrpc": "2.0", "id": 0, "method": "tools/list" })),
            INVALID_PARAMS,
        )
        .id(json!(0))
        .http(400)
        .contains("_meta"),
    );
    rows.push(
        Row::req(
            "missing _meta",
            json!(u64::MAX),
            "tools/list",
            json!({}),
            INVALID_PARAMS,
        )
        .http(400)
        .contains("_meta"),
    );
    rows.push(
        Row::req(
            "_meta a string",
            json!(15),
            "tools/list",
            meta_of(json!("meta")),
            INVALID_PARAMS,
        )
        .http(400),
    );
    rows.push(
        Row::req(
            "_meta null",
            json!(16),
            "tools/list",
            meta_of(json!(null)),
            INVALID_PARAMS,
        )
        .http(400),
    );
    rows.push(Row::req(
        "_meta an array",
        json!(17),
        "tools/list",
        meta_of(json!([meta(true)])),
        INVALID_PARAMS,
    ));
    rows.push(
        Row::req(
            "missing protocolVersion",
            json!(18),
            "tools/list",
            meta_of(json!({ CAPS: {} })),
            INVALID_PARAMS,
        )
        .http(400)
        .contains("protocolVersion"),
    );
    rows.push(
        Row::req(
            "protocolVersion a number",
            json!(19),
            "tools/list",
            meta_of(json!({ PV: 20260728, CAPS: {} })),
            INVALID_PARAMS,
        )
        .http(400)
        .contains("protocolVersion"),
    );
    rows.push(Row::req(
        "protocolVersion null",
        json!(20),
        "tools/list",
        meta_of(json!({ PV: null, CAPS: {} })),
        INVALID_PARAMS,
    ));
    rows.push(
        Row::req(
            "protocolVersion over-long",
            json!(21),
            "tools/list",
            meta_of(json!({ PV: "2026-07-28".repeat(100), CAPS: {} })),
            INVALID_PARAMS,
        )
        .http(400)
        .contains("longer"),
    );
    rows.push(
        Row::req(
            "missing clientCapabilities",
            json!(22),
            "tools/list",
            meta_of(json!({ PV: VERSION })),
            INVALID_PARAMS,
        )
        .http(400)
        .contains("clientCapabilities"),
    );
    for (name, caps) in [
        ("clientCapabilities an array", json!([])),
        ("clientCapabilities a string", json!("all")),
        ("clientCapabilities null", json!(null)),
    ] {
        rows.push(
            Row::req(
                name,
                json!(23),
                "tools/list",
                meta_of(json!({ PV: VERSION, CAPS: caps })),
                INVALID_PARAMS,
            )
            .http(400)
            .contains("clientCapabilities"),
        );
    }
    for (name, ext) in [
        ("extensions an array", json!([TASKS_EXT])),
        ("extensions a string", json!(TASKS_EXT)),
        ("extensions null", json!(null)),
    ] {
        rows.push(
            Row::req(
                name,
                json!("ext"),
                "tools/list",
                meta_of(json!({ PV: VERSION, CAPS: { "extensions": ext } })),
                INVALID_PARAMS,
            )
            .http(400)
            .contains("extensions"),
        );
    }
    for (name, info) in [
        ("clientInfo a string", json!("client")),
        ("clientInfo without version", json!({ "name": "c" })),
        (
            "clientInfo name a number",
            json!({ "name": 1, "version": "1" }),
        ),
        ("clientInfo null", json!(null)),
    ] {
        rows.push(
            Row::req(
                name,
                json!(24),
                "tools/list",
                meta_of(json!({ PV: VERSION, CAPS: {}, INFO: info })),
                INVALID_PARAMS,
            )
            .contains("clientInfo"),
        );
    }

    // --- Unsupported protocol version (-32022, HTTP 400). ---------------------------------------
    for (name, version) in [
        ("unsupported version v999.0.0", "v999.0.0"),
        ("legacy version 2025-11-25", "2025-11-25"),
        ("empty version", ""),
    ] {
        rows.push(
            Row::req(
                name,
                json!(25),
                "tools/list",
                meta_of(json!({ PV: version, CAPS: {} })),
                UNSUPPORTED_VERSION,
            )
            .http(400)
            .check(unsupported_version_data(version)),
        );
    }
    rows.push(
        Row::req(
            "unsupported version on tasks/get",
            json!(26),
            "tasks/get",
            json!({ "taskId": ids.waiting, "_meta": { PV: "v999.0.0", CAPS: { "extensions": { TASKS_EXT: {} } } } }),
            UNSUPPORTED_VERSION,
        )
        .check(unsupported_version_data("v999.0.0")),
    );

    // --- Unknown and removed methods (-32601, HTTP 404). --------------------------------------
    rows.push(
        Row::req(
            "unknown method",
            json!(27),
            "foo/bar",
            with_meta(true, json!({})),
            METHOD_NOT_FOUND,
        )
        .http(404)
        .contains("foo/bar"),
    );
    rows.push(
        Row::req(
            "method in the wrong case",
            json!(28),
            "Tools/List",
            with_meta(false, json!({})),
            METHOD_NOT_FOUND,
        )
        .http(404),
    );
    for method in [
        "initialize",
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
        "tasks/result",
        "tasks/list",
        "notifications/initialized",
    ] {
        let params = with_meta(
            true,
            json!({ "taskId": ids.waiting, "uri": "file:///x", "level": "debug" }),
        );
        rows.push(
            Row::req(
                format!("removed method {method}"),
                json!(method),
                method,
                params,
                METHOD_NOT_FOUND,
            )
            .http(404)
            .contains(method),
        );
    }

    // --- Tasks methods without the extension (-32021, HTTP 400), before any id lookup. --------
    rows.push(
        Row::req(
            "tasks/get without the extension",
            json!(29),
            "tasks/get",
            with_meta(false, json!({ "taskId": "gate-test" })),
            MISSING_CAPABILITY,
        )
        .http(400)
        .check(tasks_capability_data),
    );
    rows.push(
        Row::req(
            "tasks/update without the extension",
            json!(30),
            "tasks/update",
            with_meta(
                false,
                json!({ "taskId": ids.waiting, "inputResponses": { "confirm": { "action": "accept", "content": {} } } }),
            ),
            MISSING_CAPABILITY,
        )
        .http(400)
        .check(tasks_capability_data),
    );
    rows.push(
        Row::req(
            "tasks/cancel without the extension",
            json!(31),
            "tasks/cancel",
            with_meta(false, json!({ "taskId": ids.working })),
            MISSING_CAPABILITY,
        )
        .http(400)
        .check(tasks_capability_data),
    );
    rows.push(
        Row::req(
            "tasks/cancel with the extension declared as true",
            json!(32),
            "tasks/cancel",
            json!({ "taskId": ids.working, "_meta": { PV: VERSION, CAPS: { "extensions": { TASKS_EXT: true } } } }),
            MISSING_CAPABILITY,
        )
        .check(tasks_capability_data),
    );
    rows.push(
        Row::req(
            "tasks/get with the extension as a top-level capability",
            json!(33),
            "tasks/get",
            json!({ "taskId": ids.waiting, "_meta": { PV: VERSION, CAPS: { TASKS_EXT: {}, "tasks": {} } } }),
            MISSING_CAPABILITY,
        )
        .check(tasks_capability_data),
    );
    rows.push(
        Row::req(
            "tasks/get without the extension and without taskId",
            json!(34),
            "tasks/get",
            with_meta(false, json!({})),
            MISSING_CAPABILITY,
        )
        .check(tasks_capability_data),
    );

    // --- Task ids (-32602). -------------------------------------------------------------------
    rows.push(
        Row::req(
            "tasks/get gate-test with the extension",
            json!(35),
            "tasks/get",
            with_meta(true, json!({ "taskId": "gate-test" })),
            INVALID_PARAMS,
        )
        .contains("malformed"),
    );
    rows.push(
        Row::req(
            "tasks/get missing taskId",
            json!(36),
            "tasks/get",
            with_meta(true, json!({})),
            INVALID_PARAMS,
        )
        .contains("taskId"),
    );
    rows.push(
        Row::req(
            "tasks/get taskId a number",
            json!(37),
            "tasks/get",
            with_meta(true, json!({ "taskId": 12345 })),
            INVALID_PARAMS,
        )
        .contains("taskId"),
    );
    rows.push(
        Row::req(
            "tasks/cancel taskId an object",
            json!(38),
            "tasks/cancel",
            with_meta(true, json!({ "taskId": { "id": ids.working } })),
            INVALID_PARAMS,
        )
        .contains("taskId"),
    );
    rows.push(
        Row::req(
            "tasks/get taskId null",
            json!(39),
            "tasks/get",
            with_meta(true, json!({ "taskId": null })),
            INVALID_PARAMS,
        )
        .contains("taskId"),
    );
    rows.push(
        Row::req(
            "tasks/get over-long taskId",
            json!(40),
            "tasks/get",
            with_meta(
                true,
                json!({ "taskId": format!("tsk_{}", "0".repeat(100_000)) }),
            ),
            INVALID_PARAMS,
        )
        .contains("taskId"),
    );
    rows.push(
        Row::req(
            "tasks/get unknown well-formed id",
            json!(41),
            "tasks/get",
            with_meta(true, json!({ "taskId": UNKNOWN_TASK })),
            INVALID_PARAMS,
        )
        .contains("not found"),
    );
    rows.push(
        Row::req(
            "tasks/cancel unknown well-formed id",
            json!(42),
            "tasks/cancel",
            with_meta(true, json!({ "taskId": UNKNOWN_TASK })),
            INVALID_PARAMS,
        )
        .contains("not found"),
    );
    rows.push(
        Row::req(
            "tasks/update unknown well-formed id",
            json!(43),
            "tasks/update",
            with_meta(
                true,
                json!({ "taskId": UNKNOWN_TASK, "inputResponses": {} }),
            ),
            INVALID_PARAMS,
        )
        .contains("not found"),
    );
    rows.push(Row::req(
        "tasks/get real id in upper case",
        json!(44),
        "tasks/get",
        with_meta(true, json!({ "taskId": ids.waiting.to_uppercase() })),
        INVALID_PARAMS,
    ));
    rows.push(Row::req(
        "tasks/get real id with trailing space",
        json!(45),
        "tasks/get",
        with_meta(true, json!({ "taskId": format!("{} ", ids.waiting) })),
        INVALID_PARAMS,
    ));
    rows.push(Row::req(
        "tasks/get real id with a NUL byte",
        json!(46),
        "tasks/get",
        with_meta(true, json!({ "taskId": format!("{}\u{0}", ids.completed) })),
        INVALID_PARAMS,
    ));
    rows.push(
        Row::req(
            "tasks/update without inputResponses",
            json!(47),
            "tasks/update",
            with_meta(true, json!({ "taskId": ids.waiting })),
            INVALID_PARAMS,
        )
        .contains("inputResponses"),
    );
    for (name, responses) in [
        (
            "tasks/update inputResponses an array",
            json!([{ "action": "accept" }]),
        ),
        ("tasks/update inputResponses a string", json!("accept")),
        ("tasks/update inputResponses null", json!(null)),
    ] {
        rows.push(
            Row::req(
                name,
                json!(48),
                "tasks/update",
                with_meta(
                    true,
                    json!({ "taskId": ids.waiting, "inputResponses": responses }),
                ),
                INVALID_PARAMS,
            )
            .contains("inputResponses"),
        );
    }
    rows.push(
        Row::req(
            "tasks/update without taskId",
            json!(49),
            "tasks/update",
            with_meta(
                true,
                json!({ "inputResponses": { "confirm": { "action": "accept" } } }),
            ),
            INVALID_PARAMS,
        )
        .contains("taskId"),
    );

    // --- tools/call (-32602 unless noted). No row may create a task. --------------------------
    rows.push(
        Row::req(
            "tools/call missing name",
            json!(50),
            "tools/call",
            with_meta(true, json!({ "arguments": { "count": 1 } })),
            INVALID_PARAMS,
        )
        .contains("`name`"),
    );
    rows.push(
        Row::req(
            "tools/call name a number",
            json!(51),
            "tools/call",
            with_meta(true, json!({ "name": 7, "arguments": {} })),
            INVALID_PARAMS,
        )
        .contains("`name`"),
    );
    rows.push(
        Row::req(
            "tools/call name an array",
            json!(52),
            "tools/call",
            with_meta(
                true,
                json!({ "name": ["count_slowly"], "arguments": { "count": 1 } }),
            ),
            INVALID_PARAMS,
        )
        .contains("`name`"),
    );
    rows.push(
        Row::req(
            "tools/call name over-long",
            json!(53),
            "tools/call",
            with_meta(true, json!({ "name": "n".repeat(5_000) })),
            INVALID_PARAMS,
        )
        .contains("`name`"),
    );
    rows.push(
        Row::req(
            "tools/call unknown tool",
            json!(54),
            "tools/call",
            with_meta(true, json!({ "name": "no_such_tool", "arguments": {} })),
            INVALID_PARAMS,
        )
        .contains("no_such_tool"),
    );
    for (name, args) in [
        ("tools/call arguments an array", json!([1])),
        ("tools/call arguments a string", json!("count=1")),
        ("tools/call arguments a number", json!(1)),
    ] {
        rows.push(
            Row::req(
                name,
                json!(55),
                "tools/call",
                with_meta(true, json!({ "name": "count_slowly", "arguments": args })),
                INVALID_PARAMS,
            )
            .contains("arguments"),
        );
    }
    for (name, args) in [
        ("count missing", json!({})),
        ("count a string", json!({ "count": "five" })),
        ("count below minimum", json!({ "count": 0 })),
        ("count negative", json!({ "count": -1 })),
        ("count a float", json!({ "count": 1.5 })),
        ("count null", json!({ "count": null })),
    ] {
        rows.push(
            Row::req(
                format!("tools/call schema: {name}"),
                json!(56),
                "tools/call",
                with_meta(true, json!({ "name": "count_slowly", "arguments": args })),
                INVALID_PARAMS,
            )
            .contains("count"),
        );
    }
    rows.push(
        Row::req(
            "generate_report with an unknown size",
            json!(57),
            "tools/call",
            with_meta(
                true,
                json!({ "name": "generate_report", "arguments": { "size": "huge" } }),
            ),
            INVALID_PARAMS,
        )
        .contains("size"),
    );
    rows.push(Row::req(
        "generate_report with an extra argument",
        json!(58),
        "tools/call",
        with_meta(
            true,
            json!({ "name": "generate_report", "arguments": { "size": "small", "x": 1 } }),
        ),
        INVALID_PARAMS,
    ));
    rows.push(Row::req(
        "generate_report without arguments",
        json!(59),
        "tools/call",
        with_meta(true, json!({ "name": "generate_report" })),
        INVALID_PARAMS,
    ));
    rows.push(
        Row::req(
            "Always tool without the extension",
            json!(60),
            "tools/call",
            with_meta(
                false,
                json!({ "name": "count_slowly", "arguments": { "count": 1 } }),
            ),
            MISSING_CAPABILITY,
        )
        .http(400)
        .check(tasks_capability_data),
    );
    rows.push(
        Row::req(
            "generate_report without the extension",
            json!(61),
            "tools/call",
            with_meta(
                false,
                json!({ "name": "generate_report", "arguments": { "size": "small" } }),
            ),
            MISSING_CAPABILITY,
        )
        .check(tasks_capability_data),
    );
    rows.push(
        Row::req(
            "tools/call requestState a number",
            json!(62),
            "tools/call",
            with_meta(
                false,
                json!({ "name": "echo", "arguments": { "text": "a" }, "requestState": 5 }),
            ),
            INVALID_PARAMS,
        )
        .contains("requestState"),
    );
    rows.push(
        Row::req(
            "tools/call requestState an object",
            json!(63),
            "tools/call",
            with_meta(
                true,
                json!({ "name": "count_slowly", "arguments": { "count": 1 }, "requestState": {} }),
            ),
            INVALID_PARAMS,
        )
        .contains("requestState"),
    );
    rows.push(
        Row::req(
            "tools/call inputResponses a string",
            json!(64),
            "tools/call",
            with_meta(true, json!({ "name": "count_slowly", "arguments": { "count": 1 }, "inputResponses": "yes" })),
            INVALID_PARAMS,
        )
        .contains("inputResponses"),
    );
    rows.push(
        Row::req(
            "tools/call Never tool with a bad argument type",
            json!(65),
            "tools/call",
            with_meta(true, json!({ "name": "echo", "arguments": { "text": 5 } })),
            INVALID_PARAMS,
        )
        .contains("text"),
    );

    // --- tools/list. ---------------------------------------------------------------------------
    rows.push(
        Row::req(
            "tools/list with a cursor",
            json!(66),
            "tools/list",
            with_meta(false, json!({ "cursor": "page-2" })),
            INVALID_PARAMS,
        )
        .contains("cursor"),
    );
    rows.push(
        Row::req(
            "tools/list with a numeric cursor",
            json!(67),
            "tools/list",
            with_meta(false, json!({ "cursor": 2 })),
            INVALID_PARAMS,
        )
        .contains("cursor"),
    );

    // --- Size and depth. -----------------------------------------------------------------------
    let meta_text = serde_json::to_string(&meta(true)).unwrap();
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":68,"method":"tools/call","params":{{"_meta":{meta_text},"name":"echo","arguments":{{"text":"a","deep":{}}}}}}}"#,
        nested_arrays(10_000, "1")
    );
    rows.push(
        Row::err(
            "10000 nested arrays in params",
            deep.into_bytes(),
            PARSE_ERROR,
        )
        .expect(Expect::AnyError(&[PARSE_ERROR, INVALID_REQUEST])),
    );
    let deep_objects = format!(
        r#"{{"jsonrpc":"2.0","id":69,"method":"tools/list","params":{{"_meta":{meta_text},"x":{}1{}}}}}"#,
        r#"{"a":"#.repeat(10_000),
        "}".repeat(10_000)
    );
    rows.push(
        Row::err(
            "10000 nested objects in params",
            deep_objects.into_bytes(),
            PARSE_ERROR,
        )
        .expect(Expect::AnyError(&[PARSE_ERROR, INVALID_REQUEST])),
    );
    rows.push(
        Row::err(
            "1000000 unclosed arrays",
            "[".repeat(1_000_000).into_bytes(),
            PARSE_ERROR,
        )
        .expect(Expect::AnyError(&[PARSE_ERROR, INVALID_REQUEST])),
    );
    let five_mib = request(
        &json!(70),
        "tools/call",
        with_meta(
            false,
            json!({ "name": "echo", "arguments": { "text": "x".repeat(5 * 1024 * 1024) } }),
        ),
    );
    rows.push(
        Row::err("5 MiB message", five_mib, INVALID_REQUEST)
            .http(400)
            .contains("limit"),
    );
    let mut just_over = request(&json!(71), "tools/list", list.clone());
    just_over.resize(4 * 1024 * 1024 + 1, b' ');
    rows.push(
        Row::err(
            "4 MiB + 1 byte (trailing whitespace)",
            just_over,
            INVALID_REQUEST,
        )
        .contains("limit"),
    );
    rows.push(
        Row::req(
            "3 MiB string argument to a Never tool",
            json!(72),
            "tools/call",
            with_meta(
                true,
                json!({ "name": "echo", "arguments": { "text": "y".repeat(3 * 1024 * 1024) } }),
            ),
            INVALID_PARAMS,
        )
        .expect(Expect::OkOr(INVALID_PARAMS)),
    );
    rows.push(
        Row::req(
            "3 MiB string as count of an Always tool",
            json!(73),
            "tools/call",
            with_meta(true, json!({ "name": "count_slowly", "arguments": { "count": "z".repeat(3 * 1024 * 1024) } })),
            INVALID_PARAMS,
        )
        .contains("limits.max_argument_bytes"),
    );
    rows.push(
        Row::req(
            "100000 extra arguments",
            json!(74),
            "tools/call",
            with_meta(
                true,
                json!({ "name": "generate_report", "arguments": (0..100_000).map(|i| (format!("k{i}"), json!(i))).collect::<Map<_, _>>() }),
            ),
            INVALID_PARAMS,
        ),
    );

    // --- Notifications: never a response, never an effect. -----------------------------------
    rows.push(Row::silent(
        "notification with garbage params",
        notification(
            "notifications/cancelled",
            json!({ "_meta": 5, "requestId": [null, {}], "reason": {} }),
        ),
    ));
    rows.push(Row::silent(
        "well-formed notification",
        notification(
            "notifications/cancelled",
            with_meta(true, json!({ "requestId": 1, "reason": "changed my mind" })),
        ),
    ));
    rows.push(Row::silent(
        "notification without params",
        bytes(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" })),
    ));
    rows.push(Row::silent(
        "notification of an unknown method",
        notification("x/y", json!({})),
    ));
    rows.push(Row::silent(
        "tasks/cancel sent as a notification",
        notification(
            "tasks/cancel",
            with_meta(true, json!({ "taskId": ids.working })),
        ),
    ));
    rows.push(Row::silent(
        "tasks/update sent as a notification",
        notification(
            "tasks/update",
            with_meta(true, json!({ "taskId": ids.waiting, "inputResponses": { "confirm": { "action": "accept", "content": {} } } })),
        ),
    ));
    rows.push(Row::silent(
        "tools/call of an Always tool sent as a notification",
        notification(
            "tools/call",
            with_meta(
                true,
                json!({ "name": "count_slowly", "arguments": { "count": 3 } }),
            ),
        ),
    ));
    rows.push(
        Row::err(
            "notification with params an array",
            bytes(&json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": [1] })),
            INVALID_REQUEST,
        )
        .contains("`params`"),
    );
    // A sanity row: the well-formed call the rows above distort does succeed.
    rows.push(
        Row::req(
            "control: a valid echo call",
            json!(99),
            "tools/call",
            ok_call,
            0,
        )
        .expect(Expect::OkOr(0)),
    );
    rows
}

// ---------------------------------------------------------------------------------------------
// The runtime under test
// ---------------------------------------------------------------------------------------------

fn tools() -> Vec<std::sync::Arc<dyn mcp_tasks::tool::Tool>> {
    let count = ToolDescriptor::new(
        "count_slowly",
        "Asks for confirmation, then never finishes.",
    )
    .input_schema(json!({
        "type": "object",
        "properties": { "count": { "type": "integer", "minimum": 1 } },
        "required": ["count"]
    }))
    .task_policy(TaskPolicy::Always);
    let count = tool_fn(count, |ctx, _args| async move {
        ctx.input(
            "confirm",
            InputRequest::elicit_form(
                "Start counting?",
                json!({ "type": "object", "properties": { "go": { "type": "boolean" } }, "required": ["go"] }),
            ),
        )
        .await?;
        futures::future::pending::<()>().await;
        Ok(CallToolResult::text("unreachable"))
    });
    let echo = ToolDescriptor::new("echo", "Answers with the length of `text`.")
        .input_schema(json!({ "type": "object", "properties": { "text": { "type": "string" } } }))
        .task_policy(TaskPolicy::Never);
    let echo = tool_fn(echo, |_ctx, args| async move {
        let len = args.get("text").and_then(Value::as_str).map_or(0, str::len);
        Ok(CallToolResult::text(format!("{len} bytes")))
    });
    let instant =
        ToolDescriptor::new("instant", "Finishes at once.").task_policy(TaskPolicy::WhenSupported);
    let instant = tool_fn(instant, |_ctx, _args| async move {
        Ok(CallToolResult::text("done"))
    });
    vec![
        count,
        echo,
        instant,
        mcp_tasks_testkit::demo::generate_report(Duration::from_secs(3600)),
    ]
}

async fn send(runtime: &Runtime, owner: &Owner, msg: &Value) -> Reply {
    runtime
        .handle_message(&bytes(msg), owner)
        .await
        .unwrap_or_else(|| panic!("no reply to {msg}"))
}

async fn create_task(runtime: &Runtime, owner: &Owner, tool: &str, args: Value) -> String {
    let msg = json!({ "jsonrpc": "2.0", "id": "create", "method": "tools/call",
        "params": with_meta(true, json!({ "name": tool, "arguments": args })) });
    let reply = send(runtime, owner, &msg).await;
    assert_eq!(reply.http_status, 200, "{}", reply.body());
    assert_eq!(
        reply.body()["result"]["resultType"],
        "task",
        "{}",
        reply.body()
    );
    reply.body()["result"]["taskId"]
        .as_str()
        .expect("taskId")
        .to_owned()
}

async fn get_task(runtime: &Runtime, owner: &Owner, id: &str) -> Reply {
    let msg = json!({ "jsonrpc": "2.0", "id": "get", "method": "tasks/get",
        "params": with_meta(true, json!({ "taskId": id })) });
    send(runtime, owner, &msg).await
}

/// Waits until the task has `status` and its `tasks/get` answer stopped moving, and returns it.
async fn settle(runtime: &Runtime, owner: &Owner, id: &str, status: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let reply = get_task(runtime, owner, id).await;
        let result = reply.body()["result"].clone();
        if result["status"] == status {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let again = get_task(runtime, owner, id).await.body()["result"].clone();
            if again == result {
                return result;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task {id} did not settle in {status}: {}",
            reply.body()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Checking one row
// ---------------------------------------------------------------------------------------------

fn check_error_reply(row: &Row, reply: &Reply, codes: &[i64]) -> Vec<String> {
    let mut problems = Vec::new();
    let body = reply.body();
    let Some(obj) = body.as_object() else {
        return vec![format!("the reply is not an object: {body}")];
    };
    if obj.get("jsonrpc") != Some(&json!("2.0")) {
        problems.push("`jsonrpc` is not \"2.0\"".into());
    }
    if obj.contains_key("result") {
        problems.push("an error reply carries `result`".into());
    }
    if let Some(extra) = obj
        .keys()
        .find(|k| !["jsonrpc", "id", "error"].contains(&k.as_str()))
    {
        problems.push(format!("unexpected member `{extra}`"));
    }
    let error = &body["error"];
    let code = error["code"].as_i64();
    let message = error["message"].as_str();
    match code {
        Some(c) if codes.contains(&c) => {}
        other => problems.push(format!("code {other:?}, expected one of {codes:?}")),
    }
    match message {
        Some(m) if !m.is_empty() => {
            if let Some(text) = &row.contains
                && !m.contains(text.as_str())
            {
                problems.push(format!("message {m:?} does not contain {text:?}"));
            }
        }
        _ => problems.push("`error.message` is not a non-empty string".into()),
    }
    if let Some(c) = code {
        let expected = row.http.unwrap_or_else(|| default_http(c));
        if reply.http_status != expected {
            problems.push(format!(
                "http status {}, expected {expected}",
                reply.http_status
            ));
        }
    }
    match &row.id {
        IdRule::Echo(id) => {
            if obj.get("id") != Some(id) {
                problems.push(format!("id {:?}, expected it to echo {id}", obj.get("id")));
            }
        }
        IdRule::Absent => {
            if let Some(id) = obj.get("id") {
                problems.push(format!(
                    "unreadable request id, yet the reply has `id`: {id}"
                ));
            }
        }
        IdRule::None => {}
    }
    if let Some(check) = &row.check
        && let Err(e) = check(error)
    {
        problems.push(e);
    }
    problems
}

fn check_row(row: &Row, reply: Option<&Reply>) -> Vec<String> {
    match (&row.expect, reply) {
        (Expect::NoResponse, None) => Vec::new(),
        (Expect::NoResponse, Some(r)) => vec![format!("expected no response, got {}", r.body())],
        (_, None) => vec!["no response".into()],
        (Expect::Error(c), Some(r)) => check_error_reply(row, r, &[*c]),
        (Expect::AnyError(cs), Some(r)) => check_error_reply(row, r, cs),
        (Expect::OkOr(c), Some(r)) => {
            if r.body().get("error").is_some() {
                check_error_reply(row, r, &[*c])
            } else if !r.body()["result"]["resultType"].is_string() || r.http_status != 200 {
                vec![format!(
                    "neither a result nor an error: {} ({})",
                    r.body(),
                    r.http_status
                )]
            } else if let IdRule::Echo(id) = &row.id
                && r.body().get("id") != Some(id)
            {
                vec![format!("result id {:?}, expected {id}", r.body().get("id"))]
            } else {
                Vec::new()
            }
        }
    }
}

/// Truncates a reply for failure messages (some echo megabytes).
fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() <= 400 {
        return s;
    }
    let mut end = 400;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

// ---------------------------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_messages_are_rejected_without_side_effects() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::builder(dir.path().join("tasks.redb"))
        .tools(tools())
        .start()
        .await
        .unwrap();
    let owner = Owner::new("t1", "alice");

    // Real tasks, held still: one waits for input, one sleeps in a step, one is finished.
    let ids = Ids {
        waiting: create_task(&runtime, &owner, "count_slowly", json!({ "count": 2 })).await,
        working: create_task(
            &runtime,
            &owner,
            "generate_report",
            json!({ "size": "small" }),
        )
        .await,
        completed: create_task(&runtime, &owner, "instant", json!({})).await,
    };
    let tasks = [
        (
            ids.waiting.clone(),
            settle(&runtime, &owner, &ids.waiting, "input_required").await,
        ),
        (
            ids.working.clone(),
            settle(&runtime, &owner, &ids.working, "working").await,
        ),
        (
            ids.completed.clone(),
            settle(&runtime, &owner, &ids.completed, "completed").await,
        ),
    ];
    let counts_before = mcp_tasks::internals::runtime_store(&runtime)
        .counts()
        .await
        .unwrap();
    let live_before = runtime.live_tasks();
    assert_eq!(counts_before.0, 3, "three tasks stored");

    let rows = table(&ids);
    assert!(rows.len() >= 45, "only {} rows", rows.len());
    let mut failures = Vec::new();
    let handle = runtime.handle();
    for row in &rows {
        let (h, o, b) = (handle.clone(), owner.clone(), row.bytes.clone());
        let joined = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::spawn(async move { h.handle_message(&b, &o).await }),
        )
        .await;
        let reply = match joined {
            Err(_) => {
                failures.push(format!("[{}] no answer within 30 s", row.name));
                continue;
            }
            Ok(Err(e)) => {
                failures.push(format!("[{}] the handler panicked: {e}", row.name));
                continue;
            }
            Ok(Ok(reply)) => reply,
        };
        for problem in check_row(row, reply.as_ref()) {
            let body = reply.as_ref().map_or("none".into(), |r| short(&r.body()));
            failures.push(format!("[{}] {problem}\n    reply: {body}", row.name));
        }
    }

    // Another owner probing the real ids gets exactly the unknown-id answer, and changes nothing.
    let strangers = [
        Owner::new("t2", "mallory"),
        Owner::new("t2", "alice"),
        Owner::new("t1", "mallory"),
    ];
    let probes = |task_id: &str| {
        [
            ("tasks/get", with_meta(true, json!({ "taskId": task_id }))),
            (
                "tasks/update",
                with_meta(
                    true,
                    json!({ "taskId": task_id, "inputResponses": { "confirm": { "action": "accept", "content": { "go": true } } } }),
                ),
            ),
            (
                "tasks/cancel",
                with_meta(true, json!({ "taskId": task_id })),
            ),
        ]
    };
    for stranger in &strangers {
        let unknown: Vec<Reply> = {
            let mut v = Vec::new();
            for (method, params) in probes(UNKNOWN_TASK) {
                v.push(
                    send(
                        &runtime,
                        stranger,
                        &json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params }),
                    )
                    .await,
                );
            }
            v
        };
        for (task_id, _) in &tasks {
            for ((method, params), baseline) in probes(task_id).into_iter().zip(&unknown) {
                let name = format!("{stranger} {method} on {task_id}");
                let reply = send(
                    &runtime,
                    stranger,
                    &json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params }),
                )
                .await;
                if reply.body()["error"]["code"] != json!(INVALID_PARAMS) {
                    failures.push(format!(
                        "[{name}] expected -32602, got {}",
                        short(&reply.body())
                    ));
                }
                if reply.body() != baseline.body() || reply.http_status != baseline.http_status {
                    failures.push(format!(
                        "[{name}] differs from the unknown-id answer:\n    got     {} ({})\n    unknown {} ({})",
                        short(&reply.body()),
                        reply.http_status,
                        short(&baseline.body()),
                        baseline.http_status
                    ));
                }
            }
        }
    }

    // Nothing moved: no task created, deleted, advanced, answered or cancelled.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let counts_after = mcp_tasks::internals::runtime_store(&runtime)
        .counts()
        .await
        .unwrap();
    if counts_after != counts_before {
        failures.push(format!(
            "store counts changed: {counts_before:?} -> {counts_after:?}"
        ));
    }
    if runtime.live_tasks() != live_before {
        failures.push(format!(
            "live tasks changed: {live_before} -> {}",
            runtime.live_tasks()
        ));
    }
    for (task_id, before) in &tasks {
        let after = get_task(&runtime, &owner, task_id).await.body()["result"].clone();
        if &after != before {
            failures.push(format!(
                "task {task_id} changed:\n    before {before}\n    after  {after}"
            ));
        }
    }

    runtime.shutdown().await;
    assert!(
        failures.is_empty(),
        "{} of {} rows (plus ownership and stillness checks) failed:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
}
