//! High availability of a [`TestCluster`] on the real node, for the failover tests: waiting
//! until a cluster is healthy (one primary, every other instance streaming from it, caught up),
//! until a switchover or failover completed, until an old primary streams from the new one;
//! and [`RoleSampler`], which looks at the pods every [`SAMPLE_PERIOD`] to check that no two of
//! them ever carry `db.example.com/role=primary` and `-rw` never resolves to two pods.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use kube::api::ListParams;
use pgkube_crds::{InstanceRole, PrimaryChange, PrimaryChangeKind};
use tokio::task::JoinHandle;

use crate::cluster::{ClusterService, ROLE_LABEL, TestCluster, TestClusterBuilder, instance_pod};
use crate::namespace::TestNamespace;
use crate::service::pod_addresses;
use crate::wait_until;

/// How often a [`RoleSampler`] looks at the pods.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(100);

impl TestClusterBuilder {
    /// Starts the cluster in `namespace`, waits until it is healthy, runs `setup` through
    /// `-rw` and waits until every replica has caught up with it; returns the cluster and its
    /// primary. Each wait takes at most `timeout`.
    pub async fn start_healthy(
        self,
        namespace: &TestNamespace,
        setup: &str,
        timeout: Duration,
    ) -> anyhow::Result<(TestCluster, String)> {
        let cluster = self.start(namespace).await?;
        let primary = cluster.wait_healthy(None, timeout).await?;
        let sql = cluster.sql().await.context("login through rw")?;
        sql.batch_execute(setup)
            .await
            .with_context(|| format!("running {setup:?} through rw"))?;
        drop(sql);
        cluster
            .wait_healthy(Some(&primary), timeout)
            .await
            .context("the replicas catch up")?;
        Ok((cluster, primary))
    }
}

impl TestCluster {
    /// The label selector of the cluster's instance pods.
    fn pod_selector(&self) -> String {
        format!(
            "app.kubernetes.io/name=postgresql,app.kubernetes.io/instance={}",
            self.name
        )
    }

    /// Waits until the cluster has one primary (`primary`, if given) and every other instance
    /// of `spec.replicas` a ready replica streaming from it, caught up, on its timeline, and each
    /// pod ready and labelled with its role; returns the primary.
    pub async fn wait_healthy(
        &self,
        primary: Option<&str>,
        timeout: Duration,
    ) -> anyhow::Result<String> {
        let what = match primary {
            Some(primary) => format!("{primary} primary, the replicas streaming, caught up"),
            None => "one primary, the replicas streaming, caught up".to_owned(),
        };
        wait_until(&what, timeout, || async {
            let cluster = self.get().await?;
            let instances = usize::try_from(cluster.spec.replicas)?;
            let status = cluster.status.unwrap_or_default();
            let Some(current) = status.current_primary.clone() else {
                return Ok(None);
            };
            if primary.is_some_and(|wanted| wanted != current) {
                return Ok(None);
            }
            let Some(timeline) = status
                .instances
                .iter()
                .find(|i| i.name == current && i.role == InstanceRole::Primary && i.ready)
                .and_then(|i| i.timeline)
            else {
                return Ok(None);
            };
            let replicas = status
                .instances
                .iter()
                .filter(|i| {
                    i.name != current
                        && i.role == InstanceRole::Replica
                        && i.ready
                        && i.streaming == Some(true)
                        && i.lag_bytes == Some(0)
                        && i.timeline == Some(timeline)
                })
                .count();
            let pods = self.pods().await?;
            let labelled = pods.len() == instances
                && pods.iter().all(|pod| {
                    let role = if pod.name == current {
                        "primary"
                    } else {
                        "replica"
                    };
                    pod.ready && pod.role.as_deref() == Some(role)
                });
            if replicas + 1 != instances || !labelled {
                return Ok(None);
            }
            // The status can lag the last write by an instance's report: the primary itself
            // says whether every replica replayed all its WAL.
            let caught_up = self.replicas_replayed_everything(&current).await?;
            Ok((caught_up == instances - 1).then_some(current))
        })
        .await
    }

