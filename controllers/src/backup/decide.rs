//! What a backup needs next, decided from what was read (pure).
//!
//! A new backup waits (phase Pending, with a reason) while its cluster is missing, has no
//! storage, is not ready, for a physical backup while the cluster does not archive its WAL or
//! has no standby to read (see [`super::physical`]), while a restore into the cluster runs, or while another backup of
//! the same cluster is unfinished: a cluster runs one backup at a time, the oldest first. A backup that waited longer than the pending
//! deadline fails, so that nothing stays Pending forever. Then the storage is recorded in the
//! status and the Job is created; from there the Job decides (see `follow`). How the Job
//! compresses is decided here too ([`compression`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use pgkube_crds::{
    BackupCompression, BackupPhase, ClusterPhase, PostgreSQLBackup, PostgreSQLCluster,
    PostgreSQLRestore, RestorePhase, S3Storage,
};

use crate::storage::StorageError;
use crate::storage::keys::BackupKeys;

/// The next step for a backup that has not started its Job yet, or is past it.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    /// Completed or Failed: nothing more to do.
    Finished,
    /// The Job exists: follow it.
    Follow,
    /// Stay Pending, and look again later.
    Wait(Reason),
    /// Waited too long: Failed.
    Fail(Reason),
    /// Record `storage` (its prefix resolved) and create the Job.
    Start(Box<S3Storage>),
}

/// Why a backup waits or failed: a CamelCase reason and a sentence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reason {
    pub reason: &'static str,
    pub message: String,
}

