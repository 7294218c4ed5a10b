//! Benchmark of failover: how long writes through `<cluster>-rw` stop when the primary's
//! postmaster is killed (`kill -9`), on the test bed's real node.
//!
//! Not a test: it prints figures and asserts nothing about them. Needs the test bed
//! (`tests/testbed/up`):
//!
//! ```text
//! cargo bench --bench failover                      # 5 failovers
//! cargo bench --bench failover -- --failovers 10    # or PGKUBE_BENCH_FAILOVERS=10
//! PGKUBE_BENCH_FAILOVER_DELAY=5 cargo bench --bench failover
//! ```
//!
//! It starts the real manager (`pgkube run`, the binary `cargo bench` builds: the release
//! profile) watching a fresh namespace, and a PostgreSQLCluster there of 3 instances of
//! PostgreSQL 15 on the real node with `spec.highAvailability.failoverDelaySeconds` =
//! `PGKUBE_BENCH_FAILOVER_DELAY` (default 3). The instance pods run the debug `pgkube` of this
//! checkout (the test bed's `pgkube` image), which the bench builds first with
//! `cargo build --bin pgkube`, so that they run the code being measured.
//!
//! Each round waits until the cluster is healthy (a primary, two replicas streaming and caught
//! up, every pod labelled with its role), kills the primary's postmaster, and tries a one-row
//! INSERT through `-rw` on a new connection every 100 ms (each try cut after 3 s) until one
//! succeeds. It prints, per round, the time from the kill to that first successful write,
//! which pod was primary before and after, and what `status.primaryChange` says; then the
//! minimum, median and maximum over the rounds. A round whose write does not succeed within
//! 2 minutes is reported as such and left out of the figures.
//!
//! Then `PGKUBE_BENCH_ROLLS` (default 5) rolling updates: each changes the instances' CPU
//! request (a new pod template), while a client writes one row through `-rw` every 100 ms on a
//! new connection, and waits until every pod was replaced and the cluster is healthy. It
//! prints, per roll, the longest time between two acknowledged writes (how long writes were
//! unavailable), the failed tries and what `status.primaryChange` says; then the minimum,
//! median and maximum.
//!
//! Then `PGKUBE_BENCH_NODE_LOSSES` (default 5) node losses: the cluster tolerates the test
//! bed's second real node, so its instances spread over both. Each round moves the primary to
//! `testbed-local-b` by a switchover if it is not there, kills that node's agent (its pods'
//! processes die with it, their objects stay), and tries a write through `-rw` every 100 ms as
//! above. It prints the time from the loss to the first successful write, then brings the node
//! back and waits until the cluster is healthy again; then the minimum, median and maximum.
//!
//! The instance managers are told to run the debug `pgkube` too (`--instance-manager-binary`),
//! so that the release manager does not replace them in place with itself.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use pgkube_crds::{InstanceRole, PostgreSQLCluster};
use pgkube_testkit::{
    LostNode, RwWriter, SECOND_NODE, TestCluster, TestEnv, TestNamespace, http_get, install_crds,
    postmaster_of, second_node_toleration, send_signal, testbed, wait_until,
};

#[path = "../tests/manager_common/mod.rs"]
mod manager_common;

use manager_common::Manager;

const DEFAULT_FAILOVERS: usize = 5;
const DEFAULT_DELAY_SECONDS: u64 = 3;
const DEFAULT_ROLLS: usize = 5;
const DEFAULT_NODE_LOSSES: usize = 5;
const CLUSTER: &str = "bench";
const START_TIMEOUT: Duration = Duration::from_secs(300);
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(300);
const WRITE_TIMEOUT: Duration = Duration::from_secs(120);

fn main() {
    let Some(env) = testbed() else {
        println!("failover: test bed not running, nothing measured");
        return;
    };
    let failovers = failovers();
    let delay = delay_seconds();
    build_instance_manager();
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(bench(env, failovers, delay));
}

/// `--failovers N` (or `--failovers=N`) among the arguments, else `PGKUBE_BENCH_FAILOVERS`,
/// else 5. `cargo bench` passes `--bench` too, which is ignored.
fn failovers() -> usize {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let from_arguments = arguments.iter().enumerate().find_map(|(i, argument)| {
        if let Some(value) = argument.strip_prefix("--failovers=") {
            return Some(value.to_owned());
        }
        (argument == "--failovers").then(|| arguments.get(i + 1).cloned().unwrap_or_default())
    });
    from_arguments
        .or_else(|| std::env::var("PGKUBE_BENCH_FAILOVERS").ok())
        .map(|value| {
            value
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .unwrap_or_else(|| panic!("the number of failovers {value:?} is not a count"))
        })
        .unwrap_or(DEFAULT_FAILOVERS)
}

/// A count from the environment variable `name`, else `default`.
fn count_from(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(default)
}

