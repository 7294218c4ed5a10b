//! Unit tests of the decisions about the primary.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::*;
use crate::cluster::instances::{InstanceReport, Unavailable};

const STS: &str = "db-postgresql";

fn pod(ordinal: i32) -> String {
    format!("{STS}-{ordinal}")
}

fn now() -> Timestamp {
    "2026-12-01T02:00:00Z".parse().expect("timestamp")
}

fn seconds_ago(seconds: i64) -> Timestamp {
    now() - k8s_openapi::jiff::SignedDuration::from_secs(seconds)
}

/// An instance that reports `role`, ready, at WAL position `lsn`, following `following`.
fn reporting(
    ordinal: i32,
    role: ReportedRole,
    lsn: u64,
    following: Option<i32>,
) -> ObservedInstance {
    let replica = role == ReportedRole::Replica;
    ObservedInstance {
        pod: pod(ordinal),
        uid: Some(format!("uid-{ordinal}")),
        role_label: None,
        report: Ok(InstanceReport {
            pod: pod(ordinal),
            role,
            ready: role != ReportedRole::Starting,
            timeline: Some(1),
            current_lsn: (!replica).then_some(Lsn(lsn)),
            received_lsn: replica.then_some(Lsn(lsn)),
            replayed_lsn: replica.then_some(Lsn(lsn)),
            streaming: replica,
            pending_restart: Vec::new(),
            following: following.map(pod),
            system_identifier: None,
            initialized_by: None,
            message: None,
            restart_by_switchover: false,
            settings_digest: None,
            wal_archive: None,
            in_place: None,
            manager_digest: None,
            certificate_authorities: None,
        }),
    }
}

fn primary(ordinal: i32, lsn: u64) -> ObservedInstance {
    reporting(ordinal, ReportedRole::Primary, lsn, None)
}

fn replica(ordinal: i32, lsn: u64, following: i32) -> ObservedInstance {
    reporting(ordinal, ReportedRole::Replica, lsn, Some(following))
}

fn unreachable(ordinal: i32) -> ObservedInstance {
    ObservedInstance {
        pod: pod(ordinal),
        uid: None,
        role_label: None,
        report: Err(Unavailable::Unreachable),
    }
}

/// A status whose primary is `current`, unavailable since `since` when given.
fn status(current: i32, unavailable_since: Option<Timestamp>) -> PostgreSQLClusterStatus {
    PostgreSQLClusterStatus {
        current_primary: Some(pod(current)),
        conditions: unavailable_since
            .map(|since| Condition {
                type_: PRIMARY_AVAILABLE.to_owned(),
                status: "False".to_owned(),
                reason: "PrimaryUnavailable".to_owned(),
                message: String::new(),
                observed_generation: None,
                last_transition_time: Time(since),
            })
            .into_iter()
            .collect(),
        ..PostgreSQLClusterStatus::default()
    }
}

pub(super) fn situation<'a>(
    status: &'a PostgreSQLClusterStatus,
    primary: &'a str,
    instances: &'a [ObservedInstance],
) -> Situation<'a> {
    Situation {
        statefulset: STS,
        replicas: 3,
        requested_replicas: 3,
        outdated: &[],
        supervised_update: false,
        failover_delay: Duration::from_secs(5),
        fence_wait: Duration::from_secs(5),
        synchronous_min: 0,
        status: Some(status),
        primary,
        switchover_request: None,
        instances,
        restoring: false,
        now: now(),
    }
}

#[test]
fn a_healthy_cluster_decides_nothing_and_commands_nothing() {
    let status = status(0, None);
    let instances = [primary(0, 100), replica(1, 100, 0), replica(2, 90, 0)];
    let primary_pod = pod(0);
    let situation = situation(&status, &primary_pod, &instances);
    assert_eq!(plan(&situation), Plan::default());
    assert!(commands(&situation).is_empty());
}

