//! The operator console on replicas sharing PostgreSQL: any replica's console shows the whole
//! cluster — another node's tasks in its lists and counts, every node with its heartbeat and
//! leases, a task's lease — and its live stream carries another node's commits (the
//! database's notifications, not the replica's memory).

use std::time::Duration;

use futures::StreamExt;
use mcp_tasks::console::Console;
use mcp_tasks::store::Store;
use mcp_tasks::{Owner, Runtime};
use serde_json::{Value, json};

use crate::pg;
use crate::support::embedded::req;

async fn node(pg: &pg::Pg, name: &str) -> Runtime {
    let store = Store::postgres(&pg.url, pg.options(name, Duration::from_secs(5)))
        .await
        .unwrap();
    Runtime::builder_with_store(store)
        .tool(mcp_tasks_testkit::fixtures::bench::sleep_task_on(Some(
            name.into(),
        )))
        .start()
        .await
        .unwrap()
}

async fn get(url: &str) -> Value {
    let r = reqwest::get(url).await.expect("the console answers");
    assert!(r.status().is_success(), "{url}: {}", r.status());
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_replicas_console_shows_the_whole_cluster_live() {
    let Some(pg) = pg::fresh().await else { return };
    let (a, b) = (node(&pg, "a").await, node(&pg, "b").await);
    let (base, stop) = serve_console(Console::new(&a)).await;
    // Node a's console follows every node's commits from now on.
    let mut events = reqwest::get(format!("{base}/api/events"))
        .await
        .unwrap()
        .bytes_stream();
    let me = Owner::anonymous();
    let created = b
        .handle_json(
            req(
                1,
                "tools/call",
                json!({ "name": "sleep_task", "arguments": { "ms": 600_000 } }),
                true,
            ),
            &me,
        )
        .await
        .unwrap();
    let task = created["result"]["taskId"]
        .as_str()
        .expect("a task")
        .to_owned();

    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !seen.contains(&task) {
        let chunk = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("node b's commit reaches node a's console within 10 s")
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("event: task"), "{seen}");

    // Lists and counts are the cluster's.
    let page = get(&format!("{base}/api/tasks?status=working")).await;
    let ids: Vec<&str> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![task.as_str()]);
    let o = get(&format!("{base}/api/overview")).await;
    assert_eq!(o["statuses"]["working"], 1);
    assert_eq!(o["store"]["kind"], "postgres");
    let nodes = o["nodes"].as_array().expect("the nodes");
    let mut names: Vec<(&str, bool)> = nodes
        .iter()
        .map(|n| (n["node"].as_str().unwrap(), n["self"].as_bool().unwrap()))
        .collect();
    names.sort();
    assert_eq!(names, vec![("a", true), ("b", false)]);
    let b_leases = nodes.iter().find(|n| n["node"] == "b").unwrap()["leases"].as_u64();
    assert_eq!(b_leases, Some(1));
    let detail = get(&format!("{base}/api/tasks/{task}")).await;
    assert_eq!(detail["lease"]["node"], "b");
    assert!(detail["lease"]["epoch"].as_u64().unwrap() >= 1);

    let _ = stop.send(());
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}

/// Serves `console` on 127.0.0.1:0; the base URL and the sender that stops it.
async fn serve_console(console: Console) -> (String, tokio::sync::oneshot::Sender<()>) {
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
    (base, stop)
}

/// A console session opened on one replica is accepted by any other (it lives in the shared
/// store), and a logout on one ends it on all. The live streams of many viewers on one
/// replica, fed by its one follower of the cluster's commits, each get only what their viewer
/// may see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_sessions_and_streams_across_replicas() {
    use std::sync::Arc;

    use crate::support::token_entry;
    let Some(pg) = pg::fresh().await else { return };
    let (a, b) = (node(&pg, "a").await, node(&pg, "b").await);
    let toml = [
        token_entry("root-token", "ops", "root", &["admin"]),
        token_entry("carol-token", "globex", "carol", &[]),
    ]
    .concat();
    let tokens = Arc::new(mcp_tasks::auth::StaticTokens::parse(&toml).unwrap());
    let (base_a, stop_a) = serve_console(Console::new(&a).authenticator(tokens.clone())).await;
    let (base_b, stop_b) = serve_console(Console::new(&b).authenticator(tokens)).await;
    let client = reqwest::Client::new();
    let login = client
        .post(format!("{base_a}/api/session"))
        .header("content-type", "application/json")
        .body(r#"{"token":"root-token"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 204);
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let overview = |base: &str| {
        client
            .get(format!("{base}/api/overview"))
            .header("cookie", &cookie)
            .send()
    };
    assert_eq!(overview(&base_b).await.unwrap().status(), 200, "replica b");
    assert_eq!(overview(&base_a).await.unwrap().status(), 200, "replica a");

    // Streams on node a: carol's (not admin) and the admin's, while node b runs alice's task.
    let open = |token: &'static str| {
        let url = format!("{base_a}/api/events");
        let client = client.clone();
        async move {
            let r = client
                .get(url)
                .header("authorization", format!("Bearer {token}"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.bytes_stream()
        }
    };
    let mut carols = Vec::new();
    for _ in 0..8 {
        carols.push(open("carol-token").await);
    }
    let mut admin = open("root-token").await;
    let alice = Owner::new("acme", "alice");
    let created = b
        .handle_json(
            req(
                1,
                "tools/call",
                json!({ "name": "sleep_task", "arguments": { "ms": 600_000 } }),
                true,
            ),
            &alice,
        )
        .await
        .unwrap();
    let task = created["result"]["taskId"].as_str().unwrap().to_owned();
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !seen.contains(&task) {
        let chunk = tokio::time::timeout_at(deadline, admin.next())
            .await
            .expect("the admin's stream carries node b's commit")
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    // Carol's streams got nothing of alice's (keep-alives at most).
    for stream in &mut carols {
        if let Ok(Some(Ok(chunk))) =
            tokio::time::timeout(Duration::from_millis(300), stream.next()).await
        {
            let text = String::from_utf8_lossy(&chunk);
            assert!(!text.contains(&task), "carol saw alice's task: {text}");
        }
    }

    // A logout on node b ends the session everywhere.
    let out = client
        .delete(format!("{base_b}/api/session"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), 204);
    assert_eq!(overview(&base_a).await.unwrap().status(), 401);
    let _ = (stop_a.send(()), stop_b.send(()));
    drop((carols, admin));
    a.shutdown().await;
    b.shutdown().await;
    pg.drop().await;
}
