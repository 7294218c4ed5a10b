use super::*;
use crate::cluster::instances::{InstanceReport, Unavailable};
use k8s_openapi::api::apps::v1::{StatefulSetSpec, StatefulSetStatus};
use pgkube_crds::PrimaryChangeKind;
use std::collections::BTreeMap;
use std::sync::LazyLock;

fn sts(spec_replicas: i32, replicas: i32, ready: i32, revisions: (&str, &str)) -> StatefulSet {
    let mut sts = StatefulSet::default();
    sts.metadata.generation = Some(2);
    sts.metadata.annotations = Some(BTreeMap::from([(
        VERSION_ANNOTATION.to_owned(),
        "16".to_owned(),
    )]));
    sts.spec = Some(StatefulSetSpec {
        replicas: Some(spec_replicas),
        ..StatefulSetSpec::default()
    });
    sts.status = Some(StatefulSetStatus {
        observed_generation: Some(2),
        replicas,
        ready_replicas: Some(ready),
        // One pod left on the old revision while they differ.
        updated_replicas: Some(replicas - i32::from(revisions.0 != revisions.1)),
        current_revision: Some(revisions.0.to_owned()),
        update_revision: Some(revisions.1.to_owned()),
        ..StatefulSetStatus::default()
    });
    sts
}

const STATEFULSET: &str = "db-postgresql";
const PRIMARY: &str = "db-postgresql-0";
const PRIMARY_LSN: Lsn = Lsn(0x0300_0148);

fn report(pod: &str, role: ReportedRole) -> InstanceReport {
    InstanceReport {
        pod: pod.to_owned(),
        role,
        ready: role != ReportedRole::Starting,
        timeline: Some(1),
        current_lsn: (role == ReportedRole::Primary).then_some(PRIMARY_LSN),
        received_lsn: (role == ReportedRole::Replica).then_some(PRIMARY_LSN),
        replayed_lsn: (role == ReportedRole::Replica).then_some(PRIMARY_LSN),
        streaming: role == ReportedRole::Replica,
        pending_restart: Vec::new(),
        following: None,
        system_identifier: None,
        initialized_by: None,
        message: None,
        restart_by_switchover: false,
        settings_digest: None,
        wal_archive: None,
        in_place: None,
        manager_digest: None,
        certificate_authorities: None,
    }
}

fn observed(pod: &str, report: Result<InstanceReport, Unavailable>) -> ObservedInstance {
    ObservedInstance {
        pod: pod.to_owned(),
        uid: Some(format!("uid-{pod}")),
        role_label: None,
        report,
    }
}

/// Ten instances: the first a ready primary, the others streaming replicas, caught up.
static HEALTHY: LazyLock<Vec<ObservedInstance>> = LazyLock::new(|| {
    (0..10)
        .map(|ordinal| {
            let pod = format!("{STATEFULSET}-{ordinal}");
            let role = if ordinal == 0 {
                ReportedRole::Primary
            } else {
                ReportedRole::Replica
            };
            let report = report(&pod, role);
            observed(&pod, Ok(report))
        })
        .collect()
});

/// The first `desired` of [`HEALTHY`].
fn observe<'a>(
    desired: i32,
    sts: Option<&'a StatefulSet>,
    previous: Option<&'a PostgreSQLClusterStatus>,
) -> Observation<'a> {
    let count = usize::try_from(desired).expect("positive");
    Observation {
        generation: Some(1),
        desired_replicas: desired,
        statefulset: sts,
        issue: None,
        previous,
        statefulset_name: STATEFULSET,
        primary: PRIMARY,
        instances: &HEALTHY[..count],
        backups: &[],
        restores: &[],
        bootstrap: None,
        failover_waiting: None,
        rollout_waiting: None,
        archive_root: None,
        in_place: None,
    }
}

fn now() -> Timestamp {
    Timestamp::from_second(1_700_000_000).expect("valid timestamp")
}

