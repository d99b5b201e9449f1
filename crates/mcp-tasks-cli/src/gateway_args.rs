//! `serve --upstream …`: the gateway's options and how they become
//! [`mcp_tasks::gateway::Upstream`]s.

use std::time::Duration;

use clap::Args;
use mcp_tasks::gateway::{Upstream, UpstreamEra};
use mcp_tasks::units;

/// Serve the tools of other MCP servers as durable tasks (docs/GATEWAY.md).
#[derive(Args, Default)]
#[command(next_help_heading = "Gateway")]
pub(crate) struct GatewayArgs {
    /// An upstream MCP server on Streamable HTTP, `[NAME=]URL` (repeatable): its tools are
    /// served as durable tasks instead of the demo's tool. Either era: 2026-07-28, or
    /// 2025-11-25 with a session. With several upstreams each tool is named `NAME_tool`.
    #[arg(
        long = "upstream",
        env = "MCP_TASKS_UPSTREAM",
        value_delimiter = ',',
        value_name = "[NAME=]URL"
    )]
    pub(crate) http: Vec<String>,
    /// An upstream MCP server on stdio, `[NAME=]COMMAND ARGS…` split like a shell would
    /// (repeatable): spawned by the gateway, restarted with backoff when it exits, its stderr
    /// in the log.
    #[arg(
        long = "upstream-command",
        env = "MCP_TASKS_UPSTREAM_COMMAND",
        value_name = "[NAME=]COMMAND"
    )]
    pub(crate) command: Vec<String>,
    /// A header sent to an HTTP upstream, `[UPSTREAM=]NAME: VALUE` (repeatable; the upstream
    /// may be left out when there is one). A VALUE of `env:VAR` is read from the environment
    /// variable VAR. Values are never logged.
    #[arg(
        long = "upstream-header",
        env = "MCP_TASKS_UPSTREAM_HEADER",
        value_name = "[UPSTREAM=]NAME: VALUE"
    )]
    pub(crate) headers: Vec<String>,
    /// An environment variable of every stdio upstream, `NAME=VALUE`, or `NAME` to pass the
    /// gateway's own (repeatable). Besides these a stdio upstream gets only HOME, LOGNAME,
    /// PATH, SHELL, TERM, USER, LANG, LC_ALL, TMPDIR and TZ from the gateway's environment.
    #[arg(
        long = "upstream-env",
        env = "MCP_TASKS_UPSTREAM_ENV",
        value_name = "NAME[=VALUE]"
    )]
    pub(crate) env: Vec<String>,
    /// How long to wait for an upstream that says nothing (no response, progress or
    /// request); a call that waits longer fails. Time a task waits for its client's input
    /// does not count. Also how long a call waits for an upstream that is down or
    /// restarting, trying again, from the first refused or broken connection.
    #[arg(long = "upstream-timeout", env = "MCP_TASKS_UPSTREAM_TIMEOUT", value_name = "DURATION", default_value = "5m", value_parser = units::parse_duration)]
    pub(crate) timeout: Duration,
    /// How many processes each stdio upstream may run at once: one per call in flight (stdio
    /// cannot say which call a server's request is about). A call that finds every running
    /// process busy waits about as long as a call takes (2–250 ms) for one to be free, then
    /// has another started in the background and takes whichever comes first; past the limit
    /// it waits for one (calls waiting for a client's answer hold theirs).
    #[arg(long = "upstream-processes", env = "MCP_TASKS_UPSTREAM_PROCESSES", value_name = "N", default_value_t = mcp_tasks::gateway::DEFAULT_MAX_PROCESSES)]
    pub(crate) processes: usize,
    /// The most tools one upstream may list. A larger list is refused and logged, and the
    /// upstream's previous list kept.
    #[arg(long = "upstream-max-tools", env = "MCP_TASKS_UPSTREAM_MAX_TOOLS", value_name = "N", default_value_t = mcp_tasks::gateway::DEFAULT_MAX_TOOLS)]
    pub(crate) max_tools: usize,
    /// The most bytes one upstream's tool list may take as JSON, like --upstream-max-tools.
    #[arg(long = "upstream-max-tools-bytes", env = "MCP_TASKS_UPSTREAM_MAX_TOOLS_BYTES", value_name = "SIZE", default_value = "16MiB", value_parser = units::parse_size_usize)]
    pub(crate) max_tools_bytes: usize,
    /// A tool that is safe to call twice (repeatable), named as `tools/list` shows it: a call
    /// in flight when the gateway stopped runs again from the start afterwards, and one whose
    /// upstream connection broke is sent again (within --upstream-timeout). Any other such
    /// call ends `failed`.
    #[arg(
        long = "upstream-idempotent",
        env = "MCP_TASKS_UPSTREAM_IDEMPOTENT",
        value_delimiter = ',',
        value_name = "TOOL"
    )]
    pub(crate) idempotent: Vec<String>,
    /// Take an upstream tool's `readOnlyHint: true` or `idempotentHint: true` as
    /// --upstream-idempotent (an upstream's annotations are its own claims, not trusted by
    /// default).
    #[arg(
        long = "trust-upstream-annotations",
        env = "MCP_TASKS_TRUST_UPSTREAM_ANNOTATIONS"
    )]
    pub(crate) trust_annotations: bool,
    /// The MCP revision spoken to an HTTP upstream, `[UPSTREAM=]ERA` (repeatable; without
    /// `UPSTREAM=` for every one): `auto` (the default: 2026-07-28 when it answers
    /// `server/discover`, else 2025-11-25, and a tool of a dual-era server that asks for input
    /// with a server-initiated request, like FastMCP's `ctx.elicit()`, called in a 2025-11-25
    /// session), `2026-07-28` or `2025-11-25`.
    #[arg(
        long = "upstream-era",
        env = "MCP_TASKS_UPSTREAM_ERA",
        value_delimiter = ',',
        value_name = "[UPSTREAM=]ERA"
    )]
    pub(crate) era: Vec<String>,
    /// How long a 2026-07-28 upstream keeps the `requestState` of an input round,
    /// `[UPSTREAM=]DURATION` or `[UPSTREAM=]none` (repeatable; default 10m, the MCP Python
    /// SDK's and FastMCP's). A task waiting for such an input says until when, and fails then.
    #[arg(
        long = "upstream-state-ttl",
        env = "MCP_TASKS_UPSTREAM_STATE_TTL",
        value_delimiter = ',',
        value_name = "[UPSTREAM=]DURATION"
    )]
    pub(crate) state_ttl: Vec<String>,
}

