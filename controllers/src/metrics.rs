//! Prometheus metrics of the controllers, served by the manager's `/metrics` endpoint.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use kube::ResourceExt;
use pgkube_crds::{ClusterPhase, PostgreSQLCluster, PrimaryChangeKind};

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

impl ClusterLabels {
    /// The labels of `cluster`.
    pub fn of(cluster: &PostgreSQLCluster) -> Self {
        Self {
            namespace: cluster.namespace().unwrap_or_default(),
            cluster: cluster.name_any(),
        }
    }
}

/// The results of `pgkube_backups_total`.
const BACKUP_RESULTS: [&str; 2] = ["completed", "failed"];

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

/// Labels of `pgkube_primary_change_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PrimaryChangeLabels {
    /// `Switchover` or `Failover`.
    pub kind: &'static str,
}

/// Labels of `pgkube_primary_changes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterPrimaryChangeLabels {
    pub namespace: String,
    pub cluster: String,
    /// `Switchover` or `Failover`.
    pub kind: &'static str,
}

/// Labels of `pgkube_cluster_phase`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub namespace: String,
    pub cluster: String,
    /// One of [`PHASES`], as `status.phase` spells it.
    pub phase: &'static str,
}

/// Every phase a cluster can be in: `pgkube_cluster_phase` has a series for each.
pub const PHASES: [ClusterPhase; 7] = [
    ClusterPhase::Pending,
    ClusterPhase::Creating,
    ClusterPhase::Running,
    ClusterPhase::Scaling,
    ClusterPhase::Upgrading,
    ClusterPhase::Degraded,
    ClusterPhase::Failed,
];

