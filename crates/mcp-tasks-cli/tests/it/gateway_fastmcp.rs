//! The gateway in front of a FastMCP 4.x server (`tests/upstream/fastmcp_server.py`,
//! FastMCP pinned by `scripts/upstreams.sh`): a server that speaks both `2026-07-28` and
//! `2025-11-25`, whose tools ask for input in two ways — `ctx.elicit()` (a server-initiated
//! request, which FastMCP refuses on a stateless call) and the guard pattern (an
//! `InputRequiredResult`, which only a stateless call can return). Both work through the
//! gateway side by side; the upstream's input rounds are kept, so a round is never run twice;
//! the upstream's progress is the task's `statusMessage`; its `requestState`'s expiry is
//! said and enforced.
//!
//! Without the upstreams installed the tests print that they skip; with
//! `MCP_TASKS_REQUIRE_UPSTREAMS=1` (CI) they fail instead.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mcp_tasks::TaskStatus;
use serde_json::{Value, json};

use crate::gateway::{
    Gateway, answer, free_port, start_task, terminal, text, wait_for, wait_tools,
};
use crate::support::KillOnDrop;

/// A FastMCP upstream on a free port, and where it writes what ran.
struct FastMcp {
    proc: KillOnDrop,
    port: u16,
    url: String,
    effects: PathBuf,
}

impl FastMcp {
    fn start(dir: &Path) -> Option<Self> {
        let up = crate::support::upstreams_dir()?;
        let port = free_port();
        let effects = dir.join("effects");
        let proc = crate::support::fastmcp_upstream_on(&up, port, &effects);
        Some(Self {
            proc,
            port,
            url: format!("http://127.0.0.1:{port}/mcp"),
            effects,
        })
    }

    /// `kill -9` and a new process on the same port (FastMCP seals its `requestState` with a
    /// key of the process: the new one refuses the old one's).
    fn restart(&mut self) {
        self.proc.kill9();
        let up = crate::support::upstreams_dir().unwrap();
        self.proc = crate::support::fastmcp_upstream_on(&up, self.port, &self.effects);
    }

    /// How many times the upstream wrote `line`.
    fn ran(&self, line: &str) -> usize {
        std::fs::read_to_string(&self.effects)
            .unwrap_or_default()
            .lines()
            .filter(|l| *l == line)
            .count()
    }
}

/// `mcp-tasks serve` in front of `fm` (as upstream `fm`), with `extra` options.
fn gateway_for(fm: &FastMcp, store: &Path, extra: &[&str]) -> Gateway {
    let mut args = vec!["--upstream".to_owned(), format!("fm={}", fm.url)];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    Gateway::start(store, &args)
}

fn yes() -> Value {
    json!({ "action": "accept", "content": { "value": true } })
}

/// One `tools/call` without the Tasks extension, as a client that knows only core MRTR sends
/// it; the response's result (from a JSON body or an event stream).
async fn sync_call(url: &str, params: Value) -> Value {
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": { "elicitation": { "form": {} } }
    });
    let name = params["name"].as_str().unwrap_or_default().to_owned();
    let response = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", name)
        .body(
            json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params })
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    let body = String::from_utf8(response.bytes().await.unwrap().to_vec()).unwrap();
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .chain(std::iter::once(body.trim()))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|m| m["id"] == json!(1))
        .unwrap_or_else(|| panic!("no response in {body}"))
}

