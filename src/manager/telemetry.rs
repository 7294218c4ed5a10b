//! Logs and traces of the manager.
//!
//! - Logs: text or JSON lines on stdout, filtered by a RUST_LOG-style filter. Crates that can
//!   log credentials or signed requests (the AWS SDK, HTTP clients) are always capped at `warn`,
//!   whatever the filter says.
//! - Traces: exported by OTLP when the standard `OTEL_*` variables ask for it
//!   (`OTEL_TRACES_EXPORTER=otlp`, or an `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`); the protocol
//!   follows `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL` (`http/protobuf` by default, or `grpc`).
//!   [`Telemetry::shutdown`] flushes the spans still buffered.

use std::io::IsTerminal;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use super::args::LogFormat;

/// Directives appended to every log filter: later directives for the same target win, so these
/// cannot be lowered by `RUST_LOG`. The AWS SDK logs canonical (signed) requests and credential
/// resolution at debug/trace; HTTP clients can log headers.
pub const SECRET_SAFE_DIRECTIVES: &[&str] = &[
    "aws_sigv4=warn",
    "aws_smithy_runtime=warn",
    "aws_smithy_runtime_api=warn",
    "aws_smithy_http_client=warn",
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
    #[error("cannot install the log subscriber: {0}")]
    Install(tracing_subscriber::util::TryInitError),
}

/// What must be flushed at exit.
pub struct Telemetry {
    tracer_provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Flushes and stops the trace exporter, if any.
    pub fn shutdown(self) {
        if let Some(provider) = self.tracer_provider
            && let Err(error) = provider.shutdown()
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

/// The log filter: `filter` followed by [`SECRET_SAFE_DIRECTIVES`].
pub fn log_filter(filter: &str) -> Result<EnvFilter, TelemetryError> {
    let mut directives = vec![filter.trim()];
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

/// Installs the global subscriber. Call inside the Tokio runtime (the gRPC exporter needs it).
pub fn init(format: LogFormat, filter: &str) -> Result<Telemetry, TelemetryError> {
    let filter = log_filter(filter)?;
    let tracer_provider = match otlp_transport(|name| std::env::var(name).ok()) {
        Some(transport) => Some(tracer_provider(transport)?),
        None => None,
    };
    let otel_layer = tracer_provider
        .as_ref()
        .map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer("pgkube")));
    let (json, text) = match format {
        LogFormat::Json => (
            Some(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_span_list(true),
            ),
            None,
        ),
        LogFormat::Text => (
            None,
            Some(tracing_subscriber::fmt::layer().with_ansi(std::io::stdout().is_terminal())),
        ),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(otel_layer)
        .with(json)
        .with(text)
        .try_init()
        .map_err(TelemetryError::Install)?;
    Ok(Telemetry { tracer_provider })
}

fn tracer_provider(transport: OtlpTransport) -> Result<SdkTracerProvider, TelemetryError> {
    // Endpoint, headers, timeout and compression come from the OTEL_EXPORTER_OTLP_* variables.
    let exporter = match transport {
        OtlpTransport::Grpc => SpanExporter::builder().with_tonic().build(),
        OtlpTransport::HttpProtobuf => SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .build(),
    }
    .map_err(TelemetryError::Exporter)?;
    // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over our default name.
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("pgkube");
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
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
            tracing::debug!(target: "hyper_util::client", "headers AUTH-HEADER");
            tracing::debug!(target: "pgkube::manager", "visible debug line");
            tracing::warn!(target: "aws_sigv4", "visible warning");
        });
        let bytes = captured.0.lock().expect("lock").clone();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[test]
    fn aws_and_http_client_debug_logs_stay_off_even_when_asked_for() {
        for filter in [
            "trace",
            "debug,aws_sigv4=trace,aws_smithy_runtime=trace,hyper_util=trace",
        ] {
            let output = logged_with_filter(filter);
            assert!(output.contains("visible debug line"), "{filter}: {output}");
            assert!(output.contains("visible warning"), "{filter}: {output}");
            for secret in ["SIGNED-SECRET", "SECRET-KEY", "AUTH-HEADER"] {
                assert!(
                    !output.contains(secret),
                    "{filter} leaked {secret}: {output}"
                );
            }
        }
    }

    #[test]
    fn a_malformed_filter_is_a_clear_error() {
        let error = log_filter("pgkube=loud").expect_err("invalid level");
        assert!(error.to_string().contains("pgkube=loud"), "{error}");
    }
}
