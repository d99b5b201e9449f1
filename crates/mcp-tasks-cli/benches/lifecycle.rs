//! Whole task lifecycles per second through the real runtime, with and without the metrics
//! recorder: what the `metrics` instrumentation costs.
//!
//! Run with `cargo bench --bench lifecycle` (no recorder: every metrics call is a no-op) and
//! `cargo bench --bench lifecycle -- --metrics` (the Prometheus recorder that `mcp-tasks serve
//! --metrics-listen` installs, rendered once at the end so the series are real). Options:
//!
//! - `--tasks N`: lifecycles per repetition (default 2000)
//! - `--reps N`: repetitions; the median is reported (default 5)
//! - `--concurrency N`: concurrent clients (default 16)
//!
//! One lifecycle: `tools/call` declaring the Tasks extension on a `TaskPolicy::Always` tool
//! that completes at once (two durable commits: creation, completion), then `tasks/get` until
//! the task reads `completed`. Each repetition runs on a fresh redb file under `target/` with
//! redb's default durability (fsync per commit). Nothing here asserts speed.

use std::path::Path;
use std::time::Instant;

use mcp_tasks::tool::{CallToolResult, TaskPolicy, ToolDescriptor, tool_fn};
use mcp_tasks::{Owner, Runtime};
use serde_json::{Value, json};

const USAGE: &str =
    "usage: cargo bench --bench lifecycle -- [--metrics] [--tasks N] [--reps N] [--concurrency N]";

struct Args {
    metrics: bool,
    tasks: usize,
    reps: usize,
    concurrency: usize,
}

fn parse_args() -> Args {
    let mut args = Args {
        metrics: false,
        tasks: 2000,
        reps: 5,
        concurrency: 16,
    };
    let mut it = std::env::args().skip(1);
    let num = |name: &str, v: Option<String>| -> usize {
        match v.as_deref().map(str::parse::<usize>) {
            Some(Ok(n)) if n > 0 => n,
            _ => {
                eprintln!("{name} needs a positive integer\n{USAGE}");
                std::process::exit(2);
            }
        }
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--bench" => {}
            "--metrics" => args.metrics = true,
            "--tasks" => args.tasks = num("--tasks", it.next()),
            "--reps" => args.reps = num("--reps", it.next()),
            "--concurrency" => args.concurrency = num("--concurrency", it.next()),
            other => {
                eprintln!("unknown argument {other:?}\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    args
}

fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": { "io.modelcontextprotocol/tasks": {} }
        }
    })
}

/// Runs `tasks` lifecycles from `concurrency` clients on a fresh runtime; tasks per second.
async fn run(path: &Path, tasks: usize, concurrency: usize) -> f64 {
    let tool = tool_fn(
        ToolDescriptor::new("done", "Completes at once.").task_policy(TaskPolicy::Always),
        |_ctx, _args| async { Ok(CallToolResult::text("done")) },
    );
    let rt = Runtime::builder(path)
        .tool(tool)
        .start()
        .await
        .expect("runtime start");
    let handle = rt.handle();
    let owner = Owner::new("bench", "client");
    let started = Instant::now();
    let clients = (0..concurrency).map(|c| {
        let handle = handle.clone();
        let owner = owner.clone();
        let share = tasks / concurrency + usize::from(c < tasks % concurrency);
        tokio::spawn(async move {
            for i in 0..share {
                let id = (c * tasks + i) as u64;
                let created = handle
                    .handle_json(
                        json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
                            "params": { "name": "done", "arguments": {}, "_meta": meta() } }),
                        &owner,
                    )
                    .await
                    .expect("a response");
                let task = created["result"]["taskId"]
                    .as_str()
                    .unwrap_or_else(|| panic!("not a task: {created}"))
                    .to_owned();
                loop {
                    let got = handle
                        .handle_json(
                            json!({ "jsonrpc": "2.0", "id": id, "method": "tasks/get",
                                "params": { "taskId": task, "_meta": meta() } }),
                            &owner,
                        )
                        .await
                        .expect("a response");
                    match got["result"]["status"].as_str() {
                        Some("completed") => break,
                        Some("working") => tokio::task::yield_now().await,
                        other => panic!("unexpected status {other:?}: {got}"),
                    }
                }
            }
        })
    });
    for client in futures::future::join_all(clients).await {
        client.expect("a client task");
    }
    let rate = tasks as f64 / started.elapsed().as_secs_f64();
    rt.shutdown().await;
    rate
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    let recorder = args.metrics.then(|| {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("installing the Prometheus recorder")
    });
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    std::fs::create_dir_all(&target).expect("creating target/");
    let dir = tempfile::Builder::new()
        .prefix("bench-lifecycle-")
        .tempdir_in(&target)
        .expect("creating the temp dir under target/");
    println!(
        "mcp-tasks lifecycle benchmark: {} tasks x {} reps, {} clients, metrics recorder: {}",
        args.tasks,
        args.reps,
        args.concurrency,
        if args.metrics { "Prometheus" } else { "none" }
    );
    let mut rates = Vec::new();
    for rep in 0..args.reps {
        let path = dir.path().join(format!("rep-{rep}.redb"));
        let rate = run(&path, args.tasks, args.concurrency).await;
        println!("rep {rep}: {rate:.0} lifecycles/s");
        rates.push(rate);
    }
    rates.sort_by(f64::total_cmp);
    println!("median: {:.0} lifecycles/s", rates[rates.len() / 2]);
    if let Some(handle) = recorder {
        let text = handle.render();
        let transitions = text
            .lines()
            .find(|l| l.starts_with("mcp_tasks_task_transitions_total{to=\"completed\"}"))
            .unwrap_or("(no transitions recorded)");
        println!("recorded: {transitions}");
    }
}
