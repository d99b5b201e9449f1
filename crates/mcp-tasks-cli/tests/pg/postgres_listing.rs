//! The listing index of the PostgreSQL store (schema 6): pages through every index with a
//! cursor, each filter alone and combined, the budget — page for page what the memory store
//! answers for the same writes —; the counters and throughput buckets through a task's
//! lifecycle and its deletion, alike on two nodes; a schema-5 database filled in by the next
//! open; `store migrate` and `store purge`; and the cluster's overview (nodes, leases, the
//! commits of another node). Each test has a schema of its own (crates/mcp-tasks-cli/tests/pg);
//! skipped without a server unless `MCP_TASKS_REQUIRE_POSTGRES` is set.
#![cfg(feature = "postgres")]

use crate::pg;

use std::time::Duration;

use mcp_tasks::TaskStatus;
use mcp_tasks::internals::persist;
use mcp_tasks::internals::task::{Owner, TaskId, TaskRecord};
use mcp_tasks::store::listing::{
    ListedStatus, ListedTask, ListingCount, ListingCursor, ListingFilter, ListingPage,
    ThroughputBucket, ThroughputKind, minute_of,
};
use mcp_tasks::store::{
    Cluster, Expect, Index, MemoryStore, OwnerEntry, PostgresOptions, PostgresStore, RedbStore,
    StoreOptions, TaskStore, WriteOp, owner_key,
};
use serde_json::json;

const TTL: Duration = Duration::from_secs(5);

