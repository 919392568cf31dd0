//! OpenTelemetry tracing of both binaries: the OTLP/gRPC exporter (off unless an endpoint is
//! configured), W3C trace-context propagation across the config stream, and the bookkeeping that
//! lets a span started later, in another task, name the span whose work it continues.
//!
//! Configuration is the standard one: `OTEL_EXPORTER_OTLP_ENDPOINT` (or the `--otlp-endpoint`
//! flag, or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` and the
//! `OTEL_BSP_*` batch settings, all read by the OpenTelemetry SDK itself. With no endpoint no
//! exporter exists, [`enabled`] is false, and the packet path creates no spans at all.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Whether spans are exported (set once, when the exporter is installed).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// At most this many links on one span: a revision that coalesces thousands of allocations
/// names the first ones, not all of them.
pub const MAX_LINKS: usize = 32;

/// Why tracing could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The OTLP exporter could not be built (bad endpoint, TLS setup).
    #[error("cannot build the OTLP exporter for {endpoint:?}: {source}")]
    Exporter {
        /// The endpoint as configured.
        endpoint: String,
        /// What the exporter builder said.
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// Whether spans are exported. Hot paths (a DHCP exchange) create their spans only when this is
/// true, so tracing costs nothing there while it is off.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The endpoint to export to: the flag, else `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else
/// `OTEL_EXPORTER_OTLP_ENDPOINT`; `None` (tracing off) when none is set or all are blank.
pub fn endpoint(flag: Option<&str>) -> Option<String> {
    let env = |name: &str| std::env::var(name).ok();
    [
        flag.map(str::to_owned),
        env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        env("OTEL_EXPORTER_OTLP_ENDPOINT"),
    ]
    .into_iter()
    .flatten()
    .map(|s| s.trim().to_owned())
    .find(|s| !s.is_empty())
}

/// The exporting tracer provider; it must be created inside a Tokio runtime (the gRPC client
/// runs on it). `service` names the process unless `OTEL_SERVICE_NAME` or
/// `OTEL_RESOURCE_ATTRIBUTES` already do.
pub fn provider(endpoint: &str, service: &str) -> Result<SdkTracerProvider, TraceError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|source| TraceError::Exporter {
            endpoint: endpoint.to_owned(),
            source,
        })?;
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|s| !s.trim().is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|s| s.contains("service.name="));
    let mut resource = opentelemetry_sdk::Resource::builder();
    if !named {
        resource = resource.with_service_name(service.to_owned());
    }
    let resource = resource
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// The `tracing` layer exporting through `provider`; installing it turns [`enabled`] on.
pub fn layer<S>(
    provider: &SdkTracerProvider,
) -> tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    ENABLED.store(true, Ordering::Relaxed);
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("vmdhcp"))
        .with_tracked_inactivity(false)
        .with_threads(false)
}

/// The exported context of `span`, if it has one (tracing on, span sampled or not).
pub fn span_context(span: &tracing::Span) -> Option<SpanContext> {
    if !enabled() {
        return None;
    }
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then_some(sc)
}

/// Makes `span` continue the work of `causes`: the first becomes its parent, the others (up to
/// [`MAX_LINKS`]) are linked. Must be called before the span is first entered.
pub fn continue_from(span: &tracing::Span, causes: &[SpanContext]) {
    let mut causes = causes.iter().filter(|c| c.is_valid());
    let Some(parent) = causes.next() else {
        return;
    };
    let parent = opentelemetry::Context::new().with_remote_span_context(parent.clone());
    if let Err(e) = span.set_parent(parent) {
        tracing::debug!(error = %e, "span parent not set");
        return;
    }
    for link in causes.take(MAX_LINKS) {
        span.add_link(link.clone());
    }
}

/// The W3C trace context (`traceparent`, `tracestate`) of `span`, for a message that crosses a
/// process boundary; empty when tracing is off.
pub fn inject(span: &tracing::Span) -> HashMap<String, String> {
    let mut carrier = HashMap::new();
    if enabled() {
        TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    }
    carrier
}

/// The span context a W3C carrier names, if it names a valid one.
pub fn extract(carrier: &HashMap<String, String>) -> Option<SpanContext> {
    if carrier.is_empty() {
        return None;
    }
    let cx = TraceContextPropagator::new().extract(carrier);
    let sc = cx.span().span_context().clone();
    sc.is_valid().then_some(sc)
}

