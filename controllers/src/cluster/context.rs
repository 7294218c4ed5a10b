//! What the cluster controller's reconciles share: the client and settings, the caches of the
//! clusters' children, backups and restores, and each cluster's consecutive failures.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::reflector::Store;
use pgkube_crds::{PostgreSQLBackup, PostgreSQLCluster, PostgreSQLRestore};

use super::{cache, echoes, settled};
use crate::Context;
use crate::events::Recorder;

/// The least time between two RecoveryProgress Events of one cluster (as often as the recovering
/// instance logs its progress).
pub(super) const PROGRESS_EVENT_EVERY: Duration = Duration::from_secs(30);

/// State shared by the cluster controller's reconciles.
pub struct ClusterContext {
    pub base: Context,
    pub(super) recorder: Recorder,
    /// Consecutive failures per `namespace/name`, for the backoff and to publish an error
    /// Event only when the error changes; cleared on success.
    pub(super) failures: Mutex<HashMap<String, Failures>>,
    /// When the last RecoveryProgress Event of each recovering cluster was published.
    progress_events: Mutex<HashMap<String, Instant>>,
    /// Every PostgreSQLBackup the controllers watch, for the backup fields of the status.
    pub(super) backups: Vec<Store<PostgreSQLBackup>>,
    /// Every PostgreSQLRestore the controllers watch, for the Restoring and Bootstrapped
    /// conditions.
    pub(super) restores: Vec<Store<PostgreSQLRestore>>,
    /// The clusters' children, per watched namespace (or one for all).
    pub(super) children: Vec<cache::ChildStores>,
    /// Clusters whose children were last found up to date, to skip building and comparing
    /// them while nothing they depend on changes.
    pub(super) settled: settled::SettledClusters,
    /// The versions that this controller's status writes gave the clusters, shared with the
    /// trigger, which drops their echoes.
    pub(super) echoes: Arc<echoes::StatusEchoes>,
    /// What recovering clusters recover, read from storage once each.
    pub(super) recovery_orders: super::recovery::Orders,
    /// How each cluster's instance managers are reached over TLS.
    pub(super) instance_access: super::instances::AccessCache,
}

impl ClusterContext {
    /// A context that sees no backups (see [`ClusterContext::with_backups`]).
    pub fn new(base: Context) -> Self {
        let recorder = Recorder::of_manager(base.events.clone());
        Self {
            base,
            recorder,
            failures: Mutex::default(),
            progress_events: Mutex::default(),
            backups: Vec::new(),
            restores: Vec::new(),
            children: Vec::new(),
            settled: settled::SettledClusters::default(),
            echoes: Arc::default(),
            recovery_orders: super::recovery::Orders::default(),
            instance_access: super::instances::AccessCache::default(),
        }
    }

    /// The same context, reading the children of clusters in `namespace` from caches of its
    /// own, which the returned future fills: for reconciles run without the controller (tests).
    pub fn with_caches_of(
        self,
        namespace: &str,
    ) -> (
        Self,
        impl std::future::Future<Output = ()> + Send + 'static + use<>,
    ) {
        let (stores, fill) = cache::ChildStores::standalone(&self.base.client, Some(namespace));
        (self.with_children(vec![stores]), fill)
    }

    /// The same context, reading the clusters' children from `stores`.
    pub(super) fn with_children(self, stores: Vec<cache::ChildStores>) -> Self {
        Self {
            children: stores,
            ..self
        }
    }

    /// The same context, recording its status writes in `echoes` (which the trigger reads).
    pub(super) fn with_echoes(self, echoes: Arc<echoes::StatusEchoes>) -> Self {
        Self { echoes, ..self }
    }

    /// The caches that hold the children of clusters in `namespace`.
    pub(super) fn children_in(&self, namespace: &str) -> Option<&cache::ChildStores> {
        self.children.iter().find(|stores| stores.covers(namespace))
    }

    /// The same context, reading the cluster's backups from `stores`.
    pub fn with_backups(self, stores: Vec<Store<PostgreSQLBackup>>) -> Self {
        Self {
            backups: stores,
            ..self
        }
    }

