//! One trace per reconcile: the root span `reconcile` with its attributes, one child span per
//! pipeline step, and the trace id in the JSON log lines of that reconcile.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use kube::api::PostParams;
use kube::{Api, ResourceExt};
use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use pgkube_controllers::cluster::{ClusterContext, reconcile};
use pgkube_controllers::{Context, Metrics, Settings};
use pgkube_crds::PostgreSQLCluster;
use pgkube_testkit::TestNamespace;
use tracing_subscriber::layer::SubscriberExt;

/// Log output captured in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut buffer) = self.0.lock() {
            buffer.extend_from_slice(bytes);
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

// A current-thread runtime: the thread-local subscriber below sees every span of the test.
#[tokio::test(flavor = "current_thread")]
async fn each_reconcile_is_one_trace_with_a_span_per_step_and_the_trace_id_in_logs() {
    let Some(env) = pgkube_testkit::testbed() else {
        return;
    };
    let client = env.kube_client().await;
    pgkube_testkit::install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "cluster-trace").await;

    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let logs = Captured::default();
    let log_writer = logs.clone();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
        .with(
            tracing_subscriber::fmt::layer()
                .json()
                .with_writer(move || log_writer.clone()),
        );
    let _guard = tracing::subscriber::set_default(subscriber);

    let clusters: Api<PostgreSQLCluster> = Api::namespaced(client.clone(), namespace.name());
    let mut cluster: PostgreSQLCluster = serde_yaml::from_str(common::SAMPLE).expect("sample");
    cluster.metadata.name = Some("traced".to_owned());
    cluster.spec.backup = None;
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("created");
    let mut registry = prometheus_client::registry::Registry::default();
    let (context, fill_caches) = ClusterContext::new(Context {
        client: client.clone(),
        events: client.clone(),
        settings: Arc::new(Settings::default()),
        metrics: Arc::new(Metrics::register(&mut registry)),
    })
    .with_caches_of(namespace.name());
    let caches = tokio::spawn(fill_caches);
    let context = Arc::new(context);
    // The first reconcile only adds the finalizer; the second runs the pipeline.
    for _ in 0..2 {
        let latest = clusters.get("traced").await.expect("cluster");
        reconcile(Arc::new(latest), context.clone())
            .await
            .expect("reconcile succeeds");
    }
    provider.force_flush().expect("flush");

    let spans = exporter.get_finished_spans().expect("spans");
    let roots: Vec<&SpanData> = spans.iter().filter(|s| s.name == "reconcile").collect();
    assert_eq!(roots.len(), 2, "one root per reconcile");
    assert_ne!(
        roots[0].span_context.trace_id(),
        roots[1].span_context.trace_id(),
        "one trace each"
    );
    let root = roots[1];
    assert_eq!(
        root.parent_span_id,
        SpanId::INVALID,
        "reconcile is the trace's root"
    );
    let trace_id = root.span_context.trace_id().to_string();
    assert_eq!(attribute(root, "controller").as_deref(), Some("cluster"));
    assert_eq!(
        attribute(root, "namespace").as_deref(),
        Some(namespace.name())
    );
    assert_eq!(attribute(root, "name").as_deref(), Some("traced"));
    assert_eq!(attribute(root, "trigger").as_deref(), Some("spec-change"));
    assert_eq!(
        attribute(root, "trace_id").as_deref(),
        Some(trace_id.as_str())
    );
    let children: Vec<&str> = spans
        .iter()
        .filter(|s| s.parent_span_id == root.span_context.span_id())
        .map(|s| s.name.as_ref())
        .collect();
    assert_eq!(
        children,
        [
            "read",
            "validate",
            "certificates",
            "build",
            "apply",
            "status"
        ]
    );
    assert!(
        spans
            .iter()
            .filter(|s| s.span_context.trace_id() == root.span_context.trace_id())
            .count()
            >= 6
    );

    let logs = String::from_utf8(logs.0.lock().expect("logs").clone()).expect("utf-8 logs");
    let applying: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("\"applying\""))
        .collect();
    assert!(!applying.is_empty(), "no apply log line in:\n{logs}");
    for line in applying {
        assert!(
            line.contains(&format!("\"trace_id\":\"{trace_id}\"")),
            "{line}"
        );
    }

    // Delete: the reconcile of a deleted cluster removes the finalizer.
    clusters
        .delete("traced", &Default::default())
        .await
        .expect("delete asked");
    let deleted = clusters
        .get("traced")
        .await
        .expect("still there until cleanup");
    assert!(
        deleted
            .finalizers()
            .iter()
            .any(|f| f == "db.example.com/cleanup")
    );
    reconcile(Arc::new(deleted), context.clone())
        .await
        .expect("cleanup succeeds");
    assert!(clusters.get_opt("traced").await.expect("read").is_none());
    caches.abort();
    namespace.cleanup().await;
}
