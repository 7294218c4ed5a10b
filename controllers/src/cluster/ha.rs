//! High availability in each reconcile, before and apart from applying the children: a
//! switchover or failover is decided ([`failover::plan`]) and recorded in the status before
//! anything is done about it, then carried through: the pods' role labels first (the old
//! primary loses `role=primary`, so `-rw` never routes to two pods), then the commands to the
//! instance managers. An error applying the children comes after this step and cannot hold a
//! failover back, and the error policy never waits longer than the failover pace for a
//! cluster that has standbys ([`retry_cap`]).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use pgkube_crds::{
    PostgreSQLBackup, PostgreSQLCluster, PostgreSQLClusterStatus, PostgreSQLRestore,
};
use serde_json::json;
use tracing::{Instrument, Span, field, info_span};

use super::build::{self, ChildNames};
use super::context::ClusterContext;
use super::report::{patch_status, publish_event};
use super::status::{self, Observation};
use super::{Error, apply, bootstrap, failover, instances, read, restores, roles};

/// What the high-availability step leaves for the rest of the reconcile.
pub(super) enum Step {
    /// A switchover or failover was recorded in the status: this reconcile ends there, and the
    /// next carries it through.
    Recorded(Action),
    /// Nothing to record; the labels and commands are out.
    Continue(Carried),
}

/// What the rest of the reconcile needs from the high-availability step.
pub(super) struct Carried {
    /// Why the cluster does not fail over although its primary is unavailable.
    pub waiting: Option<String>,
    /// The primary is unavailable or a change is under way: look again within a second.
    pub urgent: bool,
    /// A change is under way ([`failover::Plan::carrying`]).
    pub carrying: bool,
    pub failover_delay: Duration,
}

/// The revision of the StatefulSet's current pod template, once its controller made one.
pub(super) fn update_revision(live: &read::LiveChildren) -> Option<&str> {
    live.statefulset
        .as_ref()?
        .status
        .as_ref()?
        .update_revision
        .as_deref()
}

/// The failover delay of `cluster`'s spec.
pub(super) fn failover_delay(cluster: &PostgreSQLCluster) -> Duration {
    Duration::from_secs(u64::from(
        pgkube_crds::HighAvailability::failover_delay_seconds(
            cluster.spec.high_availability.as_ref(),
        ),
    ))
}

/// Decides whether the primary moves and records it, or carries the recorded state through:
/// role labels first (the old primary is fenced from `-rw`), then the commands.
pub(super) async fn step(
    cluster: &PostgreSQLCluster,
    context: &ClusterContext,
    names: &ChildNames,
    live: &read::LiveChildren,
    primary: &str,
    fenced: bool,
) -> Result<Step, Error> {
    let namespace = cluster.namespace().ok_or(Error::MissingNamespace)?;
    let high_availability = cluster.spec.high_availability.as_ref();
    let failover_delay = failover_delay(cluster);
    let outdated = super::rollout::outdated(update_revision(live), &live.pods);
    let situation = failover::Situation {
        statefulset: &names.statefulset,
        replicas: live_replicas(live, cluster.spec.replicas),
        requested_replicas: cluster.spec.replicas,
        outdated: &outdated,
        supervised_update: cluster.spec.primary_update_strategy
            == Some(pgkube_crds::PrimaryUpdateStrategy::Supervised),
        failover_delay,
        fence_wait: Duration::from_secs(u64::from(
            pgkube_crds::HighAvailability::isolation_timeout_seconds(high_availability)
                + pgkube_crds::FENCE_MARGIN_SECONDS,
        )),
        synchronous_min: high_availability
            .and_then(|ha| ha.synchronous.as_ref())
            .map_or(0, |sync| sync.min_standbys),
        status: cluster.status.as_ref(),
        primary,
        switchover_request: cluster
            .annotations()
            .get(failover::SWITCHOVER_ANNOTATION)
            .map(String::as_str),
        instances: &live.instances,
        restoring: is_restoring(cluster.status.as_ref()),
        now: Timestamp::now(),
    };
    let plan = failover::plan(&situation);
    if let Some(change) = plan.designate.clone() {
        let action = Box::pin(record_primary_change(cluster, context, names, live, change))
            .instrument(info_span!("designate"))
            .await?;
        // Only once the switchover is recorded: a request is never dropped unanswered.
        if plan.clear_request {
            answer_switchover_request(context, cluster, &namespace, None).await?;
        }
        return Ok(Step::Recorded(action));
    }
    if plan.clear_request {
        answer_switchover_request(context, cluster, &namespace, plan.refusal.as_deref()).await?;
    }
    // Spans only when there is something to do: most reconciles have nothing.
    // Fenced for an in-place recovery: no pod is routed to as the primary.
    let routed_primary = if fenced { "" } else { primary };
    let label_changes = roles::label_changes(&live.instances, routed_primary);
    if !label_changes.is_empty() {
        label_roles(context, &namespace, &label_changes)
            .instrument(info_span!("labels", writes = field::Empty))
            .await?;
    }
    let commands = failover::commands(&situation);
    if !commands.is_empty() {
        let promoted = send_commands(context, cluster, names, live, &commands)
            .instrument(info_span!("commands", count = commands.len()))
            .await?;
        // A promotion answered: rw routes to the new primary now, not at the next look.
        let mut after = roles::with_labels(&live.instances, &label_changes);
        roles::with_promoted(&mut after, &promoted);
        let label_changes = roles::label_changes(&after, routed_primary);
        if !promoted.is_empty() && !label_changes.is_empty() {
            label_roles(context, &namespace, &label_changes)
                .instrument(info_span!("labels", writes = field::Empty))
                .await?;
        }
    }
    Ok(Step::Continue(Carried {
        waiting: plan.waiting,
        urgent: plan.urgent,
        carrying: plan.carrying,
        failover_delay,
    }))
}

