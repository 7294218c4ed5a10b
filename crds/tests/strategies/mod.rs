//! Generators of valid pgkube objects in both versions, for the conversion properties: every
//! optional field present or absent, statuses with conditions and instances, metadata with
//! labels, annotations, owner references, finalizers and managed fields.
//!
//! [`json`] generates raw JSON instead: objects shaped around the fields conversion moves, and
//! fields no version knows.
//!
//! This module has what both versions share (metadata, Kubernetes types, S3 storage, statuses
//! of the same shape); [`v1alpha1`] and [`v1beta1`] generate each version's own types.

mod backups;
pub mod json;
pub mod v1alpha1;
pub mod v1beta1;

pub use backups::*;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PodAffinityTerm, PodAntiAffinity, ResourceRequirements, SecretKeySelector, Toleration,
    TopologySpreadConstraint, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, FieldsV1, LabelSelector, ManagedFieldsEntry, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::jiff::Timestamp;
use pgkube_crds::{
    BackupCompression, BackupMethod, BackupPhase, BackupTarget, ClusterPhase, CompressionMethod,
    DeletionPolicy, HighAvailability, InstanceRole, InstanceSpread, InstanceStatus, LocalReference,
    NodeAntiAffinity, PostgreSQLClusterStatus, PostgreSQLRestoreStatus, PostgreSQLSettings,
    PostgresVersion, PrimaryChange, PrimaryChangeKind, PrimaryUpdateStrategy, RestorePhase,
    S3Credentials, S3Storage, ServerSideEncryption, SynchronousReplication, TransferProgress,
    WalArchivingStatus,
};
use proptest::collection::{btree_map, vec};
use proptest::option::of;
use proptest::prelude::*;
use proptest::sample::select;

/// A DNS-label-like name.
pub fn name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,20}"
}

/// Any text, control characters and non-ASCII included.
pub fn text() -> impl Strategy<Value = String> {
    any::<String>()
}

/// A time with whole seconds, as the API server writes them.
pub fn time() -> impl Strategy<Value = Time> {
    (0i64..4_102_444_800)
        .prop_map(|seconds| Time(Timestamp::from_second(seconds).expect("a time in range")))
}

fn uid() -> impl Strategy<Value = String> {
    "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
}

fn label_map() -> impl Strategy<Value = BTreeMap<String, String>> {
    btree_map(
        "([a-z]{1,8}\\.)?[a-z]{1,8}(/[a-z-]{1,12})?",
        "[a-z0-9._-]{0,12}",
        0..4,
    )
}

/// Annotations a user or a tool may set, including other keys under `conversion.db.example.com/`
/// (only `conversion.db.example.com/v1beta1` is conversion's), but never that one.
pub fn user_annotations() -> impl Strategy<Value = BTreeMap<String, String>> {
    let key = prop_oneof![
        4 => "[a-z]{1,8}\\.example\\.org/[a-z-]{1,12}",
        1 => Just("kubectl.kubernetes.io/last-applied-configuration".to_owned()),
        1 => Just("db.example.com/scheduled-time".to_owned()),
        1 => Just(pgkube_crds::conversion::V1ALPHA1_FIELDS_ANNOTATION.to_owned()),
        1 => Just("conversion.db.example.com/v1beta2".to_owned()),
    ];
    btree_map(key, text(), 0..4)
}

/// `None` for an empty map, as the API server gives it.
pub fn non_empty<V>(map: BTreeMap<String, V>) -> Option<BTreeMap<String, V>> {
    (!map.is_empty()).then_some(map)
}

fn owner_reference() -> impl Strategy<Value = OwnerReference> {
    (name(), uid(), of(any::<bool>()), of(any::<bool>())).prop_map(
        |(name, uid, controller, block_owner_deletion)| OwnerReference {
            api_version: "db.example.com/v1alpha1".into(),
            kind: "PostgreSQLCluster".into(),
            name,
            uid,
            controller,
            block_owner_deletion,
        },
    )
}

fn managed_fields_entry() -> impl Strategy<Value = ManagedFieldsEntry> {
    (name(), select(vec!["Apply", "Update"]), of(time())).prop_map(|(manager, operation, time)| {
        ManagedFieldsEntry {
            api_version: Some("db.example.com/v1alpha1".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(serde_json::json!({"f:spec": {"f:replicas": {}}}))),
            manager: Some(manager),
            operation: Some(operation.into()),
            subresource: None,
            time,
        }
    })
}

