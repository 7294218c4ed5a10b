//! Continuous WAL archiving, done by the instance manager on the primary.
//!
//! PostgreSQL's `archive_command` is `pgkube instance archive-wal --socket <socket> %f`, a
//! short-lived client that asks this manager over a Unix socket ([`socket`]) to archive one
//! WAL file and exits with its answer. The manager keeps one S3 client for all of them, so no
//! file pays for a new process's connection and credentials.
//!
//! For each request the manager also starts uploading the next files PostgreSQL has marked
//! ready (`pg_wal/archive_status/*.ready`), several at once ([`upload`]), as pgBackRest's
//! asynchronous archive-push does: when PostgreSQL asks for one of them, it is already stored
//! and the answer is immediate. A file counts as archived only once the store has it (or the
//! same content was there already); anything else is an error for PostgreSQL, which keeps the
//! file and asks again. PostgreSQL removes no WAL file before its `archive_command` succeeded.
//!
//! The archive must belong to this database: before the first file, the manager claims the
//! archive's root for its system identifier and cluster uid, and refuses one recorded for
//! another ([`pgkube_controllers::storage::wal::claim`]).
//!
//! What happened is served in `/status` (`walArchive`) and `/metrics` ([`report`]).

mod report;
pub mod socket;
mod upload;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use pgkube_controllers::storage::wal::{
    self, ArchiveOwner, WalArchiveError, WalArchiveTarget, WalFileName,
};
use pgkube_controllers::storage::{
    ACCESS_KEY_ID_FILE_VARIABLE, CaBundle, CredentialSource, Encryption, S3Bucket, S3Options,
    SECRET_ACCESS_KEY_FILE_VARIABLE,
};
use tokio::sync::{Semaphore, watch};

use pgkube_controllers::cluster::status::archiving::WalArchiveReport;

use super::identity;

/// Uploads in flight at once: the file asked for and those read ahead.
const UPLOADS_IN_FLIGHT: usize = 4;
/// Ready files queued ahead of the one asked for.
const READ_AHEAD: usize = 8;

/// PostgreSQL's `archive_command` for a manager whose directory is `run_dir`: this binary,
/// asking over the socket there.
pub fn command(run_dir: &Path) -> String {
    let binary = std::env::current_exe().unwrap_or_else(|_| run_dir.join("pgkube"));
    socket::archive_command(&binary, &run_dir.join(socket::SOCKET_NAME))
}

/// What the operator asks for: where to archive, and the cluster's uid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArchiveSettings {
    pub target: Option<WalArchiveTarget>,
    pub cluster_uid: Option<String>,
}

/// The archiver of one instance manager.
pub struct Archiver {
    pgdata: PathBuf,
    /// The pod's S3 volume: keys and CA bundle.
    s3_dir: PathBuf,
    settings: Mutex<ArchiveSettings>,
    /// The client and claimed archive for the settings it was made for.
    store: tokio::sync::Mutex<Option<Store>>,
    uploads: Mutex<Uploads>,
    permits: Semaphore,
    report: Mutex<report::State>,
}

/// A client for one target, whose archive was claimed for one owner.
struct Store {
    settings: ArchiveSettings,
    /// The key and CA files it was made with: a rotated Secret makes a new client.
    files: Vec<Option<Vec<u8>>>,
    bucket: S3Bucket,
    root: String,
}

/// The outcome of one upload, shared with everyone waiting for it.
type Outcome = Option<Result<(), String>>;

#[derive(Default)]
struct Uploads {
    in_flight: HashMap<String, watch::Receiver<Outcome>>,
    /// Read ahead and stored, not asked for yet.
    stored_ahead: HashSet<String>,
}

impl Archiver {
    pub fn new(pgdata: &Path, s3_dir: &Path) -> Arc<Self> {
        Arc::new(Self {
            pgdata: pgdata.to_owned(),
            s3_dir: s3_dir.to_owned(),
            settings: Mutex::new(ArchiveSettings::default()),
            store: tokio::sync::Mutex::new(None),
            uploads: Mutex::new(Uploads::default()),
            permits: Semaphore::new(UPLOADS_IN_FLIGHT),
            report: Mutex::new(report::State::default()),
        })
    }

    /// Takes the operator's latest settings; the next request uses them.
    pub fn configure(&self, settings: ArchiveSettings) {
        let mut current = lock(&self.settings);
        if *current != settings {
            tracing::info!(
                archive = settings
                    .target
                    .as_ref()
                    .map(|t| format!("s3://{}/{}", t.bucket, t.root)),
                "WAL archive settings"
            );
            *current = settings;
        }
    }

    /// Whether this instance is told to archive.
    pub fn enabled(&self) -> bool {
        lock(&self.settings).target.is_some()
    }

    /// Archives the WAL file `name` of `pg_wal`: `Ok` once it is in the store.
    pub async fn archive(self: &Arc<Self>, name: &str) -> Result<(), String> {
        let result = self.archive_unrecorded(name).await;
        lock(&self.report).record(name, &result);
        match &result {
            Ok(()) => tracing::debug!(file = name, "WAL file archived"),
            Err(error) => tracing::warn!(file = name, %error, "WAL file not archived"),
        }
        result
    }

