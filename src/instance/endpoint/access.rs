//! Who may read what on the status port. The probes and the metrics are open to all, plain or
//! TLS: the kubelet and scrapers neither speak TLS to it nor hold a token. In a pod with
//! certificates, the rest (`/status`, `/control/*`) is served over TLS only, and `/status` only
//! to a bearer of the control token, as the control endpoints already require; a pod without
//! certificates (a cluster without TLS) serves everything plain, as before TLS came.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;

use super::Shared;
use super::listener::Transport;
use crate::instance::control;

/// What a request gets before its handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Passed to its handler (the control handlers check the token themselves).
    Open,
    /// Passed to its handler if it bears the control token.
    Bearer,
    /// Refused with a 403: served over TLS only.
    TlsOnly,
}

/// What a request for `path` gets, having come `over_tls` or not, in a pod that has
/// certificates (`ca.crt` mounted) or not.
pub fn access(path: &str, over_tls: bool, has_certificates: bool) -> Access {
    match (path, over_tls, has_certificates) {
        ("/healthz" | "/readyz" | "/metrics", _, _) | (_, _, false) => Access::Open,
        (_, false, true) => Access::TlsOnly,
        ("/status", true, true) => Access::Bearer,
        (_, true, true) => Access::Open,
    }
}

/// The middleware that applies [`access`] to each request.
pub async fn guard(State(shared): State<Shared>, request: Request, next: Next) -> Response {
    let over_tls = request.extensions().get::<Transport>() == Some(&Transport::Tls);
    let has_certificates = shared.tls_dir.join(crate::tls::CA_FILE).exists();
    let path = request.uri().path();
    match access(path, over_tls, has_certificates) {
        Access::Open => next.run(request).await,
        Access::Bearer => match control::authorize(&shared.control.token_file, request.headers()) {
            Ok(()) => next.run(request).await,
            Err((code, why)) => control::message(code, why),
        },
        Access::TlsOnly => {
            let why = format!(
                "{path} is served over TLS only on this instance (it has certificates): \
                 connect with https and the control token"
            );
            control::message(StatusCode::FORBIDDEN, &why)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_and_metrics_are_open_to_all_and_the_rest_needs_tls_once_there_are_certificates() {
        for path in ["/healthz", "/readyz", "/metrics"] {
            for (tls, certificates) in [(false, false), (false, true), (true, false), (true, true)]
            {
                assert_eq!(access(path, tls, certificates), Access::Open, "{path}");
            }
        }
        for path in [
            "/status",
            "/control/promote",
            "/control/follow",
            "/control/upgrade",
        ] {
            assert_eq!(
                access(path, false, false),
                Access::Open,
                "{path} without TLS set up"
            );
            assert_eq!(access(path, false, true), Access::TlsOnly, "{path} plain");
        }
        assert_eq!(access("/status", true, true), Access::Bearer);
        assert_eq!(access("/control/promote", true, true), Access::Open);
        assert_eq!(access("/status", true, false), Access::Open);
    }
}
