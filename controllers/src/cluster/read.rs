//! Read: the live children of a cluster, as they are before this reconcile changes anything.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::ListParams;
use kube::{Api, Client};

use super::Error;
use super::build::{ChildNames, DATA_VOLUME, VERSION_ANNOTATION};
use super::validate::LiveFacts;
use crate::quantity;

/// A cluster's children that exist now.
#[derive(Clone, Debug, Default)]
pub struct LiveChildren {
    pub statefulset: Option<StatefulSet>,
    pub headless_service: Option<Service>,
    pub client_service: Option<Service>,
    pub config_map: Option<ConfigMap>,
    pub credentials_exist: bool,
    pub pod_disruption_budget: Option<PodDisruptionBudget>,
    /// The StatefulSet's data volume claims (`data-<statefulset>-N`), any ordinal.
    pub data_claims: Vec<PersistentVolumeClaim>,
}

/// Reads the children named by `names` in `namespace`.
pub async fn read(
    client: &Client,
    namespace: &str,
    names: &ChildNames,
) -> Result<LiveChildren, Error> {
    let statefulset = get::<StatefulSet>(client, namespace, &names.statefulset).await?;
    let data_claims = if statefulset.is_some() {
        data_claims(client, namespace, names).await?
    } else {
        Vec::new()
    };
    Ok(LiveChildren {
        statefulset,
        headless_service: get(client, namespace, &names.headless_service).await?,
        client_service: get(client, namespace, &names.client_service).await?,
        config_map: get(client, namespace, &names.config_map).await?,
        credentials_exist: get::<Secret>(client, namespace, &names.secret)
            .await?
            .is_some(),
        pod_disruption_budget: get(client, namespace, &names.pod_disruption_budget).await?,
        data_claims,
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
        let claim_template_storage = self.statefulset.as_ref().and_then(|sts| {
            sts.spec
                .as_ref()?
                .volume_claim_templates
                .as_ref()?
                .iter()
                .find(|claim| claim.metadata.name.as_deref() == Some(DATA_VOLUME))
                .and_then(claim_request)
        });
        let largest_volume_gib = self
            .data_claims
            .iter()
            .filter_map(|claim| quantity::gibibytes(&claim_request(claim)?))
            .max();
        LiveFacts {
            running_version,
            claim_template_storage,
            largest_volume_gib,
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
