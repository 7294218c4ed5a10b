//! End to end on the test bed's real node: point-in-time recovery into new PostgreSQL 15
//! clusters from a physical backup and the WAL archive in the real Garage.
//!
//! A writer commits timestamped rows on a source cluster before and after a physical backup.
//! A cluster recovered to a time T between two of the later rows holds exactly the rows
//! committed before T, with the source's content; its replica clones from it; it archives under
//! its own prefix, and the source's archive is byte for byte what it was. A cluster recovered
//! from the archive alone (no backup named) to a restore point stops there, and one recovered to
//! a WAL location holds what was committed before it. Targets before the
//! first backup's end or after the last archived WAL are refused at once, naming the window,
//! and nothing is built for them.

mod common;
mod pitr_common;

use std::time::Duration;

use common::Running;
use common::real_node::{CLUSTER_TIMEOUT, NEVER, RESYNC, S3_SECRET};
use pgkube_crds::{
    BackupPhase, BackupStorage, Bootstrap, CONTINUOUS_ARCHIVING, LocalReference, PostgreSQLCluster,
    Recovery, RecoverySource, RecoveryTarget,
};
use pgkube_testkit::wal::{finish_segments, wait_archived_through};
use pgkube_testkit::{
    TestBucket, TestCluster, TestEnv, backup_config, list_objects, test_storage, wait_until,
};
use pitr_common::{
    archive_contents, items, physical_backup, start_source, ticks, time_of, write_ticks,
};

/// A recovery restores the base backup and replays the archive before the cluster runs.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(600);

#[tokio::test]
async fn a_new_cluster_recovers_to_a_time_or_restore_point_and_refuses_targets_outside_the_window()
{
    let Some(running) = Running::start("pitr", RESYNC).await else {
        return;
    };
    let env = pgkube_testkit::testbed().expect("the test bed");
    let bucket = TestBucket::create(&env, "pitr").await;
    let source = start_source(&running, &env, &bucket, 1).await;
    let sql = source.sql().await.expect("SQL");
    sql.batch_execute(
        "CREATE TABLE items (id int PRIMARY KEY, name text);
         INSERT INTO items SELECT i, 'item ' || i FROM generate_series(1, 2000) i;
         CREATE TABLE ticks (id bigint PRIMARY KEY, at timestamptz NOT NULL, payload text);",
    )
    .await
    .expect("data written");
    // A first file finished now: the server switches by itself only from its first checkpoint.
    finish_segments(&sql, 1).await.expect("a segment");
    source
        .wait_condition(CONTINUOUS_ARCHIVING, "True", CLUSTER_TIMEOUT)
        .await
        .expect("archiving works");
    write_ticks(&sql, 1, 50).await;
    let backup = physical_backup(&running, source.name(), "base").await;
    let status = backup.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Some(BackupPhase::Completed), "{status:?}");
    write_ticks(&sql, 51, 100).await;
    sql.batch_execute("SELECT pg_create_restore_point('after-150')")
        .await
        .expect("a restore point");
    write_ticks(&sql, 101, 120).await;
    let after_120: String = sql
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("the WAL location")
        .get(0);
    write_ticks(&sql, 121, 150).await;
    let last = finish_segments(&sql, 1).await.expect("a segment");
    wait_archived_through(&sql, &last, CLUSTER_TIMEOUT)
        .await
        .expect("archived");
    let target = time_of(&sql, 76).await;
    let moment: k8s_openapi::jiff::Timestamp = target.parse().expect("a time");
    // The status shows the last archived file as the primary reported it at a reconcile.
    let window = wait_until(
        "the source's window reaches the target",
        CLUSTER_TIMEOUT,
        || async {
            let status = source.get().await?.status.unwrap_or_default();
            Ok(status.recoverability.filter(|window| {
                window.first_backup.is_some()
                    && window
                        .last_point
                        .as_ref()
                        .is_some_and(|last| moment <= last.0)
            }))
        },
    )
    .await
    .expect("status.recoverability");
    let source_root = window.archive.clone();
    assert_eq!(source_root, format!("{}/pg/wal/pg/", source.namespace()));
    assert_eq!(window.first_backup.as_deref(), Some("base"));
    assert!(
        window
            .first_point
            .as_ref()
            .is_some_and(|first| first.0 <= moment),
        "{target} is after the window's first point: {window:?}"
    );
    let archive_before = archive_contents(&bucket, &source_root).await;

    refused_at_once(&running, &env, &bucket, &source_root).await;

    let by_time = recovered(&running, &env, &bucket, "by-time", 2, |recovery| {
        recovery.backup = Some(LocalReference {
            name: "base".to_owned(),
        });
        recovery.target = Some(RecoveryTarget {
            time: Some(target.clone()),
            ..RecoveryTarget::default()
        });
    })
    .await;
    let restored = by_time.sql().await.expect("SQL");
    assert_eq!(ticks(&restored, i64::MAX).await, ticks(&sql, 75).await);
    assert_eq!(items(&restored).await, items(&sql).await);
    let primary = by_time.current_primary().await.expect("the cluster");
    let replica = by_time
        .pods()
        .await
        .expect("pods")
        .into_iter()
        .find(|pod| Some(&pod.name) != primary.as_ref())
        .expect("a replica");
    let on_replica = by_time.sql_to_pod(&replica.name).await.expect("SQL");
    wait_until("the replica replays", CLUSTER_TIMEOUT, || async {
        Ok((ticks(&on_replica, i64::MAX).await == ticks(&sql, 75).await).then_some(()))
    })
    .await
    .expect("the replica holds the recovered data");
    own_archive_used(&bucket, by_time.namespace(), "by-time").await;

    let by_name = recovered(&running, &env, &bucket, "by-name", 1, |recovery| {
        recovery.source = Some(RecoverySource {
            storage: BackupStorage {
                s3: test_storage(&env, bucket.name(), S3_SECRET),
            },
            archive: source_root.clone(),
        });
        recovery.target = Some(RecoveryTarget {
            name: Some("after-150".to_owned()),
            ..RecoveryTarget::default()
        });
    })
    .await;
    let restored = by_name.sql().await.expect("SQL");
    assert_eq!(ticks(&restored, i64::MAX).await, ticks(&sql, 100).await);

    let by_lsn = recovered(&running, &env, &bucket, "by-lsn", 1, |recovery| {
        recovery.backup = Some(LocalReference {
            name: "base".to_owned(),
        });
        recovery.target = Some(RecoveryTarget {
            lsn: Some(after_120.clone()),
            ..RecoveryTarget::default()
        });
    })
    .await;
    let restored = by_lsn.sql().await.expect("SQL");
    assert_eq!(ticks(&restored, i64::MAX).await, ticks(&sql, 120).await);

    assert_eq!(
        archive_contents(&bucket, &source_root).await,
        archive_before,
        "the source's archive is untouched"
    );
    for cluster in [by_time, by_name, by_lsn, source] {
        cluster
            .delete(Duration::from_secs(120))
            .await
            .expect("cluster deleted");
    }
    running.stop().await;
    bucket.cleanup().await;
}

