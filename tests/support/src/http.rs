//! A plain HTTP/1.1 GET, for tests that read a server's endpoints (probes, metrics, a pod's web
//! server) without an HTTP client crate.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `GET <path>` on `address`: the status code and the body.
pub async fn http_get(address: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = TcpStream::connect(address).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no status line in {response:?}"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// The samples of the Prometheus text at `address`'s `/metrics`, by series (its name and
/// labels as written); answers other than 200 are errors.
pub async fn metric_samples(address: SocketAddr) -> anyhow::Result<BTreeMap<String, f64>> {
    let (code, body) = http_get(address, "/metrics").await?;
    anyhow::ensure!(code == 200, "HTTP {code}: {body}");
    Ok(body
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect())
}
