//! A session-era upstream on stdio: a child process, newline-delimited JSON-RPC on its stdin
//! and stdout, its stderr in the log.
//!
//! stdio carries no link between a server's request and the call it is about: an
//! `elicitation/create` on stdout could belong to any call in flight on that process, and
//! guessing could show one client's question to another. So a [`StdioPool`] gives each call
//! a process of its own, shared by the rule of `pool.rs`: the first process lists the tools
//! and takes a call when it is free; a call that finds every process busy waits about a
//! call's time for one to be free, then has another started in the background (up to
//! `Upstream::max_processes`) and takes whichever comes first, so a burst of short calls is
//! served by the running processes while the pool grows for the next one; a process beyond
//! the first that stays idle for [`IDLE_PROCESS`] is stopped. (An upstream that keeps state in
//! its process between calls sees calls spread over several processes.) Should a request
//! still arrive with no call or with several in flight, it is refused with an error saying
//! why.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{Notify, mpsc, oneshot, watch};

use super::config::Upstream;
use super::error::UpstreamError;
use super::link::{self, CallError, CallSpec, Inbound, Link, Reply};
use super::pool::{Pool, Taken};
use crate::wire::error::RpcError;

/// The variables of the gateway's environment a stdio upstream gets (besides its own,
/// `Upstream::env`): what a program needs to run, never the credentials the gateway holds.
pub(crate) const INHERITED: &[&str] = &[
    "HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TMPDIR", "TZ",
];

/// How long a process beyond the first may stay idle before it is stopped.
pub(crate) const IDLE_PROCESS: Duration = Duration::from_secs(60);

/// Longest line read from an upstream's stdout (a larger message closes the connection).
const MAX_LINE: usize = 64 * 1024 * 1024;

type Pending = Mutex<HashMap<u64, oneshot::Sender<Result<Value, UpstreamError>>>>;

/// A running child process and its JSON-RPC session.
pub(crate) struct StdioLink {
    upstream: String,
    timeout: Duration,
    writer: mpsc::UnboundedSender<String>,
    pending: Pending,
    /// The `tools/call`s in flight, by request id (= progress token).
    calls: Mutex<HashMap<u64, link::InboundTx>>,
    next_id: AtomicU64,
    closed: watch::Receiver<bool>,
    refresh: Arc<Notify>,
    /// Whether the server can run `tools/call` as a task (`2025-11-25` experimental tasks).
    tasks: std::sync::atomic::AtomicBool,
    /// Dropped with the link: the process is then stopped.
    _kill: oneshot::Sender<()>,
}

