//! Group commit on PostgreSQL (`mcp-tasks-store/src/postgres/group.rs`): the one-`Put` commits waiting at
//! once share a transaction, and each keeps the outcome it would have had alone — a refused
//! one is refused without taking the others with it, and a row locked by another transaction
//! holds the others back briefly, not for the session's lock bound; a `COMMIT` that waits for
//! a lock waits as any commit does, and one the server refuses leaves each commit to be made
//! alone. Skipped without a server unless `MCP_TASKS_REQUIRE_POSTGRES` is set.
#![cfg(feature = "postgres")]

use crate::pg;

use std::time::Duration;

use mcp_tasks::internals::persist;
use mcp_tasks::internals::task::{Owner, TaskId, TaskRecord};
use mcp_tasks::store::{Expect, PostgresStore, StoreError, TaskStore, WriteOp};
use serde_json::json;

fn record(n: u32, seq: u64) -> TaskRecord {
    let mut r = TaskRecord::new(
        TaskId::parse(&format!("tsk_{n:032x}")).unwrap(),
        Owner::new("acme", "alice"),
        "tool".into(),
        json!({ "n": n }),
        serde_json::Value::Null,
        1_800_000_000_000,
        None,
        None,
        None,
    );
    r.seq = seq;
    r
}

fn put(n: u32, seq: u64, expect: Expect) -> WriteOp {
    let r = record(n, seq);
    WriteOp::Put {
        id: r.id.as_str().to_owned(),
        bytes: persist::encode(&r).unwrap(),
        constant_tail: 0,
        live: true,
        due_ms: None,
        seq: Some(seq),
        expect,
        owner: None,
        listing: Some(mcp_tasks::internals::listing_of(&r)),
    }
}

fn id(n: u32) -> String {
    format!("tsk_{n:032x}")
}

/// How many transactions wrote the rows of `ids` (their distinct `xmin`).
async fn writers(client: &tokio_postgres::Client, ids: &[String]) -> i64 {
    client
        .query_one(
            "SELECT count(DISTINCT xmin::text) FROM mcp_tasks WHERE id = ANY($1)",
            &[&ids],
        )
        .await
        .unwrap()
        .get(0)
}

// One thread: every commit is queued before the group committer runs (deterministic groups).
#[tokio::test(flavor = "current_thread")]
async fn commits_waiting_at_once_share_a_transaction_and_keep_their_own_outcomes() {
    let Some(pg) = pg::fresh().await else { return };
    let store = PostgresStore::open(&pg.url, pg.options("a", Duration::from_secs(15)))
        .await
        .unwrap();
    let client = pg.client().await;
    const N: u32 = 64;
    let ids: Vec<String> = (0..N).map(id).collect();

    // 64 creations at once: all stored, by fewer transactions than commits.
    let created =
        futures::future::join_all((0..N).map(|n| store.commit(vec![put(n, 1, Expect::Absent)])))
            .await;
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let by = writers(&client, &ids).await;
    assert!(
        by < i64::from(N),
        "{N} creations by {by} transactions: none grouped"
    );

    // 64 updates at once, every eighth from a wrong sequence number: those are refused as
    // conflicts, every other one is stored.
    let updated = futures::future::join_all((0..N).map(|n| {
        let expect = if n % 8 == 0 {
            Expect::Seq(5)
        } else {
            Expect::Seq(1)
        };
        store.commit(vec![put(n, 2, expect)])
    }))
    .await;
    for (n, outcome) in (0..N).zip(&updated) {
        if n % 8 == 0 {
            assert!(
                matches!(outcome, Err(StoreError::Conflict { .. })),
                "task {n}: {outcome:?}"
            );
        } else {
            assert!(outcome.is_ok(), "task {n}: {outcome:?}");
        }
    }
    let seqs: Vec<(String, i64)> = client
        .query("SELECT id, seq FROM mcp_tasks ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(seqs.len(), N as usize);
    for (n, (row_id, seq)) in (0..N).zip(&seqs) {
        assert_eq!(row_id, &id(n));
        assert_eq!(*seq, if n % 8 == 0 { 1 } else { 2 }, "task {n}");
    }
    store.close().await;
    pg.drop().await;
}

// One thread: every commit below is queued before the group committer runs, so the locked
// row's commit and the others are one group.
#[tokio::test(flavor = "current_thread")]
async fn a_locked_row_does_not_hold_its_group_for_the_lock_bound() {
    let Some(pg) = pg::fresh().await else { return };
    // A long lease: the session's lock bound is 20 s, far past this test's wait.
    let store = PostgresStore::open(&pg.url, pg.options("a", Duration::from_secs(60)))
        .await
        .unwrap();
    const N: u32 = 10;
    for n in 0..N {
        store.commit(vec![put(n, 1, Expect::Absent)]).await.unwrap();
    }
    // Another transaction (a frozen peer's, say) holds task 0's row.
    let holder = pg.client().await;
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM mcp_tasks WHERE id = '{}' FOR UPDATE",
            id(0)
        ))
        .await
        .unwrap();
    let store = std::sync::Arc::new(store);
    let locked = {
        let store = store.clone();
        tokio::spawn(async move { store.commit(vec![put(0, 2, Expect::Seq(1))]).await })
    };
    let others =
        futures::future::join_all((1..N).map(|n| store.commit(vec![put(n, 2, Expect::Seq(1))])));
    // The others commit while the row is still held (a group waits for it 50 ms, then each
    // commit goes alone); waiting for the session's lock bound (20 s) would time out here.
    let others = tokio::time::timeout(Duration::from_secs(10), others)
        .await
        .expect("the other commits were held back by the locked row");
    assert!(others.iter().all(Result::is_ok), "{others:?}");
    assert!(!locked.is_finished(), "task 0 waits for its row");
    holder.batch_execute("ROLLBACK").await.unwrap();
    let outcome = locked.await.unwrap();
    assert!(
        outcome.is_ok(),
        "task 0 commits once its row is free: {outcome:?}"
    );
    let client = pg.client().await;
    let stored: Vec<i64> = client
        .query("SELECT seq FROM mcp_tasks ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(stored, vec![2; N as usize]);
    match std::sync::Arc::try_unwrap(store) {
        Ok(store) => store.close().await,
        Err(_) => panic!("the store is still shared"),
    }
    pg.drop().await;
}

