//! Metrics and their names.
//!
//! The runtime records through the [`metrics`] facade: without an installed recorder every
//! call is a no-op, with one (the binary installs the Prometheus exporter for
//! `serve --metrics-listen`) these series exist. The recorder is the process's: two runtimes
//! in one process add up into the same series. Names and labels follow the OpenTelemetry
//! semantic conventions for MCP where they exist (`mcp.server.operation.duration` with
//! `mcp.method.name`, in Prometheus spelling), and use the `mcp_tasks_` prefix otherwise.
//!
//! | name | kind | labels | what |
//! |------|------|--------|------|
//! | `mcp_server_operation_duration_seconds` | histogram | `mcp_method_name`, `outcome`, `error_type` | one JSON-RPC request, from its bytes to its answer (`outcome`: `ok` or `error`; a failed one also has `error_type`, its JSON-RPC error code when JSON-RPC or MCP defines it, else `other`, as the conventions' `error.type`) |
//! | `mcp_tasks_tasks` | gauge | `status` | live tasks this node holds (with an actor, or parked without one), by status |
//! | `mcp_tasks_parked_tasks` | gauge | | live tasks parked without an actor while they wait for input (`RuntimeConfig::passivate_after`) |
//! | `mcp_tasks_passivations_total` | counter | | task actors passivated (stopped while their task waits for input) |
//! | `mcp_tasks_task_transitions_total` | counter | `to` | committed status changes, creations included |
//! | `mcp_tasks_store_commit_duration_seconds` | histogram | | one group commit (one write transaction, one fsync) |
//! | `mcp_tasks_store_commit_batch_ops` | histogram | | the write operations one group commit carried |
//! | `mcp_tasks_recovery_duration_seconds` | gauge | | how long rehydrating the live tasks took at the last start |
//! | `mcp_tasks_recovered_tasks` | gauge | | live tasks rehydrated at the last start |
//! | `mcp_tasks_queued_tasks` | gauge | `tool` | tasks (and synchronous calls) waiting for a flow-control slot (`serve --max-running`), by tool |
//! | `mcp_tasks_running_limited_tasks` | gauge | `tool` | tasks (and synchronous calls) holding a flow-control slot, by tool: the running count the limits of that tool, of `*` and of each owner are checked against |
//! | `mcp_tasks_subscriptions` | gauge | | open `subscriptions/listen` streams |
//! | `mcp_tasks_subscription_dropped_total` | counter | | committed snapshots of a followed task a listener never got, a newer one sent instead (latest wins: replaced while the stream was full, or superseded before its follower read it) |
//! | `mcp_tasks_upstream_calls_total` | counter | `upstream` | calls of an upstream tool through the gateway (feature `gateway`) |
//! | `mcp_tasks_upstream_errors_total` | counter | `upstream`, `kind` | failed upstream calls and connections: `kind` `unreachable`, `http`, `timeout`, `protocol` or `rpc` (the upstream's own JSON-RPC error) |
//! | `mcp_tasks_upstream_call_duration_seconds` | histogram | `upstream` | one upstream call, from the request to its answer (waits for the client's input included) |
//! | `mcp_tasks_upstream_retries_total` | counter | `upstream` | upstream calls sent again within one run after their connection broke or was refused (docs/GATEWAY.md, "Retry rules") |
//! | `mcp_tasks_auth_failures_total` | counter | `surface`, `outcome` | refused credentials: `surface` `mcp` (a bearer token on the MCP endpoint) or `console` (a login, a bearer header or a session of the console); `outcome` `invalid_token` (the authenticator refused it), `insufficient_scope` (the console refused a credential the endpoint would refuse), `session` (a console session unknown, expired, idle too long, or whose credential was revoked) or `throttled` (`429` before checking: too many failures from its address or for its claimed principal) |
//! | `mcp_tasks_refusals_total` | counter | `reason`, `quota` | requests refused before any work: `reason` `401` (no or a bad credential), `403` (a foreign or repeated `Host`/`Origin`, a missing scope, a read-only credential asking for a write), `408` (body too slow), `413` (body too large) on HTTP; `429` for a quota refusal (`-32010`) on any transport, with the quota's name in `quota` |

use std::time::Duration;

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};

use crate::task::TaskStatus;
use crate::wire::methods;

