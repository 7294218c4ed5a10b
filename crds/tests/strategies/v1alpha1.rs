//! Generators of valid v1alpha1 objects. Their annotations may include
//! `conversion.db.example.com/v1beta1`: absent, as conversion writes it (a storage class), or any
//! other text.

use std::collections::BTreeMap;

use pgkube_crds::conversion::V1BETA1_FIELDS_ANNOTATION;
use pgkube_crds::v1alpha1::{
    BackupConfig, Bootstrap, PostgreSQLBackup, PostgreSQLBackupSpec, PostgreSQLBackupStatus,
    PostgreSQLCluster, PostgreSQLClusterSpec, PostgreSQLRestore, PostgreSQLRestoreSpec, Recovery,
    RecoverySource, RestoreSource, WalArchiving,
};
use proptest::collection::vec;
use proptest::option::of;
use proptest::prelude::*;

use super::*;

/// What a v1alpha1 object may hold under `conversion.db.example.com/v1beta1`.
fn carried_fields_annotation() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        2 => Just(None),
        1 => "[a-z0-9-]{1,20}".prop_map(|class| Some(format!(
            r#"{{"spec":{{"storage":{{"storageClassName":"{class}"}}}}}}"#
        ))),
        1 => text().prop_map(Some),
        1 => Just(Some(r#"{"spec": {"storage": {"storageClassName": "spaced"}}}"#.to_owned())),
    ]
}

fn annotations() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    (user_annotations(), carried_fields_annotation()).prop_map(|(mut annotations, carried)| {
        if let Some(value) = carried {
            annotations.insert(V1BETA1_FIELDS_ANNOTATION.to_owned(), value);
        }
        non_empty(annotations)
    })
}

fn restore_source() -> impl Strategy<Value = RestoreSource> {
    (s3_storage(), "[a-z0-9/-]{1,40}").prop_map(|(s3, object_key)| RestoreSource { s3, object_key })
}

fn cluster_backup_settings() -> BoxedStrategy<BackupConfig> {
    (
        cron(),
        of(time_zone()),
        1i32..=90,
        of(s3_storage()),
        any::<bool>(),
        of(compression()),
        of(backup_method()),
        of(any::<bool>()),
    )
        .prop_map(
            |(schedule, time_zone, retention_days, s3, suspend, compression, method, archiving)| {
                BackupConfig {
                    schedule,
                    time_zone,
                    retention_days,
                    s3,
                    suspend,
                    compression,
                    method,
                    wal_archiving: archiving.map(|enabled| WalArchiving { enabled }),
                }
            },
        )
        .boxed()
}

fn bootstrap() -> BoxedStrategy<Bootstrap> {
    let recovery = (backup_or_source(recovery_source()), of(recovery_target()))
        .prop_map(|((backup, source), target)| Recovery {
            backup,
            source,
            target,
        })
        .boxed();
    prop_oneof![
        backup_or_source(restore_source()).prop_map(|(backup, source)| Bootstrap {
            backup,
            source,
            recovery: None,
            initdb: None,
        }),
        recovery.prop_map(|recovery| Bootstrap {
            backup: None,
            source: None,
            recovery: Some(recovery),
            initdb: None,
        }),
        initdb().prop_map(|initdb| Bootstrap {
            backup: None,
            source: None,
            recovery: None,
            initdb: Some(initdb),
        }),
    ]
    .boxed()
}

fn recovery_source() -> impl Strategy<Value = RecoverySource> {
    (s3_storage(), "([a-z0-9-]{1,8}/){0,2}wal/[a-z0-9-]{1,12}/").prop_map(|(storage, archive)| {
        RecoverySource {
            s3: storage,
            archive,
        }
    })
}