fn condition_of<'a>(status: &'a PostgreSQLClusterStatus, type_: &str) -> &'a Condition {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .expect("condition present")
}

#[test]
fn a_change_under_way_is_kept_until_its_target_reports_primary_then_completed() {
    let started = Time(Timestamp::from_second(1_699_999_990).expect("valid"));
    let moving = PostgreSQLClusterStatus {
        current_primary: Some(PRIMARY.to_owned()),
        target_primary: Some("db-postgresql-1".to_owned()),
        primary_change: Some(PrimaryChange {
            kind: PrimaryChangeKind::Failover,
            from: PRIMARY.to_owned(),
            to: "db-postgresql-1".to_owned(),
            reason: "lost".to_owned(),
            started_at: started.clone(),
            completed_at: None,
            term: None,
        }),
        ..PostgreSQLClusterStatus::default()
    };
    let sts_ready = sts(2, 2, 2, ("r1", "r1"));
    // The target still reports a replica: nothing completes, the primary is unavailable.
    let mut waiting = observe(2, Some(&sts_ready), Some(&moving));
    waiting.primary = "db-postgresql-1";
    let still = compute(waiting, now());
    assert_eq!(still.target_primary.as_deref(), Some("db-postgresql-1"));
    assert_eq!(still.current_primary.as_deref(), Some(PRIMARY));
    assert_eq!(condition_of(&still, PRIMARY_AVAILABLE).status, "False");
    assert_eq!(completed_change(&still, Some(&moving)), None);
    // It reports primary: it is the current primary, and the change is completed.
    let promoted = [
        observed(PRIMARY, Err(Unavailable::Unreachable)),
        observed(
            "db-postgresql-1",
            Ok(report("db-postgresql-1", ReportedRole::Primary)),
        ),
    ];
    let mut done = observe(2, Some(&sts_ready), Some(&moving));
    done.primary = "db-postgresql-1";
    done.instances = &promoted;
    let after = compute(done, now());
    assert_eq!(after.target_primary, None);
    assert_eq!(after.current_primary.as_deref(), Some("db-postgresql-1"));
    let change = after.primary_change.clone().expect("kept");
    assert_eq!(change.completed_at, Some(Time(now())));
    assert_eq!(condition_of(&after, PRIMARY_AVAILABLE).status, "True");
    assert_eq!(
        completed_change(&after, Some(&moving)),
        Some((
            PrimaryChangeKind::Failover,
            std::time::Duration::from_secs(10)
        ))
    );
    let made = events(&after, Some(&moving));
    assert!(
        made.iter().any(|e| e.reason == "PrimaryChanged"
            && e.note == "Failover: db-postgresql-1 is the primary (was db-postgresql-0), 10.0 s after the decision"),
        "{made:?}"
    );
    // Once recorded, it is not completed again.
    assert_eq!(completed_change(&after, Some(&after)), None);
}

#[test]
fn primary_available_says_since_when_and_why_no_failover() {
    let sts_ready = sts(2, 2, 2, ("r1", "r1"));
    let healthy = compute(observe(2, Some(&sts_ready), None), now());
    assert_eq!(condition_of(&healthy, PRIMARY_AVAILABLE).status, "True");
    let lost = [
        observed(PRIMARY, Err(Unavailable::Unreachable)),
        HEALTHY[1].clone(),
    ];
    let mut observation = observe(2, Some(&sts_ready), Some(&healthy));
    observation.instances = &lost;
    observation.failover_waiting = Some("a restore is running");
    let later = Timestamp::from_second(1_700_000_100).expect("valid");
    let status = compute(observation, later);
    let condition = condition_of(&status, PRIMARY_AVAILABLE);
    assert_eq!(condition.status, "False");
    assert_eq!(condition.last_transition_time, Time(later));
    assert_eq!(
        condition.message,
        "the primary db-postgresql-0: instance manager unreachable; no failover: a restore is running"
    );
}

