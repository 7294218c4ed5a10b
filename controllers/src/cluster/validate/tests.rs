//! Tests of the spec validation.

use super::*;

fn cluster(yaml: &str) -> PostgreSQLCluster {
    let mut cluster: PostgreSQLCluster =
        serde_yaml::from_str(yaml).expect("fixture is a PostgreSQLCluster");
    cluster.metadata.namespace = Some("default".to_owned());
    cluster.metadata.uid = Some("0b5a5c2e-0000-4000-8000-000000000001".to_owned());
    cluster
}

/// The seed's sample cluster.
const SAMPLE: &str = include_str!("../../../../deploy/samples/postgresqlcluster.yaml");

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
fn the_application_role_superuser_access_and_network_policy_have_their_defaults() {
    let valid = validate(&cluster(SAMPLE), &LiveFacts::default())
        .expect("valid")
        .effective;
    assert_eq!(
        (
            valid.application.database.as_str(),
            valid.application.owner.as_str()
        ),
        ("app", "app")
    );
    assert!(!valid.superuser_access);
    assert_eq!(valid.network_policy, Some(Vec::new()));
    let mut set = cluster(SAMPLE);
    set.spec.bootstrap = serde_json::from_value(
        serde_json::json!({"initdb": {"database": "shop", "owner": "shopper"}}),
    )
    .expect("bootstrap");
    set.spec.enable_superuser_access = true;
    set.spec.network_policy = Some(pgkube_crds::NetworkPolicySettings {
        enabled: false,
        postgres_from: Vec::new(),
    });
    let valid = validate(&set, &LiveFacts::default())
        .expect("valid")
        .effective;
    assert_eq!(
        (
            valid.application.database.as_str(),
            valid.application.owner.as_str()
        ),
        ("shop", "shopper")
    );
    assert!(valid.superuser_access);
    assert_eq!(valid.network_policy, None, "turned off");
}

#[test]
fn parameters_pass_through_but_refused_ones_and_multi_line_values_are_invalid() {
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
            .contains("cannot set port (pgkube sets them itself)"),
        "{managed}"
    );
    for (name, why) in [
        ("synchronous_standby_names", "pgkube sets them itself"),
        ("primary_conninfo", "pgkube sets them itself"),
        ("fsync", "lose or corrupt data on a crash"),
        ("ssl", "pgkube sets up TLS itself"),
        (
            "include_dir",
            "read settings from files pgkube does not write",
        ),
    ] {
        let refused = with(name, "x").expect_err(name).to_string();
        assert!(
            refused.contains(&format!("cannot set {name} (")) && refused.contains(why),
            "{refused}"
        );
    }
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
    grown.spec.storage.size = "200Gi".to_owned();
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

/// A cluster whose volumes are of storage class `class`.
fn with_class(class: &str) -> PostgreSQLCluster {
    let mut cluster = cluster(SAMPLE);
    cluster.spec.storage.storage_class_name = Some(class.to_owned());
    cluster
}

#[test]
fn a_new_cluster_gets_its_storage_class() {
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
    shrunk.spec.storage.size = "50Gi".to_owned();
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
    below_volumes.spec.storage.size = "150Gi".to_owned();
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
    upgraded.spec.postgres_version = PostgresVersion::V17;
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
    downgraded.spec.postgres_version = PostgresVersion::V15;
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
    both.spec.postgres_version = PostgresVersion::V17;
    both.spec.storage.size = "10Gi".to_owned();
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
        refusal
            .message()
            .contains("keeps 4 replicas until a switchover"),
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

#[test]
fn wal_goes_to_the_backup_storage_by_default_and_nowhere_when_turned_off_or_without_storage() {
    let sample = cluster(SAMPLE);
    let storage = sample
        .spec
        .backup
        .as_ref()
        .and_then(|backup| backup.storage.as_ref())
        .map(|storage| storage.s3.clone());
    assert!(storage.is_some(), "the sample has backup storage");
    let archive = |cluster: &PostgreSQLCluster| {
        validate(cluster, &LiveFacts::default())
            .expect("valid")
            .effective
            .wal_archive
    };
    assert_eq!(archive(&sample), storage);
    let mut off = sample.clone();
    if let Some(backup) = off.spec.backup.as_mut() {
        backup.wal_archiving = Some(pgkube_crds::WalArchiving { enabled: false });
    }
    assert_eq!(archive(&off), None);
    let mut no_storage = sample.clone();
    if let Some(backup) = no_storage.spec.backup.as_mut() {
        backup.storage = None;
        backup.wal_archiving = Some(pgkube_crds::WalArchiving { enabled: true });
    }
    assert_eq!(archive(&no_storage), None);
}
