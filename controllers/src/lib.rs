//! pgkube controllers.
//!
//! The manager (`pgkube run`) checks that the CRDs are installed ([`ensure_crds_installed`]),
//! builds a [`Context`] and calls [`run`], which drives every controller until the shutdown
//! future resolves. Each controller lives in its own module and reports through the shared
//! [`Metrics`]. [`storage`] is the project's one S3 client, which the backup agent in the binary
//! uses too.

pub mod cluster;
pub mod crd_check;
pub mod metrics;
pub mod names;
pub mod pod;
mod quantity;
pub mod retention;
pub mod scheduling;
pub mod storage;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

pub use crd_check::{CrdCheckError, ensure_crds_installed};
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
    /// Image of pgkube itself: the instance manager's init container installs `pgkube` from
    /// it, and backup and restore Jobs run it (`pgkube agent`).
    pub agent_image: String,
    /// How often a settled object is reconciled again although nothing changed (a safety net
    /// for missed watch events; it costs reads, never writes).
    pub resync_interval: Duration,
    /// How the cluster controller asks each PostgreSQL pod's instance manager for its status:
    /// HTTP to the pod's address by default. Tests substitute an answer for pods that never
    /// run (simulated nodes).
    pub instance_status: Arc<dyn cluster::instances::InstanceStatusSource>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            watch_namespaces: Vec::new(),
            max_concurrent_reconciles: 4,
            postgres_image_repository: "postgres".to_owned(),
            agent_image: "ghcr.io/pgkube/pgkube:latest".to_owned(),
            resync_interval: Duration::from_secs(300),
            instance_status: Arc::new(cluster::instances::HttpInstanceStatus::default()),
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

/// Tells controllers to stop; cheap to clone, one per controller.
#[derive(Clone, Debug)]
pub struct ShutdownSignal(watch::Receiver<bool>);

impl ShutdownSignal {
    /// A signal that fires when `shutdown` resolves.
    pub fn from_future(shutdown: impl Future<Output = ()> + Send + 'static) -> Self {
        let (sender, receiver) = watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            // No receiver left means nobody is running any more: nothing to stop.
            let _ = sender.send(true);
        });
        Self(receiver)
    }

    /// Resolves once shutdown was asked for (or the sender is gone).
    pub async fn wait(mut self) {
        while !*self.0.borrow_and_update() {
            if self.0.changed().await.is_err() {
                return;
            }
        }
    }
}

/// Runs every controller until `shutdown` resolves; in-flight reconciles finish first.
/// `on_ready` is called once all watch caches have synced (the manager's `/readyz`).
///
/// The CRDs must be installed: check with [`ensure_crds_installed`] first, or the controllers
/// retry their watches until they are.
pub async fn run(
    context: Context,
    on_ready: impl FnOnce() + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let shutdown = ShutdownSignal::from_future(shutdown);
    let clusters = cluster::ClusterControllers::new(&context);
    let stores = clusters.stores();
    let ready = async move {
        for store in stores {
            // Only fails when the controller stopped before its cache synced.
            if store.wait_until_ready().await.is_err() {
                return;
            }
        }
        on_ready();
    };
    futures::future::join(ready, clusters.run(shutdown)).await;
}
