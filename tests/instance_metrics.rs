//! PostgreSQL's metrics on the instance manager's metrics port, with `pgkube instance run` as
//! real processes on this machine and PostgreSQL 15, no Kubernetes (the beds of
//! `instance_manager.rs`): the primary reports its streaming replica's lag, the replica's slot
//! and the WAL it retains, its connections, databases and checkpoints; the replica reports
//! itself in recovery with its replay delay.

mod instance_common;

use instance_common::*;
use pgkube_testkit::metric_samples;

/// Well under the metrics connection's statement timeout (10 s), which would end a query
/// that was not cancelled.
const CANCELLED_WITHIN: std::time::Duration = std::time::Duration::from_secs(3);

#[tokio::test]
async fn the_primary_and_its_replica_serve_their_postgresql_metrics() {
    let mut bed = Bed::new();
    let (primary, writer) = primary_with_kept_rows(&mut bed, 2).await;
    let replica = bed.start(1, 2);
    wait_replica_of(&bed, replica, primary, 100).await;

    let replica_pod = bed.instances[replica].pod.clone();
    let lag = format!("pgkube_postgres_replication_lag_bytes{{replica=\"{replica_pod}\"}}");
    let samples = eventually("the primary reports its replica", || async {
        let samples = metric_samples(bed.instances[primary].metrics).await?;
        Ok(samples.contains_key(&lag).then_some(samples))
    })
    .await;
    let value = |name: &str| {
        *samples
            .get(name)
            .unwrap_or_else(|| panic!("{name} in {samples:#?}"))
    };
    assert_eq!(value("pgkube_postgres_up"), 1.0);
    assert_eq!(value("pgkube_postgres_in_recovery"), 0.0);
    assert!(value(&lag) >= 0.0);
    let slot = "pgkube_postgres_slot_retained_wal_bytes{slot=\"pgkube_it_1\"}";
    assert!(value(slot) >= 0.0, "the replica's slot");
    assert!(
        value("pgkube_postgres_database_size_bytes{database=\"postgres\"}") > 1_000_000.0,
        "an initdb'd database is megabytes"
    );
    assert!(value("pgkube_postgres_transactions_committed_total{database=\"postgres\"}") > 0.0);
    assert!(value("pgkube_postgres_oldest_xid_age") > 0.0);
    // The test's own connection, at least: idle between its queries.
    let connections: f64 = samples
        .iter()
        .filter(|(series, _)| series.starts_with("pgkube_postgres_connections{"))
        .map(|(_, count)| count)
        .sum();
    assert!(connections >= 1.0, "{samples:#?}");
    drop(writer);

    let samples = metric_samples(bed.instances[replica].metrics)
        .await
        .expect("the replica's metrics");
    assert_eq!(samples.get("pgkube_postgres_up"), Some(&1.0));
    assert_eq!(samples.get("pgkube_postgres_in_recovery"), Some(&1.0));
    assert!(
        samples
            .get("pgkube_postgres_replay_delay_seconds")
            .is_some_and(|delay| *delay >= 0.0),
        "{samples:#?}"
    );
    assert!(
        !samples
            .keys()
            .any(|series| series.contains("replication_lag"))
    );

    terminate(&mut bed, replica);
    terminate(&mut bed, primary);
}