    /// How many replicas of `primary` replayed all the WAL it wrote, as it says now.
    async fn replicas_replayed_everything(&self, primary: &str) -> anyhow::Result<usize> {
        let sql = self.sql_to_pod(primary).await?;
        let row = sql
            .query_one(
                "SELECT count(*) FROM pg_stat_replication \
                 WHERE state = 'streaming' AND replay_lsn >= pg_current_wal_lsn()",
                &[],
            )
            .await?;
        Ok(usize::try_from(row.get::<_, i64>(0))?)
    }

    /// Waits until `status.primaryChange` is a completed change of `kind` from `from` to
    /// another instance, and `status.currentPrimary` names that instance; returns the change.
    pub async fn wait_primary_change(
        &self,
        kind: PrimaryChangeKind,
        from: &str,
        timeout: Duration,
    ) -> anyhow::Result<PrimaryChange> {
        wait_until(
            &format!("status.primaryChange: a completed {kind:?} from {from}"),
            timeout,
            || async {
                let status = self.get().await?.status.unwrap_or_default();
                let Some(change) = status.primary_change else {
                    return Ok(None);
                };
                let done = change.kind == kind
                    && change.from == from
                    && change.to != from
                    && change.completed_at.is_some()
                    && status.current_primary.as_deref() == Some(change.to.as_str());
                Ok(done.then_some(change))
            },
        )
        .await
    }

    /// The timeline the server at `pod` writes WAL on (a primary's current WAL file names it).
    pub async fn primary_timeline(&self, pod: &str) -> anyhow::Result<u32> {
        let sql = self.sql_to_pod(pod).await?;
        let file: String = sql
            .query_one("SELECT pg_walfile_name(pg_current_wal_lsn())", &[])
            .await
            .with_context(|| format!("the current WAL file of {pod}"))?
            .get(0);
        u32::from_str_radix(file.get(..8).unwrap_or_default(), 16)
            .with_context(|| format!("a timeline in the WAL file name {file:?}"))
    }

    /// Waits until `old` is a standby streaming from the primary `new` on `new`'s timeline and
    /// `replayed`, a query of one boolean run on `old`, is true (for example that it has a row
    /// written on `new` after the change).
    pub async fn wait_rejoined(
        &self,
        old: &str,
        new: &str,
        replayed: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let timeline = self.primary_timeline(new).await?;
        let rejoined = wait_until(
            &format!("{old} streaming from {new} on timeline {timeline}, with {replayed:?}"),
            timeout,
            || async {
                let sql = self.sql_to_pod(old).await?;
                let in_recovery: bool = sql
                    .query_one("SELECT pg_is_in_recovery()", &[])
                    .await?
                    .get(0);
                if !in_recovery {
                    anyhow::bail!("{old} is not in recovery");
                }
                let receiving: Option<(i32, String)> = sql
                    .query_opt(
                        "SELECT received_tli, conninfo FROM pg_stat_wal_receiver \
                         WHERE status = 'streaming'",
                        &[],
                    )
                    .await?
                    .map(|row| (row.get(0), row.get(1)));
                let Some((received, conninfo)) = receiving else {
                    anyhow::bail!("{old} has no streaming WAL receiver");
                };
                if received != i32::try_from(timeline)? || !conninfo.contains(new) {
                    anyhow::bail!("{old} receives timeline {received} with {conninfo:?}");
                }
                let done: bool = sql.query_one(replayed, &[]).await?.get(0);
                Ok(done.then_some(()))
            },
        )
        .await;
        match rejoined {
            Ok(()) => Ok(()),
            // What the instance manager said is what tells why; its pod may be gone later.
            Err(error) => Err(error.context(self.log_tail(old).await)),
        }
    }

    /// The last lines of `pod`'s PostgreSQL container log (and of its previous run).
    pub async fn log_tail(&self, pod: &str) -> String {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let mut tail = String::new();
        for previous in [true, false] {
            let params = kube::api::LogParams {
                container: Some("postgresql".to_owned()),
                previous,
                tail_lines: Some(60),
                ..kube::api::LogParams::default()
            };
            let log = pods
                .logs(pod, &params)
                .await
                .unwrap_or_else(|error| format!("(no log: {error})"));
            let run = if previous {
                "previous run"
            } else {
                "current run"
            };
            tail.push_str(&format!("--- {pod}, {run}:\n{log}\n"));
        }
        tail
    }
}

