//! What a legacy session has inside one process: its message streams (with event ids for
//! `Last-Event-ID` resumption), the server-to-client requests waiting for an answer, and the
//! tasks it follows. None of it is needed for a session to stay valid: after a restart or on
//! another replica the session id still verifies and this state starts empty.
//!
//! What the hub holds is bounded per owner ([`crate::quota::Quotas::max_sessions`]): at the
//! limit, a new session takes the place of the owner's least recently used session that has
//! no open stream and no request waiting for the client (that one's state goes, as after a
//! restart); when every one has, the new one is refused. Idle sessions are forgotten a few at
//! a time as new ones arrive, so that making a session costs the same however many are held.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration as StdDuration;
use std::time::{Duration, Instant};

use futures::Stream;
use serde_json::Value;
use tokio::sync::{oneshot, watch};

use super::watch::{Interest, Latest};
use crate::quota::{QuotaError, QuotaKind};
use crate::task::Owner;

/// Most messages one stream keeps for resumption; older ones are forgotten.
const LOG_CAPACITY: usize = 1024;
/// A session without open streams or activity for this long is forgotten by this process.
const IDLE: Duration = Duration::from_secs(3600);
/// Sessions examined for idleness per new session (amortised: each held session is looked at
/// again after about `held / SWEEP_STEP` new ones).
const SWEEP_STEP: usize = 2;
/// How long a finished stream stays resumable.
#[cfg(feature = "http")]
const FINISHED_RETENTION: Duration = Duration::from_secs(300);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One stream of messages with sequence numbers, readable from any retained position.
pub(crate) struct StreamLog {
    /// The stream's number within its session (`0` is the standing GET stream).
    pub(crate) id: u64,
    inner: Mutex<LogInner>,
    changed: watch::Sender<u64>,
    /// Readers of the stream now (an HTTP response being written, a resumption).
    readers: watch::Sender<usize>,
}

/// Counts a reader of a stream while it lives.
struct ReaderGuard(watch::Sender<usize>);

impl ReaderGuard {
    fn new(readers: &watch::Sender<usize>) -> Self {
        readers.send_modify(|n| *n += 1);
        Self(readers.clone())
    }
}

impl Drop for ReaderGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

struct LogInner {
    events: VecDeque<(u64, Value)>,
    next: u64,
    finished: Option<Instant>,
    /// The first sequence number no reader has taken yet (the standing stream starts a new
    /// reader there).
    undelivered: u64,
    /// Bumped by every new reader of the standing stream: older readers stop.
    generation: u64,
}

impl StreamLog {
    fn new(id: u64) -> Arc<Self> {
        Arc::new(Self {
            id,
            inner: Mutex::new(LogInner {
                events: VecDeque::new(),
                next: 1,
                finished: None,
                undelivered: 1,
                generation: 0,
            }),
            changed: watch::channel(0).0,
            readers: watch::channel(0).0,
        })
    }

    /// Whether someone reads the stream now.
    pub(crate) fn has_reader(&self) -> bool {
        *self.readers.borrow() > 0
    }

