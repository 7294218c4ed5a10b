//! The pipeline of one reconcile, one span per step under the root span `reconcile`: `read`
//! the live children and what the instances report -> high availability first, apart from the
//! children (see [`ha`](super::ha)) -> `validate` (pure) -> `certificates` that are due (see
//! [`certificates`](super::certificates)) -> `build` (pure) -> `apply` what differs -> the
//! bootstrap restore, if any -> `status` -> when to look again.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use pgkube_crds::{
    ClusterPhase, PostgreSQLBackup, PostgreSQLCluster, PostgreSQLClusterStatus, PostgreSQLRestore,
};
use rand::Rng;
use rand::distr::Alphanumeric;
use tracing::{Instrument, field, info_span};

use super::build::ChildNames;
use super::context::ClusterContext;
use super::report::{StatusStep, write_status};
use super::status::{Issue, Observation};
use super::validate::LiveFacts;
use super::{
    Error, INSTANCE_REFRESH, SOLE_INSTANCE_REFRESH, WAIT_REQUEUE, apply, bootstrap, build,
    certificates, failover, ha, in_place, instances, manager_upgrade, read, recovery, roles,
    rollout, settled, validate,
};

/// The pipeline for a cluster that is not being deleted.
pub(super) async fn reconcile_cluster(
    cluster: &PostgreSQLCluster,
    context: &ClusterContext,
) -> Result<Action, Error> {
    let namespace = cluster.namespace().ok_or(Error::MissingNamespace)?;
    let names = ChildNames::for_cluster(&cluster.name_any());
    let primary = roles::designated_primary(cluster.status.as_ref(), &names);
    let server_ca = instances::ServerCa::of(cluster.spec.certificates.as_ref());
    let live = read_live(context, &namespace, &names, server_ca)
        .instrument(info_span!("read"))
        .await?;
    let restores = context.restores_of(cluster);
    let restores: Vec<&PostgreSQLRestore> = restores.iter().map(AsRef::as_ref).collect();
    let fenced = in_place::fenced(cluster, &restores);
    let ha = match ha::step(cluster, context, &names, &live, &primary, fenced).await? {
        ha::Step::Recorded(action) => return Ok(action),
        ha::Step::Continue(carried) => carried,
    };
    let rollout_waiting = rollout_step(context, cluster, &names, &live, &primary, &ha).await?;
    manager_upgrade::step(context, cluster, &names, &live, &ha, fenced).await?;
    let synchronous_standbys = synchronous_standbys(cluster, &live.instances, &primary);
    let facts = LiveFacts {
        primary_ordinal: roles::ordinal(&names.statefulset, &primary),
        ..live.facts()
    };
    let validated = info_span!("validate").in_scope(|| validate::validate(cluster, &facts));
    let system_identifier = super::identity::recorded_system_identifier(
        cluster.status.as_ref(),
        &live.instances,
        &primary,
    );
    let (validated, recovery) =
        plan_recovery(context, cluster, validated, system_identifier.is_some()).await?;
    let in_place = plan_in_place(context, cluster, &restores, &live.instances, &primary).await?;
    let instances = live.instances.clone();
    let built = Built {
        primary: &primary,
        synchronous_standbys,
        system_identifier: system_identifier.as_deref(),
        recovery: recovery
            .as_ref()
            .or(in_place.as_ref().and_then(|p| p.order.as_ref())),
        in_place: in_place.as_ref().and_then(|p| p.stage.as_ref()),
    };
    let (outcome, apply_error) = apply_step(context, cluster, validated, live, built).await?;
    let backups = context.backups_of(cluster);
    let backups: Vec<&PostgreSQLBackup> = backups.iter().map(AsRef::as_ref).collect();
    let bootstrap =
        bootstrap::step(context, cluster, &instances, &primary, &restores, &outcome).await?;
    let archive_root = validate::archive_root(cluster);
    let observation = Observation {
        generation: cluster.metadata.generation,
        desired_replicas: outcome.desired_replicas,
        statefulset: outcome.statefulset.as_deref(),
        issue: outcome.issue.as_ref(),
        previous: cluster.status.as_ref(),
        statefulset_name: &names.statefulset,
        primary: &primary,
        instances: &instances,
        backups: &backups,
        restores: &restores,
        bootstrap: bootstrap.as_ref(),
        failover_waiting: ha.waiting.as_deref(),
        rollout_waiting: rollout_waiting.as_deref(),
        archive_root: archive_root.as_deref(),
        in_place: in_place.as_ref().map(|p| &p.status),
    };
    let StatusStep {
        status: new_status,
        held_for,
    } = Box::pin(write_status(
        cluster,
        context,
        observation,
        apply_error.is_none(),
    ))
    .instrument(info_span!("status", held_ms = field::Empty))
    .await?;
    let next = requeue_after(context, &outcome, &new_status, &instances, &ha, held_for);
    match apply_error {
        Some(error) => Err(error),
        None => Ok(Action::requeue(next)),
    }
}

