//! The crash-and-restart simulations on the embedded store, in one executable: killed
//! processes (`crash_process`), injected disk faults (`crash_faults`), power loss on a simulated
//! disk (`crash_power`) and, with the `failpoints` feature, failpoints at the dangerous spots
//! (`crash_failpoints`; run alone, since failpoints are process-wide). Every run prints its
//! seed (`docs/CRASH-TESTING.md`).
//!
//! `support` and `sim` (the simulations' driver, checker and simulated disk) are the support
//! code the three test executables share, compiled once in `mcp_tasks_testkit::support`
//! (feature `test-support`).

use mcp_tasks_testkit::support::{self, sim};

mod crash_failpoints;
mod crash_faults;
mod crash_power;
mod crash_process;
