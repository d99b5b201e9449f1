//! What a gateway is told about one upstream server: [`Upstream`].

use std::collections::BTreeSet;
use std::time::Duration;

use super::GatewayError;

/// How the gateway reaches an upstream server.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpstreamTransport {
    /// Streamable HTTP at this URL, either era: MCP `2026-07-28` (stateless, found with
    /// `server/discover`) or `2025-11-25` (`initialize` and an `Mcp-Session-Id` session).
    Http {
        /// The MCP endpoint, e.g. `http://127.0.0.1:3001/mcp`.
        url: String,
    },
    /// A child process speaking newline-delimited JSON-RPC on its stdin and stdout
    /// (`2025-11-25`, with `initialize`), restarted with backoff when it exits; its stderr
    /// goes to the log.
    Command {
        /// The program.
        program: String,
        /// Its arguments.
        args: Vec<String>,
    },
}

/// Shows a URL without its credentials and a command without its arguments (either may
/// hold a secret).
impl std::fmt::Debug for UpstreamTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Http { url } => f
                .debug_struct("Http")
                .field("url", &crate::units::without_userinfo(url))
                .finish(),
            Self::Command { program, args } => f
                .debug_struct("Command")
                .field("program", program)
                .field("args", &format_args!("[{} hidden]", args.len()))
                .finish(),
        }
    }
}

/// Which MCP revision the gateway speaks to an HTTP upstream ([`Upstream::era`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpstreamEra {
    /// Whatever the upstream speaks: `2026-07-28` when it answers `server/discover`, else
    /// `2025-11-25`. A tool of a dual-era upstream that refuses to ask for input on a
    /// stateless call (FastMCP's `ctx.elicit()`) is called in a `2025-11-25` session from then
    /// on. The default.
    #[default]
    Auto,
    /// `2026-07-28` only: stateless calls; an upstream that does not answer
    /// `server/discover` is not connected.
    Stateless,
    /// `2025-11-25` only: `initialize` and a session, never `server/discover`.
    Session,
}

impl UpstreamEra {
    /// `auto`, `2026-07-28` or `2025-11-25`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Stateless => "2026-07-28",
            Self::Session => "2025-11-25",
        }
    }
}

impl std::str::FromStr for UpstreamEra {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" => Ok(Self::Auto),
            "2026-07-28" => Ok(Self::Stateless),
            "2025-11-25" => Ok(Self::Session),
            other => Err(format!(
                "unknown era `{other}`: auto, 2026-07-28 or 2025-11-25"
            )),
        }
    }
}

impl std::fmt::Display for UpstreamEra {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One upstream MCP server a [`super::Gateway`] serves the tools of, as durable tasks.
///
/// ```
/// use std::time::Duration;
/// use mcp_tasks::gateway::Upstream;
///
/// let everything = Upstream::command("everything", "npx", ["-y", "@modelcontextprotocol/server-everything"])
///     .idempotent("echo")
///     .timeout(Duration::from_secs(60));
/// let search = Upstream::http("search", "http://127.0.0.1:3001/mcp")
///     .header("Authorization", "Bearer s3cret");
/// assert_eq!(everything.name(), "everything");
/// assert_eq!(format!("{search:?}").contains("s3cret"), false, "credentials are never printed");
/// ```
#[derive(Clone)]
pub struct Upstream {
    pub(crate) name: String,
    pub(crate) transport: UpstreamTransport,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) timeout: Duration,
    pub(crate) idempotent: BTreeSet<String>,
    pub(crate) trust_annotations: bool,
    pub(crate) max_processes: usize,
    pub(crate) max_tools: usize,
    pub(crate) max_tools_bytes: usize,
    pub(crate) era: UpstreamEra,
    pub(crate) state_ttl: Option<Duration>,
}

/// How many processes a stdio upstream may run at once, by default.
pub const DEFAULT_MAX_PROCESSES: usize = 4;

