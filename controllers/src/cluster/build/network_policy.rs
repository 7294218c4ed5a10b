//! The cluster's NetworkPolicy (`<cluster>-postgresql`): which connections reach its pods.
//!
//! - PostgreSQL's port: the pods of the cluster's namespace (applications, backup and restore
//!   Jobs, the other instances), and the peers of `spec.networkPolicy.postgresFrom`.
//! - The instance managers' port: the cluster's own pods (they read each other's status) and
//!   the operator's namespace, when the operator runs in one. The kubelet's probes come from the
//!   node, which NetworkPolicies do not restrict.
//! - The PostgreSQL metrics' port: the same peers as PostgreSQL's (a Prometheus in another
//!   namespace is one of `postgresFrom`).
//!
//! Other ports are closed to everyone.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};

use super::*;

/// The label every namespace carries with its own name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The NetworkPolicy of `cluster`, whose extra PostgreSQL peers are `postgres_from`;
/// `manager_namespace` is where the operator runs, if in a pod.
pub(super) fn network_policy(
    cluster: &ValidatedCluster,
    names: &ChildNames,
    postgres_from: &[NetworkPolicyPeer],
    manager_namespace: Option<&str>,
) -> NetworkPolicy {
    let same_namespace = NetworkPolicyPeer {
        pod_selector: Some(LabelSelector::default()),
        ..NetworkPolicyPeer::default()
    };
    let cluster_pods = NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(selector_labels(names)),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    };
    let manager = manager_namespace.map(|namespace| NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                NAMESPACE_NAME_LABEL.to_owned(),
                namespace.to_owned(),
            )])),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    });
    let rule = |port: i32, from: Vec<NetworkPolicyPeer>| NetworkPolicyIngressRule {
        ports: Some(vec![NetworkPolicyPort {
            port: Some(IntOrString::Int(port)),
            protocol: Some("TCP".to_owned()),
            end_port: None,
        }]),
        from: Some(from),
    };
    let postgres: Vec<NetworkPolicyPeer> = std::iter::once(same_namespace)
        .chain(postgres_from.iter().cloned())
        .collect();
    let status = std::iter::once(cluster_pods).chain(manager).collect();
    NetworkPolicy {
        metadata: metadata(cluster, names, &names.network_policy),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selector_labels(names)),
                ..LabelSelector::default()
            }),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(vec![
                rule(POSTGRES_PORT, postgres.clone()),
                rule(i32::from(STATUS_PORT), status),
                rule(i32::from(METRICS_PORT), postgres),
            ]),
            egress: None,
        }),
    }
}