impl StdioLink {
    /// Starts the process and completes `initialize`.
    pub(crate) async fn connect(
        config: &Upstream,
        program: &str,
        args: &[String],
        refresh: Arc<Notify>,
    ) -> Result<Arc<Self>, UpstreamError> {
        let name = config.name.clone();
        let unreachable = |reason: String| UpstreamError::Unreachable {
            upstream: name.clone(),
            reason,
        };
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .env_clear()
            .envs(
                INHERITED
                    .iter()
                    .filter_map(|k| std::env::var_os(k).map(|v| (k, v))),
            )
            .envs(config.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| unreachable(cannot_start(program, &e)))?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(unreachable("its standard streams are not available".into()));
        };
        tracing::info!(upstream = %name, pid = child.id(), "upstream process started");
        let (writer, mut lines) = mpsc::unbounded_channel::<String>();
        let (closed_tx, closed) = watch::channel(false);
        let (kill, killed) = oneshot::channel::<()>();
        let link = Arc::new(Self {
            upstream: name.clone(),
            timeout: config.timeout,
            writer,
            pending: Mutex::new(HashMap::new()),
            calls: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            closed,
            refresh,
            tasks: std::sync::atomic::AtomicBool::new(false),
            _kill: kill,
        });
        tokio::spawn(async move {
            let mut stdin = stdin;
            while let Some(line) = lines.recv().await {
                let written = async {
                    stdin.write_all(line.as_bytes()).await?;
                    stdin.write_all(b"\n").await?;
                    stdin.flush().await
                };
                if written.await.is_err() {
                    break;
                }
            }
        });
        let log_name = name.clone();
        tokio::spawn(async move {
            let mut err = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = err.next_line().await {
                // Escaped: the line is the upstream's, control characters and all.
                tracing::info!(target: "mcp_tasks::gateway::upstream", upstream = %log_name, "{}", line.escape_debug());
            }
        });
        let weak = Arc::downgrade(&link);
        tokio::spawn(async move {
            let dropped = tokio::select! {
                () = read_loop(weak, stdout) => false,
                _ = killed => true,
            };
            let _ = closed_tx.send(true);
            if dropped {
                let _ = child.start_kill();
            }
            let status = match tokio::time::timeout(Duration::from_secs(5), child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    let _ = child.start_kill();
                    child.wait().await
                }
            };
            match status {
                Ok(status) if dropped => {
                    tracing::debug!(upstream = %name, %status, "upstream process stopped")
                }
                Ok(status) => tracing::warn!(upstream = %name, %status, "upstream process exited"),
                Err(e) => tracing::warn!(upstream = %name, error = %e, "upstream process lost"),
            }
        });
        let init = link.request_with(link::initialize_request).await?;
        let version = init
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        tracing::info!(upstream = %link.upstream, protocol = version, server = %init.get("serverInfo").cloned().unwrap_or_default(), "upstream initialized");
        link.tasks
            .store(link::runs_tools_as_tasks(&init), Ordering::Relaxed);
        link.send_line(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))?;
        Ok(link)
    }

    /// Queues one line for the process's stdin; refused (nothing sent) once its writer
    /// stopped.
    fn send_line(&self, message: &Value) -> Result<(), UpstreamError> {
        self.writer
            .send(message.to_string())
            .map_err(|_| UpstreamError::NotSent {
                upstream: self.upstream.clone(),
                reason: "its process is not running".into(),
            })
    }

    /// The error of a request in flight when the process exited (it may have run).
    fn gone(&self) -> UpstreamError {
        UpstreamError::Unreachable {
            upstream: self.upstream.clone(),
            reason: "its process exited".into(),
        }
    }

    /// Sends the request `make(id)` and waits (up to the timeout) for its result.
    async fn request_with(&self, make: impl FnOnce(u64) -> Value) -> Result<Value, UpstreamError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        if let Err(e) = self.send_line(&make(id)) {
            lock(&self.pending).remove(&id);
            return Err(e);
        }
        let outcome = tokio::time::timeout(self.timeout, rx).await;
        lock(&self.pending).remove(&id);
        match outcome {
            Err(_) => Err(UpstreamError::Timeout {
                upstream: self.upstream.clone(),
                seconds: self.timeout.as_secs_f64(),
            }),
            Ok(Err(_)) => Err(self.gone()),
            Ok(Ok(message)) => link::decode(&self.upstream, message?),
        }
    }

    /// Routes one message from the process.
    fn dispatch(&self, message: Value) {
        let id = message.get("id").and_then(Value::as_u64);
        let method = message.get("method").and_then(Value::as_str);
        match (method, id) {
            (None, Some(id)) => {
                if let Some(tx) = lock(&self.pending).remove(&id) {
                    let _ = tx.send(Ok(message));
                }
            }
            (Some("notifications/progress"), _) => {
                let params = message.get("params").cloned().unwrap_or_default();
                let token = params.get("progressToken").and_then(Value::as_u64);
                if let (Some(token), Some(event)) = (token, Inbound::progress(&params))
                    && let Some(call) = lock(&self.calls).get(&token)
                {
                    let _ = call.send(event);
                }
            }
            (Some("notifications/tools/list_changed"), _) => self.refresh.notify_one(),
            (Some(m), None) => {
                tracing::debug!(upstream = %self.upstream, method = m, "upstream notification")
            }
            (Some(m), Some(_)) => self.server_request(message.clone(), m),
            (None, None) => {
                tracing::debug!(upstream = %self.upstream, "upstream message without method or id ignored")
            }
        }
    }

    /// A request of the server: `ping` answered here, others given to the one call in flight.
    fn server_request(&self, message: Value, method: &str) {
        let id = message.get("id").cloned().unwrap_or(Value::Null);
        let params = message.get("params").cloned().unwrap_or_default();
        if method == "ping" {
            let _ = self.send_line(&json!({ "jsonrpc": "2.0", "id": id, "result": {} }));
            return;
        }
        let refusal = {
            let calls = lock(&self.calls);
            match (calls.len(), calls.values().next()) {
                (1, Some(call)) => {
                    let event = Inbound::Request {
                        id: id.clone(),
                        method: method.to_owned(),
                        params,
                    };
                    call.send(event).err().map(|refused| refused.to_string())
                }
                (0, _) | (_, None) => Some("no call is in flight".to_owned()),
                (n, _) => Some(format!(
                    "{n} calls are in flight and stdio does not say which one it is about"
                )),
            }
        };
        if let Some(why) = refusal {
            tracing::warn!(upstream = %self.upstream, method, why, "upstream request refused");
            let error = RpcError::internal(format!("the gateway cannot relay `{method}`: {why}"));
            let _ =
                self.send_line(&json!({ "jsonrpc": "2.0", "id": id, "error": error.to_json() }));
        }
    }

    /// Sends the request `method` (its `_meta.progressToken` the request's id) and drives it
    /// to its response (see `link::drive`).
    async fn drive_request(
        &self,
        method: &str,
        mut params: Value,
        hooks: &dyn link::Hooks,
        timeout: Duration,
    ) -> Result<Value, CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let (events_tx, events) = link::inbound();
        lock(&self.pending).insert(id, tx);
        lock(&self.calls).insert(id, events_tx);
        let _forget = Forget { link: self, id };
        params["_meta"] = json!({ "progressToken": id });
        let message = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        self.send_line(&message)?;
        link::drive(&self.upstream, self, id, rx, events, hooks, timeout).await
    }
}

