//! What a commit writes to a redb store, page by page: `cargo bench --bench pages`.
//!
//! The store runs on an in-memory backend that counts redb's writes (one per 4 KiB page, plus
//! the 320-byte header) and its syncs, so the figures are exact and the same on every machine:
//! no disk, no timing. A store of `--stored` finished tasks (default 5,000, one owner, ids as
//! `TaskId::generate` issues them, sorted by creation time; `--random-ids` for ids in random
//! order, as earlier versions issued them) takes, in one commit each, `--tasks` creations of
//! `sleep_task` (a live record with its owner entry, listing and due time), then their
//! completions; and, to say where the pages go, the same creations with parts of the put left
//! out (no listing; no owner entry either; no due time; not live). A commit's fsync costs with
//! the pages it flushes (docs/BENCHMARKS.md, "What each part of a commit writes"). Nothing here
//! asserts anything.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use mcp_tasks::internals::persist;
use mcp_tasks::internals::task::{Event, Owner, TaskId, TaskOutcome, TaskRecord, apply};
use mcp_tasks::store::{Durability, Expect, RedbStore, StoreOptions, WriteOp};
use redb::StorageBackend;
use serde_json::json;

const USAGE: &str = "usage: cargo bench --bench pages -- [--stored N] [--tasks N] [--random-ids]";

/// redb's in-memory backend, counting writes and bytes.
#[derive(Debug, Clone)]
struct Counting {
    inner: Arc<redb::backends::InMemoryBackend>,
    writes: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    syncs: Arc<AtomicU64>,
}

impl StorageBackend for Counting {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.inner.write(offset, data)
    }
}

fn number(name: &str, value: Option<String>) -> usize {
    match value.as_deref().map(str::parse::<usize>) {
        Some(Ok(n)) if n > 0 => n,
        _ => {
            eprintln!("{name} needs a positive integer\n{USAGE}");
            std::process::exit(2);
        }
    }
}

/// Which parts of a creation's put are written.
#[derive(Clone, Copy)]
struct Parts {
    owner: bool,
    listing: bool,
    due: bool,
    live: bool,
}

const ALL: Parts = Parts {
    owner: true,
    listing: true,
    due: true,
    live: true,
};

/// The put the runtime sends for `record`, with `parts` of it.
fn put(record: &TaskRecord, parts: Parts, expect: Expect) -> WriteOp {
    let live = !record.status.is_terminal();
    WriteOp::Put {
        id: record.id.as_str().to_owned(),
        bytes: persist::encode(record).expect("encode"),
        constant_tail: 0,
        live: live && parts.live,
        due_ms: parts.due.then_some(record.created_at_ms + 86_400_000),
        seq: Some(record.seq),
        expect,
        owner: parts.owner.then(|| mcp_tasks::store::OwnerEntry {
            owner: mcp_tasks::store::owner_key(&record.owner.tenant, &record.owner.principal),
            created_ms: record.created_at_ms,
        }),
        listing: (parts.owner && parts.listing).then(|| mcp_tasks::internals::listing_of(record)),
    }
}

/// Ids in random key order: a random 48-bit time prefix (xorshift, fixed seed).
struct RandomIds(u64);

impl RandomIds {
    fn next(&mut self) -> TaskId {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        TaskId::at(self.0 & 0xffff_ffff_ffff)
    }
}

/// The next id: as the runtime issues them, or in random order.
fn next_id(random: &mut Option<RandomIds>) -> TaskId {
    random
        .as_mut()
        .map_or_else(TaskId::generate, RandomIds::next)
}

fn created(id: TaskId, now: u64) -> TaskRecord {
    TaskRecord::new(
        id,
        Owner::anonymous(),
        "sleep_task".into(),
        json!({ "ms": 0 }),
        json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } }),
        now,
        Some(900_000),
        Some(1000),
        None,
    )
}

fn finished(record: &TaskRecord, now: u64) -> TaskRecord {
    let result = json!({ "content": [{ "type": "text", "text": "Slept 0 ms." }] });
    apply(record, Event::Finish(TaskOutcome::Result(result)), now)
        .expect("finish")
        .expect("a change")
}

