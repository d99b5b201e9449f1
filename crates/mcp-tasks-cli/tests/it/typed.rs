//! Typed tools and typed elicitation: the schemas a client sees are derived from the Rust
//! types, arguments are still validated against them (`-32602` naming the member) before the
//! tool gets the typed value, and a typed elicitation returns the answer as its type, or the
//! user's decline or cancel.

use std::sync::Arc;

use mcp_tasks::client::{CallOutcome, Client, ClientError, input_handler};
use mcp_tasks::tool::{
    CallToolResult, Elicited, TaskPolicy, Tool, ToolDescriptor, elicitation_schema_for, typed_tool,
};
use mcp_tasks::{Owner, Runtime, code};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Deserialize, JsonSchema)]
struct Resize {
    /// Width in pixels.
    #[schemars(range(min = 1, max = 4096))]
    width: u32,
    height: Option<u32>,
    mode: Mode,
}

#[derive(Deserialize, Serialize, JsonSchema, Debug, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Fit,
    Fill,
}

#[derive(Serialize, JsonSchema)]
struct Resized {
    width: u32,
    height: u32,
}

fn resize() -> Arc<dyn Tool> {
    typed_tool(
        ToolDescriptor::new("resize", "Resizes")
            .task_policy(TaskPolicy::Never)
            .output_schema_for::<Resized>(),
        |_ctx, args: Resize| async move {
            let height = args.height.unwrap_or(args.width);
            let height = if args.mode == Mode::Fill {
                height * 2
            } else {
                height
            };
            CallToolResult::structured(&Resized {
                width: args.width,
                height,
            })
        },
    )
}

#[derive(Deserialize, JsonSchema, Debug, PartialEq)]
struct Approval {
    approve: bool,
    /// Why.
    reason: Option<String>,
    retries: Option<u8>,
}

fn approve() -> Arc<dyn Tool> {
    typed_tool(
        ToolDescriptor::new("approve", "Asks for approval").task_policy(TaskPolicy::Always),
        |ctx, _: Empty| async move {
            Ok(
                match ctx.elicit::<Approval>("ok", "Approve the change?").await? {
                    Elicited::Accepted(a) => CallToolResult::text(format!(
                        "approve={} reason={:?} retries={:?}",
                        a.approve, a.reason, a.retries
                    )),
                    Elicited::Declined => CallToolResult::text("declined"),
                    Elicited::Cancelled => CallToolResult::text("cancelled"),
                },
            )
        },
    )
}

#[derive(Deserialize, JsonSchema)]
struct Empty {}

async fn runtime(dir: &tempfile::TempDir) -> Runtime {
    Runtime::builder(dir.path().join("typed.redb"))
        .tool(resize())
        .tool(approve())
        .start()
        .await
        .unwrap()
}

#[tokio::test]
async fn tools_list_shows_the_derived_schemas() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&dir).await;
    let client = Client::in_process(rt.handle(), Owner::new("t", "p"))
        .build()
        .await
        .unwrap();
    let tools = client.list_tools().await.unwrap();
    let resize = &tools[0].raw;
    assert_eq!(
        resize["inputSchema"],
        json!({
            "type": "object",
            "properties": {
                "width": {
                    "type": "integer", "format": "uint32",
                    "minimum": 1, "maximum": 4096, "description": "Width in pixels."
                },
                "height": { "type": ["integer", "null"], "format": "uint32", "minimum": 0 },
                "mode": { "type": "string", "enum": ["fit", "fill"] }
            },
            "required": ["width", "mode"]
        })
    );
    assert_eq!(
        resize["outputSchema"]["required"],
        json!(["width", "height"])
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn arguments_are_validated_then_typed() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&dir).await;
    let client = Client::in_process(rt.handle(), Owner::new("t", "p"))
        .build()
        .await
        .unwrap();
    let CallOutcome::Complete(result) = client
        .call_tool("resize", json!({ "width": 10, "mode": "fill" }))
        .await
        .unwrap()
    else {
        panic!("resize is synchronous");
    };
    assert_eq!(
        result["structuredContent"],
        json!({ "width": 10, "height": 20 })
    );
    assert_eq!(
        serde_json::from_str::<Value>(result["content"][0]["text"].as_str().unwrap()).unwrap(),
        json!({ "width": 10, "height": 20 })
    );

    for (args, member) in [
        (json!({ "width": 0, "mode": "fit" }), "width"),
        (json!({ "width": 10, "mode": "stretch" }), "mode"),
        (json!({ "mode": "fit" }), "width"),
    ] {
        let err = client.call_tool("resize", args.clone()).await.unwrap_err();
        let ClientError::InvalidParams(err) = err else {
            panic!("{args}: {err:?}");
        };
        assert_eq!(err.code, code::INVALID_PARAMS, "{args}");
        assert!(err.message.contains(member), "{args}: {}", err.message);
    }
    rt.shutdown().await;
}

#[test]
fn elicitation_schema_is_flat_and_primitive() {
    assert_eq!(
        elicitation_schema_for::<Approval>(),
        json!({
            "type": "object",
            "properties": {
                "approve": { "type": "boolean" },
                "reason": { "type": "string", "description": "Why." },
                "retries": { "type": "integer", "minimum": 0, "maximum": 255 }
            },
            "required": ["approve"]
        })
    );
}

#[tokio::test]
async fn elicit_returns_the_typed_answer_or_the_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&dir).await;
    for (answer, expected) in [
        (
            json!({ "action": "accept", "content": { "approve": true, "retries": 2 } }),
            "approve=true reason=None retries=Some(2)",
        ),
        (json!({ "action": "decline" }), "declined"),
        (json!({ "action": "cancel" }), "cancelled"),
    ] {
        let client = Client::in_process(rt.handle(), Owner::new("t", "p"))
            .input_handler(input_handler(move |key, request: Value| {
                let answer = answer.clone();
                async move {
                    assert_eq!(key, "ok");
                    assert_eq!(
                        request["params"]["requestedSchema"],
                        elicitation_schema_for::<Approval>()
                    );
                    Some(answer)
                }
            }))
            .build()
            .await
            .unwrap();
        let CallOutcome::Task(task) = client.call_tool("approve", json!({})).await.unwrap() else {
            panic!("approve is a task");
        };
        let done = task.wait().await.unwrap();
        let result = done.result.expect("completed");
        assert_eq!(result["content"][0]["text"], expected);
    }
    rt.shutdown().await;
}
