//! Validation (pure): what the API server's schema cannot check, because it needs the live
//! state of the children or compares several fields.
//!
//! A spec that would need a change Kubernetes cannot make in place is refused as a whole:
//! nothing is applied, the refusal becomes a condition and an Event, and the children stay as
//! they are until the spec is set back.

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use pgkube_crds::{PostgreSQLCluster, PostgresVersion};

use crate::quantity;

/// What the live children say that validation needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveFacts {
    /// Major version the StatefulSet runs (from its version annotation).
    pub running_version: Option<PostgresVersion>,
    /// Storage in the StatefulSet's volume claim template (immutable once created).
    pub claim_template_storage: Option<String>,
    /// Largest storage request among the cluster's existing data volumes.
    pub largest_volume_gib: Option<u64>,
}

/// A spec that can be applied as it stands.
#[derive(Clone, Debug, PartialEq)]
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
    pub resources: Option<ResourceRequirements>,
}

/// Why a spec is not applied.
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
    /// Something the schema lets through but that cannot work.
    InvalidSpec(String),
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
            Self::InvalidSpec(_) => "InvalidSpec",
        }
    }

    /// Condition and Event message, telling the user what to do.
    pub fn message(&self) -> String {
        match self {
            Self::StorageShrink {
                requested_gib,
                current_gib,
            } => format!(
                "storage cannot shrink from {current_gib}Gi to {requested_gib}Gi: volumes can only grow; set storage back to at least {current_gib}Gi"
            ),
            Self::MajorVersionChange { running, requested } => format!(
                "PostgreSQL {running} cannot be changed to {requested} in place (the data directory format differs); the cluster keeps running {running}: back up, create a new cluster with version {requested} and restore into it"
            ),
            Self::InvalidSpec(why) => why.clone(),
        }
    }

    /// Whether the spec itself is broken (as opposed to a change that is refused while the
    /// cluster keeps running as it is).
    pub fn is_invalid_spec(&self) -> bool {
        matches!(self, Self::InvalidSpec(_))
    }
}

/// Checks `cluster` against the live state in `live`.
pub fn validate(
    cluster: &PostgreSQLCluster,
    live: &LiveFacts,
) -> Result<ValidatedCluster, Refusal> {
    let spec = &cluster.spec;
    let namespace = cluster
        .namespace()
        .ok_or_else(|| Refusal::InvalidSpec("the cluster has no namespace".to_owned()))?;
    let owner = cluster.controller_owner_ref(&()).ok_or_else(|| {
        Refusal::InvalidSpec("the cluster has no uid yet; it cannot own children".to_owned())
    })?;
    let storage_gib = spec
        .storage
        .strip_suffix("Gi")
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|gib| *gib > 0)
        .ok_or_else(|| {
            Refusal::InvalidSpec(format!(
                "storage {:?} is not a positive whole number of Gi, for example 100Gi",
                spec.storage
            ))
        })?;
    if let Some(running) = live.running_version
        && running != spec.version
    {
        return Err(Refusal::MajorVersionChange {
            running,
            requested: spec.version,
        });
    }
    let template_gib = live
        .claim_template_storage
        .as_deref()
        .and_then(quantity::gibibytes);
    let current_gib = template_gib.max(live.largest_volume_gib);
    if let Some(current_gib) = current_gib
        && storage_gib < current_gib
    {
        return Err(Refusal::StorageShrink {
            requested_gib: storage_gib,
            current_gib,
        });
    }
    if let Some(resources) = &spec.resources {
        check_requests_within_limits(resources)?;
    }
    Ok(ValidatedCluster {
        name: cluster.name_any(),
        namespace,
        owner,
        replicas: spec.replicas,
        version: spec.version,
        storage_gib,
        claim_template_storage: live
            .claim_template_storage
            .clone()
            .unwrap_or_else(|| spec.storage.clone()),
        resources: spec.resources.clone(),
    })
}

