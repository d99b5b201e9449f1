//! Authentication and ownership over real HTTP on 127.0.0.1: the 401/403 refusals and their
//! `WWW-Authenticate` challenges for static tokens and JWTs, the RFC 9728 metadata document,
//! and tasks that another principal cannot tell from unknown ones (the Tasks extension's
//! "bind each task to its requestor's authorization context").

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;

use jsonwebtoken::{EncodingKey, Header};
use mcp_tasks::auth::{self, JwksSource, JwtConfig, JwtVerifier, ProtectedResource};
use mcp_tasks::clock::ManualClock;
use mcp_tasks::store::{Durability, StoreOptions};
use mcp_tasks::tool::{CallToolResult, InputRequest, TaskPolicy, Tool, ToolDescriptor, tool_fn};
use mcp_tasks::transport::http::{self, HttpConfig};
use mcp_tasks::{Owner, Runtime};
use serde_json::{Value, json};
use support::{Response, first_event, post, request, send, token_entry};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

const ISSUER: &str = "https://idp.example.test";
const KEY: &[u8] = include_bytes!("../data/auth/test-rsa.pem");
const START_MS: u64 = 1_900_000_000_000;
const TTL_MS: u64 = 60_000;

struct Server {
    addr: SocketAddr,
    resource: String,
    clock: ManualClock,
    rt: Option<Runtime>,
    stop: Option<oneshot::Sender<()>>,
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn stop(mut self) {
        let rt = self.rt.take().unwrap();
        rt.begin_shutdown();
        let _ = self.stop.take().unwrap().send(());
        let _ = tokio::time::timeout(support::WAIT, &mut self.serving).await;
        rt.shutdown().await;
    }
}

/// A task tool that waits for a confirmation, with a one-minute time to live.
fn confirm() -> Arc<dyn Tool> {
    tool_fn(
        ToolDescriptor::new("confirm", "waits for a confirmation")
            .task_policy(TaskPolicy::Always)
            .ttl_ms(TTL_MS),
        |ctx, _| async move {
            let answer = ctx
                .input(
                    "confirm",
                    InputRequest::elicit_form(
                        "Go on?",
                        json!({ "type": "object", "properties": { "ok": { "type": "boolean" } } }),
                    ),
                )
                .await?;
            Ok(CallToolResult::text(format!("answered {answer}")))
        },
    )
}

const TOKENS: &[(&str, &str, &str, &[&str])] = &[
    ("alice-token", "acme", "alice", &["tasks"]),
    ("bob-token", "acme", "bob", &["tasks"]),
    ("carol-token", "globex", "carol", &["tasks"]),
    // Same principal name as acme's alice, in another tenant.
    ("alice-at-globex-token", "globex", "alice", &["tasks"]),
    ("unscoped-token", "acme", "dave", &[]),
    // acme's alice again, read-only.
    ("alice-reader-token", "acme", "alice", &["tasks:read"]),
];

async fn start() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let file: String = TOKENS
        .iter()
        .map(|(t, tenant, p, scopes)| token_entry(t, tenant, p, scopes))
        .collect();
    let tokens = Arc::new(auth::StaticTokens::parse(&file).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let resource = format!("http://127.0.0.1:{}/mcp", addr.port());
    let jwt = JwtVerifier::new(
        JwtConfig::new(
            JwksSource::Path("tests/data/auth/jwks.json".into()),
            ISSUER,
            &resource,
        )
        .tenant_claim("org"),
    )
    .await
    .unwrap();
    let clock = ManualClock::new(START_MS);
    let rt = Runtime::builder(dir.path().join("tasks.redb"))
        .tool(confirm())
        .clock(Arc::new(clock.clone()))
        .store_options(StoreOptions {
            durability: Durability::None,
            ..StoreOptions::default()
        })
        .start()
        .await
        .unwrap();
    // These tests send many refused credentials from one address on purpose: the failure
    // throttle (tested in `console_security.rs`) would answer 429 to the later ones.
    let config = HttpConfig::default()
        .auth_throttle(0, std::time::Duration::from_secs(60))
        .authenticator(Arc::new(auth::Chain::new(vec![tokens, Arc::new(jwt)])))
        .resource(
            ProtectedResource::new(&resource)
                .authorization_server(ISSUER)
                .scope("tasks"),
        );
    let (stop, rx) = oneshot::channel::<()>();
    let serving = tokio::spawn(http::serve(
        listener,
        http::router(rt.handle(), config),
        async {
            let _ = rx.await;
        },
    ));
    Server {
        addr,
        resource,
        clock,
        rt: Some(rt),
        stop: Some(stop),
        serving,
        _dir: dir,
    }
}