/// The cluster's children and instances, from the namespace's caches once they are ready.
async fn read_live(
    context: &ClusterContext,
    namespace: &str,
    names: &ChildNames,
    server_ca: instances::ServerCa<'_>,
) -> Result<read::LiveChildren, Error> {
    let source = context.base.settings.instance_status.as_ref();
    let stores = context
        .children_in(namespace)
        .ok_or(Error::Invariant("no cache of the cluster's namespace"))?;
    stores.ready().await?;
    let access = context.instance_access.for_cluster(
        &context.base.client,
        stores,
        namespace,
        names,
        server_ca,
    );
    let live = read::read(stores, namespace, names, source, access.await?).await;
    context
        .instance_access
        .after_read(namespace, names, &live.instances);
    Ok(live)
}

/// The rollout's step for the live children: why it replaces no pod now, if it does not.
async fn rollout_step(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    names: &ChildNames,
    live: &read::LiveChildren,
    primary: &str,
    ha: &ha::Carried,
) -> Result<Option<String>, Error> {
    let namespace = cluster.namespace().ok_or(Error::MissingNamespace)?;
    let input = rollout::Input {
        statefulset: &names.statefulset,
        update_revision: ha::update_revision(live),
        pods: &live.pods,
        instances: &live.instances,
        primary,
        replicas: live
            .facts()
            .running_replicas
            .unwrap_or(cluster.spec.replicas),
        change_in_progress: failover::change_in_progress(cluster.status.as_ref()),
        restoring: ha::is_restoring(cluster.status.as_ref()),
    };
    rollout::step(
        &context.base.client,
        &namespace,
        &input,
        ha.waiting.as_deref(),
    )
    .await
}

/// When to look again: the next look the outcome and status call for, within the failover pace
/// for a cluster with standbys, and at the latest when a held-back change's hold ends.
fn requeue_after(
    context: &ClusterContext,
    outcome: &Outcome,
    status: &PostgreSQLClusterStatus,
    instances: &[instances::ObservedInstance],
    ha: &ha::Carried,
    held_for: Option<Duration>,
) -> Duration {
    let mut next = next_look(
        outcome,
        status,
        !instances.is_empty(),
        context.base.settings.resync_interval,
    );
    if ha::has_standbys(status, outcome.desired_replicas) {
        next = next.min(failover::watch_period(
            ha.failover_delay,
            ha.urgent,
            ha.carrying,
        ));
    }
    if let Some(held_for) = held_for {
        next = next.min(held_for);
    }
    if let Some(renewal) = outcome.certificate_renewal {
        // At least a second: a renewal that failed is retried by the error policy instead.
        next = next.min(renewal.max(Duration::from_secs(1)));
    }
    next
}

/// Builds and applies the children of a valid spec. A child that does not apply still leaves a
/// status that says so (and what the instances report): its error comes back second, for the
/// error policy after the status.
async fn apply_step(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    validated: Result<validate::Validation, validate::InvalidSpec>,
    live: read::LiveChildren,
    built: Built<'_>,
) -> Result<(Outcome, Option<Error>), Error> {
    let namespace = cluster.namespace().ok_or(Error::MissingNamespace)?;
    let validation = match validated {
        Ok(validation) => validation,
        Err(invalid) => return Ok((invalid_spec_outcome(cluster, live, invalid), None)),
    };
    let statefulset = live.statefulset.clone();
    match apply_validated(context, &namespace, validation, live, built).await {
        Ok(outcome) => Ok((outcome, None)),
        Err(error) if error.is_stale() || error.is_namespace_terminating() => Err(error),
        Err(error) => Ok((
            failed_apply_outcome(cluster, statefulset, &error),
            Some(error),
        )),
    }
}

