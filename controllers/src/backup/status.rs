//! The backup's status for each change of its state, written only when it differs, with an
//! Event when the phase changes and the backup metrics when it ends.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};
use pgkube_crds::{
    BackupCompression, BackupPhase, BackupStorage, PostgreSQLBackup, PostgreSQLBackupStatus,
    S3Storage, TransferProgress,
};

use super::decide::Reason;
use super::verify::Verified;
use super::{BackupContext, Error, cluster_labels, ended, patch_status};

/// Type of the backup's one condition: True once Completed.
pub const COMPLETED_CONDITION: &str = "Completed";
/// Condition reason of a backup whose Job runs.
pub const RUNNING_REASON: &str = "Running";

/// The message of a backup whose Job runs.
pub fn running_message(job: &str) -> String {
    format!("backup Job {job} is running")
}

/// What happened to the backup.
pub enum Change {
    Pending(Reason),
    /// The Job was created: where the backup goes (the storage, and the key of its manifest,
    /// in a directory no other backup has), how it compresses, and the Job.
    Running {
        storage: Box<S3Storage>,
        manifest_key: String,
        compression: BackupCompression,
        job: String,
    },
    /// The Job exists and has not ended: whether its agent started, or why not (see
    /// `job_start`), and how far its agent got when it says so (`None` keeps the last one).
    /// Only the message, the condition and the progress change.
    Progress(Reason, Option<TransferProgress>),
    Completed(Verified),
    Failed(Reason),
}

/// Writes the status for `change` if it differs from the current one; publishes an Event and
/// records the metrics when the phase changes.
pub async fn write(
    context: &BackupContext,
    backup: &PostgreSQLBackup,
    change: Change,
) -> Result<(), Error> {
    let previous = backup.status.clone().unwrap_or_default();
    let now = Timestamp::now();
    let new = next_status(&previous, change, now);
    if same(&new, &previous) {
        return Ok(());
    }
    patch_status(&context.base.client, backup, &new).await?;
    tracing::info!(phase = ?new.phase, message = new.message.as_deref().unwrap_or(""), "status updated");
    if new.phase != previous.phase || new.message != previous.message {
        publish_event(context, backup, &new).await;
    }
    if ended(new.phase) && !ended(previous.phase) {
        record_metrics(context, backup, &new);
    }
    Ok(())
}

