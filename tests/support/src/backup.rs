//! Backups in end-to-end tests: the test bed's Garage as a cluster's backup storage (with the
//! keys in a Secret of the test's namespace), and waiting for a PostgreSQLBackup to end.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Secret, SecretKeySelector};
use kube::Client;
use kube::api::{Api, PostParams};
use pgkube_crds::{
    BackupPhase, BackupSchedule, BackupSpec, BackupStorage, DeletionPolicy, LocalReference,
    PostgreSQLBackup, PostgreSQLBackupSpec, RetentionPolicy, S3Credentials, S3Storage,
};

use crate::TestEnv;
use crate::wait::wait_until;

/// Keys of the S3 credentials Secret [`create_s3_secret`] makes.
pub const ACCESS_KEY_ID_KEY: &str = "access-key-id";
pub const SECRET_ACCESS_KEY_KEY: &str = "secret-access-key";

/// Creates Secret `name` in `namespace` holding the test bed's S3 keys (with
/// `secret_access_key` instead of the real one when given: a wrong key).
pub async fn create_s3_secret(
    client: &Client,
    env: &TestEnv,
    namespace: &str,
    name: &str,
    secret_access_key: Option<&str>,
) -> anyhow::Result<Secret> {
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..kube::api::ObjectMeta::default()
        },
        string_data: Some(BTreeMap::from([
            (ACCESS_KEY_ID_KEY.to_owned(), env.s3_access_key.clone()),
            (
                SECRET_ACCESS_KEY_KEY.to_owned(),
                secret_access_key.unwrap_or(&env.s3_secret_key).to_owned(),
            ),
        ])),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .with_context(|| format!("creating Secret {name}"))
}

/// The test bed's Garage, bucket `bucket`, with the keys of Secret `secret` (see
/// [`create_s3_secret`]). The endpoint is on 127.0.0.1, which pods on the real node reach as
/// the host.
pub fn test_storage(env: &TestEnv, bucket: &str, secret: &str) -> S3Storage {
    let selector = |key: &str| SecretKeySelector {
        name: secret.to_owned(),
        key: key.to_owned(),
        optional: None,
    };
    S3Storage {
        bucket: bucket.to_owned(),
        prefix: None,
        endpoint: Some(env.s3_endpoint.clone()),
        region: env.s3_region.clone(),
        force_path_style: true,
        ca_bundle: None,
        credentials: Some(S3Credentials {
            access_key_id: selector(ACCESS_KEY_ID_KEY),
            secret_access_key: selector(SECRET_ACCESS_KEY_KEY),
        }),
        server_side_encryption: None,
        // The test bed's Garage speaks plain HTTP on loopback.
        allow_plain_http: env.s3_endpoint.starts_with("http://"),
    }
}

/// Backup settings on `storage` with the cron expression `schedule`, retention 7 days.
pub fn backup_config(storage: S3Storage, schedule: &str) -> BackupSpec {
    BackupSpec {
        schedule: BackupSchedule {
            cron: schedule.to_owned(),
            time_zone: None,
            suspend: false,
        },
        retention: RetentionPolicy { days: 7 },
        storage: Some(BackupStorage { s3: storage }),
        compression: None,
        method: None,
        wal_archiving: None,
    }
}

/// Creates a PostgreSQLBackup `name` of `cluster` in `namespace`.
pub async fn create_backup(
    client: &Client,
    namespace: &str,
    name: &str,
    cluster: &str,
    deletion_policy: DeletionPolicy,
) -> anyhow::Result<PostgreSQLBackup> {
    let backup = PostgreSQLBackup::new(
        name,
        PostgreSQLBackupSpec {
            cluster: LocalReference {
                name: cluster.to_owned(),
            },
            method: Default::default(),
            target: None,
            deletion_policy,
            compression: None,
        },
    );
    Api::<PostgreSQLBackup>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &backup)
        .await
        .with_context(|| format!("creating PostgreSQLBackup {name}"))
}

/// Waits until backup `name` is Completed or Failed, and returns it; the error shows its
/// last status.
pub async fn wait_backup_ended(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<PostgreSQLBackup> {
    let api = Api::<PostgreSQLBackup>::namespaced(client.clone(), namespace);
    wait_until(&format!("backup {name} to end"), timeout, || async {
        let backup = api.get(name).await?;
        let status = backup.status.clone().unwrap_or_default();
        match status.phase {
            Some(BackupPhase::Completed | BackupPhase::Failed) => Ok(Some(backup)),
            _ => anyhow::bail!(
                "phase {:?}: {}",
                status.phase,
                status.message.unwrap_or_default()
            ),
        }
    })
    .await
}

/// The keys under `prefix` in `bucket`, with their sizes.
pub async fn list_objects(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    prefix: &str,
) -> anyhow::Result<BTreeMap<String, i64>> {
    let mut objects = BTreeMap::new();
    let mut pages = s3
        .list_objects_v2()
        .bucket(bucket)
        .prefix(prefix)
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        for object in page?.contents() {
            if let Some(key) = object.key() {
                objects.insert(key.to_owned(), object.size().unwrap_or(0));
            }
        }
    }
    Ok(objects)
}
