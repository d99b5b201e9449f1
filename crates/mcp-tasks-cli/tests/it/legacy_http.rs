//! Legacy (`2025-11-25`) clients over Streamable HTTP on the same endpoint as `2026-07-28`
//! ones: sessions (issued, required, ended, bound to the caller, valid across a restart),
//! server-to-client input requests of synchronous calls, logging, and the experimental tasks
//! over the durable runtime (`params.task`, `tasks/get|result|list|cancel`, status
//! notifications and input requests on the session stream, `Last-Event-ID`), each with a
//! restart of the runtime in the middle.

use crate::support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use mcp_tasks::auth::{self, AuthError, Identity};
use mcp_tasks::transport::http::{self, HttpConfig};
use mcp_tasks::{Owner, Runtime};
use serde_json::{Value, json};
use support::legacy::{Client, LEGACY, Reply};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A served runtime with the conformance fixtures; principals come from `X-Principal`.
struct Server {
    rt: Runtime,
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    serving: JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(store: &Path) -> Self {
        Self::start_with(store, mcp_tasks::quota::Quotas::default()).await
    }

    async fn start_with(store: &Path, quotas: mcp_tasks::quota::Quotas) -> Self {
        let rt = mcp_tasks_testkit::fixtures::conformance::install(Runtime::builder(store))
            .quotas(quotas)
            .start()
            .await
            .expect("the runtime starts");
        let config = HttpConfig::default().authenticator(auth::from_fn(|parts| {
            let principal = parts
                .headers
                .get("x-principal")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("alice")
                .to_owned();
            async move { Ok::<_, AuthError>(Identity::new(Owner::new("t", principal))) }
        }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, rx) = oneshot::channel::<()>();
        let serving = tokio::spawn(http::serve(
            listener,
            http::router(rt.handle(), config),
            async {
                let _ = rx.await;
            },
        ));
        Self {
            rt,
            addr,
            stop,
            serving,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Stops serving and shuts the runtime down (tasks stay in the store).
    async fn stop(self) {
        self.rt.begin_shutdown();
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.serving).await;
        self.rt.shutdown().await;
    }
}

fn as_principal(client: &Client, principal: &str) -> Client {
    let mut c = client.clone();
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-principal", principal.parse().unwrap());
    c.http = reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap();
    c
}

fn caps() -> Value {
    json!({ "elicitation": {}, "sampling": {}, "tasks": { "list": {}, "cancel": {} } })
}

#[tokio::test]
async fn sessions_are_issued_required_bound_and_ended() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.redb")).await;
    let mut client = Client::new(&server.url());
    let init = client.initialize(caps()).await;
    assert_eq!(init["protocolVersion"], LEGACY);
    assert_eq!(init["serverInfo"]["name"], "mcp-tasks");
    assert!(init["capabilities"]["tasks"]["requests"]["tools"]["call"].is_object());
    assert!(init["capabilities"]["logging"].is_object());
    let id = client.session.clone().unwrap();
    assert!(id.bytes().all(|b| (0x21..=0x7e).contains(&b)));

    // An older version is echoed, an unknown one gets our latest.
    for (asked, got) in [("2025-06-18", "2025-06-18"), ("2024-01-01", LEGACY)] {
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": { "protocolVersion": asked, "capabilities": {},
                        "clientInfo": { "name": "x", "version": "1" } } });
        let r = Client::new(&server.url()).post(&body).await.json();
        assert_eq!(r["result"]["protocolVersion"], got);
    }

    assert_eq!(client.result(1, "ping", json!({})).await, json!({}));

    // Without the session header a legacy request is a modern one: -32602, no session.
    let bare = Client::new(&server.url());
    let r = bare
        .post(&json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/list" }))
        .await;
    assert_eq!(r.status(), 400);

    // Another principal cannot use the session; a forged one is unknown.
    let mallory = as_principal(&client, "mallory");
    let r = mallory
        .post(&json!({ "jsonrpc": "2.0", "id": 3, "method": "ping" }))
        .await;
    assert_eq!(r.status(), 404);
    let mut forged = client.clone();
    forged.session = Some(format!("{id}x"));
    let r = forged
        .post(&json!({ "jsonrpc": "2.0", "id": 3, "method": "ping" }))
        .await;
    assert_eq!(r.status(), 404);

    // A modern request that carries the header stays modern (tasks/list is gone there).
    let modern = json!({ "jsonrpc": "2.0", "id": 4, "method": "tasks/list", "params": { "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": { "extensions": { "io.modelcontextprotocol/tasks": {} } } } } });
    let r = client
        .http
        .post(&client.url)
        .header("Mcp-Session-Id", &id)
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tasks/list")
        .header("Content-Type", "application/json")
        .body(serde_json::to_vec(&modern).unwrap())
        .send()
        .await
        .unwrap();
    let body: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], -32601, "{body}");

    // The session survives a restart of the runtime on the same store.
    let url_before = server.url();
    server.stop().await;
    let server = Server::start(&dir.path().join("s.redb")).await;
    assert_ne!(server.url(), url_before);
    client.url = server.url();
    assert_eq!(client.result(5, "ping", json!({})).await, json!({}));

    // DELETE ends it, for every later request.
    assert_eq!(client.delete().await, 200);
    let r = client
        .post(&json!({ "jsonrpc": "2.0", "id": 6, "method": "ping" }))
        .await;
    assert_eq!(r.status(), 404);
    server.stop().await;
}

