//! The embedding API: start a runtime on a redb file with a set of tools, hand it JSON-RPC
//! messages, shut it down.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorRef};
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::actor::{Supervisor, SupervisorMsg};
use crate::catalog::{
    Catalog, CatalogError, Completer, CompletionRef, Prompt, Resource, ResourceTemplate,
};
use crate::clock::{Clock, SystemClock};
use crate::protocol::{Dispatched, Dispatcher, Reply, RequestContext};
pub use crate::shared::RuntimeConfig;
use crate::shared::request_state::{KEY_META, RequestStateCodec};
use crate::shared::{LiveTasks, Shared, TaskMsg};
#[cfg(feature = "redb")]
use crate::store::BackendFactory;
use crate::store::{Store, StoreError, StoreOptions, WriteOp};
use crate::task::Owner;
use crate::tool::RegistryError;
use crate::tool::{Tool, ToolRegistry, ToolSet, ToolSource};
use crate::wire::ServerInfo;

/// Why a runtime did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The store could not be opened (a path, a lock held by another process, a corrupt or
    /// newer file, an unreachable database) or failed while the live tasks were read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A tool could not be registered: a duplicate or invalid name, an invalid `inputSchema`.
    #[error(transparent)]
    Tool(#[from] RegistryError),
    /// A prompt, resource, template or completer could not be registered.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The actor system could not spawn the supervisor.
    #[error("the supervisor did not start: {0}")]
    Supervisor(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The supervisor stopped while it rehydrated the stored live tasks (the log names the
    /// task and the cause).
    #[error("the supervisor did not start: it stopped while rehydrating the stored tasks")]
    SupervisorStopped,
}

/// Builds a [`Runtime`]: its store, tools, prompts and resources, and configuration.
///
/// Made by [`Runtime::builder`] (a redb file) or [`Runtime::builder_with_store`] (a store
/// the caller opened); nothing happens until [`RuntimeBuilder::start`], which reports every
/// registration error at once as a [`StartError`].
///
/// ```
/// use std::time::Duration;
///
/// use mcp_tasks::quota::Quotas;
/// use mcp_tasks::tool::{tool_fn, CallToolResult, TaskPolicy, ToolDescriptor};
/// use mcp_tasks::{Runtime, StartError};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let report = || {
///     tool_fn(
///         ToolDescriptor::new("report", "Builds the monthly report.").task_policy(TaskPolicy::Always),
///         |_ctx, _args| async { Ok(CallToolResult::text("done")) },
///     )
/// };
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("tasks.redb");
///
/// // Two tools with one name: `start` refuses, and nothing keeps the file open.
/// let refused = Runtime::builder(&path).tool(report()).tool(report()).start().await;
/// assert!(matches!(refused, Err(StartError::Tool(_))));
///
/// let runtime = Runtime::builder(&path)
///     .server_info("reports", "1.2.0")
///     // Tasks are kept an hour after creation unless the client asks for less.
///     .default_ttl(Some(Duration::from_secs(3600)))
///     // A tool that keeps crashing its task is restarted at most twice in a row.
///     .restart_budget(2)
///     // The per-principal limits recommended for a server several users share.
///     .quotas(Quotas::default())
///     .tool(report())
///     .start()
///     .await?;
/// assert_eq!(runtime.config().restart_budget, 2);
/// runtime.shutdown().await;
/// # Ok(())
/// # }
/// ```
pub struct RuntimeBuilder {
    path: PathBuf,
    tools: Vec<Arc<dyn Tool>>,
    sources: Vec<Arc<dyn ToolSource>>,
    catalog: Catalog,
    /// The first catalog entry that could not be added; `start` reports it.
    catalog_error: Option<CatalogError>,
    config: RuntimeConfig,
    store_options: StoreOptions,
    #[cfg(feature = "redb")]
    backend: Option<BackendFactory>,
    /// A store opened by the caller (in memory, PostgreSQL, a host's own backend).
    store: Option<Store>,
    clock: Arc<dyn Clock>,
    /// Whether `clock` is used as is, also on a shared store ([`RuntimeBuilder::clock`]).
    clock_as_is: bool,
}

impl RuntimeBuilder {
    /// Registers a tool (names must be unique; [`RuntimeBuilder::start`] fails otherwise).
    pub fn tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.push(tool);
        self
    }

    /// Registers several tools.
    pub fn tools(mut self, tools: impl IntoIterator<Item = Arc<dyn Tool>>) -> Self {
        self.tools.extend(tools);
        self
    }

    /// Serves the tools of a [`ToolSource`] beside the registered ones: tools that change
    /// while the runtime runs, such as a gateway's upstream servers
    /// (`mcp_tasks::gateway::Gateway`). A registered tool hides a source's tool of the same
    /// name.
    pub fn tool_source(mut self, source: Arc<dyn ToolSource>) -> Self {
        self.sources.push(source);
        self
    }

    /// Serves a prompt (`prompts/list`, `prompts/get`).
    pub fn prompt(mut self, prompt: Arc<dyn Prompt>) -> Self {
        self.catalog.add_prompt(prompt);
        self
    }

    /// Serves a resource (`resources/list`, `resources/read`).
    pub fn resource(mut self, resource: Resource) -> Self {
        self.catalog.add_resource(resource);
        self
    }

    /// Lists a resource template (`resources/templates/list`); with a reader, the URIs it
    /// matches are readable (`resources/read`). A template with a reader that cannot be
    /// matched makes [`RuntimeBuilder::start`] fail.
    pub fn resource_template(mut self, template: ResourceTemplate) -> Self {
        if let Err(e) = self.catalog.add_template(template) {
            self.catalog_error.get_or_insert(e);
        }
        self
    }

    /// Serves `completion/complete` for a prompt's arguments or a template's variables (and
    /// advertises the `completions` capability). The prompt or template must be registered
    /// too, or [`RuntimeBuilder::start`] fails.
    pub fn completion(mut self, reference: CompletionRef, completer: Completer) -> Self {
        self.catalog.add_completer(reference, completer);
        self
    }

    /// Replaces the whole configuration.
    pub fn config(mut self, config: RuntimeConfig) -> Self {
        self.config = config;
        self
    }

    /// Sets [`RuntimeConfig::default_ttl`] (the `ttlMs` of new tasks; `None` = unlimited).
    pub fn default_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.config.default_ttl = ttl;
        self
    }

    /// Sets [`RuntimeConfig::restart_budget`].
    pub fn restart_budget(mut self, budget: u32) -> Self {
        self.config.restart_budget = budget;
        self
    }

    /// Sets [`RuntimeConfig::passivate_after`] (`None`: task actors are never passivated).
    pub fn passivate_after(mut self, after: Option<Duration>) -> Self {
        self.config.passivate_after = after;
        self
    }

    /// Sets [`RuntimeConfig::expired_retention`].
    pub fn expired_retention(mut self, retention: Duration) -> Self {
        self.config.expired_retention = retention;
        self
    }

    /// Sets the per-owner quotas (see [`crate::quota`]).
    pub fn quotas(mut self, quotas: crate::quota::Quotas) -> Self {
        self.config.quotas = quotas;
        self
    }

    /// Lets at most `n` tasks of `tool` run at once (`"*"`: of all tools together); more
    /// wait in a queue, `working` with `statusMessage` `queued: N ahead`, and run when a slot
    /// frees (see [`crate::quota::FlowLimits`]). Takes precedence over the tool's own
    /// [`ToolDescriptor::max_running`](method@crate::tool::ToolDescriptor::max_running). `0` is taken as 1.
    pub fn max_running(mut self, tool: impl Into<String>, n: u32) -> Self {
        let tool = tool.into();
        let n = n.max(1);
        if tool == "*" {
            self.config.flow.all_tools = Some(n);
        } else {
            self.config.flow.per_tool.insert(tool, n);
        }
        self
    }

    /// Lets at most `n` tasks of one owner (tenant and principal) run at once, over all
    /// tools; more wait queued. Freed slots go to the owners with queued work in turn. `0` is
    /// taken as 1.
    pub fn max_running_per_owner(mut self, n: u32) -> Self {
        self.config.flow.per_owner = Some(n.max(1));
        self
    }

    /// Lets at most `per_second` tasks of `tool` start per second (a token bucket of one
    /// token: in any span of `T` seconds at most `per_second × T + 1` start); more wait
    /// queued (see [`crate::quota::FlowLimits::max_starts`]). A rate that is not a positive
    /// finite number is ignored, with a warning.
    pub fn max_starts(mut self, tool: impl Into<String>, per_second: f64) -> Self {
        let tool = tool.into();
        if per_second.is_finite() && per_second > 0.0 {
            self.config.flow.max_starts.insert(tool, per_second);
        } else {
            tracing::warn!(%tool, per_second, "ignoring a start rate that is not a positive number");
        }
        self
    }

    /// Lets at most `n` tasks of the tools in flow group `group` run at once, together
    /// ([`ToolDescriptor::flow_group`](method@crate::tool::ToolDescriptor::flow_group); the
    /// gateway's groups are `upstream:NAME`). `0` is taken as 1.
    pub fn max_running_group(mut self, group: impl Into<String>, n: u32) -> Self {
        self.config.flow.per_group.insert(group.into(), n.max(1));
        self
    }

    /// Sets every flow-control limit at once (replacing those set before).
    pub fn flow_limits(mut self, limits: crate::quota::FlowLimits) -> Self {
        self.config.flow = limits;
        self
    }

    /// Sets the server's name and version (`serverInfo`).
    pub fn server_info(mut self, name: impl Into<String>, version: impl Into<String>) -> Self {
        self.config.server_info = ServerInfo::new(name, version);
        self
    }

    /// Sets the store options (durability, group commit, open checks). Their
    /// [`StoreOptions::indexer`] may stay the default: a store the runtime opens indexes old
    /// records with [`crate::persist::TaskIndexer`] unless the options name an indexer that
    /// reads records.
    pub fn store_options(mut self, options: StoreOptions) -> Self {
        self.store_options = options;
        self
    }

    #[cfg(feature = "redb")]
    /// Keeps the store on a redb [`redb::StorageBackend`] made by `factory` instead of the file
    /// (simulated disks and fault injection; see [`Store::open_with_backend`]). The builder's
    /// path then only names the store in errors and logs.
    pub fn store_backend(mut self, factory: BackendFactory) -> Self {
        self.backend = Some(factory);
        self
    }

    /// Replaces the wall clock (tests and simulations). It is used as is, also on a store
    /// shared by replicas: the runtime then does not use the store's clock (see
    /// [`RuntimeBuilder::local_clock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self.clock_as_is = true;
        self
    }

    /// Replaces this replica's local wall clock (tests of clock skew) and keeps what the
    /// runtime does with the system clock: on a store shared by replicas, every decision
    /// about time (timestamps, expiry, the reaper, retention) uses the store's clock (the
    /// database's, measured at each heartbeat), and the local clock only tells how far off
    /// it is ([`crate::clock::StoreClock`]: a warning beyond
    /// [`crate::clock::CLOCK_SKEW_WARNING`]). On a store owned by one process it is the
    /// clock.
    pub fn local_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self.clock_as_is = false;
        self
    }

    /// Opens the store, rehydrates every live task (done when this returns) and starts the
    /// expiry reaper.
    pub async fn start(self) -> Result<Runtime, StartError> {
        if let Some(e) = self.catalog_error {
            return Err(e.into());
        }
        self.catalog.check()?;
        let descriptor_limits = self
            .tools
            .iter()
            .any(|t| t.descriptor().max_running.is_some());
        let mut fixed = ToolSet::new();
        for tool in self.tools {
            fixed.register(tool)?;
        }
        let tools = ToolRegistry::new(fixed, self.sources);
        #[cfg(feature = "redb")]
        let store_options = {
            let mut options = self.store_options;
            if !options.indexer.reads_records() {
                options.indexer = crate::persist::task_indexer();
            }
            options
        };
        #[cfg(feature = "redb")]
        let store = match (self.store, self.backend) {
            (Some(store), _) => store,
            (None, Some(factory)) => {
                Store::open_with_backend_async(self.path.clone(), factory, store_options).await?
            }
            (None, None) => Store::open_async(self.path.clone(), store_options).await?,
        };
        #[cfg(not(feature = "redb"))]
        let store = match self.store {
            Some(store) => store,
            None => {
                let _ = self.store_options;
                return Err(StoreError::Open {
                    path: self.path.clone(),
                    detail: "this build has no redb store (cargo feature `redb`); start the runtime with Runtime::builder_with_store".into(),
                }
                .into());
            }
        };
        tracing::info!(store = %store.describe(), epoch = store.boot_epoch(), node = store.node_id(), "store open");
        let key = match request_state_key(&store).await {
            Ok(key) => key,
            Err(e) => {
                store.close().await;
                return Err(e.into());
            }
        };
        let previous_run_crashed = match previous_run_crashed(&store).await {
            Ok(crashed) => crashed,
            Err(e) => {
                store.close().await;
                return Err(e.into());
            }
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let store_clock = match store.cluster().and_then(|c| c.reference_clock()) {
            Some(reference) if !self.clock_as_is => Some(Arc::new(crate::clock::StoreClock::new(
                self.clock.clone(),
                reference,
            ))),
            _ => None,
        };
        let clock: Arc<dyn Clock> = match &store_clock {
            Some(c) => {
                // Read once now: a replica whose clock is off says so at start.
                let _ = c.now_ms();
                c.clone()
            }
            None => self.clock,
        };
        let shared = Arc::new(Shared {
            store: store.clone(),
            tools,
            clock,
            config: self.config.clone(),
            live: LiveTasks::default(),
            capabilities: Default::default(),
            catalog: self.catalog,
            request_state: RequestStateCodec::new(key),
            closing: stop_rx.clone(),
            quotas: Arc::new(crate::quota::QuotaTracker::new(self.config.quotas.clone())),
            changes: Default::default(),
            recovery: Default::default(),
            flow: crate::shared::flow::Flow::new(self.config.flow.clone(), descriptor_limits),
        });
        // On a shared store the limits hold for the cluster (rounds in the store).
        shared.flow.start_cluster(store.clone(), stop_rx.clone());
        let (supervisor, supervisor_task) = match Actor::spawn(
            None,
            Supervisor {
                shared: shared.clone(),
                previous_run_crashed,
            },
            (),
        )
        .await
        {
            Ok(spawned) => spawned,
            Err(e) => {
                store.close().await;
                return Err(StartError::Supervisor(Box::new(e)));
            }
        };
        // The supervisor rehydrates in `post_start`; it answers messages only after that.
        if supervisor.call(SupervisorMsg::Ready, None).await.is_err() {
            store.close().await;
            return Err(StartError::SupervisorStopped);
        }
        let reaper = tokio::spawn(reap(shared.clone(), supervisor.clone(), stop_rx.clone()));
        let takeover = tokio::spawn(take_over(
            shared.clone(),
            supervisor.clone(),
            stop_rx.clone(),
        ));
        let dispatcher = Arc::new(Dispatcher {
            shared,
            supervisor: supervisor.clone(),
        });
        // On a shared store: requests other nodes recorded for this node's tasks.
        let inbox = tokio::spawn(dispatcher.clone().serve_inbox(stop_rx));
        Ok(Runtime {
            dispatcher,
            store_clock,
            parts: Some(Parts {
                supervisor,
                supervisor_task,
                reaper,
                takeover,
                inbox,
                stop: stop_tx,
            }),
        })
    }
}

