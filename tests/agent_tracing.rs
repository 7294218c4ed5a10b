//! The real `pgkube agent` exports its spans by OTLP when the `OTEL_*` variables ask for it,
//! as part of the trace that `TRACEPARENT` names, flushes them before it exits (success or
//! failure, an unreachable collector included, within a bounded time), and reaches an
//! `https://` collector whose CA is given by `OTEL_EXPORTER_OTLP_CERTIFICATE`.
//!
//! The collector is the test kit's loopback OTLP/HTTP receiver; the export requests it kept are
//! decoded with `opentelemetry-proto`. Failures are made fast with a server-side encryption
//! setting the agent refuses before any network request, so those tests need no test bed.

mod agent_common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use agent_common::{Agent, Scratch, clear_trace_variables, work_dir};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use pgkube_testkit::otlp::{OtlpReceiver, decode_hex};
use pgkube_testkit::testbed;
use prost::Message;

const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const PARENT_SPAN_ID: &str = "b7ad6b7169203331";

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01")
}

/// One exported span with the service name of its resource.
struct Exported {
    service: String,
    span: Span,
}

impl Exported {
    fn attribute(&self, key: &str) -> Option<String> {
        let value = self
            .span
            .attributes
            .iter()
            .find(|attribute| attribute.key == key)?
            .value
            .as_ref()?
            .value
            .as_ref()?;
        Some(match value {
            Value::StringValue(text) => text.clone(),
            Value::IntValue(number) => number.to_string(),
            Value::BoolValue(flag) => flag.to_string(),
            other => format!("{other:?}"),
        })
    }
}

/// Every span the receiver got, decoded.
fn exported(receiver: &OtlpReceiver) -> Vec<Exported> {
    let mut spans = Vec::new();
    for body in receiver.bodies() {
        let request = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP protobuf");
        for resource_spans in request.resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|resource| &resource.attributes)
                .find(|attribute| attribute.key == "service.name")
                .and_then(|attribute| attribute.value.as_ref()?.value.as_ref())
                .map(|value| match value {
                    Value::StringValue(text) => text.clone(),
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            for scope_spans in resource_spans.scope_spans {
                for span in scope_spans.spans {
                    spans.push(Exported {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
    }
    spans
}

fn named<'a>(spans: &'a [Exported], name: &str) -> Vec<&'a Exported> {
    spans.iter().filter(|span| span.span.name == name).collect()
}

fn names(spans: &[Exported]) -> Vec<String> {
    spans.iter().map(|span| span.span.name.clone()).collect()
}

/// The agent, with a setting it refuses before any network request, so that it fails fast;
/// `env` is all it gets of trace context and `OTEL_*` variables.
async fn failing_agent(subcommand: &str, work: &Path, env: &[(&str, &str)]) -> Output {
    let termination: PathBuf = work.join(format!("termination-{subcommand}"));
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgkube"));
    command
        .args(["agent", subcommand, "--backup-name", "traced-backup"])
        .args(["--s3-bucket", "some-bucket", "--s3-sse", "not-an-algorithm"])
        .arg("--termination-message-path")
        .arg(&termination);
    if subcommand == "backup" {
        command.args(["--cluster", "traced-cluster", "--namespace", "traced-ns"]);
        command.args([
            "--cluster-uid",
            "traced-cluster-uid",
            "--backup-uid",
            "traced-uid",
        ]);
    }
    clear_trace_variables(&mut command);
    command.envs(env.iter().copied());
    command.output().await.expect("running pgkube agent")
}

fn assert_refused(output: &Output) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "stdout: {stdout}");
    assert!(
        stdout.contains("\"status\":\"Failed\"") && stdout.contains("not-an-algorithm"),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_exports_its_spans_into_the_trace_of_traceparent() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "tracing").await;
    let receiver = OtlpReceiver::http().await;
    let mut agent = Agent::new(&env, scratch.bucket.name(), "traced", &scratch.work);
    agent.env = vec![
        ("TRACEPARENT".into(), traceparent()),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
            receiver.endpoint.clone(),
        ),
    ];

    let outcome = agent
        .backup("b1", &["--database", scratch.database.name()])
        .await;
    outcome.assert_completed();

    // The process has exited: whatever it exported is already here.
    let spans = exported(&receiver);
    let roots = named(&spans, "agent.backup");
    assert_eq!(roots.len(), 1, "spans: {:?}", names(&spans));
    let root = roots[0];
    assert_eq!(root.span.parent_span_id, decode_hex(PARENT_SPAN_ID));
    assert_eq!(root.service, "pgkube-agent");
    assert_eq!(root.attribute("backup").as_deref(), Some("b1"));
    assert_eq!(root.attribute("cluster").as_deref(), Some("main"));
    assert_eq!(root.attribute("namespace").as_deref(), Some("agent-tests"));
    assert_eq!(
        root.attribute("bucket").as_deref(),
        Some(scratch.bucket.name())
    );
    assert_ne!(
        root.span.status.as_ref().map(|status| status.code),
        Some(StatusCode::Error as i32)
    );
    for span in &spans {
        assert_eq!(
            span.span.trace_id,
            decode_hex(TRACE_ID),
            "{}",
            span.span.name
        );
    }
    for step in ["globals", "database", "manifest"] {
        let children = named(&spans, step);
        assert_eq!(children.len(), 1, "{step}: {:?}", names(&spans));
        assert_eq!(children[0].span.parent_span_id, root.span.span_id, "{step}");
    }
    assert_eq!(
        named(&spans, "database")[0]
            .attribute("database")
            .as_deref(),
        Some(scratch.database.name())
    );
    scratch.cleanup().await;
}

