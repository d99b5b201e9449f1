//! The `mcp-tasks` binary: a thin command line over the library.

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use mcp_tasks::auth::{self, Authenticator};
use mcp_tasks::quota::Quotas;
use mcp_tasks::transport::{http, stdio};
use mcp_tasks::{Owner, Runtime, RuntimeBuilder, units};
use mcp_tasks_testkit::{demo, fixtures};
mod cli;
mod cli_store;
mod gateway_args;
mod serve_config;

#[derive(Parser)]
#[command(name = "mcp-tasks", version, about = "Durable tasks for MCP servers")]
#[command(after_help = cli::EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The log lines on stderr: `text`, or `json` (one JSON object per line, with the fields
    /// of the spans it was logged in). `RUST_LOG` sets what is logged.
    #[arg(
        long,
        global = true,
        env = "MCP_TASKS_LOG_FORMAT",
        value_enum,
        value_name = "FORMAT",
        default_value = "text"
    )]
    log_format: LogFormat,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    /// Human-readable lines (colored on a terminal).
    Text,
    /// One JSON object per line: timestamp, level, target, fields, the current span and the
    /// list of spans it is in.
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Play the demo sequence end to end (with a restart in the middle) on a fresh store.
    Demo {
        /// Print the JSON of every exchange.
        #[arg(long)]
        verbose: bool,
        /// Use this store file instead of a fresh one in a temporary directory (with
        /// `--replicas`: the PostgreSQL database, `postgres://USER@HOST:PORT/DB`).
        #[arg(long)]
        store: Option<PathBuf>,
        /// Play the replica demo instead: 2 replicas over the PostgreSQL `--store`, a lease
        /// takeover and a refused late completion, step by step.
        #[arg(long, value_name = "N")]
        replicas: Option<u32>,
    },
    /// Serve MCP (`2026-07-28`, Tasks extension) on Streamable HTTP, or on stdio; with
    /// `--upstream URL` or `--upstream-command CMD`, as a gateway that serves an existing MCP
    /// server's tools as durable tasks.
    Serve(Box<ServeArgs>),
    /// Operate a store: stats, list, show, backup, compact, verify, migrate, purge.
    #[command(subcommand, after_help = cli_store::EXIT_CODES)]
    Store(cli_store::StoreCommand),
    /// Print a shell completion script: `source <(mcp-tasks completions bash)`, or save it
    /// where the shell looks (e.g. `mcp-tasks completions fish >
    /// ~/.config/fish/completions/mcp-tasks.fish`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Client commands: tools, call, get, watch, answer, cancel, ls.
    #[command(flatten)]
    Client(cli::ClientCommand),
    /// Probe a running server's `/readyz` (or any URL) and exit 0 if it answers 2xx, 1
    /// otherwise: a container HEALTHCHECK without curl.
    Healthcheck {
        /// The URL to probe.
        #[arg(
            long,
            value_name = "URL",
            default_value = "http://127.0.0.1:8080/readyz"
        )]
        url: String,
        /// How long to wait for the answer: a duration (5s, 500ms) or bare seconds.
        #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = units::parse_duration_or_seconds)]
        timeout: Duration,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// Read serve options from this TOML file: its keys are the long option names (`listen =
    /// "0.0.0.0:8080"`, `task-ttl = "1h"`, `allowed-origin = ["https://app.example"]`,
    /// `no-auth = true`). An option on the command line overrides its environment variable
    /// (`MCP_TASKS_LISTEN`, ...), which overrides the file.
    #[arg(long, env = "MCP_TASKS_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// The address to serve Streamable HTTP on (the endpoint is `/mcp`).
    #[arg(
        long,
        env = "MCP_TASKS_LISTEN",
        value_name = "ADDR",
        default_value = "127.0.0.1:8080"
    )]
    listen: String,
    /// Where the tasks are kept: a redb file (created if missing, one process at a time), a
    /// PostgreSQL database shared by several replicas, `postgres://USER@HOST:PORT/DB`, or
    /// `memory`: this process's memory only, so nothing survives a restart (for trials and
    /// benchmarks; a redb file named `memory` is `./memory`).
    #[arg(
        long,
        env = "MCP_TASKS_STORE",
        value_name = "PATH|URL",
        default_value = "mcp-tasks.redb"
    )]
    store: String,
    /// With a redb store: do not listen on the admin socket `<store>.admin.sock`, through which
    /// `mcp-tasks store stats|list|show|verify|backup` read the store while the server runs.
    #[arg(long, env = "MCP_TASKS_NO_ADMIN_SOCKET")]
    no_admin_socket: bool,
    /// With a redb store: memory for redb's page cache (a size: bytes, or with a unit such as
    /// KiB, MiB, GiB, KB, MB). The server's memory does not grow with the stored tasks beyond it; reads of
    /// older tasks then go to the operating system's page cache.
    #[arg(long, env = "MCP_TASKS_CACHE_SIZE", value_name = "SIZE", default_value = "8MiB", value_parser = units::parse_size_usize)]
    cache_size: usize,
    /// With a redb store: memory for the record cache, the snapshots of recently read tasks
    /// (bytes, or with a unit), so that a task polled again is answered without a read of the
    /// file; counted apart from --cache-size. 0 turns it off.
    #[arg(long, env = "MCP_TASKS_RECORD_CACHE_SIZE", value_name = "SIZE", default_value = "8MiB", value_parser = units::parse_size_usize)]
    record_cache_size: usize,
    /// With a redb store: save redb's allocator state with every commit (two-phase commit),
    /// so that the start after a crash does not walk the whole file. With --verify-on-open
    /// false, a restart after kill -9 is then about as fast as a clean one at any size;
    /// each commit costs more.
    #[arg(long, env = "MCP_TASKS_QUICK_REPAIR")]
    quick_repair: bool,
    /// With a redb store: verify the checksum of every page at start (one read of the whole
    /// file), so that a file damaged outside redb is refused instead of trusted. After a
    /// crash redb repairs the file whatever this says.
    #[arg(long, env = "MCP_TASKS_VERIFY_ON_OPEN", value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    verify_on_open: bool,
    /// With a PostgreSQL store: this replica's node id (default: a random one, logged). A
    /// second live process with the same id is refused at start.
    #[arg(long, env = "MCP_TASKS_NODE_ID", value_name = "NAME")]
    node_id: Option<String>,
    /// With a PostgreSQL store: how long a replica's lease lasts without a heartbeat before
    /// the other replicas take its tasks over (heartbeats run every third of it). The
    /// cluster's: a replica started with another value while another one runs is refused.
    #[arg(long, env = "MCP_TASKS_LEASE_TTL", value_name = "DURATION", default_value = "15s", value_parser = units::parse_duration)]
    lease_ttl: Duration,
    /// With a PostgreSQL store: how often a replica reads the database for other replicas'
    /// changes when no notification came (the fallback for a lost LISTEN/NOTIFY wake-up: it
    /// only delays, by at most this long).
    #[arg(long, env = "MCP_TASKS_REPLICA_POLL", value_name = "DURATION", default_value = "1s", value_parser = units::parse_duration)]
    replica_poll: Duration,
    /// Test only: writes of a PostgreSQL store skip the lease and sequence checks (a replica
    /// that lost a lease overwrites the new owner's work). For the replica crash suite.
    #[arg(long, hide = true)]
    unsafe_skip_fencing: bool,
    /// An `Origin` accepted besides the loopback ones (repeatable).
    #[arg(
        long = "allowed-origin",
        env = "MCP_TASKS_ALLOWED_ORIGIN",
        value_delimiter = ',',
        value_name = "ORIGIN"
    )]
    allowed_origins: Vec<String>,
    /// A `Host` name accepted besides the loopback ones, e.g. when listening on a public
    /// address behind a proxy (repeatable; `*` accepts any).
    #[arg(
        long = "allowed-host",
        env = "MCP_TASKS_ALLOWED_HOST",
        value_delimiter = ',',
        value_name = "HOST"
    )]
    allowed_hosts: Vec<String>,
    /// Serve a fixture set instead of the demo's `generate_report` tool.
    #[arg(long, env = "MCP_TASKS_FIXTURES", value_enum, value_name = "SET")]
    fixtures: Option<Fixtures>,
    /// Answer `-32020` when a `tasks/*` request lacks its `Mcp-Name` header.
    #[arg(long, env = "MCP_TASKS_STRICT_HEADERS")]
    strict_headers: bool,
    /// The time to live of new tasks (`ttlMs`), counted from creation: a task still running
    /// then is failed ("Task has expired"). `none` for unlimited. Units: ms, s, m, h, d.
    #[arg(long, env = "MCP_TASKS_TASK_TTL", value_name = "DURATION", default_value = "15m", value_parser = parse_ttl)]
    task_ttl: Ttl,
    /// How long an expired task (and so a finished one) stays answerable before it is
    /// deleted. Units: ms, s, m, h, d.
    #[arg(long, env = "MCP_TASKS_EXPIRED_RETENTION", value_name = "DURATION", default_value = "1h", value_parser = units::parse_duration)]
    expired_retention: Duration,
    /// How often a working task's tool may be restarted in a row without progress after a
    /// crash, a kill or a panic before the task is failed (counted in the store, across
    /// restarts of the server).
    #[arg(
        long,
        env = "MCP_TASKS_RESTART_BUDGET",
        value_name = "N",
        default_value_t = 3
    )]
    restart_budget: u32,
    /// How long a task waiting for input keeps its actor before it is passivated (parked
    /// without an actor or a tool future; started again from the store, its tool re-run with
    /// its recorded steps and answers, by an answer, a cancellation or its expiry). `never`
    /// keeps every actor; `0s` parks at once. Units: ms, s, m, h, d.
    #[arg(long, env = "MCP_TASKS_PASSIVATE_AFTER", value_name = "DURATION", default_value = "30s", value_parser = parse_passivate_after)]
    passivate_after: PassivateAfter,
    /// Where `--fixtures crash` appends its step side effects (docs/CRASH-TESTING.md).
    #[arg(long, value_name = "PATH", hide = true)]
    side_effects: Option<PathBuf>,
    /// Serve Prometheus metrics at `GET /metrics` on this address (a port apart from MCP's;
    /// the series are listed in the `mcp_tasks::telemetry` docs). Off by default.
    #[arg(long, env = "MCP_TASKS_METRICS_LISTEN", value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// Serve the operator console (every stored task, followed live; docs/CONSOLE.md) on this
    /// address, a port apart from MCP's. With authentication configured it asks for the same
    /// tokens: a principal sees its own tasks, the `admin` scope every tenant. Off by default.
    #[arg(long, env = "MCP_TASKS_CONSOLE_LISTEN", value_name = "ADDR")]
    console_listen: Option<String>,
    /// Let the console act: cancel a task, cancel every task a filter matches, purge finished
    /// tasks (with authentication, for tokens with the `admin` scope only). Off by default.
    #[arg(long, env = "MCP_TASKS_CONSOLE_ACTIONS", requires = "console_listen")]
    console_actions: bool,
    #[command(flatten)]
    console: ConsoleArgs,
    /// Serve newline-delimited JSON-RPC on stdin/stdout instead of HTTP (logs on stderr).
    #[arg(long, env = "MCP_TASKS_STDIO", conflicts_with_all = ["listen", "allowed_origins", "allowed_hosts", "strict_headers", "http_auth"])]
    stdio: bool,
    /// stdio: the owner of every task created over stdin, as TENANT/PRINCIPAL
    /// (default: default/anonymous).
    #[arg(
        long,
        env = "MCP_TASKS_PRINCIPAL",
        value_name = "TENANT/PRINCIPAL",
        requires = "stdio"
    )]
    principal: Option<String>,
    #[command(flatten)]
    http_auth: HttpAuthArgs,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    gateway: gateway_args::GatewayArgs,
}

