//! The client commands of the binary against `mcp-tasks serve --fixtures conformance` (and
//! docs/CLI.md's against a default `mcp-tasks serve`) on 127.0.0.1: output and exit codes without a terminal, errors a person can act on, and the
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
        let mut args = vec!["--fixtures", "conformance"];
        args.extend_from_slice(extra);
        Self::start_plain(&args)
    }

    /// `mcp-tasks serve` with the demo's default tool (no fixtures) and `extra`.
    fn start_plain(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0"])
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
        .env_remove("MCP_TASKS_TOKEN_FILE")
        // No list of created tasks in the home directory (the `ls` test names its own).
        .env("MCP_TASKS_HANDLE_STORE", "")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    shown(out, &format!("mcp-tasks {}", args.join(" ")))
}

/// What a finished command printed and its exit code, also shown on the test's stderr.
fn shown(out: std::process::Output, command: &str) -> Run {
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    eprintln!(
        "$ {command}\n[exit {}]\n{}{}",
        run.code, run.stdout, run.stderr
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
    // The gateway is found from the top-level help.
    let r = run("http://127.0.0.1:9/mcp", &["--help"]);
    assert!(
        r.stdout.contains("gateway") && r.stdout.contains("--upstream"),
        "{}",
        r.stdout
    );
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
    // `get` of the failed task: its status on stdout, its error once, on stderr.
    let message = task["error"]["message"].as_str().unwrap();
    let id = task["taskId"].as_str().unwrap();
    let r = run(url, &["get", id]);
    assert_eq!(r.code, 3);
    assert!(
        r.stdout.starts_with(&format!("{id} failed\n")),
        "{}",
        r.stdout
    );
    let all = format!("{}{}", r.stdout, r.stderr);
    assert_eq!(all.matches(message).count(), 1, "the error once: {all}");

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
    // --token-file keeps the token out of the command line (and out of `ps`).
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "test\n").unwrap();
    let token_path = token_file.to_str().unwrap();
    let r = run(
        url,
        &[
            "call",
            "greet",
            "--args",
            r#"{"name":"Ada"}"#,
            "--token-file",
            token_path,
        ],
    );
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (0, "Hello, Ada!\n"),
        "{}",
        r.stderr
    );
    let r = run_env(
        url,
        &["tools", "-q"],
        &[("MCP_TASKS_TOKEN_FILE", token_path)],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    std::fs::write(&token_file, "wrong\n").unwrap();
    let r = run(url, &["tools", "--token-file", token_path]);
    assert_eq!(r.code, 8);
    assert!(r.stderr.contains("token was not accepted"), "{}", r.stderr);
    // Both ways at once is ambiguous; a missing or empty file is a usage error.
    let r = run(
        url,
        &["tools", "--token-file", token_path, "--token", "test"],
    );
    assert_eq!(r.code, 2);
    assert_eq!(
        r.stderr,
        "error: give the token either with --token-file (MCP_TASKS_TOKEN_FILE) or with --token \
         (MCP_TASKS_TOKEN), not both\n"
    );
    std::fs::write(&token_file, " \n").unwrap();
    let r = run(url, &["tools", "--token-file", token_path]);
    assert_eq!(r.code, 2);
    assert_eq!(
        r.stderr,
        format!("error: the token file {token_path} is empty\n")
    );
    let missing = dir.path().join("missing");
    let r = run(url, &["tools", "--token-file", missing.to_str().unwrap()]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.starts_with(&format!(
            "error: cannot read the token file {}: ",
            missing.display()
        )),
        "{}",
        r.stderr
    );
}

