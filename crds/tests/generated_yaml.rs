//! The CRD YAML committed in `crds/crds.yaml` must be exactly what `pgkube crd` prints.
//! Regenerate it with `cargo run -- crd > crds/crds.yaml`.

#[test]
fn committed_crd_yaml_matches_the_types() {
    let committed = include_str!("../crds.yaml");
    let generated = pgkube_crds::crd_yaml(&pgkube_crds::crds()).expect("CRDs serialize to YAML");
    assert!(
        committed == generated,
        "crds/crds.yaml is out of date with the API types: run `cargo run -- crd > crds/crds.yaml`"
    );
}
