//! The Job that runs one backup or one restore: built from the backup (or restore), its
//! cluster and the storage, without talking to the API server.
//!
//! The pod has two containers:
//! - an init container from pgkube's image copies `pgkube` into an emptyDir;
//! - the main container runs `<postgres image repository>:<cluster major>`, so that `pg_dump`
//!   and `pg_restore` are the server's major version, with `/pgkube/pgkube agent backup` (or
//!   `restore`) as its command.
//!
//! It connects to the primary through the cluster's `-rw` Service as the superuser; the
//! password and the S3 keys are files from Secret volumes, never arguments or environment
//! values. The result is the agent's JSON line in the termination message; on a crash the end
//! of the log takes its place (`FallbackToLogsOnError`).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, PodSecurityContext, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use pgkube_crds::{
    BackupCompression, CLUSTER_LABEL, PostgreSQLBackup, PostgreSQLCluster, PostgreSQLRestore,
    S3Storage,
};

use crate::cluster::build::POSTGRES_UID;
use crate::names::{self, DNS_LABEL_MAX, NameKind};
use crate::pod::{
    install_pgkube_container, mount, restricted_security_context, runtime_default_seccomp,
};
use crate::scheduling::Scheduling;

use super::inputs;

/// Label on backup Jobs and their pods: the backup's name (as a label value).
pub const BACKUP_LABEL: &str = "db.example.com/backup";
/// Label on restore Jobs and their pods: the restore's name (as a label value).
pub const RESTORE_LABEL: &str = "db.example.com/restore";

pub(super) const AGENT_VOLUME: &str = "pgkube";
pub(super) const AGENT_MOUNT: &str = "/pgkube";
pub(super) const AGENT: &str = "/pgkube/pgkube";
pub(super) const SUPERUSER_VOLUME: &str = "superuser";
pub(super) const SUPERUSER_MOUNT: &str = "/etc/pgkube/superuser";
pub(super) const S3_VOLUME: &str = "s3";
pub(super) const S3_MOUNT: &str = "/etc/pgkube/s3";
pub(super) const ACCESS_KEY_ID_FILE: &str = "access-key-id";
pub(super) const SECRET_ACCESS_KEY_FILE: &str = "secret-access-key";
pub(super) const CA_BUNDLE_FILE: &str = "ca.crt";
/// A failed backup or restore is not retried by the Job: the agent starts from scratch anyway,
/// and a new run (scheduled, or a new object) is the retry, with the failure on record.
const BACKOFF_LIMIT: i32 = 0;
/// A finished Job is kept a day for `kubectl logs`, then the Job controller deletes it. The
/// backup's status keeps everything the controller read from it.
const TTL_AFTER_FINISHED_SECONDS: i32 = 86_400;

/// What the Job does.
pub enum Task<'a> {
    /// Back up the cluster as this backup, compressed as `compression` says (resolved by the
    /// backup controller: the backup's own, else its cluster's, else the default).
    Backup {
        backup: &'a PostgreSQLBackup,
        compression: BackupCompression,
    },
    /// Restore the backup called `backup_name`, whose manifest is `manifest_key`, as this
    /// restore asks.
    Restore {
        restore: &'a PostgreSQLRestore,
        backup_name: &'a str,
        manifest_key: &'a str,
    },
}

impl Task<'_> {
    /// The object the Job belongs to (its controlling owner).
    fn owner(&self) -> Option<OwnerReference> {
        match self {
            Self::Backup { backup, .. } => backup.controller_owner_ref(&()),
            Self::Restore { restore, .. } => restore.controller_owner_ref(&()),
        }
    }

    pub(super) fn owner_meta(&self) -> &ObjectMeta {
        match self {
            Self::Backup { backup, .. } => &backup.metadata,
            Self::Restore { restore, .. } => &restore.metadata,
        }
    }

    /// `backup` or `restore`: the agent's subcommand, the container's name and the Jobs'
    /// `app.kubernetes.io/component`.
    pub fn verb(&self) -> &'static str {
        match self {
            Self::Backup { .. } => "backup",
            Self::Restore { .. } => "restore",
        }
    }

    /// The name of the backup the agent writes or reads.
    pub(super) fn backup_name(&self) -> String {
        match self {
            Self::Backup { backup, .. } => backup.name_any(),
            Self::Restore { backup_name, .. } => (*backup_name).to_owned(),
        }
    }

    /// The label naming the owner: `db.example.com/backup` or `db.example.com/restore`.
    fn owner_label(&self) -> &'static str {
        match self {
            Self::Backup { .. } => BACKUP_LABEL,
            Self::Restore { .. } => RESTORE_LABEL,
        }
    }

    /// The agent's arguments after `agent <verb>`: how to compress a backup; what to restore,
    /// and whether to replace.
    fn arguments(&self) -> Vec<String> {
        let restore = match self {
            Self::Backup { compression, .. } => return compression_arguments(compression),
            Self::Restore { restore, .. } => restore,
        };
        let mut arguments: Vec<String> = restore
            .spec
            .databases
            .iter()
            .flat_map(|database| ["--database".to_owned(), database.clone()])
            .collect();
        if restore.spec.drop_existing {
            arguments.push("--drop-existing".to_owned());
        }
        arguments
    }

    fn job_name(&self) -> String {
        let owner = self.owner_meta().name.clone().unwrap_or_default();
        match self {
            Self::Backup { .. } => job_name(&owner),
            Self::Restore { .. } => restore_job_name(&owner),
        }
    }
}

