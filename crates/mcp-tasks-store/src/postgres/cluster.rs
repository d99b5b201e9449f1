//! `impl Cluster for PostgresStore`: claims and takeovers, commands for other nodes' tasks,
//! wake-ups, flow control and what the operator console reads.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{PgFailure, PostgresStore, flow, to_i64, to_u64};
use crate::{Cluster, Reconciled, RemoteCommand, StoreError, StoreFuture, Wakeup};

/// Orphans claimed per statement.
const CLAIM_BATCH: i64 = 256;

impl Cluster for PostgresStore {
    fn node_id(&self) -> &str {
        &self.inner.node
    }
    fn claim_live(&self) -> StoreFuture<'_, Vec<(String, Vec<u8>)>> {
        Box::pin(async move {
            self.inner.check_open()?;
            let mut all = self
                .inner
                .claim(true, "", 0)
                .await
                .map_err(|e| self.inner.fail(e, true))?;
            let mut after = String::new();
            loop {
                let batch = self
                    .inner
                    .claim(false, &after, CLAIM_BATCH)
                    .await
                    .map_err(|e| self.inner.fail(e, true))?;
                let done = (batch.len() as i64) < CLAIM_BATCH;
                if let Some((last, _)) = batch.last() {
                    after.clone_from(last);
                }
                all.extend(batch);
                if done {
                    break;
                }
            }
            all.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(all)
        })
    }
    fn claim_orphans<'a>(
        &'a self,
        after: &'a str,
        limit: usize,
    ) -> StoreFuture<'a, Vec<(String, Vec<u8>)>> {
        Box::pin(async move {
            self.inner.check_open()?;
            let limit = limit.min(i64::MAX as usize) as i64;
            self.inner
                .claim(false, after, limit)
                .await
                .map_err(|e| self.inner.fail(e, true))
        })
    }
    fn holds(&self, id: &str) -> bool {
        self.inner.held().contains_key(id)
    }
    fn reads_from_memory(&self, id: &str) -> bool {
        let inner = &self.inner;
        if inner.skip_fencing || inner.heartbeat_paused.load(Ordering::SeqCst) {
            return false;
        }
        let sent = *inner.renewal_sent.lock().unwrap_or_else(|e| e.into_inner());
        let margin = inner.lease_ttl / 3;
        sent.is_some_and(|sent| sent.elapsed() + margin < inner.lease_ttl)
            && inner.gap_reconciled.load(Ordering::SeqCst)
                >= inner.lease_gaps.load(Ordering::SeqCst)
            && inner.held().contains_key(id)
    }
    fn claim_interval(&self) -> Duration {
        self.inner.lease_ttl / 3
    }
    fn took_from_lapsed(&self, id: &str) -> bool {
        self.inner
            .lapsed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id)
    }
    fn confirm_lease<'a>(&'a self, id: &'a str, seq: u64) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            self.inner.check_open()?;
            self.inner
                .confirm_lease(id, seq)
                .await
                .map_err(|e| self.inner.fail(e, false))
        })
    }
    fn reconcile(&self) -> StoreFuture<'_, Reconciled> {
        Box::pin(async move {
            self.inner.check_open()?;
            self.inner
                .reconcile()
                .await
                .map_err(|e| self.inner.fail(e, true))
        })
    }
    fn watch_reconcile(&self) -> Wakeup {
        Wakeup::new(self.inner.reconcile_now.clone(), None)
    }
    fn claim_one<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Vec<u8>>> {
        Box::pin(async move {
            self.inner
                .run(true, |client| async move {
                    // NOWAIT: a row locked by another session (a replica paused inside its
                    // write, or the owner's node row inside a renewal) is not waited for; the
                    // request is answered "busy, retry". The task is taken only from no node,
                    // this node, or a node whose lease lapsed, with that node's row locked as
                    // in `Inner::claim` (a renewal that overtook the caller's look at the
                    // owner keeps the task with it).
                    let st = client
                        .prepare_cached(
                            "WITH lapsed AS MATERIALIZED (
                                SELECT n.node_id FROM mcp_nodes n
                                JOIN mcp_tasks o ON o.owner_node = n.node_id AND o.id = $1
                                WHERE n.node_id <> $2
                                  AND n.heartbeat_at < now() - make_interval(secs => $3)
                                FOR SHARE OF n NOWAIT),
                             c AS (SELECT t.id FROM mcp_tasks t WHERE t.id = $1 AND t.live
                                     AND (t.owner_node IS NULL OR t.owner_node = $2
                                          OR t.owner_node IN (SELECT node_id FROM lapsed)
                                          OR NOT EXISTS (SELECT 1 FROM mcp_nodes m
                                                         WHERE m.node_id = t.owner_node))
                                   FOR UPDATE OF t NOWAIT)
                         UPDATE mcp_tasks t SET owner_node = $2, lease_epoch = t.lease_epoch + 1
                         FROM c WHERE t.id = c.id
                         RETURNING t.bytes, t.lease_epoch",
                        )
                        .await?;
                    let ttl = self.inner.lease_ttl.as_secs_f64();
                    let row = match client
                        .query_opt(&st, &[&id, &self.inner.node, &ttl])
                        .await
                    {
                        Err(e)
                            if e.code()
                                == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) =>
                        {
                            tracing::warn!(task = id, node = %self.inner.node,
                                "not taking the task over now: its row is locked by another session (a replica paused inside a write?)");
                            return Err(PgFailure::Store(StoreError::Busy {
                                detail: format!(
                                    "task {id} is locked by another session's open transaction"
                                ),
                            }));
                        }
                        other => other?,
                    };
                    let Some(r) = row else {
                        // Not live, or held by a node whose lease holds (it renewed since the
                        // caller looked): the latter is asked to retry, reaching that node.
                        let owner = client
                            .query_opt(
                                "SELECT owner_node FROM mcp_tasks WHERE id = $1 AND live",
                                &[&id],
                            )
                            .await?
                            .and_then(|r| r.get::<_, Option<String>>(0));
                        return match owner {
                            Some(node) => Err(PgFailure::Store(StoreError::Busy {
                                detail: format!(
                                    "task {id} is held by node {node}, whose lease holds again"
                                ),
                            })),
                            None => Ok(None),
                        };
                    };
                    let epoch: i64 = r.get(1);
                    self.inner.held().insert(id.to_owned(), epoch);
                    self.inner.hub.inbox.notify_one();
                    Ok::<_, PgFailure>(Some(r.get::<_, Vec<u8>>(0)))
                })
                .await
        })
    }
    fn reference_clock(&self) -> Option<Arc<crate::clock::ReferenceClock>> {
        Some(self.inner.reference.clone())
    }
    fn nodes(&self) -> StoreFuture<'_, Vec<crate::listing::NodeInfo>> {
        Box::pin(async move {
            self.inner
                .run(false, |client| async move {
                    let st = client
                        .prepare_cached(
                            "SELECT n.node_id, (extract(epoch FROM n.heartbeat_at) * 1000)::bigint,
                                    count(t.id)
                             FROM mcp_nodes n
                             LEFT JOIN mcp_tasks t ON t.live AND t.owner_node = n.node_id
                             GROUP BY n.node_id, n.heartbeat_at
                             ORDER BY n.node_id",
                        )
                        .await?;
                    let rows = client.query(&st, &[]).await?;
                    Ok::<_, PgFailure>(
                        rows.iter()
                            .map(|r| crate::listing::NodeInfo {
                                node: r.get(0),
                                heartbeat_ms: to_u64(r.get(1)),
                                leases: to_u64(r.get(2)),
                            })
                            .collect(),
                    )
                })
                .await
        })
    }
    fn lease_of<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<crate::listing::LeaseInfo>> {
        Box::pin(async move {
            self.inner
                .run(false, |client| async move {
                    // A finished task's lease is nobody's (its row keeps the last holder).
                    let st = client
                        .prepare_cached(
                            "SELECT CASE WHEN live THEN owner_node END, lease_epoch
                             FROM mcp_tasks WHERE id = $1",
                        )
                        .await?;
                    let row = client.query_opt(&st, &[&id]).await?;
                    Ok::<_, PgFailure>(row.map(|r| {
                        let epoch = to_u64(r.get(1));
                        crate::listing::LeaseInfo {
                            node: r.get(0),
                            epoch,
                            takeovers: epoch.saturating_sub(1),
                        }
                    }))
                })
                .await
        })
    }
    fn watch_commits(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        Some(self.inner.hub.commits.subscribe())
    }
    fn flow_round<'a>(
        &'a self,
        round: crate::flow::FlowRound,
        plan: &'a crate::flow::FlowPlanner,
    ) -> StoreFuture<'a, crate::flow::FlowTable> {
        Box::pin(async move {
            let inner = &self.inner;
            inner
                .run(true, |client| flow::round(inner, client, round, plan))
                .await
        })
    }
    fn watch_flow(&self) -> Wakeup {
        Wakeup::new(self.inner.hub.flow.clone(), None)
    }
    fn poll_interval(&self) -> Duration {
        self.inner.poll_interval
    }
    fn lease_ttl(&self) -> Duration {
        self.inner.lease_ttl
    }
    fn watch_task(&self, id: &str) -> Wakeup {
        self.inner.hub.tasks.watch(id)
    }
    fn watch_inbox(&self) -> Wakeup {
        Wakeup::new(self.inner.hub.inbox.clone(), None)
    }
    fn send_command<'a>(&'a self, id: &'a str, body: Vec<u8>) -> StoreFuture<'a, Option<u64>> {
        Box::pin(async move {
            self.inner
                .run(true, |client| async move {
                    // One statement, so one transaction: recorded only if another live node holds
                    // the task, and that node is signalled at the commit.
                    let st = client
                        .prepare_cached(
                            "WITH owner AS (
                            SELECT t.owner_node FROM mcp_tasks t
                            JOIN mcp_nodes n ON n.node_id = t.owner_node
                            WHERE t.id = $1 AND t.live AND t.owner_node <> $2
                              AND n.heartbeat_at >= now() - make_interval(secs => $3)),
                         cmd AS (
                            INSERT INTO mcp_commands (task_id, body)
                            SELECT $1, $4 FROM owner RETURNING seq)
                         SELECT cmd.seq, pg_notify($5, 'c ' || owner.owner_node)::text
                         FROM cmd, owner",
                        )
                        .await?;
                    let row = client
                        .query_opt(
                            &st,
                            &[
                                &id,
                                &self.inner.node,
                                &self.inner.lease_ttl.as_secs_f64(),
                                &body,
                                &self.inner.hub.channel,
                            ],
                        )
                        .await?;
                    Ok::<_, PgFailure>(row.map(|r| to_u64(r.get(0))))
                })
                .await
        })
    }
    fn take_answer(&self, seq: u64) -> StoreFuture<'_, Option<Vec<u8>>> {
        Box::pin(async move {
            self.inner
                .run(false, |client| async move {
                    let st = client
                        .prepare_cached(
                            "DELETE FROM mcp_commands WHERE seq = $1 AND answer IS NOT NULL
                         RETURNING answer",
                        )
                        .await?;
                    let row = client.query_opt(&st, &[&to_i64(seq)]).await?;
                    Ok::<_, PgFailure>(row.map(|r| r.get::<_, Vec<u8>>(0)))
                })
                .await
        })
    }
    fn forget_command(&self, seq: u64) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.inner
                .run(true, |client| async move {
                    client
                        .execute("DELETE FROM mcp_commands WHERE seq = $1", &[&to_i64(seq)])
                        .await?;
                    Ok::<_, PgFailure>(())
                })
                .await
        })
    }
    fn inbox(&self) -> StoreFuture<'_, Vec<RemoteCommand>> {
        Box::pin(async move {
            self.inner
                .run(false, |client| async move {
                    let st = client
                        .prepare_cached(
                            "SELECT c.seq, c.task_id, c.body FROM mcp_commands c
                         JOIN mcp_tasks t ON t.id = c.task_id
                         WHERE c.answer IS NULL AND t.live AND t.owner_node = $1
                         ORDER BY c.seq LIMIT 256",
                        )
                        .await?;
                    let rows = client.query(&st, &[&self.inner.node]).await?;
                    Ok::<_, PgFailure>(
                        rows.into_iter()
                            .map(|r| RemoteCommand {
                                seq: to_u64(r.get(0)),
                                task_id: r.get(1),
                                body: r.get(2),
                            })
                            .collect(),
                    )
                })
                .await
        })
    }
    fn take_command(&self, seq: u64) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            self.inner
                .run(true, |client| async move {
                    // `answered_at` without an answer: taken (a withdrawal no longer applies).
                    let st = client
                        .prepare_cached(
                            "UPDATE mcp_commands SET answered_at = now()
                             WHERE seq = $1 AND answer IS NULL RETURNING seq",
                        )
                        .await?;
                    let row = client.query_opt(&st, &[&to_i64(seq)]).await?;
                    Ok::<_, PgFailure>(row.is_some())
                })
                .await
        })
    }
    fn withdraw_command(&self, seq: u64) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            self.inner
                .run(true, |client| async move {
                    let st = client
                        .prepare_cached(
                            "DELETE FROM mcp_commands
                             WHERE seq = $1 AND answer IS NULL AND answered_at IS NULL
                             RETURNING seq",
                        )
                        .await?;
                    let row = client.query_opt(&st, &[&to_i64(seq)]).await?;
                    Ok::<_, PgFailure>(row.is_some())
                })
                .await
        })
    }
    fn answer_command<'a>(
        &'a self,
        seq: u64,
        task_id: &'a str,
        answer: Vec<u8>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            self.inner
                .run(true, |client| async move {
                    let st = client
                        .prepare_cached(
                            "WITH done AS (
                            UPDATE mcp_commands SET answer = $2, answered_at = now()
                            WHERE seq = $1 AND answer IS NULL RETURNING task_id)
                         SELECT pg_notify($3, 'a ' || $4)::text FROM done",
                        )
                        .await?;
                    client
                        .query(
                            &st,
                            &[&to_i64(seq), &answer, &self.inner.hub.channel, &task_id],
                        )
                        .await?;
                    Ok::<_, PgFailure>(())
                })
                .await
        })
    }
}
