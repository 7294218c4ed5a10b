//! The CRD YAML committed in `crds/crds.yaml` must be exactly what `pgkube crd` prints.
//! Regenerate it with `cargo run -- crd > crds/crds.yaml`. Likewise the admission webhook's
//! registration in `deploy/manager/admission-webhook.yaml`, with
//! `cargo run -- admission-webhook > deploy/manager/admission-webhook.yaml`, and the API
//! reference in `docs/api.md`, with `cargo run -- api-docs > docs/api.md`.

#[test]
fn committed_crd_yaml_matches_the_types() {
    let committed = include_str!("../crds.yaml");
    let generated = pgkube_crds::crd_yaml(&pgkube_crds::crds()).expect("CRDs serialize to YAML");
    assert!(
        committed == generated,
        "crds/crds.yaml is out of date with the API types: run `cargo run -- crd > crds/crds.yaml`"
    );
}

#[test]
fn committed_admission_webhook_yaml_matches_the_registration() {
    let committed = include_str!("../../deploy/manager/admission-webhook.yaml");
    let registration = pgkube_crds::admission_through(&pgkube_crds::ConversionWebhook::default());
    let generated = pgkube_crds::admission_yaml(&registration).expect("serializes to YAML");
    assert!(
        committed == generated,
        "deploy/manager/admission-webhook.yaml is out of date: run \
         `cargo run -- admission-webhook > deploy/manager/admission-webhook.yaml`"
    );
}

#[test]
fn committed_api_reference_matches_the_types() {
    let committed = include_str!("../../docs/api.md");
    let generated = pgkube_crds::api_markdown(&pgkube_crds::crds());
    assert!(
        committed == generated,
        "docs/api.md is out of date with the API types: run `cargo run -- api-docs > docs/api.md`"
    );
}

/// The controllers look for a cluster's pods and claims among ordinals below `MAX_REPLICAS`, so
/// every served version must refuse more replicas than that.
#[test]
fn every_version_bounds_replicas_by_max_replicas() {
    let crds = pgkube_crds::crds();
    let clusters = crds
        .iter()
        .find(|crd| crd.spec.names.kind == "PostgreSQLCluster")
        .expect("the PostgreSQLCluster CRD");
    let served: Vec<&str> = clusters
        .spec
        .versions
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(served, ["v1beta1", "v1alpha1"]);
    for version in &clusters.spec.versions {
        let schema = serde_json::to_value(&version.schema).expect("the schema as JSON");
        let maximum = schema
            .pointer("/openAPIV3Schema/properties/spec/properties/replicas/maximum")
            .and_then(serde_json::Value::as_f64);
        assert_eq!(
            maximum,
            Some(f64::from(pgkube_crds::MAX_REPLICAS)),
            "spec.replicas of {}",
            version.name
        );
    }
}
