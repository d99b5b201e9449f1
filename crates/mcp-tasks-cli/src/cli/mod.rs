//! The binary's client commands (`tools`, `call`, `get`, `watch`, `answer`, `cancel`, `ls`):
//! a person's or a script's view of any MCP Tasks server, on [`mcp_tasks::client`].
//!
//! On a terminal a followed task shows a live status line (spinner, status, elapsed time,
//! `statusMessage`) on stderr and its elicitations are asked interactively; without one the
//! commands are quiet, and a task that needs input is printed (id and pending requests) and
//! ends the command with exit code 5, so that a script can `answer` and `watch`.

mod handles;
mod prompt;
mod verbose;

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use futures::StreamExt;
use mcp_tasks::TaskStatus;
use mcp_tasks::client::{
    CallOutcome, Client, ClientError, HttpTransport, RetryPolicy, Task, TaskHandle, ToolInfo,
};
use serde_json::{Map, Value};

/// The exit codes, as `--help` and docs/CLI.md list them.
pub const EXIT_CODES: &str = "\
Exit codes:
    0  completed (for `answer`, `cancel`, `tools`, `ls`: the server acknowledged or the
       list was printed; for `call --detach`: the task was created, its id printed)
    1  completed with a tool error (`isError: true`)
    2  usage error (bad arguments, invalid JSON)
    3  failed (the task ended with a JSON-RPC error)
    4  cancelled
    5  input required and no terminal to ask on: the task id and its pending input
       requests are printed; answer them with `answer`, then `watch`
    6  still working (`get` only)
    7  protocol error: the server refused the request (unknown tool, unknown, malformed
       or expired task id, invalid arguments, missing capability) or answered something
       invalid
    8  transport error: connection refused, timeout, HTTP error, 401/403
    9  answer refused (`answer`): the task does not wait for that key, or the server
       refused the response (e.g. it does not fit the requested schema); nothing changed
  130  interrupted (Ctrl-C): the task goes on on the server";

/// Exit codes (see [`EXIT_CODES`]).
pub mod code {
    pub const COMPLETED: u8 = 0;
    pub const TOOL_ERROR: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const FAILED: u8 = 3;
    pub const CANCELLED: u8 = 4;
    pub const INPUT_REQUIRED: u8 = 5;
    pub const WORKING: u8 = 6;
    pub const PROTOCOL: u8 = 7;
    pub const TRANSPORT: u8 = 8;
    pub const ANSWER_REFUSED: u8 = 9;
    pub const INTERRUPTED: u8 = 130;
}

/// Where and how to reach the server.
#[derive(Args, Debug, Clone)]
pub struct Connection {
    /// The server's MCP endpoint.
    #[arg(
        long,
        env = "MCP_TASKS_URL",
        value_name = "URL",
        default_value = "http://127.0.0.1:8080/mcp"
    )]
    url: String,
    /// A bearer token sent as `Authorization: Bearer TOKEN` (other users may see it in
    /// `ps`: prefer --token-file).
    #[arg(
        long,
        env = "MCP_TASKS_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// Read the bearer token from this file (surrounding whitespace and the final newline
    /// are ignored). Not together with --token / MCP_TASKS_TOKEN.
    #[arg(long, env = "MCP_TASKS_TOKEN_FILE", value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// Print every JSON-RPC message sent (`>`) and received (`<`) on stderr, one per line.
    #[arg(long, short = 'v')]
    verbose: bool,
    /// The file where the client keeps the tasks it created, for `ls` (default:
    /// $XDG_STATE_HOME/mcp-tasks/tasks.redb, else ~/.local/state/mcp-tasks/tasks.redb;
    /// an empty value keeps none).
    #[arg(long, env = "MCP_TASKS_HANDLE_STORE", value_name = "PATH")]
    handle_store: Option<String>,
    /// Print machine-readable JSON on stdout instead of text.
    #[arg(long)]
    json: bool,
    /// The longest one request may take (a followed task is not bounded): a duration (30s,
    /// 2m, 500ms) or bare seconds.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_timeout)]
    timeout: f64,
}

