//! The instance's HTTP endpoint, for the kubelet's probes and for the operator:
//!
//! - `/healthz`: 200 while the instance manager's supervisor loop turns; 503 when, in its
//!   steady state, it has not for longer than a bound ([`super::health`]). A long step (initdb,
//!   a clone, a rewind, waiting for a primary) never fails it. The manager exits when postgres
//!   dies, so liveness never has to judge the server, and never kills one that is recovering.
//! - `/readyz`: 200 when the status says ready and is not stale
//!   ([`super::health::STALE_AFTER`]), 503 otherwise.
//! - `/status`: the instance as JSON (role, readiness, timeline, WAL positions, streaming, and
//!   on a replica the primary it follows, and `walArchive` on an instance that archives), with
//!   `observedAt` (RFC 3339) and `ageSeconds`, computed when served, and `managerDigest`.
//! - `/metrics`: the WAL archiver's counters and gauges, in Prometheus' text format
//!   ([`super::archive`]).
//! - `POST /control/promote`, `POST /control/follow`: the operator's orders ([`super::control`]).
//! - `POST /control/upgrade`: a new instance manager binary ([`super::handover`]).
//!
//! One port serves plain HTTP and TLS ([`listener`]: the first byte of a connection tells),
//! TLS with the pod's server certificate (the copy in the TLS runtime directory, read again
//! when renewed). Who may read what ([`access`]):
//!
//! - `/healthz`, `/readyz`, `/metrics`: anyone, plain or TLS, without a token (the kubelet's
//!   probes and scrapers stay plain HTTP).
//! - In a pod with certificates (`ca.crt` mounted): `/status` and `/control/*` over TLS only,
//!   403 over plain HTTP; `/status` then needs the control token as `/control/*` do (401 without
//!   it or with another, 403 when none is mounted).
//! - In a pod without certificates (a cluster without TLS): everything plain, `/status` without
//!   a token, as before.
//!
//! No Service exposes the port: it is reached at the pod's address, from inside the cluster.

mod access;
mod listener;
pub(super) mod peer;
#[cfg(test)]
mod tls_tests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use pgkube_controllers::cluster::status::archiving::WalArchiveReport;
use pgkube_controllers::storage::recovery::in_place::InPlaceReport;

use super::archive::Archiver;
use super::control::{self, Control};
use super::handover::{self, ManagerBinary};
use super::health::Board;
use super::sql::ServerState;

/// The role as the operator reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportedRole {
    /// The server does not answer yet (bootstrap, start, recovery) or is stopping.
    Starting,
    Primary,
    Replica,
}

/// The body of `/status`, but for its time ([`Served`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    pub pod: String,
    /// The role the server was last seen in since it started; `Starting` until then.
    pub role: ReportedRole,
    /// The server answers the manager's queries and accepts new connections now.
    pub ready: bool,
    pub timeline: Option<i64>,
    pub current_lsn: Option<String>,
    pub received_lsn: Option<String>,
    pub replayed_lsn: Option<String>,
    pub streaming: bool,
    pub pending_restart: Vec<String>,
    /// The pod this replica's `primary_conninfo` names; none on a primary, and on a standby
    /// that waits to be promoted.
    pub following: Option<String>,
    /// The system identifier of the database the server runs.
    pub system_identifier: Option<String>,
    /// The uid of the PostgreSQLCluster whose instance made this database (its marker); none
    /// for data made otherwise (an older pgkube, a copy from elsewhere).
    pub initialized_by: Option<String>,
    /// Why an instance whose server does not run waits (data it will not replace, a primary
    /// that does not answer), or why a running server is not ready; on a primary that leaves
    /// its restart to a switchover, that it does.
    pub message: Option<String>,
    /// A primary whose changed settings (`pendingRestart`) need a restart, which it leaves to
    /// the operator's switchover ([`super::planned`]).
    pub restart_by_switchover: bool,
    /// A digest of the operator's `postgresql.conf` that the server has read, none while it
    /// is re-read or while a replica keeps settings at its primary's: two instances with the
    /// same digest and nothing pending run the same settings.
    pub settings_digest: Option<String>,
    /// This instance's part in the last in-place point-in-time recovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place: Option<InPlaceReport>,
}

impl InstanceStatus {
    /// An instance whose server does not answer.
    pub fn starting(pod: &str) -> Self {
        Self {
            pod: pod.to_owned(),
            role: ReportedRole::Starting,
            ready: false,
            timeline: None,
            current_lsn: None,
            received_lsn: None,
            replayed_lsn: None,
            streaming: false,
            pending_restart: Vec::new(),
            following: None,
            system_identifier: None,
            initialized_by: None,
            message: None,
            restart_by_switchover: false,
            settings_digest: None,
            in_place: None,
        }
    }

