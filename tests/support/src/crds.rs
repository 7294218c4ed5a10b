//! Installing pgkube's CRDs on the test bed, the one way every test does it.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

use crate::wait_until;

/// Field manager of the CRDs the tests install.
pub const CRD_FIELD_MANAGER: &str = "pgkube-testkit";

/// How long the API server may take to serve freshly applied CRDs.
const ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(60);

/// Installs (or updates) every pgkube CRD (`pgkube_crds::crds()`, what `pgkube crd` prints)
/// with server-side apply, then waits until each is Established and its kind can be listed.
/// Idempotent, and safe for tests running at the same time. Panics when the CRDs cannot be
/// installed.
pub async fn install_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(CRD_FIELD_MANAGER).force();
    let crds = pgkube_crds::crds();
    for crd in &crds {
        let name = crd.name_any();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .unwrap_or_else(|e| panic!("installing CRD {name}: {e}"));
    }
    for crd in &crds {
        let name = crd.name_any();
        let kind = api_resource(crd);
        let served: Api<DynamicObject> = Api::all_with(client.clone(), &kind);
        wait_until(
            &format!("CRD {name} to be Established and served"),
            ESTABLISHED_TIMEOUT,
            || async {
                if !is_established(&api.get(&name).await?) {
                    return Ok(None);
                }
                served
                    .list_metadata(&ListParams::default().limit(1))
                    .await?;
                Ok(Some(()))
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    }
}

/// Whether the CRD's `Established` condition is `True`.
fn is_established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|condition| condition.type_ == "Established" && condition.status == "True")
}

/// The kind a CRD defines, in its storage version (the first served one if none is marked).
fn api_resource(crd: &CustomResourceDefinition) -> ApiResource {
    let spec = &crd.spec;
    let version = spec
        .versions
        .iter()
        .find(|version| version.storage)
        .or_else(|| spec.versions.iter().find(|version| version.served))
        .map(|version| version.name.clone())
        .unwrap_or_default();
    let api_version = format!("{}/{version}", spec.group);
    ApiResource {
        group: spec.group.clone(),
        version,
        api_version,
        kind: spec.names.kind.clone(),
        plural: spec.names.plural.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;
    use pgkube_crds::PostgreSQLCluster;

    #[test]
    fn the_kind_of_a_crd_is_its_storage_version() {
        let crd = pgkube_crds::crds().remove(0);
        assert_eq!(
            api_resource(&crd),
            ApiResource::erase::<PostgreSQLCluster>(&())
        );
        assert_eq!(PostgreSQLCluster::plural(&()), "postgresqlclusters");
    }

    #[test]
    fn only_a_true_established_condition_counts() {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
            CustomResourceDefinitionCondition, CustomResourceDefinitionStatus,
        };
        let with = |type_: &str, status: &str| CustomResourceDefinition {
            status: Some(CustomResourceDefinitionStatus {
                conditions: Some(vec![CustomResourceDefinitionCondition {
                    type_: type_.to_owned(),
                    status: status.to_owned(),
                    ..CustomResourceDefinitionCondition::default()
                }]),
                ..CustomResourceDefinitionStatus::default()
            }),
            ..pgkube_crds::crds().remove(0)
        };
        assert!(is_established(&with("Established", "True")));
        assert!(!is_established(&with("Established", "False")));
        assert!(!is_established(&with("NamesAccepted", "True")));
        assert!(!is_established(&pgkube_crds::crds().remove(0)));
    }
}