/// Object metadata with the given annotations.
pub fn object_meta(
    annotations: impl Strategy<Value = Option<BTreeMap<String, String>>>,
) -> impl Strategy<Value = ObjectMeta> {
    let identity = (name(), name(), uid(), "[0-9]{1,9}", of(1i64..1000));
    let times = (of(time()), of(time()), of(0i64..600));
    let lists = (
        of(vec(owner_reference(), 1..3)),
        of(vec("[a-z.]{1,12}/[a-z-]{1,12}", 1..3)),
        of(vec(managed_fields_entry(), 1..3)),
    );
    (identity, times, label_map(), annotations, lists).prop_map(
        |(identity, times, labels, annotations, lists)| {
            let (name, namespace, uid, resource_version, generation) = identity;
            let (creation_timestamp, deletion_timestamp, deletion_grace_period_seconds) = times;
            let (owner_references, finalizers, managed_fields) = lists;
            ObjectMeta {
                name: Some(name),
                namespace: Some(namespace),
                uid: Some(uid),
                resource_version: Some(resource_version),
                generation,
                creation_timestamp,
                deletion_timestamp,
                deletion_grace_period_seconds,
                labels: non_empty(labels),
                annotations,
                owner_references,
                finalizers,
                managed_fields,
                ..ObjectMeta::default()
            }
        },
    )
}

pub fn condition() -> impl Strategy<Value = Condition> {
    (
        "[A-Z][A-Za-z]{0,15}",
        select(vec!["True", "False", "Unknown"]),
        "[A-Z][A-Za-z]{0,15}",
        text(),
        time(),
        of(0i64..100),
    )
        .prop_map(
            |(type_, status, reason, message, last_transition_time, observed_generation)| {
                Condition {
                    type_,
                    status: status.into(),
                    reason,
                    message,
                    last_transition_time,
                    observed_generation,
                }
            },
        )
}

pub fn conditions() -> impl Strategy<Value = Vec<Condition>> {
    vec(condition(), 0..4)
}

pub fn local_reference() -> impl Strategy<Value = LocalReference> {
    name().prop_map(|name| LocalReference { name })
}

fn secret_key_selector() -> impl Strategy<Value = SecretKeySelector> {
    (name(), "[a-z.-]{1,12}", of(any::<bool>())).prop_map(|(name, key, optional)| {
        SecretKeySelector {
            name,
            key,
            optional,
        }
    })
}

pub fn s3_storage() -> impl Strategy<Value = S3Storage> {
    let location = (
        "[a-z0-9-]{3,20}",
        of("[a-z0-9-]{1,8}(/[a-z0-9-]{1,8}){0,2}"),
        of("https?://[a-z.]{1,15}(:[0-9]{2,5})?"),
        "[a-z]{2}-[a-z]{4,7}-[1-3]",
        any::<bool>(),
    );
    let security = (
        of(secret_key_selector()),
        of((secret_key_selector(), secret_key_selector())),
        of(select(vec![
            ServerSideEncryption::Aes256,
            ServerSideEncryption::AwsKms,
        ])),
        any::<bool>(),
    );
    (location, security).prop_map(|(location, security)| {
        let (bucket, prefix, endpoint, region, force_path_style) = location;
        let (ca_bundle, keys, server_side_encryption, allowed) = security;
        // Admission refuses a plain http:// endpoint unless the spec allows it.
        let plain = endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"));
        S3Storage {
            bucket,
            prefix,
            endpoint,
            region,
            force_path_style,
            ca_bundle,
            credentials: keys.map(|(access_key_id, secret_access_key)| S3Credentials {
                access_key_id,
                secret_access_key,
            }),
            server_side_encryption,
            allow_plain_http: plain || allowed,
        }
    })
}

pub fn postgres_version() -> impl Strategy<Value = PostgresVersion> {
    select(vec![
        PostgresVersion::V14,
        PostgresVersion::V15,
        PostgresVersion::V16,
        PostgresVersion::V17,
        PostgresVersion::V18,
    ])
}

/// A volume size as the schema allows it.
pub fn size() -> impl Strategy<Value = String> {
    "[1-9][0-9]{0,4}Gi"
}

/// A 5-field cron expression.
pub fn cron() -> impl Strategy<Value = String> {
    "([0-9]{1,2}|\\*|\\*/[1-9]) ([0-9]{1,2}|\\*) (\\*|[1-9]) (\\*|1-6) (\\*|MON-FRI)"
}

