//! Retention: pruning a cluster's old backups from S3-compatible storage.
//!
//! A pass ([`prune`]) has three steps:
//!
//! 1. **Gather** ([`gather`]): list every key under the cluster's root
//!    `<prefix>/<cluster-uid>/`, read every backup's `manifest.json`, list the open multipart
//!    uploads under the root. Any failure here (transport, permission, a bucket that does not
//!    exist) ends the pass before anything is deleted.
//! 2. **Decide** ([`plan()`], pure): which backups expired, which one is the newest good backup
//!    that stays whatever its age, which expired ones unfinished restores hold, which
//!    directories are skipped, which uploads are stale. See [`plan`](mod@plan) for the rules.
//!    When physical backups are kept, it also reads the WAL archive's owner record and lists
//!    the archive, and decides which WAL no kept backup needs ([`wal`]).
//! 3. **Execute** ([`execute`]): DeleteObjects in batches of at most 1000 keys, the expired
//!    manifests first, then the rest of those backups, then (only when all of those went) the
//!    WAL no kept backup needs; then AbortMultipartUpload for each stale upload.
//!
//! The layout it reads is the backup agent's ([`crate::storage::keys`]):
//! `<prefix>/<cluster-uid>/<backup-name>/<backup-uid>/` holds `globals.sql`, `databases/<db>.dump`
//! and `manifest.json`, written last. Nothing outside the cluster's root is ever listed or
//! touched: not another cluster's backups under the same prefix, nor backups in the layout from
//! before the uids were in the keys (`<prefix>/<backup-name>/`), whose owner cannot be proven.

mod execute;
mod gather;

pub(crate) use gather::list_objects;
pub mod layout;
pub mod plan;
pub mod reading;
pub mod uploads;
pub mod wal;

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};

pub use layout::{BackupDir, BackupId, Layout};
pub use plan::{ExpiredBackup, MAX_KEYS_PER_DELETE, Plan, plan};
pub use reading::ManifestReading;
pub use uploads::{OpenUpload, STALE_UPLOAD_AGE};
pub use wal::WalPlan;

use crate::storage::guarded::Scope;
use crate::storage::keys::{check_segment, cluster_root};
use crate::storage::wal::archive_root;
use crate::storage::{S3Bucket, StorageError};

/// What a pass keeps and deletes, for one cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// The cluster's storage prefix, without leading or trailing '/'.
    pub prefix: String,
    /// The cluster's uid: only keys under its root `<prefix>/<cluster-uid>/` are ever touched,
    /// and only backups whose manifest records this uid are deleted.
    pub cluster_uid: String,
    /// Backups that finished more than this many days before the pass are deleted.
    pub retention_days: u32,
    /// Uids of the PostgreSQLBackups that the backup controller knows as Failed: their backups
    /// never count as the newest good backup.
    pub failed_backups: BTreeSet<String>,
    /// Manifest keys that unfinished restores read, each with the restore (`namespace/name`):
    /// those backups stay until the restore ends, expired or not.
    pub held: BTreeMap<String, String>,
    /// The cluster's WAL archive root ([`archive_root`]), pruned to what the kept physical
    /// backups need; `None` leaves every archive alone.
    pub wal_root: Option<String>,
}

impl RetentionPolicy {
    /// `<prefix>/<cluster-uid>/`: every key a pass may touch starts with it.
    pub fn root(&self) -> String {
        cluster_root(&self.prefix, &self.cluster_uid)
    }

    /// Refuses a policy that would reach beyond one cluster's keys: an empty prefix (the whole
    /// bucket's legacy backups would be next to the root), one with a leading or trailing '/',
    /// or a cluster uid that is not one key segment.
    pub fn check(&self) -> Result<(), StorageError> {
        let prefix = &self.prefix;
        if prefix.is_empty() || prefix.starts_with('/') || prefix.ends_with('/') {
            return Err(StorageError::Settings(format!(
                "retention prefix {prefix:?} must be non-empty, without leading or trailing '/'"
            )));
        }
        check_segment("cluster uid", &self.cluster_uid)?;
        match &self.wal_root {
            Some(root) if !is_archive_root_of(prefix, root) => Err(StorageError::Settings(
                format!("WAL root {root:?} is not an archive root under prefix {prefix:?}"),
            )),
            _ => Ok(()),
        }
    }
}

