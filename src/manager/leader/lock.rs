//! The Lease record and the writes leader election makes to it, as client-go's `LeaderElector`
//! does (`tryAcquireOrRenew`, `release`).
//!
//! Why not kube-lease-manager (used before): it takes over an expired Lease in two
//! unconditional writes (a strategic merge patch clearing the holder, then an apply), and
//! renews by a patch that does not check who holds the Lease. A renewal of the old leader that
//! lands between the new candidate's read and its clearing write is overwritten, while the old
//! leader's read-back still names itself: both lead. It also judges expiry by comparing the
//! Lease's `renewTime` (the writer's clock) with the local clock, so clock skew between nodes
//! shortens or lengthens leases.
//!
//! Here, two rules make two leaders impossible:
//! - every write is a create or an update (PUT) carrying the `resourceVersion` of the record it
//!   was decided on: when anyone wrote in between, the API server refuses it with a conflict and
//!   nothing is written. Field managers play no part (they only matter to server-side apply);
//!   the resourceVersion precondition is what serializes the candidates.
//! - expiry is measured on the local monotonic clock only: a candidate takes over a held Lease
//!   only after seeing the same record unchanged for the Lease's `leaseDurationSeconds` since it
//!   first read it, never by comparing timestamps written by another machine. The leader, on its
//!   side, counts its renew deadline from before it sent its last successful renewal, so it
//!   steps down before any candidate can consider the Lease expired; the lease duration minus
//!   the renew deadline absorbs differences in clock rate and the time stepping down takes.
//!
//! Each request is bounded by a timeout, so a request that hangs (a cut connection) leaves time
//! to retry before the renew deadline.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::time::Instant;

/// The field manager of the Lease's writes (updates, not applies: see the module docs).
const FIELD_MANAGER: &str = "pgkube-leader-election";

/// A request to the API server about the Lease that failed or did not answer in time.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{0}")]
    Api(kube::Error),
    #[error("the API server did not answer within {0:?}")]
    Timeout(Duration),
}

impl LockError {
    /// The manager is not allowed to use the Lease: retrying cannot help.
    pub fn is_forbidden(&self) -> bool {
        matches!(self, LockError::Api(kube::Error::Api(status)) if matches!(status.code, 401 | 403))
    }
}

/// What one attempt to acquire or renew found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// This process holds the Lease, written by this attempt.
    Leading,
    /// Another candidate holds the Lease, and it has not expired by the local clock.
    HeldBy(String),
    /// Someone wrote the Lease between this attempt's read and its write; nothing was written.
    Conflict,
}

/// The Lease record as last read or written, and when (local clock) it was first seen so.
struct Observed {
    lease: Lease,
    since: Instant,
}

impl Observed {
    /// Whether the holder's time is up: `leaseDurationSeconds` passed since the record was
    /// first seen unchanged.
    fn expired(&self, now: Instant, default_duration: Duration) -> bool {
        let duration = lease_duration(&self.lease).unwrap_or(default_duration);
        now >= self.since + duration
    }
}

/// One candidate's view of, and writes to, the Lease.
pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration_seconds: i32,
    request_timeout: Duration,
    observed: Option<Observed>,
}

impl LeaseLock {
    pub fn new(
        api: Api<Lease>,
        name: String,
        identity: String,
        duration_seconds: i32,
        request_timeout: Duration,
    ) -> Self {
        Self {
            api,
            name,
            identity,
            duration_seconds,
            request_timeout,
            observed: None,
        }
    }

    /// One try to acquire the Lease, or to renew it when this process holds it. Makes at most
    /// one read and one write, each bounded by the request timeout.
    pub async fn try_acquire_or_renew(&mut self) -> Result<Attempt, LockError> {
        let now = Instant::now();
        if let Some(renewed) = self.own_valid_record(now) {
            // Fast path, as client-go: renew the record this process wrote last, with its
            // resourceVersion as the precondition; only a conflict needs a fresh read.
            if self.replace(renewed, now).await? {
                return Ok(Attempt::Leading);
            }
        }
        let Some(current) = self.bounded(self.api.get_opt(&self.name)).await? else {
            return self.create(now).await;
        };
        self.observe(current, now);
        let Some(observed) = &self.observed else {
            return Ok(Attempt::Conflict);
        };
        if let Some(holder) = holder(&observed.lease).filter(|h| *h != self.identity)
            && !observed.expired(now, self.default_duration())
        {
            return Ok(Attempt::HeldBy(holder.to_owned()));
        }
        let claimed = claimed(
            observed.lease.clone(),
            &self.identity,
            self.duration_seconds,
        );
        Ok(if self.replace(claimed, now).await? {
            Attempt::Leading
        } else {
            Attempt::Conflict
        })
    }

    /// Clears the holder so that a follower takes over at its next look, if this process
    /// still holds the Lease. `false` when someone else wrote it meanwhile.
    pub async fn release(&mut self) -> Result<bool, LockError> {
        let Some(observed) = &self.observed else {
            return Ok(false);
        };
        if holder(&observed.lease) != Some(self.identity.as_str()) {
            return Ok(false);
        }
        let now = Instant::now();
        if self.replace(released(observed.lease.clone()), now).await? {
            return Ok(true);
        }
        // A renewal whose answer timed out may have landed after all: read it back, and
        // release what this process still holds.
        match self.bounded(self.api.get_opt(&self.name)).await? {
            Some(current) if holder(&current) == Some(self.identity.as_str()) => {
                self.replace(released(current), now).await
            }
            _ => Ok(false),
        }
    }