/// A running mcp-tasks runtime. Several can live in one process (on different files).
///
/// A transport hands it JSON-RPC messages with the caller's [`Owner`]
/// ([`Runtime::handle_message`], or [`RuntimeHandle::dispatch`] for streamed answers); the
/// HTTP and stdio transports in [`crate::transport`] do exactly that.
///
/// ```
/// use mcp_tasks::store::Store;
/// use mcp_tasks::tool::{tool_fn, CallToolResult, ToolDescriptor};
/// use mcp_tasks::{Owner, Runtime};
/// use serde_json::json;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let runtime = Runtime::builder_with_store(Store::memory())
///     .tool(tool_fn(ToolDescriptor::new("ping", "Answers pong."), |_ctx, _args| async {
///         Ok(CallToolResult::text("pong"))
///     }))
///     .start()
///     .await?;
/// // Every request of the stateless protocol names its version and the client's capabilities.
/// let meta = json!({
///     "io.modelcontextprotocol/protocolVersion": "2026-07-28",
///     "io.modelcontextprotocol/clientCapabilities": {}
/// });
/// let request = json!({
///     "jsonrpc": "2.0", "id": 1, "method": "tools/call",
///     "params": { "name": "ping", "arguments": {}, "_meta": meta }
/// });
/// let reply = runtime.handle_json(request, &Owner::anonymous()).await.expect("a response");
/// assert_eq!(reply["result"]["content"][0]["text"], "pong");
/// runtime.shutdown().await;
/// # Ok(())
/// # }
/// ```
///
/// Dropping it without [`Runtime::shutdown`] stops its actors and reaper in the background
/// (like a crash of the server: nothing acknowledged is lost); the store file is released once
/// they are gone.
pub struct Runtime {
    dispatcher: Arc<Dispatcher>,
    /// The store's clock the runtime decides by, on a shared store.
    store_clock: Option<Arc<crate::clock::StoreClock>>,
    parts: Option<Parts>,
}

