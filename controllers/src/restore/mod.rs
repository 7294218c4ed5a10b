//! The PostgreSQLRestore controller.
//!
//! Each reconcile of a restore that has not ended:
//! 1. **decide** ([`decide`], pure): refuse (Failed) a backup that does not exist, failed, or
//!    comes from a newer PostgreSQL major, and a source that is not a manifest key; wait
//!    (Pending, with a reason) for the backup to complete, for the target cluster to exist with
//!    a ready primary, for an earlier restore into it and for a running backup of it; fail once
//!    the pending deadline has passed.
//! 2. **check**: read the backup's manifest from storage. A missing manifest, one that cannot
//!    be parsed, or one from a newer major refuses the restore before any Job exists.
//! 3. **start**: record in `status.targetSystemIdentifier` which database the Job must find in
//!    the cluster ([`identity`]), then create the Job (the shared [`crate::agent_job`]), owned
//!    by the restore and built from that record, then record Running with the manifest key.
//! 4. **follow**: Completed with the databases and times the agent reported, or Failed with the
//!    reason from its pod. The agent checks the target's system identifier and verifies every
//!    object before it changes anything, so a restore into another database than expected
//!    (`SystemIdentifierMismatch`) or of a corrupted backup fails with the existing data
//!    untouched.
//!
//! Every phase ends: Pending has a deadline, a Job has `--restore-start-timeout` to start its
//! agent (why it has not shows in the status meanwhile, as for backups) and
//! `activeDeadlineSeconds` to end, and a Job that disappears before it ended fails the restore. The status is written with server-side
//! apply under [`STATUS_FIELD_MANAGER`], only when it changed, with an Event per change. The
//! target cluster learns of its restores by watching them (its `Restoring` condition); the
//! scheduler skips the cluster's ticks while one is unfinished.

pub mod decide;
pub mod identity;
mod in_place;
mod status;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::StreamExt;
use kube::api::ListParams;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use pgkube_crds::{
    PostgreSQLBackup, PostgreSQLCluster, PostgreSQLRestore, RestoreMethod, RestorePhase,
};
use tracing::{Instrument, Span, field, info_span, instrument};

use crate::agent_job::{self as job, JobFailure, JobState};
use crate::backup::access;
use crate::backup::decide::Reason;
use crate::backup::job_start::{self, Step};
use crate::events::Recorder;
use crate::storage::manifest::Manifest;
use crate::{Context, ShutdownSignal};
use decide::{Location, Next};
use status::Change;

/// Name of this controller in metrics, spans and logs.
pub const CONTROLLER: &str = "restore";
/// Field manager of the restores' status.
pub const STATUS_FIELD_MANAGER: &str = "pgkube-restore";
/// How soon a waiting restore looks again.
const WAIT_REQUEUE: Duration = Duration::from_secs(15);
/// How soon a restore whose agent runs looks again, for its progress.
const PROGRESS_REQUEUE: Duration =
    Duration::from_secs(pgkube_crds::PROGRESS_WRITE_INTERVAL_SECONDS.unsigned_abs());
