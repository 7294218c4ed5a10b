//! What changed between the status a reconcile computed and the cluster's (pure): whether to
//! write it now, later (details alone wait for [`DETAILS_HOLD`]) or not at all, which switchover
//! or failover completed, and the Events that the change deserves.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use pgkube_crds::{
    CONTINUOUS_ARCHIVING, ClusterPhase, PostgreSQLClusterStatus, PrimaryChangeKind,
    WAL_DISK_PRESSURE,
};

use super::{PROGRESSING, READY, REPLICAS_STREAMING};
use crate::storage::recovery::REPLAY_PROGRESS_PREFIX;

/// An Event to publish about the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    pub warning: bool,
    pub reason: String,
    pub note: String,
}

/// How long after a condition's last transition a change of details alone waits before it is
/// written (see [`details_hold`]).
pub const DETAILS_HOLD: std::time::Duration = std::time::Duration::from_secs(5);

/// How a computed status differs from the cluster's (transition times aside).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Difference {
    /// Nothing this controller owns differs: no write.
    None,
    /// Only details: a condition's message, or what the instances report.
    Details,
    /// The phase, the ready replicas, the version, the primary or a primary change, the
    /// observed generation, the last successful backup, or a condition's status, reason or
    /// observed generation (or a condition that was not there).
    Summary,
}

/// How `new` differs from `previous` in the fields this controller owns.
pub fn difference(
    new: &PostgreSQLClusterStatus,
    previous: Option<&PostgreSQLClusterStatus>,
) -> Difference {
    let Some(previous) = previous else {
        return Difference::Summary;
    };
    let before = |condition: &Condition| {
        previous
            .conditions
            .iter()
            .find(|c| c.type_ == condition.type_)
    };
    let same_summary = |condition: &Condition| {
        before(condition).is_some_and(|c| {
            c.status == condition.status
                && c.reason == condition.reason
                && c.observed_generation == condition.observed_generation
        })
    };
    let summary_changed = new.phase != previous.phase
        || new.ready_replicas != previous.ready_replicas
        || new.current_version != previous.current_version
        || new.current_primary != previous.current_primary
        || new.target_primary != previous.target_primary
        || new.primary_change != previous.primary_change
        || new.observed_generation != previous.observed_generation
        || new.last_successful_backup != previous.last_successful_backup
        || !new.conditions.iter().all(same_summary);
    let same_message =
        |condition: &Condition| before(condition).is_some_and(|c| c.message == condition.message);
    if summary_changed {
        Difference::Summary
    } else if new.instances != previous.instances
        || !new.conditions.iter().all(same_message)
        || archived_changed(new, previous)
    {
        Difference::Details
    } else {
        Difference::None
    }
}

/// Whether archiving moved on: another file archived or failed. The waiting count and the
/// size of `pg_wal` alone change too often to be worth a write; they go with the next one.
fn archived_changed(new: &PostgreSQLClusterStatus, previous: &PostgreSQLClusterStatus) -> bool {
    let moved = |status: &PostgreSQLClusterStatus| {
        status.wal_archiving.as_ref().map(|archiving| {
            (
                archiving.instance.clone(),
                archiving.last_archived_time.clone(),
                archiving.last_failed_time.clone(),
            )
        })
    };
    moved(new) != moved(previous)
}

/// How much longer a change of details alone waits, if it waits: until [`DETAILS_HOLD`] after
/// the latest transition of a condition in `previous`.
///
/// Why: a cluster passes through short-lived states that differ in details only, such as a new
/// instance's pod that exists but has no address yet, a second or two before it runs. Writing
/// each would cost a request (and a reconcile, when the write comes back through the watch)
/// for a state nobody reads. Held for a few seconds, such a change is written with the next
/// change of the summary if one comes (the Running phase, usually), else when the hold ends;
/// the reconcile looks again then (see `reconcile_cluster`), so nothing is lost. Details of a
/// cluster whose conditions have not moved for a while are written at once.
pub fn details_hold(
    previous: &PostgreSQLClusterStatus,
    now: Timestamp,
) -> Option<std::time::Duration> {
    let latest = previous
        .conditions
        .iter()
        .map(|c| c.last_transition_time.0)
        .max()?;
    let elapsed = now.duration_since(latest);
    // A transition time ahead of this clock holds for the whole hold, not longer.
    let elapsed = std::time::Duration::try_from(elapsed).unwrap_or_default();
    DETAILS_HOLD
        .checked_sub(elapsed)
        .filter(|left| !left.is_zero())
}