/// Each refused answer says what was wrong (exit 9), and errors about ids and URLs give the
/// hint that fits them (and no hint that contradicts them).
#[test]
fn refused_answers_and_error_texts() {
    let server = Serve::start();
    let url = server.url.as_str();
    let r = run(
        url,
        &[
            "call",
            "confirm_delete",
            "--args",
            r#"{"filename":"a"}"#,
            "--detach",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let id = r.stdout.trim().to_owned();
    assert!(id.starts_with("tsk_") && !id.contains('\n'), "{}", r.stdout);
    assert_eq!(r.stderr, "");

    // A key the task does not wait for: refused, naming the keys it waits for.
    let r = run(
        url,
        &[
            "answer",
            &id,
            "confrim",
            r#"{"action":"accept","content":{"confirm":true}}"#,
        ],
    );
    assert_eq!(r.code, 9);
    assert_eq!(r.stdout, "");
    assert_eq!(
        r.stderr,
        format!(
            "error: task `{id}` is not waiting for input `confrim`; it waits for: confirm\n\
             hint: `mcp-tasks get {id}` shows what it waits for\n"
        )
    );
    // No `action`: the server's reason, once, and no "unknown task".
    let r = run(
        url,
        &["answer", &id, "confirm", r#"{"content":{"confirm":true}}"#],
    );
    assert_eq!(r.code, 9);
    assert_eq!(
        r.stderr,
        format!(
            "error: the answer to task `{id}` was refused: the response for input key `confirm` \
             needs `action` (accept, decline or cancel)\n\
             hint: `mcp-tasks get {id}` shows each request and its schema; a response looks like \
             '{{\"action\":\"accept\",\"content\":{{…}}}}'\n"
        )
    );
    // Content that does not fit the requested schema.
    let r = run(
        url,
        &[
            "answer",
            &id,
            "confirm",
            r#"{"action":"accept","content":{"confirm":"yes"}}"#,
        ],
    );
    assert_eq!(r.code, 9);
    assert!(
        r.stderr.starts_with(&format!(
            "error: the answer to task `{id}` was refused: the response for input key `confirm` \
             has `content.confirm` not matching the requestedSchema"
        )),
        "{}",
        r.stderr
    );
    let r = run(url, &["get", &id]);
    assert_eq!(r.code, 5, "the task still waits: {}", r.stdout);

    // A malformed id is not "purged".
    let r = run(url, &["get", "nonsense"]);
    assert_eq!(r.code, 7);
    assert_eq!(
        r.stderr,
        "error: `nonsense` is not a task id: malformed task id: expected `tsk_` followed by 32 \
         lowercase hex digits\nhint: `call --detach` prints task ids, `mcp-tasks ls` lists them\n"
    );
    // Watching an unknown id does not suggest watching it.
    let unknown = "tsk_00000000000000000000000000000000";
    let r = run(url, &["watch", unknown]);
    assert_eq!(r.code, 7);
    assert_eq!(
        r.stderr,
        format!(
            "error: unknown task `{unknown}`: Failed to retrieve task: Task not found\n\
             hint: check the id; tasks are visible only to the principal that created them, and \
             expired tasks are deleted (`{unknown}` may have been purged)\n"
        )
    );
    // Invalid arguments: "invalid params" once.
    let r = run(url, &["call", "slow_compute", "--args", "{}"]);
    assert_eq!(r.code, 7);
    assert_eq!(
        r.stderr,
        "error: invalid params: invalid arguments for tool `slow_compute`: `arguments`: \
         \"seconds\" is a required property\n"
    );
    // A URL without its scheme, and a path that is not the MCP endpoint.
    let r = run("localhost:8080", &["tools"]);
    assert_eq!(r.code, 2);
    assert_eq!(
        r.stderr,
        "error: invalid server URL `localhost:8080`: unsupported scheme `localhost` (http or \
         https); did you mean `http://localhost:8080/mcp`?\n"
    );
    let r = run("127.0.0.1:8080", &["tools"]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr
            .ends_with("; did you mean `http://127.0.0.1:8080/mcp`?\n"),
        "{}",
        r.stderr
    );
    let root = url.trim_end_matches("mcp");
    let r = run(root, &["tools"]);
    assert_eq!(r.code, 8);
    assert_eq!(
        r.stderr,
        format!(
            "error: {root} answered HTTP 404: (empty body)\nhint: no MCP endpoint at that \
             path; check the path of --url (or MCP_TASKS_URL): `mcp-tasks serve` answers on \
             /mcp, e.g. http://127.0.0.1:8080/mcp\n"
        )
    );
}

/// `serve` on an unreachable PostgreSQL says why it could not connect.
#[test]
fn postgres_connection_errors_name_their_cause() {
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let store = format!("postgres://postgres@{closed}/nodb");
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--store", &store])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "error: cannot open the task store {store}: cannot connect: "
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("error connecting to server: Connection refused"),
        "the cause: {stderr}"
    );
}

/// `call --detach` and `ls`: the tasks created here, with their last known status, a header,
/// ids only with -q, re-read from the server with --refresh.
#[test]
fn ls_lists_the_tasks_created_here() {
    let server = Serve::start();
    let url = server.url.as_str();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("state").join("tasks.redb");
    let env = [("MCP_TASKS_HANDLE_STORE", store.to_str().unwrap())];
    let r = run_env(url, &["ls"], &env);
    assert_eq!((r.code, r.stdout.as_str()), (0, ""));
    assert!(
        r.stderr.starts_with("no tasks created from here"),
        "{}",
        r.stderr
    );

    let r = run_env(
        url,
        &[
            "call",
            "confirm_delete",
            "--args",
            r#"{"filename":"a"}"#,
            "--detach",
        ],
        &env,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let first = r.stdout.trim().to_owned();
    let r = run_env(
        url,
        &[
            "call",
            "slow_compute",
            "--args",
            r#"{"seconds":0}"#,
            "--detach",
            "--json",
        ],
        &env,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let second = json(&r)["taskId"].as_str().unwrap().to_owned();
    // A synchronous tool makes no task and is not listed.
    let r = run_env(
        url,
        &["call", "greet", "--args", r#"{"name":"Ada"}"#, "--detach"],
        &env,
    );
    assert_eq!((r.code, r.stdout.as_str()), (0, "Hello, Ada!\n"));

    let r = run_env(url, &["ls", "-q"], &env);
    assert_eq!(
        (r.code, r.stdout.clone()),
        (0, format!("{first}\n{second}\n"))
    );
    // `get` records the status it saw.
    let deadline = Instant::now() + WAIT;
    while run_env(url, &["get", &first], &env).code != 5 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = run_env(url, &["ls"], &env);
    assert_eq!(r.code, 0);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", r.stdout);
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header, ["TASK", "STATUS", "TOOL", "CREATED"]);
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        &row[..3],
        [first.as_str(), "input_required", "confirm_delete"]
    );
    let row: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(&row[..3], [second.as_str(), "working", "slow_compute"]);

    // The tasks move on; `ls` shows what was last seen until --refresh asks the server.
    let r = run_env(
        url,
        &[
            "answer",
            &first,
            "confirm",
            r#"{"action":"accept","content":{"confirm":true}}"#,
        ],
        &env,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = run_env(url, &["watch", &second], &env);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = run_env(url, &["ls", "--json"], &env);
    let listed = json(&r);
    assert_eq!(listed[0]["status"], "input_required");
    assert_eq!(listed[1]["status"], "completed", "recorded by `watch`");
    assert_eq!(listed[1]["arguments"], serde_json::json!({"seconds": 0}));
    let deadline = Instant::now() + WAIT;
    loop {
        let r = run_env(url, &["ls", "--refresh", "--json"], &env);
        assert_eq!(r.code, 0, "{}", r.stderr);
        if json(&r)[0]["status"] == "completed" {
            break;
        }
        assert!(Instant::now() < deadline, "{}", r.stdout);
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = run_env(url, &["ls"], &env);
    assert!(
        r.stdout.lines().nth(1).unwrap().contains(" completed "),
        "{}",
        r.stdout
    );
    // Another server's list is its own; --all shows every server.
    let r = run_env("http://127.0.0.1:9/mcp", &["ls", "-q"], &env);
    assert_eq!((r.code, r.stdout.as_str()), (0, ""));
    let r = run_env("http://127.0.0.1:9/mcp", &["ls", "--all"], &env);
    assert_eq!(r.code, 0);
    assert!(r.stdout.starts_with("TASK "), "{}", r.stdout);
    assert!(
        r.stdout.lines().next().unwrap().ends_with(" SERVER"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains(url), "{}", r.stdout);
}

/// `tools` shows each tool's arguments and description under a header; -q only the names.
#[test]
fn tools_shows_arguments_and_descriptions() {
    let server = Serve::start();
    let url = server.url.as_str();
    let r = run(url, &["tools"]);
    assert_eq!(r.code, 0);
    let mut lines = r.stdout.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "ARGUMENTS", "DESCRIPTION"]);
    let cells = |name: &str| -> Vec<String> {
        let line = r
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in {}", r.stdout));
        line.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        cells("greet"),
        [
            "greet",
            "name: string",
            "Greets someone by name. Always answers synchronously, never as a task."
        ]
    );
    assert_eq!(cells("slow_compute")[1], "seconds: integer, label?: string");
    assert_eq!(cells("multi_input")[1], "-");
    let r = run(url, &["tools", "-q"]);
    assert_eq!(r.code, 0);
    assert!(r.stdout.lines().all(|l| !l.contains(' ')), "{}", r.stdout);
    assert!(r.stdout.lines().any(|l| l == "greet"), "{}", r.stdout);
}

/// --verbose prints each JSON-RPC message sent and received on stderr, and nothing else
/// changes.
#[test]
fn verbose_prints_the_json_exchanged() {
    let server = Serve::start();
    let url = server.url.as_str();
    let r = run(
        url,
        &["call", "greet", "--args", r#"{"name":"Ada"}"#, "--verbose"],
    );
    assert_eq!((r.code, r.stdout.as_str()), (0, "Hello, Ada!\n"));
    let sent: Vec<Value> = r
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("> "))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let received: Vec<Value> = r
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("< "))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(sent.len(), 1, "{}", r.stderr);
    assert_eq!(sent[0]["method"], "tools/call");
    assert_eq!(sent[0]["params"]["arguments"]["name"], "Ada");
    assert_eq!(received.len(), 1, "{}", r.stderr);
    assert_eq!(received[0]["id"], sent[0]["id"]);
    assert_eq!(received[0]["result"]["content"][0]["text"], "Hello, Ada!");
    let r = run(url, &["call", "greet", "--args", r#"{"name":"Ada"}"#]);
    assert_eq!(r.stderr, "", "quiet without --verbose");
}

/// `completions` prints a script for each shell that knows the subcommands.
#[test]
fn completions_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete -F _mcp__tasks"),
        ("zsh", "#compdef mcp-tasks"),
        ("fish", "complete -c mcp-tasks"),
    ] {
        let r = run("http://127.0.0.1:9/mcp", &["completions", shell]);
        assert_eq!(r.code, 0, "{shell}: {}", r.stderr);
        assert!(r.stdout.contains(marker), "{shell}: {}", r.stdout);
        for word in ["serve", "watch", "ls", "--detach", "--token-file"] {
            assert!(r.stdout.contains(word), "{shell} lacks {word}");
        }
        // Where the shell is installed, it parses the script.
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("completion");
        std::fs::write(&script, &r.stdout).unwrap();
        if let Ok(status) = Command::new(shell)
            .arg("-n")
            .arg(&script)
            .stdin(Stdio::null())
            .status()
        {
            assert!(status.success(), "{shell} -n rejects the script");
        }
    }
    let r = run("http://127.0.0.1:9/mcp", &["completions", "tcsh"]);
    assert_eq!(r.code, 2);
}

/// In a real bash, the completion script registers its function for `mcp-tasks` and completes
/// the options of subcommands (`serve --upstream-i<Tab>`), not only the subcommands' names:
/// every `cmd` the script can set has the `case` arm that lists its options.
#[test]
fn bash_completes_the_options_of_subcommands() {
    let r = run("http://127.0.0.1:9/mcp", &["completions", "bash"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    for cmd in r.stdout.split("cmd=\"").skip(1) {
        let cmd = &cmd[..cmd.find('"').unwrap()];
        if !cmd.is_empty() {
            assert!(
                r.stdout.contains(&format!("\n        {cmd})\n")),
                "no case arm for {cmd}"
            );
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("completion.bash");
    std::fs::write(&script, &r.stdout).unwrap();
    // What bash hands the function on <Tab>: the words so far, the one being completed last.
    let driver = r#"
source "$1"
complete -p mcp-tasks
complete_words() {
  COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
  COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; COMPREPLY=()
  _mcp__tasks mcp-tasks "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
  echo "$*: ${COMPREPLY[*]}"
}
complete_words mcp-tasks wat
complete_words mcp-tasks serve --upstream-i
complete_words mcp-tasks store list --sta
complete_words mcp-tasks call --det
"#;
    let out = match Command::new("bash")
        .arg("-c")
        .arg(driver)
        .arg("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            eprintln!("SKIPPED: no bash to run the completion script in ({e})");
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.lines().any(|l| l.starts_with("complete ")
            && l.contains(" -F _mcp__tasks ")
            && l.ends_with(" mcp-tasks")),
        "the function is not registered for mcp-tasks:\n{stdout}"
    );
    for line in [
        "mcp-tasks wat: watch",
        "mcp-tasks serve --upstream-i: --upstream-idempotent",
        "mcp-tasks store list --sta: --status",
        "mcp-tasks call --det: --detach",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "{line:?} not in:\n{stdout}"
        );
    }
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
            .env("MCP_TASKS_HANDLE_STORE", "")
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

/// The `sh` block that follows `marker` in docs/CLI.md.
fn readme_block(marker: &str) -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/CLI.md")).unwrap();
    let at = readme
        .find(marker)
        .unwrap_or_else(|| panic!("docs/CLI.md has {marker:?}"));
    let start = readme[at..].find("```sh\n").unwrap() + at + "```sh\n".len();
    let end = readme[start..].find("```").unwrap() + start;
    readme[start..end].to_owned()
}

/// Runs `script` with bash, `mcp-tasks` on the PATH and `MCP_TASKS_URL` set to `url`; the
/// docs/CLI.md's own `--url http://127.0.0.1:8080/mcp` is pointed at `url` too.
fn run_script(url: &str, script: &str, handles: &std::path::Path) -> Run {
    let bin_dir = std::path::Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = script.replace("http://127.0.0.1:8080/mcp", url);
    let out = Command::new("bash")
        .args(["-c", &script])
        .env("PATH", path)
        .env("MCP_TASKS_URL", url)
        .env_remove("MCP_TASKS_TOKEN")
        .env_remove("MCP_TASKS_TOKEN_FILE")
        .env("MCP_TASKS_HANDLE_STORE", handles)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    shown(out, &format!("bash -c <<{script}"))
}

/// docs/CLI.md's client commands and its script, exactly as it writes them, against a
/// default `mcp-tasks serve` (the demo's `generate_report`, no fixtures): each command's exit
/// code is the one its comment promises, and the script ends with the report.
#[test]
fn the_documented_client_commands_run_as_written() {
    let server = Serve::start_plain(&[]);
    let url = server.url.as_str();
    let dir = tempfile::tempdir().unwrap();
    let handles = dir.path().join("tasks.redb");

    // Each command of the block, followed by a line that prints its exit code.
    let block = readme_block("## Command line client");
    let commands: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(commands.len(), 9, "{block}");
    let mut script = String::from("set -u\n");
    for command in &commands {
        script.push_str(command);
        script.push_str("\necho \"[exit $?]\"\n");
    }
    let r = run_script(url, &script, &handles);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let codes: Vec<i32> = r
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("[exit ")?.strip_suffix(']')?.parse().ok())
        .collect();
    assert_eq!(codes.len(), commands.len(), "{}", r.stdout);
    // tools, call (input needed, no terminal), call --detach.
    assert_eq!(codes[..3], [0, 5, 0], "{}", r.stdout);
    assert!(r.stdout.contains("generate_report"), "{}", r.stdout);
    // get: still working (the outline takes 1.5 s), or already waiting on a slow machine.
    assert!(matches!(codes[3], 5 | 6), "{}", r.stdout);
    // watch until it waits, answer, watch to the end, ls, cancel of a new task.
    assert_eq!(codes[4..], [5, 0, 0, 0, 0], "{}", r.stdout);
    assert!(
        r.stdout
            .contains("Generated small report with approved outline."),
        "{}",
        r.stdout
    );
    // `ls` lists the tasks created here under its header, the answered one completed.
    let ls = r
        .stdout
        .lines()
        .position(|l| l.starts_with("TASK "))
        .expect("ls header");
    let rows: Vec<&str> = r
        .stdout
        .lines()
        .skip(ls + 1)
        .take_while(|l| !l.starts_with("[exit"))
        .collect();
    assert_eq!(rows.len(), 2, "{}", r.stdout);
    assert!(
        rows.iter().any(|l| l.contains(" completed ")),
        "{}",
        r.stdout
    );

    // The script: it answers the outline and watches the task to its report.
    let script = readme_block("A script against `mcp-tasks serve`:");
    let r = run_script(url, &script, &handles);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout
            .contains("Generated small report with approved outline."),
        "{}",
        r.stdout
    );
}

/// `serve --max-running`: a task over the limit is queued, and `ls --refresh` says so.
#[test]
fn ls_refresh_shows_a_task_queued_by_serve_max_running() {
    let server = Serve::start_with(&["--max-running", "slow_compute=1"]);
    let url = server.url.as_str();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("tasks.redb");
    let env = [("MCP_TASKS_HANDLE_STORE", store.to_str().unwrap())];
    let mut ids = Vec::new();
    for _ in 0..2 {
        let r = run_env(
            url,
            &[
                "call",
                "slow_compute",
                "--args",
                r#"{"seconds":30}"#,
                "--detach",
            ],
            &env,
        );
        assert_eq!(r.code, 0, "{}", r.stderr);
        ids.push(r.stdout.trim().to_owned());
    }
    let deadline = Instant::now() + WAIT;
    loop {
        let r = run_env(url, &["ls", "--refresh", "--json"], &env);
        assert_eq!(r.code, 0, "{}", r.stderr);
        let listed = json(&r);
        let second = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["taskId"] == ids[1].as_str())
            .cloned()
            .unwrap();
        if second["statusMessage"] == "queued: 0 ahead" {
            assert_eq!(second["status"], "working");
            break;
        }
        assert!(Instant::now() < deadline, "{}", r.stdout);
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = run_env(url, &["ls", "--refresh"], &env);
    assert!(
        r.stdout.contains(" working (queued: 0 ahead) "),
        "{}",
        r.stdout
    );
}
