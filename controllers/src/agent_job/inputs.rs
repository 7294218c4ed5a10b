//! What a backup or restore Job's agent is given: its settings as environment variables (nothing
//! secret), and the Secret files it reads (the superuser's password, the S3 keys and CA bundle).

use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, EnvVar, EnvVarSource, KeyToPath, ProjectedVolumeSource,
    SecretKeySelector, SecretProjection, SecretVolumeSource, Volume, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use pgkube_crds::{PostgreSQLCluster, S3Storage};

use super::build::{
    ACCESS_KEY_ID_FILE, AGENT_VOLUME, CA_BUNDLE_FILE, JobInput, REPLICATION_MOUNT,
    REPLICATION_VOLUME, S3_MOUNT, S3_VOLUME, SECRET_ACCESS_KEY_FILE, SUPERUSER_MOUNT,
    SUPERUSER_VOLUME, TLS_MOUNT, TLS_VOLUME, TMP_VOLUME, Task,
};
use crate::backup::physical::Source;
use crate::cluster::build::{
    ChildNames, PASSWORD_KEY, POSTGRES_PORT, REPLICATION_USER, TlsFiles, TlsSources, instance_host,
    tls_volume,
};
use crate::storage::wal;

fn value(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

/// The agent's settings. Nothing secret: the password and the keys are files.
pub(super) fn agent_env(input: &JobInput<'_>) -> Vec<EnvVar> {
    let cluster = input.cluster.name_any();
    let names = ChildNames::for_cluster(&cluster);
    let storage = input.storage;
    let mut env = vec![
        value("PGKUBE_BACKUP_NAME", input.task.backup_name()),
        value("PGKUBE_CLUSTER", cluster),
        value(
            "PGKUBE_NAMESPACE",
            input
                .task
                .owner_meta()
                .namespace
                .clone()
                .unwrap_or_default(),
        ),
        value("PGHOST", names.rw_service),
        value("PGPORT", POSTGRES_PORT.to_string()),
        // The cluster's CA and client certificates: every connection is verify-full.
        value("PGKUBE_TLS_DIR", TLS_MOUNT),
        EnvVar {
            name: "PGUSER".to_owned(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: names.secret.clone(),
                    key: "username".to_owned(),
                    optional: None,
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        },
        value(
            "PGKUBE_PGPASSWORD_FILE",
            format!("{SUPERUSER_MOUNT}/password"),
        ),
        value("PGKUBE_S3_BUCKET", &storage.bucket),
        value("PGKUBE_S3_PREFIX", input.prefix),
        value("PGKUBE_S3_REGION", &storage.region),
    ];
    if storage.credentials.is_some() {
        env.push(value(
            "PGKUBE_S3_ACCESS_KEY_ID_FILE",
            format!("{S3_MOUNT}/{ACCESS_KEY_ID_FILE}"),
        ));
        env.push(value(
            "PGKUBE_S3_SECRET_ACCESS_KEY_FILE",
            format!("{S3_MOUNT}/{SECRET_ACCESS_KEY_FILE}"),
        ));
    }
    env.push(value(
        "PGKUBE_APPLICATION_ROLE",
        application_owner(input.cluster),
    ));
    env.extend(location_env(&input.task, input.cluster));
    if let Some(source) = input.task.physical_source() {
        env.extend(physical_env(input, source));
    }
    if let Some(endpoint) = &storage.endpoint {
        env.push(value("PGKUBE_S3_ENDPOINT", endpoint));
    }
    if storage.force_path_style {
        env.push(value("PGKUBE_S3_FORCE_PATH_STYLE", "true"));
    }
    if storage.ca_bundle.is_some() {
        env.push(value(
            "PGKUBE_S3_CA_BUNDLE",
            format!("{S3_MOUNT}/{CA_BUNDLE_FILE}"),
        ));
    }
    if let Some(encryption) = storage.server_side_encryption {
        let algorithm = serde_json::to_value(encryption)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        env.push(value("PGKUBE_S3_SSE", algorithm));
    }
    if let Some(trace_parent) = &input.trace_parent {
        env.push(value("TRACEPARENT", trace_parent));
    }
    env.extend(
        input
            .otel_env
            .iter()
            .map(|(name, setting)| value(name, setting)),
    );
    env
}

/// The role `cluster`'s applications log in as (`spec.bootstrap.initdb.owner`, or its default).
fn application_owner(cluster: &PostgreSQLCluster) -> String {
    cluster
        .spec
        .bootstrap
        .as_ref()
        .and_then(|bootstrap| bootstrap.initdb.clone())
        .unwrap_or_default()
        .owner
}

/// What a physical backup reads: the source's stable host name (a standby) or the primary's
/// Service, as the replication role, and where the cluster's WAL is archived.
fn physical_env(input: &JobInput<'_>, source: &Source) -> Vec<EnvVar> {
    let cluster = input.cluster.name_any();
    let names = ChildNames::for_cluster(&cluster);
    let namespace = input.cluster.namespace().unwrap_or_default();
    let host = if source.standby {
        instance_host(&names, &namespace, &source.pod)
    } else {
        names.rw_service.clone()
    };
    vec![
        value("PGKUBE_SOURCE_HOST", host),
        value("PGKUBE_SOURCE_POD", &source.pod),
        value("PGKUBE_FROM_STANDBY", source.standby.to_string()),
        value("PGKUBE_REPLICATION_USER", REPLICATION_USER),
        value(
            "PGKUBE_REPLICATION_PASSWORD_FILE",
            format!("{REPLICATION_MOUNT}/{PASSWORD_KEY}"),
        ),
        value("PGKUBE_WAL_ROOT", wal::archive_root(input.prefix, &cluster)),
    ]
}

pub(super) fn volumes(input: &JobInput<'_>) -> Vec<Volume> {
    let names = ChildNames::for_cluster(&input.cluster.name_any());
    let mut volumes = vec![
        Volume {
            name: AGENT_VOLUME.to_owned(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        },
        Volume {
            name: TMP_VOLUME.to_owned(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        },
        Volume {
            name: SUPERUSER_VOLUME.to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(names.secret.clone()),
                items: Some(vec![key_to_path("password", "password")]),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        },
        Volume {
            name: S3_VOLUME.to_owned(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(s3_sources(input.storage)),
                ..ProjectedVolumeSource::default()
            }),
            ..Volume::default()
        },
    ];
    let mut certificates = vec![TlsFiles::Superuser];
    if input.task.physical_source().is_some() {
        certificates.push(TlsFiles::Replication);
    }
    let sources = TlsSources::new(&names, input.cluster.spec.certificates.as_ref());
    volumes.push(tls_volume(TLS_VOLUME, &sources, &certificates));
    if input.task.physical_source().is_some() {
        volumes.push(Volume {
            name: REPLICATION_VOLUME.to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(names.replication_secret),
                items: Some(vec![key_to_path(PASSWORD_KEY, PASSWORD_KEY)]),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    volumes
}

fn key_to_path(key: &str, path: &str) -> KeyToPath {
    KeyToPath {
        key: key.to_owned(),
        path: path.to_owned(),
        mode: None,
    }
}

/// The S3 keys (and CA bundle) as files, each from the Secret key the storage names; none for
/// storage whose credentials come from the pod's identity.
pub fn s3_sources(storage: &S3Storage) -> Vec<VolumeProjection> {
    let from = |selector: &SecretKeySelector, path: &str| VolumeProjection {
        secret: Some(SecretProjection {
            name: selector.name.clone(),
            items: Some(vec![key_to_path(&selector.key, path)]),
            optional: None,
        }),
        ..VolumeProjection::default()
    };
    let mut sources = Vec::new();
    if let Some(credentials) = &storage.credentials {
        sources.push(from(&credentials.access_key_id, ACCESS_KEY_ID_FILE));
        sources.push(from(&credentials.secret_access_key, SECRET_ACCESS_KEY_FILE));
    }
    if let Some(ca_bundle) = &storage.ca_bundle {
        sources.push(from(ca_bundle, CA_BUNDLE_FILE));
    }
    sources
}

/// Where the agent's objects are: for a backup, the uids that name its directory (with the
/// prefix and its name, see [`crate::storage::keys`]); for a restore, the manifest's key.
fn location_env(task: &Task<'_>, cluster: &PostgreSQLCluster) -> Vec<EnvVar> {
    let uid = |meta: &ObjectMeta| meta.uid.clone().unwrap_or_default();
    match task {
        Task::Backup { backup, .. } => vec![
            value("PGKUBE_CLUSTER_UID", uid(&cluster.metadata)),
            value("PGKUBE_BACKUP_UID", uid(&backup.metadata)),
        ],
        Task::Restore { manifest_key, .. } => {
            vec![value("PGKUBE_MANIFEST_KEY", *manifest_key)]
        }
    }
}
