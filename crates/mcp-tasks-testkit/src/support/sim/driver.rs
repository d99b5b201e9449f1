//! The seeded workload: a client that creates `sim_job` tasks, polls them, answers their
//! input requests, cancels some, and listens to some, recording everything in a [`History`].
//! It talks to a server through a [`Conn`]: in process (`Runtime` handle) or over HTTP.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use mcp_tasks::{Dispatched, Owner, RequestContext, RuntimeHandle};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::Rng;
use super::checker::{Ev, History, Source, answer_for};
use super::linear::{Op, OpSpan};
use crate::sim::{JobSpec, TOOL};

/// The member of a response (or of a streamed message) naming the replica that sent it, when
/// the connection spreads requests over several ([`tag_replica`]).
pub const REPLICA: &str = "_replica";

/// Marks a response or a streamed message as sent by `replica` (read back by the driver for
/// the history).
pub fn tag_replica(mut message: Value, replica: &str) -> Value {
    if let Some(m) = message.as_object_mut() {
        m.insert(REPLICA.to_owned(), Value::String(replica.to_owned()));
    }
    message
}

fn replica_of(message: &Value) -> Option<String> {
    message
        .get(REPLICA)
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// How a driver reaches a server. `Err` is a transport failure (no answer: unknown outcome).
pub trait Conn: Send + Sync + 'static {
    /// Sends a request; its response.
    fn call(&self, message: Value) -> BoxFuture<'static, Result<Value, String>>;
    /// Sends a request answered with a stream (`subscriptions/listen`); the stream's messages.
    fn listen(
        &self,
        message: Value,
    ) -> BoxFuture<'static, Result<BoxStream<'static, Value>, String>>;
}

/// A runtime in this process.
pub struct InProc(pub RuntimeHandle);

impl Conn for InProc {
    fn call(&self, message: Value) -> BoxFuture<'static, Result<Value, String>> {
        let handle = self.0.clone();
        async move {
            handle
                .handle_json(message, &Owner::anonymous())
                .await
                .ok_or_else(|| "no response".to_owned())
        }
        .boxed()
    }

    fn listen(
        &self,
        message: Value,
    ) -> BoxFuture<'static, Result<BoxStream<'static, Value>, String>> {
        let handle = self.0.clone();
        async move {
            match handle
                .dispatch_json(message, &RequestContext::new(Owner::anonymous()))
                .await
            {
                Dispatched::Stream(s) => Ok(s.boxed()),
                other => Err(format!("listen did not stream: {other:?}")),
            }
        }
        .boxed()
    }
}

/// Whether the server incarnation is still "alive" for the client: after a simulated power
/// loss nothing it sends counts as observed.
pub type Alive = Arc<dyn Fn() -> bool + Send + Sync>;

/// An [`Alive`] that never dies (a server no power loss hits).
pub fn always_alive() -> Alive {
    Arc::new(|| true)
}

/// The shape of a driver's workload.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// Most tasks created per run.
    pub max_tasks: usize,
    /// Most steps of one task.
    pub max_steps: u32,
    /// Longest delay of one step, in milliseconds.
    pub max_delay_ms: u64,
    /// Percent of tasks told to fail.
    pub fail_percent: u64,
    /// Percent chance that a step asks for input after it.
    pub input_percent: u64,
    /// Longest pause between actions.
    pub pause_ms: u64,
    /// Bound of one request.
    pub request_timeout: Duration,
}

impl Default for DriverConfig {
    fn default() -> Self {
        Self {
            max_tasks: 12,
            max_steps: 5,
            max_delay_ms: 3,
            fail_percent: 10,
            input_percent: 25,
            pause_ms: 3,
            request_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone)]
struct Known {
    id: String,
    last: Option<Value>,
    /// The server answered "not found" (a lost creation, reported by the checker).
    gone: bool,
}

impl Known {
    fn status(&self) -> &str {
        self.last
            .as_ref()
            .and_then(|l| l.get("status"))
            .and_then(Value::as_str)
            .unwrap_or("working")
    }

