//! The WAL archive in object storage: where each WAL file goes, who owns an archive, and how a
//! file is stored without ever overwriting another.
//!
//! ```text
//! <prefix>/wal/<cluster>/archive.json                   the owner: system identifier, cluster uid
//! <prefix>/wal/<cluster>/<timeline>/<wal file>.zst      each file, zstd-compressed
//! ```
//!
//! `<prefix>` is the cluster's backup prefix (the storage's, or `<namespace>/<cluster>`), so
//! clusters of different names can share one; two of the same name on one prefix cannot.
//!
//! `<timeline>` is the eight hex digits every WAL file name starts with, so each timeline has
//! a directory of its own: segments (`000000010000000A000000FF`), partial segments (`.partial`),
//! backup history files (`.backup`) and timeline history files (`00000002.history`).
//!
//! An archive belongs to one database of one cluster: the first archiver writes
//! `archive.json`, and an archiver of another system or another cluster refuses to store
//! anything there ([`claim`]). A file is stored only where no object is; one already there is
//! success when its content is the same (its SHA-256, kept in the object's metadata), and a
//! conflict otherwise: two primaries wrote the same file, and neither copy is replaced
//! ([`store_file`]).

use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use serde::{Deserialize, Serialize};

use super::client::{NewObject, S3Bucket, refused_as_existing};
use super::error::{StorageError, s3_error};

/// The owner record at the archive's root.
pub const MARKER: &str = "archive.json";
/// Object metadata (`x-amz-meta-…`): the SHA-256 and size of the file before compression.
const SHA256_METADATA: &str = "pgkube-sha256";
const SIZE_METADATA: &str = "pgkube-size";

/// `<prefix>/wal/<cluster>/`: the root of a cluster's WAL archive, `prefix` being the cluster's
/// backup prefix.
pub fn archive_root(prefix: &str, cluster: &str) -> String {
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() {
        format!("wal/{cluster}/")
    } else {
        format!("{prefix}/wal/{cluster}/")
    }
}

/// The kinds of files PostgreSQL archives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalFileKind {
    Segment,
    Partial,
    BackupHistory,
    TimelineHistory,
}

/// A valid WAL file name, with its timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalFileName {
    pub name: String,
    pub kind: WalFileKind,
    /// The eight hex digits of the timeline.
    pub timeline: String,
}

impl WalFileName {
    /// The name if it is one PostgreSQL archives; `None` for anything else (a path, a name
    /// with other characters), which must never become a key.
    pub fn parse(name: &str) -> Option<Self> {
        let hex = |text: &str, len: usize| {
            text.len() == len && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'A'..=b'F'))
        };
        let kind = match name.split_once('.') {
            None if hex(name, 24) => WalFileKind::Segment,
            Some((segment, "partial")) if hex(segment, 24) => WalFileKind::Partial,
            Some((timeline, "history")) if hex(timeline, 8) => WalFileKind::TimelineHistory,
            Some((segment, rest)) if hex(segment, 24) => match rest.split_once('.') {
                Some((offset, "backup")) if hex(offset, 8) => WalFileKind::BackupHistory,
                _ => return None,
            },
            _ => return None,
        };
        Some(Self {
            name: name.to_owned(),
            kind,
            timeline: name[..8].to_owned(),
        })
    }

    /// `<root><timeline>/<name>.zst`.
    pub fn key(&self, root: &str) -> String {
        format!("{root}{}/{}.zst", self.timeline, self.name)
    }
}

