//! TLS on the test bed's real node: a two-instance cluster refuses a connection without TLS,
//! serves `verify-full` clients through `-rw` with a certificate from its own CA (and fails one
//! that expects another name), streams to its replica over TLS with the replication role's
//! client certificate, answers `/status` on its instance managers' port only over TLS and to the
//! control token, and renews its certificates, here valid for 45 s, while clients keep
//! connecting and no server restarts. A cluster with a server certificate of its own
//! (`spec.certificates`) serves it, verified with its own CA by clients, replicas and the
//! operator, and loads a new one put in its Secret without a restart; one that does not name
//! the cluster's hosts is refused before any pod is made. One added to a running cluster is
//! rolled out (replicas first, then a switchover) and cannot be removed.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::Running;
use common::own_tls::{own_hosts, put_tls_secret, streaming_over_tls};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use pgkube_controllers::cluster::build::STATUS_PORT;
use pgkube_crds::PrimaryChangeKind;
use pgkube_testkit::tokio_postgres::{self, NoTls};
use pgkube_testkit::{
    TestCa, TestCluster, served_certificate, server_tls_secret_name, status_port_answer,
    verify_full, wait_until,
};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::json;

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

#[tokio::test]
async fn a_cluster_serves_its_own_certificate_and_loads_a_new_one_without_restarts() {
    let Some(running) = Running::start("tls-own", RESYNC).await else {
        return;
    };
    let namespace = running.namespace.name().to_owned();
    let secrets = running.api::<Secret>();
    let ca = TestCa::new();
    // As cert-manager writes it: the CA beside the certificate and its key.
    let hosts = own_hosts(&namespace);
    put_tls_secret(&secrets, "own-server", &ca, &hosts).await;
    refuses_a_certificate_without_the_clusters_names(&running, &ca).await;

    let cluster = TestCluster::builder("own")
        .replicas(2)
        .spec(|spec| {
            spec.certificates = Some(pgkube_crds::ServerCertificates {
                server_tls_secret: "own-server".to_owned(),
                server_ca_secret: None,
                client_ca_secret: None,
            });
        })
        .start(&running.namespace)
        .await
        .expect("Running: the operator reads the instances over TLS with the user's CA");
    let ca_pem = ca.pem();
    assert_eq!(cluster.server_ca().await.expect("the CA"), ca_pem);
    let sql = cluster
        .sql()
        .await
        .expect("verify-full through rw, the user's CA");
    let address = cluster.addresses().await.expect("rw")[0];
    let rw_host = format!("own-rw.{namespace}.svc");
    let own = secret_certificate(&secrets, "own-server").await;
    assert_eq!(
        served_certificate(address, &rw_host, &ca_pem)
            .await
            .expect("the served certificate"),
        own
    );
    assert!(
        secrets
            .get_opt(&server_tls_secret_name("own"))
            .await
            .expect("a lookup")
            .is_none(),
        "pgkube issues no server certificate of its own"
    );
    status_port_is_tls_and_token_only(&cluster, &ca_pem).await;
    // The replica verifies the primary with the user's CA; the primary verifies the
    // replication role's certificate with pgkube's.
    wait_until("the replica streams over TLS", STREAM_TIMEOUT, || async {
        Ok(streaming_over_tls(&sql).await?.then_some(()))
    })
    .await
    .expect("replication over TLS");

    let started = start_times(&cluster).await.expect("start times");
    put_tls_secret(&secrets, "own-server", &ca, &hosts).await;
    let renewed = secret_certificate(&secrets, "own-server").await;
    assert_ne!(renewed, own);
    wait_until(
        "the server presents the new certificate",
        RENEWAL_TIMEOUT,
        || async {
            let served = served_certificate(address, &rw_host, &ca_pem).await?;
            Ok((served == renewed).then_some(()))
        },
    )
    .await
    .expect("the new certificate served");
    assert_eq!(
        start_times(&cluster).await.expect("start times"),
        started,
        "no server restarted"
    );
    running.stop().await;
}