/// The indexes of a store of this crate (every backend has them).
fn index(store: &dyn TaskStore) -> &dyn Index {
    store.index().expect("the store keeps indexes")
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A task of `principal` (tenant `acme`) running `tool`, created at `created_ms`.
fn record(n: u32, principal: &str, tool: &str, created_ms: u64) -> TaskRecord {
    TaskRecord::new(
        TaskId::parse(&format!("tsk_{n:032x}")).unwrap(),
        Owner::new("acme", principal),
        tool.into(),
        json!({ "n": n }),
        serde_json::Value::Null,
        created_ms,
        None,
        None,
        None,
    )
}

/// The write of `record` as the runtime makes it (`Shared::write_op`): conditional on its
/// predecessor, with its owner entry and its listing.
fn write(record: &TaskRecord) -> WriteOp {
    WriteOp::Put {
        id: record.id.as_str().to_owned(),
        bytes: persist::encode(record).unwrap(),
        constant_tail: 0,
        live: !record.status.is_terminal(),
        due_ms: None,
        seq: Some(record.seq),
        expect: if record.seq <= 1 {
            Expect::Absent
        } else {
            Expect::Seq(record.seq - 1)
        },
        owner: Some(OwnerEntry {
            owner: owner_key(&record.owner.tenant, &record.owner.principal),
            created_ms: record.created_at_ms,
        }),
        listing: Some(mcp_tasks::internals::listing_of(record)),
    }
}

/// `record` moved to `status` with `message` at `at_ms` (the next sequence number).
fn advance(record: &mut TaskRecord, status: TaskStatus, message: Option<&str>, at_ms: u64) {
    record.status = status;
    record.status_message = message.map(str::to_owned);
    record.last_updated_at_ms = at_ms;
    record.seq += 1;
}

/// Commits `op` to every store.
async fn commit_all(stores: &[&dyn TaskStore], op: WriteOp) {
    for store in stores {
        store.commit(vec![op.clone()]).await.unwrap();
    }
}

/// Every page of `filter` in `store` with `limit` and `budget`, from the start on along the
/// cursors.
async fn pages(
    store: &dyn TaskStore,
    filter: &ListingFilter,
    limit: usize,
    budget: usize,
) -> Vec<ListingPage> {
    let mut out = Vec::new();
    let mut after: Option<ListingCursor> = None;
    loop {
        let page = index(store)
            .listing(filter, after.clone(), limit, budget)
            .await
            .unwrap();
        let next = page.next.clone();
        out.push(page);
        match next {
            Some(next) => after = Some(next),
            None => return out,
        }
        assert!(out.len() < 1000, "the pages never end: {filter:?}");
    }
}

fn alice() -> String {
    owner_key("acme", "alice")
}

/// 90 tasks of three owners and three tools, two per millisecond, in every status, some with
/// messages (one of them not ASCII), written alike into `stores`. Returns them.
async fn fill(stores: &[&dyn TaskStore], base: u64) -> Vec<TaskRecord> {
    let principals = ["alice", "bob", "carol"];
    let tools = ["echo", "sleep", "fetch"];
    let mut out = Vec::new();
    for n in 0..90u32 {
        let created = base + u64::from(n / 2);
        let mut r = record(
            n,
            principals[(n % 3) as usize],
            tools[(n / 3 % 3) as usize],
            created,
        );
        commit_all(stores, write(&r)).await;
        let at = created + 500;
        match n % 6 {
            0 => {}
            1 => {
                advance(&mut r, TaskStatus::InputRequired, Some("Need a key"), at);
                commit_all(stores, write(&r)).await;
            }
            2 => {
                advance(&mut r, TaskStatus::Completed, None, at);
                commit_all(stores, write(&r)).await;
            }
            3 => {
                advance(&mut r, TaskStatus::Failed, Some("Disk full on node 3"), at);
                commit_all(stores, write(&r)).await;
            }
            4 => {
                advance(&mut r, TaskStatus::InputRequired, None, at);
                commit_all(stores, write(&r)).await;
                advance(
                    &mut r,
                    TaskStatus::Cancelled,
                    Some("Überlauf: ÄRGER"),
                    at + 1,
                );
                commit_all(stores, write(&r)).await;
            }
            _ => {
                advance(&mut r, TaskStatus::Working, Some("step 2 of 3"), at);
                commit_all(stores, write(&r)).await;
            }
        }
        out.push(r);
    }
    out
}

/// Every index, each filter alone and combined, with limits and budgets that cut pages: the
/// PostgreSQL store answers page for page what the memory store answers, and the pages hold
/// every task the filter keeps exactly once, newest first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_walk_every_index_newest_first_like_the_memory_store() {
    let Some(pg) = pg::fresh().await else { return };
    let pg_store = PostgresStore::open(&pg.url, pg.options("a", TTL))
        .await
        .unwrap();
    let memory = MemoryStore::new();
    let base = 1_000_000;
    let records = fill(&[&pg_store, &memory], base).await;
    let mut filters = vec![
        ListingFilter::default(),
        ListingFilter {
            tool: Some("sleep".into()),
            ..Default::default()
        },
        ListingFilter {
            owner: Some(alice()),
            ..Default::default()
        },
        ListingFilter {
            created_from: Some(base + 10),
            created_to: Some(base + 30),
            ..Default::default()
        },
        ListingFilter::default().with_text("DISK"),
        // Not ASCII: case folded by Rust, not by the database.
        ListingFilter::default().with_text("ärger"),
        // An id.
        ListingFilter::default().with_text("0000002"),
        ListingFilter {
            status: Some(ListedStatus::Working),
            tool: Some("echo".into()),
            ..Default::default()
        },
        ListingFilter {
            owner: Some(alice()),
            status: Some(ListedStatus::Failed),
            ..Default::default()
        }
        .with_text("node"),
        ListingFilter {
            tool: Some("fetch".into()),
            status: Some(ListedStatus::Cancelled),
            created_from: Some(base + 5),
            created_to: Some(base + 40),
            ..Default::default()
        },
        ListingFilter {
            owner: Some(owner_key("acme", "bob")),
            tool: Some("sleep".into()),
            created_to: Some(base + 30),
            ..Default::default()
        }
        .with_text("ÜBER"),
        ListingFilter {
            tool: Some("nope".into()),
            ..Default::default()
        },
    ];
    for status in ListedStatus::ALL {
        filters.push(ListingFilter {
            status: Some(status),
            ..Default::default()
        });
    }
    let listed: Vec<ListedTask> = {
        let mut all = pages(&memory, &ListingFilter::default(), 500, 20_000)
            .await
            .remove(0)
            .tasks;
        all.sort_by_key(|t| std::cmp::Reverse(t.cursor()));
        all
    };
    assert_eq!(listed.len(), records.len());
    for filter in &filters {
        let expected: Vec<ListedTask> = listed
            .iter()
            .filter(|t| filter.matches(t))
            .cloned()
            .collect();
        for limit in [1, 5, 500] {
            for budget in [1, 7, 20_000] {
                let got = pages(&pg_store, filter, limit, budget).await;
                let want = pages(&memory, filter, limit, budget).await;
                assert_eq!(got, want, "{filter:?}, limit {limit}, budget {budget}");
                let seen: Vec<ListedTask> = got.into_iter().flat_map(|p| p.tasks).collect();
                assert_eq!(seen, expected, "{filter:?}, limit {limit}, budget {budget}");
            }
        }
    }
    // Some filters keep something (the comparison is not of empty pages).
    let kept = |f: &ListingFilter| listed.iter().filter(|t| f.matches(t)).count();
    assert!(kept(&filters[5]) > 0 && kept(&filters[8]) > 0 && kept(&filters[10]) > 0);
    // The budget cuts a page short, and the cursor goes on from there.
    let failed = ListingFilter {
        status: Some(ListedStatus::Failed),
        ..Default::default()
    }
    .with_text("nothing like it");
    let page = pg_store.listing(&failed, None, 2, 4).await.unwrap();
    assert!(page.budget_spent && page.tasks.is_empty());
    assert_eq!(page.scanned, 4);
    let next = pg_store
        .listing(&failed, page.next, 10, 20_000)
        .await
        .unwrap();
    assert_eq!(
        (next.scanned, next.next, next.budget_spent),
        (11, None, false)
    );
    assert!(pg_store.stored_bytes().await.unwrap().unwrap() > 0);
    pg_store.close().await;
    pg.drop().await;
}

