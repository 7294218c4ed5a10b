//! End to end on the test bed's real node: the primary of a 3-instance PostgreSQL 15 cluster
//! whose postmaster hangs — frozen with `SIGSTOP`, not killed. Its backends run on (its clients
//! and its instance manager's own connection still get answers) and its instance manager
//! answers, but no new client can connect.
//!
//! The instance manager's new connection of each tick gets no answer, so it reports a primary
//! that is not ready; the operator fails over after `failoverDelaySeconds`, and the old primary,
//! told to follow, is killed by its manager (a frozen postmaster handles no shutdown signal)
//! before the new one is promoted. The test checks that a write goes through `-rw` within the
//! delay plus the detection ([`DETECTION`]) and [`FAILOVER_SLACK`], that every row committed
//! before is on the new primary, that the old primary's client lost its connection (it took no
//! write once another primary did), that no two pods were ever labelled primary, and that,
//! after `SIGCONT`, the old primary is a replica streaming from the new one.

mod common;

use std::time::Duration;

use common::Running;
use pgkube_crds::PrimaryChangeKind;
use pgkube_testkit::{Frozen, RoleSampler, TestCluster, postmaster_of, tokio_postgres};
use serde_json::json;

const RESYNC: Duration = Duration::from_secs(30);
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(300);
const CHANGE_TIMEOUT: Duration = Duration::from_secs(180);
const CLUSTER: &str = "pg";
/// `spec.highAvailability.failoverDelaySeconds` of the test cluster.
const FAILOVER_DELAY_SECONDS: u64 = 3;
/// How long the instance manager takes to see that its postmaster hangs: a new connection gets
/// 3 s, once a watch period (2 s).
const DETECTION: Duration = Duration::from_secs(5);
/// The "few seconds" a failover may take beyond the delay and the detection: the operator
/// noticing, the old primary killed, the promotion, the role label moving, a new connection.
const FAILOVER_SLACK: Duration = Duration::from_secs(12);

async fn count_items(sql: &tokio_postgres::Client) -> i64 {
    sql.query_one("SELECT count(*) FROM items", &[])
        .await
        .expect("count")
        .get(0)
}

/// Starts a healthy 3-instance cluster with 1000 rows in `items`, caught up on every
/// replica; returns it and its primary.
async fn healthy_cluster_with_rows(running: &Running) -> (TestCluster, String) {
    TestCluster::builder(CLUSTER)
        .replicas(3)
        .timeout(CLUSTER_TIMEOUT)
        .extra_spec(json!({
            "highAvailability": {"failoverDelaySeconds": FAILOVER_DELAY_SECONDS},
        }))
        .start_healthy(
            &running.namespace,
            "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, 1000);",
            CHANGE_TIMEOUT,
        )
        .await
        .unwrap_or_else(|error| panic!("a healthy 3-instance cluster with rows: {error:#}"))
}

#[tokio::test]
async fn a_primary_whose_postmaster_hangs_is_failed_over_fenced_and_rejoins() {
    let Some(running) = Running::start("hung-primary", RESYNC).await else {
        return;
    };
    let namespace = running.namespace.name();
    let (cluster, old) = healthy_cluster_with_rows(&running).await;
    // A client of the old primary, connected before the freeze: its backend runs on.
    let held = cluster
        .sql_to_pod(&old)
        .await
        .expect("login to the primary");
    let postmaster =
        postmaster_of(namespace, &old).unwrap_or_else(|| panic!("the postmaster of {old}"));
    let sampler = RoleSampler::start(&cluster)
        .await
        .expect("sampling the pods");

    let frozen = Frozen::stop(postmaster).expect("SIGSTOP of the postmaster");
    held.execute("SELECT 1", &[])
        .await
        .expect("the old primary's backend answers while its postmaster is frozen");
    let budget = Duration::from_secs(FAILOVER_DELAY_SECONDS) + DETECTION + FAILOVER_SLACK;
    let took = cluster
        .wait_writable("INSERT INTO items VALUES (1001)", budget)
        .await
        .unwrap_or_else(|error| panic!("a write through rw after {old} hung: {error:#}"));
    eprintln!("the first write through rw {took:?} after the postmaster of {old} was frozen");
    let change = cluster
        .wait_primary_change(PrimaryChangeKind::Failover, &old, CHANGE_TIMEOUT)
        .await
        .unwrap_or_else(|error| panic!("{error:#}"));
    let new = change.to.clone();
    assert!(
        change.reason.contains("not ready"),
        "the failover says why: {change:?}"
    );

    // Fenced: the frozen postmaster was killed, and its client's backend with it, before the
    // new primary took writes.
    assert_ne!(
        postmaster_of(namespace, &old),
        Some(postmaster),
        "the frozen postmaster still runs"
    );
    let refused = held.execute("INSERT INTO items VALUES (2000)", &[]).await;
    assert!(
        refused.is_err(),
        "the old primary's client could write after the failover"
    );
    let on_new = cluster
        .sql_to_pod(&new)
        .await
        .expect("login to the new primary");
    assert_eq!(count_items(&on_new).await, 1001, "every committed row");

    drop(frozen);
    cluster
        .wait_rejoined(
            &old,
            &new,
            "SELECT count(*) = 1 FROM items WHERE id = 1001",
            CHANGE_TIMEOUT,
        )
        .await
        .expect("the old primary comes back as a replica of the new one");
    cluster
        .wait_healthy(Some(&new), CHANGE_TIMEOUT)
        .await
        .expect("the cluster is healthy again");
    sampler.finish().await;
    running.stop().await;
}
