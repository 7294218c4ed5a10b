//! The fixture of the restore tests on the real node (`restore_on_real_node.rs`,
//! `restricted_on_real_node.rs`): a running PostgreSQL 15 cluster `pg` with data in two
//! databases, whose backups go to a fresh bucket of the test bed's Garage, and the helpers its
//! tests share.
#![allow(dead_code)] // Each test binary uses a different part.

use std::time::Duration;

use crate::common::Running;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams};
use pgkube_controllers::storage::manifest::Manifest;
use pgkube_crds::{
    BackupPhase, DeletionPolicy, PostgreSQLBackup, PostgreSQLCluster, PostgreSQLRestore,
    PostgreSQLRestoreSpec, RestorePhase, S3Storage,
};
use pgkube_testkit::{
    ClusterDigest, RESTORE_CONDITION, TestBucket, TestCluster, TestEnv, backup_config, condition,
    create_backup, create_restore, create_s3_secret, describe_restore, restore_condition,
    restore_jobs, test_storage, wait_backup_ended, wait_for_cluster, wait_restore_ended,
    wait_until,
};

pub const RESYNC: Duration = Duration::from_secs(30);
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(300);
pub const BACKUP_TIMEOUT: Duration = Duration::from_secs(180);
pub const RESTORE_TIMEOUT: Duration = Duration::from_secs(240);
/// A new cluster's start plus its bootstrap restore.
pub const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(420);
/// Longer than a minute tick plus the timer's and the watches' delays.
pub const TICK: Duration = Duration::from_secs(150);
/// A schedule that never comes during a test (1 January, 00:00), so that only the tests'
/// own backups run.
pub const NEVER: &str = "0 0 1 1 *";
pub const S3_SECRET: &str = "s3-keys";

/// The data every fixture's cluster starts with, in database `postgres`: a role, two tables
/// and a grant that needs the role (so a restore must bring globals back before the tables).
pub const POSTGRES_DATA: &str = "CREATE ROLE reporter NOLOGIN;
     CREATE TABLE items (id int PRIMARY KEY, name text);
     INSERT INTO items SELECT i, 'item ' || i FROM generate_series(1, 1000) i;
     CREATE TABLE notes (id int PRIMARY KEY, body text, written date);
     INSERT INTO notes SELECT i, md5(i::text), date '2024-01-01' + i FROM generate_series(1, 50) i;
     GRANT SELECT ON items TO reporter;";
/// ...and in database `shop`.
pub const SHOP_DATA: &str = "CREATE TABLE orders (id int PRIMARY KEY, customer text, total numeric(10, 2));
     INSERT INTO orders SELECT i, 'customer ' || (i % 17), i * 1.25 FROM generate_series(1, 200) i;";

/// A running cluster `pg` with data, whose backups go to a fresh bucket.
pub struct Fixture {
    pub running: Running,
    pub env: TestEnv,
    pub cluster: TestCluster,
    pub bucket: TestBucket,
}

impl Fixture {
    pub async fn start(prefix: &str) -> Option<Fixture> {
        Fixture::start_with(prefix, Vec::new()).await
    }

    /// With `otel_env` as the manager's `OTEL_*` environment, which the controllers pass on to
    /// their Jobs.
    pub async fn start_with(prefix: &str, otel_env: Vec<(String, String)>) -> Option<Fixture> {
        Fixture::start_configured(prefix, otel_env, None).await
    }

    /// A cluster of three instances in a namespace where the API server enforces the
    /// `restricted` Pod Security Standard: every pod pgkube makes must pass it to be created.
    pub async fn start_restricted(prefix: &str) -> Option<Fixture> {
        Fixture::start_configured(prefix, Vec::new(), Some(3)).await
    }

    async fn start_configured(
        prefix: &str,
        otel_env: Vec<(String, String)>,
        restricted_replicas: Option<i32>,
    ) -> Option<Fixture> {
        let mut running = Running::start(prefix, RESYNC).await?;
        if !otel_env.is_empty() {
            running
                .restart_with(|settings| settings.otel_env = otel_env)
                .await;
        }
        if restricted_replicas.is_some() {
            enforce_restricted(&running).await;
        }
        let env = pgkube_testkit::testbed()?;
        let bucket = TestBucket::create(&env, "restores").await;
        create_s3_secret(
            &running.client,
            &env,
            running.namespace.name(),
            S3_SECRET,
            None,
        )
        .await
        .expect("S3 Secret");
        let storage = test_storage(&env, bucket.name(), S3_SECRET);
        let cluster = TestCluster::builder("pg")
            .spec(|spec| spec.backup = Some(backup_config(storage, NEVER)))
            .replicas(restricted_replicas.unwrap_or(1))
            .timeout(CLUSTER_TIMEOUT)
            .start(&running.namespace)
            .await
            .unwrap_or_else(|error| panic!("the cluster becomes Running: {error:#}"));
        let sql = cluster.sql().await.expect("SQL");
        sql.batch_execute(POSTGRES_DATA)
            .await
            .expect("data written");
        // On its own: CREATE DATABASE cannot run in the implicit transaction of a batch.
        sql.batch_execute("CREATE DATABASE shop")
            .await
            .expect("database created");
        cluster
            .sql_to("shop")
            .await
            .expect("SQL to shop")
            .batch_execute(SHOP_DATA)
            .await
            .expect("shop data written");
        Some(Fixture {
            running,
            env,
            cluster,
            bucket,
        })
    }

    pub fn namespace(&self) -> &str {
        self.running.namespace.name()
    }

