//! The console against hostile web pages, stolen cookies and careless deployments, over real
//! HTTP on 127.0.0.1:0: a foreign `Host` (DNS rebinding) refused on every route before any
//! handler runs; a console on a non-loopback address without authentication refused at start;
//! one scope policy for the MCP endpoint and the console; sessions (not tokens) in cookies,
//! with their attributes, expiry and logout; refused credentials throttled on both surfaces;
//! a revoked credential's streams closed; streams per principal capped. The browser side of
//! rebinding is in `console_browser.rs`.

use std::sync::Arc;
use std::time::Duration;

use mcp_tasks::auth::{ProtectedResource, StaticTokens};
use mcp_tasks::clock::ManualClock;
use mcp_tasks::console::{Console, SessionPolicy};
use mcp_tasks::transport::http::{self, HttpConfig};
use mcp_tasks::{Owner, Runtime};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::backend::{Backend, Place};
use crate::console::{create, http as request, serve, start, wait_status, wait_until_answers};
use crate::support::embedded::req;
use crate::support::token_entry;

/// One raw HTTP/1.1 exchange with a `Host` of our choosing (clients set it from the URL):
/// status and body.
async fn raw(
    base: &str,
    method: &str,
    path: &str,
    host: &str,
    extra: &[(&str, &str)],
) -> (u16, String) {
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" {
        head.push_str("Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}");
    } else {
        head.push_str("\r\n");
    }
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    // An event stream never ends: what arrives within a second is enough.
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Every route of the console, with a method.
fn routes(task: &str) -> Vec<(&'static str, String)> {
    vec![
        ("GET", "/".into()),
        ("GET", "/tasks?status=working".into()),
        ("GET", format!("/tasks/{task}")),
        ("GET", "/assets/console.js".into()),
        ("GET", "/api/overview".into()),
        ("GET", "/api/tasks".into()),
        ("GET", "/api/tasks/count".into()),
        ("GET", format!("/api/tasks/{task}")),
        ("GET", "/api/events".into()),
        ("POST", "/api/session".into()),
        ("DELETE", "/api/session".into()),
        ("POST", format!("/api/tasks/{task}/cancel")),
        ("POST", "/api/cancel".into()),
        ("POST", "/api/purge".into()),
        ("GET", "/no/such/page".into()),
    ]
}

/// The quick start's console (no authentication, actions on): a page on a rebinding name
/// gets a 403 from every route, with none of the console's data; the loopback names, and a
/// name the operator allows, are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_host_is_refused_on_every_console_route() {
    let place = Place::new(Backend::Redb).await.unwrap();
    let rt = start(&place).await;
    let me = Owner::anonymous();
    let task = create(&rt, &me, "slow", json!({ "message": "payroll-2026.xlsx" })).await;
    wait_status(&rt, &me, &task, "working").await;
    let console = serve(Console::new(&rt).actions(true)).await;
    let base = &console.base;
    let port = base.rsplit(':').next().unwrap();
    let evil = format!("attacker.example:{port}");
    for (method, path) in routes(&task) {
        let (status, body) = raw(base, method, &path, &evil, &[]).await;
        assert_eq!(status, 403, "{method} {path} with Host {evil}: {body}");
        assert!(
            !body.contains("csrf") && !body.contains("payroll") && !body.contains(&task),
            "{method} {path}: {body}"
        );
        // A foreign Origin with a local Host too.
        let (status, _) = raw(
            base,
            method,
            &path,
            &format!("127.0.0.1:{port}"),
            &[("Origin", &format!("http://{evil}"))],
        )
        .await;
        assert_eq!(status, 403, "{method} {path} with Origin http://{evil}");
    }
    // Nothing was cancelled.
    wait_status(&rt, &me, &task, "working").await;
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "[::1]".to_owned(),
    ] {
        let (status, body) = raw(base, "GET", "/api/overview", &host, &[]).await;
        assert_eq!(status, 200, "Host {host}: {body}");
    }
    drop(console);

    // A name the operator allows (as `serve --allowed-host` does for the endpoint).
    let console = serve(Console::new(&rt).allow_host("console.example")).await;
    let (status, body) = raw(
        &console.base,
        "GET",
        "/api/overview",
        "console.example:443",
        &[],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = raw(&console.base, "GET", "/api/overview", &evil, &[]).await;
    assert_eq!(status, 403);
    drop(console);
    rt.shutdown().await;
    place.finish().await;
}

