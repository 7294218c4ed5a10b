//! End to end on the test bed's real node: in-place point-in-time recovery of a running
//! PostgreSQL 15 cluster of two instances (a PostgreSQLRestore with `method: PointInTime`),
//! from a physical backup and the cluster's own WAL archive in the real Garage.
//!
//! - With one archived segment the recovery needs corrupted, the recovery fails naming that
//!   object, and the cluster is back on its old data: every row, writes accepted, the replica
//!   streaming, the same timeline.
//! - With the archive whole again, the cluster recovers to a time T: the primary and the replica
//!   hold exactly the rows committed before T, on a new timeline; `-rw` routed to no pod while
//!   the primary recovered; the data directory from before is kept on the primary's volume; and
//!   new WAL is archived on the new timeline.

mod common;
mod pitr_common;

use std::time::Duration;

use common::Running;
use common::real_node::{CLUSTER_TIMEOUT, RESYNC};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use pgkube_controllers::cluster::build::ROLE_LABEL;
use pgkube_crds::{
    CONTINUOUS_ARCHIVING, InPlaceRecovery, InPlaceStep, LocalReference, PostgreSQLRestoreSpec,
    RecoveryTarget, RestoreMethod, RestorePhase,
};
use pgkube_testkit::tokio_postgres::Client;
use pgkube_testkit::wal::{finish_segments, wait_archived_through};
use pgkube_testkit::{TestBucket, TestCluster, wait_until};
use pgkube_testkit::{create_restore, describe_restore, put_object, wait_restore_ended};
use pitr_common::{items, physical_backup, start_source, ticks, time_of, write_ticks};

/// The restore of the base backup and the replay, then the replica's clone.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(600);

#[tokio::test]
async fn a_cluster_recovers_in_place_and_a_failed_recovery_leaves_its_data_as_it_was() {
    let Some(running) = Running::start("pitr-in-place", RESYNC).await else {
        return;
    };
    let env = pgkube_testkit::testbed().expect("the test bed");
    let bucket = TestBucket::create(&env, "pitr-in-place").await;
    let cluster = start_source(&running, &env, &bucket, 2).await;
    let sql = cluster.sql().await.expect("SQL");
    sql.batch_execute(
        "CREATE TABLE items (id int PRIMARY KEY, name text);
         INSERT INTO items SELECT i, 'item ' || i FROM generate_series(1, 2000) i;
         CREATE TABLE ticks (id bigint PRIMARY KEY, at timestamptz NOT NULL, payload text);",
    )
    .await
    .expect("data written");
    finish_segments(&sql, 1).await.expect("a segment");
    cluster
        .wait_condition(CONTINUOUS_ARCHIVING, "True", CLUSTER_TIMEOUT)
        .await
        .expect("archiving works");
    write_ticks(&sql, 1, 50).await;
    physical_backup(&running, cluster.name(), "base").await;
    write_ticks(&sql, 51, 60).await;
    // The segment the recovery needs after the backup: it is corrupted for the first restore.
    let needed: String = sql
        .query_one("SELECT pg_walfile_name(pg_current_wal_lsn())", &[])
        .await
        .expect("a WAL file name")
        .get(0);
    write_ticks(&sql, 61, 100).await;
    let target = time_of(&sql, 76).await;
    let up_to_75 = ticks(&sql, 75).await;
    let all_items = items(&sql).await;
    archive_everything(&sql).await;
    let root = format!("{}/pg/wal/pg/", cluster.namespace());

    let key = format!("{root}{}/{needed}.zst", &needed[..8]);
    let original = bucket.object(&key).await.expect("the segment");
    corrupt(&bucket, &key, &original).await;
    let before = ticks(&sql, i64::MAX).await;
    let failed = recover_in_place(&running, &cluster, "broken", &target).await;
    let status = failed.status.clone().unwrap_or_default();
    assert_eq!(
        status.phase,
        Some(RestorePhase::Failed),
        "{}",
        describe_restore(&failed)
    );
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains(&format!("{needed}.zst is corrupt")),
        "{message}"
    );
    back_on_old_data(&cluster, &before).await;
    put_object(&bucket.client(), bucket.name(), &key, original)
        .await
        .expect("the segment put back");

    let (_, _, _, timeline_before) = primary_state(&cluster).await;
    let done = recover_in_place(&running, &cluster, "to-t", &target).await;
    let status = done.status.clone().unwrap_or_default();
    assert_eq!(
        status.phase,
        Some(RestorePhase::Completed),
        "{}",
        describe_restore(&done)
    );
    let (primary, on_primary, recovered_items, timeline) = primary_state(&cluster).await;
    assert_eq!(
        on_primary, up_to_75,
        "the primary holds the rows before {target}"
    );
    assert_eq!(recovered_items, all_items);
    assert!(timeline > timeline_before, "a new timeline: {timeline}");
    replica_holds(&cluster, &primary, &up_to_75).await;
    let previous = cluster
        .data_directory(&primary)
        .await
        .expect("the data directory")
        .with_extension(format!("before-{}", done.uid().unwrap_or_default()));
    assert!(
        previous.join("PG_VERSION").exists(),
        "the data from before is kept in {}",
        previous.display()
    );
    archives_on(&cluster, &bucket, &root, timeline).await;

    cluster
        .delete(Duration::from_secs(120))
        .await
        .expect("cluster deleted");
    running.stop().await;
    bucket.cleanup().await;
}

/// Switches to a new WAL file and waits until the last one is archived.
async fn archive_everything(sql: &Client) {
    let last = finish_segments(sql, 1).await.expect("a segment");
    wait_archived_through(sql, &last, CLUSTER_TIMEOUT)
        .await
        .expect("archived");
}