/// The in-place recovery under way, if any (see [`in_place`]); a span only when there is one.
async fn plan_in_place(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    restores: &[&PostgreSQLRestore],
    instances: &[instances::ObservedInstance],
    primary: &str,
) -> Result<Option<in_place::InPlace>, Error> {
    if in_place::running_restore(restores).is_none() {
        return Ok(None);
    }
    in_place::plan(context, cluster, restores, instances, primary)
        .instrument(info_span!("in_place"))
        .await
}

/// Standbys each commit waits for: as many replicas as stream, within the spec's
/// `[minStandbys, maxStandbys]` and never more than the cluster's other instances; 0 without
/// synchronous replication.
fn synchronous_standbys(
    cluster: &PostgreSQLCluster,
    instances: &[instances::ObservedInstance],
    primary: &str,
) -> u32 {
    let Some(sync) = cluster
        .spec
        .high_availability
        .as_ref()
        .and_then(|ha| ha.synchronous.as_ref())
    else {
        return 0;
    };
    let streaming = instances
        .iter()
        .filter(|instance| instance.pod != primary)
        .filter(|instance| instance.reported().is_some_and(|report| report.streaming))
        .count();
    let streaming = u32::try_from(streaming).unwrap_or(u32::MAX);
    let others = u32::try_from(cluster.spec.replicas.saturating_sub(1)).unwrap_or(0);
    streaming
        .clamp(sync.min_standbys, sync.max_standbys.max(sync.min_standbys))
        .min(others)
}

/// When to reconcile again although nothing changed.
fn next_look(
    outcome: &Outcome,
    status: &PostgreSQLClusterStatus,
    has_pods: bool,
    resync: Duration,
) -> Duration {
    // An invalid spec or a held-back change waits for the user to edit the spec, which the
    // watch reports: no need to look again sooner than the resync (or the instances' refresh).
    let invalid_spec = outcome.issue.as_ref().is_some_and(|i| i.invalid_spec);
    let caught_up = status.phase == Some(ClusterPhase::Running)
        && !outcome.expansion_pending
        && (outcome.issue.is_none() || outcome.held_back);
    let wait = if invalid_spec || caught_up {
        resync
    } else {
        WAIT_REQUEUE.min(resync)
    };
    if !has_pods {
        return wait;
    }
    let sole_instance = outcome.desired_replicas == 1 && status.ready_replicas == 1;
    if caught_up && sole_instance {
        wait.min(SOLE_INSTANCE_REFRESH)
    } else {
        wait.min(INSTANCE_REFRESH)
    }
}

/// What a reconcile's apply step left for the status step.
pub(super) struct Outcome {
    /// The StatefulSet as it is now, if it exists.
    statefulset: Option<Arc<StatefulSet>>,
    /// Why the cluster does not (fully) follow its spec.
    pub issue: Option<Issue>,
    /// `issue` is a change held back (the cluster runs from its last accepted state).
    held_back: bool,
    expansion_pending: bool,
    /// Replicas the StatefulSet should have.
    desired_replicas: i32,
    /// When the first of the cluster's certificates is due for renewal.
    certificate_renewal: Option<Duration>,
}

/// The recovery the first instance follows, if any (see [`recovery`]). A recovery refused as
/// asked makes the spec invalid: nothing is built, since without its order the first instance
/// would make a new database.
async fn plan_recovery(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    validated: Result<validate::Validation, validate::InvalidSpec>,
    recorded: bool,
) -> Result<
    (
        Result<validate::Validation, validate::InvalidSpec>,
        Option<crate::storage::recovery::RecoveryOrder>,
    ),
    Error,
