//! The commit path: a job's rows written under their `Expect` and this node's lease, the
//! creations in flight, and the announcement of a commit to the other nodes.

use std::sync::Arc;
use std::sync::atomic::Ordering;

#[cfg(doc)]
use super::PostgresStore;
use super::{Inner, PgFailure, pg_detail, to_i64, to_u64};
use crate::{Cause, Expect, StoreError, WriteOp};

/// The longest `NOTIFY` payload this store sends (PostgreSQL's limit is 8,000 bytes).
const NOTIFY_PAYLOAD_MAX: usize = 7_900;

/// The columns one [`WriteOp::Put`] writes, as PostgreSQL takes them. The owner entry
/// (`task_owner`, `created_ms`) is written with the row's creation only (it never changes);
/// the listing columns when the put carries a listing (`status` `None`: the stored ones are
/// kept).
struct PutRow<'a> {
    id: &'a str,
    bytes: &'a Vec<u8>,
    live: bool,
    due: Option<i64>,
    seq: Option<i64>,
    owner: Option<&'a str>,
    created: Option<i64>,
    tool: Option<&'a str>,
    status: Option<i16>,
    message: Option<&'a str>,
    updated: Option<i64>,
}

impl<'a> PutRow<'a> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        id: &'a str,
        bytes: &'a Vec<u8>,
        live: bool,
        due_ms: Option<u64>,
        seq: Option<u64>,
        owner: Option<&'a crate::OwnerEntry>,
        listing: Option<&'a crate::listing::Listing>,
    ) -> PutRow<'a> {
        PutRow {
            id,
            bytes,
            live,
            due: due_ms.map(to_i64),
            seq: seq.map(to_i64),
            owner: owner.map(|o| o.owner.as_str()),
            created: owner.map(|o| to_i64(o.created_ms)),
            tool: listing.map(|l| l.tool.as_str()),
            status: listing.map(|l| i16::from(l.status.code())),
            message: listing.and_then(|l| l.message.as_deref()),
            updated: listing.map(|l| to_i64(l.updated_ms)),
        }
    }

    /// `$1`…`$12` of the two inserts of a put (`Expect::Any`, `Expect::Absent`): the row as
    /// written by `node`, its lease's first epoch in the statement itself.
    fn insert_params<'s>(
        &'s self,
        node: &'s String,
    ) -> [&'s (dyn tokio_postgres::types::ToSql + Sync); 12] {
        [
            &self.id,
            self.bytes,
            &self.live,
            &self.due,
            &self.seq,
            node,
            &self.owner,
            &self.created,
            &self.tool,
            &self.status,
            &self.message,
            &self.updated,
        ]
    }
}

/// Writes one meta op ([`WriteOp::PutMeta`], [`WriteOp::PutMetaIfAbsent`],
/// [`WriteOp::DeleteMeta`]); nothing for any other op.
async fn write_meta(
    tx: &deadpool_postgres::Transaction<'_>,
    op: &WriteOp,
) -> Result<(), tokio_postgres::Error> {
    match op {
        WriteOp::PutMetaIfAbsent { key, value } => {
            let st = tx
                .prepare_cached(
                    "INSERT INTO mcp_meta (key, value) VALUES ($1, $2)
                     ON CONFLICT (key) DO NOTHING",
                )
                .await?;
            tx.execute(&st, &[key, value]).await?;
        }
        WriteOp::PutMeta { key, value } => {
            let st = tx
                .prepare_cached(
                    "INSERT INTO mcp_meta (key, value) VALUES ($1, $2)
                     ON CONFLICT (key) DO UPDATE SET value = $2",
                )
                .await?;
            tx.execute(&st, &[key, value]).await?;
        }
        WriteOp::DeleteMeta { key } => {
            let st = tx
                .prepare_cached("DELETE FROM mcp_meta WHERE key = $1")
                .await?;
            tx.execute(&st, &[key]).await?;
        }
        WriteOp::Put { .. } | WriteOp::Delete { .. } | WriteOp::SetDue { .. } => {}
    }
    Ok(())
}

