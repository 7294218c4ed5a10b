//! Benchmark of convergence at scale: the real manager, N clusters created at once.
//!
//! Not a test: it prints figures and asserts nothing about them. Needs the test bed
//! (`tests/testbed/up`):
//!
//! ```text
//! cargo bench --bench converge
//! PGKUBE_BENCH_CLUSTERS=200 PGKUBE_BENCH_IDLE_SECONDS=60 cargo bench --bench converge
//! ```
//!
//! For each N (200 and 1,000 unless `PGKUBE_BENCH_CLUSTERS` lists others) it starts a fresh
//! `pgkube run` (the binary `cargo bench` builds: the bench profile, which is the release one)
//! with `--kube-api-qps 50 --kube-api-burst 100`, watching a fresh namespace, and creates N
//! PostgreSQLClusters (1 replica, PostgreSQL 15, 1Gi) at once, 32 requests in flight. It prints:
//! - the time from the first create until every cluster reports phase Running;
//! - the manager's API requests per cluster by verb over that time and the 10 s after it (the
//!   last transitions' Events and held status details are published just after), as the API
//!   server counted them (its audit log: the manager runs as a ServiceAccount of its own, see
//!   [`audit`]) and, when the manager exposes it, as the manager counted them
//!   (`pgkube_kube_client_requests_total{verb,resource,code}` on its /metrics);
//! - the manager's CPU time (user + system, /proc) over that time, and its peak RSS (VmHWM);
//! - the cluster controller's reconciles per cluster over that time (its /metrics);
//! - its writes per minute at rest, over `PGKUBE_BENCH_IDLE_SECONDS` (default 90) after those
//!   10 s;
//! - the time to delete it all (namespace, claims, volumes).
//!
//! The manager serves its admission webhook (TLS on 127.0.0.1, a test CA), registered for the
//! bench's namespace as `pgkube admission-webhook` registers it, so that clusters get their
//! finalizer as they are created. `PGKUBE_BENCH_ADMISSION=0` runs without it: the controller
//! then adds the finalizer itself, one request and one reconcile more per cluster.
//!
//! It stops waiting for convergence after 5 minutes + 1 s per cluster, or once no cluster has
//! become Running for 3 minutes (then it says how many were), and measures the rest anyway.
//! The tables are printed after each N, so that a run cut short keeps what it measured.
//!
//! Pods on kwok nodes never run, so the bench brings its own: kwok nodes with room for 250 pods
//! each and a loopback pod CIDR ([`nodes`]), and a status endpoint on each pod's address that
//! answers as a healthy primary would ([`instances`]). It removes them afterwards, after a panic
//! too (with kubectl).

mod audit;
mod instances;
mod nodes;
mod report;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume};
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use pgkube_crds::{ClusterPhase, PostgreSQLCluster};
use pgkube_testkit::{
    TestAdmission, TestCa, TestEnv, TestNamespace, cpu_time, http_get, install_crds,
    peak_rss_bytes, testbed, wait_until,
};

#[path = "../../tests/manager_common/mod.rs"]
mod manager_common;

use audit::{AuditLog, Request};
use instances::FakeInstances;
use manager_common::Manager;
use nodes::BenchNodes;
use report::Row;

/// The client limits of the comparison in issue 14: controller-runtime's defaults.
const QPS: &str = "50";
const BURST: &str = "100";
const DEFAULT_SIZES: [usize; 2] = [200, 1_000];
const DEFAULT_IDLE: Duration = Duration::from_secs(90);
/// From the last cluster Running to the start of the rest: requests in it count as convergence's.
const SETTLE: Duration = Duration::from_secs(10);
/// Creates in flight at once.
const CREATE_CONCURRENCY: usize = 32;
const STEP_TIMEOUT: Duration = Duration::from_secs(120);
/// The bench stops waiting for convergence when no cluster has become Running for this long.
const STALL: Duration = Duration::from_secs(180);
/// How long everything may take to go once the namespace is deleted.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(900);
/// The ServiceAccount (of pgkube-system, which the test bed audits) the manager runs as.
const DEPLOY_NAMESPACE: &str = "pgkube-system";
const SERVICE_ACCOUNT: &str = "pgkube-bench";

