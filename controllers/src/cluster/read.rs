//! Read: the live children of a cluster, as they are before this reconcile changes anything,
//! and what the instance managers of its pods report. The children come from the controller's
//! caches (see `cache`): a reconcile reads nothing from the API server.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use pgkube_crds::MAX_REPLICAS;
use tracing::{Instrument, info_span};

use super::build::{ChildNames, DATA_VOLUME, VERSION_ANNOTATION, selector_labels};
use super::cache::{ChildStores, cached_object, cached_text};
use super::instances::{self, ClusterAccess, InstanceStatusSource, ObservedInstance};
use super::roles;
use super::validate::LiveFacts;
use crate::compact::Compact;
use crate::quantity;

/// A cluster's children that exist now. The StatefulSet, pods and claims are decoded, as
/// validation, the status and the roles read them. The Services, the ConfigMap and the
/// PodDisruptionBudget stay as the caches' text (shared, not copied: a watch event replaces a
/// cached object, never changes it): drift detection compares them as JSON values, parsed
/// straight from the text, and most reconciles find the cluster settled and compare nothing.
#[derive(Clone, Debug, Default)]
pub struct LiveChildren {
    pub statefulset: Option<Arc<StatefulSet>>,
    pub headless_service: Option<Arc<Compact<Service>>>,
    pub rw_service: Option<Arc<Compact<Service>>>,
    pub ro_service: Option<Arc<Compact<Service>>>,
    pub r_service: Option<Arc<Compact<Service>>>,
    /// The client Service of earlier versions, to delete.
    pub old_client_service: Option<Arc<Compact<Service>>>,
    pub config_map: Option<Arc<Compact<ConfigMap>>>,
    pub credentials_exist: bool,
    pub replication_credentials_exist: bool,
    pub application_credentials_exist: bool,
    pub control_token_exists: bool,
    /// What the metadata of each certificate Secret that exists says, by Secret name.
    pub certificates: BTreeMap<String, super::certificates::LeafState>,
    pub ca_exists: bool,
    pub pod_disruption_budget: Option<Arc<Compact<PodDisruptionBudget>>>,
    pub network_policy: Option<Arc<Compact<NetworkPolicy>>>,
    /// The StatefulSet's data volume claims (`data-<statefulset>-N`), by ordinal.
    pub data_claims: Vec<Arc<PersistentVolumeClaim>>,
    /// The StatefulSet's pods and what their instance managers report, by ordinal.
    pub instances: Vec<ObservedInstance>,
    /// The pods' addresses, by pod name, for commands to their instance managers.
    pub addresses: BTreeMap<String, IpAddr>,
    /// How to reach the instance managers over TLS, once the cluster has its CA and token.
    pub access: Option<Arc<ClusterAccess>>,
    /// The template revision each pod was made from, by pod name, for the rollout.
    pub pods: BTreeMap<String, super::rollout::LivePod>,
}

/// Reads the children named by `names` in `namespace` from `stores`, and asks the instance
/// manager of each of the cluster's pods through `source`, with `access`.
pub async fn read(
    stores: &ChildStores,
    namespace: &str,
    names: &ChildNames,
    source: &dyn InstanceStatusSource,
    access: Option<Arc<ClusterAccess>>,
) -> LiveChildren {
    let statefulset = cached_object(&stores.statefulsets, namespace, &names.statefulset);
    let service = |name| cached_text(&stores.services, namespace, name);
    let (data_claims, instances, addresses, live_pods) = if statefulset.is_some() {
        let pods = pods(stores, namespace, names);
        let live_pods = pods
            .iter()
            .map(|pod| (pod.name_any(), super::rollout::LivePod::of(pod)))
            .collect();
        let instances = instances::observe(pods.iter().map(AsRef::as_ref), source, access.as_ref())
            .instrument(info_span!("instances", pods = pods.len()))
            .await;
        let addresses = pods
            .iter()
            .filter_map(|pod| instances::pod_address(pod))
            .collect();
        (
            data_claims(stores, namespace, names),
            instances,
            addresses,
            live_pods,
        )
    } else {
        (Vec::new(), Vec::new(), BTreeMap::new(), BTreeMap::new())
    };
    let secret_exists = |name| cached_text(&stores.secrets, namespace, name).is_some();
    let certificates = [
        &names.server_tls_secret,
        &names.replication_tls_secret,
        &names.superuser_tls_secret,
    ]
    .into_iter()
    .filter_map(|name| {
        let meta = cached_text(&stores.secrets, namespace, name)?.decode_or_warn()?;
        let annotations = meta.metadata.annotations.unwrap_or_default();
        Some((
            name.clone(),
            super::certificates::LeafState::from_annotations(&annotations),
        ))
    })
    .collect();
    LiveChildren {
        statefulset,
        headless_service: service(&names.headless_service),
        rw_service: service(&names.rw_service),
        ro_service: service(&names.ro_service),
        r_service: service(&names.r_service),
        old_client_service: service(&names.old_client_service),
        config_map: cached_text(&stores.config_maps, namespace, &names.config_map),
        credentials_exist: secret_exists(&names.secret),
        replication_credentials_exist: secret_exists(&names.replication_secret),
        application_credentials_exist: secret_exists(&names.application_secret),
        control_token_exists: secret_exists(&names.control_secret),
        certificates,
        ca_exists: secret_exists(&names.ca_secret),
        pod_disruption_budget: cached_text(
            &stores.budgets,
            namespace,
            &names.pod_disruption_budget,
        ),
        network_policy: cached_text(&stores.network_policies, namespace, &names.network_policy),
        data_claims,
        instances,
        addresses,
        access,
        pods: live_pods,
    }
}