    /// Returns once nobody has read the stream for `grace` (its client went away and did not
    /// resume it).
    #[cfg(feature = "http")]
    pub(crate) async fn unread_for(&self, grace: Duration) {
        let mut rx = self.readers.subscribe();
        loop {
            if *rx.borrow_and_update() == 0 {
                match tokio::time::timeout(grace, rx.wait_for(|n| *n > 0)).await {
                    Ok(Ok(_)) => {}
                    _ => return,
                }
            } else if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Appends a message; returns its event id.
    pub(crate) fn push(&self, message: Value) -> String {
        let seq = {
            let mut inner = lock(&self.inner);
            let seq = inner.next;
            inner.next += 1;
            inner.events.push_back((seq, message));
            while inner.events.len() > LOG_CAPACITY {
                inner.events.pop_front();
            }
            seq
        };
        self.changed.send_replace(seq);
        event_id(self.id, seq)
    }

    /// Whether a retained message of the stream has `method`.
    #[cfg(test)]
    pub(crate) fn has_any(&self, method: &str) -> bool {
        lock(&self.inner)
            .events
            .iter()
            .any(|(_, m)| m.get("method").and_then(Value::as_str) == Some(method))
    }

    /// No more messages will come.
    pub(crate) fn finish(&self) {
        lock(&self.inner).finished = Some(Instant::now());
        self.changed.send_modify(|v| *v = v.wrapping_add(0));
    }

    fn is_finished(&self) -> bool {
        lock(&self.inner).finished.is_some()
    }

    #[cfg(feature = "http")]
    fn expired(&self, now: Instant) -> bool {
        lock(&self.inner)
            .finished
            .is_some_and(|at| now.duration_since(at) > FINISHED_RETENTION)
    }

    /// Reads messages from sequence number `from` on (or from the first not yet delivered),
    /// as `(event id, message)`, until the stream finishes. A reader of the standing stream
    /// stops when a newer reader starts (a message goes out on one stream only).
    pub(crate) fn read(
        self: &Arc<Self>,
        from: Option<u64>,
    ) -> impl Stream<Item = (String, Value)> + Send + 'static {
        let generation = {
            let mut inner = lock(&self.inner);
            inner.generation += 1;
            inner.generation
        };
        let start = from.unwrap_or_else(|| lock(&self.inner).undelivered);
        let log = self.clone();
        let rx = self.changed.subscribe();
        let reader = ReaderGuard::new(&self.readers);
        futures::stream::unfold(
            (log, rx, start, reader),
            move |(log, mut rx, pos, reader)| async move {
                loop {
                    rx.borrow_and_update();
                    {
                        let mut inner = lock(&log.inner);
                        if log.id == 0 && inner.generation != generation {
                            return None;
                        }
                        if let Some((seq, msg)) =
                            inner.events.iter().find(|(seq, _)| *seq >= pos).cloned()
                        {
                            inner.undelivered = inner.undelivered.max(seq + 1);
                            drop(inner);
                            return Some((
                                (event_id(log.id, seq), msg),
                                (log, rx, seq + 1, reader),
                            ));
                        }
                        if inner.finished.is_some() {
                            return None;
                        }
                    }
                    if rx.changed().await.is_err() {
                        return None;
                    }
                }
            },
        )
    }
}

/// The SSE event id of message `seq` of stream `stream`.
pub(crate) fn event_id(stream: u64, seq: u64) -> String {
    format!("{stream}-{seq}")
}

/// Reads an SSE event id back.
#[cfg(feature = "http")]
pub(crate) fn parse_event_id(id: &str) -> Option<(u64, u64)> {
    let (stream, seq) = id.trim().split_once('-')?;
    Some((stream.parse().ok()?, seq.parse().ok()?))
}

/// One session's in-process state.
pub(crate) struct Live {
    /// The standing stream (HTTP GET; unsolicited lines on stdio).
    pub(crate) standing: Arc<StreamLog>,
    streams: Mutex<HashMap<u64, Arc<StreamLog>>>,
    #[cfg(feature = "http")]
    next_stream: AtomicU64,
    /// Server-to-client requests of synchronous calls waiting for the client's response.
    pending: Mutex<HashMap<String, oneshot::Sender<Value>>>,
    next_request: AtomicU64,
    /// The owner the session belongs to (its place in the hub's per-owner count).
    owner: Owner,
    /// The session's negotiated protocol version (for the requests sent to it).
    pub(crate) version: String,
    /// Tasks this session follows, with its place in each task's watcher.
    followed: Mutex<HashMap<String, Interest>>,
    /// Input requests of tasks already sent to this session (`task/key`).
    sent_inputs: Mutex<BTreeSet<String>>,
    /// Open `tasks/result` streams per task.
    result_streams: Mutex<HashMap<String, usize>>,
    last_used: Mutex<Instant>,
    /// The session ended: everything it runs stops.
    pub(crate) ended: watch::Sender<bool>,
}

impl Live {
    fn new(owner: Owner, version: &str) -> Arc<Self> {
        Arc::new(Self {
            owner,
            version: version.to_owned(),
            followed: Mutex::new(HashMap::new()),
            standing: StreamLog::new(0),
            streams: Mutex::new(HashMap::new()),
            #[cfg(feature = "http")]
            next_stream: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            next_request: AtomicU64::new(1),
            sent_inputs: Mutex::new(BTreeSet::new()),
            result_streams: Mutex::new(HashMap::new()),
            last_used: Mutex::new(Instant::now()),
            ended: watch::channel(false).0,
        })
    }

