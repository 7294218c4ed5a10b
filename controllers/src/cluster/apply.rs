//! Apply: makes the live children match the desired ones with server-side apply, writing only
//! what differs (see `drift`), and expands data volumes when the storage grew. When `settled`
//! knows the children are up to date, only the data volumes are looked at.
//!
//! Storage: a StatefulSet's volume claim templates are immutable, so the template keeps the
//! size the StatefulSet was created with and a larger `storage` is applied to each existing
//! claim `data-<statefulset>-N` instead (when its StorageClass allows expansion). Claims made
//! later from the template start at the old size and are expanded by the next reconcile.
//! Recreating the StatefulSet with orphaned pods would also update the template, at the cost
//! of a delete and create of the workload's controller object; we keep it simple.
//!
//! Pods are the StatefulSet's, but their role label is ours: [`label_roles`] makes the changes
//! `roles` decided, each a merge patch of that one label.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::build::{DesiredChildren, ROLE_LABEL};
use super::cache;
use super::drift;
use super::read::{LiveChildren, claim_request};
use super::roles::LabelChange;
use super::status::Issue;
use super::{Error, FIELD_MANAGER};
use crate::compact::Compact;
use crate::lean::{Lean, WITHOUT_SPEC};
use crate::quantity;

/// What applying left behind.
#[derive(Debug)]
pub struct Applied {
    /// The StatefulSet as the API server has it now.
    pub statefulset: Arc<StatefulSet>,
    /// Why the cluster does not fully match its spec yet, if it does not.
    pub issue: Option<Issue>,
    /// Data volumes still to be expanded (not bound yet); worth a retry soon.
    pub expansion_pending: bool,
    /// Write requests made to children other than the data volumes.
    pub children_writes: usize,
    /// Write requests made to the data volumes.
    pub volume_writes: usize,
}

/// Applies `desired` over `live` in `namespace`, then expands the data volumes to
/// `storage_gib`. `desired` is `None` when the children are known to be up to date (see
/// `settled`): only the volumes are looked at.
pub async fn apply(
    client: &Client,
    namespace: &str,
    desired: Option<DesiredChildren>,
    live: LiveChildren,
    storage_gib: u64,
) -> Result<Applied, Error> {
    let (applied_sts, children_writes) = match desired {
        Some(desired) => apply_children(client, namespace, desired, &live).await?,
        None => (None, 0),
    };
    let expansion = expand_volumes(client, namespace, &live.data_claims, storage_gib).await?;
    let statefulset = match (applied_sts, live.statefulset) {
        (Some(applied), _) => Arc::new(applied),
        (None, Some(live)) => live,
        (None, None) => {
            return Err(Error::Invariant(
                "the StatefulSet was neither live nor applied",
            ));
        }
    };
    Ok(Applied {
        statefulset,
        issue: expansion.issue,
        expansion_pending: expansion.pending,
        children_writes,
        volume_writes: expansion.writes,
    })
}

/// Makes every child but the data volumes match `desired`; returns the StatefulSet if it was
/// applied, and the number of writes.
async fn apply_children(
    client: &Client,
    namespace: &str,
    desired: DesiredChildren,
    live: &LiveChildren,
) -> Result<(Option<StatefulSet>, usize), Error> {
    let DesiredChildren {
        statefulset,
        headless_service,
        rw_service,
        ro_service,
        r_service,
        config_map,
        credentials,
        replication_credentials,
        application_credentials,
        control_token,
        pod_disruption_budget,
        network_policy,
    } = desired;
    let mut writes = 0;
    for (secret, exists) in [
        (Some(&credentials), live.credentials_exist),
        (
            Some(&replication_credentials),
            live.replication_credentials_exist,
        ),
        (
            Some(&application_credentials),
            live.application_credentials_exist,
        ),
        (Some(&control_token), live.control_token_exists),
    ] {
        if let Some(secret) = secret
            && !exists
        {
            create_kept_secret(client, namespace, secret).await?;
            writes += 1;
        }
    }
    writes += apply_child(client, namespace, &config_map, text_value(&live.config_map))
        .await?
        .is_some() as usize;
    for (service, live) in [
        (&headless_service, &live.headless_service),
        (&rw_service, &live.rw_service),
        (&ro_service, &live.ro_service),
        (&r_service, &live.r_service),
    ] {
        writes += apply_child(client, namespace, service, text_value(live))
            .await?
            .is_some() as usize;
    }
    let old_client_service = decoded(&live.old_client_service);
    writes += delete_old_client_service(client, namespace, old_client_service.as_ref()).await?;
    let live_sts = live
        .statefulset
        .as_deref()
        .map(serde_json::to_value)
        .transpose()
        .map_err(Error::Serialize)?;
    let applied_sts = apply_child(client, namespace, &statefulset, live_sts).await?;
    writes += applied_sts.is_some() as usize;
    writes += reconcile_optional_child(
        client,
        namespace,
        pod_disruption_budget,
        &live.pod_disruption_budget,
    )
    .await?;
    writes +=
        reconcile_optional_child(client, namespace, network_policy, &live.network_policy).await?;
    Ok((applied_sts, writes))
}

