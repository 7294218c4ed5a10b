//! `pgkube agent backup`: globals and every database, streamed into S3, manifest last.
//!
//! The objects go into the backup's own directory,
//! `<prefix>/<cluster-uid>/<backup-name>/<backup-uid>/` ([`BackupKeys`]). A backup whose manifest
//! is there already is refused before anything is written, and the manifest is written only
//! where none is ([`S3Bucket::put_new_object`](pgkube_controllers::storage::S3Bucket)): a
//! completed backup is never overwritten.
//!
//! Databases are compressed as [`super::compression`] says: by default pg_dump writes no
//! compression and the agent compresses its output with multi-threaded zstd on the way to S3
//! ([`super::zstd_stream`]); the globals script is small and stays plain SQL. The manifest
//! records each object's compression ([`pgkube_controllers::storage::manifest`]).
//!
//! `--method physical` takes a base backup instead ([`super::physical`]); the directory, the
//! refusal of an existing manifest and the manifest written last are the same.

use chrono::{SecondsFormat, Utc};
use clap::Args;
use sha2::{Digest, Sha256};
use tokio::process::Command;
use tracing::{Span, debug, info, info_span, instrument};

use super::CommonArgs;
use super::compression::{CompressionArgs, Plan, ZstdSettings};
use super::error::AgentError;
use super::multipart::{MultipartUpload, PartBuffers, SentStream};
use super::physical::{self, PhysicalArgs};
use super::postgres::{Postgres, conninfo_for};
use super::progress::Progress;
use super::report::Report;
use super::storage::Store;
use super::zstd_stream;
use pgkube_controllers::storage::NewObject;
use pgkube_controllers::storage::keys::BackupKeys;
use pgkube_controllers::storage::manifest::{
    BASE_BACKUP_FORMAT, DATABASE_FORMAT, DatabaseObject, GLOBALS_FORMAT, Manifest,
    StoredCompression, StoredObject,
};

const MIB: u64 = 1024 * 1024;

#[derive(Args, Debug)]
pub struct BackupArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Name of the PostgreSQLCluster, recorded in the manifest.
    #[arg(long, env = "PGKUBE_CLUSTER")]
    cluster: String,

    /// Namespace of the PostgreSQLCluster, recorded in the manifest.
    #[arg(long, env = "PGKUBE_NAMESPACE")]
    namespace: String,

    /// Uid of the PostgreSQLCluster: names the cluster's directory under the prefix, and is
    /// recorded in the manifest.
    #[arg(long, env = "PGKUBE_CLUSTER_UID")]
    cluster_uid: String,

    /// Uid of the PostgreSQLBackup: names the backup's directory under its name (a name used
    /// again gets another directory), and is recorded in the manifest.
    #[arg(long, env = "PGKUBE_BACKUP_UID")]
    backup_uid: String,

    /// Back up only this database (repeatable). Default: every non-template database.
    #[arg(long = "database", value_name = "NAME")]
    databases: Vec<String>,

    /// Size in MiB of the first 900 multipart-upload parts of each object (S3 needs at least 5).
    /// The size doubles every 900 parts, up to S3's 5 GiB, so that objects up to S3's 5 TiB
    /// limit fit in its 10,000 parts.
    #[arg(long, env = "PGKUBE_PART_SIZE_MIB", default_value_t = 8,
          value_parser = clap::value_parser!(u64).range(5..=4096))]
    part_size_mib: u64,

    #[command(flatten)]
    compression: CompressionArgs,

    /// Parts uploaded concurrently while the next one is read; memory is about
    /// (parts-in-flight + 1) x the current part size.
    #[arg(long, env = "PGKUBE_PARTS_IN_FLIGHT", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(1..=16))]
    parts_in_flight: u64,

    /// `logical` (pg_dumpall and pg_dump) or `physical` (a base backup, see `--wal-root`).
    #[arg(long, env = "PGKUBE_BACKUP_METHOD", value_enum, default_value_t = Method::Logical)]
    method: Method,

    #[command(flatten)]
    physical: PhysicalArgs,
}

/// How the agent backs up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Method {
    Logical,
    Physical,
}

