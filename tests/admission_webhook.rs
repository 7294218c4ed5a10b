//! The admission webhook with the API server in the loop: a real `pgkube run` serves it over TLS
//! on 127.0.0.1, registered (as `pgkube admission-webhook` prints it) for one test namespace.
//!
//! - A cluster comes out of its create request with the cleanup finalizer, and one that carries
//!   finalizers of its own keeps them: the manager's controllers watch another namespace, so the
//!   create's answer can only come from admission.
//! - Registered as `pgkube admission-webhook --namespaces` prints it (as deploy/local-up does), it
//!   is called for the clusters of that namespace, with the CA `--ca-bundle` gave it, and for no
//!   other namespace's.
//! - With the webhook unreachable (its manager answered, then stopped), a cluster is still
//!   created (the failure policy is `Ignore`), without the finalizer, and the cluster controller
//!   adds it.
//!
//! tests/conversion_webhook.rs checks that a managed certificate's CA reaches the registration.

mod manager_common;

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::{Api, Patch, PatchParams, PostParams};
use manager_common::Manager;
use pgkube_crds::{CLEANUP_FINALIZER, PostgreSQLCluster};
use pgkube_testkit::{
    TestAdmission, TestCa, TestEnv, TestNamespace, install_crds, testbed, wait_until,
};

const STEP_TIMEOUT: Duration = Duration::from_secs(60);
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
const OTHER_FINALIZER: &str = "example.com/keep";

/// A small cluster `name` with `finalizers`, as a user would write it.
fn cluster(name: &str, finalizers: &[&str]) -> PostgreSQLCluster {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "db.example.com/v1beta1",
        "kind": "PostgreSQLCluster",
        "metadata": { "name": name, "finalizers": finalizers },
        "spec": { "replicas": 1, "postgresVersion": "15", "storage": {"size": "1Gi"} },
    }))
    .expect("a valid cluster")
}

fn finalizers(cluster: &PostgreSQLCluster) -> Vec<String> {
    cluster.metadata.finalizers.clone().unwrap_or_default()
}

/// A manager serving the webhook on 127.0.0.1 with the certificate in `cert_dir`, whose
/// controllers watch `watched` only.
fn webhook_manager(env: &TestEnv, name: &str, watched: &str, cert_dir: &Path) -> Manager {
    let cert_dir = cert_dir.to_string_lossy();
    let args = [
        "--watch-namespaces",
        watched,
        "--webhook-bind-address",
        "127.0.0.1:0",
        "--webhook-cert-dir",
        &cert_dir,
    ];
    Manager::start(env, name, &args)
}

#[tokio::test]
async fn a_cluster_gets_the_finalizer_as_it_is_created_and_keeps_its_own() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "admission").await;
    let idle = TestNamespace::create(&client, "admission-idle").await;
    let ca = TestCa::new();
    let cert_dir = ca.serving_certificate_dir("admission");
    let mut manager = webhook_manager(&env, "manager-admission", idle.name(), &cert_dir);
    let address = manager.endpoint("webhook").await;
    let name = format!("pgkube-{}", namespace.name());
    let admission =
        TestAdmission::register(&client, &name, address, Some(&ca.pem()), namespace.name()).await;
    admission
        .wait_answering()
        .await
        .unwrap_or_else(|error| panic!("{error:#}\noutput:\n{}", manager.output().join("\n")));

    let clusters: Api<PostgreSQLCluster> = Api::namespaced(client.clone(), namespace.name());
    let created = clusters
        .create(&PostParams::default(), &cluster("plain", &[]))
        .await
        .expect("cluster created");
    assert_eq!(finalizers(&created), [CLEANUP_FINALIZER]);
    let created = clusters
        .create(&PostParams::default(), &cluster("own", &[OTHER_FINALIZER]))
        .await
        .expect("cluster created");
    assert_eq!(finalizers(&created), [OTHER_FINALIZER, CLEANUP_FINALIZER]);
    // As stored, not only as answered.
    let stored = clusters.get("plain").await.expect("the cluster");
    assert_eq!(finalizers(&stored), [CLEANUP_FINALIZER]);

    // Our own finalizer goes first, so that the namespace can go.
    let release = serde_json::json!({"metadata": {"finalizers": null}});
    clusters
        .patch("own", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("finalizers removed");
    admission.delete().await;
    manager.terminate();
    assert_eq!(manager.exit_code(EXIT_TIMEOUT).await, Some(0));
    namespace.cleanup_without_controllers().await;
    idle.cleanup().await;
    let _ = std::fs::remove_dir_all(cert_dir);
}

