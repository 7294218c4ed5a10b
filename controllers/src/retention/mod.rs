//! Retention: pruning a cluster's old backups from S3-compatible storage.
//!
//! A pass ([`prune`]) has three steps:
//!
//! 1. **Gather** ([`gather`]): list every key under `<prefix>/`, read every backup's
//!    `manifest.json`, list the open multipart uploads under `<prefix>/`. Any failure here
//!    (transport, permission, a bucket that does not exist) ends the pass before anything is
//!    deleted.
//! 2. **Decide** ([`plan()`], pure): which backups expired, which one is the newest good backup
//!    that stays whatever its age, which directories are skipped, which uploads are stale. See
//!    [`plan`](mod@plan) for the rules.
//! 3. **Execute** ([`execute`]): DeleteObjects in batches of at most 1000 keys, the expired
//!    manifests first, then the rest of those backups; then AbortMultipartUpload for each stale
//!    upload.
//!
//! The layout it reads is the backup agent's: `<prefix>/<backup-name>/globals.sql`,
//! `<prefix>/<backup-name>/databases/<db>.dump`, and `<prefix>/<backup-name>/manifest.json`,
//! written last. Nothing outside `<prefix>/` is ever listed or touched.

mod execute;
mod gather;
pub mod layout;
pub mod plan;

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};

pub use layout::{BackupDir, Layout};
pub use plan::{
    ExpiredBackup, MAX_KEYS_PER_DELETE, ManifestReading, OpenUpload, Plan, STALE_UPLOAD_AGE, plan,
};

use crate::storage::{S3Bucket, StorageError};

/// What a pass keeps and deletes, for one cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// The cluster's key prefix, without leading or trailing '/'. Only keys under "<prefix>/"
    /// are ever touched.
    pub prefix: String,
    /// Backups that finished more than this many days before the pass are deleted.
    pub retention_days: u32,
    /// Backup names (key segments) that the backup controller knows as Failed: they never count
    /// as the newest good backup.
    pub failed_backups: BTreeSet<String>,
}

impl RetentionPolicy {
    /// `<prefix>/`: every key a pass may touch starts with it.
    pub fn root(&self) -> String {
        format!("{}/", self.prefix)
    }

    /// Refuses a prefix that would reach beyond one cluster's keys: empty (the whole bucket) or
    /// with a leading or trailing '/'.
    pub fn check(&self) -> Result<(), StorageError> {
        let prefix = &self.prefix;
        if prefix.is_empty() || prefix.starts_with('/') || prefix.ends_with('/') {
            return Err(StorageError::Settings(format!(
                "retention prefix {prefix:?} must be non-empty, without leading or trailing '/'"
            )));
        }
        Ok(())
    }
}

/// What a pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// The backup kept whatever its age: the newest with a readable manifest that is not known
    /// as failed.
    pub newest_good: Option<String>,
    /// Backups whose objects were all deleted, oldest first.
    pub deleted_backups: Vec<String>,
    pub deleted_objects: u64,
    /// Stale multipart uploads aborted.
    pub aborted_uploads: u64,
    /// Backups with a readable manifest that stay.
    pub kept_backups: usize,
    /// Backup directories left alone and why ("<name>: no manifest.json (incomplete backup)").
    pub skipped: Vec<String>,
    /// S3 requests this pass made: list pages, manifest GETs, DeleteObjects batches, multipart
    /// listing pages and aborts (the SDK's retries of one request not counted again).
    pub requests: u64,
}

/// Requests made so far in a pass.
#[derive(Debug, Default)]
pub(crate) struct RequestCount(u64);

impl RequestCount {
    fn add(&mut self, requests: u64) {
        self.0 += requests;
    }
}

/// One retention pass over `policy.prefix` in `bucket`, as of `now`.
///
/// Fails before deleting anything when the listing or a manifest read fails. When deletes
/// fail, the error names the keys left; stale uploads are still aborted.
pub async fn prune(
    bucket: &S3Bucket,
    policy: &RetentionPolicy,
    now: DateTime<Utc>,
) -> Result<PruneReport, StorageError> {
    policy.check()?;
    let root = policy.root();
    let mut requests = RequestCount::default();
    let keys = gather::list_keys(bucket, &root, &mut requests).await?;
    let layout = Layout::from_keys(&root, keys);
    let manifests = gather::read_manifests(bucket, &layout, &mut requests).await?;
    let uploads = gather::list_open_uploads(bucket, &root, &mut requests).await?;
    let plan = plan(policy, &layout, &manifests, &uploads, now);

    let deletion = execute::delete_expired(bucket, &plan, &mut requests).await;
    let aborted = execute::abort_uploads(bucket, &plan.stale_uploads, &mut requests).await;
    let deletion = deletion?;
    let report = PruneReport {
        newest_good: plan.newest_good,
        deleted_backups: deletion.deleted_backups,
        deleted_objects: deletion.deleted_objects,
        aborted_uploads: aborted?,
        kept_backups: plan.kept.len(),
        skipped: plan.skipped,
        requests: requests.0,
    };
    tracing::info!(
        prefix = %policy.prefix,
        deleted_backups = report.deleted_backups.len(),
        deleted_objects = report.deleted_objects,
        aborted_uploads = report.aborted_uploads,
        kept_backups = report.kept_backups,
        skipped = report.skipped.len(),
        requests = report.requests,
        "retention pass done"
    );
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(prefix: &str) -> RetentionPolicy {
        RetentionPolicy {
            prefix: prefix.into(),
            retention_days: 7,
            failed_backups: BTreeSet::new(),
        }
    }

    #[test]
    fn a_prefix_must_name_one_clusters_keys() {
        assert!(policy("ns/a").check().is_ok());
        assert_eq!(policy("ns/a").root(), "ns/a/");
        for bad in ["", "/ns/a", "ns/a/", "/"] {
            let error = policy(bad).check().expect_err(bad).to_string();
            assert!(
                error.starts_with("invalid settings: retention prefix"),
                "{error}"
            );
        }
    }
}
