//! Build (pure): the children a validated cluster should have. No client, no I/O; the result
//! is applied by `apply`.
//!
//! Each PostgreSQL pod runs the instance manager as PID 1 of its `postgresql` container: an
//! init container copies `pgkube` from the operator's image into the `controller` volume, and
//! the container runs `/controller/pgkube instance run` in the stock PostgreSQL image. The
//! instance manager reads what the operator decided from mounted files: the ConfigMap
//! (`postgresql.conf`, `pg_hba.conf`, `instance.json` naming the primary), the superuser and the
//! replication Secrets. It reloads or restarts its server itself when the ConfigMap changes, so
//! a configuration change does not roll the pods; it serves its status on port
//! [`STATUS_PORT`], which the probes and the controller read.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, PersistentVolumeClaimSpec, PodSecurityContext, PodSpec,
    PodTemplateSpec, Secret, Service, ServicePort, ServiceSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::memory::MemorySettings;
use super::validate::ValidatedCluster;
use crate::names::{self, DNS_LABEL_MAX, DNS_SUBDOMAIN_MAX, NameKind, STATEFULSET_NAME_MAX};
use crate::pod::runtime_default_seccomp;

pub use super::instances::{METRICS_PORT, STATUS_PORT};

/// PostgreSQL's port.
pub const POSTGRES_PORT: i32 = 5432;
/// Annotation on the StatefulSet naming the PostgreSQL major version it runs.
pub const VERSION_ANNOTATION: &str = "db.example.com/postgres-version";
/// Annotation on the StatefulSet saying its pods mount the cluster's certificates (see
/// [`super::certificates::tls_only`]).
pub const TLS_ANNOTATION: &str = "db.example.com/tls";
/// Pod template annotation: the pods accept the applications' client CA
/// (`spec.certificates.clientCASecret`; see `certificates::client_certificates_required`).
pub const CLIENT_CA_ANNOTATION: &str = "db.example.com/client-ca";
/// Pod label naming the role an instance has (`primary` or `replica`), set by the controller
/// from what the instance manager reports; the `-rw` and `-ro` Services select on it.
pub const ROLE_LABEL: &str = "db.example.com/role";
/// Name of the data volume claim template; PVCs are `data-<statefulset>-N`.
pub const DATA_VOLUME: &str = "data";
/// Keys of the ConfigMap the instance manager reads.
pub const CONFIG_FILE: &str = "postgresql.conf";
pub const HBA_FILE: &str = "pg_hba.conf";
pub const INSTANCE_FILE: &str = "instance.json";
/// Keys of the credentials and replication Secrets.
pub const USERNAME_KEY: &str = "username";
pub const PASSWORD_KEY: &str = "password";
/// The role replicas connect as.
pub const REPLICATION_USER: &str = "streaming_replica";
/// uid and gid of `postgres` in the official image.
pub const POSTGRES_UID: i64 = 999;
/// Superuser of the official image.
pub const SUPERUSER: &str = "postgres";
const DATA_MOUNT: &str = "/var/lib/postgresql/data";
/// Volumes and where the PostgreSQL container mounts them.
const CONTROLLER_VOLUME: &str = "controller";
/// The init container that installs the instance manager.
pub const INSTALL_CONTAINER: &str = "install-instance-manager";
const CONTROLLER_MOUNT: &str = "/controller";
const CONFIG_VOLUME: &str = "config";
const CONFIG_MOUNT: &str = "/etc/pgkube/config";
const SUPERUSER_VOLUME: &str = "superuser";
const SUPERUSER_MOUNT: &str = "/etc/pgkube/superuser";
const REPLICATION_VOLUME: &str = "replication";
const REPLICATION_MOUNT: &str = "/etc/pgkube/replication";
/// The application role's Secret, optional: the instance manager makes the role and its
/// database once it is there.
const APPLICATION_VOLUME: &str = "application";
const APPLICATION_MOUNT: &str = "/etc/pgkube/application";
const CONTROL_VOLUME: &str = "control";
const CONTROL_MOUNT: &str = "/etc/pgkube/control";
/// Key of the control Secret: the token the operator presents to the instance managers'
/// control endpoints (promote, follow).
pub const CONTROL_TOKEN_KEY: &str = "token";
const SHM_VOLUME: &str = "shm";
/// The root filesystem is read-only: PostgreSQL's socket and lock file, and whatever a tool
/// writes to /tmp, go to emptyDirs.
const SOCKET_VOLUME: &str = "socket";
const SOCKET_MOUNT: &str = "/var/run/postgresql";
const TMP_VOLUME: &str = "tmp";
const TMP_MOUNT: &str = "/tmp";
/// The cluster's certificates (see [`super::certificates`]), as the instance manager reads them.
pub const TLS_VOLUME: &str = "tls";
const TLS_MOUNT: &str = "/etc/pgkube/tls";
/// Where the instance manager copies them, readable by itself only.
const TLS_RUNTIME_DIR: &str = "/controller/tls";
/// The instance manager, as the init container installs it.
const INSTANCE_MANAGER: &str = "/controller/pgkube";
/// Seconds between two runs of the startup and readiness probes: a restarted instance is back
/// behind its Services (rw after a crash of the primary) within seconds.
const READINESS_PERIOD_SECONDS: i32 = 2;
/// Seconds between two runs of the liveness probe.
const LIVENESS_PERIOD_SECONDS: i32 = 10;
/// Misses the startup probe allows: 1800 x 2 s = one hour for a crash recovery, or for the
/// clone of a big database, to finish.
const STARTUP_PROBE_FAILURES: i32 = 1800;
/// The kubelet's wait between SIGTERM and SIGKILL; the instance manager's shutdown timeout
/// ([`SHUTDOWN_TIMEOUT`]) leaves it 10 s to stop after its fast shutdown turned immediate.
const TERMINATION_GRACE_SECONDS: i64 = 60;
const SHUTDOWN_TIMEOUT: &str = "50s";

