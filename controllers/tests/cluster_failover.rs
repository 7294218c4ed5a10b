//! End to end on the test bed's real node: high availability of a 3-instance PostgreSQL 15
//! cluster (issue 16). A switchover asked for with the `db.example.com/switchover-to`
//! annotation, and failovers after the primary's postmaster is killed (`kill -9`), after its
//! pod is deleted, with synchronous replication (no acknowledged commit lost), and after its
//! instance manager is frozen (`SIGSTOP`) while its postgres goes on running.
//!
//! Each test checks that the rows committed before are on the new primary, that the new
//! primary takes writes through `<cluster>-rw` (after a failover, within
//! `failoverDelaySeconds` plus [`FAILOVER_SLACK`]), that the old primary comes back as a
//! replica streaming from the new one on its new timeline, what `status.primaryChange` says,
//! and, from samples of the pods taken every 100 ms throughout, that no two pods
//! ever carry `db.example.com/role=primary` and `-rw` never resolves to two pods. A scale-down
//! that removes the primary's pod switches over first.
//!
//! The pgkube-testkit helpers of high availability (`TestCluster::wait_healthy`,
//! `wait_primary_change`, `wait_rejoined`, `RoleSampler`) do the waiting and the sampling;
//! `spec.highAvailability` is sent as JSON, and checked to be kept. The tests run one at a time
//! ([`SERIAL`]): they time failovers, and two 3-instance clusters failing over at once on a
//! 2-core machine would measure the machine.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Running;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use pgkube_crds::{PostgreSQLCluster, PrimaryChange, PrimaryChangeKind};
use pgkube_testkit::{
    Frozen, RoleSampler, TestCluster, instance_manager_of, postmaster_of, send_signal,
    tokio_postgres, wait_until,
};
use serde_json::json;

const RESYNC: Duration = Duration::from_secs(30);
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(300);
const CHANGE_TIMEOUT: Duration = Duration::from_secs(180);
/// `spec.highAvailability.failoverDelaySeconds` of the test clusters, but for
/// [`CRASH_FAILOVER_DELAY_SECONDS`].
const FAILOVER_DELAY_SECONDS: u64 = 3;
/// The delay of the tests that kill the primary's postmaster or delete its pod. The test bed
/// restarts a container at once and recreates a pod within seconds, as a kubelet does: a
/// primary back within the delay keeps its role (nothing is lost, no failover), which a longer
/// delay would make the usual outcome. One second makes these tests fail over, so that they
/// check the failover and the rejoin.
const CRASH_FAILOVER_DELAY_SECONDS: u64 = 1;
/// The "few seconds" a failover may take beyond the delay: the operator noticing the primary
/// is gone, the promotion, the role label moving, a new connection.
const FAILOVER_SLACK: Duration = Duration::from_secs(12);
const SWITCHOVER_ANNOTATION: &str = "db.example.com/switchover-to";
const CLUSTER: &str = "pg";
/// How long the frozen instance manager stays stopped after the failover: well under its
/// liveness probe's minute (6 misses of 10 s), which would restart the container.
const FROZEN_AFTER_FAILOVER: Duration = Duration::from_secs(15);

/// One test at a time (see the module's documentation).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn pod(ordinal: usize) -> String {
    format!("{CLUSTER}-postgresql-{ordinal}")
}

fn failover_budget(delay_seconds: u64) -> Duration {
    Duration::from_secs(delay_seconds) + FAILOVER_SLACK
}

/// Starts a 3-instance cluster with `spec.highAvailability` = `high_availability` (with
/// `failoverDelaySeconds` [`FAILOVER_DELAY_SECONDS`] unless it sets one), checks that the API server kept that field, and waits until it is
/// healthy; returns the cluster and its primary.
async fn start(running: &Running, high_availability: serde_json::Value) -> (TestCluster, String) {
    let mut high_availability = high_availability;
    if high_availability.get("failoverDelaySeconds").is_none() {
        high_availability["failoverDelaySeconds"] = json!(FAILOVER_DELAY_SECONDS);
    }
    let cluster = TestCluster::builder(CLUSTER)
        .replicas(3)
        .timeout(CLUSTER_TIMEOUT)
        .extra_spec(json!({ "highAvailability": high_availability.clone() }))
        .start(&running.namespace)
        .await
        .unwrap_or_else(|error| panic!("a 3-instance cluster becomes Running: {error:#}"));
    let kept = cluster_json(running).await["spec"]["highAvailability"].clone();
    assert_eq!(
        kept, high_availability,
        "the API server keeps spec.highAvailability (a CRD without the field prunes it)"
    );
    let primary = wait_healthy(&cluster, None).await;
    (cluster, primary)
}

