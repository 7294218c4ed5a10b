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
use pgkube_crds::{MANAGED_PARAMETERS, PostgreSQLCluster, PostgresVersion};

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
                "scaling down to {requested} replicas would remove instance {primary_ordinal}, the primary; the cluster keeps {kept} replicas: set replicas to at least {}",
                primary_ordinal + 1
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
        .strip_suffix("Gi")
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|gib| *gib > 0)
        .ok_or_else(|| {
            InvalidSpec(format!(
                "storage {:?} is not a positive whole number of Gi, for example 100Gi",
                spec.storage
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
        Some(running) if running != spec.version => {
            refusals.push(Refusal::MajorVersionChange {
                running,
                requested: spec.version,
            });
            running
        }
        _ => spec.version,
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
    let requested_class = pgkube_crds::conversion::storage_class_name(cluster);
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
            .unwrap_or_else(|| spec.storage.clone()),
        storage_class_name,
        resources: spec.resources.clone(),
        scheduling: Scheduling::of(spec),
        parameters,
        isolation_timeout_seconds: pgkube_crds::HighAvailability::isolation_timeout_seconds(
            spec.high_availability.as_ref(),
        ),
    };
    Ok(Validation {
        effective,
        refusals,
    })
}

fn is_parameter_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.')
}

/// The admission rules refuse managed parameters and multi-line values already; the controller checks again so that a spec that
/// got past them (an older CRD) still gets a clear answer instead of a broken config file.
fn check_parameters(parameters: &BTreeMap<String, String>) -> Result<(), InvalidSpec> {
    let managed: Vec<&str> = parameters
        .keys()
        .map(String::as_str)
        .filter(|name| MANAGED_PARAMETERS.contains(name))
        .collect();
    if !managed.is_empty() {
        return Err(InvalidSpec(format!(
            "spec.postgresql.parameters sets {}, which pgkube manages itself",
            managed.join(", ")
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
        let validation = validate(&cluster(SAMPLE), &LiveFacts::default()).expect("valid");
        assert!(validation.refusals.is_empty());
        let valid = validation.effective;
        assert_eq!(valid.replicas, 3);
        assert_eq!(valid.version, PostgresVersion::V16);
        assert_eq!(valid.storage_gib, 100);
        assert_eq!(valid.claim_template_storage, "100Gi");
        assert_eq!(valid.namespace, "default");
        assert_eq!(valid.owner.controller, Some(true));
    }

    #[test]
    fn parameters_pass_through_but_managed_ones_and_multi_line_values_are_invalid() {
        let with = |name: &str, value: &str| {
            let mut cluster = cluster(SAMPLE);
            cluster.spec.postgresql = Some(pgkube_crds::PostgreSQLSettings {
                parameters: BTreeMap::from([(name.to_owned(), value.to_owned())]),
            });
            validate(&cluster, &LiveFacts::default())
        };
        let valid = with("work_mem", "16MB").expect("valid").effective;
        assert_eq!(valid.parameters["work_mem"], "16MB");
        let managed = with("port", "5433").expect_err("port is managed");
        assert!(
            managed
                .to_string()
                .contains("sets port, which pgkube manages"),
            "{managed}"
        );
        let malformed = with("Work Mem", "1MB").expect_err("not a name");
        assert!(
            malformed
                .to_string()
                .contains("\"Work Mem\" is not a parameter name"),
            "{malformed}"
        );
        let two_lines = with("work_mem", "1MB\nport = 1").expect_err("two lines");
        assert!(
            two_lines
                .to_string()
                .contains("work_mem must be a single line"),
            "{two_lines}"
        );
    }

    #[test]
    fn growing_storage_keeps_the_immutable_claim_template() {
        let mut grown = cluster(SAMPLE);
        grown.spec.storage = "200Gi".to_owned();
        let live = LiveFacts {
            running_version: Some(PostgresVersion::V16),
            claim_template_storage: Some("100Gi".to_owned()),
            largest_volume_gib: Some(100),
            ..LiveFacts::default()
        };
        let validation = validate(&grown, &live).expect("valid");
        assert!(validation.refusals.is_empty());
        assert_eq!(validation.effective.storage_gib, 200);
        assert_eq!(validation.effective.claim_template_storage, "100Gi");
    }

    /// A cluster whose storage class was written through v1beta1 (read here in v1alpha1, with
    /// the class in conversion's annotation).
    fn with_class(class: &str) -> PostgreSQLCluster {
        let mut cluster = cluster(SAMPLE);
        cluster.metadata.annotations = Some(BTreeMap::from([(
            pgkube_crds::conversion::V1BETA1_FIELDS_ANNOTATION.to_owned(),
            format!(r#"{{"spec":{{"storage":{{"storageClassName":"{class}"}}}}}}"#),
        )]));
        cluster
    }

    #[test]
    fn a_new_cluster_gets_the_storage_class_written_through_v1beta1() {
        let validation = validate(&with_class("fast-ssd"), &LiveFacts::default()).expect("valid");
        assert!(validation.refusals.is_empty());
        assert_eq!(
            validation.effective.storage_class_name.as_deref(),
            Some("fast-ssd")
        );
        let plain = validate(&cluster(SAMPLE), &LiveFacts::default()).expect("valid");
        assert_eq!(plain.effective.storage_class_name, None);
    }

    #[test]
    fn a_changed_storage_class_is_held_back_at_the_templates() {
        let live = LiveFacts {
            claim_template_storage: Some("100Gi".to_owned()),
            claim_template_class: Some("fast-ssd".to_owned()),
            ..LiveFacts::default()
        };
        let same = validate(&with_class("fast-ssd"), &live).expect("valid");
        assert!(same.refusals.is_empty());
        let changed = validate(&with_class("slow-hdd"), &live).expect("valid");
        assert_eq!(
            changed.refusals,
            vec![Refusal::StorageClassChange {
                requested: Some("slow-hdd".to_owned()),
                current: Some("fast-ssd".to_owned()),
            }]
        );
        assert_eq!(changed.refusals[0].reason(), "StorageClassChangeRefused");
        assert_eq!(
            changed.refusals[0].message(),
            "the storage class cannot change from \"fast-ssd\" to \"slow-hdd\" (a volume keeps the class it was made with); the cluster keeps \"fast-ssd\": set storage.storageClassName back"
        );
        assert_eq!(
            changed.effective.storage_class_name.as_deref(),
            Some("fast-ssd")
        );
        // A cluster made with the default class keeps it when one is named later.
        let default_live = LiveFacts {
            claim_template_class: None,
            ..live
        };
        let named = validate(&with_class("fast-ssd"), &default_live).expect("valid");
        assert_eq!(named.refusals[0].reason(), "StorageClassChangeRefused");
        assert_eq!(named.effective.storage_class_name, None);
    }

    #[test]
    fn shrinking_storage_is_held_back_at_the_current_size() {
        let mut shrunk = cluster(SAMPLE);
        shrunk.spec.storage = "50Gi".to_owned();
        shrunk.spec.replicas = 5;
        let live = LiveFacts {
            claim_template_storage: Some("100Gi".to_owned()),
            ..LiveFacts::default()
        };
        let validation = validate(&shrunk, &live).expect("valid");
        assert_eq!(
            validation.refusals,
            vec![Refusal::StorageShrink {
                requested_gib: 50,
                current_gib: 100
            }]
        );
        let refusal = &validation.refusals[0];
        assert_eq!(refusal.reason(), "StorageShrinkRefused");
        assert!(refusal.message().contains("100Gi"), "{}", refusal.message());
        assert_eq!(validation.effective.storage_gib, 100);
        assert_eq!(validation.effective.claim_template_storage, "100Gi");
        // The rest of the spec still applies.
        assert_eq!(validation.effective.replicas, 5);

        // Volumes already expanded beyond the template count too, and are kept at their size.
        let mut below_volumes = cluster(SAMPLE);
        below_volumes.spec.storage = "150Gi".to_owned();
        let expanded = LiveFacts {
            claim_template_storage: Some("100Gi".to_owned()),
            largest_volume_gib: Some(200),
            ..LiveFacts::default()
        };
        let validation = validate(&below_volumes, &expanded).expect("valid");
        assert_eq!(validation.refusals[0].reason(), "StorageShrinkRefused");
        assert_eq!(validation.effective.storage_gib, 200);
    }

    #[test]
    fn a_major_version_change_is_held_back_at_the_running_version() {
        let mut upgraded = cluster(SAMPLE);
        upgraded.spec.version = PostgresVersion::V17;
        upgraded.spec.replicas = 2;
        let live = LiveFacts {
            running_version: Some(PostgresVersion::V16),
            ..LiveFacts::default()
        };
        let validation = validate(&upgraded, &live).expect("valid");
        assert_eq!(validation.refusals.len(), 1, "{:?}", validation.refusals);
        let refusal = &validation.refusals[0];
        assert_eq!(refusal.reason(), "MajorUpgradeNotSupported");
        assert!(
            refusal.message().contains("keeps running 16"),
            "{}",
            refusal.message()
        );
        assert_eq!(validation.effective.version, PostgresVersion::V16);
        assert_eq!(validation.effective.replicas, 2);

        let mut downgraded = cluster(SAMPLE);
        downgraded.spec.version = PostgresVersion::V15;
        let validation = validate(&downgraded, &live).expect("valid");
        assert_eq!(
            validation.refusals[0].reason(),
            "MajorDowngradeNotSupported"
        );
        assert_eq!(validation.effective.version, PostgresVersion::V16);
    }

    #[test]
    fn both_refusals_are_reported_together() {
        let mut both = cluster(SAMPLE);
        both.spec.version = PostgresVersion::V17;
        both.spec.storage = "10Gi".to_owned();
        let live = LiveFacts {
            running_version: Some(PostgresVersion::V16),
            claim_template_storage: Some("100Gi".to_owned()),
            largest_volume_gib: Some(100),
            ..LiveFacts::default()
        };
        let validation = validate(&both, &live).expect("valid");
        let reasons: Vec<_> = validation.refusals.iter().map(Refusal::reason).collect();
        assert_eq!(
            reasons,
            ["MajorUpgradeNotSupported", "StorageShrinkRefused"]
        );
        assert_eq!(
            (
                validation.effective.version,
                validation.effective.storage_gib
            ),
            (PostgresVersion::V16, 100)
        );
    }

    #[test]
    fn a_scale_down_that_would_remove_the_primary_is_held_back() {
        let mut smaller = cluster(SAMPLE);
        smaller.spec.replicas = 2;
        let live = LiveFacts {
            running_replicas: Some(4),
            primary_ordinal: Some(2),
            ..LiveFacts::default()
        };
        let validation = validate(&smaller, &live).expect("valid");
        assert_eq!(
            validation.refusals,
            [Refusal::ScaleDownRemovesPrimary {
                requested: 2,
                kept: 4,
                primary_ordinal: 2
            }]
        );
        let refusal = &validation.refusals[0];
        assert_eq!(refusal.reason(), "ScaleDownWouldRemovePrimary");
        assert!(
            refusal.message().contains("set replicas to at least 3"),
            "{}",
            refusal.message()
        );
        assert_eq!(validation.effective.replicas, 4);
        // Without a StatefulSet, just enough instances to keep the primary.
        let without_statefulset = LiveFacts {
            primary_ordinal: Some(2),
            ..LiveFacts::default()
        };
        let validation = validate(&smaller, &without_statefulset).expect("valid");
        assert_eq!(validation.effective.replicas, 3);
        // A scale-down that keeps the primary goes ahead.
        smaller.spec.replicas = 3;
        let validation = validate(&smaller, &live).expect("valid");
        assert!(validation.refusals.is_empty());
        assert_eq!(validation.effective.replicas, 3);
        // The usual primary, the first instance, is never in the way.
        smaller.spec.replicas = 1;
        let first = LiveFacts {
            running_replicas: Some(3),
            primary_ordinal: Some(0),
            ..LiveFacts::default()
        };
        let validation = validate(&smaller, &first).expect("valid");
        assert!(validation.refusals.is_empty());
        assert_eq!(validation.effective.replicas, 1);
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
        let invalid = validate(&greedy, &LiveFacts::default()).expect_err("invalid");
        assert!(
            invalid.0.contains("resources.requests.memory"),
            "{}",
            invalid.0
        );
    }
}
