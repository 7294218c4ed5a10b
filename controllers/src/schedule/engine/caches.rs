//! The engine's watch caches: clusters (as compact text), backups and restores, one store per
//! kind and watched namespace, and the cluster watch's messages to the engine's loop.

use std::future::ready;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use pgkube_crds::{PostgreSQLBackup, PostgreSQLCluster, PostgreSQLRestore};
use tokio::sync::mpsc;

use super::{ClusterKey, Message, api};
use crate::compact::{self, Compact};

pub(super) type Watch = futures::future::BoxFuture<'static, ()>;

/// The watch caches: one store per kind and watched namespace.
#[derive(Default)]
pub(super) struct Caches {
    /// As text (see `compact`): the cluster controller's cache holds them decoded.
    clusters: Vec<Store<Compact<PostgreSQLCluster>>>,
    backups: Vec<Store<PostgreSQLBackup>>,
    restores: Vec<Store<PostgreSQLRestore>>,
}

impl Caches {
    /// Watches clusters into a new store and tells the loop about each change.
    pub(super) fn watch_clusters(
        &mut self,
        client: &Client,
        namespace: Option<&str>,
        sender: mpsc::UnboundedSender<Message>,
    ) -> Watch {
        let (store, writer) = reflector::store();
        self.clusters.push(store);
        let api = api::<PostgreSQLCluster>(client, namespace);
        let changes = crate::watch_without_managed_fields(api, watcher::Config::default());
        compact::reflector(writer, changes)
            .default_backoff()
            .for_each(move |event| {
                let message = match event {
                    Ok(watcher::Event::Apply(cluster) | watcher::Event::Delete(cluster)) => {
                        Some(Message::Changed(ClusterKey::of(&cluster)))
                    }
                    Ok(watcher::Event::InitDone) => Some(Message::Relisted),
                    Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => None,
                    Err(error) => {
                        tracing::warn!(%error, "cluster watch failed; retrying");
                        None
                    }
                };
                if let Some(message) = message {
                    // No receiver means the loop stopped: nothing left to tell.
                    let _ = sender.send(message);
                }
                ready(())
            })
            .boxed()
    }

    pub(super) fn watch_backups(&mut self, client: &Client, namespace: Option<&str>) -> Watch {
        let (store, writer) = reflector::store();
        self.backups.push(store);
        cache(writer, api(client, namespace), "backup")
    }

    pub(super) fn watch_restores(&mut self, client: &Client, namespace: Option<&str>) -> Watch {
        let (store, writer) = reflector::store();
        self.restores.push(store);
        cache(writer, api(client, namespace), "restore")
    }

    /// Resolves once every cache has synced.
    pub(super) async fn ready(&self) {
        let clusters = self.clusters.iter().map(|s| s.wait_until_ready().boxed());
        let backups = self.backups.iter().map(|s| s.wait_until_ready().boxed());
        let restores = self.restores.iter().map(|s| s.wait_until_ready().boxed());
        // Only fails when a watch stopped, which it does only at shutdown.
        let _ = futures::future::join_all(clusters.chain(backups).chain(restores)).await;
    }

    /// The cluster, decoded from the cache's text. Text that does not decode (impossible unless
    /// the cache is corrupted) is logged and read as no cluster: the engine forgets it until its
    /// next change.
    pub(super) fn cluster(&self, key: &ClusterKey) -> Option<PostgreSQLCluster> {
        let reference = reflector::ObjectRef::new(&key.name).within(&key.namespace);
        let compact = self
            .clusters
            .iter()
            .find_map(|store| store.get(&reference))?;
        compact.decode_or_warn()
    }

    pub(super) fn cluster_keys(&self) -> Vec<ClusterKey> {
        let clusters = self.clusters.iter().flat_map(Store::state);
        let key = |cluster: Arc<Compact<PostgreSQLCluster>>| ClusterKey {
            namespace: reflector::Lookup::namespace(cluster.as_ref())
                .unwrap_or_default()
                .into_owned(),
            name: reflector::Lookup::name(cluster.as_ref())
                .unwrap_or_default()
                .into_owned(),
        };
        clusters.map(key).collect()
    }

    pub(super) fn backups_in(&self, namespace: &str) -> Vec<Arc<PostgreSQLBackup>> {
        in_namespace(&self.backups, namespace)
    }

    pub(super) fn restores_in(&self, namespace: &str) -> Vec<Arc<PostgreSQLRestore>> {
        in_namespace(&self.restores, namespace)
    }
}

fn in_namespace<K>(stores: &[Store<K>], namespace: &str) -> Vec<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    stores
        .iter()
        .flat_map(Store::state)
        .filter(|object| object.meta().namespace.as_deref() == Some(namespace))
        .collect()
}

/// Keeps a store of `K` up to date.
fn cache<K>(writer: reflector::store::Writer<K>, api: Api<K>, what: &'static str) -> Watch
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let changes = crate::watch_without_managed_fields(api, watcher::Config::default());
    reflector::reflector(writer, changes)
        .default_backoff()
        .for_each(move |event| {
            if let Err(error) = event {
                tracing::warn!(%error, "{what} watch failed; retrying");
            }
            ready(())
        })
        .boxed()
}
