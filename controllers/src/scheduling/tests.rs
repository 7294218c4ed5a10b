//! The scheduling fields of instance and backup Job pods.

use super::*;
use serde_json::json;

fn spec(fields: serde_json::Value) -> PostgreSQLClusterSpec {
    let mut spec = json!({ "storage": { "size": "1Gi" } });
    if let (Some(spec), Some(fields)) = (spec.as_object_mut(), fields.as_object()) {
        spec.extend(fields.clone());
    }
    serde_json::from_value(spec).expect("a cluster spec")
}

fn instances() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "postgresql".to_owned()),
        ("app.kubernetes.io/instance".to_owned(), "pg".to_owned()),
    ])
}

fn primary() -> BTreeMap<String, String> {
    let mut primary = instances();
    primary.insert("db.example.com/role".to_owned(), "primary".to_owned());
    primary
}

fn affinity_json(scheduling: &Scheduling) -> serde_json::Value {
    serde_json::to_value(&scheduling.affinity).expect("json")
}

#[test]
fn empty_fields_leave_the_pod_without_them() {
    let mut pod = PodSpec {
        node_selector: Some(BTreeMap::from([("a".to_owned(), "b".to_owned())])),
        tolerations: Some(vec![Toleration::default()]),
        affinity: Some(Affinity::default()),
        topology_spread_constraints: Some(vec![TopologySpreadConstraint::default()]),
        ..PodSpec::default()
    };
    Scheduling::default().apply_to(&mut pod);
    assert_eq!(pod, PodSpec::default());
}

#[test]
fn by_default_instances_prefer_nodes_without_another_instance() {
    let scheduling = Scheduling::for_instances(&spec(json!({})), &instances());
    assert_eq!(
        affinity_json(&scheduling),
        json!({ "podAntiAffinity": { "preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "podAffinityTerm": {
                "labelSelector": { "matchLabels": {
                    "app.kubernetes.io/name": "postgresql",
                    "app.kubernetes.io/instance": "pg",
                } },
                "topologyKey": "kubernetes.io/hostname",
            },
        }] } })
    );
    assert!(scheduling.topology_spread_constraints.is_empty());
}

#[test]
fn a_required_anti_affinity_is_a_hard_rule_and_a_disabled_one_is_none() {
    let required = Scheduling::for_instances(
        &spec(json!({ "spread": { "nodeAntiAffinity": "Required" } })),
        &instances(),
    );
    let anti = affinity_json(&required)["podAntiAffinity"].clone();
    assert_eq!(
        anti["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert!(
        anti.get("preferredDuringSchedulingIgnoredDuringExecution")
            .is_none()
    );
    let disabled = Scheduling::for_instances(
        &spec(json!({ "spread": { "nodeAntiAffinity": "Disabled" } })),
        &instances(),
    );
    assert_eq!(disabled.affinity, None);
}

#[test]
fn the_users_pod_anti_affinity_replaces_the_default_and_node_affinity_keeps_it() {
    let own = json!({ "podAntiAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": { "matchLabels": { "tier": "db" } },
        "topologyKey": "topology.kubernetes.io/zone",
    }] } });
    let replaced = Scheduling::for_instances(&spec(json!({ "affinity": own })), &instances());
    assert_eq!(affinity_json(&replaced), own);

    let node_affinity = json!({ "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{ "matchExpressions": [
            { "key": "disk", "operator": "In", "values": ["ssd"] },
        ] }],
    } } });
    let kept = Scheduling::for_instances(&spec(json!({ "affinity": node_affinity })), &instances());
    let kept = affinity_json(&kept);
    assert_eq!(kept["nodeAffinity"], node_affinity["nodeAffinity"]);
    assert_eq!(
        kept["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"],
        100
    );
}

#[test]
fn a_spread_constraint_without_a_selector_counts_the_clusters_instances() {
    let scheduling = Scheduling::for_instances(
        &spec(json!({ "spread": { "topologySpreadConstraints": [
            { "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
              "whenUnsatisfiable": "DoNotSchedule" },
            { "maxSkew": 2, "topologyKey": "kubernetes.io/hostname",
              "whenUnsatisfiable": "ScheduleAnyway",
              "labelSelector": { "matchLabels": { "tier": "db" } } },
        ] } })),
        &instances(),
    );
    let constraints = serde_json::to_value(&scheduling.topology_spread_constraints).expect("json");
    assert_eq!(
        constraints[0]["labelSelector"]["matchLabels"],
        json!({ "app.kubernetes.io/name": "postgresql", "app.kubernetes.io/instance": "pg" })
    );
    assert_eq!(constraints[0]["maxSkew"], 1);
    assert_eq!(
        constraints[1]["labelSelector"]["matchLabels"],
        json!({ "tier": "db" })
    );
    let mut pod = PodSpec::default();
    scheduling.apply_to(&mut pod);
    assert_eq!(
        pod.topology_spread_constraints
            .map(|constraints| constraints.len()),
        Some(2)
    );
}

#[test]
fn a_backup_prefers_a_node_without_the_primary_on_top_of_the_users_affinity() {
    let own_term = json!({ "weight": 10, "podAffinityTerm": {
        "labelSelector": { "matchLabels": { "app": "batch" } },
        "topologyKey": "kubernetes.io/hostname",
    } });
    let scheduling = Scheduling::for_backup(
        &spec(json!({ "affinity": { "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [own_term],
        } } })),
        &primary(),
    );
    let preferred = affinity_json(&scheduling)["podAntiAffinity"]
        ["preferredDuringSchedulingIgnoredDuringExecution"]
        .clone();
    assert_eq!(preferred[0], own_term);
    assert_eq!(
        preferred[1]["podAffinityTerm"]["labelSelector"]["matchLabels"]["db.example.com/role"],
        "primary"
    );
    assert_eq!(preferred[1]["weight"], 100);
    let without_affinity = Scheduling::for_backup(&spec(json!({})), &primary());
    assert_eq!(
        affinity_json(&without_affinity)["podAntiAffinity"]
            ["preferredDuringSchedulingIgnoredDuringExecution"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
}
