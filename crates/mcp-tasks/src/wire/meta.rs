//! The per-request `params._meta` of stateless MCP (SEP-2575).

use serde_json::{Map, Value};

use super::{SUPPORTED_VERSIONS, TASKS_EXTENSION, keys, limits};
use crate::wire::error::RpcError;

/// The validated `_meta` of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestMeta {
    pub protocol_version: String,
    /// The declared `ClientCapabilities` object.
    pub client_capabilities: Map<String, Value>,
    pub client_info: Option<Value>,
    /// `_meta.progressToken` (a string or an integer): the client asks for
    /// `notifications/progress` about this request.
    pub progress_token: Option<Value>,
    /// `_meta["io.modelcontextprotocol/logLevel"]`: the client asks for `notifications/message`
    /// about this request at this level and above (none without it).
    pub log_level: Option<super::LogLevel>,
}

impl RequestMeta {
    /// Reads and type-checks the required `_meta` fields. Every failure is `-32602`
    /// (HTTP 400): a missing `params`, `_meta`, `protocolVersion` or `clientCapabilities`,
    /// or one of the wrong type.
    pub fn from_params(params: Option<&Map<String, Value>>) -> Result<Self, RpcError> {
        let params = params.ok_or_else(|| RpcError::invalid_params("`params._meta` is missing"))?;
        let meta = match params.get("_meta") {
            Some(Value::Object(m)) => m,
            Some(other) => {
                return Err(RpcError::invalid_params(format!(
                    "`params._meta` must be an object, not {}",
                    super::jsonrpc::kind(other)
                )));
            }
            None => return Err(RpcError::invalid_params("`params._meta` is missing")),
        };
        Ok(Self {
            protocol_version: protocol_version(meta)?,
            client_capabilities: client_capabilities(meta)?,
            client_info: client_info(meta)?,
            progress_token: progress_token(meta)?,
            log_level: log_level(meta)?,
        })
    }

    /// `-32022` unless the requested version is implemented.
    pub fn check_version(&self) -> Result<(), RpcError> {
        if SUPPORTED_VERSIONS.contains(&self.protocol_version.as_str()) {
            Ok(())
        } else {
            Err(RpcError::unsupported_version(&self.protocol_version))
        }
    }

    /// Whether the client declared the Tasks extension on this request.
    pub fn declares_tasks(&self) -> bool {
        self.declares_extension(TASKS_EXTENSION)
    }

    pub fn declares_extension(&self, id: &str) -> bool {
        self.client_capabilities
            .get("extensions")
            .and_then(Value::as_object)
            .is_some_and(|e| e.get(id).is_some_and(Value::is_object))
    }
}

/// The required protocol version, a string of bounded length.
fn protocol_version(meta: &Map<String, Value>) -> Result<String, RpcError> {
    let value = match meta.get(keys::PROTOCOL_VERSION) {
        Some(Value::String(v)) if v.len() <= limits::MAX_VERSION_LEN => v.clone(),
        Some(Value::String(_)) => {
            return Err(RpcError::invalid_params(format!(
                "`_meta[\"{}\"]` is longer than {} characters",
                keys::PROTOCOL_VERSION,
                limits::MAX_VERSION_LEN
            )));
        }
        Some(other) => {
            return Err(RpcError::invalid_params(format!(
                "`_meta[\"{}\"]` must be a string, not {}",
                keys::PROTOCOL_VERSION,
                super::jsonrpc::kind(other)
            )));
        }
        None => {
            return Err(RpcError::invalid_params(format!(
                "required `_meta[\"{}\"]` is missing",
                keys::PROTOCOL_VERSION
            )));
        }
    };
    Ok(value)
}

/// The required client capabilities, an object whose `extensions` (if any) is an object.
fn client_capabilities(meta: &Map<String, Value>) -> Result<Map<String, Value>, RpcError> {
    let value = match meta.get(keys::CLIENT_CAPABILITIES) {
        Some(Value::Object(c)) => c.clone(),
        Some(other) => {
            return Err(RpcError::invalid_params(format!(
                "`_meta[\"{}\"]` must be an object, not {}",
                keys::CLIENT_CAPABILITIES,
                super::jsonrpc::kind(other)
            )));
        }
        None => {
            return Err(RpcError::invalid_params(format!(
                "required `_meta[\"{}\"]` is missing",
                keys::CLIENT_CAPABILITIES
            )));
        }
    };
    if let Some(ext) = value.get("extensions")
        && !ext.is_object()
    {
        return Err(RpcError::invalid_params(
            "`clientCapabilities.extensions` must be an object",
        ));
    }
    Ok(value)
}