/// Names of a cluster's children, all within Kubernetes limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildNames {
    pub statefulset: String,
    pub headless_service: String,
    /// Service of the primary (`<cluster>-rw`).
    pub rw_service: String,
    /// Service of the streaming replicas (`<cluster>-ro`).
    pub ro_service: String,
    /// Service of every ready instance (`<cluster>-r`).
    pub r_service: String,
    /// The single client Service of earlier versions (`<cluster>-postgresql`), deleted when
    /// found.
    pub old_client_service: String,
    pub config_map: String,
    /// The superuser's credentials.
    pub secret: String,
    /// The application role's credentials and connection details (`<cluster>-app`).
    pub application_secret: String,
    /// The replication role's credentials.
    pub replication_secret: String,
    /// The token of the instance managers' control endpoints.
    pub control_secret: String,
    /// The cluster's CA (`ca.crt`, `ca.key`), see [`super::certificates`].
    pub ca_secret: String,
    /// The server certificate, and the client certificates of the replication role and of
    /// the superuser.
    pub server_tls_secret: String,
    pub replication_tls_secret: String,
    pub superuser_tls_secret: String,
    pub pod_disruption_budget: String,
    pub network_policy: String,
    /// Value of `app.kubernetes.io/instance`.
    pub instance_label: String,
}

impl ChildNames {
    /// The children's names for a cluster called `cluster`.
    pub fn for_cluster(cluster: &str) -> Self {
        let label = |suffix| names::child_name(cluster, suffix, NameKind::DnsLabel, DNS_LABEL_MAX);
        let subdomain =
            |suffix| names::child_name(cluster, suffix, NameKind::DnsSubdomain, DNS_SUBDOMAIN_MAX);
        Self {
            statefulset: names::child_name(
                cluster,
                "-postgresql",
                NameKind::DnsLabel,
                STATEFULSET_NAME_MAX,
            ),
            headless_service: label("-postgresql-headless"),
            rw_service: label("-rw"),
            ro_service: label("-ro"),
            r_service: label("-r"),
            old_client_service: label("-postgresql"),
            config_map: subdomain("-postgresql-config"),
            secret: subdomain("-postgresql-credentials"),
            application_secret: subdomain("-app"),
            replication_secret: subdomain("-postgresql-replication"),
            control_secret: subdomain("-postgresql-control"),
            ca_secret: subdomain("-ca"),
            server_tls_secret: subdomain("-server-tls"),
            replication_tls_secret: subdomain("-replication-tls"),
            superuser_tls_secret: subdomain("-superuser-tls"),
            pod_disruption_budget: subdomain("-postgresql"),
            network_policy: subdomain("-postgresql"),
            instance_label: names::label_value(cluster),
        }
    }

