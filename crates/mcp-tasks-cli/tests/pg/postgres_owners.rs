//! The owner index and the per-owner usage of the PostgreSQL store: one owner's tasks paged
//! in (creation time, id) order without another owner's rows, usage kept by the commit's
//! transaction and seen alike by two replicas, freed by deletes, and a schema of version 2
//! (rows without owners) converted by the next open; and a page of the owner index bounded
//! in record bytes, alike in the PostgreSQL, redb and memory stores. Each test has a schema of its own
//! (crates/mcp-tasks-cli/tests/pg); skipped without a server unless `MCP_TASKS_REQUIRE_POSTGRES` is set.
#![cfg(feature = "postgres")]

use crate::pg;

use std::sync::Arc;
use std::time::Duration;

use mcp_tasks::internals::persist;
use mcp_tasks::internals::task::{Owner, TaskId, TaskRecord};
use mcp_tasks::store::{
    Expect, Index, MAX_PAGE_BYTES, MemoryStore, OwnedCursor, OwnerEntry, PostgresOptions,
    PostgresStore, RedbStore, StoreError, StoreOptions, TaskStore, Usage, WriteOp, owner_key,
};
use serde_json::json;

fn snapshot(n: u32, principal: &str, created_ms: u64, pad: usize) -> (String, Vec<u8>) {
    let id = format!("tsk_{n:032x}");
    let record = TaskRecord::new(
        TaskId::parse(&id).unwrap(),
        Owner::new("acme", principal),
        "echo".into(),
        json!({ "pad": "x".repeat(pad) }),
        serde_json::Value::Null,
        created_ms,
        Some(60_000),
        None,
        None,
    );
    (id, persist::encode(&record).unwrap())
}

fn create(id: &str, bytes: Vec<u8>, principal: &str, created_ms: u64) -> WriteOp {
    WriteOp::Put {
        id: id.to_owned(),
        bytes,
        constant_tail: 0,
        live: false,
        due_ms: None,
        seq: Some(1),
        expect: Expect::Absent,
        owner: Some(OwnerEntry {
            owner: owner_key("acme", principal),
            created_ms,
        }),
        listing: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_are_indexed_counted_and_converted() {
    let Some(pg) = pg::fresh().await else { return };
    let ttl = Duration::from_secs(5);
    let a = PostgresStore::open(&pg.url, pg.options("a", ttl))
        .await
        .unwrap();
    let b = PostgresStore::open(&pg.url, pg.options("b", ttl))
        .await
        .unwrap();
    let alice = owner_key("acme", "alice");
    let mut alice_ids = Vec::new();
    let mut alice_bytes = 0u64;
    for n in 0..12u32 {
        let created = 1_000 + u64::from(n % 5);
        let (id, bytes) = snapshot(n, "alice", created, 100);
        alice_bytes += (id.len() + bytes.len()) as u64;
        alice_ids.push((created, id.clone()));
        a.commit(vec![create(&id, bytes, "alice", created)])
            .await
            .unwrap();
        let (id, bytes) = snapshot(100 + n, "bob", created, 10_000);
        b.commit(vec![create(&id, bytes, "bob", created)])
            .await
            .unwrap();
    }
    alice_ids.sort();
    // Paging: every task of alice's once, in order, and nothing of bob's.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = b.owned(&alice, after.clone(), 5).await.unwrap();
        seen.extend(page.iter().map(|r| (r.created_ms, r.id.clone())));
        match page.last() {
            Some(last) if page.len() == 5 => {
                after = Some(OwnedCursor {
                    created_ms: last.created_ms,
                    id: last.id.clone(),
                })
            }
            _ => break,
        }
    }
    assert_eq!(seen, alice_ids);
    // Usage: exact, and the same on both replicas.
    let expected = Usage {
        tasks: 12,
        bytes: alice_bytes,
    };
    assert_eq!(a.usage(&alice).await.unwrap(), expected);
    assert_eq!(b.usage(&alice).await.unwrap(), expected);
    // A later write (finishing the task: a bigger record) is counted at its new size.
    let (id0, mut bytes0) = snapshot(0, "alice", 1_000, 100);
    bytes0.extend_from_slice(&[0; 50]);
    a.commit(vec![WriteOp::Put {
        id: id0.clone(),
        bytes: bytes0,
        constant_tail: 0,
        live: false,
        due_ms: Some(1),
        seq: Some(2),
        expect: Expect::Any,
        owner: None,
        listing: None,
    }])
    .await
    .unwrap();
    assert_eq!(b.usage(&alice).await.unwrap().bytes, alice_bytes + 50);
    // The reaper's delete frees it.
    b.commit(vec![WriteOp::Delete { id: id0 }]).await.unwrap();
    let usage = a.usage(&alice).await.unwrap();
    assert_eq!(usage.tasks, 11);
    // Kept in several rows per owner (one per shard of the task ids, so that concurrent
    // writes of one owner's tasks do not queue on one row lock), which add up.
    let rows = pg
        .client()
        .await
        .query(
            "SELECT count(*), sum(tasks)::bigint FROM mcp_usage WHERE owner = $1",
            &[&alice],
        )
        .await
        .unwrap();
    let (shards, tasks): (i64, i64) = (rows[0].get(0), rows[0].get(1));
    assert!(shards > 1, "one row for 11 tasks");
    assert_eq!(tasks, 11);
    let by_owner = a.usage_by_owner().await.unwrap();
    assert_eq!(by_owner.len(), 2, "{by_owner:?}");
    a.close().await;
    b.close().await;

    // A schema of version 2 holding rows (no owner columns, no usage, no instance tokens,
    // no listing): the next open converts it, filling the owners, then the listings, in from
    // the snapshots.
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
             DROP TRIGGER mcp_tasks_usage ON mcp_tasks;
             DROP FUNCTION mcp_usage_track();
             DROP TABLE mcp_usage;
             ALTER TABLE mcp_tasks DROP COLUMN task_owner, DROP COLUMN created_ms,
                 DROP COLUMN size;
             ALTER TABLE mcp_nodes DROP COLUMN instance;
             DELETE FROM mcp_schema WHERE version >= 3;",
        )
        .await
        .unwrap();
    // Without an indexer (the store's default) it is refused, and left at version 2: the
    // conversion reads the records.
    let err = PostgresStore::open(&pg.url, pg.options("c", ttl))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::NeedsIndexer { what, .. } if what == "schema version 2"),
        "{err:?}"
    );
    let version: i64 = client
        .query_one("SELECT max(version) FROM mcp_schema", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, 2);
    let c = PostgresStore::open(
        &pg.url,
        PostgresOptions {
            indexer: Arc::new(mcp_tasks::TaskIndexer),
            ..pg.options("c", ttl)
        },
    )
    .await
    .unwrap();
    assert_eq!(c.usage(&alice).await.unwrap(), usage);
    assert_eq!(c.owned(&alice, None, 100).await.unwrap().len(), 11);
    assert_eq!(c.usage(&owner_key("acme", "bob")).await.unwrap().tasks, 12);
    let listed: Vec<(String, u64)> = c
        .listing_counts()
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.owner, c.tasks))
        .collect();
    assert_eq!(
        listed,
        vec![(alice.clone(), 11), (owner_key("acme", "bob"), 12)]
    );
    c.close().await;
    // `store stats --by-owner` on PostgreSQL: the same figures, largest first.
    let location = mcp_tasks::admin::Location::parse(&pg.url_with_schema());
    let report = mcp_tasks::admin::usage_by_owner(&location).await.unwrap();
    assert_eq!(report.backend, "postgres");
    assert_eq!(report.owners.len(), 2, "{report:?}");
    assert_eq!(report.owners[0].principal, "bob");
    assert_eq!(report.owners[1].principal, "alice");
    assert_eq!(report.owners[1].tasks, usage.tasks);
    assert_eq!(report.owners[1].bytes, usage.bytes);
    pg.drop().await;
}

