//! Task lifecycles per second and `tasks/get` per second: one redb process beside 1, 2 and 3
//! replicas over one PostgreSQL database, measured side by side in one run.
//!
//! Run with `cargo bench --bench replicas` (release profile; PostgreSQL must be reachable, see
//! `scripts/postgres.sh`). Options (after `--`):
//!
//! - `--secs N`: seconds per measurement (default 5)
//! - `--clients N`: concurrent clients (default 16)
//! - `--server URL`: PostgreSQL server without a database (default env
//!   `MCP_TASKS_TEST_POSTGRES`, else `postgres://postgres@127.0.0.1:5432`); the bench uses the
//!   database `mcp_tasks_test`, one fresh schema per configuration, dropped afterwards.
//! - `--max-replicas N`: measure 1 to N replicas (default 3)
//! - `--group-commit on|off|both`: PostgreSQL's group commit (`PostgresOptions::group_commit`,
//!   default `on`); `both` measures each replica count with it and then without it
//! - `--groups-in-flight N[,N…]`: how many group commits may be in flight at once
//!   (`PostgresOptions::groups_in_flight`, default 4); each value is measured in turn, side
//!   by side
//! - `--max-running TOOL=N` (repeatable): flow control. Every configuration is then measured
//!   twice, side by side: without a limit, then with these limits (`sleep_task=64` is never
//!   full with 16 clients: the cost of entering and leaving flow control, not of waiting;
//!   on PostgreSQL two rounds of the cluster's flow table per task)
//! - `--without-trigger NAME` (repeatable): an experiment — the trigger `NAME` of `mcp_tasks`
//!   (`mcp_tasks_usage`; `mcp_tasks_listed`,
//!   `mcp_tasks_relisted`) is disabled once the schema exists, to measure what it costs. The
//!   store is then incomplete (no usage or listing counts): figures only.
//!
//! A *lifecycle* is: `tools/call sleep_task {ms: 0}` on replica `i` (the client's), then
//! `tasks/get` on replica `i + 1` until the task is `completed` — so with several replicas
//! every read crosses replicas. The `tasks/get` phase then reads the completed tasks, each
//! client on its own replica (finished tasks have no actor: always a store read); the last
//! phase reads live tasks (waiting for input) on the replica that runs them, which answers
//! from its actor's snapshot while its lease is valid. The replicas run in this one process (the same CPU budget as the
//! single redb runtime) with the database on the same machine: the figures show what the
//! shared store costs, not how replicas on separate machines scale. Nothing here asserts speed.

mod conditions;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mcp_tasks::store::{PostgresOptions, Store};
use mcp_tasks::{Owner, Runtime};
use serde_json::{Value, json};

struct Args {
    secs: u64,
    clients: usize,
    server: String,
    max_replicas: usize,
    without_triggers: Vec<String>,
    /// The `PostgresOptions::group_commit` settings to measure, in order.
    group_commit: Vec<bool>,
    /// The `PostgresOptions::groups_in_flight` settings to measure, in order.
    groups_in_flight: Vec<usize>,
    /// `--max-running` values: when any, each configuration is measured without and with.
    max_running: Vec<String>,
}

fn parse_args() -> Args {
    let mut args = Args {
        secs: 5,
        clients: 16,
        server: std::env::var("MCP_TASKS_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned()),
        max_replicas: 3,
        without_triggers: Vec::new(),
        group_commit: vec![true],
        groups_in_flight: vec![PostgresOptions::default().groups_in_flight],
        max_running: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().unwrap_or_default();
        match a.as_str() {
            "--secs" => args.secs = value().parse().expect("--secs N"),
            "--clients" => args.clients = value().parse().expect("--clients N"),
            "--server" => args.server = value(),
            "--max-replicas" => args.max_replicas = value().parse().expect("--max-replicas N"),
            "--groups-in-flight" => {
                args.groups_in_flight = value()
                    .split(',')
                    .map(|n| match n.trim().parse::<usize>() {
                        Ok(n) if n > 0 => n,
                        _ => panic!("--groups-in-flight N[,N…] (positive), not {n:?}"),
                    })
                    .collect();
            }
            "--group-commit" => {
                args.group_commit = match value().as_str() {
                    "on" => vec![true],
                    "off" => vec![false],
                    "both" => vec![true, false],
                    other => panic!("--group-commit on|off|both, not {other:?}"),
                }
            }
            "--without-trigger" => {
                let name = value();
                assert!(
                    name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !name.is_empty(),
                    "--without-trigger NAME: a trigger's name"
                );
                args.without_triggers.push(name);
            }
            "--max-running" => {
                let spec = value();
                mcp_tasks::quota::parse_limit(&spec).expect("--max-running TOOL=N");
                args.max_running.push(spec);
            }
            "--bench" => {}
            other => {
                eprintln!(
                    "unknown option {other}\nusage: cargo bench --bench replicas -- [--secs N] [--clients N] [--server URL] [--max-replicas N] [--group-commit on|off|both] [--groups-in-flight N[,N…]] [--max-running TOOL=N]... [--without-trigger NAME]..."
                );
                std::process::exit(2);
            }
        }
    }
    args
}

fn request(method: &str, mut params: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities":
            { "extensions": { "io.modelcontextprotocol/tasks": {} } }
    });
    json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params })
}

