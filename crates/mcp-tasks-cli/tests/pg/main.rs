//! The tests of the PostgreSQL store and of replicas sharing one database, in one executable:
//! the store itself, leases and fencing, owners and quotas, the listing index, the replica
//! fault reproductions, the replica crash suite and, with the `failpoints` feature, the
//! store's failpoints (run alone, since failpoints are process-wide). They skip, saying so, when no server is
//! reachable, unless `MCP_TASKS_REQUIRE_POSTGRES=1` (`.ci/run` sets it).
//!
//! `support`, `pg` and `sim` (the crash suite's driver and checker) are the support code the
//! three test executables share, compiled once in `mcp_tasks_testkit::support` (feature
//! `test-support`).

use mcp_tasks_testkit::support::{self, pg, sim};

mod console_replicas;
mod crash_replicas;
mod flow_replicas;
mod gateway_replicas;
mod postgres;
mod postgres_failpoints;
mod postgres_group_commit;
mod postgres_leases;
mod postgres_listing;
mod postgres_owners;
mod replica_faults;
mod replicas;
