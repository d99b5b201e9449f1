//! A host application that embeds mcp-tasks: it registers its own durable tool and drives it
//! with the in-process client (`mcp_tasks::client`), exactly as an MCP client would over a
//! transport.
//!
//! The tool `import_invoices {source}` is typed: its arguments, the question it asks and its
//! structured result are Rust types whose JSON Schemas are derived (and the `tools/list` entry
//! is checked against the golden `crates/mcp-tasks/examples/host.tools.json`). It fetches a batch (journaled
//! step), asks the user which currency to book the batch in (a durable, typed elicitation),
//! then books it (journaled step).
//!
//! Run: `cargo run --example host` from the workspace root, or `cargo run -p mcp-tasks --features client --example host`

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use mcp_tasks::client::{CallOutcome, Client, input_handler};
use mcp_tasks::tool::{
    CallToolResult, Elicited, TaskPolicy, Tool, ToolDescriptor, ToolError, typed_tool,
};
use mcp_tasks::{Owner, Runtime};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Counts how often the expensive fetch really ran (a committed step is replayed, not run again).
static FETCHES: AtomicUsize = AtomicUsize::new(0);

// The arguments of `import_invoices`; its `inputSchema` is derived from this type (doc
// comments on the type would become the schema's `description`).
#[derive(Deserialize, JsonSchema)]
struct ImportInvoices {
    /// Where the batch comes from.
    #[schemars(length(min = 1))]
    source: String,
}

// The question asked of the user; the elicitation's `requestedSchema` is derived from it.
#[derive(Deserialize, JsonSchema)]
struct BookingCurrency {
    /// The currency to book the batch in.
    currency: Currency,
}

#[derive(Deserialize, Serialize, JsonSchema)]
enum Currency {
    #[serde(rename = "EUR")]
    Eur,
    #[serde(rename = "USD")]
    Usd,
}

// The structured result; the tool's `outputSchema` is derived from it.
#[derive(Serialize, JsonSchema)]
struct Booked {
    count: usize,
    total: u32,
    currency: Currency,
}

fn import_invoices() -> Arc<dyn Tool> {
    let descriptor = ToolDescriptor::new(
        "import_invoices",
        "Imports a batch of invoices from a source and books them in a currency the user picks.",
    )
    .output_schema_for::<Booked>()
    .task_policy(TaskPolicy::Always)
    .initial_status_message("Fetching invoices.");
    typed_tool(descriptor, |ctx, ImportInvoices { source }| async move {
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
        let Elicited::Accepted(BookingCurrency { currency }) = ctx
            .elicit("currency", "Which currency should the batch be booked in?")
            .await?
        else {
            return Err(ToolError::Cancelled);
        };
        let total: u32 = ctx
            .step("book", || async { Ok(invoices.iter().sum::<u32>()) })
            .await?;
        CallToolResult::structured(&Booked {
            count: invoices.len(),
            total,
            currency,
        })
    })
}

/// The `tools/list` entry a client sees, kept as a golden file: the schemas derived from the
/// types above. `MCP_TASKS_BLESS=1` rewrites it.
const TOOLS_GOLDEN: &str = "examples/host.tools.json";

fn check_tools_golden(tools: &Value) -> Result<(), Box<dyn std::error::Error>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(TOOLS_GOLDEN);
    let text = serde_json::to_string_pretty(tools)? + "\n";
    if std::env::var_os("MCP_TASKS_BLESS").is_some() {
        std::fs::write(&path, &text)?;
    }
    let golden = std::fs::read_to_string(&path)?;
    if golden != text {
        return Err(format!("`tools/list` differs from {TOOLS_GOLDEN}:\n{text}").into());
    }
    Ok(())
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
    let tools: Vec<Value> = client
        .list_tools()
        .await?
        .into_iter()
        .map(|t| t.raw)
        .collect();
    check_tools_golden(&Value::Array(tools))?;
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
    println!("result: {}", result["structuredContent"]);
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
