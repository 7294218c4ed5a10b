//! The retention decision, as a pure function of what a pass gathered: the listing of the
//! cluster's root sorted by backup ([`Layout`]), each manifest's reading, the open multipart
//! uploads, the policy and the time. No request, no clock: every rule of retention is here and
//! unit-tested.
//!
//! The rules:
//! - only the cluster's root `<prefix>/<cluster-uid>/` is looked at: another cluster's backups
//!   under the same prefix, and backups in the layout from before the uids were in the keys, are
//!   never listed, so never deleted;
//! - a backup's age is its manifest's `finishedAt`; backups that finished more than
//!   `retention_days` days before `now` expire, and all their keys go;
//! - a manifest must record this cluster's uid and the directory's backup name and uid: one that
//!   records another owner (or none) is skipped, never deleted;
//! - the newest backup with a readable manifest that is not known as failed is never deleted,
//!   whatever its age, nor is the newest such physical backup (the base the WAL archive is
//!   kept for);
//! - an expired backup that an unfinished restore reads (its manifest key is in the policy's
//!   `held`) stays, and the plan says which restore holds it;
//! - a directory without a manifest, or with one that cannot be read, is never deleted (it is
//!   reported as skipped), nor is any key outside a backup directory or outside the root;
//! - multipart uploads under the root started more than a day ago are aborted
//!   ([`super::uploads`]);
//! - deletes go in batches of at most [`MAX_KEYS_PER_DELETE`] keys, the expired manifests in
//!   batches of their own before any other key, so that a pass cut short never leaves a manifest
//!   whose data is gone.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeDelta, Utc};

use super::RetentionPolicy;
use super::layout::{BackupDir, BackupId, Layout};
use super::reading::ManifestReading;
use super::uploads::{OpenUpload, stale_uploads};

/// The most keys S3 takes in one DeleteObjects request.
pub const MAX_KEYS_PER_DELETE: usize = 1000;

/// An expired backup and every key it has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpiredBackup {
    pub id: BackupId,
    pub manifest_key: String,
    pub data_keys: Vec<String>,
}

/// What a pass is to do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The newest good backup, kept whatever its age.
    pub newest_good: Option<BackupId>,
    /// The newest good physical backup, kept whatever its age.
    pub newest_good_physical: Option<BackupId>,
    /// Backups to delete, oldest first.
    pub expired: Vec<ExpiredBackup>,
    /// Backups with a readable manifest of this cluster that stay (held ones included).
    pub kept: Vec<BackupId>,
    /// Expired backups kept because an unfinished restore reads them, and which restore.
    pub held: Vec<String>,
    /// Backup directories left alone because they have no usable manifest of this cluster, and
    /// why.
    pub skipped: Vec<String>,
    /// Multipart uploads to abort.
    pub stale_uploads: Vec<OpenUpload>,
}

impl Plan {
    /// DeleteObjects batches of the expired backups' manifests.
    pub fn manifest_batches(&self) -> Vec<Vec<String>> {
        let keys = self.expired.iter().map(|backup| &backup.manifest_key);
        batches(keys)
    }

    /// DeleteObjects batches of the expired backups' other keys, except those of the backups
    /// in `manifest_kept` (whose manifest could not be deleted).
    pub fn data_batches(&self, manifest_kept: &BTreeSet<BackupId>) -> Vec<Vec<String>> {
        let keys = self
            .expired
            .iter()
            .filter(|backup| !manifest_kept.contains(&backup.id))
            .flat_map(|backup| &backup.data_keys);
        batches(keys)
    }
}

fn batches<'a>(keys: impl Iterator<Item = &'a String>) -> Vec<Vec<String>> {
    let keys: Vec<String> = keys.cloned().collect();
    keys.chunks(MAX_KEYS_PER_DELETE)
        .map(<[String]>::to_vec)
        .collect()
}

