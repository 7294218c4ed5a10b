//! The conversion webhook with the API server in the loop: a real `pgkube run` serves it over
//! TLS on 127.0.0.1, and the test bed's API server calls it for every request in a version other
//! than the stored one.
//!
//! Each test installs `pgkube crd`'s CRDs (both versions) converting through its manager's
//! address, and puts the test bed's v1beta1-only CRDs back before it ends. They check:
//! - an object created in v1alpha1 reads the same in v1beta1 and back; a field only v1beta1 has
//!   survives an update through v1alpha1 and reaches the StatefulSet; a restart with a rotated
//!   certificate keeps serving; with no manager at all, a v1alpha1 request fails with an API
//!   error that says so and nothing stored changes, while `kubectl get pgcluster` works and a
//!   namespace holding clusters is deleted;
//! - with the certificate managed by the manager: two replicas (one leading, one standing by)
//!   share the CA and certificate of one Secret, the CRDs come to trust that CA, and both serve;
//!   a CA about to expire is rotated while the old one stays trusted.

mod conversion_common;
mod manager_common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use conversion_common::{
    EXIT_TIMEOUT, STEP_TIMEOUT, cluster_v1alpha1, cluster_v1beta1, holding_the_crds, install,
    restore_crds,
};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use manager_common::Manager;
use pgkube_crds::{v1alpha1, v1beta1};
use pgkube_testkit::{
    TestAdmission, TestCa, TestEnv, TestNamespace, converting_crds, install_crds, testbed,
    wait_until,
};

/// How long the namespace controller may take to delete a namespace: it retries with a backoff
/// after the first pass finds objects still being deleted.
const NAMESPACE_DELETION_TIMEOUT: Duration = Duration::from_secs(120);

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
        let address = manager.endpoint("webhook").await;
        install(&client, &converting_crds(address, &ca.pem()), true).await;
        let alpha = Api::<v1alpha1::PostgreSQLCluster>::namespaced(client.clone(), &ns);
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
        let down = pgkube_crds::conversion::convert(
            serde_json::to_value(&as_beta).expect("JSON"),
            pgkube_crds::v1alpha1::API_VERSION,
        )
        .expect("converts down");
        let back: v1alpha1::PostgreSQLCluster =
            serde_json::from_value(down).expect("a v1alpha1 cluster");
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

        // The controllers work on the object written in v1beta1 ...
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
        // ... with the storage class only v1beta1 has.
        let statefulset = statefulsets
            .get("made-beta-postgresql")
            .await
            .expect("StatefulSet");
        let templates = statefulset.spec.and_then(|s| s.volume_claim_templates);
        let class = templates
            .unwrap_or_default()
            .into_iter()
            .find_map(|claim| claim.spec?.storage_class_name);
        assert_eq!(class.as_deref(), Some("fast-ssd"));

        // A restart with a rotated certificate (same CA, same address) keeps serving. (Rotation
        // without a restart is the unit tests' job: the API server keeps its connection open, so
        // it would never see the new certificate here.)
        ca.write_serving_certificate(&dir);
        manager.terminate();
        assert_eq!(manager.exit_code(EXIT_TIMEOUT).await, Some(0));
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
                // Not on a free port: the one just released may be the webhook's.
                "--health-probe-bind-address",
                "0",
                "--metrics-bind-address",
                "0",
            ],
        );
        assert_eq!(manager.endpoint("webhook").await, address);
        let after_rotation = beta
            .get("made-alpha")
            .await
            .expect("read after the rotation");
        assert_eq!(after_rotation.spec, as_beta.spec);

        // No manager at all (scaled to zero, uninstalled): v1alpha1 requests fail with an API
        // error saying so and nothing stored changes, while what kubectl and the namespace
        // controller read, v1beta1, needs no webhook.
        manager.terminate();
        assert_eq!(manager.exit_code(EXIT_TIMEOUT).await, Some(0));
        let before = beta.get("made-alpha").await.expect("v1beta1 reads");
        let refused = alpha
            .get("made-alpha")
            .await
            .expect_err("no webhook to convert");
        let message = refused.to_string();
        assert!(message.contains("conversion webhook"), "{message}");
        let patch = Patch::Merge(serde_json::json!({"spec": {"replicas": 1}}));
        let refused = alpha
            .patch("made-alpha", &PatchParams::default(), &patch)
            .await
            .expect_err("no webhook to convert the update");
        assert!(
            refused.to_string().contains("conversion webhook"),
            "{refused}"
        );
        let unchanged = beta.get("made-alpha").await.expect("v1beta1 still reads");
        assert_eq!(unchanged.spec, before.spec);
        assert_eq!(unchanged.resource_version(), before.resource_version());
        let names = ["made-alpha", "made-beta"];
        assert_eq!(kubectl_get_clusters(&env, &ns, &[]), names, "listed");
        assert_eq!(kubectl_get_clusters(&env, &ns, &names), names, "read");
        deleted_without_a_manager(&client, namespace).await;
        restore_crds(&client).await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

