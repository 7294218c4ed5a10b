//! The real `pgkube run` process: its endpoints against the test bed, its graceful stop, and
//! its start-up error without any Kubernetes configuration.

mod manager_common;

use std::process::Command;
use std::time::Duration;

use manager_common::{Manager, http_get, install_crds};
use pgkube_testkit::{testbed, wait_until};

#[tokio::test]
async fn serves_probes_and_metrics_then_stops_on_sigterm() {
    let Some(env) = testbed() else { return };
    install_crds(&env);
    let mut manager = Manager::start(
        &env,
        "manager-endpoints",
        &["--shutdown-grace-period", "10s"],
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

    // The reconcile metrics get series with the first reconcile (prometheus-client leaves
    // families without series out), so here only the endpoint and its format are checked;
    // the unit test of the metrics handler checks both reconcile metrics.
    let (status, body) = http_get(metrics, "/metrics").await.expect("metrics");
    assert_eq!(status, 200);
    assert!(body.ends_with("# EOF\n"), "not OpenMetrics text: {body}");
    assert_eq!(
        http_get(metrics, "/nothing-here").await.expect("404").0,
        404
    );

    manager.terminate();
    let code = manager.exit_code(Duration::from_secs(20)).await;
    assert_eq!(code, Some(0), "output:\n{}", manager.output().join("\n"));
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
