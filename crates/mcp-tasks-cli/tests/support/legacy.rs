//! A small `2025-11-25` Streamable HTTP client for the legacy suites: `initialize`, the
//! session header, JSON or SSE responses read message by message (with event ids), the GET
//! stream with `Last-Event-ID`, and answers to server-to-client requests.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::{Value, json};

pub const LEGACY: &str = "2025-11-25";
pub const WAIT: Duration = Duration::from_secs(30);

/// One SSE response being read.
pub struct Sse {
    body: BoxStream<'static, reqwest::Result<Vec<u8>>>,
    buf: Vec<u8>,
    queued: VecDeque<(Option<String>, Value)>,
}

impl Sse {
    /// The next message with its event id; `None` when the stream ended.
    pub async fn next(&mut self) -> Option<(Option<String>, Value)> {
        loop {
            if let Some(m) = self.queued.pop_front() {
                return Some(m);
            }
            let chunk = tokio::time::timeout(WAIT, self.body.next())
                .await
                .expect("an SSE event within the wait")?;
            let chunk = chunk.ok()?;
            self.buf.extend_from_slice(&chunk);
            while let Some(end) = find(&self.buf, b"\n\n") {
                let event: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = String::from_utf8_lossy(&event);
                let mut id = None;
                let mut data = String::new();
                for line in text.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.to_owned());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    }
                }
                if !data.is_empty() {
                    let message = serde_json::from_str(&data).expect("JSON in a data line");
                    self.queued.push_back((id, message));
                }
            }
        }
    }

    /// The next message, without its id.
    pub async fn message(&mut self) -> Option<Value> {
        self.next().await.map(|(_, m)| m)
    }

    /// Reads until a message satisfies `want`; panics if the stream ends first.
    pub async fn until(&mut self, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        while let Some(m) = self.message().await {
            if want(&m) {
                return m;
            }
        }
        panic!("the stream ended before {what}");
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// What a POST returned.
pub enum Reply {
    Json(u16, Value),
    Stream(Sse),
    Status(u16, String),
}

impl Reply {
    /// The JSON body of a JSON reply.
    pub fn json(self) -> Value {
        match self {
            Reply::Json(_, v) => v,
            Reply::Stream(_) => panic!("expected JSON, got an SSE stream"),
            Reply::Status(s, b) => panic!("expected JSON, got {s}: {b}"),
        }
    }

    pub fn status(&self) -> u16 {
        match self {
            Reply::Json(s, _) | Reply::Status(s, _) => *s,
            Reply::Stream(_) => 200,
        }
    }

    /// The response of a request, whether JSON or the last message of an SSE stream.
    pub async fn response(self) -> Value {
        match self {
            Reply::Json(_, v) => v,
            Reply::Stream(mut sse) => {
                sse.until("the response", |m| m.get("method").is_none())
                    .await
            }
            Reply::Status(s, b) => panic!("expected a response, got {s}: {b}"),
        }
    }
}

/// A legacy client of one session.
#[derive(Clone)]
pub struct Client {
    pub http: reqwest::Client,
    pub url: String,
    pub session: Option<String>,
    pub token: Option<String>,
}

impl Client {
    pub fn new(url: &str) -> Self {
        Self {
            http: reqwest::Client::new(),
            url: url.to_owned(),
            session: None,
            token: None,
        }
    }

    pub fn with_token(mut self, token: &str) -> Self {
        self.token = Some(token.to_owned());
        self
    }

    fn builder(&self, method: reqwest::Method) -> reqwest::RequestBuilder {
        let mut b = self
            .http
            .request(method, &self.url)
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", LEGACY);
        if let Some(s) = &self.session {
            b = b.header("Mcp-Session-Id", s);
        }
        if let Some(t) = &self.token {
            b = b.bearer_auth(t);
        }
        b
    }

    /// Opens a session with these capabilities; returns the `initialize` result.
    pub async fn initialize(&mut self, capabilities: Value) -> Value {
        let body = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": LEGACY, "capabilities": capabilities,
            "clientInfo": { "name": "legacy-test", "version": "1" } } });
        let response = self
            .builder(reqwest::Method::POST)
            .header("Content-Type", "application/json")
            .body(serde_json::to_vec(&body).unwrap())
            .send()
            .await
            .expect("initialize is answered");
        assert_eq!(response.status(), 200);
        let id = response
            .headers()
            .get("mcp-session-id")
            .expect("a session id")
            .to_str()
            .unwrap()
            .to_owned();
        self.session = Some(id);
        let result: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
        let ack = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        assert_eq!(self.post(&ack).await.status(), 202);
        result["result"].clone()
    }

    pub async fn post(&self, body: &Value) -> Reply {
        let response = self
            .builder(reqwest::Method::POST)
            .header("Content-Type", "application/json")
            .body(serde_json::to_vec(body).unwrap())
            .send()
            .await
            .expect("the server answers");
        reply(response).await
    }

    /// A request and its response (the last message of a stream).
    pub async fn call(&self, id: u64, method: &str, params: Value) -> Value {
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        self.post(&body).await.response().await
    }

    /// The result of a request; panics on an error.
    pub async fn result(&self, id: u64, method: &str, params: Value) -> Value {
        let r = self.call(id, method, params).await;
        assert!(r.get("error").is_none(), "{method}: {r}");
        r["result"].clone()
    }

    /// Answers a server-to-client request.
    pub async fn answer(&self, request: &Value, result: Value) {
        let body = json!({ "jsonrpc": "2.0", "id": request["id"], "result": result });
        assert_eq!(self.post(&body).await.status(), 202);
    }

    /// Opens the GET stream (resuming after `last_event_id` if given).
    pub async fn get_stream(&self, last_event_id: Option<&str>) -> Reply {
        let mut b = self
            .builder(reqwest::Method::GET)
            .header("Accept", "text/event-stream");
        if let Some(id) = last_event_id {
            b = b.header("Last-Event-ID", id);
        }
        reply(b.send().await.expect("the server answers")).await
    }

    pub async fn delete(&self) -> u16 {
        self.builder(reqwest::Method::DELETE)
            .send()
            .await
            .expect("the server answers")
            .status()
            .as_u16()
    }
}

async fn reply(response: reqwest::Response) -> Reply {
    let status = response.status().as_u16();
    let kind = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if status == 200 && kind.starts_with("text/event-stream") {
        return Reply::Stream(Sse {
            body: response
                .bytes_stream()
                .map(|r| r.map(|b| b.to_vec()))
                .boxed(),
            buf: Vec::new(),
            queued: VecDeque::new(),
        });
    }
    let text = response.text().await.unwrap_or_default();
    if kind.starts_with("application/json") && !text.is_empty() {
        Reply::Json(status, serde_json::from_str(&text).expect("a JSON body"))
    } else {
        Reply::Status(status, text)
    }
}
