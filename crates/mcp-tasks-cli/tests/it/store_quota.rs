//! One principal's stored tasks cannot cost another principal work, memory or disk, over
//! real HTTP on 127.0.0.1:
//!
//! - the legacy `tasks/list` reads the caller's records only, through the store's owner
//!   index, one page at a time (proved by a store wrapper that counts every record the
//!   runtime reads, not by timing), and each page is bounded in record bytes as well as in
//!   count;
//! - the disk quota (`Quotas::max_stored_bytes`) counts finished tasks until the reaper
//!   deletes them, refuses with `429` / `-32010` naming the limit, and frees the bytes when
//!   they are purged;
//! - against the served binary, the review's reproductions of defects 1 (legacy sessions
//!   following live tasks, abandoned `tasks/result`) and 3 (large finished tasks) are
//!   refused by `--max-sessions` and `--max-stored-bytes`, and the victim's latency, the
//!   server's peak RSS and the store file stay within fixed bounds.

use crate::support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use mcp_tasks::auth::{self, Identity};
use mcp_tasks::quota::Quotas;
use mcp_tasks::store::listing::{
    ListingCount, ListingCursor, ListingFilter, ListingPage, ThroughputBucket,
};
use mcp_tasks::store::{
    Durability, Index, OwnedCursor, OwnedRecord, RedbStore, Store, StoreFuture, StoreOptions,
    StoreStats, TaskStore, Usage, WriteOp,
};
use mcp_tasks::tool::{CallToolResult, TaskPolicy, Tool, ToolDescriptor, tool_fn};
use mcp_tasks::transport::http::{self, HttpConfig};
use mcp_tasks::{Owner, Runtime};
use serde_json::{Value, json};
use support::legacy::Client;
use support::{post, request};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Every record the runtime reads from the store, counted: calls of the whole-store read,
/// and records (with their bytes) handed out by every other read.
#[derive(Default)]
struct Reads {
    whole_store: AtomicU64,
    records: AtomicU64,
    bytes: AtomicU64,
}

impl Reads {
    fn count(&self, bytes: usize) {
        self.records.fetch_add(1, Ordering::SeqCst);
        self.bytes.fetch_add(bytes as u64, Ordering::SeqCst);
    }

    fn snapshot(&self) -> (u64, u64, u64) {
        (
            self.whole_store.load(Ordering::SeqCst),
            self.records.load(Ordering::SeqCst),
            self.bytes.load(Ordering::SeqCst),
        )
    }
}

/// A redb store that counts what is read from it.
struct Counting {
    inner: RedbStore,
    reads: Arc<Reads>,
}

impl TaskStore for Counting {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn boot_epoch(&self) -> u64 {
        TaskStore::boot_epoch(&self.inner)
    }
    fn commit(&self, ops: Vec<WriteOp>) -> StoreFuture<'_, ()> {
        TaskStore::commit(&self.inner, ops)
    }
    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Vec<u8>>> {
        Box::pin(async move {
            let got = TaskStore::get(&self.inner, id).await?;
            if let Some(b) = &got {
                self.reads.count(b.len());
            }
            Ok(got)
        })
    }
    fn get_many(&self, ids: Vec<String>) -> StoreFuture<'_, Vec<Option<Vec<u8>>>> {
        Box::pin(async move {
            let got = TaskStore::get_many(&self.inner, ids).await?;
            for b in got.iter().flatten() {
                self.reads.count(b.len());
            }
            Ok(got)
        })
    }
    fn live(&self) -> StoreFuture<'_, Vec<(String, Vec<u8>)>> {
        Box::pin(async move {
            let got = TaskStore::live(&self.inner).await?;
            for (_, b) in &got {
                self.reads.count(b.len());
            }
            Ok(got)
        })
    }
    fn due(&self, now_ms: u64, limit: usize) -> StoreFuture<'_, Vec<String>> {
        TaskStore::due(&self.inner, now_ms, limit)
    }
    fn next_due(&self) -> StoreFuture<'_, Option<u64>> {
        TaskStore::next_due(&self.inner)
    }
    fn meta_get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Vec<u8>>> {
        TaskStore::meta_get(&self.inner, key)
    }
    fn tasks(&self) -> StoreFuture<'_, Vec<(String, Vec<u8>)>> {
        self.reads.whole_store.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            let got = TaskStore::tasks(&self.inner).await?;
            for (_, b) in &got {
                self.reads.count(b.len());
            }
            Ok(got)
        })
    }
    fn counts(&self) -> StoreFuture<'_, (u64, u64)> {
        TaskStore::counts(&self.inner)
    }
    fn index(&self) -> Option<&dyn Index> {
        Some(self)
    }
    fn stats(&self) -> StoreStats {
        TaskStore::stats(&self.inner)
    }
    fn is_closed(&self) -> bool {
        TaskStore::is_closed(&self.inner)
    }
    fn halted(&self) -> Option<String> {
        TaskStore::halted(&self.inner)
    }
    fn wait_halted(&self) -> BoxFuture<'_, String> {
        TaskStore::wait_halted(&self.inner)
    }
    fn unavailable(&self) -> Option<String> {
        TaskStore::unavailable(&self.inner)
    }
    fn close(&self) -> BoxFuture<'_, ()> {
        TaskStore::close(&self.inner)
    }
}

