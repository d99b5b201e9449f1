//! The PostgreSQL side of store administration: one plain connection, reading the tables the
//! PostgreSQL backend keeps (see `store::postgres`).

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;

use tokio_postgres::{Client, NoTls};

use crate::META_BOOT_EPOCH;
use crate::inspect::{
    AdminError, BackupReport, CompactReport, Dump, InspectFuture, Inspector, Lease, NodeInfo, Row,
    SCAN_BYTES, Space, StatsReport, redact_url,
};
use crate::postgres::SCHEMA_VERSION;

/// A node whose heartbeat is younger than this is taken to be running: writing commands
/// refuse while one is (a replica could be running the tasks they would change).
const ALIVE_WITHIN_SECS: f64 = 60.0;

/// Rows per statement when loading.
const LOAD_CHUNK: usize = 500;

pub(crate) struct PgReader {
    client: Client,
    label: String,
}

fn pg_err(label: &str, e: &tokio_postgres::Error) -> AdminError {
    AdminError::Postgres {
        store: label.to_owned(),
        detail: crate::postgres::pg_detail(e),
    }
}

fn to_u64(v: Option<i64>) -> Option<u64> {
    v.map(|v| u64::try_from(v).unwrap_or(0))
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn row_of(r: &tokio_postgres::Row) -> Row {
    Row {
        id: r.get(0),
        bytes: r.get(1),
        live: r.get(2),
        due_ms: to_u64(r.get(3)),
        seq: to_u64(r.get(4)),
        lease: Some(Lease {
            node: r.get(5),
            epoch: to_u64(Some(r.get::<_, i64>(6))).unwrap_or(0),
        }),
    }
}

const COLUMNS: &str = "id, bytes, live, due_ms, seq, owner_node, lease_epoch";

impl PgReader {
    /// Connects and checks that the database holds an mcp-tasks schema this build can read.
    pub(crate) async fn connect(url: &str) -> Result<PgReader, AdminError> {
        let label = redact_url(url);
        let config = tokio_postgres::Config::from_str(url).map_err(|e| {
            AdminError::Invalid(format!("{label}: the PostgreSQL URL does not parse: {e}"))
        })?;
        let (client, connection) = config
            .connect(NoTls)
            .await
            .map_err(|e| pg_err(&label, &e))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "admin PostgreSQL connection ended");
            }
        });
        let reader = PgReader { client, label };
        reader.schema_version().await?;
        Ok(reader)
    }

    async fn schema_version(&self) -> Result<i64, AdminError> {
        let version: i64 = match self
            .client
            .query_one("SELECT coalesce(max(version), 0) FROM mcp_schema", &[])
            .await
        {
            Ok(row) => row.get(0),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
                return Err(AdminError::NotAStore {
                    path: self.label.clone(),
                    detail: "no mcp_schema table (no mcp-tasks server has used this database)"
                        .into(),
                });
            }
            Err(e) => return Err(pg_err(&self.label, &e)),
        };
        if version > SCHEMA_VERSION {
            return Err(AdminError::SchemaTooNew {
                store: self.label.clone(),
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        Ok(version)
    }

    pub(crate) async fn scan(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<Row>, AdminError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .client
            .query(
                // At most `limit` rows and, past the first, `SCAN_BYTES` of snapshots.
                &format!(
                    "SELECT {COLUMNS} FROM (
                        SELECT {COLUMNS}, sum(octet_length(bytes)) OVER (ORDER BY id) AS running
                        FROM mcp_tasks WHERE $1::text IS NULL OR id > $1 ORDER BY id LIMIT $2
                     ) AS page
                     WHERE running - octet_length(bytes) < $3 ORDER BY id"
                ),
                &[&after, &limit, &(SCAN_BYTES as i64)],
            )
            .await
            .map_err(|e| pg_err(&self.label, &e))?;
        Ok(rows.iter().map(row_of).collect())
    }

    pub(crate) async fn row(&self, id: &str) -> Result<Option<Row>, AdminError> {
        let row = self
            .client
            .query_opt(
                &format!("SELECT {COLUMNS} FROM mcp_tasks WHERE id = $1"),
                &[&id],
            )
            .await
            .map_err(|e| pg_err(&self.label, &e))?;
        Ok(row.as_ref().map(row_of))
    }

    async fn nodes(&self) -> Result<Vec<NodeInfo>, AdminError> {
        let rows = self
            .client
            .query(
                "SELECT n.node_id,
                        extract(epoch FROM now() - n.heartbeat_at)::float8,
                        (SELECT count(*) FROM mcp_tasks t WHERE t.live AND t.owner_node = n.node_id)
                 FROM mcp_nodes n ORDER BY n.node_id",
                &[],
            )
            .await
            .map_err(|e| pg_err(&self.label, &e))?;
        Ok(rows
            .iter()
            .map(|r| NodeInfo {
                node: r.get(0),
                heartbeat_age_s: r.get(1),
                live_tasks: u64::try_from(r.get::<_, i64>(2)).unwrap_or(0),
            })
            .collect())
    }

    pub(crate) async fn facts(&self, _now_ms: u64) -> Result<StatsReport, AdminError> {
        let schema_version = self.schema_version().await?;
        let boot_epoch = self
            .client
            .query_opt(
                "SELECT value FROM mcp_meta WHERE key = $1",
                &[&META_BOOT_EPOCH],
            )
            .await
            .map_err(|e| pg_err(&self.label, &e))?
            .and_then(|r| <[u8; 8]>::try_from(r.get::<_, Vec<u8>>(0).as_slice()).ok())
            .map(u64::from_le_bytes);
        let sizes = self
            .client
            .query(
                "SELECT t, pg_total_relation_size(t::regclass)
                 FROM unnest(ARRAY['mcp_tasks', 'mcp_meta', 'mcp_nodes', 'mcp_schema']) AS t
                 UNION ALL
                 SELECT t, pg_total_relation_size(to_regclass(t))
                 FROM unnest(ARRAY['mcp_usage', 'mcp_listing_counts', 'mcp_throughput']) AS t
                 WHERE to_regclass(t) IS NOT NULL",
                &[],
            )
            .await
            .map_err(|e| pg_err(&self.label, &e))?;
        let tables: BTreeMap<String, u64> = sizes
            .iter()
            .map(|r| (r.get(0), u64::try_from(r.get::<_, i64>(1)).unwrap_or(0)))
            .collect();
        Ok(StatsReport {
            backend: "postgres".into(),
            location: self.label.clone(),
            schema_version,
            boot_epoch,
            space: Space {
                tables,
                ..Space::default()
            },
            nodes: self.nodes().await?,
            ..StatsReport::default()
        })
    }

    /// The per-owner usage table, by owner key; `None` for a schema before version 3
    /// (converted by the next server's open).
    pub(crate) async fn usage_by_owner(
        &self,
    ) -> Result<Option<Vec<(String, crate::Usage)>>, AdminError> {
        if self.schema_version().await? < 3 {
            return Ok(None);
        }
        let rows = self
            .client
            .query(crate::postgres::USAGE_BY_OWNER, &[])
            .await
            .map_err(|e| pg_err(&self.label, &e))?;
        Ok(Some(
            rows.iter()
                .map(|r| {
                    let usage = crate::Usage {
                        tasks: u64::try_from(r.get::<_, i64>(1)).unwrap_or(0),
                        bytes: u64::try_from(r.get::<_, i64>(2)).unwrap_or(0),
                    };
                    (r.get(0), usage)
                })
                .collect(),
        ))
    }

    /// Refuses when a node heartbeat within the last minute.
    pub(crate) async fn refuse_if_nodes_alive(&self, what: &str) -> Result<(), AdminError> {
        let alive: Vec<String> = self
            .nodes()
            .await?
            .into_iter()
            .filter(|n| n.heartbeat_age_s < ALIVE_WITHIN_SECS)
            .map(|n| n.node)
            .collect();
        if alive.is_empty() {
            return Ok(());
        }
        Err(AdminError::InUse {
            path: self.label.clone(),
            detail: format!(
                "{what} refuses while replicas run (heartbeat within {ALIVE_WITHIN_SECS} s: {}); stop them first (nothing was changed)",
                alive.join(", ")
            ),
        })
    }

    /// Deletes rows; their owners' usage and their listing counters follow (the triggers).
    pub(crate) async fn delete(&self, ids: Vec<String>) -> Result<(), AdminError> {
        self.client
            .execute("DELETE FROM mcp_tasks WHERE id = ANY($1)", &[&ids])
            .await
            .map_err(|e| pg_err(&self.label, &e))?;
        Ok(())
    }

    pub(crate) async fn dump(&self) -> Result<Dump, AdminError> {
        let rows = self
            .client
            .query(&format!("SELECT {COLUMNS} FROM mcp_tasks ORDER BY id"), &[])
            .await
            .map_err(|e| pg_err(&self.label, &e))?;
        let meta = self
            .client
            .query("SELECT key, value FROM mcp_meta ORDER BY key", &[])
            .await
            .map_err(|e| pg_err(&self.label, &e))?;
        Ok(Dump {
            rows: rows.iter().map(row_of).collect(),
            meta: meta.iter().map(|r| (r.get(0), r.get(1))).collect(),
        })
    }
}

