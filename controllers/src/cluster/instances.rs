//! Instances: what each PostgreSQL pod's instance manager (`pgkube instance run`, PID 1 of the
//! container) reports about its server, read during the `read` step.
//!
//! Every pod with an address is asked `GET /status` on port 8000 of its IP at once (over TLS
//! with the cluster's token, see [`access`] and [`transport`]), each with a
//! short timeout ([`STATUS_TIMEOUT`]), so a reconcile waits at most that long for them. The
//! answer is an [`InstanceReport`]. A pod that cannot be asked, or does not answer as expected,
//! is [`Unavailable`] for a reason from a short fixed list: the raw error only goes to the debug
//! log, so that an instance that keeps failing the same way keeps the same status (an idle
//! cluster writes nothing).
//!
//! An instance manager serves its report with its age (`ageSeconds`, computed when it serves
//! it). A report older than [`STALE_AFTER`] is [`Unavailable::Stale`]: the manager refreshes it
//! every watch period, so an old one means that its supervisor hangs, and what it says (a ready
//! primary, say) may no longer be true. A report without an age (an instance manager of an older
//! pgkube, until its pod restarts) is taken as current.
//!
//! How the controller reaches instance managers is an [`InstanceStatusSource`] in the
//! [`Settings`](crate::Settings): [`HttpInstanceStatus`] by default; tests substitute one for pods
//! that never run (simulated nodes).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde::{Deserialize, Deserializer};

/// Port of the instance manager's status endpoint (`PGKUBE_STATUS_PORT` in the pod).
pub const STATUS_PORT: u16 = 8000;
/// Port of the instance manager's PostgreSQL metrics (`/metrics`, for Prometheus).
pub const METRICS_PORT: u16 = 9187;
/// How long one instance may take to answer, connection included.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// The oldest report believed: a few of the instance manager's watch periods (2 s), above its
/// longest tick (9 s). Its `/readyz` fails beyond the same age.
pub const STALE_AFTER: Duration = Duration::from_secs(10);

/// A WAL position, PostgreSQL's `X/Y` in hexadecimal, as `(X << 32) | Y`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lsn(pub u64);

impl Lsn {
    /// Bytes from `earlier` to `self`, 0 when `earlier` is ahead.
    pub fn bytes_after(self, earlier: Lsn) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl FromStr for Lsn {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parse = |part: &str| {
            (!part.is_empty() && part.len() <= 8)
                .then(|| u32::from_str_radix(part, 16).ok())
                .flatten()
        };
        let (high, low) = text
            .split_once('/')
            .and_then(|(high, low)| Some((parse(high)?, parse(low)?)))
            .ok_or_else(|| format!("{text:?} is not an LSN (X/Y in hexadecimal)"))?;
        Ok(Lsn((u64::from(high) << 32) | u64::from(low)))
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

fn optional_lsn<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Lsn>, D::Error> {
    Option::<String>::deserialize(deserializer)?
        .map(|text| text.parse().map_err(serde::de::Error::custom))
        .transpose()
}

/// The role an instance manager reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportedRole {
    Primary,
    Replica,
    /// Not answering yet (initdb, clone, start, crash recovery) or stopping; also any role this
    /// controller does not know.
    #[serde(other)]
    Starting,
}

/// The body of an instance manager's `GET /status`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceReport {
    /// The pod the instance manager runs in.
    pub pod: String,
    pub role: ReportedRole,
    pub ready: bool,
    #[serde(default)]
    pub timeline: Option<i64>,
    /// The primary's current write position.
    #[serde(default, deserialize_with = "optional_lsn")]
    pub current_lsn: Option<Lsn>,
    /// A replica's last WAL position received from the primary.
    #[serde(default, deserialize_with = "optional_lsn")]
    pub received_lsn: Option<Lsn>,
    /// A replica's last WAL position replayed.
    #[serde(default, deserialize_with = "optional_lsn")]
    pub replayed_lsn: Option<Lsn>,
    /// A replica's WAL receiver is streaming from the primary.
    #[serde(default)]
    pub streaming: bool,
    /// Settings changed in the configuration that take effect only after a restart.
    #[serde(default)]
    pub pending_restart: Vec<String>,
    /// A replica: the pod of the primary it streams from (or tries to). Older instance
    /// managers do not say.
    #[serde(default)]
    pub following: Option<String>,
    /// The system identifier of the database the server runs.
    #[serde(default)]
    pub system_identifier: Option<String>,
    /// The uid of the PostgreSQLCluster whose instance made the database with initdb; none
    /// for data made otherwise.
    #[serde(default)]
    pub initialized_by: Option<String>,
    /// Why an instance whose server does not run waits.
    #[serde(default)]
    pub message: Option<String>,
    /// A primary whose `pending_restart` settings need a restart, which it leaves to a
    /// switchover (`failover::planned`). Older instance managers restart in place and do not say.
    #[serde(default)]
    pub restart_by_switchover: bool,
    /// A digest of the operator's `postgresql.conf` the server has read, when it runs it as
    /// asked: instances with the same one and nothing pending run the same settings.
    #[serde(default)]
    pub settings_digest: Option<String>,
    /// What the WAL archiver did, on an instance told to archive (the primary).
    #[serde(default)]
    pub wal_archive: Option<super::status::archiving::WalArchiveReport>,
    /// The instance's part in the last in-place point-in-time recovery.
    #[serde(default)]
    pub in_place: Option<crate::storage::recovery::in_place::InPlaceReport>,
    /// The SHA-256 of the instance manager's binary ([`super::manager_upgrade`]); older
    /// instance managers do not say.
    #[serde(default)]
    pub manager_digest: Option<String>,
    /// The CAs of the pod's mounted certificates; older instance managers do not say.
    #[serde(default)]
    pub certificate_authorities: Option<CaReport>,
}