    /// The same context, reading the cluster's restores from `stores`.
    pub fn with_restores(self, stores: Vec<Store<PostgreSQLRestore>>) -> Self {
        Self {
            restores: stores,
            ..self
        }
    }

    /// The restores into `cluster` as the caches have them.
    pub(super) fn restores_of(&self, cluster: &PostgreSQLCluster) -> Vec<Arc<PostgreSQLRestore>> {
        let namespace = cluster.namespace();
        let name = cluster.name_any();
        self.restores
            .iter()
            .flat_map(Store::state)
            .filter(|restore| restore.namespace() == namespace && restore.spec.cluster.name == name)
            .collect()
    }

    /// The backups of `cluster` as the caches have them.
    pub(super) fn backups_of(&self, cluster: &PostgreSQLCluster) -> Vec<Arc<PostgreSQLBackup>> {
        let namespace = cluster.namespace();
        let name = cluster.name_any();
        self.backups
            .iter()
            .flat_map(Store::state)
            .filter(|backup| backup.namespace() == namespace && backup.spec.cluster.name == name)
            .collect()
    }

    /// Whether a RecoveryProgress Event about the cluster `key` is due at `now` (see
    /// [`progress_due`]).
    pub(super) fn progress_event_due(&self, key: &str, recovering: bool, now: Instant) -> bool {
        let mut published = self
            .progress_events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        progress_due(&mut published, key, recovering, now)
    }

    pub(super) fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, Failures>> {
        // A panic while holding the lock leaves the counts usable.
        self.failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Whether a RecoveryProgress Event about the cluster `key` is due at `now`: the first of a
/// recovery, then one each [`PROGRESS_EVENT_EVERY`]. Not `recovering` forgets the cluster.
fn progress_due(
    published: &mut HashMap<String, Instant>,
    key: &str,
    recovering: bool,
    now: Instant,
) -> bool {
    if !recovering {
        published.remove(key);
        return false;
    }
    let due = published
        .get(key)
        .is_none_or(|last| now.saturating_duration_since(*last) >= PROGRESS_EVENT_EVERY);
    if due {
        published.insert(key.to_owned(), now);
    }
    due
}

/// The consecutive failures of one object.
#[derive(Debug, Default)]
pub(super) struct Failures {
    pub(super) count: u32,
    last_message: Option<String>,
}

impl Failures {
    /// Counts a failure with `message`; true when the message differs from the previous
    /// failure's, so that a retry failing the same way does not publish the same Event again.
    pub(super) fn record(&mut self, message: &str) -> bool {
        self.count = self.count.saturating_add(1);
        let is_new = self.last_message.as_deref() != Some(message);
        if is_new {
            self.last_message = Some(message.to_owned());
        }
        is_new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_progress_is_published_at_once_then_every_thirty_seconds() {
        let mut published = HashMap::new();
        let start = Instant::now();
        let at = |seconds| start + Duration::from_secs(seconds);
        let due = |published: &mut _, seconds, recovering| {
            progress_due(published, "ns/a", recovering, at(seconds))
        };
        assert!(due(&mut published, 0, true), "the first");
        assert!(!due(&mut published, 29, true));
        assert!(due(&mut published, 30, true));
        assert!(!due(&mut published, 31, true));
        assert!(!due(&mut published, 32, false), "no recovery, no Event");
        assert!(due(&mut published, 33, true), "a new recovery's first");
        assert!(
            progress_due(&mut published, "ns/b", true, at(33)),
            "per cluster"
        );
    }

    #[test]
    fn a_failure_is_worth_an_event_only_when_its_message_changes() {
        let mut failures = Failures::default();
        assert!(failures.record("cannot read StatefulSet a: forbidden"));
        assert!(!failures.record("cannot read StatefulSet a: forbidden"));
        assert!(failures.record("cannot apply Service b: conflict"));
        assert!(!failures.record("cannot apply Service b: conflict"));
        // Going back to an earlier error is a change too.
        assert!(failures.record("cannot read StatefulSet a: forbidden"));
        assert_eq!(failures.count, 5, "every failure counts for the backoff");
    }
}