/// Writes a dump into a PostgreSQL database (its schema created or migrated as a server
/// would), in one transaction. Live tasks arrive unclaimed (`owner_node` NULL): the first
/// replica to look for orphans takes them over and resumes them from their journal. Returns
/// (tasks written, tasks already identical).
impl Inspector for PgReader {
    fn scan(&self, after: Option<String>, limit: usize) -> InspectFuture<'_, Vec<Row>> {
        Box::pin(PgReader::scan(self, after, limit))
    }

    fn row<'a>(&'a self, id: &'a str) -> InspectFuture<'a, Option<Row>> {
        Box::pin(PgReader::row(self, id))
    }

    fn facts(&self, now_ms: u64) -> InspectFuture<'_, StatsReport> {
        Box::pin(PgReader::facts(self, now_ms))
    }

    fn usage_by_owner(&self) -> InspectFuture<'_, Option<Vec<(String, crate::Usage)>>> {
        Box::pin(PgReader::usage_by_owner(self))
    }
}

pub(crate) async fn load(
    url: &str,
    dump: Dump,
    indexer: Arc<dyn crate::Indexer>,
) -> Result<(u64, u64), AdminError> {
    let label = redact_url(url);
    // The schema, exactly as a server creates it (versioned migrations).
    crate::postgres::prepare_schema(url, &*indexer)
        .await
        .map_err(AdminError::Store)?;
    let mut reader = PgReader::connect(url).await?;
    reader.refuse_if_nodes_alive("store migrate").await?;
    let tx = reader
        .client
        .transaction()
        .await
        .map_err(|e| pg_err(&label, &e))?;
    let mut written = 0u64;
    let mut unchanged = 0u64;
    for chunk in dump.rows.chunks(LOAD_CHUNK) {
        let ids: Vec<&str> = chunk.iter().map(|r| r.id.as_str()).collect();
        let bytes: Vec<&[u8]> = chunk.iter().map(|r| r.bytes.as_slice()).collect();
        let live: Vec<bool> = chunk.iter().map(|r| r.live).collect();
        let due: Vec<Option<i64>> = chunk.iter().map(|r| r.due_ms.map(to_i64)).collect();
        let seq: Vec<Option<i64>> = chunk.iter().map(|r| r.seq.map(to_i64)).collect();
        // The owner index entry, read from each snapshot (none for one that does not decode).
        let entries: Vec<Option<crate::OwnerEntry>> =
            chunk.iter().map(|r| indexer.owner(&r.bytes)).collect();
        let owners: Vec<Option<&str>> = entries
            .iter()
            .map(|e| e.as_ref().map(|e| e.owner.as_str()))
            .collect();
        let created: Vec<Option<i64>> = entries
            .iter()
            .map(|e| e.as_ref().map(|e| to_i64(e.created_ms)))
            .collect();
        // Its listing, likewise (the listing trigger counts it).
        let listings: Vec<Option<crate::listing::Listing>> =
            chunk.iter().map(|r| indexer.listing(&r.bytes)).collect();
        let tools: Vec<Option<&str>> = listings
            .iter()
            .map(|l| l.as_ref().map(|l| l.tool.as_str()))
            .collect();
        let statuses: Vec<Option<i16>> = listings
            .iter()
            .map(|l| l.as_ref().map(|l| i16::from(l.status.code())))
            .collect();
        let messages: Vec<Option<&str>> = listings
            .iter()
            .map(|l| l.as_ref().and_then(|l| l.message.as_deref()))
            .collect();
        let updated: Vec<Option<i64>> = listings
            .iter()
            .map(|l| l.as_ref().map(|l| to_i64(l.updated_ms)))
            .collect();
        let same: i64 = tx
            .query_one(
                "SELECT count(*) FROM mcp_tasks t
                 JOIN unnest($1::text[], $2::bytea[]) AS u(id, bytes)
                   ON t.id = u.id AND t.bytes = u.bytes",
                &[&ids, &bytes],
            )
            .await
            .map_err(|e| pg_err(&label, &e))?
            .get(0);
        tx.execute(
            "INSERT INTO mcp_tasks (id, bytes, live, due_ms, seq, owner_node, task_owner, created_ms,
                                    tool, status, status_message, updated_ms)
             SELECT id, bytes, live, due_ms, seq, NULL, task_owner, created_ms,
                    tool, status, status_message, updated_ms
             FROM unnest($1::text[], $2::bytea[], $3::bool[], $4::int8[], $5::int8[],
                         $6::text[], $7::int8[], $8::text[], $9::int2[], $10::text[], $11::int8[])
                  AS u(id, bytes, live, due_ms, seq, task_owner, created_ms,
                       tool, status, status_message, updated_ms)
             ON CONFLICT (id) DO UPDATE
               SET bytes = EXCLUDED.bytes, live = EXCLUDED.live, due_ms = EXCLUDED.due_ms,
                   seq = EXCLUDED.seq, owner_node = NULL, updated_at = now(),
                   task_owner = EXCLUDED.task_owner, created_ms = EXCLUDED.created_ms,
                   tool = EXCLUDED.tool, status = EXCLUDED.status,
                   status_message = EXCLUDED.status_message, updated_ms = EXCLUDED.updated_ms",
            &[
                &ids, &bytes, &live, &due, &seq, &owners, &created, &tools, &statuses,
                &messages, &updated,
            ],
        )
        .await
        .map_err(|e| pg_err(&label, &e))?;
        let same = u64::try_from(same).unwrap_or(0);
        unchanged += same;
        written += chunk.len() as u64 - same;
    }
    for (key, value) in &dump.meta {
        if key == META_BOOT_EPOCH {
            // Never move a boot epoch backwards: keep the larger one.
            let theirs = <[u8; 8]>::try_from(value.as_slice())
                .map(u64::from_le_bytes)
                .unwrap_or(0);
            let ours = tx
                .query_opt("SELECT value FROM mcp_meta WHERE key = $1", &[key])
                .await
                .map_err(|e| pg_err(&label, &e))?
                .and_then(|r| <[u8; 8]>::try_from(r.get::<_, Vec<u8>>(0).as_slice()).ok())
                .map(u64::from_le_bytes)
                .unwrap_or(0);
            let epoch = theirs.max(ours).to_le_bytes().to_vec();
            tx.execute(
                "INSERT INTO mcp_meta (key, value) VALUES ($1, $2)
                 ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                &[key, &epoch],
            )
            .await
            .map_err(|e| pg_err(&label, &e))?;
        } else {
            tx.execute(
                "INSERT INTO mcp_meta (key, value) VALUES ($1, $2)
                 ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                &[key, value],
            )
            .await
            .map_err(|e| pg_err(&label, &e))?;
        }
    }
    tx.commit().await.map_err(|e| pg_err(&label, &e))?;
    Ok((written, unchanged))
}

