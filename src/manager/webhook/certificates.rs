//! The webhook's CA and serving certificate when the manager manages them (pure): made with
//! rcgen, kept in a Secret (`ca.crt`, `ca.key`, `tls.crt`, `tls.key`, and `ca-previous.crt`
//! after a CA rotation; the serving certificate's hosts and expiry and the CA's expiry in
//! annotations).
//!
//! The CA is valid ten years, a serving certificate one. A serving certificate is renewed with
//! the same CA when the hosts change or it expires within 30 days. The CA itself is rotated when
//! it would expire before a serving certificate made now (or when its expiry is unknown, as in
//! Secrets written before rotation existed): a new CA signs the new serving certificate, and the
//! old CA stays trusted beside it (`ca-previous.crt`, in [`Bundle::trusted_cas`]), so that the
//! API server accepts the certificate of a replica that has not reloaded yet as well as the new.

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
/// Annotation with the CA's expiry, in Unix seconds.
pub const CA_NOT_AFTER_ANNOTATION: &str = "db.example.com/webhook-ca-not-after";
/// Secret key of the CA that signed the serving certificates before the last rotation.
const PREVIOUS_CA_KEY: &str = "ca-previous.crt";
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
    /// When the CA expires, in Unix seconds (0: unknown).
    pub ca_not_after: i64,
    /// The CA before the last rotation, still trusted, as PEM.
    pub previous_ca_cert: Option<String>,
}

impl Bundle {
    /// A new CA, and a serving certificate for `hosts` that it signs.
    pub fn new(hosts: &[String], now: OffsetDateTime) -> Result<Bundle, CertificateError> {
        let ca = Ca::new(now)?;
        serving(&ca, hosts, now)
    }

    /// A new serving certificate for `hosts`, signed by this bundle's CA, or by a new CA if
    /// this one needs rotating (the old one then stays trusted beside it).
    pub fn renewed(
        &self,
        hosts: &[String],
        now: OffsetDateTime,
    ) -> Result<Bundle, CertificateError> {
        if self.ca_needs_rotation(now) {
            let mut rotated = serving(&Ca::new(now)?, hosts, now)?;
            rotated.previous_ca_cert = Some(self.ca_cert.clone());
            return Ok(rotated);
        }
        let ca = Ca {
            cert: self.ca_cert.clone(),
            key: KeyPair::from_pem(&self.ca_key)?,
            not_after: self.ca_not_after,
        };
        let mut renewed = serving(&ca, hosts, now)?;
        renewed.previous_ca_cert = self.previous_ca_cert.clone();
        Ok(renewed)
    }

    /// Whether the serving certificate must be replaced: other hosts, expiry within 30 days, or
    /// a CA that needs rotating.
    pub fn needs_renewal(&self, hosts: &[String], now: OffsetDateTime) -> bool {
        self.hosts != hosts
            || self.not_after - now.unix_timestamp() < RENEW_BEFORE.whole_seconds()
            || self.ca_needs_rotation(now)
    }

    /// Whether the CA would expire before a serving certificate made now (plus its renewal
    /// margin), or its expiry is unknown.
    fn ca_needs_rotation(&self, now: OffsetDateTime) -> bool {
        let needed = (now + SERVING_VALIDITY + RENEW_BEFORE).unix_timestamp();
        self.ca_not_after < needed
    }

    /// The CAs the API server must trust, as one PEM bundle: this CA, and the previous one
    /// after a rotation.
    pub fn trusted_cas(&self) -> String {
        match &self.previous_ca_cert {
            Some(previous) => format!("{}{previous}", with_final_newline(&self.ca_cert)),
            None => self.ca_cert.clone(),
        }
    }

    /// The Secret's data.
    pub fn data(&self) -> BTreeMap<String, ByteString> {
        [
            ("ca.crt", Some(&self.ca_cert)),
            ("ca.key", Some(&self.ca_key)),
            ("tls.crt", Some(&self.tls_cert)),
            ("tls.key", Some(&self.tls_key)),
            (PREVIOUS_CA_KEY, self.previous_ca_cert.as_ref()),
        ]
        .into_iter()
        .filter_map(|(key, pem)| Some((key.to_owned(), ByteString(pem?.as_bytes().to_vec()))))
        .collect()
    }

    /// The Secret's annotations.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (HOSTS_ANNOTATION.to_owned(), self.hosts.join(",")),
            (NOT_AFTER_ANNOTATION.to_owned(), self.not_after.to_string()),
            (
                CA_NOT_AFTER_ANNOTATION.to_owned(),
                self.ca_not_after.to_string(),
            ),
        ])
    }

    /// The bundle a Secret holds. Missing annotations read as no hosts and an expired
    /// certificate and CA, so that the bundle is renewed (and the CA rotated).
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
        let seconds = |key: &str| {
            annotations
                .get(key)
                .and_then(|text| text.parse().ok())
                .unwrap_or(0)
        };
        Ok(Bundle {
            ca_cert: text("ca.crt")?,
            ca_key: text("ca.key")?,
            tls_cert: text("tls.crt")?,
            tls_key: text("tls.key")?,
            hosts,
            not_after: seconds(NOT_AFTER_ANNOTATION),
            ca_not_after: seconds(CA_NOT_AFTER_ANNOTATION),
            previous_ca_cert: text(PREVIOUS_CA_KEY).ok(),
        })
    }
}

