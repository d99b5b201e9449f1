//! The schema: its versioned migrations (with the backfills of schemas 3 and 6), applied at
//! open under an advisory lock, and `mcp-tasks store migrate`'s preparation of a database.

use deadpool_postgres::Pool;
use tokio_postgres::NoTls;

use super::{parse_url, pg_detail, pool, redact, to_i64, with_causes};
use crate::{Indexer, StoreError};

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = 8;

// One migration per version: a migration added without raising the version (or the other way
// round) does not build.
const _: () = assert!(MIGRATIONS.len() as i64 == SCHEMA_VERSION);

/// The migrations, in order: version `i + 1` is `MIGRATIONS[i]`.
const MIGRATIONS: &[&str] = &[
    // 1: tasks with their indexes and lease, meta, node heartbeats.
    "CREATE TABLE mcp_tasks (
        id          text PRIMARY KEY,
        bytes       bytea NOT NULL,
        live        boolean NOT NULL,
        due_ms      bigint,
        seq         bigint,
        owner_node  text,
        lease_epoch bigint NOT NULL DEFAULT 0,
        updated_at  timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX mcp_tasks_due ON mcp_tasks (due_ms, id) WHERE due_ms IS NOT NULL;
    CREATE INDEX mcp_tasks_live_owner ON mcp_tasks (owner_node) WHERE live;
    CREATE TABLE mcp_meta (key text PRIMARY KEY, value bytea NOT NULL);
    CREATE TABLE mcp_nodes (
        node_id      text PRIMARY KEY,
        started_at   timestamptz NOT NULL,
        heartbeat_at timestamptz NOT NULL
    );",
    // 2: commands for the node running a task, and a notification (the task's id and sequence
    // number only) on every write of a task's bytes. The channel is named after the schema,
    // so schemas sharing a database do not hear each other.
    "CREATE TABLE mcp_commands (
        seq         bigserial PRIMARY KEY,
        task_id     text NOT NULL,
        body        bytea NOT NULL,
        answer      bytea,
        created_at  timestamptz NOT NULL DEFAULT now(),
        answered_at timestamptz
    );
    CREATE INDEX mcp_commands_waiting ON mcp_commands (task_id) WHERE answer IS NULL;
    CREATE FUNCTION mcp_tasks_notify() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('mcp_' || left(md5(TG_TABLE_SCHEMA::text), 16),
                          't ' || NEW.id || ' ' || coalesce(NEW.seq, 0));
        RETURN NULL;
    END $$;
    CREATE TRIGGER mcp_tasks_changed AFTER INSERT OR UPDATE OF bytes ON mcp_tasks
        FOR EACH ROW EXECUTE FUNCTION mcp_tasks_notify();",
    // 3: the owner index and the per-owner usage (the disk quota). `task_owner` and
    // `created_ms` are set when a task is created (rows stored before are filled in by the
    // migration from their snapshots: `backfill_owners`); `size` is what a row stores; a
    // trigger keeps `mcp_usage` in the transaction that changes the rows, so every replica
    // reads the same exact figures.
    "ALTER TABLE mcp_tasks ADD COLUMN task_owner text, ADD COLUMN created_ms bigint,
        ADD COLUMN size bigint GENERATED ALWAYS AS (octet_length(id) + octet_length(bytes)) STORED;
    CREATE INDEX mcp_tasks_by_owner ON mcp_tasks (task_owner, created_ms, id)
        WHERE task_owner IS NOT NULL;
    CREATE TABLE mcp_usage (
        owner text PRIMARY KEY,
        tasks bigint NOT NULL,
        bytes bigint NOT NULL
    );
    CREATE FUNCTION mcp_usage_track() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'UPDATE' AND OLD.task_owner IS NOT DISTINCT FROM NEW.task_owner
                AND OLD.size = NEW.size THEN
            RETURN NULL;
        END IF;
        IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.task_owner IS NOT NULL THEN
            UPDATE mcp_usage SET tasks = tasks - 1, bytes = bytes - OLD.size
                WHERE owner = OLD.task_owner;
            DELETE FROM mcp_usage WHERE owner = OLD.task_owner AND tasks <= 0;
        END IF;
        IF TG_OP IN ('UPDATE', 'INSERT') AND NEW.task_owner IS NOT NULL THEN
            INSERT INTO mcp_usage (owner, tasks, bytes) VALUES (NEW.task_owner, 1, NEW.size)
                ON CONFLICT (owner) DO UPDATE
                SET tasks = mcp_usage.tasks + 1, bytes = mcp_usage.bytes + EXCLUDED.bytes;
        END IF;
        RETURN NULL;
    END $$;
    CREATE TRIGGER mcp_tasks_usage AFTER INSERT OR DELETE OR UPDATE OF bytes, task_owner
        ON mcp_tasks FOR EACH ROW EXECUTE FUNCTION mcp_usage_track();",
    // 4: the instance token of the process running as each node id (a random value per
    // process), so that a second live process with the same id is refused at start.
    "ALTER TABLE mcp_nodes ADD COLUMN instance text;",
    // 5: the per-owner usage in up to 16 rows per owner, one per shard of the task ids
    // (`hashtext(id) & 15`). With one row per owner, every write of one owner's tasks
    // updated that row and held its lock until the commit (the WAL's fsync included), so
    // the commits of one owner's tasks queued one behind the other (half the lifecycles per
    // second of one replica, `crates/mcp-tasks-cli/benches/replicas.rs`). Readers sum an owner's rows. The rows
    // are recomputed from the tasks in the migration's transaction.
    "ALTER TABLE mcp_usage ADD COLUMN shard smallint NOT NULL DEFAULT 0;
    ALTER TABLE mcp_usage DROP CONSTRAINT mcp_usage_pkey;
    DELETE FROM mcp_usage;
    INSERT INTO mcp_usage (owner, shard, tasks, bytes)
        SELECT task_owner, hashtext(id) & 15, count(*), sum(size)
        FROM mcp_tasks WHERE task_owner IS NOT NULL GROUP BY 1, 2;
    ALTER TABLE mcp_usage ADD PRIMARY KEY (owner, shard);
    CREATE OR REPLACE FUNCTION mcp_usage_track() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'UPDATE' AND OLD.task_owner IS NOT DISTINCT FROM NEW.task_owner
                AND OLD.size = NEW.size THEN
            RETURN NULL;
        END IF;
        IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.task_owner IS NOT NULL THEN
            UPDATE mcp_usage SET tasks = tasks - 1, bytes = bytes - OLD.size
                WHERE owner = OLD.task_owner AND shard = hashtext(OLD.id) & 15;
            DELETE FROM mcp_usage
                WHERE owner = OLD.task_owner AND shard = hashtext(OLD.id) & 15 AND tasks <= 0;
        END IF;
        IF TG_OP IN ('UPDATE', 'INSERT') AND NEW.task_owner IS NOT NULL THEN
            INSERT INTO mcp_usage (owner, shard, tasks, bytes)
                VALUES (NEW.task_owner, hashtext(NEW.id) & 15, 1, NEW.size)
                ON CONFLICT (owner, shard) DO UPDATE
                SET tasks = mcp_usage.tasks + 1, bytes = mcp_usage.bytes + EXCLUDED.bytes;
        END IF;
        RETURN NULL;
    END $$;",
    // 6: the listing index (`store::listing`). Each task's tool, status code
    // (`ListedStatus::code`), status message (already cut) and last update, written by every
    // put that carries them; a task is listed once it has an owner and a status. Indexes for
    // the walks newest first (the owner's is migration 3's). Counters per (owner, tool,
    // status) and one-minute throughput buckets per kind (`ThroughputKind::code`), each in
    // up to 16 rows per key (one per shard of the task ids, as `mcp_usage`), kept by a
    // trigger in the commit's transaction; readers sum the shards. Rows stored before are
    // filled in by the migration from their snapshots (`backfill_listing`).
    "ALTER TABLE mcp_tasks ADD COLUMN tool text, ADD COLUMN status smallint,
        ADD COLUMN status_message text, ADD COLUMN updated_ms bigint;
    CREATE INDEX mcp_tasks_listed ON mcp_tasks (created_ms, id)
        WHERE task_owner IS NOT NULL AND status IS NOT NULL;
    CREATE INDEX mcp_tasks_by_status ON mcp_tasks (status, created_ms, id)
        WHERE task_owner IS NOT NULL AND status IS NOT NULL;
    CREATE INDEX mcp_tasks_by_tool ON mcp_tasks (tool, created_ms, id)
        WHERE task_owner IS NOT NULL AND status IS NOT NULL;
    CREATE TABLE mcp_listing_counts (
        owner  text NOT NULL,
        tool   text NOT NULL,
        status smallint NOT NULL,
        shard  smallint NOT NULL,
        tasks  bigint NOT NULL,
        PRIMARY KEY (owner, tool, status, shard)
    );
    CREATE TABLE mcp_throughput (
        minute_ms bigint NOT NULL,
        kind      smallint NOT NULL,
        shard     smallint NOT NULL,
        count     bigint NOT NULL,
        PRIMARY KEY (minute_ms, kind, shard)
    );
    CREATE FUNCTION mcp_listing_track() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        was_listed boolean := TG_OP <> 'INSERT'
            AND OLD.task_owner IS NOT NULL AND OLD.status IS NOT NULL;
        is_listed boolean := TG_OP <> 'DELETE'
            AND NEW.task_owner IS NOT NULL AND NEW.status IS NOT NULL;
        id_shard smallint := hashtext(CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END) & 15;
    BEGIN
        IF was_listed AND is_listed AND OLD.task_owner = NEW.task_owner
                AND OLD.tool = NEW.tool AND OLD.status = NEW.status THEN
            RETURN NULL;
        END IF;
        -- The old key's row and the new one's, in key order: two commits moving tasks
        -- between the same two statuses in opposite directions take their locks alike.
        INSERT INTO mcp_listing_counts AS c (owner, tool, status, shard, tasks)
            SELECT k.owner, k.tool, k.status, id_shard, k.delta FROM (
                SELECT OLD.task_owner, OLD.tool, OLD.status, -1 WHERE was_listed
                UNION ALL
                SELECT NEW.task_owner, NEW.tool, NEW.status, 1 WHERE is_listed
            ) AS k (owner, tool, status, delta)
            ORDER BY k.owner, k.tool, k.status
            ON CONFLICT (owner, tool, status, shard) DO UPDATE SET tasks = c.tasks + EXCLUDED.tasks;
        -- `listing::throughput_of`: a creation at its minute; an arrival in a final status
        -- (codes 2, 3, 4: kinds 1, 2, 3) from a live one or from nothing at its update's.
        IF is_listed THEN
            INSERT INTO mcp_throughput AS b (minute_ms, kind, shard, count)
                SELECT t.minute_ms, t.kind, id_shard, 1 FROM (
                    SELECT NEW.created_ms - NEW.created_ms % 60000, 0 WHERE NOT was_listed
                    UNION ALL
                    SELECT NEW.updated_ms - NEW.updated_ms % 60000, NEW.status - 1
                    WHERE NEW.status >= 2 AND NEW.updated_ms IS NOT NULL
                        AND NOT (was_listed AND OLD.status >= 2)
                ) AS t (minute_ms, kind)
                ORDER BY t.minute_ms, t.kind
                ON CONFLICT (minute_ms, kind, shard) DO UPDATE SET count = b.count + 1;
        END IF;
        RETURN NULL;
    END $$;
    CREATE TRIGGER mcp_tasks_listed AFTER INSERT OR DELETE ON mcp_tasks
        FOR EACH ROW EXECUTE FUNCTION mcp_listing_track();
    CREATE TRIGGER mcp_tasks_relisted AFTER UPDATE OF task_owner, tool, status ON mcp_tasks
        FOR EACH ROW WHEN (OLD.task_owner IS DISTINCT FROM NEW.task_owner
            OR OLD.tool IS DISTINCT FROM NEW.tool OR OLD.status IS DISTINCT FROM NEW.status)
        EXECUTE FUNCTION mcp_listing_track();",
    // 7: flow control across replicas (`flow.rs`): the entries that hold or wait for a
    // running-task slot, and the start-rate buckets.
    "CREATE TABLE mcp_flow (
        key        text PRIMARY KEY,
        node_id    text NOT NULL,
        token      bigint NOT NULL,
        task       boolean NOT NULL,
        owner      text NOT NULL,
        tool       text NOT NULL,
        created_ms bigint NOT NULL,
        counters   text[] NOT NULL,
        capacities integer[] NOT NULL,
        bucket     text,
        rate       double precision,
        started    bigint
    );
    CREATE TABLE mcp_flow_buckets (
        name   text PRIMARY KEY,
        tokens double precision NOT NULL,
        at_ms  bigint NOT NULL
    );",
    // 8: task writes no longer notify from a trigger inside their transaction: the node that
    // committed them sends one `NOTIFY` per commit (per group of commits) after it, outside
    // the writing transaction (`Inner::announce`).
    "DROP TRIGGER IF EXISTS mcp_tasks_changed ON mcp_tasks;
    DROP FUNCTION IF EXISTS mcp_tasks_notify();",
];

