//! Storage ownership with the controllers running in-process against the test bed's API server
//! and Garage: which stored backups the retention passes and `deletionPolicy: Delete` touch.
//! No backup or restore Job runs: the clusters' simulated instances never answer, so their
//! backups wait (Pending) until a test sets their status as a completed backup's; backups are
//! put into the bucket as the agent lays them out; restores target a cluster that does not exist,
//! so they wait (Pending) too, or are set Running with a suspended Job (no pod) to follow.
//! Retention passes run every two seconds here instead of every hour.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use common::Running;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use pgkube_controllers::storage::manifest::{
    DATABASE_FORMAT, GLOBALS_FORMAT, MANIFEST_VERSION, Manifest, StoredObject,
};
use pgkube_controllers::storage::{NewObject, S3Bucket};
use pgkube_crds::{
    DeletionPolicy, PostgreSQLBackup, PostgreSQLCluster, PostgreSQLRestore, RestorePhase, S3Storage,
};
use pgkube_testkit::proxy::Proxy;
use pgkube_testkit::{
    TestBucket, TestEnv, backup_config, create_backup, create_restore, create_s3_secret,
    list_objects, put_object, restore_of_backup, restore_of_source, test_storage, wait_until,
};
use serde_json::json;
use sha2::{Digest, Sha256};

const RESYNC: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(90);
/// A schedule that never comes during a test: only the tests' own backups exist.
const NEVER: &str = "0 0 1 1 *";
const S3_SECRET: &str = "s3-keys";
/// The prefix every cluster of these tests stores its backups under.
const PREFIX: &str = "shared";
/// A cluster that does not exist: restores into it wait.
const NOWHERE: &str = "nowhere";

/// The controllers, a bucket and the keys to it in the test's namespace.
struct Bed {
    running: Running,
    env: TestEnv,
    bucket: TestBucket,
}

impl Bed {
    async fn start(prefix: &str) -> Option<Bed> {
        let running = Running::start_with(prefix, RESYNC, |settings| {
            settings.retention_interval = Duration::from_secs(2);
        })
        .await?;
        let env = pgkube_testkit::testbed()?;
        let bucket = TestBucket::create(&env, prefix).await;
        create_s3_secret(
            &running.client,
            &env,
            running.namespace.name(),
            S3_SECRET,
            None,
        )
        .await
        .expect("S3 Secret");
        Some(Bed {
            running,
            env,
            bucket,
        })
    }

    fn namespace(&self) -> &str {
        self.running.namespace.name()
    }

    fn storage(&self) -> S3Storage {
        let mut storage = test_storage(&self.env, self.bucket.name(), S3_SECRET);
        storage.prefix = Some(PREFIX.to_owned());
        storage
    }

    /// Cluster `name` whose backups go to [`PREFIX`], kept `retention_days`; its one instance
    /// never answers, so it never runs a backup. Returns its uid.
    async fn cluster(&self, name: &str, retention_days: i32) -> String {
        self.running
            .instances
            .answer(&format!("{name}-postgresql-0"), None);
        let mut cluster: PostgreSQLCluster =
            serde_yaml::from_str(common::SAMPLE).expect("sample parses");
        cluster.metadata.name = Some(name.to_owned());
        cluster.spec.replicas = 1;
        let mut config = backup_config(self.storage(), NEVER);
        config.retention.days = retention_days;
        cluster.spec.backup = Some(config);
        let created = self
            .running
            .clusters()
            .create(&PostParams::default(), &cluster)
            .await
            .expect("cluster created");
        created.metadata.uid.expect("a uid")
    }

