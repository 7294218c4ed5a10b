//! The retention decision, as a pure function of what a pass gathered: the listing sorted by
//! backup ([`Layout`]), each manifest's reading, the open multipart uploads, the policy and the
//! time. No request, no clock: every rule of retention is here and unit-tested.
//!
//! The rules:
//! - a backup's age is its manifest's `finishedAt`; backups that finished more than
//!   `retention_days` days before `now` expire, and all their keys go;
//! - the newest backup with a readable manifest that is not known as failed is never deleted,
//!   whatever its age;
//! - a directory without a manifest, or with one that cannot be read, is never deleted (it is
//!   reported as skipped), nor is any key outside a backup directory or outside the prefix;
//! - multipart uploads under the prefix started more than [`STALE_UPLOAD_AGE`] ago are aborted;
//! - deletes go in batches of at most [`MAX_KEYS_PER_DELETE`] keys, the expired manifests in
//!   batches of their own before any other key, so that a pass cut short never leaves a manifest
//!   whose data is gone.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeDelta, Utc};

use super::RetentionPolicy;
use super::layout::{BackupDir, Layout};
use crate::storage::manifest::Manifest;

/// The most keys S3 takes in one DeleteObjects request.
pub const MAX_KEYS_PER_DELETE: usize = 1000;

/// Age from which an unfinished multipart upload counts as left behind (by a killed agent).
pub const STALE_UPLOAD_AGE: TimeDelta = TimeDelta::hours(24);

/// What reading a backup's `manifest.json` gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManifestReading {
    /// A readable manifest, and when the backup finished.
    Finished(DateTime<Utc>),
    /// The manifest does not parse, or its `finishedAt` is not an RFC 3339 time.
    Unreadable(String),
    /// The manifest was listed but was gone when it was read (deleted meanwhile).
    Vanished,
}

impl ManifestReading {
    /// Reads the manifest stored at `key`.
    pub fn from_bytes(key: &str, bytes: &[u8]) -> Self {
        match Manifest::parse(key, bytes) {
            Ok(manifest) => finished_at(&manifest.finished_at),
            Err(error) => Self::Unreadable(error.to_string()),
        }
    }
}

fn finished_at(text: &str) -> ManifestReading {
    match DateTime::parse_from_rfc3339(text) {
        Ok(time) => ManifestReading::Finished(time.with_timezone(&Utc)),
        Err(error) => ManifestReading::Unreadable(format!("finishedAt {text:?}: {error}")),
    }
}

/// A multipart upload that was started and neither completed nor aborted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenUpload {
    pub key: String,
    pub upload_id: String,
    /// When it was started; `None` when the store did not say (such an upload is left alone).
    pub initiated: Option<DateTime<Utc>>,
}

/// An expired backup and every key it has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpiredBackup {
    pub name: String,
    pub manifest_key: String,
    pub data_keys: Vec<String>,
}

/// What a pass is to do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The newest good backup, kept whatever its age.
    pub newest_good: Option<String>,
    /// Backups to delete, oldest first.
    pub expired: Vec<ExpiredBackup>,
    /// Backups with a readable manifest that stay.
    pub kept: Vec<String>,
    /// Backup directories left alone because they have no usable manifest, and why.
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
    /// named in `manifest_kept` (whose manifest could not be deleted).
    pub fn data_batches(&self, manifest_kept: &BTreeSet<String>) -> Vec<Vec<String>> {
        let keys = self
            .expired
            .iter()
            .filter(|backup| !manifest_kept.contains(&backup.name))
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
    manifests: &BTreeMap<String, ManifestReading>,
    uploads: &[OpenUpload],
    now: DateTime<Utc>,
) -> Plan {
    let finished = finished_backups(layout, manifests);
    let newest_good = newest_good(&finished, &policy.failed_backups);
    let cutoff = retention_cutoff(now, policy.retention_days);
    let mut plan = Plan {
        newest_good: newest_good.map(|backup| backup.name.to_owned()),
        skipped: skipped_backups(layout, manifests),
        stale_uploads: stale_uploads(&policy.root(), uploads, now),
        ..Plan::default()
    };
    for backup in oldest_first(&finished) {
        let expired = cutoff.is_some_and(|cutoff| backup.at < cutoff);
        if expired && plan.newest_good.as_deref() != Some(backup.name) {
            plan.expired.push(backup.expired());
        } else {
            plan.kept.push(backup.name.to_owned());
        }
    }
    plan
}

