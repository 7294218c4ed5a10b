//! Writing the status: computed by [`status::compute`](super::status::compute), written when it
//! changed, with an Event per change.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use pgkube_crds::{PostgreSQLCluster, PostgreSQLClusterStatus};
use serde_json::json;
use tracing::Span;

use super::context::ClusterContext;
use super::status::{self, Observation};
use super::{Error, STATUS_FIELD_MANAGER, cluster_key};
use crate::lean::Lean;

/// What the status step computed, and how long a change it held back waits.
pub(super) struct StatusStep {
    pub status: PostgreSQLClusterStatus,
    /// Set when only details changed, shortly after a transition: not written yet (see
    /// `status::details_hold`), the reconcile looks again within this.
    pub held_for: Option<Duration>,
}

/// Computes the status, writes it if it changed (a change of details alone may wait a few
/// seconds: see `status::details_hold`) and publishes an Event per change.
pub(super) async fn write_status(
    cluster: &PostgreSQLCluster,
    context: &ClusterContext,
    observation: Observation<'_>,
    publish_events: bool,
) -> Result<StatusStep, Error> {
    let now = Timestamp::now();
    let new_status = status::compute(observation, now);
    context.base.metrics.observe_cluster(
        &crate::metrics::ClusterLabels::of(cluster),
        new_status.phase,
    );
    let held_for = match status::difference(&new_status, observation.previous) {
        status::Difference::None => return Ok(StatusStep::written(new_status)),
        status::Difference::Details => observation
            .previous
            .and_then(|previous| status::details_hold(previous, now)),
        status::Difference::Summary => None,
    };
    if let Some(held_for) = held_for {
        Span::current().record("held_ms", held_for.as_millis());
        return Ok(StatusStep {
            status: new_status,
            held_for: Some(held_for),
        });
    }
    let written = patch_status(cluster, context, &new_status).await?;
    // This reconcile looks again when `new_status` asks: the write's echo need not trigger one.
    if let Some(version) = written {
        context.echoes.record(&cluster_key(cluster), version);
    }
    tracing::info!(phase = ?new_status.phase, ready = new_status.ready_replicas, "status updated");
    if let Some((kind, took)) = status::completed_change(&new_status, observation.previous) {
        context
            .base
            .metrics
            .observe_primary_change_completed(kind.as_str(), took);
    }
    // A reconcile that failed publishes one Event, its error's (see the error policy).
    if publish_events {
        for event in status::events(&new_status, observation.previous) {
            publish_event(context, cluster, event.warning, &event.reason, event.note).await;
        }
        let progress = status::recovery_progress(&new_status);
        let key = cluster_key(cluster);
        if context.progress_event_due(&key, progress.is_some(), Instant::now())
            && let Some(note) = progress
        {
            publish_event(context, cluster, false, "RecoveryProgress", note).await;
        }
    }
    Ok(StatusStep::written(new_status))
}

impl StatusStep {
    /// A status that is the cluster's now (written, or unchanged).
    fn written(status: PostgreSQLClusterStatus) -> Self {
        Self {
            status,
            held_for: None,
        }
    }
}

/// Writes `new_status` with server-side apply, as this controller's status field manager;
/// returns the cluster's resourceVersion after the write.
pub(super) async fn patch_status(
    cluster: &PostgreSQLCluster,
    context: &ClusterContext,
    new_status: &PostgreSQLClusterStatus,
) -> Result<Option<String>, Error> {
    let name = cluster.name_any();
    let namespace = cluster.namespace().ok_or(Error::MissingNamespace)?;
    // The version the status was computed from: a write computed from a cache that lags
    // behind the API server (one that has not seen a switchover or failover recorded yet)
    // is refused instead of undoing it.
    let body = json!({
        "apiVersion": PostgreSQLCluster::api_version(&()),
        "kind": PostgreSQLCluster::kind(&()),
        "metadata": {"resourceVersion": cluster.resource_version()},
        "status": new_status,
    });
    // Of the cluster sent back, only the version is read: decoded without its managed fields.
    let Lean(written) =
        Api::<Lean<PostgreSQLCluster>>::namespaced(context.base.client.clone(), &namespace)
            .patch_status(
                &name,
                &PatchParams::apply(STATUS_FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(|source| match source {
                kube::Error::Api(status) if status.code == 409 => {
                    Error::Stale { name: name.clone() }
                }
                source => Error::Kube {
                    action: "write status of",
                    kind: "PostgreSQLCluster".to_owned(),
                    name: name.clone(),
                    source,
                },
            })?;
    Ok(written.metadata.resource_version)
}

/// Publishes an Event about `cluster`; one that cannot be published is only logged.
pub(super) async fn publish_event(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    warning: bool,
    reason: &str,
    note: String,
) {
    let reference = cluster.object_ref(&());
    crate::publish_event(
        &context.recorder,
        &reference,
        warning,
        reason,
        note,
        "Reconcile",
    )
    .await;
}