/// The longest a failed reconcile of `cluster` may wait before the next: the failover pace
/// for a cluster with standbys, so that no error elsewhere (a child that does not apply)
/// delays a failover by its backoff.
pub(super) fn retry_cap(cluster: &PostgreSQLCluster) -> Option<Duration> {
    let status = cluster.status.as_ref()?;
    has_standbys(status, cluster.spec.replicas)
        .then(|| failover::watch_period(failover_delay(cluster), false, false))
}

/// The instances the cluster has now: the StatefulSet's replicas, else the spec's.
pub(super) fn live_replicas(live: &read::LiveChildren, spec_replicas: i32) -> i32 {
    live.statefulset
        .as_ref()
        .and_then(|sts| sts.spec.as_ref()?.replicas)
        .unwrap_or(spec_replicas)
}

/// Whether a restore into the cluster runs (its `Restoring` condition is True).
pub(super) fn is_restoring(status: Option<&PostgreSQLClusterStatus>) -> bool {
    status.is_some_and(|status| {
        status
            .conditions
            .iter()
            .any(|c| c.type_ == restores::RESTORING && c.status == "True")
    })
}

/// A cluster whose primary has come up and that has replicas to fail over to is watched at
/// the failover pace.
pub(super) fn has_standbys(status: &PostgreSQLClusterStatus, replicas: i32) -> bool {
    status.current_primary.is_some() && replicas > 1
}

/// Records a switchover or failover in the status before anything is done about it, so that
/// the next reconcile (of this manager or of a new leader) carries it through; publishes the
/// Event and counts it. The children are left as they are until then.
async fn record_primary_change(
    cluster: &PostgreSQLCluster,
    context: &ClusterContext,
    names: &ChildNames,
    live: &read::LiveChildren,
    change: pgkube_crds::PrimaryChange,
) -> Result<Action, Error> {
    tracing::warn!(kind = change.kind.as_str(), from = %change.from, to = %change.to, reason = %change.reason, "moving the primary");
    let mut previous = cluster.status.clone().unwrap_or_default();
    previous.target_primary = Some(change.to.clone());
    previous.primary_change = Some(change.clone());
    let backups = context.backups_of(cluster);
    let backups: Vec<&PostgreSQLBackup> = backups.iter().map(AsRef::as_ref).collect();
    let restores = context.restores_of(cluster);
    let restores: Vec<&PostgreSQLRestore> = restores.iter().map(AsRef::as_ref).collect();
    let gate = bootstrap::bootstrap_gate(cluster, &live.instances, &change.to);
    let bootstrap = restores::bootstrap(cluster, &restores, cluster.status.as_ref(), &gate);
    let archive_root = super::validate::archive_root(cluster);
    let observation = Observation {
        generation: cluster.metadata.generation,
        desired_replicas: live_replicas(live, cluster.spec.replicas),
        statefulset: live.statefulset.as_deref(),
        issue: None,
        previous: Some(&previous),
        statefulset_name: &names.statefulset,
        primary: &change.to,
        instances: &live.instances,
        backups: &backups,
        restores: &restores,
        bootstrap: bootstrap.as_ref(),
        failover_waiting: None,
        rollout_waiting: None,
        archive_root: archive_root.as_deref(),
        in_place: None,
    };
    let new_status = status::compute(observation, Timestamp::now());
    patch_status(cluster, context, &new_status).await?;
    context.base.metrics.observe_primary_change(
        &crate::metrics::ClusterLabels::of(cluster),
        change.kind.as_str(),
    );
    let (warning, reason) = match change.kind {
        pgkube_crds::PrimaryChangeKind::Failover => (true, "FailoverStarted"),
        pgkube_crds::PrimaryChangeKind::Switchover => (false, "SwitchoverStarted"),
    };
    let note = format!("{} -> {}: {}", change.from, change.to, change.reason);
    publish_event(context, cluster, warning, reason, note).await;
    // The status change comes back through the watch and triggers the next step (this write
    // is not recorded in `echoes`); this is the fallback.
    Ok(Action::requeue(failover::CHANGE_PERIOD))
}

