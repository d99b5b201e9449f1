//! The operator console's JSON API (`mcp_tasks::console`) over real HTTP on 127.0.0.1:0:
//! paging and every filter on both stores, the overview's counts, a task's page, live
//! events, the actions, and who may see and do what (authentication, admin scope, CSRF).
//! The pages themselves are driven in a real browser by `console_browser.rs`.

use std::sync::Arc;
use std::time::Duration;

use mcp_tasks::auth::StaticTokens;
use mcp_tasks::console::Console;
use mcp_tasks::tool::{
    CallToolResult, InputRequest, TaskPolicy, ToolDescriptor, ToolError, tool_fn,
};
use mcp_tasks::{Owner, Runtime};
use serde_json::{Value, json};

use crate::backend::{Backend, Place};
use crate::support::embedded::req;

/// The tools the console's tests run: `quick` completes at once with the status message it
/// is given, `ask` waits for the input `approve`, `boom` fails, `slow` waits for its
/// cancellation, `oops` completes with a tool error (`isError: true`).
pub(crate) fn tools() -> Vec<Arc<dyn mcp_tasks::tool::Tool>> {
    let schema = json!({ "type": "object", "properties": { "message": { "type": "string" } } });
    vec![
        tool_fn(
            ToolDescriptor::new("quick", "completes at once")
                .task_policy(TaskPolicy::Always)
                .input_schema(schema.clone()),
            |ctx, args| async move {
                if let Some(m) = args.get("message").and_then(Value::as_str) {
                    ctx.set_status(m.to_owned()).await?;
                }
                Ok(CallToolResult::text("done"))
            },
        ),
        tool_fn(
            ToolDescriptor::new("ask", "waits for an approval")
                .task_policy(TaskPolicy::Always)
                .input_schema(schema.clone()),
            |ctx, _| async move {
                let answer = ctx
                    .input(
                        "approve",
                        InputRequest::elicit_form(
                            "Approve the plan?",
                            json!({ "type": "object", "properties": { "ok": { "type": "boolean" } } }),
                        ),
                    )
                    .await?;
                Ok(CallToolResult::text(format!("answered {answer}")))
            },
        ),
        tool_fn(
            ToolDescriptor::new("boom", "fails")
                .task_policy(TaskPolicy::Always)
                .input_schema(schema.clone()),
            |_, _| async move { Err(ToolError::rpc(-32603, "the disk is full")) },
        ),
        tool_fn(
            ToolDescriptor::new("oops", "completes with a tool error")
                .task_policy(TaskPolicy::Always)
                .input_schema(schema.clone()),
            |_, _| async move { Ok(CallToolResult::error_text("the file is locked")) },
        ),
        tool_fn(
            ToolDescriptor::new("slow", "runs until cancelled")
                .task_policy(TaskPolicy::Always)
                .input_schema(schema),
            |ctx, args| async move {
                if let Some(m) = args.get("message").and_then(Value::as_str) {
                    ctx.set_status(m.to_owned()).await?;
                }
                ctx.cancelled().await;
                Err(ToolError::Cancelled)
            },
        ),
    ]
}

/// A runtime with [`tools`] on `place`.
pub(crate) async fn start(place: &Place) -> Runtime {
    let mut builder = place.builder("console").await;
    for tool in tools() {
        builder = builder.tool(tool);
    }
    builder.start().await.expect("the runtime starts")
}