    pub fn client(&self) -> &kube::Client {
        &self.running.client
    }

    /// The test bed's Garage, the fixture's bucket, with the keys of the test's Secret.
    pub fn storage(&self) -> S3Storage {
        test_storage(&self.env, self.bucket.name(), S3_SECRET)
    }

    /// Backs the cluster up as `name` and waits until the backup Completed.
    pub async fn backup(&self, name: &str) -> PostgreSQLBackup {
        create_backup(
            self.client(),
            self.namespace(),
            name,
            self.cluster.name(),
            DeletionPolicy::Retain,
        )
        .await
        .expect("backup created");
        let backup = wait_backup_ended(self.client(), self.namespace(), name, BACKUP_TIMEOUT)
            .await
            .unwrap_or_else(|error| panic!("{error:#}"));
        assert_eq!(
            backup.status.as_ref().and_then(|s| s.phase),
            Some(BackupPhase::Completed),
            "{:?}",
            backup.status
        );
        backup
    }

    /// The manifest key of a Completed backup, and the manifest.
    pub async fn manifest(&self, backup: &PostgreSQLBackup) -> (String, Manifest) {
        let key = backup
            .status
            .as_ref()
            .and_then(|s| s.object_key.clone())
            .expect("the backup's manifest key");
        let bytes = self.bucket.object(&key).await.expect("manifest");
        let manifest = Manifest::parse(&key, &bytes).expect("a manifest");
        (key, manifest)
    }

    pub async fn restore(&self, name: &str, spec: PostgreSQLRestoreSpec) -> PostgreSQLRestore {
        create_restore(self.client(), self.namespace(), name, spec)
            .await
            .expect("restore created")
    }

    pub async fn restore_ended(&self, name: &str) -> PostgreSQLRestore {
        wait_restore_ended(self.client(), self.namespace(), name, RESTORE_TIMEOUT)
            .await
            .unwrap_or_else(|error| panic!("{error:#}"))
    }

    /// The fixture cluster's data now.
    pub async fn digest(&self) -> ClusterDigest {
        digest_of(&self.cluster).await
    }

    /// Waits until cluster `name` shows condition `type_` with `status` and `reason`.
    pub async fn wait_cluster_condition(
        &self,
        name: &str,
        type_: &str,
        status: &str,
        reason: &str,
    ) -> PostgreSQLCluster {
        wait_for_cluster(
            self.client(),
            self.namespace(),
            name,
            &format!("condition {type_}={status} reason {reason}"),
            Duration::from_secs(90),
            |cluster| {
                condition(cluster, type_).is_some_and(|c| c.status == status && c.reason == reason)
            },
        )
        .await
        .unwrap_or_else(|error| panic!("{error:#}"))
    }

    /// Deletes the restores while the controllers run (in case they hold finalizers), then the
    /// clusters, the controllers, the namespace and the bucket.
    pub async fn stop(self) {
        let restores = self.running.api::<PostgreSQLRestore>();
        let _ = restores
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
        let gone = wait_until(
            "the test's restores to be deleted",
            Duration::from_secs(60),
            || async {
                let left = restores.list_metadata(&ListParams::default()).await?;
                Ok(left.items.is_empty().then_some(()))
            },
        )
        .await;
        if let Err(error) = gone {
            eprintln!("warning: {error:#}");
        }
        self.cluster
            .delete(Duration::from_secs(120))
            .await
            .expect("cluster deleted");
        self.running.stop().await;
        self.bucket.cleanup().await;
    }
}

/// Labels the test's namespace so that the API server admits only pods that pass the
/// `restricted` Pod Security Standard.
async fn enforce_restricted(running: &Running) {
    let labels = serde_json::json!({"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}});
    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(running.client.clone())
        .patch(
            running.namespace.name(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(labels),
        )
        .await
        .expect("the namespace labelled restricted");
}

pub async fn digest_of(cluster: &TestCluster) -> ClusterDigest {
    pgkube_testkit::cluster_digest(cluster)
        .await
        .unwrap_or_else(|error| panic!("digest of {}: {error:#}", cluster.name()))
}

pub fn phase(restore: &PostgreSQLRestore) -> Option<RestorePhase> {
    restore.status.as_ref().and_then(|s| s.phase)
}

pub fn with_drop_existing(mut spec: PostgreSQLRestoreSpec) -> PostgreSQLRestoreSpec {
    spec.drop_existing = true;
    spec
}

/// Asserts that `restore` failed with `reason` before any Job was made for it.
pub async fn assert_refused(fixture: &Fixture, restore: &PostgreSQLRestore, reason: &str) {
    let name = restore.name_any();
    assert_eq!(
        phase(restore),
        Some(RestorePhase::Failed),
        "{}",
        describe_restore(restore)
    );
    let shown = restore_condition(restore, RESTORE_CONDITION).expect("Completed condition");
    assert_eq!(
        (shown.status.as_str(), shown.reason.as_str()),
        ("False", reason),
        "{}",
        describe_restore(restore)
    );
    let status = restore.status.clone().unwrap_or_default();
    assert!(
        status.message.as_deref().is_some_and(|m| !m.is_empty()),
        "a refusal says why: {}",
        describe_restore(restore)
    );
    assert_eq!(status.job_name, None, "{}", describe_restore(restore));
    let jobs = restore_jobs(fixture.client(), fixture.namespace(), &name)
        .await
        .expect("jobs");
    assert!(
        jobs.is_empty(),
        "no Job for refused restore {name}: {:?}",
        jobs.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );
}
