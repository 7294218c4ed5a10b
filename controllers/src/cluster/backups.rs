//! What the cluster's status says about its backups (pure): `lastSuccessfulBackup` and the
//! BackupComplete condition, from the cluster's PostgreSQLBackups as the watch cache has them.
//! The backup controller writes each backup's own status; the cluster controller only reads
//! them, so each object's status has one writer.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use pgkube_crds::{BackupPhase, PostgreSQLBackup};

/// Condition type: True with the time of the last good backup, False with the reason of the
/// last failure (when the newest backup to end failed).
pub const BACKUP_COMPLETE: &str = "BackupComplete";

/// The backup fields of a cluster's status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BackupSummary {
    /// Name of the newest Completed backup.
    pub last_successful: Option<String>,
    /// BackupComplete, once a backup of the cluster has ended.
    pub condition: Option<Condition>,
}

/// The summary of `backups` (the cluster's, in any order). The transition time is left at
/// `now`; the caller keeps the previous one when the condition did not change.
pub fn summarize(backups: &[&PostgreSQLBackup], now: Time) -> BackupSummary {
    let ended = |phase: BackupPhase| {
        backups
            .iter()
            .filter(move |b| b.status.as_ref().and_then(|s| s.phase) == Some(phase))
            .max_by_key(|b| (completion(b), b.name_any()))
            .copied()
    };
    let last_good = ended(BackupPhase::Completed);
    let last_failed = ended(BackupPhase::Failed);
    let newest_failed = match (last_failed, last_good) {
        (Some(failed), Some(good)) => completion(failed) > completion(good),
        (Some(_), None) => true,
        _ => false,
    };
    let condition = if newest_failed {
        last_failed.map(|failed| failed_condition(failed, last_good, now.clone()))
    } else {
        last_good.map(|good| completed_condition(good, now.clone()))
    };
    BackupSummary {
        last_successful: last_good.map(|b| b.name_any()),
        condition,
    }
}

fn completion(backup: &PostgreSQLBackup) -> Option<i64> {
    backup
        .status
        .as_ref()
        .and_then(|s| s.completion_time.as_ref())
        .map(|t| t.0.as_second())
}

fn completion_text(backup: &PostgreSQLBackup) -> String {
    backup
        .status
        .as_ref()
        .and_then(|s| s.completion_time.as_ref())
        .map_or_else(|| "an unknown time".to_owned(), |t| t.0.to_string())
}

fn completed_condition(good: &PostgreSQLBackup, now: Time) -> Condition {
    let size = good
        .status
        .as_ref()
        .and_then(|s| s.size_bytes)
        .map_or_else(String::new, |bytes| format!(", {bytes} bytes"));
    Condition {
        type_: BACKUP_COMPLETE.to_owned(),
        status: "True".to_owned(),
        reason: "BackupCompleted".to_owned(),
        message: format!(
            "last good backup {} completed at {}{size}",
            good.name_any(),
            completion_text(good)
        ),
        observed_generation: None,
        last_transition_time: now,
    }
}

fn failed_condition(
    failed: &PostgreSQLBackup,
    last_good: Option<&PostgreSQLBackup>,
    now: Time,
) -> Condition {
    let why = failed
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_else(|| "no reason recorded".to_owned());
    let good = last_good.map_or_else(
        || "no backup has completed yet".to_owned(),
        |good| {
            format!(
                "last good backup {} at {}",
                good.name_any(),
                completion_text(good)
            )
        },
    );
    Condition {
        type_: BACKUP_COMPLETE.to_owned(),
        status: "False".to_owned(),
        reason: "BackupFailed".to_owned(),
        message: format!("backup {} failed: {why}; {good}", failed.name_any()),
        observed_generation: None,
        last_transition_time: now,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;
    use pgkube_crds::{LocalReference, PostgreSQLBackupSpec, PostgreSQLBackupStatus};

    use super::*;

    fn time(second: i64) -> Time {
        Time(Timestamp::from_second(1_800_000_000 + second).expect("time"))
    }

    fn backup(name: &str, phase: Option<BackupPhase>, completed: Option<i64>) -> PostgreSQLBackup {
        let mut backup = PostgreSQLBackup::new(
            name,
            PostgreSQLBackupSpec {
                cluster: LocalReference {
                    name: "main".to_owned(),
                },
                method: Default::default(),
                target: None,
                deletion_policy: Default::default(),
                compression: None,
            },
        );
        backup.status = Some(PostgreSQLBackupStatus {
            phase,
            completion_time: completed.map(time),
            size_bytes: Some(100),
            message: Some(format!("{name} message")),
            ..PostgreSQLBackupStatus::default()
        });
        backup
    }

    #[test]
    fn no_ended_backup_means_no_condition() {
        let running = backup("b1", Some(BackupPhase::Running), None);
        assert_eq!(summarize(&[&running], time(0)), BackupSummary::default());
    }

    #[test]
    fn the_newest_completed_backup_is_the_last_successful_one() {
        let old = backup("old", Some(BackupPhase::Completed), Some(10));
        let new = backup("new", Some(BackupPhase::Completed), Some(20));
        let summary = summarize(&[&new, &old], time(30));
        assert_eq!(summary.last_successful.as_deref(), Some("new"));
        let condition = summary.condition.expect("condition");
        assert_eq!(condition.status, "True");
        assert!(
            condition.message.contains("new completed at"),
            "{}",
            condition.message
        );
    }

    #[test]
    fn a_failure_after_the_last_good_backup_turns_the_condition_false_with_its_reason() {
        let good = backup("good", Some(BackupPhase::Completed), Some(10));
        let failed = backup("bad", Some(BackupPhase::Failed), Some(20));
        let summary = summarize(&[&good, &failed], time(30));
        assert_eq!(summary.last_successful.as_deref(), Some("good"));
        let condition = summary.condition.expect("condition");
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("False", "BackupFailed")
        );
        assert!(
            condition
                .message
                .starts_with("backup bad failed: bad message; last good backup good at "),
            "{}",
            condition.message
        );
        // A later success turns it back.
        let fixed = backup("fixed", Some(BackupPhase::Completed), Some(40));
        let summary = summarize(&[&good, &failed, &fixed], time(50));
        assert_eq!(summary.condition.expect("condition").status, "True");
        assert_eq!(summary.last_successful.as_deref(), Some("fixed"));
    }
}
