//! What the cron engine decides, from objects and a given `now` (pure).
//!
//! - [`Plan::of`]: what a cluster's spec asks for (no schedule, suspended, invalid, active);
//! - [`first_floor`] and [`due`]: which scheduled time, if any, runs now. Times at or before
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
            method: BackupMethod::Logical,
            deletion_policy: DeletionPolicy::Retain,
            compression: Some(scheduled_compression(cluster)),
        },
        status: None,
    }
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
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use k8s_openapi::jiff::Timestamp;
    use pgkube_crds::{BackupStorage, CompressionMethod, PostgreSQLRestoreStatus};
    use pgkube_crds::{PostgreSQLBackupStatus, PostgreSQLClusterStatus, PostgreSQLRestoreSpec};

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .expect("RFC 3339")
            .with_timezone(&Utc)
    }

    fn time(text: &str) -> Time {
        Time(Timestamp::from_second(at(text).timestamp()).expect("a timestamp"))
    }

    fn cluster(schedule: &str, s3: bool) -> PostgreSQLCluster {
        let mut cluster: PostgreSQLCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "db.example.com/v1beta1",
            "kind": "PostgreSQLCluster",
            "metadata": {
                "name": "main", "namespace": "db", "uid": "u-1", "generation": 3,
                "creationTimestamp": "2025-01-01T00:30:00Z",
            },
            "spec": {"storage": {"size": "1Gi"}, "backup": {"schedule": {"cron": schedule}}},
        }))
        .expect("a cluster");
        if s3 && let Some(backup) = cluster.spec.backup.as_mut() {
            backup.storage = Some(BackupStorage::default());
        }
        cluster
    }

    fn backup(name: &str, cluster: &str, phase: Option<BackupPhase>) -> PostgreSQLBackup {
        let mut backup = PostgreSQLBackup::new(
            name,
            PostgreSQLBackupSpec {
                cluster: LocalReference {
                    name: cluster.to_owned(),
                },
                method: BackupMethod::Logical,
                deletion_policy: DeletionPolicy::Retain,
                compression: None,
            },
        );
        backup.metadata.namespace = Some("db".to_owned());
        backup.status = phase.map(|phase| PostgreSQLBackupStatus {
            phase: Some(phase),
            ..PostgreSQLBackupStatus::default()
        });
        backup
    }

    fn restore(cluster: &str, phase: Option<RestorePhase>) -> PostgreSQLRestore {
        let mut restore = PostgreSQLRestore::new(
            "r",
            PostgreSQLRestoreSpec {
                backup: Some(LocalReference { name: "b".into() }),
                source: None,
                cluster: LocalReference {
                    name: cluster.to_owned(),
                },
                databases: Vec::new(),
                drop_existing: false,
                expected_system_identifier: None,
            },
        );
        restore.metadata.namespace = Some("db".to_owned());
        restore.status = phase.map(|phase| PostgreSQLRestoreStatus {
            phase: Some(phase),
            ..PostgreSQLRestoreStatus::default()
        });
        restore
    }

    fn active(cluster: &PostgreSQLCluster) -> Schedule {
        match Plan::of(cluster) {
            Plan::Active(schedule) => *schedule,
            other => panic!("not active: {other:?}"),
        }
    }

    #[test]
    fn after_downtime_only_the_latest_missed_time_runs() {
        let mut hourly = cluster("0 * * * *", true);
        hourly.status = Some(PostgreSQLClusterStatus {
            last_scheduled_backup: Some(time("2025-01-02T03:00:00Z")),
            ..PostgreSQLClusterStatus::default()
        });
        let schedule = active(&hourly);
        let now = at("2025-01-02T08:20:00Z");
        let floor = first_floor(&hourly, now);
        assert_eq!(floor, at("2025-01-02T03:00:00Z"));
        // Five hours missed: one run, for 08:00.
        assert_eq!(due(&schedule, floor, now), Some(at("2025-01-02T08:00:00Z")));
        // Once handled, nothing more is due until 09:00.
        let handled = at("2025-01-02T08:00:00Z");
        assert_eq!(due(&schedule, handled, now), None);
        assert_eq!(
            due(&schedule, handled, at("2025-01-02T09:00:00Z")),
            Some(at("2025-01-02T09:00:00Z"))
        );
    }

    #[test]
    fn a_new_cluster_catches_up_only_times_after_its_creation() {
        let hourly = cluster("0 * * * *", true);
        let schedule = active(&hourly);
        // Created at 00:30: at 00:50 nothing is due (00:00 is before the creation)...
        let floor = first_floor(&hourly, at("2025-01-01T00:50:00Z"));
        assert_eq!(floor, at("2025-01-01T00:30:00Z"));
        assert_eq!(due(&schedule, floor, at("2025-01-01T00:50:00Z")), None);
        // ...but a manager that starts at 02:10 runs 02:00 once.
        assert_eq!(
            due(&schedule, floor, at("2025-01-01T02:10:00Z")),
            Some(at("2025-01-01T02:00:00Z"))
        );
    }

    #[test]
    fn unfinished_backups_and_restores_of_the_cluster_skip_the_time() {
        let main = cluster("* * * * *", true);
        let name = "main-202501010300";
        let running = backup("main-1", "main", Some(BackupPhase::Running));
        let fresh = backup("main-2", "main", None);
        let done = backup("main-3", "main", Some(BackupPhase::Completed));
        let failed = backup("main-4", "main", Some(BackupPhase::Failed));
        let other = backup("other-1", "other", Some(BackupPhase::Running));
        assert_eq!(
            decide(&main, name, &[&done, &failed, &other], &[]),
            Decision::Create
        );
        for unfinished in [&running, &fresh] {
            let decision = decide(&main, name, &[&done, unfinished], &[]);
            assert!(
                matches!(decision, Decision::Skip { reason: SkipReason::BackupRunning, ref detail } if detail.contains(&unfinished.name_any())),
                "{decision:?}"
            );
        }
        let restoring = restore("main", Some(RestorePhase::Running));
        let pending = restore("main", None);
        let restored = restore("main", Some(RestorePhase::Completed));
        let elsewhere = restore("other", None);
        assert_eq!(
            decide(&main, name, &[], &[&restored, &elsewhere]),
            Decision::Create
        );
        for unfinished in [&restoring, &pending] {
            assert!(matches!(
                decide(&main, name, &[], &[unfinished]),
                Decision::Skip {
                    reason: SkipReason::RestoreRunning,
                    ..
                }
            ));
        }
        // The time's own backup, even unfinished, means it was already made.
        let itself = backup(name, "main", None);
        assert_eq!(decide(&main, name, &[&itself], &[]), Decision::AlreadyMade);
    }

    #[test]
    fn no_storage_skips_the_time() {
        let main = cluster("* * * * *", false);
        assert!(matches!(
            decide(&main, "main-202501010300", &[], &[]),
            Decision::Skip {
                reason: SkipReason::NoStorage,
                ..
            }
        ));
    }

    #[test]
    fn the_backup_is_labelled_annotated_owned_and_retained() {
        let main = cluster("0 3 * * *", true);
        let t = at("2025-01-01T03:00:00Z");
        let backup = desired_backup(&main, "main-202501010300", t);
        assert_eq!(backup.name_any(), "main-202501010300");
        assert_eq!(backup.namespace().as_deref(), Some("db"));
        assert_eq!(backup.labels()[CLUSTER_LABEL], "main");
        assert_eq!(backup.labels()[SCHEDULED_LABEL], "true");
        assert_eq!(
            backup.annotations()[SCHEDULED_TIME_ANNOTATION],
            "2025-01-01T03:00:00Z"
        );
        assert_eq!(backup.spec.cluster.name, "main");
        assert_eq!(backup.spec.deletion_policy, DeletionPolicy::Retain);
        let owner = &backup.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("PostgreSQLCluster", "main", "u-1")
        );
        assert_eq!(owner.controller, None);
    }

    #[test]
    fn the_backup_carries_the_clusters_compression_of_the_moment() {
        let t = at("2025-01-01T03:00:00Z");
        let mut main = cluster("0 3 * * *", true);
        let default = desired_backup(&main, "main-202501010300", t);
        assert_eq!(
            default.spec.compression,
            Some(BackupCompression {
                method: CompressionMethod::Zstd,
                level: None
            }),
            "no setting: the default, written down"
        );
        let gzip_3 = BackupCompression {
            method: CompressionMethod::Gzip,
            level: Some(3),
        };
        if let Some(settings) = main.spec.backup.as_mut() {
            settings.compression = Some(gzip_3);
        }
        let earlier = desired_backup(&main, "main-202501010300", t);
        assert_eq!(earlier.spec.compression, Some(gzip_3));
        if let Some(settings) = main.spec.backup.as_mut() {
            settings.compression = Some(BackupCompression {
                method: CompressionMethod::None,
                level: None,
            });
        }
        let later = desired_backup(&main, "main-202501020300", at("2025-01-02T03:00:00Z"));
        assert_eq!(
            later.spec.compression.map(|c| c.method),
            Some(CompressionMethod::None)
        );
        assert_eq!(
            crate::backup::decide::compression(&earlier, &main),
            gzip_3,
            "the backup made before the change keeps what the cluster said then"
        );
    }

    #[test]
    fn the_condition_says_why_and_when() {
        let main = cluster("0 3 * * *", true);
        let next = Some(at("2025-01-02T03:00:00Z"));
        let active = SchedulerStatus::of(&Plan::of(&main), None, next);
        assert_eq!(
            active.condition,
            Some((
                "True",
                "Scheduled",
                "Next scheduled backup at 2025-01-02T03:00:00Z".to_owned()
            ))
        );
        let invalid = cluster("0 3 * * 9", true);
        let status = SchedulerStatus::of(&Plan::of(&invalid), None, None);
        let (state, reason, message) = status.condition.expect("a condition");
        assert_eq!((state, reason), ("False", "InvalidSchedule"));
        assert!(
            message.contains("day of week 9 is out of range 0-7"),
            "{message}"
        );
        let mut suspended = cluster("0 3 * * *", true);
        if let Some(backup) = suspended.spec.backup.as_mut() {
            backup.schedule.suspend = true;
        }
        let status = SchedulerStatus::of(
            &Plan::of(&suspended),
            Some(at("2025-01-01T03:00:00Z")),
            next,
        );
        assert_eq!(status.next, None, "no next time while suspended");
        assert_eq!(
            status.last,
            Some(at("2025-01-01T03:00:00Z")),
            "the last one stays"
        );
        assert_eq!(status.condition.map(|c| c.1), Some("Suspended"));
    }

    #[test]
    fn the_status_is_written_only_when_it_changes() {
        let mut main = cluster("0 3 * * *", true);
        let now = at("2025-01-01T12:00:00Z");
        let wanted = SchedulerStatus::of(
            &Plan::of(&main),
            Some(at("2025-01-01T03:00:00Z")),
            Some(at("2025-01-02T03:00:00Z")),
        );
        assert!(wanted.differs_from(&main));
        let body = wanted.apply_body(&main, now);
        // What the API server would then show, with the other manager's condition beside it.
        let mut shown: PostgreSQLClusterStatus =
            serde_json::from_value(body["status"].clone()).expect("a status");
        shown.conditions.push(Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Ready".into(),
            message: String::new(),
            last_transition_time: time("2025-01-01T00:00:00Z"),
            observed_generation: None,
        });
        main.status = Some(shown);
        assert!(!wanted.differs_from(&main));
        // The transition time stays while the condition's status does.
        let later = wanted.apply_body(&main, at("2025-01-01T13:00:00Z"));
        assert_eq!(
            later["status"]["conditions"][0]["lastTransitionTime"],
            "2025-01-01T12:00:00Z"
        );
        assert_eq!(later["status"]["conditions"][0]["observedGeneration"], 3);
        let moved = SchedulerStatus {
            next: Some(at("2025-01-03T03:00:00Z")),
            ..wanted
        };
        assert!(moved.differs_from(&main));
    }
}
