//! `PostgreSQLBackup` between v1alpha1 and v1beta1: the status's `storage` is an S3 storage in
//! v1alpha1 and `{s3: ...}` in v1beta1. Everything else, the spec included, is at the same place
//! in both.

use super::plan::Move;

/// The backup's fields at a different place in each version.
pub(crate) const MOVES: &[Move] = &[Move {
    v1alpha1: &["status", "storage"],
    v1beta1: &["status", "storage", "s3"],
}];

#[cfg(test)]
mod tests;