    /// Stores backup `name` of the cluster with uid `cluster_uid`, made by the PostgreSQLBackup
    /// of uid `backup_uid` (`None`: a backup from before the uids, under `<prefix>/<name>/`),
    /// finished `days_ago` days ago. Returns its manifest's key and `sha256:` checksum.
    async fn put_backup(
        &self,
        cluster_uid: Option<&str>,
        name: &str,
        backup_uid: &str,
        days_ago: i64,
    ) -> (String, String) {
        let dir = match cluster_uid {
            Some(cluster_uid) => format!("{PREFIX}/{cluster_uid}/{name}/{backup_uid}/"),
            None => format!("{PREFIX}/{name}/"),
        };
        let s3 = self.bucket.client();
        let stored = |file: &str, format: &str| StoredObject {
            key: format!("{dir}{file}"),
            size: 4,
            sha256: hex::encode(Sha256::digest(b"data")),
            format: format.to_owned(),
            compression: None,
        };
        let finished = (Utc::now() - chrono::Duration::days(days_ago))
            .to_rfc3339_opts(SecondsFormat::Secs, true);
        let manifest = Manifest {
            manifest_version: MANIFEST_VERSION,
            cluster: "a".to_owned(),
            namespace: self.namespace().to_owned(),
            cluster_uid: cluster_uid.map(str::to_owned),
            system_identifier: None,
            backup_name: name.to_owned(),
            backup_uid: cluster_uid.map(|_| backup_uid.to_owned()),
            postgresql_version: "16.4".to_owned(),
            started_at: finished.clone(),
            finished_at: finished,
            format: DATABASE_FORMAT.to_owned(),
            physical: None,
            globals: Some(stored("globals.sql", GLOBALS_FORMAT)),
            databases: Vec::new(),
        };
        for file in ["globals.sql", "databases/app.dump"] {
            let key = format!("{dir}{file}");
            put_object(&s3, self.bucket.name(), &key, b"data".to_vec())
                .await
                .expect("object stored");
        }
        let bytes = serde_json::to_vec(&manifest).expect("manifest JSON");
        let checksum = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        let key = format!("{dir}manifest.json");
        put_object(&s3, self.bucket.name(), &key, bytes)
            .await
            .expect("manifest stored");
        (key, checksum)
    }

    /// The keys under `dir`.
    async fn keys_under(&self, dir: &str) -> Vec<String> {
        list_objects(&self.bucket.client(), self.bucket.name(), dir)
            .await
            .expect("listing")
            .into_keys()
            .collect()
    }

    /// Creates PostgreSQLBackup `name` of `cluster` and waits until the controller has it
    /// Pending (its cluster is not ready); returns its uid.
    async fn backup_object(&self, name: &str, cluster: &str, policy: DeletionPolicy) -> String {
        let created = create_backup(
            &self.running.client,
            self.namespace(),
            name,
            cluster,
            policy,
        )
        .await
        .expect("backup created");
        let backups = self.running.api::<PostgreSQLBackup>();
        wait_until(&format!("backup {name} Pending"), WAIT, || async {
            let backup = backups.get(name).await?;
            let phase = backup.status.and_then(|s| s.phase);
            let finalized = policy == DeletionPolicy::Retain
                || backup
                    .metadata
                    .finalizers
                    .unwrap_or_default()
                    .contains(&pgkube_crds::BACKUP_DATA_FINALIZER.to_owned());
            Ok((phase == Some(pgkube_crds::BackupPhase::Pending) && finalized).then_some(()))
        })
        .await
        .expect("the backup waits for its cluster");
        created.metadata.uid.expect("a uid")
    }

    /// Sets backup `name`'s status as a completed backup's whose manifest is `key`.
    async fn complete(&self, name: &str, key: &str, checksum: &str) {
        let status = json!({"status": {
            "phase": "Completed",
            "storage": {"s3": self.storage()},
            "objectKey": key,
            "checksum": checksum,
        }});
        self.running
            .api::<PostgreSQLBackup>()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .expect("status set");
    }

    /// Creates restore `name` and waits until the controller has it Pending.
    async fn pending_restore(&self, name: &str, spec: pgkube_crds::PostgreSQLRestoreSpec) {
        create_restore(&self.running.client, self.namespace(), name, spec)
            .await
            .expect("restore created");
        self.wait_restore(name, RestorePhase::Pending).await;
    }

    async fn wait_restore(&self, name: &str, phase: RestorePhase) {
        let restores = self.running.api::<PostgreSQLRestore>();
        wait_until(&format!("restore {name} {phase:?}"), WAIT, || async {
            let restore = restores.get(name).await?;
            Ok((restore.status.and_then(|s| s.phase) == Some(phase)).then_some(()))
        })
        .await
        .expect("restore phase");
    }

    /// Sets restore `name`'s phase (and Job) through the status subresource.
    async fn set_restore(&self, name: &str, status: serde_json::Value) {
        self.running
            .api::<PostgreSQLRestore>()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .expect("restore status set");
    }

