//! A gateway pair over PostgreSQL: two `mcp-tasks serve --upstream …` replicas in front of one
//! upstream (the Python SDK server of `tests/upstream`). The replica running two upstream calls
//! dies (`kill -9`); the other takes both tasks over once the lease lapses and applies the
//! gateway's crash rule: the tool declared idempotent is called again and completes, the other
//! fails saying that the call may or may not have taken effect. Neither stays `working`.
#![cfg(all(feature = "postgres", unix))]

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::pg;
use crate::replicas::Replica;
use crate::support;

async fn create(replica: &Replica, tool: &str) -> String {
    let created = replica
        .call(
            "tools/call",
            json!({ "name": tool, "arguments": { "seconds": 4, "steps": 4 } }),
        )
        .await;
    created["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("no task: {created}"))
        .to_owned()
}

async fn wait(replica: &Replica, task: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = replica.get(task).await["result"].clone();
        if done(&r) {
            return r;
        }
        assert!(Instant::now() < deadline, "{what}: {r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn terminal(r: &Value) -> bool {
    matches!(
        r["status"].as_str(),
        Some("completed" | "failed" | "cancelled")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_running_upstream_calls_dies_and_the_other_applies_the_crash_rule() {
    let Some(dir) = support::upstreams_dir() else {
        return;
    };
    let Some(pg) = pg::fresh().await else { return };
    let work = tempfile::tempdir().unwrap();
    let effects = work.path().join("effects");
    let (_py, url) = support::python_upstream(&dir, &effects);
    let store = pg.url_with_schema();
    let plain = format!("py={url}");
    let safe = format!("safe={url}");
    let tools = [
        "--upstream",
        plain.as_str(),
        "--upstream",
        safe.as_str(),
        "--upstream-idempotent",
        "safe_slow",
    ];
    let mut a = Replica::spawn_with(&store, "a", "2s", &tools);
    let b = Replica::spawn_with(&store, "b", "2s", &tools);
    // Both replicas list the upstream's tools once it answered them.
    for r in [&a, &b] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while r.call("tools/list", json!({})).await["result"]["tools"]
            .as_array()
            .is_none_or(|t| t.len() < 8)
        {
            assert!(
                Instant::now() < deadline,
                "the upstream's tools never appeared: {}\n{}",
                r.call("tools/list", json!({})).await,
                r.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let not_safe = create(&a, "py_slow").await;
    let repeatable = create(&a, "safe_slow").await;
    for task in [&not_safe, &repeatable] {
        wait(&a, task, "the call started", |r| {
            r["statusMessage"]
                .as_str()
                .is_some_and(|m| m.starts_with("step"))
        })
        .await;
    }
    let _ = a.child.kill();
    let _ = a.child.wait();

    let failed = wait(&b, &not_safe, "taken over", terminal).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let message = failed["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("restarted while the call"), "{message}");
    assert!(
        message.contains("may or may not have taken effect"),
        "{message}"
    );
    let done = wait(&b, &repeatable, "taken over", terminal).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "slept 4s in 4 steps");
    assert!(b.logged("took an orphaned task over"));
    let starts = std::fs::read_to_string(&effects)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("slow start"))
        .count();
    assert_eq!(starts, 3, "two calls on a, the idempotent one again on b");
    drop(a);
    drop(b);
    pg.drop().await;
}
