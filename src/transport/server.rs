//! The HTTP/1.1 connection loop under the Streamable HTTP router: a bound on open
//! connections and timeouts that keep half-open and stalled peers from pinning the server
//! (slow-loris).
//!
//! - at most [`ServeOptions::max_connections`] connections are open; one more is closed at
//!   once (and logged), so that the process never runs out of file descriptors;
//! - a request head must arrive within [`ServeOptions::header_read_timeout`], counted from
//!   the connection's first byte or the end of the previous response, so an idle keep-alive
//!   connection is closed after that time too (hyper's header-read timer);
//! - a response the peer does not read: a write that makes no progress for
//!   [`ServeOptions::idle_timeout`] closes the connection (an SSE stream with keep-alive
//!   comments makes progress as long as its reader reads);
//! - a request body that trickles in is bounded by `HttpConfig::body_timeout` in the
//!   endpoint.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Sleep;

/// Connection-level limits of [`serve_with`]. `Default` suits a server on the internet.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServeOptions {
    /// Connections open at once (default 1,024); keep it below the process's file limit.
    pub max_connections: usize,
    /// Time to receive a request's head (default 10 s); also how long an idle keep-alive
    /// connection stays open.
    pub header_read_timeout: Duration,
    /// Time a response may wait for the peer to read (default 60 s; above the SSE keep-alive
    /// interval).
    pub idle_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

impl ServeOptions {
    /// Sets the bound on open connections.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n;
        self
    }

    /// Sets how long a request head may take (and the keep-alive idle time).
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout;
        self
    }

    /// Sets how long an idle connection stays open.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }
}

/// Serves `router` on `listener` with `options` until `shutdown` resolves, then stops
/// accepting and waits for the open connections to finish their responses.
///
/// Open `subscriptions/listen` streams hold the drain until they end: call
/// [`crate::Runtime::begin_shutdown`] before (or when) `shutdown` resolves so that they send
/// their result and close.
pub async fn serve_with(
    listener: TcpListener,
    router: Router,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::debug!(%addr, ?options, "MCP HTTP transport serving");
    }
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(options.max_connections));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE, ECONNABORTED, ...: nothing to do for this connection; back off a
                // little so that a full file table does not spin the loop.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(%peer, max = options.max_connections, "connection closed: too many open connections");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(StallTimeout::new(stream, options.idle_timeout));
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(options.header_read_timeout)
            .serve_connection(io, TowerToHyperService::new(router.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// A TCP stream whose writes fail once they have made no progress for `timeout` (the peer
/// stopped reading).
struct StallTimeout {
    inner: TcpStream,
    timeout: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl StallTimeout {
    fn new(inner: TcpStream, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            stalled: None,
        }
    }

    fn progressed<T>(
        &mut self,
        ready: Poll<io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<T>> {
        match ready {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let timeout = self.timeout;
                let sleep = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if sleep.as_mut().poll(cx).is_ready() {
                    Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the peer has not read the response for too long",
                    )))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl AsyncRead for StallTimeout {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for StallTimeout {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progressed(r, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progressed(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.progressed(r, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
