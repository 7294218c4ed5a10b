//! `pgkube agent backup --method physical`: a base backup of the whole instance, streamed into
//! S3 as one zstd tar, and recorded only once the WAL it needs is in the archive.
//!
//! 1. The archive at `--wal-root` must be this cluster's (its owner record names the system
//!    identifier the primary reports and this cluster's uid): a base backup is useless without
//!    its WAL, and WAL of another database would be worse.
//! 2. `pg_basebackup -D - -Ft -X none --checkpoint=fast --manifest-checksums=SHA256` reads the
//!    data directory from `--source-host` (a standby's stable host name, or the primary's
//!    Service) as the replication role. Its stdout goes through zstd into one multipart upload,
//!    `base.tar.zst`, and nothing is staged on disk: memory is the upload's part buffers and
//!    zstd's, whatever the size of the database. On the way, its `backup_label`,
//!    `tablespace_map` and `backup_manifest` are read out of the tar ([`super::tar_scan`]) and
//!    stored as objects of their own.
//! 3. The WAL ranges in `backup_manifest` say which segments a restore replays
//!    ([`super::wal_range`]). The agent waits (`--wal-wait-seconds`) until each is in the
//!    archive, asking the primary to switch to a new WAL file (`pg_switch_wal()`) every 30 s so
//!    that the last one is finished and archived without waiting for `archive_timeout`.
//! 4. The manifest (version 3, see [`pgkube_controllers::storage::manifest::PhysicalBackup`])
//!    is written last, only where none is.
//!
//! The superuser's connection (`PGHOST`, the primary) serves the checks, the version and
//! `pg_switch_wal()`; the base backup itself uses a replication connection, which `pg_hba.conf`
//! allows only to the replication role.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use clap::Args;
use sha2::{Digest, Sha256};
use tracing::{info, instrument, warn};

use super::compression::{DEFAULT_ZSTD_LEVEL, Plan, ZstdSettings, container_cpus};
use super::error::AgentError;
use super::multipart::{MultipartUpload, PartBuffers, SentStream};
use super::postgres::{Postgres, RunningTool};
use super::progress::Progress;
use super::storage::{Store, secret_from_env_or_file};
use super::tar_scan::{TarScanner, TarTap};
use super::wal_range::{self, Lsn, WalRange};
use super::zstd_stream;
use pgkube_controllers::storage::NewObject;
use pgkube_controllers::storage::manifest::{
    BACKUP_LABEL_FORMAT, BACKUP_MANIFEST_FORMAT, BASE_BACKUP_FORMAT, PhysicalBackup,
    StoredCompression, StoredObject, TABLESPACE_MAP_FORMAT,
};
use pgkube_controllers::storage::wal::{self, WalFileName};

const BACKUP_LABEL: &str = "backup_label";
const TABLESPACE_MAP: &str = "tablespace_map";
const BACKUP_MANIFEST: &str = "backup_manifest";
/// The files read out of the tar.
const KEPT: &[&str] = &[BACKUP_LABEL, TABLESPACE_MAP, BACKUP_MANIFEST];
/// The most a kept file may hold. `backup_manifest` has a line of about 150 bytes per file of
/// the data directory: 256 MiB is well over a million files.
const KEPT_LIMIT: usize = 256 * 1024 * 1024;
/// How often the primary is asked to switch WAL files while the agent waits for the last one.
const SWITCH_EVERY: Duration = Duration::from_secs(30);
/// How often the archive is looked at while waiting.
const POLL_EVERY: Duration = Duration::from_secs(2);

/// Settings of physical backups (`--method physical`).
#[derive(Args, Debug)]
pub struct PhysicalArgs {
    /// The host `pg_basebackup` reads from: a standby's stable host name, or the primary's
    /// Service. Unset: `PGHOST`.
    #[arg(long, env = "PGKUBE_SOURCE_HOST")]
    source_host: Option<String>,

    /// The pod the backup is read from, recorded in the manifest.
    #[arg(long, env = "PGKUBE_SOURCE_POD", default_value = "")]
    source_pod: String,

    /// The source is a standby (recorded in the manifest).
    #[arg(long, env = "PGKUBE_FROM_STANDBY")]
    from_standby: bool,

    /// The role of the replication connection (its password: `PGKUBE_REPLICATION_PASSWORD`, or
    /// the file `PGKUBE_REPLICATION_PASSWORD_FILE` names). Unset: `PGUSER` and its password.
    #[arg(long, env = "PGKUBE_REPLICATION_USER")]
    replication_user: Option<String>,

    /// The root of the cluster's WAL archive in the bucket (`<prefix>/wal/<cluster>/`).
    #[arg(long, env = "PGKUBE_WAL_ROOT")]
    wal_root: Option<String>,

