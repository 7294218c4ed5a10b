//! The restore's status for each change of its state (pure), and its write: only when it
//! differs, with an Event when the phase or the reason changes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use pgkube_crds::{PostgreSQLRestore, PostgreSQLRestoreStatus, RestorePhase, TransferProgress};
use serde_json::json;

use super::identity::starting_message;
use super::{Error, RestoreContext, STATUS_FIELD_MANAGER, kube_error};
use crate::agent_job::AgentResult;
use crate::backup::decide::Reason;

/// Type of the restore's one condition: True once Completed, else False with the reason.
pub const COMPLETED_CONDITION: &str = "Completed";
/// Condition reason of a restore whose Job runs.
pub const RUNNING_REASON: &str = "Running";

/// The message of a restore whose Job runs.
pub fn running_message(job: &str, manifest_key: &str) -> String {
    format!("restore Job {job} is restoring {manifest_key}")
}

/// What happened to the restore.
pub enum Change {
    Pending(Reason),
    /// About to create the Job, which must find the database of system identifier `target` (or
    /// any, for `Any`) in the cluster: recorded before the Job exists.
    Starting {
        target: String,
    },
    Running {
        job: String,
        manifest_key: String,
    },
    /// The Job exists and has not ended: whether its agent started, or why not (see
    /// `backup::job_start`), and how far its agent got when it says so (`None` keeps the last
    /// one). Only the message, the condition and the progress change.
    Progress(Reason, Option<TransferProgress>),
    Completed(Box<AgentResult>),
    /// A PointInTime restore, about to be carried out by the cluster, which must hold the
    /// database of system identifier `target`.
    RecoveringInPlace {
        target: String,
    },
    /// A PointInTime restore ended well.
    RecoveredInPlace(String),
    Failed(Reason),
}

/// Writes the status for `change` if it differs from the current one, with an Event when the
/// phase or its reason changes; returns the status as it now is.
pub async fn write(
    context: &RestoreContext,
    restore: &PostgreSQLRestore,
    change: Change,
) -> Result<PostgreSQLRestoreStatus, Error> {
    let previous = restore.status.clone().unwrap_or_default();
    let new = next_status(&previous, change, Timestamp::now());
    if same(&new, &previous) {
        return Ok(previous);
    }
    patch(context, restore, &new).await?;
    tracing::info!(phase = ?new.phase, message = new.message.as_deref().unwrap_or(""), "status updated");
    let reason =
        |status: &PostgreSQLRestoreStatus| status.conditions.first().map(|c| c.reason.clone());
    if new.phase != previous.phase || reason(&new) != reason(&previous) {
        crate::publish_event(
            &context.recorder,
            &restore.object_ref(&()),
            new.phase == Some(RestorePhase::Failed)
                || reason(&new).as_deref() == Some(crate::backup::job_start::NOT_STARTED_REASON),
            &reason(&new).unwrap_or_default(),
            new.message.clone().unwrap_or_default(),
            "Restore",
        )
        .await;
    }
    Ok(new)
}

