//! Validation (pure): what the API server's schema cannot check, because it needs the live
//! state of the children or compares several fields.
//!
//! Two outcomes besides plain success:
//! - a change Kubernetes cannot make in place (shrinking volumes, a new major version), or one
//!   that would remove the primary (scaling down below its ordinal), is held back: validation returns the *effective* spec, which keeps the running value of that field
//!   and takes everything else from the spec, plus the [`Refusal`]s to report. The cluster keeps
//!   being reconciled from it, so children deleted or edited meanwhile are still repaired and
//!   other changes (replicas, resources) still apply.
//! - a spec that cannot work at all is an [`InvalidSpec`]: nothing is applied.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use pgkube_crds::{PostgreSQLCluster, PostgresVersion, REFUSED_PARAMETERS, S3Storage};

use crate::quantity;
use crate::scheduling::Scheduling;

/// What the live children say that validation needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveFacts {
    /// Major version the StatefulSet runs (from its version annotation).
    pub running_version: Option<PostgresVersion>,
    /// Storage in the StatefulSet's volume claim template (immutable once created).
    pub claim_template_storage: Option<String>,
    /// Storage class in that template (`None` there too when it names none).
    pub claim_template_class: Option<String>,
    /// Largest storage request among the cluster's existing data volumes.
    pub largest_volume_gib: Option<u64>,
    /// Replicas of the StatefulSet.
    pub running_replicas: Option<i32>,
    /// Ordinal of the pod the status names as the primary (`status.currentPrimary`).
    pub primary_ordinal: Option<i32>,
}

/// The spec to build the children from (serializable for `settled`'s fingerprint).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ValidatedCluster {
    pub name: String,
    pub namespace: String,
    /// Controller owner reference every child carries.
    pub owner: OwnerReference,
    pub replicas: i32,
    pub version: PostgresVersion,
    /// Requested size of each data volume.
    pub storage_gib: u64,
    /// Size written in the StatefulSet's claim template: the requested size for a new
    /// StatefulSet, the existing one otherwise (the field is immutable; volumes are expanded
    /// one by one instead).
    pub claim_template_storage: String,
    /// Storage class of the data volumes: the spec's (set through v1beta1) for a new
    /// StatefulSet, the existing template's otherwise (immutable, like the size).
    pub storage_class_name: Option<String>,
    pub resources: Option<ResourceRequirements>,
    /// Where the instance pods may run (the spec's nodeSelector, tolerations and affinity).
    pub scheduling: Scheduling,
    /// The user's `postgresql.conf` parameters (`spec.postgresql.parameters`).
    pub parameters: BTreeMap<String, String>,
    /// How long the primary may be cut off before it fences itself
    /// (`spec.highAvailability.isolationTimeoutSeconds`, with its default).
    pub isolation_timeout_seconds: u32,
    /// Where the primary archives its WAL: the backup storage, unless archiving is turned off
    /// (`spec.backup.walArchiving.enabled`); none without storage.
    pub wal_archive: Option<S3Storage>,
    /// The storage a point-in-time recovery reads (`spec.bootstrap.recovery`): its keys are
    /// mounted in the pods. Set by the pipeline, which finds a named backup's storage.
    pub recovery_storage: Option<S3Storage>,
    /// The application database and its owner (`spec.bootstrap.initdb`, or its defaults).
    pub application: pgkube_crds::Initdb,
    /// Whether the superuser may log in over the network with its password
    /// (`spec.enableSuperuserAccess`).
    pub superuser_access: bool,
    /// The NetworkPolicy's extra PostgreSQL peers (`spec.networkPolicy.postgresFrom`); none
    /// when it is turned off.
    pub network_policy: Option<Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer>>,
    /// The user's own server certificate (`spec.certificates`); none: pgkube issues it.
    pub server_certificates: Option<pgkube_crds::ServerCertificates>,
    /// The ServiceAccount the pods run as (`spec.serviceAccountName`); none: `default`.
    pub service_account_name: Option<String>,
    /// The ConfigMap key of the metrics' custom queries (`spec.monitoring.customQueries`).
    pub custom_queries: Option<k8s_openapi::api::core::v1::ConfigMapKeySelector>,
}

/// A valid spec: what to build now, and the changes held back from it.
#[derive(Clone, Debug, PartialEq)]
pub struct Validation {
    /// The spec with every refused change replaced by the running value.
    pub effective: ValidatedCluster,
    /// Changes that are not made, in the order they were found.
    pub refusals: Vec<Refusal>,
}

/// A change that is held back while the cluster keeps running as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The data volumes would have to shrink, which Kubernetes cannot do.
    StorageShrink {
        requested_gib: u64,
        current_gib: u64,
    },
    /// The major version changed; that needs pg_upgrade or dump and restore, not a new image.
    MajorVersionChange {
        running: PostgresVersion,
        requested: PostgresVersion,
    },
    /// The storage class changed; the data volumes keep theirs (a claim's class is immutable).
    StorageClassChange {
        requested: Option<String>,
        current: Option<String>,
    },
    /// Fewer replicas would remove the primary's pod (the StatefulSet removes the highest
    /// ordinals first).
    ScaleDownRemovesPrimary {
        requested: i32,
        kept: i32,
        primary_ordinal: i32,
    },
}

