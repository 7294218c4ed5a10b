//! Rollout: the operator, not the StatefulSet controller, replaces the pods of an old pod
//! template (the StatefulSet's update strategy is `OnDelete`), so that the primary is restarted
//! last and only after a switchover:
//! 1. the replicas first, one at a time, the highest ordinal first; the next only once every
//!    instance is ready again and every replica streams (an outdated replica that does not
//!    serve is replaced first: nothing is lost, and its new pod may be its fix);
//! 2. then the primary moves by a switchover to the best updated replica, decided and recorded
//!    by the HA step like any other (`failover::planned`), or by the user when
//!    `primaryUpdateStrategy` is `supervised`;
//! 3. the old primary, a replica by then, is replaced by step 1.
//!
//! A cluster of one instance has no replica to switch over to: its pod is replaced, which
//! restarts its server. The plan ([`next`]) is pure; [`replace`] deletes one pod, by uid, so
//! that a pod made since the plan is never the one deleted. Data volumes stay: a replaced pod
//! mounts the same claim.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use tracing::{Instrument, info_span};

use super::Error;
use super::instances::{ObservedInstance, ReportedRole};
use super::roles;

/// The pod label the StatefulSet controller sets to the revision a pod was made from.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// What the rollout needs of a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LivePod {
    pub uid: Option<String>,
    pub revision: Option<String>,
    /// Being deleted: it is replaced already.
    pub terminating: bool,
    /// Made from a template that mounts the certificates (its TLS annotation).
    pub tls: bool,
    /// Made from a template whose server accepts the applications' client CA.
    pub client_ca: bool,
}

impl LivePod {
    pub fn of(pod: &Pod) -> Self {
        Self {
            uid: pod.metadata.uid.clone(),
            revision: pod.labels().get(REVISION_LABEL).cloned(),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            tls: pod.annotations().contains_key(super::build::TLS_ANNOTATION),
            client_ca: pod
                .annotations()
                .contains_key(super::build::CLIENT_CA_ANNOTATION),
        }
    }
}

/// What the plan reads.
pub struct Input<'a> {
    pub statefulset: &'a str,
    /// The StatefulSet's `status.updateRevision`: the revision of its current template.
    pub update_revision: Option<&'a str>,
    pub pods: &'a BTreeMap<String, LivePod>,
    pub instances: &'a [ObservedInstance],
    pub primary: &'a str,
    /// Instances the StatefulSet has.
    pub replicas: i32,
    /// A switchover or failover is recorded and not done yet.
    pub change_in_progress: bool,
    /// A restore into the cluster runs: its server is not restarted under it.
    pub restoring: bool,
}

/// The next step of the rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to replace now (every pod is up to date, or only the primary is, which moves by
    /// a switchover first).
    Idle,
    /// Delete this pod: the StatefulSet controller makes it again from the current template.
    Replace { pod: String, uid: String },
    /// Pods are outdated, but the cluster is not ready for the next one; why.
    Wait(String),
}

/// The pods made from another template than the StatefulSet's current one, by name (those
/// being deleted too: they are not replaced until their successor runs).
pub fn outdated(update_revision: Option<&str>, pods: &BTreeMap<String, LivePod>) -> Vec<String> {
    let Some(update_revision) = update_revision else {
        return Vec::new();
    };
    pods.iter()
        .filter(|(_, pod)| pod.revision.as_deref() != Some(update_revision))
        .map(|(name, _)| name.clone())
        .collect()
}

