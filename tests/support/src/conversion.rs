//! The conversion webhook on the test bed: a CA for its serving certificates, and the CRDs
//! with both versions converting through a webhook at a loopback address.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use k8s_openapi::ByteString;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use pgkube_crds::{ConversionWebhook, StorageVersion};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A CA, and serving certificates for 127.0.0.1 that it signs.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    pub fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "pgkube test CA");
        let key = KeyPair::generate().expect("CA key");
        TestCa {
            issuer: CertifiedIssuer::self_signed(params, key).expect("CA certificate"),
        }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA's key, PEM.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// A new serving certificate for 127.0.0.1 and its key, PEM.
    pub fn serving_certificate(&self) -> (String, String) {
        self.server_certificate(&["127.0.0.1".to_owned()])
    }

    /// A new server certificate for `hosts` (names or addresses, `*.` wildcards) and its key,
    /// PEM.
    pub fn server_certificate(&self, hosts: &[String]) -> (String, String) {
        let mut params = CertificateParams::new(hosts.to_vec()).expect("parameters");
        // A subject of its own: OpenSSL takes a leaf named as its issuer for self-signed.
        let name = hosts.first().map_or("server", String::as_str);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("key");
        let certificate = params.signed_by(&key, &self.issuer).expect("certificate");
        (certificate.pem(), key.serialize_pem())
    }

    /// A new client certificate for the role `common_name` and its key, PEM.
    pub fn client_certificate(&self, common_name: &str) -> (String, String) {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("parameters");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().expect("key");
        let certificate = params.signed_by(&key, &self.issuer).expect("certificate");
        (certificate.pem(), key.serialize_pem())
    }

    /// A new serving certificate for 127.0.0.1, written as `tls.crt` and `tls.key` in `dir`.
    pub fn write_serving_certificate(&self, dir: &Path) {
        let (certificate, key) = self.serving_certificate();
        std::fs::write(dir.join("tls.crt"), certificate).expect("tls.crt");
        std::fs::write(dir.join("tls.key"), key).expect("tls.key");
    }

    /// A new directory `pgkube-<name>-<pid>` under the temporary directory, holding a new
    /// serving certificate for 127.0.0.1 (a manager's `--webhook-cert-dir`). The caller removes
    /// it.
    pub fn serving_certificate_dir(&self, name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pgkube-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("certificate directory");
        self.write_serving_certificate(&dir);
        dir
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

/// `pgkube crd`'s CRDs (both versions, v1beta1 stored), converting through
/// `https://<address>/convert` and trusting `ca_pem` (none when empty).
pub fn converting_crds(address: SocketAddr, ca_pem: &str) -> Vec<CustomResourceDefinition> {
    converting_crds_storing(address, ca_pem, StorageVersion::V1beta1)
}

/// [`converting_crds`], storing in `storage`.
pub fn converting_crds_storing(
    address: SocketAddr,
    ca_pem: &str,
    storage: StorageVersion,
) -> Vec<CustomResourceDefinition> {
    let webhook = ConversionWebhook::Url(format!("https://{address}/convert"));
    let mut crds = pgkube_crds::crds_converting_through(&webhook, storage);
    for crd in &mut crds {
        let config = crd
            .spec
            .conversion
            .as_mut()
            .and_then(|c| c.webhook.as_mut())
            .and_then(|w| w.client_config.as_mut())
            .expect("pgkube's CRDs convert through a webhook");
        config.ca_bundle =
            Some(ByteString(ca_pem.as_bytes().to_vec())).filter(|pem| !pem.0.is_empty());
    }
    crds
}