#[tokio::test]
async fn synchronous_calls_ask_through_server_requests_and_log() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.redb")).await;
    let mut client = Client::new(&server.url());
    client.initialize(caps()).await;

    // tools/list shows each tool's task support.
    let tools = client.result(1, "tools/list", json!({})).await;
    let support = |name: &str| {
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .map(|t| t["execution"]["taskSupport"].clone())
            .unwrap()
    };
    assert_eq!(support("greet"), "forbidden");
    assert_eq!(support("slow_compute"), "optional");
    assert_eq!(support("confirm_delete"), "required");
    assert!(tools.get("resultType").is_none() && tools.get("ttlMs").is_none());

    // An elicitation is a server-to-client request on the response stream.
    let call = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": { "name": "test_elicitation", "arguments": { "message": "Who?" } } });
    let Reply::Stream(mut sse) = client.post(&call).await else {
        panic!("an SSE response")
    };
    let (event_id, request) = sse.next().await.unwrap();
    assert!(event_id.is_some(), "SSE events carry ids");
    assert_eq!(request["method"], "elicitation/create");
    assert_eq!(request["params"]["message"], "Who?");
    client
        .answer(
            &request,
            json!({ "action": "accept", "content": { "username": "u", "email": "e@x" } }),
        )
        .await;
    let response = sse
        .until("the response", |m| m.get("id") == Some(&json!(2)))
        .await;
    let text = response["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("\"username\":\"u\""), "{text}");
    assert!(response["result"].get("resultType").is_none());

    // Logging: nothing before setLevel, three messages after.
    let call = json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": { "name": "test_tool_with_logging", "arguments": {} } });
    assert!(matches!(client.post(&call).await, Reply::Json(200, _)));
    assert_eq!(
        client
            .result(4, "logging/setLevel", json!({ "level": "info" }))
            .await,
        json!({})
    );
    let call = json!({ "jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": { "name": "test_tool_with_logging", "arguments": {} } });
    let Reply::Stream(mut sse) = client.post(&call).await else {
        panic!("an SSE response")
    };
    let mut logs = 0;
    while let Some(m) = sse.message().await {
        if m["method"] == "notifications/message" {
            assert_eq!(m["params"]["level"], "info");
            logs += 1;
        }
    }
    assert_eq!(logs, 3);
    let r = client
        .call(6, "logging/setLevel", json!({ "level": "loud" }))
        .await;
    assert_eq!(r["error"]["code"], -32602);

    // A required-task tool without params.task, and a forbidden one with it: -32601.
    let r = client
        .call(
            7,
            "tools/call",
            json!({ "name": "confirm_delete", "arguments": { "filename": "f" } }),
        )
        .await;
    assert_eq!(r["error"]["code"], -32601, "{r}");
    let r = client
        .call(
            8,
            "tools/call",
            json!({ "name": "greet", "arguments": { "name": "x" }, "task": {} }),
        )
        .await;
    assert_eq!(r["error"]["code"], -32601, "{r}");

    // Subscriptions are accepted and kept.
    for (id, method) in [(9, "resources/subscribe"), (10, "resources/unsubscribe")] {
        assert_eq!(
            client
                .result(id, method, json!({ "uri": "test://static-text" }))
                .await,
            json!({})
        );
    }
    server.stop().await;
}

fn task_of(create: &Value) -> String {
    create["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a CreateTaskResult: {create}"))
        .to_owned()
}