/// `phase` as `status.phase` spells it.
pub fn phase_name(phase: ClusterPhase) -> &'static str {
    match phase {
        ClusterPhase::Pending => "Pending",
        ClusterPhase::Creating => "Creating",
        ClusterPhase::Running => "Running",
        ClusterPhase::Scaling => "Scaling",
        ClusterPhase::Upgrading => "Upgrading",
        ClusterPhase::Degraded => "Degraded",
        ClusterPhase::Failed => "Failed",
    }
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
    last_scheduled: Family<ClusterLabels, Gauge>,
    primary_changes: Family<ClusterPrimaryChangeLabels, Counter>,
    primary_change_duration: Family<PrimaryChangeLabels, Histogram>,
    phase: Family<PhaseLabels, Gauge>,
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
        let primary_changes = Family::<ClusterPrimaryChangeLabels, Counter>::default();
        registry.register(
            "pgkube_primary_changes",
            "Switchovers and failovers decided, by cluster and kind",
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
        let phase = Family::<PhaseLabels, Gauge>::default();
        registry.register(
            "pgkube_cluster_phase",
            "1 for the cluster's current phase (status.phase), 0 for the others",
            phase.clone(),
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
            last_scheduled: backup.last_scheduled,
            primary_changes,
            primary_change_duration,
            phase,
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
        let [completed_result, failed_result] = BACKUP_RESULTS;
        let result = if completed.is_some() {
            completed_result
        } else {
            failed_result
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

    /// Sets the cluster's latest scheduled backup time that has come (a Unix time), or
    /// removes it (`None`: no schedule, or none of its times has come since it started).
    pub fn observe_last_scheduled(&self, cluster: &ClusterLabels, at: Option<i64>) {
        match at {
            Some(at) => {
                self.last_scheduled.get_or_create(cluster).set(at);
            }
            None => {
                self.last_scheduled.remove(cluster);
            }
        }
    }

    /// Counts a switchover or failover of `cluster` decided.
    pub fn observe_primary_change(&self, cluster: &ClusterLabels, kind: &'static str) {
        self.primary_changes
            .get_or_create(&ClusterPrimaryChangeLabels {
                namespace: cluster.namespace.clone(),
                cluster: cluster.cluster.clone(),
                kind,
            })
            .inc();
    }

    /// Sets `pgkube_cluster_phase` of `cluster`: 1 for `phase`, 0 for the others (all 0
    /// without a phase). Makes its primary-change and backup counters too (at 0), so that a
    /// first failover or failed backup shows as an increase, not as a new series.
    pub fn observe_cluster(&self, cluster: &ClusterLabels, phase: Option<ClusterPhase>) {
        for result in BACKUP_RESULTS {
            self.backups_total
                .get_or_create(&BackupResultLabels {
                    namespace: cluster.namespace.clone(),
                    cluster: cluster.cluster.clone(),
                    result,
                })
                .inc_by(0);
        }
        for kind in [PrimaryChangeKind::Switchover, PrimaryChangeKind::Failover] {
            self.primary_changes
                .get_or_create(&ClusterPrimaryChangeLabels {
                    namespace: cluster.namespace.clone(),
                    cluster: cluster.cluster.clone(),
                    kind: kind.as_str(),
                })
                .inc_by(0);
        }
        for each in PHASES {
            let labels = PhaseLabels {
                namespace: cluster.namespace.clone(),
                cluster: cluster.cluster.clone(),
                phase: phase_name(each),
            };
            self.phase
                .get_or_create(&labels)
                .set(i64::from(phase == Some(each)));
        }
    }

    /// Removes the series of a deleted cluster that the cluster controller and the scheduler
    /// set (its phase, its primary changes and backup counts, its scheduled time), so that
    /// neither the dashboard nor the alerts show it any more.
    pub fn forget_cluster(&self, cluster: &ClusterLabels) {
        for each in PHASES {
            self.phase.remove(&PhaseLabels {
                namespace: cluster.namespace.clone(),
                cluster: cluster.cluster.clone(),
                phase: phase_name(each),
            });
        }
        for kind in [PrimaryChangeKind::Switchover, PrimaryChangeKind::Failover] {
            self.primary_changes.remove(&ClusterPrimaryChangeLabels {
                namespace: cluster.namespace.clone(),
                cluster: cluster.cluster.clone(),
                kind: kind.as_str(),
            });
        }
        for result in BACKUP_RESULTS {
            self.backups_total.remove(&BackupResultLabels {
                namespace: cluster.namespace.clone(),
                cluster: cluster.cluster.clone(),
                result,
            });
        }
        self.last_scheduled.remove(cluster);
    }

    /// Records how long a switchover or failover took to complete.
    pub fn observe_primary_change_completed(&self, kind: &'static str, took: Duration) {
        self.primary_change_duration
            .get_or_create(&PrimaryChangeLabels { kind })
            .observe(took.as_secs_f64());
    }

    /// Records one finished reconcile of `controller`. The other result's series is made too
    /// (at 0), so that the first error shows as an increase, not as a new series.
    pub fn observe_reconcile(&self, controller: &'static str, succeeded: bool, took: Duration) {
        for result in ["success", "error"] {
            let counter = self
                .reconcile_total
                .get_or_create(&ReconcileResultLabels { controller, result });
            if (result == "success") == succeeded {
                counter.inc();
            }
        }
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
    last_scheduled: Family<ClusterLabels, Gauge>,
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
            last_scheduled: Family::default(),
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
        registry.register(
            "pgkube_backup_last_scheduled_timestamp_seconds",
            "Unix time of the cluster's latest scheduled backup time that has come since its schedule started",
            metrics.last_scheduled.clone(),
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

    fn encoded(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).expect("metrics encode");
        text
    }

    #[test]
    fn a_clusters_phase_is_one_series_per_phase_and_goes_with_the_cluster() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let cluster = ClusterLabels {
            namespace: "db".to_owned(),
            cluster: "main".to_owned(),
        };
        let other = ClusterLabels {
            namespace: "db".to_owned(),
            cluster: "other".to_owned(),
        };
        metrics.observe_cluster(&cluster, Some(ClusterPhase::Running));
        metrics.observe_cluster(&other, None);
        let text = encoded(&registry);
        let series = |cluster: &str, phase: &str, value: u8| {
            format!(
                "pgkube_cluster_phase{{namespace=\"db\",cluster=\"{cluster}\",phase=\"{phase}\"}} {value}\n"
            )
        };
        for line in [
            series("main", "Running", 1),
            series("main", "Degraded", 0),
            series("main", "Pending", 0),
            series("other", "Running", 0),
        ] {
            assert!(text.contains(&line), "{line} in:\n{text}");
        }
        assert_eq!(
            text.matches("cluster=\"main\",phase=").count(),
            PHASES.len()
        );
        metrics.observe_cluster(&cluster, Some(ClusterPhase::Degraded));
        let text = encoded(&registry);
        assert!(text.contains(&series("main", "Running", 0)), "{text}");
        assert!(text.contains(&series("main", "Degraded", 1)), "{text}");

        let switchovers =
            r#"pgkube_primary_changes_total{namespace="db",cluster="main",kind="Switchover"} 0"#;
        assert!(text.contains(switchovers), "{text}");
        let failed = r#"pgkube_backups_total{namespace="db",cluster="main",result="failed"} 0"#;
        assert!(text.contains(failed), "{text}");
        metrics.observe_primary_change(&cluster, PrimaryChangeKind::Failover.as_str());
        metrics.observe_last_scheduled(&cluster, Some(1_700_000_000));
        let text = encoded(&registry);
        for line in [
            switchovers,
            r#"pgkube_primary_changes_total{namespace="db",cluster="main",kind="Failover"} 1"#,
            r#"pgkube_backup_last_scheduled_timestamp_seconds{namespace="db",cluster="main"} 1700000000"#,
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
        metrics.forget_cluster(&cluster);
        let text = encoded(&registry);
        assert!(!text.contains("cluster=\"main\""), "{text}");
        assert!(text.contains(&series("other", "Running", 0)), "{text}");
    }

    #[test]
    fn a_scheduled_time_that_no_longer_applies_is_removed() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let cluster = ClusterLabels {
            namespace: "db".to_owned(),
            cluster: "main".to_owned(),
        };
        metrics.observe_last_scheduled(&cluster, Some(60));
        metrics.observe_last_scheduled(&cluster, Some(120));
        assert!(encoded(&registry).contains(
            "pgkube_backup_last_scheduled_timestamp_seconds{namespace=\"db\",cluster=\"main\"} 120\n"
        ));
        metrics.observe_last_scheduled(&cluster, None);
        let text = encoded(&registry);
        assert!(
            !text.contains("pgkube_backup_last_scheduled_timestamp_seconds{"),
            "{text}"
        );
    }

    #[test]
    fn phase_names_are_spelled_as_in_the_status() {
        for phase in PHASES {
            let json = serde_json::to_value(phase).expect("JSON");
            assert_eq!(json.as_str(), Some(phase_name(phase)));
        }
    }

    #[test]
    fn both_reconcile_metrics_are_exposed_with_their_labels() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.observe_reconcile("cluster", true, Duration::from_millis(30));
        assert!(
            encoded(&registry)
                .contains(r#"operator_reconcile_total{controller="cluster",result="error"} 0"#),
            "the error series from the first reconcile on"
        );
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