/// How many tools an upstream may list, by default.
pub const DEFAULT_MAX_TOOLS: usize = 10_000;

/// How many bytes (as JSON) an upstream's tool list may take, by default.
pub const DEFAULT_MAX_TOOLS_BYTES: usize = 16 * 1024 * 1024;

/// How long a `2026-07-28` upstream is taken to keep the `requestState` of an input round, by
/// default: the MCP Python SDK's and FastMCP's default lifetime of a sealed state (and this
/// runtime's own).
pub const DEFAULT_STATE_TTL: Duration = Duration::from_secs(600);

/// How long the gateway waits for an upstream that says nothing, by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values and the child's environment may hold credentials: names only.
        f.debug_struct("Upstream")
            .field("name", &self.name)
            .field("transport", &self.transport)
            .field(
                "headers",
                &self.headers.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("env", &self.env.iter().map(|(n, _)| n).collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .field("idempotent", &self.idempotent)
            .field("trust_annotations", &self.trust_annotations)
            .field("max_processes", &self.max_processes)
            .field("max_tools", &self.max_tools)
            .field("max_tools_bytes", &self.max_tools_bytes)
            .field("era", &self.era)
            .field("state_ttl", &self.state_ttl)
            .finish()
    }
}

impl Upstream {
    fn new(name: impl Into<String>, transport: UpstreamTransport) -> Self {
        Self {
            name: name.into(),
            transport,
            headers: Vec::new(),
            env: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            idempotent: BTreeSet::new(),
            trust_annotations: false,
            max_processes: DEFAULT_MAX_PROCESSES,
            max_tools: DEFAULT_MAX_TOOLS,
            max_tools_bytes: DEFAULT_MAX_TOOLS_BYTES,
            era: UpstreamEra::Auto,
            state_ttl: Some(DEFAULT_STATE_TTL),
        }
    }

