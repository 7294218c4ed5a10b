//! The manager's HTTP endpoints: health probes (`/healthz`, `/readyz`) and Prometheus
//! `/metrics`, each on its own address as the kubelet and Prometheus expect.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Content type of the Prometheus text exposition format written by prometheus-client.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether the manager is ready: the controllers' caches have synced, or the manager stands
/// by as a follower. Shared by the probe handler and whoever flips it.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set_ready(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Why an endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {address} for {endpoint}: {error}")]
pub struct BindError {
    endpoint: &'static str,
    address: SocketAddr,
    error: std::io::Error,
}

/// The router of `/healthz` and `/readyz`.
pub fn probe_router(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(readiness)
}

/// The router of `/metrics`.
pub fn metrics_router(registry: Arc<Registry>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(registry)
}

async fn readyz(State(readiness): State<Readiness>) -> impl IntoResponse {
    if readiness.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced yet")
    }
}

async fn metrics(State(registry): State<Arc<Registry>>) -> impl IntoResponse {
    let mut body = String::new();
    match encode(&mut body, &registry) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
            body,
        )
            .into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode metrics: {error}"),
        )
            .into_response(),
    }
}

/// Binds `address` and serves `router` until `stop` is cancelled. Returns the bound address
/// (useful with port 0) once listening, so bind errors surface at start-up.
pub async fn serve(
    endpoint: &'static str,
    address: SocketAddr,
    router: Router,
    stop: CancellationToken,
) -> Result<SocketAddr, BindError> {
    let bind_error = |error| BindError {
        endpoint,
        address,
        error,
    };
    let listener = TcpListener::bind(address).await.map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    tokio::spawn(async move {
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
        if let Err(error) = served {
            tracing::error!(%error, endpoint, "HTTP endpoint stopped");
        }
    });
    tracing::info!(endpoint, address = %bound, "serving");
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::{Body, to_bytes};
    use axum::http::Request;
    use std::time::Duration;
    use tower::ServiceExt;

    async fn get_path(router: Router, path: &str) -> (StatusCode, String) {
        let request = Request::get(path).body(Body::empty()).expect("request");
        let response = router.oneshot(request).await.expect("response");
        let status = response.status();
        let body = to_bytes(response.into_body(), 1 << 20).await.expect("body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn healthz_is_always_ok_and_readyz_follows_readiness() {
        let readiness = Readiness::default();
        let router = probe_router(readiness.clone());
        assert_eq!(get_path(router.clone(), "/healthz").await.0, StatusCode::OK);
        assert_eq!(
            get_path(router.clone(), "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        readiness.set_ready();
        assert_eq!(get_path(router.clone(), "/readyz").await.0, StatusCode::OK);
        assert_eq!(get_path(router, "/healthz").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn metrics_serve_the_reconcile_metrics_in_text_format() {
        let mut registry = Registry::default();
        let metrics = pgkube_controllers::Metrics::register(&mut registry);
        metrics.observe_reconcile("backup", true, Duration::from_millis(20));
        let (status, body) = get_path(metrics_router(Arc::new(registry)), "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.contains(r#"operator_reconcile_total{controller="backup",result="success"} 1"#),
            "{body}"
        );
        assert!(
            body.contains(r#"operator_reconcile_duration_seconds_count{controller="backup"} 1"#),
            "{body}"
        );
        assert!(body.ends_with("# EOF\n"), "{body}");
    }

    #[tokio::test]
    async fn serve_binds_a_free_port_and_stops_on_cancel() {
        let stop = CancellationToken::new();
        let router = probe_router(Readiness::default());
        let address = serve(
            "probes",
            "127.0.0.1:0".parse().expect("address"),
            router,
            stop.clone(),
        )
        .await
        .expect("bind");
        assert_ne!(address.port(), 0);
        let taken = serve("probes", address, Router::new(), stop.clone()).await;
        assert!(taken.is_err(), "a second bind of the same port succeeded");
        stop.cancel();
    }
}
