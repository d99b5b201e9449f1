//! OpenTelemetry export of the runtime's metrics (feature `otel`): `otel::recorder` as the
//! process's `metrics` recorder. The test runs in a process of its own
//! (`support::own_process`), because that recorder is process-wide and the counts are exact.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcp_tasks::store::Store;
use mcp_tasks::tool::{CallToolResult, TaskPolicy, ToolDescriptor, tool_fn};
use mcp_tasks::{Owner, Runtime, otel};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{SdkMeterProvider, Temporality};
use serde_json::json;

use crate::support;

use support::embedded::{req, wait_status};

/// One exported data point, reduced to what the test compares.
#[derive(Debug, Clone)]
struct Point {
    name: String,
    unit: String,
    attributes: Vec<(String, String)>,
    /// A sum's or gauge's value, a histogram's count.
    value: f64,
    bounds: Vec<f64>,
}

/// Keeps every exported data point (cumulative: the latest export holds the totals).
#[derive(Debug, Clone, Default)]
struct CollectMetrics(Arc<Mutex<Vec<Vec<Point>>>>);

impl PushMetricExporter for CollectMetrics {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        fn attrs<'a>(
            kvs: impl Iterator<Item = &'a opentelemetry::KeyValue>,
        ) -> Vec<(String, String)> {
            let mut v: Vec<_> = kvs
                .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                .collect();
            v.sort();
            v
        }
        let mut points = Vec::new();
        for scope in metrics.scope_metrics() {
            assert_eq!(scope.scope().name(), "mcp-tasks");
            for metric in scope.metrics() {
                let mut push = |attributes, value, bounds| {
                    points.push(Point {
                        name: metric.name().to_owned(),
                        unit: metric.unit().to_owned(),
                        attributes,
                        value,
                        bounds,
                    })
                };
                match metric.data() {
                    AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                        for p in h.data_points() {
                            push(
                                attrs(p.attributes()),
                                p.count() as f64,
                                p.bounds().collect(),
                            );
                        }
                    }
                    AggregatedMetrics::F64(MetricData::Gauge(g)) => {
                        for p in g.data_points() {
                            push(attrs(p.attributes()), p.value(), Vec::new());
                        }
                    }
                    AggregatedMetrics::U64(MetricData::Sum(s)) => {
                        for p in s.data_points() {
                            push(attrs(p.attributes()), p.value() as f64, Vec::new());
                        }
                    }
                    other => panic!(
                        "unexpected instrument data for {}: {other:?}",
                        metric.name()
                    ),
                }
            }
        }
        self.0.lock().unwrap().push(points);
        Ok(())
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
        Ok(())
    }

    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}

/// The runtime's metrics through `otel::recorder`: request durations as the conventions'
/// `mcp.server.operation.duration` (seconds, `mcp.method.name`, `error.type` on failure only,
/// the conventions' bucket boundaries), transitions and the live-task gauge as `mcp_tasks.*`.
/// In a process of its own: the `metrics` recorder is the process's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_the_mcp_semantic_conventions() {
    if !support::own_process("otel_metrics::metrics_follow_the_mcp_semantic_conventions").await {
        return;
    }
    let exported = CollectMetrics::default();
    let meters = SdkMeterProvider::builder()
        .with_periodic_exporter(exported.clone())
        .build();
    metrics::set_global_recorder(otel::recorder(&meters)).expect("the only recorder");

    let rt = Runtime::builder_with_store(Store::memory())
        .tool(tool_fn(
            ToolDescriptor::new("ping", "Answers pong."),
            |_ctx, _| async { Ok(CallToolResult::text("pong")) },
        ))
        .tool(tool_fn(
            ToolDescriptor::new("slow", "A task.").task_policy(TaskPolicy::Always),
            |_ctx, _| async { Ok(CallToolResult::text("done")) },
        ))
        .start()
        .await
        .unwrap();
    let me = Owner::anonymous();
    for id in 0..3 {
        let reply = rt
            .handle_json(
                req(
                    id,
                    "tools/call",
                    json!({ "name": "ping", "arguments": {} }),
                    false,
                ),
                &me,
            )
            .await
            .unwrap();
        assert_eq!(reply["result"]["content"][0]["text"], "pong");
    }
    let reply = rt
        .handle_json(
            req(
                10,
                "tools/call",
                json!({ "name": "slow", "arguments": {} }),
                true,
            ),
            &me,
        )
        .await
        .unwrap();
    let task = reply["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {reply}"))
        .to_owned();
    wait_status(&rt, &task, "completed").await;
    let unknown = req(
        12,
        "tasks/get",
        json!({ "taskId": "tsk_00000000000000000000000000000000" }),
        true,
    );
    let reply = rt.handle_json(unknown, &me).await.unwrap();
    assert_eq!(reply["error"]["code"], -32602);
    rt.shutdown().await;
    meters.force_flush().unwrap();

    let exports = exported.0.lock().unwrap();
    let points = exports.last().expect("an export");
    let find = |name: &str, attributes: &[(&str, &str)]| -> &Point {
        let want: Vec<(String, String)> = {
            let mut v: Vec<_> = attributes
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            v.sort();
            v
        };
        points
            .iter()
            .find(|p| p.name == name && p.attributes == want)
            .unwrap_or_else(|| panic!("no {name} {attributes:?} in {points:#?}"))
    };
    let calls = find(
        "mcp.server.operation.duration",
        &[("mcp.method.name", "tools/call")],
    );
    assert_eq!(calls.unit, "s");
    assert_eq!(calls.value, 4.0, "three synchronous calls and one creation");
    assert_eq!(
        calls.bounds,
        [
            0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0
        ]
    );
    let failed = find(
        "mcp.server.operation.duration",
        &[("mcp.method.name", "tasks/get"), ("error.type", "-32602")],
    );
    assert_eq!(failed.value, 1.0);
    assert!(
        find(
            "mcp.server.operation.duration",
            &[("mcp.method.name", "tasks/get")]
        )
        .value
            >= 1.0
    );
    assert_eq!(
        find("mcp_tasks.task.transitions", &[("to", "completed")]).value,
        1.0
    );
    // The task's actor ended: no task runs.
    assert_eq!(find("mcp_tasks.tasks", &[("status", "working")]).value, 0.0);
    assert!(
        points
            .iter()
            .all(|p| !p.attributes.iter().any(|(k, _)| k == "outcome")),
        "no Prometheus-only labels"
    );
}
