//! The API calls both controllers make about their Jobs: create one (or take over the one a
//! previous reconcile created), read where one stands, watch them, and delete one.

use std::fmt::Debug;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, LogParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::follow::{self, JobState};
use super::progress::{AgentProgress, progress_due};
use pgkube_crds::TransferProgress;

/// Why a Job could not be created or read.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("cannot {action} Job {name}: {source}")]
    Kube {
        action: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("Job {0} exists and does not belong to this object; delete or rename it")]
    NotOurs(String),
}

fn kube_error(action: &'static str, name: &str) -> impl FnOnce(kube::Error) -> JobError {
    let name = name.to_owned();
    move |source| JobError::Kube {
        action,
        name,
        source,
    }
}

/// Adds to `controller` a watch of the Jobs that `selector` picks in each of `namespaces`
/// (`[None]`: all namespaces): a Job's change reconciles the object that owns it. Only their
/// metadata is watched, enough to find the owner; [`state`] reads a Job itself.
pub fn own_jobs<K>(
    mut controller: Controller<K>,
    client: &Client,
    namespaces: &[Option<String>],
    selector: &str,
) -> Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    for namespace in namespaces {
        let jobs = crate::api::<PartialObjectMeta<Job>>(client, namespace.as_deref());
        let changes = watcher::watcher(jobs, watcher::Config::default().labels(selector))
            .default_backoff()
            .touched_objects()
            .boxed();
        controller = controller.owns_stream(changes);
    }
    controller
}

/// Creates `desired`; a Job of that name that exists already is accepted only when the object
/// of `owner_uid` controls it (a restart between the create and the status write).
pub async fn create(
    client: &Client,
    namespace: &str,
    desired: &Job,
    owner_uid: Option<&str>,
) -> Result<(), JobError> {
    let name = desired.name_any();
    let jobs = Api::<Job>::namespaced(client.clone(), namespace);
    match jobs.create(&PostParams::default(), desired).await {
        Ok(_) => {
            tracing::info!(job = %name, "Job created");
            Ok(())
        }
        Err(kube::Error::Api(response)) if response.code == 409 => {
            let existing = jobs.get(&name).await.map_err(kube_error("read", &name))?;
            let ours = existing.owner_references().iter().any(|owner| {
                owner.controller == Some(true) && Some(owner.uid.as_str()) == owner_uid
            });
            if ours {
                tracing::info!(job = %name, "Job already exists");
                Ok(())
            } else {
                Err(JobError::NotOurs(name))
            }
        }
        Err(source) => Err(kube_error("create", &name)(source)),
    }
}

/// Deletes Job `name` and, in the background, its pods; one already gone is fine.
pub async fn delete(client: &Client, namespace: &str, name: &str) -> Result<(), JobError> {
    tracing::info!(job = %name, "deleting the Job");
    let deleted = Api::<Job>::namespaced(client.clone(), namespace)
        .delete(name, &DeleteParams::background())
        .await;
    match deleted {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(response)) if response.code == 404 => Ok(()),
        Err(source) => Err(kube_error("delete", name)(source)),
    }
}

/// Where Job `name` stands; `None` when it does not exist. A GET, not a cache: a Job missing
/// from a cache that lags would fail the backup or restore. Its pods are listed for their
/// termination messages once it has ended, and for whether the agent started while it has no
/// ready pod; a pod that has waited 30 s with nothing to say has its Events read too, where a
/// kubelet puts a volume it cannot mount (a missing Secret).
pub async fn state(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<JobState>, JobError> {
    let found = Api::<Job>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(kube_error("read", name))?;
    let Some(job) = found else {
        return Ok(None);
    };
    let ready = job.status.as_ref().and_then(|s| s.ready).unwrap_or(0);
    if !follow::has_ended(&job) && ready > 0 {
        return Ok(Some(JobState::Running));
    }
    let selector = format!("batch.kubernetes.io/job-name={name}");
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(kube_error("list the pods of", name))?;
    match follow::job_state(&job, &pods.items) {
        JobState::Starting { why, created } if why.may_hide_a_mount_failure(Timestamp::now()) => {
            let events = pod_events(client, namespace, why.pod.as_deref(), name).await?;
            let why = why.or_mount_failure(&events);
            Ok(Some(JobState::Starting { why, created }))
        }
        state => Ok(Some(state)),
    }
}

/// The core Events about pod `pod` (where the kubelet reports on its volumes).
async fn pod_events(
    client: &Client,
    namespace: &str,
    pod: Option<&str>,
    job: &str,
) -> Result<Vec<Event>, JobError> {
    let Some(pod) = pod else {
        return Ok(Vec::new());
    };
    let fields = format!("involvedObject.kind=Pod,involvedObject.name={pod}");
    Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().fields(&fields))
        .await
        .map(|list| list.items)
        .map_err(kube_error("list the pod Events of", job))
}

/// How much of a running agent's log is read for its last progress line: it prints one every
/// few seconds, among few other lines.
const PROGRESS_LOG_LINES: i64 = 200;
const PROGRESS_LOG_BYTES: i64 = 256 * 1024;

/// The last progress the agent of running Job `job` printed (container `container` of its
/// pod), if any. Best effort: a pod or log that cannot be read gives none, with a debug log,
/// and never fails the reconcile.
pub async fn running_progress(
    client: &Client,
    namespace: &str,
    job: &str,
    container: &str,
) -> Option<AgentProgress> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    let selector = format!("batch.kubernetes.io/job-name={job}");
    let listed = pods.list(&ListParams::default().labels(&selector)).await;
    let running = match listed {
        Ok(list) => list
            .items
            .into_iter()
            .find(|pod| pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))?,
        Err(error) => {
            tracing::debug!(%job, %error, "cannot list the Job's pods for its progress");
            return None;
        }
    };
    let params = LogParams {
        container: Some(container.to_owned()),
        tail_lines: Some(PROGRESS_LOG_LINES),
        limit_bytes: Some(PROGRESS_LOG_BYTES),
        ..LogParams::default()
    };
    match pods.logs(&running.name_any(), &params).await {
        Ok(log) => AgentProgress::last_in_log(&log),
        Err(error) => {
            tracing::debug!(%job, %error, "cannot read the agent's log for its progress");
            None
        }
    }
}

/// The progress to write into the status of the object whose running Job is `job`: the agent's
/// last one, read only when `previous` is old enough to be replaced (see [`progress_due`]).
pub async fn progress_to_write(
    client: &Client,
    namespace: &str,
    job: &str,
    container: &str,
    previous: Option<&TransferProgress>,
) -> Option<TransferProgress> {
    if !progress_due(previous, Timestamp::now()) {
        return None;
    }
    let progress = running_progress(client, namespace, job, container).await?;
    Some(progress.to_status(Timestamp::now()))
}