impl Inner {
    /// Tells the other nodes that tasks `ids` were committed: one `NOTIFY` (payload `T id id
    /// …`, split below PostgreSQL's 8,000-byte payload limit), sent after the commit, outside
    /// the writing transaction, on a task of its own. A hint: lost (this node dies first, the
    /// database is unreachable), it costs a waiter its poll interval.
    pub(super) fn announce(self: &Arc<Self>, ids: Vec<String>) {
        if ids.is_empty() {
            return;
        }
        let inner = self.clone();
        tokio::spawn(async move {
            let mut payloads = Vec::new();
            let mut payload = String::from("T");
            for id in ids {
                if payload.len() + 1 + id.len() > NOTIFY_PAYLOAD_MAX && payload.len() > 1 {
                    payloads.push(std::mem::replace(&mut payload, String::from("T")));
                }
                payload.push(' ');
                payload.push_str(&id);
            }
            payloads.push(payload);
            let sent = async {
                let client = inner.client().await?;
                let st = client
                    .prepare_cached("SELECT pg_notify($1, p)::text FROM unnest($2::text[]) AS p")
                    .await?;
                client.query(&st, &[&inner.hub.channel, &payloads]).await?;
                Ok::<_, PgFailure>(())
            };
            if let Err(e) = sent.await {
                let detail = match e {
                    PgFailure::Pg(e) => pg_detail(&e),
                    PgFailure::Pool(d) => d,
                    PgFailure::Store(e) => e.to_string(),
                };
                tracing::debug!(store = %inner.label, %detail,
                    "a commit's notification was not sent; other nodes poll");
            }
        });
    }