#[tokio::test]
async fn legacy_tasks_poll_list_block_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.redb");
    let server = Server::start(&store).await;
    let mut client = Client::new(&server.url());
    client.initialize(caps()).await;

    let create = client
        .result(
            1,
            "tools/call",
            json!({ "name": "slow_compute",
            "arguments": { "seconds": 2, "label": "legacy" }, "task": { "ttl": 60000 } }),
        )
        .await;
    let task = task_of(&create);
    assert_eq!(create["task"]["status"], "working");
    assert!(create["task"].get("ttl").is_some() && create["task"].get("ttlMs").is_none());
    assert!(create["task"]["pollInterval"].is_u64());

    let got = client
        .result(2, "tasks/get", json!({ "taskId": task }))
        .await;
    assert_eq!(got["taskId"], task.as_str());
    assert!(got.get("result").is_none());
    assert_eq!(
        got["ttl"], create["task"]["ttl"],
        "tasks/get reports the actual ttl"
    );
    assert!(got["ttl"].is_u64());

    // One task model: a 2026-07-28 request of the same caller reads the same task.
    let modern = json!({ "jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {
        "taskId": task, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": { "extensions": { "io.modelcontextprotocol/tasks": {} } } } } });
    let r = client
        .http
        .post(&client.url)
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tasks/get")
        .header("Mcp-Name", &task)
        .header("Content-Type", "application/json")
        .body(serde_json::to_vec(&modern).unwrap())
        .send()
        .await
        .unwrap();
    let body: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(body["result"]["taskId"], task.as_str(), "{body}");
    assert_eq!(body["result"]["resultType"], "complete");
    assert!(body["result"]["ttlMs"].is_u64());

    // tasks/list: the owner's tasks only.
    let list = client.result(3, "tasks/list", json!({})).await;
    assert!(
        list["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["taskId"] == task.as_str())
    );
    let mut bob = as_principal(&Client::new(&server.url()), "bob");
    bob.initialize(caps()).await;
    let theirs = bob.result(4, "tasks/list", json!({})).await;
    assert_eq!(theirs["tasks"], json!([]));
    let r = bob.call(5, "tasks/get", json!({ "taskId": task })).await;
    assert_eq!(
        r["error"]["code"], -32602,
        "a foreign task reads as unknown"
    );
    let r = client
        .call(6, "tasks/list", json!({ "cursor": "garbage" }))
        .await;
    assert_eq!(r["error"]["code"], -32602);

    // A restart in the middle: the session and the task go on.
    server.stop().await;
    let server = Server::start(&store).await;
    client.url = server.url();
    let got = client
        .result(7, "tasks/get", json!({ "taskId": task }))
        .await;
    assert_eq!(got["taskId"], task.as_str());

    // tasks/result blocks until the task is done, then answers the tool's result.
    let done = client
        .call(8, "tasks/result", json!({ "taskId": task }))
        .await;
    let result = &done["result"];
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        task.as_str()
    );
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("legacy"),
        "{done}"
    );
    let got = client
        .result(9, "tasks/get", json!({ "taskId": task }))
        .await;
    assert_eq!(got["status"], "completed");

    // Cancelling a finished task is -32602; a working one ends cancelled.
    let r = client
        .call(10, "tasks/cancel", json!({ "taskId": task }))
        .await;
    assert_eq!(r["error"]["code"], -32602);
    let long = task_of(
        &client
            .result(
                11,
                "tools/call",
                json!({ "name": "slow_compute",
                "arguments": { "seconds": 60 }, "task": {} }),
            )
            .await,
    );
    let cancelled = client
        .result(12, "tasks/cancel", json!({ "taskId": long }))
        .await;
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["taskId"], long.as_str());

    // A failing tool: tasks/result answers its JSON-RPC error.
    let failing = task_of(
        &client
            .result(
                13,
                "tools/call",
                json!({ "name": "protocol_error_job", "arguments": {}, "task": {} }),
            )
            .await,
    );
    let r = client
        .call(14, "tasks/result", json!({ "taskId": failing }))
        .await;
    assert!(r["error"]["code"].is_i64(), "{r}");
    server.stop().await;
}