/// A duration ([`mcp_tasks::units`]: `30s`, `2m`, or bare seconds) of at most a day, in seconds.
fn parse_timeout(s: &str) -> Result<f64, String> {
    let d = mcp_tasks::units::parse_duration_or_seconds(s).map_err(|e| e.to_string())?;
    if d.is_zero() || d > Duration::from_secs(86_400) {
        return Err("the timeout must be above 0 and at most 1d (86400s)".to_owned());
    }
    Ok(d.as_secs_f64())
}

#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// List the tools of a server: name, arguments (`?`: optional) and description.
    #[command(after_help = EXIT_CODES)]
    Tools {
        /// Print only the tool names, one a line, without the header.
        #[arg(long, short = 'q')]
        quiet: bool,
        #[command(flatten)]
        conn: Connection,
    },
    /// Call a tool; a task is followed until it ends, and its result printed.
    #[command(after_help = EXIT_CODES)]
    Call {
        /// The tool's name.
        tool: String,
        /// The tool's arguments, a JSON object.
        #[arg(long, value_name = "JSON", default_value = "{}")]
        args: String,
        /// Do not follow a task: print its id (with --json, the task) and exit 0. A tool
        /// that answers at once prints its result as without --detach.
        #[arg(long)]
        detach: bool,
        #[command(flatten)]
        conn: Connection,
    },
    /// List the tasks this client created on the server of --url (from its handle store,
    /// see --handle-store), oldest first, with their last known status.
    #[command(after_help = EXIT_CODES)]
    Ls {
        /// Ask --url's server for the status of each of its tasks first (a task it no longer
        /// knows is shown as `gone`, an expired one as `expired`; with --all, the other
        /// servers' tasks keep their last known status).
        #[arg(long)]
        refresh: bool,
        /// The tasks created on every server, not only on --url's.
        #[arg(long)]
        all: bool,
        /// Print only the task ids, one a line, without the header.
        #[arg(long, short = 'q')]
        quiet: bool,
        #[command(flatten)]
        conn: Connection,
    },
    /// Show a task's current state.
    #[command(after_help = EXIT_CODES)]
    Get {
        /// The task id.
        id: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// Follow a task until it ends, and print its result.
    #[command(after_help = EXIT_CODES)]
    Watch {
        /// The task id.
        id: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// Answer one input request of a task (`tasks/update`).
    #[command(after_help = EXIT_CODES)]
    Answer {
        /// The task id.
        id: String,
        /// The input request's key.
        key: String,
        /// The response, e.g. '{"action":"accept","content":{"confirm":true}}'.
        response: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// Ask the server to cancel a task (cooperative: follow it with `watch`).
    #[command(after_help = EXIT_CODES)]
    Cancel {
        /// The task id.
        id: String,
        #[command(flatten)]
        conn: Connection,
    },
}

/// Runs one client command and returns the process's exit code.
pub async fn run(command: ClientCommand) -> ExitCode {
    ExitCode::from(match execute(command).await {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("error: {}", failure.message);
            failure.code
        }
    })
}

struct Failure {
    code: u8,
    message: String,
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Self {
            code: error_code(&e),
            message: explain(&e),
        }
    }
}

fn usage(message: impl Into<String>) -> Failure {
    Failure {
        code: code::USAGE,
        message: message.into(),
    }
}

fn error_code(e: &ClientError) -> u8 {
    match e {
        ClientError::InvalidUrl { .. } => code::USAGE,
        ClientError::InvalidAnswer { .. } | ClientError::UnknownInputKey { .. } => {
            code::ANSWER_REFUSED
        }
        ClientError::Connect { .. }
        | ClientError::Io { .. }
        | ClientError::Timeout { .. }
        | ClientError::Unauthorized { .. }
        | ClientError::Forbidden { .. }
        | ClientError::Http { .. } => code::TRANSPORT,
        ClientError::InputRequired { .. } => code::INPUT_REQUIRED,
        _ => code::PROTOCOL,
    }
}

