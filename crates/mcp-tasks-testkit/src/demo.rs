//! The demo: the `generate_report` tool and the scripted client sequence that
//! `mcp-tasks demo` plays, with a restart of the runtime in the middle.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use mcp_tasks::Owner;
use mcp_tasks::internals::wire::keys;
use mcp_tasks::tool::{
    CallToolResult, Elicited, TaskPolicy, Tool, ToolDescriptor, ToolError, typed_tool,
};
use mcp_tasks::{PROTOCOL_VERSION, TASKS_EXTENSION};
use mcp_tasks::{Runtime, StartError};

/// The input key under which `generate_report` asks for approval of its outline.
pub const APPROVE_OUTLINE: &str = "approve_outline";

/// `generate_report {size}`: drafts an outline (a journaled step taking `outline_time`),
/// asks the client to approve it (`input_required`, key `approve_outline`, a form with a
/// required boolean `approved`), then renders the report (a second journaled step).
///
/// Outcomes: approved ⇒ `completed` with the report; `approved: false` or a declined
/// elicitation ⇒ `completed` with `isError: false`, no report and `structuredContent.approved:
/// false` (the safe outcome: nothing is generated without approval); a cancelled
/// elicitation or `tasks/cancel` ⇒ `cancelled`.
pub fn generate_report(outline_time: Duration) -> Arc<dyn Tool> {
    let descriptor = ToolDescriptor::new(
        "generate_report",
        "Generates a report of the given size after the client approves its outline. Runs as a durable task.",
    )
    .title("Generate report")
    .task_policy(TaskPolicy::Always)
    .initial_status_message("Preparing report outline.");
    typed_tool(descriptor, move |ctx, GenerateReport { size }| async move {
        let size = size.as_str();
        let outline = ctx
            .step("outline", || async {
                tokio::time::sleep(outline_time).await;
                Ok(format!(
                    "Outline of a {size} report: summary, findings, next steps."
                ))
            })
            .await?;
        ctx.set_status("Waiting for the client to approve the outline.")
            .await?;
        let approved = match ctx
            .elicit::<OutlineApproval>(APPROVE_OUTLINE, "Approve the generated report outline?")
            .await?
        {
            Elicited::Accepted(OutlineApproval { approved }) => approved,
            Elicited::Declined => false,
            Elicited::Cancelled => return Err(ToolError::Cancelled),
        };
        if !approved {
            return Ok(
                CallToolResult::text("Report not generated: the outline was not approved.")
                    .with_structured(json!({ "size": size, "approved": false })),
            );
        }
        ctx.set_status("Rendering the report.").await?;
        let report = ctx
            .step("render", || async {
                Ok(format!(
                    "Generated {size} report with approved outline. ({outline})"
                ))
            })
            .await?;
        Ok(CallToolResult::text(report).with_structured(json!({ "size": size, "approved": true })))
    })
}

// The arguments of `generate_report`; its `inputSchema` is derived from them (a doc comment
// here would become the schema's `description`).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct GenerateReport {
    /// How long the report should be.
    size: ReportSize,
}

#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum ReportSize {
    Small,
    Medium,
    Large,
}

impl ReportSize {
    fn as_str(self) -> &'static str {
        match self {
            Self::Small => "small",
            Self::Medium => "medium",
            Self::Large => "large",
        }
    }
}

// The answer to the outline question; the elicitation's `requestedSchema` is derived from it.
#[derive(Deserialize, JsonSchema)]
struct OutlineApproval {
    #[schemars(title = "Approve outline")]
    approved: bool,
}

/// The `_meta` the demo client sends on every request.
pub fn client_meta() -> Value {
    json!({
        keys::PROTOCOL_VERSION: PROTOCOL_VERSION,
        keys::CLIENT_CAPABILITIES: { "extensions": { TASKS_EXTENSION: {} } },
        keys::CLIENT_INFO: { "name": "mcp-tasks-demo-client", "version": env!("CARGO_PKG_VERSION") }
    })
}

/// Errors of the demo run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// The demo's runtime did not start (its scratch store could not be opened, ...).
    #[error(transparent)]
    Start(#[from] StartError),
    /// Writing the transcript failed (a closed stdout, a full disk).
    #[error("could not write the demo output: {0}")]
    Output(#[from] std::io::Error),
    /// The runtime answered a demo request differently from the script: a regression.
    #[error("unexpected answer to request {id}: {detail}")]
    Unexpected {
        /// The JSON-RPC id of the request.
        id: u64,
        /// What was expected and what came.
        detail: String,
    },
}

struct Client<'a, W: Write> {
    owner: Owner,
    out: &'a mut W,
    verbose: bool,
}

