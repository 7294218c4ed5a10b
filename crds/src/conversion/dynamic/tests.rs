//! The webhook's entry point: what it refuses and why, and what it leaves alone.

use serde_json::{Value, json};

use super::{ConversionError, convert};
use crate::{v1alpha1, v1beta1};

fn backup(api_version: &str) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": "PostgreSQLBackup",
        "metadata": {"name": "b1", "namespace": "shop"},
        "spec": {"cluster": {"name": "c1"}, "method": "Logical", "deletionPolicy": "Retain"},
    })
}

fn error_of(object: Value, desired: &str) -> String {
    convert(object, desired).expect_err("refused").to_string()
}

#[test]
fn the_same_version_comes_back_unchanged() {
    let odd = json!({
        "apiVersion": v1beta1::API_VERSION,
        "kind": "PostgreSQLCluster",
        "metadata": {"name": "x"},
        "spec": {"not": "even valid"},
    });
    assert_eq!(
        convert(odd.clone(), v1beta1::API_VERSION).expect("unchanged"),
        odd
    );
}

#[test]
fn unknown_api_versions_are_refused_by_name() {
    assert_eq!(
        error_of(backup(v1alpha1::API_VERSION), "db.example.com/v2"),
        "unknown apiVersion \"db.example.com/v2\": pgkube converts between db.example.com/v1alpha1 and db.example.com/v1beta1"
    );
    let message = error_of(backup("apps/v1"), v1beta1::API_VERSION);
    assert!(
        message.starts_with("unknown apiVersion \"apps/v1\""),
        "{message}"
    );
}

#[test]
fn unknown_kinds_are_refused_by_name() {
    let mut object = backup(v1alpha1::API_VERSION);
    object["kind"] = json!("Deployment");
    assert_eq!(
        error_of(object.clone(), v1beta1::API_VERSION),
        "unknown kind \"Deployment\": pgkube converts PostgreSQLCluster, PostgreSQLBackup and PostgreSQLRestore"
    );
    assert!(matches!(
        convert(object, v1alpha1::API_VERSION),
        Err(ConversionError::UnknownKind(_))
    ));
}

#[test]
fn missing_api_version_or_kind_is_refused() {
    let mut object = backup(v1alpha1::API_VERSION);
    object.as_object_mut().expect("object").remove("kind");
    assert_eq!(
        error_of(object, v1beta1::API_VERSION),
        "the object has no kind string"
    );
    assert_eq!(
        error_of(json!(["not", "an object"]), v1beta1::API_VERSION),
        "the object has no apiVersion string"
    );
}

/// The JSON is converted as it is: values the Rust types would refuse (an enum member a newer
/// pgkube adds, a number where they expect a string) pass through.
#[test]
fn values_the_types_do_not_know_pass_through() {
    let mut object = backup(v1alpha1::API_VERSION);
    object["spec"]["deletionPolicy"] = json!("Shred");
    object["spec"]["cluster"] = json!({"name": 7, "namespace": "elsewhere"});
    let up = convert(object.clone(), v1beta1::API_VERSION).expect("converts");
    assert_eq!(up["spec"], object["spec"]);
    assert_eq!(
        convert(up, v1alpha1::API_VERSION).expect("converts back"),
        object
    );
}

/// Only metadata that cannot hold the annotation refuses a conversion, and only when there is
/// something to carry; the message is one line and names the place.
#[test]
fn metadata_that_cannot_carry_fields_is_refused_when_there_are_some() {
    let mut object = backup(v1beta1::API_VERSION);
    object["metadata"]["annotations"] = json!("not a map");
    assert!(convert(object.clone(), v1alpha1::API_VERSION).is_ok());
    object["status"] = json!({"storage": {"s3": {"bucket": "b"}, "gcs": {"bucket": "g"}}});
    let message = error_of(object, v1alpha1::API_VERSION);
    assert_eq!(
        message,
        "PostgreSQLBackup of db.example.com/v1beta1: metadata.annotations is not an object, so the converted fields have no place"
    );
}

/// Metadata comes back byte for byte, fields the typed objects do not model included.
#[test]
fn metadata_is_kept_exactly() {
    let mut object = backup(v1beta1::API_VERSION);
    object["metadata"] = json!({
        "name": "b1",
        "namespace": "shop",
        "creationTimestamp": "2026-01-02T03:04:05.123456Z",
        "managedFields": [{"manager": "kubectl", "operation": "Apply", "time": "2026-01-02T03:04:05Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}],
        "annotations": {"a": "1"},
    });
    let down = convert(object.clone(), v1alpha1::API_VERSION).expect("converts");
    assert_eq!(down["metadata"], object["metadata"]);
}
