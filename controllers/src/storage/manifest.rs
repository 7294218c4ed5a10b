//! The backup manifest: `manifest.json` in the backup's directory (see [`super::keys`]), written
//! last by the agent, and only where no object is (a reused key never replaces a manifest); read
//! by restores, by the backup controller's verification and by retention.
//!
//! It records whose backup it is: the cluster's name, namespace and uid, and the
//! PostgreSQLBackup's name and uid. Manifests written before the uids were recorded have the
//! names only (`clusterUid` and `backupUid` absent); readers that ignore unknown fields read the
//! new ones, so the version does not change for them.
//!
//! Its presence means every object it lists was uploaded completely and its stored size was
//! checked. Restore trusts only what it lists: keys, sizes and SHA-256 checksums, all of the
//! stored bytes.
//!
//! Versions:
//! - 1 ([`MANIFEST_VERSION`]): every object is stored as its tool wrote it (pg_dump's own
//!   compression at most). Each object may say `"compression": "none"`; older readers ignore the
//!   field, which they can, since nothing needs decoding.
//! - 2 ([`MANIFEST_VERSION_ZSTD`]): at least one object is a zstd frame the agent wrote
//!   (`"compression": "zstd"`). Agents from before zstd refuse any version but 1 when they read
//!   the manifest, before they touch a database; a zstd backup under version 1 would pass their
//!   checks (they ignore the field) and fail in pg_restore after `--drop-existing` dropped the
//!   database.
//!
//! - 3 ([`MANIFEST_VERSION_PHYSICAL`]): a physical base backup ([`PhysicalBackup`]): no globals
//!   and no databases, but the base backup's tar (zstd), its `backup_label`, `tablespace_map`
//!   and PostgreSQL's `backup_manifest`, the WAL range it needs and where that WAL is archived.
//!   Agents and controllers from before it refuse the version, so none of them takes it for a
//!   logical backup.
//!
//! Readers take all three; an object without `compression` is stored as written (`none`), and a
//! compression this build cannot decode is refused, naming the object.

use serde::{Deserialize, Serialize};

use super::error::StorageError;

/// Manifests whose objects are all stored as their tools wrote them.
pub const MANIFEST_VERSION: u32 = 1;
/// Manifests with at least one object compressed with zstd by the agent.
pub const MANIFEST_VERSION_ZSTD: u32 = 2;
/// Manifests of physical base backups.
pub const MANIFEST_VERSION_PHYSICAL: u32 = 3;
/// Format of the database objects.
pub const DATABASE_FORMAT: &str = "pg_dump-custom";
/// Format of the globals object.
pub const GLOBALS_FORMAT: &str = "pg_dumpall-globals-sql";
/// Format of a physical backup's manifest (its `format`) and of its base object: the tar
/// `pg_basebackup -Ft -D -` writes (no tablespaces beside the data directory).
pub const BASE_BACKUP_FORMAT: &str = "pg_basebackup-tar";
/// Format of the `backup_label` and `tablespace_map` files of a physical backup, as stored.
pub const BACKUP_LABEL_FORMAT: &str = "backup_label";
pub const TABLESPACE_MAP_FORMAT: &str = "tablespace_map";
/// Format of PostgreSQL's own `backup_manifest` (JSON, with each file's checksum).
pub const BACKUP_MANIFEST_FORMAT: &str = "pg_backup_manifest";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub manifest_version: u32,
    pub cluster: String,
    pub namespace: String,
    /// The uid of the PostgreSQLCluster; absent in manifests written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_uid: Option<String>,
    /// The PostgreSQL system identifier of the backed-up database (`pg_control_system()`);
    /// absent in manifests written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_identifier: Option<String>,
    pub backup_name: String,
    /// The uid of the PostgreSQLBackup; absent in manifests written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_uid: Option<String>,
    /// `SHOW server_version` of the backed-up server, for example "15.18 (Debian ...)".
    pub postgresql_version: String,
    /// RFC 3339, UTC.
    pub started_at: String,
    pub finished_at: String,
    pub format: String,
    /// Logical backups: `pg_dumpall --globals-only`. Physical backups have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub globals: Option<StoredObject>,
    /// Logical backups: one dump per database. Physical backups have none.
    #[serde(default)]
    pub databases: Vec<DatabaseObject>,
    /// Physical backups: the base backup and the WAL it needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical: Option<PhysicalBackup>,
}

