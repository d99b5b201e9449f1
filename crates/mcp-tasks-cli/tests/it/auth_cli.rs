//! The `serve` command's authentication options, on the real binary: the refusal to serve a
//! non-loopback address without authentication, `--principal` on stdio, and reloading the
//! token file on SIGHUP.

use crate::support;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{post, request, token_entry};

fn bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-tasks"));
    cmd.env("RUST_LOG", "info");
    cmd
}

/// A `serve` child that is stopped (SIGTERM, then SIGKILL) when dropped.
struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        signal(&self.0, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// Starts `serve` on 127.0.0.1:0 and returns it with the address it logged.
fn serve(args: &[&str], dir: &std::path::Path) -> (Serving, SocketAddr) {
    let mut child = bin()
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--store"])
        .arg(dir.join("tasks.redb"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("serve logs its address")
            .expect("stderr is readable");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.trim_end_matches("/mcp").trim().parse().unwrap();
        }
    };
    // Keep draining stderr so that the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (Serving(child), addr)
}

#[test]
fn a_public_address_needs_authentication_or_an_explicit_no_auth() {
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["serve", "--listen", "0.0.0.0:0", "--store"])
        .arg(dir.path().join("tasks.redb"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refusing to serve") && stderr.contains("--no-auth"),
        "{stderr}"
    );

    // --no-auth is explicit consent: it starts (and warns).
    let mut child = bin()
        .args(["serve", "--listen", "0.0.0.0:0", "--no-auth", "--store"])
        .arg(dir.path().join("tasks.redb"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut warned = false;
    let child = Serving(child);
    for line in lines.by_ref() {
        let line = line.unwrap();
        warned |= line.contains("WITHOUT authentication");
        if line.contains("listening on") {
            break;
        }
    }
    assert!(warned, "a warning before serving");
    drop(child);

    // Options that make no sense together are refused by the parser.
    let out = bin()
        .args(["serve", "--no-auth", "--auth-tokens", "t.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

fn stdio_exchange(store: &std::path::Path, principal: &str, messages: &[Value]) -> Vec<Value> {
    let mut child = bin()
        .args(["serve", "--stdio", "--principal", principal, "--store"])
        .arg(store)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for m in messages {
        writeln!(stdin, "{m}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    out.stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect()
}

#[test]
fn stdio_tasks_belong_to_the_given_principal() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("tasks.redb");
    let create = request(
        json!(1),
        "tools/call",
        json!({ "name": "generate_report", "arguments": { "size": "small" } }),
    );
    let replies = stdio_exchange(&store, "acme/alice", &[create]);
    let task = replies[0]["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {replies:?}"))
        .to_owned();
    let get = request(json!(2), "tasks/get", json!({ "taskId": task }));
    let mine = stdio_exchange(&store, "acme/alice", std::slice::from_ref(&get));
    assert!(mine[0]["result"]["status"].is_string(), "{mine:?}");
    for other in ["acme/bob", "globex/alice"] {
        let theirs = stdio_exchange(&store, other, std::slice::from_ref(&get));
        assert_eq!(
            theirs[0]["error"]["message"],
            "Invalid params: Failed to retrieve task: Task not found",
            "{other}"
        );
    }

    let out = bin()
        .args(["serve", "--stdio", "--principal", "no-slash", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("TENANT/PRINCIPAL"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_file_is_reloaded_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, token_entry("first", "acme", "alice", &[])).unwrap();
    let (child, addr) = serve(&["--auth-tokens", tokens.to_str().unwrap()], dir.path());
    let discover = request(json!(1), "server/discover", json!({}));
    assert_eq!(post(addr, Some("first"), &discover).await.status, 200);
    assert_eq!(post(addr, Some("second"), &discover).await.status, 401);

    std::fs::write(&tokens, token_entry("second", "acme", "alice", &[])).unwrap();
    signal(&child.0, libc::SIGHUP);
    let deadline = Instant::now() + support::WAIT;
    while post(addr, Some("second"), &discover).await.status != 200 {
        assert!(Instant::now() < deadline, "the new token is never accepted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(post(addr, Some("first"), &discover).await.status, 401);

    // A broken file keeps the tokens in force.
    std::fs::write(&tokens, "[[tokens]]\nsha256 = 5").unwrap();
    signal(&child.0, libc::SIGHUP);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(post(addr, Some("second"), &discover).await.status, 200);

    // The metadata document names this server.
    let r = support::send(
        addr,
        "GET",
        "/.well-known/oauth-protected-resource/mcp",
        &[],
        b"",
    )
    .await;
    assert_eq!(r.json()["resource"], format!("http://{addr}/mcp"));
    drop(child);
}
