//! The client commands of the binary against `mcp-tasks serve --fixtures conformance` on
//! 127.0.0.1: output and exit codes without a terminal, errors a person can act on, and the
//! interactive path under a pseudo-terminal.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_mcp-tasks");
const WAIT: Duration = Duration::from_secs(60);

/// `mcp-tasks serve` on a free port; killed on drop.
struct Serve {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Serve {
    fn start() -> Self {
        Self::start_with(&[])
    }

    fn start_with(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(BIN)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--fixtures",
                "conformance",
            ])
            .args(extra)
            .arg("--store")
            .arg(dir.path().join("tasks.redb"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines.next().expect("serve printed its address").unwrap();
            if let Some(at) = line.find("listening on ") {
                break line[at + "listening on ".len()..].trim().to_owned();
            }
        };
        // Keep draining the server's log so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Self {
            child,
            url,
            _dir: dir,
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(url: &str, args: &[&str]) -> Run {
    run_env(url, args, &[])
}

fn run_env(url: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let out = Command::new(BIN)
        .args(args)
        .env("MCP_TASKS_URL", url)
        .env_remove("MCP_TASKS_TOKEN")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    eprintln!(
        "$ mcp-tasks {}\n[exit {}]\n{}{}",
        args.join(" "),
        run.code,
        run.stdout,
        run.stderr
    );
    run
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout))
}

/// The id a non-interactive `call` printed when the task needs input.
fn input_required_id(run: &Run) -> String {
    assert_eq!(run.code, 5, "{}", run.stderr);
    let first = run.stdout.lines().next().unwrap();
    let (id, status) = first.split_once(' ').unwrap();
    assert_eq!(status, "input_required");
    id.to_owned()
}

#[test]
fn help_documents_the_exit_codes() {
    for args in [&["--help"][..], &["call", "--help"], &["watch", "--help"]] {
        let r = run("http://127.0.0.1:9/mcp", args);
        assert_eq!(r.code, 0);
        assert!(r.stdout.contains("Exit codes:"), "{}", r.stdout);
        assert!(r.stdout.contains("5  input required"), "{}", r.stdout);
        assert!(r.stdout.contains("8  transport error"), "{}", r.stdout);
    }
}

#[test]
fn scripts_drive_tasks_by_exit_code() {
    let server = Serve::start();
    let url = server.url.as_str();

    let r = run(url, &["tools"]);
    assert_eq!(r.code, 0);
    assert!(
        r.stdout.lines().any(|l| l.starts_with("slow_compute ")),
        "{}",
        r.stdout
    );
    let r = run(url, &["tools", "--json"]);
    assert!(
        json(&r)
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "greet")
    );

    let r = run(url, &["call", "greet", "--args", r#"{"name":"Ada"}"#]);
    assert_eq!((r.code, r.stdout.as_str()), (0, "Hello, Ada!\n"));
    let r = run(
        url,
        &[
            "call",
            "slow_compute",
            "--args",
            r#"{"seconds":1,"label":"x"}"#,
        ],
    );
    assert_eq!((r.code, r.stdout.as_str()), (0, "Computed `x` in 1 s.\n"));
    assert!(
        r.stderr.is_empty(),
        "quiet without a terminal: {}",
        r.stderr
    );
    let r = run(url, &["call", "failing_job"]);
    assert_eq!(r.code, 1, "isError");
    let r = run(url, &["call", "protocol_error_job", "--json"]);
    assert_eq!(r.code, 3, "failed");
    let task = json(&r);
    assert_eq!(task["status"], "failed");
    assert!(task["error"]["code"].is_i64());

    // Input required without a terminal: the id and the requests, exit 5; answer; watch.
    let r = run(url, &["call", "multi_input"]);
    let id = input_required_id(&r);
    assert!(
        r.stdout.contains("  confirm: elicitation/create"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("  name: elicitation/create"),
        "{}",
        r.stdout
    );
    assert!(
        r.stderr.contains(&format!("mcp-tasks answer {id} KEY")),
        "{}",
        r.stderr
    );
    let r = run(
        url,
        &[
            "answer",
            &id,
            "confirm",
            r#"{"action":"accept","content":{"confirm":true}}"#,
        ],
    );
    assert_eq!(r.code, 0);
    let r = run(url, &["get", &id, "--json"]);
    assert_eq!(r.code, 5);
    let task = json(&r);
    assert_eq!(task["status"], "input_required");
    assert!(task["inputRequests"].get("confirm").is_none());
    assert!(task["inputRequests"].get("name").is_some());
    let r = run(url, &["watch", &id]);
    assert_eq!(r.code, 5, "still waiting for `name`");
    let r = run(
        url,
        &[
            "answer",
            &id,
            "name",
            r#"{"action":"accept","content":{"name":"Ada"}}"#,
            "--json",
        ],
    );
    assert_eq!(r.code, 0);
    assert_eq!(json(&r)["answered"][0], "name");
    let r = run(url, &["watch", &id]);
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (0, "Received name=Ada, confirm=true.\n")
    );
    let r = run(url, &["get", &id]);
    assert_eq!(r.code, 0);
    assert!(
        r.stdout.starts_with(&format!("{id} completed")),
        "{}",
        r.stdout
    );

    // Cancel.
    let r = run(
        url,
        &[
            "call",
            "confirm_delete",
            "--args",
            r#"{"filename":"a.txt"}"#,
        ],
    );
    let id = input_required_id(&r);
    assert_eq!(run(url, &["cancel", &id]).code, 0);
    assert_eq!(run(url, &["watch", &id]).code, 4);
    assert_eq!(run(url, &["get", &id]).code, 4);

    // A task still working: `get` says so with 6.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let id = rt.block_on(async {
        let client = mcp_tasks::client::Client::http(url)
            .unwrap()
            .build()
            .await
            .unwrap();
        match client
            .call_tool("slow_compute", serde_json::json!({ "seconds": 60 }))
            .await
            .unwrap()
        {
            mcp_tasks::client::CallOutcome::Task(t) => t.id().to_owned(),
            other => panic!("{other:?}"),
        }
    });
    let r = run(url, &["get", &id]);
    assert_eq!(r.code, 6);
    assert!(
        r.stdout.starts_with(&format!("{id} working")),
        "{}",
        r.stdout
    );
    assert_eq!(run(url, &["cancel", &id, "--json"]).code, 0);
    assert_eq!(run(url, &["watch", &id, "--json"]).code, 4);
}

