//! Conversion is lossless, on generated objects of every kind: v1alpha1 -> v1beta1 -> v1alpha1
//! and v1beta1 -> v1alpha1 -> v1beta1 are the identity, typed and through the webhook's JSON
//! entry point; one conversion changes no metadata but conversion's own annotation; an object
//! asked for in its own version comes back unchanged.

mod strategies;

use std::fmt::Debug;

use kube::Resource;
use kube::core::ObjectMeta;
use pgkube_crds::conversion::{V1BETA1_FIELDS_ANNOTATION, convert};
use pgkube_crds::{v1alpha1, v1beta1};
use proptest::prelude::*;
use serde::Serialize;
use serde_json::Value;

/// What a round trip from `Start` through `Other` must keep: everything.
fn check_round_trip<Start, Other>(start: Start) -> Result<(), TestCaseError>
where
    Start: Resource<DynamicType = ()> + Serialize + Clone + PartialEq + Debug + From<Other>,
    Other: Resource<DynamicType = ()> + Serialize + From<Start>,
{
    check_typed_round_trip::<Start, Other>(start.clone())?;
    check_json_round_trip::<Start, Other>(&start)?;
    check_metadata_kept::<Start, Other>(start)
}

fn check_typed_round_trip<Start, Other>(start: Start) -> Result<(), TestCaseError>
where
    Start: Clone + PartialEq + Debug + From<Other>,
    Other: From<Start>,
{
    let back = Start::from(Other::from(start.clone()));
    prop_assert_eq!(back, start);
    Ok(())
}

/// Through [`convert`]: the same objects as the typed conversion, back to the very JSON, and
/// unchanged when asked for in their own version.
fn check_json_round_trip<Start, Other>(start: &Start) -> Result<(), TestCaseError>
where
    Start: Resource<DynamicType = ()> + Serialize + Clone,
    Other: Resource<DynamicType = ()> + Serialize + From<Start>,
{
    let json = to_json(start);
    let start_version = Start::api_version(&());
    let other_version = Other::api_version(&());
    let there = convert(json.clone(), &other_version).map_err(fail)?;
    prop_assert_eq!(&there, &to_json(&Other::from(start.clone())));
    let back = convert(there, &start_version).map_err(fail)?;
    prop_assert_eq!(&back, &json);
    let same = convert(json.clone(), &start_version).map_err(fail)?;
    prop_assert_eq!(same, json);
    Ok(())
}

/// One conversion keeps the metadata, but for conversion's annotation.
fn check_metadata_kept<Start, Other>(start: Start) -> Result<(), TestCaseError>
where
    Start: Resource<DynamicType = ()>,
    Other: Resource<DynamicType = ()> + From<Start>,
{
    let before = without_carried_fields(start.meta());
    let other = Other::from(start);
    prop_assert_eq!(without_carried_fields(other.meta()), before);
    Ok(())
}

fn without_carried_fields(metadata: &ObjectMeta) -> ObjectMeta {
    let mut metadata = metadata.clone();
    if let Some(annotations) = metadata.annotations.as_mut() {
        annotations.remove(V1BETA1_FIELDS_ANNOTATION);
        if annotations.is_empty() {
            metadata.annotations = None;
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
        let alpha = v1alpha1::PostgreSQLCluster::from(cluster);
        let carried = alpha
            .metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(V1BETA1_FIELDS_ANNOTATION));
        let expected = class.map(|class| {
            serde_json::json!({"spec": {"storage": {"storageClassName": class}}}).to_string()
        });
        prop_assert_eq!(carried, expected.as_ref());
    }
}
