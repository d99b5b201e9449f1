//! `mcp_tasks::client` against a real server: over Streamable HTTP on 127.0.0.1 (the same
//! router `mcp-tasks serve` mounts) and in process. Create/poll/complete, two input keys
//! answered by the handler, cancel, watch across cut streams, durable handles after a client
//! restart, typed errors, retries, and a scripted foreign server (pagination, poll interval).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use mcp_tasks::client::{
    CallOutcome, Client, ClientBuilder, ClientError, Response, RetryPolicy, Task, TaskHandle,
    Transport, input_handler,
};
use mcp_tasks::store::{Durability, StoreOptions};
use mcp_tasks::transport::http::{self, HttpConfig};
use mcp_tasks::{Owner, Runtime, TaskStatus};
use mcp_tasks_testkit::fixtures;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// A server

struct Server {
    addr: SocketAddr,
    rt: Option<Runtime>,
    stop: Option<oneshot::Sender<()>>,
    serving: Option<JoinHandle<std::io::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let rt = fixtures::conformance::install(Runtime::builder(dir.path().join("tasks.redb")))
            .store_options(StoreOptions {
                durability: Durability::None,
                ..StoreOptions::default()
            })
            .start()
            .await
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let config = HttpConfig::default().keep_alive(Duration::from_millis(200));
        let router = http::router(rt.handle(), config);
        let (stop, rx) = oneshot::channel::<()>();
        let serving = tokio::spawn(http::serve(listener, router, async {
            let _ = rx.await;
        }));
        Self {
            addr,
            rt: Some(rt),
            stop: Some(stop),
            serving: Some(serving),
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    fn runtime(&self) -> &Runtime {
        self.rt.as_ref().unwrap()
    }

    async fn stop(mut self) {
        if let Some(rt) = &self.rt {
            rt.begin_shutdown();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(serving) = self.serving.take() {
            let _ = tokio::time::timeout(WAIT, serving).await;
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown().await;
        }
    }
}

fn quick_retries() -> RetryPolicy {
    RetryPolicy {
        attempts: 40,
        initial: Duration::from_millis(25),
        max: Duration::from_millis(250),
    }
}

async fn build(builder: ClientBuilder) -> Client {
    builder.retry(quick_retries()).build().await.unwrap()
}

async fn http_client(server: &Server) -> Client {
    build(Client::http(&server.url()).unwrap()).await
}

fn in_process_client(server: &Server) -> ClientBuilder {
    Client::in_process(server.runtime().handle(), Owner::anonymous())
}

fn task(outcome: CallOutcome) -> TaskHandle {
    match outcome {
        CallOutcome::Task(t) => t,
        CallOutcome::Complete(r) => panic!("expected a task, got {r}"),
    }
}

fn text(task: &Task) -> String {
    task.result.as_ref().expect("a result")["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// An input handler that answers `confirm` and `name` and counts its calls per key.
fn counting_handler(
    calls: Arc<Mutex<HashMap<String, usize>>>,
) -> Arc<dyn mcp_tasks::client::InputHandler> {
    input_handler(move |key: String, request: Value| {
        let calls = calls.clone();
        async move {
            assert_eq!(request["method"], "elicitation/create", "{request}");
            *calls.lock().unwrap().entry(key.clone()).or_default() += 1;
            Some(match key.as_str() {
                "confirm" => json!({ "action": "accept", "content": { "confirm": true } }),
                "name" => json!({ "action": "accept", "content": { "name": "Ada" } }),
                "user_name" => json!({ "action": "accept", "content": { "name": "Grace" } }),
                _ => return None,
            })
        }
    })
}

// ---------------------------------------------------------------------------------------------
// The same scenarios over HTTP and in process

async fn create_poll_complete(client: &Client) {
    let discovery = client.discover().await.unwrap();
    assert!(discovery.supports_tasks());
    assert_eq!(discovery.supported_versions, ["2026-07-28"]);
    let tools = client.list_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "slow_compute"), "{tools:?}");

    // A tool that answers at once.
    match client
        .call_tool("greet", json!({ "name": "Ada" }))
        .await
        .unwrap()
    {
        CallOutcome::Complete(r) => assert_eq!(r["content"][0]["text"], "Hello, Ada!"),
        CallOutcome::Task(t) => panic!("greet became task {}", t.id()),
    }
    // A task, polled until it completes.
    let handle = task(
        client
            .call_tool("slow_compute", json!({ "seconds": 1, "label": "x" }))
            .await
            .unwrap(),
    );
    assert_eq!(handle.last_seen().unwrap().status, TaskStatus::Working);
    let got = handle.get().await.unwrap();
    assert_eq!(got.task_id, handle.id());
    let done = tokio::time::timeout(WAIT, handle.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, TaskStatus::Completed);
    assert_eq!(text(&done), "Computed `x` in 1 s.");
}

async fn two_inputs_answered_by_the_handler(make: impl Fn() -> ClientBuilder) {
    let calls = Arc::new(Mutex::new(HashMap::new()));
    let client = build(make().input_handler(counting_handler(calls.clone()))).await;
    let handle = task(client.call_tool("multi_input", json!({})).await.unwrap());
    let done = tokio::time::timeout(WAIT, handle.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, TaskStatus::Completed, "{:?}", done.raw);
    assert_eq!(text(&done), "Received name=Ada, confirm=true.");
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        HashMap::from([("confirm".into(), 1), ("name".into(), 1)])
    );

    // Core MRTR before the task exists: the handler answers the synchronous round too.
    let handle = task(
        client
            .call_tool("test_tool_with_task", json!({}))
            .await
            .unwrap(),
    );
    let done = tokio::time::timeout(WAIT, handle.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(text(&done).contains("Grace"), "{:?}", done.raw);
}

async fn cancel(client: &Client) {
    let handle = task(
        client
            .call_tool("slow_compute", json!({ "seconds": 60 }))
            .await
            .unwrap(),
    );
    handle.cancel().await.unwrap();
    let done = tokio::time::timeout(WAIT, handle.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, TaskStatus::Cancelled);
    // Cancelling a terminal task is acknowledged again.
    handle.cancel().await.unwrap();
}

#[tokio::test]
async fn over_http() {
    let server = Server::start().await;
    let client = http_client(&server).await;
    create_poll_complete(&client).await;
    two_inputs_answered_by_the_handler(|| Client::http(&server.url()).unwrap()).await;
    cancel(&client).await;
    server.stop().await;
}

#[tokio::test]
async fn in_process() {
    let server = Server::start().await;
    let client = build(in_process_client(&server)).await;
    assert_eq!(client.endpoint(), "in-process");
    create_poll_complete(&client).await;
    two_inputs_answered_by_the_handler(|| in_process_client(&server)).await;
    cancel(&client).await;
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Watch

async fn collect_watch(handle: &TaskHandle) -> Vec<Task> {
    let mut states = Vec::new();
    let mut watch = handle.watch();
    while let Some(state) = tokio::time::timeout(WAIT, watch.next()).await.unwrap() {
        states.push(state.unwrap());
    }
    states
}

#[tokio::test]
async fn watch_follows_a_task_over_listen() {
    let server = Server::start().await;
    let client = http_client(&server).await;
    let handle = task(
        client
            .call_tool("slow_compute", json!({ "seconds": 1 }))
            .await
            .unwrap(),
    );
    let states = collect_watch(&handle).await;
    assert_eq!(states.first().unwrap().status, TaskStatus::Working);
    assert_eq!(states.last().unwrap().status, TaskStatus::Completed);
    assert_eq!(text(states.last().unwrap()), "Computed `` in 1 s.");
    // Watching a terminal task yields it once and ends.
    let again = collect_watch(&handle).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].status, TaskStatus::Completed);
    server.stop().await;
}

/// A TCP proxy that can cut every open connection and refuse new ones for a while.
struct Proxy {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accepted: Arc<AtomicUsize>,
    _accept: JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accepted = Arc::new(AtomicUsize::new(0));
        let accept = {
            let (up, conns, accepted) = (up.clone(), conns.clone(), accepted.clone());
            tokio::spawn(async move {
                loop {
                    let Ok((mut inbound, _)) = listener.accept().await else {
                        return;
                    };
                    if !up.load(Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    accepted.fetch_add(1, Ordering::SeqCst);
                    conns.lock().unwrap().push(tokio::spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    }));
                }
            })
        };
        Self {
            addr,
            up,
            conns,
            accepted,
            _accept: accept,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Cuts every open connection; new ones are refused until [`Proxy::up`].
    fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn watch_survives_a_cut_stream_and_keeps_the_final_state() {
    let server = Server::start().await;
    let proxy = Proxy::start(server.addr).await;
    let client = build(Client::http(&proxy.url()).unwrap()).await;
    let observer = build(in_process_client(&server)).await;
    let handle = task(
        client
            .call_tool("slow_compute", json!({ "seconds": 2 }))
            .await
            .unwrap(),
    );
    let mut watch = handle.watch();
    let first = tokio::time::timeout(WAIT, watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.status, TaskStatus::Working);
    // Let the listen stream open, then cut it and keep the server unreachable until the task
    // has completed: the completion is never notified on the cut stream.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = proxy.accepted.load(Ordering::SeqCst);
    proxy.down();
    let done = tokio::time::timeout(WAIT, observer.resume(handle.id()).await.unwrap().wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, TaskStatus::Completed);
    proxy.up();
    let mut states = vec![first];
    while let Some(state) = tokio::time::timeout(WAIT, watch.next()).await.unwrap() {
        states.push(state.expect("no error reaches the watcher"));
    }
    let last = states.last().unwrap();
    assert_eq!(last.status, TaskStatus::Completed, "{states:?}");
    assert_eq!(last.raw, done.raw);
    assert!(
        proxy.accepted.load(Ordering::SeqCst) > before,
        "the client reconnected"
    );
    server.stop().await;
}

/// In process: a transport whose first `cuts` listen streams end right after their
/// acknowledgement, as if the connection dropped.
struct CutListens {
    inner: Arc<dyn Transport>,
    cuts: AtomicUsize,
    listens: AtomicUsize,
}

impl Transport for CutListens {
    fn send(&self, message: Value) -> BoxFuture<'_, Result<Response, ClientError>> {
        Box::pin(async move {
            let listen = message["method"] == "subscriptions/listen";
            let response = self.inner.send(message).await?;
            if !listen {
                return Ok(response);
            }
            self.listens.fetch_add(1, Ordering::SeqCst);
            let cut = self
                .cuts
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            Ok(match response {
                Response::Stream(s) if cut => Response::Stream(
                    s.take(1)
                        .chain(futures::stream::once(async {
                            Err(ClientError::Io {
                                url: "in-process".into(),
                                reason: "cut".into(),
                                source: None,
                            })
                        }))
                        .boxed(),
                ),
                other => other,
            })
        })
    }

    fn endpoint(&self) -> String {
        self.inner.endpoint()
    }
}

#[tokio::test]
async fn watch_reconnects_in_process_after_cut_streams() {
    let server = Server::start().await;
    let transport = Arc::new(CutListens {
        inner: Arc::new(mcp_tasks::client::InProcessTransport::new(
            server.runtime().handle(),
            Owner::anonymous(),
        )),
        cuts: AtomicUsize::new(2),
        listens: AtomicUsize::new(0),
    });
    let client = build(Client::with_transport(transport.clone())).await;
    let handle = task(
        client
            .call_tool("slow_compute", json!({ "seconds": 1 }))
            .await
            .unwrap(),
    );
    let states = collect_watch(&handle).await;
    assert_eq!(states.last().unwrap().status, TaskStatus::Completed);
    assert!(transport.listens.load(Ordering::SeqCst) >= 2);
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Durable handles

#[tokio::test]
async fn durable_handles_survive_a_client_restart() {
    let server = Server::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("handles.redb");

    // First run: create a task, answer one of its two keys, "crash".
    let id = {
        let client = build(Client::http(&server.url()).unwrap().handle_store(&file)).await;
        let handle = task(client.call_tool("multi_input", json!({})).await.unwrap());
        let mut state = handle.get().await.unwrap();
        while state.status != TaskStatus::InputRequired {
            tokio::time::sleep(Duration::from_millis(20)).await;
            state = handle.get().await.unwrap();
        }
        let mut answer = Map::new();
        answer.insert(
            "confirm".into(),
            json!({ "action": "accept", "content": { "confirm": true } }),
        );
        assert_eq!(handle.answer(answer.clone()).await.unwrap(), ["confirm"]);
        // The same key is never sent twice.
        assert!(handle.answer(answer).await.unwrap().is_empty());
        handle.id().to_owned()
    };

    // Second run: the task is listed, resumed, and only the other key is asked.
    let calls = Arc::new(Mutex::new(HashMap::new()));
    let client = build(
        Client::http(&server.url())
            .unwrap()
            .handle_store(&file)
            .input_handler(counting_handler(calls.clone())),
    )
    .await;
    let saved = client.saved_tasks().await.unwrap();
    assert_eq!(saved.len(), 1);
    assert_eq!(saved[0].task_id, id);
    assert_eq!(saved[0].tool, "multi_input");
    assert_eq!(saved[0].answered, ["confirm"]);
    let handle = client.resume(&id).await.unwrap();
    let done = tokio::time::timeout(WAIT, handle.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, TaskStatus::Completed);
    assert_eq!(text(&done), "Received name=Ada, confirm=true.");
    assert_eq!(
        calls.lock().unwrap().clone(),
        HashMap::from([("name".into(), 1)])
    );
    let saved = client.saved_tasks().await.unwrap();
    assert_eq!(saved[0].status, "completed");
    assert!(client.forget(&id).await.unwrap());
    assert!(client.saved_tasks().await.unwrap().is_empty());
    // Another server's tasks are not listed. (redb locks the file: one client at a time.)
    drop(handle);
    drop(client);
    let other = build(in_process_client(&server).handle_store(&file)).await;
    assert!(other.saved_tasks().await.unwrap().is_empty());
    drop(other);
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Errors a person can act on

#[tokio::test]
async fn typed_errors_from_the_server() {
    let server = Server::start().await;
    let client = http_client(&server).await;
    match client
        .call_tool("no_such_tool", json!({}))
        .await
        .unwrap_err()
    {
        ClientError::UnknownTool {
            name, available, ..
        } => {
            assert_eq!(name, "no_such_tool");
            assert!(available.contains(&"greet".to_owned()), "{available:?}");
        }
        other => panic!("{other:?}"),
    }
    // Bad arguments of a listed tool stay InvalidParams.
    let e = client
        .call_tool("slow_compute", json!({ "seconds": "soon" }))
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::InvalidParams(_)), "{e:?}");
    let e = client
        .resume("tsk_00000000000000000000000000000000")
        .await
        .unwrap()
        .get()
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::UnknownTask { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("tsk_00000000000000000000000000000000")
    );
    // A synchronous MRTR round: the capability is missing, then no handler answers.
    let e = client
        .call_tool("test_tool_with_task", json!({}))
        .await
        .unwrap_err();
    assert!(
        matches!(e, ClientError::MissingCapability { ref required, .. } if required["elicitation"].is_object()),
        "{e:?}"
    );
    let client = build(
        Client::http(&server.url())
            .unwrap()
            .capabilities(json!({ "elicitation": {} })),
    )
    .await;
    let e = client
        .call_tool("test_tool_with_task", json!({}))
        .await
        .unwrap_err();
    assert!(
        matches!(e, ClientError::InputRequired { ref requests } if requests.contains_key("user_name")),
        "{e:?}"
    );
    server.stop().await;
}

/// A refused answer, an answer to a key the task does not wait for and a malformed id each
/// have their own error, none of them "unknown task".
#[tokio::test]
async fn refused_answers_and_malformed_ids_are_typed() {
    let server = Server::start().await;
    let client = build(
        Client::http(&server.url())
            .unwrap()
            .capabilities(json!({ "elicitation": {} })),
    )
    .await;
    let handle = task(
        client
            .call_tool("confirm_delete", json!({ "filename": "a.txt" }))
            .await
            .unwrap(),
    );
    // `wait` returns once the task waits for an input this client has no handler for (a read
    // right after the handle may still see `working` on a loaded machine).
    let waiting = handle.wait().await.unwrap();
    assert_eq!(waiting.status, TaskStatus::InputRequired);
    let answer = |key: &str, response: Value| {
        let mut m = Map::new();
        m.insert(key.to_owned(), response);
        m
    };
    // Without `action`: the server refuses it and says why.
    let e = handle
        .answer_outstanding(answer("confirm", json!({ "content": { "confirm": true } })))
        .await
        .unwrap_err();
    match &e {
        ClientError::InvalidAnswer { task_id, error } => {
            assert_eq!(task_id, handle.id());
            assert_eq!(error.code, -32602);
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("`confirm`"), "{e}");
    assert!(e.to_string().contains("action"), "{e}");
    assert!(!e.to_string().contains("Invalid params"), "{e}");
    // Content that does not fit the schema.
    let e = handle
        .answer_outstanding(answer(
            "confirm",
            json!({ "action": "accept", "content": { "confirm": "yes" } }),
        ))
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::InvalidAnswer { .. }), "{e:?}");
    // A key the task does not wait for: nothing is sent, the keys it waits for are named.
    let e = handle
        .answer_outstanding(answer(
            "confrim",
            json!({ "action": "accept", "content": { "confirm": true } }),
        ))
        .await
        .unwrap_err();
    match &e {
        ClientError::UnknownInputKey {
            keys,
            waiting,
            status,
            ..
        } => {
            assert_eq!(keys, &["confrim".to_owned()]);
            assert_eq!(waiting, &["confirm".to_owned()]);
            assert_eq!(status, "input_required");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        e.to_string(),
        format!(
            "task `{}` is not waiting for input `confrim`; it waits for: confirm",
            handle.id()
        )
    );
    // The plain `answer` is what the server sees: it acknowledges the unknown key and
    // ignores it (as the Tasks extension says it should).
    handle
        .answer(answer("confrim", json!({ "ignored": true })))
        .await
        .unwrap();
    assert_eq!(
        handle.get().await.unwrap().status,
        TaskStatus::InputRequired
    );
    // The right key, then the task waits for nothing.
    handle
        .answer_outstanding(answer(
            "confirm",
            json!({ "action": "accept", "content": { "confirm": true } }),
        ))
        .await
        .unwrap();
    let done = handle.wait().await.unwrap();
    assert_eq!(done.status, TaskStatus::Completed);
    let e = handle
        .answer_outstanding(answer("confirm", json!({ "action": "cancel" })))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "task `{}` is not waiting for input `confirm`; it is completed and waits for no input",
            handle.id()
        )
    );
    // A malformed id is not an unknown task (it cannot have been purged).
    let e = client
        .resume("nonsense")
        .await
        .unwrap()
        .get()
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::MalformedTaskId { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("`nonsense` is not a task id: malformed task id"),
        "{e}"
    );
    server.stop().await;
}

