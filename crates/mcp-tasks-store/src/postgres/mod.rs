//! The PostgreSQL backend: one database shared by several replicas of mcp-tasks.
//!
//! Schema (version [`SCHEMA_VERSION`], applied by versioned migrations at open, under an
//! advisory lock so that replicas starting together migrate once; a database whose schema is
//! newer than this build is refused with [`StoreError::SchemaTooNew`]):
//!
//! | table                 | holds                                                              |
//! |-----------------------|--------------------------------------------------------------------|
//! | `mcp_schema`          | applied migration versions                                          |
//! | `mcp_tasks`           | per task: snapshot bytes, `live`, `due_ms`, `seq`, `owner_node`, `lease_epoch`; its owner entry (`task_owner`, `created_ms`); its listing (`tool`, `status`, `status_message`, `updated_ms`) |
//! | `mcp_meta`            | key → bytes (boot epoch, the `requestState` key)                    |
//! | `mcp_nodes`           | per node: `started_at`, `heartbeat_at` (the node's lease)           |
//! | `mcp_commands`        | commands for the node running a task, and their answers             |
//! | `mcp_usage`           | per (owner, shard): stored tasks and bytes (the disk quota)         |
//! | `mcp_listing_counts`  | per (owner, tool, status, shard): stored tasks                      |
//! | `mcp_throughput`      | per (minute, kind, shard): creations and arrivals in a final status |
//! | `mcp_flow`            | flow control: the entries holding or waiting for a running-task slot (`flow.rs`) |
//! | `mcp_flow_buckets`    | flow control: the start-rate token buckets                          |
//!
//! **The listing index** (`store::listing`, schema 6). A put that carries a listing writes it
//! into the task's row; a task with an owner and a status is listed. Pages walk an index newest
//! first — `(created_ms, id)`, `(status, created_ms, id)`, `(tool, created_ms, id)` or the
//! owner's `(task_owner, created_ms, id)` — in one statement (`listing.rs`). A trigger keeps
//! the counters and the throughput buckets in the commit's transaction, in up to 16 rows per
//! key (a shard of the task ids: concurrent commits do not queue on one row lock), which
//! readers sum; the sweep leader drops buckets older than a day and empty counters with its
//! heartbeat. A schema-5 database gets its rows' listings from their snapshots at migration;
//! its throughput starts empty.
//!
//! **Leases and fencing.** Every process has a node id and renews its row in `mcp_nodes`
//! every third of the lease TTL (one heartbeat per node, not per task). A live task is leased
//! to the node named by `owner_node`, under a per-task `lease_epoch`. Creating a task leases
//! it to its creator (epoch 1); claiming a task (at start, or taking over an orphan whose node
//! stopped heartbeating for longer than the TTL) bumps the epoch, with `FOR UPDATE SKIP
//! LOCKED` so that concurrent claimers split the orphans instead of queueing on them. Every
//! write of a task by this node is one `UPDATE … WHERE id = $1 AND owner_node = $me AND
//! lease_epoch = $held AND seq = $expected`: zero rows means that another node took the task
//! over (the write is refused with [`StoreError::Fenced`] and the actor stops without side
//! effects on the record) or that the sequence number moved ([`StoreError::Conflict`]).
//! Leases are judged by the database's clock (`now()`), and the runtime decides every other
//! matter of time by it too: the heartbeat samples it ([`crate::clock::ReferenceClock`]).
//!
//! **What the replicas must share, and bounds.** The lease TTL is stored in `mcp_meta`: a
//! replica started with another one while a node is live is refused
//! ([`StoreError::LeaseTtlMismatch`]); a second live process with a node id is refused
//! ([`StoreError::NodeIdInUse`], an instance token per process in `mcp_nodes`). Every session
//! runs under [`SessionBounds`] derived from the TTL, and a request's takeover never waits
//! for a locked row ([`StoreError::Busy`]). A takeover of a lapsed lease counts against the
//! task's restart budget unless this node itself saw the database unreachable after the
//! owner's last heartbeat (an outage, not a crash). See docs/SCALE-OUT.md. The session
//! bounds are proved by `replica_faults::the_stores_statements_are_bounded_by_its_session_timeouts`
//! and `postgres_failpoints::a_transaction_left_open_by_a_frozen_node_releases_its_row_locks_within_the_bound`
//! (in `crates/mcp-tasks-cli/tests/pg/`), which fail without them.
//!
//! **Owner index and usage (schema 3).** Each row keeps `task_owner`, `created_ms` and a
//! generated `size` column, with an index on `(task_owner, created_ms, id)`; `mcp_usage` (per
//! owner, one row per shard of the task ids, summed by readers, so that one owner's concurrent
//! commits do not queue on one row lock) is kept by a trigger in the commit's transaction, so
//! every replica reads the same figures. A schema-2 database is converted by the first writable
//! open, reading each record's owner from its snapshot.
//!
//! **Signalling** (`notify.rs`; [`crate::Cluster`], implemented by this backend only).
//! Commands for another node's tasks go through `mcp_commands`; wake-ups are `NOTIFY`s (ids
//! only; the committing node sends one after each commit or group, outside the writing
//! transaction), with a polling fallback (`PostgresOptions::poll_interval`).
//! The dedicated `LISTEN` connection reconnects with backoff, then wakes every watcher once
//! (catch-up); it also holds the sweep leadership (a session advisory lock: the reaper's due
//! query returns finished tasks to the leader only). `Cluster::nodes`, `lease_of` and
//! `watch_commits` serve the operator console.
//!
//! **Group commit** (`group.rs`, `PostgresOptions::group_commit`, on by default). The one-`Put`
//! commits waiting at once go in one transaction, their statements pipelined on one
//! connection. A refusal is that commit's alone; any other failure before `COMMIT`, or a
//! `COMMIT` the server refuses (reported before it writes the commit record), rolls the group
//! back, and each commit is then made alone. The group's `lock_timeout` is 50 ms for its rows,
//! so a row a frozen peer holds delays the others by that, not by the session's lock bound;
//! `COMMIT` itself waits under the session's bound (PostgreSQL serialises notifying commits with
//! a lock on its notification queue: under load a 50 ms bound there failed creations).
//! Up to `PostgresOptions::groups_in_flight` groups (4) are in flight at once, so the WAL
//! flushes of consecutive groups overlap.
//! Tests: `crates/mcp-tasks-cli/tests/pg/postgres_group_commit.rs`.
//!
//! **Administration** (`inspect.rs`): one plain connection for the `store …` commands (schema
//! version checked, never migrated by a read; writes refused while a node's heartbeat is
//! fresh).

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio::task::JoinHandle;
use tokio_postgres::NoTls;