/// `mcp_server_operation_duration_seconds`.
pub const OPERATION_DURATION: &str = "mcp_server_operation_duration_seconds";
/// `mcp_tasks_tasks`.
pub const TASKS: &str = "mcp_tasks_tasks";
/// `mcp_tasks_parked_tasks`.
pub const PARKED_TASKS: &str = "mcp_tasks_parked_tasks";
/// `mcp_tasks_passivations_total`.
pub const PASSIVATIONS: &str = "mcp_tasks_passivations_total";
/// `mcp_tasks_task_transitions_total`.
pub const TASK_TRANSITIONS: &str = "mcp_tasks_task_transitions_total";
/// `mcp_tasks_store_commit_duration_seconds` and `mcp_tasks_store_commit_batch_ops`, which
/// the store records itself.
pub use crate::store::telemetry::{STORE_COMMIT_BATCH_OPS, STORE_COMMIT_DURATION};
/// `mcp_tasks_recovery_duration_seconds`.
pub const RECOVERY_DURATION: &str = "mcp_tasks_recovery_duration_seconds";
/// `mcp_tasks_recovered_tasks`.
pub const RECOVERED_TASKS: &str = "mcp_tasks_recovered_tasks";
/// `mcp_tasks_queued_tasks`.
pub const QUEUED_TASKS: &str = "mcp_tasks_queued_tasks";
/// `mcp_tasks_running_limited_tasks`.
pub const RUNNING_LIMITED_TASKS: &str = "mcp_tasks_running_limited_tasks";
/// `mcp_tasks_subscriptions`.
pub const SUBSCRIPTIONS: &str = "mcp_tasks_subscriptions";
/// `mcp_tasks_subscription_dropped_total`.
pub const SUBSCRIPTION_DROPPED: &str = "mcp_tasks_subscription_dropped_total";

/// `mcp_tasks_refusals_total`.
pub const REFUSALS: &str = "mcp_tasks_refusals_total";
/// `mcp_tasks_auth_failures_total`.
pub const AUTH_FAILURES: &str = "mcp_tasks_auth_failures_total";
/// `mcp_tasks_upstream_calls_total`.
pub const UPSTREAM_CALLS: &str = "mcp_tasks_upstream_calls_total";
/// `mcp_tasks_upstream_errors_total`.
pub const UPSTREAM_ERRORS: &str = "mcp_tasks_upstream_errors_total";
/// `mcp_tasks_upstream_call_duration_seconds`.
pub const UPSTREAM_CALL_DURATION: &str = "mcp_tasks_upstream_call_duration_seconds";
/// `mcp_tasks_upstream_retries_total`.
pub const UPSTREAM_RETRIES: &str = "mcp_tasks_upstream_retries_total";

/// Registers the descriptions and units of every series with the installed recorder; call it
/// once after installing one (exporters show them as `# HELP`).
pub fn describe() {
    describe_histogram!(
        OPERATION_DURATION,
        Unit::Seconds,
        "Duration of one MCP request, by method and outcome."
    );
    describe_gauge!(
        TASKS,
        "Live tasks this node holds (with an actor or parked), by status."
    );
    describe_gauge!(
        PARKED_TASKS,
        "Live tasks parked without an actor while they wait for input."
    );
    describe_counter!(
        AUTH_FAILURES,
        "Refused credentials, by surface (mcp, console) and outcome."
    );
    describe_counter!(
        PASSIVATIONS,
        "Task actors passivated while their task waits for input."
    );
    describe_counter!(
        TASK_TRANSITIONS,
        "Committed task status changes, by new status."
    );
    describe_histogram!(
        STORE_COMMIT_DURATION,
        Unit::Seconds,
        "Duration of one store group commit."
    );
    describe_histogram!(
        STORE_COMMIT_BATCH_OPS,
        Unit::Count,
        "Write operations carried by one store group commit."
    );
    describe_gauge!(
        RECOVERY_DURATION,
        Unit::Seconds,
        "Time taken to rehydrate live tasks at the last start."
    );
    describe_gauge!(RECOVERED_TASKS, "Live tasks rehydrated at the last start.");
    describe_gauge!(SUBSCRIPTIONS, "Open subscriptions/listen streams.");
    describe_gauge!(
        QUEUED_TASKS,
        "Tasks waiting for a flow-control slot, by tool."
    );
    describe_gauge!(
        RUNNING_LIMITED_TASKS,
        "Tasks holding a flow-control slot, by tool."
    );
    describe_counter!(
        REFUSALS,
        "Requests refused before any work, by reason (HTTP status) and, for 429, quota."
    );
    describe_counter!(
        SUBSCRIPTION_DROPPED,
        "Task snapshots replaced by a newer one before a slow listener read them."
    );
    describe_counter!(
        UPSTREAM_CALLS,
        "Calls of upstream tools through the gateway, by upstream."
    );
    describe_counter!(
        UPSTREAM_ERRORS,
        "Failed upstream calls and connections, by upstream and kind."
    );
    describe_histogram!(
        UPSTREAM_CALL_DURATION,
        Unit::Seconds,
        "Duration of one upstream call through the gateway, by upstream."
    );
    describe_counter!(
        UPSTREAM_RETRIES,
        "Upstream calls sent again after their connection broke or was refused, by upstream."
    );
}