/// PostgreSQL databases as the `store …` commands reach them: `postgres://` and
/// `postgresql://` URLs, read over one plain connection; commands that write refuse while a
/// replica's heartbeat is fresh. Rows a command writes without their index entries (a
/// migration's) are indexed by `indexer`.
pub(crate) struct PostgresKind {
    pub(crate) indexer: Arc<dyn crate::Indexer>,
}

impl crate::inspect::StoreKind for PostgresKind {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn claims(&self, location: &str) -> bool {
        location.starts_with("postgres://") || location.starts_with("postgresql://")
    }

    fn display(&self, location: &str) -> String {
        redact_url(location)
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn open<'a>(&'a self, location: &'a str) -> InspectFuture<'a, Option<Box<dyn Inspector>>> {
        Box::pin(async move {
            Ok(Some(
                Box::new(PgReader::connect(location).await?) as Box<dyn Inspector>
            ))
        })
    }

    fn open_exclusive<'a>(
        &'a self,
        location: &'a str,
        what: &'static str,
    ) -> InspectFuture<'a, Box<dyn Inspector>> {
        Box::pin(async move {
            let reader = PgReader::connect(location).await?;
            reader.refuse_if_nodes_alive(what).await?;
            Ok(Box::new(reader) as Box<dyn Inspector>)
        })
    }

    fn delete<'a>(&'a self, location: &'a str, ids: Vec<String>) -> InspectFuture<'a, ()> {
        Box::pin(async move { PgReader::connect(location).await?.delete(ids).await })
    }

    fn dump<'a>(&'a self, location: &'a str) -> InspectFuture<'a, Dump> {
        Box::pin(async move {
            let reader = PgReader::connect(location).await?;
            reader.refuse_if_nodes_alive("store migrate").await?;
            reader.dump().await
        })
    }

    fn load<'a>(&'a self, location: &'a str, dump: Dump) -> InspectFuture<'a, (u64, u64)> {
        Box::pin(load(location, dump, self.indexer.clone()))
    }

    fn compact<'a>(&'a self, _location: &'a str) -> InspectFuture<'a, CompactReport> {
        Box::pin(async {
            Err(AdminError::Unsupported(
                "store compact applies to redb files; PostgreSQL reclaims space with VACUUM".into(),
            ))
        })
    }

    fn backup<'a>(
        &'a self,
        _location: &'a str,
        _to: &'a std::path::Path,
    ) -> InspectFuture<'a, BackupReport> {
        Box::pin(async {
            Err(AdminError::Unsupported(
                "store backup copies a redb file; back up PostgreSQL with pg_dump (or `store migrate` it to a redb file)".into(),
            ))
        })
    }
}
