//! The status port served for real, on 127.0.0.1, plain and TLS: the access rules as clients
//! see them, the certificate verified against the cluster's CA, and a renewed certificate
//! served without a restart.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use pgkube_controllers::pki::{self, Issued};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::peer::PeerStatus;
use super::*;
use crate::tls::serving::CertificateFiles;

const TOKEN: &str = "s3cr3t";
/// The name the operator asks for: a pod's host name, under the certificate's wildcard.
const POD_HOST: &str = "x-0.h.ns.svc";

/// A pod's directories, removed when dropped.
struct Pod {
    root: PathBuf,
}

impl Pod {
    fn new(name: &str) -> Self {
        static COUNT: AtomicU32 = AtomicU32::new(0);
        let root = std::env::temp_dir().join(format!(
            "pgkube-endpoint-{name}-{}-{}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        ));
        for dir in ["mounted", "runtime", "control", "pgdata", "s3"] {
            std::fs::create_dir_all(root.join(dir)).expect("temp dir");
        }
        std::fs::write(root.join("control/token"), format!("{TOKEN}\n")).expect("token");
        Self { root }
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Mounts `ca` and a server certificate it signs, and installs them as the manager does.
    fn mount(&self, ca: &Issued) -> Issued {
        let hosts = ["*.h.ns.svc".to_owned(), "localhost".to_owned()];
        let server = pki::issue_server(ca, &hosts, now(), time::Duration::days(1)).expect("cert");
        let mounted = self.dir("mounted");
        std::fs::write(mounted.join("ca.crt"), &ca.cert_pem).expect("ca.crt");
        std::fs::write(mounted.join("tls.crt"), &server.cert_pem).expect("tls.crt");
        std::fs::write(mounted.join("tls.key"), &server.key_pem).expect("tls.key");
        crate::tls::copy_private(&mounted, &self.dir("runtime")).expect("installed");
        server
    }

    /// Serves the endpoint of this pod on a port of its own.
    async fn serve(&self) -> SocketAddr {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let shared = Shared {
            board: Board::new(InstanceStatus::starting("x-0"), Duration::from_secs(2)),
            control: Arc::new(Control {
                token_file: self.dir("control/token"),
                topology_file: self.dir("config/instance.json"),
                pod: "x-0".to_owned(),
                requests: tokio::sync::mpsc::channel(1).0,
            }),
            archiver: Archiver::new(&self.dir("pgdata"), &self.dir("s3")),
            binary: ManagerBinary::current().expect("binary"),
            tls_dir: Arc::new(self.dir("mounted")),
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let certificates = Arc::new(CertificateFiles::new(&self.dir("runtime")));
        tokio::spawn(listener::serve(listener, router(shared), certificates));
        address
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

fn new_ca(name: &str) -> Issued {
    pki::new_ca(name, now(), time::Duration::days(2)).expect("CA")
}

fn der(issued: &Issued) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).expect("PEM")
}

/// Sends `method path` with `token`, if any, and reads the response: its status and body.
async fn exchange<S>(mut stream: S, request: &str, token: Option<&str>) -> (u16, String)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let authorization = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!(
        "{request} HTTP/1.1\r\nHost: {POD_HOST}\r\n{authorization}Content-Length: 0\r\n\
         Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let code = response
        .get(9..12)
        .and_then(|code| code.parse().ok())
        .expect("a status line");
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    (code, body.to_owned())
}

async fn plain(address: SocketAddr, request: &str) -> (u16, String) {
    let stream = TcpStream::connect(address).await.expect("connect");
    exchange(stream, request, None).await
}

/// A TLS connection trusting `ca` only, to [`POD_HOST`]: the server's certificate, or the
/// handshake's error.
async fn connect_tls(
    address: SocketAddr,
    ca: &Issued,
) -> std::io::Result<(
    CertificateDer<'static>,
    tokio_rustls::client::TlsStream<TcpStream>,
)> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der(ca)).expect("root");
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(address).await?;
    let name = ServerName::try_from(POD_HOST).expect("name");
    let tls = connector.connect(name, tcp).await?;
    let served = tls.get_ref().1.peer_certificates().expect("peer")[0].clone();
    Ok((served, tls))
}

async fn over_tls(
    address: SocketAddr,
    ca: &Issued,
    request: &str,
    token: Option<&str>,
) -> (u16, String) {
    let (_, tls) = connect_tls(address, ca).await.expect("handshake");
    exchange(tls, request, token).await
}

#[tokio::test]
async fn with_certificates_status_and_control_are_tls_only_and_status_needs_the_token() {
    let pod = Pod::new("rules");
    let ca = new_ca("cluster CA");
    pod.mount(&ca);
    let address = pod.serve().await;

    for probe in ["GET /healthz", "GET /metrics"] {
        assert_eq!(plain(address, probe).await.0, 200, "{probe} plain");
        assert_eq!(
            over_tls(address, &ca, probe, None).await.0,
            200,
            "{probe} TLS"
        );
    }
    assert_eq!(
        plain(address, "GET /readyz").await.0,
        503,
        "not ready, and no 403"
    );
    for request in [
        "GET /status",
        "POST /control/promote",
        "POST /control/follow",
    ] {
        let (code, body) = plain(address, request).await;
        assert_eq!(code, 403, "{request} plain");
        let message: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        let message = message["message"].as_str().expect("a message");
        assert!(message.contains("served over TLS only"), "{message}");
    }

    assert_eq!(over_tls(address, &ca, "GET /status", None).await.0, 401);
    let wrong = over_tls(address, &ca, "GET /status", Some("guess")).await;
    assert_eq!(wrong.0, 401);
    let (code, body) = over_tls(address, &ca, "GET /status", Some(TOKEN)).await;
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        (status["pod"].as_str(), status["role"].as_str()),
        (Some("x-0"), Some("starting"))
    );
    let promote = over_tls(address, &ca, "POST /control/promote", None).await;
    assert_eq!(promote.0, 401, "the control endpoints keep their check");

    std::fs::remove_file(pod.dir("control/token")).expect("no token");
    let disabled = over_tls(address, &ca, "GET /status", Some(TOKEN)).await;
    assert_eq!(disabled.0, 403, "no token mounted");
}

#[tokio::test]
async fn the_certificate_is_verified_against_the_cluster_ca_and_a_renewed_one_is_served() {
    let pod = Pod::new("renewal");
    let ca = new_ca("cluster CA");
    let first = pod.mount(&ca);
    let address = pod.serve().await;

    let (served, _) = connect_tls(address, &ca).await.expect("verified");
    assert_eq!(served, der(&first));
    let stranger = new_ca("another CA");
    assert!(
        connect_tls(address, &stranger).await.is_err(),
        "another CA's client refuses it"
    );

    let renewed = pod.mount(&ca);
    let (served, _) = connect_tls(address, &ca).await.expect("verified");
    assert_eq!(
        served,
        der(&renewed),
        "the renewed certificate, without a restart"
    );
}

#[tokio::test]
async fn without_certificates_everything_is_plain_as_before() {
    let pod = Pod::new("plain");
    let address = pod.serve().await;
    let (code, body) = plain(address, "GET /status").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(plain(address, "GET /healthz").await.0, 200);
    // No certificate to serve: the handshake is answered in plain HTTP, which tells the
    // operator to ask again in plain HTTP.
    let error = connect_tls(address, &new_ca("any"))
        .await
        .map(|(served, _)| served)
        .expect_err("no TLS without a certificate");
    let rustls_error = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    assert!(
        matches!(
            rustls_error,
            Some(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::InvalidContentType
            ))
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn another_instance_reads_the_status_over_tls_or_plain_from_an_older_one() {
    let with_tls = Pod::new("peer-tls");
    with_tls.mount(&new_ca("cluster CA"));
    let address = with_tls.serve().await;
    let asking = |pod: &Pod, port| {
        let token = pod.dir("control/token");
        PeerStatus::new(&pod.dir("mounted"), &token, port, Duration::from_secs(5)).expect("client")
    };
    let body = asking(&with_tls, address.port())
        .get("localhost")
        .await
        .expect("answer");
    assert!(body.contains(r#""pod":"x-0""#), "{body}");

    // A peer that serves no TLS on the port (an older manager; here one without certificates):
    // the handshake fails, and plain HTTP answers.
    let older = Pod::new("peer-older");
    let older_address = older.serve().await;
    let body = asking(&with_tls, older_address.port())
        .get("localhost")
        .await
        .expect("answer");
    assert!(body.contains(r#""pod":"x-0""#), "{body}");
}
