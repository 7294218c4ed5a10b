//! The Kubernetes clients of the manager, both from one configuration (KUBECONFIG /
//! ~/.kube/config or the pod's service account):
//!
//! - the controllers' client, with the client-side rate limit (`--kube-api-qps`,
//!   `--kube-api-burst`) in its service stack, and the count of its requests on `/metrics`
//!   ([`super::client_metrics`]); Events go through a second one like it, with a limit of its
//!   own, so that publishing Events never delays reconciles (client-go's event broadcaster,
//!   which controller-runtime operators use, has its own client too);
//! - the leader election client, without it. Renewing the Lease must never wait behind a
//!   busy manager's reconciles: a renewal queued in the rate limiter past the renew deadline
//!   would make the leader step down, or, worse, find the Lease taken after it expired.
//!   It has connections of its own too (a separate pool), so a renewal never waits for a
//!   connection that watches or slow reconciles keep busy. Each of its requests is bounded by a
//!   timeout in [`super::leader`].

use std::num::NonZeroU32;

use kube::client::ClientBuilder;
use kube::config::{Config, InferConfigError};

use super::client_metrics::ClientMetricsLayer;
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

/// The inferred client configuration.
pub async fn infer_config() -> Result<Config, ClientError> {
    Config::infer().await.map_err(ClientError::NoConfiguration)
}

/// The controllers' client: rate limited to `qps` with bursts of `burst`, each request that
/// passed the limit counted by `metrics`.
pub fn rate_limited(
    config: Config,
    qps: f64,
    burst: NonZeroU32,
    metrics: &ClientMetricsLayer,
) -> Result<kube::Client, ClientError> {
    let builder = ClientBuilder::try_from(config).map_err(ClientError::Build)?;
    Ok(builder
        .with_layer(metrics)
        .with_layer(&RateLimitLayer::new(qps, burst))
        .build())
}

/// The leader election client: not rate limited, its own connections.
pub fn unlimited(config: Config) -> Result<kube::Client, ClientError> {
    kube::Client::try_from(config).map_err(ClientError::Build)
}
