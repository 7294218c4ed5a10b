//! Leader election on a `coordination.k8s.io/v1` Lease, through kube-lease-manager.
//!
//! - [`LeaderElection::acquire`] waits until this process holds the Lease. kube-lease-manager
//!   trusts a foreign lock until it expires, so a released Lease would only be noticed at the
//!   old expiry; to take over a gracefully released Lease within one retry period, each attempt
//!   uses a fresh manager (which reads the Lease anew) and gives up after the retry period.
//!   Identity is stable across attempts, so an attempt cut short after its write is picked up
//!   by the next one.
//! - [`Leadership`] keeps renewing in a background task and reports when the Lease is lost;
//!   [`Leadership::release`] hands the Lease over at once on a graceful stop.
//! - `leader_election_master_status{name}` (1 leader, 0 not) shows who leads, as in
//!   controller-runtime.

use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use kube_lease_manager::{LeaseCreateMode, LeaseManager, LeaseManagerError, LeaseParams};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::args::LeaseTimings;

/// kube-lease-manager sleeps up to this long after clearing an expired foreign lock.
const EXPIRED_LOCK_JITTER: Duration = Duration::from_secs(1);

/// Leader election failures.
/// Inner errors are part of the message, not `#[source]`: kube's errors already repeat their
/// causes, and `{:#}` would print each one several times.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error(
        "cannot use Lease {namespace}/{name} (the manager needs get, create and patch on leases): {error}"
    )]
    Lease {
        namespace: String,
        name: String,
        error: LeaseManagerError,
    },
    #[error(
        "lost the leadership of Lease {namespace}/{name}{reason}; exiting so that this pod restarts as a follower"
    )]
    Lost {
        namespace: String,
        name: String,
        reason: String,
    },
}

