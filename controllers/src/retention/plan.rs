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
//!   whatever its age;
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
    let mut plan = Plan {
        newest_good: newest_good(&finished, &policy.failed_backups).map(|b| b.id.clone()),
        skipped: skipped_backups(policy, layout, manifests),
        stale_uploads: stale_uploads(&policy.root(), uploads, now),
        ..Plan::default()
    };
    for backup in oldest_first(&finished) {
        let expired = cutoff.is_some_and(|cutoff| backup.at < cutoff);
        let newest = plan.newest_good.as_ref() == Some(backup.id);
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
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::retention::reading::Finished as Reading;

    const ROOT: &str = "ns/a/c1/";

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2025, 6, 30, 12, 0, 0)
            .single()
            .expect("a time")
    }

    fn days_ago(days: i64) -> DateTime<Utc> {
        now() - TimeDelta::days(days)
    }

    /// Backup `name`, whose PostgreSQLBackup had uid `u-<name>`.
    fn id(name: &str) -> BackupId {
        BackupId::new(name, format!("u-{name}"))
    }

    fn policy(retention_days: u32, failed: &[&str]) -> RetentionPolicy {
        RetentionPolicy {
            prefix: "ns/a".into(),
            cluster_uid: "c1".into(),
            retention_days,
            failed_backups: failed.iter().map(|name| id(name).uid).collect(),
            held: BTreeMap::new(),
        }
    }

    fn reading(cluster_uid: Option<&str>, id: &BackupId, age_days: i64) -> ManifestReading {
        ManifestReading::Finished(Reading {
            at: days_ago(age_days),
            cluster_uid: cluster_uid.map(str::to_owned),
            backup_name: id.name.clone(),
            backup_uid: Some(id.uid.clone()),
        })
    }

    /// A listing of backups under [`ROOT`], each with two data objects, and their manifests'
    /// readings.
    struct Bucket {
        keys: Vec<String>,
        manifests: BTreeMap<BackupId, ManifestReading>,
    }

    impl Bucket {
        fn new() -> Self {
            Self {
                keys: Vec::new(),
                manifests: BTreeMap::new(),
            }
        }

        fn backup(self, name: &str, age_days: i64) -> Self {
            self.with_manifest(&id(name), reading(Some("c1"), &id(name), age_days))
        }

        fn with_manifest(mut self, id: &BackupId, reading: ManifestReading) -> Self {
            self = self.incomplete(id);
            self.keys.push(format!("{ROOT}{id}/manifest.json"));
            self.manifests.insert(id.clone(), reading);
            self
        }

        fn incomplete(mut self, id: &BackupId) -> Self {
            self.keys.push(format!("{ROOT}{id}/globals.sql"));
            self.keys.push(format!("{ROOT}{id}/databases/app.dump"));
            self
        }

        fn key(mut self, key: &str) -> Self {
            self.keys.push(key.into());
            self
        }

        fn plan(&self, policy: &RetentionPolicy) -> Plan {
            self.plan_with_uploads(policy, &[])
        }

        fn plan_with_uploads(&self, policy: &RetentionPolicy, uploads: &[OpenUpload]) -> Plan {
            let layout = Layout::from_keys(&policy.root(), self.keys.iter().cloned());
            plan(policy, &layout, &self.manifests, uploads, now())
        }
    }

    fn expired_names(plan: &Plan) -> Vec<&str> {
        plan.expired.iter().map(|b| b.id.name.as_str()).collect()
    }

    fn ids(names: &[&str]) -> Vec<BackupId> {
        names.iter().map(|name| id(name)).collect()
    }

    #[test]
    fn backups_older_than_the_retention_expire_with_all_their_keys() {
        let bucket = Bucket::new().backup("old", 10).backup("new", 3);
        let plan = bucket.plan(&policy(7, &[]));
        assert_eq!(
            plan.expired,
            [ExpiredBackup {
                id: id("old"),
                manifest_key: "ns/a/c1/old/u-old/manifest.json".into(),
                data_keys: vec![
                    "ns/a/c1/old/u-old/globals.sql".into(),
                    "ns/a/c1/old/u-old/databases/app.dump".into()
                ],
            }]
        );
        assert_eq!(plan.kept, ids(&["new"]));
        assert_eq!(plan.newest_good, Some(id("new")));
    }

    #[test]
    fn a_backup_exactly_at_the_retention_limit_stays() {
        let bucket = Bucket::new().backup("limit", 7).backup("over", 8);
        let plan = bucket.plan(&policy(7, &[]));
        assert_eq!(expired_names(&plan), ["over"]);
        assert_eq!(plan.kept, ids(&["limit"]));
    }

    #[test]
    fn the_newest_good_backup_stays_whatever_its_age() {
        let bucket = Bucket::new()
            .backup("b30", 30)
            .backup("b20", 20)
            .backup("b10", 10);
        let plan = bucket.plan(&policy(7, &[]));
        assert_eq!(plan.newest_good, Some(id("b10")));
        assert_eq!(expired_names(&plan), ["b30", "b20"]);
        assert_eq!(plan.kept, ids(&["b10"]));
    }

    #[test]
    fn a_failed_backup_never_counts_as_the_newest_good_one() {
        let bucket = Bucket::new()
            .backup("b30", 30)
            .backup("b20", 20)
            .backup("b10", 10);
        let plan = bucket.plan(&policy(7, &["b10"]));
        assert_eq!(plan.newest_good, Some(id("b20")));
        assert_eq!(expired_names(&plan), ["b30", "b10"]);
    }

    #[test]
    fn with_only_failed_backups_nothing_is_kept_as_newest_good() {
        let bucket = Bucket::new().backup("b30", 30).backup("b2", 2);
        let plan = bucket.plan(&policy(7, &["b30", "b2"]));
        assert_eq!(plan.newest_good, None);
        assert_eq!(expired_names(&plan), ["b30"]);
        assert_eq!(plan.kept, ids(&["b2"]));
    }

    #[test]
    fn a_name_used_again_is_another_backup_and_failing_is_by_uid() {
        let first = BackupId::new("nightly", "u1");
        let again = BackupId::new("nightly", "u2");
        let bucket = Bucket::new()
            .with_manifest(&first, reading(Some("c1"), &first, 30))
            .with_manifest(&again, reading(Some("c1"), &again, 20));
        let mut policy = policy(7, &[]);
        policy.failed_backups = BTreeSet::from(["u2".to_owned()]);
        let plan = bucket.plan(&policy);
        assert_eq!(plan.newest_good, Some(first.clone()));
        assert_eq!(plan.expired.len(), 1);
        assert_eq!(plan.expired[0].id, again);
        assert!(
            plan.expired[0]
                .manifest_key
                .starts_with("ns/a/c1/nightly/u2/")
        );
        assert!(
            plan.expired[0]
                .data_keys
                .iter()
                .all(|key| key.starts_with("ns/a/c1/nightly/u2/"))
        );
    }

    #[test]
    fn a_manifest_that_records_another_owner_is_skipped_never_deleted() {
        let foreign = id("foreign");
        let legacy = id("legacy");
        let moved = id("moved");
        let mut moved_reading = reading(Some("c1"), &moved, 30);
        if let ManifestReading::Finished(finished) = &mut moved_reading {
            finished.backup_uid = Some("u-else".into());
        }
        let bucket = Bucket::new()
            .with_manifest(&foreign, reading(Some("c2"), &foreign, 30))
            .with_manifest(&legacy, reading(None, &legacy, 30))
            .with_manifest(&moved, moved_reading)
            .backup("b1", 1);
        let plan = bucket.plan(&policy(7, &[]));
        assert!(plan.expired.is_empty(), "{:?}", plan.expired);
        assert_eq!(plan.newest_good, Some(id("b1")));
        assert_eq!(
            plan.skipped,
            [
                "foreign/u-foreign: its manifest records cluster uid c2, not c1",
                "legacy/u-legacy: its manifest records cluster uid none, not c1",
                "moved/u-moved: its manifest records backup moved/u-else",
            ]
        );
    }

    #[test]
    fn an_expired_backup_that_an_unfinished_restore_reads_stays() {
        let bucket = Bucket::new()
            .backup("b30", 30)
            .backup("b20", 20)
            .backup("b1", 1);
        let mut policy = policy(7, &[]);
        policy
            .held
            .insert("ns/a/c1/b30/u-b30/manifest.json".into(), "db/undo".into());
        let plan = bucket.plan(&policy);
        assert_eq!(expired_names(&plan), ["b20"]);
        assert_eq!(plan.kept, ids(&["b30", "b1"]));
        assert_eq!(plan.held, ["b30/u-b30: read by restore db/undo"]);
        // Once the restore ended, the next pass deletes it.
        policy.held.clear();
        assert_eq!(expired_names(&bucket.plan(&policy)), ["b30", "b20"]);
    }

    #[test]
    fn directories_without_a_usable_manifest_are_skipped_never_deleted() {
        let garbled = id("garbled");
        let bucket = Bucket::new()
            .incomplete(&id("killed"))
            .with_manifest(
                &garbled,
                ManifestReading::Unreadable("expected value at line 1".into()),
            )
            .backup("b10", 10)
            .backup("b9", 9);
        let plan = bucket.plan(&policy(1, &[]));
        assert_eq!(expired_names(&plan), ["b10"]);
        assert_eq!(plan.kept, ids(&["b9"]));
        assert_eq!(plan.skipped.len(), 2);
        assert!(
            plan.skipped[0].starts_with("garbled/u-garbled: unreadable manifest"),
            "{:?}",
            plan.skipped
        );
        assert_eq!(
            plan.skipped[1],
            "killed/u-killed: no manifest.json (incomplete backup)"
        );
    }

    #[test]
    fn an_unreadable_manifest_never_counts_as_the_newest_good_one() {
        let garbled = id("garbled");
        let bucket = Bucket::new()
            .backup("b10", 10)
            .with_manifest(&garbled, ManifestReading::Unreadable("no".into()));
        let plan = bucket.plan(&policy(1, &[]));
        assert_eq!(plan.newest_good, Some(id("b10")));
        assert!(plan.expired.is_empty());
    }

    #[test]
    fn a_manifest_that_vanished_is_skipped() {
        let mut bucket = Bucket::new().backup("gone", 30).backup("b1", 1);
        bucket
            .manifests
            .insert(id("gone"), ManifestReading::Vanished);
        let plan = bucket.plan(&policy(7, &[]));
        assert!(plan.expired.is_empty());
        assert_eq!(
            plan.skipped,
            ["gone/u-gone: manifest.json vanished during the pass"]
        );
    }

    #[test]
    fn keys_outside_backup_directories_or_the_clusters_root_are_never_deleted() {
        let bucket = Bucket::new()
            .backup("b30", 30)
            .backup("b1", 1)
            .key("ns/a/c1/notes.txt")
            // Another cluster on the same prefix, a legacy backup, another prefix.
            .key("ns/a/c2/b30/u-b30/manifest.json")
            .key("ns/a/c2/b30/u-b30/globals.sql")
            .key("ns/a/b30/manifest.json")
            .key("ns/a/b30/globals.sql")
            .key("elsewhere/b30/globals.sql");
        let plan = bucket.plan(&policy(7, &[]));
        let doomed: Vec<String> = plan
            .manifest_batches()
            .into_iter()
            .chain(plan.data_batches(&BTreeSet::new()))
            .flatten()
            .collect();
        assert_eq!(
            doomed,
            [
                "ns/a/c1/b30/u-b30/manifest.json",
                "ns/a/c1/b30/u-b30/globals.sql",
                "ns/a/c1/b30/u-b30/databases/app.dump"
            ]
        );
    }

    #[test]
    fn manifests_go_in_batches_of_their_own_before_any_other_key() {
        let mut bucket = Bucket::new();
        for day in 10..2010 {
            bucket = bucket.backup(&format!("b{day}"), day);
        }
        bucket = bucket.backup("recent", 1);
        let plan = bucket.plan(&policy(7, &[]));
        let manifests = plan.manifest_batches();
        assert_eq!(
            manifests.iter().map(Vec::len).collect::<Vec<_>>(),
            [1000, 1000]
        );
        assert!(
            manifests
                .iter()
                .flatten()
                .all(|key| key.ends_with("/manifest.json"))
        );
        let data = plan.data_batches(&BTreeSet::new());
        assert_eq!(
            data.iter().map(Vec::len).collect::<Vec<_>>(),
            [1000, 1000, 1000, 1000]
        );
        assert!(
            data.iter()
                .flatten()
                .all(|key| !key.ends_with("/manifest.json"))
        );
    }

    #[test]
    fn the_data_of_a_backup_whose_manifest_stayed_is_not_deleted() {
        let bucket = Bucket::new()
            .backup("b30", 30)
            .backup("b20", 20)
            .backup("b1", 1);
        let plan = bucket.plan(&policy(7, &[]));
        let manifest_kept = BTreeSet::from([id("b30")]);
        let data: Vec<String> = plan.data_batches(&manifest_kept).concat();
        assert_eq!(
            data,
            [
                "ns/a/c1/b20/u-b20/globals.sql",
                "ns/a/c1/b20/u-b20/databases/app.dump"
            ]
        );
    }

    #[test]
    fn a_retention_beyond_the_calendar_expires_nothing() {
        let bucket = Bucket::new().backup("b30", 30).backup("b1", 1);
        let plan = bucket.plan(&policy(u32::MAX, &[]));
        assert!(plan.expired.is_empty());
        assert_eq!(plan.kept, ids(&["b30", "b1"]));
    }
}
