//! The typed conversion, written field by field on the Rust types: an oracle for the JSON
//! conversion on the objects those types can hold. Each struct is destructured completely, so a
//! field added to either version does not compile here until the test says where it goes.
//!
//! Only v1beta1's storage class has no place in v1alpha1; it is carried in the annotation
//! `conversion.db.example.com/v1beta1` as `{"spec":{"storage":{"storageClassName":"..."}}}`, read
//! back only in exactly that form.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use pgkube_crds::conversion::V1BETA1_FIELDS_ANNOTATION;
use pgkube_crds::{S3Storage, v1alpha1, v1beta1};
use serde_json::json;

/// A conversion of one kind from one version to the other.
pub trait Typed<Target> {
    fn typed(self) -> Target;
}

impl Typed<v1beta1::PostgreSQLCluster> for v1alpha1::PostgreSQLCluster {
    fn typed(self) -> v1beta1::PostgreSQLCluster {
        let v1alpha1::PostgreSQLCluster {
            mut metadata,
            spec,
            status,
        } = self;
        let class = take_storage_class(&mut metadata);
        let mut spec = spec_to_v1beta1(spec);
        spec.storage.storage_class_name = class;
        v1beta1::PostgreSQLCluster {
            metadata,
            spec,
            status,
        }
    }
}

impl Typed<v1alpha1::PostgreSQLCluster> for v1beta1::PostgreSQLCluster {
    fn typed(self) -> v1alpha1::PostgreSQLCluster {
        let v1beta1::PostgreSQLCluster {
            mut metadata,
            spec,
            status,
        } = self;
        if let Some(class) = &spec.storage.storage_class_name {
            let value = json!({"spec": {"storage": {"storageClassName": class}}});
            metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(V1BETA1_FIELDS_ANNOTATION.to_owned(), value.to_string());
        }
        v1alpha1::PostgreSQLCluster {
            metadata,
            spec: spec_to_v1alpha1(spec),
            status,
        }
    }
}

/// The storage class in the annotation, if it holds exactly what the way down writes; then the
/// annotation goes (and the map, if that empties it).
fn take_storage_class(metadata: &mut ObjectMeta) -> Option<String> {
    let annotations = metadata.annotations.as_mut()?;
    let value = annotations.get(V1BETA1_FIELDS_ANNOTATION)?;
    let parsed: serde_json::Value = serde_json::from_str(value).ok()?;
    let class = parsed.pointer("/spec/storage/storageClassName")?.as_str()?;
    let canonical = json!({"spec": {"storage": {"storageClassName": class}}}).to_string();
    if canonical != *value {
        return None;
    }
    let class = class.to_owned();
    annotations.remove(V1BETA1_FIELDS_ANNOTATION);
    if annotations.is_empty() {
        metadata.annotations = None;
    }
    Some(class)
}

/// The spec in v1beta1's shape, without the fields only v1beta1 has.
fn spec_to_v1beta1(spec: v1alpha1::PostgreSQLClusterSpec) -> v1beta1::PostgreSQLClusterSpec {
    let v1alpha1::PostgreSQLClusterSpec {
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
    } = spec;
    v1beta1::PostgreSQLClusterSpec {
        replicas,
        postgres_version: version,
        storage: v1beta1::StorageSpec {
            size: storage,
            storage_class_name: None,
        },
        resources,
        backup: backup.map(backup_to_v1beta1),
        node_selector,
        tolerations,
        affinity,
        postgresql,
        bootstrap: bootstrap.map(bootstrap_to_v1beta1),
        high_availability,
        spread,
        primary_update_strategy,
        enable_superuser_access,
        network_policy,
        certificates,
        service_account_name,
        monitoring,
    }
}

