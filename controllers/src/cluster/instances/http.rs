//! [`HttpInstanceStatus`]: the operator's client of the instance managers' port, one
//! connection per request ([`super::transport`]), over TLS with the cluster's access.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Full, Limited};
use serde::Deserialize;

use super::super::manager_upgrade;
use super::transport::{self, Scheme};
use super::{
    ControlCommand, FetchError, InstanceAddress, InstanceReport, InstanceStatusSource, STALE_AFTER,
    STATUS_PORT, STATUS_TIMEOUT, TERM_HEADER,
};

/// Largest `/status` body read; a real one is a few hundred bytes.
const MAX_BODY_BYTES: usize = 64 * 1024;
/// Pods remembered as speaking TLS; beyond, the memory starts again (pods come and go).
const MAX_REMEMBERED_PODS: usize = 65_536;

/// The body of `/status`: the report, and its age when it was served.
#[derive(Deserialize)]
pub(super) struct Served {
    #[serde(flatten)]
    report: InstanceReport,
    #[serde(default, rename = "ageSeconds")]
    age_seconds: Option<f64>,
}

impl Served {
    /// The report, if it is not older than [`STALE_AFTER`]; one without an age is current.
    pub(super) fn current(self) -> Result<InstanceReport, FetchError> {
        match self.age_seconds {
            None => Ok(self.report),
            Some(age) if !(age.is_finite() && age >= 0.0) => {
                Err(FetchError::BadAnswer(format!("ageSeconds {age}")))
            }
            Some(age) if age > STALE_AFTER.as_secs_f64() => Err(FetchError::Stale(format!(
                "a report {age} s old (more than {STALE_AFTER:?})"
            ))),
            Some(_) => Ok(self.report),
        }
    }
}

/// Asks instance managers on [`STATUS_PORT`], on a new connection each time, as the kubelet's
/// probes do. Why not keep connections: a reconcile asks each instance once, the next ask comes
/// a refresh later, and an idle connection held for every pod cost about 19 KiB each; a new
/// connection costs a handshake.
///
/// A pod that answered over TLS once (by uid) is never asked in plain HTTP again: whoever
/// intercepts the connections to it cannot make the operator send the token in clear.
#[derive(Clone)]
pub struct HttpInstanceStatus {
    port: u16,
    timeout: Duration,
    spoke_tls: Arc<Mutex<HashSet<String>>>,
}

impl fmt::Debug for HttpInstanceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpInstanceStatus")
            .field("port", &self.port)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Default for HttpInstanceStatus {
    fn default() -> Self {
        Self::new(STATUS_PORT, STATUS_TIMEOUT)
    }
}

impl HttpInstanceStatus {
    /// Asks on `port`, each answer within `timeout`.
    pub fn new(port: u16, timeout: Duration) -> Self {
        Self {
            port,
            timeout,
            spoke_tls: Arc::default(),
        }
    }

    /// Whether `address` may be asked in plain HTTP: not once its pod spoke TLS.
    fn plain_allowed(&self, address: &InstanceAddress) -> bool {
        let Some(uid) = &address.uid else {
            return true;
        };
        self.spoke_tls
            .lock()
            .map_or(true, |spoke_tls| !spoke_tls.contains(uid))
    }

    fn remember_tls(&self, address: &InstanceAddress) {
        let (Some(uid), Ok(mut spoke_tls)) = (&address.uid, self.spoke_tls.lock()) else {
            return;
        };
        if spoke_tls.len() >= MAX_REMEMBERED_PODS {
            spoke_tls.clear();
        }
        spoke_tls.insert(uid.clone());
    }