/// Labels of the Jobs this controller makes, the only ones it watches.
const JOB_SELECTOR: &str =
    "app.kubernetes.io/managed-by=pgkube,app.kubernetes.io/component=restore";

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
    #[error(transparent)]
    Job(#[from] job::JobError),
    #[error("the restore has no namespace")]
    MissingNamespace,
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

/// State shared by the restore controller's reconciles.
pub struct RestoreContext {
    pub base: Context,
    recorder: Recorder,
    /// Every restore of the watched namespaces: a restore's siblings come from here.
    restores: Store<PostgreSQLRestore>,
    retries: crate::retries::Retries,
}

/// The one Controller of every watched namespace's restores.
pub struct RestoreController {
    controller: Controller<PostgreSQLRestore>,
    context: Arc<RestoreContext>,
}

impl RestoreController {
    /// One Controller for all watched namespaces, so that `--max-concurrent-reconciles` bounds
    /// them together (see `union_store`), owning the restore Jobs of each.
    pub fn new(context: &Context) -> Self {
        let client = &context.client;
        let namespaces = crate::watched_namespaces(&context.settings);
        let controller = crate::union_store::controller::<PostgreSQLRestore>(
            client,
            &namespaces,
            context.settings.max_concurrent_reconciles,
            // Every change triggers, its own status writes too.
            |_| true,
        );
        let restores = controller.store();
        let controller = job::own_jobs(controller, client, &namespaces, JOB_SELECTOR);
        Self {
            controller,
            context: Arc::new(RestoreContext {
                recorder: Recorder::of_manager(context.events.clone()),
                base: context.clone(),
                restores,
                retries: crate::retries::Retries::default(),
            }),
        }
    }

    /// The restore cache; ready means every restore is known.
    pub fn store(&self) -> Store<PostgreSQLRestore> {
        self.context.restores.clone()
    }

    /// Runs until `shutdown` fires; reconciles in flight finish first.
    pub async fn run(self, shutdown: ShutdownSignal) {
        self.controller
            .graceful_shutdown_on(shutdown.wait())
            .run(reconcile, error_policy, self.context)
            .for_each(|result| async move {
                if let Err(error) = result {
                    tracing::debug!(controller = CONTROLLER, %error, "reconcile stream");
                }
            })
            .await;
    }
}

/// Reconciles one restore.
#[instrument(
    name = "reconcile",
    parent = None,
    skip_all,
    fields(
        controller = CONTROLLER,
        namespace = restore.namespace().unwrap_or_default(),
        name = restore.name_any(),
        phase = field::Empty,
        trace_id = field::Empty,
    )
)]
pub async fn reconcile(
    restore: Arc<PostgreSQLRestore>,
    context: Arc<RestoreContext>,
) -> Result<Action, Error> {
    crate::record_trace_id(&Span::current());
    let started = Instant::now();
    let result = reconcile_restore(&restore, &context).await;
    context
        .base
        .metrics
        .observe_reconcile(CONTROLLER, result.is_ok(), started.elapsed());
    match &result {
        Ok(action) => {
            context.retries.succeeded(restore.as_ref());
            tracing::debug!(?action, "reconciled");
        }
        Err(error) => tracing::warn!(%error, "reconcile failed"),
    }
    result
}

/// Retries after a delay that doubles with each consecutive failure, and says why in a
/// Warning Event.
pub fn error_policy(
    restore: Arc<PostgreSQLRestore>,
    error: &Error,
    context: Arc<RestoreContext>,
) -> Action {
    context
        .retries
        .failed(restore.as_ref(), error, &context.recorder)
}

async fn reconcile_restore(
    restore: &PostgreSQLRestore,
    context: &RestoreContext,
) -> Result<Action, Error> {
    let namespace = restore.namespace().ok_or(Error::MissingNamespace)?;
    Span::current().record("phase", field::debug(decide::phase(restore)));
    if restore.metadata.deletion_timestamp.is_some() {
        // Its Job goes with it (owner reference); nothing is left to undo.
        return Ok(Action::await_change());
    }
    if !decide::is_unfinished(restore) {
        return Ok(Action::await_change());
    }
    let in_place = restore.spec.method == RestoreMethod::PointInTime;
    if decide::phase(restore) == Some(RestorePhase::Running) {
        return match in_place {
            true => in_place::follow(context, restore, &namespace).await,
            false => follow_job(context, restore, &namespace).await,
        };
    }
    let read = Read::read(restore, context, &namespace).await?;
    match info_span!("decide").in_scope(|| read.decide(restore, context)) {
        Next::Finished => Ok(Action::await_change()),
        Next::Follow if in_place => in_place::follow(context, restore, &namespace).await,
        Next::Follow => follow_job(context, restore, &namespace).await,
        Next::StartInPlace(target) => {
            // Recorded, then acted on: the cluster carries out only a Running restore.
            status::write(context, restore, Change::RecoveringInPlace { target }).await?;
            Ok(Action::requeue(in_place::REQUEUE))
        }
        Next::Wait(reason) => {
            status::write(context, restore, Change::Pending(reason)).await?;
            Ok(Action::requeue(WAIT_REQUEUE))
        }
        Next::Fail(reason) => {
            status::write(context, restore, Change::Failed(reason)).await?;
            Ok(Action::await_change())
        }
        Next::Start(plan) => match read.cluster.as_ref() {
            Some(cluster) => start(context, restore, cluster, &plan, &namespace).await,
            // `decide` starts only a restore whose cluster it saw; never reached.
            None => Ok(Action::requeue(WAIT_REQUEUE)),
        },
    }
}

/// What a restore that has not started is decided from, read now from the API server: the
/// backup it names, its cluster, and the namespace's backups (a backup that just started must
/// hold the restore back); its sibling restores come from the cache.
struct Read {
    backup: Option<PostgreSQLBackup>,
    cluster: Option<PostgreSQLCluster>,
    backups: Vec<PostgreSQLBackup>,
    restores: Vec<Arc<PostgreSQLRestore>>,
}

