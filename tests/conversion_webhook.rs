//! The conversion webhook with the API server in the loop: a real `pgkube run` serves it over
//! TLS on 127.0.0.1 with a certificate from a directory, and the test bed's API server calls it
//! for every request in a version other than the stored one (v1alpha1).
//!
//! The test installs the CRDs with both versions and a conversion stanza that names the
//! manager's address and the test's CA, and puts the v1alpha1-only CRDs back before it ends.
//! It checks: an object created in v1alpha1 reads the same in v1beta1 and back; a field only
//! v1beta1 has survives an update through v1alpha1; the controllers work on an object written
//! in v1beta1; a restart with a rotated certificate keeps serving; with the webhook down, a v1beta1
//! request fails with an API error that says so, and the stored objects are unchanged.

mod manager_common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, WebhookClientConfig, WebhookConversion,
};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::crd::merge_crds;
use kube::{Client, ResourceExt};
use manager_common::Manager;
use pgkube_crds::v1beta1;
use pgkube_testkit::{CRD_FIELD_MANAGER, TestNamespace, install_crds, testbed, wait_until};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// A CA, and serving certificates for 127.0.0.1 that it signs.
struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("CA key");
        TestCa {
            issuer: CertifiedIssuer::self_signed(params, key).expect("CA certificate"),
        }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A new serving certificate for 127.0.0.1, written as `tls.crt` and `tls.key` in `dir`.
    fn write_serving_certificate(&self, dir: &Path) {
        let params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("parameters");
        let key = KeyPair::generate().expect("key");
        let certificate = params.signed_by(&key, &self.issuer).expect("certificate");
        std::fs::write(dir.join("tls.crt"), certificate.pem()).expect("tls.crt");
        std::fs::write(dir.join("tls.key"), key.serialize_pem()).expect("tls.key");
    }
}

/// Each kind's CRD with both versions (v1alpha1 stored) and a webhook conversion to `address`.
fn converting_crds(address: SocketAddr, ca_pem: &str) -> Vec<CustomResourceDefinition> {
    pgkube_crds::crds()
        .into_iter()
        .zip(v1beta1::crds())
        .map(|(alpha, beta)| {
            let mut crd = merge_crds(vec![alpha, beta], "v1alpha1").expect("merged CRD");
            crd.spec.conversion = Some(CustomResourceConversion {
                strategy: "Webhook".to_owned(),
                webhook: Some(WebhookConversion {
                    client_config: Some(WebhookClientConfig {
                        url: Some(format!("https://{address}/convert")),
                        ca_bundle: Some(ByteString(ca_pem.as_bytes().to_vec())),
                        service: None,
                    }),
                    conversion_review_versions: vec!["v1".to_owned()],
                }),
            });
            crd
        })
        .collect()
}

/// Applies `crds` (as the test kit's field manager, so that [`install_crds`] puts the
/// v1alpha1-only ones back) and waits until v1beta1 is served.
async fn install(client: &Client, crds: &[CustomResourceDefinition]) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(CRD_FIELD_MANAGER).force();
    for crd in crds {
        api.patch(&crd.name_any(), &params, &Patch::Apply(crd))
            .await
            .unwrap_or_else(|error| panic!("installing {}: {error}", crd.name_any()));
    }
    let clusters = Api::<v1beta1::PostgreSQLCluster>::all(client.clone());
    wait_until("v1beta1 to be served", STEP_TIMEOUT, || async {
        Ok(clusters.list(&Default::default()).await.ok().map(|_| ()))
    })
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));
}

fn cluster_v1alpha1(name: &str) -> pgkube_crds::PostgreSQLCluster {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "db.example.com/v1alpha1",
        "kind": "PostgreSQLCluster",
        "metadata": {"name": name, "labels": {"team": "payments"}},
        "spec": {"replicas": 2, "version": "15", "storage": "3Gi",
                 "postgresql": {"parameters": {"work_mem": "16MB"}}},
    }))
    .expect("v1alpha1 cluster")
}

fn cluster_v1beta1(name: &str) -> v1beta1::PostgreSQLCluster {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "db.example.com/v1beta1",
        "kind": "PostgreSQLCluster",
        "metadata": {"name": name},
        "spec": {"replicas": 1, "postgresVersion": "15",
                 "storage": {"size": "2Gi", "storageClassName": "fast-ssd"}},
    }))
    .expect("v1beta1 cluster")
}