/// The status after `change`.
pub fn next_status(
    previous: &PostgreSQLRestoreStatus,
    change: Change,
    now: Timestamp,
) -> PostgreSQLRestoreStatus {
    let mut status = previous.clone();
    let (phase, condition_status, reason, message) = match change {
        Change::Pending(reason) => (
            RestorePhase::Pending,
            "False",
            reason.reason,
            reason.message,
        ),
        Change::Starting { target } => {
            let message = starting_message(&target);
            status.target_system_identifier = Some(target);
            (RestorePhase::Pending, "False", "Starting", message)
        }
        Change::Running { job, manifest_key } => {
            status.job_name = Some(job.clone());
            status.restored_object_key = Some(manifest_key.clone());
            status.start_time = Some(Time(now));
            let message = running_message(&job, &manifest_key);
            (RestorePhase::Running, "False", RUNNING_REASON, message)
        }
        Change::Progress(reason, progress) => {
            if progress.is_some() {
                status.progress = progress;
            }
            (
                RestorePhase::Running,
                "False",
                reason.reason,
                reason.message,
            )
        }
        Change::Completed(result) => {
            status.progress = None;
            if let Some(key) = result.manifest_key {
                status.restored_object_key = Some(key);
            }
            status.restored_databases = result.databases.unwrap_or_default();
            status.start_time = parse_time(result.started_at.as_deref()).or(status.start_time);
            status.completion_time = parse_time(result.finished_at.as_deref()).or(Some(Time(now)));
            let databases = if status.restored_databases.is_empty() {
                "the backup's databases".to_owned()
            } else {
                status.restored_databases.join(", ")
            };
            let message = format!(
                "restored {databases} from {}",
                status
                    .restored_object_key
                    .as_deref()
                    .unwrap_or("the backup")
            );
            (RestorePhase::Completed, "True", "Completed", message)
        }
        Change::RecoveringInPlace { target } => {
            status.target_system_identifier = Some(target);
            status.start_time = Some(Time(now));
            let message = "the cluster recovers in place: fenced, its primary stops".to_owned();
            (RestorePhase::Running, "False", "Recovering", message)
        }
        Change::RecoveredInPlace(message) => {
            status.progress = None;
            status.completion_time = Some(Time(now));
            (RestorePhase::Completed, "True", "Completed", message)
        }
        Change::Failed(reason) => {
            status.progress = None;
            status.completion_time = Some(Time(now));
            (RestorePhase::Failed, "False", reason.reason, reason.message)
        }
    };
    status.phase = Some(phase);
    status.message = Some(message.clone());
    let condition = Condition {
        type_: COMPLETED_CONDITION.to_owned(),
        status: condition_status.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: None,
        last_transition_time: Time(now),
    };
    status.conditions = crate::sole_condition(condition, &previous.conditions);
    status
}

/// Equal but for transition times and when the progress was read: no write.
fn same(new: &PostgreSQLRestoreStatus, previous: &PostgreSQLRestoreStatus) -> bool {
    let strip = |status: &PostgreSQLRestoreStatus| {
        let mut status = status.clone();
        for condition in &mut status.conditions {
            condition.last_transition_time = Time(Timestamp::UNIX_EPOCH);
        }
        if let Some(progress) = &mut status.progress {
            progress.updated_at = Time(Timestamp::UNIX_EPOCH);
        }
        status
    };
    strip(new) == strip(previous)
}

fn parse_time(text: Option<&str>) -> Option<Time> {
    text?.parse::<Timestamp>().ok().map(Time)
}