/// The MCP endpoint of `rt` with `config` on 127.0.0.1:0: its URL, and the sender that stops it.
async fn serve_mcp(rt: &Runtime, config: HttpConfig) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mcp = format!("http://{}/mcp", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(http::serve(
        listener,
        http::router(rt.handle(), config),
        async move {
            let _ = stopped.await;
        },
    ));
    (mcp, stop)
}

/// The credentials of the scope tests, with `--auth-scope tasks` on the endpoint.
fn scoped_tokens() -> Arc<StaticTokens> {
    let toml = [
        token_entry("alice", "acme", "alice", &["tasks"]),
        token_entry("no-scope", "acme", "bob", &[]),
        token_entry("root", "ops", "root", &["admin", "tasks"]),
        token_entry("admin-no-scope", "ops", "eve", &["admin"]),
        token_entry("read-admin", "ops", "auditor", &["tasks:read", "admin"]),
        token_entry("read", "acme", "reader", &["tasks:read"]),
    ]
    .concat();
    Arc::new(StaticTokens::parse(&toml).expect("the tokens parse"))
}

/// The MCP endpoint and the console agree for every credential: one the endpoint refuses
/// gets nothing from the console; a read-only one reads on both and acts on neither; actions
/// need `admin` plus the endpoint's scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_applies_the_endpoints_scope_policy() {
    let place = Place::new(Backend::Redb).await.unwrap();
    let rt = start(&place).await;
    let tokens = scoped_tokens();
    let carol = Owner::new("globex", "carol");
    let target = create(&rt, &carol, "slow", json!({})).await;
    wait_status(&rt, &carol, &target, "working").await;

    let config = HttpConfig::default()
        .authenticator(tokens.clone())
        .resource(ProtectedResource::new("http://127.0.0.1/mcp").scope("tasks"));
    let (mcp, stop) = serve_mcp(&rt, config).await;
    let console = serve(
        Console::new(&rt)
            .authenticator(tokens)
            .actions(true)
            .required_scopes(["tasks"]),
    )
    .await;
    let base = &console.base;

    // (token, endpoint reads, endpoint writes, console reads, console acts)
    let matrix = [
        ("alice", true, true, true, false),
        ("no-scope", false, false, false, false),
        ("admin-no-scope", false, false, false, false),
        ("read-admin", true, false, true, false),
        ("read", true, false, true, false),
        // Last: it cancels the task the others could not.
        ("root", true, true, true, true),
    ];
    for (token, reads, writes, console_reads, console_acts) in matrix {
        let auth = format!("Bearer {token}");
        let h = [("authorization", auth.as_str())];
        let mcp_status = |method: &'static str, params: Value| {
            let body = req(1, method, params, true);
            let mcp = mcp.clone();
            let auth = auth.clone();
            async move {
                let mut r = reqwest::Client::new()
                    .post(&mcp)
                    .header("authorization", auth)
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream")
                    .header("mcp-protocol-version", mcp_tasks::PROTOCOL_VERSION)
                    .header("mcp-method", method);
                if let Some(name) = body["params"]["name"]
                    .as_str()
                    .or(body["params"]["taskId"].as_str())
                {
                    r = r.header("mcp-name", name);
                }
                r.body(body.to_string())
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            }
        };
        let read = mcp_status("tasks/get", json!({ "taskId": "tsk_unknown" })).await;
        assert_eq!(read != 403, reads, "{token}: endpoint read answered {read}");
        let write = mcp_status("tools/call", json!({ "name": "quick", "arguments": {} })).await;
        assert_eq!(
            write != 403,
            writes,
            "{token}: endpoint write answered {write}"
        );

        let (status, body, _) =
            request(Method::GET, &format!("{base}/api/overview"), &h, None).await;
        assert_eq!(
            status == 200,
            console_reads,
            "{token}: console read {status} {body}"
        );
        if !console_reads {
            assert_eq!(status, 403, "{token}: {body}");
            assert!(body.get("csrf").is_none());
        }
        let (status, body, _) = request(
            Method::POST,
            &format!("{base}/api/tasks/{target}/cancel"),
            &h,
            Some(json!({})),
        )
        .await;
        assert_eq!(
            status == 200,
            console_acts,
            "{token}: console act {status} {body}"
        );
        if !console_acts {
            assert_eq!(status, 403, "{token}: {body}");
            wait_status(&rt, &carol, &target, "working").await;
        } else {
            wait_status(&rt, &carol, &target, "cancelled").await;
        }
        // The login form follows the same policy: no session for a refused credential.
        let (status, _, headers) = request(
            Method::POST,
            &format!("{base}/api/session"),
            &[],
            Some(json!({ "token": token })),
        )
        .await;
        assert_eq!(status == 204, console_reads, "{token}: login {status}");
        assert_eq!(
            headers.get("set-cookie").is_some(),
            console_reads,
            "{token}"
        );
    }
    // The overview tells a read-only viewer it cannot act.
    let (_, o, _) = request(
        Method::GET,
        &format!("{base}/api/overview"),
        &[("authorization", "Bearer read-admin")],
        None,
    )
    .await;
    assert_eq!(o["viewer"]["readOnly"], true);
    assert_eq!(o["actions"], false);
    let _ = stop.send(());
    drop(console);
    rt.shutdown().await;
    place.finish().await;
}

