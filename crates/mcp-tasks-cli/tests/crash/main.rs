//! The crash-and-restart simulations on the embedded store, in one executable: killed
//! processes (`crash_process`), injected disk faults (`crash_faults`), power loss on a simulated
//! disk (`crash_power`) and, with the `failpoints` feature, failpoints at the dangerous spots
//! (`crash_failpoints`; run alone, since failpoints are process-wide). Every run prints its
//! seed (`docs/CRASH-TESTING.md`).

#[macro_use]
#[path = "../support/backend.rs"]
mod backend;
#[path = "../support/pg.rs"]
mod pg;
#[path = "../sim/mod.rs"]
mod sim;
#[path = "../support/mod.rs"]
mod support;

mod crash_failpoints;
mod crash_faults;
mod crash_power;
mod crash_process;