/// The meta key of the boot epoch (u64, little endian), incremented by every open.
const META_BOOT_EPOCH: &str = crate::META_BOOT_EPOCH;

/// Rows the owner backfill of migration 3 reads at a time (rows may be large).
const BACKFILL_CHUNK: i64 = 64;

/// Fills in `task_owner` and `created_ms` of the rows stored before migration 3, from their
/// snapshots, inside the migration's transaction (the usage trigger counts each). A row
/// whose snapshot does not decode stays without an owner: in no owner's index, counted for
/// nobody. Returns the number of rows filled in.
async fn backfill_owners(
    tx: &deadpool_postgres::Transaction<'_>,
    indexer: &dyn Indexer,
) -> Result<u64, tokio_postgres::Error> {
    let mut after = String::new();
    let mut filled = 0;
    loop {
        let rows = tx
            .query(
                "SELECT id, bytes FROM mcp_tasks WHERE task_owner IS NULL AND id > $1
                 ORDER BY id LIMIT $2",
                &[&after, &BACKFILL_CHUNK],
            )
            .await?;
        let Some(last) = rows.last() else { break };
        after = last.get(0);
        for row in &rows {
            let id: String = row.get(0);
            let bytes: Vec<u8> = row.get(1);
            if let Some(owner) = indexer.owner(&bytes) {
                tx.execute(
                    "UPDATE mcp_tasks SET task_owner = $2, created_ms = $3 WHERE id = $1",
                    &[&id, &owner.owner, &to_i64(owner.created_ms)],
                )
                .await?;
                filled += 1;
            }
        }
        if (rows.len() as i64) < BACKFILL_CHUNK {
            break;
        }
    }
    Ok(filled)
}

