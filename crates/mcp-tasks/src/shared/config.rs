//! The tunables of a runtime.

use std::time::Duration;

use crate::limits::Limits;
use crate::wire::ServerInfo;
use crate::wire::results::CacheHints;

/// Tunables of a runtime. `Default` gives production values.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RuntimeConfig {
    /// The server's name and version (`_meta["io.modelcontextprotocol/serverInfo"]`).
    pub server_info: ServerInfo,
    /// The `instructions` of `server/discover`.
    pub instructions: Option<String>,
    /// Time to live of a task from its creation (a tool may override it); `None` is unlimited.
    /// Past it a live task is failed ("Task has expired") and every task answers `-32602
    /// "Task has expired"`. Default 15 minutes (`serve --task-ttl`).
    pub default_ttl: Option<Duration>,
    /// The `pollIntervalMs` suggested to clients.
    pub poll_interval: Duration,
    /// How long a task stays stored after its expiry (answering "expired") before the reaper
    /// deletes it; a finished task is therefore kept `ttl + retention` after its creation.
    /// Default 1 hour (`serve --expired-retention`).
    pub expired_retention: Duration,
    /// How long a working task's tool may take to honour a cancellation request before it is
    /// stopped and the task marked `cancelled`.
    pub cancel_grace: Duration,
    /// Runs of a `working` task's tool that may end in a crash, a kill or a panic without
    /// progress (a new step or input request) before the task is marked `failed`: its tool is
    /// started at most `1 + restart_budget` times in a row without progress. The count is
    /// persisted in the task (`TaskRecord::attempts`), so it holds across process restarts; a
    /// clean shutdown and a store failure do not count. Default 3.
    pub restart_budget: u32,
    /// First restart delay; doubles with every further failure (capped at 30 s).
    pub restart_backoff: Duration,
    /// How long a task may wait for input with its actor before the actor is *passivated*:
    /// stopped with its tool's future, the task kept as a small parked entry (its committed
    /// state is in the store; reads and listens are served from there). A `tasks/update`, a
    /// `tasks/cancel` or its expiry brings it back: the supervisor starts its actor from the
    /// stored record and the tool runs again from its start,
    /// its recorded steps and answered inputs returning their recorded values (as after a
    /// restart: steps are at-least-once, the code between them runs again). At start-up a
    /// task stored waiting for input is parked at once instead of started. `None` never
    /// passivates. A tool whose task keeps working while it waits opts out with
    /// [`crate::tool::ToolDescriptor::stay_active_while_waiting`]. Default 30 s
    /// (`serve --passivate-after`).
    pub passivate_after: Option<Duration>,
    /// How often the expiry reaper looks at the expiry index.
    pub reaper_interval: Duration,
    /// The cache hints of `server/discover` and list results.
    pub cache_hints: CacheHints,
    /// Size limits per call and per task (see [`Limits`] for the defaults).
    pub limits: Limits,
    /// Per-owner limits on live tasks, creation rate and listens. The default here is
    /// [`crate::quota::Quotas::unlimited`]: an embedder decides; `mcp-tasks serve` uses
    /// [`crate::quota::Quotas::default`], the limits recommended for a shared server.
    pub quotas: crate::quota::Quotas,
    /// Flow control: limits on running tasks that queue instead of refusing (none by
    /// default; see [`crate::quota::FlowLimits`]).
    pub flow: crate::quota::FlowLimits,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            server_info: ServerInfo::default(),
            instructions: None,
            default_ttl: Some(Duration::from_secs(15 * 60)),
            poll_interval: Duration::from_secs(1),
            expired_retention: Duration::from_secs(60 * 60),
            cancel_grace: Duration::from_secs(10),
            restart_budget: 3,
            restart_backoff: Duration::from_millis(100),
            passivate_after: Some(Duration::from_secs(30)),
            reaper_interval: Duration::from_secs(1),
            cache_hints: CacheHints::default(),
            limits: Limits::default(),
            quotas: crate::quota::Quotas::unlimited(),
            flow: crate::quota::FlowLimits::none(),
        }
    }
}