#[tokio::test]
async fn connection_refused_is_a_connect_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = Client::http(&format!("http://{addr}/mcp"))
        .unwrap()
        .retry(RetryPolicy::none())
        .build()
        .await
        .unwrap();
    let e = client.list_tools().await.unwrap_err();
    assert!(matches!(e, ClientError::Connect { .. }), "{e:?}");
    assert!(e.to_string().contains("connection refused"), "{e}");
    // The HTTP client's error stays reachable as the cause, down to the OS error.
    let mut causes = Vec::new();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        causes.push(c);
        cause = c.source();
    }
    assert!(
        causes.iter().any(
            |c| c.downcast_ref::<std::io::Error>().map(std::io::Error::kind)
                == Some(std::io::ErrorKind::ConnectionRefused)
        ),
        "{e:?}"
    );
    assert!(matches!(
        Client::http("ftp://127.0.0.1/mcp").unwrap_err(),
        ClientError::InvalidUrl { .. }
    ));
    assert!(
        Client::http("https://127.0.0.1/mcp").is_ok(),
        "TLS is built in"
    );
    assert!(matches!(
        Client::http("not a url").unwrap_err(),
        ClientError::InvalidUrl { .. }
    ));
}

/// Answers every request with `401` and a `WWW-Authenticate` challenge, and hands the head
/// of each request it read to the test.
async fn unauthorized_stub() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Read the head and the body (Content-Length).
                loop {
                    let n = socket.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text
                            .lines()
                            .find_map(|l| {
                                let (n, v) = l.split_once(':')?;
                                n.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            let _ = tx.send(text[..end].to_owned());
                            break;
                        }
                    }
                }
                let _ = socket
                    .write_all(
                        b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer resource_metadata=\"http://127.0.0.1:9/.well-known/oauth-protected-resource/mcp\"\r\ncontent-length: 0\r\n\r\n",
                    )
                    .await;
            });
        }
    });
    (addr, rx)
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[tokio::test]
async fn unauthorized_names_the_resource_metadata_and_headers_are_set() {
    let (addr, mut heads) = unauthorized_stub().await;
    let client = Client::http(&format!("http://{addr}/mcp"))
        .unwrap()
        .bearer_token("s3cret")
        .retry(RetryPolicy::none())
        .build()
        .await
        .unwrap();
    let e = client.call_tool("grüßen", json!({})).await.unwrap_err();
    match &e {
        ClientError::Unauthorized {
            resource_metadata,
            token_sent,
            ..
        } => {
            assert_eq!(
                resource_metadata.as_deref(),
                Some("http://127.0.0.1:9/.well-known/oauth-protected-resource/mcp")
            );
            assert!(token_sent);
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("oauth-protected-resource"), "{e}");
    let head = heads.recv().await.unwrap();
    assert!(head.starts_with("POST /mcp HTTP/1.1"), "{head}");
    assert_eq!(header(&head, "authorization"), Some("Bearer s3cret"));
    assert_eq!(header(&head, "mcp-method"), Some("tools/call"));
    assert_eq!(header(&head, "mcp-name"), Some("=?base64?Z3LDvMOfZW4=?="));
    assert_eq!(header(&head, "mcp-protocol-version"), Some("2026-07-28"));
    assert_eq!(
        header(&head, "accept"),
        Some("application/json, text/event-stream")
    );

    let _ = client.resume("tsk_abc").await.unwrap().get().await;
    let head = heads.recv().await.unwrap();
    assert_eq!(header(&head, "mcp-method"), Some("tasks/get"));
    assert_eq!(header(&head, "mcp-name"), Some("tsk_abc"));
    let _ = client.list_tools().await;
    let head = heads.recv().await.unwrap();
    assert_eq!(header(&head, "mcp-method"), Some("tools/list"));
    assert_eq!(header(&head, "mcp-name"), None);
}

// ---------------------------------------------------------------------------------------------
// A scripted server that is not ours

type Script = Box<dyn Fn(&str, &Value) -> Result<Value, ClientError> + Send + Sync>;

struct Scripted {
    script: Script,
    log: Mutex<Vec<(String, tokio::time::Instant)>>,
}

impl Scripted {
    fn new(
        script: impl Fn(&str, &Value) -> Result<Value, ClientError> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            script: Box::new(script),
            log: Mutex::new(Vec::new()),
        })
    }

    fn calls(&self, method: &str) -> Vec<tokio::time::Instant> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, _)| m == method)
            .map(|(_, t)| *t)
            .collect()
    }
}

