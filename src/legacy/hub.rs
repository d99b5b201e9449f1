//! What a legacy session has inside one process: its message streams (with event ids for
//! `Last-Event-ID` resumption), the server-to-client requests waiting for an answer, and the
//! tasks it follows. None of it is needed for a session to stay valid: after a restart or on
//! another replica the session id still verifies and this state starts empty.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::Stream;
use serde_json::Value;
use tokio::sync::{oneshot, watch};

/// Most messages one stream keeps for resumption; older ones are forgotten.
const LOG_CAPACITY: usize = 1024;
/// A session without open streams or activity for this long is forgotten by this process.
const IDLE: Duration = Duration::from_secs(3600);
/// Watchers of one session that follow their task with a listen; more poll instead.
const LISTENING_WATCHERS: u64 = 4;
/// How long a finished stream stays resumable.
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
        })
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

    /// No more messages will come.
    pub(crate) fn finish(&self) {
        lock(&self.inner).finished = Some(Instant::now());
        self.changed.send_modify(|v| *v = v.wrapping_add(0));
    }

    fn is_finished(&self) -> bool {
        lock(&self.inner).finished.is_some()
    }

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
        futures::stream::unfold((log, rx, start), move |(log, mut rx, pos)| async move {
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
                        return Some(((event_id(log.id, seq), msg), (log, rx, seq + 1)));
                    }
                    if inner.finished.is_some() {
                        return None;
                    }
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        })
    }
}

/// The SSE event id of message `seq` of stream `stream`.
pub(crate) fn event_id(stream: u64, seq: u64) -> String {
    format!("{stream}-{seq}")
}

/// Reads an SSE event id back.
pub(crate) fn parse_event_id(id: &str) -> Option<(u64, u64)> {
    let (stream, seq) = id.trim().split_once('-')?;
    Some((stream.parse().ok()?, seq.parse().ok()?))
}

/// One session's in-process state.
pub(crate) struct Live {
    /// The standing stream (HTTP GET; unsolicited lines on stdio).
    pub(crate) standing: Arc<StreamLog>,
    streams: Mutex<HashMap<u64, Arc<StreamLog>>>,
    next_stream: AtomicU64,
    /// Server-to-client requests of synchronous calls waiting for the client's response.
    pending: Mutex<HashMap<String, oneshot::Sender<Value>>>,
    next_request: AtomicU64,
    /// Tasks a watcher follows for this session.
    watched: Mutex<BTreeSet<String>>,
    /// Input requests of tasks already sent to this session (`task/key`).
    sent_inputs: Mutex<BTreeSet<String>>,
    /// Open `tasks/result` streams per task.
    result_streams: Mutex<HashMap<String, usize>>,
    /// Watchers of this session that hold a listen.
    listening_watchers: Arc<AtomicU64>,
    last_used: Mutex<Instant>,
    /// The session ended: everything it runs stops.
    pub(crate) ended: watch::Sender<bool>,
}

impl Live {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            standing: StreamLog::new(0),
            streams: Mutex::new(HashMap::new()),
            next_stream: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            next_request: AtomicU64::new(1),
            watched: Mutex::new(BTreeSet::new()),
            sent_inputs: Mutex::new(BTreeSet::new()),
            result_streams: Mutex::new(HashMap::new()),
            listening_watchers: Arc::new(AtomicU64::new(0)),
            last_used: Mutex::new(Instant::now()),
            ended: watch::channel(false).0,
        })
    }

    /// A new resumable stream of this session.
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

    /// Marks `task` as followed; `false` if it already was.
    pub(crate) fn watch_task(&self, task: &str) -> bool {
        lock(&self.watched).insert(task.to_owned())
    }

    pub(crate) fn unwatch_task(&self, task: &str) {
        lock(&self.watched).remove(task);
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

    /// A place among the session's listening watchers (at most [`LISTENING_WATCHERS`]),
    /// held until dropped; `None` when they are all taken.
    pub(crate) fn listening_watcher(&self) -> Option<WatcherSlot> {
        let counter = self.listening_watchers.clone();
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < LISTENING_WATCHERS).then_some(n + 1)
            })
            .ok()
            .map(|_| WatcherSlot(counter))
    }

    /// Whether a `tasks/result` stream of `task` is open.
    pub(crate) fn has_result_stream(&self, task: &str) -> bool {
        lock(&self.result_streams).get(task).is_some_and(|n| *n > 0)
    }

    fn touch(&self) {
        *lock(&self.last_used) = Instant::now();
    }

    fn idle(&self, now: Instant) -> bool {
        let streams_open = lock(&self.streams).values().any(|s| !s.is_finished());
        !streams_open
            && lock(&self.pending).is_empty()
            && lock(&self.watched).is_empty()
            && now.duration_since(*lock(&self.last_used)) > IDLE
    }
}

/// A listening watcher's place; released when dropped.
pub(crate) struct WatcherSlot(Arc<AtomicU64>);

impl Drop for WatcherSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
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
#[derive(Default)]
pub(crate) struct Hub {
    sessions: Mutex<HashMap<String, Arc<Live>>>,
}

impl Hub {
    /// The in-process state of a session, made on first use.
    pub(crate) fn live(&self, nonce: &str) -> Arc<Live> {
        let mut sessions = lock(&self.sessions);
        if let Some(live) = sessions.get(nonce) {
            live.touch();
            return live.clone();
        }
        let now = Instant::now();
        sessions.retain(|_, l| !l.idle(now));
        let live = Live::new();
        sessions.insert(nonce.to_owned(), live.clone());
        live
    }

    /// Forgets an ended session and stops everything it runs.
    pub(crate) fn end(&self, nonce: &str) {
        if let Some(live) = lock(&self.sessions).remove(nonce) {
            live.ended.send_replace(true);
            live.standing.finish();
            for s in lock(&live.streams).values() {
                s.finish();
            }
            lock(&live.pending).clear();
        }
    }

    /// Sessions held in this process.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.sessions).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use serde_json::json;

    #[tokio::test]
    async fn a_stream_resumes_after_an_event_id() {
        let live = Live::new();
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
        let live = Live::new();
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
        let live = Live::new();
        let (id, rx) = live.expect_response("r-");
        assert!(live.respond(&id, json!({"ok": true})));
        assert!(!live.respond(&id, json!({"ok": true})));
        assert_eq!(rx.await.unwrap(), json!({"ok": true}));
    }

    #[test]
    fn event_ids_parse() {
        assert_eq!(parse_event_id("3-17"), Some((3, 17)));
        assert_eq!(parse_event_id("x-1"), None);
        assert_eq!(parse_event_id("17"), None);
    }

    #[test]
    fn ended_sessions_are_forgotten() {
        let hub = Hub::default();
        let live = hub.live("n");
        hub.end("n");
        assert!(*live.ended.borrow());
        assert_eq!(hub.len(), 0);
    }
}