impl Reason {
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

/// Decides the next step of `backup`. `cluster` is its cluster as read now (`None`: not
/// found); `siblings` are the backups of the same namespace as the cache has them, `restores`
/// the restores of the namespace.
pub fn next(
    backup: &PostgreSQLBackup,
    cluster: Option<&PostgreSQLCluster>,
    siblings: &[&PostgreSQLBackup],
    restores: &[&PostgreSQLRestore],
    now: DateTime<Utc>,
    pending_deadline: Duration,
) -> Next {
    match phase(backup) {
        Some(BackupPhase::Completed | BackupPhase::Failed) => return Next::Finished,
        Some(BackupPhase::Running) => return Next::Follow,
        Some(BackupPhase::Pending) | None => {}
    }
    match blocker(backup, cluster, siblings, restores) {
        Ok(storage) => Next::Start(Box::new(storage)),
        Err(reason) if crate::age(backup, now) > pending_deadline => Next::Fail(Reason::new(
            "PendingTimeout",
            format!(
                "waited more than {}s to start: {}",
                pending_deadline.as_secs(),
                reason.message
            ),
        )),
        Err(reason) => Next::Wait(reason),
    }
}

pub fn phase(backup: &PostgreSQLBackup) -> Option<BackupPhase> {
    backup.status.as_ref().and_then(|status| status.phase)
}

/// Whether the backup has ended, one way or the other.
pub fn is_finished(backup: &PostgreSQLBackup) -> bool {
    matches!(
        phase(backup),
        Some(BackupPhase::Completed | BackupPhase::Failed)
    )
}

/// The storage to start with, or what stands in the way.
fn blocker(
    backup: &PostgreSQLBackup,
    cluster: Option<&PostgreSQLCluster>,
    siblings: &[&PostgreSQLBackup],
    restores: &[&PostgreSQLRestore],
) -> Result<S3Storage, Reason> {
    let cluster_name = &backup.spec.cluster.name;
    let Some(cluster) = cluster else {
        return Err(Reason::new(
            "ClusterNotFound",
            format!("PostgreSQLCluster {cluster_name} does not exist"),
        ));
    };
    let Some(storage) = (cluster
        .spec
        .backup
        .as_ref()
        .and_then(|b| b.storage.as_ref()))
    .map(|s| &s.s3) else {
        return Err(Reason::new(
            "NoStorage",
            format!("PostgreSQLCluster {cluster_name} has no spec.backup.storage to write to"),
        ));
    };
    let status = cluster.status.as_ref();
    let running = status.and_then(|s| s.phase) == Some(ClusterPhase::Running);
    if !running || status.and_then(|s| s.current_primary.as_ref()).is_none() {
        return Err(Reason::new(
            "ClusterNotReady",
            format!("PostgreSQLCluster {cluster_name} is not Running with a primary yet"),
        ));
    }
    // A physical backup needs the WAL archive, and a standby to read unless told otherwise.
    super::physical::source(backup, cluster)?;
    // A backup taken while a restore rewrites the databases would hold half of each.
    let restoring = restores.iter().find(|r| {
        &r.spec.cluster.name == cluster_name
            && r.status.as_ref().and_then(|s| s.phase) == Some(RestorePhase::Running)
    });
    if let Some(restore) = restoring {
        return Err(Reason::new(
            "WaitingForRestore",
            format!(
                "restore {} into the cluster is running; the backup starts once it ends",
                restore.name_any()
            ),
        ));
    }
    if let Some(first) = first_unfinished(backup, siblings) {
        return Err(Reason::new(
            "WaitingForBackup",
            format!("backup {first} of the same cluster runs first (one backup at a time)"),
        ));
    }
    let mut storage = storage.clone();
    storage.prefix = Some(resolved_prefix(&storage, backup));
    Ok(storage)
}

/// The backup of the same cluster that goes before `backup`, if one is unfinished: a Running
/// one, or an older unfinished one (by creation time, then name), so that exactly one of a
/// cluster's unfinished backups may start.
fn first_unfinished(backup: &PostgreSQLBackup, siblings: &[&PostgreSQLBackup]) -> Option<String> {
    let key = |b: &PostgreSQLBackup| (b.creation_timestamp().map(|t| t.0), b.name_any());
    siblings
        .iter()
        .filter(|other| other.spec.cluster.name == backup.spec.cluster.name)
        .filter(|other| other.name_any() != backup.name_any())
        .filter(|other| other.metadata.deletion_timestamp.is_none() && !is_finished(other))
        .filter(|other| phase(other) == Some(BackupPhase::Running) || key(other) < key(backup))
        .map(|other| other.name_any())
        .min()
}

/// Why a running backup is to be stopped and failed: its cluster's primary moved (a switchover
/// or failover decided) after the backup's Job started. Its connection went to the old primary,
/// which shut down or was cut off: the dump either failed already or could hang on a dead
/// connection, and a clean failure asks for a new backup rather than a wait.
pub fn interrupted_by_primary_change(
    backup: &PostgreSQLBackup,
    cluster: &PostgreSQLCluster,
) -> Option<Reason> {
    let started = backup.status.as_ref()?.start_time.as_ref()?;
    let change = cluster.status.as_ref()?.primary_change.as_ref()?;
    (change.started_at.0 >= started.0).then(|| {
        Reason::new(
            "PrimaryChanged",
            format!(
                "a {} moved the primary from {} to {} at {} while the backup ran; its Job was stopped: take a new backup",
                change.kind.as_str().to_lowercase(),
                change.from,
                change.to,
                change.started_at.0
            ),
        )
    })
}

/// How the backup compresses: its own `spec.compression` if set (the whole of it: a backup's
/// `{method: gzip}` is gzip at pg_dump's default level even if the cluster sets a level), else
/// its cluster's `backup.compression`, else zstd at the agent's default level.
pub fn compression(backup: &PostgreSQLBackup, cluster: &PostgreSQLCluster) -> BackupCompression {
    backup
        .spec
        .compression
        .or_else(|| cluster.spec.backup.as_ref()?.compression)
        .unwrap_or_default()
}

/// Where the backup's objects go: `<prefix>/<cluster-uid>/<backup-name>/<backup-uid>/` (see
/// [`crate::storage::keys`]), for a backup that starts now.
pub fn new_backup_keys(
    prefix: &str,
    cluster: &PostgreSQLCluster,
    backup: &PostgreSQLBackup,
) -> Result<BackupKeys, StorageError> {
    let uid = |meta: &kube::api::ObjectMeta| meta.uid.clone().unwrap_or_default();
    BackupKeys::new(
        prefix,
        &uid(&cluster.metadata),
        &backup.name_any(),
        &uid(&backup.metadata),
    )
}

/// Where the backup's manifest is: the key its status records (from the start, for backups
/// started since the uids are in the keys), else, for a backup that started before, its legacy
/// key `<prefix>/<name>/manifest.json`; `None` for a backup that never started.
pub fn manifest_key(backup: &PostgreSQLBackup) -> Option<String> {
    let status = backup.status.as_ref()?;
    if let Some(key) = &status.object_key {
        return Some(key.clone());
    }
    let storage = status.storage.as_ref()?;
    let prefix = resolved_prefix(&storage.s3, backup);
    BackupKeys::legacy(&prefix, &backup.name_any())
        .ok()
        .map(|keys| keys.manifest())
}

/// The key prefix of the backup's cluster: see [`cluster_prefix`].
pub fn resolved_prefix(storage: &S3Storage, backup: &PostgreSQLBackup) -> String {
    cluster_prefix(
        storage,
        &backup.namespace().unwrap_or_default(),
        &backup.spec.cluster.name,
    )
}

/// The key prefix of a cluster's backups: the storage's own, or `<namespace>/<cluster>`.
pub fn cluster_prefix(storage: &S3Storage, namespace: &str, cluster: &str) -> String {
    match storage.prefix.as_deref().map(|p| p.trim_matches('/')) {
        Some(prefix) if !prefix.is_empty() => prefix.to_owned(),
        _ => format!("{namespace}/{cluster}"),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use pgkube_crds::{
        BackupSpec, CompressionMethod, LocalReference, PostgreSQLBackupSpec,
        PostgreSQLBackupStatus, PostgreSQLClusterSpec, PostgreSQLClusterStatus,
    };

    use super::*;

    const DEADLINE: Duration = Duration::from_secs(600);

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).expect("time")
    }

