use rustls::pki_types::UnixTime;

use super::*;
use crate::cluster::certificates::server_hosts;
use crate::pki::{self, Issued};

fn ca(name: &str) -> Issued {
    let now = time::OffsetDateTime::now_utc();
    pki::new_ca(name, now, time::Duration::days(10)).expect("CA")
}

fn server(ca: &Issued, hosts: &[String]) -> Issued {
    let now = time::OffsetDateTime::now_utc();
    pki::issue_server(ca, hosts, now, time::Duration::days(5)).expect("server certificate")
}

fn check_now(cert: &Issued, key_pem: &str, ca: &Issued, hosts: &[String]) -> Result<(), String> {
    verify(
        cert.cert_pem.as_bytes(),
        key_pem.as_bytes(),
        ca.cert_pem.as_bytes(),
        hosts,
        UnixTime::now(),
    )
}

#[test]
fn the_hosts_are_the_services_and_every_pod() {
    let names = ChildNames::for_cluster("db");
    assert_eq!(
        required_hosts(&names, "ns", 2),
        [
            "db-rw.ns.svc",
            "db-ro.ns.svc",
            "db-r.ns.svc",
            "db-postgresql-0.db-postgresql-headless.ns.svc",
            "db-postgresql-1.db-postgresql-headless.ns.svc",
        ]
    );
}

#[test]
fn a_certificate_for_the_services_and_pods_signed_by_the_ca_is_accepted() {
    let names = ChildNames::for_cluster("db");
    let ca = ca("user CA");
    let cert = server(&ca, &server_hosts(&names, "ns"));
    let hosts = required_hosts(&names, "ns", 3);
    assert_eq!(check_now(&cert, &cert.key_pem, &ca, &hosts), Ok(()));
}

#[test]
fn a_certificate_without_the_pods_names_is_refused_with_the_host() {
    let names = ChildNames::for_cluster("db");
    let ca = ca("user CA");
    let cert = server(&ca, &["db-rw.ns.svc".to_owned()]);
    let why = check_now(&cert, &cert.key_pem, &ca, &required_hosts(&names, "ns", 1))
        .expect_err("refused");
    assert!(why.starts_with("not valid for db-ro.ns.svc"), "{why}");
}

#[test]
fn a_certificate_of_another_ca_or_with_another_key_is_refused() {
    let names = ChildNames::for_cluster("db");
    let hosts = required_hosts(&names, "ns", 1);
    let (ca, other) = (ca("user CA"), ca("another CA"));
    let cert = server(&other, &server_hosts(&names, "ns"));
    let why = check_now(&cert, &cert.key_pem, &ca, &hosts).expect_err("another CA");
    assert!(why.contains("UnknownIssuer"), "{why}");
    let cert = server(&ca, &server_hosts(&names, "ns"));
    let why = check_now(&cert, &other.key_pem, &ca, &hosts).expect_err("another key");
    assert!(
        why.starts_with("tls.key is not the key of tls.crt"),
        "{why}"
    );
    let why = check_now(&cert, "", &ca, &hosts).expect_err("no key");
    assert!(why.starts_with("tls.key holds no private key"), "{why}");
}

#[test]
fn the_issued_secret_gets_both_cas_and_the_digest_of_the_added_one() {
    let patch = trust_patch("d1gest", ca_bundle(b"pgkube CA", b"own CA\n"));
    assert_eq!(
        patch,
        serde_json::json!({
            "metadata": {"annotations": {"db.example.com/tls-trusted-ca": "d1gest"}},
            // base64 of "pgkube CA\nown CA\n"
            "data": {"ca.crt": "cGdrdWJlIENBCm93biBDQQo="},
        })
    );
    assert_eq!(ca_bundle(b"a\n", b"b"), b"a\nb");
}