#[tokio::test]
async fn both_ways_of_asking_work_side_by_side_and_no_round_runs_twice() {
    let dir = tempfile::tempdir().unwrap();
    let Some(fm) = FastMcp::start(dir.path()) else {
        return;
    };
    let gw = gateway_for(&fm, &dir.path().join("gw.redb"), &[]);
    let client = gw.client().await;
    wait_tools(&client, &["deploy", "deploy_guard"]).await;

    // The guard pattern: the upstream's InputRequiredResult is the task's input request, the
    // deadline of its state in the statusMessage; the answer goes back with its requestState
    // and round 1 is not run again.
    let guard = start_task(
        &client,
        "deploy_guard",
        json!({ "target": "api", "seconds": 0.4 }),
    )
    .await;
    let waiting = wait_for(&guard, "the guard's question", |t| {
        t.status == TaskStatus::InputRequired
    })
    .await;
    assert_eq!(
        waiting.input_requests["round1-confirm"]["params"]["message"],
        "Deploy api?"
    );
    let status = waiting.status_message.clone().unwrap_or_default();
    assert!(
        status.contains("upstream `fm` keeps this round's state until"),
        "{status}"
    );
    answer(&guard, "round1-confirm", yes()).await;
    let done = wait_for(&guard, "the guard's end", terminal).await;
    assert_eq!(
        text(done.result.as_ref().unwrap()),
        "api: deployed",
        "{done:?}"
    );
    assert_eq!(fm.ran("guard round=1"), 1);
    assert_eq!(fm.ran("guard round=2"), 1);

    // ctx.elicit(): refused on the stateless call, so the tool is called again in a
    // 2025-11-25 session, where its elicitation is the task's input request.
    let deploy = start_task(
        &client,
        "deploy",
        json!({ "target": "web", "seconds": 0.4 }),
    )
    .await;
    let waiting = wait_for(&deploy, "the elicitation", |t| {
        t.status == TaskStatus::InputRequired
    })
    .await;
    assert_eq!(
        waiting.input_requests["input-1"]["params"]["message"],
        "Deploy web?"
    );
    answer(&deploy, "input-1", yes()).await;
    let done = wait_for(&deploy, "the deploy's end", terminal).await;
    assert_eq!(
        text(done.result.as_ref().unwrap()),
        "web: deployed",
        "{done:?}"
    );
    assert_eq!(
        fm.ran("deploy start"),
        2,
        "the refused stateless call and the session's"
    );
    assert!(
        gw.log()
            .contains("calling it again, and from now on, in a 2025-11-25 session"),
        "{}",
        gw.log()
    );
    // From then on the tool goes to the session at once.
    let again = start_task(&client, "deploy", json!({ "target": "db", "seconds": 0.2 })).await;
    wait_for(&again, "the second elicitation", |t| {
        t.status == TaskStatus::InputRequired
    })
    .await;
    answer(&again, "input-1", yes()).await;
    let done = wait_for(&again, "the second deploy's end", terminal).await;
    assert_eq!(
        text(done.result.as_ref().unwrap()),
        "db: deployed",
        "{done:?}"
    );
    assert_eq!(fm.ran("deploy start"), 3);
    // The guard tool still goes statelessly.
    let guard = start_task(
        &client,
        "deploy_guard",
        json!({ "target": "x", "seconds": 0.2 }),
    )
    .await;
    wait_for(&guard, "the second guard question", |t| {
        t.status == TaskStatus::InputRequired
    })
    .await;
    answer(&guard, "round1-confirm", yes()).await;
    let done = wait_for(&guard, "the second guard's end", terminal).await;
    assert_eq!(
        text(done.result.as_ref().unwrap()),
        "x: deployed",
        "{done:?}"
    );
}

#[tokio::test]
async fn a_synchronous_client_answers_a_guard_round_without_round_one_running_again() {
    let dir = tempfile::tempdir().unwrap();
    let Some(fm) = FastMcp::start(dir.path()) else {
        return;
    };
    let gw = gateway_for(&fm, &dir.path().join("gw.redb"), &[]);
    let client = gw.client().await;
    wait_tools(&client, &["deploy_guard"]).await;
    let call = json!({ "name": "deploy_guard", "arguments": { "target": "sync", "seconds": 0.4 } });
    let first = sync_call(&gw.url, call.clone()).await;
    assert_eq!(first["result"]["resultType"], "input_required", "{first}");
    assert!(
        first["result"]["inputRequests"]["round1-confirm"].is_object(),
        "{first}"
    );
    let mut second = call;
    second["inputResponses"] = json!({ "round1-confirm": yes() });
    second["requestState"] = first["result"]["requestState"].clone();
    let done = sync_call(&gw.url, second).await;
    assert_eq!(text(&done["result"]), "sync: deployed", "{done}");
    // The gateway's own requestState carried the upstream's round: round 1 ran once.
    assert_eq!(fm.ran("guard round=1"), 1);
    assert_eq!(fm.ran("guard round=2"), 1);
}

