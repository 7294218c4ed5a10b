//! Conversion is lossless, on generated objects of every kind:
//! - on valid objects, [`convert`] agrees with the typed oracle (each field goes to its place)
//!   and v1alpha1 -> v1beta1 -> v1alpha1 and v1beta1 -> v1alpha1 -> v1beta1 are the identity;
//!   one conversion changes no metadata but conversion's own annotation; an object asked for in
//!   its own version comes back unchanged;
//! - with fields no version knows added at several depths (spec, status, objects inside them,
//!   moved objects), each such field is at its place in the other version, or carried in the
//!   annotation where that version has no place for it, the known fields convert as without
//!   them, and both round trips are still the identity;
//! - on any JSON shaped around the fields that move (both versions' names at their places and
//!   elsewhere, values of any type, annotations conversion wrote for other objects), conversion
//!   never fails and both round trips are the identity.

mod oracle;
mod strategies;

use std::fmt::Debug;

use kube::Resource;
use oracle::Typed;
use pgkube_crds::conversion::{V1ALPHA1_FIELDS_ANNOTATION, V1BETA1_FIELDS_ANNOTATION, convert};
use pgkube_crds::{v1alpha1, v1beta1};
use proptest::prelude::*;
use serde::Serialize;
use serde_json::Value;
use strategies::json;

/// What a round trip from `Start` through `Other` must keep: everything.
fn check_round_trip<Start, Other>(start: Start) -> Result<(), TestCaseError>
where
    Start: Resource<DynamicType = ()> + Serialize + Clone + PartialEq + Debug + Typed<Other>,
    Other: Resource<DynamicType = ()> + Serialize + Typed<Start>,
{
    let there: Other = start.clone().typed();
    let back: Start = there.typed();
    prop_assert_eq!(&back, &start);
    check_json_round_trip::<Start, Other>(&start)?;
    check_metadata_kept::<Start, Other>(start)
}

/// Through [`convert`]: the same objects as the typed oracle, back to the very JSON, and
/// unchanged when asked for in their own version.
fn check_json_round_trip<Start, Other>(start: &Start) -> Result<(), TestCaseError>
where
    Start: Resource<DynamicType = ()> + Serialize + Clone + Typed<Other>,
    Other: Resource<DynamicType = ()> + Serialize,
{
    let json = to_json(start);
    let start_version = Start::api_version(&());
    let other_version = Other::api_version(&());
    let there = convert(json.clone(), &other_version).map_err(fail)?;
    let typed: Other = start.clone().typed();
    prop_assert_eq!(&there, &to_json(&typed));
    let back = convert(there, &start_version).map_err(fail)?;
    prop_assert_eq!(&back, &json);
    let same = convert(json.clone(), &start_version).map_err(fail)?;
    prop_assert_eq!(same, json);
    Ok(())
}

/// One conversion keeps the metadata, but for conversion's annotations.
fn check_metadata_kept<Start, Other>(start: Start) -> Result<(), TestCaseError>
where
    Start: Resource<DynamicType = ()> + Serialize,
    Other: Resource<DynamicType = ()>,
{
    let json = to_json(&start);
    let there = convert(json.clone(), &Other::api_version(&())).map_err(fail)?;
    prop_assert_eq!(
        without_carried_fields(&there["metadata"]),
        without_carried_fields(&json["metadata"])
    );
    Ok(())
}

fn without_carried_fields(metadata: &Value) -> Value {
    let mut metadata = metadata.clone();
    if let Some(annotations) = metadata
        .get_mut("annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove(V1BETA1_FIELDS_ANNOTATION);
        annotations.remove(V1ALPHA1_FIELDS_ANNOTATION);
        if annotations.is_empty() {
            metadata.as_object_mut().map(|m| m.remove("annotations"));
        }
    }
    metadata
}

fn to_json(object: &impl Serialize) -> Value {
    serde_json::to_value(object).expect("objects serialize")
}

fn fail(error: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(error.to_string())
}