/// The counters of `store`, sorted.
async fn counts(store: &dyn TaskStore) -> Vec<ListingCount> {
    let mut c = index(store).listing_counts().await.unwrap();
    c.sort_by(|a, b| (&a.owner, &a.tool, a.status).cmp(&(&b.owner, &b.tool, b.status)));
    c
}

fn count(c: &[ListingCount], principal: &str, tool: &str, status: ListedStatus) -> u64 {
    let owner = owner_key("acme", principal);
    c.iter()
        .find(|c| c.owner == owner && c.tool == tool && c.status == status)
        .map_or(0, |c| c.tasks)
}

fn bucket(b: &[ThroughputBucket], minute_ms: u64, kind: ThroughputKind) -> u64 {
    b.iter()
        .find(|b| b.minute_ms == minute_ms && b.kind == kind)
        .map_or(0, |b| b.count)
}

/// Counters and throughput through creation, input_required, completed, failed, cancelled
/// and deletion: exact, the same on two nodes, and the memory store's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_and_throughput_follow_the_lifecycle_on_every_node() {
    let Some(pg) = pg::fresh().await else { return };
    let a = PostgresStore::open(&pg.url, pg.options("a", TTL))
        .await
        .unwrap();
    let b = PostgresStore::open(&pg.url, pg.options("b", TTL))
        .await
        .unwrap();
    let memory = MemoryStore::new();
    let stores: [&dyn TaskStore; 2] = [&a, &memory];
    // Recent times: the sweep leader drops buckets older than a day.
    let created = minute_of(now_ms()) - 120_000 + 10;
    let minute = minute_of(created);
    let mut tasks: Vec<TaskRecord> = (0..3)
        .map(|n| record(n, "alice", "echo", created + u64::from(n)))
        .collect();
    for t in &tasks {
        commit_all(&stores, write(t)).await;
    }
    let c = counts(&b).await;
    assert_eq!(count(&c, "alice", "echo", ListedStatus::Working), 3);
    let tp = b.throughput(0).await.unwrap();
    assert_eq!(bucket(&tp, minute, ThroughputKind::Created), 3);
    // input_required and back: moved counters, no throughput.
    for t in &mut tasks {
        advance(
            t,
            TaskStatus::InputRequired,
            Some("which file?"),
            created + 1_000,
        );
        commit_all(&stores, write(t)).await;
    }
    let c = counts(&b).await;
    assert_eq!(count(&c, "alice", "echo", ListedStatus::Working), 0);
    assert_eq!(count(&c, "alice", "echo", ListedStatus::InputRequired), 3);
    assert!(
        !c.iter().any(|c| c.tasks == 0),
        "an empty triple is left out: {c:?}"
    );
    for t in &mut tasks {
        advance(t, TaskStatus::Working, None, created + 2_000);
        commit_all(&stores, write(t)).await;
    }
    // Each ends differently, in the next minute.
    let ended = created + 60_000;
    for (t, status) in tasks.iter_mut().zip([
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ]) {
        advance(t, status, None, ended);
        commit_all(&stores, write(t)).await;
    }
    for store in [&a as &dyn TaskStore, &b] {
        let c = counts(store).await;
        assert_eq!(count(&c, "alice", "echo", ListedStatus::Working), 0);
        assert_eq!(count(&c, "alice", "echo", ListedStatus::Completed), 1);
        assert_eq!(count(&c, "alice", "echo", ListedStatus::Failed), 1);
        assert_eq!(count(&c, "alice", "echo", ListedStatus::Cancelled), 1);
        let tp = index(store).throughput(0).await.unwrap();
        let next = minute_of(ended);
        assert_eq!(bucket(&tp, minute, ThroughputKind::Created), 3);
        assert_eq!(bucket(&tp, next, ThroughputKind::Completed), 1);
        assert_eq!(bucket(&tp, next, ThroughputKind::Failed), 1);
        assert_eq!(bucket(&tp, next, ThroughputKind::Cancelled), 1);
        // From the later minute on: its buckets only.
        assert_eq!(index(store).throughput(next).await.unwrap().len(), 3);
    }
    // A rewrite of a finished task (the same status, a new message) counts nothing more.
    let mut done = tasks[0].clone();
    done.status_message = Some("kept".into());
    let mut rewrite = write(&done);
    if let WriteOp::Put { expect, .. } = &mut rewrite {
        *expect = Expect::Any;
    }
    commit_all(&stores, rewrite).await;
    // The reaper's delete: counters down, throughput unchanged.
    commit_all(
        &stores,
        WriteOp::Delete {
            id: tasks[1].id.as_str().to_owned(),
        },
    )
    .await;
    let c = counts(&b).await;
    assert_eq!(count(&c, "alice", "echo", ListedStatus::Failed), 0);
    assert_eq!(c, counts(&a).await);
    assert_eq!(c, counts(&memory).await);
    let tp = b.throughput(0).await.unwrap();
    assert_eq!(tp, memory.throughput(0).await.unwrap());
    assert_eq!(tp, a.throughput(0).await.unwrap());
    // Kept in several rows (shards of the task ids) that add up, so that concurrent commits
    // do not queue on one row lock.
    for n in 10..40 {
        b.commit(vec![write(&record(n, "bob", "sleep", created))])
            .await
            .unwrap();
    }
    assert_eq!(
        count(&counts(&a).await, "bob", "sleep", ListedStatus::Working),
        30
    );
    let rows: i64 = pg
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM mcp_listing_counts WHERE owner = $1",
            &[&owner_key("acme", "bob")],
        )
        .await
        .unwrap()
        .get(0);
    assert!(rows > 1, "one row for 30 tasks");
    a.close().await;
    b.close().await;
    pg.drop().await;
}

