//! `PostgreSQLRestore` in v1beta1: restore a backup into a cluster.
//!
//! As in v1alpha1, except that a `source` gives its storage as a [`super::BackupStorage`]
//! (`source.storage.s3`), the shape every v1beta1 storage has. The status is v1alpha1's.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::storage::RestoreSource;
use crate::common::LocalReference;
use crate::recovery::{RecoveryTarget, RestoreMethod};
use crate::restore::PostgreSQLRestoreStatus;

/// Which backup to restore into which cluster. Immutable.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "db.example.com",
    version = "v1beta1",
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
