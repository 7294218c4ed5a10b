//! `PostgreSQLCluster` in v1beta1: the desired PostgreSQL instance set.
//!
//! The same concepts as v1alpha1, reshaped: the PostgreSQL major is `postgresVersion`, the data
//! volume is an object (`storage.size`, and the new `storage.storageClassName`), and the backup
//! settings are grouped by concern (`backup.schedule`, `backup.retention`, `backup.storage`).
//! The status is v1alpha1's, unchanged.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::storage::{BackupStorage, RestoreSource};
use crate::archiving::WalArchiving;
use crate::backup::{BackupCompression, BackupMethod};
use crate::cluster::{
    BOOTSTRAP_ONE_OF_MESSAGE, BOOTSTRAP_ONE_OF_RULE, CERTIFICATES_KEPT_MESSAGE,
    CERTIFICATES_KEPT_RULE, HighAvailability, InstanceSpread, Monitoring, NetworkPolicySettings,
    ONE_ANTI_AFFINITY_MESSAGE, ONE_ANTI_AFFINITY_RULE, PostgreSQLClusterStatus, PostgreSQLSettings,
    PostgresVersion, PrimaryUpdateStrategy, SYNCHRONOUS_FITS_MESSAGE, SYNCHRONOUS_FITS_RULE,
    ServerCertificates,
};
use crate::common::LocalReference;

/// Desired state of a PostgreSQL cluster.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "db.example.com",
    version = "v1beta1",
    kind = "PostgreSQLCluster",
    plural = "postgresqlclusters",
    singular = "postgresqlcluster",
    shortname = "pgcluster",
    namespaced,
    derive = "PartialEq",
    doc = "A PostgreSQL cluster: instances, services, credentials and scheduled backups.",
    status = "PostgreSQLClusterStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Primary","type":"string","jsonPath":".status.currentPrimary"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.currentVersion","priority":1}"#,
    printcolumn = r#"{"name":"Archiving","type":"string","jsonPath":".status.conditions[?(@.type==\"ContinuousArchiving\")].status","priority":1}"#,
    printcolumn = r#"{"name":"Last WAL","type":"string","jsonPath":".status.walArchiving.lastArchived","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.bootstrap) == has(oldSelf.bootstrap) && (!has(self.bootstrap) || self.bootstrap == oldSelf.bootstrap)").message("bootstrap is immutable: it can only be set when the cluster is created"))]
#[x_kube(validation = Rule::new(SYNCHRONOUS_FITS_RULE).message(SYNCHRONOUS_FITS_MESSAGE))]
#[x_kube(validation = Rule::new(CERTIFICATES_KEPT_RULE).message(CERTIFICATES_KEPT_MESSAGE))]
#[x_kube(validation = Rule::new(ONE_ANTI_AFFINITY_RULE).message(ONE_ANTI_AFFINITY_MESSAGE))]
pub struct PostgreSQLClusterSpec {
    /// Number of PostgreSQL instances: one primary and `replicas - 1` streaming replicas.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 10))]
    pub replicas: i32,
    /// PostgreSQL major version. It can go up (an upgrade) but never down.
    #[serde(default = "default_postgres_version")]
    #[x_kube(validation = Rule::new("int(self) >= int(oldSelf)").message("cannot be lowered: a PostgreSQL major version downgrade is not possible"))]
    pub postgres_version: PostgresVersion,
    /// Each instance's data volume.
    pub storage: StorageSpec,
    /// CPU and memory requests and limits of the PostgreSQL container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Backups: when they run, how long they are kept and where they are stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupSpec>,
    /// Labels a node must have to run this cluster's pods, as the pod spec's `nodeSelector`:
    /// applied to the instance pods and to the cluster's backup and restore Job pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints this cluster's pods tolerate, as the pod spec's `tolerations`: applied to the
    /// instance pods and to the cluster's backup and restore Job pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Node affinity and pod (anti-)affinity of this cluster's pods, as the pod spec's
    /// `affinity` (for example to spread instances over zones): applied to the instance pods and
    /// to the cluster's backup and restore Job pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// PostgreSQL server settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgresql: Option<PostgreSQLSettings>,
    /// How the new cluster starts: an empty database with an application role and database
    /// (`initdb`, the default when unset), or a backup: once its primary is up, the backup is
    /// restored into it (replacing the databases it contains), and the cluster becomes Ready
    /// only after the restore succeeded. Immutable: it can only be set at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<Bootstrap>,
    /// Whether the superuser `postgres` may log in over the network with its password (from
    /// the `<cluster>-postgresql-credentials` Secret). Off by default: applications use the
    /// application role (the `<cluster>-app` Secret), and pgkube's own tools log in as the
    /// superuser with the client certificate the operator issues.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enable_superuser_access: bool,
    /// The cluster's NetworkPolicy: PostgreSQL's port open to the cluster's namespace (and to
    /// `postgresFrom`), the instance managers' port to the operator's namespace and the
    /// cluster's own pods. Unset: made, with no other peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<NetworkPolicySettings>,
    /// A server certificate of one's own (for example from cert-manager) instead of the one
    /// pgkube issues. Unset: pgkube issues and renews it. It may be added to a running cluster
    /// (its pods are replaced, the primary last, after a switchover), but not changed or
    /// removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificates: Option<ServerCertificates>,
    /// Failover and synchronous replication. Unset: automatic failover after
    /// `failoverDelaySeconds` (5), asynchronous replication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_availability: Option<HighAvailability>,
    /// How the instances are spread over nodes. Unset: each instance prefers a node without
    /// another instance of the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<InstanceSpread>,
    /// How the primary's pod is replaced when the pod template changes, once every replica
    /// runs the new one: `unsupervised` (the default), by a switchover to the best updated
    /// replica; `supervised`, by a switchover the user asks for (the
    /// `db.example.com/switchover-to` annotation), which the Progressing condition waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_update_strategy: Option<PrimaryUpdateStrategy>,
    /// The Kubernetes ServiceAccount this cluster's pods run as (the instances, and the
    /// cluster's backup and restore Jobs), for storage credentials that come from the pod's
    /// identity (IAM roles for service accounts, EKS Pod Identity) rather than key Secrets.
    /// pgkube does not create it. Unset: the namespace's `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$') && size(self) <= 253").message("must be a ServiceAccount name: lowercase letters, digits, '-' and '.', at most 253 characters"))]
    pub service_account_name: Option<String>,
    /// Metrics of the instances beyond pgkube's own (port 9187, `/metrics`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitoring: Option<Monitoring>,
}