fn main() {
    let Some(env) = testbed() else {
        println!("converge: test bed not running, nothing measured");
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(bench(env));
}

async fn bench(env: TestEnv) {
    let sizes = sizes();
    let idle = idle();
    let client = env.kube_client().await;
    install_crds(&client).await;
    let audit_path = env.audit_log.clone().expect(
        "the test bed has no audit log (PGKUBE_TEST_AUDIT_LOG): restart it with tests/testbed/up",
    );
    let identity = Identity::create(&env);
    let audit = AuditLog::new(&audit_path, &identity.username);
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let nodes = BenchNodes::create(&env, &client, "converge-bench", largest).await;
    let admission = admission();
    let load_before = load_average();
    let mut rows = Vec::new();
    for &n in &sizes {
        let bench = Bench {
            env: &env,
            client: &client,
            nodes: &nodes,
            audit: &audit,
            kubeconfig: &identity.kubeconfig,
            manager_binary: &identity.manager_binary,
            admission: admission.as_ref(),
        };
        rows.push(bench.run(n, idle).await);
        // After each N, so that a run cut short keeps what it measured; the last is complete.
        report::print(&rows, idle, &load_before, &load_average());
    }
    nodes.delete().await;
    identity.delete(&env);
    if let Some((_, directory)) = admission {
        let _ = std::fs::remove_dir_all(directory);
    }
}

fn sizes() -> Vec<usize> {
    std::env::var("PGKUBE_BENCH_CLUSTERS")
        .ok()
        .map(|list| {
            list.split(',')
                .filter_map(|n| n.trim().parse().ok())
                .filter(|&n| n > 0)
                .collect::<Vec<usize>>()
        })
        .filter(|sizes| !sizes.is_empty())
        .unwrap_or_else(|| DEFAULT_SIZES.to_vec())
}

fn idle() -> Duration {
    std::env::var("PGKUBE_BENCH_IDLE_SECONDS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .map_or(DEFAULT_IDLE, Duration::from_secs)
}

/// The CA of the manager's webhook certificate and the directory it is written to, unless
/// `PGKUBE_BENCH_ADMISSION=0`.
fn admission() -> Option<(TestCa, PathBuf)> {
    if std::env::var("PGKUBE_BENCH_ADMISSION").is_ok_and(|value| value.trim() == "0") {
        return None;
    }
    let ca = TestCa::new();
    let directory = ca.serving_certificate_dir("converge-bench");
    Some((ca, directory))
}

/// /proc/loadavg's first three figures.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// What one N needs.
struct Bench<'a> {
    env: &'a TestEnv,
    client: &'a Client,
    nodes: &'a BenchNodes,
    audit: &'a AuditLog,
    kubeconfig: &'a str,
    manager_binary: &'a Path,
    /// The webhook's CA and certificate directory; none to run without the admission webhook.
    admission: Option<&'a (TestCa, PathBuf)>,
}

impl Bench<'_> {
    async fn run(&self, n: usize, idle: Duration) -> Row {
        let namespace = TestNamespace::create(self.client, "converge-bench").await;
        let _instances = FakeInstances::start(self.client, namespace.name(), self.nodes.names());
        let mut manager = self.start_manager(namespace.name()).await;
        let metrics_address = manager.endpoint("metrics").await;
        let admission = match self.admission {
            Some((ca, _)) => {
                let webhook = manager.endpoint("webhook").await;
                let (client, ns) = (self.client, namespace.name());
                let name = format!("pgkube-{ns}");
                let admission =
                    TestAdmission::register(client, &name, webhook, Some(&ca.pem()), ns).await;
                // Or the first clusters could be created before the API server calls it.
                admission
                    .wait_answering()
                    .await
                    .expect("the webhook in effect");
                Some(admission)
            }
            None => None,
        };
        wait_ready(manager.endpoint("health probes").await).await;
        let pid = manager.pid();
        eprintln!("converge: N = {n}, namespace {}", namespace.name());

        let (mark, cpu) = (self.audit.mark(), cpu_time(pid));
        let metric_before = metric(metrics_address).await;
        let reconciles_before = cluster_reconciles(metrics_address).await;
        let started = Instant::now();
        let created_in = self.create_clusters(namespace.name(), n).await;
        let converged = wait_all_running(self.client, namespace.name(), n, started).await;
        let converge_cpu = cpu_time(pid).saturating_sub(cpu);
        let reconciles = cluster_reconciles(metrics_address)
            .await
            // None before the first reconcile: the counter has no series yet.
            .map(|now| now - reconciles_before.unwrap_or(0.0));
        // A reconcile publishes a transition's Events right after the status write this bench
        // waits for, and a change of status details alone may wait up to 5 s after a transition
        // (the cluster controller's DETAILS_HOLD): the last clusters' belong to convergence.
        tokio::time::sleep(SETTLE).await;
        let converge_mark = self.audit.mark();
        let metric_converged = metric(metrics_address).await;

        tokio::time::sleep(idle).await;
        let idle_requests = self.audit.requests(converge_mark, self.audit.mark());
        let metric_rested = metric(metrics_address).await;
        let peak_rss = peak_rss_bytes(pid);

        let cleanup = cleanup(self.client, namespace).await;
        if let Some(admission) = admission {
            admission.delete().await;
        }
        manager.terminate();
        let _ = manager.exit_code(Duration::from_secs(60)).await;
        Row {
            n,
            created_in,
            converged,
            cpu: converge_cpu,
            peak_rss,
            requests: self.audit.requests(mark, converge_mark),
            metric_requests: delta(&metric_converged, &metric_before),
            reconciles,
            idle,
            idle_requests,
            idle_metric: delta(&metric_rested, &metric_converged),
            cleanup,
        }
    }

    async fn start_manager(&self, namespace: &str) -> Manager {
        let mut args = vec![
            "--watch-namespaces".to_owned(),
            namespace.to_owned(),
            "--kube-api-qps".to_owned(),
            QPS.to_owned(),
            "--kube-api-burst".to_owned(),
            BURST.to_owned(),
        ];
        match self.admission {
            Some((_, directory)) => args.extend([
                "--webhook-bind-address".to_owned(),
                "127.0.0.1:0".to_owned(),
                "--webhook-cert-dir".to_owned(),
                directory.to_string_lossy().into_owned(),
            ]),
            None => args.extend(["--webhook-bind-address".to_owned(), "0".to_owned()]),
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Manager::start_program(
            self.manager_binary,
            self.env,
            "manager-converge-bench",
            &args,
            &[("KUBECONFIG", self.kubeconfig), ("RUST_LOG", "info")],
        )
    }

    /// Creates clusters `bench-00000`... at once; how long the creates took.
    async fn create_clusters(&self, namespace: &str, n: usize) -> Duration {
        let api: Api<PostgreSQLCluster> = Api::namespaced(self.client.clone(), namespace);
        let started = Instant::now();
        let scheduling = self.nodes.scheduling();
        stream::iter(0..n)
            .map(|i| {
                let (api, scheduling) = (&api, &scheduling);
                async move {
                    let mut cluster = cluster(&format!("bench-{i:05}"));
                    scheduling.apply_to_cluster(&mut cluster.spec);
                    api.create(&PostParams::default(), &cluster)
                        .await
                        .unwrap_or_else(|error| panic!("creating cluster {i}: {error}"));
                }
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .collect::<Vec<()>>()
            .await;
        started.elapsed()
    }
}

/// Waits until the manager's `/readyz` answers 200 (its caches synced), so that its start-up
/// LISTs and WATCHes are not counted.
async fn wait_ready(health: SocketAddr) {
    wait_until("the manager to be ready", STEP_TIMEOUT, || async {
        let (status, _) = http_get(health, "/readyz").await?;
        Ok((status == 200).then_some(()))
    })
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));
}

/// 1 replica of PostgreSQL 15 with 1Gi of storage.
fn cluster(name: &str) -> PostgreSQLCluster {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "db.example.com/v1beta1",
        "kind": "PostgreSQLCluster",
        "metadata": {"name": name},
        "spec": {"replicas": 1, "postgresVersion": "15", "storage": {"size": "1Gi"}},
    }))
    .expect("a valid cluster")
}

