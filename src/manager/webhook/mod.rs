//! The manager's webhook, over TLS: `POST /convert` answers the API server's ConversionReviews
//! with [`pgkube_crds::conversion::convert`], and `POST /mutate` ([`admission`]) puts the cleanup
//! finalizer on PostgreSQLClusters as they are created.
//!
//! Every replica serves it, leader or not: the API server may call any of them. The serving
//! certificate is read from `tls.crt` and `tls.key` in a directory (a Secret volume, for
//! example cert-manager's), and read again when the files change, so a rotated certificate is
//! served without a restart. A body that is not a ConversionReview gets a 400 with the reason;
//! an object that cannot be converted fails the review with the reason, naming the object.

pub mod admission;
pub mod certificates;
pub mod managed;
pub mod serve;

pub use pgkube::tls::serving::CertificateFiles;
pub use serve::serve_tls;

use std::net::SocketAddr;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use kube::core::Status;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};

/// The path the CRDs' conversion stanza names.
pub const CONVERT_PATH: &str = "/convert";
/// The default largest request body: an AdmissionReview holds one object (the API server
/// stores at most 1.5 MiB), a ConversionReview a page of a list.
pub const DEFAULT_BODY_LIMIT: usize = 2 * 1024 * 1024;

/// Why the webhook could not start.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("cannot listen on {address} for the webhook: {error}")]
    Bind {
        address: SocketAddr,
        error: std::io::Error,
    },
    #[error("the webhook's certificate: {0}")]
    Certificate(#[from] pgkube::tls::serving::CertificateError),
}

/// The router of [`CONVERT_PATH`] and [`pgkube_crds::ADMISSION_PATH`], with bodies of at most
/// `body_limit` bytes.
pub fn router(body_limit: usize) -> Router {
    let converting = move |body: Body| async move {
        match serve::read_body(body, body_limit).await {
            Ok(body) => convert(body).await,
            Err(refused) => refused,
        }
    };
    let admitting = move |body: Body| async move {
        match serve::read_body(body, body_limit).await {
            Ok(body) => admission::mutate(body).await,
            Err(refused) => refused,
        }
    };
    Router::new()
        .route(CONVERT_PATH, post(converting))
        .route(pgkube_crds::ADMISSION_PATH, post(admitting))
}

async fn convert(body: Bytes) -> Response {
    let review: ConversionReview = match serde_json::from_slice(&body) {
        Ok(review) => review,
        Err(error) => {
            let message = format!("the body is not a ConversionReview: {error}");
            return (StatusCode::BAD_REQUEST, message).into_response();
        }
    };
    let request = match ConversionRequest::from_review(review) {
        Ok(request) => request,
        Err(_) => {
            let message = "the ConversionReview has no request";
            return (StatusCode::BAD_REQUEST, message).into_response();
        }
    };
    match serde_json::to_vec(&answer(request).into_review()) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(error) => {
            let message = format!("cannot encode the ConversionReview: {error}");
            (StatusCode::INTERNAL_SERVER_ERROR, message).into_response()
        }
    }
}

/// The answer to one ConversionRequest (pure): every object converted, or a failure that
/// names the first object that could not be.
pub fn answer(mut request: ConversionRequest) -> ConversionResponse {
    let desired = request.desired_api_version.clone();
    // Taken, not copied: the response only needs the request's uid and types.
    let objects = std::mem::take(&mut request.objects);
    let response = ConversionResponse::for_request(request);
    let mut converted = Vec::with_capacity(objects.len());
    for object in objects {
        let name = describe(&object);
        match pgkube_crds::conversion::convert(object, &desired) {
            Ok(object) => converted.push(object),
            Err(error) => {
                let message = format!("cannot convert {name} to {desired}: {error}");
                tracing::warn!(%message, "conversion refused");
                return response.failure(Status::failure(&message, "Invalid"));
            }
        }
    }
    response.success(converted)
}

