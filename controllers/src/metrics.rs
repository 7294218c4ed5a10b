//! Prometheus metrics of the controllers, served by the manager's `/metrics` endpoint.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of `operator_reconcile_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileResultLabels {
    pub controller: &'static str,
    /// `success` or `error`.
    pub result: &'static str,
}

/// Labels of `operator_reconcile_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: &'static str,
}

/// Labels of the per-cluster backup metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub namespace: String,
    pub cluster: String,
}

/// Labels of `pgkube_backups_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackupResultLabels {
    pub namespace: String,
    pub cluster: String,
    /// `completed` or `failed`.
    pub result: &'static str,
}

/// Labels of `pgkube_backup_skipped_ticks_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkippedTickLabels {
    pub namespace: String,
    pub cluster: String,
    /// Why the scheduled time made no backup, for example `BackupRunning` or `RestoreRunning`.
    pub reason: &'static str,
}

/// Labels of the primary-change metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PrimaryChangeLabels {
    /// `Switchover` or `Failover`.
    pub kind: &'static str,
}

/// The controllers' metrics.
pub struct Metrics {
    reconcile_total: Family<ReconcileResultLabels, Counter>,
    reconcile_duration: Family<ControllerLabels, Histogram>,
    backups_total: Family<BackupResultLabels, Counter>,
    backup_duration: Histogram,
    last_backup_time: Family<ClusterLabels, Gauge>,
    last_backup_size: Family<ClusterLabels, Gauge>,
    skipped_ticks: Family<SkippedTickLabels, Counter>,
    pruned_objects: Family<ClusterLabels, Counter>,
    primary_changes: Family<PrimaryChangeLabels, Counter>,
    primary_change_duration: Family<PrimaryChangeLabels, Histogram>,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let reconcile_total = Family::<ReconcileResultLabels, Counter>::default();
        // 0.01 s doubling 15 times: 10 ms to about 164 s.
        let reconcile_duration =
            Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.01, 2.0, 15))
            });
        registry.register(
            "operator_reconcile",
            "Reconciles by controller and result",
            reconcile_total.clone(),
        );
        registry.register(
            "operator_reconcile_duration_seconds",
            "Duration of reconciles in seconds",
            reconcile_duration.clone(),
        );
        let backup = BackupMetrics::register(registry);
        let primary_changes = Family::<PrimaryChangeLabels, Counter>::default();
        registry.register(
            "pgkube_primary_changes",
            "Switchovers and failovers decided, by kind",
            primary_changes.clone(),
        );
        // 0.25 s doubling 10 times: 250 ms to about 4 minutes.
        let primary_change_duration =
            Family::<PrimaryChangeLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.25, 2.0, 10))
            });
        registry.register(
            "pgkube_primary_change_duration_seconds",
            "Seconds from a switchover's or failover's decision until the new primary reported itself",
            primary_change_duration.clone(),
        );
        Self {
            reconcile_total,
            reconcile_duration,
            backups_total: backup.total,
            backup_duration: backup.duration,
            last_backup_time: backup.last_time,
            last_backup_size: backup.last_size,
            skipped_ticks: backup.skipped_ticks,
            pruned_objects: backup.pruned_objects,
            primary_changes,
            primary_change_duration,
        }
    }

    /// Records a backup that ended: Completed (`size` bytes stored, finished at `finished`,
    /// a Unix time in seconds) or Failed (`size` and `finished` are then `None`).
    pub fn observe_backup(
        &self,
        cluster: &ClusterLabels,
        took: Option<Duration>,
        completed: Option<(i64, i64)>,
    ) {
        let result = if completed.is_some() {
            "completed"
        } else {
            "failed"
        };
        self.backups_total
            .get_or_create(&BackupResultLabels {
                namespace: cluster.namespace.clone(),
                cluster: cluster.cluster.clone(),
                result,
            })
            .inc();
        if let Some(took) = took {
            self.backup_duration.observe(took.as_secs_f64());
        }
        if let Some((finished, size)) = completed {
            self.record_completed_backup(cluster, finished, size);
        }
    }

    /// Sets the cluster's last-success gauges to this completed backup (finished at
    /// `finished`, a Unix time, `size` bytes stored) if it is the newest seen. The backup
    /// controller calls it for every Completed backup it reconciles, so a restarted manager
    /// shows the figures before the next backup ends.
    pub fn record_completed_backup(&self, cluster: &ClusterLabels, finished: i64, size: i64) {
        let time = self.last_backup_time.get_or_create(cluster);
        if finished >= time.get() {
            time.set(finished);
            self.last_backup_size.get_or_create(cluster).set(size);
        }
    }

    /// Records a scheduled time that made no backup, and why.
    pub fn observe_skipped_tick(&self, cluster: &ClusterLabels, reason: &'static str) {
        self.skipped_ticks
            .get_or_create(&SkippedTickLabels {
                namespace: cluster.namespace.clone(),
                cluster: cluster.cluster.clone(),
                reason,
            })
            .inc();
    }

    /// Records objects a retention pass deleted from a cluster's backup storage.
    pub fn observe_pruned(&self, cluster: &ClusterLabels, objects: u64) {
        self.pruned_objects.get_or_create(cluster).inc_by(objects);
    }

    /// Counts a switchover or failover decided.
    pub fn observe_primary_change(&self, kind: &'static str) {
        self.primary_changes
            .get_or_create(&PrimaryChangeLabels { kind })
            .inc();
    }

    /// Records how long a switchover or failover took to complete.
    pub fn observe_primary_change_completed(&self, kind: &'static str, took: Duration) {
        self.primary_change_duration
            .get_or_create(&PrimaryChangeLabels { kind })
            .observe(took.as_secs_f64());
    }

    /// Records one finished reconcile of `controller`.
    pub fn observe_reconcile(&self, controller: &'static str, succeeded: bool, took: Duration) {
        let result = if succeeded { "success" } else { "error" };
        self.reconcile_total
            .get_or_create(&ReconcileResultLabels { controller, result })
            .inc();
        self.reconcile_duration
            .get_or_create(&ControllerLabels { controller })
            .observe(took.as_secs_f64());
    }
}

