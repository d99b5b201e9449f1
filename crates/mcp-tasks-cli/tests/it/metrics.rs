//! `mcp-tasks serve --metrics-listen`: the real binary with the Prometheus exporter on its own
//! port. A scripted workload over Streamable HTTP (tasks created and finished, a synchronous
//! call, a failing call, a listen) and then a scrape of `GET /metrics` that must show exactly
//! the counts the workload caused.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use mcp_tasks::client::{CallOutcome, Client};
use mcp_tasks::store::Store;
use mcp_tasks::tool::{CallToolResult, TaskPolicy, ToolDescriptor, tool_fn};
use mcp_tasks::{Dispatched, Owner, RequestContext, Runtime};
use serde_json::json;
use tokio::sync::Notify;

use crate::support;

use support::embedded;

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
    serve_with(tempfile::tempdir().unwrap(), &["--no-quotas"])
}

/// `serve` with the bench fixtures, a store in `dir` and `extra` arguments.
fn serve_with(dir: tempfile::TempDir, extra: &[&str]) -> Serve {
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--fixtures",
            "bench",
        ])
        .args(extra)
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
            r#"mcp_server_operation_duration_seconds_count{mcp_method_name="tools/call",outcome="error",error_type="-32602"}"#
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

/// A listener that does not read while its task changes many times gets the latest snapshot
/// (latest wins) and the terminal one; every snapshot it skipped is counted in
/// `mcp_tasks_subscription_dropped_total`. In process, with the same Prometheus recorder the
/// binary installs: process-wide, so the test runs in a process of its own
/// (`support::own_process`; the other test here scrapes a child process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_listener_counts_the_snapshots_it_skipped() {
    if !support::own_process("metrics::a_lagging_listener_counts_the_snapshots_it_skipped").await {
        return;
    }
    const STEPS: u64 = 300;
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    let gate = Arc::new(Notify::new());
    let stepper = {
        let gate = gate.clone();
        tool_fn(
            ToolDescriptor::new("stepper", "changes its status message many times")
                .task_policy(TaskPolicy::Always),
            move |ctx, _args| {
                let gate = gate.clone();
                async move {
                    gate.notified().await;
                    for i in 0..STEPS {
                        ctx.set_status(format!("step {i}")).await?;
                    }
                    Ok(CallToolResult::text("done"))
                }
            },
        )
    };
    let rt = Runtime::builder_with_store(Store::memory())
        .tool(stepper)
        .start()
        .await
        .unwrap();
    let task = embedded::create(&rt, "stepper", json!({})).await;
    let listen = embedded::req(
        2,
        "subscriptions/listen",
        json!({ "notifications": { "taskIds": [task] } }),
        true,
    );
    let Dispatched::Stream(mut stream) = rt
        .handle()
        .dispatch_json(listen, &RequestContext::new(Owner::anonymous()))
        .await
    else {
        panic!("subscriptions/listen streams");
    };
    assert_eq!(
        sample(&recorder.render(), "mcp_tasks_subscriptions"),
        Some(1.0)
    );
    // The listener writes the task's current snapshot first: once it is read, the listener
    // follows the task, so what the tool commits next reaches it (or is counted as skipped).
    // Without this wait a slow machine can let the tool finish before the listener follows,
    // and its first snapshot is then the last one, with nothing skipped.
    let mut received = 0.0;
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("the first snapshot within 10 s")
            .expect("the stream is open");
        if message["method"] == "notifications/tasks" {
            assert_eq!(message["params"]["status"], "working", "{message}");
            received += 1.0;
            break;
        }
    }
    // The tool runs all its steps while nobody reads the stream.
    gate.notify_one();
    embedded::wait_status(&rt, &task, "completed").await;
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("a message within 10 s")
            .expect("the stream is open");
        if message["method"] == "notifications/tasks" {
            received += 1.0;
            if message["params"]["status"] == "completed" {
                break;
            }
        }
    }
    drop(stream);
    rt.shutdown().await;

    let text = recorder.render();
    let dropped = sample(&text, "mcp_tasks_subscription_dropped_total")
        .unwrap_or_else(|| panic!("no drops counted:\n{text}"));
    // The stream holds 16 notifications: a reader that lags 300 changes misses most of them,
    // and each one it missed is counted once.
    assert!(
        received < 100.0,
        "intermediate snapshots were coalesced, got {received}"
    );
    assert!(dropped >= 1.0, "{dropped}");
    // Every committed snapshot the listener took in was either written or counted as
    // dropped, never both: together at most the task's commits (creation, start, the steps,
    // the result).
    assert!(
        received + dropped <= (STEPS + 3) as f64,
        "received {received} + dropped {dropped} exceeds the task's commits"
    );
    assert_eq!(sample(&text, "mcp_tasks_subscriptions"), Some(0.0));
}

