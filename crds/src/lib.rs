//! pgkube API types, group `db.example.com`: version [`v1beta1`] (stored, and the one pgkube's
//! controllers use; its types are also at the crate root), version [`v1alpha1`] (still served
//! beside it), and the lossless [`conversion`] between them, which the manager's conversion
//! webhook serves to the API server for v1alpha1 clients.
//!
//! Three kinds, each namespaced with a status subresource:
//! - [`PostgreSQLCluster`]: a PostgreSQL instance set (StatefulSet, Services, config, credentials)
//!   with optional scheduled backups to S3-compatible storage;
//! - [`PostgreSQLBackup`]: one logical backup of a cluster;
//! - [`PostgreSQLRestore`]: one restore of a backup into a cluster.
//!
//! Validation that the API server can do lives in the schema (ranges, enums, patterns, defaults)
//! and in CEL rules (cross-field rules, immutability); the controllers check the rest and report it
//! as conditions.

mod admission;
mod api_docs;
mod archiving;
mod backup;
mod cluster;
mod common;
pub mod conversion;
mod progress;
mod recovery;
mod restore;
pub mod v1alpha1;
pub mod v1beta1;

pub use admission::{
    ADMISSION_PATH, ADMISSION_WEBHOOK, admission_in_namespaces, admission_through,
    admission_trusting, admission_yaml,
};
pub use api_docs::api_markdown;
pub use v1beta1::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, ServiceReference, WebhookClientConfig,
    WebhookConversion,
};
use kube::core::crd::merge_crds;

/// The API group of every pgkube kind.
pub const GROUP: &str = "db.example.com";
/// The most instances a cluster can have: the maximum of `spec.replicas` in every version's
/// schema (a test checks the generated CRD against it).
pub const MAX_REPLICAS: i32 = 10;
/// The finalizer the manager's admission webhook puts on clusters as they are created, and the
/// cluster controller on any cluster that lacks it.
pub const CLEANUP_FINALIZER: &str = "db.example.com/cleanup";

/// Where the API server calls the manager's webhook: ConversionReviews for pgkube's CRDs, and
/// AdmissionReviews for [`admission_through`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConversionWebhook {
    /// A Service in the cluster, on port 443 (`deploy/`'s `pgkube-webhook`).
    Service { namespace: String, name: String },
    /// An HTTPS URL, for a manager outside the cluster (`deploy/local-up`).
    Url(String),
}

impl Default for ConversionWebhook {
    /// The `pgkube-webhook` Service in `pgkube-system`, as `deploy/` installs it.
    fn default() -> Self {
        ConversionWebhook::Service {
            namespace: "pgkube-system".to_owned(),
            name: "pgkube-webhook".to_owned(),
        }
    }
}

/// The version the API server stores objects in: v1beta1, the version the controllers read, so
/// that what they and kubectl read needs no conversion. v1alpha1 only to go back to a pgkube that
/// read it, followed by `pgkube migrate-storage` (`docs/api-versions.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StorageVersion {
    V1alpha1,
    #[default]
    V1beta1,
}

impl StorageVersion {
    /// The version's name, as in `spec.versions[].name`.
    pub fn name(self) -> &'static str {
        match self {
            StorageVersion::V1alpha1 => "v1alpha1",
            StorageVersion::V1beta1 => "v1beta1",
        }
    }
}

/// The path the manager serves ConversionReviews on.
pub const CONVERSION_PATH: &str = "/convert";

/// The CRDs of all pgkube kinds, in a stable order, as `pgkube crd` prints them: `v1beta1`
/// (the storage version) and `v1alpha1` both served, converting through the manager's webhook
/// behind `deploy/`'s `pgkube-webhook` Service.
pub fn crds() -> Vec<CustomResourceDefinition> {
    crds_converting_through(&ConversionWebhook::default(), StorageVersion::default())
}

