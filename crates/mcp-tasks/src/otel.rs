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
//! The runtime's metrics (recorded through the [`metrics`] facade; [`crate::telemetry`] lists
//! them) reach OpenTelemetry through [`recorder`]: install it as the process's
//! `metrics` recorder and the request durations arrive as the conventions'
//! `mcp.server.operation.duration` histogram (seconds, with `mcp.method.name` and, on failure,
//! `error.type`), the rest as `mcp_tasks.*` instruments (`mcp_tasks.tasks` by `status`,
//! `mcp_tasks.store.commit.duration`, ...).
//!
//! ```
//! use mcp_tasks::otel;
//! use opentelemetry_sdk::metrics::SdkMeterProvider;
//!
//! // A real host adds an exporter: `.with_periodic_exporter(otlp_metric_exporter)`.
//! let meters = SdkMeterProvider::builder().build();
//! metrics::set_global_recorder(otel::recorder(&meters)).expect("the first recorder");
//! // ... serve; then flush on exit:
//! meters.shutdown().ok();
//! ```
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

pub use metrics_bridge::{MetricsRecorder, recorder};

/// The runtime's metrics (see the `telemetry` module's table) as OpenTelemetry instruments.
mod metrics_bridge {
    use std::borrow::Cow;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use metrics::{
        Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata,
        Recorder, SharedString, Unit,
    };
    use opentelemetry::KeyValue;
    use opentelemetry::metrics::{Meter, MeterProvider};

    use crate::telemetry;

    /// Bucket boundaries (seconds) the OpenTelemetry semantic conventions for MCP recommend
    /// for `mcp.server.operation.duration`; also used for the other durations.
    const DURATION_BOUNDARIES: [f64; 14] = [
        0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    ];

    /// How one series of the `metrics` facade appears in OpenTelemetry.
    struct Mapping {
        name: &'static str,
        unit: Option<&'static str>,
        description: &'static str,
    }

    /// The OpenTelemetry name, unit and description of a series the runtime records; `None`
    /// for a series of somebody else's (it keeps its name).
    fn mapping(name: &str) -> Option<Mapping> {
        let (name, unit, description) = match name {
            telemetry::OPERATION_DURATION => (
                "mcp.server.operation.duration",
                Some("s"),
                "MCP request duration as observed on the server, from receipt until the result is sent.",
            ),
            telemetry::TASKS => (
                "mcp_tasks.tasks",
                Some("{task}"),
                "Tasks this node runs, by status.",
            ),
            telemetry::TASK_TRANSITIONS => (
                "mcp_tasks.task.transitions",
                Some("{transition}"),
                "Committed task status changes, by new status.",
            ),
            telemetry::STORE_COMMIT_DURATION => (
                "mcp_tasks.store.commit.duration",
                Some("s"),
                "Duration of one store group commit.",
            ),
            telemetry::STORE_COMMIT_BATCH_OPS => (
                "mcp_tasks.store.commit.batch_ops",
                Some("{operation}"),
                "Write operations carried by one store group commit.",
            ),
            telemetry::RECOVERY_DURATION => (
                "mcp_tasks.recovery.duration",
                Some("s"),
                "Time taken to rehydrate live tasks at the last start.",
            ),
            telemetry::RECOVERED_TASKS => (
                "mcp_tasks.recovered_tasks",
                Some("{task}"),
                "Live tasks rehydrated at the last start.",
            ),
            telemetry::SUBSCRIPTIONS => (
                "mcp_tasks.subscriptions",
                Some("{subscription}"),
                "Open subscriptions/listen streams.",
            ),
            telemetry::SUBSCRIPTION_DROPPED => (
                "mcp_tasks.subscription.dropped",
                Some("{snapshot}"),
                "Snapshots replaced by a newer one before a slow listener read them.",
            ),
            _ => return None,
        };
        Some(Mapping {
            name,
            unit,
            description,
        })
    }

    /// The OpenTelemetry attributes of a facade key's labels: `mcp_method_name` becomes
    /// `mcp.method.name` and `error_type` (the JSON-RPC error code of a failed request)
    /// `error.type`; `outcome` is left out (the conventions mark a failure by `error.type`
    /// alone). Other labels keep their names.
    fn attributes(key: &Key) -> Vec<KeyValue> {
        key.labels()
            .filter_map(|label| match label.key() {
                "mcp_method_name" => {
                    Some(KeyValue::new("mcp.method.name", label.value().to_owned()))
                }
                "error_type" => Some(KeyValue::new("error.type", label.value().to_owned())),
                "outcome" => None,
                k => Some(KeyValue::new(k.to_owned(), label.value().to_owned())),
            })
            .collect()
    }

