//! `PostgreSQLBackup`: one backup of a cluster (logical, or a physical base backup), and where it
//! is stored.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{LocalReference, S3Storage, conditions_schema};

/// Label on every PostgreSQLBackup pgkube creates, and on backup Jobs: the cluster's name (as a
/// label value, see the controllers' `names::label_value`).
pub const CLUSTER_LABEL: &str = "db.example.com/cluster";
/// Label on the PostgreSQLBackups the cron engine creates: `"true"`.
pub const SCHEDULED_LABEL: &str = "db.example.com/scheduled";
/// Annotation on a scheduled PostgreSQLBackup: the scheduled time it stands for, RFC 3339 UTC.
pub const SCHEDULED_TIME_ANNOTATION: &str = "db.example.com/scheduled-time";
/// The finalizer the backup controller puts on backups whose deletion policy is `Delete`: it
/// removes the stored objects before the PostgreSQLBackup goes.
pub const BACKUP_DATA_FINALIZER: &str = "db.example.com/backup-data";

/// What to back up and what happens to the data when this object is deleted. Immutable.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "db.example.com",
    version = "v1alpha1",
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

/// How a backup's database dumps are compressed (`pgkube agent backup --compression METHOD
/// --compression-level LEVEL`). The SHA-256 and size in the manifest and in the status are those
/// of the stored, compressed bytes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.method != 'gzip' || !has(self.level) || self.level <= 9").message("gzip levels are 1 to 9").field_path(".level"),
    validation = Rule::new("self.method != 'none' || !has(self.level)").message("method none takes no level").field_path(".level")
)]
pub struct BackupCompression {
    /// zstd: pg_dump writes no compression and the backup agent compresses on several threads
    /// (fastest, smallest); gzip: pg_dump's own compression, on one thread; none.
    #[serde(default)]
    pub method: CompressionMethod,
    /// 1 (fastest) to 19 (smallest) for zstd, 1 to 9 for gzip, none for `none`. Unset: 1 for
    /// zstd, pg_dump's default (6) for gzip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 19))]
    pub level: Option<i32>,
}

/// A compression method of backups.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CompressionMethod {
    /// Multi-threaded zstd, by the backup agent.
    #[default]
    Zstd,
    /// pg_dump's gzip, single-threaded.
    Gzip,
    /// No compression.
    None,
}

impl CompressionMethod {
    /// The method as the API and `pgkube agent backup --compression` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Zstd => "zstd",
            Self::Gzip => "gzip",
            Self::None => "none",
        }
    }
}

/// Backup method.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum BackupMethod {
    /// `pg_dumpall --globals-only` plus `pg_dump -Fc` of every database.
    #[default]
    Logical,
    /// A base backup (`pg_basebackup`, tar, zstd) that, with the WAL archive, restores the
    /// whole instance. Needs WAL archiving on.
    Physical,
}

impl BackupMethod {
    /// The method as the API and `pgkube agent backup --method` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Logical => "Logical",
            Self::Physical => "Physical",
        }
    }
}

/// The instance a physical backup is taken from.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum BackupTarget {
    /// A streaming replica, so that the primary carries none of the backup's load: the ready one
    /// with the least lag. A cluster of one instance is backed up from its primary; a cluster
    /// with replicas waits (Pending) until one streams within the lag limit.
    #[default]
    PreferStandby,
    /// The primary.
    Primary,
}

/// What happens to stored backup data when the PostgreSQLBackup object is deleted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    /// Keep the data in storage.
    #[default]
    Retain,
    /// Delete the data from storage before the object goes away.
    Delete,
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
    pub storage: Option<S3Storage>,
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

/// Phase of a backup.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum BackupPhase {
    Pending,
    Running,
    Completed,
    Failed,
}
