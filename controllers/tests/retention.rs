//! Retention against the test bed's Garage: each test fills a fresh bucket with backups in the
//! agent's layout (`<prefix>/<cluster-uid>/<name>/<uid>/globals.sql`, `databases/app.dump`,
//! `manifest.json` with a backdated `finishedAt` and the owner's uids), runs a pass and checks
//! what is left, key by key.
//!
//! Passes that must count their requests go through a recording proxy, so the report's figure
//! is checked against the requests that really went over the wire.

mod common;

use std::collections::BTreeSet;

use aws_sdk_s3::Client;
use chrono::{DateTime, SubsecRound, TimeDelta, Utc};
use common::stored::{Cluster, Fill, all_keys, keys_of, uid};
use pgkube_controllers::retention::{BackupId, PruneReport, RetentionPolicy, prune};
use pgkube_controllers::storage::wal::archive_root;
use pgkube_controllers::storage::{CredentialSource, S3Bucket, S3Options, StaticKeys};
use pgkube_testkit::proxy::{Cut, Proxy};
use pgkube_testkit::{TestBucket, TestEnv, testbed, unique_name};

/// Cluster `a` of namespace `ns`, on the default prefix.
const A: Cluster = Cluster {
    prefix: "ns/a",
    uid: "c1",
};

fn id(name: &str) -> BackupId {
    BackupId::new(name, uid(name))
}

fn ids(names: &[&str]) -> Vec<BackupId> {
    names.iter().map(|name| id(name)).collect()
}

fn policy(cluster: Cluster, retention_days: u32, failed: &[&str]) -> RetentionPolicy {
    RetentionPolicy {
        prefix: cluster.prefix.into(),
        cluster_uid: cluster.uid.into(),
        retention_days,
        failed_backups: failed.iter().map(|name| uid(name)).collect(),
        held: Default::default(),
        wal_root: Some(archive_root(cluster.prefix, "a")),
    }
}

/// A client that reaches the test bed's S3 server through `endpoint`.
fn client_via(env: &TestEnv, endpoint: &str) -> Client {
    let mut env = env.clone();
    env.s3_endpoint = endpoint.to_owned();
    env.s3_client()
}

/// The project's own client, as the manager builds it, reaching the store through `endpoint`.
async fn our_client(env: &TestEnv, endpoint: &str, bucket: &str) -> S3Bucket {
    let options = S3Options {
        endpoint: Some(endpoint.to_owned()),
        region: env.s3_region.clone(),
        bucket: bucket.to_owned(),
        force_path_style: true,
        credentials: CredentialSource::Static(StaticKeys {
            access_key_id: env.s3_access_key.clone(),
            secret_access_key: env.s3_secret_key.clone(),
            session_token: None,
        }),
        ..S3Options::default()
    };
    S3Bucket::connect(&options).await.expect("our S3 client")
}

/// Now in whole seconds, as manifests write times.
fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(0)
}

fn days_before(now: DateTime<Utc>, days: i64) -> DateTime<Utc> {
    now - TimeDelta::days(days)
}

#[tokio::test]
async fn of_thirty_daily_backups_exactly_those_past_the_retention_are_deleted() {
    let Some(env) = testbed() else { return };
    let bucket = TestBucket::create(&env, "retention-30").await;
    let now = now();
    let mut fill = Fill::new();
    for day in 1..=30 {
        fill = fill.backup(A, &format!("b{day:02}"), days_before(now, day), 0);
    }
    fill.upload(&bucket.client(), bucket.name()).await;
    let proxy = Proxy::recording(&env.s3_endpoint).await;
    let store = our_client(&env, &proxy.endpoint, bucket.name()).await;

    let report = prune(&store, &policy(A, 7, &[]), now)
        .await
        .expect("the pass");

    // Day 7 finished exactly 7 days before `now`: not older than the retention, so it stays.
    let expired: Vec<BackupId> = (8..=30)
        .rev()
        .map(|day| id(&format!("b{day:02}")))
        .collect();
    let expected_left: BTreeSet<String> = (1..=7)
        .flat_map(|day| keys_of(&fill.keys(), &A.dir(&format!("b{day:02}"))))
        .collect();
    assert_eq!(
        all_keys(&bucket.client(), bucket.name()).await,
        expected_left
    );
    // 1 listing page, 30 manifests, 1 upload listing, 1 batch of manifests, 1 of data.
    let expected = PruneReport {
        newest_good: Some(id("b01")),
        deleted_backups: expired,
        deleted_objects: 23 * 3,
        aborted_uploads: 0,
        kept_backups: 7,
        held: Vec::new(),
        skipped: Vec::new(),
        requests: 34,
        wal_left_alone: Some("no physical backup is kept".to_owned()),
        ..PruneReport::default()
    };
    assert_eq!(report, expected);
    assert_eq!(proxy.request_heads("").len() as u64, report.requests);
    let deletes = proxy.request_heads("?delete");
    assert_eq!(deletes.len(), 2, "{deletes:#?}");
    // DeleteObjects requires an integrity header: our client (checksums only when required)
    // sends a CRC32 checksum rather than Content-MD5, and Garage accepts it.
    assert!(
        deletes
            .iter()
            .all(|head| head.contains("x-amz-checksum-crc32: ")),
        "{deletes:#?}"
    );
    bucket.cleanup().await;
}