/// [`crds`], converting through `webhook` and storing in `storage`. No `caBundle`: the manager
/// sets it when it manages its certificate, or cert-manager's CA injector does (see the README).
pub fn crds_converting_through(
    webhook: &ConversionWebhook,
    storage: StorageVersion,
) -> Vec<CustomResourceDefinition> {
    v1alpha1::crds()
        .into_iter()
        .zip(v1beta1::crds())
        .map(|(alpha, beta)| {
            // Both come from the same kinds with the same names and scope, and `storage` is one
            // of their versions: merging cannot fail.
            let mut crd = merge_crds(vec![alpha, beta], storage.name())
                .expect("each kind's two versions share names and scope");
            crd.spec.conversion = Some(conversion_through(webhook));
            crd
        })
        .collect()
}

/// `crds` with each conversion webhook trusting `ca_pem` (PEM, one or more CA certificates), for
/// a certificate neither the manager nor cert-manager manages. CRDs that do not convert through
/// a webhook are left as they are.
pub fn crds_trusting(
    mut crds: Vec<CustomResourceDefinition>,
    ca_pem: &[u8],
) -> Vec<CustomResourceDefinition> {
    let configs = (crds.iter_mut()).filter_map(|crd| {
        crd.spec
            .conversion
            .as_mut()?
            .webhook
            .as_mut()?
            .client_config
            .as_mut()
    });
    for config in configs {
        config.ca_bundle = Some(k8s_openapi::ByteString(ca_pem.to_vec()));
    }
    crds
}

fn conversion_through(webhook: &ConversionWebhook) -> CustomResourceConversion {
    let (url, service) = match webhook {
        ConversionWebhook::Service { namespace, name } => (
            None,
            Some(ServiceReference {
                namespace: namespace.clone(),
                name: name.clone(),
                path: Some(CONVERSION_PATH.to_owned()),
                port: Some(443),
            }),
        ),
        ConversionWebhook::Url(url) => (Some(url.clone()), None),
    };
    CustomResourceConversion {
        strategy: "Webhook".to_owned(),
        webhook: Some(WebhookConversion {
            client_config: Some(WebhookClientConfig {
                url,
                service,
                ca_bundle: None,
            }),
            conversion_review_versions: vec!["v1".to_owned()],
        }),
    }
}

/// CRDs as one multi-document YAML stream; [`crds`] gives exactly what is committed in `crds/`.
pub fn crd_yaml(crds: &[CustomResourceDefinition]) -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for crd in crds {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(crd)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each CRD's webhook client configuration, as `(url, caBundle)`.
    fn clients(crds: &[CustomResourceDefinition]) -> Vec<(Option<String>, Option<Vec<u8>>)> {
        (crds.iter())
            .map(|crd| {
                let conversion = crd.spec.conversion.as_ref().expect("a conversion");
                let webhook = conversion.webhook.as_ref().expect("a webhook");
                let config = webhook.client_config.as_ref().expect("a client config");
                (
                    config.url.clone(),
                    config.ca_bundle.as_ref().map(|b| b.0.clone()),
                )
            })
            .collect()
    }

    #[test]
    fn a_given_ca_is_trusted_by_every_crds_webhook_and_nothing_else_changes() {
        let url = "https://127.0.0.1:18443/convert".to_owned();
        let plain = crds_converting_through(
            &ConversionWebhook::Url(url.clone()),
            StorageVersion::V1alpha1,
        );
        assert_eq!(clients(&plain), vec![(Some(url.clone()), None); 3]);
        let pem = b"-----BEGIN CERTIFICATE-----\n...\n-----END CERTIFICATE-----\n";
        let trusting = crds_trusting(plain.clone(), pem);
        assert_eq!(clients(&trusting), vec![(Some(url), Some(pem.to_vec())); 3]);
        // Nothing else changed: without the bundles, they are the CRDs as before.
        let mut unbundled = trusting;
        for crd in &mut unbundled {
            let conversion = crd.spec.conversion.as_mut().expect("a conversion");
            let webhook = conversion.webhook.as_mut().expect("a webhook");
            webhook
                .client_config
                .as_mut()
                .expect("a client config")
                .ca_bundle = None;
        }
        assert_eq!(unbundled, plain);
    }

    #[test]
    fn crds_without_a_webhook_are_left_alone() {
        let alone = v1beta1::crds();
        assert_eq!(crds_trusting(alone.clone(), b"ca"), alone);
    }
}