/// Adding a certificate of one's own to a running cluster replaces its pods, the primary last
/// after a switchover: the first new replica (the user's certificate, both CAs trusted)
/// streams from the old primary (pgkube's certificate), which a replica trusting only the
/// user's CA refused, stalling the roll. Then the cluster serves the user's certificate, keeps
/// its data, and refuses to have it removed.
#[tokio::test]
async fn a_certificate_of_ones_own_added_to_a_running_cluster_is_rolled_out() {
    let Some(running) = Running::start("tls-add", RESYNC).await else {
        return;
    };
    let namespace = running.namespace.name().to_owned();
    let secrets = running.api::<Secret>();
    let cluster = TestCluster::builder("own")
        .replicas(2)
        .start(&running.namespace)
        .await
        .expect("Running with pgkube's certificates");
    let old_primary = cluster
        .wait_healthy(None, ROLL_TIMEOUT)
        .await
        .expect("healthy");
    cluster
        .sql()
        .await
        .expect("verify-full with pgkube's CA")
        .batch_execute("CREATE TABLE kept (id int); INSERT INTO kept VALUES (1)")
        .await
        .expect("a row");
    let before = pod_uids(&cluster).await;
    let plain_logins = PlainLogins::watch(&cluster).await;

    let ca = TestCa::new();
    put_tls_secret(&secrets, "own-server", &ca, &own_hosts(&namespace)).await;
    let own = json!({"serverTLSSecret": "own-server"});
    set_certificates(&cluster, own)
        .await
        .expect("certificates may be added");
    let change = cluster
        .wait_primary_change(PrimaryChangeKind::Switchover, &old_primary, ROLL_TIMEOUT)
        .await
        .unwrap_or_else(|error| panic!("the primary moves by a switchover: {error:#}"));
    wait_until("every pod to be replaced", ROLL_TIMEOUT, || async {
        let now = pod_uids(&cluster).await;
        let replaced = now.len() == before.len()
            && now.iter().all(|(name, uid)| before.get(name) != Some(uid));
        Ok(replaced.then_some(()))
    })
    .await
    .expect("every pod replaced");
    cluster
        .wait_healthy(Some(&change.to), ROLL_TIMEOUT)
        .await
        .expect("healthy on the new template");
    let (tries, accepted) = plain_logins.stop().await;
    assert!(tries > 0, "plain logins were tried during the roll");
    assert_eq!(
        accepted,
        Vec::<String>::new(),
        "no plain login during the roll"
    );

    let ca_pem = ca.pem();
    assert_eq!(cluster.server_ca().await.expect("the CA"), ca_pem);
    let address = cluster.addresses().await.expect("rw")[0];
    let served = served_certificate(address, &format!("own-rw.{namespace}.svc"), &ca_pem)
        .await
        .expect("the served certificate, verified with the user's CA");
    assert_eq!(served, secret_certificate(&secrets, "own-server").await);
    let sql = cluster.sql().await.expect("verify-full with the user's CA");
    let kept: i64 = sql
        .query_one("SELECT count(*) FROM kept", &[])
        .await
        .expect("the table")
        .get(0);
    assert_eq!(kept, 1, "the data survives the roll");
    wait_until("the replica streams over TLS", STREAM_TIMEOUT, || async {
        Ok(streaming_over_tls(&sql).await?.then_some(()))
    })
    .await
    .expect("replication over TLS");
    status_port_is_tls_and_token_only(&cluster, &ca_pem).await;

    let refused = set_certificates(&cluster, serde_json::Value::Null)
        .await
        .expect_err("certificates may not be removed");
    assert!(
        refused
            .to_string()
            .contains("certificates can be added to a running cluster but not changed or removed"),
        "{refused}"
    );
    running.stop().await;
}

/// Logins without TLS as the superuser, to every pod in turn, while a roll goes on.
struct PlainLogins {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<(usize, Vec<String>)>,
}