impl Read {
    async fn read(
        restore: &PostgreSQLRestore,
        context: &RestoreContext,
        namespace: &str,
    ) -> Result<Self, Error> {
        let client = &context.base.client;
        let backup = match &restore.spec.backup {
            Some(reference) => Api::<PostgreSQLBackup>::namespaced(client.clone(), namespace)
                .get_opt(&reference.name)
                .await
                .map_err(kube_error("read", "PostgreSQLBackup", &reference.name))?,
            None => None,
        };
        let name = &restore.spec.cluster.name;
        let cluster = Api::<PostgreSQLCluster>::namespaced(client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(kube_error("read", "PostgreSQLCluster", name))?;
        let backups = Api::<PostgreSQLBackup>::namespaced(client.clone(), namespace)
            .list(&ListParams::default())
            .await
            .map_err(kube_error("list", "PostgreSQLBackup", namespace))?
            .items;
        let restores = context
            .restores
            .state()
            .into_iter()
            .filter(|other| other.namespace().as_deref() == Some(namespace))
            .collect();
        Ok(Self {
            backup,
            cluster,
            backups,
            restores,
        })
    }

    fn decide(&self, restore: &PostgreSQLRestore, context: &RestoreContext) -> Next {
        let restores: Vec<&PostgreSQLRestore> = self.restores.iter().map(AsRef::as_ref).collect();
        let backups: Vec<&PostgreSQLBackup> = self.backups.iter().collect();
        let facts = decide::Facts {
            backup: self.backup.as_ref(),
            cluster: self.cluster.as_ref(),
            restores: &restores,
            backups: &backups,
        };
        decide::next(
            restore,
            facts,
            Utc::now(),
            context.base.settings.restore_pending_deadline,
        )
    }
}

/// Checks the manifest, records the target's expected system identifier, creates the Job (or
/// takes over the one a previous reconcile created) from that record, then records Running.
async fn start(
    context: &RestoreContext,
    restore: &PostgreSQLRestore,
    cluster: &PostgreSQLCluster,
    plan: &decide::Start,
    namespace: &str,
) -> Result<Action, Error> {
    let location = &plan.location;
    match check_manifest(context, restore, cluster, location, namespace)
        .instrument(info_span!("check"))
        .await
    {
        Checked::Usable => {}
        Checked::Wait(reason) => {
            status::write(context, restore, Change::Pending(reason)).await?;
            return Ok(Action::requeue(WAIT_REQUEUE));
        }
        Checked::Refused(reason) => {
            status::write(context, restore, Change::Failed(reason)).await?;
            return Ok(Action::await_change());
        }
    }
    // Record, then act: the Job is built from the status as written, so what it checks is on
    // record before it can change anything.
    let target = plan.target_system_identifier.clone();
    let mut recorded = restore.clone();
    recorded.status = Some(status::write(context, restore, Change::Starting { target }).await?);
    let settings = &context.base.settings;
    let desired = info_span!("build").in_scope(|| {
        job::build(&job::JobInput {
            task: job::Task::Restore {
                restore: &recorded,
                backup_name: &location.backup_name,
                manifest_key: &location.manifest_key,
            },
            cluster,
            storage: &location.storage,
            prefix: &location.prefix,
            postgres_image_repository: &settings.postgres_image_repository,
            agent_image: &settings.agent_image,
            active_deadline: settings.restore_active_deadline,
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
        restore.metadata.uid.as_deref(),
    )
    .instrument(info_span!("apply"))
    .await?;
    let change = Change::Running {
        job: name,
        manifest_key: location.manifest_key.clone(),
    };
    status::write(context, &recorded, change).await?;
    // Soon: whether its pod starts is seen by looking (see `not_started`).
    Ok(Action::requeue(WAIT_REQUEUE))
}

/// What reading the manifest said.
enum Checked {
    Usable,
    /// The storage did not answer (or its Secrets are missing): try again, up to the deadline.
    Wait(Reason),
    Refused(Reason),
}

/// Reads the manifest the restore names and checks that the cluster can restore it.
async fn check_manifest(
    context: &RestoreContext,
    restore: &PostgreSQLRestore,
    cluster: &PostgreSQLCluster,
    location: &Location,
    namespace: &str,
) -> Checked {
    let unavailable = |message: String| {
        let reason = Reason::new("StorageUnavailable", message);
        let deadline = context.base.settings.restore_pending_deadline;
        match decide::wait_or_time_out(restore, reason, Utc::now(), deadline) {
            Ok(wait) => Checked::Wait(wait),
            Err(refusal) => Checked::Refused(refusal),
        }
    };
    let bucket = match access::connect(&context.base.client, namespace, &location.storage).await {
        Ok(bucket) => bucket,
        Err(error) => return unavailable(error.to_string()),
    };
    let key = &location.manifest_key;
    let bytes = match bucket.read_object(key).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => {
            return Checked::Refused(Reason::new(
                "ManifestNotFound",
                format!("no manifest at {key} in bucket {}", location.storage.bucket),
            ));
        }
        Err(error) => return unavailable(error.to_string()),
    };
    let manifest = match Manifest::parse(key, &bytes) {
        Ok(manifest) => manifest,
        Err(error) => {
            return Checked::Refused(Reason::new("InvalidManifest", error.to_string()));
        }
    };
    match decide::newer_major(&manifest.postgresql_version, cluster) {
        Some(refusal) => Checked::Refused(refusal),
        None => Checked::Usable,
    }
}

/// Follows the Job of a running restore to its end.
async fn follow_job(
    context: &RestoreContext,
    restore: &PostgreSQLRestore,
    namespace: &str,
) -> Result<Action, Error> {
    let name = restore
        .status
        .as_ref()
        .and_then(|s| s.job_name.clone())
        .unwrap_or_else(|| job::restore_job_name(&restore.name_any()));
    let change = match job::state(&context.base.client, namespace, &name).await? {
        Some(JobState::Starting { why, created }) => {
            return not_started(context, restore, namespace, &name, &why, created).await;
        }
        Some(JobState::Running) => {
            // A pod that waited before says now that it runs.
            let running = Reason::new(status::RUNNING_REASON, running_message(restore, &name));
            let client = &context.base.client;
            let previous = restore.status.as_ref().and_then(|s| s.progress.as_ref());
            let progress =
                job::progress_to_write(client, namespace, &name, job::RESTORE_CONTAINER, previous)
                    .await;
            status::write(context, restore, Change::Progress(running, progress)).await?;
            return Ok(Action::requeue(PROGRESS_REQUEUE));
        }
        Some(JobState::Succeeded(Some(result))) if result.status == "Completed" => {
            Change::Completed(result)
        }
        Some(JobState::Succeeded(_)) => Change::Failed(Reason::new(
            "NoResult",
            "the restore Job succeeded but its pod left no readable result",
        )),
        Some(JobState::Failed(failure)) => Change::Failed(job_failure(failure)),
        None => Change::Failed(Reason::new(
            "JobDeleted",
            format!("the restore Job {name} was deleted before it ended"),
        )),
    };
    status::write(context, restore, change).await?;
    Ok(Action::await_change())
}

/// Shows why the restore's Job has not started, or fails the restore once it is too late (as
/// for backups, see [`crate::backup::job_start`]): deleting a Job whose agent never ran changes
/// nothing in the database.
async fn not_started(
    context: &RestoreContext,
    restore: &PostgreSQLRestore,
    namespace: &str,
    job: &str,
    why: &job::NotStarted,
    created: Option<k8s_openapi::jiff::Timestamp>,
) -> Result<Action, Error> {
    let timeout = context.base.settings.restore_start_timeout;
    let now = k8s_openapi::jiff::Timestamp::now();
    let (reason, again) = match job_start::step("restore", job, why, created, now, timeout) {
        Step::OnItsWay(again) => (
            Reason::new(status::RUNNING_REASON, running_message(restore, job)),
            again,
        ),
        Step::Trouble(reason, again) => (reason, again),
        Step::GiveUp(reason) => {
            job::delete(&context.base.client, namespace, job).await?;
            status::write(context, restore, Change::Failed(reason)).await?;
            return Ok(Action::await_change());
        }
    };
    status::write(context, restore, Change::Progress(reason, None)).await?;
    Ok(Action::requeue(again))
}

/// The message of the restore while its Job `job` runs, with the manifest key it recorded.
fn running_message(restore: &PostgreSQLRestore, job: &str) -> String {
    let key = restore
        .status
        .as_ref()
        .and_then(|s| s.restored_object_key.as_deref())
        .unwrap_or_default();
    status::running_message(job, key)
}

/// The restore's reason for its failed Job: the agent's own when it is one the restore knows
/// (a target that is not the expected database), else `JobFailed`; the agent's message either
/// way.
fn job_failure(failure: JobFailure) -> Reason {
    let JobFailure { reason, message } = failure;
    match reason.as_deref() {
        Some(identity::SYSTEM_IDENTIFIER_MISMATCH) => {
            Reason::new(identity::SYSTEM_IDENTIFIER_MISMATCH, message)
        }
        _ => Reason::new("JobFailed", message),
    }
}
