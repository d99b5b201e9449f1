//! PostgreSQL for the tests: every test gets a schema of its own in the database
//! `mcp_tasks_test` (created if missing), so tests run in parallel without seeing each
//! other's tasks. Without a reachable server the tests are skipped with a message, unless
//! `MCP_TASKS_REQUIRE_POSTGRES` is set (CI sets it: there an unreachable server fails).
//! [`PrivateCluster`] is a server of a test's own, for the tests that stop or crash it.

use std::time::Duration;

use mcp_tasks::store::PostgresOptions;
use tokio_postgres::NoTls;

/// The server tests use (without a database name).
pub fn server() -> String {
    std::env::var("MCP_TASKS_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned())
}

/// The database the tests' schemas are made in.
pub const DATABASE: &str = "mcp_tasks_test";

/// One test's schema.
pub struct Pg {
    /// URL of the test database (no schema option).
    pub url: String,
    /// The schema's name (`t_` and 12 random hex digits).
    pub schema: String,
}

fn random_schema() -> String {
    let mut bytes = [0u8; 6];
    getrandom::fill(&mut bytes).unwrap();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("t_{hex}")
}

async fn connect(url: &str) -> Result<tokio_postgres::Client, String> {
    let connecting = tokio_postgres::connect(url, NoTls);
    let (client, conn) = tokio::time::timeout(Duration::from_secs(5), connecting)
        .await
        .map_err(|_| "timed out connecting".to_owned())?
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(client)
}

/// A fresh schema, or `None` (after saying why) when PostgreSQL is not reachable.
pub async fn fresh() -> Option<Pg> {
    let server = server();
    let admin = match connect(&format!("{server}/postgres")).await {
        Ok(client) => client,
        Err(e) => {
            if std::env::var_os("MCP_TASKS_REQUIRE_POSTGRES").is_some() {
                panic!(
                    "PostgreSQL is required (MCP_TASKS_REQUIRE_POSTGRES) but {server} is not reachable: {e}"
                );
            }
            // Straight to stderr, past the test harness's capture, so that `cargo test` says so.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: PostgreSQL is not reachable at {server} ({e}); start it (scripts/postgres.sh) or set MCP_TASKS_TEST_POSTGRES to run the PostgreSQL tests"
            );
            return None;
        }
    };
    let exists = admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&DATABASE])
        .await
        .unwrap()
        .is_some();
    if !exists {
        // Another test may create it at the same moment: "already exists" is fine.
        if let Err(e) = admin
            .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
            .await
        {
            let dup = e
                .as_db_error()
                .is_some_and(|d| d.code().code() == "42P04" || d.code().code() == "23505");
            assert!(dup, "creating the test database failed: {e}");
        }
    }
    let url = format!("{server}/{DATABASE}");
    let schema = random_schema();
    let client = connect(&url).await.unwrap();
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    Some(Pg { url, schema })
}

impl Pg {
    /// Store options for node `node` in this test's schema.
    pub fn options(&self, node: &str, lease_ttl: Duration) -> PostgresOptions {
        PostgresOptions {
            node_id: Some(node.to_owned()),
            lease_ttl,
            schema: Some(self.schema.clone()),
            pool_size: 4,
            ..PostgresOptions::default()
        }
    }

    /// The URL with this schema as the search path, for a `serve` process.
    pub fn url_with_schema(&self) -> String {
        format!("{}?options=-c%20search_path%3D{}", self.url, self.schema)
    }

    /// A plain client on the test database, with this schema as the search path.
    pub async fn client(&self) -> tokio_postgres::Client {
        let client = connect(&self.url).await.unwrap();
        client
            .batch_execute(&format!("SET search_path = {}", self.schema))
            .await
            .unwrap();
        client
    }

    /// Takes live task `id` over for `store` as a claim does once the lease of node `from`
    /// lapsed: `from`'s heartbeat is set an hour back for the claim and renewed right after
    /// (a claim takes a task only from a node whose lease lapsed). The claimed record.
    pub async fn take_over(
        &self,
        store: &mcp_tasks::store::PostgresStore,
        id: &str,
        from: &str,
    ) -> Option<Vec<u8>> {
        use mcp_tasks::store::Cluster;
        let client = self.client().await;
        let set = "UPDATE mcp_nodes SET heartbeat_at = now() + $2::bigint * interval '1 hour'
                   WHERE node_id = $1";
        client.execute(set, &[&from, &-1i64]).await.unwrap();
        let claimed = store.claim_one(id).await;
        client.execute(set, &[&from, &0i64]).await.unwrap();
        claimed.unwrap()
    }