pub fn time_zone() -> impl Strategy<Value = String> {
    "[A-Z][a-z]{2,10}/[A-Z][a-z_]{2,12}"
}

fn quantities() -> impl Strategy<Value = Option<BTreeMap<String, Quantity>>> {
    let quantity = "[1-9][0-9]{0,3}(m|Mi|Gi)?".prop_map(Quantity);
    of(btree_map(
        select(vec!["cpu", "memory"]).prop_map(String::from),
        quantity,
        1..3,
    ))
}

pub fn resources() -> impl Strategy<Value = Option<ResourceRequirements>> {
    of(
        (quantities(), quantities()).prop_map(|(limits, requests)| ResourceRequirements {
            limits,
            requests,
            claims: None,
        }),
    )
}

pub fn node_selector() -> impl Strategy<Value = BTreeMap<String, String>> {
    label_map()
}

fn toleration() -> impl Strategy<Value = Toleration> {
    (
        of(name()),
        of(select(vec!["Equal", "Exists"])),
        of(name()),
        of(select(vec!["NoSchedule", "PreferNoSchedule", "NoExecute"])),
        of(0i64..3600),
    )
        .prop_map(
            |(key, operator, value, effect, toleration_seconds)| Toleration {
                key,
                operator: operator.map(String::from),
                value,
                effect: effect.map(String::from),
                toleration_seconds,
            },
        )
}

pub fn tolerations() -> impl Strategy<Value = Vec<Toleration>> {
    vec(toleration(), 0..3)
}

fn required_node_affinity() -> impl Strategy<Value = NodeAffinity> {
    (name(), vec(name(), 1..3)).prop_map(|(key, values)| NodeAffinity {
        required_during_scheduling_ignored_during_execution: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(vec![NodeSelectorRequirement {
                    key,
                    operator: "In".into(),
                    values: Some(values),
                }]),
                match_fields: None,
            }],
        }),
        preferred_during_scheduling_ignored_during_execution: None,
    })
}

fn spread_over_zones() -> impl Strategy<Value = PodAntiAffinity> {
    (1i32..100, label_map()).prop_map(|(weight, labels)| PodAntiAffinity {
        preferred_during_scheduling_ignored_during_execution: Some(vec![WeightedPodAffinityTerm {
            weight,
            pod_affinity_term: PodAffinityTerm {
                label_selector: Some(LabelSelector {
                    match_labels: non_empty(labels),
                    match_expressions: None,
                }),
                topology_key: "topology.kubernetes.io/zone".into(),
                ..PodAffinityTerm::default()
            },
        }]),
        required_during_scheduling_ignored_during_execution: None,
    })
}

pub fn affinity() -> impl Strategy<Value = Option<Affinity>> {
    of(
        (of(required_node_affinity()), of(spread_over_zones())).prop_map(
            |(node_affinity, pod_anti_affinity)| Affinity {
                node_affinity,
                pod_anti_affinity,
                pod_affinity: None,
            },
        ),
    )
}

/// How instances spread (the same type in both versions). The cluster's strategy drops the
/// node anti-affinity when its affinity has a pod anti-affinity, as admission requires.
pub fn spread() -> impl Strategy<Value = Option<InstanceSpread>> {
    let anti_affinity = select(vec![
        NodeAntiAffinity::Preferred,
        NodeAntiAffinity::Required,
        NodeAntiAffinity::Disabled,
    ]);
    let constraint = (1i32..=3, name(), of(name())).prop_map(|(max_skew, key, instance)| {
        TopologySpreadConstraint {
            max_skew,
            topology_key: key,
            when_unsatisfiable: "DoNotSchedule".into(),
            label_selector: instance.map(|instance| LabelSelector {
                match_labels: Some(BTreeMap::from([("instance".to_owned(), instance)])),
                ..LabelSelector::default()
            }),
            ..TopologySpreadConstraint::default()
        }
    });
    of((of(anti_affinity), vec(constraint, 0..2)).prop_map(
        |(node_anti_affinity, topology_spread_constraints)| InstanceSpread {
            node_anti_affinity,
            topology_spread_constraints,
        },
    ))
}

/// `spread` as admission takes it beside `affinity`.
pub fn admissible_spread(
    spread: Option<InstanceSpread>,
    affinity: &Option<Affinity>,
) -> Option<InstanceSpread> {
    let own = affinity
        .as_ref()
        .is_some_and(|affinity| affinity.pod_anti_affinity.is_some());
    spread.map(|spread| InstanceSpread {
        node_anti_affinity: spread.node_anti_affinity.filter(|_| !own),
        ..spread
    })
}