#[test]
fn a_cluster_without_statefulset_is_pending() {
    let status = compute(observe(3, None, None), now());
    assert_eq!(status.phase, Some(ClusterPhase::Pending));
    assert_eq!(
        condition_of(&status, READY).message,
        "0 of 3 replicas are ready"
    );
}

#[test]
fn all_replicas_ready_is_running_with_a_ready_message() {
    let sts = sts(3, 3, 3, ("r1", "r1"));
    let status = compute(observe(3, Some(&sts), None), now());
    assert_eq!(status.phase, Some(ClusterPhase::Running));
    assert_eq!(status.ready_replicas, 3);
    assert_eq!(status.current_version.as_deref(), Some("16"));
    let ready = condition_of(&status, READY);
    assert_eq!(
        (ready.status.as_str(), ready.message.as_str()),
        ("True", "All 3 replicas are ready")
    );
    assert_eq!(condition_of(&status, PROGRESSING).status, "False");
}

#[test]
fn phases_follow_the_statefulset() {
    let running = compute(observe(3, Some(&sts(3, 3, 3, ("r1", "r1"))), None), now());
    let creating = compute(observe(3, Some(&sts(3, 1, 1, ("r1", "r1"))), None), now());
    assert_eq!(creating.phase, Some(ClusterPhase::Creating));
    let scaling = compute(
        observe(5, Some(&sts(5, 4, 3, ("r1", "r1"))), Some(&running)),
        now(),
    );
    assert_eq!(scaling.phase, Some(ClusterPhase::Scaling));
    let still_scaling = compute(
        observe(5, Some(&sts(5, 5, 4, ("r1", "r1"))), Some(&scaling)),
        now(),
    );
    assert_eq!(still_scaling.phase, Some(ClusterPhase::Scaling));
    let upgrading = compute(
        observe(3, Some(&sts(3, 3, 2, ("r1", "r2"))), Some(&running)),
        now(),
    );
    assert_eq!(upgrading.phase, Some(ClusterPhase::Upgrading));
    // Just after a new template is applied, before the StatefulSet controller saw it.
    let mut new_template = sts(3, 3, 3, ("r1", "r1"));
    new_template.metadata.generation = Some(3);
    let about_to_roll = compute(observe(3, Some(&new_template), Some(&running)), now());
    assert_eq!(about_to_roll.phase, Some(ClusterPhase::Upgrading));
    // The last replaced pod exists at the new revision but is not ready yet (`OnDelete`
    // leaves `currentRevision` behind): still the roll, not a degradation.
    let mut last_pod_starting = sts(3, 3, 2, ("r1", "r2"));
    if let Some(status) = last_pod_starting.status.as_mut() {
        status.updated_replicas = Some(3);
    }
    let finishing = compute(
        observe(3, Some(&last_pod_starting), Some(&upgrading)),
        now(),
    );
    assert_eq!(finishing.phase, Some(ClusterPhase::Upgrading));
    let degraded = compute(
        observe(3, Some(&sts(3, 3, 2, ("r1", "r1"))), Some(&running)),
        now(),
    );
    assert_eq!(degraded.phase, Some(ClusterPhase::Degraded));
}

#[test]
fn an_issue_shows_in_progressing_and_an_invalid_spec_fails() {
    let sts = sts(3, 3, 3, ("r1", "r1"));
    let refused = Issue {
        reason: "MajorUpgradeNotSupported".to_owned(),
        message: "PostgreSQL 16 cannot be changed to 17 in place".to_owned(),
        invalid_spec: false,
    };
    let mut observation = observe(3, Some(&sts), None);
    observation.issue = Some(&refused);
    let status = compute(observation, now());
    assert_eq!(status.phase, Some(ClusterPhase::Running));
    let progressing = condition_of(&status, PROGRESSING);
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("False", "MajorUpgradeNotSupported")
    );
    let invalid = Issue {
        invalid_spec: true,
        ..refused.clone()
    };
    observation.issue = Some(&invalid);
    assert_eq!(
        compute(observation, now()).phase,
        Some(ClusterPhase::Failed)
    );
}

