//! One upstream's life in the gateway: connected (again) with backoff, its tool list fetched
//! at each connection and on `notifications/tools/list_changed`, its tools' descriptors.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::config::{Upstream, UpstreamTransport};
use super::error::UpstreamError;
use super::http::HttpLink;
use super::link::Link;
use super::stdio::StdioPool;
use crate::tool::{TaskPolicy, ToolDescriptor};

/// First wait before connecting again; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// The longest wait between two connection attempts while no call waits for the upstream.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The longest wait between two connection attempts while a call waits for the upstream.
const WANTED_BACKOFF: Duration = Duration::from_secs(1);
/// A connection that lasted this long starts the backoff over at [`FIRST_BACKOFF`].
const STABLE: Duration = Duration::from_secs(10);

/// The shortest time between two listings of an upstream's tools.
const RELIST_INTERVAL: Duration = Duration::from_secs(1);

/// The most bytes of an upstream's last error kept (for `/readyz` and the error of a call).
const MAX_LAST_ERROR: usize = 512;

/// One upstream: its configuration, its current connection, its listed tools.
pub(crate) struct UpstreamState {
    pub(crate) config: Upstream,
    /// `NAME_` when the gateway has several upstreams.
    pub(crate) prefix: Option<String>,
    link: watch::Sender<Option<Arc<dyn Link>>>,
    /// The tools as the upstream listed them last (its names).
    listed: Mutex<Vec<Value>>,
    refresh: Arc<Notify>,
    /// The `--upstream-idempotent` names already reported as not listed.
    unlisted_reported: Mutex<std::collections::BTreeSet<String>>,
    /// Calls waiting for a connection ([`Self::connected_by`]): while there are any, the
    /// reconnecting loop waits at most [`WANTED_BACKOFF`] between attempts.
    waiting: AtomicUsize,
    /// Told when a call starts waiting for a connection.
    wanted: Notify,
    /// Why the last attempt to connect (or to list the tools) failed, until one succeeds.
    last_error: Mutex<Option<String>>,
}

impl UpstreamState {
    pub(crate) fn new(config: Upstream, prefixed: bool) -> Self {
        let prefix = prefixed.then(|| format!("{}_", config.name));
        Self {
            config,
            prefix,
            link: watch::channel(None).0,
            listed: Mutex::new(Vec::new()),
            refresh: Arc::new(Notify::new()),
            unlisted_reported: Mutex::new(std::collections::BTreeSet::new()),
            waiting: AtomicUsize::new(0),
            wanted: Notify::new(),
            last_error: Mutex::new(None),
        }
    }

    fn set_last_error(&self, error: Option<String>) {
        // An upstream's own error message is kept short.
        let error = error.map(|mut e| {
            if e.len() > MAX_LAST_ERROR {
                let mut cut = MAX_LAST_ERROR;
                while !e.is_char_boundary(cut) {
                    cut -= 1;
                }
                e.truncate(cut);
                e.push('…');
            }
            e
        });
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = error;
    }

    /// Whether calls go through now: connected, its tools listed.
    pub(crate) fn is_connected(&self) -> bool {
        self.link.borrow().is_some()
    }

    /// Why its tools cannot be called now, when it is not connected: the message a client
    /// calling one gets instead of "Unknown tool".
    pub(crate) fn down(&self) -> Option<String> {
        if self.is_connected() {
            return None;
        }
        let last = self
            .last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Some(match last {
            Some(e) => format!(
                "upstream `{}` is down (it last failed with: {e}); the gateway keeps connecting and lists its tools once it answers",
                self.name()
            ),
            None => format!(
                "upstream `{}` is down (not connected yet); the gateway keeps connecting and lists its tools once it answers",
                self.name()
            ),
        })
    }