/// Its indexes are the redb store's; only the records of owner pages are counted.
impl Index for Counting {
    fn owned<'a>(
        &'a self,
        owner: &'a str,
        after: Option<OwnedCursor>,
        limit: usize,
    ) -> StoreFuture<'a, Vec<OwnedRecord>> {
        Box::pin(async move {
            let got = Index::owned(&self.inner, owner, after, limit).await?;
            for r in &got {
                self.reads.count(r.bytes.len());
            }
            Ok(got)
        })
    }
    fn usage<'a>(&'a self, owner: &'a str) -> StoreFuture<'a, Usage> {
        Index::usage(&self.inner, owner)
    }
    fn usage_by_owner(&self) -> StoreFuture<'_, Vec<(String, Usage)>> {
        Index::usage_by_owner(&self.inner)
    }
    fn listing<'a>(
        &'a self,
        filter: &'a ListingFilter,
        after: Option<ListingCursor>,
        limit: usize,
        budget: usize,
    ) -> StoreFuture<'a, ListingPage> {
        Index::listing(&self.inner, filter, after, limit, budget)
    }
    fn listing_counts(&self) -> StoreFuture<'_, Vec<ListingCount>> {
        Index::listing_counts(&self.inner)
    }
    fn throughput(&self, since_ms: u64) -> StoreFuture<'_, Vec<ThroughputBucket>> {
        Index::throughput(&self.inner, since_ms)
    }
}

/// A task tool that finishes at once (its record keeps the arguments until it is deleted).
fn instant() -> Arc<dyn Tool> {
    tool_fn(
        ToolDescriptor::new("keep", "finishes at once").task_policy(TaskPolicy::Always),
        |_ctx, _| async move { Ok(CallToolResult::text("kept")) },
    )
}

/// The bearer token is the principal's name (tenant `t`).
fn by_token() -> Arc<dyn auth::Authenticator> {
    auth::from_fn(|parts| {
        let token = auth::bearer_token(&parts.headers)
            .ok()
            .flatten()
            .map(str::to_owned);
        async move {
            match token {
                Some(name) => Ok(Identity::new(Owner::new("t", name))),
                None => Err(auth::AuthError::Missing),
            }
        }
    })
}

struct Server {
    addr: SocketAddr,
    rt: Runtime,
    stop: oneshot::Sender<()>,
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
    reads: Arc<Reads>,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start(quotas: Quotas, retention: Option<Duration>) -> Server {
        Self::start_on(quotas, retention, true).await
    }

