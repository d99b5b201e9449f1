//! Headless Chromium for the browser tests, driven over the Chrome DevTools Protocol (CDP).
//!
//! [`Browser::launch`] starts `/usr/bin/chromium` (or `$MCP_TASKS_CHROMIUM`) headless with a
//! fresh profile in a temporary folder and `--remote-debugging-port=0`, reads the port it chose
//! from the `DevToolsActivePort` file it writes there, and connects to the browser's WebSocket.
//! Each [`Page`] is a tab of its own, attached in flattened session mode
//! (`Target.attachToTarget` with `flatten: true`): its commands carry its `sessionId`, and one
//! task reads the socket, handing each response to the command that waits for its `id` and each
//! event to the page of its `sessionId`. Every command gives up after [`COMMAND_TIMEOUT`] with an
//! error that names the method; errors are `String`s, for the tests to `expect` or match. A
//! page's dialogs (`alert`, `confirm`, …) are answered OK at once, so that none blocks a test.
//!
//! Without Chromium a test skips (it says so on stderr), unless `MCP_TASKS_REQUIRE_BROWSER` is
//! set (CI sets it): then it fails, saying to run `scripts/browser.sh`. Dropping the
//! [`Browser`] kills Chromium, reaps it and removes its folder. Its own children (zygotes,
//! renderers) die with it; they are reaped by PID 1, which may take a moment.
//!
//! Hand-written rather than taken from a CDP crate (chromiumoxide, headless_chrome, fantoccini):
//! those carry bindings for the whole protocol, minutes of compile time for the dozen commands
//! used here, and dependency trees of their own; this needs only `tokio-tungstenite` beside what
//! the tests already use.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use base64::Engine;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

/// How long a command (and a launch, and a navigation's load) may take.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// How often [`Page::wait_until`] evaluates its predicate.
const POLL: Duration = Duration::from_millis(50);

type Reply = Result<Value, String>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A JavaScript string literal (a JSON string is one).
fn js_string(s: &str) -> String {
    Value::from(s).to_string()
}

/// A headless Chromium, killed with its folder when dropped.
pub struct Browser {
    conn: Arc<Conn>,
    pump: tokio::task::JoinHandle<()>,
    process: Process,
}

/// One tab: commands go to its session, its events (load, HTTP status, errors) are kept here.
pub struct Page {
    conn: Arc<Conn>,
    session: String,
    target: String,
    events: Arc<PageEvents>,
    /// The `loaderId` of the last [`Page::goto`].
    last_loader: Mutex<Option<String>>,
}

/// The socket's writer (through the pump task) and what the pump shares with the commands.
struct Conn {
    out: mpsc::UnboundedSender<String>,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    next_id: AtomicU64,
    /// The commands waiting for an answer, by `id`.
    pending: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    /// The pages, by `sessionId`.
    pages: Mutex<HashMap<String, Arc<PageEvents>>>,
}

struct PageEvents {
    state: Mutex<PageState>,
    /// Bumped after each event kept, and when the connection ends.
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct PageState {
    errors: Vec<String>,
    dialogs: Vec<String>,
    /// The `loaderId`s whose document fired `load`.
    loaded: HashSet<String>,
    /// The HTTP status of each document, by `loaderId`.
    statuses: HashMap<String, u16>,
    /// The URLs of the documents loaded.
    documents: HashSet<String>,
    /// The connection to Chromium is gone.
    gone: bool,
}

/// The Chromium process and its folder (profile, log), both gone when dropped.
struct Process {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Its children may still be writing into the profile for a few milliseconds.
        for _ in 0..40 {
            match std::fs::remove_dir_all(self.dir.path()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    std::thread::sleep(Duration::from_millis(25))
                }
                _ => break,
            }
        }
    }
}

impl Browser {
    /// Starts Chromium, or returns `None` after saying on stderr that the test skips when there
    /// is none (`/usr/bin/chromium`, or `$MCP_TASKS_CHROMIUM`). Panics when it is missing and
    /// `MCP_TASKS_REQUIRE_BROWSER` is set, and when it is there but does not start.
    pub async fn launch() -> Option<Browser> {
        Browser::launch_with(&[]).await
    }

