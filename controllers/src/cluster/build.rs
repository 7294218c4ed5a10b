//! Build (pure): the children a validated cluster should have. No client, no I/O; the result
//! is applied by `apply`.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, ExecAction, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, SeccompProfile, Secret, SecretKeySelector,
    SecurityContext, Service, ServicePort, ServiceSpec, Volume, VolumeMount,
    VolumeResourceRequirements,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::drift::desired_hash;
use super::memory::MemorySettings;
use super::validate::ValidatedCluster;
use crate::names::{self, DNS_LABEL_MAX, DNS_SUBDOMAIN_MAX, NameKind, STATEFULSET_NAME_MAX};

/// PostgreSQL's port.
pub const POSTGRES_PORT: i32 = 5432;
/// Annotation on the StatefulSet naming the PostgreSQL major version it runs.
pub const VERSION_ANNOTATION: &str = "db.example.com/postgres-version";
/// Pod template annotation: the hash of the `postgresql.conf` the pods run with.
pub const CONFIG_HASH_ANNOTATION: &str = "db.example.com/config-hash";
/// Name of the data volume claim template; PVCs are `data-<statefulset>-N`.
pub const DATA_VOLUME: &str = "data";
/// uid and gid of `postgres` in the official image.
const POSTGRES_UID: i64 = 999;
const DATA_MOUNT: &str = "/var/lib/postgresql/data";
const CONFIG_MOUNT: &str = "/etc/postgresql";
const CONFIG_FILE: &str = "postgresql.conf";
const SHM_VOLUME: &str = "shm";
/// Keys of the credentials Secret.
pub const USERNAME_KEY: &str = "username";
pub const PASSWORD_KEY: &str = "password";
/// Superuser of the official image.
const SUPERUSER: &str = "postgres";
/// Seconds between two runs of each probe.
const PROBE_PERIOD_SECONDS: i32 = 10;
/// Misses the startup probe allows: 60 x 10 s = 10 minutes for a crash recovery to finish.
const STARTUP_PROBE_FAILURES: i32 = 60;

/// Names of a cluster's children, all within Kubernetes limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildNames {
    pub statefulset: String,
    pub headless_service: String,
    pub client_service: String,
    pub config_map: String,
    pub secret: String,
    pub pod_disruption_budget: String,
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
            client_service: label("-postgresql"),
            config_map: subdomain("-postgresql-config"),
            secret: subdomain("-postgresql-credentials"),
            pod_disruption_budget: subdomain("-postgresql"),
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
    pub client_service: Service,
    pub config_map: ConfigMap,
    /// Created once if missing, never updated: it holds the generated password.
    pub credentials: Secret,
    /// Only with more than one replica; otherwise an existing one is deleted.
    pub pod_disruption_budget: Option<PodDisruptionBudget>,
}

/// The desired children of `cluster`, running `<image_repository>:<version>`; `password` goes
/// into the credentials Secret if it has to be created.
pub fn build(
    cluster: &ValidatedCluster,
    image_repository: &str,
    password: &str,
) -> DesiredChildren {
    let names = ChildNames::for_cluster(&cluster.name);
    let config_map = config_map(cluster, &names);
    DesiredChildren {
        statefulset: statefulset(cluster, &names, image_repository, &config_hash(&config_map)),
        headless_service: service(cluster, &names, &names.headless_service, true),
        client_service: service(cluster, &names, &names.client_service, false),
        config_map,
        credentials: credentials(cluster, &names, password),
        pod_disruption_budget: (cluster.replicas > 1)
            .then(|| pod_disruption_budget(cluster, &names)),
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

fn metadata(cluster: &ValidatedCluster, names: &ChildNames, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(cluster.namespace.clone()),
        labels: Some(labels(names)),
        owner_references: Some(vec![cluster.owner.clone()]),
        ..ObjectMeta::default()
    }
}

/// The hash of the server's configuration, as the pod template carries it.
fn config_hash(config_map: &ConfigMap) -> String {
    let config = config_map
        .data
        .as_ref()
        .and_then(|data| data.get(CONFIG_FILE))
        .cloned()
        .unwrap_or_default();
    desired_hash(&serde_json::Value::String(config))
}

fn statefulset(
    cluster: &ValidatedCluster,
    names: &ChildNames,
    image_repository: &str,
    config_hash: &str,
) -> StatefulSet {
    let mut meta = metadata(cluster, names, &names.statefulset);
    meta.annotations = Some(BTreeMap::from([(
        VERSION_ANNOTATION.to_owned(),
        cluster.version.to_string(),
    )]));
    StatefulSet {
        metadata: meta,
        spec: Some(StatefulSetSpec {
            replicas: Some(cluster.replicas),
            service_name: Some(names.headless_service.clone()),
            selector: LabelSelector {
                match_labels: Some(selector_labels(names)),
                ..LabelSelector::default()
            },
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".to_owned()),
                ..StatefulSetUpdateStrategy::default()
            }),
            // Data is never deleted by the operator, not even when scaling down.
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some("Retain".to_owned()),
                    when_scaled: Some("Retain".to_owned()),
                },
            ),
            template: pod_template(cluster, names, image_repository, config_hash),
            volume_claim_templates: Some(vec![data_claim_template(cluster, names)]),
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    }
}

