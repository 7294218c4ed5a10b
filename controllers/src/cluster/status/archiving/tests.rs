use k8s_openapi::api::apps::v1::StatefulSet;
use pgkube_crds::{PostgreSQLClusterStatus, WalArchivingStatus};

use super::super::Observation;
use super::*;
use crate::cluster::instances::{InstanceReport, ObservedInstance, Unavailable};

const PRIMARY: &str = "db-postgresql-0";

fn primary(wal_archive: Option<WalArchiveReport>) -> ObservedInstance {
    let report: InstanceReport = serde_json::from_value(serde_json::json!({
        "pod": PRIMARY, "role": "primary", "ready": true,
    }))
    .expect("a report");
    ObservedInstance {
        pod: PRIMARY.to_owned(),
        uid: None,
        role_label: None,
        report: Ok(InstanceReport {
            wal_archive,
            ..report
        }),
    }
}

fn observe<'a>(
    instances: &'a [ObservedInstance],
    previous: Option<&'a PostgreSQLClusterStatus>,
) -> Observation<'a> {
    let statefulset: Option<&StatefulSet> = None;
    Observation {
        generation: Some(1),
        desired_replicas: 1,
        statefulset,
        issue: None,
        previous,
        statefulset_name: "db-postgresql",
        primary: PRIMARY,
        instances,
        backups: &[],
        restores: &[],
        bootstrap: None,
        failover_waiting: None,
        rollout_waiting: None,
        archive_root: None,
        in_place: None,
    }
}

fn archived(file: &str) -> WalArchiveReport {
    WalArchiveReport {
        enabled: true,
        last_archived: Some(file.to_owned()),
        last_archived_at: Some("2026-12-05T10:00:00Z".to_owned()),
        archived: 1,
        waiting: Some(0),
        wal_bytes: Some(48 << 20),
        volume_bytes: Some(1 << 30),
        available_bytes: Some(900 << 20),
        ..WalArchiveReport::default()
    }
}

fn status_of(conditions: &[Condition], type_: &str) -> (String, String) {
    let condition = conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("{type_} in {conditions:?}"));
    (condition.status.clone(), condition.reason.clone())
}

#[test]
fn an_archived_file_makes_the_condition_true_and_names_it() {
    let instances = [primary(Some(archived("000000010000000000000003")))];
    let (status, conditions) = archiving(observe(&instances, None));
    let status = status.expect("a status");
    assert_eq!(
        status.last_archived.as_deref(),
        Some("000000010000000000000003")
    );
    assert_eq!(status.instance.as_deref(), Some(PRIMARY));
    assert_eq!(
        status_of(&conditions, CONTINUOUS_ARCHIVING),
        ("True".to_owned(), "Archiving".to_owned())
    );
    assert_eq!(
        status_of(&conditions, WAL_DISK_PRESSURE),
        ("False".to_owned(), "WithinBounds".to_owned())
    );
}

#[test]
fn a_failure_says_why_with_a_reason_per_cause_and_disk_pressure_past_the_threshold() {
    let cases = [
        ("connection refused", "ArchiveFailing"),
        (
            "the archive at wal/db/ belongs to system 1 ...: archiving there is refused; give this cluster another prefix",
            "ArchiveOwnedByAnother",
        ),
        (
            "k is already stored with other content (...): two primaries wrote the same WAL file; the stored one is kept",
            "WALConflict",
        ),
    ];
    for (error, reason) in cases {
        let report = WalArchiveReport {
            failing: true,
            last_failed: Some("000000010000000000000004".to_owned()),
            last_error: Some(error.to_owned()),
            wal_bytes: Some(600 << 20),
            ..archived("000000010000000000000003")
        };
        let instances = [primary(Some(report))];
        let (status, conditions) = archiving(observe(&instances, None));
        assert_eq!(
            status_of(&conditions, CONTINUOUS_ARCHIVING),
            ("False".to_owned(), reason.to_owned())
        );
        let (pressure, _) = status_of(&conditions, WAL_DISK_PRESSURE);
        assert_eq!(pressure, "True");
        let status = status.expect("a status");
        assert_eq!(status.last_error.as_deref(), Some(error));
        assert_eq!(
            status.last_archived.as_deref(),
            Some("000000010000000000000003")
        );
    }
}

#[test]
fn a_restarted_manager_keeps_what_the_status_knew_and_an_unreachable_primary_changes_nothing() {
    let first = [primary(Some(archived("000000010000000000000003")))];
    let (status, conditions) = archiving(observe(&first, None));
    let previous = PostgreSQLClusterStatus {
        wal_archiving: status.clone(),
        conditions: conditions.clone(),
        ..PostgreSQLClusterStatus::default()
    };
    let restarted = [primary(Some(WalArchiveReport {
        enabled: true,
        ..WalArchiveReport::default()
    }))];
    let (kept, kept_conditions) = archiving(observe(&restarted, Some(&previous)));
    assert_eq!(
        kept.as_ref().and_then(|s| s.last_archived.clone()),
        status.as_ref().and_then(|s| s.last_archived.clone())
    );
    assert_eq!(
        status_of(&kept_conditions, CONTINUOUS_ARCHIVING),
        ("True".to_owned(), "Archiving".to_owned())
    );
    let unreachable = [ObservedInstance {
        report: Err(Unavailable::Unreachable),
        ..primary(None)
    }];
    assert_eq!(
        archiving(observe(&unreachable, Some(&previous))),
        (status, conditions)
    );
}

#[test]
fn a_primary_that_does_not_archive_has_no_archiving_status() {
    let stopped = WalArchiveReport {
        enabled: false,
        ..archived("000000010000000000000003")
    };
    for report in [None, Some(stopped)] {
        let instances = [primary(report)];
        let previous = PostgreSQLClusterStatus {
            wal_archiving: Some(WalArchivingStatus::default()),
            ..PostgreSQLClusterStatus::default()
        };
        assert_eq!(
            archiving(observe(&instances, Some(&previous))),
            (None, vec![])
        );
    }
}
