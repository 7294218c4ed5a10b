//! Shared by the cluster controller's integration tests: a kube client that counts its write
//! requests, the controllers running in-process for one test namespace, and the stand-in for
//! the instance managers of pods on the simulated nodes.

#![allow(dead_code)] // Each test binary uses a different part.

pub mod own_tls;
pub mod real_node;
pub mod stored;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use pgkube_controllers::cluster::instances::{
    ControlCommand, FetchError, HttpInstanceStatus, InstanceAddress, InstanceReport,
    InstanceStatusSource, Lsn, ReportedRole,
};
use pgkube_controllers::cluster::status;
use pgkube_controllers::{Context, Metrics, Settings};
use pgkube_crds::{ClusterPhase, PostgreSQLCluster};
use pgkube_testkit::{TestEnv, TestNamespace, install_crds, wait_until};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The seed's sample cluster.
pub const SAMPLE: &str = include_str!("../../../deploy/samples/postgresqlcluster.yaml");

/// Requests made through a [`counting_client`], by kind.
#[derive(Debug, Default)]
pub struct RequestCounts {
    pub writes: AtomicUsize,
    pub reads: AtomicUsize,
    /// `METHOD path` of every write, to explain a failing assertion.
    pub write_log: std::sync::Mutex<Vec<String>>,
}

impl RequestCounts {
    pub fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }

    pub fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }

    pub fn write_log(&self) -> Vec<String> {
        self.write_log
            .lock()
            .map(|log| log.clone())
            .unwrap_or_default()
    }
}

/// A client for the test bed that counts every request it sends: POST, PUT, PATCH and DELETE
/// as writes, the rest (GET, including watches) as reads.
pub async fn counting_client(env: &TestEnv) -> (Client, Arc<RequestCounts>) {
    let config = env.kube_config().await;
    let counts = Arc::new(RequestCounts::default());
    let counter = counts.clone();
    let layer =
        tower::util::MapRequestLayer::new(move |request: http::Request<kube::client::Body>| {
            let method = request.method().clone();
            if matches!(
                method,
                http::Method::POST | http::Method::PUT | http::Method::PATCH | http::Method::DELETE
            ) {
                counter.writes.fetch_add(1, Ordering::SeqCst);
                if let Ok(mut log) = counter.write_log.lock() {
                    log.push(format!("{method} {}", request.uri().path()));
                }
            } else {
                counter.reads.fetch_add(1, Ordering::SeqCst);
            }
            request
        });
    let client = kube::client::ClientBuilder::try_from(config)
        .expect("client builder")
        .with_layer(&layer)
        .build();
    (client, counts)
}

/// WAL position every simulated instance reports.
pub const SIMULATED_LSN: &str = "0/3000148";

/// The instance managers of pods on the test bed's simulated (kwok) nodes, which never run:
/// answers as healthy ones would (the first instance a ready primary, the others replicas
/// streaming from it, caught up), unless a test set another answer for a pod. Pods on the real
/// node (loopback addresses) are asked for real, over HTTP.
#[derive(Debug, Default)]
pub struct SimulatedInstances {
    http: HttpInstanceStatus,
    /// Answers set by the test: a report, or `None` for no answer.
    answers: Mutex<HashMap<String, Option<InstanceReport>>>,
    /// Questions answered for simulated pods: each reconcile of a cluster with pods asks every
    /// pod once.
    asked: AtomicUsize,
}

impl SimulatedInstances {
    /// How many times a simulated pod was asked for its status.
    pub fn asked(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }

    /// From now on, pod `pod` answers `report` (`None`: does not answer).
    pub fn answer(&self, pod: &str, report: Option<InstanceReport>) {
        if let Ok(mut answers) = self.answers.lock() {
            answers.insert(pod.to_owned(), report);
        }
    }

    /// Pod `pod` answers as a healthy instance again.
    pub fn heal(&self, pod: &str) {
        if let Ok(mut answers) = self.answers.lock() {
            answers.remove(pod);
        }
    }

    /// What a healthy instance manager of `pod` answers: a ready primary for the first
    /// instance, a streaming replica for the others.
    pub fn healthy(pod: &str) -> InstanceReport {
        let role = if pod.ends_with("-0") {
            ReportedRole::Primary
        } else {
            ReportedRole::Replica
        };
        Self::report(pod, role)
    }