fn jwt(claims: Value) -> String {
    let mut header = Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some("test-key-1".into());
    jsonwebtoken::encode(&header, &claims, &EncodingKey::from_rsa_pem(KEY).unwrap()).unwrap()
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims(server: &Server, sub: &str) -> Value {
    json!({
        "iss": ISSUER,
        "sub": sub,
        "aud": server.resource,
        "exp": now_s() + 600,
        "iat": now_s(),
        "org": "acme",
        "scope": "tasks profile",
    })
}

fn discover() -> Value {
    request(json!(1), "server/discover", json!({}))
}

async fn create(addr: SocketAddr, token: &str) -> String {
    let r = post(
        addr,
        Some(token),
        &request(
            json!(1),
            "tools/call",
            json!({ "name": "confirm", "arguments": {} }),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let task = r.json()["result"]["taskId"].as_str().unwrap().to_owned();
    // The tool asks for its input at once; the tests start from there (on a loaded machine a
    // read right after the handle may still see `working`).
    for _ in 0..500 {
        let r = post(addr, Some(token), &get(&task)).await;
        if r.json()["result"]["status"] == "input_required" {
            return task;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("task {task} did not reach input_required within 10 s");
}

fn get(task: &str) -> Value {
    request(json!(7), "tasks/get", json!({ "taskId": task }))
}

fn update(task: &str) -> Value {
    request(
        json!(7),
        "tasks/update",
        json!({ "taskId": task, "inputResponses": { "confirm": { "action": "accept", "content": { "ok": true } } } }),
    )
}

fn cancel(task: &str) -> Value {
    request(json!(7), "tasks/cancel", json!({ "taskId": task }))
}

fn listen(tasks: &[&str]) -> Value {
    request(
        json!(9),
        "subscriptions/listen",
        json!({ "notifications": { "taskIds": tasks } }),
    )
}

fn challenge(r: &Response) -> &str {
    r.header("www-authenticate")
        .unwrap_or_else(|| panic!("a WWW-Authenticate header: {r:?}"))
}

fn unknown_id() -> String {
    format!("tsk_{}", "0".repeat(32))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_carry_the_right_status_and_challenge() {
    let server = start().await;
    let addr = server.addr;
    let metadata = format!(
        "http://127.0.0.1:{}/.well-known/oauth-protected-resource/mcp",
        addr.port()
    );

    // No token: 401, a bare challenge pointing at the metadata.
    let r = post(addr, None, &discover()).await;
    assert_eq!(r.status, 401);
    assert_eq!(
        challenge(&r),
        format!("Bearer resource_metadata=\"{metadata}\", scope=\"tasks\"")
    );
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Unauthorized")
    );

    // A token nobody issued.
    let r = post(addr, Some("made-up"), &discover()).await;
    assert_eq!(r.status, 401);
    assert!(
        challenge(&r).starts_with(&format!(
            "Bearer resource_metadata=\"{metadata}\", error=\"invalid_token\""
        )),
        "{}",
        challenge(&r)
    );

    // Another scheme.
    let body = serde_json::to_vec(&discover()).unwrap();
    let mut h = support::headers_for(&discover(), None);
    h.push(("Authorization".into(), "Basic YWxpY2U6c2VjcmV0".into()));
    let r = send(addr, "POST", "/mcp", &h, &body).await;
    assert_eq!(r.status, 401);
    assert!(challenge(&r).contains("error=\"invalid_token\""));

    // JWTs: each broken claim is a 401 invalid_token that says which.
    let mut expired = claims(&server, "erin");
    expired["exp"] = json!(now_s() - 3600);
    let mut wrong_aud = claims(&server, "erin");
    wrong_aud["aud"] = json!("https://other.example.test/mcp");
    let mut wrong_iss = claims(&server, "erin");
    wrong_iss["iss"] = json!("https://evil.example.test");
    let mut not_yet = claims(&server, "erin");
    not_yet["nbf"] = json!(now_s() + 3600);
    let mut no_exp = claims(&server, "erin");
    no_exp.as_object_mut().unwrap().remove("exp");
    let mut no_tenant = claims(&server, "erin");
    no_tenant.as_object_mut().unwrap().remove("org");
    for (claims, why) in [
        (expired, "expired"),
        (wrong_aud, "aud"),
        (wrong_iss, "iss"),
        (not_yet, "nbf"),
        (no_exp, "exp"),
        (no_tenant, "org"),
    ] {
        let r = post(addr, Some(&jwt(claims)), &discover()).await;
        assert_eq!(r.status, 401, "{why}");
        let c = challenge(&r);
        assert!(c.contains("error=\"invalid_token\""), "{why}: {c}");
        assert!(c.contains(why), "{why}: {c}");
    }

    // A signature by another key, an unpinned algorithm, a tampered payload.
    let other = include_bytes!("../data/auth/test-rsa-2.pem");
    let mut header = Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some("test-key-1".into());
    let forged = jsonwebtoken::encode(
        &header,
        &claims(&server, "erin"),
        &EncodingKey::from_rsa_pem(other).unwrap(),
    )
    .unwrap();
    let mut hs = Header::new(jsonwebtoken::Algorithm::HS256);
    hs.kid = Some("test-key-1".into());
    let symmetric = jsonwebtoken::encode(
        &hs,
        &claims(&server, "erin"),
        &EncodingKey::from_secret(b"guess").unwrap(),
    )
    .unwrap();
    let good = jwt(claims(&server, "erin"));
    let mut parts: Vec<&str> = good.split('.').collect();
    let tampered_payload = base64::Engine::encode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        serde_json::to_vec(&claims(&server, "mallory")).unwrap(),
    );
    parts[1] = &tampered_payload;
    let tampered = parts.join(".");
    for token in [forged, symmetric, tampered, "not.a.jwt".to_owned()] {
        let r = post(addr, Some(&token), &discover()).await;
        assert_eq!(r.status, 401, "{token}");
        assert!(challenge(&r).contains("error=\"invalid_token\""));
    }

    // Valid credentials without the required scope: 403 insufficient_scope.
    let mut unscoped = claims(&server, "erin");
    unscoped["scope"] = json!("profile");
    for token in [jwt(unscoped), "unscoped-token".to_owned()] {
        let r = post(addr, Some(&token), &discover()).await;
        assert_eq!(r.status, 403);
        assert_eq!(
            challenge(&r),
            format!(
                "Bearer resource_metadata=\"{metadata}\", error=\"insufficient_scope\", scope=\"tasks\""
            )
        );
    }

    // And the good ones.
    for token in [jwt(claims(&server, "erin")), "alice-token".to_owned()] {
        let r = post(addr, Some(&token), &discover()).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert!(r.header("www-authenticate").is_none());
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_resource_metadata_is_served() {
    let server = start().await;
    let expected = json!({
        "resource": server.resource,
        "authorization_servers": [ISSUER],
        "scopes_supported": ["tasks"],
        "bearer_methods_supported": ["header"],
    });
    for path in [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
    ] {
        let r = send(server.addr, "GET", path, &[], b"").await;
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.json(), expected, "{path}");
    }
    server.stop().await;
}

/// The whole response to `body` as `token`: status and exact bytes.
async fn exchange(addr: SocketAddr, token: &str, body: &Value) -> (u16, Vec<u8>) {
    let r = post(addr, Some(token), body).await;
    (r.status, r.body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exercise_2_a_valid_task_id_from_the_wrong_principal_is_refused() {
    let server = start().await;
    let addr = server.addr;
    let task = create(addr, "alice-token").await;
    let unknown = unknown_id();
    let dave_jwt = jwt(claims(&server, "dave"));
    // bob: same tenant; carol: other tenant; alice@globex: same principal name, other
    // tenant; a JWT principal of tenant acme.
    for intruder in [
        "bob-token",
        "carol-token",
        "alice-at-globex-token",
        dave_jwt.as_str(),
    ] {
        for (op, body, unknown_body) in [
            ("get", get(&task), get(&unknown)),
            ("update", update(&task), update(&unknown)),
            ("cancel", cancel(&task), cancel(&unknown)),
        ] {
            let foreign = exchange(addr, intruder, &body).await;
            let missing = exchange(addr, intruder, &unknown_body).await;
            assert_eq!(foreign.0, 400, "{op}");
            assert_eq!(
                foreign,
                missing,
                "{op} of another principal's task must read exactly like an unknown id: {}",
                String::from_utf8_lossy(&foreign.1)
            );
            let error: Value = serde_json::from_slice(&foreign.1).unwrap();
            assert_eq!(
                error["error"]["message"],
                "Invalid params: Failed to retrieve task: Task not found"
            );
        }
        // listen: the foreign id is left out of the acknowledgement exactly like an unknown
        // one.
        let foreign = post(addr, Some(intruder), &listen(&[&task])).await;
        let missing = post(addr, Some(intruder), &listen(&[&unknown])).await;
        assert_eq!(foreign.status, 200);
        assert_eq!(first_event(&foreign), first_event(&missing));
        assert_eq!(
            first_event(&foreign)["params"]["notifications"]["taskIds"],
            json!([])
        );
    }
    // None of it touched alice's task; she still sees and answers it.
    let r = post(addr, Some("alice-token"), &get(&task)).await.json();
    assert_eq!(r["result"]["status"], "input_required", "{r}");
    let r = post(addr, Some("alice-token"), &listen(&[&task])).await;
    assert_eq!(
        first_event(&r)["params"]["notifications"]["taskIds"],
        json!([task])
    );
    let r = post(addr, Some("alice-token"), &update(&task)).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exercise_5_expired_and_malformed_ids_are_told_apart_without_leaking() {
    let server = start().await;
    let addr = server.addr;
    let task = create(addr, "alice-token").await;
    let message = |r: Response| r.json()["error"]["message"].as_str().unwrap().to_owned();

    // The owner is told each case apart.
    let malformed = message(post(addr, Some("alice-token"), &get("tsk_not-an-id")).await);
    assert!(malformed.contains("malformed task id"), "{malformed}");
    let unknown = message(post(addr, Some("alice-token"), &get(&unknown_id())).await);
    assert!(unknown.ends_with("Task not found"), "{unknown}");

    server.clock.advance(TTL_MS + 1);
    for body in [get(&task), update(&task), cancel(&task)] {
        let expired = message(post(addr, Some("alice-token"), &body).await);
        assert!(expired.ends_with("Task has expired"), "{expired}");
    }

    // Anyone else learns nothing: the expired task reads as unknown, byte for byte, and a
    // malformed id is malformed for everyone.
    for intruder in ["bob-token", "carol-token", "alice-at-globex-token"] {
        for (body, unknown_body) in [
            (get(&task), get(&unknown_id())),
            (update(&task), update(&unknown_id())),
            (cancel(&task), cancel(&unknown_id())),
        ] {
            assert_eq!(
                exchange(addr, intruder, &body).await,
                exchange(addr, intruder, &unknown_body).await
            );
        }
        let m = message(post(addr, Some(intruder), &get("tsk_not-an-id")).await);
        assert_eq!(m, malformed);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_principals_are_issuer_and_subject_in_the_claimed_tenant() {
    let server = start().await;
    let addr = server.addr;
    let erin = jwt(claims(&server, "erin"));
    let task = create(addr, &erin).await;
    // The same subject through the same issuer, in a new token: the same owner.
    let erin_again = jwt(claims(&server, "erin"));
    let r = post(addr, Some(&erin_again), &get(&task)).await;
    assert_eq!(r.status, 200);
    // The same subject in another tenant, or with a client_id, is someone else.
    let mut elsewhere = claims(&server, "erin");
    elsewhere["org"] = json!("globex");
    let mut via_client = claims(&server, "erin");
    via_client["client_id"] = json!("some-app");
    for token in [jwt(elsewhere), jwt(via_client)] {
        let (status, body) = exchange(addr, &token, &get(&task)).await;
        assert_eq!(
            (status, body),
            exchange(addr, &token, &get(&unknown_id())).await
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn two_tenants_with_the_same_principal_name_stay_apart_in_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.redb");
    let acme = Owner::new("acme", "alice");
    let globex = Owner::new("globex", "alice");
    let call = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": { "name": "confirm", "arguments": {}, "_meta": support::meta() } });
    let task = {
        let rt = Runtime::builder(&path)
            .tool(confirm())
            .start()
            .await
            .unwrap();
        let r = rt.handle_json(call, &acme).await.unwrap();
        let task = r["result"]["taskId"].as_str().unwrap().to_owned();
        rt.shutdown().await;
        task
    };
    // After a restart, from the stored record alone.
    let rt = Runtime::builder(&path)
        .tool(confirm())
        .start()
        .await
        .unwrap();
    let get = json!({ "jsonrpc": "2.0", "id": 2, "method": "tasks/get",
        "params": { "taskId": task, "_meta": support::meta() } });
    let mine = rt.handle_json(get.clone(), &acme).await.unwrap();
    assert_eq!(mine["result"]["status"], "input_required", "{mine}");
    let theirs = rt.handle_json(get, &globex).await.unwrap();
    assert_eq!(
        theirs["error"]["message"],
        "Invalid params: Failed to retrieve task: Task not found"
    );
    rt.shutdown().await;
}

#[cfg(unix)]
#[tokio::test]
async fn a_new_store_file_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.redb");
    let rt = Runtime::builder(&path).start().await.unwrap();
    rt.shutdown().await;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "mode {mode:o}");
}

/// A `tasks:read` credential reads and follows its principal's tasks but cannot create,
/// answer or cancel one: `403 insufficient_scope`, in both protocol eras, static tokens and
/// JWTs alike, and the task is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_credential_reads_but_never_writes() {
    let server = start().await;
    let addr = server.addr;
    let task = create(addr, "alice-token").await;
    let reader = "alice-reader-token";

    // Reads: tasks/get, subscriptions/listen, discovery.
    let r = post(addr, Some(reader), &get(&task)).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["result"]["taskId"], task);
    assert_eq!(r.json()["result"]["status"], "input_required");
    let r = post(addr, Some(reader), &listen(&[&task])).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        first_event(&r)["params"]["notifications"]["taskIds"],
        json!([task])
    );
    assert_eq!(post(addr, Some(reader), &discover()).await.status, 200);

    // Writes: 403 insufficient_scope, nothing done.
    let call = request(
        json!(3),
        "tools/call",
        json!({ "name": "confirm", "arguments": {} }),
    );
    let jwt_reader = {
        let mut c = claims(&server, "erin");
        c["scope"] = json!("tasks:read profile");
        jwt(c)
    };
    for (token, body) in [
        (reader, call.clone()),
        (reader, update(&task)),
        (reader, cancel(&task)),
        (jwt_reader.as_str(), call.clone()),
    ] {
        let r = post(addr, Some(token), &body).await;
        assert_eq!(
            r.status,
            403,
            "{}: {}",
            body["method"],
            String::from_utf8_lossy(&r.body)
        );
        assert!(
            challenge(&r).contains("error=\"insufficient_scope\""),
            "{}",
            challenge(&r)
        );
        assert!(
            r.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("tasks:read"),
            "{}",
            String::from_utf8_lossy(&r.body)
        );
    }
    // The JWT reader reads (its own, empty, view).
    assert_eq!(post(addr, Some(&jwt_reader), &discover()).await.status, 200);
    let r = post(addr, Some("alice-token"), &get(&task)).await;
    assert_eq!(r.json()["result"]["status"], "input_required");
    assert_eq!(
        mcp_tasks::internals::runtime_store(server.rt.as_ref().unwrap())
            .tasks()
            .await
            .unwrap()
            .len(),
        1
    );

    // The legacy era: a session, a legacy tasks/get, and the same refusals.
    let url = format!("http://{addr}/mcp");
    let mut legacy = support::legacy::Client::new(&url).with_token(reader);
    legacy.initialize(json!({})).await;
    let got = legacy
        .result(1, "tasks/get", json!({ "taskId": task }))
        .await;
    assert_eq!(got["taskId"], task, "{got}");
    for body in [
        json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": { "name": "confirm", "arguments": {}, "task": {} } }),
        json!({ "jsonrpc": "2.0", "id": 3, "method": "tasks/cancel", "params": { "taskId": task } }),
        json!({ "jsonrpc": "2.0", "id": 4, "result": { "action": "accept", "content": { "ok": true } } }),
    ] {
        let status = legacy.post(&body).await.status();
        assert_eq!(status, 403, "{body}");
    }
    let r = post(addr, Some("alice-token"), &get(&task)).await;
    assert_eq!(r.json()["result"]["status"], "input_required");
    server.stop().await;
}
