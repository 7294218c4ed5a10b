//! End to end on the test bed's real node: a rolling update of a 3-instance PostgreSQL 15
//! cluster under writes (issue 44). A client writes through `<cluster>-rw` every 100 ms, each
//! time on a new connection; then the pod template changes (the CPU request in
//! `spec.resources`).
//!
//! The replicas are replaced first, one at a time; then the primary moves by a switchover,
//! recorded in `status.primaryChange` with a `rolling update` reason; its pod is replaced last.
//! The test checks that no failover happened (the only change recorded is that switchover),
//! that the old primary's pod was made last, that every commit the client saw acknowledged is
//! on the new primary, and, from samples of the pods every 100 ms, that no two pods were ever
//! labelled primary. It prints the longest time writes were unavailable; the failover bench
//! measures it. Before issue 44 the StatefulSet controller replaced the pods from the highest
//! ordinal down, the primary with them, without a switchover: the test then fails waiting for
//! it.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::Running;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use pgkube_crds::PrimaryChangeKind;
use pgkube_testkit::{RoleSampler, RwWriter, TestCluster, wait_until};
use serde_json::json;

const RESYNC: Duration = Duration::from_secs(30);
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(300);
const CHANGE_TIMEOUT: Duration = Duration::from_secs(240);
const CLUSTER: &str = "pg";

fn pod(ordinal: usize) -> String {
    format!("{CLUSTER}-postgresql-{ordinal}")
}

/// Each instance pod's uid and creation time, by name.
async fn pods_now(pods: &Api<Pod>) -> BTreeMap<String, (String, String)> {
    let mut now = BTreeMap::new();
    for ordinal in 0..3 {
        if let Ok(Some(live)) = pods.get_opt(&pod(ordinal)).await {
            let created = live
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|time| time.0.to_string())
                .unwrap_or_default();
            now.insert(pod(ordinal), (live.uid().unwrap_or_default(), created));
        }
    }
    now
}

#[tokio::test]
async fn a_new_pod_template_replaces_the_replicas_then_switches_over_losing_no_commit() {
    let Some(running) = Running::start("rolling-update", RESYNC).await else {
        return;
    };
    let cluster = TestCluster::builder(CLUSTER)
        .replicas(3)
        .timeout(CLUSTER_TIMEOUT)
        .start(&running.namespace)
        .await
        .unwrap_or_else(|error| panic!("a 3-instance cluster becomes Running: {error:#}"));
    let old_primary = cluster
        .wait_healthy(None, CHANGE_TIMEOUT)
        .await
        .expect("the cluster is healthy");
    cluster
        .sql()
        .await
        .expect("login through rw")
        .batch_execute("CREATE TABLE items (id int PRIMARY KEY)")
        .await
        .expect("a table");
    let pods: Api<Pod> = Api::namespaced(running.client.clone(), running.namespace.name());
    let before = pods_now(&pods).await;
    assert_eq!(before.len(), 3);
    let sampler = RoleSampler::start(&cluster)
        .await
        .expect("sampling the pods");
    let writer = RwWriter::start(cluster.clone());
    writer
        .wait_for(0, 20, CHANGE_TIMEOUT)
        .await
        .expect("writes go through");

    // The CPU request only: a memory request would change the memory settings too, whose
    // restart moves the primary by a planned restart first.
    let resources = json!({"requests": {"cpu": "10m"}});
    cluster
        .api()
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": resources}})),
        )
        .await
        .expect("resources changed");
    let change = cluster
        .wait_primary_change(PrimaryChangeKind::Switchover, &old_primary, CHANGE_TIMEOUT)
        .await
        .unwrap_or_else(|error| panic!("the primary moves by a switchover: {error:#}"));
    assert!(
        change.reason.starts_with("rolling update"),
        "the switchover says why: {change:?}"
    );
    let new_primary = change.to.clone();
    let after = wait_until("every pod to be replaced", CHANGE_TIMEOUT, || async {
        let now = pods_now(&pods).await;
        let replaced = now.len() == 3
            && now
                .iter()
                .all(|(name, (uid, _))| before.get(name).is_some_and(|(old, _)| old != uid));
        Ok(replaced.then_some(now))
    })
    .await
    .expect("every pod replaced");
    let created = |name: &str| after.get(name).map(|(_, created)| created.clone());
    for ordinal in 0..3 {
        let name = pod(ordinal);
        if name != old_primary {
            assert!(
                created(&name) <= created(&old_primary),
                "{name} was replaced before the old primary {old_primary}: {after:?}"
            );
        }
    }
    cluster
        .wait_healthy(Some(&new_primary), CHANGE_TIMEOUT)
        .await
        .expect("the cluster is healthy on the new template");
    writer
        .wait_for(writer.count(), 20, CHANGE_TIMEOUT)
        .await
        .expect("writes go on");
    let written = writer.stop().await;
    eprintln!(
        "{} commits acknowledged, {} tries failed, writes unavailable for at most {:?}; {}",
        written.acknowledged.len(),
        written.failures,
        written.longest_gap,
        change.reason
    );
    let status = cluster
        .get()
        .await
        .expect("the cluster")
        .status
        .unwrap_or_default();
    assert_eq!(
        status.primary_change.map(|change| change.kind),
        Some(PrimaryChangeKind::Switchover),
        "no failover after the switchover"
    );
    for ordinal in 0..3 {
        let live = pods.get(&pod(ordinal)).await.expect("pod");
        let requests = live
            .spec
            .and_then(|spec| spec.containers.into_iter().find(|c| c.name == "postgresql"))
            .and_then(|container| container.resources)
            .and_then(|resources| resources.requests)
            .and_then(|requests| requests.get("cpu").cloned());
        assert_eq!(
            requests.map(|cpu| cpu.0),
            Some("10m".to_owned()),
            "{} runs the new template",
            pod(ordinal)
        );
    }

    let on_new = cluster
        .sql_to_pod(&new_primary)
        .await
        .expect("login to the new primary");
    let missing = written
        .missing_on(&on_new)
        .await
        .expect("acknowledged rows");
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged commits lost: {missing:?}",
        missing.len(),
        written.acknowledged.len()
    );
    sampler.finish().await;
    running.stop().await;
}