impl GatewayArgs {
    /// Whether any upstream is configured.
    pub(crate) fn is_set(&self) -> bool {
        !self.http.is_empty() || !self.command.is_empty()
    }

    /// The upstreams, or a message saying which option is wrong.
    pub(crate) fn upstreams(&self) -> Result<Vec<Upstream>, String> {
        self.upstreams_with(|var| std::env::var(var).ok())
    }

    fn upstreams_with(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Vec<Upstream>, String> {
        let total = self.http.len() + self.command.len();
        let mut upstreams = Vec::new();
        for (i, spec) in self.http.iter().enumerate() {
            let (name, url) = split_name(spec, || default_name(total, "upstream", i));
            if url.is_empty() {
                return Err(format!("--upstream {name}: no URL"));
            }
            upstreams.push(Upstream::http(name, url));
        }
        for (i, spec) in self.command.iter().enumerate() {
            let (name, command) = split_name(spec, || default_name(total, "command", i));
            // The command is never echoed: its arguments may hold secrets.
            let words = shlex::split(command).ok_or_else(|| {
                format!("--upstream-command {name}=…: unbalanced quotes in the command")
            })?;
            let Some((program, args)) = words.split_first() else {
                return Err(format!("--upstream-command {name}=: no command"));
            };
            upstreams.push(Upstream::command(name, program, args));
        }
        for spec in &self.headers {
            let (target, header) = match spec.split_once(':') {
                Some((before, _)) if before.contains('=') => {
                    let (u, h) = spec.split_once('=').expect("has =");
                    (Some(u.trim()), h)
                }
                _ => (None, spec.as_str()),
            };
            let (name, value) = header.split_once(':').ok_or_else(|| {
                "--upstream-header: expected `NAME: VALUE` (or `UPSTREAM=NAME: VALUE`)".to_owned()
            })?;
            let (name, value) = (name.trim(), value.trim());
            let value = match value.strip_prefix("env:") {
                Some(var) => env(var).ok_or_else(|| {
                    format!("--upstream-header {name}: the environment variable {var} is not set")
                })?,
                None => value.to_owned(),
            };
            let index = match target {
                Some(t) => upstreams
                    .iter()
                    .position(|u| u.name() == t)
                    .ok_or_else(|| format!("--upstream-header {name}: no upstream named `{t}`"))?,
                None if upstreams.len() == 1 => 0,
                None => {
                    return Err(format!(
                        "--upstream-header {name}: with several upstreams, say which: `UPSTREAM={name}: …`"
                    ));
                }
            };
            let u = upstreams.remove(index);
            upstreams.insert(index, u.header(name, value));
        }
        for tool in &self.idempotent {
            let index = if upstreams.len() == 1 {
                0
            } else {
                upstreams
                    .iter()
                    .position(|u| tool.starts_with(&format!("{}_", u.name())))
                    .ok_or_else(|| {
                        format!(
                            "--upstream-idempotent {tool}: with several upstreams, name the tool as tools/list shows it (`UPSTREAM_tool`)"
                        )
                    })?
            };
            let u = upstreams.remove(index);
            upstreams.insert(index, u.idempotent(tool));
        }
        for spec in &self.env {
            let (name, value) = match spec.split_once('=') {
                Some((n, v)) => (n.trim(), v.to_owned()),
                None => (
                    spec.trim(),
                    env(spec.trim()).ok_or_else(|| {
                        format!(
                            "--upstream-env {spec}: the gateway has no such environment variable"
                        )
                    })?,
                ),
            };
            if name.is_empty() {
                // Not the spec: its value may be a secret.
                return Err("--upstream-env =…: no variable name before `=`".to_owned());
            }
            upstreams = upstreams
                .into_iter()
                .map(|u| u.env(name, value.clone()))
                .collect();
        }
        for spec in &self.era {
            let (target, value) = per_upstream(spec);
            let era: UpstreamEra = value
                .parse()
                .map_err(|e| format!("--upstream-era {spec}: {e}"))?;
            for u in targets(&mut upstreams, target, "--upstream-era", spec)? {
                *u = u.clone().era(era);
            }
        }
        for spec in &self.state_ttl {
            let (target, value) = per_upstream(spec);
            let ttl = match value {
                "none" => None,
                v => Some(
                    units::parse_duration(v)
                        .map_err(|e| format!("--upstream-state-ttl {spec}: {e}"))?,
                ),
            };
            for u in targets(&mut upstreams, target, "--upstream-state-ttl", spec)? {
                *u = u.clone().state_ttl(ttl);
            }
        }
        Ok(upstreams
            .into_iter()
            .map(|u| {
                u.timeout(self.timeout)
                    .trust_annotations(self.trust_annotations)
                    .max_processes(self.processes)
                    .max_tools(self.max_tools, self.max_tools_bytes)
            })
            .collect())
    }
}

/// `NAME=REST` when the text before the first `=` is a plausible upstream name (not part of
/// a URL or command), else the default name and the whole text.
fn split_name(spec: &str, default: impl FnOnce() -> String) -> (String, &str) {
    if let Some((name, rest)) = spec.split_once('=')
        && !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return (name.to_owned(), rest.trim());
    }
    (default(), spec.trim())
}