/// How long until all clusters were Running, or how many were when the bench gave up.
#[derive(Clone, Copy)]
pub struct Converged {
    pub running: usize,
    pub elapsed: Duration,
}

/// Watches the clusters until `n` report Running for their current generation; gives up after
/// 5 minutes + 1 s per cluster, or when no cluster has become Running for [`STALL`]. Progress
/// on stderr every 10 s.
async fn wait_all_running(
    client: &Client,
    namespace: &str,
    n: usize,
    started: Instant,
) -> Converged {
    let api: Api<PostgreSQLCluster> = Api::namespaced(client.clone(), namespace);
    let deadline = Duration::from_secs(300 + n as u64);
    let mut running = std::collections::BTreeSet::new();
    let mut events = watcher::watcher(api, watcher::Config::default()).boxed();
    let mut progress = tokio::time::interval(Duration::from_secs(10));
    let mut last_new = Instant::now();
    while running.len() < n && started.elapsed() < deadline && last_new.elapsed() < STALL {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(Event::Apply(cluster) | Event::InitApply(cluster))) => {
                    if is_running(&cluster) {
                        if running.insert(cluster.name_any()) {
                            last_new = Instant::now();
                        }
                    } else {
                        running.remove(&cluster.name_any());
                    }
                }
                Some(Err(error)) => eprintln!("converge: watching the clusters: {error}"),
                Some(Ok(_)) => {}
                None => break,
            },
            _ = progress.tick() => eprintln!(
                "converge: {:>4.0} s: {} of {n} Running",
                started.elapsed().as_secs_f64(),
                running.len()
            ),
        }
    }
    Converged {
        running: running.len(),
        elapsed: started.elapsed(),
    }
}

