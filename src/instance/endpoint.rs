//! The instance's HTTP endpoint, for the kubelet's probes and for the operator:
//!
//! - `/healthz`: 200 while the instance manager runs. It exits when postgres dies, so liveness
//!   never has to judge the server, and never kills one that is recovering.
//! - `/readyz`: 200 when the server answers queries, 503 otherwise.
//! - `/status`: the instance as JSON (role, readiness, timeline, WAL positions, streaming, and
//!   on a replica the primary it follows).
//! - `POST /control/promote`, `POST /control/follow`: the operator's orders ([`super::control`]).
//!
//! No Service exposes the port: it is reached at the pod's address, from inside the cluster.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;

use super::control::{self, Control};
use super::sql::ServerState;

/// The role as the operator reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportedRole {
    /// The server does not answer yet (bootstrap, start, recovery) or is stopping.
    Starting,
    Primary,
    Replica,
}

/// The body of `/status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    pub pod: String,
    pub role: ReportedRole,
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
    /// that does not answer).
    pub message: Option<String>,
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
        }
    }
}

/// The status the endpoint serves, updated by the supervisor.
pub type SharedStatus = Arc<RwLock<InstanceStatus>>;

/// What the handlers share: the status, and the way to the supervisor.
#[derive(Clone)]
struct Shared {
    status: SharedStatus,
    control: Arc<Control>,
}

/// Serves the endpoint on `address` until the task is dropped.
pub async fn serve(
    address: SocketAddr,
    status: SharedStatus,
    control: Control,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    tracing::info!(%address, "status endpoint listening");
    let shared = Shared {
        status,
        control: Arc::new(control),
    };
    axum::serve(listener, router(shared)).await
}

fn router(shared: Shared) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/status", get(status_json))
        .route("/control/promote", post(promote))
        .route("/control/follow", post(follow))
        .with_state(shared)
}

async fn promote(State(shared): State<Shared>, headers: HeaderMap) -> Response {
    control::promote(&shared.control, snapshot(&shared.status), &headers).await
}

async fn follow(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    control::follow(&shared.control, &headers, &body).await
}

fn snapshot(status: &SharedStatus) -> InstanceStatus {
    // A panic while holding the lock leaves the last status, still worth serving.
    status
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone()
}

async fn readyz(State(shared): State<Shared>) -> impl IntoResponse {
    if snapshot(&shared.status).ready {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

async fn status_json(State(shared): State<Shared>) -> impl IntoResponse {
    match serde_json::to_string(&snapshot(&shared.status)) {
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
                "message": null
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
}