/// The cluster as the API server has it, as JSON (with fields the Rust types may not have).
async fn cluster_json(running: &Running) -> serde_json::Value {
    let resource = ApiResource::erase::<PostgreSQLCluster>(&());
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(running.client.clone(), running.namespace.name(), &resource);
    let cluster = clusters.get(CLUSTER).await.expect("the cluster");
    serde_json::to_value(cluster).expect("JSON")
}

/// Waits until the cluster has one primary (`primary` if given) and two replicas streaming
/// from it, caught up; returns the primary.
async fn wait_healthy(cluster: &TestCluster, primary: Option<&str>) -> String {
    cluster
        .wait_healthy(primary, CHANGE_TIMEOUT)
        .await
        .expect("the cluster is healthy")
}

/// The completed `status.primaryChange` of `kind` from `from`.
async fn wait_primary_change(
    cluster: &TestCluster,
    kind: PrimaryChangeKind,
    from: &str,
    timeout: Duration,
) -> PrimaryChange {
    cluster
        .wait_primary_change(kind, from, timeout)
        .await
        .unwrap_or_else(|error| panic!("{error:#}"))
}

async fn primary_timeline(cluster: &TestCluster, pod: &str) -> u32 {
    cluster
        .primary_timeline(pod)
        .await
        .expect("the primary's timeline")
}

/// Waits until `old` streams from the primary `new` and has replayed the row `marker` of
/// `items` (written on `new` after the change).
async fn wait_rejoined(cluster: &TestCluster, old: &str, new: &str, marker: i32) {
    let replayed = format!("SELECT count(*) = 1 FROM items WHERE id = {marker}");
    cluster
        .wait_rejoined(old, new, &replayed, CHANGE_TIMEOUT)
        .await
        .expect("the old primary comes back as a replica of the new one");
}

async fn count_items(sql: &tokio_postgres::Client) -> i64 {
    sql.query_one("SELECT count(*) FROM items", &[])
        .await
        .expect("count")
        .get(0)
}

/// How the primary is lost.
#[derive(Clone, Copy, Debug)]
enum Loss {
    /// `kill -9` of its postmaster.
    KillPostmaster,
    /// Deletion of its pod.
    DeletePod,
}

async fn lose(running: &Running, primary: &str, loss: Loss) {
    match loss {
        Loss::KillPostmaster => {
            let pid = postmaster_of(running.namespace.name(), primary)
                .unwrap_or_else(|| panic!("the postmaster of {primary}"));
            send_signal(pid, "KILL").expect("kill -9 of the postmaster");
        }
        Loss::DeletePod => {
            running
                .api::<Pod>()
                .delete(primary, &DeleteParams::default())
                .await
                .expect("the primary's pod deleted");
        }
    }
}

/// The primary of a healthy 3-instance cluster is lost as `loss` says: a new primary takes
/// writes through rw within the failover delay and the slack, with every row committed before,
/// and the old one comes back as its replica.
async fn failover_after(prefix: &str, loss: Loss) {
    let _serial = SERIAL.lock().await;
    let Some(running) = Running::start(prefix, RESYNC).await else {
        return;
    };
    let delay = CRASH_FAILOVER_DELAY_SECONDS;
    let (cluster, old) = start(&running, json!({"failoverDelaySeconds": delay})).await;
    let sql = cluster.sql().await.expect("login through rw");
    sql.batch_execute(
        "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, 1000);",
    )
    .await
    .expect("rows through rw");
    drop(sql);
    wait_healthy(&cluster, Some(&old)).await;
    let sampler = RoleSampler::start(&cluster)
        .await
        .expect("sampling the pods");

    lose(&running, &old, loss).await;
    let took = cluster
        .wait_writable("INSERT INTO items VALUES (1001)", failover_budget(delay))
        .await
        .unwrap_or_else(|error| panic!("a write through rw after {loss:?} of {old}: {error:#}"));
    eprintln!("{loss:?}: the first write through rw {took:?} after the loss");
    let change =
        wait_primary_change(&cluster, PrimaryChangeKind::Failover, &old, CHANGE_TIMEOUT).await;
    let new = change.to.clone();
    assert!(!change.reason.is_empty(), "{change:?}");

    let on_new = cluster
        .sql_to_pod(&new)
        .await
        .expect("login to the new primary");
    assert_eq!(count_items(&on_new).await, 1001, "every committed row");
    wait_rejoined(&cluster, &old, &new, 1001).await;
    wait_healthy(&cluster, Some(&new)).await;
    sampler.finish().await;
    running.stop().await;
}