    fn backup(name: &str, created: i64, phase: Option<BackupPhase>) -> PostgreSQLBackup {
        let mut backup = PostgreSQLBackup::new(
            name,
            PostgreSQLBackupSpec {
                cluster: LocalReference {
                    name: "main".to_owned(),
                },
                method: Default::default(),
                target: None,
                deletion_policy: Default::default(),
                compression: None,
            },
        );
        backup.metadata.namespace = Some("db".to_owned());
        let created =
            k8s_openapi::jiff::Timestamp::from_second(at(created).timestamp()).expect("timestamp");
        backup.metadata.creation_timestamp = Some(Time(created));
        backup.status = phase.map(|phase| PostgreSQLBackupStatus {
            phase: Some(phase),
            ..PostgreSQLBackupStatus::default()
        });
        backup
    }

    fn cluster(phase: ClusterPhase, with_storage: bool) -> PostgreSQLCluster {
        let mut spec: PostgreSQLClusterSpec =
            serde_json::from_value(serde_json::json!({"storage": {"size": "1Gi"}})).expect("spec");
        if with_storage {
            let backup: BackupSpec = serde_json::from_value(serde_json::json!({
                "schedule": {"cron": "0 3 * * *"},
                "storage": {"s3": {"bucket": "backups", "credentials": {
                    "accessKeyId": {"name": "s3", "key": "id"},
                    "secretAccessKey": {"name": "s3", "key": "secret"}}}}
            }))
            .expect("backup config");
            spec.backup = Some(backup);
        }
        let mut cluster = PostgreSQLCluster::new("main", spec);
        cluster.status = Some(PostgreSQLClusterStatus {
            phase: Some(phase),
            current_primary: Some("main-postgresql-0".to_owned()),
            ..PostgreSQLClusterStatus::default()
        });
        cluster
    }

