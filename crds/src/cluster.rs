//! `PostgreSQLCluster`: the desired PostgreSQL instance set and its observed state.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, ResourceRequirements, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::archiving::{WalArchiving, WalArchivingStatus};
use crate::backup::{BackupCompression, BackupMethod};
use crate::common::{LocalReference, S3Storage, conditions_schema};
use crate::restore::RestoreSource;

/// Desired state of a PostgreSQL cluster.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "db.example.com",
    version = "v1alpha1",
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
    /// Number of PostgreSQL instances.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 10))]
    pub replicas: i32,
    /// PostgreSQL major version. It can go up (an upgrade) but never down.
    #[serde(default = "default_version")]
    #[x_kube(validation = Rule::new("int(self) >= int(oldSelf)").message("cannot be lowered: a PostgreSQL major version downgrade is not possible"))]
    pub version: PostgresVersion,
    /// Size of each instance's data volume, in whole gibibytes, for example `100Gi`.
    #[schemars(regex(pattern = r"^[0-9]+Gi$"))]
    pub storage: String,
    /// CPU and memory requests and limits of the PostgreSQL container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Scheduled backups to S3-compatible storage, with retention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupConfig>,
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

/// How the operator keeps a cluster of several instances writable, and what a failover may
/// lose. The same in v1alpha1 and v1beta1.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(FENCE_BEFORE_FAILOVER_RULE).message(FENCE_BEFORE_FAILOVER_MESSAGE))]
pub struct HighAvailability {
    /// How long the primary may be unreachable or not ready before the operator promotes the
    /// ready replica with the most WAL. Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub failover_delay_seconds: Option<u32>,
    /// How long the primary of a cluster of several instances may be cut off from both the
    /// API server and every replica before it fences itself: its instance manager stops the
    /// server at once, so that no client writes to it while another instance may be promoted.
    /// Default 3. When set, `failoverDelaySeconds` must be at least this plus
    /// [`FENCE_MARGIN_SECONDS`] (2), so that a cut-off primary has stopped before a failover
    /// away from it is decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub isolation_timeout_seconds: Option<u32>,
    /// Synchronous replication: a commit returns only once this many standbys have flushed
    /// it, so that a failover loses no acknowledged commit. Unset: asynchronous replication,
    /// where a failover can lose the last commits the replicas had not received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synchronous: Option<SynchronousReplication>,
}

/// Default of [`HighAvailability::failover_delay_seconds`].
pub const DEFAULT_FAILOVER_DELAY_SECONDS: u32 = 5;
/// Default of [`HighAvailability::isolation_timeout_seconds`].
pub const DEFAULT_ISOLATION_TIMEOUT_SECONDS: u32 = 3;
/// The least time between a cut-off primary fencing itself and a failover away from it: the
/// instance manager looks at its contacts four times a second and stops the server at once,
/// while the operator's clock for the failover delay starts up to a second early (a
/// condition's time is kept to the second).
pub const FENCE_MARGIN_SECONDS: u32 = 2;
/// With an isolation timeout set: the failover delay (or its default) leaves the margin.
const FENCE_BEFORE_FAILOVER_RULE: &str = "!has(self.isolationTimeoutSeconds) || (has(self.failoverDelaySeconds) ? self.failoverDelaySeconds : 5) >= self.isolationTimeoutSeconds + 2";
const FENCE_BEFORE_FAILOVER_MESSAGE: &str = "failoverDelaySeconds (default 5) must be at least isolationTimeoutSeconds + 2, so that a cut-off primary has fenced itself before another instance is promoted";

impl HighAvailability {
    /// The failover delay in seconds, with its default.
    pub fn failover_delay_seconds(high_availability: Option<&Self>) -> u32 {
        high_availability
            .and_then(|ha| ha.failover_delay_seconds)
            .unwrap_or(DEFAULT_FAILOVER_DELAY_SECONDS)
    }

    /// The isolation timeout in seconds, with its default.
    pub fn isolation_timeout_seconds(high_availability: Option<&Self>) -> u32 {
        high_availability
            .and_then(|ha| ha.isolation_timeout_seconds)
            .unwrap_or(DEFAULT_ISOLATION_TIMEOUT_SECONDS)
    }
}

