//! The dashboard and the alerts against real series. A manager process (with leader election)
//! runs a two-instance cluster on the test bed's real node, archiving WAL to Garage; after a
//! switchover and a scheduled backup, the manager's `/metrics` and both instances' `:9187`
//! `/metrics` hold every metric the dashboard and the alerts read (Prometheus' own `up`
//! aside). Then each of the dashboard's queries runs in `promtool test rules` over those
//! samples, labelled as the scrape configuration of docs/operations.md labels them, and finds
//! at least one series.

mod manager_common;
mod monitoring_common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use manager_common::Manager;
use monitoring_common::{
    PROMETHEUS_MADE, dashboard_path, dashboard_queries, label_values, promtool, read, substitute,
    text, used_metrics,
};
use pgkube_controllers::cluster::build::METRICS_PORT;
use pgkube_controllers::cluster::failover::SWITCHOVER_ANNOTATION;
use pgkube_crds::{PostgreSQLCluster, PrimaryChangeKind};
use pgkube_testkit::wal::finish_segments;
use pgkube_testkit::{
    TestBucket, TestCluster, TestNamespace, backup_config, create_s3_secret, http_get,
    install_crds, test_storage, testbed, wait_until,
};

const TIMEOUT: Duration = Duration::from_secs(240);
/// The cluster's schedule until the switchover is over: 1 January only.
const NEVER: &str = "0 0 1 1 *";
/// Then every minute, so that a scheduled time comes within the test.
const EVERY_MINUTE: &str = "* * * * *";
/// The Prometheus job and namespace the manager's series get in the promtool check.
const MANAGER_JOB: &str = "pgkube";
const MANAGER_NAMESPACE: &str = "pgkube-system";

#[tokio::test]
async fn the_dashboard_and_the_alerts_find_their_series_in_real_scrapes() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "monitoring").await;
    let ns = namespace.name().to_owned();
    let mut flags = vec![
        "--watch-namespaces",
        ns.as_str(),
        "--leader-elect",
        "--leader-elect-id",
        "pgkube-monitoring",
        "--leader-elect-namespace",
        ns.as_str(),
    ];
    flags.extend_from_slice(manager_common::SHORT_LEASE_FLAGS);
    let manager = Manager::start(&env, "monitoring", &flags);
    let bucket = TestBucket::create(&env, "monitoring").await;
    create_s3_secret(&client, &env, &ns, "s3-keys", None)
        .await
        .expect("S3 Secret");
    let storage = test_storage(&env, bucket.name(), "s3-keys");
    let cluster = TestCluster::builder("pg")
        .replicas(2)
        .spec(|spec| spec.backup = Some(backup_config(storage, NEVER)))
        .start(&namespace)
        .await
        .expect("the cluster becomes Running");
    switch_over_then_back_up_every_minute(&client, &cluster).await;

    let manager_address = manager.endpoint("metrics").await;
    let addresses: Vec<(String, SocketAddr)> = cluster
        .pods()
        .await
        .expect("pods")
        .into_iter()
        .map(|pod| {
            let ip = pod.address.expect("an address");
            (pod.name, SocketAddr::new(ip, METRICS_PORT))
        })
        .collect();
    let scrapes = wait_for_every_metric(manager_address, &addresses).await;
    let cluster_label = cluster_label_of_pods(&client, &ns, &addresses).await;
    let series = labelled_series(&scrapes, &ns, &cluster_label);
    every_dashboard_query_finds_series(&env, &series, &ns);

    cluster.delete(TIMEOUT).await.expect("the cluster goes");
    manager.terminate();
    namespace.cleanup().await;
    bucket.cleanup().await;
}

/// A switchover (for the primary-change series), then a backup every minute, and some WAL
/// files finished for the archiver.
async fn switch_over_then_back_up_every_minute(client: &kube::Client, cluster: &TestCluster) {
    let first = cluster.wait_healthy(None, TIMEOUT).await.expect("healthy");
    let pods = cluster.pods().await.expect("pods");
    let second = pods
        .iter()
        .map(|pod| pod.name.clone())
        .find(|name| *name != first)
        .expect("a replica");
    let clusters: Api<PostgreSQLCluster> = Api::namespaced(client.clone(), cluster.namespace());
    let annotate =
        serde_json::json!({"metadata": {"annotations": {SWITCHOVER_ANNOTATION: second}}});
    clusters
        .patch(
            cluster.name(),
            &PatchParams::default(),
            &Patch::Merge(&annotate),
        )
        .await
        .expect("switchover asked for");
    cluster
        .wait_primary_change(PrimaryChangeKind::Switchover, &first, TIMEOUT)
        .await
        .expect("switched over");
    cluster
        .wait_healthy(Some(&second), TIMEOUT)
        .await
        .expect("healthy again");
    let schedule = serde_json::json!({"spec": {"backup": {"schedule": {"cron": EVERY_MINUTE}}}});
    clusters
        .patch(
            cluster.name(),
            &PatchParams::default(),
            &Patch::Merge(&schedule),
        )
        .await
        .expect("scheduled every minute");
    let sql = cluster.sql().await.expect("SQL");
    finish_segments(&sql, 2)
        .await
        .expect("WAL for the archiver");
}

