//! Logs and traces, shared by the manager (`pgkube run`) and the agent (`pgkube agent`).
//!
//! - Logs: text or JSON lines ([`LogOutput`]), filtered by a RUST_LOG-style filter. Crates that
//!   can log credentials or signed requests (the AWS SDK, HTTP clients) are always capped at
//!   `warn`, whatever the filter says ([`SECRET_SAFE_DIRECTIVES`]).
//! - Traces: exported by OTLP when the standard `OTEL_*` variables ask for it
//!   (`OTEL_TRACES_EXPORTER=otlp`, or an `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`); the protocol
//!   follows `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL` (`http/protobuf` by default, or `grpc`).
//!   An `https://` endpoint is verified against the system's roots, or only against the PEM
//!   file named by `OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE` when it is set (see [`tls`]).
//!   [`Telemetry::shutdown`] flushes the spans still buffered, within [`FLUSH_TIMEOUT`].
//! - Trace context: [`remote_parent`] reads a W3C `traceparent` (the `TRACEPARENT` variable a
//!   backup Job gets from the reconcile that created it) with OpenTelemetry's
//!   [`TraceContextPropagator`], so that the agent's spans join the reconcile's trace.

pub mod tls;

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Directives appended to every log filter: later directives for the same target win, so these
/// cannot be lowered by `RUST_LOG`. The AWS SDK logs canonical (signed) requests and credential
/// resolution at debug/trace (web identity's request carries the service account's token);
/// HTTP clients can log headers.
pub const SECRET_SAFE_DIRECTIVES: &[&str] = &[
    "aws_sigv4=warn",
    "aws_smithy_runtime=warn",
    "aws_smithy_runtime_api=warn",
    "aws_smithy_http_client=warn",
    "aws_smithy_types=warn",
    "aws_config=warn",
    "aws_credential_types=warn",
    "aws_sdk_s3=warn",
    "aws_sdk_sts=warn",
    "hyper=warn",
    "hyper_util=warn",
    "h2=warn",
    "reqwest=warn",
    "tonic=warn",
    "rustls=warn",
];

/// The longest [`Telemetry::shutdown`] waits for the last spans to be exported, so that an
/// unreachable collector never holds a process (or a backup Job) up for long.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Why telemetry could not start. Inner errors are part of the message, not `#[source]`, so
/// `{:#}` prints each cause once.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("invalid log filter `{filter}`: {error}")]
    Filter {
        filter: String,
        error: tracing_subscriber::filter::ParseError,
    },
    #[error("cannot set up the OTLP trace exporter: {0}")]
    Exporter(opentelemetry_otlp::ExporterBuildError),
    #[error("cannot use the OTLP collector's CA certificate {path}: {reason}")]
    Certificate { path: String, reason: String },
    #[error("cannot install the log subscriber: {0}")]
    Install(tracing_subscriber::util::TryInitError),
}

/// Where log lines go, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogOutput {
    /// Text on stdout (colours on a terminal).
    TextStdout,
    /// JSON lines on stdout, with the current span and the span list.
    JsonStdout,
    /// Text on stderr without targets: the agent's, whose stdout is its result line.
    TextStderr,
}

/// What must be flushed at exit.
pub struct Telemetry {
    tracer_provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exports_traces(&self) -> bool {
        self.tracer_provider.is_some()
    }

    /// Flushes and stops the trace exporter, if any, waiting at most [`FLUSH_TIMEOUT`].
    pub fn shutdown(self) {
        if let Some(provider) = self.tracer_provider
            && let Err(error) = provider.shutdown_with_timeout(FLUSH_TIMEOUT)
        {
            eprintln!("pgkube: warning: flushing traces failed: {error}");
        }
    }
}

/// Which OTLP transport the environment asks for, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpTransport {
    HttpProtobuf,
    Grpc,
}

