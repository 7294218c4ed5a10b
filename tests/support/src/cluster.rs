//! PostgreSQL clusters on the test bed's real node, for end-to-end tests.
//!
//! The test bed's real node, [`LOCAL_NODE`], runs its pods as local processes, each with its
//! own loopback address as `status.podIP`, reachable from the test process. The node is
//! labelled and tainted so that only pods that ask for it land there:
//! [`local_node_scheduling`] gives the `nodeSelector` and toleration that do. A second real
//! node takes the pods that tolerate its own taint too ([`crate::second_node_toleration`]). [`TestCluster`]
//! creates a `PostgreSQLCluster` there, waits until it runs, and connects to it with SQL.
//!
//! A cluster has one primary and streaming replicas. pgkube labels each pod with its role
//! ([`ROLE_LABEL`]) and routes three Services by it ([`ClusterService`]): `<cluster>-rw` to the
//! primary, `<cluster>-ro` to the replicas, `<cluster>-r` to any ready instance.
//! [`TestCluster::sql`] connects through `-rw`, [`TestCluster::sql_via`] through any of them.
//!
//! Names: pgkube names a cluster's children after it (`controllers/src/names.rs`); a name that
//! is a DNS label of at most [`MAX_CLUSTER_NAME`] characters is used verbatim, which is what
//! [`ClusterService::name`], [`credentials_secret_name`] and [`replication_secret_name`] assume
//! (the controllers' tests check that they agree).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Pod, PodSpec, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::{Api, Client};
use pgkube_crds::{
    ClusterPhase, PostgreSQLCluster, PostgreSQLClusterSpec, PostgresVersion, StorageSpec,
};

use crate::describe::describe_cluster;
use crate::service::service_addresses;
use crate::tls::{Login, connect};
use crate::{TestNamespace, wait_until};

/// The test bed's real node: its pods run as local processes.
pub const LOCAL_NODE: &str = "testbed-local";
/// Label (and taint key) of the real node.
pub const LOCAL_NODE_LABEL: &str = "pgkube.io/testbed-node";
/// Value of [`LOCAL_NODE_LABEL`] (and of the taint) on the real node.
pub const LOCAL_NODE_LABEL_VALUE: &str = "local";
/// How long a new cluster may take to reach Running by default.
pub const CLUSTER_RUNNING_TIMEOUT: Duration = Duration::from_secs(180);
/// Longest cluster name whose children pgkube names verbatim (`<name>-postgresql` is a
/// StatefulSet name, at most 52 characters).
pub const MAX_CLUSTER_NAME: usize = 41;
/// The port PostgreSQL listens on in each instance pod (at the pod's own address).
pub const POSTGRES_PORT: u16 = 5432;
/// How long one try of [`TestCluster::wait_writable`] may take.
pub const WRITE_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);
/// Keys of the credentials and replication Secrets.
pub const USERNAME_KEY: &str = "username";
pub const PASSWORD_KEY: &str = "password";
/// Pod label pgkube sets to the role the pod's instance manager reports: `primary` or
/// `replica`.
pub const ROLE_LABEL: &str = "db.example.com/role";

/// A `nodeSelector` and tolerations that put a pod on a node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeScheduling {
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
}

impl NodeScheduling {
    /// Adds these to a pod spec (keeping what it already has).
    pub fn apply_to_pod(&self, pod: &mut PodSpec) {
        pod.node_selector
            .get_or_insert_with(BTreeMap::new)
            .extend(self.node_selector.clone());
        pod.tolerations
            .get_or_insert_with(Vec::new)
            .extend(self.tolerations.iter().cloned());
    }

    /// Adds these to a cluster's scheduling fields (keeping what it already has).
    pub fn apply_to_cluster(&self, spec: &mut PostgreSQLClusterSpec) {
        spec.node_selector.extend(self.node_selector.clone());
        spec.tolerations.extend(self.tolerations.iter().cloned());
    }
}

/// What puts a pod on the real node [`LOCAL_NODE`]: the `nodeSelector`
/// `pgkube.io/testbed-node: local` and the toleration of its taint
/// `pgkube.io/testbed-node=local:NoSchedule`.
pub fn local_node_scheduling() -> NodeScheduling {
    NodeScheduling {
        node_selector: BTreeMap::from([(
            LOCAL_NODE_LABEL.to_owned(),
            LOCAL_NODE_LABEL_VALUE.to_owned(),
        )]),
        tolerations: vec![Toleration {
            key: Some(LOCAL_NODE_LABEL.to_owned()),
            operator: Some("Equal".to_owned()),
            value: Some(LOCAL_NODE_LABEL_VALUE.to_owned()),
            effect: Some("NoSchedule".to_owned()),
            ..Toleration::default()
        }],
    }
}

