//! `PostgreSQLBackup` in v1beta1: one backup of a cluster (logical, or a physical base backup).
//!
//! The spec is v1alpha1's (`compression` and `target` included). In the status, where the backup was written is a [`BackupStorage`]
//! (`status.storage.s3`), the same shape as the cluster's `spec.backup.storage`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::storage::BackupStorage;
use crate::backup::{BackupCompression, BackupMethod, BackupPhase, BackupTarget, DeletionPolicy};
use crate::common::{LocalReference, conditions_schema};

/// What to back up and what happens to the data when this object is deleted. Immutable.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "db.example.com",
    version = "v1beta1",
    kind = "PostgreSQLBackup",
    plural = "postgresqlbackups",
    singular = "postgresqlbackup",
    shortname = "pgbackup",
    namespaced,
    derive = "PartialEq",
    doc = "One backup of a PostgreSQLCluster to S3-compatible storage.",
    status = "PostgreSQLBackupStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.cluster.name"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.progress.summary"}"#,
    printcolumn = r#"{"name":"Size","type":"integer","format":"int64","jsonPath":".status.sizeBytes"}"#,
    printcolumn = r#"{"name":"Completed","type":"date","jsonPath":".status.completionTime"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self == oldSelf").message("spec is immutable: create a new PostgreSQLBackup instead"),
    validation = Rule::new("!has(self.target) || (has(self.method) && self.method == 'Physical')").message("target applies to physical backups only (method: Physical)").field_path(".target")
)]
pub struct PostgreSQLBackupSpec {
    /// The cluster to back up, in the same namespace.
    pub cluster: LocalReference,
    /// How to back up.
    #[serde(default)]
    pub method: BackupMethod,
    /// Physical backups: the instance the base backup is taken from. Unset: `PreferStandby`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<BackupTarget>,
    /// What deleting this object does to the stored data: Retain keeps it, Delete removes it
    /// from storage first.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// How the dumps are compressed. Unset: the cluster's `backup.compression`, else zstd at
    /// level 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<BackupCompression>,
}

/// Observed state of a backup, written only by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostgreSQLBackupStatus {
    /// Pending, Running, Completed or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<BackupPhase>,
    /// When the backup Job started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the backup was verified in storage (or failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Where the backup was written (resolved when the backup started, so that restore and
    /// deletion work even after the cluster's configuration changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<BackupStorage>,
    /// How the dumps are compressed (the backup's own, else its cluster's, else zstd), resolved
    /// when the backup started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<BackupCompression>,
    /// Key of the backup's manifest object, recorded when the backup starts: in the backup's own
    /// directory, `<prefix>/<cluster uid>/<backup name>/<backup uid>/manifest.json`; the manifest
    /// is there once the backup is Completed. Backups started before the uids were in the keys
    /// have `<prefix>/<backup name>/manifest.json`, recorded when they completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_key: Option<String>,
    /// Total size of the stored objects, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// SHA-256 of the manifest object, as `sha256:<hex>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    /// PostgreSQL server version that was backed up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_version: Option<String>,
    /// Name of the Job that ran the backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// While the Job runs: how far it got, as its agent last reported it (written at most every
    /// 10 s). Removed when the backup ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<crate::progress::TransferProgress>,
    /// Human-readable detail of the current phase, the reason of a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}
