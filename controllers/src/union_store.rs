//! One store of a kind across several watched namespaces, so that one Controller can serve them
//! all (and `--max-concurrent-reconciles` bounds them all together).
//!
//! Without a cluster-wide right to list, each namespace needs a watch of its own, and kube's
//! stores take one watch each: a second namespace's relist would wipe the first's objects. So
//! each namespace keeps its own store (authoritative for that namespace), and this union follows
//! them: an object applied or deleted in one is applied or deleted here, as is each object a
//! namespace relists (at once: its change triggers a reconcile, which must find it); once the
//! relist is done, the union drops that namespace's objects its store no longer has. The union
//! is ready once every namespace has listed once.
//!
//! [`controller`] builds one such Controller for a kind: the backup and restore controllers use
//! it as is, and the cluster controller adds its children's watches to it.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, Lookup, Store, reflector, store::Writer};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

/// One Controller of `K` for all of `namespaces` (`[None]`: all namespaces), reconciling at
/// most `concurrency` objects at a time across them; [`Controller::store`] reads every watched
/// namespace's objects. A change of an object triggers its reconcile when `triggers` says so
/// (the store has it either way).
pub fn controller<K>(
    client: &Client,
    namespaces: &[Option<String>],
    concurrency: u16,
    triggers: impl Fn(&K) -> bool + Send + 'static,
) -> Controller<K>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    let (changes, store) = watch_namespaces::<K>(client, namespaces);
    let changes = changes.filter(move |change| {
        // Errors go on to the Controller, which logs them.
        std::future::ready(change.as_ref().map_or(true, &triggers))
    });
    Controller::for_stream(changes, store)
        .with_config(ControllerConfig::default().concurrency(concurrency))
}

/// The watches of `K`, one per namespace, as one stream of the objects they saw change, and the
/// store to read them from (objects without their managed fields): the namespace's own with one
/// namespace, else their union.
fn watch_namespaces<K>(
    client: &Client,
    namespaces: &[Option<String>],
) -> (
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    Store<K>,
)
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    let parts: Vec<_> = namespaces
        .iter()
        .map(|namespace| (namespace.clone(), reflector::store::<K>()))
        .collect();
    let (union, reader) = match parts.as_slice() {
        [(_, (store, _))] => (None, store.clone()),
        parts => {
            let stores = parts
                .iter()
                .map(|(namespace, (store, _))| {
                    (namespace.clone().unwrap_or_default(), store.clone())
                })
                .collect();
            let (union, reader) = UnionStore::new(stores);
            (Some(union), reader)
        }
    };
    let streams = parts
        .into_iter()
        .enumerate()
        .map(|(index, (namespace, (_, writer)))| {
            let union = union.clone();
            let api = crate::api::<K>(client, namespace.as_deref());
            let objects = crate::watch_without_managed_fields(api, watcher::Config::default());
            reflector(writer, objects)
                .default_backoff()
                .inspect(move |event| {
                    if let (Some(union), Ok(event)) = (&union, event) {
                        union.follow(index, event);
                    }
                })
                .touched_objects()
                .boxed()
        });
    (futures::stream::select_all(streams), reader)
}

/// The union of the stores of several namespaces.
pub struct UnionStore<K: Lookup + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    parts: Vec<(String, Store<K>)>,
    state: Mutex<UnionState<K>>,
}

struct UnionState<K: Lookup + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    writer: Writer<K>,
    /// Which parts have listed at least once; the union fills when all have.
    listed: Vec<bool>,
    ready: bool,
}