/// Per-principal quotas and connection limits (defaults in docs/SERVE.md).
#[derive(Args)]
#[command(next_help_heading = "Limits")]
struct LimitArgs {
    /// Unfinished tasks one principal may have.
    #[arg(long, env = "MCP_TASKS_MAX_LIVE_TASKS", value_name = "N", default_value_t = Quotas::default().max_live_tasks)]
    max_live_tasks: usize,
    /// Bytes of arguments (JSON) across one principal's unfinished tasks (a size: bytes, or
    /// with a unit such as KiB, MiB, MB).
    #[arg(long, env = "MCP_TASKS_MAX_LIVE_ARGUMENT_BYTES", value_name = "SIZE", default_value_t = Quotas::default().max_live_argument_bytes, value_parser = units::parse_size)]
    max_live_argument_bytes: u64,
    /// Task creations per second one principal may sustain (bursts of --create-burst).
    #[arg(long, env = "MCP_TASKS_CREATE_RATE", value_name = "PER_SECOND", default_value_t = Quotas::default().create_rate)]
    create_rate: f64,
    /// Task creations one principal may make at once.
    #[arg(long, env = "MCP_TASKS_CREATE_BURST", value_name = "N", default_value_t = Quotas::default().create_burst)]
    create_burst: u32,
    /// Open subscriptions/listen streams per principal.
    #[arg(long, env = "MCP_TASKS_MAX_LISTENS", value_name = "N", default_value_t = Quotas::default().max_listens)]
    max_listens: usize,
    /// Task ids followed across one principal's open listens.
    #[arg(long, env = "MCP_TASKS_MAX_LISTEN_TASK_IDS", value_name = "N", default_value_t = Quotas::default().max_listen_task_ids)]
    max_listen_task_ids: usize,
    /// Legacy (2025-11-25) sessions one principal may have held at once; at the limit the
    /// least recently used one without an open stream gives way, and when all have one, a
    /// new session is refused (429).
    #[arg(long, env = "MCP_TASKS_MAX_SESSIONS", value_name = "N", default_value_t = Quotas::default().max_sessions)]
    max_sessions: usize,
    /// Legacy sessions of one principal with stored settings or subscriptions.
    #[arg(long, env = "MCP_TASKS_MAX_SESSION_RECORDS", value_name = "N", default_value_t = Quotas::default().max_session_records)]
    max_session_records: usize,
    /// Bytes one principal may keep in the store: all its tasks, finished ones included
    /// until their retention ends (429 / -32010 `storedBytes` over it); a size (bytes, or with
    /// a unit such as KiB, MiB, GB).
    #[arg(long, env = "MCP_TASKS_MAX_STORED_BYTES", value_name = "SIZE", default_value = "256MiB", value_parser = units::parse_size)]
    max_stored_bytes: u64,
    /// Flow control: at most N tasks of TOOL run at once (`*=N`: of all tools together);
    /// more are still created and wait `working`, `statusMessage` `queued: K ahead`, until a
    /// slot frees. Repeatable, or comma-separated (docs/SERVE.md, "Flow control").
    #[arg(
        long,
        env = "MCP_TASKS_MAX_RUNNING",
        value_name = "TOOL=N",
        value_delimiter = ',',
        value_parser = parse_max_running
    )]
    max_running: Vec<String>,
    /// Flow control: at most N tasks of one principal run at once, over all tools; freed slots
    /// go to the principals with queued tasks in turn.
    #[arg(long, env = "MCP_TASKS_MAX_RUNNING_PER_OWNER", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_running_per_owner: Option<u32>,
    /// Flow control: at most R tasks of TOOL start per second (`TOOL=R/s`, also `/m`, `/h`;
    /// one token, no burst: in any T seconds at most R×T+1 start); more wait queued.
    /// Repeatable, or comma-separated.
    #[arg(
        long,
        env = "MCP_TASKS_MAX_STARTS",
        value_name = "TOOL=R/s",
        value_delimiter = ',',
        value_parser = parse_max_starts
    )]
    max_starts: Vec<String>,
    /// Flow control for the gateway: at most N tasks of upstream NAME's tools run at once,
    /// together; more wait queued. Repeatable, or comma-separated.
    #[arg(
        long,
        env = "MCP_TASKS_UPSTREAM_MAX_RUNNING",
        value_name = "NAME=N",
        value_delimiter = ',',
        value_parser = parse_max_running
    )]
    upstream_max_running: Vec<String>,
    /// Lift every per-principal quota above (a single trusted user, benchmarks).
    #[arg(long, env = "MCP_TASKS_NO_QUOTAS")]
    no_quotas: bool,
    /// HTTP requests one principal may have in progress (open listen streams included).
    #[arg(
        long,
        env = "MCP_TASKS_MAX_REQUESTS_PER_PRINCIPAL",
        value_name = "N",
        default_value_t = 64
    )]
    max_requests_per_principal: usize,
    /// Largest HTTP request body (a size: bytes, or with a unit such as KiB, MiB, MB).
    #[arg(long, env = "MCP_TASKS_MAX_BODY_BYTES", value_name = "SIZE", default_value = "4MiB", value_parser = units::parse_size_usize)]
    max_body_bytes: usize,
    /// Open HTTP connections at most (keep below the file-descriptor limit).
    #[arg(
        long,
        env = "MCP_TASKS_MAX_CONNECTIONS",
        value_name = "N",
        default_value_t = 1024
    )]
    max_connections: usize,
    /// HTTP connections one peer address (IPv6: its /64) may hold before a request on them
    /// authenticates; behind a reverse proxy, raise it.
    #[arg(
        long,
        env = "MCP_TASKS_MAX_UNAUTHENTICATED_PER_ADDRESS",
        value_name = "N",
        default_value_t = 64
    )]
    max_unauthenticated_per_address: usize,
    /// HTTP connections one principal may hold.
    #[arg(
        long,
        env = "MCP_TASKS_MAX_CONNECTIONS_PER_PRINCIPAL",
        value_name = "N",
        default_value_t = 256
    )]
    max_connections_per_principal: usize,
    /// How long to receive a request head (also the keep-alive idle time); a duration (10s,
    /// 500ms) or bare seconds.
    #[arg(long, env = "MCP_TASKS_HEADER_READ_TIMEOUT", value_name = "DURATION", default_value = "10s", value_parser = units::parse_duration_or_seconds)]
    header_read_timeout: Duration,
    /// How long to receive a request body; a duration or bare seconds.
    #[arg(long, env = "MCP_TASKS_BODY_TIMEOUT", value_name = "DURATION", default_value = "30s", value_parser = units::parse_duration_or_seconds)]
    body_timeout: Duration,
    /// How long a response may wait for the client to read it; a duration or bare seconds.
    #[arg(long, env = "MCP_TASKS_IDLE_TIMEOUT", value_name = "DURATION", default_value = "60s", value_parser = units::parse_duration_or_seconds)]
    idle_timeout: Duration,
}

