//! Telemetry both binaries set up the same way at start: the log filter, the log format (text
//! for terminals, one JSON object per line for log collectors, with the fields of the event and
//! of every enclosing span, so a line on a request path carries its pool and MAC, and the trace
//! and span ids when tracing is on) and OpenTelemetry tracing ([`trace`]).
//!
//! [`LogArgs`] are the flags (`--log-format`, `--log-level`, `--otlp-endpoint`, with
//! `LOG_FORMAT`, `RUST_LOG` and `OTEL_EXPORTER_OTLP_ENDPOINT`), [`init`] installs the
//! process-wide subscriber, and [`dispatch`] builds it for any writer (what the tests use).

pub mod trace;

use std::sync::{Arc, OnceLock};

use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Subscriber;
use tracing::dispatcher::{Dispatch, WeakDispatch};
use tracing_subscriber::filter::{Targets, filter_fn};
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// Filter used when neither `--log-level` nor `RUST_LOG` says otherwise: `info`, but errors
/// only from the netlink packet parser, which warns on every link read from a kernel newer than
/// it (`IFLA_INET6_CONF` holding more than it knows).
pub const DEFAULT_FILTER: &str = "info,netlink_packet_route=error";

/// How log lines are written.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines, for terminals.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, message, fields, spans), for
    /// collectors.
    Json,
}

