//! Unit tests of the planned restart's switchover.

use k8s_openapi::jiff::Timestamp;
use pgkube_crds::PostgreSQLClusterStatus;

use super::super::{Command, Plan, Situation, commands, plan};
use crate::cluster::instances::{InstanceReport, Lsn, ObservedInstance, ReportedRole};

const STS: &str = "db-postgresql";
const NEW: &str = "a1b2c3d4e5f60718";
const OLD: &str = "0000000000000000";

fn pod(ordinal: i32) -> String {
    format!("{STS}-{ordinal}")
}

fn now() -> Timestamp {
    "2026-12-01T02:00:00Z".parse().expect("timestamp")
}

/// A ready instance in `role` at WAL position `lsn`, running the settings of `digest`; a
/// replica streams from instance 0.
fn instance(ordinal: i32, role: ReportedRole, lsn: u64, digest: &str) -> ObservedInstance {
    let replica = role == ReportedRole::Replica;
    ObservedInstance {
        pod: pod(ordinal),
        uid: Some(format!("uid-{ordinal}")),
        role_label: None,
        report: Ok(InstanceReport {
            pod: pod(ordinal),
            role,
            ready: true,
            timeline: Some(1),
            current_lsn: (!replica).then_some(Lsn(lsn)),
            received_lsn: replica.then_some(Lsn(lsn)),
            replayed_lsn: replica.then_some(Lsn(lsn)),
            streaming: replica,
            pending_restart: Vec::new(),
            following: replica.then(|| pod(0)),
            system_identifier: None,
            initialized_by: None,
            message: None,
            restart_by_switchover: false,
            settings_digest: Some(digest.to_owned()),
            wal_archive: None,
            in_place: None,
            manager_digest: None,
            certificate_authorities: None,
        }),
    }
}

fn report(instance: &mut ObservedInstance) -> &mut InstanceReport {
    instance.report.as_mut().expect("a report")
}

/// Instance 0, the primary, waiting for a switchover to restart for `max_connections`.
fn waiting_primary() -> ObservedInstance {
    let mut primary = instance(0, ReportedRole::Primary, 200, NEW);
    let report = report(&mut primary);
    report.pending_restart = vec!["max_connections".to_owned()];
    report.restart_by_switchover = true;
    primary
}

/// A replica that restarted with the new settings.
fn restarted(ordinal: i32, lsn: u64) -> ObservedInstance {
    instance(ordinal, ReportedRole::Replica, lsn, NEW)
}

fn status(term: i64) -> PostgreSQLClusterStatus {
    PostgreSQLClusterStatus {
        current_primary: Some(pod(0)),
        primary_change: Some(pgkube_crds::PrimaryChange {
            kind: pgkube_crds::PrimaryChangeKind::Failover,
            from: pod(1),
            to: pod(0),
            reason: "earlier".to_owned(),
            started_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()),
            completed_at: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now())),
            term: Some(term),
        }),
        ..PostgreSQLClusterStatus::default()
    }
}

fn plan_for(status: &PostgreSQLClusterStatus, instances: &[ObservedInstance]) -> Plan {
    let primary = pod(0);
    plan(&situation(status, &primary, instances))
}

/// The failover tests' situation, with as many instances as `instances`.
fn situation<'a>(
    status: &'a PostgreSQLClusterStatus,
    primary: &'a str,
    instances: &'a [ObservedInstance],
) -> Situation<'a> {
    Situation {
        replicas: i32::try_from(instances.len()).expect("few instances"),
        ..super::super::tests::situation(status, primary, instances)
    }
}

#[test]
fn the_primary_moves_by_a_switchover_to_the_best_replica_that_runs_the_new_settings() {
    let status = status(4);
    let instances = [waiting_primary(), restarted(1, 150), restarted(2, 200)];
    let change = plan_for(&status, &instances)
        .designate
        .expect("a switchover");
    assert_eq!(change.kind, pgkube_crds::PrimaryChangeKind::Switchover);
    assert_eq!(
        (change.from.as_str(), change.to.as_str()),
        (pod(0).as_str(), "db-postgresql-2")
    );
    assert!(
        change.reason.starts_with("planned restart") && change.reason.contains("max_connections"),
        "{}",
        change.reason
    );
    assert_eq!(change.term, Some(5), "one more than the last decision's");
    assert_eq!(change.completed_at, None);

    // Recorded, the switchover is carried through as any other: the old primary is told to
    // follow the target (it shuts down cleanly and restarts as a replica, with the settings).
    let mut recorded = status.clone();
    recorded.target_primary = Some(change.to.clone());
    recorded.primary_change = Some(change);
    let target = pod(2);
    let carried = situation(&recorded, &target, &instances);
    assert_eq!(plan(&carried).designate, None, "decided once");
    assert!(commands(&carried).contains(&Command::Follow {
        pod: pod(0),
        primary: pod(2),
    }));
}

