//! Continuous WAL archiving: the setting under `spec.backup` and what `status.walArchiving`
//! reports. The same in v1alpha1 and v1beta1 (at the same place in both), so conversion carries
//! them as they are.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The condition that says whether the primary's WAL reaches the archive.
pub const CONTINUOUS_ARCHIVING: &str = "ContinuousArchiving";
/// The condition that says `pg_wal` is filling the volume because archiving fails.
pub const WAL_DISK_PRESSURE: &str = "WALDiskPressure";
/// The `archive_timeout` an idle cluster gets unless `spec.postgresql.parameters` sets one: at
/// most this long of writes is outside the archive.
pub const DEFAULT_ARCHIVE_TIMEOUT: &str = "60s";

/// Continuous archiving of the primary's WAL to the backup storage.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct WalArchiving {
    /// Archive every WAL segment the primary writes (on by default when the backup has
    /// storage). Turning it off or on restarts the primary (by a switchover when the cluster
    /// has replicas): PostgreSQL reads `archive_mode` only at start.
    #[serde(default = "enabled_by_default")]
    pub enabled: bool,
}

impl Default for WalArchiving {
    fn default() -> Self {
        Self { enabled: true }
    }
}

fn enabled_by_default() -> bool {
    true
}

/// What the primary's instance manager last reported of its WAL archiving.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WalArchivingStatus {
    /// The instance that archives (the primary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The last WAL file stored in the archive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_archived: Option<String>,
    /// When it was stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_archived_time: Option<Time>,
    /// The last WAL file that could not be stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failed: Option<String>,
    /// When it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failed_time: Option<Time>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// WAL files finished by the server and not archived yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<i64>,
    /// Bytes in the primary's `pg_wal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_bytes: Option<i64>,
}