#[tokio::test]
async fn the_api_server_converts_through_the_managers_webhook_over_tls() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "conversion").await;
    let ns = namespace.name().to_owned();
    let dir = std::env::temp_dir().join(format!("pgkube-conversion-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("certificate directory");
    let ca = TestCa::new();
    ca.write_serving_certificate(&dir);
    let cert_dir = dir.to_string_lossy().into_owned();
    let mut manager = Manager::start(
        &env,
        "manager-conversion",
        &[
            "--watch-namespaces",
            &ns,
            "--webhook-bind-address",
            "127.0.0.1:0",
            "--webhook-cert-dir",
            &cert_dir,
        ],
    );
    let address = manager.endpoint("conversion webhook").await;
    install(&client, &converting_crds(address, &ca.pem())).await;
    let alpha = Api::<pgkube_crds::PostgreSQLCluster>::namespaced(client.clone(), &ns);
    let beta = Api::<v1beta1::PostgreSQLCluster>::namespaced(client.clone(), &ns);

    // Created in v1alpha1, read in v1beta1 and back: the same object.
    let created = alpha
        .create(&PostParams::default(), &cluster_v1alpha1("made-alpha"))
        .await
        .expect("created in v1alpha1");
    let as_beta = beta.get("made-alpha").await.expect("read in v1beta1");
    assert_eq!(as_beta.spec.postgres_version, created.spec.version);
    assert_eq!(as_beta.spec.storage.size, "3Gi");
    assert_eq!(as_beta.spec.replicas, 2);
    assert_eq!(
        as_beta.labels().get("team").map(String::as_str),
        Some("payments")
    );
    let back: pgkube_crds::PostgreSQLCluster =
        pgkube_crds::PostgreSQLCluster::from(as_beta.clone());
    let stored = alpha.get("made-alpha").await.expect("read in v1alpha1");
    assert_eq!(back.spec, stored.spec);

    // Created in v1beta1 with a field v1alpha1 lacks, updated through v1alpha1: still there.
    beta.create(&PostParams::default(), &cluster_v1beta1("made-beta"))
        .await
        .expect("created in v1beta1");
    alpha
        .patch(
            "made-beta",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 3}})),
        )
        .await
        .expect("updated through v1alpha1");
    let updated = beta.get("made-beta").await.expect("read in v1beta1");
    assert_eq!(updated.spec.replicas, 3);
    assert_eq!(
        updated.spec.storage.storage_class_name.as_deref(),
        Some("fast-ssd"),
        "the v1beta1-only field survives an update through v1alpha1"
    );

    // The controllers (which read v1alpha1) work on the object written in v1beta1.
    let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), &ns);
    wait_until(
        "the v1beta1 cluster's StatefulSet",
        STEP_TIMEOUT,
        || async {
            Ok(statefulsets
                .get_opt("made-beta-postgresql")
                .await?
                .map(|_| ()))
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}\n{}", manager.output().join("\n")));

    // A restart with a rotated certificate (same CA, same address) keeps serving. (Rotation
    // without a restart is the unit tests' job: the API server keeps its connection open, so
    // it would never see the new certificate here.)
    ca.write_serving_certificate(&dir);
    manager.terminate();
    assert_eq!(manager.exit_code(Duration::from_secs(30)).await, Some(0));
    let same_address = address.to_string();
    let mut manager = Manager::start(
        &env,
        "manager-conversion",
        &[
            "--watch-namespaces",
            &ns,
            "--webhook-bind-address",
            &same_address,
            "--webhook-cert-dir",
            &cert_dir,
        ],
    );
    assert_eq!(manager.endpoint("conversion webhook").await, address);
    let after_rotation = beta
        .get("made-alpha")
        .await
        .expect("read after the rotation");
    assert_eq!(after_rotation.spec, as_beta.spec);

    // The webhook down: v1beta1 requests fail with an API error saying so; nothing stored
    // changes, and v1alpha1 still reads it.
    manager.terminate();
    assert_eq!(manager.exit_code(Duration::from_secs(30)).await, Some(0));
    let before = alpha.get("made-alpha").await.expect("v1alpha1 reads");
    let refused = beta
        .get("made-alpha")
        .await
        .expect_err("no webhook to convert");
    let message = refused.to_string();
    assert!(message.contains("conversion webhook"), "{message}");
    let patch = Patch::Merge(serde_json::json!({"spec": {"replicas": 1}}));
    let refused = beta
        .patch("made-alpha", &PatchParams::default(), &patch)
        .await
        .expect_err("no webhook to convert the update");
    assert!(
        refused.to_string().contains("conversion webhook"),
        "{refused}"
    );
    let unchanged = alpha.get("made-alpha").await.expect("v1alpha1 still reads");
    assert_eq!(unchanged.spec, stored.spec);
    assert_eq!(unchanged.resource_version(), before.resource_version());

    // The v1alpha1-only CRDs back before the namespace goes: its deletion must not need the
    // webhook.
    install_crds(&client).await;
    namespace.cleanup().await;
    let _ = std::fs::remove_dir_all(&dir);
}