/// A database of schema version 5 (no listing columns, counters or buckets) is filled in by
/// the next open from the snapshots: the same pages and counters as the memory store, no
/// throughput (the past is unknown), and a record that does not decode stays unlisted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_5_database_is_filled_in_from_the_snapshots() {
    let Some(pg) = pg::fresh().await else { return };
    let a = PostgresStore::open(&pg.url, pg.options("a", TTL))
        .await
        .unwrap();
    let memory = MemoryStore::new();
    fill(&[&a, &memory], 2_000_000).await;
    a.close().await;
    let client = pg.client().await;
    client
        .batch_execute(
            "DROP TABLE mcp_flow, mcp_flow_buckets;
             DROP TRIGGER mcp_tasks_listed ON mcp_tasks;
             DROP TRIGGER mcp_tasks_relisted ON mcp_tasks;
             DROP FUNCTION mcp_listing_track();
             DROP TABLE mcp_listing_counts, mcp_throughput;
             ALTER TABLE mcp_tasks DROP COLUMN tool, DROP COLUMN status,
                 DROP COLUMN status_message, DROP COLUMN updated_ms;
             DELETE FROM mcp_schema WHERE version >= 6;",
        )
        .await
        .unwrap();
    client
        .execute(
            "INSERT INTO mcp_tasks (id, bytes, live, task_owner, created_ms)
             VALUES ('tsk_damaged', '\\x00ff', false, $1, 2000001)",
            &[&alice()],
        )
        .await
        .unwrap();
    // The runtime's indexer reads the snapshots (the store alone refuses: see
    // `postgres_owners::owners_are_indexed_counted_and_converted`).
    let c = PostgresStore::open(
        &pg.url,
        PostgresOptions {
            indexer: std::sync::Arc::new(mcp_tasks::TaskIndexer),
            ..pg.options("c", TTL)
        },
    )
    .await
    .unwrap();
    let version: i64 = client
        .query_one("SELECT max(version) FROM mcp_schema", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, mcp_tasks::store::postgres::SCHEMA_VERSION);
    assert_eq!(version, 8);
    assert_eq!(counts(&c).await, counts(&memory).await);
    assert!(c.throughput(0).await.unwrap().is_empty());
    for filter in [
        ListingFilter::default(),
        ListingFilter {
            owner: Some(alice()),
            ..Default::default()
        },
        ListingFilter {
            status: Some(ListedStatus::Cancelled),
            ..Default::default()
        }
        .with_text("ärger"),
        ListingFilter {
            tool: Some("fetch".into()),
            ..Default::default()
        },
    ] {
        assert_eq!(
            pages(&c, &filter, 7, 20_000).await,
            pages(&memory, &filter, 7, 20_000).await,
            "{filter:?}"
        );
    }
    // Counted from now on like any other: a new task and its end.
    let now = now_ms();
    let mut t = record(500, "alice", "echo", now);
    c.commit(vec![write(&t)]).await.unwrap();
    advance(&mut t, TaskStatus::Completed, None, now);
    c.commit(vec![write(&t)]).await.unwrap();
    let tp = c.throughput(0).await.unwrap();
    assert_eq!(bucket(&tp, minute_of(now), ThroughputKind::Created), 1);
    assert_eq!(bucket(&tp, minute_of(now), ThroughputKind::Completed), 1);
    c.close().await;
    pg.drop().await;
}

