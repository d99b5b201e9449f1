#![doc = include_str!("../README.md")]
// On docs.rs (nightly, `--cfg docsrs`): each item gated by a feature says which.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![forbid(unsafe_code)]
//!
//! # Layout
//!
//! (`ARCHITECTURE.md` in the repository has the map.) The public API is what this page lists: the runtime ([`Runtime`], [`RuntimeBuilder`],
//! [`RuntimeHandle`], [`RuntimeConfig`]), the [`tool`] API, the [`catalog`] of prompts and
//! resources with their [`content`], the [`transport`]s (Streamable HTTP and stdio),
//! `auth` (feature `http`), per-owner [`quota`]s, the [`clock`], the syntax of durations and sizes
//! ([`units`]), the [`store`] backends (and the
//! [`store::TaskStore`] trait for a host's own: the `mcp-tasks-store` crate, re-exported,
//! which names nothing of this library and so sits below every layer), the `client` module (feature `client`), the
//! `gateway` module (feature `gateway`: upstream MCP servers' tools as durable tasks), the
//! `otel` module (feature `otel`: OpenTelemetry export of the spans), the `console` module
//! (feature `console`: the operator console), and the
//! types re-exported here. Everything is layered bottom-up, each module naming only modules
//! of the layers below its own (the workspace's `tests/it/layering.rs` reads this list and
//! checks every `crate::` path of the library against it):
//!
//! 1. `wire` (JSON-RPC and MCP wire shapes, error codes; no IO), `clock`, `content`, `units`,
//!    `failpoints`: the foundations.
//! 2. `task` (the domain), `limits`.
//! 3. `persist` (the snapshot format), `tool`, `quota`, `auth`, `telemetry`: what hosts
//!    provide and configure.
//! 4. `catalog`, `otel`.
//! 5. `shared` (the state one runtime shares: store, tools, live tasks, config), `admin`
//!    (the store's administration).
//! 6. `actor`: task actors, the supervisor, listen subscribers.
//! 7. `protocol`: the dispatcher, and the one mapping of internal errors to JSON-RPC errors.
//! 8. `runtime`.
//! 9. `legacy` (the `2025-11-25` adapter), `client`.
//! 10. `era` (the one entry of both protocol eras, which every transport calls), `gateway`
//!     (it shares the client's SSE reader: a [`tool::ToolSource`] of upstream tools that the
//!     runtime below knows only through that trait).
//! 11. `transport`.
//! 12. `console`.
//!
//! # Features
//!
//! - `redb` (default): `store::RedbStore`, the embedded one-file store.
//! - `http` (default): the Streamable HTTP transport (`transport::http`) and `auth`.
//! - `jwt`: `auth::JwtVerifier`, OAuth 2.1 access tokens (implies `http`).
//! - `client`: the `client` module, an MCP client for any Tasks server.
//! - `gateway`: the `gateway` module, upstream MCP servers (HTTP or stdio) whose tools the
//!   runtime serves as durable tasks (implies `client`).
//! - `console`: the `console` module, the operator console (a web page and a JSON API over
//!   every stored task, with actions; implies `http`).
//! - `postgres`: `store::PostgresStore`, replicas sharing one database.
//! - `otel`: the `otel` module, OpenTelemetry export of the runtime's spans and metrics.
//! - `failpoints`: crash-test failpoints.
//!
//! With `default-features = false, features = ["redb"]` the build has no HTTP server, TLS
//! client, JWT or TOML.

/// The workspace README's Rust examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct WorkspaceReadme;

/// The client library's example in the workspace's `docs/CLI.md`, compiled as a doctest.
#[cfg(all(doctest, feature = "client"))]
#[doc = include_str!("../../../docs/CLI.md")]
struct CliDoc;

// The internal layers. Some of their items are public only through `internals` below, for the
// workspace's tests: `missing_docs` is for the public API.
mod actor;
mod era;
mod limits;
#[allow(missing_docs)]
mod persist;
#[allow(missing_docs)]
mod protocol;
mod runtime;
mod shared;
#[allow(missing_docs)]
mod task;
#[allow(missing_docs)]
mod wire;

