//! Which stored objects a backup's deletion may delete (pure): only those proven to be its own.
//!
//! - A backup started since the uids are in the keys records its manifest key from the start:
//!   `<prefix>/<cluster-uid>/<name>/<uid>/manifest.json`. A directory named by its own uid is its
//!   own; a manifest found there must record that uid too.
//! - A backup started before records no key until it completed, and its key is the legacy
//!   `<prefix>/<name>/manifest.json`, which another backup of the same name may have written.
//!   Its directory is its own only if the manifest there is the one it recorded: the SHA-256 of
//!   the stored manifest is the status's checksum. Without a manifest, or without a recorded
//!   checksum (it never completed), nothing proves it.
//! - A recorded key in no directory of this backup's (edited by hand) proves nothing.

use kube::ResourceExt;
use pgkube_crds::PostgreSQLBackup;
use sha2::{Digest, Sha256};

use super::decide::resolved_prefix;
use crate::storage::keys::BackupKeys;
use crate::storage::manifest::Manifest;

/// Where a backup's objects are, and how their ownership is proven.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The backup's own directory, named by its uid.
    Own(BackupKeys),
    /// A legacy directory, the backup's only if its manifest is the one it recorded.
    Legacy(BackupKeys),
    /// Nothing to delete, and why.
    Unknown(String),
}

/// Where the objects of `backup` (which started: its status records its storage) are.
pub fn target(backup: &PostgreSQLBackup) -> Target {
    let status = backup.status.clone().unwrap_or_default();
    let storage = status.storage.unwrap_or_default().s3;
    let prefix = resolved_prefix(&storage, backup);
    let name = backup.name_any();
    let uid = backup.metadata.uid.clone().unwrap_or_default();
    let legacy = BackupKeys::legacy(&prefix, &name).ok();
    match status.object_key {
        None => legacy.map_or_else(
            || Target::Unknown(format!("backup name {name:?} is no key segment")),
            Target::Legacy,
        ),
        Some(key) => match BackupKeys::of_manifest(&key) {
            Some(keys) if keys.is_of_backup(&prefix, &name, &uid) => Target::Own(keys),
            Some(keys) if Some(&keys) == legacy.as_ref() => Target::Legacy(keys),
            _ => Target::Unknown(format!(
                "its recorded manifest key {key} is in no directory of this backup's"
            )),
        },
    }
}

/// `Ok` when the objects of `target` are proven to be the backup's, given the manifest stored
/// there (`None`: none); else why not.
pub fn prove(
    backup: &PostgreSQLBackup,
    target: &Target,
    manifest: Option<&[u8]>,
) -> Result<(), String> {
    match target {
        Target::Own(keys) => prove_own(backup, keys, manifest),
        Target::Legacy(keys) => prove_legacy(backup, keys, manifest),
        Target::Unknown(why) => Err(why.clone()),
    }
}

/// The uid in the key proves it; a manifest that records another uid (or none) contradicts it.
/// One that does not parse contradicts nothing.
fn prove_own(
    backup: &PostgreSQLBackup,
    keys: &BackupKeys,
    manifest: Option<&[u8]>,
) -> Result<(), String> {
    let Some(bytes) = manifest else {
        return Ok(());
    };
    let Ok(manifest) = Manifest::parse(&keys.manifest(), bytes) else {
        return Ok(());
    };
    let uid = backup.metadata.uid.as_deref();
    if manifest.backup_uid.as_deref() == uid && manifest.backup_name == backup.name_any() {
        return Ok(());
    }
    Err(format!(
        "the manifest at {} records backup {} (uid {}), not this one",
        keys.manifest(),
        manifest.backup_name,
        manifest.backup_uid.as_deref().unwrap_or("none")
    ))
}

