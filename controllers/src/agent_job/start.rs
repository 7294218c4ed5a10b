//! Whether a backup or restore Job's pod has started its agent, and if not, why (pure).
//!
//! A Job's pod that cannot start (a missing Secret, an image that cannot be pulled, no node that
//! fits) leaves the Job active with no end in sight: the Job controller counts it as active until
//! `activeDeadlineSeconds`, hours later. The pod says why: its `PodScheduled` condition, its
//! containers' waiting reasons, or (a volume the kubelet cannot mount) a `FailedMount` Event while
//! the containers have shown `ContainerCreating` with no message for half a minute. The controllers show that reason at
//! once, and give the Job up once it has not started within the start timeout ([`deadline`]).

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Event, Pod};
use k8s_openapi::jiff::Timestamp;

/// Waiting reasons of a pod on its way (being created, pulling, initialising): not a sign of
/// trouble by themselves, only when they last (the start timeout) or come with a message.
const PROGRESS_REASONS: [&str; 3] = ["ContainerCreating", "PodInitializing", NO_POD];
/// The reason when the Job has no pod yet (a quota or an admission policy can refuse it; the Job
/// controller then retries and records `FailedCreate` on the Job).
pub const NO_POD: &str = "PodNotCreated";
/// Reasons of the kubelet's Warning Events about a volume it cannot set up for the pod.
const MOUNT_FAILURE_REASONS: [&str; 2] = ["FailedMount", "FailedAttachVolume"];
/// How long a pod may show `ContainerCreating` with nothing to say before its Events are read:
/// volumes are normally set up within seconds, and a look at every start would cost a request
/// per backup for nothing.
const MOUNT_GRACE: Duration = Duration::from_secs(30);

/// Why a Job's agent has not started yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotStarted {
    /// The pod's name; `None` when the Job has no pod yet.
    pub pod: Option<String>,
    /// Kubernetes' reason: `Unschedulable`, `ErrImagePull`, `CreateContainerConfigError`,
    /// `FailedMount`, `ContainerCreating`, ..., or [`NO_POD`].
    pub reason: String,
    /// What Kubernetes said with it; may be empty.
    pub message: String,
    /// When the pod was created.
    pub pod_created: Option<Timestamp>,
}

impl NotStarted {
    fn new(pod: Option<&Pod>, reason: &str, message: Option<&str>) -> Self {
        Self {
            pod: pod.and_then(|pod| pod.metadata.name.clone()),
            reason: reason.to_owned(),
            message: message.map(str::trim).unwrap_or_default().to_owned(),
            pod_created: pod.and_then(|pod| Some(pod.metadata.creation_timestamp.as_ref()?.0)),
        }
    }

    /// Whether to show it at once: anything but a pod on its way that says nothing more.
    pub fn is_trouble(&self) -> bool {
        !(PROGRESS_REASONS.contains(&self.reason.as_str()) && self.message.is_empty())
    }

    /// Whether the pod's Events may tell more: a kubelet retrying a mount shows only
    /// `ContainerCreating` (or `PodInitializing`) in the pod and puts the failure in an Event.
    /// Asked only once the pod has waited so for [`MOUNT_GRACE`].
    pub fn may_hide_a_mount_failure(&self, now: Timestamp) -> bool {
        let waited = self.pod_created.is_some_and(|created| {
            now.as_second().saturating_sub(created.as_second())
                >= i64::try_from(MOUNT_GRACE.as_secs()).unwrap_or(i64::MAX)
        });
        self.pod.is_some() && !self.is_trouble() && waited
    }

    /// This, or the mount failure of `events` when there is one (see [`mount_failure`]).
    pub fn or_mount_failure(self, events: &[Event]) -> Self {
        match mount_failure(events) {
            Some((reason, message)) => Self {
                reason,
                message,
                ..self
            },
            None => self,
        }
    }

