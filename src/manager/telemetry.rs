//! Logs and traces of the manager: the shared set-up of [`pgkube::telemetry`] (secret-safe log
//! filter, OTLP export when the `OTEL_*` variables ask for it, bounded flush at exit), with logs
//! on stdout as text or JSON lines as `--log-format` says.

use pgkube::telemetry::{LogOutput, init as init_shared};
pub use pgkube::telemetry::{Telemetry, TelemetryError};

use super::args::LogFormat;

/// The service name of the manager's spans, unless `OTEL_SERVICE_NAME` says otherwise.
const SERVICE_NAME: &str = "pgkube";

/// Installs the global subscriber. Call inside the Tokio runtime (the gRPC exporter needs it).
pub fn init(format: LogFormat, filter: &str) -> Result<Telemetry, TelemetryError> {
    let output = match format {
        LogFormat::Json => LogOutput::JsonStdout,
        LogFormat::Text => LogOutput::TextStdout,
    };
    init_shared(output, filter, SERVICE_NAME)
}
