//! Certificates pgkube makes for a cluster's PostgreSQL (pure): a CA, the server certificate it
//! signs for the cluster's host names, and client certificates whose common name is the role
//! they log in as (PostgreSQL's `cert` authentication). Made with rcgen; each comes as PEM. And
//! the other way: a `ca.crt` read into what a TLS client trusts.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot make a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("the CA's certificate or key cannot be read: {0}")]
    Ca(rcgen::Error),
}

/// The CA certificates of `ca_pem` (a `ca.crt`), as what a TLS client trusts.
pub fn root_store(ca_pem: &[u8]) -> Result<rustls::RootCertStore, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|error| format!("ca.crt is not PEM: {error}"))?;
        roots
            .add(cert)
            .map_err(|error| format!("ca.crt is not a CA certificate: {error}"))?;
    }
    if roots.is_empty() {
        return Err("ca.crt holds no certificate".to_owned());
    }
    Ok(roots)
}

/// A certificate, its private key (PEM) and when it expires (Unix seconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub not_after: i64,
}

/// A certificate is valid from an hour before it was made: clocks of the nodes may differ.
const BACKDATE: Duration = Duration::hours(1);

/// A new self-signed CA named `common_name`, valid for `validity`.
pub fn new_ca(
    common_name: &str,
    now: OffsetDateTime,
    validity: Duration,
) -> Result<Issued, PkiError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = name(common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = now - BACKDATE;
    params.not_after = now + validity;
    let cert = params.self_signed(&key)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_after: params.not_after.unix_timestamp(),
    })
}

/// A server certificate for `hosts` (DNS names, wildcards, or IP addresses), signed by `ca`.
pub fn issue_server(
    ca: &Issued,
    hosts: &[String],
    now: OffsetDateTime,
    validity: Duration,
) -> Result<Issued, PkiError> {
    let mut params = CertificateParams::new(hosts.to_vec())?;
    params.distinguished_name = name(hosts.first().map_or("postgresql", String::as_str));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    sign(ca, params, now, validity)
}

/// A client certificate for the role `user`, signed by `ca`.
pub fn issue_client(
    ca: &Issued,
    user: &str,
    now: OffsetDateTime,
    validity: Duration,
) -> Result<Issued, PkiError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = name(user);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    sign(ca, params, now, validity)
}

fn sign(
    ca: &Issued,
    mut params: CertificateParams,
    now: OffsetDateTime,
    validity: Duration,
) -> Result<Issued, PkiError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(PkiError::Ca)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key).map_err(PkiError::Ca)?;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.use_authority_key_identifier_extension = true;
    params.not_before = now - BACKDATE;
    // A leaf never outlives the CA that signed it.
    let not_after = (now + validity)
        .min(OffsetDateTime::from_unix_timestamp(ca.not_after).unwrap_or(now + validity));
    params.not_after = not_after;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_after: not_after.unix_timestamp(),
    })
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

    fn verifier(ca: &Issued) -> std::sync::Arc<rustls::client::WebPkiServerVerifier> {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).expect("CA"))
            .expect("root");
        rustls::client::WebPkiServerVerifier::builder(std::sync::Arc::new(roots))
            .build()
            .expect("verifier")
    }

    fn server_verifies(ca: &Issued, leaf: &Issued, host: &str) -> bool {
        use rustls::client::danger::ServerCertVerifier;
        let leaf = CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).expect("leaf");
        let name = ServerName::try_from(host.to_owned()).expect("name");
        verifier(ca)
            .verify_server_cert(&leaf, &[], &name, &[], UnixTime::now())
            .is_ok()
    }

    #[test]
    fn a_server_certificate_verifies_for_its_hosts_and_wildcards_only() {
        let now = OffsetDateTime::now_utc();
        let ca = new_ca("pgkube test CA", now, Duration::days(10)).expect("CA");
        let hosts = vec!["db-rw.ns.svc".to_owned(), "*.db-headless.ns.svc".to_owned()];
        let server = issue_server(&ca, &hosts, now, Duration::days(1)).expect("server");
        assert!(server_verifies(&ca, &server, "db-rw.ns.svc"));
        assert!(server_verifies(&ca, &server, "db-0.db-headless.ns.svc"));
        assert!(!server_verifies(&ca, &server, "db-ro.ns.svc"));
        let other = new_ca("another CA", now, Duration::days(10)).expect("CA");
        assert!(!server_verifies(&other, &server, "db-rw.ns.svc"));
    }

    #[test]
    fn a_leaf_never_outlives_its_ca() {
        let now = OffsetDateTime::now_utc();
        let ca = new_ca("short CA", now, Duration::days(2)).expect("CA");
        let client = issue_client(&ca, "streaming_replica", now, Duration::days(90)).expect("leaf");
        assert_eq!(client.not_after, ca.not_after);
        let short = issue_client(&ca, "postgres", now, Duration::hours(1)).expect("leaf");
        assert_eq!(short.not_after, (now + Duration::hours(1)).unix_timestamp());
    }
}
