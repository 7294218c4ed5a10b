//! The control endpoints, through which the operator moves the primary (issue 16):
//!
//! - `POST /control/promote` (body `{}`): the standby becomes the primary. The answer comes
//!   after the promotion: 200 with the `/status` body, or 409 with `{"message": ...}` when the
//!   server is not running or the promotion failed. Idempotent on a primary.
//! - `POST /control/follow` (body `{"primary": "<pod>", "primaryHost": "<host>"}`): become, or
//!   stay, a standby of that primary. 202 at once; the supervisor does the work (a primary shuts
//!   down, rewinds or clones, and starts as a standby).
//!
//! Both need `Authorization: Bearer <token>`, the token being the file `token` of the control
//! directory (mounted from the cluster's control Secret): 401 without it or with another, 403
//! when no token is mounted (control disabled). The token is read at every request, so a
//! rotated Secret takes effect without a restart, and compared in constant time.
//!
//! The handlers only check and pass the request on: the supervisor loop owns the server and
//! does everything to it, in order ([`ControlRequest`]).
//!
//! Each order bears the term of the operator's decision it carries out (header `pgkube-term`;
//! none counts as 0). The supervisor refuses an order of a term older than the highest it has
//! seen ([`Terms`]): an order that waited in the queue, or was sent by a manager that lost its
//! leadership, never undoes a newer decision.

use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};

use super::endpoint::{InstanceStatus, ReportedRole};

/// How long a promotion may take before the endpoint gives up waiting: the server's own wait
/// (60 s) and some.
const PROMOTE_ANSWER_TIMEOUT: Duration = Duration::from_secs(90);
/// Requests waiting for the supervisor; more are refused with 503 (the operator retries).
pub const QUEUE: usize = 16;

/// An instance to follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Its pod name.
    pub pod: String,
    /// Its host name (the PostgreSQL port is the cluster's).
    pub host: String,
}

/// What the endpoint asks of the supervisor.
#[derive(Debug)]
pub enum ControlRequest {
    /// Promote; the answer is the status after the promotion, or why it did not happen.
    Promote(oneshot::Sender<Result<InstanceStatus, String>>),
    /// Become or stay a standby of this primary.
    Follow(Target),
    /// Hand the process over to a new instance manager binary ([`super::handover`]). It moves
    /// no primary, so it bears no term.
    Upgrade(super::handover::Upgrade),
}

/// A request with the term of the decision it carries out.
#[derive(Debug)]
pub struct Order {
    pub term: i64,
    pub request: ControlRequest,
}

/// The header that carries an order's term.
const TERM_HEADER: &str = "pgkube-term";

/// The highest term of the orders this instance manager carried out.
#[derive(Debug, Default)]
pub struct Terms {
    highest: i64,
}

impl Terms {
    /// Terms carried on from `highest` (a previous manager's).
    pub fn at(highest: i64) -> Self {
        Self { highest }
    }

    pub fn highest(&self) -> i64 {
        self.highest
    }

    /// The order's request when its term is not older than any seen, else none (a refused
    /// promotion is answered here).
    pub fn admit(&mut self, order: Order) -> Option<ControlRequest> {
        if matches!(order.request, ControlRequest::Upgrade(_)) {
            return Some(order.request);
        }
        if order.term >= self.highest {
            self.highest = order.term;
            return Some(order.request);
        }
        let why = format!(
            "refused: term {} is older than term {}, already carried out",
            order.term, self.highest
        );
        tracing::warn!(
            term = order.term,
            highest = self.highest,
            "an order of an older term is refused"
        );
        if let ControlRequest::Promote(reply) = order.request {
            let _ = reply.send(Err(why));
        }
        None
    }
}

/// The term an order bears; 0 without the header.
fn term_of(headers: &HeaderMap) -> Result<i64, (StatusCode, &'static str)> {
    match headers.get(TERM_HEADER) {
        None => Ok(0),
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .ok_or((
                StatusCode::BAD_REQUEST,
                "the pgkube-term header is not an integer",
            )),
    }
}

