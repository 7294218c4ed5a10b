//! The PostgreSQLCluster controller.
//!
//! Each reconcile is a pipeline, one span per step under the root span `reconcile`:
//! `read` the live children from the watch caches (no request: see `cache`) and ask each pod's
//! instance manager for its status -> `validate`
//! the spec against them (pure) -> `build` the desired children (pure) -> `apply` what differs
//! with server-side apply (building and comparing are skipped while nothing they depend on
//! changed since the children were last found up to date: see `settled`), and label each pod
//! with the role its instance manager reports ->
//! write the `status` when it changed (a change of details alone, shortly after a transition,
//! waits a few seconds: see `status::details_hold`), with an Event for each change -> send the
//! `commands` that move the primary, if any (see `failover`; a switchover or failover first
//! records itself in the status, in a reconcile of its own with the span `designate`). An
//! unchanged, ready cluster makes no write at all.
//!
//! Roles: one instance is the designated primary (`status.currentPrimary`, else the first
//! instance of a new cluster); the others stream from it. The `-rw` Service routes to the pod
//! labelled primary, `-ro` to the replicas, `-r` to any ready instance (see `roles`). While the
//! cluster has pods, it is looked at again every [`INSTANCE_REFRESH`] to refresh what the
//! instances report (reads only; a write only when something changed), or every
//! [`SOLE_INSTANCE_REFRESH`] when it is one running instance that matches its spec.
//!
//! A change Kubernetes cannot make in place (shrinking volumes, a new major version) is held
//! back: validation keeps the running value for it, the rest of the spec is applied as usual
//! and the refusal shows in the Progressing condition. An invalid spec applies nothing.
//!
//! Errors go to [`error_policy`], which retries each object with its own exponential backoff;
//! waiting for pods is a plain timed requeue. The finalizer [`CLEANUP_FINALIZER`] gives deletion
//! a hook that does not depend on the spec being valid; children are removed by the garbage
//! collector through their owner references, and backup data is never touched. The manager's
//! admission webhook normally puts the finalizer on a cluster as it is created; when it did not
//! (not installed, or not reachable then), the first reconcile adds it and does nothing else,
//! and the next, on that write's echo, goes on.

mod apply;
pub mod backups;
pub mod build;
mod cache;
mod drift;
mod echoes;
pub mod failover;
pub mod identity;
pub mod instances;
mod memory;
mod read;
pub mod restores;
pub mod roles;
mod settled;
pub mod status;
pub mod validate;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use pgkube_crds::{
    CLEANUP_FINALIZER, ClusterPhase, PostgreSQLBackup, PostgreSQLCluster, PostgreSQLClusterStatus,
    PostgreSQLRestore,
};
use rand::Rng;
use rand::distr::Alphanumeric;
use serde_json::json;
use tracing::{Instrument, Span, field, info_span, instrument};

use crate::events::Recorder;
use crate::lean::Lean;
use crate::{Context, ShutdownSignal, api, record_trace_id, truncate_note};
use build::ChildNames;
use status::{Issue, Observation};
use validate::LiveFacts;

