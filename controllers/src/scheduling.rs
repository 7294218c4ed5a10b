//! Where a cluster's pods may run: the scheduling fields of a `PostgreSQLCluster`
//! (`nodeSelector`, `tolerations`, `affinity`), copied into the pod spec of every pod made for
//! the cluster (its instances, its backup and restore Jobs), and what the operator adds:
//! - instance pods avoid each other's nodes (`spread.nodeAntiAffinity`, preferred by default)
//!   unless `affinity.podAntiAffinity` says otherwise, and follow `spread`'s topology spread
//!   constraints;
//! - backup Job pods prefer a node other than the primary's, so that a node's loss does not
//!   take both.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, PodAffinityTerm, PodAntiAffinity, PodSpec, Toleration, TopologySpreadConstraint,
    WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use pgkube_crds::{InstanceSpread, NodeAntiAffinity, PostgreSQLClusterSpec};

/// The node label that tells nodes apart.
pub const HOSTNAME_TOPOLOGY: &str = "kubernetes.io/hostname";
/// The weight of the preferences the operator adds (the highest the API allows).
const PREFERENCE_WEIGHT: i32 = 100;

/// The scheduling fields of a pod made for a cluster, in pod spec terms.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Scheduling {
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    pub affinity: Option<Affinity>,
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
}

impl Scheduling {
    /// The scheduling fields of `spec`, as they are.
    pub fn of(spec: &PostgreSQLClusterSpec) -> Self {
        Self {
            node_selector: spec.node_selector.clone(),
            tolerations: spec.tolerations.clone(),
            affinity: spec.affinity.clone(),
            topology_spread_constraints: Vec::new(),
        }
    }

    /// An instance pod's: `spec`'s fields and its spread, over the instances `instances`
    /// selects.
    pub fn for_instances(
        spec: &PostgreSQLClusterSpec,
        instances: &BTreeMap<String, String>,
    ) -> Self {
        let spread = spec.spread.as_ref();
        let mut scheduling = Self::of(spec);
        let own_anti_affinity = spec
            .affinity
            .as_ref()
            .is_some_and(|affinity| affinity.pod_anti_affinity.is_some());
        if !own_anti_affinity {
            let term = pod_term(instances);
            let anti_affinity = match InstanceSpread::node_anti_affinity(spread) {
                NodeAntiAffinity::Preferred => Some(PodAntiAffinity {
                    preferred_during_scheduling_ignored_during_execution: Some(vec![
                        WeightedPodAffinityTerm {
                            weight: PREFERENCE_WEIGHT,
                            pod_affinity_term: term,
                        },
                    ]),
                    ..PodAntiAffinity::default()
                }),
                NodeAntiAffinity::Required => Some(PodAntiAffinity {
                    required_during_scheduling_ignored_during_execution: Some(vec![term]),
                    ..PodAntiAffinity::default()
                }),
                NodeAntiAffinity::Disabled => None,
            };
            if anti_affinity.is_some() {
                scheduling
                    .affinity
                    .get_or_insert_with(Affinity::default)
                    .pod_anti_affinity = anti_affinity;
            }
        }
        scheduling.topology_spread_constraints = spread
            .map(|spread| spread.topology_spread_constraints.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|mut constraint| {
                if constraint.label_selector.is_none() {
                    constraint.label_selector = Some(selector(instances));
                }
                constraint
            })
            .collect();
        scheduling
    }

    /// A backup Job pod's: `spec`'s fields, and a preference for a node without the pod
    /// `primary` selects.
    pub fn for_backup(spec: &PostgreSQLClusterSpec, primary: &BTreeMap<String, String>) -> Self {
        let mut scheduling = Self::of(spec);
        let anti_affinity = scheduling
            .affinity
            .get_or_insert_with(Affinity::default)
            .pod_anti_affinity
            .get_or_insert_with(PodAntiAffinity::default);
        anti_affinity
            .preferred_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(WeightedPodAffinityTerm {
                weight: PREFERENCE_WEIGHT,
                pod_affinity_term: pod_term(primary),
            });
        scheduling
    }

    /// Sets the pod's scheduling fields to these; an empty field leaves the pod without it
    /// (rather than an empty value that the API server would drop anyway, which keeps the
    /// desired and the live object alike).
    pub fn apply_to(&self, pod: &mut PodSpec) {
        pod.node_selector = (!self.node_selector.is_empty()).then(|| self.node_selector.clone());
        pod.tolerations = (!self.tolerations.is_empty()).then(|| self.tolerations.clone());
        pod.affinity = self.affinity.clone();
        pod.topology_spread_constraints = (!self.topology_spread_constraints.is_empty())
            .then(|| self.topology_spread_constraints.clone());
    }
}

fn selector(labels: &BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels.clone()),
        ..LabelSelector::default()
    }
}

/// The pods `labels` select, counted per node.
fn pod_term(labels: &BTreeMap<String, String>) -> PodAffinityTerm {
    PodAffinityTerm {
        label_selector: Some(selector(labels)),
        topology_key: HOSTNAME_TOPOLOGY.to_owned(),
        ..PodAffinityTerm::default()
    }
}

#[cfg(test)]
mod tests;