/// One rolling update under writes; returns the longest time writes were unavailable.
async fn rolling_update(
    env: &TestEnv,
    cluster: &TestCluster,
    namespace: &str,
    roll: usize,
) -> Duration {
    let before = wait_healthy(cluster).await;
    let old_pods = pod_uids(cluster).await;
    cluster
        .sql()
        .await
        .expect("login through rw")
        .batch_execute("DROP TABLE IF EXISTS items; CREATE TABLE items (id int PRIMARY KEY)")
        .await
        .expect("a fresh table");
    let writer = RwWriter::start(cluster.clone());
    writer
        .wait_for(0, 10, HEALTHY_TIMEOUT)
        .await
        .unwrap_or_else(|error| panic!("{error:#}"));
    let request = format!("{}m", 10 + roll);
    let patch = serde_json::json!({"spec": {"resources": {"requests": {"cpu": request}}}});
    cluster
        .api()
        .patch(CLUSTER, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .expect("a new CPU request");
    wait_until("every pod to be replaced", HEALTHY_TIMEOUT, || async {
        let now = pod_uids(cluster).await;
        let replaced = now.len() == 3 && now.iter().all(|uid| !old_pods.contains(uid));
        Ok(replaced.then_some(()))
    })
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));
    let after = wait_healthy(cluster).await;
    writer
        .wait_for(writer.count(), 10, HEALTHY_TIMEOUT)
        .await
        .unwrap_or_else(|error| panic!("{error:#}"));
    let written = writer.stop().await;
    let status = cluster_status(env, namespace).await;
    println!(
        "roll {roll}: primary {before} -> {after}: writes unavailable for at most {}, {} of {} tries failed; primaryChange: {}",
        seconds(written.longest_gap),
        written.failures,
        written.failures + written.acknowledged.len(),
        describe_change(&status["primaryChange"])
    );
    written.longest_gap
}

async fn pod_uids(cluster: &TestCluster) -> Vec<String> {
    cluster
        .pods()
        .await
        .map(|pods| pods.into_iter().map(|pod| pod.uid).collect())
        .unwrap_or_default()
}

fn delay_seconds() -> u64 {
    std::env::var("PGKUBE_BENCH_FAILOVER_DELAY")
        .ok()
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(DEFAULT_DELAY_SECONDS)
}

/// Builds the debug `pgkube` that the test bed's `pgkube` image runs in the instance pods.
fn build_instance_manager() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    eprintln!("failover: building the instance pods' pgkube (cargo build --bin pgkube)");
    let status = Command::new(cargo)
        .args(["build", "--bin", "pgkube"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("running cargo build");
    assert!(status.success(), "cargo build --bin pgkube: {status}");
}

/// A copy of the manager binary `cargo bench` built, so that a build of the same target
/// during the bench cannot change it under the running manager.
fn kept_manager_binary(directory: &Path) -> PathBuf {
    let kept = directory.join("pgkube-failover-bench");
    std::fs::copy(env!("CARGO_BIN_EXE_pgkube"), &kept).expect("copying the manager binary");
    kept
}

/// One round's result.
struct Round {
    before: String,
    after: Option<String>,
    /// From the kill or loss to the first successful write through rw (`None`: none in time).
    took: Option<Duration>,
    change: String,
}

async fn bench(env: TestEnv, failovers: usize, delay: u64) {
    let client = env.kube_client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "failover-bench").await;
    let directory = std::env::temp_dir().join(format!("pgkube-bench-{}", namespace.name()));
    std::fs::create_dir_all(&directory).expect("a directory for the manager binary");
    let mut manager = start_manager(&env, &namespace, &directory).await;
    let cluster = TestCluster::builder(CLUSTER)
        .replicas(3)
        .timeout(START_TIMEOUT)
        .spec(|spec| spec.tolerations.push(second_node_toleration()))
        .extra_spec(serde_json::json!({"highAvailability": {"failoverDelaySeconds": delay}}))
        .start(&namespace)
        .await
        .unwrap_or_else(|error| panic!("the cluster becomes Running: {error:#}"));
    cluster
        .sql()
        .await
        .expect("login through rw")
        .batch_execute(
            "CREATE TABLE beats (id bigserial PRIMARY KEY, at timestamptz DEFAULT now())",
        )
        .await
        .expect("a table");
    println!(
        "failover: {failovers} kill -9 of the primary's postmaster, failoverDelaySeconds {delay}, \
         namespace {}",
        namespace.name()
    );
    let mut rounds = Vec::new();
    for round in 1..=failovers {
        let result = kill_round(&env, &cluster, namespace.name(), round).await;
        print_round(round, "the kill", &result);
        rounds.push(result);
    }
    print_summary("failovers", &rounds);
    roll_rounds(&env, &cluster, namespace.name()).await;
    node_loss_rounds(&env, &cluster, namespace.name()).await;

    if let Err(error) = cluster.delete(Duration::from_secs(120)).await {
        eprintln!("failover: {error:#}");
    }
    manager.terminate();
    let _ = manager.exit_code(Duration::from_secs(60)).await;
    namespace.cleanup().await;
    let _ = std::fs::remove_dir_all(&directory);
}

