//! Pods admitted as restricted, on the test bed's real node: in a namespace where the API server
//! enforces the `restricted` Pod Security Standard, a three-instance PostgreSQL 15 cluster runs,
//! a backup Job completes and a restore Job brings the data back. A privileged pod is refused
//! there, so the namespace does enforce. The instances run on a read-only root filesystem, which
//! the node enforces, and write only to their volumes.

mod common;
mod restore_common;

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use pgkube_crds::RestorePhase;
use pgkube_testkit::{instance_manager_of, mount_options, restore_of_backup};
use restore_common::{Fixture, phase, with_drop_existing};

#[tokio::test]
async fn a_restricted_namespace_runs_a_cluster_a_backup_and_a_restore() {
    let Some(fixture) = Fixture::start_restricted("restricted").await else {
        return;
    };
    assert_privileged_pods_are_refused(&fixture).await;
    assert_root_filesystems_are_read_only(&fixture).await;
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

/// Every container of every instance says `readOnlyRootFilesystem`, and its processes see `/`
/// read-only, with the socket directory and `/tmp` writable volumes.
async fn assert_root_filesystems_are_read_only(fixture: &Fixture) {
    let namespace = fixture.namespace();
    let pods = fixture.cluster.pods().await.expect("pods");
    assert_eq!(pods.len(), 3);
    for pod in pods {
        let spec = fixture
            .running
            .api::<Pod>()
            .get(&pod.name)
            .await
            .expect("the pod")
            .spec
            .expect("a spec");
        for container in spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
        {
            let read_only = container
                .security_context
                .as_ref()
                .and_then(|context| context.read_only_root_filesystem);
            assert_eq!(read_only, Some(true), "{} of {}", container.name, pod.name);
        }
        let manager = instance_manager_of(namespace, &pod.name).expect("the manager runs");
        // Where /var/run links to /run, the kernel names the mount by the link's target.
        let mode = |mount_points: &[&str]| {
            mount_points
                .iter()
                .find_map(|mount_point| mount_options(manager, mount_point))
                .and_then(|options| options.first().cloned())
                .unwrap_or_else(|| panic!("{mount_points:?} is mounted in {}", pod.name))
        };
        assert_eq!(mode(&["/"]), "ro", "the root of {}", pod.name);
        assert_eq!(mode(&["/tmp"]), "rw", "/tmp of {}", pod.name);
        let socket = mode(&["/var/run/postgresql", "/run/postgresql"]);
        assert_eq!(socket, "rw", "the socket directory of {}", pod.name);
    }
}
