//! The retention decision's rules, one test each.

use chrono::TimeZone;

use super::*;
use crate::retention::reading::{Finished as Reading, WalBase};

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
        wal_root: Some(WAL_ROOT.into()),
    }
}

/// Cluster `a`'s WAL archive.
const WAL_ROOT: &str = "ns/a/wal/a/";

fn reading(cluster_uid: Option<&str>, id: &BackupId, age_days: i64) -> ManifestReading {
    ManifestReading::Finished(Reading {
        at: days_ago(age_days),
        cluster_uid: cluster_uid.map(str::to_owned),
        backup_name: id.name.clone(),
        backup_uid: Some(id.uid.clone()),
        wal_base: None,
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

    /// A physical backup whose WAL starts at `first_wal`.
    fn physical(self, name: &str, age_days: i64, first_wal: &str) -> Self {
        let mut reading = reading(Some("c1"), &id(name), age_days);
        if let ManifestReading::Finished(finished) = &mut reading {
            finished.wal_base = Some(WalBase {
                wal_root: WAL_ROOT.into(),
                first_wal: first_wal.into(),
                system_identifier: Some("7001".into()),
            });
        }
        self.with_manifest(&id(name), reading)
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
fn the_newest_good_physical_backup_stays_though_newer_logical_ones_exist() {
    let bucket = Bucket::new()
        .physical("p30", 30, "0000000100000000000000A0")
        .physical("p20", 20, "0000000100000000000000B0")
        .backup("l10", 10)
        .backup("l1", 1);
    let plan = bucket.plan(&policy(7, &[]));
    assert_eq!(plan.newest_good, Some(id("l1")));
    assert_eq!(plan.newest_good_physical, Some(id("p20")));
    assert_eq!(expired_names(&plan), ["p30", "l10"]);
    assert_eq!(plan.kept, ids(&["p20", "l1"]));

    let plan = bucket.plan(&policy(7, &["p20"]));
    assert_eq!(plan.newest_good_physical, Some(id("p30")));
    assert_eq!(expired_names(&plan), ["p20", "l10"]);
    assert_eq!(plan.kept, ids(&["p30", "l1"]));
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