#[test]
fn a_change_of_details_alone_is_told_from_a_change_of_the_summary() {
    let sts = sts(3, 3, 3, ("r1", "r1"));
    let first = compute(observe(3, Some(&sts), None), now());
    assert_eq!(difference(&first, None), Difference::Summary);

    let mut message = first.clone();
    message.conditions[0].message.push_str(", and more");
    assert_eq!(difference(&message, Some(&first)), Difference::Details);
    let mut instances = first.clone();
    instances.instances.push(InstanceStatus {
        name: "db-postgresql-0".to_owned(),
        role: InstanceRole::Unknown,
        ready: false,
        timeline: None,
        lag_bytes: None,
        streaming: None,
        message: None,
    });
    assert_eq!(difference(&instances, Some(&first)), Difference::Details);

    let mut reason = first.clone();
    reason.conditions[0].reason = "Other".to_owned();
    assert_eq!(difference(&reason, Some(&first)), Difference::Summary);
    let mut ready = instances.clone();
    ready.ready_replicas -= 1;
    assert_eq!(difference(&ready, Some(&first)), Difference::Summary);
}

#[test]
fn details_wait_until_the_hold_after_the_latest_transition_ends() {
    let sts = sts(3, 3, 3, ("r1", "r1"));
    let first = compute(observe(3, Some(&sts), None), now());
    let after = |seconds: i64| {
        Timestamp::from_second(now().as_second() + seconds).expect("valid timestamp")
    };
    assert_eq!(
        details_hold(&first, after(2)),
        Some(DETAILS_HOLD - std::time::Duration::from_secs(2))
    );
    assert_eq!(details_hold(&first, after(5)), None);
    assert_eq!(details_hold(&first, after(600)), None);
    // A clock behind the transition times holds for the hold, not longer.
    assert_eq!(details_hold(&first, after(-60)), Some(DETAILS_HOLD));
    // The latest transition counts.
    let mut later = first.clone();
    later.conditions[1].last_transition_time = Time(after(4));
    assert_eq!(
        details_hold(&later, after(6)),
        Some(std::time::Duration::from_secs(3))
    );
    let no_conditions = PostgreSQLClusterStatus::default();
    assert_eq!(details_hold(&no_conditions, after(1)), None);
}

#[test]
fn an_unchanged_status_is_not_written_and_keeps_its_transition_times() {
    let sts = sts(3, 3, 3, ("r1", "r1"));
    let first = compute(observe(3, Some(&sts), None), now());
    let later = Timestamp::from_second(1_700_000_600).expect("valid timestamp");
    let second = compute(observe(3, Some(&sts), Some(&first)), later);
    assert_eq!(difference(&second, Some(&first)), Difference::None);
    assert_eq!(second, first);
    assert!(events(&second, Some(&first)).is_empty());
}

#[test]
fn the_instance_replaying_wal_is_the_recovery_progress() {
    let instance = |name: &str, message: Option<&str>| pgkube_crds::InstanceStatus {
        name: name.to_owned(),
        role: pgkube_crds::InstanceRole::Unknown,
        ready: false,
        timeline: None,
        lag_bytes: None,
        streaming: None,
        message: message.map(str::to_owned),
    };
    let mut status = PostgreSQLClusterStatus {
        instances: vec![
            instance("db-0", Some("restoring the base backup b")),
            instance("db-1", None),
        ],
        ..PostgreSQLClusterStatus::default()
    };
    assert_eq!(recovery_progress(&status), None);
    status.instances[0].message = Some(format!(
        "{}2026-12-06T11:13:27Z: replayed to 0/7BAD87E8 (last transaction at 2026-12-06 11:13:08+00)",
        crate::storage::recovery::REPLAY_PROGRESS_PREFIX
    ));
    assert_eq!(
        recovery_progress(&status).as_deref(),
        Some(
            "db-0: recovering to 2026-12-06T11:13:27Z: replayed to 0/7BAD87E8 (last transaction at 2026-12-06 11:13:08+00)"
        )
    );
}

