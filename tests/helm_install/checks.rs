//! What the installed release must show at each step of `helm_install::scenario`.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use pgkube_crds::CLEANUP_FINALIZER;
use pgkube_testkit::{LOCAL_NODE, TestEnv, metric_samples, service_addresses, wait_until};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Release;
use crate::helm_common::{objects, the_object};

const STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// The release's manager pods that are not being deleted.
pub async fn manager_pods(client: &Client, release: &Release<'_>) -> anyhow::Result<Vec<Pod>> {
    let selector = format!(
        "app.kubernetes.io/instance={},app.kubernetes.io/component=manager",
        release.name
    );
    let pods = Api::<Pod>::namespaced(client.clone(), &release.namespace)
        .list(&ListParams::default().labels(&selector))
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .collect())
}

pub fn is_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Waits until the Lease `pgkube-leader` of the release's namespace is held by one of `pods`
/// (its holder identity is `<pod name>_<random>`).
pub async fn wait_leader_among(client: &Client, release: &Release<'_>, pods: &BTreeSet<String>) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &release.namespace);
    wait_until("a manager pod to lead", STEP_TIMEOUT, || async {
        let lease = leases.get("pgkube-leader").await?;
        let holder = lease
            .spec
            .and_then(|s| s.holder_identity)
            .unwrap_or_default();
        let pod = holder.rsplit_once('_').map(|(pod, _)| pod.to_owned());
        Ok(pod.filter(|pod| pods.contains(pod)))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

/// Two replicas, Ready, on the real node, one of them leading. Their names.
pub async fn managers_run_on_the_real_node(
    client: &Client,
    release: &Release<'_>,
) -> BTreeSet<String> {
    let pods = manager_pods(client, release).await.expect("manager pods");
    assert_eq!(pods.len(), 2, "two manager replicas");
    for pod in &pods {
        assert!(is_ready(pod), "{} is not Ready", pod.name_any());
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        assert_eq!(node, Some(LOCAL_NODE));
    }
    let names: BTreeSet<String> = pods.iter().map(ResourceExt::name_any).collect();
    wait_leader_among(client, release, &names).await;
    names
}

/// An AdmissionReview of the creation of a cluster without finalizers in `namespace`.
fn admission_review(namespace: &str) -> serde_json::Value {
    let kind = serde_json::json!({"group": "db.example.com", "version": "v1beta1", "kind": "PostgreSQLCluster"});
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0d5a3c2e-7b1f-4d8e-9a6b-1c2d3e4f5a6b",
            "kind": kind,
            "resource": {"group": "db.example.com", "version": "v1beta1", "resource": "postgresqlclusters"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "helm-chart-test"},
            "object": {
                "apiVersion": "db.example.com/v1beta1", "kind": "PostgreSQLCluster",
                "metadata": {"name": "probe", "namespace": namespace},
                "spec": {"replicas": 1, "postgresVersion": "15", "storage": {"size": "1Gi"}},
            },
        },
    })
}

/// POSTs `review` to `https://<host>/mutate` at `address`, trusting `ca_pem` for `host` only:
/// the webhook's answer.
async fn post_review(
    address: SocketAddr,
    host: &str,
    ca_pem: &str,
    review: &serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(certificate?)?;
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(address).await?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(host.to_owned())?, tcp)
        .await
        .with_context(|| format!("TLS to {address} as {host}"))?;
    let body = review.to_string();
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await?;
    tls.write_all(body.as_bytes()).await?;
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer).await?;
    let text = String::from_utf8_lossy(&answer);
    let (status, body) = text.split_once("\r\n\r\n").context("no HTTP head")?;
    anyhow::ensure!(status.starts_with("HTTP/1.1 200"), "{status}: {body}");
    Ok(serde_json::from_str(body)?)
}