/// Fills in the listing columns of the owned rows stored before migration 6, from their
/// snapshots, inside the migration's transaction, then counts them into
/// `mcp_listing_counts` (the listing trigger is off meanwhile: one grouped insert instead of
/// a trigger per row). A row whose snapshot does not decode stays unlisted. The throughput
/// of the past is not known: its buckets start empty (as in redb). Returns the number of
/// rows filled in.
async fn backfill_listing(
    tx: &deadpool_postgres::Transaction<'_>,
    indexer: &dyn Indexer,
) -> Result<u64, tokio_postgres::Error> {
    tx.batch_execute("ALTER TABLE mcp_tasks DISABLE TRIGGER mcp_tasks_relisted")
        .await?;
    let mut after = String::new();
    let mut filled = 0;
    loop {
        let rows = tx
            .query(
                "SELECT id, bytes FROM mcp_tasks
                 WHERE task_owner IS NOT NULL AND status IS NULL AND id > $1
                 ORDER BY id LIMIT $2",
                &[&after, &BACKFILL_CHUNK],
            )
            .await?;
        let Some(last) = rows.last() else { break };
        after = last.get(0);
        let mut ids = Vec::with_capacity(rows.len());
        let mut tools = Vec::with_capacity(rows.len());
        let mut statuses = Vec::with_capacity(rows.len());
        let mut messages = Vec::with_capacity(rows.len());
        let mut updated = Vec::with_capacity(rows.len());
        for row in &rows {
            let bytes: &[u8] = row.get(1);
            if let Some(listing) = indexer.listing(bytes) {
                ids.push(row.get::<_, String>(0));
                statuses.push(i16::from(listing.status.code()));
                updated.push(to_i64(listing.updated_ms));
                messages.push(listing.message);
                tools.push(listing.tool);
            }
        }
        if !ids.is_empty() {
            filled += tx
                .execute(
                    "UPDATE mcp_tasks t SET tool = u.tool, status = u.status,
                        status_message = u.message, updated_ms = u.updated_ms
                     FROM unnest($1::text[], $2::text[], $3::int2[], $4::text[], $5::int8[])
                          AS u (id, tool, status, message, updated_ms)
                     WHERE t.id = u.id",
                    &[&ids, &tools, &statuses, &messages, &updated],
                )
                .await?;
        }
        if (rows.len() as i64) < BACKFILL_CHUNK {
            break;
        }
    }
    tx.batch_execute(
        "ALTER TABLE mcp_tasks ENABLE TRIGGER mcp_tasks_relisted;
         DELETE FROM mcp_listing_counts;
         INSERT INTO mcp_listing_counts (owner, tool, status, shard, tasks)
             SELECT task_owner, tool, status, hashtext(id) & 15, count(*) FROM mcp_tasks
             WHERE task_owner IS NOT NULL AND status IS NOT NULL GROUP BY 1, 2, 3, 4;",
    )
    .await?;
    Ok(filled)
}