    /// A new resumable stream of this session.
    #[cfg(feature = "http")]
    pub(crate) fn open_stream(&self) -> Arc<StreamLog> {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let log = StreamLog::new(id);
        let now = Instant::now();
        let mut streams = lock(&self.streams);
        streams.retain(|_, s| !s.expired(now));
        streams.insert(id, log.clone());
        log
    }

    /// A stream by number (`0` is the standing stream), while it is retained.
    #[cfg(feature = "http")]
    pub(crate) fn stream(&self, id: u64) -> Option<Arc<StreamLog>> {
        if id == 0 {
            return Some(self.standing.clone());
        }
        lock(&self.streams).get(&id).cloned()
    }

    /// Registers a server-to-client request of a synchronous call; the receiver gets the
    /// client's response message.
    pub(crate) fn expect_response(&self, prefix: &str) -> (String, oneshot::Receiver<Value>) {
        let n = self.next_request.fetch_add(1, Ordering::Relaxed);
        let id = format!("{prefix}{n}");
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id.clone(), tx);
        (id, rx)
    }

    /// Forgets a request that will not be answered (its call ended).
    pub(crate) fn forget_request(&self, id: &str) {
        lock(&self.pending).remove(id);
    }

    /// Hands the client's response to the request waiting for it; `false` if none waits.
    pub(crate) fn respond(&self, id: &str, message: Value) -> bool {
        match lock(&self.pending).remove(id) {
            Some(tx) => tx.send(message).is_ok(),
            None => false,
        }
    }

    /// Follows `task` with the place `join` gives in its watcher, unless it is followed
    /// already; the task's latest snapshot when this call made the session follow it.
    pub(crate) fn follow_task(
        &self,
        task: &str,
        join: impl FnOnce() -> Option<(Interest, Latest)>,
    ) -> Option<Latest> {
        let mut followed = lock(&self.followed);
        if followed.contains_key(task) {
            return None;
        }
        let (interest, latest) = join()?;
        followed.insert(task.to_owned(), interest);
        Some(latest)
    }

    /// Lets go of `task` (its watcher stopped, or the session is done with it).
    pub(crate) fn unfollow_task(&self, task: &str) {
        let interest = lock(&self.followed).remove(task);
        drop(interest);
    }

    /// Tasks this session follows.
    #[cfg(test)]
    pub(crate) fn followed(&self) -> usize {
        lock(&self.followed).len()
    }

    /// Marks an input request as sent; `false` if it already was.
    pub(crate) fn mark_sent(&self, task: &str, key: &str) -> bool {
        lock(&self.sent_inputs).insert(format!("{task}/{key}"))
    }

    /// Forgets that an input request was sent (it was never delivered: resend it).
    pub(crate) fn unmark_sent(&self, task: &str, key: &str) {
        lock(&self.sent_inputs).remove(&format!("{task}/{key}"));
    }

    /// Counts an open `tasks/result` stream of `task` until the guard is dropped.
    pub(crate) fn result_stream(self: &Arc<Self>, task: &str) -> ResultStreamGuard {
        *lock(&self.result_streams)
            .entry(task.to_owned())
            .or_default() += 1;
        ResultStreamGuard {
            live: self.clone(),
            task: task.to_owned(),
        }
    }

    /// Whether a `tasks/result` stream of `task` is open.
    pub(crate) fn has_result_stream(&self, task: &str) -> bool {
        lock(&self.result_streams).get(task).is_some_and(|n| *n > 0)
    }

    fn touch(&self) {
        *lock(&self.last_used) = Instant::now();
    }

