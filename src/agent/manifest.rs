//! The manifest as the agent writes and reads it: the shared [`Manifest`] plus, on each object,
//! `"compression"`: how its stored bytes are compressed (`"zstd"` or `"none"`).
//!
//! The SHA-256 and size of every object stay those of the stored bytes. The shared type
//! (`pgkube_controllers::storage::manifest`) does not know the field: the controllers ignore it
//! (they check stored sizes and checksums only), and this module adds it on write and reads it
//! back on restore. A manifest without it, as every backup before the agent compressed was
//! written, means `"none"`; a value this agent cannot decode refuses the restore before anything
//! changes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::compression::Stored;
use super::error::AgentError;
use pgkube_controllers::storage::manifest::{DatabaseObject, Manifest, StoredObject};

/// The manifest's fields in the shared type's order, each object with its compression.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Written<'a> {
    manifest_version: u32,
    cluster: &'a str,
    namespace: &'a str,
    backup_name: &'a str,
    postgresql_version: &'a str,
    started_at: &'a str,
    finished_at: &'a str,
    format: &'a str,
    globals: Tagged<'a, StoredObject>,
    databases: Vec<Tagged<'a, DatabaseObject>>,
}

#[derive(Serialize)]
struct Tagged<'a, T> {
    #[serde(flatten)]
    object: &'a T,
    compression: &'static str,
}

/// The manifest's bytes, each object with the compression `compression_of` gives its key.
pub fn to_json(
    manifest: &Manifest,
    compression_of: impl Fn(&str) -> Stored,
) -> serde_json::Result<Vec<u8>> {
    // Destructured whole: a field added to the shared type fails to compile until written here.
    let Manifest {
        manifest_version,
        cluster,
        namespace,
        backup_name,
        postgresql_version,
        started_at,
        finished_at,
        format,
        globals,
        databases,
    } = manifest;
    let written = Written {
        manifest_version: *manifest_version,
        cluster,
        namespace,
        backup_name,
        postgresql_version,
        started_at,
        finished_at,
        format,
        globals: Tagged {
            object: globals,
            compression: compression_of(&globals.key).name(),
        },
        databases: databases
            .iter()
            .map(|database| Tagged {
                object: database,
                compression: compression_of(&database.object.key).name(),
            })
            .collect(),
    };
    serde_json::to_vec_pretty(&written)
}

/// A manifest read back, with the compression of each object.
#[derive(Debug)]
pub struct ReadManifest {
    pub manifest: Manifest,
    compressions: BTreeMap<String, Stored>,
}

impl ReadManifest {
    /// Parses the manifest at `key`; an object compressed in a way this agent cannot decode is
    /// an error.
    pub fn parse(key: &str, bytes: &[u8]) -> Result<Self, AgentError> {
        let manifest = Manifest::parse(key, bytes)?;
        let listed: Listed =
            serde_json::from_slice(bytes).map_err(|error| AgentError::Manifest {
                key: key.to_string(),
                reason: error.to_string(),
            })?;
        let mut compressions = BTreeMap::new();
        for entry in std::iter::once(listed.globals).chain(listed.databases) {
            let stored = match entry.compression.as_deref() {
                None => Stored::Plain,
                Some(name) => Stored::from_name(name).ok_or_else(|| AgentError::Manifest {
                    key: key.to_string(),
                    reason: format!(
                        "object {} is compressed with {name:?}, which this agent cannot decode",
                        entry.key
                    ),
                })?,
            };
            compressions.insert(entry.key, stored);
        }
        Ok(Self {
            manifest,
            compressions,
        })
    }

    /// How `object` is stored.
    pub fn compression_of(&self, object: &StoredObject) -> Stored {
        self.compressions
            .get(&object.key)
            .copied()
            .unwrap_or(Stored::Plain)
    }
}

#[derive(Deserialize)]
struct Listed {
    globals: Entry,
    databases: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    key: String,
    #[serde(default)]
    compression: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgkube_controllers::storage::manifest::{
        DATABASE_FORMAT, GLOBALS_FORMAT, MANIFEST_VERSION,
    };

    fn object(key: &str, format: &str) -> StoredObject {
        StoredObject {
            key: key.into(),
            size: 42,
            sha256: "ab".repeat(32),
            format: format.into(),
        }
    }

    fn manifest() -> Manifest {
        Manifest {
            manifest_version: MANIFEST_VERSION,
            cluster: "main".into(),
            namespace: "db".into(),
            backup_name: "b1".into(),
            postgresql_version: "15.8".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            finished_at: "2026-01-01T00:01:00Z".into(),
            format: DATABASE_FORMAT.into(),
            globals: object("p/b1/globals.sql", GLOBALS_FORMAT),
            databases: ["app", "shop"]
                .iter()
                .map(|name| DatabaseObject {
                    name: name.to_string(),
                    object: object(&format!("p/b1/databases/{name}.dump"), DATABASE_FORMAT),
                })
                .collect(),
        }
    }

    fn zstd_databases(key: &str) -> Stored {
        if key.ends_with(".dump") {
            Stored::Zstd
        } else {
            Stored::Plain
        }
    }

    #[test]
    fn the_shared_type_reads_what_the_agent_writes_unchanged() {
        let bytes = to_json(&manifest(), zstd_databases).expect("JSON");
        let parsed = Manifest::parse("m", &bytes).expect("the controllers' parser");
        assert_eq!(parsed, manifest());
    }

    #[test]
    fn each_object_carries_its_compression() {
        let bytes = to_json(&manifest(), zstd_databases).expect("JSON");
        let json: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
        assert_eq!(json["globals"]["compression"], "none");
        assert_eq!(json["databases"][0]["compression"], "zstd");
        assert_eq!(json["databases"][1]["name"], "shop");
        let read = ReadManifest::parse("m", &bytes).expect("parses");
        assert_eq!(read.manifest, manifest());
        assert_eq!(read.compression_of(&manifest().globals), Stored::Plain);
        assert_eq!(
            read.compression_of(&manifest().databases[1].object),
            Stored::Zstd
        );
    }

    #[test]
    fn a_manifest_from_before_compression_means_none() {
        // Exactly what the agent wrote before it compressed: the shared type, pretty-printed.
        let bytes = serde_json::to_vec_pretty(&manifest()).expect("JSON");
        assert!(!String::from_utf8_lossy(&bytes).contains("compression"));
        let read = ReadManifest::parse("m", &bytes).expect("parses");
        for database in &manifest().databases {
            assert_eq!(read.compression_of(&database.object), Stored::Plain);
        }
    }

    #[test]
    fn an_unknown_compression_is_refused_naming_the_object() {
        let bytes = to_json(&manifest(), zstd_databases).expect("JSON");
        let text = String::from_utf8(bytes)
            .expect("UTF-8")
            .replacen("\"zstd\"", "\"lz4\"", 1);
        let error = ReadManifest::parse("m", text.as_bytes()).expect_err("lz4 is unknown");
        let message = error.to_string();
        assert!(message.contains("p/b1/databases/app.dump"), "{message}");
        assert!(message.contains("lz4"), "{message}");
    }
}