    /// How many retention passes cluster `cluster` has had so far (its `RetentionPass` Events,
    /// series included).
    async fn passes(&self, cluster: &str) -> i32 {
        let events = self.running.api::<Event>();
        let list = events.list(&ListParams::default()).await.expect("events");
        list.items
            .iter()
            .filter(|e| e.reason.as_deref() == Some("RetentionPass"))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(cluster))
            .map(|e| e.series.as_ref().map_or(1, |series| series.count))
            .sum()
    }

    /// Waits until `dir` holds no key.
    async fn wait_gone(&self, dir: &str) {
        wait_until(&format!("{dir} to be emptied"), WAIT, || async {
            Ok(self.keys_under(dir).await.is_empty().then_some(()))
        })
        .await
        .expect("deleted");
    }

    async fn stop(self) {
        self.running.stop().await;
        self.bucket.cleanup().await;
    }
}

/// The object `undo-job` a Running restore follows: suspended, so it never starts a pod.
fn suspended_job(name: &str) -> Job {
    serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "suspend": true,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "idle", "image": "postgres:16"}]
            }}
        }
    }))
    .expect("a Job")
}

/// Two clusters share one prefix; cluster `a` keeps 7 days, `b` 90. An expired backup of `a`
/// that a Pending restore names, and one that a Running restore reads by its key, stay while
/// those restores last, pass after pass; another expired one of `a` goes at once. Once the
/// restores end, the next pass deletes the two and removes the PostgreSQLBackup of the named
/// one. `b`'s 30-day-old backup and a backup from before the uids stay throughout.
#[tokio::test]
async fn retention_keeps_what_unfinished_restores_read_and_never_touches_another_cluster() {
    let Some(bed) = Bed::start("ownership-retention").await else {
        return;
    };
    let uid_a = bed.cluster("a", 7).await;
    let uid_b = bed.cluster("b", 90).await;

    // The backup a restore names, with its PostgreSQLBackup, and the restores that read.
    let named_uid = bed
        .backup_object("named", "a", DeletionPolicy::Retain)
        .await;
    let named_dir = format!("{PREFIX}/{uid_a}/named/{named_uid}/");
    let named_key = format!("{named_dir}manifest.json");
    bed.complete("named", &named_key, "sha256:00").await;
    bed.pending_restore("undo", restore_of_backup("named", NOWHERE))
        .await;
    let sourced_dir = format!("{PREFIX}/{uid_a}/sourced/sourced-uid/");
    let sourced_key = format!("{sourced_dir}manifest.json");
    let from_source = restore_of_source(bed.storage(), &sourced_key, NOWHERE);
    bed.pending_restore("copy", from_source).await;
    bed.running
        .api::<Job>()
        .create(&PostParams::default(), &suspended_job("copy-job"))
        .await
        .expect("Job created");
    let running =
        json!({"phase": "Running", "jobName": "copy-job", "restoredObjectKey": sourced_key});
    bed.set_restore("copy", running).await;

    bed.put_backup(Some(&uid_a), "named", &named_uid, 30).await;
    bed.put_backup(Some(&uid_a), "sourced", "sourced-uid", 30)
        .await;
    bed.put_backup(Some(&uid_a), "expired", "expired-uid", 30)
        .await;
    bed.put_backup(Some(&uid_a), "recent", "recent-uid", 1)
        .await;
    bed.put_backup(Some(&uid_b), "expired", "expired-uid", 30)
        .await;
    bed.put_backup(None, "ancient", "", 300).await;
    let expired_dir = format!("{PREFIX}/{uid_a}/expired/expired-uid/");
    let stays = [
        format!("{PREFIX}/{uid_a}/recent/recent-uid/"),
        format!("{PREFIX}/{uid_b}/expired/expired-uid/"),
        format!("{PREFIX}/ancient/"),
    ];

    bed.wait_gone(&expired_dir).await;
    let after_first = bed.passes("a").await;
    wait_until("two more passes of a", WAIT, || async {
        Ok((bed.passes("a").await >= after_first + 2).then_some(()))
    })
    .await
    .expect("passes");
    bed.wait_restore("copy", RestorePhase::Running).await;
    for dir in [&named_dir, &sourced_dir] {
        assert_eq!(bed.keys_under(dir).await.len(), 3, "{dir} is held");
    }
    for dir in &stays {
        assert_eq!(bed.keys_under(dir).await.len(), 3, "{dir} stays");
    }

    bed.set_restore("undo", json!({"phase": "Failed"})).await;
    bed.set_restore("copy", json!({"phase": "Completed"})).await;
    bed.wait_gone(&named_dir).await;
    bed.wait_gone(&sourced_dir).await;
    let backups = bed.running.api::<PostgreSQLBackup>();
    wait_until("PostgreSQLBackup named to be removed", WAIT, || async {
        Ok(backups.get_opt("named").await?.is_none().then_some(()))
    })
    .await
    .expect("removed with its data");
    for dir in &stays {
        assert_eq!(bed.keys_under(dir).await.len(), 3, "{dir} stays");
    }
    let _ = bed
        .running
        .api::<Job>()
        .delete("copy-job", &DeleteParams::background())
        .await;
    bed.stop().await;
}

