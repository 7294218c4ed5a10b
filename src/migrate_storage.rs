//! `pgkube migrate-storage`: moves every stored pgkube object to its CRD's storage version, then
//! leaves only that version in the CRD's `status.storedVersions`, so that the other version can
//! later stop being served and be removed. It is what kube-storage-version-migrator does, for
//! pgkube's three CRDs only.
//!
//! Run it after the CRDs with the new storage version are applied (`pgkube crd --storage-version
//! v1beta1 | kubectl apply --server-side -f -`), with the manager's conversion webhook serving:
//! objects still stored in the old version are converted to be read.
//!
//! Every object is read and written back unchanged. The API server re-encodes it in the storage
//! version, and since the stored bytes then differ, writes it. An object changed or deleted
//! between the list and the write needs nothing: the write that changed it already stored it in
//! the storage version.

use anyhow::{Context, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};

/// Objects read per LIST page.
const PAGE_SIZE: u32 = 250;

/// What was done for one CRD.
#[derive(Debug, PartialEq, Eq)]
pub struct Migrated {
    pub crd: String,
    pub storage_version: String,
    /// Objects written back in the storage version.
    pub rewritten: usize,
    /// Objects changed or deleted by someone else in between (already in the storage version).
    pub skipped: usize,
}

/// Runs the migration with the client configuration kubectl would use, printing a line per CRD.
pub fn run() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let client = Client::try_default()
            .await
            .context("no Kubernetes client configuration (KUBECONFIG or in-cluster)")?;
        for migrated in migrate_all(&client).await? {
            println!(
                "{}: {} objects rewritten in {}, {} changed meanwhile; storedVersions [{}]",
                migrated.crd,
                migrated.rewritten,
                migrated.storage_version,
                migrated.skipped,
                migrated.storage_version
            );
        }
        Ok(())
    })
}

/// Migrates each pgkube CRD in turn.
pub async fn migrate_all(client: &Client) -> anyhow::Result<Vec<Migrated>> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut done = Vec::new();
    for name in pgkube_crds::crds().iter().map(ResourceExt::name_any) {
        let crd = crds
            .get(&name)
            .await
            .with_context(|| format!("reading CustomResourceDefinition {name}"))?;
        let resource = storage_resource(&crd)?;
        let (rewritten, skipped) = rewrite_all(client, &resource)
            .await
            .with_context(|| format!("rewriting the {} objects", resource.plural))?;
        let patch = serde_json::json!({"status": {"storedVersions": [resource.version]}});
        crds.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("setting the storedVersions of {name}"))?;
        done.push(Migrated {
            crd: name,
            storage_version: resource.version,
            rewritten,
            skipped,
        });
    }
    Ok(done)
}

/// The CRD's kind in its storage version.
fn storage_resource(crd: &CustomResourceDefinition) -> anyhow::Result<ApiResource> {
    let spec = &crd.spec;
    let Some(storage) = spec.versions.iter().find(|v| v.storage) else {
        bail!(
            "CustomResourceDefinition {} has no storage version",
            crd.name_any()
        );
    };
    Ok(ApiResource {
        group: spec.group.clone(),
        version: storage.name.clone(),
        api_version: format!("{}/{}", spec.group, storage.name),
        kind: spec.names.kind.clone(),
        plural: spec.names.plural.clone(),
    })
}

/// Writes back every object of `resource`, page by page; returns (rewritten, skipped).
async fn rewrite_all(client: &Client, resource: &ApiResource) -> anyhow::Result<(usize, usize)> {
    let all: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    let mut params = ListParams::default().limit(PAGE_SIZE);
    let (mut rewritten, mut skipped) = (0, 0);
    loop {
        let page = all.list(&params).await.context("listing")?;
        for object in page.items {
            if rewrite(client, resource, object).await? {
                rewritten += 1;
            } else {
                skipped += 1;
            }
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok((rewritten, skipped)),
        }
    }
}

/// Writes `object` back as it was read (its resourceVersion included). False when it changed
/// or went away in between.
async fn rewrite(
    client: &Client,
    resource: &ApiResource,
    object: DynamicObject,
) -> anyhow::Result<bool> {
    let name = object.name_any();
    let namespace = object.namespace().unwrap_or_default();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, resource);
    match api.replace(&name, &PostParams::default(), &object).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(response)) if response.code == 409 || response.code == 404 => {
            Ok(false)
        }
        Err(error) => Err(error).with_context(|| format!("writing back {namespace}/{name}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_is_read_in_the_storage_version() {
        let crds = pgkube_crds::crds_converting_through(
            &pgkube_crds::ConversionWebhook::default(),
            pgkube_crds::StorageVersion::V1beta1,
        );
        let resource = storage_resource(&crds[0]).expect("a storage version");
        assert_eq!(resource.api_version, "db.example.com/v1beta1");
        assert_eq!(resource.plural, "postgresqlclusters");
        let mut none = crds[0].clone();
        none.spec
            .versions
            .iter_mut()
            .for_each(|v| v.storage = false);
        let error = storage_resource(&none).expect_err("no storage version");
        assert_eq!(
            error.to_string(),
            "CustomResourceDefinition postgresqlclusters.db.example.com has no storage version"
        );
    }
}