/// Requests above limits are rejected by the API server when the pod is created, long after
/// the spec was accepted: catch them here with a message about the cluster's field.
fn check_requests_within_limits(resources: &ResourceRequirements) -> Result<(), Refusal> {
    let (Some(requests), Some(limits)) = (&resources.requests, &resources.limits) else {
        return Ok(());
    };
    for (resource, request) in requests {
        let Some(limit) = limits.get(resource) else {
            continue;
        };
        match (quantity::parse(&request.0), quantity::parse(&limit.0)) {
            (Some(r), Some(l)) if r > l => {
                return Err(Refusal::InvalidSpec(format!(
                    "resources.requests.{resource} ({}) is above resources.limits.{resource} ({})",
                    request.0, limit.0
                )));
            }
            (None, _) | (_, None) => {
                return Err(Refusal::InvalidSpec(format!(
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
mod tests {
    use super::*;

    fn cluster(yaml: &str) -> PostgreSQLCluster {
        let mut cluster: PostgreSQLCluster =
            serde_yaml::from_str(yaml).expect("fixture is a PostgreSQLCluster");
        cluster.metadata.namespace = Some("default".to_owned());
        cluster.metadata.uid = Some("0b5a5c2e-0000-4000-8000-000000000001".to_owned());
        cluster
    }

    /// The seed's sample cluster.
    const SAMPLE: &str = include_str!("../../../deploy/samples/postgresqlcluster.yaml");

    #[test]
    fn a_new_cluster_is_valid_and_its_template_gets_the_requested_size() {
        let valid = validate(&cluster(SAMPLE), &LiveFacts::default()).expect("valid");
        assert_eq!(valid.replicas, 3);
        assert_eq!(valid.storage_gib, 100);
        assert_eq!(valid.claim_template_storage, "100Gi");
        assert_eq!(valid.namespace, "default");
        assert_eq!(valid.owner.controller, Some(true));
    }

    #[test]
    fn growing_storage_keeps_the_immutable_claim_template() {
        let mut grown = cluster(SAMPLE);
        grown.spec.storage = "200Gi".to_owned();
        let live = LiveFacts {
            running_version: Some(PostgresVersion::V16),
            claim_template_storage: Some("100Gi".to_owned()),
            largest_volume_gib: Some(100),
        };
        let valid = validate(&grown, &live).expect("valid");
        assert_eq!(valid.storage_gib, 200);
        assert_eq!(valid.claim_template_storage, "100Gi");
    }

    #[test]
    fn shrinking_storage_is_refused() {
        let mut shrunk = cluster(SAMPLE);
        shrunk.spec.storage = "50Gi".to_owned();
        let live = LiveFacts {
            claim_template_storage: Some("100Gi".to_owned()),
            ..LiveFacts::default()
        };
        let refusal = validate(&shrunk, &live).expect_err("refused");
        assert_eq!(refusal.reason(), "StorageShrinkRefused");
        assert!(refusal.message().contains("100Gi"), "{}", refusal.message());
        // Volumes already expanded beyond the template count too.
        let mut below_volumes = cluster(SAMPLE);
        below_volumes.spec.storage = "150Gi".to_owned();
        let expanded = LiveFacts {
            claim_template_storage: Some("100Gi".to_owned()),
            largest_volume_gib: Some(200),
            ..LiveFacts::default()
        };
        assert_eq!(
            validate(&below_volumes, &expanded)
                .expect_err("refused")
                .reason(),
            "StorageShrinkRefused"
        );
    }

    #[test]
    fn a_major_version_change_is_refused() {
        let mut upgraded = cluster(SAMPLE);
        upgraded.spec.version = PostgresVersion::V17;
        let live = LiveFacts {
            running_version: Some(PostgresVersion::V16),
            ..LiveFacts::default()
        };
        let refusal = validate(&upgraded, &live).expect_err("refused");
        assert_eq!(refusal.reason(), "MajorUpgradeNotSupported");
        assert!(
            refusal.message().contains("keeps running 16"),
            "{}",
            refusal.message()
        );
    }

    #[test]
    fn requests_above_limits_are_an_invalid_spec() {
        let mut greedy = cluster(SAMPLE);
        let resources = greedy
            .spec
            .resources
            .as_mut()
            .expect("sample has resources");
        let limits = resources.limits.as_mut().expect("sample has limits");
        limits.insert(
            "memory".to_owned(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("64Mi".to_owned()),
        );
        let refusal = validate(&greedy, &LiveFacts::default()).expect_err("refused");
        assert!(refusal.is_invalid_spec());
        assert!(
            refusal.message().contains("resources.requests.memory"),
            "{}",
            refusal.message()
        );
    }
}
