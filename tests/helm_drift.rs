//! The chart and deploy/'s kustomize never drift: the chart rendered with its default values
//! (release `pgkube` in `pgkube-system`) is, object for object and field for field, what
//! `kubectl kustomize deploy/` builds, and with `rbac.scope=namespace` what
//! `kubectl kustomize deploy/namespaced/` builds: the same kinds and names, RBAC rules, container
//! args, env, ports, probes, security contexts, volumes and policies. Only these may differ:
//!
//! - Helm's own labels (`app.kubernetes.io/instance`, `app.kubernetes.io/version`,
//!   `app.kubernetes.io/managed-by`, `helm.sh/chart`), wherever labels or selectors are;
//! - the order of a role's rules, which means nothing to RBAC;
//! - the Namespace, which the kustomize makes and Helm leaves to `--create-namespace`.
//!
//! The chart's CRDs are `crds/crds.yaml` itself (`crds/tests/generated_yaml.rs` holds that to
//! `pgkube crd`).

mod helm_common;

use std::collections::BTreeMap;

use helm_common::{objects, run_ok, template};
use pgkube_testkit::{TestEnv, testbed};
use serde_json::Value;

/// Labels Helm adds to the chart's objects, which deploy/ has no use for.
const HELM_LABELS: [&str; 4] = [
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
];

/// `value` without Helm's labels (in any `labels`, `matchLabels` or `selector` map) and with
/// each `rules` list sorted.
fn normalized(mut value: Value) -> Value {
    normalize(&mut value, "");
    value
}

fn normalize(value: &mut Value, key: &str) {
    match value {
        Value::Object(map) => {
            if matches!(key, "labels" | "matchLabels" | "selector") {
                for label in HELM_LABELS {
                    map.remove(label);
                }
            }
            for (key, value) in map.iter_mut() {
                normalize(value, key);
            }
        }
        Value::Array(items) => {
            for item in items.iter_mut() {
                normalize(item, key);
            }
            if key == "rules" {
                items.sort_by_key(Value::to_string);
            }
        }
        _ => {}
    }
}

/// Objects by kind, namespace and name.
fn by_identity(objects: Vec<Value>) -> BTreeMap<String, Value> {
    objects
        .into_iter()
        .map(|object| {
            let identity = format!(
                "{} {}/{}",
                object["kind"].as_str().unwrap_or_default(),
                object["metadata"]["namespace"].as_str().unwrap_or_default(),
                object["metadata"]["name"].as_str().unwrap_or_default(),
            );
            (identity, normalized(object))
        })
        .collect()
}

fn kustomize(env: &TestEnv, dir: &str) -> String {
    let path = format!("{}/deploy/{dir}", env!("CARGO_MANIFEST_DIR"));
    let output = run_ok(env.kubectl().args(["kustomize", &path]));
    String::from_utf8(output.stdout).expect("kubectl prints UTF-8")
}

/// Every difference between the chart's objects and the kustomize's, as lines.
fn differences(chart: &str, kustomize: &str) -> Vec<String> {
    let chart = by_identity(objects(chart));
    let mut built = by_identity(objects(kustomize));
    built.retain(|identity, _| !identity.starts_with("Namespace "));
    let mut differences = Vec::new();
    for (identity, object) in &built {
        match chart.get(identity) {
            None => differences.push(format!("{identity}: in deploy/, not in the chart")),
            Some(rendered) if rendered != object => differences.push(format!(
                "{identity} differs:\n  deploy/: {object}\n  chart:   {rendered}"
            )),
            Some(_) => {}
        }
    }
    for identity in chart.keys().filter(|i| !built.contains_key(*i)) {
        differences.push(format!("{identity}: in the chart, not in deploy/"));
    }
    differences
}

fn assert_same(chart: &str, kustomize: &str, what: &str) {
    let differences = differences(chart, kustomize);
    assert!(
        differences.is_empty(),
        "the chart and {what} drifted apart:\n{}",
        differences.join("\n")
    );
}

#[test]
fn the_chart_renders_what_deploy_builds() {
    let Some(env) = testbed() else { return };
    let chart = template(&env, "pgkube", "pgkube-system", &[]);
    assert_same(&chart, &kustomize(&env, ""), "deploy/");
}

#[test]
fn the_namespaced_chart_renders_what_deploy_namespaced_builds() {
    let Some(env) = testbed() else { return };
    let chart = template(
        &env,
        "pgkube",
        "pgkube-system",
        &["--set", "rbac.scope=namespace"],
    );
    assert_same(&chart, &kustomize(&env, "namespaced"), "deploy/namespaced/");
}

/// The check itself finds a drift: one arg, one rule verb, one missing object.
#[test]
fn a_drift_is_found() {
    let Some(env) = testbed() else { return };
    let built = kustomize(&env, "");
    let chart = template(&env, "pgkube", "pgkube-system", &[]);
    assert!(differences(&chart, &built).is_empty());
    let changed = chart.replacen(
        "--shutdown-grace-period=30s",
        "--shutdown-grace-period=31s",
        1,
    );
    assert_eq!(differences(&changed, &built).len(), 1);
    let changed = chart.replacen(r#"verbs: ["list"]"#, r#"verbs: ["list", "get"]"#, 1);
    assert_eq!(differences(&changed, &built).len(), 1);
    let without_budget = template(
        &env,
        "pgkube",
        "pgkube-system",
        &["--set", "podDisruptionBudget.enabled=false"],
    );
    let found = differences(&without_budget, &built);
    assert_eq!(
        found,
        ["PodDisruptionBudget pgkube-system/pgkube: in deploy/, not in the chart"]
    );
    // Helm's labels are not a drift; other labels are.
    let relabelled = chart.replacen(
        "app.kubernetes.io/component: manager",
        "app.kubernetes.io/component: other",
        1,
    );
    assert_eq!(differences(&relabelled, &built).len(), 1);
}

/// The chart's CRDs are pgkube's: `crds/crds.yaml`, document for document.
#[test]
fn the_chart_installs_pgkube_crds() {
    let Some(env) = testbed() else { return };
    let with_crds = objects(&template(
        &env,
        "pgkube",
        "pgkube-system",
        &["--include-crds"],
    ));
    let crds: Vec<&Value> = with_crds
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .collect();
    let committed = include_str!("../crds/crds.yaml");
    let expected = objects(committed);
    assert_eq!(expected.len(), 3);
    assert_eq!(crds, expected.iter().collect::<Vec<_>>());
}