/// The error with what a person can do about it.
fn explain(e: &ClientError) -> String {
    match e {
        ClientError::Unauthorized { token_sent, .. } => {
            let hint = if *token_sent {
                "check the token given with --token-file, --token or MCP_TASKS_TOKEN"
            } else {
                "pass a token with --token-file, --token or MCP_TASKS_TOKEN"
            };
            format!("{e}\nhint: {hint}")
        }
        ClientError::UnknownTask { task_id, .. } => format!(
            "{e}\nhint: check the id; tasks are visible only to the principal that created \
             them, and expired tasks are deleted (`{task_id}` may have been purged)"
        ),
        ClientError::MalformedTaskId { .. } => {
            format!("{e}\nhint: `call --detach` prints task ids, `mcp-tasks ls` lists them")
        }
        ClientError::InvalidAnswer { task_id, .. } => format!(
            "{e}\nhint: `mcp-tasks get {task_id}` shows each request and its schema; a response \
             looks like '{{\"action\":\"accept\",\"content\":{{…}}}}'"
        ),
        ClientError::UnknownInputKey { task_id, .. } => {
            format!("{e}\nhint: `mcp-tasks get {task_id}` shows what it waits for")
        }
        ClientError::Http { status: 404, .. } => format!(
            "{e}\nhint: no MCP endpoint at that path; check the path of --url (or \
             MCP_TASKS_URL): `mcp-tasks serve` answers on /mcp, e.g. http://127.0.0.1:8080/mcp"
        ),
        ClientError::TaskExpired { .. } => {
            format!("{e}\nhint: its result is no longer available; call the tool again")
        }
        ClientError::UnknownTool { .. } => format!("{e}\nhint: `mcp-tasks tools` lists them"),
        ClientError::Connect { .. } => {
            format!("{e}\nhint: check --url (or MCP_TASKS_URL) and that the server is running")
        }
        ClientError::InputRequired { requests } => {
            let mut s = format!("{e}; the call has no task id to answer later:");
            for (key, request) in requests {
                s.push_str(&format!("\n  {key}: {}", describe_request(request)));
            }
            s.push_str("\nhint: run it on a terminal to answer interactively");
            s
        }
        _ => e.to_string(),
    }
}