#[test]
fn a_lost_primary_is_failed_over_to_the_replica_with_the_most_wal_after_the_delay() {
    let instances = [unreachable(0), replica(1, 90, 0), replica(2, 120, 0)];
    let primary_pod = pod(0);
    // Within the delay: nothing yet, but look again soon.
    let early = status(0, Some(seconds_ago(3)));
    let early_plan = plan(&situation(&early, &primary_pod, &instances));
    assert_eq!(early_plan.designate, None);
    assert!(early_plan.urgent && !early_plan.carrying);
    // After it: the replica with the most WAL.
    let late = status(0, Some(seconds_ago(6)));
    let change = plan(&situation(&late, &primary_pod, &instances))
        .designate
        .expect("a failover");
    assert_eq!(change.kind, PrimaryChangeKind::Failover);
    assert_eq!(
        (change.from.as_str(), change.to.as_str()),
        ("db-postgresql-0", "db-postgresql-2")
    );
    assert!(
        change.reason.contains("instance manager unreachable"),
        "{}",
        change.reason
    );
}

#[test]
fn among_equals_the_lowest_ordinal_is_promoted() {
    let instances = [unreachable(0), replica(1, 100, 0), replica(2, 100, 0)];
    let late = status(0, Some(seconds_ago(60)));
    let primary_pod = pod(0);
    let change = plan(&situation(&late, &primary_pod, &instances)).designate;
    assert_eq!(change.map(|c| c.to), Some(pod(1)));
}

#[test]
fn without_a_ready_replica_the_cluster_waits_and_says_why() {
    let late = status(0, Some(seconds_ago(60)));
    let primary_pod = pod(0);
    let instances = [
        unreachable(0),
        unreachable(1),
        reporting(2, ReportedRole::Starting, 0, None),
    ];
    let plan = plan(&situation(&late, &primary_pod, &instances));
    assert_eq!(plan.designate, None);
    assert!(plan.waiting.expect("a reason").contains("no ready replica"));
}

#[test]
fn a_cluster_whose_primary_never_came_up_does_not_fail_over() {
    let mut new = status(0, Some(seconds_ago(600)));
    new.current_primary = None;
    let primary_pod = pod(0);
    let instances = [
        reporting(0, ReportedRole::Starting, 0, None),
        replica(1, 0, 0),
    ];
    assert_eq!(
        plan(&situation(&new, &primary_pod, &instances)).designate,
        None
    );
}

#[test]
fn failover_waits_while_a_restore_runs() {
    let late = status(0, Some(seconds_ago(60)));
    let primary_pod = pod(0);
    let instances = [unreachable(0), replica(1, 100, 0)];
    let mut restoring = situation(&late, &primary_pod, &instances);
    restoring.restoring = true;
    let plan = plan(&restoring);
    assert_eq!(plan.designate, None);
    assert!(plan.waiting.expect("a reason").contains("restore"));
}

#[test]
fn with_synchronous_replication_enough_replicas_must_answer() {
    let late = status(0, Some(seconds_ago(60)));
    let primary_pod = pod(0);
    // ANY 1 of 2 standbys: one of any 2 has every acknowledged commit; one answering is not
    // enough, as the other may be the only one that confirmed the last commits.
    let one_answers = [unreachable(0), replica(1, 100, 0), unreachable(2)];
    let mut sync = situation(&late, &primary_pod, &one_answers);
    sync.synchronous_min = 1;
    let waiting = plan(&sync).waiting.expect("waits");
    assert!(
        waiting.contains("1 of 2 replicas answer, 2 are needed"),
        "{waiting}"
    );
    let both_answer = [unreachable(0), replica(1, 100, 0), replica(2, 110, 0)];
    sync.instances = &both_answer;
    assert_eq!(plan(&sync).designate.map(|c| c.to), Some(pod(2)));
    // ANY 2 of 2: every replica has every acknowledged commit; one answering suffices.
    sync.synchronous_min = 2;
    sync.instances = &one_answers;
    assert_eq!(plan(&sync).designate.map(|c| c.to), Some(pod(1)));
}

