//! `PostgreSQLBackup` between v1alpha1 and v1beta1: the spec (`compression` included) is the
//! same in both, and so is the status's `compression`; the status's
//! `storage` is an S3 storage in v1alpha1 and `{s3: ...}` in v1beta1. No field is in only one
//! version, so no annotation is written or read.

use super::storage::{unwrap_s3, wrap_s3};
use crate::{v1alpha1, v1beta1};

impl From<v1alpha1::PostgreSQLBackup> for v1beta1::PostgreSQLBackup {
    fn from(backup: v1alpha1::PostgreSQLBackup) -> Self {
        let v1alpha1::PostgreSQLBackup {
            metadata,
            spec,
            status,
        } = backup;
        let v1alpha1::PostgreSQLBackupSpec {
            cluster,
            method,
            deletion_policy,
            compression,
        } = spec;
        Self {
            metadata,
            spec: v1beta1::PostgreSQLBackupSpec {
                cluster,
                method,
                deletion_policy,
                compression,
            },
            status: status.map(status_to_v1beta1),
        }
    }
}

impl From<v1beta1::PostgreSQLBackup> for v1alpha1::PostgreSQLBackup {
    fn from(backup: v1beta1::PostgreSQLBackup) -> Self {
        let v1beta1::PostgreSQLBackup {
            metadata,
            spec,
            status,
        } = backup;
        let v1beta1::PostgreSQLBackupSpec {
            cluster,
            method,
            deletion_policy,
            compression,
        } = spec;
        Self {
            metadata,
            spec: v1alpha1::PostgreSQLBackupSpec {
                cluster,
                method,
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
        message,
        conditions,
    }
}

#[cfg(test)]
mod tests;