struct Parts {
    supervisor: ActorRef<SupervisorMsg>,
    supervisor_task: JoinHandle<()>,
    reaper: JoinHandle<()>,
    takeover: JoinHandle<()>,
    inbox: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(parts) = self.parts.take() {
            let _ = parts.stop.send(true);
            parts.reaper.abort();
            parts.takeover.abort();
            parts.inbox.abort();
            parts
                .supervisor
                .stop_children(Some("runtime dropped".into()));
            parts.supervisor.stop(Some("runtime dropped".into()));
        }
    }
}

impl Runtime {
    /// A builder for a runtime whose store is the redb file at `path` (created if missing).
    /// Needs the feature `redb` (default): without it [`RuntimeBuilder::start`] answers
    /// [`StoreError::Open`]; use [`Runtime::builder_with_store`].
    pub fn builder(path: impl AsRef<Path>) -> RuntimeBuilder {
        RuntimeBuilder {
            path: path.as_ref().to_owned(),
            store: None,
            tools: Vec::new(),
            sources: Vec::new(),
            catalog: Catalog::default(),
            catalog_error: None,
            config: RuntimeConfig::default(),
            store_options: StoreOptions::default(),
            #[cfg(feature = "redb")]
            backend: None,
            clock: Arc::new(SystemClock),
            clock_as_is: false,
        }
    }