/// Replaces the archived object `key` with bytes that are not what was archived, its metadata
/// (the archiver's SHA-256 and size) kept.
async fn corrupt(bucket: &TestBucket, key: &str, original: &[u8]) {
    let s3 = bucket.client();
    let head = s3
        .head_object()
        .bucket(bucket.name())
        .key(key)
        .send()
        .await
        .expect("the segment's metadata");
    let mut garbage = original.to_vec();
    let middle = garbage.len() / 2;
    garbage[middle] ^= 0xff;
    s3.put_object()
        .bucket(bucket.name())
        .key(key)
        .set_metadata(head.metadata().cloned())
        .body(garbage.into())
        .send()
        .await
        .expect("the segment corrupted");
}

/// Creates a PointInTime restore of `cluster` to `time` and waits until it ended. While the
/// primary recovers, no pod is labelled the primary (`-rw` routes nowhere).
async fn recover_in_place(
    running: &Running,
    cluster: &TestCluster,
    name: &str,
    time: &str,
) -> pgkube_crds::PostgreSQLRestore {
    let spec = PostgreSQLRestoreSpec {
        backup: Some(LocalReference {
            name: "base".to_owned(),
        }),
        source: None,
        cluster: LocalReference {
            name: cluster.name().to_owned(),
        },
        databases: Vec::new(),
        drop_existing: false,
        expected_system_identifier: None,
        method: RestoreMethod::PointInTime,
        target: Some(RecoveryTarget {
            time: Some(time.to_owned()),
            ..RecoveryTarget::default()
        }),
    };
    let restore = create_restore(&running.client, running.namespace.name(), name, spec)
        .await
        .expect("restore created");
    let uid = restore.uid().unwrap_or_default();
    wait_until("the primary recovers, fenced", RECOVERY_TIMEOUT, || async {
        let Some(step) = in_place_step(cluster, &uid).await? else {
            return Ok(None);
        };
        if step.step == InPlaceStep::Recovering {
            let pods = running.api::<Pod>().list(&Default::default()).await?;
            let routed: Vec<String> = pods
                .items
                .iter()
                .filter(|pod| pod.labels().get(ROLE_LABEL).map(String::as_str) == Some("primary"))
                .map(ResourceExt::name_any)
                .collect();
            assert!(
                routed.is_empty(),
                "routed as the primary while it recovers: {routed:?}"
            );
        }
        Ok(Some(()))
    })
    .await
    .expect("the recovery started");
    wait_restore_ended(
        &running.client,
        running.namespace.name(),
        name,
        RECOVERY_TIMEOUT,
    )
    .await
    .expect("the restore ended")
}

/// The cluster's record of the in-place recovery `uid`, once it has one.
async fn in_place_step(
    cluster: &TestCluster,
    uid: &str,
) -> anyhow::Result<Option<InPlaceRecovery>> {
    let status = cluster.get().await?.status.unwrap_or_default();
    Ok(status.in_place_recovery.filter(|record| record.uid == uid))
}

/// After a failed recovery: the primary holds `before`, takes writes, and the replica streams
/// them.
async fn back_on_old_data(cluster: &TestCluster, before: &(i64, Option<i64>, Option<String>)) {
    let sql = wait_until("the primary answers again", CLUSTER_TIMEOUT, || async {
        Ok(cluster.sql().await.ok())
    })
    .await
    .expect("the primary");
    assert_eq!(&ticks(&sql, i64::MAX).await, before, "nothing lost");
    write_ticks(&sql, 101, 110).await;
    let after = ticks(&sql, i64::MAX).await;
    let primary = cluster
        .current_primary()
        .await
        .expect("the cluster")
        .expect("a primary");
    replica_holds(cluster, &primary, &after).await;
}

/// The primary's name, its rows, its items and its timeline.
async fn primary_state(
    cluster: &TestCluster,
) -> (
    String,
    (i64, Option<i64>, Option<String>),
    (i64, Option<String>),
    i64,
) {
    let sql = wait_until("the primary answers", CLUSTER_TIMEOUT, || async {
        Ok(cluster.sql().await.ok())
    })
    .await
    .expect("the primary");
    let timeline: i32 = sql
        .query_one("SELECT timeline_id FROM pg_control_checkpoint()", &[])
        .await
        .expect("the timeline")
        .get(0);
    let primary = cluster
        .current_primary()
        .await
        .expect("the cluster")
        .expect("a primary");
    (
        primary,
        ticks(&sql, i64::MAX).await,
        items(&sql).await,
        i64::from(timeline),
    )
}

/// Waits until the instance other than `primary` holds `expected`.
async fn replica_holds(
    cluster: &TestCluster,
    primary: &str,
    expected: &(i64, Option<i64>, Option<String>),
) {
    let replica = cluster
        .pods()
        .await
        .expect("pods")
        .into_iter()
        .find(|pod| pod.name != primary)
        .expect("a replica");
    wait_until(
        "the replica holds the primary's rows",
        CLUSTER_TIMEOUT,
        || async {
            let Ok(sql) = cluster.sql_to_pod(&replica.name).await else {
                return Ok(None);
            };
            Ok((&ticks(&sql, i64::MAX).await == expected).then_some(()))
        },
    )
    .await
    .expect("the replica streams");
}

/// New WAL of the recovered cluster is archived on its new timeline.
async fn archives_on(cluster: &TestCluster, bucket: &TestBucket, root: &str, timeline: i64) {
    let sql = cluster.sql().await.expect("SQL");
    write_ticks(&sql, 1001, 1010).await;
    archive_everything(&sql).await;
    let prefix = format!("{root}{timeline:08X}/");
    let keys = pgkube_testkit::list_objects(&bucket.client(), bucket.name(), &prefix)
        .await
        .expect("listing");
    assert!(!keys.is_empty(), "nothing archived under {prefix}");
}
