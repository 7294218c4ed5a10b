//! `pgkube agent`: the backup and restore data path that runs inside backup and restore Jobs.
//!
//! `pgkube agent backup --method physical` takes a base backup of the instance with
//! `pg_basebackup`, streamed as one zstd tar, and records it once the WAL it needs is archived
//! ([`physical`]). By default, `pgkube agent backup` dumps a whole PostgreSQL instance logically: the globals (roles,
//! tablespaces) with `pg_dumpall --globals-only`, then every non-template database that accepts
//! connections with `pg_dump -Fc`. Each dump is streamed from the child's stdout straight into an
//! S3 multipart upload (no temporary file; a bounded number of parts in memory) while its SHA-256
//! is computed. By default pg_dump does not compress and the agent compresses each database's
//! stream with multi-threaded zstd on the way ([`compression`], [`zstd_stream`]).
//! `pgkube agent restore` reads the manifest back, verifies every selected object (size and
//! SHA-256 of the stored bytes, and that a zstd object decompresses) before changing anything,
//! then streams the objects into `psql` (globals) and `pg_restore` (databases), decompressing
//! and checking them again while they stream. A database it replaces (`--drop-existing`) is
//! set aside until its restore completed, and put back if it fails ([`replace`]).
//!
//! # Object layout
//!
//! Each backup has a directory of its own, `<dir>` = `<prefix>/<cluster-uid>/<backup-name>/<backup-uid>`
//! (`--cluster-uid`, `--backup-uid`; built by [`pgkube_controllers::storage::keys`]):
//!
//! ```text
//! <dir>/globals.sql                  pg_dumpall --globals-only (plain SQL)
//! <dir>/databases/<db-name>.dump     pg_dump -Fc, one per database (zstd by default)
//! <dir>/manifest.json                written last, only if all of the above succeeded, only where none is
//! ```
//!
//! Backups stored before the uids named the directory are under `<prefix>/<backup-name>/`;
//! `agent restore` reads them (and any backup, at `--manifest-key`). `<db-name>` keeps ASCII letters, digits, `_` and `-`; every other byte of the name is written
//! as `%XX`, so any database name gives one safe key segment. A backup without `manifest.json` is
//! incomplete and must never be restored; the manifest is the single source of truth for keys,
//! sizes, checksums and each object's compression (see
//! [`pgkube_controllers::storage::manifest::Manifest`]: version 2 when any object is zstd).
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
//! # Traces
//!
//! Logs go to stderr as text. When the standard `OTEL_*` variables ask for it (the backup
//! controller gives a Job the manager's own), the agent exports its spans by OTLP, as the
//! manager does ([`crate::telemetry`]): a root span `agent.backup` or `agent.restore` (backup
//! name, bucket, prefix; cluster and namespace for a backup; error status and message on
//! failure) with a child span per step (globals, each database, the manifest; for a restore,
//! the verification too). Its parent is the reconcile's span that `TRACEPARENT` names (W3C
//! trace context, set by the controller on the Job), so the agent's spans are part of the
//! reconcile's trace; without it they start a new trace. Spans are flushed before the process
//! exits, success or failure, waiting at most [`crate::telemetry::FLUSH_TIMEOUT`].
//!
//! # Result
//!
//! Both commands print one JSON line on stdout ([`report::Report`]) and write the same line to
//! the container termination-message file (`/dev/termination-log` unless
//! `--termination-message-path` says otherwise), where the controller reads it. On failure the
//! line has `"status":"Failed"` and a one-line `message`, and the process exits non-zero.

mod backup;
pub mod compression;
mod download;
mod error;
mod globals;
pub mod multipart;
pub mod part_size;
mod physical;
mod postgres;
pub mod progress;
mod replace;
mod report;
mod restore;
pub mod storage;
mod tar_scan;
mod target;
mod transient;
mod wal_range;
pub mod zstd_stream;

use std::path::PathBuf;

use clap::{Args, Subcommand};
use tracing::{Instrument, Span, warn};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;

use crate::telemetry::{self, LogOutput, Telemetry};

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

    /// How long to wait for the server to accept connections before giving up, in seconds
    /// (it may be restarting, or its Service not resolving yet, when the Job starts).
    #[arg(long, env = "PGKUBE_SERVER_WAIT_SECONDS", default_value_t = 120)]
    server_wait_seconds: u64,

    #[command(flatten)]
    s3: storage::S3Args,
}

impl CommonArgs {
    fn server_wait(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.server_wait_seconds)
    }
}

/// The service name of the agent's spans, unless `OTEL_SERVICE_NAME` says otherwise.
const SERVICE_NAME: &str = "pgkube-agent";