    fn terminal(&self) -> bool {
        self.gone || matches!(self.status(), "completed" | "failed" | "cancelled")
    }

    fn pending_keys(&self) -> Vec<String> {
        self.last
            .as_ref()
            .and_then(|l| l.get("inputRequests"))
            .and_then(Value::as_object)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }
}

/// Counters of what a driver did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    /// Requests sent.
    pub requests: u64,
    /// Requests answered with a result.
    pub acked: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Notifications received on listen streams.
    pub notifications: u64,
}

/// The seeded client: creates tasks, polls them, answers their input requests, cancels and listens
/// to some, recording everything in its [`History`].
pub struct Driver {
    rng: Rng,
    /// What it did and saw.
    pub history: Arc<History>,
    cfg: DriverConfig,
    tasks: Vec<Known>,
    created: usize,
    next_id: u64,
    next_stream: u64,
    listeners: Vec<JoinHandle<()>>,
    /// What it did, counted.
    pub counts: Counts,
    notifications: Arc<std::sync::atomic::AtomicU64>,
    /// The interval and replica of the last request answered.
    last_span: Option<OpSpan>,
}

/// A JSON-RPC request of the `2026-07-28` era whose client declares the Tasks extension and
/// elicitation.
pub fn request(id: u64, method: &str, mut params: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": { "io.modelcontextprotocol/tasks": {} },
            "elicitation": {}
        }
    });
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

/// What a request came back with.
enum Answer {
    Result(Value),
    Error(Value),
    /// Transport failure, timeout, or the incarnation died before the answer counted.
    Nothing,
}

impl Driver {
    /// A driver drawing its actions from `rng` and recording in `history`.
    pub fn new(rng: Rng, history: Arc<History>, cfg: DriverConfig) -> Self {
        Self {
            rng,
            history,
            cfg,
            tasks: Vec::new(),
            created: 0,
            next_id: 1,
            next_stream: 1,
            listeners: Vec::new(),
            counts: Counts::default(),
            notifications: Arc::default(),
            last_span: None,
        }
    }

    /// How many tasks it created.
    pub fn known_tasks(&self) -> usize {
        self.tasks.len()
    }

    async fn send(
        &mut self,
        conn: &dyn Conn,
        method: &str,
        params: Value,
        alive: &Alive,
    ) -> Answer {
        let id = self.next_id;
        self.next_id += 1;
        self.counts.requests += 1;
        self.last_span = None;
        let invoked = Instant::now();
        let call = conn.call(request(id, method, params));
        let answer = match tokio::time::timeout(self.cfg.request_timeout, call).await {
            Ok(Ok(v)) => v,
            _ => return Answer::Nothing,
        };
        if !alive() {
            return Answer::Nothing;
        }
        self.last_span = Some(OpSpan {
            invoked,
            completed: Instant::now(),
            replica: replica_of(&answer),
        });
        if let Some(r) = answer.get("result") {
            self.counts.acked += 1;
            Answer::Result(r.clone())
        } else {
            self.counts.errors += 1;
            Answer::Error(answer.get("error").cloned().unwrap_or(answer))
        }
    }

    fn observe(&mut self, task: &str, epoch: u32, source: Source, object: Value) {
        if let Some(k) = self.tasks.iter_mut().find(|k| k.id == task) {
            let newer = match (&k.last, source != Source::Create) {
                (None, _) => true,
                (Some(_), false) => false,
                (Some(l), true) => {
                    super::checker::updated_ms(&object) >= super::checker::updated_ms(l)
                }
            };
            if newer {
                k.last = Some(object.clone());
            }
        }
        if let Some(span) = self.last_span.take() {
            self.history.push(Ev::Timed {
                task: task.to_owned(),
                span,
                op: Op::Read(object.clone()),
            });
        }
        self.history.push(Ev::Observed {
            task: task.to_owned(),
            epoch,
            source,
            object,
        });
    }