mod cluster;
mod commit;
mod flow;
mod group;
pub(crate) mod inspect;
mod lease;
mod listing;
mod migrate;
mod notify;
mod task_store;

#[cfg(doc)]
use super::Cluster;
use super::{Cause, StoreError, WriteOp};
use lease::{LapsedOwner, heartbeat, session_timeouts};
pub use lease::{Lease, SessionBounds};
pub use migrate::SCHEMA_VERSION;
pub(crate) use migrate::prepare_schema;
use migrate::{create_schema, migrate};
use notify::{self as postgres_notify, Hub};
pub(crate) use task_store::USAGE_BY_OWNER;

/// Options of [`PostgresStore::open`].
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// This process's node id (letters, digits, `-`, `_`, `.`; at most 63 bytes). `None`: a
    /// random one (logged at open). Two live processes must never share one.
    pub node_id: Option<String>,
    /// How long a node's lease lasts without a heartbeat; its live tasks are then taken over
    /// by other nodes. Heartbeats run every third of it. Default 15 s.
    pub lease_ttl: Duration,
    /// Connections in the pool. Default 16.
    pub pool_size: usize,
    /// How long a request waits for a connection (or for connecting) before it fails with
    /// [`StoreError::Unavailable`]. Default 5 s.
    pub connect_timeout: Duration,
    /// Keep the tables in this schema (created if missing) instead of the connection's
    /// default (`public`); letters, digits and `_`. Lets tests and tenants share a database.
    pub schema: Option<String>,
    /// How often a node reads the store again when no notification came: the fallback for a
    /// lost `NOTIFY` (requests for its tasks recorded by other nodes, the tasks that its
    /// listen streams follow on other nodes, the answers of its own requests). Default 1 s.
    pub poll_interval: Duration,
    /// Group commit: the transitions of this node's tasks that wait at the same time are
    /// written in one transaction, each keeping its own outcome (see docs/BENCHMARKS.md,
    /// "PostgreSQL beside redb"). `false`: one transaction per commit. Default `true`.
    pub group_commit: bool,
    /// How many group commits may be in flight at once (with [`PostgresOptions::group_commit`]):
    /// the next group is formed and sent while earlier ones wait for their `COMMIT`, so the
    /// database's WAL flushes of several groups overlap. 1: one group at a time, each formed of
    /// what queued while the previous one committed. Default 4 (docs/BENCHMARKS.md, "Group
    /// commits in flight").
    pub groups_in_flight: usize,
    /// **Test only.** Writes of a task are unconditional (no owner, epoch or sequence-number
    /// check: like a job queue that completes a job by its id), so a replica that lost a
    /// lease overwrites the new owner's work. The replica crash suite uses it to show that
    /// its checker catches what fencing prevents. Default `false`.
    #[doc(hidden)]
    pub unsafe_skip_fencing: bool,
    /// How the rows of a database written before the owner and listing columns are indexed
    /// when its schema is migrated ([`crate::Indexer`]). Default [`crate::NoIndexer`]: such a
    /// database is refused ([`StoreError::NeedsIndexer`]); the runtime sets its own.
    pub indexer: Arc<dyn crate::Indexer>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            node_id: None,
            lease_ttl: Duration::from_secs(15),
            pool_size: 16,
            connect_timeout: Duration::from_secs(5),
            schema: None,
            poll_interval: Duration::from_secs(1),
            group_commit: true,
            groups_in_flight: 4,
            unsafe_skip_fencing: false,
            indexer: Arc::new(crate::NoIndexer),
        }
    }
}

