//! The packaging: the release profile (no debug info, stripped: the size of the installed
//! binary), and what the files under `deploy/` promise (the linters in
//! `scripts/deploy-check.sh` check their syntax: `systemd-analyze verify`, hadolint).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// `[profile.release]` builds the binary people install: without debug info and stripped
/// (with `debug = 1` it was 166 MB, stripped about 24 MB); profiling has its own profile.
#[test]
fn the_release_profile_is_stripped_and_profiling_has_its_own() {
    let manifest: toml::Table = read("Cargo.toml").parse().unwrap();
    let profiles = manifest["profile"].as_table().unwrap();
    let release = profiles["release"].as_table().unwrap();
    let no_debug = match release.get("debug") {
        None => true,
        Some(toml::Value::Boolean(b)) => !b,
        Some(toml::Value::Integer(n)) => *n == 0,
        Some(toml::Value::String(s)) => s == "none",
        Some(other) => panic!("debug = {other}"),
    };
    assert!(no_debug, "[profile.release] must not carry debug info");
    assert!(
        matches!(release.get("strip"), Some(toml::Value::Boolean(true)))
            || matches!(release.get("strip"), Some(toml::Value::String(s)) if s == "symbols"),
        "[profile.release] must strip the binary: {release:?}"
    );
    let profiling = profiles["profiling"].as_table().unwrap();
    assert_eq!(profiling["inherits"].as_str(), Some("release"));
    assert!(profiling.contains_key("debug"), "{profiling:?}");
}

/// The systemd unit: restarted on exit 74 (the store halted after a failed fsync), SIGHUP on
/// reload (the token file), the configuration file, hardening.
#[test]
fn the_systemd_unit_restarts_on_74_and_reloads_with_sighup() {
    let unit = read("deploy/mcp-tasks.service");
    let values = |key: &str| -> Vec<String> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        values("ExecStart"),
        ["/usr/local/bin/mcp-tasks serve --config /etc/mcp-tasks/serve.toml"]
    );
    assert_eq!(values("ExecReload"), ["/bin/kill -HUP $MAINPID"]);
    assert_eq!(values("RestartForceExitStatus"), ["74"]);
    assert_eq!(values("Restart"), ["on-failure"]);
    assert_eq!(values("KillSignal"), ["SIGTERM"]);
    for hardening in [
        "NoNewPrivileges=yes",
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "CapabilityBoundingSet=",
        "SystemCallFilter=@system-service",
    ] {
        assert!(unit.lines().any(|l| l == hardening), "{hardening}");
    }
    // The store is in the state directory, the only place the service may write.
    assert_eq!(values("StateDirectory"), ["mcp-tasks"]);
    assert_eq!(
        values("Environment"),
        ["MCP_TASKS_STORE=/var/lib/mcp-tasks/tasks.redb"]
    );
    // docs/SERVE.md: exit 74 is the fail-stop after a failed fsync.
    assert!(read("docs/SERVE.md").contains("exits with status 74"));
}

/// The Dockerfile: two stages on the crate's Rust version, a non-root numeric user, the store
/// on a volume, the health check by the binary on `/readyz`.
#[test]
fn the_dockerfile_runs_as_non_root_with_the_store_on_a_volume() {
    let dockerfile = read("deploy/Dockerfile");
    let instructions: Vec<&str> = dockerfile
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with(' ') && !l.trim().is_empty())
        .collect();
    let froms: Vec<&&str> = instructions
        .iter()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(froms.len(), 2, "multi-stage: {froms:?}");
    let manifest: toml::Table = read("Cargo.toml").parse().unwrap();
    let rust = manifest["workspace"]["package"]["rust-version"]
        .as_str()
        .unwrap();
    assert!(
        froms[0].starts_with(&format!("FROM rust:{rust}-")),
        "the build stage uses the workspace's rust-version {rust}: {}",
        froms[0]
    );
    let user = instructions
        .iter()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER");
    let uid: u32 = user.split(':').next().unwrap().parse().unwrap();
    assert!(uid > 0, "non-root");
    assert!(instructions.contains(&"VOLUME [\"/var/lib/mcp-tasks\"]"));
    assert!(dockerfile.contains("MCP_TASKS_STORE=/var/lib/mcp-tasks/tasks.redb"));
    assert!(dockerfile.contains(
        "CMD [\"mcp-tasks\", \"healthcheck\", \"--url\", \"http://127.0.0.1:8080/readyz\""
    ));
    assert!(dockerfile.contains("MCP_TASKS_LISTEN=0.0.0.0:8080"));
    assert_eq!(
        instructions.last(),
        Some(&"ENTRYPOINT [\"mcp-tasks\", \"serve\"]")
    );
}

/// The example configuration is one `serve` accepts (its store and address replaced).
#[test]
fn the_example_configuration_starts_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("t.redb");
    let config = format!("{}/../../deploy/serve.toml", env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-tasks"));
    cmd.args(["serve", "--config", &config, "--listen", "127.0.0.1:0"])
        .args(["--no-admin-socket", "--store", store.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("MCP_TASKS_") {
            cmd.env_remove(key);
        }
    }
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = Vec::new();
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        let listening = line.contains("listening on http://127.0.0.1:");
        lines.push(line);
        if listening {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let last = lines.last().expect("no output");
    assert!(last.contains("listening on"), "{lines:#?}");
    // The file's log-format = "json".
    assert!(
        serde_json::from_str::<serde_json::Value>(last).is_ok(),
        "{last}"
    );
}
