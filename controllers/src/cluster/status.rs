//! Status (pure): phase, ready replicas, version, primary, instances, the last successful
//! backup and the Ready, Progressing, ReplicasStreaming, BackupComplete, Restoring and
//! Bootstrapped conditions from what was observed, and the Events that a change of them
//! deserves.
//!
//! A cluster bootstrapped from a backup is not Running (nor Ready) before its bootstrap restore
//! completed, and is Failed when that restore failed.
//!
//! The cluster is Running only when its StatefulSet is ready *and* the designated primary's
//! instance manager reports a ready primary. Everything here comes from reports that only
//! change when the instances do (an instance that does not answer is described by a fixed
//! reason, never by the error's text), so an idle cluster computes the same status every time
//! and writes nothing.
//!
//! A change of details alone (a message, what the instances report) that comes within
//! [`DETAILS_HOLD`] of a condition's transition waits for the hold to end, so that the short
//! states a new cluster passes through are not each written (see [`details_hold`]).

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use pgkube_crds::{
    ClusterPhase, InstanceRole, InstanceStatus, PostgreSQLBackup, PostgreSQLClusterStatus,
    PostgreSQLRestore, PrimaryChange,
};

use super::backups::summarize;
use super::build::VERSION_ANNOTATION;
use super::failover::PRIMARY_AVAILABLE;
use super::instances::{InstanceReport, Lsn, ObservedInstance, ReportedRole};
use super::restores::{Bootstrap, restoring_condition};
use super::roles::pod_name;

/// Condition types this controller owns.
pub const READY: &str = "Ready";
pub const PROGRESSING: &str = "Progressing";
pub const REPLICAS_STREAMING: &str = "ReplicasStreaming";

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
    /// Name of the StatefulSet, whose pods are `<name>-<ordinal>`.
    pub statefulset_name: &'a str,
    /// Pod name of the designated primary.
    pub primary: &'a str,
    /// The pods and what their instance managers reported.
    pub instances: &'a [ObservedInstance],
    /// The cluster's PostgreSQLBackups, as the watch cache has them.
    pub backups: &'a [&'a PostgreSQLBackup],
    /// The cluster's PostgreSQLRestores, as the watch cache has them.
    pub restores: &'a [&'a PostgreSQLRestore],
    /// Where its bootstrap from a backup stands, if it has one.
    pub bootstrap: Option<&'a Bootstrap>,
    /// Why the cluster does not fail over although its primary is unavailable.
    pub failover_waiting: Option<&'a str>,
    /// Why the rollout of a new pod template replaces no pod now, if it does not.
    pub rollout_waiting: Option<&'a str>,
    /// The root of the WAL archive the cluster archives to, if it does.
    pub archive_root: Option<&'a str>,
    /// The in-place recovery under way, if any.
    pub in_place: Option<&'a pgkube_crds::InPlaceRecovery>,
}

/// The status this controller owns (other controllers' fields are left out), with condition
/// transition times carried over from `previous` when a condition did not change.
pub fn compute(observation: Observation<'_>, now: Timestamp) -> PostgreSQLClusterStatus {
    let rollout = observation.statefulset.map(Rollout::of);
    let ready_replicas = rollout.as_ref().map_or(0, |r| r.ready);
    let previous_phase = observation.previous.and_then(|s| s.phase);
    let primary_problem = primary_problem(observation);
    let phase = bootstrap_phase(
        phase(
            observation,
            rollout.as_ref(),
            previous_phase,
            primary_problem.is_none(),
        ),
        observation.bootstrap,
    );
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
    let replicas = Replicas {
        ready: ready_replicas,
        desired: observation.desired_replicas,
        primary_problem: primary_problem.as_deref(),
    };
    let backups = summarize(observation.backups, Time(now));
    let (wal_archiving, archiving_conditions) = archiving::archiving(observation);
    let conditions = [
        Some(ready_condition(observation, &replicas, phase)),
        Some(progressing_condition(observation, &replicas, phase)),
        Some(streaming_condition(observation)),
        Some(primary_available_condition(
            observation,
            primary_problem.as_deref(),
        )),
        backups.condition,
        restoring_condition(observation.restores),
        observation.bootstrap.map(Bootstrap::condition),
    ]
    .into_iter()
    .flatten()
    .chain(archiving_conditions)
    .map(|condition| keep_transition_time(condition, observation.previous, now))
    .collect();
    let (target_primary, primary_change) = primary_move(observation, now);
    PostgreSQLClusterStatus {
        phase: Some(phase),
        ready_replicas,
        current_version,
        current_primary: current_primary(observation),
        target_primary,
        primary_change,
        instances: instance_statuses(observation),
        system_identifier: super::identity::recorded_system_identifier(
            observation.previous,
            observation.instances,
            observation.primary,
        ),
        observed_generation: observation.generation,
        conditions,
        last_successful_backup: backups.last_successful,
        recoverability: recoverability::recoverability(
            observation.archive_root,
            observation.backups,
            wal_archiving.as_ref(),
        ),
        wal_archiving,
        in_place_recovery: observation.in_place.cloned().or_else(|| {
            observation
                .previous
                .and_then(|p| p.in_place_recovery.clone())
        }),
        ..PostgreSQLClusterStatus::default()
    }
}