/// The bearer token: from --token-file, else --token / MCP_TASKS_TOKEN.
async fn token(conn: &Connection) -> Result<Option<String>, Failure> {
    let given = conn.token.as_deref().filter(|t| !t.is_empty());
    let Some(path) = conn
        .token_file
        .as_ref()
        .filter(|p| !p.as_os_str().is_empty())
    else {
        return Ok(given.map(str::to_owned));
    };
    if given.is_some() {
        return Err(usage(
            "give the token either with --token-file (MCP_TASKS_TOKEN_FILE) or with --token \
             (MCP_TASKS_TOKEN), not both",
        ));
    }
    let text = tokio::fs::read_to_string(path).await.map_err(|e| {
        usage(format!(
            "cannot read the token file {}: {e}",
            path.display()
        ))
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(usage(format!("the token file {} is empty", path.display())));
    }
    Ok(Some(token.to_owned()))
}

async fn connect(conn: &Connection) -> Result<Client, Failure> {
    let token = token(conn).await?;
    // Elicitation, sampling and roots are always declared: on a terminal they are asked,
    // elsewhere a task's requests are printed for `answer` (exit code 5).
    let builder = if conn.verbose {
        let mut http = HttpTransport::new(&conn.url)?;
        if let Some(token) = &token {
            http = http.bearer_token(token.clone());
        }
        Client::with_transport(Arc::new(verbose::Verbose::new(Arc::new(http))))
    } else {
        let mut builder = Client::http(&conn.url)?;
        if let Some(token) = &token {
            builder = builder.bearer_token(token.clone());
        }
        builder
    };
    let mut builder = builder
        .client_info("mcp-tasks-cli", env!("CARGO_PKG_VERSION"))
        .capabilities(serde_json::json!({ "elicitation": {}, "sampling": {}, "roots": {} }))
        .timeout(Duration::from_secs_f64(conn.timeout))
        // A person waits: give up on an unreachable server after about three seconds.
        .retry(RetryPolicy {
            attempts: 5,
            initial: Duration::from_millis(200),
            max: Duration::from_secs(2),
        });
    if interactive(conn) {
        builder = builder.input_handler(prompt::handler());
    }
    Ok(builder.build().await?)
}

/// Whether a person is there to answer questions.
fn interactive(conn: &Connection) -> bool {
    !conn.json && std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

async fn execute(command: ClientCommand) -> Result<u8, Failure> {
    match command {
        ClientCommand::Tools { quiet, conn } => tools(&conn, quiet).await,
        ClientCommand::Call {
            tool,
            args,
            detach,
            conn,
        } => call(&conn, &tool, &args, detach).await,
        ClientCommand::Ls {
            refresh,
            all,
            quiet,
            conn,
        } => handles::ls(&conn, refresh, all, quiet).await,
        ClientCommand::Get { id, conn } => {
            let client = connect(&conn).await?;
            let task = client.resume(&id).await?.get().await?;
            handles::record_status(&conn, client.endpoint(), &task).await;
            if conn.json {
                print_json(&task.raw);
            } else {
                print_task(&task);
            }
            Ok(status_code(&task))
        }
        ClientCommand::Watch { id, conn } => {
            let client = connect(&conn).await?;
            let handle = client.resume(&id).await?;
            let result = follow(&conn, &handle).await;
            if let Some(task) = handle.last_seen() {
                handles::record_status(&conn, client.endpoint(), &task).await;
            }
            result
        }
        ClientCommand::Answer {
            id,
            key,
            response,
            conn,
        } => {
            let value: Value = serde_json::from_str(&response)
                .map_err(|e| usage(format!("the response is not valid JSON: {e}")))?;
            if !value.is_object() {
                return Err(usage(
                    "the response must be a JSON object, e.g. '{\"action\":\"accept\",\"content\":{…}}'",
                ));
            }
            let client = connect(&conn).await?;
            let handle = client.resume(&id).await?;
            let mut responses = Map::new();
            responses.insert(key.clone(), value);
            handle.answer_outstanding(responses).await?;
            if conn.json {
                print_json(&serde_json::json!({ "taskId": id, "answered": [key] }));
            } else {
                println!("answered `{key}` of {id}");
            }
            Ok(code::COMPLETED)
        }
        ClientCommand::Cancel { id, conn } => {
            let client = connect(&conn).await?;
            client.resume(&id).await?.cancel().await?;
            if conn.json {
                print_json(&serde_json::json!({ "taskId": id, "cancelRequested": true }));
            } else {
                println!("cancellation of {id} requested (follow it with `mcp-tasks watch {id}`)");
            }
            Ok(code::COMPLETED)
        }
    }
}

async fn tools(conn: &Connection, quiet: bool) -> Result<u8, Failure> {
    let client = connect(conn).await?;
    let tools = client.list_tools().await?;
    if conn.json {
        print_json(&Value::Array(tools.into_iter().map(|t| t.raw).collect()));
        return Ok(code::COMPLETED);
    }
    let mut out = std::io::stdout().lock();
    if quiet {
        for t in &tools {
            let _ = writeln!(out, "{}", t.name);
        }
        return Ok(code::COMPLETED);
    }
    if tools.is_empty() {
        eprintln!("the server has no tools");
        return Ok(code::COMPLETED);
    }
    let rows: Vec<[String; 3]> = tools
        .iter()
        .map(|t| [t.name.clone(), arguments_of(t), about(t)])
        .collect();
    print_table(&mut out, ["NAME", "ARGUMENTS", "DESCRIPTION"], &rows);
    Ok(code::COMPLETED)
}

/// A tool's description (its first line; the title when it has none).
fn about(tool: &ToolInfo) -> String {
    tool.description
        .as_deref()
        .and_then(|d| d.lines().map(str::trim).find(|l| !l.is_empty()))
        .map(str::to_owned)
        .or_else(|| tool.title.clone())
        .unwrap_or_default()
}

/// A tool's arguments in one line: `name: type`, `name?: type` when optional, the values
/// of an `enum` as `a|b|c`; `-` when it takes none.
fn arguments_of(tool: &ToolInfo) -> String {
    let Some(props) = tool
        .input_schema
        .get("properties")
        .and_then(Value::as_object)
    else {
        return "-".to_owned();
    };
    if props.is_empty() {
        return "-".to_owned();
    }
    let required: Vec<&str> = tool
        .input_schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    props
        .iter()
        .map(|(name, schema)| {
            let optional = if required.contains(&name.as_str()) {
                ""
            } else {
                "?"
            };
            format!("{name}{optional}: {}", type_of(schema))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn type_of(schema: &Value) -> String {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return values
            .iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
            .collect::<Vec<_>>()
            .join("|");
    }
    match schema.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join("|"),
        _ => "any".to_owned(),
    }
}

/// Columns padded to their widest cell, two spaces apart, under a header; the last column
/// is not padded.
fn print_table<const N: usize>(out: &mut impl Write, header: [&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(|h| h.chars().count());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == N {
                s.push_str(cell);
            } else {
                s.push_str(cell);
                let pad = widths[i] - cell.chars().count() + 2;
                s.extend(std::iter::repeat_n(' ', pad));
            }
        }
        s.trim_end().to_owned()
    };
    let _ = writeln!(out, "{}", line(header.to_vec()));
    for row in rows {
        let _ = writeln!(out, "{}", line(row.iter().map(String::as_str).collect()));
    }
}

async fn call(conn: &Connection, tool: &str, args: &str, detach: bool) -> Result<u8, Failure> {
    let args: Value =
        serde_json::from_str(args).map_err(|e| usage(format!("--args is not valid JSON: {e}")))?;
    if !args.is_object() {
        return Err(usage(
            "--args must be a JSON object, e.g. '{\"name\":\"Ada\"}'",
        ));
    }
    let client = connect(conn).await?;
    match client.call_tool(tool, args.clone()).await? {
        CallOutcome::Complete(result) => {
            if conn.json {
                print_json(&strip_meta(result.clone()));
            } else {
                print_result(&result);
            }
            Ok(result_code(&result))
        }
        CallOutcome::Task(handle) => {
            let created = handle.last_seen();
            if let Some(task) = &created {
                handles::remember(conn, client.endpoint(), tool, &args, task).await;
            }
            if detach {
                match &created {
                    Some(task) if conn.json => print_json(&task.raw),
                    _ => println!("{}", handle.id()),
                }
                return Ok(code::COMPLETED);
            }
            if !conn.json && std::io::stderr().is_terminal() {
                eprintln!("task {}", handle.id());
            }
            let result = follow(conn, &handle).await;
            if let Some(task) = handle.last_seen() {
                handles::record_status(conn, client.endpoint(), &task).await;
            }
            result
        }
    }
}

/// Follows a task to its end: live on a terminal (asking its input requests when a person
/// is there), quiet otherwise.
async fn follow(conn: &Connection, handle: &TaskHandle) -> Result<u8, Failure> {
    let live = std::io::stderr().is_terminal();
    let ask = interactive(conn);
    let mut line = StatusLine::new(live, handle.id());
    let mut watch = handle.watch();
    let mut ticker = tokio::time::interval(Duration::from_millis(120));
    let mut asked: HashSet<String> = HashSet::new();
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        tokio::select! {
            item = watch.next() => {
                let task = match item {
                    Some(Ok(task)) => task,
                    Some(Err(e)) => {
                        line.clear();
                        // Only a lost connection leaves a task worth watching again; an
                        // unknown, malformed or expired id does not.
                        let resumable = e.is_transport();
                        let mut failure = Failure::from(e);
                        if resumable {
                            failure.message.push_str(&format!(
                                "\nthe task may go on on the server: `mcp-tasks watch {}`",
                                handle.id()
                            ));
                        }
                        return Err(failure);
                    }
                    None => {
                        line.clear();
                        return Err(Failure {
                            code: code::PROTOCOL,
                            message: format!("stopped following {} before it ended", handle.id()),
                        });
                    }
                };
                line.update(&task);
                if task.is_terminal() {
                    line.clear();
                    if conn.json {
                        print_json(&task.raw);
                    } else {
                        print_terminal(&task);
                    }
                    return Ok(status_code(&task));
                }
                if task.status == TaskStatus::InputRequired {
                    let pending: Map<String, Value> = task
                        .input_requests
                        .iter()
                        .filter(|(k, _)| !asked.contains(*k))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    if pending.is_empty() {
                        continue;
                    }
                    line.clear();
                    let answers = if ask {
                        tokio::select! {
                            answers = prompt::ask_all(&pending) => answers,
                            _ = &mut interrupted => return Ok(interrupt(handle)),
                        }
                    } else {
                        Map::new()
                    };
                    if answers.len() < pending.len() {
                        if conn.json {
                            print_json(&task.raw);
                        } else {
                            print_input_required(&task);
                        }
                        return Ok(code::INPUT_REQUIRED);
                    }
                    asked.extend(answers.keys().cloned());
                    handle.answer(answers).await?;
                }
            }
            _ = ticker.tick(), if live => line.draw(),
            _ = &mut interrupted => {
                line.clear();
                return Ok(interrupt(handle));
            }
        }
    }
}

fn interrupt(handle: &TaskHandle) -> u8 {
    let id = handle.id();
    eprintln!(
        "interrupted: task {id} goes on on the server\n  follow it: mcp-tasks watch {id}\n  cancel it: mcp-tasks cancel {id}"
    );
    code::INTERRUPTED
}

fn status_code(task: &Task) -> u8 {
    match task.status {
        TaskStatus::Completed => task.result.as_ref().map_or(code::COMPLETED, result_code),
        TaskStatus::Failed => code::FAILED,
        TaskStatus::Cancelled => code::CANCELLED,
        TaskStatus::InputRequired => code::INPUT_REQUIRED,
        TaskStatus::Working => code::WORKING,
    }
}

fn result_code(result: &Value) -> u8 {
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        code::TOOL_ERROR
    } else {
        code::COMPLETED
    }
}

