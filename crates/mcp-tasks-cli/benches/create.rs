//! Durable task creations per second through the real runtime, next to raw redb.
//!
//! Run with `cargo bench --bench create` (release profile). Options (after `--`):
//!
//! - `--tasks N`: creations (and raw inserts) per measurement (default 2000, env
//!   `MCP_TASKS_BENCH_TASKS`)
//! - `--reps N`: repetitions of every measurement; the median is reported (default 3, env
//!   `MCP_TASKS_BENCH_REPS`)
//! - `--concurrency LIST`: comma-separated client counts (default `1,16,64`)
//! - `--raw-batch N`: inserts per commit of the raw redb batched loop (default 64)
//!
//! `RUST_LOG=mcp_tasks::store=debug` prints every group commit (size, duration) to stderr.
//!
//! For every concurrency C and every repetition, four measurements run back to back (their
//! order rotates per repetition), each on a fresh file in one temp directory under the crate's
//! `target/` directory, all with redb's default durability (`Immediate`: fsync per commit):
//!
//! - (a) runtime, default group commit (`StoreOptions::default()`),
//! - (b) runtime, `max_batch_ops: 1` (one commit per task: no group commit),
//! - (c) raw redb, one write transaction + commit per ~300-byte insert,
//! - (d) raw redb, `--raw-batch` inserts per commit.
//!
//! (a) and (b) send `tools/call` JSON-RPC requests declaring the Tasks extension from C
//! concurrent tokio tasks to a `TaskPolicy::Always` tool whose future never finishes, so only
//! the creation commit is measured (each created task keeps a live actor until shutdown).
//! Every response is checked to be `resultType: "task"`. Nothing here asserts speed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use mcp_tasks::store::{Durability, StoreOptions};
use mcp_tasks::tool::{CallToolResult, TaskPolicy, ToolDescriptor, ToolError, tool_fn};
use mcp_tasks::{Owner, Runtime};
use redb::{Database, TableDefinition};
use serde_json::{Value, json};

const RAW: TableDefinition<&str, &[u8]> = TableDefinition::new("raw");
const RAW_VALUE_BYTES: usize = 300;
const TOOL: &str = "hold";

#[derive(Debug, Clone)]
struct Args {
    tasks: usize,
    reps: usize,
    concurrency: Vec<usize>,
    raw_batch: usize,
}

const USAGE: &str = "usage: cargo bench --bench create -- [--tasks N] [--reps N] \
                     [--concurrency 1,16,64] [--raw-batch N]";