#[test]
fn a_switchover_to_a_streaming_replica_is_recorded_and_the_request_cleared() {
    let healthy = status(0, None);
    let primary_pod = pod(0);
    let instances = [primary(0, 100), replica(1, 100, 0), replica(2, 100, 0)];
    let target = pod(2);
    let mut asked = situation(&healthy, &primary_pod, &instances);
    asked.switchover_request = Some(&target);
    let plan = plan(&asked);
    assert!(plan.clear_request);
    let change = plan.designate.expect("a switchover");
    assert_eq!(change.kind, PrimaryChangeKind::Switchover);
    assert_eq!(change.to, target);
}

#[test]
fn bad_switchover_requests_are_refused_with_the_reason() {
    let healthy = status(0, None);
    let primary_pod = pod(0);
    let instances = [primary(0, 100), replica(1, 100, 0), unreachable(2)];
    let refusal = |target: &str, instances: &[ObservedInstance]| {
        let mut asked = situation(&healthy, &primary_pod, instances);
        asked.switchover_request = Some(target);
        let plan = plan(&asked);
        assert!(plan.clear_request && plan.designate.is_none());
        plan.refusal.expect("refused")
    };
    assert!(refusal("db-postgresql-7", &instances).contains("not an instance of this cluster"));
    assert!(refusal("other-0", &instances).contains("not an instance"));
    assert!(refusal(&pod(2), &instances).contains("not a ready replica"));
    let lost = [unreachable(0), replica(1, 100, 0)];
    assert!(refusal(&pod(1), &lost).contains("is not available"));
    // Asking for the primary it already is: nothing to do, nothing refused.
    let mut same = situation(&healthy, &primary_pod, &instances);
    same.switchover_request = Some(&primary_pod);
    assert_eq!(
        plan(&same),
        Plan {
            clear_request: true,
            ..Plan::default()
        }
    );
}

#[test]
fn a_request_during_a_change_waits_for_it() {
    let mut moving = status(0, None);
    moving.target_primary = Some(pod(1));
    let target = pod(1);
    let instances = [primary(0, 100), replica(1, 100, 0)];
    let other = pod(0);
    let mut asked = situation(&moving, &target, &instances);
    asked.switchover_request = Some(&other);
    let plan = plan(&asked);
    assert!(!plan.clear_request && plan.designate.is_none() && plan.urgent);
    assert!(
        plan.carrying,
        "the change under way is looked at step by step"
    );
}

fn switchover_status(from: i32, to: i32, started: Timestamp) -> PostgreSQLClusterStatus {
    let mut status = status(from, None);
    status.target_primary = Some(pod(to));
    status.primary_change = Some(PrimaryChange {
        kind: PrimaryChangeKind::Switchover,
        from: pod(from),
        to: pod(to),
        reason: String::new(),
        started_at: Time(started),
        completed_at: None,
        term: None,
    });
    status
}

#[test]
fn a_switchover_demotes_the_old_primary_before_it_promotes_the_target() {
    let moving = switchover_status(0, 1, seconds_ago(1));
    let target = pod(1);
    // The old primary still runs: it is told to follow; the target is not promoted yet.
    let before = [primary(0, 100), replica(1, 100, 0), replica(2, 100, 0)];
    assert_eq!(
        commands(&situation(&moving, &target, &before)),
        vec![
            Command::Follow {
                pod: pod(0),
                primary: target.clone()
            },
            Command::Follow {
                pod: pod(2),
                primary: target.clone()
            },
        ]
    );
    // Stopping: it answers nothing useful; still no promotion (within the delay).
    let stopping = [
        reporting(0, ReportedRole::Starting, 0, None),
        replica(1, 100, 0),
    ];
    assert!(commands(&situation(&moving, &target, &stopping)).is_empty());
    // It follows: the target has all it wrote, and is promoted.
    let stepped_down = [replica(0, 100, 1), replica(1, 100, 0)];
    assert_eq!(
        commands(&situation(&moving, &target, &stepped_down)),
        vec![Command::Promote {
            pod: target.clone()
        }]
    );
}

#[test]
fn a_target_behind_another_instance_is_not_promoted() {
    let moving = switchover_status(0, 1, seconds_ago(1));
    let target = pod(1);
    let behind = [replica(0, 120, 1), replica(1, 100, 0)];
    assert!(commands(&situation(&moving, &target, &behind)).is_empty());
}