/// Name of this controller in metrics, spans and logs.
pub const CONTROLLER: &str = "cluster";
/// Field manager of every child this controller applies.
pub const FIELD_MANAGER: &str = "pgkube";
/// Field manager of the status fields this controller writes. Distinct from the one of other
/// writers of the cluster's status (the backup scheduler): server-side apply removes fields a
/// manager stops sending, so two writers sharing a manager would erase each other's fields.
pub const STATUS_FIELD_MANAGER: &str = "pgkube-cluster";
/// How soon to look again while pods are starting or a change is rolling out.
const WAIT_REQUEUE: Duration = Duration::from_secs(10);
/// How often the instances of a cluster that has pods are asked for their status.
pub const INSTANCE_REFRESH: Duration = Duration::from_secs(15);
/// The same for a running cluster of one instance that matches its spec. It has no standby to
/// fail over to, and a change of its readiness comes at once through its StatefulSet's status
/// (the pod's readiness probe asks the same instance manager every 2 s); asking it every 15 s
/// would mostly find the same report, at a cost that grows with the number of clusters.
pub const SOLE_INSTANCE_REFRESH: Duration = Duration::from_secs(60);
/// First and longest retry delay after an error.
const BACKOFF_BASE: Duration = Duration::from_secs(2);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Errors of one reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {action} {kind} {name}: {source}")]
    Kube {
        action: &'static str,
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot encode a child as JSON: {0}")]
    Serialize(#[source] serde_json::Error),
    #[error("the cluster has no namespace")]
    MissingNamespace,
    #[error("internal error: {0}")]
    Invariant(&'static str),
    #[error(transparent)]
    Cache(#[from] cache::CacheError),
    #[error(transparent)]
    Finalizer(#[from] Box<kube::runtime::finalizer::Error<Error>>),
}

impl Error {
    /// The API server refused a write because the namespace is being deleted: it creates
    /// nothing new in such a namespace (its admission names the cause `NamespaceTerminating`).
    fn is_namespace_terminating(&self) -> bool {
        let Error::Kube {
            source: kube::Error::Api(status),
            ..
        } = self
        else {
            return false;
        };
        status.details.as_ref().is_some_and(|details| {
            details
                .causes
                .iter()
                .any(|cause| cause.reason == "NamespaceTerminating")
        })
    }
}

/// State shared by the cluster controller's reconciles.
pub struct ClusterContext {
    pub base: Context,
    recorder: Recorder,
    /// Consecutive failures per `namespace/name`, for the backoff and to publish an error
    /// Event only when the error changes; cleared on success.
    failures: Mutex<HashMap<String, Failures>>,
    /// Every PostgreSQLBackup the controllers watch, for the backup fields of the status.
    backups: Vec<Store<PostgreSQLBackup>>,
    /// Every PostgreSQLRestore the controllers watch, for the Restoring and Bootstrapped
    /// conditions.
    restores: Vec<Store<PostgreSQLRestore>>,
    /// The clusters' children, per watched namespace (or one for all).
    children: Vec<cache::ChildStores>,
    /// Clusters whose children were last found up to date, to skip building and comparing
    /// them while nothing they depend on changes.
    settled: settled::SettledClusters,
    /// The versions that this controller's status writes gave the clusters, shared with the
    /// trigger, which drops their echoes.
    echoes: Arc<echoes::StatusEchoes>,
}

impl ClusterContext {
    /// A context that sees no backups (see [`ClusterContext::with_backups`]).
    pub fn new(base: Context) -> Self {
        let recorder = Recorder::of_manager(base.events.clone());
        Self {
            base,
            recorder,
            failures: Mutex::default(),
            backups: Vec::new(),
            restores: Vec::new(),
            children: Vec::new(),
            settled: settled::SettledClusters::default(),
            echoes: Arc::default(),
        }
    }

    /// The same context, reading the children of clusters in `namespace` from caches of its
    /// own, which the returned future fills: for reconciles run without the controller (tests).
    pub fn with_caches_of(
        self,
        namespace: &str,
    ) -> (
        Self,
        impl std::future::Future<Output = ()> + Send + 'static + use<>,
    ) {
        let (stores, fill) = cache::ChildStores::standalone(&self.base.client, Some(namespace));
        (self.with_children(vec![stores]), fill)
    }

    /// The same context, reading the clusters' children from `stores`.
    fn with_children(self, stores: Vec<cache::ChildStores>) -> Self {
        Self {
            children: stores,
            ..self
        }
    }

    /// The same context, recording its status writes in `echoes` (which the trigger reads).
    fn with_echoes(self, echoes: Arc<echoes::StatusEchoes>) -> Self {
        Self { echoes, ..self }
    }

    /// The caches that hold the children of clusters in `namespace`.
    fn children_in(&self, namespace: &str) -> Option<&cache::ChildStores> {
        self.children.iter().find(|stores| stores.covers(namespace))
    }

    /// The same context, reading the cluster's backups from `stores`.
    pub fn with_backups(self, stores: Vec<Store<PostgreSQLBackup>>) -> Self {
        Self {
            backups: stores,
            ..self
        }
    }

    /// The same context, reading the cluster's restores from `stores`.
    pub fn with_restores(self, stores: Vec<Store<PostgreSQLRestore>>) -> Self {
        Self {
            restores: stores,
            ..self
        }
    }

    /// The restores into `cluster` as the caches have them.
    fn restores_of(&self, cluster: &PostgreSQLCluster) -> Vec<Arc<PostgreSQLRestore>> {
        let namespace = cluster.namespace();
        let name = cluster.name_any();
        self.restores
            .iter()
            .flat_map(Store::state)
            .filter(|restore| restore.namespace() == namespace && restore.spec.cluster.name == name)
            .collect()
    }

    /// The backups of `cluster` as the caches have them.
    fn backups_of(&self, cluster: &PostgreSQLCluster) -> Vec<Arc<PostgreSQLBackup>> {
        let namespace = cluster.namespace();
        let name = cluster.name_any();
        self.backups
            .iter()
            .flat_map(Store::state)
            .filter(|backup| backup.namespace() == namespace && backup.spec.cluster.name == name)
            .collect()
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, Failures>> {
        // A panic while holding the lock leaves the counts usable.
        self.failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The consecutive failures of one object.
#[derive(Debug, Default)]
struct Failures {
    count: u32,
    last_message: Option<String>,
}

impl Failures {
    /// Counts a failure with `message`; true when the message differs from the previous
    /// failure's, so that a retry failing the same way does not publish the same Event again.
    fn record(&mut self, message: &str) -> bool {
        self.count = self.count.saturating_add(1);
        let is_new = self.last_message.as_deref() != Some(message);
        if is_new {
            self.last_message = Some(message.to_owned());
        }
        is_new
    }
}

/// The one Controller of every watched namespace, with the store whose readiness means the
/// controller is ready.
pub struct ClusterController {
    controller: Controller<PostgreSQLCluster>,
    clusters: Store<PostgreSQLCluster>,
    context: Arc<ClusterContext>,
}

impl ClusterController {
    /// One Controller for all watched namespaces, so that `--max-concurrent-reconciles` bounds
    /// them together: each namespace has its own watches (a namespaced manager may not list
    /// cluster-wide), all feeding this Controller, which reads clusters from the union of the
    /// namespaces' stores (see `union_store`).
    pub fn new(context: &Context) -> Self {
        let client = &context.client;
        let namespaces = crate::watched_namespaces(&context.settings);
        let echoes = Arc::new(echoes::StatusEchoes::default());
        let mut controller = crate::union_store::controller::<PostgreSQLCluster>(
            client,
            &namespaces,
            context.settings.max_concurrent_reconciles,
            {
                let echoes = Arc::clone(&echoes);
                move |cluster| !echoes.is_echo(cluster)
            },
        );
        let clusters = controller.store();
        let (mut backups, mut restores, mut children) = (Vec::new(), Vec::new(), Vec::new());
        for namespace in &namespaces {
            let namespace = namespace.as_deref();
            let (with_runs, backup_store, restore_store) =
                watch_backups_and_restores(controller, client, namespace);
            let (with_children, child_stores) =
                cache::ChildStores::watch(with_runs, client, namespace);
            controller = with_children;
            backups.push(backup_store);
            restores.push(restore_store);
            children.push(child_stores);
        }
        let context = ClusterContext::new(context.clone())
            .with_backups(backups)
            .with_restores(restores)
            .with_children(children)
            .with_echoes(echoes);
        Self {
            controller,
            clusters,
            context: Arc::new(context),
        }
    }

    /// The cluster cache; ready means every cluster is known.
    pub fn store(&self) -> Store<PostgreSQLCluster> {
        self.clusters.clone()
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

/// Adds the watches of `namespace`'s backups and restores to `controller`: a backup's or a
/// restore's change reconciles its cluster, whose status tells of its last good backup and of
/// its restores. Returns their caches too.
fn watch_backups_and_restores(
    controller: Controller<PostgreSQLCluster>,
    client: &Client,
    namespace: Option<&str>,
) -> (
    Controller<PostgreSQLCluster>,
    Store<PostgreSQLBackup>,
    Store<PostgreSQLRestore>,
) {
    let (restores, restore_writer) = reflector::store();
    let restore_changes = reflector(
        restore_writer,
        crate::watch_without_managed_fields(
            api::<PostgreSQLRestore>(client, namespace),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .touched_objects();
    let (backups, writer) = reflector::store();
    let backup_changes = reflector(
        writer,
        crate::watch_without_managed_fields(
            api::<PostgreSQLBackup>(client, namespace),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .touched_objects();
    let controller = controller
        .watches_stream(backup_changes, |backup: PostgreSQLBackup| {
            let namespace = backup.namespace()?;
            Some(ObjectRef::new(&backup.spec.cluster.name).within(&namespace))
        })
        .watches_stream(restore_changes, |restore: PostgreSQLRestore| {
            let namespace = restore.namespace()?;
            Some(ObjectRef::new(&restore.spec.cluster.name).within(&namespace))
        });
    (controller, backups, restores)
}

/// Reconciles one cluster: the finalizer first, then apply or cleanup.
#[instrument(
    name = "reconcile",
    // Each reconcile is its own trace, whatever span the runtime polls it in.
    parent = None,
    skip_all,
    fields(
        controller = CONTROLLER,
        namespace = cluster.namespace().unwrap_or_default(),
        name = cluster.name_any(),
        trigger = trigger(&cluster),
        trace_id = field::Empty,
    )
)]
pub async fn reconcile(
    cluster: Arc<PostgreSQLCluster>,
    context: Arc<ClusterContext>,
) -> Result<Action, Error> {
    record_trace_id(&Span::current());
    let started = Instant::now();
    let namespace = cluster.namespace().ok_or(Error::MissingNamespace)?;
    let key = cluster_key(&cluster);
    let api = Api::<PostgreSQLCluster>::namespaced(context.base.client.clone(), &namespace);
    let result = finalizer(&api, CLEANUP_FINALIZER, cluster, |event| async {
        match event {
            // Boxed, as the pipeline's steps below: the futures of these async fns hold the
            // children by value, and unboxed they would overflow a thread's stack in debug builds.
            FinalizerEvent::Apply(cluster) => {
                match Box::pin(reconcile_cluster(&cluster, &context)).await {
                    Err(error) if error.is_namespace_terminating() => {
                        Ok(wait_out_namespace_deletion(&error))
                    }
                    result => result,
                }
            }
            FinalizerEvent::Cleanup(cluster) => {
                context.settled.forget(&key);
                context.echoes.forget(&key);
                cleanup(&cluster).await
            }
        }
    })
    .await
    .map_err(|error| Error::Finalizer(Box::new(error)));
    context
        .base
        .metrics
        .observe_reconcile(CONTROLLER, result.is_ok(), started.elapsed());
    match &result {
        Ok(action) => {
            context.failures().remove(&key);
            tracing::debug!(?action, "reconciled");
        }
        Err(error) => tracing::warn!(%error, "reconcile failed"),
    }
    result
}

/// A reconcile that failed because its namespace is being deleted waits for the cluster's own
/// deletion, which the namespace's deletion makes and the watch reports, instead of failing.
/// The children that the namespace's deletion already removed cannot be made again, so retries
/// would only spend requests, and their error Events would be refused too.
fn wait_out_namespace_deletion(error: &Error) -> Action {
    tracing::info!(%error, "the namespace is being deleted; waiting for the cluster's deletion");
    Action::await_change()
}

/// `namespace/name` of `cluster`: its key in the controller's per-cluster records.
fn cluster_key(cluster: &PostgreSQLCluster) -> String {
    format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    )
}

/// Retries a failed reconcile after a delay that doubles with each consecutive failure of the
/// same object, and reports the error as an Event when it differs from the previous failure's.
pub fn error_policy(
    cluster: Arc<PostgreSQLCluster>,
    error: &Error,
    context: Arc<ClusterContext>,
) -> Action {
    let key = cluster_key(&cluster);
    let note = error.to_string();
    let (failures, is_new) = {
        let mut failures = context.failures();
        let entry = failures.entry(key).or_default();
        let is_new = entry.record(&note);
        (entry.count, is_new)
    };
    if is_new {
        publish_error_event(&context, &cluster, note);
    }
    Action::requeue(backoff(failures))
}

/// Publishes a ReconcileFailed Warning about `cluster` in the background (the error policy is
/// synchronous).
fn publish_error_event(context: &ClusterContext, cluster: &PostgreSQLCluster, note: String) {
    let recorder = context.recorder.clone();
    let reference = cluster.object_ref(&());
    tokio::spawn(async move {
        let event = KubeEvent {
            type_: EventType::Warning,
            reason: "ReconcileFailed".to_owned(),
            note: Some(truncate_note(note)),
            action: "Reconcile".to_owned(),
            secondary: None,
        };
        if let Err(error) = recorder.publish(&event, &reference).await {
            tracing::warn!(%error, "cannot publish the error Event");
        }
    });
}

/// `BACKOFF_BASE * 2^(failures - 1)`, at most `BACKOFF_MAX`: the retry delay of the cluster
/// and backup controllers after `failures` consecutive failures of one object.
pub(crate) fn backoff(failures: u32) -> Duration {
    let factor = 2u32.saturating_pow(failures.saturating_sub(1));
    BACKOFF_BASE.saturating_mul(factor).min(BACKOFF_MAX)
}

/// Why this reconcile probably runs, from the object alone (the runtime keeps its own reason
/// from the reconciler; it logs it as `object.reason` on its `reconciling object` span).
fn trigger(cluster: &PostgreSQLCluster) -> &'static str {
    if cluster.metadata.deletion_timestamp.is_some() {
        "deletion"
    } else if cluster.status.as_ref().and_then(|s| s.observed_generation)
        != cluster.metadata.generation
    {
        "spec-change"
    } else {
        "resync-or-child-change"
    }
}

/// Deletion: children go with the cluster through owner references and the garbage collector;
/// backup data and PostgreSQLBackup objects are never deleted here. Nothing here reads the
/// spec, so an invalid spec cannot block deletion.
async fn cleanup(cluster: &PostgreSQLCluster) -> Result<Action, Error> {
    tracing::info!(cluster = %cluster.name_any(), "cluster deleted; children are left to the garbage collector");
    Ok(Action::await_change())
}

/// The pipeline for a cluster that is not being deleted.
async fn reconcile_cluster(
    cluster: &PostgreSQLCluster,
    context: &ClusterContext,
) -> Result<Action, Error> {
    let namespace = cluster.namespace().ok_or(Error::MissingNamespace)?;
    let names = ChildNames::for_cluster(&cluster.name_any());
    let primary = roles::designated_primary(cluster.status.as_ref(), &names);
    let source = context.base.settings.instance_status.as_ref();
    let stores = context
        .children_in(&namespace)
        .ok_or(Error::Invariant("no cache of the cluster's namespace"))?;
    let live = async {
        stores.ready().await?;
        Ok::<_, Error>(read::read(stores, &namespace, &names, source).await)
    }
    .instrument(info_span!("read"))
    .await?;
    let high_availability = cluster.spec.high_availability.as_ref();
    let failover_delay = Duration::from_secs(u64::from(
        pgkube_crds::HighAvailability::failover_delay_seconds(high_availability),
    ));
    let situation = failover::Situation {
        statefulset: &names.statefulset,
        replicas: live_replicas(&live, cluster.spec.replicas),
        failover_delay,
        synchronous_min: high_availability
            .and_then(|ha| ha.synchronous.as_ref())
            .map_or(0, |sync| sync.min_standbys),
        status: cluster.status.as_ref(),
        primary: &primary,
        switchover_request: cluster
            .annotations()
            .get(failover::SWITCHOVER_ANNOTATION)
            .map(String::as_str),
        instances: &live.instances,
        restoring: is_restoring(cluster.status.as_ref()),
        now: Timestamp::now(),
    };
    let plan = failover::plan(&situation);
    if let Some(change) = plan.designate.clone() {
        let action = Box::pin(record_primary_change(
            cluster, context, &names, live, change,
        ))
        .instrument(info_span!("designate"))
        .await?;
        // Only once the switchover is recorded: a request is never dropped unanswered.
        if plan.clear_request {
            answer_switchover_request(context, cluster, &namespace, None).await?;
        }
        return Ok(action);
    }
    if plan.clear_request {
        answer_switchover_request(context, cluster, &namespace, plan.refusal.as_deref()).await?;
    }
    let commands = failover::commands(&situation);
    let synchronous_standbys = synchronous_standbys(cluster, &live.instances, &primary);
    let facts = LiveFacts {
        primary_ordinal: roles::ordinal(&names.statefulset, &primary),
        ..live.facts()
    };
    let validated = info_span!("validate").in_scope(|| validate::validate(cluster, &facts));
    let label_changes = roles::label_changes(&live.instances, &primary);
    let system_identifier =
        identity::recorded_system_identifier(cluster.status.as_ref(), &live.instances, &primary);
    let instances = live.instances.clone();
    let addresses = live.addresses.clone();
    let outcome = match validated {
        Ok(validation) => {
            apply_validated(
                context,
                &namespace,
                validation,
                live,
                &primary,
                &label_changes,
                Built {
                    synchronous_standbys,
                    system_identifier: system_identifier.as_deref(),
                },
            )
            .await?
        }
        Err(invalid) => {
            let outcome = invalid_spec_outcome(cluster, live, invalid);
            label_roles(context, &namespace, &label_changes)
                .instrument(info_span!("apply", writes = field::Empty))
                .await?;
            outcome
        }
    };
    let backups = context.backups_of(cluster);
    let backups: Vec<&PostgreSQLBackup> = backups.iter().map(AsRef::as_ref).collect();
    let restores = context.restores_of(cluster);
    let restores: Vec<&PostgreSQLRestore> = restores.iter().map(AsRef::as_ref).collect();
    let gate = bootstrap_gate(cluster, &instances, &primary);
    let bootstrap = restores::bootstrap(cluster, &restores, cluster.status.as_ref(), &gate);
    if matches!(bootstrap, Some(restores::Bootstrap::InProgress(_)))
        && gate == identity::BootstrapGate::Proceed
        && outcome.issue.as_ref().is_none_or(|i| !i.invalid_spec)
    {
        ensure_bootstrap_restore(context, cluster, &restores, &namespace)
            .instrument(info_span!("bootstrap"))
            .await?;
    }
    let observation = Observation {
        generation: cluster.metadata.generation,
        desired_replicas: outcome.desired_replicas,
        statefulset: outcome.statefulset.as_deref(),
        issue: outcome.issue.as_ref(),
        previous: cluster.status.as_ref(),
        statefulset_name: &names.statefulset,
        primary: &primary,
        instances: &instances,
        backups: &backups,
        restores: &restores,
        bootstrap: bootstrap.as_ref(),
        failover_waiting: plan.waiting.as_deref(),
    };
    let StatusStep {
        status: new_status,
        held_for,
    } = Box::pin(write_status(cluster, context, observation))
        .instrument(info_span!("status", held_ms = field::Empty))
        .await?;
    // After the labels (the old primary is fenced) and the status (the change is recorded).
    // A span only when there is something to send: most reconciles send nothing.
    if !commands.is_empty() {
        send_commands(context, cluster, &names, &addresses, &commands)
            .instrument(info_span!("commands", count = commands.len()))
            .await?;
    }
    let mut next = next_look(
        &outcome,
        &new_status,
        !instances.is_empty(),
        context.base.settings.resync_interval,
    );
    if situation_has_standbys(&new_status, outcome.desired_replicas) {
        next = next.min(failover::watch_period(failover_delay, plan.urgent));
    }
    // A held-back change is written at the latest when its hold ends.
    if let Some(held_for) = held_for {
        next = next.min(held_for);
    }
    Ok(Action::requeue(next))
}

/// The instances the cluster has now: the StatefulSet's replicas, else the spec's.
fn live_replicas(live: &read::LiveChildren, spec_replicas: i32) -> i32 {
    live.statefulset
        .as_ref()
        .and_then(|sts| sts.spec.as_ref()?.replicas)
        .unwrap_or(spec_replicas)
}

/// What the designated primary's data says about the cluster's bootstrap restore.
fn bootstrap_gate(
    cluster: &PostgreSQLCluster,
    instances: &[instances::ObservedInstance],
    primary: &str,
) -> identity::BootstrapGate {
    let report = instances
        .iter()
        .find(|instance| instance.pod == primary)
        .and_then(instances::ObservedInstance::reported);
    identity::bootstrap_gate(cluster.metadata.uid.as_deref(), report)
}

/// Whether a restore into the cluster runs (its `Restoring` condition is True).
fn is_restoring(status: Option<&PostgreSQLClusterStatus>) -> bool {
    status.is_some_and(|status| {
        status
            .conditions
            .iter()
            .any(|c| c.type_ == restores::RESTORING && c.status == "True")
    })
}

/// A cluster whose primary has come up and that has replicas to fail over to is watched at
/// the failover pace.
fn situation_has_standbys(status: &PostgreSQLClusterStatus, replicas: i32) -> bool {
    status.current_primary.is_some() && replicas > 1
}

/// Standbys each commit waits for: as many replicas as stream, within the spec's
/// `[minStandbys, maxStandbys]` and never more than the cluster's other instances; 0 without
/// synchronous replication.
fn synchronous_standbys(
    cluster: &PostgreSQLCluster,
    instances: &[instances::ObservedInstance],
    primary: &str,
) -> u32 {
    let Some(sync) = cluster
        .spec
        .high_availability
        .as_ref()
        .and_then(|ha| ha.synchronous.as_ref())
    else {
        return 0;
    };
    let streaming = instances
        .iter()
        .filter(|instance| instance.pod != primary)
        .filter(|instance| instance.reported().is_some_and(|report| report.streaming))
        .count();
    let streaming = u32::try_from(streaming).unwrap_or(u32::MAX);
    let others = u32::try_from(cluster.spec.replicas.saturating_sub(1)).unwrap_or(0);
    streaming
        .clamp(sync.min_standbys, sync.max_standbys.max(sync.min_standbys))
        .min(others)
}

/// Records a switchover or failover in the status before anything is done about it, so that
/// the next reconcile (of this manager or of a new leader) carries it through; publishes the
/// Event and counts it. The children are left as they are until then.
async fn record_primary_change(
    cluster: &PostgreSQLCluster,
    context: &ClusterContext,
    names: &ChildNames,
    live: read::LiveChildren,
    change: pgkube_crds::PrimaryChange,
) -> Result<Action, Error> {
    tracing::warn!(kind = change.kind.as_str(), from = %change.from, to = %change.to, reason = %change.reason, "moving the primary");
    let mut previous = cluster.status.clone().unwrap_or_default();
    previous.target_primary = Some(change.to.clone());
    previous.primary_change = Some(change.clone());
    let backups = context.backups_of(cluster);
    let backups: Vec<&PostgreSQLBackup> = backups.iter().map(AsRef::as_ref).collect();
    let restores = context.restores_of(cluster);
    let restores: Vec<&PostgreSQLRestore> = restores.iter().map(AsRef::as_ref).collect();
    let gate = bootstrap_gate(cluster, &live.instances, &change.to);
    let bootstrap = restores::bootstrap(cluster, &restores, cluster.status.as_ref(), &gate);
    let observation = Observation {
        generation: cluster.metadata.generation,
        desired_replicas: live_replicas(&live, cluster.spec.replicas),
        statefulset: live.statefulset.as_deref(),
        issue: None,
        previous: Some(&previous),
        statefulset_name: &names.statefulset,
        primary: &change.to,
        instances: &live.instances,
        backups: &backups,
        restores: &restores,
        bootstrap: bootstrap.as_ref(),
        failover_waiting: None,
    };
    let new_status = status::compute(observation, Timestamp::now());
    patch_status(cluster, context, &new_status).await?;
    context
        .base
        .metrics
        .observe_primary_change(change.kind.as_str());
    let (warning, reason) = match change.kind {
        pgkube_crds::PrimaryChangeKind::Failover => (true, "FailoverStarted"),
        pgkube_crds::PrimaryChangeKind::Switchover => (false, "SwitchoverStarted"),
    };
    let note = format!("{} -> {}: {}", change.from, change.to, change.reason);
    publish_event(context, cluster, warning, reason, note).await;
    // The status change comes back through the watch and triggers the next step (this write
    // is not recorded in `echoes`); this is the fallback.
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// Removes the switchover annotation once the request is recorded or refused; a refusal is
/// a Warning Event that says why.
async fn answer_switchover_request(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    namespace: &str,
    refusal: Option<&str>,
) -> Result<(), Error> {
    let name = cluster.name_any();
    let patch = json!({"metadata": {"annotations": {failover::SWITCHOVER_ANNOTATION: null}}});
    Api::<PostgreSQLCluster>::namespaced(context.base.client.clone(), namespace)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Kube {
            action: "remove the switchover annotation of",
            kind: "PostgreSQLCluster".to_owned(),
            name: name.clone(),
            source,
        })?;
    if let Some(refusal) = refusal {
        tracing::warn!(%refusal, "switchover refused");
        publish_event(
            context,
            cluster,
            true,
            "SwitchoverRefused",
            refusal.to_owned(),
        )
        .await;
    }
    Ok(())
}

/// Sends each command to its instance manager. The control token is read from its Secret
/// only when there is a command to send (rare): the manager keeps no Secret data in its
/// caches. A command that fails is logged and sent again by a later reconcile, which looks
/// at the instances anew.
async fn send_commands(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    names: &ChildNames,
    addresses: &std::collections::BTreeMap<String, std::net::IpAddr>,
    commands: &[failover::Command],
) -> Result<(), Error> {
    if commands.is_empty() {
        return Ok(());
    }
    let namespace = cluster.namespace().ok_or(Error::MissingNamespace)?;
    let token = control_token(context, &namespace, names).await?;
    let source = context.base.settings.instance_status.as_ref();
    for command in commands {
        let pod = command.pod();
        let Some(ip) = addresses.get(pod) else {
            continue;
        };
        let address = instances::InstanceAddress {
            pod: pod.to_owned(),
            ip: *ip,
        };
        let control = match command {
            failover::Command::Promote { .. } => instances::ControlCommand::Promote,
            failover::Command::Follow { primary, .. } => instances::ControlCommand::Follow {
                primary: primary.clone(),
                primary_host: build::instance_host(names, &namespace, primary),
            },
        };
        match source.command(&address, &token, &control).await {
            Ok(()) => tracing::info!(%pod, ?control, "instance manager commanded"),
            Err(error) => tracing::warn!(%pod, ?control, %error, "command not taken; retried"),
        }
    }
    Ok(())
}

/// The cluster's control token, from its Secret.
async fn control_token(
    context: &ClusterContext,
    namespace: &str,
    names: &ChildNames,
) -> Result<String, Error> {
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
        context.base.client.clone(),
        namespace,
    )
    .get(&names.control_secret)
    .await
    .map_err(|source| Error::Kube {
        action: "read",
        kind: "Secret".to_owned(),
        name: names.control_secret.clone(),
        source,
    })?;
    secret
        .data
        .as_ref()
        .and_then(|data| data.get(build::CONTROL_TOKEN_KEY))
        .and_then(|token| String::from_utf8(token.0.clone()).ok())
        .ok_or(Error::Invariant("the control Secret has no token"))
}

/// Publishes an Event about `cluster`; one that cannot be published is only logged.
async fn publish_event(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    warning: bool,
    reason: &str,
    note: String,
) {
    let reference = cluster.object_ref(&());
    crate::publish_event(
        &context.recorder,
        &reference,
        warning,
        reason,
        note,
        "Reconcile",
    )
    .await;
}

/// Creates the cluster's bootstrap restore unless the cache has it. One that exists already
/// (the cache lags behind a create) is left as it is.
async fn ensure_bootstrap_restore(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    restores: &[&PostgreSQLRestore],
    namespace: &str,
) -> Result<(), Error> {
    let Some(desired) = restores::bootstrap_restore(cluster) else {
        return Ok(());
    };
    let name = desired.name_any();
    if restores.iter().any(|r| r.name_any() == name) {
        return Ok(());
    }
    let created = Api::<PostgreSQLRestore>::namespaced(context.base.client.clone(), namespace)
        .create(&kube::api::PostParams::default(), &desired)
        .await;
    match created {
        Ok(_) => {
            tracing::info!(restore = %name, "bootstrap restore created");
            Ok(())
        }
        Err(kube::Error::Api(response)) if response.code == 409 => Ok(()),
        Err(source) => Err(Error::Kube {
            action: "create",
            kind: "PostgreSQLRestore".to_owned(),
            name,
            source,
        }),
    }
}

/// When to reconcile again although nothing changed.
fn next_look(
    outcome: &Outcome,
    status: &PostgreSQLClusterStatus,
    has_pods: bool,
    resync: Duration,
) -> Duration {
    // An invalid spec or a held-back change waits for the user to edit the spec, which the
    // watch reports: no need to look again sooner than the resync (or the instances' refresh).
    let invalid_spec = outcome.issue.as_ref().is_some_and(|i| i.invalid_spec);
    let caught_up = status.phase == Some(ClusterPhase::Running)
        && !outcome.expansion_pending
        && (outcome.issue.is_none() || outcome.held_back);
    let wait = if invalid_spec || caught_up {
        resync
    } else {
        WAIT_REQUEUE.min(resync)
    };
    if !has_pods {
        return wait;
    }
    let sole_instance = outcome.desired_replicas == 1 && status.ready_replicas == 1;
    if caught_up && sole_instance {
        wait.min(SOLE_INSTANCE_REFRESH)
    } else {
        wait.min(INSTANCE_REFRESH)
    }
}

/// Labels pods with their roles (in the current span, which records the writes).
async fn label_roles(
    context: &ClusterContext,
    namespace: &str,
    changes: &[roles::LabelChange],
) -> Result<usize, Error> {
    let writes = apply::label_roles(&context.base.client, namespace, changes).await?;
    Span::current().record("writes", writes);
    Ok(writes)
}

/// What a reconcile's apply step left for the status step.
struct Outcome {
    /// The StatefulSet as it is now, if it exists.
    statefulset: Option<Arc<StatefulSet>>,
    /// Why the cluster does not (fully) follow its spec.
    issue: Option<Issue>,
    /// `issue` is a change held back (the cluster runs from its last accepted state).
    held_back: bool,
    expansion_pending: bool,
    /// Replicas the StatefulSet should have.
    desired_replicas: i32,
}

/// An invalid spec applies nothing: the children stay as they are.
fn invalid_spec_outcome(
    cluster: &PostgreSQLCluster,
    live: read::LiveChildren,
    invalid: validate::InvalidSpec,
) -> Outcome {
    tracing::warn!(message = %invalid, "invalid spec; children left as they are");
    // The StatefulSet keeps its replicas: judge readiness against those.
    let replicas = live
        .statefulset
        .as_ref()
        .and_then(|sts| sts.spec.as_ref()?.replicas)
        .unwrap_or(cluster.spec.replicas);
    Outcome {
        statefulset: live.statefulset,
        issue: Some(Issue {
            reason: "InvalidSpec".to_owned(),
            message: invalid.0,
            invalid_spec: true,
        }),
        held_back: false,
        expansion_pending: false,
        desired_replicas: replicas,
    }
}

/// What the children are built from besides the spec and the primary.
#[derive(Clone, Copy)]
struct Built<'a> {
    synchronous_standbys: u32,
    system_identifier: Option<&'a str>,
}

/// Builds and applies the effective spec of a valid cluster, then the pods' role labels;
/// changes it holds back become the issue reported in the status.
async fn apply_validated(
    context: &ClusterContext,
    namespace: &str,
    validation: validate::Validation,
    live: read::LiveChildren,
    primary: &str,
    label_changes: &[roles::LabelChange],
    built: Built<'_>,
) -> Result<Outcome, Error> {
    let validate::Validation {
        effective,
        refusals,
    } = validation;
    let refusal = refusal_issue(&refusals);
    if let Some(refusal) = &refusal {
        tracing::warn!(reason = %refusal.reason, message = %refusal.message, "change held back; applying the rest of the spec");
    }
    let settings = &context.base.settings;
    let (superuser_password, replication_password) = (generate_password(), generate_password());
    let control_token = generate_token();
    let input = build::BuildInput {
        image_repository: &settings.postgres_image_repository,
        instance_manager_image: &settings.agent_image,
        primary,
        superuser_password: &superuser_password,
        replication_password: &replication_password,
        control_token: &control_token,
        synchronous_standbys: built.synchronous_standbys,
        system_identifier: built.system_identifier,
    };
    let key = format!("{namespace}/{}", effective.name);
    let fingerprint = settled::fingerprint(&effective, &input, &live).map_err(Error::Serialize)?;
    // Build and compare only when something the children depend on changed since they were
    // last found up to date; otherwise both would find the same again (see `settled`).
    let desired = (!context.settled.is_settled(&key, &fingerprint))
        .then(|| info_span!("build").in_scope(|| build::build(&effective, &input)));
    let compared = desired.is_some();
    let apply_span = info_span!("apply", writes = field::Empty, settled = !compared);
    let applied = async {
        let applied = Box::pin(apply::apply(
            &context.base.client,
            namespace,
            desired,
            live,
            effective.storage_gib,
        ))
        .await?;
        let labels = apply::label_roles(&context.base.client, namespace, label_changes).await?;
        Ok::<_, Error>((applied, labels))
    }
    .instrument(apply_span.clone())
    .await;
    let (applied, label_writes) = applied?;
    if compared {
        context
            .settled
            .record(&key, fingerprint, applied.children_writes > 0);
    }
    apply_span.record(
        "writes",
        applied.children_writes + applied.volume_writes + label_writes,
    );
    Ok(Outcome {
        statefulset: Some(applied.statefulset),
        held_back: refusal.is_some(),
        // A refusal needs the user's attention first; a volume that cannot grow comes next.
        issue: refusal.or(applied.issue),
        expansion_pending: applied.expansion_pending,
        desired_replicas: effective.replicas,
    })
}

/// One issue for all refused changes: the first one's reason, every message.
fn refusal_issue(refusals: &[validate::Refusal]) -> Option<Issue> {
    let first = refusals.first()?;
    let message = refusals
        .iter()
        .map(validate::Refusal::message)
        .collect::<Vec<_>>()
        .join("; ");
    Some(Issue {
        reason: first.reason().to_owned(),
        message,
        invalid_spec: false,
    })
}

/// What the status step computed, and how long a change it held back waits.
struct StatusStep {
    status: PostgreSQLClusterStatus,
    /// Set when only details changed, shortly after a transition: not written yet (see
    /// `status::details_hold`), the reconcile looks again within this.
    held_for: Option<Duration>,
}

/// Computes the status, writes it if it changed (a change of details alone may wait a few
/// seconds: see `status::details_hold`) and publishes an Event per change.
async fn write_status(
    cluster: &PostgreSQLCluster,
    context: &ClusterContext,
    observation: Observation<'_>,
) -> Result<StatusStep, Error> {
    let now = Timestamp::now();
    let new_status = status::compute(observation, now);
    let held_for = match status::difference(&new_status, observation.previous) {
        status::Difference::None => return Ok(StatusStep::written(new_status)),
        status::Difference::Details => observation
            .previous
            .and_then(|previous| status::details_hold(previous, now)),
        status::Difference::Summary => None,
    };
    if let Some(held_for) = held_for {
        Span::current().record("held_ms", held_for.as_millis());
        return Ok(StatusStep {
            status: new_status,
            held_for: Some(held_for),
        });
    }
    let written = patch_status(cluster, context, &new_status).await?;
    // This reconcile looks again when `new_status` asks: the write's echo need not trigger one.
    if let Some(version) = written {
        context.echoes.record(&cluster_key(cluster), version);
    }
    tracing::info!(phase = ?new_status.phase, ready = new_status.ready_replicas, "status updated");
    if let Some((kind, took)) = status::completed_change(&new_status, observation.previous) {
        context
            .base
            .metrics
            .observe_primary_change_completed(kind.as_str(), took);
    }
    for event in status::events(&new_status, observation.previous) {
        publish_event(context, cluster, event.warning, &event.reason, event.note).await;
    }
    Ok(StatusStep::written(new_status))
}

impl StatusStep {
    /// A status that is the cluster's now (written, or unchanged).
    fn written(status: PostgreSQLClusterStatus) -> Self {
        Self {
            status,
            held_for: None,
        }
    }
}

/// Writes `new_status` with server-side apply, as this controller's status field manager;
/// returns the cluster's resourceVersion after the write.
async fn patch_status(
    cluster: &PostgreSQLCluster,
    context: &ClusterContext,
    new_status: &PostgreSQLClusterStatus,
) -> Result<Option<String>, Error> {
    let name = cluster.name_any();
    let namespace = cluster.namespace().ok_or(Error::MissingNamespace)?;
    let body = json!({
        "apiVersion": PostgreSQLCluster::api_version(&()),
        "kind": PostgreSQLCluster::kind(&()),
        "status": new_status,
    });
    // Of the cluster sent back, only the version is read: decoded without its managed fields.
    let Lean(written) =
        Api::<Lean<PostgreSQLCluster>>::namespaced(context.base.client.clone(), &namespace)
            .patch_status(
                &name,
                &PatchParams::apply(STATUS_FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(|source| Error::Kube {
                action: "write status of",
                kind: "PostgreSQLCluster".to_owned(),
                name: name.clone(),
                source,
            })?;
    Ok(written.metadata.resource_version)
}

/// A random control token: 32 bytes in hexadecimal.
fn generate_token() -> String {
    let bytes: [u8; 32] = rand::rng().random();
    hex::encode(bytes)
}

/// A random 32-character alphanumeric password.
fn generate_password() -> String {
    rand::rng()
        .sample_iter(&Alphanumeric)
        .take(32)
        .map(char::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed apply of a StatefulSet with `status`, the API server's answer.
    fn refused_apply(status: serde_json::Value) -> Error {
        Error::Kube {
            action: "apply",
            kind: "StatefulSet".to_owned(),
            name: "pg-postgresql".to_owned(),
            source: kube::Error::Api(Box::new(serde_json::from_value(status).expect("a Status"))),
        }
    }

    /// The API server's answer to a server-side apply that would create an object in a
    /// namespace being deleted (as the test bed's API server sent it).
    fn namespace_terminating() -> serde_json::Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "statefulsets.apps \"pg-postgresql\" is forbidden: unable to create new content in namespace team-a because it is being terminated",
            "reason": "Forbidden",
            "details": {
                "name": "pg-postgresql",
                "group": "apps",
                "kind": "statefulsets",
                "causes": [{
                    "reason": "NamespaceTerminating",
                    "message": "namespace team-a is being terminated",
                    "field": "metadata.namespace"
                }]
            },
            "code": 403
        })
    }

    #[test]
    fn a_write_refused_because_the_namespace_is_being_deleted_is_told_apart() {
        assert!(refused_apply(namespace_terminating()).is_namespace_terminating());
    }

    #[test]
    fn other_refusals_are_not_taken_for_a_namespace_deletion() {
        let forbidden_by_rbac = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "statefulsets.apps \"pg-postgresql\" is forbidden: User \"system:serviceaccount:pgkube:pgkube\" cannot patch resource \"statefulsets\"",
            "reason": "Forbidden",
            "details": {"name": "pg-postgresql", "group": "apps", "kind": "statefulsets"},
            "code": 403
        });
        assert!(!refused_apply(forbidden_by_rbac).is_namespace_terminating());
        assert!(!Error::MissingNamespace.is_namespace_terminating());
    }

    #[test]
    fn backoff_doubles_per_failure_up_to_a_maximum() {
        assert_eq!(backoff(1), Duration::from_secs(2));
        assert_eq!(backoff(2), Duration::from_secs(4));
        assert_eq!(backoff(5), Duration::from_secs(32));
        assert_eq!(backoff(40), BACKOFF_MAX);
    }

    #[test]
    fn a_failure_is_worth_an_event_only_when_its_message_changes() {
        let mut failures = Failures::default();
        assert!(failures.record("cannot read StatefulSet a: forbidden"));
        assert!(!failures.record("cannot read StatefulSet a: forbidden"));
        assert!(failures.record("cannot apply Service b: conflict"));
        assert!(!failures.record("cannot apply Service b: conflict"));
        // Going back to an earlier error is a change too.
        assert!(failures.record("cannot read StatefulSet a: forbidden"));
        assert_eq!(failures.count, 5, "every failure counts for the backoff");
    }

    #[test]
    fn a_cluster_with_pods_is_looked_at_again_within_the_instance_refresh() {
        let outcome = |issue: Option<Issue>| Outcome {
            statefulset: None,
            issue,
            held_back: false,
            expansion_pending: false,
            desired_replicas: 3,
        };
        let running = PostgreSQLClusterStatus {
            phase: Some(ClusterPhase::Running),
            ..PostgreSQLClusterStatus::default()
        };
        let creating = PostgreSQLClusterStatus {
            phase: Some(ClusterPhase::Creating),
            ..PostgreSQLClusterStatus::default()
        };
        let resync = Duration::from_secs(300);
        assert_eq!(next_look(&outcome(None), &running, false, resync), resync);
        assert_eq!(
            next_look(&outcome(None), &running, true, resync),
            INSTANCE_REFRESH
        );
        // One running instance: its readiness comes through the StatefulSet's watch.
        let sole = Outcome {
            desired_replicas: 1,
            ..outcome(None)
        };
        let running_one = PostgreSQLClusterStatus {
            ready_replicas: 1,
            ..running.clone()
        };
        assert_eq!(
            next_look(&sole, &running_one, true, resync),
            SOLE_INSTANCE_REFRESH
        );
        let creating_one = PostgreSQLClusterStatus {
            phase: Some(ClusterPhase::Creating),
            ..running_one.clone()
        };
        assert_eq!(next_look(&sole, &creating_one, true, resync), WAIT_REQUEUE);
        assert_eq!(
            next_look(&outcome(None), &creating, true, resync),
            WAIT_REQUEUE
        );
        let invalid = Issue {
            reason: "InvalidSpec".to_owned(),
            message: "bad".to_owned(),
            invalid_spec: true,
        };
        assert_eq!(
            next_look(&outcome(Some(invalid)), &creating, false, resync),
            resync
        );
        // A short resync (tests) wins.
        let short = Duration::from_secs(2);
        assert_eq!(next_look(&outcome(None), &running, true, short), short);
    }

    #[test]
    fn commits_wait_for_the_streaming_replicas_within_the_bounds() {
        use instances::{InstanceReport, ObservedInstance, ReportedRole};
        let cluster = |synchronous: serde_json::Value| -> PostgreSQLCluster {
            serde_json::from_value(json!({
                "apiVersion": "db.example.com/v1alpha1", "kind": "PostgreSQLCluster",
                "metadata": {"name": "db"},
                "spec": {"replicas": 4, "storage": "1Gi",
                         "highAvailability": {"synchronous": synchronous}}
            }))
            .expect("a cluster")
        };
        let instance = |ordinal: i32, streaming: bool| ObservedInstance {
            pod: format!("db-postgresql-{ordinal}"),
            uid: None,
            role_label: None,
            report: Ok(InstanceReport {
                pod: format!("db-postgresql-{ordinal}"),
                role: ReportedRole::Replica,
                ready: true,
                timeline: Some(1),
                current_lsn: None,
                received_lsn: None,
                replayed_lsn: None,
                streaming,
                pending_restart: Vec::new(),
                following: None,
                system_identifier: None,
                initialized_by: None,
                message: None,
            }),
        };
        let primary = "db-postgresql-0";
        let none_stream = [instance(1, false), instance(2, false), instance(3, false)];
        let two_stream = [instance(1, true), instance(2, true), instance(3, false)];
        let all_stream = [instance(1, true), instance(2, true), instance(3, true)];
        let one_to_two = cluster(json!({"minStandbys": 1, "maxStandbys": 2}));
        // At least the minimum, even with none streaming: commits wait rather than go async.
        assert_eq!(synchronous_standbys(&one_to_two, &none_stream, primary), 1);
        assert_eq!(synchronous_standbys(&one_to_two, &two_stream, primary), 2);
        // At most the maximum.
        assert_eq!(synchronous_standbys(&one_to_two, &all_stream, primary), 2);
        let without: PostgreSQLCluster = serde_json::from_value(json!({
            "apiVersion": "db.example.com/v1alpha1", "kind": "PostgreSQLCluster",
            "metadata": {"name": "db"}, "spec": {"replicas": 4, "storage": "1Gi"}
        }))
        .expect("a cluster");
        assert_eq!(synchronous_standbys(&without, &all_stream, primary), 0);
    }

    #[test]
    fn passwords_are_random_and_long() {
        let one = generate_password();
        assert_eq!(one.len(), 32);
        assert_ne!(one, generate_password());
    }
}