    /// One line on its state for the readiness probe: `connected` with its era and tool
    /// count, or `connecting` with its last error.
    pub(crate) fn readiness(&self) -> String {
        let link = self.link.borrow().clone();
        match link {
            Some(link) => {
                let tools = self.listed.lock().unwrap_or_else(|e| e.into_inner()).len();
                format!(
                    "upstream {}: connected, era {}, {tools} tools",
                    self.name(),
                    link.era()
                )
            }
            None => {
                let last = self
                    .last_error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                match last {
                    Some(e) => format!(
                        "upstream {}: connecting, last error: {}",
                        self.name(),
                        e.escape_debug()
                    ),
                    None => format!("upstream {}: connecting", self.name()),
                }
            }
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.config.name
    }

    /// The name the gateway lists for the upstream's tool `remote`.
    pub(crate) fn exposed(&self, remote: &str) -> String {
        match &self.prefix {
            Some(p) => format!("{p}{remote}"),
            None => remote.to_owned(),
        }
    }

    /// The upstream's name for the gateway's tool `exposed`, if it is one of this upstream's.
    pub(crate) fn remote<'a>(&self, exposed: &'a str) -> Option<&'a str> {
        match &self.prefix {
            Some(p) => exposed.strip_prefix(p.as_str()),
            None => Some(exposed),
        }
    }

    /// Descriptors of the listed tools, under the gateway's names.
    pub(crate) fn descriptors(&self) -> Vec<(ToolDescriptor, String)> {
        let listed = self.listed.lock().unwrap_or_else(|e| e.into_inner());
        listed
            .iter()
            .filter_map(|tool| {
                let remote = tool.get("name")?.as_str()?.to_owned();
                let descriptor = descriptor(&self.exposed(&remote), tool)
                    .flow_group(upstream_flow_group(self.name()));
                Some((descriptor, remote))
            })
            .collect()
    }

    /// The names given as idempotent for this upstream that `tools` (a listing) does not
    /// have, under either name, and that were not reported before (each is reported once).
    pub(crate) fn newly_unlisted_idempotent(&self, tools: &[Value]) -> Vec<String> {
        let listed: Vec<&str> = tools
            .iter()
            .filter_map(|t| t.get("name").and_then(Value::as_str))
            .collect();
        let mut reported = self
            .unlisted_reported
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.config
            .idempotent
            .iter()
            .filter(|name| {
                !listed
                    .iter()
                    .any(|remote| *remote == name.as_str() || self.exposed(remote) == **name)
            })
            .filter(|name| reported.insert((*name).clone()))
            .cloned()
            .collect()
    }

    /// Whether a call of the upstream's tool `remote` may run twice.
    pub(crate) fn idempotent(&self, remote: &str) -> bool {
        if self.config.idempotent.contains(remote)
            || self.config.idempotent.contains(&self.exposed(remote))
        {
            return true;
        }
        // In MCP's tool annotations a read-only tool is safe to repeat whatever its
        // `idempotentHint` (which only means something for a tool that is not read-only).
        self.config.trust_annotations && {
            let listed = self.listed.lock().unwrap_or_else(|e| e.into_inner());
            listed.iter().any(|t| {
                t.get("name").and_then(Value::as_str) == Some(remote)
                    && (t.pointer("/annotations/readOnlyHint") == Some(&json!(true))
                        || t.pointer("/annotations/idempotentHint") == Some(&json!(true)))
            })
        }
    }

    /// The `execution.taskSupport` the upstream listed for its tool `remote`, if any.
    pub(crate) fn task_support(&self, remote: &str) -> Option<String> {
        let listed = self.listed.lock().unwrap_or_else(|e| e.into_inner());
        listed
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some(remote))
            .and_then(|t| t.pointer("/execution/taskSupport"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    /// The current connection, if there is one and it is not closed.
    pub(crate) fn link_now(&self) -> Option<Arc<dyn Link>> {
        self.link.borrow().as_ref().filter(|l| usable(l)).cloned()
    }

    /// A connection, waiting for one until `deadline` (a closed one is not taken: the
    /// reconnecting loop replaces it). While a call waits, the loop tries at least every
    /// [`WANTED_BACKOFF`].
    pub(crate) async fn connected_by(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<Arc<dyn Link>, UpstreamError> {
        if let Some(link) = self.link_now() {
            return Ok(link);
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _waiting = Waiting(&self.waiting);
        self.wanted.notify_one();
        let mut rx = self.link.subscribe();
        let wait = rx.wait_for(|l| l.as_ref().is_some_and(usable));
        let found = match tokio::time::timeout_at(deadline, wait).await {
            Ok(Ok(link)) => link.clone(),
            _ => None,
        };
        found.ok_or_else(|| UpstreamError::NotSent {
            upstream: self.config.name.clone(),
            reason: "not connected (the gateway keeps trying in the background)".into(),
        })
    }

    /// Waits `backoff` before the next connection attempt, less when a call waits for the
    /// upstream (at most [`WANTED_BACKOFF`]); `false` when `stop` came first.
    async fn pause(&self, backoff: Duration, stop: &CancellationToken) -> bool {
        let start = tokio::time::Instant::now();
        let wanted = async {
            if self.waiting.load(Ordering::SeqCst) == 0 {
                self.wanted.notified().await;
            }
            tokio::time::sleep_until(start + backoff.min(WANTED_BACKOFF)).await;
        };
        tokio::select! {
            () = tokio::time::sleep(backoff) => true,
            () = wanted => true,
            () = stop.cancelled() => false,
        }
    }

    async fn connect(&self) -> Result<Arc<dyn Link>, UpstreamError> {
        Ok(match &self.config.transport {
            UpstreamTransport::Http { url } => {
                HttpLink::connect(&self.config, url, self.refresh.clone()).await?
            }
            UpstreamTransport::Command { program, args } => {
                StdioPool::connect(&self.config, program, args, self.refresh.clone()).await?
            }
        })
    }

    /// Connects, lists, follows list changes, and connects again when the connection goes,
    /// until `stop`. `changed` runs whenever the listed tools change.
    pub(crate) async fn run(self: Arc<Self>, stop: CancellationToken, changed: impl Fn()) {
        let mut backoff = FIRST_BACKOFF;
        loop {
            let connected = tokio::select! {
                c = self.connect() => c,
                () = stop.cancelled() => return,
            };
            let link = match connected {
                Ok(link) => link,
                Err(e) => {
                    metrics::counter!(super::UPSTREAM_ERRORS, "upstream" => self.config.name.clone(), "kind" => e.kind()).increment(1);
                    // Kept before it is logged: whoever reads the log line finds it in
                    // `/readyz` and in a call's error.
                    self.set_last_error(Some(e.to_string()));
                    tracing::warn!(upstream = %self.config.name, error = %e.to_string().escape_debug(), retry_in_ms = backoff.as_millis() as u64, "upstream not available");
                    if !self.pause(backoff, &stop).await {
                        return;
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            };
            let up_since = tokio::time::Instant::now();
            let limits = super::link::ListLimits {
                tools: self.config.max_tools,
                bytes: self.config.max_tools_bytes,
            };
            loop {
                let listed_at = tokio::time::Instant::now();
                match link.list_tools(limits).await {
                    Ok(tools) => {
                        tracing::info!(upstream = %self.config.name, tools = tools.len(), "upstream tools listed");
                        for name in self.newly_unlisted_idempotent(&tools) {
                            tracing::warn!(upstream = %self.config.name, tool = %name.escape_debug(),
                                "--upstream-idempotent names a tool this upstream does not list (a typo?): calls of it are not repeated after a crash");
                        }
                        *self.listed.lock().unwrap_or_else(|e| e.into_inner()) = tools;
                        self.set_last_error(None);
                        changed();
                        // Calls go through a connection once its tools are known (their
                        // annotations and task support).
                        if self.link.borrow().is_none() {
                            self.link.send_replace(Some(link.clone()));
                        }
                    }
                    Err(e @ UpstreamError::TooManyTools { .. }) => {
                        // The connection works; its list is refused and the previous kept.
                        metrics::counter!(super::UPSTREAM_ERRORS, "upstream" => self.config.name.clone(), "kind" => e.kind()).increment(1);
                        tracing::warn!(upstream = %self.config.name, error = %e, "tool list refused; keeping the previous one");
                    }
                    Err(e) => {
                        // A connection that cannot list its tools is of no use: a new one.
                        self.set_last_error(Some(e.to_string()));
                        tracing::warn!(upstream = %self.config.name, error = %e.to_string().escape_debug(), "cannot list the upstream's tools");
                        break;
                    }
                }
                tokio::select! {
                    () = self.refresh.notified() => {}
                    () = link.closed() => break,
                    () = stop.cancelled() => return,
                }
                // At most one listing per RELIST_INTERVAL: a flood of `list_changed`
                // notifications costs one more listing, not one each.
                tokio::select! {
                    () = tokio::time::sleep_until(listed_at + RELIST_INTERVAL) => {}
                    () = link.closed() => break,
                    () = stop.cancelled() => return,
                }
            }
            self.link.send_replace(None);
            if self
                .last_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_none()
            {
                self.set_last_error(Some(format!(
                    "upstream `{}`: the connection was lost",
                    self.name()
                )));
            }
            // A connection that lasted resets the backoff (an upstream restarted after a
            // while is tried again soon); one that died at once does not.
            if up_since.elapsed() > STABLE {
                backoff = FIRST_BACKOFF;
            }
            tracing::warn!(upstream = %self.config.name, retry_in_ms = backoff.as_millis() as u64, "upstream connection lost; connecting again");
            if !self.pause(backoff, &stop).await {
                return;
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

/// Whether a connection can take calls (not closed).
fn usable(link: &Arc<dyn Link>) -> bool {
    link.closed().now_or_never().is_none()
}

/// The flow group of upstream `name`'s tools (`serve --upstream-max-running NAME=N` limits it).
pub fn upstream_flow_group(name: &str) -> String {
    format!("upstream:{name}")
}

/// The gateway's descriptor of an upstream tool: its title, description, schemas and
/// annotations as listed; a task when the client declares the Tasks extension, and only then
/// when the upstream requires a task-augmented call (`execution.taskSupport: "required"`).
pub(crate) fn descriptor(exposed: &str, tool: &Value) -> ToolDescriptor {
    let text = |k: &str| tool.get(k).and_then(Value::as_str).map(str::to_owned);
    let input_schema = match tool.get("inputSchema") {
        Some(s @ Value::Object(_)) => s.clone(),
        _ => json!({ "type": "object" }),
    };
    ToolDescriptor {
        name: exposed.to_owned(),
        title: text("title"),
        description: text("description").unwrap_or_default(),
        input_schema,
        output_schema: tool.get("outputSchema").filter(|s| s.is_object()).cloned(),
        annotations: tool.get("annotations").filter(|a| a.is_object()).cloned(),
        task_policy: match tool
            .pointer("/execution/taskSupport")
            .and_then(Value::as_str)
        {
            Some("required") => TaskPolicy::Always,
            _ => TaskPolicy::WhenSupported,
        },
        ttl_ms: None,
        initial_status_message: None,
        max_running: None,
        flow_group: None,
        // While its task waits for the client's input, a gateway tool holds the upstream's
        // side of the call (a session-era request still open, an upstream task it follows):
        // dropping it would lose or repeat the upstream call.
        passivate: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_waiting_for_the_upstream_shortens_the_reconnect_backoff() {
        let up = Arc::new(UpstreamState::new(
            Upstream::http("up", "http://127.0.0.1:1/mcp"),
            false,
        ));
        let stop = CancellationToken::new();
        // Nobody waits: the whole backoff.
        let start = tokio::time::Instant::now();
        assert!(up.pause(Duration::from_secs(30), &stop).await);
        assert_eq!(start.elapsed(), Duration::from_secs(30));
        // A call starts waiting 5 s into a pause: the next attempt comes then.
        let waiter = up.clone();
        let call = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            waiter.connected_by(deadline).await.map(drop)
        });
        let start = tokio::time::Instant::now();
        assert!(up.pause(Duration::from_secs(30), &stop).await);
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        // While it waits, at most WANTED_BACKOFF between attempts.
        let start = tokio::time::Instant::now();
        assert!(up.pause(Duration::from_secs(30), &stop).await);
        assert_eq!(start.elapsed(), WANTED_BACKOFF);
        // Nothing connects here: the call gives up at its deadline, saying it never went.
        let e = call.await.unwrap().unwrap_err();
        assert!(matches!(e, UpstreamError::NotSent { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "upstream `up` is unreachable: not connected (the gateway keeps trying in the background)"
        );
        assert_eq!(up.waiting.load(Ordering::SeqCst), 0);
        // A pause ends when the gateway stops.
        stop.cancel();
        assert!(!up.pause(Duration::from_secs(30), &stop).await);
    }
}
