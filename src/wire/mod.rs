//! Wire types of JSON-RPC 2.0 and MCP `2026-07-28` (pure: no IO, no actors).

/// The Tasks extension identifier.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";
/// The protocol versions this server implements.
pub const SUPPORTED_VERSIONS: &[&str] = &["2026-07-28"];
