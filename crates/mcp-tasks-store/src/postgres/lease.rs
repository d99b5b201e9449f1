//! Leases: the node's (registration, the heartbeat and the sweep leader's housekeeping it
//! runs, the session bounds derived from the TTL) and the tasks' (claims, lapsed owners,
//! confirmation and reconciliation).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Inner, PgFailure, to_i64, to_u64};
use crate::{Reconciled, StoreError};

/// The lease of one task, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The node that holds (or last held) the task; `None` once released.
    pub owner: Option<String>,
    /// The lease epoch, bumped by every claim.
    pub epoch: u64,
    /// The record's sequence number.
    pub seq: Option<u64>,
    /// Whether the task is still live (not finished).
    pub live: bool,
}

impl std::fmt::Display for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "owner {}, epoch {}, seq {}",
            self.owner.as_deref().unwrap_or("none"),
            self.epoch,
            self.seq.map_or("-".to_owned(), |s| s.to_string())
        )
    }
}

/// The meta key of the lease TTL the cluster shares (milliseconds, u64 little endian).
const META_LEASE_TTL: &str = "lease_ttl_ms";

/// Reads the lease TTL stored for the cluster (`$1`: [`META_LEASE_TTL`]).
const SELECT_LEASE_TTL: &str = "SELECT value FROM mcp_meta WHERE key = $1";

/// The lease TTL stored for the cluster, from the row of [`SELECT_LEASE_TTL`].
fn lease_ttl_of(row: Option<tokio_postgres::Row>) -> Option<Duration> {
    row.and_then(|r| <[u8; 8]>::try_from(r.get::<_, Vec<u8>>(0).as_slice()).ok())
        .map(|b| Duration::from_millis(u64::from_le_bytes(b)))
}

/// The server-side bounds of every session, derived from the lease TTL: no statement runs
/// longer than `statement` (max(TTL, 5 s)); none waits for a lock longer than `lock`
/// (max(TTL / 3, 1 s)); a transaction left idle for `idle` (max(TTL, 5 s): its process was
/// paused or cut off in the middle of it) is ended by the server, which releases its row
/// locks. A statement past a bound fails (a lock wait as [`StoreError::Busy`]); nothing is
/// changed by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionBounds {
    /// `statement_timeout`.
    pub statement: Duration,
    /// `lock_timeout`.
    pub lock: Duration,
    /// `idle_in_transaction_session_timeout`.
    pub idle: Duration,
}

impl SessionBounds {
    /// The bounds for lease TTL `ttl`.
    pub fn for_lease_ttl(ttl: Duration) -> Self {
        SessionBounds {
            statement: ttl.max(Duration::from_secs(5)),
            lock: (ttl / 3).max(Duration::from_secs(1)),
            idle: ttl.max(Duration::from_secs(5)),
        }
    }
}

/// The `-c` options that set [`SessionBounds`] on a connection.
pub(super) fn session_timeouts(ttl: Duration) -> String {
    let b = SessionBounds::for_lease_ttl(ttl);
    format!(
        "-c statement_timeout={} -c lock_timeout={} -c idle_in_transaction_session_timeout={}",
        b.statement.as_millis(),
        b.lock.as_millis(),
        b.idle.as_millis()
    )
}

