#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
//!
//! # Layout
//!
//! (`ARCHITECTURE.md` in the repository has the map.) The public API is what this page lists: the runtime ([`Runtime`], [`RuntimeBuilder`],
//! [`RuntimeHandle`], [`RuntimeConfig`]), the [`tool`] API, the [`catalog`] of prompts and
//! resources with their [`content`], the [`transport`]s (Streamable HTTP and stdio),
//! [`auth`], per-owner [`quota`]s, the [`clock`], the syntax of durations and sizes
//! ([`units`]), the [`store`] backends (and the
//! [`store::TaskStore`] trait for a host's own), the `client` module (feature `client`), the
//! `otel` module (feature `otel`: OpenTelemetry export of the spans), and the
//! types re-exported here. Everything else is internal and layered bottom-up, each layer
//! naming only the ones below it (checked by `tests/layering.rs`):
//!
//! - `wire`: JSON-RPC and MCP wire shapes, error codes; no IO.
//! - `task`, `persist`, `store`: the domain, its snapshot format, the redb store.
//! - `tool`, `catalog`, `content`, `quota`, `limits`, `clock`, `auth`: what hosts provide.
//! - `shared`: the state one runtime shares (store, tools, live tasks, config).
//! - `actor`: task actors, the supervisor, listen subscribers.
//! - `protocol`: the dispatcher, and the one mapping of internal errors to JSON-RPC errors.
//! - `runtime`, then `transport` and `client` on top.
//!
//! # Features
//!
//! - `client` (default): the `client` module, an MCP client for any Tasks server.
//! - `cli` (default): the `mcp-tasks` binary's own dependencies (`clap`,
//!   `tracing-subscriber`); an embedder can turn it off with `default-features = false`.
//! - `fixtures`: the demo (and, with `postgres`, the replicas demo), the conformance and
//!   benchmark fixtures and the crash-test workload (used by the binary and the tests).
//! - `otel`: the `otel` module, OpenTelemetry export of the runtime's spans.
//! - `failpoints`: crash-test failpoints.
//! - `unstable-internals`: exposes the internal modules to this crate's own tests; no
//!   stability promise, never needed by an embedder.

/// Declares an internal module: `pub(crate)`, or `pub` and hidden from the docs with the
/// `unstable-internals` feature (this crate's own tests reach into the store and the domain).
macro_rules! internal {
    ($($name:ident),* $(,)?) => {$(
        #[cfg(feature = "unstable-internals")]
        #[doc(hidden)]
        #[allow(missing_docs)]
        pub mod $name;
        #[cfg(not(feature = "unstable-internals"))]
        pub(crate) mod $name;
    )*};
}

internal!(
    actor, limits, persist, protocol, runtime, shared, task, wire
);

pub mod admin;
pub mod auth;
pub mod catalog;
#[cfg(feature = "client")]
pub mod client;
pub mod clock;
pub mod content;
#[cfg(feature = "fixtures")]
pub mod demo;
#[cfg(feature = "failpoints")]
pub mod failpoints;
#[cfg(feature = "fixtures")]
pub mod fixtures;
pub mod legacy;
#[cfg(feature = "otel")]
pub mod otel;
pub mod quota;
#[cfg(all(feature = "postgres", feature = "fixtures"))]
pub mod replicas_demo;
#[cfg(feature = "fixtures")]
pub mod sim;
pub mod store;
pub mod telemetry;
pub mod tool;
pub mod transport;
pub mod units;

pub use limits::Limits;
pub use protocol::{Dispatched, MessageStream, Reply, RequestContext, RoutingHeaders};
pub use runtime::{Runtime, RuntimeBuilder, RuntimeHandle, StartError};
pub use shared::{RuntimeConfig, RuntimeError};
pub use store::{BackendFactory, Durability, StoreError, StoreOptions};
pub use task::{Owner, TaskId, TaskIdError, TaskStatus};
pub use wire::error::{RpcError, code};
pub use wire::results::CacheHints;
pub use wire::{PROTOCOL_VERSION, ServerInfo, TASKS_EXTENSION};
