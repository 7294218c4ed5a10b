//! The PostgreSQL pod's containers and volumes: the instance manager's installation, the
//! `postgresql` container with its probes and environment, and the files it mounts (the
//! ConfigMap, the Secrets, and with WAL archiving the backup storage's keys).

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, KeyToPath, ObjectFieldSelector, Probe, ProjectedVolumeSource, SecretProjection,
    SecretVolumeSource, Volume, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::super::validate::ValidatedCluster;
use super::*;
use crate::agent_job::s3_sources;
use crate::pod::{install_pgkube_container, mount, restricted_security_context};

/// The backup storage's keys and CA bundle, for the WAL archiver.
const S3_VOLUME: &str = "s3";
const S3_MOUNT: &str = "/etc/pgkube/s3";
/// The keys (and CA bundle) of the storage a point-in-time recovery reads.
const RECOVERY_S3_VOLUME: &str = "recovery-s3";
const RECOVERY_S3_MOUNT: &str = "/etc/pgkube/recovery-s3";
const METRICS_QUERIES_VOLUME: &str = "metrics-queries";
const METRICS_QUERIES_MOUNT: &str = "/etc/pgkube/metrics";
/// The custom queries' file in [`METRICS_QUERIES_MOUNT`].
const METRICS_QUERIES_FILE: &str = "queries.yaml";

pub(super) fn volumes(cluster: &ValidatedCluster, names: &ChildNames) -> Vec<Volume> {
    let secret = |volume: &str, secret: &str| Volume {
        name: volume.to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.to_owned()),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    };
    let empty_dir = |volume: &str, medium: Option<&str>| Volume {
        name: volume.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: medium.map(str::to_owned),
            ..EmptyDirVolumeSource::default()
        }),
        ..Volume::default()
    };
    vec![
        empty_dir(CONTROLLER_VOLUME, None),
        Volume {
            name: CONFIG_VOLUME.to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: names.config_map.clone(),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        secret(SUPERUSER_VOLUME, &names.secret),
        secret(REPLICATION_VOLUME, &names.replication_secret),
        optional_secret(CONTROL_VOLUME, &names.control_secret),
        optional_secret(APPLICATION_VOLUME, &names.application_secret),
        // PostgreSQL's parallel queries use POSIX shared memory; a container runtime's own
        // /dev/shm is 64MB, too small for them.
        empty_dir(SHM_VOLUME, Some("Memory")),
        empty_dir(SOCKET_VOLUME, None),
        empty_dir(TMP_VOLUME, None),
        tls_volume(
            TLS_VOLUME,
            &TlsSources::new(names, cluster.server_certificates.as_ref()),
            &[TlsFiles::Server, TlsFiles::Replication, TlsFiles::Superuser],
        ),
    ]
    .into_iter()
    .chain(
        cluster
            .wal_archive
            .as_ref()
            .map(|s| s3_volume(S3_VOLUME, s)),
    )
    .chain(
        cluster
            .recovery_storage
            .as_ref()
            .map(|s| s3_volume(RECOVERY_S3_VOLUME, s)),
    )
    .chain(cluster.custom_queries.as_ref().map(metrics_queries_volume))
    .collect()
}