fn main() {
    let (mut stored, mut tasks) = (5_000usize, 1usize);
    let mut random = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--bench" => {}
            "--stored" => stored = number("--stored", args.next()),
            "--tasks" => tasks = number("--tasks", args.next()),
            "--random-ids" => random = Some(RandomIds(0x9e37_79b9_7f4a_7c15)),
            other => {
                eprintln!("unknown argument {other:?}\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    let counting = Counting {
        inner: Arc::new(redb::backends::InMemoryBackend::new()),
        writes: Arc::default(),
        bytes: Arc::default(),
        syncs: Arc::default(),
    };
    let backend = counting.clone();
    let store = RedbStore::open_with_backend(
        std::path::Path::new("pages"),
        Arc::new(move || Ok(Box::new(backend.clone()) as Box<dyn StorageBackend>)),
        StoreOptions {
            durability: Durability::Immediate,
            ..StoreOptions::default()
        },
    )
    .expect("opening the store");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let now = 1_780_000_000_000u64;
    rt.block_on(async {
        let mut batch = Vec::new();
        for i in 0..stored {
            let done = finished(&created(next_id(&mut random), now + i as u64), now + i as u64 + 1);
            batch.push(put(&done, ALL, Expect::Any));
            if batch.len() == 1000 || i + 1 == stored {
                store
                    .commit(std::mem::take(&mut batch))
                    .await
                    .expect("fill");
            }
        }
        // One commit of `ops`: (writes, KiB, syncs).
        let measure = async |ops: Vec<WriteOp>| {
            let before = (
                counting.writes.load(Ordering::Relaxed),
                counting.bytes.load(Ordering::Relaxed),
                counting.syncs.load(Ordering::Relaxed),
            );
            store.commit(ops).await.expect("commit");
            (
                counting.writes.load(Ordering::Relaxed) - before.0,
                (counting.bytes.load(Ordering::Relaxed) - before.1) as f64 / 1024.0,
                counting.syncs.load(Ordering::Relaxed) - before.2,
            )
        };
        println!(
            "# redb pages written per commit: {stored} finished tasks stored, {tasks} task(s) per commit, ids {}\n",
            if random.is_some() { "in random order" } else { "sorted by creation time" }
        );
        println!("| commit | writes (pages + header) | KiB | syncs |");
        println!("|---|---:|---:|---:|");
        let t = now + stored as u64 + 10;
        let records: Vec<TaskRecord> = (0..tasks)
            .map(|_| created(next_id(&mut random), t))
            .collect();
        let row = |name: &str, (writes, kib, syncs): (u64, f64, u64)| {
            println!("| {name} | {writes} | {kib:.1} | {syncs} |");
        };
        let creation = measure(
            records
                .iter()
                .map(|r| put(r, ALL, Expect::Absent))
                .collect(),
        )
        .await;
        row("creation (as the runtime writes it)", creation);
        let completion = measure(
            records
                .iter()
                .map(|r| {
                    let done = finished(r, t + 1);
                    put(&done, ALL, Expect::Seq(r.seq))
                })
                .collect(),
        )
        .await;
        row("completion", completion);
        for (name, parts) in [
            (
                "creation without the listing",
                Parts {
                    listing: false,
                    ..ALL
                },
            ),
            (
                "creation without the listing and the owner entry",
                Parts {
                    listing: false,
                    owner: false,
                    ..ALL
                },
            ),
            (
                "creation of the record and its live entry only",
                Parts {
                    listing: false,
                    owner: false,
                    due: false,
                    ..ALL
                },
            ),
            (
                "creation of the record only",
                Parts {
                    listing: false,
                    owner: false,
                    due: false,
                    live: false,
                },
            ),
        ] {
            let fresh: Vec<WriteOp> = (0..tasks)
                .map(|_| put(&created(next_id(&mut random), t), parts, Expect::Absent))
                .collect();
            row(name, measure(fresh).await);
        }
        let meta = measure(vec![WriteOp::PutMeta {
            key: "pages-bench".into(),
            value: vec![1],
        }])
        .await;
        row("one meta key (a commit's own cost)", meta);
    });
    rt.block_on(store.close());
}
