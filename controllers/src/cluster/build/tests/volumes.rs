//! Tests of what the instance pods mount: the certificates, the storage keys (or none, for
//! the pods' identity), a recovery's source.

use super::*;

/// The TLS volume's files: (Secret, key, path).
fn tls_files(children: &DesiredChildren) -> Vec<(String, String, String)> {
    let pod = pod_spec(children);
    let tls = pod
        .volumes
        .iter()
        .flatten()
        .find(|volume| volume.name == "tls")
        .and_then(|volume| volume.projected.as_ref())
        .expect("the TLS volume");
    tls.sources
        .iter()
        .flatten()
        .flat_map(|source| {
            let secret = source.secret.as_ref().expect("a Secret");
            assert_eq!(secret.optional, None, "a pod never starts without TLS");
            secret
                .items
                .iter()
                .flatten()
                .map(|item| (secret.name.clone(), item.key.clone(), item.path.clone()))
        })
        .collect()
}

fn file(secret: &str, key: &str, path: &str) -> (String, String, String) {
    (secret.to_owned(), key.to_owned(), path.to_owned())
}

#[test]
fn the_pods_mount_the_clusters_certificates_and_wait_for_them() {
    let children = built(&validated("my-cluster", 3));
    assert_eq!(
        tls_files(&children),
        [
            file("my-cluster-server-tls", "ca.crt", "ca.crt"),
            file("my-cluster-replication-tls", "ca.crt", "client-ca.crt"),
            file("my-cluster-server-tls", "tls.crt", "tls.crt"),
            file("my-cluster-server-tls", "tls.key", "tls.key"),
            file("my-cluster-replication-tls", "tls.crt", "replication.crt"),
            file("my-cluster-replication-tls", "tls.key", "replication.key"),
            file("my-cluster-superuser-tls", "tls.crt", "superuser.crt"),
            file("my-cluster-superuser-tls", "tls.key", "superuser.key"),
        ]
    );
    // Each pod says so, for the rollout's TLS-only check.
    assert!(templated_pod(&children).tls);
}

#[test]
fn a_server_certificate_of_ones_own_is_mounted_with_its_ca_and_pgkubes_client_ca() {
    let mut own = validated("my-cluster", 3);
    own.server_certificates = Some(pgkube_crds::ServerCertificates {
        server_tls_secret: "my-cert".to_owned(),
        server_ca_secret: Some("my-ca".to_owned()),
        client_ca_secret: None,
    });
    let files = tls_files(&built(&own));
    assert_eq!(
        files[..4],
        [
            file("my-ca", "ca.crt", "ca.crt"),
            file("my-cluster-replication-tls", "ca.crt", "client-ca.crt"),
            file("my-cert", "tls.crt", "tls.crt"),
            file("my-cert", "tls.key", "tls.key"),
        ]
    );
    // Without a CA Secret of its own, the CA is the one cert-manager writes beside the key.
    own.server_certificates = Some(pgkube_crds::ServerCertificates {
        server_tls_secret: "my-cert".to_owned(),
        server_ca_secret: None,
        client_ca_secret: None,
    });
    assert_eq!(
        tls_files(&built(&own))[0],
        file("my-cert", "ca.crt", "ca.crt")
    );
}

#[test]
fn an_applications_client_ca_is_mounted_for_the_server_and_said_on_the_pods() {
    let mut own = validated("my-cluster", 3);
    own.server_certificates = Some(pgkube_crds::ServerCertificates {
        server_tls_secret: "my-cert".to_owned(),
        server_ca_secret: None,
        client_ca_secret: Some("apps-ca".to_owned()),
    });
    let children = built(&own);
    assert!(
        tls_files(&children).contains(&file("apps-ca", "ca.crt", "user-client-ca.crt")),
        "{:?}",
        tls_files(&children)
    );
    assert!(templated_pod(&children).client_ca);
    // Without one: neither the file nor the annotation.
    let plain = built(&validated("my-cluster", 3));
    assert!(
        tls_files(&plain)
            .iter()
            .all(|(_, _, path)| path != "user-client-ca.crt")
    );
    assert!(!templated_pod(&plain).client_ca);
}

/// A pod made from the StatefulSet's template, as the rollout sees it.
fn templated_pod(children: &DesiredChildren) -> crate::cluster::rollout::LivePod {
    let template = children
        .statefulset
        .spec
        .as_ref()
        .expect("spec")
        .template
        .clone();
    crate::cluster::rollout::LivePod::of(&k8s_openapi::api::core::v1::Pod {
        metadata: template.metadata.expect("template metadata"),
        ..k8s_openapi::api::core::v1::Pod::default()
    })
}