/// Scrapes the manager and the instances until every metric the dashboard and the alerts
/// read has a sample; the scrapes' bodies by source (`manager` or the pod's name).
async fn wait_for_every_metric(
    manager: SocketAddr,
    instances: &[(String, SocketAddr)],
) -> Vec<(String, String)> {
    let used = used_metrics().expect("the dashboard's and the alerts' metrics");
    let scraped = wait_until(
        "every metric of the dashboard and the alerts in the scrapes",
        TIMEOUT,
        || async {
            let scrapes = scrape(manager, instances).await?;
            Ok(missing_metrics(&used, &scrapes)
                .is_empty()
                .then_some(scrapes))
        },
    )
    .await;
    match scraped {
        Ok(scrapes) => scrapes,
        Err(error) => {
            let scrapes = scrape(manager, instances).await.expect("scrapes");
            let missing = missing_metrics(&used, &scrapes);
            panic!("{error:#}; no sample of: {missing:#?}");
        }
    }
}

/// Runs each dashboard query in promtool over `series` and expects series from each.
fn every_dashboard_query_finds_series(
    env: &pgkube_testkit::TestEnv,
    series: &[(String, f64)],
    namespace: &str,
) {
    let dir = tempfile::tempdir().expect("a directory");
    let queries = dashboard_checks(namespace);
    write_promtool_test(dir.path(), series, &queries);
    let test = dir.path().join("test.yaml");
    let tested = promtool(env, &["test", "rules", &test.to_string_lossy()]);
    assert!(
        tested.status.success(),
        "a dashboard query found no series in the real samples:\n{}\nqueries:\n{}",
        text(&tested),
        queries
            .iter()
            .enumerate()
            .map(|(index, (source, expr))| format!("Query{index} ({source}): {expr}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// One scrape's body, with the Prometheus target labels it gets.
struct Scrape {
    body: String,
    target: BTreeMap<String, String>,
    /// `honor_labels`: the scraped labels win over the target's (the manager's own
    /// `namespace` and `cluster`).
    honor_labels: bool,
}

/// The manager's `/metrics` and each instance's.
async fn scrape(
    manager: SocketAddr,
    instances: &[(String, SocketAddr)],
) -> anyhow::Result<Vec<(String, String)>> {
    let mut bodies = vec![("manager".to_owned(), get_metrics(manager).await?)];
    for (pod, address) in instances {
        bodies.push((pod.clone(), get_metrics(*address).await?));
    }
    Ok(bodies)
}

async fn get_metrics(address: SocketAddr) -> anyhow::Result<String> {
    let (code, body) = http_get(address, "/metrics").await?;
    anyhow::ensure!(code == 200, "{address}: HTTP {code}");
    Ok(body)
}

/// The metrics of `used` that no scrape has a sample of.
fn missing_metrics(
    used: &BTreeMap<String, BTreeSet<String>>,
    scrapes: &[(String, String)],
) -> BTreeMap<String, BTreeSet<String>> {
    let scraped: BTreeSet<String> = scrapes
        .iter()
        .flat_map(|(_, body)| samples(body))
        .map(|sample| sample.name)
        .collect();
    used.iter()
        .filter(|(name, _)| !PROMETHEUS_MADE.contains(&name.as_str()))
        .filter(|(name, _)| !scraped.contains(name.as_str()))
        .map(|(name, uses)| (name.clone(), uses.clone()))
        .collect()
}

/// A sample of an OpenMetrics text.
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The samples of `body` (comments, timestamps and exemplars left out).
fn samples(body: &str) -> Vec<Sample> {
    body.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| {
            let line = line.split(" # ").next()?;
            let (series, rest) = match line.rfind('}') {
                Some(close) => line.split_at(close + 1),
                None => line.split_at(line.find(' ')?),
            };
            let value = rest.split_whitespace().next()?.parse().ok()?;
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, parse_labels(labels.strip_suffix('}')?)),
                None => (series, BTreeMap::new()),
            };
            Some(Sample {
                name: name.to_owned(),
                labels,
                value,
            })
        })
        .collect()
}

/// `a="x",b="y\"z"` as a map (escapes undone).
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some((name, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((index, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => {}
                },
                '"' => {
                    end = index + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(name.trim_start_matches(',').trim().to_owned(), value);
        rest = &after[end..];
    }
    labels
}

/// Each instance pod's `app.kubernetes.io/instance` label, which the PodMonitor makes the
/// `cluster` label of its series.
async fn cluster_label_of_pods(
    client: &kube::Client,
    namespace: &str,
    instances: &[(String, SocketAddr)],
) -> BTreeMap<String, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut labels = BTreeMap::new();
    for (name, _) in instances {
        let pod = pods.get(name).await.expect("the pod");
        let label = pod
            .metadata
            .labels
            .unwrap_or_default()
            .remove("app.kubernetes.io/instance")
            .expect("the instance label");
        labels.insert(name.clone(), label);
    }
    labels
}

/// Every sample as Prometheus stores it, `name{labels}` with its value, plus `up` for each
/// target: the manager's with job `pgkube` and its own labels kept (honor_labels), the
/// instances' with `namespace`, `pod` and `cluster` (from the pod label) as a PodMonitor sets
/// them.
fn labelled_series(
    scrapes: &[(String, String)],
    namespace: &str,
    cluster_label: &BTreeMap<String, String>,
) -> Vec<(String, f64)> {
    let targets = scrapes.iter().map(|(source, body)| {
        let mut target = BTreeMap::new();
        let honor_labels = source == "manager";
        if honor_labels {
            target.insert("job".to_owned(), MANAGER_JOB.to_owned());
            target.insert("namespace".to_owned(), MANAGER_NAMESPACE.to_owned());
            target.insert("pod".to_owned(), "pgkube-0".to_owned());
            target.insert("instance".to_owned(), "pgkube-0:8080".to_owned());
        } else {
            target.insert("job".to_owned(), "pgkube-postgresql".to_owned());
            target.insert("namespace".to_owned(), namespace.to_owned());
            target.insert("pod".to_owned(), source.clone());
            target.insert("instance".to_owned(), format!("{source}:9187"));
            let cluster = cluster_label.get(source).cloned().unwrap_or_default();
            target.insert("cluster".to_owned(), cluster);
        }
        Scrape {
            body: body.clone(),
            target,
            honor_labels,
        }
    });
    let mut series = Vec::new();
    for scrape in targets {
        series.push((format!("up{}", render_labels(&scrape.target)), 1.0));
        for sample in samples(&scrape.body) {
            if !sample.value.is_finite() {
                continue;
            }
            let mut labels = scrape.target.clone();
            for (name, value) in sample.labels {
                if scrape.honor_labels || !labels.contains_key(&name) {
                    labels.insert(name, value);
                } else {
                    labels.insert(format!("exported_{name}"), value);
                }
            }
            series.push((
                format!("{}{}", sample.name, render_labels(&labels)),
                sample.value,
            ));
        }
    }
    series
}

fn render_labels(labels: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = labels
        .iter()
        .map(|(name, value)| {
            let escaped = value
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{name}=\"{escaped}\"")
        })
        .collect();
    format!("{{{}}}", pairs.join(","))
}

/// Each query of the dashboard as Grafana sends it for this test's namespace and cluster `pg`:
/// `label_values` variables as a query for the label's non-empty values.
fn dashboard_checks(namespace: &str) -> Vec<(String, String)> {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read(&dashboard_path())).expect("JSON");
    let values = [
        ("job", MANAGER_JOB),
        ("namespace", namespace),
        ("cluster", "pg"),
        ("__rate_interval", "5m"),
        ("__range", "10m"),
    ];
    dashboard_queries(&dashboard)
        .expect("queries")
        .into_iter()
        .map(|query| {
            let expr = match label_values(&query.expr) {
                Some((selector, label)) => format!(
                    "count by ({label}) ({selector}) unless count by ({label}) ({{__name__=~\".+\",{label}=\"\"}})"
                ),
                None => query.expr.clone(),
            };
            (query.source, substitute(&expr, &values))
        })
        .collect()
}

