//! The gateway's errors: configuration ([`GatewayError`]) and calls to an upstream
//! ([`UpstreamError`]), mapped to JSON-RPC errors in [`UpstreamError::to_rpc`].

use serde_json::Value;

use crate::wire::error::RpcError;

/// A gateway that cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// An upstream's configuration is wrong.
    #[error("upstream `{upstream}`: {reason}")]
    InvalidUpstream {
        /// The upstream's name.
        upstream: String,
        /// What is wrong.
        reason: String,
    },
    /// Two upstreams could list the same tool name.
    #[error("upstreams `{first}` and `{second}` {reason}")]
    Collision {
        /// One upstream.
        first: String,
        /// The other.
        second: String,
        /// Why their tool names could collide.
        reason: String,
    },
    /// A gateway needs at least one upstream.
    #[error("a gateway needs at least one upstream")]
    NoUpstream,
}

/// A call to an upstream that did not produce its answer. Every message names the upstream
/// by its configured name, never by its URL, command or credentials.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum UpstreamError {
    /// The request never reached the upstream: no connection could be made (refused, the
    /// connect timed out), its process could not start or was not running, no connection
    /// came within its timeout. Safe to send again, whatever the tool.
    #[error("upstream `{upstream}` is unreachable: {reason}")]
    NotSent {
        /// The upstream's name.
        upstream: String,
        /// Why, in the gateway's words.
        reason: String,
    },
    /// The connection broke after the request may have reached the upstream: the response
    /// stream broke or ended early, the connection was reset, the process exited.
    #[error("upstream `{upstream}` is unreachable: {reason}")]
    Unreachable {
        /// The upstream's name.
        upstream: String,
        /// Why, in the gateway's words.
        reason: String,
    },
    /// The upstream answered with an HTTP error status and no JSON-RPC answer.
    #[error("upstream `{upstream}` answered HTTP {status}{}", hint_text(.hint))]
    Http {
        /// The upstream's name.
        upstream: String,
        /// The status code.
        status: u16,
        /// What the gateway guesses is wrong, when it can (a 404 from a URL without a path:
        /// the MCP endpoint is usually `/mcp`; no host is named).
        hint: Option<String>,
    },
    /// The upstream said nothing for longer than its timeout.
    #[error("upstream `{upstream}` did not answer within {seconds} s")]
    Timeout {
        /// The upstream's name.
        upstream: String,
        /// The timeout.
        seconds: f64,
    },
    /// The upstream sent something MCP does not allow here.
    #[error("upstream `{upstream}` broke the protocol: {reason}")]
    Protocol {
        /// The upstream's name.
        upstream: String,
        /// What it sent.
        reason: String,
    },
    /// The upstream's tool list is over a bound ([`super::Upstream::max_tools`]).
    #[error("upstream `{upstream}` lists too many tools: {reason}")]
    TooManyTools {
        /// The upstream's name.
        upstream: String,
        /// Which bound.
        reason: String,
    },
    /// The upstream's state of an input round expired before the answer came
    /// ([`super::Upstream::state_ttl`]).
    #[error("upstream `{upstream}` {reason}")]
    StateExpired {
        /// The upstream's name.
        upstream: String,
        /// When it expired and why, in the gateway's words.
        reason: String,
    },
    /// The upstream answered with a JSON-RPC error.
    #[error("upstream `{upstream}`: {message}")]
    Rpc {
        /// The upstream's name.
        upstream: String,
        /// The error's code.
        code: i64,
        /// The error's message.
        message: String,
        /// The error's data (boxed: it is rare, and large).
        data: Option<Box<Value>>,
    },
}

fn hint_text(hint: &Option<String>) -> String {
    hint.as_deref()
        .map(|h| format!("; {h}"))
        .unwrap_or_default()
}

/// The hint of a 404 from `url`: an upstream URL without a path (`http://127.0.0.1:8000`)
/// usually wants the MCP endpoint's, `/mcp`. It names no host: the error reaches MCP clients
/// and the unauthenticated `/readyz`, which must not learn where the upstreams are
/// ([`suggested_url`] is for the operator's log).
pub(crate) fn not_found_hint(url: &str) -> Option<String> {
    suggested_url(url).map(|_| {
        "its URL has no path, and MCP servers usually answer at `/mcp`: end the upstream's URL with it"
            .to_owned()
    })
}

/// `url` with the path `/mcp`, when it has no path; its credentials, query and fragment left
/// out. For the log only.
pub(crate) fn suggested_url(url: &str) -> Option<String> {
    let mut parsed = reqwest::Url::parse(url).ok()?;
    if !matches!(parsed.path(), "" | "/") {
        return None;
    }
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    parsed.set_query(None);
    parsed.set_fragment(None);
    parsed.set_path("/mcp");
    Some(parsed.to_string())
}

impl UpstreamError {
    /// The upstream it is about.
    pub fn upstream(&self) -> &str {
        match self {
            Self::NotSent { upstream, .. }
            | Self::Unreachable { upstream, .. }
            | Self::Http { upstream, .. }
            | Self::Timeout { upstream, .. }
            | Self::Protocol { upstream, .. }
            | Self::TooManyTools { upstream, .. }
            | Self::StateExpired { upstream, .. }
            | Self::Rpc { upstream, .. } => upstream,
        }
    }

    /// A short label for metrics: `unreachable` (also for [`Self::NotSent`]), `http`,
    /// `timeout`, `protocol`, `tools`, `expired`, `rpc`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotSent { .. } | Self::Unreachable { .. } => "unreachable",
            Self::Http { .. } => "http",
            Self::Timeout { .. } => "timeout",
            Self::Protocol { .. } => "protocol",
            Self::TooManyTools { .. } => "tools",
            Self::StateExpired { .. } => "expired",
            Self::Rpc { .. } => "rpc",
        }
    }

    /// The JSON-RPC error a client gets: the upstream's own error with its code (its message
    /// prefixed with the upstream's name), `-32603` for everything else.
    pub fn to_rpc(&self) -> RpcError {
        match self {
            Self::Rpc { code, data, .. } => {
                let mut e = RpcError::new(*code, self.to_string());
                e.data = data.as_deref().cloned();
                e
            }
            _ => RpcError::internal(self.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_404_from_a_url_without_a_path_hints_at_mcp() {
        assert_eq!(
            suggested_url("http://127.0.0.1:8000").as_deref(),
            Some("http://127.0.0.1:8000/mcp")
        );
        assert_eq!(
            suggested_url("https://user:s3cret@example.test/?key=s3cret").as_deref(),
            Some("https://example.test/mcp")
        );
        assert_eq!(suggested_url("http://127.0.0.1:8000/mcp"), None);
        assert_eq!(suggested_url("http://127.0.0.1:8000/api/"), None);
        assert_eq!(not_found_hint("http://127.0.0.1:8000/api/"), None);
        let e = UpstreamError::Http {
            upstream: "a".into(),
            status: 404,
            hint: not_found_hint("http://127.0.0.1:8000/"),
        };
        assert_eq!(
            e.to_string(),
            "upstream `a` answered HTTP 404; its URL has no path, and MCP servers usually answer at `/mcp`: end the upstream's URL with it"
        );
    }
}
