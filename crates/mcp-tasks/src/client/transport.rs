//! How a [`super::Client`] reaches a server: the [`Transport`] trait, the Streamable HTTP
//! transport ([`HttpTransport`]) and the in-process one ([`InProcessTransport`]).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::{BoxStream, Stream, StreamExt};
use reqwest::StatusCode;
use reqwest::header::{self, HeaderValue};
use serde_json::Value;

use super::ClientError;
use crate::protocol::{Dispatched, RequestContext};
use crate::runtime::RuntimeHandle;
use crate::task::Owner;
use crate::wire::{PROTOCOL_VERSION, keys, methods};

/// What a server sent back for one message.
pub enum Response {
    /// One JSON-RPC message: the response.
    Message(Value),
    /// JSON-RPC messages scoped to the request, in order (an SSE response, or an in-process
    /// `subscriptions/listen`). The response to the request, if any, is one of them.
    Stream(BoxStream<'static, Result<Value, ClientError>>),
    /// Accepted without a body (a notification).
    Accepted,
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Message(v) => f.debug_tuple("Message").field(v).finish(),
            Self::Stream(_) => f.write_str("Stream"),
            Self::Accepted => f.write_str("Accepted"),
        }
    }
}

/// A way to send one JSON-RPC message to a server and get what it answers. Implement it to
/// run the client over another transport (or to inject faults in tests).
pub trait Transport: Send + Sync + 'static {
    /// Sends one JSON-RPC message (a request or a notification).
    fn send(&self, message: Value) -> BoxFuture<'_, Result<Response, ClientError>>;
    /// Where this transport goes, for messages and for keying durable handles
    /// (`http://host:port/mcp`, `in-process`).
    fn endpoint(&self) -> String;
}

// ---------------------------------------------------------------------------------------------
// Streamable HTTP

/// Streamable HTTP (MCP `2026-07-28`): one `POST` per message with the routing headers
/// (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`) derived from the body, an optional
/// bearer token, JSON or SSE responses; `http://` and `https://` (rustls, web PKI roots).
pub struct HttpTransport {
    url: String,
    token: Option<String>,
    client: reqwest::Client,
    idle_timeout: Duration,
}

/// Largest response body read into memory.
const MAX_BODY: usize = 64 * 1024 * 1024;

