//! End to end on the test bed's real node (PostgreSQL 15): the operator never destroys the
//! cluster's data by its own hand when volumes are lost or a cluster is made again over its
//! volumes (issue 41).
//!
//! - A primary whose volume is wiped under its running pod does not make a new, empty
//!   database: the cluster fails over to a replica that has the data, and the wiped instance
//!   comes back as a copy of it. Every committed row is kept.
//! - With all volumes but one wiped, the survivor's data wins.
//! - A cluster bootstrapped from a backup, deleted (its volumes stay) and applied again
//!   unchanged keeps what was written after the bootstrap: the bootstrap is skipped, and the
//!   `Bootstrapped` condition says why.
//!
//! The failover tests use a failover delay long enough for a wiped instance to restart and
//! make a new database within it, as it did before it knew the cluster's database: then no
//! failover came, and the replicas copied the empty primary over their data.

mod common;

use std::time::Duration;

use common::Running;
use k8s_openapi::api::apps::v1::StatefulSet;
use pgkube_crds::{BackupPhase, Bootstrap, DeletionPolicy, LocalReference, PrimaryChangeKind};
use pgkube_testkit::{
    TestBucket, TestCluster, backup_config, condition, create_backup, create_s3_secret,
    test_storage, wait_backup_ended, wait_for_cluster, wait_until,
};
use serde_json::json;

const RESYNC: Duration = Duration::from_secs(30);
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(300);
const CHANGE_TIMEOUT: Duration = Duration::from_secs(240);
/// Long enough for a wiped instance to restart within it (see the module doc).
const FAILOVER_DELAY_SECONDS: u64 = 10;
const ROWS: i64 = 1000;
const CLUSTER: &str = "pg";
/// A schedule that never comes during a test: only the test's own backup runs.
const NEVER: &str = "0 0 1 1 *";
const S3_SECRET: &str = "s3-keys";

/// One 3-instance cluster at a time: two would fail over at once on a 2-core machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn pod(ordinal: usize) -> String {
    format!("{CLUSTER}-postgresql-{ordinal}")
}

/// A healthy 3-instance cluster with [`ROWS`] rows in `items`, replayed by both replicas;
/// returns it, its primary and its database's system identifier.
async fn healthy_cluster_with_rows(running: &Running) -> (TestCluster, String, String) {
    let cluster = TestCluster::builder(CLUSTER)
        .replicas(3)
        .timeout(CLUSTER_TIMEOUT)
        .extra_spec(json!({"highAvailability": {"failoverDelaySeconds": FAILOVER_DELAY_SECONDS}}))
        .start(&running.namespace)
        .await
        .unwrap_or_else(|error| panic!("a 3-instance cluster becomes Running: {error:#}"));
    let sql = cluster.sql().await.expect("login through rw");
    sql.batch_execute(&format!(
        "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, {ROWS});"
    ))
    .await
    .expect("rows through rw");
    drop(sql);
    let primary = cluster
        .wait_healthy(None, CHANGE_TIMEOUT)
        .await
        .expect("the replicas caught up");
    let identifier = cluster
        .system_identifier_of(&primary)
        .await
        .expect("the database's identifier");
    let recorded = cluster
        .get()
        .await
        .expect("the cluster")
        .status
        .and_then(|status| status.system_identifier);
    assert_eq!(
        recorded.as_deref(),
        Some(identifier.as_str()),
        "the status records the database's system identifier"
    );
    (cluster, primary, identifier)
}

async fn count_items(cluster: &TestCluster, pod: &str) -> i64 {
    cluster
        .sql_to_pod(pod)
        .await
        .unwrap_or_else(|error| panic!("login to {pod}: {error:#}"))
        .query_one("SELECT count(*) FROM items", &[])
        .await
        .unwrap_or_else(|error| panic!("rows of {pod}: {error:#}"))
        .get(0)
}

/// Wipes the volumes of `lost` (the primary first), then checks that the cluster fails over to
/// an instance that kept the data, that every row is there, and that each wiped instance
/// rejoins as a replica holding the same database.
async fn lose_volumes_and_recover(prefix: &str, lost: &[usize]) {
    let _serial = SERIAL.lock().await;
    let Some(running) = Running::start(prefix, RESYNC).await else {
        return;
    };
    let (cluster, primary, identifier) = healthy_cluster_with_rows(&running).await;
    assert_eq!(
        primary,
        pod(lost[0]),
        "the first volume lost is the primary's"
    );
    for &ordinal in lost {
        cluster
            .wipe_data(&pod(ordinal))
            .await
            .unwrap_or_else(|error| panic!("wiping the volume of {}: {error:#}", pod(ordinal)));
    }
    let change = cluster
        .wait_primary_change(PrimaryChangeKind::Failover, &primary, CHANGE_TIMEOUT)
        .await
        .unwrap_or_else(|error| {
            panic!("a failover away from the primary whose volume was wiped: {error:#}")
        });
    let new = change.to.clone();
    assert!(
        !lost.iter().any(|&ordinal| pod(ordinal) == new),
        "the new primary {new} is one whose volume was kept: {change:?}"
    );
    cluster
        .wait_writable("INSERT INTO items VALUES (0)", CHANGE_TIMEOUT)
        .await
        .expect("the new primary takes writes through rw");
    assert_eq!(count_items(&cluster, &new).await, ROWS + 1, "every row");
    for &ordinal in lost {
        let wiped = pod(ordinal);
        cluster
            .wait_rejoined(
                &wiped,
                &new,
                "SELECT count(*) = 1 FROM items WHERE id = 0",
                CHANGE_TIMEOUT,
            )
            .await
            .unwrap_or_else(|error| panic!("{wiped} comes back as a replica of {new}: {error:#}"));
        assert_eq!(
            cluster
                .system_identifier_of(&wiped)
                .await
                .expect("identifier"),
            identifier,
            "{wiped} holds the cluster's database, not a new one"
        );
        assert_eq!(count_items(&cluster, &wiped).await, ROWS + 1, "{wiped}");
    }
    cluster
        .wait_healthy(Some(&new), CHANGE_TIMEOUT)
        .await
        .expect("the cluster is healthy again");
    running.stop().await;
}

