//! What mcp-tasks is tested and demonstrated with (not published): the tools the binary serves
//! for the conformance suite and the benches (`fixtures`, `mcp-tasks serve --fixtures`), the
//! crash-test workload (`sim`), the demo (`mcp-tasks demo`), with `postgres`, the replicas
//! demo (`mcp-tasks demo --replicas`) and, with `test-support`, what the command line's
//! integration tests share (`support`; only its `[dev-dependencies]` enable the feature, so the
//! binary people install compiles none of it).
//!
//! It builds on the library's public API; where a test needs more it goes through
//! `mcp_tasks::internals`, which has no stability promise.
#![deny(missing_docs)]

pub mod demo;
pub mod fixtures;
#[cfg(feature = "postgres")]
pub mod replicas_demo;
pub mod sim;
#[cfg(feature = "test-support")]
pub mod support;
