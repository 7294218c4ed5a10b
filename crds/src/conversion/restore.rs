//! `PostgreSQLRestore` between v1alpha1 and v1beta1: `source.s3` is `source.storage.s3`;
//! everything else, the status included, is the same in both. No field is in only one version,
//! so no annotation is written or read.

use super::storage::{source_to_v1alpha1, source_to_v1beta1};
use crate::{v1alpha1, v1beta1};

impl From<v1alpha1::PostgreSQLRestore> for v1beta1::PostgreSQLRestore {
    fn from(restore: v1alpha1::PostgreSQLRestore) -> Self {
        let v1alpha1::PostgreSQLRestore {
            metadata,
            spec,
            status,
        } = restore;
        let v1alpha1::PostgreSQLRestoreSpec {
            backup,
            source,
            cluster,
            databases,
            drop_existing,
        } = spec;
        Self {
            metadata,
            spec: v1beta1::PostgreSQLRestoreSpec {
                backup,
                source: source.map(source_to_v1beta1),
                cluster,
                databases,
                drop_existing,
            },
            status,
        }
    }
}

impl From<v1beta1::PostgreSQLRestore> for v1alpha1::PostgreSQLRestore {
    fn from(restore: v1beta1::PostgreSQLRestore) -> Self {
        let v1beta1::PostgreSQLRestore {
            metadata,
            spec,
            status,
        } = restore;
        let v1beta1::PostgreSQLRestoreSpec {
            backup,
            source,
            cluster,
            databases,
            drop_existing,
        } = spec;
        Self {
            metadata,
            spec: v1alpha1::PostgreSQLRestoreSpec {
                backup,
                source: source.map(source_to_v1alpha1),
                cluster,
                databases,
                drop_existing,
            },
            status,
        }
    }
}

#[cfg(test)]
mod tests;