#[test]
fn events_are_made_on_changes_only() {
    let sts_ready = sts(3, 3, 3, ("r1", "r1"));
    let creating = compute(observe(3, Some(&sts(3, 1, 1, ("r1", "r1"))), None), now());
    let running = compute(observe(3, Some(&sts_ready), Some(&creating)), now());
    let made = events(&running, Some(&creating));
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(
        (made[0].reason.as_str(), made[0].note.as_str()),
        ("Running", "All 3 replicas are ready")
    );
    let refused = Issue {
        reason: "StorageShrinkRefused".to_owned(),
        message: "storage cannot shrink".to_owned(),
        invalid_spec: false,
    };
    let mut observation = observe(3, Some(&sts_ready), Some(&running));
    observation.issue = Some(&refused);
    let with_issue = compute(observation, now());
    let made = events(&with_issue, Some(&running));
    assert_eq!(made.len(), 1, "{made:?}");
    assert!(made[0].warning);
    assert_eq!(made[0].reason, "StorageShrinkRefused");
}

#[test]
fn a_ready_cluster_reports_its_primary_and_instances_with_their_lag() {
    let sts = sts(3, 3, 3, ("r1", "r1"));
    let mut instances = HEALTHY[..3].to_vec();
    // The second replica is 0x48 bytes behind.
    if let Ok(report) = &mut instances[2].report {
        report.replayed_lsn = Some(Lsn(0x0300_0100));
    }
    let observation = Observation {
        instances: &instances,
        backups: &[],
        restores: &[],
        bootstrap: None,
        failover_waiting: None,
        rollout_waiting: None,
        archive_root: None,
        in_place: None,
        ..observe(3, Some(&sts), None)
    };
    let status = compute(observation, now());
    assert_eq!(status.phase, Some(ClusterPhase::Running));
    assert_eq!(status.current_primary.as_deref(), Some(PRIMARY));
    let summary: Vec<_> = status
        .instances
        .iter()
        .map(|i| (i.name.as_str(), i.role, i.ready, i.lag_bytes, i.streaming))
        .collect();
    assert_eq!(
        summary,
        [
            ("db-postgresql-0", InstanceRole::Primary, true, None, None),
            (
                "db-postgresql-1",
                InstanceRole::Replica,
                true,
                Some(0),
                Some(true)
            ),
            (
                "db-postgresql-2",
                InstanceRole::Replica,
                true,
                Some(0x48),
                Some(true)
            ),
        ]
    );
    assert_eq!(status.instances[0].timeline, Some(1));
    let streaming = condition_of(&status, REPLICAS_STREAMING);
    assert_eq!(
        (streaming.status.as_str(), streaming.message.as_str()),
        ("True", "All 2 replicas are streaming")
    );
}

