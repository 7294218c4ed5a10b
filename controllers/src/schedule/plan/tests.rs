//! Unit tests of the schedule plan: what a cluster's spec asks, which backup a tick makes or skips, and the floors.

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
            target: None,
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
            method: pgkube_crds::RestoreMethod::Logical,
            target: None,
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
fn the_last_time_come_stays_once_handled_and_never_precedes_the_schedule() {
    let hourly = cluster("0 * * * *", true);
    let schedule = active(&hourly);
    let floor = first_floor(&hourly, at("2025-01-01T00:50:00Z"));
    // Created at 00:30: 00:00 came before the schedule started.
    assert_eq!(
        last_come(&schedule, floor, at("2025-01-01T00:50:00Z")),
        None
    );
    // 01:00 came; handled (the floor moves to it), it stays the last time come.
    let now = at("2025-01-01T01:10:00Z");
    assert_eq!(
        last_come(&schedule, floor, now),
        Some(at("2025-01-01T01:00:00Z"))
    );
    let handled = at("2025-01-01T01:00:00Z");
    assert_eq!(due(&schedule, handled, now), None);
    assert_eq!(last_come(&schedule, handled, now), Some(handled));
    // 02:00 not handled (its backup could not be made): it is the last time come all the same.
    assert_eq!(
        last_come(&schedule, handled, at("2025-01-01T02:05:00Z")),
        Some(at("2025-01-01T02:00:00Z"))
    );
    // A schedule changed at 02:30 (the floor moves to then): none of its times came yet.
    assert_eq!(
        last_come(
            &schedule,
            at("2025-01-01T02:30:00Z"),
            at("2025-01-01T02:40:00Z")
        ),
        None
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
fn the_backup_takes_the_clusters_method_logical_by_default() {
    let t = at("2025-01-01T03:00:00Z");
    let mut main = cluster("0 3 * * *", true);
    let default = desired_backup(&main, "main-202501010300", t);
    assert_eq!(default.spec.method, BackupMethod::Logical);
    assert_eq!(default.spec.target, None, "the backup's default target");
    if let Some(settings) = main.spec.backup.as_mut() {
        settings.method = Some(BackupMethod::Physical);
    }
    let physical = desired_backup(&main, "main-202501020300", at("2025-01-02T03:00:00Z"));
    assert_eq!(physical.spec.method, BackupMethod::Physical);
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