    /// Drops the schema and everything in it.
    pub async fn drop(self) {
        if let Ok(client) = connect(&self.url).await {
            let _ = client
                .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
                .await;
        }
    }
}

/// Where PostgreSQL 15's server programs are (Debian/Ubuntu layout); overridden by
/// `MCP_TASKS_PG_BIN`.
fn pg_bin() -> std::path::PathBuf {
    std::env::var_os("MCP_TASKS_PG_BIN")
        .map(Into::into)
        .unwrap_or_else(|| "/usr/lib/postgresql/15/bin".into())
}

/// A PostgreSQL cluster of the test's own (initdb into a temporary directory, on a free
/// port), so that a test can stop and start the server without touching the shared one.
/// As root, the server runs as the `postgres` user (PostgreSQL refuses to run as root).
pub struct PrivateCluster {
    /// The port the server listens on (on 127.0.0.1).
    pub port: u16,
    dir: tempfile::TempDir,
    as_postgres: bool,
}

impl PrivateCluster {
    /// A new cluster, started; `None` (after saying why) where PostgreSQL's server programs
    /// are missing, unless `MCP_TASKS_REQUIRE_POSTGRES` is set.
    pub fn start() -> Option<PrivateCluster> {
        let bin = pg_bin();
        if !bin.join("initdb").exists() {
            if std::env::var_os("MCP_TASKS_REQUIRE_POSTGRES").is_some() {
                panic!(
                    "PostgreSQL is required (MCP_TASKS_REQUIRE_POSTGRES) but {} has no initdb (set MCP_TASKS_PG_BIN)",
                    bin.display()
                );
            }
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: no PostgreSQL server programs in {} (set MCP_TASKS_PG_BIN) for a private cluster",
                bin.display()
            );
            return None;
        }
        // SAFETY: geteuid(2) has no preconditions.
        let as_postgres = unsafe { libc::geteuid() } == 0;
        let dir = tempfile::Builder::new()
            .prefix("mcp-tasks-pg-")
            .tempdir()
            .unwrap();
        if as_postgres {
            let status = std::process::Command::new("chown")
                .args(["postgres:postgres"])
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(status.success(), "chown of the cluster directory failed");
        }
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let cluster = PrivateCluster {
            port,
            dir,
            as_postgres,
        };
        let data = cluster.data();
        cluster.run(
            "initdb",
            &["-D", &data, "-A", "trust", "-U", "postgres", "--no-sync"],
        );
        cluster.start_server();
        Some(cluster)
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn run(&self, program: &str, args: &[&str]) {
        let path = pg_bin().join(program);
        let mut command = if self.as_postgres {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            std::process::Command::new(&path)
        };
        let out = command.args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts the server and waits until it accepts connections.
    pub fn start_server(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log").display().to_string();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-o",
                &options,
                "-l",
                &log,
                "-w",
                "start",
            ],
        );
    }

    /// Stops the server (`fast`: open connections are cut, as in a restart).
    pub fn stop_server(&self) {
        self.run("pg_ctl", &["-D", &self.data(), "-m", "fast", "-w", "stop"]);
    }

    /// The URL of database `postgres` on this cluster.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let path = pg_bin().join("pg_ctl");
        let data = self.data();
        let args = ["-D", data.as_str(), "-m", "immediate", "-w", "stop"];
        let _ = if self.as_postgres {
            std::process::Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&path)
                .args(args)
                .output()
        } else {
            std::process::Command::new(&path).args(args).output()
        };
    }
}

impl PrivateCluster {
    /// A fresh schema in this cluster's database `postgres`, like [`fresh`] on the shared
    /// server.
    pub async fn fresh(&self) -> Pg {
        let url = self.url();
        let schema = random_schema();
        let client = connect(&url).await.unwrap();
        client
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .unwrap();
        Pg { url, schema }
    }

    /// Stops the server the hard way (`immediate`: no shutdown checkpoint, recovery from the
    /// WAL at the next start, as after a crash of PostgreSQL).
    pub fn crash_server(&self) {
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
    }
}