/// `(Some(UPSTREAM), VALUE)` for `UPSTREAM=VALUE`, `(None, VALUE)` for a bare value.
fn per_upstream(spec: &str) -> (Option<&str>, &str) {
    match spec.split_once('=') {
        Some((name, value)) => (Some(name.trim()), value.trim()),
        None => (None, spec.trim()),
    }
}

/// The upstreams an option applies to: the one it names, or every one.
fn targets<'a>(
    upstreams: &'a mut [Upstream],
    target: Option<&str>,
    option: &str,
    spec: &str,
) -> Result<Vec<&'a mut Upstream>, String> {
    match target {
        None => Ok(upstreams.iter_mut().collect()),
        Some(t) => {
            let found: Vec<&mut Upstream> =
                upstreams.iter_mut().filter(|u| u.name() == t).collect();
            if found.is_empty() {
                return Err(format!("{option} {spec}: no upstream named `{t}`"));
            }
            Ok(found)
        }
    }
}

/// `upstream` for a lone upstream; `upstream1`, `command2`, … when there are several.
fn default_name(total: usize, kind: &str, index: usize) -> String {
    if total == 1 {
        "upstream".to_owned()
    } else {
        format!("{kind}{}", index + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_tasks::gateway::UpstreamTransport;

    fn args() -> GatewayArgs {
        GatewayArgs {
            timeout: Duration::from_secs(300),
            processes: 4,
            max_tools: 10_000,
            max_tools_bytes: 16 << 20,
            ..Default::default()
        }
    }

    #[test]
    fn eras_and_state_lifetimes_apply_to_the_named_upstream_or_to_all() {
        let mut a = args();
        a.http = vec![
            "fm=http://127.0.0.1:8000/mcp".into(),
            "py=http://127.0.0.1:8001/mcp".into(),
        ];
        a.era = vec!["fm=2025-11-25".into()];
        a.state_ttl = vec!["none".into(), "py=90s".into()];
        let ups = a.upstreams_with(|_| None).unwrap();
        let debug = format!("{ups:?}");
        assert!(debug.contains("era: Session, state_ttl: None"), "{debug}");
        assert!(debug.contains("era: Auto, state_ttl: Some(90s)"), "{debug}");
        a.era = vec!["fm=2026".into()];
        assert!(
            a.upstreams_with(|_| None)
                .unwrap_err()
                .contains("--upstream-era fm=2026: unknown era `2026`")
        );
        a.era = vec!["nope=auto".into()];
        assert_eq!(
            a.upstreams_with(|_| None).unwrap_err(),
            "--upstream-era nope=auto: no upstream named `nope`"
        );
        a.era = Vec::new();
        a.state_ttl = vec!["py=soon".into()];
        assert!(
            a.upstreams_with(|_| None)
                .unwrap_err()
                .starts_with("--upstream-state-ttl py=soon: ")
        );
    }

    #[test]
    fn names_commands_headers_and_idempotent_tools_are_read() {
        let mut a = args();
        a.http = vec!["search=http://127.0.0.1:3001/mcp".into()];
        a.command = vec!["everything=node 'my dir/index.js' stdio".into()];
        a.headers = vec!["search=Authorization: env:TOKEN".into()];
        a.idempotent = vec!["everything_echo".into()];
        let ups = a
            .upstreams_with(|v| (v == "TOKEN").then(|| "Bearer s3cret".to_owned()))
            .unwrap();
        assert_eq!(ups[0].name(), "search");
        assert!(
            matches!(ups[0].transport(), UpstreamTransport::Http { url } if url == "http://127.0.0.1:3001/mcp")
        );
        assert!(
            matches!(ups[1].transport(), UpstreamTransport::Command { program, args }
            if program == "node" && args == &["my dir/index.js".to_owned(), "stdio".to_owned()])
        );
        assert!(!format!("{ups:?}").contains("s3cret"));
    }

    #[test]
    fn mistakes_are_named() {
        let mut a = args();
        a.http = vec!["http://a/mcp".into(), "http://b/mcp".into()];
        a.headers = vec!["Authorization: x".into()];
        assert!(
            a.upstreams_with(|_| None)
                .unwrap_err()
                .contains("say which")
        );
        let mut a = args();
        a.http = vec!["http://a/mcp".into()];
        a.headers = vec!["Authorization: env:NOPE".into()];
        assert!(
            a.upstreams_with(|_| None)
                .unwrap_err()
                .contains("NOPE is not set")
        );
        // Errors never echo a command or an environment value (they may hold secrets).
        let mut a = args();
        a.command = vec!["x=tool --api-key 's3cret".into()];
        let e = a.upstreams_with(|_| None).unwrap_err();
        assert!(
            e.contains("unbalanced") && e.contains("x=") && !e.contains("s3cret"),
            "{e}"
        );
        let mut a = args();
        a.command = vec!["x=node".into()];
        a.env = vec!["=s3cret".into()];
        let e = a.upstreams_with(|_| None).unwrap_err();
        assert!(
            e.contains("no variable name") && !e.contains("s3cret"),
            "{e}"
        );
        let mut a = args();
        a.http = vec!["a=http://a/mcp".into(), "b=http://b/mcp".into()];
        a.idempotent = vec!["echo".into()];
        assert!(
            a.upstreams_with(|_| None)
                .unwrap_err()
                .contains("UPSTREAM_tool")
        );
        // Nor does their `Debug`: a URL's credentials, a command's arguments, a value.
        let mut a = args();
        a.http = vec!["h=http://me:s3cret@127.0.0.1:1/mcp".into()];
        a.command = vec!["c=tool --api-key s3cret".into()];
        a.env = vec!["KEY=s3cret".into()];
        let shown = format!("{:?}", a.upstreams_with(|_| None).unwrap());
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("http://***@127.0.0.1:1/mcp"), "{shown}");
        // A URL with `=` in its query is not taken for a name.
        let mut a = args();
        a.http = vec!["http://a/mcp?x=1".into()];
        assert_eq!(a.upstreams_with(|_| None).unwrap()[0].name(), "upstream");
    }
}
