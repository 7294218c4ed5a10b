//! pgkube controllers.
//!
//! The manager (`pgkube run`) checks that the CRDs are installed ([`ensure_crds_installed`]),
//! builds a [`Context`] and calls [`run`], which drives every controller until the shutdown
//! future resolves. Each controller lives in its own module and reports through the shared
//! [`Metrics`]. [`storage`] is the project's one S3 client, which the backup agent in the binary
//! uses too.

pub mod agent_job;
pub mod backup;
pub mod cluster;
mod compact;
pub mod crd_check;
pub mod events;
mod lean;
pub mod metrics;
pub mod names;
pub mod pki;
pub mod pod;
pub mod quantity;
pub mod restore;
pub mod retention;
mod retries;
pub mod schedule;
pub mod scheduling;
pub mod storage;
pub mod union_store;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{Api, Client, Resource, ResourceExt};
use opentelemetry::trace::TraceContextExt;
use tokio::sync::watch;
use tracing::{Span, field};
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub use crd_check::{CrdCheckError, ensure_crds_installed};
pub use metrics::Metrics;

/// Objects each controller reconciles at once unless told otherwise (the manager's
/// `--max-concurrent-reconciles` says why 8).
pub const DEFAULT_MAX_CONCURRENT_RECONCILES: u16 = 8;

/// Settings of the controllers that come from the manager's command line.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Namespaces to watch; empty means all namespaces.
    pub watch_namespaces: Vec<String>,
    /// How many objects each controller reconciles at once.
    pub max_concurrent_reconciles: u16,
    /// Registry and repository of the PostgreSQL image, without tag (`postgres` by default; the
    /// tag is the cluster's version). Air-gapped users point this at their mirror.
    pub postgres_image_repository: String,
    /// Image of pgkube itself: the instance manager's init container installs `pgkube` from
    /// it, and backup and restore Jobs run it (`pgkube agent`).
    pub agent_image: String,
    /// How often a settled object is reconciled again although nothing changed (a safety net
    /// for missed watch events; it costs reads, never writes).
    pub resync_interval: Duration,
    /// How long a backup may wait (Pending) for its cluster to be ready, or for the cluster's
    /// other backups, before it fails.
    pub backup_pending_deadline: Duration,
    /// The backup Job's `activeDeadlineSeconds`: a backup still running after this fails.
    pub backup_active_deadline: Duration,
    /// How long a backup Job may take to start its agent (its pod scheduled, its images pulled,
    /// its Secrets mounted) before the backup fails and the Job is deleted.
    pub backup_start_timeout: Duration,
    /// Resource requests and limits of the backup and restore Jobs' agent container.
    pub agent_resources: k8s_openapi::api::core::v1::ResourceRequirements,
    /// How long a restore may wait (Pending) for its backup, its cluster, or the cluster's
    /// other restores and running backup, before it fails.
    pub restore_pending_deadline: Duration,
    /// The restore Job's `activeDeadlineSeconds`: a restore still running after this fails.
    pub restore_active_deadline: Duration,
    /// How long a restore Job may take to start its agent before the restore fails and the Job
    /// is deleted.
    pub restore_start_timeout: Duration,
    /// How often every cluster with backup storage gets a retention pass, besides the pass
    /// after each completed backup (an hour).
    pub retention_interval: Duration,
    /// The manager's own `OTEL_*` environment, passed on to backup and restore Jobs so that the agent
    /// exports its spans where the manager does.
    pub otel_env: Vec<(String, String)>,
    /// How the cluster controller asks each PostgreSQL pod's instance manager for its status:
    /// HTTP to the pod's address by default. Tests substitute an answer for pods that never
    /// run (simulated nodes).
    pub instance_status: Arc<dyn cluster::instances::InstanceStatusSource>,
    /// The binary the instance managers should run, sent to those that run another one
    /// ([`cluster::manager_upgrade`]); none: they are left as they are.
    pub instance_manager_binary: Option<Arc<cluster::manager_upgrade::OwnBinary>>,
    /// How long the clusters' server and client certificates are valid; each is renewed two
    /// thirds into it.
    pub postgres_certificate_validity: Duration,
    /// The namespace of the manager's pod; none outside a pod. The clusters' NetworkPolicies
    /// open the instance managers' port to it.
    pub manager_namespace: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            watch_namespaces: Vec::new(),
            max_concurrent_reconciles: DEFAULT_MAX_CONCURRENT_RECONCILES,
            postgres_image_repository: "postgres".to_owned(),
            agent_image: "ghcr.io/pgkube/pgkube:latest".to_owned(),
            resync_interval: Duration::from_secs(300),
            backup_pending_deadline: Duration::from_secs(3600),
            backup_active_deadline: Duration::from_secs(6 * 3600),
            backup_start_timeout: Duration::from_secs(300),
            agent_resources: k8s_openapi::api::core::v1::ResourceRequirements::default(),
            restore_pending_deadline: Duration::from_secs(3600),
            restore_active_deadline: Duration::from_secs(6 * 3600),
            restore_start_timeout: Duration::from_secs(300),
            postgres_certificate_validity: cluster::certificates::DEFAULT_LEAF_VALIDITY,
            manager_namespace: None,
            retention_interval: Duration::from_secs(3600),
            otel_env: Vec::new(),
            instance_status: Arc::new(cluster::instances::HttpInstanceStatus::default()),
            instance_manager_binary: None,
        }
    }
}

