//! The stdio transport: newline-delimited JSON-RPC on a byte stream pair (MCP `2026-07-28` transports: stdio).
//!
//! One message per line in, one compact JSON message per line out. Every message is handled
//! on its own tokio task, so a slow `tools/call` or an open `subscriptions/listen` stream never
//! holds up the others; everything written goes through a single writer task, so lines never
//! interleave. A listen stream is registered under its request id: a
//! `notifications/cancelled` naming that id ends it (MCP `2026-07-28` cancellation) and nothing more is sent
//! for it. A cancelled ordinary request still runs to completion inside the runtime (its
//! effects are durable like any other), but its response is not sent.
//!
//! Lines that cannot be read get a JSON-RPC error without an `id`: `-32700` for invalid
//! UTF-8 or JSON, `-32600` for a line longer than the message limit (4 MiB), which is skipped
//! without being buffered. At the end of the input the transport stops reading, drops the open
//! listen streams, waits until every request in flight has written its response, and returns.
//!
//! A client that opens with a legacy `initialize` (`2025-11-25`, `2025-06-18`) makes the
//! connection its session: from then on every message that does not declare the
//! `2026-07-28` era goes to the legacy adapter ([`crate::legacy`]), which may write
//! server-to-client requests and notifications between responses; the client's responses to
//! those requests come back as lines like any other message.
//!
//! Nothing but protocol messages is written to the output; logs go through `tracing`.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tokio::task::{JoinError, JoinSet};
use tokio_util::bytes::{Bytes, BytesMut};
use tokio_util::codec::{AnyDelimiterCodec, AnyDelimiterCodecError, Decoder, FramedRead};

use crate::era::{Binding, Context, Entry, Era, Message, Outcome};
use crate::legacy::{Live, Session};
use crate::runtime::RuntimeHandle;
use crate::task::Owner;
use crate::wire::error::RpcError;
use crate::wire::jsonrpc;
use crate::wire::limits::MAX_MESSAGE_BYTES;
use crate::wire::methods;

/// Most requests handled at once; reading pauses beyond that (listen streams do not count
/// once they are streaming).
const MAX_IN_FLIGHT: usize = 256;
/// Encoded lines waiting for the writer.
const OUTPUT_QUEUE: usize = 256;
/// How long, after the shutdown signal, listen streams get to send their final result.
const LISTEN_GRACE: Duration = Duration::from_secs(5);

/// Serves newline-delimited JSON-RPC from `input` to `output` until the input ends, on behalf
/// of `owner` (a stdio peer has no authentication: typically [`Owner::anonymous`]).
///
/// Returns once the input ended and every response owed has been written and flushed; open
/// listen streams are dropped then. An error reading the input or writing the output ends
/// serving and is returned.
pub async fn serve<R, W>(handle: RuntimeHandle, owner: Owner, input: R, output: W) -> io::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    serve_with_shutdown(handle, owner, input, output, std::future::pending()).await
}

