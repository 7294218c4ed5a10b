//! In-place point-in-time recovery, on the cluster's side: a PostgreSQLRestore with
//! `method: PointInTime` that the restore controller marked Running (so failovers and
//! scheduled backups wait, see `restores`) is carried out here.
//!
//! Each reconcile finds the step from what the instances report ([`step`], pure) and tells them
//! what to do through `instance.json` ([`InPlaceOrder`]), with the [`RecoveryOrder`] the primary
//! recovers (read once per restore, [`recovery::resolve_in_place`](super::recovery)):
//! 1. **Recovering**: the primary stops, recovers to the target (its old data renamed aside),
//!    and promotes; the replicas stop and wait. `-rw` routes nowhere meanwhile.
//! 2. **Recloning**: the replicas replace their data with a clone of the recovered primary.
//! 3. **Completed** once every instance reports it is done; **Failed** when the primary
//!    reports its recovery failed (it runs on its old data again) or the order is refused (a
//!    target outside the window). The step goes into `status.inPlaceRecovery`, from which the
//!    restore controller ends the restore.

use kube::ResourceExt;
use pgkube_crds::{
    InPlaceRecovery, InPlaceStep, PostgreSQLCluster, PostgreSQLRestore, RestoreMethod, RestorePhase,
};

use super::Error;
use super::context::ClusterContext;
use super::instances::ObservedInstance;
use super::recovery::{self, Resolution};
use crate::storage::recovery::in_place::{InPlaceOrder, InPlaceReport, InPlaceStage, InPlaceState};
use crate::storage::recovery::{RecoveryOrder, describe};

/// An in-place recovery under way, for this reconcile.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct InPlace {
    pub status: InPlaceRecovery,
    /// What the primary recovers, while the instances have something to do.
    pub order: Option<RecoveryOrder>,
    pub stage: Option<InPlaceOrder>,
}

/// The Running PointInTime restore into `cluster`, if any.
pub(super) fn running_restore<'a>(
    restores: &[&'a PostgreSQLRestore],
) -> Option<&'a PostgreSQLRestore> {
    restores.iter().copied().find(|restore| {
        restore.spec.method == RestoreMethod::PointInTime
            && restore.metadata.deletion_timestamp.is_none()
            && restore.status.as_ref().and_then(|s| s.phase) == Some(RestorePhase::Running)
    })
}

/// Whether the cluster is fenced for an in-place recovery, from its recorded status and its
/// restores: known before anything else in the reconcile (the role labels come first).
pub(super) fn fenced(cluster: &PostgreSQLCluster, restores: &[&PostgreSQLRestore]) -> bool {
    let Some(restore) = running_restore(restores) else {
        return false;
    };
    let recorded = cluster
        .status
        .as_ref()
        .and_then(|s| s.in_place_recovery.as_ref());
    match recorded {
        Some(recorded) if Some(recorded.uid.as_str()) == restore.uid().as_deref() => {
            recorded.step == InPlaceStep::Recovering
        }
        // Not recorded yet: the first reconcile of the restore fences already.
        _ => true,
    }
}

/// The in-place recovery of `cluster` now: its step and what the instances are told.
pub(super) async fn plan(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    restores: &[&PostgreSQLRestore],
    instances: &[ObservedInstance],
    primary: &str,
) -> Result<Option<InPlace>, Error> {
    let Some(restore) = running_restore(restores) else {
        return Ok(None);
    };
    let uid = restore.uid().unwrap_or_default();
    let recorded = cluster
        .status
        .as_ref()
        .and_then(|s| s.in_place_recovery.as_ref())
        .filter(|recorded| recorded.uid == uid);
    let order = match recovery::resolve_in_place(context, cluster, restore).await? {
        Resolution::Order(order) => *order,
        Resolution::Refused(why) => {
            let status = record(restore, InPlaceStep::Failed, Some(why), None);
            return Ok(Some(InPlace {
                status,
                order: None,
                stage: None,
            }));
        }
        Resolution::NotAsked => return Ok(None),
    };
    let mut found = step(&uid, recorded, primary, instances);
    if found.step == InPlaceStep::Completed && recorded.is_none_or(|r| r.step != found.step) {
        found.message = Some(format!(
            "recovered to {} from {}; every instance runs the recovered database",
            describe(&order.target),
            order.backup
        ));
    }
    let stage = match found.step {
        InPlaceStep::Recovering => Some(InPlaceStage::Recover),
        InPlaceStep::Recloning => Some(InPlaceStage::Reclone),
        InPlaceStep::Completed | InPlaceStep::Failed => None,
    };
    Ok(Some(InPlace {
        status: record(restore, found.step, found.message, found.previous_data),
        order: stage.map(|_| order),
        stage: stage.map(|stage| InPlaceOrder {
            id: uid.clone(),
            stage,
        }),
    }))
}

