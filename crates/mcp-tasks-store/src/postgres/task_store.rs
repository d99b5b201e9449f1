//! `impl TaskStore for PostgresStore`: commits, reads, pages, usage and listing, readiness
//! and close.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use futures::future::BoxFuture;

use super::commit::{Creating, outcome_unknown};
use super::{PgFailure, PostgresStore, group, listing, pg_detail, put_ids, to_i64, to_u64};
use crate::{Cluster, StoreFuture, StoreStats, TaskStore, WriteOp};

/// Every owner's stored tasks and bytes, by owner (the sum of its usage rows: one per owner
/// in schema versions 3 and 4, one per shard of its task ids from version 5 on).
pub(crate) const USAGE_BY_OWNER: &str = "SELECT owner, sum(tasks)::bigint, sum(bytes)::bigint
     FROM mcp_usage GROUP BY owner ORDER BY owner";

/// The tables of the store (those of the schema version it has), in bytes with their
/// indexes and TOAST: `TaskStore::stored_bytes`.
const STORED_BYTES: &str = "SELECT sum(pg_total_relation_size(r))::bigint
     FROM unnest(ARRAY['mcp_tasks', 'mcp_meta', 'mcp_nodes', 'mcp_schema', 'mcp_commands',
                       'mcp_usage', 'mcp_listing_counts', 'mcp_throughput']) AS t,
          to_regclass(t) AS r
     WHERE r IS NOT NULL";

