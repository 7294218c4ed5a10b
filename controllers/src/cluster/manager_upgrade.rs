//! In-place upgrades of the instance managers: a new pgkube restarts no PostgreSQL (issue 44).
//!
//! Every instance manager reports the SHA-256 of its binary (`managerDigest`). The operator
//! knows its own binary ([`OwnBinary`], the `pgkube` it runs: the instance manager is the same
//! program). An instance that runs another one is sent this one (`POST /control/upgrade`,
//! [`HttpInstanceStatus`](super::instances::HttpInstanceStatus)); it execs it in its own
//! process, and its postmaster, a child of that process, goes on running.
//!
//! One instance per reconcile, the replicas first, and only while nothing else goes on: no
//! change of primary, no restore, no pod being replaced, every instance ready. An instance
//! manager of an older pgkube, which reports no digest, is left alone until its pod is
//! replaced.
//!
//! The pod template does not change when only the pgkube image does
//! ([`install_image`]): the template keeps the image its pods were made with until something
//! else in it changes, so that an operator upgrade rolls no pod.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::BytesMut;
use http_body_util::{BodyExt, StreamBody};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt as _;
use tracing::Instrument as _;

use kube::ResourceExt as _;
use pgkube_crds::PostgreSQLCluster;

use k8s_openapi::api::apps::v1::StatefulSet;

use super::build::{self, BuildInput, ChildNames};
use super::context::ClusterContext;
use super::instances::transport::Scheme;
use super::instances::{FetchError, ObservedInstance, ReportedRole};
use super::report::publish_event;
use super::validate::ValidatedCluster;
use super::{Error, apply, failover, ha, read, rollout};

/// The header with the SHA-256 of the binary sent (the instance manager checks it).
pub const DIGEST_HEADER: &str = "pgkube-binary-sha256";
/// How long an upload and the instance manager's checks may take.
pub const UPLOAD_TIMEOUT: Duration = Duration::from_secs(120);
/// The chunks the binary is read and sent in.
const CHUNK_BYTES: usize = 256 * 1024;

/// The binary the instance managers should run: the operator's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnBinary {
    pub path: PathBuf,
    /// Its SHA-256, hex.
    pub digest: String,
}

impl OwnBinary {
    /// Reads and hashes `path`.
    pub fn read(path: &Path) -> std::io::Result<Self> {
        let mut file = std::fs::File::open(path)?;
        let mut hasher = Sha256::new();
        std::io::copy(&mut file, &mut hasher)?;
        Ok(Self {
            path: path.to_owned(),
            digest: hex::encode(hasher.finalize()),
        })
    }
}

/// The instance whose manager is replaced next (pure): a ready one that reports a binary other
/// than `own_digest`, a replica before the primary.
pub fn next<'a>(own_digest: &str, instances: &'a [ObservedInstance]) -> Option<&'a str> {
    let outdated = instances.iter().filter_map(|instance| {
        let report = instance.reported()?;
        let digest = report.manager_digest.as_deref()?;
        (digest != own_digest && report.ready && report.role != ReportedRole::Starting)
            .then_some((report.role == ReportedRole::Primary, instance.pod.as_str()))
    });
    outdated.min().map(|(_, pod)| pod)
}

/// Whether every instance answers ready: an upgrade waits for a quiet cluster (pure).
pub fn all_ready(instances: &[ObservedInstance]) -> bool {
    !instances.is_empty()
        && instances
            .iter()
            .all(|i| i.reported().is_some_and(|report| report.ready))
}

/// The image the instance manager's init container gets (pure): `current` (the operator's)
/// unless the live StatefulSet's pods were made with another one and the StatefulSet built
/// with that one is what was applied last (`same_as_applied`): then only the pgkube image
/// changed, which the in-place upgrade takes care of without a roll.
pub fn install_image<'a>(
    current: &'a str,
    live_image: Option<&'a str>,
    same_as_applied: impl FnOnce(&str) -> bool,
) -> &'a str {
    match live_image {
        Some(live) if live != current && same_as_applied(live) => live,
        _ => current,
    }
}