    /// [`Browser::launch`] with more command-line switches (`--host-resolver-rules=…`, say).
    pub async fn launch_with(extra: &[&str]) -> Option<Browser> {
        let exe = std::env::var_os("MCP_TASKS_CHROMIUM")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
        if !exe.is_file() {
            assert!(
                std::env::var_os("MCP_TASKS_REQUIRE_BROWSER").is_none(),
                "Chromium is required (MCP_TASKS_REQUIRE_BROWSER) but {} is missing: install it with scripts/browser.sh (or name one with MCP_TASKS_CHROMIUM)",
                exe.display()
            );
            // Straight to stderr, past the test harness's capture, so that `cargo test` says so.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: no Chromium at {} (scripts/browser.sh installs it; MCP_TASKS_CHROMIUM names another); the browser tests do not run",
                exe.display()
            );
            return None;
        }
        match Browser::start(&exe, extra).await {
            Ok(browser) => Some(browser),
            Err(e) => panic!("Chromium ({}) did not start: {e}", exe.display()),
        }
    }

    async fn start(exe: &Path, extra: &[&str]) -> Result<Browser, String> {
        let dir = tempfile::Builder::new()
            .prefix("mcp-tasks-chromium-")
            .tempdir()
            .map_err(|e| format!("a temporary folder: {e}"))?;
        let profile = dir.path().join("profile");
        let log = std::fs::File::create(dir.path().join("chromium.log"))
            .map_err(|e| format!("its log file: {e}"))?;
        let child = Command::new(exe)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                // /tmp rather than /dev/shm, which is small in containers.
                "--disable-dev-shm-usage",
                // Screenshots as wide as the viewport, without a scrollbar's strip.
                "--hide-scrollbars",
                "--remote-debugging-port=0",
            ])
            .args(extra)
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            // The crash reporter's database goes under $XDG_CONFIG_HOME, not the profile.
            .env("XDG_CONFIG_HOME", dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run it: {e}"))?;
        let mut process = Process { child, dir };
        let log = || std::fs::read_to_string(process.dir.path().join("chromium.log"));

        // Chromium writes the port and the browser's WebSocket path once it listens.
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        let url = loop {
            let text =
                std::fs::read_to_string(profile.join("DevToolsActivePort")).unwrap_or_default();
            let mut lines = text.lines();
            if let (Some(Ok(port)), Some(path)) =
                (lines.next().map(str::parse::<u16>), lines.next())
                && path.starts_with("/devtools/browser/")
            {
                break format!("ws://127.0.0.1:{port}{path}");
            }
            let failed = match process.child.try_wait() {
                Ok(Some(status)) => format!("it exited ({status})"),
                _ if Instant::now() > deadline => format!("no port after {COMMAND_TIMEOUT:?}"),
                _ => String::new(),
            };
            if !failed.is_empty() {
                return Err(format!(
                    "{failed}; its stderr:\n{}",
                    log().unwrap_or_default()
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };

        // Full-page screenshots come as one base64 message of several MB.
        let config = WebSocketConfig::default()
            .max_message_size(Some(512 << 20))
            .max_frame_size(Some(512 << 20));
        let connect = tokio_tungstenite::connect_async_with_config(&url, Some(config), true);
        let (ws, _) = match tokio::time::timeout(COMMAND_TIMEOUT, connect).await {
            Ok(Ok(connected)) => connected,
            Ok(Err(e)) => return Err(format!("connecting to {url}: {e}")),
            Err(_) => {
                return Err(format!(
                    "connecting to {url}: no answer in {COMMAND_TIMEOUT:?}"
                ));
            }
        };
        let (out, out_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared::default());
        let pump = tokio::spawn(pump(ws, out_rx, shared.clone()));
        let conn = Arc::new(Conn { out, shared });
        Ok(Browser {
            conn,
            pump,
            process,
        })
    }

    /// The browser process's id.
    pub fn pid(&self) -> u32 {
        self.process.child.id()
    }

    /// A new tab with a `width`×`height` viewport, showing `about:blank`.
    pub async fn new_page(&self, width: u32, height: u32) -> Result<Page, String> {
        let created = self
            .conn
            .call(None, "Target.createTarget", json!({ "url": "about:blank" }))
            .await?;
        let target = created["targetId"]
            .as_str()
            .ok_or("Target.createTarget: no targetId")?;
        let attached = self
            .conn
            .call(
                None,
                "Target.attachToTarget",
                json!({ "targetId": target, "flatten": true }),
            )
            .await?;
        let session = attached["sessionId"]
            .as_str()
            .ok_or("Target.attachToTarget: no sessionId")?;
        let events = Arc::new(PageEvents {
            state: Mutex::default(),
            changed: watch::Sender::new(0),
        });
        lock(&self.conn.shared.pages).insert(session.to_owned(), events.clone());
        // Made now, so that its Drop closes the tab if a step below fails.
        let page = Page {
            conn: self.conn.clone(),
            session: session.to_owned(),
            target: target.to_owned(),
            events,
            last_loader: Mutex::new(None),
        };
        // A session runs its commands in order: send them all, then wait for the answers.
        let metrics =
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false });
        futures::future::try_join_all([
            page.call("Page.enable", json!({})),
            page.call("Page.setLifecycleEventsEnabled", json!({ "enabled": true })),
            page.call("Runtime.enable", json!({})),
            page.call("Log.enable", json!({})),
            page.call("Network.enable", json!({})),
            page.call("Emulation.setDeviceMetricsOverride", metrics),
        ])
        .await?;
        Ok(page)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.pump.abort();
        // Then `process` drops: Chromium is killed and reaped, its folder removed.
    }
}

