//! OpenTelemetry export (feature `otel`): the runtime's request spans reach an exporter named
//! and attributed after the OpenTelemetry semantic conventions for MCP (its metrics:
//! `otel_metrics.rs`, in a process of its own for the process-wide recorder).

use std::sync::{Arc, Mutex};

use mcp_tasks::store::Store;
use mcp_tasks::tool::{CallToolResult, ToolDescriptor, tool_fn};
use mcp_tasks::{Owner, Runtime, otel};
use opentelemetry::Value as OtelValue;
use opentelemetry::trace::SpanKind;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt;

use crate::support;

use support::embedded::req;

/// Keeps every exported span.
#[derive(Debug, Clone, Default)]
struct Collect(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Collect {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a OtelValue> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

#[tokio::test]
async fn request_spans_follow_the_mcp_semantic_conventions() {
    let spans = Collect::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    // The current-thread test runtime runs the dispatcher on this thread.
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::registry().with(otel::layer(&provider)),
    );

    let rt = Runtime::builder_with_store(Store::memory())
        .tool(tool_fn(
            ToolDescriptor::new("ping", "Answers pong."),
            |_ctx, _| async { Ok(CallToolResult::text("pong")) },
        ))
        .start()
        .await
        .unwrap();
    let me = Owner::anonymous();
    let ok = req(
        7,
        "tools/call",
        json!({ "name": "ping", "arguments": {} }),
        false,
    );
    let reply = rt.handle_json(ok, &me).await.unwrap();
    assert_eq!(reply["result"]["content"][0]["text"], "pong");
    let unknown = req(
        8,
        "tasks/get",
        json!({ "taskId": "tsk_00000000000000000000000000000000" }),
        true,
    );
    let reply = rt.handle_json(unknown, &me).await.unwrap();
    assert_eq!(reply["error"]["code"], -32602);
    rt.shutdown().await;
    provider.force_flush().unwrap();

    let spans = spans.0.lock().unwrap();
    let call = spans
        .iter()
        .find(|s| s.name == "tools/call ping")
        .unwrap_or_else(|| panic!("no `tools/call ping` span in {:?}", names(&spans)));
    assert_eq!(call.span_kind, SpanKind::Server);
    assert_eq!(
        attribute(call, "mcp.method.name"),
        Some(&OtelValue::from("tools/call"))
    );
    assert_eq!(
        attribute(call, "gen_ai.tool.name"),
        Some(&OtelValue::from("ping"))
    );
    assert_eq!(
        attribute(call, "jsonrpc.request.id"),
        Some(&OtelValue::from("7"))
    );
    assert_eq!(attribute(call, "rpc.jsonrpc.error_code"), None);
    assert_eq!(call.instrumentation_scope.name(), "mcp-tasks");

    let get = spans
        .iter()
        .find(|s| s.name == "tasks/get")
        .unwrap_or_else(|| panic!("no `tasks/get` span in {:?}", names(&spans)));
    assert_eq!(
        attribute(get, "mcp.method.name"),
        Some(&OtelValue::from("tasks/get"))
    );
    assert_eq!(
        attribute(get, "rpc.jsonrpc.error_code"),
        Some(&OtelValue::from(-32602_i64))
    );
    assert_eq!(
        attribute(get, "error.type"),
        Some(&OtelValue::from("-32602"))
    );
}

fn names(spans: &[SpanData]) -> Vec<&str> {
    spans.iter().map(|s| s.name.as_ref()).collect()
}
