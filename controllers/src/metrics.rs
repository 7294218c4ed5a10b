//! Prometheus metrics of the controllers, served by the manager's `/metrics` endpoint.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
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

/// The controllers' metrics.
pub struct Metrics {
    reconcile_total: Family<ReconcileResultLabels, Counter>,
    reconcile_duration: Family<ControllerLabels, Histogram>,
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
        Self {
            reconcile_total,
            reconcile_duration,
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

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
