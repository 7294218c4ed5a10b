//! The webhook's server, with bounds no client can push it past, so that a pod flooding the
//! port cannot make the manager run out of memory (conversion, and with it
//! `kubectl get pgcluster`, would fail):
//! - at most [`MAX_CONNECTIONS`] connections at once, handshakes included (more wait in the
//!   kernel's backlog);
//! - a TLS handshake within [`HANDSHAKE_TIMEOUT`], request headers within [`HEADER_TIMEOUT`];
//! - a body of at most the configured limit (413 beyond it, read no further) and read within
//!   [`BODY_TIMEOUT`] (408 when slower).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::{CertificateFiles, WebhookError};

/// Connections served at once, handshakes included.
pub const MAX_CONNECTIONS: usize = 64;
/// A client that has not finished its TLS handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A client that has not sent a request's headers by then is dropped.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A client that has not sent a request's body by then gets a 408.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds `address` and serves `router` over TLS with the certificate in `certificates` until
/// `stop` is cancelled. Returns the bound address once listening.
pub async fn serve_tls(
    address: SocketAddr,
    router: Router,
    certificates: CertificateFiles,
    stop: CancellationToken,
) -> Result<SocketAddr, WebhookError> {
    let bind_error = |error| WebhookError::Bind { address, error };
    let listener = TcpListener::bind(address).await.map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(certificates));
    let acceptor = TlsAcceptor::from(Arc::new(config));
    tokio::spawn(accept_loop(listener, acceptor, router, stop));
    tracing::info!(endpoint = "webhook", address = %bound, "serving");
    Ok(bound)
}

/// Accepts a connection whenever one of the [`MAX_CONNECTIONS`] slots is free, and serves it
/// in a task of its own that holds the slot.
async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: Router,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let slot = tokio::select! {
            () = stop.cancelled() => return,
            slot = slots.clone().acquire_owned() => slot,
        };
        let Ok(slot) = slot else { return };
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let (acceptor, router, stop) = (acceptor.clone(), router.clone(), stop.clone());
                tokio::spawn(serve_connection(stream, peer, acceptor, router, stop, slot));
            }
            Err(error) => {
                tracing::warn!(%error, "webhook: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One connection: the handshake, then HTTP/1.1 until the client closes, a timeout, or `stop`
/// (which lets the request in flight finish).
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    router: Router,
    stop: CancellationToken,
    _slot: OwnedSemaphorePermit,
) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => return tracing::debug!(%error, %peer, "TLS handshake failed"),
        Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
    };
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(tls), TowerToHyperService::new(router));
    tokio::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        () = stop.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = served {
        tracing::debug!(%error, %peer, "webhook connection ended");
    }
}

fn is_over_limit(error: &axum::Error) -> bool {
    std::error::Error::source(error)
        .is_some_and(|source| source.is::<http_body_util::LengthLimitError>())
}

/// A request's body, at most `limit` bytes and within [`BODY_TIMEOUT`]; else the response
/// that says why (413, 408).
pub async fn read_body(body: Body, limit: usize) -> Result<Bytes, Response> {
    read_body_within(body, limit, BODY_TIMEOUT).await
}

async fn read_body_within(body: Body, limit: usize, within: Duration) -> Result<Bytes, Response> {
    let read = tokio::time::timeout(within, axum::body::to_bytes(body, limit)).await;
    let (status, message) = match read {
        Ok(Ok(bytes)) => return Ok(bytes),
        Ok(Err(error)) if is_over_limit(&error) => (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than the {limit} bytes accepted"),
        ),
        Ok(Err(error)) => (
            StatusCode::BAD_REQUEST,
            format!("the body could not be read: {error}"),
        ),
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            format!("the body did not arrive within {} ms", within.as_millis()),
        ),
    };
    Err((status, message).into_response())
}

#[cfg(test)]
mod tests {
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;
    use crate::manager::webhook::{CONVERT_PATH, router};

    async fn status_of(body: Body, limit: usize) -> (StatusCode, String) {
        let request = Request::post(CONVERT_PATH).body(body).expect("request");
        let response = router(limit).oneshot(request).await.expect("response");
        let status = response.status();
        let text = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        (status, String::from_utf8_lossy(&text).into_owned())
    }

    #[tokio::test]
    async fn a_body_over_the_limit_gets_a_413_that_says_the_limit() {
        let (status, text) = status_of(Body::from(vec![b' '; 2049]), 2048).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(text, "the body is larger than the 2048 bytes accepted");
        let (status, _) = status_of(Body::from(vec![b' '; 2048]), 2048).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "read, and not a review");
    }

    #[tokio::test]
    async fn a_body_that_does_not_arrive_gets_a_408() {
        let never = futures::stream::pending::<Result<Bytes, std::io::Error>>();
        let within = Duration::from_millis(50);
        let refused = read_body_within(Body::from_stream(never), 2048, within)
            .await
            .expect_err("refused");
        assert_eq!(refused.status(), StatusCode::REQUEST_TIMEOUT);
        let text = axum::body::to_bytes(refused.into_body(), 1 << 20)
            .await
            .expect("body");
        assert_eq!(text, "the body did not arrive within 50 ms");
    }
}
