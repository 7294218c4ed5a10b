//! End to end on the test bed's real node: clusters of several instances, where the instance
//! manager (`pgkube instance run`, PID 1 of each PostgreSQL 15 container) makes one primary and
//! streaming replicas, and the cluster controller labels the pods by role for the `-rw`, `-ro`
//! and `-r` Services and reports each instance in the status.

mod common;

use std::time::Duration;

use common::Running;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Patch, PatchParams};
use pgkube_crds::InstanceRole;
use pgkube_testkit::tokio_postgres;
use pgkube_testkit::{
    ClusterService, TestCluster, processes_with_env, replication_secret_name, wait_until,
};

const RESYNC: Duration = Duration::from_secs(30);
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(300);
const CHANGE_TIMEOUT: Duration = Duration::from_secs(180);
/// The instance manager's grace period before dropping a removed instance's slot (2 min), and
/// some.
const SLOT_DROP_TIMEOUT: Duration = Duration::from_secs(240);

/// Starts a cluster of `replicas` instances on the real node and waits until it runs.
async fn start(running: &Running, replicas: i32) -> TestCluster {
    TestCluster::builder("pg")
        .replicas(replicas)
        .timeout(CLUSTER_TIMEOUT)
        .start(&running.namespace)
        .await
        .unwrap_or_else(|error| panic!("a {replicas}-instance cluster becomes Running: {error:#}"))
}

/// Merges `spec` into the cluster's spec.
async fn patch_spec(cluster: &TestCluster, spec: serde_json::Value) {
    cluster
        .api()
        .patch(
            cluster.name(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": spec })),
        )
        .await
        .expect("spec changed");
}

async fn count(sql: &tokio_postgres::Client) -> anyhow::Result<i64> {
    Ok(sql
        .query_one("SELECT count(*) FROM items", &[])
        .await?
        .get(0))
}

/// The restart counts of the cluster's containers, by pod.
async fn restart_counts(running: &Running, cluster: &TestCluster) -> Vec<(String, i32)> {
    let mut counts = Vec::new();
    for pod in cluster.pods().await.expect("pods") {
        let live = running.api::<Pod>().get(&pod.name).await.expect("pod");
        let restarts = live
            .status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default()
            .iter()
            .map(|c| c.restart_count)
            .sum();
        counts.push((pod.name, restarts));
    }
    counts
}

/// The managed slots on the primary and whether each is in use.
async fn slots(sql: &tokio_postgres::Client) -> anyhow::Result<Vec<(String, bool)>> {
    let rows = sql
        .query(
            "SELECT slot_name::text, active FROM pg_replication_slots \
             WHERE slot_name LIKE 'pgkube\\_%' ORDER BY 1",
            &[],
        )
        .await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

/// Waits until every replica of `cluster` reports streaming with no lag in the status.
async fn wait_replicas_caught_up(cluster: &TestCluster, replicas: usize) {
    wait_until(
        "every replica streaming, caught up",
        CHANGE_TIMEOUT,
        || async {
            let status = cluster.get().await?.status.unwrap_or_default();
            let streaming = status
                .instances
                .iter()
                .filter(|i| {
                    i.role == InstanceRole::Replica
                        && i.streaming == Some(true)
                        && i.lag_bytes == Some(0)
                })
                .count();
            Ok((streaming == replicas).then_some(()))
        },
    )
    .await
    .expect("replicas catch up");
}

#[tokio::test]
async fn three_instances_one_primary_rows_written_through_rw_are_read_through_ro() {
    let Some(running) = Running::start("replication", RESYNC).await else {
        return;
    };
    let cluster = start(&running, 3).await;
    wait_replicas_caught_up(&cluster, 2).await;

    let status = cluster
        .get()
        .await
        .expect("cluster")
        .status
        .expect("status");
    assert_eq!(status.current_primary.as_deref(), Some("pg-postgresql-0"));
    let roles: Vec<(&str, InstanceRole)> = status
        .instances
        .iter()
        .map(|i| (i.name.as_str(), i.role))
        .collect();
    assert_eq!(
        roles,
        [
            ("pg-postgresql-0", InstanceRole::Primary),
            ("pg-postgresql-1", InstanceRole::Replica),
            ("pg-postgresql-2", InstanceRole::Replica),
        ]
    );
    let labels: Vec<Option<String>> = cluster
        .pods()
        .await
        .expect("pods")
        .into_iter()
        .map(|pod| pod.role)
        .collect();
    assert_eq!(
        labels,
        [Some("primary"), Some("replica"), Some("replica")].map(|r| r.map(str::to_owned))
    );
    assert_eq!(
        cluster
            .addresses_of(ClusterService::ReadWrite)
            .await
            .expect("rw")
            .len(),
        1
    );
    assert_eq!(
        cluster
            .addresses_of(ClusterService::ReadOnly)
            .await
            .expect("ro")
            .len(),
        2
    );
    assert_eq!(
        cluster
            .addresses_of(ClusterService::Any)
            .await
            .expect("r")
            .len(),
        3
    );

    let primary = cluster.sql().await.expect("login through rw");
    primary
        .batch_execute(
            "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, 1000);",
        )
        .await
        .expect("writes through rw");
    let replica = cluster
        .sql_via(ClusterService::ReadOnly)
        .await
        .expect("login through ro");
    let seen = wait_until("the rows replayed on a replica", CHANGE_TIMEOUT, || async {
        let seen = count(&replica).await.ok();
        Ok(seen.filter(|n| *n == 1000))
    })
    .await
    .expect("replicas replay the primary's writes");
    assert_eq!(seen, 1000);
    let refused = replica
        .execute("INSERT INTO items VALUES (1001)", &[])
        .await
        .expect_err("a write through ro is refused");
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION),
        "{refused:?}"
    );
    let in_recovery: bool = replica
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .expect("recovery state")
        .get(0);
    assert!(in_recovery, "ro reaches a standby");
    assert_eq!(
        slots(&primary).await.expect("slots"),
        [
            ("pgkube_pg_postgresql_1".to_owned(), true),
            ("pgkube_pg_postgresql_2".to_owned(), true)
        ]
    );
    running.stop().await;
}