/// What every reconcile can reach.
#[derive(Clone)]
pub struct Context {
    pub client: kube::Client,
    /// The client Events are published with: one with a rate limit of its own, as client-go's
    /// event broadcaster has, so that Events never delay the reconciles' requests.
    pub events: kube::Client,
    pub settings: Arc<Settings>,
    pub metrics: Arc<Metrics>,
}

/// Tells controllers to stop; cheap to clone, one per controller.
#[derive(Clone, Debug)]
pub struct ShutdownSignal(watch::Receiver<bool>);

impl ShutdownSignal {
    /// A signal that fires when `shutdown` resolves.
    pub fn from_future(shutdown: impl Future<Output = ()> + Send + 'static) -> Self {
        let (sender, receiver) = watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            // No receiver left means nobody is running any more: nothing to stop.
            let _ = sender.send(true);
        });
        Self(receiver)
    }

    /// Resolves once shutdown was asked for (or the sender is gone).
    pub async fn wait(mut self) {
        while !*self.0.borrow_and_update() {
            if self.0.changed().await.is_err() {
                return;
            }
        }
    }
}

/// The namespaces the controllers watch, one per Controller: `[None]` for all namespaces.
pub(crate) fn watched_namespaces(settings: &Settings) -> Vec<Option<String>> {
    if settings.watch_namespaces.is_empty() {
        vec![None]
    } else {
        settings
            .watch_namespaces
            .iter()
            .cloned()
            .map(Some)
            .collect()
    }
}

/// `K` in `namespace`, or in all namespaces.
pub(crate) fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

/// The changes of the `K`s that `api` and `config` select, without their managed fields: no
/// controller reads them, and they are most of an object that was applied and had its status
/// written (about 9 of a cluster's 10 kB in a cache, heaptrack at 1,000 clusters). Every watch
/// that fills a cache goes through here (the Jobs' watch, in `agent_job`, fills none).
pub(crate) fn watch_without_managed_fields<K>(
    api: Api<K>,
    config: kube::runtime::watcher::Config,
) -> impl futures::Stream<Item = kube::runtime::watcher::Result<kube::runtime::watcher::Event<K>>>
+ Send
+ 'static
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    watch_lean::<K, { lean::WITH_SPEC }>(api, config)
}

/// [`watch_without_managed_fields`], without the objects' `spec` either when `SKIP_SPEC`. The
/// skipped parts are never decoded (see `lean`): the watch does not build what it would drop.
pub(crate) fn watch_lean<K, const SKIP_SPEC: bool>(
    api: Api<K>,
    config: kube::runtime::watcher::Config,
) -> impl futures::Stream<Item = kube::runtime::watcher::Result<kube::runtime::watcher::Event<K>>>
+ Send
+ 'static
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    use futures::TryStreamExt;
    let namespace = api.namespace().map(str::to_owned);
    let lean = crate::api::<lean::Lean<K, SKIP_SPEC>>(&api.into_client(), namespace.as_deref());
    kube::runtime::watcher(lean, config).map_ok(lean::unwrapped)
}

/// Records the OpenTelemetry trace id into `span` when there is a valid one (there is none when
/// no OpenTelemetry layer is installed), so JSON logs of the reconcile carry it.
pub(crate) fn record_trace_id(span: &Span) {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    if span_context.is_valid() {
        span.record("trace_id", field::display(span_context.trace_id()));
    }
}

/// Publishes an Event about `reference` (a Warning when `warning`), its note cut to the 1 kB
/// Events allow. One that cannot be published is logged: never worth failing a reconcile for.
pub(crate) async fn publish_event(
    recorder: &crate::events::Recorder,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    warning: bool,
    reason: &str,
    note: String,
    action: &str,
) {
    use kube::runtime::events::{Event, EventType};
    let event = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.to_owned(),
        note: Some(truncate_note(note)),
        action: action.to_owned(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, reference).await {
        tracing::warn!(%error, reason, "cannot publish an Event");
    }
}

