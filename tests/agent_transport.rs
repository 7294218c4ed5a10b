//! `pgkube agent` against an HTTPS S3 endpoint whose certificate comes from a private CA, as
//! with an in-cluster MinIO or Ceph gateway: `--s3-ca-bundle` must make the agent trust it, and
//! without it the agent must refuse the endpoint.
//!
//! The test bed's S3 server speaks plain HTTP, so each test puts a TLS-terminating proxy in front
//! of it, on a loopback port, with a certificate signed by a CA made for that test. The proxy
//! records the decrypted requests, which shows what went over the wire: over TLS, parts are sent
//! as `UNSIGNED-PAYLOAD` (TLS already protects them).

mod agent_common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use agent_common::{Agent, fingerprint, work_dir};
use pgkube_testkit::{TestBucket, TestDatabase, testbed};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

/// Requests larger than this are not recorded beyond it (the tests' dumps are far smaller).
const RECORD_LIMIT: usize = 16 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_https_the_agent_trusts_the_ca_bundle_and_round_trips() {
    let Some(env) = testbed() else { return };
    let bucket = TestBucket::create(&env, "agent-tls").await;
    let database = TestDatabase::create(&env, "agent_tls").await;
    let work = work_dir("tls");
    let proxy = TlsProxy::start(&env.s3_endpoint, &work).await;
    let mut agent = Agent::new(&env, bucket.name(), "tls", &work);
    agent.s3_endpoint = proxy.endpoint.clone();
    let ca_bundle = proxy.ca_bundle.to_string_lossy().into_owned();

    let client = database.connect().await;
    client
        .batch_execute(
            "CREATE TABLE notes (id bigint PRIMARY KEY, body text);
             INSERT INTO notes SELECT g, md5(g::text) FROM generate_series(1, 20000) g;",
        )
        .await
        .expect("filling the database");
    let before = fingerprint(&client).await;
    drop(client);

    let backup = agent
        .backup(
            "tls-1",
            &["--database", database.name(), "--s3-ca-bundle", &ca_bundle],
        )
        .await;
    backup.assert_completed();
    let requests = proxy.requests();
    let part_line = format!(
        "/databases/{}.dump?x-id=UploadPart&partNumber=1&",
        database.name()
    );
    let part_headers = request_head(&requests, &part_line)
        .expect("the dump went through the proxy as a multipart upload");
    assert!(
        part_headers.contains("\r\nx-amz-content-sha256: UNSIGNED-PAYLOAD\r\n"),
        "over TLS the parts are sent unsigned: {part_headers}"
    );

    let restore = agent
        .restore(
            "tls-1",
            &[
                "--database",
                database.name(),
                "--drop-existing",
                "--skip-globals",
                "--s3-ca-bundle",
                &ca_bundle,
            ],
        )
        .await;
    restore.assert_completed();
    assert_eq!(fingerprint(&database.connect().await).await, before);

    database.cleanup().await;
    bucket.cleanup().await;
    let _ = std::fs::remove_dir_all(work);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_ca_bundle_the_agent_refuses_the_endpoint_and_stores_nothing() {
    let Some(env) = testbed() else { return };
    let bucket = TestBucket::create(&env, "agent-tls-untrusted").await;
    let database = TestDatabase::create(&env, "agent_tls_untrusted").await;
    let work = work_dir("tls-untrusted");
    let proxy = TlsProxy::start(&env.s3_endpoint, &work).await;
    let mut agent = Agent::new(&env, bucket.name(), "", &work);
    agent.s3_endpoint = proxy.endpoint.clone();

    let backup = agent
        .backup(
            "tls-untrusted",
            &["--database", database.name(), "--s3-max-attempts", "1"],
        )
        .await;
    backup.assert_failed();
    let message = backup.message();
    assert!(
        message.to_lowercase().contains("certificate"),
        "the reason names the certificate: {message}"
    );
    backup.assert_does_not_reveal(&agent.secret_key);
    assert!(
        proxy.requests().is_empty(),
        "no request got through an untrusted TLS session"
    );
    let stored = bucket
        .client()
        .list_objects_v2()
        .bucket(bucket.name())
        .send()
        .await
        .expect("listing the bucket");
    assert_eq!(stored.key_count(), Some(0));

    database.cleanup().await;
    bucket.cleanup().await;
    let _ = std::fs::remove_dir_all(work);
}

/// A TLS-terminating TCP proxy on 127.0.0.1 in front of a plain-HTTP endpoint.
struct TlsProxy {
    /// `https://127.0.0.1:<port>`: the address the certificate is issued for.
    endpoint: String,
    /// PEM file of the CA that signed the proxy's certificate.
    ca_bundle: PathBuf,
    /// Everything clients sent, decrypted, up to RECORD_LIMIT.
    recorded: Arc<Mutex<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsProxy {
    async fn start(upstream_endpoint: &str, work: &Path) -> TlsProxy {
        let upstream = upstream_address(upstream_endpoint);
        let (ca_pem, server_config) = certificates();
        let ca_bundle = work.join("ca.pem");
        std::fs::write(&ca_bundle, ca_pem).expect("writing the CA bundle");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding");
        let port = listener.local_addr().expect("local address").port();
        let acceptor = TlsAcceptor::from(Arc::new(server_config));
        let recorded = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(serve(listener, acceptor, upstream, recorded.clone()));
        TlsProxy {
            endpoint: format!("https://127.0.0.1:{port}"),
            ca_bundle,
            recorded,
            task,
        }
    }

    fn requests(&self) -> String {
        let recorded = self.recorded.lock().expect("recording lock");
        String::from_utf8_lossy(&recorded).into_owned()
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The request line and headers of the first request whose line contains `needle`.
fn request_head<'a>(requests: &'a str, needle: &str) -> Option<&'a str> {
    let start = requests.find(needle)?;
    let line_start = requests[..start].rfind("\r\n").map_or(0, |at| at + 2);
    let end = requests[start..].find("\r\n\r\n")? + start;
    Some(&requests[line_start..end])
}

/// `host:port` of an `http://host:port` endpoint.
fn upstream_address(endpoint: &str) -> SocketAddr {
    let authority = endpoint.trim_start_matches("http://").trim_end_matches('/');
    authority
        .parse()
        .unwrap_or_else(|e| panic!("S3 endpoint {endpoint} is not http://ip:port: {e}"))
}

/// A fresh CA (as PEM) and a server configuration with a certificate for 127.0.0.1 it signed.
fn certificates() -> (String, ServerConfig) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "pgkube test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key"))
        .expect("CA certificate");
    let server_key = KeyPair::generate().expect("server key");
    let server_certificate = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .expect("server params")
        .signed_by(&server_key, &ca)
        .expect("server certificate");
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
    let config = ServerConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_no_client_auth()
    .with_single_cert(vec![server_certificate.der().clone()], key)
    .expect("server config");
    (ca.pem(), config)
}

