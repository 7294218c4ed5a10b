//! Retention of physical backups and of the WAL archive, against the test bed's Garage: each
//! test fills a fresh bucket with physical backups (manifests recording where their WAL
//! starts), logical ones and a WAL archive (`archive.json` and `<timeline>/<file>.zst`), runs a
//! pass and checks what is left, key by key.

mod common;

use std::collections::BTreeSet;

use chrono::{DateTime, SubsecRound, TimeDelta, Utc};
use common::stored::{Cluster, Fill, WalStart, all_keys, keys_of, uid};
use pgkube_controllers::retention::{BackupId, RetentionPolicy, prune};
use pgkube_controllers::storage::S3Bucket;
use pgkube_controllers::storage::wal::{ArchiveOwner, WalFileName, archive_root};
use pgkube_testkit::proxy::{Cut, Proxy};
use pgkube_testkit::{TestBucket, TestEnv, testbed};

/// Cluster `a` of namespace `ns`, on the default prefix.
const A: Cluster = Cluster {
    prefix: "ns/a",
    uid: "c1",
};
const SYSTEM: &str = "7400000000000000001";

fn wal_root() -> String {
    archive_root(A.prefix, "a")
}

fn owner(cluster_uid: &str) -> ArchiveOwner {
    ArchiveOwner {
        system_identifier: SYSTEM.into(),
        cluster_uid: cluster_uid.into(),
        cluster: "ns/a".into(),
    }
}

fn starting_at<'a>(root: &'a str, first_wal: &'a str) -> WalStart<'a> {
    WalStart {
        wal_root: root,
        first_wal,
        system_identifier: SYSTEM,
    }
}

fn policy(retention_days: u32) -> RetentionPolicy {
    RetentionPolicy {
        prefix: A.prefix.into(),
        cluster_uid: A.uid.into(),
        retention_days,
        failed_backups: BTreeSet::new(),
        held: Default::default(),
        wal_root: Some(wal_root()),
    }
}

fn id(name: &str) -> BackupId {
    BackupId::new(name, uid(name))
}

fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(0)
}

fn days_before(now: DateTime<Utc>, days: i64) -> DateTime<Utc> {
    now - TimeDelta::days(days)
}

/// The keys of WAL files `names` in the archive.
fn wal_keys(names: &[&str]) -> BTreeSet<String> {
    let root = wal_root();
    names
        .iter()
        .map(|name| WalFileName::parse(name).expect("a WAL file").key(&root))
        .collect()
}

/// Every key under the backup directory of `name`.
fn backup_keys(fill: &Fill, name: &str) -> BTreeSet<String> {
    keys_of(&fill.keys(), &A.dir(name))
}

const TIMELINE_1: [&str; 6] = [
    "00000001000000000000000F",
    "000000010000000000000010",
    "00000001000000000000001F",
    "000000010000000000000020.partial",
    "000000010000000000000020.00000028.backup",
    "000000010000000000000040",
];
const TIMELINE_2: [&str; 4] = [
    "00000002.history",
    "00000002000000000000003F",
    "000000020000000000000040",
    "000000020000000000000041",
];

async fn filled(env: &TestEnv, name: &str, fill: &Fill) -> TestBucket {
    let bucket = TestBucket::create(env, name).await;
    fill.upload(&bucket.client(), bucket.name()).await;
    bucket
}

#[tokio::test]
async fn wal_before_the_oldest_kept_physical_backup_goes_per_timeline_and_history_stays() {
    let Some(env) = testbed() else { return };
    let now = now();
    let root = wal_root();
    let files: Vec<&str> = TIMELINE_1.iter().chain(&TIMELINE_2).copied().collect();
    let fill = Fill::new()
        .physical(
            A,
            "p30",
            days_before(now, 30),
            starting_at(&root, "000000010000000000000010"),
        )
        .physical(
            A,
            "p20",
            days_before(now, 20),
            starting_at(&root, "000000010000000000000020"),
        )
        .physical(
            A,
            "p3",
            days_before(now, 3),
            starting_at(&root, "000000020000000000000040"),
        )
        .backup(A, "l1", days_before(now, 1), 0)
        .wal_archive(&root, &owner(A.uid), &files);
    let bucket = filled(&env, "wal-retention", &fill).await;
    let store = S3Bucket::with_client(bucket.client(), bucket.name());

    let report = prune(&store, &policy(7), now).await.expect("the pass");

    assert_eq!(report.deleted_backups, [id("p30"), id("p20")]);
    assert_eq!(report.newest_good_physical, Some(id("p3")));
    assert_eq!(
        report.wal_kept_from.as_deref(),
        Some("000000020000000000000040")
    );
    let deleted = wal_keys(&[
        "00000001000000000000000F",
        "000000010000000000000010",
        "00000001000000000000001F",
        "000000010000000000000020.partial",
        "00000002000000000000003F",
    ]);
    assert_eq!(report.deleted_wal, deleted.len() as u64);
    let mut expected: BTreeSet<String> = fill.keys();
    expected.retain(|key| !deleted.contains(key));
    for gone in ["p30", "p20"] {
        expected.retain(|key| !backup_keys(&fill, gone).contains(key));
    }
    assert_eq!(all_keys(&bucket.client(), bucket.name()).await, expected);
    assert!(expected.contains(&format!("{root}archive.json")));
    bucket.cleanup().await;
}

