//! `pgkube agent restore`: verify everything first, then apply globals and databases.
//!
//! With `--expect-system-identifier`, the server's database must be that one (see
//! [`super::target`]): checked once the server accepts connections, before anything is read
//! from storage, and again just before the first change, since verifying can take long. A
//! mismatch fails the restore with nothing dropped or restored.
//!
//! The manifest is read at `--manifest-key` (the backup controller passes the key its backup
//! recorded), else at `<prefix>/<backup-name>/manifest.json`, where backups were stored before
//! the uids were in the keys; every object is then read at the key the manifest lists, so both
//! layouts restore alike.
//!
//! Two passes over the object store. The first streams every selected object through SHA-256
//! (no temporary file, nothing kept) and, for an object the manifest lists as zstd, through the
//! decompressor too (zstd's own frame checksum included), and fails, before the server is
//! touched, if an object is missing, has the wrong size or the wrong checksum, or does not
//! decompress. The second streams each object again into
//! `pg_restore` (decompressed on the fly when it is zstd: no temporary file either) and checks
//! it once more while it streams; a mismatch there (the object changed
//! between the passes) fails the restore too, but that database may then be partly restored,
//! which the message says. Reading twice costs a second download, which is cheap next to
//! `pg_restore` itself, and it is what lets a corrupted backup change nothing. In both passes a
//! download that breaks half way resumes from where it broke ([`super::download`]).
//!
//! Globals are small: they are downloaded into memory, verified and fed to `psql`
//! ([`super::globals`]).

use std::collections::BTreeSet;
use std::process::Stdio;

use chrono::{SecondsFormat, Utc};
use clap::Args;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tracing::{Instrument, Span, info, info_span, instrument};

use super::CommonArgs;
use super::download::ObjectReader;
use super::error::AgentError;
use super::globals;
use super::postgres::{Postgres, conninfo_for};
use super::progress::Progress;
use super::replace::{self, Replacement};
use super::report::Report;
use super::storage::{Store, s3_error};
use super::target;
use super::zstd_stream::{DecodeError, Decompressor};
use pgkube_controllers::storage::keys::{BackupKeys, MANIFEST_FILE};
use pgkube_controllers::storage::manifest::{
    DatabaseObject, Manifest, StoredCompression, StoredObject,
};

#[derive(Args, Debug)]
pub struct RestoreArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Restore only this database (repeatable). Default: every database in the backup.
    #[arg(long = "database", value_name = "NAME")]
    databases: Vec<String>,

    /// Replace databases that already exist: each is set aside, and dropped only once its
    /// restore completed (put back if it fails). Without it an existing database fails the
    /// restore before anything is changed.
    #[arg(long, env = "PGKUBE_DROP_EXISTING")]
    drop_existing: bool,

    /// Do not restore roles and tablespaces.
    #[arg(long, env = "PGKUBE_SKIP_GLOBALS")]
    skip_globals: bool,

    /// The target cluster's application role: like the replication role, it keeps its own
    /// password, which its applications read from the target's Secret.
    #[arg(long, env = "PGKUBE_APPLICATION_ROLE")]
    application_role: Option<String>,

    /// Key of the backup's manifest. Default: `<prefix>/<backup-name>/manifest.json`, the layout
    /// of backups stored before their directory was named by uids.
    #[arg(long, env = "PGKUBE_MANIFEST_KEY")]
    manifest_key: Option<String>,

    /// Restore only into a server whose database has this PostgreSQL system identifier
    /// (`SELECT system_identifier FROM pg_control_system()`): another database fails the
    /// restore before anything is dropped or restored. Default: any database.
    #[arg(
        long,
        env = "PGKUBE_EXPECT_SYSTEM_IDENTIFIER",
        value_name = "ID",
        value_parser = target::parse_identifier
    )]
    expect_system_identifier: Option<String>,
}

impl RestoreArgs {
    /// The backup's keys: those of the manifest given, else the legacy ones.
    fn keys(&self) -> Result<BackupKeys, AgentError> {
        match self.manifest_key.as_deref().filter(|key| !key.is_empty()) {
            Some(key) => BackupKeys::of_manifest(key).ok_or_else(|| {
                AgentError::Settings(format!(
                    "--manifest-key {key:?} is not the key of a manifest (<directory>/{MANIFEST_FILE})"
                ))
            }),
            None => Ok(BackupKeys::legacy(
                &self.common.s3.prefix,
                &self.common.backup_name,
            )?),
        }
    }
}

