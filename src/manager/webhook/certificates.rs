//! The webhook's CA and serving certificate when the manager manages them (pure): made with
//! rcgen, kept in a Secret (`ca.crt`, `ca.key`, `tls.crt`, `tls.key`, with the serving
//! certificate's hosts and expiry in annotations), renewed with the same CA when the hosts
//! change or expiry is near. The CA is valid ten years, a serving certificate one; a new one is
//! made 30 days before the old expires.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

/// Annotation with the serving certificate's hosts, comma-separated.
pub const HOSTS_ANNOTATION: &str = "db.example.com/webhook-hosts";
/// Annotation with the serving certificate's expiry, in Unix seconds.
pub const NOT_AFTER_ANNOTATION: &str = "db.example.com/webhook-not-after";
const CA_VALIDITY: Duration = Duration::days(3650);
const SERVING_VALIDITY: Duration = Duration::days(365);
const RENEW_BEFORE: Duration = Duration::days(30);
const CA_NAME: &str = "pgkube webhook CA";

/// Why a certificate could not be made or read back.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("cannot make the webhook certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("the webhook Secret has no {0}")]
    Missing(&'static str),
}

/// A CA and the serving certificate it signed, as PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    pub ca_cert: String,
    pub ca_key: String,
    pub tls_cert: String,
    pub tls_key: String,
    /// The serving certificate's host names and IP addresses.
    pub hosts: Vec<String>,
    /// When the serving certificate expires, in Unix seconds.
    pub not_after: i64,
}

impl Bundle {
    /// A new CA, and a serving certificate for `hosts` that it signs.
    pub fn new(hosts: &[String], now: OffsetDateTime) -> Result<Bundle, CertificateError> {
        let ca_key = KeyPair::generate()?;
        let ca_cert = ca_params(now).self_signed(&ca_key)?;
        serving(ca_cert.pem(), &ca_key, hosts, now)
    }

    /// A new serving certificate for `hosts`, signed by this bundle's CA.
    pub fn renewed(
        &self,
        hosts: &[String],
        now: OffsetDateTime,
    ) -> Result<Bundle, CertificateError> {
        let ca_key = KeyPair::from_pem(&self.ca_key)?;
        serving(self.ca_cert.clone(), &ca_key, hosts, now)
    }

    /// Whether the serving certificate must be replaced: other hosts, or expiry within 30
    /// days.
    pub fn needs_renewal(&self, hosts: &[String], now: OffsetDateTime) -> bool {
        self.hosts != hosts || self.not_after - now.unix_timestamp() < RENEW_BEFORE.whole_seconds()
    }

    /// The Secret's data.
    pub fn data(&self) -> BTreeMap<String, ByteString> {
        [
            ("ca.crt", &self.ca_cert),
            ("ca.key", &self.ca_key),
            ("tls.crt", &self.tls_cert),
            ("tls.key", &self.tls_key),
        ]
        .into_iter()
        .map(|(key, pem)| (key.to_owned(), ByteString(pem.as_bytes().to_vec())))
        .collect()
    }

