//! TLS to the test clusters, as their clients use it: `verify-full` against the cluster's CA,
//! and the certificate a server presents.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;

/// Name of the Secret holding the cluster's server certificate and its CA (`ca.crt`).
pub fn server_tls_secret_name(cluster: &str) -> String {
    format!("{cluster}-server-tls")
}

/// A TLS connector that trusts `ca_pem` only and checks the server's name, as `verify-full`.
pub fn verify_full(ca_pem: &str) -> anyhow::Result<tokio_postgres_rustls::MakeRustlsConnect> {
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(trusting(
        ca_pem,
    )?))
}

/// As [`verify_full`], presenting the client certificate `cert_pem` with its key `key_pem`
/// (the superuser logs in over the network only with the one the operator issued).
pub fn verify_full_with_certificate(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> anyhow::Result<tokio_postgres_rustls::MakeRustlsConnect> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("the client certificate")?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).context("the client key")?;
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots(ca_pem)?)
        .with_client_auth_cert(chain, key)?;
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// A client configuration that trusts `ca_pem` only and presents no certificate.
fn trusting(ca_pem: &str) -> anyhow::Result<rustls::ClientConfig> {
    Ok(rustls::ClientConfig::builder()
        .with_root_certificates(roots(ca_pem)?)
        .with_no_client_auth())
}

fn roots(ca_pem: &str) -> anyhow::Result<rustls::RootCertStore> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.context("the cluster's CA")?)?;
    }
    Ok(roots)
}

/// The certificate (DER) the PostgreSQL server at `address` presents, checked against
/// `ca_pem` for `host`: PostgreSQL's `SSLRequest`, then a TLS handshake.
pub async fn served_certificate(
    address: SocketAddr,
    host: &str,
    ca_pem: &str,
) -> anyhow::Result<Vec<u8>> {
    use rustls::pki_types::ServerName;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = trusting(ca_pem)?;
    let mut socket = tokio::net::TcpStream::connect(address).await?;
    // SSLRequest: length 8, code 80877103; the server answers 'S' when it speaks TLS.
    socket.write_all(&[0, 0, 0, 8, 4, 210, 22, 47]).await?;
    let mut answer = [0u8; 1];
    socket.read_exact(&mut answer).await?;
    anyhow::ensure!(answer[0] == b'S', "{address} does not speak TLS");
    let name = ServerName::try_from(host.to_owned())?;
    let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, socket)
        .await?;
    let presented = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .context("no certificate presented")?;
    Ok(presented.to_vec())
}

/// How an instance manager's status port at `address` answers `GET /status`: its HTTP status
/// code and body. Over TLS when `tls` gives the name the pod's certificate must cover and the
/// CA, with `token` as the bearer when given.
pub async fn status_port_answer(
    address: SocketAddr,
    tls: Option<(&str, &str)>,
    token: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    use rustls::pki_types::ServerName;
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
    async fn exchange(
        mut stream: impl AsyncRead + AsyncWrite + Unpin,
        request: &str,
    ) -> anyhow::Result<(u16, String)> {
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        let text = String::from_utf8_lossy(&answer);
        let code = text.split(' ').nth(1).context("no status line")?;
        let body = text.split_once("\r\n\r\n").map(|(_, body)| body);
        Ok((code.parse()?, body.unwrap_or_default().to_owned()))
    }
    let authorization = token
        .map(|token| format!("Authorization: Bearer {token}\r\n"))
        .unwrap_or_default();
    let request =
        format!("GET /status HTTP/1.1\r\nHost: pod\r\n{authorization}Connection: close\r\n\r\n");
    let socket = tokio::net::TcpStream::connect(address).await?;
    match tls {
        None => exchange(socket, &request).await,
        Some((host, ca_pem)) => {
            let name = ServerName::try_from(host.to_owned())?;
            let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(trusting(ca_pem)?))
                .connect(name, socket)
                .await?;
            exchange(stream, &request).await
        }
    }
}

/// Who logs in where: `host` is the name the server's certificate must cover.
pub struct Login<'a> {
    pub host: &'a str,
    pub user: &'a str,
    pub password: &'a str,
    pub database: &'a str,
}

/// Connects to `login.database` at `address` over TLS, the certificate checked for
/// `login.host`; the connection runs in the background.
pub async fn connect(
    address: SocketAddr,
    login: &Login<'_>,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config = tokio_postgres::Config::new();
    config
        .host(login.host)
        .hostaddr(address.ip())
        .port(address.port())
        .user(login.user)
        .password(login.password)
        .dbname(login.database)
        .ssl_mode(tokio_postgres::config::SslMode::Require)
        .connect_timeout(Duration::from_secs(10));
    let (client, connection) = config.connect(tls).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            eprintln!("connection to {address} ended: {error}");
        }
    });
    Ok(client)
}
