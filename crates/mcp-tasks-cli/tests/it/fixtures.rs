//! The conformance and bench fixtures through the embedding API: the behaviours the official
//! conformance scenarios rely on, checked in process.

use std::time::{Duration, Instant};

use mcp_tasks::{Owner, Runtime};
use mcp_tasks_testkit::fixtures::{bench, conformance};
use serde_json::{Value, json};

const TASKS: &str = "io.modelcontextprotocol/tasks";

/// The capabilities of the conformance suite's default client plus the Tasks extension.
fn full_caps() -> Value {
    json!({ "sampling": {}, "elicitation": {}, "roots": { "listChanged": true }, "extensions": { TASKS: {} } })
}

fn mrtr_caps() -> Value {
    json!({ "sampling": {}, "elicitation": {}, "roots": { "listChanged": true } })
}

struct Fixture {
    rt: Runtime,
    _dir: tempfile::TempDir,
}

async fn start_with(
    install: fn(mcp_tasks::RuntimeBuilder) -> mcp_tasks::RuntimeBuilder,
) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let rt = install(Runtime::builder(dir.path().join("f.redb")))
        .start()
        .await
        .expect("the runtime starts");
    Fixture { rt, _dir: dir }
}

async fn conformance_rt() -> Fixture {
    start_with(conformance::install).await
}