fn strip_meta(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("_meta");
    }
    v
}

fn print_json(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer_pretty(&mut out, v);
    let _ = writeln!(out);
}

/// A `CallToolResult` for people: text blocks as text, other blocks summarised, the
/// structured content when there is no text.
fn print_result(result: &Value) {
    let mut out = std::io::stdout().lock();
    let mut printed = false;
    for block in result
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("?");
        let s = match kind {
            "text" => block
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            "image" | "audio" => format!(
                "[{kind} {}, {} bytes of base64]",
                block.get("mimeType").and_then(Value::as_str).unwrap_or("?"),
                block
                    .get("data")
                    .and_then(Value::as_str)
                    .map_or(0, str::len)
            ),
            "resource_link" => format!(
                "[link {}]",
                block.get("uri").and_then(Value::as_str).unwrap_or("?")
            ),
            "resource" => match block.pointer("/resource/text").and_then(Value::as_str) {
                Some(text) => text.to_owned(),
                None => format!(
                    "[resource {}]",
                    block
                        .pointer("/resource/uri")
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                ),
            },
            other => format!("[{other} content]"),
        };
        let _ = writeln!(out, "{s}");
        printed = true;
    }
    if !printed && let Some(structured) = result.get("structuredContent") {
        let _ = serde_json::to_writer_pretty(&mut out, structured);
        let _ = writeln!(out);
    }
    if result_code(result) == code::TOOL_ERROR {
        eprintln!("error: the tool reported an error (isError)");
    }
}

