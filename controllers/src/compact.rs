//! Cached objects kept as their JSON text: [`Compact`] holds an object's name, namespace and
//! JSON, and is decoded back into the typed object when a reconcile reads it.
//!
//! Why: k8s-openapi's types reserve room for every optional field inline (a Service is 824
//! bytes before its first string, a StatefulSet 2,560, a Pod 2,248) and allocate each string,
//! label and map node apart, each with the allocator's own overhead. Held by the thousand in the
//! watch caches, the typed objects were most of the manager's heap: at 1,000 clusters, about
//! 50 of its 54 MB (heaptrack, docs/benchmarks.md "Convergence at scale"). As text, the same
//! objects take a fraction of that, in one allocation each. The price is a decode per read, and
//! a reconcile reads only its own cluster's few children.
//!
//! The store's key is the name and namespace alone: a compact object reports no resource
//! version or uid to the store, which keys objects by name and namespace and only copies them.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use kube::Resource;
use kube::runtime::reflector::Lookup;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::{self, Event};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A `K` as its JSON text, for a reflector store (see the module doc).
pub struct Compact<K> {
    name: Box<str>,
    namespace: Option<Box<str>>,
    /// Shared by the store's copy and the event it was made from.
    json: Arc<str>,
    kind: PhantomData<fn() -> K>,
}

// Not derived: a derive would ask `K: Clone`, which the text does not need.
impl<K> Clone for Compact<K> {
    fn clone(&self) -> Self {
        Compact {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            json: Arc::clone(&self.json),
            kind: PhantomData,
        }
    }
}

impl<K> std::fmt::Debug for Compact<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compact")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .field("bytes", &self.json.len())
            .finish()
    }
}

impl<K: Resource + Serialize> Compact<K> {
    /// `object` as text. Fails only if `object` cannot be written as JSON, which no object
    /// decoded from the API server's JSON can fail.
    pub fn new(object: &K) -> Result<Self, serde_json::Error> {
        let meta = object.meta();
        Ok(Compact {
            name: meta.name.as_deref().unwrap_or_default().into(),
            namespace: meta.namespace.as_deref().map(Into::into),
            json: serde_json::to_string(object)?.into(),
            kind: PhantomData,
        })
    }
}

impl<K> Compact<K> {
    /// The object's JSON text.
    pub fn json(&self) -> &str {
        &self.json
    }

    /// The object as a JSON value, straight from its text: what drift detection compares,
    /// without decoding the typed object first.
    pub fn value(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(&self.json)
    }
}

impl<K: DeserializeOwned> Compact<K> {
    /// The object, decoded from its text.
    pub fn decode(&self) -> Result<K, serde_json::Error> {
        serde_json::from_str(&self.json)
    }
}

impl<K: Resource<DynamicType = ()>> Compact<K> {
    /// The object as a cache's reader wants it: text that does not decode (impossible unless
    /// the cache is corrupted, since it was written from a decoded object) is logged and read as
    /// no object, which makes the reader act as if the object were missing.
    pub fn decode_or_warn(&self) -> Option<K>
    where
        K: DeserializeOwned,
    {
        self.decode().inspect_err(|error| self.warn(error)).ok()
    }

    /// [`Self::value`], with text that does not parse logged and read as no object, as
    /// [`Self::decode_or_warn`] does.
    pub fn value_or_warn(&self) -> Option<serde_json::Value> {
        self.value().inspect_err(|error| self.warn(error)).ok()
    }

    fn warn(&self, error: &serde_json::Error) {
        let kind = K::kind(&());
        let (name, namespace) = (&*self.name, self.namespace.as_deref());
        tracing::warn!(%error, %kind, name, namespace, "cached object does not decode");
    }
}

impl<K: Resource> Lookup for Compact<K> {
    type DynamicType = K::DynamicType;

    fn kind(dyntype: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dyntype)
    }
    fn group(dyntype: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dyntype)
    }
    fn version(dyntype: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dyntype)
    }
    fn plural(dyntype: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dyntype)
    }
    fn name(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.name))
    }
    fn namespace(&self) -> Option<Cow<'_, str>> {
        self.namespace.as_deref().map(Cow::Borrowed)
    }
    /// None: the store would copy it into every key, and nothing reads it there.
    fn resource_version(&self) -> Option<Cow<'_, str>> {
        None
    }
    /// None, as [`Self::resource_version`].
    fn uid(&self) -> Option<Cow<'_, str>> {
        None
    }
}