pub async fn run(args: RestoreArgs) -> Result<Report, AgentError> {
    let started_at = now();
    let store = Store::connect(&args.common.s3, args.keys()?).await?;
    let postgres = Postgres::from_env(&args.common.maintenance_database)?;
    let manifest = &read_manifest(&store).await?;
    if manifest.physical.is_some() {
        return Err(AgentError::Manifest {
            key: store.keys.manifest(),
            reason: "it lists a physical base backup, which this agent does not restore \
                     (see docs/physical-backups.md for a restore by hand)"
                .into(),
        });
    }
    let selected = select_databases(manifest, &args.databases)?;
    postgres
        .wait_until_accepting(args.common.server_wait())
        .await?;
    let expected = args.expect_system_identifier.as_deref();
    target::check(&postgres, expected).await?;
    let existing = existing_among(&postgres, &selected).await?;
    if !existing.is_empty() && !args.drop_existing {
        return Err(AgentError::DatabasesExist(existing.into_iter().collect()));
    }

    let progress = Progress::new();
    let _reporting = progress.report_periodically();
    let total = Some(selected.iter().map(|db| db.object.size).sum::<u64>());
    progress.set_database_count(selected.len());
    progress.start_step("Verifying", total, false);
    info!(backup = %manifest.backup_name, databases = selected.len(), "verifying objects");
    let globals = verify(&store, manifest, &selected, args.skip_globals, &progress)
        .instrument(info_span!("verify", objects = selected.len()))
        .await?;

    target::check(&postgres, expected).await?;
    if let Some(globals) = globals {
        globals::restore(&postgres, &globals, args.application_role.as_deref()).await?;
    }
    let run_id = replace::run_id();
    progress.start_step("Restoring", total, false);
    for database in &selected {
        progress.start_database(&database.name);
        if !existing.contains(&database.name) {
            restore_database(&postgres, &store, database, &progress).await?;
            progress.finish_database();
            continue;
        }
        let names = Replacement::new(&database.name, &run_id);
        replace::set_aside(&postgres, &names).await?;
        match restore_database(&postgres, &store, database, &progress).await {
            Ok(()) => replace::drop_aside(&postgres, &names).await,
            Err(error) => return Err(replace::put_back(&postgres, &names, error).await),
        }
        progress.finish_database();
    }

    let size = selected.iter().map(|db| db.object.size).sum::<u64>()
        + if args.skip_globals {
            0
        } else {
            manifest.globals.as_ref().map_or(0, |globals| globals.size)
        };
    info!(backup = %manifest.backup_name, size, "restore completed");
    Ok(Report {
        backup_name: Some(manifest.backup_name.clone()),
        manifest_key: Some(store.keys.manifest()),
        postgresql_version: Some(manifest.postgresql_version.clone()),
        started_at: Some(started_at),
        finished_at: Some(now()),
        size: Some(size),
        database_count: Some(selected.len()),
        databases: Some(selected.iter().map(|db| db.name.clone()).collect()),
        ..Report::completed()
    })
}

impl RestoreArgs {
    /// The root span of a restore, with the backup's name and where it is read from.
    pub fn span(&self) -> Span {
        info_span!(
            "agent.restore",
            backup = %self.common.backup_name,
            bucket = %self.common.s3.bucket,
            prefix = %self.common.s3.prefix,
            manifest_key = self.manifest_key.as_deref().unwrap_or_default(),
            drop_existing = self.drop_existing,
            expect_system_identifier = self.expect_system_identifier.as_deref().unwrap_or_default(),
            otel.status_description = tracing::field::Empty,
        )
    }
}

/// Streams every selected object through its checks before anything changes; the globals
/// script (unless skipped) is what it keeps.
async fn verify(
    store: &Store,
    manifest: &Manifest,
    selected: &[&DatabaseObject],
    skip_globals: bool,
    progress: &Progress,
) -> Result<Option<Vec<u8>>, AgentError> {
    let globals = match manifest.globals.as_ref().filter(|_| !skip_globals) {
        None => None,
        Some(globals) => Some(globals::download(store, globals).await?),
    };
    for database in selected {
        progress.start_database(&database.name);
        stream_object(
            store,
            &database.object,
            &mut tokio::io::sink(),
            Some(progress),
        )
        .await?;
        progress.finish_database();
    }
    Ok(globals)
}

