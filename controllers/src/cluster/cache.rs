//! The caches the cluster controller reads its children from: one reflector store per kind, fed
//! by the same watches that trigger reconciles, so that a reconcile reads nothing from the API
//! server (the watches already bring every change).
//!
//! - StatefulSets, Services, ConfigMaps and PodDisruptionBudgets: the whole objects (drift
//!   detection compares them with the desired ones), without `managedFields`, which pgkube never
//!   reads and which are the largest part of an applied object.
//! - Secrets: metadata only. A reconcile only needs to know that the credentials exist, and the
//!   manager then holds no password in memory.
//! - Pods and data volume claims: watched for the cache alone; their changes trigger nothing (a
//!   pod's readiness reaches the cluster through its StatefulSet's status, and the instances
//!   are asked again every `INSTANCE_REFRESH`). Pods are kept without their spec: the
//!   controller reads their names, labels, uids and status only, and the spec is most of a pod.
//!
//! Every watch selects `app.kubernetes.io/managed-by=pgkube`, which the cluster's children,
//! its pods and its claims carry (from the StatefulSet's templates).

use std::fmt::Debug;
use std::sync::Arc;

use std::future::Future;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use pgkube_crds::PostgreSQLCluster;
use serde::de::DeserializeOwned;

use crate::api;

/// Label on every child, its pods and its claims: the watches select only these.
pub const MANAGED_BY_SELECTOR: &str = "app.kubernetes.io/managed-by=pgkube";

/// The children of the clusters of one namespace (or of all), as the watches last saw them.
#[derive(Clone)]
pub struct ChildStores {
    /// The namespace watched; `None` for all.
    pub namespace: Option<String>,
    pub statefulsets: Store<StatefulSet>,
    pub services: Store<Service>,
    pub config_maps: Store<ConfigMap>,
    pub secrets: Store<PartialObjectMeta<Secret>>,
    pub budgets: Store<PodDisruptionBudget>,
    pub pods: Store<Pod>,
    pub claims: Store<PersistentVolumeClaim>,
}

/// Why a cache cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("the controller's caches are closed (the manager is stopping)")]
pub struct CachesClosed;

impl ChildStores {
    /// Adds the watches of every child kind to `controller`, which drives them (they live and
    /// stop with it), and returns it with their stores.
    pub fn watch(
        controller: Controller<PostgreSQLCluster>,
        client: &Client,
        namespace: Option<&str>,
    ) -> (Controller<PostgreSQLCluster>, ChildStores) {
        let (statefulsets, statefulset_changes) =
            cached::<StatefulSet>(client, namespace, keep_whole);
        let (services, service_changes) = cached::<Service>(client, namespace, keep_whole);
        let (config_maps, config_map_changes) = cached::<ConfigMap>(client, namespace, keep_whole);
        let (budgets, budget_changes) =
            cached::<PodDisruptionBudget>(client, namespace, keep_whole);
        let (secrets, secret_changes) =
            cached::<PartialObjectMeta<Secret>>(client, namespace, keep_whole);
        let (pods, pod_changes) = cached::<Pod>(client, namespace, without_spec);
        let (claims, claim_changes) =
            cached::<PersistentVolumeClaim>(client, namespace, keep_whole);
        let controller = controller
            .owns_stream(statefulset_changes)
            .owns_stream(service_changes)
            .owns_stream(config_map_changes)
            .owns_stream(budget_changes)
            .owns_stream(secret_changes)
            .watches_stream(pod_changes, |_: Pod| no_trigger())
            .watches_stream(claim_changes, |_: PersistentVolumeClaim| no_trigger());
        let stores = ChildStores {
            namespace: namespace.map(str::to_owned),
            statefulsets,
            services,
            config_maps,
            secrets,
            budgets,
            pods,
            claims,
        };
        (controller, stores)
    }