#[test]
fn a_ready_statefulset_is_not_running_until_the_primary_reports_a_ready_primary() {
    let sts = sts(2, 2, 2, ("r1", "r1"));
    let unreachable = [
        observed(PRIMARY, Err(Unavailable::Unreachable)),
        observed("db-postgresql-1", Err(Unavailable::Unreachable)),
    ];
    let observation = Observation {
        instances: &unreachable,
        backups: &[],
        restores: &[],
        bootstrap: None,
        failover_waiting: None,
        rollout_waiting: None,
        archive_root: None,
        in_place: None,
        ..observe(2, Some(&sts), None)
    };
    let creating = compute(observation, now());
    assert_eq!(creating.phase, Some(ClusterPhase::Creating));
    assert_eq!(creating.current_primary, None);
    let ready = condition_of(&creating, READY);
    assert_eq!(
        (
            ready.status.as_str(),
            ready.reason.as_str(),
            ready.message.as_str()
        ),
        (
            "False",
            "PrimaryNotReady",
            "2 of 2 replicas are ready; the primary db-postgresql-0: instance manager unreachable"
        )
    );
    assert_eq!(
        condition_of(&creating, PROGRESSING).message,
        "Creating 2 replicas: 2 ready; the primary db-postgresql-0: instance manager unreachable"
    );
    let roles: Vec<_> = creating
        .instances
        .iter()
        .map(|i| (i.role, i.ready))
        .collect();
    assert_eq!(
        roles,
        [
            (InstanceRole::Unknown, false),
            (InstanceRole::Unknown, false)
        ]
    );
    // Unreachable instances give the same status every time: an idle cluster writes nothing.
    let observation = Observation {
        instances: &unreachable,
        backups: &[],
        restores: &[],
        bootstrap: None,
        failover_waiting: None,
        rollout_waiting: None,
        archive_root: None,
        in_place: None,
        ..observe(2, Some(&sts), Some(&creating))
    };
    let again = compute(observation, now());
    assert_eq!(difference(&again, Some(&creating)), Difference::None);
    assert!(events(&again, Some(&creating)).is_empty());

    // Once running, a primary that stops answering degrades the cluster, and the
    // current primary stays what it was.
    let running = compute(observe(2, Some(&sts), None), now());
    assert_eq!(running.phase, Some(ClusterPhase::Running));
    let observation = Observation {
        instances: &unreachable,
        backups: &[],
        restores: &[],
        bootstrap: None,
        failover_waiting: None,
        rollout_waiting: None,
        archive_root: None,
        in_place: None,
        ..observe(2, Some(&sts), Some(&running))
    };
    let degraded = compute(observation, now());
    assert_eq!(degraded.phase, Some(ClusterPhase::Degraded));
    assert_eq!(degraded.current_primary.as_deref(), Some(PRIMARY));
    let progressing = condition_of(&degraded, PROGRESSING);
    assert_eq!(
        (progressing.reason.as_str(), progressing.message.as_str()),
        (
            "PrimaryUnavailable",
            "the primary db-postgresql-0: instance manager unreachable"
        )
    );
}

#[test]
fn a_primary_that_is_not_ready_or_not_a_primary_holds_the_phase() {
    let sts = sts(1, 1, 1, ("r1", "r1"));
    for (report, why) in [
        (
            InstanceReport {
                ready: false,
                ..report(PRIMARY, ReportedRole::Primary)
            },
            "not ready",
        ),
        (report(PRIMARY, ReportedRole::Replica), "reports a replica"),
        (report(PRIMARY, ReportedRole::Starting), "starting"),
    ] {
        let instances = [observed(PRIMARY, Ok(report))];
        let observation = Observation {
            instances: &instances,
            backups: &[],
            restores: &[],
            bootstrap: None,
            failover_waiting: None,
            rollout_waiting: None,
            archive_root: None,
            in_place: None,
            ..observe(1, Some(&sts), None)
        };
        let status = compute(observation, now());
        assert_eq!(status.phase, Some(ClusterPhase::Creating), "{why}");
        assert!(
            condition_of(&status, READY).message.ends_with(why),
            "{why}: {}",
            condition_of(&status, READY).message
        );
    }
}