impl Refusal {
    /// Condition and Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::StorageShrink { .. } => "StorageShrinkRefused",
            Self::MajorVersionChange { running, requested } if requested > running => {
                "MajorUpgradeNotSupported"
            }
            Self::MajorVersionChange { .. } => "MajorDowngradeNotSupported",
            Self::StorageClassChange { .. } => "StorageClassChangeRefused",
            Self::ScaleDownRemovesPrimary { .. } => "ScaleDownWouldRemovePrimary",
        }
    }

    /// Condition and Event message, telling the user what to do.
    pub fn message(&self) -> String {
        match self {
            Self::StorageShrink {
                requested_gib,
                current_gib,
            } => format!(
                "storage cannot shrink from {current_gib}Gi to {requested_gib}Gi: volumes can only grow, so the cluster keeps {current_gib}Gi; set storage back to at least {current_gib}Gi"
            ),
            Self::MajorVersionChange { running, requested } => format!(
                "PostgreSQL {running} cannot be changed to {requested} in place (the data directory format differs); the cluster keeps running {running}: back up, create a new cluster with version {requested} and restore into it"
            ),
            Self::StorageClassChange { requested, current } => format!(
                "the storage class cannot change from {} to {} (a volume keeps the class it was made with); the cluster keeps {}: set storage.storageClassName back",
                class_text(current),
                class_text(requested),
                class_text(current),
            ),
            Self::ScaleDownRemovesPrimary {
                requested,
                kept,
                primary_ordinal,
            } => format!(
                "scaling down to {requested} replicas removes instance {primary_ordinal}, the primary: the cluster keeps {kept} replicas until a switchover has moved the primary to an instance that stays"
            ),
        }
    }
}

/// A storage class as a message names it.
fn class_text(class: &Option<String>) -> String {
    match class {
        Some(class) => format!("{class:?}"),
        None => "the default".to_owned(),
    }
}

/// A spec that cannot work at all; the message says which field and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSpec(pub String);

/// Checks `cluster` against the live state in `live`.
pub fn validate(cluster: &PostgreSQLCluster, live: &LiveFacts) -> Result<Validation, InvalidSpec> {
    let spec = &cluster.spec;
    let namespace = cluster
        .namespace()
        .ok_or_else(|| InvalidSpec("the cluster has no namespace".to_owned()))?;
    let owner = cluster.controller_owner_ref(&()).ok_or_else(|| {
        InvalidSpec("the cluster has no uid yet; it cannot own children".to_owned())
    })?;
    let requested_gib = spec
        .storage
        .size
        .strip_suffix("Gi")
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|gib| *gib > 0)
        .ok_or_else(|| {
            InvalidSpec(format!(
                "storage size {:?} is not a positive whole number of Gi, for example 100Gi",
                spec.storage.size
            ))
        })?;
    if let Some(resources) = &spec.resources {
        check_requests_within_limits(resources)?;
    }
    let parameters = spec
        .postgresql
        .as_ref()
        .map(|p| p.parameters.clone())
        .unwrap_or_default();
    check_parameters(&parameters)?;
    let mut refusals = Vec::new();
    let version = match live.running_version {
        Some(running) if running != spec.postgres_version => {
            refusals.push(Refusal::MajorVersionChange {
                running,
                requested: spec.postgres_version,
            });
            running
        }
        _ => spec.postgres_version,
    };
    let template_gib = live
        .claim_template_storage
        .as_deref()
        .and_then(quantity::gibibytes);
    let storage_gib = match template_gib.max(live.largest_volume_gib) {
        Some(current_gib) if requested_gib < current_gib => {
            refusals.push(Refusal::StorageShrink {
                requested_gib,
                current_gib,
            });
            current_gib
        }
        _ => requested_gib,
    };
    let requested_class = spec.storage.storage_class_name.clone();
    let storage_class_name = match &live.claim_template_storage {
        // No StatefulSet yet: the spec's class.
        None => requested_class,
        Some(_) if live.claim_template_class != requested_class => {
            refusals.push(Refusal::StorageClassChange {
                requested: requested_class,
                current: live.claim_template_class.clone(),
            });
            live.claim_template_class.clone()
        }
        Some(_) => requested_class,
    };
    let replicas = match live.primary_ordinal {
        Some(primary_ordinal) if primary_ordinal >= spec.replicas => {
            let kept = live
                .running_replicas
                .filter(|running| *running > primary_ordinal)
                .unwrap_or(primary_ordinal + 1);
            refusals.push(Refusal::ScaleDownRemovesPrimary {
                requested: spec.replicas,
                kept,
                primary_ordinal,
            });
            kept
        }
        _ => spec.replicas,
    };
    let effective = ValidatedCluster {
        name: cluster.name_any(),
        namespace,
        owner,
        replicas,
        version,
        storage_gib,
        claim_template_storage: live
            .claim_template_storage
            .clone()
            .unwrap_or_else(|| spec.storage.size.clone()),
        storage_class_name,
        resources: spec.resources.clone(),
        scheduling: Scheduling::for_instances(
            spec,
            &super::build::selector_labels(&super::build::ChildNames::for_cluster(
                &cluster.name_any(),
            )),
        ),
        parameters,
        isolation_timeout_seconds: pgkube_crds::HighAvailability::isolation_timeout_seconds(
            spec.high_availability.as_ref(),
        ),
        wal_archive: wal_archive_storage(spec),
        recovery_storage: None,
        application: spec
            .bootstrap
            .as_ref()
            .and_then(|bootstrap| bootstrap.initdb.clone())
            .unwrap_or_default(),
        superuser_access: spec.enable_superuser_access,
        network_policy: Some(spec.network_policy.clone().unwrap_or_default())
            .filter(|settings| settings.enabled)
            .map(|settings| settings.postgres_from),
        server_certificates: spec.certificates.clone(),
        service_account_name: spec.service_account_name.clone(),
        custom_queries: spec
            .monitoring
            .as_ref()
            .and_then(|monitoring| monitoring.custom_queries.clone()),
    };
    Ok(Validation {
        effective,
        refusals,
    })
}