/// The designated primary once it reported itself as one; until then, the previous value.
fn current_primary(observation: Observation<'_>) -> Option<String> {
    let reports_primary = find(observation.instances, observation.primary)
        .and_then(ObservedInstance::reported)
        .is_some_and(|report| report.role == ReportedRole::Primary);
    if reports_primary {
        Some(observation.primary.to_owned())
    } else {
        observation.previous.and_then(|s| s.current_primary.clone())
    }
}

/// The switchover or failover under way and the last one: the target stays until it reports
/// itself primary, and the change is then marked completed.
fn primary_move(
    observation: Observation<'_>,
    now: Timestamp,
) -> (Option<String>, Option<PrimaryChange>) {
    let previous = observation.previous;
    let target = previous.and_then(|s| s.target_primary.clone());
    let mut change = previous.and_then(|s| s.primary_change.clone());
    let Some(target) = target else {
        return (None, change);
    };
    let took_over = find(observation.instances, &target)
        .and_then(ObservedInstance::reported)
        .is_some_and(|report| report.role == ReportedRole::Primary);
    if !took_over {
        return (Some(target), change);
    }
    if let Some(change) = change.as_mut().filter(|c| c.to == target) {
        change.completed_at.get_or_insert(Time(now));
    }
    (None, change)
}

/// `PrimaryAvailable`: whether the designated primary serves; when not, since when (the
/// transition time, which the failover delay counts from) and why no failover happens yet.
fn primary_available_condition(observation: Observation<'_>, problem: Option<&str>) -> Condition {
    let Some(problem) = problem else {
        return condition(
            PRIMARY_AVAILABLE,
            "True",
            "PrimaryReady",
            format!("{} is a ready primary", observation.primary),
            observation.generation,
        );
    };
    let mut message = format!("the primary {}: {problem}", observation.primary);
    if let Some(waiting) = observation.failover_waiting {
        message.push_str(&format!("; no failover: {waiting}"));
    }
    condition(
        PRIMARY_AVAILABLE,
        "False",
        "PrimaryUnavailable",
        message,
        observation.generation,
    )
}

fn find<'a>(instances: &'a [ObservedInstance], pod: &str) -> Option<&'a ObservedInstance> {
    instances.iter().find(|instance| instance.pod == pod)
}

/// Why the designated primary does not serve as a ready primary, or `None` when it does.
fn primary_problem(observation: Observation<'_>) -> Option<String> {
    let Some(instance) = find(observation.instances, observation.primary) else {
        return Some("no pod yet".to_owned());
    };
    match &instance.report {
        Err(unavailable) => Some(unavailable.to_string()),
        Ok(report) => match report.role {
            ReportedRole::Primary if report.ready => None,
            ReportedRole::Primary => Some("not ready".to_owned()),
            ReportedRole::Replica => Some("reports a replica".to_owned()),
            ReportedRole::Starting => Some(starting(report)),
        },
    }
}

/// Why replica `pod` does not stream from the primary, or `None` when it does.
fn replica_problem(instances: &[ObservedInstance], pod: &str) -> Option<String> {
    let Some(instance) = find(instances, pod) else {
        return Some("no pod yet".to_owned());
    };
    match &instance.report {
        Err(unavailable) => Some(unavailable.to_string()),
        Ok(report) => match report.role {
            ReportedRole::Replica if report.streaming => None,
            ReportedRole::Replica => Some("not streaming".to_owned()),
            ReportedRole::Primary => Some("reports a primary".to_owned()),
            ReportedRole::Starting => Some(starting(report)),
        },
    }
}