/// The status after `change` (pure).
pub fn next_status(
    previous: &PostgreSQLBackupStatus,
    change: Change,
    now: Timestamp,
) -> PostgreSQLBackupStatus {
    let mut status = previous.clone();
    let (phase, condition_status, reason, message) = match change {
        Change::Pending(reason) => (BackupPhase::Pending, "False", reason.reason, reason.message),
        Change::Running {
            storage,
            manifest_key,
            compression,
            job,
        } => {
            status.storage = Some(BackupStorage { s3: *storage });
            status.object_key = Some(manifest_key);
            status.compression = Some(compression);
            status.job_name = Some(job.clone());
            status.start_time = Some(Time(now));
            let message = running_message(&job);
            (BackupPhase::Running, "False", RUNNING_REASON, message)
        }
        Change::Progress(reason, progress) => {
            if progress.is_some() {
                status.progress = progress;
            }
            (BackupPhase::Running, "False", reason.reason, reason.message)
        }
        Change::Completed(verified) => {
            status.progress = None;
            status.object_key = Some(verified.manifest_key.clone());
            status.size_bytes = Some(i64::try_from(verified.size).unwrap_or(i64::MAX));
            status.checksum = Some(verified.checksum.clone());
            status.postgres_version = Some(verified.postgresql_version.clone());
            status.start_time = parse_time(&verified.started_at).or(status.start_time);
            status.completion_time = parse_time(&verified.finished_at).or(Some(Time(now)));
            let message = format!(
                "{} bytes verified in storage under {}",
                verified.size, verified.manifest_key
            );
            (BackupPhase::Completed, "True", "Completed", message)
        }
        Change::Failed(reason) => {
            status.progress = None;
            status.completion_time = Some(Time(now));
            (BackupPhase::Failed, "False", reason.reason, reason.message)
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

/// Equal but for transition times: no write.
fn same(new: &PostgreSQLBackupStatus, previous: &PostgreSQLBackupStatus) -> bool {
    new.phase == previous.phase
        && new.message == previous.message
        && new.storage == previous.storage
        && new.compression == previous.compression
        && new.job_name == previous.job_name
        && new.object_key == previous.object_key
        && new.size_bytes == previous.size_bytes
        && new.checksum == previous.checksum
        && same_progress(new.progress.as_ref(), previous.progress.as_ref())
        && new.conditions.len() == previous.conditions.len()
        && new
            .conditions
            .iter()
            .zip(&previous.conditions)
            .all(|(a, b)| {
                a.type_ == b.type_
                    && a.status == b.status
                    && a.reason == b.reason
                    && a.message == b.message
            })
}

/// Equal but for when it was read: a stalled agent's progress is not written again.
fn same_progress(new: Option<&TransferProgress>, previous: Option<&TransferProgress>) -> bool {
    match (new, previous) {
        (Some(new), Some(previous)) => {
            let mut new = new.clone();
            new.updated_at = previous.updated_at.clone();
            &new == previous
        }
        (new, previous) => new.is_none() && previous.is_none(),
    }
}

fn parse_time(text: &str) -> Option<Time> {
    text.parse::<Timestamp>().ok().map(Time)
}

async fn publish_event(
    context: &BackupContext,
    backup: &PostgreSQLBackup,
    status: &PostgreSQLBackupStatus,
) {
    let reason = status
        .conditions
        .first()
        .map(|c| c.reason.clone())
        .unwrap_or_default();
    let warning =
        status.phase == Some(BackupPhase::Failed) || reason == super::job_start::NOT_STARTED_REASON;
    let note = status.message.clone().unwrap_or_default();
    let reference = backup.object_ref(&());
    crate::publish_event(
        &context.recorder,
        &reference,
        warning,
        &reason,
        note,
        "Backup",
    )
    .await;
}

fn record_metrics(
    context: &BackupContext,
    backup: &PostgreSQLBackup,
    status: &PostgreSQLBackupStatus,
) {
    let seconds = |time: &Option<Time>| time.as_ref().map(|t| t.0.as_second());
    let took = match (
        seconds(&status.start_time),
        seconds(&status.completion_time),
    ) {
        (Some(start), Some(end)) if end >= start => Some(std::time::Duration::from_secs(
            u64::try_from(end - start).unwrap_or(0),
        )),
        _ => None,
    };
    let completed = (status.phase == Some(BackupPhase::Completed))
        .then(|| Some((seconds(&status.completion_time)?, status.size_bytes?)))
        .flatten();
    context
        .base
        .metrics
        .observe_backup(&cluster_labels(backup), took, completed);
    tracing::info!(backup = %backup.name_any(), phase = ?status.phase, "backup ended");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gzip_3() -> BackupCompression {
        BackupCompression {
            method: pgkube_crds::CompressionMethod::Gzip,
            level: Some(3),
        }
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).expect("time")
    }

    #[test]
    fn a_completed_backup_records_what_was_verified() {
        let running = next_status(
            &PostgreSQLBackupStatus::default(),
            Change::Running {
                storage: Box::default(),
                manifest_key: "db/main/c/b1/u/manifest.json".to_owned(),
                compression: gzip_3(),
                job: "b1-backup".to_owned(),
            },
            at(0),
        );
        assert_eq!(running.phase, Some(BackupPhase::Running));
        assert_eq!(running.compression, Some(gzip_3()));
        assert_eq!(running.job_name.as_deref(), Some("b1-backup"));
        assert_eq!(
            running.object_key.as_deref(),
            Some("db/main/c/b1/u/manifest.json"),
            "where the manifest goes is known from the start"
        );
        let verified = Verified {
            manifest_key: "db/main/c/b1/u/manifest.json".to_owned(),
            size: 4242,
            checksum: "sha256:ab".to_owned(),
            postgresql_version: "15.14".to_owned(),
            started_at: "2027-01-15T08:00:00Z".to_owned(),
            finished_at: "2027-01-15T08:01:00Z".to_owned(),
        };
        let done = next_status(&running, Change::Completed(verified), at(90));
        assert_eq!(done.phase, Some(BackupPhase::Completed));
        assert_eq!(done.size_bytes, Some(4242));
        assert_eq!(
            done.object_key.as_deref(),
            Some("db/main/c/b1/u/manifest.json")
        );
        assert_eq!(done.postgres_version.as_deref(), Some("15.14"));
        assert_eq!(done.compression, Some(gzip_3()), "kept once completed");
        assert_eq!(
            done.completion_time
                .clone()
                .map(|t| t.0.to_string())
                .as_deref(),
            Some("2027-01-15T08:01:00Z")
        );
        let condition = &done.conditions[0];
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("True", "Completed")
        );
        assert!(!same(&done, &running));
    }

    #[test]
    fn progress_changes_only_the_message_and_the_condition() {
        let running = next_status(
            &PostgreSQLBackupStatus::default(),
            Change::Running {
                storage: Box::default(),
                manifest_key: "db/main/c/b1/u/manifest.json".to_owned(),
                compression: gzip_3(),
                job: "b1-backup".to_owned(),
            },
            at(0),
        );
        let not_started = Reason::new("JobNotStarted", "pod b1-backup-x waits: ErrImagePull");
        let waiting = next_status(&running, Change::Progress(not_started, None), at(20));
        assert_eq!(waiting.phase, Some(BackupPhase::Running));
        assert_eq!(waiting.start_time, running.start_time);
        assert_eq!(waiting.job_name, running.job_name);
        assert_eq!(waiting.object_key, running.object_key);
        assert_eq!(
            waiting.message.as_deref(),
            Some("pod b1-backup-x waits: ErrImagePull")
        );
        assert_eq!(waiting.conditions[0].reason, "JobNotStarted");
        assert!(!same(&waiting, &running), "written");
        let started = Reason::new(RUNNING_REASON, running_message("b1-backup"));
        let back = next_status(&waiting, Change::Progress(started, None), at(40));
        assert!(same(&back, &running), "as it was before the wait");
        let again = Reason::new(RUNNING_REASON, running_message("b1-backup"));
        assert!(same(
            &next_status(&running, Change::Progress(again, None), at(60)),
            &running
        ));
    }

    #[test]
    fn waiting_again_for_the_same_reason_writes_nothing() {
        let reason = || Reason {
            reason: "ClusterNotReady",
            message: "not yet".to_owned(),
        };
        let first = next_status(
            &PostgreSQLBackupStatus::default(),
            Change::Pending(reason()),
            at(0),
        );
        let again = next_status(&first, Change::Pending(reason()), at(30));
        assert!(same(&again, &first));
        assert_eq!(
            again.conditions[0].last_transition_time,
            first.conditions[0].last_transition_time
        );
    }
}