impl Transport for Scripted {
    fn send(&self, message: Value) -> BoxFuture<'_, Result<Response, ClientError>> {
        Box::pin(async move {
            let method = message["method"].as_str().unwrap().to_owned();
            self.log
                .lock()
                .unwrap()
                .push((method.clone(), tokio::time::Instant::now()));
            let id = message["id"].clone();
            match (self.script)(&method, &message["params"]) {
                Ok(result) => Ok(Response::Message(
                    json!({ "jsonrpc": "2.0", "id": id, "result": result }),
                )),
                Err(e) => match e.rpc_error() {
                    Some(rpc) => Ok(Response::Message(
                        json!({ "jsonrpc": "2.0", "id": id, "error": rpc.to_json() }),
                    )),
                    None => Err(e),
                },
            }
        })
    }

    fn endpoint(&self) -> String {
        "scripted".into()
    }
}

#[tokio::test]
async fn list_tools_follows_next_cursor() {
    let server = Scripted::new(|method, params| {
        assert_eq!(method, "tools/list");
        // No resultType and no cache hints: a sloppy server still works.
        Ok(match params.get("cursor").and_then(Value::as_str) {
            None => {
                json!({ "tools": [{ "name": "a", "inputSchema": {"type":"object"} }], "nextCursor": "p2" })
            }
            Some("p2") => {
                json!({ "tools": [{ "name": "b", "inputSchema": {"type":"object"} }], "nextCursor": "p3" })
            }
            Some("p3") => json!({ "tools": [{ "name": "c", "inputSchema": {"type":"object"} }] }),
            Some(other) => panic!("cursor {other}"),
        })
    });
    let client = Client::with_transport(server.clone())
        .build()
        .await
        .unwrap();
    let names: Vec<String> = client
        .list_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(server.calls("tools/list").len(), 3);
}

