//! One conformance suite of the task store, run against every backend: the in-memory store
//! and redb (`tests/it/store_conformance.rs`) and PostgreSQL (`tests/pg/postgres.rs`). It
//! holds what the runtime relies on whatever the backend: records read back as they were
//! put (also when a put says its last bytes never change), conditional puts refuse a stale
//! writer, the live and due indexes, the owner index and its usage, deletion, and the meta
//! table. Each backend's own tests check what only it does (redb's pages, PostgreSQL's
//! leases).
//!
//! [`check`] needs a store of its own (a fresh file, a fresh schema): it reads the whole
//! live and due indexes.

use mcp_tasks::store::{Expect, OwnerEntry, Store, StoreError, WriteOp, owner_key};

/// Runs every check of the suite on `store`, panicking with the backend's description and
/// the check that failed.
pub async fn check(store: &Store) {
    let backend = store.describe();
    records_read_back_as_put(store, &backend).await;
    conditional_puts_refuse_a_stale_writer(store, &backend).await;
    constant_tails_read_back_whole(store, &backend).await;
    live_and_due_follow_the_puts(store, &backend).await;
    owners_and_usage_follow_the_records(store, &backend).await;
    meta_keys(store, &backend).await;
}

/// A task id of the suite (`tsk_` and 32 hex digits, as the runtime writes them).
fn id(n: u32) -> String {
    format!("tsk_{n:032x}")
}

/// A put as the runtime writes it: conditional, with the task's owner.
#[allow(clippy::too_many_arguments)]
fn put(
    id: &str,
    bytes: &[u8],
    constant_tail: usize,
    live: bool,
    due_ms: Option<u64>,
    seq: u64,
    expect: Expect,
    owner: &str,
    created_ms: u64,
) -> WriteOp {
    WriteOp::Put {
        id: id.to_owned(),
        bytes: bytes.to_vec(),
        constant_tail,
        live,
        due_ms,
        seq: Some(seq),
        expect,
        owner: Some(OwnerEntry {
            owner: owner.to_owned(),
            created_ms,
        }),
        listing: None,
    }
}

/// The ids of the live index.
async fn live_ids(store: &Store) -> Vec<String> {
    let live = store.live().await.unwrap();
    live.into_iter().map(|(id, _)| id).collect()
}

/// Deletes `ids` in one commit.
async fn delete(store: &Store, ids: &[&str]) {
    let ops = ids
        .iter()
        .map(|id| WriteOp::Delete {
            id: (*id).to_owned(),
        })
        .collect();
    store.commit(ops).await.unwrap();
}

/// The first put of a live task.
fn create(id: &str, bytes: &[u8], owner: &str, created_ms: u64) -> WriteOp {
    put(
        id,
        bytes,
        0,
        true,
        None,
        1,
        Expect::Absent,
        owner,
        created_ms,
    )
}

async fn records_read_back_as_put(store: &Store, backend: &str) {
    let alice = owner_key("acme", "alice");
    let (a, b, missing) = (id(0x100), id(0x101), id(0x1ff));
    assert_eq!(store.get(&missing).await.unwrap(), None, "{backend}");
    store
        .commit(vec![
            create(&a, b"record a", &alice, 10),
            create(&b, &[0u8, 255, 7], &alice, 11),
        ])
        .await
        .unwrap();
    assert_eq!(
        store.get(&a).await.unwrap().as_deref(),
        Some(&b"record a"[..]),
        "{backend}: get"
    );
    assert_eq!(
        store
            .get_many(vec![b.clone(), missing.clone(), a.clone()])
            .await
            .unwrap(),
        vec![Some(vec![0u8, 255, 7]), None, Some(b"record a".to_vec())],
        "{backend}: get_many keeps the order asked, None for a task not stored"
    );
    // A delete removes the record; deleting what is not stored is nothing.
    store
        .commit(vec![
            WriteOp::Delete { id: b.clone() },
            WriteOp::Delete {
                id: missing.clone(),
            },
        ])
        .await
        .unwrap();
    assert_eq!(store.get(&b).await.unwrap(), None, "{backend}: deleted");
    delete(store, &[&a]).await;
}

async fn conditional_puts_refuse_a_stale_writer(store: &Store, backend: &str) {
    let alice = owner_key("acme", "alice");
    let t = id(0x200);
    let next = |seq: u64, bytes: &[u8]| {
        put(
            &t,
            bytes,
            0,
            true,
            None,
            seq,
            Expect::Seq(seq - 1),
            &alice,
            20,
        )
    };
    store
        .commit(vec![create(&t, b"v1", &alice, 20)])
        .await
        .unwrap();
    let again = store
        .commit(vec![create(&t, b"v1 again", &alice, 20)])
        .await;
    assert!(
        matches!(again, Err(StoreError::Conflict { .. })),
        "{backend}: a second creation of one id is refused: {again:?}"
    );
    store.commit(vec![next(2, b"v2")]).await.unwrap();
    let stale = store.commit(vec![next(2, b"v2 from a stale writer")]).await;
    assert!(
        matches!(&stale, Err(StoreError::Conflict { found: Some(2), .. })),
        "{backend}: a put expecting an older sequence number is refused: {stale:?}"
    );
    assert_eq!(
        store.get(&t).await.unwrap().as_deref(),
        Some(&b"v2"[..]),
        "{backend}: the refused puts changed nothing"
    );
    delete(store, &[&t]).await;
}

