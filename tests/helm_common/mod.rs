//! Shared by the chart's tests (`helm_chart.rs`, `helm_drift.rs`): the test bed's `helm`, run on
//! `deploy/helm/pgkube`, and what it renders, as JSON objects.

#![allow(dead_code)] // each test file uses a different part

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pgkube_testkit::TestEnv;
use serde::Deserialize as _;

/// The chart, in this checkout.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/pgkube")
}

/// The test bed's `helm` (`tests/testbed/up` builds it), pointed at its API server.
pub fn helm(env: &TestEnv) -> Command {
    let path = env.bin_dir.join("helm");
    assert!(
        path.exists(),
        "{} is missing: run tests/testbed/up, which builds helm and links it there",
        path.display()
    );
    let mut command = Command::new(path);
    command.env("KUBECONFIG", &env.kubeconfig);
    command
}

/// Runs `command`; panics with its stderr unless it succeeds.
pub fn run_ok(command: &mut Command) -> Output {
    let output = command.output().expect("the command runs");
    assert!(
        output.status.success(),
        "{command:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    output
}

/// `helm template <release> <chart> -n <namespace> <args...>`: the YAML it prints.
pub fn template(env: &TestEnv, release: &str, namespace: &str, args: &[&str]) -> String {
    let output = run_ok(
        helm(env)
            .args(["template", release])
            .arg(chart_dir())
            .args(["--namespace", namespace])
            .args(args),
    );
    String::from_utf8(output.stdout).expect("helm prints UTF-8")
}

/// The objects of a multi-document YAML stream, as JSON (empty documents left out).
pub fn objects(yaml: &str) -> Vec<serde_json::Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|document| serde_json::Value::deserialize(document).expect("YAML"))
        .filter(|value| !value.is_null())
        .collect()
}

/// The one object of `kind` named `name` among `objects`.
pub fn the_object<'a>(
    objects: &'a [serde_json::Value],
    kind: &str,
    name: &str,
) -> &'a serde_json::Value {
    let mut found = objects
        .iter()
        .filter(|o| o["kind"] == kind && o["metadata"]["name"] == name);
    let object = found
        .next()
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"));
    assert!(found.next().is_none(), "two {kind}s named {name} rendered");
    object
}

/// The manager container of a rendered Deployment.
pub fn manager_container(deployment: &serde_json::Value) -> &serde_json::Value {
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["name"], "manager");
    container
}

/// The manager container's args.
pub fn manager_args(deployment: &serde_json::Value) -> Vec<String> {
    manager_container(deployment)["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|arg| arg.as_str().expect("a string arg").to_owned())
        .collect()
}
