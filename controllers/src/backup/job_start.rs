//! A backup whose Job has not started its agent: say why at once, and give the Job up once it has
//! not started within the start timeout (`--backup-start-timeout`).
//!
//! Why give up rather than wait for the Job's `activeDeadlineSeconds` (hours): a running backup
//! blocks its cluster's next ones, so a Job stuck on a missing Secret, an image that cannot be
//! pulled or a pod no node takes would block every schedule until then. Failing it (and deleting
//! the Job, so that it cannot start later behind the status's back) leaves the next scheduled
//! backup free to try, with the reason on record. A pod that waits only for a while (an image
//! pull, a node that scales up, a Secret created a moment later) shows its reason meanwhile and
//! goes on once it starts.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use pgkube_crds::PostgreSQLBackup;

use super::decide::Reason;
use super::status::{self, Change};
use super::{BackupContext, Error, remove};
use crate::agent_job::{self as job, NotStarted, StartDeadline};

/// Condition reason of a running backup whose Job's pod cannot start (yet).
pub const NOT_STARTED_REASON: &str = "JobNotStarted";
/// Condition reason of a backup failed because its Job did not start in time.
pub const START_TIMEOUT_REASON: &str = "JobStartTimeout";
/// How soon a backup whose Job has not started looks again: its pod's changes do not touch the
/// Job, whose changes are the only ones this controller watches.
const STARTING_REQUEUE: Duration = Duration::from_secs(15);

/// What to do about a Job that has not started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Keep the backup Running with this reason, and look again after this long.
    Wait(Reason, Duration),
    /// Delete the Job and fail the backup for this reason.
    GiveUp(Reason),
}

/// The step for Job `job`, created at `created`, whose agent has not started because of `why`
/// (pure). A pod on its way shows as running, trouble shows at once, and either fails once the
/// Job is older than `timeout`.
pub fn step(
    job: &str,
    why: &NotStarted,
    created: Option<Timestamp>,
    now: Timestamp,
    timeout: Duration,
) -> Step {
    let left = match job::start::deadline(created, now, timeout) {
        StartDeadline::Within(left) => left,
        StartDeadline::Passed => {
            return Step::GiveUp(Reason::new(
                START_TIMEOUT_REASON,
                format!(
                    "backup Job {job} did not start within {}s, so it was deleted: {}",
                    timeout.as_secs(),
                    why.describe()
                ),
            ));
        }
    };
    let reason = if why.is_trouble() {
        // The timeout, not the time left: the message stays the same from look to look.
        Reason::new(
            NOT_STARTED_REASON,
            format!(
                "backup Job {job} has not started: {}; the backup fails if it has not started {}s after the Job was created",
                why.describe(),
                timeout.as_secs()
            ),
        )
    } else {
        Reason::new(status::RUNNING_REASON, status::running_message(job))
    };
    // Just after the deadline, so that the look that follows gives up.
    let again = STARTING_REQUEUE.min(left + Duration::from_secs(1));
    Step::Wait(reason, again)
}

/// Shows why the Job has not started, or fails the backup once it is too late.
pub async fn follow(
    context: &BackupContext,
    backup: &PostgreSQLBackup,
    namespace: &str,
    job: &str,
    why: &NotStarted,
    created: Option<Timestamp>,
) -> Result<Action, Error> {
    let timeout = context.base.settings.backup_start_timeout;
    match step(job, why, created, Timestamp::now(), timeout) {
        Step::Wait(reason, again) => {
            status::write(context, backup, Change::Progress(reason)).await?;
            Ok(Action::requeue(again))
        }
        Step::GiveUp(reason) => {
            remove::stop_job(context, namespace, job).await?;
            status::write(context, backup, Change::Failed(reason)).await?;
            Ok(Action::await_change())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(300);

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).expect("time")
    }

    fn waiting(reason: &str, message: &str) -> NotStarted {
        NotStarted {
            pod: Some("b1-backup-x7k2p".to_owned()),
            reason: reason.to_owned(),
            message: message.to_owned(),
            pod_created: Some(at(0)),
        }
    }

    #[test]
    fn a_pod_on_its_way_shows_as_running_and_is_looked_at_again_soon() {
        let creating = waiting("ContainerCreating", "");
        let Step::Wait(reason, again) = step("b1-backup", &creating, Some(at(0)), at(20), TIMEOUT)
        else {
            panic!("waits");
        };
        assert_eq!(reason.reason, status::RUNNING_REASON);
        assert_eq!(reason.message, status::running_message("b1-backup"));
        assert_eq!(again, STARTING_REQUEUE);
    }

    #[test]
    fn trouble_shows_at_once_with_the_pods_reason_and_a_stable_message() {
        let missing = waiting("CreateContainerConfigError", "secret \"s3-keys\" not found");
        let first = step("b1-backup", &missing, Some(at(0)), at(5), TIMEOUT);
        let later = step("b1-backup", &missing, Some(at(0)), at(95), TIMEOUT);
        let Step::Wait(reason, _) = &first else {
            panic!("waits");
        };
        assert_eq!(reason.reason, NOT_STARTED_REASON);
        assert_eq!(
            reason.message,
            "backup Job b1-backup has not started: pod b1-backup-x7k2p waits: \
             CreateContainerConfigError: secret \"s3-keys\" not found; the backup fails if it \
             has not started 300s after the Job was created"
        );
        let Step::Wait(again, _) = &later else {
            panic!("waits");
        };
        assert_eq!(again, reason, "no new status write from look to look");
    }

    #[test]
    fn a_job_that_did_not_start_in_time_is_given_up_with_the_last_reason() {
        let unschedulable = waiting("Unschedulable", "0/3 nodes are available");
        assert_eq!(
            step("b1-backup", &unschedulable, Some(at(0)), at(290), TIMEOUT),
            Step::Wait(
                step("b1-backup", &unschedulable, Some(at(0)), at(0), TIMEOUT)
                    .reason()
                    .clone(),
                Duration::from_secs(11)
            ),
            "the last look lands just after the deadline"
        );
        let Step::GiveUp(reason) = step("b1-backup", &unschedulable, Some(at(0)), at(300), TIMEOUT)
        else {
            panic!("gives up");
        };
        assert_eq!(reason.reason, START_TIMEOUT_REASON);
        assert_eq!(
            reason.message,
            "backup Job b1-backup did not start within 300s, so it was deleted: pod \
             b1-backup-x7k2p waits: Unschedulable: 0/3 nodes are available"
        );
        // Even a pod on its way is given up: the timeout bounds every start.
        let creating = waiting("ContainerCreating", "");
        assert!(matches!(
            step("b1-backup", &creating, Some(at(0)), at(301), TIMEOUT),
            Step::GiveUp(_)
        ));
    }

    impl Step {
        fn reason(&self) -> &Reason {
            match self {
                Step::Wait(reason, _) | Step::GiveUp(reason) => reason,
            }
        }
    }
}
