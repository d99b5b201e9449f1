//! Durable Tasks for MCP servers that have none: a gateway in front of them.
//!
//! A [`Gateway`] connects to upstream MCP servers ([`Upstream`]: Streamable HTTP of either
//! era, or a child process on stdio) and serves their tools through the runtime as a
//! [`ToolSource`]: `tools/list` is the upstreams' (names, descriptions, schemas,
//! annotations; with several upstreams each name gets the prefix `NAME_`), and a `tools/call`
//! from a client that declares the Tasks extension becomes a durable task — stored before its
//! handle returns, the upstream called from the task's actor. A call without the extension
//! passes through synchronously.
//!
//! During a task's call the upstream's progress becomes the task's `statusMessage`; its
//! `elicitation/create` (and `sampling/createMessage`, `roots/list`) becomes the task's
//! `input_required` with that request, and the client's `tasks/update` answer (checked
//! against the request) is the upstream's response; `tasks/cancel` is sent upstream as
//! `notifications/cancelled`. An upstream with Tasks (the `2026-07-28` extension, or the
//! `2025-11-25` experimental tasks for a tool that allows them) runs the call as its own
//! task: the gateway records the upstream's task id in the task's journal and follows it
//! (after a restart too, without calling again).
//!
//! **An upstream call cannot be resumed.** When the gateway stops (a crash, `kill -9`, a
//! deploy, a replica taking the task over) while a call is in flight or waits for input, the
//! task runs again from the start if the tool is declared idempotent
//! ([`Upstream::idempotent`], or its `idempotentHint` with [`Upstream::trust_annotations`]);
//! any other ends `failed`, its `statusMessage` saying that the gateway restarted during the
//! call and that it may or may not have taken effect. It is never left `working`.
//!
//! **Within a run, a broken connection is tried again.** A call whose request never reached
//! the upstream (connection refused, no connection yet, its process not running) is sent again
//! whatever the tool, with backoff, until [`Upstream::timeout`] has passed since the first
//! failure; a call whose connection broke after it was sent (the response stream broke, the
//! process exited) is sent again only for a tool declared idempotent, or when it follows a
//! recorded upstream task. Any other fails, naming the upstream and saying that the call may
//! or may not have taken effect. An upstream that goes away while the task waits for its
//! client's input ends the call at once, not when someone answers.
//!
//! ```no_run
//! use std::sync::Arc;
//! use mcp_tasks::Runtime;
//! use mcp_tasks::gateway::{Gateway, Upstream};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let gateway = Gateway::start(vec![
//!     Upstream::command("everything", "npx", ["-y", "@modelcontextprotocol/server-everything"])
//!         .idempotent("echo"),
//! ])?;
//! let runtime = Runtime::builder("gateway.redb").tool_source(gateway).start().await?;
//! # let _ = runtime; Ok(()) }
//! ```
//!
//! Metrics (see [`crate::telemetry`]): `mcp_tasks_upstream_calls_total`,
//! `mcp_tasks_upstream_errors_total` (by `kind`), `mcp_tasks_upstream_call_duration_seconds`
//! and `mcp_tasks_upstream_retries_total`, each by `upstream`; every call runs in a span `upstream call` with the upstream, the tool
//! and the task.

mod config;
mod error;
mod http;
mod link;
mod pool;
mod rounds;
mod stdio;
mod tool;
mod upstream;

pub use config::{
    DEFAULT_MAX_PROCESSES, DEFAULT_MAX_TOOLS, DEFAULT_MAX_TOOLS_BYTES, DEFAULT_STATE_TTL,
    DEFAULT_TIMEOUT, Upstream, UpstreamEra, UpstreamTransport,
};
pub use error::{GatewayError, UpstreamError};
/// The journal step recorded before an upstream is called (its value names the upstream:
/// `{"startedAtMs": …, "upstream": NAME}`; the console shows it).
#[cfg(feature = "console")]
pub(crate) use tool::CALL_STEP;
pub use upstream::upstream_flow_group;

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use tokio_util::sync::CancellationToken;

use crate::tool::{Tool, ToolDescriptor, ToolSet, ToolSource};
use tool::GatewayTool;
use upstream::UpstreamState;

use crate::telemetry::{UPSTREAM_CALL_DURATION, UPSTREAM_CALLS, UPSTREAM_ERRORS, UPSTREAM_RETRIES};

