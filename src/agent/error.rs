//! Errors of the backup and restore agent.
//!
//! Every message is one line and names the thing that failed (a program, an object key, a
//! database). None of them carries a credential: S3 errors are reduced to the service's code and
//! message or the transport failure, PostgreSQL errors to the tool's exit status and the tail of
//! its stderr (the password reaches the tools only through their environment).

use std::path::PathBuf;

use pgkube_controllers::restore::identity::SYSTEM_IDENTIFIER_MISMATCH;
use pgkube_controllers::storage::StorageError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum AgentError {
    #[error("invalid settings: {0}")]
    Settings(String),

    #[error("cannot read {}: {source}", path.display())]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },

    #[error("{program} failed: {reason}")]
    Tool { program: String, reason: String },

    #[error("stream of {key} broke: {source}")]
    Stream { key: String, source: std::io::Error },

    #[error("S3 {operation} of {key} failed: {reason}")]
    S3 {
        operation: &'static str,
        key: String,
        reason: String,
    },

    #[error("object {key} does not match the manifest: {reason}")]
    Verification { key: String, reason: String },

    #[error("manifest {key} is unusable: {reason}")]
    Manifest { key: String, reason: String },

    #[error("the WAL archive at {root} cannot serve this backup: {reason}")]
    Archive { root: String, reason: String },

    #[error("a manifest already exists at {key}; refusing to overwrite a completed backup")]
    BackupExists { key: String },

    /// A restore that replaced an existing database failed; `note` says where the databases
    /// are now.
    #[error("{error}; {note}")]
    Replaced {
        error: Box<AgentError>,
        note: String,
    },

    #[error("the server has no database named {0}")]
    MissingDatabase(String),

    #[error("the backup has no database named {0}")]
    UnknownDatabase(String),

    #[error(
        "database(s) {} already exist; nothing was changed (use --drop-existing to replace them)",
        .0.join(", ")
    )]
    DatabasesExist(Vec<String>),

    #[error(
        "the target database has system identifier {found}, not the expected {expected}: it is \
         not the database this restore was meant for, so nothing was dropped or restored"
    )]
    SystemIdentifierMismatch { expected: String, found: String },
}

impl AgentError {
    /// The reason a controller can show for this failure, for the failures it tells apart.
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            Self::SystemIdentifierMismatch { .. } => Some(SYSTEM_IDENTIFIER_MISMATCH),
            Self::Replaced { error, .. } => error.reason(),
            _ => None,
        }
    }
}

/// The shared S3 client's errors keep the agent's wording: the same variants, the same lines.
impl From<StorageError> for AgentError {
    fn from(error: StorageError) -> Self {
        match error {
            StorageError::Settings(reason) => Self::Settings(reason),
            StorageError::ReadFile { path, source } => Self::ReadFile { path, source },
            StorageError::Manifest { key, reason } => Self::Manifest { key, reason },
            StorageError::S3 {
                operation,
                key,
                reason,
            } => Self::S3 {
                operation,
                key,
                reason,
            },
        }
    }
}
