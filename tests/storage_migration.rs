//! The design's migration with the API server in the loop, as an installation made while
//! v1alpha1 was stored upgrades: from CRDs storing v1alpha1, v1beta1 is made the storage
//! version, every object is rewritten by `pgkube migrate-storage`, and storedVersions is left
//! with v1beta1 alone; then the way back, for a pgkube that read v1alpha1. A real `pgkube run`
//! serves the conversion webhook over TLS on 127.0.0.1 throughout (but while the test stops it
//! to show where objects are stored).

mod conversion_common;
mod manager_common;

use std::net::SocketAddr;
use std::path::Path;

use conversion_common::{
    EXIT_TIMEOUT, STEP_TIMEOUT, cluster_v1alpha1, cluster_v1beta1, holding_the_crds,
    move_storage_to, restore_crds,
};
use futures::FutureExt as _;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use manager_common::Manager;
use pgkube_crds::{StorageVersion, v1alpha1, v1beta1};
use pgkube_testkit::{
    TestCa, TestEnv, TestNamespace, converting_crds_storing, install_crds, testbed, wait_until,
};

/// A manager watching `namespace` and serving the webhook at `address` with the certificate in
/// `cert_dir`, that can be stopped and started again at the same address.
struct WebhookServer {
    manager: Manager,
    address: SocketAddr,
    namespace: String,
    cert_dir: String,
}

impl WebhookServer {
    async fn start(env: &TestEnv, namespace: &str, cert_dir: &Path) -> WebhookServer {
        let cert_dir = cert_dir.to_string_lossy().into_owned();
        let manager = Self::spawn(env, namespace, "127.0.0.1:0", &cert_dir);
        let address = manager.endpoint("webhook").await;
        WebhookServer {
            manager,
            address,
            namespace: namespace.to_owned(),
            cert_dir,
        }
    }

    fn spawn(env: &TestEnv, namespace: &str, address: &str, cert_dir: &str) -> Manager {
        let args = [
            "--watch-namespaces",
            namespace,
            "--webhook-bind-address",
            address,
            "--webhook-cert-dir",
            cert_dir,
        ];
        Manager::start(env, "manager-migration", &args)
    }

    async fn stop(&mut self) {
        self.manager.terminate();
        assert_eq!(self.manager.exit_code(EXIT_TIMEOUT).await, Some(0));
    }

    /// Moves every object to `storage` with the CRDs converting through this manager.
    async fn move_storage_to(
        &self,
        env: &TestEnv,
        client: &Client,
        ca: &TestCa,
        storage: StorageVersion,
    ) {
        let crds = converting_crds_storing(self.address, &ca.pem(), storage);
        move_storage_to(env, client, &crds, storage).await;
    }

    /// Starts the manager again at the same address unless it is running.
    async fn ensure_serving(&mut self, env: &TestEnv) {
        if self.manager.is_running() {
            return;
        }
        let address = self.address.to_string();
        self.manager = Self::spawn(env, &self.namespace, &address, &self.cert_dir);
        assert_eq!(self.manager.endpoint("webhook").await, self.address);
    }
}