/// The value and attributes of a `Set-Cookie` header.
fn set_cookie(headers: &reqwest::header::HeaderMap) -> (String, String) {
    let cookie = headers["set-cookie"].to_str().unwrap().to_owned();
    let pair = cookie.split(';').next().unwrap().trim().to_owned();
    (pair, cookie)
}

async fn login(base: &str, token: &str, extra: &[(&str, &str)]) -> reqwest::header::HeaderMap {
    let (status, body, headers) = request(
        Method::POST,
        &format!("{base}/api/session"),
        extra,
        Some(json!({ "token": token })),
    )
    .await;
    assert_eq!(status, 204, "login: {body}");
    headers
}

/// The console sessions the store holds (key, value as text).
async fn sessions_stored(rt: &Runtime) -> Vec<(String, String)> {
    mcp_tasks::internals::runtime_store(rt)
        .meta_page("console_session/", None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
        .collect()
}

/// A login opens a session: the cookie carries a random id, never the token, scoped to the
/// console's path, `HttpOnly`, `SameSite=Strict`, `Secure` (`__Host-`) over https; the store
/// keeps neither the id nor the token; logout, the session's lifetime and its idle timeout
/// end it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_not_tokens_in_cookies() {
    let place = Place::new(Backend::Redb).await.unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    let mut builder = place
        .builder("console")
        .await
        .clock(Arc::new(clock.clone()));
    for tool in crate::console::tools() {
        builder = builder.tool(tool);
    }
    let rt: Runtime = builder.start().await.unwrap();
    let tokens = Arc::new(
        StaticTokens::parse(&token_entry("root-token-secret", "ops", "root", &["admin"])).unwrap(),
    );
    let policy = SessionPolicy {
        ttl: Duration::from_secs(3600),
        idle: Duration::from_secs(600),
    };
    let console = serve(
        Console::new(&rt)
            .authenticator(tokens.clone())
            .sessions(policy)
            .trusted_proxy("127.0.0.1".parse().unwrap()),
    )
    .await;
    let base = &console.base;

    let (pair, cookie) = set_cookie(&login(base, "root-token-secret", &[]).await);
    let (name, value) = pair.split_once('=').unwrap();
    assert_eq!(name, "mcp_tasks_console");
    assert_eq!(value.len(), 43, "{cookie}");
    assert!(!cookie.contains("root-token"), "{cookie}");
    for attribute in ["Path=/", "HttpOnly", "SameSite=Strict", "Max-Age=3600"] {
        assert!(cookie.contains(attribute), "{attribute} in {cookie}");
    }
    assert!(!cookie.contains("Secure"), "plain http: {cookie}");
    // The store holds the session under a hash, its credential sealed.
    let stored = sessions_stored(&rt).await;
    assert_eq!(stored.len(), 1);
    let (key, record) = &stored[0];
    assert!(
        !key.contains(value) && !record.contains(value),
        "{key} {record}"
    );
    assert!(!record.contains("root-token"), "{record}");

    let c = [("cookie", pair.as_str())];
    let overview = format!("{base}/api/overview");
    assert_eq!(request(Method::GET, &overview, &c, None).await.0, 200);
    // Idle past the timeout: ended.
    clock.advance(601_000);
    let (status, body, _) = request(Method::GET, &overview, &c, None).await;
    assert_eq!(
        (status, body["login"].clone()),
        (401, json!(true)),
        "{body}"
    );
    assert!(sessions_stored(&rt).await.is_empty());

    // Used every 5 minutes, it still ends at its lifetime.
    let (pair, _) = set_cookie(&login(base, "root-token-secret", &[]).await);
    let c = [("cookie", pair.as_str())];
    for _ in 0..11 {
        clock.advance(300_000);
        assert_eq!(request(Method::GET, &overview, &c, None).await.0, 200);
    }
    clock.advance(300_001);
    assert_eq!(request(Method::GET, &overview, &c, None).await.0, 401);

    // Logout ends it on the server, and the cookie is forgotten.
    let (pair, _) = set_cookie(&login(base, "root-token-secret", &[]).await);
    let c = [("cookie", pair.as_str())];
    let (status, _, headers) =
        request(Method::DELETE, &format!("{base}/api/session"), &c, None).await;
    assert_eq!(status, 204);
    assert!(set_cookie(&headers).1.contains("Max-Age=0"));
    assert_eq!(request(Method::GET, &overview, &c, None).await.0, 401);

    // A raw token in the cookie (the old format) signs nobody in.
    let raw_cookie = "mcp_tasks_console=root-token-secret";
    assert_eq!(
        request(Method::GET, &overview, &[("cookie", raw_cookie)], None)
            .await
            .0,
        401
    );

    // Over https (a trusted proxy says so): `Secure`, named `__Host-` at `/`.
    let (pair, cookie) =
        set_cookie(&login(base, "root-token-secret", &[("x-forwarded-proto", "https")]).await);
    assert!(pair.starts_with("__Host-mcp_tasks_console="), "{cookie}");
    assert!(cookie.contains("; Secure"), "{cookie}");
    assert_eq!(
        request(Method::GET, &overview, &[("cookie", pair.as_str())], None)
            .await
            .0,
        200
    );
    drop(console);

    // From a peer that is not a trusted proxy, the header is ignored; with the flag, always.
    let console = serve(Console::new(&rt).authenticator(tokens.clone())).await;
    let (_, cookie) = set_cookie(
        &login(
            &console.base,
            "root-token-secret",
            &[("x-forwarded-proto", "https")],
        )
        .await,
    );
    assert!(!cookie.contains("Secure"), "{cookie}");
    drop(console);
    let console = serve(
        Console::new(&rt)
            .authenticator(tokens.clone())
            .secure_cookies(true),
    )
    .await;
    let (_, cookie) = set_cookie(&login(&console.base, "root-token-secret", &[]).await);
    assert!(cookie.contains("; Secure"), "{cookie}");
    drop(console);

    // Nested under a path, the cookie is scoped to it.
    let router =
        axum::Router::new().nest("/console", Console::new(&rt).authenticator(tokens).router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nested = format!("http://{}/console", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(http::serve(listener, router, async move {
        let _ = stopped.await;
    }));
    let (_, cookie) = set_cookie(&login(&nested, "root-token-secret", &[]).await);
    assert!(cookie.contains("Path=/console;"), "{cookie}");
    let _ = stop.send(());
    rt.shutdown().await;
    place.finish().await;
}

/// Refused logins and bearer tokens are throttled per address (429 with `Retry-After`, even
/// for the right token) until the window passes, on the console and on the MCP endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_throttled_and_recover() {
    let place = Place::new(Backend::Redb).await.unwrap();
    let rt = start(&place).await;
    let tokens = Arc::new(
        StaticTokens::parse(&token_entry("root-token", "ops", "root", &["admin"])).unwrap(),
    );
    let window = Duration::from_secs(2);
    let console = serve(
        Console::new(&rt)
            .authenticator(tokens.clone())
            .login_throttle(3, window),
    )
    .await;
    let base = &console.base;
    let session = format!("{base}/api/session");
    for _ in 0..3 {
        let (status, _, _) = request(
            Method::POST,
            &session,
            &[],
            Some(json!({ "token": "guess" })),
        )
        .await;
        assert_eq!(status, 401);
    }
    let (status, body, headers) = request(
        Method::POST,
        &session,
        &[],
        Some(json!({ "token": "root-token" })),
    )
    .await;
    assert_eq!(status, 429, "even the right token, unchecked: {body}");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=3).contains(&retry), "{retry}");
    // Bearer headers on the API count and are refused alike.
    let (status, _, _) = request(
        Method::GET,
        &format!("{base}/api/overview"),
        &[("authorization", "Bearer root-token")],
        None,
    )
    .await;
    assert_eq!(status, 429);
    tokio::time::sleep(window + Duration::from_millis(200)).await;
    login(base, "root-token", &[]).await;

    // The MCP endpoint: refused bearer tokens, then 429 for every credential.
    let config = HttpConfig::default()
        .authenticator(tokens)
        .auth_throttle(3, window);
    let (mcp, stop) = serve_mcp(&rt, config).await;
    let post = |token: &'static str| {
        let mcp = mcp.clone();
        async move {
            let mut r = reqwest::Client::new()
                .post(&mcp)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", mcp_tasks::PROTOCOL_VERSION)
                .header("mcp-method", "server/discover");
            if !token.is_empty() {
                r = r.header("authorization", format!("Bearer {token}"));
            }
            let response = r
                .body(req(1, "server/discover", json!({}), true).to_string())
                .send()
                .await
                .unwrap();
            (
                response.status().as_u16(),
                response.headers().get("retry-after").cloned(),
            )
        }
    };
    // Requests without a credential are not failures (an OAuth client starts so).
    for _ in 0..5 {
        assert_eq!(post("").await.0, 401);
    }
    assert_eq!(post("root-token").await.0, 200);
    for _ in 0..3 {
        assert_eq!(post("guess").await.0, 401);
    }
    let (status, retry) = post("root-token").await;
    assert_eq!(status, 429);
    assert!(retry.is_some());
    tokio::time::sleep(window + Duration::from_millis(200)).await;
    assert_eq!(post("root-token").await.0, 200);
    let _ = stop.send(());
    drop(console);
    rt.shutdown().await;
    place.finish().await;
}