/// A `--max-running` value: `TOOL=N`, N ≥ 1.
fn parse_max_running(spec: &str) -> Result<String, String> {
    mcp_tasks::quota::parse_limit(spec)
        .map(|_| spec.to_owned())
        .map_err(|e| e.to_string())
}

/// A `--max-starts` value: `TOOL=R/s`, R > 0.
fn parse_max_starts(spec: &str) -> Result<String, String> {
    mcp_tasks::quota::parse_rate(spec)
        .map(|_| spec.to_owned())
        .map_err(|e| e.to_string())
}

impl LimitArgs {
    /// The flow-control limits (each value checked by clap already).
    fn flow(&self) -> mcp_tasks::quota::FlowLimits {
        let mut flow = mcp_tasks::quota::FlowLimits::none();
        for spec in &self.max_running {
            if let Err(e) = flow.add(spec) {
                tracing::error!(error = %e, "ignoring a --max-running value");
            }
        }
        for spec in &self.max_starts {
            if let Err(e) = flow.add_rate(spec) {
                tracing::error!(error = %e, "ignoring a --max-starts value");
            }
        }
        for (name, n) in self.upstream_limits() {
            flow.per_group
                .insert(mcp_tasks::gateway::upstream_flow_group(name), n);
        }
        flow.per_owner = self.max_running_per_owner;
        flow
    }

    /// The `--upstream-max-running` limits, by upstream name.
    fn upstream_limits(&self) -> Vec<(&str, u32)> {
        self.upstream_max_running
            .iter()
            .filter_map(|spec| mcp_tasks::quota::parse_limit(spec).ok())
            .collect()
    }

    fn quotas(&self) -> Quotas {
        if self.no_quotas {
            return Quotas::unlimited();
        }
        let mut q = Quotas::default();
        q.max_live_tasks = self.max_live_tasks;
        q.max_live_argument_bytes = self.max_live_argument_bytes;
        q.create_rate = self.create_rate;
        q.create_burst = self.create_burst;
        q.max_listens = self.max_listens;
        q.max_listen_task_ids = self.max_listen_task_ids;
        q.max_sessions = self.max_sessions;
        q.max_session_records = self.max_session_records;
        q.max_stored_bytes = self.max_stored_bytes;
        q
    }

    fn check(&self) -> Result<(), String> {
        let secs = [
            ("--header-read-timeout", self.header_read_timeout),
            ("--body-timeout", self.body_timeout),
            ("--idle-timeout", self.idle_timeout),
        ];
        for (name, d) in secs {
            if d.is_zero() || d > Duration::from_secs(86_400) {
                return Err(format!("{name} must be above 0 and at most 1d (86400s)"));
            }
        }
        if !(self.create_rate.is_finite() && self.create_rate > 0.0) {
            return Err("--create-rate must be a positive number".into());
        }
        if self.max_connections == 0
            || self.max_requests_per_principal == 0
            || self.max_unauthenticated_per_address == 0
            || self.max_connections_per_principal == 0
        {
            return Err(
                "--max-connections, --max-requests-per-principal, --max-unauthenticated-per-address and --max-connections-per-principal must be positive".into(),
            );
        }
        Ok(())
    }

    fn serve_options(&self) -> http::ServeOptions {
        http::ServeOptions::default()
            .max_connections(self.max_connections)
            .max_unauthenticated_per_address(self.max_unauthenticated_per_address)
            .max_connections_per_principal(self.max_connections_per_principal)
            .header_read_timeout(self.header_read_timeout)
            .idle_timeout(self.idle_timeout)
    }
}