#[tokio::test]
async fn progress_is_the_status_and_keeps_a_call_alive_past_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let Some(fm) = FastMcp::start(dir.path()) else {
        return;
    };
    let gw = gateway_for(
        &fm,
        &dir.path().join("gw.redb"),
        &["--upstream-timeout", "1s"],
    );
    let client = gw.client().await;
    wait_tools(&client, &["slow"]).await;
    // Three seconds of work reporting progress every half second, behind a one-second
    // silence timeout.
    let slow = start_task(&client, "slow", json!({ "seconds": 3, "steps": 6 })).await;
    let working = wait_for(&slow, "progress", |t| {
        t.status_message
            .as_deref()
            .is_some_and(|m| m.starts_with("step 2/6 of slow"))
            || terminal(t)
    })
    .await;
    assert_eq!(working.status, TaskStatus::Working, "{working:?}");
    let done = wait_for(&slow, "the end", terminal).await;
    assert_eq!(
        text(done.result.as_ref().unwrap()),
        "slow: done",
        "{done:?}"
    );
    assert_eq!(fm.ran("slow step=6"), 1);
}

#[tokio::test]
async fn a_restart_while_a_guard_round_waits_resumes_it_and_runs_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let Some(fm) = FastMcp::start(dir.path()) else {
        return;
    };
    let store = dir.path().join("gw.redb");
    // `deploy_guard` is not declared idempotent: a call in flight at a crash would fail. A
    // call waiting for input has nothing in flight.
    let args = vec!["--upstream".to_owned(), format!("fm={}", fm.url)];
    let mut gw = Gateway::start(&store, &args);
    let client = gw.client().await;
    wait_tools(&client, &["deploy_guard"]).await;
    let task = start_task(
        &client,
        "deploy_guard",
        json!({ "target": "db", "seconds": 0.4 }),
    )
    .await;
    wait_for(&task, "the question", |t| {
        t.status == TaskStatus::InputRequired
    })
    .await;
    let id = task.id().to_owned();
    gw.proc.kill9();
    let gw = Gateway::start(&store, &args);
    let client = gw.client().await;
    let task = client.resume(&id).await.unwrap();
    let waiting = wait_for(&task, "the question after the restart", |t| {
        t.status == TaskStatus::InputRequired || terminal(t)
    })
    .await;
    assert_eq!(waiting.status, TaskStatus::InputRequired, "{waiting:?}");
    answer(&task, "round1-confirm", yes()).await;
    let done = wait_for(&task, "the end", terminal).await;
    assert_eq!(
        text(done.result.as_ref().unwrap()),
        "db: deployed",
        "{done:?}"
    );
    assert_eq!(
        fm.ran("guard round=1"),
        1,
        "round 1 ran before the crash only"
    );
    assert_eq!(fm.ran("guard round=2"), 1);
}

