//! The HTTP/1.1 connection loop under the Streamable HTTP router: a bound on open
//! connections and timeouts that keep half-open and stalled peers from pinning the server
//! (slow-loris).
//!
//! - at most [`ServeOptions::max_connections`] connections are open, so that the process
//!   never runs out of file descriptors. When they are all taken, a new connection closes the
//!   oldest *idle unauthenticated* one (no request of it has authenticated, none is in
//!   progress) to make room; with none of those, the new connection is closed at once (and
//!   logged);
//! - one peer address (an IPv6 peer: its /64) holds at most
//!   [`ServeOptions::max_unauthenticated_per_address`] connections that have not
//!   authenticated yet: one more closes that address's oldest idle one, or is closed itself.
//!   So clients that never authenticate cannot take every slot;
//! - once a request on a connection has authenticated, the connection counts for that
//!   principal (until it closes), at most [`ServeOptions::max_connections_per_principal`]; a
//!   request that would bind one more is `429` (quota `connections`) and its connection is
//!   closed after the answer;
//! - a request head must arrive within [`ServeOptions::header_read_timeout`], counted from
//!   the connection's first byte or the end of the previous response, so an idle keep-alive
//!   connection is closed after that time too (hyper's header-read timer);
//! - a response the peer does not read: a write that makes no progress for
//!   [`ServeOptions::idle_timeout`] closes the connection (an SSE stream with keep-alive
//!   comments makes progress as long as its reader reads);
//! - a request body that trickles in is bounded by `HttpConfig::body_timeout` in the
//!   endpoint.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::Sleep;

use crate::task::Owner;

