//! The result line: printed on stdout and written to the termination-message file.
//!
//! Kubernetes keeps at most 4096 bytes of a termination message, so the line is kept under that:
//! the list of database names is dropped (the count stays) and a failure message is shortened
//! when needed. The full details of a backup are in its manifest.

use std::path::Path;

use serde::Serialize;
use tracing::warn;

use super::error::AgentError;

/// Kubernetes truncates termination messages beyond this.
const TERMINATION_MESSAGE_LIMIT: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Status {
    Completed,
    Failed,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub status: Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A failure's reason, for the failures a controller tells apart (see
    /// [`AgentError::reason`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backup_name: Option<String>,
    /// Key of the manifest: the backup's object key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest_key: Option<String>,
    /// SHA-256 of the manifest's bytes (each object's own checksum is in the manifest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest_sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postgresql_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Bytes stored (backup) or read back (restore), all objects together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database_count: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub databases: Option<Vec<String>>,
}

impl Report {
    pub fn completed() -> Self {
        Self {
            status: Status::Completed,
            message: None,
            reason: None,
            backup_name: None,
            manifest_key: None,
            manifest_sha256: None,
            postgresql_version: None,
            started_at: None,
            finished_at: None,
            size: None,
            database_count: None,
            databases: None,
        }
    }

    pub fn failed(error: &AgentError) -> Self {
        Self {
            status: Status::Failed,
            message: Some(error.to_string()),
            reason: error.reason(),
            ..Self::completed()
        }
    }

    /// Prints the line on stdout and writes it to `termination_message_path`; a file that
    /// cannot be written (not running in Kubernetes) is a warning only.
    pub fn publish(&self, termination_message_path: &Path) {
        let line = self.to_line();
        println!("{line}");
        if let Err(error) = std::fs::write(termination_message_path, &line) {
            warn!(
                "could not write the termination message to {}: {error}",
                termination_message_path.display()
            );
        }
    }

    /// One JSON line that fits in a termination message.
    pub fn to_line(&self) -> String {
        let mut report = self.clone();
        let mut line = report.serialize();
        if line.len() > TERMINATION_MESSAGE_LIMIT && report.databases.take().is_some() {
            line = report.serialize();
        }
        while line.len() > TERMINATION_MESSAGE_LIMIT {
            let Some(message) = report.message.as_mut() else {
                break;
            };
            let keep = floor_char_boundary(
                message,
                message
                    .len()
                    .saturating_sub(line.len() - TERMINATION_MESSAGE_LIMIT + 3),
            );
            message.truncate(keep);
            message.push_str("...");
            line = report.serialize();
        }
        line
    }

    fn serialize(&self) -> String {
        // Serialising plain strings and numbers cannot fail; the fallback keeps the line valid.
        serde_json::to_string(self)
            .unwrap_or_else(|_| r#"{"status":"Failed","message":"unserialisable report"}"#.into())
    }
}

fn floor_char_boundary(text: &str, index: usize) -> usize {
    let mut index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_one_line_with_status_and_message() {
        let report = Report::failed(&AgentError::UnknownDatabase("shop".into()));
        let line = report.to_line();
        assert!(!line.contains('\n'));
        let value: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        assert_eq!(value["status"], "Failed");
        assert_eq!(value["message"], "the backup has no database named shop");
        assert!(value.get("reason").is_none(), "{line}");
    }

    #[test]
    fn a_target_of_another_database_gives_its_reason() {
        let error = AgentError::SystemIdentifierMismatch {
            expected: "7312345678901234567".into(),
            found: "7400000000000000001".into(),
        };
        let line = Report::failed(&error).to_line();
        let value: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        assert_eq!(value["reason"], "SystemIdentifierMismatch");
        assert_eq!(value["message"], error.to_string());
    }

    #[test]
    fn a_long_database_list_is_dropped_to_fit_the_termination_message() {
        let mut report = Report::completed();
        report.database_count = Some(1000);
        report.databases = Some((0..1000).map(|i| format!("database_{i}")).collect());
        let line = report.to_line();
        assert!(line.len() <= TERMINATION_MESSAGE_LIMIT, "{}", line.len());
        let value: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        assert_eq!(value["databaseCount"], 1000);
        assert!(value.get("databases").is_none());
    }

    #[test]
    fn a_long_failure_message_is_shortened_to_fit() {
        let report = Report::failed(&AgentError::Settings("é".repeat(5000)));
        let line = report.to_line();
        assert!(line.len() <= TERMINATION_MESSAGE_LIMIT, "{}", line.len());
        let value: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        assert!(
            value["message"]
                .as_str()
                .is_some_and(|m| m.ends_with("..."))
        );
    }
}