/// Custom queries in postgres_exporter's format, from a file read at each scrape: none yet is
/// an invalid file; then each row's gauges labelled by its labels, a failing query marked down
/// while the others still report; a broken file again invalid, the built-in metrics unharmed.
#[tokio::test]
async fn custom_queries_from_a_file_are_served_and_follow_its_changes() {
    let mut bed = Bed::new();
    let (primary, writer) = primary_with_kept_rows(&mut bed, 1).await;
    let address = bed.instances[primary].metrics;
    let file = bed.instances[primary].dir.join(CUSTOM_QUERIES_FILE);
    writer
        .batch_execute("CREATE TABLE guarded (id int); CREATE SEQUENCE guarded_ids")
        .await
        .expect("what the queries must not touch");
    let samples = metric_samples(address).await.expect("metrics");
    assert_eq!(
        samples.get("pgkube_postgres_custom_queries_valid"),
        Some(&0.0)
    );

    std::fs::write(
        &file,
        r#"
databases:
  query: "SELECT datname, numbackends, xact_commit FROM pg_stat_database WHERE datname = 'postgres'"
  metrics:
    - datname: {usage: LABEL, description: "The database"}
    - numbackends: {usage: GAUGE, description: "Backends"}
    - xact_commit: {usage: COUNTER, description: "Commits"}
broken:
  query: "SELECT nonsense"
  metrics:
    - nonsense: {usage: GAUGE}
dropper:
  query: "SELECT 1 AS one; DROP TABLE guarded"
  metrics:
    - one: {usage: GAUGE}
writer:
  query: "SELECT count(*) AS n FROM (SELECT set_config('default_transaction_read_only', 'off', false)) s, LATERAL (SELECT nextval('guarded_ids')) w"
  metrics:
    - n: {usage: GAUGE}
"#,
    )
    .expect("the queries file");
    let samples = eventually("the custom queries are served", || async {
        let samples = metric_samples(address).await?;
        Ok((samples.get("pgkube_postgres_custom_queries_valid") == Some(&1.0)).then_some(samples))
    })
    .await;
    assert!(
        samples
            .get("databases_numbackends{datname=\"postgres\"}")
            .is_some_and(|backends| *backends >= 1.0),
        "{samples:#?}"
    );
    assert!(samples.contains_key("databases_xact_commit_total{datname=\"postgres\"}"));
    assert_eq!(
        samples.get("pgkube_postgres_custom_query_up{query=\"databases\"}"),
        Some(&1.0)
    );
    assert_eq!(
        samples.get("pgkube_postgres_custom_query_up{query=\"broken\"}"),
        Some(&0.0)
    );
    assert_eq!(samples.get("pgkube_postgres_up"), Some(&1.0));
    // The queries run read-only, each as one statement: neither a second statement nor a write
    // in the query gets through.
    for query in ["dropper", "writer"] {
        let up = format!("pgkube_postgres_custom_query_up{{query=\"{query}\"}}");
        assert_eq!(samples.get(&up), Some(&0.0), "{query}");
    }
    let untouched = writer
        .query_one("SELECT to_regclass('guarded') IS NOT NULL, (SELECT last_value FROM guarded_ids) = 1 AND NOT (SELECT is_called FROM guarded_ids)", &[])
        .await
        .expect("a query");
    assert_eq!(
        (untouched.get::<_, bool>(0), untouched.get::<_, bool>(1)),
        (true, true)
    );

    // A query that outlasts the scrape's time is cut off, and cancelled on the server: no
    // backend goes on sleeping until the statement timeout (10 s).
    std::fs::write(
        &file,
        "sleeper:\n  query: \"SELECT 1 AS one FROM pg_sleep(60)\"\n  metrics:\n    - one: {usage: GAUGE}\n",
    )
    .expect("a slow query");
    let samples = metric_samples(address).await.expect("metrics");
    assert_eq!(
        samples.get("pgkube_postgres_custom_query_up{query=\"sleeper\"}"),
        Some(&0.0)
    );
    assert_eq!(samples.get("pgkube_postgres_up"), Some(&1.0));
    let sleeping = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%FROM pg_sleep(60)%' \
                    AND pid <> pg_backend_pid()";
    pgkube_testkit::wait_until(
        "the slow query to be cancelled",
        CANCELLED_WITHIN,
        || async {
            let row = writer.query_one(sleeping, &[]).await?;
            Ok((row.get::<_, i64>(0) == 0).then_some(()))
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));

    std::fs::write(&file, "databases: [not, a, query]\n").expect("a broken file");
    let samples = metric_samples(address).await.expect("metrics");
    assert_eq!(
        samples.get("pgkube_postgres_custom_queries_valid"),
        Some(&0.0)
    );
    assert_eq!(samples.get("pgkube_postgres_up"), Some(&1.0));
    drop(writer);
    terminate(&mut bed, primary);
}