#[tokio::test]
async fn task_input_goes_through_the_session_stream_and_resumes_the_task() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.redb");
    let server = Server::start(&store).await;
    let mut client = Client::new(&server.url());
    client.initialize(caps()).await;

    let Reply::Stream(mut standing) = client.get_stream(None).await else {
        panic!("the GET stream")
    };
    let task = task_of(
        &client
            .result(
                1,
                "tools/call",
                json!({ "name": "confirm_delete",
                "arguments": { "filename": "a.txt" }, "task": {} }),
            )
            .await,
    );
    // Status notifications and the elicitation arrive on the standing stream.
    let status = standing
        .until("a status notification", |m| {
            m["method"] == "notifications/tasks/status" && m["params"]["taskId"] == task.as_str()
        })
        .await;
    assert!(status["params"].get("ttl").is_some());
    let ask = standing
        .until("the elicitation", |m| m["method"] == "elicitation/create")
        .await;
    assert_eq!(
        ask["params"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        task.as_str()
    );
    drop(standing);

    // Restart before answering: the question is asked again on tasks/result.
    server.stop().await;
    let server = Server::start(&store).await;
    client.url = server.url();
    let got = client
        .result(2, "tasks/get", json!({ "taskId": task }))
        .await;
    assert_eq!(got["status"], "input_required");
    let body = json!({ "jsonrpc": "2.0", "id": 3, "method": "tasks/result", "params": { "taskId": task } });
    let Reply::Stream(mut result) = client.post(&body).await else {
        panic!("tasks/result streams while the task waits")
    };
    let ask = result
        .until("the elicitation", |m| m["method"] == "elicitation/create")
        .await;
    client
        .answer(
            &ask,
            json!({ "action": "accept", "content": { "confirm": true } }),
        )
        .await;
    let done = result
        .until("the result", |m| m.get("id") == Some(&json!(3)))
        .await;
    assert_eq!(
        done["result"]["content"][0]["text"], "Deleted a.txt.",
        "{done}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_disconnected_stream_resumes_with_last_event_id() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.redb")).await;
    let mut client = Client::new(&server.url());
    client.initialize(caps()).await;
    let call = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": { "name": "test_elicitation", "arguments": { "message": "Who?" } } });
    let Reply::Stream(mut sse) = client.post(&call).await else {
        panic!("an SSE response")
    };
    let (event_id, request) = sse.next().await.unwrap();
    drop(sse); // the client goes away before the response
    client
        .answer(
            &request,
            json!({ "action": "accept", "content": { "username": "u", "email": "e" } }),
        )
        .await;
    let Reply::Stream(mut resumed) = client.get_stream(event_id.as_deref()).await else {
        panic!("the resumed stream")
    };
    let response = resumed
        .until("the response", |m| m.get("id") == Some(&json!(1)))
        .await;
    assert!(
        response["result"]["content"][0]["text"].is_string(),
        "{response}"
    );
    server.stop().await;
}