/// `store migrate` from a redb file writes the listing of every task (read from its
/// snapshot), and `store purge` takes the purged tasks out of the counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_migrate_and_purge_keep_the_listing() {
    let Some(pg) = pg::fresh().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.redb");
    let redb = RedbStore::open(&path, StoreOptions::default()).unwrap();
    let memory = MemoryStore::new();
    fill(&[&redb, &memory], 3_000_000).await;
    redb.close().await;
    drop(redb);
    let from = mcp_tasks::admin::Location::parse(path.to_str().unwrap());
    let to = mcp_tasks::admin::Location::parse(&pg.url_with_schema());
    let report = mcp_tasks::admin::migrate(&from, &to).await.unwrap();
    assert_eq!(report.tasks, 90);
    let a = PostgresStore::open(&pg.url, pg.options("a", TTL))
        .await
        .unwrap();
    assert_eq!(counts(&a).await, counts(&memory).await);
    let all = ListingFilter::default();
    assert_eq!(
        pages(&a, &all, 500, 20_000).await,
        pages(&memory, &all, 500, 20_000).await
    );
    a.close().await;
    // Purge the failed tasks (no replica runs).
    let filter = mcp_tasks::admin::Filter {
        status: vec!["failed".into()],
        ..Default::default()
    };
    let purged = mcp_tasks::admin::purge(&to, &filter, false).await.unwrap();
    assert_eq!(purged.tasks.len(), 15);
    for t in &purged.tasks {
        memory
            .commit(vec![WriteOp::Delete { id: t.id.clone() }])
            .await
            .unwrap();
    }
    let b = PostgresStore::open(&pg.url, pg.options("b", TTL))
        .await
        .unwrap();
    let c = counts(&b).await;
    assert!(!c.iter().any(|c| c.status == ListedStatus::Failed), "{c:?}");
    assert_eq!(c, counts(&memory).await);
    assert_eq!(
        pages(&b, &all, 500, 20_000).await,
        pages(&memory, &all, 500, 20_000).await
    );
    b.close().await;
    pg.drop().await;
}

