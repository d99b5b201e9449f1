//! The integration tests that need no PostgreSQL server of their own and no failpoints, in one
//! executable (one link instead of one per file): the HTTP and stdio transports, both protocol
//! eras, authentication, quotas, the command line, the client, the store commands, the wire
//! goldens, metrics and OpenTelemetry (feature `otel`). Tests parameterised over the backend
//! run on PostgreSQL too when it is reachable (`support/backend.rs`).
//!
//! A test that needs the process to itself (a process-wide `metrics` recorder) re-runs itself
//! in a child process of this executable (`support::own_process`).

#[macro_use]
#[path = "../support/backend.rs"]
mod backend;
#[path = "../support/pg.rs"]
mod pg;
#[path = "../sim/mod.rs"]
mod sim;
#[path = "../support/mod.rs"]
mod support;

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
mod store_quota;
mod typed;
mod wire_golden;