/// Who may call the HTTP endpoint.
#[derive(Args)]
#[group(id = "http_auth", multiple = true)]
struct HttpAuthArgs {
    /// A TOML file of bearer tokens (`[[tokens]]` with `sha256`, `tenant`, `principal`,
    /// optional `scopes`); reloaded on SIGHUP.
    #[arg(long, env = "MCP_TASKS_AUTH_TOKENS", value_name = "PATH")]
    auth_tokens: Option<PathBuf>,
    /// Verify JWT access tokens against this JWKS (a file, or an http(s) URL).
    #[arg(
        long,
        env = "MCP_TASKS_AUTH_JWT_JWKS",
        value_name = "PATH_OR_URL",
        requires = "auth_jwt_issuer"
    )]
    auth_jwt_jwks: Option<String>,
    /// The issuer (`iss`) JWT access tokens must come from.
    #[arg(
        long,
        env = "MCP_TASKS_AUTH_JWT_ISSUER",
        value_name = "ISS",
        requires = "auth_jwt_jwks"
    )]
    auth_jwt_issuer: Option<String>,
    /// The audience (`aud`) JWT access tokens must carry (default: the --resource-url).
    #[arg(
        long,
        env = "MCP_TASKS_AUTH_JWT_AUDIENCE",
        value_name = "AUD",
        requires = "auth_jwt_jwks"
    )]
    auth_jwt_audience: Option<String>,
    /// The JWT claim that names the caller's tenant (default: the issuer is the tenant).
    #[arg(
        long,
        env = "MCP_TASKS_AUTH_JWT_TENANT_CLAIM",
        value_name = "CLAIM",
        requires = "auth_jwt_jwks"
    )]
    auth_jwt_tenant_claim: Option<String>,
    /// A JWT signature algorithm to accept (repeatable; default RS256).
    #[arg(
        long = "auth-jwt-algorithm",
        env = "MCP_TASKS_AUTH_JWT_ALGORITHM",
        value_delimiter = ',',
        value_name = "ALG",
        requires = "auth_jwt_jwks"
    )]
    auth_jwt_algorithms: Vec<String>,
    /// A scope every token must carry (repeatable); listed in the resource metadata.
    #[arg(
        long = "auth-scope",
        env = "MCP_TASKS_AUTH_SCOPE",
        value_delimiter = ',',
        value_name = "SCOPE"
    )]
    auth_scopes: Vec<String>,
    /// This server's canonical URI, e.g. https://mcp.example.com/mcp (default:
    /// http://ADDR/mcp): the RFC 9728 `resource` and the default JWT audience.
    #[arg(long, env = "MCP_TASKS_RESOURCE_URL", value_name = "URL")]
    resource_url: Option<String>,
    /// Serve without authentication on a non-loopback address (every caller is the same
    /// anonymous principal); also lets `--console-listen` bind one without authentication.
    #[arg(long, env = "MCP_TASKS_NO_AUTH", conflicts_with_all = ["auth_tokens", "auth_jwt_jwks"])]
    no_auth: bool,
    /// Refused credentials one address (or one principal a JWT claims) may send, on the MCP
    /// endpoint and on the console each, within `--auth-failure-window` before its requests
    /// are answered 429 unchecked (0 turns throttling off).
    #[arg(
        long,
        env = "MCP_TASKS_AUTH_MAX_FAILURES",
        value_name = "N",
        default_value_t = 10
    )]
    auth_max_failures: u32,
    /// The window `--auth-max-failures` counts in. Units: ms, s, m, h, d.
    #[arg(long, env = "MCP_TASKS_AUTH_FAILURE_WINDOW", value_name = "DURATION", default_value = "1m", value_parser = units::parse_duration)]
    auth_failure_window: Duration,
}

/// The console's sessions, cookies and streams (with `--console-listen`).
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Console")]
struct ConsoleArgs {
    /// How long a console sign-in lasts from its login. Units: ms, s, m, h, d.
    #[arg(long, env = "MCP_TASKS_CONSOLE_SESSION_TTL", value_name = "DURATION", default_value = "12h", value_parser = units::parse_duration, requires = "console_listen")]
    console_session_ttl: Duration,
    /// How long an unused console sign-in lasts. Units: ms, s, m, h, d.
    #[arg(long, env = "MCP_TASKS_CONSOLE_SESSION_IDLE", value_name = "DURATION", default_value = "30m", value_parser = units::parse_duration, requires = "console_listen")]
    console_session_idle: Duration,
    /// Mark the console's session cookie `Secure` (for a console reached over https only;
    /// without it the cookie is `Secure` when a trusted proxy says the request came over
    /// https).
    #[arg(
        long,
        env = "MCP_TASKS_CONSOLE_SECURE_COOKIE",
        requires = "console_listen"
    )]
    console_secure_cookie: bool,
    /// A proxy in front of the console whose `X-Forwarded-Proto` and `X-Forwarded-For` are
    /// believed (repeatable; an IP address).
    #[arg(
        long = "console-trusted-proxy",
        env = "MCP_TASKS_CONSOLE_TRUSTED_PROXY",
        value_delimiter = ',',
        value_name = "IP",
        requires = "console_listen"
    )]
    console_trusted_proxies: Vec<std::net::IpAddr>,
    /// The most live event streams one principal may hold open on the console (429 beyond).
    #[arg(
        long,
        env = "MCP_TASKS_CONSOLE_MAX_STREAMS",
        value_name = "N",
        default_value_t = 16,
        requires = "console_listen"
    )]
    console_max_streams: usize,
}

#[derive(Clone, Copy, ValueEnum)]
enum Fixtures {
    /// The tools, prompt and resources the MCP conformance suite calls.
    Conformance,
    /// The tools the load benchmarks drive.
    Bench,
    /// The crash-simulation workload (`sim_job`), for the kill/restart suite.
    #[value(hide = true)]
    Crash,
}

/// clap_complete's bash script for a hyphenated binary name sets `cmd` to
/// `mcp__tasks__subcmd__serve` but names the `case` arm of its options
/// `mcp__subcmd__tasks__subcmd__serve`, so no subcommand's options ever complete. The arms get
/// the names `cmd` takes (`tests/it/cli.rs` `bash_completes_the_options_of_subcommands` runs the
/// script in bash).
fn bash_completion_names(script: &[u8]) -> Vec<u8> {
    String::from_utf8_lossy(script)
        .replace("mcp__subcmd__tasks", "mcp__tasks")
        .into_bytes()
}

/// The binary's allocator: jemalloc, which gives memory back by itself. glibc's keeps what a
/// burst of stopped task actors freed (tasks waiting for input parked, a burst finishing) for
/// its next allocations; jemalloc's background thread returns pages left unused for a second
/// (`dirty_decay_ms:1000`, `muzzy_decay_ms:0`: no lazily-freed middle state), and lifecycles
/// run faster than on glibc's. Measured in docs/BENCHMARKS.md ("Memory given back",
/// `cargo bench --bench scale -- --only returned`). A library user keeps their own allocator
/// (docs/SERVE.md says what to pick). `_RJEM_MALLOC_CONF` in the environment adds to these.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's `malloc_conf`, read at its start: a pointer to a C string.
#[cfg(not(target_env = "msvc"))]
#[repr(transparent)]
struct MallocConf(*const std::ffi::c_char);
// SAFETY: it points at a constant C string, which nothing writes.
#[cfg(not(target_env = "msvc"))]
unsafe impl Sync for MallocConf {}
#[cfg(not(target_env = "msvc"))]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: MallocConf =
    MallocConf(c"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0".as_ptr());

