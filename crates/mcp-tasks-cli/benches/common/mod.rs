//! What the HTTP benchmarks (`http.rs`, `scale.rs`, `takeover.rs`, `console.rs`) share: the client side of a measurement
//! and waiting for a `serve` child process. Not a bench target itself (a folder module).

use std::net::TcpListener;
use std::time::{Duration, Instant};

use mcp_tasks::client::{CallOutcome, Client, RetryPolicy, TaskHandle};
use serde_json::json;

/// Runs `f` on a fresh single-threaded tokio runtime on its own OS thread: the client side of
/// a measurement keeps to one core, as the external load generator does by default.
pub fn on_client_thread<T: Send + 'static>(
    f: impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = T>>> + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("client runtime")
            .block_on(f())
    })
    .join()
    .expect("client thread")
}

/// A client of `url` with one connection, no retries and a per-request `timeout`.
pub async fn client(url: &str, timeout: Duration) -> Client {
    Client::http(url)
        .expect("client")
        .retry(RetryPolicy::none())
        .timeout(timeout)
        .build()
        .await
        .expect("client build")
}

/// `tools/call` of the bench fixture `sleep_task {"ms": ms}`, which must become a task.
pub async fn create_sleep(client: &Client, ms: u64) -> TaskHandle {
    match client
        .call_tool("sleep_task", json!({ "ms": ms }))
        .await
        .expect("tools/call")
    {
        CallOutcome::Task(handle) => handle,
        CallOutcome::Complete(r) => panic!("sleep_task did not become a task: {r}"),
    }
}

/// A loopback port nobody listens on (for a child server's `--listen`).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Waits until the server at `url` answers `server/discover`, polling every `poll`; panics
/// after `limit`. Each probe is one attempt: the client's own retries (200 ms and more of
/// backoff after a refused connection) would add their waits to the time measured.
pub fn wait_ready(url: &str, limit: Duration, poll: Duration) {
    let url = url.to_owned();
    on_client_thread(move || {
        Box::pin(async move {
            let deadline = Instant::now() + limit;
            loop {
                if let Ok(c) = Client::http(&url)
                    .expect("client")
                    .retry(RetryPolicy::none())
                    .build()
                    .await
                    && c.discover().await.is_ok()
                {
                    return;
                }
                assert!(Instant::now() < deadline, "the server did not start");
                tokio::time::sleep(poll).await;
            }
        })
    })
}

/// Creates `n` long sleeping tasks (8 clients); their ids.
#[allow(
    dead_code,
    reason = "each bench compiles this module; not all create live tasks"
)]
pub fn create_live(url: &str, n: usize) -> Vec<String> {
    let url = url.to_owned();
    on_client_thread(move || {
        Box::pin(async move {
            let workers = (0..8).map(|c| {
                let url = url.clone();
                async move {
                    let client = client(&url, Duration::from_secs(60)).await;
                    let mut ids = Vec::new();
                    for _ in 0..(n / 8 + usize::from(c < n % 8)) {
                        ids.push(create_sleep(&client, 86_400_000).await.id().to_owned());
                    }
                    ids
                }
            });
            futures::future::join_all(workers)
                .await
                .into_iter()
                .flatten()
                .collect()
        })
    })
}