#[test]
fn a_failover_promotes_its_target_whatever_wal_others_show_later() {
    let mut failing_over = switchover_status(0, 1, seconds_ago(1));
    if let Some(change) = failing_over.primary_change.as_mut() {
        change.kind = PrimaryChangeKind::Failover;
    }
    let target = pod(1);
    // 0 came back ahead of the target (it reports a replica, told to follow); 2, which did not
    // answer when the failover was decided, is ahead too: their extra WAL is rewound away.
    let back = [replica(0, 150, 1), replica(1, 100, 0), replica(2, 110, 0)];
    assert!(
        commands(&situation(&failing_over, &target, &back)).contains(&Command::Promote {
            pod: target.clone()
        })
    );
    // But never while another instance still runs as a primary.
    let still_primary = [primary(0, 150), replica(1, 100, 0)];
    assert!(
        !commands(&situation(&failing_over, &target, &still_primary)).contains(&Command::Promote {
            pod: target.clone()
        })
    );
}

#[test]
fn a_switchover_whose_old_primary_is_lost_goes_on_after_the_delay() {
    let target = pod(1);
    let lost = [unreachable(0), replica(1, 100, 0)];
    let recent = switchover_status(0, 1, seconds_ago(2));
    assert!(commands(&situation(&recent, &target, &lost)).is_empty());
    let old = switchover_status(0, 1, seconds_ago(10));
    assert_eq!(
        commands(&situation(&old, &target, &lost)),
        vec![Command::Promote {
            pod: target.clone()
        }]
    );
}

#[test]
fn after_a_failover_the_old_primary_that_returns_is_told_to_follow() {
    // The failover made 2 the primary; 0 comes back still believing it is one.
    let settled = status(2, None);
    let primary_pod = pod(2);
    let instances = [primary(0, 80), replica(1, 100, 0), primary(2, 130)];
    assert_eq!(
        commands(&situation(&settled, &primary_pod, &instances)),
        vec![
            Command::Follow {
                pod: pod(0),
                primary: primary_pod.clone()
            },
            Command::Follow {
                pod: pod(1),
                primary: primary_pod.clone()
            },
        ]
    );
}

/// `instance`, its server not ready for `why`.
fn not_ready(instance: ObservedInstance, why: &str) -> ObservedInstance {
    let report = instance.report.map(|report| InstanceReport {
        ready: false,
        streaming: false,
        message: Some(why.to_owned()),
        ..report
    });
    ObservedInstance { report, ..instance }
}

#[test]
fn a_primary_that_accepts_no_connection_is_failed_over_and_stops_before_the_promotion() {
    let hung = "the server accepts no new connection";
    let instances = [
        not_ready(primary(0, 100), hung),
        replica(1, 100, 0),
        replica(2, 90, 0),
    ];
    let primary_pod = pod(0);
    let late = status(0, Some(seconds_ago(6)));
    let change = plan(&situation(&late, &primary_pod, &instances))
        .designate
        .expect("a failover");
    assert_eq!(change.to, pod(1));
    assert!(
        change.reason.contains(&format!("not ready: {hung}")),
        "{}",
        change.reason
    );
    // Once recorded: the old primary, which still reports a primary, is told to follow, and
    // the target is promoted only once it no longer does.
    let mut failing_over = switchover_status(0, 1, seconds_ago(1));
    if let Some(change) = failing_over.primary_change.as_mut() {
        change.kind = PrimaryChangeKind::Failover;
    }
    let target = pod(1);
    assert_eq!(
        commands(&situation(&failing_over, &target, &instances)),
        vec![
            Command::Follow {
                pod: pod(0),
                primary: target.clone()
            },
            Command::Follow {
                pod: pod(2),
                primary: target.clone()
            },
        ]
    );
    let stopped = [unreachable(0), replica(1, 100, 0), replica(2, 90, 1)];
    assert_eq!(
        commands(&situation(&failing_over, &target, &stopped)),
        vec![Command::Promote { pod: target }]
    );
}