/// The CAs of a pod's certificates, each the SHA-256 (hex) of its DER form.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CaReport {
    /// What signed its server certificate (its `ca.crt`).
    #[serde(default)]
    pub server_cas: Vec<String>,
    /// What it verifies the servers it connects to with.
    #[serde(default)]
    pub trusted_cas: Vec<String>,
}

impl InstanceReport {
    /// Whether this instance verifies `server`'s certificate: it trusts one of the CAs that
    /// signed it. Assumed when either does not say (an older instance manager).
    pub fn trusts_server_of(&self, server: &InstanceReport) -> bool {
        match (
            &self.certificate_authorities,
            &server.certificate_authorities,
        ) {
            (Some(own), Some(theirs)) => {
                theirs.server_cas.is_empty()
                    || theirs
                        .server_cas
                        .iter()
                        .any(|ca| own.trusted_cas.contains(ca))
            }
            _ => true,
        }
    }
}

/// Why an instance has no report. Each reason has one fixed description, stable from one
/// reconcile to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// The pod has no IP address yet (not scheduled, or its sandbox is not up).
    NoAddress,
    /// No answer within [`STATUS_TIMEOUT`], or the connection failed.
    Unreachable,
    /// An answer that is not a `/status` of this pod: another HTTP status, a body that is not
    /// the expected JSON, or the report of another pod (an address reused).
    BadAnswer,
    /// A report older than [`STALE_AFTER`]: the instance manager's supervisor hangs.
    Stale,
    /// The instance manager refused the operator's token, or its certificate did not verify
    /// against the cluster's CA.
    Refused,
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NoAddress => "no pod address yet",
            Self::Unreachable => "instance manager unreachable",
            Self::BadAnswer => "unexpected answer from the instance manager",
            Self::Stale => "the instance manager's status is stale",
            Self::Refused => "the instance manager and the operator do not trust each other",
        })
    }
}

/// Where to ask an instance manager.
#[derive(Clone, Debug)]
pub struct InstanceAddress {
    pub pod: String,
    pub ip: IpAddr,
    /// The pod's uid, if known: a pod that spoke TLS is never asked in plain HTTP again.
    pub uid: Option<String>,
    /// How to reach it over TLS; none for a cluster without certificates.
    pub access: Option<Arc<ClusterAccess>>,
}

/// How the controller reaches instance managers.
pub trait InstanceStatusSource: fmt::Debug + Send + Sync {
    /// The report of the instance manager of `address.pod`. Errors are reported as
    /// [`Unavailable::Unreachable`], [`Unavailable::BadAnswer`] or [`Unavailable::Stale`]; the
    /// detail goes to the log.
    fn fetch<'a>(
        &'a self,
        address: &'a InstanceAddress,
    ) -> BoxFuture<'a, Result<InstanceReport, FetchError>>;

    /// Sends `binary` to `address.pod`'s instance manager, which execs it in place
    /// ([`super::manager_upgrade`]). Sources for pods that never run send none.
    fn upgrade<'a>(
        &'a self,
        address: &'a InstanceAddress,
        token: &'a str,
        binary: &'a super::manager_upgrade::OwnBinary,
    ) -> BoxFuture<'a, Result<(), FetchError>> {
        let _ = (address, token, binary);
        Box::pin(async {
            Err(FetchError::Unreachable(
                "no instance manager runs".to_owned(),
            ))
        })
    }

    /// Sends `command` to the control endpoint of `address.pod`'s instance manager, with the
    /// cluster's control `token`. Sources for pods that never run send none.
    fn command<'a>(
        &'a self,
        address: &'a InstanceAddress,
        token: &'a str,
        command: &'a ControlCommand,
    ) -> BoxFuture<'a, Result<(), FetchError>> {
        let _ = (token, command);
        Box::pin(async move {
            Err(FetchError::Unreachable(format!(
                "{} takes no commands from this status source",
                address.pod
            )))
        })
    }
}