    /// A builder for a runtime over a store the caller opened: [`Store::memory`], a
    /// PostgreSQL store shared by replicas (feature `postgres`), or a host's own
    /// [`crate::store::TaskStore`]. The runtime closes it on shutdown.
    pub fn builder_with_store(store: Store) -> RuntimeBuilder {
        let mut builder = Runtime::builder(store.describe());
        builder.store = Some(store);
        builder
    }

    /// A cheap handle that transports use to dispatch messages concurrently.
    pub fn handle(&self) -> RuntimeHandle {
        RuntimeHandle {
            dispatcher: self.dispatcher.clone(),
        }
    }

    /// Handles one raw JSON-RPC message from `owner`. `None` for a notification.
    pub async fn handle_message(&self, message: &[u8], owner: &Owner) -> Option<Reply> {
        self.handle().handle_message(message, owner).await
    }

    /// Handles one JSON-RPC message given as JSON; returns the response body.
    pub async fn handle_json(&self, message: Value, owner: &Owner) -> Option<Value> {
        self.handle().handle_json(message, owner).await
    }

    /// The runtime's configuration.
    pub fn config(&self) -> &RuntimeConfig {
        &self.dispatcher.shared.config
    }

    /// The number of tasks with a running actor.
    pub fn live_tasks(&self) -> usize {
        self.dispatcher.shared.live.len()
    }

