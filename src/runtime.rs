//! The embedding API: start a runtime on a redb file with a set of tools, hand it JSON-RPC
//! messages, shut it down.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorRef};
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::actor::{LiveTasks, Shared, Supervisor, SupervisorMsg, TaskMsg};
use crate::catalog::{Catalog, Prompt, Resource, ResourceTemplate};
use crate::clock::{Clock, SystemClock};
use crate::protocol::request_state::{KEY_META, RequestStateCodec};
use crate::protocol::{Dispatcher, Outcome, Reply, RequestContext};
use crate::store::{BackendFactory, Store, StoreError, StoreOptions, WriteOp};
use crate::task::{Event, Owner, apply};
use crate::tool::registry::RegistryError;
use crate::tool::{Tool, ToolRegistry};
use crate::wire::ServerInfo;
use crate::wire::results::CacheHints;

/// Tunables of a runtime. `Default` gives production values.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RuntimeConfig {
    pub server_info: ServerInfo,
    pub instructions: Option<String>,
    /// Time to live of a task from its creation (a tool may override it); `None` is unlimited.
    pub default_ttl: Option<Duration>,
    /// The `pollIntervalMs` suggested to clients.
    pub poll_interval: Duration,
    /// How long an expired task is remembered (answering "expired") before it is deleted.
    pub expired_retention: Duration,
    /// How long a working task's tool may take to honour a cancellation request before it is
    /// stopped and the task marked `cancelled`.
    pub cancel_grace: Duration,
    /// Restarts of a failing task actor before the task is marked `failed`.
    pub restart_budget: u32,
    /// First restart delay; doubles with every further failure (capped at 30 s).
    pub restart_backoff: Duration,
    /// How often the expiry reaper looks at the expiry index.
    pub reaper_interval: Duration,
    pub cache_hints: CacheHints,
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
            reaper_interval: Duration::from_secs(1),
            cache_hints: CacheHints::default(),
        }
    }
}

/// Why a runtime did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Tool(#[from] RegistryError),
    #[error("the supervisor did not start: {0}")]
    Supervisor(String),
}

/// Builds a [`Runtime`].
pub struct RuntimeBuilder {
    path: PathBuf,
    tools: Vec<Arc<dyn Tool>>,
    catalog: Catalog,
    config: RuntimeConfig,
    store_options: StoreOptions,
    backend: Option<BackendFactory>,
    clock: Arc<dyn Clock>,
}

impl RuntimeBuilder {
    pub fn tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.push(tool);
        self
    }

    pub fn tools(mut self, tools: impl IntoIterator<Item = Arc<dyn Tool>>) -> Self {
        self.tools.extend(tools);
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

    /// Lists a resource template (`resources/templates/list`).
    pub fn resource_template(mut self, template: ResourceTemplate) -> Self {
        self.catalog.add_template(template);
        self
    }

    pub fn config(mut self, config: RuntimeConfig) -> Self {
        self.config = config;
        self
    }

    pub fn server_info(mut self, name: impl Into<String>, version: impl Into<String>) -> Self {
        self.config.server_info = ServerInfo::new(name, version);
        self
    }

    pub fn store_options(mut self, options: StoreOptions) -> Self {
        self.store_options = options;
        self
    }

    /// Keeps the store on a redb [`redb::StorageBackend`] made by `factory` instead of the file
    /// (simulated disks and fault injection; see [`Store::open_with_backend`]). The builder's
    /// path then only names the store in errors and logs.
    pub fn store_backend(mut self, factory: BackendFactory) -> Self {
        self.backend = Some(factory);
        self
    }

    /// Replaces the wall clock (tests and simulations).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Opens the store, rehydrates every live task (done when this returns) and starts the
    /// expiry reaper.
    pub async fn start(self) -> Result<Runtime, StartError> {
        let mut tools = ToolRegistry::new();
        for tool in self.tools {
            tools.register(tool)?;
        }
        let store = match self.backend {
            Some(factory) => {
                Store::open_with_backend_async(self.path.clone(), factory, self.store_options)
                    .await?
            }
            None => Store::open_async(self.path.clone(), self.store_options).await?,
        };
        tracing::info!(path = %self.path.display(), epoch = store.boot_epoch(), "store open");
        let key = match request_state_key(&store).await {
            Ok(key) => key,
            Err(e) => {
                store.close().await;
                return Err(e.into());
            }
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            store: store.clone(),
            tools,
            clock: self.clock,
            config: self.config,
            live: LiveTasks::default(),
            catalog: self.catalog,
            request_state: RequestStateCodec::new(key),
            closing: stop_rx.clone(),
        });
        let (supervisor, supervisor_task) = match Actor::spawn(
            None,
            Supervisor {
                shared: shared.clone(),
            },
            (),
        )
        .await
        {
            Ok(spawned) => spawned,
            Err(e) => {
                store.close().await;
                return Err(StartError::Supervisor(e.to_string()));
            }
        };
        // The supervisor rehydrates in `post_start`; it answers messages only after that.
        if supervisor.call(SupervisorMsg::Ready, None).await.is_err() {
            store.close().await;
            return Err(StartError::Supervisor(
                "the supervisor stopped while rehydrating".into(),
            ));
        }
        let reaper = tokio::spawn(reap(shared.clone(), stop_rx));
        Ok(Runtime {
            dispatcher: Arc::new(Dispatcher {
                shared,
                supervisor: supervisor.clone(),
            }),
            parts: Some(Parts {
                supervisor,
                supervisor_task,
                reaper,
                stop: stop_tx,
            }),
        })
    }
}