#[tokio::test(start_paused = true)]
async fn wait_honours_poll_interval_ms() {
    let polls = Arc::new(AtomicUsize::new(0));
    let p = polls.clone();
    let server = Scripted::new(move |method, params| {
        Ok(match method {
            "tools/call" => {
                json!({ "resultType": "task", "taskId": "t1", "status": "working", "pollIntervalMs": 5000 })
            }
            "tasks/get" => {
                assert_eq!(params["taskId"], "t1");
                let n = p.fetch_add(1, Ordering::SeqCst);
                if n < 3 {
                    json!({ "resultType": "complete", "taskId": "t1", "status": "working", "pollIntervalMs": 5000 - 1000 * n })
                } else {
                    json!({ "resultType": "complete", "taskId": "t1", "status": "completed", "result": { "content": [] } })
                }
            }
            other => panic!("{other}"),
        })
    });
    let client = Client::with_transport(server.clone())
        .build()
        .await
        .unwrap();
    let handle = task(client.call_tool("x", json!({})).await.unwrap());
    let done = handle.wait().await.unwrap();
    assert_eq!(done.status, TaskStatus::Completed);
    let gets = server.calls("tasks/get");
    let gaps: Vec<u128> = gets.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect();
    assert_eq!(gaps, [5000, 4000, 3000]);
}