/// Each pod's instance as reported; replicas' lag is measured against the designated
/// primary's current WAL position.
fn instance_statuses(observation: Observation<'_>) -> Vec<InstanceStatus> {
    let primary_lsn = find(observation.instances, observation.primary)
        .and_then(ObservedInstance::reported)
        .filter(|report| report.role == ReportedRole::Primary)
        .and_then(|report| report.current_lsn);
    observation
        .instances
        .iter()
        .map(|instance| instance_status(instance, primary_lsn))
        .collect()
}

fn instance_status(instance: &ObservedInstance, primary_lsn: Option<Lsn>) -> InstanceStatus {
    let report = instance.reported();
    let role = match report.map(|r| r.role) {
        Some(ReportedRole::Primary) => InstanceRole::Primary,
        Some(ReportedRole::Replica) => InstanceRole::Replica,
        _ => InstanceRole::Unknown,
    };
    let replica = report.filter(|r| r.role == ReportedRole::Replica);
    let lag = replica.and_then(|r| Some(primary_lsn?.bytes_after(r.replayed_lsn?)));
    InstanceStatus {
        name: instance.pod.clone(),
        role,
        ready: report.is_some_and(|r| r.ready),
        timeline: report.and_then(|r| r.timeline),
        lag_bytes: lag.map(|bytes| i64::try_from(bytes).unwrap_or(i64::MAX)),
        streaming: replica.map(|r| r.streaming),
        message: report.and_then(|r| r.message.clone()),
    }
}

/// What an instance whose server does not run is doing: starting, or waiting and why.
fn starting(report: &InstanceReport) -> String {
    match &report.message {
        Some(why) => format!("waiting: {why}"),
        None => "starting".to_owned(),
    }
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
        // Pods are replaced by the operator (`OnDelete`), and then the StatefulSet controller
        // never moves `currentRevision`: the pods at `updateRevision` are counted instead.
        let updated_pods = status.updated_replicas.unwrap_or(0);
        let updating = status.update_revision.is_some() && updated_pods < status.replicas;
        let updated = updated_pods >= spec_replicas;
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
    primary_ready: bool,
) -> ClusterPhase {
    if observation.issue.is_some_and(|i| i.invalid_spec) {
        return ClusterPhase::Failed;
    }
    let Some(rollout) = rollout else {
        return ClusterPhase::Pending;
    };
    let desired = observation.desired_replicas;
    if rollout.settled && rollout.ready == desired && rollout.current == desired && primary_ready {
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
        // A roll ends when its last replaced pod is ready, not when that pod is created.
        Some(ClusterPhase::Upgrading) if !rollout.settled || rollout.ready < desired => {
            ClusterPhase::Upgrading
        }
        _ => ClusterPhase::Degraded,
    }
}

/// A cluster that bootstraps from a backup runs only once the backup is in, and fails with
/// its restore.
fn bootstrap_phase(phase: ClusterPhase, bootstrap: Option<&Bootstrap>) -> ClusterPhase {
    match (bootstrap, phase) {
        (Some(Bootstrap::Failed(_)), _) => ClusterPhase::Failed,
        (Some(Bootstrap::InProgress(_)), ClusterPhase::Running) => ClusterPhase::Creating,
        _ => phase,
    }
}

/// Readiness figures the conditions describe.
struct Replicas<'a> {
    ready: i32,
    desired: i32,
    /// Why the designated primary does not serve, if it does not.
    primary_problem: Option<&'a str>,
}

impl Replicas<'_> {
    fn all_ready(&self) -> bool {
        self.ready >= self.desired && self.desired > 0
    }

    fn count(&self) -> String {
        format!("{} of {} replicas are ready", self.ready, self.desired)
    }

    /// `the primary <pod>: <why>`, when the primary is what is missing.
    fn primary_note(&self, primary: &str) -> Option<String> {
        self.primary_problem
            .map(|why| format!("the primary {primary}: {why}"))
    }
}

fn ready_condition(
    observation: Observation<'_>,
    replicas: &Replicas<'_>,
    phase: ClusterPhase,
) -> Condition {
    let desired = replicas.desired;
    let (status, reason, message) = if let Some(Bootstrap::Failed(why)) = observation.bootstrap {
        ("False", "BootstrapFailed", why.clone())
    } else if phase == ClusterPhase::Failed {
        let issue = observation
            .issue
            .map(|i| i.message.clone())
            .unwrap_or_default();
        ("False", "InvalidSpec", issue)
    } else if !replicas.all_ready() {
        ("False", "ReplicasNotReady", replicas.count())
    } else if let Some(note) = replicas.primary_note(observation.primary) {
        (
            "False",
            "PrimaryNotReady",
            format!("{}; {note}", replicas.count()),
        )
    } else if let Some(Bootstrap::InProgress(progress)) = observation.bootstrap {
        ("False", "Bootstrapping", progress.clone())
    } else {
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
    };
    condition(READY, status, reason, message, observation.generation)
}