/// Event notes are limited to 1 kB.
pub(crate) fn truncate_note(mut note: String) -> String {
    if note.len() > 1024 {
        let mut end = 1021;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    note
}

/// How long ago `object` was created (zero if it has no creation time, or one in the future).
pub(crate) fn age<K: ResourceExt>(object: &K, now: DateTime<Utc>) -> Duration {
    object
        .creation_timestamp()
        .and_then(|created| {
            let created =
                chrono::DateTime::<chrono::Utc>::from_timestamp(created.0.as_second(), 0)?;
            (now - created).to_std().ok()
        })
        .unwrap_or_default()
}

/// `condition` as the only condition of a status whose previous conditions were `previous`:
/// it keeps the previous transition time when its status and reason did not change.
pub(crate) fn sole_condition(condition: Condition, previous: &[Condition]) -> Vec<Condition> {
    let unchanged = previous
        .iter()
        .find(|c| c.type_ == condition.type_)
        .filter(|c| c.status == condition.status && c.reason == condition.reason);
    let last_transition_time = match unchanged {
        Some(previous) => previous.last_transition_time.clone(),
        None => condition.last_transition_time.clone(),
    };
    vec![Condition {
        last_transition_time,
        ..condition
    }]
}

/// The W3C `traceparent` of `span`'s OpenTelemetry context, if it has a valid one: what a Job
/// gets so that the agent's spans join the reconcile's trace.
pub(crate) fn trace_parent(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            span_context.trace_id(),
            span_context.span_id(),
            span_context.trace_flags().to_u8()
        )
    })
}

/// Runs `controller` and, once `store` (its cache) has synced, says so on `synced`.
///
/// In the controller's own task: kube's store readiness wakes only the waiter that polled it
/// last, and the controller waits on it too before its first reconcile. Waited from another
/// task, one of the two would never be woken (the manager never turned ready).
async fn reporting_sync<K>(
    controller: impl Future<Output = ()>,
    store: kube::runtime::reflector::Store<K>,
    synced: tokio::sync::oneshot::Sender<()>,
) where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let report = async move {
        if store.wait_until_ready().await.is_ok() {
            // No receiver means the readiness no longer matters (the manager is stopping).
            let _ = synced.send(());
        }
    };
    futures::future::join(controller, report).await;
}

/// Runs every controller until `shutdown` resolves; in-flight reconciles finish first.
/// `on_ready` is called once all watch caches have synced (the manager's `/readyz`).
///
/// The CRDs must be installed: check with [`ensure_crds_installed`] first, or the controllers
/// retry their watches until they are.
pub async fn run(
    context: Context,
    on_ready: impl FnOnce() + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let shutdown = ShutdownSignal::from_future(shutdown);
    let clusters = cluster::ClusterController::new(&context);
    let scheduler = schedule::BackupScheduler::new(&context);
    let backups = backup::BackupController::new(&context);
    let restores = restore::RestoreController::new(&context);
    let (cluster_synced, backup_synced, restore_synced) = (
        tokio::sync::oneshot::channel(),
        tokio::sync::oneshot::channel(),
        tokio::sync::oneshot::channel(),
    );
    let ready = async move {
        // Each fails only when its controller stopped before its cache synced.
        let synced =
            futures::future::try_join3(cluster_synced.1, backup_synced.1, restore_synced.1);
        if synced.await.is_ok() {
            on_ready();
        }
    };
    // Each on a task of its own, so that a wake-up of one (a watch event, an answer to one of
    // its requests) polls that one only: joined in one future, every wake-up polled all five
    // (5.9% of the manager's CPU samples while converging 1,000 clusters). Dropping the set,
    // as an abort of this future does when leadership is lost, aborts them all.
    let mut controllers = tokio::task::JoinSet::new();
    controllers.spawn(ready);
    let cluster_store = clusters.store();
    controllers.spawn(reporting_sync(
        clusters.run(shutdown.clone()),
        cluster_store,
        cluster_synced.0,
    ));
    let backup_store = backups.store();
    controllers.spawn(reporting_sync(
        backups.run(shutdown.clone()),
        backup_store,
        backup_synced.0,
    ));
    let restore_store = restores.store();
    controllers.spawn(reporting_sync(
        restores.run(shutdown.clone()),
        restore_store,
        restore_synced.0,
    ));
    controllers.spawn(scheduler.run(shutdown));
    while let Some(stopped) = controllers.join_next().await {
        // A controller that panicked takes the others down with it, as it did when they were
        // joined: the manager reports the controllers task failed and exits.
        if let Err(error) = stopped
            && error.is_panic()
        {
            std::panic::resume_unwind(error.into_panic());
        }
    }
}
