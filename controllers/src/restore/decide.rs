//! What a restore needs next, decided from what was read (pure).
//!
//! A restore is refused (Failed at once, no Job) when what it restores cannot be used: the
//! named backup does not exist or failed, the source's key is not a manifest key, or the backup
//! was taken from a newer PostgreSQL major than the target cluster runs. It waits (Pending, with
//! a reason) while the named backup has not ended, while the target cluster is missing or has
//! no ready primary, while another restore into the cluster goes first (one at a time, the
//! oldest first), while a backup of the cluster runs, and while the database the restore must
//! find in the cluster is not known (see [`identity`](super::identity)); after the pending
//! deadline it fails. Then the manifest is read from storage and checked (see the controller),
//! the identifier the Job checks is recorded in the status, and the Job starts.

use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use pgkube_crds::{
    BackupMethod, BackupPhase, InstanceRole, PostgreSQLBackup, PostgreSQLCluster,
    PostgreSQLRestore, RestoreMethod, RestorePhase, S3Storage,
};

use crate::backup::decide::{Reason, manifest_key, resolved_prefix};
use crate::storage::keys::MANIFEST_FILE;

use super::identity::{self, Expectation};

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
    /// Read the manifest at this location, check it against the cluster, record the target,
    /// then start the Job.
    Start(Box<Start>),
    /// An in-place point-in-time recovery: the cluster carries it out once the restore is
    /// Running, and must find this database (the system identifier recorded before).
    StartInPlace(String),
}

/// What a restore that may start restores, and into which database.
#[derive(Clone, Debug, PartialEq)]
pub struct Start {
    pub location: Location,
    /// What the Job checks the target's database against, for `status.targetSystemIdentifier`:
    /// a system identifier, or `Any`.
    pub target_system_identifier: String,
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
    if restore.spec.method == RestoreMethod::PointInTime {
        return next_in_place(restore, facts, now, pending_deadline);
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
    let cluster = match ready_cluster(restore, facts) {
        Ok(cluster) => cluster,
        Err(reason) => return waiting(restore, reason, now, pending_deadline),
    };
    match identity::expectation(restore, cluster) {
        Expectation::Known(target_system_identifier) => Next::Start(Box::new(Start {
            location,
            target_system_identifier,
        })),
        Expectation::Unknown(reason) => waiting(restore, reason, now, pending_deadline),
        Expectation::Invalid(reason) => Next::Fail(reason),
    }
}

/// A PointInTime restore: a named backup must be a Completed physical backup (which backup
/// and whether the target is in the window, the cluster finds out from storage); the cluster
/// must archive its WAL, be ready, and hold the expected database.
fn next_in_place(
    restore: &PostgreSQLRestore,
    facts: Facts<'_>,
    now: DateTime<Utc>,
    pending_deadline: Duration,
) -> Next {
    if let Some(name) = restore.spec.backup.as_ref().map(|b| &b.name) {
        if let Err(blocked) = location(restore, facts.backup) {
            return match blocked {
                Blocked::Refused(reason) => Next::Fail(reason),
                Blocked::Waiting(reason) => waiting(restore, reason, now, pending_deadline),
            };
        }
        if facts
            .backup
            .is_some_and(|b| b.spec.method != BackupMethod::Physical)
        {
            return Next::Fail(Reason::new(
                "NotPhysical",
                format!(
                    "PostgreSQLBackup {name} is not a physical backup: a point-in-time recovery starts from a base backup (method: Physical)"
                ),
            ));
        }
    }
    let cluster = match ready_cluster(restore, facts) {
        Ok(cluster) => cluster,
        Err(reason) => return waiting(restore, reason, now, pending_deadline),
    };
    if crate::cluster::validate::archive_root(cluster).is_none() {
        return Next::Fail(Reason::new(
            "NoArchive",
            format!(
                "PostgreSQLCluster {} does not archive its WAL (spec.backup.storage with walArchiving): there is nothing to recover from",
                cluster.name_any()
            ),
        ));
    }
    let recorded = cluster
        .status
        .as_ref()
        .and_then(|s| s.system_identifier.as_deref());
    match identity::expectation(restore, cluster) {
        Expectation::Known(target)
            if target != pgkube_crds::ANY_SYSTEM_IDENTIFIER
                && Some(target.as_str()) != recorded =>
        {
            Next::Fail(Reason::new(
                identity::SYSTEM_IDENTIFIER_MISMATCH,
                format!(
                    "PostgreSQLCluster {} holds database {}, not {target} as spec.expectedSystemIdentifier says: nothing is recovered",
                    cluster.name_any(),
                    recorded.unwrap_or("(not recorded yet)")
                ),
            ))
        }
        Expectation::Known(target) => Next::StartInPlace(target),
        Expectation::Unknown(reason) => waiting(restore, reason, now, pending_deadline),
        Expectation::Invalid(reason) => Next::Fail(reason),
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
    let cluster_major = cluster.spec.postgres_version.major();
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
        return source_location(&source.storage.s3, &source.object_key).map_err(Blocked::Refused);
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
    let Some(storage) = status.storage.map(|s| s.s3) else {
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

/// The target cluster, unless it, the other restores or a running backup hold the restore:
/// then what holds it.
fn ready_cluster<'a>(
    restore: &PostgreSQLRestore,
    facts: Facts<'a>,
) -> Result<&'a PostgreSQLCluster, Reason> {
    let cluster_name = &restore.spec.cluster.name;
    let Some(cluster) = facts.cluster else {
        return Err(Reason::new(
            "ClusterNotFound",
            format!("PostgreSQLCluster {cluster_name} does not exist"),
        ));
    };
    if let Some(why) = not_ready(cluster) {
        return Err(Reason::new(
            "ClusterNotReady",
            format!("PostgreSQLCluster {cluster_name} {why}"),
        ));
    }
    if let Some(first) = first_unfinished(restore, facts.restores) {
        return Err(Reason::new(
            "WaitingForRestore",
            format!("restore {first} into the same cluster runs first (one restore at a time)"),
        ));
    }
    let running_backup = facts
        .backups
        .iter()
        .filter(|b| &b.spec.cluster.name == cluster_name)
        .find(|b| b.status.as_ref().and_then(|s| s.phase) == Some(BackupPhase::Running));
    match running_backup {
        Some(backup) => Err(Reason::new(
            "WaitingForBackup",
            format!(
                "backup {} of the cluster is running; the restore starts once it ends",
                backup.name_any()
            ),
        )),
        None => Ok(cluster),
    }
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
mod tests;
