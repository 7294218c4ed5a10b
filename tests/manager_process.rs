//! The real `pgkube run` process: its endpoints against the test bed, its graceful stop, and
//! its start-up error without any Kubernetes configuration.

mod manager_common;

use std::process::Command;
use std::time::Duration;

use kube::api::Api;
use manager_common::{Manager, create_cluster};
use pgkube_crds::PostgreSQLCluster;
use pgkube_testkit::http_get;
use pgkube_testkit::{TestNamespace, install_crds, testbed, wait_until};

#[tokio::test]
async fn serves_probes_and_metrics_then_stops_on_sigterm() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "manager-endpoints").await;
    let mut manager = Manager::start(
        &env,
        "manager-endpoints",
        &[
            "--shutdown-grace-period",
            "10s",
            "--watch-namespaces",
            namespace.name(),
        ],
    );
    let probes = manager.endpoint("health probes").await;
    let metrics = manager.endpoint("metrics").await;

    assert_eq!(http_get(probes, "/healthz").await.expect("healthz").0, 200);
    wait_until(
        "/readyz to report synced caches",
        Duration::from_secs(60),
        || async { Ok((http_get(probes, "/readyz").await?.0 == 200).then_some(())) },
    )
    .await
    .expect("ready");
    assert!(
        manager.logged("controller caches synced"),
        "{}",
        manager.output().join("\n")
    );

    let (status, body) = http_get(metrics, "/metrics").await.expect("metrics");
    assert_eq!(status, 200);
    assert!(body.ends_with("# EOF\n"), "not OpenMetrics text: {body}");

    // The reconcile metrics get their series with the first reconcile: give the manager a
    // cluster to reconcile and wait for both metrics to count it.
    let clusters: Api<PostgreSQLCluster> = Api::namespaced(client.clone(), namespace.name());
    create_cluster(&clusters, "metrics", 1).await;
    let body = wait_until(
        "both reconcile metrics to count the cluster's reconciles",
        Duration::from_secs(60),
        || async {
            let (_, body) = http_get(metrics, "/metrics").await?;
            let counted = body
                .contains(r#"operator_reconcile_total{controller="cluster",result="success"}"#)
                && body
                    .contains(r#"operator_reconcile_duration_seconds_count{controller="cluster"}"#);
            Ok(counted.then_some(body))
        },
    )
    .await
    .expect("reconcile metrics");
    assert!(
        body.contains(
            r#"operator_reconcile_duration_seconds_bucket{le="0.01",controller="cluster"}"#
        ),
        "the duration histogram starts at 0.01 s: {body}"
    );
    // The controllers' own API requests, by verb, resource and code: the cluster's status
    // written, its StatefulSet created by an apply (201), clusters watched.
    let series = [
        r#"pgkube_kube_client_requests_total{verb="patch",resource="postgresqlclusters/status",code="200"}"#,
        r#"pgkube_kube_client_requests_total{verb="patch",resource="statefulsets",code="201"}"#,
        r#"pgkube_kube_client_requests_total{verb="watch",resource="postgresqlclusters",code="200"}"#,
    ];
    wait_until(
        "the client request counts of a reconcile",
        Duration::from_secs(60),
        || async {
            let (_, body) = http_get(metrics, "/metrics").await?;
            Ok(series.iter().all(|s| body.contains(s)).then_some(()))
        },
    )
    .await
    .expect("client request metrics");
    assert_eq!(
        http_get(metrics, "/nothing-here").await.expect("404").0,
        404
    );

    manager.terminate();
    let code = manager.exit_code(Duration::from_secs(20)).await;
    assert_eq!(code, Some(0), "output:\n{}", manager.output().join("\n"));
    namespace.cleanup().await;
}

#[test]
fn without_any_kubernetes_configuration_it_says_so_and_exits_non_zero() {
    let home = std::env::temp_dir().join(format!("pgkube-no-home-{}", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_pgkube"))
        .args([
            "run",
            "--health-probe-bind-address",
            "0",
            "--metrics-bind-address",
            "0",
        ])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env("HOME", &home)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("running pgkube");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("no Kubernetes configuration found"),
        "{stderr}"
    );
    assert!(stderr.contains("KUBECONFIG"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("stack backtrace"), "{stderr}");
}