/// The spec in v1alpha1's shape; the fields only v1beta1 has are left to the annotation.
fn spec_to_v1alpha1(spec: v1beta1::PostgreSQLClusterSpec) -> v1alpha1::PostgreSQLClusterSpec {
    let v1beta1::PostgreSQLClusterSpec {
        replicas,
        postgres_version,
        storage:
            v1beta1::StorageSpec {
                size,
                storage_class_name: _carried_in_the_annotation,
            },
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
    } = spec;
    v1alpha1::PostgreSQLClusterSpec {
        replicas,
        version: postgres_version,
        storage: size,
        resources,
        backup: backup.map(backup_to_v1alpha1),
        node_selector,
        tolerations,
        affinity,
        postgresql,
        bootstrap: bootstrap.map(bootstrap_to_v1alpha1),
        high_availability,
        spread,
        primary_update_strategy,
        enable_superuser_access,
        network_policy,
        certificates,
        service_account_name,
        monitoring,
    }
}

fn backup_to_v1beta1(backup: v1alpha1::BackupConfig) -> v1beta1::BackupSpec {
    let v1alpha1::BackupConfig {
        schedule,
        time_zone,
        retention_days,
        s3,
        suspend,
        compression,
        method,
        wal_archiving,
    } = backup;
    v1beta1::BackupSpec {
        schedule: v1beta1::BackupSchedule {
            cron: schedule,
            time_zone,
            suspend,
        },
        retention: v1beta1::RetentionPolicy {
            days: retention_days,
        },
        storage: s3.map(wrap_s3),
        compression,
        method,
        wal_archiving,
    }
}

fn backup_to_v1alpha1(backup: v1beta1::BackupSpec) -> v1alpha1::BackupConfig {
    let v1beta1::BackupSpec {
        schedule:
            v1beta1::BackupSchedule {
                cron,
                time_zone,
                suspend,
            },
        retention: v1beta1::RetentionPolicy { days },
        storage,
        compression,
        method,
        wal_archiving,
    } = backup;
    v1alpha1::BackupConfig {
        schedule: cron,
        time_zone,
        retention_days: days,
        s3: storage.map(unwrap_s3),
        suspend,
        compression,
        method,
        wal_archiving,
    }
}

fn bootstrap_to_v1beta1(bootstrap: v1alpha1::Bootstrap) -> v1beta1::Bootstrap {
    let v1alpha1::Bootstrap {
        backup,
        source,
        recovery,
        initdb,
    } = bootstrap;
    v1beta1::Bootstrap {
        initdb,
        backup,
        source: source.map(source_to_v1beta1),
        recovery: recovery.map(|recovery| {
            let v1alpha1::Recovery {
                backup,
                source,
                target,
            } = recovery;
            v1beta1::Recovery {
                backup,
                source: source.map(|v1alpha1::RecoverySource { s3, archive }| {
                    v1beta1::RecoverySource {
                        storage: wrap_s3(s3),
                        archive,
                    }
                }),
                target,
            }
        }),
    }
}

fn bootstrap_to_v1alpha1(bootstrap: v1beta1::Bootstrap) -> v1alpha1::Bootstrap {
    let v1beta1::Bootstrap {
        backup,
        source,
        recovery,
        initdb,
    } = bootstrap;
    v1alpha1::Bootstrap {
        initdb,
        backup,
        source: source.map(source_to_v1alpha1),
        recovery: recovery.map(|recovery| {
            let v1beta1::Recovery {
                backup,
                source,
                target,
            } = recovery;
            v1alpha1::Recovery {
                backup,
                source: source.map(|v1beta1::RecoverySource { storage, archive }| {
                    v1alpha1::RecoverySource {
                        s3: unwrap_s3(storage),
                        archive,
                    }
                }),
                target,
            }
        }),
    }
}

impl Typed<v1beta1::PostgreSQLBackup> for v1alpha1::PostgreSQLBackup {
    fn typed(self) -> v1beta1::PostgreSQLBackup {
        let v1alpha1::PostgreSQLBackup {
            metadata,
            spec,
            status,
        } = self;
        let v1alpha1::PostgreSQLBackupSpec {
            cluster,
            method,
            target,
            deletion_policy,
            compression,
        } = spec;
        v1beta1::PostgreSQLBackup {
            metadata,
            spec: v1beta1::PostgreSQLBackupSpec {
                cluster,
                method,
                target,
                deletion_policy,
                compression,
            },
            status: status.map(status_to_v1beta1),
        }
    }
}

