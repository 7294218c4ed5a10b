//! The registration of the manager's admission webhook (pure): a MutatingWebhookConfiguration
//! that sends the API server's creations of PostgreSQLClusters to the manager, which puts
//! [`CLEANUP_FINALIZER`](crate::CLEANUP_FINALIZER) on them as they are created.
//!
//! Why at admission: the cluster controller would otherwise add the finalizer with a write of its
//! own, and reconcile once more on that write's echo, before it can make the cluster's children.
//! Set at creation (as the API server's own PVC protection plugin sets its finalizer), it costs
//! neither. The webhook is an optimisation, never a dependency: its failure policy is `Ignore`,
//! so with the manager down a cluster is still created, and the controller adds the finalizer
//! itself as before.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::api::ObjectMeta;

use crate::ConversionWebhook;

/// The name of the MutatingWebhookConfiguration and of its one webhook's prefix.
pub const ADMISSION_WEBHOOK: &str = "pgkube";
/// The path the manager serves AdmissionReviews on.
pub const ADMISSION_PATH: &str = "/mutate";
/// The label the API server sets on every namespace, to the namespace's name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// The API server waits this long for an answer, then creates the cluster without one.
const TIMEOUT_SECONDS: i32 = 5;

/// The MutatingWebhookConfiguration that sends PostgreSQLCluster creations (every served
/// version) to `webhook`: a Service (on [`ADMISSION_PATH`]) or a whole HTTPS URL.
pub fn admission_through(webhook: &ConversionWebhook) -> MutatingWebhookConfiguration {
    let (url, service) = match webhook {
        ConversionWebhook::Service { namespace, name } => (
            None,
            Some(ServiceReference {
                namespace: namespace.clone(),
                name: name.clone(),
                path: Some(ADMISSION_PATH.to_owned()),
                port: Some(443),
            }),
        ),
        ConversionWebhook::Url(url) => (Some(url.clone()), None),
    };
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(ADMISSION_WEBHOOK.to_owned()),
            labels: Some([("app.kubernetes.io/name".to_owned(), "pgkube".to_owned())].into()),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![MutatingWebhook {
            name: format!("postgresqlclusters.{}", crate::GROUP),
            admission_review_versions: vec!["v1".to_owned()],
            client_config: WebhookClientConfig {
                url,
                service,
                ca_bundle: None,
            },
            failure_policy: Some("Ignore".to_owned()),
            match_policy: Some("Equivalent".to_owned()),
            reinvocation_policy: Some("Never".to_owned()),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![crate::GROUP.to_owned()]),
                api_versions: Some(vec!["*".to_owned()]),
                operations: Some(vec!["CREATE".to_owned()]),
                resources: Some(vec!["postgresqlclusters".to_owned()]),
                scope: Some("Namespaced".to_owned()),
            }]),
            side_effects: "None".to_owned(),
            timeout_seconds: Some(TIMEOUT_SECONDS),
            ..MutatingWebhook::default()
        }]),
    }
}

/// `configuration` with each webhook called only for the clusters created in `namespaces` (a
/// `namespaceSelector` on the label the API server gives every namespace, its name), as a
/// manager watching those namespaces alone needs: other managers' clusters never reach it.
pub fn admission_in_namespaces(
    mut configuration: MutatingWebhookConfiguration,
    namespaces: &[String],
) -> MutatingWebhookConfiguration {
    let selector = LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: NAMESPACE_NAME_LABEL.to_owned(),
            operator: "In".to_owned(),
            values: Some(namespaces.to_vec()),
        }]),
        match_labels: None,
    };
    for webhook in configuration.webhooks.iter_mut().flatten() {
        webhook.namespace_selector = Some(selector.clone());
    }
    configuration
}

/// `configuration` with each webhook trusting `ca_pem` (PEM, one or more CA certificates), for a
/// certificate neither the manager nor cert-manager manages.
pub fn admission_trusting(
    mut configuration: MutatingWebhookConfiguration,
    ca_pem: &[u8],
) -> MutatingWebhookConfiguration {
    for webhook in configuration.webhooks.iter_mut().flatten() {
        webhook.client_config.ca_bundle = Some(ByteString(ca_pem.to_vec()));
    }
    configuration
}

/// The configuration as one YAML document, as `pgkube admission-webhook` prints it and
/// `deploy/manager/admission-webhook.yaml` holds it.
pub fn admission_yaml(
    configuration: &MutatingWebhookConfiguration,
) -> Result<String, serde_yaml::Error> {
    Ok(format!("---\n{}", serde_yaml::to_string(configuration)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creations_of_clusters_go_to_the_service_and_failures_are_ignored() {
        let configuration = admission_through(&ConversionWebhook::default());
        let webhook = &configuration.webhooks.as_ref().expect("one webhook")[0];
        let service = webhook.client_config.service.as_ref().expect("a Service");
        assert_eq!(
            (service.namespace.as_str(), service.name.as_str()),
            ("pgkube-system", "pgkube-webhook")
        );
        assert_eq!(service.path.as_deref(), Some(ADMISSION_PATH));
        assert_eq!(webhook.failure_policy.as_deref(), Some("Ignore"));
        let rule = &webhook.rules.as_ref().expect("rules")[0];
        assert_eq!(rule.operations.as_deref(), Some(&["CREATE".to_owned()][..]));
        assert_eq!(
            rule.resources.as_deref(),
            Some(&["postgresqlclusters".to_owned()][..])
        );
    }

    #[test]
    fn a_url_is_used_as_given() {
        let url = "https://127.0.0.1:9443/mutate".to_owned();
        let configuration = admission_through(&ConversionWebhook::Url(url.clone()));
        let webhook = &configuration.webhooks.as_ref().expect("one webhook")[0];
        assert_eq!(webhook.client_config.url.as_ref(), Some(&url));
        assert!(webhook.client_config.service.is_none());
    }

    #[test]
    fn by_default_every_namespace_is_admitted_and_no_ca_is_trusted() {
        let configuration = admission_through(&ConversionWebhook::default());
        let webhook = &configuration.webhooks.as_ref().expect("one webhook")[0];
        assert!(webhook.namespace_selector.is_none());
        assert!(webhook.client_config.ca_bundle.is_none());
    }

    #[test]
    fn a_scoped_configuration_selects_its_namespaces_by_their_name_label() {
        let namespaces = ["pgkube-demo".to_owned(), "team-b".to_owned()];
        let configuration = admission_in_namespaces(
            admission_through(&ConversionWebhook::default()),
            &namespaces,
        );
        let webhook = &configuration.webhooks.as_ref().expect("one webhook")[0];
        let selector = serde_json::to_value(webhook.namespace_selector.as_ref()).expect("JSON");
        assert_eq!(
            selector,
            serde_json::json!({"matchExpressions": [{
                "key": "kubernetes.io/metadata.name",
                "operator": "In",
                "values": ["pgkube-demo", "team-b"],
            }]})
        );
        assert_eq!(
            (configuration.webhooks.as_ref()).map(Vec::len),
            Some(1),
            "still one webhook"
        );
    }

    #[test]
    fn a_given_ca_is_trusted_by_every_webhook() {
        let pem = b"-----BEGIN CERTIFICATE-----\n...\n-----END CERTIFICATE-----\n";
        let configuration =
            admission_trusting(admission_through(&ConversionWebhook::default()), pem);
        for webhook in configuration.webhooks.iter().flatten() {
            assert_eq!(
                webhook
                    .client_config
                    .ca_bundle
                    .as_ref()
                    .map(|b| b.0.as_slice()),
                Some(&pem[..])
            );
        }
    }
}