/// Replaces the manager of one instance that runs another binary than the operator's, while
/// the cluster is quiet (`in_place_fenced`: an in-place recovery holds the instances).
pub(super) async fn step(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    names: &ChildNames,
    live: &read::LiveChildren,
    carried: &ha::Carried,
    in_place_fenced: bool,
) -> Result<(), Error> {
    let Some(own) = context.base.settings.instance_manager_binary.as_deref() else {
        return Ok(());
    };
    let status = cluster.status.as_ref();
    let quiet = !carried.urgent
        && carried.waiting.is_none()
        && !in_place_fenced
        && !failover::change_in_progress(status)
        && !ha::is_restoring(status)
        && rollout::outdated(ha::update_revision(live), &live.pods).is_empty()
        && all_ready(&live.instances);
    let Some(pod) = quiet.then(|| next(&own.digest, &live.instances)).flatten() else {
        return Ok(());
    };
    let Some(address) = live.instance_address(pod) else {
        return Ok(());
    };
    let namespace = cluster.namespace().ok_or(Error::MissingNamespace)?;
    let token = ha::control_token(context, &namespace, names).await?;
    let source = context.base.settings.instance_status.as_ref();
    // A span of its own only when there is something to send: a settled reconcile's trace
    // keeps its steps.
    let span = tracing::info_span!("manager_upgrade", %pod);
    match source.upgrade(&address, &token, own).instrument(span).await {
        Ok(()) => {
            tracing::info!(%pod, digest = %own.digest, "instance manager replaced in place");
            let note = format!(
                "{pod}: the instance manager now runs the operator's binary (SHA-256 {}); PostgreSQL kept running",
                short(&own.digest)
            );
            publish_event(context, cluster, false, "InstanceManagerUpgraded", note).await;
        }
        Err(error) => {
            tracing::warn!(%pod, %error, "instance manager not replaced; tried again later");
            let note =
                format!("{pod}: the instance manager could not be replaced in place: {error}");
            publish_event(context, cluster, true, "InstanceManagerUpgradeFailed", note).await;
        }
    }
    Ok(())
}

/// The first 12 characters of a digest, enough to tell binaries apart in a message.
fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

/// The image the StatefulSet's instance manager installer gets for `effective`: see
/// [`install_image`]. Builds the children a second time only while the images differ.
pub(super) fn installer_image(
    effective: &ValidatedCluster,
    input: &BuildInput<'_>,
    live: Option<&StatefulSet>,
) -> String {
    let live_image = live.and_then(installer_image_of);
    install_image(
        input.instance_manager_image,
        live_image.as_deref(),
        |image| {
            let with_live_image = BuildInput {
                instance_manager_image: image,
                ..*input
            };
            let desired = build::build(effective, &with_live_image).statefulset;
            live.is_some_and(|live| apply::applied_last(&desired, live))
        },
    )
    .to_owned()
}

/// The installer's image in a StatefulSet, whole or as the caches keep it (its pod spec as
/// text, [`cache::COMPACT_POD_SPEC_ANNOTATION`](super::cache::COMPACT_POD_SPEC_ANNOTATION)).
fn installer_image_of(sts: &StatefulSet) -> Option<String> {
    let image_in = |init_containers: &[k8s_openapi::api::core::v1::Container]| {
        init_containers
            .iter()
            .find(|c| c.name == build::INSTALL_CONTAINER)
            .and_then(|c| c.image.clone())
    };
    if let Some(pod) = sts.spec.as_ref().and_then(|s| s.template.spec.as_ref()) {
        return image_in(pod.init_containers.as_deref().unwrap_or_default());
    }
    let text = sts
        .annotations()
        .get(super::cache::COMPACT_POD_SPEC_ANNOTATION)?;
    let pod: k8s_openapi::api::core::v1::PodSpec = serde_json::from_str(text).ok()?;
    image_in(pod.init_containers.as_deref().unwrap_or_default())
}

/// The body of an upload: the binary, read in chunks as it is sent.
pub type UploadBody = http_body_util::combinators::BoxBody<bytes::Bytes, std::io::Error>;

/// The request that sends `binary` to an instance manager with the bearer `token`, built for
/// the host it is sent to; any 2xx answer is success (202: it execs it now; 200: it runs it
/// already).
pub fn upload_request<'a>(
    binary: &'a OwnBinary,
    token: &'a str,
) -> Result<impl Fn(Scheme, &str) -> Result<http::Request<UploadBody>, FetchError> + 'a, FetchError>
{
    let unreadable = |error: std::io::Error| {
        FetchError::Unreachable(format!("cannot read {}: {error}", binary.path.display()))
    };
    let length = std::fs::metadata(&binary.path).map_err(unreadable)?.len();
    Ok(move |_, host: &str| {
        let file = std::fs::File::open(&binary.path).map_err(unreadable)?;
        let chunks =
            futures::stream::try_unfold(tokio::fs::File::from_std(file), |mut file| async move {
                let mut chunk = BytesMut::with_capacity(CHUNK_BYTES);
                let read = file.read_buf(&mut chunk).await?;
                Ok::<_, std::io::Error>(
                    (read > 0).then(|| (http_body::Frame::data(chunk.freeze()), file)),
                )
            });
        http::Request::post("/control/upgrade")
            .header(http::header::HOST, host)
            .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
            .header(http::header::CONTENT_TYPE, "application/octet-stream")
            .header(http::header::CONTENT_LENGTH, length)
            .header(DIGEST_HEADER, &binary.digest)
            .body(StreamBody::new(chunks).boxed())
            .map_err(|error| FetchError::BadAnswer(format!("request to {host}: {error}")))
    })
}

#[cfg(test)]
mod tests;