    /// The Secret's annotations.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (HOSTS_ANNOTATION.to_owned(), self.hosts.join(",")),
            (NOT_AFTER_ANNOTATION.to_owned(), self.not_after.to_string()),
        ])
    }

    /// The bundle a Secret holds. Missing annotations read as no hosts and an expired
    /// certificate, so that the bundle is renewed.
    pub fn from_secret(
        data: &BTreeMap<String, ByteString>,
        annotations: &BTreeMap<String, String>,
    ) -> Result<Bundle, CertificateError> {
        let text = |key: &'static str| {
            data.get(key)
                .map(|bytes| String::from_utf8_lossy(&bytes.0).into_owned())
                .ok_or(CertificateError::Missing(key))
        };
        let hosts = annotations
            .get(HOSTS_ANNOTATION)
            .map(|hosts| {
                hosts
                    .split(',')
                    .filter(|h| !h.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let not_after = annotations
            .get(NOT_AFTER_ANNOTATION)
            .and_then(|text| text.parse().ok())
            .unwrap_or(0);
        Ok(Bundle {
            ca_cert: text("ca.crt")?,
            ca_key: text("ca.key")?,
            tls_cert: text("tls.crt")?,
            tls_key: text("tls.key")?,
            hosts,
            not_after,
        })
    }
}

/// The CA's parameters; always the same name, so that a CA key read back signs as that CA.
fn ca_params(now: OffsetDateTime) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = name(CA_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = now - Duration::hours(1);
    params.not_after = now + CA_VALIDITY;
    params
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

/// A serving certificate for `hosts`, signed by the CA of `ca_cert` and `ca_key`.
fn serving(
    ca_cert: String,
    ca_key: &KeyPair,
    hosts: &[String],
    now: OffsetDateTime,
) -> Result<Bundle, CertificateError> {
    let mut params = CertificateParams::new(hosts.to_vec())?;
    params.distinguished_name = name(hosts.first().map_or("pgkube webhook", String::as_str));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = now - Duration::hours(1);
    let not_after = now + SERVING_VALIDITY;
    params.not_after = not_after;
    let issuer = Issuer::new(ca_params(now), ca_key);
    let key = KeyPair::generate()?;
    let certificate = params.signed_by(&key, &issuer)?;
    Ok(Bundle {
        ca_cert,
        ca_key: ca_key.serialize_pem(),
        tls_cert: certificate.pem(),
        tls_key: key.serialize_pem(),
        hosts: hosts.to_vec(),
        not_after: not_after.unix_timestamp(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    fn hosts() -> Vec<String> {
        vec![
            "pgkube-webhook.pgkube-system.svc".to_owned(),
            "127.0.0.1".to_owned(),
        ]
    }

    /// Whether `bundle`'s serving certificate verifies for `host` against its CA.
    fn verifies(bundle: &Bundle, host: &str) -> bool {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let mut roots = rustls::RootCertStore::empty();
        let ca = CertificateDer::from_pem_slice(bundle.ca_cert.as_bytes()).expect("CA");
        roots.add(ca).expect("root");
        let verifier = rustls::client::WebPkiServerVerifier::builder(std::sync::Arc::new(roots))
            .build()
            .expect("verifier");
        let leaf = CertificateDer::from_pem_slice(bundle.tls_cert.as_bytes()).expect("leaf");
        let name = rustls::pki_types::ServerName::try_from(host.to_owned()).expect("name");
        verifier
            .verify_server_cert(&leaf, &[], &name, &[], rustls::pki_types::UnixTime::now())
            .is_ok()
    }

    #[test]
    fn the_serving_certificate_verifies_against_the_ca_for_each_host_and_no_other() {
        let bundle = Bundle::new(&hosts(), OffsetDateTime::now_utc()).expect("bundle");
        assert!(verifies(&bundle, "pgkube-webhook.pgkube-system.svc"));
        assert!(verifies(&bundle, "127.0.0.1"));
        assert!(!verifies(&bundle, "elsewhere.example.com"));
    }

    #[test]
    fn a_renewal_keeps_the_ca_so_the_api_servers_ca_bundle_stays_valid() {
        let now = OffsetDateTime::now_utc();
        let first = Bundle::new(&hosts(), now).expect("bundle");
        assert!(!first.needs_renewal(&hosts(), now));
        assert!(first.needs_renewal(&hosts(), now + Duration::days(340)));
        let more = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
        assert!(first.needs_renewal(&more, now));
        let renewed = first.renewed(&more, now).expect("renewed");
        assert_eq!(renewed.ca_cert, first.ca_cert);
        assert_ne!(renewed.tls_cert, first.tls_cert);
        assert!(verifies(&renewed, "localhost"));
    }

    #[test]
    fn a_bundle_survives_its_secret_and_a_secret_without_annotations_is_renewed() {
        let now = OffsetDateTime::now_utc();
        let bundle = Bundle::new(&hosts(), now).expect("bundle");
        let read = Bundle::from_secret(&bundle.data(), &bundle.annotations()).expect("read");
        assert_eq!(read, bundle);
        let bare = Bundle::from_secret(&bundle.data(), &BTreeMap::new()).expect("read");
        assert!(bare.needs_renewal(&hosts(), now));
        let mut partial = bundle.data();
        partial.remove("ca.key");
        let missing = Bundle::from_secret(&partial, &BTreeMap::new()).expect_err("no CA key");
        assert_eq!(missing.to_string(), "the webhook Secret has no ca.key");
    }
}