/// The JSON value of a child cached as text, parsed straight from the text: drift detection
/// compares values, so the typed object is never built. Text that does not parse reads as no
/// child, so the child is applied again (see [`Compact::value_or_warn`]).
fn text_value<K>(live: &Option<Arc<Compact<K>>>) -> Option<Value>
where
    K: Resource<DynamicType = ()>,
{
    live.as_deref().and_then(Compact::value_or_warn)
}

/// A child cached as text, decoded (text that does not decode reads as no child).
fn decoded<K>(live: &Option<Arc<Compact<K>>>) -> Option<K>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    live.as_deref().and_then(Compact::decode_or_warn)
}

/// Applies `desired` unless `live` (the live child's JSON value) already matches it; returns
/// the object after the apply, or `None` when nothing was written.
/// The JSON applied for `desired`, before its hash is stamped on it.
fn body_of<K>(desired: &K) -> Result<Value, serde_json::Error>
where
    K: Resource<DynamicType = ()> + Serialize,
{
    let mut body = serde_json::to_value(desired)?;
    // k8s-openapi leaves apiVersion and kind out of the typed objects' JSON.
    body["apiVersion"] = json!(K::api_version(&()));
    body["kind"] = json!(K::kind(&()));
    Ok(body)
}

/// Whether `desired` is what was applied last to `live`: the hash it would be stamped with is
/// the one `live` carries.
pub(super) fn applied_last<K>(desired: &K, live: &K) -> bool
where
    K: Resource<DynamicType = ()> + Serialize,
{
    let applied = live.annotations().get(drift::HASH_ANNOTATION);
    body_of(desired).is_ok_and(|body| applied == Some(&drift::desired_hash(&body)))
}

async fn apply_child<K>(
    client: &Client,
    namespace: &str,
    desired: &K,
    live: Option<Value>,
) -> Result<Option<K>, Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug,
{
    let name = desired.name_any();
    let kind = K::kind(&()).into_owned();
    let body = drift::stamped(body_of(desired).map_err(Error::Serialize)?);
    if let Some(mut live) = live {
        cache::expand_compacted(&mut live);
        if drift::is_up_to_date(&body, &live) {
            return Ok(None);
        }
    }
    tracing::info!(kind = %kind, name = %name, "applying");
    let params = PatchParams::apply(FIELD_MANAGER).force();
    // The object sent back is decoded without its managed fields, which nothing reads.
    Api::<Lean<K>>::namespaced(client.clone(), namespace)
        .patch(&name, &params, &Patch::Apply(&body))
        .await
        .map(|Lean(applied)| Some(applied))
        .map_err(|source| Error::Kube {
            action: "apply",
            kind,
            name,
            source,
        })
}

/// Creates a Secret holding a generated password. It is never applied again: the password was
/// generated once and is in use.
async fn create_kept_secret(
    client: &Client,
    namespace: &str,
    secret: &Secret,
) -> Result<(), Error> {
    let name = secret.name_any();
    tracing::info!(name = %name, "creating a Secret with a generated password");
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    match Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&params, secret)
        .await
    {
        Ok(_) => Ok(()),
        // Made by a reconcile that raced with ours (or a stale read): keep what is there.
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(()),
        Err(source) => Err(Error::Kube {
            action: "create",
            kind: "Secret".to_owned(),
            name,
            source,
        }),
    }
}

/// Applies a child when wanted, deletes ours when not: the PodDisruptionBudget (a single replica
/// cannot be disrupted "one at a time"), the NetworkPolicy (turned off). Returns the number of
/// writes.
async fn reconcile_optional_child<K>(
    client: &Client,
    namespace: &str,
    desired: Option<K>,
    live: &Option<Arc<Compact<K>>>,
) -> Result<usize, Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug,
{
    if let Some(desired) = desired {
        let applied = apply_child(client, namespace, &desired, text_value(live)).await?;
        return Ok(applied.is_some() as usize);
    }
    let Some(live) = decoded(live).filter(is_ours) else {
        return Ok(0);
    };
    let name = live.name_any();
    let kind = K::kind(&()).into_owned();
    tracing::info!(name = %name, kind = %kind, "deleting a child no longer wanted");
    Api::<K>::namespaced(client.clone(), namespace)
        .delete(&name, &DeleteParams::default())
        .await
        .map_err(|source| Error::Kube {
            action: "delete",
            kind,
            name,
            source,
        })?;
    Ok(1)
}

