//! `POST /mutate`: the admission webhook that puts the cleanup finalizer on a PostgreSQLCluster
//! as it is created, so that the cluster controller need not write it and reconcile on its echo
//! (see [`pgkube_crds::admission_through`] for the registration and why it is safe to miss).
//!
//! It allows every request: it only ever adds the finalizer, to a creation that lacks it. A body
//! that is not an AdmissionReview gets a 400 with the reason.

use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use pgkube_crds::CLEANUP_FINALIZER;

pub async fn mutate(body: Bytes) -> Response {
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(&body) {
        Ok(review) => review,
        Err(error) => {
            let message = format!("the body is not an AdmissionReview: {error}");
            return (StatusCode::BAD_REQUEST, message).into_response();
        }
    };
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(_) => {
            let message = "the AdmissionReview has no request";
            return (StatusCode::BAD_REQUEST, message).into_response();
        }
    };
    match serde_json::to_vec(&answer(&request).into_review()) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(error) => {
            let message = format!("cannot encode the AdmissionReview: {error}");
            (StatusCode::INTERNAL_SERVER_ERROR, message).into_response()
        }
    }
}

/// The answer to one AdmissionRequest (pure): allowed, with a patch that adds
/// [`CLEANUP_FINALIZER`] when the request creates an object without it.
pub fn answer(request: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    let Some(patch) = finalizer_patch(request) else {
        return response;
    };
    match response.clone().with_patch(patch) {
        Ok(patched) => patched,
        // A JSON Patch of plain strings always serialises; were it not to, the object is let
        // through unchanged and the controller adds the finalizer.
        Err(error) => {
            tracing::warn!(%error, "cannot encode the finalizer patch");
            response
        }
    }
}

/// The JSON Patch that adds the finalizer to a created object that lacks it.
fn finalizer_patch(request: &AdmissionRequest<DynamicObject>) -> Option<json_patch::Patch> {
    if request.operation != Operation::Create {
        return None;
    }
    let finalizers = request.object.as_ref()?.metadata.finalizers.as_ref();
    let operation = match finalizers {
        Some(list) if list.iter().any(|f| f == CLEANUP_FINALIZER) => return None,
        // The list is replaced whole rather than appended to with `/-`: the API server applies
        // the patch to the very object the review carried, so the list is the one seen here.
        Some(list) => {
            let mut list = list.clone();
            list.push(CLEANUP_FINALIZER.to_owned());
            serde_json::json!({"op": "add", "path": "/metadata/finalizers", "value": list})
        }
        None => serde_json::json!({
            "op": "add", "path": "/metadata/finalizers", "value": [CLEANUP_FINALIZER],
        }),
    };
    serde_json::from_value(serde_json::json!([operation])).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An AdmissionRequest as the API server sends it, for `operation` of a cluster with
    /// `finalizers`.
    fn request(operation: &str, finalizers: Option<&[&str]>) -> AdmissionRequest<DynamicObject> {
        let mut metadata = serde_json::json!({"name": "db", "namespace": "team"});
        if let Some(finalizers) = finalizers {
            metadata["finalizers"] = serde_json::json!(finalizers);
        }
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "db.example.com", "version": "v1alpha1", "kind": "PostgreSQLCluster"},
                "resource": {"group": "db.example.com", "version": "v1alpha1", "resource": "postgresqlclusters"},
                "name": "db",
                "namespace": "team",
                "operation": operation,
                "userInfo": {"username": "admin"},
                "object": {
                    "apiVersion": "db.example.com/v1beta1",
                    "kind": "PostgreSQLCluster",
                    "metadata": metadata,
                    "spec": {"replicas": 1, "postgresVersion": "15", "storage": {"size": "1Gi"}},
                },
                "dryRun": false,
            },
        });
        let review: AdmissionReview<DynamicObject> =
            serde_json::from_value(review).expect("an AdmissionReview");
        review.try_into().expect("a request")
    }

    /// The object after the answer's patch, and the answer's uid and verdict.
    fn patched(request: &AdmissionRequest<DynamicObject>) -> (serde_json::Value, String, bool) {
        let response = answer(request);
        let mut object = serde_json::to_value(request.object.as_ref().expect("an object"))
            .expect("serialisable");
        if let Some(patch) = &response.patch {
            let patch: json_patch::Patch = serde_json::from_slice(patch).expect("a JSON Patch");
            json_patch::patch(&mut object, &patch).expect("the patch applies");
        }
        (object, response.uid, response.allowed)
    }

    fn finalizers(object: &serde_json::Value) -> Vec<&str> {
        object["metadata"]["finalizers"]
            .as_array()
            .map(|list| list.iter().filter_map(|f| f.as_str()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn a_created_cluster_gets_the_finalizer() {
        let (object, uid, allowed) = patched(&request("CREATE", None));
        assert!(allowed);
        assert_eq!(uid, "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(finalizers(&object), [CLEANUP_FINALIZER]);
        assert_eq!(object["spec"]["replicas"], 1, "nothing else changes");
    }

    #[test]
    fn other_finalizers_are_kept() {
        let (object, _, _) = patched(&request("CREATE", Some(&["example.com/keep"])));
        assert_eq!(finalizers(&object), ["example.com/keep", CLEANUP_FINALIZER]);
    }

    #[test]
    fn a_cluster_that_has_it_and_other_operations_are_let_through_unchanged() {
        for request in [
            request("CREATE", Some(&[CLEANUP_FINALIZER])),
            request("UPDATE", None),
        ] {
            let response = answer(&request);
            assert!(response.allowed);
            assert!(response.patch.is_none());
        }
    }
}