#[tokio::test]
async fn a_failed_run_exports_and_flushes_its_spans_with_the_error() {
    let receiver = OtlpReceiver::http().await;
    let work = work_dir("tracing-failed");
    let traceparent = traceparent();
    for subcommand in ["backup", "restore"] {
        let output = failing_agent(
            subcommand,
            &work,
            &[
                ("TRACEPARENT", traceparent.as_str()),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()),
                ("OTEL_SERVICE_NAME", "agent-under-test"),
            ],
        )
        .await;
        assert_refused(&output);
        let spans = exported(&receiver);
        let name = format!("agent.{subcommand}");
        let roots = named(&spans, &name);
        assert_eq!(roots.len(), 1, "{name}: {:?}", names(&spans));
        let root = roots[0];
        assert_eq!(root.span.trace_id, decode_hex(TRACE_ID));
        assert_eq!(root.span.parent_span_id, decode_hex(PARENT_SPAN_ID));
        assert_eq!(root.service, "agent-under-test");
        assert_eq!(root.attribute("backup").as_deref(), Some("traced-backup"));
        let status = root.span.status.as_ref().expect("a status");
        assert_eq!(status.code, StatusCode::Error as i32, "{status:?}");
        assert!(status.message.contains("not-an-algorithm"), "{status:?}");
    }
    let spans = exported(&receiver);
    let backup = named(&spans, "agent.backup")[0];
    assert_eq!(
        backup.attribute("cluster").as_deref(),
        Some("traced-cluster")
    );
    assert_eq!(backup.attribute("namespace").as_deref(), Some("traced-ns"));
    let _ = std::fs::remove_dir_all(work);
}

#[tokio::test]
async fn without_traceparent_the_spans_start_a_new_trace() {
    let receiver = OtlpReceiver::http().await;
    let work = work_dir("tracing-new-trace");
    for traceparent in [None, Some("not-a-traceparent")] {
        let mut env = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str())];
        env.extend(traceparent.map(|value| ("TRACEPARENT", value)));
        let before = receiver.requests();
        let output = failing_agent("backup", &work, &env).await;
        assert_refused(&output);
        assert!(
            receiver.requests() > before,
            "{traceparent:?}: nothing exported"
        );
    }
    let spans = exported(&receiver);
    let roots = named(&spans, "agent.backup");
    assert_eq!(roots.len(), 2, "{:?}", names(&spans));
    for root in &roots {
        assert!(
            root.span.parent_span_id.is_empty(),
            "a root span has no parent"
        );
        assert_eq!(root.span.trace_id.len(), 16);
        assert_ne!(root.span.trace_id, decode_hex(TRACE_ID));
    }
    assert_ne!(roots[0].span.trace_id, roots[1].span.trace_id);
    let _ = std::fs::remove_dir_all(work);
}