/// The release manager, watching `namespace`, ready.
async fn start_manager(env: &TestEnv, namespace: &TestNamespace, directory: &Path) -> Manager {
    let instance_manager = pgkube_testkit::node_pgkube_binary();
    let instance_manager = instance_manager.to_string_lossy();
    let manager = Manager::start_program(
        &kept_manager_binary(directory),
        env,
        "manager-failover-bench",
        &[
            "--watch-namespaces",
            namespace.name(),
            "--webhook-bind-address",
            "0",
            "--instance-manager-binary",
            &instance_manager,
        ],
        &[("RUST_LOG", "info")],
    );
    let health = manager.endpoint("health probes").await;
    wait_until("the manager to be ready", START_TIMEOUT, || async {
        let (status, _) = http_get(health, "/readyz").await?;
        Ok((status == 200).then_some(()))
    })
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));
    manager
}

/// Kills the primary's postmaster and waits for a write through rw.
async fn kill_round(env: &TestEnv, cluster: &TestCluster, namespace: &str, round: usize) -> Round {
    let before = wait_healthy(cluster).await;
    let pid =
        postmaster_of(namespace, &before).unwrap_or_else(|| panic!("the postmaster of {before}"));
    let killed = Instant::now();
    send_signal(pid, "KILL").expect("kill -9");
    let took = first_write_after(cluster, killed, round).await;
    round_result(env, namespace, before, took).await
}

/// The time from `since` to the first write through rw that succeeds, if one does in time.
async fn first_write_after(
    cluster: &TestCluster,
    since: Instant,
    round: usize,
) -> Option<Duration> {
    let written = cluster
        .wait_writable("INSERT INTO beats DEFAULT VALUES", WRITE_TIMEOUT)
        .await;
    if let Err(error) = &written {
        eprintln!("failover: round {round}: {error:#}");
    }
    written.ok().map(|_| since.elapsed())
}

async fn round_result(
    env: &TestEnv,
    namespace: &str,
    before: String,
    took: Option<Duration>,
) -> Round {
    let status = cluster_status(env, namespace).await;
    Round {
        before,
        after: status["currentPrimary"].as_str().map(str::to_owned),
        took,
        change: describe_change(&status["primaryChange"]),
    }
}

async fn roll_rounds(env: &TestEnv, cluster: &TestCluster, namespace: &str) {
    let rolls = count_from("PGKUBE_BENCH_ROLLS", DEFAULT_ROLLS);
    println!();
    println!("failover: {rolls} rolling updates (a new CPU request each)");
    let mut gaps = Vec::new();
    for roll in 1..=rolls {
        gaps.push(rolling_update(env, cluster, namespace, roll).await);
    }
    gaps.sort();
    println!();
    println!("| rolling updates | writes unavailable: min | median | max |");
    println!("|---|---|---|---|");
    if !gaps.is_empty() {
        println!(
            "| {} | {} | {} | {} |",
            gaps.len(),
            seconds(gaps[0]),
            seconds(median(&gaps)),
            seconds(gaps[gaps.len() - 1])
        );
    }
}

async fn node_loss_rounds(env: &TestEnv, cluster: &TestCluster, namespace: &str) {
    let losses = count_from("PGKUBE_BENCH_NODE_LOSSES", DEFAULT_NODE_LOSSES);
    println!();
    println!("failover: {losses} losses of the primary's node ({SECOND_NODE})");
    let mut rounds = Vec::new();
    for round in 1..=losses {
        let result = node_loss(env, cluster, namespace, round).await;
        print_round(round, "the loss", &result);
        rounds.push(result);
    }
    print_summary("node losses", &rounds);
}

/// Loses the primary's node (the second one) and waits for a write through rw; then brings
/// the node back.
async fn node_loss(env: &TestEnv, cluster: &TestCluster, namespace: &str, round: usize) -> Round {
    let healthy = wait_healthy(cluster).await;
    let before = primary_on_second_node(cluster, namespace, healthy).await;
    let lost = LostNode::lose(env).expect("the second node is lost");
    let took = first_write_after(cluster, lost.lost_at, round).await;
    let result = round_result(env, namespace, before, took).await;
    lost.restore().expect("the second node comes back");
    result
}

