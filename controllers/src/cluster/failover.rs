//! Moving the primary (pure): a switchover when a user asks for one, a failover when the
//! primary is lost, and the commands to the instance managers that carry a change through.
//!
//! The designated primary is `status.targetPrimary` while a change is under way, else
//! `status.currentPrimary` (see [`roles::designated_primary`](super::roles::designated_primary)).
//! A change is decided here and *recorded in the status before anything is done*: a new leader
//! of the manager, or the next reconcile, carries it through from the status alone. Carrying
//! it through is the same rule every reconcile, change or not ([`commands`]):
//!
//! - an instance that reports itself primary but is not the designated one is told to follow
//!   the designated one (it shuts down cleanly, is rewound if it diverged, and streams). Its
//!   `db.example.com/role=primary` label, what the `-rw` Service selects, is removed in the same
//!   reconcile before any other pod gets it, so rw never routes to it again: it is fenced;
//! - the designated primary, while it reports a replica, is promoted once no other instance
//!   reports a primary; for a switchover, once it has received at least as much WAL as every
//!   instance that answers (a failover chose the replica with the most WAL when it was
//!   decided);
//!   for a switchover, once the old primary reports that it follows (it shut down cleanly
//!   first, so the target has everything it committed);
//! - a replica that follows another instance than the designated primary is told to follow it.
//!
//! A failover is decided when the designated primary has not reported a ready primary for the
//! failover delay (the `PrimaryAvailable` condition's last transition tells since when): it
//! cannot be asked, its report is stale (its instance manager hangs), or it reports a server
//! that is not ready (one whose postmaster accepts no new connection included: that primary is
//! told to follow and stops before the new one is promoted, as it still reports a primary). A
//! primary whose instance manager does not answer (or whose pod is gone) may still run behind a
//! partition: the failover then also waits until it has had the time to fence itself
//! (`fence_wait`, its isolation timeout plus 2 s). It promotes the ready replica that received
//! the most WAL. It waits, saying why, while a restore
//! runs, when no replica is ready, and, with synchronous replication, while too few replicas
//! answer to be sure that one of them has every acknowledged commit.
//!
//! A primary whose changed settings need a restart moves by a switchover too ([`planned`]).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use pgkube_crds::{PostgreSQLClusterStatus, PrimaryChange, PrimaryChangeKind};

use super::instances::{Lsn, ObservedInstance, ReportedRole, Unavailable};
use super::roles;

/// The annotation a user sets to ask for a switchover:
/// `kubectl annotate pgcluster <cluster> db.example.com/switchover-to=<pod>`. The operator
/// removes it once it has recorded the switchover, or refused it (with a Warning Event).
pub const SWITCHOVER_ANNOTATION: &str = "db.example.com/switchover-to";
/// Condition type: the designated primary reports a ready primary.
pub const PRIMARY_AVAILABLE: &str = "PrimaryAvailable";

/// What the decision is made from.
#[derive(Clone, Copy, Debug)]
pub struct Situation<'a> {
    /// Name of the StatefulSet, whose pods are `<statefulset>-<ordinal>`.
    pub statefulset: &'a str,
    /// Instances the cluster has now.
    pub replicas: i32,
    /// Instances the spec asks for: fewer than `replicas` while a scale-down that removes the
    /// primary is held back.
    pub requested_replicas: i32,
    /// Pods made from an older pod template than the StatefulSet's ([`super::rollout`]).
    pub outdated: &'a [String],
    /// `primaryUpdateStrategy: supervised`: the user moves an outdated primary.
    pub supervised_update: bool,
    pub failover_delay: Duration,
    /// How long a primary that may still run, unseen, takes at most to fence itself once cut
    /// off: its isolation timeout plus [`pgkube_crds::FENCE_MARGIN_SECONDS`].
    pub fence_wait: Duration,
    /// `minStandbys` of synchronous replication; 0 when replication is asynchronous.
    pub synchronous_min: u32,
    pub status: Option<&'a PostgreSQLClusterStatus>,
    /// The designated primary.
    pub primary: &'a str,
    /// The value of [`SWITCHOVER_ANNOTATION`], if set.
    pub switchover_request: Option<&'a str>,
    pub instances: &'a [ObservedInstance],
    /// A restore into the cluster is running.
    pub restoring: bool,
    pub now: Timestamp,
}

/// A command to one instance manager.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `POST /control/promote`.
    Promote { pod: String },
    /// `POST /control/follow`: become a standby of `primary`.
    Follow { pod: String, primary: String },
}

