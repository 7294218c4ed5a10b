//! The manifests in `deploy/` are real: the API server accepts the namespace and RBAC objects,
//! and a manager that authenticates as the `pgkube` ServiceAccount, with only the rights that
//! `deploy/rbac.yaml` grants, wins its Lease and brings a cluster's pods up and reports them in
//! its status without being refused anything.
//!
//! The cluster's pods land on the test bed's simulated (kwok) nodes, where nothing runs: their
//! instance managers never answer, so the cluster waits for its primary (phase Creating) and the
//! manager never labels a pod. That right (`patch` on pods) is checked with an access review.

mod manager_common;

use std::time::Duration;

use kube::api::Api;
use manager_common::{Manager, RUNNING_TIMEOUT, create_cluster};
use pgkube_crds::PostgreSQLCluster;
use pgkube_testkit::{TestEnv, TestNamespace, install_crds, testbed, wait_for_cluster};

const DEPLOY_NAMESPACE: &str = "pgkube-system";

fn kubectl_ok(env: &TestEnv, args: &[&str]) -> String {
    let output = env.kubectl().args(args).output().expect("kubectl runs");
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("kubectl prints UTF-8")
}

#[tokio::test]
async fn the_manager_runs_with_only_the_rights_of_deploy_rbac() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let root = env!("CARGO_MANIFEST_DIR");
    kubectl_ok(
        &env,
        &["apply", "-f", &format!("{root}/deploy/namespace.yaml")],
    );
    kubectl_ok(&env, &["apply", "-f", &format!("{root}/deploy/rbac.yaml")]);
    let token = kubectl_ok(&env, &["create", "token", "pgkube", "-n", DEPLOY_NAMESPACE]);
    let dir = std::env::temp_dir().join(format!("pgkube-rbac-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, env.kubeconfig_with_token(token.trim()))
        .expect("kubeconfig written");

    let namespace = TestNamespace::create(&client, "deploy-rbac").await;
    let lease_id = format!("pgkube-rbac-{}", std::process::id());
    let mut manager = Manager::start_with_env(
        &env,
        "manager-rbac",
        &[
            "--watch-namespaces",
            namespace.name(),
            "--leader-elect",
            "--leader-elect-namespace",
            DEPLOY_NAMESPACE,
            "--leader-elect-id",
            &lease_id,
        ],
        &[("KUBECONFIG", kubeconfig.to_str().expect("UTF-8 path"))],
    );

    let clusters: Api<PostgreSQLCluster> = Api::namespaced(client.clone(), namespace.name());
    create_cluster(&clusters, "rbac", 2).await;
    // Both pods ready and reported (unreachable instance managers): every step ran, the status
    // write included.
    let reached = wait_for_cluster(
        &client,
        namespace.name(),
        "rbac",
        "2 ready replicas, both instances reported",
        RUNNING_TIMEOUT,
        |cluster| {
            cluster
                .status
                .as_ref()
                .is_some_and(|s| s.ready_replicas == 2 && s.instances.len() == 2)
        },
    )
    .await;
    let output = manager.output().join("\n");
    reached.unwrap_or_else(|error| panic!("{error}\nmanager output:\n{output}"));
    assert!(
        !output.to_lowercase().contains("forbidden"),
        "the manager was refused something:\n{output}"
    );
    let service_account = format!("system:serviceaccount:{DEPLOY_NAMESPACE}:pgkube");
    for (verb, resource) in [
        ("patch", "pods"),
        ("delete", "services"),
        ("create", "secrets"),
    ] {
        let answer = kubectl_ok(
            &env,
            &[
                "auth",
                "can-i",
                verb,
                resource,
                "-n",
                namespace.name(),
                "--as",
                &service_account,
            ],
        );
        assert_eq!(answer.trim(), "yes", "{verb} {resource}");
    }

    manager.terminate();
    assert_eq!(manager.exit_code(Duration::from_secs(30)).await, Some(0));
    kubectl_ok(
        &env,
        &[
            "delete",
            "lease",
            &lease_id,
            "-n",
            DEPLOY_NAMESPACE,
            "--ignore-not-found",
        ],
    );
    std::fs::remove_dir_all(&dir).ok();
    namespace.cleanup().await;
}