/// Moves the primary to a pod on the second node by a switchover, unless it is there;
/// returns the primary.
async fn primary_on_second_node(cluster: &TestCluster, namespace: &str, primary: String) -> String {
    let pods: Api<Pod> = Api::namespaced(cluster.api().into_client(), namespace);
    let mut on_second = Vec::new();
    for pod in cluster.pods().await.expect("pods") {
        let node = pods
            .get(&pod.name)
            .await
            .ok()
            .and_then(|p| p.spec)
            .and_then(|s| s.node_name);
        if node.as_deref() == Some(SECOND_NODE) {
            on_second.push(pod.name);
        }
    }
    if on_second.contains(&primary) {
        return primary;
    }
    let target = on_second
        .first()
        .unwrap_or_else(|| panic!("no instance on {SECOND_NODE}"))
        .clone();
    let annotation = serde_json::json!({"metadata": {"annotations": {
        "db.example.com/switchover-to": target
    }}});
    cluster
        .api()
        .patch(CLUSTER, &PatchParams::default(), &Patch::Merge(annotation))
        .await
        .expect("a switchover asked");
    wait_until(
        "the switchover to the second node",
        HEALTHY_TIMEOUT,
        || async {
            let current = cluster.current_primary().await?;
            Ok((current.as_deref() == Some(target.as_str())).then_some(()))
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));
    wait_healthy(cluster).await
}

/// Waits until the cluster has a primary and two replicas streaming, caught up, each pod
/// labelled with its role; returns the primary.
async fn wait_healthy(cluster: &TestCluster) -> String {
    wait_until(
        "a primary and two caught-up replicas",
        HEALTHY_TIMEOUT,
        || async {
            let status = cluster.get().await?.status.unwrap_or_default();
            let Some(primary) = status.current_primary.clone() else {
                return Ok(None);
            };
            let primary_ready = status
                .instances
                .iter()
                .any(|i| i.name == primary && i.role == InstanceRole::Primary && i.ready);
            let replicas = status
                .instances
                .iter()
                .filter(|i| {
                    i.role == InstanceRole::Replica
                        && i.ready
                        && i.streaming == Some(true)
                        && i.lag_bytes == Some(0)
                })
                .count();
            let pods = cluster.pods().await?;
            let labelled = pods.len() == 3
                && pods.iter().all(|pod| {
                    let role = if pod.name == primary {
                        "primary"
                    } else {
                        "replica"
                    };
                    pod.ready && pod.role.as_deref() == Some(role)
                });
            Ok((primary_ready && replicas == 2 && labelled).then_some(primary))
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}"))
}

/// The cluster's status as JSON (with the fields the Rust types may not have yet).
async fn cluster_status(env: &TestEnv, namespace: &str) -> serde_json::Value {
    let resource = ApiResource::erase::<PostgreSQLCluster>(&());
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(env.kube_client().await, namespace, &resource);
    match clusters.get(CLUSTER).await {
        Ok(cluster) => cluster.data["status"].clone(),
        Err(error) => serde_json::json!({ "error": error.to_string() }),
    }
}

fn describe_change(change: &serde_json::Value) -> String {
    if change.is_null() {
        return "none".to_owned();
    }
    let text = |key: &str| change[key].as_str().unwrap_or("-").to_owned();
    format!(
        "{} {} -> {}, started {}, completed {}: {}",
        text("kind"),
        text("from"),
        text("to"),
        text("startedAt"),
        text("completedAt"),
        text("reason")
    )
}

fn seconds(duration: Duration) -> String {
    format!("{:.2} s", duration.as_secs_f64())
}

fn print_round(round: usize, event: &str, result: &Round) {
    println!(
        "round {round}: primary {} -> {}: first write through rw {} after {event}; \
         primaryChange: {}",
        result.before,
        result.after.as_deref().unwrap_or("none"),
        result
            .took
            .map_or_else(|| "never (within 2 min)".to_owned(), seconds),
        result.change
    );
}

fn print_summary(what: &str, rounds: &[Round]) {
    let mut times: Vec<Duration> = rounds.iter().filter_map(|r| r.took).collect();
    times.sort();
    let moved = rounds
        .iter()
        .filter(|r| r.after.as_deref().is_some_and(|after| after != r.before))
        .count();
    println!();
    println!("| {what} | primary moved | writes resumed | min | median | max |");
    println!("|---|---|---|---|---|---|");
    if times.is_empty() {
        println!("| {} | {moved} | 0 | - | - | - |", rounds.len());
        return;
    }
    println!(
        "| {} | {moved} | {} | {} | {} | {} |",
        rounds.len(),
        times.len(),
        seconds(times[0]),
        seconds(median(&times)),
        seconds(times[times.len() - 1])
    );
}

/// The median of sorted `times` (the mean of the middle two for an even count).
fn median(times: &[Duration]) -> Duration {
    let middle = times.len() / 2;
    if times.len() % 2 == 1 {
        times[middle]
    } else {
        (times[middle - 1] + times[middle]) / 2
    }
}