/// What the control endpoints need.
#[derive(Debug)]
pub struct Control {
    pub token_file: PathBuf,
    /// The operator's `instance.json`, which names the cluster's instances and their hosts.
    pub topology_file: PathBuf,
    pub pod: String,
    pub requests: mpsc::Sender<Order>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FollowBody {
    primary: String,
    primary_host: String,
}

/// `POST /control/promote`.
pub async fn promote(control: &Control, status: InstanceStatus, headers: &HeaderMap) -> Response {
    if let Err((code, why)) = authorize(&control.token_file, headers) {
        return message(code, why);
    }
    let term = match term_of(headers) {
        Ok(term) => term,
        Err((code, why)) => return message(code, why),
    };
    if status.role == ReportedRole::Starting {
        return message(StatusCode::CONFLICT, "the server is not running");
    }
    let (reply, answer) = oneshot::channel();
    if control
        .requests
        .try_send(Order {
            term,
            request: ControlRequest::Promote(reply),
        })
        .is_err()
    {
        return message(
            StatusCode::SERVICE_UNAVAILABLE,
            "the instance manager is busy",
        );
    }
    match tokio::time::timeout(PROMOTE_ANSWER_TIMEOUT, answer).await {
        Ok(Ok(Ok(status))) => json(StatusCode::OK, &status),
        Ok(Ok(Err(why))) => message(StatusCode::CONFLICT, &why),
        Ok(Err(_)) => message(StatusCode::CONFLICT, "the instance manager is stopping"),
        Err(_) => message(StatusCode::CONFLICT, "the promotion did not finish in time"),
    }
}

/// `POST /control/follow`.
pub async fn follow(control: &Control, headers: &HeaderMap, body: &[u8]) -> Response {
    if let Err((code, why)) = authorize(&control.token_file, headers) {
        return message(code, why);
    }
    let term = match term_of(headers) {
        Ok(term) => term,
        Err((code, why)) => return message(code, why),
    };
    let body: FollowBody = match serde_json::from_slice(body) {
        Ok(body) => body,
        Err(error) => return message(StatusCode::BAD_REQUEST, &format!("bad body: {error}")),
    };
    if body.primary.is_empty() || body.primary_host.is_empty() {
        return message(
            StatusCode::BAD_REQUEST,
            "primary and primaryHost must not be empty",
        );
    }
    if body.primary == control.pod {
        return message(
            StatusCode::BAD_REQUEST,
            "an instance cannot follow itself; /control/promote makes it the primary",
        );
    }
    if let Err((code, why)) = check_same_cluster(&control.topology_file, &body) {
        return message(code, &why);
    }
    let target = Target {
        pod: body.primary,
        host: body.primary_host,
    };
    let text = format!("following {}", target.pod);
    let order = Order {
        term,
        request: ControlRequest::Follow(target),
    };
    match control.requests.try_send(order) {
        Ok(()) => message(StatusCode::ACCEPTED, &text),
        Err(_) => message(
            StatusCode::SERVICE_UNAVAILABLE,
            "the instance manager is busy",
        ),
    }
}

/// Refuses a primary that is not an instance of this cluster at its host name: whoever holds
/// the token cannot point a standby (and its replication credentials) at a server of theirs.
fn check_same_cluster(topology_file: &Path, body: &FollowBody) -> Result<(), (StatusCode, String)> {
    let topology = std::fs::read_to_string(topology_file)
        .map_err(|error| error.to_string())
        .and_then(|text| {
            super::desired::Topology::parse(&text, topology_file).map_err(|e| e.to_string())
        })
        .map_err(|why| {
            let why = format!("cannot tell this cluster's instances: {why}");
            (StatusCode::SERVICE_UNAVAILABLE, why)
        })?;
    if topology.is_instance_host(&body.primary, &body.primary_host) {
        return Ok(());
    }
    Err((
        StatusCode::BAD_REQUEST,
        format!(
            "{} at {} is not an instance of this cluster: only its own instances are followed",
            body.primary, body.primary_host
        ),
    ))
}

/// Whether the request carries the mounted token; the code and message to answer when not.
pub(super) fn authorize(
    token_file: &Path,
    headers: &HeaderMap,
) -> Result<(), (StatusCode, &'static str)> {
    let token = match std::fs::read_to_string(token_file) {
        Ok(token) => token.trim().to_owned(),
        Err(error) => {
            if error.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(%error, file = %token_file.display(), "cannot read the control token");
            }
            String::new()
        }
    };
    if token.is_empty() {
        return Err((
            StatusCode::FORBIDDEN,
            "control is disabled: no token is mounted (the cluster's control Secret)",
        ));
    }
    let offered = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .unwrap_or_default();
    if constant_time_eq(offered.trim().as_bytes(), token.as_bytes()) {
        Ok(())
    } else {
        Err((StatusCode::UNAUTHORIZED, "a valid bearer token is required"))
    }
}