/// The header that carries a command's term (the term of the switchover or failover it
/// carries out): an instance manager refuses a term older than one it has seen. A header, so
/// that an instance manager that does not know it ignores it.
pub const TERM_HEADER: &str = "pgkube-term";

/// A command to an instance manager's control endpoint, as it is sent, with its term.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlCommand {
    /// `POST /control/promote`: a replica becomes the primary.
    Promote { term: i64 },
    /// `POST /control/follow`: become a standby of `primary`, reached at `primary_host`.
    Follow {
        primary: String,
        primary_host: String,
        term: i64,
    },
}

impl ControlCommand {
    fn path(&self) -> &'static str {
        match self {
            Self::Promote { .. } => "/control/promote",
            Self::Follow { .. } => "/control/follow",
        }
    }

    fn body(&self) -> serde_json::Value {
        match self {
            Self::Promote { .. } => serde_json::json!({}),
            Self::Follow {
                primary,
                primary_host,
                ..
            } => serde_json::json!({"primary": primary, "primaryHost": primary_host}),
        }
    }

    fn term(&self) -> i64 {
        match self {
            Self::Promote { term } | Self::Follow { term, .. } => *term,
        }
    }
}

/// Why a fetch failed, with the detail for the log.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("unreachable: {0}")]
    Unreachable(String),
    #[error("bad answer: {0}")]
    BadAnswer(String),
    #[error("stale: {0}")]
    Stale(String),
    #[error("refused: {0}")]
    Refused(String),
}

impl FetchError {
    fn unavailable(&self) -> Unavailable {
        match self {
            Self::Unreachable(_) => Unavailable::Unreachable,
            Self::BadAnswer(_) => Unavailable::BadAnswer,
            Self::Stale(_) => Unavailable::Stale,
            Self::Refused(_) => Unavailable::Refused,
        }
    }
}

/// One pod of the cluster and what its instance manager said.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedInstance {
    /// Pod name.
    pub pod: String,
    /// Pod uid, so that a label goes to this pod and not to a new one of the same name.
    pub uid: Option<String>,
    /// Value of the pod's [`ROLE_LABEL`](super::build::ROLE_LABEL), if any.
    pub role_label: Option<String>,
    pub report: Result<InstanceReport, Unavailable>,
}

impl ObservedInstance {
    /// The report, if there is one.
    pub fn reported(&self) -> Option<&InstanceReport> {
        self.report.as_ref().ok()
    }

    /// Whether the instance reports itself as the primary, ready for connections.
    pub fn is_ready_primary(&self) -> bool {
        self.reported()
            .is_some_and(|r| r.role == ReportedRole::Primary && r.ready)
    }
}

/// Asks the instance manager of every pod in `pods` at once; pods without an address are not
/// asked. The result follows the order of `pods`.
pub async fn observe<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    source: &dyn InstanceStatusSource,
    access: Option<&Arc<ClusterAccess>>,
) -> Vec<ObservedInstance> {
    let asks = pods.into_iter().map(|pod| observe_one(pod, source, access));
    futures::future::join_all(asks).await
}

/// The pod's name and address, once it has one.
pub fn pod_address(pod: &Pod) -> Option<(String, IpAddr)> {
    let ip = pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
    Some((pod.name_any(), ip))
}

async fn observe_one(
    pod: &Pod,
    source: &dyn InstanceStatusSource,
    access: Option<&Arc<ClusterAccess>>,
) -> ObservedInstance {
    let name = pod.name_any();
    let ip = pod_address(pod).map(|(_, ip)| ip);
    let report = match ip {
        None => Err(Unavailable::NoAddress),
        Some(ip) => {
            let address = InstanceAddress {
                pod: name.clone(),
                ip,
                uid: pod.metadata.uid.clone(),
                access: access.cloned(),
            };
            source
                .fetch(&address)
                .await
                .and_then(|report| check_pod(report, &name))
                .map_err(|error| {
                    tracing::debug!(pod = %name, %ip, %error, "no instance status");
                    error.unavailable()
                })
        }
    };
    ObservedInstance {
        pod: name,
        uid: pod.metadata.uid.clone(),
        role_label: pod.labels().get(super::build::ROLE_LABEL).cloned(),
        report,
    }
}

/// A report is only believed for the pod it names: an address may have been reused by another
/// pod since the pod list was read.
fn check_pod(report: InstanceReport, pod: &str) -> Result<InstanceReport, FetchError> {
    if report.pod == pod {
        Ok(report)
    } else {
        Err(FetchError::BadAnswer(format!(
            "the status of pod {} at the address of {pod}",
            report.pod
        )))
    }
}

mod access;
mod http;
pub(super) mod transport;

pub use access::{AccessCache, ClusterAccess, ServerCa};
pub use http::HttpInstanceStatus;

#[cfg(test)]
mod tests;