    fn reason(next: &Next) -> Option<&'static str> {
        match next {
            Next::Wait(reason) | Next::Fail(reason) => Some(reason.reason),
            _ => None,
        }
    }

    #[test]
    fn a_running_backup_is_stopped_when_the_primary_moved_after_it_started() {
        let time = |seconds| {
            Time(k8s_openapi::jiff::Timestamp::from_second(at(seconds).timestamp()).expect("ts"))
        };
        let mut running = backup("b1", 0, Some(BackupPhase::Running));
        if let Some(status) = running.status.as_mut() {
            status.start_time = Some(time(10));
        }
        let mut moved = cluster(ClusterPhase::Running, true);
        let change = |started| pgkube_crds::PrimaryChange {
            kind: pgkube_crds::PrimaryChangeKind::Failover,
            from: "main-postgresql-0".to_owned(),
            to: "main-postgresql-1".to_owned(),
            reason: String::new(),
            started_at: time(started),
            completed_at: None,
            term: None,
        };
        assert_eq!(interrupted_by_primary_change(&running, &moved), None);
        if let Some(status) = moved.status.as_mut() {
            status.primary_change = Some(change(5));
        }
        assert_eq!(
            interrupted_by_primary_change(&running, &moved),
            None,
            "a change before the backup started does not concern it"
        );
        if let Some(status) = moved.status.as_mut() {
            status.primary_change = Some(change(20));
        }
        let reason = interrupted_by_primary_change(&running, &moved).expect("stopped");
        assert_eq!(reason.reason, "PrimaryChanged");
        assert!(
            reason.message.starts_with(
                "a failover moved the primary from main-postgresql-0 to main-postgresql-1"
            ),
            "{}",
            reason.message
        );
    }

    #[test]
    fn a_backup_of_a_ready_cluster_starts_with_the_resolved_prefix() {
        let b = backup("b1", 0, None);
        let ready = cluster(ClusterPhase::Running, true);
        let Next::Start(storage) = next(&b, Some(&ready), &[], &[], at(5), DEADLINE) else {
            panic!("should start");
        };
        assert_eq!(storage.prefix.as_deref(), Some("db/main"));
        assert_eq!(storage.bucket, "backups");
    }

    #[test]
    fn a_backups_own_compression_wins_over_its_clusters_then_zstd() {
        let gzip = BackupCompression {
            method: CompressionMethod::Gzip,
            level: None,
        };
        let zstd_9 = BackupCompression {
            method: CompressionMethod::Zstd,
            level: Some(9),
        };
        let mut b = backup("b", 0, None);
        let mut ready = cluster(ClusterPhase::Running, true);
        assert_eq!(compression(&b, &ready), BackupCompression::default());
        assert_eq!(compression(&b, &ready).method, CompressionMethod::Zstd);
        if let Some(settings) = ready.spec.backup.as_mut() {
            settings.compression = Some(zstd_9);
        }
        assert_eq!(compression(&b, &ready), zstd_9);
        b.spec.compression = Some(gzip);
        assert_eq!(compression(&b, &ready), gzip, "taken whole, not merged");
        let without_settings = cluster(ClusterPhase::Running, false);
        assert_eq!(compression(&b, &without_settings), gzip);
    }

    #[test]
    fn a_backup_waits_with_a_reason_then_fails_after_the_deadline() {
        let b = backup("b1", 0, Some(BackupPhase::Pending));
        let cases = [
            (None, "ClusterNotFound"),
            (Some(cluster(ClusterPhase::Running, false)), "NoStorage"),
            (
                Some(cluster(ClusterPhase::Creating, true)),
                "ClusterNotReady",
            ),
        ];
        for (cluster, expected) in cases {
            let waiting = next(&b, cluster.as_ref(), &[], &[], at(60), DEADLINE);
            assert!(matches!(waiting, Next::Wait(_)), "{waiting:?}");
            assert_eq!(reason(&waiting), Some(expected));
            let late = next(&b, cluster.as_ref(), &[], &[], at(601), DEADLINE);
            assert_eq!(reason(&late), Some("PendingTimeout"), "{late:?}");
            let Next::Fail(failure) = late else {
                panic!("fails")
            };
            assert!(
                failure
                    .message
                    .starts_with("waited more than 600s to start: "),
                "{}",
                failure.message
            );
        }
    }

    #[test]
    fn a_cluster_runs_one_backup_at_a_time_oldest_first() {
        let ready = cluster(ClusterPhase::Running, true);
        let old = backup("old", 0, None);
        let new = backup("new", 10, None);
        let siblings = [&old, &new];
        assert!(matches!(
            next(&old, Some(&ready), &siblings, &[], at(20), DEADLINE),
            Next::Start(_)
        ));
        assert_eq!(
            reason(&next(&new, Some(&ready), &siblings, &[], at(20), DEADLINE)),
            Some("WaitingForBackup")
        );
        // A running backup blocks even an older pending one.
        let running = backup("running", 30, Some(BackupPhase::Running));
        assert_eq!(
            reason(&next(
                &old,
                Some(&ready),
                &[&old, &running],
                &[],
                at(40),
                DEADLINE
            )),
            Some("WaitingForBackup")
        );
        // Finished ones and other clusters' do not count.
        let done = backup("done", 0, Some(BackupPhase::Completed));
        let mut other = backup("other", 0, Some(BackupPhase::Running));
        other.spec.cluster.name = "another".to_owned();
        assert!(matches!(
            next(
                &new,
                Some(&ready),
                &[&done, &other, &new],
                &[],
                at(40),
                DEADLINE
            ),
            Next::Start(_)
        ));
    }

    #[test]
    fn finished_and_running_backups_do_not_start_again() {
        let ready = cluster(ClusterPhase::Running, true);
        for (phase, expected) in [
            (BackupPhase::Completed, Next::Finished),
            (BackupPhase::Failed, Next::Finished),
            (BackupPhase::Running, Next::Follow),
        ] {
            let b = backup("b", 0, Some(phase));
            assert_eq!(
                next(&b, Some(&ready), &[], &[], at(10_000), DEADLINE),
                expected
            );
        }
    }

    #[test]
    fn a_new_backup_goes_under_its_clusters_uid_and_its_own() {
        let mut b = backup("nightly", 0, None);
        b.metadata.uid = Some("b-uid".to_owned());
        let mut ready = cluster(ClusterPhase::Running, true);
        ready.metadata.uid = Some("c-uid".to_owned());
        let keys = new_backup_keys("db/main", &ready, &b).expect("keys");
        assert_eq!(keys.manifest(), "db/main/c-uid/nightly/b-uid/manifest.json");
        ready.metadata.uid = None;
        let error = new_backup_keys("db/main", &ready, &b).expect_err("no uid");
        assert!(error.to_string().contains("cluster uid"), "{error}");
    }

    #[test]
    fn the_manifest_key_is_the_recorded_one_else_the_legacy_one() {
        let mut b = backup("nightly", 0, Some(BackupPhase::Completed));
        assert_eq!(manifest_key(&b), None, "no storage: never started");
        let status = b.status.as_mut().expect("status");
        status.storage = Some(pgkube_crds::BackupStorage::default());
        assert_eq!(
            manifest_key(&b).as_deref(),
            Some("db/main/nightly/manifest.json")
        );
        let status = b.status.as_mut().expect("status");
        status.object_key = Some("db/main/c/nightly/u/manifest.json".to_owned());
        assert_eq!(
            manifest_key(&b).as_deref(),
            Some("db/main/c/nightly/u/manifest.json")
        );
    }

    #[test]
    fn a_storage_prefix_is_used_without_its_slashes() {
        let b = backup("b", 0, None);
        let mut storage = S3Storage {
            prefix: Some("team/pg/".to_owned()),
            ..S3Storage::default()
        };
        assert_eq!(resolved_prefix(&storage, &b), "team/pg");
        storage.prefix = Some(String::new());
        assert_eq!(resolved_prefix(&storage, &b), "db/main");
    }
}