/// The names of the clusters `kubectl get pgcluster [names]` shows in `ns`, as a user types it
/// (the short name, so the version kubectl prefers). With names, kubectl reads each one: a list
/// may be answered from the API server's watch cache, which holds objects converted while a
/// webhook answered, where a read goes to storage.
fn kubectl_get_clusters(env: &TestEnv, ns: &str, names: &[&str]) -> Vec<String> {
    let output = env
        .kubectl()
        .args(["get", "pgcluster", "-n", ns, "-o", "name"])
        .args(names)
        .output()
        .expect("kubectl runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "kubectl get pgcluster: {stderr}");
    let mut names: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.rsplit('/').next().map(str::to_owned))
        .collect();
    names.sort();
    names
}

/// Deletes `namespace` with its clusters' finalizers removed, no manager running and the CRDs
/// still converting through it, and waits until the namespace controller has removed it.
async fn deleted_without_a_manager(client: &Client, namespace: TestNamespace) {
    let ns = namespace.name().to_owned();
    let clusters = Api::<v1beta1::PostgreSQLCluster>::namespaced(client.clone(), &ns);
    let release = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
    for cluster in clusters.list(&Default::default()).await.expect("list") {
        clusters
            .patch(&cluster.name_any(), &PatchParams::default(), &release)
            .await
            .expect("finalizers removed through v1beta1");
    }
    namespace.cleanup().await;
    let namespaces = Api::<Namespace>::all(client.clone());
    wait_until(
        "the namespace to be deleted",
        NAMESPACE_DELETION_TIMEOUT,
        || async { Ok(namespaces.get_opt(&ns).await?.is_none().then_some(())) },
    )
    .await
    .unwrap_or_else(|error| {
        panic!("{error:#}: the namespace controller needs no webhook to delete pgkube objects")
    });
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

#[tokio::test]
async fn replicas_share_a_managed_certificate_that_the_crds_come_to_trust() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    holding_the_crds(&client.clone(), async move {
        install_crds(&client).await;
        let namespace = TestNamespace::create(&client, "webhook-cert").await;
        let ns = namespace.name().to_owned();
        let (first_address, second_address) = (free_port(), free_port());
        // The CRDs convert through the first replica, and trust no CA yet; nor does the
        // admission webhook (`pgkube admission-webhook`'s name, for this namespace only).
        let crds = converting_crds(first_address, "");
        install(&client, &crds, false).await;
        let admission = TestAdmission::register(
            &client,
            pgkube_crds::ADMISSION_WEBHOOK,
            first_address,
            None,
            &ns,
        )
        .await;
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
                // Not on free ports: they could take a webhook's port picked above.
                "--health-probe-bind-address".to_owned(),
                "0".to_owned(),
                "--metrics-bind-address".to_owned(),
                "0".to_owned(),
            ];
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            (
                Manager::start_with_env(&env, name, &args, &[("POD_NAMESPACE", &ns)]),
                dir,
            )
        };
        let (mut first, first_dir) = start("replica-a", first_address);
        let (mut second, second_dir) = start("replica-b", second_address);
        assert_eq!(first.endpoint("webhook").await, first_address);
        assert_eq!(second.endpoint("webhook").await, second_address);

        // One Secret; both replicas serve its certificate; the CRDs trust its CA.
        let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns)
            .get("pgkube-webhook-cert")
            .await
            .expect("the managed Secret");
        let data = secret.data.clone().unwrap_or_default();
        let served = |dir: &Path| std::fs::read(dir.join("tls.crt")).expect("tls.crt");
        assert_eq!(served(&first_dir), data["tls.crt"].0);
        assert_eq!(served(&second_dir), data["tls.crt"].0);
        assert_eq!(
            trusted_bundles(&client).await,
            vec![Some(data["ca.crt"].0.clone()); 3]
        );
        let registration = Api::<MutatingWebhookConfiguration>::all(client.clone())
            .get(admission.name())
            .await
            .expect("the admission webhook's configuration");
        let bundles: Vec<_> = (registration.webhooks.iter().flatten())
            .map(|webhook| webhook.client_config.ca_bundle.clone().map(|b| b.0))
            .collect();
        assert_eq!(bundles, [Some(data["ca.crt"].0.clone())]);
        // And the API server trusts the webhook with it: it calls it, and a cluster created
        // (with dryRun) comes back with the finalizer.
        admission
            .wait_answering()
            .await
            .expect("the API server calls the webhook, trusting the managed CA");
        admission.delete().await;

        // The API server converts through either replica, leader or not.
        hand_over(&client, &ns, "shared", &mut first, &second, second_address).await;

        restore_crds(&client).await;
        second.terminate();
        let _ = second.exit_code(EXIT_TIMEOUT).await;
        namespace.cleanup_without_controllers().await;
        for dir in [first_dir, second_dir] {
            let _ = std::fs::remove_dir_all(dir);
        }
    })
    .await;
}

