//! `mcp-tasks store …` and the `admin` library underneath: stats, list and show on a store
//! with tasks in every status, a backup taken while a workload runs (through the server's
//! admin socket), compaction after mass deletion, verify finding a corrupted record,
//! migration redb → PostgreSQL → redb with byte-identical snapshots and live tasks finishing
//! on the target, and bad input answered with one line and nothing changed.

use crate::pg;
use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use mcp_tasks::admin::{self, Filter, Location};
use mcp_tasks::tool::{
    CallToolResult, InputRequest, TaskPolicy, ToolDescriptor, ToolError, tool_fn,
};
use mcp_tasks::{Runtime, RuntimeBuilder, RuntimeConfig};
use serde_json::{Value, json};
use support::embedded::{call, create, wait_status};

const BIN: &str = env!("CARGO_BIN_EXE_mcp-tasks");

/// The tools of these tests: `done` completes, `fail` fails, `ask` waits for `confirm`,
/// `hold` works until cancelled.
fn tools(builder: RuntimeBuilder) -> RuntimeBuilder {
    let mut config = RuntimeConfig::default();
    config.restart_backoff = Duration::from_millis(10);
    config.cancel_grace = Duration::from_millis(200);
    builder
        .config(config)
        .tool(tool_fn(
            ToolDescriptor::new("done", "completes").task_policy(TaskPolicy::Always),
            |ctx, args| async move {
                let n = ctx.step("count", || async { Ok(7) }).await?;
                Ok(CallToolResult::text(format!("done {n} {}", args.len())))
            },
        ))
        .tool(tool_fn(
            ToolDescriptor::new("fail", "fails").task_policy(TaskPolicy::Always),
            |_ctx, _| async move {
                Err(ToolError::Rpc(mcp_tasks::RpcError::invalid_params(
                    "nothing to do",
                )))
            },
        ))
        .tool(tool_fn(
            ToolDescriptor::new("ask", "asks").task_policy(TaskPolicy::Always),
            |ctx, _| async move {
                let schema = json!({
                    "type": "object",
                    "properties": { "confirm": { "type": "boolean" } },
                    "required": ["confirm"]
                });
                let answer = ctx
                    .input("confirm", InputRequest::elicit_form("Sure?", schema))
                    .await?;
                Ok(CallToolResult::text(format!("answer {answer}")))
            },
        ))
        .tool(tool_fn(
            ToolDescriptor::new("hold", "works until cancelled").task_policy(TaskPolicy::Always),
            |ctx, _| async move {
                ctx.cancelled().await;
                Err(ToolError::Cancelled)
            },
        ))
}

/// A store holding one task in every status; returns the ids by status.
async fn every_status(path: &Path) -> BTreeMap<&'static str, String> {
    let rt = tools(Runtime::builder(path)).start().await.unwrap();
    let mut ids = BTreeMap::new();
    let done = create(&rt, "done", json!({})).await;
    wait_status(&rt, &done, "completed").await;
    ids.insert("completed", done);
    let fail = create(&rt, "fail", json!({})).await;
    wait_status(&rt, &fail, "failed").await;
    ids.insert("failed", fail);
    let ask = create(&rt, "ask", json!({})).await;
    wait_status(&rt, &ask, "input_required").await;
    ids.insert("input_required", ask);
    let cancelled = create(&rt, "hold", json!({})).await;
    call(&rt, "tasks/cancel", json!({ "taskId": cancelled })).await;
    wait_status(&rt, &cancelled, "cancelled").await;
    ids.insert("cancelled", cancelled);
    let working = create(&rt, "hold", json!({})).await;
    wait_status(&rt, &working, "working").await;
    ids.insert("working", working);
    rt.shutdown().await;
    ids
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs the binary and expects one error line on stderr and exit status 1.
fn run_fails(args: &[&str], needle: &str) {
    run_fails_with(1, args, needle)
}