    /// Name of the data volume claim of pod `ordinal`.
    pub fn data_claim(&self, ordinal: i32) -> String {
        format!("{DATA_VOLUME}-{}-{ordinal}", self.statefulset)
    }
}

/// Everything a cluster should have. `apply` destructures it, so a child added here and not
/// applied there fails to compile.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredChildren {
    pub statefulset: StatefulSet,
    pub headless_service: Service,
    pub rw_service: Service,
    pub ro_service: Service,
    pub r_service: Service,
    pub config_map: ConfigMap,
    /// Created once if missing, never updated: it holds the generated superuser password.
    pub credentials: Secret,
    /// Created once if missing, never updated: it holds the generated replication password.
    pub replication_credentials: Secret,
    /// Created once if missing, never updated: the application role's generated password.
    pub application_credentials: Secret,
    /// Created once if missing, never updated: the generated control token. Owned by the
    /// cluster (it guards no data). Every cluster has one: the instance managers answer
    /// `/status` only to its bearer.
    pub control_token: Secret,
    /// Only with more than one replica; otherwise an existing one is deleted.
    pub pod_disruption_budget: Option<PodDisruptionBudget>,
    /// Unless turned off (`spec.networkPolicy.enabled`); otherwise an existing one is deleted.
    pub network_policy: Option<k8s_openapi::api::networking::v1::NetworkPolicy>,
}

/// What the children are built from besides the validated spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildInput<'a> {
    /// PostgreSQL image without tag (the tag is the major version).
    pub image_repository: &'a str,
    /// pgkube's image, whose init container installs the instance manager.
    pub instance_manager_image: &'a str,
    /// Pod name of the designated primary.
    pub primary: &'a str,
    /// Passwords for the Secrets, used only if they have to be created.
    pub superuser_password: &'a str,
    pub replication_password: &'a str,
    pub application_password: &'a str,
    /// Token for the control Secret, used only if it has to be created.
    pub control_token: &'a str,
    /// The namespace the operator runs in, if in a pod: the NetworkPolicy opens the instance
    /// managers' port to it.
    pub manager_namespace: Option<&'a str>,
    /// Standbys that must confirm each commit (`synchronous_standby_names`); 0: asynchronous.
    pub synchronous_standbys: u32,
    /// Every instance has its certificates: connections without TLS are refused (see
    /// [`super::certificates::tls_only`]).
    pub tls_only: bool,
    /// Every instance accepts the applications' client CA: remote logins need a client
    /// certificate (see [`super::certificates::client_certificates_required`]).
    pub client_certificates: bool,
    /// The cluster's database, once recorded (`status.systemIdentifier`).
    pub system_identifier: Option<&'a str>,
    /// What the first instance recovers (`spec.bootstrap.recovery`), until the cluster
    /// recorded its database.
    pub recovery: Option<&'a crate::storage::recovery::RecoveryOrder>,
    /// An in-place point-in-time recovery under way: what the instances do now (`recovery`
    /// is what the primary recovers).
    pub in_place: Option<&'a crate::storage::recovery::in_place::InPlaceOrder>,
}

/// The desired children of `cluster`.
pub fn build(cluster: &ValidatedCluster, input: &BuildInput<'_>) -> DesiredChildren {
    let names = ChildNames::for_cluster(&cluster.name);
    let client_service = |name: &str, role: Option<&str>| {
        let mut service = service(cluster, &names, name, false);
        if let (Some(role), Some(selector)) = (
            role,
            service.spec.as_mut().and_then(|s| s.selector.as_mut()),
        ) {
            selector.insert(ROLE_LABEL.to_owned(), role.to_owned());
        }
        service
    };
    DesiredChildren {
        statefulset: statefulset(cluster, &names, input),
        headless_service: service(cluster, &names, &names.headless_service, true),
        rw_service: client_service(&names.rw_service, Some(super::roles::PRIMARY)),
        ro_service: client_service(&names.ro_service, Some(super::roles::REPLICA)),
        r_service: client_service(&names.r_service, None),
        config_map: config_map(cluster, &names, input),
        credentials: kept_secret(
            cluster,
            &names,
            &names.secret,
            SUPERUSER,
            input.superuser_password,
        ),
        replication_credentials: kept_secret(
            cluster,
            &names,
            &names.replication_secret,
            REPLICATION_USER,
            input.replication_password,
        ),
        application_credentials: application::application_secret(
            cluster,
            &names,
            input.application_password,
        ),
        control_token: control_secret(cluster, &names, input.control_token),
        pod_disruption_budget: (cluster.replicas > 1)
            .then(|| pod_disruption_budget(cluster, &names)),
        network_policy: cluster.network_policy.as_ref().map(|postgres_from| {
            network_policy::network_policy(cluster, &names, postgres_from, input.manager_namespace)
        }),
    }
}