/// The caBundle pgkube's CRDs carry, per CRD.
async fn trusted_bundles(client: &Client) -> Vec<Option<Vec<u8>>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut bundles = Vec::new();
    for crd in pgkube_crds::crds() {
        let installed = api.get(&crd.name_any()).await.expect("CRD");
        let bundle = installed
            .spec
            .conversion
            .and_then(|c| c.webhook)
            .and_then(|w| w.client_config)
            .and_then(|c| c.ca_bundle);
        bundles.push(bundle.map(|b| b.0));
    }
    bundles
}

/// A managed CA about to expire is rotated: a replica finds it in the Secret, makes a new CA
/// and serving certificate, and has the CRDs trust both CAs. Meanwhile another replica still
/// serving the old certificate (as one does until it reads the Secret again) is still trusted,
/// and the new certificate is too.
#[tokio::test]
async fn an_expiring_managed_ca_is_rotated_while_the_old_one_stays_trusted() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    holding_the_crds(&client.clone(), async move {
        install_crds(&client).await;
        let namespace = TestNamespace::create(&client, "ca-rotation").await;
        let ns = namespace.name().to_owned();
        // The Secret as a replica left it: the CA has 100 days left, less than the year a new
        // serving certificate would need.
        let old_ca = TestCa::new();
        let (tls_crt, tls_key) = old_ca.serving_certificate();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        let day = 86_400;
        let secret: k8s_openapi::api::core::v1::Secret =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "pgkube-webhook-cert", "annotations": {
                    "db.example.com/webhook-hosts": "127.0.0.1",
                    "db.example.com/webhook-not-after": (now + 300 * day).to_string(),
                    "db.example.com/webhook-ca-not-after": (now + 100 * day).to_string(),
                }},
                "type": "kubernetes.io/tls",
                "stringData": {"ca.crt": old_ca.pem(), "ca.key": old_ca.key_pem(),
                               "tls.crt": tls_crt, "tls.key": tls_key},
            }))
            .expect("Secret");
        let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns);
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("old Secret");
        // The old replica serves the old certificate; the CRDs trust the old CA only.
        let old_dir = std::env::temp_dir().join(format!("pgkube-old-ca-{}", std::process::id()));
        std::fs::create_dir_all(&old_dir).expect("certificate directory");
        std::fs::write(old_dir.join("tls.crt"), secret_text(&secret, "tls.crt")).expect("crt");
        std::fs::write(old_dir.join("tls.key"), secret_text(&secret, "tls.key")).expect("key");
        let old_dir_text = old_dir.to_string_lossy().into_owned();
        let mut old = Manager::start_with_env(
            &env,
            "replica-old",
            &[
                "--watch-namespaces",
                &ns,
                "--leader-elect",
                "--leader-elect-namespace",
                &ns,
                "--webhook-bind-address",
                "127.0.0.1:0",
                "--webhook-cert-dir",
                &old_dir_text,
            ],
            &[("POD_NAMESPACE", &ns)],
        );
        let old_address = old.endpoint("webhook").await;
        install(&client, &converting_crds(old_address, &old_ca.pem()), true).await;

        // A replica managing the certificate starts, and rotates the CA.
        let new_dir = std::env::temp_dir().join(format!("pgkube-new-ca-{}", std::process::id()));
        let new_dir_text = new_dir.to_string_lossy().into_owned();
        let mut new = Manager::start_with_env(
            &env,
            "replica-new",
            &[
                "--watch-namespaces",
                &ns,
                "--leader-elect",
                "--leader-elect-namespace",
                &ns,
                "--webhook-bind-address",
                "127.0.0.1:0",
                "--webhook-cert-dir",
                &new_dir_text,
                "--webhook-cert-secret",
                "pgkube-webhook-cert",
                "--webhook-cert-hosts",
                "127.0.0.1",
            ],
            &[("POD_NAMESPACE", &ns)],
        );
        let new_address = new.endpoint("webhook").await;
        let rotated = secrets.get("pgkube-webhook-cert").await.expect("Secret");
        let data = rotated.data.clone().unwrap_or_default();
        assert_ne!(data["ca.crt"].0, old_ca.pem().into_bytes(), "a new CA");
        assert_eq!(data["ca-previous.crt"].0, old_ca.pem().into_bytes());
        let mut both = data["ca.crt"].0.clone();
        both.extend_from_slice(&data["ca-previous.crt"].0);
        assert_eq!(trusted_bundles(&client).await, vec![Some(both); 3]);
        assert_eq!(
            std::fs::read(new_dir.join("tls.crt")).expect("tls.crt"),
            data["tls.crt"].0
        );

        // Both certificates are trusted: the old replica's, then the new one's.
        hand_over(&client, &ns, "rotated", &mut old, &new, new_address).await;

        restore_crds(&client).await;
        new.terminate();
        let _ = new.exit_code(EXIT_TIMEOUT).await;
        namespace.cleanup_without_controllers().await;
        for dir in [old_dir, new_dir] {
            let _ = std::fs::remove_dir_all(dir);
        }
    })
    .await;
}

