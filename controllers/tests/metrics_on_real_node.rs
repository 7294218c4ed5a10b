//! PostgreSQL's metrics on the test bed's real node: each pod of a two-instance cluster serves
//! `/metrics` on its metrics port (9187) from the instance manager, the primary with its
//! replica's lag and the replica's slot, the replica as in recovery; and the rows of the custom
//! queries of the ConfigMap that `spec.monitoring.customQueries` names.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::Running;
use k8s_openapi::api::core::v1::{ConfigMap, ConfigMapKeySelector};
use pgkube_controllers::cluster::build::METRICS_PORT;
use pgkube_testkit::{TestCluster, metric_samples, wait_until};

const RESYNC: Duration = Duration::from_secs(30);
const METRICS_TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test]
async fn each_instance_serves_its_postgresql_metrics() {
    let Some(running) = Running::start("metrics", RESYNC).await else {
        return;
    };
    let queries: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pg-metrics"},
        "data": {"queries.yaml": CUSTOM_QUERIES},
    }))
    .expect("a ConfigMap");
    running
        .api::<ConfigMap>()
        .create(&Default::default(), &queries)
        .await
        .expect("the queries' ConfigMap");
    let cluster = TestCluster::builder("pg")
        .replicas(2)
        .spec(|spec| {
            spec.monitoring = Some(pgkube_crds::Monitoring {
                custom_queries: Some(ConfigMapKeySelector {
                    name: "pg-metrics".to_owned(),
                    key: "queries.yaml".to_owned(),
                    optional: None,
                }),
            });
        })
        .start(&running.namespace)
        .await
        .expect("the cluster becomes Running");
    let primary = cluster
        .wait_healthy(None, METRICS_TIMEOUT)
        .await
        .expect("healthy");
    let pods = cluster.pods().await.expect("pods");
    let address = |name: &str| {
        let pod = pods.iter().find(|pod| pod.name == name).expect("the pod");
        SocketAddr::new(pod.address.expect("an address"), METRICS_PORT)
    };
    let replica = pods
        .iter()
        .map(|pod| pod.name.clone())
        .find(|name| *name != primary)
        .expect("a replica");
    let lag = format!("pgkube_postgres_replication_lag_bytes{{replica=\"{replica}\"}}");
    let samples = wait_until(
        "the primary reports its replica",
        METRICS_TIMEOUT,
        || async {
            let samples = metric_samples(address(&primary)).await?;
            Ok(samples.contains_key(&lag).then_some(samples))
        },
    )
    .await
    .expect("the primary's metrics");
    assert_eq!(samples.get("pgkube_postgres_up"), Some(&1.0));
    assert_eq!(samples.get("pgkube_postgres_in_recovery"), Some(&0.0));
    assert!(
        samples
            .keys()
            .any(|series| series.starts_with("pgkube_postgres_slot_retained_wal_bytes{")),
        "the replica's slot: {samples:#?}"
    );
    assert!(
        samples
            .get("pgkube_postgres_database_size_bytes{database=\"app\"}")
            .is_some_and(|size| *size > 0.0),
        "the application database: {samples:#?}"
    );
    let samples = metric_samples(address(&replica))
        .await
        .expect("the replica's metrics");
    assert_eq!(samples.get("pgkube_postgres_up"), Some(&1.0));
    assert_eq!(samples.get("pgkube_postgres_in_recovery"), Some(&1.0));
    for pod in [&primary, &replica] {
        let samples = metric_samples(address(pod)).await.expect("metrics");
        assert_eq!(
            samples.get("pgkube_postgres_custom_queries_valid"),
            Some(&1.0),
            "{pod}: {samples:#?}"
        );
        assert_eq!(
            samples.get("app_tables_count{database=\"postgres\"}"),
            Some(&0.0),
            "{pod}: {samples:#?}"
        );
    }
    running.stop().await;
}

/// One query in postgres_exporter's format: the user tables of the `postgres` database.
const CUSTOM_QUERIES: &str = r#"
app_tables:
  query: "SELECT current_database() AS database, count(*) AS count FROM pg_stat_user_tables"
  metrics:
    - database: {usage: LABEL, description: "The database"}
    - count: {usage: GAUGE, description: "User tables"}
"#;
