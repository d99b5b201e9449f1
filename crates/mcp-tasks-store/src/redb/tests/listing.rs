//! The listing index (layout 5): its entries and counters follow every put and delete.

use super::*;

/// A put with the owner and listing the runtime sends.
pub(super) fn listed(
    id: &str,
    owner: &str,
    created_ms: u64,
    status: ListedStatus,
    tool: &str,
    updated_ms: u64,
) -> WriteOp {
    WriteOp::Put {
        id: id.to_owned(),
        bytes: format!("snapshot {id} {}", status.as_str()).into_bytes(),
        constant_tail: 0,
        live: !status.is_terminal(),
        due_ms: None,
        seq: None,
        expect: Expect::Any,
        owner: Some(crate::OwnerEntry {
            owner: owner.to_owned(),
            created_ms,
        }),
        listing: Some(Listing::new(
            tool,
            status,
            Some(&format!("{id} is {}", status.as_str())),
            updated_ms,
        )),
    }
}

/// The listing index follows every put and delete in the writer's transaction: the entries
/// by creation time, status and tool, the counters, the throughput buckets; each index
/// pages newest first with a cursor, and the budget cuts a page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_index_follows_puts_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("l.redb")).await;
    let (a, b) = (crate::owner_key("t", "a"), crate::owner_key("t", "b"));
    let minute = 10 * 60_000;
    for n in 0..10u64 {
        let owner = if n % 2 == 0 { &a } else { &b };
        let tool = if n < 5 { "x" } else { "y" };
        store
            .commit(vec![listed(
                &format!("t{n}"),
                owner,
                minute + n,
                ListedStatus::Working,
                tool,
                minute + n,
            )])
            .await
            .unwrap();
    }
    // t3 waits for input, t4 completes a minute later, t5 fails, t6 is deleted.
    store
        .commit(vec![listed(
            "t3",
            &b,
            minute + 3,
            ListedStatus::InputRequired,
            "x",
            minute + 50,
        )])
        .await
        .unwrap();
    store
        .commit(vec![listed(
            "t4",
            &a,
            minute + 4,
            ListedStatus::Completed,
            "x",
            minute + 60_000,
        )])
        .await
        .unwrap();
    store
        .commit(vec![listed(
            "t5",
            &b,
            minute + 5,
            ListedStatus::Failed,
            "y",
            minute + 60_001,
        )])
        .await
        .unwrap();
    // A rewrite of a finished task counts nothing more.
    store
        .commit(vec![listed(
            "t4",
            &a,
            minute + 4,
            ListedStatus::Completed,
            "x",
            minute + 60_002,
        )])
        .await
        .unwrap();
    store
        .commit(vec![WriteOp::Delete { id: "t6".into() }])
        .await
        .unwrap();

    let ids = |page: &ListingPage| page.tasks.iter().map(|t| t.id.clone()).collect::<Vec<_>>();
    let all = store
        .listing(&ListingFilter::default(), None, 100, 1000)
        .await
        .unwrap();
    assert_eq!(
        ids(&all),
        ["t9", "t8", "t7", "t5", "t4", "t3", "t2", "t1", "t0"]
    );
    assert_eq!(all.next, None);
    // Pages of two through the cursor give the same order.
    let mut paged = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .listing(&ListingFilter::default(), cursor, 2, 1000)
            .await
            .unwrap();
        paged.extend(ids(&page));
        match page.next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(paged, ids(&all));
    let by = |f: ListingFilter| {
        let store = &store;
        async move { ids(&store.listing(&f, None, 100, 1000).await.unwrap()) }
    };
    let working = ListingFilter {
        status: Some(ListedStatus::Working),
        ..Default::default()
    };
    assert_eq!(
        by(working.clone()).await,
        ["t9", "t8", "t7", "t2", "t1", "t0"]
    );
    assert_eq!(
        by(ListingFilter {
            tool: Some("x".into()),
            ..Default::default()
        })
        .await,
        ["t4", "t3", "t2", "t1", "t0"]
    );
    assert_eq!(
        by(ListingFilter {
            owner: Some(b.clone()),
            ..Default::default()
        })
        .await,
        ["t9", "t7", "t5", "t3", "t1"]
    );
    assert_eq!(
        by(ListingFilter {
            owner: Some(b.clone()),
            status: Some(ListedStatus::Working),
            ..Default::default()
        })
        .await,
        ["t9", "t7", "t1"]
    );
    assert_eq!(
        by(ListingFilter {
            created_from: Some(minute + 2),
            created_to: Some(minute + 5),
            ..Default::default()
        })
        .await,
        ["t4", "t3", "t2"]
    );
    assert_eq!(
        by(ListingFilter::default().with_text("T3 IS INPUT")).await,
        ["t3"]
    );
    // The budget: two entries of the tool index looked at, none kept, the cursor goes on.
    let failed = ListingFilter {
        tool: Some("y".into()),
        status: Some(ListedStatus::Failed),
        ..Default::default()
    };
    let page = store.listing(&failed, None, 1, 2).await.unwrap();
    assert!(page.budget_spent && page.tasks.is_empty(), "{page:?}");
    let page = store.listing(&failed, page.next, 10, 1000).await.unwrap();
    assert_eq!(ids(&page), ["t5"]);

    let mut counts: Vec<(String, String, ListedStatus, u64)> = store
        .listing_counts()
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.owner, c.tool, c.status, c.tasks))
        .collect();
    counts.sort();
    let mut expected = vec![
        (a.clone(), "x".to_owned(), ListedStatus::Working, 2),
        (a.clone(), "x".to_owned(), ListedStatus::Completed, 1),
        (a.clone(), "y".to_owned(), ListedStatus::Working, 1),
        (b.clone(), "x".to_owned(), ListedStatus::Working, 1),
        (b.clone(), "x".to_owned(), ListedStatus::InputRequired, 1),
        (b.clone(), "y".to_owned(), ListedStatus::Working, 2),
        (b.clone(), "y".to_owned(), ListedStatus::Failed, 1),
    ];
    expected.sort();
    assert_eq!(counts, expected);
    let buckets: Vec<(u64, ThroughputKind, u64)> = store
        .throughput(0)
        .await
        .unwrap()
        .into_iter()
        .map(|b| (b.minute_ms, b.kind, b.count))
        .collect();
    assert_eq!(
        buckets,
        vec![
            (minute, ThroughputKind::Created, 10),
            (minute + 60_000, ThroughputKind::Completed, 1),
            (minute + 60_000, ThroughputKind::Failed, 1),
        ]
    );
    assert!(store.throughput(minute + 60_000).await.unwrap().len() == 2);
    // Buckets older than a day go when a new minute's first count comes.
    let later = minute + crate::listing::THROUGHPUT_RETENTION_MS + 120_000;
    store
        .commit(vec![listed(
            "t10",
            &a,
            later,
            ListedStatus::Working,
            "x",
            later,
        )])
        .await
        .unwrap();
    let buckets = store.throughput(0).await.unwrap();
    assert_eq!(buckets.len(), 1, "{buckets:?}");
    store.close().await;
}