/// How many standbys must confirm each commit. The operator asks for as many as are
/// streaming, within `[minStandbys, maxStandbys]`: with fewer than `minStandbys` streaming,
/// commits wait.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.minStandbys <= self.maxStandbys").message("minStandbys cannot be more than maxStandbys"))]
pub struct SynchronousReplication {
    /// Standbys that must confirm every commit, even when fewer are streaming (commits then
    /// wait). At least 1.
    #[schemars(range(min = 1, max = 9))]
    pub min_standbys: u32,
    /// Most standbys asked to confirm a commit.
    #[schemars(range(min = 1, max = 9))]
    pub max_standbys: u32,
}

/// How a cluster's instances are spread over nodes and zones. The same in v1alpha1 and
/// v1beta1.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceSpread {
    /// How strongly two instances of the cluster avoid one node (`kubernetes.io/hostname`), as
    /// a pod anti-affinity of the instance pods. `Preferred` (the default): the scheduler puts
    /// them on different nodes when it can, and on one node when it cannot. `Required`: an
    /// instance that finds no node of its own stays Pending. `Disabled`: no anti-affinity.
    /// Cannot be set together with `affinity.podAntiAffinity`, which replaces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_anti_affinity: Option<NodeAntiAffinity>,
    /// Topology spread constraints of the instance pods, as the pod spec's
    /// `topologySpreadConstraints` (for example `maxSkew: 1` over
    /// `topology.kubernetes.io/zone`). A constraint without a `labelSelector` counts this
    /// cluster's instances.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
}

/// See [`PostgreSQLClusterSpec::primary_update_strategy`]. The same in v1alpha1 and v1beta1.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PrimaryUpdateStrategy {
    #[default]
    Unsupervised,
    Supervised,
}

/// See [`InstanceSpread::node_anti_affinity`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum NodeAntiAffinity {
    #[default]
    Preferred,
    Required,
    Disabled,
}

impl InstanceSpread {
    /// The node anti-affinity of `spread`, with its default.
    pub fn node_anti_affinity(spread: Option<&Self>) -> NodeAntiAffinity {
        spread
            .and_then(|spread| spread.node_anti_affinity)
            .unwrap_or_default()
    }
}

/// `spread.nodeAntiAffinity` and `affinity.podAntiAffinity` both say how instances avoid each
/// other.
pub const ONE_ANTI_AFFINITY_RULE: &str = "!has(self.spread) || !has(self.spread.nodeAntiAffinity) || !has(self.affinity) || !has(self.affinity.podAntiAffinity)";
pub const ONE_ANTI_AFFINITY_MESSAGE: &str = "spread.nodeAntiAffinity cannot be set with affinity.podAntiAffinity: the pod anti-affinity given replaces the default one, so set only one of them";

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
    pub recovery: Option<crate::recovery::Recovery>,
    /// A new, empty database made by initdb, with an application role owning an application
    /// database. The default when `bootstrap` is unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initdb: Option<Initdb>,
}

/// Which connections reach a cluster's pods (`spec.networkPolicy`). The same in v1alpha1 and
/// v1beta1.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySettings {
    /// Whether pgkube makes the NetworkPolicy `<cluster>-postgresql`; false deletes it.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Who else may connect to PostgreSQL (port 5432), as NetworkPolicy peers (pods of other
    /// namespaces, address blocks). The pods of the cluster's namespace always may.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub postgres_from: Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer>,
}

/// What the instances' metrics port serves beyond pgkube's own metrics. The same in v1alpha1
/// and v1beta1.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Monitoring {
    /// A ConfigMap key holding custom queries in postgres_exporter's queries format; each
    /// instance runs them at every scrape, as the superuser in the `postgres` database, and
    /// serves their rows as `<query>_<column>` metrics. A change of the ConfigMap is read at the
    /// next scrape after the kubelet refreshed the file; a missing ConfigMap or an invalid file
    /// is `pgkube_postgres_custom_queries_valid 0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_queries: Option<k8s_openapi::api::core::v1::ConfigMapKeySelector>,
}

