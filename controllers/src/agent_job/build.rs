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
use k8s_openapi::api::core::v1::{
    Container, PodSecurityContext, PodSpec, PodTemplateSpec, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use pgkube_crds::{
    BackupCompression, CLUSTER_LABEL, PostgreSQLBackup, PostgreSQLCluster, PostgreSQLRestore,
    S3Storage,
};

use crate::backup::physical::Source;
use crate::cluster::build::{ChildNames, POSTGRES_UID, ROLE_LABEL, selector_labels};
use crate::cluster::roles::PRIMARY;
use crate::names::{self, DNS_LABEL_MAX, NameKind};
use crate::pod::{
    install_pgkube_container, mount, restricted_security_context, runtime_default_seccomp,
};
use crate::scheduling::Scheduling;

use super::inputs;

/// Label on backup Jobs and their pods: the backup's name (as a label value).
/// Name of the agent's container in a backup Job.
pub const BACKUP_CONTAINER: &str = "backup";
/// Name of the agent's container in a restore Job.
pub const RESTORE_CONTAINER: &str = "restore";
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
/// The cluster's CA and the client certificates the agent connects with.
pub(super) const TLS_VOLUME: &str = "tls";
pub(super) const TLS_MOUNT: &str = "/etc/pgkube/tls";
pub(super) const ACCESS_KEY_ID_FILE: &str = "access-key-id";
pub(super) const SECRET_ACCESS_KEY_FILE: &str = "secret-access-key";
pub(super) const CA_BUNDLE_FILE: &str = "ca.crt";
/// The replication role's Secret, for the base backup of a physical backup.
pub(super) const REPLICATION_VOLUME: &str = "replication";
pub(super) const REPLICATION_MOUNT: &str = "/etc/pgkube/replication";
/// The root filesystem is read-only: the agent's own copy of its certificates goes to /tmp.
pub(super) const TMP_VOLUME: &str = "tmp";
const TMP_MOUNT: &str = "/tmp";
/// A failed backup or restore is not retried by the Job: the agent starts from scratch anyway,
/// and a new run (scheduled, or a new object) is the retry, with the failure on record.
const BACKOFF_LIMIT: i32 = 0;
/// A finished Job is kept a day for `kubectl logs`, then the Job controller deletes it. The
/// backup's status keeps everything the controller read from it.
const TTL_AFTER_FINISHED_SECONDS: i32 = 86_400;

/// What the Job does.
pub enum Task<'a> {
    /// Back up the cluster as this backup, compressed as `compression` says (resolved by the
    /// backup controller: the backup's own, else its cluster's, else the default); a physical
    /// backup reads `source`.
    Backup {
        backup: &'a PostgreSQLBackup,
        compression: BackupCompression,
        source: Option<Source>,
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
            Self::Backup { .. } => BACKUP_CONTAINER,
            Self::Restore { .. } => RESTORE_CONTAINER,
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
    /// whether to replace, and which database the target must be (the system identifier the
    /// restore recorded in its status; none recorded, or `Any`: no check).
    fn arguments(&self) -> Vec<String> {
        let restore = match self {
            Self::Backup {
                compression,
                source,
                ..
            } => {
                let mut arguments = compression_arguments(compression);
                if source.is_some() {
                    arguments.extend(["--method".to_owned(), "physical".to_owned()]);
                }
                return arguments;
            }
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
        if let Some(identifier) = crate::restore::identity::agent_expectation(restore) {
            arguments.extend([
                "--expect-system-identifier".to_owned(),
                identifier.to_owned(),
            ]);
        }
        arguments
    }

    /// The instance a physical backup reads; `None` for anything else.
    pub(super) fn physical_source(&self) -> Option<&Source> {
        match self {
            Self::Backup { source, .. } => source.as_ref(),
            Self::Restore { .. } => None,
        }
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
    /// Requests and limits of the agent's container (and of the init container that installs
    /// it, so that a quota that wants them on every container admits the pod; an init
    /// container's needs do not add to the pod's). Empty: none, the namespace's defaults apply.
    pub resources: &'a ResourceRequirements,
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
        // The Job's pods need no API access; their account may still give them the identity
        // their storage credentials come from.
        automount_service_account_token: Some(false),
        service_account_name: input.cluster.spec.service_account_name.clone(),
        init_containers: Some(vec![Container {
            resources: resources(input),
            ..install_pgkube_container(
                "install-agent",
                input.agent_image,
                AGENT_VOLUME,
                AGENT_MOUNT,
                AGENT,
            )
        }]),
        containers: vec![agent_container(input)],
        volumes: Some(inputs::volumes(input)),
        ..PodSpec::default()
    };
    scheduling(input).apply_to(&mut pod);
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

/// Where the Job's pod may run: where the cluster's pods may; a backup also prefers a node
/// other than the primary's.
fn scheduling(input: &JobInput<'_>) -> Scheduling {
    match input.task {
        Task::Backup { .. } => {
            let names = ChildNames::for_cluster(&input.cluster.name_any());
            let mut primary = selector_labels(&names);
            primary.insert(ROLE_LABEL.to_owned(), PRIMARY.to_owned());
            Scheduling::for_backup(&input.cluster.spec, &primary)
        }
        Task::Restore { .. } => Scheduling::of(&input.cluster.spec),
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
            input.postgres_image_repository, input.cluster.spec.postgres_version
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
        resources: resources(input),
        volume_mounts: Some(volume_mounts(&input.task)),
        ..Container::default()
    }
}

/// The agent's files; a physical backup also gets the replication role's password.
fn volume_mounts(task: &Task<'_>) -> Vec<k8s_openapi::api::core::v1::VolumeMount> {
    let mut mounts = vec![
        mount(AGENT_VOLUME, AGENT_MOUNT, true),
        mount(SUPERUSER_VOLUME, SUPERUSER_MOUNT, true),
        mount(S3_VOLUME, S3_MOUNT, true),
        mount(TLS_VOLUME, TLS_MOUNT, true),
        mount(TMP_VOLUME, TMP_MOUNT, false),
    ];
    if task.physical_source().is_some() {
        mounts.push(mount(REPLICATION_VOLUME, REPLICATION_MOUNT, true));
    }
    mounts
}

/// The containers' resources, or none when no request or limit is set.
fn resources(input: &JobInput<'_>) -> Option<ResourceRequirements> {
    let set = |map: &Option<BTreeMap<String, _>>| map.as_ref().is_some_and(|m| !m.is_empty());
    let resources = input.resources;
    (set(&resources.requests) || set(&resources.limits)).then(|| resources.clone())
}

#[cfg(test)]
mod tests;