#[test]
fn errors_a_person_can_act_on() {
    let server = Serve::start();
    let url = server.url.as_str();
    let r = run(url, &["call", "no_such_tool"]);
    assert_eq!(r.code, 7);
    assert!(
        r.stderr.contains("unknown tool `no_such_tool`"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("greet"),
        "the list of tools: {}",
        r.stderr
    );
    let r = run(url, &["get", "tsk_00000000000000000000000000000000"]);
    assert_eq!(r.code, 7);
    assert!(
        r.stderr
            .contains("unknown task `tsk_00000000000000000000000000000000`"),
        "{}",
        r.stderr
    );
    let r = run(url, &["call", "greet", "--args", "{not json"]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("--args is not valid JSON"),
        "{}",
        r.stderr
    );
    let r = run(url, &["answer", "tsk_x", "k", "[1]"]);
    assert_eq!(r.code, 2);
    let r = run(url, &["tools", "--timeout", "0"]);
    assert_eq!(r.code, 2);
    // A server that accepts connections and never answers: --timeout bounds each try.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("http://{}/mcp", silent.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in silent.incoming() {
            held.push(s);
        }
    });
    let r = run(&silent_url, &["call", "greet", "--timeout", "0.3"]);
    assert_eq!(r.code, 8, "{}", r.stderr);
    assert!(r.stderr.contains("no response"), "{}", r.stderr);
    // A synchronous input round has no task id to answer later.
    let r = run(url, &["call", "test_tool_with_task"]);
    assert_eq!(r.code, 5);
    assert!(r.stderr.contains("user_name"), "{}", r.stderr);
    drop(server);

    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let r = run(&format!("http://{closed}/mcp"), &["tools"]);
    assert_eq!(r.code, 8);
    assert!(r.stderr.contains("connection refused"), "{}", r.stderr);
    let r = run("ftp://127.0.0.1/mcp", &["tools"]);
    assert_eq!(r.code, 2);
}

