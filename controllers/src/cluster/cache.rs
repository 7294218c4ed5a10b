//! The caches the cluster controller reads its children from: one reflector store per kind, fed
//! by the same watches that trigger reconciles, so that a reconcile reads nothing from the API
//! server (the watches already bring every change).
//!
//! - StatefulSets, Services, ConfigMaps, PodDisruptionBudgets and NetworkPolicies: the whole objects (drift
//!   detection compares them with the desired ones), without `managedFields`, which pgkube never
//!   reads and which are the largest part of an applied object. A StatefulSet's pod spec is
//!   kept as its JSON text in [`COMPACT_POD_SPEC_ANNOTATION`] (see [`compact_pod_spec`]):
//!   drift detection alone reads it, and as text it takes far less memory than as structs.
//! - Secrets: metadata only. A reconcile only needs to know that the credentials exist, and the
//!   manager then holds no password in memory.
//! - Pods and data volume claims: watched for the cache alone; their changes trigger nothing (a
//!   pod's readiness reaches the cluster through its StatefulSet's status, and the instances
//!   are asked again every `INSTANCE_REFRESH`, or `SOLE_INSTANCE_REFRESH`). Pods are decoded
//!   without their spec: the controller reads their names, labels, uids and status only, and
//!   the spec is most of a pod.
//!
//! No watch decodes the objects' `managedFields` (see `lean`), and every store keeps its objects
//! as JSON text (see `compact`), decoded when a reconcile reads them ([`cached_object`]) or
//! handed on as text to what compares or only counts them ([`cached_text`]).
//!
//! Every watch selects `app.kubernetes.io/managed-by=pgkube`, which the cluster's children,
//! its pods and its claims carry (from the StatefulSet's templates).

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use std::future::Future;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use pgkube_crds::PostgreSQLCluster;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api;
use crate::compact::{self, Compact};
use crate::lean::{WITH_SPEC, WITHOUT_SPEC};

/// Label on every child, its pods and its claims: the watches select only these.
pub const MANAGED_BY_SELECTOR: &str = "app.kubernetes.io/managed-by=pgkube";

/// The children of the clusters of one namespace (or of all), as the watches last saw them.
#[derive(Clone)]
pub struct ChildStores {
    /// The namespace watched; `None` for all.
    pub namespace: Option<String>,
    pub statefulsets: Store<Compact<StatefulSet>>,
    pub services: Store<Compact<Service>>,
    pub config_maps: Store<Compact<ConfigMap>>,
    pub secrets: Store<Compact<PartialObjectMeta<Secret>>>,
    pub budgets: Store<Compact<PodDisruptionBudget>>,
    pub network_policies: Store<Compact<NetworkPolicy>>,
    pub pods: Store<Compact<Pod>>,
    pub claims: Store<Compact<PersistentVolumeClaim>>,
}

/// How long a reconcile waits for the caches' first lists before it fails, naming them.
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);

/// How often a reconcile waiting for the caches' first lists looks at them again. kube's store
/// readiness wakes only the waiter that polled it last, and at start-up several reconciles
/// (each its own future in the Controller's task) can wait at once: without a second look, all
/// but one would wait out [`SYNC_TIMEOUT`] and fail.
const SYNC_RECHECK: Duration = Duration::from_secs(1);

/// Why the caches cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("the controller's caches are closed (the manager is stopping)")]
    Closed,
    #[error(
        "the caches of {kinds} have not synced after {}s: the manager needs list and watch on \
         them (see deploy/rbac.yaml), and the API server must answer",
        SYNC_TIMEOUT.as_secs()
    )]
    NotSynced { kinds: String },
}

/// The streams of changes that fill the [`ChildStores`]: whoever polls them keeps the stores
/// current.
struct ChildChanges {
    statefulsets: Changes<StatefulSet>,
    services: Changes<Service>,
    config_maps: Changes<ConfigMap>,
    budgets: Changes<PodDisruptionBudget>,
    network_policies: Changes<NetworkPolicy>,
    secrets: Changes<PartialObjectMeta<Secret>>,
    pods: Changes<Pod>,
    claims: Changes<PersistentVolumeClaim>,
}

type Changes<K> = BoxStream<'static, Result<K, watcher::Error>>;

