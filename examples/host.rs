//! A host application that embeds mcp-tasks: it registers its own durable tool and drives it
//! with the in-process client (`mcp_tasks::client`), exactly as an MCP client would over a
//! transport.
//!
//! The tool `import_invoices {source}` fetches a batch (journaled step), asks the user which
//! currency to book the batch in (a durable input request), then books it (journaled step).
//!
//! Run: `cargo run --example host`

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use mcp_tasks::client::{CallOutcome, Client, input_handler};
use mcp_tasks::tool::{
    CallToolResult, ElicitAction, ElicitResponse, InputRequest, TaskPolicy, Tool, ToolDescriptor,
    ToolError, tool_fn,
};
use mcp_tasks::{Owner, Runtime};
use serde_json::{Value, json};

/// Counts how often the expensive fetch really ran (a committed step is replayed, not run again).
static FETCHES: AtomicUsize = AtomicUsize::new(0);

fn import_invoices() -> Arc<dyn Tool> {
    let descriptor = ToolDescriptor::new(
        "import_invoices",
        "Imports a batch of invoices from a source and books them in a currency the user picks.",
    )
    .input_schema(json!({
        "type": "object",
        "properties": { "source": { "type": "string", "minLength": 1 } },
        "required": ["source"]
    }))
    .task_policy(TaskPolicy::Always)
    .initial_status_message("Fetching invoices.");
    tool_fn(descriptor, |ctx, args| async move {
        let source = args
            .get("source")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let invoices: Vec<u32> = ctx
            .step("fetch", || async {
                FETCHES.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok(vec![120, 80, 455])
            })
            .await?;
        ctx.set_status(format!(
            "Fetched {} invoices from {source}.",
            invoices.len()
        ))
        .await?;
        let answer = ctx
            .input(
                "currency",
                InputRequest::elicit_form(
                    "Which currency should the batch be booked in?",
                    json!({
                        "type": "object",
                        "properties": { "currency": { "type": "string", "enum": ["EUR", "USD"] } },
                        "required": ["currency"]
                    }),
                ),
            )
            .await?;
        let answer = ElicitResponse::from_json(&answer);
        if answer.action != ElicitAction::Accept {
            return Err(ToolError::Cancelled);
        }
        let currency = answer
            .content
            .get("currency")
            .and_then(Value::as_str)
            .unwrap_or("EUR")
            .to_owned();
        let total: u32 = ctx
            .step("book", || async { Ok(invoices.iter().sum::<u32>()) })
            .await?;
        Ok(CallToolResult::text(format!(
            "Booked {} invoices: {total} {currency}.",
            invoices.len()
        ))
        .with_structured(json!({ "count": invoices.len(), "total": total, "currency": currency })))
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("host.redb");
    let owner = Owner::new("acme", "alice");
    let start = || {
        Runtime::builder(&path)
            .server_info("invoice-host", "0.1.0")
            .tool(import_invoices())
            .start()
    };

    let runtime = start().await?;
    let client = Client::in_process(runtime.handle(), owner.clone())
        .build()
        .await?;
    let CallOutcome::Task(task) = client
        .call_tool("import_invoices", json!({ "source": "s3://batch-7" }))
        .await?
    else {
        return Err("import_invoices did not become a task".into());
    };
    println!("created {}", task.id());
    // Without an input handler, `wait` returns as soon as the task needs input.
    let waiting = task.wait().await?;
    println!(
        "asks for: {}",
        waiting.input_requests["currency"]["params"]["message"]
    );

    // The host restarts (a deploy, a crash): the task and its journal survive.
    runtime.shutdown().await;
    let runtime = start().await?;
    let client = Client::in_process(runtime.handle(), owner)
        .input_handler(input_handler(|_key, _request| async {
            Some(json!({ "action": "accept", "content": { "currency": "EUR" } }))
        }))
        .build()
        .await?;
    let task = client.resume(task.id()).await?;
    println!("restarted; task is {}", task.get().await?.status.as_str());

    // This time `wait` answers the request through the input handler and polls to the end.
    let done = task.wait().await?;
    let result = done.result.ok_or("the task completed without a result")?;
    println!("result: {}", result["content"][0]["text"]);
    println!(
        "the fetch step ran {} time(s)",
        FETCHES.load(Ordering::SeqCst)
    );
    runtime.shutdown().await;
    if FETCHES.load(Ordering::SeqCst) != 1 {
        return Err("the journaled fetch step ran more than once".into());
    }
    Ok(())
}
