//! What the cron engine decides, from objects and a given `now` (pure).
//!
//! - [`Plan::of`]: what a cluster's spec asks for (no schedule, suspended, invalid, active);
//! - [`first_floor`] and [`due`]: which scheduled time, if any, runs now ([`last_come`]: the
//!   latest that came, for the metric). Times at or before
//!   the floor never run; the floor starts at the cluster's `lastScheduledBackup` (else its
//!   creation) when the engine first sees the cluster, so that after downtime only the latest
//!   missed time runs (at most one catch-up), and moves to `now` when the schedule changes;
//! - [`decide`]: what a due time does: nothing more when its backup exists, a skip while a
//!   backup or a restore of the cluster is unfinished or no storage is set, else a new backup;
//! - [`desired_backup`]: the PostgreSQLBackup a scheduled time creates (with the cluster's
//!   compression of the moment in its own spec);
//! - [`SchedulerStatus`]: the status fields the engine owns, and whether they changed.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::{Resource, ResourceExt};
use pgkube_crds::{
    BackupCompression, BackupMethod, BackupPhase, BackupSpec, CLUSTER_LABEL, DeletionPolicy,
    LocalReference, PostgreSQLBackup, PostgreSQLBackupSpec, PostgreSQLCluster, PostgreSQLRestore,
    RestorePhase, SCHEDULED_LABEL, SCHEDULED_TIME_ANNOTATION,
};

use super::parse::{Schedule, ScheduleError};
use crate::names::label_value;

/// Type of the condition the engine owns on the cluster.
pub const CONDITION: &str = "BackupScheduled";

/// What a cluster's spec asks of the engine.
#[derive(Clone, Debug)]
pub enum Plan {
    /// No `spec.backup`.
    None,
    /// `spec.backup.schedule.suspend: true`.
    Suspended,
    /// The schedule or time zone is refused.
    Invalid(ScheduleError),
    /// Backups run on this schedule.
    Active(Box<Schedule>),
}

impl Plan {
    pub fn of(cluster: &PostgreSQLCluster) -> Self {
        match &cluster.spec.backup {
            None => Self::None,
            Some(backup) if backup.schedule.suspend => Self::Suspended,
            Some(backup) => {
                match Schedule::parse(&backup.schedule.cron, backup.schedule.time_zone.as_deref()) {
                    Ok(schedule) => Self::Active(Box::new(schedule)),
                    Err(error) => Self::Invalid(error),
                }
            }
        }
    }
}

/// What identifies a schedule: when it changes, the floor moves to `now` (no catch-up of the
/// new schedule's past).
pub fn schedule_key(cluster: &PostgreSQLCluster) -> Option<(String, Option<String>, bool)> {
    let schedule = &cluster.spec.backup.as_ref()?.schedule;
    Some((
        schedule.cron.clone(),
        schedule.time_zone.clone(),
        schedule.suspend,
    ))
}

/// The floor when the engine first sees a cluster: its last scheduled time, else its
/// creation, else `now`.
pub fn first_floor(cluster: &PostgreSQLCluster, now: DateTime<Utc>) -> DateTime<Utc> {
    last_scheduled(cluster)
        .or_else(|| cluster.metadata.creation_timestamp.as_ref().map(to_chrono))
        .unwrap_or(now)
}

/// The cluster's `status.lastScheduledBackup`.
pub fn last_scheduled(cluster: &PostgreSQLCluster) -> Option<DateTime<Utc>> {
    cluster
        .status
        .as_ref()?
        .last_scheduled_backup
        .as_ref()
        .map(to_chrono)
}

/// The scheduled time to run now: the latest one at or before `now`, if it is after `floor`.
/// However many were missed, only that one runs.
pub fn due(schedule: &Schedule, floor: DateTime<Utc>, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    schedule
        .latest_at_or_before(now)
        .filter(|latest| *latest > floor)
}

/// The latest scheduled time that has come since the schedule started (`floor`: a time
/// handled counts as come), for `pgkube_backup_last_scheduled_timestamp_seconds`: unlike
/// [`due`], it stays once handled, and moves on when a time could not be handled.
pub fn last_come(
    schedule: &Schedule,
    floor: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    schedule
        .latest_at_or_before(now)
        .filter(|latest| *latest >= floor)
}

/// Why a scheduled time made no backup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    BackupRunning,
    RestoreRunning,
    NoStorage,
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BackupRunning => "BackupRunning",
            Self::RestoreRunning => "RestoreRunning",
            Self::NoStorage => "NoStorage",
        }
    }
}