impl TaskStore for PostgresStore {
    fn cluster(&self) -> Option<&dyn Cluster> {
        Some(self)
    }
    fn describe(&self) -> String {
        self.inner.label.clone()
    }
    fn boot_epoch(&self) -> u64 {
        self.inner.boot_epoch
    }
    fn commit(&self, ops: Vec<WriteOp>) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.inner.check_open()?;
            let n = ops.len() as u64;
            let started = std::time::Instant::now();
            let _creating = Creating::register(&self.inner, &ops);
            let grouped = if self.inner.group_commit {
                group::groupable(ops)
            } else {
                Err(ops)
            };
            let outcome = match grouped {
                // The group announces its commits itself, once per group.
                Ok(op) => self.inner.commit_grouped(op).await,
                Err(ops) => {
                    let outcome = self.inner.commit_job(&ops).await;
                    if outcome.is_ok() {
                        self.inner.announce(put_ids(&ops));
                    }
                    outcome
                }
            };
            let outcome = self.inner.maybe_lose_ack(outcome);
            if let Err(e) = &outcome
                && outcome_unknown(e)
            {
                // Committed or not, nobody knows: the leases this node holds are compared
                // with the rows soon, so that a task created or changed here anyway is run.
                self.inner.reconcile_now.notify_one();
            }
            match outcome {
                Ok((leases, deleted)) => {
                    crate::telemetry::commit(started.elapsed(), n as usize);
                    self.inner.deleted.fetch_add(deleted, Ordering::Relaxed);
                    self.inner.reachable();
                    self.inner.commits.fetch_add(1, Ordering::Relaxed);
                    self.inner.ops.fetch_add(n, Ordering::Relaxed);
                    let mut held = self.inner.held();
                    for (id, lease) in leases {
                        match lease {
                            Some(epoch) => held.insert(id, epoch),
                            None => held.remove(&id),
                        };
                    }
                    Ok(())
                }
                Err(e) => Err(self.inner.fail(e, true)),
            }
        })
    }
    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Vec<u8>>> {
        Box::pin(async move {
            self.inner
                .run(false, |client| async move {
                    let st = client
                        .prepare_cached("SELECT bytes FROM mcp_tasks WHERE id = $1")
                        .await?;
                    let row = client.query_opt(&st, &[&id]).await?;
                    Ok::<_, PgFailure>(row.map(|r| r.get::<_, Vec<u8>>(0)))
                })
                .await
        })
    }
    fn get_many(&self, ids: Vec<String>) -> StoreFuture<'_, Vec<Option<Vec<u8>>>> {
        Box::pin(async move {
            self.inner
                .run(false, |client| async move {
                    let st = client
                        .prepare_cached("SELECT id, bytes FROM mcp_tasks WHERE id = ANY($1)")
                        .await?;
                    let rows = client.query(&st, &[&ids]).await?;
                    let mut found: HashMap<String, Vec<u8>> =
                        rows.into_iter().map(|r| (r.get(0), r.get(1))).collect();
                    Ok::<_, PgFailure>(ids.iter().map(|id| found.remove(id)).collect())
                })
                .await
        })
    }
    fn live(&self) -> StoreFuture<'_, Vec<(String, Vec<u8>)>> {
        self.rows("SELECT id, bytes FROM mcp_tasks WHERE live ORDER BY id")
    }
    fn due(&self, now_ms: u64, limit: usize) -> StoreFuture<'_, Vec<String>> {
        Box::pin(async move {
            self.inner
                .run(false, |client| async move {
                    // Live tasks are expired by the node that holds their lease; finished ones are
                    // deleted by the sweep leader alone: each due task is looked at by one node.
                    let st = client
                        .prepare_cached(
                            "SELECT id FROM mcp_tasks WHERE due_ms IS NOT NULL AND due_ms <= $1
                           AND ((live AND owner_node = $3) OR (NOT live AND $4))
                         ORDER BY due_ms, id LIMIT $2",
                        )
                        .await?;
                    let leader = self.inner.hub.leader.load(Ordering::SeqCst);
                    let rows = client
                        .query(
                            &st,
                            &[
                                &to_i64(now_ms),
                                &(limit.min(i64::MAX as usize) as i64),
                                &self.inner.node,
                                &leader,
                            ],
                        )
                        .await?;
                    Ok::<_, PgFailure>(rows.into_iter().map(|r| r.get(0)).collect())
                })
                .await
        })
    }
    fn next_due(&self) -> StoreFuture<'_, Option<u64>> {
        Box::pin(async move {
            self.inner
                .run(false, |client| async move {
                    let row = client
                        .query_one("SELECT min(due_ms) FROM mcp_tasks", &[])
                        .await?;
                    Ok::<_, PgFailure>(row.get::<_, Option<i64>>(0).map(to_u64))
                })
                .await
        })
    }
    fn meta_get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Vec<u8>>> {
        Box::pin(async move {
            self.inner
                .run(false, |client| async move {
                    let row = client
                        .query_opt("SELECT value FROM mcp_meta WHERE key = $1", &[&key])
                        .await?;
                    Ok::<_, PgFailure>(row.map(|r| r.get::<_, Vec<u8>>(0)))
                })
                .await
        })
    }
    fn meta_page<'a>(
        &'a self,
        prefix: &'a str,
        after: Option<&'a str>,
        limit: usize,
    ) -> StoreFuture<'a, Vec<(String, Vec<u8>)>> {
        // The key order is the column's collation; `>` and `ORDER BY` share it, so a walk
        // page by page sees every key once whatever the collation. The prefix is a filter,
        // not a range, for the same reason.
        Box::pin(async move {
            let limit = i64::try_from(limit.min(crate::MAX_PAGE)).unwrap_or(0);
            self.inner
                .run(false, |client| async move {
                    let st = client
                        .prepare_cached(
                            "SELECT key, value FROM mcp_meta
                             WHERE starts_with(key, $1) AND ($2::text IS NULL OR key > $2)
                             ORDER BY key LIMIT $3",
                        )
                        .await?;
                    let rows = client.query(&st, &[&prefix, &after, &limit]).await?;
                    Ok::<_, PgFailure>(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
                })
                .await
        })
    }
    fn tasks(&self) -> StoreFuture<'_, Vec<(String, Vec<u8>)>> {
        self.rows("SELECT id, bytes FROM mcp_tasks ORDER BY id")
    }
    fn stored_bytes(&self) -> StoreFuture<'_, Option<u64>> {
        Box::pin(async move {
            self.inner
                .run(false, |client| async move {
                    let st = client.prepare_cached(STORED_BYTES).await?;
                    let row = client.query_one(&st, &[]).await?;
                    Ok::<_, PgFailure>(row.get::<_, Option<i64>>(0).map(to_u64))
                })
                .await
        })
    }
    fn counts(&self) -> StoreFuture<'_, (u64, u64)> {
        Box::pin(async move {
            self.inner
                .run(false, |client| async move {
                    let row = client
                        .query_one(
                            "SELECT count(*), count(*) FILTER (WHERE live) FROM mcp_tasks",
                            &[],
                        )
                        .await?;
                    Ok::<_, PgFailure>((to_u64(row.get(0)), to_u64(row.get(1))))
                })
                .await
        })
    }
    fn stats(&self) -> StoreStats {
        StoreStats {
            commits: self.inner.commits.load(Ordering::Relaxed),
            ops: self.inner.ops.load(Ordering::Relaxed),
            cached_reads: 0,
        }
    }
    fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }
    fn halted(&self) -> Option<String> {
        // PostgreSQL recovers on its own after a crash: the store never halts for good.
        None
    }
    fn wait_halted(&self) -> BoxFuture<'_, String> {
        Box::pin(std::future::pending())
    }
    fn unavailable(&self) -> Option<String> {
        self.inner
            .unavailable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    fn ready(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let inner = &self.inner;
            if self.is_closed() {
                return Err("the task store is closed".to_owned());
            }
            let age = inner
                .renewed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .elapsed();
            if age > inner.lease_ttl {
                return Err(format!(
                    "this node's lease was last renewed {} ms ago, more than the lease TTL ({} ms): other nodes may take its tasks over",
                    age.as_millis(),
                    inner.lease_ttl.as_millis()
                ));
            }
            // The database answers (within a third of the TTL, the heartbeat's own period).
            let ping = async {
                let client = inner.client().await.map_err(|e| match e {
                    PgFailure::Pool(detail) => detail,
                    PgFailure::Pg(e) => pg_detail(&e),
                    PgFailure::Store(e) => e.to_string(),
                })?;
                client
                    .simple_query("SELECT 1")
                    .await
                    .map(drop)
                    .map_err(|e| pg_detail(&e))
            };
            match tokio::time::timeout(inner.lease_ttl / 3, ping).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(detail)) => Err(format!("the database is unreachable: {detail}")),
                Err(_) => Err(format!(
                    "the database did not answer within {} ms",
                    (inner.lease_ttl / 3).as_millis()
                )),
            }
        })
    }
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if self.inner.closed.swap(true, Ordering::SeqCst) {
                return;
            }
            if let Some(task) = self
                .inner
                .heartbeat
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
            {
                task.abort();
            }
            self.inner.hub.closed.store(true, Ordering::SeqCst);
            if let Some(task) = self
                .inner
                .listener
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
            {
                task.abort();
            }
            // Hands this node's live tasks over at once (a rolling deploy does not wait for
            // the lease to lapse): the next claim of another node bumps their epochs.
            let release = async {
                let client = self.inner.client().await?;
                let released = client
                    .execute(
                        "UPDATE mcp_tasks SET owner_node = NULL WHERE live AND owner_node = $1",
                        &[&self.inner.node],
                    )
                    .await?;
                client
                    .execute(
                        "DELETE FROM mcp_nodes WHERE node_id = $1",
                        &[&self.inner.node],
                    )
                    .await?;
                Ok::<_, PgFailure>(released)
            };
            match release.await {
                Ok(released) => {
                    tracing::info!(node = %self.inner.node, released, "PostgreSQL task store closed; leases released")
                }
                Err(e) => {
                    let e = self.inner.fail(e, true);
                    tracing::warn!(node = %self.inner.node, error = %e,
                        "could not release this node's leases at close; other nodes take its tasks over once the lease TTL passes");
                }
            }
            self.inner.held().clear();
            self.inner.pool.close();
        })
    }

    fn index(&self) -> Option<&dyn crate::Index> {
        Some(self)
    }
}