/// The design's migration, as an installation made while v1alpha1 was stored upgrades: with
/// the webhook deployed and v1beta1 served beside v1alpha1, objects written in both versions
/// (and one patched through v1beta1) are moved to v1beta1: v1beta1 becomes the storage
/// version, every object is rewritten, and storedVersions is left with v1beta1 alone, so
/// v1alpha1 could then be retired. Nothing is lost on the way, the controllers keep working,
/// and the way back (v1alpha1 stored again, for a pgkube that read it) works the same.
#[tokio::test]
async fn the_design_migration_moves_every_object_to_v1beta1_storage() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    holding_the_crds(&client.clone(), async move {
        install_crds(&client).await;
        let namespace = TestNamespace::create(&client, "migration").await;
        let ns = namespace.name().to_owned();
        let dir = std::env::temp_dir().join(format!("pgkube-migration-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("certificate directory");
        let ca = TestCa::new();
        ca.write_serving_certificate(&dir);
        let mut webhook = WebhookServer::start(&env, &ns, &dir).await;
        // The CRDs as a pgkube that stored v1alpha1 left them.
        webhook
            .move_storage_to(&env, &client, &ca, StorageVersion::V1alpha1)
            .await;

        let scenario = async {
            migrate_and_check(&env, &client, &mut webhook, &ca, &ns).await;
            // The way back keeps every object readable in v1alpha1, with the last change made.
            webhook
                .move_storage_to(&env, &client, &ca, StorageVersion::V1alpha1)
                .await;
            let alpha = Api::<v1alpha1::PostgreSQLCluster>::namespaced(client.clone(), &ns);
            let old = alpha.get("old-one").await.expect("read in v1alpha1");
            assert_eq!(old.spec.replicas, 3);
            assert_eq!(
                old.labels().get("moved").map(String::as_str),
                Some("v1beta1")
            );
        };
        let outcome = std::panic::AssertUnwindSafe(scenario).catch_unwind().await;
        // Whatever happened, v1beta1 stored again and every object moved to it, so that the
        // single-version CRDs can be put back.
        webhook.ensure_serving(&env).await;
        webhook
            .move_storage_to(&env, &client, &ca, StorageVersion::V1beta1)
            .await;
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }

        restore_crds(&client).await;
        webhook.stop().await;
        namespace.cleanup_without_controllers().await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

/// The migration to v1beta1 storage and its checks (see the test above).
async fn migrate_and_check(
    env: &TestEnv,
    client: &Client,
    webhook: &mut WebhookServer,
    ca: &TestCa,
    ns: &str,
) {
    let alpha = Api::<v1alpha1::PostgreSQLCluster>::namespaced(client.clone(), ns);
    let beta = Api::<v1beta1::PostgreSQLCluster>::namespaced(client.clone(), ns);
    let backups = Api::<v1beta1::PostgreSQLBackup>::namespaced(client.clone(), ns);
    let restores = Api::<v1beta1::PostgreSQLRestore>::namespaced(client.clone(), ns);
    let params = PostParams::default();
    alpha
        .create(&params, &cluster_v1alpha1("old-one"))
        .await
        .expect("created in v1alpha1");
    beta.create(&params, &cluster_v1beta1("new-one"))
        .await
        .expect("created in v1beta1");
    let backup: v1beta1::PostgreSQLBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": v1beta1::API_VERSION, "kind": "PostgreSQLBackup",
        "metadata": {"name": "old-one-manual"},
        "spec": {"cluster": {"name": "old-one"}},
    }))
    .expect("backup");
    backups.create(&params, &backup).await.expect("backup");
    let restore: v1alpha1::PostgreSQLRestore = serde_json::from_value(serde_json::json!({
        "apiVersion": "db.example.com/v1alpha1", "kind": "PostgreSQLRestore",
        "metadata": {"name": "into-new-one"},
        "spec": {"cluster": {"name": "new-one"}, "backup": {"name": "old-one-manual"}},
    }))
    .expect("restore");
    Api::<v1alpha1::PostgreSQLRestore>::namespaced(client.clone(), ns)
        .create(&params, &restore)
        .await
        .expect("restore");
    // Users move their manifests to v1beta1 first: one object patched through it.
    let merge = |value| Patch::Merge(value);
    beta.patch(
        "old-one",
        &PatchParams::default(),
        &merge(serde_json::json!({"metadata": {"labels": {"moved": "v1beta1"}}})),
    )
    .await
    .expect("patched through v1beta1");
    let specs = |clusters: Vec<v1beta1::PostgreSQLCluster>| {
        let mut specs: Vec<_> = clusters
            .into_iter()
            .map(|c| (c.name_any(), c.labels().clone(), c.spec))
            .collect();
        specs.sort_by(|a, b| a.0.cmp(&b.0));
        specs
    };
    let before = specs(beta.list(&Default::default()).await.expect("list").items);

    webhook
        .move_storage_to(env, client, ca, StorageVersion::V1beta1)
        .await;

    // Nothing lost: every object reads as before.
    let after = specs(beta.list(&Default::default()).await.expect("list").items);
    assert_eq!(after, before);
    assert_eq!(
        restores
            .get("into-new-one")
            .await
            .expect("restore")
            .spec
            .backup
            .map(|b| b.name),
        Some("old-one-manual".to_owned())
    );
    assert_eq!(
        backups
            .get("old-one-manual")
            .await
            .expect("backup")
            .spec
            .cluster
            .name,
        "old-one"
    );

    // Stored in v1beta1: with the webhook down, every object still reads in v1beta1 (no
    // conversion needed) and none in v1alpha1.
    webhook.stop().await;
    for name in ["old-one", "new-one"] {
        beta.get(name)
            .await
            .expect("read in v1beta1 without the webhook");
        let refused = alpha
            .get(name)
            .await
            .expect_err("v1alpha1 needs the webhook now");
        assert!(
            refused.to_string().contains("conversion webhook"),
            "{refused}"
        );
    }
    backups
        .get("old-one-manual")
        .await
        .expect("backup stored in v1beta1");
    restores
        .get("into-new-one")
        .await
        .expect("restore stored in v1beta1");
    webhook.ensure_serving(env).await;

    // The controllers, which read and write v1beta1, keep working on the migrated objects.
    beta.patch(
        "old-one",
        &PatchParams::default(),
        &merge(serde_json::json!({"spec": {"replicas": 3}})),
    )
    .await
    .expect("scaled through v1beta1");
    let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), ns);
    wait_until(
        "old-one's StatefulSet at 3 replicas",
        STEP_TIMEOUT,
        || async {
            let sts = statefulsets.get_opt("old-one-postgresql").await?;
            Ok(sts
                .filter(|s| s.spec.as_ref().and_then(|s| s.replicas) == Some(3))
                .map(|_| ()))
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}\n{}", webhook.manager.output().join("\n")));
    wait_until(
        "old-one's status from the controller",
        STEP_TIMEOUT,
        || async {
            let cluster = beta.get("old-one").await?;
            Ok(cluster.status.and_then(|s| s.phase).map(|_| ()))
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));
}
