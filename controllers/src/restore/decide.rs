//! What a restore needs next, decided from what was read (pure).
//!
//! A restore is refused (Failed at once, no Job) when what it restores cannot be used: the
//! named backup does not exist or failed, the source's key is not a manifest key, or the backup
//! was taken from a newer PostgreSQL major than the target cluster runs. It waits (Pending, with
//! a reason) while the named backup has not ended, while the target cluster is missing or has
//! no ready primary, while another restore into the cluster goes first (one at a time, the
//! oldest first), and while a backup of the cluster runs; after the pending deadline it fails.
//! Then the manifest is read from storage and checked (see the controller), and the Job starts.

use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use pgkube_crds::{
    BackupPhase, InstanceRole, PostgreSQLBackup, PostgreSQLCluster, PostgreSQLRestore,
    RestorePhase, S3Storage,
};

use crate::backup::decide::{Reason, manifest_key, resolved_prefix};
use crate::storage::keys::MANIFEST_FILE;

/// The next step for a restore.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    /// Completed or Failed: nothing more to do.
    Finished,
    /// The Job exists: follow it.
    Follow,
    /// Stay Pending, and look again later.
    Wait(Reason),
    /// Refused, or waited too long: Failed.
    Fail(Reason),
    /// Read the manifest at this location, check it against the cluster, then start the Job.
    Start(Box<Location>),
}

/// Where the backup to restore is.
#[derive(Clone, Debug, PartialEq)]
pub struct Location {
    pub storage: S3Storage,
    /// The key prefix of the backup's cluster (for a source: what is before its directory).
    pub prefix: String,
    /// The backup's name (for a source: the segment before `manifest.json`).
    pub backup_name: String,
    /// The key of the backup's manifest, which lists every object's key (see `storage::keys`).
    pub manifest_key: String,
}

/// What the restore was decided from.
#[derive(Clone, Copy, Debug)]
pub struct Facts<'a> {
    /// The PostgreSQLBackup the restore names, as read now (`None`: not found, or the restore
    /// names a source instead).
    pub backup: Option<&'a PostgreSQLBackup>,
    /// The target cluster, as read now (`None`: not found).
    pub cluster: Option<&'a PostgreSQLCluster>,
    /// The restores of the namespace.
    pub restores: &'a [&'a PostgreSQLRestore],
    /// The backups of the namespace.
    pub backups: &'a [&'a PostgreSQLBackup],
}

/// Decides the next step of `restore`.
pub fn next(
    restore: &PostgreSQLRestore,
    facts: Facts<'_>,
    now: DateTime<Utc>,
    pending_deadline: Duration,
) -> Next {
    match phase(restore) {
        Some(RestorePhase::Completed | RestorePhase::Failed) => return Next::Finished,
        Some(RestorePhase::Running) => return Next::Follow,
        Some(RestorePhase::Pending) | None => {}
    }
    let location = match location(restore, facts.backup) {
        Ok(location) => location,
        Err(Blocked::Refused(reason)) => return Next::Fail(reason),
        Err(Blocked::Waiting(reason)) => return waiting(restore, reason, now, pending_deadline),
    };
    if let (Some(backup), Some(cluster)) = (facts.backup, facts.cluster) {
        let version = backup
            .status
            .as_ref()
            .and_then(|s| s.postgres_version.as_deref());
        if let Some(refusal) = version.and_then(|v| newer_major(v, cluster)) {
            return Next::Fail(refusal);
        }
    }
    match blocker(restore, facts) {
        Some(reason) => waiting(restore, reason, now, pending_deadline),
        None => Next::Start(Box::new(location)),
    }
}

pub fn phase(restore: &PostgreSQLRestore) -> Option<RestorePhase> {
    restore.status.as_ref().and_then(|status| status.phase)
}

/// Whether the restore has not ended (and is not being deleted).
pub fn is_unfinished(restore: &PostgreSQLRestore) -> bool {
    restore.metadata.deletion_timestamp.is_none()
        && !matches!(
            phase(restore),
            Some(RestorePhase::Completed | RestorePhase::Failed)
        )
}

