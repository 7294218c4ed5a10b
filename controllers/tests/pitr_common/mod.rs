//! Shared by the point-in-time recovery tests on the real node: a source cluster that archives,
//! its physical backups, and a writer of timestamped rows with their digests.

#![allow(dead_code)] // Each test binary uses a different part.

use std::collections::BTreeMap;
use std::time::Duration;

use super::common::Running;
use super::common::real_node::{CLUSTER_TIMEOUT, NEVER, S3_SECRET};
use pgkube_crds::{
    BackupMethod, BackupTarget, DeletionPolicy, LocalReference, PostgreSQLBackup,
    PostgreSQLBackupSpec,
};
use pgkube_testkit::tokio_postgres::Client;
use pgkube_testkit::{
    TestBucket, TestCluster, TestEnv, backup_config, create_s3_secret, list_objects, test_storage,
    wait_backup_ended,
};

pub const BACKUP_TIMEOUT: Duration = Duration::from_secs(600);

/// The source: `replicas` instances archiving to `bucket`.
pub async fn start_source(
    running: &Running,
    env: &TestEnv,
    bucket: &TestBucket,
    replicas: i32,
) -> TestCluster {
    create_s3_secret(
        &running.client,
        env,
        running.namespace.name(),
        S3_SECRET,
        None,
    )
    .await
    .expect("S3 Secret");
    let settings = backup_config(test_storage(env, bucket.name(), S3_SECRET), NEVER);
    TestCluster::builder("pg")
        .replicas(replicas)
        .spec(|spec| spec.backup = Some(settings))
        .timeout(CLUSTER_TIMEOUT)
        .start(&running.namespace)
        .await
        .unwrap_or_else(|error| panic!("the source becomes Running: {error:#}"))
}

/// Creates physical backup `name` of `cluster` from its primary, once ended.
pub async fn physical_backup(running: &Running, cluster: &str, name: &str) -> PostgreSQLBackup {
    let spec = PostgreSQLBackupSpec {
        cluster: LocalReference {
            name: cluster.to_owned(),
        },
        method: BackupMethod::Physical,
        target: Some(BackupTarget::Primary),
        deletion_policy: DeletionPolicy::Retain,
        compression: None,
    };
    running
        .api::<PostgreSQLBackup>()
        .create(&Default::default(), &PostgreSQLBackup::new(name, spec))
        .await
        .expect("backup created");
    wait_backup_ended(
        &running.client,
        running.namespace.name(),
        name,
        BACKUP_TIMEOUT,
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}"))
}

/// Commits rows `first` to `last`, one transaction each, with the time of their insert.
pub async fn write_ticks(sql: &Client, first: i64, last: i64) {
    for id in first..=last {
        sql.execute(
            "INSERT INTO ticks VALUES ($1, clock_timestamp(), repeat(md5(($1::bigint)::text), 10))",
            &[&id],
        )
        .await
        .expect("a row");
    }
}

/// The insert time of row `id`, RFC 3339 in UTC with microseconds: after row `id - 1`
/// committed and before row `id` did, since the writer commits one row at a time.
pub async fn time_of(sql: &Client, id: i64) -> String {
    sql.query_one(
        "SELECT to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') FROM ticks WHERE id = $1",
        &[&id],
    )
    .await
    .expect("the row")
    .get(0)
}

/// Count, highest id and digest of the rows up to `last`.
pub async fn ticks(sql: &Client, last: i64) -> (i64, Option<i64>, Option<String>) {
    let row = sql
        .query_one(
            "SELECT count(*), max(id), md5(string_agg(id || ':' || at || ':' || payload, ',' ORDER BY id)) \
             FROM ticks WHERE id <= $1",
            &[&last],
        )
        .await
        .expect("the rows");
    (row.get(0), row.get(1), row.get(2))
}

pub async fn items(sql: &Client) -> (i64, Option<String>) {
    let row = sql
        .query_one(
            "SELECT count(*), md5(string_agg(id || ':' || name, ',' ORDER BY id)) FROM items",
            &[],
        )
        .await
        .expect("the rows");
    (row.get(0), row.get(1))
}

/// Every object of the archive at `root` with its content.
pub async fn archive_contents(bucket: &TestBucket, root: &str) -> BTreeMap<String, Vec<u8>> {
    let keys = list_objects(&bucket.client(), bucket.name(), root)
        .await
        .expect("listing");
    let mut contents = BTreeMap::new();
    for key in keys.into_keys() {
        let bytes = bucket.object(&key).await.expect("an object");
        contents.insert(key, bytes);
    }
    contents
}
