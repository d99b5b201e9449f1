//! The raw HTTP/1.1 client of the transport suites (`http.rs`, `features.rs`): it writes the
//! request bytes itself and reads the exact status line, headers and chunked body, so the
//! tests see what is on the wire. `Sse` reads an event stream line by line, the way the
//! conformance suite does, and checks that every event is one `data:` line of JSON.

use std::net::SocketAddr;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::{VERSION, WAIT};

pub const SUB_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// The headers a conforming client sends for `body` (as the official conformance suite's stateless client does).
pub fn mcp_headers(body: &Value) -> Vec<(String, String)> {
    let method = body["method"].as_str().unwrap_or_default();
    let mut h = vec![
        ("MCP-Protocol-Version".to_owned(), VERSION.to_owned()),
        ("Mcp-Method".to_owned(), method.to_owned()),
    ];
    let name = match method {
        "tools/call" | "prompts/get" => body["params"]["name"].as_str(),
        "resources/read" => body["params"]["uri"].as_str(),
        "tasks/get" | "tasks/update" | "tasks/cancel" => body["params"]["taskId"].as_str(),
        _ => None,
    };
    if let Some(name) = name {
        h.push(("Mcp-Name".to_owned(), name.to_owned()));
    }
    h
}

pub fn without(mut headers: Vec<(String, String)>, name: &str) -> Vec<(String, String)> {
    headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    headers
}

pub fn with(mut headers: Vec<(String, String)>, name: &str, value: &str) -> Vec<(String, String)> {
    headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    headers.push((name.to_owned(), value.to_owned()));
    headers
}

pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub reader: BufReader<TcpStream>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn is_chunked(&self) -> bool {
        self.header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    }

    /// The next chunk of a chunked body; `None` at its end.
    pub async fn next_chunk(&mut self) -> Option<Vec<u8>> {
        let mut line = String::new();
        if self.reader.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let size = line.trim().split(';').next().unwrap_or_default();
        let size = usize::from_str_radix(size, 16).expect("a chunk size");
        if size == 0 {
            // Trailers (none expected) up to the blank line.
            loop {
                line.clear();
                if self.reader.read_line(&mut line).await.ok()? == 0 || line == "\r\n" {
                    return None;
                }
            }
        }
        let mut data = vec![0; size + 2];
        self.reader.read_exact(&mut data).await.ok()?;
        assert_eq!(&data[size..], b"\r\n", "chunk framing");
        data.truncate(size);
        Some(data)
    }

    pub async fn body(mut self) -> Vec<u8> {
        if let Some(len) = self.header("content-length") {
            let mut body = vec![0; len.parse().unwrap()];
            self.reader.read_exact(&mut body).await.unwrap();
            body
        } else if self.is_chunked() {
            let mut body = Vec::new();
            while let Some(chunk) = self.next_chunk().await {
                body.extend(chunk);
            }
            body
        } else {
            let mut body = Vec::new();
            self.reader.read_to_end(&mut body).await.unwrap();
            body
        }
    }

    pub async fn json(self) -> (u16, Value) {
        let status = self.status;
        assert_eq!(
            self.header("content-type"),
            Some("application/json"),
            "status {status}"
        );
        let body = self.body().await;
        assert!(
            !body.contains(&b'\n'),
            "compact single-line JSON: {}",
            String::from_utf8_lossy(&body)
        );
        (status, serde_json::from_slice(&body).expect("a JSON body"))
    }

    pub fn sse(self) -> Sse {
        assert_eq!(self.status, 200);
        assert_eq!(self.header("content-type"), Some("text/event-stream"));
        assert_eq!(self.header("cache-control"), Some("no-cache"));
        assert_eq!(self.header("x-accel-buffering"), Some("no"));
        assert!(self.header("mcp-session-id").is_none());
        assert!(self.is_chunked(), "an open-ended SSE body is chunked");
        Sse {
            response: self,
            buf: Vec::new(),
            ended: false,
        }
    }
}

