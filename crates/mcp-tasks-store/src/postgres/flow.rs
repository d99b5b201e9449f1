//! Flow control across replicas: one round ([`crate::Cluster::flow_round`]) is one
//! transaction holding the `mcp_flow` table's lock (`SHARE ROW EXCLUSIVE`, which conflicts with
//! itself: rounds run one at a time over the cluster; readers are not blocked).
//!
//! An entry counts only while its node heartbeats (`mcp_nodes`, within the lease TTL) and,
//! for a task, while the task is live under that node's lease (`mcp_tasks.owner_node`): a
//! replica killed with its slots frees them when its lease lapses, and a task taken over
//! re-enters under its new node. A task whose creation is still in flight (no row yet) keeps
//! its entry. Buckets are judged by the database's clock.

use super::{Inner, PgFailure, to_i64, to_u64};
use crate::flow::{FlowBucket, FlowPlanner, FlowRound, FlowRow, FlowTable};

pub(super) async fn round(
    inner: &Inner,
    mut client: deadpool_postgres::Object,
    round: FlowRound,
    plan: &FlowPlanner,
) -> Result<FlowTable, PgFailure> {
    let tx = client.transaction().await?;
    tx.batch_execute("LOCK TABLE mcp_flow IN SHARE ROW EXCLUSIVE MODE")
        .await?;
    let mut freed = 0u64;
    if !round.leave.is_empty() {
        let keys: Vec<&str> = round.leave.iter().map(|(k, _)| k.as_str()).collect();
        let tokens: Vec<i64> = round.leave.iter().map(|(_, t)| to_i64(*t)).collect();
        let st = tx
            .prepare_cached(
                "DELETE FROM mcp_flow f USING unnest($1::text[], $2::bigint[]) AS l(key, token)
                 WHERE f.key = l.key AND f.token = l.token AND f.node_id = $3",
            )
            .await?;
        freed += tx.execute(&st, &[&keys, &tokens, &inner.node]).await?;
    }
    if !round.enter.is_empty() {
        let st = tx
            .prepare_cached(
                "INSERT INTO mcp_flow (key, node_id, token, task, owner, tool, created_ms,
                                       counters, capacities, bucket, rate, started)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, NULL)
                 ON CONFLICT (key) DO UPDATE SET node_id = $2, token = $3, task = $4,
                     owner = $5, tool = $6, created_ms = $7, counters = $8, capacities = $9,
                     bucket = $10, rate = $11, started = NULL",
            )
            .await?;
        for row in &round.enter {
            let names: Vec<&str> = row.counters.iter().map(|(c, _)| c.as_str()).collect();
            let caps: Vec<i32> = row
                .counters
                .iter()
                .map(|(_, n)| i32::try_from(*n).unwrap_or(i32::MAX))
                .collect();
            let bucket = row.rate.as_ref().map(|(b, _)| b.as_str());
            let rate = row.rate.as_ref().map(|(_, r)| *r);
            tx.execute(
                &st,
                &[
                    &row.key,
                    &inner.node,
                    &to_i64(row.token),
                    &row.task,
                    &row.owner,
                    &row.tool,
                    &to_i64(row.created_ms),
                    &names,
                    &caps,
                    &bucket,
                    &rate,
                ],
            )
            .await?;
        }
    }
    // Entries whose node or lease is gone.
    let st = tx
        .prepare_cached(
            "DELETE FROM mcp_flow f
             WHERE NOT EXISTS (SELECT 1 FROM mcp_nodes n WHERE n.node_id = f.node_id
                               AND n.heartbeat_at >= now() - make_interval(secs => $1))
                OR (f.task AND EXISTS (SELECT 1 FROM mcp_tasks t WHERE t.id = f.key
                               AND (NOT t.live OR t.owner_node IS DISTINCT FROM f.node_id)))",
        )
        .await?;
    freed += tx.execute(&st, &[&inner.lease_ttl.as_secs_f64()]).await?;
    let st = tx
        .prepare_cached(
            "SELECT key, node_id, token, task, owner, tool, created_ms, counters, capacities,
                    bucket, rate, started,
                    (extract(epoch FROM now()) * 1000)::bigint
             FROM mcp_flow",
        )
        .await?;
    let rows = tx.query(&st, &[]).await?;
    let mut now_ms = None;
    let mut table = FlowTable::default();
    for r in &rows {
        now_ms = Some(to_u64(r.get(12)));
        let names: Vec<String> = r.get(7);
        let caps: Vec<i32> = r.get(8);
        let bucket: Option<String> = r.get(9);
        let rate: Option<f64> = r.get(10);
        table.rows.push(FlowRow {
            key: r.get(0),
            node: r.get(1),
            token: to_u64(r.get(2)),
            task: r.get(3),
            owner: r.get(4),
            tool: r.get(5),
            created_ms: to_u64(r.get(6)),
            counters: names
                .into_iter()
                .zip(caps.into_iter().map(|c| u32::try_from(c).unwrap_or(0)))
                .collect(),
            rate: bucket.zip(rate),
            started: r.get::<_, Option<i64>>(11).map(to_u64),
        });
    }
    table.now_ms = match now_ms {
        Some(ms) => ms,
        None => to_u64(
            tx.query_one("SELECT (extract(epoch FROM now()) * 1000)::bigint", &[])
                .await?
                .get(0),
        ),
    };
    if table.rows.iter().any(|r| r.rate.is_some()) {
        let st = tx
            .prepare_cached("SELECT name, tokens, at_ms FROM mcp_flow_buckets")
            .await?;
        for r in tx.query(&st, &[]).await? {
            table.buckets.push(FlowBucket {
                name: r.get(0),
                tokens: r.get(1),
                at_ms: to_u64(r.get(2)),
            });
        }
    }
    let decision = plan(&table);
    let mut elsewhere = false;
    if !decision.started.is_empty() {
        let keys: Vec<&str> = decision.started.iter().map(|(k, _)| k.as_str()).collect();
        let starts: Vec<i64> = decision.started.iter().map(|(_, s)| to_i64(*s)).collect();
        let st = tx
            .prepare_cached(
                "UPDATE mcp_flow f SET started = s.started
                 FROM unnest($1::text[], $2::bigint[]) AS s(key, started)
                 WHERE f.key = s.key AND f.started IS NULL",
            )
            .await?;
        tx.execute(&st, &[&keys, &starts]).await?;
        for (key, started) in &decision.started {
            if let Some(row) = table.rows.iter_mut().find(|r| &r.key == key) {
                row.started = Some(*started);
                elsewhere |= row.node != inner.node;
            }
        }
    }
    if !decision.buckets.is_empty() {
        let st = tx
            .prepare_cached(
                "INSERT INTO mcp_flow_buckets (name, tokens, at_ms) VALUES ($1, $2, $3)
                 ON CONFLICT (name) DO UPDATE SET tokens = $2, at_ms = $3",
            )
            .await?;
        for b in &decision.buckets {
            tx.execute(&st, &[&b.name, &b.tokens, &to_i64(b.at_ms)])
                .await?;
        }
        table.buckets = decision.buckets;
    }
    if freed > 0 || elsewhere {
        // A hint for the other nodes (sent at the commit): their waiting entries may start,
        // or have started. Missed, it costs a node its poll interval.
        let st = tx.prepare_cached("SELECT pg_notify($1, 'f')").await?;
        tx.execute(&st, &[&inner.hub.channel]).await?;
    }
    tx.commit().await?;
    Ok(table)
}
