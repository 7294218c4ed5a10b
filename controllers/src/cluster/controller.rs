//! The controller's wiring: the watches (clusters, children, backups, restores), the
//! finalizer around each reconcile, and the error policy.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use pgkube_crds::{CLEANUP_FINALIZER, PostgreSQLBackup, PostgreSQLCluster, PostgreSQLRestore};
use tracing::{Span, field, instrument};

use super::context::ClusterContext;
use super::{CONTROLLER, Error, cache, cluster_key, echoes, ha, pipeline};
use crate::retries::backoff;
use crate::{Context, ShutdownSignal, api, record_trace_id, truncate_note};

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

/// How soon a reconcile whose status write found the cache lagging looks again.
const STALE_RETRY: Duration = Duration::from_millis(500);

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
    // A look again after a stale status write is no success: the failures stay counted, so
    // that a failure that goes on after it does not publish its Event again.
    let stale = AtomicBool::new(false);
    let result = finalizer(&api, CLEANUP_FINALIZER, cluster, |event| async {
        match event {
            // Boxed, as the pipeline's steps below: the futures of these async fns hold the
            // children by value, and unboxed they would overflow a thread's stack in debug builds.
            FinalizerEvent::Apply(cluster) => {
                match Box::pin(pipeline::reconcile_cluster(&cluster, &context)).await {
                    Err(error) if error.is_namespace_terminating() => {
                        Ok(wait_out_namespace_deletion(&error))
                    }
                    Err(error) if error.is_stale() => {
                        tracing::info!(%error, "looking again once the cache caught up");
                        stale.store(true, Ordering::Relaxed);
                        Ok(Action::requeue(STALE_RETRY))
                    }
                    result => result,
                }
            }
            FinalizerEvent::Cleanup(cluster) => {
                context.settled.forget(&key);
                context.echoes.forget(&key);
                context
                    .base
                    .metrics
                    .forget_cluster(&crate::metrics::ClusterLabels::of(&cluster));
                if let Some(namespace) = cluster.namespace() {
                    let names = super::build::ChildNames::for_cluster(&cluster.name_any());
                    context.instance_access.forget_cluster(&namespace, &names);
                }
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
            if !stale.load(Ordering::Relaxed) {
                context.failures().remove(&key);
            }
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
    // A cluster with standbys is looked at again at the failover pace, whatever failed.
    let delay = backoff(failures);
    Action::requeue(ha::retry_cap(&cluster).map_or(delay, |cap| delay.min(cap)))
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