/// Whether `root` is `<prefix>/wal/<cluster>/` for one cluster name.
fn is_archive_root_of(prefix: &str, root: &str) -> bool {
    root.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix("/wal/"))
        .and_then(|rest| rest.strip_suffix('/'))
        .is_some_and(|cluster| {
            check_segment("cluster", cluster).is_ok() && archive_root(prefix, cluster) == root
        })
}

/// What a pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// The backup kept whatever its age: the newest with a readable manifest that is not known
    /// as failed.
    pub newest_good: Option<BackupId>,
    /// The physical backup kept whatever its age, on the same terms.
    pub newest_good_physical: Option<BackupId>,
    /// Backups whose objects were all deleted, oldest first.
    pub deleted_backups: Vec<BackupId>,
    pub deleted_objects: u64,
    /// Stale multipart uploads aborted.
    pub aborted_uploads: u64,
    /// Backups with a readable manifest that stay (held ones included).
    pub kept_backups: usize,
    /// WAL files deleted from the archive.
    pub deleted_wal: u64,
    /// The first WAL segment the archive is kept from, when it was pruned.
    pub wal_kept_from: Option<String>,
    /// Why the WAL archive was left alone, when it was.
    pub wal_left_alone: Option<String>,
    /// Expired backups kept for unfinished restores ("<name>/<uid>: read by restore <ns>/<r>").
    pub held: Vec<String>,
    /// Backup directories left alone and why ("<name>/<uid>: no manifest.json (incomplete
    /// backup)").
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
    let wal = gather::plan_wal_pruning(bucket, policy, &plan, &manifests, &mut requests).await?;

    let scope = Scope::cluster_root(&policy.prefix, &policy.cluster_uid);
    let deletion = execute::delete_expired(bucket, &scope, &plan, &mut requests).await;
    let deleted_wal = match (&deletion, &policy.wal_root) {
        (Ok(_), Some(wal_root)) => {
            execute::delete_wal(bucket, &Scope::wal_archive(wal_root), &wal, &mut requests).await
        }
        _ => Ok(0),
    };
    let aborted = execute::abort_uploads(bucket, &plan.stale_uploads, &mut requests).await;
    let deletion = deletion?;
    let report = PruneReport {
        newest_good: plan.newest_good,
        newest_good_physical: plan.newest_good_physical,
        deleted_backups: deletion.deleted_backups,
        deleted_objects: deletion.deleted_objects,
        aborted_uploads: aborted?,
        kept_backups: plan.kept.len(),
        deleted_wal: deleted_wal?,
        wal_kept_from: wal.kept_from,
        wal_left_alone: wal.left_alone,
        held: plan.held,
        skipped: plan.skipped,
        requests: requests.0,
    };
    tracing::info!(
        prefix = %policy.prefix,
        cluster_uid = %policy.cluster_uid,
        deleted_backups = report.deleted_backups.len(),
        deleted_objects = report.deleted_objects,
        aborted_uploads = report.aborted_uploads,
        kept_backups = report.kept_backups,
        deleted_wal = report.deleted_wal,
        held = report.held.len(),
        skipped = report.skipped.len(),
        requests = report.requests,
        "retention pass done"
    );
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(prefix: &str, cluster_uid: &str) -> RetentionPolicy {
        RetentionPolicy {
            prefix: prefix.into(),
            cluster_uid: cluster_uid.into(),
            retention_days: 7,
            failed_backups: BTreeSet::new(),
            held: BTreeMap::new(),
            wal_root: Some(archive_root(prefix, "a")),
        }
    }

    #[test]
    fn a_policy_must_name_one_clusters_keys() {
        assert!(policy("ns/a", "c1").check().is_ok());
        assert_eq!(policy("ns/a", "c1").root(), "ns/a/c1/");
        for bad in ["", "/ns/a", "ns/a/", "/"] {
            let error = policy(bad, "c1").check().expect_err(bad).to_string();
            assert!(
                error.starts_with("invalid settings: retention prefix"),
                "{error}"
            );
        }
        for bad in [
            "ns/b/wal/a/",
            "ns/a/wal/",
            "ns/a/wal/a/b/",
            "ns/a/wal/../",
            "ns/a/a/",
        ] {
            let mut reaching = policy("ns/a", "c1");
            reaching.wal_root = Some(bad.into());
            let error = reaching.check().expect_err(bad).to_string();
            assert!(error.contains("is not an archive root"), "{error}");
        }
        for bad in ["", "..", "c/1"] {
            let error = policy("ns/a", bad).check().expect_err(bad).to_string();
            assert!(
                error.starts_with("invalid settings: cluster uid"),
                "{error}"
            );
        }
    }
}
