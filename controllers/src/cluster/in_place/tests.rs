use pgkube_crds::{InPlaceRecovery, InPlaceStep};

use super::step;
use crate::cluster::instances::{InstanceReport, Lsn, ObservedInstance, ReportedRole, Unavailable};
use crate::storage::recovery::in_place::{InPlaceReport, InPlaceState};

const UID: &str = "restore-uid";

fn instance(
    pod: &str,
    role: ReportedRole,
    ready: bool,
    part: Option<InPlaceState>,
) -> ObservedInstance {
    ObservedInstance {
        pod: pod.to_owned(),
        uid: None,
        role_label: None,
        report: Ok(InstanceReport {
            pod: pod.to_owned(),
            role,
            ready,
            timeline: Some(2),
            current_lsn: Some(Lsn(0x300_0000)),
            received_lsn: None,
            replayed_lsn: None,
            streaming: false,
            pending_restart: Vec::new(),
            following: None,
            system_identifier: None,
            initialized_by: None,
            message: Some(format!("{pod} says")),
            restart_by_switchover: false,
            settings_digest: None,
            wal_archive: None,
            in_place: part.map(|state| {
                let message =
                    (state == InPlaceState::Recovered).then(|| "/data/pgdata.before-x".to_owned());
                InPlaceReport::new(UID, state, message)
            }),
            manager_digest: None,
            certificate_authorities: None,
        }),
    }
}

fn recorded(step: InPlaceStep) -> InPlaceRecovery {
    InPlaceRecovery {
        restore: "to-t".to_owned(),
        uid: UID.to_owned(),
        step,
        message: Some("recorded".to_owned()),
        previous_data: None,
    }
}

#[test]
fn the_cluster_recovers_until_the_primary_reports_it_recovered() {
    let instances = [
        instance(
            "c-0",
            ReportedRole::Starting,
            false,
            Some(InPlaceState::Recovering),
        ),
        instance(
            "c-1",
            ReportedRole::Starting,
            false,
            Some(InPlaceState::Waiting),
        ),
    ];
    let found = step(UID, None, "c-0", &instances);
    assert_eq!(found.step, InPlaceStep::Recovering);
    assert_eq!(found.message.as_deref(), Some("c-0 says"));
}

#[test]
fn a_report_of_another_restore_counts_for_nothing() {
    let mut primary = instance(
        "c-0",
        ReportedRole::Primary,
        true,
        Some(InPlaceState::Recovered),
    );
    if let Ok(report) = primary.report.as_mut() {
        report.in_place = Some(InPlaceReport::new("older", InPlaceState::Recovered, None));
    }
    let found = step(UID, None, "c-0", &[primary]);
    assert_eq!(found.step, InPlaceStep::Recovering);
}

#[test]
fn replicas_clone_again_once_the_primary_recovered_then_it_is_complete() {
    let primary = instance(
        "c-0",
        ReportedRole::Primary,
        true,
        Some(InPlaceState::Recovered),
    );
    let waiting = instance(
        "c-1",
        ReportedRole::Starting,
        false,
        Some(InPlaceState::Waiting),
    );
    let found = step(UID, None, "c-0", &[primary.clone(), waiting]);
    assert_eq!(found.step, InPlaceStep::Recloning);
    assert_eq!(
        found.previous_data.as_deref(),
        Some("/data/pgdata.before-x")
    );
    assert!(found.message.unwrap_or_default().contains("0 of 1"));

    // Cloned but not ready yet: not complete.
    let cloned = instance(
        "c-1",
        ReportedRole::Replica,
        false,
        Some(InPlaceState::Recloned),
    );
    let found = step(UID, None, "c-0", &[primary.clone(), cloned]);
    assert_eq!(found.step, InPlaceStep::Recloning);

    let ready = instance(
        "c-1",
        ReportedRole::Replica,
        true,
        Some(InPlaceState::Recloned),
    );
    let found = step(UID, None, "c-0", &[primary, ready]);
    assert_eq!(found.step, InPlaceStep::Completed);
    assert_eq!(
        found.previous_data.as_deref(),
        Some("/data/pgdata.before-x")
    );
}

