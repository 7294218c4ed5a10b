//! One request to an instance manager, on a connection of its own: over TLS when the cluster's
//! access is known ([`ClusterAccess`]), the pod's certificate verified against the cluster's CA
//! under the pod's host name; in plain HTTP otherwise.
//!
//! An instance manager that answers the TLS handshake in plain HTTP is one of an older pgkube
//! (until the operator replaces it in place) or of a pod without certificates: the request is
//! made again in plain HTTP, as those managers expect, unless the caller knows the pod speaks
//! TLS (then it is refused). A certificate that does not verify is never passed over: the
//! request fails as [`FetchError::Refused`].

use std::net::SocketAddr;
use std::time::Duration;

use http_body::Body;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::FetchError;
use super::access::ClusterAccess;

/// How a request travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Tls,
    Plain,
}

/// Sends the request `build` makes for the scheme used to `pod`'s instance manager at
/// `socket`, connecting within `connect_timeout`, and in plain HTTP after a TLS handshake only
/// if `plain_allowed`. Returns the scheme used and the response.
pub async fn send<B>(
    socket: SocketAddr,
    pod: &str,
    access: Option<&ClusterAccess>,
    connect_timeout: Duration,
    plain_allowed: bool,
    build: impl Fn(Scheme, &str) -> Result<http::Request<B>, FetchError>,
) -> Result<(Scheme, http::Response<Incoming>), FetchError>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = connect(socket, connect_timeout).await?;
    let build = &build;
    let plain = |stream| async move {
        let response = exchange(stream, build(Scheme::Plain, &socket.to_string())?).await?;
        Ok((Scheme::Plain, response))
    };
    let Some(access) = access else {
        return plain(stream).await;
    };
    let name = access.server_name(pod)?;
    let host = name.to_str().into_owned();
    match access.connector().connect(name, stream).await {
        Ok(tls) => Ok((
            Scheme::Tls,
            exchange(tls, build(Scheme::Tls, &host)?).await?,
        )),
        Err(error) if answered_in_plain(&error) && !plain_allowed => Err(FetchError::Refused(
            format!("{pod} answered in plain HTTP after it spoke TLS"),
        )),
        Err(error) if answered_in_plain(&error) => {
            tracing::debug!(%pod, "the instance manager does not speak TLS; asked in plain HTTP");
            plain(connect(socket, connect_timeout).await?).await
        }
        Err(error) if certificate_refused(&error) => Err(FetchError::Refused(format!(
            "the certificate of {pod}: {error}"
        ))),
        Err(error) => Err(FetchError::Unreachable(format!("TLS handshake: {error}"))),
    }
}

async fn connect(socket: SocketAddr, within: Duration) -> Result<TcpStream, FetchError> {
    let stream = tokio::time::timeout(within, TcpStream::connect(socket))
        .await
        .map_err(|_| FetchError::Unreachable(format!("no connection within {within:?}")))?
        .map_err(|error| FetchError::Unreachable(format!("connecting to {socket}: {error}")))?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

fn rustls_error(error: &std::io::Error) -> Option<&rustls::Error> {
    error.get_ref()?.downcast_ref::<rustls::Error>()
}

/// The server's first bytes were no TLS record: a plain HTTP server's answer.
fn answered_in_plain(error: &std::io::Error) -> bool {
    matches!(
        rustls_error(error),
        Some(rustls::Error::InvalidMessage(
            rustls::InvalidMessage::InvalidContentType
        ))
    )
}

fn certificate_refused(error: &std::io::Error) -> bool {
    matches!(
        rustls_error(error),
        Some(rustls::Error::InvalidCertificate(_))
    )
}

/// HTTP/1.1 over `io`: one request, and its response's head.
async fn exchange<IO, B>(
    io: IO,
    request: http::Request<B>,
) -> Result<http::Response<Incoming>, FetchError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let unreachable = |error: hyper::Error| FetchError::Unreachable(error.to_string());
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(unreachable)?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "instance manager connection ended");
        }
    });
    sender.send_request(request).await.map_err(unreachable)
}

#[cfg(test)]
mod tests;