fn default_replicas() -> i32 {
    3
}

fn default_postgres_version() -> PostgresVersion {
    PostgresVersion::V16
}

/// The data volume of each instance.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)").message("storageClassName is immutable: the data volumes keep the class they were made with"))]
pub struct StorageSpec {
    /// Size of the volume, in whole gibibytes, for example `100Gi`.
    #[schemars(regex(pattern = r"^[0-9]+Gi$"))]
    pub size: String,
    /// StorageClass of the volumes; the cluster's default class when unset. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_class_name: Option<String>,
}

/// A cluster's backups, grouped by concern: `schedule` says when scheduled backups run,
/// `retention` how long backups are kept, `storage` where they go and `compression` how they are
/// compressed (both also for on-demand backups). `storage` has one member per kind of store, so that other stores can be added
/// beside `s3` later without moving fields again.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// When scheduled backups run.
    pub schedule: BackupSchedule,
    /// How long backups are kept.
    #[serde(default)]
    pub retention: RetentionPolicy,
    /// Where backups are stored. Scheduled backups cannot run without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<BackupStorage>,
    /// How this cluster's backups compress their dumps: its scheduled backups, and its
    /// on-demand backups that do not set their own. Unset: zstd at level 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<BackupCompression>,
    /// What the scheduled backups take: `Logical` (pg_dump) or `Physical` (a base backup, which
    /// needs WAL archiving). Unset: `Logical`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<BackupMethod>,
    /// Continuous archiving of the primary's WAL to the storage. Unset: on, when there is
    /// storage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_archiving: Option<WalArchiving>,
}

/// When scheduled backups run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupSchedule {
    /// A standard 5-field cron expression (minute hour day-of-month month day-of-week), for
    /// example `0 3 * * *` for 03:00 every day. There is no seconds field.
    #[schemars(regex(pattern = r"^\s*([0-9A-Za-z*?/,-]+\s+){4}[0-9A-Za-z*?/,-]+\s*$"))]
    pub cron: String,
    /// IANA time zone the schedule is read in, for example `Europe/Paris`. Defaults to UTC.
    /// A name of the right form that is not in the time zone database shows in the cluster's
    /// `BackupScheduled` condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 64),
        regex(pattern = r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$")
    )]
    pub time_zone: Option<String>,
    /// Pause scheduled backups (on-demand backups still run).
    #[serde(default)]
    pub suspend: bool,
}

/// How long backups are kept.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetentionPolicy {
    /// Backups older than this many days are deleted; the newest completed backup is always kept.
    #[serde(default = "default_retention_days")]
    #[schemars(range(min = 1, max = 90))]
    pub days: i32,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        Self {
            days: default_retention_days(),
        }
    }
}

fn default_retention_days() -> i32 {
    7
}

/// How a new cluster starts: initdb, with the application role and database it names; or a
/// backup: a PostgreSQLBackup, or a backup given by its storage and manifest key (for example
/// one made by another Kubernetes cluster), restored logically; or a point-in-time recovery
/// from a physical backup and the WAL archive.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(BOOTSTRAP_ONE_OF_RULE).message(BOOTSTRAP_ONE_OF_MESSAGE))]
pub struct Bootstrap {
    /// A Completed PostgreSQLBackup in the same namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<LocalReference>,
    /// A backup located directly in storage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<RestoreSource>,
    /// Point-in-time recovery from a physical base backup and the WAL archive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<super::storage::Recovery>,
    /// A new, empty database made by initdb, with an application role owning an application
    /// database. The default when `bootstrap` is unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initdb: Option<crate::cluster::Initdb>,
}