/// A backup directory with a readable manifest, and when it finished.
#[derive(Clone, Copy)]
struct Finished<'a> {
    name: &'a str,
    manifest_key: &'a str,
    dir: &'a BackupDir,
    at: DateTime<Utc>,
}

impl<'a> Finished<'a> {
    /// The order of backups: by finish time, then by name.
    fn order(&self) -> (DateTime<Utc>, &'a str) {
        (self.at, self.name)
    }

    fn expired(&self) -> ExpiredBackup {
        ExpiredBackup {
            name: self.name.to_owned(),
            manifest_key: self.manifest_key.to_owned(),
            data_keys: self.dir.data_keys.clone(),
        }
    }
}

fn finished_backups<'a>(
    layout: &'a Layout,
    manifests: &BTreeMap<String, ManifestReading>,
) -> Vec<Finished<'a>> {
    layout
        .backups
        .iter()
        .filter_map(|(name, dir)| {
            let manifest_key = dir.manifest_key.as_deref()?;
            match manifests.get(name) {
                Some(ManifestReading::Finished(at)) => Some(Finished {
                    name,
                    manifest_key,
                    dir,
                    at: *at,
                }),
                _ => None,
            }
        })
        .collect()
}

/// The latest to finish of the backups not known as failed; the greater name on a tie.
fn newest_good<'a>(finished: &[Finished<'a>], failed: &BTreeSet<String>) -> Option<Finished<'a>> {
    finished
        .iter()
        .filter(|backup| !failed.contains(backup.name))
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

/// Backup directories without a usable manifest, each with the reason, as short lines.
fn skipped_backups(layout: &Layout, manifests: &BTreeMap<String, ManifestReading>) -> Vec<String> {
    layout
        .backups
        .iter()
        .filter_map(
            |(name, dir)| match (&dir.manifest_key, manifests.get(name)) {
                (None, _) => Some(format!("{name}: no manifest.json (incomplete backup)")),
                (Some(_), Some(ManifestReading::Finished(_))) => None,
                (Some(_), Some(ManifestReading::Unreadable(reason))) => {
                    Some(format!("{name}: unreadable manifest ({reason})"))
                }
                (Some(_), Some(ManifestReading::Vanished)) => {
                    Some(format!("{name}: manifest.json vanished during the pass"))
                }
                (Some(_), None) => Some(format!("{name}: manifest.json not read")),
            },
        )
        .collect()
}

