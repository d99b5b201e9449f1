//! Files of older table layouts, converted by the first writable open (or refused).

use super::listing::{counters_of, listed};
use super::*;

/// One task of a layout-1 file: (id, snapshot bytes, seq, live, due_ms).
type V1Row<'a> = (&'a str, &'a [u8], Option<u64>, bool, Option<u64>);

/// Writes a layout-1 store with raw redb exactly as the layout-1 code wrote it: bare
/// snapshots in `tasks`, `seq`, `live`, `due`, `due_by_id`, `meta` (boot epoch 3). `version`:
/// the recorded `schema_version` (`None`: a file from before the key). `with_seq`: `false`
/// for a file from before sequence numbers were kept (no `seq` table). `orphan_due`: a
/// `due`/`due_by_id` pair naming an id that is not stored.
fn write_layout1(
    path: &Path,
    rows: &[V1Row<'_>],
    version: Option<u64>,
    with_seq: bool,
    orphan_due: Option<(&str, u64)>,
) {
    let db = redb::Database::create(path).unwrap();
    let w = db.begin_write().unwrap();
    {
        let mut tasks = w.open_table(TASKS).unwrap();
        let mut live = w.open_table(LIVE).unwrap();
        let mut due = w.open_table(DUE).unwrap();
        let mut due_by_id = w.open_table(V1_DUE_BY_ID).unwrap();
        let mut meta = w.open_table(META).unwrap();
        for &(id, bytes, _, is_live, due_ms) in rows {
            tasks.insert(id, bytes).unwrap();
            if is_live {
                live.insert(id, ()).unwrap();
            }
            if let Some(at) = due_ms {
                due.insert((at, id), ()).unwrap();
                due_by_id.insert(id, at).unwrap();
            }
        }
        if let Some((id, at)) = orphan_due {
            due.insert((at, id), ()).unwrap();
            due_by_id.insert(id, at).unwrap();
        }
        if with_seq {
            let mut seqs = w.open_table(V1_SEQ).unwrap();
            for &(id, _, seq, _, _) in rows {
                if let Some(seq) = seq {
                    seqs.insert(id, seq).unwrap();
                }
            }
        }
        meta.insert(META_BOOT_EPOCH, 3u64.to_le_bytes().as_slice())
            .unwrap();
        if let Some(v) = version {
            meta.insert(META_SCHEMA_VERSION, v.to_le_bytes().as_slice())
                .unwrap();
        }
    }
    w.commit().unwrap();
}

/// A layout-1 file is converted by the first open, in one transaction, and then reads,
/// lists, expires and takes conditional writes like a store created by this build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_1_store_is_converted_on_open() {
    let rows: [V1Row<'_>; 4] = [
        ("a", b"snapshot a", Some(7), true, Some(100)),
        ("b", b"snapshot b", Some(2), false, Some(50)),
        // Stored before sequence numbers were kept.
        ("c", b"snapshot c", None, true, None),
        ("d", b"", Some(1), false, None),
    ];
    for (version, with_seq) in [(Some(1), true), (None, true), (None, false)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.redb");
        write_layout1(&path, &rows, version, with_seq, Some(("gone", 10)));
        // A failed conversion leaves layout 1 whole: the conversion writes nothing outside
        // the caller's transaction.
        {
            let db = redb::Database::open(&path).unwrap();
            let w = db.begin_write().unwrap();
            assert_eq!(
                super::super::layout::upgrade_layout(&w, &TestIndexer).unwrap(),
                Some(4)
            );
            w.abort().unwrap();
        }
        assert!(table_names(&path).contains(&"due_by_id".to_owned()));

        let store = open(&path).await;
        assert_eq!(store.boot_epoch(), 4, "the boot epoch carries over");
        assert_eq!(
            store.meta_get(META_SCHEMA_VERSION).await.unwrap(),
            Some(SCHEMA_VERSION.to_le_bytes().to_vec())
        );
        // Reads.
        for &(id, bytes, ..) in &rows {
            assert_eq!(store.get(id).await.unwrap().as_deref(), Some(bytes), "{id}");
        }
        assert_eq!(
            store.get_many(vec!["b".into(), "x".into()]).await.unwrap(),
            vec![Some(b"snapshot b".to_vec()), None]
        );
        assert_eq!(store.counts().await.unwrap(), (4, 2));
        let live: Vec<String> = store
            .live()
            .await
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(live, vec!["a", "c"]);
        assert_eq!(store.tasks().await.unwrap().len(), 4);
        // Expiry: the orphaned due entry of a task that is not stored is gone.
        assert_eq!(store.next_due().await.unwrap(), Some(50));
        assert_eq!(store.due(1000, 10).await.unwrap(), vec!["b", "a"]);
        // The reaper's quarantine (SetDue None) removes a due entry.
        store
            .commit(vec![WriteOp::SetDue {
                id: "b".into(),
                due_ms: None,
            }])
            .await
            .unwrap();
        assert_eq!(store.due(1000, 10).await.unwrap(), vec!["a"]);
        assert_eq!(store.get("b").await.unwrap().unwrap(), b"snapshot b");

        // Conditional writes: the sequence numbers came over (a file from before they were
        // kept accepts one conditional write per task, which records the number).
        if !with_seq {
            store
                .commit(vec![cas("a", b"a7", 7, Expect::Seq(6))])
                .await
                .unwrap();
        }
        let err = store
            .commit(vec![cas("a", b"stale", 7, Expect::Seq(6))])
            .await
            .unwrap_err();
        assert!(
            matches!(
                &err,
                StoreError::Conflict { id, expected: Some(6), found: Some(7) } if id == "a"
            ),
            "{err:?}"
        );
        let err = store
            .commit(vec![cas("d", b"again", 1, Expect::Absent)])
            .await
            .unwrap_err();
        let found = if with_seq { Some(1) } else { None };
        assert!(
            matches!(&err, StoreError::Conflict { expected: None, found: f, .. } if *f == found),
            "{err:?}"
        );
        store
            .commit(vec![cas("a", b"a8", 8, Expect::Seq(7))])
            .await
            .unwrap();
        assert_eq!(store.get("a").await.unwrap().unwrap(), b"a8");
        // The conditional put kept `a` live and replaced its due entry (`cas` has none).
        assert_eq!(store.counts().await.unwrap(), (4, 2));
        assert!(store.due(1000, 10).await.unwrap().is_empty());
        // A task stored without a sequence number accepts one conditional write, then has
        // its number.
        store
            .commit(vec![cas("c", b"c5", 5, Expect::Seq(4))])
            .await
            .unwrap();
        let err = store
            .commit(vec![cas("c", b"stale", 5, Expect::Seq(4))])
            .await
            .unwrap_err();
        assert!(
            matches!(
                &err,
                StoreError::Conflict {
                    expected: Some(4),
                    found: Some(5),
                    ..
                }
            ),
            "{err:?}"
        );
        store.close().await;

        // The current layout on disk: `seq` and `due_by_id` are gone, and a second open
        // converts nothing (the data is as it was left).
        assert_eq!(table_names(&path), LAYOUT_TABLES.to_vec());
        {
            let db = redb::Database::open(&path).unwrap();
            let w = db.begin_write().unwrap();
            assert_eq!(
                super::super::layout::upgrade_layout(&w, &TestIndexer).unwrap(),
                None
            );
            w.abort().unwrap();
        }
        let store = open(&path).await;
        assert_eq!(store.boot_epoch(), 5);
        assert_eq!(store.get("a").await.unwrap().unwrap(), b"a8");
        assert_eq!(store.get("c").await.unwrap().unwrap(), b"c5");
        assert_eq!(store.get("d").await.unwrap().unwrap(), b"");
        store
            .commit(vec![cas("a", b"a9", 9, Expect::Seq(8))])
            .await
            .unwrap();
        store.close().await;
    }
}