async fn constant_tails_read_back_whole(store: &Store, backend: &str) {
    let alice = owner_key("acme", "alice");
    let t = id(0x300);
    // Large enough for a backend to keep apart (redb: 4 KiB and more).
    let tail: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 251) as u8).collect();
    let whole = |head: &[u8]| [head, tail.as_slice()].concat();
    let tailed = |seq: u64, head: &[u8], constant_tail: usize, expect: Expect| {
        put(
            &t,
            &whole(head),
            constant_tail,
            true,
            None,
            seq,
            expect,
            &alice,
            30,
        )
    };
    store
        .commit(vec![tailed(1, b"head one", tail.len(), Expect::Absent)])
        .await
        .unwrap();
    store
        .commit(vec![tailed(
            2,
            b"head two, longer",
            tail.len(),
            Expect::Seq(1),
        )])
        .await
        .unwrap();
    let read = |what: &'static str, got: Option<Vec<u8>>, head: &[u8]| {
        assert!(
            got.as_deref() == Some(whole(head).as_slice()),
            "{backend}: {what} of a record with a constant tail is not the bytes last put ({} bytes read)",
            got.map_or(0, |g| g.len())
        );
    };
    read("get", store.get(&t).await.unwrap(), b"head two, longer");
    read(
        "get_many",
        store
            .get_many(vec![t.clone()])
            .await
            .unwrap()
            .pop()
            .flatten(),
        b"head two, longer",
    );
    let live = store.live().await.unwrap();
    read(
        "live",
        live.into_iter().find(|(i, _)| *i == t).map(|(_, b)| b),
        b"head two, longer",
    );
    let owned = store.owned(&alice, None, 100).await.unwrap();
    read(
        "owned",
        owned.into_iter().find(|r| r.id == t).map(|r| r.bytes),
        b"head two, longer",
    );
    // A put that keeps its bytes whole, then apart again.
    store
        .commit(vec![tailed(3, b"whole", 0, Expect::Seq(2))])
        .await
        .unwrap();
    read(
        "get after a whole put",
        store.get(&t).await.unwrap(),
        b"whole",
    );
    store
        .commit(vec![tailed(4, b"apart again", tail.len(), Expect::Seq(3))])
        .await
        .unwrap();
    read(
        "get after a put apart again",
        store.get(&t).await.unwrap(),
        b"apart again",
    );
    delete(store, &[&t]).await;
    assert_eq!(store.get(&t).await.unwrap(), None, "{backend}");
}

async fn live_and_due_follow_the_puts(store: &Store, backend: &str) {
    let alice = owner_key("acme", "alice");
    let (a, b, c) = (id(0x400), id(0x401), id(0x402));
    let at = |id: &str, live: bool, due: Option<u64>, seq: u64| {
        let expect = if seq == 1 {
            Expect::Absent
        } else {
            Expect::Seq(seq - 1)
        };
        put(id, b"x", 0, live, due, seq, expect, &alice, 40)
    };
    store
        .commit(vec![
            at(&a, true, Some(3_000), 1),
            at(&b, true, Some(1_000), 1),
            at(&c, false, Some(2_000), 1),
        ])
        .await
        .unwrap();
    let live = live_ids(store).await;
    assert_eq!(live, [a.clone(), b.clone()], "{backend}: live, by id");
    assert_eq!(
        store.due(2_500, 10).await.unwrap(),
        [b.clone(), c.clone()],
        "{backend}: due by time"
    );
    assert_eq!(
        store.due(2_500, 1).await.unwrap(),
        std::slice::from_ref(&b),
        "{backend}: limit"
    );
    assert_eq!(store.next_due().await.unwrap(), Some(1_000), "{backend}");
    // `a` finishes (no longer live, due later); `b`'s due entry goes.
    store
        .commit(vec![
            at(&a, false, Some(5_000), 2),
            WriteOp::SetDue {
                id: b.clone(),
                due_ms: None,
            },
        ])
        .await
        .unwrap();
    let live = live_ids(store).await;
    assert_eq!(
        live,
        std::slice::from_ref(&b),
        "{backend}: a finished task leaves live"
    );
    assert_eq!(
        store.due(10_000, 10).await.unwrap(),
        [c.clone(), a.clone()],
        "{backend}: due after the changes"
    );
    delete(store, &[&a, &b, &c]).await;
    assert!(store.live().await.unwrap().is_empty(), "{backend}");
    assert!(
        store.due(u64::MAX, 10).await.unwrap().is_empty(),
        "{backend}"
    );
    assert_eq!(store.next_due().await.unwrap(), None, "{backend}");
}