proptest! {
    #[test]
    fn v1alpha1_clusters_survive_a_round_trip(cluster in strategies::v1alpha1::cluster()) {
        check_round_trip::<v1alpha1::PostgreSQLCluster, v1beta1::PostgreSQLCluster>(cluster)?;
    }

    #[test]
    fn v1beta1_clusters_survive_a_round_trip(cluster in strategies::v1beta1::cluster()) {
        check_round_trip::<v1beta1::PostgreSQLCluster, v1alpha1::PostgreSQLCluster>(cluster)?;
    }

    #[test]
    fn v1alpha1_backups_survive_a_round_trip(backup in strategies::v1alpha1::backup()) {
        check_round_trip::<v1alpha1::PostgreSQLBackup, v1beta1::PostgreSQLBackup>(backup)?;
    }

    #[test]
    fn v1beta1_backups_survive_a_round_trip(backup in strategies::v1beta1::backup()) {
        check_round_trip::<v1beta1::PostgreSQLBackup, v1alpha1::PostgreSQLBackup>(backup)?;
    }

    #[test]
    fn v1alpha1_restores_survive_a_round_trip(restore in strategies::v1alpha1::restore()) {
        check_round_trip::<v1alpha1::PostgreSQLRestore, v1beta1::PostgreSQLRestore>(restore)?;
    }

    #[test]
    fn v1beta1_restores_survive_a_round_trip(restore in strategies::v1beta1::restore()) {
        check_round_trip::<v1beta1::PostgreSQLRestore, v1alpha1::PostgreSQLRestore>(restore)?;
    }

    /// On v1alpha1, the annotation is there exactly when the v1beta1 cluster has a storage
    /// class, and names it.
    #[test]
    fn a_storage_class_travels_in_the_annotation(cluster in strategies::v1beta1::cluster()) {
        let class = cluster.spec.storage.storage_class_name.clone();
        let alpha = convert(to_json(&cluster), v1alpha1::API_VERSION).map_err(fail)?;
        let carried = alpha.pointer("/metadata/annotations").and_then(|a| a.get(V1BETA1_FIELDS_ANNOTATION));
        let expected = class.map(|class| {
            Value::String(serde_json::json!({"spec": {"storage": {"storageClassName": class}}}).to_string())
        });
        prop_assert_eq!(carried, expected.as_ref());
    }
}

/// Where a field no version knows, added to an object of one version, must be in the other:
/// the JSON pointer of the object it is added to, and that of the object it must be in (`None`:
/// the other version has no such object, so it is carried in the annotation, at the pointer it
/// came from).
type Site = (&'static str, Option<&'static str>);

const V1ALPHA1_CLUSTER_SITES: &[Site] = &[
    ("/spec", Some("/spec")),
    ("/spec/backup", Some("/spec/backup")),
    ("/spec/backup/s3", Some("/spec/backup/storage/s3")),
    (
        "/spec/backup/s3/credentials",
        Some("/spec/backup/storage/s3/credentials"),
    ),
    ("/spec/backup/compression", Some("/spec/backup/compression")),
    ("/spec/bootstrap/source", Some("/spec/bootstrap/source")),
    (
        "/spec/bootstrap/source/s3",
        Some("/spec/bootstrap/source/storage/s3"),
    ),
    ("/spec/resources", Some("/spec/resources")),
    ("/spec/highAvailability", Some("/spec/highAvailability")),
    ("/status", Some("/status")),
    ("/status/conditions/0", Some("/status/conditions/0")),
    ("/status/instances/0", Some("/status/instances/0")),
];

const V1BETA1_CLUSTER_SITES: &[Site] = &[
    ("/spec", Some("/spec")),
    ("/spec/storage", None),
    ("/spec/backup", Some("/spec/backup")),
    ("/spec/backup/schedule", None),
    ("/spec/backup/retention", None),
    ("/spec/backup/storage", None),
    ("/spec/backup/storage/s3", Some("/spec/backup/s3")),
    ("/spec/bootstrap", Some("/spec/bootstrap")),
    ("/spec/bootstrap/source/storage", None),
    (
        "/spec/bootstrap/source/storage/s3/credentials",
        Some("/spec/bootstrap/source/s3/credentials"),
    ),
    ("/spec/postgresql", Some("/spec/postgresql")),
    ("/status", Some("/status")),
    ("/status/primaryChange", Some("/status/primaryChange")),
    ("/status/conditions/1", Some("/status/conditions/1")),
];

