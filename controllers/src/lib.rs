//! pgkube controllers.
//!
//! The manager (`pgkube run`) builds a [`Context`] and calls [`run`], which drives every
//! controller until the shutdown future resolves. Each controller lives in its own module and
//! reports through the shared [`Metrics`].

pub mod metrics;

use std::future::Future;
use std::sync::Arc;

pub use metrics::Metrics;

/// Settings of the controllers that come from the manager's command line.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Namespaces to watch; empty means all namespaces.
    pub watch_namespaces: Vec<String>,
    /// How many objects each controller reconciles at once.
    pub max_concurrent_reconciles: u16,
    /// Registry and repository of the PostgreSQL image, without tag (`postgres` by default; the
    /// tag is the cluster's version). Air-gapped users point this at their mirror.
    pub postgres_image_repository: String,
    /// Image of pgkube itself, used by backup and restore Jobs (`pgkube agent`).
    pub agent_image: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            watch_namespaces: Vec::new(),
            max_concurrent_reconciles: 4,
            postgres_image_repository: "postgres".to_owned(),
            agent_image: "ghcr.io/pgkube/pgkube:latest".to_owned(),
        }
    }
}

/// What every reconcile can reach.
#[derive(Clone)]
pub struct Context {
    pub client: kube::Client,
    pub settings: Arc<Settings>,
    pub metrics: Arc<Metrics>,
}

/// Errors that stop the controllers as a whole (not those of a single reconcile).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(
        "the CustomResourceDefinition {crd} is not installed: install it with `pgkube crd | kubectl apply --server-side -f -`"
    )]
    MissingCrd { crd: String },
    #[error("Kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
}

/// Runs every controller until `shutdown` resolves; in-flight reconciles finish first.
/// `on_ready` is called once all watch caches have synced (the manager's `/readyz`).
pub async fn run(
    context: Context,
    on_ready: impl FnOnce() + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    // The controllers are wired in here as they land.
    let _ = context;
    on_ready();
    shutdown.await;
    Ok(())
}