impl LiveChildren {
    /// Where to ask the instance manager of `pod`, once the pod has an address.
    pub fn instance_address(&self, pod: &str) -> Option<instances::InstanceAddress> {
        let ip = *self.addresses.get(pod)?;
        let uid = self
            .instances
            .iter()
            .find(|instance| instance.pod == pod)
            .and_then(|instance| instance.uid.clone());
        Some(instances::InstanceAddress {
            pod: pod.to_owned(),
            ip,
            uid,
            access: self.access.clone(),
        })
    }

    /// What validation needs to know about the live state.
    pub fn facts(&self) -> LiveFacts {
        let running_version = self
            .statefulset
            .as_ref()
            .and_then(|sts| {
                sts.metadata
                    .annotations
                    .as_ref()?
                    .get(VERSION_ANNOTATION)
                    .cloned()
            })
            .and_then(|version| serde_json::from_value(serde_json::Value::String(version)).ok());
        let data_claim_template = self.statefulset.as_ref().and_then(|sts| {
            sts.spec
                .as_ref()?
                .volume_claim_templates
                .as_ref()?
                .iter()
                .find(|claim| claim.metadata.name.as_deref() == Some(DATA_VOLUME))
        });
        let claim_template_storage = data_claim_template.and_then(claim_request);
        let claim_template_class =
            data_claim_template.and_then(|claim| claim.spec.as_ref()?.storage_class_name.clone());
        let largest_volume_gib = self
            .data_claims
            .iter()
            .filter_map(|claim| quantity::gibibytes(&claim_request(claim)?))
            .max();
        LiveFacts {
            running_version,
            claim_template_storage,
            claim_template_class,
            largest_volume_gib,
            running_replicas: self
                .statefulset
                .as_ref()
                .and_then(|sts| sts.spec.as_ref()?.replicas),
            primary_ordinal: None,
        }
    }
}

/// The storage a claim requests.
pub fn claim_request(claim: &PersistentVolumeClaim) -> Option<String> {
    claim
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
        .map(|quantity| quantity.0.clone())
}

/// The ordinals a cluster's pods and claims can have. `spec.replicas` is at most
/// [`MAX_REPLICAS`] in every version's schema, and the StatefulSet is never given more, so its
/// pods and claims are found by name: a scan of the whole cache would cost every reconcile
/// time in proportion to every cluster's pods.
fn possible_ordinals() -> std::ops::Range<i32> {
    0..MAX_REPLICAS
}

/// The StatefulSet's pods (`<statefulset>-N`) that carry its selector's labels, by ordinal.
fn pods(stores: &ChildStores, namespace: &str, names: &ChildNames) -> Vec<Arc<Pod>> {
    let selector = selector_labels(names);
    possible_ordinals()
        .filter_map(|ordinal| {
            cached_object(
                &stores.pods,
                namespace,
                &roles::pod_name(&names.statefulset, ordinal),
            )
        })
        .filter(|pod| {
            let labels = pod.labels();
            selector
                .iter()
                .all(|(key, value)| labels.get(key) == Some(value))
        })
        .collect()
}

/// The StatefulSet's data volume claims (`data-<statefulset>-N`) that carry the cluster's
/// instance label, by ordinal.
fn data_claims(
    stores: &ChildStores,
    namespace: &str,
    names: &ChildNames,
) -> Vec<Arc<PersistentVolumeClaim>> {
    possible_ordinals()
        .filter_map(|ordinal| cached_object(&stores.claims, namespace, &names.data_claim(ordinal)))
        .filter(|claim| {
            claim.labels().get("app.kubernetes.io/instance") == Some(&names.instance_label)
        })
        .collect()
}