/// `kubectl annotate pgcluster pg db.example.com/switchover-to=pg-postgresql-1`: the target
/// becomes the primary with every row committed before, takes writes through rw, and the old
/// primary streams from it on its new timeline; the status tells the change.
#[tokio::test]
async fn a_switchover_moves_the_primary_with_every_row() {
    let _serial = SERIAL.lock().await;
    let Some(running) = Running::start("failover-switchover", RESYNC).await else {
        return;
    };
    let (cluster, old) = start(&running, json!({})).await;
    assert_eq!(old, pod(0));
    let target = pod(1);
    let timeline_before = primary_timeline(&cluster, &old).await;
    let sql = cluster.sql().await.expect("login through rw");
    sql.batch_execute(
        "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, 1000);",
    )
    .await
    .expect("rows through rw");
    drop(sql);
    let sampler = RoleSampler::start(&cluster)
        .await
        .expect("sampling the pods");

    cluster
        .api()
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {SWITCHOVER_ANNOTATION: target}}})),
        )
        .await
        .expect("annotated");
    let change = wait_primary_change(
        &cluster,
        PrimaryChangeKind::Switchover,
        &old,
        CHANGE_TIMEOUT,
    )
    .await;
    assert_eq!(change.to, target, "{change:?}");
    assert_eq!(
        cluster.current_primary().await.expect("status").as_deref(),
        Some(target.as_str())
    );
    wait_until("the annotation removed", CHANGE_TIMEOUT, || async {
        let cluster = cluster.get().await?;
        Ok((!cluster.annotations().contains_key(SWITCHOVER_ANNOTATION)).then_some(()))
    })
    .await
    .expect("the operator removes the annotation it acted on");

    cluster
        .wait_writable("INSERT INTO items VALUES (1001)", CHANGE_TIMEOUT)
        .await
        .expect("the new primary takes writes through rw");
    let on_target = cluster
        .sql_to_pod(&target)
        .await
        .expect("login to the target");
    let in_recovery: bool = on_target
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .expect("recovery state")
        .get(0);
    assert!(!in_recovery, "{target} is the primary");
    assert_eq!(count_items(&on_target).await, 1001, "every committed row");
    assert!(primary_timeline(&cluster, &target).await > timeline_before);
    wait_rejoined(&cluster, &old, &target, 1001).await;
    wait_healthy(&cluster, Some(&target)).await;
    sampler.finish().await;
    running.stop().await;
}