/// A task store in a PostgreSQL database, shared by every replica that opens it.
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    label: String,
    node: String,
    lease_ttl: Duration,
    boot_epoch: u64,
    skip_fencing: bool,
    /// [`PostgresOptions::group_commit`].
    group_commit: bool,
    /// [`PostgresOptions::groups_in_flight`] (at least 1).
    groups_in_flight: usize,
    /// The lease epoch this node holds, per task it runs.
    held: Mutex<HashMap<String, i64>>,
    closed: AtomicBool,
    commits: AtomicU64,
    ops: AtomicU64,
    /// `Some(detail)` while the database cannot be reached.
    unavailable: Mutex<Option<String>>,
    /// Heartbeats are skipped while set (tests that simulate a paused node).
    heartbeat_paused: AtomicBool,
    /// When this node's lease was last renewed (registration, then each heartbeat).
    renewed: Mutex<tokio::time::Instant>,
    /// When the last acknowledged renewal was sent (`None` before the first heartbeat): the
    /// lease holds, on this process's monotonic clock, until then plus the TTL
    /// ([`Cluster::reads_from_memory`] keeps a third of the TTL as a margin).
    renewal_sent: Mutex<Option<std::time::Instant>>,
    /// Counts the renewals after which the lease may have lapsed meanwhile (the first one
    /// too): the leases this node believes it holds are then suspect until a reconciliation
    /// that started after that renewal ([`Inner::gap_reconciled`]).
    lease_gaps: AtomicU64,
    /// The highest [`Inner::lease_gaps`] a completed reconciliation covers.
    gap_reconciled: AtomicU64,
    heartbeat: Mutex<Option<JoinHandle<()>>>,
    /// Wake-ups from other nodes, fed by the listening connection.
    hub: Arc<Hub>,
    listener: Mutex<Option<JoinHandle<()>>>,
    poll_interval: Duration,
    /// Finished tasks this node deleted (the sweep leader's work).
    deleted: AtomicU64,
    /// Tasks claimed from a node that stopped without releasing them, until the runtime asks.
    lapsed: Mutex<HashSet<String>>,
    /// Tasks of [`Inner::lapsed`] (their takeover counted an attempt) with the process that
    /// held them, watched while this node holds them: if that process renews its heartbeat,
    /// it was paused, not crashed, and the reconciliation reports the task for a refund.
    watched: Mutex<HashMap<String, LapsedOwner>>,
    /// Tasks whose creation commit is in flight (a reconciliation must not take their rows
    /// for forgotten ones), with the number of commits creating each.
    creating: Mutex<HashMap<String, u32>>,
    /// Wakes the runtime's reconciliation early (a commit whose outcome is unknown failed).
    reconcile_now: Arc<tokio::sync::Notify>,
    /// Test only: commits still to report failed although they committed (a lost ack).
    lose_commit_acks: AtomicU64,
    /// This process's instance token (random), renewed with the heartbeat.
    instance: String,
    /// The database's clock, sampled at every heartbeat.
    reference: Arc<crate::clock::ReferenceClock>,
    /// When this node last found the database unreachable (the database's time in ms,
    /// estimated; 0: never).
    last_outage_ms: AtomicU64,
    /// **Test only**: every statement fails as if the database could not be reached.
    outage: AtomicBool,
    /// The queue of the group committer (`group.rs`), started by the first grouped commit.
    group: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<group::GroupJob>>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("store", &self.inner.label)
            .field("node", &self.inner.node)
            .finish_non_exhaustive()
    }
}

