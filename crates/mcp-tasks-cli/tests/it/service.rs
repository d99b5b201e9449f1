//! Running as a service: `serve --config` below the environment and the command line, the
//! errors for bad configuration, durations and sizes, the `/healthz` and `/readyz` probes
//! (also while the store is unavailable), `--log-format json`, and `mcp-tasks healthcheck`.

use crate::pg;
use crate::sim;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_tasks::auth::StaticTokens;
use mcp_tasks::store::Store;
use mcp_tasks::transport::http::{HttpConfig, router, serve};
use mcp_tasks::{Runtime, RuntimeHandle};

const BIN: &str = env!("CARGO_BIN_EXE_mcp-tasks");

/// `mcp-tasks ARGS` without any `MCP_TASKS_*` variable of the test's own environment.
fn bin(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("MCP_TASKS_") {
            cmd.env_remove(key);
        }
    }
    cmd.env_remove("RUST_LOG");
    cmd
}

/// Kills the server when a test ends, passed or not; its stderr lines arrive on `lines`.
struct Server(Child, std::sync::mpsc::Receiver<String>);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cmd` and reads its stderr until a line contains `until`; returns the lines read
/// (the server goes on running until dropped).
fn start_until(mut cmd: Command, until: &str) -> (Server, Vec<String>) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    // Read to the end on a thread of its own: a closed pipe would fail the server's writes.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let server = Server(child, rx);
    let mut lines = Vec::new();
    while let Ok(line) = server.1.recv() {
        let done = line.contains(until);
        lines.push(line);
        if done {
            return (server, lines);
        }
    }
    panic!("the server ended before logging `{until}`: {lines:#?}");
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// The one option set three ways: the command line wins over the environment, which wins
/// over the file; an option only the file sets applies in every case.
#[test]
fn configuration_precedence_is_file_then_environment_then_flag() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("t.redb");
    let config = write(
        dir.path(),
        "serve.toml",
        &format!(
            "# serve options\nlisten = \"127.0.0.3:0\"\nstore = {:?}\nno-admin-socket = true\nlog-format = \"json\"\ntask-ttl = \"30m\"\nmax-body-bytes = \"1MiB\"\nallowed-origin = [\"https://a.example\", \"https://b.example\"]\n",
            store.to_str().unwrap()
        ),
    );
    let listening = |lines: &[String]| {
        let line = lines.last().unwrap();
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| {
            panic!("the file's log-format = \"json\" was not applied ({e}): {line}")
        });
        v["fields"]["message"].as_str().unwrap().to_owned()
    };

    let (_s, lines) = start_until(bin(&["serve", "--config", &config]), "listening on");
    assert!(
        listening(&lines).starts_with("listening on http://127.0.0.3:"),
        "{lines:?}"
    );
    drop(_s);

    let mut cmd = bin(&["serve", "--config", &config]);
    cmd.env("MCP_TASKS_LISTEN", "127.0.0.2:0");
    let (_s, lines) = start_until(cmd, "listening on");
    assert!(
        listening(&lines).starts_with("listening on http://127.0.0.2:"),
        "{lines:?}"
    );
    drop(_s);

    let mut cmd = bin(&["serve", "--config", &config, "--listen", "127.0.0.1:0"]);
    cmd.env("MCP_TASKS_LISTEN", "127.0.0.2:0");
    let (_s, lines) = start_until(cmd, "listening on");
    assert!(
        listening(&lines).starts_with("listening on http://127.0.0.1:"),
        "{lines:?}"
    );
    drop(_s);

    // The configuration file named by the environment, and a switch set there.
    let mut cmd = bin(&["serve"]);
    cmd.env("MCP_TASKS_CONFIG", &config)
        .env("MCP_TASKS_LOG_FORMAT", "text");
    let (_s, lines) = start_until(cmd, "listening on");
    let last = lines.last().unwrap();
    assert!(
        last.contains("listening on http://127.0.0.3:") && !last.starts_with('{'),
        "{lines:?}"
    );
}

/// Runs `mcp-tasks ARGS` expecting a usage error; returns its stderr.
fn refused(mut cmd: Command) -> String {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    stderr
}

#[test]
fn bad_configuration_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let serve_with = |text: &str| {
        let config = write(dir.path(), "c.toml", text);
        refused(bin(&["serve", "--config", &config]))
    };
    let one_line = |stderr: &str, want: &str| {
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(want), "want `{want}` in: {stderr}");
    };
    one_line(
        &serve_with("listen = \"127.0.0.1:0\"\nlisten-addr = \"x\"\n"),
        "c.toml: unknown key `listen-addr` (the keys are the long options of `mcp-tasks serve`",
    );
    one_line(
        &serve_with("header-read-timeout = \"10x\"\n"),
        "c.toml: invalid value '10x' for '--header-read-timeout <DURATION>': unknown unit `x` in `10x`: use ms, s, m, h or d",
    );
    one_line(
        &serve_with("cache-size = \"64 parsecs\"\n"),
        "unknown unit `parsecs` in `64 parsecs`: use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB",
    );
    one_line(
        &serve_with("task-ttl = \"99999999999999999999d\"\n"),
        "`99999999999999999999d` is too large",
    );
    one_line(
        &serve_with("listen = 127.0.0.1\n"),
        "c.toml is not valid TOML (line 1)",
    );
    one_line(
        &serve_with("no-auth = \"yes\"\n"),
        "`no-auth` is a switch: true or false",
    );
    one_line(
        &serve_with("listen = [\"a\", \"b\"]\n"),
        "`listen` takes one value, not a list",
    );
    let missing = dir.path().join("missing.toml");
    one_line(
        &refused(bin(&["serve", "--config", missing.to_str().unwrap()])),
        "cannot read the configuration file",
    );
    // The same syntax and messages on the command line, in the environment, and on the
    // client and store commands.
    let first = |stderr: String| stderr.lines().next().unwrap_or_default().to_owned();
    assert_eq!(
        first(refused(bin(&["serve", "--max-body-bytes", "4 MB/s"]))),
        "error: invalid value '4 MB/s' for '--max-body-bytes <SIZE>': unknown unit `MB/s` in `4 MB/s`: use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
    );
    let mut cmd = bin(&["serve"]);
    cmd.env("MCP_TASKS_LEASE_TTL", "15");
    assert_eq!(
        first(refused(cmd)),
        "error: invalid value '15' for '--lease-ttl <DURATION>': `15` needs a unit: ms, s, m, h or d (e.g. 10s, 15m)"
    );
    assert_eq!(
        first(refused(bin(&["tools", "--timeout", "soon"]))),
        "error: invalid value 'soon' for '--timeout <DURATION>': `soon` is not a duration such as 250ms, 10s, 15m, 1h or 2d"
    );
    assert_eq!(
        first(refused(bin(&[
            "store",
            "purge",
            "--older-than",
            "213503982334602d"
        ]))),
        "error: invalid value '213503982334602d' for '--older-than <AGE>': `213503982334602d` is too large"
    );
}

/// A server on 127.0.0.1:0 serving `router`; returns its base URL and a stopper.
async fn http_server(handle: RuntimeHandle, config: HttpConfig) -> (String, impl FnOnce()) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let app = router(handle, config);
    tokio::spawn(serve(listener, app, async {
        stopped.await.ok();
    }));
    (base, move || {
        stop.send(()).ok();
    })
}

async fn get(url: &str, host: Option<&str>) -> (u16, String) {
    let mut request = reqwest::Client::new().get(url);
    if let Some(host) = host {
        request = request.header("Host", host);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// Polls `url` until it answers `status` (for 20 s at most, else fails saying `what`);
/// returns the body of that answer.
async fn until_status(url: &str, status: u16, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (got, body) = get(url, None).await;
        if got == status {
            return body;
        }
        assert!(Instant::now() < deadline, "{what}: {got} {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Both probes answer without authentication and whatever the `Host`, while `/mcp` still
/// requires a token; `/readyz` turns 503 once the store is closed.
#[tokio::test]
async fn probes_answer_without_authentication_and_readyz_follows_the_store() {
    let runtime = Runtime::builder_with_store(Store::memory())
        .start()
        .await
        .unwrap();
    let mut config = HttpConfig::default();
    config.authenticator = Arc::new(StaticTokens::parse("").unwrap());
    let (base, stop) = http_server(runtime.handle(), config).await;

    assert_eq!(
        get(&format!("{base}/healthz"), None).await,
        (200, "ok\n".into())
    );
    assert_eq!(
        get(
            &format!("{base}/readyz"),
            Some("pod-10-1-2-3.internal:8080")
        )
        .await,
        (200, "ready\n".into())
    );
    let status = reqwest::Client::new()
        .post(format!("{base}/mcp"))
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 401, "the MCP endpoint still needs a token");

    mcp_tasks::internals::runtime_store(&runtime).close().await;
    let (status, body) = get(&format!("{base}/readyz"), None).await;
    assert_eq!(
        (status, body.as_str()),
        (503, "not ready: the task store is closed\n")
    );
    assert_eq!(get(&format!("{base}/healthz"), None).await.0, 200);
    stop();
    runtime.shutdown().await;
}

/// A store halted by a failed fsync (fail-stop, as `crates/mcp-tasks-cli/tests/crash/crash_faults.rs` provokes it) makes
/// `/readyz` answer 503 with the reason, while `/healthz` still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_once_the_store_halted() {
    let disk = sim::disk::SimDisk::new();
    let dir = tempfile::tempdir().unwrap();
    let builder = Runtime::builder("halt.redb").store_backend(disk.factory());
    let runtime = mcp_tasks_testkit::sim::install(builder, dir.path().join("effects.log"))
        .start()
        .await
        .unwrap();
    let (base, stop) = http_server(runtime.handle(), HttpConfig::default()).await;
    assert_eq!(get(&format!("{base}/readyz"), None).await.0, 200);

    disk.fail_next_syncs(1);
    let spec = mcp_tasks_testkit::sim::JobSpec {
        steps: 1,
        inputs: Default::default(),
        fail: false,
        delay_ms: 0,
    };
    let create = sim::driver::request(
        1,
        "tools/call",
        serde_json::json!({ "name": mcp_tasks_testkit::sim::TOOL, "arguments": spec.to_arguments() }),
    );
    let reply = runtime
        .handle_json(create, &mcp_tasks::Owner::anonymous())
        .await
        .unwrap();
    assert_eq!(reply["error"]["code"], -32603, "{reply}");
    assert!(runtime.halted().is_some());
    let (status, body) = get(&format!("{base}/readyz"), None).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.starts_with("not ready: the task store halted: "),
        "{body}"
    );
    assert_eq!(get(&format!("{base}/healthz"), None).await.0, 200);
    stop();
    runtime.shutdown().await;
}

/// On PostgreSQL `/readyz` needs this node's heartbeat to be current: a node whose heartbeat
/// stops (as a paused process) answers 503 once its lease TTL passed, and 200 again once it
/// renews; and the database must answer: 503 naming it while it does not.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_on_postgres_needs_a_current_heartbeat() {
    let Some(pg) = pg::fresh().await else { return };
    let ttl = Duration::from_millis(600);
    let handle = Arc::new(
        mcp_tasks::store::PostgresStore::open(&pg.url, pg.options("ready-a", ttl))
            .await
            .unwrap(),
    );
    let runtime = Runtime::builder_with_store(Store::from_backend(handle.clone()))
        .start()
        .await
        .unwrap();
    let (base, stop) = http_server(runtime.handle(), HttpConfig::default()).await;
    let readyz = format!("{base}/readyz");
    assert_eq!(get(&readyz, None).await, (200, "ready\n".into()));

    mcp_tasks::internals::pg_faults::pause_heartbeat(&handle, true);
    let body = until_status(&readyz, 503, "still ready without heartbeats").await;
    assert!(
        body.starts_with("not ready: this node's lease was last renewed"),
        "{body}"
    );
    mcp_tasks::internals::pg_faults::pause_heartbeat(&handle, false);
    until_status(&readyz, 200, "not ready again after heartbeats resumed").await;

    // The database stops answering (the store's simulated outage: every connection it asks
    // for fails) while the heartbeat is still current: 503 with the database's reason. On a
    // loaded machine the heartbeat may already be older than the TTL when the probe runs
    // (then the answer names the lease instead): try again from a ready node.
    let mut seen = Vec::new();
    for _ in 0..5 {
        mcp_tasks::internals::pg_faults::simulate_outage(&handle, true);
        let (status, body) = get(&readyz, None).await;
        mcp_tasks::internals::pg_faults::simulate_outage(&handle, false);
        assert_eq!(status, 503, "{body}");
        if body.starts_with("not ready: the database is unreachable") {
            seen.clear();
            break;
        }
        seen.push(body);
        until_status(&readyz, 200, "not ready again after the outage").await;
    }
    assert!(seen.is_empty(), "never the database's reason: {seen:#?}");
    until_status(&readyz, 200, "not ready again after the outage").await;
    stop();
    runtime.shutdown().await;
    pg.drop().await;
}

/// The binary: the probes on the MCP and the metrics addresses, `mcp-tasks healthcheck`
/// against them, and JSON log lines (each one parses, and events in a request's span carry
/// the span's fields).
#[test]
fn serve_probes_healthcheck_and_json_logs() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("t.redb");
    let mut cmd = bin(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--no-admin-socket",
        "--store",
        store.to_str().unwrap(),
        "--log-format",
        "json",
    ]);
    cmd.env(
        "RUST_LOG",
        "debug,ractor=warn,hyper=warn,h2=warn,reqwest=warn",
    );
    let (mut server, mut lines) = start_until(cmd, "listening on http://");
    let address = |lines: &[String], prefix: &str| {
        lines
            .iter()
            .find_map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).ok()?;
                let m = v["fields"]["message"].as_str()?;
                Some(m.strip_prefix(prefix)?.split('/').next()?.to_owned())
            })
            .unwrap_or_else(|| panic!("no `{prefix}` line in {lines:#?}"))
    };
    let mcp = address(&lines, "listening on http://");
    let metrics = address(&lines, "metrics on http://");
    for addr in [&mcp, &metrics] {
        let out = bin(&["healthcheck", "--url", &format!("http://{addr}/readyz")])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("http://{addr}/readyz: 200 ready\n")
        );
        let out = bin(&["healthcheck", "--url", &format!("http://{addr}/healthz")])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    // A request, so that events are logged inside its span.
    let out = bin(&["tools", "--url", &format!("http://{mcp}/mcp")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    // SIGTERM: a graceful stop, then every line read.
    unsafe { libc::kill(server.0.id() as i32, libc::SIGTERM) };
    assert!(server.0.wait().unwrap().success());
    lines.extend(server.1.iter());
    let mut in_span = 0;
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a log line is not JSON ({e}): {line}"));
        assert!(v["level"].is_string() && v["fields"].is_object(), "{line}");
        if v["spans"].as_array().is_some_and(|spans| !spans.is_empty()) {
            // The current span with its fields (the group commit's `jobs` and `ops`).
            assert!(v["span"]["name"].is_string(), "{line}");
            in_span += 1;
        }
    }
    assert!(in_span > 0, "no event inside a span: {lines:#?}");

    // Nothing listens any more: the probe fails with the reason.
    let out = bin(&["healthcheck", "--url", &format!("http://{mcp}/readyz")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!("error: http://{mcp}/readyz: ")),
        "{stderr}"
    );
}

/// The MCP address answers the probes while the store is still opening: `/healthz` 200 and
/// `/readyz` 503 (not a connection that hangs), while an MCP request that arrives then waits and
/// is answered once the runtime started. A restart on PostgreSQL under a node id whose previous
/// process was killed waits for that process's heartbeat to go stale (two thirds of the lease
/// TTL): the window this test probes.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_address_answers_the_probes_while_the_store_opens() {
    let Some(pg) = pg::fresh().await else { return };
    let store = pg.url_with_schema();
    let serve = |listen: &str| {
        bin(&[
            "serve",
            "--listen",
            listen,
            "--no-admin-socket",
            "--store",
            &store,
            "--node-id",
            "probe-node",
            "--lease-ttl",
            "6s",
        ])
    };
    // The first process runs, then is killed with its heartbeat fresh.
    let (first, _) = start_until(serve("127.0.0.1:0"), "listening on http://");
    drop(first);

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let mut cmd = serve(&format!("127.0.0.1:{port}"));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let second = Server(cmd.spawn().unwrap(), std::sync::mpsc::channel().1);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    // Until the address is bound: connection refused.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (status, body) = loop {
        match client.get(format!("{base}/readyz")).send().await {
            Ok(r) => break (r.status().as_u16(), r.text().await.unwrap()),
            Err(e) => {
                assert!(Instant::now() < deadline, "never bound: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(
        (status, body.as_str()),
        (
            503,
            "not ready: starting: the store is opening or recovering\n"
        )
    );
    assert_eq!(
        get(&format!("{base}/healthz"), None).await,
        (200, "ok\n".into())
    );
    // An MCP request now waits for the runtime, then is answered.
    let early = tokio::spawn({
        let client = client.clone();
        let url = format!("{base}/mcp");
        async move {
            client
                .post(url)
                .header("Content-Type", "application/json")
                .header("Accept", "application/json, text/event-stream")
                .header("MCP-Protocol-Version", "2026-07-28")
                .header("Mcp-Method", "tools/list")
                .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}"#)
                .send()
                .await
                .unwrap()
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = get(&format!("{base}/readyz"), None).await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(Instant::now() < deadline, "never ready: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer = early.await.unwrap();
    assert_eq!(answer.status(), 200);
    let body = answer.text().await.unwrap();
    assert!(body.contains("generate_report"), "{body}");
    drop(second);
    pg.drop().await;
}

/// `serve --store memory`: the in-memory store behind the same runtime. It says at start, as a
/// warning, that nothing survives; a task it created answers while it runs, and after a
/// restart the same id is unknown (exit 7, the server refused the id). `--node-id` is refused
/// with it, as with a redb file, and the store commands say that there is no file to read.
#[test]
fn serve_store_memory_warns_and_keeps_nothing_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let handles = dir.path().join("handles.json");
    let handles = handles.to_str().unwrap();
    let serve = || bin(&["serve", "--listen", "127.0.0.1:0", "--store", "memory"]);
    let url_of = |lines: &[String]| {
        lines
            .iter()
            .find_map(|l| {
                Some(format!(
                    "http://{}",
                    l.split("listening on http://").nth(1)?
                ))
            })
            .unwrap()
    };
    let (server, lines) = start_until(serve(), "listening on http://");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("WARN") && l.contains("NOTHING survives a restart")),
        "{lines:#?}"
    );
    let url = url_of(&lines);
    let client = |args: &[&str]| {
        let mut cmd = bin(args);
        cmd.args(["--url", &url, "--handle-store", handles]);
        cmd.stdin(Stdio::null()).output().unwrap()
    };
    let out = client(&[
        "call",
        "generate_report",
        "--args",
        r#"{"size":"small"}"#,
        "--detach",
    ]);
    assert!(out.status.success(), "{out:?}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(id.starts_with("tsk_"), "{id}");
    let out = client(&["get", &id]);
    assert!(
        matches!(out.status.code(), Some(0 | 5 | 6)),
        "the task is there while the server runs: {out:?}"
    );
    drop(server);

    let (_server, lines) = start_until(serve(), "listening on http://");
    let url = url_of(&lines);
    let mut cmd = bin(&["get", &id, "--url", &url, "--handle-store", handles]);
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(7), "the task is gone: {out:?}");

    let out = bin(&["serve", "--store", "memory", "--node-id", "a"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("error: --node-id needs a PostgreSQL store"),
        "{stderr}"
    );
    // The store commands say why there is nothing to read.
    let out = bin(&["store", "stats", "--store", "memory"])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("`serve --store memory` keeps its tasks in the server's memory"),
        "{stderr}"
    );
}

/// A URL of no store this build has is refused, by `serve` and by the store commands alike
/// (the one location rule, `admin::Location::parse`), its password left out; it is never
/// taken for the path of a redb file.
#[test]
fn a_url_of_no_known_store_is_refused_not_taken_for_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let url = "mysql://app:secret@db/tasks";
    let out = bin(&["serve", "--store", url, "--listen", "127.0.0.1:0"])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--store mysql://app@db/tasks: not a store this server can open"),
        "{stderr}"
    );
    assert!(!stderr.contains("secret"), "{stderr}");
    let out = bin(&["store", "stats", "--store", url])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("no store of this build is reached by this kind of URL"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no file was created"
    );
}