impl Command {
    pub fn pod(&self) -> &str {
        match self {
            Self::Promote { pod } | Self::Follow { pod, .. } => pod,
        }
    }
}

/// What to do about the primary in this reconcile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// A new primary to record in the status, before anything else is done.
    pub designate: Option<PrimaryChange>,
    /// The switchover annotation is to be removed: recorded, refused or already true.
    pub clear_request: bool,
    /// Why the switchover request was refused.
    pub refusal: Option<String>,
    /// Why the cluster does not fail over although its primary is unavailable, or why a
    /// primary that waits for a planned restart does not move yet ([`planned`]).
    pub waiting: Option<String>,
    /// Look again within a second: the primary is unavailable or a change is under way.
    pub urgent: bool,
    /// A change is under way: each of its steps waits for the instances' reports, so they are
    /// looked at every [`CHANGE_PERIOD`].
    pub carrying: bool,
}

/// How soon a change under way is looked at again: writes wait for its steps.
pub const CHANGE_PERIOD: Duration = Duration::from_millis(250);

/// Decides whether the primary moves now.
pub fn plan(situation: &Situation<'_>) -> Plan {
    let in_progress = change_in_progress(situation.status);
    let mut plan = Plan {
        urgent: in_progress || !primary_available(situation),
        carrying: in_progress,
        ..Plan::default()
    };
    if in_progress {
        // A change whose target is lost, or never takes over, is decided again.
        if let Some(change) = replan(situation) {
            plan.designate = Some(change);
        }
        return plan;
    }
    if let Some(target) = situation.switchover_request {
        plan.clear_request = true;
        match switchover(situation, target) {
            Ok(change) => plan.designate = change,
            Err(reason) => plan.refusal = Some(reason),
        }
        return plan;
    }
    if primary_available(situation) {
        for planned_move in [planned::scale_down, planned::rolling_update] {
            match planned_move(situation) {
                Ok(None) => {}
                Ok(Some(change)) => {
                    plan.designate = Some(change);
                    return plan;
                }
                Err(waiting) => {
                    plan.waiting = Some(waiting);
                    return plan;
                }
            }
        }
        match planned::planned_restart(situation) {
            Ok(change) => plan.designate = change,
            Err(waiting) => plan.waiting = Some(waiting),
        }
        return plan;
    }
    match failover(situation) {
        Ok(Some(change)) => plan.designate = Some(change),
        Ok(None) => {}
        Err(waiting) => plan.waiting = Some(waiting),
    }
    plan
}

/// Whether a switchover or failover was recorded and its target has not taken over yet.
pub fn change_in_progress(status: Option<&PostgreSQLClusterStatus>) -> bool {
    status.is_some_and(|status| status.target_primary.is_some())
}

/// Whether the designated primary reports a ready primary.
pub fn primary_available(situation: &Situation<'_>) -> bool {
    find(situation.instances, situation.primary).is_some_and(ObservedInstance::is_ready_primary)
}

/// Why the designated primary is not available, for the condition and the failover reason.
pub fn unavailability(instances: &[ObservedInstance], primary: &str) -> String {
    match find(instances, primary) {
        None => "its pod does not exist".to_owned(),
        Some(instance) => match &instance.report {
            Err(unavailable) => unavailable.to_string(),
            Ok(report) => match report.role {
                ReportedRole::Primary if !report.ready => match &report.message {
                    Some(why) => format!("not ready: {why}"),
                    None => "not ready".to_owned(),
                },
                ReportedRole::Primary => "available".to_owned(),
                ReportedRole::Replica => "runs as a replica".to_owned(),
                ReportedRole::Starting => match &report.message {
                    Some(why) => format!("its server is not running: {why}"),
                    None => "its server is not running".to_owned(),
                },
            },
        },
    }
}

