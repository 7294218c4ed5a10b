//! `PostgreSQLCluster` between v1alpha1 and v1beta1.
//!
//! Renamed or moved: `version` is `postgresVersion`; `storage` is `storage.size`;
//! `backup.schedule`, `backup.timeZone` and `backup.suspend` are under `backup.schedule`
//! (`cron`, `timeZone`, `suspend`); `backup.retentionDays` is `backup.retention.days`;
//! `backup.s3` is `backup.storage.s3`; `bootstrap.source.s3` is `bootstrap.source.storage.s3`.
//! `backup.compression` and `highAvailability` are the same in both.
//! Only in v1beta1: `storage.storageClassName`, carried on v1alpha1 in the
//! [`V1BETA1_FIELDS_ANNOTATION`]. The status is the same in both.

use serde_json::{Value, json};

use super::annotation::{CarriedFields, V1BETA1_FIELDS_ANNOTATION, carry, take_carried};
use super::storage::{source_to_v1alpha1, source_to_v1beta1, unwrap_s3, wrap_s3};
use crate::{v1alpha1, v1beta1};

impl From<v1alpha1::PostgreSQLCluster> for v1beta1::PostgreSQLCluster {
    fn from(cluster: v1alpha1::PostgreSQLCluster) -> Self {
        let v1alpha1::PostgreSQLCluster {
            mut metadata,
            spec,
            status,
        } = cluster;
        let carried = take_carried::<OnlyInV1beta1>(&mut metadata, V1BETA1_FIELDS_ANNOTATION);
        let mut spec = spec_to_v1beta1(spec);
        if let Some(carried) = carried {
            carried.restore(&mut spec);
        }
        Self {
            metadata,
            spec,
            status,
        }
    }
}

impl From<v1beta1::PostgreSQLCluster> for v1alpha1::PostgreSQLCluster {
    fn from(cluster: v1beta1::PostgreSQLCluster) -> Self {
        let v1beta1::PostgreSQLCluster {
            mut metadata,
            spec,
            status,
        } = cluster;
        let carried = OnlyInV1beta1::of(&spec);
        carry(&mut metadata, V1BETA1_FIELDS_ANNOTATION, carried);
        Self {
            metadata,
            spec: spec_to_v1alpha1(spec),
            status,
        }
    }
}

/// The `spec.storage.storageClassName` of a cluster read in v1alpha1: the value written through
/// v1beta1 and carried in the [`V1BETA1_FIELDS_ANNOTATION`], if any. The controllers read
/// v1alpha1, and honour it through this.
pub fn storage_class_name(cluster: &v1alpha1::PostgreSQLCluster) -> Option<String> {
    let mut metadata = cluster.metadata.clone();
    let carried = take_carried::<OnlyInV1beta1>(&mut metadata, V1BETA1_FIELDS_ANNOTATION)?;
    Some(carried.storage_class_name)
}

/// The fields of a v1beta1 cluster that v1alpha1 has no place for.
#[derive(Debug, PartialEq)]
struct OnlyInV1beta1 {
    storage_class_name: String,
}

impl OnlyInV1beta1 {
    /// The v1beta1-only fields that `spec` sets, if any.
    fn of(spec: &v1beta1::PostgreSQLClusterSpec) -> Option<Self> {
        let storage_class_name = spec.storage.storage_class_name.clone()?;
        Some(Self { storage_class_name })
    }

    fn restore(self, spec: &mut v1beta1::PostgreSQLClusterSpec) {
        spec.storage.storage_class_name = Some(self.storage_class_name);
    }
}

impl CarriedFields for OnlyInV1beta1 {
    fn to_json(&self) -> Value {
        json!({ "spec": { "storage": { "storageClassName": self.storage_class_name } } })
    }

    fn from_json(json: &Value) -> Option<Self> {
        let name = json.pointer("/spec/storage/storageClassName")?.as_str()?;
        Some(Self {
            storage_class_name: name.to_owned(),
        })
    }
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
    } = backup;
    v1alpha1::BackupConfig {
        schedule: cron,
        time_zone,
        retention_days: days,
        s3: storage.map(unwrap_s3),
        suspend,
        compression,
    }
}

fn bootstrap_to_v1beta1(bootstrap: v1alpha1::Bootstrap) -> v1beta1::Bootstrap {
    let v1alpha1::Bootstrap { backup, source } = bootstrap;
    v1beta1::Bootstrap {
        backup,
        source: source.map(source_to_v1beta1),
    }
}

fn bootstrap_to_v1alpha1(bootstrap: v1beta1::Bootstrap) -> v1alpha1::Bootstrap {
    let v1beta1::Bootstrap { backup, source } = bootstrap;
    v1alpha1::Bootstrap {
        backup,
        source: source.map(source_to_v1alpha1),
    }
}

#[cfg(test)]
mod tests;