    /// The number of live tasks parked without an actor while they wait for input (see
    /// [`RuntimeConfig::passivate_after`]).
    pub fn parked_tasks(&self) -> usize {
        self.dispatcher.shared.live.parked()
    }

    /// Why the task store stopped accepting writes, if it did: after a failed fsync the store
    /// halts for good (nothing acknowledged is lost, nothing more is written) and the server
    /// must be restarted. `None` while it works.
    pub fn halted(&self) -> Option<String> {
        self.dispatcher.shared.store.halted()
    }

    /// Resolves with the reason once the task store halts (see [`Runtime::halted`]); a
    /// server selects on it to stop instead of answering every write with an error.
    pub async fn wait_halted(&self) -> String {
        self.dispatcher.shared.store.wait_halted().await
    }

    /// The runtime's store, for the crate's own administration (the admin socket answers
    /// read-only commands from it).
    pub(crate) fn shared_store(&self) -> &Store {
        &self.dispatcher.shared.store
    }

    /// Starts the admin socket beside the runtime's redb store (`<store>.admin.sock`), through
    /// which `mcp-tasks store stats|list|show|verify|backup` read the store while this runtime
    /// holds it. `Ok(None)` for other stores. Keep the returned guard: dropping it closes the
    /// socket and removes its file.
    pub fn admin_socket(
        &self,
    ) -> Result<Option<crate::admin::socket::AdminSocket>, crate::admin::AdminError> {
        crate::admin::socket::serve_store(self.shared_store())
    }

    /// How far this replica's clock is ahead of the shared store's (negative: behind), in
    /// milliseconds, as last read; `None` when the runtime decides by its own clock (a store
    /// owned by one process, or a clock set with [`RuntimeBuilder::clock`]).
    pub fn clock_offset_ms(&self) -> Option<i64> {
        self.store_clock.as_ref().map(|c| c.offset_ms())
    }

    /// The first half of a graceful shutdown, for servers: `subscriptions/listen` streams send
    /// their result and end, so that a transport's graceful shutdown can finish. Requests are
    /// still served. Call [`Runtime::shutdown`] once the transport has stopped.
    pub fn begin_shutdown(&self) {
        if let Some(parts) = &self.parts {
            let _ = parts.stop.send(true);
        }
    }

    /// Stops the reaper and every task actor (running tools are dropped where they are; they
    /// resume from their journal at the next start), then closes the store. Everything that
    /// was acknowledged is durable already. Once this returns the file can be opened again.
    pub async fn shutdown(mut self) {
        let Some(parts) = self.parts.take() else {
            return;
        };
        let _ = parts.stop.send(true);
        let _ = parts.reaper.await;
        let _ = parts.takeover.await;
        let _ = parts.inbox.await;
        parts
            .supervisor
            .stop_children_and_wait(
                Some("runtime shutdown".into()),
                Some(Duration::from_secs(10)),
            )
            .await;
        parts.supervisor.stop(Some("runtime shutdown".into()));
        let _ = parts.supervisor_task.await;
        // Every actor is stopped: the next start resumes their tasks without counting an
        // attempt (see `TaskRecord::attempts`).
        let store = &self.dispatcher.shared.store;
        let epoch = store.boot_epoch();
        // A shared store records nothing: its close releases this node's leases.
        if !store.is_shared()
            && let Err(e) = store
                .commit(vec![WriteOp::PutMeta {
                    key: META_CLEAN_SHUTDOWN.to_owned(),
                    value: epoch.to_le_bytes().to_vec(),
                }])
                .await
        {
            tracing::warn!(error = %e, "could not record the clean shutdown");
        }
        store.close().await;
        tracing::info!("runtime stopped");
    }
}

/// A cloneable handle to a runtime's dispatcher, for transports.
#[derive(Clone)]
pub struct RuntimeHandle {
    dispatcher: Arc<Dispatcher>,
}

impl RuntimeHandle {
    /// The number of tasks with a running actor ([`Runtime::live_tasks`]).
    pub fn live_tasks(&self) -> usize {
        self.dispatcher.shared.live.len()
    }

    /// The number of live tasks parked without an actor ([`Runtime::parked_tasks`]).
    pub fn parked_tasks(&self) -> usize {
        self.dispatcher.shared.live.parked()
    }

    /// The dispatcher behind this handle (for adapters at the edge).
    pub(crate) fn dispatcher(&self) -> &Arc<Dispatcher> {
        &self.dispatcher
    }

