//! Benchmark of a retention pass against the test bed's Garage: 10,000 expired objects (10
//! backups of 1,000 objects each, manifest included) beside one recent backup, deleted by
//! [`prune`] (DeleteObjects, up to 1,000 keys a request), then, recreated, by listing and one
//! DeleteObject per key, one at a time and 16 at a time. Prints the S3 requests and the time
//! each way took, and checks that each left exactly the recent backup.
//!
//! Needs the test bed (`tests/testbed/up`); run with its env:
//! `set -a; source target/testbed/env; set +a; cargo bench -p pgkube-controllers --bench prune`.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use aws_sdk_s3::Client;
use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use futures::{StreamExt, TryStreamExt};
use pgkube_controllers::retention::{RetentionPolicy, prune};
use pgkube_controllers::storage::S3Bucket;
use pgkube_controllers::storage::manifest::{
    DATABASE_FORMAT, DatabaseObject, GLOBALS_FORMAT, MANIFEST_VERSION, Manifest, StoredObject,
};
use pgkube_testkit::{TestBucket, TestEnv, testbed};

const PREFIX: &str = "ns/bench";
/// The cluster whose backups these are: they are under `<PREFIX>/<CLUSTER_UID>/`.
const CLUSTER_UID: &str = "bench-cluster-uid";
const EXPIRED_BACKUPS: usize = 10;
const OBJECTS_PER_BACKUP: usize = 1_000;
const CONCURRENT_UPLOADS: usize = 64;
const CONCURRENT_DELETES: usize = 16;

/// One way of deleting the expired objects, measured.
struct Row {
    method: String,
    objects: u64,
    requests: u64,
    elapsed: Duration,
}

#[tokio::main]
async fn main() -> ExitCode {
    let Some(env) = find_testbed() else {
        eprintln!(
            "prune benchmark: the test bed's S3 server (Garage) is not available. Start it with \
             tests/testbed/up, then run: set -a; source target/testbed/env; set +a; \
             cargo bench -p pgkube-controllers --bench prune"
        );
        return ExitCode::from(2);
    };
    let bucket = TestBucket::create(&env, "bench-prune").await;
    let now = Utc::now();
    let expired = expired_objects(now - TimeDelta::days(30));
    let recent = backup_objects("recent", now - TimeDelta::days(1), 2);
    upload(&bucket, &recent).await;
    let recent_keys: BTreeSet<String> = recent.iter().map(|(key, _)| key.clone()).collect();

    let mut rows = Vec::new();
    upload(&bucket, &expired).await;
    rows.push(run_prune(&bucket, now).await);
    check_only_left(&bucket, &recent_keys).await;
    for concurrency in [1, CONCURRENT_DELETES] {
        upload(&bucket, &expired).await;
        rows.push(delete_one_by_one(&bucket, &recent_keys, concurrency).await);
        check_only_left(&bucket, &recent_keys).await;
    }
    print_table(&rows);
    bucket.cleanup().await;
    ExitCode::SUCCESS
}

/// The test bed, or `None` (after the testkit said why, without a backtrace) when it is not
/// running.
fn find_testbed() -> Option<TestEnv> {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        eprintln!(
            "{}",
            info.payload_as_str().unwrap_or("test bed unavailable")
        );
    }));
    let env = std::panic::catch_unwind(testbed).ok().flatten();
    std::panic::set_hook(default_hook);
    env
}

/// The directory of backup `name`, as the agent lays it out.
fn directory(name: &str) -> String {
    format!("{PREFIX}/{CLUSTER_UID}/{name}/{name}-uid/")
}

fn manifest_json(name: &str, finished_at: DateTime<Utc>) -> Vec<u8> {
    let finished_at = finished_at.to_rfc3339_opts(SecondsFormat::Secs, true);
    let object = |key: String, format: &str| StoredObject {
        key,
        size: 4,
        sha256: "00".repeat(32),
        format: format.into(),
        compression: None,
    };
    let manifest = Manifest {
        manifest_version: MANIFEST_VERSION,
        cluster: "bench".into(),
        namespace: "ns".into(),
        cluster_uid: Some(CLUSTER_UID.into()),
        system_identifier: None,
        backup_name: name.into(),
        backup_uid: Some(format!("{name}-uid")),
        postgresql_version: "16.4".into(),
        started_at: finished_at.clone(),
        finished_at,
        format: DATABASE_FORMAT.into(),
        physical: None,
        globals: Some(object(
            format!("{}globals.sql", directory(name)),
            GLOBALS_FORMAT,
        )),
        databases: vec![DatabaseObject {
            name: "db00000".into(),
            object: object(
                format!("{}databases/db00000.dump", directory(name)),
                DATABASE_FORMAT,
            ),
        }],
    };
    serde_json::to_vec(&manifest).expect("a manifest serialises")
}