/// Why `program` could not start, naming it by its file name (never its arguments, nor the
/// folders of its path).
fn cannot_start(program: &str, e: &std::io::Error) -> String {
    let path = std::path::Path::new(program);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| program.to_owned());
    let name = name.escape_debug();
    let bare = path.components().count() == 1;
    match e.kind() {
        std::io::ErrorKind::NotFound if bare => {
            format!("its command `{name}` was not found on PATH")
        }
        std::io::ErrorKind::NotFound => {
            format!("its command `{name}` was not found (no such file)")
        }
        std::io::ErrorKind::PermissionDenied => {
            format!("its command `{name}` could not start: permission denied (is it executable?)")
        }
        kind => format!("its command `{name}` could not start: {kind}"),
    }
}

/// Removes a call's routes when it ends, however it ends.
struct Forget<'a> {
    link: &'a StdioLink,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(&self.link.pending).remove(&self.id);
        lock(&self.link.calls).remove(&self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads the process's stdout line by line until it closes (or sends a line over
/// [`MAX_LINE`]); every pending request then fails.
async fn read_loop(link: Weak<StdioLink>, stdout: tokio::process::ChildStdout) {
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = (&mut reader)
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut line)
            .await;
        let Some(link) = link.upgrade() else { return };
        match read {
            Ok(0) | Err(_) => break,
            Ok(_) if line.last() != Some(&b'\n') && line.len() >= MAX_LINE => {
                tracing::error!(upstream = %link.upstream, "upstream sent a line over {MAX_LINE} bytes; closing");
                break;
            }
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(text) {
            Ok(message) => link.dispatch(message),
            Err(_) => {
                tracing::info!(target: "mcp_tasks::gateway::upstream", upstream = %link.upstream, "stdout (not JSON-RPC): {}", text.escape_debug())
            }
        }
    }
    if let Some(link) = link.upgrade() {
        let gone = link.gone();
        for (_, tx) in lock(&link.pending).drain() {
            let _ = tx.send(Err(gone.clone()));
        }
        lock(&link.calls).clear();
    }
}

impl link::SessionDriver for StdioLink {
    fn drive<'a>(
        &'a self,
        method: &'a str,
        params: Value,
        hooks: &'a dyn link::Hooks,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Value, CallError>> {
        Box::pin(self.drive_request(method, params, hooks, timeout))
    }

    fn request<'a>(
        &'a self,
        method: &'a str,
        params: Value,
    ) -> BoxFuture<'a, Result<Value, UpstreamError>> {
        Box::pin(self.request_with(
            move |id| json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }),
        ))
    }

    fn upstream(&self) -> &str {
        &self.upstream
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn has_tasks(&self) -> bool {
        self.tasks.load(Ordering::Relaxed)
    }
}

impl Reply for StdioLink {
    fn send(&self, message: Value) -> BoxFuture<'_, Result<(), UpstreamError>> {
        Box::pin(async move { self.send_line(&message) })
    }
}

impl Link for StdioLink {
    fn list_tools(
        &self,
        limits: link::ListLimits,
    ) -> BoxFuture<'_, Result<Vec<Value>, UpstreamError>> {
        Box::pin(link::list_all(&self.upstream, limits, |params| {
            link::SessionDriver::request(self, "tools/list", Value::Object(params))
        }))
    }

    fn call<'a>(&'a self, spec: CallSpec<'a>) -> BoxFuture<'a, Result<Value, CallError>> {
        Box::pin(link::session_call(self, spec))
    }

    fn closed(&self) -> BoxFuture<'_, ()> {
        let mut closed = self.closed.clone();
        Box::pin(async move {
            let _ = closed.wait_for(|c| *c).await;
        })
    }

    fn era(&self) -> &'static str {
        link::SESSION_VERSION
    }
}

