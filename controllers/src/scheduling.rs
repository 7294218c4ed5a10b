//! Where a cluster's pods may run: the scheduling fields of a `PostgreSQLCluster`
//! (`nodeSelector`, `tolerations`, `affinity`), copied as they are into the pod spec of every pod
//! made for the cluster (its instances now, its backup and restore Jobs too).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, PodSpec, Toleration};
use pgkube_crds::PostgreSQLClusterSpec;

/// The scheduling fields of a cluster, in pod spec terms.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Scheduling {
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    pub affinity: Option<Affinity>,
}

impl Scheduling {
    /// The scheduling fields of `spec`.
    pub fn of(spec: &PostgreSQLClusterSpec) -> Self {
        Self {
            node_selector: spec.node_selector.clone(),
            tolerations: spec.tolerations.clone(),
            affinity: spec.affinity.clone(),
        }
    }

    /// Sets the pod's `nodeSelector`, `tolerations` and `affinity` to these, verbatim; an empty
    /// field leaves the pod without it (rather than an empty value that the API server would
    /// drop anyway, which keeps the desired and the live object alike).
    pub fn apply_to(&self, pod: &mut PodSpec) {
        pod.node_selector = (!self.node_selector.is_empty()).then(|| self.node_selector.clone());
        pod.tolerations = (!self.tolerations.is_empty()).then(|| self.tolerations.clone());
        pod.affinity = self.affinity.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_fields_leave_the_pod_without_them() {
        let mut pod = PodSpec {
            node_selector: Some(BTreeMap::from([("a".to_owned(), "b".to_owned())])),
            tolerations: Some(vec![Toleration::default()]),
            affinity: Some(Affinity::default()),
            ..PodSpec::default()
        };
        Scheduling::default().apply_to(&mut pod);
        assert_eq!(pod, PodSpec::default());
    }
}