/// The switchover to `target`, `None` when it is already the primary, or why not.
fn switchover(situation: &Situation<'_>, target: &str) -> Result<Option<PrimaryChange>, String> {
    let primary = situation.primary;
    let is_instance = roles::ordinal(situation.statefulset, target)
        .is_some_and(|ordinal| ordinal < situation.replicas);
    if !is_instance {
        return Err(format!(
            "{target} is not an instance of this cluster (its instances are {}-0 to {}-{})",
            situation.statefulset,
            situation.statefulset,
            situation.replicas - 1
        ));
    }
    if target == primary {
        return if primary_available(situation) {
            Ok(None)
        } else {
            Err(format!(
                "{target} is the primary already, but not available ({})",
                unavailability(situation.instances, primary)
            ))
        };
    }
    if !primary_available(situation) {
        return Err(format!(
            "the primary {primary} is not available ({}): a switchover needs it to shut down cleanly; a failover takes over after the failover delay",
            unavailability(situation.instances, primary)
        ));
    }
    let streaming = find(situation.instances, target)
        .and_then(ObservedInstance::reported)
        .is_some_and(|report| {
            report.role == ReportedRole::Replica && report.ready && report.streaming
        });
    if !streaming {
        return Err(format!(
            "{target} is not a ready replica streaming from the primary ({})",
            unavailability(situation.instances, target)
        ));
    }
    Ok(Some(PrimaryChange {
        kind: PrimaryChangeKind::Switchover,
        from: primary.to_owned(),
        to: target.to_owned(),
        reason: format!("asked for with the {SWITCHOVER_ANNOTATION} annotation"),
        started_at: Time(situation.now),
        completed_at: None,
        term: Some(next_term(situation.status)),
    }))
}

/// The failover to make now, `None` while the delay runs, or why the cluster waits.
fn failover(situation: &Situation<'_>) -> Result<Option<PrimaryChange>, String> {
    let status = situation.status;
    // A cluster whose primary never came up has nothing to fail over from.
    if status.and_then(|s| s.current_primary.as_ref()).is_none() {
        return Ok(None);
    }
    if situation.restoring {
        return Err("a restore is running; failover decisions wait for it to end".to_owned());
    }
    let since = unavailable_since(status).unwrap_or(situation.now);
    // A condition's time is kept to the second, cut down: the primary may have been lost up
    // to a second after `since`, so the failover may come up to a second before the delay.
    let elapsed = situation.now.duration_since(since).as_secs_f64();
    if elapsed < failover_wait(situation).as_secs_f64() {
        return Ok(None);
    }
    let candidate = best_replica(situation).ok_or_else(|| {
        "no ready replica to promote; the cluster waits for the primary or a replica".to_owned()
    })?;
    check_synchronous_quorum(situation)?;
    let why = unavailability(situation.instances, situation.primary);
    Ok(Some(PrimaryChange {
        kind: PrimaryChangeKind::Failover,
        from: situation.primary.to_owned(),
        to: candidate.pod.clone(),
        reason: format!(
            "the primary {} was unavailable for {elapsed:.0}s or more ({why}); {} is the ready replica with the most WAL",
            situation.primary, candidate.pod
        ),
        started_at: Time(situation.now),
        completed_at: None,
        term: Some(next_term(status)),
    }))
}

/// How long the primary must have been unavailable before a failover: the failover delay, and,
/// unless its instance manager says its server does not run as a primary, long enough for it
/// to have fenced itself if it runs cut off (`fence_wait`).
fn failover_wait(situation: &Situation<'_>) -> Duration {
    let answers = find(situation.instances, situation.primary)
        .is_some_and(|instance| instance.report.is_ok());
    if answers {
        // It answers: if it still runs as a primary it is told to follow before any promotion.
        situation.failover_delay
    } else {
        situation.failover_delay.max(situation.fence_wait)
    }
}

/// How long a switchover's target may take to become the primary before the change is
/// decided again.
pub const SWITCHOVER_TIMEOUT: Duration = Duration::from_secs(60);

/// The term of the next decision: one more than the last recorded one's.
fn next_term(status: Option<&PostgreSQLClusterStatus>) -> i64 {
    current_term(status).saturating_add(1)
}

/// The term of the last recorded switchover or failover: every command carries it, and an
/// instance manager refuses a command of a term older than one it has seen.
pub fn current_term(status: Option<&PostgreSQLClusterStatus>) -> i64 {
    status
        .and_then(|s| s.primary_change.as_ref())
        .and_then(|change| change.term)
        .unwrap_or(0)
}

/// Whether the target of a change is known to be gone: its pod is missing or has no address,
/// or its instance manager says its server does not run. One that merely does not answer is
/// not: it may be alive behind a partition, with a promotion it was sent waiting in its queue.
fn target_lost(instances: &[ObservedInstance], target: &str) -> bool {
    match find(instances, target).map(|instance| &instance.report) {
        None | Some(Err(Unavailable::NoAddress)) => true,
        Some(Err(_)) => false,
        Some(Ok(report)) => report.role == ReportedRole::Starting,
    }
}