/// A server certificate of one's own, in Secrets of the cluster's namespace. The same in
/// v1alpha1 and v1beta1.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerCertificates {
    /// A `kubernetes.io/tls` Secret with the server's `tls.crt` and `tls.key`. The certificate
    /// must name the cluster's Services (`<cluster>-rw`, `<cluster>-ro`, `<cluster>-r`, as
    /// `<service>.<namespace>.svc`) and its pods (`*.<cluster>-postgresql-headless.<namespace>.svc`),
    /// or replicas, Jobs and the operator refuse it. A new content of the Secret (a renewal) is
    /// loaded without a restart.
    #[serde(rename = "serverTLSSecret")]
    #[schemars(length(min = 1, max = 253))]
    pub server_tls_secret: String,
    /// A Secret with the `ca.crt` that signed it, with which clients, replicas, backup Jobs and
    /// the operator verify the server. Unset: the `ca.crt` of `serverTLSSecret`, where
    /// cert-manager writes it.
    #[serde(
        rename = "serverCASecret",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 253))]
    pub server_ca_secret: Option<String>,
    /// A Secret with the `ca.crt` of the client certificates applications present. With it,
    /// a remote login needs, besides its password, a client certificate signed by this CA
    /// (or pgkube's) whose common name is the role's name (`pg_hba`: `scram-sha-256
    /// clientcert=verify-full`), once every instance has the CA. pgkube's own logins
    /// (replication, its tools) keep their certificates from pgkube's CA.
    #[serde(
        rename = "clientCASecret",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 253))]
    pub client_ca_secret: Option<String>,
}

fn default_true() -> bool {
    true
}

impl Default for NetworkPolicySettings {
    fn default() -> Self {
        Self {
            enabled: true,
            postgres_from: Vec::new(),
        }
    }
}

/// `spec.bootstrap` names exactly one way to start.
pub const BOOTSTRAP_ONE_OF_RULE: &str = "[has(self.backup), has(self.source), has(self.recovery), has(self.initdb)].filter(x, x).size() == 1";
pub const BOOTSTRAP_ONE_OF_MESSAGE: &str =
    "exactly one of backup, source, recovery and initdb must be set";

/// The application database and its owner, made on the primary once its database exists (by
/// initdb or a restore); the role's password is generated into the `<cluster>-app` Secret.
/// The same in v1alpha1 and v1beta1.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Initdb {
    /// The application database.
    #[serde(default = "default_application_name")]
    #[schemars(regex(pattern = r"^[a-z_][a-z0-9_]{0,62}$"))]
    #[x_kube(validation = Rule::new("!(self in ['postgres', 'template0', 'template1'])").message("names a database PostgreSQL makes itself; choose another"))]
    pub database: String,
    /// The role that owns it and that applications log in as.
    #[serde(default = "default_application_name")]
    #[schemars(regex(pattern = r"^[a-z_][a-z0-9_]{0,62}$"))]
    #[x_kube(validation = Rule::new("!(self in ['postgres', 'streaming_replica']) && !self.startsWith('pg_')").message("names a role pgkube or PostgreSQL owns; choose another"))]
    pub owner: String,
}

/// Name of the application database and of its owner unless `spec.bootstrap.initdb` says.
pub const DEFAULT_APPLICATION_NAME: &str = "app";

fn default_application_name() -> String {
    DEFAULT_APPLICATION_NAME.to_owned()
}

impl Default for Initdb {
    fn default() -> Self {
        Self {
            database: default_application_name(),
            owner: default_application_name(),
        }
    }
}

/// A certificate of one's own may be added to a running cluster, whose pods trust both pgkube's
/// CA and the user's while they are replaced, but neither changed nor removed: the pods made
/// after would not trust the CA of the certificate the primary still serves.
pub const CERTIFICATES_KEPT_RULE: &str = "!has(oldSelf.certificates) || (has(self.certificates) && self.certificates == oldSelf.certificates)";
pub const CERTIFICATES_KEPT_MESSAGE: &str = "certificates can be added to a running cluster but not changed or removed: its running pods trust only the CA they were made with. Put a renewed certificate in the same Secret instead, as cert-manager does";