/// `pgkube admission-webhook`'s output for `name`, calling `address`, for `namespace` alone,
/// trusting the CA in `ca_file`.
fn printed_registration(
    name: &str,
    address: std::net::SocketAddr,
    namespace: &str,
    ca_file: &Path,
) -> MutatingWebhookConfiguration {
    let url = format!("https://{address}{}", pgkube_crds::ADMISSION_PATH);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_pgkube"))
        .args(["admission-webhook", "--webhook-url", &url, "--name", name])
        .args(["--namespaces", namespace, "--ca-bundle"])
        .arg(ca_file)
        .output()
        .expect("pgkube runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_yaml::from_slice(&output.stdout).expect("a MutatingWebhookConfiguration")
}

#[tokio::test]
async fn a_registration_for_one_namespace_admits_that_namespaces_clusters_alone() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "admission-scoped").await;
    let other = TestNamespace::create(&client, "admission-unscoped").await;
    let idle = TestNamespace::create(&client, "admission-scoped-idle").await;
    let ca = TestCa::new();
    let cert_dir = ca.serving_certificate_dir("admission-scoped");
    let ca_file = cert_dir.join("ca.crt");
    std::fs::write(&ca_file, ca.pem()).expect("CA file");
    let mut manager = webhook_manager(&env, "manager-admission-scoped", idle.name(), &cert_dir);
    let address = manager.endpoint("webhook").await;
    let name = format!("pgkube-{}", namespace.name());
    let registration = printed_registration(&name, address, namespace.name(), &ca_file);
    let admission = TestAdmission::create(&client, registration, namespace.name()).await;
    // Called for the namespace, trusting the CA given on the command line.
    admission
        .wait_answering()
        .await
        .unwrap_or_else(|error| panic!("{error:#}\noutput:\n{}", manager.output().join("\n")));

    // Not for another: a cluster created there comes back without the finalizer, while the
    // webhook answers (as the namespace's clusters show, before and after).
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let elsewhere: Api<PostgreSQLCluster> = Api::namespaced(client.clone(), other.name());
    let created = elsewhere
        .create(&dry_run, &cluster("elsewhere", &[]))
        .await
        .expect("created with dryRun");
    assert_eq!(finalizers(&created), Vec::<String>::new());
    let here: Api<PostgreSQLCluster> = Api::namespaced(client.clone(), namespace.name());
    let created = here
        .create(&dry_run, &cluster("here", &[]))
        .await
        .expect("created with dryRun");
    assert_eq!(finalizers(&created), [CLEANUP_FINALIZER]);

    admission.delete().await;
    manager.terminate();
    assert_eq!(manager.exit_code(EXIT_TIMEOUT).await, Some(0));
    namespace.cleanup_without_controllers().await;
    other.cleanup_without_controllers().await;
    idle.cleanup().await;
    let _ = std::fs::remove_dir_all(cert_dir);
}

#[tokio::test]
async fn with_the_webhook_unreachable_a_cluster_is_created_and_the_controller_adds_the_finalizer() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "admission-down").await;
    let idle = TestNamespace::create(&client, "admission-down-idle").await;
    let ca = TestCa::new();
    let cert_dir = ca.serving_certificate_dir("admission-down");
    // The registration is in effect (its manager answers), then its manager goes away.
    let mut webhook = webhook_manager(&env, "manager-admission-gone", idle.name(), &cert_dir);
    let address = webhook.endpoint("webhook").await;
    let name = format!("pgkube-{}", namespace.name());
    let admission =
        TestAdmission::register(&client, &name, address, Some(&ca.pem()), namespace.name()).await;
    admission
        .wait_answering()
        .await
        .unwrap_or_else(|error| panic!("{error:#}\noutput:\n{}", webhook.output().join("\n")));
    webhook.terminate();
    assert_eq!(webhook.exit_code(EXIT_TIMEOUT).await, Some(0));

    let clusters: Api<PostgreSQLCluster> = Api::namespaced(client.clone(), namespace.name());
    let created = clusters
        .create(&PostParams::default(), &cluster("db", &[]))
        .await
        .expect("created although the webhook cannot be reached");
    assert_eq!(finalizers(&created), Vec::<String>::new());

    let mut manager = Manager::start(
        &env,
        "manager-admission-down",
        &[
            "--watch-namespaces",
            namespace.name(),
            "--webhook-bind-address",
            "0",
        ],
    );
    wait_until(
        "the controller to add the finalizer",
        STEP_TIMEOUT,
        || async {
            let cluster = clusters.get("db").await?;
            Ok((finalizers(&cluster) == [CLEANUP_FINALIZER]).then_some(()))
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}\noutput:\n{}", manager.output().join("\n")));

    admission.delete().await;
    manager.terminate();
    assert_eq!(manager.exit_code(EXIT_TIMEOUT).await, Some(0));
    namespace.cleanup_without_controllers().await;
    idle.cleanup().await;
    let _ = std::fs::remove_dir_all(cert_dir);
}