/// The name of a request's span in the OpenTelemetry semantic conventions for MCP:
/// `{mcp.method.name} {target}`, the target being the tool, prompt or resource the request is
/// about (`tools/call import`), or the method alone.
pub(crate) fn span_name(
    method: &str,
    params: Option<&serde_json::Map<String, serde_json::Value>>,
) -> String {
    let target = match method {
        methods::TOOLS_CALL | methods::PROMPTS_GET => params.and_then(|p| p.get("name")),
        methods::RESOURCES_READ => params.and_then(|p| p.get("uri")),
        _ => None,
    };
    match target.and_then(serde_json::Value::as_str) {
        Some(target) => format!("{method} {target}"),
        None => method.to_owned(),
    }
}

/// `gen_ai.tool.name` of a `tools/call`.
pub(crate) fn tool_name<'a>(
    method: &str,
    params: Option<&'a serde_json::Map<String, serde_json::Value>>,
) -> Option<&'a str> {
    (method == methods::TOOLS_CALL)
        .then(|| params?.get("name")?.as_str())
        .flatten()
}

/// The `mcp_method_name` label: the method when this server knows it, `other` otherwise (a
/// client cannot make up label values).
pub(crate) fn method_label(method: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        methods::DISCOVER,
        methods::TOOLS_LIST,
        methods::TOOLS_CALL,
        methods::TASKS_GET,
        methods::TASKS_UPDATE,
        methods::TASKS_CANCEL,
        methods::SUBSCRIPTIONS_LISTEN,
        methods::PROMPTS_LIST,
        methods::PROMPTS_GET,
        methods::RESOURCES_LIST,
        methods::RESOURCES_TEMPLATES_LIST,
        methods::RESOURCES_READ,
        methods::COMPLETION_COMPLETE,
    ];
    KNOWN
        .iter()
        .find(|m| **m == method)
        .copied()
        .unwrap_or("other")
}

/// One request answered: `error_code` is the JSON-RPC code of a failed one.
pub(crate) fn operation(method: &'static str, error_code: Option<i64>, elapsed: Duration) {
    let seconds = elapsed.as_secs_f64();
    match error_code {
        None => histogram!(OPERATION_DURATION, "mcp_method_name" => method, "outcome" => "ok")
            .record(seconds),
        Some(code) => histogram!(
            OPERATION_DURATION,
            "mcp_method_name" => method,
            "outcome" => "error",
            "error_type" => error_type(code)
        )
        .record(seconds),
    }
}

/// The `error_type` label of a JSON-RPC error code: the code itself for the codes JSON-RPC,
/// MCP, its SDKs and this runtime define, `other` for any other (a code an upstream made up
/// must not add a series per value).
pub(crate) fn error_type(code: i64) -> &'static str {
    match code {
        -32700 => "-32700",
        -32603 => "-32603",
        -32602 => "-32602",
        -32601 => "-32601",
        -32600 => "-32600",
        -32042 => "-32042",
        -32022 => "-32022",
        -32021 => "-32021",
        -32020 => "-32020",
        -32010 => "-32010",
        -32002 => "-32002",
        -32001 => "-32001",
        -32000 => "-32000",
        _ => "other",
    }
}

/// An HTTP request refused with `status` (401, 403, 408 or 413) before any work.
#[cfg(feature = "http")]
pub(crate) fn refused(status: u16) {
    let reason = match status {
        401 => "401",
        403 => "403",
        408 => "408",
        413 => "413",
        _ => return,
    };
    counter!(REFUSALS, "reason" => reason).increment(1);
}

/// A credential refused on `surface` (`mcp`, `console`) with `outcome`.
#[cfg(feature = "http")]
pub(crate) fn auth_failure(surface: &'static str, outcome: &'static str) {
    counter!(AUTH_FAILURES, "surface" => surface, "outcome" => outcome).increment(1);
}