/// The MutatingWebhookConfiguration the install's values render (the install itself registers
/// none: see `install_args`) trusts the CA and admits the watched namespace alone, through the
/// webhook Service; and every pod behind that Service serves the certificate for the Service's
/// name and puts the finalizer on a created cluster.
pub async fn the_webhook_serves_the_certificate(
    env: &TestEnv,
    client: &Client,
    release: &Release<'_>,
    install_args: &[String],
    watched: &str,
    ca_pem: &str,
) {
    let mut args: Vec<&str> = install_args.iter().map(String::as_str).collect();
    args.extend(["--set", "admissionWebhook.enabled=true"]);
    let rendered = objects(&crate::helm_common::template(
        env,
        &release.name,
        &release.namespace,
        &args,
    ));
    let registration = the_object(&rendered, "MutatingWebhookConfiguration", &release.name);
    let webhook = &registration["webhooks"][0];
    let bundle = &webhook["clientConfig"]["caBundle"];
    assert_eq!(json_bytes_text(bundle), ca_pem);
    let service = &webhook["clientConfig"]["service"];
    assert_eq!(service["namespace"], release.namespace.as_str());
    assert_eq!(service["name"], release.webhook_service().as_str());
    let selector = &webhook["namespaceSelector"]["matchExpressions"][0];
    assert_eq!(selector["values"], serde_json::json!([watched]));

    let addresses = service_addresses(client, &release.namespace, &release.webhook_service())
        .await
        .expect("the webhook Service's pods");
    assert_eq!(addresses.len(), 2, "{addresses:?}");
    for address in addresses {
        let answer = post_review(
            address,
            &release.webhook_host(),
            ca_pem,
            &admission_review(watched),
        )
        .await
        .unwrap_or_else(|e| panic!("the webhook at {address}: {e:#}"));
        let response = &answer["response"];
        assert_eq!(response["allowed"], true, "{answer}");
        let patch = json_bytes_text(&response["patch"]);
        assert!(patch.contains(CLEANUP_FINALIZER), "{patch}");
    }
}

/// Bytes in JSON, as text: base64 (a `caBundle`), or an array of numbers (an AdmissionResponse's
/// `patch` as pgkube writes it; the API server's decoder takes both).
fn json_bytes_text(patch: &serde_json::Value) -> String {
    let bytes: Vec<u8> = match patch {
        serde_json::Value::String(_) => {
            let decoded: k8s_openapi::ByteString =
                serde_json::from_value(patch.clone()).expect("base64");
            decoded.0
        }
        other => {
            serde_json::from_value(other.clone()).unwrap_or_else(|_| panic!("no patch: {other}"))
        }
    };
    String::from_utf8(bytes).expect("UTF-8")
}

/// The label selector (`k=v,...`) of a rendered monitor's `spec.selector.matchLabels`.
fn selector_of(monitor: &serde_json::Value) -> String {
    let labels = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels");
    let pairs: Vec<String> = labels
        .iter()
        .map(|(key, value)| format!("{key}={}", value.as_str().expect("a label value")))
        .collect();
    pairs.join(",")
}

/// The namespaces a rendered monitor's `namespaceSelector.matchNames` names.
fn namespaces_of(monitor: &serde_json::Value) -> Vec<String> {
    let names = monitor["spec"]["namespaceSelector"]["matchNames"]
        .as_array()
        .expect("matchNames");
    names
        .iter()
        .map(|name| name.as_str().expect("a name").to_owned())
        .collect()
}

/// The chart's PodMonitor and ServiceMonitor, rendered with the install's values, select what
/// serves metrics (the test bed has no prometheus-operator to scrape them: this does).
pub async fn the_monitors_find_targets(
    env: &TestEnv,
    client: &Client,
    release: &Release<'_>,
    install_args: &[String],
) {
    let mut args: Vec<&str> = install_args.iter().map(String::as_str).collect();
    args.extend([
        "--set",
        "podMonitor.enabled=true,serviceMonitor.enabled=true",
    ]);
    let rendered = objects(&crate::helm_common::template(
        env,
        &release.name,
        &release.namespace,
        &args,
    ));
    the_pod_monitor_finds_postgresql(client, &rendered, release).await;
    the_service_monitor_finds_the_managers(client, &rendered, release).await;
}