const V1ALPHA1_BACKUP_SITES: &[Site] = &[
    ("/spec", Some("/spec")),
    ("/spec/cluster", Some("/spec/cluster")),
    ("/status", Some("/status")),
    ("/status/storage", Some("/status/storage/s3")),
    (
        "/status/storage/credentials/accessKeyId",
        Some("/status/storage/s3/credentials/accessKeyId"),
    ),
    ("/status/conditions/0", Some("/status/conditions/0")),
];

const V1BETA1_BACKUP_SITES: &[Site] = &[
    ("/spec", Some("/spec")),
    ("/spec/compression", Some("/spec/compression")),
    ("/status", Some("/status")),
    ("/status/storage", None),
    ("/status/storage/s3", Some("/status/storage")),
];

const V1ALPHA1_RESTORE_SITES: &[Site] = &[
    ("/spec", Some("/spec")),
    ("/spec/source", Some("/spec/source")),
    ("/spec/source/s3", Some("/spec/source/storage/s3")),
    ("/status", Some("/status")),
    ("/status/conditions/0", Some("/status/conditions/0")),
];

const V1BETA1_RESTORE_SITES: &[Site] = &[
    ("/spec", Some("/spec")),
    ("/spec/backup", Some("/spec/backup")),
    ("/spec/source/storage", None),
    ("/spec/source/storage/s3", Some("/spec/source/s3")),
    ("/status", Some("/status")),
];

/// A field no version knows, added at a site.
struct Added {
    site: Site,
    name: String,
    value: Value,
}

/// Adds each field to its site, where the object has that site.
fn add_unknown_fields(
    json: &mut Value,
    sites: &[Site],
    fields: Vec<(String, Value)>,
) -> Vec<Added> {
    let mut added = Vec::new();
    for (site, (name, value)) in sites.iter().zip(fields) {
        if let Some(object) = json.pointer_mut(site.0).and_then(Value::as_object_mut) {
            object.insert(name.clone(), value.clone());
            added.push(Added {
                site: *site,
                name,
                value,
            });
        }
    }
    added
}

/// The carried fields in the annotation `key` of `object`, as JSON.
fn carried(object: &Value, key: &str) -> Option<Value> {
    let text = object
        .pointer("/metadata/annotations")?
        .get(key)?
        .as_str()?;
    serde_json::from_str(text).ok()
}

/// Converts `json` (valid but for the `added` fields) to `Other`: each added field is at its
/// place there or carried, and without them the result is the oracle's.
fn check_unknown_fields_placed<Start, Other>(
    start: &Start,
    json: Value,
    added: &[Added],
    carrying: &str,
) -> Result<(), TestCaseError>
where
    Start: Resource<DynamicType = ()> + Clone + Typed<Other>,
    Other: Resource<DynamicType = ()> + Serialize,
{
    let there = convert(json.clone(), &Other::api_version(&())).map_err(fail)?;
    let mut tree = carried(&there, carrying).unwrap_or(Value::Null);
    let mut known = there.clone();
    for field in added {
        let (holder, at) = match field.site.1 {
            Some(pointer) => (&mut known, pointer),
            None => (&mut tree, field.site.0),
        };
        let object = holder.pointer_mut(at).and_then(Value::as_object_mut);
        let found = object.and_then(|object| object.remove(&field.name));
        prop_assert_eq!(
            found.as_ref(),
            Some(&field.value),
            "{} at {:?}",
            field.name,
            field.site
        );
    }
    // What is left carried is what the oracle carries: the storage class, if any.
    if added.iter().any(|field| field.site.1.is_none()) {
        prune_empty_objects(&mut tree);
        set_annotation(
            &mut known,
            carrying,
            (!tree.is_null()).then(|| tree.to_string()),
        );
    }
    let typed: Other = start.clone().typed();
    prop_assert_eq!(known, to_json(&typed));
    let back = convert(there, &Start::api_version(&())).map_err(fail)?;
    prop_assert_eq!(back, json);
    Ok(())
}