/// What kube's `reflector` does, with the store's copy as text: `writer`'s store takes each
/// change of `changes` before it goes on, so that whatever the change triggers reads it.
pub fn reflector<K, S>(
    mut writer: Writer<Compact<K>>,
    changes: S,
) -> impl Stream<Item = S::Item> + Send + 'static
where
    K: Resource<DynamicType = ()> + Serialize + Send + Sync + 'static,
    S: Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
{
    changes.inspect_ok(move |event| match compacted(event) {
        Ok(event) => writer.apply_watcher_event(&event),
        // Cannot happen for an object just decoded from JSON; the store keeps what it had.
        Err(error) => tracing::warn!(%error, kind = %K::kind(&()), "change not cached"),
    })
}

/// The same watch event with its object as text; fails when the object cannot be written as
/// JSON (see [`Compact::new`]).
pub fn compacted<K: Resource + Serialize>(
    event: &Event<K>,
) -> Result<Event<Compact<K>>, serde_json::Error> {
    Ok(match event {
        Event::Apply(object) => Event::Apply(Compact::new(object)?),
        Event::Delete(object) => Event::Delete(Compact::new(object)?),
        Event::Init => Event::Init,
        Event::InitApply(object) => Event::InitApply(Compact::new(object)?),
        Event::InitDone => Event::InitDone,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
    use kube::runtime::reflector::{self, ObjectRef};

    fn service(name: &str) -> Service {
        let mut service = Service::default();
        service.metadata.name = Some(name.to_owned());
        service.metadata.namespace = Some("db".to_owned());
        service.metadata.resource_version = Some("42".to_owned());
        service.metadata.labels = Some([("app".to_owned(), "pg".to_owned())].into());
        service.spec = Some(ServiceSpec {
            ports: Some(vec![ServicePort {
                port: 5432,
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        });
        service
    }

    #[test]
    fn a_compact_object_decodes_to_the_object() {
        let original = service("pg-rw");
        let compact = Compact::new(&original).expect("compact");
        assert_eq!(compact.decode().expect("decode"), original);
        assert_eq!(Lookup::name(&compact).as_deref(), Some("pg-rw"));
        assert_eq!(Lookup::namespace(&compact).as_deref(), Some("db"));
    }

    #[test]
    fn a_compact_objects_value_is_the_objects_json_value() {
        let original = service("pg-rw");
        let compact = Compact::new(&original).expect("compact");
        let expected = serde_json::to_value(&original).expect("to value");
        assert_eq!(compact.value().expect("value"), expected);
        assert_eq!(
            compact.value().expect("value")["spec"]["ports"][0]["port"],
            5432
        );
    }

    #[test]
    fn a_compact_object_that_does_not_decode_reads_as_no_object() {
        let mut compact = Compact::<Service>::new(&service("pg-rw")).expect("compact");
        compact.json = Arc::from(r#"{"metadata": {"name": 5}}"#);
        assert!(compact.decode_or_warn().is_none());
        assert!(compact.value_or_warn().is_some(), "still JSON");
        compact.json = Arc::from(r#"{"metadata": "#);
        assert!(compact.value_or_warn().is_none());
    }

    #[test]
    fn a_store_of_compact_objects_finds_replaces_and_forgets_them_by_name() {
        let (store, mut writer) = reflector::store::<Compact<Service>>();
        let apply = |writer: &mut reflector::store::Writer<_>, event: Event<Service>| {
            writer.apply_watcher_event(&compacted(&event).expect("compacted"));
        };
        apply(&mut writer, Event::Apply(service("pg-rw")));
        let mut changed = service("pg-rw");
        changed.metadata.resource_version = Some("43".to_owned());
        apply(&mut writer, Event::Apply(changed.clone()));
        apply(&mut writer, Event::Apply(service("pg-ro")));

        let key = ObjectRef::new("pg-rw").within("db");
        let found = store.get(&key).expect("cached");
        assert_eq!(found.decode().expect("decode"), changed);
        assert_eq!(store.state().len(), 2);

        apply(&mut writer, Event::Delete(changed));
        assert!(store.get(&key).is_none());
        assert_eq!(store.state().len(), 1);
    }
}