    fn random_spec(&mut self) -> JobSpec {
        let steps = self.rng.range(1, u64::from(self.cfg.max_steps) + 1) as u32;
        let mut inputs = BTreeSet::new();
        for i in 0..steps {
            if self.rng.chance(self.cfg.input_percent) {
                inputs.insert(i);
            }
        }
        JobSpec {
            steps,
            inputs,
            fail: self.rng.chance(self.cfg.fail_percent),
            delay_ms: self.rng.range(0, self.cfg.max_delay_ms + 1),
        }
    }

    async fn create(&mut self, conn: &dyn Conn, epoch: u32, alive: &Alive) {
        let spec = self.random_spec();
        let params = json!({ "name": TOOL, "arguments": spec.to_arguments() });
        if let Answer::Result(r) = self.send(conn, "tools/call", params, alive).await
            && let Some(id) = r.get("taskId").and_then(Value::as_str)
        {
            let id = id.to_owned();
            self.created += 1;
            self.tasks.push(Known {
                id: id.clone(),
                last: None,
                gone: false,
            });
            self.history.push(Ev::CreateAcked {
                task: id.clone(),
                epoch,
                spec,
            });
            self.observe(&id, epoch, Source::Create, r);
        }
    }

    fn pick(&mut self, pred: impl Fn(&Known) -> bool) -> Option<String> {
        let ids: Vec<String> = self
            .tasks
            .iter()
            .filter(|k| pred(k))
            .map(|k| k.id.clone())
            .collect();
        self.rng.pick(&ids).cloned()
    }

    async fn poll(&mut self, conn: &dyn Conn, task: &str, epoch: u32, alive: &Alive) {
        match self
            .send(conn, "tasks/get", json!({ "taskId": task }), alive)
            .await
        {
            Answer::Result(r) => self.observe(task, epoch, Source::Get, r),
            Answer::Error(e) => {
                let msg = e.get("message").and_then(Value::as_str).unwrap_or("");
                if msg.contains("not found") {
                    if let Some(k) = self.tasks.iter_mut().find(|k| k.id == task) {
                        k.gone = true;
                    }
                    self.history.push(Ev::NotFound {
                        task: task.to_owned(),
                        epoch,
                    });
                }
            }
            Answer::Nothing => {}
        }
    }

    async fn answer(&mut self, conn: &dyn Conn, task: &str, epoch: u32, alive: &Alive) {
        let keys = self
            .tasks
            .iter()
            .find(|k| k.id == task)
            .map(Known::pending_keys)
            .unwrap_or_default();
        if keys.is_empty() {
            return;
        }
        let responses: serde_json::Map<String, Value> = keys
            .iter()
            .map(|k| (k.clone(), answer_for(task, k)))
            .collect();
        self.history.push(Ev::UpdateSent {
            task: task.to_owned(),
            keys: keys.clone(),
        });
        let params = json!({ "taskId": task, "inputResponses": responses });
        if let Answer::Result(_) = self.send(conn, "tasks/update", params, alive).await {
            if let Some(span) = self.last_span.take() {
                self.history.push(Ev::Timed {
                    task: task.to_owned(),
                    span,
                    op: Op::Update(keys.clone()),
                });
            }
            self.history.push(Ev::UpdateAcked {
                task: task.to_owned(),
                epoch,
                keys,
            });
        }
    }

    async fn cancel(&mut self, conn: &dyn Conn, task: &str, epoch: u32, alive: &Alive) {
        self.history.push(Ev::CancelSent {
            task: task.to_owned(),
        });
        if let Answer::Result(_) = self
            .send(conn, "tasks/cancel", json!({ "taskId": task }), alive)
            .await
        {
            self.history.push(Ev::CancelAcked {
                task: task.to_owned(),
                epoch,
            });
        }
    }