/// Remembers, for a bounded while, which span produced a piece of state (keyed by `K`), so that
/// the span that later acts on it — in another task, triggered through the API server — can
/// continue its trace. Holds at most `capacity` keys, forgetting the oldest first; records
/// nothing while tracing is off.
#[derive(Debug)]
pub struct Causes<K> {
    inner: Mutex<CausesInner<K>>,
    capacity: usize,
}

#[derive(Debug)]
struct CausesInner<K> {
    by_key: HashMap<K, SpanContext>,
    order: VecDeque<K>,
}

impl<K: Eq + Hash + Clone> Causes<K> {
    /// A registry holding at most `capacity` keys.
    pub fn new(capacity: usize) -> Self {
        Causes {
            inner: Mutex::new(CausesInner {
                by_key: HashMap::new(),
                order: VecDeque::new(),
            }),
            capacity: capacity.max(1),
        }
    }

    /// Records the current span as the cause of `key` (no-op while tracing is off).
    pub fn record_current(&self, key: K) {
        if let Some(sc) = span_context(&tracing::Span::current()) {
            self.record(key, sc);
        }
    }

    /// Records `cause` for `key`, replacing an earlier one.
    pub fn record(&self, key: K, cause: SpanContext) {
        let mut inner = self.inner.lock();
        if inner.by_key.insert(key.clone(), cause).is_none() {
            inner.order.push_back(key);
        }
        while inner.order.len() > self.capacity {
            if let Some(old) = inner.order.pop_front() {
                inner.by_key.remove(&old);
            }
        }
    }

    /// The cause of `key`, if still remembered.
    pub fn get(&self, key: &K) -> Option<SpanContext> {
        self.inner.lock().by_key.get(key).cloned()
    }

    /// The cause of `key`, forgotten as it is returned.
    pub fn take(&self, key: &K) -> Option<SpanContext> {
        let mut inner = self.inner.lock();
        let found = inner.by_key.remove(key);
        if found.is_some() {
            inner.order.retain(|k| k != key);
        }
        found
    }

    /// How many keys are remembered.
    pub fn len(&self) -> usize {
        self.inner.lock().by_key.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};

    fn sc(n: u8) -> SpanContext {
        SpanContext::new(
            TraceId::from_bytes([n; 16]),
            SpanId::from_bytes([n; 8]),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        )
    }

    #[test]
    fn causes_are_bounded_and_forget_the_oldest_first() {
        let causes = Causes::new(2);
        causes.record("a", sc(1));
        causes.record("b", sc(2));
        causes.record("a", sc(3));
        assert_eq!(
            causes.len(),
            2,
            "re-recording a key does not grow the registry"
        );
        causes.record("c", sc(4));
        assert_eq!(causes.get(&"a"), None, "the oldest key went first");
        assert_eq!(causes.get(&"b"), Some(sc(2)));
        assert_eq!(causes.take(&"c"), Some(sc(4)));
        assert_eq!(causes.take(&"c"), None);
        assert_eq!(causes.len(), 1);
    }

    #[test]
    fn w3c_context_round_trips_and_garbage_is_no_context() {
        let original = sc(7);
        let cx = opentelemetry::Context::new().with_remote_span_context(original.clone());
        let mut carrier = HashMap::new();
        TraceContextPropagator::new().inject_context(&cx, &mut carrier);
        assert_eq!(
            carrier["traceparent"],
            "00-07070707070707070707070707070707-0707070707070707-01"
        );
        let back = extract(&carrier).unwrap();
        assert_eq!(back.trace_id(), original.trace_id());
        assert_eq!(back.span_id(), original.span_id());
        assert!(back.is_remote());

        assert_eq!(extract(&HashMap::new()), None);
        for bad in [
            "garbage",
            "00-00000000000000000000000000000000-0707070707070707-01",
            "00-zz070707070707070707070707070707-0707070707070707-01",
        ] {
            let carrier = HashMap::from([("traceparent".to_owned(), bad.to_owned())]);
            assert_eq!(extract(&carrier), None, "{bad}");
        }
    }

    #[test]
    fn the_endpoint_comes_from_the_flag_first_and_blank_means_off() {
        assert_eq!(
            endpoint(Some(" http://collector:4317 ")).as_deref(),
            Some("http://collector:4317")
        );
        // The environment is process-wide: only assert what holds whatever it says.
        if std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
            && std::env::var_os("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
        {
            assert_eq!(endpoint(Some("  ")), None);
            assert_eq!(endpoint(None), None);
        }
    }
}