fn cluster_spec() -> impl Strategy<Value = PostgreSQLClusterSpec> {
    let instances = (1i32..=10, postgres_version(), size(), resources());
    let pods = (node_selector(), tolerations(), affinity());
    let data = (
        of(cluster_backup_settings()),
        postgresql_settings(),
        of(bootstrap()),
        high_availability(),
        (
            spread(),
            primary_update_strategy(),
            any::<bool>(),
            of(network_policy()),
            of(server_certificates()),
            of("[a-z]([a-z0-9.-]{0,18}[a-z0-9])?"),
            of(monitoring()),
        ),
    );
    (instances, pods, data).prop_map(|(instances, pods, data)| {
        let (replicas, version, storage, resources) = instances;
        let (node_selector, tolerations, affinity) = pods;
        let (backup, postgresql, bootstrap, high_availability, rest) = data;
        let (
            spread,
            primary_update_strategy,
            enable_superuser_access,
            network_policy,
            certificates,
            service_account_name,
            monitoring,
        ) = rest;
        let spread = admissible_spread(spread, &affinity);
        PostgreSQLClusterSpec {
            replicas,
            version,
            storage,
            resources,
            backup,
            node_selector,
            tolerations,
            affinity,
            postgresql,
            bootstrap,
            high_availability,
            spread,
            primary_update_strategy,
            enable_superuser_access,
            network_policy,
            certificates,
            service_account_name,
            monitoring,
        }
    })
}

pub fn cluster() -> impl Strategy<Value = PostgreSQLCluster> {
    (
        object_meta(annotations()),
        cluster_spec(),
        of(cluster_status()),
    )
        .prop_map(|(metadata, spec, status)| PostgreSQLCluster {
            metadata,
            spec,
            status,
        })
}

fn backup_spec() -> impl Strategy<Value = PostgreSQLBackupSpec> {
    (
        local_reference(),
        backup_method(),
        of(backup_target()),
        deletion_policy(),
        of(compression()),
    )
        .prop_map(|(cluster, method, target, deletion_policy, compression)| {
            PostgreSQLBackupSpec {
                cluster,
                method,
                target,
                deletion_policy,
                compression,
            }
        })
}

fn backup_status() -> impl Strategy<Value = PostgreSQLBackupStatus> {
    let state = (of(backup_phase()), of(time()), of(time()), of(s3_storage()));
    let result = (
        of("[a-z0-9/-]{1,40}"),
        of(0i64..1 << 40),
        of("sha256:[0-9a-f]{64}"),
        of("1[4-8]\\.[0-9]{1,2}"),
    );
    let detail = (of(name()), of(text()), conditions(), of(compression()));
    let progress = of(super::transfer_progress());
    (state, result, detail, progress).prop_map(|(state, result, detail, progress)| {
        let (phase, start_time, completion_time, storage) = state;
        let (object_key, size_bytes, checksum, postgres_version) = result;
        let (job_name, message, conditions, compression) = detail;
        PostgreSQLBackupStatus {
            phase,
            start_time,
            completion_time,
            storage,
            compression,
            object_key,
            size_bytes,
            checksum,
            postgres_version,
            job_name,
            progress,
            message,
            conditions,
        }
    })
}

pub fn backup() -> impl Strategy<Value = PostgreSQLBackup> {
    (
        object_meta(annotations()),
        backup_spec(),
        of(backup_status()),
    )
        .prop_map(|(metadata, spec, status)| PostgreSQLBackup {
            metadata,
            spec,
            status,
        })
}

fn restore_spec() -> impl Strategy<Value = PostgreSQLRestoreSpec> {
    (
        backup_or_source(restore_source()),
        local_reference(),
        vec(name(), 0..3),
        any::<bool>(),
        of("([0-9]{1,20}|Any)"),
        prop_oneof![
            Just(pgkube_crds::RestoreMethod::Logical),
            Just(pgkube_crds::RestoreMethod::PointInTime)
        ],
        of(super::recovery_target()),
    )
        .prop_map(
            |((backup, source), cluster, databases, drop_existing, expected, method, target)| {
                PostgreSQLRestoreSpec {
                    backup,
                    source,
                    cluster,
                    databases,
                    drop_existing,
                    expected_system_identifier: expected,
                    method,
                    target,
                }
            },
        )
}

pub fn restore() -> impl Strategy<Value = PostgreSQLRestore> {
    (
        object_meta(annotations()),
        restore_spec(),
        of(restore_status()),
    )
        .prop_map(|(metadata, spec, status)| PostgreSQLRestore {
            metadata,
            spec,
            status,
        })
}
