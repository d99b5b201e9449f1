//! mcp-tasks: durable tasks for MCP servers.
//!
//! A tool call that takes long becomes a *task*: it is stored in redb before its handle is
//! returned, runs inside an actor that snapshots every transition, and survives crashes and
//! restarts of the server. See `ARCHITECTURE.md` for the map.

pub mod error;
pub mod persist;
pub mod store;
pub mod task;
pub mod tool;
pub mod wire;