#[tokio::test(start_paused = true)]
async fn watch_polls_when_listen_is_not_implemented() {
    let polls = Arc::new(AtomicUsize::new(0));
    let p = polls.clone();
    let server = Scripted::new(move |method, _| match method {
        "subscriptions/listen" => Err(ClientError::MethodNotFound {
            method: method.into(),
            error: Box::new(mcp_tasks::RpcError::method_not_found(method)),
        }),
        "tasks/get" => {
            let n = p.fetch_add(1, Ordering::SeqCst);
            let status = if n < 2 { "working" } else { "failed" };
            let n = if n < 2 { 0 } else { n };
            Ok(
                json!({ "taskId": "t2", "status": status, "pollIntervalMs": 700,
                        "lastUpdatedAt": format!("2026-01-01T00:00:0{}Z", n.min(2)),
                        "error": { "code": -32603, "message": "boom" } }),
            )
        }
        other => panic!("{other}"),
    });
    let client = Client::with_transport(server.clone())
        .build()
        .await
        .unwrap();
    let handle = client.resume("t2").await.unwrap();
    let states: Vec<Task> = handle.watch().map(Result::unwrap).collect().await;
    let statuses: Vec<TaskStatus> = states.iter().map(|t| t.status).collect();
    assert_eq!(statuses, [TaskStatus::Working, TaskStatus::Failed]);
    assert_eq!(states[1].error.as_ref().unwrap().message, "boom");
    assert_eq!(server.calls("subscriptions/listen").len(), 1);
    let gets = server.calls("tasks/get");
    assert!(
        gets.windows(2)
            .skip(1)
            .all(|w| (w[1] - w[0]).as_millis() == 700)
    );
}

