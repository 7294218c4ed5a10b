//! The instance's HTTP endpoint, for the kubelet's probes and for the operator:
//!
//! - `/healthz`: 200 while the instance manager runs. It exits when postgres dies, so liveness
//!   never has to judge the server, and never kills one that is recovering.
//! - `/readyz`: 200 when the server answers queries, 503 otherwise.
//! - `/status`: the instance as JSON (role, readiness, timeline, WAL positions, streaming).
//!
//! No Service exposes the port: it is reached at the pod's address, from inside the cluster.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use serde::Serialize;

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
        }
    }

    /// What a server that answered reports.
    pub fn observed(pod: &str, server: ServerState) -> Self {
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
        }
    }
}

/// The status the endpoint serves, updated by the supervisor.
pub type SharedStatus = Arc<RwLock<InstanceStatus>>;

/// Serves the endpoint on `address` until the task is dropped.
pub async fn serve(address: SocketAddr, status: SharedStatus) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    tracing::info!(%address, "status endpoint listening");
    axum::serve(listener, router(status)).await
}

fn router(status: SharedStatus) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/status", get(status_json))
        .with_state(status)
}

fn snapshot(status: &SharedStatus) -> InstanceStatus {
    // A panic while holding the lock leaves the last status, still worth serving.
    status
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone()
}

async fn readyz(State(status): State<SharedStatus>) -> impl IntoResponse {
    if snapshot(&status).ready {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

async fn status_json(State(status): State<SharedStatus>) -> impl IntoResponse {
    match serde_json::to_string(&snapshot(&status)) {
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
            },
        );
        let json = serde_json::to_value(&status).expect("serializes");
        assert_eq!(
            json,
            serde_json::json!({
                "pod": "db-postgresql-1", "role": "replica", "ready": true, "timeline": 1,
                "currentLsn": null, "receivedLsn": "0/3000148", "replayedLsn": "0/3000100",
                "streaming": true, "pendingRestart": []
            })
        );
        assert_eq!(
            serde_json::to_value(InstanceStatus::starting("p")).expect("serializes")["role"],
            "starting"
        );
    }
}