/// Internal items for this workspace's own tests, benches and test kit.
///
/// Not part of the public API: hidden from the docs, no stability promise, never needed by an
/// embedder. It exists so that the integration tests (in `mcp-tasks-cli`) and the test kit can
/// reach into the store and the domain without a feature that changes the library for them.
/// Everything here re-exports an internal module's public items under the module's name.
#[doc(hidden)]
#[allow(missing_docs)]
pub mod internals {
    pub mod persist {
        pub use crate::persist::*;
    }
    pub mod protocol {
        pub use crate::protocol::*;
    }
    pub mod task {
        pub use crate::task::*;
    }
    pub mod wire {
        pub use crate::wire::*;
    }

    /// What the listing index keeps of a record (benches that fill a store directly).
    pub fn listing_of(record: &crate::task::TaskRecord) -> crate::store::listing::Listing {
        crate::persist::listing_of(record)
    }

    /// Faults a test injects into one replica's PostgreSQL store.
    #[cfg(feature = "postgres")]
    pub mod pg_faults {
        use crate::store::PostgresStore;

        /// Drops (or stops dropping) the notifications this node receives, as if they were
        /// lost: only the polling fallback delivers other nodes' changes meanwhile.
        pub fn lose_notifications(store: &PostgresStore, lose: bool) {
            store.lose_notifications(lose)
        }

        /// Stops (or resumes) this node's heartbeats, as if the process were paused: once the
        /// TTL passes, other nodes take its tasks over.
        pub fn pause_heartbeat(store: &PostgresStore, paused: bool) {
            store.pause_heartbeat(paused)
        }

        /// The next `n` commits are applied and committed, but reported failed (as if the
        /// answer to `COMMIT` were lost on the network).
        pub fn lose_commit_acks(store: &PostgresStore, n: u64) {
            store.lose_commit_acks(n)
        }

        /// Makes every statement of this node fail (or stops doing so) as if the database
        /// could not be reached (the listening connection is left alone).
        pub fn simulate_outage(store: &PostgresStore, down: bool) {
            store.simulate_outage(down)
        }
    }

    /// The raw store of a runtime, which can break every invariant of the runtime (delete a
    /// live task, replace the signing key): only for tests.
    pub fn runtime_store(runtime: &crate::Runtime) -> &crate::store::Store {
        runtime.shared_store()
    }
}

pub mod admin;
#[cfg(feature = "http")]
pub mod auth;
pub mod catalog;
#[cfg(feature = "client")]
pub mod client;
pub mod clock;
#[cfg(feature = "console")]
pub mod console;
pub mod content;
#[cfg(feature = "failpoints")]
pub mod failpoints;
#[cfg(feature = "gateway")]
pub mod gateway;
pub mod legacy;
#[cfg(feature = "otel")]
pub mod otel;
pub mod quota;
/// Where tasks are persisted: the `mcp-tasks-store` crate, re-exported so that its paths
/// (`mcp_tasks::store::Store`, `mcp_tasks::store::RedbStore`, …) are the library's.
#[doc(inline)]
pub use mcp_tasks_store as store;
pub mod telemetry;
pub mod tool;
pub mod transport;
pub mod units;

pub use limits::Limits;
pub use persist::TaskIndexer;
pub use protocol::{Dispatched, MessageStream, Reply, RequestContext, RoutingHeaders};
pub use runtime::{Runtime, RuntimeBuilder, RuntimeHandle, StartError};
pub use shared::{RuntimeConfig, RuntimeError};
#[cfg(feature = "redb")]
pub use store::BackendFactory;
pub use store::{Durability, StoreError, StoreOptions};
pub use task::{Owner, TaskId, TaskIdError, TaskStatus};
pub use wire::error::{RpcError, code};
pub use wire::results::CacheHints;
pub use wire::{PROTOCOL_VERSION, ServerInfo, TASKS_EXTENSION};