/// The ConfigMap key of the metrics' custom queries, as one file. Optional: a missing
/// ConfigMap must not keep the database from starting; the metrics say so instead.
fn metrics_queries_volume(selector: &k8s_openapi::api::core::v1::ConfigMapKeySelector) -> Volume {
    Volume {
        name: METRICS_QUERIES_VOLUME.to_owned(),
        config_map: Some(ConfigMapVolumeSource {
            name: selector.name.clone(),
            items: Some(vec![KeyToPath {
                key: selector.key.clone(),
                path: METRICS_QUERIES_FILE.to_owned(),
                mode: None,
            }]),
            optional: Some(true),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// A volume of Secret `secret` that may not exist (yet): the pod starts without it.
fn optional_secret(volume: &str, secret: &str) -> Volume {
    Volume {
        name: volume.to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.to_owned()),
            optional: Some(true),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// Which certificates a TLS volume holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFiles {
    /// The server's `tls.crt` and `tls.key`.
    Server,
    /// The replication role's client certificate, `replication.crt` and `replication.key`.
    Replication,
    /// The superuser's client certificate, `superuser.crt` and `superuser.key`.
    Superuser,
}

/// The Secrets a TLS volume's files come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSources {
    /// The server's `tls.crt` and `tls.key`.
    pub server: String,
    /// The `ca.crt` clients verify the server with.
    pub server_ca: String,
    /// The client certificates pgkube issues; their `ca.crt` is pgkube's CA, with which the
    /// server verifies client certificates.
    pub replication: String,
    pub superuser: String,
    /// The applications' client CA (`spec.certificates.clientCASecret`), for the server.
    pub client_ca: Option<String>,
}

impl TlsSources {
    /// The cluster's own (`spec.certificates`) server certificate and CA, or the ones pgkube
    /// issues.
    pub fn new(names: &ChildNames, own: Option<&pgkube_crds::ServerCertificates>) -> Self {
        let (server, server_ca) = match own {
            Some(own) => (
                own.server_tls_secret.clone(),
                own.server_ca_secret
                    .clone()
                    .unwrap_or_else(|| own.server_tls_secret.clone()),
            ),
            None => (
                names.server_tls_secret.clone(),
                names.server_tls_secret.clone(),
            ),
        };
        Self {
            server,
            server_ca,
            replication: names.replication_tls_secret.clone(),
            superuser: names.superuser_tls_secret.clone(),
            client_ca: own.and_then(|own| own.client_ca_secret.clone()),
        }
    }
}

/// A volume of the cluster's certificates: `ca.crt` (the CA clients verify the server with),
/// `client-ca.crt` (pgkube's, which the server verifies client certificates with) and `files`;
/// with the server's files, `user-client-ca.crt` when the user gave a client CA.
/// The Secrets are required: a pod waits for them rather than start without TLS.
pub fn tls_volume(name: &str, from: &TlsSources, files: &[TlsFiles]) -> Volume {
    use super::super::certificates::{
        CA_CERT_KEY, CERT_KEY, CLIENT_CA_FILE, KEY_KEY, USER_CLIENT_CA_FILE,
    };
    let item = |key: &str, path: &str| KeyToPath {
        key: key.to_owned(),
        path: path.to_owned(),
        mode: None,
    };
    let source = |secret: &str, items: Vec<KeyToPath>| VolumeProjection {
        secret: Some(SecretProjection {
            name: secret.to_owned(),
            items: Some(items),
            optional: None,
        }),
        ..VolumeProjection::default()
    };
    let mut sources = vec![
        source(&from.server_ca, vec![item(CA_CERT_KEY, CA_CERT_KEY)]),
        source(&from.replication, vec![item(CA_CERT_KEY, CLIENT_CA_FILE)]),
    ];
    for files in files {
        let (secret, stem) = match files {
            TlsFiles::Server => (&from.server, None),
            TlsFiles::Replication => (&from.replication, Some("replication")),
            TlsFiles::Superuser => (&from.superuser, Some("superuser")),
        };
        if let (TlsFiles::Server, Some(client_ca)) = (files, &from.client_ca) {
            sources.push(source(
                client_ca,
                vec![item(CA_CERT_KEY, USER_CLIENT_CA_FILE)],
            ));
        }
        let items = match stem {
            None => vec![item(CERT_KEY, CERT_KEY), item(KEY_KEY, KEY_KEY)],
            Some(stem) => vec![
                item(CERT_KEY, &format!("{stem}.crt")),
                item(KEY_KEY, &format!("{stem}.key")),
            ],
        };
        sources.push(source(secret, items));
    }
    Volume {
        name: name.to_owned(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(sources),
            // Read by the container's user through its group; it copies them for itself.
            default_mode: Some(0o440),
        }),
        ..Volume::default()
    }
}

/// The keys (and CA bundle) of the backup storage. Optional: a missing Secret must not keep
/// the database from starting; the archiver says what is missing instead.
fn s3_volume(name: &str, storage: &pgkube_crds::S3Storage) -> Volume {
    let mut sources = s3_sources(storage);
    for source in &mut sources {
        if let Some(secret) = source.secret.as_mut() {
            secret.optional = Some(true);
        }
    }
    Volume {
        name: name.to_owned(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(sources),
            ..ProjectedVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// Copies the instance manager from pgkube's image into the `controller` volume.
pub(super) fn install_container(image: &str) -> Container {
    install_pgkube_container(
        INSTALL_CONTAINER,
        image,
        CONTROLLER_VOLUME,
        CONTROLLER_MOUNT,
        INSTANCE_MANAGER,
    )
}

pub(super) fn postgres_container(cluster: &ValidatedCluster, image_repository: &str) -> Container {
    let port = |name: &str, port: i32| ContainerPort {
        name: Some(name.to_owned()),
        container_port: port,
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    };
    Container {
        name: "postgresql".to_owned(),
        image: Some(format!("{image_repository}:{}", cluster.version)),
        command: Some(
            [INSTANCE_MANAGER, "instance", "run"]
                .map(str::to_owned)
                .to_vec(),
        ),
        ports: Some(vec![
            port("postgresql", POSTGRES_PORT),
            port("status", i32::from(STATUS_PORT)),
            port("metrics", i32::from(METRICS_PORT)),
        ]),
        env: Some(instance_manager_env(cluster)),
        resources: cluster.resources.clone(),
        // Until the startup probe passes, neither readiness nor liveness runs: a crash recovery
        // or a clone gets up to an hour. `/healthz` fails only when the manager's loop stops
        // turning outside a long step (clone, rewind), 32 s on; 6 misses 10 s apart restart it.
        startup_probe: Some(status_probe(
            "/readyz",
            READINESS_PERIOD_SECONDS,
            STARTUP_PROBE_FAILURES,
        )),
        readiness_probe: Some(status_probe("/readyz", READINESS_PERIOD_SECONDS, 3)),
        liveness_probe: Some(status_probe("/healthz", LIVENESS_PERIOD_SECONDS, 6)),
        security_context: Some(restricted_security_context()),
        volume_mounts: Some(
            vec![
                mount(DATA_VOLUME, DATA_MOUNT, false),
                mount(CONTROLLER_VOLUME, CONTROLLER_MOUNT, false),
                mount(CONFIG_VOLUME, CONFIG_MOUNT, true),
                mount(SUPERUSER_VOLUME, SUPERUSER_MOUNT, true),
                mount(REPLICATION_VOLUME, REPLICATION_MOUNT, true),
                mount(CONTROL_VOLUME, CONTROL_MOUNT, true),
                mount(APPLICATION_VOLUME, APPLICATION_MOUNT, true),
                mount(SHM_VOLUME, "/dev/shm", false),
                mount(SOCKET_VOLUME, SOCKET_MOUNT, false),
                mount(TMP_VOLUME, TMP_MOUNT, false),
                mount(TLS_VOLUME, TLS_MOUNT, true),
            ]
            .into_iter()
            .chain(
                cluster
                    .wal_archive
                    .as_ref()
                    .map(|_| mount(S3_VOLUME, S3_MOUNT, true)),
            )
            .chain(
                cluster
                    .recovery_storage
                    .as_ref()
                    .map(|_| mount(RECOVERY_S3_VOLUME, RECOVERY_S3_MOUNT, true)),
            )
            .chain(
                cluster
                    .custom_queries
                    .as_ref()
                    .map(|_| mount(METRICS_QUERIES_VOLUME, METRICS_QUERIES_MOUNT, true)),
            )
            .collect(),
        ),
        ..Container::default()
    }
}

/// What the instance manager reads from its environment.
fn instance_manager_env(cluster: &ValidatedCluster) -> Vec<EnvVar> {
    let field = |name: &str, path: &str| EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.to_owned(),
                ..ObjectFieldSelector::default()
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
    vec![
        field("POD_NAME", "metadata.name"),
        field("POD_NAMESPACE", "metadata.namespace"),
        // A subdirectory: the volume's root may hold lost+found, which initdb refuses.
        value("PGDATA", &format!("{DATA_MOUNT}/pgdata")),
        value("PGKUBE_CONFIG_DIR", CONFIG_MOUNT),
        value("PGKUBE_SUPERUSER_DIR", SUPERUSER_MOUNT),
        value("PGKUBE_REPLICATION_DIR", REPLICATION_MOUNT),
        value("PGKUBE_CONTROL_DIR", CONTROL_MOUNT),
        value("PGKUBE_APPLICATION_DIR", APPLICATION_MOUNT),
        value("PGKUBE_STATUS_PORT", &STATUS_PORT.to_string()),
        value("PGKUBE_SHUTDOWN_TIMEOUT", SHUTDOWN_TIMEOUT),
        value("PGKUBE_TLS_DIR", TLS_MOUNT),
        value("PGKUBE_TLS_RUNTIME_DIR", TLS_RUNTIME_DIR),
    ]
    .into_iter()
    .chain(
        cluster
            .wal_archive
            .as_ref()
            .map(|_| value("PGKUBE_S3_DIR", S3_MOUNT)),
    )
    .chain(
        cluster
            .recovery_storage
            .as_ref()
            .map(|_| value("PGKUBE_RECOVERY_S3_DIR", RECOVERY_S3_MOUNT)),
    )
    .chain(cluster.custom_queries.as_ref().map(|_| {
        value(
            "PGKUBE_METRICS_QUERIES",
            &format!("{METRICS_QUERIES_MOUNT}/{METRICS_QUERIES_FILE}"),
        )
    }))
    .collect()
}

/// `GET <path>` on the instance manager's status port every `period_seconds`, failing after
/// `failure_threshold` misses in a row.
fn status_probe(path: &str, period_seconds: i32, failure_threshold: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String("status".to_owned()),
            scheme: Some("HTTP".to_owned()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period_seconds),
        timeout_seconds: Some(5),
        failure_threshold: Some(failure_threshold),
        ..Probe::default()
    }
}
