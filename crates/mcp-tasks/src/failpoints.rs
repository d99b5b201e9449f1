//! Failpoints (feature `failpoints`, off by default): named spots where a test can inject a
//! pause, a panic, an error or a simulated crash with the `fail` crate, and the test-only
//! *breakers* that switch an invariant off on purpose, so that a test can prove the crash
//! checker notices. Without the feature none of this is compiled.
//!
//! | name                       | where                                                          |
//! |----------------------------|----------------------------------------------------------------|
//! | `store::group_commit`      | inside a group commit: ops applied, commit not started (`return` fails the batch) |
//! | `create::after_commit`     | `tools/call`: the new task is committed, the handle not yet sent |
//! | `task::after_commit`       | task actor: a transition is committed, not yet swapped, replied or published |
//! | `task::after_failed_commit` | task actor: a transition's commit failed with a store error (outcome unknown), the actor not yet failed |
//! | `step::before_commit`      | `ToolContext::step`: the step ran, its value is not committed  |
//! | `runtime::before_claimed` | replicas: orphans claimed, not yet handed to the supervisor (`return(MS)` pauses that long, asynchronously) |
//! | `supervisor::rehydrate`    | start-up rehydration, before each live task's actor is spawned |
//! | `break::reply_before_commit` | breaker (`return`): a task actor publishes a transition before committing it |
//! | `break::skip_step_journal` | breaker (`return`): `step` ignores recorded results and runs again |
//! | `break::skip_is_behind`    | breaker (`return`): a request for a task reaches this node's actor without the check that the actor is not behind the stored record (as if the record moved right after the check) |
//!
//! Failpoint names and actions are process-global (the `fail` crate's registry): tests that
//! configure them must not run in parallel with each other (`fail::FailScenario` serialises).

/// Whether the breaker `name` is switched on (configured with the `return` action).
pub(crate) fn breaker(name: &str) -> bool {
    (|| {
        fail::fail_point!(name, |_| true);
        false
    })()
}