/// A new failover when the change under way cannot complete: its target is lost (see
/// [`target_lost`]) for the failover delay since the change began (it died mid-change), or,
/// for a switchover, has not become the primary within [`SWITCHOVER_TIMEOUT`]. The new target
/// is the best ready replica other than the lost one.
fn replan(situation: &Situation<'_>) -> Option<PrimaryChange> {
    let status = situation.status?;
    let change = status.primary_change.as_ref()?;
    let target = situation.primary;
    let since_change = situation
        .now
        .duration_since(change.started_at.0)
        .as_secs_f64();
    let why = if target_lost(situation.instances, target)
        && since_change >= situation.failover_delay.as_secs_f64()
    {
        format!(
            "the target {target} of the {} was unavailable for {since_change:.0}s ({})",
            change.kind.as_str().to_lowercase(),
            unavailability(situation.instances, target)
        )
    } else if change.kind == PrimaryChangeKind::Switchover
        && since_change >= SWITCHOVER_TIMEOUT.as_secs_f64()
    {
        format!(
            "the target {target} of the switchover did not become the primary within {}s",
            SWITCHOVER_TIMEOUT.as_secs()
        )
    } else {
        return None;
    };
    if situation.restoring {
        return None;
    }
    let candidate = best_replica(situation)?;
    check_synchronous_quorum(situation).ok()?;
    Some(PrimaryChange {
        kind: PrimaryChangeKind::Failover,
        from: target.to_owned(),
        to: candidate.pod.clone(),
        reason: format!(
            "{why}; decided again: {} is the ready replica with the most WAL",
            candidate.pod
        ),
        started_at: Time(situation.now),
        completed_at: None,
        term: Some(next_term(Some(status))),
    })
}

/// With `ANY k` synchronous replication among the `m` other instances, a commit was confirmed
/// by at least `minStandbys` of them; any `m - minStandbys + 1` of them include one that has
/// it. Fewer answering replicas could all lack an acknowledged commit.
fn check_synchronous_quorum(situation: &Situation<'_>) -> Result<(), String> {
    if situation.synchronous_min == 0 {
        return Ok(());
    }
    let standbys = u32::try_from(situation.replicas.saturating_sub(1)).unwrap_or(0);
    let needed = standbys.saturating_sub(situation.synchronous_min) + 1;
    let answering = replicas_answering(situation).count();
    if u32::try_from(answering).unwrap_or(u32::MAX) >= needed {
        return Ok(());
    }
    Err(format!(
        "synchronous replication: {answering} of {standbys} replicas answer, {needed} are needed to be sure the new primary has every acknowledged commit"
    ))
}

/// When the `PrimaryAvailable` condition last became False.
fn unavailable_since(status: Option<&PostgreSQLClusterStatus>) -> Option<Timestamp> {
    status?
        .conditions
        .iter()
        .find(|condition| condition.type_ == PRIMARY_AVAILABLE && condition.status == "False")
        .map(|condition| condition.last_transition_time.0)
}

/// Instances other than the designated primary that report a ready replica: one that is not
/// ready (its server does not accept connections) can be neither promoted nor counted on to
/// hold a commit another lacks.
fn replicas_answering<'a>(
    situation: &'a Situation<'a>,
) -> impl Iterator<Item = &'a ObservedInstance> + 'a {
    situation.instances.iter().filter(|instance| {
        instance.pod != situation.primary
            && instance
                .reported()
                .is_some_and(|report| report.role == ReportedRole::Replica && report.ready)
    })
}

/// The ready replica on the latest timeline that received the most WAL; the lowest ordinal
/// among equals. A position on an older timeline may be past the fork of the newer one.
fn best_replica<'a>(situation: &'a Situation<'a>) -> Option<&'a ObservedInstance> {
    replicas_answering(situation).max_by(|a, b| {
        let position = |instance: &ObservedInstance| {
            let timeline = instance.reported().and_then(|report| report.timeline);
            (timeline, wal_position(instance))
        };
        let ordinal = |instance: &ObservedInstance| {
            roles::ordinal(situation.statefulset, &instance.pod).unwrap_or(i32::MAX)
        };
        position(a)
            .cmp(&position(b))
            .then_with(|| ordinal(b).cmp(&ordinal(a)))
    })
}