/// `--compression METHOD`, and `--compression-level LEVEL` when a level is set (else the agent
/// picks the method's default). Never `--dump-compression`, which the agent refuses beside them.
fn compression_arguments(compression: &BackupCompression) -> Vec<String> {
    let mut arguments = vec![
        "--compression".to_owned(),
        compression.method.as_str().to_owned(),
    ];
    if let Some(level) = compression.level {
        arguments.extend(["--compression-level".to_owned(), level.to_string()]);
    }
    arguments
}

/// What a backup or restore Job is made of.
pub struct JobInput<'a> {
    pub task: Task<'a>,
    pub cluster: &'a PostgreSQLCluster,
    /// The storage the backup is written to or read from.
    pub storage: &'a S3Storage,
    /// The key prefix of the cluster's backups (the storage's, or `<namespace>/<cluster>`).
    pub prefix: &'a str,
    pub postgres_image_repository: &'a str,
    pub agent_image: &'a str,
    /// The Job's `activeDeadlineSeconds`.
    pub active_deadline: Duration,
    /// The reconcile's trace context as a W3C `traceparent`, for the agent's spans to join.
    pub trace_parent: Option<String>,
    /// The manager's own `OTEL_*` variables, passed on so that the agent exports where the
    /// manager does.
    pub otel_env: &'a [(String, String)],
}

/// A backup Job's name: `<backup>-backup`, a DNS label (its pods carry it in the `job-name`
/// label, which allows 63 characters).
pub fn job_name(backup: &str) -> String {
    names::child_name(backup, "-backup", NameKind::DnsLabel, DNS_LABEL_MAX)
}

/// A restore Job's name: `<restore>-restore`, a DNS label.
pub fn restore_job_name(restore: &str) -> String {
    names::child_name(restore, "-restore", NameKind::DnsLabel, DNS_LABEL_MAX)
}

/// The Job, owned by the backup or restore it runs.
pub fn build(input: &JobInput<'_>) -> Job {
    let labels = job_labels(input);
    let mut pod = PodSpec {
        restart_policy: Some("Never".to_owned()),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(POSTGRES_UID),
            run_as_group: Some(POSTGRES_UID),
            fs_group: Some(POSTGRES_UID),
            seccomp_profile: Some(runtime_default_seccomp()),
            ..PodSecurityContext::default()
        }),
        // The Job's pods need no API access.
        automount_service_account_token: Some(false),
        init_containers: Some(vec![install_pgkube_container(
            "install-agent",
            input.agent_image,
            AGENT_VOLUME,
            AGENT_MOUNT,
            AGENT,
        )]),
        containers: vec![agent_container(input)],
        volumes: Some(inputs::volumes(input)),
        ..PodSpec::default()
    };
    Scheduling::of(&input.cluster.spec).apply_to(&mut pod);
    Job {
        metadata: ObjectMeta {
            name: Some(input.task.job_name()),
            namespace: input.task.owner_meta().namespace.clone(),
            labels: Some(labels.clone()),
            owner_references: input.task.owner().map(|owner| vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(BACKOFF_LIMIT),
            active_deadline_seconds: Some(
                i64::try_from(input.active_deadline.as_secs()).unwrap_or(i64::MAX),
            ),
            ttl_seconds_after_finished: Some(TTL_AFTER_FINISHED_SECONDS),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            ..JobSpec::default()
        }),
        ..Job::default()
    }
}