impl Fixture {
    /// Sends one request with the given client capabilities; returns the whole response.
    async fn send(&self, method: &str, mut params: Value, caps: Value) -> Value {
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": caps
        });
        let msg = json!({ "jsonrpc": "2.0", "id": 7, "method": method, "params": params });
        self.rt
            .handle_json(msg, &Owner::anonymous())
            .await
            .expect("a response")
    }

    /// The `result` of a request that must succeed.
    async fn ok(&self, method: &str, params: Value, caps: Value) -> Value {
        let r = self.send(method, params, caps).await;
        assert!(r.get("result").is_some(), "{method} failed: {r}");
        r["result"].clone()
    }

    async fn call(&self, tool: &str, arguments: Value, caps: Value) -> Value {
        self.ok(
            "tools/call",
            json!({ "name": tool, "arguments": arguments }),
            caps,
        )
        .await
    }

    async fn create(&self, tool: &str, arguments: Value) -> String {
        let r = self.call(tool, arguments, full_caps()).await;
        assert_eq!(r["resultType"], "task", "{r}");
        r["taskId"].as_str().unwrap().to_owned()
    }

    async fn get(&self, task: &str) -> Value {
        self.ok("tasks/get", json!({ "taskId": task }), full_caps())
            .await
    }

    /// Polls until the task has `status` or is terminal; panics after `within`.
    async fn wait_for(&self, task: &str, status: &str, within: Duration) -> Value {
        let start = Instant::now();
        loop {
            let r = self.get(task).await;
            let s = r["status"].as_str().unwrap_or_default();
            if s == status || ["completed", "failed", "cancelled"].contains(&s) {
                return r;
            }
            assert!(
                start.elapsed() < within,
                "task {task} is still {s} after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

fn accept(content: Value) -> Value {
    json!({ "action": "accept", "content": content })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fixture_is_listed_with_a_description_and_an_object_schema() {
    let f = conformance_rt().await;
    let tools = f.ok("tools/list", json!({}), full_caps()).await;
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            assert!(
                t["description"].as_str().is_some_and(|d| d.len() > 20),
                "{t}"
            );
            assert_eq!(t["inputSchema"]["type"], "object", "{t}");
            t["name"].as_str().unwrap()
        })
        .collect();
    for expected in [
        "greet",
        "slow_compute",
        "failing_job",
        "protocol_error_job",
        "confirm_delete",
        "multi_input",
        "test_tool_with_task",
        "test_missing_capability",
        "test_streaming_elicitation",
        "test_logging_tool",
        "test_input_required_result_elicitation",
        "test_input_required_result_sampling",
        "test_input_required_result_list_roots",
        "test_input_required_result_request_state",
        "test_input_required_result_multiple_inputs",
        "test_input_required_result_multi_round",
        "test_input_required_result_tampered_state",
        "test_input_required_result_capabilities",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} is missing: {names:?}"
        );
    }
    let discover = f.ok("server/discover", json!({}), json!({})).await;
    let caps = &discover["capabilities"];
    assert!(
        caps["prompts"].is_object() && caps["resources"].is_object(),
        "{discover}"
    );
    assert!(caps["extensions"][TASKS].is_object(), "{discover}");
    let prompts = f.ok("prompts/list", json!({}), json!({})).await;
    assert_eq!(
        prompts["prompts"][0]["name"],
        "test_input_required_result_prompt"
    );
    let templates = f.ok("resources/templates/list", json!({}), json!({})).await;
    let uri_templates: Vec<&Value> = templates["resourceTemplates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["uriTemplate"])
        .collect();
    assert_eq!(
        uri_templates,
        [
            &json!("test://template/{id}/data"),
            &json!("test://items/{id}")
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greet_is_synchronous_and_exact() {
    let f = conformance_rt().await;
    let r = f
        .call("greet", json!({ "name": "World" }), full_caps())
        .await;
    assert_eq!(r["resultType"], "complete");
    assert!(r.get("taskId").is_none(), "{r}");
    assert_eq!(
        r["content"],
        json!([{ "type": "text", "text": "Hello, World!" }])
    );
    // The legacy `task` parameter is ignored.
    let r = f
        .ok(
            "tools/call",
            json!({ "name": "greet", "arguments": { "name": "legacy" }, "task": { "ttl": 60000 } }),
            full_caps(),
        )
        .await;
    assert_eq!(text(&r), "Hello, legacy!");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_compute_completes_and_is_cancelled_quickly() {
    let f = conformance_rt().await;
    let task = f
        .create("slow_compute", json!({ "seconds": 1, "label": "quick" }))
        .await;
    let done = f.wait_for(&task, "completed", Duration::from_secs(5)).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(text(&done["result"]).contains("quick"), "{done}");

    let task = f
        .create("slow_compute", json!({ "seconds": 60, "label": "long" }))
        .await;
    let ack = f
        .ok("tasks/cancel", json!({ "taskId": task }), full_caps())
        .await;
    assert_eq!(ack["resultType"], "complete");
    assert!(ack.get("status").is_none(), "{ack}");
    let end = f.wait_for(&task, "cancelled", Duration::from_secs(2)).await;
    assert_eq!(end["status"], "cancelled", "{end}");

    // Without the extension the call is synchronous.
    let r = f
        .call(
            "slow_compute",
            json!({ "seconds": 0, "label": "sync" }),
            json!({}),
        )
        .await;
    assert_eq!(r["resultType"], "complete", "{r}");
    assert!(text(&r).contains("sync"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_job_completes_with_is_error_and_needs_the_extension() {
    let f = conformance_rt().await;
    let task = f.create("failing_job", json!({})).await;
    let done = f.wait_for(&task, "completed", Duration::from_secs(5)).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["isError"], true, "{done}");

    let r = f
        .send(
            "tools/call",
            json!({ "name": "failing_job", "arguments": {} }),
            json!({}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32021, "{r}");
    assert!(
        r["error"]["data"]["requiredCapabilities"]["extensions"][TASKS].is_object(),
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_error_job_fails_with_an_error_and_no_result() {
    let f = conformance_rt().await;
    let task = f.create("protocol_error_job", json!({})).await;
    let done = f.wait_for(&task, "failed", Duration::from_secs(5)).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert!(done["error"]["code"].is_i64(), "{done}");
    assert!(done["error"]["message"].is_string(), "{done}");
    assert!(done.get("result").is_none(), "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_delete_waits_for_input_and_ignores_unknown_keys() {
    let f = conformance_rt().await;
    let task = f
        .create("confirm_delete", json!({ "filename": "a.txt" }))
        .await;
    let waiting = f
        .wait_for(&task, "input_required", Duration::from_secs(5))
        .await;
    assert_eq!(waiting["status"], "input_required", "{waiting}");
    assert_eq!(
        waiting["inputRequests"]["confirm"]["method"],
        "elicitation/create"
    );
    let ack = f
        .ok(
            "tasks/update",
            json!({ "taskId": task, "inputResponses": { "unknown-key": { "ignored": true } } }),
            full_caps(),
        )
        .await;
    assert_eq!(ack["resultType"], "complete");
    assert_eq!(f.get(&task).await["status"], "input_required");
    f.ok(
        "tasks/update",
        json!({ "taskId": task, "inputResponses": { "confirm": accept(json!({ "confirm": true })) } }),
        full_caps(),
    )
    .await;
    let done = f.wait_for(&task, "completed", Duration::from_secs(5)).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(text(&done["result"]), "Deleted a.txt.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_input_accepts_partial_answers() {
    let f = conformance_rt().await;
    let task = f.create("multi_input", json!({})).await;
    let waiting = f
        .wait_for(&task, "input_required", Duration::from_secs(5))
        .await;
    let keys: Vec<String> = waiting["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert!(keys.len() >= 2, "{waiting}");
    let content = json!({ "name": "partial", "confirm": true });
    f.ok(
        "tasks/update",
        json!({ "taskId": task, "inputResponses": { keys[0].clone(): accept(content.clone()) } }),
        full_caps(),
    )
    .await;
    let partial = f.get(&task).await;
    assert_eq!(partial["status"], "input_required", "{partial}");
    assert!(
        partial["inputRequests"].get(&keys[0]).is_none(),
        "{partial}"
    );
    assert!(
        partial["inputRequests"].get(&keys[1]).is_some(),
        "{partial}"
    );
    f.ok(
        "tasks/update",
        json!({ "taskId": task, "inputResponses": { keys[1].clone(): accept(content) } }),
        full_caps(),
    )
    .await;
    let done = f.wait_for(&task, "completed", Duration::from_secs(5)).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        text(&done["result"]),
        "Received name=partial, confirm=true."
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_with_task_asks_first_then_becomes_a_task() {
    let f = conformance_rt().await;
    let caps = json!({ "elicitation": {}, "extensions": { TASKS: {} } });
    let r1 = f.call("test_tool_with_task", json!({}), caps.clone()).await;
    assert_eq!(r1["resultType"], "input_required", "{r1}");
    assert!(r1.get("taskId").is_none(), "{r1}");
    let key = r1["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    let r2 = f
        .ok(
            "tools/call",
            json!({
                "name": "test_tool_with_task",
                "arguments": {},
                "inputResponses": { key: accept(json!({ "name": "Alice" })) },
                "requestState": r1["requestState"]
            }),
            caps,
        )
        .await;
    assert_eq!(r2["resultType"], "task", "{r2}");
    assert!(r2.get("requestState").is_none() && r2.get("inputRequests").is_none());
    let task = r2["taskId"].as_str().unwrap();
    let done = f.wait_for(task, "completed", Duration::from_secs(5)).await;
    assert_eq!(text(&done["result"]), "Hello, Alice!", "{done}");

    // Without the extension the same two rounds end in a synchronous result.
    let caps = json!({ "elicitation": {} });
    let r1 = f.call("test_tool_with_task", json!({}), caps.clone()).await;
    assert_eq!(r1["resultType"], "input_required", "{r1}");
    let r2 = f
        .ok(
            "tools/call",
            json!({
                "name": "test_tool_with_task",
                "arguments": {},
                "inputResponses": { "user_name": accept(json!({ "name": "Bob" })) },
                "requestState": r1["requestState"]
            }),
            caps,
        )
        .await;
    assert_eq!(r2["resultType"], "complete", "{r2}");
    assert_eq!(text(&r2), "Hello, Bob!");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mrtr_elicitation_completes_with_or_without_state() {
    let f = conformance_rt().await;
    let tool = "test_input_required_result_elicitation";
    let r1 = f.call(tool, json!({}), mrtr_caps()).await;
    assert_eq!(r1["resultType"], "input_required");
    assert_eq!(
        r1["inputRequests"]["user_name"]["method"],
        "elicitation/create"
    );
    // Answered without a requestState, with extra keys: complete.
    let r = f
        .ok(
            "tools/call",
            json!({ "name": tool, "arguments": {}, "inputResponses": {
                "user_name": accept(json!({ "name": "Alice" })),
                "unknown_extra_key": accept(json!({ "foo": "bar" }))
            } }),
            mrtr_caps(),
        )
        .await;
    assert_eq!(r["resultType"], "complete", "{r}");
    assert_eq!(text(&r), "Hello, Alice!");
    // A wrong key or a malformed answer asks again.
    for responses in [
        json!({ "wrong_key": accept(json!({ "data": "wrong" })) }),
        json!({ "user_name": 12345 }),
        Value::Null,
    ] {
        let r = f
            .ok(
                "tools/call",
                json!({ "name": tool, "arguments": {}, "inputResponses": responses }),
                mrtr_caps(),
            )
            .await;
        assert_eq!(r["resultType"], "input_required", "{r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mrtr_multi_round_issues_a_new_state_each_round() {
    let f = conformance_rt().await;
    let tool = "test_input_required_result_multi_round";
    let r1 = f.call(tool, json!({}), mrtr_caps()).await;
    assert!(r1["inputRequests"]["step1"].is_object(), "{r1}");
    let s1 = r1["requestState"].as_str().unwrap().to_owned();
    let r2 = f
        .ok(
            "tools/call",
            json!({ "name": tool, "arguments": {}, "requestState": s1,
                    "inputResponses": { "step1": accept(json!({ "name": "Alice" })) } }),
            mrtr_caps(),
        )
        .await;
    assert_eq!(r2["resultType"], "input_required", "{r2}");
    assert!(r2["inputRequests"]["step2"].is_object(), "{r2}");
    let s2 = r2["requestState"].as_str().unwrap().to_owned();
    assert_ne!(s1, s2);
    let r3 = f
        .ok(
            "tools/call",
            json!({ "name": tool, "arguments": {}, "requestState": s2,
                    "inputResponses": { "step2": accept(json!({ "color": "blue" })) } }),
            mrtr_caps(),
        )
        .await;
    assert_eq!(r3["resultType"], "complete", "{r3}");
    assert_eq!(text(&r3), "Alice likes blue.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mrtr_request_state_and_tampering() {
    let f = conformance_rt().await;
    let tool = "test_input_required_result_request_state";
    let r1 = f.call(tool, json!({}), mrtr_caps()).await;
    let state = r1["requestState"].as_str().unwrap().to_owned();
    let answer = json!({ "confirm": accept(json!({ "ok": true })) });
    let r2 = f
        .ok(
            "tools/call",
            json!({ "name": tool, "arguments": {}, "requestState": state, "inputResponses": answer }),
            mrtr_caps(),
        )
        .await;
    assert!(text(&r2).contains("state-ok"), "{r2}");

    let tool = "test_input_required_result_tampered_state";
    let r1 = f.call(tool, json!({}), mrtr_caps()).await;
    assert!(r1["inputRequests"].is_object(), "{r1}");
    let tampered = format!("{}-TAMPERED", r1["requestState"].as_str().unwrap());
    let r = f
        .send(
            "tools/call",
            json!({ "name": tool, "arguments": {}, "requestState": tampered, "inputResponses": answer }),
            mrtr_caps(),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mrtr_multiple_inputs_in_one_round() {
    let f = conformance_rt().await;
    let tool = "test_input_required_result_multiple_inputs";
    let r1 = f.call(tool, json!({}), mrtr_caps()).await;
    let requests = r1["inputRequests"].as_object().unwrap();
    let methods: Vec<&str> = requests
        .values()
        .map(|r| r["method"].as_str().unwrap())
        .collect();
    for m in ["elicitation/create", "sampling/createMessage", "roots/list"] {
        assert!(methods.contains(&m), "{r1}");
    }
    assert!(r1["requestState"].is_string());
    let r2 = f
        .ok(
            "tools/call",
            json!({ "name": tool, "arguments": {}, "requestState": r1["requestState"], "inputResponses": {
                "user_name": accept(json!({ "name": "Alice" })),
                "greeting": { "role": "assistant", "content": { "type": "text", "text": "Hello there!" },
                              "model": "test-model", "stopReason": "endTurn" },
                "client_roots": { "roots": [{ "uri": "file:///test/root", "name": "Test Root" }] }
            } }),
            mrtr_caps(),
        )
        .await;
    assert_eq!(r2["resultType"], "complete", "{r2}");
    assert_eq!(
        text(&r2),
        "All inputs received: name=Alice, greeting=Hello there!, roots=file:///test/root"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mrtr_capabilities_asks_only_what_was_declared() {
    let f = conformance_rt().await;
    let r = f
        .call(
            "test_input_required_result_capabilities",
            json!({}),
            json!({ "sampling": {} }),
        )
        .await;
    assert_eq!(r["resultType"], "input_required", "{r}");
    let requests = r["inputRequests"].as_object().unwrap();
    assert!(!requests.is_empty());
    assert!(
        requests
            .values()
            .all(|q| q["method"] == "sampling/createMessage"),
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_fixtures_of_server_stateless() {
    let f = conformance_rt().await;
    let r = f
        .send(
            "tools/call",
            json!({ "name": "test_missing_capability", "arguments": {} }),
            json!({}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32021, "{r}");
    assert_eq!(
        r["error"]["data"]["requiredCapabilities"],
        json!({ "sampling": {} })
    );

    let r = f
        .call(
            "test_streaming_elicitation",
            json!({}),
            json!({ "elicitation": {} }),
        )
        .await;
    assert_eq!(r["resultType"], "input_required", "{r}");

    let r = f.call("test_logging_tool", json!({}), json!({})).await;
    assert_eq!(r["resultType"], "complete", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prompt_asks_for_context_then_answers() {
    let f = conformance_rt().await;
    let name = "test_input_required_result_prompt";
    let r1 = f
        .ok("prompts/get", json!({ "name": name }), mrtr_caps())
        .await;
    assert_eq!(r1["resultType"], "input_required", "{r1}");
    assert!(r1["inputRequests"]["user_context"].is_object(), "{r1}");
    let r2 = f
        .ok(
            "prompts/get",
            json!({ "name": name, "requestState": r1["requestState"],
                    "inputResponses": { "user_context": accept(json!({ "context": "test context" })) } }),
            mrtr_caps(),
        )
        .await;
    assert_eq!(r2["resultType"], "complete", "{r2}");
    assert_eq!(r2["messages"][0]["role"], "user");
    assert!(
        r2["messages"][0]["content"]["text"]
            .as_str()
            .unwrap()
            .contains("test context"),
        "{r2}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_static_resource_is_listed_and_readable() {
    let f = conformance_rt().await;
    let list = f.ok("resources/list", json!({}), json!({})).await;
    let uris: Vec<&Value> = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["uri"])
        .collect();
    assert_eq!(
        uris,
        [&json!("test://static-binary"), &json!("test://static-text")]
    );
    assert!(list["ttlMs"].is_u64() && list["cacheScope"].is_string());
    let read = f
        .ok(
            "resources/read",
            json!({ "uri": "test://static-text" }),
            json!({}),
        )
        .await;
    assert_eq!(read["contents"][0]["uri"], "test://static-text");
    assert_eq!(read["contents"][0]["text"], conformance::STATIC_TEXT);
    assert!(read["ttlMs"].is_u64() && read["cacheScope"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_sleep_task_and_echo() {
    let f = start_with(bench::install).await;
    let task = f.create("sleep_task", json!({ "ms": 50 })).await;
    let done = f.wait_for(&task, "completed", Duration::from_secs(5)).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(text(&done["result"]), "Slept 50 ms.");

    let task = f.create("sleep_task", json!({ "ms": 600_000 })).await;
    f.ok("tasks/cancel", json!({ "taskId": task }), full_caps())
        .await;
    let end = f.wait_for(&task, "cancelled", Duration::from_secs(2)).await;
    assert_eq!(end["status"], "cancelled", "{end}");

    let r = f.call("sleep_task", json!({ "ms": 0 }), json!({})).await;
    assert_eq!(r["resultType"], "complete", "{r}");

    let r = f.call("echo", json!({ "text": "ping" }), full_caps()).await;
    assert_eq!(r["resultType"], "complete", "{r}");
    assert_eq!(text(&r), "ping");
    let r = f
        .send(
            "tools/call",
            json!({ "name": "sleep_task", "arguments": { "ms": -1 } }),
            full_caps(),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
}
