//! How an instance manager asks another instance for its `/status`, as the access rules let it
//! ([`super::access`]): in a pod with certificates, over TLS verified against the cluster's CAs
//! ([`crate::tls::servers_ca`]) and with the control token; without, plain HTTP. A peer that
//! does not answer TLS on the port (a manager from before TLS came to it) is asked again in
//! plain HTTP.

use std::path::Path;
use std::time::Duration;

use axum::http::header;

/// A client for the other instances' `/status`.
pub struct PeerStatus {
    client: reqwest::Client,
    /// The control token, when the peers are asked over TLS.
    token: Option<String>,
    port: u16,
}

impl PeerStatus {
    /// A client for the status port `port`, each request taking at most `timeout`; over TLS
    /// when `tls_dir` (the mounted certificates) has the CA, with the token of `token_file`.
    pub fn new(tls_dir: &Path, token_file: &Path, port: u16, timeout: Duration) -> Option<Self> {
        let builder = reqwest::Client::builder().timeout(timeout);
        let ca = crate::tls::servers_ca(tls_dir).ok();
        // Every CA of the bundle: the server CA and pgkube's.
        let roots = ca.and_then(|pem| reqwest::Certificate::from_pem_bundle(&pem).ok());
        let (builder, token) = match roots.filter(|roots| !roots.is_empty()) {
            Some(roots) => {
                let token = std::fs::read_to_string(token_file).unwrap_or_default();
                (builder.tls_certs_only(roots), Some(token.trim().to_owned()))
            }
            None => (builder, None),
        };
        let client = builder
            .build()
            .inspect_err(|error| tracing::warn!(%error, "cannot make an HTTP client"))
            .ok()?;
        Some(Self {
            client,
            token,
            port,
        })
    }

    /// The body of `host`'s `/status`, whatever its HTTP status (empty when it could not be
    /// read: an answer all the same).
    pub async fn get(&self, host: &str) -> reqwest::Result<String> {
        let Some(token) = &self.token else {
            return self.plain(host).await;
        };
        let url = format!("https://{host}:{}/status", self.port);
        let asked = self
            .client
            .get(&url)
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .send()
            .await;
        match asked {
            Ok(response) => Ok(response.text().await.unwrap_or_default()),
            // A timeout would only take as long again.
            Err(error) if error.is_connect() && !error.is_timeout() => {
                tracing::debug!(%error, %host, "no TLS on the status port; asking in plain HTTP");
                self.plain(host).await
            }
            Err(error) => Err(error),
        }
    }

    async fn plain(&self, host: &str) -> reqwest::Result<String> {
        let url = format!("http://{host}:{}/status", self.port);
        let response = self.client.get(&url).send().await?;
        Ok(response.text().await.unwrap_or_default())
    }
}