    /// The runtime's shared state.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.dispatcher.shared
    }

    /// Whether this runtime can serve now, for a readiness probe (`GET /readyz` of
    /// [`crate::transport::http::router`]): a handle exists only once
    /// [`RuntimeBuilder::start`] returned, so recovery is done; then the store must be ready
    /// ([`Store::ready`]: not closed nor halted, and on PostgreSQL the database answers and
    /// this node's lease is current). `Err(why)` otherwise.
    pub async fn ready(&self) -> Result<(), String> {
        self.shared().store.ready().await
    }

    /// What the runtime's tool sources say of their state, one line each, for the body of a
    /// readiness probe (a gateway: each upstream connected, with its era and tool count, or
    /// connecting, with its last error). They never make [`RuntimeHandle::ready`] fail: the
    /// runtime still serves its tasks while a source's server is down.
    pub fn tool_sources_readiness(&self) -> Vec<String> {
        self.shared().tools.readiness()
    }

    /// Handles one raw JSON-RPC message with a full request context: nothing (a
    /// notification), one response, or a stream (`subscriptions/listen`).
    pub async fn dispatch(&self, message: &[u8], ctx: &RequestContext) -> Dispatched {
        self.dispatcher.handle(message, ctx).await
    }

    /// Handles one JSON-RPC message given as JSON with a full request context.
    pub async fn dispatch_json(&self, message: Value, ctx: &RequestContext) -> Dispatched {
        self.dispatcher.handle_value(message, ctx).await
    }

    /// Handles one raw JSON-RPC message from `owner` and returns its single response: `None`
    /// for a notification, and for a streamed answer (use [`RuntimeHandle::dispatch`] for
    /// `subscriptions/listen`).
    pub async fn handle_message(&self, message: &[u8], owner: &Owner) -> Option<Reply> {
        self.dispatch(message, &RequestContext::new(owner.clone()))
            .await
            .into_reply()
    }

    /// Like [`RuntimeHandle::handle_message`] for a message given as JSON; returns the body.
    pub async fn handle_json(&self, message: Value, owner: &Owner) -> Option<Value> {
        let ctx = RequestContext::new(owner.clone());
        self.dispatch_json(message, &ctx)
            .await
            .into_reply()
            .map(Reply::into_body)
    }
}

/// The meta key holding the boot epoch of the last run that shut down cleanly.
const META_CLEAN_SHUTDOWN: &str = "clean_shutdown_epoch";

/// Whether the run before this one ended without [`Runtime::shutdown`] (crash, kill, power
/// loss, or a runtime dropped without shutdown). A new store counts as clean.
async fn previous_run_crashed(store: &Store) -> Result<bool, StoreError> {
    if store.is_shared() {
        // Replicas share the store: one node's clean shutdown says nothing of another's
        // crash. Instead each task claimed from a lapsed lease counts an attempt
        // (`TaskStore::took_from_lapsed`, see docs/SCALE-OUT.md).
        return Ok(false);
    }
    let previous = store.boot_epoch().saturating_sub(1);
    if previous == 0 {
        return Ok(false);
    }
    let clean = store
        .meta_get(META_CLEAN_SHUTDOWN)
        .await?
        .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
        .map(u64::from_le_bytes);
    Ok(clean != Some(previous))
}

/// The key that signs MRTR `requestState`s: made on first start, kept in the store so that
/// every replica and restart verifies the same states.
async fn request_state_key(store: &Store) -> Result<Vec<u8>, StoreError> {
    let stored = store.meta_get(KEY_META).await?;
    if let Some(key) = &stored
        && key.len() >= 32
    {
        return Ok(key.clone());
    }
    let key = RequestStateCodec::generate_key();
    let write = match stored {
        // Too short to be a key: replaced.
        Some(_) => WriteOp::PutMeta {
            key: KEY_META.to_owned(),
            value: key.clone(),
        },
        // Replicas starting together on a new store: the first key written wins.
        None => WriteOp::PutMetaIfAbsent {
            key: KEY_META.to_owned(),
            value: key.clone(),
        },
    };
    store.commit(vec![write]).await?;
    match store.meta_get(KEY_META).await? {
        Some(stored) if stored.len() >= 32 => Ok(stored),
        _ => Ok(key),
    }
}

/// Orphans claimed per statement by [`take_over`].
const CLAIM_BATCH: usize = 256;