/// One look at a cluster's pods.
#[derive(Clone, Debug)]
pub struct Sample {
    pub at: Instant,
    /// Pods labelled primary (with ` (terminating)` after a pod being deleted).
    pub primaries: Vec<String>,
    /// Pods `-rw` resolves to.
    pub rw: Vec<String>,
}

/// Samples a cluster's pods every [`SAMPLE_PERIOD`] in the background: which carry
/// `db.example.com/role=primary`, and which `-rw` resolves to. Stops when dropped.
pub struct RoleSampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl RoleSampler {
    /// Starts sampling the pods of `cluster` (whose `-rw` Service must exist).
    pub async fn start(cluster: &TestCluster) -> anyhow::Result<RoleSampler> {
        let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
        let rw_name = ClusterService::ReadWrite.name(&cluster.name);
        let rw = Api::<Service>::namespaced(cluster.client.clone(), &cluster.namespace)
            .get(&rw_name)
            .await
            .with_context(|| format!("reading Service {rw_name}"))?;
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let samples = samples.clone();
            let stop = stop.clone();
            let selector = cluster.pod_selector();
            async move {
                while !stop.load(Ordering::SeqCst) {
                    if let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await {
                        let sample = Self::sample(&rw, &list.items);
                        samples.lock().expect("samples").push(sample);
                    }
                    tokio::time::sleep(SAMPLE_PERIOD).await;
                }
            }
        });
        Ok(RoleSampler {
            samples,
            stop,
            task,
        })
    }

    fn sample(rw: &Service, pods: &[Pod]) -> Sample {
        let primaries = pods
            .iter()
            .filter(|pod| {
                pod.metadata
                    .labels
                    .as_ref()
                    .and_then(|labels| labels.get(ROLE_LABEL))
                    .map(String::as_str)
                    == Some("primary")
            })
            .map(|pod| {
                let terminating = pod.metadata.deletion_timestamp.is_some();
                format!(
                    "{}{}",
                    instance_pod(pod).name,
                    if terminating { " (terminating)" } else { "" }
                )
            })
            .collect();
        let addresses = pod_addresses(rw, pods).unwrap_or_default();
        let rw = addresses
            .iter()
            .map(|address| {
                pods.iter()
                    .map(instance_pod)
                    .find(|pod| pod.address == Some(address.ip()))
                    .map_or_else(|| address.to_string(), |pod| pod.name)
            })
            .collect();
        Sample {
            at: Instant::now(),
            primaries,
            rw,
        }
    }

    /// The samples taken so far.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().expect("samples").clone()
    }

    /// The first moment `-rw` resolved to `pod` alone.
    pub fn first_rw_only(&self, pod: &str) -> Option<Instant> {
        self.samples()
            .iter()
            .find(|s| s.rw.len() == 1 && s.rw[0] == pod)
            .map(|s| s.at)
    }

    /// Stops sampling and asserts that there were enough samples to say anything (more than
    /// 20) and that none had two pods labelled primary or `-rw` resolving to two pods; returns
    /// the samples.
    pub async fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::SeqCst);
        let _ = (&mut self.task).await;
        let samples = self.samples();
        assert!(
            samples.len() > 20,
            "too few samples to say anything: {}",
            samples.len()
        );
        let start = samples[0].at;
        let doubled: Vec<String> = samples
            .iter()
            .filter(|s| s.primaries.len() > 1 || s.rw.len() > 1)
            .map(|s| {
                format!(
                    "+{:.1}s: primary label on {:?}, -rw to {:?}",
                    (s.at - start).as_secs_f64(),
                    s.primaries,
                    s.rw
                )
            })
            .collect();
        assert!(
            doubled.is_empty(),
            "two primaries at once in {} of {} samples: {doubled:?}",
            doubled.len(),
            samples.len()
        );
        samples
    }
}

impl Drop for RoleSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}
