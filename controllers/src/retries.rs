//! Retries of the backup and restore controllers: the consecutive failures of each object set
//! its backoff (the cluster controller's delays), and each failure says why in a Warning Event.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::events::Recorder;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

/// First and longest retry delay after an error.
const BACKOFF_BASE: Duration = Duration::from_secs(2);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// `BACKOFF_BASE * 2^(failures - 1)`, at most `BACKOFF_MAX`: the retry delay of the cluster
/// and backup controllers after `failures` consecutive failures of one object.
pub(crate) fn backoff(failures: u32) -> Duration {
    let factor = 2u32.saturating_pow(failures.saturating_sub(1));
    BACKOFF_BASE.saturating_mul(factor).min(BACKOFF_MAX)
}

/// Consecutive failures by `namespace/name`; cleared by a success.
#[derive(Default)]
pub struct Retries {
    failures: Mutex<HashMap<String, u32>>,
}

impl Retries {
    /// Forgets the failures of `object`: its next failure starts the backoff again.
    pub fn succeeded<K: ResourceExt>(&self, object: &K) {
        self.failures().remove(&key(object));
    }

    /// Counts a failure of `object`, publishes a Warning Event with `error`, and retries after
    /// a delay that doubles with each consecutive failure.
    pub fn failed<K>(
        &self,
        object: &K,
        error: &impl std::fmt::Display,
        recorder: &Recorder,
    ) -> Action
    where
        K: Resource<DynamicType = ()>,
    {
        let failures = {
            let mut failures = self.failures();
            let count = failures.entry(key(object)).or_default();
            *count = count.saturating_add(1);
            *count
        };
        let recorder = recorder.clone();
        let reference = object.object_ref(&());
        let note = error.to_string();
        // The retry does not wait for the Event.
        tokio::spawn(async move {
            crate::publish_event(
                &recorder,
                &reference,
                true,
                "ReconcileFailed",
                note,
                "Reconcile",
            )
            .await;
        });
        Action::requeue(backoff(failures))
    }

    fn failures(&self) -> MutexGuard<'_, HashMap<String, u32>> {
        // A panic while holding the lock leaves the counts usable.
        self.failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn key<K: ResourceExt>(object: &K) -> String {
    format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_failure_up_to_a_maximum() {
        assert_eq!(backoff(1), Duration::from_secs(2));
        assert_eq!(backoff(2), Duration::from_secs(4));
        assert_eq!(backoff(5), Duration::from_secs(32));
        assert_eq!(backoff(40), BACKOFF_MAX);
    }
}