#[test]
fn the_primary_waits_while_the_replicas_restart_or_lack_the_new_settings() {
    let status = status(4);
    let mut restarting = restarted(1, 200);
    report(&mut restarting).pending_restart = vec!["max_connections".to_owned()];
    // Its mounted ConfigMap is not refreshed yet: nothing pending, but the old settings.
    let behind = instance(2, ReportedRole::Replica, 200, OLD);
    let plan = plan_for(&status, &[waiting_primary(), restarting, behind]);
    assert_eq!(plan.designate, None);
    let waiting = plan.waiting.expect("says why");
    assert!(
        waiting.contains("db-postgresql-1 restarts for max_connections")
            && waiting.contains("db-postgresql-2 does not run the primary's settings yet"),
        "{waiting}"
    );
    assert!(!plan.urgent, "the primary serves meanwhile");

    // Neither a replica that streams from another instance, nor one that is not ready.
    let mut elsewhere = restarted(1, 200);
    report(&mut elsewhere).following = Some(pod(2));
    let mut not_ready = restarted(2, 200);
    report(&mut not_ready).ready = false;
    let plan = plan_for(&status, &[waiting_primary(), elsewhere, not_ready]);
    assert_eq!(plan.designate, None);
}

#[test]
fn a_single_instance_or_a_primary_that_restarts_in_place_gets_no_switchover() {
    let status = status(4);
    let alone = plan_for(&status, &[waiting_primary()]);
    assert_eq!(alone.designate, None);
    assert!(
        alone.waiting.expect("says why").contains("no replica"),
        "a primary that waits alone is told so"
    );
    // One instance: instance.json does not ask, so the primary restarts in place and does not
    // report restartBySwitchover; likewise an older instance manager, or a user's own
    // ALTER SYSTEM. Nothing to do for the operator.
    let mut in_place = waiting_primary();
    report(&mut in_place).restart_by_switchover = false;
    assert_eq!(plan_for(&status, &[in_place.clone()]), Plan::default());
    assert_eq!(
        plan_for(&status, &[in_place, restarted(1, 200)]),
        Plan::default()
    );
}

#[test]
fn no_planned_switchover_while_a_change_is_in_progress_or_a_restore_runs() {
    let mut changing = status(4);
    changing.target_primary = Some(pod(0));
    let instances = [waiting_primary(), restarted(1, 200)];
    assert_eq!(plan_for(&changing, &instances).designate, None);

    let status = status(4);
    let primary = pod(0);
    let mut restoring = situation(&status, &primary, &instances);
    restoring.restoring = true;
    let plan = plan(&restoring);
    assert_eq!(plan.designate, None);
    assert!(plan.waiting.expect("says why").contains("restore"));
}

#[test]
fn the_instance_managers_report_is_read_with_or_without_the_new_fields() {
    let newer: InstanceReport = serde_json::from_str(
        r#"{"pod":"db-0","role":"primary","ready":true,"pendingRestart":["max_connections"],
            "restartBySwitchover":true,"settingsDigest":"a1b2c3d4e5f60718"}"#,
    )
    .expect("a report");
    assert!(newer.restart_by_switchover);
    assert_eq!(newer.settings_digest.as_deref(), Some(NEW));
    let older: InstanceReport =
        serde_json::from_str(r#"{"pod":"db-0","role":"primary","ready":true}"#).expect("a report");
    assert!(!older.restart_by_switchover);
    assert_eq!(older.settings_digest, None);
}

/// Instance 2 the primary; instances 0 and 1 replicas streaming from it at `lsns`.
fn primary_on_two(lsns: [u64; 2]) -> Vec<ObservedInstance> {
    let mut instances = vec![
        instance(0, ReportedRole::Replica, lsns[0], NEW),
        instance(1, ReportedRole::Replica, lsns[1], NEW),
        instance(2, ReportedRole::Primary, 300, NEW),
    ];
    for replica in &mut instances[..2] {
        report(replica).following = Some(pod(2));
    }
    instances
}

fn scale_down_plan(
    status: &PostgreSQLClusterStatus,
    instances: &[ObservedInstance],
    requested_replicas: i32,
) -> Plan {
    let primary = pod(2);
    plan(&Situation {
        requested_replicas,
        ..situation(status, &primary, instances)
    })
}

#[test]
fn a_scale_down_that_removes_the_primary_moves_it_to_the_best_instance_that_stays() {
    let mut status = status(4);
    status.current_primary = Some(pod(2));
    // Instance 1 has more WAL but goes too: instance 0 is the only one that stays.
    let instances = primary_on_two([250, 300]);
    let change = scale_down_plan(&status, &instances, 1)
        .designate
        .expect("a switchover");
    assert_eq!(change.kind, pgkube_crds::PrimaryChangeKind::Switchover);
    assert_eq!(
        (change.from, change.to.as_str()),
        (pod(2), "db-postgresql-0")
    );
    assert!(
        change.reason.contains("scale-down to 1"),
        "{}",
        change.reason
    );
    assert_eq!(change.term, Some(5));
    // Both stay: the one with the most WAL.
    let change = scale_down_plan(&status, &instances, 2)
        .designate
        .expect("a switchover");
    assert_eq!(change.to, pod(1));
    // The primary stays: nothing moves.
    assert_eq!(scale_down_plan(&status, &instances, 3), Plan::default());
}