fn main() -> ExitCode {
    let cli: Cli = serve_config::parse(std::env::args_os().collect());
    if let Command::Completions { shell } = cli.command {
        use clap::CommandFactory;
        use std::io::Write;
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "mcp-tasks", &mut script);
        if shell == clap_complete::Shell::Bash {
            script = bash_completion_names(&script);
        }
        let mut out = std::io::stdout().lock();
        return match out.write_all(&script).and_then(|()| out.flush()) {
            Ok(()) => ExitCode::SUCCESS,
            // A closed pipe (`| head`) is the reader's choice, not an error to report.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: cannot write the completion script: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let default_filter = match cli.command {
        Command::Demo { .. } => "warn",
        // Not ractor's spans (one per actor, open for a live task's whole life: about 400
        // bytes each with this subscriber, and nothing in the log needs them).
        Command::Serve(_) => "info,ractor=warn",
        Command::Store(_) | Command::Completions { .. } => "warn",
        Command::Client(_) => "warn",
        Command::Healthcheck { .. } => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    match cli.log_format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init(),
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = rt.block_on(async {
        match cli.command {
            Command::Demo {
                replicas: Some(n),
                store,
                ..
            } => run_replicas_demo(n, store).await,
            Command::Demo { verbose, store, .. } => run_demo(verbose, store).await,
            Command::Serve(args) => {
                // The runtime's handle once it started (recovery done), for `/readyz` on the
                // metrics address, which answers before that.
                let started = Arc::new(OnceLock::new());
                // Installed before the runtime starts, so that recovery is measured too.
                let metrics = match &args.metrics_listen {
                    Some(addr) => match serve_metrics(addr, started.clone()).await {
                        Ok((task, _)) => Some(task),
                        Err(e) => {
                            eprintln!("error: {e}");
                            return ExitCode::FAILURE;
                        }
                    },
                    None => None,
                };
                let code = if args.stdio {
                    serve_stdio(*args, &started).await
                } else {
                    serve_http(*args, &started).await
                };
                if let Some(task) = metrics {
                    task.abort();
                }
                code
            }
            Command::Store(command) => cli_store::run(command).await,
            Command::Completions { .. } => ExitCode::SUCCESS,
            Command::Client(command) => cli::run(command).await,
            Command::Healthcheck { url, timeout } => healthcheck(&url, timeout).await,
        }
    });
    // Everything is stopped and flushed; a read of stdin may still block a worker thread.
    rt.shutdown_background();
    code
}

/// `demo --replicas 2 --store postgres://…`.
async fn run_replicas_demo(replicas: u32, store: Option<PathBuf>) -> ExitCode {
    if replicas != 2 {
        eprintln!("error: the replica demo plays with --replicas 2");
        return ExitCode::FAILURE;
    }
    let url = store.as_deref().and_then(|p| p.to_str()).unwrap_or("");
    if !is_postgres_url(url) {
        eprintln!("error: the replica demo needs --store postgres://USER@HOST:PORT/DB");
        return ExitCode::FAILURE;
    }
    #[cfg(feature = "postgres")]
    {
        let mut out = std::io::stdout().lock();
        match mcp_tasks_testkit::replicas_demo::run(url, &mut out).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        }
    }
    #[cfg(not(feature = "postgres"))]
    {
        eprintln!("error: this build has no PostgreSQL store (cargo feature `postgres`)");
        ExitCode::FAILURE
    }
}

async fn run_demo(verbose: bool, store: Option<PathBuf>) -> ExitCode {
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: cannot create a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let path = store.unwrap_or_else(|| dir.path().join("demo.redb"));
    let mut out = std::io::stdout().lock();
    match demo::run(&path, verbose, &mut out).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A `--task-ttl` value: a duration or `none`.
#[derive(Clone, Copy, Debug)]
struct Ttl(Option<Duration>);

fn parse_ttl(s: &str) -> Result<Ttl, String> {
    if s.trim().eq_ignore_ascii_case("none") {
        return Ok(Ttl(None));
    }
    let d = units::parse_duration(s).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err(
            "a time to live of 0 would expire every task at once; use `none` for unlimited".into(),
        );
    }
    Ok(Ttl(Some(d)))
}

/// A `--passivate-after` value: a duration or `never`.
#[derive(Clone, Copy, Debug)]
struct PassivateAfter(Option<Duration>);

fn parse_passivate_after(s: &str) -> Result<PassivateAfter, String> {
    if s.trim().eq_ignore_ascii_case("never") {
        return Ok(PassivateAfter(None));
    }
    let d = units::parse_duration(s).map_err(|e| format!("{e} (or `never`)"))?;
    Ok(PassivateAfter(Some(d)))
}

/// `--store memory`: the in-memory store (nothing survives the process).
const MEMORY_STORE: &str = "memory";

/// Whether `store` names a PostgreSQL database rather than a redb file: the one rule the
/// store commands use too (`admin::Location::parse`).
fn is_postgres_url(store: &str) -> bool {
    mcp_tasks::admin::Location::parse(store).kind() == "postgres"
}

/// The runtime builder over the store `--store` names; with the node id on a shared store.
async fn store_builder(args: &ServeArgs) -> Result<(RuntimeBuilder, Option<String>), String> {
    if args.node_id.is_some() && !is_postgres_url(&args.store) {
        return Err("--node-id needs a PostgreSQL store (--store postgres://...)".into());
    }
    if args.store == MEMORY_STORE {
        tracing::warn!(
            "--store memory: tasks are kept in this process's memory only; NOTHING survives a restart, a crash or a deploy (use a redb file or PostgreSQL to keep them)"
        );
        return Ok((
            Runtime::builder_with_store(mcp_tasks::store::Store::memory()),
            None,
        ));
    }
    let location = mcp_tasks::admin::Location::parse(&args.store);
    if location.kind() == "unknown" {
        return Err(format!(
            "--store {}: not a store this server can open (a path to a redb file, a postgres:// URL, or `memory`)",
            location.display()
        ));
    }
    if !is_postgres_url(&args.store) {
        let options = mcp_tasks::StoreOptions {
            cache_size: args.cache_size,
            record_cache_size: args.record_cache_size,
            quick_repair: args.quick_repair,
            verify_on_open: args.verify_on_open,
            ..Default::default()
        };
        return Ok((Runtime::builder(&args.store).store_options(options), None));
    }
    #[cfg(feature = "postgres")]
    {
        let options = mcp_tasks::store::PostgresOptions {
            node_id: args.node_id.clone(),
            lease_ttl: args.lease_ttl,
            poll_interval: args.replica_poll,
            unsafe_skip_fencing: args.unsafe_skip_fencing,
            indexer: std::sync::Arc::new(mcp_tasks::TaskIndexer),
            ..Default::default()
        };
        let store = mcp_tasks::store::Store::postgres(&args.store, options)
            .await
            .map_err(|e| e.to_string())?;
        let node = store.node_id().map(str::to_owned);
        tracing::info!(node = node.as_deref(), store = %store.describe(), "serving as a replica over PostgreSQL");
        Ok((Runtime::builder_with_store(store), node))
    }
    #[cfg(not(feature = "postgres"))]
    Err("this build has no PostgreSQL store (cargo feature `postgres`)".into())
}

/// The runtime builder for `serve`: the demo's tool, a fixture set, or a gateway's upstreams.
fn builder(
    args: &ServeArgs,
    builder: RuntimeBuilder,
    node: Option<String>,
    gateway: Option<Arc<mcp_tasks::gateway::Gateway>>,
) -> RuntimeBuilder {
    let builder = builder
        .default_ttl(args.task_ttl.0)
        .expired_retention(args.expired_retention)
        .restart_budget(args.restart_budget)
        .passivate_after(args.passivate_after.0)
        .quotas(args.limits.quotas())
        .flow_limits(args.limits.flow());
    if let Some(gateway) = gateway {
        return builder.tool_source(gateway);
    }
    match args.fixtures {
        None => builder.tool(demo::generate_report(Duration::from_millis(1500))),
        Some(Fixtures::Conformance) => fixtures::conformance::install(builder),
        Some(Fixtures::Bench) => fixtures::bench::install_on_node(builder, node),
        Some(Fixtures::Crash) => mcp_tasks_testkit::sim::install(
            builder,
            args.side_effects
                .clone()
                .unwrap_or_else(|| PathBuf::from("mcp-tasks-side-effects.log")),
        ),
    }
}