impl<W: Write> Client<'_, W> {
    /// One request and its response, without printing.
    async fn exchange(
        &self,
        runtime: &Runtime,
        id: u64,
        method: &str,
        mut params: Value,
    ) -> Result<(Value, Value), DemoError> {
        params["_meta"] = client_meta();
        let request = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let response = runtime
            .handle_json(request.clone(), &self.owner)
            .await
            .ok_or_else(|| DemoError::Unexpected {
                id,
                detail: "no response".into(),
            })?;
        Ok((request, response))
    }

    fn show(&mut self, request: &Value, response: &Value) -> Result<(), DemoError> {
        if self.verbose {
            writeln!(self.out, "--> {request}")?;
            writeln!(self.out, "<-- {response}")?;
        }
        Ok(())
    }

    async fn send(
        &mut self,
        runtime: &Runtime,
        id: u64,
        method: &str,
        params: Value,
    ) -> Result<Value, DemoError> {
        let (request, response) = self.exchange(runtime, id, method, params).await?;
        self.show(&request, &response)?;
        Ok(response)
    }

    /// The answer's id, `resultType` and status on one line, then what the step shows on a
    /// line of its own (so that the `id=` lines compare as they are).
    fn print(&mut self, id: u64, response: &Value, note: &str) -> Result<(), DemoError> {
        let result = response
            .get("result")
            .ok_or_else(|| DemoError::Unexpected {
                id,
                detail: format!("an error: {}", response["error"]),
            })?;
        let result_type = result["resultType"].as_str().unwrap_or("?");
        let status = result
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("ack");
        writeln!(self.out, "id={id} resultType={result_type} status={status}")?;
        writeln!(self.out, "     # {note}")?;
        Ok(())
    }

    /// Polls `tasks/get` (same request id each time) until the task is `want`; shows only the
    /// last exchange.
    async fn poll_until(
        &mut self,
        runtime: &Runtime,
        id: u64,
        task: &str,
        want: &str,
    ) -> Result<Value, DemoError> {
        for _ in 0..600 {
            let (request, r) = self
                .exchange(runtime, id, "tasks/get", json!({ "taskId": task }))
                .await?;
            let status = r["result"]["status"].as_str().unwrap_or_default();
            if status == want
                || r.get("error").is_some()
                || r["result"]["status"]
                    .as_str()
                    .is_some_and(|s| ["completed", "failed", "cancelled"].contains(&s))
            {
                self.show(&request, &r)?;
                return Ok(r);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(DemoError::Unexpected {
            id,
            detail: format!("task did not become {want} within 30 s"),
        })
    }
}

/// Plays the demo sequence against a fresh store at `store`, restarting the runtime
/// right after the task is created, and writes one line per exchange to `out`.
pub async fn run(store: &Path, verbose: bool, out: &mut impl Write) -> Result<(), DemoError> {
    let start = || {
        Runtime::builder(store)
            .server_info("tasks-demo", "1.0.0")
            .tool(generate_report(Duration::from_millis(1500)))
            .start()
    };
    let mut client = Client {
        owner: Owner::anonymous(),
        out,
        verbose,
    };

    let runtime = start().await?;
    let r = client
        .send(&runtime, 0, "server/discover", json!({}))
        .await?;
    client.print(0, &r, "server/discover: versions and capabilities")?;
    let r = client
        .send(
            &runtime,
            1,
            "tools/call",
            json!({ "name": "generate_report", "arguments": { "size": "large" } }),
        )
        .await?;
    client.print(
        1,
        &r,
        "tools/call generate_report: a task, stored before this answer",
    )?;
    let task = r["result"]["taskId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();

    // The server goes away right after the task was created, and a new one takes over.
    runtime.shutdown().await;
    writeln!(
        client.out,
        "     -- the runtime stops and a new one starts on the same store --"
    )?;
    let runtime = start().await?;

    let r = client
        .send(&runtime, 2, "tasks/get", json!({ "taskId": task }))
        .await?;
    client.print(2, &r, "tasks/get: the task survived the restart")?;
    let r = client
        .poll_until(&runtime, 3, &task, "input_required")
        .await?;
    client.print(3, &r, "tasks/get: it asks to approve its outline")?;
    let update = json!({
        "taskId": task,
        "inputResponses": { APPROVE_OUTLINE: { "action": "accept", "content": { "approved": true } } }
    });
    let r = client.send(&runtime, 4, "tasks/update", update).await?;
    client.print(4, &r, "tasks/update: the outline approved")?;
    let r = client.poll_until(&runtime, 5, &task, "completed").await?;
    client.print(5, &r, "tasks/get: the result is in the task")?;
    if let Some(text) = r["result"]["result"]["content"][0]["text"].as_str() {
        writeln!(client.out, "     {text}")?;
    }

    for (id, method) in [(6, "tasks/result"), (7, "tasks/list")] {
        let r = client
            .send(&runtime, id, method, json!({ "taskId": task }))
            .await?;
        let code = r["error"]["code"].as_i64().unwrap_or_default();
        writeln!(
            client.out,
            "     # expected: request {id}, {method}, answers {code} ({}): a method removed in {PROTOCOL_VERSION}",
            r["error"]["message"].as_str().unwrap_or("")
        )?;
    }
    runtime.shutdown().await;
    Ok(())
}
