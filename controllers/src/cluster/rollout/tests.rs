//! Unit tests of the rollout's plan.

use super::*;
use crate::cluster::instances::InstanceReport;

const STS: &str = "db-postgresql";
const NEW: &str = "db-postgresql-new";
const OLD: &str = "db-postgresql-old";

fn pod(ordinal: i32) -> String {
    format!("{STS}-{ordinal}")
}

fn reporting(ordinal: i32, role: ReportedRole) -> ObservedInstance {
    let report: InstanceReport = serde_json::from_value(serde_json::json!({
        "pod": pod(ordinal),
        "role": match role {
            ReportedRole::Primary => "primary",
            ReportedRole::Replica => "replica",
            ReportedRole::Starting => "starting",
        },
        "ready": role != ReportedRole::Starting,
        "streaming": role == ReportedRole::Replica,
        "following": (role == ReportedRole::Replica).then(|| pod(0)),
    }))
    .expect("a report");
    ObservedInstance {
        pod: pod(ordinal),
        uid: Some(format!("uid-{ordinal}")),
        role_label: None,
        report: Ok(report),
    }
}

/// Instance 0 the primary, 1 and 2 streaming replicas.
fn healthy() -> Vec<ObservedInstance> {
    vec![
        reporting(0, ReportedRole::Primary),
        reporting(1, ReportedRole::Replica),
        reporting(2, ReportedRole::Replica),
    ]
}

/// Three pods at these revisions.
fn pods(revisions: [&str; 3]) -> BTreeMap<String, LivePod> {
    (0..3)
        .map(|ordinal| {
            let live = LivePod {
                uid: Some(format!("uid-{ordinal}")),
                revision: Some(revisions[ordinal as usize].to_owned()),
                terminating: false,
                tls: true,
                client_ca: false,
            };
            (pod(ordinal), live)
        })
        .collect()
}

fn plan(pods: &BTreeMap<String, LivePod>, instances: &[ObservedInstance]) -> Step {
    let primary = pod(0);
    next(&Input {
        statefulset: STS,
        update_revision: Some(NEW),
        pods,
        instances,
        primary: &primary,
        replicas: i32::try_from(pods.len()).expect("few pods"),
        change_in_progress: false,
        restoring: false,
    })
}

fn replace(ordinal: i32) -> Step {
    Step::Replace {
        pod: pod(ordinal),
        uid: format!("uid-{ordinal}"),
    }
}

#[test]
fn replicas_are_replaced_first_from_the_highest_ordinal_and_the_primary_is_left_to_a_switchover() {
    let instances = healthy();
    assert_eq!(plan(&pods([OLD, OLD, OLD]), &instances), replace(2));
    assert_eq!(plan(&pods([OLD, OLD, NEW]), &instances), replace(1));
    assert_eq!(plan(&pods([OLD, NEW, NEW]), &instances), Step::Idle);
    assert_eq!(plan(&pods([NEW, NEW, NEW]), &instances), Step::Idle);
    assert_eq!(
        outdated(Some(NEW), &pods([OLD, NEW, NEW])),
        vec![pod(0)],
        "what the HA step moves the primary for"
    );
}

#[test]
fn the_next_replica_waits_until_every_instance_is_ready_and_streams_again() {
    let mut instances = healthy();
    let report = instances[2].report.as_mut().expect("a report");
    report.streaming = false;
    let waiting = plan(&pods([OLD, OLD, NEW]), &instances);
    assert!(
        matches!(&waiting, Step::Wait(why) if why.contains("db-postgresql-2")),
        "{waiting:?}"
    );
    // Instance 2's pod is gone and not made again yet.
    let mut replaced = pods([OLD, OLD, NEW]);
    replaced.remove(&pod(2));
    let instances = healthy();
    let primary = pod(0);
    let missing = next(&Input {
        statefulset: STS,
        update_revision: Some(NEW),
        pods: &replaced,
        instances: &instances,
        primary: &primary,
        replicas: 3,
        change_in_progress: false,
        restoring: false,
    });
    assert_eq!(
        missing,
        Step::Wait("db-postgresql-2 does not exist yet".to_owned())
    );
    let mut going = pods([OLD, OLD, OLD]);
    if let Some(live) = going.get_mut(&pod(2)) {
        live.terminating = true;
    }
    assert_eq!(
        plan(&going, &healthy()),
        Step::Wait("db-postgresql-2 is being replaced".to_owned())
    );
}

#[test]
fn nothing_is_replaced_while_the_primary_changes_a_restore_runs_or_before_a_revision() {
    let pods = pods([OLD, OLD, OLD]);
    let instances = healthy();
    let primary = pod(0);
    let input = |change_in_progress, restoring, update_revision| Input {
        statefulset: STS,
        update_revision,
        pods: &pods,
        instances: &instances,
        primary: &primary,
        replicas: 3,
        change_in_progress,
        restoring,
    };
    assert!(matches!(
        next(&input(true, false, Some(NEW))),
        Step::Wait(_)
    ));
    assert_eq!(
        next(&input(false, true, Some(NEW))),
        Step::Wait("a restore is running".to_owned())
    );
    assert_eq!(next(&input(false, false, None)), Step::Idle);
    assert_eq!(next(&input(false, false, Some(NEW))), replace(2));
}

#[test]
fn a_single_instance_is_replaced_in_place() {
    let primary = pod(0);
    let pods: BTreeMap<String, LivePod> = pods([OLD, OLD, OLD])
        .into_iter()
        .filter(|(name, _)| *name == primary)
        .collect();
    let instances = [reporting(0, ReportedRole::Primary)];
    assert_eq!(plan(&pods, &instances), replace(0));
}

#[test]
fn an_outdated_replica_that_does_not_serve_is_replaced_first_but_never_past_a_sick_primary() {
    // Instance 1 does not stream (it may be what the new template fixes): it goes first.
    let mut instances = healthy();
    instances[1].report.as_mut().expect("a report").streaming = false;
    assert_eq!(plan(&pods([OLD, OLD, OLD]), &instances), replace(1));
    // Updated already, it is not replaced again: the rollout waits for it.
    assert!(matches!(
        plan(&pods([OLD, NEW, OLD]), &instances),
        Step::Wait(_)
    ));
    // A primary that is not ready stops everything.
    let mut sick = healthy();
    sick[0].report.as_mut().expect("a report").ready = false;
    assert!(matches!(plan(&pods([OLD, OLD, OLD]), &sick), Step::Wait(_)));
}
