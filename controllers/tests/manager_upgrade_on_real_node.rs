//! End to end on the test bed's real node: a pgkube upgrade restarts no PostgreSQL (issue 44).
//!
//! A 3-instance PostgreSQL 15 cluster runs under a writer that opens a new connection through
//! `<cluster>-rw` every 100 ms, and one more connection stays open. Then the operator is
//! restarted as a new pgkube would be: another agent image, and another binary (the node's
//! pgkube with bytes appended, so that its SHA-256 differs). The operator sends that binary to
//! each instance manager, which execs it in its own process.
//!
//! The test waits until every instance manager reports the new binary's digest, then checks
//! that nothing restarted: the same pods, the same container restart counts, the same
//! instance manager and postmaster processes, the same `pg_postmaster_start_time()`; that the
//! StatefulSet was not changed (its generation and its installer image); that the connection
//! held open still works; that no primary change happened; and that every acknowledged commit
//! is on the primary. Without the in-place upgrade, the digests never change; with a template
//! that follows the agent image, the pods are replaced.

mod common;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use common::Running;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use pgkube_controllers::cluster::manager_upgrade::OwnBinary;
use pgkube_testkit::{
    RwWriter, TestCluster, instance_manager_of, node_pgkube_binary, postmaster_of, wait_until,
};

const RESYNC: Duration = Duration::from_secs(30);
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(300);
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(180);
const CLUSTER: &str = "pg";
const NEW_AGENT_IMAGE: &str = "ghcr.io/pgkube/pgkube:next";

/// What must not change in one instance.
#[derive(Debug, PartialEq, Eq)]
struct Instance {
    uid: String,
    restarts: i32,
    manager_pid: Option<u32>,
    postmaster_pid: Option<u32>,
    postmaster_started: String,
}

async fn instances(running: &Running, cluster: &TestCluster) -> BTreeMap<String, Instance> {
    let namespace = running.namespace.name();
    let mut now = BTreeMap::new();
    for pod in cluster.pods().await.expect("pods") {
        let live: Pod = Api::namespaced(running.client.clone(), namespace)
            .get(&pod.name)
            .await
            .expect("pod");
        let restarts = live
            .status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default()
            .iter()
            .find(|c| c.name == "postgresql")
            .map_or(-1, |c| c.restart_count);
        let started = cluster
            .sql_to_pod(&pod.name)
            .await
            .expect("login to the pod")
            .query_one("SELECT pg_postmaster_start_time()::text", &[])
            .await
            .expect("start time")
            .get::<_, String>(0);
        now.insert(
            pod.name.clone(),
            Instance {
                uid: pod.uid.clone(),
                restarts,
                manager_pid: instance_manager_of(namespace, &pod.name),
                postmaster_pid: postmaster_of(namespace, &pod.name),
                postmaster_started: started,
            },
        );
    }
    now
}

/// The binary digest each instance manager reports.
async fn digests(cluster: &TestCluster) -> BTreeMap<String, Option<String>> {
    let mut digests = BTreeMap::new();
    for pod in cluster.pods().await.expect("pods") {
        let digest = match pod.address {
            Some(ip) => cluster
                .instance_status(&pod.name, ip)
                .await
                .ok()
                .and_then(|status| status["managerDigest"].as_str().map(str::to_owned)),
            None => None,
        };
        digests.insert(pod.name, digest);
    }
    digests
}

/// The installer image and generation of the StatefulSet.
async fn statefulset(running: &Running) -> (Option<String>, Option<i64>) {
    let sts: StatefulSet = Api::namespaced(running.client.clone(), running.namespace.name())
        .get(&format!("{CLUSTER}-postgresql"))
        .await
        .expect("StatefulSet");
    let image = sts
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.init_containers.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.image.clone());
    (image, sts.metadata.generation)
}

/// A copy of `binary` with bytes appended: it runs the same, and its digest differs.
fn another_build_of(binary: &std::path::Path, dir: &std::path::Path) -> OwnBinary {
    std::fs::create_dir_all(dir).expect("scratch dir");
    let copy = dir.join("pgkube");
    std::fs::copy(binary, &copy).expect("copy the binary");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&copy)
        .and_then(|mut file| file.write_all(b"\npgkube upgrade test\n"))
        .expect("append to the copy");
    OwnBinary::read(&copy).expect("hash the copy")
}

