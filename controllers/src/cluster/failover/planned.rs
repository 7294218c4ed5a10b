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
//!
//! A scale-down that removes the primary's pod (the StatefulSet removes the highest ordinals)
//! moves the primary first, the same way, to the best replica among the instances that stay
//! ([`scale_down`]); the scale-down itself is held back until the primary is one of them. A
//! new pod template moves the primary the same way once every replica runs it
//! ([`rolling_update`]), so that its pod is replaced last, as a replica.

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

/// The switchover a scale-down to `requested_replicas` needs first, `None` when the primary
/// stays, or why it waits.
pub(super) fn scale_down(situation: &Situation<'_>) -> Result<Option<PrimaryChange>, String> {
    let requested = situation.requested_replicas;
    let removed = roles::ordinal(situation.statefulset, situation.primary)
        .is_some_and(|ordinal| ordinal >= requested);
    if !removed {
        return Ok(None);
    }
    let staying = |instance: &&ObservedInstance| {
        roles::ordinal(situation.statefulset, &instance.pod).is_some_and(|o| o < requested)
    };
    if situation.restoring {
        return Err(format!(
            "the scale-down to {requested} waits to move the primary: a restore is running"
        ));
    }
    let candidates: Vec<&ObservedInstance> = situation.instances.iter().filter(staying).collect();
    let target = best(situation, candidates.iter().copied(), |instance| {
        not_streaming(instance, situation.primary).is_none()
    });
    let Some(target) = target else {
        return Err(format!(
            "the scale-down to {requested} waits to move the primary to an instance that stays: {}",
            why_none_streams(situation, candidates.iter().copied())
        ));
    };
    Ok(Some(PrimaryChange {
        kind: PrimaryChangeKind::Switchover,
        from: situation.primary.to_owned(),
        to: target.pod.clone(),
        reason: format!(
            "scale-down to {requested} replicas removes {}, the primary",
            situation.primary
        ),
        started_at: Time(situation.now),
        completed_at: None,
        term: Some(next_term(situation.status)),
    }))
}

/// The switchover that lets an outdated primary be replaced once every other instance runs the
/// new pod template ([`crate::cluster::rollout`]), `None` when there is none to make, or why it
/// waits.
pub(super) fn rolling_update(situation: &Situation<'_>) -> Result<Option<PrimaryChange>, String> {
    let outdated = |pod: &str| situation.outdated.iter().any(|outdated| outdated == pod);
    let others: Vec<&ObservedInstance> = situation
        .instances
        .iter()
        .filter(|instance| instance.pod != situation.primary)
        .collect();
    let replicas_first = others.iter().any(|instance| outdated(&instance.pod));
    if !outdated(situation.primary) || replicas_first || situation.replicas < 2 {
        return Ok(None);
    }
    if situation.supervised_update {
        return Err(format!(
            "the primary {} runs the old pod template and primaryUpdateStrategy is supervised: switch over to an updated replica with the {} annotation",
            situation.primary,
            super::SWITCHOVER_ANNOTATION
        ));
    }
    if situation.restoring {
        return Err("the primary's update waits: a restore is running".to_owned());
    }
    // Every other instance runs the new template and streams again: the order is the
    // replicas first, each back before the next, then the primary.
    let missing = usize::try_from(situation.replicas).unwrap_or(0) > others.len() + 1;
    let lagging = others
        .iter()
        .any(|instance| not_streaming(instance, situation.primary).is_some());
    if lagging {
        return Err(format!(
            "the primary's update waits for every replica to be an updated replica streaming from it: {}",
            why_none_streams(situation, others.iter().copied())
        ));
    }
    if missing {
        return Err("the primary's update waits for every replica's pod to exist again".to_owned());
    }
    // The old primary rejoins as the target's standby: it must verify the target's server
    // certificate, whose CA may be new (a certificate of one's own was added), until the
    // kubelet refreshes the primary's mounted CAs.
    let primary = find(situation.instances, situation.primary).and_then(ObservedInstance::reported);
    let trusted = |instance: &ObservedInstance| {
        let target = instance.reported();
        primary
            .zip(target)
            .is_none_or(|(primary, target)| primary.trusts_server_of(target))
    };
    let Some(target) = best(situation, others.iter().copied(), trusted) else {
        return Err(if others.is_empty() {
            "the primary's update waits for a replica".to_owned()
        } else {
            format!(
                "the primary's update waits for the primary {} to trust the CA of the updated replicas' server certificates (the kubelet refreshes its mounted Secrets)",
                situation.primary
            )
        });
    };
    Ok(Some(PrimaryChange {
        kind: PrimaryChangeKind::Switchover,
        from: situation.primary.to_owned(),
        to: target.pod.clone(),
        reason: format!(
            "rolling update: {} runs the new pod template, the primary last",
            target.pod
        ),
        started_at: Time(situation.now),
        completed_at: None,
        term: Some(next_term(situation.status)),
    }))
}

/// Each of `instances` other than the primary that does not stream from it, and why.
fn why_none_streams<'a>(
    situation: &Situation<'_>,
    instances: impl Iterator<Item = &'a ObservedInstance>,
) -> String {
    let reasons: Vec<String> = instances
        .filter(|instance| instance.pod != situation.primary)
        .filter_map(|instance| {
            let why = not_streaming(instance, situation.primary)?;
            Some(format!("{} {why}", instance.pod))
        })
        .collect();
    if reasons.is_empty() {
        "none runs yet".to_owned()
    } else {
        reasons.join("; ")
    }
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
    if let Some(why) = not_streaming(instance, primary_pod) {
        return Some(why);
    }
    let report = instance.reported()?;
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

/// Why `instance` is not a ready replica streaming from `primary_pod`, `None` when it is.
fn not_streaming(instance: &ObservedInstance, primary_pod: &str) -> Option<String> {
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
    None
}

/// The replica that fits the planned restart.
fn best_fit<'a>(
    situation: &'a Situation<'a>,
    primary: &InstanceReport,
) -> Option<&'a ObservedInstance> {
    best(situation, situation.instances.iter(), |instance| {
        unfit(instance, situation.primary, primary).is_none()
    })
}

/// Among `instances` other than the primary that `fits`, the one on the latest timeline with
/// the most WAL; the lowest ordinal among equals (as a failover ranks them).
fn best<'a>(
    situation: &Situation<'_>,
    instances: impl Iterator<Item = &'a ObservedInstance>,
    fits: impl Fn(&ObservedInstance) -> bool,
) -> Option<&'a ObservedInstance> {
    let ordinal = |instance: &ObservedInstance| {
        roles::ordinal(situation.statefulset, &instance.pod).unwrap_or(i32::MAX)
    };
    let position = |instance: &ObservedInstance| {
        let timeline = instance.reported().and_then(|report| report.timeline);
        (timeline, wal_position(instance))
    };
    instances
        .filter(|instance| instance.pod != situation.primary)
        .filter(|instance| fits(instance))
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