/// Creates cluster `name` in v1alpha1 in `ns` and reads it in v1beta1 through `from`'s webhook
/// (the one the CRDs name), then points the CRDs at `to` (serving at `to_address`), stops `from`,
/// and reads it through `to`.
async fn hand_over(
    client: &Client,
    ns: &str,
    name: &str,
    from: &mut Manager,
    to: &Manager,
    to_address: SocketAddr,
) {
    let alpha = Api::<v1alpha1::PostgreSQLCluster>::namespaced(client.clone(), ns);
    let beta = Api::<v1beta1::PostgreSQLCluster>::namespaced(client.clone(), ns);
    alpha
        .create(&PostParams::default(), &cluster_v1alpha1(name))
        .await
        .expect("created in v1alpha1");
    let read_in_v1beta1 = || async { Ok(beta.get(name).await.ok().map(|_| ())) };
    wait_until(
        "v1beta1 through the first webhook",
        STEP_TIMEOUT,
        read_in_v1beta1,
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}\n{}", from.output().join("\n")));
    point_webhook_at(client, to_address).await;
    from.terminate();
    assert_eq!(from.exit_code(EXIT_TIMEOUT).await, Some(0));
    wait_until(
        "v1beta1 through the second webhook",
        STEP_TIMEOUT,
        read_in_v1beta1,
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}\n{}", to.output().join("\n")));
}

/// A value of a Secret written with `stringData`.
fn secret_text(secret: &k8s_openapi::api::core::v1::Secret, key: &str) -> String {
    secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(key))
        .cloned()
        .expect("key")
}
