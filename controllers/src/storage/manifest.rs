//! The backup manifest: `<prefix>/<backup-name>/manifest.json`, written last by the agent,
//! read by restores, by the backup controller's verification and by retention.
//!
//! Its presence means every object it lists was uploaded completely and its stored size was
//! checked. Restore trusts only what it lists: keys, sizes and SHA-256 checksums.

use serde::{Deserialize, Serialize};

use super::error::StorageError;

/// Version of this manifest layout; bumped on incompatible changes.
pub const MANIFEST_VERSION: u32 = 1;
/// Format of the database objects.
pub const DATABASE_FORMAT: &str = "pg_dump-custom";
/// Format of the globals object.
pub const GLOBALS_FORMAT: &str = "pg_dumpall-globals-sql";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub manifest_version: u32,
    pub cluster: String,
    pub namespace: String,
    pub backup_name: String,
    /// `SHOW server_version` of the backed-up server, for example "15.18 (Debian ...)".
    pub postgresql_version: String,
    /// RFC 3339, UTC.
    pub started_at: String,
    pub finished_at: String,
    pub format: String,
    pub globals: StoredObject,
    pub databases: Vec<DatabaseObject>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredObject {
    pub key: String,
    pub size: u64,
    pub sha256: String,
    pub format: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseObject {
    pub name: String,
    #[serde(flatten)]
    pub object: StoredObject,
}

impl Manifest {
    pub fn total_size(&self) -> u64 {
        self.globals.size + self.databases.iter().map(|db| db.object.size).sum::<u64>()
    }

    pub fn parse(key: &str, bytes: &[u8]) -> Result<Self, StorageError> {
        let manifest: Self =
            serde_json::from_slice(bytes).map_err(|error| StorageError::Manifest {
                key: key.to_string(),
                reason: error.to_string(),
            })?;
        if manifest.manifest_version != MANIFEST_VERSION {
            return Err(StorageError::Manifest {
                key: key.to_string(),
                reason: format!(
                    "manifest version {} is not supported (this agent reads {MANIFEST_VERSION})",
                    manifest.manifest_version
                ),
            });
        }
        Ok(manifest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(key: &str, size: u64) -> StoredObject {
        StoredObject {
            key: key.into(),
            size,
            sha256: "ab".repeat(32),
            format: DATABASE_FORMAT.into(),
        }
    }

    fn sample() -> Manifest {
        Manifest {
            manifest_version: MANIFEST_VERSION,
            cluster: "main".into(),
            namespace: "db".into(),
            backup_name: "b1".into(),
            postgresql_version: "15.18".into(),
            started_at: "2025-01-01T00:00:00Z".into(),
            finished_at: "2025-01-01T00:01:00Z".into(),
            format: DATABASE_FORMAT.into(),
            globals: object("p/b1/globals.sql", 10),
            databases: vec![DatabaseObject {
                name: "app".into(),
                object: object("p/b1/databases/app.dump", 32),
            }],
        }
    }

    #[test]
    fn a_manifest_survives_a_round_trip_through_json() {
        let manifest = sample();
        let json = serde_json::to_vec(&manifest).expect("serialises");
        assert_eq!(Manifest::parse("k", &json).expect("parses"), manifest);
        assert_eq!(manifest.total_size(), 42);
    }

    #[test]
    fn an_unknown_manifest_version_is_refused() {
        let mut manifest = sample();
        manifest.manifest_version = 99;
        let json = serde_json::to_vec(&manifest).expect("serialises");
        let error = Manifest::parse("p/b1/manifest.json", &json).expect_err("refused");
        assert!(error.to_string().contains("version 99"), "{error}");
    }

    #[test]
    fn a_truncated_manifest_is_refused_with_its_key() {
        let json = serde_json::to_vec(&sample()).expect("serialises");
        let error =
            Manifest::parse("p/b1/manifest.json", &json[..json.len() / 2]).expect_err("refused");
        assert!(error.to_string().contains("p/b1/manifest.json"), "{error}");
    }
}