/// Removes the switchover annotation once the request is recorded or refused; a refusal is
/// a Warning Event that says why.
async fn answer_switchover_request(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    namespace: &str,
    refusal: Option<&str>,
) -> Result<(), Error> {
    let name = cluster.name_any();
    let patch = json!({"metadata": {"annotations": {failover::SWITCHOVER_ANNOTATION: null}}});
    Api::<PostgreSQLCluster>::namespaced(context.base.client.clone(), namespace)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Kube {
            action: "remove the switchover annotation of",
            kind: "PostgreSQLCluster".to_owned(),
            name: name.clone(),
            source,
        })?;
    if let Some(refusal) = refusal {
        tracing::warn!(%refusal, "switchover refused");
        publish_event(
            context,
            cluster,
            true,
            "SwitchoverRefused",
            refusal.to_owned(),
        )
        .await;
    }
    Ok(())
}

/// Sends each command to its instance manager; returns the pods whose promotion was answered.
/// The control token is read from its Secret only when there is a command to send (rare): the
/// manager keeps no Secret data in its caches. A command that fails is logged and sent again
/// by a later reconcile, which looks at the instances anew.
async fn send_commands(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    names: &ChildNames,
    live: &read::LiveChildren,
    commands: &[failover::Command],
) -> Result<Vec<String>, Error> {
    let mut promoted = Vec::new();
    if commands.is_empty() {
        return Ok(promoted);
    }
    let namespace = cluster.namespace().ok_or(Error::MissingNamespace)?;
    let token = control_token(context, &namespace, names).await?;
    let source = context.base.settings.instance_status.as_ref();
    let term = failover::current_term(cluster.status.as_ref());
    for command in commands {
        let pod = command.pod();
        let Some(address) = live.instance_address(pod) else {
            continue;
        };
        let control = match command {
            failover::Command::Promote { .. } => instances::ControlCommand::Promote { term },
            failover::Command::Follow { primary, .. } => instances::ControlCommand::Follow {
                primary: primary.clone(),
                primary_host: build::instance_host(names, &namespace, primary),
                term,
            },
        };
        match source.command(&address, &token, &control).await {
            Ok(()) => {
                tracing::info!(%pod, ?control, "instance manager commanded");
                if matches!(control, instances::ControlCommand::Promote { .. }) {
                    promoted.push(pod.to_owned());
                }
            }
            Err(error) => tracing::warn!(%pod, ?control, %error, "command not taken; retried"),
        }
    }
    Ok(promoted)
}

/// The cluster's control token, from its Secret.
pub(super) async fn control_token(
    context: &ClusterContext,
    namespace: &str,
    names: &ChildNames,
) -> Result<String, Error> {
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
        context.base.client.clone(),
        namespace,
    )
    .get(&names.control_secret)
    .await
    .map_err(|source| Error::Kube {
        action: "read",
        kind: "Secret".to_owned(),
        name: names.control_secret.clone(),
        source,
    })?;
    secret
        .data
        .as_ref()
        .and_then(|data| data.get(build::CONTROL_TOKEN_KEY))
        .and_then(|token| String::from_utf8(token.0.clone()).ok())
        .ok_or(Error::Invariant("the control Secret has no token"))
}

/// Labels pods with their roles (in the current span, which records the writes).
async fn label_roles(
    context: &ClusterContext,
    namespace: &str,
    changes: &[roles::LabelChange],
) -> Result<usize, Error> {
    let writes = apply::label_roles(&context.base.client, namespace, changes).await?;
    Span::current().record("writes", writes);
    Ok(writes)
}