async fn owners_and_usage_follow_the_records(store: &Store, backend: &str) {
    let carol = owner_key("acme", "carol");
    let dave = owner_key("other", "dave");
    let ids: Vec<String> = (0..5).map(|n| id(0x500 + n)).collect();
    // Created out of order; carol's index pages them by (creation time, id).
    let created = [50, 52, 51, 52, 53];
    let mut ops: Vec<WriteOp> = ids
        .iter()
        .zip(created)
        .map(|(i, at)| create(i, &vec![1u8; 100 + at as usize], &carol, at))
        .collect();
    ops.push(create(&id(0x5ff), b"dave's", &dave, 50));
    store.commit(ops).await.unwrap();

    let first = store.owned(&carol, None, 3).await.unwrap();
    let order = |page: &[mcp_tasks::store::OwnedRecord]| {
        page.iter().map(|r| r.id.clone()).collect::<Vec<_>>()
    };
    assert_eq!(
        order(&first),
        [ids[0].clone(), ids[2].clone(), ids[1].clone()],
        "{backend}: first page by (creation time, id)"
    );
    let last = first.last().unwrap();
    let cursor = mcp_tasks::store::OwnedCursor {
        created_ms: last.created_ms,
        id: last.id.clone(),
    };
    let second = store.owned(&carol, Some(cursor), 3).await.unwrap();
    assert_eq!(
        order(&second),
        [ids[3].clone(), ids[4].clone()],
        "{backend}: the next page, nothing of another owner"
    );

    let usage = store.usage(&carol).await.unwrap();
    let at_least: u64 = ids
        .iter()
        .zip(created)
        .map(|(i, at)| (i.len() + 100 + at as usize) as u64)
        .sum();
    assert_eq!(usage.tasks, 5, "{backend}: {usage:?}");
    assert!(
        usage.bytes >= at_least && usage.bytes < at_least + 5 * 512,
        "{backend}: usage {usage:?} for {at_least} bytes of ids and records"
    );
    // A record that grows counts its new size; a deleted one counts no more.
    store
        .commit(vec![put(
            &ids[0],
            &vec![1u8; 10_150],
            0,
            true,
            None,
            2,
            Expect::Seq(1),
            &carol,
            50,
        )])
        .await
        .unwrap();
    let grown = store.usage(&carol).await.unwrap();
    assert_eq!(grown.tasks, 5, "{backend}");
    assert_eq!(
        grown.bytes,
        usage.bytes + 10_000,
        "{backend}: a record 10,000 bytes larger"
    );
    delete(store, &[&ids[0]]).await;
    let after = store.usage(&carol).await.unwrap();
    assert_eq!(after.tasks, 4, "{backend}");
    assert!(after.bytes < usage.bytes, "{backend}: {after:?}");
    assert_eq!(store.usage(&dave).await.unwrap().tasks, 1, "{backend}");
    let dave_task = id(0x5ff);
    delete(store, &[&ids[1], &ids[2], &ids[3], &ids[4], &dave_task]).await;
    assert_eq!(
        store.usage(&carol).await.unwrap().tasks,
        0,
        "{backend}: every record deleted"
    );
}

async fn meta_keys(store: &Store, backend: &str) {
    let put = |key: &str, value: &[u8]| WriteOp::PutMeta {
        key: key.to_owned(),
        value: value.to_vec(),
    };
    store
        .commit(vec![
            put("conformance/b", b"2"),
            put("conformance/a", b"1"),
            put("conformance/c", b"3"),
            put("conformanceX", b"not under the prefix"),
        ])
        .await
        .unwrap();
    assert_eq!(
        store.meta_get("conformance/a").await.unwrap().as_deref(),
        Some(&b"1"[..]),
        "{backend}"
    );
    let page = store.meta_page("conformance/", None, 2).await.unwrap();
    let keys: Vec<&str> = page.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        ["conformance/a", "conformance/b"],
        "{backend}: a page"
    );
    let page = store
        .meta_page("conformance/", Some("conformance/b"), 10)
        .await
        .unwrap();
    let keys: Vec<&str> = page.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        ["conformance/c"],
        "{backend}: after a key, within the prefix"
    );
    // The first writer of an absent key wins; a set key is not replaced by it.
    store
        .commit(vec![
            WriteOp::PutMetaIfAbsent {
                key: "conformance/a".into(),
                value: b"other".to_vec(),
            },
            WriteOp::PutMetaIfAbsent {
                key: "conformance/d".into(),
                value: b"4".to_vec(),
            },
        ])
        .await
        .unwrap();
    assert_eq!(
        store.meta_get("conformance/a").await.unwrap().as_deref(),
        Some(&b"1"[..]),
        "{backend}: PutMetaIfAbsent keeps a set key"
    );
    assert_eq!(
        store.meta_get("conformance/d").await.unwrap().as_deref(),
        Some(&b"4"[..]),
        "{backend}: PutMetaIfAbsent sets an absent one"
    );
    let keys = [
        "conformance/a",
        "conformance/b",
        "conformance/c",
        "conformance/d",
        "conformanceX",
    ];
    store
        .commit(
            keys.iter()
                .map(|k| WriteOp::DeleteMeta { key: (*k).into() })
                .collect(),
        )
        .await
        .unwrap();
    for key in keys {
        assert_eq!(
            store.meta_get(key).await.unwrap(),
            None,
            "{backend}: {key} deleted"
        );
    }
}