/// Synchronous replication needs as many replicas as the standbys it asks for at least.
pub const SYNCHRONOUS_FITS_RULE: &str = "!has(self.highAvailability) || !has(self.highAvailability.synchronous) || self.highAvailability.synchronous.minStandbys < self.replicas";
pub const SYNCHRONOUS_FITS_MESSAGE: &str = "highAvailability.synchronous.minStandbys must be less than replicas: the primary does not confirm its own commits, so commits would wait forever";

/// Parameters pgkube sets itself: where the server listens, where its files are, where it logs,
/// what streaming replication, failover, synchronous replication, WAL archiving and recovery
/// need, and the password hashing its `pg_hba.conf` expects.
pub const MANAGED_PARAMETERS: &[&str] = &[
    "listen_addresses",
    "port",
    "data_directory",
    "config_file",
    "hba_file",
    "ident_file",
    "external_pid_file",
    "unix_socket_directories",
    "logging_collector",
    "log_destination",
    "wal_level",
    "hot_standby",
    "max_wal_senders",
    "max_replication_slots",
    "wal_log_hints",
    "wal_receiver_status_interval",
    "archive_mode",
    "archive_command",
    "archive_library",
    "cluster_name",
    "password_encryption",
    "synchronous_standby_names",
    "primary_conninfo",
    "primary_slot_name",
    "restore_command",
    "archive_cleanup_command",
    "recovery_end_command",
    "recovery_target",
    "recovery_target_action",
    "recovery_target_inclusive",
    "recovery_target_lsn",
    "recovery_target_name",
    "recovery_target_time",
    "recovery_target_timeline",
    "recovery_target_xid",
    "promote_trigger_file",
];

/// Parameters that, changed from their defaults, can lose or corrupt data on a crash or hide
/// corruption.
pub const DURABILITY_PARAMETERS: &[&str] = &[
    "fsync",
    "full_page_writes",
    "data_sync_retry",
    "ignore_checksum_failure",
    "zero_damaged_pages",
];

/// TLS parameters: pgkube turns TLS on and names its files itself.
pub const TLS_PARAMETERS: &[&str] = &[
    "ssl",
    "ssl_ca_file",
    "ssl_cert_file",
    "ssl_crl_dir",
    "ssl_crl_file",
    "ssl_dh_params_file",
    "ssl_key_file",
    "ssl_passphrase_command",
    "ssl_passphrase_command_supports_reload",
];

/// `postgresql.conf` directives that read settings from other files.
pub const INCLUDE_DIRECTIVES: &[&str] = &["include", "include_dir", "include_if_exists"];

/// Every group of parameters `spec.postgresql.parameters` cannot set, with why. The CRD's
/// admission rules list the same names, a rule per group; a test keeps them in step.
pub const REFUSED_PARAMETERS: &[(&[&str], &str)] = &[
    (MANAGED_PARAMETERS, "pgkube sets them itself"),
    (
        DURABILITY_PARAMETERS,
        "changed from their defaults they can lose or corrupt data on a crash, or hide corruption",
    ),
    (
        TLS_PARAMETERS,
        "pgkube sets up TLS itself, with the certificates it issues for the cluster",
    ),
    (
        INCLUDE_DIRECTIVES,
        "they read settings from files pgkube does not write",
    ),
];