/// 3 → 1 → 3: the removed replicas stop cleanly and leave no process behind, their slots go,
/// the primary keeps every row, and the replicas that come back clone it again.
#[tokio::test]
async fn scaling_three_to_one_to_three_keeps_the_data_and_drops_the_slots() {
    let Some(running) = Running::start("replication-scale", RESYNC).await else {
        return;
    };
    let cluster = start(&running, 3).await;
    wait_replicas_caught_up(&cluster, 2).await;
    let primary = cluster.sql().await.expect("login through rw");
    primary
        .batch_execute("CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, 500);")
        .await
        .expect("rows");

    patch_spec(&cluster, serde_json::json!({ "replicas": 1 })).await;
    wait_until("one pod left", CHANGE_TIMEOUT, || async {
        Ok((cluster.pods().await?.len() == 1).then_some(()))
    })
    .await
    .expect("the StatefulSet scales down");
    for removed in ["pg-postgresql-1", "pg-postgresql-2"] {
        wait_until(
            &format!("no process of {removed} left"),
            CHANGE_TIMEOUT,
            || async {
                Ok(processes_with_env(&format!("POD_NAME={removed}"))
                    .is_empty()
                    .then_some(()))
            },
        )
        .await
        .expect("the instance manager stops postgres and exits");
    }
    // The primary waits 2 minutes before it drops the slot of a removed instance.
    wait_until(
        "the removed replicas' slots dropped",
        SLOT_DROP_TIMEOUT,
        || async { Ok(slots(&primary).await?.is_empty().then_some(())) },
    )
    .await
    .expect("the primary drops the slots of removed instances");
    assert_eq!(
        cluster.pods().await.expect("pods")[0].role.as_deref(),
        Some("primary"),
        "scaling down never removes the primary"
    );
    primary
        .execute("INSERT INTO items SELECT generate_series(501, 600)", &[])
        .await
        .expect("writes while alone");

    patch_spec(&cluster, serde_json::json!({ "replicas": 3 })).await;
    cluster
        .wait_running(CLUSTER_TIMEOUT)
        .await
        .expect("Running with 3 again");
    wait_replicas_caught_up(&cluster, 2).await;
    assert_eq!(count(&primary).await.expect("count"), 600);
    for _ in 0..2 {
        // Each connection lands on one replica; the lag is 0 for both, so both have all rows.
        let replica = cluster
            .sql_via(ClusterService::ReadOnly)
            .await
            .expect("login through ro");
        assert_eq!(count(&replica).await.expect("count on a replica"), 600);
    }
    assert_eq!(slots(&primary).await.expect("slots").len(), 2);
    running.stop().await;
}