/// Runs an agent command on its own Tokio runtime, prints the result line and writes the
/// termination message. The error returned on failure is the same one-line reason.
///
/// The command runs inside one root span (`agent.backup` or `agent.restore`) whose parent is the
/// reconcile named by `TRACEPARENT` (and `TRACESTATE`), or none (a new trace). Spans are
/// exported when the `OTEL_*` variables ask for it, and flushed before returning, success or
/// failure, within [`telemetry::FLUSH_TIMEOUT`].
pub fn run(command: AgentCommand) -> anyhow::Result<()> {
    let termination_message_path = match &command {
        AgentCommand::Backup(args) => args.common.termination_message_path.clone(),
        AgentCommand::Restore(args) => args.common.termination_message_path.clone(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let telemetry = {
        // The gRPC trace exporter spawns its connection onto the current runtime.
        let _entered = runtime.enter();
        init_telemetry()
    };
    let span = root_span(&command);
    let outcome = runtime.block_on(
        async {
            match command {
                AgentCommand::Backup(args) => backup::run(*args).await,
                AgentCommand::Restore(args) => restore::run(*args).await,
            }
        }
        .instrument(span.clone()),
    );
    let report = match &outcome {
        Ok(report) => report.clone(),
        Err(error) => {
            // tracing-opentelemetry makes this the span's error status and its message.
            span.record("otel.status_description", error.to_string());
            report::Report::failed(error)
        }
    };
    // Closing the root span hands it to the exporter, which the shutdown below flushes while
    // the runtime (and with it a gRPC exporter's connection) still runs.
    drop(span);
    report.publish(&termination_message_path);
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    // The message alone: it already names its causes, and a chain would print them twice.
    outcome
        .map(|_| ())
        .map_err(|error| anyhow::anyhow!(error.to_string()))
}

/// The command's root span, child of the reconcile's span when `TRACEPARENT` names one.
fn root_span(command: &AgentCommand) -> Span {
    let span = match command {
        AgentCommand::Backup(args) => args.span(),
        AgentCommand::Restore(args) => args.span(),
    };
    let variable = |name: &str| std::env::var(name).ok();
    let traceparent = variable("TRACEPARENT");
    match telemetry::remote_parent(traceparent.as_deref(), variable("TRACESTATE").as_deref()) {
        Some(parent) => {
            if let Err(error) = span.set_parent(parent) {
                warn!(%error, "cannot join the trace of TRACEPARENT");
            }
        }
        None if traceparent.is_some() => {
            warn!("TRACEPARENT is not a valid W3C traceparent: starting a new trace");
        }
        None => {}
    }
    span
}

/// Logs on stderr as text and, when the `OTEL_*` variables ask for it, span export. A backup
/// does not depend on its telemetry: an exporter that cannot be set up is a warning, and the
/// agent runs without it.
fn init_telemetry() -> Option<Telemetry> {
    let exporter = telemetry::tracer_provider_from_env(SERVICE_NAME);
    let (provider, problem) = match exporter {
        Ok(provider) => (provider, None),
        Err(error) => (None, Some(error)),
    };
    let installed = telemetry::install(LogOutput::TextStderr, log_filter(), provider, SERVICE_NAME);
    if let Some(error) = problem {
        warn!("traces are not exported: {error}");
    }
    installed.ok()
}

/// Logs go to stderr as text, for the agent and the instance manager. `RUST_LOG` may raise our
/// own verbosity (an invalid one means `info`), but the AWS SDK and HTTP stack stay at `warn`
/// whatever it says: their debug output can include signed requests.
pub(crate) fn init_logging() {
    // A second initialisation (if main ever installs a subscriber first) is harmless.
    let _ = telemetry::install(LogOutput::TextStderr, log_filter(), None, SERVICE_NAME);
}

/// `RUST_LOG` (`info` when absent or invalid) with [`telemetry::SECRET_SAFE_DIRECTIVES`].
fn log_filter() -> EnvFilter {
    let wanted = std::env::var("RUST_LOG").unwrap_or_default();
    let wanted = if wanted.trim().is_empty() {
        "info"
    } else {
        wanted.as_str()
    };
    telemetry::log_filter(wanted)
        .or_else(|_| telemetry::log_filter("info"))
        // Lenient parsing never fails; it is only reached if the fixed directives were wrong.
        .unwrap_or_else(|_| {
            EnvFilter::new(format!(
                "info,{}",
                telemetry::SECRET_SAFE_DIRECTIVES.join(",")
            ))
        })
}