    fn otel_name(name: &str) -> Cow<'static, str> {
        match mapping(name) {
            Some(m) => Cow::Borrowed(m.name),
            None => Cow::Owned(name.to_owned()),
        }
    }

    /// A [`metrics::Recorder`] that records the runtime's series into OpenTelemetry
    /// instruments of one [`Meter`]: `mcp.server.operation.duration` (histogram, seconds, with
    /// `mcp.method.name` and, on failure, `error.type`) after the semantic conventions for
    /// MCP, and the `mcp_tasks.*` instruments for the rest. Install it as the process's
    /// recorder (`metrics::set_global_recorder`) instead of a Prometheus exporter.
    ///
    /// Counters become `u64` counters, histograms `f64` histograms (durations with the
    /// conventions' bucket boundaries), and gauges `f64` gauges that report the current
    /// value of each label set (the facade's increments and decrements are summed here).
    pub struct MetricsRecorder {
        meter: Meter,
        counters: Mutex<HashMap<Cow<'static, str>, opentelemetry::metrics::Counter<u64>>>,
        histograms: Mutex<HashMap<Cow<'static, str>, opentelemetry::metrics::Histogram<f64>>>,
        gauges: Mutex<HashMap<Key, Arc<GaugeState>>>,
    }

    impl std::fmt::Debug for MetricsRecorder {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("MetricsRecorder").finish_non_exhaustive()
        }
    }

    /// A [`MetricsRecorder`] over a meter of `provider` scoped to this crate (its name and
    /// version).
    pub fn recorder(provider: &impl MeterProvider) -> MetricsRecorder {
        let meter = provider.meter_with_scope(
            opentelemetry::InstrumentationScope::builder(env!("CARGO_PKG_NAME"))
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        );
        MetricsRecorder {
            meter,
            counters: Mutex::default(),
            histograms: Mutex::default(),
            gauges: Mutex::default(),
        }
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        // A panic while holding one of these maps leaves it consistent (inserts only).
        m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    impl MetricsRecorder {
        fn counter(&self, name: &str) -> opentelemetry::metrics::Counter<u64> {
            let otel = otel_name(name);
            let mut counters = lock(&self.counters);
            if let Some(c) = counters.get(&otel) {
                return c.clone();
            }
            let mut builder = self.meter.u64_counter(otel.clone());
            if let Some(m) = mapping(name) {
                builder = builder.with_description(m.description);
                if let Some(unit) = m.unit {
                    builder = builder.with_unit(unit);
                }
            }
            let counter = builder.build();
            counters.insert(otel, counter.clone());
            counter
        }

        fn histogram(&self, name: &str) -> opentelemetry::metrics::Histogram<f64> {
            let otel = otel_name(name);
            let mut histograms = lock(&self.histograms);
            if let Some(h) = histograms.get(&otel) {
                return h.clone();
            }
            let mut builder = self.meter.f64_histogram(otel.clone());
            if let Some(m) = mapping(name) {
                builder = builder.with_description(m.description);
                if let Some(unit) = m.unit {
                    builder = builder.with_unit(unit);
                    if unit == "s" {
                        builder = builder.with_boundaries(DURATION_BOUNDARIES.to_vec());
                    }
                }
            }
            let histogram = builder.build();
            histograms.insert(otel, histogram.clone());
            histogram
        }
    }

    impl Recorder for MetricsRecorder {
        // Descriptions and units come from the mapping above (the facade's are for Prometheus).
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(Arc::new(CounterHandle {
                counter: self.counter(key.name()),
                attributes: attributes(key),
                last: AtomicU64::new(0),
            }))
        }

        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            let mut gauges = lock(&self.gauges);
            if let Some(state) = gauges.get(key) {
                return Gauge::from_arc(Arc::clone(state));
            }
            let name = key.name();
            let mut builder = self.meter.f64_gauge(otel_name(name));
            if let Some(m) = mapping(name) {
                builder = builder.with_description(m.description);
                if let Some(unit) = m.unit {
                    builder = builder.with_unit(unit);
                }
            }
            let state = Arc::new(GaugeState {
                gauge: builder.build(),
                attributes: attributes(key),
                value: Mutex::new(0.0),
            });
            gauges.insert(key.clone(), Arc::clone(&state));
            Gauge::from_arc(state)
        }

        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::from_arc(Arc::new(HistogramHandle {
                histogram: self.histogram(key.name()),
                attributes: attributes(key),
            }))
        }
    }

    struct CounterHandle {
        counter: opentelemetry::metrics::Counter<u64>,
        attributes: Vec<KeyValue>,
        /// The last absolute value set through this handle.
        last: AtomicU64,
    }

    impl CounterFn for CounterHandle {
        fn increment(&self, value: u64) {
            self.counter.add(value, &self.attributes);
        }

        fn absolute(&self, value: u64) {
            let before = self.last.fetch_max(value, Ordering::Relaxed);
            if value > before {
                self.counter.add(value - before, &self.attributes);
            }
        }
    }

    /// The current value of one gauge label set, shared by every handle of its key. The
    /// lock orders updates with their recordings, so the last value recorded is the current
    /// one.
    struct GaugeState {
        gauge: opentelemetry::metrics::Gauge<f64>,
        attributes: Vec<KeyValue>,
        value: Mutex<f64>,
    }

    impl GaugeState {
        fn update(&self, f: impl FnOnce(f64) -> f64) {
            let mut value = lock(&self.value);
            *value = f(*value);
            self.gauge.record(*value, &self.attributes);
        }
    }

    impl GaugeFn for GaugeState {
        fn increment(&self, value: f64) {
            self.update(|v| v + value);
        }

        fn decrement(&self, value: f64) {
            self.update(|v| v - value);
        }

        fn set(&self, value: f64) {
            self.update(|_| value);
        }
    }

    struct HistogramHandle {
        histogram: opentelemetry::metrics::Histogram<f64>,
        attributes: Vec<KeyValue>,
    }

    impl HistogramFn for HistogramHandle {
        fn record(&self, value: f64) {
            self.histogram.record(value, &self.attributes);
        }
    }
}