impl crate::Index for PostgresStore {
    fn owned<'a>(
        &'a self,
        owner: &'a str,
        after: Option<crate::OwnedCursor>,
        limit: usize,
    ) -> StoreFuture<'a, Vec<crate::OwnedRecord>> {
        Box::pin(async move {
            let limit = i64::try_from(limit.min(crate::MAX_PAGE)).unwrap_or(0);
            let (created, id) = match &after {
                Some(a) => (to_i64(a.created_ms), a.id.clone()),
                None => (-1, String::new()),
            };
            self.inner
                .run(false, |client| async move {
                    let st = client
                        .prepare_cached(
                            // At most `limit` rows and, past the first, none once the
                            // page holds `MAX_PAGE_BYTES` (`octet_length` reads a TOASTed
                            // value's size without fetching it).
                            "SELECT id, created_ms, bytes FROM (
                                SELECT id, created_ms, bytes,
                                       sum(octet_length(bytes))
                                           OVER (ORDER BY created_ms, id) AS running
                                FROM mcp_tasks
                                WHERE task_owner = $1 AND (created_ms, id) > ($2, $3)
                                ORDER BY created_ms, id LIMIT $4
                             ) AS page
                             WHERE running - octet_length(bytes) < $5
                             ORDER BY created_ms, id",
                        )
                        .await?;
                    let budget = i64::try_from(crate::MAX_PAGE_BYTES).unwrap_or(i64::MAX);
                    let rows = client
                        .query(&st, &[&owner, &created, &id, &limit, &budget])
                        .await?;
                    Ok::<_, PgFailure>(
                        rows.into_iter()
                            .map(|r| crate::OwnedRecord {
                                id: r.get(0),
                                created_ms: to_u64(r.get(1)),
                                bytes: r.get(2),
                            })
                            .collect(),
                    )
                })
                .await
        })
    }

    fn usage<'a>(&'a self, owner: &'a str) -> StoreFuture<'a, crate::Usage> {
        Box::pin(async move {
            self.inner
                .run(false, |client| async move {
                    let st = client
                        .prepare_cached(
                            "SELECT coalesce(sum(tasks), 0)::bigint, coalesce(sum(bytes), 0)::bigint
                             FROM mcp_usage WHERE owner = $1",
                        )
                        .await?;
                    let r = client.query_one(&st, &[&owner]).await?;
                    Ok::<_, PgFailure>(crate::Usage {
                        tasks: to_u64(r.get(0)),
                        bytes: to_u64(r.get(1)),
                    })
                })
                .await
        })
    }

    fn usage_by_owner(&self) -> StoreFuture<'_, Vec<(String, crate::Usage)>> {
        Box::pin(async move {
            self.inner
                .run(false, |client| async move {
                    let rows = client.query(USAGE_BY_OWNER, &[]).await?;
                    Ok::<_, PgFailure>(
                        rows.into_iter()
                            .map(|r| {
                                let usage = crate::Usage {
                                    tasks: to_u64(r.get(1)),
                                    bytes: to_u64(r.get(2)),
                                };
                                (r.get(0), usage)
                            })
                            .collect(),
                    )
                })
                .await
        })
    }

    fn listing<'a>(
        &'a self,
        filter: &'a crate::listing::ListingFilter,
        after: Option<crate::listing::ListingCursor>,
        limit: usize,
        budget: usize,
    ) -> StoreFuture<'a, crate::listing::ListingPage> {
        Box::pin(async move {
            let Some(walk) = listing::walk(filter, after.as_ref(), limit, budget) else {
                self.inner.check_open()?;
                return Ok(crate::listing::ListingPage::default());
            };
            let rows = self
                .inner
                .run(false, |client| async move {
                    let st = client.prepare_cached(walk.sql).await?;
                    let base: [&(dyn tokio_postgres::types::ToSql + Sync); 9] = [
                        &walk.from,
                        &walk.below.0,
                        &walk.below.1,
                        &walk.budget,
                        &walk.limit,
                        &walk.status,
                        &filter.tool,
                        &filter.owner,
                        &filter.text,
                    ];
                    let mut params = base.to_vec();
                    if let Some(value) = &walk.index_text {
                        params.push(value);
                    } else if let Some(code) = &walk.index_status {
                        params.push(code);
                    }
                    let rows = client.query(&st, &params).await?;
                    Ok::<_, PgFailure>(rows.iter().map(listing::walked_row).collect::<Vec<_>>())
                })
                .await?;
            Ok(listing::page_of(rows, filter, limit, budget))
        })
    }

    fn listing_counts(&self) -> StoreFuture<'_, Vec<crate::listing::ListingCount>> {
        Box::pin(async move {
            self.inner
                .run(false, |client| async move {
                    let st = client
                        .prepare_cached(
                            "SELECT owner, tool, status, sum(tasks)::bigint FROM mcp_listing_counts
                             GROUP BY owner, tool, status HAVING sum(tasks) > 0
                             ORDER BY owner, tool, status",
                        )
                        .await?;
                    let rows = client.query(&st, &[]).await?;
                    Ok::<_, PgFailure>(
                        rows.iter()
                            .filter_map(|r| {
                                let status = u8::try_from(r.get::<_, i16>(2))
                                    .ok()
                                    .and_then(crate::listing::ListedStatus::from_code)?;
                                Some(crate::listing::ListingCount {
                                    owner: r.get(0),
                                    tool: r.get(1),
                                    status,
                                    tasks: to_u64(r.get(3)),
                                })
                            })
                            .collect(),
                    )
                })
                .await
        })
    }

    fn throughput(&self, since_ms: u64) -> StoreFuture<'_, Vec<crate::listing::ThroughputBucket>> {
        Box::pin(async move {
            let since = to_i64(crate::listing::minute_of(since_ms));
            self.inner
                .run(false, |client| async move {
                    let st = client
                        .prepare_cached(
                            "SELECT minute_ms, kind, sum(count)::bigint FROM mcp_throughput
                             WHERE minute_ms >= $1
                             GROUP BY minute_ms, kind HAVING sum(count) > 0
                             ORDER BY minute_ms, kind",
                        )
                        .await?;
                    let rows = client.query(&st, &[&since]).await?;
                    Ok::<_, PgFailure>(
                        rows.iter()
                            .filter_map(|r| {
                                let kind = u8::try_from(r.get::<_, i16>(1))
                                    .ok()
                                    .and_then(crate::listing::ThroughputKind::from_code)?;
                                Some(crate::listing::ThroughputBucket {
                                    minute_ms: to_u64(r.get(0)),
                                    kind,
                                    count: to_u64(r.get(2)),
                                })
                            })
                            .collect(),
                    )
                })
                .await
        })
    }
}

impl PostgresStore {
    fn rows(&self, sql: &'static str) -> StoreFuture<'_, Vec<(String, Vec<u8>)>> {
        Box::pin(async move {
            self.inner
                .run(false, |client| async move {
                    let st = client.prepare_cached(sql).await?;
                    let rows = client.query(&st, &[]).await?;
                    Ok::<_, PgFailure>(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
                })
                .await
        })
    }
}