impl Inner {
    /// Registers this process as its node id, under the rules the replicas share:
    ///
    /// * **One process per node id.** If the node id's row shows a heartbeat younger than two
    ///   thirds of the lease TTL, start-up watches it: a live process renews it every third of
    ///   the TTL, so if it changes, another process runs as this node id and the start is
    ///   refused ([`StoreError::NodeIdInUse`]); once it is older, the process that wrote it is
    ///   gone (a restart after a crash or a kill, which waits at most that long).
    /// * **One lease TTL per cluster**, stored in the database: a replica started with another
    ///   TTL while any other node is live is refused ([`StoreError::LeaseTtlMismatch`]); when
    ///   no other node is live, its TTL replaces the stored one (logged).
    ///
    /// The row then carries this process's instance token: a paused process of the same id
    /// that wakes up finds it replaced and stops renewing (its tasks were claimed by this one).
    pub(super) async fn register(&self) -> Result<(), StoreError> {
        let stored = self
            .run(false, |client| async move {
                Ok::<_, PgFailure>(lease_ttl_of(
                    client
                        .query_opt(SELECT_LEASE_TTL, &[&META_LEASE_TTL])
                        .await?,
                ))
            })
            .await?;
        let observed = self
            .wait_for_previous_instance(stored.unwrap_or(self.lease_ttl))
            .await?;
        let label = self.label.clone();
        self.run(true, |mut client| async move {
            let tx = client.transaction().await?;
            tx.batch_execute(
                "SET LOCAL lock_timeout = 0;
                 SELECT pg_advisory_xact_lock(727303, hashtext(coalesce(current_schema(), '')))",
            )
            .await?;
            let now: Option<String> = tx
                .query_opt(
                    "SELECT heartbeat_at::text FROM mcp_nodes WHERE node_id = $1",
                    &[&self.node],
                )
                .await?
                .map(|r| r.get(0));
            if now.is_some() && now != observed {
                return Err(PgFailure::Store(StoreError::NodeIdInUse {
                    store: label,
                    node: self.node.clone(),
                }));
            }
            let stored = lease_ttl_of(tx.query_opt(SELECT_LEASE_TTL, &[&META_LEASE_TTL]).await?);
            if stored != Some(self.lease_ttl) {
                if let Some(stored) = stored {
                    let live: Option<String> = tx
                        .query_one(
                            "SELECT string_agg(node_id, ', ' ORDER BY node_id) FROM mcp_nodes
                             WHERE node_id <> $1
                               AND heartbeat_at >= now() - make_interval(secs => $2)",
                            &[&self.node, &stored.as_secs_f64()],
                        )
                        .await?
                        .get(0);
                    if let Some(live) = live {
                        return Err(PgFailure::Store(StoreError::LeaseTtlMismatch {
                            store: label,
                            stored,
                            requested: self.lease_ttl,
                            live,
                        }));
                    }
                    tracing::warn!(store = %label, from = ?stored, to = ?self.lease_ttl,
                        "no other node is live: the cluster's lease TTL changes to this replica's");
                }
                let ms = u64::try_from(self.lease_ttl.as_millis()).unwrap_or(u64::MAX);
                tx.execute(
                    "INSERT INTO mcp_meta (key, value) VALUES ($1, $2)
                     ON CONFLICT (key) DO UPDATE SET value = $2",
                    &[&META_LEASE_TTL, &ms.to_le_bytes().to_vec()],
                )
                .await?;
            }
            let sent = std::time::Instant::now();
            let row = tx
                .query_one(
                    "INSERT INTO mcp_nodes (node_id, started_at, heartbeat_at, instance)
                     VALUES ($1, now(), now(), $2)
                     ON CONFLICT (node_id) DO UPDATE
                        SET started_at = now(), heartbeat_at = now(), instance = $2
                     RETURNING (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
                    &[&self.node, &self.instance],
                )
                .await?;
            let received = std::time::Instant::now();
            self.reference.record(to_u64(row.get(0)), sent, received);
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    /// See [`Inner::register`]: waits until the node id's row (if any) shows no live
    /// process. Returns its heartbeat (as text) as last seen, which registration checks did
    /// not move since.
    async fn wait_for_previous_instance(
        &self,
        ttl: Duration,
    ) -> Result<Option<String>, StoreError> {
        let stale_after = i64::try_from((ttl * 2 / 3).as_millis()).unwrap_or(i64::MAX);
        let mut first: Option<String> = None;
        loop {
            let row = self
                .run(false, |client| async move {
                    Ok::<_, PgFailure>(
                        client
                            .query_opt(
                                "SELECT heartbeat_at::text,
                                        (extract(epoch FROM now() - heartbeat_at) * 1000)::bigint
                                 FROM mcp_nodes WHERE node_id = $1",
                                &[&self.node],
                            )
                            .await?,
                    )
                })
                .await?;
            let Some(row) = row else { return Ok(None) };
            let beat: String = row.get(0);
            let age_ms: i64 = row.get(1);
            if first.as_ref().is_some_and(|first| *first != beat) {
                return Err(StoreError::NodeIdInUse {
                    store: self.label.clone(),
                    node: self.node.clone(),
                });
            }
            if age_ms > stale_after {
                return Ok(Some(beat));
            }
            if first.is_none() {
                tracing::info!(node = %self.node, age_ms,
                    "this node id's heartbeat is recent: waiting to see whether another process still renews it");
                first = Some(beat);
            }
            tokio::time::sleep((ttl / 20).max(Duration::from_millis(20))).await;
        }
    }

    /// Whether this node itself found the database unreachable after a lapsed owner's last
    /// heartbeat `beat` (ms, database time): then the lapse was a database outage (or a
    /// partition) this node saw too, not evidence that the owner's process ended, and the
    /// takeover does not count against the task's restart budget.
    fn outage_since(&self, id: &str, beat: Option<i64>) -> bool {
        let Some(beat) = beat else { return false };
        let outage = self.last_outage_ms.load(Ordering::SeqCst);
        let since = outage != 0 && outage >= to_u64(beat);
        if since {
            tracing::info!(task = id, node = %self.node,
                "took over a task whose owner's heartbeat lapsed during a database outage this node saw too: not counted against its restart budget");
        }
        since
    }
}

/// Renews the node's lease every third of the TTL until the store is dropped or closed.
pub(super) async fn heartbeat(inner: std::sync::Weak<Inner>) {
    let mut last_ok = tokio::time::Instant::now();
    let mut warned = false;
    loop {
        let period = match inner.upgrade() {
            Some(inner) => inner.lease_ttl / 3,
            None => return,
        };
        tokio::time::sleep(period).await;
        let Some(inner) = inner.upgrade() else { return };
        if inner.closed.load(Ordering::SeqCst) {
            return;
        }
        if inner.heartbeat_paused.load(Ordering::SeqCst) {
            continue;
        }
        let sent = std::time::Instant::now();
        match inner.heartbeat_once().await {
            Ok(false) => {
                *inner.renewal_sent.lock().unwrap_or_else(|e| e.into_inner()) = None;
                tracing::error!(node = %inner.node,
                    "another process started with this node id and took its tasks over: this process's writes are refused (fenced) from now on and it no longer renews the node's heartbeat; stop it");
                return;
            }
            Ok(true) => {
                inner.reachable();
                *inner.renewed.lock().unwrap_or_else(|e| e.into_inner()) =
                    tokio::time::Instant::now();
                {
                    let mut last = inner.renewal_sent.lock().unwrap_or_else(|e| e.into_inner());
                    // Acknowledged later than the previous renewal's lease could last (or the
                    // first): another node may have taken tasks over meanwhile.
                    let margin = inner.lease_ttl / 3;
                    if last.is_none_or(|prev| prev.elapsed() + margin >= inner.lease_ttl) {
                        inner.lease_gaps.fetch_add(1, Ordering::SeqCst);
                    }
                    *last = Some(sent);
                }
                if warned {
                    tracing::warn!(node = %inner.node,
                        "heartbeat renewed after the lease lapsed: tasks other nodes took over meanwhile are theirs (this node's writes to them are fenced)");
                }
                last_ok = tokio::time::Instant::now();
                warned = false;
                // Housekeeping, by the sweep leader alone.
                if inner.hub.leader.load(Ordering::SeqCst) {
                    match inner.forget_old_commands().await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(commands = n, "forgot commands nobody took"),
                        Err(e) => {
                            let e = inner.fail(e, true);
                            tracing::debug!(error = %e, "forgetting old commands failed");
                        }
                    }
                    match inner.forget_old_listing().await {
                        Ok(0) => {}
                        Ok(n) => tracing::debug!(
                            rows = n,
                            "dropped old throughput buckets and empty listing counters"
                        ),
                        Err(e) => {
                            let e = inner.fail(e, true);
                            tracing::debug!(error = %e, "dropping old throughput buckets failed");
                        }
                    }
                }
            }
            Err(e) => {
                let e = inner.fail(e, true);
                if !warned && last_ok.elapsed() > inner.lease_ttl {
                    warned = true;
                    tracing::error!(node = %inner.node, error = %e,
                        "this node's lease lapsed (no heartbeat for longer than the lease TTL): other nodes may take its tasks over");
                } else {
                    tracing::warn!(node = %inner.node, error = %e, "heartbeat failed");
                }
            }
        }
    }
}

impl Inner {
    /// Renews this node's heartbeat, and samples the database's clock. `Ok(false)`: another
    /// process runs as this node id now (its start took this node's tasks over).
    async fn heartbeat_once(&self) -> Result<bool, PgFailure> {
        let client = self.client().await?;
        let st = client
            .prepare_cached(
                "INSERT INTO mcp_nodes (node_id, started_at, heartbeat_at, instance)
                 VALUES ($1, now(), now(), $2)
                 ON CONFLICT (node_id) DO UPDATE SET heartbeat_at = now()
                    WHERE mcp_nodes.instance IS NOT DISTINCT FROM $2
                 RETURNING (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            )
            .await?;
        let sent = std::time::Instant::now();
        let row = client.query_opt(&st, &[&self.node, &self.instance]).await?;
        let received = std::time::Instant::now();
        match row {
            Some(row) => {
                self.reference.record(to_u64(row.get(0)), sent, received);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// Commands whose answer nobody took, or whose task finished without answering them, are
/// forgotten after this long. No sender waits that long: a sender that stops waiting
/// withdraws its command if no node took it (`Cluster::withdraw_command`), so what is left
/// here is a command a node took (applied or being applied; its sender was told it may have
/// been) or one whose sender died.
const COMMAND_RETENTION_SECS: f64 = 600.0;

impl Inner {
    /// Forgets commands nobody will take any more (see [`COMMAND_RETENTION_SECS`]).
    async fn forget_old_commands(&self) -> Result<u64, PgFailure> {
        let client = self.client().await?;
        let st = client
            .prepare_cached(
                "DELETE FROM mcp_commands WHERE created_at < now() - make_interval(secs => $1)",
            )
            .await?;
        Ok(client.execute(&st, &[&COMMAND_RETENTION_SECS]).await?)
    }

    /// Drops throughput buckets older than `listing::THROUGHPUT_RETENTION_MS` (by the
    /// database's clock) and listing counters down to zero, at most [`HOUSEKEEPING_BATCH`]
    /// rows of each. Returns the rows dropped.
    async fn forget_old_listing(&self) -> Result<u64, PgFailure> {
        let client = self.client().await?;
        let buckets = client
            .prepare_cached(
                "DELETE FROM mcp_throughput WHERE (minute_ms, kind, shard) IN (
                    SELECT minute_ms, kind, shard FROM mcp_throughput
                    WHERE minute_ms < (extract(epoch FROM now()) * 1000)::bigint - $1
                    LIMIT $2)",
            )
            .await?;
        let retention = to_i64(crate::listing::THROUGHPUT_RETENTION_MS);
        let mut dropped = client
            .execute(&buckets, &[&retention, &HOUSEKEEPING_BATCH])
            .await?;
        // `tasks = 0` again outside: a counter a commit moves meanwhile is kept.
        let counters = client
            .prepare_cached(
                "DELETE FROM mcp_listing_counts WHERE tasks = 0
                   AND (owner, tool, status, shard) IN (
                    SELECT owner, tool, status, shard FROM mcp_listing_counts
                    WHERE tasks = 0 LIMIT $1)",
            )
            .await?;
        dropped += client.execute(&counters, &[&HOUSEKEEPING_BATCH]).await?;
        Ok(dropped)
    }
}

/// The most rows of each kind one round of the sweep leader's housekeeping drops.
const HOUSEKEEPING_BATCH: i64 = 1000;

impl Inner {
    /// Claims live tasks for this node: `own` = those this node id held (at start, all at
    /// once); otherwise at most `limit` of those no live node holds, the first in id order
    /// past `after` (the `ORDER BY` walks the primary key from there: a claimer that goes on
    /// past each full batch reads each row once). Bumps their epochs; sorted by id.
    pub(super) async fn claim(
        &self,
        own: bool,
        after: &str,
        limit: i64,
    ) -> Result<Vec<(String, Vec<u8>)>, PgFailure> {
        let client = self.client().await?;
        let ttl = self.lease_ttl.as_secs_f64();
        // The fourth column: whether the lease lapsed (its node stopped without releasing it;
        // a task this node id still holds at start was not released by its previous process).
        // The fifth: the lapsed owner's last heartbeat (ms since the epoch, database time);
        // the sixth and seventh: its node id and the instance token of the process it was.
        //
        // The lapsed owners' node rows are locked (`FOR SHARE`) by the claim: a renewal of such
        // a node that committed after this statement's snapshot makes PostgreSQL re-check the
        // row, which then no longer counts as lapsed (its tasks are left alone), and one that
        // comes later waits for this claim to commit. Either way the claim is ordered before
        // or after the renewal, never across it, so the reconciliation the renewed node runs
        // next sees every task claimed from it ([`Cluster::reads_from_memory`] relies on it).
        // A row a renewal holds locked right now is skipped: its node is alive.
        let sql = if own {
            "UPDATE mcp_tasks t SET owner_node = $1, lease_epoch = t.lease_epoch + 1
             WHERE t.live AND t.owner_node = $1
             RETURNING t.id, t.bytes, t.lease_epoch, true, NULL::bigint, NULL::text, NULL::text"
        } else {
            "WITH lapsed AS MATERIALIZED (
                SELECT node_id, heartbeat_at, instance FROM mcp_nodes
                WHERE node_id <> $1 AND heartbeat_at < now() - make_interval(secs => $2)
                FOR SHARE SKIP LOCKED),
             c AS (
                SELECT t.id, t.owner_node IS NOT NULL AS lapsed,
                       (extract(epoch FROM n.heartbeat_at) * 1000)::bigint AS beat,
                       t.owner_node AS node, n.instance AS instance
                FROM mcp_tasks t
                LEFT JOIN lapsed n ON n.node_id = t.owner_node
                WHERE t.live AND t.id > $4
                  AND (t.owner_node IS NULL
                       OR (t.owner_node <> $1
                           AND (n.node_id IS NOT NULL
                                OR NOT EXISTS (SELECT 1 FROM mcp_nodes m
                                               WHERE m.node_id = t.owner_node))))
                ORDER BY t.id
                LIMIT $3
                FOR UPDATE OF t SKIP LOCKED)
             UPDATE mcp_tasks t SET owner_node = $1, lease_epoch = t.lease_epoch + 1
             FROM c WHERE t.id = c.id
             RETURNING t.id, t.bytes, t.lease_epoch, c.lapsed, c.beat, c.node, c.instance"
        };
        let st = client.prepare_cached(sql).await?;
        let rows = if own {
            client.query(&st, &[&self.node]).await?
        } else {
            client
                .query(&st, &[&self.node, &ttl, &limit, &after])
                .await?
        };
        let mut out = Vec::with_capacity(rows.len());
        let mut held = self.held();
        let mut lapsed = self.lapsed.lock().unwrap_or_else(|e| e.into_inner());
        let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        for row in rows {
            let id: String = row.get(0);
            let bytes: Vec<u8> = row.get(1);
            let epoch: i64 = row.get(2);
            let beat: Option<i64> = row.get(4);
            watched.remove(&id);
            if row.get::<_, bool>(3) && !self.outage_since(&id, beat) {
                lapsed.insert(id.clone());
                let node: Option<String> = row.get(5);
                let instance: Option<String> = row.get(6);
                if let (Some(node), Some(instance), Some(beat)) = (node, instance, beat) {
                    watched.insert(
                        id.clone(),
                        LapsedOwner {
                            node,
                            instance,
                            beat,
                        },
                    );
                }
            } else {
                lapsed.remove(&id);
            }
            held.insert(id.clone(), epoch);
            out.push((id, bytes));
        }
        drop(lapsed);
        drop(watched);
        out.sort_by(|a, b| a.0.cmp(&b.0));
        if !out.is_empty() {
            tracing::info!(node = %self.node, tasks = out.len(), own, "claimed live tasks");
            // Commands other nodes recorded for them are this node's to answer now.
            self.hub.inbox.notify_one();
        }
        Ok(out)
    }
}

/// The process that held a task whose lapsed lease this node took over, counting an attempt
/// against the task's restart budget (see [`Inner::watched`]).
#[derive(Debug, Clone)]
pub(super) struct LapsedOwner {
    node: String,
    instance: String,
    /// Its last heartbeat before the takeover (ms since the epoch, database time).
    beat: i64,
}

impl Inner {
    /// The watched takeovers ([`Inner::watched`]) whose previous owner has renewed its
    /// heartbeat since, in the same process (its instance token): that run ended in a pause,
    /// not a crash, so the attempt the takeover counted is to be given back. A takeover whose
    /// previous node id now runs another process (a restart: the process ended), or whose
    /// node row is gone, is no longer watched, and neither is a task this node stopped
    /// holding; one whose owner is still silent stays watched.
    async fn paused_owners(
        &self,
        client: &deadpool_postgres::Object,
    ) -> Result<Vec<String>, PgFailure> {
        let watched: Vec<(String, LapsedOwner)> = {
            let held = self.held();
            let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
            watched.retain(|id, _| held.contains_key(id));
            watched
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        if watched.is_empty() {
            return Ok(Vec::new());
        }
        let mut nodes: Vec<&str> = watched.iter().map(|(_, o)| o.node.as_str()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        let st = client
            .prepare_cached(
                "SELECT node_id, instance, (extract(epoch FROM heartbeat_at) * 1000)::bigint
                 FROM mcp_nodes WHERE node_id = ANY($1)",
            )
            .await?;
        let rows: HashMap<String, (Option<String>, i64)> = client
            .query(&st, &[&nodes])
            .await?
            .into_iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect();
        let mut paused = Vec::new();
        let mut ended = Vec::new();
        for (id, owner) in watched {
            match rows.get(&owner.node) {
                Some((Some(instance), beat)) if *instance == owner.instance => {
                    if *beat > owner.beat {
                        paused.push(id);
                    }
                }
                _ => ended.push(id),
            }
        }
        {
            let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
            for id in paused.iter().chain(&ended) {
                watched.remove(id);
            }
        }
        paused.sort();
        if !paused.is_empty() {
            tracing::info!(node = %self.node, tasks = paused.len(), ids = ?paused,
                "the nodes these tasks were taken over from renewed their heartbeats in the same process: they were paused, not crashed, and the takeovers no longer count against the tasks' restart budgets");
        }
        Ok(paused)
    }
}

impl Inner {
    /// See [`Cluster::confirm_lease`](crate::Cluster::confirm_lease): one read of the
    /// task's lease columns.
    pub(super) async fn confirm_lease(&self, id: &str, seq: u64) -> Result<(), PgFailure> {
        if self.skip_fencing {
            return Ok(());
        }
        let Some(held) = self.held().get(id).copied() else {
            return Err(StoreError::Fenced { id: id.to_owned() }.into());
        };
        let client = self.client().await?;
        let st = client
            .prepare_cached(
                "SELECT seq, owner_node, lease_epoch, live FROM mcp_tasks WHERE id = $1",
            )
            .await?;
        let Some(row) = client.query_opt(&st, &[&id]).await? else {
            return Err(StoreError::Conflict {
                id: id.to_owned(),
                expected: Some(seq),
                found: None,
            }
            .into());
        };
        let found = row.get::<_, Option<i64>>(0).map(to_u64);
        let owner: Option<String> = row.get(1);
        let epoch: i64 = row.get(2);
        let live: bool = row.get(3);
        if owner.as_deref() == Some(self.node.as_str()) && epoch == held && live {
            if found.is_none_or(|f| f == seq) {
                return Ok(());
            }
            return Err(StoreError::Conflict {
                id: id.to_owned(),
                expected: Some(seq),
                found,
            }
            .into());
        }
        let mut map = self.held();
        if map.get(id) == Some(&held) {
            map.remove(id);
        }
        drop(map);
        tracing::warn!(task = id, node = %self.node, held, owner = ?owner, epoch, live,
            "an acknowledgement that writes nothing was refused: another node holds the task's lease (fenced)");
        Err(StoreError::Fenced { id: id.to_owned() }.into())
    }

    /// See [`Cluster::reconcile`](crate::Cluster::reconcile): reads the live rows
    /// leased to this node id, drops the leases this process believes it holds that the store
    /// no longer gives it, and claims (epoch + 1) the rows at this node id that it does not
    /// hold, except those whose creation commit is still in flight.
    pub(super) async fn reconcile(&self) -> Result<Reconciled, PgFailure> {
        if self.skip_fencing {
            // The test-only unsafe mode stands for a node without lease checks at all.
            return Ok(Reconciled::default());
        }
        // The lease gaps this reconciliation covers: those of renewals acknowledged before it
        // reads the rows.
        let gaps = self.lease_gaps.load(Ordering::SeqCst);
        let reconciled = self.reconcile_leases().await?;
        self.gap_reconciled.fetch_max(gaps, Ordering::SeqCst);
        Ok(reconciled)
    }

    /// [`Inner::reconcile`]'s comparison of the held leases with the rows.
    async fn reconcile_leases(&self) -> Result<Reconciled, PgFailure> {
        let before: HashMap<String, i64> = self.held().clone();
        let client = self.client().await?;
        let st = client
            .prepare_cached("SELECT id, lease_epoch FROM mcp_tasks WHERE live AND owner_node = $1")
            .await?;
        let stored: HashMap<String, i64> = client
            .query(&st, &[&self.node])
            .await?
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let mut out = Reconciled::default();
        let mut candidates = Vec::new();
        {
            let mut held = self.held();
            let creating = self.creating.lock().unwrap_or_else(|e| e.into_inner());
            for (id, epoch) in &before {
                // Unchanged since the read began (a claim meanwhile bumped it: left alone).
                if stored.get(id) != Some(epoch) && held.get(id) == Some(epoch) {
                    held.remove(id);
                    out.lost.push(id.clone());
                }
            }
            for (id, epoch) in &stored {
                if !before.contains_key(id) && !held.contains_key(id) && !creating.contains_key(id)
                {
                    candidates.push((id.clone(), *epoch));
                }
            }
        }
        for (id, epoch) in candidates {
            let st = client
                .prepare_cached(
                    "UPDATE mcp_tasks SET lease_epoch = lease_epoch + 1
                     WHERE id = $1 AND live AND owner_node = $2 AND lease_epoch = $3
                     RETURNING bytes, lease_epoch",
                )
                .await?;
            if let Some(row) = client.query_opt(&st, &[&id, &self.node, &epoch]).await? {
                let new: i64 = row.get(1);
                let mut held = self.held();
                if held.get(&id).is_some_and(|e| *e >= new) {
                    continue;
                }
                held.insert(id.clone(), new);
                out.forgotten.push((id, row.get(0)));
            }
        }
        out.paused = self.paused_owners(&client).await?;
        out.lost.sort();
        out.forgotten.sort_by(|a, b| a.0.cmp(&b.0));
        if !out.lost.is_empty() {
            tracing::warn!(node = %self.node, tasks = out.lost.len(), ids = ?out.lost,
                "this node no longer holds the leases of tasks it ran (another node took them over or finished them): their actors stop");
        }
        if !out.forgotten.is_empty() {
            let ids: Vec<&str> = out.forgotten.iter().map(|(id, _)| id.as_str()).collect();
            tracing::warn!(node = %self.node, tasks = ids.len(), ?ids,
                "live tasks leased to this node had no lease here (a lost commit acknowledgement): claimed anew and run");
            self.hub.inbox.notify_one();
        }
        Ok(out)
    }
}

#[cfg(test)]
mod bounds_tests {
    use super::*;

    #[test]
    fn session_bounds_follow_the_lease_ttl_with_floors() {
        let b = SessionBounds::for_lease_ttl(Duration::from_secs(15));
        assert_eq!(
            (b.statement, b.lock, b.idle),
            (
                Duration::from_secs(15),
                Duration::from_secs(5),
                Duration::from_secs(15)
            )
        );
        let b = SessionBounds::for_lease_ttl(Duration::from_millis(600));
        assert_eq!(
            (b.statement, b.lock, b.idle),
            (
                Duration::from_secs(5),
                Duration::from_secs(1),
                Duration::from_secs(5)
            )
        );
        assert_eq!(
            session_timeouts(Duration::from_secs(15)),
            "-c statement_timeout=15000 -c lock_timeout=5000 -c idle_in_transaction_session_timeout=15000"
        );
    }
}
