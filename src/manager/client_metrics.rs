//! The manager's own requests to the API server, counted on `/metrics` as
//! `pgkube_kube_client_requests_total{verb, resource, code}`: a tower layer in the controllers'
//! client, so that anyone can see what a reconcile costs in requests.
//!
//! The verb is Kubernetes' (get, list, watch, create, update, patch, delete, deletecollection),
//! read from the method and the path; the resource is its plural, with the subresource after a
//! slash (`postgresqlclusters/status`); the code is the response's status, or `error` when no
//! response came. A watch is counted when its response starts, not per event.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::http::{self, Method, Request, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tower::{Layer, Service};

/// Labels of one counted request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: &'static str,
    pub resource: String,
    pub code: String,
}

/// The request counter, shared by the layer's services.
#[derive(Clone)]
pub struct ClientMetricsLayer {
    requests: Family<RequestLabels, Counter>,
}

impl ClientMetricsLayer {
    /// Registers the counter in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "pgkube_kube_client_requests",
            "Requests of the manager's controllers to the Kubernetes API server, by verb, resource and response code",
            requests.clone(),
        );
        Self { requests }
    }
}

impl<S> Layer<S> for ClientMetricsLayer {
    type Service = CountedRequests<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CountedRequests {
            inner,
            requests: self.requests.clone(),
        }
    }
}

/// A service that counts each request once its response (or error) comes.
#[derive(Clone)]
pub struct CountedRequests<S> {
    inner: S,
    requests: Family<RequestLabels, Counter>,
}

impl<S, B, R> Service<Request<B>> for CountedRequests<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (verb, resource) = classify(request.method(), request.uri());
        let requests = self.requests.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "error".to_owned(),
            };
            requests
                .get_or_create(&RequestLabels {
                    verb,
                    resource,
                    code,
                })
                .inc();
            result
        })
    }
}

/// The Kubernetes verb and resource (`plural` or `plural/subresource`) of a request.
fn classify(method: &Method, uri: &http::Uri) -> (&'static str, String) {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return (verb_of(method, uri, false), "other".to_owned()),
    };
    // A namespaced path: namespaces/<namespace>/<resource>...; `namespaces/<name>` alone is a
    // Namespace object.
    let rest = match rest {
        ["namespaces", _namespace, tail @ ..] if !tail.is_empty() => tail,
        rest => rest,
    };
    let (resource, named) = match rest {
        [] => ("other".to_owned(), false),
        [resource] => ((*resource).to_owned(), false),
        [resource, _name] => ((*resource).to_owned(), true),
        [resource, _name, subresource, ..] => (format!("{resource}/{subresource}"), true),
    };
    (verb_of(method, uri, named), resource)
}

fn verb_of(method: &Method, uri: &http::Uri, named: bool) -> &'static str {
    let watch = uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    match *method {
        Method::GET if watch => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classified(method: Method, uri: &str) -> (&'static str, String) {
        classify(&method, &uri.parse().expect("a URI"))
    }

    #[test]
    fn requests_are_counted_by_kubernetes_verb_and_resource() {
        let cases = [
            (
                Method::GET,
                "/apis/apps/v1/namespaces/db/statefulsets/a",
                ("get", "statefulsets"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/db/pods?labelSelector=x",
                ("list", "pods"),
            ),
            (
                Method::GET,
                "/api/v1/pods?&watch=true&timeoutSeconds=290",
                ("watch", "pods"),
            ),
            (
                Method::PATCH,
                "/apis/db.example.com/v1alpha1/namespaces/db/postgresqlclusters/a/status",
                ("patch", "postgresqlclusters/status"),
            ),
            (
                Method::POST,
                "/api/v1/namespaces/db/secrets",
                ("create", "secrets"),
            ),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/db/leases/l",
                ("update", "leases"),
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/db/services/old",
                ("delete", "services"),
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/db/pods",
                ("deletecollection", "pods"),
            ),
            (Method::GET, "/api/v1/namespaces/db", ("get", "namespaces")),
            (
                Method::GET,
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                ("list", "customresourcedefinitions"),
            ),
            (Method::GET, "/version", ("list", "other")),
        ];
        for (method, uri, (verb, resource)) in cases {
            assert_eq!(
                classified(method, uri),
                (verb, resource.to_owned()),
                "{uri}"
            );
        }
    }

    #[tokio::test]
    async fn each_response_is_counted_with_its_code() {
        let mut registry = Registry::default();
        let layer = ClientMetricsLayer::register(&mut registry);
        let inner = tower::service_fn(|request: Request<()>| async move {
            let status = if request.uri().path().ends_with("/missing") {
                404
            } else {
                200
            };
            Ok::<_, std::convert::Infallible>(
                Response::builder()
                    .status(status)
                    .body(())
                    .expect("response"),
            )
        });
        let mut service = layer.layer(inner);
        for path in [
            "/api/v1/namespaces/db/pods/a",
            "/api/v1/namespaces/db/pods/missing",
        ] {
            let request = Request::get(path).body(()).expect("request");
            service.call(request).await.expect("answered");
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encoded");
        for code in ["200", "404"] {
            let line = format!(
                "pgkube_kube_client_requests_total{{verb=\"get\",resource=\"pods\",code=\"{code}\"}} 1"
            );
            assert!(text.contains(&line), "{text}");
        }
    }
}
