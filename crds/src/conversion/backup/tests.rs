//! A hand-written backup in both versions: only the status's storage moves.

use serde_json::{Value, json};

use crate::conversion::{V1BETA1_FIELDS_ANNOTATION, convert};
use crate::{v1alpha1, v1beta1};

fn yaml(text: &str) -> Value {
    serde_yaml::from_str(text).expect("valid YAML")
}

const S3: &str = r#"{bucket: pg-backups, prefix: shop/my-cluster, region: us-east-1, forcePathStyle: false, serverSideEncryption: "aws:kms", credentials: {accessKeyId: {name: s3, key: id}, secretAccessKey: {name: s3, key: secret}}}"#;

fn example(api_version: &str, storage: &str) -> Value {
    yaml(&format!(
        r#"
apiVersion: {api_version}
kind: PostgreSQLBackup
metadata:
  name: my-cluster-202601030200
  namespace: shop
  labels: {{db.example.com/cluster: my-cluster, db.example.com/scheduled: "true"}}
  annotations: {{db.example.com/scheduled-time: "2026-01-03T02:00:00Z"}}
  ownerReferences:
  - {{apiVersion: db.example.com/v1alpha1, kind: PostgreSQLCluster, name: my-cluster, uid: 0b7c6e4e-5f55-4a3c-9f0e-1d2c3b4a5f60, controller: true}}
  finalizers: [db.example.com/backup-data]
spec:
  cluster: {{name: my-cluster}}
  method: Logical
  deletionPolicy: Delete
status:
  phase: Completed
  startTime: "2026-01-03T02:00:01Z"
  completionTime: "2026-01-03T02:01:30Z"
  storage: {storage}
  objectKey: shop/my-cluster/my-cluster-202601030200/manifest.json
  sizeBytes: 123456
  checksum: "sha256:00ff"
  postgresVersion: "16.4"
  jobName: my-cluster-202601030200-backup
  conditions:
  - {{type: Completed, status: "True", reason: Verified, message: verified in storage, lastTransitionTime: "2026-01-03T02:01:30Z", observedGeneration: 1}}
"#
    ))
}

fn v1alpha1_example() -> Value {
    example(v1alpha1::API_VERSION, S3)
}

fn v1beta1_example() -> Value {
    example(v1beta1::API_VERSION, &format!("{{s3: {S3}}}"))
}

#[test]
fn the_status_storage_gains_its_s3_level() {
    let up = convert(v1alpha1_example(), v1beta1::API_VERSION).expect("converts up");
    assert_eq!(up, v1beta1_example());
    let down = convert(v1beta1_example(), v1alpha1::API_VERSION).expect("converts down");
    assert_eq!(down, v1alpha1_example());
}

/// A newer pgkube's field beside `s3` (another kind of store) has no place in v1alpha1: it is
/// carried in the annotation, also when the status has no `s3`.
#[test]
fn what_is_beside_the_s3_storage_travels_in_the_annotation() {
    let mut beta = v1beta1_example();
    beta["status"]["storage"]["gcs"] = json!({"bucket": "elsewhere"});
    let down = convert(beta.clone(), v1alpha1::API_VERSION).expect("converts down");
    assert_eq!(
        down["status"]["storage"],
        v1alpha1_example()["status"]["storage"]
    );
    assert_eq!(
        down["metadata"]["annotations"][V1BETA1_FIELDS_ANNOTATION],
        json!(r#"{"status":{"storage":{"gcs":{"bucket":"elsewhere"}}}}"#)
    );
    assert_eq!(
        convert(down, v1beta1::API_VERSION).expect("converts up"),
        beta
    );

    beta["status"]["storage"] = json!({"gcs": {"bucket": "elsewhere"}});
    let down = convert(beta.clone(), v1alpha1::API_VERSION).expect("converts down");
    assert_eq!(down["status"].get("storage"), None);
    assert_eq!(
        convert(down, v1beta1::API_VERSION).expect("converts up"),
        beta
    );
}

#[test]
fn a_backup_without_status_converts() {
    let mut alpha = v1alpha1_example();
    alpha.as_object_mut().expect("an object").remove("status");
    let up = convert(alpha.clone(), v1beta1::API_VERSION).expect("converts up");
    assert_eq!(up.get("status"), None);
    assert_eq!(convert(up, v1alpha1::API_VERSION).expect("down"), alpha);
}