/// Fails the first `failures` sends of every method with a connection error.
struct Flaky {
    inner: Arc<Scripted>,
    failures: usize,
    seen: Mutex<HashMap<String, usize>>,
}

impl Transport for Flaky {
    fn send(&self, message: Value) -> BoxFuture<'_, Result<Response, ClientError>> {
        Box::pin(async move {
            let method = message["method"].as_str().unwrap().to_owned();
            let n = {
                let mut seen = self.seen.lock().unwrap();
                let n = seen.entry(method).or_default();
                *n += 1;
                *n
            };
            if n <= self.failures {
                return Err(ClientError::Connect {
                    url: "flaky".into(),
                    reason: "connection refused".into(),
                    source: None,
                });
            }
            self.inner.send(message).await
        })
    }

    fn endpoint(&self) -> String {
        "flaky".into()
    }
}

#[tokio::test(start_paused = true)]
async fn transport_errors_are_retried_for_reads_never_for_creates() {
    let server = Scripted::new(|method, _| {
        Ok(match method {
            "tasks/get" => json!({ "taskId": "t3", "status": "working" }),
            "tools/call" => json!({ "content": [] }),
            other => panic!("{other}"),
        })
    });
    let flaky = Arc::new(Flaky {
        inner: server.clone(),
        failures: 2,
        seen: Mutex::default(),
    });
    let client = Client::with_transport(flaky.clone()).build().await.unwrap();
    let got = client.resume("t3").await.unwrap().get().await.unwrap();
    assert_eq!(got.status, TaskStatus::Working);
    assert_eq!(flaky.seen.lock().unwrap()["tasks/get"], 3);
    let e = client.call_tool("x", json!({})).await.unwrap_err();
    assert!(matches!(e, ClientError::Connect { .. }));
    assert_eq!(
        flaky.seen.lock().unwrap()["tools/call"],
        1,
        "a create is never retried"
    );
    assert!(server.calls("tools/call").is_empty());
}