/// Targets before the backup's end and after the archive's end: refused at once with the
/// window named, and no StatefulSet made.
async fn refused_at_once(running: &Running, env: &TestEnv, bucket: &TestBucket, root: &str) {
    let source = RecoverySource {
        storage: BackupStorage {
            s3: test_storage(env, bucket.name(), S3_SECRET),
        },
        archive: root.to_owned(),
    };
    let cases = [
        ("too-early", "2000-01-01T00:00:00Z", "the earliest backup"),
        (
            "too-late",
            "2100-01-01T00:00:00Z",
            "outside the recoverable window",
        ),
    ];
    for (name, time, expected) in cases {
        let source = source.clone();
        let cluster = recovery_cluster(running, env, bucket, name, 1, |recovery| {
            recovery.source = Some(source);
            recovery.target = Some(RecoveryTarget {
                time: Some(time.to_owned()),
                ..RecoveryTarget::default()
            });
        })
        .create(&running.namespace)
        .await
        .expect("created");
        let message = wait_until(
            "the recovery is refused",
            Duration::from_secs(60),
            || async {
                let ready = pgkube_testkit::condition(&cluster.get().await?, "Ready");
                Ok(ready
                    .filter(|c| c.reason == "InvalidSpec")
                    .map(|c| c.message))
            },
        )
        .await
        .expect("refused");
        assert!(message.contains(expected), "{name}: {message}");
        assert!(
            message.contains("recovery target time"),
            "{name}: {message}"
        );
        let statefulsets = running
            .api::<k8s_openapi::api::apps::v1::StatefulSet>()
            .list(&Default::default())
            .await
            .expect("listed");
        assert!(
            statefulsets.items.iter().all(|s| !s
                .metadata
                .name
                .as_deref()
                .unwrap_or_default()
                .starts_with(name)),
            "nothing built for {name}"
        );
        cluster
            .delete(Duration::from_secs(60))
            .await
            .expect("deleted");
    }
}

/// A cluster `name` of `replicas` instances that recovers as `change` says, archiving to
/// `bucket` under its own prefix.
fn recovery_cluster(
    _running: &Running,
    env: &TestEnv,
    bucket: &TestBucket,
    name: &str,
    replicas: i32,
    change: impl FnOnce(&mut Recovery),
) -> pgkube_testkit::TestClusterBuilder {
    let mut recovery = Recovery {
        backup: None,
        source: None,
        target: None,
    };
    change(&mut recovery);
    let settings = backup_config(test_storage(env, bucket.name(), S3_SECRET), NEVER);
    TestCluster::builder(name)
        .replicas(replicas)
        .spec(|spec| {
            spec.backup = Some(settings);
            spec.bootstrap = Some(Bootstrap {
                backup: None,
                source: None,
                recovery: Some(recovery),
                initdb: None,
            });
        })
        .timeout(RECOVERY_TIMEOUT)
}

/// [`recovery_cluster`], once Running.
async fn recovered(
    running: &Running,
    env: &TestEnv,
    bucket: &TestBucket,
    name: &str,
    replicas: i32,
    change: impl FnOnce(&mut Recovery),
) -> TestCluster {
    let cluster = recovery_cluster(running, env, bucket, name, replicas, change)
        .start(&running.namespace)
        .await
        .unwrap_or_else(|error| panic!("{name} recovers and runs: {error:#}"));
    let status = cluster.get().await.map(|c| c.status).ok().flatten();
    let bootstrapped = cluster
        .get()
        .await
        .ok()
        .as_ref()
        .and_then(|c: &PostgreSQLCluster| pgkube_testkit::condition(c, "Bootstrapped"));
    assert!(
        bootstrapped.as_ref().is_some_and(|c| c.status == "True"),
        "{name}: {bootstrapped:?} {status:?}"
    );
    cluster
}

/// The recovered cluster archives under its own prefix: its new timeline's history is there.
async fn own_archive_used(bucket: &TestBucket, namespace: &str, cluster: &str) {
    let root = format!("{namespace}/{cluster}/wal/{cluster}/");
    wait_until(
        "the recovered cluster archives",
        CLUSTER_TIMEOUT,
        || async {
            let keys = list_objects(&bucket.client(), bucket.name(), &root).await?;
            Ok(keys
                .keys()
                .any(|key| key.ends_with(".history.zst"))
                .then_some(()))
        },
    )
    .await
    .expect("a history file in the recovered cluster's own archive");
}