impl HttpTransport {
    /// A transport to the MCP endpoint at `url` (e.g. `http://127.0.0.1:8080/mcp`).
    pub fn new(url: &str) -> Result<Self, ClientError> {
        let invalid = |reason: &str| ClientError::InvalidUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        // `localhost:8080` parses with the scheme `localhost`, `127.0.0.1:8080` not at all:
        // a URL without `://` most likely lacks its `http://`.
        let guess = || {
            if url.contains("://") {
                String::new()
            } else if url.contains('/') {
                format!("; did you mean `http://{url}`?")
            } else {
                format!("; did you mean `http://{url}/mcp`?")
            }
        };
        let parsed = reqwest::Url::parse(url).map_err(|e| {
            invalid(&format!(
                "{e} (expected an absolute URL like http://127.0.0.1:8080/mcp){}",
                guess()
            ))
        })?;
        match parsed.scheme() {
            "http" | "https" => {}
            other => {
                return Err(invalid(&format!(
                    "unsupported scheme `{other}` (http or https){}",
                    guess()
                )));
            }
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(invalid("the URL has no host"));
        }
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(30))
            .tcp_nodelay(true)
            .user_agent(concat!("mcp-tasks/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| invalid(&format!("cannot set up an HTTP client: {e}")))?;
        Ok(Self {
            url: url.to_owned(),
            token: None,
            client,
            idle_timeout: Duration::from_secs(90),
        })
    }

    /// Sends `Authorization: Bearer <token>` with every request.
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// How long an SSE response may stay silent (no event, no keep-alive comment) before it
    /// counts as dropped (default 90 s).
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    fn request(&self, message: &Value) -> Result<reqwest::RequestBuilder, ClientError> {
        let method = message.get("method").and_then(Value::as_str);
        let params = message.get("params");
        let version = params
            .and_then(|p| p.get("_meta"))
            .and_then(|m| m.get(keys::PROTOCOL_VERSION))
            .and_then(Value::as_str)
            .unwrap_or(PROTOCOL_VERSION);
        let body = serde_json::to_vec(message)
            .map_err(|e| ClientError::Protocol(format!("cannot encode the request: {e}")))?;
        let mut builder = self
            .client
            .post(&self.url)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .header("MCP-Protocol-Version", header_value(version));
        if let Some(method) = method {
            builder = builder.header("Mcp-Method", header_value(method));
            let name = methods::named_member(method)
                .and_then(|member| params.and_then(|p| p.get(member)))
                .and_then(Value::as_str);
            if let Some(name) = name {
                builder = builder.header("Mcp-Name", header_value(name));
            }
        }
        if let Some(token) = &self.token {
            let value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                ClientError::InvalidUrl {
                    url: self.url.clone(),
                    reason: "the bearer token contains characters not allowed in a header".into(),
                }
            })?;
            builder = builder.header(header::AUTHORIZATION, value);
        }
        Ok(builder.body(body))
    }

    async fn send_inner(&self, message: Value) -> Result<Response, ClientError> {
        let request = self.request(&message)?;
        let mut response = request.send().await.map_err(|e| self.http_error(e))?;
        let status = response.status();
        let headers = response.headers().clone();
        if status == StatusCode::ACCEPTED {
            return Ok(Response::Accepted);
        }
        let is_sse = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        if status.is_success() && is_sse {
            let url = self.url.clone();
            let chunks = response.bytes_stream().map(move |r| {
                r.map_err(|e| ClientError::Io {
                    url: url.clone(),
                    reason: format!("the event stream broke: {e}"),
                    source: Some(Box::new(e)),
                })
            });
            return Ok(Response::Stream(
                SseStream::new(chunks.boxed(), self.idle_timeout, self.url.clone()).boxed(),
            ));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| ClientError::Io {
            url: self.url.clone(),
            reason: format!("cannot read the response body: {e}"),
            source: Some(Box::new(e)),
        })? {
            if body.len() + chunk.len() > MAX_BODY {
                return Err(ClientError::Protocol(format!(
                    "the response body exceeds {MAX_BODY} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        if status == StatusCode::UNAUTHORIZED {
            let challenge = headers
                .get(header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            return Err(ClientError::Unauthorized {
                url: self.url.clone(),
                resource_metadata: challenge.as_deref().and_then(resource_metadata),
                www_authenticate: challenge,
                token_sent: self.token.is_some(),
            });
        }
        // A JSON-RPC answer is authoritative whatever the status (400 and 404 carry errors).
        if let Ok(value) = serde_json::from_slice::<Value>(&body)
            && value.get("jsonrpc").is_some()
            && (value.get("result").is_some() || value.get("error").is_some())
        {
            return Ok(Response::Message(value));
        }
        let text = snippet(&body);
        if status == StatusCode::FORBIDDEN {
            return Err(ClientError::Forbidden {
                url: self.url.clone(),
                body: text,
            });
        }
        if !status.is_success() {
            return Err(ClientError::Http {
                url: self.url.clone(),
                status: status.as_u16(),
                body: text,
            });
        }
        Err(ClientError::Protocol(format!(
            "HTTP {status} with a body that is not a JSON-RPC response: {text}"
        )))
    }

    fn http_error(&self, e: reqwest::Error) -> ClientError {
        let mut reason = e.to_string();
        let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
        while let Some(s) = source {
            if let Some(io) = s.downcast_ref::<std::io::Error>() {
                reason = match io.kind() {
                    std::io::ErrorKind::ConnectionRefused => {
                        "connection refused (is the server running on that address?)".to_owned()
                    }
                    _ => io.to_string(),
                };
                break;
            }
            reason = s.to_string();
            source = s.source();
        }
        if e.is_timeout() {
            ClientError::Timeout {
                url: self.url.clone(),
                seconds: 10.0,
            }
        } else if e.is_connect() {
            ClientError::Connect {
                url: self.url.clone(),
                reason,
                source: Some(Box::new(e)),
            }
        } else {
            ClientError::Io {
                url: self.url.clone(),
                reason,
                source: Some(Box::new(e)),
            }
        }
    }
}

impl Transport for HttpTransport {
    fn send(&self, message: Value) -> BoxFuture<'_, Result<Response, ClientError>> {
        Box::pin(self.send_inner(message))
    }

    fn endpoint(&self) -> String {
        self.url.clone()
    }
}

/// A header value as the Streamable HTTP binding wants it: as is when it is plain visible
/// ASCII without surrounding whitespace, else the `=?base64?…?=` sentinel of its UTF-8 bytes.
pub(crate) fn header_value(value: &str) -> HeaderValue {
    let plain = !value.is_empty()
        && value.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !value.starts_with(' ')
        && !value.ends_with(' ')
        && !value.starts_with("=?");
    let encoded = if plain {
        value.to_owned()
    } else {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(value.as_bytes())
        )
    };
    HeaderValue::from_str(&encoded).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The `resource_metadata` parameter of a `WWW-Authenticate: Bearer …` challenge (RFC 9728).
pub(crate) fn resource_metadata(challenge: &str) -> Option<String> {
    let lower = challenge.to_ascii_lowercase();
    let at = lower.find("resource_metadata=")?;
    let rest = &challenge[at + "resource_metadata=".len()..];
    let value = if let Some(quoted) = rest.strip_prefix('"') {
        quoted.split('"').next()?
    } else {
        rest.split([',', ' ']).next()?
    };
    (!value.is_empty()).then(|| value.to_owned())
}

fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return "(empty body)".to_owned();
    }
    let mut s: String = text.chars().take(300).collect();
    if text.chars().count() > 300 {
        s.push('…');
    }
    s
}

// ---------------------------------------------------------------------------------------------
// SSE

/// Server-sent events to JSON-RPC messages: one message per event (its `data:` lines joined),
/// comments (`:` keep-alives) and other fields ignored.
///
/// Bounded and linear: each byte is scanned for a line end once, and a line or an event longer
/// than the cap ([`Self::max_event`], 64 MiB by default) ends the stream with an error that
/// names the peer but quotes none of its data. Ends with an error when no whole message (an
/// event, or a comment when [`Self::comments_are_activity`]) arrives within the idle timeout:
/// bytes that never complete one do not keep the stream alive.
pub(crate) struct SseStream {
    chunks: BoxStream<'static, Result<Bytes, ClientError>>,
    /// Bytes of the line being received (no `\n` in `buffer[..scanned]`).
    buffer: Vec<u8>,
    scanned: usize,
    data: Vec<u8>,
    max: usize,
    comments: bool,
    activity: bool,
    pending: std::collections::VecDeque<Result<Value, ClientError>>,
    idle: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
    url: String,
    done: bool,
    /// Bytes looked at for a line end, to show the parse is linear.
    #[cfg(test)]
    examined: usize,
}

impl SseStream {
    pub(crate) fn new(
        chunks: BoxStream<'static, Result<Bytes, ClientError>>,
        idle: Duration,
        url: String,
    ) -> Self {
        Self {
            chunks,
            buffer: Vec::new(),
            scanned: 0,
            data: Vec::new(),
            max: MAX_BODY,
            comments: true,
            activity: false,
            pending: Default::default(),
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
            url,
            done: false,
            #[cfg(test)]
            examined: 0,
        }
    }

    /// The largest line and event, in bytes (default 64 MiB).
    pub(crate) fn max_event(mut self, bytes: usize) -> Self {
        self.max = bytes;
        self
    }

    /// Whether a comment line (a keep-alive) counts as a message for the idle timeout
    /// (default yes).
    pub(crate) fn comments_are_activity(mut self, yes: bool) -> Self {
        self.comments = yes;
        self
    }

    fn too_large(&mut self) {
        self.buffer = Vec::new();
        self.data = Vec::new();
        self.pending.push_back(Err(ClientError::Protocol(format!(
            "an event from {} exceeds {} bytes",
            self.url, self.max
        ))));
        self.done = true;
    }

    fn feed(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
        let buffer = std::mem::take(&mut self.buffer);
        let mut start = 0;
        let mut from = self.scanned;
        while let Some(i) = buffer[from..].iter().position(|&b| b == b'\n') {
            #[cfg(test)]
            {
                self.examined += i + 1;
            }
            let end = from + i;
            let mut line = &buffer[start..end];
            if let Some(stripped) = line.strip_suffix(b"\r") {
                line = stripped;
            }
            self.line(line);
            if self.done {
                return;
            }
            start = end + 1;
            from = start;
        }
        #[cfg(test)]
        {
            self.examined += buffer.len() - from;
        }
        self.buffer = buffer;
        self.buffer.drain(..start);
        self.scanned = self.buffer.len();
        if self.buffer.len().saturating_add(self.data.len()) > self.max {
            self.too_large();
        }
    }

    fn line(&mut self, line: &[u8]) {
        if line.is_empty() {
            if !self.data.is_empty() {
                let data = std::mem::take(&mut self.data);
                self.activity = true;
                self.pending
                    .push_back(serde_json::from_slice(&data).map_err(|e| {
                        ClientError::Protocol(format!(
                            "an event from {} is not JSON ({e})",
                            self.url
                        ))
                    }));
            }
            return;
        }
        if line.starts_with(b":") {
            self.activity |= self.comments;
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(at) => {
                let value = &line[at + 1..];
                (&line[..at], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        if field == b"data" {
            let separator = usize::from(!self.data.is_empty());
            if self.data.len() + separator + value.len() > self.max {
                self.too_large();
                return;
            }
            if separator == 1 {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
        }
    }
}

impl Stream for SseStream {
    type Item = Result<Value, ClientError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(item) = self.pending.pop_front() {
                return Poll::Ready(Some(item));
            }
            if self.done {
                return Poll::Ready(None);
            }
            match self.chunks.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(bytes))) => {
                    self.feed(&bytes);
                    if std::mem::take(&mut self.activity) {
                        let idle = self.idle;
                        self.deadline
                            .as_mut()
                            .reset(tokio::time::Instant::now() + idle);
                    } else if self.pending.is_empty() && self.deadline.is_elapsed() {
                        // Bytes that complete no message are not a sign of life.
                        self.done = true;
                        return Poll::Ready(Some(Err(ClientError::Timeout {
                            url: self.url.clone(),
                            seconds: self.idle.as_secs_f64(),
                        })));
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    // A final event without its blank line still counts.
                    self.line(b"");
                    self.done = true;
                }
                Poll::Pending => {
                    if self.deadline.as_mut().poll(cx).is_ready() {
                        self.done = true;
                        return Poll::Ready(Some(Err(ClientError::Timeout {
                            url: self.url.clone(),
                            seconds: self.idle.as_secs_f64(),
                        })));
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// In process

/// A [`RuntimeHandle`] in the same process: messages go straight to its dispatcher, as
/// `owner`, without sockets or routing headers.
pub struct InProcessTransport {
    handle: RuntimeHandle,
    owner: Owner,
}

impl InProcessTransport {
    /// A transport to `handle` that acts as `owner`.
    pub fn new(handle: RuntimeHandle, owner: Owner) -> Self {
        Self { handle, owner }
    }
}

impl Transport for InProcessTransport {
    fn send(&self, message: Value) -> BoxFuture<'_, Result<Response, ClientError>> {
        Box::pin(async move {
            let ctx = RequestContext::new(self.owner.clone());
            Ok(match self.handle.dispatch_json(message, &ctx).await {
                Dispatched::Accepted => Response::Accepted,
                Dispatched::Reply(reply) => Response::Message(reply.into_body()),
                Dispatched::Stream(stream) => Response::Stream(stream.map(Ok).boxed()),
            })
        })
    }

    fn endpoint(&self) -> String {
        "in-process".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_metadata_is_read_from_the_challenge() {
        assert_eq!(
            resource_metadata(
                r#"Bearer resource_metadata="https://api.example/.well-known/oauth-protected-resource", scope="tasks""#
            )
            .as_deref(),
            Some("https://api.example/.well-known/oauth-protected-resource")
        );
        assert_eq!(
            resource_metadata("Bearer error=\"invalid_token\", resource_metadata=http://x/m")
                .as_deref(),
            Some("http://x/m")
        );
        assert_eq!(resource_metadata("Bearer realm=\"x\""), None);
    }

    #[test]
    fn header_values_use_the_base64_sentinel_when_needed() {
        assert_eq!(header_value("tsk_01ab"), "tsk_01ab");
        assert_eq!(header_value("grüßen"), "=?base64?Z3LDvMOfZW4=?=");
        assert_eq!(header_value(" padded"), "=?base64?IHBhZGRlZA==?=");
    }

    #[tokio::test]
    async fn sse_events_become_messages() {
        let chunks: Vec<Result<Bytes, ClientError>> = vec![
            Ok(Bytes::from_static(b": keep-alive\n\ndata: {\"a\":")),
            Ok(Bytes::from_static(
                b"1}\r\n\r\nevent: message\ndata: {\"b\":2}\n",
            )),
            Ok(Bytes::from_static(b"\ndata: {\"c\":\ndata: 3}\n\n")),
        ];
        let stream = SseStream::new(
            futures::stream::iter(chunks).boxed(),
            Duration::from_secs(5),
            "u".into(),
        );
        let got: Vec<Value> = stream.map(|r| r.unwrap()).collect().await;
        assert_eq!(
            got,
            vec![
                serde_json::json!({"a":1}),
                serde_json::json!({"b":2}),
                serde_json::json!({"c":3})
            ]
        );
    }

    fn quiet() -> BoxStream<'static, Result<Bytes, ClientError>> {
        futures::stream::pending().boxed()
    }

    /// One event whose single `data:` line is a JSON string of `len` bytes.
    fn long_event(len: usize) -> Vec<u8> {
        let mut event = b"data: \"".to_vec();
        event.resize(event.len() + len, b'A');
        event.extend_from_slice(b"\"\r\n\r\n");
        event
    }

    #[tokio::test]
    async fn a_long_line_is_parsed_in_linear_work_in_any_chunking() {
        let event = long_event(4 * 1024 * 1024);
        for chunk in [1, 64 * 1024] {
            let mut sse = SseStream::new(quiet(), Duration::from_secs(5), "u".into());
            for piece in event.chunks(chunk) {
                sse.feed(piece);
            }
            assert!(
                sse.examined <= event.len(),
                "{chunk}-byte chunks: {} bytes examined for {}",
                sse.examined,
                event.len()
            );
            assert_eq!(sse.pending.len(), 1);
            let Some(Ok(Value::String(s))) = sse.pending.pop_front() else {
                panic!("not one string")
            };
            assert_eq!(s.len(), 4 * 1024 * 1024);
            assert!(sse.buffer.is_empty() && sse.data.is_empty() && !sse.done);
        }
    }

    #[tokio::test]
    async fn many_short_lines_are_linear_too() {
        let mut input = Vec::new();
        for i in 0..20_000 {
            input.extend_from_slice(format!(": ping\ndata: {i}\n\n").as_bytes());
        }
        let mut sse = SseStream::new(quiet(), Duration::from_secs(5), "u".into());
        for piece in input.chunks(64 * 1024) {
            sse.feed(piece);
        }
        assert!(sse.examined <= input.len());
        assert_eq!(sse.pending.len(), 20_000);
    }

    #[tokio::test]
    async fn a_line_over_the_cap_fails_without_quoting_it() {
        let mut sse =
            SseStream::new(quiet(), Duration::from_secs(5), "slow-upstream".into()).max_event(1024);
        let line = vec![b'Z'; 4096];
        for piece in line.chunks(100) {
            sse.feed(piece);
            if sse.done {
                break;
            }
        }
        assert!(sse.done);
        // Refused as soon as the line passed the cap, holding no more than a chunk over it.
        assert!(sse.buffer.capacity() == 0 && sse.data.capacity() == 0);
        let Some(Err(e)) = sse.pending.pop_front() else {
            panic!("no error")
        };
        let text = e.to_string();
        assert!(
            text.contains("slow-upstream") && text.contains("1024"),
            "{text}"
        );
        assert!(!text.contains("ZZZ"), "{text}");
    }

    #[tokio::test]
    async fn an_event_of_many_data_lines_over_the_cap_fails() {
        let mut sse = SseStream::new(quiet(), Duration::from_secs(5), "u".into()).max_event(1024);
        let mut fed = 0;
        while !sse.done && fed < 1_000_000 {
            sse.feed(b"data: 0123456789\n");
            fed += 17;
        }
        assert!(sse.done, "never refused");
        // Each line adds 10 bytes of data (and a `\n` between lines): refused at the line
        // that would pass 1024 bytes of data.
        assert_eq!(fed / 17, 1024 / 11 + 1, "refused after {fed} bytes");
        assert!(matches!(
            sse.pending.pop_front(),
            Some(Err(ClientError::Protocol(_)))
        ));
    }

    #[tokio::test]
    async fn an_event_that_is_not_json_is_not_quoted() {
        let mut sse = SseStream::new(quiet(), Duration::from_secs(5), "u".into());
        sse.feed(b"data: SECRET-not-json\n\n");
        let Some(Err(e)) = sse.pending.pop_front() else {
            panic!("no error")
        };
        assert!(!e.to_string().contains("SECRET"), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_that_complete_no_message_do_not_keep_the_stream_alive() {
        // A drip: one byte of a never-ending comment every second, idle bound 5 s.
        let drip = futures::stream::unfold(0u32, |n| async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Some((Ok(Bytes::from_static(b":")), n + 1))
        });
        let mut sse = SseStream::new(drip.boxed(), Duration::from_secs(5), "u".into());
        let first = sse.next().await;
        assert!(
            matches!(first, Some(Err(ClientError::Timeout { .. }))),
            "{first:?}"
        );
        assert!(sse.buffer.len() <= 6, "{} bytes taken", sse.buffer.len());
        // Whole comments count when asked, whole events always.
        let beats = futures::stream::unfold(0u32, |n| async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let b: &'static [u8] = if n == 8 { b"data: 1\n\n" } else { b": ka\n" };
            Some((Ok(Bytes::from_static(b)), n + 1))
        });
        let mut sse = SseStream::new(beats.boxed(), Duration::from_secs(5), "u".into());
        assert_eq!(sse.next().await.unwrap().unwrap(), serde_json::json!(1));
        let beats = futures::stream::unfold(0u32, |n| async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let b: &'static [u8] = if n == 8 { b"data: 1\n\n" } else { b": ka\n" };
            Some((Ok(Bytes::from_static(b)), n + 1))
        });
        let mut sse = SseStream::new(beats.boxed(), Duration::from_secs(5), "u".into())
            .comments_are_activity(false);
        assert!(matches!(
            sse.next().await,
            Some(Err(ClientError::Timeout { .. }))
        ));
    }
}