pub async fn send_on(
    mut stream: TcpStream,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Response {
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    let has = |name: &str| headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    if !has("host") {
        let port = stream.peer_addr().unwrap().port();
        head.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    if !has("content-type") {
        head.push_str("Content-Type: application/json\r\n");
    }
    if !has("accept") {
        head.push_str("Accept: application/json, text/event-stream\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).await.unwrap();
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a status line, got {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).await.unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (n, v) = l.split_once(':').expect("a header line");
        headers.push((n.trim().to_owned(), v.trim().to_owned()));
    }
    Response {
        status,
        headers,
        reader,
    }
}

pub async fn send(
    addr: SocketAddr,
    method: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Response {
    let stream = TcpStream::connect(addr).await.unwrap();
    send_on(stream, method, "/mcp", headers, body).await
}

/// POSTs `body` with `headers`; returns the status and the JSON body.
pub async fn post_with(
    addr: SocketAddr,
    headers: Vec<(String, String)>,
    body: &Value,
) -> (u16, Value) {
    let bytes = serde_json::to_vec(body).unwrap();
    tokio::time::timeout(WAIT, async {
        send(addr, "POST", &headers, &bytes).await.json().await
    })
    .await
    .expect("a timely response")
}

/// POSTs `body` with a conforming client's headers.
pub async fn post(addr: SocketAddr, body: &Value) -> (u16, Value) {
    post_with(addr, mcp_headers(body), body).await
}

/// POSTs `body` with a conforming client's headers and reads the response as an event stream.
pub async fn post_sse(addr: SocketAddr, body: &Value) -> Sse {
    let bytes = serde_json::to_vec(body).unwrap();
    tokio::time::timeout(WAIT, send(addr, "POST", &mcp_headers(body), &bytes))
        .await
        .expect("a timely response")
        .sse()
}

/// Reads an SSE body line by line, the way the conformance suite does.
pub struct Sse {
    response: Response,
    buf: Vec<u8>,
    ended: bool,
}

impl Sse {
    pub async fn line(&mut self) -> Option<String> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return Some(String::from_utf8(line[..line.len() - 1].to_vec()).unwrap());
            }
            if self.ended {
                return None;
            }
            match self.response.next_chunk().await {
                Some(chunk) => self.buf.extend(chunk),
                None => self.ended = true,
            }
        }
    }

    /// The next JSON-RPC message; checks that every event is exactly one `data:` line of JSON
    /// followed by a blank line. `None` when the stream ended.
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            let line = self.line().await?;
            if line.is_empty() || line.starts_with(':') {
                continue; // blank separators and keep-alive comments
            }
            let data = line
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("only data lines and comments, got {line:?}"));
            let message: Value = serde_json::from_str(data).expect("each data line is JSON");
            assert_eq!(
                self.line().await.as_deref(),
                Some(""),
                "one data line per event"
            );
            return Some(message);
        }
    }

    /// Every message up to the end of the stream.
    pub async fn events(mut self) -> Vec<Value> {
        let mut all = Vec::new();
        while let Some(message) = self.next_timely().await {
            all.push(message);
        }
        all
    }

    pub async fn next_timely(&mut self) -> Option<Value> {
        tokio::time::timeout(WAIT, self.next())
            .await
            .expect("an SSE message in time")
    }

    /// Reads the acknowledgement and checks its subscription id (same JSON type as `id`).
    pub async fn ack(&mut self, id: &Value) -> Value {
        let ack = self.next_timely().await.expect("an acknowledgement");
        assert_eq!(
            ack["method"], "notifications/subscriptions/acknowledged",
            "{ack}"
        );
        assert_eq!(&ack["params"]["_meta"][SUB_ID], id, "{ack}");
        ack
    }

    /// Reads `notifications/tasks` until `task` is terminal; returns all of them.
    pub async fn until_terminal(&mut self, id: &Value, task: &str) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let n = self
                .next_timely()
                .await
                .unwrap_or_else(|| panic!("the stream ended before {task} finished: {seen:?}"));
            assert_eq!(n["method"], "notifications/tasks", "{n}");
            assert_eq!(&n["params"]["_meta"][SUB_ID], id, "{n}");
            let done = n["params"]["taskId"] == task && is_terminal(&n["params"]["status"]);
            seen.push(n);
            if done {
                return seen;
            }
        }
    }
}

pub fn is_terminal(status: &Value) -> bool {
    matches!(status.as_str(), Some("completed" | "failed" | "cancelled"))
}