/// The root of the WAL archive `cluster` archives to, if it archives.
pub fn archive_root(cluster: &pgkube_crds::PostgreSQLCluster) -> Option<String> {
    let storage = wal_archive_storage(&cluster.spec)?;
    let (namespace, name) = (cluster.namespace()?, cluster.name_any());
    Some(crate::storage::wal::archive_root(
        &crate::backup::decide::cluster_prefix(&storage, &namespace, &name),
        &name,
    ))
}

/// The storage WAL goes to: the backup's, with archiving on (the default).
pub(super) fn wal_archive_storage(spec: &pgkube_crds::PostgreSQLClusterSpec) -> Option<S3Storage> {
    let backup = spec.backup.as_ref()?;
    let enabled = backup
        .wal_archiving
        .as_ref()
        .is_none_or(|archiving| archiving.enabled);
    let storage = backup.storage.as_ref()?;
    enabled.then(|| storage.s3.clone())
}

fn is_parameter_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.')
}

/// The admission rules refuse these parameters and multi-line values already; the controller
/// checks again so that a spec that got past them (an older CRD) still gets a clear answer
/// instead of a broken config file.
fn check_parameters(parameters: &BTreeMap<String, String>) -> Result<(), InvalidSpec> {
    let refused: Vec<String> = REFUSED_PARAMETERS
        .iter()
        .filter_map(|(names, why)| {
            let set: Vec<&str> = names
                .iter()
                .copied()
                .filter(|name| parameters.contains_key(*name))
                .collect();
            (!set.is_empty()).then(|| format!("{} ({why})", set.join(", ")))
        })
        .collect();
    if !refused.is_empty() {
        return Err(InvalidSpec(format!(
            "spec.postgresql.parameters cannot set {}",
            refused.join("; ")
        )));
    }
    // Names are checked here only: a pattern rule on map keys exceeds the API server's CEL cost
    // budget, since keys have no length bound.
    if let Some(name) = parameters.keys().find(|name| !is_parameter_name(name)) {
        return Err(InvalidSpec(format!(
            "spec.postgresql.parameters: {name:?} is not a parameter name (lowercase letters, digits, '_' and '.', starting with a letter)"
        )));
    }
    if let Some((name, _)) = parameters.iter().find(|(_, value)| value.contains('\n')) {
        return Err(InvalidSpec(format!(
            "spec.postgresql.parameters.{name} must be a single line"
        )));
    }
    Ok(())
}

/// Requests above limits are rejected by the API server when the pod is created, long after
/// the spec was accepted: catch them here with a message about the cluster's field.
fn check_requests_within_limits(resources: &ResourceRequirements) -> Result<(), InvalidSpec> {
    let (Some(requests), Some(limits)) = (&resources.requests, &resources.limits) else {
        return Ok(());
    };
    for (resource, request) in requests {
        let Some(limit) = limits.get(resource) else {
            continue;
        };
        match (quantity::parse(&request.0), quantity::parse(&limit.0)) {
            (Some(r), Some(l)) if r > l => {
                return Err(InvalidSpec(format!(
                    "resources.requests.{resource} ({}) is above resources.limits.{resource} ({})",
                    request.0, limit.0
                )));
            }
            (None, _) | (_, None) => {
                return Err(InvalidSpec(format!(
                    "resources.{resource}: {:?} or {:?} is not a quantity",
                    request.0, limit.0
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
