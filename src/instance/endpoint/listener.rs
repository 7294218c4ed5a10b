//! The status port's listener: plain HTTP and TLS on one port. The first byte a client sends
//! tells which: a TLS connection starts with a handshake record (`0x16`), an HTTP request with
//! a method's letter. The kubelet's probes stay plain; the operator speaks TLS. Each request
//! bears its [`Transport`] as an extension, for the access rules ([`super::access`]).
//!
//! The TLS certificate is the pod's server certificate, read from the runtime copy of the
//! mounted certificates ([`crate::tls::serving::CertificateFiles`]): a renewed one is served
//! from the next handshake on. No client certificate is asked for. Without a certificate (a pod
//! made before pgkube issued them, or before the first copy), a handshake is answered in plain
//! HTTP (a 400), which tells the operator to ask in plain HTTP.
//!
//! Bounded as the manager's webhook is, so that a client flooding the port cannot exhaust the
//! manager: at most [`MAX_CONNECTIONS`] connections at once (more wait in the kernel's backlog),
//! the first byte and a TLS handshake within [`HANDSHAKE_TIMEOUT`], request headers within
//! [`HEADER_TIMEOUT`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::{Extension, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::tls::serving::CertificateFiles;

/// Connections served at once, handshakes included.
pub const MAX_CONNECTIONS: usize = 64;
/// A client that has not sent its first byte and finished a TLS handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A client that has not sent a request's headers by then is dropped.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The content type of a TLS handshake record, the first byte of every TLS connection.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// How a request reached the endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Plain,
    Tls,
}

/// The router, once for each transport: each request bears its [`Transport`].
#[derive(Clone)]
struct Routers {
    plain: Router,
    tls: Router,
}

/// Serves `router` on `listener`, plain and TLS with the certificate of `certificates`, until
/// the task is dropped.
pub async fn serve(listener: TcpListener, router: Router, certificates: Arc<CertificateFiles>) {
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(Arc::clone(&certificates) as _);
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let routers = Routers {
        plain: router.clone().layer(Extension(Transport::Plain)),
        tls: router.layer(Extension(Transport::Tls)),
    };
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        // The semaphore is never closed.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, peer)) => {
                let (acceptor, routers) = (acceptor.clone(), routers.clone());
                let certificates = Arc::clone(&certificates);
                tokio::spawn(serve_connection(
                    stream,
                    peer,
                    (acceptor, certificates),
                    routers,
                    slot,
                ));
            }
            Err(error) => {
                tracing::warn!(%error, "status endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One connection, plain or TLS as its first byte says, holding its slot until it ends.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    (acceptor, certificates): (TlsAcceptor, Arc<CertificateFiles>),
    routers: Routers,
    _slot: OwnedSemaphorePermit,
) {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let mut first = [0u8; 1];
    match tokio::time::timeout_at(deadline, stream.peek(&mut first)).await {
        Ok(Ok(0)) => return,
        Ok(Ok(_)) => {}
        Ok(Err(error)) => return tracing::debug!(%error, %peer, "status endpoint: cannot read"),
        Err(_) => return tracing::debug!(%peer, "status endpoint: nothing sent in time"),
    }
    if first[0] != TLS_HANDSHAKE_RECORD || certificates.current().is_err() {
        return serve_http(stream, routers.plain, peer).await;
    }
    match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => serve_http(tls, routers.tls, peer).await,
        Ok(Err(error)) => tracing::debug!(%error, %peer, "TLS handshake failed"),
        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
    }
}

/// HTTP/1.1 on `io` until the client closes or a timeout.
async fn serve_http<I>(io: I, router: Router, peer: SocketAddr)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(router))
        .await;
    if let Err(error) = served {
        tracing::debug!(%error, %peer, "status endpoint: connection ended");
    }
}