/// Sets the annotation `key` of `object` to `value`, or removes it (and a map left empty).
fn set_annotation(object: &mut Value, key: &str, value: Option<String>) {
    let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Some(annotations) = annotations.as_object_mut() {
        match value {
            Some(value) => annotations.insert(key.to_owned(), Value::String(value)),
            None => annotations.remove(key),
        };
        if annotations.is_empty() {
            metadata.remove("annotations");
        }
    }
}

/// Removes the objects left empty, all the way up; an empty root becomes `null`.
fn prune_empty_objects(value: &mut Value) {
    if let Value::Object(fields) = value {
        for field in fields.values_mut() {
            prune_empty_objects(field);
        }
        fields.retain(|_, field| !field.is_null());
        if fields.is_empty() {
            *value = Value::Null;
        }
    }
}

/// Adds fields no version knows to a valid `Start` at `sites`, then checks both their places in
/// the other version and the round trip.
fn check_with_unknown_fields<Start, Other>(
    start: Start,
    sites: &[Site],
    fields: Vec<(String, Value)>,
) -> Result<(), TestCaseError>
where
    Start: Resource<DynamicType = ()> + Serialize + Clone + Typed<Other>,
    Other: Resource<DynamicType = ()> + Serialize,
{
    let mut json = to_json(&start);
    let added = add_unknown_fields(&mut json, sites, fields);
    let carrying = if Start::api_version(&()) == v1beta1::API_VERSION {
        V1BETA1_FIELDS_ANNOTATION
    } else {
        V1ALPHA1_FIELDS_ANNOTATION
    };
    check_unknown_fields_placed::<Start, Other>(&start, json, &added, carrying)
}

fn unknown_fields(sites: &[Site]) -> impl Strategy<Value = Vec<(String, Value)>> {
    proptest::collection::vec(json::unknown_field(), sites.len())
}

proptest! {
    #[test]
    fn v1alpha1_clusters_keep_unknown_fields(
        cluster in strategies::v1alpha1::cluster(),
        fields in unknown_fields(V1ALPHA1_CLUSTER_SITES),
    ) {
        check_with_unknown_fields::<v1alpha1::PostgreSQLCluster, v1beta1::PostgreSQLCluster>(
            cluster, V1ALPHA1_CLUSTER_SITES, fields)?;
    }

    #[test]
    fn v1beta1_clusters_keep_unknown_fields(
        cluster in strategies::v1beta1::cluster(),
        fields in unknown_fields(V1BETA1_CLUSTER_SITES),
    ) {
        check_with_unknown_fields::<v1beta1::PostgreSQLCluster, v1alpha1::PostgreSQLCluster>(
            cluster, V1BETA1_CLUSTER_SITES, fields)?;
    }

    #[test]
    fn v1alpha1_backups_keep_unknown_fields(
        backup in strategies::v1alpha1::backup(),
        fields in unknown_fields(V1ALPHA1_BACKUP_SITES),
    ) {
        check_with_unknown_fields::<v1alpha1::PostgreSQLBackup, v1beta1::PostgreSQLBackup>(
            backup, V1ALPHA1_BACKUP_SITES, fields)?;
    }

    #[test]
    fn v1beta1_backups_keep_unknown_fields(
        backup in strategies::v1beta1::backup(),
        fields in unknown_fields(V1BETA1_BACKUP_SITES),
    ) {
        check_with_unknown_fields::<v1beta1::PostgreSQLBackup, v1alpha1::PostgreSQLBackup>(
            backup, V1BETA1_BACKUP_SITES, fields)?;
    }

    #[test]
    fn v1alpha1_restores_keep_unknown_fields(
        restore in strategies::v1alpha1::restore(),
        fields in unknown_fields(V1ALPHA1_RESTORE_SITES),
    ) {
        check_with_unknown_fields::<v1alpha1::PostgreSQLRestore, v1beta1::PostgreSQLRestore>(
            restore, V1ALPHA1_RESTORE_SITES, fields)?;
    }

    #[test]
    fn v1beta1_restores_keep_unknown_fields(
        restore in strategies::v1beta1::restore(),
        fields in unknown_fields(V1BETA1_RESTORE_SITES),
    ) {
        check_with_unknown_fields::<v1beta1::PostgreSQLRestore, v1alpha1::PostgreSQLRestore>(
            restore, V1BETA1_RESTORE_SITES, fields)?;
    }
}

