//! End to end on the test bed's real node: a failover whose chosen target is lost mid-way.
//!
//! The primary of a 3-instance PostgreSQL 15 cluster hangs (its instance manager and its
//! postmaster frozen with `SIGSTOP`), so the operator fails over. As soon as the failover is
//! recorded, its target loses its data under its running pod (its postmaster killed, its
//! data directory removed): it comes back empty and waits for data, a target that can no
//! longer take over. The operator decides again and promotes the third instance. The test
//! checks that this happens within the failover delay plus [`REPLAN_SLACK`] of the target's
//! loss, that every committed row is on the new primary, and that both lost instances come
//! back as its replicas.

mod common;

use std::time::{Duration, Instant};

use common::Running;
use pgkube_crds::PrimaryChangeKind;
use pgkube_testkit::{Frozen, TestCluster, instance_manager_of, postmaster_of, wait_until};
use serde_json::json;

const RESYNC: Duration = Duration::from_secs(30);
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(300);
const CHANGE_TIMEOUT: Duration = Duration::from_secs(180);
const CLUSTER: &str = "pg";
const FAILOVER_DELAY_SECONDS: u64 = 5;
/// What the issue allows beyond the failover delay for the new decision and the promotion.
const REPLAN_SLACK: Duration = Duration::from_secs(10);
const ROWS: i32 = 1000;

/// Starts a healthy 3-instance cluster with [`ROWS`] rows in `items`, caught up on every
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
            &format!(
                "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, {ROWS});"
            ),
            CHANGE_TIMEOUT,
        )
        .await
        .unwrap_or_else(|error| panic!("a healthy 3-instance cluster with rows: {error:#}"))
}

/// Freezes the instance manager and the postmaster of `pod`: it answers nothing, and restarts
/// nothing, until the returned values are dropped.
fn freeze(namespace: &str, pod: &str) -> (Frozen, Frozen) {
    let manager = instance_manager_of(namespace, pod).expect("the instance manager");
    let postmaster = postmaster_of(namespace, pod).expect("the postmaster");
    let manager = Frozen::stop(manager).expect("SIGSTOP of the instance manager");
    let postmaster = Frozen::stop(postmaster).expect("SIGSTOP of the postmaster");
    (manager, postmaster)
}

/// Waits until a failover away from `old` is recorded; returns its target.
async fn recorded_target(cluster: &TestCluster, old: &str) -> String {
    wait_until("a failover to be recorded", CHANGE_TIMEOUT, || async {
        let status = cluster.get().await?.status.unwrap_or_default();
        Ok(status.target_primary.filter(|target| target != old))
    })
    .await
    .unwrap_or_else(|error| panic!("{error:#}"))
}

#[tokio::test]
async fn a_failover_whose_target_is_lost_promotes_another_replica() {
    let Some(running) = Running::start("lost-target", RESYNC).await else {
        return;
    };
    let namespace = running.namespace.name();
    let (cluster, old) = healthy_cluster_with_rows(&running).await;

    let frozen = freeze(namespace, &old);
    let lost = recorded_target(&cluster, &old).await;
    cluster
        .wipe_data(&lost)
        .await
        .unwrap_or_else(|error| panic!("the data of {lost} is lost: {error:#}"));
    let lost_at = Instant::now();

    let change = cluster
        .wait_primary_change(PrimaryChangeKind::Failover, &lost, CHANGE_TIMEOUT)
        .await
        .unwrap_or_else(|error| panic!("{error:#}"));
    let took = lost_at.elapsed();
    let new = change.to.clone();
    eprintln!("{new} promoted {took:?} after {lost} lost its data: {change:?}");
    assert!(
        new != old && new != lost,
        "the third instance is promoted: {change:?}"
    );
    let budget = Duration::from_secs(FAILOVER_DELAY_SECONDS) + REPLAN_SLACK;
    assert!(
        took <= budget,
        "{new} was promoted {took:?} after the target was lost (at most {budget:?})"
    );
    let on_new = cluster
        .sql_to_pod(&new)
        .await
        .expect("login to the new primary");
    let rows: i64 = on_new
        .query_one("SELECT count(*) FROM items", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows, i64::from(ROWS), "every committed row is on {new}");

    drop(frozen);
    on_new
        .execute("INSERT INTO items VALUES ($1)", &[&(ROWS + 1)])
        .await
        .expect("a write on the new primary");
    let written = format!("SELECT count(*) = 1 FROM items WHERE id = {}", ROWS + 1);
    for instance in [&old, &lost] {
        cluster
            .wait_rejoined(instance, &new, &written, CHANGE_TIMEOUT)
            .await
            .unwrap_or_else(|error| panic!("{instance} comes back as a replica: {error:#}"));
    }
    cluster
        .wait_healthy(Some(&new), CHANGE_TIMEOUT)
        .await
        .expect("the cluster is healthy again");
    running.stop().await;
}