/// The pods carry the hash of the configuration they were started with ([`CONFIG_HASH_ANNOTATION`]),
/// so a configuration change is a template change: the StatefulSet restarts the instances one
/// at a time, and each starts with the new file.
fn pod_template(
    cluster: &ValidatedCluster,
    names: &ChildNames,
    image_repository: &str,
    config_hash: &str,
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
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        containers: vec![postgres_container(cluster, names, image_repository)],
        volumes: Some(vec![
            Volume {
                name: "config".to_owned(),
                config_map: Some(ConfigMapVolumeSource {
                    name: names.config_map.clone(),
                    ..ConfigMapVolumeSource::default()
                }),
                ..Volume::default()
            },
            // PostgreSQL's parallel queries use POSIX shared memory; a container runtime's own
            // /dev/shm is 64MB, too small for them.
            Volume {
                name: SHM_VOLUME.to_owned(),
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: Some("Memory".to_owned()),
                    ..EmptyDirVolumeSource::default()
                }),
                ..Volume::default()
            },
        ]),
        ..PodSpec::default()
    };
    // Part of the template: a change rolls the pods like any other template change.
    cluster.scheduling.apply_to(&mut pod);
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(names)),
            annotations: Some(BTreeMap::from([(
                CONFIG_HASH_ANNOTATION.to_owned(),
                config_hash.to_owned(),
            )])),
            ..ObjectMeta::default()
        }),
        spec: Some(pod),
    }
}

fn postgres_container(
    cluster: &ValidatedCluster,
    names: &ChildNames,
    image_repository: &str,
) -> Container {
    let from_secret = |name: &str, key: &str| EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: names.secret.clone(),
                key: key.to_owned(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    };
    let value = |name: &str, value: &str| EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        ..EnvVar::default()
    };
    Container {
        name: "postgresql".to_owned(),
        image: Some(format!("{image_repository}:{}", cluster.version)),
        args: Some(vec![
            "-c".to_owned(),
            format!("config_file={CONFIG_MOUNT}/{CONFIG_FILE}"),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("postgresql".to_owned()),
            container_port: POSTGRES_PORT,
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        env: Some(vec![
            from_secret("POSTGRES_USER", USERNAME_KEY),
            from_secret("POSTGRES_PASSWORD", PASSWORD_KEY),
            // A subdirectory: the volume's root may hold lost+found, which initdb refuses.
            value("PGDATA", &format!("{DATA_MOUNT}/pgdata")),
        ]),
        resources: cluster.resources.clone(),
        // Until the startup probe passes, neither readiness nor liveness runs: a crash recovery
        // (WAL replay) gets up to 10 minutes, and liveness needs no long initial delay.
        startup_probe: Some(pg_isready_probe(STARTUP_PROBE_FAILURES)),
        readiness_probe: Some(pg_isready_probe(3)),
        liveness_probe: Some(pg_isready_probe(6)),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                ..Capabilities::default()
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                ..SeccompProfile::default()
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: DATA_VOLUME.to_owned(),
                mount_path: DATA_MOUNT.to_owned(),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "config".to_owned(),
                mount_path: CONFIG_MOUNT.to_owned(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: SHM_VOLUME.to_owned(),
                mount_path: "/dev/shm".to_owned(),
                ..VolumeMount::default()
            },
        ]),
        ..Container::default()
    }
}