    /// The stores of `namespace` (all when `None`) outside a Controller, with the future that
    /// fills them (until dropped), for code that reconciles without running the controller.
    pub fn standalone(
        client: &Client,
        namespace: Option<&str>,
    ) -> (
        ChildStores,
        impl Future<Output = ()> + Send + 'static + use<>,
    ) {
        let (statefulsets, a) = cached::<StatefulSet>(client, namespace, keep_whole);
        let (services, b) = cached::<Service>(client, namespace, keep_whole);
        let (config_maps, c) = cached::<ConfigMap>(client, namespace, keep_whole);
        let (budgets, d) = cached::<PodDisruptionBudget>(client, namespace, keep_whole);
        let (secrets, e) = cached::<PartialObjectMeta<Secret>>(client, namespace, keep_whole);
        let (pods, f) = cached::<Pod>(client, namespace, without_spec);
        let (claims, g) = cached::<PersistentVolumeClaim>(client, namespace, keep_whole);
        let streams: Vec<BoxStream<'static, ()>> = vec![
            a.map(|_| ()).boxed(),
            b.map(|_| ()).boxed(),
            c.map(|_| ()).boxed(),
            d.map(|_| ()).boxed(),
            e.map(|_| ()).boxed(),
            f.map(|_| ()).boxed(),
            g.map(|_| ()).boxed(),
        ];
        let fill = futures::stream::select_all(streams).for_each(|()| async {});
        let stores = ChildStores {
            namespace: namespace.map(str::to_owned),
            statefulsets,
            services,
            config_maps,
            secrets,
            budgets,
            pods,
            claims,
        };
        (stores, fill)
    }

    /// Waits until every store has its first full list: before that, a missing child may only
    /// be missing from the cache.
    pub async fn ready(&self) -> Result<(), CachesClosed> {
        let closed = |_| CachesClosed;
        self.statefulsets.wait_until_ready().await.map_err(closed)?;
        self.services.wait_until_ready().await.map_err(closed)?;
        self.config_maps.wait_until_ready().await.map_err(closed)?;
        self.secrets.wait_until_ready().await.map_err(closed)?;
        self.budgets.wait_until_ready().await.map_err(closed)?;
        self.pods.wait_until_ready().await.map_err(closed)?;
        self.claims.wait_until_ready().await.map_err(closed)?;
        Ok(())
    }

    /// Whether these stores hold the objects of `namespace`.
    pub fn covers(&self, namespace: &str) -> bool {
        self.namespace.as_deref().is_none_or(|n| n == namespace)
    }
}

/// Keeps the object as it is.
fn keep_whole<K>(_: &mut K) {}

/// Drops a pod's spec, which the controller never reads.
fn without_spec(pod: &mut Pod) {
    pod.spec = None;
}

/// For the watches that only fill a cache: their changes reconcile no cluster.
fn no_trigger() -> Option<ObjectRef<PostgreSQLCluster>> {
    None
}

/// The object `name` in `namespace` as `store` has it.
pub fn cached_object<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    store.get(&ObjectRef::new(name).within(namespace))
}

/// The objects of `namespace` in `store` that `keep` accepts.
pub fn cached_objects<K>(
    store: &Store<K>,
    namespace: &str,
    keep: impl Fn(&K) -> bool,
) -> Vec<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    store
        .state()
        .into_iter()
        .filter(|object| object.namespace().as_deref() == Some(namespace) && keep(object))
        .collect()
}

/// A store of `K` (ours only, without managed fields, and trimmed by `trim`) and the stream of
/// changes that fills it.
/// With `K` a `PartialObjectMeta`, the watch asks for metadata only.
fn cached<K>(
    client: &Client,
    namespace: Option<&str>,
    trim: fn(&mut K),
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let config = watcher::Config::default().labels(MANAGED_BY_SELECTOR);
    let changes = watcher::watcher(api::<K>(client, namespace), config).modify(move |object| {
        object.managed_fields_mut().clear();
        trim(object);
    });
    let changes = reflector(writer, changes)
        .default_backoff()
        .touched_objects();
    (store, changes)
}
