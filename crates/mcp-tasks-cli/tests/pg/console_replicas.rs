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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(mcp_tasks::transport::http::serve(
        listener,
        Console::new(&a).router(),
        async move {
            let _ = stopped.await;
        },
    ));
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