/// `primaryUpdateStrategy` (the same type in both versions).
pub fn primary_update_strategy() -> impl Strategy<Value = Option<PrimaryUpdateStrategy>> {
    of(select(vec![
        PrimaryUpdateStrategy::Unsupervised,
        PrimaryUpdateStrategy::Supervised,
    ]))
}

/// An application database and owner (the same type in both versions).
pub fn initdb() -> impl Strategy<Value = pgkube_crds::Initdb> {
    ("[a-z_][a-z0-9_]{0,8}", "[a-z_][a-z0-9_]{0,8}")
        .prop_map(|(database, owner)| pgkube_crds::Initdb { database, owner })
}

/// NetworkPolicy settings (the same type in both versions): peers by namespace label or by
/// address block.
pub fn network_policy() -> impl Strategy<Value = pgkube_crds::NetworkPolicySettings> {
    use k8s_openapi::api::networking::v1::{IPBlock, NetworkPolicyPeer};
    let by_namespace = "[a-z]{1,8}".prop_map(|team| NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("team".to_owned(), team)])),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    });
    let by_address = (0u8..=255).prop_map(|octet| NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: format!("10.{octet}.0.0/16"),
            except: None,
        }),
        ..NetworkPolicyPeer::default()
    });
    (
        any::<bool>(),
        vec(prop_oneof![by_namespace, by_address], 0..3),
    )
        .prop_map(
            |(enabled, postgres_from)| pgkube_crds::NetworkPolicySettings {
                enabled,
                postgres_from,
            },
        )
}

/// A server certificate of one's own (the same type in both versions), with or without a CA
/// Secret of its own.
pub fn server_certificates() -> impl Strategy<Value = pgkube_crds::ServerCertificates> {
    ("[a-z]{1,12}", of("[a-z]{1,12}"), of("[a-z]{1,12}")).prop_map(
        |(server_tls_secret, server_ca_secret, client_ca_secret)| pgkube_crds::ServerCertificates {
            server_tls_secret,
            server_ca_secret,
            client_ca_secret,
        },
    )
}

/// Monitoring settings (the same type in both versions).
pub fn monitoring() -> impl Strategy<Value = pgkube_crds::Monitoring> {
    of((name(), "[a-z.]{1,12}", of(any::<bool>()))).prop_map(|selector| pgkube_crds::Monitoring {
        custom_queries: selector.map(|(name, key, optional)| {
            k8s_openapi::api::core::v1::ConfigMapKeySelector {
                name,
                key,
                optional,
            }
        }),
    })
}

/// High-availability settings (the same type in both versions).
pub fn high_availability() -> impl Strategy<Value = Option<HighAvailability>> {
    let synchronous =
        (1u32..=9, 0u32..=8).prop_map(|(min_standbys, extra)| SynchronousReplication {
            min_standbys,
            max_standbys: (min_standbys + extra).min(9),
        });
    // With an isolation timeout, the failover delay (default 5) leaves the fencing margin.
    let delays = (of(1u32..=10), 0u32..=3600).prop_map(|(isolation, delay)| match isolation {
        Some(isolation) => (Some(isolation), Some(delay.max(isolation + 2))),
        None => (None, Some(delay.max(1))),
    });
    let delays = prop_oneof![Just((None, None)), delays];
    of((delays, of(synchronous)).prop_map(
        |((isolation_timeout_seconds, failover_delay_seconds), synchronous)| HighAvailability {
            failover_delay_seconds,
            isolation_timeout_seconds,
            synchronous,
        },
    ))
}

fn primary_change() -> impl Strategy<Value = PrimaryChange> {
    (
        select(vec![
            PrimaryChangeKind::Switchover,
            PrimaryChangeKind::Failover,
        ]),
        name(),
        name(),
        "[A-Za-z ]{0,30}",
        time(),
        of(time()),
        of(1i64..1000),
    )
        .prop_map(
            |(kind, from, to, reason, started_at, completed_at, term)| PrimaryChange {
                kind,
                from,
                to,
                reason,
                started_at,
                completed_at,
                term,
            },
        )
}

pub fn postgresql_settings() -> impl Strategy<Value = Option<PostgreSQLSettings>> {
    of(btree_map("[a-z_]{3,20}", "[A-Za-z0-9. ]{0,12}", 0..4)
        .prop_map(|parameters| PostgreSQLSettings { parameters }))
}