/// Rotating a password in its Secret takes effect without restarting anything: the superuser's
/// new password logs in over the network (the cluster allows it, `enableSuperuserAccess`), the
/// old one no longer does, and replicas reconnect after the rotation (they log in with their
/// client certificate).
#[tokio::test]
async fn rotated_passwords_work_without_a_restart() {
    let Some(running) = Running::start("replication-rotate", RESYNC).await else {
        return;
    };
    let cluster = TestCluster::builder("pg")
        .replicas(2)
        .spec(|spec| spec.enable_superuser_access = true)
        .timeout(CLUSTER_TIMEOUT)
        .start(&running.namespace)
        .await
        .expect("a cluster with remote superuser logins becomes Running");
    wait_replicas_caught_up(&cluster, 1).await;
    let restarts_before = restart_counts(&running, &cluster).await;
    let (user, old_password) = cluster.credentials().await.expect("credentials");
    let secrets = running.api::<Secret>();
    let rotate = |name: String, password: &'static str| {
        let secrets = secrets.clone();
        async move {
            secrets
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({ "stringData": { "password": password } })),
                )
                .await
                .expect("Secret changed");
        }
    };
    rotate(
        pgkube_testkit::credentials_secret_name(cluster.name()),
        "rotated-superuser-password",
    )
    .await;
    rotate(
        replication_secret_name(cluster.name()),
        "rotated-replication-password",
    )
    .await;
    let address = cluster.addresses().await.expect("rw")[0];
    let sql = wait_until(
        "the new superuser password logs in",
        CHANGE_TIMEOUT,
        || async {
            let login = cluster
                .log_in(address, &user, "rotated-superuser-password")
                .await?;
            Ok(login.ok())
        },
    )
    .await
    .expect("rotation without restart");
    let old = cluster
        .log_in(address, &user, &old_password)
        .await
        .expect("the cluster's CA")
        .expect_err("the old password still logs in");
    assert_eq!(
        old.code(),
        Some(&tokio_postgres::error::SqlState::INVALID_PASSWORD),
        "{old:?}"
    );

    // The replica's stream is cut; it reconnects with the rotated replication password.
    wait_until(
        "the replica's WAL receiver uses the new password",
        CHANGE_TIMEOUT,
        || async {
            sql.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_replication",
                &[],
            )
            .await?;
            tokio::time::sleep(Duration::from_secs(3)).await;
            let streaming: i64 = sql
                .query_one(
                    "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
                    &[],
                )
                .await?
                .get(0);
            Ok((streaming == 1).then_some(()))
        },
    )
    .await
    .expect("the replica streams again");
    assert_eq!(restart_counts(&running, &cluster).await, restarts_before);
    running.stop().await;
}