#[test]
fn replicas_that_do_not_stream_are_named_with_the_reason() {
    let sts = sts(5, 4, 3, ("r1", "r1"));
    let instances = [
        HEALTHY[0].clone(),
        HEALTHY[1].clone(),
        observed(
            "db-postgresql-2",
            Ok(InstanceReport {
                streaming: false,
                ..report("db-postgresql-2", ReportedRole::Replica)
            }),
        ),
        observed("db-postgresql-3", Err(Unavailable::NoAddress)),
    ];
    let observation = Observation {
        instances: &instances,
        backups: &[],
        restores: &[],
        bootstrap: None,
        failover_waiting: None,
        rollout_waiting: None,
        archive_root: None,
        in_place: None,
        ..observe(5, Some(&sts), None)
    };
    let status = compute(observation, now());
    let streaming = condition_of(&status, REPLICAS_STREAMING);
    assert_eq!(
        (streaming.status.as_str(), streaming.reason.as_str()),
        ("False", "ReplicasNotStreaming")
    );
    assert_eq!(
        streaming.message,
        "db-postgresql-2: not streaming; db-postgresql-3: no pod address yet; \
         db-postgresql-4: no pod yet"
    );
    let lagging = &status.instances[2];
    assert_eq!(
        (lagging.streaming, lagging.lag_bytes),
        (Some(false), Some(0))
    );
    // One instance: nothing to stream.
    let single = compute(observe(1, Some(&sts), None), now());
    assert_eq!(
        condition_of(&single, REPLICAS_STREAMING).reason,
        "NoReplicas"
    );
}

#[test]
fn a_replica_that_stops_streaming_is_a_warning_and_its_recovery_a_normal_event() {
    let sts = sts(3, 3, 3, ("r1", "r1"));
    let streaming = compute(observe(3, Some(&sts), None), now());
    let mut instances = HEALTHY[..3].to_vec();
    instances[1] = observed("db-postgresql-1", Err(Unavailable::Unreachable));
    let observation = Observation {
        instances: &instances,
        backups: &[],
        restores: &[],
        bootstrap: None,
        failover_waiting: None,
        rollout_waiting: None,
        archive_root: None,
        in_place: None,
        ..observe(3, Some(&sts), Some(&streaming))
    };
    let broken = compute(observation, now());
    assert_eq!(difference(&broken, Some(&streaming)), Difference::Summary);
    let made = events(&broken, Some(&streaming));
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(
        (
            made[0].warning,
            made[0].reason.as_str(),
            made[0].note.as_str()
        ),
        (
            true,
            "ReplicaNotStreaming",
            "db-postgresql-1: instance manager unreachable"
        )
    );
    // The replica's trouble alone does not take the cluster out of Running.
    assert_eq!(broken.phase, Some(ClusterPhase::Running));
    let recovered = compute(observe(3, Some(&sts), Some(&broken)), now());
    let made = events(&recovered, Some(&broken));
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(
        (
            made[0].warning,
            made[0].reason.as_str(),
            made[0].note.as_str()
        ),
        (false, "ReplicasStreaming", "All 2 replicas are streaming")
    );
    // A new cluster whose replicas start streaming says so; one that starts without does
    // not warn.
    let starting = self::sts(3, 1, 1, ("r1", "r1"));
    let creating = compute(observe(3, Some(&starting), None), now());
    assert!(
        events(&creating, None)
            .iter()
            .all(|e| e.reason != "ReplicaNotStreaming")
    );
}

#[test]
fn the_current_primary_is_the_designated_one_once_it_reports_a_primary() {
    let sts = sts(3, 3, 3, ("r1", "r1"));
    let previous = PostgreSQLClusterStatus {
        current_primary: Some("db-postgresql-2".to_owned()),
        ..PostgreSQLClusterStatus::default()
    };
    // Instance 2 is designated but does not answer: it stays the current primary, and
    // instance 0, which calls itself a primary, is not taken for it.
    let observation = Observation {
        primary: "db-postgresql-2",
        instances: &HEALTHY[..1],
        backups: &[],
        restores: &[],
        bootstrap: None,
        failover_waiting: None,
        rollout_waiting: None,
        archive_root: None,
        in_place: None,
        ..observe(3, Some(&sts), Some(&previous))
    };
    let status = compute(observation, now());
    assert_eq!(status.current_primary.as_deref(), Some("db-postgresql-2"));
    assert_ne!(status.phase, Some(ClusterPhase::Running));
}