fn prove_legacy(
    backup: &PostgreSQLBackup,
    keys: &BackupKeys,
    manifest: Option<&[u8]>,
) -> Result<(), String> {
    let recorded = backup.status.as_ref().and_then(|s| s.checksum.as_deref());
    let directory = keys.directory();
    match (manifest, recorded) {
        (None, _) => Err(format!(
            "there is no manifest at {}, so nothing proves that the objects under {directory} \
             are this backup's",
            keys.manifest()
        )),
        (Some(_), None) => Err(format!(
            "the backup recorded no checksum of a manifest (it never completed), so nothing \
             proves that the objects under {directory} are its own"
        )),
        (Some(bytes), Some(checksum)) => {
            let stored = format!("sha256:{}", hex::encode(Sha256::digest(bytes)));
            if stored == checksum {
                Ok(())
            } else {
                Err(format!(
                    "the manifest at {} is not the one this backup recorded ({stored}, not \
                     {checksum}): another backup of the same name wrote it",
                    keys.manifest()
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use pgkube_crds::{LocalReference, PostgreSQLBackupSpec, PostgreSQLBackupStatus};

    use super::*;
    use crate::storage::manifest::{DATABASE_FORMAT, MANIFEST_VERSION, StoredObject};

    fn backup(object_key: Option<&str>, checksum: Option<&str>) -> PostgreSQLBackup {
        let mut backup = PostgreSQLBackup::new(
            "nightly",
            PostgreSQLBackupSpec {
                cluster: LocalReference {
                    name: "main".to_owned(),
                },
                method: Default::default(),
                target: None,
                deletion_policy: pgkube_crds::DeletionPolicy::Delete,
                compression: None,
            },
        );
        backup.metadata.namespace = Some("db".to_owned());
        backup.metadata.uid = Some("u1".to_owned());
        backup.status = Some(PostgreSQLBackupStatus {
            storage: Some(pgkube_crds::BackupStorage::default()),
            object_key: object_key.map(str::to_owned),
            checksum: checksum.map(str::to_owned),
            ..PostgreSQLBackupStatus::default()
        });
        backup
    }

    fn manifest(uid: Option<&str>) -> Vec<u8> {
        let manifest = Manifest {
            manifest_version: MANIFEST_VERSION,
            cluster: "main".into(),
            namespace: "db".into(),
            cluster_uid: uid.map(|_| "c1".to_owned()),
            system_identifier: None,
            backup_name: "nightly".into(),
            backup_uid: uid.map(str::to_owned),
            postgresql_version: "16".into(),
            started_at: "2025-01-01T00:00:00Z".into(),
            finished_at: "2025-01-01T00:01:00Z".into(),
            format: DATABASE_FORMAT.into(),
            physical: None,
            globals: Some(StoredObject {
                key: "g".into(),
                size: 1,
                sha256: "00".repeat(32),
                format: DATABASE_FORMAT.into(),
                compression: None,
            }),
            databases: Vec::new(),
        };
        serde_json::to_vec(&manifest).expect("serialises")
    }

    const OWN: &str = "db/main/c1/nightly/u1/manifest.json";
    const LEGACY: &str = "db/main/nightly/manifest.json";

    #[test]
    fn the_directory_named_by_the_backups_uid_is_its_own() {
        let own = backup(Some(OWN), None);
        let Target::Own(keys) = target(&own) else {
            panic!("own: {:?}", target(&own));
        };
        assert_eq!(keys.directory(), "db/main/c1/nightly/u1/");
        assert_eq!(prove(&own, &target(&own), None), Ok(()), "partial data");
        assert_eq!(
            prove(&own, &target(&own), Some(&manifest(Some("u1")))),
            Ok(())
        );
        let other = prove(&own, &target(&own), Some(&manifest(Some("u0"))));
        assert!(other.is_err_and(|why| why.contains("records backup nightly (uid u0)")));
        let none = prove(&own, &target(&own), Some(&manifest(None)));
        assert!(none.is_err_and(|why| why.contains("(uid none)")));
    }

    #[test]
    fn another_backups_directory_is_never_a_target() {
        for key in [
            "db/main/c1/nightly/u0/manifest.json",
            "db/main/c1/weekly/u1/manifest.json",
            "elsewhere/c1/nightly/u1/manifest.json",
            "db/main/weekly/manifest.json",
        ] {
            let edited = backup(Some(key), None);
            assert!(
                matches!(target(&edited), Target::Unknown(ref why) if why.contains(key)),
                "{key}: {:?}",
                target(&edited)
            );
        }
    }

    #[test]
    fn a_legacy_directory_is_the_backups_only_with_the_manifest_it_recorded() {
        let bytes = manifest(None);
        let checksum = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        let completed = backup(Some(LEGACY), Some(&checksum));
        let Target::Legacy(keys) = target(&completed) else {
            panic!("legacy: {:?}", target(&completed));
        };
        assert_eq!(keys.directory(), "db/main/nightly/");
        assert_eq!(prove(&completed, &target(&completed), Some(&bytes)), Ok(()));

        let reused = prove(&completed, &target(&completed), Some(&manifest(Some("u9"))));
        assert!(reused.is_err_and(|why| why.contains("another backup of the same name")));
        let missing = prove(&completed, &target(&completed), None);
        assert!(missing.is_err_and(|why| why.contains("there is no manifest")));

        // Started before the keys were recorded, never completed: nothing proves it.
        let unfinished = backup(None, None);
        assert_eq!(target(&unfinished), Target::Legacy(keys));
        let proof = prove(&unfinished, &target(&unfinished), Some(&bytes));
        assert!(proof.is_err_and(|why| why.contains("recorded no checksum")));
    }
}