/// `pg_isready` every [`PROBE_PERIOD_SECONDS`], failing after `failure_threshold` misses in a
/// row.
///
/// Without `--host`, `pg_isready` reaches the server through its local Unix socket (libpq's
/// default directory, `/var/run/postgresql` in the official image, where the server puts its
/// socket; `PGHOST` overrides it). The check thus does not depend on `listen_addresses` or on
/// the pod's network.
fn pg_isready_probe(failure_threshold: i32) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(
                [
                    "pg_isready",
                    &format!("--port={POSTGRES_PORT}"),
                    &format!("--username={SUPERUSER}"),
                ]
                .map(str::to_owned)
                .to_vec(),
            ),
        }),
        period_seconds: Some(PROBE_PERIOD_SECONDS),
        timeout_seconds: Some(5),
        failure_threshold: Some(failure_threshold),
        ..Probe::default()
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

fn config_map(cluster: &ValidatedCluster, names: &ChildNames) -> ConfigMap {
    let memory = MemorySettings::for_resources(cluster.resources.as_ref()).config_lines();
    let config = format!(
        "# Managed by pgkube; edits are overwritten.\n\
         listen_addresses = '*'\n\
         port = {POSTGRES_PORT}\n\
         max_connections = 100\n\
         {memory}\
         password_encryption = scram-sha-256\n\
         log_destination = 'stderr'\n\
         logging_collector = off\n\
         {parameters}",
        parameters = user_parameters(&cluster.parameters),
    );
    ConfigMap {
        metadata: metadata(cluster, names, &names.config_map),
        data: Some(BTreeMap::from([(CONFIG_FILE.to_owned(), config)])),
        ..ConfigMap::default()
    }
}

/// The user's parameters, last, so that they take precedence over pgkube's defaults (the server
/// takes the last setting of a name). Values are quoted, quotes doubled.
fn user_parameters(parameters: &BTreeMap<String, String>) -> String {
    if parameters.is_empty() {
        return String::new();
    }
    let mut lines = String::from("# spec.postgresql.parameters\n");
    for (name, value) in parameters {
        lines.push_str(&format!("{name} = '{}'\n", value.replace('\'', "''")));
    }
    lines
}