impl BackupArgs {
    /// The root span of a backup, with the backup's name, where it goes and whose it is.
    pub fn span(&self) -> Span {
        info_span!(
            "agent.backup",
            backup = %self.common.backup_name,
            cluster = %self.cluster,
            namespace = %self.namespace,
            cluster_uid = %self.cluster_uid,
            backup_uid = %self.backup_uid,
            bucket = %self.common.s3.bucket,
            prefix = %self.common.s3.prefix,
            method = ?self.method,
            otel.status_description = tracing::field::Empty,
        )
    }
}

/// Streams one tool's stdout into one object.
struct Dumper {
    store: Store,
    postgres: Postgres,
    parts_in_flight: usize,
    compression: Plan,
    /// One pool for the whole backup: every object's parts go through the same buffers.
    buffers: PartBuffers,
    progress: Progress,
}

pub async fn run(args: BackupArgs) -> Result<Report, AgentError> {
    let started_at = now();
    let compression = args.compression.plan()?;
    let keys = BackupKeys::new(
        &args.common.s3.prefix,
        &args.cluster_uid,
        &args.common.backup_name,
        &args.backup_uid,
    )?;
    let store = Store::connect(&args.common.s3, keys).await?;
    let postgres = Postgres::from_env(&args.common.maintenance_database)?;
    let manifest_key = store.keys.manifest();
    if store.object_size(&manifest_key).await?.is_some() {
        return Err(AgentError::BackupExists { key: manifest_key });
    }
    postgres
        .wait_until_accepting(args.common.server_wait())
        .await?;
    let part_size = usize::try_from(args.part_size_mib * MIB)
        .map_err(|_| AgentError::Settings("--part-size-mib is too large".into()))?;
    let parts_in_flight = usize::try_from(args.parts_in_flight).unwrap_or(1);
    let progress = Progress::new();
    let _reporting = progress.report_periodically();
    let mut manifest = match args.method {
        Method::Logical => {
            let buffers = PartBuffers::new(part_size, parts_in_flight);
            let mut dumper = Dumper {
                store: store.clone(),
                postgres,
                parts_in_flight,
                compression,
                buffers,
                progress,
            };
            logical(&args, &mut dumper, started_at).await?
        }
        Method::Physical => {
            let context = physical::Context {
                store: &store,
                postgres: &postgres,
                cluster_uid: &args.cluster_uid,
                backup_name: &args.common.backup_name,
                compression,
                parts_in_flight,
                part_size,
                progress: &progress,
            };
            let taken = physical::take(&args.physical, context).await?;
            physical_manifest(&args, taken, started_at)
        }
    };
    // Version 2 when any object is zstd, 3 for a base backup: agents that cannot read it refuse
    // it up front.
    manifest.manifest_version = manifest.required_version();
    let manifest_sha256 = write_manifest(&store, &manifest_key, &manifest).await?;
    info!(
        backup = %manifest.backup_name,
        size = manifest.total_size(),
        "backup completed"
    );
    Ok(Report {
        backup_name: Some(manifest.backup_name.clone()),
        manifest_key: Some(manifest_key),
        manifest_sha256: Some(manifest_sha256),
        size: Some(manifest.total_size()),
        database_count: Some(manifest.databases.len()),
        databases: Some(
            manifest
                .databases
                .iter()
                .map(|db| db.name.clone())
                .collect(),
        ),
        postgresql_version: Some(manifest.postgresql_version),
        started_at: Some(manifest.started_at),
        finished_at: Some(manifest.finished_at),
        ..Report::completed()
    })
}

/// The manifest of a base backup, still to be written.
fn physical_manifest(args: &BackupArgs, taken: physical::Taken, started_at: String) -> Manifest {
    Manifest {
        manifest_version: 0,
        cluster: args.cluster.clone(),
        namespace: args.namespace.clone(),
        cluster_uid: Some(args.cluster_uid.clone()),
        system_identifier: Some(taken.system_identifier),
        backup_name: args.common.backup_name.clone(),
        backup_uid: Some(args.backup_uid.clone()),
        postgresql_version: taken.postgresql_version,
        started_at,
        finished_at: now(),
        format: BASE_BACKUP_FORMAT.into(),
        globals: None,
        databases: Vec::new(),
        physical: Some(taken.physical),
    }
}