fn is_running(cluster: &PostgreSQLCluster) -> bool {
    let status = cluster.status.as_ref();
    status.and_then(|s| s.phase) == Some(ClusterPhase::Running)
        && status.and_then(|s| s.observed_generation) == cluster.metadata.generation
}

/// Requests by verb, summed over resources and codes.
pub type ByVerb = BTreeMap<String, f64>;

/// The manager's own count of its API requests by verb, when it exposes one.
async fn metric(address: SocketAddr) -> Option<ByVerb> {
    let (_, text) = http_get(address, "/metrics").await.ok()?;
    let mut by_verb = ByVerb::new();
    for line in text.lines() {
        let Some(labels) = line.strip_prefix("pgkube_kube_client_requests_total{") else {
            continue;
        };
        let verb = labels
            .split(',')
            .find_map(|label| label.strip_prefix("verb=\""))
            .and_then(|rest| rest.split('"').next())
            .unwrap_or("?");
        let value = line
            .rsplit_once(' ')
            .and_then(|(_, v)| v.parse::<f64>().ok());
        *by_verb.entry(verb.to_owned()).or_default() += value.unwrap_or(0.0);
    }
    (!by_verb.is_empty()).then_some(by_verb)
}

/// The cluster controller's reconciles so far (`operator_reconcile_total{controller="cluster"}`,
/// every result).
async fn cluster_reconciles(address: SocketAddr) -> Option<f64> {
    let (_, text) = http_get(address, "/metrics").await.ok()?;
    let counts: Vec<f64> = text
        .lines()
        .filter_map(|line| line.strip_prefix("operator_reconcile_total{"))
        .filter(|labels| labels.contains("controller=\"cluster\""))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse().ok())
        .collect();
    (!counts.is_empty()).then(|| counts.iter().sum())
}

/// What the manager's count grew by from `before` to `now`.
fn delta(now: &Option<ByVerb>, before: &Option<ByVerb>) -> Option<ByVerb> {
    let (now, before) = (now.as_ref()?, before.clone().unwrap_or_default());
    Some(
        now.iter()
            .map(|(verb, count)| {
                (
                    verb.clone(),
                    count - before.get(verb).copied().unwrap_or(0.0),
                )
            })
            .collect(),
    )
}

/// Deletes the namespace while the manager still runs (its finalizer), then waits until the
/// namespace and the volumes of its claims are gone; how long that took.
async fn cleanup(client: &Client, namespace: TestNamespace) -> Option<Duration> {
    let name = namespace.name().to_owned();
    let started = Instant::now();
    namespace.cleanup().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let gone = wait_until(
        &format!("namespace {name} and its volumes to be deleted"),
        CLEANUP_TIMEOUT,
        || async {
            if namespaces.get_opt(&name).await?.is_some() {
                return Ok(None);
            }
            let left = volumes
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .any(|volume| {
                    volume
                        .spec
                        .and_then(|s| s.claim_ref)
                        .and_then(|c| c.namespace)
                        .as_deref()
                        == Some(name.as_str())
                });
            Ok((!left).then_some(()))
        },
    )
    .await;
    match gone {
        Ok(()) => Some(started.elapsed()),
        Err(error) => {
            eprintln!("warning: {error:#}");
            None
        }
    }
}