    /// How long to wait for the backup's WAL to be archived before failing, in seconds.
    #[arg(long, env = "PGKUBE_WAL_WAIT_SECONDS", default_value_t = 600)]
    wal_wait_seconds: u64,
}

/// What the backup's run knows of its cluster.
pub struct Context<'a> {
    pub store: &'a Store,
    pub postgres: &'a Postgres,
    pub cluster_uid: &'a str,
    pub backup_name: &'a str,
    pub compression: Plan,
    pub parts_in_flight: usize,
    /// The size of the first parts of the upload (see [`PartBuffers`]).
    pub part_size: usize,
    pub progress: &'a Progress,
}

/// The base backup as stored, and the system it was taken from.
pub struct Taken {
    pub physical: PhysicalBackup,
    pub system_identifier: String,
    pub postgresql_version: String,
}

/// Takes the base backup and waits for its WAL: everything but the manifest.
pub async fn take(args: &PhysicalArgs, context: Context<'_>) -> Result<Taken, AgentError> {
    let wal_root = args
        .wal_root
        .clone()
        .filter(|root| !root.is_empty())
        .ok_or_else(|| {
            AgentError::Settings("a physical backup needs --wal-root (PGKUBE_WAL_ROOT)".into())
        })?;
    let postgres = context.postgres;
    let postgresql_version = postgres.server_version().await?;
    let system_identifier = postgres.system_identifier().await?;
    let segment_size = wal_segment_size(postgres).await?;
    check_archive(
        context.store,
        &wal_root,
        &system_identifier,
        context.cluster_uid,
    )
    .await?;
    let zstd = zstd_settings(context.compression);
    info!(source = %args.source_pod, from_standby = args.from_standby, %postgresql_version,
          ?zstd, "starting base backup");

    let command = base_backup_command(args, postgres, context.backup_name)?;
    // An estimate only: a failure to size the instance does not fail the backup.
    let estimate = postgres.databases_size(&[]).await.ok();
    context.progress.start_step("Streaming", estimate, true);
    let (base, mut kept) = stream_base(&context, command, zstd).await?;
    let manifest_bytes = kept
        .remove(BACKUP_MANIFEST)
        .ok_or_else(|| missing(BACKUP_MANIFEST))?;
    let label = kept
        .remove(BACKUP_LABEL)
        .ok_or_else(|| missing(BACKUP_LABEL))?;
    let ranges =
        wal_range::ranges_of_manifest(&manifest_bytes).map_err(|reason| AgentError::Tool {
            program: "pg_basebackup".into(),
            reason,
        })?;
    let store = context.store;
    let backup_label = put_file(store, BACKUP_LABEL, label, BACKUP_LABEL_FORMAT).await?;
    let tablespace_map = match kept.remove(TABLESPACE_MAP) {
        Some(map) => Some(put_file(store, TABLESPACE_MAP, map, TABLESPACE_MAP_FORMAT).await?),
        None => None,
    };
    let backup_manifest = put_file(
        store,
        BACKUP_MANIFEST,
        manifest_bytes,
        BACKUP_MANIFEST_FORMAT,
    )
    .await?;

    let segments = wal_range::needed_segments(&ranges, segment_size);
    let wait = Duration::from_secs(args.wal_wait_seconds);
    context.progress.start_step("WaitingForWal", None, false);
    wait_for_wal(store, &wal_root, &segments, postgres, wait).await?;
    let (first, last) = bounds(&ranges);
    Ok(Taken {
        physical: PhysicalBackup {
            start_lsn: first.start.to_string(),
            start_timeline: first.timeline,
            stop_lsn: last.end.to_string(),
            stop_timeline: last.timeline,
            source: args.source_pod.clone(),
            from_standby: args.from_standby,
            wal_root,
            first_wal: segments.first().cloned().unwrap_or_default(),
            last_wal: segments.last().cloned().unwrap_or_default(),
            base,
            backup_label,
            tablespace_map,
            backup_manifest,
        },
        system_identifier,
        postgresql_version,
    })
}

fn missing(name: &str) -> AgentError {
    AgentError::Tool {
        program: "pg_basebackup".into(),
        reason: format!("its tar has no {name}"),
    }
}

/// The oldest and the newest range (the list is never empty: see `ranges_of_manifest`).
fn bounds(ranges: &[WalRange]) -> (WalRange, WalRange) {
    let fallback = WalRange {
        timeline: 0,
        start: Lsn(0),
        end: Lsn(0),
    };
    let first = ranges.first().copied().unwrap_or(fallback);
    let last = ranges
        .iter()
        .copied()
        .max_by_key(|range| range.end)
        .unwrap_or(first);
    (first, last)
}