/// A layout newer than this build's is refused without change, before anything is written.
#[test]
fn a_newer_layout_is_refused_by_the_conversion() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v3.redb");
    write_layout1(&path, &[], Some(SCHEMA_VERSION + 1), true, None);
    let before = std::fs::read(&path).unwrap();
    let err = RedbStore::open(&path, opts()).unwrap_err();
    assert!(
        matches!(err, StoreError::SchemaTooNew { found, .. } if found == (SCHEMA_VERSION + 1) as i64),
        "{err:?}"
    );
    assert!(std::fs::read(&path).unwrap() == before, "the file changed");
}

/// Writes a store of layout 2 at `path` (records without an owner in their header, no owner
/// index): six tasks of `acme` (alice and bob in turn) and one record that does not decode.
/// Returns the six snapshots.
fn write_layout2(path: &Path) -> Vec<Vec<u8>> {
    let mut snapshots = Vec::new();
    let db = redb::Database::create(path).unwrap();
    let w = db.begin_write().unwrap();
    {
        let mut tasks = w.open_table(TASKS).unwrap();
        let mut live = w.open_table(LIVE).unwrap();
        w.open_table(DUE).unwrap();
        let mut meta = w.open_table(META).unwrap();
        for n in 0..6u32 {
            let principal = if n % 2 == 0 { "alice" } else { "bob" };
            let bytes = task_snapshot(&task_id(n), "acme", principal, 500 - u64::from(n), 1000);
            // Exactly the layout-2 header: seq and due, no owner.
            let mut value = vec![1u8];
            value.extend_from_slice(&1u64.to_le_bytes());
            value.extend_from_slice(&0u64.to_le_bytes());
            value.extend_from_slice(&bytes);
            tasks.insert(task_id(n).as_str(), value.as_slice()).unwrap();
            live.insert(task_id(n).as_str(), ()).unwrap();
            snapshots.push(bytes);
        }
        // A record whose snapshot does not decode stays, in nobody's index.
        let mut value = vec![0u8];
        value.extend_from_slice(&[0; 16]);
        value.extend_from_slice(b"garbage");
        tasks
            .insert(task_id(99).as_str(), value.as_slice())
            .unwrap();
        meta.insert(META_BOOT_EPOCH, 3u64.to_le_bytes().as_slice())
            .unwrap();
        meta.insert(META_SCHEMA_VERSION, 2u64.to_le_bytes().as_slice())
            .unwrap();
    }
    w.commit().unwrap();
    snapshots
}