/// The globals and every database, dumped; the manifest that lists them, still to be written.
async fn logical(
    args: &BackupArgs,
    dumper: &mut Dumper,
    started_at: String,
) -> Result<Manifest, AgentError> {
    let postgres = &dumper.postgres;
    let postgresql_version = postgres.server_version().await?;
    let system_identifier = postgres.system_identifier().await?;
    let databases = select_databases(postgres.list_databases().await?, &args.databases)?;
    info!(
        backup = %args.common.backup_name,
        databases = databases.len(),
        %postgresql_version,
        compression = ?dumper.compression,
        "starting backup"
    );
    // An estimate only: a failure to size the databases does not fail the backup.
    let estimate = postgres.databases_size(&databases).await.ok();
    dumper.progress.set_database_count(databases.len());
    dumper.progress.start_step("Dumping", estimate, true);
    let globals = dumper.dump_globals().await?;
    let mut dumped = Vec::with_capacity(databases.len());
    for database in &databases {
        dumper.progress.start_database(database);
        dumped.push(dumper.dump_database(database).await?);
        dumper.progress.finish_database();
    }
    debug!(part_buffers = dumper.buffers.allocated(), "dumps stored");
    Ok(Manifest {
        manifest_version: 0,
        cluster: args.cluster.clone(),
        namespace: args.namespace.clone(),
        cluster_uid: Some(args.cluster_uid.clone()),
        system_identifier: Some(system_identifier),
        backup_name: args.common.backup_name.clone(),
        backup_uid: Some(args.backup_uid.clone()),
        postgresql_version,
        started_at,
        finished_at: now(),
        format: DATABASE_FORMAT.into(),
        globals: Some(globals),
        databases: dumped,
        physical: None,
    })
}

impl Dumper {
    #[instrument(name = "globals", skip_all)]
    async fn dump_globals(&mut self) -> Result<StoredObject, AgentError> {
        let mut command = self.postgres.command("pg_dumpall");
        command
            .args(["--globals-only", "--no-password", "--dbname"])
            .arg(conninfo_for(self.postgres.maintenance_database()));
        let key = self.store.keys.globals();
        info!(%key, "dumping globals");
        self.stream_to_object("pg_dumpall", command, &key, GLOBALS_FORMAT, None)
            .await
    }

    #[instrument(name = "database", skip(self))]
    async fn dump_database(&mut self, database: &str) -> Result<DatabaseObject, AgentError> {
        let mut command = self.postgres.command("pg_dump");
        command.args(["--format=custom", "--no-password"]);
        if let Some(level) = self.compression.pg_dump_compress() {
            // A bare level means gzip at that level (0: none) in every pg_dump from 14 to 18.
            command.arg(format!("--compress={level}"));
        }
        command.arg("--dbname").arg(conninfo_for(database));
        let key = self.store.keys.database(database);
        info!(%database, %key, "dumping database");
        let object = self
            .stream_to_object(
                "pg_dump",
                command,
                &key,
                DATABASE_FORMAT,
                self.compression.zstd(),
            )
            .await?;
        info!(%database, size = object.size, "database stored");
        Ok(DatabaseObject {
            name: database.to_string(),
            object,
        })
    }