/// The credentials Secret has no owner: like the data volumes, which the StatefulSet keeps when
/// the cluster is deleted, it outlives the cluster. A cluster made again under the same name
/// finds both, and the password still matches the data. Deleting both starts afresh.
fn credentials(cluster: &ValidatedCluster, names: &ChildNames, password: &str) -> Secret {
    let mut metadata = metadata(cluster, names, &names.secret);
    metadata.owner_references = None;
    Secret {
        metadata,
        type_: Some("kubernetes.io/basic-auth".to_owned()),
        string_data: Some(BTreeMap::from([
            (USERNAME_KEY.to_owned(), SUPERUSER.to_owned()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::validate::{LiveFacts, validate};
    use crate::names::is_valid;
    use pgkube_crds::PostgreSQLCluster;

    /// The seed's sample cluster.
    const SAMPLE: &str = include_str!("../../../deploy/samples/postgresqlcluster.yaml");

    fn validated(name: &str, replicas: i32) -> ValidatedCluster {
        let mut cluster: PostgreSQLCluster = serde_yaml::from_str(SAMPLE).expect("sample parses");
        cluster.metadata.name = Some(name.to_owned());
        cluster.metadata.namespace = Some("team-a".to_owned());
        cluster.metadata.uid = Some("0b5a5c2e-0000-4000-8000-000000000001".to_owned());
        cluster.spec.replicas = replicas;
        validate(&cluster, &LiveFacts::default())
            .expect("sample is valid")
            .effective
    }

    fn container(children: &DesiredChildren) -> &Container {
        let pod = children
            .statefulset
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref());
        &pod.expect("pod spec").containers[0]
    }

    #[test]
    fn a_held_back_major_upgrade_builds_the_running_version_with_the_new_replicas() {
        let mut cluster: PostgreSQLCluster = serde_yaml::from_str(SAMPLE).expect("sample parses");
        cluster.metadata.namespace = Some("team-a".to_owned());
        cluster.metadata.uid = Some("0b5a5c2e-0000-4000-8000-000000000001".to_owned());
        cluster.spec.version = pgkube_crds::PostgresVersion::V17;
        cluster.spec.replicas = 4;
        let live = LiveFacts {
            running_version: Some(pgkube_crds::PostgresVersion::V16),
            claim_template_storage: Some("100Gi".to_owned()),
            largest_volume_gib: Some(100),
        };
        let validation = validate(&cluster, &live).expect("valid");
        assert_eq!(validation.refusals.len(), 1);
        let children = build(&validation.effective, "mirror.example/postgres", "pw");
        assert_eq!(
            container(&children).image.as_deref(),
            Some("mirror.example/postgres:16")
        );
        let sts = &children.statefulset;
        assert_eq!(
            sts.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(VERSION_ANNOTATION))
                .map(String::as_str),
            Some("16")
        );
        assert_eq!(sts.spec.as_ref().and_then(|s| s.replicas), Some(4));
    }

    #[test]
    fn the_sample_builds_the_named_children_with_owner_and_labels() {
        let children = build(&validated("my-cluster", 3), "postgres", "secret");
        let metas = [
            &children.statefulset.metadata,
            &children.headless_service.metadata,
            &children.client_service.metadata,
            &children.config_map.metadata,
            &children
                .pod_disruption_budget
                .as_ref()
                .expect("3 replicas get a PDB")
                .metadata,
        ];
        let names: Vec<_> = metas
            .iter()
            .map(|m| m.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(
            names,
            [
                "my-cluster-postgresql",
                "my-cluster-postgresql-headless",
                "my-cluster-postgresql",
                "my-cluster-postgresql-config",
                "my-cluster-postgresql",
            ]
        );
        for meta in metas {
            let labels = meta.labels.as_ref().expect("labels");
            assert_eq!(labels["app.kubernetes.io/name"], "postgresql");
            assert_eq!(labels["app.kubernetes.io/instance"], "my-cluster");
            assert_eq!(labels["app.kubernetes.io/managed-by"], "pgkube");
            let owner = &meta.owner_references.as_ref().expect("owner")[0];
            assert_eq!(
                (owner.kind.as_str(), owner.controller),
                ("PostgreSQLCluster", Some(true))
            );
            assert_eq!(meta.namespace.as_deref(), Some("team-a"));
        }
    }

    #[test]
    fn pods_get_an_in_memory_dev_shm_and_change_volume_ownership_only_on_mismatch() {
        let children = build(&validated("my-cluster", 1), "postgres", "secret");
        let pod = pod_spec(&children);
        let shm = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == SHM_VOLUME)
            .expect("a shm volume");
        assert_eq!(
            shm.empty_dir.as_ref().and_then(|e| e.medium.as_deref()),
            Some("Memory")
        );
        let mounts = container(&children)
            .volume_mounts
            .clone()
            .unwrap_or_default();
        assert!(
            mounts
                .iter()
                .any(|m| m.name == SHM_VOLUME && m.mount_path == "/dev/shm")
        );
        assert_eq!(
            pod.security_context
                .and_then(|s| s.fs_group_change_policy)
                .as_deref(),
            Some("OnRootMismatch")
        );
    }

    #[test]
    fn the_config_sizes_memory_from_the_container_s_memory() {
        let children = build(&validated("my-cluster", 1), "postgres", "secret");
        let config = &children.config_map.data.as_ref().expect("data")[CONFIG_FILE];
        // The sample's memory limit is 2Gi.
        assert!(
            config.contains("shared_buffers = 512MB\neffective_cache_size = 1536MB\n"),
            "{config}"
        );
        assert_eq!(config.matches("shared_buffers").count(), 1, "{config}");
    }

    #[test]
    fn user_parameters_come_last_quoted_and_a_change_changes_the_pods_config_hash() {
        let mut cluster = validated("my-cluster", 1);
        let before = build(&cluster, "postgres", "secret");
        cluster.parameters = BTreeMap::from([
            ("work_mem".to_owned(), "16MB".to_owned()),
            ("application_name".to_owned(), "it's".to_owned()),
            ("shared_buffers".to_owned(), "1GB".to_owned()),
        ]);
        let after = build(&cluster, "postgres", "secret");
        let config = &after.config_map.data.as_ref().expect("data")[CONFIG_FILE];
        assert!(
            config.ends_with(
                "# spec.postgresql.parameters\n\
                 application_name = 'it''s'\n\
                 shared_buffers = '1GB'\n\
                 work_mem = '16MB'\n"
            ),
            "{config}"
        );
        let hash = |children: &DesiredChildren| {
            let template = &children.statefulset.spec.as_ref().expect("spec").template;
            template
                .metadata
                .as_ref()
                .and_then(|m| m.annotations.clone())
                .expect("annotations")[CONFIG_HASH_ANNOTATION]
                .clone()
        };
        assert_ne!(hash(&before), hash(&after));
        assert_eq!(
            hash(&after),
            hash(&build(&cluster, "postgres", "other password"))
        );
    }

    #[test]
    fn the_credentials_have_labels_but_no_owner_so_they_outlive_the_cluster() {
        let children = build(&validated("my-cluster", 1), "postgres", "secret");
        let meta = &children.credentials.metadata;
        assert_eq!(
            meta.name.as_deref(),
            Some("my-cluster-postgresql-credentials")
        );
        assert_eq!(meta.namespace.as_deref(), Some("team-a"));
        assert_eq!(
            meta.labels.as_ref().expect("labels")["app.kubernetes.io/instance"],
            "my-cluster"
        );
        assert_eq!(meta.owner_references, None);
    }

    #[test]
    fn the_statefulset_runs_the_version_with_probes_storage_and_resources() {
        let children = build(
            &validated("my-cluster", 3),
            "registry.local/postgres",
            "secret",
        );
        let spec = children.statefulset.spec.as_ref().expect("spec");
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(
            spec.service_name.as_deref(),
            Some("my-cluster-postgresql-headless")
        );
        let postgres = container(&children);
        assert_eq!(
            postgres.image.as_deref(),
            Some("registry.local/postgres:16")
        );
        assert_eq!(
            postgres.ports.as_ref().expect("ports")[0].container_port,
            5432
        );
        // Every probe checks the local socket; the startup probe allows a 10-minute crash
        // recovery, so the others need no initial delay.
        let socket_check = ["pg_isready", "--port=5432", "--username=postgres"].map(str::to_owned);
        let probes = [
            ("startup", &postgres.startup_probe),
            ("readiness", &postgres.readiness_probe),
            ("liveness", &postgres.liveness_probe),
        ];
        for (which, probe) in probes {
            let probe = probe.as_ref().unwrap_or_else(|| panic!("{which} probe"));
            let command = probe.exec.as_ref().and_then(|e| e.command.as_deref());
            assert_eq!(command, Some(&socket_check[..]), "{which}");
            assert_eq!(probe.period_seconds, Some(10), "{which}");
            assert_eq!(probe.initial_delay_seconds, None, "{which}");
        }
        let startup = postgres.startup_probe.as_ref().expect("startup probe");
        let allowed = startup.period_seconds.unwrap_or(10) * startup.failure_threshold.unwrap_or(3);
        assert!(allowed >= 600, "crash recovery gets {allowed} s");
        let resources = postgres
            .resources
            .as_ref()
            .expect("resources from the spec");
        assert_eq!(
            resources.requests.as_ref().expect("requests")["cpu"].0,
            "500m"
        );
        let claim = &spec.volume_claim_templates.as_ref().expect("claims")[0];
        assert_eq!(claim.metadata.name.as_deref(), Some("data"));
        let requests = claim
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref()?.requests.clone());
        assert_eq!(requests.expect("storage request")["storage"].0, "100Gi");
        let env: Vec<_> = postgres
            .env
            .as_ref()
            .expect("env")
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert!(
            env.contains(&"POSTGRES_PASSWORD") && env.contains(&"PGDATA"),
            "{env:?}"
        );
    }

    #[test]
    fn pods_meet_the_restricted_pod_security_standard() {
        let children = build(&validated("my-cluster", 1), "postgres", "secret");
        let pod = pod_spec(&children);
        let pod_security = pod.security_context.expect("pod security context");
        assert_eq!(pod_security.run_as_non_root, Some(true));
        assert_eq!(pod_security.run_as_user, Some(999));
        let container = container(&children)
            .security_context
            .clone()
            .expect("container security");
        assert_eq!(container.allow_privilege_escalation, Some(false));
        assert_eq!(
            container.capabilities.and_then(|c| c.drop),
            Some(vec!["ALL".to_owned()])
        );
        assert_eq!(
            container.seccomp_profile.map(|p| p.type_).as_deref(),
            Some("RuntimeDefault")
        );
    }

    #[test]
    fn services_headless_and_client() {
        let children = build(&validated("my-cluster", 3), "postgres", "secret");
        let headless = children.headless_service.spec.expect("spec");
        assert_eq!(headless.cluster_ip.as_deref(), Some("None"));
        assert_eq!(headless.publish_not_ready_addresses, Some(true));
        let client = children.client_service.spec.expect("spec");
        assert_eq!(client.cluster_ip, None);
        assert_eq!(client.selector, headless.selector);
    }

    #[test]
    fn a_single_replica_gets_no_disruption_budget() {
        assert!(
            build(&validated("my-cluster", 1), "postgres", "s")
                .pod_disruption_budget
                .is_none()
        );
    }

    /// The sample with scheduling fields, applied by the admission test.
    const SCHEDULING_SAMPLE: &str =
        include_str!("../../../deploy/samples/postgresqlcluster-scheduling.yaml");

    fn pod_spec(children: &DesiredChildren) -> PodSpec {
        children
            .statefulset
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.clone())
            .expect("pod spec")
    }

    #[test]
    fn scheduling_fields_are_copied_verbatim_into_the_pod_template() {
        let mut cluster: PostgreSQLCluster =
            serde_yaml::from_str(SCHEDULING_SAMPLE).expect("sample parses");
        cluster.metadata.namespace = Some("team-a".to_owned());
        cluster.metadata.uid = Some("0b5a5c2e-0000-4000-8000-000000000001".to_owned());
        let spec = cluster.spec.clone();
        assert!(
            !spec.node_selector.is_empty() && !spec.tolerations.is_empty(),
            "the sample sets every scheduling field"
        );
        let valid = validate(&cluster, &LiveFacts::default()).expect("valid");
        let pod = pod_spec(&build(&valid.effective, "postgres", "secret"));
        assert_eq!(pod.node_selector, Some(spec.node_selector));
        assert_eq!(pod.tolerations, Some(spec.tolerations));
        assert_eq!(pod.affinity, spec.affinity);
        assert!(pod.affinity.is_some(), "the sample sets an affinity");
    }

    #[test]
    fn without_scheduling_fields_the_template_has_none() {
        let pod = pod_spec(&build(&validated("my-cluster", 3), "postgres", "secret"));
        assert_eq!(
            (pod.node_selector, pod.tolerations, pod.affinity),
            (None, None, None)
        );
        let json = serde_json::to_value(
            build(&validated("my-cluster", 3), "postgres", "secret").statefulset,
        )
        .expect("json");
        let template = &json["spec"]["template"]["spec"];
        for field in ["nodeSelector", "tolerations", "affinity"] {
            assert!(template.get(field).is_none(), "{field} in {template}");
        }
    }

    #[test]
    fn a_scheduling_change_is_drift_and_an_unchanged_one_is_not() {
        use crate::cluster::drift::{is_up_to_date, stamped};
        let stamped_statefulset = |node_selector: &[(&str, &str)]| {
            let mut cluster = validated("my-cluster", 3);
            cluster.scheduling.node_selector = node_selector
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            let sts = build(&cluster, "postgres", "secret").statefulset;
            stamped(serde_json::to_value(sts).expect("json"))
        };
        let live = stamped_statefulset(&[("disk", "ssd")]);
        assert!(is_up_to_date(
            &stamped_statefulset(&[("disk", "ssd")]),
            &live
        ));
        assert!(!is_up_to_date(
            &stamped_statefulset(&[("disk", "nvme")]),
            &live
        ));
        // Removing the field is a change too, although the live object still "contains" it.
        assert!(!is_up_to_date(&stamped_statefulset(&[]), &live));
    }

    #[test]
    fn a_63_character_cluster_name_gives_valid_child_names() {
        let name = "c".repeat(63);
        let children = build(&validated(&name, 10), "postgres", "secret");
        let sts = children.statefulset.metadata.name.clone().expect("name");
        assert!(
            sts.len() <= STATEFULSET_NAME_MAX && is_valid(&sts, NameKind::DnsLabel),
            "{sts}"
        );
        // The highest pod, its hostname and its revision label value.
        let pod = format!("{sts}-9");
        assert!(pod.len() <= DNS_LABEL_MAX, "{pod}");
        assert!(format!("{sts}-{}", "x".repeat(10)).len() <= DNS_LABEL_MAX);
        for service in [&children.headless_service, &children.client_service] {
            let name = service.metadata.name.clone().expect("name");
            assert!(
                name.len() <= DNS_LABEL_MAX && is_valid(&name, NameKind::DnsLabel),
                "{name}"
            );
        }
        for name in [
            &children.config_map.metadata.name,
            &children.credentials.metadata.name,
        ] {
            let name = name.clone().expect("name");
            assert!(name.len() <= DNS_SUBDOMAIN_MAX && is_valid(&name, NameKind::DnsSubdomain));
        }
        let labels = children.statefulset.metadata.labels.expect("labels");
        assert!(labels.values().all(|v| v.len() <= DNS_LABEL_MAX));
        let service_name = children.statefulset.spec.expect("spec").service_name;
        assert_eq!(service_name, children.headless_service.metadata.name);
    }
}