/// What a store's counters hold: the listing counters, the throughput buckets and the usage
/// of every owner, each in its table's order.
pub(super) async fn counters_of(
    store: &RedbStore,
) -> (
    Vec<crate::listing::ListingCount>,
    Vec<crate::listing::ThroughputBucket>,
    Vec<(String, crate::Usage)>,
) {
    (
        store.listing_counts().await.unwrap(),
        store.throughput(0).await.unwrap(),
        store.usage_by_owner().await.unwrap(),
    )
}

/// The counters a group commit keeps in memory and writes once are what the same writes
/// leave one commit each: a task created and finished in one batch, a task finished and
/// deleted, a counter that goes up and back down, a minute a day later that drops the old
/// buckets while a bucket of an old minute is counted in the same batch, between two first
/// counts of a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_of_one_batch_are_those_of_one_commit_per_write() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (crate::owner_key("t", "a"), crate::owner_key("t", "b"));
    let minute = 10 * 60_000;
    let later = minute + crate::listing::THROUGHPUT_RETENTION_MS + 120_000;
    let before = vec![
        listed("t0", &a, minute, ListedStatus::Working, "x", minute),
        listed("t1", &b, minute + 1, ListedStatus::Working, "y", minute + 1),
        listed("t2", &a, minute + 2, ListedStatus::Working, "x", minute + 2),
    ];
    let batch = vec![
        listed("t3", &a, minute + 3, ListedStatus::Working, "x", minute + 3),
        listed(
            "t3",
            &a,
            minute + 3,
            ListedStatus::Completed,
            "x",
            minute + 4,
        ),
        listed("t0", &a, minute, ListedStatus::Failed, "x", minute + 5),
        WriteOp::Delete { id: "t0".into() },
        listed(
            "t2",
            &a,
            minute + 2,
            ListedStatus::InputRequired,
            "x",
            minute + 6,
        ),
        listed("t2", &a, minute + 2, ListedStatus::Working, "x", minute + 7),
        listed("t4", &b, later, ListedStatus::Working, "y", later),
        listed(
            "t1",
            &b,
            minute + 1,
            ListedStatus::Completed,
            "y",
            minute + 8,
        ),
        listed("t5", &b, later + 1, ListedStatus::Cancelled, "z", later + 1),
    ];
    let one_by_one = open(&dir.path().join("one.redb")).await;
    for op in before.iter().chain(&batch) {
        one_by_one.commit(vec![op.clone()]).await.unwrap();
    }
    let batched = open(&dir.path().join("batch.redb")).await;
    batched.commit(before.clone()).await.unwrap();
    batched.commit(batch.clone()).await.unwrap();
    let expected = counters_of(&one_by_one).await;
    assert_eq!(counters_of(&batched).await, expected);
    // The day-old buckets went in both (the old minute counted after the first drop went
    // again with the next minute's first count).
    assert!(
        expected.1.iter().all(
            |b| b.minute_ms >= later - crate::listing::THROUGHPUT_RETENTION_MS
                || b.minute_ms == minute
        ),
        "{:?}",
        expected.1
    );
    assert!(
        expected
            .0
            .iter()
            .any(|c| c.status == ListedStatus::Working && c.tasks == 1)
    );
    one_by_one.close().await;
    batched.close().await;
    // And as the file holds them after a reopen.
    let reopened = open(&dir.path().join("batch.redb")).await;
    assert_eq!(counters_of(&reopened).await, expected);
    reopened.close().await;
}