/// A backup of `objects` objects: globals, `objects - 2` database dumps and the manifest.
fn backup_objects(
    name: &str,
    finished_at: DateTime<Utc>,
    objects: usize,
) -> Vec<(String, Vec<u8>)> {
    let dir = directory(name);
    let mut all = vec![(format!("{dir}globals.sql"), b"SET;".to_vec())];
    for index in 0..objects.saturating_sub(2) {
        let key = format!("{dir}databases/db{index:05}.dump");
        all.push((key, b"PGDM".to_vec()));
    }
    let manifest_key = format!("{dir}manifest.json");
    all.push((manifest_key, manifest_json(name, finished_at)));
    all
}

fn expired_objects(finished_at: DateTime<Utc>) -> Vec<(String, Vec<u8>)> {
    (0..EXPIRED_BACKUPS)
        .flat_map(|index| {
            let name = format!("old-{index:02}");
            backup_objects(&name, finished_at, OBJECTS_PER_BACKUP)
        })
        .collect()
}

async fn upload(bucket: &TestBucket, objects: &[(String, Vec<u8>)]) {
    let client = bucket.client();
    let started = Instant::now();
    futures::stream::iter(objects)
        .map(|(key, body)| {
            let request = client
                .put_object()
                .bucket(bucket.name())
                .key(key)
                .body(body.clone().into());
            async move {
                request
                    .send()
                    .await
                    .map_err(|e| format!("putting {key}: {e:?}"))
            }
        })
        .buffer_unordered(CONCURRENT_UPLOADS)
        .try_collect::<Vec<_>>()
        .await
        .expect("uploading the benchmark's objects");
    eprintln!(
        "(uploaded {} objects in {:.1?})",
        objects.len(),
        started.elapsed()
    );
}

async fn run_prune(bucket: &TestBucket, now: DateTime<Utc>) -> Row {
    let store = S3Bucket::with_client(bucket.client(), bucket.name());
    let policy = RetentionPolicy {
        prefix: PREFIX.into(),
        cluster_uid: CLUSTER_UID.into(),
        retention_days: 7,
        failed_backups: BTreeSet::new(),
        held: Default::default(),
        wal_root: None,
    };
    let started = Instant::now();
    let report = prune(&store, &policy, now)
        .await
        .expect("the retention pass");
    let elapsed = started.elapsed();
    assert_eq!(report.deleted_backups.len(), EXPIRED_BACKUPS);
    Row {
        method: "prune: DeleteObjects, 1,000 keys a request".into(),
        objects: report.deleted_objects,
        requests: report.requests,
        elapsed,
    }
}

/// Lists the prefix (counted), then deletes every key but `keep` with one DeleteObject each.
async fn delete_one_by_one(
    bucket: &TestBucket,
    keep: &BTreeSet<String>,
    concurrency: usize,
) -> Row {
    let client = bucket.client();
    let started = Instant::now();
    let (keys, pages) = list(&client, bucket.name()).await;
    let doomed: Vec<&String> = keys.iter().filter(|key| !keep.contains(*key)).collect();
    futures::stream::iter(&doomed)
        .map(|key| {
            client
                .delete_object()
                .bucket(bucket.name())
                .key(*key)
                .send()
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<_>>()
        .await
        .expect("deleting one by one");
    Row {
        method: format!("DeleteObject per key, {concurrency} at a time"),
        objects: doomed.len() as u64,
        requests: pages + doomed.len() as u64,
        elapsed: started.elapsed(),
    }
}

/// Every key under the prefix, and how many pages that took.
async fn list(client: &Client, bucket: &str) -> (Vec<String>, u64) {
    let pages: Vec<_> = client
        .list_objects_v2()
        .bucket(bucket)
        .prefix(format!("{PREFIX}/"))
        .into_paginator()
        .send()
        .try_collect()
        .await
        .expect("listing the benchmark's objects");
    let keys = pages
        .iter()
        .flat_map(|page| page.contents())
        .filter_map(|object| object.key().map(str::to_owned))
        .collect();
    (keys, pages.len() as u64)
}

async fn check_only_left(bucket: &TestBucket, expected: &BTreeSet<String>) {
    let (keys, _) = list(&bucket.client(), bucket.name()).await;
    let left: BTreeSet<String> = keys.into_iter().collect();
    assert_eq!(&left, expected, "only the recent backup is left");
}

fn print_table(rows: &[Row]) {
    println!();
    println!(
        "{:<44} {:>8} {:>9} {:>10} {:>10}",
        "method", "objects", "requests", "seconds", "objects/s"
    );
    for row in rows {
        let seconds = row.elapsed.as_secs_f64();
        println!(
            "{:<44} {:>8} {:>9} {:>10.2} {:>10.0}",
            row.method,
            row.objects,
            row.requests,
            seconds,
            row.objects as f64 / seconds.max(f64::EPSILON)
        );
    }
}