/// Compares without stopping at the first difference, so that the time taken tells nothing
/// about how much of a guess was right. (The length may show; the operator's tokens all have
/// the same.)
fn constant_time_eq(offered: &[u8], expected: &[u8]) -> bool {
    if offered.len() != expected.len() {
        return false;
    }
    let difference = offered
        .iter()
        .zip(expected)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    // Keeps the compiler from turning the fold into an early exit.
    std::hint::black_box(difference) == 0
}

pub(super) fn message(code: StatusCode, text: &str) -> Response {
    json(code, &serde_json::json!({ "message": text }))
}

fn json(code: StatusCode, body: &impl serde::Serialize) -> Response {
    match serde_json::to_string(body) {
        Ok(body) => (code, [(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(authorization: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = authorization {
            headers.insert(
                header::AUTHORIZATION,
                HeaderValue::from_str(value).expect("header"),
            );
        }
        headers
    }

    #[test]
    fn only_the_mounted_token_is_accepted_and_no_token_disables_control() {
        let dir = std::env::temp_dir().join(format!("pgkube-control-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("token");
        let code = |authorization| match authorize(&file, &headers(authorization)) {
            Ok(()) => StatusCode::OK,
            Err((code, _)) => code,
        };
        assert_eq!(code(Some("Bearer abc")), StatusCode::FORBIDDEN);
        std::fs::write(&file, "abc\n").expect("token");
        assert_eq!(code(Some("Bearer abc")), StatusCode::OK);
        assert_eq!(code(Some("Bearer abd")), StatusCode::UNAUTHORIZED);
        assert_eq!(code(Some("Bearer ab")), StatusCode::UNAUTHORIZED);
        assert_eq!(code(Some("Basic abc")), StatusCode::UNAUTHORIZED);
        assert_eq!(code(None), StatusCode::UNAUTHORIZED);
        std::fs::write(&file, "").expect("empty token");
        assert_eq!(code(Some("Bearer ")), StatusCode::FORBIDDEN);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn equal_bytes_compare_equal_and_any_difference_does_not() {
        assert!(constant_time_eq(b"0123abcd", b"0123abcd"));
        assert!(!constant_time_eq(b"0123abcd", b"0123abce"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}

#[cfg(test)]
mod term_tests {
    use super::*;

    fn follow(term: i64) -> Order {
        Order {
            term,
            request: ControlRequest::Follow(Target {
                pod: "a-1".to_owned(),
                host: "a-1.h".to_owned(),
            }),
        }
    }

    #[test]
    fn an_order_of_an_older_term_is_refused_and_a_promotion_told_why() {
        let mut terms = Terms::default();
        assert!(terms.admit(follow(0)).is_some(), "no term yet");
        assert!(terms.admit(follow(3)).is_some());
        assert!(terms.admit(follow(3)).is_some(), "the same term again");
        assert!(terms.admit(follow(2)).is_none(), "an older term");
        let (reply, answer) = oneshot::channel();
        let stale = Order {
            term: 1,
            request: ControlRequest::Promote(reply),
        };
        assert!(terms.admit(stale).is_none());
        let why = answer
            .blocking_recv()
            .expect("answered")
            .expect_err("refused");
        assert!(why.contains("term 1 is older than term 3"), "{why}");
    }

    #[test]
    fn the_term_comes_from_its_header() {
        let mut headers = HeaderMap::new();
        assert_eq!(term_of(&headers), Ok(0));
        headers.insert(TERM_HEADER, "7".parse().expect("value"));
        assert_eq!(term_of(&headers), Ok(7));
        headers.insert(TERM_HEADER, "seven".parse().expect("value"));
        assert!(term_of(&headers).is_err());
    }
}