/// A scale-down from 3 to 1 while instance 2 is the primary: the primary moves to instance 0
/// by a switchover first, then the StatefulSet shrinks; every committed row is kept.
#[tokio::test]
async fn a_scale_down_that_removes_the_primary_switches_over_first() {
    let _serial = SERIAL.lock().await;
    let Some(running) = Running::start("failover-scale-down", RESYNC).await else {
        return;
    };
    let (cluster, first) = start(&running, json!({})).await;
    let last = pod(2);
    let annotate = json!({"metadata": {"annotations": {SWITCHOVER_ANNOTATION: last}}});
    cluster
        .api()
        .patch(CLUSTER, &PatchParams::default(), &Patch::Merge(annotate))
        .await
        .expect("annotated");
    wait_primary_change(
        &cluster,
        PrimaryChangeKind::Switchover,
        &first,
        CHANGE_TIMEOUT,
    )
    .await;
    wait_healthy(&cluster, Some(&last)).await;
    let sql = cluster.sql().await.expect("login through rw");
    sql.batch_execute(
        "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, 1000);",
    )
    .await
    .expect("rows through rw");
    drop(sql);

    cluster
        .api()
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .expect("scaled down");
    let change = wait_primary_change(
        &cluster,
        PrimaryChangeKind::Switchover,
        &last,
        CHANGE_TIMEOUT,
    )
    .await;
    assert_eq!(change.to, pod(0), "{change:?}");
    assert!(change.reason.contains("scale-down to 1"), "{change:?}");
    let pods: Api<Pod> = Api::namespaced(running.client.clone(), running.namespace.name());
    wait_until("instances 1 and 2 to be gone", CHANGE_TIMEOUT, || async {
        let gone = pods.get_opt(&pod(1)).await?.is_none() && pods.get_opt(&pod(2)).await?.is_none();
        Ok(gone.then_some(()))
    })
    .await
    .expect("the StatefulSet shrinks once the primary stays");
    cluster
        .wait_writable("INSERT INTO items VALUES (1001)", CHANGE_TIMEOUT)
        .await
        .expect("the primary takes writes through rw");
    let on_first = cluster
        .sql_to_pod(&pod(0))
        .await
        .expect("login to instance 0");
    assert_eq!(count_items(&on_first).await, 1001, "every committed row");
    running.stop().await;
}

/// `kill -9` of the primary's postmaster.
#[tokio::test]
async fn a_killed_primary_postmaster_fails_over_within_the_delay() {
    failover_after("failover-kill", Loss::KillPostmaster).await;
}

/// Deletion of the primary's pod.
#[tokio::test]
async fn a_deleted_primary_pod_fails_over_within_the_delay() {
    failover_after("failover-delete", Loss::DeletePod).await;
}

/// With synchronous replication (one standby confirms each commit), every row whose INSERT
/// was acknowledged before the primary's postmaster was killed, mid-stream of single-row
/// commits, is on the new primary.
#[tokio::test]
async fn synchronous_replication_loses_no_acknowledged_commit() {
    let _serial = SERIAL.lock().await;
    let Some(running) = Running::start("failover-sync", RESYNC).await else {
        return;
    };
    let (cluster, old) = start(
        &running,
        json!({
            "failoverDelaySeconds": CRASH_FAILOVER_DELAY_SECONDS,
            "synchronous": {"minStandbys": 1, "maxStandbys": 1},
        }),
    )
    .await;
    let sql = cluster.sql().await.expect("login through rw");
    let names = wait_until("a synchronous standby", CHANGE_TIMEOUT, || async {
        let names: String = sql
            .query_one("SHOW synchronous_standby_names", &[])
            .await?
            .get(0);
        let synchronous: i64 = sql
            .query_one(
                "SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')",
                &[],
            )
            .await?
            .get(0);
        // `ANY 1 (...)`: each streaming standby is a quorum candidate.
        Ok((!names.is_empty() && synchronous >= 1).then_some(names))
    })
    .await
    .expect("the primary waits for one standby");
    eprintln!("synchronous_standby_names = {names}");
    sql.batch_execute("CREATE TABLE items (id int PRIMARY KEY)")
        .await
        .expect("table");

    let acknowledged = Arc::new(Mutex::new(Vec::<i32>::new()));
    let writer = tokio::spawn({
        let acknowledged = acknowledged.clone();
        async move {
            for id in 1.. {
                let parameters: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&id];
                let insert = sql.execute("INSERT INTO items VALUES ($1)", &parameters);
                match tokio::time::timeout(Duration::from_secs(10), insert).await {
                    Ok(Ok(_)) => acknowledged.lock().expect("acknowledged").push(id),
                    Ok(Err(error)) => return format!("{error}"),
                    Err(_) => return "no answer in 10 s".to_owned(),
                }
            }
            unreachable!("the writer stops at the first failure")
        }
    });
    wait_until("200 acknowledged commits", CHANGE_TIMEOUT, || async {
        Ok((acknowledged.lock().expect("acknowledged").len() >= 200).then_some(()))
    })
    .await
    .expect("commits go on with a synchronous standby");
    let sampler = RoleSampler::start(&cluster)
        .await
        .expect("sampling the pods");
    lose(&running, &old, Loss::KillPostmaster).await;
    let stopped = writer.await.expect("writer");
    let acknowledged = acknowledged.lock().expect("acknowledged").clone();
    eprintln!(
        "{} commits acknowledged before the kill; the writer stopped with: {stopped}",
        acknowledged.len()
    );

    let marker = i32::MAX;
    // An attempt cut while its commit waits for a synchronous standby has committed locally
    // (PostgreSQL's rule for a cancelled wait): the next attempt updates the row instead, a
    // write that must be acknowledged by a standby all the same.
    let took = cluster
        .wait_writable(
            &format!(
                "INSERT INTO items VALUES ({marker}) ON CONFLICT (id) DO UPDATE SET id = EXCLUDED.id"
            ),
            failover_budget(CRASH_FAILOVER_DELAY_SECONDS),
        )
        .await
        .unwrap_or_else(|error| panic!("a write through rw after the kill: {error:#}"));
    eprintln!("the first write through rw {took:?} after the kill");
    let change =
        wait_primary_change(&cluster, PrimaryChangeKind::Failover, &old, CHANGE_TIMEOUT).await;
    let new = change.to.clone();
    let on_new = cluster
        .sql_to_pod(&new)
        .await
        .expect("login to the new primary");
    let present: Vec<i32> = on_new
        .query("SELECT id FROM items WHERE id = ANY($1)", &[&acknowledged])
        .await
        .expect("acknowledged rows")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let missing: Vec<i32> = acknowledged
        .iter()
        .copied()
        .filter(|id| !present.contains(id))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged commits lost: {missing:?}",
        missing.len(),
        acknowledged.len()
    );
    wait_rejoined(&cluster, &old, &new, marker).await;
    wait_healthy(&cluster, Some(&new)).await;
    sampler.finish().await;
    running.stop().await;
}

