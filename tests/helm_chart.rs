//! The Helm chart (`deploy/helm/pgkube`) on the test bed, with the test bed's `helm` (built from
//! the `helm.sh/helm/v4` module by `tests/testbed/up`):
//!
//! - `helm lint` passes with the default values and with each certificate source, RBAC scope and
//!   the monitors on; values that cannot work together stop the render with a message.
//! - `helm template | kubectl apply --dry-run=server` is accepted by the API server in both RBAC
//!   modes.
//! - `helm install` runs the manager as two pods on the test bed's real node, namespaced, with a
//!   webhook certificate of the user's own (a mode that touches no CRD: the test bed's CRDs are
//!   shared, and their conversion webhook is other tests'). A cluster in the watched namespace
//!   reaches Running; the webhook's pods serve the certificate and answer an AdmissionReview; the
//!   rendered registration trusts the CA; the PodMonitor and ServiceMonitor select pods that
//!   serve metrics. `helm upgrade` rolls the manager to the new values and it goes on
//!   reconciling; `helm uninstall` removes the manager and leaves the cluster, its volumes, its
//!   Secrets and its data.
//!
//! Not here, because the test bed cannot: the API server calling the webhook through its
//! Service. It calls the Service's endpoints, and the pods' loopback addresses are never in
//! Endpoints, so the call would fail: the install registers no admission webhook. Nor
//! cert-manager or prometheus-operator's kinds (not installed; `helm lint` renders them).

mod helm_common;
mod helm_install;

use helm_common::{chart_dir, helm, objects, run_ok, template};
use pgkube_testkit::{TestEnv, TestNamespace, install_crds, testbed};

/// `helm lint --strict` of the chart with `args`.
fn lint(env: &TestEnv, args: &[&str]) {
    let output = run_ok(
        helm(env)
            .args(["lint", "--strict"])
            .arg(chart_dir())
            .args(args),
    );
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("0 chart(s) failed"), "{printed}");
}

#[test]
fn the_chart_lints_in_every_mode() {
    let Some(env) = testbed() else { return };
    lint(&env, &[]);
    lint(&env, &["--set", "rbac.scope=namespace"]);
    lint(
        &env,
        &[
            "--set",
            "rbac.scope=namespace,watchNamespaces={team-a,team-b}",
        ],
    );
    lint(&env, &["--set", "webhook.certificate.source=certManager"]);
    lint(
        &env,
        &[
            "--set",
            "webhook.certificate.source=secret,webhook.certificate.secretName=mine",
        ],
    );
    lint(
        &env,
        &[
            "--set",
            "podMonitor.enabled=true,serviceMonitor.enabled=true",
        ],
    );
}

/// `helm template` with `args` fails, saying `message`.
fn refused(env: &TestEnv, release: &str, args: &[&str], message: &str) {
    let output = helm(env)
        .args(["template", release])
        .arg(chart_dir())
        .args(args)
        .output()
        .expect("helm runs");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{args:?} rendered");
    assert!(said.contains(message), "{args:?}: {said}");
}

#[test]
fn values_that_cannot_work_stop_the_render() {
    let Some(env) = testbed() else { return };
    // A managed certificate's CA goes into the configuration named `pgkube` only.
    refused(
        &env,
        "other",
        &[],
        "MutatingWebhookConfiguration named pgkube only",
    );
    template(
        &env,
        "other",
        "ns",
        &["--set", "admissionWebhook.enabled=false"],
    );
    refused(
        &env,
        "pgkube",
        &["--set", "webhook.certificate.source=secret"],
        "webhook.certificate.secretName",
    );
    refused(&env, "pgkube", &["--set", "rbac.scope=all"], "rbac.scope");
    refused(
        &env,
        "pgkube",
        &["--set", "webhook.certificate.source=self"],
        "webhook.certificate.source",
    );
}