/// Reads the standard `OTEL_*` variables through `var` and decides whether and how to export.
pub fn otlp_transport(var: impl Fn(&str) -> Option<String>) -> Option<OtlpTransport> {
    let set = |name: &str| var(name).filter(|value| !value.trim().is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true")) {
        return None;
    }
    let exporter = set("OTEL_TRACES_EXPORTER");
    let endpoint_set = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
        || set("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
    let wanted = match exporter.as_deref() {
        Some(exporters) => exporters.split(',').any(|name| name.trim() == "otlp"),
        None => endpoint_set,
    };
    if !wanted {
        return None;
    }
    let protocol =
        set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL"));
    Some(match protocol.as_deref() {
        Some("grpc") => OtlpTransport::Grpc,
        _ => OtlpTransport::HttpProtobuf,
    })
}

/// Directives put before the user's filter, which may override them: the cron engine's timer
/// crate logs every job it arms at `info`, once per scheduled backup per cluster.
pub const QUIET_BY_DEFAULT: &[&str] = &["tokio_cron_scheduler=warn"];

/// The log filter: [`QUIET_BY_DEFAULT`], then `filter`, then [`SECRET_SAFE_DIRECTIVES`].
pub fn log_filter(filter: &str) -> Result<EnvFilter, TelemetryError> {
    let mut directives = QUIET_BY_DEFAULT.to_vec();
    directives.push(filter.trim());
    directives.extend_from_slice(SECRET_SAFE_DIRECTIVES);
    let full = directives
        .into_iter()
        .filter(|directive| !directive.is_empty())
        .collect::<Vec<_>>()
        .join(",");
    EnvFilter::builder()
        .parse(&full)
        .map_err(|error| TelemetryError::Filter {
            filter: filter.to_owned(),
            error,
        })
}

/// Installs the global subscriber with logs as `output` says and, when the `OTEL_*` variables
/// ask for it, span export under `service_name` (unless `OTEL_SERVICE_NAME` names it). Call
/// inside the Tokio runtime (the gRPC exporter needs it).
pub fn init(
    output: LogOutput,
    filter: &str,
    service_name: &'static str,
) -> Result<Telemetry, TelemetryError> {
    let filter = log_filter(filter)?;
    let tracer_provider = tracer_provider_from_env(service_name)?;
    install(output, filter, tracer_provider, service_name)
}

/// The tracer provider the `OTEL_*` variables ask for, if any.
pub fn tracer_provider_from_env(
    service_name: &'static str,
) -> Result<Option<SdkTracerProvider>, TelemetryError> {
    let var = |name: &str| std::env::var(name).ok();
    match otlp_transport(var) {
        Some(transport) => Ok(Some(tracer_provider(transport, service_name, var)?)),
        None => Ok(None),
    }
}

/// Installs the global subscriber: `filter`, the span exporter if any, and the log layer.
pub fn install(
    output: LogOutput,
    filter: EnvFilter,
    tracer_provider: Option<SdkTracerProvider>,
    service_name: &'static str,
) -> Result<Telemetry, TelemetryError> {
    let otel_layer = tracer_provider
        .as_ref()
        .map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer(service_name)));
    let json = (output == LogOutput::JsonStdout).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(true)
    });
    let text = (output == LogOutput::TextStdout)
        .then(|| tracing_subscriber::fmt::layer().with_ansi(std::io::stdout().is_terminal()));
    let stderr = (output == LogOutput::TextStderr).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .with_target(false)
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(otel_layer)
        .with(json)
        .with(text)
        .with(stderr)
        .try_init()
        .map_err(TelemetryError::Install)?;
    Ok(Telemetry { tracer_provider })
}

