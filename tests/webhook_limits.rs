//! The webhook of a real `pgkube run` under input a pod could send it: a 30 MiB body gets a 413
//! without the manager's memory growing by the body, and connections beyond the cap wait
//! until a slot frees instead of each costing the manager a task and buffers.

mod manager_common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use manager_common::Manager;
use pgkube_testkit::{TestCa, TestNamespace, testbed};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The connections the webhook serves at once (`webhook/serve.rs`).
const MAX_CONNECTIONS: usize = 64;

/// A TLS connection to the webhook at `address`, trusting `ca`.
async fn connect(address: SocketAddr, ca: &str) -> tokio_rustls::client::TlsStream<TcpStream> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(certificate.expect("a CA")).expect("a root");
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(address).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    connector.connect(name, tcp).await.expect("handshake")
}

/// POSTs `length` bytes of spaces to `/convert`; the response's status line.
async fn post_spaces(address: SocketAddr, ca: &str, length: usize) -> String {
    let tls = connect(address, ca).await;
    let (mut reading, mut writing) = tokio::io::split(tls);
    let head = format!(
        "POST /convert HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\nConnection: close\r\n\r\n"
    );
    // The server may answer and close before the whole body is sent: the write's end is moot.
    let sending = tokio::spawn(async move {
        writing.write_all(head.as_bytes()).await?;
        let chunk = vec![b' '; 1 << 20];
        let mut left = length;
        while left > 0 {
            let count = left.min(chunk.len());
            writing.write_all(&chunk[..count]).await?;
            left -= count;
        }
        writing.flush().await
    });
    let mut response = Vec::new();
    let _ = reading.read_to_end(&mut response).await;
    sending.abort();
    String::from_utf8_lossy(&response)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The manager's peak resident memory (`VmHWM`), KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches(" kB").trim().parse().ok())
        .expect("VmHWM")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_body_gets_a_413_and_connections_beyond_the_cap_wait() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    let namespace = TestNamespace::create(&client, "webhook-limits").await;
    let ca = TestCa::new();
    let dir = ca.serving_certificate_dir("webhook-limits");
    let manager = Manager::start(
        &env,
        "manager-webhook-limits",
        &[
            "--watch-namespaces",
            namespace.name(),
            "--webhook-bind-address",
            "127.0.0.1:0",
            "--webhook-cert-dir",
            &dir.to_string_lossy(),
        ],
    );
    let address = manager.endpoint("webhook").await;
    let ca_pem = ca.pem();

    let small = post_spaces(address, &ca_pem, 16).await;
    assert!(small.starts_with("HTTP/1.1 400"), "{small}");
    let before = peak_rss_kib(manager.pid());
    let huge = post_spaces(address, &ca_pem, 30 << 20).await;
    assert!(huge.starts_with("HTTP/1.1 413"), "{huge}");
    let grown_kib = peak_rss_kib(manager.pid()).saturating_sub(before);
    assert!(
        grown_kib < 10 << 10,
        "the manager's peak memory grew by {grown_kib} KiB for a body it refused"
    );

    // Every slot held by a connection that never even starts its handshake...
    let mut idle = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        idle.push(TcpStream::connect(address).await.expect("connect"));
    }
    let waiting = tokio::spawn({
        let ca_pem = ca_pem.clone();
        async move { post_spaces(address, &ca_pem, 16).await }
    });
    // ...the next client is not served while they stay...
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiting.is_finished(), "served beyond the connection cap");
    // ...and is as soon as they go.
    drop(idle);
    let served = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("served once the slots are free")
        .expect("the request task");
    assert!(served.starts_with("HTTP/1.1 400"), "{served}");

    manager.terminate();
    drop(namespace);
    let _ = std::fs::remove_dir_all(&dir);
}