#[tokio::test]
async fn when_every_backup_expired_the_newest_one_stays() {
    let Some(env) = testbed() else { return };
    let bucket = TestBucket::create(&env, "retention-newest").await;
    let now = now();
    let fill = Fill::new()
        .backup(A, "b30", days_before(now, 30), 0)
        .backup(A, "b20", days_before(now, 20), 0)
        .backup(A, "b10", days_before(now, 10), 0);
    fill.upload(&bucket.client(), bucket.name()).await;
    let store = S3Bucket::with_client(bucket.client(), bucket.name());

    let report = prune(&store, &policy(A, 7, &[]), now)
        .await
        .expect("the pass");

    assert_eq!(report.newest_good, Some(id("b10")));
    assert_eq!(report.deleted_backups, ids(&["b30", "b20"]));
    assert_eq!(report.kept_backups, 1);
    let left = all_keys(&bucket.client(), bucket.name()).await;
    assert_eq!(left, keys_of(&fill.keys(), &A.dir("b10")));
    bucket.cleanup().await;
}

#[tokio::test]
async fn when_the_newest_backup_failed_the_next_newest_stays() {
    let Some(env) = testbed() else { return };
    let bucket = TestBucket::create(&env, "retention-failed").await;
    let now = now();
    let fill = Fill::new()
        .backup(A, "b30", days_before(now, 30), 0)
        .backup(A, "b20", days_before(now, 20), 0)
        .backup(A, "b10", days_before(now, 10), 0);
    fill.upload(&bucket.client(), bucket.name()).await;
    let store = S3Bucket::with_client(bucket.client(), bucket.name());

    let report = prune(&store, &policy(A, 7, &["b10"]), now)
        .await
        .expect("the pass");

    assert_eq!(report.newest_good, Some(id("b20")));
    assert_eq!(report.deleted_backups, ids(&["b30", "b10"]));
    let left = all_keys(&bucket.client(), bucket.name()).await;
    assert_eq!(left, keys_of(&fill.keys(), &A.dir("b20")));
    bucket.cleanup().await;
}

#[tokio::test]
async fn other_prefixes_loose_keys_and_incomplete_backups_are_left_alone() {
    let Some(env) = testbed() else { return };
    let bucket = TestBucket::create(&env, "retention-boundary").await;
    let now = now();
    let old = days_before(now, 30);
    let other_prefix = Cluster {
        prefix: "ns/ab",
        uid: A.uid,
    };
    let other_namespace = Cluster {
        prefix: "other/a",
        uid: A.uid,
    };
    let fill = Fill::new()
        .backup(A, "old", old, 0)
        .backup(A, "new", days_before(now, 1), 0)
        // A prefix that starts with this one's, and another namespace's, same cluster uid.
        .backup(other_prefix, "old", old, 0)
        .backup(other_prefix, "new", days_before(now, 1), 0)
        .backup(other_namespace, "old", old, 0)
        // Foreign and loose keys, a killed agent's directory, a garbled manifest.
        .object("ns/a/c1", b"a key named as the root".to_vec())
        .object("foreign.txt", b"not ours".to_vec())
        .object("ns/a/c1/notes.txt", b"loose".to_vec())
        .incomplete(&A.dir("killed"), 0)
        .incomplete(&A.dir("garbled"), 0)
        .object(
            &format!("{}manifest.json", A.dir("garbled")),
            b"{\"manifestVersion\": 1,".to_vec(),
        );
    fill.upload(&bucket.client(), bucket.name()).await;
    let store = S3Bucket::with_client(bucket.client(), bucket.name());

    let report = prune(&store, &policy(A, 7, &[]), now)
        .await
        .expect("the pass");

    let mut expected_left = fill.keys();
    expected_left.retain(|key| !key.starts_with(&A.dir("old")));
    assert_eq!(
        all_keys(&bucket.client(), bucket.name()).await,
        expected_left
    );
    assert_eq!(report.deleted_backups, ids(&["old"]));
    assert_eq!(report.deleted_objects, 3);
    assert_eq!(report.kept_backups, 1);
    assert_eq!(report.skipped.len(), 2, "{:?}", report.skipped);
    assert!(
        report.skipped[0]
            .starts_with("garbled/garbled-uid: unreadable manifest (manifest ns/a/c1/garbled/"),
        "{:?}",
        report.skipped
    );
    assert_eq!(
        report.skipped[1],
        "killed/killed-uid: no manifest.json (incomplete backup)"
    );
    bucket.cleanup().await;
}

