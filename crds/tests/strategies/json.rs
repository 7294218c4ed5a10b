//! Generators of raw JSON objects, for the properties that must hold whatever an object holds:
//! objects shaped around the fields conversion moves (both versions' names mixed, at their
//! places and elsewhere, with values of any type), and fields unknown to both versions.

use std::collections::BTreeMap;

use pgkube_crds::conversion::{V1ALPHA1_FIELDS_ANNOTATION, V1BETA1_FIELDS_ANNOTATION};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{Map, Value, json};

/// Where the fields of a kind are, in either version: conversion's moves start and end here.
#[derive(Debug)]
pub enum Shape {
    /// A field holding any value.
    Field,
    /// An object with these fields.
    Object(&'static [(&'static str, Shape)]),
}

use Shape::{Field, Object};

const S3: Shape = Object(&[("bucket", Field), ("region", Field)]);
const STORAGE: Shape = Object(&[("s3", S3)]);

/// Both versions' fields of a cluster around those that move.
pub const CLUSTER: Shape = Object(&[
    (
        "spec",
        Object(&[
            ("replicas", Field),
            ("version", Field),
            ("postgresVersion", Field),
            (
                "storage",
                Object(&[("size", Field), ("storageClassName", Field)]),
            ),
            (
                "backup",
                Object(&[
                    (
                        "schedule",
                        Object(&[("cron", Field), ("timeZone", Field), ("suspend", Field)]),
                    ),
                    ("timeZone", Field),
                    ("suspend", Field),
                    ("retentionDays", Field),
                    ("retention", Object(&[("days", Field)])),
                    ("s3", S3),
                    ("storage", STORAGE),
                    ("compression", Field),
                    ("method", Field),
                ]),
            ),
            (
                "bootstrap",
                Object(&[(
                    "source",
                    Object(&[("s3", S3), ("storage", STORAGE), ("objectKey", Field)]),
                )]),
            ),
        ]),
    ),
    ("status", Object(&[("phase", Field), ("conditions", Field)])),
]);

/// Both versions' fields of a backup around those that move.
pub const BACKUP: Shape = Object(&[
    (
        "spec",
        Object(&[("cluster", Field), ("method", Field), ("target", Field)]),
    ),
    (
        "status",
        Object(&[("storage", Object(&[("s3", S3), ("bucket", Field)]))]),
    ),
]);

/// Both versions' fields of a restore around those that move.
pub const RESTORE: Shape = Object(&[
    (
        "spec",
        Object(&[
            (
                "source",
                Object(&[("s3", S3), ("storage", STORAGE), ("objectKey", Field)]),
            ),
            ("cluster", Field),
        ]),
    ),
    ("status", Object(&[("phase", Field)])),
]);

/// A key: one of the fields' names (so that they also turn up in the wrong places), or any.
pub fn key() -> impl Strategy<Value = String> {
    let names = vec![
        "version",
        "postgresVersion",
        "storage",
        "size",
        "storageClassName",
        "schedule",
        "cron",
        "retention",
        "retentionDays",
        "days",
        "s3",
        "gcs",
        "source",
        "bucket",
    ];
    prop_oneof![
        select(names).prop_map(String::from),
        "[a-z]{1,6}".prop_map(String::from),
    ]
}

/// Any JSON value, a few levels deep.
pub fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        ".{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            btree_map(key(), inner, 0..4)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

/// A value following `shape`: each field absent, of any value, or (for an object) following its
/// own shape, with other fields beside.
pub fn shaped(shape: &'static Shape) -> BoxedStrategy<Value> {
    let Object(fields) = shape else {
        return any_json().boxed();
    };
    let members: Vec<BoxedStrategy<Option<(String, Value)>>> = fields
        .iter()
        .map(|(name, field)| {
            let name = (*name).to_owned();
            let value = match field {
                Field => prop_oneof![2 => Just(None), 3 => any_json().prop_map(Some)].boxed(),
                Object(_) => prop_oneof![
                    3 => Just(None),
                    1 => any_json().prop_map(Some),
                    4 => shaped(field).prop_map(Some),
                ]
                .boxed(),
            };
            value
                .prop_map(move |value| value.map(|value| (name.clone(), value)))
                .boxed()
        })
        .collect();
    (members, btree_map(key(), any_json(), 0..3))
        .prop_map(|(members, others)| {
            let mut object: Map<String, Value> = others.into_iter().collect();
            object.extend(members.into_iter().flatten());
            Value::Object(object)
        })
        .boxed()
}

/// A kind's name, its shape.
pub fn kind() -> impl Strategy<Value = (&'static str, &'static Shape)> {
    select(vec![
        ("PostgreSQLCluster", &CLUSTER),
        ("PostgreSQLBackup", &BACKUP),
        ("PostgreSQLRestore", &RESTORE),
    ])
}

/// Annotations a user or tool sets, `conversion.db.example.com/` ones included, except the one
/// the conversion of an object of `api_version` writes (which it owns): `None` or a map with at
/// least one.
fn annotations(api_version: &'static str) -> impl Strategy<Value = Option<Value>> {
    let owned = if api_version.ends_with("v1alpha1") {
        V1ALPHA1_FIELDS_ANNOTATION
    } else {
        V1BETA1_FIELDS_ANNOTATION
    };
    let keys = vec![
        "example.org/team",
        "kubectl.kubernetes.io/last-applied-configuration",
        V1ALPHA1_FIELDS_ANNOTATION,
        V1BETA1_FIELDS_ANNOTATION,
        "conversion.db.example.com/v1beta2",
    ];
    let values = prop_oneof![
        ".{0,12}".prop_map(String::from),
        any_json().prop_map(|value| value.to_string()),
    ];
    btree_map(select(keys), values, 0..3).prop_map(move |mut map: BTreeMap<&str, String>| {
        map.remove(owned);
        (!map.is_empty()).then(|| json!(map))
    })
}

/// An object of `kind` in `api_version` whose spec and status follow `shape`, with other fields
/// beside them at the top and in its metadata.
pub fn object(
    api_version: &'static str,
    kind: &'static str,
    shape: &'static Shape,
) -> impl Strategy<Value = Value> {
    (shaped(shape), annotations(api_version), any_json()).prop_map(
        move |(body, annotations, other)| {
            let mut object = match body {
                Value::Object(fields) => fields,
                _ => Map::new(),
            };
            let mut metadata = json!({"name": "n", "uid": "u", "labels": {"a": "b"}});
            if let Some(annotations) = annotations {
                metadata["annotations"] = annotations;
            }
            object.insert("metadata".into(), metadata);
            object.insert("apiVersion".into(), json!(api_version));
            object.insert("kind".into(), json!(kind));
            object.insert("futureTopLevel".into(), other);
            Value::Object(object)
        },
    )
}

/// A field no version knows, as a newer pgkube adds it: its name and value.
pub fn unknown_field() -> impl Strategy<Value = (String, Value)> {
    ("future[A-Z][a-z]{0,6}", any_json())
}
