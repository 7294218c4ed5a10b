//! A hand-written cluster in both versions: how each field maps, and where the storage class goes.

use serde_json::{Value, json};

use crate::conversion::{V1BETA1_FIELDS_ANNOTATION, convert};
use crate::{v1alpha1, v1beta1};

fn yaml(text: &str) -> Value {
    serde_yaml::from_str(text).expect("valid YAML")
}

const METADATA: &str = r#"
metadata:
  name: my-cluster
  namespace: shop
  uid: 0b7c6e4e-5f55-4a3c-9f0e-1d2c3b4a5f60
  resourceVersion: "4711"
  generation: 3
  creationTimestamp: "2026-01-02T03:04:05Z"
  labels: {team: payments}
  annotations: {example.com/owner: alice}
  finalizers: [db.example.com/cleanup]
"#;

const S3: &str = r#"{bucket: pg-backups, prefix: shop/my-cluster, endpoint: "https://minio.storage.svc:9000", region: eu-west-1, forcePathStyle: true, credentials: {accessKeyId: {name: s3, key: id}, secretAccessKey: {name: s3, key: secret}}}"#;

const STATUS: &str = r#"
status:
  phase: Running
  readyReplicas: 3
  currentVersion: "16"
  currentPrimary: my-cluster-postgresql-0
  instances:
  - {name: my-cluster-postgresql-0, role: primary, ready: true, timeline: 1}
  observedGeneration: 3
  conditions:
  - {type: Ready, status: "True", reason: AllReplicasReady, message: all 3 ready, lastTransitionTime: "2026-01-02T03:10:00Z"}
  lastScheduledBackup: "2026-01-03T02:00:00Z"
"#;

fn v1alpha1_example() -> Value {
    yaml(&format!(
        r#"
apiVersion: db.example.com/v1alpha1
kind: PostgreSQLCluster
{METADATA}
spec:
  replicas: 3
  version: "16"
  storage: 100Gi
  resources: {{requests: {{cpu: "1", memory: 2Gi}}, limits: {{memory: 2Gi}}}}
  backup:
    schedule: "0 3 * * *"
    timeZone: Europe/Paris
    retentionDays: 14
    suspend: true
    s3: {S3}
  nodeSelector: {{disktype: ssd}}
  tolerations: [{{key: dedicated, operator: Equal, value: db, effect: NoSchedule}}]
  postgresql: {{parameters: {{work_mem: 16MB}}}}
  bootstrap:
    source: {{s3: {S3}, objectKey: shop/old/old-1/manifest.json}}
{STATUS}"#
    ))
}

fn v1beta1_example() -> Value {
    yaml(&format!(
        r#"
apiVersion: db.example.com/v1beta1
kind: PostgreSQLCluster
{METADATA}
spec:
  replicas: 3
  postgresVersion: "16"
  storage: {{size: 100Gi}}
  resources: {{requests: {{cpu: "1", memory: 2Gi}}, limits: {{memory: 2Gi}}}}
  backup:
    schedule: {{cron: "0 3 * * *", timeZone: Europe/Paris, suspend: true}}
    retention: {{days: 14}}
    storage: {{s3: {S3}}}
  nodeSelector: {{disktype: ssd}}
  tolerations: [{{key: dedicated, operator: Equal, value: db, effect: NoSchedule}}]
  postgresql: {{parameters: {{work_mem: 16MB}}}}
  bootstrap:
    source: {{storage: {{s3: {S3}}}, objectKey: shop/old/old-1/manifest.json}}
{STATUS}"#
    ))
}

#[test]
fn each_field_maps_to_its_place_in_the_other_version() {
    let up = convert(v1alpha1_example(), v1beta1::API_VERSION).expect("converts up");
    assert_eq!(up, v1beta1_example());
    let down = convert(v1beta1_example(), v1alpha1::API_VERSION).expect("converts down");
    assert_eq!(down, v1alpha1_example());
}

/// The storage class, which v1alpha1 lacks, travels in the annotation beside the user's own.
#[test]
fn the_storage_class_travels_in_an_annotation() {
    let mut beta = v1beta1_example();
    beta["spec"]["storage"]["storageClassName"] = json!("fast-ssd");

    let down = convert(beta.clone(), v1alpha1::API_VERSION).expect("converts down");
    assert_eq!(
        down["metadata"]["annotations"],
        json!({
            "example.com/owner": "alice",
            V1BETA1_FIELDS_ANNOTATION: r#"{"spec":{"storage":{"storageClassName":"fast-ssd"}}}"#,
        })
    );
    assert_eq!(down["spec"]["storage"], json!("100Gi"));

    let back = convert(down, v1beta1::API_VERSION).expect("converts up");
    assert_eq!(back, beta);
}

/// Without a storage class, no annotation is added: a v1alpha1 object stays as the user wrote it.
#[test]
fn nothing_to_carry_adds_no_annotation() {
    let down = convert(v1beta1_example(), v1alpha1::API_VERSION).expect("converts down");
    assert_eq!(
        down["metadata"]["annotations"],
        json!({"example.com/owner": "alice"})
    );
}

