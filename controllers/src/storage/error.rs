//! Errors of the S3 client, each one line without credentials.

use std::path::PathBuf;

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use thiserror::Error;

/// What went wrong building a client or talking to the store.
#[derive(Debug, Error)]
pub enum StorageError {
    /// The settings cannot work (a bad CA bundle, half a key pair, ...); no request was made.
    #[error("invalid settings: {0}")]
    Settings(String),

    /// A file named in the settings (key, token, CA bundle) cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },

    /// A backup manifest cannot be parsed or has a layout this version does not read.
    #[error("manifest {key} is unusable: {reason}")]
    Manifest { key: String, reason: String },

    /// A request failed, retries included; `reason` is one line (see [`s3_error`]).
    #[error("S3 {operation} of {key} failed: {reason}")]
    S3 {
        operation: &'static str,
        key: String,
        reason: String,
    },
}

/// Reduces an SDK error to one line without credentials: the service's code and message when
/// the store answered with them, the HTTP status and its usual cause when it did not (answers
/// to HEAD have no body), otherwise the transport failure (connection refused, timeout, ...).
pub fn s3_error<E>(
    operation: &'static str,
    key: &str,
    error: SdkError<E, HttpResponse>,
) -> StorageError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let reason = match &error {
        SdkError::ServiceError(service) => {
            let err = service.err();
            match (err.code(), err.message()) {
                (Some(code), Some(message)) => format!("{code}: {message}"),
                (Some(code), None) => code.to_string(),
                _ => status_reason(service.raw().status().as_u16()),
            }
        }
        _ => error_chain(&error),
    };
    StorageError::S3 {
        operation,
        key: key.to_string(),
        reason: one_line(&reason),
    }
}

/// What a bare HTTP status from an S3 store usually means.
fn status_reason(status: u16) -> String {
    let cause = match status {
        301 | 307 => "the bucket is in another region or behind another endpoint",
        400 => "bad request: check the region and the endpoint",
        401 | 403 => "access denied: check the access key, the secret key and the bucket's policy",
        404 => "not found: check the bucket name",
        500..=599 => "the store failed (retries exhausted)",
        _ => "unexpected answer",
    };
    format!("HTTP {status}, no S3 error code ({cause})")
}

/// `outer: cause: root cause`, each error's Display once (no Debug dumps).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![error.to_string()];
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !parts.iter().any(|part| part.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}

/// `text` with every run of whitespace, newlines included, made one space.
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_status_is_explained() {
        assert!(status_reason(403).contains("secret key"));
        assert!(status_reason(400).contains("check the region"));
        assert!(status_reason(503).starts_with("HTTP 503, no S3 error code"));
    }

    #[derive(Debug, Error)]
    #[error("dispatch failure")]
    struct Outer(#[source] Middle);

    #[derive(Debug, Error)]
    #[error("io error: connection reset")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn an_error_chain_names_each_cause_once() {
        let error = Outer(Middle(std::io::Error::other("connection reset")));
        assert_eq!(
            error_chain(&error),
            "dispatch failure: io error: connection reset"
        );
        assert_eq!(one_line("a\n  b\tc "), "a b c");
    }
}