/// On a store shared by replicas: every `claim_interval` (a third of the lease TTL), claims
/// the live tasks whose node stopped renewing its lease, in batches, and starts their actors
/// (they resume from their journal). Nothing to do on a store owned by one process.
async fn take_over(
    shared: Arc<Shared>,
    supervisor: ActorRef<SupervisorMsg>,
    mut stop: watch::Receiver<bool>,
) {
    let Some(every) = shared.store.claim_interval() else {
        return;
    };
    let early = shared.store.watch_reconcile();
    loop {
        let reconcile_early = async {
            match &early {
                Some(wake) => wake.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = reconcile_early => {
                // Soon, not at once: the failure that asked for it is often an outage.
                tokio::time::sleep(every.min(Duration::from_millis(100))).await;
            }
            _ = stop.changed() => return,
        }
        reconcile(&shared, &supervisor).await;
        // Each batch from past the previous one's greatest id: every orphan looked at once.
        let mut after = String::new();
        loop {
            let claimed = match shared.store.claim_orphans(&after, CLAIM_BATCH).await {
                Ok(claimed) => claimed,
                Err(e) => {
                    tracing::warn!(error = %e, "claiming orphaned tasks failed; retrying");
                    break;
                }
            };
            let full = claimed.len() >= CLAIM_BATCH;
            if let Some((last, _)) = claimed.iter().max_by(|a, b| a.0.cmp(&b.0)) {
                after.clone_from(last);
            }
            #[cfg(feature = "failpoints")]
            if !claimed.is_empty() {
                // `return(MS)`: an asynchronous pause (a blocking one would stall this
                // worker's other tasks too, the request the test sends meanwhile among them).
                let pause: Option<u64> = (|| {
                    fail::fail_point!("runtime::before_claimed", |ms| ms
                        .and_then(|ms| ms.parse().ok()));
                    None
                })();
                if let Some(ms) = pause {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
            }
            let mut claimed = claimed;
            if shared.flow.active() {
                // Flow control: a dead replica's tasks enter the queue oldest first, as at a
                // start, so that the queue keeps its order across the takeover.
                claimed.sort_by_cached_key(|(id, bytes)| {
                    let created = crate::persist::decode(bytes).map_or(0, |r| r.created_at_ms);
                    (created, id.clone())
                });
            }
            for (raw, bytes) in claimed {
                let Ok(id) = crate::task::TaskId::parse(&raw) else {
                    tracing::warn!(id = %raw, "a claimed task has an invalid id; skipped");
                    continue;
                };
                tracing::info!(task = %id, node = shared.store.node_id(), "took an orphaned task over");
                let task = id.clone();
                match supervisor
                    .call(|port| SupervisorMsg::Claimed(task, bytes, port), None)
                    .await
                {
                    Ok(ractor::rpc::CallResult::Success(Ok(()))) => {}
                    other => {
                        let detail = match other {
                            Ok(ractor::rpc::CallResult::Success(Err(e))) => e.message,
                            _ => "the supervisor did not answer".to_owned(),
                        };
                        tracing::warn!(task = %id, error = %detail, "could not start a claimed task");
                    }
                }
            }
            if !full || *stop.borrow() {
                break;
            }
        }
    }
}

/// On a store shared by replicas: compares the leases this node believes it holds with the
/// rows (see `Cluster::reconcile`). The actors of tasks whose lease this node lost stop
/// (even one waiting for input, which would never write and so never be fenced), and their
/// followers move to the stored record; live tasks leased to this node that it did not know
/// of (a creation whose commit acknowledgement was lost) are claimed anew and run; tasks
/// taken over from a node that turned out to be paused, not crashed, get back the attempt
/// their takeover counted.
async fn reconcile(shared: &Arc<Shared>, supervisor: &ActorRef<SupervisorMsg>) {
    let found = match shared.store.reconcile().await {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(error = %e, "comparing this node's leases with the store failed; retrying");
            return;
        }
    };
    for raw in found.lost {
        let Ok(id) = crate::task::TaskId::parse(&raw) else {
            continue;
        };
        let _ = supervisor
            .call(|port| SupervisorMsg::LeaseLost(id, port), None)
            .await;
    }
    // Takeovers that turned out to follow a pause, not a crash: their attempt is given back
    // by the task's actor (if it still runs here and no progress restarted the count).
    for raw in found.paused {
        let Ok(id) = crate::task::TaskId::parse(&raw) else {
            continue;
        };
        if let Some(live) = shared.live.actor_of(&id) {
            let _ = live.actor.cast(TaskMsg::RefundLapse);
        }
    }
    for (raw, bytes) in found.forgotten {
        let Ok(id) = crate::task::TaskId::parse(&raw) else {
            tracing::warn!(id = %raw, "a reclaimed task has an invalid id; skipped");
            continue;
        };
        let task = id.clone();
        match supervisor
            .call(|port| SupervisorMsg::Claimed(task, bytes, port), None)
            .await
        {
            Ok(ractor::rpc::CallResult::Success(Ok(()))) => {}
            _ => tracing::warn!(task = %id, "could not start a reclaimed task"),
        }
    }
}

/// Ids the reaper takes from the expiry index per pass.
const REAP_BATCH: usize = 1024;

/// The expiry reaper: fails live tasks past their time to live, deletes finished ones whose
/// retention after expiry ended. Driven by the store's expiry index. Every `reaper_interval`
/// it runs passes back to back while a full batch was due (so it keeps up with any rate the
/// store can commit), each pass with one group commit for its deletions and concurrent
/// expiries.
async fn reap(
    shared: Arc<Shared>,
    supervisor: ActorRef<SupervisorMsg>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(shared.config.reaper_interval) => {}
            _ = stop.changed() => return,
        }
        if let Err(e) = reap_due(&shared, &supervisor, &stop).await {
            tracing::warn!(error = %e, "expiry reaper pass failed");
        }
    }
}

/// Runs reaper passes back to back while a full batch was due and made progress; returns
/// what they did in total.
pub(crate) async fn reap_due(
    shared: &Shared,
    supervisor: &ActorRef<SupervisorMsg>,
    stop: &watch::Receiver<bool>,
) -> Result<ReapPass, crate::shared::RuntimeError> {
    let mut total = ReapPass::default();
    loop {
        let pass = reap_once(shared, supervisor).await?;
        total.due += pass.due;
        total.expired += pass.expired;
        total.deleted += pass.deleted;
        total.quarantined += pass.quarantined;
        total.failed += pass.failed;
        if pass.due < REAP_BATCH || pass.progress() == 0 || *stop.borrow() {
            return Ok(total);
        }
    }
}

