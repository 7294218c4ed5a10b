//! Point-in-time recovery into a new cluster (`spec.bootstrap.recovery`): which physical base
//! backup the first instance starts from, which WAL archive it replays, and where replay stops.
//!
//! The target is the same in both API versions; only where the source's storage is differs
//! (`source.s3` in v1alpha1, `source.storage.s3` in v1beta1), like a restore's source.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::common::{LocalReference, S3Storage};

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

/// A WAL archive in storage (v1alpha1 shape: the storage is `s3`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoverySource {
    /// Where the archive and its base backups are stored.
    pub s3: S3Storage,
    /// The archive's root in the bucket: `<backup prefix>/wal/<cluster>/`, where the source
    /// cluster's backup prefix is its storage's prefix, or `<namespace>/<cluster>` without one.
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^([^/]+/)*wal/[^/]+/$"))]
    pub archive: String,
}

/// Where replay stops: at most one of `time`, `lsn`, `xid`, `name` and `immediate`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.time), has(self.lsn), has(self.xid), has(self.name), has(self.immediate) && self.immediate].filter(x, x).size() <= 1").message("set at most one of time, lsn, xid, name and immediate"))]
pub struct RecoveryTarget {
    /// A moment, RFC 3339 (`2026-12-05T14:03:27Z`): replay stops at the first commit after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub time: Option<String>,
    /// A WAL position, as PostgreSQL writes it (`0/3000028`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$"))]
    pub lsn: Option<String>,
    /// A transaction id: replay stops at its commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,19}$"))]
    pub xid: Option<String>,
    /// A restore point made with `pg_create_restore_point()`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub name: Option<String>,
    /// Stop as soon as the base backup is consistent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub immediate: Option<bool>,
    /// Whether replay stops just after the target (true, the default) or just before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inclusive: Option<bool>,
    /// The timeline to follow: `latest` (the default), `current` (the base backup's), or a
    /// timeline number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(latest|current|[0-9]{1,10})$"))]
    pub timeline: Option<String>,
}

/// How a restore brings its backup into the cluster.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum RestoreMethod {
    /// `pg_restore` of a logical backup into the running cluster, database by database.
    #[default]
    Logical,
    /// The whole cluster back to a point in time, in place: its primary's data recovered from a
    /// physical backup and its own WAL archive, its replicas cloned again.
    PointInTime,
}

impl RestoreMethod {
    pub fn is_logical(&self) -> bool {
        *self == Self::Logical
    }
}

/// How far an in-place point-in-time recovery of the cluster has come.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum InPlaceStep {
    /// The cluster is fenced (nothing routes to `-rw`, scheduled backups wait); the primary's
    /// instance stops, restores the base backup and replays the archive to the target, its old
    /// data directory kept aside.
    Recovering,
    /// The primary promoted on a new timeline; the replicas are cloned again from it.
    Recloning,
    /// Every instance runs the recovered database.
    Completed,
    /// The recovery failed: the primary is back on its old data, unchanged.
    Failed,
}

/// The cluster's last in-place point-in-time recovery (a PostgreSQLRestore with
/// `method: PointInTime`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct InPlaceRecovery {
    /// The PostgreSQLRestore's name.
    pub restore: String,
    /// The PostgreSQLRestore's uid.
    pub uid: String,
    pub step: InPlaceStep,
    /// What the step is doing, or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Where the primary's data directory from before the recovery is kept, on its volume:
    /// pgkube never deletes it; remove it once the recovered database is what you want.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_data: Option<String>,
}