/// What a due scheduled time does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Its backup exists already (made by an earlier try or another manager).
    AlreadyMade,
    /// No backup this time; `detail` says which object is in the way.
    Skip { reason: SkipReason, detail: String },
    /// Create the backup.
    Create,
}

/// What to do for `cluster`'s time whose backup is named `name`, given the namespace's
/// backups and restores.
pub fn decide(
    cluster: &PostgreSQLCluster,
    name: &str,
    backups: &[&PostgreSQLBackup],
    restores: &[&PostgreSQLRestore],
) -> Decision {
    let cluster_name = cluster.name_any();
    let namespace = cluster.namespace();
    let same_cluster = |ns: Option<String>, target: &str| ns == namespace && target == cluster_name;
    let ours: Vec<&&PostgreSQLBackup> = backups
        .iter()
        .filter(|b| same_cluster(b.namespace(), &b.spec.cluster.name))
        .collect();
    if ours.iter().any(|b| b.name_any() == name) {
        return Decision::AlreadyMade;
    }
    let config = cluster.spec.backup.as_ref();
    if config
        .and_then(|c: &BackupSpec| c.storage.as_ref())
        .is_none()
    {
        return Decision::Skip {
            reason: SkipReason::NoStorage,
            detail: "spec.backup.storage is not set: there is nowhere to store a backup".to_owned(),
        };
    }
    if let Some(running) = ours.iter().find(|b| backup_unfinished(b)) {
        return Decision::Skip {
            reason: SkipReason::BackupRunning,
            detail: format!("backup {} has not finished", running.name_any()),
        };
    }
    let restoring = restores
        .iter()
        .filter(|r| same_cluster(r.namespace(), &r.spec.cluster.name))
        .find(|r| restore_unfinished(r));
    if let Some(restore) = restoring {
        return Decision::Skip {
            reason: SkipReason::RestoreRunning,
            detail: format!(
                "restore {} into the cluster has not finished",
                restore.name_any()
            ),
        };
    }
    Decision::Create
}

/// Neither Completed nor Failed (no status yet counts as unfinished); one being deleted does
/// not count, it will not run any more.
fn backup_unfinished(backup: &PostgreSQLBackup) -> bool {
    let phase = backup.status.as_ref().and_then(|s| s.phase);
    backup.metadata.deletion_timestamp.is_none()
        && !matches!(phase, Some(BackupPhase::Completed | BackupPhase::Failed))
}

fn restore_unfinished(restore: &PostgreSQLRestore) -> bool {
    let phase = restore.status.as_ref().and_then(|s| s.phase);
    restore.metadata.deletion_timestamp.is_none()
        && !matches!(phase, Some(RestorePhase::Completed | RestorePhase::Failed))
}

/// The backup `cluster`'s scheduled time `at` creates, named `name`.
///
/// Its owner reference to the cluster is not a controller reference: the backup's controller
/// is the backup controller, not the cluster's, and a controller reference would let a
/// cluster controller `.owns()`-watching backups claim objects it does not manage. The owner
/// reference only ties the object's lifetime to the cluster (the garbage collector removes the
/// object with the cluster); its data stays, as the deletion policy is Retain.
pub fn desired_backup(
    cluster: &PostgreSQLCluster,
    name: &str,
    at: DateTime<Utc>,
) -> PostgreSQLBackup {
    let cluster_name = cluster.name_any();
    let labels = BTreeMap::from([
        (CLUSTER_LABEL.to_owned(), label_value(&cluster_name)),
        (SCHEDULED_LABEL.to_owned(), "true".to_owned()),
    ]);
    let annotations = BTreeMap::from([(SCHEDULED_TIME_ANNOTATION.to_owned(), rfc3339(at))]);
    let owner = OwnerReference {
        api_version: PostgreSQLCluster::api_version(&()).into_owned(),
        kind: PostgreSQLCluster::kind(&()).into_owned(),
        name: cluster_name.clone(),
        uid: cluster.uid().unwrap_or_default(),
        controller: None,
        block_owner_deletion: None,
    };
    PostgreSQLBackup {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: cluster.namespace(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: PostgreSQLBackupSpec {
            cluster: LocalReference { name: cluster_name },
            method: scheduled_method(cluster),
            target: None,
            deletion_policy: DeletionPolicy::Retain,
            compression: Some(scheduled_compression(cluster)),
        },
        status: None,
    }
}

/// The method of `cluster`'s scheduled backups: its `backup.method`, else `Logical`. Written
/// into the backup (immutable) as the compression is.
fn scheduled_method(cluster: &PostgreSQLCluster) -> BackupMethod {
    cluster
        .spec
        .backup
        .as_ref()
        .and_then(|backup| backup.method)
        .unwrap_or_default()
}

/// The compression a scheduled backup of `cluster` carries in its own spec: the cluster's
/// `backup.compression` as it is when the backup is created, else the default (zstd at the
/// agent's level), resolved then and there. Written into the backup (whose spec is immutable),
/// so that a later change of the cluster's setting, or of the default, does not change how a
/// backup already scheduled is taken, nor what its spec says it was.
fn scheduled_compression(cluster: &PostgreSQLCluster) -> BackupCompression {
    cluster
        .spec
        .backup
        .as_ref()
        .and_then(|backup| backup.compression)
        .unwrap_or_default()
}

/// The engine's fields of the cluster status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulerStatus {
    pub last: Option<DateTime<Utc>>,
    pub next: Option<DateTime<Utc>>,
    /// The `BackupScheduled` condition: status, reason, message (none without `spec.backup`).
    pub condition: Option<(&'static str, &'static str, String)>,
}