fn print_terminal(task: &Task) {
    match task.status {
        TaskStatus::Completed => match &task.result {
            Some(result) => print_result(result),
            None => eprintln!("task {} completed without a result", task.task_id),
        },
        TaskStatus::Failed => {
            let detail = task
                .error
                .as_ref()
                .map(|e| format!("JSON-RPC error {}: {}", e.code, e.message))
                .unwrap_or_else(|| "no error given".to_owned());
            eprintln!("task {} failed: {detail}", task.task_id);
            // Often the error's own message again: then once is enough.
            let repeated = |m: &String| task.error.as_ref().is_some_and(|e| e.message == *m);
            if let Some(m) = task.status_message.as_ref().filter(|m| !repeated(m)) {
                eprintln!("  {m}");
            }
        }
        TaskStatus::Cancelled => {
            eprintln!("task {} was cancelled", task.task_id);
            if let Some(m) = &task.status_message {
                eprintln!("  {m}");
            }
        }
        TaskStatus::Working | TaskStatus::InputRequired => {}
    }
}

/// `get` for people: the status, then what it carries.
fn print_task(task: &Task) {
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{} {}", task.task_id, task.status.as_str());
        // A failed or cancelled task's message comes once, with its outcome on stderr.
        let ended = matches!(task.status, TaskStatus::Failed | TaskStatus::Cancelled);
        if let Some(m) = task.status_message.as_ref().filter(|_| !ended) {
            let _ = writeln!(out, "  {m}");
        }
        if !task.created_at.is_empty() {
            let _ = writeln!(
                out,
                "  created {}, updated {}",
                task.created_at, task.last_updated_at
            );
        }
    }
    match task.status {
        TaskStatus::InputRequired => print_requests(task),
        TaskStatus::Working => {}
        _ => print_terminal(task),
    }
}

