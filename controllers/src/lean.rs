//! Decoding watched objects without the parts no controller reads: [`Lean`] decodes a `K` from
//! the API server's JSON but skips `metadata.managedFields` (and, for [`WITHOUT_SPEC`], the
//! top-level `spec`) while parsing, so they are never built.
//!
//! Why: every watch event brings the whole object, and its managed fields are most of it once
//! a few managers have written it (the field sets of the applied spec and of each status
//! writer, decoded by k8s-openapi as trees of JSON values). The caches dropped them after
//! decoding, so each event built those trees only to free them; decoding and freeing were
//! among the largest costs of a convergence of 1,000 clusters (README, "Convergence at
//! scale"). Skipping them parses past their text without allocating.
//!
//! How: [`Lean`]'s `Deserialize` hands `K`'s own `Deserialize` a deserializer that wraps the
//! real one and passes everything through, except that the map of the object and then the
//! map of its `metadata` leave out the skipped keys. It works for any `K` whose JSON is an
//! object with `metadata` at its top: every Kubernetes object.

use std::fmt;
use std::marker::PhantomData;

use kube::Resource;
use kube::runtime::watcher::Event;
use serde::Deserialize;
use serde::de::value::{BorrowedStrDeserializer, StringDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

/// Decodes the object's `spec` (see [`Lean`]).
pub const WITH_SPEC: bool = false;
/// Skips the object's `spec` too (see [`Lean`]); only for kinds whose spec is optional, such
/// as pods (a custom resource's required spec would then be missing).
pub const WITHOUT_SPEC: bool = true;

/// A `K` decoded without its managed fields, nor its spec when `SKIP_SPEC`.
#[derive(Clone, Debug)]
pub struct Lean<K, const SKIP_SPEC: bool = WITH_SPEC>(pub K);

impl<'de, K: Deserialize<'de>, const SKIP_SPEC: bool> Deserialize<'de> for Lean<K, SKIP_SPEC> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let level = Level::Object {
            skip_spec: SKIP_SPEC,
        };
        K::deserialize(Filtered {
            inner: deserializer,
            level,
        })
        .map(Lean)
    }
}

/// The API paths, kind and metadata are `K`'s: a `Lean<K>` is requested as a `K`.
impl<K: Resource, const SKIP_SPEC: bool> Resource for Lean<K, SKIP_SPEC> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::plural(dt)
    }
    fn metadata_api() -> bool {
        K::metadata_api()
    }
    fn url_path(dt: &Self::DynamicType, namespace: Option<&str>) -> String {
        K::url_path(dt, namespace)
    }
    fn meta(&self) -> &kube::api::ObjectMeta {
        self.0.meta()
    }
    fn meta_mut(&mut self) -> &mut kube::api::ObjectMeta {
        self.0.meta_mut()
    }
}

/// The same watch event, with the plain object.
pub fn unwrapped<K, const SKIP_SPEC: bool>(event: Event<Lean<K, SKIP_SPEC>>) -> Event<K> {
    match event {
        Event::Apply(Lean(object)) => Event::Apply(object),
        Event::Delete(Lean(object)) => Event::Delete(object),
        Event::Init => Event::Init,
        Event::InitApply(Lean(object)) => Event::InitApply(object),
        Event::InitDone => Event::InitDone,
    }
}

/// Which map a [`Filtered`] deserializer stands for.
#[derive(Clone, Copy)]
enum Level {
    /// The object: its `metadata` is filtered in turn; its `spec` skipped if `skip_spec`.
    Object { skip_spec: bool },
    /// The object's metadata: `managedFields` is skipped.
    Metadata,
}

impl Level {
    fn skips(self, key: &str) -> bool {
        match self {
            Level::Object { skip_spec } => skip_spec && key == "spec",
            Level::Metadata => key == "managedFields",
        }
    }

    /// How to decode the value of `key` in this map.
    fn of_value(self, key: &str) -> Option<Level> {
        match self {
            Level::Object { .. } if key == "metadata" => Some(Level::Metadata),
            _ => None,
        }
    }
}

/// A deserializer that passes everything through to `inner`, filtering the keys of the map
/// it stands for (see [`Level`]).
struct Filtered<D> {
    inner: D,
    level: Level,
}