/// The logging and tracing flags of both binaries.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct LogArgs {
    /// Log format: `text` for terminals, `json` (one object per line) for log collectors.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t, global = true)]
    pub log_format: LogFormat,
    /// Log filter in `RUST_LOG` syntax (e.g. `info,vmdhcp_agent=debug`); takes precedence over
    /// `RUST_LOG`; `info` when neither is set.
    #[arg(long, global = true)]
    pub log_level: Option<String>,
    /// OTLP/gRPC endpoint to export traces to (e.g. `http://otel-collector:4317`); also
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`. Tracing is off when neither is set. Service name,
    /// resource attributes and sampling follow the standard `OTEL_*` variables.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", global = true)]
    pub otlp_endpoint: Option<String>,
}

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The filter does not parse.
    #[error("invalid log filter {filter:?}: {source}")]
    Filter {
        /// The filter as given.
        filter: String,
        /// What the parser said.
        source: tracing_subscriber::filter::ParseError,
    },
    /// Something installed a global subscriber first.
    #[error("cannot install the log subscriber: {0}")]
    Install(#[from] tracing_subscriber::util::TryInitError),
    /// Tracing could not be set up.
    #[error(transparent)]
    Trace(#[from] trace::TraceError),
}

/// The log filter, in `RUST_LOG` syntax. Plain `target=level` directives make a static filter
/// ([`Targets`]): decided once per callsite, with nothing to do per span. Directives on spans and
/// their fields (`target[span{field=value}]=level`) need [`EnvFilter`], which tracks every span
/// it might match: a read lock and a map lookup on every span enter and exit, whether or not any
/// such directive is given (a share of the controller's CPU under load: docs/tuning.md), so it is
/// used only for those.
#[derive(Debug)]
pub enum LogFilter {
    /// Only `target=level` directives.
    Static(Box<Targets>),
    /// Some directive names a span.
    Dynamic(Box<EnvFilter>),
}

/// The filter: `--log-level`, else `RUST_LOG`, else [`DEFAULT_FILTER`].
pub fn filter(args: &LogArgs) -> Result<LogFilter, TelemetryError> {
    let spec = args
        .log_level
        .clone()
        .or_else(|| {
            std::env::var("RUST_LOG")
                .ok()
                .filter(|s| !s.trim().is_empty())
        })
        .unwrap_or_else(|| DEFAULT_FILTER.to_owned());
    let parsed = if spec.contains('[') {
        EnvFilter::try_new(&spec).map(|env| LogFilter::Dynamic(Box::new(env)))
    } else {
        spec.parse::<Targets>()
            .map(|t| LogFilter::Static(Box::new(t)))
    };
    parsed.map_err(|source| TelemetryError::Filter {
        source,
        filter: spec,
    })
}

/// Adds `"trace_id"` and `"span_id"` (of the innermost span, when it is exported) to each JSON
/// line written by the wrapped formatter, so a log line leads to its trace.
struct WithTraceIds<F> {
    inner: F,
    /// The dispatcher this formatter runs in, set once it exists: while an event is being
    /// dispatched `tracing` hides the current dispatcher, so the span's OpenTelemetry context
    /// has to be looked up through this one.
    dispatch: Arc<OnceLock<WeakDispatch>>,
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        let ids = trace::enabled()
            .then(|| {
                let leaf = ctx.event_scope()?.next()?.id();
                let dispatch = self.dispatch.get()?.upgrade()?;
                let cx = tracing_opentelemetry::get_otel_context(&leaf, &dispatch)?;
                let sc = opentelemetry::trace::TraceContextExt::span(&cx)
                    .span_context()
                    .clone();
                sc.is_valid().then_some(sc)
            })
            .flatten();
        if let Some(sc) = ids {
            // The wrapped formatter writes one JSON object and a newline: splice the ids in
            // before its closing brace.
            if let Some(end) = line.rfind('}') {
                line.insert_str(
                    end,
                    &format!(
                        ",\"trace_id\":\"{}\",\"span_id\":\"{}\"",
                        sc.trace_id(),
                        sc.span_id()
                    ),
                );
            }
        }
        writer.write_str(&line)
    }
}

/// Whether a span or event belongs to vmdhcp's own code: only those are exported as spans
/// (library spans, such as kube-runtime's per-reconcile span, would start traces of their own).
fn ours(meta: &tracing::Metadata<'_>) -> bool {
    meta.target().starts_with("vmdhcp")
}

/// The dispatcher (subscriber) for `args`, writing to `writer`; `ansi` colours text lines (for
/// terminals); spans are exported through `tracer` when given.
pub fn dispatch<W>(
    args: &LogArgs,
    writer: W,
    ansi: bool,
    tracer: Option<&SdkTracerProvider>,
) -> Result<Dispatch, TelemetryError>
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let me = Arc::new(OnceLock::new());
    let format: Box<dyn Layer<Registry> + Send + Sync> = match args.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(writer)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .fmt_fields(JsonFields::new())
            .event_format(WithTraceIds {
                inner: tracing_subscriber::fmt::format()
                    .json()
                    .with_current_span(false)
                    .with_span_list(true),
                dispatch: me.clone(),
            })
            .with_writer(writer)
            .boxed(),
    };
    let export = tracer.map(|p| trace::layer(p).with_filter(filter_fn(ours)));
    let (statics, dynamics) = match filter(args)? {
        LogFilter::Static(targets) => (Some(*targets), None),
        LogFilter::Dynamic(env) => (None, Some(*env)),
    };
    let dispatch = Dispatch::new(
        tracing_subscriber::registry()
            .with(format)
            .with(export)
            .with(statics)
            .with(dynamics),
    );
    // Set once, right here: the formatter cannot run before the dispatcher exists.
    let _ = me.set(dispatch.downgrade());
    Ok(dispatch)
}

/// What [`init`] set up; dropping it flushes the spans not yet exported (keep it alive until
/// the process ends, and drop it while the Tokio runtime still runs).
#[derive(Debug, Default)]
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn tracing(&self) -> bool {
        self.tracer.is_some()
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.tracer.take()
            && let Err(e) = provider.shutdown()
        {
            tracing::warn!(error = %e, "spans may have been lost at exit");
        }
    }
}

/// Installs the process-wide subscriber for `args`, logging to stderr (coloured only when
/// stderr is a terminal, so files and collectors get plain text) and, when an OTLP endpoint is
/// configured, exporting spans as `service` (unless `OTEL_SERVICE_NAME` says otherwise). Must
/// run inside a Tokio runtime when tracing is configured.
pub fn init(args: &LogArgs, service: &str) -> Result<Telemetry, TelemetryError> {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let tracer = match trace::endpoint(args.otlp_endpoint.as_deref()) {
        Some(endpoint) => Some(trace::provider(&endpoint, service)?),
        None => None,
    };
    dispatch(args, std::io::stderr, ansi, tracer.as_ref())?.try_init()?;
    if tracer.is_some() {
        tracing::info!(service, "exporting traces over OTLP");
    }
    Ok(Telemetry { tracer })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Collects what the subscriber writes.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(data);
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    fn log_with(args: &LogArgs) -> String {
        let out = Buffer::default();
        let sub = dispatch(args, out.clone(), false, None).unwrap();
        tracing::dispatcher::with_default(&sub, || {
            let span = tracing::info_span!("dhcp", pool = "ns/pool-a");
            let _in = span.enter();
            tracing::info!(mac = "02:00:00:00:00:01", "offered");
            tracing::debug!("hidden at info");
        });
        String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn json_lines_carry_the_event_and_its_spans_fields() {
        let args = LogArgs {
            log_format: LogFormat::Json,
            log_level: Some("info".into()),
            ..Default::default()
        };
        let text = log_with(&args);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        let line: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["fields"]["message"], "offered");
        assert_eq!(line["fields"]["mac"], "02:00:00:00:00:01");
        assert_eq!(line["spans"][0]["name"], "dhcp");
        assert_eq!(line["spans"][0]["pool"], "ns/pool-a");
    }

    #[test]
    fn json_lines_carry_trace_and_span_ids_when_tracing() {
        // A provider without an exporter still gives every span real ids.
        let provider = SdkTracerProvider::builder().build();
        let args = LogArgs {
            log_format: LogFormat::Json,
            log_level: Some("info".into()),
            ..Default::default()
        };
        let out = Buffer::default();
        let sub = dispatch(&args, out.clone(), false, Some(&provider)).unwrap();
        let expected = tracing::dispatcher::with_default(&sub, || {
            tracing::info!("outside any span");
            let span = tracing::info_span!("dhcp", pool = "ns/pool-a");
            let _in = span.enter();
            tracing::info!(mac = "02:00:00:00:00:01", "offered");
            trace::span_context(&span).unwrap()
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].get("trace_id").is_none(), "{text}");
        assert_eq!(lines[1]["trace_id"], expected.trace_id().to_string());
        assert_eq!(lines[1]["span_id"], expected.span_id().to_string());
        assert_eq!(lines[1]["fields"]["mac"], "02:00:00:00:00:01");
        assert_eq!(lines[1]["spans"][0]["pool"], "ns/pool-a");
    }

    #[test]
    fn text_lines_for_terminals_and_the_filter_applies() {
        let text = log_with(&LogArgs {
            log_format: LogFormat::Text,
            log_level: Some("info".into()),
            ..Default::default()
        });
        assert!(text.contains("offered"), "{text}");
        assert!(text.contains("pool=\"ns/pool-a\""), "{text}");
        assert!(!text.contains("hidden at info"), "{text}");
        let debug = log_with(&LogArgs {
            log_format: LogFormat::Text,
            log_level: Some("debug".into()),
            ..Default::default()
        });
        assert!(debug.contains("hidden at info"), "{debug}");
    }

    /// Logs an event of target `a` and one of target `b`, both inside a span `dhcp` of `pool`.
    fn two_targets(level: &str) -> String {
        let out = Buffer::default();
        let args = LogArgs {
            log_level: Some(level.into()),
            ..Default::default()
        };
        let sub = dispatch(&args, out.clone(), false, None).unwrap();
        tracing::dispatcher::with_default(&sub, || {
            for pool in ["ns/pool-a", "ns/pool-b"] {
                let span = tracing::info_span!("dhcp", pool);
                let _in = span.enter();
                tracing::debug!(target: "a", "debug of a in {pool}");
                tracing::debug!(target: "b", "debug of b in {pool}");
            }
        });
        String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn target_and_span_directives_both_filter() {
        // (filter, static?, lines logged, lines not logged)
        let cases: [(&str, bool, &[&str], &[&str]); 2] = [
            (
                "info,a=debug",
                true,
                &["debug of a in ns/pool-a", "debug of a in ns/pool-b"],
                &["debug of b"],
            ),
            (
                "info,[dhcp{pool=ns/pool-b}]=debug",
                false,
                &["debug of a in ns/pool-b", "debug of b in ns/pool-b"],
                &["in ns/pool-a"],
            ),
        ];
        for (level, static_, logged, not_logged) in cases {
            let kind = filter(&LogArgs {
                log_level: Some(level.into()),
                ..Default::default()
            })
            .unwrap();
            assert_eq!(matches!(kind, LogFilter::Static(_)), static_, "{level}");
            let text = two_targets(level);
            for line in logged {
                assert!(text.contains(line), "{level}: {line} missing from {text}");
            }
            for line in not_logged {
                assert!(!text.contains(line), "{level}: {line} in {text}");
            }
        }
    }

    #[test]
    fn an_invalid_filter_is_a_clear_error() {
        let args = LogArgs {
            log_format: LogFormat::Text,
            log_level: Some("info,vmdhcp=notalevel".into()),
            ..Default::default()
        };
        let err = filter(&args).unwrap_err().to_string();
        assert!(
            err.contains("invalid log filter") && err.contains("notalevel"),
            "{err}"
        );
    }
}
