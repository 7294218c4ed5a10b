//! Read: the live children of a cluster, as they are before this reconcile changes anything,
//! and what the instance managers of its pods report.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use tracing::{Instrument, info_span};

use super::Error;
use super::build::{ChildNames, DATA_VOLUME, VERSION_ANNOTATION, selector_labels};
use super::instances::{self, InstanceStatusSource, ObservedInstance};
use super::roles;
use super::validate::LiveFacts;
use crate::quantity;

/// A cluster's children that exist now.
#[derive(Clone, Debug, Default)]
pub struct LiveChildren {
    pub statefulset: Option<StatefulSet>,
    pub headless_service: Option<Service>,
    pub rw_service: Option<Service>,
    pub ro_service: Option<Service>,
    pub r_service: Option<Service>,
    /// The client Service of earlier versions, to delete.
    pub old_client_service: Option<Service>,
    pub config_map: Option<ConfigMap>,
    pub credentials_exist: bool,
    pub replication_credentials_exist: bool,
    pub pod_disruption_budget: Option<PodDisruptionBudget>,
    /// The StatefulSet's data volume claims (`data-<statefulset>-N`), any ordinal.
    pub data_claims: Vec<PersistentVolumeClaim>,
    /// The StatefulSet's pods and what their instance managers report, by ordinal.
    pub instances: Vec<ObservedInstance>,
}

/// Reads the children named by `names` in `namespace`, and asks the instance manager of each
/// of the cluster's pods through `source`.
pub async fn read(
    client: &Client,
    namespace: &str,
    names: &ChildNames,
    source: &dyn InstanceStatusSource,
) -> Result<LiveChildren, Error> {
    let statefulset = get::<StatefulSet>(client, namespace, &names.statefulset).await?;
    let (data_claims, instances) = if statefulset.is_some() {
        let pods = pods(client, namespace, names).await?;
        let instances = instances::observe(&pods, source)
            .instrument(info_span!("instances", pods = pods.len()))
            .await;
        (data_claims(client, namespace, names).await?, instances)
    } else {
        (Vec::new(), Vec::new())
    };
    Ok(LiveChildren {
        statefulset,
        headless_service: get(client, namespace, &names.headless_service).await?,
        rw_service: get(client, namespace, &names.rw_service).await?,
        ro_service: get(client, namespace, &names.ro_service).await?,
        r_service: get(client, namespace, &names.r_service).await?,
        old_client_service: get(client, namespace, &names.old_client_service).await?,
        config_map: get(client, namespace, &names.config_map).await?,
        credentials_exist: exists::<Secret>(client, namespace, &names.secret).await?,
        replication_credentials_exist: exists::<Secret>(
            client,
            namespace,
            &names.replication_secret,
        )
        .await?,
        pod_disruption_budget: get(client, namespace, &names.pod_disruption_budget).await?,
        data_claims,
        instances,
    })
}

impl LiveChildren {
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

async fn get<K>(client: &Client, namespace: &str, name: &str) -> Result<Option<K>, Error>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    Api::<K>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|source| Error::Kube {
            action: "read",
            kind: K::kind(&()).into_owned(),
            name: name.to_owned(),
            source,
        })
}

async fn exists<K>(client: &Client, namespace: &str, name: &str) -> Result<bool, Error>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    Ok(get::<K>(client, namespace, name).await?.is_some())
}

/// The StatefulSet's pods (`<statefulset>-N`), by ordinal.
async fn pods(client: &Client, namespace: &str, names: &ChildNames) -> Result<Vec<Pod>, Error> {
    let selector = selector_labels(names)
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",");
    let listed = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| Error::Kube {
            action: "list",
            kind: "Pod".to_owned(),
            name: format!("{}-*", names.statefulset),
            source,
        })?;
    let mut pods: Vec<(i32, Pod)> = listed
        .items
        .into_iter()
        .filter_map(|pod| Some((roles::ordinal(&names.statefulset, &pod.name_any())?, pod)))
        .collect();
    pods.sort_by_key(|(ordinal, _)| *ordinal);
    Ok(pods.into_iter().map(|(_, pod)| pod).collect())
}

async fn data_claims(
    client: &Client,
    namespace: &str,
    names: &ChildNames,
) -> Result<Vec<PersistentVolumeClaim>, Error> {
    let selector = format!(
        "app.kubernetes.io/instance={},app.kubernetes.io/managed-by=pgkube",
        names.instance_label
    );
    let prefix = format!("{DATA_VOLUME}-{}-", names.statefulset);
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| Error::Kube {
            action: "list",
            kind: "PersistentVolumeClaim".to_owned(),
            name: prefix.clone(),
            source,
        })?;
    Ok(claims
        .items
        .into_iter()
        .filter(|claim| {
            claim
                .metadata
                .name
                .as_deref()
                .and_then(|name| name.strip_prefix(&prefix))
                .is_some_and(|ordinal| ordinal.parse::<u32>().is_ok())
        })
        .collect())
}