fn tracer_provider(
    transport: OtlpTransport,
    service_name: &'static str,
    var: impl Fn(&str) -> Option<String>,
) -> Result<SdkTracerProvider, TelemetryError> {
    // Endpoint, headers, timeout and compression come from the OTEL_EXPORTER_OTLP_* variables;
    // the trust for https:// endpoints from tls::TlsSettings.
    let tls = tls::TlsSettings::from_env(&var);
    let exporter = match transport {
        OtlpTransport::Grpc => {
            let builder = SpanExporter::builder().with_tonic();
            match tls.grpc_config()? {
                Some(config) => {
                    use opentelemetry_otlp::WithTonicConfig;
                    builder.with_tls_config(config).build()
                }
                None => builder.build(),
            }
        }
        OtlpTransport::HttpProtobuf => {
            let builder = SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary);
            match tls.http_client()? {
                Some(client) => builder.with_http_client(client).build(),
                None => builder.build(),
            }
        }
    }
    .map_err(TelemetryError::Exporter)?;
    // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over our default name.
    let mut resource = Resource::builder();
    if var("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service_name);
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// The remote parent that a W3C `traceparent` (and optional `tracestate`) names, extracted by
/// OpenTelemetry's [`TraceContextPropagator`]; `None` when it is absent or not valid, so the
/// caller starts a new trace.
pub fn remote_parent(
    traceparent: Option<&str>,
    tracestate: Option<&str>,
) -> Option<opentelemetry::Context> {
    let traceparent = traceparent
        .map(str::trim)
        .filter(|value| !value.is_empty())?;
    let mut carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    if let Some(state) = tracestate.map(str::trim).filter(|value| !value.is_empty()) {
        carrier.insert("tracestate".to_owned(), state.to_owned());
    }
    let context = TraceContextPropagator::new().extract(&carrier);
    let valid = context.span().span_context().is_valid();
    valid.then_some(context)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId};
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn traces_are_exported_only_when_otel_variables_ask() {
        assert_eq!(otlp_transport(env(&[])), None);
        assert_eq!(
            otlp_transport(env(&[(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://127.0.0.1:4318"
            )])),
            Some(OtlpTransport::HttpProtobuf)
        );
        assert_eq!(
            otlp_transport(env(&[
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://127.0.0.1:4317"
                ),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
            ])),
            Some(OtlpTransport::Grpc)
        );
        assert_eq!(
            otlp_transport(env(&[("OTEL_TRACES_EXPORTER", "otlp")])),
            Some(OtlpTransport::HttpProtobuf)
        );
        assert_eq!(
            otlp_transport(env(&[
                ("OTEL_TRACES_EXPORTER", "none"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
            ])),
            None
        );
        assert_eq!(
            otlp_transport(env(&[
                ("OTEL_SDK_DISABLED", "true"),
                ("OTEL_TRACES_EXPORTER", "otlp")
            ])),
            None
        );
    }

    const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN_ID: &str = "00f067aa0ba902b7";

    #[test]
    fn a_traceparent_gives_the_remote_parent_span() {
        let traceparent = format!("00-{TRACE_ID}-{SPAN_ID}-01");
        let context = remote_parent(Some(&traceparent), Some("vendor=value")).expect("parent");
        let span = context.span();
        let parent = span.span_context();
        assert_eq!(parent.trace_id(), TraceId::from_hex(TRACE_ID).expect("hex"));
        assert_eq!(parent.span_id(), SpanId::from_hex(SPAN_ID).expect("hex"));
        assert!(parent.is_remote());
        assert_eq!(parent.trace_flags(), TraceFlags::SAMPLED);
        assert_eq!(parent.trace_state().get("vendor"), Some("value"));
    }

    #[test]
    fn an_unsampled_parent_stays_unsampled() {
        let traceparent = format!(" 00-{TRACE_ID}-{SPAN_ID}-00\n");
        let context = remote_parent(Some(&traceparent), None).expect("parent");
        assert!(!context.span().span_context().is_sampled());
    }

    #[test]
    fn without_a_valid_traceparent_a_new_trace_starts() {
        let zero_trace = format!("00-{}-{SPAN_ID}-01", "0".repeat(32));
        let zero_span = format!("00-{TRACE_ID}-{}-01", "0".repeat(16));
        for value in [
            None,
            Some(""),
            Some("   "),
            Some("garbage"),
            // (The propagator accepts short hex ids, zero-padded; our controller writes full ones.)
            Some("00-not-hex-00f067aa0ba902b7-01"),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"),
            Some(zero_trace.as_str()),
            Some(zero_span.as_str()),
            Some("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ] {
            assert!(remote_parent(value, None).is_none(), "{value:?}");
        }
    }

    /// Collects formatted log output in memory.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged_with_filter(filter: &str) -> String {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::registry()
            .with(log_filter(filter).expect("filter"))
            .with(tracing_subscriber::fmt::layer().with_writer(move || writer.clone()));
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!(target: "aws_sigv4::http_request::sign", "canonical request SIGNED-SECRET");
            tracing::trace!(target: "aws_smithy_runtime::client", "credentials SECRET-KEY");
            tracing::debug!(target: "aws_sdk_sts::operation", "web identity TOKEN-SECRET");
            tracing::debug!(target: "hyper_util::client", "headers AUTH-HEADER");
            tracing::debug!(target: "reqwest::connect", "collector HEADER-SECRET");
            tracing::debug!(target: "pgkube::manager", "visible debug line");
            tracing::warn!(target: "aws_sigv4", "visible warning");
            tracing::info!(target: "tokio_cron_scheduler::job", "Job creator created");
        });
        let bytes = captured.0.lock().expect("lock").clone();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[test]
    fn aws_and_http_client_debug_logs_stay_off_even_when_asked_for() {
        for filter in [
            "trace",
            "debug,aws_sigv4=trace,aws_smithy_runtime=trace,hyper_util=trace,reqwest=trace",
        ] {
            let output = logged_with_filter(filter);
            assert!(output.contains("visible debug line"), "{filter}: {output}");
            assert!(output.contains("visible warning"), "{filter}: {output}");
            for secret in [
                "SIGNED-SECRET",
                "SECRET-KEY",
                "TOKEN-SECRET",
                "AUTH-HEADER",
                "HEADER-SECRET",
            ] {
                assert!(
                    !output.contains(secret),
                    "{filter} leaked {secret}: {output}"
                );
            }
        }
    }

    #[test]
    fn the_cron_timers_info_lines_are_quiet_unless_asked_for() {
        assert!(!logged_with_filter("info").contains("Job creator created"));
        assert!(
            logged_with_filter("info,tokio_cron_scheduler=info").contains("Job creator created")
        );
    }

    #[test]
    fn a_malformed_filter_is_a_clear_error() {
        let error = log_filter("pgkube=loud").expect_err("invalid level");
        assert!(error.to_string().contains("pgkube=loud"), "{error}");
    }
}