fn stale_uploads(root: &str, uploads: &[OpenUpload], now: DateTime<Utc>) -> Vec<OpenUpload> {
    uploads
        .iter()
        .filter(|upload| upload.key.starts_with(root))
        .filter(|upload| {
            upload
                .initiated
                .is_some_and(|initiated| now - initiated > STALE_UPLOAD_AGE)
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::storage::manifest::{
        DATABASE_FORMAT, DatabaseObject, MANIFEST_VERSION, StoredObject,
    };

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2025, 6, 30, 12, 0, 0)
            .single()
            .expect("a time")
    }

    fn days_ago(days: i64) -> DateTime<Utc> {
        now() - TimeDelta::days(days)
    }

    fn policy(retention_days: u32, failed: &[&str]) -> RetentionPolicy {
        RetentionPolicy {
            prefix: "ns/a".into(),
            retention_days,
            failed_backups: failed.iter().map(|name| name.to_string()).collect(),
        }
    }

    /// A listing with backups `(name, has_manifest)`, each with two data objects, plus
    /// `extra` keys; and readings for the backups given an age in `finished`.
    struct Bucket {
        keys: Vec<String>,
        manifests: BTreeMap<String, ManifestReading>,
    }

    impl Bucket {
        fn new() -> Self {
            Self {
                keys: Vec::new(),
                manifests: BTreeMap::new(),
            }
        }

        fn backup(mut self, name: &str, age_days: i64) -> Self {
            self = self.incomplete(name);
            self.keys.push(format!("ns/a/{name}/manifest.json"));
            let reading = ManifestReading::Finished(days_ago(age_days));
            self.manifests.insert(name.into(), reading);
            self
        }

        fn incomplete(mut self, name: &str) -> Self {
            self.keys.push(format!("ns/a/{name}/globals.sql"));
            self.keys.push(format!("ns/a/{name}/databases/app.dump"));
            self
        }

        fn unreadable(mut self, name: &str) -> Self {
            self = self.incomplete(name);
            self.keys.push(format!("ns/a/{name}/manifest.json"));
            let reading = ManifestReading::Unreadable("expected value at line 1".into());
            self.manifests.insert(name.into(), reading);
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
        plan.expired.iter().map(|b| b.name.as_str()).collect()
    }

    #[test]
    fn backups_older_than_the_retention_expire_with_all_their_keys() {
        let bucket = Bucket::new().backup("old", 10).backup("new", 3);
        let plan = bucket.plan(&policy(7, &[]));
        assert_eq!(
            plan.expired,
            [ExpiredBackup {
                name: "old".into(),
                manifest_key: "ns/a/old/manifest.json".into(),
                data_keys: vec![
                    "ns/a/old/globals.sql".into(),
                    "ns/a/old/databases/app.dump".into()
                ],
            }]
        );
        assert_eq!(plan.kept, ["new"]);
        assert_eq!(plan.newest_good.as_deref(), Some("new"));
    }

    #[test]
    fn a_backup_exactly_at_the_retention_limit_stays() {
        let bucket = Bucket::new().backup("limit", 7).backup("over", 8);
        let plan = bucket.plan(&policy(7, &[]));
        assert_eq!(expired_names(&plan), ["over"]);
        assert_eq!(plan.kept, ["limit"]);
    }

    #[test]
    fn the_newest_good_backup_stays_whatever_its_age() {
        let bucket = Bucket::new()
            .backup("b30", 30)
            .backup("b20", 20)
            .backup("b10", 10);
        let plan = bucket.plan(&policy(7, &[]));
        assert_eq!(plan.newest_good.as_deref(), Some("b10"));
        assert_eq!(expired_names(&plan), ["b30", "b20"]);
        assert_eq!(plan.kept, ["b10"]);
    }

    #[test]
    fn a_failed_backup_never_counts_as_the_newest_good_one() {
        let bucket = Bucket::new()
            .backup("b30", 30)
            .backup("b20", 20)
            .backup("b10", 10);
        let plan = bucket.plan(&policy(7, &["b10"]));
        assert_eq!(plan.newest_good.as_deref(), Some("b20"));
        assert_eq!(expired_names(&plan), ["b30", "b10"]);
    }

    #[test]
    fn with_only_failed_backups_nothing_is_kept_as_newest_good() {
        let bucket = Bucket::new().backup("b30", 30).backup("b2", 2);
        let plan = bucket.plan(&policy(7, &["b30", "b2"]));
        assert_eq!(plan.newest_good, None);
        assert_eq!(expired_names(&plan), ["b30"]);
        assert_eq!(plan.kept, ["b2"]);
    }

    #[test]
    fn directories_without_a_usable_manifest_are_skipped_never_deleted() {
        let bucket = Bucket::new()
            .incomplete("killed")
            .unreadable("garbled")
            .backup("b10", 10)
            .backup("b9", 9);
        let plan = bucket.plan(&policy(1, &[]));
        assert_eq!(expired_names(&plan), ["b10"]);
        assert_eq!(plan.kept, ["b9"]);
        assert_eq!(plan.skipped.len(), 2);
        assert!(
            plan.skipped[0].starts_with("garbled: unreadable manifest"),
            "{:?}",
            plan.skipped
        );
        assert_eq!(
            plan.skipped[1],
            "killed: no manifest.json (incomplete backup)"
        );
    }

    #[test]
    fn an_unreadable_manifest_never_counts_as_the_newest_good_one() {
        let bucket = Bucket::new().backup("b10", 10).unreadable("garbled");
        let plan = bucket.plan(&policy(1, &[]));
        assert_eq!(plan.newest_good.as_deref(), Some("b10"));
        assert!(plan.expired.is_empty());
    }

    #[test]
    fn a_manifest_that_vanished_is_skipped() {
        let mut bucket = Bucket::new().backup("gone", 30).backup("b1", 1);
        bucket
            .manifests
            .insert("gone".into(), ManifestReading::Vanished);
        let plan = bucket.plan(&policy(7, &[]));
        assert!(plan.expired.is_empty());
        assert_eq!(
            plan.skipped,
            ["gone: manifest.json vanished during the pass"]
        );
    }

    #[test]
    fn keys_outside_backup_directories_or_the_prefix_are_never_deleted() {
        let bucket = Bucket::new()
            .backup("b30", 30)
            .backup("b1", 1)
            .key("ns/a/notes.txt")
            .key("ns/ab/b30/manifest.json")
            .key("ns/ab/b30/globals.sql")
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
                "ns/a/b30/manifest.json",
                "ns/a/b30/globals.sql",
                "ns/a/b30/databases/app.dump"
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
        let manifest_kept = BTreeSet::from(["b30".to_string()]);
        let data: Vec<String> = plan.data_batches(&manifest_kept).concat();
        assert_eq!(
            data,
            ["ns/a/b20/globals.sql", "ns/a/b20/databases/app.dump"]
        );
    }

    #[test]
    fn a_retention_beyond_the_calendar_expires_nothing() {
        let bucket = Bucket::new().backup("b30", 30).backup("b1", 1);
        let plan = bucket.plan(&policy(u32::MAX, &[]));
        assert!(plan.expired.is_empty());
        assert_eq!(plan.kept, ["b30", "b1"]);
    }

    fn upload(key: &str, hours_ago: Option<i64>) -> OpenUpload {
        OpenUpload {
            key: key.into(),
            upload_id: format!("id-{key}"),
            initiated: hours_ago.map(|hours| now() - TimeDelta::hours(hours)),
        }
    }

    #[test]
    fn uploads_under_the_prefix_older_than_a_day_are_aborted() {
        let uploads = [
            upload("ns/a/b1/databases/app.dump", Some(25)),
            upload("ns/a/b2/databases/app.dump", Some(23)),
            upload("ns/a/b3/databases/app.dump", Some(24)),
            upload("ns/a/b4/databases/app.dump", None),
            upload("ns/ab/b1/databases/app.dump", Some(48)),
        ];
        let plan = Bucket::new().plan_with_uploads(&policy(7, &[]), &uploads);
        assert_eq!(plan.stale_uploads, [uploads[0].clone()]);
    }

    #[test]
    fn a_manifest_is_read_for_its_finish_time() {
        let mut manifest = Manifest {
            manifest_version: MANIFEST_VERSION,
            cluster: "a".into(),
            namespace: "ns".into(),
            backup_name: "b1".into(),
            postgresql_version: "16.4".into(),
            started_at: "2025-06-01T00:00:00Z".into(),
            finished_at: "2025-06-01T00:05:00+02:00".into(),
            format: DATABASE_FORMAT.into(),
            globals: StoredObject {
                key: "ns/a/b1/globals.sql".into(),
                size: 1,
                sha256: "00".repeat(32),
                format: DATABASE_FORMAT.into(),
                compression: None,
            },
            databases: Vec::<DatabaseObject>::new(),
        };
        let json = serde_json::to_vec(&manifest).expect("serialises");
        let expected = Utc.with_ymd_and_hms(2025, 5, 31, 22, 5, 0).single();
        assert_eq!(
            ManifestReading::from_bytes("k", &json),
            ManifestReading::Finished(expected.expect("a time"))
        );

        manifest.finished_at = "yesterday".into();
        let json = serde_json::to_vec(&manifest).expect("serialises");
        let reading = ManifestReading::from_bytes("k", &json);
        assert!(
            matches!(&reading, ManifestReading::Unreadable(reason) if reason.contains("yesterday")),
            "{reading:?}"
        );
        let reading = ManifestReading::from_bytes("ns/a/b1/manifest.json", b"{\"manifestVer");
        assert!(
            matches!(&reading, ManifestReading::Unreadable(reason) if reason.contains("ns/a/b1/manifest.json")),
            "{reading:?}"
        );
    }
}