/// `<kind> <namespace>/<name>` of an object, for messages.
fn describe(object: &serde_json::Value) -> String {
    let text = |pointer: &str| {
        object
            .pointer(pointer)
            .and_then(|v| v.as_str())
            .unwrap_or("?")
    };
    format!(
        "{} {}/{}",
        text("/kind"),
        text("/metadata/namespace"),
        text("/metadata/name")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::CertificateDer;
    use serde_json::json;
    use std::path::Path;
    use std::sync::Arc;
    use tokio::net::TcpStream;
    use tokio_util::sync::CancellationToken;

    fn request_for(desired: &str, objects: Vec<serde_json::Value>) -> ConversionRequest {
        serde_json::from_value(json!({
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "desiredAPIVersion": desired,
            "objects": objects,
        }))
        .expect("request")
    }

    fn cluster_v1alpha1() -> serde_json::Value {
        json!({
            "apiVersion": "db.example.com/v1alpha1",
            "kind": "PostgreSQLCluster",
            "metadata": {"name": "main", "namespace": "db", "uid": "u-1", "resourceVersion": "42"},
            "spec": {"replicas": 3, "version": "16", "storage": "10Gi"},
        })
    }

    #[test]
    fn a_review_converts_every_object_and_keeps_the_uid() {
        let response = answer(request_for(
            "db.example.com/v1beta1",
            vec![cluster_v1alpha1()],
        ));
        let review = serde_json::to_value(response.into_review()).expect("JSON");
        let response = &review["response"];
        assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(response["result"]["status"], "Success");
        let converted = &response["convertedObjects"][0];
        assert_eq!(converted["apiVersion"], "db.example.com/v1beta1");
        assert_eq!(converted["spec"]["postgresVersion"], "16");
        assert_eq!(converted["spec"]["storage"]["size"], "10Gi");
        assert_eq!(converted["metadata"]["resourceVersion"], "42");
    }

    #[test]
    fn an_object_that_cannot_be_converted_fails_the_review_naming_it() {
        // Metadata that cannot carry the fields v1alpha1 has no place for.
        let mut broken = cluster_v1alpha1();
        broken["apiVersion"] = json!("db.example.com/v1beta1");
        broken["spec"] = json!({"storage": {"size": "10Gi", "storageClassName": "fast"}});
        broken["metadata"]["annotations"] = json!(["not", "a", "map"]);
        let response = answer(request_for("db.example.com/v1alpha1", vec![broken]));
        let review = serde_json::to_value(response.into_review()).expect("JSON");
        let result = &review["response"]["result"];
        assert_eq!(result["status"], "Failure");
        let message = result["message"].as_str().expect("message");
        assert!(
            message.starts_with(
                "cannot convert PostgreSQLCluster db/main to db.example.com/v1alpha1: "
            ),
            "{message}"
        );
        let unknown = answer(request_for("db.example.com/v9", vec![cluster_v1alpha1()]));
        let review = serde_json::to_value(unknown.into_review()).expect("JSON");
        assert_eq!(review["response"]["result"]["status"], "Failure");
    }

    #[tokio::test]
    async fn a_body_that_is_not_a_review_gets_a_400_that_says_why() {
        use axum::body::{Body, to_bytes};
        use axum::http::Request;
        use tower::ServiceExt;
        for (body, expected) in [
            ("{not json", "the body is not a ConversionReview"),
            (
                r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview"}"#,
                "the ConversionReview has no request",
            ),
        ] {
            let request = Request::post(CONVERT_PATH)
                .body(Body::from(body))
                .expect("request");
            let response = router(DEFAULT_BODY_LIMIT)
                .oneshot(request)
                .await
                .expect("response");
            assert_eq!(response.status(), StatusCode::BAD_REQUEST);
            let text = to_bytes(response.into_body(), 1 << 20).await.expect("body");
            assert!(
                String::from_utf8_lossy(&text).starts_with(expected),
                "{}",
                String::from_utf8_lossy(&text)
            );
        }
    }

    /// A self-signed certificate for 127.0.0.1, written as `tls.crt` and `tls.key` in `dir`.
    fn write_certificate(dir: &Path) -> CertificateDer<'static> {
        let generated =
            rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).expect("certificate");
        std::fs::write(dir.join("tls.crt"), generated.cert.pem()).expect("tls.crt");
        std::fs::write(dir.join("tls.key"), generated.signing_key.serialize_pem())
            .expect("tls.key");
        generated.cert.der().clone()
    }

    /// POSTs `body` to `/convert` over TLS, trusting `roots`; the server's certificate and the
    /// HTTP response.
    async fn post(
        address: SocketAddr,
        roots: &[CertificateDer<'static>],
        body: &str,
    ) -> (CertificateDer<'static>, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut store = rustls::RootCertStore::empty();
        for root in roots {
            store.add(root.clone()).expect("root");
        }
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(store)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = TcpStream::connect(address).await.expect("connect");
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let mut tls = connector.connect(name, tcp).await.expect("handshake");
        let served = tls.get_ref().1.peer_certificates().expect("peer")[0].clone();
        let request = format!(
            "POST {CONVERT_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        tls.write_all(request.as_bytes()).await.expect("write");
        let mut response = String::new();
        tls.read_to_string(&mut response).await.expect("read");
        (served, response)
    }

    #[tokio::test]
    async fn it_converts_over_tls_and_serves_a_rotated_certificate_without_a_restart() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let dir = std::env::temp_dir().join(format!("pgkube-webhook-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let first = write_certificate(&dir);
        let stop = CancellationToken::new();
        let certificates = CertificateFiles::load(&dir).expect("certificate");
        let address = serve_tls(
            "127.0.0.1:0".parse().expect("address"),
            router(DEFAULT_BODY_LIMIT),
            certificates,
            stop.clone(),
        )
        .await
        .expect("serving");
        let review = json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {
                "uid": "u-1",
                "desiredAPIVersion": "db.example.com/v1beta1",
                "objects": [cluster_v1alpha1()],
            },
        })
        .to_string();
        let (served, response) = post(address, std::slice::from_ref(&first), &review).await;
        assert_eq!(served, first);
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.contains(r#""postgresVersion":"16""#), "{response}");

        let second = write_certificate(&dir);
        let (served, _) = post(address, &[first, second.clone()], &review).await;
        assert_eq!(served, second, "the rotated certificate is served");
        stop.cancel();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_or_unreadable_certificate_is_a_clear_error() {
        let dir = std::env::temp_dir().join(format!("pgkube-webhook-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let load = |dir: &Path| CertificateFiles::load(dir).map_err(WebhookError::from);
        let missing = load(&dir).expect_err("no files");
        assert!(missing.to_string().contains("tls.crt"), "{missing}");
        std::fs::write(dir.join("tls.crt"), "not a certificate").expect("write");
        std::fs::write(dir.join("tls.key"), "not a key").expect("write");
        let unreadable = load(&dir).expect_err("bad files");
        assert!(
            unreadable
                .to_string()
                .starts_with("the webhook's certificate: "),
            "{unreadable}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
