//! Shared by the `manager_*` integration tests: runs the real `pgkube run` binary against the
//! test bed, collects its JSON log lines (with their times), finds its endpoints, and writes
//! kubeconfigs that reach the API server another way (through a proxy).

#![allow(dead_code)] // each test file uses a different part

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::api::{Api, PostParams};
use kube::config::Kubeconfig;
use pgkube_crds::PostgreSQLCluster;
use pgkube_testkit::{TestEnv, unique_name, wait_until};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Creates a small PostgreSQLCluster `name` (PostgreSQL 16, 1Gi) for a manager to reconcile.
pub async fn create_cluster(
    clusters: &Api<PostgreSQLCluster>,
    name: &str,
    replicas: i32,
) -> PostgreSQLCluster {
    let cluster: PostgreSQLCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "db.example.com/v1beta1",
        "kind": "PostgreSQLCluster",
        "metadata": { "name": name },
        "spec": { "replicas": replicas, "postgresVersion": "16", "storage": {"size": "1Gi"} },
    }))
    .expect("a valid cluster");
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("cluster created")
}

/// How long a manager may take to bring a small cluster to Running on the kwok nodes; wait
/// with `pgkube_testkit::wait_for_cluster_running`, which explains a timeout.
pub const RUNNING_TIMEOUT: Duration = Duration::from_secs(90);

/// Leader election timings short enough for a test: a dead leader's Lease expires 5 s
/// ([`SHORT_LEASE_DURATION`]) after its last renewal, followers look every 500 ms.
pub const SHORT_LEASE_FLAGS: &[&str] = &[
    "--leader-elect-lease-duration",
    "5s",
    "--leader-elect-renew-deadline",
    "3s",
    "--leader-elect-retry-period",
    "500ms",
];
pub const SHORT_LEASE_DURATION: Duration = Duration::from_secs(5);

/// The host name part of the holder identity (`<host>_<random>`) of Lease `lease`, if held:
/// the `name` of the [`Manager`] that holds it.
pub async fn lease_holder(
    leases: &Api<k8s_openapi::api::coordination::v1::Lease>,
    lease: &str,
) -> anyhow::Result<Option<String>> {
    let lease = leases.get_opt(lease).await?;
    Ok(lease
        .and_then(|lease| lease.spec?.holder_identity)
        .and_then(|identity| Some(identity.rsplit_once('_')?.0.to_owned())))
}

