//! Replicas as processes: `mcp-tasks serve` twice over one PostgreSQL schema. The fencing
//! test pauses the owner of a task with SIGSTOP past its lease: the other replica takes the
//! task over and completes it; after SIGCONT the old owner's late completion is refused and
//! the record never changes again.
#![cfg(all(feature = "postgres", unix))]

use crate::pg;
use crate::support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub(crate) struct Replica {
    pub(crate) child: Child,
    addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Replica {
    fn drop(&mut self) {
        signal(&self.child, libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Replica {
    fn spawn(store: &str, node: &str, lease_ttl: &str) -> Replica {
        Self::spawn_with(store, node, lease_ttl, &["--fixtures", "bench"])
    }

    /// A replica serving what `tools` says (`--fixtures …`, `--upstream …`).
    pub(crate) fn spawn_with(store: &str, node: &str, lease_ttl: &str, tools: &[&str]) -> Replica {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-tasks"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(tools)
            .args([
                "--store",
                store,
                "--node-id",
                node,
                "--lease-ttl",
                lease_ttl,
            ])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mcp-tasks serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let l = log.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on http://").nth(1)
                    && let Some(addr) = rest.strip_suffix("/mcp")
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(addr.trim().to_owned());
                }
                l.lock().unwrap().push(line);
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                let _ = child.kill();
                panic!(
                    "replica {node} did not start; its log:\n{}",
                    log.lock().unwrap().join("\n")
                )
            });
        Replica {
            child,
            addr: addr.parse().unwrap(),
            log,
        }
    }

    pub(crate) async fn call(&self, method: &str, params: Value) -> Value {
        let body = support::request(json!(1), method, params);
        support::post(self.addr, None, &body).await.json()
    }

    pub(crate) async fn get(&self, task: &str) -> Value {
        self.call("tasks/get", json!({ "taskId": task })).await
    }

    /// Everything the replica logged so far.
    pub(crate) fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub(crate) fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

async fn row(pg: &pg::Pg, task: &str) -> (i64, String, i64, Vec<u8>) {
    let client = pg.client().await;
    let r = client
        .query_one(
            "SELECT seq, owner_node, lease_epoch, bytes FROM mcp_tasks WHERE id = $1",
            &[&task],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_past_the_lease_then_sigcont_the_late_completion_is_refused() {
    let Some(pg) = pg::fresh().await else { return };
    let store = pg.url_with_schema();
    let a = Replica::spawn(&store, "a", "1s");
    let b = Replica::spawn(&store, "b", "1s");

    let created = a
        .call(
            "tools/call",
            json!({ "name": "sleep_task", "arguments": { "ms": 1500 } }),
        )
        .await;
    let task = created["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("no task: {created}"))
        .to_owned();
    assert_eq!(row(&pg, &task).await.1, "a");
    tokio::time::sleep(Duration::from_millis(200)).await;
    signal(&a.child, libc::SIGSTOP);

    // b takes the task over once a's lease lapsed, and completes it (from the start: the
    // sleep had no committed step).
    let deadline = Instant::now() + Duration::from_secs(30);
    let done = loop {
        let r = b.get(&task).await;
        if r["result"]["status"] == "completed" {
            break r["result"].clone();
        }
        assert!(Instant::now() < deadline, "b never completed the task: {r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        done["result"]["content"][0]["text"],
        "Slept 1500 ms on node b."
    );
    let completed = row(&pg, &task).await;
    assert_eq!(completed.1, "b");
    assert!(completed.2 >= 2, "the takeover bumped the epoch");
    assert!(b.logged("took an orphaned task over"));

    // a wakes: its tool's sleep is over, its completion is refused (fenced).
    signal(&a.child, libc::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !a.logged("fenced") {
        assert!(
            Instant::now() < deadline,
            "a never tried its late write; its log:\n{}",
            a.log.lock().unwrap().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        row(&pg, &task).await,
        completed,
        "the record never changes after b completed it"
    );
    // Both replicas answer the same committed snapshot.
    assert_eq!(a.get(&task).await["result"], done);
    assert_eq!(b.get(&task).await["result"], done);
    drop(a);
    drop(b);
    pg.drop().await;
}

/// PostgreSQL itself stops and starts again (a private cluster, so the shared server is never
/// touched) under two replicas: meanwhile requests answer `-32603` with a clear message and
/// the processes keep running; once it is back, service resumes without restarting them,
/// everything acknowledged before is there, and a cancel sent to the replica that does not
/// run the task reaches the one that does (its listening connection reconnected, or the
/// polling fallback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarting_answers_32603_meanwhile_and_service_resumes() {
    let Some(cluster) = pg::PrivateCluster::start() else {
        return;
    };
    let store = cluster.url();
    let mut a = Replica::spawn(&store, "a", "5s");
    let mut b = Replica::spawn(&store, "b", "5s");
    let create = |ms: u64| json!({ "name": "sleep_task", "arguments": { "ms": ms } });
    let task_of = |r: &Value| {
        r["result"]["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("no task: {r}"))
            .to_owned()
    };
    let done = task_of(&a.call("tools/call", create(0)).await);
    let long = task_of(&a.call("tools/call", create(600_000)).await);
    let deadline = Instant::now() + Duration::from_secs(30);
    while b.get(&done).await["result"]["status"] != "completed" {
        assert!(Instant::now() < deadline, "the short task never completed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    cluster.stop_server();
    for r in [
        a.get(&done).await,
        b.call("tools/call", create(0)).await,
        b.call("tasks/cancel", json!({ "taskId": long })).await,
    ] {
        assert_eq!(r["error"]["code"], -32603, "{r}");
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("unavailable"), "a clear message: {msg}");
    }
    assert!(a.child.try_wait().unwrap().is_none(), "a keeps running");
    assert!(b.child.try_wait().unwrap().is_none(), "b keeps running");
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.start_server();

    // Service resumes by itself.
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let r = b.call("tools/call", create(0)).await;
        if r.get("result").is_some() {
            break task_of(&r);
        }
        assert!(
            Instant::now() < deadline,
            "service did not resume: {r}; b's log:\n{}",
            b.log.lock().unwrap().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Nothing acknowledged before was lost, and every replica reads the same.
    for replica in [&a, &b] {
        let r = replica.get(&done).await;
        assert_eq!(r["result"]["status"], "completed", "{r}");
        assert_eq!(
            r["result"]["result"]["content"][0]["text"],
            "Slept 0 ms on node a."
        );
        assert_eq!(replica.get(&long).await["result"]["status"], "working");
    }
    // A cancel on b for the task a runs (a's listening connection and inbox came back).
    let r = b.call("tasks/cancel", json!({ "taskId": long })).await;
    assert!(r.get("result").is_some(), "{r}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while a.get(&long).await["result"]["status"] != "cancelled" {
        assert!(Instant::now() < deadline, "the cancel never took effect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while a.get(&after).await["result"]["status"] != "completed" {
        assert!(
            Instant::now() < deadline,
            "the task created after the restart never completed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(a.child.try_wait().unwrap().is_none());
    assert!(b.child.try_wait().unwrap().is_none());
    assert!(
        a.logged("listening for other nodes' changes"),
        "a listens for notifications"
    );
}