    async fn archive_unrecorded(self: &Arc<Self>, name: &str) -> Result<(), String> {
        let file = WalFileName::parse(name)
            .ok_or_else(|| format!("{name:?} is not the name of a WAL file"))?;
        if lock(&self.uploads).stored_ahead.remove(name) {
            return Ok(());
        }
        let (bucket, root) = self.store().await.map_err(|error| error.to_string())?;
        let ahead = upload::ready_files(&self.pgdata, READ_AHEAD).unwrap_or_default();
        for next in ahead.into_iter().filter(|next| next.name != file.name) {
            self.start_upload(next, &bucket, &root, true);
        }
        let mut outcome = self.start_upload(file, &bucket, &root, false);
        loop {
            if let Some(result) = outcome.borrow_and_update().clone() {
                // An upload read ahead that this request joined: it is asked for now.
                lock(&self.uploads).stored_ahead.remove(name);
                return result;
            }
            if outcome.changed().await.is_err() {
                return Err("the upload stopped without an answer".to_owned());
            }
        }
    }

    /// The upload of `file`: the one in flight, or a new one.
    fn start_upload(
        self: &Arc<Self>,
        file: WalFileName,
        bucket: &S3Bucket,
        root: &str,
        ahead: bool,
    ) -> watch::Receiver<Outcome> {
        let mut uploads = lock(&self.uploads);
        if let Some(outcome) = uploads.in_flight.get(&file.name) {
            return outcome.clone();
        }
        if ahead
            && (uploads.stored_ahead.contains(&file.name) || uploads.in_flight.len() >= READ_AHEAD)
        {
            let (_, outcome) = watch::channel(None);
            return outcome;
        }
        let (sender, outcome) = watch::channel(None);
        uploads.in_flight.insert(file.name.clone(), outcome.clone());
        let archiver = self.clone();
        let bucket = bucket.clone();
        let key = file.key(root);
        tokio::spawn(async move {
            let result = archiver.upload(&file, &bucket, &key).await;
            let mut uploads = lock(&archiver.uploads);
            uploads.in_flight.remove(&file.name);
            if ahead && result.is_ok() {
                uploads.stored_ahead.insert(file.name.clone());
            }
            drop(uploads);
            let _ = sender.send(Some(result));
        });
        outcome
    }

    async fn upload(&self, file: &WalFileName, bucket: &S3Bucket, key: &str) -> Result<(), String> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| "the archiver is closed".to_owned())?;
        let path = self.pgdata.join("pg_wal").join(&file.name);
        let prepared = upload::prepare(path).await?;
        match wal::store_file(bucket, key, &prepared).await {
            Ok(stored) => {
                tracing::debug!(key, ?stored, "stored");
                Ok(())
            }
            Err(error @ WalArchiveError::Conflict { .. }) => {
                lock(&self.report).conflict();
                tracing::error!(%error, "WAL conflict in the archive");
                Err(error.to_string())
            }
            Err(error) => Err(error.to_string()),
        }
    }

    /// The client for the current settings, with the archive claimed for this database.
    async fn store(&self) -> Result<(S3Bucket, String), WalArchiveError> {
        let settings = lock(&self.settings).clone();
        let files = self.key_files();
        let mut store = self.store.lock().await;
        if let Some(current) = store
            .as_ref()
            .filter(|s| s.settings == settings && s.files == files)
        {
            return Ok((current.bucket.clone(), current.root.clone()));
        }
        let target = settings.target.clone().ok_or_else(|| {
            settings_error("this instance has no archive settings (is it the primary of a cluster with backup storage?)")
        })?;
        let owner = ArchiveOwner {
            system_identifier: identity::system_identifier_of(&self.pgdata)
                .await
                .map_err(|error| settings_error(&error.to_string()))?,
            cluster_uid: settings
                .cluster_uid
                .clone()
                .ok_or_else(|| settings_error("the cluster's uid is not known yet"))?,
            cluster: target.cluster.clone(),
        };
        let bucket = S3Bucket::connect(&self.options(&target)?).await?;
        wal::claim(&bucket, &target.root, &owner).await?;
        tracing::info!(archive = %format!("s3://{}/{}", target.bucket, target.root), system = %owner.system_identifier, "the WAL archive is this database's");
        let root = target.root.clone();
        // What was read ahead went to the former target.
        lock(&self.uploads).stored_ahead.clear();
        *store = Some(Store {
            settings,
            files,
            bucket: bucket.clone(),
            root: root.clone(),
        });
        Ok((bucket, root))
    }

    /// The content of the S3 volume's files now (none for a file that is missing).
    fn key_files(&self) -> Vec<Option<Vec<u8>>> {
        WalArchiveTarget::FILES
            .iter()
            .map(|file| std::fs::read(self.s3_dir.join(file)).ok())
            .collect()
    }

    fn options(&self, target: &WalArchiveTarget) -> Result<S3Options, WalArchiveError> {
        s3_options(&self.s3_dir, target)
    }

    /// What `/status` shows, with `pg_wal` looked at now; none when this instance does not
    /// archive and never did.
    pub fn report(&self) -> Option<WalArchiveReport> {
        let state = lock(&self.report).clone();
        let enabled = self.enabled();
        if !enabled && state.is_empty() {
            return None;
        }
        Some(state.report(&upload::wal_usage(&self.pgdata), enabled))
    }

    /// `/metrics`: the archiver's counts when this instance archives or did, and the usage of
    /// `pg_wal` and its volume in any case.
    pub fn metrics(&self) -> Result<String, std::fmt::Error> {
        let state = lock(&self.report).clone();
        let archiving = self.enabled() || !state.is_empty();
        report::render_metrics(
            archiving.then_some(&state),
            &upload::wal_usage(&self.pgdata),
        )
    }
}