async fn call(rt: &Runtime, method: &str, params: Value) -> Value {
    rt.handle_json(request(method, params), &Owner::anonymous())
        .await
        .expect("a response")
}

/// Lifecycles per second and `tasks/get` per second over `replicas`.
async fn measure(replicas: &[Arc<Runtime>], args: &Args) -> (f64, f64, f64) {
    let window = Duration::from_secs(args.secs);
    let done = Arc::new(AtomicU64::new(0));
    let ids = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let started = Instant::now();
    let mut clients = Vec::new();
    for c in 0..args.clients {
        let create_on = replicas[c % replicas.len()].clone();
        let read_on = replicas[(c + 1) % replicas.len()].clone();
        let done = done.clone();
        let ids = ids.clone();
        clients.push(tokio::spawn(async move {
            while started.elapsed() < window {
                let r = call(
                    &create_on,
                    "tools/call",
                    json!({ "name": "sleep_task", "arguments": { "ms": 0 } }),
                )
                .await;
                let Some(task) = r["result"]["taskId"].as_str().map(str::to_owned) else {
                    panic!("no task: {r}");
                };
                loop {
                    let g = call(&read_on, "tasks/get", json!({ "taskId": task })).await;
                    match g["result"]["status"].as_str() {
                        Some("completed") => break,
                        Some(_) => tokio::task::yield_now().await,
                        None => panic!("tasks/get failed: {g}"),
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
                ids.lock().unwrap().push(task);
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    let lifecycles = done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();

    let ids = Arc::new(ids.lock().unwrap().clone());
    let reads = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut clients = Vec::new();
    for c in 0..args.clients {
        let on = replicas[c % replicas.len()].clone();
        let ids = ids.clone();
        let reads = reads.clone();
        clients.push(tokio::spawn(async move {
            let mut i = c;
            while started.elapsed() < window {
                let task = &ids[i % ids.len()];
                let g = call(&on, "tasks/get", json!({ "taskId": task })).await;
                assert_eq!(g["result"]["status"], "completed", "{g}");
                reads.fetch_add(1, Ordering::Relaxed);
                i += 7;
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    let gets = reads.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();

    // Live tasks read on the replica that runs them (holds their leases): each client creates
    // a task waiting for input there and reads it for the window.
    let reads = Arc::new(AtomicU64::new(0));
    let mut live = Vec::new();
    for c in 0..args.clients {
        let on = replicas[c % replicas.len()].clone();
        let r = call(
            &on,
            "tools/call",
            json!({ "name": "wait_input", "arguments": {} }),
        )
        .await;
        let task = r["result"]["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("no task: {r}"))
            .to_owned();
        live.push((on, task));
    }
    for (on, task) in &live {
        loop {
            let g = call(on, "tasks/get", json!({ "taskId": task })).await;
            if g["result"]["status"] == "input_required" {
                break;
            }
            tokio::task::yield_now().await;
        }
    }
    let started = Instant::now();
    let mut clients = Vec::new();
    for (on, task) in live.clone() {
        let reads = reads.clone();
        clients.push(tokio::spawn(async move {
            while started.elapsed() < window {
                let g = call(&on, "tasks/get", json!({ "taskId": task })).await;
                assert_eq!(g["result"]["status"], "input_required", "{g}");
                reads.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    let live_gets = reads.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    for (on, task) in live {
        call(&on, "tasks/cancel", json!({ "taskId": task })).await;
    }
    (lifecycles, gets, live_gets)
}

async fn admin(server: &str, sql: &str) {
    let (client, conn) =
        tokio_postgres::connect(&format!("{server}/mcp_tasks_test"), tokio_postgres::NoTls)
            .await
            .expect("PostgreSQL reachable (scripts/postgres.sh)");
    tokio::spawn(conn);
    client.batch_execute(sql).await.expect(sql);
}

/// PostgreSQL's durability settings and where its data lives, for the conditions.
async fn postgres_settings(server: &str) -> String {
    let (client, conn) =
        tokio_postgres::connect(&format!("{server}/mcp_tasks_test"), tokio_postgres::NoTls)
            .await
            .expect("PostgreSQL reachable (scripts/postgres.sh)");
    tokio::spawn(conn);
    let mut out = Vec::new();
    for name in [
        "server_version",
        "fsync",
        "synchronous_commit",
        "wal_sync_method",
        "data_directory",
    ] {
        let value = match client.query_one(&format!("SHOW {name}"), &[]).await {
            Ok(row) => row.get::<_, String>(0),
            Err(e) => format!("(not readable: {e})"),
        };
        out.push(format!("{name} {value}"));
    }
    out.join(", ")
}

async fn shutdown(replicas: Vec<Arc<Runtime>>) {
    for rt in replicas {
        match Arc::try_unwrap(rt) {
            Ok(rt) => rt.shutdown().await,
            Err(_) => panic!("a client still holds a runtime"),
        }
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args = parse_args();
    let dir = tempfile::tempdir().unwrap();
    conditions::print(
        dir.path(),
        &format!(
            "redb: every commit fsync'd before it is acknowledged (Durability::Immediate); PostgreSQL: {}",
            postgres_settings(&args.server).await
        ),
    );
    println!(
        "{} clients, {} s per measurement; rustc {}",
        args.clients,
        args.secs,
        option_env!("RUSTC_VERSION").unwrap_or("(see rustc -V)")
    );
    println!(
        "| store | lifecycles/s | tasks/get per s (finished tasks) | tasks/get per s (live tasks, on their replica) |"
    );
    println!("|---|---|---|---|");
    let mut flows = vec![(String::new(), mcp_tasks::quota::FlowLimits::none())];
    if !args.max_running.is_empty() {
        let mut limits = mcp_tasks::quota::FlowLimits::none();
        for spec in &args.max_running {
            limits.add(spec).expect("--max-running TOOL=N");
        }
        flows.push((
            format!(", --max-running {}", args.max_running.join(" ")),
            limits,
        ));
    }

    for (label, limits) in &flows {
        let _ = std::fs::remove_file(dir.path().join("bench.redb"));
        let rt = Runtime::builder(dir.path().join("bench.redb"))
            .tool(mcp_tasks_testkit::fixtures::bench::sleep_task())
            .tool(mcp_tasks_testkit::fixtures::bench::wait_input())
            .flow_limits(limits.clone())
            .start()
            .await
            .unwrap();
        let replicas = vec![Arc::new(rt)];
        let (l, g, live) = measure(&replicas, &args).await;
        println!("| redb, 1 process{label} | {l:.0} | {g:.0} | {live:.0} |");
        shutdown(replicas).await;
    }

    if !args.without_triggers.is_empty() {
        println!(
            "(experiment: PostgreSQL without the trigger(s) {}; the store misses what they keep)",
            args.without_triggers.join(", ")
        );
    }
    let in_flight = &args.groups_in_flight;
    let configurations: Vec<(usize, bool, usize)> = (1..=args.max_replicas)
        .flat_map(|n| {
            args.group_commit.iter().flat_map(move |g| {
                let flights: Vec<usize> = if *g { in_flight.clone() } else { vec![1] };
                flights.into_iter().map(move |f| (n, *g, f))
            })
        })
        .collect();
    for ((n, group_commit, groups_in_flight), (label, limits)) in configurations
        .iter()
        .flat_map(|c| flows.iter().map(move |f| (*c, f)))
    {
        let schema = format!("bench_replicas_{n}_{}", std::process::id());
        admin(
            &args.server,
            &format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"),
        )
        .await;
        let mut replicas = Vec::new();
        for i in 0..n {
            let node = format!("r{i}");
            let options = PostgresOptions {
                node_id: Some(node.clone()),
                schema: Some(schema.clone()),
                group_commit,
                groups_in_flight,
                ..PostgresOptions::default()
            };
            let store = Store::postgres(&format!("{}/mcp_tasks_test", args.server), options)
                .await
                .unwrap();
            let rt = Runtime::builder_with_store(store)
                .tool(mcp_tasks_testkit::fixtures::bench::sleep_task_on(Some(
                    node,
                )))
                .tool(mcp_tasks_testkit::fixtures::bench::wait_input())
                .flow_limits(limits.clone())
                .start()
                .await
                .unwrap();
            replicas.push(Arc::new(rt));
            if i == 0 {
                for trigger in &args.without_triggers {
                    admin(
                        &args.server,
                        &format!("ALTER TABLE {schema}.mcp_tasks DISABLE TRIGGER {trigger}"),
                    )
                    .await;
                }
            }
        }
        let (l, g, live) = measure(&replicas, &args).await;
        let grouping = if !group_commit {
            ", one transaction per commit".to_owned()
        } else if args.groups_in_flight.len() > 1 {
            format!(", {groups_in_flight} group(s) in flight")
        } else {
            String::new()
        };
        println!("| PostgreSQL, {n} replica(s){grouping}{label} | {l:.0} | {g:.0} | {live:.0} |");
        shutdown(replicas).await;
        admin(&args.server, &format!("DROP SCHEMA {schema} CASCADE")).await;
    }
}