pub const MANAGED_PARAMETERS_RULE: &str = "self.all(name, !(name in ['listen_addresses', 'port', 'data_directory', 'config_file', 'hba_file', 'ident_file', 'external_pid_file', 'unix_socket_directories', 'logging_collector', 'log_destination', 'wal_level', 'hot_standby', 'max_wal_senders', 'max_replication_slots', 'wal_log_hints', 'wal_receiver_status_interval', 'archive_mode', 'archive_command', 'archive_library', 'cluster_name', 'password_encryption', 'synchronous_standby_names', 'primary_conninfo', 'primary_slot_name', 'restore_command', 'archive_cleanup_command', 'recovery_end_command', 'recovery_target', 'recovery_target_action', 'recovery_target_inclusive', 'recovery_target_lsn', 'recovery_target_name', 'recovery_target_time', 'recovery_target_timeline', 'recovery_target_xid', 'promote_trigger_file']))";
pub const MANAGED_PARAMETERS_MESSAGE: &str = "sets a parameter that spec.postgresql.parameters cannot set, since pgkube sets them itself: listen_addresses, port, data_directory, config_file, hba_file, ident_file, external_pid_file, unix_socket_directories, logging_collector, log_destination, wal_level, hot_standby, max_wal_senders, max_replication_slots, wal_log_hints, wal_receiver_status_interval, archive_mode, archive_command, archive_library, cluster_name, password_encryption, synchronous_standby_names, primary_conninfo, primary_slot_name, restore_command, archive_cleanup_command, recovery_end_command, recovery_target, recovery_target_action, recovery_target_inclusive, recovery_target_lsn, recovery_target_name, recovery_target_time, recovery_target_timeline, recovery_target_xid, promote_trigger_file";
pub const DURABILITY_PARAMETERS_RULE: &str = "self.all(name, !(name in ['fsync', 'full_page_writes', 'data_sync_retry', 'ignore_checksum_failure', 'zero_damaged_pages']))";
pub const DURABILITY_PARAMETERS_MESSAGE: &str = "sets a parameter that spec.postgresql.parameters cannot set, since changed from their defaults they can lose or corrupt data on a crash, or hide corruption: fsync, full_page_writes, data_sync_retry, ignore_checksum_failure, zero_damaged_pages";
pub const TLS_PARAMETERS_RULE: &str = "self.all(name, !(name in ['ssl', 'ssl_ca_file', 'ssl_cert_file', 'ssl_crl_dir', 'ssl_crl_file', 'ssl_dh_params_file', 'ssl_key_file', 'ssl_passphrase_command', 'ssl_passphrase_command_supports_reload']))";
pub const TLS_PARAMETERS_MESSAGE: &str = "sets a parameter that spec.postgresql.parameters cannot set, since pgkube sets up TLS itself, with the certificates it issues for the cluster: ssl, ssl_ca_file, ssl_cert_file, ssl_crl_dir, ssl_crl_file, ssl_dh_params_file, ssl_key_file, ssl_passphrase_command, ssl_passphrase_command_supports_reload";
pub const INCLUDE_DIRECTIVES_RULE: &str =
    "self.all(name, !(name in ['include', 'include_dir', 'include_if_exists']))";
pub const INCLUDE_DIRECTIVES_MESSAGE: &str = "sets a parameter that spec.postgresql.parameters cannot set, since they read settings from files pgkube does not write: include, include_dir, include_if_exists";

/// PostgreSQL server settings of a cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostgreSQLSettings {
    /// `postgresql.conf` parameters by name, for example `work_mem: 16MB`. They take precedence
    /// over pgkube's own settings (`shared_buffers` included). A change reaches the running
    /// instances without rolling the pods: each instance reloads its server, or restarts it when
    /// the parameter needs a restart. Refused, each group with why in the admission message:
    /// the parameters pgkube sets itself (where the server listens and keeps its files, logging,
    /// replication, synchronous replication, WAL archiving and recovery, password_encryption;
    /// `archive_timeout` may be set), the ones that risk data on a crash (fsync,
    /// full_page_writes...), the TLS files and switch, and include directives.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "parameters_schema")]
    #[x_kube(
        validation = Rule::new(MANAGED_PARAMETERS_RULE).message(MANAGED_PARAMETERS_MESSAGE),
        validation = Rule::new(DURABILITY_PARAMETERS_RULE).message(DURABILITY_PARAMETERS_MESSAGE),
        validation = Rule::new(TLS_PARAMETERS_RULE).message(TLS_PARAMETERS_MESSAGE),
        validation = Rule::new(INCLUDE_DIRECTIVES_RULE).message(INCLUDE_DIRECTIVES_MESSAGE),
        validation = Rule::new("self.all(name, !self[name].contains('\\n'))").message("parameter values must be a single line")
    )]
    pub parameters: BTreeMap<String, String>,
}

/// At most 200 parameters of at most 1024 characters: bounds that keep the admission rules
/// within the API server's CEL cost budget.
fn parameters_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": 200,
        "additionalProperties": { "type": "string", "maxLength": 1024 },
    })
}

fn default_replicas() -> i32 {
    3
}

fn default_version() -> PostgresVersion {
    PostgresVersion::V16
}