impl ChildStores {
    /// The stores of `namespace` (all when `None`), and the changes that fill them.
    fn new(client: &Client, namespace: Option<&str>) -> (ChildStores, ChildChanges) {
        let (statefulsets, statefulset_changes) =
            cached::<_, WITH_SPEC>(client, namespace, compact_pod_spec);
        let (services, service_changes) = cached::<_, WITH_SPEC>(client, namespace, keep_whole);
        let (config_maps, config_map_changes) =
            cached::<_, WITH_SPEC>(client, namespace, keep_whole);
        let (budgets, budget_changes) = cached::<_, WITH_SPEC>(client, namespace, keep_whole);
        let (network_policies, network_policy_changes) =
            cached::<_, WITH_SPEC>(client, namespace, keep_whole);
        let (secrets, secret_changes) = cached::<_, WITH_SPEC>(client, namespace, keep_whole);
        let (pods, pod_changes) = cached::<_, WITHOUT_SPEC>(client, namespace, keep_whole);
        let (claims, claim_changes) = cached::<_, WITH_SPEC>(client, namespace, keep_whole);
        let stores = ChildStores {
            namespace: namespace.map(str::to_owned),
            statefulsets,
            services,
            config_maps,
            secrets,
            budgets,
            network_policies,
            pods,
            claims,
        };
        let changes = ChildChanges {
            statefulsets: statefulset_changes.boxed(),
            services: service_changes.boxed(),
            config_maps: config_map_changes.boxed(),
            budgets: budget_changes.boxed(),
            network_policies: network_policy_changes.boxed(),
            secrets: secret_changes.boxed(),
            pods: pod_changes.boxed(),
            claims: claim_changes.boxed(),
        };
        (stores, changes)
    }

    /// Adds the watches of every child kind to `controller`, which drives them (they live and
    /// stop with it), and returns it with their stores.
    pub fn watch(
        controller: Controller<PostgreSQLCluster>,
        client: &Client,
        namespace: Option<&str>,
    ) -> (Controller<PostgreSQLCluster>, ChildStores) {
        let (stores, changes) = Self::new(client, namespace);
        let controller = controller
            .owns_stream(changes.statefulsets)
            .owns_stream(changes.services)
            .owns_stream(changes.config_maps)
            .owns_stream(changes.budgets)
            .owns_stream(changes.network_policies)
            .owns_stream(changes.secrets)
            .watches_stream(changes.pods, |_: Pod| no_trigger())
            .watches_stream(changes.claims, |_: PersistentVolumeClaim| no_trigger());
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
        let (stores, changes) = Self::new(client, namespace);
        let streams: Vec<BoxStream<'static, ()>> = vec![
            changes.statefulsets.map(|_| ()).boxed(),
            changes.services.map(|_| ()).boxed(),
            changes.config_maps.map(|_| ()).boxed(),
            changes.budgets.map(|_| ()).boxed(),
            changes.network_policies.map(|_| ()).boxed(),
            changes.secrets.map(|_| ()).boxed(),
            changes.pods.map(|_| ()).boxed(),
            changes.claims.map(|_| ()).boxed(),
        ];
        let fill = futures::stream::select_all(streams).for_each(|()| async {});
        (stores, fill)
    }

    /// Waits until every store has its first full list: before that, a missing child may only
    /// be missing from the cache. After [`SYNC_TIMEOUT`], fails naming the stores not synced (a
    /// watch the manager may not make never syncs; its errors are retried, not returned).
    pub async fn ready(&self) -> Result<(), CacheError> {
        if let Some(ready) = wait_rechecking(SYNC_TIMEOUT, || self.all_ready()).await {
            return ready;
        }
        let waiting = [
            ("StatefulSets", is_synced(&self.statefulsets).await),
            ("Services", is_synced(&self.services).await),
            ("ConfigMaps", is_synced(&self.config_maps).await),
            ("Secrets", is_synced(&self.secrets).await),
            ("PodDisruptionBudgets", is_synced(&self.budgets).await),
            ("NetworkPolicies", is_synced(&self.network_policies).await),
            ("Pods", is_synced(&self.pods).await),
            ("PersistentVolumeClaims", is_synced(&self.claims).await),
        ];
        let kinds: Vec<&str> = waiting
            .iter()
            .filter(|(_, synced)| !synced)
            .map(|(kind, _)| *kind)
            .collect();
        Err(CacheError::NotSynced {
            kinds: kinds.join(", "),
        })
    }

    async fn all_ready(&self) -> Result<(), CacheError> {
        let closed = |_| CacheError::Closed;
        self.statefulsets.wait_until_ready().await.map_err(closed)?;
        self.services.wait_until_ready().await.map_err(closed)?;
        self.config_maps.wait_until_ready().await.map_err(closed)?;
        self.secrets.wait_until_ready().await.map_err(closed)?;
        self.budgets.wait_until_ready().await.map_err(closed)?;
        self.network_policies
            .wait_until_ready()
            .await
            .map_err(closed)?;
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

/// Annotation, on cached StatefulSets only (never sent to the API server), holding the pod
/// template's spec as JSON text in place of the structs.
pub const COMPACT_POD_SPEC_ANNOTATION: &str = "pgkube.internal/cached-pod-spec";

/// Moves a StatefulSet's pod template spec into [`COMPACT_POD_SPEC_ANNOTATION`] as JSON text.
/// Why: k8s-openapi's structs hold every optional field inline and allocate each string, so a
/// pod spec takes far more memory as structs than as text, and only drift detection reads it
/// (after [`expand_compacted`]); at 1,000 clusters this cut the manager's peak RSS from 172 to
/// 144 MiB (docs/benchmarks.md, "Convergence at scale"). Now that the store keeps the whole
/// StatefulSet as text, it still spares each read of the cache the decoding of the pod spec:
/// code reading the cache sees a template without a spec.
fn compact_pod_spec(statefulset: &mut StatefulSet) {
    let Some(template) = statefulset.spec.as_mut().map(|spec| &mut spec.template) else {
        return;
    };
    let Some(pod_spec) = template.spec.take() else {
        return;
    };
    match serde_json::to_string(&pod_spec) {
        Ok(json) => {
            statefulset
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(COMPACT_POD_SPEC_ANNOTATION.to_owned(), json);
        }
        // Cannot happen for a spec that was just deserialized; keep it whole if it does.
        Err(_) => template.spec = Some(pod_spec),
    }
}

/// Puts back, in the JSON of a cached object, the pod spec that [`compact_pod_spec`] moved into
/// its annotation, and removes the annotation: the object as the API server sent it, minus
/// `managedFields` (one that had no annotations keeps an empty map, which drift detection reads
/// as no annotations). Objects without the annotation are left as they are. Text that does not
/// parse (impossible unless the cache is corrupted) leaves the spec out, which drift detection
/// reads as a difference, so the child is applied again: never a missed drift.
pub fn expand_compacted(live: &mut serde_json::Value) {
    let annotation = live
        .pointer_mut("/metadata/annotations")
        .and_then(serde_json::Value::as_object_mut)
        .and_then(|annotations| annotations.remove(COMPACT_POD_SPEC_ANNOTATION));
    let Some(serde_json::Value::String(json)) = annotation else {
        return;
    };
    let Ok(pod_spec) = serde_json::from_str::<serde_json::Value>(&json) else {
        return;
    };
    if let Some(template) = live
        .pointer_mut("/spec/template")
        .and_then(serde_json::Value::as_object_mut)
    {
        template.insert("spec".to_owned(), pod_spec);
    }
}

/// Waits for the future that `look` makes, making a new one every [`SYNC_RECHECK`] (see there
/// why), for at most `limit`; `None` if it did not resolve within it.
async fn wait_rechecking<F: Future>(
    limit: Duration,
    mut look: impl FnMut() -> F,
) -> Option<F::Output> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let wait =
            SYNC_RECHECK.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        if let Ok(output) = tokio::time::timeout(wait, look()).await {
            return Some(output);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
    }
}