impl Typed<v1alpha1::PostgreSQLBackup> for v1beta1::PostgreSQLBackup {
    fn typed(self) -> v1alpha1::PostgreSQLBackup {
        let v1beta1::PostgreSQLBackup {
            metadata,
            spec,
            status,
        } = self;
        let v1beta1::PostgreSQLBackupSpec {
            cluster,
            method,
            target,
            deletion_policy,
            compression,
        } = spec;
        v1alpha1::PostgreSQLBackup {
            metadata,
            spec: v1alpha1::PostgreSQLBackupSpec {
                cluster,
                method,
                target,
                deletion_policy,
                compression,
            },
            status: status.map(status_to_v1alpha1),
        }
    }
}

fn status_to_v1beta1(status: v1alpha1::PostgreSQLBackupStatus) -> v1beta1::PostgreSQLBackupStatus {
    let v1alpha1::PostgreSQLBackupStatus {
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
    } = status;
    v1beta1::PostgreSQLBackupStatus {
        phase,
        start_time,
        completion_time,
        storage: storage.map(wrap_s3),
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
}

fn status_to_v1alpha1(status: v1beta1::PostgreSQLBackupStatus) -> v1alpha1::PostgreSQLBackupStatus {
    let v1beta1::PostgreSQLBackupStatus {
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
    } = status;
    v1alpha1::PostgreSQLBackupStatus {
        phase,
        start_time,
        completion_time,
        storage: storage.map(unwrap_s3),
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
}

impl Typed<v1beta1::PostgreSQLRestore> for v1alpha1::PostgreSQLRestore {
    fn typed(self) -> v1beta1::PostgreSQLRestore {
        let v1alpha1::PostgreSQLRestore {
            metadata,
            spec,
            status,
        } = self;
        let v1alpha1::PostgreSQLRestoreSpec {
            backup,
            source,
            cluster,
            databases,
            drop_existing,
            expected_system_identifier,
            method,
            target,
        } = spec;
        v1beta1::PostgreSQLRestore {
            metadata,
            spec: v1beta1::PostgreSQLRestoreSpec {
                backup,
                source: source.map(source_to_v1beta1),
                cluster,
                databases,
                drop_existing,
                expected_system_identifier,
                method,
                target,
            },
            status,
        }
    }
}

impl Typed<v1alpha1::PostgreSQLRestore> for v1beta1::PostgreSQLRestore {
    fn typed(self) -> v1alpha1::PostgreSQLRestore {
        let v1beta1::PostgreSQLRestore {
            metadata,
            spec,
            status,
        } = self;
        let v1beta1::PostgreSQLRestoreSpec {
            backup,
            source,
            cluster,
            databases,
            drop_existing,
            expected_system_identifier,
            method,
            target,
        } = spec;
        v1alpha1::PostgreSQLRestore {
            metadata,
            spec: v1alpha1::PostgreSQLRestoreSpec {
                backup,
                source: source.map(source_to_v1alpha1),
                cluster,
                databases,
                drop_existing,
                expected_system_identifier,
                method,
                target,
            },
            status,
        }
    }
}

/// v1alpha1's storage in v1beta1's shape.
fn wrap_s3(s3: S3Storage) -> v1beta1::BackupStorage {
    v1beta1::BackupStorage { s3 }
}

/// v1beta1's storage in v1alpha1's shape.
fn unwrap_s3(storage: v1beta1::BackupStorage) -> S3Storage {
    let v1beta1::BackupStorage { s3 } = storage;
    s3
}

fn source_to_v1beta1(source: v1alpha1::RestoreSource) -> v1beta1::RestoreSource {
    let v1alpha1::RestoreSource { s3, object_key } = source;
    v1beta1::RestoreSource {
        storage: wrap_s3(s3),
        object_key,
    }
}

fn source_to_v1alpha1(source: v1beta1::RestoreSource) -> v1alpha1::RestoreSource {
    let v1beta1::RestoreSource {
        storage,
        object_key,
    } = source;
    v1alpha1::RestoreSource {
        s3: unwrap_s3(storage),
        object_key,
    }
}
