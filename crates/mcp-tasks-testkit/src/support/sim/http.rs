//! The workload driver's Streamable HTTP connection to a `serve` process: JSON or SSE
//! responses, listen streams as SSE messages. Shared by the process crash suites.

use std::net::SocketAddr;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as TokioBufReader};
use tokio::net::TcpStream;

use super::driver::Conn;

// ---------------------------------------------------------------------------------------------
// A fallible HTTP/1.1 client for the MCP endpoint
// ---------------------------------------------------------------------------------------------

/// The Streamable HTTP connection to a `serve` process (a TCP connection per request).
pub struct Http {
    /// The server's address.
    pub addr: SocketAddr,
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    reader: TokioBufReader<TcpStream>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, String> {
        let mut line = String::new();
        if self
            .reader
            .read_line(&mut line)
            .await
            .map_err(|e| e.to_string())?
            == 0
        {
            return Ok(None);
        }
        let size = line.trim().split(';').next().unwrap_or_default();
        let size = usize::from_str_radix(size, 16).map_err(|e| format!("chunk size: {e}"))?;
        if size == 0 {
            return Ok(None);
        }
        let mut data = vec![0; size + 2];
        self.reader
            .read_exact(&mut data)
            .await
            .map_err(|e| e.to_string())?;
        data.truncate(size);
        Ok(Some(data))
    }

    async fn body(mut self) -> Result<Vec<u8>, String> {
        if let Some(len) = self.header("content-length") {
            let mut body = vec![0; len.parse().map_err(|_| "content-length")?];
            self.reader
                .read_exact(&mut body)
                .await
                .map_err(|e| e.to_string())?;
            Ok(body)
        } else {
            let mut body = Vec::new();
            while let Some(chunk) = self.next_chunk().await? {
                body.extend(chunk);
            }
            Ok(body)
        }
    }
}

async fn post(addr: SocketAddr, body: &Value) -> Result<Response, String> {
    let mut stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let bytes = serde_json::to_vec(body).map_err(|e| e.to_string())?;
    let mut head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
        bytes.len()
    );
    for (n, v) in crate::support::headers_for(body, None) {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    stream.write_all(&bytes).await.map_err(|e| e.to_string())?;
    let mut reader = TokioBufReader::new(stream);
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .await
        .map_err(|e| e.to_string())?;
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line: {line:?}"))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if reader
            .read_line(&mut line)
            .await
            .map_err(|e| e.to_string())?
            == 0
        {
            return Err("connection closed in the headers".into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((n, v)) = l.split_once(':') {
            headers.push((n.trim().to_owned(), v.trim().to_owned()));
        }
    }
    Ok(Response {
        status,
        headers,
        reader,
    })
}

/// The JSON-RPC messages of an SSE body.
fn sse_messages(response: Response) -> BoxStream<'static, Value> {
    futures::stream::unfold(
        (response, Vec::<u8>::new()),
        |(mut r, mut buf)| async move {
            loop {
                if let Some(pos) = buf.windows(2).position(|w| w == b"\n\n") {
                    let event: Vec<u8> = buf.drain(..pos + 2).collect();
                    let text = String::from_utf8_lossy(&event).into_owned();
                    let data: String = text
                        .lines()
                        .filter_map(|l| l.strip_prefix("data: "))
                        .collect();
                    if data.is_empty() {
                        continue; // a keep-alive comment
                    }
                    match serde_json::from_str(&data) {
                        Ok(v) => return Some((v, (r, buf))),
                        Err(_) => return None,
                    }
                }
                match r.next_chunk().await {
                    Ok(Some(chunk)) => buf.extend(chunk),
                    _ => return None,
                }
            }
        },
    )
    .boxed()
}

impl Conn for Http {
    fn call(&self, message: Value) -> BoxFuture<'static, Result<Value, String>> {
        let addr = self.addr;
        async move {
            let r = post(addr, &message).await?;
            let status = r.status;
            let sse = r
                .header("content-type")
                .is_some_and(|c| c.starts_with("text/event-stream"));
            if sse {
                let mut messages = sse_messages(r);
                while let Some(m) = messages.next().await {
                    if m.get("id").is_some() {
                        return Ok(m);
                    }
                }
                return Err("the stream ended without a response".into());
            }
            let body = r.body().await?;
            serde_json::from_slice(&body).map_err(|e| {
                format!(
                    "status {status}: not JSON ({e}): {}",
                    String::from_utf8_lossy(&body)
                )
            })
        }
        .boxed()
    }

    fn listen(
        &self,
        message: Value,
    ) -> BoxFuture<'static, Result<BoxStream<'static, Value>, String>> {
        let addr = self.addr;
        async move {
            let r = post(addr, &message).await?;
            if r.status != 200 {
                return Err(format!("listen answered {}", r.status));
            }
            Ok(sse_messages(r))
        }
        .boxed()
    }
}