/// Creates a task of `tool` as `owner`; returns its id.
pub(crate) async fn create(rt: &Runtime, owner: &Owner, tool: &str, args: Value) -> String {
    let r = rt
        .handle_json(
            req(
                1,
                "tools/call",
                json!({ "name": tool, "arguments": args }),
                true,
            ),
            owner,
        )
        .await
        .expect("an answer");
    r["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("no task: {r}"))
        .to_owned()
}

/// Waits until task `id` of `owner` has `status`.
pub(crate) async fn wait_status(rt: &Runtime, owner: &Owner, id: &str, status: &str) {
    for _ in 0..400 {
        let r = rt
            .handle_json(req(1, "tasks/get", json!({ "taskId": id }), true), owner)
            .await
            .expect("an answer");
        if r["result"]["status"] == status {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("task {id} never reached {status}");
}

/// A console served on 127.0.0.1:0; stops when dropped.
pub(crate) struct Served {
    pub(crate) base: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Serves `console`'s router.
pub(crate) async fn serve(console: Console) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(mcp_tasks::transport::http::serve(
        listener,
        console.router(),
        async move {
            let _ = stopped.await;
        },
    ));
    Served {
        base,
        stop: Some(stop),
    }
}

/// Waits (10 s at most) until a console served by a child process answers at `base`.
pub(crate) async fn wait_until_answers(base: &str) {
    for _ in 0..400 {
        if reqwest::get(format!("{base}/api/overview")).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the console at {base} does not answer");
}

/// One HTTP exchange: status and JSON body (`null` when the body is not JSON).
pub(crate) async fn http(
    method: reqwest::Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, Value, reqwest::header::HeaderMap) {
    let client = reqwest::Client::new();
    let mut r = client.request(method, url);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    if let Some(body) = body {
        r = r
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = r.send().await.expect("the console answers");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers,
    )
}

async fn get(url: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let (s, v, _) = http(reqwest::Method::GET, url, headers, None).await;
    (s, v)
}

/// Every id of a list, paging with `limit` through `next`.
async fn all_ids(base: &str, query: &str, limit: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{base}/api/tasks?limit={limit}&{query}");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let (status, page) = get(&url, &[]).await;
        assert_eq!(status, 200, "{url}: {page}");
        for t in page["tasks"].as_array().unwrap() {
            ids.push(t["id"].as_str().unwrap().to_owned());
        }
        match page["next"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return ids,
        }
    }
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

on_both_stores! {
async fn the_list_pages_and_filters_and_the_overview_counts(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let rt = start(&place).await;
    let alice = Owner::new("acme", "alice");
    let bob = Owner::new("acme", "bob");
    // Created in this order, a few milliseconds apart.
    let mut made: Vec<(String, &str, &Owner)> = Vec::new();
    for (tool, owner, args) in [
        ("quick", &alice, json!({ "message": "copied 3 files" })),
        ("ask", &alice, json!({})),
        ("boom", &bob, json!({})),
        ("quick", &bob, json!({ "message": "Disk cleaned" })),
        ("slow", &alice, json!({ "message": "Disk cleaning" })),
        ("ask", &bob, json!({})),
        ("quick", &alice, json!({})),
    ] {
        made.push((create(&rt, owner, tool, args).await, tool, owner));
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    for (id, tool, owner) in &made {
        let status = match *tool {
            "quick" => "completed",
            "ask" => "input_required",
            "boom" => "failed",
            _ => "working",
        };
        wait_status(&rt, owner, id, status).await;
    }
    // The slow task's message is set once its tool runs.
    for _ in 0..400 {
        let r = rt
            .handle_json(req(1, "tasks/get", json!({ "taskId": made[4].0 }), true), &alice)
            .await
            .unwrap();
        if r["result"]["statusMessage"] == "Disk cleaning" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let console = serve(Console::new(&rt)).await;
    let base = &console.base;
    let newest_first: Vec<String> = made.iter().rev().map(|(id, _, _)| id.clone()).collect();

    // Paging: every task once, newest first, whatever the page size.
    for limit in [1, 2, 3, 50] {
        assert_eq!(all_ids(base, "", limit).await, newest_first, "limit {limit}");
    }
    // Each filter alone.
    let expect = |f: &dyn Fn(&(String, &str, &Owner)) -> bool| -> Vec<String> {
        made.iter().rev().filter(|m| f(m)).map(|m| m.0.clone()).collect()
    };
    assert_eq!(all_ids(base, "status=input_required", 1).await, expect(&|m| m.1 == "ask"));
    assert_eq!(all_ids(base, "status=completed", 1).await, expect(&|m| m.1 == "quick"));
    assert_eq!(all_ids(base, "status=failed", 2).await, expect(&|m| m.1 == "boom"));
    assert_eq!(all_ids(base, "status=working", 2).await, expect(&|m| m.1 == "slow"));
    assert_eq!(all_ids(base, "status=cancelled", 2).await, Vec::<String>::new());
    assert_eq!(all_ids(base, "tool=quick", 1).await, expect(&|m| m.1 == "quick"));
    assert_eq!(all_ids(base, "owner=acme/bob", 1).await, expect(&|m| m.2 == &bob));
    // Combined.
    assert_eq!(
        all_ids(base, "owner=acme%2Falice&tool=quick", 1).await,
        expect(&|m| m.2 == &alice && m.1 == "quick")
    );
    assert_eq!(
        all_ids(base, "tool=ask&status=input_required&owner=acme/bob", 1).await,
        expect(&|m| m.2 == &bob && m.1 == "ask")
    );
    // Text: the status message (any case) and the id.
    assert_eq!(all_ids(base, "q=CLEANING", 1).await, vec![made[4].0.clone()]);
    // (the failed task's message is its error: "the disk is full")
    assert_eq!(all_ids(base, "q=disk", 1).await, vec![made[4].0.clone(), made[2].0.clone()]);
    let fragment = &made[2].0[10..22];
    assert_eq!(all_ids(base, &format!("q={}", fragment.to_uppercase()), 5).await, vec![made[2].0.clone()]);
    // The creation time range: [from, to).
    let (_, rows) = get(&format!("{base}/api/tasks?limit=50"), &[]).await;
    let created: Vec<u64> = rows["tasks"].as_array().unwrap().iter().rev()
        .map(|t| t["createdAt"].as_u64().unwrap()).collect();
    let (from, to) = (created[2], created[5]);
    let in_range: Vec<String> = made.iter().zip(&created).rev()
        .filter(|(_, c)| **c >= from && **c < to).map(|(m, _)| m.0.clone()).collect();
    assert!(!in_range.is_empty());
    assert_eq!(all_ids(base, &format!("from={from}&to={to}"), 2).await, in_range);
    // Bad filters are refused, naming the parameter.
    let (status, body) = get(&format!("{base}/api/tasks?status=done"), &[]).await;
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().starts_with("status:"), "{body}");

    // The overview's counts match the store.
    let (status, o) = get(&format!("{base}/api/overview"), &[]).await;
    assert_eq!(status, 200);
    assert_eq!(o["statuses"], json!({
        "working": 1, "input_required": 2, "completed": 3, "failed": 1, "cancelled": 0
    }));
    assert_eq!(o["store"]["tasks"], 7);
    assert_eq!(o["store"]["live"], 3);
    let quick = o["tools"].as_array().unwrap().iter().find(|t| t["tool"] == "quick").unwrap();
    assert_eq!(quick["completed"], 3);
    let minutes = o["throughput"].as_array().unwrap();
    assert_eq!(minutes.len(), 60);
    let sum = |k: &str| minutes.iter().map(|m| m[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!((sum("created"), sum("completed"), sum("failed")), (7, 3, 1));
    // The live tasks have actors, or are parked (waiting for input past --passivate-after).
    assert!(o["liveActors"].as_u64().unwrap() + o["parkedTasks"].as_u64().unwrap() >= 3);
    assert_eq!(o["viewer"], Value::Null);
    // Count, as the cancel-by-filter confirmation shows it.
    let (_, c) = get(&format!("{base}/api/tasks/count?status=input_required"), &[]).await;
    assert_eq!(c, json!({ "count": 2, "exact": true }));

    // A task's page: the pending input's key and schema.
    let (status, t) = get(&format!("{base}/api/tasks/{}", made[1].0), &[]).await;
    assert_eq!(status, 200);
    assert_eq!(t["status"], "input_required");
    assert_eq!(t["inputRequests"]["approve"]["params"]["message"], "Approve the plan?");
    assert_eq!(t["owner"], json!({ "tenant": "acme", "principal": "alice" }));
    let (_, failed) = get(&format!("{base}/api/tasks/{}", made[2].0), &[]).await;
    assert_eq!(failed["error"]["message"], "the disk is full");
    // Unknown: 404 from the API and for the page.
    let unknown = "tsk_00000000000000000000000000000000";
    assert_eq!(get(&format!("{base}/api/tasks/{unknown}"), &[]).await.0, 404);
    let (status, _, headers) = http(reqwest::Method::GET, &format!("{base}/tasks/{unknown}"), &[], None).await;
    assert_eq!(status, 404);
    assert!(headers["content-security-policy"].to_str().unwrap().contains("script-src 'self'"));
    assert_eq!(
        http(reqwest::Method::GET, &format!("{base}/tasks/{}", made[0].0), &[], None).await.0,
        200
    );
    drop(console);
    rt.shutdown().await;
    place.finish().await;
}
}

on_both_stores! {
async fn actions_cancel_one_task_every_match_and_purge(backend: Backend) {
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let rt = start(&place).await;
    let me = Owner::anonymous();
    let slow: Vec<String> = futures::future::join_all((0..3).map(|_| create(&rt, &me, "slow", json!({})))).await;
    let asks: Vec<String> = futures::future::join_all((0..2).map(|_| create(&rt, &me, "ask", json!({})))).await;
    let done = create(&rt, &me, "quick", json!({})).await;
    for id in &asks {
        wait_status(&rt, &me, id, "input_required").await;
    }
    wait_status(&rt, &me, &done, "completed").await;

    // Read-only by default.
    let ro = serve(Console::new(&rt)).await;
    let (status, _, _) = http(reqwest::Method::POST, &format!("{}/api/tasks/{}/cancel", ro.base, slow[0]), &[], Some(json!({}))).await;
    assert_eq!(status, 403);
    let (_, o) = get(&format!("{}/api/overview", ro.base), &[]).await;
    assert_eq!(o["actions"], false);

    let console = serve(Console::new(&rt).actions(true)).await;
    let base = &console.base;
    let (_, o) = get(&format!("{base}/api/overview"), &[]).await;
    assert_eq!(o["actions"], true);
    let csrf = o["csrf"].as_str().unwrap().to_owned();
    let post = |url: String, body: Value, token: Option<String>| async move {
        let mut headers = vec![];
        if let Some(t) = &token {
            headers.push(("x-console-csrf", t.as_str()));
        }
        let (s, v, _) = http(reqwest::Method::POST, &url, &headers, Some(body)).await;
        (s, v)
    };
    // Without the CSRF token (a browser without authentication): refused.
    let (status, body) = post(format!("{base}/api/tasks/{}/cancel", slow[0]), json!({}), None).await;
    assert_eq!(status, 403, "{body}");
    // From another site: refused even with the token.
    let (status, _, _) = http(
        reqwest::Method::POST,
        &format!("{base}/api/tasks/{}/cancel", slow[0]),
        &[("x-console-csrf", &csrf), ("origin", "http://evil.example")],
        Some(json!({})),
    ).await;
    assert_eq!(status, 403);
    // One task.
    let (status, body) = post(format!("{base}/api/tasks/{}/cancel", slow[0]), json!({}), Some(csrf.clone())).await;
    assert_eq!(status, 200, "{body}");
    wait_status(&rt, &me, &slow[0], "cancelled").await;
    let (status, _) = post(format!("{base}/api/tasks/{}/cancel", slow[0]), json!({}), Some(csrf.clone())).await;
    assert_eq!(status, 409, "a finished task cannot be cancelled");
    // Every task a filter matches.
    let (_, c) = get(&format!("{base}/api/tasks/count?tool=slow&status=working"), &[]).await;
    assert_eq!(c["count"], 2);
    let (status, body) = post(format!("{base}/api/cancel?tool=slow&status=working"), json!({ "expected": 2 }), Some(csrf.clone())).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["cancelled"], 2);
    assert_eq!(body["more"], false);
    for id in &slow[1..] {
        wait_status(&rt, &me, id, "cancelled").await;
    }
    for id in &asks {
        wait_status(&rt, &me, id, "input_required").await;
    }
    // Purge: finished tasks last updated before the date.
    let (status, body) = post(format!("{base}/api/purge"), json!({ "before": "2000-01-01" }), Some(csrf.clone())).await;
    assert_eq!((status, body["purged"].as_u64()), (200, Some(0)));
    let (status, body) = post(format!("{base}/api/purge"), json!({ "before": "tomorrow" }), Some(csrf.clone())).await;
    assert_eq!(status, 400, "{body}");
    let future = (std::time::SystemTime::now() + Duration::from_secs(86_400))
        .duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let (status, body) = post(format!("{base}/api/purge"), json!({ "before": future }), Some(csrf.clone())).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["purged"], 4, "three cancelled and one completed: {body}");
    let remaining = sorted(all_ids(base, "", 50).await);
    assert_eq!(remaining, sorted(asks.clone()));
    let (_, o) = get(&format!("{base}/api/overview"), &[]).await;
    assert_eq!(o["store"]["tasks"], 2);
    drop((ro, console));
    rt.shutdown().await;
    place.finish().await;
}
}

/// The static tokens of the authorization tests: alice and bob of acme, and an admin.
fn tokens() -> Arc<StaticTokens> {
    use crate::support::token_entry;
    let toml = [
        token_entry("alice-token", "acme", "alice", &["tasks"]),
        token_entry("bob-token", "acme", "bob", &[]),
        token_entry("root-token", "ops", "root", &["admin"]),
    ]
    .concat();
    Arc::new(StaticTokens::parse(&toml).expect("the tokens parse"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_sees_its_own_tasks_and_only_admin_acts() {
    let place = Place::new(Backend::Redb).await.unwrap();
    let rt = start(&place).await;
    let alice = Owner::new("acme", "alice");
    let bob = Owner::new("acme", "bob");
    let a = create(&rt, &alice, "slow", json!({})).await;
    let b = create(&rt, &bob, "slow", json!({})).await;
    wait_status(&rt, &alice, &a, "working").await;
    let console = serve(Console::new(&rt).authenticator(tokens()).actions(true)).await;
    let base = &console.base;
    let bearer = |t: &str| format!("Bearer {t}");

    // Without a credential: 401 asking for a login; a bad one too.
    let (status, body) = get(&format!("{base}/api/overview"), &[]).await;
    assert_eq!((status, body["login"].clone()), (401, json!(true)));
    assert_eq!(
        get(
            &format!("{base}/api/tasks"),
            &[("authorization", &bearer("nope"))]
        )
        .await
        .0,
        401
    );

    // Alice sees her task only: in the list, the overview, the detail, the count.
    let alice_h = bearer("alice-token");
    let h = [("authorization", alice_h.as_str())];
    let (_, page) = get(&format!("{base}/api/tasks"), &h).await;
    let ids: Vec<&str> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![a.as_str()]);
    let (_, o) = get(&format!("{base}/api/overview"), &h).await;
    assert_eq!(o["statuses"]["working"], 1);
    assert_eq!(
        o["viewer"],
        json!({ "tenant": "acme", "principal": "alice", "admin": false, "readOnly": false })
    );
    assert_eq!(o["throughput"], Value::Null);
    assert_eq!(o["actions"], false);
    assert_eq!(
        get(&format!("{base}/api/tasks/{b}"), &h).await.0,
        404,
        "another's task is unknown"
    );
    assert_eq!(get(&format!("{base}/api/tasks/{a}"), &h).await.0, 200);
    assert_eq!(
        get(&format!("{base}/api/tasks?owner=acme/bob"), &h).await.0,
        403
    );
    let (status, _, _) = http(reqwest::Method::GET, &format!("{base}/tasks/{b}"), &h, None).await;
    assert_eq!(status, 404);
    // … and may not act, even on her own task.
    let (status, body, _) = http(
        reqwest::Method::POST,
        &format!("{base}/api/tasks/{a}/cancel"),
        &h,
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(body["error"].as_str().unwrap().contains("admin"));

    // The admin sees every tenant and acts with a bearer header (no CSRF token needed:
    // a browser cannot send it from another site).
    let root_h = bearer("root-token");
    let h = [("authorization", root_h.as_str())];
    assert_eq!(
        sorted(all_ids_with(base, &h).await),
        sorted(vec![a.clone(), b.clone()])
    );
    let (status, body, _) = http(
        reqwest::Method::POST,
        &format!("{base}/api/tasks/{b}/cancel"),
        &h,
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    wait_status(&rt, &bob, &b, "cancelled").await;

    // The login form: a cookie, then the CSRF token is required with it.
    let (status, _, headers) = http(
        reqwest::Method::POST,
        &format!("{base}/api/session"),
        &[],
        Some(json!({ "token": "wrong" })),
    )
    .await;
    assert_eq!(status, 401);
    assert!(headers.get("set-cookie").is_none());
    let (status, _, headers) = http(
        reqwest::Method::POST,
        &format!("{base}/api/session"),
        &[],
        Some(json!({ "token": "root-token" })),
    )
    .await;
    assert_eq!(status, 204);
    let cookie = headers["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let cookie = cookie.split(';').next().unwrap().to_owned();
    let c = [("cookie", cookie.as_str())];
    let (status, o) = get(&format!("{base}/api/overview"), &c).await;
    assert_eq!(status, 200);
    assert_eq!(o["viewer"]["admin"], true);
    let csrf = o["csrf"].as_str().unwrap().to_owned();
    let (status, _, _) = http(
        reqwest::Method::POST,
        &format!("{base}/api/tasks/{a}/cancel"),
        &c,
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 403, "a cookie without the CSRF token");
    let (status, _, _) = http(
        reqwest::Method::POST,
        &format!("{base}/api/tasks/{a}/cancel"),
        &[c[0], ("x-console-csrf", "forged")],
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 403, "a wrong CSRF token");
    let (status, body, _) = http(
        reqwest::Method::POST,
        &format!("{base}/api/tasks/{a}/cancel"),
        &[c[0], ("x-console-csrf", &csrf)],
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // Alice's CSRF token is not the admin's.
    let (_, _, headers) = http(
        reqwest::Method::POST,
        &format!("{base}/api/session"),
        &[],
        Some(json!({ "token": "alice-token" })),
    )
    .await;
    let alice_cookie = headers["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let (_, o) = get(
        &format!("{base}/api/overview"),
        &[("cookie", &alice_cookie)],
    )
    .await;
    assert_ne!(o["csrf"].as_str().unwrap(), csrf);
    drop(console);
    rt.shutdown().await;
    place.finish().await;
}

async fn all_ids_with(base: &str, headers: &[(&str, &str)]) -> Vec<String> {
    let (_, page) = get(&format!("{base}/api/tasks?limit=200"), headers).await;
    page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

on_both_stores! {
async fn a_tool_error_is_marked_in_the_list_the_task_page_and_live_events(backend: Backend) {
    use futures::StreamExt;
    let Some(place) = Place::new(backend).await else {
        return;
    };
    let rt = start(&place).await;
    let console = serve(Console::new(&rt)).await;
    let base = &console.base;
    let me = Owner::anonymous();
    let fine = create(&rt, &me, "quick", json!({})).await;
    let oops = create(&rt, &me, "oops", json!({})).await;
    wait_status(&rt, &me, &fine, "completed").await;
    wait_status(&rt, &me, &oops, "completed").await;
    // The list: both completed, the one with isError: true marked.
    let (status, page) = get(&format!("{base}/api/tasks"), &[]).await;
    assert_eq!(status, 200, "{page}");
    let row = |id: &str| {
        page["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} not listed: {page}"))
    };
    assert_eq!(row(&oops)["status"], "completed");
    assert_eq!(row(&oops)["isError"], true);
    assert_eq!(row(&fine)["isError"], false);
    // The task page.
    let (_, t) = get(&format!("{base}/api/tasks/{oops}"), &[]).await;
    assert_eq!((t["status"].clone(), t["isError"].clone()), (json!("completed"), json!(true)));
    assert_eq!(t["result"]["isError"], true);
    assert_eq!(t["upstream"], Value::Null, "not a gateway tool");
    let (_, t) = get(&format!("{base}/api/tasks/{fine}"), &[]).await;
    assert_eq!(t["isError"], false);
    // A live event of a task that completes with a tool error.
    let mut body = reqwest::Client::new()
        .get(format!("{base}/api/events"))
        .send()
        .await
        .unwrap()
        .bytes_stream();
    let live = create(&rt, &me, "oops", json!({})).await;
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let done = |seen: &str| {
        seen.lines().any(|l| {
            l.starts_with("data: ")
                && l.contains(&live)
                && l.contains("\"completed\"")
                && l.contains("\"isError\":true")
        })
    };
    while !done(&seen) {
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .unwrap_or_else(|_| panic!("no completed event with isError: {seen}"))
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(console);
    rt.shutdown().await;
    place.finish().await;
}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_events_carry_every_committed_change() {
    use futures::StreamExt;
    let place = Place::new(Backend::Redb).await.unwrap();
    let rt = start(&place).await;
    let console = serve(Console::new(&rt)).await;
    let me = Owner::anonymous();
    let response = reqwest::Client::new()
        .get(format!("{}/api/events", console.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut body = response.bytes_stream();
    let id = create(&rt, &me, "ask", json!({})).await;
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !seen.contains("\"input_required\"") {
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .expect("an event within 10 s")
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("event: task"), "{seen}");
    assert!(seen.contains(&id));
    drop(console);
    rt.shutdown().await;
    place.finish().await;
}

/// `serve --console-listen ADDR` serves the console beside the MCP endpoint (read-only unless
/// `--console-actions`; the console of a server with authentication asks for its tokens), and
/// `--console-actions` alone is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_console_listen_serves_the_console() {
    use crate::support::KillOnDrop;
    const BIN: &str = env!("CARGO_BIN_EXE_mcp-tasks");
    let dir = tempfile::tempdir().unwrap();
    let port = |_: ()| {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (mcp, console) = (port(()), port(()));
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        [
            crate::support::token_entry("root-token", "ops", "root", &["admin"]),
            crate::support::token_entry("alice-token", "acme", "alice", &[]),
        ]
        .concat(),
    )
    .unwrap();
    let _server = KillOnDrop(
        std::process::Command::new(BIN)
            .args(["serve", "--store"])
            .arg(dir.path().join("t.redb"))
            .args(["--listen", &format!("127.0.0.1:{mcp}")])
            .args(["--console-listen", &format!("127.0.0.1:{console}")])
            .arg("--auth-tokens")
            .arg(&tokens)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let base = format!("http://127.0.0.1:{console}");
    wait_until_answers(&base).await;
    assert_eq!(
        get(&format!("{base}/api/overview"), &[]).await.0,
        401,
        "it asks for a token"
    );
    let (status, o) = get(
        &format!("{base}/api/overview"),
        &[("authorization", "Bearer root-token")],
    )
    .await;
    assert_eq!(status, 200, "{o}");
    assert_eq!(o["viewer"]["admin"], true);
    assert_eq!(o["actions"], false, "read-only without --console-actions");
    assert_eq!(o["store"]["kind"], "redb");
    let (status, _, headers) = http(reqwest::Method::GET, &format!("{base}/"), &[], None).await;
    assert_eq!(status, 200);
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    assert!(
        headers["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("script-src 'self'")
    );
    let js = reqwest::get(format!("{base}/assets/console.js"))
        .await
        .unwrap();
    assert_eq!(js.status(), 200);
    assert!(
        js.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/javascript")
    );

    let out = std::process::Command::new(BIN)
        .args(["serve", "--console-actions"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--console-listen"));
}