impl LeaderError {
    /// Errors that retrying cannot fix: the manager is not allowed to use the Lease.
    fn is_permanent(&self) -> bool {
        match self {
            LeaderError::Lease {
                error: LeaseManagerError::KubeError(kube::Error::Api(status)),
                ..
            } => matches!(status.code, 401 | 403),
            LeaderError::Lease { .. } => false,
            LeaderError::Lost { .. } => true,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    name: String,
}

/// Who this process is, which Lease it competes for, and how often.
pub struct LeaderElection {
    client: kube::Client,
    namespace: String,
    name: String,
    identity: String,
    timings: LeaseTimings,
    status: Gauge<i64, AtomicI64>,
}

impl LeaderElection {
    /// Registers `leader_election_master_status` in `registry`.
    pub fn new(
        client: kube::Client,
        namespace: String,
        name: String,
        identity: String,
        timings: LeaseTimings,
        registry: &mut Registry,
    ) -> Self {
        let family = Family::<LeaseLabels, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "leader_election_master_status",
            "1 if this manager is the leader of the named Lease, 0 otherwise",
            family.clone(),
        );
        let status = family
            .get_or_create(&LeaseLabels { name: name.clone() })
            .clone();
        Self {
            client,
            namespace,
            name,
            identity,
            timings,
            status,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Waits for the Lease. `None` if `stop` is cancelled first.
    pub async fn acquire(
        &self,
        stop: &CancellationToken,
    ) -> Result<Option<Leadership>, LeaderError> {
        let attempt_window = self.timings.retry_period + EXPIRED_LOCK_JITTER;
        loop {
            let manager = tokio::select! {
                biased;
                () = stop.cancelled() => return Ok(None),
                manager = self.lease_manager() => manager,
            };
            let manager = match manager {
                Ok(manager) => manager,
                Err(error) if error.is_permanent() => return Err(error),
                Err(error) => {
                    // The API server may be restarting: a follower keeps trying.
                    tracing::warn!(%error, "cannot read the Lease; retrying");
                    tokio::time::sleep(self.timings.retry_period).await;
                    continue;
                }
            };
            let attempt = tokio::time::timeout(attempt_window, manager.changed());
            tokio::select! {
                biased;
                () = stop.cancelled() => return Ok(None),
                outcome = attempt => match outcome {
                    Ok(Ok(true)) => return Ok(Some(self.lead(manager))),
                    Ok(Ok(false)) | Err(_) => {} // held by someone else: look again
                    Ok(Err(error)) => {
                        tracing::warn!(%error, lease = %self.name, "leader election attempt failed");
                        tokio::time::sleep(self.timings.retry_period).await;
                    }
                },
            }
        }
    }

    async fn lease_manager(&self) -> Result<LeaseManager, LeaderError> {
        let params = LeaseParams::new(
            self.identity.clone(),
            self.timings.duration_seconds,
            self.timings.renew_margin_seconds,
        );
        LeaseManager::new(
            self.client.clone(),
            self.name.clone(),
            self.namespace.clone(),
            params,
            LeaseCreateMode::AutoCreate,
        )
        .await
        .map_err(|error| LeaderError::Lease {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            error,
        })
    }

    fn lead(&self, manager: LeaseManager) -> Leadership {
        self.status.set(1);
        tracing::info!(lease = %self.name, namespace = %self.namespace, identity = %self.identity, "became the leader");
        let manager = Arc::new(manager);
        let (lost_sender, lost) = oneshot::channel();
        let stop_renewing = CancellationToken::new();
        let renewing = tokio::spawn(keep_renewing(
            Arc::clone(&manager),
            stop_renewing.clone(),
            lost_sender,
        ));
        Leadership {
            manager,
            lost,
            stop_renewing,
            renewing,
            status: self.status.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// Renews until stopped; reports the reason when the lock is lost. An API error while renewing
/// counts as lost: the lock may expire before the next try, and two leaders are worse than a
/// restart.
async fn keep_renewing(
    manager: Arc<LeaseManager>,
    stop: CancellationToken,
    lost: oneshot::Sender<String>,
) {
    let reason = tokio::select! {
        () = stop.cancelled() => return,
        changed = manager.changed() => match changed {
            Ok(_) => String::new(),
            Err(error) => format!(" ({error})"),
        },
    };
    // The receiver is gone only when the manager is already shutting down.
    let _ = lost.send(reason);
}

/// This process holds the Lease.
pub struct Leadership {
    manager: Arc<LeaseManager>,
    lost: oneshot::Receiver<String>,
    stop_renewing: CancellationToken,
    renewing: JoinHandle<()>,
    status: Gauge<i64, AtomicI64>,
    namespace: String,
    name: String,
}

impl Leadership {
    /// Resolves when the Lease is lost (taken over or not renewable).
    pub async fn lost(&mut self) -> LeaderError {
        let reason = (&mut self.lost).await.unwrap_or_default();
        self.status.set(0);
        LeaderError::Lost {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            reason,
        }
    }

    /// Stops renewing and clears the Lease's holder so a follower takes over at once.
    pub async fn release(self) -> Result<(), LeaderError> {
        self.stop_renewing.cancel();
        // The renewal task ends at its next poll; a renewal cut short is harmless, as the
        // release below reads the Lease before writing.
        let _ = self.renewing.await;
        self.status.set(0);
        match self.manager.release().await {
            Ok(()) => {
                tracing::info!(lease = %self.name, "released the Lease");
                Ok(())
            }
            Err(error) => Err(LeaderError::Lease {
                namespace: self.namespace,
                name: self.name,
                error,
            }),
        }
    }
}

/// A unique identity: the pod (host) name plus a random suffix, as controller-runtime does, so
/// a restarted pod with the same name is a new holder.
pub fn identity(hostname: Option<String>) -> String {
    use std::hash::{BuildHasher, RandomState};
    let host = hostname
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "pgkube".to_owned());
    // RandomState is seeded from the OS's randomness for every new instance.
    let suffix = RandomState::new().hash_one(std::process::id());
    format!("{host}_{suffix:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_name_the_host_and_differ_between_processes() {
        let first = identity(Some("pgkube-7d9f".into()));
        let second = identity(Some("pgkube-7d9f".into()));
        assert!(first.starts_with("pgkube-7d9f_"), "{first}");
        assert_ne!(first, second);
        assert!(identity(None).starts_with("pgkube_"));
    }
}