/// Decides what a pass deletes and aborts (see the module documentation for the rules).
pub fn plan(
    policy: &RetentionPolicy,
    layout: &Layout,
    manifests: &BTreeMap<BackupId, ManifestReading>,
    uploads: &[OpenUpload],
    now: DateTime<Utc>,
) -> Plan {
    let finished = finished_backups(policy, layout, manifests);
    let cutoff = retention_cutoff(now, policy.retention_days);
    let physical: Vec<Finished> = finished.iter().filter(|b| b.physical).copied().collect();
    let mut plan = Plan {
        newest_good: newest_good(&finished, &policy.failed_backups).map(|b| b.id.clone()),
        newest_good_physical: newest_good(&physical, &policy.failed_backups).map(|b| b.id.clone()),
        skipped: skipped_backups(policy, layout, manifests),
        stale_uploads: stale_uploads(&policy.root(), uploads, now),
        ..Plan::default()
    };
    for backup in oldest_first(&finished) {
        let expired = cutoff.is_some_and(|cutoff| backup.at < cutoff);
        let newest = plan.newest_good.as_ref() == Some(backup.id)
            || plan.newest_good_physical.as_ref() == Some(backup.id);
        let holder = policy.held.get(backup.manifest_key);
        match (expired && !newest, holder) {
            (true, None) => plan.expired.push(backup.expired()),
            (true, Some(restore)) => {
                plan.held
                    .push(format!("{}: read by restore {restore}", backup.id));
                plan.kept.push(backup.id.clone());
            }
            (false, _) => plan.kept.push(backup.id.clone()),
        }
    }
    plan
}

/// A backup directory with a readable manifest of this cluster, and when it finished.
#[derive(Clone, Copy)]
struct Finished<'a> {
    id: &'a BackupId,
    manifest_key: &'a str,
    dir: &'a BackupDir,
    at: DateTime<Utc>,
    physical: bool,
}

impl<'a> Finished<'a> {
    /// The order of backups: by finish time, then by name and uid.
    fn order(&self) -> (DateTime<Utc>, &'a BackupId) {
        (self.at, self.id)
    }

    fn expired(&self) -> ExpiredBackup {
        ExpiredBackup {
            id: self.id.clone(),
            manifest_key: self.manifest_key.to_owned(),
            data_keys: self.dir.data_keys.clone(),
        }
    }
}

fn finished_backups<'a>(
    policy: &RetentionPolicy,
    layout: &'a Layout,
    manifests: &BTreeMap<BackupId, ManifestReading>,
) -> Vec<Finished<'a>> {
    layout
        .backups
        .iter()
        .filter_map(|(id, dir)| {
            let manifest_key = dir.manifest_key.as_deref()?;
            match manifests.get(id) {
                Some(ManifestReading::Finished(finished))
                    if finished.foreign(id, &policy.cluster_uid).is_none() =>
                {
                    Some(Finished {
                        id,
                        manifest_key,
                        dir,
                        at: finished.at,
                        physical: finished.wal_base.is_some(),
                    })
                }
                _ => None,
            }
        })
        .collect()
}

/// The latest to finish of the backups not known as failed (by uid); the greater name on a tie.
fn newest_good<'a>(finished: &[Finished<'a>], failed: &BTreeSet<String>) -> Option<Finished<'a>> {
    finished
        .iter()
        .filter(|backup| !failed.contains(&backup.id.uid))
        .max_by_key(|backup| backup.order())
        .copied()
}

fn oldest_first<'a>(finished: &[Finished<'a>]) -> Vec<Finished<'a>> {
    let mut sorted = finished.to_vec();
    sorted.sort_by_key(|backup| backup.order());
    sorted
}

/// Backups that finished before this time are expired; `None` when it is before any
/// representable time (nothing expires).
fn retention_cutoff(now: DateTime<Utc>, retention_days: u32) -> Option<DateTime<Utc>> {
    now.checked_sub_signed(TimeDelta::try_days(i64::from(retention_days))?)
}

/// Backup directories without a usable manifest of this cluster, each with the reason, as
/// short lines.
fn skipped_backups(
    policy: &RetentionPolicy,
    layout: &Layout,
    manifests: &BTreeMap<BackupId, ManifestReading>,
) -> Vec<String> {
    layout
        .backups
        .iter()
        .filter_map(|(id, dir)| {
            let why = match (&dir.manifest_key, manifests.get(id)) {
                (None, _) => "no manifest.json (incomplete backup)".to_owned(),
                (Some(_), Some(ManifestReading::Finished(finished))) => {
                    finished.foreign(id, &policy.cluster_uid)?
                }
                (Some(_), Some(ManifestReading::Unreadable(reason))) => {
                    format!("unreadable manifest ({reason})")
                }
                (Some(_), Some(ManifestReading::Vanished)) => {
                    "manifest.json vanished during the pass".to_owned()
                }
                (Some(_), None) => "manifest.json not read".to_owned(),
            };
            Some(format!("{id}: {why}"))
        })
        .collect()
}

#[cfg(test)]
mod tests;