/// A request refused by quota `quota` (`-32010`, HTTP `429`).
pub(crate) fn refused_by_quota(quota: &'static str) {
    counter!(REFUSALS, "reason" => "429", "quota" => quota).increment(1);
}

/// A committed status change (or a creation) to `to`.
pub(crate) fn transition(to: TaskStatus) {
    counter!(TASK_TRANSITIONS, "to" => to.as_str()).increment(1);
}

/// The start-up rehydration finished.
/// A waiter joined (`+1`) or left (`-1`) the flow-control queue of `tool`.
pub(crate) fn queued(tool: &str, delta: f64) {
    gauge!(QUEUED_TASKS, "tool" => tool.to_owned()).increment(delta);
}

/// A flow-control slot of `tool` was taken (`+1`) or freed (`-1`).
pub(crate) fn running_limited(tool: &str, delta: f64) {
    gauge!(RUNNING_LIMITED_TASKS, "tool" => tool.to_owned()).increment(delta);
}

pub(crate) fn recovered(elapsed: Duration, tasks: usize) {
    gauge!(RECOVERY_DURATION).set(elapsed.as_secs_f64());
    gauge!(RECOVERED_TASKS).set(tasks as f64);
}

/// One live task parked while it lives parked; counts one passivation when made for an
/// actor that passivated.
pub(crate) struct ParkedGauge;

impl ParkedGauge {
    pub(crate) fn new(passivated: bool) -> Self {
        if passivated {
            counter!(PASSIVATIONS).increment(1);
        }
        gauge!(PARKED_TASKS).increment(1.0);
        ParkedGauge
    }
}

impl Drop for ParkedGauge {
    fn drop(&mut self) {
        gauge!(PARKED_TASKS).decrement(1.0);
    }
}

/// `count` committed snapshots of a followed task were never written to a listen: replaced by
/// a newer one before it was written, or committed while the follower looked elsewhere.
pub(crate) fn subscription_dropped(count: u64) {
    counter!(SUBSCRIPTION_DROPPED).increment(count);
}

/// Counts one task in `mcp_tasks_tasks` under its current status while it lives, also when
/// its actor fails (it is dropped with the actor's state). A passivated task's count moves to
/// its parked entry ([`TaskGauge::take`]).
pub(crate) struct TaskGauge(Option<TaskStatus>);

impl TaskGauge {
    /// Moves the count out, leaving this gauge counting nothing.
    pub(crate) fn take(&mut self) -> TaskGauge {
        TaskGauge(self.0.take())
    }

    /// Counts a task now running with `status`.
    pub(crate) fn new(status: TaskStatus) -> Self {
        let mut g = Self(None);
        g.set(status);
        g
    }

    /// Moves the task to `status` (a terminal status stops counting it).
    pub(crate) fn set(&mut self, status: TaskStatus) {
        if self.0 == Some(status) {
            return;
        }
        if let Some(old) = self.0.take() {
            gauge!(TASKS, "status" => old.as_str()).decrement(1.0);
        }
        if !status.is_terminal() {
            gauge!(TASKS, "status" => status.as_str()).increment(1.0);
            self.0 = Some(status);
        }
    }
}

impl Drop for TaskGauge {
    fn drop(&mut self) {
        if let Some(old) = self.0.take() {
            gauge!(TASKS, "status" => old.as_str()).decrement(1.0);
        }
    }
}

/// Counts one open listen in `mcp_tasks_subscriptions` while it lives.
pub(crate) struct SubscriptionGauge;

impl SubscriptionGauge {
    pub(crate) fn new() -> Self {
        gauge!(SUBSCRIPTIONS).increment(1.0);
        Self
    }
}

impl Drop for SubscriptionGauge {
    fn drop(&mut self) {
        gauge!(SUBSCRIPTIONS).decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::error_type;

    #[test]
    fn error_type_labels_are_a_closed_set() {
        assert_eq!(error_type(-32602), "-32602");
        assert_eq!(error_type(-32010), "-32010");
        assert_eq!(error_type(-32042), "-32042");
        let labels: std::collections::HashSet<&str> =
            (1_000_000..1_002_000).map(error_type).collect();
        assert_eq!(labels.len(), 1);
        assert_eq!(error_type(i64::MIN), "other");
        assert_eq!(error_type(-32099), "other");
    }
}