/// A running `pgkube run` process.
pub struct Manager {
    pub name: String,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Manager {
    /// Starts `pgkube run --log-format json` with endpoints on free loopback ports, plus
    /// `extra` flags. `name` becomes the host name part of its Lease identity.
    pub fn start(env: &TestEnv, name: &str, extra: &[&str]) -> Manager {
        Self::start_with_env(env, name, extra, &[])
    }

    /// Like [`Manager::start`], with extra environment variables (set after the defaults).
    pub fn start_with_env(
        env: &TestEnv,
        name: &str,
        extra: &[&str],
        vars: &[(&str, &str)],
    ) -> Manager {
        Self::start_program(
            env!("CARGO_BIN_EXE_pgkube").as_ref(),
            env,
            name,
            extra,
            vars,
        )
    }

    /// Like [`Manager::start_with_env`], running `program` (a copy of the binary that a bench
    /// keeps, so that a concurrent build of the same target cannot change it mid-run).
    pub fn start_program(
        program: &std::path::Path,
        env: &TestEnv,
        name: &str,
        extra: &[&str],
        vars: &[(&str, &str)],
    ) -> Manager {
        let mut command = Command::new(program);
        command.args(["run", "--log-format", "json"]);
        // Any free port, unless `extra` says otherwise.
        for flag in ["--health-probe-bind-address", "--metrics-bind-address"] {
            if !extra.contains(&flag) {
                command.args([flag, "127.0.0.1:0"]);
            }
        }
        command
            .args(extra)
            .env("KUBECONFIG", &env.kubeconfig)
            .env("HOSTNAME", name)
            .env("RUST_LOG", "info,pgkube=debug")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_TRACES_EXPORTER")
            .envs(vars.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("starting pgkube run");
        let lines = Arc::new(Mutex::new(Vec::new()));
        if let Some(stdout) = child.stdout.take() {
            tokio::spawn(collect_lines(BufReader::new(stdout), Arc::clone(&lines)));
        }
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(collect_lines(BufReader::new(stderr), Arc::clone(&lines)));
        }
        Manager {
            name: name.to_owned(),
            child,
            lines,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("manager still running")
    }

    /// Every line the process printed so far (stdout and stderr).
    pub fn output(&self) -> Vec<String> {
        self.lines.lock().expect("lock").clone()
    }

    /// Whether a JSON log line has this `message`.
    pub fn logged(&self, message: &str) -> bool {
        self.log_line(message).is_some()
    }

    /// The first JSON log line with this `message`.
    pub fn log_line(&self, message: &str) -> Option<serde_json::Value> {
        self.output()
            .iter()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find(|line| line["fields"]["message"] == message)
    }

    /// When the process logged `message` first, by its own log timestamp.
    pub fn logged_at(&self, message: &str) -> Option<DateTime<Utc>> {
        let line = self.log_line(message)?;
        let timestamp = line["timestamp"].as_str()?;
        let parsed = DateTime::parse_from_rfc3339(timestamp)
            .unwrap_or_else(|e| panic!("log timestamp {timestamp:?}: {e}"));
        Some(parsed.with_timezone(&Utc))
    }

    /// The address the endpoint (`health probes` or `metrics`) is bound to.
    pub async fn endpoint(&self, endpoint: &str) -> SocketAddr {
        wait_until(
            &format!("{} to serve {endpoint}", self.name),
            STARTUP_TIMEOUT,
            || async {
                Ok(self
                    .output()
                    .iter()
                    .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
                    .find(|line| {
                        line["fields"]["message"] == "serving"
                            && line["fields"]["endpoint"] == endpoint
                    })
                    .and_then(|line| line["fields"]["address"].as_str()?.parse().ok()))
            },
        )
        .await
        .unwrap_or_else(|error| panic!("{error}\noutput:\n{}", self.output().join("\n")))
    }

    /// Whether the process has not exited yet.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -TERM failed");
    }

    /// SIGKILL, as `kill -9`.
    pub async fn kill_hard(&mut self) {
        self.child.kill().await.expect("kill -9");
    }

    /// Waits for the process to exit; its exit code.
    pub async fn exit_code(&mut self, timeout: Duration) -> Option<i32> {
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{} did not exit within {timeout:?}\noutput:\n{}",
                    self.name,
                    self.output().join("\n")
                )
            })
            .expect("waiting for the manager");
        status.code()
    }
}

async fn collect_lines<R: tokio::io::AsyncRead + Unpin>(
    reader: BufReader<R>,
    lines: Arc<Mutex<Vec<String>>>,
) {
    let mut reader = reader.lines();
    while let Ok(Some(line)) = reader.next_line().await {
        lines.lock().expect("lock").push(line);
    }
}

/// The API server's `ip:port`, from the test bed's kubeconfig.
pub fn api_server_address(env: &TestEnv) -> SocketAddr {
    let server = test_bed_server(env);
    let authority = server.trim_start_matches("https://").trim_end_matches('/');
    authority
        .parse()
        .unwrap_or_else(|e| panic!("API server {server} is not https://ip:port: {e}"))
}

fn test_bed_server(env: &TestEnv) -> String {
    let kubeconfig = Kubeconfig::read_from(&env.kubeconfig)
        .unwrap_or_else(|e| panic!("reading {}: {e}", env.kubeconfig.display()));
    kubeconfig
        .clusters
        .iter()
        .find_map(|named| named.cluster.as_ref()?.server.clone())
        .expect("test bed kubeconfig names a server")
}

/// A copy of the test bed's admin kubeconfig in a file of its own, removed on drop.
pub struct KubeconfigFile {
    pub path: PathBuf,
}

impl KubeconfigFile {
    /// The test bed's kubeconfig, reaching the API server at `address` (a proxy in front of
    /// it on 127.0.0.1, which the API server's certificate names too).
    pub fn via(env: &TestEnv, address: SocketAddr) -> KubeconfigFile {
        let text = std::fs::read_to_string(&env.kubeconfig)
            .unwrap_or_else(|e| panic!("reading {}: {e}", env.kubeconfig.display()));
        let server = test_bed_server(env);
        assert_eq!(text.matches(&server).count(), 1, "one server in {text}");
        let path = std::env::temp_dir().join(unique_name("pgkube-kubeconfig"));
        std::fs::write(&path, text.replace(&server, &format!("https://{address}")))
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        KubeconfigFile { path }
    }
}

impl Drop for KubeconfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