/// The backup metrics' families, registered under their names.
struct BackupMetrics {
    total: Family<BackupResultLabels, Counter>,
    duration: Histogram,
    last_time: Family<ClusterLabels, Gauge>,
    last_size: Family<ClusterLabels, Gauge>,
    skipped_ticks: Family<SkippedTickLabels, Counter>,
    pruned_objects: Family<ClusterLabels, Counter>,
}

impl BackupMetrics {
    fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            total: Family::default(),
            // 1 s doubling 16 times: 1 s to about 9 hours.
            duration: Histogram::new(exponential_buckets(1.0, 2.0, 16)),
            last_time: Family::default(),
            last_size: Family::default(),
            skipped_ticks: Family::default(),
            pruned_objects: Family::default(),
        };
        registry.register(
            "pgkube_backups",
            "Backups that ended, by cluster and result (completed or failed)",
            metrics.total.clone(),
        );
        registry.register(
            "pgkube_backup_duration_seconds",
            "Time from a backup's start to its end, verification included",
            metrics.duration.clone(),
        );
        registry.register(
            "pgkube_backup_last_success_timestamp_seconds",
            "Unix time at which the cluster's newest completed backup finished",
            metrics.last_time.clone(),
        );
        registry.register(
            "pgkube_backup_last_success_size_bytes",
            "Bytes stored by the cluster's newest completed backup",
            metrics.last_size.clone(),
        );
        registry.register(
            "pgkube_backup_skipped_ticks",
            "Scheduled backup times that made no backup, by reason",
            metrics.skipped_ticks.clone(),
        );
        registry.register(
            "pgkube_backup_pruned_objects",
            "Objects deleted from backup storage by retention",
            metrics.pruned_objects.clone(),
        );
        metrics
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn the_last_success_gauges_keep_the_newest_backup() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let cluster = ClusterLabels {
            namespace: "db".to_owned(),
            cluster: "main".to_owned(),
        };
        metrics.observe_backup(&cluster, Some(Duration::from_secs(70)), Some((2_000, 500)));
        metrics.record_completed_backup(&cluster, 1_000, 400);
        metrics.observe_backup(&cluster, None, None);
        let mut text = String::new();
        encode(&mut text, &registry).expect("metrics encode");
        for line in [
            r#"pgkube_backup_last_success_timestamp_seconds{namespace="db",cluster="main"} 2000"#,
            r#"pgkube_backup_last_success_size_bytes{namespace="db",cluster="main"} 500"#,
            r#"pgkube_backups_total{namespace="db",cluster="main",result="completed"} 1"#,
            r#"pgkube_backups_total{namespace="db",cluster="main",result="failed"} 1"#,
            "pgkube_backup_duration_seconds_count 1",
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
    }

    #[test]
    fn both_reconcile_metrics_are_exposed_with_their_labels() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.observe_reconcile("cluster", true, Duration::from_millis(30));
        metrics.observe_reconcile("cluster", false, Duration::from_millis(5));
        let mut text = String::new();
        encode(&mut text, &registry).expect("metrics encode");
        assert!(
            text.contains(r#"operator_reconcile_total{controller="cluster",result="success"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"operator_reconcile_total{controller="cluster",result="error"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"operator_reconcile_duration_seconds_count{controller="cluster"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"operator_reconcile_duration_seconds_bucket{le="0.01",controller="cluster"} 1"#
            ),
            "{text}"
        );
    }
}