/// Deletes the single client Service of earlier versions, replaced by `-rw`, `-ro` and `-r`.
/// Only when the read found it, and only ours: no request at all once it is gone.
async fn delete_old_client_service(
    client: &Client,
    namespace: &str,
    live: Option<&Service>,
) -> Result<usize, Error> {
    let Some(service) = live.filter(|service| is_ours(*service)) else {
        return Ok(0);
    };
    let name = service.name_any();
    tracing::info!(name = %name, "deleting the old client Service");
    match Api::<Service>::namespaced(client.clone(), namespace)
        .delete(&name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(1),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(1),
        Err(source) => Err(Error::Kube {
            action: "delete",
            kind: "Service".to_owned(),
            name,
            source,
        }),
    }
}

/// Makes the role label changes, in order (removals first); returns the number of writes.
/// Each patch names the pod's uid, so that a new pod of the same name made since the read is
/// refused by the API server rather than labelled.
pub async fn label_roles(
    client: &Client,
    namespace: &str,
    changes: &[LabelChange],
) -> Result<usize, Error> {
    // The pod sent back is not read: decoded without its spec and managed fields.
    let pods = Api::<Lean<Pod, WITHOUT_SPEC>>::namespaced(client.clone(), namespace);
    for change in changes {
        tracing::info!(pod = %change.pod, role = ?change.value, "labelling pod");
        let mut patch = json!({ "metadata": { "labels": { ROLE_LABEL: change.value } } });
        if let Some(uid) = &change.uid {
            patch["metadata"]["uid"] = json!(uid);
        }
        pods.patch(&change.pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| Error::Kube {
                action: "label",
                kind: "Pod".to_owned(),
                name: change.pod.clone(),
                source,
            })?;
    }
    Ok(changes.len())
}

fn is_ours(object: &impl ResourceExt) -> bool {
    object
        .labels()
        .get("app.kubernetes.io/managed-by")
        .is_some_and(|manager| manager == "pgkube")
}

/// Outcome of volume expansion.
struct Expansion {
    issue: Option<Issue>,
    pending: bool,
    writes: usize,
}

/// Raises the storage request of every data claim smaller than `storage_gib`.
async fn expand_volumes(
    client: &Client,
    namespace: &str,
    claims: &[Arc<PersistentVolumeClaim>],
    storage_gib: u64,
) -> Result<Expansion, Error> {
    let mut outcome = Expansion {
        issue: None,
        pending: false,
        writes: 0,
    };
    let too_small = claims.iter().filter(|claim| {
        claim_request(claim)
            .and_then(|request| quantity::gibibytes(&request))
            .is_some_and(|gib| gib < storage_gib)
    });
    for claim in too_small {
        let name = claim.name_any();
        // Only a bound claim can be resized.
        if claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
            outcome.pending = true;
            continue;
        }
        let class = claim
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.clone());
        if !expansion_allowed(client, class.as_deref()).await? {
            outcome.issue = Some(Issue {
                reason: "StorageExpansionNotSupported".to_owned(),
                message: format!(
                    "volume {name} cannot grow to {storage_gib}Gi: its StorageClass {} does not allow volume expansion",
                    class.as_deref().unwrap_or("(none)")
                ),
                invalid_spec: false,
            });
            continue;
        }
        tracing::info!(claim = %name, storage_gib, "expanding data volume");
        let body = json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {"resources": {"requests": {"storage": format!("{storage_gib}Gi")}}},
        });
        Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(|source| Error::Kube {
                action: "expand",
                kind: "PersistentVolumeClaim".to_owned(),
                name: name.clone(),
                source,
            })?;
        outcome.writes += 1;
    }
    Ok(outcome)
}

async fn expansion_allowed(client: &Client, class: Option<&str>) -> Result<bool, Error> {
    let Some(class) = class else {
        return Ok(false);
    };
    let class = Api::<StorageClass>::all(client.clone())
        .get_opt(class)
        .await
        .map_err(|source| Error::Kube {
            action: "read",
            kind: "StorageClass".to_owned(),
            name: class.to_owned(),
            source,
        })?;
    Ok(class
        .and_then(|c| c.allow_volume_expansion)
        .unwrap_or(false))
}
