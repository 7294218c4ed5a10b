//! The conversion webhook with the API server in the loop: a real `pgkube run` serves it over
//! TLS on 127.0.0.1 with a certificate from a directory, and the test bed's API server calls it
//! for every request in a version other than the stored one (v1alpha1).
//!
//! The test installs the CRDs with both versions and a conversion stanza that names the
//! manager's address and the test's CA, and puts the v1alpha1-only CRDs back before it ends.
//! It checks: an object created in v1alpha1 reads the same in v1beta1 and back; a field only
//! v1beta1 has survives an update through v1alpha1; the controllers work on an object written
//! in v1beta1; a restart with a rotated certificate keeps serving; with the webhook down, a v1beta1
//! request fails with an API error that says so, and the stored objects are unchanged. And with
//! the certificate managed by the manager: two replicas (one leading, one standing by) share the
//! CA and certificate of one Secret, the CRDs come to trust that CA, and both serve.

mod manager_common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use manager_common::Manager;
use pgkube_crds::v1beta1;
use pgkube_testkit::{
    CRD_FIELD_MANAGER, TestCa, TestNamespace, converting_crds, install_crds, testbed, wait_until,
};

const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// The CRDs are the test bed's, shared by the tests of this file: one at a time changes them.
static CRDS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs `scenario` while holding the CRDs, and puts the v1alpha1-only CRDs back whatever
/// happens: a CRD left converting through a stopped manager would fail later tests.
async fn holding_the_crds(client: &Client, scenario: impl std::future::Future<Output = ()>) {
    use futures::FutureExt as _;
    let _held = CRDS.lock().await;
    let outcome = std::panic::AssertUnwindSafe(scenario).catch_unwind().await;
    restore_crds(client).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Applies `crds` (as the test kit's field manager, so that [`install_crds`] puts the
/// v1alpha1-only ones back) and, if `wait_served`, waits until v1beta1 is served (a list needs a
/// conversion webhook that answers).
async fn install(client: &Client, crds: &[CustomResourceDefinition], wait_served: bool) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(CRD_FIELD_MANAGER).force();
    for crd in crds {
        api.patch(&crd.name_any(), &params, &Patch::Apply(crd))
            .await
            .unwrap_or_else(|error| panic!("installing {}: {error}", crd.name_any()));
    }
    if !wait_served {
        return;
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
    holding_the_crds(&client.clone(), async move {
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
        install(&client, &converting_crds(address, &ca.pem()), true).await;
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
        restore_crds(&client).await;
        namespace.cleanup_without_controllers().await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

/// A port free on 127.0.0.1 now (bound, then released).
fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address")
}

/// Points the CRDs' webhook at `address`, keeping the `caBundle` the manager set.
async fn point_webhook_at(client: &Client, address: SocketAddr) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let patch = serde_json::json!({"spec": {"conversion": {"webhook": {"clientConfig": {
        "url": format!("https://{address}/convert"),
    }}}}});
    for crd in pgkube_crds::crds() {
        api.patch(
            &crd.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("webhook address changed");
    }
}

/// Takes the conversion stanza out (its `caBundle` belongs to the manager's field manager, so
/// the test kit's apply alone would leave it), then puts the v1alpha1-only CRDs back.
async fn restore_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let patch = serde_json::json!({"spec": {"conversion": {"strategy": "None", "webhook": null}}});
    for crd in pgkube_crds::crds() {
        api.patch(
            &crd.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("conversion removed");
    }
    install_crds(client).await;
}

#[tokio::test]
async fn replicas_share_a_managed_certificate_that_the_crds_come_to_trust() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    holding_the_crds(&client.clone(), async move {
        install_crds(&client).await;
        let namespace = TestNamespace::create(&client, "webhook-cert").await;
        let ns = namespace.name().to_owned();
        let (first_address, second_address) = (free_port(), free_port());
        // The CRDs convert through the first replica, and trust no CA yet.
        let crds = converting_crds(first_address, "");
        install(&client, &crds, false).await;
        let start = |name: &str, address: SocketAddr| {
            let dir = std::env::temp_dir().join(format!("pgkube-{name}-{}", std::process::id()));
            let args = [
                "--watch-namespaces".to_owned(),
                ns.clone(),
                "--leader-elect".to_owned(),
                "--leader-elect-namespace".to_owned(),
                ns.clone(),
                "--webhook-bind-address".to_owned(),
                address.to_string(),
                "--webhook-cert-dir".to_owned(),
                dir.to_string_lossy().into_owned(),
                "--webhook-cert-secret".to_owned(),
                "pgkube-webhook-cert".to_owned(),
                "--webhook-cert-hosts".to_owned(),
                "127.0.0.1".to_owned(),
            ];
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            (
                Manager::start_with_env(&env, name, &args, &[("POD_NAMESPACE", &ns)]),
                dir,
            )
        };
        let (mut first, first_dir) = start("replica-a", first_address);
        let (mut second, second_dir) = start("replica-b", second_address);
        assert_eq!(first.endpoint("conversion webhook").await, first_address);
        assert_eq!(second.endpoint("conversion webhook").await, second_address);

        // One Secret; both replicas serve its certificate; the CRDs trust its CA.
        let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns)
            .get("pgkube-webhook-cert")
            .await
            .expect("the managed Secret");
        let data = secret.data.clone().unwrap_or_default();
        let served = |dir: &Path| std::fs::read(dir.join("tls.crt")).expect("tls.crt");
        assert_eq!(served(&first_dir), data["tls.crt"].0);
        assert_eq!(served(&second_dir), data["tls.crt"].0);
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in pgkube_crds::crds() {
            let installed = api.get(&crd.name_any()).await.expect("CRD");
            let trusted = installed
                .spec
                .conversion
                .and_then(|c| c.webhook)
                .and_then(|w| w.client_config)
                .and_then(|c| c.ca_bundle);
            assert_eq!(trusted.map(|b| b.0), Some(data["ca.crt"].0.clone()));
        }

        // The API server converts through either replica, leader or not.
        let alpha = Api::<pgkube_crds::PostgreSQLCluster>::namespaced(client.clone(), &ns);
        let beta = Api::<v1beta1::PostgreSQLCluster>::namespaced(client.clone(), &ns);
        alpha
            .create(&PostParams::default(), &cluster_v1alpha1("shared"))
            .await
            .expect("created in v1alpha1");
        wait_until(
            "v1beta1 through the first replica",
            STEP_TIMEOUT,
            || async { Ok(beta.get("shared").await.ok().map(|_| ())) },
        )
        .await
        .unwrap_or_else(|error| panic!("{error:#}\n{}", first.output().join("\n")));
        point_webhook_at(&client, second_address).await;
        first.terminate();
        assert_eq!(first.exit_code(Duration::from_secs(30)).await, Some(0));
        wait_until(
            "v1beta1 through the second replica",
            STEP_TIMEOUT,
            || async { Ok(beta.get("shared").await.ok().map(|_| ())) },
        )
        .await
        .unwrap_or_else(|error| panic!("{error:#}\n{}", second.output().join("\n")));

        restore_crds(&client).await;
        second.terminate();
        let _ = second.exit_code(Duration::from_secs(30)).await;
        namespace.cleanup_without_controllers().await;
        for dir in [first_dir, second_dir] {
            let _ = std::fs::remove_dir_all(dir);
        }
    })
    .await;
}
