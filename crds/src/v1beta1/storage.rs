//! Where backups live in v1beta1: a [`BackupStorage`] with one member per kind of store, used by
//! the cluster's backup settings, a backup's status and the sources of restores alike.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::S3Storage;

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