    /// A ready `role`, caught up at [`SIMULATED_LSN`] (a replica streaming).
    pub fn report(pod: &str, role: ReportedRole) -> InstanceReport {
        let lsn: Lsn = SIMULATED_LSN.parse().expect("an LSN");
        let primary = role == ReportedRole::Primary;
        InstanceReport {
            pod: pod.to_owned(),
            role,
            ready: true,
            timeline: Some(1),
            current_lsn: primary.then_some(lsn),
            received_lsn: (!primary).then_some(lsn),
            replayed_lsn: (!primary).then_some(lsn),
            streaming: !primary,
            pending_restart: Vec::new(),
            following: None,
            system_identifier: None,
            initialized_by: None,
            message: None,
            restart_by_switchover: false,
            settings_digest: None,
            wal_archive: None,
            in_place: None,
            manager_digest: None,
            certificate_authorities: None,
        }
    }

    fn simulated(&self, pod: &str) -> Result<InstanceReport, FetchError> {
        let set = self
            .answers
            .lock()
            .ok()
            .and_then(|answers| answers.get(pod).cloned());
        match set {
            Some(Some(report)) => Ok(report),
            Some(None) => Err(FetchError::Unreachable("the test said so".to_owned())),
            None => Ok(Self::healthy(pod)),
        }
    }
}

impl InstanceStatusSource for SimulatedInstances {
    fn fetch<'a>(
        &'a self,
        address: &'a InstanceAddress,
    ) -> BoxFuture<'a, Result<InstanceReport, FetchError>> {
        if address.ip.is_loopback() {
            return self.http.fetch(address);
        }
        self.asked.fetch_add(1, Ordering::SeqCst);
        let answer = self.simulated(&address.pod);
        Box::pin(async move { answer })
    }

    /// Pods on the real node take new instance managers; simulated ones take none.
    fn upgrade<'a>(
        &'a self,
        address: &'a InstanceAddress,
        token: &'a str,
        binary: &'a pgkube_controllers::cluster::manager_upgrade::OwnBinary,
    ) -> BoxFuture<'a, Result<(), FetchError>> {
        if address.ip.is_loopback() {
            return self.http.upgrade(address, token, binary);
        }
        Box::pin(async move {
            Err(FetchError::Unreachable(format!(
                "{} runs on a simulated node",
                address.pod
            )))
        })
    }

    /// Pods on the real node (loopback addresses) take commands; simulated ones take none.
    fn command<'a>(
        &'a self,
        address: &'a InstanceAddress,
        token: &'a str,
        command: &'a ControlCommand,
    ) -> BoxFuture<'a, Result<(), FetchError>> {
        if address.ip.is_loopback() {
            return self.http.command(address, token, command);
        }
        Box::pin(async move {
            Err(FetchError::Unreachable(format!(
                "{} runs on a simulated node",
                address.pod
            )))
        })
    }
}