    /// Whether the session has an open stream, a request waiting for the client or an open
    /// `tasks/result`: a client is using it.
    fn busy(&self) -> bool {
        self.standing.has_reader()
            || lock(&self.streams).values().any(|s| !s.is_finished())
            || !lock(&self.pending).is_empty()
            || !lock(&self.result_streams).is_empty()
    }

    fn last_used(&self) -> Instant {
        *lock(&self.last_used)
    }

    fn idle(&self, now: Instant, after: Duration) -> bool {
        !self.busy() && now.saturating_duration_since(self.last_used()) >= after
    }

    /// Stops everything the session runs in this process: its streams end, its waiting
    /// requests are dropped, and it lets go of the tasks it follows.
    fn shut(&self) {
        self.ended.send_replace(true);
        self.standing.finish();
        for s in lock(&self.streams).values() {
            s.finish();
        }
        lock(&self.pending).clear();
        let followed = std::mem::take(&mut *lock(&self.followed));
        drop(followed);
    }
}

/// Holds a place among the open `tasks/result` streams of a task.
pub(crate) struct ResultStreamGuard {
    live: Arc<Live>,
    task: String,
}

impl Drop for ResultStreamGuard {
    fn drop(&mut self) {
        let mut map = lock(&self.live.result_streams);
        if let Some(n) = map.get_mut(&self.task) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.task);
            }
        }
    }
}

/// Every session this process has seen recently, by nonce.
pub(crate) struct Hub {
    inner: Mutex<HubInner>,
    max_sessions: usize,
}

struct HubInner {
    sessions: HashMap<String, Arc<Live>>,
    /// The nonces of each owner's sessions (at most `max_sessions`).
    by_owner: HashMap<Owner, Vec<String>>,
    /// Nonces in the order they are next looked at for idleness (ended ones are skipped).
    sweep: VecDeque<String>,
    /// Sessions looked at by sweeps so far (tests check it stays proportional to arrivals).
    examined: u64,
    /// How long a session without a client stays.
    idle: Duration,
}

impl HubInner {
    fn remove(&mut self, nonce: &str) -> Option<Arc<Live>> {
        let live = self.sessions.remove(nonce)?;
        if let Some(nonces) = self.by_owner.get_mut(&live.owner) {
            nonces.retain(|n| n != nonce);
            if nonces.is_empty() {
                self.by_owner.remove(&live.owner);
            }
        }
        Some(live)
    }

    /// Looks at a few sessions, oldest turn first; forgets the idle ones.
    fn sweep_some(&mut self, now: Instant, gone: &mut Vec<Arc<Live>>) {
        for _ in 0..SWEEP_STEP {
            let Some(nonce) = self.sweep.pop_front() else {
                return;
            };
            self.examined += 1;
            match self.sessions.get(&nonce) {
                None => {}
                Some(live) if live.idle(now, self.idle) => gone.extend(self.remove(&nonce)),
                Some(_) => self.sweep.push_back(nonce),
            }
        }
    }
}

impl Hub {
    /// A hub holding at most `max_sessions` sessions per owner.
    pub(crate) fn new(max_sessions: usize) -> Self {
        Self {
            inner: Mutex::new(HubInner {
                sessions: HashMap::new(),
                by_owner: HashMap::new(),
                sweep: VecDeque::new(),
                examined: 0,
                idle: IDLE,
            }),
            max_sessions: max_sessions.max(1),
        }
    }

    /// The in-process state of `owner`'s session `nonce` (of protocol `version`), made on
    /// first use; refused when the owner holds [`Hub::new`]'s `max_sessions` sessions that
    /// are all in use.
    pub(crate) fn live(
        &self,
        nonce: &str,
        owner: &Owner,
        version: &str,
    ) -> Result<Arc<Live>, QuotaError> {
        let mut gone = Vec::new();
        let result = {
            let mut inner = lock(&self.inner);
            if let Some(live) = inner.sessions.get(nonce) {
                live.touch();
                return Ok(live.clone());
            }
            inner.sweep_some(Instant::now(), &mut gone);
            self.admit(&mut inner, nonce, owner, version, &mut gone)
        };
        // Outside the hub's lock: a forgotten session lets go of its tasks.
        for live in gone {
            live.shut();
        }
        result
    }