/// A running mcp-tasks runtime. Several can live in one process (on different files).
///
/// Dropping it without [`Runtime::shutdown`] stops its actors and reaper in the background
/// (like a crash of the server: nothing acknowledged is lost); the store file is released once
/// they are gone.
pub struct Runtime {
    dispatcher: Arc<Dispatcher>,
    parts: Option<Parts>,
}

struct Parts {
    supervisor: ActorRef<SupervisorMsg>,
    supervisor_task: JoinHandle<()>,
    reaper: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(parts) = self.parts.take() {
            let _ = parts.stop.send(true);
            parts.reaper.abort();
            parts
                .supervisor
                .stop_children(Some("runtime dropped".into()));
            parts.supervisor.stop(Some("runtime dropped".into()));
        }
    }
}

impl Runtime {
    /// A builder for a runtime whose store is the redb file at `path` (created if missing).
    pub fn builder(path: impl AsRef<Path>) -> RuntimeBuilder {
        RuntimeBuilder {
            path: path.as_ref().to_owned(),
            tools: Vec::new(),
            catalog: Catalog::default(),
            config: RuntimeConfig::default(),
            store_options: StoreOptions::default(),
            backend: None,
            clock: Arc::new(SystemClock),
        }
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

    /// The store (for tools that want their own records, and for tests).
    pub fn store(&self) -> &Store {
        &self.dispatcher.shared.store
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
        parts
            .supervisor
            .stop_children_and_wait(
                Some("runtime shutdown".into()),
                Some(Duration::from_secs(10)),
            )
            .await;
        parts.supervisor.stop(Some("runtime shutdown".into()));
        let _ = parts.supervisor_task.await;
        self.dispatcher.shared.store.close().await;
        tracing::info!("runtime stopped");
    }
}

/// A cloneable handle to a runtime's dispatcher, for transports.
#[derive(Clone)]
pub struct RuntimeHandle {
    dispatcher: Arc<Dispatcher>,
}

impl RuntimeHandle {
    /// Handles one raw JSON-RPC message with a full request context: nothing (a
    /// notification), one response, or a stream (`subscriptions/listen`).
    pub async fn dispatch(&self, message: &[u8], ctx: &RequestContext) -> Outcome {
        self.dispatcher.handle(message, ctx).await
    }

    /// Handles one JSON-RPC message given as JSON with a full request context.
    pub async fn dispatch_json(&self, message: Value, ctx: &RequestContext) -> Outcome {
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
            .map(|r| r.body)
    }
}

/// The key that signs MRTR `requestState`s: made on first start, kept in the store so that
/// every replica and restart verifies the same states.
async fn request_state_key(store: &Store) -> Result<Vec<u8>, StoreError> {
    if let Some(key) = store.meta_get(KEY_META).await?
        && key.len() >= 32
    {
        return Ok(key);
    }
    let key = RequestStateCodec::generate_key();
    store
        .commit(vec![WriteOp::PutMeta {
            key: KEY_META.to_owned(),
            value: key.clone(),
        }])
        .await?;
    Ok(key)
}

/// The expiry reaper: fails live tasks past their time to live, deletes finished ones whose
/// retention after expiry ended. Driven by the store's expiry index.
async fn reap(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(shared.config.reaper_interval) => {}
            _ = stop.changed() => return,
        }
        if let Err(e) = reap_once(&shared).await {
            tracing::warn!(error = %e, "expiry reaper pass failed");
        }
    }
}

async fn reap_once(shared: &Shared) -> Result<(), crate::error::RuntimeError> {
    let now = shared.now_ms();
    for raw in shared.store.due(now, 256).await? {
        let Ok(id) = crate::task::TaskId::parse(&raw) else {
            shared
                .store
                .commit(vec![WriteOp::Delete { id: raw }])
                .await?;
            continue;
        };
        let Some(record) = shared.load(&id).await? else {
            continue;
        };
        if !record.status.is_terminal() {
            if !record.is_expired(now) {
                continue;
            }
            if let Some(live) = shared.live.get(&id) {
                let _ = live.actor.call(TaskMsg::Expire, None).await;
            } else if let Some(next) = apply(&record, Event::Expire, now)? {
                shared.commit(&next).await?;
            }
            tracing::info!(task = %id, "task expired before it finished");
        } else {
            let retention =
                u64::try_from(shared.config.expired_retention.as_millis()).unwrap_or(u64::MAX);
            if record
                .expires_at_ms()
                .is_some_and(|at| now >= at.saturating_add(retention))
            {
                shared
                    .store
                    .commit(vec![WriteOp::Delete { id: raw }])
                    .await?;
                tracing::debug!(task = %id, "expired task deleted");
            }
        }
    }
    Ok(())
}