/// Whether `s` is a valid node id.
fn valid_node_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn valid_schema(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !s.as_bytes()[0].is_ascii_digit()
}

/// A random node id: `node-` and 32 bits in hex.
fn random_node_id() -> String {
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).unwrap_or_default();
    format!("node-{:08x}", u32::from_le_bytes(bytes))
}

/// A random instance token: 64 bits in hex, one per process.
fn random_instance() -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).unwrap_or_default();
    format!("{:016x}", u64::from_le_bytes(bytes))
}

/// The tasks `ops` write (their `Put`s).
fn put_ids(ops: &[WriteOp]) -> Vec<String> {
    ops.iter()
        .filter_map(|op| match op {
            WriteOp::Put { id, .. } => Some(id.clone()),
            _ => None,
        })
        .collect()
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// The URL without its password, to name the store in logs and errors.
fn redact(config: &tokio_postgres::Config) -> String {
    let user = config.get_user().unwrap_or("");
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().unwrap_or(user);
    format!("postgres://{user}@{host}:{port}/{db}")
}

/// The message of a PostgreSQL error, with the server's own text when there is one.
pub(crate) fn pg_detail(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => {
            let mut s = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(inner) = source {
                s.push_str(": ");
                s.push_str(&inner.to_string());
                source = inner.source();
            }
            s
        }
    }
}

/// An error with its causes, `outer: inner: innermost` (a pool's "error connecting to
/// server" says nothing without the refused connection or the failed authentication under it).
pub(crate) fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        if !s.ends_with(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = inner.source();
    }
    s
}

/// Whether `e` means the database could not be reached (rather than refusing a statement).
fn is_connection_error(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.as_db_error() {
        // Class 08 (connection exception), 57P0x (admin shutdown, crash shutdown, cannot
        // connect now, database dropped).
        Some(db) => {
            let code = db.code().code();
            code.starts_with("08") || code.starts_with("57P")
        }
        None => true,
    }
}

/// What went wrong talking to the database.
enum PgFailure {
    Pool(String),
    Pg(tokio_postgres::Error),
    Store(StoreError),
}

impl From<tokio_postgres::Error> for PgFailure {
    fn from(e: tokio_postgres::Error) -> Self {
        PgFailure::Pg(e)
    }
}

impl From<deadpool_postgres::PoolError> for PgFailure {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(e) => PgFailure::Pg(e),
            other => PgFailure::Pool(other.to_string()),
        }
    }
}

impl From<StoreError> for PgFailure {
    fn from(e: StoreError) -> Self {
        PgFailure::Store(e)
    }
}