/// The refusal of a backup made by PostgreSQL `backup_version` (for example `15.14`, or
/// `16.4 (Debian 16.4-1)`) for `cluster`, when its major is newer than the cluster's:
/// `pg_restore` cannot read a newer server's dump. An unreadable version is not refused here;
/// `pg_restore` says so itself.
pub fn newer_major(backup_version: &str, cluster: &PostgreSQLCluster) -> Option<Reason> {
    let digits: String = backup_version
        .trim()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let backup_major: u32 = digits.parse().ok()?;
    let cluster_major = cluster.spec.version.major();
    (backup_major > cluster_major).then(|| {
        Reason::new(
            "NewerMajor",
            format!(
                "the backup was taken from PostgreSQL {backup_version} (major {backup_major}), \
                 newer than PostgreSQL {cluster_major} of PostgreSQLCluster {}: pg_restore \
                 cannot restore it",
                cluster.name_any()
            ),
        )
    })
}

/// Why a restore cannot go on yet (or ever).
enum Blocked {
    Refused(Reason),
    Waiting(Reason),
}

/// Where the backup is, from the named PostgreSQLBackup or from the source.
fn location(
    restore: &PostgreSQLRestore,
    backup: Option<&PostgreSQLBackup>,
) -> Result<Location, Blocked> {
    if let Some(source) = &restore.spec.source {
        return source_location(&source.s3, &source.object_key).map_err(Blocked::Refused);
    }
    let name = restore
        .spec
        .backup
        .as_ref()
        .map(|b| b.name.clone())
        .unwrap_or_default();
    let Some(backup) = backup else {
        return Err(Blocked::Refused(Reason::new(
            "BackupNotFound",
            format!("PostgreSQLBackup {name} does not exist"),
        )));
    };
    let status = backup.status.clone().unwrap_or_default();
    match status.phase {
        Some(BackupPhase::Completed) => {}
        Some(BackupPhase::Failed) => {
            return Err(Blocked::Refused(Reason::new(
                "BackupFailed",
                format!(
                    "PostgreSQLBackup {name} failed: {}",
                    status.message.unwrap_or_default()
                ),
            )));
        }
        _ => {
            return Err(Blocked::Waiting(Reason::new(
                "BackupNotCompleted",
                format!("PostgreSQLBackup {name} has not completed yet"),
            )));
        }
    }
    let Some(storage) = status.storage else {
        return Err(Blocked::Refused(Reason::new(
            "BackupNotFound",
            format!("PostgreSQLBackup {name} records no storage"),
        )));
    };
    let prefix = resolved_prefix(&storage, backup);
    let manifest_key = manifest_key(backup).unwrap_or_default();
    Ok(Location {
        storage,
        prefix,
        backup_name: name,
        manifest_key,
    })
}

/// The location of the manifest at `key`, `<directory>/manifest.json`, in either layout (see
/// `storage::keys`); the agent reads it there, and the objects at the keys it lists.
pub fn source_location(storage: &S3Storage, key: &str) -> Result<Location, Reason> {
    let invalid = || {
        Reason::new(
            "InvalidSource",
            format!(
                "source.objectKey {key:?} is not a manifest key: it must be \
                 <directory>/{MANIFEST_FILE}"
            ),
        )
    };
    let root = key
        .strip_suffix(MANIFEST_FILE)
        .and_then(|root| root.strip_suffix('/'))
        .ok_or_else(invalid)?;
    let (prefix, backup_name) = match root.rsplit_once('/') {
        Some((prefix, name)) => (prefix, name),
        None => ("", root),
    };
    if backup_name.is_empty() || backup_name == "." || backup_name == ".." {
        return Err(invalid());
    }
    Ok(Location {
        storage: storage.clone(),
        prefix: prefix.to_owned(),
        backup_name: backup_name.to_owned(),
        manifest_key: key.to_owned(),
    })
}

