//! `pgkube agent`: the backup and restore data path that runs inside backup and restore Jobs.
//!
//! `pgkube agent backup` dumps a whole PostgreSQL instance logically: the globals (roles,
//! tablespaces) with `pg_dumpall --globals-only`, then every non-template database that accepts
//! connections with `pg_dump -Fc`. Each dump is streamed from the child's stdout straight into an
//! S3 multipart upload (no temporary file; a bounded number of parts in memory) while its SHA-256
//! is computed. `pgkube agent restore` reads the manifest back, verifies every selected object
//! (size and SHA-256) before changing anything, then streams the objects into `psql` (globals)
//! and `pg_restore` (databases), checking them again while they stream.
//!
//! # Object layout
//!
//! ```text
//! <prefix>/<backup-name>/globals.sql                  pg_dumpall --globals-only (plain SQL)
//! <prefix>/<backup-name>/databases/<db-name>.dump     pg_dump -Fc, one per database
//! <prefix>/<backup-name>/manifest.json                written last, only if all of the above succeeded
//! ```
//!
//! `<db-name>` keeps ASCII letters, digits, `_` and `-`; every other byte of the name is written
//! as `%XX`, so any database name gives one safe key segment. A backup without `manifest.json` is
//! incomplete and must never be restored; the manifest is the single source of truth for keys,
//! sizes and checksums (see [`pgkube_controllers::storage::manifest::Manifest`]).
//!
//! # Settings
//!
//! PostgreSQL: the usual libpq variables (`PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGSSLMODE`,
//! ...) are passed to the PostgreSQL tools; `PGKUBE_PGPASSWORD_FILE` names a file holding the
//! password (a mounted Secret). Passwords never go on a command line.
//!
//! S3: `--s3-*` flags or the matching `PGKUBE_S3_*` variables (see [`storage::S3Args`]), turned
//! into the options of the project's shared S3 client ([`pgkube_controllers::storage`]). The keys
//! come from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (with `AWS_SESSION_TOKEN` for
//! temporary keys) or from the files named by `PGKUBE_S3_ACCESS_KEY_ID_FILE` /
//! `PGKUBE_S3_SECRET_ACCESS_KEY_FILE` / `PGKUBE_S3_SESSION_TOKEN_FILE`, never from flags; without
//! any key, the AWS SDK's default chain finds credentials (profile files, web identity / IRSA,
//! container credentials, instance metadata). Parts grow with the part count
//! ([`part_size::PartSizes`]) so that a dump as large as S3 allows fits in 10,000 parts.
//!
//! # Result
//!
//! Both commands print one JSON line on stdout ([`report::Report`]) and write the same line to
//! the container termination-message file (`/dev/termination-log` unless
//! `--termination-message-path` says otherwise), where the controller reads it. On failure the
//! line has `"status":"Failed"` and a one-line `message`, and the process exits non-zero.

mod backup;
mod download;
mod error;
pub mod multipart;
pub mod part_size;
mod postgres;
mod report;
mod restore;
pub mod storage;

use std::path::PathBuf;

use clap::{Args, Subcommand};
use tracing_subscriber::EnvFilter;

#[derive(Subcommand)]
pub enum AgentCommand {
    /// Back up every database of a PostgreSQL instance to S3-compatible storage.
    Backup(Box<backup::BackupArgs>),
    /// Restore databases from a backup in S3-compatible storage.
    Restore(Box<restore::RestoreArgs>),
}

/// Settings shared by backup and restore.
#[derive(Args, Debug)]
pub struct CommonArgs {
    /// Name of the backup: the key segment under the prefix that holds its objects.
    #[arg(long, env = "PGKUBE_BACKUP_NAME")]
    backup_name: String,

    /// Database the tools connect to for listing, dropping and creating databases.
    #[arg(long, env = "PGKUBE_MAINTENANCE_DATABASE", default_value = "postgres")]
    maintenance_database: String,

    /// File that receives the result line for Kubernetes (the container's terminationMessagePath).
    #[arg(
        long,
        env = "PGKUBE_TERMINATION_MESSAGE_PATH",
        default_value = "/dev/termination-log"
    )]
    termination_message_path: PathBuf,

    #[command(flatten)]
    s3: storage::S3Args,
}

/// Runs an agent command on its own Tokio runtime, prints the result line and writes the
/// termination message. The error returned on failure is the same one-line reason.
pub fn run(command: AgentCommand) -> anyhow::Result<()> {
    init_logging();
    let termination_message_path = match &command {
        AgentCommand::Backup(args) => args.common.termination_message_path.clone(),
        AgentCommand::Restore(args) => args.common.termination_message_path.clone(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(async {
        match command {
            AgentCommand::Backup(args) => backup::run(*args).await,
            AgentCommand::Restore(args) => restore::run(*args).await,
        }
    });
    let report = match &outcome {
        Ok(report) => report.clone(),
        Err(error) => report::Report::failed(error),
    };
    report.publish(&termination_message_path);
    // The message alone: it already names its causes, and a chain would print them twice.
    outcome
        .map(|_| ())
        .map_err(|error| anyhow::anyhow!(error.to_string()))
}

/// Logs go to stderr as text. `RUST_LOG` may raise our own verbosity, but the AWS SDK and HTTP
/// stack stay at `warn` whatever it says: their debug output can include signed requests.
pub(crate) fn init_logging() {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    for quiet in [
        "aws_config",
        "aws_credential_types",
        "aws_sdk_s3",
        // Web identity's AssumeRoleWithWebIdentity request carries the service account's token.
        "aws_sdk_sts",
        "aws_sigv4",
        "aws_smithy_runtime",
        "aws_smithy_runtime_api",
        "aws_smithy_http_client",
        "aws_smithy_types",
        "hyper",
        "hyper_util",
        "rustls",
        "h2",
    ] {
        if let Ok(directive) = format!("{quiet}=warn").parse() {
            filter = filter.add_directive(directive);
        }
    }
    // A second initialisation (if main ever installs a subscriber first) is harmless.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal; Kubernetes keeps stderr as plain log lines.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}