/// Where and how the primary's instance manager archives: what the operator writes in
/// `instance.json`. The keys and the CA bundle are files of the pod ([`Self::FILES`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WalArchiveTarget {
    pub bucket: String,
    pub region: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub force_path_style: bool,
    /// The archive's root ([`archive_root`]).
    pub root: String,
    /// `<namespace>/<name>` of the cluster, recorded in the owner record.
    pub cluster: String,
    /// Whether the pod has a CA bundle to trust for the endpoint.
    #[serde(default)]
    pub ca_bundle: bool,
    /// Whether the pod has key files; without them the pod's identity is used (the AWS SDK's
    /// default chain). Absent from older operators' settings, which always gave keys.
    #[serde(default = "keys_by_default")]
    pub keys: bool,
    /// Server-side encryption every object must request: `AES256` or `aws:kms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_side_encryption: Option<String>,
}

fn keys_by_default() -> bool {
    true
}

impl WalArchiveTarget {
    /// The files of the pod's S3 volume: the access key id, the secret key, the CA bundle.
    pub const FILES: [&'static str; 3] = ["access-key-id", "secret-access-key", "ca.crt"];
}

/// Who an archive belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveOwner {
    /// The PostgreSQL system identifier of the database whose WAL it holds.
    pub system_identifier: String,
    /// The uid of the PostgreSQLCluster that archives there.
    pub cluster_uid: String,
    /// `<namespace>/<name>` of that cluster, for people.
    pub cluster: String,
}

/// Why a WAL file was not stored.
#[derive(Debug, thiserror::Error)]
pub enum WalArchiveError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The archive belongs to another database or another cluster.
    #[error(
        "the archive at {root} belongs to system {} of cluster {} (uid {}), not to system {} of cluster {} (uid {}): archiving there is refused; give this cluster another prefix",
        stored.system_identifier, stored.cluster, stored.cluster_uid,
        ours.system_identifier, ours.cluster, ours.cluster_uid
    )]
    NotOurs {
        root: String,
        stored: Box<ArchiveOwner>,
        ours: Box<ArchiveOwner>,
    },
    /// The archive's owner record cannot be read as one.
    #[error("{key} is not an archive owner record: {reason}")]
    BadMarker { key: String, reason: String },
    /// Another file of the same name is stored: two servers wrote the same WAL file.
    #[error(
        "{key} is already stored with other content (SHA-256 {stored}, this one {ours}): two primaries wrote the same WAL file; the stored one is kept"
    )]
    Conflict {
        key: String,
        stored: String,
        ours: String,
    },
}

/// Makes sure the archive at `root` is `owner`'s: writes the owner record if there is none, and
/// refuses an archive recorded as another system's or another cluster's.
pub async fn claim(
    bucket: &S3Bucket,
    root: &str,
    owner: &ArchiveOwner,
) -> Result<(), WalArchiveError> {
    let key = format!("{root}{MARKER}");
    if let Some(stored) = read_owner(bucket, &key).await? {
        return check_owner(root, &stored, owner);
    }
    let body = serde_json::to_vec_pretty(owner).map_err(|error| WalArchiveError::BadMarker {
        key: key.clone(),
        reason: error.to_string(),
    })?;
    if bucket
        .put_new_object(&key, body, "application/json")
        .await?
        == NewObject::Written
    {
        return Ok(());
    }
    // Another archiver wrote one first: it decides.
    match read_owner(bucket, &key).await? {
        Some(stored) => check_owner(root, &stored, owner),
        None => Err(StorageError::S3 {
            operation: "GetObject",
            key,
            reason: "the owner record was there a moment ago and is gone".to_owned(),
        }
        .into()),
    }
}

/// The owner record of the archive at `root`, if it has one.
pub async fn owner(bucket: &S3Bucket, root: &str) -> Result<Option<ArchiveOwner>, WalArchiveError> {
    read_owner(bucket, &format!("{root}{MARKER}")).await
}

async fn read_owner(bucket: &S3Bucket, key: &str) -> Result<Option<ArchiveOwner>, WalArchiveError> {
    let Some(bytes) = bucket.read_object(key).await? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|error| WalArchiveError::BadMarker {
            key: key.to_owned(),
            reason: error.to_string(),
        })
}