/// The client options for the archive `target`, with the keys and CA bundle that are files of
/// `s3_dir` (the pod's volume of the storage's Secrets), or without keys the pod's identity.
pub fn s3_options(s3_dir: &Path, target: &WalArchiveTarget) -> Result<S3Options, WalArchiveError> {
    let [access_key, secret_key, ca_bundle] = WalArchiveTarget::FILES;
    let files: HashMap<&str, OsString> = match target.keys {
        true => HashMap::from([
            (ACCESS_KEY_ID_FILE_VARIABLE, s3_dir.join(access_key).into()),
            (
                SECRET_ACCESS_KEY_FILE_VARIABLE,
                s3_dir.join(secret_key).into(),
            ),
        ]),
        // No keys: the pod's identity, through the AWS SDK's default chain.
        false => HashMap::new(),
    };
    let ca_bundle = match target.ca_bundle {
        true => Some(CaBundle::from_file(
            &s3_dir.join(ca_bundle),
            "the CA bundle",
        )?),
        false => None,
    };
    Ok(S3Options {
        endpoint: target.endpoint.clone(),
        region: target.region.clone(),
        bucket: target.bucket.clone(),
        force_path_style: target.force_path_style,
        ca_bundle,
        encryption: Encryption {
            algorithm: target.server_side_encryption.as_deref().map(Into::into),
            kms_key_id: None,
        },
        credentials: CredentialSource::from_lookup(&|name| files.get(name).cloned())?,
        ..S3Options::default()
    })
}

fn settings_error(message: &str) -> WalArchiveError {
    WalArchiveError::Storage(pgkube_controllers::storage::StorageError::Settings(
        message.to_owned(),
    ))
}

/// A poisoned lock only means a panic elsewhere; the data is still consistent here.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the archiver is told by the files: where to archive, for which cluster.
pub fn settings_of(desired: &super::Desired) -> ArchiveSettings {
    ArchiveSettings {
        target: desired.topology.wal_archive.clone(),
        cluster_uid: desired.topology.cluster_uid.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(keys: bool) -> WalArchiveTarget {
        WalArchiveTarget {
            bucket: "wal".to_owned(),
            region: "garage".to_owned(),
            endpoint: None,
            force_path_style: true,
            root: "db/main/wal/main/".to_owned(),
            cluster: "db/main".to_owned(),
            ca_bundle: false,
            keys,
            server_side_encryption: None,
        }
    }

    #[test]
    fn the_archiver_signs_with_the_key_files_or_without_them_as_the_pod() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let [access_key, secret_key, _] = WalArchiveTarget::FILES;
        std::fs::write(dir.path().join(access_key), "GK-ID\n").expect("write");
        std::fs::write(dir.path().join(secret_key), "secret\n").expect("write");
        let with_keys = s3_options(dir.path(), &target(true)).expect("options");
        let CredentialSource::Static(keys) = with_keys.credentials else {
            panic!("the key files are used: {:?}", with_keys.credentials);
        };
        assert_eq!(keys.access_key_id, "GK-ID");
        // Files left by an earlier template must not be taken for the keys of a storage
        // without them.
        let as_the_pod = s3_options(dir.path(), &target(false)).expect("options");
        assert_eq!(as_the_pod.credentials, CredentialSource::DefaultChain);
        // An empty volume: the pod's identity, not an error about a missing file.
        let empty = tempfile::tempdir().expect("temporary directory");
        assert!(s3_options(empty.path(), &target(true)).is_err());
        let as_the_pod = s3_options(empty.path(), &target(false)).expect("options");
        assert_eq!(as_the_pod.credentials, CredentialSource::DefaultChain);
    }

    #[test]
    fn settings_of_older_operators_without_the_keys_field_mean_key_files() {
        let older = r#"{"bucket":"wal","region":"r","root":"x/","cluster":"db/main"}"#;
        let target: WalArchiveTarget = serde_json::from_str(older).expect("parses");
        assert!(target.keys);
    }
}