#[tokio::test]
async fn the_newest_physical_backup_and_its_wal_stay_past_the_retention() {
    let Some(env) = testbed() else { return };
    let now = now();
    let root = wal_root();
    let fill = Fill::new()
        .physical(
            A,
            "p30",
            days_before(now, 30),
            starting_at(&root, "000000010000000000000010"),
        )
        .backup(A, "l10", days_before(now, 10), 0)
        .backup(A, "l1", days_before(now, 1), 0)
        .wal_archive(&root, &owner(A.uid), &TIMELINE_1);
    let bucket = filled(&env, "wal-retention-newest", &fill).await;
    let store = S3Bucket::with_client(bucket.client(), bucket.name());

    let report = prune(&store, &policy(7), now).await.expect("the pass");

    assert_eq!(report.newest_good, Some(id("l1")));
    assert_eq!(report.newest_good_physical, Some(id("p30")));
    assert_eq!(report.deleted_backups, [id("l10")]);
    let deleted = wal_keys(&["00000001000000000000000F"]);
    assert_eq!(report.deleted_wal, 1);
    let left = all_keys(&bucket.client(), bucket.name()).await;
    let mut expected = fill.keys();
    expected.retain(|key| !deleted.contains(key) && !backup_keys(&fill, "l10").contains(key));
    assert_eq!(left, expected);
    bucket.cleanup().await;
}

#[tokio::test]
async fn an_archive_another_cluster_of_the_same_name_owns_is_never_pruned() {
    let Some(env) = testbed() else { return };
    let now = now();
    let root = wal_root();
    // The archive is the first cluster's (uid c0); a second one of the same name (c1) took a
    // physical backup whose manifest names the same root.
    let fill = Fill::new()
        .physical(
            A,
            "p30",
            days_before(now, 30),
            starting_at(&root, "000000010000000000000040"),
        )
        .wal_archive(&root, &owner("c0"), &TIMELINE_1);
    let bucket = filled(&env, "wal-retention-owner", &fill).await;
    let store = S3Bucket::with_client(bucket.client(), bucket.name());

    let report = prune(&store, &policy(7), now).await.expect("the pass");

    assert_eq!(report.deleted_wal, 0);
    let reason = report.wal_left_alone.expect("left alone");
    assert!(
        reason.contains("records cluster uid c0, not c1"),
        "{reason}"
    );
    assert_eq!(all_keys(&bucket.client(), bucket.name()).await, fill.keys());
    bucket.cleanup().await;
}

#[tokio::test]
async fn without_a_physical_backup_the_archive_is_not_even_listed() {
    let Some(env) = testbed() else { return };
    let now = now();
    let root = wal_root();
    let fill = Fill::new()
        .backup(A, "l30", days_before(now, 30), 0)
        .backup(A, "l1", days_before(now, 1), 0)
        .wal_archive(&root, &owner(A.uid), &TIMELINE_1);
    let bucket = filled(&env, "wal-retention-logical", &fill).await;
    let proxy = Proxy::recording(&env.s3_endpoint).await;
    let store = S3Bucket::with_client(client_via(&env, &proxy.endpoint), bucket.name());

    let report = prune(&store, &policy(7), now).await.expect("the pass");

    assert_eq!(report.deleted_backups, [id("l30")]);
    assert_eq!(
        report.wal_left_alone.as_deref(),
        Some("no physical backup is kept")
    );
    for archive in ["/ns/a/wal/", "prefix=ns%2Fa%2Fwal"] {
        let heads = proxy.request_heads(archive);
        assert!(heads.is_empty(), "{heads:?}");
    }
    let left = all_keys(&bucket.client(), bucket.name()).await;
    assert!(wal_keys(&TIMELINE_1).is_subset(&left));
    bucket.cleanup().await;
}

#[tokio::test]
async fn a_failed_wal_listing_deletes_nothing_not_even_expired_backups() {
    let Some(env) = testbed() else { return };
    let now = now();
    let root = wal_root();
    let fill = Fill::new()
        .physical(
            A,
            "p30",
            days_before(now, 30),
            starting_at(&root, "000000010000000000000010"),
        )
        .physical(
            A,
            "p1",
            days_before(now, 1),
            starting_at(&root, "000000010000000000000040"),
        )
        .wal_archive(&root, &owner(A.uid), &TIMELINE_1);
    let bucket = filled(&env, "wal-retention-nolist", &fill).await;
    let cut = Cut {
        method: "GET",
        path_contains: "prefix=ns%2Fa%2Fwal%2Fa%2F".into(),
        after_bytes: 20,
        ranged_too: true,
        times: usize::MAX,
    };
    let proxy = Proxy::cutting(&env.s3_endpoint, cut).await;
    let store = S3Bucket::with_client(client_via(&env, &proxy.endpoint), bucket.name());

    let error = prune(&store, &policy(7), now)
        .await
        .expect_err("the WAL listing is cut");

    assert!(
        error.to_string().contains("ListObjectsV2 of ns/a/wal/a/"),
        "{error}"
    );
    assert!(proxy.cuts() > 0);
    assert_eq!(all_keys(&bucket.client(), bucket.name()).await, fill.keys());
    bucket.cleanup().await;
}

/// A client that reaches the test bed's S3 server through `endpoint`.
fn client_via(env: &TestEnv, endpoint: &str) -> aws_sdk_s3::Client {
    let mut env = env.clone();
    env.s3_endpoint = endpoint.to_owned();
    env.s3_client()
}
