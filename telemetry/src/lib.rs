//! Telemetry both binaries set up the same way at start: the log filter and the log format
//! (text for terminals, one JSON object per line for log collectors, with the fields of the
//! event and of every enclosing span, so a line on a request path carries its pool and MAC).
//!
//! [`LogArgs`] are the flags (`--log-format`, `--log-level`, with `LOG_FORMAT` and `RUST_LOG`),
//! [`init`] installs the process-wide subscriber, and [`subscriber`] builds it for any writer
//! (what the tests use).

use tracing::Subscriber;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// Filter used when neither `--log-level` nor `RUST_LOG` says otherwise.
pub const DEFAULT_FILTER: &str = "info";

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

/// The logging flags of both binaries.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct LogArgs {
    /// Log format: `text` for terminals, `json` (one object per line) for log collectors.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t, global = true)]
    pub log_format: LogFormat,
    /// Log filter in `RUST_LOG` syntax (e.g. `info,vmdhcp_agent=debug`); takes precedence over
    /// `RUST_LOG`; `info` when neither is set.
    #[arg(long, global = true)]
    pub log_level: Option<String>,
}

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The filter does not parse.
    #[error("invalid log filter {filter:?}: {reason}")]
    Filter {
        /// The filter as given.
        filter: String,
        /// What the parser said.
        reason: String,
    },
    /// Something installed a global subscriber first.
    #[error("cannot install the log subscriber: {0}")]
    Install(#[from] tracing_subscriber::util::TryInitError),
}

/// The filter: `--log-level`, else `RUST_LOG`, else [`DEFAULT_FILTER`].
pub fn filter(args: &LogArgs) -> Result<EnvFilter, TelemetryError> {
    let spec = args
        .log_level
        .clone()
        .or_else(|| {
            std::env::var("RUST_LOG")
                .ok()
                .filter(|s| !s.trim().is_empty())
        })
        .unwrap_or_else(|| DEFAULT_FILTER.to_owned());
    EnvFilter::try_new(&spec).map_err(|e| TelemetryError::Filter {
        reason: e.to_string(),
        filter: spec,
    })
}

/// The subscriber for `args`, writing to `writer`; `ansi` colours text lines (for terminals).
pub fn subscriber<W>(
    args: &LogArgs,
    writer: W,
    ansi: bool,
) -> Result<impl Subscriber + Send + Sync + 'static, TelemetryError>
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let format: Box<dyn Layer<Registry> + Send + Sync> = match args.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(writer)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(false)
            .with_span_list(true)
            .with_writer(writer)
            .boxed(),
    };
    Ok(tracing_subscriber::registry()
        .with(format)
        .with(filter(args)?))
}

/// Installs the process-wide subscriber for `args`, logging to stderr (coloured only when
/// stderr is a terminal, so files and collectors get plain text).
pub fn init(args: &LogArgs) -> Result<(), TelemetryError> {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    subscriber(args, std::io::stderr, ansi)?.try_init()?;
    Ok(())
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
        let sub = subscriber(args, out.clone(), false).unwrap();
        tracing::subscriber::with_default(sub, || {
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
    fn text_lines_for_terminals_and_the_filter_applies() {
        let text = log_with(&LogArgs {
            log_format: LogFormat::Text,
            log_level: Some("info".into()),
        });
        assert!(text.contains("offered"), "{text}");
        assert!(text.contains("pool=\"ns/pool-a\""), "{text}");
        assert!(!text.contains("hidden at info"), "{text}");
        let debug = log_with(&LogArgs {
            log_format: LogFormat::Text,
            log_level: Some("debug".into()),
        });
        assert!(debug.contains("hidden at info"), "{debug}");
    }

    #[test]
    fn an_invalid_filter_is_a_clear_error() {
        let args = LogArgs {
            log_format: LogFormat::Text,
            log_level: Some("info,vmdhcp=notalevel".into()),
        };
        let err = filter(&args).unwrap_err().to_string();
        assert!(
            err.contains("invalid log filter") && err.contains("notalevel"),
            "{err}"
        );
    }
}