/// The controllers running in-process, watching one test namespace.
pub struct Running {
    pub namespace: TestNamespace,
    /// Admin client for the test's own reads and writes (not counted).
    pub client: Client,
    /// Requests of the controllers' client (of the current run, after a restart).
    pub counts: Arc<RequestCounts>,
    /// What the instance managers of pods on the simulated nodes answer.
    pub instances: Arc<SimulatedInstances>,
    env: TestEnv,
    settings: Settings,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Running {
    /// Installs the CRDs, creates a namespace and starts the controllers on it, with
    /// [`SimulatedInstances`] for pods on the simulated nodes; `None` when test bed tests are
    /// skipped.
    pub async fn start(prefix: &str, resync_interval: Duration) -> Option<Running> {
        Self::start_with(prefix, resync_interval, |_| {}).await
    }

    /// [`Running::start`], with `change` applied to the controllers' settings.
    pub async fn start_with(
        prefix: &str,
        resync_interval: Duration,
        change: impl FnOnce(&mut Settings),
    ) -> Option<Running> {
        let env = pgkube_testkit::testbed()?;
        let client = env.kube_client().await;
        install_crds(&client).await;
        let namespace = TestNamespace::create(&client, prefix).await;
        let instances = Arc::new(SimulatedInstances::default());
        let mut settings = Settings {
            watch_namespaces: vec![namespace.name().to_owned()],
            resync_interval,
            instance_status: instances.clone(),
            ..Settings::default()
        };
        change(&mut settings);
        let mut running = Running {
            namespace,
            client,
            counts: Arc::default(),
            instances,
            env,
            settings,
            stop: None,
            task: None,
        };
        running.spawn_controllers().await;
        Some(running)
    }

    /// Stops the controllers and starts them again with `change` applied to their settings, as
    /// an operator upgrade or a new manager flag would; the namespace and its objects stay.
    pub async fn restart_with(&mut self, change: impl FnOnce(&mut Settings)) {
        self.stop_controllers().await;
        change(&mut self.settings);
        self.spawn_controllers().await;
    }

    /// Starts the controllers with a fresh counting client and waits until they are ready.
    async fn spawn_controllers(&mut self) {
        let (controller_client, counts) = counting_client(&self.env).await;
        let mut registry = prometheus_client::registry::Registry::default();
        let context = Context {
            events: controller_client.clone(),
            client: controller_client,
            settings: Arc::new(self.settings.clone()),
            metrics: Arc::new(Metrics::register(&mut registry)),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let (ready_tx, ready_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let on_ready = move || {
                let _ = ready_tx.send(());
            };
            let shutdown = async move {
                let _ = stopped.await;
            };
            pgkube_controllers::run(context, on_ready, shutdown).await;
        });
        tokio::time::timeout(Duration::from_secs(60), ready_rx)
            .await
            .expect("controllers ready within 60s")
            .expect("on_ready called");
        self.counts = counts;
        self.stop = Some(stop);
        self.task = Some(task);
    }

    /// Asks the controllers to stop and waits (a bounded time) for them to finish.
    async fn stop_controllers(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
    }

    /// Lets things settle (at least 3 s), then asserts that the controllers write nothing
    /// through four resync intervals; `when` names the moment in the failure message.
    pub async fn assert_no_writes_while_idle(&self, resync: Duration, when: &str) {
        // Past the hold of a change of status details that followed the last transition:
        // such a change is written when its hold ends, if not before.
        let settle = Duration::from_secs(3).max(status::DETAILS_HOLD + Duration::from_secs(1));
        tokio::time::sleep(settle).await;
        let writes_before = self.counts.writes();
        let log_before = self.counts.write_log().len();
        tokio::time::sleep(resync * 4 + Duration::from_secs(1)).await;
        assert_eq!(
            self.counts.writes() - writes_before,
            0,
            "writes {when}: {:?}",
            &self.counts.write_log()[log_before..]
        );
    }

    pub fn clusters(&self) -> Api<PostgreSQLCluster> {
        Api::namespaced(self.client.clone(), self.namespace.name())
    }

    /// The test bed.
    pub fn env(&self) -> &TestEnv {
        &self.env
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), self.namespace.name())
    }

    /// Creates the sample cluster under `name` with `replicas`, without its backup section
    /// (backups are another controller's business).
    pub async fn create_sample(&self, name: &str, replicas: i32) -> PostgreSQLCluster {
        let mut cluster: PostgreSQLCluster = serde_yaml::from_str(SAMPLE).expect("sample parses");
        cluster.metadata.name = Some(name.to_owned());
        cluster.spec.replicas = replicas;
        cluster.spec.backup = None;
        self.clusters()
            .create(&PostParams::default(), &cluster)
            .await
            .expect("cluster created")
    }

    /// Waits until cluster `name` is Running with `replicas` ready and its status describes the
    /// latest generation.
    pub async fn wait_running(
        &self,
        name: &str,
        replicas: i32,
        timeout: Duration,
    ) -> PostgreSQLCluster {
        let clusters = self.clusters();
        wait_until(
            &format!("{name} Running with {replicas} ready"),
            timeout,
            || async {
                let cluster = clusters.get(name).await?;
                let status = cluster.status.clone().unwrap_or_default();
                let done = status.phase == Some(ClusterPhase::Running)
                    && status.ready_replicas == replicas
                    && status.observed_generation == cluster.metadata.generation;
                Ok(done.then_some(cluster))
            },
        )
        .await
        .expect("cluster reaches Running")
    }

    /// Deletes the test's clusters (the controllers remove their finalizers), stops the
    /// controllers, then deletes the namespace.
    pub async fn stop(mut self) {
        let clusters = self.clusters();
        let _ = clusters
            .delete_collection(&Default::default(), &Default::default())
            .await;
        let gone = wait_until(
            "the test's clusters to be deleted",
            Duration::from_secs(120),
            || async {
                Ok(clusters
                    .list_metadata(&Default::default())
                    .await?
                    .items
                    .is_empty()
                    .then_some(()))
            },
        )
        .await;
        if let Err(error) = gone {
            eprintln!("warning: {error:#}");
        }
        self.stop_controllers().await;
        self.namespace.cleanup().await;
    }
}

/// Events about `name` with `reason` in the test namespace, once there is at least one.
pub async fn events_with_reason(
    running: &Running,
    name: &str,
    reason: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    let events: Api<k8s_openapi::api::events::v1::Event> = running.api();
    wait_until(
        &format!("an Event {reason} about {name}"),
        Duration::from_secs(120),
        || async {
            let list = events.list(&ListParams::default()).await?;
            let matching: Vec<_> = list
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
                .collect();
            Ok((!matching.is_empty()).then_some(matching))
        },
    )
    .await
    .expect("Event published")
}
