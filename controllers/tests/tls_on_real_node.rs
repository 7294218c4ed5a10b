//! TLS on the test bed's real node: a two-instance cluster refuses a connection without TLS,
//! serves `verify-full` clients through `-rw` with a certificate from its own CA (and fails one
//! that expects another name), streams to its replica over TLS with the replication role's
//! client certificate, answers `/status` on its instance managers' port only over TLS and to the
//! control token, and renews its certificates, here valid for 45 s, while clients keep
//! connecting and no server restarts.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::Running;
use k8s_openapi::api::core::v1::Secret;
use pgkube_controllers::cluster::build::STATUS_PORT;
use pgkube_testkit::tokio_postgres::{self, NoTls};
use pgkube_testkit::{
    TestCluster, served_certificate, server_tls_secret_name, status_port_answer, verify_full,
    wait_until,
};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

const RESYNC: Duration = Duration::from_secs(30);
/// Renewed two thirds in: every 30 s.
const VALIDITY: Duration = Duration::from_secs(45);
const STREAM_TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test]
async fn a_cluster_speaks_tls_only_replicates_with_certificates_and_renews_them_without_restarts() {
    let Some(running) = Running::start_with("tls", RESYNC, |settings| {
        settings.postgres_certificate_validity = VALIDITY;
    })
    .await
    else {
        return;
    };
    let cluster = TestCluster::builder("tls")
        .replicas(2)
        .start(&running.namespace)
        .await
        .expect("the cluster becomes Running");

    // The testkit's connections are verify-full: the CA from the cluster's Secret, the name of
    // the -rw Service.
    let sql = cluster.sql().await.expect("verify-full through rw");
    let address = cluster.addresses().await.expect("rw")[0];
    let (user, password) = cluster.credentials().await.expect("credentials");
    let plain = tokio_postgres::Config::new()
        .host(address.ip().to_string())
        .port(address.port())
        .user(&user)
        .password(&password)
        .dbname("postgres")
        .ssl_mode(tokio_postgres::config::SslMode::Disable)
        .connect(NoTls)
        .await
        .map(drop)
        .expect_err("a connection without TLS is refused");
    let refusal = plain.as_db_error().map(|error| error.message().to_owned());
    assert!(
        refusal
            .as_deref()
            .is_some_and(|message| message.contains("no encryption")),
        "refused for the lack of TLS: {plain:?}"
    );
    let ca = cluster.server_ca().await.expect("the cluster's CA");
    let elsewhere = tokio_postgres::Config::new()
        .host(format!("elsewhere.{}.svc", cluster.namespace()))
        .hostaddr(address.ip())
        .port(address.port())
        .user(&user)
        .password(&password)
        .dbname("postgres")
        .ssl_mode(tokio_postgres::config::SslMode::Require)
        .connect(verify_full(&ca).expect("connector"))
        .await;
    assert!(
        elsewhere.is_err(),
        "the certificate does not cover another name"
    );

    status_port_is_tls_and_token_only(&cluster, &ca).await;

    wait_until(
        "the replica streams over TLS with the replication role's certificate",
        STREAM_TIMEOUT,
        || async { Ok(streaming_over_tls(&sql).await?.then_some(())) },
    )
    .await
    .expect("replication over TLS");

    let started = start_times(&cluster).await.expect("start times");
    let pods = cluster.pods().await.expect("pods");
    let rw_host = format!("tls-rw.{}.svc", cluster.namespace());
    let secrets = running.api::<Secret>();
    let server_secret = server_tls_secret_name("tls");
    let issued = secret_certificate(&secrets, &server_secret).await;
    assert_eq!(
        served_certificate(address, &rw_host, &ca)
            .await
            .expect("the served certificate"),
        issued,
        "the server presents the certificate of its Secret"
    );
    let renewed = wait_until(
        "the server presents a renewed certificate, clients connecting all along",
        VALIDITY * 2,
        || async {
            // Each look is a new verify-full connection, which must succeed.
            let sql = cluster
                .sql()
                .await
                .expect("a client connects during the renewal");
            sql.simple_query("SELECT 1")
                .await
                .expect("and runs a query");
            let current = secret_certificate(&secrets, &server_secret).await;
            let served = served_certificate(address, &rw_host, &ca).await?;
            Ok((current != issued && served == current).then_some(current))
        },
    )
    .await
    .expect("a renewal");
    assert_ne!(renewed, issued);

    assert_eq!(
        start_times(&cluster).await.expect("start times"),
        started,
        "no server restarted for the renewal"
    );
    let uids = |pods: &[pgkube_testkit::InstancePod]| -> Vec<String> {
        pods.iter().map(|pod| pod.uid.clone()).collect()
    };
    assert_eq!(
        uids(&cluster.pods().await.expect("pods")),
        uids(&pods),
        "no pod was replaced"
    );
    let sql = cluster.sql().await.expect("verify-full after the renewal");
    wait_until(
        "the replica streams with its renewed certificate",
        STREAM_TIMEOUT,
        || async { Ok(streaming_over_tls(&sql).await?.then_some(())) },
    )
    .await
    .expect("replication after the renewal");
    running.stop().await;
}