/// Patches the status of `restore` with server-side apply.
async fn patch(
    context: &RestoreContext,
    restore: &PostgreSQLRestore,
    status: &PostgreSQLRestoreStatus,
) -> Result<(), Error> {
    let name = restore.name_any();
    let namespace = restore.namespace().ok_or(Error::MissingNamespace)?;
    let body = json!({
        "apiVersion": PostgreSQLRestore::api_version(&()),
        "kind": PostgreSQLRestore::kind(&()),
        "status": status,
    });
    Api::<PostgreSQLRestore>::namespaced(context.base.client.clone(), &namespace)
        .patch_status(
            &name,
            &PatchParams::apply(STATUS_FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map(|_| ())
        .map_err(kube_error("write status of", "PostgreSQLRestore", &name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).expect("time")
    }

    #[test]
    fn a_completed_restore_records_the_databases_and_times_the_agent_reported() {
        let running = next_status(
            &PostgreSQLRestoreStatus::default(),
            Change::Running {
                job: "r1-restore".to_owned(),
                manifest_key: "db/main/b1/manifest.json".to_owned(),
            },
            at(0),
        );
        assert_eq!(running.phase, Some(RestorePhase::Running));
        assert_eq!(running.job_name.as_deref(), Some("r1-restore"));
        assert_eq!(
            running.restored_object_key.as_deref(),
            Some("db/main/b1/manifest.json")
        );
        let result = AgentResult {
            status: "Completed".to_owned(),
            manifest_key: Some("db/main/b1/manifest.json".to_owned()),
            started_at: Some("2027-01-15T08:00:00Z".to_owned()),
            finished_at: Some("2027-01-15T08:01:00Z".to_owned()),
            databases: Some(vec!["app".to_owned(), "shop".to_owned()]),
            ..AgentResult::default()
        };
        let done = next_status(&running, Change::Completed(Box::new(result)), at(90));
        assert_eq!(done.phase, Some(RestorePhase::Completed));
        assert_eq!(done.restored_databases, ["app", "shop"]);
        assert_eq!(
            done.completion_time.map(|t| t.0.to_string()).as_deref(),
            Some("2027-01-15T08:01:00Z")
        );
        assert_eq!(
            done.message.as_deref(),
            Some("restored app, shop from db/main/b1/manifest.json")
        );
        let condition = &done.conditions[0];
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("True", "Completed")
        );
    }

    #[test]
    fn the_target_is_recorded_before_the_job_and_kept_to_the_end() {
        let starting = next_status(
            &PostgreSQLRestoreStatus::default(),
            Change::Starting {
                target: "7312345678901234567".to_owned(),
            },
            at(0),
        );
        assert_eq!(starting.phase, Some(RestorePhase::Pending));
        assert_eq!(
            starting.target_system_identifier.as_deref(),
            Some("7312345678901234567")
        );
        assert_eq!(starting.job_name, None, "recorded before any Job");
        assert_eq!(starting.conditions[0].reason, "Starting");
        let running = next_status(
            &starting,
            Change::Running {
                job: "r1-restore".to_owned(),
                manifest_key: "db/main/b1/manifest.json".to_owned(),
            },
            at(1),
        );
        let failed = next_status(
            &running,
            Change::Failed(Reason::new(
                "SystemIdentifierMismatch",
                "the target database has system identifier 1",
            )),
            at(2),
        );
        assert_eq!(
            failed.target_system_identifier.as_deref(),
            Some("7312345678901234567")
        );
        assert_eq!(failed.phase, Some(RestorePhase::Failed));
        assert_eq!(failed.conditions[0].reason, "SystemIdentifierMismatch");
    }

    #[test]
    fn a_job_that_has_not_started_shows_why_and_then_runs_as_before() {
        let running = next_status(
            &PostgreSQLRestoreStatus::default(),
            Change::Running {
                job: "r1-restore".to_owned(),
                manifest_key: "db/main/b1/manifest.json".to_owned(),
            },
            at(0),
        );
        let waits = Reason::new("JobNotStarted", "pod r1-restore-x waits: ImagePullBackOff");
        let waiting = next_status(&running, Change::Progress(waits, None), at(20));
        assert_eq!(waiting.phase, Some(RestorePhase::Running));
        assert_eq!(waiting.start_time, running.start_time);
        assert_eq!(waiting.conditions[0].reason, "JobNotStarted");
        assert!(!same(&waiting, &running));
        let started = Reason::new(
            RUNNING_REASON,
            running_message("r1-restore", "db/main/b1/manifest.json"),
        );
        let back = next_status(&waiting, Change::Progress(started, None), at(40));
        assert!(same(&back, &running), "{back:?}");
    }

    #[test]
    fn waiting_again_for_the_same_reason_writes_nothing_and_keeps_the_transition_time() {
        let reason = || Reason::new("ClusterNotFound", "PostgreSQLCluster main does not exist");
        let first = next_status(
            &PostgreSQLRestoreStatus::default(),
            Change::Pending(reason()),
            at(0),
        );
        let again = next_status(&first, Change::Pending(reason()), at(30));
        assert!(same(&again, &first));
        let failed = next_status(
            &first,
            Change::Failed(Reason::new("PendingTimeout", "waited")),
            at(60),
        );
        assert!(!same(&failed, &first));
        assert_eq!(failed.phase, Some(RestorePhase::Failed));
    }
}