#[tokio::test]
async fn a_new_pgkube_replaces_the_instance_managers_and_restarts_no_postgresql() {
    let node_binary = node_pgkube_binary();
    let current = OwnBinary::read(&node_binary).expect("the node's pgkube binary (cargo build)");
    let Some(mut running) = Running::start_with("manager-upgrade", RESYNC, |settings| {
        settings.instance_manager_binary = Some(Arc::new(current.clone()));
    })
    .await
    else {
        return;
    };
    let namespace = running.namespace.name().to_owned();
    let cluster = TestCluster::builder(CLUSTER)
        .replicas(3)
        .timeout(CLUSTER_TIMEOUT)
        .start(&running.namespace)
        .await
        .unwrap_or_else(|error| panic!("a 3-instance cluster becomes Running: {error:#}"));
    let primary = cluster
        .wait_healthy(None, UPGRADE_TIMEOUT)
        .await
        .expect("the cluster is healthy");
    let held = cluster.sql().await.expect("login through rw");
    held.batch_execute("CREATE TABLE items (id int PRIMARY KEY)")
        .await
        .expect("a table");
    let before = instances(&running, &cluster).await;
    assert_eq!(before.len(), 3, "{before:?}");
    let (image_before, generation_before) = statefulset(&running).await;
    assert!(
        digests(&cluster)
            .await
            .values()
            .all(|d| d.as_deref() == Some(current.digest.as_str())),
        "every instance manager runs the node's binary"
    );
    let writer = RwWriter::start(cluster.clone());
    writer
        .wait_for(0, 20, UPGRADE_TIMEOUT)
        .await
        .expect("writes go through");

    let scratch = std::env::temp_dir().join(format!("pgkube-{namespace}"));
    let next = another_build_of(&node_binary, &scratch);
    assert_ne!(next.digest, current.digest);
    running
        .restart_with(|settings| {
            settings.agent_image = NEW_AGENT_IMAGE.to_owned();
            settings.instance_manager_binary = Some(Arc::new(next.clone()));
        })
        .await;
    wait_until(
        "every instance manager to run the new binary",
        UPGRADE_TIMEOUT,
        || async {
            let digests = digests(&cluster).await;
            let done = digests.len() == 3
                && digests
                    .values()
                    .all(|d| d.as_deref() == Some(next.digest.as_str()));
            Ok(done.then_some(()))
        },
    )
    .await
    .expect("every instance manager runs the new binary");
    let healthy = cluster
        .wait_healthy(Some(&primary), UPGRADE_TIMEOUT)
        .await
        .expect("the cluster is healthy after the upgrade, on the same primary");
    assert_eq!(healthy, primary);
    writer
        .wait_for(writer.count(), 20, UPGRADE_TIMEOUT)
        .await
        .expect("writes go on");
    let written = writer.stop().await;
    eprintln!(
        "{} commits acknowledged, {} tries failed, writes unavailable for at most {:?}",
        written.acknowledged.len(),
        written.failures,
        written.longest_gap
    );

    let after = instances(&running, &cluster).await;
    assert_eq!(after, before, "no pod, container or server restarted");
    assert_eq!(
        statefulset(&running).await,
        (image_before, generation_before),
        "the StatefulSet is unchanged by the operator upgrade"
    );
    held.query_one("SELECT 1", &[])
        .await
        .expect("the connection held open works after the upgrade");
    let status = cluster
        .get()
        .await
        .expect("cluster")
        .status
        .unwrap_or_default();
    assert_eq!(status.primary_change, None, "no switchover or failover");
    assert_eq!(written.failures, 0, "no write failed during the upgrade");
    let missing = written.missing_on(&held).await.expect("acknowledged rows");
    assert!(missing.is_empty(), "acknowledged commits lost: {missing:?}");
    std::fs::remove_dir_all(&scratch).expect("clean up the copy");
    running.stop().await;
}
