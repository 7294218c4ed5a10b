//! Pods admitted as restricted, on the test bed's real node: in a namespace where the API server
//! enforces the `restricted` Pod Security Standard, a three-instance PostgreSQL 15 cluster runs,
//! a backup Job completes and a restore Job brings the data back. A privileged pod is refused
//! there, so the namespace does enforce.

mod common;
mod restore_common;

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use pgkube_crds::RestorePhase;
use pgkube_testkit::restore_of_backup;
use restore_common::{Fixture, phase, with_drop_existing};

#[tokio::test]
async fn a_restricted_namespace_runs_a_cluster_a_backup_and_a_restore() {
    let Some(fixture) = Fixture::start_restricted("restricted").await else {
        return;
    };
    assert_privileged_pods_are_refused(&fixture).await;
    let before = fixture.digest().await;
    fixture.backup("kept").await;
    fixture
        .cluster
        .sql()
        .await
        .expect("SQL")
        .batch_execute("DELETE FROM items WHERE id > 500")
        .await
        .expect("rows deleted");
    assert_ne!(fixture.digest().await, before);

    fixture
        .restore("back", with_drop_existing(restore_of_backup("kept", "pg")))
        .await;
    let restored = fixture.restore_ended("back").await;
    assert_eq!(
        phase(&restored),
        Some(RestorePhase::Completed),
        "{:?}",
        restored.status
    );
    assert_eq!(fixture.digest().await, before);
    fixture.stop().await;
}

/// The namespace enforces: a pod asking for privileges is refused at admission.
async fn assert_privileged_pods_are_refused(fixture: &Fixture) {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "privileged"},
        "spec": {"containers": [{
            "name": "c", "image": "busybox",
            "securityContext": {"privileged": true},
        }]},
    }))
    .expect("a pod");
    let refused = fixture
        .running
        .api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await
        .expect_err("a privileged pod is refused");
    assert!(
        refused
            .to_string()
            .contains("violates PodSecurity \"restricted:latest\""),
        "{refused}"
    );
}