impl Conn {
    async fn call(&self, session: Option<&str>, method: &str, params: Value) -> Reply {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = session.into();
        }
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.pending).insert(id, tx);
        if self.out.send(message.to_string()).is_err() {
            lock(&self.shared.pending).remove(&id);
            return Err(format!("{method}: the connection to Chromium is closed"));
        }
        match tokio::time::timeout(COMMAND_TIMEOUT, rx).await {
            Ok(Ok(reply)) => reply.map_err(|e| format!("{method}: {e}")),
            Ok(Err(_)) => Err(format!("{method}: the connection to Chromium closed")),
            Err(_) => {
                lock(&self.shared.pending).remove(&id);
                Err(format!(
                    "{method}: no answer from Chromium in {COMMAND_TIMEOUT:?}"
                ))
            }
        }
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Writes the commands and routes what Chromium sends, until either side is done.
async fn pump(mut ws: Socket, out: mpsc::UnboundedReceiver<String>, shared: Arc<Shared>) {
    let mut pump = Pump { out, shared };
    loop {
        tokio::select! {
            command = pump.out.recv() => match command {
                Some(text) => if ws.send(Message::text(text)).await.is_err() { break },
                None => { let _ = ws.close(None).await; break }
            },
            message = ws.next() => match message {
                Some(Ok(Message::Text(text))) => {
                    if let Some(answer) = pump.shared.route(text.as_str())
                        && ws.send(Message::text(answer)).await.is_err()
                    {
                        break;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            },
        }
    }
}

/// The pump's end, however it comes (the socket closed, the task aborted): what waits learns.
struct Pump {
    out: mpsc::UnboundedReceiver<String>,
    shared: Arc<Shared>,
}

impl Drop for Pump {
    fn drop(&mut self) {
        // Closed first, so that no command can wait after `pending` is emptied.
        self.out.close();
        lock(&self.shared.pending).clear();
        for events in lock(&self.shared.pages).drain().map(|(_, events)| events) {
            lock(&events.state).gone = true;
            events.changed.send_modify(|n| *n += 1);
        }
    }
}

impl Shared {
    /// Hands a response to its command, an event to its page; returns the command that an
    /// event calls for at once (closing a dialog), if any.
    fn route(&self, text: &str) -> Option<String> {
        let message = serde_json::from_str::<Value>(text).ok()?;
        if let Some(id) = message["id"].as_u64() {
            let tx = lock(&self.pending).remove(&id)?;
            let reply = match message.get("error") {
                None => Ok(message.get("result").cloned().unwrap_or(Value::Null)),
                Some(e) => Err(match e.get("data") {
                    Some(data) => format!("{} ({}): {data}", e["message"], e["code"]),
                    None => format!("{} ({})", e["message"], e["code"]),
                }),
            };
            let _ = tx.send(reply);
            return None;
        }
        let (session, method) = (message["sessionId"].as_str()?, message["method"].as_str()?);
        let events = lock(&self.pages).get(session).cloned()?;
        let (method, params) = events.on(method, &message["params"])?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let command = json!({ "id": id, "sessionId": session, "method": method, "params": params });
        Some(command.to_string())
    }
}

impl PageEvents {
    /// Keeps what the page's tests may ask about; returns the command to answer it with.
    fn on(&self, method: &str, p: &Value) -> Option<(&'static str, Value)> {
        let mut state = lock(&self.state);
        let mut answer = None;
        match method {
            "Page.lifecycleEvent" if p["name"] == "load" => {
                state
                    .loaded
                    .insert(p["loaderId"].as_str().unwrap_or_default().to_owned());
            }
            "Network.responseReceived" if p["type"] == "Document" => {
                let status = p["response"]["status"]
                    .as_u64()
                    .and_then(|s| u16::try_from(s).ok());
                if let (Some(loader), Some(status)) = (p["loaderId"].as_str(), status) {
                    state.statuses.insert(loader.to_owned(), status);
                }
                if let Some(url) = p["response"]["url"].as_str() {
                    state.documents.insert(url.to_owned());
                }
            }
            "Runtime.consoleAPICalled" if p["type"] == "error" || p["type"] == "assert" => {
                let args = p["args"].as_array().map(Vec::as_slice).unwrap_or_default();
                let text: Vec<String> = args.iter().map(remote_object_text).collect();
                state.errors.push(format!(
                    "console.{}: {}",
                    p["type"].as_str().unwrap_or_default(),
                    text.join(" ")
                ));
            }
            "Runtime.exceptionThrown" => state.errors.push(exception_text(&p["exceptionDetails"])),
            "Log.entryAdded" if p["entry"]["level"] == "error" => {
                let entry = |key: &str| p["entry"][key].as_str().unwrap_or_default().to_owned();
                let (source, text, url) = (entry("source"), entry("text"), entry("url"));
                // A document's own status is no error of the page (the error page that Chromium
                // shows for an empty body fails to load too). Nor is a missing /favicon.ico, which
                // Chromium asks for when a page names no icon, at a time of its own.
                let document = source == "network"
                    && (state.documents.contains(&url) || url.starts_with("chrome-error:"));
                if !document && !url.ends_with("/favicon.ico") {
                    state.errors.push(format!("{source}: {text} ({url})"));
                }
            }
            // alert, confirm, prompt and beforeunload block the page until answered: OK.
            "Page.javascriptDialogOpening" => {
                let (kind, text) = (p["type"].as_str(), p["message"].as_str());
                state.dialogs.push(format!(
                    "{}: {}",
                    kind.unwrap_or("dialog"),
                    text.unwrap_or("")
                ));
                let prompt = p["defaultPrompt"].as_str().unwrap_or_default();
                let params = json!({ "accept": true, "promptText": prompt });
                answer = Some(("Page.handleJavaScriptDialog", params));
            }
            _ => return None,
        }
        drop(state);
        self.changed.send_modify(|n| *n += 1);
        answer
    }
}

/// A console argument or a thrown value, as a person would read it.
fn remote_object_text(object: &Value) -> String {
    match (object.get("value"), object["description"].as_str()) {
        (Some(Value::String(s)), _) => s.clone(),
        (_, Some(description)) => description.to_owned(),
        (Some(value), None) => value.to_string(),
        (None, None) => object["unserializableValue"]
            .as_str()
            .unwrap_or("undefined")
            .to_owned(),
    }
}

fn exception_text(details: &Value) -> String {
    let text = details["text"].as_str().unwrap_or("exception");
    match details.get("exception") {
        Some(exception) => format!("{text} {}", remote_object_text(exception)),
        None => text.to_owned(),
    }
}

/// The value of a `Runtime.evaluate` result, with `returnByValue`.
fn value_of(object: &Value) -> Value {
    let value = object.get("value").or(object.get("unserializableValue"));
    value.cloned().unwrap_or(Value::Null)
}

/// JavaScript's truthiness of a `Runtime.evaluate` result.
fn truthy(object: &Value) -> bool {
    if let Some(special) = object["unserializableValue"].as_str() {
        return !matches!(special, "NaN" | "-0" | "0n");
    }
    match object.get("value") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    }
}

impl Page {
    async fn call(&self, method: &str, params: Value) -> Reply {
        self.conn.call(Some(&self.session), method, params).await
    }

    /// Navigates to `url` and waits for its `load` event. Any HTTP status loads, with its body or,
    /// when that is empty, Chromium's error page ([`Page::status_of_last_navigation`] tells the
    /// status); a navigation without one (connection refused) is an `Err`, and so is a 401 with
    /// `WWW-Authenticate: Basic` (`net::ERR_INVALID_AUTH_CREDENTIALS`: headless asks no one).
    pub async fn goto(&self, url: &str) -> Result<(), String> {
        let mut changed = self.events.changed.subscribe();
        let navigated = self.call("Page.navigate", json!({ "url": url })).await?;
        let loader = navigated["loaderId"].as_str().map(str::to_owned);
        lock(&self.last_loader).clone_from(&loader);
        if let Some(error) = navigated["errorText"].as_str() {
            // An HTTP error status with an empty body: Chromium shows an error page of its
            // own, but the server did answer (its status is known), so that is no failure.
            let answered = loader
                .as_ref()
                .is_some_and(|l| lock(&self.events.state).statuses.contains_key(l));
            if !(answered && error == "net::ERR_HTTP_RESPONSE_CODE_FAILURE") {
                return Err(format!("goto {url}: {error}"));
            }
        }
        // A same-document navigation (only the #fragment changes) has no loader and no load.
        let Some(loader) = loader else { return Ok(()) };
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            {
                let state = lock(&self.events.state);
                if state.loaded.contains(&loader) {
                    return Ok(());
                }
                if state.gone {
                    return Err(format!("goto {url}: the connection to Chromium closed"));
                }
            }
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .is_err()
            {
                return Err(format!("goto {url}: no load event in {COMMAND_TIMEOUT:?}"));
            }
        }
    }

    /// The HTTP status of the document of the last [`Page::goto`], when it had one.
    pub fn status_of_last_navigation(&self) -> Option<u16> {
        let loader = lock(&self.last_loader).clone()?;
        lock(&self.events.state).statuses.get(&loader).copied()
    }

    async fn evaluate(&self, js: &str) -> Reply {
        let params = json!({
            "expression": js, "returnByValue": true, "awaitPromise": true, "userGesture": true,
        });
        let evaluated = self.call("Runtime.evaluate", params).await?;
        match evaluated.get("exceptionDetails") {
            Some(details) => Err(format!("{}: {}", exception_text(details), short(js))),
            None => Ok(evaluated["result"].clone()),
        }
    }

    /// The value of the JavaScript expression `js` (a promise is awaited), as JSON: `undefined`
    /// is `null`, `NaN`, `Infinity`, `-0` and bigints are strings ("NaN", "1n"), DOM nodes are
    /// `{}`. An exception in the page is an `Err` with its message.
    pub async fn eval(&self, js: &str) -> Result<Value, String> {
        Ok(value_of(&self.evaluate(js).await?))
    }

    /// Evaluates `predicate` every 50 ms until it is truthy; after `timeout`, an `Err` that
    /// names it and its last value (an exception counts as false: the element may not be there
    /// yet, or a navigation may be under way).
    pub async fn wait_until(&self, predicate: &str, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            // The last evaluation may end a little after the deadline, not much after.
            let budget = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_secs(1));
            let last = match tokio::time::timeout(budget, self.evaluate(predicate)).await {
                Ok(Ok(object)) if truthy(&object) => return Ok(()),
                Ok(Ok(object)) => value_of(&object).to_string(),
                Ok(Err(e)) => e,
                Err(_) => format!("no answer in {budget:?}"),
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let gone = lock(&self.events.state).gone;
            if gone || left.is_zero() {
                let why = match gone {
                    true => "cannot be evaluated: Chromium is gone".to_owned(),
                    false => format!("still false after {timeout:?}"),
                };
                return Err(format!("`{predicate}` {why}; last value: {last}"));
            }
            tokio::time::sleep(POLL.min(left)).await;
        }
    }

    /// The rendered text (`innerText`) of the first element that `selector` matches, `None`
    /// when none does. An assertion helper: panics when the page cannot be asked.
    pub async fn text(&self, selector: &str) -> Option<String> {
        let js = format!(
            "document.querySelector({})?.innerText ?? null",
            js_string(selector)
        );
        match self.eval(&js).await {
            Ok(text) => text.as_str().map(str::to_owned),
            Err(e) => panic!("the text of `{selector}`: {e}"),
        }
    }

    /// Runs `body` with `el`, the first element that `selector` matches; an `Err` when none.
    async fn with_element(&self, selector: &str, body: &str) -> Result<(), String> {
        let js = format!(
            "(() => {{ const el = document.querySelector({}); if (!el) return false; {body}; return true; }})()",
            js_string(selector)
        );
        match self.eval(&js).await? {
            Value::Bool(true) => Ok(()),
            _ => Err(format!("no element matches `{selector}`")),
        }
    }

    /// Clicks the first element that `selector` matches (`el.click()`: no pointer events, and a
    /// disabled button does nothing, as for a person).
    pub async fn click(&self, selector: &str) -> Result<(), String> {
        self.with_element(selector, "el.click()").await
    }

    /// Sets the `.value` of the first element that `selector` matches (an input, a textarea, a
    /// select), then dispatches `input` and `change` on it, as typing would.
    pub async fn set_value(&self, selector: &str, value: &str) -> Result<(), String> {
        let body = format!(
            "el.value = {}; for (const type of ['input', 'change']) el.dispatchEvent(new Event(type, {{ bubbles: true }}))",
            js_string(value)
        );
        self.with_element(selector, &body).await
    }

    /// Saves a PNG of the whole page (beyond the viewport when it is longer) to `path`.
    pub async fn screenshot_png(&self, path: impl AsRef<Path>) -> Result<(), String> {
        let metrics = self.call("Page.getLayoutMetrics", json!({})).await?;
        let size = &metrics["cssContentSize"];
        let params = match (size["width"].as_f64(), size["height"].as_f64()) {
            (Some(width), Some(height)) => json!({
                "format": "png", "captureBeyondViewport": true,
                "clip": { "x": 0, "y": 0, "width": width.ceil(), "height": height.ceil(), "scale": 1 },
            }),
            _ => json!({ "format": "png" }),
        };
        let shot = self.call("Page.captureScreenshot", params).await?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap_or_default())
            .map_err(|e| format!("Page.captureScreenshot: {e}"))?;
        let path = path.as_ref();
        std::fs::write(path, png).map_err(|e| format!("writing {}: {e}", path.display()))
    }

    /// Everything the page reported as an error so far: `console.error` and failed
    /// `console.assert` calls, uncaught exceptions, and the browser's own error entries
    /// (Content-Security-Policy violations, failed loads of scripts, styles, images, fetches).
    /// Not a document's own HTTP error status ([`Page::status_of_last_navigation`] tells it),
    /// nor a missing `/favicon.ico`. Chromium sends events in order with the answers: this has
    /// every event sent before the answer to the last command.
    pub fn console_errors(&self) -> Vec<String> {
        lock(&self.events.state).errors.clone()
    }

    /// The dialogs the page opened (`alert`, `confirm`, `prompt`, `beforeunload`), each as
    /// "type: message". Each was answered OK at once (a `prompt` with its default text).
    pub fn dialogs(&self) -> Vec<String> {
        lock(&self.events.state).dialogs.clone()
    }

    /// Sets a cookie for `url` (its host and path), as a `Set-Cookie` from there would.
    pub async fn set_cookie(&self, url: &str, name: &str, value: &str) -> Result<(), String> {
        let set = self
            .call(
                "Network.setCookie",
                json!({ "url": url, "name": name, "value": value }),
            )
            .await?;
        match set["success"] {
            Value::Bool(false) => Err(format!("Network.setCookie: {name} refused for {url}")),
            _ => Ok(()),
        }
    }

    /// Headers sent with every request of this page from now on (replacing those set before),
    /// such as `("Authorization", "Bearer …")`.
    pub async fn set_extra_headers(&self, headers: &[(&str, &str)]) -> Result<(), String> {
        let headers: serde_json::Map<String, Value> = headers
            .iter()
            .map(|(name, value)| ((*name).to_owned(), Value::from(*value)))
            .collect();
        self.call("Network.setExtraHTTPHeaders", json!({ "headers": headers }))
            .await?;
        Ok(())
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        lock(&self.conn.shared.pages).remove(&self.session);
        // Closes the tab without waiting: nobody waits for this id, its answer is dropped.
        let id = self.conn.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let close = json!({ "id": id, "method": "Target.closeTarget", "params": { "targetId": self.target } });
        let _ = self.conn.out.send(close.to_string());
    }
}

/// The start of a long script, for error messages.
fn short(js: &str) -> String {
    match js.char_indices().nth(200) {
        Some((end, _)) => format!("{}…", &js[..end]),
        None => js.to_owned(),
    }
}
