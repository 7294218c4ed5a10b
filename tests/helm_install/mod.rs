//! `helm install`, `upgrade` and `uninstall` of the chart on the test bed (tests/helm_chart.rs),
//! in the mode a user picks for a manager of a few namespaces with a webhook certificate of
//! their own: `rbac.scope=namespace`, `watchNamespaces`, `webhook.certificate.source=secret`.
//! That manager changes no CRD and no other release's webhook configuration.

mod checks;
mod lifecycle;

use std::path::Path;

use pgkube_testkit::{
    TestCa, TestCluster, TestEnv, TestNamespace, install_crds, local_node_scheduling, unique_name,
};

use crate::helm_common::{chart_dir, helm, run_ok};

/// How long `helm install` and `helm upgrade` may wait for the manager's rollout.
const ROLLOUT_TIMEOUT: &str = "5m";

/// A release of the chart, uninstalled on drop unless [`Release::uninstall`] ran (a test that
/// failed half way leaves no ClusterRole behind).
pub struct Release<'a> {
    env: &'a TestEnv,
    pub name: String,
    pub namespace: String,
    uninstalled: bool,
}

impl Release<'_> {
    /// `<release>-webhook`: the Service the webhook is registered through.
    pub fn webhook_service(&self) -> String {
        format!("{}-webhook", self.name)
    }

    /// The host name the webhook's certificate is for.
    pub fn webhook_host(&self) -> String {
        format!("{}.{}.svc", self.webhook_service(), self.namespace)
    }

    fn helm(&self, verb: &str) -> std::process::Command {
        let mut command = helm(self.env);
        command
            .args([verb, &self.name])
            .args(["--namespace", &self.namespace]);
        command
    }

    /// `helm install --skip-crds` with `args`, waiting for the rollout: the test bed's CRDs are
    /// there already, and shared. (Helm 4 applies a chart's CRDs server-side even when they
    /// exist, and these belong to the tests' field manager: the install would fail on the
    /// conflict.)
    fn install(&self, args: &[String]) {
        run_ok(
            self.helm("install")
                .arg(chart_dir())
                .arg("--skip-crds")
                .args(args)
                .args(["--wait", "--timeout", ROLLOUT_TIMEOUT]),
        );
    }

    /// `helm upgrade --reuse-values` with `args`, waiting for the rollout.
    pub fn upgrade(&self, args: &[&str]) {
        run_ok(
            self.helm("upgrade")
                .arg(chart_dir())
                .arg("--reuse-values")
                .args(args)
                .args(["--wait", "--timeout", ROLLOUT_TIMEOUT]),
        );
    }

    pub fn uninstall(&mut self) {
        self.uninstalled = true;
        run_ok(
            self.helm("uninstall")
                .args(["--wait", "--timeout", ROLLOUT_TIMEOUT]),
        );
    }
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        if !self.uninstalled {
            let _ = self.helm("uninstall").output();
        }
    }
}

/// The webhook's certificate for `release`, signed by `ca`, as a user's own PKI would provide
/// it: `tls.crt`, `tls.key` and `ca.crt` in `dir`, and the Secret `<release>-webhook-tls` made
/// from them with `kubectl create secret tls`, as docs/helm.md does. The Secret's name.
fn create_certificate_secret(
    env: &TestEnv,
    release: &Release<'_>,
    ca: &TestCa,
    dir: &Path,
) -> String {
    let (certificate, key) = ca.server_certificate(&[release.webhook_host()]);
    for (file, pem) in [
        ("tls.crt", certificate),
        ("tls.key", key),
        ("ca.crt", ca.pem()),
    ] {
        std::fs::write(dir.join(file), pem).expect("a PEM file");
    }
    let name = format!("{}-webhook-tls", release.name);
    run_ok(
        env.kubectl()
            .args(["create", "secret", "tls", &name, "-n", &release.namespace])
            .arg("--cert")
            .arg(dir.join("tls.crt"))
            .arg("--key")
            .arg(dir.join("tls.key")),
    );
    name
}

/// The install's values, as docs/helm.md gives them (a manager of the namespace `watched`,
/// with the certificate of the Secret `secret`), a values file that puts the manager's pods on
/// the test bed's real node, and no admission webhook registration: the test bed's API server
/// would call the webhook Service's endpoints, and the pods' loopback addresses are never in
/// Endpoints, so the call would fail.
fn install_args(dir: &Path, watched: &str, secret: &str) -> Vec<String> {
    let node = local_node_scheduling();
    let on_real_node = serde_json::json!({
        "nodeSelector": node.node_selector,
        "tolerations": node.tolerations,
    });
    let values = dir.join("real-node.yaml");
    // JSON is YAML.
    std::fs::write(&values, on_real_node.to_string()).expect("values written");
    let path = |file: &Path| file.to_str().expect("a UTF-8 path").to_owned();
    [
        "--set".to_owned(),
        "rbac.scope=namespace".to_owned(),
        "--set".to_owned(),
        format!("watchNamespaces={{{watched}}}"),
        "--set".to_owned(),
        "webhook.certificate.source=secret".to_owned(),
        "--set".to_owned(),
        format!("webhook.certificate.secretName={secret}"),
        "--set-file".to_owned(),
        format!("webhook.certificate.caBundle={}", path(&dir.join("ca.crt"))),
        "--values".to_owned(),
        path(&values),
        "--set".to_owned(),
        "admissionWebhook.enabled=false".to_owned(),
    ]
    .into()
}

pub async fn scenario(env: &TestEnv) {
    let client = env.kube_client().await;
    install_crds(&client).await;
    let home = TestNamespace::create(&client, "helm-pgkube").await;
    let watched = TestNamespace::create(&client, "helm-watched").await;
    let mut release = Release {
        env,
        name: unique_name("pgkube"),
        namespace: home.name().to_owned(),
        uninstalled: false,
    };
    let ca = TestCa::new();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let secret = create_certificate_secret(env, &release, &ca, dir.path());
    let args = install_args(dir.path(), watched.name(), &secret);

    release.install(&args);
    let managers = checks::managers_run_on_the_real_node(&client, &release).await;
    checks::the_webhook_serves_the_certificate(
        env,
        &client,
        &release,
        &args,
        watched.name(),
        &ca.pem(),
    )
    .await;
    let cluster = TestCluster::builder("helm")
        .start(&watched)
        .await
        .expect("a cluster in the watched namespace reaches Running");
    let sql = cluster.sql().await.expect("SQL on the cluster");
    sql.batch_execute("CREATE TABLE kept (note text); INSERT INTO kept VALUES ('before')")
        .await
        .expect("a row written");
    checks::the_monitors_find_targets(env, &client, &release, &args).await;

    release.upgrade(&[
        "--set",
        "logging.format=text",
        "--set",
        "resources.requests.memory=80Mi",
    ]);
    lifecycle::the_manager_rolled(env, &client, &release, &managers).await;
    lifecycle::the_manager_still_reconciles(&cluster).await;

    let kept = lifecycle::cluster_objects(&client, &cluster).await;
    release.uninstall();
    lifecycle::the_manager_is_gone(&client, &release, watched.name()).await;
    lifecycle::the_cluster_and_its_data_stay(&client, &cluster, &kept).await;

    drop(sql);
    watched.cleanup_without_controllers().await;
    home.cleanup().await;
}