    /// A renewed copy of the record, when this process wrote it last and it is still valid.
    fn own_valid_record(&self, now: Instant) -> Option<Lease> {
        let observed = self.observed.as_ref()?;
        let ours = holder(&observed.lease) == Some(self.identity.as_str());
        (ours && !observed.expired(now, self.default_duration())).then(|| {
            claimed(
                observed.lease.clone(),
                &self.identity,
                self.duration_seconds,
            )
        })
    }

    /// Records what was read: a changed record restarts the expiry clock.
    fn observe(&mut self, current: Lease, now: Instant) {
        match &mut self.observed {
            // Same holder and renewal: keep when it was first seen (its resourceVersion may
            // differ, for a change that is not a renewal).
            Some(observed) if observed.lease.spec == current.spec => observed.lease = current,
            _ => {
                self.observed = Some(Observed {
                    lease: current,
                    since: now,
                })
            }
        }
    }

    async fn create(&mut self, now: Instant) -> Result<Attempt, LockError> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: None,
        };
        let lease = claimed(lease, &self.identity, self.duration_seconds);
        let params = post_params();
        match self.bounded(self.api.create(&params, &lease)).await {
            Ok(written) => {
                self.observe(written, now);
                Ok(Attempt::Leading)
            }
            // Another candidate created it first.
            Err(LockError::Api(kube::Error::Api(status))) if status.is_already_exists() => {
                Ok(Attempt::Conflict)
            }
            Err(error) => Err(error),
        }
    }

    /// Writes `lease` under the precondition of its resourceVersion. `false` on a conflict.
    async fn replace(&mut self, lease: Lease, now: Instant) -> Result<bool, LockError> {
        let params = post_params();
        match self
            .bounded(self.api.replace(&self.name, &params, &lease))
            .await
        {
            Ok(written) => {
                self.observed = Some(Observed {
                    lease: written,
                    since: now,
                });
                Ok(true)
            }
            Err(LockError::Api(kube::Error::Api(status))) if status.is_conflict() => Ok(false),
            Err(error) => Err(error),
        }
    }

    async fn bounded<T>(
        &self,
        request: impl Future<Output = kube::Result<T>>,
    ) -> Result<T, LockError> {
        tokio::time::timeout(self.request_timeout, request)
            .await
            .map_err(|_elapsed| LockError::Timeout(self.request_timeout))?
            .map_err(LockError::Api)
    }

    fn default_duration(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.duration_seconds).unwrap_or(1))
    }
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}

/// The holder of the Lease; an empty identity (client-go's release) means none.
fn holder(lease: &Lease) -> Option<&str> {
    let holder = lease.spec.as_ref()?.holder_identity.as_deref()?;
    (!holder.is_empty()).then_some(holder)
}

fn lease_duration(lease: &Lease) -> Option<Duration> {
    let seconds = lease.spec.as_ref()?.lease_duration_seconds?;
    Some(Duration::from_secs(u64::try_from(seconds).ok()?))
}

/// `lease` held by `identity` and renewed now. Taking it over from someone else (or from
/// nobody) sets the acquire time and counts a transition.
fn claimed(mut lease: Lease, identity: &str, duration_seconds: i32) -> Lease {
    let now = MicroTime(Timestamp::now());
    let taking_over = holder(&lease) != Some(identity);
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if taking_over {
        spec.holder_identity = Some(identity.to_owned());
        spec.acquire_time = Some(now.clone());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.renew_time = Some(now);
    spec.lease_duration_seconds = Some(duration_seconds);
    // Left out, the API server keeps and updates them; sent back, they would be replaced.
    lease.metadata.managed_fields = None;
    lease
}

/// `lease` with no holder, as client-go releases it.
fn released(mut lease: Lease) -> Lease {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    spec.lease_duration_seconds = Some(1);
    lease.metadata.managed_fields = None;
    lease
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(identity: &str, transitions: i32) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some(identity.to_owned()),
                lease_duration_seconds: Some(5),
                lease_transitions: Some(transitions),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_does_not() {
        let taken = claimed(held_by("a", 3), "b", 15);
        let spec = taken.spec.as_ref().expect("spec");
        assert_eq!(holder(&taken), Some("b"));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert!(spec.acquire_time.is_some() && spec.renew_time.is_some());

        let renewed = claimed(taken.clone(), "b", 15);
        let renewed_spec = renewed.spec.as_ref().expect("spec");
        assert_eq!(renewed_spec.lease_transitions, Some(4));
        assert_eq!(renewed_spec.acquire_time, spec.acquire_time);
    }

    #[test]
    fn a_released_or_empty_holder_is_nobody() {
        assert_eq!(holder(&released(held_by("a", 1))), None);
        assert_eq!(holder(&held_by("", 1)), None);
        assert_eq!(holder(&held_by("a", 1)), Some("a"));
    }

    #[test]
    fn expiry_counts_from_when_the_record_was_first_seen_on_the_local_clock() {
        let seen = Instant::now();
        let observed = Observed {
            lease: held_by("a", 1), // 5 s
            since: seen,
        };
        let default = Duration::from_secs(15);
        assert!(!observed.expired(seen + Duration::from_millis(4999), default));
        assert!(observed.expired(seen + Duration::from_secs(5), default));
        let no_duration = Observed {
            lease: Lease::default(),
            since: seen,
        };
        assert!(!no_duration.expired(seen + Duration::from_secs(5), default));
    }
}