/// Pages `alice`'s tasks in `store` with a count cap of 100, as the runtime does: on after
/// the last record until a page is empty. The sizes of each page's records.
async fn owned_pages(store: &dyn TaskStore) -> Vec<Vec<(String, usize)>> {
    let alice = owner_key("acme", "alice");
    let mut pages = Vec::new();
    let mut after = None;
    for _ in 0..20 {
        let page = store
            .index()
            .expect("the store keeps indexes")
            .owned(&alice, after.clone(), 100)
            .await
            .unwrap();
        let Some(last) = page.last() else {
            return pages;
        };
        after = Some(OwnedCursor {
            created_ms: last.created_ms,
            id: last.id.clone(),
        });
        pages.push(page.iter().map(|r| (r.id.clone(), r.bytes.len())).collect());
    }
    panic!("the pages never end: {pages:?}");
}

/// A page of the owner index stops once it holds `MAX_PAGE_BYTES` of records, whatever the
/// count cap, and always holds a record (one larger than the bound alone); paging on after
/// its last record yields every task once, in order. The same in every backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_pages_are_bounded_in_bytes_in_every_backend() {
    const MIB: usize = 1024 * 1024;
    // 5 MiB (alone), 3 × 1.5 MiB (4.5 MiB: the third reaches the bound), then 1.5 MiB and
    // three small ones (short of both bounds).
    let pads = [
        5 * MIB,
        3 * MIB / 2,
        3 * MIB / 2,
        3 * MIB / 2,
        3 * MIB / 2,
        10,
        10,
        10,
    ];
    let mut ops = Vec::new();
    let mut ids = Vec::new();
    for (n, pad) in pads.iter().enumerate() {
        let created = 1_000 + n as u64;
        let (id, bytes) = snapshot(n as u32, "alice", created, *pad);
        ids.push(id.clone());
        ops.push(create(&id, bytes, "alice", created));
    }
    // Another owner's large task in between changes nothing.
    let (id, bytes) = snapshot(99, "bob", 1_002, 2 * MIB);
    ops.push(create(&id, bytes, "bob", 1_002));

    let dir = tempfile::tempdir().unwrap();
    let redb = RedbStore::open(&dir.path().join("tasks.redb"), StoreOptions::default()).unwrap();
    let memory = MemoryStore::new();
    let pg = pg::fresh().await;
    let postgres = match &pg {
        Some(pg) => Some(
            PostgresStore::open(&pg.url, pg.options("a", Duration::from_secs(5)))
                .await
                .unwrap(),
        ),
        None => None,
    };
    let mut stores: Vec<(&str, &dyn TaskStore)> = vec![("redb", &redb), ("memory", &memory)];
    if let Some(p) = &postgres {
        stores.push(("postgres", p));
    }
    for (name, store) in stores {
        for op in &ops {
            store.commit(vec![op.clone()]).await.unwrap();
        }
        let pages = owned_pages(store).await;
        let counts: Vec<usize> = pages.iter().map(Vec::len).collect();
        assert_eq!(counts, vec![1, 3, 4], "{name}: {pages:?}");
        for page in &pages {
            let before_last: usize = page[..page.len() - 1].iter().map(|(_, b)| b).sum();
            assert!(before_last < MAX_PAGE_BYTES, "{name}: {pages:?}");
        }
        let seen: Vec<String> = pages.into_iter().flatten().map(|(id, _)| id).collect();
        assert_eq!(seen, ids, "{name}");
    }
}
