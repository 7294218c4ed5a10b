//! `status.recoverability` (pure): the window a point-in-time recovery of the cluster can
//! reach, from the end of its oldest Completed physical backup to its last archived WAL file.
//! Retention keeps the WAL from the oldest kept physical backup on, so every moment between
//! the two is in the archive.

use kube::ResourceExt;
use pgkube_crds::{
    BackupMethod, BackupPhase, PostgreSQLBackup, Recoverability, WalArchivingStatus,
};

/// The window, when the cluster archives to `archive` (its root); none without archiving.
pub fn recoverability(
    archive: Option<&str>,
    backups: &[&PostgreSQLBackup],
    archiving: Option<&WalArchivingStatus>,
) -> Option<Recoverability> {
    let archive = archive?;
    let archiving = archiving?;
    let oldest = backups
        .iter()
        .filter(|backup| backup.spec.method == BackupMethod::Physical)
        .filter_map(|backup| {
            let status = backup.status.as_ref()?;
            (status.phase == Some(BackupPhase::Completed)).then_some(())?;
            Some((status.completion_time.clone()?, backup.name_any()))
        })
        .min_by_key(|(completed, _)| completed.0);
    let (first_point, first_backup) = oldest.unzip();
    Some(Recoverability {
        archive: archive.to_owned(),
        first_point,
        first_backup,
        last_point: archiving.last_archived_time.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use pgkube_crds::{
        DeletionPolicy, LocalReference, PostgreSQLBackupSpec, PostgreSQLBackupStatus,
    };

    fn backup(
        name: &str,
        method: BackupMethod,
        phase: BackupPhase,
        completed: &str,
    ) -> PostgreSQLBackup {
        let mut backup = PostgreSQLBackup::new(
            name,
            PostgreSQLBackupSpec {
                cluster: LocalReference {
                    name: "db".to_owned(),
                },
                method,
                target: None,
                deletion_policy: DeletionPolicy::Retain,
                compression: None,
            },
        );
        backup.status = Some(PostgreSQLBackupStatus {
            phase: Some(phase),
            completion_time: Some(Time(completed.parse().expect("a time"))),
            ..PostgreSQLBackupStatus::default()
        });
        backup
    }

    #[test]
    fn the_window_runs_from_the_oldest_completed_physical_backup_to_the_last_archived_file() {
        let backups = [
            backup(
                "logical",
                BackupMethod::Logical,
                BackupPhase::Completed,
                "2026-12-01T00:00:00Z",
            ),
            backup(
                "failed",
                BackupMethod::Physical,
                BackupPhase::Failed,
                "2026-12-02T00:00:00Z",
            ),
            backup(
                "old",
                BackupMethod::Physical,
                BackupPhase::Completed,
                "2026-12-03T00:00:00Z",
            ),
            backup(
                "new",
                BackupMethod::Physical,
                BackupPhase::Completed,
                "2026-12-04T00:00:00Z",
            ),
        ];
        let backups: Vec<&PostgreSQLBackup> = backups.iter().collect();
        let archiving = WalArchivingStatus {
            last_archived_time: Some(Time("2026-12-05T10:00:00Z".parse().expect("a time"))),
            ..WalArchivingStatus::default()
        };
        let window =
            recoverability(Some("ns/db/wal/db/"), &backups, Some(&archiving)).expect("a window");
        assert_eq!(window.archive, "ns/db/wal/db/");
        assert_eq!(window.first_backup.as_deref(), Some("old"));
        assert_eq!(
            window.first_point.map(|t| t.0.to_string()).as_deref(),
            Some("2026-12-03T00:00:00Z")
        );
        assert_eq!(window.last_point, archiving.last_archived_time);
        // No physical backup yet: the archive is shown, with no first point.
        let none = recoverability(Some("ns/db/wal/db/"), &backups[..1], Some(&archiving))
            .expect("a window");
        assert_eq!((none.first_point, none.first_backup), (None, None));
        assert_eq!(recoverability(Some("ns/db/wal/db/"), &backups, None), None);
        assert_eq!(recoverability(None, &backups, Some(&archiving)), None);
    }
}