/// Like [`serve`], and also stops reading when `shutdown` completes (a signal). Then it waits
/// for the requests in flight and gives open listen streams up to 5 s to end by themselves
/// before dropping them: call [`crate::Runtime::begin_shutdown`] before (or when) `shutdown`
/// completes so that they send their result and end.
pub async fn serve_with_shutdown<R, W, S>(
    handle: RuntimeHandle,
    owner: Owner,
    input: R,
    output: W,
    shutdown: S,
) -> io::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
    S: Future<Output = ()> + Send,
{
    let (out, rx) = mpsc::channel::<Vec<u8>>(OUTPUT_QUEUE);
    let mut writer = tokio::spawn(write_lines(output, rx));
    let mut server = Server {
        entry: Arc::new(Entry::new(handle)),
        session: None,
        owner,
        out,
        registry: Arc::new(Mutex::new(Registry::default())),
        permits: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
        stop_streams: watch::channel(false).0,
        jobs: JoinSet::new(),
    };
    let mut reader = lines(input);
    let mut shutdown = std::pin::pin!(shutdown);
    tracing::info!("serving JSON-RPC on stdio");

    let end = loop {
        server.reap();
        let line = tokio::select! {
            line = reader.next() => line.transpose(),
            () = &mut shutdown => break End::Shutdown,
            written = &mut writer => break End::WriterStopped(flatten(written)),
        };
        match line {
            Ok(None) => break End::Eof,
            Ok(Some(Line::TooLong)) => {
                tracing::warn!(
                    limit = MAX_MESSAGE_BYTES,
                    "input line longer than the message limit skipped"
                );
                let error = RpcError::invalid_request(format!(
                    "message exceeds the limit of {MAX_MESSAGE_BYTES} bytes"
                ));
                server.send_error(&error).await;
            }
            Ok(Some(Line::Message(bytes))) => {
                let accepted = tokio::select! {
                    accepted = server.accept(&bytes) => accepted,
                    () = &mut shutdown => break End::Shutdown,
                };
                if !accepted {
                    // The writer is gone: its error (if any) is returned below.
                    break End::WriterStopped(flatten((&mut writer).await));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the input failed");
                break End::ReadFailed(e);
            }
        }
    };
    drop(reader);
    finish(server, end, writer).await
}

/// Ends serving after the read loop ended for `end`: the requests in flight are answered
/// (open listen streams end, given a grace at a shutdown), the output is flushed, and the
/// first error of reading or writing is returned.
async fn finish(
    server: Server,
    end: End,
    writer: tokio::task::JoinHandle<io::Result<()>>,
) -> io::Result<()> {
    // The connection was the legacy session: its in-process state goes (tasks stay).
    if let Some(session) = &server.session {
        server.entry.forget(session);
    }
    let Server {
        out,
        stop_streams,
        mut jobs,
        ..
    } = server;
    match &end {
        End::WriterStopped(_) => jobs.shutdown().await,
        End::Shutdown => {
            tracing::info!("stdio: shutting down");
            // The runtime is closing: listen streams send their result and end by themselves.
            if tokio::time::timeout(LISTEN_GRACE, join_all(&mut jobs))
                .await
                .is_err()
            {
                tracing::warn!("streams still open after the grace period; dropped");
                stop_streams.send_replace(true);
                join_all(&mut jobs).await;
            }
        }
        End::Eof | End::ReadFailed(_) => {
            tracing::info!("stdio: input closed");
            // Streams end; requests (listen requests not streaming yet too) are answered.
            stop_streams.send_replace(true);
            join_all(&mut jobs).await;
        }
    }
    drop(out);
    let (written, read) = match end {
        End::WriterStopped(result) => (result, Ok(())),
        End::ReadFailed(e) => (flatten(writer.await), Err(e)),
        End::Eof | End::Shutdown => (flatten(writer.await), Ok(())),
    };
    if let Err(e) = &written {
        tracing::warn!(error = %e, "writing the output failed");
    }
    read.and(written)
}

/// Why the read loop ended.
enum End {
    Eof,
    Shutdown,
    ReadFailed(io::Error),
    WriterStopped(io::Result<()>),
}

fn flatten(joined: Result<io::Result<()>, JoinError>) -> io::Result<()> {
    joined.unwrap_or_else(|e| Err(io::Error::other(format!("the stdio writer failed: {e}"))))
}

async fn join_all(set: &mut JoinSet<()>) {
    while let Some(joined) = set.join_next().await {
        log_join(joined);
    }
}

fn log_join(joined: Result<(), JoinError>) {
    if let Err(e) = joined
        && e.is_panic()
    {
        tracing::error!(error = %e, "a stdio request task panicked");
    }
}

/// The state of the read loop.
struct Server {
    /// The one entry of both protocol eras.
    entry: Arc<Entry>,
    /// Set once the client opened with a legacy `initialize`: the connection is its session.
    session: Option<Session>,
    /// Who the peer is.
    owner: Owner,
    out: mpsc::Sender<Vec<u8>>,
    registry: Arc<Mutex<Registry>>,
    permits: Arc<Semaphore>,
    /// Set when open streams are to end without another message.
    stop_streams: watch::Sender<bool>,
    jobs: JoinSet<()>,
}

impl Server {
    /// Forgets finished tasks.
    fn reap(&mut self) {
        while let Some(joined) = self.jobs.try_join_next() {
            log_join(joined);
        }
    }

    /// Writes an error response without an id. `false` when the writer is gone.
    async fn send_error(&self, error: &RpcError) -> bool {
        self.out
            .send(encode(&jsonrpc::error_response(None, error)))
            .await
            .is_ok()
    }

    /// Reads one line and starts handling it. `false` when the writer is gone.
    async fn accept(&mut self, line: &[u8]) -> bool {
        let line = line.trim_ascii();
        if line.is_empty() {
            return true;
        }
        let text = match std::str::from_utf8(line) {
            Ok(text) => text,
            Err(e) => {
                tracing::debug!(error = %e, "input line is not UTF-8");
                return self
                    .send_error(&RpcError::parse_error(format!(
                        "the message is not valid UTF-8 ({e})"
                    )))
                    .await;
            }
        };
        let message: Value = match serde_json::from_str(text) {
            Ok(message) => message,
            Err(e) => {
                tracing::debug!(error = %e, "input line is not JSON");
                return self.send_error(&RpcError::parse_error(e)).await;
            }
        };

        let has_session = self.session.is_some();
        match Era::of(&message, has_session, has_session) {
            Era::Initialize => return self.initialize(message).await,
            Era::Legacy => return self.accept_legacy(message).await,
            Era::Modern => {}
        }
        let method = message.get("method").and_then(Value::as_str);
        let id = message.get("id").filter(|id| is_request_id(id)).cloned();
        if id.is_none()
            && method == Some("notifications/cancelled")
            && let Some(target) = message.pointer("/params/requestId")
        {
            let n = lock(&self.registry).cancel(&key(target));
            tracing::debug!(request = %target, cancelled = n, "notifications/cancelled");
        }
        let is_listen = id.is_some() && method == Some(methods::SUBSCRIPTIONS_LISTEN);
        let registration = id
            .as_ref()
            .map(|id| Registration::new(self.registry.clone(), key(id)));

        let Ok(permit) = self.permits.clone().acquire_owned().await else {
            return true; // never closed
        };
        let job = Job {
            entry: self.entry.clone(),
            ctx: self.context(),
            out: self.out.clone(),
            id,
            registration,
            permit,
            stop: self.stop_streams.subscribe(),
        };
        self.jobs.spawn(job.run(message, is_listen));
        true
    }
}

impl Server {
    /// The era entry's context of a message read now.
    fn context(&self) -> Context {
        Context::new(
            self.owner.clone(),
            true,
            Binding::Connection(self.session.clone()),
        )
    }

    /// A legacy `initialize`: the connection becomes its session, whose standing stream
    /// (task status notifications and input requests of tasks) is written as it comes until
    /// the connection ends. `false` when the writer is gone.
    async fn initialize(&mut self, message: Value) -> bool {
        let (outcome, _) = self
            .entry
            .handle(Message::Json(message), self.context())
            .await;
        let body = match outcome {
            Outcome::Opened {
                body,
                session,
                live,
                ..
            } => {
                let out = self.out.clone();
                self.jobs.spawn(forward_standing(live, out));
                self.session = Some(*session);
                body
            }
            Outcome::Json(body) => body,
            _ => return true,
        };
        self.out.send(encode(&body)).await.is_ok()
    }

    /// Starts handling a message of the connection's legacy session. `false` when the
    /// writer is gone.
    async fn accept_legacy(&mut self, message: Value) -> bool {
        let Ok(permit) = self.permits.clone().acquire_owned().await else {
            return true;
        };
        let entry = self.entry.clone();
        let ctx = self.context();
        let out = self.out.clone();
        self.jobs.spawn(async move {
            let (outcome, _) = entry.handle(Message::Json(message), ctx).await;
            drop(permit);
            match outcome {
                Outcome::Json(body) => {
                    let _ = out.send(encode(&body)).await;
                }
                Outcome::Messages(mut stream) => {
                    while let Some(message) = stream.next().await {
                        if out.send(encode(&message)).await.is_err() {
                            break;
                        }
                    }
                }
                _ => {}
            }
        });
        true
    }
}

/// Writes a session's standing stream until the session ends (or the writer is gone).
async fn forward_standing(live: Arc<Live>, out: mpsc::Sender<Vec<u8>>) {
    let mut ended = live.ended.subscribe();
    let mut standing = std::pin::pin!(live.standing.read(None));
    loop {
        let next = tokio::select! {
            next = standing.next() => next,
            _ = ended.wait_for(|e| *e) => None,
        };
        let Some((_, message)) = next else { break };
        if out.send(encode(&message)).await.is_err() {
            break;
        }
    }
}

/// One incoming message being handled.
struct Job {
    entry: Arc<Entry>,
    ctx: Context,
    out: mpsc::Sender<Vec<u8>>,
    /// The request id (`None` for a notification or an unreadable id).
    id: Option<Value>,
    registration: Option<Registration>,
    permit: OwnedSemaphorePermit,
    stop: watch::Receiver<bool>,
}

impl Job {
    async fn run(mut self, message: Value, cancellable: bool) {
        let dispatch =
            AssertUnwindSafe(self.entry.handle(Message::Json(message), self.ctx)).catch_unwind();
        let dispatched = match (cancellable, self.registration.as_mut()) {
            (true, Some(reg)) => tokio::select! {
                biased;
                () = reg.cancelled() => {
                    tracing::debug!(id = ?self.id, "listen cancelled before it started");
                    return;
                }
                dispatched = dispatch => dispatched,
            },
            _ => dispatch.await,
        };
        let outcome = dispatched.map_or_else(
            |_| {
                tracing::error!(id = ?self.id, "handling a request panicked");
                let error = RpcError::internal("the request could not be handled");
                Outcome::Reply(crate::protocol::Reply::error(self.id.as_ref(), &error))
            },
            |(outcome, _)| outcome,
        );
        drop(self.permit);
        match outcome {
            Outcome::Reply(reply) => {
                if self
                    .registration
                    .as_mut()
                    .is_some_and(|r| r.was_cancelled())
                {
                    tracing::debug!(id = ?self.id, "response to a cancelled request not sent");
                    return;
                }
                let mut line = reply.into_bytes();
                line.push(b'\n');
                let _ = self.out.send(line).await;
            }
            Outcome::Stream(mut stream) => {
                tracing::debug!(id = ?self.id, "stream opened");
                let mut registration = self.registration;
                let mut stop = self.stop;
                loop {
                    // Listen streams end when serving stops; a call streaming its progress
                    // is a request in flight and runs to its response.
                    let next = tokio::select! {
                        biased;
                        () = cancelled(registration.as_mut()) => None,
                        Ok(_) = stop.wait_for(|stop| *stop), if cancellable => None,
                        next = stream.next() => next,
                    };
                    let Some(message) = next else { break };
                    let sent = tokio::select! {
                        biased;
                        () = cancelled(registration.as_mut()) => false,
                        Ok(_) = stop.wait_for(|stop| *stop), if cancellable => false,
                        sent = self.out.send(encode(&message)) => sent.is_ok(),
                    };
                    if !sent {
                        break;
                    }
                }
                tracing::debug!(id = ?self.id, "stream closed");
            }
            // Accepted (a notification): nothing to write. A modern message gets nothing else.
            _ => {}
        }
    }
}

/// Completes when the request is cancelled; never without a registration.
async fn cancelled(registration: Option<&mut Registration>) {
    match registration {
        Some(reg) => reg.cancelled().await,
        None => std::future::pending().await,
    }
}

/// Request ids are strings or integers (JSON-RPC 2.0 as MCP restricts it); anything else is not one.
fn is_request_id(id: &Value) -> bool {
    id.is_string() || id.is_i64() || id.is_u64()
}

/// The registry key of a request id: its JSON text, so `1` and `"1"` differ.
fn key(id: &Value) -> String {
    id.to_string()
}

fn encode(message: &Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(message).unwrap_or_else(|e| {
        tracing::error!(error = %e, "a message could not be serialized");
        let error = RpcError::internal("a message could not be serialized");
        serde_json::to_vec(&jsonrpc::error_response(None, &error)).unwrap_or_default()
    });
    line.push(b'\n');
    line
}

fn lock(registry: &Mutex<Registry>) -> std::sync::MutexGuard<'_, Registry> {
    registry.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Requests in flight and open listen streams by request id, for `notifications/cancelled`.
#[derive(Default)]
struct Registry {
    next: u64,
    by_id: HashMap<String, Vec<(u64, oneshot::Sender<()>)>>,
}

impl Registry {
    /// Cancels every request in flight under `key`; returns how many.
    fn cancel(&mut self, key: &str) -> usize {
        let entries = self.by_id.remove(key).unwrap_or_default();
        let n = entries.len();
        for (_, tx) in entries {
            let _ = tx.send(());
        }
        n
    }
}

/// A request's entry in the registry; removed when dropped.
struct Registration {
    registry: Arc<Mutex<Registry>>,
    key: String,
    token: u64,
    cancel: oneshot::Receiver<()>,
    cancelled: bool,
}

impl Registration {
    fn new(registry: Arc<Mutex<Registry>>, key: String) -> Self {
        let (tx, cancel) = oneshot::channel();
        let token = {
            let mut r = lock(&registry);
            r.next += 1;
            let token = r.next;
            r.by_id.entry(key.clone()).or_default().push((token, tx));
            token
        };
        Self {
            registry,
            key,
            token,
            cancel,
            cancelled: false,
        }
    }

    /// Completes once the request is cancelled (cancel-safe; completes at once afterwards).
    async fn cancelled(&mut self) {
        if !self.cancelled {
            let _ = (&mut self.cancel).await;
            self.cancelled = true;
        }
    }

    fn was_cancelled(&mut self) -> bool {
        if !self.cancelled {
            self.cancelled = !matches!(
                self.cancel.try_recv(),
                Err(oneshot::error::TryRecvError::Empty)
            );
        }
        self.cancelled
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut r = lock(&self.registry);
        if let Some(entries) = r.by_id.get_mut(&self.key) {
            entries.retain(|(token, _)| *token != self.token);
            if entries.is_empty() {
                r.by_id.remove(&self.key);
            }
        }
    }
}

/// One line of input.
#[derive(Debug)]
enum Line {
    Message(Bytes),
    /// A line longer than the limit: skipped, never buffered whole.
    TooLong,
}

/// Splits the input into lines of at most [`MAX_MESSAGE_BYTES`] (without their `\n`; a last
/// line without one counts): `tokio-util`'s delimiter codec, whose over-long error (after
/// which it discards the rest of that line) becomes [`Line::TooLong`] instead of ending the
/// stream.
struct LineCodec(AnyDelimiterCodec);

impl LineCodec {
    fn new() -> Self {
        Self(AnyDelimiterCodec::new_with_max_length(
            b"\n".to_vec(),
            Vec::new(),
            MAX_MESSAGE_BYTES,
        ))
    }

    fn line(decoded: Result<Option<Bytes>, AnyDelimiterCodecError>) -> io::Result<Option<Line>> {
        match decoded {
            Ok(line) => Ok(line.map(Line::Message)),
            Err(AnyDelimiterCodecError::MaxChunkLengthExceeded) => Ok(Some(Line::TooLong)),
            Err(AnyDelimiterCodecError::Io(e)) => Err(e),
        }
    }
}

impl Decoder for LineCodec {
    type Item = Line;
    type Error = io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> io::Result<Option<Line>> {
        Self::line(self.0.decode(buf))
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> io::Result<Option<Line>> {
        Self::line(self.0.decode_eof(buf))
    }
}

/// The input as a cancel-safe stream of [`Line`]s, read 64 KiB at a time.
fn lines<R: AsyncRead>(input: R) -> FramedRead<R, LineCodec> {
    FramedRead::with_capacity(input, LineCodec::new(), 64 * 1024)
}

/// The single writer: lines in arrival order, flushed whenever the queue is empty.
async fn write_lines<W>(output: W, mut lines: mpsc::Receiver<Vec<u8>>) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let mut out = BufWriter::new(output);
    while let Some(line) = lines.recv().await {
        out.write_all(&line).await?;
        while let Ok(line) = lines.try_recv() {
            out.write_all(&line).await?;
        }
        out.flush().await?;
    }
    out.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read_all(input: &[u8]) -> Vec<String> {
        lines(input)
            .map(|line| match line.unwrap() {
                Line::Message(m) => String::from_utf8_lossy(&m).into_owned(),
                Line::TooLong => "too long".to_owned(),
            })
            .collect()
            .await
    }

    #[tokio::test]
    async fn splits_lines_and_skips_long_ones() {
        let mut input = b"a\r\n\nbc".to_vec();
        input.push(b'\n');
        input.extend(std::iter::repeat_n(b'x', MAX_MESSAGE_BYTES + 1));
        input.extend_from_slice(b"\nnext\n");
        // An over-long last line without a newline, many times the limit.
        input.extend(std::iter::repeat_n(b'z', 3 * MAX_MESSAGE_BYTES));
        let got = read_all(&input).await;
        assert_eq!(got, ["a\r", "", "bc", "too long", "next", "too long"]);
    }

    #[tokio::test]
    async fn a_line_at_the_limit_is_kept() {
        let mut input = vec![b'y'; MAX_MESSAGE_BYTES];
        input.extend_from_slice(b"\nlast");
        let got = read_all(&input).await;
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].len(), MAX_MESSAGE_BYTES);
        assert_eq!(got[1], "last");
    }

    /// Skipping an over-long line never holds it: the read buffer stays near the limit
    /// however long the line is.
    #[tokio::test]
    async fn an_endless_line_is_not_buffered() {
        let (mut tx, rx) = tokio::io::duplex(64 * 1024);
        let writer = tokio::spawn(async move {
            let chunk = vec![b'x'; 64 * 1024];
            for _ in 0..(8 * MAX_MESSAGE_BYTES / chunk.len()) {
                tx.write_all(&chunk).await.unwrap();
            }
            tx.write_all(b"\n{}\n").await.unwrap();
        });
        let mut reader = lines(rx);
        assert!(matches!(reader.next().await, Some(Ok(Line::TooLong))));
        assert!(reader.read_buffer().capacity() <= 2 * MAX_MESSAGE_BYTES);
        assert!(matches!(reader.next().await, Some(Ok(Line::Message(m))) if &m[..] == b"{}"));
        assert!(reader.read_buffer().capacity() <= 2 * MAX_MESSAGE_BYTES);
        writer.await.unwrap();
        assert!(reader.next().await.is_none());
    }
}
