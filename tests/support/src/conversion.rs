//! The conversion webhook on the test bed: a CA for its serving certificates, and the CRDs
//! with both versions converting through a webhook at a loopback address.

use std::net::SocketAddr;
use std::path::Path;

use k8s_openapi::ByteString;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, WebhookClientConfig, WebhookConversion,
};
use kube::core::crd::merge_crds;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

/// A CA, and serving certificates for 127.0.0.1 that it signs.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    pub fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("CA key");
        TestCa {
            issuer: CertifiedIssuer::self_signed(params, key).expect("CA certificate"),
        }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A new serving certificate for 127.0.0.1, written as `tls.crt` and `tls.key` in `dir`.
    pub fn write_serving_certificate(&self, dir: &Path) {
        let params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("parameters");
        let key = KeyPair::generate().expect("key");
        let certificate = params.signed_by(&key, &self.issuer).expect("certificate");
        std::fs::write(dir.join("tls.crt"), certificate.pem()).expect("tls.crt");
        std::fs::write(dir.join("tls.key"), key.serialize_pem()).expect("tls.key");
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

/// Each kind's CRD with both versions (v1alpha1 stored) and a webhook conversion to
/// `https://<address>/convert`, trusting `ca_pem` (none when empty).
pub fn converting_crds(address: SocketAddr, ca_pem: &str) -> Vec<CustomResourceDefinition> {
    pgkube_crds::crds()
        .into_iter()
        .zip(pgkube_crds::v1beta1::crds())
        .map(|(alpha, beta)| {
            let mut crd = merge_crds(vec![alpha, beta], "v1alpha1").expect("merged CRD");
            crd.spec.conversion = Some(CustomResourceConversion {
                strategy: "Webhook".to_owned(),
                webhook: Some(WebhookConversion {
                    client_config: Some(WebhookClientConfig {
                        url: Some(format!("https://{address}/convert")),
                        ca_bundle: Some(ByteString(ca_pem.as_bytes().to_vec()))
                            .filter(|pem| !pem.0.is_empty()),
                        service: None,
                    }),
                    conversion_review_versions: vec!["v1".to_owned()],
                }),
            });
            crd
        })
        .collect()
}