/// Reads an event stream until it ends; `true` if it ended within `limit`.
async fn ends_within(response: reqwest::Response, limit: Duration) -> bool {
    use futures::StreamExt;
    let mut body = response.bytes_stream();
    tokio::time::timeout(limit, async {
        while let Some(chunk) = body.next().await {
            if chunk.is_err() {
                break;
            }
        }
    })
    .await
    .is_ok()
}

/// A credential removed by a token-file reload closes its open event streams (by header and by
/// session) within seconds, and its session is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_credential_loses_its_streams_and_sessions() {
    let place = Place::new(Backend::Redb).await.unwrap();
    let rt = start(&place).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    let keep = token_entry("keep-token", "acme", "alice", &[]);
    std::fs::write(
        &path,
        [keep.clone(), token_entry("gone-token", "acme", "bob", &[])].concat(),
    )
    .unwrap();
    let tokens = Arc::new(StaticTokens::load(&path).unwrap());
    let console = serve(Console::new(&rt).authenticator(tokens.clone())).await;
    let base = &console.base;
    let events = format!("{base}/api/events");
    let (pair, _) = set_cookie(&login(base, "gone-token", &[]).await);
    let client = reqwest::Client::new();
    let by_header = client
        .get(&events)
        .header("authorization", "Bearer gone-token")
        .send()
        .await
        .unwrap();
    let by_cookie = client
        .get(&events)
        .header("cookie", &pair)
        .send()
        .await
        .unwrap();
    let kept = client
        .get(&events)
        .header("authorization", "Bearer keep-token")
        .send()
        .await
        .unwrap();
    assert_eq!(
        (
            by_header.status().as_u16(),
            by_cookie.status().as_u16(),
            kept.status().as_u16()
        ),
        (200, 200, 200)
    );
    std::fs::write(&path, keep).unwrap();
    tokens.reload().await.unwrap();
    let (a, b, c) = tokio::join!(
        ends_within(by_header, Duration::from_secs(10)),
        ends_within(by_cookie, Duration::from_secs(10)),
        ends_within(kept, Duration::from_secs(5)),
    );
    assert!(a, "the revoked token's stream (header) closed");
    assert!(b, "the revoked token's stream (session) closed");
    assert!(!c, "the kept token's stream stays open");
    let (status, _, _) = request(
        Method::GET,
        &format!("{base}/api/overview"),
        &[("cookie", pair.as_str())],
        None,
    )
    .await;
    assert_eq!(status, 401);
    drop(console);
    rt.shutdown().await;
    place.finish().await;
}

