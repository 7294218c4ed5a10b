//! Which backups unfinished restores read (pure). Retention and `deletionPolicy: Delete` leave
//! those backups in storage until every restore that reads them has ended (Completed or
//! Failed): a restore verifies every object before it drops a database, but objects deleted
//! while it streams them would leave that database half restored.
//!
//! A restore that has not ended holds:
//! - the PostgreSQLBackup it names (`spec.backup`, in its namespace), by name, and that
//!   backup's manifest in its bucket;
//! - the manifest its `spec.source` names, in the source's bucket;
//! - the manifest its status says it restores (`status.restoredObjectKey`), in the bucket of
//!   its backup or source, or in any bucket when neither is known any more.
//!
//! Buckets are compared by name only: a restore from another store's bucket of the same name
//! holds a backup it does not read, which costs a later deletion, never a backup.

use std::collections::BTreeMap;

use kube::ResourceExt;
use pgkube_crds::{PostgreSQLBackup, PostgreSQLRestore, RestorePhase};

use super::decide::manifest_key;

/// What one unfinished restore holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    /// The restore, as `namespace/name`.
    pub restore: String,
    namespace: String,
    /// The PostgreSQLBackup it names, in `namespace`.
    backup: Option<String>,
    /// The manifests it reads: the bucket (`None`: unknown, any) and the key.
    manifests: Vec<(Option<String>, String)>,
}

/// Whether a restore has not ended: any phase but Completed and Failed, Pending and none
/// included (a restore being deleted too, as its Job may still run).
pub fn unfinished(restore: &PostgreSQLRestore) -> bool {
    !matches!(
        restore.status.as_ref().and_then(|status| status.phase),
        Some(RestorePhase::Completed | RestorePhase::Failed)
    )
}

/// The holds of the restores that have not ended; `backups` are the PostgreSQLBackups they may
/// name (of any namespace).
pub fn holds(restores: &[&PostgreSQLRestore], backups: &[&PostgreSQLBackup]) -> Vec<Hold> {
    restores
        .iter()
        .filter(|restore| unfinished(restore))
        .map(|restore| hold(restore, backups))
        .collect()
}

fn hold(restore: &PostgreSQLRestore, backups: &[&PostgreSQLBackup]) -> Hold {
    let namespace = restore.namespace().unwrap_or_default();
    let backup_name = restore.spec.backup.as_ref().map(|b| b.name.clone());
    let named = backup_name.as_deref().and_then(|name| {
        backups
            .iter()
            .find(|b| b.name_any() == name && b.namespace().as_deref() == Some(&namespace))
    });
    let mut bucket = None;
    let mut manifests = Vec::new();
    if let Some(backup) = named {
        bucket = backup
            .status
            .as_ref()
            .and_then(|s| s.storage.as_ref())
            .map(|s| s.s3.bucket.clone());
        if let Some(key) = manifest_key(backup) {
            manifests.push((bucket.clone(), key));
        }
    }
    if let Some(source) = &restore.spec.source {
        bucket = Some(source.storage.s3.bucket.clone());
        manifests.push((bucket.clone(), source.object_key.clone()));
    }
    if let Some(key) = restore
        .status
        .as_ref()
        .and_then(|s| s.restored_object_key.clone())
    {
        manifests.push((bucket, key));
    }
    Hold {
        restore: format!("{namespace}/{}", restore.name_any()),
        namespace,
        backup: backup_name,
        manifests,
    }
}

/// The manifest keys in `bucket` that `holds` read, each with the first restore that reads it:
/// a retention pass keeps those backups.
pub fn held_manifests(holds: &[Hold], bucket: &str) -> BTreeMap<String, String> {
    let mut held = BTreeMap::new();
    for hold in holds {
        for (held_bucket, key) in &hold.manifests {
            if held_bucket.as_deref().is_none_or(|b| b == bucket) {
                held.entry(key.clone())
                    .or_insert_with(|| hold.restore.clone());
            }
        }
    }
    held
}

/// The first hold on `backup`: a restore that names it, or that reads its manifest. Its data
/// is not deleted while there is one.
pub fn holder<'a>(holds: &'a [Hold], backup: &PostgreSQLBackup) -> Option<&'a Hold> {
    let namespace = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    let bucket = backup
        .status
        .as_ref()
        .and_then(|s| s.storage.as_ref())
        .map(|s| s.s3.bucket.as_str());
    let key = manifest_key(backup);
    holds.iter().find(|hold| {
        let named = hold.namespace == namespace && hold.backup.as_deref() == Some(name.as_str());
        let reads = hold.manifests.iter().any(|(held_bucket, held_key)| {
            Some(held_key) == key.as_ref()
                && (held_bucket.is_none() || held_bucket.as_deref() == bucket)
        });
        named || reads
    })
}

#[cfg(test)]
mod tests {
    use pgkube_crds::{
        LocalReference, PostgreSQLBackupSpec, PostgreSQLBackupStatus, PostgreSQLRestoreSpec,
        PostgreSQLRestoreStatus, RestoreSource, S3Storage,
    };

    use super::*;