    /// `counting`: through the [`Counting`] wrapper (else the plain redb store, which has
    /// an admin socket).
    async fn start_on(quotas: Quotas, retention: Option<Duration>, counting: bool) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let inner = RedbStore::open_async(
            dir.path().join("tasks.redb"),
            StoreOptions {
                durability: Durability::None,
                ..StoreOptions::default()
            },
        )
        .await
        .unwrap();
        let reads = Arc::new(Reads::default());
        let store = if counting {
            Store::from_backend(Arc::new(Counting {
                inner,
                reads: reads.clone(),
            }))
        } else {
            Store::from_backend(Arc::new(inner))
        };
        let mut builder = Runtime::builder_with_store(store)
            .tool(instant())
            .quotas(quotas);
        if let Some(retention) = retention {
            builder = builder
                .default_ttl(Some(retention))
                .expired_retention(retention);
        }
        let rt = builder.start().await.unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, rx) = oneshot::channel::<()>();
        let router = http::router(rt.handle(), HttpConfig::default().authenticator(by_token()));
        let serving = tokio::spawn(http::serve(listener, router, async {
            let _ = rx.await;
        }));
        Server {
            addr,
            rt,
            stop,
            serving,
            reads,
            _dir: dir,
        }
    }

    async fn stop(self) {
        self.rt.begin_shutdown();
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(support::WAIT, self.serving).await;
        self.rt.shutdown().await;
    }

    async fn create(&self, who: &str, pad: usize) -> support::Response {
        let body = request(
            json!(1),
            "tools/call",
            json!({ "name": "keep", "arguments": { "pad": "x".repeat(pad) } }),
        );
        post(self.addr, Some(who), &body).await
    }

    /// Waits (bounded) until every task created so far has committed its end and its actor
    /// has stopped: the `keep` tool finishes at once, but its last commit lands after the
    /// creation's answer.
    async fn all_finished(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.rt.live_tasks() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(self.rt.live_tasks(), 0, "the instant tasks never finished");
    }

    async fn create_ok(&self, who: &str, pad: usize) -> String {
        let r = self.create(who, pad).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        r.json()["result"]["taskId"].as_str().unwrap().to_owned()
    }

    async fn legacy(&self, who: &str) -> Client {
        let mut client = Client::new(&format!("http://{}/mcp", self.addr)).with_token(who);
        client
            .initialize(json!({ "tasks": { "list": {}, "cancel": {} } }))
            .await;
        client
    }
}

/// Defect 2 of the review, scaled for CI: a principal with no tasks lists against a store
/// full of another principal's large tasks; the list reads none of them (not one record of
/// theirs leaves the store) and never the whole store. A principal with 120 tasks gets each
/// exactly once over pages of at most 50, each page reading at most 51 records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_tasks_list_reads_only_the_callers_records_a_page_at_a_time() {
    let server = Server::start(Quotas::unlimited(), None).await;
    const LARGE: usize = 256 * 1024;
    for _ in 0..24 {
        server.create_ok("bob", LARGE).await;
    }
    let mut alices = BTreeSet::new();
    for _ in 0..120 {
        alices.insert(server.create_ok("alice", 10).await);
    }

    let carol = server.legacy("carol").await;
    let before = server.reads.snapshot();
    let list = carol.result(2, "tasks/list", json!({})).await;
    let after = server.reads.snapshot();
    assert_eq!(list["tasks"], json!([]), "{list}");
    assert!(list.get("nextCursor").is_none(), "{list}");
    assert_eq!(after.0, before.0, "the whole store is never read");
    assert!(
        after.2 - before.2 < LARGE as u64,
        "none of bob's records is read: {} bytes read",
        after.2 - before.2
    );

    let alice = server.legacy("alice").await;
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let params = match &cursor {
            Some(c) => json!({ "cursor": c }),
            None => json!({}),
        };
        let before = server.reads.snapshot();
        let page = alice.result(3 + pages, "tasks/list", params).await;
        let after = server.reads.snapshot();
        pages += 1;
        let tasks = page["tasks"].as_array().unwrap();
        assert!(tasks.len() <= 50, "{}", tasks.len());
        assert!(
            after.1 - before.1 <= 51,
            "a page reads at most its size plus one: {}",
            after.1 - before.1
        );
        assert!(after.2 - before.2 < LARGE as u64, "no record of bob's");
        seen.extend(
            tasks
                .iter()
                .map(|t| t["taskId"].as_str().unwrap().to_owned()),
        );
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
        assert!(pages < 10, "the pages never end");
    }
    assert_eq!(pages, 3);
    let unique: BTreeSet<String> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "no task is listed twice");
    assert_eq!(unique, alices, "every own task is listed");
    assert_eq!(
        server.reads.snapshot().0,
        0,
        "the whole store is never read"
    );
    server.stop().await;
}