/// Supported PostgreSQL major versions.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum PostgresVersion {
    #[serde(rename = "14")]
    V14,
    #[serde(rename = "15")]
    V15,
    #[serde(rename = "16")]
    V16,
    #[serde(rename = "17")]
    V17,
    #[serde(rename = "18")]
    V18,
}

impl PostgresVersion {
    /// The major version number, for example `16`.
    pub fn major(self) -> u32 {
        match self {
            Self::V14 => 14,
            Self::V15 => 15,
            Self::V16 => 16,
            Self::V17 => 17,
            Self::V18 => 18,
        }
    }
}

impl std::fmt::Display for PostgresVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.major())
    }
}

/// Scheduled backups of a cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupConfig {
    /// When to back up, as a standard 5-field cron expression (minute hour day-of-month month
    /// day-of-week), for example `0 3 * * *` for 03:00 every day. There is no seconds field.
    #[schemars(regex(pattern = r"^\s*([0-9A-Za-z*?/,-]+\s+){4}[0-9A-Za-z*?/,-]+\s*$"))]
    pub schedule: String,
    /// IANA time zone the schedule is read in, for example `Europe/Paris`. Defaults to UTC.
    /// A name of the right form that is not in the time zone database shows in the cluster's
    /// `BackupScheduled` condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 64),
        regex(pattern = r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$")
    )]
    pub time_zone: Option<String>,
    /// Backups older than this many days are deleted; the newest completed backup is always kept.
    #[serde(default = "default_retention_days")]
    #[schemars(range(min = 1, max = 90))]
    pub retention_days: i32,
    /// Where backups are stored. Scheduled backups cannot run without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Storage>,
    /// Pause scheduled backups (on-demand backups still run).
    #[serde(default)]
    pub suspend: bool,
    /// How this cluster's backups compress their dumps: its scheduled backups, and its
    /// on-demand backups that do not set their own. Unset: zstd at level 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<BackupCompression>,
    /// What the scheduled backups take: `Logical` (pg_dump) or `Physical` (a base backup, which
    /// needs WAL archiving). Unset: `Logical`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<BackupMethod>,
    /// Continuous archiving of the primary's WAL to `s3`. Unset: on, when there is storage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_archiving: Option<WalArchiving>,
}

fn default_retention_days() -> i32 {
    7
}

/// Observed state of a PostgreSQL cluster, written only by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostgreSQLClusterStatus {
    /// Overall phase: Pending, Creating, Running, Scaling, Upgrading, Degraded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ClusterPhase>,
    /// Number of instances that are ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// PostgreSQL version the instances run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    /// Pod name of the primary, set once its instance manager reported it as the primary. The
    /// `<cluster>-rw` Service routes to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_primary: Option<String>,
    /// Pod name of the instance being made the primary by a switchover or a failover, until
    /// it reports itself as one (then it is `currentPrimary`). The operator records it before
    /// it acts, so that a new leader carries the change through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_primary: Option<String>,
    /// The last switchover or failover: when, from which pod to which, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_change: Option<PrimaryChange>,
    /// Each instance as its instance manager last reported it, by pod name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<InstanceStatus>,
    /// The PostgreSQL system identifier of the cluster's database, recorded from the first
    /// primary that reported it and never changed: instances copy data only from an instance
    /// that holds this database, and an instance with an empty volume never makes a new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_identifier: Option<String>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Standard conditions: Ready, Progressing, ReplicasStreaming, BackupComplete, Restoring,
    /// ContinuousArchiving and WALDiskPressure, and Bootstrapped for a cluster started from a
    /// backup.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// When the last scheduled backup was started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scheduled_backup: Option<Time>,
    /// When the next scheduled backup is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_scheduled_backup: Option<Time>,
    /// Name of the newest Completed backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_backup: Option<String>,
    /// Continuous WAL archiving, as the primary last reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_archiving: Option<WalArchivingStatus>,
    /// The moments a point-in-time recovery of this cluster can reach, with WAL archiving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recoverability: Option<Recoverability>,
    /// The last in-place point-in-time recovery: its step, or how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place_recovery: Option<crate::recovery::InPlaceRecovery>,
}

