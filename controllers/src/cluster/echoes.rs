//! Echoes: the watch events that only bring back a cluster's status as this controller wrote
//! it. They trigger no reconcile.
//!
//! A reconcile that writes the status has already decided, from that new status, when the
//! cluster is to be looked at next (its requeue). Yet the write comes back through the cluster
//! watch as a change, and each change triggers a reconcile: one more per status write, which
//! reads and asks the instances again to find what the last one just wrote. When 1,000
//! clusters converge, each writes its status about twice, and the one written last (Running)
//! was followed by such a reconcile of its own.
//!
//! So the status step records the resourceVersion that its write gave the cluster, and the
//! trigger of the cluster controller drops the one watch event that carries exactly that
//! version: the object as the controller wrote it, nothing else changed. Any other change
//! (the spec, the metadata, a status written by someone else, a later write) has another
//! version and triggers as before. The status writes that the next step depends on (a
//! switchover or failover recorded) are not recorded here: their echo is what carries the
//! change through.
//!
//! Losing the race is harmless: an echo that arrives before its write's answer is recorded
//! triggers a reconcile, as every echo did before. A recorded version whose echo never comes
//! (it came first, or a relisting watch saw only a later version) stays until the cluster's
//! next write or its deletion: a version is never reused, so it can only ever match its echo.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use kube::ResourceExt;
use pgkube_crds::PostgreSQLCluster;

/// The resourceVersion of each cluster's last status write, by `namespace/name`.
#[derive(Debug, Default)]
pub struct StatusEchoes {
    written: Mutex<HashMap<String, String>>,
}

impl StatusEchoes {
    /// Records that the status write of the cluster `key` gave it `resource_version`.
    pub fn record(&self, key: &str, resource_version: String) {
        self.written().insert(key.to_owned(), resource_version);
    }

    /// Whether `cluster` is the echo of its last recorded status write. An echo is dropped from
    /// the record: it comes once.
    pub fn is_echo(&self, cluster: &PostgreSQLCluster) -> bool {
        let Some(version) = cluster.resource_version() else {
            return false;
        };
        let key = super::cluster_key(cluster);
        let mut written = self.written();
        if written.get(&key) == Some(&version) {
            written.remove(&key);
            true
        } else {
            false
        }
    }

    /// Forgets the cluster `key` (deleted).
    pub fn forget(&self, key: &str) {
        self.written().remove(key);
    }

    fn written(&self) -> MutexGuard<'_, HashMap<String, String>> {
        // A panic while holding the lock leaves the map usable: an entry is at worst stale.
        self.written
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(name: &str, resource_version: &str) -> PostgreSQLCluster {
        let spec = serde_json::from_value(serde_json::json!({ "storage": {"size": "1Gi"} }))
            .expect("spec");
        let mut cluster = PostgreSQLCluster::new(name, spec);
        cluster.metadata.namespace = Some("ns".to_owned());
        cluster.metadata.resource_version = Some(resource_version.to_owned());
        cluster
    }

    #[test]
    fn the_written_version_is_an_echo_once() {
        let echoes = StatusEchoes::default();
        echoes.record("ns/a", "7".to_owned());
        assert!(echoes.is_echo(&cluster("a", "7")));
        assert!(
            !echoes.is_echo(&cluster("a", "7")),
            "the same version came twice (a relist): only the first is the echo"
        );
    }

    #[test]
    fn other_versions_and_other_clusters_are_changes() {
        let echoes = StatusEchoes::default();
        echoes.record("ns/a", "7".to_owned());
        assert!(!echoes.is_echo(&cluster("b", "7")), "another cluster");
        assert!(
            !echoes.is_echo(&cluster("a", "6")),
            "an earlier change, delivered after the write's answer"
        );
        assert!(
            echoes.is_echo(&cluster("a", "7")),
            "the earlier change left the record for the echo"
        );
        assert!(!echoes.is_echo(&cluster("a", "8")), "a later change");
    }

    #[test]
    fn a_forgotten_cluster_has_no_echo() {
        let echoes = StatusEchoes::default();
        echoes.record("ns/a", "7".to_owned());
        echoes.forget("ns/a");
        assert!(!echoes.is_echo(&cluster("a", "7")));
    }

    #[test]
    fn a_cluster_without_a_version_is_a_change() {
        let echoes = StatusEchoes::default();
        echoes.record("ns/a", "7".to_owned());
        let mut unversioned = cluster("a", "7");
        unversioned.metadata.resource_version = None;
        assert!(!echoes.is_echo(&unversioned));
    }
}
