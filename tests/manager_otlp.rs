//! Traces leave the real `pgkube run` process by OTLP when the standard `OTEL_*` variables ask
//! for it, and the spans still buffered at SIGTERM are flushed before it exits.
//!
//! The collector here is the test kit's loopback OTLP/HTTP receiver
//! ([`pgkube_testkit::otlp::OtlpReceiver`]), which keeps every request body of
//! `POST /v1/traces`; protobuf keeps strings as plain UTF-8, so span names, attribute values
//! and the service name can be found in the bytes without decoding.

mod manager_common;

use std::time::Duration;

use kube::api::Api;
use manager_common::{Manager, RUNNING_TIMEOUT, create_cluster};
use pgkube_crds::PostgreSQLCluster;
use pgkube_testkit::otlp::OtlpReceiver;
use pgkube_testkit::{TestNamespace, install_crds, testbed, wait_for_cluster};

#[tokio::test]
async fn reconcile_traces_are_exported_by_otlp_and_flushed_on_sigterm() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let collector = OtlpReceiver::http().await;
    let namespace = TestNamespace::create(&client, "manager-otlp").await;
    let mut manager = Manager::start_with_env(
        &env,
        "manager-otlp",
        &["--watch-namespaces", namespace.name()],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ],
    );

    let clusters: Api<PostgreSQLCluster> = Api::namespaced(client.clone(), namespace.name());
    create_cluster(&clusters, "traced", 1).await;
    // The pod is on a simulated (kwok) node, where no instance manager answers, so the cluster
    // never reaches Running; a ready StatefulSet proves the reconciles this test traces.
    wait_for_cluster(
        &client,
        namespace.name(),
        "traced",
        "1 ready replica",
        RUNNING_TIMEOUT,
        |cluster| {
            cluster
                .status
                .as_ref()
                .is_some_and(|s| s.ready_replicas == 1)
        },
    )
    .await
    .expect("cluster reconciled to a ready StatefulSet");

    manager.terminate();
    let code = manager.exit_code(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "output:\n{}", manager.output().join("\n"));

    assert!(
        collector.contains(b"reconcile"),
        "no `reconcile` span reached the collector ({} requests)",
        collector.requests()
    );
    for expected in ["pgkube", "traced", namespace.name(), "apply", "status"] {
        assert!(
            collector.contains(expected.as_bytes()),
            "the exported spans do not mention `{expected}`"
        );
    }
    namespace.cleanup().await;
}