/// A page of the legacy `tasks/list` is bounded in bytes as well as in count: with tasks of
/// 1 MB arguments, a page stops once it holds `MAX_PAGE_BYTES` of records (far fewer than
/// 50 tasks), reads about that much from the store, and following the cursor still lists
/// every task exactly once (the small ones after the large ones included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_tasks_list_pages_are_bounded_in_bytes() {
    let server = Server::start(Quotas::unlimited(), None).await;
    // Under the default 1 MiB argument limit.
    const LARGE: usize = 1000 * 1024;
    const BUDGET: u64 = mcp_tasks::store::MAX_PAGE_BYTES as u64;
    let mut alices = BTreeSet::new();
    for _ in 0..12 {
        alices.insert(server.create_ok("alice", LARGE).await);
    }
    for _ in 0..3 {
        alices.insert(server.create_ok("alice", 10).await);
    }
    let alice = server.legacy("alice").await;
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let params = match &cursor {
            Some(c) => json!({ "cursor": c }),
            None => json!({}),
        };
        let before = server.reads.snapshot();
        let page = alice.result(3 + pages, "tasks/list", params).await;
        let after = server.reads.snapshot();
        pages += 1;
        let tasks = page["tasks"].as_array().unwrap();
        if pages == 1 {
            assert!(
                (1..alices.len()).contains(&tasks.len()),
                "the first page holds what fits its byte budget: {} tasks",
                tasks.len()
            );
        }
        let read = after.2 - before.2;
        assert!(
            read < BUDGET + 2 * LARGE as u64,
            "a page reads at most its byte budget and a record more: {read} bytes"
        );
        seen.extend(
            tasks
                .iter()
                .map(|t| t["taskId"].as_str().unwrap().to_owned()),
        );
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
        assert!(pages < 20, "the pages never end");
    }
    assert!(pages >= 3, "12 MB of records over pages of 4 MiB: {pages}");
    let unique: BTreeSet<String> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "no task is listed twice");
    assert_eq!(unique, alices, "every own task is listed");
    server.stop().await;
}

/// Defect 3 of the review, scaled for CI: tasks that finish at once still hold their
/// arguments in the store until the reaper deletes them; the disk quota counts them, refuses
/// the next creation with `429` / `-32010` naming `storedBytes` and its limit (another
/// principal is unaffected), and lets the principal create again once the reaper purged them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disk_quota_counts_finished_tasks_until_they_are_purged() {
    const LIMIT: u64 = 1024 * 1024;
    const PAD: usize = 100 * 1024;
    let mut quotas = Quotas::unlimited();
    quotas.max_stored_bytes = LIMIT;
    // Short lives: a finished task is deleted 2 × 1.5 s after its creation.
    let server = Server::start(quotas, Some(Duration::from_millis(1500))).await;
    let key = mcp_tasks::store::owner_key("t", "alice");
    let mut created = 0;
    let refused = loop {
        let r = server.create("alice", PAD).await;
        if r.status != 200 {
            break r;
        }
        created += 1;
        assert!(created <= 11, "the quota never refuses");
    };
    assert!(created >= 8, "refused too early: after {created}");
    assert_eq!(
        refused.status,
        429,
        "{}",
        String::from_utf8_lossy(&refused.body)
    );
    assert!(refused.header("retry-after").is_some());
    let body = refused.json();
    assert_eq!(body["error"]["code"], -32010, "{body}");
    assert_eq!(body["error"]["data"]["quota"], "storedBytes", "{body}");
    assert_eq!(body["error"]["data"]["limit"], LIMIT, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&LIMIT.to_string()),
        "{body}"
    );
    let usage = mcp_tasks::internals::runtime_store(&server.rt)
        .usage(&key)
        .await
        .unwrap();
    assert_eq!(usage.tasks, created);
    assert!(usage.bytes <= LIMIT, "{usage:?}");
    assert!(usage.bytes > created * PAD as u64, "{usage:?}");
    // The tasks finish at once (the last one's actor may still be stopping): only the disk
    // quota holds them back.
    server.all_finished().await;
    // Another principal has its own allowance.
    server.create_ok("bob", PAD).await;

    // Once the reaper deleted them, the bytes are free again.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let usage = mcp_tasks::internals::runtime_store(&server.rt)
            .usage(&key)
            .await
            .unwrap();
        if usage == Usage::default() {
            break;
        }
        assert!(Instant::now() < deadline, "never purged: {usage:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.create_ok("alice", PAD).await;
    server.stop().await;
}

const BIN: &str = env!("CARGO_BIN_EXE_mcp-tasks");