    /// An instance whose server does not run because it waits, for the reason `why`.
    pub fn waiting(pod: &str, why: &str) -> Self {
        Self {
            message: Some(why.to_owned()),
            ..Self::starting(pod)
        }
    }

    /// What a server that answered reports; `following` counts only on a standby.
    pub fn observed(pod: &str, server: ServerState, following: Option<&str>) -> Self {
        Self {
            pod: pod.to_owned(),
            role: if server.in_recovery {
                ReportedRole::Replica
            } else {
                ReportedRole::Primary
            },
            ready: true,
            timeline: server.timeline,
            current_lsn: server.current_lsn,
            received_lsn: server.received_lsn,
            replayed_lsn: server.replayed_lsn,
            streaming: server.streaming,
            pending_restart: server.pending_restart,
            following: following.filter(|_| server.in_recovery).map(str::to_owned),
            system_identifier: server.system_identifier,
            initialized_by: None,
            message: None,
            restart_by_switchover: false,
            settings_digest: None,
            in_place: None,
        }
    }
}

impl InstanceStatus {
    /// This status, but not ready for the reason `why` (a fixed text, so that an instance that
    /// stays so reports the same): the role and positions last seen are kept, a server not
    /// seen since it started stays `Starting`.
    pub fn not_ready(self, why: &str) -> Self {
        if self.role == ReportedRole::Starting {
            return self;
        }
        Self {
            ready: false,
            streaming: false,
            message: Some(why.to_owned()),
            ..self
        }
    }
}

/// The body of `/status`: the status, when it was observed and how long ago.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Served<'a> {
    #[serde(flatten)]
    status: &'a InstanceStatus,
    observed_at: String,
    age_seconds: f64,
    /// What the WAL archiver did, looked at now.
    #[serde(skip_serializing_if = "Option::is_none")]
    wal_archive: Option<WalArchiveReport>,
    /// The SHA-256 of the instance manager's binary, once computed: the operator replaces a
    /// manager whose binary is not its own ([`super::handover`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    manager_digest: Option<String>,
    /// The CAs of the mounted certificates, read now (the kubelet refreshes them).
    #[serde(skip_serializing_if = "Option::is_none")]
    certificate_authorities: Option<crate::tls::CaDigests>,
}

impl<'a> Served<'a> {
    /// `status`, `age` old at `now`.
    fn new(status: &'a InstanceStatus, age: Duration, now: SystemTime) -> Self {
        let observed_at = now.checked_sub(age).unwrap_or(now);
        Self {
            status,
            observed_at: humantime::format_rfc3339_millis(observed_at).to_string(),
            age_seconds: (age.as_secs_f64() * 1000.0).round() / 1000.0,
            wal_archive: None,
            manager_digest: None,
            certificate_authorities: None,
        }
    }
}

/// What the handlers share: the status and heartbeat, and the way to the supervisor.
#[derive(Clone)]
struct Shared {
    board: Arc<Board>,
    control: Arc<Control>,
    archiver: Arc<Archiver>,
    binary: Arc<ManagerBinary>,
    /// The mounted certificates: the pod has some when `ca.crt` is there.
    tls_dir: Arc<PathBuf>,
}

/// The pod's certificates: where they are mounted, and where the manager copies them (the
/// server's `tls.crt` and `tls.key` are served from there).
pub struct EndpointTls {
    pub mounted: PathBuf,
    pub runtime: PathBuf,
}

/// Serves the endpoint on `address` until the task is dropped.
pub async fn serve(
    address: SocketAddr,
    board: Arc<Board>,
    control: Control,
    archiver: Arc<Archiver>,
    binary: Arc<ManagerBinary>,
    tls: EndpointTls,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    tracing::info!(%address, "status endpoint listening");
    let shared = Shared {
        board,
        control: Arc::new(control),
        archiver,
        binary,
        tls_dir: Arc::new(tls.mounted),
    };
    let certificates = crate::tls::serving::CertificateFiles::new(&tls.runtime);
    listener::serve(listener, router(shared), Arc::new(certificates)).await;
    Ok(())
}

