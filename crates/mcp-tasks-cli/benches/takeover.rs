//! How long a replica takes to run the live tasks of a replica that died, and a restarted
//! replica its own, on PostgreSQL.
//!
//! ```sh
//! cargo bench --bench takeover                       # 20,000 live tasks
//! cargo bench --bench takeover -- --orphans 50000 --stored 1000000 --lease-ttl 3s
//! cargo bench --bench takeover -- --binary path/to/an/earlier/mcp-tasks   # side by side
//! ```
//!
//! Against `mcp-tasks serve --fixtures bench` child processes (this build's binary, or
//! `--binary`'s) on one
//! fresh schema of the database `mcp_tasks_test` (`--server URL`, default env
//! `MCP_TASKS_TEST_POSTGRES`, else `postgres://postgres@127.0.0.1:5432`; dropped afterwards):
//!
//! 1. Replica `a` starts; `--stored` rows of finished tasks are written into its table
//!    (stand-ins no replica reads: not live, no owner, no expiry; default 0); `--orphans`
//!    `sleep_task {"ms": 86400000}` tasks are created on it over HTTP (8 clients); `a` is
//!    killed with SIGKILL.
//! 2. **Takeover.** Replica `b` starts at once. Counted from the kill: time until it answers,
//!    until it holds the lease of every task (read from the database every 50 ms), and until
//!    it runs every one (its `mcp_tasks_tasks` gauge, from `--metrics-listen`). `a`'s lease
//!    lapses one TTL after its last heartbeat: that wait is in the figures.
//! 3. **Restart under the same node id.** `b` is killed with SIGKILL and started again as
//!    `b`: a replica takes its own tasks back at start, without waiting for the lease. Time
//!    to ready and until it runs every task.
//!
//! Nothing here asserts speed.

mod common;
mod conditions;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{create_live, free_port, wait_ready};

const USAGE: &str = "usage: cargo bench --bench takeover -- [--orphans N] [--stored N] \
                     [--lease-ttl DURATION] [--server URL] [--binary PATH]";

struct Args {
    orphans: usize,
    /// Rows of finished tasks beside the live ones.
    stored: usize,
    lease_ttl: String,
    server: String,
    /// The `mcp-tasks` binary the replicas run (default: this build's).
    binary: String,
}

fn parse_args() -> Args {
    let mut args = Args {
        orphans: 20_000,
        stored: 0,
        lease_ttl: "3s".into(),
        server: std::env::var("MCP_TASKS_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned()),
        binary: env!("CARGO_BIN_EXE_mcp-tasks").to_owned(),
    };
    let mut it = std::env::args().skip(1);
    let fail = |message: String| -> ! {
        eprintln!("{message}\n{USAGE}");
        std::process::exit(2)
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--orphans" => {
                args.orphans = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| fail("--orphans needs a number".into()))
            }
            "--stored" => {
                args.stored = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| fail("--stored needs a number".into()))
            }
            "--lease-ttl" => {
                args.lease_ttl = it
                    .next()
                    .unwrap_or_else(|| fail("--lease-ttl needs a duration".into()))
            }
            "--server" => {
                args.server = it
                    .next()
                    .unwrap_or_else(|| fail("--server needs a URL".into()))
            }
            "--binary" => {
                args.binary = it
                    .next()
                    .unwrap_or_else(|| fail("--binary needs a path".into()))
            }
            "--bench" => {}
            other => fail(format!("unknown argument {other:?}")),
        }
    }
    args
}

/// A `serve` child process: one replica.
struct Replica {
    child: Child,
    url: String,
    metrics: String,
}

impl Replica {
    fn start(binary: &str, store: &str, node: &str, lease_ttl: &str) -> Replica {
        let port = free_port();
        let metrics = format!("127.0.0.1:{}", free_port());
        let child = Command::new(binary)
            .args(["serve", "--fixtures", "bench", "--no-quotas", "--no-auth"])
            .args([
                "--task-ttl",
                "1d",
                "--node-id",
                node,
                "--lease-ttl",
                lease_ttl,
            ])
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(["--metrics-listen", &metrics])
            .arg("--store")
            .arg(store)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .spawn()
            .expect("starting mcp-tasks serve");
        let url = format!("http://127.0.0.1:{port}/mcp");
        wait_ready(&url, Duration::from_secs(600), Duration::from_millis(5));
        Replica {
            child,
            url,
            metrics: format!("http://{metrics}/metrics"),
        }
    }