impl<K> UnionStore<K>
where
    K: Resource<DynamicType = ()> + Lookup<DynamicType = ()> + Clone + 'static,
{
    /// A union of `parts` (each a namespace and its store), and the reader of the union.
    pub fn new(parts: Vec<(String, Store<K>)>) -> (Arc<UnionStore<K>>, Store<K>) {
        let writer = Writer::new(());
        let reader = writer.as_reader();
        let listed = vec![false; parts.len()];
        let union = UnionStore {
            parts,
            state: Mutex::new(UnionState {
                writer,
                listed,
                ready: false,
            }),
        };
        (Arc::new(union), reader)
    }

    /// Follows `event` of part `index`'s watch, which its store has already applied.
    pub fn follow(&self, index: usize, event: &Event<K>) {
        // A panic while holding the lock leaves the state usable: the next relist repairs it.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !state.ready {
            if matches!(event, Event::InitDone) {
                if let Some(listed) = state.listed.get_mut(index) {
                    *listed = true;
                }
                if state.listed.iter().all(|listed| *listed) {
                    self.fill(&mut state.writer);
                    state.ready = true;
                }
            }
            return;
        }
        match event {
            Event::Apply(_) | Event::Delete(_) => state.writer.apply_watcher_event(event),
            // A relisted object goes in at once: its change triggers a reconcile now, which
            // must find it here.
            Event::InitApply(object) => state
                .writer
                .apply_watcher_event(&Event::Apply(object.clone())),
            Event::InitDone => self.drop_stale(&mut state.writer, index),
            Event::Init => {}
        }
    }

    /// The first fill, from every part: the union becomes ready.
    fn fill(&self, writer: &mut Writer<K>) {
        writer.apply_watcher_event(&Event::Init);
        for (_, part) in &self.parts {
            for object in part.state() {
                writer.apply_watcher_event(&Event::InitApply((*object).clone()));
            }
        }
        writer.apply_watcher_event(&Event::InitDone);
    }

    /// After part `index` relisted: drops the objects of its namespace that its store no longer
    /// has (deleted while its watch was down).
    fn drop_stale(&self, writer: &mut Writer<K>, index: usize) {
        let Some((namespace, part)) = self.parts.get(index) else {
            return;
        };
        let stale: Vec<K> = writer
            .as_reader()
            .state()
            .into_iter()
            .filter(|object| object.meta().namespace.as_deref() == Some(namespace.as_str()))
            .filter(|object| part.get(&object.to_object_ref(())).is_none())
            .map(|object| (*object).clone())
            .collect();
        for object in stale {
            writer.apply_watcher_event(&Event::Delete(object));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::ResourceExt;
    use kube::runtime::reflector::store;

    fn object(namespace: &str, name: &str) -> ConfigMap {
        let mut object = ConfigMap::default();
        object.metadata.namespace = Some(namespace.to_owned());
        object.metadata.name = Some(name.to_owned());
        object
    }

    /// A part's store and writer, with the union following its events.
    struct Part {
        writer: Writer<ConfigMap>,
        index: usize,
    }

    impl Part {
        fn send(&mut self, union: &UnionStore<ConfigMap>, event: Event<ConfigMap>) {
            self.writer.apply_watcher_event(&event);
            union.follow(self.index, &event);
        }

        fn list(&mut self, union: &UnionStore<ConfigMap>, objects: &[ConfigMap]) {
            self.send(union, Event::Init);
            for object in objects {
                self.send(union, Event::InitApply(object.clone()));
            }
            self.send(union, Event::InitDone);
        }
    }

    fn names(store: &Store<ConfigMap>) -> Vec<String> {
        let mut names: Vec<String> = store
            .state()
            .iter()
            .map(|o| {
                format!(
                    "{}/{}",
                    ResourceExt::namespace(&**o).unwrap_or_default(),
                    o.name_any()
                )
            })
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_union_fills_once_every_namespace_listed_and_follows_changes_and_relists() {
        let (a_store, a_writer) = store::<ConfigMap>();
        let (b_store, b_writer) = store::<ConfigMap>();
        let (union, reader) =
            UnionStore::new(vec![("a".to_owned(), a_store), ("b".to_owned(), b_store)]);
        let mut a = Part {
            writer: a_writer,
            index: 0,
        };
        let mut b = Part {
            writer: b_writer,
            index: 1,
        };

        a.list(&union, &[object("a", "one"), object("a", "two")]);
        assert!(names(&reader).is_empty(), "not ready before b listed");
        b.list(&union, &[object("b", "one")]);
        assert_eq!(names(&reader), ["a/one", "a/two", "b/one"]);

        a.send(&union, Event::Apply(object("a", "three")));
        b.send(&union, Event::Delete(object("b", "one")));
        assert_eq!(names(&reader), ["a/one", "a/three", "a/two"]);

        // A relisted object is in the union before the relist ends.
        b.send(&union, Event::Init);
        b.send(&union, Event::InitApply(object("b", "four")));
        assert!(names(&reader).contains(&"b/four".to_owned()));
        b.send(&union, Event::InitDone);
        // b's relist leaves a alone; a's relist drops what a no longer has.
        b.list(&union, &[object("b", "four")]);
        a.list(&union, &[object("a", "one")]);
        assert_eq!(names(&reader), ["a/one", "b/four"]);
    }
}