async fn read_manifest(store: &Store) -> Result<Manifest, AgentError> {
    let key = store.keys.manifest();
    let response = store
        .s3
        .client
        .get_object()
        .bucket(&store.s3.name)
        .key(&key)
        .send()
        .await;
    let response = match response {
        Ok(response) => response,
        Err(error) if error.as_service_error().is_some_and(|e| e.is_no_such_key()) => {
            return Err(AgentError::Manifest {
                key,
                reason: "not found: the backup does not exist or never completed".into(),
            });
        }
        Err(error) => return Err(s3_error("GetObject", &key, error)),
    };
    let bytes = response
        .body
        .collect()
        .await
        .map_err(|error| AgentError::Manifest {
            key: key.clone(),
            reason: format!("reading it: {error}"),
        })?
        .into_bytes();
    Ok(Manifest::parse(&key, &bytes)?)
}

/// The databases to restore, in manifest order.
fn select_databases<'a>(
    manifest: &'a Manifest,
    requested: &[String],
) -> Result<Vec<&'a DatabaseObject>, AgentError> {
    if let Some(unknown) = requested
        .iter()
        .find(|name| !manifest.databases.iter().any(|db| &db.name == *name))
    {
        return Err(AgentError::UnknownDatabase(unknown.clone()));
    }
    Ok(manifest
        .databases
        .iter()
        .filter(|db| requested.is_empty() || requested.contains(&db.name))
        .collect())
}

async fn existing_among(
    postgres: &Postgres,
    selected: &[&DatabaseObject],
) -> Result<BTreeSet<String>, AgentError> {
    let on_server = postgres.list_all_databases().await?;
    Ok(selected
        .iter()
        .filter(|db| on_server.contains(&db.name))
        .map(|db| db.name.clone())
        .collect())
}

/// Streams an object into `sink`, decompressed if it is stored compressed, checking its size and
/// SHA-256 (of the stored bytes) against the manifest, and that it decompresses. A stream that
/// stops decompressing is read to its end all the same, so that an object altered in storage is
/// reported as a checksum mismatch rather than as bad zstd. The stored bytes read are added to
/// `progress`.
pub(super) async fn stream_object<W: AsyncWrite + Unpin>(
    store: &Store,
    object: &StoredObject,
    sink: &mut W,
    progress: Option<&Progress>,
) -> Result<(), AgentError> {
    let mismatch = |reason: String| AgentError::Verification {
        key: object.key.clone(),
        reason,
    };
    let stream_error = |source| AgentError::Stream {
        key: object.key.clone(),
        source,
    };
    let Some(mut reader) = ObjectReader::open(store, &object.key).await? else {
        return Err(mismatch("missing from storage".into()));
    };
    let mut decompressor = match object.compression() {
        StoredCompression::Zstd => Some(Decompressor::new().map_err(stream_error)?),
        StoredCompression::None => None,
    };
    let mut undecodable = None;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    while let Some(chunk) = reader.next_chunk().await? {
        size += chunk.len() as u64;
        if let Some(progress) = progress {
            progress.add(chunk.len() as u64);
        }
        if size > object.size {
            return Err(mismatch(format!(
                "longer than the {} bytes the manifest lists",
                object.size
            )));
        }
        hasher.update(&chunk);
        match decompressor.as_mut() {
            None => sink.write_all(&chunk).await.map_err(stream_error)?,
            Some(decoder) if undecodable.is_none() => {
                undecodable = decoded(decoder.write(&chunk, sink).await, &object.key)?;
            }
            Some(_) => {}
        }
    }
    if size != object.size {
        return Err(mismatch(format!(
            "{size} bytes stored, the manifest lists {}",
            object.size
        )));
    }
    let sha256 = hex::encode(hasher.finalize());
    if sha256 != object.sha256 {
        return Err(mismatch(format!(
            "SHA-256 {sha256}, the manifest lists {}",
            object.sha256
        )));
    }
    if undecodable.is_none()
        && let Some(decoder) = &decompressor
    {
        undecodable = decoded(decoder.finish(), &object.key)?;
    }
    match undecodable {
        Some(reason) => Err(mismatch(format!(
            "its size and SHA-256 match, but it is not valid zstd: {reason}"
        ))),
        None => Ok(()),
    }
}

/// A decoding step's outcome: `Some(reason)` when the bytes do not decode, an error when the
/// sink failed.
fn decoded(outcome: Result<(), DecodeError>, key: &str) -> Result<Option<String>, AgentError> {
    match outcome {
        Ok(()) => Ok(None),
        Err(DecodeError::Corrupt(error)) => Ok(Some(error.to_string())),
        Err(DecodeError::Sink(source)) => Err(AgentError::Stream {
            key: key.to_string(),
            source,
        }),
    }
}