    /// Sends the request `build` makes for a scheme and host to `address`, and reads the
    /// answer's body, at most [`MAX_BODY_BYTES`].
    async fn send<B>(
        &self,
        address: &InstanceAddress,
        build: impl Fn(Scheme, &str) -> Result<http::Request<B>, FetchError>,
    ) -> Result<(http::StatusCode, Bytes), FetchError>
    where
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let socket = SocketAddr::new(address.ip, self.port);
        let access = address.access.as_deref();
        let plain_allowed = self.plain_allowed(address);
        let (scheme, response) = transport::send(
            socket,
            &address.pod,
            access,
            self.timeout,
            plain_allowed,
            build,
        )
        .await?;
        if scheme == Scheme::Tls {
            self.remember_tls(address);
        }
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|error| FetchError::Unreachable(format!("reading the body: {error}")))?
            .to_bytes();
        if matches!(
            status,
            http::StatusCode::UNAUTHORIZED | http::StatusCode::FORBIDDEN
        ) {
            return Err(FetchError::Refused(format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&body).trim()
            )));
        }
        Ok((status, body))
    }

    async fn get(&self, address: &InstanceAddress) -> Result<InstanceReport, FetchError> {
        let build = |scheme, host: &str| {
            let mut request = http::Request::get("/status").header(http::header::HOST, host);
            // Over TLS only, so that the token never crosses in clear: an instance manager that
            // answers in plain HTTP (an older one) asks for none.
            if let (Scheme::Tls, Some(access)) = (scheme, address.access.as_deref()) {
                let value = format!("Bearer {}", access.token());
                request = request.header(http::header::AUTHORIZATION, value);
            }
            request
                .body(Full::<Bytes>::default())
                .map_err(|error| FetchError::BadAnswer(format!("request: {error}")))
        };
        let (status, body) = self.send(address, build).await?;
        if !status.is_success() {
            return Err(FetchError::BadAnswer(format!("HTTP {status}")));
        }
        serde_json::from_slice::<Served>(&body)
            .map_err(|error| FetchError::BadAnswer(error.to_string()))?
            .current()
    }

    /// `POST`s `command` with the bearer `token`; any 2xx answer is success.
    async fn post(
        &self,
        address: &InstanceAddress,
        token: &str,
        command: &ControlCommand,
    ) -> Result<(), FetchError> {
        let build = |_, host: &str| {
            http::Request::post(command.path())
                .header(http::header::HOST, host)
                .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
                .header(http::header::CONTENT_TYPE, "application/json")
                .header(TERM_HEADER, command.term())
                .body(Full::new(Bytes::from(command.body().to_string())))
                .map_err(|error| FetchError::BadAnswer(format!("request: {error}")))
        };
        success(self.send(address, build).await?)
    }
}

/// Any 2xx answer is success; another says why in its body.
fn success((status, body): (http::StatusCode, Bytes)) -> Result<(), FetchError> {
    if status.is_success() {
        return Ok(());
    }
    Err(FetchError::BadAnswer(format!(
        "HTTP {status}: {}",
        String::from_utf8_lossy(&body).trim()
    )))
}

/// How long a command may take: the instance manager answers a promotion once the server left
/// recovery, waiting up to 90 s for it.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(95);

impl InstanceStatusSource for HttpInstanceStatus {
    fn upgrade<'a>(
        &'a self,
        address: &'a InstanceAddress,
        token: &'a str,
        binary: &'a manager_upgrade::OwnBinary,
    ) -> BoxFuture<'a, Result<(), FetchError>> {
        Box::pin(async move {
            let build = manager_upgrade::upload_request(binary, token)?;
            let sent = async { success(self.send(address, build).await?) };
            tokio::time::timeout(manager_upgrade::UPLOAD_TIMEOUT, sent)
                .await
                .unwrap_or_else(|_| {
                    Err(FetchError::Unreachable(format!(
                        "no answer within {:?}",
                        manager_upgrade::UPLOAD_TIMEOUT
                    )))
                })
        })
    }

    fn command<'a>(
        &'a self,
        address: &'a InstanceAddress,
        token: &'a str,
        command: &'a ControlCommand,
    ) -> BoxFuture<'a, Result<(), FetchError>> {
        Box::pin(async move {
            tokio::time::timeout(COMMAND_TIMEOUT, self.post(address, token, command))
                .await
                .unwrap_or_else(|_| {
                    Err(FetchError::Unreachable(format!(
                        "no answer within {COMMAND_TIMEOUT:?}"
                    )))
                })
        })
    }

    fn fetch<'a>(
        &'a self,
        address: &'a InstanceAddress,
    ) -> BoxFuture<'a, Result<InstanceReport, FetchError>> {
        Box::pin(async move {
            tokio::time::timeout(self.timeout, self.get(address))
                .await
                .unwrap_or_else(|_| {
                    Err(FetchError::Unreachable(format!(
                        "no answer within {:?}",
                        self.timeout
                    )))
                })
        })
    }
}