/// Connection-level limits of [`serve_with`]. `Default` suits a server on the internet.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServeOptions {
    /// Connections open at once (default 1,024); keep it below the process's file limit.
    pub max_connections: usize,
    /// Connections one peer address (an IPv6 peer: its /64 prefix) may hold before a request
    /// on them has authenticated. Unlimited by default (an embedder decides; `mcp-tasks
    /// serve` uses 64). Behind a reverse proxy every connection comes from the proxy's
    /// address: leave it unlimited or high there.
    pub max_unauthenticated_per_address: usize,
    /// Connections one principal may hold once a request on them has authenticated.
    /// Unlimited by default (an embedder decides; `mcp-tasks serve` uses 256).
    pub max_connections_per_principal: usize,
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
            max_unauthenticated_per_address: usize::MAX,
            max_connections_per_principal: usize::MAX,
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

    /// Sets the bound on connections of one peer address that have not authenticated yet.
    pub fn max_unauthenticated_per_address(mut self, n: usize) -> Self {
        self.max_unauthenticated_per_address = n;
        self
    }

    /// Sets the bound on connections one principal holds.
    pub fn max_connections_per_principal(mut self, n: usize) -> Self {
        self.max_connections_per_principal = n;
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
    let registry = Arc::new(Registry::new(&options));
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
        let (slot, closed) = match registry.admit(peer.ip()) {
            Ok(admitted) => admitted,
            Err(refusal) => {
                tracing::warn!(%peer, %refusal, "connection closed");
                drop(stream);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(StallTimeout::new(stream, options.idle_timeout));
        let service = {
            let router = router.clone();
            let slot = slot.clone();
            hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
                let mut router = router.clone();
                let busy = slot.busy();
                request.extensions_mut().insert(slot.clone());
                // The peer's address, as axum's `into_make_service_with_connect_info` gives it:
                // the authentication throttles count failures by it.
                request
                    .extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                async move {
                    let response = tower_service::Service::call(
                        &mut router,
                        request.map(axum::body::Body::new),
                    )
                    .await;
                    drop(busy);
                    response
                }
            })
        };
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(options.header_read_timeout)
            .serve_connection(io, service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            tokio::select! {
                ended = connection => if let Err(e) = ended {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                },
                // Closed to make room (idle and unauthenticated): dropping it closes the socket.
                _ = closed => tracing::debug!(%peer, "idle unauthenticated connection closed to make room"),
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The connection registry

/// Why a new connection was closed at once.
#[derive(Debug)]
enum Refusal {
    /// Every slot is taken and none is idle and unauthenticated.
    Full(usize),
    /// The peer's address holds its most unauthenticated connections, none idle.
    Address(usize),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Full(max) => write!(f, "too many open connections ({max})"),
            Self::Address(max) => write!(
                f,
                "this address already holds {max} connections that have not authenticated"
            ),
        }
    }
}

/// The open connections, by age, with what each is bound to.
struct Registry {
    max_connections: usize,
    max_unauthenticated_per_address: usize,
    max_connections_per_principal: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    /// Open connections by id: ids grow, so the first is the oldest.
    open: BTreeMap<u64, Connection>,
    /// Unauthenticated connections per address key.
    unauthenticated: HashMap<IpAddr, usize>,
    /// Authenticated connections per principal.
    principals: HashMap<Owner, usize>,
}

struct Connection {
    address: IpAddr,
    principal: Option<Owner>,
    /// Requests of this connection being handled.
    busy: usize,
    /// Closes the connection (it is dropped by its task).
    close: Option<oneshot::Sender<()>>,
}

impl Inner {
    /// Forgets connection `id` and what it counted for; `false` if it was already gone.
    fn remove(&mut self, id: u64) -> bool {
        let Some(connection) = self.open.remove(&id) else {
            return false;
        };
        let (map_key, map) = match &connection.principal {
            Some(owner) => {
                decrement(&mut self.principals, owner);
                return true;
            }
            None => (connection.address, &mut self.unauthenticated),
        };
        decrement(map, &map_key);
        true
    }

    /// Closes the oldest idle unauthenticated connection (of `address` when given); `false`
    /// when there is none.
    fn evict_idle(&mut self, address: Option<IpAddr>) -> bool {
        let victim = self
            .open
            .iter()
            .find(|(_, c)| {
                c.principal.is_none() && c.busy == 0 && address.is_none_or(|a| a == c.address)
            })
            .map(|(id, _)| *id);
        let Some(id) = victim else {
            return false;
        };
        if let Some(close) = self.open.get_mut(&id).and_then(|c| c.close.take()) {
            let _ = close.send(());
        }
        self.remove(id)
    }
}

fn decrement<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = map.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(key);
        }
    }
}

/// The key a peer's unauthenticated connections are counted under: its IPv4 address, or the
/// /64 prefix of its IPv6 address (one host usually has a whole /64).
fn address_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

