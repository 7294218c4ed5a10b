//! pgkube API types, group `db.example.com`, version `v1beta1`: the shape pgkube keeps.
//!
//! Every v1alpha1 concept is here, reshaped where v1alpha1 was awkward
//! (`crds/CONVERSION.md` has the field-by-field table):
//! - `PostgreSQLCluster`: the PostgreSQL major is `postgresVersion` (v1alpha1: `version`); the
//!   data volume is an object, `storage: {size, storageClassName}` (v1alpha1: `storage: "10Gi"`,
//!   no class); the backup settings are grouped by concern,
//!   `backup: {schedule: {cron, timeZone, suspend}, retention: {days}, storage: {s3}, compression}`.
//! - Storage is always a [`BackupStorage`] (`{s3: ...}`): in the cluster's backup settings, in a
//!   backup's `status.storage` and in the `source` of restores and bootstraps, so that another
//!   kind of store can later be added in one place.
//! - `PostgreSQLBackup` and `PostgreSQLRestore` specs, and the cluster and restore statuses, keep
//!   v1alpha1's shapes.
//!
//! Types whose shape is the same in both versions (S3 storage, references, enums, the cluster and
//! restore statuses, PostgreSQL settings) are shared with v1alpha1 and re-exported here; a
//! version that needs to change one gets its own copy first.
//!
//! Validation is v1alpha1's wherever a field exists in both versions (ranges, patterns, CEL
//! rules, immutability); the only new field, `storage.storageClassName`, is immutable.
//!
//! The storage version, and the version pgkube's controllers read and write (its types are also
//! at the crate root). v1alpha1 stays served beside it: [`crate::crds`] merges each kind's two
//! versions into one CRD converting through the manager's webhook. [`crds`] here gives the
//! v1beta1 CRDs alone.

mod backup;
mod cluster;
mod restore;
mod storage;

pub use backup::*;
pub use cluster::*;
pub use restore::*;
pub use storage::*;

pub use crate::archiving::{
    CONTINUOUS_ARCHIVING, DEFAULT_ARCHIVE_TIMEOUT, WAL_DISK_PRESSURE, WalArchiving,
    WalArchivingStatus,
};
pub use crate::backup::{
    BACKUP_DATA_FINALIZER, BackupCompression, BackupMethod, BackupPhase, BackupTarget,
    CLUSTER_LABEL, CompressionMethod, DeletionPolicy, SCHEDULED_LABEL, SCHEDULED_TIME_ANNOTATION,
};
pub use crate::cluster::{
    ClusterPhase, DEFAULT_APPLICATION_NAME, DEFAULT_FAILOVER_DELAY_SECONDS,
    DEFAULT_ISOLATION_TIMEOUT_SECONDS, FENCE_MARGIN_SECONDS, HighAvailability, Initdb,
    InstanceRole, InstanceSpread, InstanceStatus, MANAGED_PARAMETERS, Monitoring,
    NetworkPolicySettings, NodeAntiAffinity, ONE_ANTI_AFFINITY_MESSAGE, ONE_ANTI_AFFINITY_RULE,
    PostgreSQLClusterStatus, PostgreSQLSettings, PostgresVersion, PrimaryChange, PrimaryChangeKind,
    PrimaryUpdateStrategy, REFUSED_PARAMETERS, Recoverability, SYNCHRONOUS_FITS_MESSAGE,
    SYNCHRONOUS_FITS_RULE, ServerCertificates, SynchronousReplication,
};
pub use crate::common::{
    LocalReference, S3Credentials, S3Storage, ServerSideEncryption, conditions_schema,
};
pub use crate::progress::{PROGRESS_WRITE_INTERVAL_SECONDS, TransferProgress};
pub use crate::recovery::{InPlaceRecovery, InPlaceStep, RecoveryTarget, RestoreMethod};
pub use crate::restore::{ANY_SYSTEM_IDENTIFIER, PostgreSQLRestoreStatus, RestorePhase};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// `apiVersion` of every v1beta1 object.
pub const API_VERSION: &str = "db.example.com/v1beta1";

/// The v1beta1 CRDs of all pgkube kinds, in the order of [`crate::crds`], which merges them with
/// the v1alpha1 ones.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        PostgreSQLCluster::crd(),
        PostgreSQLBackup::crd(),
        PostgreSQLRestore::crd(),
    ]
}

#[cfg(test)]
mod tests;