    /// Runs the tool and uploads its stdout, compressed with zstd when `zstd` says so. The
    /// upload is completed only after the tool exited successfully (a dump killed mid-stream
    /// ends its output like a finished one); on any error the upload is aborted and the tool, if
    /// still running, is killed.
    async fn stream_to_object(
        &mut self,
        program: &str,
        mut command: Command,
        key: &str,
        format: &str,
        zstd: Option<ZstdSettings>,
    ) -> Result<StoredObject, AgentError> {
        let upload = MultipartUpload::create(&self.store, key, self.parts_in_flight).await?;
        let postgres = &self.postgres;
        let buffers = &mut self.buffers;
        let progress = &self.progress;
        let sent = async {
            command.stdout(std::process::Stdio::piped());
            let mut tool = postgres.spawn(program, command)?;
            let stdout = tool.child.stdout.take().ok_or_else(|| AgentError::Tool {
                program: program.to_string(),
                reason: "its stdout is not captured".into(),
            })?;
            let sent = match zstd {
                Some(settings) => {
                    send_compressed(&upload, stdout, settings, buffers, progress, key).await?
                }
                None => upload.send(&mut progress.counting(stdout), buffers).await?,
            };
            tool.finish().await?;
            Ok(sent)
        }
        .await;
        let sent = match sent {
            Ok(sent) => sent,
            Err(error) => {
                upload.abort().await;
                return Err(error);
            }
        };
        let (size, sha256) = upload.complete(sent).await?;
        let compression = if zstd.is_some() {
            StoredCompression::Zstd
        } else {
            StoredCompression::None
        };
        Ok(StoredObject {
            key: key.to_string(),
            size,
            sha256,
            format: format.to_string(),
            compression: Some(compression),
        })
    }
}

/// Uploads `stdout` compressed with zstd on its own threads. A compression that failed (reading
/// the pipe, or libzstd) fails the object even though its output ended like a finished one.
///
/// If the upload fails, the compressing thread is not waited for: it ends by itself once the
/// caller has killed the tool (its pipe ends) or at its next write (its output is gone).
async fn send_compressed(
    upload: &MultipartUpload,
    stdout: tokio::process::ChildStdout,
    settings: ZstdSettings,
    buffers: &mut PartBuffers,
    progress: &Progress,
    key: &str,
) -> Result<SentStream, AgentError> {
    let stream_error = |source| AgentError::Stream {
        key: key.to_string(),
        source,
    };
    let input = std::fs::File::from(stdout.into_owned_fd().map_err(stream_error)?);
    let mut compressor = zstd_stream::compress(progress.counting(input), settings);
    let sent = upload.send(&mut compressor.output, buffers).await?;
    let dumped = compressor.finish().await.map_err(stream_error)?;
    debug!(%key, dumped, stored = sent.size, "compressed with zstd");
    Ok(sent)
}

/// Every dumpable database, or the requested ones if they all exist.
fn select_databases(
    available: Vec<String>,
    requested: &[String],
) -> Result<Vec<String>, AgentError> {
    if requested.is_empty() {
        return Ok(available);
    }
    if let Some(missing) = requested.iter().find(|name| !available.contains(name)) {
        return Err(AgentError::MissingDatabase(missing.clone()));
    }
    let mut selected = requested.to_vec();
    selected.sort();
    selected.dedup();
    Ok(selected)
}

/// Uploads the manifest, with each object's compression, where no object is, and returns the
/// SHA-256 of its bytes. A manifest that appeared meanwhile is left as it is: the backup fails.
#[instrument(name = "manifest", skip_all, fields(%key))]
async fn write_manifest(
    store: &Store,
    key: &str,
    manifest: &Manifest,
) -> Result<String, AgentError> {
    let bytes = serde_json::to_vec_pretty(manifest).map_err(|error| AgentError::Manifest {
        key: key.to_string(),
        reason: error.to_string(),
    })?;
    let sha256 = hex::encode(Sha256::digest(&bytes));
    match store
        .s3
        .put_new_object(key, bytes, "application/json")
        .await?
    {
        NewObject::Written => Ok(sha256),
        NewObject::AlreadyExists => Err(AgentError::BackupExists {
            key: key.to_string(),
        }),
    }
}

fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn without_a_selection_every_database_is_backed_up() {
        let selected = select_databases(names(&["app", "postgres"]), &[]).expect("selected");
        assert_eq!(selected, names(&["app", "postgres"]));
    }

    #[test]
    fn a_selection_is_deduplicated_and_must_exist() {
        let available = names(&["app", "postgres", "shop"]);
        let selected =
            select_databases(available.clone(), &names(&["shop", "app", "shop"])).expect("ok");
        assert_eq!(selected, names(&["app", "shop"]));
        let error = select_databases(available, &names(&["app", "gone"])).expect_err("missing");
        assert_eq!(error.to_string(), "the server has no database named gone");
    }
}