/// Whether `store` has had its first full list (a wait of zero: the readiness future is polled
/// once, and is done at once when it is).
async fn is_synced<K: Resource<DynamicType = ()> + 'static>(store: &Store<Compact<K>>) -> bool {
    matches!(
        tokio::time::timeout(Duration::ZERO, store.wait_until_ready()).await,
        Ok(Ok(()))
    )
}

/// For the watches that only fill a cache: their changes reconcile no cluster.
fn no_trigger() -> Option<ObjectRef<PostgreSQLCluster>> {
    None
}

/// The object `name` in `namespace` as `store` has it, as text (no decode).
pub fn cached_text<K>(
    store: &Store<Compact<K>>,
    namespace: &str,
    name: &str,
) -> Option<Arc<Compact<K>>>
where
    K: Resource<DynamicType = ()>,
{
    store.get(&ObjectRef::new(name).within(namespace))
}

/// The object `name` in `namespace` as `store` has it, decoded from its text. Text that does
/// not decode is logged and read as no object, so the child is applied again (see
/// [`Compact::decode_or_warn`]).
pub fn cached_object<K>(store: &Store<Compact<K>>, namespace: &str, name: &str) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    cached_text(store, namespace, name)?
        .decode_or_warn()
        .map(Arc::new)
}

/// A store of `K` (ours only, without managed fields, without the spec when `SKIP_SPEC`,
/// trimmed by `trim`, and kept as text) and the stream of changes that fills it.
/// With `K` a `PartialObjectMeta`, the watch asks for metadata only.
fn cached<K, const SKIP_SPEC: bool>(
    client: &Client,
    namespace: Option<&str>,
    trim: fn(&mut K),
) -> (
    Store<Compact<K>>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<Compact<K>>();
    let config = watcher::Config::default().labels(MANAGED_BY_SELECTOR);
    let changes =
        crate::watch_lean::<K, SKIP_SPEC>(api::<K>(client, namespace), config).modify(trim);
    let changes = compact::reflector(writer, changes)
        .default_backoff()
        .touched_objects();
    (store, changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;

    #[tokio::test]
    async fn a_store_is_synced_once_its_first_list_is_done() {
        let (store, mut writer) = reflector::store::<Compact<ConfigMap>>();
        assert!(!is_synced(&store).await);
        writer.apply_watcher_event(&Event::Init);
        assert!(!is_synced(&store).await, "a list begun is not done");
        writer.apply_watcher_event(&Event::InitDone);
        assert!(is_synced(&store).await);
    }

    #[tokio::test]
    async fn every_reconcile_waiting_for_a_store_sees_it_synced() {
        let (store, mut writer) = reflector::store::<Compact<ConfigMap>>();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    wait_rechecking(SYNC_TIMEOUT, || store.wait_until_ready()).await
                })
            })
            .collect();
        // Each waiter polls the store's readiness before the list is done.
        tokio::time::sleep(Duration::from_millis(50)).await;
        writer.apply_watcher_event(&Event::InitDone);
        for waiter in waiters {
            let synced = tokio::time::timeout(Duration::from_secs(10), waiter)
                .await
                .expect("a waiter missed the sync: still waiting 10 s after it")
                .expect("waiter task");
            assert!(matches!(synced, Some(Ok(()))));
        }
    }

    #[tokio::test]
    async fn a_store_that_never_syncs_is_waited_for_until_the_limit() {
        let (store, _writer) = reflector::store::<Compact<ConfigMap>>();
        let limit = SYNC_RECHECK + Duration::from_millis(500);
        let started = tokio::time::Instant::now();
        let synced = wait_rechecking(limit, || store.wait_until_ready()).await;
        assert!(synced.is_none(), "a store that never synced read as synced");
        assert!(
            started.elapsed() >= limit,
            "gave up after {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_compacted_statefulset_expands_back_to_what_the_server_sent() {
        use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
        let mut statefulset = StatefulSet::default();
        statefulset.metadata.name = Some("pg-postgresql".to_owned());
        statefulset.metadata.annotations = Some([("a".to_owned(), "b".to_owned())].into());
        statefulset.spec = Some(k8s_openapi::api::apps::v1::StatefulSetSpec {
            replicas: Some(3),
            template: PodTemplateSpec {
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "postgresql".to_owned(),
                        image: Some("postgres:15".to_owned()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
                ..PodTemplateSpec::default()
            },
            ..Default::default()
        });
        let sent = serde_json::to_value(&statefulset).expect("json");

        let mut cached = statefulset.clone();
        compact_pod_spec(&mut cached);
        let template = &cached.spec.as_ref().expect("spec").template;
        assert!(template.spec.is_none(), "the structs are gone");
        let mut expanded = serde_json::to_value(&cached).expect("json");
        expand_compacted(&mut expanded);
        assert_eq!(expanded, sent);
    }

    #[test]
    fn unparsable_compacted_text_expands_to_no_spec_and_others_are_untouched() {
        let mut corrupted = serde_json::json!({
            "metadata": {"annotations": {COMPACT_POD_SPEC_ANNOTATION: "{not json"}},
            "spec": {"template": {"metadata": {}}},
        });
        expand_compacted(&mut corrupted);
        assert_eq!(
            corrupted,
            serde_json::json!({"metadata": {"annotations": {}}, "spec": {"template": {"metadata": {}}}})
        );
        let service = serde_json::json!({"metadata": {"name": "pg-rw"}, "spec": {"ports": []}});
        let mut expanded = service.clone();
        expand_compacted(&mut expanded);
        assert_eq!(expanded, service);
    }

    #[test]
    fn caches_not_synced_say_which_and_what_to_check() {
        let error = CacheError::NotSynced {
            kinds: "Pods, PersistentVolumeClaims".to_owned(),
        };
        assert_eq!(
            error.to_string(),
            "the caches of Pods, PersistentVolumeClaims have not synced after 60s: the manager \
             needs list and watch on them (see deploy/rbac.yaml), and the API server must answer"
        );
    }
}