/// `mcp-tasks healthcheck`: GET `url`; exit 0 on a 2xx answer, 1 otherwise (with why).
async fn healthcheck(url: &str, timeout: Duration) -> ExitCode {
    let client = match reqwest::Client::builder().timeout(timeout).build() {
        Ok(client) => client,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match client.get(url).send().await {
        Ok(response) => {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            let body = body.trim();
            if status.is_success() {
                println!("{url}: {} {body}", status.as_u16());
                ExitCode::SUCCESS
            } else {
                eprintln!("error: {url}: {} {body}", status.as_u16());
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            let mut why = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                why = format!("{why}: {cause}");
                source = cause.source();
            }
            eprintln!("error: {url}: {why}");
            ExitCode::FAILURE
        }
    }
}

async fn start(
    args: &ServeArgs,
    started: &OnceLock<mcp_tasks::RuntimeHandle>,
) -> Option<(Runtime, Option<mcp_tasks::admin::socket::AdminSocket>)> {
    let gateway = if args.gateway.is_set() {
        if args.fixtures.is_some() {
            eprintln!("error: --fixtures and --upstream both choose the tools; give one");
            return None;
        }
        let started = args
            .gateway
            .upstreams()
            .and_then(|u| mcp_tasks::gateway::Gateway::start(u).map_err(|e| e.to_string()));
        match started {
            Ok(gateway) => {
                let known = gateway.upstreams();
                if let Some((name, _)) = args
                    .limits
                    .upstream_limits()
                    .into_iter()
                    .find(|(name, _)| !known.contains(name))
                {
                    eprintln!(
                        "error: --upstream-max-running {name}=…: no upstream is named `{name}` (the upstreams: {})",
                        known.join(", ")
                    );
                    return None;
                }
                tracing::info!(upstreams = ?known, "serving the tools of upstream MCP servers as durable tasks");
                Some(gateway)
            }
            Err(e) => {
                eprintln!("error: {e}");
                return None;
            }
        }
    } else {
        if !args.limits.upstream_max_running.is_empty() {
            eprintln!(
                "error: --upstream-max-running limits the gateway's upstreams: give them with --upstream or --upstream-command"
            );
            return None;
        }
        None
    };
    let (base, node) = match store_builder(args).await {
        Ok(opened) => opened,
        Err(e) => {
            eprintln!("error: {e}");
            return None;
        }
    };
    match builder(args, base, node, gateway).start().await {
        Ok(runtime) => {
            let _ = started.set(runtime.handle());
            let admin = if args.no_admin_socket {
                None
            } else {
                match runtime.admin_socket() {
                    Ok(socket) => socket,
                    Err(e) => {
                        tracing::warn!(error = %e, "no admin socket: `mcp-tasks store` commands cannot read the store while this server runs");
                        None
                    }
                }
            };
            Some((runtime, admin))
        }
        Err(e) => {
            eprintln!("error: {e}");
            None
        }
    }
}

/// Installs the Prometheus recorder and serves `GET /metrics`, `/healthz` and `/readyz` on
/// `addr` (until aborted); `/readyz` answers 503 until `started` holds the runtime. Returns
/// the task and the address bound.
async fn serve_metrics(
    addr: &str,
    started: Arc<OnceLock<mcp_tasks::RuntimeHandle>>,
) -> Result<(tokio::task::JoinHandle<()>, String), String> {
    use mcp_tasks::telemetry;
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr} for metrics: {e}"))?;
    let local = listener
        .local_addr()
        .map_or_else(|_| addr.to_owned(), |a| a.to_string());
    const SECONDS: &[f64] = &[
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        5.0, 10.0, 30.0,
    ];
    const OPS: &[f64] = &[
        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(telemetry::STORE_COMMIT_BATCH_OPS.into()), OPS)
        })
        .map_err(|e| format!("metrics: {e}"))?
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    telemetry::describe();
    let render = handle.clone();
    let ready = move || ready_once_started(started.clone());
    let app = axum::Router::new()
        .route(http::HEALTHZ, axum::routing::get(http::healthz))
        .route(http::READYZ, axum::routing::get(ready))
        .route(
            "/metrics",
            axum::routing::get(move || {
                let render = render.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        render.render(),
                    )
                }
            }),
        );
    tracing::info!("metrics on http://{local}/metrics");
    let task = tokio::spawn(async move {
        // The exporter's periodic housekeeping (draining histogram buffers), beside the server.
        let upkeep = async {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                handle.run_upkeep();
            }
        };
        tokio::select! {
            () = upkeep => {}
            served = axum::serve(listener, app) => {
                if let Err(e) = served {
                    tracing::error!(error = %e, "the metrics endpoint stopped");
                }
            }
        }
    });
    Ok((task, local))
}

/// Binds `--console-listen`'s address (none without it).
async fn bind_console(addr: Option<&str>) -> Result<Option<tokio::net::TcpListener>, String> {
    match addr {
        Some(addr) => tokio::net::TcpListener::bind(addr)
            .await
            .map(Some)
            .map_err(|e| format!("cannot listen on {addr} for the console: {e}")),
        None => Ok(None),
    }
}

