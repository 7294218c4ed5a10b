//! v1beta1's schemas validate what v1alpha1's do, field for field, and merge with them into
//! one CRD per kind.

use kube::CustomResourceExt;
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
            ("spec.backup.compression", "spec.backup.compression"),
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
            (
                "spec.expectedSystemIdentifier",
                "spec.expectedSystemIdentifier",
            ),
            ("status", "status"),
        ],
    );
}

/// `pgkube crd` gives one CRD per kind serving both versions, v1beta1 stored, converting
/// through the `pgkube-webhook` Service on /convert with ConversionReview v1.
#[test]
fn the_installed_crds_serve_both_versions_through_the_webhook_service() {
    for crd in crate::crds() {
        let name = crd.metadata.name.clone();
        let versions: Vec<(&str, bool, bool)> = crd
            .spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.served, v.storage))
            .collect();
        assert_eq!(
            versions,
            [("v1beta1", true, true), ("v1alpha1", true, false)],
            "{name:?}"
        );
        let conversion = crd.spec.conversion.expect("a conversion stanza");
        assert_eq!(conversion.strategy, "Webhook");
        let webhook = conversion.webhook.expect("a webhook");
        assert_eq!(webhook.conversion_review_versions, ["v1"]);
        let config = webhook.client_config.expect("a client config");
        let service = config.service.expect("a Service");
        assert_eq!(
            (service.namespace.as_str(), service.name.as_str()),
            ("pgkube-system", "pgkube-webhook")
        );
        assert_eq!(
            (service.path.as_deref(), service.port),
            (Some("/convert"), Some(443))
        );
        assert_eq!((config.url, config.ca_bundle), (None, None));
    }
}

/// A manager outside the cluster is reached by URL instead of a Service.
#[test]
fn the_crds_can_convert_through_a_url() {
    let url = "https://127.0.0.1:18443/convert".to_owned();
    let webhook = crate::ConversionWebhook::Url(url.clone());
    for crd in crate::crds_converting_through(&webhook, crate::StorageVersion::V1alpha1) {
        let config = crd
            .spec
            .conversion
            .and_then(|c| c.webhook)
            .and_then(|w| w.client_config)
            .expect("a client config");
        assert_eq!(config.url.as_ref(), Some(&url));
        assert!(config.service.is_none());
    }
}

/// Each kind's print columns exist in both versions, so `kubectl get` shows the same table
/// whichever version it prefers (v1beta1).
#[test]
fn both_versions_have_the_same_print_column_names() {
    for crd in crate::crds() {
        let names: Vec<Vec<String>> = crd
            .spec
            .versions
            .iter()
            .map(|v| {
                let columns = v.additional_printer_columns.clone().unwrap_or_default();
                columns.into_iter().map(|c| c.name).collect()
            })
            .collect();
        assert!(!names[0].is_empty(), "{:?}", crd.metadata.name);
        assert_eq!(names[0], names[1], "{:?}", crd.metadata.name);
    }
}

/// For the way back to a pgkube that stored v1alpha1, v1alpha1 can be stored again; both stay
/// served.
#[test]
fn the_storage_version_can_be_v1alpha1() {
    let webhook = crate::ConversionWebhook::default();
    for crd in crate::crds_converting_through(&webhook, crate::StorageVersion::V1alpha1) {
        let mut versions: Vec<(&str, bool, bool)> = crd
            .spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.served, v.storage))
            .collect();
        versions.sort();
        assert_eq!(
            versions,
            [("v1alpha1", true, true), ("v1beta1", true, false)]
        );
    }
}

/// The test bed's CRDs, with no webhook to reach, serve v1beta1 alone.
#[test]
fn the_single_version_crds_serve_v1beta1_only() {
    for crd in crate::v1beta1::crds() {
        let versions: Vec<&str> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(versions, ["v1beta1"]);
        assert!(crd.spec.conversion.is_none());
    }
}