/// A field to add to the carried fields, so that they are not what conversion writes: into one
/// of the objects they hold (the `n`th, counting round), or (if `moved`) one of the fields moved
/// out of a v1beta1 object only v1beta1 has, into the rest of it.
type Tampering = Option<(usize, bool, String, Value)>;

/// The objects only v1beta1 has, and the fields moved out of them (restated from
/// `crds/CONVERSION.md`).
const V1BETA1_OBJECTS: &[(&str, &[&str])] = &[
    ("/spec/storage", &["size"]),
    ("/spec/backup/schedule", &["cron", "timeZone", "suspend"]),
    ("/spec/backup/retention", &["days"]),
    ("/spec/backup/storage", &["s3"]),
    ("/spec/bootstrap/source/storage", &["s3"]),
    ("/status/storage", &["s3"]),
    ("/spec/source/storage", &["s3"]),
];

/// Any JSON object of `kind` in `start` and in the other version, the first carrying (one time
/// in two) the annotation that converting the second to `start` wrote, if any, maybe tampered
/// with: fitting the first or not.
fn any_pair() -> impl Strategy<Value = (Value, Value, bool, Tampering)> {
    let versions = prop_oneof![
        Just((v1alpha1::API_VERSION, v1beta1::API_VERSION)),
        Just((v1beta1::API_VERSION, v1alpha1::API_VERSION)),
    ];
    (versions, json::kind()).prop_flat_map(|((start, other), (kind, shape))| {
        (
            json::object(start, kind, shape),
            json::object(other, kind, shape),
            any::<bool>(),
            proptest::option::weighted(
                0.4,
                (any::<usize>(), any::<bool>(), json::key(), json::any_json()),
            ),
        )
    })
}

/// Adds `tampering`'s field to the carried fields in `text`.
fn tamper(text: &str, tampering: Tampering) -> String {
    let Some((n, moved, key, value)) = tampering else {
        return text.to_owned();
    };
    let mut tree: Value = serde_json::from_str(text).expect("conversion writes JSON");
    let rests: Vec<(&str, &[&str])> = (V1BETA1_OBJECTS.iter().copied())
        .filter(|(pointer, _)| tree.pointer(pointer).is_some_and(Value::is_object))
        .collect();
    let (pointer, key) = match rests.get(n % rests.len().max(1)) {
        Some((pointer, keys)) if moved => ((*pointer).to_owned(), keys[n % keys.len()].to_owned()),
        _ => {
            let mut pointers = Vec::new();
            objects_in(&tree, String::new(), &mut pointers);
            (pointers[n % pointers.len()].clone(), key)
        }
    };
    if let Some(object) = tree.pointer_mut(&pointer).and_then(Value::as_object_mut) {
        object.insert(key, value);
    }
    tree.to_string()
}

/// The JSON pointers of every object in `value` (itself included).
fn objects_in(value: &Value, pointer: String, found: &mut Vec<String>) {
    if let Value::Object(fields) = value {
        for (key, field) in fields {
            let escaped = key.replace('~', "~0").replace('/', "~1");
            objects_in(field, format!("{pointer}/{escaped}"), found);
        }
        found.push(pointer);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_json_survives_both_round_trips((mut start, donor, borrow, tampering) in any_pair()) {
        let start_version = start["apiVersion"].as_str().unwrap_or_default().to_owned();
        let other_version = donor["apiVersion"].as_str().unwrap_or_default().to_owned();
        let key = if start_version == v1alpha1::API_VERSION {
            V1BETA1_FIELDS_ANNOTATION
        } else {
            V1ALPHA1_FIELDS_ANNOTATION
        };
        let donated = convert(donor, &start_version).map_err(fail)?;
        let carried = donated.pointer("/metadata/annotations").and_then(|a| a.get(key));
        if let Some(text) = carried.and_then(Value::as_str) && borrow {
            start["metadata"]["annotations"][key] = Value::from(tamper(text, tampering));
        }
        let there = convert(start.clone(), &other_version).map_err(fail)?;
        prop_assert_eq!(&there["apiVersion"], &Value::from(other_version));
        let back = convert(there, &start_version).map_err(fail)?;
        prop_assert_eq!(back, start);
    }
}