fn router(shared: Shared) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/status", get(status_json))
        .route("/metrics", get(metrics))
        .route("/control/promote", post(promote))
        .route("/control/follow", post(follow))
        .route(
            "/control/upgrade",
            // The body is a binary, streamed to a file with a limit of its own.
            post(upgrade).layer(DefaultBodyLimit::disable()),
        )
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            access::guard,
        ))
        .with_state(shared)
}

async fn promote(State(shared): State<Shared>, headers: HeaderMap) -> Response {
    control::promote(&shared.control, shared.board.status(), &headers).await
}

async fn follow(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    control::follow(&shared.control, &headers, &body).await
}

async fn upgrade(State(shared): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    handover::receive(&shared.control, &shared.binary, &headers, body).await
}

async fn healthz(State(shared): State<Shared>) -> impl IntoResponse {
    match shared.board.liveness() {
        Ok(()) => (StatusCode::OK, "ok".to_owned()),
        Err(why) => {
            tracing::warn!(%why, "failing the liveness probe");
            (StatusCode::SERVICE_UNAVAILABLE, why)
        }
    }
}

async fn readyz(State(shared): State<Shared>) -> impl IntoResponse {
    if shared.board.ready() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

async fn status_json(State(shared): State<Shared>) -> impl IntoResponse {
    let (status, age) = shared.board.snapshot();
    let served = Served {
        wal_archive: shared.archiver.report(),
        manager_digest: shared.binary.digest.get().cloned(),
        certificate_authorities: crate::tls::ca_digests(&shared.tls_dir),
        ..Served::new(&status, age, SystemTime::now())
    };
    match serde_json::to_string(&served) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        ),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            error.to_string(),
        ),
    }
}

async fn metrics(State(shared): State<Shared>) -> impl IntoResponse {
    openmetrics(shared.archiver.metrics())
}

/// A `/metrics` answer: the OpenMetrics text, or why it could not be written.
pub(super) fn openmetrics(text: Result<String, std::fmt::Error>) -> impl IntoResponse {
    match text {
        Ok(text) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        ),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            error.to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_reports_its_positions_in_the_operators_field_names() {
        let status = InstanceStatus::observed(
            "db-postgresql-1",
            ServerState {
                in_recovery: true,
                timeline: Some(1),
                current_lsn: None,
                received_lsn: Some("0/3000148".to_owned()),
                replayed_lsn: Some("0/3000100".to_owned()),
                streaming: true,
                pending_restart: vec![],
                system_identifier: Some("7312345678901234567".to_owned()),
            },
            Some("db-postgresql-0"),
        );
        let json = serde_json::to_value(&status).expect("serializes");
        assert_eq!(
            json,
            serde_json::json!({
                "pod": "db-postgresql-1", "role": "replica", "ready": true, "timeline": 1,
                "currentLsn": null, "receivedLsn": "0/3000148", "replayedLsn": "0/3000100",
                "streaming": true, "pendingRestart": [], "following": "db-postgresql-0",
                "systemIdentifier": "7312345678901234567", "initializedBy": null,
                "message": null, "restartBySwitchover": false, "settingsDigest": null
            })
        );
        let primary = InstanceStatus::observed("p", ServerState::default(), Some("q"));
        assert_eq!(primary.role, ReportedRole::Primary);
        assert_eq!(primary.following, None);
        assert_eq!(
            serde_json::to_value(InstanceStatus::starting("p")).expect("serializes")["role"],
            "starting"
        );
    }

    #[test]
    fn a_server_not_ready_keeps_the_role_it_was_seen_in() {
        let primary = InstanceStatus::observed("p", ServerState::default(), None);
        let hung = primary.clone().not_ready("no new connection");
        assert_eq!((hung.role, hung.ready), (ReportedRole::Primary, false));
        assert_eq!(hung.message.as_deref(), Some("no new connection"));
        assert_eq!(hung.timeline, primary.timeline);
        let starting = InstanceStatus::starting("p").not_ready("no new connection");
        assert_eq!(starting, InstanceStatus::starting("p"));
    }

    #[test]
    fn the_status_is_served_with_when_it_was_observed_and_its_age() {
        let status = InstanceStatus::starting("p");
        let now = humantime::parse_rfc3339("2025-03-01T12:00:10Z").expect("a time");
        let served = Served::new(&status, Duration::from_millis(2_345), now);
        let json = serde_json::to_value(&served).expect("serializes");
        assert_eq!(json["observedAt"], "2025-03-01T12:00:07.655Z");
        assert_eq!(json["ageSeconds"], 2.345);
        assert_eq!(json["pod"], "p");
        assert_eq!(json["role"], "starting");
    }
}