async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    upstream: SocketAddr,
    recorded: Arc<Mutex<Vec<u8>>>,
) {
    while let Ok((client, _)) = listener.accept().await {
        let acceptor = acceptor.clone();
        let recorded = recorded.clone();
        tokio::spawn(async move {
            // A client that rejects the certificate ends the handshake: nothing to forward.
            let Ok(tls) = acceptor.accept(client).await else {
                return;
            };
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            forward(tls, server, recorded).await;
        });
    }
}

/// Copies both ways until either side closes, recording what the client sent.
async fn forward(
    tls: tokio_rustls::server::TlsStream<TcpStream>,
    server: TcpStream,
    recorded: Arc<Mutex<Vec<u8>>>,
) {
    let (mut client_read, mut client_write) = tokio::io::split(tls);
    let (mut server_read, mut server_write) = server.into_split();
    let upload = async {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let read = match client_read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            {
                let mut recorded = recorded.lock().expect("recording lock");
                let room = RECORD_LIMIT.saturating_sub(recorded.len());
                recorded.extend_from_slice(&buffer[..read.min(room)]);
            }
            if server_write.write_all(&buffer[..read]).await.is_err() {
                break;
            }
        }
        let _ = server_write.shutdown().await;
    };
    let download = async {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    };
    tokio::join!(upload, download);
}