/// The Services clients of a cluster connect through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterService {
    /// `<cluster>-rw`: the primary.
    ReadWrite,
    /// `<cluster>-ro`: the streaming replicas.
    ReadOnly,
    /// `<cluster>-r`: any ready instance.
    Any,
}

impl ClusterService {
    /// The Service's name for cluster `cluster` (of at most [`MAX_CLUSTER_NAME`] characters).
    pub fn name(self, cluster: &str) -> String {
        let suffix = match self {
            Self::ReadWrite => "rw",
            Self::ReadOnly => "ro",
            Self::Any => "r",
        };
        format!("{cluster}-{suffix}")
    }
}

/// Name of the Secret holding the superuser's `username` and `password`.
pub fn credentials_secret_name(cluster: &str) -> String {
    format!("{cluster}-postgresql-credentials")
}

/// Name of the Secret holding the replication role's `username` and `password`.
pub fn replication_secret_name(cluster: &str) -> String {
    format!("{cluster}-postgresql-replication")
}

/// One of a cluster's pods, as the API server has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstancePod {
    pub name: String,
    /// Its uid: another one once the pod was replaced.
    pub uid: String,
    /// Its [`ROLE_LABEL`], if pgkube set one.
    pub role: Option<String>,
    /// Its `Ready` condition is `True`.
    pub ready: bool,
    pub address: Option<IpAddr>,
}

/// Builds a [`TestCluster`]: PostgreSQL 15, 1 replica, 1Gi, on the real node, unless changed.
#[derive(Clone, Debug)]
pub struct TestClusterBuilder {
    cluster: PostgreSQLCluster,
    timeout: Duration,
    /// JSON merged into the spec as it is sent (`Null`: nothing).
    extra_spec: serde_json::Value,
}

impl TestClusterBuilder {
    pub fn replicas(mut self, replicas: i32) -> Self {
        self.cluster.spec.replicas = replicas;
        self
    }

    pub fn version(mut self, version: PostgresVersion) -> Self {
        self.cluster.spec.postgres_version = version;
        self
    }

    /// The data volume's size, for example `2Gi`.
    pub fn storage(mut self, storage: &str) -> Self {
        self.cluster.spec.storage.size = storage.to_owned();
        self
    }

    /// Any other change to the spec.
    pub fn spec(mut self, change: impl FnOnce(&mut PostgreSQLClusterSpec)) -> Self {
        change(&mut self.cluster.spec);
        self
    }

    /// Fields merged into the spec as it is sent (a JSON merge: objects merge key by key,
    /// anything else replaces), for fields the typed spec does not have, such as those of a
    /// feature whose API is still being written, or values it cannot hold.
    pub fn extra_spec(mut self, fields: serde_json::Value) -> Self {
        merge_json(&mut self.extra_spec, fields);
        self
    }

    /// How long [`TestClusterBuilder::start`] waits for Running ([`CLUSTER_RUNNING_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The object that would be created.
    pub fn cluster(&self) -> &PostgreSQLCluster {
        &self.cluster
    }

    /// Creates the cluster in `namespace`, without waiting.
    pub async fn create(self, namespace: &TestNamespace) -> anyhow::Result<TestCluster> {
        let client = namespace.client().clone();
        let name = self.cluster.metadata.name.clone().unwrap_or_default();
        let body = self.body()?;
        let resource = ApiResource::erase::<PostgreSQLCluster>(&());
        Api::<DynamicObject>::namespaced_with(client.clone(), namespace.name(), &resource)
            .create(&PostParams::default(), &body)
            .await
            .with_context(|| format!("creating PostgreSQLCluster {name}"))?;
        Ok(TestCluster {
            client,
            namespace: namespace.name().to_owned(),
            name,
        })
    }

    /// The object as it is sent: the typed cluster with [`TestClusterBuilder::extra_spec`]
    /// merged into its spec.
    pub fn body(&self) -> anyhow::Result<DynamicObject> {
        let mut json = serde_json::to_value(&self.cluster).context("serializing the cluster")?;
        if !self.extra_spec.is_null() {
            merge_json(&mut json["spec"], self.extra_spec.clone());
        }
        serde_json::from_value(json).context("the cluster as a dynamic object")
    }