/// zstd always: the cluster's level when its compression is zstd, else the default level.
fn zstd_settings(plan: Plan) -> ZstdSettings {
    plan.zstd().unwrap_or(ZstdSettings {
        level: DEFAULT_ZSTD_LEVEL,
        workers: container_cpus(),
    })
}

/// `wal_segment_size` in bytes (fixed at initdb; 16 MiB unless chosen otherwise).
async fn wal_segment_size(postgres: &Postgres) -> Result<u64, AgentError> {
    let output = postgres
        .query(
            postgres.maintenance_database(),
            "SELECT setting FROM pg_settings WHERE name = 'wal_segment_size'",
        )
        .await?;
    output
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|size| size.is_power_of_two() && *size >= 1024 * 1024)
        .ok_or_else(|| AgentError::Tool {
            program: "psql".into(),
            reason: format!("unexpected wal_segment_size {:?}", output.trim()),
        })
}

/// The archive must have been claimed by this database of this cluster.
async fn check_archive(
    store: &Store,
    root: &str,
    system_identifier: &str,
    cluster_uid: &str,
) -> Result<(), AgentError> {
    let owner = wal::owner(&store.s3, root)
        .await
        .map_err(|error| archive_error(root, error.to_string()))?;
    let Some(owner) = owner else {
        return Err(archive_error(
            root,
            format!(
                "it has no owner record ({}) yet: WAL archiving has not stored a file",
                wal::MARKER
            ),
        ));
    };
    if owner.system_identifier != system_identifier || owner.cluster_uid != cluster_uid {
        return Err(archive_error(
            root,
            format!(
                "it holds the WAL of system {} of cluster uid {}, not of system \
                 {system_identifier} of cluster uid {cluster_uid}",
                owner.system_identifier, owner.cluster_uid
            ),
        ));
    }
    Ok(())
}

fn archive_error(root: &str, reason: String) -> AgentError {
    AgentError::Archive {
        root: root.to_owned(),
        reason,
    }
}

/// `pg_basebackup` writing a tar to stdout, over a replication connection to the source.
fn base_backup_command(
    args: &PhysicalArgs,
    postgres: &Postgres,
    backup_name: &str,
) -> Result<tokio::process::Command, AgentError> {
    let mut command = postgres.command("pg_basebackup");
    command
        .args(["--pgdata=-", "--format=tar", "--wal-method=none"])
        .args(["--checkpoint=fast", "--manifest-checksums=SHA256"])
        .args(["--no-password", "--verbose"])
        .arg(format!("--label=pgkube {backup_name}"));
    if let Some(host) = args.source_host.as_deref().filter(|host| !host.is_empty()) {
        command.env("PGHOST", host);
    }
    if let Some(user) = args
        .replication_user
        .as_deref()
        .filter(|user| !user.is_empty())
    {
        command.env("PGUSER", user);
        let password = secret_from_env_or_file(
            "PGKUBE_REPLICATION_PASSWORD",
            "PGKUBE_REPLICATION_PASSWORD_FILE",
        )?;
        match password {
            Some(password) => command.env("PGPASSWORD", password),
            None => command.env_remove("PGPASSWORD"),
        };
        if let Some(tls) = postgres.client_tls(crate::tls::ClientRole::Replication) {
            command.envs(tls.env());
        }
    }
    Ok(command)
}

/// Runs `pg_basebackup` and uploads its tar through zstd, keeping the files [`KEPT`] names.
/// The upload is completed only once the tool exited successfully and the tar was whole; on any
/// error it is aborted, and the tool killed if still running.
#[instrument(name = "base", skip_all)]
async fn stream_base(
    context: &Context<'_>,
    command: tokio::process::Command,
    zstd: ZstdSettings,
) -> Result<(StoredObject, BTreeMap<&'static str, Vec<u8>>), AgentError> {
    let key = context.store.keys.base();
    let upload = MultipartUpload::create(context.store, &key, context.parts_in_flight).await?;
    let scanner = Arc::new(Mutex::new(TarScanner::new(KEPT, KEPT_LIMIT)));
    let mut buffers = PartBuffers::new(context.part_size, context.parts_in_flight);
    let sent = send_base(context, command, &upload, &scanner, zstd, &mut buffers).await;
    let kept = sent.and_then(|sent| {
        // The tap that fed the scanner went with the compressing thread; take what it kept.
        let scanner = std::mem::replace(
            &mut *scanner.lock().unwrap_or_else(PoisonError::into_inner),
            TarScanner::new(KEPT, 0),
        );
        let kept = scanner.finish().map_err(|reason| AgentError::Tool {
            program: "pg_basebackup".into(),
            reason: format!("its output is not a whole tar: {reason}"),
        })?;
        Ok((sent, kept))
    });
    let (sent, kept) = match kept {
        Ok(done) => done,
        Err(error) => {
            upload.abort().await;
            return Err(error);
        }
    };
    let (size, sha256) = upload.complete(sent).await?;
    info!(%key, size, "base backup stored");
    let object = StoredObject {
        key,
        size,
        sha256,
        format: BASE_BACKUP_FORMAT.into(),
        compression: Some(StoredCompression::Zstd),
    };
    Ok((object, kept))
}

