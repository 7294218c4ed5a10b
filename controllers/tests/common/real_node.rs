//! The fixture of the backup tests on the test bed's real node: a running PostgreSQL 15 cluster
//! with some data, whose backups go to a fresh bucket, and what they stored.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use pgkube_controllers::storage::manifest::Manifest;
use pgkube_crds::{
    BackupCompression, BackupPhase, DeletionPolicy, LocalReference, PostgreSQLBackup,
    PostgreSQLBackupSpec, S3Storage,
};
use pgkube_testkit::{
    TestBucket, TestCluster, backup_config, create_backup, create_s3_secret, list_objects,
    test_storage, wait_backup_ended,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::Running;

pub const RESYNC: Duration = Duration::from_secs(30);
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(300);
pub const BACKUP_TIMEOUT: Duration = Duration::from_secs(180);
/// A schedule that never comes during a test (1 January, 00:00), so that only the tests'
/// own backups run.
pub const NEVER: &str = "0 0 1 1 *";
pub const S3_SECRET: &str = "s3-keys";

/// A running cluster whose backups go to a fresh bucket; the cluster has some data.
pub struct Fixture {
    pub running: Running,
    pub cluster: TestCluster,
    /// The cluster's uid: its backups are under `<namespace>/pg/<uid>/`.
    pub cluster_uid: String,
    pub bucket: TestBucket,
}

impl Fixture {
    pub async fn start(prefix: &str) -> Option<Fixture> {
        Self::start_with(prefix, |_| {}).await
    }

    /// [`Fixture::start`], with `change` applied to the cluster's backup storage.
    pub async fn start_with(prefix: &str, change: impl FnOnce(&mut S3Storage)) -> Option<Fixture> {
        Self::start_configured(prefix, |_| {}, change).await
    }

    /// [`Fixture::start`], with `change` applied to the controllers' settings.
    pub async fn start_with_settings(
        prefix: &str,
        change: impl FnOnce(&mut pgkube_controllers::Settings),
    ) -> Option<Fixture> {
        Self::start_configured(prefix, change, |_| {}).await
    }

    async fn start_configured(
        prefix: &str,
        settings: impl FnOnce(&mut pgkube_controllers::Settings),
        change: impl FnOnce(&mut S3Storage),
    ) -> Option<Fixture> {
        let running = Running::start_with(prefix, RESYNC, settings).await?;
        let env = pgkube_testkit::testbed()?;
        let bucket = TestBucket::create(&env, "backups").await;
        create_s3_secret(
            &running.client,
            &env,
            running.namespace.name(),
            S3_SECRET,
            None,
        )
        .await
        .expect("S3 Secret");
        let mut storage = test_storage(&env, bucket.name(), S3_SECRET);
        change(&mut storage);
        let cluster = TestCluster::builder("pg")
            .spec(|spec| spec.backup = Some(backup_config(storage, NEVER)))
            .timeout(CLUSTER_TIMEOUT)
            .start(&running.namespace)
            .await
            .unwrap_or_else(|error| panic!("the cluster becomes Running: {error:#}"));
        let sql = cluster.sql().await.expect("SQL");
        sql.batch_execute(
            "CREATE TABLE items (id int PRIMARY KEY, name text);
             INSERT INTO items SELECT i, 'item ' || i FROM generate_series(1, 1000) i;",
        )
        .await
        .expect("data written");
        // On its own: CREATE DATABASE cannot run in the implicit transaction of a batch.
        sql.batch_execute("CREATE DATABASE shop")
            .await
            .expect("database created");
        let cluster_uid = running
            .clusters()
            .get(cluster.name())
            .await
            .expect("the cluster")
            .metadata
            .uid
            .expect("a uid");
        Some(Fixture {
            running,
            cluster,
            cluster_uid,
            bucket,
        })
    }

    /// `<namespace>/pg/<cluster-uid>/`: where the cluster's backups are.
    pub fn root(&self) -> String {
        format!("{}/pg/{}/", self.namespace(), self.cluster_uid)
    }

    pub fn namespace(&self) -> &str {
        self.running.namespace.name()
    }

    pub async fn backup(&self, name: &str, policy: DeletionPolicy) -> PostgreSQLBackup {
        create_backup(
            &self.running.client,
            self.namespace(),
            name,
            self.cluster.name(),
            policy,
        )
        .await
        .expect("backup created");
        wait_backup_ended(&self.running.client, self.namespace(), name, BACKUP_TIMEOUT)
            .await
            .unwrap_or_else(|error| panic!("{error:#}"))
    }

    /// Backup `name` compressed as `compression` says (`None`: as its cluster says), once ended.
    pub async fn compressed_backup(
        &self,
        name: &str,
        compression: Option<BackupCompression>,
    ) -> PostgreSQLBackup {
        let spec = PostgreSQLBackupSpec {
            cluster: LocalReference {
                name: self.cluster.name().to_owned(),
            },
            method: Default::default(),
            target: None,
            deletion_policy: DeletionPolicy::Retain,
            compression,
        };
        let backup = PostgreSQLBackup::new(name, spec);
        self.running
            .api::<PostgreSQLBackup>()
            .create(&Default::default(), &backup)
            .await
            .expect("backup created");
        wait_backup_ended(&self.running.client, self.namespace(), name, BACKUP_TIMEOUT)
            .await
            .unwrap_or_else(|error| panic!("{error:#}"))
    }

    /// The manifest of a completed backup, as JSON, and its Job's agent arguments.
    pub async fn manifest_and_arguments(&self, backup: &PostgreSQLBackup) -> (Value, String) {
        let status = backup.status.clone().unwrap_or_default();
        assert_eq!(status.phase, Some(BackupPhase::Completed), "{status:?}");
        let key = status.object_key.expect("object key");
        let bytes = self.bucket.object(&key).await.expect("manifest");
        Manifest::parse(&key, &bytes).expect("the controllers read it");
        let job_name = status.job_name.expect("job name");
        let job = self.running.api::<Job>().get(&job_name).await.expect("job");
        let pod = job.spec.and_then(|spec| spec.template.spec).expect("pod");
        let arguments = pod.containers[0].args.clone().unwrap_or_default().join(" ");
        let manifest = serde_json::from_slice(&bytes).expect("manifest JSON");
        (manifest, arguments)
    }

    /// The stored objects of every backup named `name` (whatever its uid), by key, with their
    /// sizes.
    pub async fn objects_of(&self, name: &str) -> std::collections::BTreeMap<String, i64> {
        self.objects_under(&format!("{}{name}/", self.root())).await
    }

    pub async fn objects_under(&self, prefix: &str) -> std::collections::BTreeMap<String, i64> {
        list_objects(&self.bucket.client(), self.bucket.name(), prefix)
            .await
            .expect("listing")
    }

    /// Every object under `prefix`, by key, with the SHA-256 of its bytes.
    pub async fn contents_under(&self, prefix: &str) -> std::collections::BTreeMap<String, String> {
        let mut contents = std::collections::BTreeMap::new();
        for key in self.objects_under(prefix).await.into_keys() {
            let bytes = self.bucket.object(&key).await.expect("object");
            contents.insert(key, hex::encode(Sha256::digest(&bytes)));
        }
        contents
    }

    pub async fn stop(self) {
        self.cluster
            .delete(Duration::from_secs(120))
            .await
            .expect("cluster deleted");
        self.running.stop().await;
        self.bucket.cleanup().await;
    }
}

pub fn phase(backup: &PostgreSQLBackup) -> Option<BackupPhase> {
    backup.status.as_ref().and_then(|s| s.phase)
}
