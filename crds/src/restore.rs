//! `PostgreSQLRestore`: restore a backup into a cluster.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{LocalReference, S3Storage, conditions_schema};
use crate::recovery::{RecoveryTarget, RestoreMethod};

/// The `expectedSystemIdentifier` (and `targetSystemIdentifier`) that accepts whatever database
/// the target cluster holds.
pub const ANY_SYSTEM_IDENTIFIER: &str = "Any";

/// Which backup to restore into which cluster. Immutable.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "db.example.com",
    version = "v1alpha1",
    kind = "PostgreSQLRestore",
    plural = "postgresqlrestores",
    singular = "postgresqlrestore",
    shortname = "pgrestore",
    namespaced,
    derive = "PartialEq",
    doc = "A restore of a backup into a PostgreSQLCluster.",
    status = "PostgreSQLRestoreStatus",
    printcolumn = r#"{"name":"Backup","type":"string","jsonPath":".spec.backup.name"}"#,
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.cluster.name"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.progress.summary"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Completed\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.message","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self == oldSelf").message("spec is immutable: create a new PostgreSQLRestore instead"))]
#[x_kube(validation = Rule::new("(has(self.method) && self.method == 'PointInTime') || has(self.backup) != has(self.source)").message("exactly one of backup and source must be set"))]
#[x_kube(validation = Rule::new("!(has(self.method) && self.method == 'PointInTime') || (!has(self.source) && !has(self.databases) && !(has(self.dropExisting) && self.dropExisting))").message("a PointInTime restore recovers the whole cluster from its own WAL archive: source, databases and dropExisting do not apply"))]
#[x_kube(validation = Rule::new("!has(self.target) || (has(self.method) && self.method == 'PointInTime')").message("target applies only to method PointInTime"))]
pub struct PostgreSQLRestoreSpec {
    /// The PostgreSQLBackup to restore, in the same namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<LocalReference>,
    /// A backup given by its storage and manifest key, for backups without a PostgreSQLBackup
    /// object (for example from another Kubernetes cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<RestoreSource>,
    /// The cluster to restore into, in the same namespace.
    pub cluster: LocalReference,
    /// `Logical` (the default): `pg_restore` of a logical backup. `PointInTime`: the whole
    /// cluster back to `target`, in place, from a physical backup (`backup`, or the latest of
    /// the cluster's own that ends before the target) and the cluster's WAL archive.
    #[serde(default, skip_serializing_if = "RestoreMethod::is_logical")]
    pub method: RestoreMethod,
    /// Where replay stops, for `method: PointInTime`. Unset: at the end of the archive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<RecoveryTarget>,
    /// Restore only these databases. Empty means all databases in the backup.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub databases: Vec<String>,
    /// Drop and recreate databases that already exist in the target cluster. Without it, a
    /// restore into an existing database fails and changes nothing.
    #[serde(default)]
    pub drop_existing: bool,
    /// Which database the target cluster must hold for the restore to run, by its PostgreSQL
    /// system identifier (`SELECT system_identifier FROM pg_control_system()`). Unset: the
    /// identifier the cluster recorded in its `status.systemIdentifier` (the restore waits,
    /// Pending, until the cluster has recorded one). Digits: exactly that identifier. `Any`: no
    /// check, the user accepts whatever database the cluster holds. The restore Job checks the
    /// target before it drops or restores anything; on a mismatch the restore fails with reason
    /// `SystemIdentifierMismatch` and the target's data is untouched. Immutable, like the rest
    /// of the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]{1,20}|Any)$"))]
    pub expected_system_identifier: Option<String>,
}

/// A backup located directly in storage.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreSource {
    /// Where the backup is stored.
    pub s3: S3Storage,
    /// Key of the backup's manifest object.
    #[schemars(length(min = 1))]
    pub object_key: String,
}

/// Observed state of a restore, written only by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostgreSQLRestoreStatus {
    /// Pending, Running, Completed or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RestorePhase>,
    /// When the restore Job started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the restore finished (or failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Manifest key of the backup that was restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_object_key: Option<String>,
    /// The PostgreSQL system identifier the target's database had to have, recorded before the
    /// restore Job was created: `spec.expectedSystemIdentifier`, else the cluster's
    /// `status.systemIdentifier`; `Any` when the spec accepts any database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_system_identifier: Option<String>,
    /// Databases that were restored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restored_databases: Vec<String>,
    /// Name of the Job that ran the restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// While the Job runs: how far it got, as its agent last reported it (written at most every
    /// 10 s). Removed when the restore ends.
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

/// Phase of a restore.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RestorePhase {
    Pending,
    Running,
    Completed,
    Failed,
}
