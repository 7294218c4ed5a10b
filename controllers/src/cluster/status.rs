//! Status (pure): phase, ready replicas, version and the Ready and Progressing conditions from
//! what was observed, and the Events that a change of them deserves.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use pgkube_crds::{ClusterPhase, PostgreSQLClusterStatus};

use super::build::VERSION_ANNOTATION;

/// Condition types this controller owns.
pub const READY: &str = "Ready";
pub const PROGRESSING: &str = "Progressing";

/// Something that keeps the cluster from matching its spec, shown in Progressing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issue {
    pub reason: String,
    pub message: String,
    /// The spec cannot work at all (phase Failed) rather than a change being held back.
    pub invalid_spec: bool,
}

/// What the status is computed from.
#[derive(Clone, Copy, Debug)]
pub struct Observation<'a> {
    pub generation: Option<i64>,
    pub desired_replicas: i32,
    /// The StatefulSet as it is after this reconcile's apply, if it exists.
    pub statefulset: Option<&'a StatefulSet>,
    pub issue: Option<&'a Issue>,
    pub previous: Option<&'a PostgreSQLClusterStatus>,
}

/// An Event to publish about the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    pub warning: bool,
    pub reason: String,
    pub note: String,
}

/// The status this controller owns (other controllers' fields are left out), with condition
/// transition times carried over from `previous` when a condition did not change.
pub fn compute(observation: Observation<'_>, now: Timestamp) -> PostgreSQLClusterStatus {
    let rollout = observation.statefulset.map(Rollout::of);
    let ready_replicas = rollout.as_ref().map_or(0, |r| r.ready);
    let previous_phase = observation.previous.and_then(|s| s.phase);
    let phase = phase(observation, rollout.as_ref(), previous_phase);
    let current_version = match (&rollout, observation.statefulset) {
        (Some(r), Some(sts)) if r.settled && r.ready >= observation.desired_replicas => sts
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(VERSION_ANNOTATION))
            .cloned(),
        _ => None,
    }
    .or_else(|| observation.previous.and_then(|s| s.current_version.clone()));
    let conditions = vec![
        ready_condition(observation, ready_replicas, phase),
        progressing_condition(observation, ready_replicas, phase),
    ]
    .into_iter()
    .map(|condition| keep_transition_time(condition, observation.previous, now))
    .collect();
    PostgreSQLClusterStatus {
        phase: Some(phase),
        ready_replicas,
        current_version,
        observed_generation: observation.generation,
        conditions,
        ..PostgreSQLClusterStatus::default()
    }
}

/// Whether `new` differs from `previous` in any field this controller owns (transition times
/// aside). Equal means no status write.
pub fn changed(new: &PostgreSQLClusterStatus, previous: Option<&PostgreSQLClusterStatus>) -> bool {
    let Some(previous) = previous else {
        return true;
    };
    let same_condition = |condition: &Condition| {
        previous
            .conditions
            .iter()
            .find(|c| c.type_ == condition.type_)
            .is_some_and(|c| {
                c.status == condition.status
                    && c.reason == condition.reason
                    && c.message == condition.message
                    && c.observed_generation == condition.observed_generation
            })
    };
    new.phase != previous.phase
        || new.ready_replicas != previous.ready_replicas
        || new.current_version != previous.current_version
        || new.observed_generation != previous.observed_generation
        || !new.conditions.iter().all(same_condition)
}

/// Events for what changed between `previous` and `new`: a new phase, or a new reason why
/// the cluster does not progress.
pub fn events(
    new: &PostgreSQLClusterStatus,
    previous: Option<&PostgreSQLClusterStatus>,
) -> Vec<EventSpec> {
    let mut events = Vec::new();
    let find = |status: Option<&PostgreSQLClusterStatus>, type_: &str| {
        status.and_then(|s| s.conditions.iter().find(|c| c.type_ == type_).cloned())
    };
    if let Some(phase) = new.phase
        && previous.and_then(|p| p.phase) != Some(phase)
    {
        let note = find(Some(new), READY)
            .map(|c| c.message)
            .unwrap_or_default();
        events.push(EventSpec {
            warning: matches!(phase, ClusterPhase::Degraded | ClusterPhase::Failed),
            reason: format!("{phase:?}"),
            note,
        });
    }
    if let Some(progressing) = find(Some(new), PROGRESSING)
        && progressing.status == "False"
        && !matches!(
            progressing.reason.as_str(),
            "Complete" | "ReplicasUnavailable"
        )
        && find(previous, PROGRESSING).map(|c| (c.reason, c.message))
            != Some((progressing.reason.clone(), progressing.message.clone()))
    {
        events.push(EventSpec {
            warning: true,
            reason: progressing.reason,
            note: progressing.message,
        });
    }
    events
}

/// Progress of the StatefulSet towards its spec.
struct Rollout {
    ready: i32,
    /// Pods that exist.
    current: i32,
    /// The StatefulSet controller has seen the latest spec.
    seen: bool,
    /// It has, and every pod runs the latest revision.
    settled: bool,
    /// Pods are being replaced by a new revision.
    updating: bool,
}

impl Rollout {
    fn of(sts: &StatefulSet) -> Self {
        let status = sts.status.clone().unwrap_or_default();
        let spec_replicas = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let seen = status.observed_generation >= sts.metadata.generation;
        let updating = status.update_revision.is_some()
            && status.current_revision.is_some()
            && status.update_revision != status.current_revision;
        let updated = status.updated_replicas.unwrap_or(0) >= spec_replicas;
        Self {
            ready: status.ready_replicas.unwrap_or(0),
            current: status.replicas,
            seen,
            settled: seen && !updating && updated,
            updating,
        }
    }
}