/// The optional client info: an object with string `name` and `version`.
fn client_info(meta: &Map<String, Value>) -> Result<Option<Value>, RpcError> {
    let value = match meta.get(keys::CLIENT_INFO) {
        None => None,
        Some(info @ Value::Object(o))
            if o.get("name").is_some_and(Value::is_string)
                && o.get("version").is_some_and(Value::is_string) =>
        {
            Some(info.clone())
        }
        Some(_) => {
            return Err(RpcError::invalid_params(format!(
                "`_meta[\"{}\"]` must be an object with string `name` and `version`",
                keys::CLIENT_INFO
            )));
        }
    };
    Ok(value)
}

/// The optional progress token: a short string or an integer.
fn progress_token(meta: &Map<String, Value>) -> Result<Option<Value>, RpcError> {
    let value = match meta.get("progressToken") {
        None => None,
        Some(token @ Value::String(s)) if s.len() <= limits::MAX_NAME_LEN => Some(token.clone()),
        Some(token @ Value::Number(n)) if n.is_i64() || n.is_u64() => Some(token.clone()),
        Some(other) => {
            return Err(RpcError::invalid_params(format!(
                "`_meta.progressToken` must be a string of at most {} characters or an integer, not {}",
                limits::MAX_NAME_LEN,
                super::jsonrpc::kind(other)
            )));
        }
    };
    Ok(value)
}

/// The optional log level, by its wire name.
fn log_level(meta: &Map<String, Value>) -> Result<Option<super::LogLevel>, RpcError> {
    let value = match meta.get(keys::LOG_LEVEL) {
        None => None,
        Some(Value::String(s)) if super::LogLevel::from_wire(s).is_some() => {
            super::LogLevel::from_wire(s)
        }
        Some(other) => {
            return Err(RpcError::invalid_params(format!(
                "`_meta[\"{}\"]` must be one of debug, info, notice, warning, error, \
                     critical, alert, emergency (got {})",
                keys::LOG_LEVEL,
                super::jsonrpc::kind(other)
            )));
        }
    };
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(v: Value) -> Result<RequestMeta, RpcError> {
        RequestMeta::from_params(v.as_object())
    }

    #[test]
    fn reads_required_fields() {
        let m = meta(json!({"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXTENSION: {}}}
        }}))
        .unwrap();
        assert!(m.declares_tasks());
        assert!(m.check_version().is_ok());
    }

    #[test]
    fn rejects_missing_and_ill_typed() {
        for bad in [
            json!({}),
            json!({"_meta": 1}),
            json!({"_meta": {"io.modelcontextprotocol/clientCapabilities": {}}}),
            json!({"_meta": {"io.modelcontextprotocol/protocolVersion": 2026, "io.modelcontextprotocol/clientCapabilities": {}}}),
            json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}),
            json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": []}}),
        ] {
            assert_eq!(meta(bad.clone()).unwrap_err().code, -32602, "{bad}");
        }
    }

    #[test]
    fn progress_tokens() {
        let with = |token: Value| {
            meta(json!({"_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "progressToken": token
            }}))
        };
        assert_eq!(
            with(json!("p-1")).unwrap().progress_token,
            Some(json!("p-1"))
        );
        assert_eq!(with(json!(7)).unwrap().progress_token, Some(json!(7)));
        for bad in [json!(1.5), json!(null), json!({}), json!("x".repeat(300))] {
            assert_eq!(with(bad.clone()).unwrap_err().code, -32602, "{bad}");
        }
    }

    #[test]
    fn unsupported_version_names_both() {
        let m = meta(json!({"_meta": {
            "io.modelcontextprotocol/protocolVersion": "v999.0.0",
            "io.modelcontextprotocol/clientCapabilities": {}
        }}))
        .unwrap();
        let e = m.check_version().unwrap_err();
        assert_eq!(e.code, -32022);
        assert_eq!(e.data.unwrap()["requested"], "v999.0.0");
    }
}