/// A physical base backup: its objects, and the WAL from `startLsn` to `stopLsn` that a
/// restore replays from the archive to make it consistent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PhysicalBackup {
    /// Where the backup's redo starts, as PostgreSQL writes LSNs (`0/2000028`).
    pub start_lsn: String,
    /// The timeline of the start.
    pub start_timeline: u32,
    /// The point a restore must replay to before the backup is consistent.
    pub stop_lsn: String,
    pub stop_timeline: u32,
    /// The instance the backup was read from (a pod name), and whether it was a standby.
    pub source: String,
    pub from_standby: bool,
    /// The WAL archive's root (`<prefix>/wal/<cluster>/`) and the first and last WAL segments
    /// the backup needs, all found there before the manifest was written.
    pub wal_root: String,
    pub first_wal: String,
    pub last_wal: String,
    /// `base.tar.zst`: the data directory as a tar, compressed with zstd.
    pub base: StoredObject,
    /// The `backup_label` file of the base backup (also inside the tar).
    pub backup_label: StoredObject,
    /// The `tablespace_map` file, when the base backup has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tablespace_map: Option<StoredObject>,
    /// PostgreSQL's `backup_manifest` (also inside the tar): every file with its SHA-256, for
    /// `pg_verifybackup`.
    pub backup_manifest: StoredObject,
}