fn instance_status() -> impl Strategy<Value = InstanceStatus> {
    (
        name(),
        select(vec![
            InstanceRole::Primary,
            InstanceRole::Replica,
            InstanceRole::Unknown,
        ]),
        any::<bool>(),
        of(1i64..20),
        of(0i64..1 << 40),
        of(any::<bool>()),
        of(name()),
    )
        .prop_map(
            |(name, role, ready, timeline, lag_bytes, streaming, message)| InstanceStatus {
                name,
                role,
                ready,
                timeline,
                lag_bytes,
                streaming,
                message,
            },
        )
}

fn cluster_phase() -> impl Strategy<Value = ClusterPhase> {
    select(vec![
        ClusterPhase::Pending,
        ClusterPhase::Creating,
        ClusterPhase::Running,
        ClusterPhase::Scaling,
        ClusterPhase::Upgrading,
        ClusterPhase::Degraded,
        ClusterPhase::Failed,
    ])
}

/// A cluster status (the same type in both versions).
pub fn cluster_status() -> BoxedStrategy<PostgreSQLClusterStatus> {
    let state = (
        of(cluster_phase()),
        0i32..10,
        of("1[4-8]\\.[0-9]{1,2}"),
        of(name()),
        vec(instance_status(), 0..4),
        of(0i64..100),
        (of(name()), of(primary_change())),
    );
    let history = (
        conditions(),
        of(time()),
        of(time()),
        of(name()),
        of("[1-9][0-9]{18}"),
        of(wal_archiving_status()),
        (of(recoverability()), of(in_place_recovery())),
    );
    (state, history)
        .prop_map(|(state, history)| {
            let (
                phase,
                ready_replicas,
                current_version,
                current_primary,
                instances,
                observed,
                change,
            ) = state;
            let (target_primary, primary_change) = change;
            let (
                conditions,
                last_scheduled_backup,
                next_scheduled_backup,
                last_successful_backup,
                system_identifier,
                wal_archiving,
                (recoverability, in_place_recovery),
            ) = history;
            PostgreSQLClusterStatus {
                phase,
                ready_replicas,
                current_version,
                current_primary,
                target_primary,
                primary_change,
                instances,
                system_identifier,
                observed_generation: observed,
                conditions,
                last_scheduled_backup,
                next_scheduled_backup,
                last_successful_backup,
                wal_archiving,
                recoverability,
                in_place_recovery,
            }
        })
        .boxed()
}

fn in_place_recovery() -> impl Strategy<Value = pgkube_crds::InPlaceRecovery> {
    use pgkube_crds::InPlaceStep;
    (
        name(),
        "[0-9a-f-]{36}",
        prop_oneof![
            Just(InPlaceStep::Recovering),
            Just(InPlaceStep::Recloning),
            Just(InPlaceStep::Completed),
            Just(InPlaceStep::Failed)
        ],
        of("[ -~]{0,40}"),
        of("/[a-z/.-]{1,40}"),
    )
        .prop_map(|(restore, uid, step, message, previous_data)| {
            pgkube_crds::InPlaceRecovery {
                restore,
                uid,
                step,
                message,
                previous_data,
            }
        })
}

fn recoverability() -> impl Strategy<Value = pgkube_crds::Recoverability> {
    (
        "([a-z0-9-]{1,8}/){0,2}wal/[a-z0-9-]{1,12}/",
        of(time()),
        of(name()),
        of(time()),
    )
        .prop_map(|(archive, first_point, first_backup, last_point)| {
            pgkube_crds::Recoverability {
                archive,
                first_point,
                first_backup,
                last_point,
            }
        })
}

/// What the primary reports of its WAL archiving.
fn wal_archiving_status() -> BoxedStrategy<WalArchivingStatus> {
    let file = "[0-9A-F]{24}";
    (
        (of(name()), of(file), of(time())),
        (of(file), of(time()), of("[ -~]{0,40}")),
        (of(0i64..1000), of(0i64..1 << 40)),
    )
        .prop_map(|(archived, failed, usage)| WalArchivingStatus {
            instance: archived.0,
            last_archived: archived.1,
            last_archived_time: archived.2,
            last_failed: failed.0,
            last_failed_time: failed.1,
            last_error: failed.2,
            waiting: usage.0,
            wal_bytes: usage.1,
        })
        .boxed()
}