/// The switchover or failover that `new` completes, and how long it took from its decision.
pub fn completed_change(
    new: &PostgreSQLClusterStatus,
    previous: Option<&PostgreSQLClusterStatus>,
) -> Option<(PrimaryChangeKind, std::time::Duration)> {
    let change = new.primary_change.as_ref()?;
    let completed = change.completed_at.as_ref()?;
    let before = previous.and_then(|p| p.primary_change.as_ref());
    if before.is_some_and(|before| {
        before.completed_at.is_some()
            && before.to == change.to
            && before.started_at == change.started_at
    }) {
        return None;
    }
    let took = completed.0.duration_since(change.started_at.0);
    Some((change.kind, took.unsigned_abs()))
}

/// Events for what changed between `previous` and `new`: a new phase, a new reason why the
/// cluster does not progress, replicas that stopped streaming or streaming again.
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
    if let Some((kind, took)) = completed_change(new, previous)
        && let Some(change) = &new.primary_change
    {
        events.push(EventSpec {
            warning: false,
            reason: "PrimaryChanged".to_owned(),
            note: format!(
                "{}: {} is the primary (was {}), {:.1} s after the decision",
                kind.as_str(),
                change.to,
                change.from,
                took.as_secs_f64()
            ),
        });
    }
    events.extend(archiving_events(new, previous));
    let streaming = |status| find(status, REPLICAS_STREAMING).map(|c| c.status);
    if let Some(now) = find(Some(new), REPLICAS_STREAMING) {
        match (streaming(previous).as_deref(), now.status.as_str()) {
            (Some("True"), "False") => events.push(EventSpec {
                warning: true,
                reason: "ReplicaNotStreaming".to_owned(),
                note: now.message,
            }),
            (Some("False"), "True") => events.push(EventSpec {
                warning: false,
                reason: "ReplicasStreaming".to_owned(),
                note: now.message,
            }),
            _ => {}
        }
    }
    events
}

/// What an instance replaying WAL to a recovery target reports, for a RecoveryProgress Event:
/// its name and message (replayed location and time).
pub fn recovery_progress(new: &PostgreSQLClusterStatus) -> Option<String> {
    new.instances.iter().find_map(|instance| {
        let message = instance.message.as_deref()?;
        message
            .starts_with(REPLAY_PROGRESS_PREFIX)
            .then(|| format!("{}: {message}", instance.name))
    })
}

/// Archiving that starts failing (or is refused), that recovers, and `pg_wal` filling the
/// volume meanwhile.
fn archiving_events(
    new: &PostgreSQLClusterStatus,
    previous: Option<&PostgreSQLClusterStatus>,
) -> Vec<EventSpec> {
    let find = |status: Option<&PostgreSQLClusterStatus>, type_: &str| {
        status.and_then(|s| s.conditions.iter().find(|c| c.type_ == type_).cloned())
    };
    let mut events = Vec::new();
    if let Some(now) = find(Some(new), CONTINUOUS_ARCHIVING) {
        let before = find(previous, CONTINUOUS_ARCHIVING);
        match (
            before.as_ref().map(|c| c.status.as_str()),
            now.status.as_str(),
        ) {
            (before, "False") if before != Some("False") => events.push(EventSpec {
                warning: true,
                reason: now.reason.clone(),
                note: now.message.clone(),
            }),
            (Some("False"), "True") => events.push(EventSpec {
                warning: false,
                reason: "ArchivingRecovered".to_owned(),
                note: now.message.clone(),
            }),
            _ => {}
        }
    }
    if let Some(now) = find(Some(new), WAL_DISK_PRESSURE)
        && now.status == "True"
        && find(previous, WAL_DISK_PRESSURE).map(|c| c.status) != Some("True".to_owned())
    {
        events.push(EventSpec {
            warning: true,
            reason: WAL_DISK_PRESSURE.to_owned(),
            note: now.message,
        });
    }
    events
}