    /// Creates the cluster in `namespace` and waits until it is Running; the error tells the
    /// cluster's status and its namespace's pods.
    pub async fn start(self, namespace: &TestNamespace) -> anyhow::Result<TestCluster> {
        let timeout = self.timeout;
        let cluster = self.create(namespace).await?;
        cluster.wait_running(timeout).await?;
        Ok(cluster)
    }
}

/// A `PostgreSQLCluster` made by a test. A manager (or the controllers in-process) must run to
/// bring it up; the namespace's cleanup removes it.
#[derive(Clone)]
pub struct TestCluster {
    pub(crate) client: Client,
    pub(crate) namespace: String,
    pub(crate) name: String,
}

impl TestCluster {
    /// A cluster called `name` (a DNS label of at most [`MAX_CLUSTER_NAME`] characters):
    /// PostgreSQL 15, 1 replica, 1Gi of storage, scheduled on the real node [`LOCAL_NODE`].
    pub fn builder(name: &str) -> TestClusterBuilder {
        assert!(
            name.len() <= MAX_CLUSTER_NAME && is_dns_label(name),
            "test cluster name {name:?} must be a DNS label of at most {MAX_CLUSTER_NAME} characters"
        );
        let mut spec = PostgreSQLClusterSpec {
            replicas: 1,
            postgres_version: PostgresVersion::V15,
            storage: StorageSpec {
                size: "1Gi".to_owned(),
                storage_class_name: None,
            },
            resources: None,
            backup: None,
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            affinity: None,
            postgresql: None,
            bootstrap: None,
            high_availability: None,
            spread: None,
            primary_update_strategy: None,
            enable_superuser_access: false,
            network_policy: None,
            certificates: None,
            service_account_name: None,
            monitoring: None,
        };
        local_node_scheduling().apply_to_cluster(&mut spec);
        TestClusterBuilder {
            cluster: PostgreSQLCluster::new(name, spec),
            timeout: CLUSTER_RUNNING_TIMEOUT,
            extra_spec: serde_json::Value::Null,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The clusters of the test's namespace.
    pub fn api(&self) -> Api<PostgreSQLCluster> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The cluster as the API server has it now.
    pub async fn get(&self) -> anyhow::Result<PostgreSQLCluster> {
        self.api()
            .get(&self.name)
            .await
            .with_context(|| format!("reading PostgreSQLCluster {}", self.name))
    }

    /// Waits until the cluster is Running for its current generation.
    pub async fn wait_running(&self, timeout: Duration) -> anyhow::Result<PostgreSQLCluster> {
        wait_for_cluster_running(&self.client, &self.namespace, &self.name, timeout).await
    }

    /// Deletes the cluster and waits until it is gone. Call it while the manager still runs:
    /// the manager removes the cluster's finalizer, without which neither the cluster nor its
    /// namespace can go.
    pub async fn delete(&self, timeout: Duration) -> anyhow::Result<()> {
        let clusters = self.api();
        match clusters.delete(&self.name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(error) => {
                return Err(error).with_context(|| format!("deleting cluster {}", self.name));
            }
        }
        wait_until(
            &format!("cluster {} to be deleted", self.name),
            timeout,
            || async { Ok(clusters.get_opt(&self.name).await?.is_none().then_some(())) },
        )
        .await
    }

    /// The addresses of the ready primary behind the cluster's `-rw` Service (one, or none).
    pub async fn addresses(&self) -> anyhow::Result<Vec<SocketAddr>> {
        self.addresses_of(ClusterService::ReadWrite).await
    }

    /// The addresses of the ready instances behind one of the cluster's Services.
    pub async fn addresses_of(&self, service: ClusterService) -> anyhow::Result<Vec<SocketAddr>> {
        service_addresses(&self.client, &self.namespace, &service.name(&self.name)).await
    }

    /// The cluster's pods, by name, with their role labels.
    pub async fn pods(&self) -> anyhow::Result<Vec<InstancePod>> {
        let selector = format!(
            "app.kubernetes.io/name=postgresql,app.kubernetes.io/instance={}",
            self.name
        );
        let pods = Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .list(&ListParams::default().labels(&selector))
            .await
            .with_context(|| format!("listing the pods of cluster {}", self.name))?;
        let mut pods: Vec<InstancePod> = pods.items.iter().map(instance_pod).collect();
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(pods)
    }

    /// The pod `status.currentPrimary` names, if any.
    pub async fn current_primary(&self) -> anyhow::Result<Option<String>> {
        Ok(self.get().await?.status.and_then(|s| s.current_primary))
    }

    /// Waits until the cluster's condition `type_` has `status` ("True" or "False") for its
    /// current generation, and returns the cluster.
    pub async fn wait_condition(
        &self,
        type_: &str,
        status: &str,
        timeout: Duration,
    ) -> anyhow::Result<PostgreSQLCluster> {
        wait_for_cluster(
            &self.client,
            &self.namespace,
            &self.name,
            &format!("condition {type_}={status}"),
            timeout,
            |cluster| condition(cluster, type_).is_some_and(|c| c.status == status),
        )
        .await
    }

    /// A SQL connection, as the superuser with the client certificate the operator issued, to
    /// database `postgres` of the primary, through the cluster's `-rw` Service.
    pub async fn sql(&self) -> anyhow::Result<tokio_postgres::Client> {
        self.sql_via(ClusterService::ReadWrite).await
    }

    /// A SQL connection, as the superuser, to database `postgres` of a ready instance behind
    /// `service` (the first address that accepts it).
    pub async fn sql_via(&self, service: ClusterService) -> anyhow::Result<tokio_postgres::Client> {
        self.connect_via(service, "postgres").await
    }

    /// A SQL connection, as the superuser, to database `database` of the primary, through the
    /// cluster's `-rw` Service.
    pub async fn sql_to(&self, database: &str) -> anyhow::Result<tokio_postgres::Client> {
        self.connect_via(ClusterService::ReadWrite, database).await
    }

    /// A SQL connection, as the superuser, to database `postgres` of pod `pod` itself (its
    /// address, port 5432), whatever its role and whatever the Services say.
    pub async fn sql_to_pod(&self, pod: &str) -> anyhow::Result<tokio_postgres::Client> {
        let found = Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .get(pod)
            .await
            .with_context(|| format!("reading pod {pod}"))?;
        let address = instance_pod(&found)
            .address
            .with_context(|| format!("pod {pod} has no address"))?;
        let (user, password) = self.credentials().await?;
        let host = self.pod_host(pod);
        let login = Login {
            host: &host,
            user: &user,
            password: &password,
            database: "postgres",
        };
        connect(
            SocketAddr::new(address, POSTGRES_PORT),
            &login,
            self.superuser_tls().await?,
        )
        .await
        .with_context(|| format!("connecting to pod {pod} at {address}"))
    }

    /// Runs `statement` through the `-rw` Service, on a new connection each time, every 100 ms
    /// until it succeeds or `timeout` passes, and returns how long it took. Each try is cut
    /// after [`WRITE_ATTEMPT_TIMEOUT`]: a stopped server accepts connections but never answers.
    pub async fn wait_writable(
        &self,
        statement: &str,
        timeout: Duration,
    ) -> anyhow::Result<Duration> {
        let started = std::time::Instant::now();
        let mut last = String::from("no try yet");
        while started.elapsed() < timeout {
            let attempt = async {
                let sql = self.sql().await?;
                sql.batch_execute(statement).await?;
                anyhow::Ok(())
            };
            match tokio::time::timeout(WRITE_ATTEMPT_TIMEOUT, attempt).await {
                Ok(Ok(())) => return Ok(started.elapsed()),
                Ok(Err(error)) => last = format!("{error:#}"),
                Err(_) => last = format!("no answer in {WRITE_ATTEMPT_TIMEOUT:?}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!(
            "{statement:?} through {} did not succeed in {timeout:?}; last: {last}",
            ClusterService::ReadWrite.name(&self.name)
        )
    }

    /// Logs in as `user` with `password` to database `postgres` at `address` (behind `-rw`),
    /// over TLS verified for the `-rw` Service's name; the server's error as it is.
    pub async fn log_in(
        &self,
        address: SocketAddr,
        user: &str,
        password: &str,
    ) -> anyhow::Result<Result<tokio_postgres::Client, tokio_postgres::Error>> {
        let host = format!(
            "{}.{}.svc",
            ClusterService::ReadWrite.name(&self.name),
            self.namespace
        );
        let login = Login {
            host: &host,
            user,
            password,
            database: "postgres",
        };
        Ok(connect(address, &login, self.tls().await?).await)
    }

    /// The name of pod `pod` through the headless Service, which its certificate covers.
    pub fn pod_host(&self, pod: &str) -> String {
        format!(
            "{pod}.{}-postgresql-headless.{}.svc",
            self.name, self.namespace
        )
    }

    async fn connect_via(
        &self,
        service: ClusterService,
        database: &str,
    ) -> anyhow::Result<tokio_postgres::Client> {
        let (user, password) = self.credentials().await?;
        let tls = self.superuser_tls().await?;
        let service = service.name(&self.name);
        let host = format!("{service}.{}.svc", self.namespace);
        let addresses = service_addresses(&self.client, &self.namespace, &service).await?;
        anyhow::ensure!(
            !addresses.is_empty(),
            "Service {service} has no ready pod to connect to"
        );
        let mut failures = Vec::new();
        for address in addresses {
            let login = Login {
                host: &host,
                user: &user,
                password: &password,
                database,
            };
            match connect(address, &login, tls.clone()).await {
                Ok(client) => return Ok(client),
                Err(error) => failures.push(format!("{address}: {error}")),
            }
        }
        anyhow::bail!(
            "no instance behind Service {service} accepted a connection: {}",
            failures.join("; ")
        )
    }
}

pub(crate) fn instance_pod(pod: &Pod) -> InstancePod {
    let status = pod.status.as_ref();
    InstancePod {
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        role: pod
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(ROLE_LABEL).cloned()),
        ready: status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        address: status
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|ip| ip.parse().ok()),
    }
}

/// Condition `type_` of a cluster's status.
pub fn condition(cluster: &PostgreSQLCluster, type_: &str) -> Option<Condition> {
    cluster
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .cloned()
}

/// Waits until cluster `name` in `namespace` reports phase Running for its current generation.
/// On timeout the error also shows the cluster's status and its namespace's pods (phase,
/// conditions, container states), to tell a manager fault from a test bed one.
///
/// Running means that the StatefulSet is ready and that the primary's instance manager reports
/// a ready primary: on the test bed's simulated (kwok) nodes, whose pods never run, a cluster
/// made by the manager never gets there; wait with [`wait_for_cluster`] for what it does reach.
pub async fn wait_for_cluster_running(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<PostgreSQLCluster> {
    wait_for_cluster(client, namespace, name, "Running", timeout, |cluster| {
        cluster.status.as_ref().and_then(|s| s.phase) == Some(ClusterPhase::Running)
    })
    .await
}

/// Waits until cluster `name` in `namespace` has a status for its current generation for which
/// `done` holds (`what` names it in the error). On timeout the error also shows the cluster's
/// status and its namespace's pods.
pub async fn wait_for_cluster(
    client: &Client,
    namespace: &str,
    name: &str,
    what: &str,
    timeout: Duration,
    done: impl Fn(&PostgreSQLCluster) -> bool,
) -> anyhow::Result<PostgreSQLCluster> {
    let clusters: Api<PostgreSQLCluster> = Api::namespaced(client.clone(), namespace);
    let waited = wait_until(
        &format!("cluster {namespace}/{name}: {what}"),
        timeout,
        || async {
            let cluster = clusters.get(name).await?;
            let current = cluster.status.as_ref().and_then(|s| s.observed_generation)
                == cluster.metadata.generation;
            Ok((current && done(&cluster)).then_some(cluster))
        },
    )
    .await;
    match waited {
        Ok(cluster) => Ok(cluster),
        Err(error) => Err(anyhow::anyhow!(
            "{error:#}\n{}",
            describe_cluster(client, namespace, name).await
        )),
    }
}

/// A JSON merge (RFC 7386, without deletion by `null`): `patch`'s objects merge into
/// `target`'s key by key, anything else replaces what `target` has there.
fn merge_json(target: &mut serde_json::Value, patch: serde_json::Value) {
    match (target, patch) {
        (serde_json::Value::Object(target), serde_json::Value::Object(patch)) => {
            for (key, value) in patch {
                merge_json(target.entry(key).or_insert(serde_json::Value::Null), value);
            }
        }
        (target, patch) => *target = patch,
    }
}

/// A DNS-1035 label: lowercase letters, digits and `-`, starting with a letter, not ending
/// with `-`.
fn is_dns_label(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

mod secrets;
pub use secrets::ApplicationSecret;

#[cfg(test)]
mod tests;