#[test]
fn a_scale_down_waits_while_no_instance_that_stays_streams_from_the_primary() {
    let mut status = status(4);
    status.current_primary = Some(pod(2));
    let mut instances = primary_on_two([250, 300]);
    report(&mut instances[0]).streaming = false;
    let waiting = scale_down_plan(&status, &instances, 1);
    assert_eq!(waiting.designate, None);
    let why = waiting.waiting.expect("why it waits");
    assert!(
        why.contains("scale-down to 1") && why.contains("db-postgresql-0 does not stream"),
        "{why}"
    );
    let restoring = plan(&Situation {
        requested_replicas: 1,
        restoring: true,
        ..situation(&status, &pod(2), &primary_on_two([250, 300]))
    });
    assert_eq!(restoring.designate, None);
    assert!(
        restoring
            .waiting
            .is_some_and(|why| why.contains("a restore is running")),
    );
}

fn rolling_plan(
    instances: &[ObservedInstance],
    outdated: &[String],
    supervised_update: bool,
) -> Plan {
    let status = status(4);
    let primary = pod(0);
    plan(&Situation {
        outdated,
        supervised_update,
        ..situation(&status, &primary, instances)
    })
}

fn streaming_replicas() -> Vec<ObservedInstance> {
    vec![
        instance(0, ReportedRole::Primary, 300, NEW),
        restarted(1, 250),
        restarted(2, 300),
    ]
}

#[test]
fn an_outdated_primary_moves_to_the_best_updated_replica_once_every_replica_is_updated() {
    let instances = streaming_replicas();
    let change = rolling_plan(&instances, &[pod(0)], false)
        .designate
        .expect("a switchover");
    assert_eq!(change.kind, pgkube_crds::PrimaryChangeKind::Switchover);
    assert_eq!(change.to, pod(2), "the most WAL");
    assert!(
        change.reason.starts_with("rolling update"),
        "{}",
        change.reason
    );
    // A replica still outdated goes first: the rollout replaces it, nothing moves.
    assert_eq!(
        rolling_plan(&instances, &[pod(0), pod(1)], false),
        Plan::default()
    );
    // The primary up to date: nothing to move.
    assert_eq!(rolling_plan(&instances, &[pod(1)], false), Plan::default());
}

#[test]
fn an_outdated_primary_waits_for_every_replica_and_for_the_user_when_supervised() {
    let mut instances = streaming_replicas();
    report(&mut instances[1]).streaming = false;
    let waiting = rolling_plan(&instances, &[pod(0)], false);
    assert_eq!(waiting.designate, None);
    assert!(
        waiting
            .waiting
            .as_deref()
            .is_some_and(|why| why.contains("db-postgresql-1 does not stream")),
        "{waiting:?}"
    );
    // Instance 2's pod is being made again: no switchover until it streams.
    let status = status(4);
    let primary = pod(0);
    let two_of_three = &streaming_replicas()[..2];
    let missing = plan(&Situation {
        replicas: 3,
        outdated: &[pod(0)],
        ..situation(&status, &primary, two_of_three)
    });
    assert_eq!(missing.designate, None);
    assert!(
        missing
            .waiting
            .as_deref()
            .is_some_and(|why| why.contains("exist again")),
        "{missing:?}"
    );
    let supervised = rolling_plan(&streaming_replicas(), &[pod(0)], true);
    assert_eq!(supervised.designate, None);
    assert!(
        supervised
            .waiting
            .as_deref()
            .is_some_and(|why| why.contains("supervised") && why.contains("switchover-to")),
        "{supervised:?}"
    );
}

#[test]
fn an_outdated_primary_waits_to_trust_the_ca_of_the_updated_replicas() {
    use crate::cluster::instances::CaReport;
    let cas = |server: &str, trusted: &[&str]| CaReport {
        server_cas: vec![server.to_owned()],
        trusted_cas: trusted.iter().map(|ca| (*ca).to_owned()).collect(),
    };
    let mut instances = streaming_replicas();
    // A certificate of one's own was added: the updated replicas serve one of the user's CA
    // and trust both; the primary, made before, trusts pgkube's only.
    report(&mut instances[0]).certificate_authorities = Some(cas("pgkube", &["pgkube"]));
    for replica in &mut instances[1..] {
        report(replica).certificate_authorities = Some(cas("own", &["own", "pgkube"]));
    }
    let waiting = rolling_plan(&instances, &[pod(0)], false);
    assert_eq!(waiting.designate, None);
    assert!(
        waiting
            .waiting
            .as_deref()
            .is_some_and(|why| why.contains("to trust the CA")),
        "{waiting:?}"
    );
    // Its mounted Secret refreshed, the primary trusts the user's CA too.
    report(&mut instances[0]).certificate_authorities = Some(cas("pgkube", &["pgkube", "own"]));
    let change = rolling_plan(&instances, &[pod(0)], false)
        .designate
        .expect("a switchover");
    assert_eq!(change.to, pod(2));
}