impl PlainLogins {
    async fn watch(cluster: &TestCluster) -> Self {
        let (user, password) = cluster.credentials().await.expect("credentials");
        let cluster = cluster.clone();
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let (mut tries, mut accepted) = (0, Vec::new());
            while stopped.try_recv().is_err() {
                for pod in cluster.pods().await.unwrap_or_default() {
                    let Some(address) = pod.address else { continue };
                    tries += 1;
                    let login = tokio_postgres::Config::new()
                        .host(address.to_string())
                        .user(&user)
                        .password(&password)
                        .dbname("postgres")
                        .ssl_mode(tokio_postgres::config::SslMode::Disable)
                        .connect_timeout(Duration::from_secs(2))
                        .connect(NoTls)
                        .await;
                    if login.is_ok() {
                        accepted.push(pod.name);
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (tries, accepted)
        });
        Self { stop, task }
    }

    /// How many logins were tried, and the pods that accepted one.
    async fn stop(self) -> (usize, Vec<String>) {
        let _ = self.stop.send(());
        self.task.await.expect("the watch ends")
    }
}

/// How long a roll of two pods with a switchover may take.
const ROLL_TIMEOUT: Duration = Duration::from_secs(300);

/// Sets (or, with null, removes) the cluster's `spec.certificates`.
async fn set_certificates(
    cluster: &TestCluster,
    certificates: serde_json::Value,
) -> kube::Result<pgkube_crds::PostgreSQLCluster> {
    let patch = json!({"spec": {"certificates": certificates}});
    cluster
        .api()
        .patch(
            cluster.name(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
}

/// Each instance pod's uid, by name.
async fn pod_uids(cluster: &TestCluster) -> BTreeMap<String, String> {
    let pods = cluster.pods().await.expect("pods");
    pods.into_iter().map(|pod| (pod.name, pod.uid)).collect()
}

/// How long a certificate put in a Secret may take to be served: the kubelet's sync of the
/// volume, then the instance manager's look.
const RENEWAL_TIMEOUT: Duration = Duration::from_secs(180);

/// A cluster whose certificate names only its -rw Service is refused with the reason, and
/// none of its pods is made.
async fn refuses_a_certificate_without_the_clusters_names(running: &Running, ca: &TestCa) {
    let namespace = running.namespace.name();
    let secrets = running.api::<Secret>();
    put_tls_secret(
        &secrets,
        "narrow",
        ca,
        &[format!("narrow-rw.{namespace}.svc")],
    )
    .await;
    TestCluster::builder("narrow")
        .spec(|spec| {
            spec.certificates = Some(pgkube_crds::ServerCertificates {
                server_tls_secret: "narrow".to_owned(),
                server_ca_secret: None,
                client_ca_secret: None,
            });
        })
        .create(&running.namespace)
        .await
        .expect("the cluster is created");
    let events = common::events_with_reason(running, "narrow", "ReconcileFailed").await;
    let note = events[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("Secret narrow (spec.certificates) cannot be used: not valid for narrow-ro"),
        "{note}"
    );
    let statefulsets = running.api::<k8s_openapi::api::apps::v1::StatefulSet>();
    assert!(
        statefulsets
            .get_opt("narrow-postgresql")
            .await
            .expect("a lookup")
            .is_none(),
        "no pod is made to mount it"
    );
}

/// Each pod's status port: `/status` refused in plain HTTP (403), and over TLS (the pod's
/// certificate verified against the cluster's CA) refused without the control token (401),
/// answered with it.
async fn status_port_is_tls_and_token_only(cluster: &TestCluster, ca: &str) {
    let token = cluster.control_token().await.expect("the control token");
    for pod in cluster.pods().await.expect("pods") {
        let address = SocketAddr::new(pod.address.expect("an address"), STATUS_PORT);
        let host = cluster.pod_host(&pod.name);
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