#[tokio::test]
async fn past_the_listen_quota_tasks_are_followed_by_polling() {
    let dir = tempfile::tempdir().unwrap();
    let mut quotas = mcp_tasks::quota::Quotas::default();
    quotas.max_listens = 1;
    let server = Server::start_with(&dir.path().join("s.redb"), quotas).await;
    let mut client = Client::new(&server.url());
    client.initialize(caps()).await;
    let mut tasks = Vec::new();
    for id in 1..=3 {
        let create = client
            .result(
                id,
                "tools/call",
                json!({ "name": "slow_compute",
                "arguments": { "seconds": 1, "label": format!("t{id}") }, "task": {} }),
            )
            .await;
        tasks.push(task_of(&create));
    }
    let asking = task_of(
        &client
            .result(
                4,
                "tools/call",
                json!({ "name": "confirm_delete",
                "arguments": { "filename": "q.txt" }, "task": {} }),
            )
            .await,
    );
    // Every tasks/result gets its answer although at most one listen is allowed.
    let waits = tasks.iter().enumerate().map(|(i, task)| {
        let client = client.clone();
        let task = task.clone();
        async move {
            client
                .call(10 + i as u64, "tasks/result", json!({ "taskId": task }))
                .await
        }
    });
    for (i, done) in futures::future::join_all(waits)
        .await
        .into_iter()
        .enumerate()
    {
        let text = done["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        assert!(text.contains(&format!("`t{}`", i + 1)), "{done}");
    }
    let body = json!({ "jsonrpc": "2.0", "id": 20, "method": "tasks/result", "params": { "taskId": asking } });
    let Reply::Stream(mut result) = client.post(&body).await else {
        panic!("tasks/result streams while the task waits")
    };
    let ask = result
        .until("the elicitation", |m| m["method"] == "elicitation/create")
        .await;
    client
        .answer(
            &ask,
            json!({ "action": "accept", "content": { "confirm": false } }),
        )
        .await;
    let done = result
        .until("the result", |m| m.get("id") == Some(&json!(20)))
        .await;
    assert_eq!(
        done["result"]["content"][0]["text"],
        "Kept q.txt: the deletion was not confirmed."
    );
    server.stop().await;
}

/// An `initialize` whose answer the test looks at (status, `Retry-After`, body).
async fn try_initialize(client: &Client) -> reqwest::Response {
    let body = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": caps() } });
    client
        .http
        .post(&client.url)
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .send()
        .await
        .expect("initialize is answered")
}

/// Polls `initialize` until it answers `want` (bounded).
async fn initialize_answers(client: &Client, want: u16) -> reqwest::Response {
    for _ in 0..100 {
        let r = try_initialize(client).await;
        if r.status() == want {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("initialize never answered {want}");
}

#[tokio::test]
async fn past_max_sessions_in_use_a_new_session_is_refused_with_429() {
    let dir = tempfile::tempdir().unwrap();
    let mut quotas = mcp_tasks::quota::Quotas::default();
    quotas.max_sessions = 2;
    let server = Server::start_with(&dir.path().join("s.redb"), quotas).await;
    let mut a = Client::new(&server.url());
    let mut b = Client::new(&server.url());
    a.initialize(caps()).await;
    b.initialize(caps()).await;
    // Unused sessions give way to new ones: a client that opens a session per run is served.
    for _ in 0..5 {
        assert_eq!(try_initialize(&a).await.status(), 200);
    }
    // Two sessions with a client reading them: a third is refused, with Retry-After.
    (a.session, b.session) = (None, None);
    a.initialize(caps()).await;
    b.initialize(caps()).await;
    let Reply::Stream(sa) = a.get_stream(None).await else {
        panic!("a's stream")
    };
    let Reply::Stream(_sb) = b.get_stream(None).await else {
        panic!("b's stream")
    };
    let refused = initialize_answers(&a, 429).await;
    assert!(refused.headers().get("retry-after").is_some());
    let body: Value = serde_json::from_str(&refused.text().await.unwrap()).unwrap();
    assert_eq!(body["error"]["data"]["quota"], "sessions", "{body}");
    // Another principal is counted apart.
    assert_eq!(
        try_initialize(&as_principal(&a, "carol")).await.status(),
        200
    );
    // Once a's client leaves, a new session takes its place.
    drop(sa);
    initialize_answers(&a, 200).await;
    server.stop().await;
}

#[tokio::test]
async fn an_abandoned_tasks_result_stops_when_its_client_disconnects() {
    let dir = tempfile::tempdir().unwrap();
    let mut quotas = mcp_tasks::quota::Quotas::default();
    quotas.max_sessions = 1;
    let server = Server::start_with(&dir.path().join("s.redb"), quotas).await;
    let mut client = Client::new(&server.url());
    client.initialize(caps()).await;
    let task = task_of(
        &client
            .result(
                1,
                "tools/call",
                json!({ "name": "slow_compute",
                    "arguments": { "seconds": 300, "label": "long" }, "task": {} }),
            )
            .await,
    );
    // The session is in use while its tasks/result waits: no other session of the principal.
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .call(2, "tasks/result", json!({ "taskId": task }))
                .await
        })
    };
    initialize_answers(&client, 429).await;
    // The client goes away: its tasks/result stops, and the session is free again.
    waiting.abort();
    let _ = waiting.await;
    initialize_answers(&client, 200).await;
    server.stop().await;
}

#[tokio::test]
async fn a_refused_session_id_gets_a_404_without_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.redb")).await;
    let mut alice = Client::new(&server.url());
    alice.initialize(caps()).await;
    let ping = json!({ "jsonrpc": "2.0", "id": 1, "method": "ping" });
    let bob = as_principal(&alice, "bob");
    let mut tampered = alice.clone();
    tampered.session = alice.session.as_ref().map(|s| format!("{s}x"));
    let mut bodies = Vec::new();
    let not_found = |reply: Reply| match reply {
        Reply::Status(404, body) => body,
        Reply::Json(404, body) => body.to_string(),
        other => panic!("404 expected, got {}", other.status()),
    };
    for client in [&bob, &tampered] {
        bodies.push(not_found(client.post(&ping).await));
    }
    assert_eq!(alice.delete().await, 200);
    bodies.push(not_found(alice.post(&ping).await));
    for body in &bodies {
        for why in [
            "another caller",
            "signature",
            "expired",
            "ended",
            "malformed",
        ] {
            assert!(!body.contains(why), "{body}");
        }
    }
    assert!(bodies.iter().all(|b| b == &bodies[0]), "{bodies:?}");
    server.stop().await;
}