    fn admit(
        &self,
        inner: &mut HubInner,
        nonce: &str,
        owner: &Owner,
        version: &str,
        gone: &mut Vec<Arc<Live>>,
    ) -> Result<Arc<Live>, QuotaError> {
        let held = inner.by_owner.get(owner).map_or(0, Vec::len);
        if held >= self.max_sessions {
            // The owner's least recently used session without a client on it gives way.
            let victim = inner.by_owner.get(owner).and_then(|nonces| {
                nonces
                    .iter()
                    .filter_map(|n| inner.sessions.get(n).map(|l| (n, l)))
                    .filter(|(_, l)| !l.busy())
                    .min_by_key(|(_, l)| l.last_used())
                    .map(|(n, _)| n.clone())
            });
            let Some(victim) = victim else {
                return Err(QuotaError {
                    kind: QuotaKind::Sessions,
                    limit: self.max_sessions as u64,
                    retry_after: StdDuration::from_secs(10),
                });
            };
            tracing::debug!(
                "a legacy session's in-process state gives way to a new one of its owner"
            );
            gone.extend(inner.remove(&victim));
        }
        let live = Live::new(owner.clone(), version);
        inner.sessions.insert(nonce.to_owned(), live.clone());
        inner
            .by_owner
            .entry(owner.clone())
            .or_default()
            .push(nonce.to_owned());
        inner.sweep.push_back(nonce.to_owned());
        Ok(live)
    }

    /// Forgets a session and stops everything it runs.
    pub(crate) fn end(&self, nonce: &str) {
        let live = lock(&self.inner).remove(nonce);
        if let Some(live) = live {
            live.shut();
        }
    }