/// Two clusters whose storage names the same prefix: cluster `a` keeps 7 days, cluster `b` 90,
/// both have a backup of the same name 30 days old and one a day old. Each pass deletes only
/// its own cluster's expired backups: `a`'s pass would reach `b`'s if it listed the prefix.
#[tokio::test]
async fn two_clusters_sharing_a_prefix_never_prune_each_others_backups() {
    let Some(env) = testbed() else { return };
    let bucket = TestBucket::create(&env, "retention-shared").await;
    let now = now();
    let a = Cluster {
        prefix: "team/pg",
        uid: "uid-of-a",
    };
    let b = Cluster {
        prefix: "team/pg",
        uid: "uid-of-b",
    };
    let fill = Fill::new()
        .backup(a, "nightly-old", days_before(now, 30), 0)
        .backup(a, "nightly-new", days_before(now, 1), 0)
        .backup(b, "nightly-old", days_before(now, 30), 0)
        .backup(b, "nightly-new", days_before(now, 1), 0);
    fill.upload(&bucket.client(), bucket.name()).await;
    let store = S3Bucket::with_client(bucket.client(), bucket.name());

    let of_a = prune(&store, &policy(a, 7, &[]), now)
        .await
        .expect("a's pass");
    let of_b = prune(&store, &policy(b, 90, &[]), now)
        .await
        .expect("b's pass");

    assert_eq!(of_a.deleted_backups, ids(&["nightly-old"]));
    assert_eq!(of_a.kept_backups, 1, "{of_a:?}");
    assert_eq!(of_b.deleted_backups, Vec::<BackupId>::new());
    assert_eq!(of_b.kept_backups, 2, "{of_b:?}");
    let mut expected_left = fill.keys();
    expected_left.retain(|key| !key.starts_with(&a.dir("nightly-old")));
    assert_eq!(
        all_keys(&bucket.client(), bucket.name()).await,
        expected_left,
        "b's 30-day-old backup is b's to keep"
    );
    bucket.cleanup().await;
}

/// A backup stored before the uids named its directory (`<prefix>/<name>/`, a manifest with
/// the cluster's name and namespace but no uid) is outside every cluster's root: retention
/// never deletes it, however old, since nothing proves which cluster it is of.
#[tokio::test]
async fn backups_in_the_layout_from_before_the_uids_are_never_pruned() {
    let Some(env) = testbed() else { return };
    let bucket = TestBucket::create(&env, "retention-legacy").await;
    let now = now();
    let fill = Fill::new()
        .legacy(A.prefix, "ancient", days_before(now, 300))
        .backup(A, "old", days_before(now, 30), 0)
        .backup(A, "new", days_before(now, 1), 0);
    fill.upload(&bucket.client(), bucket.name()).await;
    let store = S3Bucket::with_client(bucket.client(), bucket.name());

    let report = prune(&store, &policy(A, 7, &[]), now)
        .await
        .expect("the pass");

    assert_eq!(report.deleted_backups, ids(&["old"]));
    let left = all_keys(&bucket.client(), bucket.name()).await;
    for key in keys_of(&fill.keys(), "ns/a/ancient/") {
        assert!(left.contains(&key), "{key} stays: {left:?}");
    }
    assert!(!left.iter().any(|key| key.starts_with(&A.dir("old"))));
    bucket.cleanup().await;
}

