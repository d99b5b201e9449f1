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
//! **Signalling** (`notify.rs`; [`crate::store::Cluster`], implemented by this backend only).
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
use futures::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_postgres::NoTls;

mod flow;
mod group;
pub(crate) mod inspect;
mod listing;
mod notify;

use super::{
    Cause, Cluster, Expect, Reconciled, RemoteCommand, StoreError, StoreFuture, StoreStats,
    TaskStore, Wakeup, WriteOp,
};
use notify::{self as postgres_notify, Hub};

/// The longest `NOTIFY` payload this store sends (PostgreSQL's limit is 8,000 bytes).
const NOTIFY_PAYLOAD_MAX: usize = 7_900;

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

/// Rows the owner backfill of migration 3 reads at a time (rows may be large).
const BACKFILL_CHUNK: i64 = 64;

/// Fills in `task_owner` and `created_ms` of the rows stored before migration 3, from their
/// snapshots, inside the migration's transaction (the usage trigger counts each). A row
/// whose snapshot does not decode stays without an owner: in no owner's index, counted for
/// nobody. Returns the number of rows filled in.
async fn backfill_owners(
    tx: &deadpool_postgres::Transaction<'_>,
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
            if let Some(owner) = super::owner_of_snapshot(&bytes) {
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
            if let Some(listing) = super::listing_of_snapshot(bytes) {
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
        owner: Option<&'a super::OwnerEntry>,
        listing: Option<&'a super::listing::Listing>,
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

/// The meta key of the lease TTL the cluster shares (milliseconds, u64 little endian).
const META_LEASE_TTL: &str = "lease_ttl_ms";

/// The meta key of the boot epoch (u64, little endian), incremented by every open.
const META_BOOT_EPOCH: &str = super::META_BOOT_EPOCH;

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
    /// **Test only.** Writes of a task are unconditional (no owner, epoch or sequence-number
    /// check: like a job queue that completes a job by its id), so a replica that lost a
    /// lease overwrites the new owner's work. The replica crash suite uses it to show that
    /// its checker catches what fencing prevents. Default `false`.
    #[doc(hidden)]
    pub unsafe_skip_fencing: bool,
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
            unsafe_skip_fencing: false,
        }
    }
}

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
            .unwrap_or_else(|| crate::clock::Clock::now_ms(&crate::clock::SystemClock));
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
    async fn commit_job(
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
    async fn put_op(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        op: &WriteOp,
    ) -> Result<Option<(String, Option<i64>)>, PgFailure> {
        let WriteOp::Put {
            id,
            bytes,
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

    /// Claims live tasks for this node: `own` = those this node id held (at start, all at
    /// once); otherwise at most `limit` of those no live node holds, the first in id order
    /// past `after` (the `ORDER BY` walks the primary key from there: a claimer that goes on
    /// past each full batch reads each row once). Bumps their epochs; sorted by id.
    async fn claim(
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
        let boot_epoch = migrate(&pool, &label).await?;
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
    pub(crate) fn lose_notifications(&self, lose: bool) {
        self.inner.hub.lose.store(lose, Ordering::SeqCst);
    }

    /// **Test only** (`mcp_tasks::internals::pg_faults`). Stops (or resumes) this node's heartbeats, as if the process were
    /// paused: once the TTL passes, other nodes take its tasks over.
    pub(crate) fn pause_heartbeat(&self, paused: bool) {
        self.inner.heartbeat_paused.store(paused, Ordering::SeqCst);
    }

    /// **Test only** (`mcp_tasks::internals::pg_faults`). The next `n` commits are applied and committed, but reported failed
    /// (as if the answer to `COMMIT` were lost on the network): their outcome is unknown to
    /// the runtime.
    pub(crate) fn lose_commit_acks(&self, n: u64) {
        self.inner.lose_commit_acks.store(n, Ordering::SeqCst);
    }

    /// **Test only** (`mcp_tasks::internals::pg_faults`). Makes every statement of this node fail (or stops doing so) as if the
    /// database could not be reached: heartbeats, claims and requests fail as in an outage
    /// (the listening connection is left alone).
    pub(crate) fn simulate_outage(&self, down: bool) {
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

/// Commands whose answer nobody took, or whose task finished without answering them, are
/// forgotten after this long. No sender waits that long: a sender that stops waiting
/// withdraws its command if no node took it (`Cluster::withdraw_command`), so what is left
/// here is a command a node took (applied or being applied; its sender was told it may have
/// been) or one whose sender died.
const COMMAND_RETENTION_SECS: f64 = 600.0;

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
    fn nodes(&self) -> StoreFuture<'_, Vec<super::listing::NodeInfo>> {
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
                            .map(|r| super::listing::NodeInfo {
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
    fn lease_of<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<super::listing::LeaseInfo>> {
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
                        super::listing::LeaseInfo {
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
        round: crate::store::flow::FlowRound,
        plan: &'a crate::store::flow::FlowPlanner,
    ) -> StoreFuture<'a, crate::store::flow::FlowTable> {
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
        let retention = to_i64(super::listing::THROUGHPUT_RETENTION_MS);
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

/// Renews the node's lease every third of the TTL until the store is dropped or closed.
async fn heartbeat(inner: std::sync::Weak<Inner>) {
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

/// Creates `schema` if it does not exist, on a connection of its own.
/// Creates or migrates the schema of the database at `url` exactly as a server's open does
/// (and bumps its boot epoch), without registering a node: `mcp-tasks store migrate` prepares
/// its target with it.
pub(crate) async fn prepare_schema(url: &str) -> Result<(), StoreError> {
    let config = parse_url(url)?;
    let label = redact(&config);
    let pool = pool(config, 1, None).map_err(|detail| StoreError::Open {
        path: label.clone().into(),
        detail,
    })?;
    migrate(&pool, &label).await.map(drop)
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

async fn create_schema(config: &tokio_postgres::Config, schema: &str) -> Result<(), String> {
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
/// epoch. Returns the epoch.
async fn migrate(pool: &Pool, label: &str) -> Result<u64, StoreError> {
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
            let filled = backfill_owners(&tx)
                .await
                .map_err(|e| err(format!("migration 3 (owners) failed: {}", pg_detail(&e))))?;
            tracing::info!(store = %label, rows = filled, "filled in the owners of stored tasks");
        }
        if version == 6 {
            let filled = backfill_listing(&tx)
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
            let limit = i64::try_from(limit.min(super::MAX_PAGE)).unwrap_or(0);
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
    fn owned<'a>(
        &'a self,
        owner: &'a str,
        after: Option<super::OwnedCursor>,
        limit: usize,
    ) -> StoreFuture<'a, Vec<super::OwnedRecord>> {
        Box::pin(async move {
            let limit = i64::try_from(limit.min(super::MAX_PAGE)).unwrap_or(0);
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
                    let budget = i64::try_from(super::MAX_PAGE_BYTES).unwrap_or(i64::MAX);
                    let rows = client
                        .query(&st, &[&owner, &created, &id, &limit, &budget])
                        .await?;
                    Ok::<_, PgFailure>(
                        rows.into_iter()
                            .map(|r| super::OwnedRecord {
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
    fn usage<'a>(&'a self, owner: &'a str) -> StoreFuture<'a, super::Usage> {
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
                    Ok::<_, PgFailure>(super::Usage {
                        tasks: to_u64(r.get(0)),
                        bytes: to_u64(r.get(1)),
                    })
                })
                .await
        })
    }
    fn usage_by_owner(&self) -> StoreFuture<'_, Vec<(String, super::Usage)>> {
        Box::pin(async move {
            self.inner
                .run(false, |client| async move {
                    let rows = client.query(USAGE_BY_OWNER, &[]).await?;
                    Ok::<_, PgFailure>(
                        rows.into_iter()
                            .map(|r| {
                                let usage = super::Usage {
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
        filter: &'a super::listing::ListingFilter,
        after: Option<super::listing::ListingCursor>,
        limit: usize,
        budget: usize,
    ) -> StoreFuture<'a, super::listing::ListingPage> {
        Box::pin(async move {
            let Some(walk) = listing::walk(filter, after.as_ref(), limit, budget) else {
                self.inner.check_open()?;
                return Ok(super::listing::ListingPage::default());
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
    fn listing_counts(&self) -> StoreFuture<'_, Vec<super::listing::ListingCount>> {
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
                                    .and_then(super::listing::ListedStatus::from_code)?;
                                Some(super::listing::ListingCount {
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
    fn throughput(&self, since_ms: u64) -> StoreFuture<'_, Vec<super::listing::ThroughputBucket>> {
        Box::pin(async move {
            let since = to_i64(super::listing::minute_of(since_ms));
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
                                    .and_then(super::listing::ThroughputKind::from_code)?;
                                Some(super::listing::ThroughputBucket {
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
}

/// Orphans claimed per statement.
const CLAIM_BATCH: i64 = 256;

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
fn session_timeouts(ttl: Duration) -> String {
    let b = SessionBounds::for_lease_ttl(ttl);
    format!(
        "-c statement_timeout={} -c lock_timeout={} -c idle_in_transaction_session_timeout={}",
        b.statement.as_millis(),
        b.lock.as_millis(),
        b.idle.as_millis()
    )
}

/// A random instance token: 64 bits in hex, one per process.
fn random_instance() -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).unwrap_or_default();
    format!("{:016x}", u64::from_le_bytes(bytes))
}

/// Reads the lease TTL stored for the cluster (`$1`: [`META_LEASE_TTL`]).
const SELECT_LEASE_TTL: &str = "SELECT value FROM mcp_meta WHERE key = $1";

/// The lease TTL stored for the cluster, from the row of [`SELECT_LEASE_TTL`].
fn lease_ttl_of(row: Option<tokio_postgres::Row>) -> Option<Duration> {
    row.and_then(|r| <[u8; 8]>::try_from(r.get::<_, Vec<u8>>(0).as_slice()).ok())
        .map(|b| Duration::from_millis(u64::from_le_bytes(b)))
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
    async fn register(&self) -> Result<(), StoreError> {
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

/// The process that held a task whose lapsed lease this node took over, counting an attempt
/// against the task's restart budget (see [`Inner::watched`]).
#[derive(Debug, Clone)]
struct LapsedOwner {
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

/// Registers the tasks a commit creates as in flight (see `Inner::creating`) until dropped.
struct Creating<'a> {
    inner: &'a Inner,
    ids: Vec<String>,
}

impl<'a> Creating<'a> {
    fn register(inner: &'a Inner, ops: &[WriteOp]) -> Creating<'a> {
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
fn outcome_unknown(e: &PgFailure) -> bool {
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
    fn maybe_lose_ack<T>(&self, outcome: Result<T, PgFailure>) -> Result<T, PgFailure> {
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

    /// See [`TaskStore::confirm_lease`]: one read of the task's lease columns.
    async fn confirm_lease(&self, id: &str, seq: u64) -> Result<(), PgFailure> {
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

    /// See [`TaskStore::reconcile`]: reads the live rows leased to this node id, drops the
    /// leases this process believes it holds that the store no longer gives it, and claims
    /// (epoch + 1) the rows at this node id that it does not hold, except those whose
    /// creation commit is still in flight.
    async fn reconcile(&self) -> Result<Reconciled, PgFailure> {
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