fn run_fails_with(status: i32, args: &[&str], needle: &str) {
    let (code, stdout, stderr) = run(args);
    assert_eq!(code, status, "{args:?}: {stdout}{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("For more information"))
        .collect();
    assert_eq!(lines.len(), 1, "{args:?}: one line expected: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(
        lines[0].contains(needle),
        "{args:?}: `{needle}` not in {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_list_and_show_see_every_status() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.redb");
    let ids = every_status(&path).await;
    let location = Location::parse(path.to_str().unwrap());

    let stats = admin::stats(&location).await.unwrap();
    assert_eq!(stats.backend, "redb");
    assert!(!stats.via_server);
    assert_eq!(stats.tasks, 5);
    assert_eq!(stats.live, 2, "working and input_required");
    for status in [
        "working",
        "input_required",
        "completed",
        "failed",
        "cancelled",
    ] {
        assert_eq!(stats.by_status.get(status), Some(&1), "{status}: {stats:?}");
    }
    assert_eq!(stats.by_tool.get("hold"), Some(&2));
    assert_eq!(stats.undecodable, 0);
    assert_eq!(stats.snapshot_versions.values().sum::<u64>(), 5);
    assert!(stats.boot_epoch.unwrap() >= 1);
    let oldest = stats.oldest_live.unwrap();
    assert_eq!(
        oldest.id, ids["input_required"],
        "the older of the two live tasks"
    );
    assert!(stats.space.file_bytes.unwrap() >= stats.space.used_bytes.unwrap());

    // The CLI prints the same figures as JSON.
    let (code, stdout, stderr) = run(&[
        "store",
        "stats",
        "--store",
        path.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let printed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(printed["tasks"], 5);
    assert_eq!(printed["by_status"]["cancelled"], 1);
    // The store may be the argument instead of `--store`; naming it both ways is a usage error.
    let p = path.to_str().unwrap();
    let (code, by_argument, stderr) = run(&["store", "list", p, "-q"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(by_argument.lines().count(), 5, "{by_argument}");
    assert_eq!(run(&["store", "list", "--store", p, "-q"]).1, by_argument);
    let (code, stdout, _) = run(&["store", "stats", p, "--json"]);
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<Value>(&stdout).unwrap()["tasks"], 5);
    assert_eq!(run(&["store", "list", p, "--store", p]).0, 2);

    // Filters and pages.
    let live = admin::list(
        &location,
        &Filter {
            status: vec!["working".into(), "input_required".into()],
            ..Filter::default()
        },
    )
    .await
    .unwrap();
    let got: BTreeSet<_> = live.tasks.iter().map(|t| t.id.clone()).collect();
    let want: BTreeSet<_> = [ids["working"].clone(), ids["input_required"].clone()].into();
    assert_eq!(got, want);
    let by_tool = admin::list(
        &location,
        &Filter {
            tool: Some("hold".into()),
            ..Filter::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(by_tool.tasks.len(), 2);
    let nobody = admin::list(
        &location,
        &Filter {
            tenant: Some("other".into()),
            ..Filter::default()
        },
    )
    .await
    .unwrap();
    assert!(nobody.tasks.is_empty());
    let young = admin::list(
        &location,
        &Filter {
            older_than_ms: Some(3_600_000),
            ..Filter::default()
        },
    )
    .await
    .unwrap();
    assert!(young.tasks.is_empty(), "nothing is an hour old");
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = admin::list(
            &location,
            &Filter {
                limit: Some(2),
                after: after.clone(),
                ..Filter::default()
            },
        )
        .await
        .unwrap();
        assert!(page.tasks.len() <= 2);
        seen.extend(page.tasks.iter().map(|t| t.id.clone()));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let all: BTreeSet<_> = ids.values().cloned().collect();
    assert_eq!(seen.len(), 5, "every task once: {seen:?}");
    assert_eq!(seen.iter().cloned().collect::<BTreeSet<_>>(), all);

    // One task in full.
    let ask = admin::show(&location, &ids["input_required"])
        .await
        .unwrap();
    assert_eq!(ask.summary.status, "input_required");
    assert_eq!(ask.input_keys_issued, vec!["confirm".to_owned()]);
    assert!(ask.input_requests_pending.contains_key("confirm"));
    assert!(ask.input_answers.is_empty());
    assert_eq!(ask.owner["principal"], "anonymous");
    let done = admin::show(&location, &ids["completed"]).await.unwrap();
    assert_eq!(done.journal.get("count"), Some(&json!(7)));
    // The step committed in the tool's first run.
    assert_eq!(done.step_attempts.get("count"), Some(&1));
    let (code, stdout, _) = run(&[
        "store",
        "show",
        "--store",
        path.to_str().unwrap(),
        &ids["completed"],
    ]);
    assert_eq!(code, 0);
    assert!(stdout.contains("count = 7  (attempt 1)"), "{stdout}");
    assert!(
        done.outcome.unwrap()["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("done 7")
    );
    let failed = admin::show(&location, &ids["failed"]).await.unwrap();
    let error = failed.outcome.unwrap()["error"].clone();
    assert!(
        error["message"].as_str().unwrap().contains("nothing to do"),
        "{error}"
    );
    assert_eq!(error["code"], -32602);
    let (code, stdout, _) = run(&[
        "store",
        "show",
        "--store",
        path.to_str().unwrap(),
        &ids["input_required"],
    ]);
    assert_eq!(code, 0);
    assert!(stdout.contains("confirm: pending"), "{stdout}");

    // Reading changed nothing: a server still starts and serves the same tasks.
    let rt = tools(Runtime::builder(&path)).start().await.unwrap();
    wait_status(&rt, &ids["input_required"], "input_required").await;
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_while_a_workload_runs_holds_every_acknowledged_task() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.redb");
    let rt = Arc::new(tools(Runtime::builder(&path)).start().await.unwrap());
    let socket = rt
        .admin_socket()
        .unwrap()
        .expect("a redb store has an admin socket");
    assert!(socket.path().exists());

    // A workload that creates and completes tasks until told to stop.
    let acked = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let rt = rt.clone();
            let acked = acked.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let id = create(&rt, "done", json!({ "pad": "x".repeat(200) })).await;
                    acked.lock().unwrap().push(id);
                }
            })
        })
        .collect();
    while acked.lock().unwrap().len() < 50 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Every task acknowledged before the backup starts must be in it.
    let before: Vec<String> = acked.lock().unwrap().clone();
    let backup = dir.path().join("backup.redb");
    let report = admin::backup(&Location::parse(path.to_str().unwrap()), &backup)
        .await
        .unwrap();
    assert!(
        report.via_server,
        "the server holds the file: it makes the copy"
    );
    assert!(report.tasks as usize >= before.len());
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    // Reading through the socket while the server runs.
    let stats = admin::stats(&Location::parse(path.to_str().unwrap()))
        .await
        .unwrap();
    assert!(stats.via_server);
    assert!(stats.tasks as usize >= before.len());
    drop(socket);
    Arc::try_unwrap(rt).ok().unwrap().shutdown().await;

    // Restore: a server on the copy answers every acknowledged task.
    let restored = tools(Runtime::builder(&backup)).start().await.unwrap();
    for id in &before {
        let r = call(&restored, "tasks/get", json!({ "taskId": id })).await;
        assert!(
            r.get("result").is_some(),
            "{id} missing from the backup: {r}"
        );
    }
    restored.shutdown().await;
    let verify = admin::verify(&Location::parse(backup.to_str().unwrap()))
        .await
        .unwrap();
    assert!(verify.is_clean(), "{verify:?}");
    assert!(verify.pages_checked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_then_compact_shrinks_a_store_after_mass_deletion() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.redb");
    let rt = tools(Runtime::builder(&path)).start().await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..600 {
        ids.push(create(&rt, "done", json!({ "pad": "y".repeat(2000) })).await);
    }
    let keep = create(&rt, "ask", json!({})).await;
    wait_status(&rt, &keep, "input_required").await;
    for id in &ids {
        wait_status(&rt, id, "completed").await;
    }
    rt.shutdown().await;
    let location = Location::parse(path.to_str().unwrap());
    let filter = Filter {
        status: vec!["completed".into()],
        ..Filter::default()
    };
    let dry = admin::purge(&location, &filter, true).await.unwrap();
    assert_eq!(dry.tasks.len(), 600);
    assert_eq!(
        admin::stats(&location).await.unwrap().tasks,
        601,
        "a dry run removes nothing"
    );
    let purged = admin::purge(&location, &filter, false).await.unwrap();
    assert_eq!(purged.tasks.len(), 600);
    let stats = admin::stats(&location).await.unwrap();
    assert_eq!(stats.tasks, 1);
    assert_eq!(stats.live, 1);
    let verify = admin::verify(&location).await.unwrap();
    assert!(verify.is_clean(), "no index entry left behind: {verify:?}");
    let compact = admin::compact(&location).await.unwrap();
    assert!(
        compact.after_bytes * 2 < compact.before_bytes,
        "compaction gives the space back: {compact:?}"
    );
    // The task that was kept still finishes.
    let rt = tools(Runtime::builder(&path)).start().await.unwrap();
    call(&rt, "tasks/update", json!({ "taskId": keep, "inputResponses": { "confirm": { "action": "accept", "content": { "confirm": true } } } })).await;
    wait_status(&rt, &keep, "completed").await;
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_names_a_corrupted_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.redb");
    let ids = every_status(&path).await;
    let victim = ids["completed"].clone();
    {
        const TASKS: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("tasks");
        let db = redb::Database::open(&path).unwrap();
        let w = db.begin_write().unwrap();
        w.open_table(TASKS)
            .unwrap()
            .insert(victim.as_str(), b"\x07not a snapshot".as_slice())
            .unwrap();
        w.commit().unwrap();
    }
    let report = admin::verify(&Location::parse(path.to_str().unwrap()))
        .await
        .unwrap();
    assert_eq!(report.records, 5);
    assert_eq!(report.undecodable.keys().collect::<Vec<_>>(), vec![&victim]);
    assert!(!report.is_clean());
    let (code, stdout, _) = run(&["store", "verify", "--store", path.to_str().unwrap()]);
    assert_eq!(code, 3, "problems found: exit status 3");
    assert!(
        stdout.contains(&format!("undecodable {victim}")),
        "{stdout}"
    );
    // The other records still read; stats count the bad one.
    let stats = admin::stats(&Location::parse(path.to_str().unwrap()))
        .await
        .unwrap();
    assert_eq!(stats.undecodable, 1);
    assert_eq!(stats.tasks, 5);
}

/// The snapshot bytes of every task of a redb store (table layout 2: each `tasks` value is a
/// 17-byte record header, then the snapshot).
/// The snapshot bytes of a `tasks` value of layout 2 or 3: after the 17-byte header and, when
/// flag bit 2 is set (layout 3), the owner (creation time, length, owner key).
fn snapshot_in(value: &[u8]) -> &[u8] {
    if value[0] & 4 == 0 {
        return &value[17..];
    }
    let len = u32::from_le_bytes(value[25..29].try_into().unwrap()) as usize;
    &value[29 + len..]
}

fn redb_snapshots(path: &Path) -> BTreeMap<String, Vec<u8>> {
    const TASKS: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("tasks");
    use redb::{ReadableDatabase, ReadableTable};
    let db = redb::ReadOnlyDatabase::open(path).unwrap();
    let r = db.begin_read().unwrap();
    let t = r.open_table(TASKS).unwrap();
    t.iter()
        .unwrap()
        .map(|e| {
            let (k, v) = e.unwrap();
            (k.value().to_owned(), snapshot_in(v.value()).to_vec())
        })
        .collect()
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_round_trips_to_postgres_and_back_and_live_tasks_finish_there() {
    let Some(pg) = pg::fresh().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tasks.redb");
    let ids = every_status(&source).await;
    let original = redb_snapshots(&source);
    let url = pg.url_with_schema();
    let from = Location::parse(source.to_str().unwrap());
    let to = Location::parse(&url);

    let first = admin::migrate(&from, &to).await.unwrap();
    assert_eq!(first.tasks, 5);
    assert_eq!(first.live, 2);
    assert_eq!(first.unchanged, 0);
    let again = admin::migrate(&from, &to).await.unwrap();
    assert_eq!(
        (again.tasks, again.unchanged),
        (0, 5),
        "a re-run is idempotent"
    );

    // Byte-identical in PostgreSQL.
    let client = pg.client().await;
    let rows = client
        .query("SELECT id, bytes, owner_node FROM mcp_tasks", &[])
        .await
        .unwrap();
    let in_pg: BTreeMap<String, Vec<u8>> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(in_pg, original);
    assert!(
        rows.iter().all(|r| r.get::<_, Option<String>>(2).is_none()),
        "live tasks arrive unclaimed"
    );
    let stats = admin::stats(&to).await.unwrap();
    assert_eq!(stats.backend, "postgres");
    assert_eq!(stats.tasks, 5);
    assert_eq!(stats.by_status.get("input_required"), Some(&1));
    let shown = admin::show(&to, &ids["input_required"]).await.unwrap();
    assert_eq!(shown.lease.as_ref().map(|l| l.node.clone()), Some(None));

    // And back to a new redb file: the same bytes again.
    let back = dir.path().join("back.redb");
    let report = admin::migrate(&to, &Location::parse(back.to_str().unwrap()))
        .await
        .unwrap();
    assert_eq!(report.tasks, 5);
    assert_eq!(redb_snapshots(&back), original);
    let verify = admin::verify(&Location::parse(back.to_str().unwrap()))
        .await
        .unwrap();
    assert!(verify.is_clean(), "{verify:?}");

    // The live tasks finish on PostgreSQL.
    let store = mcp_tasks::store::Store::postgres(&pg.url, pg.options("a", Duration::from_secs(2)))
        .await
        .unwrap();
    let rt = tools(Runtime::builder_with_store(store))
        .start()
        .await
        .unwrap();
    wait_status(&rt, &ids["input_required"], "input_required").await;
    let answered = call(
        &rt,
        "tasks/update",
        json!({
            "taskId": ids["input_required"],
            "inputResponses": { "confirm": { "action": "accept", "content": { "confirm": true } } }
        }),
    )
    .await;
    assert!(answered.get("result").is_some(), "{answered}");
    let done = wait_status(&rt, &ids["input_required"], "completed").await;
    assert!(
        done["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("true"),
        "{done}"
    );
    call(&rt, "tasks/cancel", json!({ "taskId": ids["working"] })).await;
    wait_status(&rt, &ids["working"], "cancelled").await;

    // While a replica heartbeats, migrating from or to the database is refused.
    let other = dir.path().join("other.redb");
    let refused = admin::migrate(&to, &Location::parse(other.to_str().unwrap()))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("replicas run"), "{refused}");
    assert!(!other.exists(), "nothing was written");
    rt.shutdown().await;
    pg.drop().await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_postgres_schema_is_a_one_line_error() {
    let Some(pg) = pg::fresh().await else { return };
    let client = pg.client().await;
    client
        .batch_execute("CREATE TABLE mcp_schema (version bigint PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now()); INSERT INTO mcp_schema (version) VALUES (99);")
        .await
        .unwrap();
    let url = pg.url_with_schema();
    run_fails(
        &["store", "stats", "--store", &url],
        "schema version 99, newer",
    );
    // A database no server has used.
    let Some(empty) = pg::fresh().await else {
        return;
    };
    run_fails(
        &["store", "stats", "--store", &empty.url_with_schema()],
        "no mcp_schema table",
    );
    pg.drop().await;
    empty.drop().await;
}

/// A redb store whose layout version (meta `schema_version`) is newer than this build's is
/// refused by every command and by a server, in one line, and its bytes stay as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_redb_schema_is_a_one_line_error_and_changes_nothing() {
    const META: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("meta");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.redb");
    let ids = every_status(&path).await;
    let p = path.to_str().unwrap();
    // This build records its layout version when it opens a store.
    let (code, stdout, stderr) = run(&["store", "stats", "--store", p, "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let stats: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(stats["schema_version"], 6);
    {
        use redb::ReadableDatabase;
        let db = redb::Database::open(&path).unwrap();
        let r = db.begin_read().unwrap();
        let meta = r.open_table(META).unwrap();
        let v = meta.get("schema_version").unwrap().unwrap();
        assert_eq!(v.value(), 6u64.to_le_bytes().as_slice());
        drop((v, meta, r));
        let w = db.begin_write().unwrap();
        w.open_table(META)
            .unwrap()
            .insert("schema_version", 99u64.to_le_bytes().as_slice())
            .unwrap();
        w.commit().unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let working = &ids["working"];
    for args in [
        vec!["store", "stats", "--store", p],
        vec!["store", "list", "--store", p],
        vec!["store", "show", "--store", p, working.as_str()],
        vec!["store", "verify", "--store", p],
        vec!["store", "compact", "--store", p],
        vec!["store", "purge", "--store", p, "--status", "completed"],
    ] {
        run_fails(
            &args,
            "schema version 99, newer than the 6 this build supports",
        );
        assert!(
            std::fs::read(&path).unwrap() == before,
            "{args:?} changed the store"
        );
    }
    let backup = dir.path().join("backup.redb");
    run_fails(
        &[
            "store",
            "backup",
            "--store",
            p,
            "--to",
            backup.to_str().unwrap(),
        ],
        "schema version 99, newer",
    );
    assert!(
        !backup.exists(),
        "no backup of a store this build cannot read"
    );
    // A server refuses to start on it.
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--store", p])
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert!(!out.status.success(), "serve started on a newer store");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("schema version 99, newer"), "{stderr}");
    assert!(
        std::fs::read(&path).unwrap() == before,
        "serve changed the store"
    );
    // So does an embedder's runtime.
    let err = tools(Runtime::builder(&path))
        .start()
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("schema version 99"), "{err}");
    assert!(
        std::fs::read(&path).unwrap() == before,
        "the store was changed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_one_line_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.redb");
    let m = missing.to_str().unwrap();
    run_fails(&["store", "stats", "--store", m], "no such store file");
    run_fails(&["store", "compact", "--store", m], "no such store file");
    run_fails(&["store", "purge", "--store", m], "no such store file");
    assert!(!missing.exists(), "nothing created");

    let foreign = dir.path().join("notes.txt");
    std::fs::write(&foreign, b"these are not tasks\n".repeat(300)).unwrap();
    let f = foreign.to_str().unwrap();
    for cmd in ["stats", "list", "verify", "compact"] {
        run_fails(&["store", cmd, "--store", f], "is not an mcp-tasks store");
    }
    assert_eq!(
        std::fs::read(&foreign).unwrap(),
        b"these are not tasks\n".repeat(300)
    );

    let path = dir.path().join("tasks.redb");
    let ids = every_status(&path).await;
    let p = path.to_str().unwrap();
    run_fails(&["store", "show", "--store", p, "tsk_0123"], "tsk_0123");
    run_fails(
        &[
            "store",
            "show",
            "--store",
            p,
            &format!("tsk_{}", "0".repeat(32)),
        ],
        "no task",
    );
    // A usage error is clap's: exit status 2.
    run_fails_with(
        2,
        &["store", "list", "--store", p, "--status", "done"],
        "not a status",
    );
    let existing = dir.path().join("existing.redb");
    std::fs::write(&existing, b"keep").unwrap();
    run_fails(
        &[
            "store",
            "backup",
            "--store",
            p,
            "--to",
            existing.to_str().unwrap(),
        ],
        "never overwrites",
    );
    assert_eq!(std::fs::read(&existing).unwrap(), b"keep");
    run_fails(
        &["store", "migrate", "--from", p, "--to", p],
        "the same store",
    );

    // A server holds the file: writing commands refuse, reading ones go through it.
    let rt = tools(Runtime::builder(&path)).start().await.unwrap();
    let socket = rt.admin_socket().unwrap().unwrap();
    for cmd in [vec!["compact"], vec!["purge"], vec!["migrate", "--to"]] {
        let mut args = vec!["store"];
        args.extend(cmd.iter().copied());
        if cmd[0] == "migrate" {
            args = vec!["store", "migrate", "--from", p, "--to"];
            let target = dir.path().join("target.redb");
            let t = target.to_str().unwrap().to_owned();
            let t: &'static str = Box::leak(t.into_boxed_str());
            args.push(t);
        } else {
            args.extend(["--store", p]);
        }
        run_fails(&args, "held by a running mcp-tasks server");
    }
    assert!(!dir.path().join("target.redb").exists());
    let (code, stdout, stderr) = run(&["store", "list", "--store", p, "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let page: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(page["tasks"].as_array().unwrap().len(), 5);
    drop(socket);
    // Without the socket, reading commands say what to do.
    run_fails(&["store", "stats", "--store", p], "no admin socket");
    run_fails(
        &["store", "stats", "--store", p],
        "a server started with `serve --no-admin-socket`",
    );
    rt.shutdown().await;
    let stats = admin::stats(&Location::parse(path.to_str().unwrap()))
        .await
        .unwrap();
    assert_eq!(stats.tasks, 5, "nothing was removed");
    assert!(ids.contains_key("working"));
    let _ = PathBuf::new();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_left_by_a_killed_server_reads_after_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.redb");
    every_status(&path).await;
    let mut server = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            path.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let socket = admin::socket::socket_path(&path);
    for _ in 0..400 {
        if socket.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(socket.exists(), "the server listens on its admin socket");
    let (code, stdout, stderr) = run(&[
        "store",
        "stats",
        "--store",
        path.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        serde_json::from_str::<Value>(&stdout).unwrap()["via_server"],
        true
    );
    server.kill().unwrap(); // SIGKILL
    server.wait().unwrap();
    assert!(
        socket.exists(),
        "a killed server leaves its socket file behind"
    );
    // Not closed cleanly: the read recovers the file as a server start would.
    let stats = admin::stats(&Location::parse(path.to_str().unwrap()))
        .await
        .unwrap();
    assert!(!stats.via_server, "the stale socket is not asked");
    assert_eq!(stats.tasks, 5);
    assert_eq!(stats.live, 2);
    // A new server replaces the stale socket.
    let rt = tools(Runtime::builder(&path)).start().await.unwrap();
    let fresh = rt.admin_socket().unwrap().unwrap();
    let through = admin::stats(&Location::parse(path.to_str().unwrap()))
        .await
        .unwrap();
    assert!(through.via_server);
    drop(fresh);
    rt.shutdown().await;
}

/// Rewrites the layout-2 store at `from` as the layout-1 code wrote it, at `to`: bare
/// snapshots in `tasks`, the sequence numbers in `seq`, the due times in `due` and
/// `due_by_id`, no `schema_version` in `meta` (a file from before the key). The task
/// `without_seq` gets no `seq` entry (stored before sequence numbers were kept).
fn write_as_layout_1(from: &Path, to: &Path, without_seq: &str) {
    use redb::{ReadableDatabase, ReadableTable, TableDefinition};
    const TASKS: TableDefinition<&str, &[u8]> = TableDefinition::new("tasks");
    const LIVE: TableDefinition<&str, ()> = TableDefinition::new("live");
    const DUE: TableDefinition<(u64, &str), ()> = TableDefinition::new("due");
    const DUE_BY_ID: TableDefinition<&str, u64> = TableDefinition::new("due_by_id");
    const SEQ: TableDefinition<&str, u64> = TableDefinition::new("seq");
    const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
    let src = redb::ReadOnlyDatabase::open(from).unwrap();
    let r = src.begin_read().unwrap();
    let dst = redb::Database::create(to).unwrap();
    let w = dst.begin_write().unwrap();
    {
        let mut tasks = w.open_table(TASKS).unwrap();
        let mut live = w.open_table(LIVE).unwrap();
        let mut due = w.open_table(DUE).unwrap();
        let mut due_by_id = w.open_table(DUE_BY_ID).unwrap();
        let mut seq = w.open_table(SEQ).unwrap();
        let mut meta = w.open_table(META).unwrap();
        for entry in r.open_table(TASKS).unwrap().iter().unwrap() {
            let (id, value) = entry.unwrap();
            let (id, value) = (id.value(), value.value());
            // The header: flags, seq, due_ms, then the owner (see the store's schema).
            let flags = value[0];
            let field = |at: usize| u64::from_le_bytes(value[at..at + 8].try_into().unwrap());
            tasks.insert(id, snapshot_in(value)).unwrap();
            if flags & 1 != 0 && id != without_seq {
                seq.insert(id, field(1)).unwrap();
            }
            if flags & 2 != 0 {
                due.insert((field(9), id), ()).unwrap();
                due_by_id.insert(id, field(9)).unwrap();
            }
        }
        for entry in r.open_table(LIVE).unwrap().iter().unwrap() {
            live.insert(entry.unwrap().0.value(), ()).unwrap();
        }
        for entry in r.open_table(META).unwrap().iter().unwrap() {
            let (k, v) = entry.unwrap();
            if k.value() != "schema_version" {
                meta.insert(k.value(), v.value()).unwrap();
            }
        }
    }
    w.commit().unwrap();
}

/// The tables of a redb file of the current layout (5), in name order.
const LAYOUT_TABLES: [&str; 9] = [
    "due",
    "listing_counters",
    "listing_index",
    "live",
    "meta",
    "owners",
    "tails",
    "tasks",
    "usage",
];

fn redb_tables(path: &Path) -> Vec<String> {
    use redb::ReadableDatabase;
    let db = redb::ReadOnlyDatabase::open(path).unwrap();
    let r = db.begin_read().unwrap();
    let mut names: Vec<String> = r
        .list_tables()
        .unwrap()
        .map(|t| redb::TableHandle::name(&t).to_owned())
        .collect();
    names.sort();
    names
}

/// A store of table layout 1 (before the record header) is read as it is by the `store`
/// commands that only read (nothing converted), and converted by the first server start,
/// after which its tasks finish, take conditional writes and expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_1_store_is_read_as_it_is_and_converted_by_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let built = dir.path().join("built.redb");
    // A task that expires soon, then tasks that never do.
    let mut config = RuntimeConfig::default();
    config.default_ttl = Some(Duration::from_secs(1));
    config.expired_retention = Duration::ZERO;
    let rt = tools(Runtime::builder(&built))
        .config(config)
        .start()
        .await
        .unwrap();
    let expiring = create(&rt, "done", json!({})).await;
    wait_status(&rt, &expiring, "completed").await;
    rt.shutdown().await;
    let rt = tools(Runtime::builder(&built)).start().await.unwrap();
    let ask = create(&rt, "ask", json!({})).await;
    wait_status(&rt, &ask, "input_required").await;
    let working = create(&rt, "hold", json!({})).await;
    wait_status(&rt, &working, "working").await;
    rt.shutdown().await;

    let path = dir.path().join("v1.redb");
    write_as_layout_1(&built, &path, &ask);
    let p = path.to_str().unwrap();
    let v1_tables = vec!["due", "due_by_id", "live", "meta", "seq", "tasks"];
    assert_eq!(redb_tables(&path), v1_tables);

    // The commands that read see layout 1 as it is, and leave it so.
    let (code, stdout, stderr) = run(&["store", "stats", "--store", p, "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let stats: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(stats["schema_version"], 1, "{stats}");
    assert_eq!(stats["tasks"], 3, "{stats}");
    let (code, stdout, stderr) = run(&["store", "list", "--store", p]);
    assert_eq!(code, 0, "{stderr}");
    for id in [&expiring, &ask, &working] {
        assert!(stdout.contains(id.as_str()), "{stdout}");
    }
    // A header names the columns; `-q` prints the ids alone, one a line, without it.
    let header = stdout.lines().next().unwrap();
    for column in ["ID", "STATUS", "TOOL", "TENANT", "CREATED", "MESSAGE"] {
        assert!(header.contains(column), "{header}");
    }
    let (code, quiet, stderr) = run(&["store", "list", "--store", p, "-q"]);
    assert_eq!(code, 0, "{stderr}");
    let mut listed: Vec<&str> = quiet.lines().collect();
    listed.sort_unstable();
    let mut expected = vec![expiring.as_str(), ask.as_str(), working.as_str()];
    expected.sort_unstable();
    assert_eq!(listed, expected, "{quiet}");
    // The due time comes from `due_by_id`.
    let shown = admin::show(&Location::parse(path.to_str().unwrap()), &expiring)
        .await
        .unwrap();
    assert!(shown.due_ms.is_some(), "{shown:?}");
    let report = admin::verify(&Location::parse(path.to_str().unwrap()))
        .await
        .unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.records, 3);
    let backup = dir.path().join("backup.redb");
    let (code, _, stderr) = run(&[
        "store",
        "backup",
        "--store",
        p,
        "--to",
        backup.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(redb_tables(&backup), v1_tables, "a backup keeps the layout");
    assert_eq!(redb_tables(&path), v1_tables, "reading converted nothing");
    // A migration reads it as it is into a new (layout-2) file, with the same tasks.
    let migrated = dir.path().join("migrated.redb");
    let report = admin::migrate(
        &Location::parse(path.to_str().unwrap()),
        &Location::parse(migrated.to_str().unwrap()),
    )
    .await
    .unwrap();
    assert_eq!((report.tasks, report.live), (3, 2));
    assert_eq!(redb_tables(&path), v1_tables, "the source is not converted");
    assert_eq!(redb_tables(&migrated), LAYOUT_TABLES.to_vec());
    let report = admin::verify(&Location::parse(migrated.to_str().unwrap()))
        .await
        .unwrap();
    assert!(report.is_clean(), "{report:?}");
    // `store purge` writes: it converts a copy in the transaction of its deletion.
    let purged = dir.path().join("purged.redb");
    std::fs::copy(&path, &purged).unwrap();
    let (code, _, stderr) = run(&[
        "store",
        "purge",
        "--store",
        purged.to_str().unwrap(),
        "--status",
        "completed",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(redb_tables(&purged), LAYOUT_TABLES.to_vec());
    let stats = admin::stats(&Location::parse(purged.to_str().unwrap()))
        .await
        .unwrap();
    assert_eq!((stats.schema_version, stats.tasks, stats.live), (6, 2, 2));
    let report = admin::verify(&Location::parse(purged.to_str().unwrap()))
        .await
        .unwrap();
    assert!(report.is_clean(), "{report:?}");

    // A server converts it; its tasks go on.
    let rt = tools(Runtime::builder(&path))
        .expired_retention(Duration::ZERO)
        .start()
        .await
        .unwrap();
    call(&rt, "tasks/update", json!({ "taskId": ask, "inputResponses": { "confirm": { "action": "accept", "content": { "confirm": true } } } })).await;
    wait_status(&rt, &ask, "completed").await;
    call(&rt, "tasks/cancel", json!({ "taskId": working })).await;
    wait_status(&rt, &working, "cancelled").await;
    // The expired task is deleted by the reaper.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while mcp_tasks::internals::runtime_store(&rt)
        .get(&expiring)
        .await
        .unwrap()
        .is_some()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the expired task was never deleted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rt.shutdown().await;
    assert_eq!(redb_tables(&path), LAYOUT_TABLES.to_vec());
    let stats = admin::stats(&Location::parse(path.to_str().unwrap()))
        .await
        .unwrap();
    assert_eq!((stats.schema_version, stats.tasks, stats.live), (6, 2, 0));
    let report = admin::verify(&Location::parse(path.to_str().unwrap()))
        .await
        .unwrap();
    assert!(report.is_clean(), "{report:?}");
    // The layout-1 backup converts the same way.
    let rt = tools(Runtime::builder(&backup)).start().await.unwrap();
    wait_status(&rt, &working, "working").await;
    rt.shutdown().await;
    assert_eq!(redb_tables(&backup), LAYOUT_TABLES.to_vec());
}