/// `deletionPolicy: Delete` deletes a backup's own directory, but not while a restore reads it;
/// a backup from before the uids only when the manifest there is the one it recorded (not one
/// a later backup of the same name wrote).
#[tokio::test]
async fn deletion_waits_for_restores_and_deletes_only_what_is_proven_the_backups() {
    let Some(bed) = Bed::start("ownership-delete").await else {
        return;
    };
    let uid_a = bed.cluster("a", 7).await;
    let backups = bed.running.api::<PostgreSQLBackup>();

    let doomed_uid = bed
        .backup_object("doomed", "a", DeletionPolicy::Delete)
        .await;
    let (key, checksum) = bed.put_backup(Some(&uid_a), "doomed", &doomed_uid, 1).await;
    bed.complete("doomed", &key, &checksum).await;
    // A legacy backup, with the manifest it recorded...
    bed.backup_object("legacy", "a", DeletionPolicy::Delete)
        .await;
    let (key, checksum) = bed.put_backup(None, "legacy", "", 1).await;
    bed.complete("legacy", &key, &checksum).await;
    // ...and one whose legacy directory another backup of the same name wrote since.
    bed.backup_object("reused", "a", DeletionPolicy::Delete)
        .await;
    let (key, _) = bed.put_backup(None, "reused", "", 1).await;
    bed.complete("reused", &key, "sha256:0123").await;

    bed.pending_restore("undo", restore_of_backup("doomed", NOWHERE))
        .await;
    backups
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("deletion asked");
    let events =
        common::events_with_reason(&bed.running, "doomed", "DeletionWaitsForRestore").await;
    let note = events[0].note.clone().unwrap_or_default();
    assert!(note.contains("restore"), "{note}");
    assert!(note.contains("/undo"), "{note}");
    let doomed_dir = format!("{PREFIX}/{uid_a}/doomed/{doomed_uid}/");
    assert_eq!(bed.keys_under(&doomed_dir).await.len(), 3);
    let held = backups.get("doomed").await.expect("still there");
    assert!(held.metadata.deletion_timestamp.is_some());

    bed.set_restore("undo", json!({"phase": "Failed"})).await;
    wait_until("doomed to go", WAIT, || async {
        Ok(backups.get_opt("doomed").await?.is_none().then_some(()))
    })
    .await
    .expect("deleted once the restore ended");
    assert!(bed.keys_under(&doomed_dir).await.is_empty());

    for name in ["legacy", "reused"] {
        backups
            .delete(name, &DeleteParams::default())
            .await
            .expect("deletion asked");
        wait_until(&format!("{name} to go"), WAIT, || async {
            Ok(backups.get_opt(name).await?.is_none().then_some(()))
        })
        .await
        .expect("deleted");
    }
    assert!(
        bed.keys_under(&format!("{PREFIX}/legacy/"))
            .await
            .is_empty()
    );
    assert_eq!(
        bed.keys_under(&format!("{PREFIX}/reused/")).await.len(),
        3,
        "another backup's objects stay"
    );
    let left = common::events_with_reason(&bed.running, "reused", "DataLeft").await;
    let note = left[0].note.clone().unwrap_or_default();
    assert!(note.contains("another backup of the same name"), "{note}");
    bed.stop().await;
}