#[tokio::test]
async fn an_upstream_restart_while_a_round_waits_repeats_an_idempotent_tool_and_fails_another() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut fm) = FastMcp::start(dir.path()) else {
        return;
    };
    let store = dir.path().join("gw.redb");
    let gw = gateway_for(&fm, &store, &["--upstream-idempotent", "slow"]);
    let client = gw.client().await;
    wait_tools(&client, &["deploy_guard"]).await;
    let task = start_task(
        &client,
        "deploy_guard",
        json!({ "target": "a", "seconds": 0.2 }),
    )
    .await;
    wait_for(&task, "the question", |t| {
        t.status == TaskStatus::InputRequired
    })
    .await;
    fm.restart();
    answer(&task, "round1-confirm", yes()).await;
    let failed = wait_for(&task, "the refused state", terminal).await;
    assert_eq!(failed.status, TaskStatus::Failed, "{failed:?}");
    let message = failed.error.unwrap().message;
    assert!(
        message.contains("upstream `fm` no longer accepts the state of input round 1")
            && message.contains("not declared idempotent"),
        "{message}"
    );
    assert_eq!(fm.ran("guard round=2"), 0);
    drop(gw);

    // Declared idempotent, the tool is called again from round 1, and the answer already
    // given answers it again.
    let gw = gateway_for(
        &fm,
        &dir.path().join("gw2.redb"),
        &["--upstream-idempotent", "deploy_guard"],
    );
    let client = gw.client().await;
    wait_tools(&client, &["deploy_guard"]).await;
    let before = fm.ran("guard round=1");
    let task = start_task(
        &client,
        "deploy_guard",
        json!({ "target": "b", "seconds": 0.2 }),
    )
    .await;
    wait_for(&task, "the question", |t| {
        t.status == TaskStatus::InputRequired
    })
    .await;
    fm.restart();
    answer(&task, "round1-confirm", yes()).await;
    let done = wait_for(&task, "the end", terminal).await;
    assert_eq!(
        text(done.result.as_ref().unwrap()),
        "b: deployed",
        "{done:?}"
    );
    assert_eq!(fm.ran("guard round=1"), before + 2);
    assert_eq!(fm.ran("guard round=2"), 1);
}

#[tokio::test]
async fn an_upstream_restart_during_a_call_repeats_an_idempotent_tool_and_fails_another() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut fm) = FastMcp::start(dir.path()) else {
        return;
    };
    let gw = gateway_for(
        &fm,
        &dir.path().join("gw.redb"),
        &["--upstream-idempotent", "slow"],
    );
    let client = gw.client().await;
    wait_tools(&client, &["slow", "deploy_guard"]).await;
    // `slow` is declared idempotent: the restart (kill -9, then a new process on the same
    // port a second or two later) costs the client nothing.
    let slow = start_task(&client, "slow", json!({ "seconds": 2, "steps": 4 })).await;
    wait_for(&slow, "the first step", |t| {
        t.status_message
            .as_deref()
            .is_some_and(|m| m.starts_with("step 1/4"))
            || terminal(t)
    })
    .await;
    fm.restart();
    let done = wait_for(&slow, "the repeated call", terminal).await;
    assert_eq!(
        text(done.result.as_ref().unwrap()),
        "slow: done",
        "{done:?}"
    );
    assert_eq!(fm.ran("slow step=1"), 2, "called again from the start");
    // `deploy_guard` is not: broken during its first round, it fails, saying why.
    let guard = start_task(
        &client,
        "deploy_guard",
        json!({ "target": "t", "seconds": 2 }),
    )
    .await;
    wait_for(&guard, "the guard's first step", |t| {
        t.status_message
            .as_deref()
            .is_some_and(|m| m.starts_with("step 1/4"))
            || terminal(t)
    })
    .await;
    fm.restart();
    let failed = wait_for(&guard, "the broken call", terminal).await;
    assert_eq!(failed.status, TaskStatus::Failed, "{failed:?}");
    let message = failed.error.unwrap().message;
    assert!(
        message.contains("upstream `fm`") && message.contains("may or may not have taken effect"),
        "{message}"
    );
    assert_eq!(fm.ran("guard round=1"), 1);
}