/// What one reaper pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReapPass {
    /// Ids the expiry index had due.
    pub(crate) due: usize,
    pub(crate) expired: usize,
    pub(crate) deleted: usize,
    /// Records that do not decode: logged, and taken out of the expiry index.
    pub(crate) quarantined: usize,
    /// Expiries that failed (the task changed concurrently, a store error): tried again in
    /// the next pass.
    pub(crate) failed: usize,
}

impl ReapPass {
    fn progress(&self) -> usize {
        self.expired + self.deleted + self.quarantined
    }
}

/// One pass of the reaper over at most [`REAP_BATCH`] due ids: the deletions (and the
/// quarantine of undecodable records) in one commit, the expiries concurrently and always by
/// the task's own actor: a live task without an actor gets one from the supervisor, and a task
/// actor that starts on an expired task expires it instead of running it. The reaper never
/// writes a task record (finished records it deletes never change). A record that cannot be
/// read never stops the pass.
pub(crate) async fn reap_once(
    shared: &Shared,
    supervisor: &ActorRef<SupervisorMsg>,
) -> Result<ReapPass, crate::shared::RuntimeError> {
    let now = shared.now_ms();
    let due = shared.store.due(now, REAP_BATCH).await?;
    let mut pass = ReapPass {
        due: due.len(),
        ..ReapPass::default()
    };
    if due.is_empty() {
        return Ok(pass);
    }
    let stored = shared.store.get_many(due.clone()).await?;
    let retention = u64::try_from(shared.config.expired_retention.as_millis()).unwrap_or(u64::MAX);
    // Deleted through `Shared::delete`; `removals` drops stale or quarantined due entries.
    let mut deletions = Vec::new();
    let mut removals = Vec::new();
    let mut expiries = Vec::new();
    for (raw, bytes) in due.into_iter().zip(stored) {
        let Ok(id) = crate::task::TaskId::parse(&raw) else {
            tracing::warn!(id = %raw, "the expiry index names an invalid task id; deleting it");
            deletions.push(raw);
            pass.deleted += 1;
            continue;
        };
        let record = match shared.live.snapshot(&id) {
            Some(record) => record,
            None => match bytes.map(|b| crate::persist::decode(&b)) {
                None => {
                    // Deleted meanwhile: drop the stale index entry.
                    removals.push(WriteOp::SetDue {
                        id: raw,
                        due_ms: None,
                    });
                    continue;
                }
                Some(Ok(record)) => Arc::new(record),
                Some(Err(e)) => {
                    tracing::error!(task = %id, error = %e,
                        "quarantined a stored task that does not decode: the reaper skips it from now on (the record is left in place)");
                    removals.push(WriteOp::SetDue {
                        id: raw,
                        due_ms: None,
                    });
                    pass.quarantined += 1;
                    continue;
                }
            },
        };
        if record.status.is_terminal() {
            if record
                .expires_at_ms()
                .is_some_and(|at| now >= at.saturating_add(retention))
            {
                deletions.push(raw);
                pass.deleted += 1;
            }
        } else if record.is_expired(now) {
            // On a shared store a live task is expired by the node that holds its lease
            // (an orphan is claimed first): once per cluster, never by two nodes.
            if shared.store.holds(id.as_str()) {
                expiries.push(id);
            }
        }
    }
    let deletions = async {
        shared.delete(deletions).await?;
        if removals.is_empty() {
            return Ok(());
        }
        shared.store.commit(removals).await
    };
    let expiring = futures::future::join_all(expiries.into_iter().map(|id| async move {
        let result = match shared.live.get(&id) {
            Some(live) => match live.actor.call(TaskMsg::Expire, None).await {
                Ok(ractor::rpc::CallResult::Success(r)) => r.map_err(|e| e.message),
                Ok(_) => Err("the task actor did not answer".to_owned()),
                Err(e) => Err(e.to_string()),
            },
            // Its actor, once started, finds the task expired and expires it.
            None => {
                let task = id.clone();
                match supervisor
                    .call(|port| SupervisorMsg::Ensure(task, port), None)
                    .await
                {
                    Ok(ractor::rpc::CallResult::Success(r)) => r.map_err(|e| e.message),
                    Ok(_) => Err("the supervisor did not answer".to_owned()),
                    Err(e) => Err(e.to_string()),
                }
            }
        };
        match &result {
            Ok(()) => tracing::info!(task = %id, "task expired before it finished"),
            Err(e) => tracing::debug!(task = %id, error = %e, "expiring the task failed; retrying in the next pass"),
        }
        result.is_ok()
    }));
    let (deleted, expired) = tokio::join!(deletions, expiring);
    deleted?;
    pass.expired = expired.iter().filter(|ok| **ok).count();
    pass.failed = expired.len() - pass.expired;
    if pass.deleted > 0 {
        tracing::debug!(deleted = pass.deleted, "expired tasks deleted");
    }
    Ok(pass)
}

#[cfg(test)]
mod tests;
