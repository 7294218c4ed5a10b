//! The transport against real servers on loopback: a TLS one with a certificate of the
//! cluster's CA, a plain one (an older instance manager), and one whose certificate another CA
//! signed.

use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use time::{Duration as Validity, OffsetDateTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::pki::{self, Issued};

const POD: &str = "db-postgresql-0";
const SUFFIX: &str = ".db-postgresql-headless.ns.svc";

fn ca(name: &str) -> Issued {
    pki::new_ca(name, OffsetDateTime::now_utc(), Validity::days(1)).expect("CA")
}

fn server_config(ca: &Issued) -> Arc<rustls::ServerConfig> {
    let hosts = vec![format!("*{SUFFIX}")];
    let leaf = pki::issue_server(ca, &hosts, OffsetDateTime::now_utc(), Validity::days(1))
        .expect("server certificate");
    let chain = vec![CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).expect("cert")];
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).expect("key");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("config");
    Arc::new(config)
}

/// Answers every connection with `200 <the request's Authorization header>`, over TLS with
/// `tls`, else in plain HTTP (answering a TLS handshake with a 400, as hyper does).
async fn server(tls: Option<Arc<rustls::ServerConfig>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    Some(config) => {
                        let acceptor = tokio_rustls::TlsAcceptor::from(config);
                        if let Ok(stream) = acceptor.accept(stream).await {
                            answer(stream).await;
                        }
                    }
                    None => answer(stream).await,
                }
            });
        }
    });
    address
}

async fn answer(mut stream: impl AsyncRead + AsyncWrite + Unpin) {
    let mut request = vec![0u8; 4096];
    let read = stream.read(&mut request).await.unwrap_or(0);
    let text = String::from_utf8_lossy(&request[..read]).into_owned();
    let response = if text.starts_with("GET ") {
        let authorization = text
            .lines()
            .find_map(|line| line.strip_prefix("authorization: "))
            .unwrap_or("none")
            .to_owned();
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{authorization}",
            authorization.len()
        )
    } else {
        "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned()
    };
    let _ = stream.write_all(response.as_bytes()).await;
}

fn access(ca: &Issued) -> ClusterAccess {
    ClusterAccess::new(
        ca.cert_pem.as_bytes(),
        "t0ken".to_owned(),
        SUFFIX.to_owned(),
    )
    .expect("access")
}

/// GETs `/status` at `socket`, with the token over TLS only; the scheme used and the body.
async fn ask(
    socket: SocketAddr,
    access: Option<&ClusterAccess>,
    plain_allowed: bool,
) -> Result<(Scheme, String), FetchError> {
    let build = |scheme, host: &str| {
        let mut request = http::Request::get("/status").header(http::header::HOST, host);
        if scheme == Scheme::Tls {
            request = request.header(http::header::AUTHORIZATION, "Bearer t0ken");
        }
        Ok(request
            .body(Full::<bytes::Bytes>::default())
            .expect("request"))
    };
    let timeout = Duration::from_secs(2);
    let (scheme, response) = send(socket, POD, access, timeout, plain_allowed, build).await?;
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    Ok((scheme, String::from_utf8_lossy(&body).into_owned()))
}

#[tokio::test]
async fn a_pod_whose_certificate_the_clusters_ca_signed_is_asked_over_tls_with_the_token() {
    let ca = ca("cluster CA");
    let socket = server(Some(server_config(&ca))).await;
    let answer = ask(socket, Some(&access(&ca)), true)
        .await
        .expect("answered");
    assert_eq!(answer, (Scheme::Tls, "Bearer t0ken".to_owned()));
}

#[tokio::test]
async fn a_certificate_of_another_ca_is_refused() {
    let socket = server(Some(server_config(&ca("an impostor's CA")))).await;
    let refused = ask(socket, Some(&access(&ca("cluster CA"))), true).await;
    assert!(
        matches!(&refused, Err(FetchError::Refused(why)) if why.contains(POD)),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_manager_that_answers_in_plain_http_is_asked_again_in_plain_without_the_token() {
    let socket = server(None).await;
    let answer = ask(socket, Some(&access(&ca("cluster CA"))), true)
        .await
        .expect("answered");
    assert_eq!(answer, (Scheme::Plain, "none".to_owned()));
    let without_access = ask(socket, None, true).await.expect("answered");
    assert_eq!(without_access, (Scheme::Plain, "none".to_owned()));
    let pinned = ask(socket, Some(&access(&ca("cluster CA"))), false).await;
    assert!(
        matches!(&pinned, Err(FetchError::Refused(why)) if why.contains("plain HTTP")),
        "{pinned:?}"
    );
}

#[tokio::test]
async fn a_pod_that_spoke_tls_is_never_asked_in_plain_http_again() {
    use crate::cluster::instances::{HttpInstanceStatus, InstanceAddress, InstanceStatusSource};
    let ca = ca("cluster CA");
    let genuine = server(Some(server_config(&ca))).await;
    // An impostor in plain HTTP, on the same port of another loopback address.
    let impostor = TcpListener::bind((std::net::Ipv4Addr::new(127, 0, 0, 2), genuine.port()))
        .await
        .expect("bind the impostor");
    tokio::spawn(async move {
        while let Ok((stream, _)) = impostor.accept().await {
            tokio::spawn(answer(stream));
        }
    });
    let source = HttpInstanceStatus::new(genuine.port(), Duration::from_secs(2));
    let address = |ip: [u8; 4], uid: &str| InstanceAddress {
        pod: POD.to_owned(),
        ip: ip.into(),
        uid: Some(uid.to_owned()),
        access: Some(Arc::new(access(&ca))),
    };
    // The genuine pod speaks TLS (its answer is no status: that it was TLS is what counts).
    let over_tls = source.fetch(&address([127, 0, 0, 1], "pod-a")).await;
    assert!(
        matches!(over_tls, Err(FetchError::BadAnswer(_))),
        "{over_tls:?}"
    );
    let pinned = source.fetch(&address([127, 0, 0, 2], "pod-a")).await;
    assert!(matches!(pinned, Err(FetchError::Refused(_))), "{pinned:?}");
    // Another pod, never seen over TLS, is asked in plain HTTP (an older instance manager).
    let other = source.fetch(&address([127, 0, 0, 2], "pod-b")).await;
    assert!(matches!(other, Err(FetchError::BadAnswer(_))), "{other:?}");
}