    /// Applies one job in one transaction. Returns the leases it created or ended.
    pub(super) async fn commit_job(
        &self,
        ops: &[WriteOp],
    ) -> Result<(Vec<(String, Option<i64>)>, u64), PgFailure> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let mut leases = Vec::new();
        let mut deleted = 0;
        for op in ops {
            match op {
                WriteOp::Put { .. } => {
                    if let Some(lease) = self.put_op(&tx, op).await? {
                        leases.push(lease);
                    }
                }
                WriteOp::Delete { id } => {
                    let st = tx
                        .prepare_cached("DELETE FROM mcp_tasks WHERE id = $1")
                        .await?;
                    deleted += tx.execute(&st, &[id]).await?;
                    leases.push((id.clone(), None));
                }
                WriteOp::SetDue { id, due_ms } => {
                    let st = tx
                        .prepare_cached("UPDATE mcp_tasks SET due_ms = $2 WHERE id = $1")
                        .await?;
                    tx.execute(&st, &[id, &due_ms.map(to_i64)]).await?;
                }
                WriteOp::PutMetaIfAbsent { .. }
                | WriteOp::PutMeta { .. }
                | WriteOp::DeleteMeta { .. } => {
                    write_meta(&tx, op).await?;
                }
            }
        }
        #[cfg(feature = "failpoints")]
        fail::fail_point!("store::group_commit", |arg| {
            Err(PgFailure::Store(StoreError::Commit(Cause::message(
                format!("failpoint store::group_commit: {}", arg.unwrap_or_default()),
            ))))
        });
        tx.commit().await?;
        Ok((leases, deleted))
    }

    /// Writes the row of one [`WriteOp::Put`] as its [`Expect`] allows; the change to this
    /// node's held leases it makes, if any (`Some(epoch)`: now held at it; `None`: released).
    /// [`Inner::put`] of a [`WriteOp::Put`] (any other operation is a no-op here).
    pub(super) async fn put_op(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        op: &WriteOp,
    ) -> Result<Option<(String, Option<i64>)>, PgFailure> {
        let WriteOp::Put {
            id,
            bytes,
            // Kept whole: a row is rewritten by each update anyway.
            constant_tail: _,
            live,
            due_ms,
            seq,
            expect,
            owner,
            listing,
        } = op
        else {
            return Ok(None);
        };
        let row = PutRow::new(
            id,
            bytes,
            *live,
            *due_ms,
            *seq,
            owner.as_ref(),
            listing.as_ref(),
        );
        self.put(tx, &row, *expect).await
    }

    async fn put(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        row: &PutRow<'_>,
        expect: Expect,
    ) -> Result<Option<(String, Option<i64>)>, PgFailure> {
        let id = row.id;
        match expect {
            Expect::Any => {
                let st = tx
                    .prepare_cached(
                        "INSERT INTO mcp_tasks (id, bytes, live, due_ms, seq, owner_node, lease_epoch,
                            task_owner, created_ms, tool, status, status_message, updated_ms)
                         VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $8, $9, $10, $11, $12)
                         ON CONFLICT (id) DO UPDATE SET bytes = $2, live = $3, due_ms = $4,
                            seq = $5, updated_at = now(),
                            task_owner = coalesce($7, mcp_tasks.task_owner),
                            created_ms = CASE WHEN $7 IS NULL OR $7 = mcp_tasks.task_owner
                                THEN mcp_tasks.created_ms ELSE $8 END,
                            tool = coalesce($9, mcp_tasks.tool),
                            status = coalesce($10, mcp_tasks.status),
                            status_message = CASE WHEN $10 IS NULL
                                THEN mcp_tasks.status_message ELSE $11 END,
                            updated_ms = coalesce($12, mcp_tasks.updated_ms)",
                    )
                    .await?;
                tx.execute(&st, &row.insert_params(&self.node)).await?;
                Ok(None)
            }
            Expect::Absent => {
                let st = tx
                    .prepare_cached(
                        "INSERT INTO mcp_tasks (id, bytes, live, due_ms, seq, owner_node, lease_epoch,
                            task_owner, created_ms, tool, status, status_message, updated_ms)
                         VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $8, $9, $10, $11, $12)
                         ON CONFLICT (id) DO NOTHING",
                    )
                    .await?;
                let n = tx.execute(&st, &row.insert_params(&self.node)).await?;
                if n == 0 {
                    let found = self.stored_seq(tx, id).await?;
                    return Err(StoreError::Conflict {
                        id: id.to_owned(),
                        expected: None,
                        found,
                    }
                    .into());
                }
                Ok(Some((id.to_owned(), row.live.then_some(1))))
            }
            Expect::Seq(expected) => {
                let held = self.held().get(id).copied();
                let n = self.update_fenced(tx, row, expected, held).await?;
                if n == 0 {
                    return Err(self.refusal(tx, id, expected, held).await?.into());
                }
                Ok((!row.live).then(|| (id.to_owned(), None)))
            }
        }
    }

    /// The conditional update of a [`Expect::Seq`] put: at sequence number `expected`, under
    /// this node's lease at epoch `held` (unfenced in the test mode that skips fencing). The
    /// rows it changed (0: refused).
    async fn update_fenced(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        row: &PutRow<'_>,
        expected: u64,
        held: Option<i64>,
    ) -> Result<u64, PgFailure> {
        let id = row.id;
        Ok(match (held, self.skip_fencing) {
            (_, true) => {
                let st = tx
                    .prepare_cached(
                        "UPDATE mcp_tasks SET bytes = $2, live = $3, due_ms = $4,
                            seq = $5, updated_at = now(), tool = coalesce($6, tool),
                            status = coalesce($7, status),
                            status_message = CASE WHEN $7 IS NULL THEN status_message ELSE $8 END,
                            updated_ms = coalesce($9, updated_ms)
                         WHERE id = $1",
                    )
                    .await?;
                tx.execute(
                    &st,
                    &[
                        &id,
                        row.bytes,
                        &row.live,
                        &row.due,
                        &row.seq,
                        &row.tool,
                        &row.status,
                        &row.message,
                        &row.updated,
                    ],
                )
                .await?
            }
            (Some(epoch), false) => {
                let st = tx
                    .prepare_cached(
                        "UPDATE mcp_tasks SET bytes = $2, live = $3, due_ms = $4,
                            seq = $5, updated_at = now(), tool = coalesce($9, tool),
                            status = coalesce($10, status),
                            status_message = CASE WHEN $10 IS NULL THEN status_message ELSE $11 END,
                            updated_ms = coalesce($12, updated_ms)
                         WHERE id = $1 AND (seq = $6 OR seq IS NULL)
                           AND owner_node = $7 AND lease_epoch = $8",
                    )
                    .await?;
                tx.execute(
                    &st,
                    &[
                        &id,
                        row.bytes,
                        &row.live,
                        &row.due,
                        &row.seq,
                        &to_i64(expected),
                        &self.node,
                        &epoch,
                        &row.tool,
                        &row.status,
                        &row.message,
                        &row.updated,
                    ],
                )
                .await?
            }
            (None, false) => 0,
        })
    }

    async fn stored_seq(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        id: &str,
    ) -> Result<Option<u64>, PgFailure> {
        let row = tx
            .query_opt("SELECT seq FROM mcp_tasks WHERE id = $1", &[&id])
            .await?;
        Ok(row.and_then(|r| r.get::<_, Option<i64>>(0)).map(to_u64))
    }

    /// Why a conditional write updated nothing: the task moved to another node (fenced), or
    /// its sequence number moved (conflict).
    async fn refusal(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        id: &str,
        expected: u64,
        held: Option<i64>,
    ) -> Result<StoreError, PgFailure> {
        let row = tx
            .query_opt(
                "SELECT seq, owner_node, lease_epoch FROM mcp_tasks WHERE id = $1",
                &[&id],
            )
            .await?;
        let Some(row) = row else {
            return Ok(StoreError::Conflict {
                id: id.to_owned(),
                expected: Some(expected),
                found: None,
            });
        };
        let found = row.get::<_, Option<i64>>(0).map(to_u64);
        let owner: Option<String> = row.get(1);
        let epoch: i64 = row.get(2);
        let ours = !self.skip_fencing
            && owner.as_deref() == Some(self.node.as_str())
            && Some(epoch) == held;
        if ours || self.skip_fencing {
            return Ok(StoreError::Conflict {
                id: id.to_owned(),
                expected: Some(expected),
                found,
            });
        }
        let mut map = self.held();
        if held.is_some() && map.get(id) == held.as_ref() {
            map.remove(id);
        }
        tracing::warn!(task = id, node = %self.node, held = ?held, owner = ?owner, epoch,
            "write refused: another node holds the task's lease (fenced)");
        Ok(StoreError::Fenced { id: id.to_owned() })
    }
}