    async fn listen(&mut self, conn: &dyn Conn, epoch: u32, alive: &Alive) {
        let mut ids = Vec::new();
        for _ in 0..3 {
            if let Some(id) = self.pick(|k| !k.terminal())
                && !ids.contains(&id)
            {
                ids.push(id);
            }
        }
        if ids.is_empty() {
            return;
        }
        let stream_no = self.next_stream;
        self.next_stream += 1;
        let id = self.next_id;
        self.next_id += 1;
        let msg = request(
            id,
            "subscriptions/listen",
            json!({ "notifications": { "taskIds": ids } }),
        );
        let Ok(Ok(mut stream)) =
            tokio::time::timeout(self.cfg.request_timeout, conn.listen(msg)).await
        else {
            return;
        };
        let history = self.history.clone();
        let alive = alive.clone();
        let count = self.notifications.clone();
        self.listeners.push(tokio::spawn(async move {
            while let Some(m) = stream.next().await {
                if !alive() {
                    return;
                }
                if m.get("method").and_then(Value::as_str) == Some("notifications/tasks")
                    && let Some(task) = m["params"]["taskId"].as_str()
                {
                    count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    history.push(Ev::Timed {
                        task: task.to_owned(),
                        span: OpSpan::received(replica_of(&m)),
                        op: Op::Notified(m["params"].clone()),
                    });
                    history.push(Ev::Observed {
                        task: task.to_owned(),
                        epoch,
                        source: Source::Notification(stream_no),
                        object: m["params"].clone(),
                    });
                }
            }
        }));
    }

    /// One seeded action. `false` once the incarnation is dead.
    pub async fn act(&mut self, conn: &dyn Conn, epoch: u32, alive: &Alive) -> bool {
        if !alive() {
            return false;
        }
        let roll = self.rng.range(0, 100);
        let waiting = self.pick(|k| k.status() == "input_required");
        match roll {
            0..20 if self.created < self.cfg.max_tasks => self.create(conn, epoch, alive).await,
            20..45 if waiting.is_some() => {
                let task = waiting.unwrap_or_default();
                self.answer(conn, &task, epoch, alive).await;
            }
            45..49 => {
                if let Some(task) = self.pick(|k| !k.terminal()) {
                    self.cancel(conn, &task, epoch, alive).await;
                }
            }
            49..53 => self.listen(conn, epoch, alive).await,
            53..90 => {
                let task = match self.pick(|k| !k.terminal()) {
                    Some(t) => Some(t),
                    None => self.pick(|_| true),
                };
                if let Some(task) = task {
                    self.poll(conn, &task, epoch, alive).await;
                }
            }
            _ => {
                let ms = self.rng.range(0, self.cfg.pause_ms + 1);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
        }
        alive()
    }

    /// Up to `actions` seeded actions; stops early when the incarnation dies.
    pub async fn run(
        &mut self,
        conn: &dyn Conn,
        epoch: u32,
        actions: usize,
        alive: &Alive,
    ) -> bool {
        for _ in 0..actions {
            if !self.act(conn, epoch, alive).await {
                return false;
            }
        }
        true
    }

    /// Drives every known task to a terminal state (answering what it asks), polling until
    /// `bound`. Records [`Ev::Unfinished`] for the tasks that did not make it.
    pub async fn settle(&mut self, conn: &dyn Conn, epoch: u32, bound: Duration, alive: &Alive) {
        let deadline = Instant::now() + bound;
        loop {
            let open: Vec<String> = self
                .tasks
                .iter()
                .filter(|k| !k.terminal())
                .map(|k| k.id.clone())
                .collect();
            if open.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                for k in self.tasks.iter().filter(|k| !k.terminal()) {
                    self.history.push(Ev::Unfinished {
                        task: k.id.clone(),
                        last: k.last.clone().unwrap_or(Value::Null),
                    });
                }
                return;
            }
            for task in open {
                self.poll(conn, &task, epoch, alive).await;
                let waiting = self
                    .tasks
                    .iter()
                    .any(|k| k.id == task && k.status() == "input_required");
                if waiting {
                    self.answer(conn, &task, epoch, alive).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Ends the listen streams of this incarnation.
    pub fn stop_listeners(&mut self) {
        for l in self.listeners.drain(..) {
            l.abort();
        }
        self.counts.notifications = self
            .notifications
            .load(std::sync::atomic::Ordering::Relaxed);
    }
}