/// Installs a deferred constraint trigger on `mcp_tasks` that runs `body` (PL/pgSQL) at
/// `COMMIT` for the row of task `n`.
async fn at_commit_for(client: &tokio_postgres::Client, n: u32, body: &str) {
    client
        .batch_execute(&format!(
            "CREATE FUNCTION at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.id = '{}' THEN {body} END IF;
                 RETURN NULL;
             END $$;
             CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON mcp_tasks
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION at_commit();",
            id(n)
        ))
        .await
        .unwrap();
}

// One thread: the ten creations are queued before the group committer runs (one group).
#[tokio::test(flavor = "current_thread")]
async fn a_group_whose_commit_the_server_refuses_is_made_commit_by_commit() {
    let Some(pg) = pg::fresh().await else { return };
    let store = PostgresStore::open(&pg.url, pg.options("a", Duration::from_secs(15)))
        .await
        .unwrap();
    let client = pg.client().await;
    // An error at COMMIT (PostgreSQL reports it before the commit record: the transaction is
    // rolled back) for task 3's row only.
    at_commit_for(&client, 3, "RAISE EXCEPTION 'refused at commit';").await;
    const N: u32 = 10;
    let created =
        futures::future::join_all((0..N).map(|n| store.commit(vec![put(n, 1, Expect::Absent)])))
            .await;
    for (n, outcome) in (0..N).zip(&created) {
        if n == 3 {
            assert!(
                matches!(outcome, Err(StoreError::Commit(_))),
                "task 3 is refused at its own commit: {outcome:?}"
            );
        } else {
            assert!(
                outcome.is_ok(),
                "task {n} is stored though its group's COMMIT failed: {outcome:?}"
            );
        }
    }
    let stored: Vec<String> = client
        .query("SELECT id FROM mcp_tasks ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let expected: Vec<String> = (0..N).filter(|n| *n != 3).map(id).collect();
    assert_eq!(stored, expected);
    store.close().await;
    pg.drop().await;
}

// One thread: the ten creations are queued before the group committer runs (one group).
#[tokio::test(flavor = "current_thread")]
async fn a_groups_commit_waits_for_a_lock_as_long_as_any_commit() {
    let Some(pg) = pg::fresh().await else { return };
    let store = PostgresStore::open(&pg.url, pg.options("a", Duration::from_secs(60)))
        .await
        .unwrap();
    let client = pg.client().await;
    // At COMMIT, task 0's row waits for a lock another session holds for 300 ms: as a
    // notifying transaction waits for the lock on PostgreSQL's notification queue while
    // another one commits. The group's 50 ms bound on row locks must not apply to it.
    client
        .batch_execute("CREATE TABLE probe (k int PRIMARY KEY); INSERT INTO probe VALUES (1);")
        .await
        .unwrap();
    at_commit_for(&client, 0, "PERFORM 1 FROM probe WHERE k = 1 FOR UPDATE;").await;
    let holder = pg.client().await;
    holder
        .batch_execute("BEGIN; SELECT 1 FROM probe WHERE k = 1 FOR UPDATE")
        .await
        .unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        holder.batch_execute("ROLLBACK").await.unwrap();
    });
    const N: u32 = 10;
    let ids: Vec<String> = (0..N).map(id).collect();
    let created =
        futures::future::join_all((0..N).map(|n| store.commit(vec![put(n, 1, Expect::Absent)])))
            .await;
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    release.await.unwrap();
    let by = writers(&client, &ids).await;
    assert!(
        by < i64::from(N),
        "{N} creations by {by} transactions: the group gave up at its COMMIT's lock wait"
    );
    store.close().await;
    pg.drop().await;
}