/// The ServiceAccount the manager runs as, with the rights of `deploy/rbac.yaml`, and a
/// kubeconfig with a token of it.
struct Identity {
    username: String,
    kubeconfig: String,
    /// A copy of the manager binary that `cargo bench` built, taken at start: a build of the
    /// same target by anyone else replaces the original in place.
    manager_binary: PathBuf,
    dir: PathBuf,
}

impl Identity {
    fn create(env: &TestEnv) -> Identity {
        let root = env!("CARGO_MANIFEST_DIR");
        for file in [
            "manager/namespace.yaml",
            "manager/service-account.yaml",
            "rbac.yaml",
        ] {
            kubectl(env, &["apply", "-f", &format!("{root}/deploy/{file}")]);
        }
        let account = format!("{DEPLOY_NAMESPACE}:{SERVICE_ACCOUNT}");
        let manifest = format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {SERVICE_ACCOUNT}, namespace: \
             {DEPLOY_NAMESPACE}}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: \
             ClusterRoleBinding\nmetadata: {{name: {SERVICE_ACCOUNT}}}\nroleRef: {{apiGroup: \
             rbac.authorization.k8s.io, kind: ClusterRole, name: pgkube-manager}}\nsubjects: \
             [{{kind: ServiceAccount, name: {SERVICE_ACCOUNT}, namespace: {DEPLOY_NAMESPACE}}}]\n"
        );
        kubectl_stdin(env, &["apply", "-f", "-"], &manifest);
        let token = kubectl(
            env,
            &[
                "create",
                "token",
                SERVICE_ACCOUNT,
                "-n",
                DEPLOY_NAMESPACE,
                "--duration",
                "6h",
            ],
        );
        let dir =
            std::env::temp_dir().join(format!("pgkube-converge-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the bench's directory");
        let path = dir.join("kubeconfig");
        std::fs::write(&path, env.kubeconfig_with_token(token.trim())).expect("kubeconfig written");
        let manager_binary = dir.join("pgkube");
        std::fs::copy(env!("CARGO_BIN_EXE_pgkube"), &manager_binary)
            .expect("copying the manager binary");
        Identity {
            username: format!("system:serviceaccount:{account}"),
            kubeconfig: path.to_string_lossy().into_owned(),
            manager_binary,
            dir,
        }
    }

    fn delete(self, env: &TestEnv) {
        let binding = format!("clusterrolebinding/{SERVICE_ACCOUNT}");
        kubectl(env, &["delete", "--ignore-not-found", &binding]);
        let account = format!("serviceaccount/{SERVICE_ACCOUNT}");
        kubectl(
            env,
            &[
                "delete",
                "--ignore-not-found",
                "-n",
                DEPLOY_NAMESPACE,
                &account,
            ],
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn kubectl(env: &TestEnv, args: &[&str]) -> String {
    kubectl_stdin(env, args, "")
}

fn kubectl_stdin(env: &TestEnv, args: &[&str], input: &str) -> String {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = env
        .kubectl()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running kubectl");
    let mut stdin = child.stdin.take().expect("kubectl's stdin");
    stdin
        .write_all(input.as_bytes())
        .expect("writing to kubectl");
    drop(stdin);
    let output = child.wait_with_output().expect("kubectl's output");
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Requests by verb, and by verb and resource.
pub fn count(requests: &[Request]) -> (ByVerb, BTreeMap<(String, String), f64>) {
    let mut by_verb = ByVerb::new();
    let mut by_resource = BTreeMap::new();
    for request in requests {
        *by_verb.entry(request.verb.clone()).or_default() += 1.0;
        *by_resource
            .entry((request.verb.clone(), request.resource.clone()))
            .or_default() += 1.0;
    }
    (by_verb, by_resource)
}