/// The window of point-in-time recovery: from the end of the oldest Completed physical backup
/// to the last WAL file archived. Any moment in it can be a recovery's `target.time`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Recoverability {
    /// The WAL archive's root in the bucket: a recovery's `source.archive`.
    pub archive: String,
    /// The earliest moment: when the oldest Completed physical backup completed. Absent until
    /// one has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_point: Option<Time>,
    /// That backup: a recovery's `backup.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_backup: Option<String>,
    /// The latest moment: when the last WAL file was archived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_point: Option<Time>,
}

/// One PostgreSQL instance (pod) of a cluster, as its instance manager reported it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    /// Pod name.
    pub name: String,
    /// What the instance is: primary, replica, or unknown (starting, or its instance manager
    /// did not answer).
    pub role: InstanceRole,
    /// The instance manager reports its server ready for connections.
    pub ready: bool,
    /// PostgreSQL timeline the instance is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<i64>,
    /// Replicas: bytes of WAL the primary has written that this replica has not replayed yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_bytes: Option<i64>,
    /// Replicas: whether WAL is streaming from the primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streaming: Option<bool>,
    /// Why an instance whose server does not run waits, as its instance manager says (for
    /// example, data it will not replace with a copy of another database).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A move of the primary from one instance to another.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrimaryChange {
    /// Switchover (asked for) or Failover (the primary was lost).
    pub kind: PrimaryChangeKind,
    /// The primary before the change.
    pub from: String,
    /// The instance made the primary.
    pub to: String,
    /// Why: who asked, or what was wrong with the old primary.
    pub reason: String,
    /// When the operator decided it.
    pub started_at: Time,
    /// When the new primary first reported itself as one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// The decision's term: one more than the previous change's. Every command the operator
    /// sends to carry it out bears it, and an instance manager refuses a command of a term
    /// older than one it has seen (a command that waited in a queue while a newer decision
    /// was taken).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<i64>,
}

/// Kind of a [`PrimaryChange`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum PrimaryChangeKind {
    Switchover,
    Failover,
}

impl PrimaryChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Switchover => "Switchover",
            Self::Failover => "Failover",
        }
    }
}

/// Role of an instance.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum InstanceRole {
    Primary,
    Replica,
    Unknown,
}

impl InstanceRole {
    /// The role as the status spells it: `primary`, `replica` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Primary => "primary",
            Self::Replica => "replica",
            Self::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for InstanceRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Phase of a cluster.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ClusterPhase {
    Pending,
    Creating,
    Running,
    Scaling,
    Upgrading,
    Degraded,
    Failed,
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;

    #[test]
    fn instance_roles_are_spelled_as_in_the_status() {
        for role in [
            InstanceRole::Primary,
            InstanceRole::Replica,
            InstanceRole::Unknown,
        ] {
            let json = serde_json::to_value(role).expect("JSON");
            assert_eq!(json.as_str(), Some(role.as_str()));
            assert_eq!(role.to_string(), role.as_str());
        }
    }

    /// Each group of refused parameters has an admission rule that names each of them, and no
    /// other, with the group's reason.
    #[test]
    fn the_admission_rules_refuse_exactly_the_refused_parameters() {
        let crd = serde_json::to_value(PostgreSQLCluster::crd()).expect("CRD as JSON");
        let rules = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["postgresql"]["properties"]["parameters"]["x-kubernetes-validations"];
        let listing: Vec<(Vec<&str>, &str)> = rules
            .as_array()
            .expect("validation rules")
            .iter()
            .filter_map(|r| Some((r["rule"].as_str()?, r["message"].as_str()?)))
            .filter(|(rule, _)| rule.contains(" in ["))
            .map(|(rule, message)| {
                let listed = rule
                    .split('[')
                    .nth(1)
                    .and_then(|list| list.split(']').next())
                    .expect("a list")
                    .split(',')
                    .map(|name| name.trim().trim_matches('\''))
                    .collect();
                (listed, message)
            })
            .collect();
        assert_eq!(listing.len(), REFUSED_PARAMETERS.len());
        for ((listed, message), (names, why)) in listing.iter().zip(REFUSED_PARAMETERS) {
            assert_eq!(listed, names);
            assert_eq!(
                *message,
                format!(
                    "sets a parameter that spec.postgresql.parameters cannot set, since {why}: {}",
                    names.join(", ")
                )
            );
        }
    }
}
