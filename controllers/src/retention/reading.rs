//! What reading a backup's `manifest.json` told a retention pass: when the backup finished and
//! whose it says it is (pure).

use chrono::{DateTime, Utc};

use super::layout::BackupId;
use crate::storage::manifest::Manifest;

/// What reading a backup's `manifest.json` gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManifestReading {
    /// A readable manifest: when the backup finished, and the owner it records.
    Finished(Finished),
    /// The manifest does not parse, or its `finishedAt` is not an RFC 3339 time.
    Unreadable(String),
    /// The manifest was listed but was gone when it was read (deleted meanwhile).
    Vanished,
}

/// A readable manifest's finish time and recorded owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    pub at: DateTime<Utc>,
    /// The cluster uid it records (`None`: a manifest from before uids were recorded).
    pub cluster_uid: Option<String>,
    pub backup_name: String,
    /// The PostgreSQLBackup uid it records (`None`: from before uids were recorded).
    pub backup_uid: Option<String>,
    /// Where the WAL a physical backup needs starts; `None` for a logical backup.
    pub wal_base: Option<WalBase>,
}

/// Where a physical backup's WAL starts: retention keeps the archive from there on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalBase {
    /// The WAL archive's root the backup's WAL is in.
    pub wal_root: String,
    /// The first WAL segment the backup needs.
    pub first_wal: String,
    /// The system identifier of the database the backup is of.
    pub system_identifier: Option<String>,
}

impl Finished {
    /// Why this manifest is not the one of backup `id` of the cluster with uid `cluster_uid`, if
    /// it is not: a manifest that records another owner (or none) is never acted on.
    pub fn foreign(&self, id: &BackupId, cluster_uid: &str) -> Option<String> {
        let recorded = |value: &Option<String>| value.as_deref().unwrap_or("none").to_owned();
        if self.cluster_uid.as_deref() != Some(cluster_uid) {
            return Some(format!(
                "its manifest records cluster uid {}, not {cluster_uid}",
                recorded(&self.cluster_uid)
            ));
        }
        if self.backup_name != id.name || self.backup_uid.as_deref() != Some(id.uid.as_str()) {
            return Some(format!(
                "its manifest records backup {}/{}",
                self.backup_name,
                recorded(&self.backup_uid)
            ));
        }
        None
    }
}

impl ManifestReading {
    /// Reads the manifest stored at `key`.
    pub fn from_bytes(key: &str, bytes: &[u8]) -> Self {
        let manifest = match Manifest::parse(key, bytes) {
            Ok(manifest) => manifest,
            Err(error) => return Self::Unreadable(error.to_string()),
        };
        match DateTime::parse_from_rfc3339(&manifest.finished_at) {
            Ok(time) => Self::Finished(Finished {
                at: time.with_timezone(&Utc),
                wal_base: manifest.physical.map(|physical| WalBase {
                    wal_root: physical.wal_root,
                    first_wal: physical.first_wal,
                    system_identifier: manifest.system_identifier,
                }),
                cluster_uid: manifest.cluster_uid,
                backup_name: manifest.backup_name,
                backup_uid: manifest.backup_uid,
            }),
            Err(error) => {
                Self::Unreadable(format!("finishedAt {:?}: {error}", manifest.finished_at))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::storage::manifest::{
        DATABASE_FORMAT, DatabaseObject, MANIFEST_VERSION, StoredObject,
    };

    fn manifest() -> Manifest {
        Manifest {
            manifest_version: MANIFEST_VERSION,
            cluster: "a".into(),
            namespace: "ns".into(),
            cluster_uid: Some("c1".into()),
            system_identifier: None,
            backup_name: "b1".into(),
            backup_uid: Some("u1".into()),
            postgresql_version: "16.4".into(),
            started_at: "2025-06-01T00:00:00Z".into(),
            finished_at: "2025-06-01T00:05:00+02:00".into(),
            format: DATABASE_FORMAT.into(),
            physical: None,
            globals: Some(StoredObject {
                key: "ns/a/c1/b1/u1/globals.sql".into(),
                size: 1,
                sha256: "00".repeat(32),
                format: DATABASE_FORMAT.into(),
                compression: None,
            }),
            databases: Vec::<DatabaseObject>::new(),
        }
    }

    #[test]
    fn a_manifest_is_read_for_its_finish_time_and_owner() {
        let mut manifest = manifest();
        let json = serde_json::to_vec(&manifest).expect("serialises");
        let expected = Utc.with_ymd_and_hms(2025, 5, 31, 22, 5, 0).single();
        let ManifestReading::Finished(finished) = ManifestReading::from_bytes("k", &json) else {
            panic!("readable");
        };
        assert_eq!(finished.at, expected.expect("a time"));
        assert_eq!(finished.foreign(&BackupId::new("b1", "u1"), "c1"), None);

        manifest.finished_at = "yesterday".into();
        let json = serde_json::to_vec(&manifest).expect("serialises");
        let reading = ManifestReading::from_bytes("k", &json);
        assert!(
            matches!(&reading, ManifestReading::Unreadable(reason) if reason.contains("yesterday")),
            "{reading:?}"
        );
        let reading = ManifestReading::from_bytes("ns/a/b1/manifest.json", b"{\"manifestVer");
        assert!(
            matches!(&reading, ManifestReading::Unreadable(reason) if reason.contains("ns/a/b1/manifest.json")),
            "{reading:?}"
        );
    }

    #[test]
    fn a_manifest_of_another_cluster_or_backup_or_without_uids_is_foreign() {
        let finished = |cluster_uid: Option<&str>, name: &str, uid: Option<&str>| Finished {
            at: Utc::now(),
            cluster_uid: cluster_uid.map(str::to_owned),
            backup_name: name.to_owned(),
            backup_uid: uid.map(str::to_owned),
            wal_base: None,
        };
        let id = BackupId::new("b1", "u1");
        assert_eq!(
            finished(Some("c1"), "b1", Some("u1")).foreign(&id, "c1"),
            None
        );
        let other_cluster = finished(Some("c2"), "b1", Some("u1")).foreign(&id, "c1");
        assert_eq!(
            other_cluster.as_deref(),
            Some("its manifest records cluster uid c2, not c1")
        );
        let legacy = finished(None, "b1", None).foreign(&id, "c1");
        assert_eq!(
            legacy.as_deref(),
            Some("its manifest records cluster uid none, not c1")
        );
        let other_backup = finished(Some("c1"), "b1", Some("u2")).foreign(&id, "c1");
        assert_eq!(
            other_backup.as_deref(),
            Some("its manifest records backup b1/u2")
        );
        assert!(
            finished(Some("c1"), "b2", Some("u1"))
                .foreign(&id, "c1")
                .is_some()
        );
    }
}
