//! End to end on the test bed's two real nodes (issue 44): a 3-instance PostgreSQL 15 cluster
//! that tolerates the second node spreads over both (the default preferred anti-affinity on
//! `kubernetes.io/hostname`), and losing the primary's node fails over to the other.
//!
//! The primary is moved to `testbed-local-b` by a switchover if it is not there. A writer opens
//! a new connection through `<cluster>-rw` every 100 ms. Then the node is lost: its agent is
//! killed and its pods' processes die with it, while their objects stay bound to it. The
//! operator fails over to the instance on `testbed-local`, which then takes the writes. The
//! test prints the time from the loss to the first write acknowledged after it (the failover
//! bench measures it); it fails if no failover comes. The node comes back at the end, and its
//! old primary rejoins as a replica of the new one.
//!
//! A second test freezes the node instead (every process of it stopped, as behind a partition
//! or on a machine that hangs): the same failover, and once thawed, the old primary does not
//! take writes again (rw reaches the new primary) but rejoins as its replica.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::Running;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use pgkube_crds::{PrimaryChange, PrimaryChangeKind};
use pgkube_testkit::{
    FrozenNode, LOCAL_NODE, LostNode, RwWriter, SECOND_NODE, TestCluster, second_node_toleration,
    wait_until,
};
use serde_json::json;

const RESYNC: Duration = Duration::from_secs(30);
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(300);
const CHANGE_TIMEOUT: Duration = Duration::from_secs(180);
const CLUSTER: &str = "pg";

/// The node each instance pod is bound to, by pod.
async fn nodes_of(pods: &Api<Pod>) -> Vec<(String, String)> {
    let mut nodes = Vec::new();
    for ordinal in 0..3 {
        let name = format!("{CLUSTER}-postgresql-{ordinal}");
        if let Ok(Some(pod)) = pods.get_opt(&name).await {
            let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
            nodes.push((name, node));
        }
    }
    nodes
}

/// Both tests use the second node, which one of them loses: one at a time.
static SECOND_NODE_USERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A healthy 3-instance cluster spread over both nodes (checked), its primary on the second
/// node, with a table `items`; the pods' nodes.
async fn spread_with_primary_on_second_node(
    running: &Running,
) -> (TestCluster, String, Vec<(String, String)>) {
    let cluster = TestCluster::builder(CLUSTER)
        .replicas(3)
        .spec(|spec| spec.tolerations.push(second_node_toleration()))
        .timeout(CLUSTER_TIMEOUT)
        .start(&running.namespace)
        .await
        .unwrap_or_else(|error| panic!("a 3-instance cluster becomes Running: {error:#}"));
    let primary = cluster
        .wait_healthy(None, CHANGE_TIMEOUT)
        .await
        .expect("the cluster is healthy");
    let pods: Api<Pod> = Api::namespaced(running.client.clone(), running.namespace.name());
    let placed = nodes_of(&pods).await;
    let used: BTreeSet<&str> = placed.iter().map(|(_, node)| node.as_str()).collect();
    assert_eq!(
        used,
        BTreeSet::from([LOCAL_NODE, SECOND_NODE]),
        "the instances spread over both nodes: {placed:?}"
    );
    let on_second = |pod: &str| placed.iter().any(|(p, n)| p == pod && n == SECOND_NODE);
    let primary = if on_second(&primary) {
        primary
    } else {
        let target = placed
            .iter()
            .find(|(_, node)| node == SECOND_NODE)
            .map(|(pod, _)| pod.clone())
            .expect("a pod on the second node");
        cluster
            .api()
            .patch(
                CLUSTER,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    "db.example.com/switchover-to": target
                }}})),
            )
            .await
            .expect("switchover asked");
        cluster
            .wait_primary_change(PrimaryChangeKind::Switchover, &primary, CHANGE_TIMEOUT)
            .await
            .expect("the primary moves to the second node");
        cluster
            .wait_healthy(Some(&target), CHANGE_TIMEOUT)
            .await
            .expect("healthy with the primary on the second node")
    };
    cluster
        .sql()
        .await
        .expect("login through rw")
        .batch_execute("CREATE TABLE items (id int PRIMARY KEY)")
        .await
        .expect("a table");
    (cluster, primary, placed)
}

