//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's algorithm (see
//! [`lock`] for why two candidates can never both lead).
//!
//! - [`LeaderElection::acquire`] waits until this process holds the Lease, trying every retry
//!   period. A released Lease (no holder) is taken at the next try; a held one only once the
//!   same record was seen unchanged for its lease duration on the local clock.
//! - [`Leadership`] renews every retry period in a background task. When no renewal succeeded
//!   within the renew deadline (counted from before the last successful renewal was sent), or
//!   another candidate holds the Lease, [`Leadership::lost`] resolves: the caller must stop
//!   everything only the leader may do at once. That happens before the Lease can expire for
//!   anyone else, as the lease duration is longer than the renew deadline.
//! - Requests go through the manager's leader election client, which is not rate limited with
//!   the controllers' requests (see `kube_client`), and each is bounded by a timeout of half
//!   the renew deadline (at least 1 s, as client-go), so a hung request leaves time to retry.
//! - [`Leadership::release`] hands the Lease over at once on a graceful stop.
//! - `leader_election_master_status{name}` (1 leader, 0 not) shows who leads, as in
//!   controller-runtime.

mod lock;

use std::sync::atomic::AtomicI64;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::args::LeaseTimings;
use lock::{Attempt, LeaseLock, LockError};

/// The shortest timeout of one request about the Lease.
const MIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// Leader election failures.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error(
        "cannot use Lease {namespace}/{name} (the manager needs get, create and update on leases): {error}"
    )]
    Lease {
        namespace: String,
        name: String,
        error: LockError,
    },
    #[error(
        "lost the leadership of Lease {namespace}/{name} ({reason}); exiting so that this pod restarts as a follower"
    )]
    Lost {
        namespace: String,
        name: String,
        reason: String,
    },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    name: String,
}

/// Who this process is, which Lease it competes for, and how often.
pub struct LeaderElection {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    timings: LeaseTimings,
    status: Gauge<i64, AtomicI64>,
}

