//! Does the expiry reaper keep up? Sustained task creation at the runtime's maximum rate with
//! a short time to live, real clock and durable commits: the number of stored tasks and the
//! size of the store file are sampled every second and must level off.
//!
//! Run with `cargo bench --bench reaper` (release profile). Options (after `--`):
//!
//! - `--secs N`: how long to create (default 30)
//! - `--ttl-ms N`: the tasks' time to live (default 1000)
//! - `--retention-ms N`: how long an expired task is kept (default 1000)
//! - `--clients N`: concurrent clients creating tasks (default 32)
//!
//! The tool completes at once, so a task is stored for `ttl + retention` and then deleted by
//! the reaper (1 s interval, passes back to back while due). Nothing here asserts speed.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mcp_tasks::tool::{CallToolResult, TaskPolicy, ToolDescriptor, tool_fn};
use mcp_tasks::{Owner, Runtime, RuntimeConfig};
use serde_json::json;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse().unwrap_or_else(|_| {
                eprintln!("{name} needs a number, got {v:?}");
                std::process::exit(2)
            })
        })
        .unwrap_or(default)
}

fn main() {
    let secs = arg("--secs", 30);
    let ttl = arg("--ttl-ms", 1000);
    let retention = arg("--retention-ms", 1000);
    let clients = arg("--clients", 32);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(secs, ttl, retention, clients));
}

async fn run(secs: u64, ttl: u64, retention: u64, clients: u64) {
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target");
    let dir = tempfile::tempdir_in(&base).unwrap_or_else(|_| tempfile::tempdir().unwrap());
    let path = dir.path().join("reaper.redb");
    let mut config = RuntimeConfig::default();
    config.default_ttl = Some(Duration::from_millis(ttl));
    config.expired_retention = Duration::from_millis(retention);
    let runtime = Runtime::builder(&path)
        .config(config)
        .tool(tool_fn(
            ToolDescriptor::new("instant", "completes at once").task_policy(TaskPolicy::Always),
            |_ctx, _| async { Ok(CallToolResult::text("done")) },
        ))
        .start()
        .await
        .unwrap();
    let handle = runtime.handle();
    let stop = Arc::new(AtomicBool::new(false));
    let created = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for c in 0..clients {
        let handle = handle.clone();
        let stop = stop.clone();
        let created = created.clone();
        workers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let message = json!({
                    "jsonrpc": "2.0", "id": c * 1_000_000_000 + n, "method": "tools/call",
                    "params": { "name": "instant", "arguments": {}, "_meta": {
                        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                        "io.modelcontextprotocol/clientCapabilities":
                            { "extensions": { "io.modelcontextprotocol/tasks": {} } } } }
                });
                let r = handle
                    .handle_json(message, &Owner::anonymous())
                    .await
                    .unwrap();
                assert_eq!(r["result"]["resultType"], "task", "{r}");
                created.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    println!("ttl {ttl} ms, retention {retention} ms, {clients} clients, {secs} s of creation");
    println!("| second | created/s | stored tasks | live tasks | file MiB |");
    println!("|---|---|---|---|---|");
    let started = Instant::now();
    let mut last = 0;
    for second in 1..=secs {
        tokio::time::sleep_until((started + Duration::from_secs(second)).into()).await;
        let total = created.load(Ordering::Relaxed);
        let (stored, live) = mcp_tasks::internals::runtime_store(&runtime)
            .counts()
            .await
            .unwrap();
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        println!(
            "| {second} | {} | {stored} | {live} | {:.1} |",
            total - last,
            size as f64 / (1 << 20) as f64
        );
        last = total;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let total = created.load(Ordering::Relaxed);
    println!(
        "created {total} tasks in {:.1} s ({:.0}/s)",
        started.elapsed().as_secs_f64(),
        total as f64 / started.elapsed().as_secs_f64()
    );
    runtime.shutdown().await;
}
