//! End to end on the test bed's real node: the primary of a 2-instance PostgreSQL 15 cluster is
//! cut off by a network partition (packet drops on loopback, [`Partition`]) from the API
//! server, its replica and the operator, while it stays alive and a client of the test keeps a
//! session to it, writing a row every 50 ms.
//!
//! Its instance manager hears from neither the API server nor the replica for
//! `isolationTimeoutSeconds` (3) and stops its server; the operator, which cannot reach it,
//! fails over after `failoverDelaySeconds` (5). The test checks that the client's last
//! successful commit on the old primary came before the new primary was promoted (the time
//! its timeline history file was written), that the client lost its session, and that, once
//! the partition heals, the old primary comes back as a replica of the new one.

mod common;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use common::Running;
use pgkube_crds::PrimaryChangeKind;
use pgkube_testkit::{POSTGRES_PORT, Partition, TestCluster, tokio_postgres};
use serde_json::json;

const RESYNC: Duration = Duration::from_secs(30);
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(300);
const CHANGE_TIMEOUT: Duration = Duration::from_secs(180);
const CLUSTER: &str = "pg";
const FAILOVER_DELAY_SECONDS: u64 = 5;
const ISOLATION_TIMEOUT_SECONDS: u64 = 3;
/// How long the writer goes on after the new primary answers as one: without a fence, it
/// would commit on the old primary all along.
const AFTER_PROMOTION: Duration = Duration::from_secs(5);
const WRITE_PERIOD: Duration = Duration::from_millis(50);

/// What the client of the old primary saw.
#[derive(Debug, Default)]
struct Writes {
    committed: u64,
    /// Commit time (`clock_timestamp()`, seconds since the epoch) of the last row that went in.
    last_commit: Option<f64>,
    /// The error that ended the session, if one did.
    ended_by: Option<String>,
}

/// Writes a row every [`WRITE_PERIOD`] until an error or `stop`.
async fn write_until(
    client: tokio_postgres::Client,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Writes {
    let mut writes = Writes::default();
    while !*stop.borrow() {
        let insert = "INSERT INTO writes DEFAULT VALUES RETURNING extract(epoch FROM at)::float8";
        match client.query_one(insert, &[]).await {
            Ok(row) => {
                writes.committed += 1;
                writes.last_commit = Some(row.get(0));
            }
            Err(error) => {
                writes.ended_by = Some(error.to_string());
                break;
            }
        }
        tokio::time::sleep(WRITE_PERIOD).await;
    }
    writes
}

/// When `pod` was last promoted: the modification time of its newest timeline history file,
/// which the promotion writes (seconds since the epoch).
async fn promoted_at(sql: &tokio_postgres::Client) -> anyhow::Result<f64> {
    let row = sql
        .query_one(
            "SELECT extract(epoch FROM max((pg_stat_file('pg_wal/' || name)).modification))::float8 \
             FROM pg_ls_dir('pg_wal') AS name WHERE name LIKE '%.history'",
            &[],
        )
        .await?;
    row.try_get::<_, Option<f64>>(0)?
        .ok_or_else(|| anyhow::anyhow!("no timeline history file: never promoted"))
}

async fn address_of(cluster: &TestCluster, pod: &str) -> std::net::Ipv4Addr {
    let pods = cluster.pods().await.expect("the cluster's pods");
    let address = pods
        .iter()
        .find(|found| found.name == pod)
        .and_then(|found| found.address);
    match address {
        Some(IpAddr::V4(address)) => address,
        other => panic!("{pod} has no IPv4 address: {other:?}"),
    }
}

/// Starts a healthy 2-instance cluster with the table `writes`; returns it and its primary.
async fn healthy_cluster(running: &Running) -> (TestCluster, String) {
    TestCluster::builder(CLUSTER)
        .replicas(2)
        .timeout(CLUSTER_TIMEOUT)
        .extra_spec(json!({"highAvailability": {
            "failoverDelaySeconds": FAILOVER_DELAY_SECONDS,
            "isolationTimeoutSeconds": ISOLATION_TIMEOUT_SECONDS,
        }}))
        .start_healthy(
            &running.namespace,
            "CREATE TABLE writes (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp())",
            CHANGE_TIMEOUT,
        )
        .await
        .unwrap_or_else(|error| panic!("a healthy 2-instance cluster: {error:#}"))
}

#[tokio::test]
async fn a_partitioned_primary_takes_no_write_once_another_is_promoted() {
    let Some(running) = Running::start("partitioned-primary", RESYNC).await else {
        return;
    };
    let (cluster, old) = healthy_cluster(&running).await;
    let held = cluster
        .sql_to_pod(&old)
        .await
        .expect("login to the primary");
    let address = address_of(&cluster, &old).await;

    let partition =
        Partition::isolate(address, POSTGRES_PORT).expect("the primary is cut off with tc");
    let cut_at = Instant::now();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(write_until(held, stopped));

    let change = cluster
        .wait_primary_change(PrimaryChangeKind::Failover, &old, CHANGE_TIMEOUT)
        .await
        .unwrap_or_else(|error| panic!("{error:#}"));
    let new = change.to.clone();
    let on_new = cluster
        .sql_to_pod(&new)
        .await
        .expect("login to the new primary");
    let promoted = promoted_at(&on_new)
        .await
        .expect("the new primary's promotion time");
    eprintln!(
        "{new} promoted {:?} after {old} was cut off",
        cut_at.elapsed()
    );
    tokio::time::sleep(AFTER_PROMOTION).await;
    let _ = stop.send(true);
    let writes = writer.await.expect("the writer");
    eprintln!("the old primary's client: {writes:?}; promoted at {promoted:.3}");

    assert!(
        writes.committed > 0,
        "the client wrote before the partition: {writes:?}"
    );
    let last_commit = writes.last_commit.expect("a commit time");
    assert!(
        last_commit < promoted,
        "the old primary took a write {:.3}s after {new} was promoted: {writes:?}",
        last_commit - promoted
    );
    assert!(
        writes.ended_by.is_some(),
        "the old primary's session still works after the failover: {writes:?}"
    );

    partition.heal().expect("the partition heals");
    let marker = on_new
        .query_one("INSERT INTO writes DEFAULT VALUES RETURNING id", &[])
        .await
        .expect("a write on the new primary")
        .get::<_, i64>(0);
    cluster
        .wait_rejoined(
            &old,
            &new,
            &format!("SELECT count(*) = 1 FROM writes WHERE id = {marker}"),
            CHANGE_TIMEOUT,
        )
        .await
        .expect("the old primary comes back as a replica of the new one");
    cluster
        .wait_healthy(Some(&new), CHANGE_TIMEOUT)
        .await
        .expect("the cluster is healthy again");
    running.stop().await;
}
