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

/// Installs (or updates) every pgkube CRD with v1beta1 alone (`pgkube_crds::v1beta1::crds()`)
/// with server-side apply, then waits until each is Established and its kind can be listed.
/// Idempotent, and safe for tests running at the same time. Panics when the CRDs cannot be
/// installed.
///
/// Not `pgkube crd`'s CRDs: those serve v1alpha1 too, through a conversion webhook that the
/// test bed's API server can reach only while a test runs a manager serving it (the tests of
/// conversion install them themselves). The controllers and the tests use v1beta1 alone.
pub async fn install_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(CRD_FIELD_MANAGER).force();
    let crds = pgkube_crds::v1beta1::crds();
    for crd in &crds {
        let name = crd.name_any();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .unwrap_or_else(|e| panic!("installing CRD {name}: {e}"));
        replace_if_still_converting(&api, crd).await;
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

/// Replaces the installed CRD by `crd` when applying it left a second version or a conversion
/// webhook in place: fields another field manager set (e.g. kubectl, from `deploy/local-up`'s
/// `pgkube crd`) survive an apply that leaves them out.
async fn replace_if_still_converting(
    api: &Api<CustomResourceDefinition>,
    crd: &CustomResourceDefinition,
) {
    let name = crd.name_any();
    for _attempt in 0..5 {
        let installed = api
            .get(&name)
            .await
            .unwrap_or_else(|e| panic!("reading CRD {name}: {e}"));
        let converting = installed.spec.versions.len() != crd.spec.versions.len()
            || installed
                .spec
                .conversion
                .as_ref()
                .map(|c| c.strategy.as_str())
                == Some("Webhook");
        if !converting {
            return;
        }
        let mut replacement = crd.clone();
        replacement.metadata = installed.metadata;
        match api.replace(&name, &Default::default(), &replacement).await {
            Ok(_) => return,
            Err(kube::Error::Api(response)) if response.code == 409 => continue,
            Err(e) => panic!(
                "putting CRD {name} back to v1beta1 alone: {e} (a version in its \
                 status.storedVersions must stay served: move its objects to v1beta1 first, \
                 or bring up a new test bed)"
            ),
        }
    }
    panic!("putting CRD {name} back to v1beta1 alone: conflicts on every try");
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
        let crd = pgkube_crds::v1beta1::crds().remove(0);
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
            ..pgkube_crds::v1beta1::crds().remove(0)
        };
        assert!(is_established(&with("Established", "True")));
        assert!(!is_established(&with("Established", "False")));
        assert!(!is_established(&with("NamesAccepted", "True")));
        assert!(!is_established(&pgkube_crds::v1beta1::crds().remove(0)));
    }
}