/// A principal holds at most its streams (429 beyond); others are not affected, and a closed
/// stream gives its place back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_per_principal_are_capped() {
    let place = Place::new(Backend::Redb).await.unwrap();
    let rt = start(&place).await;
    let toml = [
        token_entry("carol-token", "globex", "carol", &[]),
        token_entry("alice-token", "acme", "alice", &[]),
    ]
    .concat();
    let tokens = Arc::new(StaticTokens::parse(&toml).unwrap());
    let console = serve(
        Console::new(&rt)
            .authenticator(tokens)
            .max_streams_per_principal(2),
    )
    .await;
    let events = format!("{}/api/events", console.base);
    let open = |token: &'static str| {
        let events = events.clone();
        async move {
            reqwest::Client::new()
                .get(&events)
                .header("authorization", format!("Bearer {token}"))
                .send()
                .await
                .unwrap()
        }
    };
    let first = open("carol-token").await;
    let second = open("carol-token").await;
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let third = open("carol-token").await;
    assert_eq!(third.status(), 429);
    assert!(third.headers().contains_key("retry-after"));
    assert_eq!(open("alice-token").await.status(), 200);
    drop(first);
    // The server notices the closed connection at its next write at the latest (a keep-alive
    // comment every 15 s).
    let mut reopened = false;
    for _ in 0..100 {
        let r = open("carol-token").await;
        if r.status() == 200 {
            reopened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(reopened, "a closed stream gave its place back");
    drop(second);
    drop(console);
    rt.shutdown().await;
    place.finish().await;
}

/// `serve --console-listen` on a non-loopback address without authentication is refused at
/// start, saying how to add it; `--no-auth` serves it (with a warning); over `--stdio` (no
/// authentication at all) it is always refused. Failed bearer tokens show in
/// `mcp_tasks_auth_failures_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_an_open_console_and_counts_auth_failures() {
    use crate::support::KillOnDrop;
    const BIN: &str = env!("CARGO_BIN_EXE_mcp-tasks");
    let dir = tempfile::tempdir().unwrap();
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let out = tokio::process::Command::new(BIN)
        .args(["serve", "--store"])
        .arg(dir.path().join("a.redb"))
        .args(["--listen", &format!("127.0.0.1:{}", free())])
        .args(["--console-listen", &format!("0.0.0.0:{}", free())])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("refusing to serve the console")
            && stderr.contains("--auth-tokens")
            && stderr.contains("--no-auth"),
        "{stderr}"
    );
    let out = tokio::process::Command::new(BIN)
        .args(["serve", "--stdio", "--store"])
        .arg(dir.path().join("b.redb"))
        .args(["--console-listen", &format!("0.0.0.0:{}", free())])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refusing to serve the console"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // With --no-auth it serves; with tokens too, and failures are counted.
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        token_entry("root-token", "ops", "root", &["admin"]),
    )
    .unwrap();
    let (mcp, console, metrics) = (free(), free(), free());
    let _server = KillOnDrop(
        std::process::Command::new(BIN)
            .args(["serve", "--store"])
            .arg(dir.path().join("c.redb"))
            .args(["--listen", &format!("127.0.0.1:{mcp}")])
            .args(["--console-listen", &format!("0.0.0.0:{console}")])
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
            .arg("--auth-tokens")
            .arg(&tokens)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let base = format!("http://127.0.0.1:{console}");
    wait_until_answers(&base).await;
    for _ in 0..2 {
        let (status, _, _) = request(
            Method::POST,
            &format!("{base}/api/session"),
            &[],
            Some(json!({ "token": "guess" })),
        )
        .await;
        assert_eq!(status, 401);
        let status = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{mcp}/mcp"))
            .header("authorization", "Bearer guess")
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 401);
    }
    let text = reqwest::get(format!("http://127.0.0.1:{metrics}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let count = |surface: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("mcp_tasks_auth_failures_total")
                    && l.contains(&format!("surface=\"{surface}\""))
                    && l.contains("outcome=\"invalid_token\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert_eq!(count("console"), Some(2.0), "{text}");
    assert_eq!(count("mcp"), Some(2.0), "{text}");
    assert!(!text.contains("guess"));
    drop(_server);

    let port = free();
    let _open = KillOnDrop(
        std::process::Command::new(BIN)
            .args(["serve", "--no-auth", "--store"])
            .arg(dir.path().join("d.redb"))
            .args(["--listen", &format!("127.0.0.1:{}", free())])
            .args(["--console-listen", &format!("0.0.0.0:{port}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut up = false;
    for _ in 0..400 {
        if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/api/overview")).await {
            assert_eq!(r.status(), 200);
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(up, "--no-auth serves the console");
}
