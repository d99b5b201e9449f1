//! Wire types of JSON-RPC 2.0 and MCP `2026-07-28` with the Tasks extension.
//!
//! Pure: no IO, no actors, no store. [`jsonrpc`] reads one message into an envelope,
//! [`meta`] validates the per-request `_meta`, [`params`] reads the parameters of the methods
//! this server handles, and [`results`] builds every result shape (flat task objects,
//! cache hints, `resultType`, server identity).

pub mod error;
pub mod jsonrpc;
pub mod meta;
pub mod params;
pub mod results;

use serde_json::Value;

/// The Tasks extension identifier.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";
/// The protocol versions this server implements.
pub const SUPPORTED_VERSIONS: &[&str] = &["2026-07-28"];
/// The current protocol version.
pub const PROTOCOL_VERSION: &str = "2026-07-28";

/// `_meta` keys of the core protocol.
pub mod keys {
    /// `_meta` key of the request's protocol version.
    pub const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
    /// `_meta` key of the client's capabilities.
    pub const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
    /// `_meta` key of the client's name and version.
    pub const CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
    /// `_meta` key of the client's requested log level.
    pub const LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
    /// `_meta` key of the server's name and version.
    pub const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
    /// `_meta` key of the listen a notification belongs to.
    pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
}

/// Methods this server answers.
pub mod methods {
    /// `server/discover`.
    pub const DISCOVER: &str = "server/discover";
    /// `tools/list`.
    pub const TOOLS_LIST: &str = "tools/list";
    /// `tools/call`.
    pub const TOOLS_CALL: &str = "tools/call";
    /// `tasks/get`.
    pub const TASKS_GET: &str = "tasks/get";
    /// `tasks/update`.
    pub const TASKS_UPDATE: &str = "tasks/update";
    /// `tasks/cancel`.
    pub const TASKS_CANCEL: &str = "tasks/cancel";
    /// `subscriptions/listen`.
    pub const SUBSCRIPTIONS_LISTEN: &str = "subscriptions/listen";
    /// `prompts/list`.
    pub const PROMPTS_LIST: &str = "prompts/list";
    /// `prompts/get`.
    pub const PROMPTS_GET: &str = "prompts/get";
    /// `resources/list`.
    pub const RESOURCES_LIST: &str = "resources/list";
    /// `resources/templates/list`.
    pub const RESOURCES_TEMPLATES_LIST: &str = "resources/templates/list";
    /// `resources/read`.
    pub const RESOURCES_READ: &str = "resources/read";
    /// `completion/complete`.
    pub const COMPLETION_COMPLETE: &str = "completion/complete";

    /// The body member that a request's `Mcp-Name` routing header mirrors: the tool or
    /// prompt `name`, the resource `uri`, the Tasks extension's `taskId`.
    pub fn named_member(method: &str) -> Option<&'static str> {
        match method {
            TOOLS_CALL | PROMPTS_GET => Some("name"),
            RESOURCES_READ => Some("uri"),
            TASKS_GET | TASKS_UPDATE | TASKS_CANCEL => Some("taskId"),
            _ => None,
        }
    }

    /// Methods removed from `2026-07-28` (or from the Tasks extension): always `-32601`.
    pub const REMOVED: &[&str] = &[
        "initialize",
        "notifications/initialized",
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
        "tasks/result",
        "tasks/list",
    ];
}

/// The severity of a log message (`LoggingLevel`, RFC 5424 order: `Debug` is the least
/// severe). A request that asks for log messages at one level gets that level and every more
/// severe one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// Detailed debugging information.
    Debug,
    /// General informational messages.
    Info,
    /// Normal but significant events.
    Notice,
    /// Warning conditions.
    Warning,
    /// Error conditions.
    Error,
    /// Critical conditions.
    Critical,
    /// Action must be taken immediately.
    Alert,
    /// The system is unusable.
    Emergency,
}

