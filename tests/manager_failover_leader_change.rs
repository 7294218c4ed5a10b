//! A leader change of the manager in the middle of a failover still ends with exactly one
//! primary (issue 16). Real `pgkube run` processes, two candidates for one Lease with short
//! timings, watch a test namespace with a 3-instance PostgreSQL 15 cluster on the test bed's
//! real node (`failoverDelaySeconds` 1).
//!
//! The primary's postmaster is killed (`kill -9`). As soon as a watch of the cluster shows the
//! failover decided (`status.targetPrimary` set), the test freezes (`SIGSTOP`) the instance
//! manager of the replica chosen, then kills (`kill -9`) the manager that holds the Lease.
//!
//! Why the freeze: left alone, the leader sends the promotion 50 to 200 ms after it recorded
//! the decision (its next reconcile: labels, status, then the commands) and marks the failover
//! completed a few hundred milliseconds later, so a kill "in the middle" would be a matter of
//! luck. With the target's instance manager stopped, the promotion cannot happen (the instance
//! manager promotes with `SELECT pg_promote()` when told to, and it runs no code) and the
//! target cannot report itself primary, so the failover cannot complete, whatever the leader
//! does before it dies. The test checks what the leader left behind a moment after its death:
//! `status.primaryChange` a Failover without `completedAt`, `currentPrimary` still the old
//! primary, and the target's postgres still a standby (it runs on; only its instance manager
//! is stopped). That last check relies on the watch and the `kill -s STOP` (a few
//! milliseconds) beating the leader's next reconcile (tens of milliseconds at least); it fails,
//! saying so, if the leader promoted the target first. Once the other manager holds the Lease
//! and has run its controllers for a few seconds (the target unreachable, it must keep the
//! recorded target, not decide anew), the target is let go (`SIGCONT`): from the status alone,
//! the new leader carries the failover through (it prints whether it sent the promotion
//! itself; a promotion request the old leader had sent just before the freeze may also be
//! served once the instance manager runs again, which promotes the same target).
//!
//! It checks the end: exactly one primary (`status.currentPrimary` the target, the failover
//! completed, one pod labelled primary), writes through `-rw` work, every row committed before
//! the kill is there, and the old primary rejoins as a replica of the target; and, from samples
//! of the pods every 100 ms from before the kill to the end, that no two pods ever carried
//! `db.example.com/role=primary` and `-rw` never resolved to two pods.

mod manager_common;

use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{WatchEvent, WatchParams};
use kube::{Api, ResourceExt as _};
use manager_common::{Manager, SHORT_LEASE_DURATION, SHORT_LEASE_FLAGS, lease_holder};
use pgkube_crds::{HighAvailability, PostgreSQLCluster, PrimaryChangeKind};
use pgkube_testkit::{
    Frozen, RoleSampler, TestCluster, TestEnv, TestNamespace, install_crds, instance_manager_of,
    postmaster_of, send_signal, testbed, wait_until,
};

const LEASE: &str = "pgkube-failover-leader";
const CLUSTER: &str = "pg";
const FAILOVER_DELAY_SECONDS: u32 = 1;
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(300);
const CHANGE_TIMEOUT: Duration = Duration::from_secs(180);
/// From the kill of the primary's postmaster to the failover recorded: the delay, the
/// leader noticing (it looks every second while the primary is unavailable), on a loaded
/// machine.
const DECISION_TIMEOUT: Duration = Duration::from_secs(30);
/// Time on top of the lease duration for the follower to take the Lease and start its
/// controllers (retry period, jitter, cache sync) on a loaded machine.
const TAKEOVER_TIMEOUT: Duration = Duration::from_secs(40);
/// How long the new leader runs with the target still frozen before it is let go: a few of
/// its reconciles, which find the target unreachable and must wait for it, not decide anew.
/// The whole freeze stays well under the instance pod's liveness probe (6 misses of 10 s).
const FROZEN_UNDER_NEW_LEADER: Duration = Duration::from_secs(3);
const ROWS: i64 = 1000;
/// How long after the kill of the leader the test reads what it left in the status.
const SETTLE: Duration = Duration::from_secs(1);

fn candidate(env: &TestEnv, name: &str, namespace: &str) -> Manager {
    let mut flags = vec![
        "--watch-namespaces",
        namespace,
        "--webhook-bind-address",
        "0",
        "--leader-elect",
        "--leader-elect-id",
        LEASE,
        "--leader-elect-namespace",
        namespace,
    ];
    flags.extend_from_slice(SHORT_LEASE_FLAGS);
    Manager::start(env, name, &flags)
}

async fn wait_for_holder(leases: &Api<Lease>, among: &[&str], timeout: Duration) -> String {
    wait_until(
        &format!("one of {among:?} to hold the Lease"),
        timeout,
        || async {
            Ok(lease_holder(leases, LEASE)
                .await?
                .filter(|name| among.contains(&name.as_str())))
        },
    )
    .await
    .expect("a leader")
}

