//! Client certificates for applications on the test bed's real node: with the applications'
//! client CA (`spec.certificates.clientCASecret`) a remote login needs its password and a
//! certificate of that CA naming its role, while pgkube's own logins keep pgkube's.

mod common;

use std::time::Duration;

use common::Running;
use common::own_tls::{own_hosts, put_tls_secret, streaming_over_tls};
use k8s_openapi::api::core::v1::Secret;
use pgkube_testkit::tokio_postgres;
use pgkube_testkit::{TestCa, TestCluster, verify_full, wait_until};
use serde_json::json;

const RESYNC: Duration = Duration::from_secs(30);
const STREAM_TIMEOUT: Duration = Duration::from_secs(120);

/// With the applications' client CA (`spec.certificates.clientCASecret`), a remote login needs
/// both its password and a client certificate of that CA naming its role; pgkube's own logins
/// (replication, the operator and the testkit's superuser) keep working with pgkube's.
#[tokio::test]
async fn with_an_applications_client_ca_a_login_needs_a_certificate_naming_its_role() {
    let Some(running) = Running::start("tls-client-ca", RESYNC).await else {
        return;
    };
    let namespace = running.namespace.name().to_owned();
    let secrets = running.api::<Secret>();
    let (server_ca, apps_ca, stranger_ca) = (TestCa::new(), TestCa::new(), TestCa::new());
    put_tls_secret(&secrets, "own-server", &server_ca, &own_hosts(&namespace)).await;
    let apps_ca_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "apps-ca"},
        "stringData": {"ca.crt": apps_ca.pem()},
    }))
    .expect("a Secret");
    secrets
        .create(&Default::default(), &apps_ca_secret)
        .await
        .expect("the client CA Secret");
    let cluster = TestCluster::builder("own")
        .replicas(2)
        .spec(|spec| {
            spec.certificates = Some(pgkube_crds::ServerCertificates {
                server_tls_secret: "own-server".to_owned(),
                server_ca_secret: None,
                client_ca_secret: Some("apps-ca".to_owned()),
            });
        })
        .start(&running.namespace)
        .await
        .expect("Running with the client CA");
    let sql = cluster.sql().await.expect("the superuser, by certificate");
    wait_until("the replica streams over TLS", STREAM_TIMEOUT, || async {
        Ok(streaming_over_tls(&sql).await?.then_some(()))
    })
    .await
    .expect("replication with pgkube's client certificate");

    let app = cluster.application_secret().await.expect("the app Secret");
    let address = cluster.addresses().await.expect("rw")[0];
    let server_pem = server_ca.pem();
    let login = pgkube_testkit::Login {
        host: &format!("own-rw.{namespace}.svc"),
        user: &app.username,
        password: &app.password,
        database: &app.dbname,
    };
    let with_certificate = |ca: &TestCa, role: &str| {
        let (certificate, key) = ca.client_certificate(role);
        pgkube_testkit::verify_full_with_certificate(&server_pem, &certificate, &key)
            .expect("a connector")
    };
    let refused = |outcome: Result<tokio_postgres::Client, tokio_postgres::Error>, case: &str| {
        let error = outcome.err().unwrap_or_else(|| panic!("{case}: accepted"));
        format!("{case}: {error:?}")
    };
    let no_certificate =
        pgkube_testkit::connect(address, &login, verify_full(&server_pem).expect("tls")).await;
    let message = refused(no_certificate, "the password alone");
    assert!(message.contains("certificate"), "{message}");
    let other_role =
        pgkube_testkit::connect(address, &login, with_certificate(&apps_ca, "someone-else")).await;
    refused(other_role, "a certificate naming another role");
    let stranger = pgkube_testkit::connect(
        address,
        &login,
        with_certificate(&stranger_ca, &app.username),
    )
    .await;
    refused(stranger, "a certificate of another CA");
    let wrong_password = pgkube_testkit::Login {
        password: "not-the-password",
        ..login
    };
    let without_password = pgkube_testkit::connect(
        address,
        &wrong_password,
        with_certificate(&apps_ca, &app.username),
    )
    .await;
    refused(without_password, "the certificate without the password");
    let app_sql =
        pgkube_testkit::connect(address, &login, with_certificate(&apps_ca, &app.username))
            .await
            .expect("the password and a certificate naming the role");
    let user: String = app_sql
        .query_one("SELECT current_user::text", &[])
        .await
        .expect("a query")
        .get(0);
    assert_eq!(user, app.username);
    running.stop().await;
}