/// A server whose listen acknowledges no task: the client polls instead.
struct NoTaskAcks {
    gets: AtomicUsize,
    listens: AtomicUsize,
}

impl Transport for NoTaskAcks {
    fn send(&self, message: Value) -> BoxFuture<'_, Result<Response, ClientError>> {
        Box::pin(async move {
            let id = message["id"].clone();
            match message["method"].as_str().unwrap() {
                "subscriptions/listen" => {
                    self.listens.fetch_add(1, Ordering::SeqCst);
                    let ack = json!({
                        "jsonrpc": "2.0",
                        "method": "notifications/subscriptions/acknowledged",
                        "params": { "notifications": {} }
                    });
                    // The stream stays open: the client must not wait on it.
                    Ok(Response::Stream(
                        futures::stream::once(async move { Ok(ack) })
                            .chain(futures::stream::pending())
                            .boxed(),
                    ))
                }
                "tasks/get" => {
                    let n = self.gets.fetch_add(1, Ordering::SeqCst);
                    let status = if n < 3 { "working" } else { "cancelled" };
                    Ok(Response::Message(
                        json!({ "jsonrpc": "2.0", "id": id, "result": {
                            "resultType": "complete", "taskId": "t4", "status": status,
                            "pollIntervalMs": 300, "lastUpdatedAt": format!("2026-01-01T00:00:0{}Z", n.min(3))
                        }}),
                    ))
                }
                other => panic!("{other}"),
            }
        })
    }

    fn endpoint(&self) -> String {
        "no-task-acks".into()
    }
}

#[tokio::test(start_paused = true)]
async fn watch_polls_when_the_task_is_not_acknowledged() {
    let server = Arc::new(NoTaskAcks {
        gets: AtomicUsize::new(0),
        listens: AtomicUsize::new(0),
    });
    let client = Client::with_transport(server.clone())
        .build()
        .await
        .unwrap();
    let handle = client.resume("t4").await.unwrap();
    let states: Vec<Task> = handle.watch().map(Result::unwrap).collect().await;
    assert_eq!(states.last().unwrap().status, TaskStatus::Cancelled);
    assert_eq!(
        server.listens.load(Ordering::SeqCst),
        1,
        "asked once, then polled"
    );
    assert_eq!(server.gets.load(Ordering::SeqCst), 4);
}
