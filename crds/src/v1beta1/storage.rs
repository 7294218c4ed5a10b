//! Where backups live in v1beta1: a [`BackupStorage`] with one member per kind of store, used by
//! the cluster's backup settings, a backup's status and the sources of restores alike.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{LocalReference, S3Storage};
use crate::recovery::RecoveryTarget;

/// Where backups are stored. It has one member per kind of store so that other kinds (for
/// example Google Cloud Storage or Azure Blob Storage) can be added beside `s3` later without
/// moving any field again; today S3-compatible storage is the only kind, so `s3` is required.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupStorage {
    /// A bucket in S3-compatible object storage (AWS S3, MinIO, Garage, Ceph RGW, ...).
    pub s3: S3Storage,
}

/// A backup located directly in storage, given by its storage and the key of its manifest (for
/// example a backup made by another Kubernetes cluster).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreSource {
    /// Where the backup is stored.
    pub storage: BackupStorage,
    /// Key of the backup's manifest object.
    #[schemars(length(min = 1))]
    pub object_key: String,
}

/// A new cluster recovered from a physical base backup and the WAL archived after it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.backup) != has(self.source)").message("exactly one of backup and source must be set"))]
pub struct Recovery {
    /// A Completed Physical PostgreSQLBackup in the same namespace; the WAL is read from the
    /// archive it was taken with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<LocalReference>,
    /// The WAL archive of a cluster (which may no longer exist): pgkube picks the latest
    /// physical backup of that archive that ends before the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<RecoverySource>,
    /// Where replay stops. Unset: at the end of the archive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<RecoveryTarget>,
}

/// A WAL archive in storage.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoverySource {
    /// Where the archive and its base backups are stored.
    pub storage: BackupStorage,
    /// The archive's root in the bucket: `<backup prefix>/wal/<cluster>/`, where the source
    /// cluster's backup prefix is its storage's prefix, or `<namespace>/<cluster>` without one.
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^([^/]+/)*wal/[^/]+/$"))]
    pub archive: String,
}