/// Every pod the PodMonitor selects serves PostgreSQL's metrics at the port it names; it
/// selects some.
async fn the_pod_monitor_finds_postgresql(
    client: &Client,
    rendered: &[serde_json::Value],
    release: &Release<'_>,
) {
    let pod_monitor = the_object(
        rendered,
        "PodMonitor",
        &format!("{}-postgresql", release.name),
    );
    let endpoint = &pod_monitor["spec"]["podMetricsEndpoints"][0];
    let port = endpoint["port"].as_str().expect("a port");
    // The dashboard and the alerts group instances by a `cluster` label, from this pod label.
    assert_eq!(
        endpoint["relabelings"],
        serde_json::json!([{
            "sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
            "targetLabel": "cluster",
        }]),
        "{pod_monitor}"
    );
    let mut scraped = 0;
    for namespace in namespaces_of(pod_monitor) {
        let pods = Api::<Pod>::namespaced(client.clone(), &namespace)
            .list(&ListParams::default().labels(&selector_of(pod_monitor)))
            .await
            .expect("pods");
        for pod in pods.items {
            let instance = pod.labels().get("app.kubernetes.io/instance");
            assert!(
                instance.is_some_and(|cluster| pod.name_any().starts_with(&format!("{cluster}-"))),
                "{}'s cluster label source: {instance:?}",
                pod.name_any()
            );
            let address = metrics_address(&pod, port);
            let samples = metric_samples(address).await.expect("PostgreSQL's metrics");
            assert_eq!(samples.get("pgkube_postgres_up"), Some(&1.0), "{address}");
            scraped += 1;
        }
    }
    assert!(scraped > 0, "the PodMonitor selects no pod");
}

/// The ServiceMonitor selects the manager's metrics Service, which leads to both managers, one
/// of them the leader.
async fn the_service_monitor_finds_the_managers(
    client: &Client,
    rendered: &[serde_json::Value],
    release: &Release<'_>,
) {
    let service_monitor = the_object(rendered, "ServiceMonitor", &release.name);
    assert_eq!(namespaces_of(service_monitor), [release.namespace.as_str()]);
    let services = Api::<Service>::namespaced(client.clone(), &release.namespace)
        .list(&ListParams::default().labels(&selector_of(service_monitor)))
        .await
        .expect("Services");
    let endpoint = &service_monitor["spec"]["endpoints"][0];
    let port = endpoint["port"].as_str().expect("a port");
    // The manager's per-cluster series keep their clusters' namespace.
    assert_eq!(endpoint["honorLabels"], true, "{service_monitor}");
    let scraped: Vec<String> = services
        .items
        .iter()
        .filter(|s| {
            let ports = s.spec.as_ref().and_then(|spec| spec.ports.as_ref());
            ports
                .into_iter()
                .flatten()
                .any(|p| p.name.as_deref() == Some(port))
        })
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(scraped, [format!("{}-metrics", release.name)]);
    let addresses = service_addresses(client, &release.namespace, &scraped[0])
        .await
        .expect("the metrics Service's pods");
    assert_eq!(addresses.len(), 2);
    let mut leading = 0.0;
    for address in addresses {
        let samples = metric_samples(address)
            .await
            .expect("the manager's metrics");
        let status = samples
            .iter()
            .find(|(series, _)| series.starts_with("leader_election_master_status"))
            .unwrap_or_else(|| panic!("no leader status at {address}"));
        leading += status.1;
    }
    assert_eq!(leading, 1.0, "one manager leads");
}

/// The pod's address at its container port named `port`.
fn metrics_address(pod: &Pod, port: &str) -> SocketAddr {
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_ref())
        .expect("a pod IP");
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let number = containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(port))
        .map(|p| p.container_port)
        .unwrap_or_else(|| panic!("{} has no port {port}", pod.name_any()));
    SocketAddr::new(
        ip.parse().expect("an IP"),
        u16::try_from(number).expect("a port"),
    )
}