/// The console's server (`--console-listen`), stopped with the runtime.
struct ConsoleServer {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl ConsoleServer {
    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

/// Whether `addr` (a bound listener's address) is a loopback one.
fn is_loopback(listener: &tokio::net::TcpListener) -> bool {
    listener.local_addr().is_ok_and(|a| a.ip().is_loopback())
}

/// Refuses a console on a non-loopback address without authentication, unless `--no-auth`
/// says so (then it warns): anyone who can reach the address would read every tenant's tasks
/// (and, with `--console-actions`, cancel and purge them).
fn check_console_exposure(
    listener: &tokio::net::TcpListener,
    authenticated: bool,
    no_auth: bool,
) -> Result<(), String> {
    if authenticated || is_loopback(listener) {
        return Ok(());
    }
    let addr = listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    if !no_auth {
        return Err(format!(
            "refusing to serve the console on {addr} without authentication: it is not a \
             loopback address, so anyone who can reach it could read every tenant's tasks (and \
             with --console-actions cancel and purge them). Pass --auth-tokens PATH or \
             --auth-jwt-jwks/--auth-jwt-issuer (the console then asks for the same tokens), bind \
             it to 127.0.0.1, or pass --no-auth to serve it to everyone."
        ));
    }
    tracing::warn!(%addr, "serving the console on a non-loopback address WITHOUT authentication (--no-auth)");
    Ok(())
}

/// How the console of `serve` is set up.
struct ConsoleSetup<'a> {
    authenticator: Option<Arc<dyn Authenticator>>,
    actions: bool,
    args: &'a ConsoleArgs,
    allowed_hosts: &'a [String],
    allowed_origins: &'a [String],
    required_scopes: &'a [String],
    throttle: (u32, Duration),
}

/// Serves the operator console of `runtime` on `listener`.
fn serve_console(
    listener: tokio::net::TcpListener,
    runtime: &Runtime,
    setup: ConsoleSetup<'_>,
) -> ConsoleServer {
    let actions = setup.actions;
    let mut console = mcp_tasks::console::Console::new(runtime)
        .actions(actions)
        .required_scopes(setup.required_scopes.iter().cloned())
        .sessions(mcp_tasks::console::SessionPolicy {
            ttl: setup.args.console_session_ttl,
            idle: setup.args.console_session_idle,
        })
        .secure_cookies(setup.args.console_secure_cookie)
        .max_streams_per_principal(setup.args.console_max_streams)
        .login_throttle(setup.throttle.0, setup.throttle.1);
    for host in setup.allowed_hosts {
        console = console.allow_host(host.clone());
    }
    for origin in setup.allowed_origins {
        console = console.allow_origin(origin.clone());
    }
    for proxy in &setup.args.console_trusted_proxies {
        console = console.trusted_proxy(*proxy);
    }
    if let Some(authenticator) = setup.authenticator {
        console = console.authenticator(authenticator);
    }
    let addr = listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    tracing::info!(
        actions,
        "console on http://{addr}/{}",
        if actions { "" } else { " (read-only)" }
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(http::serve(listener, console.router(), async move {
        let _ = stopped.await;
    }));
    ConsoleServer { stop, task }
}

async fn serve_http(
    args: ServeArgs,
    started: &Arc<OnceLock<mcp_tasks::RuntimeHandle>>,
) -> ExitCode {
    if let Err(e) = args.limits.check() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let listener = match tokio::net::TcpListener::bind(args.listen.as_str()).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("error: cannot listen on {}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = match listener.local_addr() {
        Ok(addr) => addr.to_string(),
        Err(_) => args.listen.clone(),
    };
    // Bound before the store opens, so that a taken address is refused at once.
    let console_listener = match bind_console(args.console_listen.as_deref()).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The address serves from now on: the probes answer while the store opens and recovers
    // (`/readyz` 503), and the MCP requests of early clients wait for the router.
    let (router_tx, router_rx) = tokio::sync::watch::channel(None);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(http::serve_with(
        listener,
        front_router(started.clone(), router_rx),
        args.limits.serve_options(),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let stop_serving = |stop_tx: tokio::sync::oneshot::Sender<()>, serving| async move {
        let _ = stop_tx.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), serving).await;
    };
    let Some((runtime, _admin)) = start(&args, started).await else {
        // Requests waiting for the router are answered 503 at once.
        drop(router_tx);
        stop_serving(stop_tx, serving).await;
        return ExitCode::FAILURE;
    };
    let mut config = http::HttpConfig::default();
    config.allowed_origins = args.allowed_origins.clone();
    config.allowed_hosts = args.allowed_hosts.clone();
    config.strict_headers = args.strict_headers;
    config.max_body_bytes = args.limits.max_body_bytes;
    config.max_requests_per_principal = args.limits.max_requests_per_principal;
    config.body_timeout = args.limits.body_timeout;
    config.max_auth_failures = args.http_auth.auth_max_failures;
    config.auth_failure_window = args.http_auth.auth_failure_window;
    let tokens = match configure_auth(&args.http_auth, &addr, &mut config).await {
        Ok(tokens) => tokens,
        Err(e) => {
            eprintln!("error: {e}");
            drop(router_tx);
            stop_serving(stop_tx, serving).await;
            runtime.shutdown().await;
            return ExitCode::FAILURE;
        }
    };
    let console = match console_listener {
        Some(listener) => {
            let authenticator = config
                .authenticator
                .requires_credentials()
                .then(|| config.authenticator.clone());
            if let Err(e) =
                check_console_exposure(&listener, authenticator.is_some(), args.http_auth.no_auth)
            {
                eprintln!("error: {e}");
                drop(router_tx);
                stop_serving(stop_tx, serving).await;
                runtime.shutdown().await;
                return ExitCode::FAILURE;
            }
            let required_scopes = config
                .resource
                .as_ref()
                .map(|r| r.scopes.clone())
                .unwrap_or_default();
            Some(serve_console(
                listener,
                &runtime,
                ConsoleSetup {
                    authenticator,
                    actions: args.console_actions,
                    args: &args.console,
                    allowed_hosts: &args.allowed_hosts,
                    allowed_origins: &args.allowed_origins,
                    required_scopes: &required_scopes,
                    throttle: (
                        args.http_auth.auth_max_failures,
                        args.http_auth.auth_failure_window,
                    ),
                },
            ))
        }
        None => None,
    };
    // Before the router answers: see `reload_on_hangup`.
    let reload = reload_on_hangup(tokens);
    let _ = router_tx.send(Some(http::router(runtime.handle(), config)));
    tracing::info!("listening on http://{addr}/mcp");

    let serving = async move {
        serving
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
    };
    let reloader = tokio::spawn(reload);
    let served = until_signal(&runtime, serving, stop_tx).await;
    reloader.abort();
    if let Some(console) = console {
        // Its live streams end with the runtime's `closing`.
        runtime.begin_shutdown();
        console.stop().await;
    }
    let halted = runtime.halted();
    runtime.shutdown().await;
    if let Some(code) = halted_exit(halted) {
        return code;
    }
    match served {
        Some(Ok(())) | None => ExitCode::SUCCESS,
        Some(Err(e)) => {
            eprintln!("error: serving HTTP on {addr} failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `GET /readyz` before the runtime started (503) and after (the runtime's readiness).
async fn ready_once_started(
    started: Arc<OnceLock<mcp_tasks::RuntimeHandle>>,
) -> axum::response::Response {
    match started.get() {
        // The tool sources' state (a gateway's upstreams) in the body: a down upstream does
        // not make the server unready, since it still serves its tasks.
        Some(runtime) => {
            http::readiness_report(runtime.ready().await, &runtime.tool_sources_readiness())
        }
        None => http::readiness_response(Err(
            "starting: the store is opening or recovering".to_owned()
        )),
    }
}

/// What the MCP address serves from the moment it is bound: `/healthz`, `/readyz` (503 until
/// `started` holds the runtime, then the runtime's readiness), and every other request handed to
/// the MCP router once `router` holds it (a request that arrives while the store opens or
/// recovers waits for it, as it would in the listen backlog).
fn front_router(
    started: Arc<OnceLock<mcp_tasks::RuntimeHandle>>,
    router: tokio::sync::watch::Receiver<Option<axum::Router>>,
) -> axum::Router {
    use tower_service::Service as _;
    let ready = move || ready_once_started(started.clone());
    let forward = move |request: axum::extract::Request| {
        let mut router = router.clone();
        async move {
            let mcp = match router.wait_for(Option::is_some).await {
                Ok(mcp) => mcp.clone(),
                Err(_) => None,
            };
            match mcp {
                Some(mut mcp) => match mcp.call(request).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                },
                None => http::readiness_response(Err("shutting down".to_owned())),
            }
        }
    };
    axum::Router::new()
        .route(http::HEALTHZ, axum::routing::get(http::healthz))
        .route(http::READYZ, axum::routing::get(ready))
        .fallback(forward)
}

async fn serve_stdio(args: ServeArgs, started: &OnceLock<mcp_tasks::RuntimeHandle>) -> ExitCode {
    let owner = match args.principal.as_deref().map(parse_principal).transpose() {
        Ok(owner) => owner.unwrap_or_else(Owner::anonymous),
        Err(e) => {
            eprintln!("error: --principal: {e}");
            return ExitCode::FAILURE;
        }
    };
    let console_listener = match bind_console(args.console_listen.as_deref()).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some((runtime, _admin)) = start(&args, started).await else {
        return ExitCode::FAILURE;
    };
    // Over stdio there is no HTTP authentication: the console has none either, so it is
    // served on a loopback address only.
    if let Some(listener) = &console_listener
        && let Err(e) = check_console_exposure(listener, false, false)
    {
        eprintln!("error: {e}");
        runtime.shutdown().await;
        return ExitCode::FAILURE;
    }
    let console = console_listener.map(|listener| {
        serve_console(
            listener,
            &runtime,
            ConsoleSetup {
                authenticator: None,
                actions: args.console_actions,
                args: &args.console,
                allowed_hosts: &[],
                allowed_origins: &[],
                required_scopes: &[],
                throttle: (
                    args.http_auth.auth_max_failures,
                    args.http_auth.auth_failure_window,
                ),
            },
        )
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = stdio::serve_with_shutdown(
        runtime.handle(),
        owner,
        tokio::io::stdin(),
        tokio::io::stdout(),
        async move {
            let _ = stop_rx.await;
        },
    );
    let served = until_signal(&runtime, serving, stop_tx).await;
    runtime.begin_shutdown();
    if let Some(console) = console {
        console.stop().await;
    }
    let halted = runtime.halted();
    runtime.shutdown().await;
    if let Some(code) = halted_exit(halted) {
        return code;
    }
    match served {
        Some(Ok(())) | None => ExitCode::SUCCESS,
        Some(Err(e)) => {
            eprintln!("error: serving stdio failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The exit status after the store halted on a failed fsync (fail-stop): 74 (`EX_IOERR`), so
/// that a service manager restarts the process and redb recovers from what is on disk.
fn halted_exit(halted: Option<String>) -> Option<ExitCode> {
    let detail = halted?;
    eprintln!(
        "error: the task store stopped after a failed fsync ({detail}); exiting so that the process is restarted"
    );
    Some(ExitCode::from(74))
}

/// Serves until the transport ends, a signal arrives or the store halts (a failed fsync); then
/// ends listen streams, tells the transport to stop and waits for it (a second signal stops
/// waiting: `None`).
async fn until_signal<T>(
    runtime: &Runtime,
    serving: impl Future<Output = T>,
    stop: tokio::sync::oneshot::Sender<()>,
) -> Option<T> {
    let mut serving = std::pin::pin!(serving);
    tokio::select! {
        served = &mut serving => Some(served),
        () = shutdown_signal() => {
            tracing::info!("shutting down: finishing the requests in flight");
            runtime.begin_shutdown();
            let _ = stop.send(());
            finish(serving).await
        }
        detail = runtime.wait_halted() => {
            tracing::error!(%detail, "the task store halted after a failed fsync; stopping the server");
            runtime.begin_shutdown();
            let _ = stop.send(());
            finish(serving).await
        }
    }
}

async fn finish<T>(serving: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        done = serving => Some(done),
        () = shutdown_signal() => {
            tracing::warn!("second signal: not waiting for the requests in flight");
            None
        }
    }
}

/// Ctrl-C, or SIGTERM on Unix.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    () = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
}

/// `TENANT/PRINCIPAL` (the principal may itself contain `/`).
fn parse_principal(s: &str) -> Result<Owner, String> {
    let (tenant, principal) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}` is not TENANT/PRINCIPAL"))?;
    auth::check_owner(tenant, principal)?;
    Ok(Owner::new(tenant, principal))
}

/// Sets the authenticator and resource metadata of `config` from the command line; refuses a
/// non-loopback address without any. Returns the token file to reload on SIGHUP.
async fn configure_auth(
    args: &HttpAuthArgs,
    addr: &str,
    config: &mut http::HttpConfig,
) -> Result<Option<Arc<auth::StaticTokens>>, String> {
    let resource_url = args
        .resource_url
        .clone()
        .unwrap_or_else(|| format!("http://{addr}{}", config.path));
    let mut resource = auth::ProtectedResource::new(resource_url.clone());
    for scope in &args.auth_scopes {
        resource = resource.scope(scope.clone());
    }
    let mut verifiers: Vec<Arc<dyn Authenticator>> = Vec::new();
    let mut tokens = None;
    if let Some(path) = &args.auth_tokens {
        let loaded = Arc::new(auth::StaticTokens::load(path).map_err(|e| e.to_string())?);
        tracing::info!(path = %path.display(), tokens = loaded.len(), "bearer tokens loaded");
        verifiers.push(loaded.clone());
        tokens = Some(loaded);
    }
    if let (Some(jwks), Some(issuer)) = (&args.auth_jwt_jwks, &args.auth_jwt_issuer) {
        if args.resource_url.is_none() && args.auth_jwt_audience.is_none() {
            tracing::warn!(audience = %resource_url, "no --resource-url: JWTs must be issued for this guessed URI");
        }
        let audience = args.auth_jwt_audience.clone().unwrap_or(resource_url);
        let mut jwt = auth::JwtConfig::new(auth::JwksSource::parse(jwks), issuer, audience);
        if !args.auth_jwt_algorithms.is_empty() {
            let algorithms = args
                .auth_jwt_algorithms
                .iter()
                .map(|a| {
                    a.parse::<auth::JwtAlgorithm>()
                        .map_err(|_| format!("--auth-jwt-algorithm: unknown algorithm `{a}`"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            jwt = jwt.algorithms(algorithms);
        }
        if let Some(claim) = &args.auth_jwt_tenant_claim {
            jwt = jwt.tenant_claim(claim.clone());
        }
        let verifier = auth::JwtVerifier::new(jwt)
            .await
            .map_err(|e| e.to_string())?;
        resource = resource.authorization_server(issuer.clone());
        verifiers.push(Arc::new(verifier));
    }
    let loopback = addr
        .parse::<std::net::SocketAddr>()
        .is_ok_and(|a| a.ip().is_loopback());
    if verifiers.is_empty() {
        if !loopback && !args.no_auth {
            return Err(format!(
                "refusing to serve {addr} without authentication: it is not a loopback address, so \
                 anyone who can reach it could read, answer and cancel every task. Pass \
                 --auth-tokens PATH or --auth-jwt-jwks/--auth-jwt-issuer, or --no-auth to serve \
                 everyone as one anonymous principal."
            ));
        }
        if !loopback {
            tracing::warn!(%addr, "serving a non-loopback address WITHOUT authentication (--no-auth)");
        }
        return Ok(None);
    }
    config.authenticator = if verifiers.len() == 1 {
        verifiers.remove(0)
    } else {
        Arc::new(auth::Chain::new(verifiers))
    };
    config.resource = Some(resource);
    Ok(tokens)
}

/// Reloads the token file on every SIGHUP (the returned future runs until aborted). The
/// handler is installed when this is called, not when the future first runs: called before
/// the server answers, so that a SIGHUP sent as soon as it answers reloads instead of ending
/// the process (the signal's default action).
fn reload_on_hangup(
    tokens: Option<Arc<auth::StaticTokens>>,
) -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let hangups = tokens.map(|tokens| {
        use tokio::signal::unix::{SignalKind, signal};
        (tokens, signal(SignalKind::hangup()))
    });
    #[cfg(not(unix))]
    let _ = tokens;
    async move {
        #[cfg(unix)]
        match hangups {
            Some((tokens, Ok(mut hup))) => {
                while hup.recv().await.is_some() {
                    match tokens.reload().await {
                        Ok(n) => tracing::info!(tokens = n, "SIGHUP: bearer tokens reloaded"),
                        Err(e) => {
                            tracing::error!(error = %e, "SIGHUP: the token file was not reloaded; the previous tokens stay in force")
                        }
                    }
                }
            }
            Some((_, Err(e))) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP: tokens will not be reloaded")
            }
            None => {}
        }
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The metrics address answers `/readyz` with 503 until the runtime started (recovery
    /// done), then 200; `/healthz` with 200 throughout.
    #[tokio::test]
    async fn the_metrics_address_is_ready_once_the_runtime_started() {
        let started = Arc::new(OnceLock::new());
        let (task, addr) = serve_metrics("127.0.0.1:0", started.clone()).await.unwrap();
        let get = |path: &str| {
            let url = format!("http://{addr}{path}");
            async move {
                let r = reqwest::get(url).await.unwrap();
                (r.status().as_u16(), r.text().await.unwrap())
            }
        };
        assert_eq!(get("/healthz").await, (200, "ok\n".to_owned()));
        assert_eq!(
            get("/readyz").await,
            (
                503,
                "not ready: starting: the store is opening or recovering\n".to_owned()
            )
        );
        let runtime = Runtime::builder_with_store(mcp_tasks::store::Store::memory())
            .start()
            .await
            .unwrap();
        started.set(runtime.handle()).ok().unwrap();
        assert_eq!(get("/readyz").await, (200, "ready\n".to_owned()));
        assert_eq!(get("/metrics").await.0, 200);
        task.abort();
        runtime.shutdown().await;
    }

    /// Every serve option (but the hidden test-only ones) has its environment variable,
    /// `MCP_TASKS_` and its long name (`--max-body-bytes`: `MCP_TASKS_MAX_BODY_BYTES`).
    #[test]
    fn every_serve_option_has_its_environment_variable() {
        use clap::CommandFactory;
        let mut command = Cli::command();
        command.build();
        let serve = command.find_subcommand("serve").unwrap();
        let mut checked = 0;
        for arg in serve.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if arg.is_hide_set() || matches!(long, "help" | "version") {
                continue;
            }
            let want = format!("MCP_TASKS_{}", long.to_uppercase().replace('-', "_"));
            assert_eq!(
                arg.get_env().and_then(|e| e.to_str()),
                Some(want.as_str()),
                "--{long}"
            );
            checked += 1;
        }
        assert!(checked > 40, "{checked}");
    }

    #[test]
    fn ttls_are_durations_or_none() {
        assert!(parse_ttl("15").unwrap_err().contains("needs a unit"));
        assert!(matches!(parse_ttl("none"), Ok(Ttl(None))));
        assert!(matches!(parse_ttl("30s"), Ok(Ttl(Some(d))) if d == Duration::from_secs(30)));
        assert!(parse_ttl("0s").is_err());
    }
}