fn with_final_newline(pem: &str) -> String {
    if pem.ends_with('\n') {
        pem.to_owned()
    } else {
        format!("{pem}\n")
    }
}

/// A CA: its certificate (PEM), key and expiry.
struct Ca {
    cert: String,
    key: KeyPair,
    not_after: i64,
}

impl Ca {
    fn new(now: OffsetDateTime) -> Result<Ca, CertificateError> {
        let key = KeyPair::generate()?;
        let params = ca_params(now);
        let not_after = params.not_after.unix_timestamp();
        let cert = params.self_signed(&key)?.pem();
        Ok(Ca {
            cert,
            key,
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

/// A serving certificate for `hosts`, signed by `ca`.
fn serving(ca: &Ca, hosts: &[String], now: OffsetDateTime) -> Result<Bundle, CertificateError> {
    let mut params = CertificateParams::new(hosts.to_vec())?;
    params.distinguished_name = name(hosts.first().map_or("pgkube webhook", String::as_str));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = now - Duration::hours(1);
    let not_after = now + SERVING_VALIDITY;
    params.not_after = not_after;
    let issuer = Issuer::new(ca_params(now), &ca.key);
    let key = KeyPair::generate()?;
    let certificate = params.signed_by(&key, &issuer)?;
    Ok(Bundle {
        ca_cert: ca.cert.clone(),
        ca_key: ca.key.serialize_pem(),
        tls_cert: certificate.pem(),
        tls_key: key.serialize_pem(),
        hosts: hosts.to_vec(),
        not_after: not_after.unix_timestamp(),
        ca_not_after: ca.not_after,
        previous_ca_cert: None,
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

    /// Whether `leaf_pem` verifies for 127.0.0.1 at `at` against the CAs in `cas_pem`.
    fn verifies_against(cas_pem: &str, leaf_pem: &str, at: OffsetDateTime) -> bool {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(cas_pem.as_bytes()) {
            roots.add(ca.expect("CA")).expect("root");
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder(std::sync::Arc::new(roots))
            .build()
            .expect("verifier");
        let leaf = CertificateDer::from_pem_slice(leaf_pem.as_bytes()).expect("leaf");
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let seconds = u64::try_from(at.unix_timestamp()).expect("after 1970");
        let at =
            rustls::pki_types::UnixTime::since_unix_epoch(std::time::Duration::from_secs(seconds));
        verifier
            .verify_server_cert(&leaf, &[], &name, &[], at)
            .is_ok()
    }

    #[test]
    fn a_ca_that_would_expire_before_a_new_certificate_is_rotated_and_the_old_stays_trusted() {
        let now = OffsetDateTime::now_utc();
        let first = Bundle::new(&hosts(), now).expect("bundle");
        assert!(!first.ca_needs_rotation(now));
        assert_eq!(first.trusted_cas(), first.ca_cert);
        // Nine years and a half later the CA has half a year left: less than a certificate's year.
        let later = now + Duration::days(3650 - 180);
        assert!(first.needs_renewal(&hosts(), later));
        let rotated = first.renewed(&hosts(), later).expect("rotated");
        assert_ne!(rotated.ca_cert, first.ca_cert);
        assert_eq!(rotated.previous_ca_cert.as_ref(), Some(&first.ca_cert));
        assert!(rotated.ca_not_after > (later + Duration::days(3000)).unix_timestamp());
        assert!(!rotated.needs_renewal(&hosts(), later));
        // The API server trusts both: the new certificate, and the old one a replica that has not
        // reloaded yet still serves; the new CA alone would refuse the old certificate.
        let trusted = rotated.trusted_cas();
        assert!(verifies_against(&trusted, &rotated.tls_cert, later));
        assert!(verifies_against(&trusted, &first.tls_cert, now));
        assert!(!verifies_against(&rotated.ca_cert, &first.tls_cert, now));
        // The previous CA survives the Secret and a later renewal with the new CA.
        let read = Bundle::from_secret(&rotated.data(), &rotated.annotations()).expect("read");
        assert_eq!(read, rotated);
        let renewed = read
            .renewed(&["localhost".to_owned()], later)
            .expect("renewed");
        assert_eq!(renewed.ca_cert, rotated.ca_cert);
        assert_eq!(renewed.previous_ca_cert, rotated.previous_ca_cert);
    }

    #[test]
    fn a_ca_of_unknown_expiry_is_rotated() {
        let now = OffsetDateTime::now_utc();
        let bundle = Bundle::new(&hosts(), now).expect("bundle");
        let mut annotations = bundle.annotations();
        annotations.remove(CA_NOT_AFTER_ANNOTATION);
        let read = Bundle::from_secret(&bundle.data(), &annotations).expect("read");
        assert!(read.needs_renewal(&hosts(), now));
        let rotated = read.renewed(&hosts(), now).expect("rotated");
        assert_eq!(rotated.previous_ca_cert, Some(bundle.ca_cert));
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