/// How far an instance's WAL goes: written (primary), else received, else replayed.
fn wal_position(instance: &ObservedInstance) -> Option<Lsn> {
    let report = instance.reported()?;
    report
        .current_lsn
        .max(report.received_lsn)
        .max(report.replayed_lsn)
}

/// The commands that make the instances match the designated primary (see the module doc).
pub fn commands(situation: &Situation<'_>) -> Vec<Command> {
    let primary = situation.primary;
    let mut commands: Vec<Command> = situation
        .instances
        .iter()
        .filter(|instance| instance.pod != primary)
        .filter_map(|instance| {
            let report = instance.reported()?;
            let follows_primary = report.following.as_deref() == Some(primary);
            let stray_primary = report.role == ReportedRole::Primary;
            // A replica that does not say whom it follows (an older instance manager) is left
            // alone rather than told the same thing every reconcile.
            let follows_another = report.role == ReportedRole::Replica
                && report.following.is_some()
                && !follows_primary;
            (stray_primary || follows_another).then(|| Command::Follow {
                pod: instance.pod.clone(),
                primary: primary.to_owned(),
            })
        })
        .collect();
    if let Some(promote) = promotion(situation) {
        commands.push(promote);
    }
    commands
}

/// The promotion of the designated primary, when it reports a replica and may take over.
fn promotion(situation: &Situation<'_>) -> Option<Command> {
    let primary = situation.primary;
    let target = find(situation.instances, primary)?;
    let report = target.reported()?;
    if report.role != ReportedRole::Replica || !report.ready {
        return None;
    }
    let others: Vec<&ObservedInstance> = situation
        .instances
        .iter()
        .filter(|instance| instance.pod != primary)
        .collect();
    if others.iter().any(|instance| {
        instance
            .reported()
            .is_some_and(|r| r.role == ReportedRole::Primary)
    }) {
        // Demoted first: two primaries must never run at once.
        return None;
    }
    if !old_primary_stepped_down(situation) {
        return None;
    }
    // A failover chose its target as the answering replica with the most WAL, which holds
    // every acknowledged commit (see `check_synchronous_quorum`). WAL that an instance shows
    // beyond it now (the old primary back with commits asynchronous replication lost, or its
    // own crash recovery's checkpoint; a replica that did not answer then) is what a rewind
    // discards: it must not hold the promotion back, or the cluster would wait forever.
    if failover_under_way(situation) {
        return Some(Command::Promote {
            pod: primary.to_owned(),
        });
    }
    let has_most_wal = others
        .iter()
        .all(|instance| wal_position(instance) <= wal_position(target));
    has_most_wal.then(|| Command::Promote {
        pod: primary.to_owned(),
    })
}

/// Whether a failover was decided and has not completed.
fn failover_under_way(situation: &Situation<'_>) -> bool {
    situation
        .status
        .and_then(|s| s.primary_change.as_ref())
        .is_some_and(|change| {
            change.kind == PrimaryChangeKind::Failover && change.completed_at.is_none()
        })
}

/// For a switchover: the old primary reports a replica (it shut down cleanly and follows), or
/// it has not answered for the failover delay since the switchover began (then it is lost and
/// this is a failover in effect). Always true for a failover.
fn old_primary_stepped_down(situation: &Situation<'_>) -> bool {
    let Some(change) = situation.status.and_then(|s| s.primary_change.as_ref()) else {
        return true;
    };
    if change.kind != PrimaryChangeKind::Switchover || change.completed_at.is_some() {
        return true;
    }
    let old = find(situation.instances, &change.from).and_then(ObservedInstance::reported);
    match old {
        Some(report) => report.role == ReportedRole::Replica,
        None => {
            let waited = situation.now.duration_since(change.started_at.0);
            waited.as_secs_f64() >= situation.failover_delay.as_secs_f64()
        }
    }
}

fn find<'a>(instances: &'a [ObservedInstance], pod: &str) -> Option<&'a ObservedInstance> {
    instances.iter().find(|instance| instance.pod == pod)
}

/// How soon to look at a cluster of several instances again: often enough that a lost
/// primary is noticed well within the failover delay.
pub fn watch_period(failover_delay: Duration, urgent: bool, carrying: bool) -> Duration {
    if carrying {
        return CHANGE_PERIOD;
    }
    if urgent {
        return Duration::from_secs(1);
    }
    (failover_delay / 2).clamp(Duration::from_secs(1), super::INSTANCE_REFRESH)
}

mod planned;

#[cfg(test)]
mod tests;
