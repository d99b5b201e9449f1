//! The JSON-RPC 2.0 envelope: reading one incoming message, writing one response.

use serde_json::{Map, Value, json};

use super::limits;
use crate::wire::error::RpcError;

/// A message read from a client.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// Has an `id`: exactly one response is owed.
    Request {
        id: Value,
        method: String,
        params: Option<Map<String, Value>>,
    },
    /// Has no `id`: no response is ever sent.
    Notification {
        method: String,
        params: Option<Map<String, Value>>,
    },
}

/// An envelope that could not be read. `id` is the request id when it could be read (error
/// responses echo it); a rejected message without an id gets no response at all only when it
/// is a well-formed notification, which is never rejected here.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub id: Option<Value>,
    pub error: RpcError,
}

/// Reads one JSON-RPC message (JSON-RPC 2.0 as MCP `2026-07-28` restricts it; parse and envelope checks first).
pub fn parse(bytes: &[u8]) -> Result<Incoming, Box<Rejection>> {
    if bytes.len() > limits::MAX_MESSAGE_BYTES {
        return Err(Box::new(Rejection {
            id: None,
            error: RpcError::invalid_request(format!(
                "message of {} bytes exceeds the limit of {} bytes",
                bytes.len(),
                limits::MAX_MESSAGE_BYTES
            )),
        }));
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        Box::new(Rejection {
            id: None,
            error: RpcError::parse_error(e),
        })
    })?;
    from_value(value)
}

/// Reads one JSON-RPC message that is already JSON.
pub fn from_value(value: Value) -> Result<Incoming, Box<Rejection>> {
    let mut obj = match value {
        Value::Object(obj) => obj,
        Value::Array(_) => {
            return Err(reject(None, "batches are not supported"));
        }
        other => {
            return Err(reject(
                None,
                format!("a message must be a JSON object, not {}", kind(&other)),
            ));
        }
    };
    let id = match obj.remove("id") {
        None => None,
        Some(id @ Value::String(_)) => {
            if id.as_str().is_some_and(|s| s.len() > limits::MAX_NAME_LEN) {
                return Err(reject(None, "`id` is longer than 256 characters"));
            }
            Some(id)
        }
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Some(Value::Number(n)),
        Some(other) => {
            return Err(reject(
                None,
                format!("`id` must be a string or an integer, not {}", kind(&other)),
            ));
        }
    };
    match obj.get("jsonrpc") {
        Some(Value::String(v)) if v == "2.0" => {}
        Some(_) => return Err(reject(id, "`jsonrpc` must be \"2.0\"")),
        None => return Err(reject(id, "`jsonrpc` is missing")),
    }
    let method = match obj.remove("method") {
        Some(Value::String(m)) if m.is_empty() => {
            return Err(reject(id, "`method` must not be empty"));
        }
        Some(Value::String(m)) if m.len() > limits::MAX_NAME_LEN => {
            return Err(reject(id, "`method` is longer than 256 characters"));
        }
        Some(Value::String(m)) => m,
        Some(other) => {
            return Err(reject(
                id,
                format!("`method` must be a string, not {}", kind(&other)),
            ));
        }
        None if obj.contains_key("result") || obj.contains_key("error") => {
            return Err(reject(id, "clients must not send responses to this server"));
        }
        None => return Err(reject(id, "`method` is missing")),
    };
    let params = match obj.remove("params") {
        None => None,
        Some(Value::Object(p)) => Some(p),
        Some(other) => {
            return Err(reject(
                id,
                format!("`params` must be an object, not {}", kind(&other)),
            ));
        }
    };
    Ok(match id {
        Some(id) => Incoming::Request { id, method, params },
        None => Incoming::Notification { method, params },
    })
}

fn reject(id: Option<Value>, detail: impl std::fmt::Display) -> Box<Rejection> {
    Box::new(Rejection {
        id,
        error: RpcError::invalid_request(detail),
    })
}

/// A short name for a JSON value's type, for error messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A successful response.
pub fn result_response(id: &Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

/// A successful response serialized at once from `result`, without a `Value` tree: the same
/// bytes as serializing [`result_response`] of the same result.
pub(crate) fn result_response_bytes<T: serde::Serialize>(
    id: &Value,
    result: &T,
) -> Result<Vec<u8>, serde_json::Error> {
    #[derive(serde::Serialize)]
    struct Envelope<'a, T> {
        jsonrpc: &'static str,
        id: &'a Value,
        result: &'a T,
    }
    serde_json::to_vec(&Envelope {
        jsonrpc: "2.0",
        id,
        result,
    })
}

/// An error response. Without a readable request id the `id` member is omitted (never `null`).
pub fn error_response(id: Option<&Value>, error: &RpcError) -> Value {
    let mut resp = Map::new();
    resp.insert("jsonrpc".into(), json!("2.0"));
    if let Some(id) = id {
        resp.insert("id".into(), id.clone());
    }
    resp.insert("error".into(), error.to_json());
    Value::Object(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::error::code;

    #[test]
    fn requests_and_notifications() {
        let r = parse(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#).unwrap();
        assert!(matches!(r, Incoming::Request { ref method, .. } if method == "tools/list"));
        let n = parse(br#"{"jsonrpc":"2.0","method":"notifications/cancelled"}"#).unwrap();
        assert!(matches!(n, Incoming::Notification { .. }));
    }

    #[test]
    fn envelope_errors() {
        let cases: &[(&[u8], i64)] = &[
            (b"{", code::PARSE_ERROR),
            (b"[]", code::INVALID_REQUEST),
            (b"3", code::INVALID_REQUEST),
            (
                br#"{"jsonrpc":"1.0","id":1,"method":"x"}"#,
                code::INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":null,"method":"x"}"#,
                code::INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":1.5,"method":"x"}"#,
                code::INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":7}"#,
                code::INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":"x","params":[]}"#,
                code::INVALID_REQUEST,
            ),
        ];
        for (bytes, expected) in cases {
            let err = parse(bytes).unwrap_err();
            assert_eq!(
                err.error.code,
                *expected,
                "{}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn error_echoes_readable_id() {
        let err = parse(br#"{"jsonrpc":"2.0","id":"a","method":5}"#).unwrap_err();
        assert_eq!(err.id, Some(json!("a")));
        let resp = error_response(err.id.as_ref(), &err.error);
        assert_eq!(resp["id"], json!("a"));
        let resp = error_response(None, &err.error);
        assert!(resp.get("id").is_none());
    }
}
