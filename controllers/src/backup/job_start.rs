//! A backup whose Job has not started its agent: say why at once, and give the Job up once it has
//! not started within the start timeout (`--backup-start-timeout`). Restores take the same
//! steps ([`step`]) with `--restore-start-timeout`: a running restore holds its cluster's
//! scheduled backups back just as a running backup does.
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

/// Condition reason of a running backup or restore whose Job's pod cannot start (yet).
pub const NOT_STARTED_REASON: &str = "JobNotStarted";
/// Condition reason of a backup or restore failed because its Job did not start in time.
pub const START_TIMEOUT_REASON: &str = "JobStartTimeout";
/// How soon a Job that has not started is looked at again: its pod's changes do not touch the
/// Job, whose changes are the only ones the controllers watch.
const STARTING_REQUEUE: Duration = Duration::from_secs(15);

/// What to do about a Job that has not started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Its pod is on its way: show the object as running, and look again after this long.
    OnItsWay(Duration),
    /// Show this reason (the object stays Running), and look again after this long.
    Trouble(Reason, Duration),
    /// Delete the Job and fail the object for this reason.
    GiveUp(Reason),
}

/// The step for the `verb` (`backup` or `restore`) Job `job`, created at `created`, whose agent
/// has not started because of `why` (pure). A pod on its way shows as running, trouble shows at
/// once, and either fails once the Job is older than `timeout`.
pub fn step(
    verb: &str,
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
                    "{verb} Job {job} did not start within {}s, so it was deleted: {}",
                    timeout.as_secs(),
                    why.describe()
                ),
            ));
        }
    };
    // Just after the deadline, so that the look that follows gives up.
    let again = STARTING_REQUEUE.min(left + Duration::from_secs(1));
    if !why.is_trouble() {
        return Step::OnItsWay(again);
    }
    // The timeout, not the time left: the message stays the same from look to look.
    let reason = Reason::new(
        NOT_STARTED_REASON,
        format!(
            "{verb} Job {job} has not started: {}; the {verb} fails if it has not started {}s after the Job was created",
            why.describe(),
            timeout.as_secs()
        ),
    );
    Step::Trouble(reason, again)
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
    let (reason, again) = match step("backup", job, why, created, Timestamp::now(), timeout) {
        Step::OnItsWay(again) => (
            Reason::new(status::RUNNING_REASON, status::running_message(job)),
            again,
        ),
        Step::Trouble(reason, again) => (reason, again),
        Step::GiveUp(reason) => {
            remove::stop_job(context, namespace, job).await?;
            status::write(context, backup, Change::Failed(reason)).await?;
            return Ok(Action::await_change());
        }
    };
    status::write(context, backup, Change::Progress(reason, None)).await?;
    Ok(Action::requeue(again))
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
        assert_eq!(
            step(
                "backup",
                "b1-backup",
                &creating,
                Some(at(0)),
                at(20),
                TIMEOUT
            ),
            Step::OnItsWay(STARTING_REQUEUE)
        );
    }

    #[test]
    fn trouble_shows_at_once_with_the_pods_reason_and_a_stable_message() {
        let missing = waiting("CreateContainerConfigError", "secret \"s3-keys\" not found");
        let first = step("backup", "b1-backup", &missing, Some(at(0)), at(5), TIMEOUT);
        let later = step(
            "backup",
            "b1-backup",
            &missing,
            Some(at(0)),
            at(95),
            TIMEOUT,
        );
        let Step::Trouble(reason, again) = &first else {
            panic!("trouble: {first:?}");
        };
        assert_eq!(*again, STARTING_REQUEUE);
        assert_eq!(reason.reason, NOT_STARTED_REASON);
        assert_eq!(
            reason.message,
            "backup Job b1-backup has not started: pod b1-backup-x7k2p waits: \
             CreateContainerConfigError: secret \"s3-keys\" not found; the backup fails if it \
             has not started 300s after the Job was created"
        );
        assert_eq!(later, first, "no new status write from look to look");
        let Step::Trouble(restore, _) = step(
            "restore",
            "r1-restore",
            &missing,
            Some(at(0)),
            at(5),
            TIMEOUT,
        ) else {
            panic!("trouble");
        };
        assert!(
            restore
                .message
                .starts_with("restore Job r1-restore has not started: ")
                && restore.message.contains("the restore fails if"),
            "{}",
            restore.message
        );
    }

    #[test]
    fn a_job_that_did_not_start_in_time_is_given_up_with_the_last_reason() {
        let unschedulable = waiting("Unschedulable", "0/3 nodes are available");
        let Step::Trouble(_, again) = step(
            "backup",
            "b1-backup",
            &unschedulable,
            Some(at(0)),
            at(290),
            TIMEOUT,
        ) else {
            panic!("still waits");
        };
        assert_eq!(
            again,
            Duration::from_secs(11),
            "the last look lands just after the deadline"
        );
        let gave_up = step(
            "backup",
            "b1-backup",
            &unschedulable,
            Some(at(0)),
            at(300),
            TIMEOUT,
        );
        let Step::GiveUp(reason) = gave_up else {
            panic!("gives up: {gave_up:?}");
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
            step(
                "backup",
                "b1-backup",
                &creating,
                Some(at(0)),
                at(301),
                TIMEOUT
            ),
            Step::GiveUp(_)
        ));
    }
}
