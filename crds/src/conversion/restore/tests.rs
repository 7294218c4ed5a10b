//! A hand-written restore in both versions: only a source's storage moves.

use serde_json::{Value, json};

use crate::conversion::{V1ALPHA1_FIELDS_ANNOTATION, convert};
use crate::{v1alpha1, v1beta1};

fn yaml(text: &str) -> Value {
    serde_yaml::from_str(text).expect("valid YAML")
}

const S3: &str = r#"{bucket: pg-backups, endpoint: "http://garage.local:3900", region: garage, forcePathStyle: true, caBundle: {name: ca, key: ca.crt}, credentials: {accessKeyId: {name: s3, key: id}, secretAccessKey: {name: s3, key: secret, optional: false}}}"#;

fn example(api_version: &str, source: &str) -> Value {
    yaml(&format!(
        r#"
apiVersion: {api_version}
kind: PostgreSQLRestore
metadata:
  name: from-elsewhere
  namespace: shop
  uid: 4a2f0d0e-0000-4000-8000-000000000001
  resourceVersion: "99"
spec:
  source: {source}
  cluster: {{name: my-cluster}}
  databases: [shop, audit]
  dropExisting: true
status:
  phase: Failed
  startTime: "2026-01-04T10:00:00Z"
  completionTime: "2026-01-04T10:00:05Z"
  restoredObjectKey: old/a/manifest.json
  jobName: from-elsewhere-restore
  message: "database shop exists (set dropExisting to replace it)"
  conditions:
  - {{type: Completed, status: "False", reason: JobFailed, message: "database shop exists", lastTransitionTime: "2026-01-04T10:00:05Z"}}
"#
    ))
}

fn v1alpha1_example() -> Value {
    example(
        v1alpha1::API_VERSION,
        &format!("{{s3: {S3}, objectKey: old/a/manifest.json}}"),
    )
}

fn v1beta1_example() -> Value {
    example(
        v1beta1::API_VERSION,
        &format!("{{storage: {{s3: {S3}}}, objectKey: old/a/manifest.json}}"),
    )
}

#[test]
fn the_source_storage_gains_its_s3_level() {
    let up = convert(v1alpha1_example(), v1beta1::API_VERSION).expect("converts up");
    assert_eq!(up, v1beta1_example());
    let down = convert(v1beta1_example(), v1alpha1::API_VERSION).expect("converts down");
    assert_eq!(down, v1alpha1_example());
}

/// A v1alpha1 restore with a field v1alpha1 does not know but v1beta1 reads (`source.storage`):
/// carried in v1alpha1's annotation on the v1beta1 object, not read as v1beta1's storage.
#[test]
fn a_v1alpha1_value_at_a_v1beta1_place_is_carried_not_read() {
    let mut alpha = v1alpha1_example();
    alpha["spec"]["source"]["storage"] = json!("a newer v1alpha1's");
    let up = convert(alpha.clone(), v1beta1::API_VERSION).expect("converts up");
    assert_eq!(up["spec"]["source"], v1beta1_example()["spec"]["source"]);
    assert_eq!(
        up["metadata"]["annotations"][V1ALPHA1_FIELDS_ANNOTATION],
        json!(r#"{"spec":{"source":{"storage":"a newer v1alpha1's"}}}"#)
    );
    assert_eq!(
        convert(up, v1alpha1::API_VERSION).expect("converts down"),
        alpha
    );
}

#[test]
fn a_restore_of_a_backup_object_is_the_same_in_both_versions_but_for_the_api_version() {
    let mut alpha = v1alpha1_example();
    alpha["spec"] =
        json!({"backup": {"name": "b1"}, "cluster": {"name": "c"}, "dropExisting": false});
    let mut up = convert(alpha.clone(), v1beta1::API_VERSION).expect("converts up");
    assert_eq!(up["apiVersion"], v1beta1::API_VERSION);
    up["apiVersion"] = alpha["apiVersion"].clone();
    assert_eq!(up, alpha);
}
