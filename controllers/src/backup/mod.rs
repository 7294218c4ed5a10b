//! The PostgreSQLBackup controller.
//!
//! Each reconcile of a backup that has not ended:
//! 1. **decide** ([`decide`], pure): wait (Pending, with a reason) while the cluster is missing,
//!    has no storage or is not ready, or while another backup of the cluster goes first; fail
//!    once the pending deadline has passed; otherwise start.
//! 2. **start**: create the Job ([`job`]), owned by the backup, then record Running with the
//!    resolved storage and the manifest's key in the status, so that verification, deletion and
//!    restores use the storage the backup was written to, whatever the cluster's spec says
//!    later. The key is in a directory of the backup's own, named by the cluster's uid and the
//!    backup's ([`crate::storage::keys`]): another cluster on the same prefix, or a later backup
//!    of the same name, never writes there. The compression
//!    is resolved then too ([`decide::compression`]: the backup's own, else the cluster's
//!    `backup.compression`, else zstd at the agent's default level), passed to the agent and
//!    recorded in `status.compression`; a later change of the cluster's default does not touch
//!    a backup that started.
//! 3. **follow** ([`follow`]): while the Job's pod has not started the agent, say why in the
//!    status (the pod's waiting reason or scheduling condition) and give the Job up after the
//!    start timeout ([`job_start`]). When the Job completed, read the agent's result from its
//!    pod's termination message and [`verify`] the manifest and objects in storage; only then
//!    Completed. When it failed (or passed its deadline): Failed with the pod's reason.
//!
//! Every phase ends: Pending has a deadline, a Job has the start timeout to start its agent and
//! `activeDeadlineSeconds` to end, and a Job that disappears before it ended fails the backup
//! (unless its manifest is in storage and checks out).
//!
//! After each completed backup, and every hour, a retention pass ([`retention_pass`]) prunes the
//! cluster's expired backups, except those that unfinished restores read ([`holds`]).
//!
//! Deletion: with `deletionPolicy: Delete` the finalizer [`pgkube_crds::BACKUP_DATA_FINALIZER`] keeps the
//! object until its stored objects are deleted (the manifest first, so a half-deleted backup
//! never looks complete), and while an unfinished restore reads the backup; a failure keeps the
//! finalizer and says why ([`remove`]). `Retain` backups carry no finalizer and their data
//! stays.
//!
//! The status is written with server-side apply under [`STATUS_FIELD_MANAGER`], only when it
//! changed, with an Event per change of phase.

pub(crate) mod access;
pub mod decide;
pub mod holds;
pub mod job_start;
mod ownership;
pub mod physical;
mod remove;
pub mod retention_pass;
mod status;
pub mod verify;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use pgkube_crds::{
    BackupPhase, DeletionPolicy, PostgreSQLBackup, PostgreSQLCluster, PostgreSQLRestore, S3Storage,
};
use serde_json::json;
use tracing::{Instrument, Span, field, info_span, instrument};

use crate::agent_job::{self as job, JobState};
use crate::events::Recorder;
use crate::metrics::ClusterLabels;
use crate::{Context, ShutdownSignal};
use decide::Next;
use status::Change;

/// Name of this controller in metrics, spans and logs.
pub const CONTROLLER: &str = "backup";
/// Field manager of the backups' status and of their Jobs.
pub const STATUS_FIELD_MANAGER: &str = "pgkube-backup";
/// How soon a waiting backup looks again.
const WAIT_REQUEUE: Duration = Duration::from_secs(15);
/// How soon a backup whose agent runs looks again, for its progress.
const PROGRESS_REQUEUE: Duration =
    Duration::from_secs(pgkube_crds::PROGRESS_WRITE_INTERVAL_SECONDS.unsigned_abs());
/// Labels of the Jobs this controller makes, the only ones it watches.
const JOB_SELECTOR: &str = "app.kubernetes.io/managed-by=pgkube,app.kubernetes.io/component=backup";

