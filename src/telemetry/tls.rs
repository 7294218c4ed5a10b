//! Trust for `https://` OTLP collectors.
//!
//! opentelemetry-otlp verifies an `https://` collector against the system's roots (rustls with
//! the platform verifier for http/protobuf; the native roots for gRPC, which we ask for here,
//! since tonic trusts no root unless told), but it reads neither
//! `OTEL_EXPORTER_OTLP_CERTIFICATE` nor its `_TRACES_` variant. This module does: when one of
//! them names a PEM file, the collector is verified against that file's certificates only (as
//! the other OpenTelemetry SDKs do), through an HTTP client or a tonic TLS configuration we
//! build and hand to the exporter. Client certificates (mutual TLS,
//! `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`/`_KEY`) are not supported.

use std::time::Duration;

use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig};

use super::TelemetryError;

/// The exporter's default timeout, as the OpenTelemetry specification sets it.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the `OTEL_EXPORTER_OTLP_*` variables say about the collector's transport security.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// The endpoint uses `https://`.
    pub secure: bool,
    /// PEM file of the certificates that alone are trusted for the collector.
    pub certificate: Option<String>,
    /// Timeout of one export request.
    pub timeout: Duration,
}

impl TlsSettings {
    /// Reads the traces-specific variables first, then the general ones.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> TlsSettings {
        let either = |specific: &str, general: &str| {
            var(specific)
                .filter(|value| !value.trim().is_empty())
                .or_else(|| var(general).filter(|value| !value.trim().is_empty()))
                .map(|value| value.trim().to_owned())
        };
        let endpoint = either(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        );
        let timeout = either(
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        )
        .and_then(|millis| millis.parse().ok())
        .map_or(DEFAULT_TIMEOUT, Duration::from_millis);
        TlsSettings {
            secure: endpoint.is_some_and(|url| url.to_ascii_lowercase().starts_with("https://")),
            certificate: either(
                "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                "OTEL_EXPORTER_OTLP_CERTIFICATE",
            ),
            timeout,
        }
    }

    /// The HTTP client for an `https://` collector with its own CA; `None` lets the exporter
    /// build its default client (system roots).
    pub fn http_client(&self) -> Result<Option<reqwest::blocking::Client>, TelemetryError> {
        let Some(path) = self.certificate.as_deref().filter(|_| self.secure) else {
            return Ok(None);
        };
        let certificates = read_certificates(path)?;
        let timeout = self.timeout;
        // A blocking client runs its own runtime: build it off any Tokio runtime's thread, as
        // the exporter does for its default client.
        let built = std::thread::spawn(move || {
            reqwest::blocking::Client::builder()
                .timeout(timeout)
                .tls_certs_only(certificates)
                .build()
        })
        .join()
        .map_err(|_| certificate_error(path, "building the HTTP client panicked"))?;
        built
            .map(Some)
            .map_err(|error| certificate_error(path, &error.to_string()))
    }

    /// The gRPC TLS configuration for an `https://` collector: its own CA, or the system's
    /// roots; `None` for a plain-text collector.
    pub fn grpc_config(&self) -> Result<Option<ClientTlsConfig>, TelemetryError> {
        if !self.secure {
            return Ok(None);
        }
        Ok(Some(match self.certificate.as_deref() {
            Some(path) => {
                read_certificates(path)?;
                let pem = read_pem(path)?;
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem))
            }
            None => ClientTlsConfig::new().with_native_roots(),
        }))
    }
}

fn read_pem(path: &str) -> Result<Vec<u8>, TelemetryError> {
    std::fs::read(path).map_err(|error| certificate_error(path, &error.to_string()))
}

/// The certificates of a PEM file; at least one.
fn read_certificates(path: &str) -> Result<Vec<reqwest::Certificate>, TelemetryError> {
    let certificates = reqwest::Certificate::from_pem_bundle(&read_pem(path)?)
        .map_err(|error| certificate_error(path, &error.to_string()))?;
    if certificates.is_empty() {
        return Err(certificate_error(path, "it holds no PEM certificate"));
    }
    Ok(certificates)
}

fn certificate_error(path: &str, reason: &str) -> TelemetryError {
    TelemetryError::Certificate {
        path: path.to_owned(),
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(pairs: &[(&str, &str)]) -> TlsSettings {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        TlsSettings::from_env(move |name| map.get(name).cloned())
    }

    #[test]
    fn https_endpoints_are_secure_and_the_traces_variables_win() {
        let plain = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")]);
        assert!(!plain.secure);
        assert_eq!(plain.certificate, None);
        assert_eq!(plain.timeout, DEFAULT_TIMEOUT);
        let secure = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "HTTPS://collector:4318",
            ),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/general.pem"),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/traces.pem"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ]);
        assert!(secure.secure);
        assert_eq!(secure.certificate.as_deref(), Some("/traces.pem"));
        assert_eq!(secure.timeout, Duration::from_millis(2500));
    }

    #[test]
    fn plain_collectors_get_no_tls_configuration() {
        let plain = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/does/not/exist.pem"),
        ]);
        assert!(plain.http_client().expect("no client").is_none());
        assert!(plain.grpc_config().expect("no config").is_none());
    }

    #[test]
    fn a_missing_or_empty_certificate_file_is_a_clear_error() {
        let empty = std::env::temp_dir().join(format!("pgkube-empty-{}.pem", std::process::id()));
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let empty_path = empty.display().to_string();
        for path in ["/does/not/exist.pem", empty_path.as_str()] {
            let secure = settings(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318"),
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", path),
            ]);
            let error = secure.http_client().expect_err("unusable file");
            assert!(error.to_string().contains(path), "{error}");
            let error = secure.grpc_config().expect_err("unusable file");
            assert!(error.to_string().contains(path), "{error}");
        }
        let _ = std::fs::remove_file(empty);
    }
}