/// Waits for a failover away from `primary` to the instance on the first node, then for a
/// write acknowledged after `since`; returns the change and that write's delay.
async fn failover_to_first_node(
    cluster: &TestCluster,
    primary: &str,
    placed: &[(String, String)],
    writer: &RwWriter,
    since: Instant,
) -> (PrimaryChange, Duration) {
    let change = cluster
        .wait_primary_change(PrimaryChangeKind::Failover, primary, CHANGE_TIMEOUT)
        .await
        .expect("a failover away from the second node");
    assert!(
        placed
            .iter()
            .any(|(pod, node)| *pod == change.to && node == LOCAL_NODE),
        "the new primary {} runs on the first node: {placed:?}",
        change.to
    );
    let first = wait_until(
        "a write through rw after the failover",
        CHANGE_TIMEOUT,
        || async { Ok(writer.first_acknowledged_after(since)) },
    )
    .await
    .expect("writes go on after the failover");
    (change, first.duration_since(since))
}

#[tokio::test]
async fn instances_spread_over_two_nodes_and_the_loss_of_the_primarys_fails_over() {
    let _one_at_a_time = SECOND_NODE_USERS.lock().await;
    let Some(running) = Running::start("two-nodes", RESYNC).await else {
        return;
    };
    let (cluster, primary, placed) = spread_with_primary_on_second_node(&running).await;
    let writer = RwWriter::start(cluster.clone());
    writer
        .wait_for(0, 20, CHANGE_TIMEOUT)
        .await
        .expect("writes go through");

    let lost = LostNode::lose(running.env()).expect("the second node is lost");
    let (change, unavailable) =
        failover_to_first_node(&cluster, &primary, &placed, &writer, lost.lost_at).await;
    eprintln!(
        "node lost: the first write after it was acknowledged within {unavailable:?} ({})",
        change.reason
    );
    let written = writer.stop().await;
    eprintln!(
        "{} commits acknowledged, {} tries failed, writes unavailable for at most {:?}",
        written.acknowledged.len(),
        written.failures,
        written.longest_gap
    );

    lost.restore().expect("the second node comes back");
    cluster
        .wait_rejoined(&primary, &change.to, "SELECT true", CHANGE_TIMEOUT)
        .await
        .expect("the old primary rejoins as a replica of the new one");
    running.stop().await;
}

/// The primary's node frozen (every process of it stopped, as behind a partition): the
/// operator cannot reach the primary, fails over to the first node after the fence wait, and
/// the writes go on there. Once the node is thawed, its old primary does not take writes again
/// but rejoins as a replica of the new one.
#[tokio::test]
async fn the_primarys_node_frozen_fails_over_and_the_old_primary_rejoins_once_thawed() {
    let _one_at_a_time = SECOND_NODE_USERS.lock().await;
    let Some(running) = Running::start("frozen-node", RESYNC).await else {
        return;
    };
    let (cluster, primary, placed) = spread_with_primary_on_second_node(&running).await;
    let writer = RwWriter::start(cluster.clone());
    writer
        .wait_for(0, 20, CHANGE_TIMEOUT)
        .await
        .expect("writes go through");

    let frozen = FrozenNode::freeze(running.env()).expect("the second node is frozen");
    let (change, unavailable) =
        failover_to_first_node(&cluster, &primary, &placed, &writer, frozen.frozen_at).await;
    eprintln!(
        "node frozen: the first write after it was acknowledged within {:?} ({})",
        unavailable, change.reason
    );

    frozen.thaw();
    cluster
        .wait_rejoined(&primary, &change.to, "SELECT true", CHANGE_TIMEOUT)
        .await
        .expect("the old primary rejoins as a replica of the new one");
    let written = writer.stop().await;
    let on_new = cluster
        .sql_to_pod(&change.to)
        .await
        .expect("login to the new primary");
    let missing = written
        .missing_on(&on_new)
        .await
        .expect("acknowledged rows");
    eprintln!(
        "{} commits acknowledged, {} tries failed, {} not on the new primary (asynchronous replication)",
        written.acknowledged.len(),
        written.failures,
        missing.len()
    );
    let sql = cluster.sql().await.expect("login through rw");
    let in_recovery: bool = sql
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .expect("rw answers")
        .get(0);
    assert!(!in_recovery, "rw reaches a primary after the thaw");
    let host: String = sql
        .query_one("SELECT inet_server_addr()::text", &[])
        .await
        .expect("the server's address")
        .get(0);
    let new_primary_address = cluster
        .pods()
        .await
        .expect("pods")
        .into_iter()
        .find(|pod| pod.name == change.to)
        .and_then(|pod| pod.address)
        .expect("the new primary's address");
    assert!(
        host.starts_with(&new_primary_address.to_string()),
        "rw reaches the new primary {} ({new_primary_address}), not {host}",
        change.to
    );
    running.stop().await;
}
