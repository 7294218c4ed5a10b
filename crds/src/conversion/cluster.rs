//! `PostgreSQLCluster` between v1alpha1 and v1beta1.
//!
//! Renamed or moved: `version` is `postgresVersion`; `storage` is `storage.size`;
//! `backup.schedule`, `backup.timeZone` and `backup.suspend` are under `backup.schedule`
//! (`cron`, `timeZone`, `suspend`); `backup.retentionDays` is `backup.retention.days`;
//! `backup.s3` is `backup.storage.s3`; `bootstrap.source.s3` is `bootstrap.source.storage.s3`, and
//! `bootstrap.recovery.source.s3` is `bootstrap.recovery.source.storage.s3`.
//! Everything else (`backup.compression`, `highAvailability`, the status...) is at the same
//! place in both. Only in v1beta1: `storage.storageClassName`, carried on v1alpha1 in the
//! [`V1BETA1_FIELDS_ANNOTATION`](super::V1BETA1_FIELDS_ANNOTATION) with anything else in the objects v1alpha1 lacks.

use super::plan::Move;

/// The cluster's fields at a different place in each version.
pub(crate) const MOVES: &[Move] = &[
    Move {
        v1alpha1: &["spec", "version"],
        v1beta1: &["spec", "postgresVersion"],
    },
    Move {
        v1alpha1: &["spec", "storage"],
        v1beta1: &["spec", "storage", "size"],
    },
    Move {
        v1alpha1: &["spec", "backup", "schedule"],
        v1beta1: &["spec", "backup", "schedule", "cron"],
    },
    Move {
        v1alpha1: &["spec", "backup", "timeZone"],
        v1beta1: &["spec", "backup", "schedule", "timeZone"],
    },
    Move {
        v1alpha1: &["spec", "backup", "suspend"],
        v1beta1: &["spec", "backup", "schedule", "suspend"],
    },
    Move {
        v1alpha1: &["spec", "backup", "retentionDays"],
        v1beta1: &["spec", "backup", "retention", "days"],
    },
    Move {
        v1alpha1: &["spec", "backup", "s3"],
        v1beta1: &["spec", "backup", "storage", "s3"],
    },
    Move {
        v1alpha1: &["spec", "bootstrap", "source", "s3"],
        v1beta1: &["spec", "bootstrap", "source", "storage", "s3"],
    },
    Move {
        v1alpha1: &["spec", "bootstrap", "recovery", "source", "s3"],
        v1beta1: &["spec", "bootstrap", "recovery", "source", "storage", "s3"],
    },
];

#[cfg(test)]
mod tests;