impl LeaderElection {
    /// `client` must be the leader election client (not rate limited). Registers
    /// `leader_election_master_status` in `registry`.
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
            api: Api::namespaced(client, &namespace),
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
        let mut lock = self.lock();
        let mut last_holder = None;
        loop {
            let started = Instant::now();
            let attempt = tokio::select! {
                biased;
                () = stop.cancelled() => return Ok(None),
                attempt = lock.try_acquire_or_renew() => attempt,
            };
            match attempt {
                Ok(Attempt::Leading) => return Ok(Some(self.lead(lock, started))),
                Ok(Attempt::HeldBy(holder)) => {
                    if last_holder.as_ref() != Some(&holder) {
                        tracing::info!(lease = %self.name, %holder, "the Lease is held by another candidate");
                        last_holder = Some(holder);
                    }
                }
                Ok(Attempt::Conflict) => {
                    tracing::debug!(lease = %self.name, "another candidate wrote the Lease first");
                }
                Err(error) if error.is_forbidden() => return Err(self.lease_error(error)),
                // The API server may be restarting: a follower keeps trying.
                Err(error) => {
                    tracing::warn!(%error, lease = %self.name, "cannot read or write the Lease; retrying")
                }
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return Ok(None),
                () = tokio::time::sleep(self.timings.retry_period) => {}
            }
        }
    }

    fn lock(&self) -> LeaseLock {
        let duration_seconds = i32::try_from(self.timings.duration_seconds).unwrap_or(i32::MAX);
        let request_timeout = (self.timings.renew_deadline / 2).max(MIN_REQUEST_TIMEOUT);
        LeaseLock::new(
            self.api.clone(),
            self.name.clone(),
            self.identity.clone(),
            duration_seconds,
            request_timeout,
        )
    }

    fn lease_error(&self, error: LockError) -> LeaderError {
        LeaderError::Lease {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            error,
        }
    }

    /// Starts renewing a Lease acquired by an attempt that began at `acquired_at`.
    fn lead(&self, lock: LeaseLock, acquired_at: Instant) -> Leadership {
        self.status.set(1);
        tracing::info!(lease = %self.name, namespace = %self.namespace, identity = %self.identity, "became the leader");
        let (lost_sender, lost) = oneshot::channel();
        let stop_renewing = CancellationToken::new();
        let renewing = tokio::spawn(keep_renewing(
            lock,
            self.timings,
            acquired_at,
            stop_renewing.clone(),
            lost_sender,
        ));
        Leadership {
            lost,
            stop_renewing,
            renewing,
            status: self.status.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// Renews every retry period until stopped (then hands the lock back for the release), or
/// until leadership is lost: no successful renewal within the renew deadline, by the local
/// clock, or another candidate holding the Lease. The deadline counts from the start of the
/// last successful attempt, so it ends before any other candidate can see the Lease expire.
async fn keep_renewing(
    mut lock: LeaseLock,
    timings: LeaseTimings,
    acquired_at: Instant,
    stop: CancellationToken,
    lost: oneshot::Sender<String>,
) -> LeaseLock {
    let mut renewed_at = acquired_at;
    let reason = loop {
        let deadline = renewed_at + timings.renew_deadline;
        let next_try = (Instant::now() + timings.retry_period).min(deadline);
        tokio::select! {
            biased;
            () = stop.cancelled() => return lock,
            () = tokio::time::sleep_until(next_try) => {}
        }
        if Instant::now() >= deadline {
            break format!(
                "not renewed within the renew deadline of {:?}",
                timings.renew_deadline
            );
        }
        let started = Instant::now();
        // Not cut short by `stop`: a release afterwards must know the latest record.
        match tokio::time::timeout_at(deadline, lock.try_acquire_or_renew()).await {
            Ok(Ok(Attempt::Leading)) => renewed_at = started,
            Ok(Ok(Attempt::HeldBy(holder))) => break format!("now held by {holder}"),
            Ok(Ok(Attempt::Conflict)) => {
                tracing::warn!("the Lease changed while renewing it; retrying");
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot renew the Lease; retrying until the renew deadline");
            }
            Err(_deadline) => {}
        }
    };
    // The receiver is gone only when the manager is already shutting down.
    let _ = lost.send(reason);
    lock
}

/// This process holds the Lease.
pub struct Leadership {
    lost: oneshot::Receiver<String>,
    stop_renewing: CancellationToken,
    renewing: JoinHandle<LeaseLock>,
    status: Gauge<i64, AtomicI64>,
    namespace: String,
    name: String,
}

impl Leadership {
    /// Resolves when this process must stop leading: the Lease was not renewed within the
    /// renew deadline, or another candidate holds it. Cancel-safe.
    pub async fn lost(&mut self) -> LeaderError {
        let reason = (&mut self.lost)
            .await
            .unwrap_or_else(|_| "its renewal task stopped".to_owned());
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
        self.status.set(0);
        // The renewal in flight, if any, ends first (within its request timeouts).
        let Ok(mut lock) = self.renewing.await else {
            return Ok(()); // the task panicked: the Lease expires on its own
        };
        match lock.release().await {
            Ok(true) => {
                tracing::info!(lease = %self.name, "released the Lease");
                Ok(())
            }
            Ok(false) => {
                tracing::info!(lease = %self.name, "the Lease was no longer held: nothing to release");
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
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::http::{Method, Request, Response};
    use kube::client::Body;

    /// Short, so the tests run on the real clock; what they check is order, not speed.
    const TIMINGS: LeaseTimings = LeaseTimings {
        duration_seconds: 1,
        renew_deadline: Duration::from_millis(300),
        retry_period: Duration::from_millis(50),
    };
    const LEASE_DURATION: Duration = Duration::from_secs(1);

    /// A fake API server with one Lease: `answer` gives the status and JSON body for a request
    /// method, or `None` for a request that never gets an answer (a cut connection).
    fn fake_api<F>(answer: F) -> kube::Client
    where
        F: Fn(&Method) -> Option<(u16, serde_json::Value)> + Clone + Send + Sync + 'static,
    {
        let service = tower::service_fn(move |request: Request<Body>| {
            let answer = answer(request.method());
            async move {
                let Some((status, body)) = answer else {
                    return std::future::pending().await;
                };
                let body = serde_json::to_vec(&body).expect("JSON");
                let response = Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(body))
                    .expect("response");
                Ok::<_, Infallible>(response)
            }
        });
        kube::Client::new(service, "default")
    }

    fn lease(holder: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": { "name": "lease", "namespace": "default", "resourceVersion": "1" },
            // A renewal in the distant past: only the local clock may say it expired.
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": 1,
                "renewTime": "2000-01-01T00:00:00.000000Z",
            },
        })
    }

    fn election(client: kube::Client) -> LeaderElection {
        let names = ("default".to_owned(), "lease".to_owned(), "me".to_owned());
        LeaderElection::new(
            client,
            names.0,
            names.1,
            names.2,
            TIMINGS,
            &mut Registry::default(),
        )
    }

    /// Renews with a fresh lock from now on; resolves with the reason it stopped leading.
    async fn renew_until_lost(client: kube::Client) -> String {
        let (lost_sender, lost) = oneshot::channel();
        let lock = election(client).lock();
        let stop = CancellationToken::new();
        tokio::spawn(keep_renewing(
            lock,
            TIMINGS,
            Instant::now(),
            stop,
            lost_sender,
        ));
        lost.await.expect("a reason")
    }

    #[tokio::test]
    async fn a_leader_whose_renewals_hang_steps_down_at_the_renew_deadline_before_expiry() {
        let started = Instant::now();
        let reason = renew_until_lost(fake_api(|_| None)).await;
        let elapsed = started.elapsed();
        assert!(elapsed >= TIMINGS.renew_deadline, "{elapsed:?}: {reason}");
        assert!(elapsed < LEASE_DURATION, "{elapsed:?}: {reason}");
        assert!(reason.contains("renew deadline"), "{reason}");
    }

    #[tokio::test]
    async fn a_leader_steps_down_at_its_next_try_when_another_candidate_holds_the_lease() {
        let started = Instant::now();
        let reason = renew_until_lost(fake_api(|_| Some((200, lease("other"))))).await;
        assert!(started.elapsed() < TIMINGS.renew_deadline, "{reason}");
        assert_eq!(reason, "now held by other");
    }

    #[tokio::test]
    async fn a_follower_takes_over_only_after_seeing_the_lease_unchanged_for_its_duration() {
        let writes = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&writes);
        let client = fake_api(move |method| {
            if method == Method::GET {
                return Some((200, lease("other")));
            }
            counted.fetch_add(1, Ordering::SeqCst);
            Some((200, lease("me")))
        });
        let started = Instant::now();
        let leadership = election(client)
            .acquire(&CancellationToken::new())
            .await
            .expect("no error");
        assert!(leadership.is_some());
        assert!(
            started.elapsed() >= LEASE_DURATION,
            "{:?}",
            started.elapsed()
        );
        assert_eq!(writes.load(Ordering::SeqCst), 1, "one write, when expired");
    }

    #[test]
    fn identities_name_the_host_and_differ_between_processes() {
        let first = identity(Some("pgkube-7d9f".into()));
        let second = identity(Some("pgkube-7d9f".into()));
        assert!(first.starts_with("pgkube-7d9f_"), "{first}");
        assert_ne!(first, second);
        assert!(identity(None).starts_with("pgkube_"));
    }
}