/// A rule file with an alert `Query<i>` per query, firing when the query finds any series,
/// and a promtool test over `series` (the same value for 10 minutes) that expects each one to
/// fire.
fn write_promtool_test(
    dir: &std::path::Path,
    series: &[(String, f64)],
    queries: &[(String, String)],
) {
    let rules: Vec<serde_json::Value> = queries
        .iter()
        .enumerate()
        .map(|(index, (_, expr))| {
            serde_json::json!({"alert": format!("Query{index}"), "expr": format!("count({expr}) > 0")})
        })
        .collect();
    let rule_file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    std::fs::write(
        dir.join("rules.yaml"),
        serde_yaml::to_string(&rule_file).expect("YAML"),
    )
    .expect("written");
    let input: Vec<serde_json::Value> = series
        .iter()
        .map(|(series, value)| {
            let values = vec![value.to_string(); 11].join(" ");
            serde_json::json!({"series": series, "values": values})
        })
        .collect();
    let cases: Vec<serde_json::Value> = (0..queries.len())
        .map(|index| {
            serde_json::json!({
                "eval_time": "10m",
                "alertname": format!("Query{index}"),
                "exp_alerts": [{"exp_labels": {}}],
            })
        })
        .collect();
    let test = serde_json::json!({
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": input, "alert_rule_test": cases}],
    });
    std::fs::write(
        dir.join("test.yaml"),
        serde_yaml::to_string(&test).expect("YAML"),
    )
    .expect("written");
}