/// The archive is `ours` only when it holds the same system's WAL for the same cluster.
pub fn check_owner(
    root: &str,
    stored: &ArchiveOwner,
    ours: &ArchiveOwner,
) -> Result<(), WalArchiveError> {
    if stored.system_identifier == ours.system_identifier && stored.cluster_uid == ours.cluster_uid
    {
        return Ok(());
    }
    Err(WalArchiveError::NotOurs {
        root: root.to_owned(),
        stored: Box::new(stored.clone()),
        ours: Box::new(ours.clone()),
    })
}

/// A WAL file ready to store: its compressed bytes (shared, so a request body is no copy), and
/// the SHA-256 and size of the original.
#[derive(Clone, Debug)]
pub struct PreparedFile {
    pub compressed: bytes::Bytes,
    pub sha256: String,
    pub size: u64,
}

/// What [`store_file`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    Written,
    /// The same content was stored already (archived before the server heard of it).
    AlreadyThere,
}

/// Stores `file` at `key` unless an object is there. An object there with the same SHA-256 is
/// success; with another, or without one, a [`WalArchiveError::Conflict`].
pub async fn store_file(
    bucket: &S3Bucket,
    key: &str,
    file: &PreparedFile,
) -> Result<Stored, WalArchiveError> {
    if let Some(stored) = stored_sha256(bucket, key).await? {
        return same_content(key, &stored, &file.sha256).map(|()| Stored::AlreadyThere);
    }
    let answer = bucket
        .put_object(key)
        .if_none_match("*")
        .content_type("application/zstd")
        .metadata(SHA256_METADATA, &file.sha256)
        .metadata(SIZE_METADATA, file.size.to_string())
        .body(ByteStream::from(file.compressed.clone()))
        .send()
        .await;
    match answer {
        Ok(_) => Ok(Stored::Written),
        Err(SdkError::ServiceError(service))
            if refused_as_existing(service.raw().status().as_u16(), service.err().code()) =>
        {
            let stored = stored_sha256(bucket, key).await?.unwrap_or_default();
            same_content(key, &stored, &file.sha256).map(|()| Stored::AlreadyThere)
        }
        Err(error) => Err(s3_error("PutObject", key, error).into()),
    }
}

fn same_content(key: &str, stored: &str, ours: &str) -> Result<(), WalArchiveError> {
    if stored == ours {
        return Ok(());
    }
    Err(WalArchiveError::Conflict {
        key: key.to_owned(),
        stored: if stored.is_empty() {
            "unknown".to_owned()
        } else {
            stored.to_owned()
        },
        ours: ours.to_owned(),
    })
}

/// A WAL file as the archive holds it: the stored (compressed) bytes, and the SHA-256 and size
/// of the original that the archiver recorded with it.
#[derive(Clone, Debug)]
pub struct FetchedFile {
    pub compressed: bytes::Bytes,
    pub sha256: Option<String>,
    pub size: Option<u64>,
}

/// Reads the WAL file at `key`; `None` when there is no object.
pub async fn fetch_file(bucket: &S3Bucket, key: &str) -> Result<Option<FetchedFile>, StorageError> {
    let Some((compressed, metadata)) = bucket.read_object_with_metadata(key).await? else {
        return Ok(None);
    };
    Ok(Some(FetchedFile {
        compressed,
        sha256: metadata.get(SHA256_METADATA).cloned(),
        size: metadata
            .get(SIZE_METADATA)
            .and_then(|size| size.parse().ok()),
    }))
}

/// Whether any object is stored under `prefix`.
pub async fn any_under(bucket: &S3Bucket, prefix: &str) -> Result<bool, StorageError> {
    let page = bucket
        .client
        .list_objects_v2()
        .bucket(&bucket.name)
        .prefix(prefix)
        .max_keys(1)
        .send()
        .await
        .map_err(|error| s3_error("ListObjectsV2", prefix, error))?;
    Ok(!page.contents().is_empty())
}

