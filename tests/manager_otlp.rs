//! Traces leave the real `pgkube run` process by OTLP when the standard `OTEL_*` variables ask
//! for it, and the spans still buffered at SIGTERM are flushed before it exits.
//!
//! The collector here is a minimal OTLP/HTTP receiver on loopback that keeps every request body
//! of `POST /v1/traces`; protobuf keeps strings as plain UTF-8, so span names, attribute values
//! and the service name can be found in the bytes without decoding.

mod manager_common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use kube::api::Api;
use manager_common::{Manager, RUNNING_TIMEOUT, create_cluster};
use pgkube_crds::PostgreSQLCluster;
use pgkube_testkit::{TestNamespace, install_crds, testbed, wait_for_cluster};

type Received = Arc<Mutex<Vec<Bytes>>>;

/// Starts the receiver; its address and what it received.
async fn start_collector() -> (SocketAddr, Received) {
    let received = Received::default();
    let app = Router::new()
        .route("/v1/traces", post(collect))
        .with_state(Arc::clone(&received));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("collector binds");
    let address = listener.local_addr().expect("collector address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (address, received)
}

async fn collect(State(received): State<Received>, body: Bytes) -> &'static [u8] {
    received.lock().expect("lock").push(body);
    // An empty ExportTraceServiceResponse encodes to zero bytes.
    b""
}

fn received_contains(received: &Received, needle: &str) -> bool {
    received.lock().expect("lock").iter().any(|body| {
        body.windows(needle.len())
            .any(|window| window == needle.as_bytes())
    })
}

#[tokio::test]
async fn reconcile_traces_are_exported_by_otlp_and_flushed_on_sigterm() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let (collector, received) = start_collector().await;
    let namespace = TestNamespace::create(&client, "manager-otlp").await;
    let endpoint = format!("http://{collector}");
    let mut manager = Manager::start_with_env(
        &env,
        "manager-otlp",
        &["--watch-namespaces", namespace.name()],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
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
        received_contains(&received, "reconcile"),
        "no `reconcile` span reached the collector ({} requests)",
        received.lock().expect("lock").len()
    );
    for expected in ["pgkube", "traced", namespace.name(), "apply", "status"] {
        assert!(
            received_contains(&received, expected),
            "the exported spans do not mention `{expected}`"
        );
    }
    namespace.cleanup().await;
}