#[tokio::test]
async fn spans_reach_an_https_collector_through_its_private_ca() {
    let work = work_dir("tracing-https");
    let receiver = OtlpReceiver::https(&work).await;
    let ca = receiver.ca_bundle.clone().expect("CA bundle");
    let traceparent = traceparent();
    let output = failing_agent(
        "backup",
        &work,
        &[
            ("TRACEPARENT", traceparent.as_str()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca.display().to_string()),
        ],
    )
    .await;
    assert_refused(&output);
    let spans = exported(&receiver);
    let roots = named(&spans, "agent.backup");
    assert_eq!(roots.len(), 1, "{:?}", names(&spans));
    assert_eq!(roots[0].span.trace_id, decode_hex(TRACE_ID));
    assert_eq!(receiver.handshakes().failed, 0);
    let _ = std::fs::remove_dir_all(work);
}

#[tokio::test]
async fn an_https_collector_outside_the_trusted_roots_gets_nothing_and_holds_nothing_up() {
    let work = work_dir("tracing-untrusted");
    let receiver = OtlpReceiver::https(&work).await;
    let started = Instant::now();
    // The system's roots do not include the receiver's fresh CA.
    let output = failing_agent(
        "backup",
        &work,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str())],
    )
    .await;
    assert_refused(&output);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(receiver.requests(), 0);
    let handshakes = receiver.handshakes();
    assert!(handshakes.failed >= 1, "no TLS handshake was tried");
    assert_eq!(handshakes.succeeded, 0);
    let _ = std::fs::remove_dir_all(work);
}

#[tokio::test]
async fn a_collector_that_never_answers_delays_the_exit_by_the_flush_timeout_at_most() {
    // Accepts connections and never answers, as a collector behind a broken network would.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding");
    let endpoint = format!("http://{}", listener.local_addr().expect("address"));
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let work = work_dir("tracing-silent");
    let started = Instant::now();
    let output = failing_agent(
        "backup",
        &work,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            // Longer than the flush timeout: the flush, not the request, must give up.
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000"),
        ],
    )
    .await;
    let elapsed = started.elapsed();
    assert_refused(&output);
    // The flush waits 5 s (pgkube::telemetry::FLUSH_TIMEOUT); the rest is start-up.
    assert!(elapsed < Duration::from_secs(9), "exit took {elapsed:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("flushing traces failed"),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    silent.abort();
    let _ = std::fs::remove_dir_all(work);
}

/// gRPC over TLS: the receiver speaks OTLP/HTTP only, so no export succeeds, but its side of
/// the TLS handshake shows whether the exporter trusted it: with the CA from
/// `OTEL_EXPORTER_OTLP_CERTIFICATE`, and not with the system's roots alone.
#[tokio::test]
async fn grpc_exports_verify_an_https_collector_against_the_given_ca() {
    let work = work_dir("tracing-grpc-tls");
    for trust_ca in [true, false] {
        let receiver = OtlpReceiver::https(&work).await;
        let ca = receiver
            .ca_bundle
            .clone()
            .expect("CA bundle")
            .display()
            .to_string();
        let mut env = vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ];
        if trust_ca {
            env.push(("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_str()));
        }
        let output = failing_agent("backup", &work, &env).await;
        assert_refused(&output);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("traces are not exported"), "{stderr}");
        let handshakes = receiver.handshakes();
        if trust_ca {
            assert!(handshakes.succeeded >= 1, "{handshakes:?}");
            assert_eq!(handshakes.failed, 0, "{handshakes:?}");
        } else {
            assert_eq!(handshakes.succeeded, 0, "{handshakes:?}");
            assert!(handshakes.failed >= 1, "{handshakes:?}");
        }
    }
    let _ = std::fs::remove_dir_all(work);
}

#[tokio::test]
async fn a_missing_collector_certificate_costs_the_traces_not_the_run() {
    let work = work_dir("tracing-no-certificate");
    let receiver = OtlpReceiver::https(&work).await;
    let output = failing_agent(
        "backup",
        &work,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/otlp-ca.pem"),
        ],
    )
    .await;
    // The run ends for its own reason, and stderr says why no span left.
    assert_refused(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("traces are not exported") && stderr.contains("/nonexistent/otlp-ca.pem"),
        "{stderr}"
    );
    assert_eq!(
        receiver.handshakes().succeeded + receiver.handshakes().failed,
        0
    );
    let _ = std::fs::remove_dir_all(work);
}