/// A store of layout 2 opened without an indexer is refused, and left as it was: its
/// conversion would have to read its records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_layout_opened_without_an_indexer_is_refused_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v2.redb");
    write_layout2(&path);
    let options = StoreOptions {
        durability: Durability::None,
        ..StoreOptions::default()
    };
    let err = RedbStore::open_async(path.clone(), options)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::NeedsIndexer { what, .. } if what == "table layout 2"),
        "{err:?}"
    );
    assert!(err.to_string().contains("nothing was changed"), "{err}");
    assert_eq!(table_names(&path), vec!["due", "live", "meta", "tasks"]);
    // With one, it converts.
    open(&path).await.close().await;
    assert_eq!(table_names(&path), LAYOUT_TABLES.to_vec());
}

/// A store of layout 2 (records without an owner in their header, no owner index) is
/// converted by the first writable open: each record's owner and creation time are read
/// from its snapshot, the index and the usage are built, and the records read as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_2_store_gets_its_owner_index_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v2.redb");
    let snapshots = write_layout2(&path);
    assert_eq!(table_names(&path), vec!["due", "live", "meta", "tasks"]);
    let store = open(&path).await;
    assert_eq!(
        store.meta_get(META_SCHEMA_VERSION).await.unwrap(),
        Some(SCHEMA_VERSION.to_le_bytes().to_vec())
    );
    for n in 0..6u32 {
        assert_eq!(
            store.get(&task_id(n)).await.unwrap().as_deref(),
            Some(snapshots[n as usize].as_slice())
        );
    }
    let alice = store
        .owned(&crate::owner_key("acme", "alice"), None, 100)
        .await
        .unwrap();
    // Oldest first: task 4 was created at 496, task 2 at 498, task 0 at 500.
    let ids: Vec<String> = alice.iter().map(|r| r.id.clone()).collect();
    assert_eq!(ids, vec![task_id(4), task_id(2), task_id(0)]);
    let usage = store.usage(&crate::owner_key("acme", "bob")).await.unwrap();
    assert_eq!(usage.tasks, 3);
    assert!(usage.bytes > 3 * 1000, "{usage:?}");
    assert_eq!(store.usage_by_owner().await.unwrap().len(), 2);
    assert_eq!(store.counts().await.unwrap(), (7, 6));
    // … and the listing index (layout 4), from the same snapshots: newest first, the
    // undecodable record in none of it.
    let page = store
        .listing(&ListingFilter::default(), None, 100, 1000)
        .await
        .unwrap();
    let ids: Vec<String> = page.tasks.iter().map(|t| t.id.clone()).collect();
    assert_eq!(ids, (0..6).map(task_id).collect::<Vec<_>>());
    let counts = store.listing_counts().await.unwrap();
    assert_eq!(counts.iter().map(|c| c.tasks).sum::<u64>(), 6);
    assert!(
        counts
            .iter()
            .all(|c| c.status == ListedStatus::Working && c.tool == "echo")
    );
    store.close().await;
    assert_eq!(table_names(&path), LAYOUT_TABLES.to_vec());
}