async fn send_base(
    context: &Context<'_>,
    mut command: tokio::process::Command,
    upload: &MultipartUpload,
    scanner: &Arc<Mutex<TarScanner>>,
    zstd: ZstdSettings,
    buffers: &mut PartBuffers,
) -> Result<SentStream, AgentError> {
    let stream_error = |source| AgentError::Stream {
        key: context.store.keys.base(),
        source,
    };
    command.stdout(std::process::Stdio::piped());
    let mut tool: RunningTool = context.postgres.spawn("pg_basebackup", command)?;
    let stdout = tool.child.stdout.take().ok_or_else(|| AgentError::Tool {
        program: "pg_basebackup".into(),
        reason: "its stdout is not captured".into(),
    })?;
    let input = std::fs::File::from(stdout.into_owned_fd().map_err(stream_error)?);
    let input = context.progress.counting(input);
    let mut compressor = zstd_stream::compress(TarTap::new(input, scanner.clone()), zstd);
    let sent = upload.send(&mut compressor.output, buffers).await?;
    let read = compressor.finish().await.map_err(stream_error)?;
    let stderr = tool.finish().await?;
    info!(read, stored = sent.size, pg_basebackup = %stderr.trim(), "base backup streamed");
    Ok(sent)
}

/// Stores one small file of the backup where no object is.
async fn put_file(
    store: &Store,
    name: &'static str,
    bytes: Vec<u8>,
    format: &str,
) -> Result<StoredObject, AgentError> {
    let key = store.keys.backup_file(name);
    let size = bytes.len() as u64;
    let sha256 = hex::encode(Sha256::digest(&bytes));
    match store
        .s3
        .put_new_object(&key, bytes, "application/octet-stream")
        .await?
    {
        NewObject::Written => Ok(StoredObject {
            key,
            size,
            sha256,
            format: format.into(),
            compression: Some(StoredCompression::None),
        }),
        NewObject::AlreadyExists => Err(AgentError::BackupExists { key }),
    }
}

/// Waits until every segment is in the archive at `root`, asking the primary to switch WAL
/// files meanwhile; fails after `timeout` naming the first segment missing.
#[instrument(name = "wal", skip_all, fields(segments = segments.len()))]
async fn wait_for_wal(
    store: &Store,
    root: &str,
    segments: &[String],
    postgres: &Postgres,
    timeout: Duration,
) -> Result<(), AgentError> {
    let deadline = Instant::now() + timeout;
    let mut found = 0;
    let mut last_switch: Option<Instant> = None;
    loop {
        while let Some(name) = segments.get(found) {
            let file = WalFileName::parse(name)
                .ok_or_else(|| AgentError::Settings(format!("{name} is not a WAL segment name")))?;
            if store.object_size(&file.key(root)).await?.is_none() {
                break;
            }
            found += 1;
        }
        let Some(missing) = segments.get(found) else {
            info!(first = ?segments.first(), last = ?segments.last(), "the backup's WAL is archived");
            return Ok(());
        };
        if Instant::now() >= deadline {
            return Err(archive_error(
                root,
                format!(
                    "WAL segment {missing} was not archived within {}s; the base backup is \
                     stored but not recorded",
                    timeout.as_secs()
                ),
            ));
        }
        if last_switch.is_none_or(|at| at.elapsed() >= SWITCH_EVERY) {
            last_switch = Some(Instant::now());
            let switched = postgres
                .query(postgres.maintenance_database(), "SELECT pg_switch_wal()")
                .await;
            if let Err(error) = switched {
                warn!(%error, "cannot ask the primary to switch WAL files");
            }
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_range_starts_and_the_newest_ends_the_backup() {
        let range = |timeline, start, end| WalRange {
            timeline,
            start: Lsn(start),
            end: Lsn(end),
        };
        let (first, last) = bounds(&[range(1, 10, 20), range(2, 20, 30)]);
        assert_eq!((first.timeline, first.start), (1, Lsn(10)));
        assert_eq!((last.timeline, last.end), (2, Lsn(30)));
    }

    #[test]
    fn physical_backups_are_zstd_whatever_the_dumps_compression() {
        let gzip = zstd_settings(Plan::PgDump(Some(6)));
        assert_eq!(gzip.level, DEFAULT_ZSTD_LEVEL);
        let zstd = zstd_settings(Plan::Zstd(ZstdSettings {
            level: 9,
            workers: 3,
        }));
        assert_eq!((zstd.level, zstd.workers), (9, 3));
    }
}