/// The next step (pure).
pub fn next(input: &Input<'_>) -> Step {
    let outdated = outdated(input.update_revision, input.pods);
    if outdated.is_empty() {
        return Step::Idle;
    }
    if input.change_in_progress {
        return Step::Wait("a change of primary is under way".to_owned());
    }
    if input.restoring {
        return Step::Wait("a restore is running".to_owned());
    }
    let is_outdated_replica =
        |pod: &str| pod != input.primary && outdated.iter().any(|outdated| outdated == pod);
    let unready = unready(input);
    let candidates: Vec<&String> = if unready.is_empty() {
        outdated
            .iter()
            .filter(|pod| is_outdated_replica(pod))
            .collect()
    } else if unready
        .iter()
        .all(|problem| problem.serves_not && is_outdated_replica(&problem.pod))
    {
        // Outdated replicas that do not serve go first: the cluster loses nothing it has, and
        // their new pods may be what makes them serve again.
        unready.iter().map(|problem| &problem.pod).collect()
    } else {
        return Step::Wait(unready[0].why.clone());
    };
    let ordinal = |pod: &&String| roles::ordinal(input.statefulset, pod).unwrap_or(-1);
    let pod = match candidates.into_iter().max_by_key(ordinal) {
        Some(replica) => replica.clone(),
        // The primary alone is outdated: with replicas, it moves by a switchover first.
        None if input.replicas > 1 => return Step::Idle,
        None => input.primary.to_owned(),
    };
    match input.pods.get(&pod).and_then(|live| live.uid.clone()) {
        Some(uid) => Step::Replace { pod, uid },
        None => Step::Wait(format!("{pod} has no uid yet")),
    }
}

/// An instance the next replacement waits for.
struct Unready {
    pod: String,
    /// Its pod exists and is not going: it does not serve (not ready, or not streaming).
    serves_not: bool,
    why: String,
}

/// The instances that are not ready for the next replacement: a pod missing or going, an
/// instance not ready, a replica that does not stream.
fn unready(input: &Input<'_>) -> Vec<Unready> {
    let mut unready = Vec::new();
    for ordinal in 0..input.replicas {
        let pod = roles::pod_name(input.statefulset, ordinal);
        let problem = |serves_not: bool, why: String| Unready {
            pod: pod.clone(),
            serves_not,
            why,
        };
        match input.pods.get(&pod) {
            None => unready.push(problem(false, format!("{pod} does not exist yet"))),
            Some(live) if live.terminating => {
                unready.push(problem(false, format!("{pod} is being replaced")));
            }
            Some(_) if !serves(input, &pod) => unready.push(problem(
                true,
                format!("{pod} is not a ready primary or streaming replica yet"),
            )),
            Some(_) => {}
        }
    }
    unready
}

/// Whether `pod` reports a ready primary (the designated one) or a ready, streaming replica.
fn serves(input: &Input<'_>, pod: &str) -> bool {
    let report = input
        .instances
        .iter()
        .find(|instance| instance.pod == pod)
        .and_then(ObservedInstance::reported);
    report.is_some_and(|report| match report.role {
        ReportedRole::Primary => report.ready && pod == input.primary,
        ReportedRole::Replica => report.ready && report.streaming,
        ReportedRole::Starting => false,
    })
}

/// Takes the rollout's next step for the cluster whose children are `live`: deletes one
/// outdated pod, or says why none is deleted now while some are outdated. `move_waiting` is why
/// the HA step did not move an outdated primary, if it did not.
pub(super) async fn step(
    client: &Client,
    namespace: &str,
    input: &Input<'_>,
    move_waiting: Option<&str>,
) -> Result<Option<String>, Error> {
    match next(input) {
        // A span only when a pod is replaced: most reconciles have nothing to roll.
        Step::Replace { pod, uid } => {
            replace(client, namespace, &pod, &uid)
                .instrument(info_span!("rollout", pod = %pod))
                .await?;
            Ok(Some(format!("replacing {pod}")))
        }
        Step::Wait(why) => Ok(Some(why)),
        Step::Idle => {
            let primary_outdated = outdated(input.update_revision, input.pods)
                .iter()
                .any(|pod| pod == input.primary);
            Ok(primary_outdated.then(|| match move_waiting {
                Some(why) => why.to_owned(),
                None => format!("{} is replaced last, after a switchover", input.primary),
            }))
        }
    }
}

/// Deletes `pod` if it is still the one with `uid`.
pub async fn replace(client: &Client, namespace: &str, pod: &str, uid: &str) -> Result<(), Error> {
    tracing::info!(pod, uid, "replacing a pod of an old template");
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match pods.delete(pod, &params).await {
        Ok(_) => Ok(()),
        // Gone or replaced since the plan: the next reconcile sees what is there.
        Err(kube::Error::Api(response)) if response.code == 404 || response.code == 409 => Ok(()),
        Err(source) => Err(Error::Kube {
            action: "delete",
            kind: "Pod".to_owned(),
            name: pod.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests;