impl PhysicalBackup {
    /// Every object of the base backup: the tar, then the files beside it.
    pub fn objects(&self) -> impl Iterator<Item = &StoredObject> {
        [Some(&self.base), Some(&self.backup_label)]
            .into_iter()
            .chain([self.tablespace_map.as_ref(), Some(&self.backup_manifest)])
            .flatten()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", try_from = "ListedObject")]
pub struct StoredObject {
    pub key: String,
    pub size: u64,
    pub sha256: String,
    pub format: String,
    /// How the stored bytes are compressed around `format`; absent (every backup written before
    /// the agent compressed) means [`StoredCompression::None`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<StoredCompression>,
}

/// How an object's bytes are stored around its format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoredCompression {
    /// As the tool wrote them.
    #[default]
    None,
    /// One or more zstd frames written by the agent.
    Zstd,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseObject {
    pub name: String,
    #[serde(flatten)]
    pub object: StoredObject,
}

/// A [`StoredObject`] as listed, its compression still a word: an unknown one is refused with
/// the object's key.
#[derive(Deserialize)]
struct ListedObject {
    key: String,
    size: u64,
    sha256: String,
    format: String,
    #[serde(default)]
    compression: Option<String>,
}

impl TryFrom<ListedObject> for StoredObject {
    type Error = String;

    fn try_from(listed: ListedObject) -> Result<Self, String> {
        let compression = match listed.compression.as_deref() {
            None => None,
            Some("none") => Some(StoredCompression::None),
            Some("zstd") => Some(StoredCompression::Zstd),
            Some(other) => {
                return Err(format!(
                    "object {} is compressed with {other:?}, which this pgkube cannot decode \
                     (it knows \"zstd\" and \"none\")",
                    listed.key
                ));
            }
        };
        Ok(Self {
            key: listed.key,
            size: listed.size,
            sha256: listed.sha256,
            format: listed.format,
            compression,
        })
    }
}

impl StoredObject {
    /// How the stored bytes are compressed (absent: none).
    pub fn compression(&self) -> StoredCompression {
        self.compression.unwrap_or_default()
    }
}

impl Manifest {
    pub fn total_size(&self) -> u64 {
        self.objects().map(|object| object.size).sum()
    }

    /// Every object: the globals, then the databases in order, then a physical backup's.
    pub fn objects(&self) -> impl Iterator<Item = &StoredObject> {
        self.globals
            .iter()
            .chain(self.databases.iter().map(|db| &db.object))
            .chain(self.physical.iter().flat_map(PhysicalBackup::objects))
    }

    /// The version these objects need: [`MANIFEST_VERSION_PHYSICAL`] for a physical backup;
    /// [`MANIFEST_VERSION_ZSTD`] if any is zstd, so that agents that cannot decode it refuse the
    /// backup before changing anything; else [`MANIFEST_VERSION`], which every agent restores.
    pub fn required_version(&self) -> u32 {
        if self.physical.is_some() {
            MANIFEST_VERSION_PHYSICAL
        } else if self
            .objects()
            .any(|object| object.compression() == StoredCompression::Zstd)
        {
            MANIFEST_VERSION_ZSTD
        } else {
            MANIFEST_VERSION
        }
    }

    pub fn parse(key: &str, bytes: &[u8]) -> Result<Self, StorageError> {
        let manifest: Self =
            serde_json::from_slice(bytes).map_err(|error| StorageError::Manifest {
                key: key.to_string(),
                reason: error.to_string(),
            })?;
        let supported = match manifest.manifest_version {
            MANIFEST_VERSION | MANIFEST_VERSION_ZSTD => {
                manifest.globals.is_some() && manifest.physical.is_none()
            }
            MANIFEST_VERSION_PHYSICAL => manifest.physical.is_some(),
            version => {
                return Err(StorageError::Manifest {
                    key: key.to_string(),
                    reason: format!(
                        "manifest version {version} is not supported (this pgkube reads \
                         {MANIFEST_VERSION} to {MANIFEST_VERSION_PHYSICAL})"
                    ),
                });
            }
        };
        if !supported {
            return Err(StorageError::Manifest {
                key: key.to_string(),
                reason: format!(
                    "a version {} manifest must list {}",
                    manifest.manifest_version,
                    if manifest.manifest_version == MANIFEST_VERSION_PHYSICAL {
                        "a physical backup"
                    } else {
                        "the globals and no physical backup"
                    }
                ),
            });
        }
        Ok(manifest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(key: &str, size: u64, compression: Option<StoredCompression>) -> StoredObject {
        StoredObject {
            key: key.into(),
            size,
            sha256: "ab".repeat(32),
            format: DATABASE_FORMAT.into(),
            compression,
        }
    }

    fn sample(compression: Option<StoredCompression>) -> Manifest {
        Manifest {
            manifest_version: MANIFEST_VERSION,
            cluster: "main".into(),
            namespace: "db".into(),
            cluster_uid: Some("c-uid".into()),
            system_identifier: None,
            backup_name: "b1".into(),
            backup_uid: Some("b-uid".into()),
            postgresql_version: "15.18".into(),
            started_at: "2025-01-01T00:00:00Z".into(),
            finished_at: "2025-01-01T00:01:00Z".into(),
            format: DATABASE_FORMAT.into(),
            globals: Some(object("p/b1/globals.sql", 10, None)),
            databases: vec![DatabaseObject {
                name: "app".into(),
                object: object("p/b1/databases/app.dump", 32, compression),
            }],
            physical: None,
        }
    }

    fn zstd_sample() -> Manifest {
        let mut manifest = sample(Some(StoredCompression::Zstd));
        manifest.manifest_version = manifest.required_version();
        manifest
    }

    #[test]
    fn a_manifest_survives_a_round_trip_through_json() {
        let manifest = sample(None);
        let json = serde_json::to_vec(&manifest).expect("serialises");
        assert_eq!(Manifest::parse("k", &json).expect("parses"), manifest);
        assert_eq!(manifest.total_size(), 42);
        let zstd = zstd_sample();
        let json = serde_json::to_vec(&zstd).expect("serialises");
        assert_eq!(Manifest::parse("k", &json).expect("parses"), zstd);
    }

    #[test]
    fn each_object_carries_its_compression_as_written() {
        let json = serde_json::to_value(zstd_sample()).expect("serialises");
        assert_eq!(json["manifestVersion"], 2);
        assert_eq!(json["databases"][0]["compression"], "zstd");
        assert_eq!(json["databases"][0]["name"], "app");
        // Not set: not written, as before the field existed.
        assert!(json["globals"].get("compression").is_none(), "{json}");
    }

    #[test]
    fn zstd_objects_need_version_2_and_the_rest_version_1() {
        assert_eq!(sample(None).required_version(), MANIFEST_VERSION);
        let plain = sample(Some(StoredCompression::None));
        assert_eq!(plain.required_version(), MANIFEST_VERSION);
        assert_eq!(zstd_sample().manifest_version, MANIFEST_VERSION_ZSTD);
    }

    #[test]
    fn the_uids_are_recorded_and_a_manifest_without_them_still_reads() {
        let json = serde_json::to_value(sample(None)).expect("serialises");
        assert_eq!(json["clusterUid"], "c-uid");
        assert_eq!(json["backupUid"], "b-uid");
        let mut old = sample(None);
        old.cluster_uid = None;
        old.backup_uid = None;
        let bytes = serde_json::to_vec(&old).expect("serialises");
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains("Uid"), "{text}");
        assert_eq!(Manifest::parse("k", &bytes).expect("parses"), old);
    }

    #[test]
    fn a_manifest_from_before_compression_means_none() {
        let json = serde_json::to_vec_pretty(&sample(None)).expect("serialises");
        assert!(!String::from_utf8_lossy(&json).contains("compression"));
        let parsed = Manifest::parse("k", &json).expect("parses");
        assert!(
            parsed
                .objects()
                .all(|object| object.compression() == StoredCompression::None)
        );
    }

    #[test]
    fn versions_1_and_2_are_read_and_others_refused() {
        for version in [MANIFEST_VERSION, MANIFEST_VERSION_ZSTD] {
            let mut manifest = zstd_sample();
            manifest.manifest_version = version;
            let json = serde_json::to_vec(&manifest).expect("serialises");
            assert!(Manifest::parse("k", &json).is_ok(), "version {version}");
        }
        for version in [0, 4, 99] {
            let mut manifest = sample(None);
            manifest.manifest_version = version;
            let json = serde_json::to_vec(&manifest).expect("serialises");
            let error = Manifest::parse("p/b1/manifest.json", &json).expect_err("refused");
            assert!(
                error.to_string().contains(&format!("version {version}")),
                "{error}"
            );
        }
    }

    #[test]
    fn an_unknown_compression_is_refused_naming_the_object() {
        let text = serde_json::to_string_pretty(&zstd_sample()).expect("serialises");
        let unknown = text.replacen("\"zstd\"", "\"lz4\"", 1);
        let error = Manifest::parse("p/b1/manifest.json", unknown.as_bytes()).expect_err("lz4");
        let message = error.to_string();
        assert!(message.contains("p/b1/databases/app.dump"), "{message}");
        assert!(message.contains("lz4"), "{message}");
        // On the globals too, which are not flattened into another object.
        let mut json = serde_json::to_value(sample(None)).expect("serialises");
        json["globals"]["compression"] = "brotli".into();
        let bytes = serde_json::to_vec(&json).expect("serialises");
        let error = Manifest::parse("m", &bytes).expect_err("brotli");
        assert!(error.to_string().contains("p/b1/globals.sql"), "{error}");
    }

    fn physical_sample() -> Manifest {
        let stored = |key: &str, size, format: &str, compression| StoredObject {
            key: key.into(),
            size,
            sha256: "cd".repeat(32),
            format: format.into(),
            compression,
        };
        let mut manifest = sample(None);
        manifest.format = BASE_BACKUP_FORMAT.into();
        manifest.globals = None;
        manifest.databases = Vec::new();
        manifest.physical = Some(PhysicalBackup {
            start_lsn: "0/2000028".into(),
            start_timeline: 1,
            stop_lsn: "0/2000100".into(),
            stop_timeline: 1,
            source: "main-postgresql-1".into(),
            from_standby: true,
            wal_root: "db/main/wal/main/".into(),
            first_wal: "000000010000000000000002".into(),
            last_wal: "000000010000000000000002".into(),
            base: stored(
                "p/b1/base.tar.zst",
                1000,
                BASE_BACKUP_FORMAT,
                Some(StoredCompression::Zstd),
            ),
            backup_label: stored("p/b1/backup_label", 200, BACKUP_LABEL_FORMAT, None),
            tablespace_map: None,
            backup_manifest: stored("p/b1/backup_manifest", 30, BACKUP_MANIFEST_FORMAT, None),
        });
        manifest.manifest_version = manifest.required_version();
        manifest
    }

    #[test]
    fn a_physical_backup_is_version_3_with_its_objects_and_no_globals() {
        let manifest = physical_sample();
        assert_eq!(manifest.manifest_version, MANIFEST_VERSION_PHYSICAL);
        assert_eq!(manifest.total_size(), 1230);
        let keys: Vec<&str> = manifest.objects().map(|o| o.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "p/b1/base.tar.zst",
                "p/b1/backup_label",
                "p/b1/backup_manifest"
            ]
        );
        let json = serde_json::to_value(&manifest).expect("serialises");
        assert!(json.get("globals").is_none(), "{json}");
        assert_eq!(json["physical"]["stopLsn"], "0/2000100");
        assert_eq!(json["physical"]["base"]["compression"], "zstd");
        let bytes = serde_json::to_vec(&manifest).expect("serialises");
        assert_eq!(Manifest::parse("k", &bytes).expect("parses"), manifest);
    }

    #[test]
    fn a_version_that_does_not_match_what_the_manifest_lists_is_refused() {
        let mut logical_as_physical = sample(None);
        logical_as_physical.manifest_version = MANIFEST_VERSION_PHYSICAL;
        let mut physical_as_logical = physical_sample();
        physical_as_logical.manifest_version = MANIFEST_VERSION_ZSTD;
        for manifest in [logical_as_physical, physical_as_logical] {
            let bytes = serde_json::to_vec(&manifest).expect("serialises");
            let error = Manifest::parse("p/b1/manifest.json", &bytes).expect_err("refused");
            assert!(error.to_string().contains("p/b1/manifest.json"), "{error}");
        }
    }

    #[test]
    fn a_truncated_manifest_is_refused_with_its_key() {
        let json = serde_json::to_vec(&sample(None)).expect("serialises");
        let error =
            Manifest::parse("p/b1/manifest.json", &json[..json.len() / 2]).expect_err("refused");
        assert!(error.to_string().contains("p/b1/manifest.json"), "{error}");
    }
}