> {
    let Ok(mut validation) = validated else {
        return Ok((validated, None));
    };
    validation.effective.recovery_storage = recovery::source_storage(context, cluster);
    let asked = cluster
        .spec
        .bootstrap
        .as_ref()
        .is_some_and(|bootstrap| bootstrap.recovery.is_some());
    // A span only when there is a recovery to plan: most reconciles have none.
    if !asked || recorded {
        return Ok((Ok(validation), None));
    }
    let own_archive = validation
        .effective
        .wal_archive
        .as_ref()
        .map(|storage| build::wal_archive_target(&validation.effective, storage));
    let resolution = recovery::resolve(context, cluster, recorded, own_archive.as_ref())
        .instrument(info_span!("recovery"))
        .await?;
    Ok(match resolution {
        recovery::Resolution::NotAsked => (Ok(validation), None),
        recovery::Resolution::Order(order) => (Ok(validation), Some(*order)),
        recovery::Resolution::Refused(why) => (
            Err(validate::InvalidSpec(format!(
                "spec.bootstrap.recovery: {why}"
            ))),
            None,
        ),
    })
}

/// An invalid spec applies nothing: the children stay as they are.
fn invalid_spec_outcome(
    cluster: &PostgreSQLCluster,
    live: read::LiveChildren,
    invalid: validate::InvalidSpec,
) -> Outcome {
    tracing::warn!(message = %invalid, "invalid spec; children left as they are");
    // The StatefulSet keeps its replicas: judge readiness against those.
    let replicas = live
        .statefulset
        .as_ref()
        .and_then(|sts| sts.spec.as_ref()?.replicas)
        .unwrap_or(cluster.spec.replicas);
    Outcome {
        statefulset: live.statefulset,
        issue: Some(Issue {
            reason: "InvalidSpec".to_owned(),
            message: invalid.0,
            invalid_spec: true,
        }),
        held_back: false,
        expansion_pending: false,
        desired_replicas: replicas,
        certificate_renewal: None,
    }
}

/// The children could not all be applied: the status tells why, and judges readiness against
/// the StatefulSet as it is.
fn failed_apply_outcome(
    cluster: &PostgreSQLCluster,
    statefulset: Option<Arc<StatefulSet>>,
    error: &Error,
) -> Outcome {
    let replicas = statefulset
        .as_ref()
        .and_then(|sts| sts.spec.as_ref()?.replicas)
        .unwrap_or(cluster.spec.replicas);
    Outcome {
        statefulset,
        issue: Some(Issue {
            reason: "ApplyFailed".to_owned(),
            message: error.to_string(),
            invalid_spec: false,
        }),
        held_back: false,
        expansion_pending: false,
        desired_replicas: replicas,
        certificate_renewal: None,
    }
}

/// What the children are built from besides the spec and the primary.
#[derive(Clone, Copy)]
struct Built<'a> {
    /// The designated primary.
    primary: &'a str,
    synchronous_standbys: u32,
    system_identifier: Option<&'a str>,
    recovery: Option<&'a crate::storage::recovery::RecoveryOrder>,
    in_place: Option<&'a crate::storage::recovery::in_place::InPlaceOrder>,
}