fn record(
    restore: &PostgreSQLRestore,
    step: InPlaceStep,
    message: Option<String>,
    previous_data: Option<String>,
) -> InPlaceRecovery {
    InPlaceRecovery {
        restore: restore.name_any(),
        uid: restore.uid().unwrap_or_default(),
        step,
        message,
        previous_data,
    }
}

/// A step and what the status says of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Found {
    pub step: InPlaceStep,
    pub message: Option<String>,
    pub previous_data: Option<String>,
}

/// The step of the recovery `uid` from the instances' reports (pure). It never goes back: a
/// primary that does not answer for a while leaves the recorded step as it is.
pub(super) fn step(
    uid: &str,
    recorded: Option<&InPlaceRecovery>,
    primary: &str,
    instances: &[ObservedInstance],
) -> Found {
    let keep = |recorded: &InPlaceRecovery| Found {
        step: recorded.step,
        message: recorded.message.clone(),
        previous_data: recorded.previous_data.clone(),
    };
    if let Some(recorded) =
        recorded.filter(|r| matches!(r.step, InPlaceStep::Completed | InPlaceStep::Failed))
    {
        return keep(recorded);
    }
    let part = |instance: &ObservedInstance| -> Option<InPlaceReport> {
        instance
            .reported()?
            .in_place
            .clone()
            .filter(|report| report.id == uid)
    };
    let Some(primary_instance) = instances.iter().find(|i| i.pod == primary) else {
        return recorded.map_or_else(
            || recovering("the primary's pod is not there yet".to_owned()),
            keep,
        );
    };
    match part(primary_instance).map(|report| (report.state, report.message)) {
        Some((InPlaceState::Failed, message)) => Found {
            step: InPlaceStep::Failed,
            message: Some(format!(
                "the recovery failed; the primary runs on its old data again: {}",
                message.unwrap_or_default()
            )),
            previous_data: None,
        },
        Some((InPlaceState::Recovered, previous_data)) => {
            recloning(instances, primary_instance, uid, previous_data)
        }
        _ if recorded.is_some_and(|r| r.step == InPlaceStep::Recloning) => {
            recorded.map_or_else(|| recovering(String::new()), keep)
        }
        _ => recovering(primary_message(primary_instance)),
    }
}

fn recovering(message: String) -> Found {
    Found {
        step: InPlaceStep::Recovering,
        message: Some(message),
        previous_data: None,
    }
}

fn primary_message(primary: &ObservedInstance) -> String {
    match primary.reported() {
        Some(report) => report
            .message
            .clone()
            .unwrap_or_else(|| "the primary stops for the recovery".to_owned()),
        None => format!(
            "the primary does not report: {}",
            primary
                .report
                .as_ref()
                .err()
                .map(ToString::to_string)
                .unwrap_or_default()
        ),
    }
}

/// The primary recovered: Completed once every replica cloned it again and every instance is
/// ready.
fn recloning(
    instances: &[ObservedInstance],
    primary: &ObservedInstance,
    uid: &str,
    previous_data: Option<String>,
) -> Found {
    let replicas: Vec<&ObservedInstance> =
        instances.iter().filter(|i| i.pod != primary.pod).collect();
    let done = replicas
        .iter()
        .filter(|replica| {
            replica.reported().is_some_and(|report| {
                report.ready
                    && report
                        .in_place
                        .as_ref()
                        .is_some_and(|part| part.id == uid && part.state == InPlaceState::Recloned)
            })
        })
        .count();
    let primary_ready = primary.is_ready_primary();
    if done == replicas.len() && primary_ready {
        return Found {
            step: InPlaceStep::Completed,
            message: Some("the cluster runs the recovered database".to_owned()),
            previous_data,
        };
    }
    Found {
        step: InPlaceStep::Recloning,
        message: Some(format!(
            "the primary recovered and promoted; {done} of {} replicas cloned it again",
            replicas.len()
        )),
        previous_data,
    }
}

#[cfg(test)]
mod tests;