/// Errors of one reconcile; each is retried with a backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {action} {kind} {name}: {source}")]
    Kube {
        action: &'static str,
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot reach the backup's storage: {0}")]
    Access(#[from] access::AccessError),
    #[error("cannot check the backup in storage: {0}")]
    Storage(#[source] crate::storage::StorageError),
    #[error("cannot delete the backup's data: {0}")]
    Remove(#[source] crate::storage::StorageError),
    #[error("the backup has no namespace")]
    MissingNamespace,
    #[error("cannot tell where the backup goes: {0}")]
    Keys(#[source] crate::storage::StorageError),
    #[error(transparent)]
    Job(#[from] job::JobError),
}

fn kube_error(
    action: &'static str,
    kind: &'static str,
    name: &str,
) -> impl FnOnce(kube::Error) -> Error {
    let name = name.to_owned();
    move |source| Error::Kube {
        action,
        kind,
        name,
        source,
    }
}

/// State shared by the backup controller's reconciles.
pub struct BackupContext {
    pub base: Context,
    recorder: Recorder,
    /// Every backup of the watched namespaces: a backup's siblings come from here.
    backups: Store<PostgreSQLBackup>,
    retries: crate::retries::Retries,
}

/// The one Controller of every watched namespace's backups.
pub struct BackupController {
    controller: Controller<PostgreSQLBackup>,
    context: Arc<BackupContext>,
}

impl BackupController {
    /// One Controller for all watched namespaces, so that `--max-concurrent-reconciles` bounds
    /// them together (see `union_store`), owning the backup Jobs of each.
    pub fn new(context: &Context) -> Self {
        let client = &context.client;
        let namespaces = crate::watched_namespaces(&context.settings);
        let controller = crate::union_store::controller::<PostgreSQLBackup>(
            client,
            &namespaces,
            context.settings.max_concurrent_reconciles,
            // Every change triggers, its own status writes too.
            |_| true,
        );
        let backups = controller.store();
        let controller = job::own_jobs(controller, client, &namespaces, JOB_SELECTOR);
        Self {
            controller,
            context: Arc::new(BackupContext {
                recorder: Recorder::of_manager(context.events.clone()),
                base: context.clone(),
                backups,
                retries: crate::retries::Retries::default(),
            }),
        }
    }

    /// The backup cache; ready means every backup is known.
    pub fn store(&self) -> Store<PostgreSQLBackup> {
        self.context.backups.clone()
    }

    /// Runs until `shutdown` fires; reconciles in flight finish first. The hourly retention
    /// passes run alongside.
    pub async fn run(self, shutdown: ShutdownSignal) {
        let hourly = retention_pass::hourly(self.context.clone(), shutdown.clone());
        let reconciles = self
            .controller
            .graceful_shutdown_on(shutdown.wait())
            .run(reconcile, error_policy, self.context)
            .for_each(|result| async move {
                if let Err(error) = result {
                    tracing::debug!(controller = CONTROLLER, %error, "reconcile stream");
                }
            });
        futures::future::join(reconciles, hourly).await;
    }
}

/// Reconciles one backup.
#[instrument(
    name = "reconcile",
    parent = None,
    skip_all,
    fields(
        controller = CONTROLLER,
        namespace = backup.namespace().unwrap_or_default(),
        name = backup.name_any(),
        phase = field::Empty,
        trace_id = field::Empty,
    )
)]
pub async fn reconcile(
    backup: Arc<PostgreSQLBackup>,
    context: Arc<BackupContext>,
) -> Result<Action, Error> {
    crate::record_trace_id(&Span::current());
    let started = Instant::now();
    let result = reconcile_backup(&backup, &context).await;
    context
        .base
        .metrics
        .observe_reconcile(CONTROLLER, result.is_ok(), started.elapsed());
    match &result {
        Ok(action) => {
            context.retries.succeeded(backup.as_ref());
            tracing::debug!(?action, "reconciled");
        }
        Err(error) => tracing::warn!(%error, "reconcile failed"),
    }
    result
}

/// Retries after a delay that doubles with each consecutive failure, and says why in a
/// Warning Event.
pub fn error_policy(
    backup: Arc<PostgreSQLBackup>,
    error: &Error,
    context: Arc<BackupContext>,
) -> Action {
    context
        .retries
        .failed(backup.as_ref(), error, &context.recorder)
}

async fn reconcile_backup(
    backup: &PostgreSQLBackup,
    context: &BackupContext,
) -> Result<Action, Error> {
    let namespace = backup.namespace().ok_or(Error::MissingNamespace)?;
    if backup.metadata.deletion_timestamp.is_some() {
        return remove::on_deletion(backup, context, &namespace).await;
    }
    if backup.spec.deletion_policy == DeletionPolicy::Delete {
        remove::ensure_finalizer(backup, &context.base.client, &namespace).await?;
    }
    let cluster = read_cluster(backup, context, &namespace).await?;
    let restores = read_restores(backup, context, &namespace).await?;
    let restores: Vec<&PostgreSQLRestore> = restores.iter().collect();
    let siblings: Vec<Arc<PostgreSQLBackup>> = context
        .backups
        .state()
        .into_iter()
        .filter(|other| other.namespace().as_deref() == Some(namespace.as_str()))
        .collect();
    let siblings: Vec<&PostgreSQLBackup> = siblings.iter().map(AsRef::as_ref).collect();
    let next = info_span!("decide").in_scope(|| {
        decide::next(
            backup,
            cluster.as_ref(),
            &siblings,
            &restores,
            Utc::now(),
            context.base.settings.backup_pending_deadline,
        )
    });
    Span::current().record("phase", field::debug(decide::phase(backup)));
    match next {
        Next::Finished => {
            record_if_completed(context, backup);
            Ok(Action::await_change())
        }
        Next::Wait(reason) => {
            status::write(context, backup, Change::Pending(reason)).await?;
            Ok(Action::requeue(WAIT_REQUEUE))
        }
        Next::Fail(reason) => {
            status::write(context, backup, Change::Failed(reason)).await?;
            Ok(Action::await_change())
        }
        Next::Start(storage) => match cluster.as_ref() {
            Some(cluster) => start(context, backup, cluster, *storage, &namespace).await,
            // `decide` starts only a backup whose cluster it saw; never reached.
            None => Ok(Action::requeue(WAIT_REQUEUE)),
        },
        Next::Follow => follow_job(context, backup, &namespace).await,
    }
}

/// The backup's cluster as the API server has it now (its readiness matters), or `None`.
async fn read_cluster(
    backup: &PostgreSQLBackup,
    context: &BackupContext,
    namespace: &str,
) -> Result<Option<PostgreSQLCluster>, Error> {
    // Only a backup that has not started needs its cluster.
    if !matches!(decide::phase(backup), None | Some(BackupPhase::Pending)) {
        return Ok(None);
    }
    let name = &backup.spec.cluster.name;
    Api::<PostgreSQLCluster>::namespaced(context.base.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(kube_error("read", "PostgreSQLCluster", name))
}

/// The restores of the namespace as the API server has them now (a restore that just started
/// must hold the backup back), read only for a backup that has not started.
async fn read_restores(
    backup: &PostgreSQLBackup,
    context: &BackupContext,
    namespace: &str,
) -> Result<Vec<PostgreSQLRestore>, Error> {
    if !matches!(decide::phase(backup), None | Some(BackupPhase::Pending)) {
        return Ok(Vec::new());
    }
    Api::<PostgreSQLRestore>::namespaced(context.base.client.clone(), namespace)
        .list(&kube::api::ListParams::default())
        .await
        .map(|list| list.items)
        .map_err(kube_error("list", "PostgreSQLRestore", namespace))
}

/// Creates the Job (one that exists already is followed only if this backup owns it: a
/// restart between the create and the status write), then records Running with the storage and
/// the compression.
async fn start(
    context: &BackupContext,
    backup: &PostgreSQLBackup,
    cluster: &PostgreSQLCluster,
    storage: S3Storage,
    namespace: &str,
) -> Result<Action, Error> {
    let settings = &context.base.settings;
    let prefix = storage.prefix.clone().unwrap_or_default();
    let keys = decide::new_backup_keys(&prefix, cluster, backup).map_err(Error::Keys)?;
    let compression = decide::compression(backup, cluster);
    // `decide` saw the same cluster and let the backup start, so this is not a wait.
    let Ok(source) = physical::source(backup, cluster) else {
        return Ok(Action::requeue(WAIT_REQUEUE));
    };
    let desired = info_span!("build").in_scope(|| {
        job::build(&job::JobInput {
            task: job::Task::Backup {
                backup,
                compression,
                source,
            },
            cluster,
            storage: &storage,
            prefix: &prefix,
            postgres_image_repository: &settings.postgres_image_repository,
            agent_image: &settings.agent_image,
            active_deadline: settings.backup_active_deadline,
            trace_parent: crate::trace_parent(&Span::current()),
            otel_env: &settings.otel_env,
            resources: &settings.agent_resources,
        })
    });
    let name = desired.name_any();
    job::create(
        &context.base.client,
        namespace,
        &desired,
        backup.metadata.uid.as_deref(),
    )
    .instrument(info_span!("apply"))
    .await?;
    let running = Change::Running {
        storage: Box::new(storage),
        manifest_key: keys.manifest(),
        compression,
        job: name,
    };
    status::write(context, backup, running).await?;
    // Soon: whether its pod starts is seen by looking (see `job_start`).
    Ok(Action::requeue(WAIT_REQUEUE))
}

/// Follows the Job of a running backup to its end.
async fn follow_job(
    context: &BackupContext,
    backup: &PostgreSQLBackup,
    namespace: &str,
) -> Result<Action, Error> {
    let client = &context.base.client;
    let name = backup
        .status
        .as_ref()
        .and_then(|s| s.job_name.clone())
        .unwrap_or_else(|| job::job_name(&backup.name_any()));
    let found = job::state(client, namespace, &name).await?;
    let deleted = found.is_none();
    let state = found.unwrap_or_else(|| {
        JobState::Failed(job::JobFailure::new(format!(
            "the backup Job {name} was deleted before it ended"
        )))
    });
    match state {
        JobState::Starting { why, created } => {
            job_start::follow(context, backup, namespace, &name, &why, created).await
        }
        JobState::Running => {
            if let Some(reason) = interruption(context, backup, namespace).await? {
                remove::stop_job(context, namespace, &name).await?;
                status::write(context, backup, Change::Failed(reason)).await?;
                return Ok(Action::await_change());
            }
            // A pod that waited before says now that it runs.
            let running =
                decide::Reason::new(status::RUNNING_REASON, status::running_message(&name));
            let previous = backup.status.as_ref().and_then(|s| s.progress.as_ref());
            let progress =
                job::progress_to_write(client, namespace, &name, job::BACKUP_CONTAINER, previous)
                    .await;
            status::write(context, backup, Change::Progress(running, progress)).await?;
            Ok(Action::requeue(PROGRESS_REQUEUE))
        }
        JobState::Succeeded(result) => {
            complete(context, backup, namespace, result.map(|r| *r)).await
        }
        JobState::Failed(failure) => {
            let change = Change::Failed(decide::Reason {
                reason: if deleted { "JobDeleted" } else { "JobFailed" },
                message: failure.message,
            });
            status::write(context, backup, change).await?;
            Ok(Action::await_change())
        }
    }
}

/// Why the running backup must stop: its cluster's primary moved since it started. The
/// cluster is read fresh (one GET per look at a running backup, which are few): this
/// controller does not watch clusters.
async fn interruption(
    context: &BackupContext,
    backup: &PostgreSQLBackup,
    namespace: &str,
) -> Result<Option<decide::Reason>, Error> {
    let name = &backup.spec.cluster.name;
    let cluster = Api::<PostgreSQLCluster>::namespaced(context.base.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(kube_error("read", "PostgreSQLCluster", name))?;
    Ok(cluster.and_then(|cluster| decide::interrupted_by_primary_change(backup, &cluster)))
}

/// Verifies what the agent reported, then Completed (or Failed when it does not check out).
async fn complete(
    context: &BackupContext,
    backup: &PostgreSQLBackup,
    namespace: &str,
    result: Option<job::AgentResult>,
) -> Result<Action, Error> {
    let Some(result) = result else {
        let reason = decide::Reason {
            reason: "NoResult",
            message: "the backup Job succeeded but its pod left no readable result".to_owned(),
        };
        status::write(context, backup, Change::Failed(reason)).await?;
        return Ok(Action::await_change());
    };
    let storage = backup
        .status
        .as_ref()
        .and_then(|s| s.storage.clone())
        .unwrap_or_default()
        .s3;
    let bucket = access::connect(&context.base.client, namespace, &storage).await?;
    // A backup that started before the key was recorded at the start has a legacy key, and a
    // manifest without uids.
    let recorded = backup
        .status
        .as_ref()
        .is_some_and(|s| s.object_key.is_some());
    let manifest_key = decide::manifest_key(backup).unwrap_or_default();
    let name = backup.name_any();
    let expected = verify::Expected {
        manifest_key: &manifest_key,
        backup_name: &name,
        backup_uid: backup.metadata.uid.as_deref().filter(|_| recorded),
    };
    let verified = verify::verify(&bucket, expected, &result)
        .instrument(info_span!("verify"))
        .await;
    let change = match verified {
        Ok(verified) => Change::Completed(verified),
        Err(verify::VerifyError::Storage(error)) => {
            // The store did not answer: try again rather than fail a backup that may be fine.
            return Err(Error::Storage(error));
        }
        Err(error) => Change::Failed(decide::Reason {
            reason: "VerificationFailed",
            message: error.to_string(),
        }),
    };
    let completed = matches!(change, Change::Completed(_));
    status::write(context, backup, change).await?;
    if completed {
        prune_after_backup(context, backup, namespace).await;
    }
    Ok(Action::await_change())
}

/// The retention pass that follows each completed backup. Its failure does not fail the
/// backup: the pass says why in an Event, and the hourly pass tries again.
async fn prune_after_backup(context: &BackupContext, backup: &PostgreSQLBackup, namespace: &str) {
    let name = &backup.spec.cluster.name;
    match Api::<PostgreSQLCluster>::namespaced(context.base.client.clone(), namespace)
        .get_opt(name)
        .await
    {
        Ok(Some(cluster)) => {
            retention_pass::run(context, &cluster).await;
        }
        Ok(None) => tracing::info!(cluster = %name, "the cluster is gone: no retention pass"),
        Err(error) => tracing::warn!(%error, "cannot read the cluster for a retention pass"),
    }
}

/// Keeps the last-success gauges right after a restart: every backup is reconciled once when
/// the controller starts.
fn record_if_completed(context: &BackupContext, backup: &PostgreSQLBackup) {
    let Some(status) = backup.status.as_ref() else {
        return;
    };
    if let (Some(BackupPhase::Completed), Some(finished), Some(size)) = (
        status.phase,
        status.completion_time.as_ref(),
        status.size_bytes,
    ) {
        context.base.metrics.record_completed_backup(
            &cluster_labels(backup),
            finished.0.as_second(),
            size,
        );
    }
}

/// The backup's cluster, as metric labels.
fn cluster_labels(backup: &PostgreSQLBackup) -> ClusterLabels {
    ClusterLabels {
        namespace: backup.namespace().unwrap_or_default(),
        cluster: backup.spec.cluster.name.clone(),
    }
}

/// Patches the status of `backup` with server-side apply.
async fn patch_status(
    client: &Client,
    backup: &PostgreSQLBackup,
    status: &pgkube_crds::PostgreSQLBackupStatus,
) -> Result<(), Error> {
    let name = backup.name_any();
    let namespace = backup.namespace().ok_or(Error::MissingNamespace)?;
    let body = json!({
        "apiVersion": PostgreSQLBackup::api_version(&()),
        "kind": PostgreSQLBackup::kind(&()),
        "status": status,
    });
    Api::<PostgreSQLBackup>::namespaced(client.clone(), &namespace)
        .patch_status(
            &name,
            &PatchParams::apply(STATUS_FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map(|_| ())
        .map_err(kube_error("write status of", "PostgreSQLBackup", &name))
}

/// The restores of every watched namespace, as the API server has them now: a restore that just
/// started must hold the backups it reads.
async fn watched_restores(context: &BackupContext) -> Result<Vec<PostgreSQLRestore>, Error> {
    let mut restores = Vec::new();
    for namespace in crate::watched_namespaces(&context.base.settings) {
        let api = crate::api::<PostgreSQLRestore>(&context.base.client, namespace.as_deref());
        let list = api
            .list(&kube::api::ListParams::default())
            .await
            .map_err(kube_error(
                "list",
                "PostgreSQLRestore",
                namespace.as_deref().unwrap_or("(all namespaces)"),
            ))?;
        restores.extend(list.items);
    }
    Ok(restores)
}

/// The holds of the unfinished restores of every watched namespace on the backups of the cache.
async fn current_holds(context: &BackupContext) -> Result<Vec<holds::Hold>, Error> {
    let restores = watched_restores(context).await?;
    let restores: Vec<&PostgreSQLRestore> = restores.iter().collect();
    let backups = context.backups.state();
    let backups: Vec<&PostgreSQLBackup> = backups.iter().map(AsRef::as_ref).collect();
    Ok(holds::holds(&restores, &backups))
}

/// Whether a backup's phase is one that ended.
fn ended(phase: Option<BackupPhase>) -> bool {
    matches!(phase, Some(BackupPhase::Completed | BackupPhase::Failed))
}