    fn storage(bucket: &str) -> S3Storage {
        S3Storage {
            bucket: bucket.to_owned(),
            prefix: Some("db/main".to_owned()),
            ..S3Storage::default()
        }
    }

    fn backup(namespace: &str, name: &str, key: Option<&str>) -> PostgreSQLBackup {
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
        backup.metadata.namespace = Some(namespace.to_owned());
        backup.status = Some(PostgreSQLBackupStatus {
            storage: Some(pgkube_crds::BackupStorage {
                s3: storage("backups"),
            }),
            object_key: key.map(str::to_owned),
            ..PostgreSQLBackupStatus::default()
        });
        backup
    }

    fn restore(name: &str, phase: Option<RestorePhase>) -> PostgreSQLRestore {
        let mut restore = PostgreSQLRestore::new(
            name,
            PostgreSQLRestoreSpec {
                backup: Some(LocalReference {
                    name: "nightly".to_owned(),
                }),
                source: None,
                cluster: LocalReference {
                    name: "main".to_owned(),
                },
                databases: Vec::new(),
                drop_existing: false,
                expected_system_identifier: None,
                method: pgkube_crds::RestoreMethod::Logical,
                target: None,
            },
        );
        restore.metadata.namespace = Some("db".to_owned());
        restore.status = phase.map(|phase| PostgreSQLRestoreStatus {
            phase: Some(phase),
            ..PostgreSQLRestoreStatus::default()
        });
        restore
    }

    const KEY: &str = "db/main/c1/nightly/u1/manifest.json";

    #[test]
    fn only_restores_that_have_not_ended_hold_anything() {
        let nightly = backup("db", "nightly", Some(KEY));
        for (phase, holds_it) in [
            (None, true),
            (Some(RestorePhase::Pending), true),
            (Some(RestorePhase::Running), true),
            (Some(RestorePhase::Completed), false),
            (Some(RestorePhase::Failed), false),
        ] {
            let undo = restore("undo", phase);
            let holds = holds(&[&undo], &[&nightly]);
            assert_eq!(holder(&holds, &nightly).is_some(), holds_it, "{phase:?}");
            let held = held_manifests(&holds, "backups");
            assert_eq!(held.contains_key(KEY), holds_it, "{phase:?}");
        }
    }

    #[test]
    fn a_restore_holds_the_backup_it_names_and_its_manifest() {
        let nightly = backup("db", "nightly", Some(KEY));
        let elsewhere = backup(
            "other",
            "nightly",
            Some("other/x/c9/nightly/u9/manifest.json"),
        );
        let other_name = backup("db", "weekly", Some("db/main/c1/weekly/u2/manifest.json"));
        let undo = restore("undo", Some(RestorePhase::Running));
        let holds = holds(&[&undo], &[&elsewhere, &nightly, &other_name]);
        assert_eq!(
            holder(&holds, &nightly).map(|h| h.restore.as_str()),
            Some("db/undo")
        );
        assert!(holder(&holds, &elsewhere).is_none(), "another namespace's");
        assert!(holder(&holds, &other_name).is_none());
        assert_eq!(
            held_manifests(&holds, "backups"),
            BTreeMap::from([(KEY.to_owned(), "db/undo".to_owned())])
        );
        assert!(held_manifests(&holds, "another-bucket").is_empty());
    }

    #[test]
    fn a_legacy_backup_is_held_by_its_legacy_manifest_key() {
        let legacy = backup("db", "nightly", None);
        let undo = restore("undo", None);
        let holds = holds(&[&undo], &[&legacy]);
        assert_eq!(
            held_manifests(&holds, "backups"),
            BTreeMap::from([(
                "db/main/nightly/manifest.json".to_owned(),
                "db/undo".to_owned()
            )])
        );
    }

    #[test]
    fn a_restore_from_a_source_holds_that_manifest_in_that_bucket_from_any_namespace() {
        let nightly = backup("db", "nightly", Some(KEY));
        let mut from_source = restore("copy", Some(RestorePhase::Running));
        from_source.metadata.namespace = Some("staging".to_owned());
        from_source.spec.backup = None;
        from_source.spec.source = Some(RestoreSource {
            storage: pgkube_crds::BackupStorage {
                s3: storage("backups"),
            },
            object_key: KEY.to_owned(),
        });
        let holds = holds(&[&from_source], &[&nightly]);
        assert_eq!(
            holder(&holds, &nightly).map(|h| h.restore.as_str()),
            Some("staging/copy")
        );
        assert_eq!(held_manifests(&holds, "backups").len(), 1);
        assert!(held_manifests(&holds, "other").is_empty());
    }

    #[test]
    fn a_running_restore_whose_backup_is_gone_holds_its_manifest_in_any_bucket() {
        let mut orphan = restore("undo", Some(RestorePhase::Running));
        if let Some(status) = orphan.status.as_mut() {
            status.restored_object_key = Some(KEY.to_owned());
        }
        let holds = holds(&[&orphan], &[]);
        assert_eq!(held_manifests(&holds, "any").len(), 1);
        assert!(holder(&holds, &backup("db", "weekly", Some(KEY))).is_some());
    }
}