/// The open uploads under `root`, as (key, upload id).
async fn open_uploads(client: &Client, bucket: &str, root: &str) -> BTreeSet<String> {
    let listing = client
        .list_multipart_uploads()
        .bucket(bucket)
        .prefix(root)
        .send()
        .await
        .expect("listing uploads");
    listing
        .uploads()
        .iter()
        .filter_map(|upload| upload.key().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn multipart_uploads_older_than_a_day_are_aborted_fresh_ones_are_not() {
    let Some(env) = testbed() else { return };
    let bucket = TestBucket::create(&env, "retention-uploads").await;
    let client = bucket.client();
    for key in [
        "ns/a/c1/killed/killed-uid/databases/app.dump",
        "ns/a/c2/killed/killed-uid/databases/app.dump",
        "ns/a/killed/databases/app.dump",
    ] {
        client
            .create_multipart_upload()
            .bucket(bucket.name())
            .key(key)
            .send()
            .await
            .expect("starting an upload");
    }
    let store = S3Bucket::with_client(bucket.client(), bucket.name());
    let policy = policy(A, 7, &[]);

    let fresh = prune(&store, &policy, Utc::now()).await.expect("the pass");
    assert_eq!(fresh.aborted_uploads, 0);
    assert_eq!(
        open_uploads(&client, bucket.name(), "ns/a/c1/").await.len(),
        1
    );

    let later = Utc::now() + TimeDelta::days(2);
    let stale = prune(&store, &policy, later).await.expect("the pass");
    assert_eq!(stale.aborted_uploads, 1);
    assert!(
        open_uploads(&client, bucket.name(), "ns/a/c1/")
            .await
            .is_empty()
    );
    // Another cluster's on the same prefix, and a legacy one, are not this cluster's.
    let others = open_uploads(&client, bucket.name(), "ns/").await;
    assert_eq!(
        others,
        BTreeSet::from([
            "ns/a/c2/killed/killed-uid/databases/app.dump".into(),
            "ns/a/killed/databases/app.dump".into()
        ])
    );
    // Listing pages and the abort: nothing else was there to read or delete.
    assert_eq!(stale.requests, 3);
    bucket.cleanup().await;
}

#[tokio::test]
async fn a_failed_listing_deletes_nothing() {
    let Some(env) = testbed() else { return };
    let bucket = TestBucket::create(&env, "retention-nolist").await;
    let now = now();
    let fill = Fill::new()
        .backup(A, "old", days_before(now, 30), 0)
        .backup(A, "new", days_before(now, 1), 0);
    fill.upload(&bucket.client(), bucket.name()).await;
    let missing = unique_name("retention-missing");
    let store = S3Bucket::with_client(bucket.client(), &missing);

    let error = prune(&store, &policy(A, 7, &[]), now)
        .await
        .expect_err("no such bucket");

    let message = error.to_string();
    assert!(
        message.starts_with("S3 ListObjectsV2 of ns/a/c1/ failed: NoSuchBucket"),
        "{message}"
    );
    assert_eq!(all_keys(&bucket.client(), bucket.name()).await, fill.keys());
    bucket.cleanup().await;
}

#[tokio::test]
async fn a_failed_manifest_read_deletes_nothing() {
    let Some(env) = testbed() else { return };
    let bucket = TestBucket::create(&env, "retention-noread").await;
    let now = now();
    let fill = Fill::new()
        .backup(A, "old", days_before(now, 30), 0)
        .backup(A, "new", days_before(now, 1), 0);
    fill.upload(&bucket.client(), bucket.name()).await;
    let cut = Cut {
        method: "GET",
        path_contains: "/new/new-uid/manifest.json".into(),
        after_bytes: 20,
        ranged_too: true,
        times: usize::MAX,
    };
    let proxy = Proxy::cutting(&env.s3_endpoint, cut).await;
    let store = S3Bucket::with_client(client_via(&env, &proxy.endpoint), bucket.name());

    let error = prune(&store, &policy(A, 7, &[]), now)
        .await
        .expect_err("the manifest read is cut");

    let message = error.to_string();
    assert!(
        message.starts_with("S3 GetObject of ns/a/c1/new/new-uid/manifest.json failed"),
        "{message}"
    );
    assert!(proxy.cuts() > 0);
    assert_eq!(all_keys(&bucket.client(), bucket.name()).await, fill.keys());
    bucket.cleanup().await;
}

#[tokio::test]
async fn more_than_a_thousand_objects_go_in_several_batches() {
    let Some(env) = testbed() else { return };
    let bucket = TestBucket::create(&env, "retention-batches").await;
    let now = now();
    // 2 + 1,198 + manifest = 1,201 objects in the expired backup.
    let fill = Fill::new()
        .backup(A, "big", days_before(now, 30), 1_198)
        .backup(A, "new", days_before(now, 1), 0);
    fill.upload(&bucket.client(), bucket.name()).await;
    let proxy = Proxy::recording(&env.s3_endpoint).await;
    let store = S3Bucket::with_client(client_via(&env, &proxy.endpoint), bucket.name());

    let report = prune(&store, &policy(A, 7, &[]), now)
        .await
        .expect("the pass");

    assert_eq!(report.deleted_backups, ids(&["big"]));
    assert_eq!(report.deleted_objects, 1_201);
    let left = all_keys(&bucket.client(), bucket.name()).await;
    assert_eq!(left, keys_of(&fill.keys(), &A.dir("new")));
    // The manifest alone, then 1,000 and 200 data keys.
    assert_eq!(proxy.request_heads("?delete").len(), 3);
    // 2 listing pages (1,204 keys), 2 manifests, 1 upload listing, 3 batches.
    assert_eq!(report.requests, 8);
    assert_eq!(proxy.request_heads("").len() as u64, report.requests);
    bucket.cleanup().await;
}
