//! A planned restart of the primary (pure; pgkube issue 41). When settings the user changed
//! need a restart and the cluster has replicas, the primary's instance manager does not restart
//! its server (`instance.json` says `restartBySwitchover`): it reports `restartBySwitchover`
//! with its `pendingRestart`, and keeps serving with the old settings. The primary then moves
//! by a switchover to a replica that already runs the new settings: a ready replica streaming
//! from it, with nothing pending and the same `settingsDigest` as the primary (it read the
//! same ConfigMap, and restarted for it). The switchover is carried through as any other
//! ([`super::commands`]): the old primary shuts down cleanly, the target is promoted once it
//! has all the WAL, and the old primary starts again as a replica, with the new settings.
//!
//! While no replica qualifies (they restart, their mounted ConfigMap is not refreshed yet, none
//! streams) or a restore runs, the primary waits with the old settings and the plan says why
//! ([`Plan::waiting`](super::Plan)). A primary that restarts in place (one instance, a lowered
//! `max_connections`, an older instance manager) does not report `restartBySwitchover`, and no
//! switchover is made for it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use pgkube_crds::{PrimaryChange, PrimaryChangeKind};

use super::{Situation, find, next_term, roles, wal_position};
use crate::cluster::instances::{InstanceReport, ObservedInstance, ReportedRole};

/// The switchover for the designated primary's planned restart, `None` when it waits for none,
/// or why it waits.
pub(super) fn planned_restart(situation: &Situation<'_>) -> Result<Option<PrimaryChange>, String> {
    let Some(primary) = find(situation.instances, situation.primary)
        .and_then(ObservedInstance::reported)
        .filter(|report| awaits_switchover(report))
    else {
        return Ok(None);
    };
    let settings = primary.pending_restart.join(", ");
    if situation.restoring {
        return Err(format!(
            "the primary's restart for {settings} waits: a restore is running"
        ));
    }
    let Some(target) = best_fit(situation, primary) else {
        return Err(format!(
            "the primary's restart for {settings} waits for a replica that runs the new settings: {}",
            why_none_fits(situation, primary)
        ));
    };
    Ok(Some(PrimaryChange {
        kind: PrimaryChangeKind::Switchover,
        from: situation.primary.to_owned(),
        to: target.pod.clone(),
        reason: format!(
            "planned restart: the settings {settings} need a restart; {} runs them already",
            target.pod
        ),
        started_at: Time(situation.now),
        completed_at: None,
        term: Some(next_term(situation.status)),
    }))
}

/// A ready primary that leaves the restart its settings need to a switchover.
fn awaits_switchover(report: &InstanceReport) -> bool {
    report.role == ReportedRole::Primary
        && report.ready
        && report.restart_by_switchover
        && !report.pending_restart.is_empty()
}

/// Why `instance` cannot take over from `primary` now, `None` when it can: it must be a ready
/// replica streaming from the primary, with nothing pending and the primary's settings.
fn unfit(
    instance: &ObservedInstance,
    primary_pod: &str,
    primary: &InstanceReport,
) -> Option<String> {
    let report = match &instance.report {
        Err(unavailable) => return Some(unavailable.to_string()),
        Ok(report) => report,
    };
    if report.role != ReportedRole::Replica || !report.ready {
        return Some("not a ready replica".to_owned());
    }
    if !report.streaming || report.following.as_deref() != Some(primary_pod) {
        return Some("does not stream from the primary".to_owned());
    }
    if !report.pending_restart.is_empty() {
        return Some(format!(
            "restarts for {}",
            report.pending_restart.join(", ")
        ));
    }
    let same =
        primary.settings_digest.is_some() && report.settings_digest == primary.settings_digest;
    (!same).then(|| "does not run the primary's settings yet".to_owned())
}

/// The replica that fits on the latest timeline with the most WAL; the lowest ordinal among
/// equals (as a failover ranks them).
fn best_fit<'a>(
    situation: &'a Situation<'a>,
    primary: &InstanceReport,
) -> Option<&'a ObservedInstance> {
    let ordinal = |instance: &ObservedInstance| {
        roles::ordinal(situation.statefulset, &instance.pod).unwrap_or(i32::MAX)
    };
    let position = |instance: &ObservedInstance| {
        let timeline = instance.reported().and_then(|report| report.timeline);
        (timeline, wal_position(instance))
    };
    situation
        .instances
        .iter()
        .filter(|instance| instance.pod != situation.primary)
        .filter(|instance| unfit(instance, situation.primary, primary).is_none())
        .max_by(|a, b| {
            position(a)
                .cmp(&position(b))
                .then_with(|| ordinal(b).cmp(&ordinal(a)))
        })
}

/// Each other instance and why it does not fit.
fn why_none_fits(situation: &Situation<'_>, primary: &InstanceReport) -> String {
    let reasons: Vec<String> = situation
        .instances
        .iter()
        .filter(|instance| instance.pod != situation.primary)
        .filter_map(|instance| {
            let why = unfit(instance, situation.primary, primary)?;
            Some(format!("{} {why}", instance.pod))
        })
        .collect();
    if reasons.is_empty() {
        "the cluster has no replica".to_owned()
    } else {
        reasons.join("; ")
    }
}

#[cfg(test)]
mod tests;