/// The cluster's overview: every node with its heartbeat and leases, who holds a task's
/// lease and how often it was taken over, and the ids another node commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_leases_and_other_nodes_commits() {
    let Some(pg) = pg::fresh().await else { return };
    let a = PostgresStore::open(&pg.url, pg.options("a", TTL))
        .await
        .unwrap();
    let b = PostgresStore::open(&pg.url, pg.options("b", TTL))
        .await
        .unwrap();
    // b hears a's commits once its listening connection is up.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !b.is_listening() {
        assert!(tokio::time::Instant::now() < deadline, "b never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut commits = Cluster::watch_commits(&b).expect("PostgreSQL signals commits");
    let mut t = record(1, "alice", "echo", now_ms());
    a.commit(vec![write(&t)]).await.unwrap();
    let id = t.id.as_str().to_owned();
    let heard = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let got = commits.recv().await.unwrap();
            if got == id {
                return got;
            }
        }
    })
    .await
    .expect("b hears a's commit");
    assert_eq!(heard, id);

    let nodes = Cluster::nodes(&b).await.unwrap();
    assert_eq!(
        nodes
            .iter()
            .map(|n| (n.node.as_str(), n.leases))
            .collect::<Vec<_>>(),
        vec![("a", 1), ("b", 0)]
    );
    let db_now = b.reference_clock().unwrap().now().unwrap().0;
    for n in &nodes {
        assert!(
            n.heartbeat_ms <= db_now + 1_000 && db_now.saturating_sub(n.heartbeat_ms) < 10_000,
            "{n:?} at {db_now}"
        );
    }
    let lease = Cluster::lease_of(&b, &id).await.unwrap().unwrap();
    assert_eq!(
        (lease.node.as_deref(), lease.epoch, lease.takeovers),
        (Some("a"), 1, 0)
    );
    assert_eq!(Cluster::lease_of(&b, "tsk_nothing").await.unwrap(), None);
    // b takes it over.
    assert!(pg.take_over(&b, &id, "a").await.is_some());
    let lease = Cluster::lease_of(&a, &id).await.unwrap().unwrap();
    assert_eq!(
        (lease.node.as_deref(), lease.epoch, lease.takeovers),
        (Some("b"), 2, 1)
    );
    let nodes = Cluster::nodes(&a).await.unwrap();
    assert_eq!(
        nodes
            .iter()
            .map(|n| (n.node.as_str(), n.leases))
            .collect::<Vec<_>>(),
        vec![("a", 0), ("b", 1)]
    );
    // Finished: nobody's lease.
    advance(&mut t, TaskStatus::Completed, None, now_ms());
    b.commit(vec![write(&t)]).await.unwrap();
    let lease = Cluster::lease_of(&a, &id).await.unwrap().unwrap();
    assert_eq!((lease.node, lease.epoch), (None, 2));
    let nodes = Cluster::nodes(&a).await.unwrap();
    assert!(nodes.iter().all(|n| n.leases == 0), "{nodes:?}");
    a.close().await;
    b.close().await;
    pg.drop().await;
}
