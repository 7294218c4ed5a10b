//! `instance.json`, the file of the cluster's ConfigMap that tells each instance manager the
//! cluster's layout: which pod is the primary and how the others reach it, which pods are the
//! instances, and the cluster's identity.

use pgkube_crds::{S3Storage, ServerSideEncryption};
use serde::Serialize;

use crate::backup::decide::cluster_prefix;
use crate::storage::recovery::RecoveryOrder;
use crate::storage::recovery::in_place::InPlaceOrder;
use crate::storage::wal::{self, WalArchiveTarget};

use super::super::validate::ValidatedCluster;
use super::{BuildInput, ChildNames, POSTGRES_PORT};

/// `instance.json`: which pod is the primary and how the others reach it, and which pods are
/// the cluster's instances (`<statefulset>-0` up to `<statefulset>-(replicas - 1)`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InstanceTopology<'a> {
    primary: &'a str,
    primary_host: String,
    port: i32,
    replicas: i32,
    statefulset: &'a str,
    /// Recorded in the marker of a database an instance makes with initdb.
    cluster_uid: &'a str,
    /// The cluster's database: instances copy only from one that holds it, and an empty
    /// volume never gets a new one. Absent until the first primary reported it.
    #[serde(skip_serializing_if = "Option::is_none")]
    system_identifier: Option<&'a str>,
    /// With more than one instance, a restart of the primary for changed settings is a
    /// switchover (`failover::planned`): the primary does not restart itself. Left out for one
    /// instance, which restarts in place.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    restart_by_switchover: bool,
    /// How long the primary may be cut off from the API server and every replica before it
    /// fences itself. Absent for a single instance: nothing could be promoted in its place.
    #[serde(skip_serializing_if = "Option::is_none")]
    isolation_timeout_seconds: Option<u32>,
    /// Where the primary archives its WAL; absent when the cluster does not archive.
    #[serde(skip_serializing_if = "Option::is_none")]
    wal_archive: Option<WalArchiveTarget>,
    /// What the first instance recovers, until the cluster recorded its database.
    #[serde(skip_serializing_if = "Option::is_none")]
    recovery: Option<&'a RecoveryOrder>,
    /// An in-place recovery under way: what the instances do now.
    #[serde(skip_serializing_if = "Option::is_none")]
    in_place: Option<&'a InPlaceOrder>,
    /// Every instance has its certificates: connections to another instance verify its
    /// certificate (`verify-full`); before, they use TLS when offered.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    tls_only: bool,
}

/// Where `cluster` archives its WAL in `storage`.
pub fn wal_archive_target(cluster: &ValidatedCluster, storage: &S3Storage) -> WalArchiveTarget {
    archive_target(
        storage,
        wal::archive_root(
            &cluster_prefix(storage, &cluster.namespace, &cluster.name),
            &cluster.name,
        ),
        format!("{}/{}", cluster.namespace, cluster.name),
    )
}

/// The settings of the archive at `root` in `storage`, of the cluster `<namespace>/<name>`,
/// for the instance managers: everything but the keys, which are files of the pod.
pub fn archive_target(storage: &S3Storage, root: String, cluster: String) -> WalArchiveTarget {
    WalArchiveTarget {
        bucket: storage.bucket.clone(),
        region: storage.region.clone(),
        endpoint: storage.endpoint.clone(),
        force_path_style: storage.force_path_style,
        root,
        cluster,
        ca_bundle: storage.ca_bundle.is_some(),
        keys: storage.credentials.is_some(),
        server_side_encryption: storage.server_side_encryption.map(|sse| match sse {
            ServerSideEncryption::Aes256 => "AES256".to_owned(),
            ServerSideEncryption::AwsKms => "aws:kms".to_owned(),
        }),
    }
}

/// The stable DNS name of instance `pod`, through the headless Service.
pub fn instance_host(names: &ChildNames, namespace: &str, pod: &str) -> String {
    format!("{pod}.{}.{namespace}.svc", names.headless_service)
}

pub(super) fn instance_json(
    cluster: &ValidatedCluster,
    names: &ChildNames,
    input: &BuildInput<'_>,
) -> String {
    let topology = InstanceTopology {
        primary: input.primary,
        primary_host: instance_host(names, &cluster.namespace, input.primary),
        port: POSTGRES_PORT,
        replicas: cluster.replicas,
        statefulset: &names.statefulset,
        cluster_uid: &cluster.owner.uid,
        system_identifier: input.system_identifier,
        restart_by_switchover: cluster.replicas > 1,
        isolation_timeout_seconds: (cluster.replicas > 1)
            .then_some(cluster.isolation_timeout_seconds),
        wal_archive: cluster
            .wal_archive
            .as_ref()
            .map(|storage| wal_archive_target(cluster, storage)),
        recovery: input.recovery,
        in_place: input.in_place,
        tls_only: input.tls_only,
    };
    // Strings and integers only: serializing cannot fail.
    serde_json::to_string(&topology).unwrap_or_default()
}