fn phase(
    observation: Observation<'_>,
    rollout: Option<&Rollout>,
    previous: Option<ClusterPhase>,
) -> ClusterPhase {
    if observation.issue.is_some_and(|i| i.invalid_spec) {
        return ClusterPhase::Failed;
    }
    let Some(rollout) = rollout else {
        return ClusterPhase::Pending;
    };
    let desired = observation.desired_replicas;
    if rollout.settled && rollout.ready == desired && rollout.current == desired {
        return ClusterPhase::Running;
    }
    match previous {
        None | Some(ClusterPhase::Pending | ClusterPhase::Creating | ClusterPhase::Failed) => {
            ClusterPhase::Creating
        }
        _ if rollout.updating => ClusterPhase::Upgrading,
        _ if rollout.current != desired => ClusterPhase::Scaling,
        // Scaling up adds pods one at a time: stay in Scaling until all are ready.
        Some(ClusterPhase::Scaling) => ClusterPhase::Scaling,
        // The StatefulSet controller has not seen the spec just applied, and the replicas did
        // not change: a new pod template, whose roll is about to start (not a degradation).
        _ if !rollout.seen => ClusterPhase::Upgrading,
        Some(ClusterPhase::Upgrading) if !rollout.settled => ClusterPhase::Upgrading,
        _ => ClusterPhase::Degraded,
    }
}

fn ready_condition(observation: Observation<'_>, ready: i32, phase: ClusterPhase) -> Condition {
    let desired = observation.desired_replicas;
    let (status, reason, message) = if phase == ClusterPhase::Failed {
        let issue = observation
            .issue
            .map(|i| i.message.clone())
            .unwrap_or_default();
        ("False", "InvalidSpec", issue)
    } else if ready >= desired && desired > 0 {
        let noun = if desired == 1 {
            "replica is"
        } else {
            "replicas are"
        };
        (
            "True",
            "AllReplicasReady",
            format!("All {desired} {noun} ready"),
        )
    } else {
        (
            "False",
            "ReplicasNotReady",
            format!("{ready} of {desired} replicas are ready"),
        )
    };
    condition(READY, status, reason, message, observation.generation)
}

fn progressing_condition(
    observation: Observation<'_>,
    ready: i32,
    phase: ClusterPhase,
) -> Condition {
    let desired = observation.desired_replicas;
    let (status, reason, message) = match (observation.issue, phase) {
        (Some(issue), _) => ("False", issue.reason.clone(), issue.message.clone()),
        (None, ClusterPhase::Running) => (
            "False",
            "Complete".to_owned(),
            "The cluster matches its spec".to_owned(),
        ),
        (None, ClusterPhase::Degraded) => (
            "False",
            "ReplicasUnavailable".to_owned(),
            format!("{ready} of {desired} replicas are ready"),
        ),
        (None, ClusterPhase::Pending | ClusterPhase::Creating) => (
            "True",
            "Creating".to_owned(),
            format!("Creating {desired} replicas: {ready} ready"),
        ),
        (None, ClusterPhase::Scaling) => (
            "True",
            "Scaling".to_owned(),
            format!("Scaling to {desired} replicas: {ready} ready"),
        ),
        (None, ClusterPhase::Upgrading | ClusterPhase::Failed) => (
            "True",
            "RollingUpdate".to_owned(),
            format!("Replacing pods with the new revision: {ready} of {desired} ready"),
        ),
    };
    condition(
        PROGRESSING,
        status,
        &reason,
        message,
        observation.generation,
    )
}

fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        // Set by `keep_transition_time`.
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
    }
}

fn keep_transition_time(
    mut condition: Condition,
    previous: Option<&PostgreSQLClusterStatus>,
    now: Timestamp,
) -> Condition {
    let before = previous.and_then(|p| p.conditions.iter().find(|c| c.type_ == condition.type_));
    condition.last_transition_time = match before {
        Some(before) if before.status == condition.status => before.last_transition_time.clone(),
        _ => Time(now),
    };
    condition
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{StatefulSetSpec, StatefulSetStatus};
    use std::collections::BTreeMap;

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
            updated_replicas: Some(replicas),
            current_revision: Some(revisions.0.to_owned()),
            update_revision: Some(revisions.1.to_owned()),
            ..StatefulSetStatus::default()
        });
        sts
    }

    fn observe<'a>(
        desired: i32,
        sts: Option<&'a StatefulSet>,
        previous: Option<&'a PostgreSQLClusterStatus>,
    ) -> Observation<'a> {
        Observation {
            generation: Some(1),
            desired_replicas: desired,
            statefulset: sts,
            issue: None,
            previous,
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
    fn an_unchanged_status_is_not_written_and_keeps_its_transition_times() {
        let sts = sts(3, 3, 3, ("r1", "r1"));
        let first = compute(observe(3, Some(&sts), None), now());
        let later = Timestamp::from_second(1_700_000_600).expect("valid timestamp");
        let second = compute(observe(3, Some(&sts), Some(&first)), later);
        assert!(!changed(&second, Some(&first)));
        assert_eq!(second, first);
        assert!(events(&second, Some(&first)).is_empty());
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
}
