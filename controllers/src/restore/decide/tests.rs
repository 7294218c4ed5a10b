//! Tests of the pure decisions of a restore's next step.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use pgkube_crds::{
    InstanceStatus, LocalReference, PostgreSQLBackupSpec, PostgreSQLBackupStatus,
    PostgreSQLClusterSpec, PostgreSQLClusterStatus, PostgreSQLRestoreSpec, PostgreSQLRestoreStatus,
    PostgresVersion, RestoreSource,
};

use super::*;

const DEADLINE: Duration = Duration::from_secs(600);
/// The system identifier the fixture's cluster has recorded.
const RECORDED: &str = "7312345678901234567";

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
            method: pgkube_crds::RestoreMethod::Logical,
            target: None,
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
            target: None,
            deletion_policy: Default::default(),
            compression: None,
        },
    );
    backup.metadata.namespace = Some("db".to_owned());
    backup.status = Some(PostgreSQLBackupStatus {
        phase: Some(phase),
        storage: Some(pgkube_crds::BackupStorage { s3: storage() }),
        object_key: Some("db/main/c-uid/nightly/b-uid/manifest.json".to_owned()),
        postgres_version: Some(version.to_owned()),
        message: Some("the store refused".to_owned()),
        ..PostgreSQLBackupStatus::default()
    });
    backup
}

fn cluster(version: PostgresVersion, primary_ready: bool) -> PostgreSQLCluster {
    let mut spec: PostgreSQLClusterSpec =
        serde_json::from_value(serde_json::json!({"storage": {"size": "1Gi"}})).expect("spec");
    spec.postgres_version = version;
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
        system_identifier: Some(RECORDED.to_owned()),
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
    let Next::Start(start) = decide(&r, Some(&b), Some(&c), 5) else {
        panic!("starts");
    };
    assert_eq!(start.target_system_identifier, RECORDED);
    let location = &start.location;
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
        let Next::Start(start) = next else {
            panic!("starts: {next:?}")
        };
        assert_eq!(start.location.manifest_key, "db/main/nightly/manifest.json");
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
        storage: pgkube_crds::BackupStorage { s3: storage() },
        object_key: "elsewhere/manifest".to_owned(),
    });
    assert_eq!(
        reason(&decide(&from_source, None, None, 5)),
        Some("InvalidSource")
    );
}

#[test]
fn without_an_expected_identifier_it_waits_for_the_clusters_then_times_out() {
    let r = restore("r1", 0, None);
    let b = backup(BackupPhase::Completed, "15.14");
    let mut unrecorded = cluster(PostgresVersion::V15, true);
    if let Some(status) = unrecorded.status.as_mut() {
        status.system_identifier = None;
    }
    assert_eq!(
        reason(&decide(&r, Some(&b), Some(&unrecorded), 5)),
        Some("SystemIdentifierUnknown")
    );
    let Next::Fail(late) = decide(&r, Some(&b), Some(&unrecorded), 601) else {
        panic!("timed out");
    };
    assert_eq!(late.reason, "PendingTimeout");
    assert!(
        late.message.contains("system identifier"),
        "{}",
        late.message
    );
    // Given in the spec, the identifier (or Any) needs nothing from the cluster.
    for expected in ["42", "Any"] {
        let mut given = restore("r2", 0, None);
        given.spec.expected_system_identifier = Some(expected.to_owned());
        let Next::Start(start) = decide(&given, Some(&b), Some(&unrecorded), 5) else {
            panic!("{expected} starts");
        };
        assert_eq!(start.target_system_identifier, expected);
    }
}

fn in_place(restore: &mut PostgreSQLRestore) {
    restore.spec.method = pgkube_crds::RestoreMethod::PointInTime;
    restore.spec.target = Some(pgkube_crds::RecoveryTarget {
        time: Some("2027-01-15T08:00:00Z".to_owned()),
        ..Default::default()
    });
}

fn archiving(mut cluster: PostgreSQLCluster) -> PostgreSQLCluster {
    cluster.spec.backup = serde_json::from_value(serde_json::json!({
        "schedule": {"cron": "0 3 * * *"},
        "storage": {"s3": {"bucket": "backups", "credentials": {
            "accessKeyId": {"name": "s3", "key": "id"},
            "secretAccessKey": {"name": "s3", "key": "secret"}
        }}}
    }))
    .expect("backup settings");
    cluster.metadata.namespace = Some("db".to_owned());
    cluster
}

fn physical(mut backup: PostgreSQLBackup) -> PostgreSQLBackup {
    backup.spec.method = BackupMethod::Physical;
    backup
}

#[test]
fn a_point_in_time_restore_starts_with_the_database_it_must_find_and_no_job() {
    let mut r = restore("r1", 0, None);
    in_place(&mut r);
    let b = physical(backup(BackupPhase::Completed, "15.14"));
    let c = archiving(cluster(PostgresVersion::V15, true));
    assert_eq!(
        decide(&r, Some(&b), Some(&c), 5),
        Next::StartInPlace(RECORDED.to_owned())
    );
    // Without a backup named, the cluster picks one from its archive.
    r.spec.backup = None;
    assert_eq!(
        decide(&r, None, Some(&c), 5),
        Next::StartInPlace(RECORDED.to_owned())
    );
}

#[test]
fn a_point_in_time_restore_is_refused_without_a_base_backup_an_archive_or_the_right_database() {
    let mut r = restore("r1", 0, None);
    in_place(&mut r);
    let logical = backup(BackupPhase::Completed, "15.14");
    let c = archiving(cluster(PostgresVersion::V15, true));
    assert_eq!(
        reason(&decide(&r, Some(&logical), Some(&c), 5)),
        Some("NotPhysical")
    );
    let b = physical(backup(BackupPhase::Completed, "15.14"));
    let without_archive = cluster(PostgresVersion::V15, true);
    assert_eq!(
        reason(&decide(&r, Some(&b), Some(&without_archive), 5)),
        Some("NoArchive")
    );
    r.spec.expected_system_identifier = Some("7000000000000000001".to_owned());
    assert_eq!(
        reason(&decide(&r, Some(&b), Some(&c), 5)),
        Some(identity::SYSTEM_IDENTIFIER_MISMATCH)
    );
}

#[test]
fn a_point_in_time_restore_waits_for_its_backup_and_a_ready_primary() {
    let mut r = restore("r1", 0, None);
    in_place(&mut r);
    let running = physical(backup(BackupPhase::Running, "15.14"));
    let c = archiving(cluster(PostgresVersion::V15, true));
    assert_eq!(
        reason(&decide(&r, Some(&running), Some(&c), 5)),
        Some("BackupNotCompleted")
    );
    let b = physical(backup(BackupPhase::Completed, "15.14"));
    let not_ready = archiving(cluster(PostgresVersion::V15, false));
    assert_eq!(
        reason(&decide(&r, Some(&b), Some(&not_ready), 5)),
        Some("ClusterNotReady")
    );
}