#[test]
fn a_failed_recovery_is_failed_with_the_primarys_reason() {
    let mut primary = instance("c-0", ReportedRole::Primary, true, None);
    if let Ok(report) = primary.report.as_mut() {
        report.in_place = Some(InPlaceReport::new(
            UID,
            InPlaceState::Failed,
            Some("ns/pg/wal/pg/00000001/000000010000000000000004.zst is corrupt".to_owned()),
        ));
    }
    let found = step(UID, None, "c-0", &[primary]);
    assert_eq!(found.step, InPlaceStep::Failed);
    let message = found.message.unwrap_or_default();
    assert!(message.contains("old data"), "{message}");
    assert!(
        message.contains("000000010000000000000004.zst is corrupt"),
        "{message}"
    );
}

#[test]
fn the_step_never_goes_back_when_the_primary_does_not_answer() {
    let silent = ObservedInstance {
        pod: "c-0".to_owned(),
        uid: None,
        role_label: None,
        report: Err(Unavailable::Unreachable),
    };
    let found = step(
        UID,
        Some(&recorded(InPlaceStep::Recloning)),
        "c-0",
        std::slice::from_ref(&silent),
    );
    assert_eq!(found.step, InPlaceStep::Recloning);
    for ended in [InPlaceStep::Completed, InPlaceStep::Failed] {
        let found = step(
            UID,
            Some(&recorded(ended)),
            "c-0",
            std::slice::from_ref(&silent),
        );
        assert_eq!(found.step, ended);
    }
    let found = step(UID, None, "c-0", &[silent]);
    assert_eq!(found.step, InPlaceStep::Recovering);
    assert!(found.message.unwrap_or_default().contains("unreachable"));
}

fn point_in_time_restore(
    phase: Option<pgkube_crds::RestorePhase>,
) -> pgkube_crds::PostgreSQLRestore {
    let mut restore = pgkube_crds::PostgreSQLRestore::new(
        "to-t",
        serde_json::from_value(serde_json::json!({
            "cluster": {"name": "main"}, "method": "PointInTime"
        }))
        .expect("spec"),
    );
    restore.metadata.uid = Some(UID.to_owned());
    restore.status = phase.map(|phase| pgkube_crds::PostgreSQLRestoreStatus {
        phase: Some(phase),
        ..Default::default()
    });
    restore
}

fn cluster_recording(step: Option<InPlaceStep>) -> pgkube_crds::PostgreSQLCluster {
    let spec =
        serde_json::from_value(serde_json::json!({"storage": {"size": "1Gi"}})).expect("spec");
    let mut cluster = pgkube_crds::PostgreSQLCluster::new("main", spec);
    cluster.status = Some(pgkube_crds::PostgreSQLClusterStatus {
        in_place_recovery: step.map(recorded),
        ..Default::default()
    });
    cluster
}

#[test]
fn the_primary_is_routed_to_by_no_pod_from_the_start_of_a_recovery_until_it_recovered() {
    use pgkube_crds::RestorePhase;
    let running = point_in_time_restore(Some(RestorePhase::Running));
    assert!(super::fenced(&cluster_recording(None), &[&running]));
    assert!(super::fenced(
        &cluster_recording(Some(InPlaceStep::Recovering)),
        &[&running]
    ));
    assert!(!super::fenced(
        &cluster_recording(Some(InPlaceStep::Recloning)),
        &[&running]
    ));
    let pending = point_in_time_restore(Some(RestorePhase::Pending));
    assert!(!super::fenced(&cluster_recording(None), &[&pending]));
    let mut logical = point_in_time_restore(Some(RestorePhase::Running));
    logical.spec.method = pgkube_crds::RestoreMethod::Logical;
    assert!(!super::fenced(&cluster_recording(None), &[&logical]));
}