/// A store of layout 4 (the listing in four tables) is converted by the first writable open:
/// the same entries, counters and buckets in layout 5's two tables, the old tables gone, and
/// the listing, the counters and the throughput read as before the conversion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_4_store_keeps_its_listing_in_layout_5() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v4.redb");
    let (a, b) = (crate::owner_key("t", "a"), crate::owner_key("t", "b"));
    let minute = 10 * 60_000;
    let store = open(&path).await;
    for n in 0..8u64 {
        let owner = if n % 2 == 0 { &a } else { &b };
        let (status, tool) = match n % 4 {
            0 => (ListedStatus::Working, "x"),
            1 => (ListedStatus::Completed, "y"),
            2 => (ListedStatus::InputRequired, "x"),
            _ => (ListedStatus::Failed, "z"),
        };
        let id = format!("t{n}");
        store
            .commit(vec![listed(
                &id,
                owner,
                minute + n,
                ListedStatus::Working,
                tool,
                minute + n,
            )])
            .await
            .unwrap();
        store
            .commit(vec![listed(
                &id,
                owner,
                minute + n,
                status,
                tool,
                minute + 60_000 + n,
            )])
            .await
            .unwrap();
    }
    let filters = [
        ListingFilter::default(),
        ListingFilter {
            status: Some(ListedStatus::Working),
            ..Default::default()
        },
        ListingFilter {
            tool: Some("x".into()),
            ..Default::default()
        },
        ListingFilter {
            owner: Some(b.clone()),
            ..Default::default()
        },
    ];
    let mut pages = Vec::new();
    for f in &filters {
        pages.push(store.listing(f, None, 100, 1000).await.unwrap());
    }
    let counters = counters_of(&store).await;
    assert_eq!(counters.1.len(), 3, "{:?}", counters.1);
    store.close().await;

    // The same entries as layout 4 kept them.
    {
        let db = redb::Database::open(&path).unwrap();
        let w = db.begin_write().unwrap();
        {
            let index = w.open_table(schema::LISTING_INDEX).unwrap();
            let counts = w.open_table(schema::LISTING_COUNTERS).unwrap();
            let mut listing = w.open_table(schema::V4_LISTING).unwrap();
            let mut by = w.open_table(schema::V4_LISTING_BY).unwrap();
            let mut old_counts = w.open_table(schema::V4_LISTING_COUNTS).unwrap();
            let mut throughput = w.open_table(schema::V4_THROUGHPUT).unwrap();
            for e in index.iter().unwrap() {
                let (k, v) = e.unwrap();
                let (i, value, created_ms, id) = k.value();
                match i {
                    schema::BY_CREATED => {
                        listing.insert((created_ms, id), v.value()).unwrap();
                    }
                    schema::BY_STATUS => {
                        by.insert((schema::V4_BY_STATUS, value, created_ms, id), ())
                            .unwrap();
                    }
                    _ => {
                        by.insert((schema::V4_BY_TOOL, value, created_ms, id), ())
                            .unwrap();
                    }
                }
            }
            for e in counts.iter().unwrap() {
                let (k, v) = e.unwrap();
                let (kind, owner, tool, minute, code) = k.value();
                if kind == schema::COUNT_TASKS {
                    old_counts.insert((owner, tool, code), v.value()).unwrap();
                } else {
                    throughput.insert((minute, code), v.value()).unwrap();
                }
            }
        }
        w.delete_table(schema::LISTING_INDEX).unwrap();
        w.delete_table(schema::LISTING_COUNTERS).unwrap();
        w.open_table(META)
            .unwrap()
            .insert(META_SCHEMA_VERSION, 4u64.to_le_bytes().as_slice())
            .unwrap();
        w.commit().unwrap();
    }
    assert_eq!(
        table_names(&path),
        [
            "due",
            "listing",
            "listing_by",
            "listing_counts",
            "live",
            "meta",
            "owners",
            // Made by this build, which creates it; layout 4 had none.
            "tails",
            "tasks",
            "throughput",
            "usage"
        ]
    );

    let store = open(&path).await;
    assert_eq!(
        store.meta_get(META_SCHEMA_VERSION).await.unwrap(),
        Some(SCHEMA_VERSION.to_le_bytes().to_vec())
    );
    for (f, page) in filters.iter().zip(&pages) {
        assert_eq!(
            &store.listing(f, None, 100, 1000).await.unwrap(),
            page,
            "{f:?}"
        );
    }
    assert_eq!(counters_of(&store).await, counters);
    // And the converted index goes on following writes.
    store
        .commit(vec![WriteOp::Delete { id: "t0".into() }])
        .await
        .unwrap();
    let all = store
        .listing(&ListingFilter::default(), None, 100, 1000)
        .await
        .unwrap();
    assert_eq!(all.tasks.len(), 7);
    store.close().await;
    assert_eq!(table_names(&path), LAYOUT_TABLES.to_vec());
}