#[tokio::test]
async fn a_primary_whose_volume_is_wiped_rejoins_as_a_copy_and_no_row_is_lost() {
    lose_volumes_and_recover("identity-lost-volume", &[0]).await;
}

#[tokio::test]
async fn with_all_volumes_but_one_wiped_the_survivors_data_wins() {
    lose_volumes_and_recover("identity-two-lost", &[0, 1]).await;
}

/// A cluster bootstrapped from a backup, then deleted and applied again unchanged over its
/// volumes, keeps the rows written after its bootstrap.
#[tokio::test]
async fn a_cluster_bootstrapped_again_over_its_volumes_keeps_what_was_written_since() {
    let Some(running) = Running::start("identity-bootstrap-again", RESYNC).await else {
        return;
    };
    let Some(env) = pgkube_testkit::testbed() else {
        return;
    };
    let bucket = TestBucket::create(&env, "bootstrap-again").await;
    let namespace = running.namespace.name();
    create_s3_secret(&running.client, &env, namespace, S3_SECRET, None)
        .await
        .expect("S3 Secret");
    let storage = test_storage(&env, bucket.name(), S3_SECRET);
    let source = TestCluster::builder("source")
        .spec(|spec| spec.backup = Some(backup_config(storage, NEVER)))
        .timeout(CLUSTER_TIMEOUT)
        .start(&running.namespace)
        .await
        .unwrap_or_else(|error| panic!("the source cluster becomes Running: {error:#}"));
    source
        .sql()
        .await
        .expect("SQL")
        .batch_execute("CREATE TABLE seed (id int PRIMARY KEY); INSERT INTO seed VALUES (1);")
        .await
        .expect("seed data");
    create_backup(
        &running.client,
        namespace,
        "seed",
        "source",
        DeletionPolicy::Retain,
    )
    .await
    .expect("backup created");
    let backup = wait_backup_ended(&running.client, namespace, "seed", CLUSTER_TIMEOUT)
        .await
        .expect("the backup ends");
    assert_eq!(
        backup.status.and_then(|status| status.phase),
        Some(BackupPhase::Completed)
    );

    let bootstrap = Bootstrap {
        backup: Some(LocalReference {
            name: "seed".to_owned(),
        }),
        source: None,
        recovery: None,
        initdb: None,
    };
    let builder = || {
        let bootstrap = bootstrap.clone();
        TestCluster::builder("copy").spec(|spec| spec.bootstrap = Some(bootstrap))
    };
    let copy = builder()
        .create(&running.namespace)
        .await
        .expect("copy created");
    wait_bootstrapped(&running, "Restored").await;
    copy.sql()
        .await
        .expect("SQL")
        .batch_execute("CREATE TABLE later (id int); INSERT INTO later VALUES (42);")
        .await
        .expect("rows written after the bootstrap");

    copy.delete(CLUSTER_TIMEOUT).await.expect("copy deleted");
    // The garbage collector removes its StatefulSet and pods; the volumes stay.
    wait_until(
        "the StatefulSet of copy to be gone",
        CLUSTER_TIMEOUT,
        || async {
            let found = running
                .api::<StatefulSet>()
                .get_opt("copy-postgresql")
                .await?;
            Ok(found.is_none().then_some(()))
        },
    )
    .await
    .expect("the garbage collector removes the StatefulSet");
    let copy = builder()
        .create(&running.namespace)
        .await
        .expect("copy applied again");
    let again = wait_bootstrapped(&running, "ExistingData").await;
    let message = condition(&again, "Bootstrapped")
        .map(|c| c.message)
        .unwrap_or_default();
    assert!(
        message.contains("already hold database"),
        "the condition says why: {message}"
    );
    copy.wait_running(CLUSTER_TIMEOUT)
        .await
        .expect("the cluster runs on its own data");
    let later: i32 = copy
        .sql()
        .await
        .expect("SQL")
        .query_one("SELECT id FROM later", &[])
        .await
        .expect("the rows written after the bootstrap are still there")
        .get(0);
    assert_eq!(later, 42);
    copy.delete(CLUSTER_TIMEOUT).await.expect("copy deleted");
    source
        .delete(CLUSTER_TIMEOUT)
        .await
        .expect("source deleted");
    running.stop().await;
    bucket.cleanup().await;
}

/// Waits until cluster `copy` has `Bootstrapped` True with `reason`, and is Running.
async fn wait_bootstrapped(running: &Running, reason: &str) -> pgkube_crds::PostgreSQLCluster {
    wait_for_cluster(
        &running.client,
        running.namespace.name(),
        "copy",
        &format!("Bootstrapped True ({reason})"),
        CLUSTER_TIMEOUT,
        |cluster| {
            condition(cluster, "Bootstrapped")
                .is_some_and(|c| c.status == "True" && c.reason == reason)
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}"))
}