/// `app.kubernetes.io/*` labels on every child.
pub fn labels(names: &ChildNames) -> BTreeMap<String, String> {
    let mut labels = selector_labels(names);
    labels.insert(
        "app.kubernetes.io/managed-by".to_owned(),
        "pgkube".to_owned(),
    );
    labels
}

/// Labels that select a cluster's pods.
pub fn selector_labels(names: &ChildNames) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "postgresql".to_owned()),
        (
            "app.kubernetes.io/instance".to_owned(),
            names.instance_label.clone(),
        ),
    ])
}

/// Metadata of a child that outlives the cluster (its Secrets): labels, no owner.
pub fn kept_metadata(cluster: &ValidatedCluster, names: &ChildNames, name: &str) -> ObjectMeta {
    ObjectMeta {
        owner_references: None,
        ..metadata(cluster, names, name)
    }
}

fn metadata(cluster: &ValidatedCluster, names: &ChildNames, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(cluster.namespace.clone()),
        labels: Some(labels(names)),
        owner_references: Some(vec![cluster.owner.clone()]),
        ..ObjectMeta::default()
    }
}

fn pod_annotations(cluster: &ValidatedCluster) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::from([(TLS_ANNOTATION.to_owned(), "true".to_owned())]);
    let client_ca = cluster
        .server_certificates
        .as_ref()
        .and_then(|own| own.client_ca_secret.as_ref());
    if let Some(secret) = client_ca {
        annotations.insert(CLIENT_CA_ANNOTATION.to_owned(), secret.clone());
    }
    annotations
}

fn statefulset(
    cluster: &ValidatedCluster,
    names: &ChildNames,
    input: &BuildInput<'_>,
) -> StatefulSet {
    let mut meta = metadata(cluster, names, &names.statefulset);
    meta.annotations = Some(BTreeMap::from([
        (VERSION_ANNOTATION.to_owned(), cluster.version.to_string()),
        (TLS_ANNOTATION.to_owned(), "true".to_owned()),
    ]));
    StatefulSet {
        metadata: meta,
        spec: Some(StatefulSetSpec {
            replicas: Some(cluster.replicas),
            service_name: Some(names.headless_service.clone()),
            selector: LabelSelector {
                match_labels: Some(selector_labels(names)),
                ..LabelSelector::default()
            },
            // The operator replaces the pods of an old template itself (`rollout`): the
            // replicas one at a time, then the primary after a switchover.
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("OnDelete".to_owned()),
                ..StatefulSetUpdateStrategy::default()
            }),
            // Data is never deleted by the operator, not even when scaling down.
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some("Retain".to_owned()),
                    when_scaled: Some("Retain".to_owned()),
                },
            ),
            template: pod_template(cluster, names, input),
            volume_claim_templates: Some(vec![data_claim_template(cluster, names)]),
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    }
}

/// The pod template. It carries no hash of the configuration: the instance manager applies a
/// changed ConfigMap itself (reload, or restart of its server when a setting needs one).
fn pod_template(
    cluster: &ValidatedCluster,
    names: &ChildNames,
    input: &BuildInput<'_>,
) -> PodTemplateSpec {
    let mut pod = PodSpec {
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(POSTGRES_UID),
            run_as_group: Some(POSTGRES_UID),
            fs_group: Some(POSTGRES_UID),
            // Change the volume's group only when its root is not already right: a recursive
            // walk of a large data directory on every start would delay every restart.
            fs_group_change_policy: Some("OnRootMismatch".to_owned()),
            seccomp_profile: Some(runtime_default_seccomp()),
            ..PodSecurityContext::default()
        }),
        termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
        init_containers: Some(vec![install_container(input.instance_manager_image)]),
        containers: vec![postgres_container(cluster, input.image_repository)],
        volumes: Some(volumes(cluster, names)),
        // The identity storage credentials may come from (`spec.serviceAccountName`).
        service_account_name: cluster.service_account_name.clone(),
        ..PodSpec::default()
    };
    // Part of the template: a change rolls the pods like any other template change.
    cluster.scheduling.apply_to(&mut pod);
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(names)),
            // Each pod says it mounts the certificates, so that a roll from one template with
            // them to another stays TLS-only (see `certificates::tls_only`), and whether it
            // accepts the applications' client CA.
            annotations: Some(pod_annotations(cluster)),
            ..ObjectMeta::default()
        }),
        spec: Some(pod),
    }
}