/// The processes of one stdio upstream, one call in flight on each (the sharing rule is
/// [`Pool`]'s).
pub(crate) struct StdioPool {
    config: Upstream,
    program: String,
    args: Vec<String>,
    refresh: Arc<Notify>,
    /// The first process: lists the tools; its exit ends the pool's connection.
    first: Arc<StdioLink>,
    /// Every running process, the first among them.
    processes: Arc<Pool<Arc<StdioLink>>>,
}

/// A process that exited is no longer given a call.
fn usable(link: &Arc<StdioLink>) -> bool {
    !*link.closed.borrow()
}

impl StdioPool {
    pub(crate) async fn connect(
        config: &Upstream,
        program: &str,
        args: &[String],
        refresh: Arc<Notify>,
    ) -> Result<Arc<Self>, UpstreamError> {
        let first = StdioLink::connect(config, program, args, refresh.clone()).await?;
        let pool = Arc::new(Self {
            config: config.clone(),
            program: program.to_owned(),
            args: args.to_vec(),
            refresh,
            first: first.clone(),
            processes: Arc::new(Pool::new(first, config.max_processes)),
        });
        tokio::spawn(reap(Arc::downgrade(&pool)));
        Ok(pool)
    }

    /// A process with no call in flight: an idle one, one that frees, or a new one (see
    /// [`Pool::take`]). Waits while the upstream's limit of processes is in use.
    async fn take(&self) -> Result<Taken<Arc<StdioLink>>, UpstreamError> {
        if self.processes.saturated() {
            tracing::info!(upstream = %self.config.name, limit = self.config.max_processes, "every upstream process is busy and no more may start; the call waits for one");
        }
        // Called only when a process is to start: a call that finds one idle copies nothing.
        let start = || {
            let (config, program, args, refresh) = (
                self.config.clone(),
                self.program.clone(),
                self.args.clone(),
                self.refresh.clone(),
            );
            async move { StdioLink::connect(&config, &program, &args, refresh).await }
        };
        let (name, processes) = (&self.config.name, &self.processes);
        processes
            .take(usable, start, || {
                tracing::info!(upstream = %name, processes = processes.members(), "every upstream process is busy; starting another");
            })
            .await
    }
}

/// An error met before a call was written to any process, as [`UpstreamError::NotSent`].
fn not_sent(e: UpstreamError) -> UpstreamError {
    match e {
        UpstreamError::Unreachable { upstream, reason } => {
            UpstreamError::NotSent { upstream, reason }
        }
        UpstreamError::Timeout { upstream, seconds } => UpstreamError::NotSent {
            upstream,
            reason: format!("a new process did not answer `initialize` within {seconds} s"),
        },
        other => other,
    }
}

/// Stops the processes beyond the first that stayed idle for [`IDLE_PROCESS`].
async fn reap(pool: Weak<StdioPool>) {
    loop {
        tokio::time::sleep(IDLE_PROCESS / 4).await;
        let Some(pool) = pool.upgrade() else { return };
        let now = tokio::time::Instant::now();
        pool.processes.retain(|link, since| {
            Arc::ptr_eq(link, &pool.first) || now.duration_since(since) < IDLE_PROCESS
        });
    }
}

impl Link for StdioPool {
    fn list_tools(
        &self,
        limits: link::ListLimits,
    ) -> BoxFuture<'_, Result<Vec<Value>, UpstreamError>> {
        self.first.list_tools(limits)
    }

    fn call<'a>(&'a self, spec: CallSpec<'a>) -> BoxFuture<'a, Result<Value, CallError>> {
        Box::pin(async move {
            // No process to take: nothing was sent.
            let taken = self.take().await.map_err(not_sent)?;
            let began = tokio::time::Instant::now();
            let outcome = link::session_call(&**taken.member(), spec).await;
            self.processes.record(began.elapsed());
            self.processes.give_back(taken, usable);
            outcome
        })
    }

    fn closed(&self) -> BoxFuture<'_, ()> {
        self.first.closed()
    }

    fn era(&self) -> &'static str {
        link::SESSION_VERSION
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_that_cannot_start_is_named_by_its_file_name() {
        let not_found = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(
            cannot_start("mcp-server-filesystem", &not_found),
            "its command `mcp-server-filesystem` was not found on PATH"
        );
        let e = cannot_start("/home/someone/secret-dir/server", &not_found);
        assert_eq!(e, "its command `server` was not found (no such file)");
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert!(cannot_start("./x", &denied).contains("`x` could not start: permission denied"));
    }
}