impl SchedulerStatus {
    /// The fields for `plan`, with the last handled time and the next one.
    pub fn of(plan: &Plan, last: Option<DateTime<Utc>>, next: Option<DateTime<Utc>>) -> Self {
        let condition = match plan {
            Plan::None => None,
            Plan::Suspended => Some((
                "False",
                "Suspended",
                "Scheduled backups are suspended (spec.backup.suspend)".to_owned(),
            )),
            Plan::Invalid(error) => Some(("False", "InvalidSchedule", error.0.clone())),
            Plan::Active(_) => Some((
                "True",
                "Scheduled",
                match next {
                    Some(next) => format!("Next scheduled backup at {}", rfc3339(next)),
                    None => "The schedule has no future occurrence".to_owned(),
                },
            )),
        };
        let next = if matches!(plan, Plan::Active(_)) {
            next
        } else {
            None
        };
        Self {
            last,
            next,
            condition,
        }
    }

    /// Whether the cluster's status shows other values for these fields (transition times and
    /// observed generations aside).
    pub fn differs_from(&self, cluster: &PostgreSQLCluster) -> bool {
        let status = cluster.status.clone().unwrap_or_default();
        let shown = status.conditions.iter().find(|c| c.type_ == CONDITION);
        let condition_differs = match (&self.condition, shown) {
            (None, None) => false,
            (Some((state, reason, message)), Some(shown)) => {
                shown.status != *state || shown.reason != *reason || shown.message != *message
            }
            _ => true,
        };
        condition_differs
            || self.last != status.last_scheduled_backup.as_ref().map(to_chrono)
            || self.next != status.next_scheduled_backup.as_ref().map(to_chrono)
    }

    /// The server-side apply body of the status: only the engine's fields, so that its field
    /// manager owns exactly those. The condition keeps its transition time while its status
    /// stays the same.
    pub fn apply_body(&self, cluster: &PostgreSQLCluster, now: DateTime<Utc>) -> serde_json::Value {
        let mut status = serde_json::Map::new();
        if let Some(last) = self.last {
            status.insert("lastScheduledBackup".into(), rfc3339(last).into());
        }
        if let Some(next) = self.next {
            status.insert("nextScheduledBackup".into(), rfc3339(next).into());
        }
        if let Some((state, reason, message)) = &self.condition {
            let shown = cluster
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION));
            let since = shown
                .filter(|c| c.status == *state)
                .map(|c| to_chrono(&c.last_transition_time))
                .unwrap_or(now);
            let mut condition = serde_json::json!({
                "type": CONDITION,
                "status": state,
                "reason": reason,
                "message": message,
                "lastTransitionTime": rfc3339(since),
            });
            if let Some(generation) = cluster.metadata.generation {
                condition["observedGeneration"] = generation.into();
            }
            status.insert("conditions".into(), serde_json::json!([condition]));
        }
        serde_json::json!({
            "apiVersion": PostgreSQLCluster::api_version(&()),
            "kind": PostgreSQLCluster::kind(&()),
            "status": status,
        })
    }
}

/// RFC 3339 in UTC, whole seconds: `2025-01-01T03:00:00Z`.
pub fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// A Kubernetes time as a chrono time (whole seconds, as the API server keeps them).
pub fn to_chrono(time: &Time) -> DateTime<Utc> {
    DateTime::from_timestamp(time.0.as_second(), 0).unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}

#[cfg(test)]
mod tests;