/// A parameter the server reloads is applied in place; one that needs a restart is applied by
/// the instance manager restarting postgres, not by Kubernetes restarting the pod.
#[tokio::test]
async fn parameter_changes_reload_or_restart_postgres_inside_the_pod() {
    let Some(running) = Running::start("replication-params", RESYNC).await else {
        return;
    };
    let cluster = start(&running, 2).await;
    let pods_before = cluster.pods().await.expect("pods");
    let restarts_before = restart_counts(&running, &cluster).await;
    let started: String = cluster
        .sql()
        .await
        .expect("login")
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .await
        .expect("start time")
        .get(0);
    let show = |via: ClusterService, name: &'static str| {
        let cluster = cluster.clone();
        async move {
            let sql = cluster.sql_via(via).await?;
            let value: String = sql.query_one(&format!("SHOW {name}"), &[]).await?.get(0);
            let started: String = sql
                .query_one("SELECT pg_postmaster_start_time()::text", &[])
                .await?
                .get(0);
            anyhow::Ok((value, started))
        }
    };

    patch_spec(
        &cluster,
        serde_json::json!({ "postgresql": { "parameters": { "work_mem": "12MB" } } }),
    )
    .await;
    let (_, started_after_reload) =
        wait_until("work_mem = 12MB on the primary", CHANGE_TIMEOUT, || async {
            Ok(show(ClusterService::ReadWrite, "work_mem")
                .await
                .ok()
                .filter(|(v, _)| v == "12MB"))
        })
        .await
        .expect("the reload reaches the primary");
    assert_eq!(
        started_after_reload, started,
        "a reload does not restart the server"
    );
    wait_until("work_mem = 12MB on the replica", CHANGE_TIMEOUT, || async {
        Ok(show(ClusterService::ReadOnly, "work_mem")
            .await
            .ok()
            .filter(|(v, _)| v == "12MB"))
    })
    .await
    .expect("the reload reaches the replica");

    let parameters = serde_json::json!({ "work_mem": "12MB", "max_connections": "90" });
    patch_spec(
        &cluster,
        serde_json::json!({ "postgresql": { "parameters": parameters } }),
    )
    .await;
    for via in [ClusterService::ReadWrite, ClusterService::ReadOnly] {
        wait_until(
            &format!("max_connections = 90 through {via:?}"),
            CHANGE_TIMEOUT,
            || async {
                Ok(show(via, "max_connections")
                    .await
                    .ok()
                    .filter(|(v, _)| v == "90"))
            },
        )
        .await
        .expect("the restart applies the setting");
    }
    let (_, started_after_restart) = show(ClusterService::ReadWrite, "max_connections")
        .await
        .expect("primary");
    assert_ne!(
        started_after_restart, started,
        "max_connections needs a restart"
    );
    assert_eq!(
        cluster.pods().await.expect("pods"),
        pods_before,
        "same pods, same roles"
    );
    assert_eq!(restart_counts(&running, &cluster).await, restarts_before);
    running.stop().await;
}

/// A replica whose slot is dropped on the primary cannot stream: the status says so, with an
/// Event; once its pod starts again, it finds its slot gone, clones the primary afresh and
/// streams again.
#[tokio::test]
async fn a_replica_that_cannot_stream_is_reported_and_a_new_clone_recovers_it() {
    let Some(running) = Running::start("replication-broken", RESYNC).await else {
        return;
    };
    let cluster = start(&running, 2).await;
    wait_replicas_caught_up(&cluster, 1).await;
    let primary = cluster.sql().await.expect("login through rw");
    primary
        .batch_execute("CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, 10);")
        .await
        .expect("rows");

    // The WAL sender is cut and the slot dropped before the replica reconnects (it retries
    // every 5 s).
    wait_until("the replica's slot dropped", CHANGE_TIMEOUT, || async {
        primary
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_replication",
                &[],
            )
            .await?;
        let dropped = primary
            .execute(
                "SELECT pg_drop_replication_slot('pgkube_pg_postgresql_1')",
                &[],
            )
            .await;
        Ok(dropped.is_ok().then_some(()))
    })
    .await
    .expect("the slot can be dropped between two connection attempts");
    let broken = cluster
        .wait_condition("ReplicasStreaming", "False", CHANGE_TIMEOUT)
        .await
        .expect("the status reports the replica");
    let condition = broken
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "ReplicasStreaming"))
        .cloned()
        .expect("condition");
    assert!(
        condition.message.contains("pg-postgresql-1"),
        "{condition:?}"
    );
    let warnings = common::events_with_reason(&running, "pg", "ReplicaNotStreaming").await;
    assert!(!warnings.is_empty());

    running
        .api::<Pod>()
        .delete("pg-postgresql-1", &Default::default())
        .await
        .expect("replica pod deleted");
    cluster
        .wait_condition("ReplicasStreaming", "True", CLUSTER_TIMEOUT)
        .await
        .expect("the replica streams again");
    wait_replicas_caught_up(&cluster, 1).await;
    primary
        .execute("INSERT INTO items VALUES (11)", &[])
        .await
        .expect("a row after the new clone");
    // The new clone is behind ro once its pod is labelled and the EndpointSlice controller
    // has caught up, which may come a moment after it streams.
    let replica = wait_until("a login through ro", CHANGE_TIMEOUT, || async {
        Ok(cluster.sql_via(ClusterService::ReadOnly).await.ok())
    })
    .await
    .expect("login through ro");
    let seen = wait_until("the new row on the replica", CHANGE_TIMEOUT, || async {
        Ok(count(&replica).await.ok().filter(|n| *n == 11))
    })
    .await
    .expect("the new clone replays");
    assert_eq!(seen, 11);
    running.stop().await;
}
