//! `PostgreSQLRestore` between v1alpha1 and v1beta1: `source.s3` is `source.storage.s3`.
//! Everything else, the status included, is at the same place in both.

use super::plan::Move;

/// The restore's fields at a different place in each version.
pub(crate) const MOVES: &[Move] = &[Move {
    v1alpha1: &["spec", "source", "s3"],
    v1beta1: &["spec", "source", "storage", "s3"],
}];

#[cfg(test)]
mod tests;