#[tokio::test]
async fn an_answer_after_the_upstreams_state_expired_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let Some(fm) = FastMcp::start(dir.path()) else {
        return;
    };
    let gw = gateway_for(
        &fm,
        &dir.path().join("gw.redb"),
        &["--upstream-state-ttl", "2s"],
    );
    let client = gw.client().await;
    wait_tools(&client, &["deploy_guard"]).await;

    // A task: it says until when it can be answered, and fails then, naming why.
    let asked = Instant::now();
    let task = start_task(
        &client,
        "deploy_guard",
        json!({ "target": "late", "seconds": 0.2 }),
    )
    .await;
    let waiting = wait_for(&task, "the question", |t| {
        t.status == TaskStatus::InputRequired
    })
    .await;
    assert!(
        waiting
            .status_message
            .as_deref()
            .is_some_and(|m| m.contains("keeps this round's state until")),
        "{waiting:?}"
    );
    let failed = wait_for(&task, "the deadline", terminal).await;
    assert!(asked.elapsed() >= Duration::from_secs(2));
    assert_eq!(failed.status, TaskStatus::Failed, "{failed:?}");
    let message = failed.error.unwrap().message;
    assert!(
        message.contains("upstream `fm` keeps the state of an input round for 2 s")
            && message.contains("expired at"),
        "{message}"
    );
    // A late answer changes nothing: the task ended when the state did.
    answer(&task, "round1-confirm", yes()).await;
    assert_eq!(task.get().await.unwrap().status, TaskStatus::Failed);
    assert_eq!(fm.ran("guard round=2"), 0);

    // A synchronous call: the answer after the deadline is refused at once, with the reason.
    let call =
        json!({ "name": "deploy_guard", "arguments": { "target": "slowpoke", "seconds": 0.2 } });
    let first = sync_call(&gw.url, call.clone()).await;
    assert_eq!(first["result"]["resultType"], "input_required", "{first}");
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let mut second = call;
    second["inputResponses"] = json!({ "round1-confirm": yes() });
    second["requestState"] = first["result"]["requestState"].clone();
    let refused_at = Instant::now();
    let refused = sync_call(&gw.url, second).await;
    assert!(
        refused_at.elapsed() < Duration::from_secs(1),
        "refused at once"
    );
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("expired at"), "{refused}");
    assert_eq!(fm.ran("guard round=2"), 0);
}

#[tokio::test]
async fn the_era_can_be_forced_per_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let Some(fm) = FastMcp::start(dir.path()) else {
        return;
    };
    let up = crate::support::upstreams_dir().unwrap();
    let (_py, py_url) = crate::support::python_upstream(&up, &dir.path().join("py-effects"));
    let py = format!("py={py_url}");
    let gw = gateway_for(
        &fm,
        &dir.path().join("gw.redb"),
        &[
            "--upstream",
            &py,
            "--upstream-era",
            "fm=2025-11-25",
            "--upstream-era",
            "py=2026-07-28",
        ],
    );
    let client = gw.client().await;
    wait_tools(&client, &["fm_deploy"]).await;
    // A session from the start: ctx.elicit() works on the first call, which runs once.
    let deploy = start_task(
        &client,
        "fm_deploy",
        json!({ "target": "s", "seconds": 0.2 }),
    )
    .await;
    wait_for(&deploy, "the elicitation", |t| {
        t.status == TaskStatus::InputRequired
    })
    .await;
    answer(&deploy, "input-1", yes()).await;
    let done = wait_for(&deploy, "the end", terminal).await;
    assert_eq!(
        text(done.result.as_ref().unwrap()),
        "s: deployed",
        "{done:?}"
    );
    assert_eq!(fm.ran("deploy start"), 1);
    // The Python SDK 1.x server speaks only 2025-11-25: forced to 2026-07-28 it is not
    // connected, and the log says why.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gw
        .log()
        .contains("does not answer server/discover as a 2026-07-28 server")
    {
        assert!(Instant::now() < deadline, "{}", gw.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