/// Builds and applies the effective spec of a valid cluster; changes it holds back become the
/// issue reported in the status.
async fn apply_validated(
    context: &ClusterContext,
    namespace: &str,
    validation: validate::Validation,
    live: read::LiveChildren,
    built: Built<'_>,
) -> Result<Outcome, Error> {
    let validate::Validation {
        effective,
        refusals,
    } = validation;
    let refusal = refusal_issue(&refusals);
    if let Some(refusal) = &refusal {
        tracing::warn!(reason = %refusal.reason, message = %refusal.message, "change held back; applying the rest of the spec");
    }
    let settings = &context.base.settings;
    let (superuser_password, replication_password, application_password) = (
        generate_password(),
        generate_password(),
        generate_password(),
    );
    let control_token = generate_token();
    let mut input = build::BuildInput {
        image_repository: &settings.postgres_image_repository,
        instance_manager_image: &settings.agent_image,
        primary: built.primary,
        superuser_password: &superuser_password,
        replication_password: &replication_password,
        application_password: &application_password,
        control_token: &control_token,
        manager_namespace: settings.manager_namespace.as_deref(),
        synchronous_standbys: built.synchronous_standbys,
        tls_only: certificates::tls_only(&live),
        client_certificates: certificates::client_certificates_required(&effective, &live),
        system_identifier: built.system_identifier,
        recovery: built.recovery,
        in_place: built.in_place,
    };
    // Kept after an operator upgrade, which replaces the managers in place instead of a roll.
    let installer_image =
        manager_upgrade::installer_image(&effective, &input, live.statefulset.as_deref());
    input.instance_manager_image = &installer_image;
    let certificate_renewal = ensure_certificates(context, namespace, &effective, &live)
        .instrument(info_span!("certificates"))
        .await?;
    let key = format!("{namespace}/{}", effective.name);
    let fingerprint = settled::fingerprint(&effective, &input, &live).map_err(Error::Serialize)?;
    // Build and compare only when something the children depend on changed since they were
    // last found up to date; otherwise both would find the same again (see `settled`).
    let desired = (!context.settled.is_settled(&key, &fingerprint))
        .then(|| info_span!("build").in_scope(|| build::build(&effective, &input)));
    let compared = desired.is_some();
    let apply_span = info_span!("apply", writes = field::Empty, settled = !compared);
    let makes_token = !live.control_token_exists;
    let applied = Box::pin(apply::apply(
        &context.base.client,
        namespace,
        desired,
        live,
        effective.storage_gib,
    ))
    .instrument(apply_span.clone())
    .await?;
    if makes_token && compared {
        let names = ChildNames::for_cluster(&effective.name);
        context
            .instance_access
            .seed_token(namespace, &names, &control_token);
    }
    if compared {
        context
            .settled
            .record(&key, fingerprint, applied.children_writes > 0);
    }
    apply_span.record("writes", applied.children_writes + applied.volume_writes);
    Ok(Outcome {
        statefulset: Some(applied.statefulset),
        held_back: refusal.is_some(),
        // A refusal needs the user's attention first; a volume that cannot grow comes next.
        issue: refusal.or(applied.issue),
        expansion_pending: applied.expansion_pending,
        desired_replicas: effective.replicas,
        certificate_renewal,
    })
}

/// Issues the cluster's certificates that are due (see [`certificates`]) before the pods that
/// mount them are applied; returns when the next one is due.
async fn ensure_certificates(
    context: &ClusterContext,
    namespace: &str,
    effective: &validate::ValidatedCluster,
    live: &read::LiveChildren,
) -> Result<Option<Duration>, Error> {
    let names = ChildNames::for_cluster(&effective.name);
    let own = effective.server_certificates.as_ref();
    if let Some(own) = own {
        let hosts = super::own_certificate::required_hosts(&names, namespace, effective.replicas);
        let client = &context.base.client;
        let ca_pem = super::own_certificate::check(client, namespace, own, &hosts).await?;
        super::own_certificate::trust_in_issued_secret(client, namespace, &names, live, &ca_pem)
            .await?;
    }
    let metadata = build::kept_metadata(effective, &names, &names.ca_secret);
    let keeping = certificates::Keeping {
        namespace,
        metadata: &metadata,
        ca_secret: &names.ca_secret,
        validity: context.base.settings.postgres_certificate_validity,
    };
    let ensured = certificates::ensure(
        &context.base.client,
        &keeping,
        &certificates::leaves(&names, namespace, own.is_none()),
        live,
    )
    .await?;
    if let (Some(ca_pem), None) = (&ensured.new_ca, own) {
        context.instance_access.seed_ca(namespace, &names, ca_pem);
    }
    Ok(ensured.next_renewal)
}

/// One issue for all refused changes: the first one's reason, every message.
fn refusal_issue(refusals: &[validate::Refusal]) -> Option<Issue> {
    let first = refusals.first()?;
    let message = refusals
        .iter()
        .map(validate::Refusal::message)
        .collect::<Vec<_>>()
        .join("; ");
    Some(Issue {
        reason: first.reason().to_owned(),
        message,
        invalid_spec: false,
    })
}

/// A random control token: 32 bytes in hexadecimal.
fn generate_token() -> String {
    let bytes: [u8; 32] = rand::rng().random();
    hex::encode(bytes)
}

/// A random 32-character alphanumeric password.
fn generate_password() -> String {
    rand::rng()
        .sample_iter(&Alphanumeric)
        .take(32)
        .map(char::from)
        .collect()
}

#[cfg(test)]
mod tests;