    /// Sessions held in this process.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.inner).sessions.len()
    }

    /// Sessions looked at by sweeps so far.
    #[cfg(test)]
    pub(crate) fn examined(&self) -> u64 {
        lock(&self.inner).examined
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use serde_json::json;

    #[cfg(feature = "http")]
    #[tokio::test]
    async fn a_stream_resumes_after_an_event_id() {
        let live = Live::new(Owner::anonymous(), "2025-11-25");
        let log = live.open_stream();
        let a = log.push(json!(1));
        log.push(json!(2));
        log.push(json!(3));
        log.finish();
        let (stream, seq) = parse_event_id(&a).unwrap();
        assert_eq!(stream, log.id);
        let rest: Vec<Value> = live
            .stream(stream)
            .unwrap()
            .read(Some(seq + 1))
            .map(|(_, m)| m)
            .collect()
            .await;
        assert_eq!(rest, vec![json!(2), json!(3)]);
    }

    #[tokio::test]
    async fn a_new_standing_reader_replaces_the_old_one_and_gets_the_undelivered() {
        let live = Live::new(Owner::anonymous(), "2025-11-25");
        let mut first = Box::pin(live.standing.read(None));
        live.standing.push(json!("a"));
        assert_eq!(first.next().await.unwrap().1, json!("a"));
        live.standing.push(json!("b"));
        let mut second = Box::pin(live.standing.read(None));
        assert_eq!(first.next().await, None, "the older reader stops");
        assert_eq!(second.next().await.unwrap().1, json!("b"));
    }

    #[tokio::test]
    async fn responses_reach_their_request_once() {
        let live = Live::new(Owner::anonymous(), "2025-11-25");
        let (id, rx) = live.expect_response("r-");
        assert!(live.respond(&id, json!({"ok": true})));
        assert!(!live.respond(&id, json!({"ok": true})));
        assert_eq!(rx.await.unwrap(), json!({"ok": true}));
    }

    #[cfg(feature = "http")]
    #[tokio::test(start_paused = true)]
    async fn a_stream_is_abandoned_only_after_the_grace_without_a_reader() {
        let live = Live::new(Owner::anonymous(), V);
        let log = live.open_stream();
        let grace = Duration::from_secs(30);
        let reader = log.read(Some(1));
        let mut abandoned = Box::pin(log.unread_for(grace));
        let long = Duration::from_secs(120);
        assert!(
            tokio::time::timeout(long, &mut abandoned).await.is_err(),
            "read"
        );
        drop(reader);
        tokio::time::sleep(Duration::from_secs(20)).await;
        let resumed = log.read(Some(1));
        assert!(
            tokio::time::timeout(long, &mut abandoned).await.is_err(),
            "resumed"
        );
        drop(resumed);
        tokio::time::timeout(grace + Duration::from_secs(1), abandoned)
            .await
            .expect("abandoned after the grace");
    }

    #[cfg(feature = "http")]
    #[test]
    fn event_ids_parse() {
        assert_eq!(parse_event_id("3-17"), Some((3, 17)));
        assert_eq!(parse_event_id("x-1"), None);
        assert_eq!(parse_event_id("17"), None);
    }

    const V: &str = "2025-11-25";

    #[test]
    fn ended_sessions_are_forgotten() {
        let hub = Hub::new(4);
        let live = hub.live("n", &Owner::anonymous(), V).unwrap();
        hub.end("n");
        assert!(*live.ended.borrow());
        assert_eq!(hub.len(), 0);
    }

    #[test]
    fn a_new_session_looks_at_a_bounded_number_of_held_ones() {
        // Many sessions held (of many owners): each new one examines at most SWEEP_STEP of
        // them, not all (the review's O(n) sweep under the hub's lock).
        let hub = Hub::new(4);
        for i in 0..5_000 {
            let owner = Owner::new("t", format!("p{}", i % 2_000));
            hub.live(&format!("n{i}"), &owner, V).unwrap();
        }
        assert_eq!(hub.len(), 5_000);
        let before = hub.examined();
        hub.live("new", &Owner::new("t", "newcomer"), V).unwrap();
        assert!(hub.examined() - before <= SWEEP_STEP as u64);
        assert!(hub.examined() <= 5_001 * SWEEP_STEP as u64);
    }

    #[test]
    fn idle_sessions_are_forgotten_a_few_at_a_time() {
        let hub = Hub::new(100);
        let owner = Owner::anonymous();
        let old: Vec<_> = (0..3)
            .map(|i| hub.live(&format!("old{i}"), &owner, V).unwrap())
            .collect();
        // From now on a session unused for a moment is idle.
        lock(&hub.inner).idle = Duration::ZERO;
        hub.live("a", &owner, V).unwrap();
        assert_eq!(hub.len(), 2, "the first arrival looked at two old ones");
        hub.live("b", &owner, V).unwrap();
        assert!(old.iter().all(|l| *l.ended.borrow()));
        let _reader = Box::pin(hub.live("b", &owner, V).unwrap().standing.read(None));
        for n in ["c", "d", "e"] {
            hub.live(n, &owner, V).unwrap();
        }
        assert!(
            hub.live("b", &owner, V).is_ok_and(|b| !*b.ended.borrow()),
            "b is read"
        );
    }

    #[tokio::test]
    async fn at_the_limit_an_unused_session_gives_way_and_busy_ones_refuse() {
        let hub = Hub::new(2);
        let alice = Owner::new("t", "alice");
        let a = hub.live("a", &alice, V).unwrap();
        let b = hub.live("b", &alice, V).unwrap();
        // Nobody reads a or b: the least recently used gives way.
        hub.live("b", &alice, V).unwrap();
        let c = hub.live("c", &alice, V).unwrap();
        assert!(*a.ended.borrow() && !*b.ended.borrow());
        // With a reader on each, a third is refused with the quota's kind and limit.
        let _rb = Box::pin(b.standing.read(None));
        let _rc = Box::pin(c.standing.read(None));
        let e = hub.live("d", &alice, V).err().unwrap();
        assert_eq!((e.kind, e.limit), (QuotaKind::Sessions, 2));
        // Another owner is counted apart.
        hub.live("e", &Owner::new("t", "bob"), V).unwrap();
        drop(_rb);
        hub.live("d", &alice, V).unwrap();
        assert!(*b.ended.borrow(), "b gave way once its reader left");
    }
}
