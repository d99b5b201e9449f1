//! mcp-tasks: durable tasks for MCP servers.
//!
//! A tool call that takes long becomes a *task*: it is stored in redb before its handle is
//! returned, runs inside an actor that snapshots every transition, and survives crashes and
//! restarts of the server. See `ARCHITECTURE.md` for the map.
//!
//! Embedding in three lines: build a [`Runtime`] on a redb file with your [`tool::Tool`]s,
//! hand it JSON-RPC messages with [`Runtime::handle_message`], and [`Runtime::shutdown`] it.

pub mod actor;
pub mod admin;
pub mod auth;
pub mod catalog;
#[cfg(feature = "client")]
pub mod client;
pub mod clock;
pub mod content;
pub mod demo;
pub mod error;
#[cfg(feature = "failpoints")]
pub mod failpoints;
pub mod fixtures;
pub mod legacy;
pub mod limits;
pub mod persist;
pub mod protocol;
pub mod quota;
#[cfg(feature = "postgres")]
pub mod replicas_demo;
pub mod runtime;
pub mod sim;
pub mod store;
pub mod task;
pub mod tool;
pub mod transport;
pub mod wire;

pub use error::{RpcError, RuntimeError};
pub use limits::Limits;
pub use protocol::{MessageStream, Outcome, Reply, RequestContext, RoutingHeaders};
pub use runtime::{Runtime, RuntimeBuilder, RuntimeConfig, RuntimeHandle, StartError};
pub use task::{Owner, TaskId, TaskStatus};
