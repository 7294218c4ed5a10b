//! `deploy/monitoring/`: the alerts (a PrometheusRule, and the plain rule file generated from
//! it) pass `promtool check rules` and `promtool test rules` with synthetic series, where each
//! alert fires and stays silent on both sides of its threshold; the Grafana dashboard parses,
//! its queries are valid PromQL, and it and the alerts read only metrics that
//! `docs/operations.md` documents. `monitoring_on_real_node.rs` checks them against real scrapes.

mod monitoring_common;

use std::collections::{BTreeMap, BTreeSet};

use monitoring_common::{
    PROMETHEUS_MADE, alert_tests_path, alerts, dashboard_path, dashboard_queries,
    documented_metrics, metric_names, plain_rules, plain_rules_path, prometheus_rule_path,
    promtool, read, substitute, text, used_metrics,
};

/// The plain rule file is the PrometheusRule's spec; `PGKUBE_WRITE_MONITORING=1` writes it.
#[test]
fn the_plain_rule_file_is_generated_from_the_prometheus_rule() {
    let generated = plain_rules(&read(&prometheus_rule_path())).expect("the PrometheusRule");
    if std::env::var_os("PGKUBE_WRITE_MONITORING").is_some() {
        std::fs::write(plain_rules_path(), &generated).expect("written");
    }
    assert!(
        read(&plain_rules_path()) == generated,
        "deploy/monitoring/pgkube-rules.yaml differs from prometheus-rule.yaml's spec: run \
         `PGKUBE_WRITE_MONITORING=1 cargo test --test monitoring`"
    );
    let rule: serde_yaml::Value =
        serde_yaml::from_str(&read(&prometheus_rule_path())).expect("YAML");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["kind"], "PrometheusRule");
    let plain: serde_yaml::Value = serde_yaml::from_str(&generated).expect("YAML");
    assert_eq!(rule["spec"], plain, "the same groups, parsed");
}

#[test]
fn the_dashboard_and_the_alerts_read_only_documented_metrics() {
    let documented = documented_metrics();
    assert!(documented.len() > 30, "{documented:?}");
    let used = used_metrics().expect("the queries");
    assert!(used.len() > 30, "{used:?}");
    let unknown: BTreeMap<&String, &BTreeSet<String>> = used
        .iter()
        .filter(|(name, _)| !PROMETHEUS_MADE.contains(&name.as_str()))
        .filter(|(name, _)| !documented.contains(name.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "not in docs/operations.md's metric tables: {unknown:#?}"
    );
}

#[test]
fn the_dashboard_has_its_variables_and_the_panels_asked_for() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read(&dashboard_path())).expect("JSON");
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
        .iter()
        .filter_map(|variable| variable["name"].as_str())
        .collect();
    for wanted in ["datasource", "namespace", "cluster"] {
        assert!(variables.contains(&wanted), "{variables:?}");
    }
    let queries = dashboard_queries(&dashboard).expect("queries");
    for query in &queries {
        let datasource_variable = query.source.starts_with("variable ")
            || dashboard["panels"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|panel| panel["title"] == query.source.as_str())
                .all(|panel| panel["datasource"]["uid"] == "${datasource}");
        assert!(
            datasource_variable,
            "{} reads another datasource",
            query.source
        );
    }
    let used = used_metrics().expect("the queries");
    // Operator health, instances and roles, lag, backups, archiving, failovers, PostgreSQL.
    for metric in [
        "up",
        "leader_election_master_status",
        "operator_reconcile_total",
        "operator_reconcile_duration_seconds_bucket",
        "pgkube_cluster_phase",
        "pgkube_postgres_in_recovery",
        "pgkube_postgres_replication_lag_bytes",
        "pgkube_postgres_replication_lag_seconds",
        "pgkube_backup_last_success_timestamp_seconds",
        "pgkube_backups_total",
        "pgkube_wal_last_archived_timestamp_seconds",
        "pgkube_wal_archive_failures_total",
        "pgkube_wal_waiting_files",
        "pgkube_primary_changes_total",
        "pgkube_postgres_connections",
        "pgkube_postgres_database_size_bytes",
        "pgkube_postgres_transactions_committed_total",
        "pgkube_wal_bytes",
    ] {
        assert!(
            used.get(metric)
                .is_some_and(|uses| uses.iter().any(|u| u.starts_with("dashboard"))),
            "no panel reads {metric}"
        );
    }
}