/// The primary's instance manager is frozen (SIGSTOP of PID 1 of its container) while its
/// postgres runs on: the operator cannot reach it, fails over, and from the moment `-rw`
/// resolves to the new primary it never resolves to the old pod again; once the instance
/// manager runs again (SIGCONT), the old primary becomes a replica of the new one.
#[tokio::test]
async fn a_primary_cut_from_the_operator_but_alive_is_fenced_then_rejoins() {
    let _serial = SERIAL.lock().await;
    let Some(running) = Running::start("failover-frozen", RESYNC).await else {
        return;
    };
    let (cluster, old) = start(&running, json!({})).await;
    let sql = cluster.sql().await.expect("login through rw");
    sql.batch_execute(
        "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, 100);",
    )
    .await
    .expect("rows through rw");
    drop(sql);
    wait_healthy(&cluster, Some(&old)).await;
    let postmaster = postmaster_of(running.namespace.name(), &old).expect("old postmaster");
    let sampler = RoleSampler::start(&cluster)
        .await
        .expect("sampling the pods");

    let manager = instance_manager_of(running.namespace.name(), &old)
        .unwrap_or_else(|| panic!("the instance manager of {old}"));
    let frozen = Frozen::stop(manager).expect("SIGSTOP of the instance manager");
    let change = wait_primary_change(
        &cluster,
        PrimaryChangeKind::Failover,
        &old,
        failover_budget(FAILOVER_DELAY_SECONDS),
    )
    .await;
    let new = change.to.clone();
    let took = cluster
        .wait_writable(
            "INSERT INTO items VALUES (101)",
            failover_budget(FAILOVER_DELAY_SECONDS),
        )
        .await
        .expect("a write through rw after the failover");
    eprintln!("the first write through rw {took:?} after the failover was recorded");
    let fenced = wait_until(
        "-rw resolving to the new primary alone",
        CHANGE_TIMEOUT,
        || async { Ok(sampler.first_rw_only(&new)) },
    )
    .await
    .expect("rw moves to the new primary");
    assert!(
        postmaster_of(running.namespace.name(), &old) == Some(postmaster),
        "the old primary's postgres still runs while its manager is stopped"
    );
    let on_new = cluster
        .sql_to_pod(&new)
        .await
        .expect("login to the new primary");
    assert_eq!(count_items(&on_new).await, 101);

    tokio::time::sleep(FROZEN_AFTER_FAILOVER).await;
    drop(frozen);
    wait_rejoined(&cluster, &old, &new, 101).await;
    wait_healthy(&cluster, Some(&new)).await;
    let samples = sampler.finish().await;
    let back: Vec<f64> = samples
        .iter()
        .filter(|s| s.at >= fenced && s.rw.contains(&old))
        .map(|s| (s.at - fenced).as_secs_f64())
        .collect();
    assert!(
        back.is_empty(),
        "-rw resolved to {old} again, {back:?} s after it moved to {new}"
    );
    running.stop().await;
}

