//! OpenTelemetry export of the runtime's spans (feature `otel`).
//!
//! The runtime instruments itself with [`tracing`] spans (see the `telemetry` module); this
//! module turns them into OpenTelemetry spans through [`tracing_opentelemetry`]. The host keeps
//! control of the pipeline: it builds the [`SdkTracerProvider`] with the exporter it wants
//! (OTLP from the `opentelemetry-otlp` crate, stdout, an in-memory exporter in tests), adds
//! [`layer`] to its `tracing` subscriber, and shuts the provider down on exit to flush it.
//!
//! Each JSON-RPC request is one span of kind `SERVER`, named and attributed after the
//! OpenTelemetry semantic conventions for MCP: the name is `{mcp.method.name} {target}`
//! (`tools/call import`, `tasks/get`), with the attributes `mcp.method.name`,
//! `jsonrpc.request.id`, `gen_ai.tool.name` (for `tools/call`), `mcp.task.id` (when the request
//! names a task) and, when the request fails, `rpc.jsonrpc.error_code` and `error.type` (the
//! JSON-RPC error code). A task's run (`mcp.task`), its transitions and the store's group
//! commits are spans too, children of the request that caused them where there is one.
//!
//! ```
//! use mcp_tasks::otel;
//! use opentelemetry_sdk::trace::SdkTracerProvider;
//! use tracing_subscriber::layer::SubscriberExt;
//!
//! // A real host adds an exporter: `.with_batch_exporter(otlp_exporter)`.
//! let provider = SdkTracerProvider::builder().build();
//! let subscriber = tracing_subscriber::registry().with(otel::layer(&provider));
//! tracing::subscriber::with_default(subscriber, || {
//!     // ... serve ...
//! });
//! provider.shutdown().ok();
//! ```

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetryLayer;
use tracing_subscriber::registry::LookupSpan;

/// A `tracing` layer that exports spans through `provider`, with this crate's name and version
/// as the instrumentation scope.
pub fn layer<S>(provider: &SdkTracerProvider) -> OpenTelemetryLayer<S, SdkTracer>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    let tracer = provider.tracer_with_scope(
        opentelemetry::InstrumentationScope::builder(env!("CARGO_PKG_NAME"))
            .with_version(env!("CARGO_PKG_VERSION"))
            .build(),
    );
    tracing_opentelemetry::layer().with_tracer(tracer)
}