#[test]
fn the_metric_names_of_an_expression_are_found_and_a_misspelt_function_is_refused() {
    let names = |expr: &str| metric_names(expr).expect("parsed");
    assert_eq!(
        names(
            r#"sum by (namespace, cluster) (rate(pgkube_backups_totl{namespace=~"$namespace",result="failed"}[$__rate_interval]))
               / on (namespace) group_left () max without (pod) (up{job="a"}) > 0.5"#
        ),
        BTreeSet::from(["pgkube_backups_totl".to_owned(), "up".to_owned()])
    );
    assert_eq!(
        names("label_values(pgkube_cluster_phase{namespace=~\"$namespace\"}, cluster)"),
        BTreeSet::from(["pgkube_cluster_phase".to_owned()])
    );
    assert_eq!(
        names("histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m]))) * 1e3 + time()"),
        BTreeSet::from(["a_bucket".to_owned()])
    );
    assert!(metric_names("rat(pgkube_wal_bytes[5m])").is_err());
    // A name not documented is found out; only histograms have buckets.
    let documented = documented_metrics();
    assert!(documented.contains("pgkube_wal_bytes"));
    assert!(documented.contains("pgkube_wal_volume_available_bytes"));
    assert!(documented.contains("operator_reconcile_duration_seconds_bucket"));
    assert!(documented.contains("pgkube_primary_change_duration_seconds_count"));
    assert!(!documented.contains("operator_reconcile_duration_seconds"));
    assert!(!documented.contains("pgkube_wal_byte"));
    assert!(!documented.contains("pgkube_wal_bytes_bucket"));
}

/// Every alert has a `promtool test rules` case where it fires and one where it does not.
#[test]
fn every_alert_is_tested_firing_and_silent() {
    let tests: serde_yaml::Value = serde_yaml::from_str(&read(&alert_tests_path())).expect("YAML");
    let mut firing = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for group in tests["tests"].as_sequence().expect("tests") {
        for case in group["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = case["alertname"].as_str().expect("alertname").to_owned();
            match case["exp_alerts"].as_sequence().map(Vec::len) {
                Some(0) | None => silent.insert(name),
                Some(_) => firing.insert(name),
            };
        }
    }
    let names: BTreeSet<String> = alerts(&read(&plain_rules_path()))
        .expect("rules")
        .into_iter()
        .map(|alert| alert.name)
        .collect();
    assert!(names.len() >= 10, "{names:?}");
    assert_eq!(firing, names, "alerts with a case where they fire");
    assert_eq!(silent, names, "alerts with a case where they stay silent");
}

#[test]
fn promtool_checks_the_rules_and_their_tests_pass() {
    let Some(env) = pgkube_testkit::testbed() else {
        return;
    };
    let rules = plain_rules_path();
    let checked = promtool(&env, &["check", "rules", &rules.to_string_lossy()]);
    assert!(checked.status.success(), "{}", text(&checked));
    assert!(
        text(&checked).contains("SUCCESS: 10 rules found"),
        "{}",
        text(&checked)
    );
    let tests = alert_tests_path();
    let tested = promtool(&env, &["test", "rules", &tests.to_string_lossy()]);
    assert!(tested.status.success(), "{}", text(&tested));
    assert!(text(&tested).contains("SUCCESS"), "{}", text(&tested));
}

/// Each query of the dashboard, with its variables set as Grafana sets them, is PromQL that
/// promtool parses.
#[test]
fn every_dashboard_query_is_valid_promql() {
    let Some(env) = pgkube_testkit::testbed() else {
        return;
    };
    let dashboard: serde_json::Value =
        serde_json::from_str(&read(&dashboard_path())).expect("JSON");
    let values = [
        ("job", "pgkube"),
        ("namespace", "db|shop"),
        ("cluster", ".*"),
        ("__rate_interval", "2m"),
        ("__range", "6h"),
    ];
    let queries = dashboard_queries(&dashboard).expect("queries");
    assert!(queries.len() > 30);
    for query in queries {
        let expr = match monitoring_common::label_values(&query.expr) {
            Some((selector, _)) => selector.to_owned(),
            None => query.expr.clone(),
        };
        let expr = substitute(&expr, &values);
        assert!(!expr.contains('$'), "a variable left in {expr}");
        let parsed = promtool(&env, &["--experimental", "promql", "format", &expr]);
        assert!(
            parsed.status.success(),
            "{}: {expr}\n{}",
            query.source,
            text(&parsed)
        );
    }
}