#[test]
fn custom_metric_queries_are_an_optional_configmap_file_named_to_the_instance_manager() {
    let mut monitored = validated("my-cluster", 3);
    monitored.custom_queries = Some(k8s_openapi::api::core::v1::ConfigMapKeySelector {
        name: "pg-metrics".to_owned(),
        key: "custom.yaml".to_owned(),
        optional: None,
    });
    let pod = pod_spec(&built(&monitored));
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|volume| volume.name == "metrics-queries")
        .and_then(|volume| volume.config_map.clone())
        .expect("the queries' volume");
    assert_eq!(volume.name, "pg-metrics");
    assert_eq!(
        volume.optional,
        Some(true),
        "a missing ConfigMap starts the pod"
    );
    let items = volume.items.expect("items");
    assert_eq!(
        (items[0].key.as_str(), items[0].path.as_str()),
        ("custom.yaml", "queries.yaml")
    );
    let container = &pod.containers[0];
    let env = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "PGKUBE_METRICS_QUERIES");
    assert_eq!(
        env.and_then(|e| e.value.as_deref()),
        Some("/etc/pgkube/metrics/queries.yaml")
    );
    assert!(
        container
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "metrics-queries" && m.mount_path == "/etc/pgkube/metrics")
    );
    let plain = pod_spec(&built(&validated("my-cluster", 3)));
    assert!(
        plain
            .volumes
            .iter()
            .flatten()
            .all(|v| v.name != "metrics-queries")
    );
}

#[test]
fn a_cluster_archives_wal_to_its_backup_storage_unless_told_not_to() {
    let archiving = validated("my-cluster", 3);
    let children = built(&archiving);
    let config = &children.config_map.data.as_ref().expect("data")[CONFIG_FILE];
    assert!(
        config.contains("archive_mode = on\narchive_timeout = 60s\n"),
        "{config}"
    );
    // The keys are files of an optional projection: a missing Secret does not stop the server.
    let pod = pod_spec(&children);
    let s3 = pod
        .volumes
        .iter()
        .flatten()
        .find(|volume| volume.name == "s3")
        .and_then(|volume| volume.projected.as_ref())
        .expect("the S3 volume");
    for source in s3.sources.iter().flatten() {
        let secret = source.secret.as_ref().expect("a Secret");
        assert_eq!(secret.optional, Some(true), "{secret:?}");
    }
    let not_archiving = ValidatedCluster {
        wal_archive: None,
        ..archiving
    };
    let children = built(&not_archiving);
    let data = children.config_map.data.as_ref().expect("data");
    assert!(data[CONFIG_FILE].contains("archive_mode = off\n"));
    assert!(!data[INSTANCE_FILE].contains("walArchive"));
    let pod = pod_spec(&children);
    assert!(
        pod.volumes
            .iter()
            .flatten()
            .all(|volume| volume.name != "s3")
    );
}

#[test]
fn without_keys_the_instances_archive_with_the_identity_of_the_clusters_account() {
    let mut archiving = validated("my-cluster", 3);
    archiving.service_account_name = Some("wal-writer".to_owned());
    if let Some(storage) = archiving.wal_archive.as_mut() {
        storage.credentials = None;
    }
    let children = built(&archiving);
    let pod = pod_spec(&children);
    assert_eq!(pod.service_account_name.as_deref(), Some("wal-writer"));
    let s3 = pod
        .volumes
        .iter()
        .flatten()
        .find(|volume| volume.name == "s3")
        .and_then(|volume| volume.projected.as_ref())
        .expect("the S3 volume");
    assert_eq!(s3.sources.as_deref(), Some(&[][..]), "no key files");
    let instance = json(&children);
    assert_eq!(instance["walArchive"]["keys"], false, "{instance}");
    // With keys: the default account, and the instance manager reads the key files.
    let with_keys = built(&validated("my-cluster", 3));
    assert_eq!(pod_spec(&with_keys).service_account_name, None);
    assert_eq!(json(&with_keys)["walArchive"]["keys"], true);
}

#[test]
fn a_recovering_cluster_mounts_the_sources_keys_and_gives_its_instances_the_order() {
    use crate::storage::recovery::{BaseObject, RecoveryOrder};
    let mut cluster = validated("my-cluster", 2);
    let source = cluster.wal_archive.clone().expect("the sample has storage");
    cluster.recovery_storage = Some(source.clone());
    let order = RecoveryOrder {
        archive: super::archive_target(&source, "old/wal/old/".to_owned(), "ns/old".to_owned()),
        backup: "old/uid/base/uid/manifest.json".to_owned(),
        base: BaseObject {
            key: "old/uid/base/uid/base.tar.zst".to_owned(),
            size: 10,
            sha256: "ab".to_owned(),
        },
        system_identifier: "7312345678901234567".to_owned(),
        stop_lsn: "0/5000100".to_owned(),
        target: pgkube_crds::RecoveryTarget::default(),
    };
    let children = build(
        &cluster,
        &BuildInput {
            recovery: Some(&order),
            ..input("postgres")
        },
    );
    let topology: serde_json::Value =
        serde_json::from_str(&children.config_map.data.as_ref().expect("data")[INSTANCE_FILE])
            .expect("instance.json");
    assert_eq!(topology["recovery"]["archive"]["root"], "old/wal/old/");
    assert_eq!(
        topology["recovery"]["systemIdentifier"],
        "7312345678901234567"
    );
    let pod = pod_spec(&children);
    assert!(
        pod.volumes
            .iter()
            .flatten()
            .any(|volume| volume.name == "recovery-s3"),
        "the source's keys are mounted"
    );
    let env = container(&children).env.clone().unwrap_or_default();
    assert!(env.iter().any(|var| var.name == "PGKUBE_RECOVERY_S3_DIR"));
    // Recorded: no order, and instances never recover again.
    assert!(
        !built(&cluster).config_map.data.as_ref().expect("data")[INSTANCE_FILE]
            .contains("recovery\"")
    );
}