/// The manifest write refuses a key that holds an object, leaving it as it was, and asks the
/// store to refuse too (`If-None-Match: *`) for stores that honour it; Garage 2.5 ignores the
/// header on PutObject, so on it the HEAD before the write is what refuses.
#[tokio::test]
async fn a_new_object_is_written_only_where_none_is() {
    let Some(env) = pgkube_testkit::testbed() else {
        return;
    };
    let bucket = TestBucket::create(&env, "put-new").await;
    let proxy = Proxy::recording(&env.s3_endpoint).await;
    let mut via_proxy = env.clone();
    via_proxy.s3_endpoint = proxy.endpoint.clone();
    let store = S3Bucket::with_client(via_proxy.s3_client(), bucket.name());
    let key = "p/c1/nightly/u1/manifest.json";

    let first = store
        .put_new_object(key, b"first".to_vec(), "application/json")
        .await
        .expect("first write");
    let second = store
        .put_new_object(key, b"second".to_vec(), "application/json")
        .await
        .expect("second write");

    assert_eq!(first, NewObject::Written);
    assert_eq!(second, NewObject::AlreadyExists);
    assert_eq!(bucket.object(key).await.expect("stored"), b"first");
    let puts = proxy.request_heads("PUT ");
    assert_eq!(puts.len(), 1, "{puts:#?}");
    assert!(
        puts[0].to_ascii_lowercase().contains("if-none-match: *"),
        "{}",
        puts[0]
    );
    let listed: BTreeMap<String, i64> = list_objects(&bucket.client(), bucket.name(), "p/")
        .await
        .expect("listing");
    assert_eq!(listed.len(), 1);
    bucket.cleanup().await;
}

/// A backup is Completed only if the manifest at its recorded key records its own uid: one
/// that records another PostgreSQLBackup (a name used again) fails verification.
#[tokio::test]
async fn verification_refuses_a_manifest_that_records_another_backup() {
    use pgkube_controllers::agent_job::AgentResult;
    use pgkube_controllers::backup::verify::{Expected, VerifyError, verify};
    let Some(env) = pgkube_testkit::testbed() else {
        return;
    };
    let bucket = TestBucket::create(&env, "verify-owner").await;
    let dir = "p/c1/nightly/u1/";
    let globals = StoredObject {
        key: format!("{dir}globals.sql"),
        size: 4,
        sha256: hex::encode(Sha256::digest(b"data")),
        format: GLOBALS_FORMAT.to_owned(),
        compression: None,
    };
    let manifest = Manifest {
        manifest_version: MANIFEST_VERSION,
        cluster: "a".to_owned(),
        namespace: "ns".to_owned(),
        cluster_uid: Some("c1".to_owned()),
        system_identifier: None,
        backup_name: "nightly".to_owned(),
        backup_uid: Some("u0".to_owned()),
        postgresql_version: "16.4".to_owned(),
        started_at: "2026-01-01T00:00:00Z".to_owned(),
        finished_at: "2026-01-01T00:01:00Z".to_owned(),
        format: DATABASE_FORMAT.to_owned(),
        globals: Some(globals),
        databases: Vec::new(),
        physical: None,
    };
    let bytes = serde_json::to_vec(&manifest).expect("manifest JSON");
    let s3 = bucket.client();
    let key = format!("{dir}manifest.json");
    put_object(
        &s3,
        bucket.name(),
        &format!("{dir}globals.sql"),
        b"data".to_vec(),
    )
    .await
    .expect("globals");
    put_object(&s3, bucket.name(), &key, bytes.clone())
        .await
        .expect("manifest");
    let result = AgentResult {
        status: "Completed".to_owned(),
        manifest_key: Some(key.clone()),
        manifest_sha256: Some(hex::encode(Sha256::digest(&bytes))),
        ..AgentResult::default()
    };
    let store = S3Bucket::with_client(s3, bucket.name());
    let expected = |uid| Expected {
        manifest_key: &key,
        backup_name: "nightly",
        backup_uid: Some(uid),
    };

    let refused = verify(&store, expected("u1"), &result).await;
    let accepted = verify(&store, expected("u0"), &result).await;

    let error = refused.expect_err("another backup's manifest");
    assert!(matches!(error, VerifyError::Mismatch { .. }), "{error}");
    assert!(
        error
            .to_string()
            .ends_with("it belongs to backup nightly (uid u0)"),
        "{error}"
    );
    assert_eq!(accepted.expect("its own manifest").manifest_key, key);
    bucket.cleanup().await;
}