    /// One line: `pod P waits: Reason: message`.
    pub fn describe(&self) -> String {
        let what = match &self.pod {
            Some(pod) => format!("pod {pod} waits: {}", self.reason),
            None => format!("{}: the Job has no pod yet", self.reason),
        };
        if self.message.is_empty() {
            what
        } else {
            format!("{what}: {}", self.message)
        }
    }
}

/// Why the agent in the Job's newest pod has not started, or `None` once it has (the agent's
/// container runs or ran: from there the Job's conditions tell its end).
pub fn not_started(pods: &[Pod]) -> Option<NotStarted> {
    let created = |pod: &&Pod| pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
    // A pod being deleted is on its way out; the Job replaces it or fails.
    let newest = pods
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .max_by_key(created)
        .or_else(|| pods.iter().max_by_key(created));
    let Some(pod) = newest else {
        return Some(NotStarted::new(None, NO_POD, None));
    };
    pod_not_started(pod)
}

/// Why `pod` has not started its containers: not scheduled, else the first container (init
/// containers first) that waits for a reason other than progress, else the first that waits at
/// all; `None` when the pod runs or ended.
fn pod_not_started(pod: &Pod) -> Option<NotStarted> {
    let this = Some(pod);
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    if phase != "Pending" {
        return None;
    }
    let unscheduled = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| {
            conditions
                .iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        });
    if let Some(condition) = unscheduled {
        let reason = condition.reason.as_deref().unwrap_or("Unschedulable");
        return Some(NotStarted::new(this, reason, condition.message.as_deref()));
    }
    let statuses: Vec<&ContainerStatus> = status
        .into_iter()
        .flat_map(|s| {
            let init = s.init_container_statuses.iter().flatten();
            init.chain(s.container_statuses.iter().flatten())
        })
        .collect();
    let waiting: Vec<NotStarted> = statuses
        .iter()
        .filter_map(|s| s.state.as_ref()?.waiting.as_ref())
        .map(|w| {
            let reason = w.reason.as_deref().unwrap_or("ContainerCreating");
            NotStarted::new(this, reason, w.message.as_deref())
        })
        .collect();
    let first_trouble = waiting.iter().find(|w| w.is_trouble()).cloned();
    first_trouble
        .or_else(|| waiting.into_iter().next())
        .or_else(|| Some(NotStarted::new(this, "ContainerCreating", None)))
}

/// The newest Warning Event about a volume the kubelet cannot set up, as its reason and message.
pub fn mount_failure(events: &[Event]) -> Option<(String, String)> {
    let when = |event: &&Event| {
        let last = event.last_timestamp.as_ref().map(|t| t.0);
        let series = event.event_time.as_ref().map(|t| t.0);
        let created = event.metadata.creation_timestamp.as_ref().map(|t| t.0);
        last.or(series).or(created)
    };
    events
        .iter()
        .filter(|event| event.type_.as_deref() == Some("Warning"))
        .filter(|event| {
            event
                .reason
                .as_deref()
                .is_some_and(|reason| MOUNT_FAILURE_REASONS.contains(&reason))
        })
        .max_by_key(when)
        .map(|event| {
            (
                event.reason.clone().unwrap_or_default(),
                event
                    .message
                    .as_deref()
                    .unwrap_or_default()
                    .trim()
                    .to_owned(),
            )
        })
}

/// Where a Job that has not started stands against its start timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartDeadline {
    /// It may still start; this much time is left.
    Within(Duration),
    /// It did not start in time: give it up.
    Passed,
}

/// The start deadline of a Job created at `created` (its `creationTimestamp`): `timeout` after
/// it. A Job without a creation time (never from the API server) counts from `now`.
pub fn deadline(created: Option<Timestamp>, now: Timestamp, timeout: Duration) -> StartDeadline {
    let age = created
        .and_then(|created| {
            let seconds = now.as_second().checked_sub(created.as_second())?;
            u64::try_from(seconds).ok()
        })
        .map(Duration::from_secs)
        .unwrap_or_default();
    match timeout.checked_sub(age) {
        Some(left) if !left.is_zero() => StartDeadline::Within(left),
        _ => StartDeadline::Passed,
    }
}

#[cfg(test)]
mod tests;