#[test]
fn the_primary_of_a_stale_report_is_failed_over() {
    let stale = ObservedInstance {
        report: Err(Unavailable::Stale),
        ..unreachable(0)
    };
    let instances = [stale, replica(1, 100, 0), replica(2, 90, 0)];
    let primary_pod = pod(0);
    let late = status(0, Some(seconds_ago(6)));
    let change = plan(&situation(&late, &primary_pod, &instances))
        .designate
        .expect("a failover");
    assert_eq!(change.to, pod(1));
    assert!(
        change.reason.contains("status is stale"),
        "{}",
        change.reason
    );
}

#[test]
fn a_replica_that_is_not_ready_is_neither_promoted_nor_counted_for_the_quorum() {
    let late = status(0, Some(seconds_ago(60)));
    let primary_pod = pod(0);
    let hung = "the server accepts no new connection";
    // It received the most WAL, but its server takes no connection.
    let instances = [
        unreachable(0),
        replica(1, 100, 0),
        not_ready(replica(2, 150, 0), hung),
    ];
    let mut asynchronous = situation(&late, &primary_pod, &instances);
    assert_eq!(plan(&asynchronous).designate.map(|c| c.to), Some(pod(1)));
    // ANY 1 of 2: the replica that is not ready may be the only one with the last commits.
    asynchronous.synchronous_min = 1;
    let waiting = plan(&asynchronous).waiting.expect("waits");
    assert!(waiting.contains("1 of 2 replicas answer"), "{waiting}");
}

#[test]
fn the_watch_period_is_half_the_delay_within_bounds() {
    assert_eq!(
        watch_period(Duration::from_secs(5), false, false),
        Duration::from_millis(2500)
    );
    assert_eq!(
        watch_period(Duration::from_secs(1), false, false),
        Duration::from_secs(1)
    );
    assert_eq!(
        watch_period(Duration::from_secs(600), false, false),
        crate::cluster::INSTANCE_REFRESH
    );
    assert_eq!(
        watch_period(Duration::from_secs(600), true, false),
        Duration::from_secs(1)
    );
    // A change under way is carried through step by step, each looked at soon.
    assert_eq!(
        watch_period(Duration::from_secs(600), true, true),
        CHANGE_PERIOD
    );
}

/// A failover to `to` decided `started` ago, with term `term`.
fn failover_status(from: i32, to: i32, started: Timestamp, term: i64) -> PostgreSQLClusterStatus {
    let mut status = switchover_status(from, to, started);
    if let Some(change) = status.primary_change.as_mut() {
        change.kind = PrimaryChangeKind::Failover;
        change.term = Some(term);
    }
    status
}

#[test]
fn a_failover_whose_target_is_lost_is_decided_again_with_the_next_term() {
    let target = pod(1);
    // Its server died (the instance manager says so).
    let lost = [
        unreachable(0),
        reporting(1, ReportedRole::Starting, 0, None),
        replica(2, 100, 0),
    ];
    // Within the delay the target may still come: nothing new.
    let recent = failover_status(0, 1, seconds_ago(2), 4);
    assert_eq!(plan(&situation(&recent, &target, &lost)).designate, None);
    // After it, the best other replica is the new target, from the lost one.
    let old = failover_status(0, 1, seconds_ago(6), 4);
    let change = plan(&situation(&old, &target, &lost))
        .designate
        .expect("decided again");
    assert_eq!(
        (change.kind, change.from.as_str(), change.to.as_str()),
        (
            PrimaryChangeKind::Failover,
            target.as_str(),
            pod(2).as_str()
        )
    );
    assert_eq!(change.term, Some(5));
    assert!(change.reason.contains("decided again"), "{}", change.reason);
    // A target that answers as a ready replica (promotion under way) is not replaced.
    let alive = [unreachable(0), replica(1, 100, 0), replica(2, 100, 0)];
    assert_eq!(plan(&situation(&old, &target, &alive)).designate, None);
    // Nor one that does not answer at all: it may be alive with a promotion in its queue.
    let silent = [unreachable(0), unreachable(1), replica(2, 100, 0)];
    assert_eq!(plan(&situation(&old, &target, &silent)).designate, None);
}