/// Registers the tasks a commit creates as in flight (see `Inner::creating`) until dropped.
pub(super) struct Creating<'a> {
    inner: &'a Inner,
    ids: Vec<String>,
}

impl<'a> Creating<'a> {
    pub(super) fn register(inner: &'a Inner, ops: &[WriteOp]) -> Creating<'a> {
        let ids: Vec<String> = ops
            .iter()
            .filter_map(|op| match op {
                WriteOp::Put {
                    id,
                    expect: Expect::Absent,
                    ..
                } => Some(id.clone()),
                _ => None,
            })
            .collect();
        if !ids.is_empty() {
            let mut creating = inner.creating.lock().unwrap_or_else(|e| e.into_inner());
            for id in &ids {
                *creating.entry(id.clone()).or_default() += 1;
            }
        }
        Creating { inner, ids }
    }
}

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        if self.ids.is_empty() {
            return;
        }
        let mut creating = self
            .inner
            .creating
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for id in &self.ids {
            if let Some(n) = creating.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    creating.remove(id);
                }
            }
        }
    }
}

/// Whether a failed commit may have committed anyway (the connection broke around `COMMIT`,
/// a statement failed after others): refusals and a pool that gave no connection did not.
pub(super) fn outcome_unknown(e: &PgFailure) -> bool {
    !matches!(
        e,
        PgFailure::Pool(_)
            | PgFailure::Store(
                StoreError::Conflict { .. } | StoreError::Fenced { .. } | StoreError::Closed
            )
    )
}

impl Inner {
    /// The test hook of [`PostgresStore::lose_commit_acks`]: a committed job reported failed.
    pub(super) fn maybe_lose_ack<T>(&self, outcome: Result<T, PgFailure>) -> Result<T, PgFailure> {
        if outcome.is_ok()
            && self
                .lose_commit_acks
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(PgFailure::Store(StoreError::Commit(Cause::message(
                "the connection was lost before the commit was acknowledged (test hook)",
            ))));
        }
        outcome
    }
}