impl LogLevel {
    const ALL: [LogLevel; 8] = [
        LogLevel::Debug,
        LogLevel::Info,
        LogLevel::Notice,
        LogLevel::Warning,
        LogLevel::Error,
        LogLevel::Critical,
        LogLevel::Alert,
        LogLevel::Emergency,
    ];

    /// The wire spelling (`"debug"` … `"emergency"`).
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Notice => "notice",
            LogLevel::Warning => "warning",
            LogLevel::Error => "error",
            LogLevel::Critical => "critical",
            LogLevel::Alert => "alert",
            LogLevel::Emergency => "emergency",
        }
    }

    /// Reads the wire spelling; `None` for anything else.
    pub fn from_wire(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|l| l.as_str() == s)
    }
}

/// Limits that keep hostile input cheap to reject.
pub mod limits {
    /// Largest accepted message, in bytes.
    pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
    /// Longest accepted method name, tool name, string request id or `_meta` string.
    pub const MAX_NAME_LEN: usize = 256;
    /// Longest accepted protocol version string.
    pub const MAX_VERSION_LEN: usize = 64;
}

/// Name and version this server reports in every result's `_meta`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// The server's name.
    pub name: String,
    /// Its version.
    pub version: String,
}

impl ServerInfo {
    /// Name and version.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
        }
    }

    /// The `Implementation` object.
    pub fn to_json(&self) -> Value {
        serde_json::json!({ "name": self.name, "version": self.version })
    }
}

impl Default for ServerInfo {
    fn default() -> Self {
        Self::new("mcp-tasks", env!("CARGO_PKG_VERSION"))
    }
}

/// Formats milliseconds since the Unix epoch as an ISO 8601 / RFC 3339 UTC timestamp with
/// exactly three fractional digits, so that timestamps of one task sort as text too.
pub fn iso8601(ms: u64) -> String {
    // Written by hand: this runs twice for every task object served, and the `time` crate's
    // formatter costs several times more than the digits themselves.
    let nanos = i128::from(ms) * 1_000_000;
    let Ok(t) = time::OffsetDateTime::from_unix_timestamp_nanos(nanos) else {
        return "1970-01-01T00:00:00.000Z".to_owned();
    };
    let mut s = String::with_capacity(24);
    let digits = |s: &mut String, value: u32, width: u32| {
        for i in (0..width).rev() {
            let d = (value / 10u32.pow(i)) % 10;
            s.push(char::from(b'0' + d as u8));
        }
    };
    // Timestamps from a u64 of milliseconds start in 1970; `time` stops at year 9999.
    digits(&mut s, u32::try_from(t.year()).unwrap_or(0), 4);
    s.push('-');
    digits(&mut s, u32::from(u8::from(t.month())), 2);
    s.push('-');
    digits(&mut s, u32::from(t.day()), 2);
    s.push('T');
    digits(&mut s, u32::from(t.hour()), 2);
    s.push(':');
    digits(&mut s, u32::from(t.minute()), 2);
    s.push(':');
    digits(&mut s, u32::from(t.second()), 2);
    s.push('.');
    digits(&mut s, u32::from(t.millisecond()), 3);
    s.push('Z');
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn iso8601_formats_utc() {
        assert_eq!(super::iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            super::iso8601(1_787_308_200_000),
            "2026-08-21T10:30:00.000Z"
        );
        assert_eq!(
            super::iso8601(1_787_308_200_123),
            "2026-08-21T10:30:00.123Z"
        );
        assert_eq!(super::iso8601(951_782_400_007), "2000-02-29T00:00:00.007Z");
        assert_eq!(
            super::iso8601(253_402_300_799_999),
            "9999-12-31T23:59:59.999Z"
        );
        // Past what a date can hold: the epoch, as before.
        assert_eq!(super::iso8601(u64::MAX), "1970-01-01T00:00:00.000Z");
    }
}