async fn wait_for_log(manager: &Manager, message: &str, timeout: Duration) {
    wait_until(
        &format!("{} to log {message:?}", manager.name),
        timeout,
        || async { Ok(manager.logged(message).then_some(())) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\noutput:\n{}", manager.output().join("\n")));
}

/// The changes of the test cluster from now on.
async fn watch_cluster(
    cluster: &TestCluster,
) -> BoxStream<'static, kube::Result<WatchEvent<PostgreSQLCluster>>> {
    let now = cluster.get().await.expect("the cluster");
    let version = now.resource_version().expect("a resource version");
    let only = WatchParams::default().fields(&format!("metadata.name={}", cluster.name()));
    cluster
        .api()
        .watch(&only, &version)
        .await
        .expect("watching the cluster")
        .boxed()
}

/// The first `status.targetPrimary` the watch shows.
async fn decided_target(
    changes: &mut BoxStream<'static, kube::Result<WatchEvent<PostgreSQLCluster>>>,
) -> String {
    while let Some(event) = changes.try_next().await.expect("the watch") {
        match event {
            WatchEvent::Modified(cluster) => {
                if let Some(target) = cluster.status.and_then(|s| s.target_primary) {
                    return target;
                }
            }
            WatchEvent::Error(error) => panic!("the watch of the cluster failed: {error:?}"),
            _ => {}
        }
    }
    panic!("the watch of the cluster ended")
}

#[tokio::test]
async fn a_leader_change_in_the_middle_of_a_failover_still_ends_with_one_primary() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "failover-leader").await;
    let ns = namespace.name().to_owned();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let mut managers = [
        candidate(&env, "failover-a", &ns),
        candidate(&env, "failover-b", &ns),
    ];
    let first = wait_for_holder(&leases, &["failover-a", "failover-b"], CLUSTER_TIMEOUT).await;
    let leader = managers
        .iter()
        .position(|m| m.name == first)
        .expect("the leader is one of ours");
    let follower = 1 - leader;
    wait_for_log(&managers[leader], "starting controllers", TAKEOVER_TIMEOUT).await;

    let cluster = TestCluster::builder(CLUSTER)
        .replicas(3)
        .timeout(CLUSTER_TIMEOUT)
        .spec(|spec| {
            spec.high_availability = Some(HighAvailability {
                failover_delay_seconds: Some(FAILOVER_DELAY_SECONDS),
                isolation_timeout_seconds: None,
                synchronous: None,
            });
        })
        .start(&namespace)
        .await
        .unwrap_or_else(|error| panic!("a 3-instance cluster becomes Running: {error:#}"));
    let sql = cluster.sql().await.expect("login through rw");
    sql.batch_execute(&format!(
        "CREATE TABLE items (id int PRIMARY KEY); \
         INSERT INTO items SELECT generate_series(1, {ROWS});"
    ))
    .await
    .expect("rows through rw");
    drop(sql);
    let old = cluster
        .wait_healthy(None, CHANGE_TIMEOUT)
        .await
        .expect("the cluster is healthy");
    // Found before the kill, so that the freeze follows the decision at once.
    let replica_managers: Vec<(String, u32)> = (0..3)
        .map(|ordinal| format!("{CLUSTER}-postgresql-{ordinal}"))
        .filter(|pod| *pod != old)
        .map(|pod| {
            let pid = instance_manager_of(&ns, &pod)
                .unwrap_or_else(|| panic!("the instance manager of {pod}"));
            (pod, pid)
        })
        .collect();
    let postmaster = postmaster_of(&ns, &old).unwrap_or_else(|| panic!("the postmaster of {old}"));
    let sampler = RoleSampler::start(&cluster)
        .await
        .expect("sampling the pods");

    // A watch, not polling: the leader sends the promotion within a few hundred milliseconds
    // of recording the decision.
    let mut changes = watch_cluster(&cluster).await;
    send_signal(postmaster, "KILL").expect("kill -9 of the primary's postmaster");
    let killed = Instant::now();
    let target = tokio::time::timeout(DECISION_TIMEOUT, decided_target(&mut changes))
        .await
        .unwrap_or_else(|_| panic!("no failover decided within {DECISION_TIMEOUT:?} of the kill"));
    drop(changes);
    let (_, target_manager) = replica_managers
        .iter()
        .find(|(pod, _)| *pod == target)
        .unwrap_or_else(|| panic!("the target {target} is one of the replicas"));
    let frozen = Frozen::stop(*target_manager).expect("SIGSTOP of the target's instance manager");
    managers[leader].kill_hard().await;
    let decided = killed.elapsed();

    // The leader died with the failover recorded, unfinished: the rest is the other's work.
    // (After a moment, in case a request it sent just before it died is still being served.)
    tokio::time::sleep(SETTLE).await;
    let status = cluster
        .get()
        .await
        .expect("the cluster")
        .status
        .unwrap_or_default();
    let change = status.primary_change.clone().expect("status.primaryChange");
    assert_eq!(change.kind, PrimaryChangeKind::Failover, "{change:?}");
    assert_eq!(
        (change.from.as_str(), change.to.as_str()),
        (old.as_str(), target.as_str())
    );
    assert_eq!(
        change.completed_at, None,
        "the failover completed before the leader was killed: {change:?}"
    );
    assert_eq!(status.current_primary.as_deref(), Some(old.as_str()));
    let in_recovery: bool = cluster
        .sql_to_pod(&target)
        .await
        .expect("login to the target")
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .expect("the target's recovery state")
        .get(0);
    eprintln!(
        "failover {old} -> {target} decided within {decided:?} of the kill; {} killed",
        managers[leader].name
    );
    assert!(
        in_recovery,
        "{target} was promoted before its instance manager was frozen: the window this test \
         relies on was missed"
    );

    let second = managers[follower].name.clone();
    let took_over = wait_for_holder(
        &leases,
        &[second.as_str()],
        SHORT_LEASE_DURATION + TAKEOVER_TIMEOUT,
    )
    .await;
    assert_eq!(took_over, second);
    wait_for_log(
        &managers[follower],
        "starting controllers",
        TAKEOVER_TIMEOUT,
    )
    .await;
    tokio::time::sleep(FROZEN_UNDER_NEW_LEADER).await;
    let status = cluster
        .get()
        .await
        .expect("the cluster")
        .status
        .unwrap_or_default();
    assert_eq!(
        status.target_primary.as_deref(),
        Some(target.as_str()),
        "the new leader keeps the recorded target while it cannot reach it: {status:#?}"
    );
    drop(frozen);

    let change = cluster
        .wait_primary_change(PrimaryChangeKind::Failover, &old, CHANGE_TIMEOUT)
        .await
        .unwrap_or_else(|error| {
            panic!(
                "{error:#}\nthe new leader's output:\n{}",
                managers[follower].output().join("\n")
            )
        });
    assert_eq!(change.to, target, "{change:?}");
    let promoted_by_new_leader = managers[follower]
        .output()
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .any(|line| {
            line["fields"]["message"] == "instance manager commanded"
                && line["fields"]["pod"] == target.as_str()
                && line["fields"]["control"] == "Promote"
        });
    eprintln!("the new leader commanded the promotion of {target}: {promoted_by_new_leader}");
    let took = cluster
        .wait_writable(
            &format!("INSERT INTO items VALUES ({})", ROWS + 1),
            CHANGE_TIMEOUT,
        )
        .await
        .unwrap_or_else(|error| panic!("a write through rw after the failover: {error:#}"));
    eprintln!("a write through rw {took:?} after the failover completed");
    let on_target = cluster
        .sql_to_pod(&target)
        .await
        .expect("login to the new primary");
    let rows: i64 = on_target
        .query_one("SELECT count(*) FROM items", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(
        rows,
        ROWS + 1,
        "every row committed before, and the new one"
    );
    cluster
        .wait_rejoined(
            &old,
            &target,
            &format!("SELECT count(*) = 1 FROM items WHERE id = {}", ROWS + 1),
            CHANGE_TIMEOUT,
        )
        .await
        .expect("the old primary comes back as a replica of the new one");
    cluster
        .wait_healthy(Some(&target), CHANGE_TIMEOUT)
        .await
        .expect("one primary, the target; two replicas streaming from it");
    let status = cluster
        .get()
        .await
        .expect("the cluster")
        .status
        .unwrap_or_default();
    assert_eq!(status.current_primary.as_deref(), Some(target.as_str()));
    assert_eq!(status.target_primary, None, "the change is over");
    let labelled: Vec<String> = cluster
        .pods()
        .await
        .expect("pods")
        .into_iter()
        .filter(|pod| pod.role.as_deref() == Some("primary"))
        .map(|pod| pod.name)
        .collect();
    assert_eq!(labelled, [target.as_str()], "one pod labelled primary");
    assert!(
        !managers[follower].logged("stepped down"),
        "the new leader lost the Lease:\n{}",
        managers[follower].output().join("\n")
    );
    sampler.finish().await;

    cluster
        .delete(Duration::from_secs(120))
        .await
        .expect("cluster deleted");
    let survivor = &mut managers[follower];
    survivor.terminate();
    assert_eq!(survivor.exit_code(Duration::from_secs(60)).await, Some(0));
    namespace.cleanup().await;
}