    /// An upstream on Streamable HTTP.
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self::new(name, UpstreamTransport::Http { url: url.into() })
    }

    /// An upstream on stdio: `program` with `args`, spawned by the gateway.
    pub fn command(
        name: impl Into<String>,
        program: impl Into<String>,
        args: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self::new(
            name,
            UpstreamTransport::Command {
                program: program.into(),
                args: args.into_iter().map(Into::into).collect(),
            },
        )
    }

    /// The upstream's name: tool names get the prefix `NAME_` when a gateway has several
    /// upstreams, and messages about the upstream name it by this (never by its URL or
    /// command).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How the gateway reaches it.
    pub fn transport(&self) -> &UpstreamTransport {
        &self.transport
    }

    /// A header sent with every HTTP request to the upstream (credentials, say; never
    /// logged). For a stdio upstream it is ignored.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// An environment variable of a stdio upstream's process (never logged). Its process
    /// gets these and, from the gateway's environment, only `HOME`, `LOGNAME`, `PATH`,
    /// `SHELL`, `TERM`, `USER`, `LANG`, `LC_ALL`, `TMPDIR` and `TZ`: never the rest (a
    /// credential the gateway reads for another upstream stays with it).
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// How long the gateway waits for the upstream when it says nothing: no response, no
    /// progress, no request (default [`DEFAULT_TIMEOUT`]). A call whose upstream stays silent
    /// that long fails; time spent waiting for a client's input does not count. It also
    /// bounds how long a call tries again after a refused or broken connection, from the
    /// first failure (see [`crate::gateway`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Declares the upstream's tool `tool` safe to call twice: a call in flight when the
    /// gateway stopped runs again from the start afterwards, instead of failing, and a call
    /// whose connection broke after it was sent is sent again (within the timeout). Name it as
    /// the upstream does (without the `NAME_` prefix) or as the gateway lists it.
    pub fn idempotent(mut self, tool: impl Into<String>) -> Self {
        self.idempotent.insert(tool.into());
        self
    }

    /// Takes the upstream's `readOnlyHint: true` and `idempotentHint: true` annotations as
    /// [`Upstream::idempotent`]
    /// declarations. Off by default: an upstream's annotations are its own claims.
    pub fn trust_annotations(mut self, trust: bool) -> Self {
        self.trust_annotations = trust;
        self
    }

    /// The most tools the upstream may list (default [`DEFAULT_MAX_TOOLS`]) and the most
    /// bytes its tool list may take as JSON (default [`DEFAULT_MAX_TOOLS_BYTES`]). A listing
    /// over either is refused and logged, and the previous list kept.
    pub fn max_tools(mut self, tools: usize, bytes: usize) -> Self {
        self.max_tools = tools;
        self.max_tools_bytes = bytes;
        self
    }

    /// How many processes a stdio upstream may run at once (default
    /// [`DEFAULT_MAX_PROCESSES`]): one per call in flight, since stdio cannot say which call
    /// a server's request is about. A call that finds every running process busy waits about
    /// as long as this upstream's calls take (2–250 ms) for one to be free, then has another
    /// started in the background and takes whichever comes first; past the limit it waits
    /// for one — calls waiting for a client's answer hold theirs. Ignored for an HTTP upstream.
    pub fn max_processes(mut self, max: usize) -> Self {
        self.max_processes = max;
        self
    }

    /// Which revision to speak to an HTTP upstream (default [`UpstreamEra::Auto`]). A stdio
    /// upstream speaks `2025-11-25`: `Auto` and `Session` only.
    pub fn era(mut self, era: UpstreamEra) -> Self {
        self.era = era;
        self
    }

    /// How long a `2026-07-28` upstream keeps the `requestState` of an input round (default
    /// [`DEFAULT_STATE_TTL`]; `None`: for as long as the task lives). A task waiting for such
    /// an input says until when in its `statusMessage`, and fails at that moment, saying
    /// why, rather than take an answer the upstream would refuse.
    pub fn state_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.state_ttl = ttl;
        self
    }

    /// The checks a gateway makes before it starts: a name of `A-Z a-z 0-9 -` (1 to 64), a
    /// URL it can use, a program, header names and values HTTP can carry, a timeout above 0.
    pub(crate) fn check(&self) -> Result<(), GatewayError> {
        let bad = |reason: String| GatewayError::InvalidUpstream {
            upstream: self.name.clone(),
            reason,
        };
        let valid_name = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !valid_name {
            return Err(bad(
                "an upstream name is 1 to 64 characters of A-Z a-z 0-9 - (no `_`: it separates the name from the tool's in prefixed tool names)".into(),
            ));
        }
        if self.timeout.is_zero() {
            return Err(bad("the timeout must be above 0".into()));
        }
        if self.state_ttl.is_some_and(|t| t.is_zero()) {
            return Err(bad(
                "the requestState lifetime must be above 0 (or none)".into()
            ));
        }
        if self.max_processes == 0 {
            return Err(bad("a stdio upstream needs at least 1 process".into()));
        }
        match &self.transport {
            UpstreamTransport::Http { url } => {
                let parsed = reqwest::Url::parse(url)
                    .map_err(|e| bad(format!("the URL does not parse: {e}")))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(bad(format!(
                        "the URL's scheme is `{}`; http or https",
                        parsed.scheme()
                    )));
                }
            }
            UpstreamTransport::Command { program, .. } => {
                if program.trim().is_empty() {
                    return Err(bad("the command is empty".into()));
                }
                if self.era == UpstreamEra::Stateless {
                    return Err(bad(
                        "a stdio upstream speaks 2025-11-25 (the era 2026-07-28 is for HTTP upstreams)".into(),
                    ));
                }
            }
        }
        for (name, value) in &self.headers {
            reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| bad(format!("`{name}` is not an HTTP header name")))?;
            reqwest::header::HeaderValue::from_str(value).map_err(|_| {
                bad(format!(
                    "the value of header `{name}` has characters HTTP cannot carry"
                ))
            })?;
        }
        Ok(())
    }
}
