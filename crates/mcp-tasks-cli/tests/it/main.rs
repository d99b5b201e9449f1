//! The integration tests that need no PostgreSQL server of their own and no failpoints, in one
//! executable (one link instead of one per file): the HTTP and stdio transports, both protocol
//! eras, authentication, quotas, the command line, the client, the store commands, the wire
//! goldens, metrics and OpenTelemetry (feature `otel`). Tests parameterised over the backend
//! run on PostgreSQL too when it is reachable (`backend`, `on_both_stores!`).
//!
//! A test that needs the process to itself (a process-wide `metrics` recorder) re-runs itself
//! in a child process of this executable (`support::own_process`).
//!
//! `support`, `backend`, `pg` and `sim` (the crash simulations' code) are the support code the
//! three test executables share, compiled once in `mcp_tasks_testkit::support` (feature
//! `test-support`); `support` here adds the helpers only this executable uses, from
//! `tests/support/`.

#[macro_use]
extern crate mcp_tasks_testkit;

use mcp_tasks_testkit::support::{backend, pg, sim};

/// The shared support code and, from `tests/support/`, this executable's own: the raw HTTP
/// client of the transport suites, the `2025-11-25` client and headless Chromium.
// On an inline module, `#[path]` names the folder its file modules are read from.
#[path = "../support"]
mod support {
    pub use mcp_tasks_testkit::support::*;

    pub mod browser;
    pub mod legacy;
    pub mod raw_http;
}

mod auth;
mod auth_cli;
mod auth_jwks;
mod bad_input;
mod cli;
mod client;
mod console;
mod console_browser;
mod console_security;
mod deploy;
mod features;
mod fixtures;
mod flow;
mod gateway;
mod gateway_fastmcp;
mod gateway_hostile;
mod gateway_outage;
mod http;
mod layering;
mod legacy_http;
mod legacy_stdio;
mod listen;
mod metrics;
mod otel;
mod otel_metrics;
mod passivation;
mod quota;
mod restart;
mod runtime;
mod service;
mod stdio;
mod store_admin;
mod store_conformance;
mod store_quota;
mod typed;
mod wire_golden;