/// The watched namespaces and the certificate source reach the objects that depend on them.
#[test]
fn values_reach_the_manager_and_its_registration() {
    let Some(env) = testbed() else { return };
    let rendered = objects(&template(
        &env,
        "pgkube",
        "ops",
        &[
            "--set",
            "rbac.scope=namespace,watchNamespaces={team-a,team-b}",
            "--set",
            "webhook.certificate.source=certManager,image.digest=sha256:0123",
            "--set",
            "kubeApi.qps=7,kubeApi.burst=9,logging.format=text,otlp.endpoint=http://c:4318",
        ],
    ));
    let deployment = helm_common::the_object(&rendered, "Deployment", "pgkube");
    let args = helm_common::manager_args(deployment);
    for wanted in [
        "--watch-namespaces=team-a,team-b",
        "--kube-api-qps=7",
        "--kube-api-burst=9",
        "--log-format=text",
        "--agent-image=ghcr.io/pgkube/pgkube@sha256:0123",
    ] {
        assert!(args.iter().any(|a| a == wanted), "{wanted} not in {args:?}");
    }
    assert!(!args.iter().any(|a| a.starts_with("--webhook-cert-secret")));
    let container = helm_common::manager_container(deployment);
    assert!(container["env"].to_string().contains("http://c:4318"));
    let roles: Vec<&str> = rendered
        .iter()
        .filter(|o| o["kind"] == "Role" && o["metadata"]["name"] == "pgkube-manager")
        .filter_map(|o| o["metadata"]["namespace"].as_str())
        .collect();
    assert_eq!(roles, ["team-a", "team-b"]);
    // cert-manager makes the certificate: no right over CRDs or webhook configurations.
    let scope = helm_common::the_object(&rendered, "ClusterRole", "pgkube-manager-cluster-scope");
    assert_eq!(scope["rules"].as_array().map(Vec::len), Some(1), "{scope}");
    let webhook = helm_common::the_object(&rendered, "MutatingWebhookConfiguration", "pgkube");
    assert_eq!(
        webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "ops/pgkube-webhook"
    );
    let selector = &webhook["webhooks"][0]["namespaceSelector"]["matchExpressions"][0];
    assert_eq!(selector["values"], serde_json::json!(["team-a", "team-b"]));
    helm_common::the_object(&rendered, "Certificate", "pgkube-webhook");
}

/// `kubectl apply --dry-run=server` of `manifests`: the API server's answer.
fn server_dry_run(env: &TestEnv, manifests: &str) -> String {
    let output = env.kubectl_with_input(&["apply", "--dry-run=server", "-f", "-"], manifests);
    assert!(
        output.status.success(),
        "the API server refused the chart: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn the_api_server_accepts_the_rendered_chart_in_both_rbac_modes() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "helm-dry-run").await;
    let watched = TestNamespace::create(&client, "helm-dry-run-watched").await;
    let modes: [&[&str]; 3] = [
        &[],
        &["--set", "rbac.scope=namespace"],
        &[
            "--set",
            &format!(
                "rbac.scope=namespace,watchNamespaces={{{}}}",
                watched.name()
            ),
            "--set",
            "webhook.certificate.source=secret,webhook.certificate.secretName=mine",
            "--set",
            "podDisruptionBudget.enabled=true,networkPolicy.enabled=true",
        ],
    ];
    for args in modes {
        let manifests = template(&env, "pgkube", namespace.name(), args);
        let answer = server_dry_run(&env, &manifests);
        let kinds = objects(&manifests).len();
        assert_eq!(answer.lines().count(), kinds, "{answer}");
        assert!(answer.contains("(server dry run)"), "{answer}");
    }
    namespace.cleanup().await;
    watched.cleanup().await;
}

#[tokio::test]
async fn helm_installs_upgrades_and_uninstalls_a_working_pgkube() {
    let Some(env) = testbed() else { return };
    helm_install::scenario(&env).await;
}