impl Inner {
    /// Turns a failure into a [`StoreError`], and notes whether the database is reachable.
    fn fail(&self, failure: PgFailure, write: bool) -> StoreError {
        let (unreachable, detail, error) = match failure {
            PgFailure::Store(e) => return e,
            PgFailure::Pool(detail) => (true, detail, None),
            PgFailure::Pg(e) => (is_connection_error(&e), pg_detail(&e), Some(e)),
        };
        if let Some(e) = &error
            && e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE)
        {
            return StoreError::Busy { detail };
        }
        let cause = |detail: String| match error {
            Some(e) => Cause::context(detail, e),
            None => Cause::message(detail),
        };
        if unreachable {
            self.note_outage();
            tracing::warn!(store = %self.label, %detail, "the PostgreSQL store is unreachable");
            *self.unavailable.lock().unwrap_or_else(|e| e.into_inner()) = Some(detail.clone());
            StoreError::Unavailable {
                path: self.label.clone().into(),
                detail,
            }
        } else if write {
            StoreError::Commit(cause(detail))
        } else {
            StoreError::Read(cause(detail))
        }
    }

    fn reachable(&self) {
        let mut slot = self.unavailable.lock().unwrap_or_else(|e| e.into_inner());
        if slot.take().is_some() {
            tracing::info!(store = %self.label, "the PostgreSQL store is reachable again");
        }
    }

    fn check_open(&self) -> Result<(), StoreError> {
        if self.closed.load(Ordering::SeqCst) {
            Err(StoreError::Closed)
        } else {
            Ok(())
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, i64>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, PgFailure> {
        if self.outage.load(Ordering::SeqCst) {
            return Err(PgFailure::Pool(
                "the database cannot be reached (simulated outage)".to_owned(),
            ));
        }
        Ok(self.pool.get().await?)
    }

    /// Notes that this node found the database unreachable now.
    fn note_outage(&self) {
        let now = self
            .reference
            .now()
            .map(|(ms, _)| ms)
            .unwrap_or_else(crate::clock::system_now_ms);
        self.last_outage_ms.fetch_max(now, Ordering::SeqCst);
    }

    /// Runs `query` on a pooled client of an open store. A failure becomes a [`StoreError`]
    /// ([`Inner::fail`]: `write` tells a failed commit from a failed read, and a lost
    /// connection marks the store unavailable); a success marks it reachable again.
    async fn run<T, F, Fut>(&self, write: bool, query: F) -> Result<T, StoreError>
    where
        F: FnOnce(deadpool_postgres::Object) -> Fut,
        Fut: Future<Output = Result<T, PgFailure>>,
    {
        self.check_open()?;
        let outcome = match self.client().await {
            Ok(client) => query(client).await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(value) => {
                self.reachable();
                Ok(value)
            }
            Err(e) => Err(self.fail(e, write)),
        }
    }
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://USER@HOST:PORT/DB`, libpq-style
    /// parameters accepted), applies the schema migrations this build knows (refusing a newer
    /// schema), registers this node and starts its heartbeat.
    pub async fn open(url: &str, options: PostgresOptions) -> Result<PostgresStore, StoreError> {
        let mut config = parse_url(url)?;
        let mut label = redact(&config);
        let open_err = |label: &str, detail: String| StoreError::Open {
            path: label.into(),
            detail,
        };
        if let Some(schema) = &options.schema {
            if !valid_schema(schema) {
                return Err(open_err(
                    &label,
                    format!("invalid schema name `{schema}` (letters, digits and `_` only)"),
                ));
            }
            label.push_str(&format!(" (schema {schema})"));
        }
        let node = match options.node_id.clone() {
            Some(id) if valid_node_id(&id) => id,
            Some(id) => {
                return Err(open_err(
                    &label,
                    format!("invalid node id `{id}` (1 to 63 letters, digits, `-`, `_` or `.`)"),
                ));
            }
            None => random_node_id(),
        };
        if options.lease_ttl < Duration::from_millis(300) {
            return Err(open_err(
                &label,
                "the lease TTL must be at least 300 ms".to_owned(),
            ));
        }
        config.connect_timeout(options.connect_timeout);
        if config.get_application_name().is_none() {
            config.application_name(format!("mcp-tasks {node}"));
        }
        if let Some(schema) = &options.schema {
            // Created first through a connection without the option.
            create_schema(&config, schema)
                .await
                .map_err(|e| open_err(&label, e))?;
            config.options(format!("-c search_path={schema}"));
        }
        // Every session (the pool's and the listening one) is bounded by the server.
        let bounded = match config.get_options() {
            Some(given) if !given.is_empty() => {
                format!("{given} {}", session_timeouts(options.lease_ttl))
            }
            _ => session_timeouts(options.lease_ttl),
        };
        config.options(bounded);
        // The listening connection names itself apart (operators see it in pg_stat_activity).
        let mut listen_config = config.clone();
        let name = format!(
            "{} (listen)",
            config.get_application_name().unwrap_or("mcp-tasks")
        );
        listen_config.application_name(name);
        let pool = pool(
            config,
            options.pool_size.max(1),
            Some(options.connect_timeout),
        )
        .map_err(|e| open_err(&label, e))?;
        let boot_epoch = migrate(&pool, &label, &*options.indexer).await?;
        let channel = channel_of(&pool).await.map_err(|e| open_err(&label, e))?;
        if options.poll_interval.is_zero() {
            return Err(open_err(
                &label,
                "the poll interval must be longer than zero".to_owned(),
            ));
        }
        let hub = Arc::new(Hub::new(node.clone(), channel));
        let inner = Arc::new(Inner {
            pool,
            label: label.clone(),
            node: node.clone(),
            lease_ttl: options.lease_ttl,
            boot_epoch,
            skip_fencing: options.unsafe_skip_fencing,
            group_commit: options.group_commit,
            groups_in_flight: options.groups_in_flight.max(1),
            held: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            commits: AtomicU64::new(0),
            ops: AtomicU64::new(0),
            unavailable: Mutex::new(None),
            heartbeat_paused: AtomicBool::new(false),
            renewed: Mutex::new(tokio::time::Instant::now()),
            renewal_sent: Mutex::new(None),
            lease_gaps: AtomicU64::new(0),
            gap_reconciled: AtomicU64::new(0),
            heartbeat: Mutex::new(None),
            hub: hub.clone(),
            listener: Mutex::new(None),
            poll_interval: options.poll_interval,
            deleted: AtomicU64::new(0),
            lapsed: Mutex::new(HashSet::new()),
            watched: Mutex::new(HashMap::new()),
            creating: Mutex::new(HashMap::new()),
            reconcile_now: Arc::new(tokio::sync::Notify::new()),
            lose_commit_acks: AtomicU64::new(0),
            group: std::sync::OnceLock::new(),
            instance: random_instance(),
            reference: Arc::new(crate::clock::ReferenceClock::new()),
            last_outage_ms: AtomicU64::new(0),
            outage: AtomicBool::new(false),
        });
        // Start-up waits for the first heartbeat: the node is registered before it claims.
        inner.register().await?;
        let task = tokio::spawn(heartbeat(Arc::downgrade(&inner)));
        *inner.heartbeat.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        let listener = tokio::spawn(postgres_notify::listen(Arc::downgrade(&hub), listen_config));
        *inner.listener.lock().unwrap_or_else(|e| e.into_inner()) = Some(listener);
        if options.unsafe_skip_fencing {
            tracing::error!(node = %node, "UNSAFE: fencing is off (test-only switch): a node that lost a lease can still write");
        }
        tracing::info!(store = %label, node = %node, lease_ttl = ?options.lease_ttl, boot_epoch, "PostgreSQL task store opened");
        Ok(PostgresStore { inner })
    }

    /// This node's id.
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// The lease TTL.
    pub fn lease_ttl(&self) -> Duration {
        self.inner.lease_ttl
    }

    /// The lease of task `id` as the database has it (for operators, tests and the demo).
    pub async fn lease_of(&self, id: &str) -> Result<Option<Lease>, StoreError> {
        self.inner
            .run(false, |client| async move {
                let row = client
                    .query_opt(
                        "SELECT owner_node, lease_epoch, seq, live FROM mcp_tasks WHERE id = $1",
                        &[&id],
                    )
                    .await?;
                Ok::<_, PgFailure>(row.map(|r| Lease {
                    owner: r.get(0),
                    epoch: to_u64(r.get(1)),
                    seq: r.get::<_, Option<i64>>(2).map(to_u64),
                    live: r.get(3),
                }))
            })
            .await
    }

    /// Whether this node currently sweeps finished tasks for the cluster (holds the sweep
    /// lock: a session advisory lock on its listening connection). One node at a time.
    pub fn is_sweep_leader(&self) -> bool {
        self.inner.hub.leader.load(Ordering::SeqCst)
    }

    /// Finished tasks this node deleted since open (the sweep leader's work).
    pub fn deleted_tasks(&self) -> u64 {
        self.inner.deleted.load(Ordering::Relaxed)
    }

    /// Whether this node's listening connection is up (notifications from other nodes
    /// arrive; while it is down, they are polled every [`PostgresOptions::poll_interval`]).
    pub fn is_listening(&self) -> bool {
        self.inner.hub.listening.load(Ordering::SeqCst)
    }

    /// **Test only** (`mcp_tasks::internals::pg_faults`). Drops (or stops dropping) the notifications this node receives, as if
    /// they were lost: only the polling fallback delivers other nodes' changes meanwhile.
    #[doc(hidden)]
    pub fn lose_notifications(&self, lose: bool) {
        self.inner.hub.lose.store(lose, Ordering::SeqCst);
    }

    /// **Test only** (`mcp_tasks::internals::pg_faults`). Stops (or resumes) this node's heartbeats, as if the process were
    /// paused: once the TTL passes, other nodes take its tasks over.
    #[doc(hidden)]
    pub fn pause_heartbeat(&self, paused: bool) {
        self.inner.heartbeat_paused.store(paused, Ordering::SeqCst);
    }

    /// **Test only** (`mcp_tasks::internals::pg_faults`). The next `n` commits are applied and committed, but reported failed
    /// (as if the answer to `COMMIT` were lost on the network): their outcome is unknown to
    /// the runtime.
    #[doc(hidden)]
    pub fn lose_commit_acks(&self, n: u64) {
        self.inner.lose_commit_acks.store(n, Ordering::SeqCst);
    }

    /// **Test only** (`mcp_tasks::internals::pg_faults`). Makes every statement of this node fail (or stops doing so) as if the
    /// database could not be reached: heartbeats, claims and requests fail as in an outage
    /// (the listening connection is left alone).
    #[doc(hidden)]
    pub fn simulate_outage(&self, down: bool) {
        self.inner.outage.store(down, Ordering::SeqCst);
    }
}

/// The notification channel of the connection's schema (the trigger of migration 2 names it
/// the same way).
async fn channel_of(pool: &Pool) -> Result<String, String> {
    let client = pool.get().await.map_err(|e| with_causes(&e))?;
    let row = client
        .query_one(
            "SELECT 'mcp_' || left(md5(coalesce(current_schema(), '')), 16)",
            &[],
        )
        .await
        .map_err(|e| pg_detail(&e))?;
    Ok(row.get(0))
}

/// The connection settings of a `postgres://` URL (an error never repeats the URL: it may
/// hold a password).
fn parse_url(url: &str) -> Result<tokio_postgres::Config, StoreError> {
    tokio_postgres::Config::from_str(url).map_err(|e| StoreError::Open {
        path: "postgres://…".into(),
        detail: format!("the PostgreSQL URL does not parse: {e}"),
    })
}

/// A pool of at most `size` connections; `timeout` bounds waiting for, creating and recycling
/// one.
fn pool(
    config: tokio_postgres::Config,
    size: usize,
    timeout: Option<Duration>,
) -> Result<Pool, String> {
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(timeout)
        .create_timeout(timeout)
        .recycle_timeout(timeout)
        .build()
        .map_err(|e| e.to_string())
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.hub.closed.store(true, Ordering::SeqCst);
        for slot in [&self.heartbeat, &self.listener] {
            if let Some(task) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
                task.abort();
            }
        }
    }
}