/// Every refusal is counted under its reason (the HTTP status), a quota refusal also under
/// the quota's name: two 401s, two 403s, one 413, one 408 and one 429 of `liveTasks`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_counted_by_reason() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        support::token_entry("alice-token", "acme", "alice", &[]),
    )
    .unwrap();
    let tokens = tokens.to_str().unwrap().to_owned();
    let server = serve_with(
        dir,
        &[
            "--auth-tokens",
            &tokens,
            "--max-live-tasks",
            "1",
            "--max-body-bytes",
            "2048",
            "--body-timeout",
            "1",
        ],
    );
    let addr: std::net::SocketAddr = server
        .mcp
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .parse()
        .unwrap();
    let discover = support::request(json!(1), "server/discover", json!({}));
    let bytes = serde_json::to_vec(&discover).unwrap();
    let post = |headers: Vec<(String, String)>, body: Vec<u8>| async move {
        support::send(addr, "POST", "/mcp", &headers, &body)
            .await
            .status
    };
    let with = |mut h: Vec<(String, String)>, name: &str, value: &str| {
        h.push((name.to_owned(), value.to_owned()));
        h
    };

    // 401: no token, an unknown token.
    assert_eq!(
        post(support::headers_for(&discover, None), bytes.clone()).await,
        401
    );
    assert_eq!(
        post(support::headers_for(&discover, Some("nope")), bytes.clone()).await,
        401
    );
    // 403: a foreign Origin, an Origin sent twice.
    let alice = support::headers_for(&discover, Some("alice-token"));
    assert_eq!(
        post(
            with(alice.clone(), "Origin", "https://evil.example"),
            bytes.clone()
        )
        .await,
        403
    );
    let twice = with(
        with(alice.clone(), "Origin", "http://localhost"),
        "Origin",
        "http://localhost",
    );
    assert_eq!(post(twice, bytes.clone()).await, 403);
    // 413: a body over 2 KiB.
    assert_eq!(post(alice.clone(), vec![b' '; 4096]).await, 413);
    // 408: a body that does not arrive within a second.
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n",
        addr.port()
    );
    for (n, v) in &alice {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n{");
    stream.write_all(head.as_bytes()).await.unwrap();
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        support::read_response(tokio::io::BufReader::new(stream)),
    )
    .await
    .expect("a 408 once the body timeout passes");
    assert_eq!(r.status, 408);
    // 429: a second live task over --max-live-tasks 1.
    let create = support::request(
        json!(2),
        "tools/call",
        json!({ "name": "sleep_task", "arguments": { "ms": 60000 } }),
    );
    let create_bytes = serde_json::to_vec(&create).unwrap();
    let headers = support::headers_for(&create, Some("alice-token"));
    assert_eq!(post(headers.clone(), create_bytes.clone()).await, 200);
    assert_eq!(post(headers, create_bytes).await, 429);
    // Served requests are not refusals.
    assert_eq!(post(alice, bytes).await, 200);

    let text = reqwest::get(&server.metrics)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let get = |series: &str| {
        sample(&text, series).unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
    };
    assert_eq!(get(r#"mcp_tasks_refusals_total{reason="401"}"#), 2.0);
    assert_eq!(get(r#"mcp_tasks_refusals_total{reason="403"}"#), 2.0);
    assert_eq!(get(r#"mcp_tasks_refusals_total{reason="413"}"#), 1.0);
    assert_eq!(get(r#"mcp_tasks_refusals_total{reason="408"}"#), 1.0);
    assert_eq!(
        get(r#"mcp_tasks_refusals_total{reason="429",quota="liveTasks"}"#),
        1.0
    );
    assert!(text.contains("# HELP mcp_tasks_refusals_total "));
}