/// Upstream MCP servers whose tools the runtime serves as durable tasks; see the
/// [module docs](self). Register it with `RuntimeBuilder::tool_source`.
pub struct Gateway {
    upstreams: Vec<Arc<UpstreamState>>,
    tools: RwLock<Arc<ToolSet>>,
    stop: CancellationToken,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field(
                "upstreams",
                &self.upstreams.iter().map(|u| u.name()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Gateway {
    /// Checks the upstreams and starts connecting to each in the background (so it must run
    /// inside a tokio runtime). It does not wait for them: an upstream that is down now is
    /// tried again with backoff (up to every 30 s), and its tools appear once it answers.
    ///
    /// Refused: no upstream, two with one name, a name that is not 1 to 64 characters of
    /// `A-Z a-z 0-9 -` (with several upstreams the tools are named `NAME_tool`, so names
    /// without `_` keep two upstreams' tools apart), a URL or header HTTP cannot use, a zero
    /// timeout.
    pub fn start(upstreams: Vec<Upstream>) -> Result<Arc<Self>, GatewayError> {
        if upstreams.is_empty() {
            return Err(GatewayError::NoUpstream);
        }
        let mut names = BTreeSet::new();
        for u in &upstreams {
            u.check()?;
            if !names.insert(u.name.clone()) {
                return Err(GatewayError::Collision {
                    first: u.name.clone(),
                    second: u.name.clone(),
                    reason: "have the same name: each upstream needs its own".into(),
                });
            }
        }
        let prefixed = upstreams.len() > 1;
        let gateway = Arc::new(Self {
            upstreams: upstreams
                .into_iter()
                .map(|u| Arc::new(UpstreamState::new(u, prefixed)))
                .collect(),
            tools: RwLock::new(Arc::new(ToolSet::new())),
            stop: CancellationToken::new(),
        });
        for upstream in &gateway.upstreams {
            let weak = Arc::downgrade(&gateway);
            let stop = gateway.stop.child_token();
            tokio::spawn(upstream.clone().run(stop, move || {
                if let Some(g) = weak.upgrade() {
                    g.rebuild();
                }
            }));
        }
        Ok(gateway)
    }

    /// The upstreams' names, in the order given.
    pub fn upstreams(&self) -> Vec<&str> {
        self.upstreams.iter().map(|u| u.name()).collect()
    }

    /// Stops connecting; the upstream processes end. (Dropping the gateway does too.)
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Builds the tool set from every upstream's last listing. A tool the runtime cannot
    /// serve (a bad name or schema, a name listed twice) is left out with a warning.
    fn rebuild(&self) {
        // Held while building: two upstreams listing at once must not publish their sets in
        // the wrong order (the older one, without the other's tools, last).
        let mut current = self.tools.write().unwrap_or_else(|e| e.into_inner());
        let mut set = ToolSet::new();
        for upstream in &self.upstreams {
            for (descriptor, remote) in upstream.descriptors() {
                let name = descriptor.name.clone();
                let tool = Arc::new(GatewayTool {
                    descriptor,
                    upstream: upstream.clone(),
                    remote,
                });
                if let Err(e) = set.register(tool) {
                    tracing::warn!(upstream = %upstream.name(), tool = ?name, error = %e.to_string().escape_debug(), "upstream tool left out");
                }
            }
        }
        *current = Arc::new(set);
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl ToolSource for Gateway {
    fn current(&self) -> Arc<ToolSet> {
        self.tools.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A stored task of an upstream tool not listed now (its upstream is down, say) still
    /// runs: it waits for the upstream (up to its timeout) or fails naming it.
    fn recover(&self, name: &str) -> Option<Arc<dyn Tool>> {
        let upstream = self.upstreams.iter().find(|u| u.remote(name).is_some())?;
        let remote = upstream.remote(name)?.to_owned();
        // Never passivated, like every gateway tool (see `upstream::descriptor`): a task
        // resumed here follows its upstream call again, also while it waits for input.
        // In its upstream's flow group, as a listed tool is.
        let descriptor = ToolDescriptor::new(name, "")
            .stay_active_while_waiting()
            .flow_group(upstream_flow_group(upstream.name()));
        Some(Arc::new(GatewayTool {
            descriptor,
            upstream: upstream.clone(),
            remote,
        }))
    }

    /// A tool not listed whose upstream is down (not connected, or not listed yet): with one
    /// upstream any name, with several a name with the upstream's `NAME_` prefix.
    fn unavailable(&self, name: &str) -> Option<String> {
        self.upstream_of(name)?.down()
    }

    /// One line per upstream: `connected` (era, tool count) or `connecting` (last error).
    fn readiness(&self) -> Vec<String> {
        self.upstreams.iter().map(|u| u.readiness()).collect()
    }
}

impl Gateway {
    /// The upstream a tool `name` would be of: the only one, or the one whose `NAME_` prefix
    /// it has.
    fn upstream_of(&self, name: &str) -> Option<&Arc<UpstreamState>> {
        match self.upstreams.as_slice() {
            [only] => Some(only),
            several => several.iter().find(|u| u.remote(name).is_some()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(upstreams: Vec<Upstream>) -> String {
        Gateway::start(upstreams).unwrap_err().to_string()
    }

    #[test]
    fn bad_configurations_are_refused_before_anything_starts() {
        assert_eq!(refused(vec![]), "a gateway needs at least one upstream");
        let same = || Upstream::http("a", "http://127.0.0.1:1/mcp");
        assert!(refused(vec![same(), same()]).contains("have the same name"));
        for name in ["", "has_underscore", "sp ace", &"x".repeat(65)] {
            let e = refused(vec![Upstream::http(name, "http://127.0.0.1:1/mcp")]);
            assert!(
                e.contains("an upstream name is 1 to 64 characters"),
                "{name}: {e}"
            );
        }
        assert!(refused(vec![Upstream::http("a", "ftp://x/mcp")]).contains("scheme is `ftp`"));
        assert!(refused(vec![Upstream::http("a", "not a url")]).contains("does not parse"));
        assert!(
            refused(vec![Upstream::command("a", " ", Vec::<String>::new())])
                .contains("command is empty")
        );
        let bad_header = Upstream::http("a", "http://x/mcp").header("Bad Name", "v");
        assert!(refused(vec![bad_header]).contains("not an HTTP header name"));
        let bad_value = Upstream::http("a", "http://x/mcp").header("X-Key", "line\nbreak");
        let e = refused(vec![bad_value]);
        assert!(
            e.contains("cannot carry") && !e.contains("line"),
            "the value is not quoted: {e}"
        );
        let zero = Upstream::http("a", "http://x/mcp").timeout(std::time::Duration::ZERO);
        assert!(refused(vec![zero]).contains("timeout must be above 0"));
        let none = Upstream::command("a", "x", ["y"]).max_processes(0);
        assert!(refused(vec![none]).contains("at least 1 process"));
    }

    #[tokio::test]
    async fn a_down_upstream_says_so_for_its_tools_and_in_its_readiness() {
        // One upstream: any tool not listed while it is down.
        let one = Gateway::start(vec![Upstream::http("solo", "http://127.0.0.1:1/mcp")]).unwrap();
        // Several: by the NAME_ prefix.
        let two = Gateway::start(vec![
            Upstream::http("a", "http://127.0.0.1:1/mcp"),
            Upstream::http("b", "http://127.0.0.1:1/mcp"),
        ])
        .unwrap();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        // The first attempts fail at once (nothing listens on port 1): their reason is kept.
        while !one
            .unavailable("anything")
            .unwrap()
            .contains("last failed with")
            || !two.unavailable("b_x").unwrap().contains("last failed with")
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{:?}",
                one.readiness()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let why = one.unavailable("anything").unwrap();
        assert!(
            why.starts_with(
                "upstream `solo` is down (it last failed with: upstream `solo` is unreachable:"
            ),
            "{why}"
        );
        assert!(!why.contains("127.0.0.1"), "no URL: {why}");
        assert!(
            two.unavailable("b_x")
                .unwrap()
                .starts_with("upstream `b` is down")
        );
        assert!(
            two.unavailable("a_x")
                .unwrap()
                .starts_with("upstream `a` is down")
        );
        assert_eq!(
            two.unavailable("c_x"),
            None,
            "no upstream c: an unknown tool"
        );
        let lines = two.readiness();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].starts_with("upstream a: connecting, last error: upstream `a` is unreachable"),
            "{lines:?}"
        );
        one.stop();
        two.stop();
    }

    #[tokio::test]
    async fn an_idempotent_name_no_upstream_lists_is_reported_once() {
        let gateway = Gateway::start(vec![
            Upstream::http("a", "http://127.0.0.1:1/mcp")
                .idempotent("read")
                .idempotent("raed"),
        ])
        .unwrap();
        let listing = [
            serde_json::json!({ "name": "read" }),
            serde_json::json!({ "name": "write" }),
        ];
        let upstream = &gateway.upstreams[0];
        assert_eq!(upstream.newly_unlisted_idempotent(&listing), ["raed"]);
        assert!(
            upstream.newly_unlisted_idempotent(&listing).is_empty(),
            "reported once, not at every listing"
        );
        gateway.stop();
    }

    #[tokio::test]
    async fn several_upstreams_prefix_their_tools_and_recover_by_prefix() {
        let gateway = Gateway::start(vec![
            Upstream::http("a", "http://127.0.0.1:1/mcp"),
            Upstream::http("b-2", "http://127.0.0.1:1/mcp").idempotent("b-2_x"),
        ])
        .unwrap();
        assert_eq!(gateway.upstreams(), ["a", "b-2"]);
        // Nothing listed (both are down), but a stored task of either still has a tool.
        assert!(gateway.current().is_empty());
        let tool = gateway.recover("b-2_x").expect("b-2's tool");
        assert_eq!(tool.descriptor().name, "b-2_x");
        assert_eq!(
            tool.descriptor().flow_group.as_deref(),
            Some("upstream:b-2"),
            "in its upstream's flow group (--upstream-max-running)"
        );
        assert!(
            gateway.upstreams[1].idempotent("x"),
            "named with its prefix"
        );
        assert!(!gateway.upstreams[0].idempotent("x"));
        assert!(gateway.recover("c_x").is_none(), "no upstream c");
        assert_eq!(gateway.upstreams[0].remote("a_tool"), Some("tool"));
        gateway.stop();
    }
}