#[test]
fn a_switchover_whose_target_never_takes_over_is_decided_again() {
    let target = pod(1);
    let stuck = [replica(0, 100, 1), replica(1, 90, 0), replica(2, 80, 0)];
    let recent = switchover_status(0, 1, seconds_ago(30));
    assert_eq!(plan(&situation(&recent, &target, &stuck)).designate, None);
    let old = switchover_status(0, 1, seconds_ago(61));
    let change = plan(&situation(&old, &target, &stuck))
        .designate
        .expect("decided again");
    // The old primary stepped down with the most WAL: it takes over again.
    assert_eq!(change.to, pod(0));
    assert_eq!(change.term, Some(1));
}

#[test]
fn the_latest_timeline_ranks_before_the_most_wal() {
    let mut behind_on_newer = replica(1, 90, 0);
    let mut ahead_on_older = replica(2, 120, 0);
    if let (Ok(newer), Ok(older)) = (&mut behind_on_newer.report, &mut ahead_on_older.report) {
        newer.timeline = Some(3);
        older.timeline = Some(2);
    }
    let instances = [unreachable(0), behind_on_newer, ahead_on_older];
    let primary_pod = pod(0);
    let lost = status(0, Some(seconds_ago(6)));
    let change = plan(&situation(&lost, &primary_pod, &instances))
        .designate
        .expect("a failover");
    assert_eq!(change.to, pod(1));
}

#[test]
fn the_synchronous_quorum_counts_only_replicas_that_could_be_promoted() {
    let mut starting = replica(2, 100, 0);
    if let Ok(report) = &mut starting.report {
        report.ready = false;
    }
    let instances = [unreachable(0), replica(1, 100, 0), starting];
    let primary_pod = pod(0);
    let lost = status(0, Some(seconds_ago(6)));
    // ANY 1 of 2 standbys: 2 - 1 + 1 = 2 promotable replicas are needed; one is not ready.
    let synchronous = Situation {
        synchronous_min: 1,
        ..situation(&lost, &primary_pod, &instances)
    };
    let plan = plan(&synchronous);
    assert_eq!(plan.designate, None);
    assert!(
        plan.waiting
            .as_deref()
            .is_some_and(|why| why.contains("1 of 2")),
        "{plan:?}"
    );
}

/// A failover delay shorter than the fence wait: 1 s, and 5 s for a cut-off primary to fence.
fn quick<'a>(
    status: &'a PostgreSQLClusterStatus,
    primary: &'a str,
    instances: &'a [ObservedInstance],
) -> Situation<'a> {
    Situation {
        failover_delay: Duration::from_secs(1),
        fence_wait: Duration::from_secs(5),
        ..situation(status, primary, instances)
    }
}

#[test]
fn a_primary_that_may_run_unseen_is_given_the_time_to_fence_itself() {
    let primary_pod = pod(0);
    let answering = [replica(1, 100, 0), replica(2, 90, 0)];
    // Its manager does not answer, or its pod is gone (its processes may still run).
    let unanswered = [unreachable(0), answering[0].clone(), answering[1].clone()];
    for instances in [&unanswered[..], &answering[..]] {
        let early = status(0, Some(seconds_ago(3)));
        let decided = plan(&quick(&early, &primary_pod, instances));
        assert_eq!(decided.designate, None, "{decided:?}");
        let late = status(0, Some(seconds_ago(5)));
        let decided = plan(&quick(&late, &primary_pod, instances));
        assert_eq!(
            decided.designate.map(|change| change.to),
            Some(pod(1)),
            "after the fence wait"
        );
    }
}

#[test]
fn a_primary_whose_manager_says_its_server_is_down_is_failed_over_after_the_delay() {
    let primary_pod = pod(0);
    let stopped = reporting(0, ReportedRole::Starting, 100, None);
    let instances = [stopped, replica(1, 100, 0), replica(2, 90, 0)];
    let lost = status(0, Some(seconds_ago(2)));
    let decided = plan(&quick(&lost, &primary_pod, &instances));
    assert_eq!(decided.designate.map(|change| change.to), Some(pod(1)));
}