/// The first key after `after` under `prefix`, if any.
pub async fn next_key(
    bucket: &S3Bucket,
    prefix: &str,
    after: &str,
) -> Result<Option<String>, StorageError> {
    let page = bucket
        .client
        .list_objects_v2()
        .bucket(&bucket.name)
        .prefix(prefix)
        .start_after(after)
        .max_keys(1)
        .send()
        .await
        .map_err(|error| s3_error("ListObjectsV2", prefix, error))?;
    Ok(page
        .contents()
        .first()
        .and_then(|o| o.key())
        .map(str::to_owned))
}

/// The SHA-256 an object at `key` records (empty when it records none), or `None` when there
/// is no object.
async fn stored_sha256(bucket: &S3Bucket, key: &str) -> Result<Option<String>, StorageError> {
    let head = bucket
        .client
        .head_object()
        .bucket(&bucket.name)
        .key(key)
        .send()
        .await;
    match head {
        Ok(head) => Ok(Some(
            head.metadata()
                .and_then(|metadata| metadata.get(SHA256_METADATA))
                .cloned()
                .unwrap_or_default(),
        )),
        Err(SdkError::ServiceError(service)) if service.err().is_not_found() => Ok(None),
        Err(error) => Err(s3_error("HeadObject", key, error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_wal_file_has_its_timelines_directory() {
        let root = archive_root("/backups/", "db");
        assert_eq!(root, "backups/wal/db/");
        assert_eq!(archive_root("", "db"), "wal/db/");
        let cases = [
            ("000000010000000A000000FF", WalFileKind::Segment),
            ("000000020000000A000000FF.partial", WalFileKind::Partial),
            (
                "000000010000000000000002.00000028.backup",
                WalFileKind::BackupHistory,
            ),
            ("00000002.history", WalFileKind::TimelineHistory),
        ];
        for (name, kind) in cases {
            let file = WalFileName::parse(name).expect(name);
            assert_eq!(file.kind, kind, "{name}");
            assert_eq!(
                file.key(&root),
                format!("backups/wal/db/{}/{name}.zst", &name[..8])
            );
        }
    }

    #[test]
    fn anything_but_a_wal_file_name_is_refused() {
        for name in [
            "",
            "pg_wal/000000010000000A000000FF",
            "000000010000000a000000ff",
            "000000010000000A000000F",
            "000000010000000A000000FF.ready",
            "00000002.history.x",
            "../00000002.history",
            "000000010000000000000002.0028.backup",
        ] {
            assert_eq!(WalFileName::parse(name), None, "{name:?}");
        }
    }

    #[test]
    fn an_archive_is_ours_only_with_the_same_system_and_cluster() {
        let ours = ArchiveOwner {
            system_identifier: "7312345678901234567".into(),
            cluster_uid: "uid-a".into(),
            cluster: "ns/db".into(),
        };
        assert!(check_owner("r/", &ours, &ours).is_ok());
        let other_system = ArchiveOwner {
            system_identifier: "7399999999999999999".into(),
            ..ours.clone()
        };
        let other_cluster = ArchiveOwner {
            cluster_uid: "uid-b".into(),
            cluster: "other/db".into(),
            ..ours.clone()
        };
        for stored in [other_system, other_cluster] {
            let refused = check_owner("r/", &stored, &ours).expect_err("another owner");
            let message = refused.to_string();
            assert!(message.contains(&stored.system_identifier), "{message}");
            assert!(message.contains("another prefix"), "{message}");
        }
    }

    #[test]
    fn only_the_same_digest_is_the_same_file() {
        assert!(same_content("k", "abc", "abc").is_ok());
        let conflict = same_content("k", "abc", "abd").expect_err("different");
        assert!(conflict.to_string().contains("two primaries"), "{conflict}");
        let unknown = same_content("k", "", "abd").expect_err("no digest stored");
        assert!(unknown.to_string().contains("SHA-256 unknown"), "{unknown}");
    }
}