/// Creates or migrates the schema of the database at `url` exactly as a server's open does
/// (and bumps its boot epoch), without registering a node: `mcp-tasks store migrate` prepares
/// its target with it.
pub(crate) async fn prepare_schema(url: &str, indexer: &dyn Indexer) -> Result<(), StoreError> {
    let config = parse_url(url)?;
    let label = redact(&config);
    let pool = pool(config, 1, None).map_err(|detail| StoreError::Open {
        path: label.clone().into(),
        detail,
    })?;
    migrate(&pool, &label, indexer).await.map(drop)
}

/// Creates `schema` if it does not exist, on a connection of its own.
pub(super) async fn create_schema(
    config: &tokio_postgres::Config,
    schema: &str,
) -> Result<(), String> {
    let (client, connection) = config.connect(NoTls).await.map_err(|e| pg_detail(&e))?;
    let conn = tokio::spawn(connection);
    let result = client
        .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
        .await
        .map_err(|e| pg_detail(&e));
    drop(client);
    let _ = conn.await;
    result
}

/// Applies the migrations this build knows (once, under an advisory lock) and bumps the boot
/// epoch. Returns the epoch. Migrations 3 and 6 index the rows stored before them with
/// `indexer`; a database holding such rows is refused ([`StoreError::NeedsIndexer`], nothing
/// changed) when `indexer` reads no record.
pub(super) async fn migrate(
    pool: &Pool,
    label: &str,
    indexer: &dyn Indexer,
) -> Result<u64, StoreError> {
    let err = |detail: String| StoreError::Open {
        path: label.into(),
        detail,
    };
    let mut client = pool
        .get()
        .await
        .map_err(|e| err(format!("cannot connect: {}", with_causes(&e))))?;
    let tx = client.transaction().await.map_err(|e| err(pg_detail(&e)))?;
    // Migrations (and waiting for another replica's) are not bounded by the session's
    // timeouts (see `session_timeouts`).
    tx.batch_execute(
        "SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0;
         SELECT pg_advisory_xact_lock(727301, hashtext(coalesce(current_schema(), '')));
         CREATE TABLE IF NOT EXISTS mcp_schema (
            version    bigint PRIMARY KEY,
            applied_at timestamptz NOT NULL DEFAULT now()
         );",
    )
    .await
    .map_err(|e| {
        // A `search_path` (in the URL's `options`) naming no schema that exists.
        let hint = if e.code() == Some(&tokio_postgres::error::SqlState::INVALID_SCHEMA_NAME) {
            "; the connection's search_path names no existing schema: create it (CREATE SCHEMA name) or name one that exists"
        } else {
            ""
        };
        err(format!(
            "preparing the migrations failed: {}{hint}",
            pg_detail(&e)
        ))
    })?;
    let current: i64 = tx
        .query_one("SELECT coalesce(max(version), 0) FROM mcp_schema", &[])
        .await
        .map_err(|e| err(pg_detail(&e)))?
        .get(0);
    if current > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            store: label.to_owned(),
            found: current,
            supported: SCHEMA_VERSION,
        });
    }
    // Migrations 3 and 6 read the rows stored before them: without an indexer such a database
    // is refused here, before any migration runs.
    if current > 0 && current < 6 && !indexer.reads_records() {
        let stored: bool = tx
            .query_one("SELECT EXISTS (SELECT 1 FROM mcp_tasks)", &[])
            .await
            .map_err(|e| err(pg_detail(&e)))?
            .get(0);
        if stored {
            return Err(StoreError::NeedsIndexer {
                store: label.to_owned(),
                what: format!("schema version {current}"),
            });
        }
    }
    for (i, sql) in MIGRATIONS.iter().enumerate() {
        let version = i as i64 + 1;
        if version <= current {
            continue;
        }
        tx.batch_execute(sql)
            .await
            .map_err(|e| err(format!("migration {version} failed: {}", pg_detail(&e))))?;
        tx.execute("INSERT INTO mcp_schema (version) VALUES ($1)", &[&version])
            .await
            .map_err(|e| err(pg_detail(&e)))?;
        if version == 3 {
            let filled = backfill_owners(&tx, indexer)
                .await
                .map_err(|e| err(format!("migration 3 (owners) failed: {}", pg_detail(&e))))?;
            tracing::info!(store = %label, rows = filled, "filled in the owners of stored tasks");
        }
        if version == 6 {
            let filled = backfill_listing(&tx, indexer)
                .await
                .map_err(|e| err(format!("migration 6 (listing) failed: {}", pg_detail(&e))))?;
            tracing::info!(store = %label, rows = filled, "filled in the listing of stored tasks");
        }
        tracing::info!(store = %label, version, "applied schema migration");
    }
    let previous = tx
        .query_opt(
            "SELECT value FROM mcp_meta WHERE key = $1",
            &[&META_BOOT_EPOCH],
        )
        .await
        .map_err(|e| err(pg_detail(&e)))?
        .map(|r| r.get::<_, Vec<u8>>(0))
        .map(|v| {
            <[u8; 8]>::try_from(v.as_slice())
                .map(u64::from_le_bytes)
                .map_err(|_| err(format!("meta \"{META_BOOT_EPOCH}\" is not 8 bytes")))
        })
        .transpose()?
        .unwrap_or(0);
    let epoch = previous.saturating_add(1);
    tx.execute(
        "INSERT INTO mcp_meta (key, value) VALUES ($1, $2)
         ON CONFLICT (key) DO UPDATE SET value = $2",
        &[&META_BOOT_EPOCH, &epoch.to_le_bytes().to_vec()],
    )
    .await
    .map_err(|e| err(pg_detail(&e)))?;
    tx.commit().await.map_err(|e| err(pg_detail(&e)))?;
    Ok(epoch)
}