/// Each pod's status port: `/status` refused in plain HTTP (403), and over TLS (the pod's
/// certificate verified against the cluster's CA) refused without the control token (401),
/// answered with it.
async fn status_port_is_tls_and_token_only(cluster: &TestCluster, ca: &str) {
    let token = cluster.control_token().await.expect("the control token");
    for pod in cluster.pods().await.expect("pods") {
        let address = SocketAddr::new(pod.address.expect("an address"), STATUS_PORT);
        let host = format!(
            "{}.tls-postgresql-headless.{}.svc",
            pod.name,
            cluster.namespace()
        );
        let tls = Some((host.as_str(), ca));
        let code = |answer: anyhow::Result<(u16, String)>| answer.expect("an answer").0;
        let answers = (
            code(status_port_answer(address, None, None).await),
            code(status_port_answer(address, tls, None).await),
            code(status_port_answer(address, tls, Some(&token)).await),
        );
        assert_eq!(answers, (403, 401, 200), "{}", pod.name);
    }
}

/// Whether the primary's replication connection is TLS, authenticated as `streaming_replica`.
async fn streaming_over_tls(sql: &tokio_postgres::Client) -> anyhow::Result<bool> {
    let rows = sql
        .query(
            "SELECT s.ssl, s.client_dn FROM pg_stat_replication r \
             JOIN pg_stat_ssl s USING (pid) WHERE r.state = 'streaming'",
            &[],
        )
        .await?;
    Ok(rows.len() == 1
        && rows[0].get::<_, bool>(0)
        && rows[0].get::<_, Option<String>>(1).as_deref() == Some("/CN=streaming_replica"))
}

/// When each instance's server started, by pod.
async fn start_times(cluster: &TestCluster) -> anyhow::Result<BTreeMap<String, String>> {
    let mut times = BTreeMap::new();
    for pod in cluster.pods().await? {
        let sql = cluster.sql_to_pod(&pod.name).await?;
        let row = sql
            .query_one("SELECT pg_postmaster_start_time()::text", &[])
            .await?;
        times.insert(pod.name, row.get(0));
    }
    Ok(times)
}

/// The certificate (DER) in Secret `name`'s `tls.crt`.
async fn secret_certificate(secrets: &kube::Api<Secret>, name: &str) -> Vec<u8> {
    let secret = secrets
        .get(name)
        .await
        .expect("the server certificate's Secret");
    let pem = secret
        .data
        .as_ref()
        .and_then(|data| data.get("tls.crt"))
        .expect("tls.crt")
        .0
        .clone();
    CertificateDer::from_pem_slice(&pem)
        .expect("a PEM certificate")
        .to_vec()
}