fn progressing_condition(
    observation: Observation<'_>,
    replicas: &Replicas<'_>,
    phase: ClusterPhase,
) -> Condition {
    let (desired, ready) = (replicas.desired, replicas.ready);
    // Once the pods are ready, what is left to wait for is the primary.
    let waiting_for_primary = replicas
        .all_ready()
        .then(|| replicas.primary_note(observation.primary))
        .flatten();
    let (status, reason, message) = match (observation.issue, phase) {
        (Some(issue), _) => ("False", issue.reason.clone(), issue.message.clone()),
        (None, _) if matches!(observation.bootstrap, Some(Bootstrap::Failed(_))) => {
            let why = match observation.bootstrap {
                Some(Bootstrap::Failed(why)) => why.clone(),
                _ => String::new(),
            };
            ("False", "BootstrapFailed".to_owned(), why)
        }
        (None, ClusterPhase::Creating) if waiting_for_primary.is_none() && replicas.all_ready() => {
            match observation.bootstrap {
                Some(Bootstrap::InProgress(progress)) => {
                    ("True", "Bootstrapping".to_owned(), progress.clone())
                }
                _ => (
                    "True",
                    "Creating".to_owned(),
                    format!("Creating {desired} replicas: {ready} ready"),
                ),
            }
        }
        (None, ClusterPhase::Running) => (
            "False",
            "Complete".to_owned(),
            "The cluster matches its spec".to_owned(),
        ),
        (None, ClusterPhase::Degraded) => match waiting_for_primary {
            Some(note) => ("False", "PrimaryUnavailable".to_owned(), note),
            None => ("False", "ReplicasUnavailable".to_owned(), replicas.count()),
        },
        (None, ClusterPhase::Pending | ClusterPhase::Creating) => (
            "True",
            "Creating".to_owned(),
            match waiting_for_primary {
                Some(note) => format!("Creating {desired} replicas: {ready} ready; {note}"),
                None => format!("Creating {desired} replicas: {ready} ready"),
            },
        ),
        (None, ClusterPhase::Scaling) => (
            "True",
            "Scaling".to_owned(),
            format!("Scaling to {desired} replicas: {ready} ready"),
        ),
        (None, ClusterPhase::Upgrading | ClusterPhase::Failed) => (
            "True",
            "RollingUpdate".to_owned(),
            match observation.rollout_waiting {
                Some(why) => format!(
                    "Replacing pods with the new revision: {ready} of {desired} ready; {why}"
                ),
                None => format!("Replacing pods with the new revision: {ready} of {desired} ready"),
            },
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

/// True when every instance other than the designated primary streams from it, False naming
/// those that do not and why.
fn streaming_condition(observation: Observation<'_>) -> Condition {
    let replicas: Vec<String> = (0..observation.desired_replicas)
        .map(|ordinal| pod_name(observation.statefulset_name, ordinal))
        .filter(|pod| pod != observation.primary)
        .collect();
    let problems: Vec<String> = replicas
        .iter()
        .filter_map(|pod| {
            let why = replica_problem(observation.instances, pod)?;
            Some(format!("{pod}: {why}"))
        })
        .collect();
    let (status, reason, message) = match (replicas.len(), problems.is_empty()) {
        (0, _) => (
            "True",
            "NoReplicas",
            "The cluster has no replicas".to_owned(),
        ),
        (1, true) => ("True", "Streaming", "The replica is streaming".to_owned()),
        (count, true) => (
            "True",
            "Streaming",
            format!("All {count} replicas are streaming"),
        ),
        (_, false) => ("False", "ReplicasNotStreaming", problems.join("; ")),
    };
    condition(
        REPLICAS_STREAMING,
        status,
        reason,
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

pub mod archiving;
mod changes;
mod recoverability;

pub use changes::{
    DETAILS_HOLD, Difference, EventSpec, completed_change, details_hold, difference, events,
    recovery_progress,
};

#[cfg(test)]
mod tests;