/// Forwards deserializer methods that cannot reach a filtered map unchanged.
macro_rules! forward_unfiltered {
    ($($method:ident($($arg:ident: $ty:ty),*);)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
                self.inner.$method($($arg,)* visitor)
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Filtered<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        let visitor = FilteredVisitor::new(visitor, self.level);
        self.inner.deserialize_any(visitor)
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let visitor = FilteredVisitor::new(visitor, self.level);
        self.inner.deserialize_struct(name, fields, visitor)
    }
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        let visitor = FilteredVisitor::new(visitor, self.level);
        self.inner.deserialize_map(visitor)
    }
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        let visitor = FilteredVisitor::new(visitor, self.level);
        self.inner.deserialize_option(visitor)
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let visitor = FilteredVisitor::new(visitor, self.level);
        self.inner.deserialize_newtype_struct(name, visitor)
    }

    forward_unfiltered! {
        deserialize_bool(); deserialize_i8(); deserialize_i16(); deserialize_i32();
        deserialize_i64(); deserialize_i128(); deserialize_u8(); deserialize_u16();
        deserialize_u32(); deserialize_u64(); deserialize_u128(); deserialize_f32();
        deserialize_f64(); deserialize_char(); deserialize_str(); deserialize_string();
        deserialize_bytes(); deserialize_byte_buf(); deserialize_unit();
        deserialize_unit_struct(name: &'static str); deserialize_seq();
        deserialize_tuple(len: usize); deserialize_tuple_struct(name: &'static str, len: usize);
        deserialize_enum(name: &'static str, variants: &'static [&'static str]);
        deserialize_identifier(); deserialize_ignored_any();
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// A visitor that hands `inner` a filtered map (and filtered deserializers for what an option
/// or a newtype holds); everything else passes through.
struct FilteredVisitor<V> {
    inner: V,
    level: Level,
}

impl<V> FilteredVisitor<V> {
    fn new(inner: V, level: Level) -> Self {
        FilteredVisitor { inner, level }
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for FilteredVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(formatter)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_map(FilteredMap {
            inner: map,
            level: self.level,
            value_level: None,
        })
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        let level = self.level;
        self.inner.visit_some(Filtered {
            inner: deserializer,
            level,
        })
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<V::Value, D::Error> {
        let level = self.level;
        self.inner.visit_newtype_struct(Filtered {
            inner: deserializer,
            level,
        })
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.inner.visit_seq(seq)
    }
    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }
    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_unit()
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<V::Value, E> {
        self.inner.visit_bool(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<V::Value, E> {
        self.inner.visit_i64(v)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<V::Value, E> {
        self.inner.visit_u64(v)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<V::Value, E> {
        self.inner.visit_f64(v)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        self.inner.visit_str(v)
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        self.inner.visit_borrowed_str(v)
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<V::Value, E> {
        self.inner.visit_string(v)
    }
}

/// The map of a [`Filtered`] deserializer: skips the keys its level skips (parsing past their
/// values without building them) and filters the value of `metadata` in an object.
struct FilteredMap<A> {
    inner: A,
    level: Level,
    /// How to decode the value of the key last returned (`None`: as it is).
    value_level: Option<Level>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for FilteredMap<A> {
    type Error = A::Error;

    fn next_key_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, A::Error> {
        while let Some(key) = self.inner.next_key_seed(KeySeed)? {
            if self.level.skips(key.as_str()) {
                self.inner.next_value::<IgnoredAny>()?;
                continue;
            }
            self.value_level = self.level.of_value(key.as_str());
            return match key {
                Key::Borrowed(key) => seed.deserialize(BorrowedStrDeserializer::new(key)),
                Key::Owned(key) => seed.deserialize(StringDeserializer::new(key)),
            }
            .map(Some);
        }
        Ok(None)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        match self.value_level.take() {
            Some(level) => self
                .inner
                .next_value_seed(FilteredSeed { inner: seed, level }),
            None => self.inner.next_value_seed(seed),
        }
    }
}

/// A key as the input has it: borrowed from it unless it had to be unescaped.
enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Key<'_> {
    fn as_str(&self) -> &str {
        match self {
            Key::Borrowed(key) => key,
            Key::Owned(key) => key,
        }
    }
}

/// Reads a map's key as a [`Key`].
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Key<'de>, D::Error> {
        deserializer.deserialize_str(KeyVisitor(PhantomData))
    }
}

struct KeyVisitor<'de>(PhantomData<&'de ()>);

impl<'de> Visitor<'de> for KeyVisitor<'de> {
    type Value = Key<'de>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a field name")
    }
    fn visit_borrowed_str<E: de::Error>(self, key: &'de str) -> Result<Key<'de>, E> {
        Ok(Key::Borrowed(key))
    }
    fn visit_str<E: de::Error>(self, key: &str) -> Result<Key<'de>, E> {
        Ok(Key::Owned(key.to_owned()))
    }
    fn visit_string<E: de::Error>(self, key: String) -> Result<Key<'de>, E> {
        Ok(Key::Owned(key))
    }
}

/// Decodes a value with `inner`, through a [`Filtered`] deserializer of `level`.
struct FilteredSeed<S> {
    inner: S,
    level: Level,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for FilteredSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.inner.deserialize(Filtered {
            inner: deserializer,
            level: self.level,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::{Pod, Secret};
    use kube::core::{PartialObjectMeta, WatchEvent};
    use serde_json::{Value, json};

    /// A pod as a watch brings it: managed fields of two managers, a spec and a status. The
    /// `managedFields` label and annotation check that only the metadata's own
    /// `managedFields` is skipped.
    fn pod_json() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "db-1-0",
                "namespace": "team-a",
                "uid": "9b1c",
                "resourceVersion": "812",
                "labels": {"managedFields": "a label, kept", "pgkube.io/role": "primary"},
                "annotations": {"note": "\"managedFields\": [] in a value"},
                "managedFields": [
                    {"manager": "kube-controller-manager", "operation": "Update",
                     "apiVersion": "v1", "time": "2026-12-03T08:00:00Z",
                     "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                                  "f:spec": {"f:containers": {"k:{\"name\":\"postgres\"}": {}}}}},
                    {"manager": "kwok", "operation": "Update", "apiVersion": "v1",
                     "subresource": "status", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:status": {"f:phase": {}}}}
                ],
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                      "name": "db-1", "uid": "77aa", "controller": true}]
            },
            "spec": {"containers": [{"name": "postgres", "image": "postgres:15"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.7"}
        })
    }

    /// The pod as k8s-openapi decodes it, without what [`Lean`] skips.
    fn decoded_without(mut json: Value, skipped: &[&str]) -> Pod {
        for pointer in skipped {
            let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
            if let Some(map) = json.pointer_mut(parent).and_then(Value::as_object_mut) {
                map.remove(key);
            }
        }
        serde_json::from_value(json).expect("a pod")
    }

    #[test]
    fn a_lean_object_is_the_object_without_its_managed_fields() {
        let text = pod_json().to_string();
        let lean: Lean<Pod> = serde_json::from_str(&text).expect("decodes");
        assert_eq!(
            lean.0,
            decoded_without(pod_json(), &["/metadata/managedFields"])
        );
        assert_eq!(lean.0.metadata.managed_fields, None);
        assert!(lean.0.spec.is_some());
        assert_eq!(lean.0.metadata.labels.as_ref().map(|l| l.len()), Some(2));
        // The full decode has them: the comparison above is not trivially equal.
        let full: Pod = serde_json::from_str(&text).expect("decodes");
        assert_eq!(full.metadata.managed_fields.map(|m| m.len()), Some(2));
    }

    #[test]
    fn escaped_keys_are_read_as_what_they_mean() {
        // `\u0069` is `i`: keys with escapes are unescaped before they are compared or kept.
        let text = pod_json()
            .to_string()
            .replace("\"uid\"", "\"u\\u0069d\"")
            .replace("\"managedFields\":[", "\"managedF\\u0069elds\":[");
        assert!(text.contains("u\\u0069d") && text.contains("managedF\\u0069elds"));
        let lean: Lean<Pod> = serde_json::from_str(&text).expect("decodes");
        assert_eq!(
            lean.0,
            decoded_without(pod_json(), &["/metadata/managedFields"])
        );
    }

    #[test]
    fn without_spec_skips_the_spec_and_keeps_the_status() {
        let text = pod_json().to_string();
        let lean: Lean<Pod, WITHOUT_SPEC> = serde_json::from_str(&text).expect("decodes");
        assert_eq!(
            lean.0,
            decoded_without(pod_json(), &["/metadata/managedFields", "/spec"])
        );
        assert_eq!(
            lean.0.status.and_then(|s| s.pod_ip).as_deref(),
            Some("10.0.0.7")
        );
    }

    #[test]
    fn a_nested_spec_is_kept_when_only_the_objects_spec_is_skipped() {
        let statefulset = json!({
            "metadata": {"name": "db-1", "managedFields": [{"manager": "pgkube"}]},
            "spec": {"serviceName": "db-1", "selector": {},
                     "template": {"metadata": {"labels": {"a": "b"}},
                                  "spec": {"containers": [{"name": "postgres"}]}}}
        });
        let lean: Lean<StatefulSet> =
            serde_json::from_str(&statefulset.to_string()).expect("decodes");
        let template = lean.0.spec.expect("spec").template;
        assert_eq!(template.spec.map(|s| s.containers.len()), Some(1));
        assert_eq!(lean.0.metadata.managed_fields, None);
    }

    #[test]
    fn watch_events_and_metadata_only_objects_decode_lean() {
        let event = json!({"type": "MODIFIED", "object": pod_json()}).to_string();
        let Ok(WatchEvent::Modified(Lean(pod))) =
            serde_json::from_str::<WatchEvent<Lean<Pod>>>(&event)
        else {
            panic!("a modified pod");
        };
        assert_eq!(pod.metadata.name.as_deref(), Some("db-1-0"));
        assert_eq!(pod.metadata.managed_fields, None);

        let secret = json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": "db-1-credentials", "managedFields": [{"manager": "pgkube"}]}
        });
        let lean: Lean<PartialObjectMeta<Secret>> =
            serde_json::from_str(&secret.to_string()).expect("decodes");
        assert_eq!(lean.0.metadata.name.as_deref(), Some("db-1-credentials"));
        assert_eq!(lean.0.metadata.managed_fields, None);
    }

    #[test]
    fn errors_in_what_is_kept_are_still_errors() {
        let mut pod = pod_json();
        pod["metadata"]["name"] = json!(7);
        assert!(serde_json::from_str::<Lean<Pod>>(&pod.to_string()).is_err());
        // Malformed JSON inside a skipped value is still malformed JSON.
        let text = pod_json()
            .to_string()
            .replace("\"f:phase\":{}", "\"f:phase\":{");
        assert!(serde_json::from_str::<Lean<Pod>>(&text).is_err());
    }
}