fn print_input_required(task: &Task) {
    println!("{} input_required", task.task_id);
    print_requests(task);
    eprintln!(
        "answer each with: mcp-tasks answer {id} KEY 'RESPONSE-JSON', then: mcp-tasks watch {id}",
        id = task.task_id
    );
}

fn print_requests(task: &Task) {
    let mut out = std::io::stdout().lock();
    for (key, request) in &task.input_requests {
        let _ = writeln!(out, "  {key}: {}", describe_request(request));
        if let Some(schema) = request.pointer("/params/requestedSchema") {
            let _ = writeln!(out, "    schema: {schema}");
        }
    }
}

fn describe_request(request: &Value) -> String {
    let method = request.get("method").and_then(Value::as_str).unwrap_or("?");
    let message = request
        .pointer("/params/message")
        .and_then(Value::as_str)
        .map(|m| format!(" \"{m}\""))
        .unwrap_or_default();
    format!("{method}{message}")
}

/// The live line on stderr: spinner, status, elapsed time, status message.
struct StatusLine {
    live: bool,
    id: String,
    start: Instant,
    frame: usize,
    status: String,
    message: Option<String>,
    shown: bool,
}

impl StatusLine {
    fn new(live: bool, id: &str) -> Self {
        Self {
            live,
            id: id.to_owned(),
            start: Instant::now(),
            frame: 0,
            status: "…".to_owned(),
            message: None,
            shown: false,
        }
    }

    fn update(&mut self, task: &Task) {
        self.status = task.status.as_str().to_owned();
        self.message = task.status_message.clone();
        self.draw();
    }

    fn draw(&mut self) {
        if !self.live {
            return;
        }
        const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
        self.frame = (self.frame + 1) % FRAMES.len();
        let elapsed = self.start.elapsed().as_secs_f64();
        let mut s = format!(
            "{} {} {} {elapsed:.1}s",
            FRAMES[self.frame], self.id, self.status
        );
        if let Some(m) = &self.message {
            s.push_str(" — ");
            s.push_str(m);
        }
        let s: String = s.chars().take(terminal_width().saturating_sub(1)).collect();
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{s}");
        let _ = err.flush();
        self.shown = true;
    }

    fn clear(&mut self) {
        if self.live && self.shown {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            self.shown = false;
        }
    }
}

fn terminal_width() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .filter(|&w: &usize| w >= 20)
        .unwrap_or(80)
}