fn store_stats_by_owner(path: &std::path::Path, json: bool) -> String {
    let mut args = vec![
        "store",
        "stats",
        "--by-owner",
        "--store",
        path.to_str().unwrap(),
    ];
    if json {
        args.push("--json");
    }
    let out = std::process::Command::new(BIN)
        .args(&args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `mcp-tasks store stats --by-owner` shows what each principal stores (finished tasks
/// included), largest first, through the running server's admin socket and offline, with
/// the figures the disk quota uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_stats_by_owner_online_and_offline() {
    let server = Server::start_on(Quotas::unlimited(), None, false).await;
    let path = server._dir.path().join("tasks.redb");
    for _ in 0..3 {
        server.create_ok("alice", 10_000).await;
    }
    server.create_ok("bob", 100).await;
    // A finished record is larger than a working one: read the figures once all are final.
    server.all_finished().await;
    let alice = mcp_tasks::internals::runtime_store(&server.rt)
        .usage(&mcp_tasks::store::owner_key("t", "alice"))
        .await
        .unwrap();
    assert_eq!(alice.tasks, 3);
    let socket = server.rt.admin_socket().unwrap().unwrap();
    let online: Value = serde_json::from_str(&store_stats_by_owner(&path, true)).unwrap();
    assert_eq!(online["via_server"], true, "{online}");
    assert_eq!(online["owners"][0]["tenant"], "t", "{online}");
    assert_eq!(online["owners"][0]["principal"], "alice", "{online}");
    assert_eq!(online["owners"][0]["tasks"], 3, "{online}");
    assert_eq!(online["owners"][0]["bytes"], alice.bytes, "{online}");
    assert_eq!(online["owners"][1]["principal"], "bob", "{online}");
    assert_eq!(online["owners"].as_array().unwrap().len(), 2);
    drop(socket);
    let Server {
        rt,
        stop,
        serving,
        _dir: dir,
        ..
    } = server;
    rt.begin_shutdown();
    let _ = stop.send(());
    let _ = tokio::time::timeout(support::WAIT, serving).await;
    rt.shutdown().await;
    // Offline: the same figures, read from the file.
    let text = store_stats_by_owner(&path, false);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[1].starts_with("TENANT"), "{text}");
    assert!(
        lines[2].contains("alice") && lines[2].contains(&alice.bytes.to_string()),
        "{text}"
    );
    assert!(lines[3].contains("bob"), "{text}");
    drop(dir);
}

/// `mcp-tasks serve` (this build's binary) on 127.0.0.1:0 with two principals: `mallory`
/// (tenant acme) and `carol` (tenant globex). Stopped (SIGTERM, then SIGKILL) on drop.
struct Served {
    child: std::process::Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

const MALLORY: &str = "mallory-token";
const CAROL: &str = "carol-token";

impl Served {
    fn start(extra: &[&str]) -> Served {
        use std::io::BufRead;
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(
            &tokens,
            support::token_entry(MALLORY, "acme", "mallory", &[])
                + &support::token_entry(CAROL, "globex", "carol", &[]),
        )
        .unwrap();
        let mut child = std::process::Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--fixtures", "bench"])
            .arg("--store")
            .arg(dir.path().join("tasks.redb"))
            .arg("--auth-tokens")
            .arg(&tokens)
            .args(extra)
            .env("RUST_LOG", "warn,mcp_tasks=info")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("serve logs its address")
                .expect("stderr is readable");
            if let Some(rest) = line.split("listening on http://").nth(1) {
                break rest.trim_end_matches("/mcp").trim().parse().unwrap();
            }
        };
        // Keep draining the log so that the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Served { child, addr, dir }
    }

    /// A field of `/proc/PID/status` in KiB (`VmHWM:`: the peak resident set).
    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the server runs");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {field} in {status}"))
    }

    fn store_bytes(&self) -> u64 {
        std::fs::metadata(self.dir.path().join("tasks.redb"))
            .unwrap()
            .len()
    }

    /// The median time of 20 `tools/list` of carol's, in ms (each answered 200).
    async fn victim_median_ms(&self) -> f64 {
        let mut times = Vec::new();
        for i in 0..20 {
            let body = request(json!(i), "tools/list", json!({}));
            let started = Instant::now();
            let r = post(self.addr, Some(CAROL), &body).await;
            times.push(started.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        }
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // SAFETY: kill(2) on this test's own child.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A legacy request of mallory's (a new session when `session` is `None`).
async fn legacy_post(
    http: &reqwest::Client,
    addr: SocketAddr,
    session: Option<&str>,
    body: &Value,
) -> reqwest::Response {
    legacy_send(http, addr, session, body)
        .await
        .expect("the server answers")
}

/// [`legacy_post`], failing when the client gives up (its timeout).
async fn legacy_send(
    http: &reqwest::Client,
    addr: SocketAddr,
    session: Option<&str>,
    body: &Value,
) -> reqwest::Result<reqwest::Response> {
    let mut b = http
        .post(format!("http://{addr}/mcp"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .bearer_auth(MALLORY)
        .body(serde_json::to_vec(body).unwrap());
    if let Some(s) = session {
        b = b
            .header("Mcp-Session-Id", s)
            .header("MCP-Protocol-Version", support::legacy::LEGACY);
    }
    b.send().await
}

/// The refusal's status and JSON-RPC error, checked as docs/SERVE.md documents every quota's:
/// `429` with `Retry-After`, `-32010`, the quota and its limit named in `data` and in the
/// message.
async fn assert_quota_refusal(r: reqwest::Response, quota: &str, limit: u64) {
    assert_eq!(r.status().as_u16(), 429);
    assert!(r.headers().get("retry-after").is_some());
    let body: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], -32010, "{body}");
    assert_eq!(body["error"]["data"]["quota"], quota, "{body}");
    assert_eq!(body["error"]["data"]["limit"], limit, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains(&limit.to_string()),
        "{body}"
    );
}

/// Defects 1 and 3 of the review, reproduced against the served binary and scaled for CI,
/// with what the review measured held to fixed, generous bounds (a loaded 2-core machine
/// passes them; the defects broke them by orders of magnitude):
///
/// - legacy era: mallory makes 10 live tasks, abandons 40 `tasks/result` requests, then
///   opens sessions that each hold an unread stream and follow every task (`tasks/get`),
///   until `--max-sessions` refuses one (429 / -32010 `sessions`);
/// - disk: mallory creates finished tasks with 500 kB arguments until `--max-stored-bytes`
///   refuses one (429 / -32010 `storedBytes`);
///
/// and after each, carol's `tools/list` median stays under 250 ms (the review: 1–3 s, against
/// 0.6 ms unloaded), the server's peak resident set (VmHWM) under 256 MiB (the review: 211 MB
/// from 640 sessions and 2.5 GB from listings), and the store file under a bound derived from
/// the quota (the review: 1 GiB in 23 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_principals_attacks_stay_within_fixed_bounds_on_the_served_binary() {
    const MAX_SESSIONS: usize = 16;
    const MAX_STORED: u64 = 8 * 1024 * 1024;
    const VICTIM_MS: f64 = 250.0;
    const HWM_KIB: u64 = 256 * 1024;
    let server = Served::start(&[
        "--max-sessions",
        &MAX_SESSIONS.to_string(),
        "--max-stored-bytes",
        &MAX_STORED.to_string(),
    ]);
    let addr = server.addr;
    let http = reqwest::Client::new();
    let quiet = server.victim_median_ms().await;
    assert!(quiet < VICTIM_MS, "unloaded: {quiet:.1} ms");

    // Legacy era: live tasks followed from many sessions, and abandoned tasks/result.
    let mut tasks = Vec::new();
    for i in 0..10 {
        let body = request(
            json!(i),
            "tools/call",
            json!({ "name": "sleep_task", "arguments": { "ms": 3_600_000u64 } }),
        );
        let r = post(addr, Some(MALLORY), &body).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        tasks.push(r.json()["result"]["taskId"].as_str().unwrap().to_owned());
    }
    let init = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": support::legacy::LEGACY, "capabilities": {},
        "clientInfo": { "name": "abuse", "version": "1" } } });
    let new_session = |r: &reqwest::Response| -> String {
        r.headers()["mcp-session-id"].to_str().unwrap().to_owned()
    };
    let first = legacy_post(&http, addr, None, &init).await;
    assert_eq!(first.status().as_u16(), 200);
    let first = new_session(&first);
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let abandoned = (0..40).map(|i| {
        let body = json!({ "jsonrpc": "2.0", "id": i, "method": "tasks/result",
            "params": { "taskId": tasks[i % tasks.len()] } });
        let (impatient, first) = (impatient.clone(), first.clone());
        async move {
            let _ = legacy_send(&impatient, addr, Some(&first), &body).await;
        }
    });
    // Under the 64 requests one principal may have in progress.
    let abandoned: Vec<_> = abandoned.collect();
    futures::future::join_all(abandoned).await;
    let mut streams = Vec::new();
    let mut refusal = None;
    for _ in 0..MAX_SESSIONS * 3 {
        let r = legacy_post(&http, addr, None, &init).await;
        if r.status().as_u16() != 200 {
            refusal = Some(r);
            break;
        }
        let session = new_session(&r);
        let stream = http
            .get(format!("http://{addr}/mcp"))
            .header("Accept", "text/event-stream")
            .header("Mcp-Session-Id", &session)
            .header("MCP-Protocol-Version", support::legacy::LEGACY)
            .bearer_auth(MALLORY)
            .send()
            .await
            .unwrap();
        assert_eq!(stream.status().as_u16(), 200);
        // Held open, never read.
        streams.push(stream);
        for task in &tasks {
            let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tasks/get",
                "params": { "taskId": task } });
            let r = legacy_post(&http, addr, Some(&session), &body).await;
            assert_eq!(r.status().as_u16(), 200);
        }
    }
    let refusal = refusal.expect("--max-sessions never refused a session");
    assert_eq!(streams.len(), MAX_SESSIONS);
    assert_quota_refusal(refusal, "sessions", MAX_SESSIONS as u64).await;
    let legacy_ms = server.victim_median_ms().await;
    let legacy_hwm = server.status_kib("VmHWM:");

    // Disk: finished tasks with large arguments until the disk quota refuses.
    const PAD: usize = 500_000;
    let body = request(
        json!(1),
        "tools/call",
        json!({ "name": "sleep_task", "arguments": { "ms": 0, "pad": "x".repeat(PAD) } }),
    );
    let mut created = 0u64;
    let mut refusal = None;
    for _ in 0..1000 {
        let r = post(addr, Some(MALLORY), &body).await;
        match r.status {
            200 => created += 1,
            429 if r.json()["error"]["data"]["quota"] == "storedBytes" => {
                refusal = Some(r);
                break;
            }
            // The create rate: wait a little and go on.
            429 => tokio::time::sleep(Duration::from_millis(100)).await,
            other => panic!("{other}: {}", String::from_utf8_lossy(&r.body)),
        }
    }
    let refusal = refusal.expect("--max-stored-bytes never refused a creation");
    assert!(refusal.header("retry-after").is_some());
    let reply = refusal.json();
    assert_eq!(reply["error"]["code"], -32010, "{reply}");
    assert_eq!(reply["error"]["data"]["limit"], MAX_STORED, "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains(&MAX_STORED.to_string()),
        "{reply}"
    );
    let quota_tasks = MAX_STORED / PAD as u64;
    assert!(
        (quota_tasks / 2..=quota_tasks).contains(&created),
        "{created} tasks of {PAD} bytes within {MAX_STORED} bytes"
    );
    let disk_ms = server.victim_median_ms().await;
    let hwm = server.status_kib("VmHWM:");
    let store = server.store_bytes();
    eprintln!(
        "victim tools/list median: {quiet:.2} ms unloaded, {legacy_ms:.2} ms after the legacy \
         attack, {disk_ms:.2} ms after the disk attack; VmHWM {legacy_hwm} KiB after the \
         legacy attack, {hwm} KiB at the end; store file {store} bytes ({created} tasks of \
         {PAD} bytes)"
    );
    assert!(
        legacy_ms < VICTIM_MS,
        "after the legacy attack: {legacy_ms:.1} ms"
    );
    assert!(
        disk_ms < VICTIM_MS,
        "after the disk attack: {disk_ms:.1} ms"
    );
    assert!(hwm < HWM_KIB, "peak resident set {hwm} KiB");
    // A record's bytes may be written more than once (copy-on-write pages, the freed pages
    // of earlier commits): 4 × the quota, plus the empty store's tables.
    let store_bound = 4 * MAX_STORED + 16 * 1024 * 1024;
    assert!(
        store < store_bound,
        "store file {store} bytes, bound {store_bound}"
    );
    drop(streams);
}
