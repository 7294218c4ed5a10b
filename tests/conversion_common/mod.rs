//! Shared by the conversion webhook's integration tests: they change the test bed's CRDs (both
//! versions, converting through a manager they run), one test at a time, and put the
//! v1beta1-only CRDs back whatever happens.

#![allow(dead_code)] // each test file uses a different part

use std::time::Duration;

use futures::FutureExt as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use pgkube_crds::{StorageVersion, v1alpha1, v1beta1};
use pgkube_testkit::{CRD_FIELD_MANAGER, TestEnv, install_crds, wait_until};

pub const STEP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a manager may take to exit after SIGTERM: its 30 s grace period for reconciles in
/// flight, with room for a busy machine.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// The CRDs are the test bed's, shared by the tests of a file: one at a time changes them.
/// (Test files run one after another.)
static CRDS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs `scenario` while holding the CRDs, and puts the v1beta1-only CRDs back whatever
/// happens: a CRD left converting through a stopped manager would fail later tests.
pub async fn holding_the_crds(client: &Client, scenario: impl std::future::Future<Output = ()>) {
    let _held = CRDS.lock().await;
    let outcome = std::panic::AssertUnwindSafe(scenario).catch_unwind().await;
    restore_crds(client).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Applies `crds` (as the test kit's field manager, so that [`install_crds`] puts the
/// v1beta1-only ones back) and, if `wait_served`, waits until v1alpha1 is served (a list in the
/// version not stored needs a conversion webhook that answers).
pub async fn install(client: &Client, crds: &[CustomResourceDefinition], wait_served: bool) {
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
    let clusters = Api::<v1alpha1::PostgreSQLCluster>::all(client.clone());
    wait_until("v1alpha1 to be served", STEP_TIMEOUT, || async {
        Ok(clusters.list(&Default::default()).await.ok().map(|_| ()))
    })
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));
}

/// Takes the conversion stanza out (its `caBundle` belongs to the manager's field manager, so
/// the test kit's apply alone would leave it), then puts the v1beta1-only CRDs back.
pub async fn restore_crds(client: &Client) {
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

/// Runs `pgkube migrate-storage` against the test bed; returns its output.
pub async fn migrate_storage(env: &TestEnv) -> String {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgkube"))
        .arg("migrate-storage")
        .env("KUBECONFIG", &env.kubeconfig)
        .output()
        .await
        .expect("running pgkube migrate-storage");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "pgkube migrate-storage failed: {}{}",
        text,
        String::from_utf8_lossy(&output.stderr)
    );
    text
}

/// Applies `crds` (which store in `storage` and convert through a webhook that serves), moves
/// every object there with `pgkube migrate-storage`, and checks that each CRD's storedVersions
/// is then that version alone.
pub async fn move_storage_to(
    env: &TestEnv,
    client: &Client,
    crds: &[CustomResourceDefinition],
    storage: StorageVersion,
) {
    install(client, crds, true).await;
    // The API server takes a CRD change up asynchronously: give it a moment before rewriting,
    // so that the writes already use the new storage version.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let output = migrate_storage(env).await;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        let name = crd.name_any();
        let expected = format!("storedVersions [{}]", storage.name());
        assert!(
            output
                .lines()
                .any(|l| l.starts_with(&name) && l.ends_with(&expected)),
            "{output}"
        );
        let installed = api.get(&name).await.expect("CRD");
        let stored = installed.status.and_then(|s| s.stored_versions);
        assert_eq!(stored, Some(vec![storage.name().to_owned()]), "{name}");
    }
}

/// A v1alpha1 cluster of 2 instances with a label and a PostgreSQL setting.
pub fn cluster_v1alpha1(name: &str) -> v1alpha1::PostgreSQLCluster {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "db.example.com/v1alpha1",
        "kind": "PostgreSQLCluster",
        "metadata": {"name": name, "labels": {"team": "payments"}},
        "spec": {"replicas": 2, "version": "15", "storage": "3Gi",
                 "postgresql": {"parameters": {"work_mem": "16MB"}}},
    }))
    .expect("v1alpha1 cluster")
}

/// A v1beta1 cluster of 1 instance with a storage class, the field v1alpha1 lacks.
pub fn cluster_v1beta1(name: &str) -> v1beta1::PostgreSQLCluster {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "db.example.com/v1beta1",
        "kind": "PostgreSQLCluster",
        "metadata": {"name": name},
        "spec": {"replicas": 1, "postgresVersion": "15",
                 "storage": {"size": "2Gi", "storageClassName": "fast-ssd"}},
    }))
    .expect("v1beta1 cluster")
}