/// Refuses every create and update of a PodDisruptionBudget in `namespace`, with a
/// ValidatingAdmissionPolicy (built into the API server, no webhook); removed on drop.
struct RefusedBudgets {
    client: kube::Client,
    name: String,
}

impl RefusedBudgets {
    async fn install(client: &kube::Client, namespace: &str) -> RefusedBudgets {
        let name = format!("refuse-budgets-{namespace}");
        let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["policy"], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["poddisruptionbudgets"],
                }]},
                "validations": [{"expression": "false", "message": "budgets are refused in this test"}],
            },
        }))
        .expect("a policy");
        let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": namespace},
                }},
            },
        }))
        .expect("a binding");
        Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .create(&Default::default(), &policy)
            .await
            .expect("policy created");
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .create(&Default::default(), &binding)
            .await
            .expect("binding created");
        RefusedBudgets {
            client: client.clone(),
            name,
        }
    }
}

impl Drop for RefusedBudgets {
    fn drop(&mut self) {
        let (client, name) = (self.client.clone(), self.name.clone());
        tokio::spawn(async move {
            let params = DeleteParams::default();
            let _ = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
                .delete(&name, &params)
                .await;
            let _ = Api::<ValidatingAdmissionPolicy>::all(client)
                .delete(&name, &params)
                .await;
        });
    }
}

/// A child that no longer applies (an admission policy refuses the PodDisruptionBudget) fails
/// every reconcile; the primary is then killed, and the failover still happens within the
/// delay and the slack: high availability does not wait for the children.
#[tokio::test]
async fn a_child_that_does_not_apply_does_not_hold_back_a_failover() {
    let _serial = SERIAL.lock().await;
    let Some(running) = Running::start("failover-apply-error", RESYNC).await else {
        return;
    };
    let delay = CRASH_FAILOVER_DELAY_SECONDS;
    let (cluster, old) = start(&running, json!({"failoverDelaySeconds": delay})).await;
    let sql = cluster.sql().await.expect("login through rw");
    sql.batch_execute(
        "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, 100);",
    )
    .await
    .expect("rows through rw");
    drop(sql);
    wait_healthy(&cluster, Some(&old)).await;

    let refused = RefusedBudgets::install(&running.client, running.namespace.name()).await;
    let budgets = running.api::<PodDisruptionBudget>();
    let budget = format!("{CLUSTER}-postgresql");
    // The policy takes effect once the API server's own watch has it: until the budget is
    // refused, delete it again.
    let events = running.api::<Event>();
    wait_until("the budget to be refused", CHANGE_TIMEOUT, || async {
        let _ = budgets.delete(&budget, &DeleteParams::default()).await;
        let refused = events
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .any(|event| {
                event.reason.as_deref() == Some("ReconcileFailed")
                    && event
                        .note
                        .as_deref()
                        .is_some_and(|note| note.contains("PodDisruptionBudget"))
            });
        Ok(refused.then_some(()))
    })
    .await
    .expect("the operator cannot apply the budget");
    // Failures pile up: each doubles the backoff that an error policy without a cap applies.
    tokio::time::sleep(Duration::from_secs(20)).await;

    lose(&running, &old, Loss::KillPostmaster).await;
    let took = cluster
        .wait_writable("INSERT INTO items VALUES (101)", failover_budget(delay))
        .await
        .unwrap_or_else(|error| {
            panic!("a write through rw although the budget does not apply: {error:#}")
        });
    eprintln!("the first write through rw {took:?} after the kill, with a child refused");
    let change =
        wait_primary_change(&cluster, PrimaryChangeKind::Failover, &old, CHANGE_TIMEOUT).await;
    let on_new = cluster
        .sql_to_pod(&change.to)
        .await
        .expect("login to the new primary");
    assert_eq!(count_items(&on_new).await, 101, "every committed row");
    drop(refused);
    running.stop().await;
}