impl Registry {
    fn new(options: &ServeOptions) -> Self {
        Self {
            max_connections: options.max_connections,
            max_unauthenticated_per_address: options.max_unauthenticated_per_address,
            max_connections_per_principal: options.max_connections_per_principal,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a connection from `peer`, closing an idle unauthenticated one to make room when
    /// a limit is reached; the returned receiver fires when the connection is closed that way.
    fn admit(
        self: &Arc<Self>,
        peer: IpAddr,
    ) -> Result<(ConnectionSlot, oneshot::Receiver<()>), Refusal> {
        let address = address_key(peer);
        let mut inner = self.inner();
        let held = inner.unauthenticated.get(&address).copied().unwrap_or(0);
        if held >= self.max_unauthenticated_per_address && !inner.evict_idle(Some(address)) {
            return Err(Refusal::Address(self.max_unauthenticated_per_address));
        }
        if inner.open.len() >= self.max_connections && !inner.evict_idle(None) {
            return Err(Refusal::Full(self.max_connections));
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let (close, closed) = oneshot::channel();
        inner.open.insert(
            id,
            Connection {
                address,
                principal: None,
                busy: 0,
                close: Some(close),
            },
        );
        *inner.unauthenticated.entry(address).or_default() += 1;
        let slot = ConnectionSlot {
            inner: Arc::new(SlotInner {
                registry: self.clone(),
                id,
            }),
        };
        Ok((slot, closed))
    }
}

/// A connection's place in the registry, in each of its requests' extensions; released when
/// the connection's task ends.
#[derive(Clone)]
pub(crate) struct ConnectionSlot {
    inner: Arc<SlotInner>,
}

struct SlotInner {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for SlotInner {
    fn drop(&mut self) {
        self.registry.inner().remove(self.id);
    }
}

/// A request of a connection in progress (the connection is not idle).
struct Busy(ConnectionSlot);

impl Drop for Busy {
    fn drop(&mut self) {
        let slot = &self.0.inner;
        if let Some(c) = slot.registry.inner().open.get_mut(&slot.id) {
            c.busy = c.busy.saturating_sub(1);
        }
    }
}

/// A request that would bind one more connection to a principal holding its most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooManyConnections {
    /// The per-principal limit.
    pub(crate) limit: usize,
}

impl ConnectionSlot {
    fn busy(&self) -> Busy {
        if let Some(c) = self.inner.registry.inner().open.get_mut(&self.inner.id) {
            c.busy += 1;
        }
        Busy(self.clone())
    }

    /// A request on this connection authenticated as `owner`: the connection counts for that
    /// principal from now on (the first principal it authenticated as keeps it), unless the
    /// principal holds its most connections already.
    pub(crate) fn authenticated(&self, owner: &Owner) -> Result<(), TooManyConnections> {
        let registry = &self.inner.registry;
        let mut inner = registry.inner();
        let inner = &mut *inner;
        let Some(connection) = inner.open.get_mut(&self.inner.id) else {
            return Ok(());
        };
        if connection.principal.is_some() {
            return Ok(());
        }
        let held = inner.principals.get(owner).copied().unwrap_or(0);
        if held >= registry.max_connections_per_principal {
            return Err(TooManyConnections {
                limit: registry.max_connections_per_principal,
            });
        }
        // From now on never closed to make room (only unauthenticated ones are).
        connection.principal = Some(owner.clone());
        let address = connection.address;
        decrement(&mut inner.unauthenticated, &address);
        *inner.principals.entry(owner.clone()).or_default() += 1;
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_counted_by_ipv4_address_or_ipv6_prefix() {
        let key = |s: &str| address_key(s.parse().unwrap());
        assert_eq!(key("192.0.2.7"), key("192.0.2.7"));
        assert_ne!(key("192.0.2.7"), key("192.0.2.8"));
        // An IPv4-mapped IPv6 peer is its IPv4 address.
        assert_eq!(key("::ffff:192.0.2.7"), key("192.0.2.7"));
        // One /64 is one peer.
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff::9"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
    }

    #[test]
    fn the_oldest_idle_unauthenticated_connection_makes_room() {
        let registry = Arc::new(Registry::new(
            &ServeOptions::default()
                .max_connections(3)
                .max_unauthenticated_per_address(2),
        ));
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let (first, mut first_closed) = registry.admit(a).unwrap();
        let (second, mut second_closed) = registry.admit(a).unwrap();
        // A third from `a` closes `a`'s oldest idle one.
        let _busy = second.busy();
        let (_third, _) = registry.admit(a).unwrap();
        assert!(first_closed.try_recv().is_ok());
        drop(first);
        // `second` is busy, the third idle: a fourth from `a` closes the third.
        let (fourth, _) = registry.admit(a).unwrap();
        assert!(second_closed.try_recv().is_err());
        // Authenticated connections are never closed to make room.
        second.authenticated(&Owner::new("t", "p")).unwrap();
        fourth.authenticated(&Owner::new("t", "q")).unwrap();
        let (fifth, _) = registry.admit(b).unwrap();
        // Full, and the only unauthenticated one is busy: a new connection is refused.
        let busy = fifth.busy();
        assert!(matches!(registry.admit(b), Err(Refusal::Full(3))));
        // Idle again, it makes room.
        drop(busy);
        assert!(registry.admit(b).is_ok());
    }
}
