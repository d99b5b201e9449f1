//! `mcp-tasks serve --metrics-listen`: the real binary with the Prometheus exporter on its own
//! port. A scripted workload over Streamable HTTP (tasks created and finished, a synchronous
//! call, a failing call, a listen) and then a scrape of `GET /metrics` that must show exactly
//! the counts the workload caused.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use mcp_tasks::client::{CallOutcome, Client};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_mcp-tasks");

struct Serve {
    child: Child,
    mcp: String,
    metrics: String,
    _dir: tempfile::TempDir,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve() -> Serve {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--fixtures",
            "bench",
            "--no-quotas",
        ])
        .arg("--store")
        .arg(dir.path().join("tasks.redb"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let (mut mcp, mut metrics) = (None, None);
    while mcp.is_none() || metrics.is_none() {
        let line = lines.next().expect("serve printed its addresses").unwrap();
        if let Some(at) = line.find("listening on ") {
            mcp = Some(line[at + "listening on ".len()..].trim().to_owned());
        }
        if let Some(at) = line.find("metrics on ") {
            metrics = Some(line[at + "metrics on ".len()..].trim().to_owned());
        }
    }
    std::thread::spawn(move || for _ in lines {});
    Serve {
        child,
        mcp: mcp.unwrap(),
        metrics: metrics.unwrap(),
        _dir: dir,
    }
}

/// The value of the sample `name{labels}` (labels as printed, in order), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_a_workload_did() {
    let server = serve();
    let client = Client::http(&server.mcp).unwrap().build().await.unwrap();

    // Three tasks, each created and finished.
    for _ in 0..3 {
        let CallOutcome::Task(task) = client
            .call_tool("sleep_task", json!({ "ms": 10 }))
            .await
            .unwrap()
        else {
            panic!("sleep_task becomes a task");
        };
        assert_eq!(task.wait().await.unwrap().status.as_str(), "completed");
    }
    // One synchronous call and one that fails.
    client
        .call_tool("echo", json!({ "text": "hi" }))
        .await
        .unwrap();
    client.call_tool("echo", json!({})).await.unwrap_err();
    // One listen, opened and closed.
    {
        let CallOutcome::Task(task) = client
            .call_tool("sleep_task", json!({ "ms": 200 }))
            .await
            .unwrap()
        else {
            panic!("sleep_task becomes a task");
        };
        let mut watch = task.watch();
        while let Some(update) = watch.next().await {
            if update.unwrap().is_terminal() {
                break;
            }
        }
    }

    // Gauges settle once the last actor and the listen are gone.
    let http = reqwest::Client::new();
    let mut text = String::new();
    for _ in 0..100 {
        let response = http.get(&server.metrics).send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/plain")
        );
        text = response.text().await.unwrap();
        if sample(&text, r#"mcp_tasks_tasks{status="working"}"#) == Some(0.0)
            && sample(&text, "mcp_tasks_subscriptions") == Some(0.0)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let get = |series: &str| {
        sample(&text, series).unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
    };

    assert_eq!(
        get(r#"mcp_tasks_task_transitions_total{to="working"}"#),
        4.0
    );
    assert_eq!(
        get(r#"mcp_tasks_task_transitions_total{to="completed"}"#),
        4.0
    );
    assert_eq!(get(r#"mcp_tasks_tasks{status="working"}"#), 0.0);
    assert_eq!(get("mcp_tasks_subscriptions"), 0.0);
    assert_eq!(
        get(
            r#"mcp_server_operation_duration_seconds_count{mcp_method_name="tools/call",outcome="ok"}"#
        ),
        5.0
    );
    assert_eq!(
        get(
            r#"mcp_server_operation_duration_seconds_count{mcp_method_name="tools/call",outcome="error"}"#
        ),
        1.0
    );
    assert!(
        get(
            r#"mcp_server_operation_duration_seconds_count{mcp_method_name="tasks/get",outcome="ok"}"#
        ) >= 1.0
    );
    assert!(
        get(
            r#"mcp_server_operation_duration_seconds_count{mcp_method_name="subscriptions/listen",outcome="ok"}"#
        ) >= 1.0
    );
    // Creations, finishes and the server's own meta writes, in group commits.
    assert!(get("mcp_tasks_store_commit_duration_seconds_count") >= 8.0);
    assert!(get("mcp_tasks_store_commit_batch_ops_sum") >= 8.0);
    assert!(text.contains("mcp_tasks_store_commit_duration_seconds_bucket{le=\""));
    assert_eq!(get("mcp_tasks_recovered_tasks"), 0.0);
    assert!(get("mcp_tasks_recovery_duration_seconds") >= 0.0);
    assert!(text.contains("# HELP mcp_tasks_tasks "));
}
