//! The Kubernetes client of the manager: configuration from KUBECONFIG / ~/.kube/config or
//! the pod's service account, and the client-side rate limit in its service stack.

use std::num::NonZeroU32;

use kube::client::ClientBuilder;
use kube::config::{Config, InferConfigError};

use super::rate_limit::RateLimitLayer;

/// Why no client could be built.
/// Inner errors are part of the message, not `#[source]`: kube's errors already repeat their
/// causes, and `{:#}` would print each one several times.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "no Kubernetes configuration found: set KUBECONFIG to a kubeconfig file, create ~/.kube/config, \
         or run inside a cluster with a service account ({0})"
    )]
    NoConfiguration(InferConfigError),
    #[error("cannot build the Kubernetes client: {0}")]
    Build(kube::Error),
}

/// Builds the client: inferred configuration, rate limited to `qps` with bursts of `burst`.
pub async fn connect(qps: f64, burst: NonZeroU32) -> Result<kube::Client, ClientError> {
    let config = Config::infer()
        .await
        .map_err(ClientError::NoConfiguration)?;
    let builder = ClientBuilder::try_from(config).map_err(ClientError::Build)?;
    Ok(builder.with_layer(&RateLimitLayer::new(qps, burst)).build())
}