/// A value of the annotation that conversion did not write is kept, both ways, and sets nothing.
#[test]
fn a_foreign_annotation_value_is_kept_and_sets_nothing() {
    for value in [
        "{not json",
        r#"{"spec": {"storage": {"storageClassName": "spaced"}}}"#,
        r#"{"spec":{"storage":{"storageClassName":"fast","size":"1Gi"}}}"#,
        r#"{"spec":{"storage":{}}}"#,
        r#"{"spec":{"storage":{"storageClassName":"fast"}},"status":{}}"#,
    ] {
        let mut alpha = v1alpha1_example();
        alpha["metadata"]["annotations"][V1BETA1_FIELDS_ANNOTATION] = json!(value);
        let up = convert(alpha.clone(), v1beta1::API_VERSION).expect("converts up");
        assert_eq!(
            up["metadata"]["annotations"][V1BETA1_FIELDS_ANNOTATION],
            json!(value)
        );
        assert_eq!(up["spec"]["storage"], json!({"size": "100Gi"}), "{value}");
        assert_eq!(convert(up, v1alpha1::API_VERSION).expect("down"), alpha);
    }
}

/// No default is added: the API server applies each version's defaults itself, and a field
/// left out stays out.
#[test]
fn no_default_is_added() {
    let minimal = json!({
        "apiVersion": v1alpha1::API_VERSION,
        "kind": "PostgreSQLCluster",
        "metadata": {"name": "small"},
        "spec": {"storage": "1Gi", "backup": {"schedule": "@daily"}},
    });
    let up = convert(minimal.clone(), v1beta1::API_VERSION).expect("converts up");
    assert_eq!(
        up["spec"],
        json!({"storage": {"size": "1Gi"}, "backup": {"schedule": {"cron": "@daily"}}})
    );
    assert_eq!(
        convert(up, v1alpha1::API_VERSION).expect("converts down"),
        minimal
    );
}

/// Fields neither version's types know, as a newer pgkube writes them: at the same place in both
/// versions they stay there, at every depth (inside moved fields too); in the objects only
/// v1beta1 has, they are carried on v1alpha1 in the annotation, beside the storage class.
#[test]
fn fields_a_newer_pgkube_writes_survive_both_ways() {
    let mut beta = v1beta1_example();
    beta["spec"]["maintenanceWindow"] = json!({"day": "Sunday"});
    beta["spec"]["backup"]["verify"] = json!(true);
    beta["spec"]["backup"]["storage"]["s3"]["checksumAlgorithm"] = json!("CRC32C");
    beta["spec"]["storage"]["storageClassName"] = json!("fast-ssd");
    beta["spec"]["storage"]["iops"] = json!(3000);
    beta["spec"]["backup"]["schedule"]["startingDeadlineSeconds"] = json!(60);
    beta["spec"]["backup"]["retention"]["keepLast"] = json!(3);
    beta["spec"]["backup"]["storage"]["gcs"] = json!({"bucket": "other"});
    beta["status"]["lastVerifiedBackup"] = json!("b-1");
    beta["status"]["conditions"][0]["severity"] = json!("Info");
    beta["status"]["instances"][0]["zone"] = json!("a");

    let down = convert(beta.clone(), v1alpha1::API_VERSION).expect("converts down");
    let mut expected = v1alpha1_example();
    expected["spec"]["maintenanceWindow"] = json!({"day": "Sunday"});
    expected["spec"]["backup"]["verify"] = json!(true);
    expected["spec"]["backup"]["s3"]["checksumAlgorithm"] = json!("CRC32C");
    expected["status"] = beta["status"].clone();
    expected["metadata"]["annotations"][V1BETA1_FIELDS_ANNOTATION] = json!(concat!(
        r#"{"spec":{"backup":{"retention":{"keepLast":3},"schedule":{"startingDeadlineSeconds":60},"#,
        r#""storage":{"gcs":{"bucket":"other"}}},"storage":{"iops":3000,"storageClassName":"fast-ssd"}}}"#
    ));
    assert_eq!(down, expected);
    assert_eq!(
        convert(down, v1beta1::API_VERSION).expect("converts up"),
        beta
    );
}

/// Through v1alpha1, a v1alpha1 client's change to a moved field is kept, and the carried fields
/// come back beside it.
#[test]
fn a_change_made_in_v1alpha1_keeps_the_carried_fields() {
    let mut beta = v1beta1_example();
    beta["spec"]["storage"]["iops"] = json!(3000);
    let mut down = convert(beta.clone(), v1alpha1::API_VERSION).expect("converts down");
    down["spec"]["storage"] = json!("200Gi");
    let up = convert(down, v1beta1::API_VERSION).expect("converts up");
    assert_eq!(
        up["spec"]["storage"],
        json!({"size": "200Gi", "iops": 3000})
    );
    assert_eq!(
        up["metadata"]["annotations"],
        json!({"example.com/owner": "alice"})
    );
}
