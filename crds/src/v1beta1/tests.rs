//! v1beta1's schemas validate what v1alpha1's do, field for field, and merge with them into
//! one CRD per kind.

use kube::CustomResourceExt;
use kube::core::crd::merge_crds;
use serde_json::Value;

use crate::v1alpha1;
use crate::v1beta1;

/// The schema keywords that decide what the API server accepts at a field (descriptions left
/// out: a moved field may be described differently; and `nullable`, which follows whether the
/// field or the object around it is optional).
const VALIDATION_KEYWORDS: &[&str] = &[
    "type",
    "format",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "maxProperties",
    "enum",
    "default",
    "required",
    "properties",
    "items",
    "additionalProperties",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
];

/// The schema of the object at a dotted path (`spec.backup.schedule.cron`) in a CRD's only
/// version.
fn schema_at(crd: &Value, path: &str) -> Value {
    let mut node = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    for field in path.split('.') {
        node = &node["properties"][field];
    }
    assert!(!node.is_null(), "no schema at {path}");
    node.clone()
}

fn validation_of(schema: &Value) -> Vec<(&'static str, Value)> {
    VALIDATION_KEYWORDS
        .iter()
        .filter_map(|keyword| schema.get(*keyword).map(|v| (*keyword, v.clone())))
        .collect()
}

fn assert_same_validation(alpha: &Value, beta: &Value, pairs: &[(&str, &str)]) {
    for (alpha_path, beta_path) in pairs {
        assert_eq!(
            validation_of(&schema_at(alpha, alpha_path)),
            validation_of(&schema_at(beta, beta_path)),
            "v1alpha1 {alpha_path} and v1beta1 {beta_path} validate differently"
        );
    }
}

fn crd_json<K: CustomResourceExt>() -> Value {
    serde_json::to_value(K::crd()).expect("CRD as JSON")
}

#[test]
fn cluster_fields_validate_as_in_v1alpha1() {
    let alpha = crd_json::<v1alpha1::PostgreSQLCluster>();
    let beta = crd_json::<v1beta1::PostgreSQLCluster>();
    let spec_rules = |crd: &Value| schema_at(crd, "spec")["x-kubernetes-validations"].clone();
    assert_eq!(spec_rules(&alpha), spec_rules(&beta));
    assert_same_validation(
        &alpha,
        &beta,
        &[
            ("spec.replicas", "spec.replicas"),
            ("spec.version", "spec.postgresVersion"),
            ("spec.storage", "spec.storage.size"),
            ("spec.resources", "spec.resources"),
            ("spec.backup.schedule", "spec.backup.schedule.cron"),
            ("spec.backup.timeZone", "spec.backup.schedule.timeZone"),
            ("spec.backup.suspend", "spec.backup.schedule.suspend"),
            ("spec.backup.retentionDays", "spec.backup.retention.days"),
            ("spec.backup.s3", "spec.backup.storage.s3"),
            ("spec.nodeSelector", "spec.nodeSelector"),
            ("spec.tolerations", "spec.tolerations"),
            ("spec.affinity", "spec.affinity"),
            ("spec.postgresql", "spec.postgresql"),
            ("spec.bootstrap.backup", "spec.bootstrap.backup"),
            (
                "spec.bootstrap.source.s3",
                "spec.bootstrap.source.storage.s3",
            ),
            (
                "spec.bootstrap.source.objectKey",
                "spec.bootstrap.source.objectKey",
            ),
            ("status", "status"),
        ],
    );
    let bootstrap_rules =
        |crd: &Value| schema_at(crd, "spec.bootstrap")["x-kubernetes-validations"].clone();
    assert_eq!(bootstrap_rules(&alpha), bootstrap_rules(&beta));
}

#[test]
fn the_storage_class_is_immutable() {
    let beta = crd_json::<v1beta1::PostgreSQLCluster>();
    let rules = schema_at(&beta, "spec.storage")["x-kubernetes-validations"].clone();
    let rule = rules[0]["rule"].as_str().expect("a rule on spec.storage");
    assert!(rule.contains("self.storageClassName == oldSelf.storageClassName"));
    assert_eq!(
        schema_at(&beta, "spec.storage")["required"],
        serde_json::json!(["size"])
    );
}

#[test]
fn backup_fields_validate_as_in_v1alpha1() {
    let alpha = crd_json::<v1alpha1::PostgreSQLBackup>();
    let beta = crd_json::<v1beta1::PostgreSQLBackup>();
    let mut pairs = vec![("spec", "spec"), ("status.storage", "status.storage.s3")];
    let status_fields = schema_at(&alpha, "status")["properties"].clone();
    let same_status_fields: Vec<String> = status_fields
        .as_object()
        .expect("status properties")
        .keys()
        .filter(|field| *field != "storage")
        .map(|field| format!("status.{field}"))
        .collect();
    pairs.extend(same_status_fields.iter().map(|p| (p.as_str(), p.as_str())));
    assert_same_validation(&alpha, &beta, &pairs);
}

#[test]
fn restore_fields_validate_as_in_v1alpha1() {
    let alpha = crd_json::<v1alpha1::PostgreSQLRestore>();
    let beta = crd_json::<v1beta1::PostgreSQLRestore>();
    let spec_rules = |crd: &Value| schema_at(crd, "spec")["x-kubernetes-validations"].clone();
    assert_eq!(spec_rules(&alpha), spec_rules(&beta));
    assert_same_validation(
        &alpha,
        &beta,
        &[
            ("spec.backup", "spec.backup"),
            ("spec.source.s3", "spec.source.storage.s3"),
            ("spec.source.objectKey", "spec.source.objectKey"),
            ("spec.cluster", "spec.cluster"),
            ("spec.databases", "spec.databases"),
            ("spec.dropExisting", "spec.dropExisting"),
            ("status", "status"),
        ],
    );
}

/// Each kind's two versions can be one CRD (same names, scope and print columns' kinds), with
/// v1alpha1 the storage version, as they will be once the webhook serves.
#[test]
fn each_kind_merges_with_its_v1alpha1_crd() {
    for (alpha, beta) in crate::crds().into_iter().zip(v1beta1::crds()) {
        let name = alpha.metadata.name.clone();
        let merged = merge_crds(vec![alpha, beta], "v1alpha1").expect("mergeable CRDs");
        let versions: Vec<(String, bool)> = merged
            .spec
            .versions
            .iter()
            .map(|v| (v.name.clone(), v.storage))
            .collect();
        assert_eq!(
            versions,
            [("v1alpha1".to_owned(), true), ("v1beta1".to_owned(), false)],
            "{name:?}"
        );
    }
}

/// pgkube still installs v1alpha1 only: serving v1beta1 needs the conversion webhook.
#[test]
fn the_installed_crds_serve_v1alpha1_only() {
    for crd in crate::crds() {
        let versions: Vec<&str> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(versions, ["v1alpha1"]);
    }
}