/// What the target cluster, the other restores or a running backup hold the restore for.
fn blocker(restore: &PostgreSQLRestore, facts: Facts<'_>) -> Option<Reason> {
    let cluster_name = &restore.spec.cluster.name;
    let Some(cluster) = facts.cluster else {
        return Some(Reason::new(
            "ClusterNotFound",
            format!("PostgreSQLCluster {cluster_name} does not exist"),
        ));
    };
    if let Some(why) = not_ready(cluster) {
        return Some(Reason::new(
            "ClusterNotReady",
            format!("PostgreSQLCluster {cluster_name} {why}"),
        ));
    }
    if let Some(first) = first_unfinished(restore, facts.restores) {
        return Some(Reason::new(
            "WaitingForRestore",
            format!("restore {first} into the same cluster runs first (one restore at a time)"),
        ));
    }
    let running_backup = facts
        .backups
        .iter()
        .filter(|b| &b.spec.cluster.name == cluster_name)
        .find(|b| b.status.as_ref().and_then(|s| s.phase) == Some(BackupPhase::Running));
    running_backup.map(|backup| {
        Reason::new(
            "WaitingForBackup",
            format!(
                "backup {} of the cluster is running; the restore starts once it ends",
                backup.name_any()
            ),
        )
    })
}

/// Why `cluster` cannot take a restore yet: a restore needs a ready primary (the replicas
/// follow it). Not the Running phase: a cluster that bootstraps from a backup runs only after
/// its restore.
fn not_ready(cluster: &PostgreSQLCluster) -> Option<&'static str> {
    let Some(status) = cluster.status.as_ref() else {
        return Some("has no ready primary yet");
    };
    let primary = status.current_primary.as_deref();
    let primary_ready = status
        .instances
        .iter()
        .any(|i| Some(i.name.as_str()) == primary && i.role == InstanceRole::Primary && i.ready);
    (!primary_ready).then_some("has no ready primary yet")
}

/// The restore into the same cluster that goes before `restore`, if one is unfinished: a
/// Running one, or an older unfinished one (by creation time, then name).
fn first_unfinished(restore: &PostgreSQLRestore, others: &[&PostgreSQLRestore]) -> Option<String> {
    let key = |r: &PostgreSQLRestore| (r.creation_timestamp().map(|t| t.0), r.name_any());
    others
        .iter()
        .filter(|other| other.spec.cluster.name == restore.spec.cluster.name)
        .filter(|other| other.name_any() != restore.name_any())
        .filter(|other| is_unfinished(other))
        .filter(|other| phase(other) == Some(RestorePhase::Running) || key(other) < key(restore))
        .map(|other| other.name_any())
        .min()
}

fn waiting(
    restore: &PostgreSQLRestore,
    reason: Reason,
    now: DateTime<Utc>,
    pending_deadline: Duration,
) -> Next {
    match wait_or_time_out(restore, reason, now, pending_deadline) {
        Ok(wait) => Next::Wait(wait),
        Err(refusal) => Next::Fail(refusal),
    }
}

