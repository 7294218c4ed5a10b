//! Generators of valid v1beta1 objects, a storage class set or not. Their annotations never
//! include `conversion.db.example.com/v1beta1`, which conversion owns on the way down.

use std::collections::BTreeMap;

use pgkube_crds::v1beta1::{
    BackupSchedule, BackupSpec, BackupStorage, Bootstrap, PostgreSQLBackup, PostgreSQLBackupSpec,
    PostgreSQLBackupStatus, PostgreSQLCluster, PostgreSQLClusterSpec, PostgreSQLRestore,
    PostgreSQLRestoreSpec, Recovery, RecoverySource, RestoreSource, RetentionPolicy, StorageSpec,
    WalArchiving,
};
use proptest::collection::vec;
use proptest::option::of;
use proptest::prelude::*;

use super::*;

fn annotations() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    user_annotations().prop_map(non_empty)
}

fn backup_storage() -> impl Strategy<Value = BackupStorage> {
    s3_storage().prop_map(|s3| BackupStorage { s3 })
}

fn restore_source() -> impl Strategy<Value = RestoreSource> {
    (backup_storage(), "[a-z0-9/-]{1,40}").prop_map(|(storage, object_key)| RestoreSource {
        storage,
        object_key,
    })
}

/// A storage class: a DNS name as a rule, but the schema only bounds its length, so any text too
/// (quotes and control characters must survive the annotation's JSON).
fn storage_class_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9][a-z0-9.-]{0,30}".boxed(),
        1 => text().prop_filter("not empty", |name| !name.is_empty()).boxed(),
    ]
}

fn storage_spec() -> impl Strategy<Value = StorageSpec> {
    (size(), of(storage_class_name())).prop_map(|(size, storage_class_name)| StorageSpec {
        size,
        storage_class_name,
    })
}

fn cluster_backup_settings() -> BoxedStrategy<BackupSpec> {
    let schedule =
        (cron(), of(time_zone()), any::<bool>()).prop_map(|(cron, time_zone, suspend)| {
            BackupSchedule {
                cron,
                time_zone,
                suspend,
            }
        });
    let settings = (
        schedule,
        1i32..=90,
        of(backup_storage()),
        of(compression()),
        of(backup_method()),
        of(any::<bool>()),
    );
    settings
        .prop_map(
            |(schedule, days, storage, compression, method, archiving)| BackupSpec {
                schedule,
                retention: RetentionPolicy { days },
                storage,
                compression,
                method,
                wal_archiving: archiving.map(|enabled| WalArchiving { enabled }),
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
    (
        backup_storage(),
        "([a-z0-9-]{1,8}/){0,2}wal/[a-z0-9-]{1,12}/",
    )
        .prop_map(|(storage, archive)| RecoverySource { storage, archive })
}

fn cluster_spec() -> impl Strategy<Value = PostgreSQLClusterSpec> {
    let instances = (1i32..=10, postgres_version(), storage_spec(), resources());
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
        let (replicas, postgres_version, storage, resources) = instances;
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
            postgres_version,
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
    let state = (
        of(backup_phase()),
        of(time()),
        of(time()),
        of(backup_storage()),
    );
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