fn job_labels(input: &JobInput<'_>) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "pgkube".to_owned()),
        (
            "app.kubernetes.io/component".to_owned(),
            input.task.verb().to_owned(),
        ),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            "pgkube".to_owned(),
        ),
        (
            CLUSTER_LABEL.to_owned(),
            names::label_value(&input.cluster.name_any()),
        ),
        (
            input.task.owner_label().to_owned(),
            names::label_value(input.task.owner_meta().name.as_deref().unwrap_or_default()),
        ),
    ])
}

fn agent_container(input: &JobInput<'_>) -> Container {
    Container {
        name: input.task.verb().to_owned(),
        image: Some(format!(
            "{}:{}",
            input.postgres_image_repository, input.cluster.spec.version
        )),
        command: Some(
            [AGENT, "agent", input.task.verb()]
                .map(str::to_owned)
                .to_vec(),
        ),
        args: Some(input.task.arguments()).filter(|arguments| !arguments.is_empty()),
        env: Some(inputs::agent_env(input)),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        security_context: Some(restricted_security_context()),
        volume_mounts: Some(vec![
            mount(AGENT_VOLUME, AGENT_MOUNT, true),
            mount(SUPERUSER_VOLUME, SUPERUSER_MOUNT, true),
            mount(S3_VOLUME, S3_MOUNT, true),
        ]),
        ..Container::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EnvVar, SecretKeySelector};
    use pgkube_crds::{
        CompressionMethod, LocalReference, PostgreSQLBackupSpec, PostgreSQLClusterSpec,
        S3Credentials,
    };

    fn selector(name: &str, key: &str) -> SecretKeySelector {
        SecretKeySelector {
            name: name.to_owned(),
            key: key.to_owned(),
            optional: None,
        }
    }

    fn storage() -> S3Storage {
        S3Storage {
            bucket: "backups".to_owned(),
            prefix: None,
            endpoint: Some("https://s3.example:9000".to_owned()),
            region: "garage".to_owned(),
            force_path_style: true,
            ca_bundle: Some(selector("s3-ca", "ca.pem")),
            credentials: S3Credentials {
                access_key_id: selector("s3-keys", "id"),
                secret_access_key: selector("s3-keys", "secret"),
            },
            server_side_encryption: None,
        }
    }

    fn cluster() -> PostgreSQLCluster {
        let mut spec: PostgreSQLClusterSpec =
            serde_json::from_value(serde_json::json!({"storage": "1Gi", "version": "15"}))
                .expect("spec");
        spec.node_selector = BTreeMap::from([("disk".to_owned(), "ssd".to_owned())]);
        let mut cluster = PostgreSQLCluster::new("main", spec);
        cluster.metadata.namespace = Some("db".to_owned());
        cluster.metadata.uid = Some("cluster-uid".to_owned());
        cluster
    }

    fn backup() -> PostgreSQLBackup {
        let mut backup = PostgreSQLBackup::new(
            "nightly",
            PostgreSQLBackupSpec {
                cluster: LocalReference {
                    name: "main".to_owned(),
                },
                method: Default::default(),
                deletion_policy: Default::default(),
                compression: None,
            },
        );
        backup.metadata.namespace = Some("db".to_owned());
        backup.metadata.uid = Some("0000-uid".to_owned());
        backup
    }

    fn job() -> Job {
        job_compressed(BackupCompression::default())
    }

    fn job_compressed(compression: BackupCompression) -> Job {
        let (backup, cluster, storage) = (backup(), cluster(), storage());
        let otel = [(
            "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
            "http://collector:4317".to_owned(),
        )];
        build(&JobInput {
            task: Task::Backup {
                backup: &backup,
                compression,
            },
            cluster: &cluster,
            storage: &storage,
            prefix: "db/main",
            postgres_image_repository: "registry.local/postgres",
            agent_image: "registry.local/pgkube:1.2",
            active_deadline: Duration::from_secs(3600),
            trace_parent: Some(
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned(),
            ),
            otel_env: &otel,
        })
    }

    fn env_of(container: &Container) -> BTreeMap<String, EnvVar> {
        container
            .env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|var| (var.name.clone(), var))
            .collect()
    }

    #[test]
    fn the_job_is_owned_by_the_backup_and_never_retries_or_outlives_its_deadline() {
        let job = job();
        assert_eq!(job.metadata.name.as_deref(), Some("nightly-backup"));
        let owner = &job.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("PostgreSQLBackup", "nightly")
        );
        assert_eq!(owner.controller, Some(true));
        let spec = job.spec.expect("spec");
        assert_eq!(spec.backoff_limit, Some(0));
        assert_eq!(spec.active_deadline_seconds, Some(3600));
        assert_eq!(spec.ttl_seconds_after_finished, Some(86_400));
    }

    #[test]
    fn the_backup_agent_gets_the_method_and_a_level_only_when_one_is_set() {
        let args = |method, level| {
            let job = job_compressed(BackupCompression { method, level });
            let pod = job.spec.expect("spec").template.spec.expect("pod");
            pod.containers[0].args.clone().unwrap_or_default().join(" ")
        };
        assert_eq!(args(CompressionMethod::Gzip, None), "--compression gzip");
        assert_eq!(
            args(CompressionMethod::Zstd, Some(7)),
            "--compression zstd --compression-level 7"
        );
        assert_eq!(args(CompressionMethod::None, None), "--compression none");
        let gzip = args(CompressionMethod::Gzip, Some(9));
        assert_eq!(gzip, "--compression gzip --compression-level 9");
        assert!(!gzip.contains("--dump-compression"));
    }

    #[test]
    fn the_agent_runs_in_the_clusters_postgres_image_after_an_init_container_copies_it() {
        let pod = job().spec.expect("spec").template.spec.expect("pod");
        let init = pod.init_containers.expect("init");
        assert_eq!(init[0].image.as_deref(), Some("registry.local/pgkube:1.2"));
        assert_eq!(
            init[0].args.as_deref(),
            Some(
                &[
                    "instance".to_owned(),
                    "install".to_owned(),
                    AGENT.to_owned()
                ][..]
            )
        );
        let main = &pod.containers[0];
        assert_eq!(main.image.as_deref(), Some("registry.local/postgres:15"));
        assert_eq!(
            main.command.as_deref(),
            Some(&[AGENT.to_owned(), "agent".to_owned(), "backup".to_owned()][..])
        );
        assert_eq!(
            main.args.as_deref(),
            Some(&["--compression".to_owned(), "zstd".to_owned()][..]),
            "nothing but the compression on the command line"
        );
        assert_eq!(
            main.termination_message_policy.as_deref(),
            Some("FallbackToLogsOnError")
        );
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        assert_eq!(
            pod.node_selector,
            Some(BTreeMap::from([("disk".to_owned(), "ssd".to_owned())]))
        );
    }

    #[test]
    fn every_container_is_restricted() {
        let pod = job().spec.expect("spec").template.spec.expect("pod");
        let pod_context = pod.security_context.expect("pod security context");
        assert_eq!(pod_context.run_as_non_root, Some(true));
        for container in pod
            .init_containers
            .expect("init")
            .iter()
            .chain(&pod.containers)
        {
            let context = container
                .security_context
                .as_ref()
                .expect("security context");
            assert_eq!(
                context.allow_privilege_escalation,
                Some(false),
                "{}",
                container.name
            );
            assert_eq!(
                context.capabilities.as_ref().and_then(|c| c.drop.clone()),
                Some(vec!["ALL".to_owned()])
            );
            assert_eq!(context.run_as_non_root, Some(true));
        }
    }

    #[test]
    fn it_connects_through_the_rw_service_with_secrets_as_files() {
        let pod = job().spec.expect("spec").template.spec.expect("pod");
        let env = env_of(&pod.containers[0]);
        let plain = |name: &str| env.get(name).and_then(|v| v.value.clone());
        assert_eq!(plain("PGHOST").as_deref(), Some("main-rw"));
        assert_eq!(plain("PGKUBE_S3_PREFIX").as_deref(), Some("db/main"));
        // The backup's directory is named by both uids: <prefix>/<cluster-uid>/<name>/<uid>/.
        assert_eq!(plain("PGKUBE_CLUSTER_UID").as_deref(), Some("cluster-uid"));
        assert_eq!(plain("PGKUBE_BACKUP_UID").as_deref(), Some("0000-uid"));
        assert_eq!(plain("PGKUBE_BACKUP_NAME").as_deref(), Some("nightly"));
        assert!(!env.contains_key("PGKUBE_MANIFEST_KEY"));
        assert_eq!(
            plain("PGKUBE_S3_ENDPOINT").as_deref(),
            Some("https://s3.example:9000")
        );
        assert_eq!(plain("PGKUBE_S3_FORCE_PATH_STYLE").as_deref(), Some("true"));
        assert_eq!(
            plain("PGKUBE_PGPASSWORD_FILE").as_deref(),
            Some("/etc/pgkube/superuser/password")
        );
        assert_eq!(
            plain("TRACEPARENT").as_deref(),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        );
        assert_eq!(
            plain("OTEL_EXPORTER_OTLP_ENDPOINT").as_deref(),
            Some("http://collector:4317")
        );
        for name in ["PGPASSWORD", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
            assert!(
                !env.contains_key(name),
                "{name} must not be in the environment"
            );
        }
        // The keys come from the Secret keys the storage names.
        let volumes = pod.volumes.expect("volumes");
        let s3 = volumes
            .iter()
            .find(|v| v.name == S3_VOLUME)
            .expect("s3 volume");
        let sources = s3
            .projected
            .as_ref()
            .and_then(|p| p.sources.clone())
            .expect("sources");
        let projected: Vec<(String, String, String)> = sources
            .iter()
            .filter_map(|source| source.secret.as_ref())
            .flat_map(|secret| {
                secret
                    .items
                    .iter()
                    .flatten()
                    .map(|item| (secret.name.clone(), item.key.clone(), item.path.clone()))
            })
            .collect();
        assert_eq!(
            projected,
            [
                (
                    "s3-keys".to_owned(),
                    "id".to_owned(),
                    ACCESS_KEY_ID_FILE.to_owned()
                ),
                (
                    "s3-keys".to_owned(),
                    "secret".to_owned(),
                    SECRET_ACCESS_KEY_FILE.to_owned()
                ),
                (
                    "s3-ca".to_owned(),
                    "ca.pem".to_owned(),
                    CA_BUNDLE_FILE.to_owned()
                ),
            ]
        );
    }

    #[test]
    fn a_restore_job_runs_agent_restore_with_what_to_restore_owned_by_the_restore() {
        let (cluster, storage) = (cluster(), storage());
        let mut restore = PostgreSQLRestore::new(
            "undo",
            pgkube_crds::PostgreSQLRestoreSpec {
                backup: Some(LocalReference {
                    name: "nightly".to_owned(),
                }),
                source: None,
                cluster: LocalReference {
                    name: "main".to_owned(),
                },
                databases: vec!["app".to_owned(), "shop".to_owned()],
                drop_existing: true,
                expected_system_identifier: None,
            },
        );
        restore.metadata.namespace = Some("db".to_owned());
        restore.metadata.uid = Some("1111-uid".to_owned());
        let job = build(&JobInput {
            task: Task::Restore {
                restore: &restore,
                backup_name: "nightly",
                manifest_key: "db/main/cluster-uid/nightly/0000-uid/manifest.json",
            },
            cluster: &cluster,
            storage: &storage,
            prefix: "db/main",
            postgres_image_repository: "registry.local/postgres",
            agent_image: "registry.local/pgkube:1.2",
            active_deadline: Duration::from_secs(7200),
            trace_parent: None,
            otel_env: &[],
        });
        assert_eq!(job.metadata.name.as_deref(), Some("undo-restore"));
        let owner = &job.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("PostgreSQLRestore", "1111-uid")
        );
        let labels = job.metadata.labels.clone().expect("labels");
        assert_eq!(labels["app.kubernetes.io/component"], "restore");
        assert_eq!(labels[RESTORE_LABEL], "undo");
        let spec = job.spec.expect("spec");
        assert_eq!(spec.active_deadline_seconds, Some(7200));
        let pod = spec.template.spec.expect("pod");
        let container = &pod.containers[0];
        assert_eq!(container.name, "restore");
        assert_eq!(
            container.command.as_deref(),
            Some(&["/pgkube/pgkube", "agent", "restore"].map(str::to_owned)[..])
        );
        assert_eq!(
            container.args.as_deref(),
            Some(
                &["--database", "app", "--database", "shop", "--drop-existing"].map(str::to_owned)
                    [..]
            )
        );
        let env = env_of(container);
        assert_eq!(env["PGKUBE_BACKUP_NAME"].value.as_deref(), Some("nightly"));
        assert_eq!(env["PGKUBE_S3_PREFIX"].value.as_deref(), Some("db/main"));
        assert_eq!(
            env["PGKUBE_MANIFEST_KEY"].value.as_deref(),
            Some("db/main/cluster-uid/nightly/0000-uid/manifest.json")
        );
        assert!(!env.contains_key("PGKUBE_BACKUP_UID"));
        assert!(!env.contains_key("TRACEPARENT"));
    }
}