fn parse_args() -> Args {
    fn num(name: &str, v: &str) -> usize {
        match v.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("{name} needs a positive integer, got {v:?}\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    fn env_num(key: &str, default: usize) -> usize {
        std::env::var(key).map(|v| num(key, &v)).unwrap_or(default)
    }
    let mut args = Args {
        tasks: env_num("MCP_TASKS_BENCH_TASKS", 2000),
        reps: env_num("MCP_TASKS_BENCH_REPS", 3),
        concurrency: vec![1, 16, 64],
        raw_batch: 64,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (key, inline) = match arg.split_once('=') {
            Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
            None => (arg.clone(), None),
        };
        let mut value = || {
            inline.clone().or_else(|| it.next()).unwrap_or_else(|| {
                eprintln!("{key} needs a value\n{USAGE}");
                std::process::exit(2);
            })
        };
        match key.as_str() {
            // cargo bench passes `--bench` to harness = false targets.
            "--bench" => {}
            "--tasks" => args.tasks = num("--tasks", &value()),
            "--reps" => args.reps = num("--reps", &value()),
            "--raw-batch" => args.raw_batch = num("--raw-batch", &value()),
            "--concurrency" => {
                args.concurrency = value()
                    .split(',')
                    .map(|c| num("--concurrency", c.trim()))
                    .collect();
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => {
                eprintln!("unknown argument {other:?}\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    args
}

/// One `tools/call` request that declares the Tasks extension.
fn call_request(id: u64) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "tools/call",
        "params": {
            "name": TOOL,
            "arguments": {},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {
                    "extensions": { "io.modelcontextprotocol/tasks": {} }
                }
            }
        }
    })
}

#[derive(Debug, Clone, Copy)]
struct RuntimeSample {
    rate: f64,
    commits: u64,
    ops: u64,
    /// Bytes of one stored task snapshot (for comparison with the raw value size).
    snapshot_bytes: usize,
}

/// Creates `tasks` tasks from `concurrency` client tasks against a fresh runtime on `path`.
async fn run_runtime(
    path: &Path,
    tasks: usize,
    concurrency: usize,
    options: StoreOptions,
) -> RuntimeSample {
    let tool = tool_fn(
        ToolDescriptor::new(TOOL, "Never finishes: only the creation is measured.")
            .task_policy(TaskPolicy::Always),
        |_ctx, _args| async move {
            std::future::pending::<()>().await;
            Ok::<_, ToolError>(CallToolResult::text("unreachable"))
        },
    );
    let runtime = Runtime::builder(path)
        .tool(tool)
        .store_options(options)
        .start()
        .await
        .unwrap_or_else(|e| panic!("starting the runtime on {}: {e}", path.display()));
    let before = mcp_tasks::internals::runtime_store(&runtime).stats();
    let handle = runtime.handle();
    let owner = Owner::anonymous();

    let started = Instant::now();
    let mut clients = Vec::with_capacity(concurrency);
    for c in 0..concurrency {
        let n = tasks / concurrency + usize::from(c < tasks % concurrency);
        let handle = handle.clone();
        let owner = owner.clone();
        clients.push(tokio::spawn(async move {
            let mut last_id = None;
            for i in 0..n {
                let request = call_request(((c as u64) << 32) | i as u64);
                let response = handle
                    .handle_json(request, &owner)
                    .await
                    .expect("a request gets a response");
                let result = &response["result"];
                if result["resultType"] != "task" {
                    panic!("expected resultType \"task\", got {response}");
                }
                let id = result["taskId"]
                    .as_str()
                    .unwrap_or_else(|| panic!("no taskId in {response}"));
                last_id = Some(id.to_owned());
            }
            last_id
        }));
    }
    let mut some_id = None;
    for client in clients {
        if let Some(id) = client.await.expect("a client task panicked") {
            some_id = Some(id);
        }
    }
    let elapsed = started.elapsed();
    let after = mcp_tasks::internals::runtime_store(&runtime).stats();

    let live = runtime.live_tasks();
    if live != tasks {
        eprintln!("  note: {live} live task actors after creating {tasks} tasks");
    }
    let snapshot_bytes = match some_id {
        Some(id) => mcp_tasks::internals::runtime_store(&runtime)
            .get(&id)
            .await
            .expect("reading a created task")
            .map_or(0, |b| b.len()),
        None => 0,
    };
    runtime.shutdown().await;
    let _ = std::fs::remove_file(path);
    RuntimeSample {
        rate: tasks as f64 / elapsed.as_secs_f64(),
        commits: after.commits - before.commits,
        ops: after.ops - before.ops,
        snapshot_bytes,
    }
}

/// Keys shaped like task ids (`tsk_` + 32 hex digits, pseudo-random order).
fn raw_keys(n: usize, salt: u64) -> Vec<String> {
    let mut state = 0x9E37_79B9_7F4A_7C15_u64 ^ salt.wrapping_mul(0xD1B5_4A32_D192_ED03);
    let mut next = || {
        // splitmix64
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    (0..n)
        .map(|_| format!("tsk_{:016x}{:016x}", next(), next()))
        .collect()
}

/// Inserts `n` ~300-byte values into a fresh redb file, `per_commit` per write transaction,
/// with redb's default durability. Returns inserts per second.
fn run_raw(path: &Path, n: usize, per_commit: usize, salt: u64) -> f64 {
    let keys = raw_keys(n, salt);
    let mut value = vec![0xA5_u8; RAW_VALUE_BYTES];
    let db = Database::create(path).expect("creating the raw redb file");
    {
        // Create the table outside the timed loop.
        let txn = db.begin_write().expect("begin_write");
        txn.open_table(RAW).expect("open_table");
        txn.commit().expect("commit");
    }
    let started = Instant::now();
    let mut i = 0_u64;
    for chunk in keys.chunks(per_commit) {
        let txn = db.begin_write().expect("begin_write");
        {
            let mut table = txn.open_table(RAW).expect("open_table");
            for key in chunk {
                value[..8].copy_from_slice(&i.to_le_bytes());
                i += 1;
                table
                    .insert(key.as_str(), value.as_slice())
                    .expect("insert");
            }
        }
        txn.commit().expect("commit");
    }
    let elapsed = started.elapsed();
    drop(db);
    let _ = std::fs::remove_file(path);
    n as f64 / elapsed.as_secs_f64()
}

async fn raw(path: PathBuf, n: usize, per_commit: usize, salt: u64) -> f64 {
    tokio::task::spawn_blocking(move || run_raw(&path, n, per_commit, salt))
        .await
        .expect("the raw redb loop panicked")
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn median_u64(values: &[u64]) -> f64 {
    let mut v: Vec<f64> = values.iter().map(|&x| x as f64).collect();
    median(&mut v)
}

#[derive(Default)]
struct Row {
    group: Vec<RuntimeSample>,
    one: Vec<RuntimeSample>,
    raw_each: Vec<f64>,
    raw_batched: Vec<f64>,
}

#[derive(Debug, Clone, Copy)]
enum Config {
    Group,
    One,
    RawEach,
    RawBatched,
}

impl Config {
    const ALL: [Config; 4] = [
        Config::Group,
        Config::One,
        Config::RawEach,
        Config::RawBatched,
    ];

    fn label(self) -> &'static str {
        match self {
            Config::Group => "runtime group commit",
            Config::One => "runtime one commit/task",
            Config::RawEach => "raw redb commit/insert",
            Config::RawBatched => "raw redb batched",
        }
    }

    fn file(self) -> &'static str {
        match self {
            Config::Group => "group",
            Config::One => "one",
            Config::RawEach => "raw-each",
            Config::RawBatched => "raw-batched",
        }
    }
}

fn filesystem_type(path: &Path) -> String {
    Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(path)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned())
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    // Optional diagnostics, e.g. RUST_LOG=mcp_tasks::store=debug shows every group commit
    // with its size and duration (this slows the runs down; do not use it for the table).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
    }
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    std::fs::create_dir_all(&target).expect("creating target/");
    let dir = tempfile::Builder::new()
        .prefix("bench-create-")
        .tempdir_in(&target)
        .expect("creating the temp dir under target/");
    let dir_path = dir.path().canonicalize().unwrap_or(dir.path().to_owned());

    println!("mcp-tasks create benchmark (durable task creations per second)");
    println!(
        "store files: {} (filesystem type {})",
        dir_path.display(),
        filesystem_type(&dir_path)
    );
    println!(
        "tasks per measurement: {}, repetitions: {}, concurrency: {:?}, raw batch: {} inserts/commit, raw value: {} bytes",
        args.tasks, args.reps, args.concurrency, args.raw_batch, RAW_VALUE_BYTES
    );
    println!(
        "available parallelism: {}, durability: redb Immediate (fsync per commit) everywhere",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!();

    let group_options = StoreOptions {
        durability: Durability::Immediate,
        ..StoreOptions::default()
    };
    let one_options = StoreOptions {
        durability: Durability::Immediate,
        max_batch_ops: 1,
        ..StoreOptions::default()
    };

    let total = Instant::now();
    let mut rows: Vec<Row> = args.concurrency.iter().map(|_| Row::default()).collect();
    let mut run = 0_u64;
    for rep in 0..args.reps {
        for (ci, &c) in args.concurrency.iter().enumerate() {
            for k in 0..Config::ALL.len() {
                // Rotate the order per repetition so that no configuration always runs first.
                let config = Config::ALL[(k + rep) % Config::ALL.len()];
                run += 1;
                let path = dir_path.join(format!("r{rep}-c{c}-{}.redb", config.file()));
                let row = &mut rows[ci];
                let t = Instant::now();
                let line = match config {
                    Config::Group | Config::One => {
                        let options = match config {
                            Config::Group => group_options.clone(),
                            _ => one_options.clone(),
                        };
                        let s = run_runtime(&path, args.tasks, c, options).await;
                        match config {
                            Config::Group => row.group.push(s),
                            _ => row.one.push(s),
                        }
                        format!(
                            "{:>9.0} creations/s  {} commits, {:.1} ops/commit, snapshot {} B",
                            s.rate,
                            s.commits,
                            s.ops as f64 / s.commits.max(1) as f64,
                            s.snapshot_bytes
                        )
                    }
                    Config::RawEach | Config::RawBatched => {
                        let per_commit = match config {
                            Config::RawEach => 1,
                            _ => args.raw_batch,
                        };
                        let rate = raw(path, args.tasks, per_commit, run).await;
                        match config {
                            Config::RawEach => row.raw_each.push(rate),
                            _ => row.raw_batched.push(rate),
                        }
                        format!(
                            "{rate:>9.0} inserts/s    {} commits",
                            args.tasks.div_ceil(per_commit)
                        )
                    }
                };
                println!(
                    "rep {}/{} C={c:<3} {:<24} {line}  ({:.1} s)",
                    rep + 1,
                    args.reps,
                    config.label(),
                    t.elapsed().as_secs_f64()
                );
            }
        }
    }
    let total = total.elapsed();

    println!();
    println!(
        "Medians of {} runs of {} creations/inserts each (rates per second; ratios are of the medians):",
        args.reps, args.tasks
    );
    println!();
    println!(
        "| C | runtime group commit (creations/s) | runtime one commit/task (creations/s) | group / one | runtime group / raw per-insert | runtime group / raw batched | raw redb per-insert (inserts/s) | raw redb batched x{} (inserts/s) | commits group | commits one |",
        args.raw_batch
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (ci, &c) in args.concurrency.iter().enumerate() {
        let row = &rows[ci];
        let group = median(&mut row.group.iter().map(|s| s.rate).collect::<Vec<_>>());
        let one = median(&mut row.one.iter().map(|s| s.rate).collect::<Vec<_>>());
        let raw_each = median(&mut row.raw_each.clone());
        let raw_batched = median(&mut row.raw_batched.clone());
        let group_commits = median_u64(&row.group.iter().map(|s| s.commits).collect::<Vec<_>>());
        let one_commits = median_u64(&row.one.iter().map(|s| s.commits).collect::<Vec<_>>());
        println!(
            "| {c} | {group:.0} | {one:.0} | {:.2} | {:.2} | {:.2} | {raw_each:.0} | {raw_batched:.0} | {group_commits:.0} | {one_commits:.0} |",
            group / one,
            group / raw_each,
            group / raw_batched,
        );
    }
    println!();
    println!(
        "commits = store write transactions during the timed creations (Store::stats); {} tasks per run",
        args.tasks
    );
    println!("total time: {:.1} s", total.as_secs_f64());
    // Keep the (now empty) temp dir until here; dropping removes it.
    drop(dir);
}