/// `pg_restore --create` from the object, connected to a database other than the target.
#[instrument(name = "database", skip_all, fields(database = %database.name))]
async fn restore_database(
    postgres: &Postgres,
    store: &Store,
    database: &DatabaseObject,
    progress: &Progress,
) -> Result<(), AgentError> {
    info!(database = %database.name, key = %database.object.key, "restoring database");
    let mut command = postgres.command("pg_restore");
    command
        .args(["--create", "--exit-on-error", "--no-password", "--dbname"])
        .arg(conninfo_for(
            postgres.database_to_connect_while_replacing(&database.name),
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::null());
    let mut tool = postgres.spawn("pg_restore", command)?;
    let streamed = match tool.child.stdin.take() {
        // Dropping stdin at the end of the arm closes it: pg_restore sees the end of the archive.
        Some(mut stdin) => stream_object(store, &database.object, &mut stdin, Some(progress)).await,
        None => Err(AgentError::Tool {
            program: "pg_restore".into(),
            reason: "its stdin is not captured".into(),
        }),
    };
    let finished = tool.finish().await;
    match (streamed, finished) {
        (Ok(()), Ok(_)) => {
            info!(database = %database.name, "database restored");
            Ok(())
        }
        (Err(AgentError::Verification { key, reason }), _) => Err(AgentError::Verification {
            key,
            reason: format!(
                "{reason} (detected while restoring: database {} may be partly restored)",
                database.name
            ),
        }),
        // A broken pipe means pg_restore stopped reading: its own error says why.
        (Err(AgentError::Stream { .. }), Err(tool_error)) => Err(tool_error),
        (Err(error), _) | (Ok(()), Err(error)) => Err(error),
    }
}

fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgkube_controllers::storage::manifest::{
        DATABASE_FORMAT, GLOBALS_FORMAT, MANIFEST_VERSION,
    };

    fn object(key: &str) -> StoredObject {
        StoredObject {
            key: key.into(),
            size: 1,
            sha256: String::new(),
            format: DATABASE_FORMAT.into(),
            compression: None,
        }
    }

    fn manifest_with(databases: &[&str]) -> Manifest {
        Manifest {
            manifest_version: MANIFEST_VERSION,
            cluster: "c".into(),
            namespace: "n".into(),
            cluster_uid: None,
            system_identifier: None,
            backup_name: "b".into(),
            backup_uid: None,
            postgresql_version: "15".into(),
            started_at: String::new(),
            finished_at: String::new(),
            format: DATABASE_FORMAT.into(),
            physical: None,
            globals: Some(StoredObject {
                format: GLOBALS_FORMAT.into(),
                ..object("b/globals.sql")
            }),
            databases: databases
                .iter()
                .map(|name| DatabaseObject {
                    name: name.to_string(),
                    object: object(&format!("b/databases/{name}.dump")),
                })
                .collect(),
        }
    }

    fn parse(args: &[&str]) -> Result<RestoreArgs, clap::Error> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            restore: RestoreArgs,
        }
        let required = ["agent", "--backup-name", "b1", "--s3-bucket", "backups"];
        <Cli as clap::Parser>::try_parse_from(required.iter().chain(args)).map(|cli| cli.restore)
    }

    #[test]
    fn the_expected_system_identifier_is_a_flag_of_digits() {
        let args = parse(&["--expect-system-identifier", "7312345678901234567"]).expect("parses");
        assert_eq!(
            args.expect_system_identifier.as_deref(),
            Some("7312345678901234567")
        );
        assert_eq!(parse(&[]).expect("parses").expect_system_identifier, None);
        for bad in ["Any", "-1", "7x", ""] {
            let flag = format!("--expect-system-identifier={bad}");
            let error = parse(&[flag.as_str()]).err();
            let message = error.map(|e| e.to_string()).unwrap_or_default();
            assert!(
                message.contains("--expect-system-identifier")
                    && message.contains("not a PostgreSQL system identifier"),
                "{bad:?}: {message}"
            );
        }
    }

    #[test]
    fn all_databases_are_restored_unless_some_are_named() {
        let manifest = manifest_with(&["app", "postgres", "shop"]);
        let all = select_databases(&manifest, &[]).expect("all");
        assert_eq!(all.len(), 3);
        let some = select_databases(&manifest, &["shop".to_string()]).expect("one");
        assert_eq!(
            some.iter().map(|db| db.name.as_str()).collect::<Vec<_>>(),
            ["shop"]
        );
    }

    #[test]
    fn naming_a_database_the_backup_lacks_fails() {
        let manifest = manifest_with(&["app"]);
        let error = select_databases(&manifest, &["gone".to_string()]).expect_err("unknown");
        assert_eq!(error.to_string(), "the backup has no database named gone");
    }
}