#[test]
fn unauthorized_shows_the_resource_metadata() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(String::new()));
    let s = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut buf = [0u8; 8192];
            let n = stream.read(&mut buf).unwrap_or(0);
            s.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
            let _ = stream.write_all(
                b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer error=\"invalid_token\", resource_metadata=\"http://127.0.0.1:9/.well-known/oauth-protected-resource\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    let url = format!("http://{addr}/mcp");
    let r = run_env(&url, &["tools"], &[("MCP_TASKS_TOKEN", "t0ken")]);
    assert_eq!(r.code, 8);
    assert!(
        r.stderr
            .contains("http://127.0.0.1:9/.well-known/oauth-protected-resource"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("token was not accepted"), "{}", r.stderr);
    assert!(
        seen.lock()
            .unwrap()
            .to_ascii_lowercase()
            .contains("authorization: bearer t0ken"),
        "the token from the environment was sent"
    );
    let r = run(&url, &["tools", "--token", ""]);
    assert_eq!(r.code, 8);
    assert!(r.stderr.contains("pass a token"), "{}", r.stderr);
}

#[test]
fn tokens_against_a_server_that_requires_them() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    // The SHA-256 of the token `test`.
    std::fs::write(
        &tokens,
        "[[tokens]]\nsha256 = \"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"\ntenant = \"acme\"\nprincipal = \"alice\"\n",
    )
    .unwrap();
    let server = Serve::start_with(&["--auth-tokens", tokens.to_str().unwrap()]);
    let url = server.url.as_str();
    let r = run(url, &["tools"]);
    assert_eq!(r.code, 8);
    assert!(
        r.stderr.contains("requires authentication (401)"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("/.well-known/oauth-protected-resource"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("pass a token"), "{}", r.stderr);
    let r = run(url, &["tools", "--token", "wrong"]);
    assert_eq!(r.code, 8);
    assert!(r.stderr.contains("token was not accepted"), "{}", r.stderr);
    let r = run_env(
        url,
        &["call", "greet", "--args", r#"{"name":"Ada"}"#],
        &[("MCP_TASKS_TOKEN", "test")],
    );
    assert_eq!((r.code, r.stdout.as_str()), (0, "Hello, Ada!\n"));
}

/// A pseudo-terminal: the child gets the slave as stdin, stdout and stderr.
struct Pty {
    master: std::fs::File,
    output: Arc<Mutex<String>>,
}

impl Pty {
    fn spawn(url: &str, args: &[&str]) -> (Child, Pty) {
        use std::os::fd::FromRawFd;
        let (mut master, mut slave) = (0, 0);
        let ws = libc::winsize {
            ws_row: 24,
            ws_col: 120,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: openpty writes two new descriptors; the pointers are valid.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                &ws,
            )
        };
        assert_eq!(rc, 0, "openpty");
        // SAFETY: both descriptors are fresh and owned here.
        let (master, slave) = unsafe {
            (
                std::fs::File::from_raw_fd(master),
                std::fs::File::from_raw_fd(slave),
            )
        };
        let child = Command::new(BIN)
            .args(args)
            .env("MCP_TASKS_URL", url)
            .stdin(slave.try_clone().unwrap())
            .stdout(slave.try_clone().unwrap())
            .stderr(slave)
            .spawn()
            .unwrap();
        let output = Arc::new(Mutex::new(String::new()));
        let (mut reader, out) = (master.try_clone().unwrap(), output.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // Reading fails with EIO once the child has closed the slave.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                out.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        (child, Pty { master, output })
    }

    fn expect(&self, text: &str) {
        let deadline = Instant::now() + WAIT;
        while !self.output.lock().unwrap().contains(text) {
            assert!(
                Instant::now() < deadline,
                "no {text:?} in {:?}",
                self.output.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn send(&mut self, line: &str) {
        self.master.write_all(line.as_bytes()).unwrap();
        self.master.write_all(b"\n").unwrap();
    }
}

fn wait_child(child: &mut Child) -> i32 {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the command did not end");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn on_a_terminal_input_is_asked_and_progress_is_live() {
    let server = Serve::start();
    let (mut child, mut pty) = Pty::spawn(&server.url, &["call", "multi_input"]);
    pty.expect("? [confirm] Confirm the operation?");
    pty.expect("confirm (y/n): ");
    pty.send("maybe");
    pty.expect("not a valid y/n");
    pty.send("y");
    pty.expect("? [name] What name should be used?");
    pty.expect("name (string): ");
    pty.send("Ada");
    let code = wait_child(&mut child);
    pty.expect("Received name=Ada, confirm=true.");
    assert_eq!(code, 0, "{}", pty.output.lock().unwrap());

    // A working task shows the live line: spinner, id, status, elapsed seconds, message.
    let (mut child, pty) = Pty::spawn(
        &server.url,
        &["call", "slow_compute", "--args", r#"{"seconds":1}"#],
    );
    let code = wait_child(&mut child);
    assert_eq!(code, 0);
    pty.expect("Computed `` in 1 s.");
    let output = pty.output.lock().unwrap().clone();
    assert!(output.contains("working"), "{output:?}");
    assert!(output.contains("s — Computing."), "{output:?}");
    assert!(
        output.contains("\r\x1b[2K"),
        "the line is redrawn in place: {output:?}"
    );
}

#[test]
fn ctrl_c_stops_following_and_leaves_the_task_running() {
    let server = Serve::start();
    let (mut child, pty) = Pty::spawn(
        &server.url,
        &["call", "slow_compute", "--args", r#"{"seconds":30}"#],
    );
    // Several redraws of the live line: the command is in its loop, listening for Ctrl-C.
    let deadline = Instant::now() + WAIT;
    while pty.output.lock().unwrap().matches("\r\x1b[2K").count() < 4 {
        assert!(Instant::now() < deadline, "no live line");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: plain kill(2) on our own child.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) },
        0
    );
    assert_eq!(wait_child(&mut child), 130);
    pty.expect("interrupted: task tsk_");
    pty.expect("mcp-tasks cancel tsk_");
    let output = pty.output.lock().unwrap().clone();
    let id = output
        .split("interrupted: task ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .to_owned();
    let r = run(&server.url, &["get", &id]);
    assert_eq!(r.code, 6, "the task goes on: {}", r.stdout);
}