/// `Ok(reason)` to wait for it, or, once the restore has waited past `pending_deadline`,
/// `Err` with the reason it fails with.
pub fn wait_or_time_out(
    restore: &PostgreSQLRestore,
    reason: Reason,
    now: DateTime<Utc>,
    pending_deadline: Duration,
) -> Result<Reason, Reason> {
    if crate::age(restore, now) > pending_deadline {
        Err(Reason::new(
            "PendingTimeout",
            format!(
                "waited more than {}s to start: {}",
                pending_deadline.as_secs(),
                reason.message
            ),
        ))
    } else {
        Ok(reason)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use pgkube_crds::{
        InstanceStatus, LocalReference, PostgreSQLBackupSpec, PostgreSQLBackupStatus,
        PostgreSQLClusterSpec, PostgreSQLClusterStatus, PostgreSQLRestoreSpec,
        PostgreSQLRestoreStatus, PostgresVersion, RestoreSource,
    };

    use super::*;

    const DEADLINE: Duration = Duration::from_secs(600);

    fn at(second: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_800_000_000 + second, 0).expect("time")
    }

    fn created(second: i64) -> Time {
        Time(Timestamp::from_second(1_800_000_000 + second).expect("time"))
    }

    fn storage() -> S3Storage {
        S3Storage {
            bucket: "backups".to_owned(),
            ..S3Storage::default()
        }
    }

    fn restore(name: &str, second: i64, phase: Option<RestorePhase>) -> PostgreSQLRestore {
        let mut restore = PostgreSQLRestore::new(
            name,
            PostgreSQLRestoreSpec {
                backup: Some(LocalReference {
                    name: "nightly".to_owned(),
                }),
                source: None,
                cluster: LocalReference {
                    name: "main".to_owned(),
                },
                databases: Vec::new(),
                drop_existing: false,
                expected_system_identifier: None,
            },
        );
        restore.metadata.namespace = Some("db".to_owned());
        restore.metadata.creation_timestamp = Some(created(second));
        restore.status = phase.map(|phase| PostgreSQLRestoreStatus {
            phase: Some(phase),
            ..PostgreSQLRestoreStatus::default()
        });
        restore
    }

    fn backup(phase: BackupPhase, version: &str) -> PostgreSQLBackup {
        let mut backup = PostgreSQLBackup::new(
            "nightly",
            PostgreSQLBackupSpec {
                cluster: LocalReference {
                    name: "main".to_owned(),
                },
                method: Default::default(),
                deletion_policy: Default::default(),
                compression: None,
            },
        );
        backup.metadata.namespace = Some("db".to_owned());
        backup.status = Some(PostgreSQLBackupStatus {
            phase: Some(phase),
            storage: Some(storage()),
            object_key: Some("db/main/c-uid/nightly/b-uid/manifest.json".to_owned()),
            postgres_version: Some(version.to_owned()),
            message: Some("the store refused".to_owned()),
            ..PostgreSQLBackupStatus::default()
        });
        backup
    }

    fn cluster(version: PostgresVersion, primary_ready: bool) -> PostgreSQLCluster {
        let mut spec: PostgreSQLClusterSpec =
            serde_json::from_value(serde_json::json!({"storage": "1Gi"})).expect("spec");
        spec.version = version;
        let mut cluster = PostgreSQLCluster::new("main", spec);
        cluster.status = Some(PostgreSQLClusterStatus {
            current_primary: Some("main-0".to_owned()),
            instances: vec![InstanceStatus {
                name: "main-0".to_owned(),
                role: InstanceRole::Primary,
                ready: primary_ready,
                timeline: None,
                lag_bytes: None,
                streaming: None,
                message: None,
            }],
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

    fn decide(
        restore: &PostgreSQLRestore,
        backup: Option<&PostgreSQLBackup>,
        cluster: Option<&PostgreSQLCluster>,
        now: i64,
    ) -> Next {
        let facts = Facts {
            backup,
            cluster,
            restores: &[],
            backups: &[],
        };
        next(restore, facts, at(now), DEADLINE)
    }

    #[test]
    fn a_completed_backup_into_a_ready_cluster_starts_at_the_backups_manifest() {
        let r = restore("r1", 0, None);
        let b = backup(BackupPhase::Completed, "15.14");
        let c = cluster(PostgresVersion::V15, true);
        let Next::Start(location) = decide(&r, Some(&b), Some(&c), 5) else {
            panic!("starts");
        };
        assert_eq!(location.prefix, "db/main");
        assert_eq!(location.backup_name, "nightly");
        assert_eq!(
            location.manifest_key,
            "db/main/c-uid/nightly/b-uid/manifest.json"
        );
    }

    #[test]
    fn a_backup_from_before_the_uids_in_the_keys_is_restored_from_its_legacy_key() {
        let (r, c) = (restore("r1", 0, None), cluster(PostgresVersion::V15, true));
        for recorded in [Some("db/main/nightly/manifest.json".to_owned()), None] {
            let mut legacy = backup(BackupPhase::Completed, "15.14");
            legacy.status.as_mut().expect("status").object_key = recorded;
            let next = decide(&r, Some(&legacy), Some(&c), 5);
            let Next::Start(location) = next else {
                panic!("starts: {next:?}")
            };
            assert_eq!(location.manifest_key, "db/main/nightly/manifest.json");
        }
    }

    #[test]
    fn unusable_backups_are_refused_at_once() {
        let r = restore("r1", 0, None);
        let c = cluster(PostgresVersion::V15, true);
        assert_eq!(
            reason(&decide(&r, None, Some(&c), 5)),
            Some("BackupNotFound")
        );
        let failed = backup(BackupPhase::Failed, "15.14");
        let Next::Fail(refusal) = decide(&r, Some(&failed), Some(&c), 5) else {
            panic!("refused");
        };
        assert_eq!(refusal.reason, "BackupFailed");
        assert!(refusal.message.contains("the store refused"));
        let newer = backup(BackupPhase::Completed, "16.4 (Debian 16.4-1)");
        let Next::Fail(refusal) = decide(&r, Some(&newer), Some(&c), 5) else {
            panic!("refused");
        };
        assert_eq!(refusal.reason, "NewerMajor");
        assert!(refusal.message.contains("major 16"), "{}", refusal.message);
        assert!(
            refusal.message.contains("PostgreSQL 15"),
            "{}",
            refusal.message
        );
        // An older major restores into a newer server.
        let older = backup(BackupPhase::Completed, "14.9");
        let newer_cluster = cluster(PostgresVersion::V16, true);
        assert!(matches!(
            decide(&r, Some(&older), Some(&newer_cluster), 5),
            Next::Start(_)
        ));
    }

    #[test]
    fn it_waits_for_the_backup_and_the_cluster_then_times_out() {
        let r = restore("r1", 0, None);
        let running = backup(BackupPhase::Running, "15.14");
        let ready = cluster(PostgresVersion::V15, true);
        assert_eq!(
            reason(&decide(&r, Some(&running), Some(&ready), 5)),
            Some("BackupNotCompleted")
        );
        let b = backup(BackupPhase::Completed, "15.14");
        assert_eq!(
            reason(&decide(&r, Some(&b), None, 5)),
            Some("ClusterNotFound")
        );
        let starting = cluster(PostgresVersion::V15, false);
        assert_eq!(
            reason(&decide(&r, Some(&b), Some(&starting), 5)),
            Some("ClusterNotReady")
        );
        let Next::Fail(late) = decide(&r, Some(&b), None, 601) else {
            panic!("timed out");
        };
        assert_eq!(late.reason, "PendingTimeout");
        assert!(late.message.contains("main does not exist"));
    }

    #[test]
    fn one_restore_at_a_time_and_never_during_a_backup() {
        let b = backup(BackupPhase::Completed, "15.14");
        let c = cluster(PostgresVersion::V15, true);
        let old = restore("old", 0, Some(RestorePhase::Pending));
        let new = restore("new", 10, None);
        let restores = [&old, &new];
        let decide = |restore: &PostgreSQLRestore, backups: &[&PostgreSQLBackup]| {
            let facts = Facts {
                backup: Some(&b),
                cluster: Some(&c),
                restores: &restores,
                backups,
            };
            next(restore, facts, at(20), DEADLINE)
        };
        assert!(matches!(decide(&old, &[]), Next::Start(_)));
        assert_eq!(reason(&decide(&new, &[])), Some("WaitingForRestore"));
        let running = backup(BackupPhase::Running, "15.14");
        assert_eq!(reason(&decide(&old, &[&running])), Some("WaitingForBackup"));
        let done = restore("done", 30, Some(RestorePhase::Completed));
        assert_eq!(decide(&done, &[]), Next::Finished);
        let following = restore("following", 30, Some(RestorePhase::Running));
        assert_eq!(decide(&following, &[]), Next::Follow);
    }

    #[test]
    fn a_source_must_name_a_manifest_key() {
        let location =
            source_location(&storage(), "team/main/nightly/manifest.json").expect("a manifest key");
        assert_eq!(
            (location.prefix.as_str(), location.backup_name.as_str()),
            ("team/main", "nightly")
        );
        let top = source_location(&storage(), "nightly/manifest.json").expect("no prefix");
        assert_eq!(
            (top.prefix.as_str(), top.backup_name.as_str()),
            ("", "nightly")
        );
        for bad in [
            "team/main/nightly",
            "manifest.json",
            "a/../manifest.json",
            "a/xmanifest.json",
        ] {
            assert_eq!(
                source_location(&storage(), bad)
                    .map(|_| ())
                    .map_err(|r| r.reason),
                Err("InvalidSource"),
                "{bad}"
            );
        }
        let mut from_source = restore("r1", 0, None);
        from_source.spec.backup = None;
        from_source.spec.source = Some(RestoreSource {
            s3: storage(),
            object_key: "elsewhere/manifest".to_owned(),
        });
        assert_eq!(
            reason(&decide(&from_source, None, None, 5)),
            Some("InvalidSource")
        );
    }
}