fn data_claim_template(cluster: &ValidatedCluster, names: &ChildNames) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(DATA_VOLUME.to_owned()),
            labels: Some(labels(names)),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(cluster.claim_template_storage.clone()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            storage_class_name: cluster.storage_class_name.clone(),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

fn service(cluster: &ValidatedCluster, names: &ChildNames, name: &str, headless: bool) -> Service {
    Service {
        metadata: metadata(cluster, names, name),
        spec: Some(ServiceSpec {
            // The headless Service gives each pod a stable DNS name, ready or not, so that
            // instances can find each other while starting.
            cluster_ip: headless.then(|| "None".to_owned()),
            publish_not_ready_addresses: headless.then_some(true),
            selector: Some(selector_labels(names)),
            ports: Some(vec![ServicePort {
                name: Some("postgresql".to_owned()),
                port: POSTGRES_PORT,
                target_port: Some(IntOrString::String("postgresql".to_owned())),
                protocol: Some("TCP".to_owned()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn config_map(cluster: &ValidatedCluster, names: &ChildNames, input: &BuildInput<'_>) -> ConfigMap {
    ConfigMap {
        metadata: metadata(cluster, names, &names.config_map),
        data: Some(BTreeMap::from([
            (
                CONFIG_FILE.to_owned(),
                postgresql_conf(cluster, names, input.synchronous_standbys),
            ),
            (
                HBA_FILE.to_owned(),
                pg_hba(
                    input.tls_only,
                    cluster.superuser_access,
                    input.client_certificates,
                ),
            ),
            (
                INSTANCE_FILE.to_owned(),
                instance_json(cluster, names, input),
            ),
        ])),
        ..ConfigMap::default()
    }
}

/// The Secret of the control token, owned by the cluster.
fn control_secret(cluster: &ValidatedCluster, names: &ChildNames, token: &str) -> Secret {
    Secret {
        metadata: metadata(cluster, names, &names.control_secret),
        type_: Some("Opaque".to_owned()),
        string_data: Some(BTreeMap::from([(
            CONTROL_TOKEN_KEY.to_owned(),
            token.to_owned(),
        )])),
        ..Secret::default()
    }
}

/// A Secret with a generated password and no owner: like the data volumes, which the
/// StatefulSet keeps when the cluster is deleted, it outlives the cluster. A cluster made again
/// under the same name finds both, and the passwords still match the data. Deleting both starts
/// afresh.
fn kept_secret(
    cluster: &ValidatedCluster,
    names: &ChildNames,
    name: &str,
    username: &str,
    password: &str,
) -> Secret {
    let mut metadata = metadata(cluster, names, name);
    metadata.owner_references = None;
    Secret {
        metadata,
        type_: Some("kubernetes.io/basic-auth".to_owned()),
        string_data: Some(BTreeMap::from([
            (USERNAME_KEY.to_owned(), username.to_owned()),
            (PASSWORD_KEY.to_owned(), password.to_owned()),
        ])),
        ..Secret::default()
    }
}

fn pod_disruption_budget(cluster: &ValidatedCluster, names: &ChildNames) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: metadata(cluster, names, &names.pod_disruption_budget),
        spec: Some(PodDisruptionBudgetSpec {
            // Voluntary evictions (node drains) take one instance at a time.
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(names)),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

pub mod application;
mod config;
mod network_policy;
mod pod;
mod topology;

use config::{pg_hba, postgresql_conf};
pub use pod::{TlsFiles, TlsSources, tls_volume};
use pod::{install_container, postgres_container, volumes};
use topology::instance_json;
pub use topology::{archive_target, instance_host, wal_archive_target};

#[cfg(test)]
mod tests;