    fn kill9(mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

async fn admin(server: &str) -> tokio_postgres::Client {
    let (client, conn) =
        tokio_postgres::connect(&format!("{server}/mcp_tasks_test"), tokio_postgres::NoTls)
            .await
            .expect("PostgreSQL reachable (scripts/postgres.sh)");
    tokio::spawn(conn);
    client
}

/// Waits until `node` holds the lease of `n` live tasks of `schema`; when it did.
async fn until_held(db: &tokio_postgres::Client, schema: &str, node: &str, n: usize) -> Instant {
    let sql = format!("SELECT count(*) FROM {schema}.mcp_tasks WHERE live AND owner_node = $1");
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let held: i64 = db.query_one(&sql, &[&node]).await.expect(&sql).get(0);
        if held as usize >= n {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "{node} holds {held} of {n} after 30 min"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The live tasks `replica` holds (with an actor, or parked): the sum of its
/// `mcp_tasks_tasks` gauge.
async fn running(http: &reqwest::Client, replica: &Replica) -> usize {
    let Ok(answer) = http.get(&replica.metrics).send().await else {
        return 0;
    };
    let text = answer.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("mcp_tasks_tasks{") || l.starts_with("mcp_tasks_tasks "))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as usize
}

/// Waits until `replica` runs `n` live tasks; when it did.
async fn until_running(http: &reqwest::Client, replica: &Replica, n: usize) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let now = running(http, replica).await;
        if now >= n {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "{now} of {n} tasks running after 30 min"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = parse_args();
    let dir = tempfile::tempdir().unwrap();
    conditions::print(
        dir.path(),
        "PostgreSQL: every commit durable before it is acknowledged (the store's file system above is the bench's, not the database's)",
    );
    let schema = format!("bench_takeover_{}", std::process::id());
    let db = admin(&args.server).await;
    db.batch_execute(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
    ))
    .await
    .expect("creating the bench's schema");
    let store = format!(
        "{}/mcp_tasks_test?options=-c%20search_path%3D{schema}",
        args.server
    );
    let n = args.orphans;

    let a = Replica::start(&args.binary, &store, "a", &args.lease_ttl);
    if args.stored > 0 {
        // Stand-ins for finished tasks, written straight into the table `a` created: not
        // live, no owner, no expiry, so no replica ever reads them, but a claim that walks
        // the primary key passes over their entries as over real finished tasks'.
        let started = Instant::now();
        db.batch_execute(&format!(
            "ALTER TABLE {schema}.mcp_tasks DISABLE TRIGGER USER;
             INSERT INTO {schema}.mcp_tasks (id, bytes, live, lease_epoch)
                 SELECT 'tsk_' || md5('finished' || g::text), '\\x00'::bytea, false, 0
                 FROM generate_series(1, {}) g;
             ALTER TABLE {schema}.mcp_tasks ENABLE TRIGGER USER;
             ANALYZE {schema}.mcp_tasks;",
            args.stored
        ))
        .await
        .expect("writing the finished rows");
        eprintln!(
            "wrote {} finished rows in {:.1} s",
            args.stored,
            started.elapsed().as_secs_f64()
        );
    }
    let started = Instant::now();
    let ids = create_live(&a.url, n);
    assert_eq!(ids.len(), n, "every creation became a task");
    eprintln!(
        "created {n} live tasks on a in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    a.kill9();
    let http = reqwest::Client::new();
    let killed = Instant::now();
    let b = Replica::start(&args.binary, &store, "b", &args.lease_ttl);
    let ready = killed.elapsed();
    let held = until_held(&db, &schema, "b", n).await;
    let run = until_running(&http, &b, n).await;
    println!(
        "\n{n} live tasks beside {} finished ones, lease TTL {}, {}\n",
        args.stored, args.lease_ttl, args.binary
    );
    println!("| from the kill | ready | every lease held | every task running |");
    println!("|---|---|---|---|");
    println!(
        "| takeover by another replica (after the lease lapses: one TTL) | {:.2} s | {:.2} s | {:.2} s |",
        ready.as_secs_f64(),
        held.duration_since(killed).as_secs_f64(),
        run.duration_since(killed).as_secs_f64()
    );

    b.kill9();
    let killed = Instant::now();
    let b = Replica::start(&args.binary, &store, "b", &args.lease_ttl);
    let ready = killed.elapsed();
    let run = until_running(&http, &b, n).await;
    println!(
        "| restart under the same node id | {:.2} s | at start | {:.2} s |",
        ready.as_secs_f64(),
        run.duration_since(killed).as_secs_f64()
    );
    b.kill9();
    db.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("dropping the bench's schema");
}
