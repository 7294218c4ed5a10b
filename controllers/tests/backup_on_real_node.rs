//! End to end on the test bed's real node: PostgreSQLBackups of a running PostgreSQL 15
//! cluster, whose backup Jobs really run (`pgkube agent backup` in the `postgres:15` image's
//! emulation, copied in by an init container) against the real Garage, compressed as the backup
//! or its cluster says.

mod common;

use std::time::Duration;

use common::real_node::{BACKUP_TIMEOUT, Fixture, S3_SECRET, phase};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams};
use pgkube_crds::{
    BackupCompression, BackupPhase, CompressionMethod, DeletionPolicy, PostgreSQLBackup,
    PostgreSQLCluster,
};
use pgkube_testkit::{
    SECRET_ACCESS_KEY_KEY, TestBucket, condition, create_backup, list_objects, wait_backup_ended,
    wait_until,
};
use serde_json::json;
use sha2::{Digest, Sha256};

#[tokio::test]
async fn an_on_demand_backup_completes_with_the_size_and_checksum_of_its_stored_objects() {
    let Some(fixture) = Fixture::start("backup-e2e").await else {
        return;
    };
    let backup = fixture.backup("first", DeletionPolicy::Retain).await;
    let status = backup.status.clone().expect("status");
    assert_eq!(phase(&backup), Some(BackupPhase::Completed), "{status:?}");

    let objects = fixture.objects_of("first").await;
    let manifest_key = status.object_key.clone().expect("object key");
    let backup_uid = backup.metadata.uid.clone().expect("uid");
    assert_eq!(
        manifest_key,
        format!("{}first/{backup_uid}/manifest.json", fixture.root()),
        "in a directory named by the cluster's uid and the backup's"
    );
    assert!(objects.contains_key(&manifest_key), "{objects:?}");
    let data: i64 = objects
        .iter()
        .filter(|(key, _)| **key != manifest_key)
        .map(|(_, size)| size)
        .sum();
    assert_eq!(
        status.size_bytes,
        Some(data),
        "size = the stored dumps' bytes"
    );
    assert!(
        objects
            .keys()
            .any(|key| key.ends_with("/databases/shop.dump")),
        "every database is dumped: {objects:?}"
    );
    let manifest = fixture
        .bucket
        .object(&manifest_key)
        .await
        .expect("manifest");
    let checksum = format!("sha256:{}", hex::encode(Sha256::digest(&manifest)));
    assert_eq!(status.checksum.as_deref(), Some(checksum.as_str()));
    assert!(
        status
            .postgres_version
            .as_deref()
            .is_some_and(|v| v.starts_with("15")),
        "{status:?}"
    );
    assert!(status.start_time.is_some() && status.completion_time.is_some());
    let recorded = status.storage.clone().expect("storage recorded");
    assert_eq!(recorded.s3.bucket, fixture.bucket.name());
    assert_eq!(
        recorded.s3.prefix.as_deref(),
        Some(format!("{}/pg", fixture.namespace()).as_str())
    );

    // The Job ran as the issue asks, and is owned by the backup.
    let job = fixture
        .running
        .api::<Job>()
        .get(status.job_name.as_deref().expect("job name"))
        .await
        .expect("job");
    let owner = &job.metadata.owner_references.clone().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("PostgreSQLBackup", "first")
    );

    // The cluster tells of its last good backup.
    let cluster = fixture
        .cluster
        .wait_condition("BackupComplete", "True", Duration::from_secs(60))
        .await
        .expect("BackupComplete");
    assert_eq!(
        cluster
            .status
            .as_ref()
            .and_then(|s| s.last_successful_backup.as_deref()),
        Some("first")
    );
    fixture.stop().await;
}

/// The compression a backup records and its manifest shows: the default (zstd, manifest version
/// 2), a backup's own gzip (pg_dump's archive as is, version 1), and the cluster's default level.
#[tokio::test]
async fn backups_are_compressed_as_the_backup_or_else_its_cluster_says() {
    let Some(fixture) = Fixture::start("backup-zstd").await else {
        return;
    };
    let default = fixture.compressed_backup("default", None).await;
    let (manifest, arguments) = fixture.manifest_and_arguments(&default).await;
    assert_eq!(arguments, "--compression zstd");
    assert_eq!(manifest["manifestVersion"], 2, "{manifest}");
    assert_eq!(manifest["databases"][0]["compression"], "zstd");
    let recorded = default.status.and_then(|s| s.compression);
    assert_eq!(recorded, Some(BackupCompression::default()));

    let gzip = BackupCompression {
        method: CompressionMethod::Gzip,
        level: None,
    };
    let own = fixture.compressed_backup("gzip", Some(gzip)).await;
    let (manifest, arguments) = fixture.manifest_and_arguments(&own).await;
    assert_eq!(arguments, "--compression gzip");
    assert_eq!(manifest["manifestVersion"], 1, "{manifest}");
    assert_eq!(manifest["databases"][0]["compression"], "none");
    let key = manifest["databases"][0]["key"].as_str().expect("key");
    let dump = fixture.bucket.object(key).await.expect("dump");
    assert!(dump.starts_with(b"PGDMP"), "pg_dump's own archive");
    assert_eq!(own.status.and_then(|s| s.compression), Some(gzip));

    // The cluster's default, for backups that do not choose.
    let patch = json!({"spec": {"backup": {"compression": {"method": "zstd", "level": 5}}}});
    fixture
        .running
        .api::<PostgreSQLCluster>()
        .patch(
            fixture.cluster.name(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
        .expect("cluster patched");
    let inherited = fixture.compressed_backup("inherited", None).await;
    let (manifest, arguments) = fixture.manifest_and_arguments(&inherited).await;
    assert_eq!(arguments, "--compression zstd --compression-level 5");
    assert_eq!(manifest["databases"][0]["compression"], "zstd");
    let level = inherited.status.and_then(|s| s.compression?.level);
    assert_eq!(level, Some(5));
    fixture.stop().await;
}

#[tokio::test]
async fn a_wrong_s3_key_fails_the_backup_clearly_and_the_next_one_succeeds_once_fixed() {
    let Some(fixture) = Fixture::start("backup-key").await else {
        return;
    };
    let secrets = fixture.running.api::<Secret>();
    let set_key = |key: &str| serde_json::json!({ "stringData": { SECRET_ACCESS_KEY_KEY: key } });
    secrets
        .patch(
            S3_SECRET,
            &PatchParams::default(),
            &Patch::Merge(set_key("wrong-key")),
        )
        .await
        .expect("key broken");
    let failed = fixture.backup("broken", DeletionPolicy::Retain).await;
    assert_eq!(phase(&failed), Some(BackupPhase::Failed));
    let message = failed
        .status
        .clone()
        .and_then(|s| s.message)
        .unwrap_or_default();
    assert!(
        message.contains("S3")
            && (message.contains("Signature")
                || message.contains("Forbidden")
                || message.contains("403")
                || message.contains("InvalidAccessKeyId")),
        "the reason names the S3 refusal: {message}"
    );
    let cluster = fixture
        .cluster
        .wait_condition("BackupComplete", "False", Duration::from_secs(60))
        .await
        .expect("BackupComplete False");
    let condition = condition(&cluster, "BackupComplete").expect("condition");
    assert_eq!(condition.reason, "BackupFailed");
    assert!(
        condition.message.contains("broken"),
        "{}",
        condition.message
    );

    let env = pgkube_testkit::testbed().expect("test bed");
    secrets
        .patch(
            S3_SECRET,
            &PatchParams::default(),
            &Patch::Merge(set_key(&env.s3_secret_key)),
        )
        .await
        .expect("key fixed");
    let fixed = fixture.backup("fixed", DeletionPolicy::Retain).await;
    assert_eq!(
        phase(&fixed),
        Some(BackupPhase::Completed),
        "{:?}",
        fixed.status
    );
    fixture
        .cluster
        .wait_condition("BackupComplete", "True", Duration::from_secs(60))
        .await
        .expect("BackupComplete True again");
    fixture.stop().await;
}

#[tokio::test]
async fn deleting_a_delete_backup_removes_its_data_while_retain_and_cluster_deletion_keep_it() {
    let Some(fixture) = Fixture::start("backup-delete").await else {
        return;
    };
    let doomed = fixture.backup("doomed", DeletionPolicy::Delete).await;
    let kept = fixture.backup("kept", DeletionPolicy::Retain).await;
    assert_eq!(
        phase(&doomed),
        Some(BackupPhase::Completed),
        "{:?}",
        doomed.status
    );
    assert_eq!(
        phase(&kept),
        Some(BackupPhase::Completed),
        "{:?}",
        kept.status
    );
    assert!(!fixture.objects_of("doomed").await.is_empty());
    let kept_objects = fixture.objects_of("kept").await;
    assert!(!kept_objects.is_empty());

    let backups = fixture.running.api::<PostgreSQLBackup>();
    for name in ["doomed", "kept"] {
        backups
            .delete(name, &DeleteParams::default())
            .await
            .expect("backup deleted");
    }
    wait_until(
        "both backups to be gone",
        Duration::from_secs(60),
        || async {
            let left = backups.list(&Default::default()).await?.items.len();
            Ok((left == 0).then_some(()))
        },
    )
    .await
    .expect("backups gone");
    assert!(
        fixture.objects_of("doomed").await.is_empty(),
        "a Delete backup's objects go with it"
    );
    assert_eq!(
        fixture.objects_of("kept").await,
        kept_objects,
        "a Retain backup's objects stay"
    );

    // Deleting the cluster never deletes backup data.
    let prefix = format!("{}kept/", fixture.root());
    let Fixture {
        running,
        cluster,
        bucket,
        ..
    } = fixture;
    cluster
        .delete(Duration::from_secs(120))
        .await
        .expect("cluster deleted");
    let after = list_objects(&bucket.client(), bucket.name(), &prefix)
        .await
        .expect("listing");
    assert_eq!(after, kept_objects, "the cluster's deletion left the data");
    running.stop().await;
    bucket.cleanup().await;
}

/// A backup name used again after its PostgreSQLBackup was deleted (`Retain`, so its data
/// stayed): the new backup completes in a directory of its own, named by its uid, and the
/// Completed backup's objects stay as they were, byte for byte, through the new backup and
/// through the new one's deletion (`Delete`), which deletes only its own objects.
#[tokio::test]
async fn a_backup_name_used_again_never_touches_the_completed_backups_objects() {
    let Some(fixture) = Fixture::start("backup-reuse").await else {
        return;
    };
    let first = fixture.backup("nightly", DeletionPolicy::Retain).await;
    assert_eq!(
        phase(&first),
        Some(BackupPhase::Completed),
        "{:?}",
        first.status
    );
    let first_uid = first.metadata.uid.clone().expect("uid");
    let first_dir = format!("{}nightly/{first_uid}/", fixture.root());
    let before = fixture.contents_under(&first_dir).await;
    assert!(
        before.contains_key(&format!("{first_dir}manifest.json")),
        "{before:?}"
    );
    let backups = fixture.running.api::<PostgreSQLBackup>();
    backups
        .delete("nightly", &DeleteParams::default())
        .await
        .expect("backup deleted");
    wait_until("nightly to be gone", Duration::from_secs(60), || async {
        Ok(backups.get_opt("nightly").await?.is_none().then_some(()))
    })
    .await
    .expect("the first nightly's object is gone");
    let sql = fixture.cluster.sql().await.expect("SQL");
    sql.batch_execute(
        "INSERT INTO items SELECT i, 'later ' || i FROM generate_series(1001, 2000) i",
    )
    .await
    .expect("more data");

    let second = fixture.backup("nightly", DeletionPolicy::Delete).await;
    let status = second.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Some(BackupPhase::Completed), "{status:?}");
    let second_uid = second.metadata.uid.clone().expect("uid");
    assert_ne!(second_uid, first_uid);
    let second_dir = format!("{}nightly/{second_uid}/", fixture.root());
    assert_eq!(
        status.object_key,
        Some(format!("{second_dir}manifest.json"))
    );
    assert!(!fixture.objects_under(&second_dir).await.is_empty());
    assert_eq!(
        fixture.contents_under(&first_dir).await,
        before,
        "the Completed backup's objects are unchanged"
    );

    backups
        .delete("nightly", &DeleteParams::default())
        .await
        .expect("backup deleted");
    wait_until(
        "nightly to be gone again",
        Duration::from_secs(60),
        || async { Ok(backups.get_opt("nightly").await?.is_none().then_some(())) },
    )
    .await
    .expect("the second nightly is gone with its data");
    assert!(fixture.objects_under(&second_dir).await.is_empty());
    assert_eq!(fixture.contents_under(&first_dir).await, before);
    fixture.stop().await;
}

/// A manifest for backup `name` in `dir`, of the cluster and backup of `uids` (none: from
/// before the uids were recorded), that finished `days_ago` days ago, listing one globals
/// object of `globals_size` bytes.
fn manifest(
    dir: &str,
    name: &str,
    uids: Option<(&str, &str)>,
    days_ago: i64,
    globals_size: u64,
) -> Vec<u8> {
    use pgkube_controllers::storage::manifest::{Manifest, StoredObject};
    let finished = chrono::Utc::now() - chrono::Duration::days(days_ago);
    let manifest = Manifest {
        manifest_version: 1,
        cluster: "pg".to_owned(),
        namespace: "ns".to_owned(),
        cluster_uid: uids.map(|(cluster, _)| cluster.to_owned()),
        system_identifier: None,
        backup_name: name.to_owned(),
        backup_uid: uids.map(|(_, backup)| backup.to_owned()),
        postgresql_version: "15".to_owned(),
        started_at: finished.to_rfc3339(),
        finished_at: finished.to_rfc3339(),
        format: "pg_dump-custom".to_owned(),
        physical: None,
        globals: Some(StoredObject {
            key: format!("{dir}globals.sql"),
            size: globals_size,
            sha256: "00".repeat(32),
            format: "pg_dumpall-globals-sql".to_owned(),
            compression: None,
        }),
        databases: Vec::new(),
    };
    serde_json::to_vec(&manifest).expect("manifest JSON")
}

async fn put(bucket: &TestBucket, key: &str, body: Vec<u8>) {
    bucket
        .client()
        .put_object()
        .bucket(bucket.name())
        .key(key)
        .body(body.into())
        .send()
        .await
        .unwrap_or_else(|error| panic!("putting {key}: {error:?}"));
}

#[tokio::test]
async fn a_completed_backup_prunes_expired_backups_and_their_objects_but_nothing_else() {
    let Some(fixture) = Fixture::start("backup-prune").await else {
        return;
    };
    let namespace = fixture.namespace().to_owned();
    // An expired backup of this cluster, with its PostgreSQLBackup object...
    let ancient_object = create_backup(
        &fixture.running.client,
        &namespace,
        "ancient",
        "pg",
        DeletionPolicy::Retain,
    )
    .await
    .expect("backup object");
    let ancient_uid = ancient_object.metadata.uid.clone().expect("uid");
    let ancient = format!("{}ancient/{ancient_uid}/", fixture.root());
    put(
        &fixture.bucket,
        &format!("{ancient}globals.sql"),
        b"-- globals".to_vec(),
    )
    .await;
    put(
        &fixture.bucket,
        &format!("{ancient}manifest.json"),
        manifest(
            &ancient,
            "ancient",
            Some((&fixture.cluster_uid, &ancient_uid)),
            30,
            10,
        ),
    )
    .await;
    let backups = fixture.running.api::<PostgreSQLBackup>();
    backups
        .patch_status(
            "ancient",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"phase": "Completed"}})),
        )
        .await
        .expect("marked Completed");
    // ...an unfinished one (no manifest), a backup from before the uids (never pruned), and
    // keys that are not this cluster's.
    let legacy = format!("{namespace}/pg/legacy/");
    let untouchable = [
        format!("{}partial/partial-uid/globals.sql", fixture.root()),
        format!("{legacy}globals.sql"),
        format!("{namespace}/pg/another-cluster-uid/old/old-uid/manifest.json"),
        format!("{namespace}/pg-other/old/manifest.json"),
        "foreign/key".to_owned(),
    ];
    for key in &untouchable {
        put(&fixture.bucket, key, b"keep".to_vec()).await;
    }
    let legacy_manifest = format!("{legacy}manifest.json");
    put(
        &fixture.bucket,
        &legacy_manifest,
        manifest(&legacy, "legacy", None, 30, 4),
    )
    .await;

    let fresh = fixture.backup("fresh", DeletionPolicy::Retain).await;
    assert_eq!(
        phase(&fresh),
        Some(BackupPhase::Completed),
        "{:?}",
        fresh.status
    );
    wait_until(
        "the expired backup object to go",
        Duration::from_secs(60),
        || async { Ok(backups.get_opt("ancient").await?.is_none().then_some(())) },
    )
    .await
    .expect("expired PostgreSQLBackup removed");
    let everything = list_objects(&fixture.bucket.client(), fixture.bucket.name(), "")
        .await
        .expect("listing");
    assert!(
        !everything.keys().any(|key| key.starts_with(&ancient)),
        "the expired backup's objects are gone: {everything:?}"
    );
    for key in untouchable.iter().chain([&legacy_manifest]) {
        assert!(everything.contains_key(key), "{key} stays: {everything:?}");
    }
    assert!(
        !fixture.objects_of("fresh").await.is_empty(),
        "the new backup stays"
    );
    fixture.stop().await;
}

#[tokio::test]
async fn an_agent_killed_mid_upload_fails_the_backup_without_a_manifest_and_retention_aborts_its_upload()
 {
    use pgkube_controllers::retention::{RetentionPolicy, prune};
    use pgkube_controllers::storage::S3Bucket;

    let Some(fixture) = Fixture::start("backup-kill").await else {
        return;
    };
    let sql = fixture.cluster.sql().await.expect("SQL");
    // Enough data that the upload takes several parts (md5 text compresses about 2:1).
    sql.batch_execute(
        "CREATE TABLE bulk AS SELECT i, md5(i::text) || md5((i * 7)::text) AS a, \
         md5((i * 13)::text) AS b FROM generate_series(1, 1500000) i",
    )
    .await
    .expect("bulk data");
    let killed = create_backup(
        &fixture.running.client,
        fixture.namespace(),
        "killed",
        "pg",
        DeletionPolicy::Retain,
    )
    .await
    .expect("backup created");
    let killed_uid = killed.metadata.uid.clone().expect("uid");
    let s3 = fixture.bucket.client();
    let directory = format!("{}killed/{killed_uid}/", fixture.root());
    let open_uploads = || async {
        let listing = s3
            .list_multipart_uploads()
            .bucket(fixture.bucket.name())
            .prefix(&directory)
            .send()
            .await?;
        let keys: Vec<String> = listing
            .uploads()
            .iter()
            .filter_map(|upload| upload.key().map(str::to_owned))
            .collect();
        Ok::<_, anyhow::Error>(keys)
    };
    // The agent, not its pg_dump child: with the agent gone (PID 1 of its container), the
    // container ends and its other processes with it.
    let agent = wait_until(
        "the backup agent to start",
        Duration::from_secs(120),
        || async {
            let agents: Vec<u32> = pgkube_testkit::processes_with_env("PGKUBE_BACKUP_NAME=killed")
                .into_iter()
                .filter(|pid| {
                    pgkube_testkit::processes_with_args(&["agent", "backup"]).contains(pid)
                })
                .collect();
            anyhow::ensure!(
                agents.len() <= 1,
                "one agent runs on this machine: {agents:?}"
            );
            Ok(agents.first().copied())
        },
    )
    .await
    .expect("agent started");
    // Kill it while the bulk database's upload is open. The globals go up first, in an upload
    // of their own, and the bulk dump may finish quickly: the agent is frozen (SIGSTOP) before
    // each look, so that what the listing shows is still true when the SIGKILL lands.
    let bulk_key = format!("{directory}databases/postgres.dump");
    wait_until(
        "the bulk database's upload to be open",
        Duration::from_secs(120),
        || async {
            signal(agent, "STOP")?;
            if open_uploads().await?.contains(&bulk_key) {
                return Ok(Some(()));
            }
            signal(agent, "CONT")?;
            Ok(None)
        },
    )
    .await
    .expect("the bulk upload opened");
    signal(agent, "KILL").expect("kill the agent");

    let failed = wait_backup_ended(
        &fixture.running.client,
        fixture.namespace(),
        "killed",
        BACKUP_TIMEOUT,
    )
    .await
    .expect("the backup ends");
    assert_eq!(
        phase(&failed),
        Some(BackupPhase::Failed),
        "{:?}",
        failed.status
    );
    let objects = fixture.objects_of("killed").await;
    assert!(
        !objects.keys().any(|key| key.ends_with("manifest.json")),
        "no manifest for a killed backup: {objects:?}"
    );
    assert!(
        open_uploads().await.expect("uploads").contains(&bulk_key),
        "the killed agent left its upload open"
    );

    // Retention aborts uploads older than a day: run a pass as if two days had passed.
    let bucket = S3Bucket::with_client(s3.clone(), fixture.bucket.name());
    let policy = RetentionPolicy {
        prefix: format!("{}/pg", fixture.namespace()),
        cluster_uid: fixture.cluster_uid.clone(),
        retention_days: 7,
        failed_backups: [killed_uid.clone()].into(),
        held: Default::default(),
        wal_root: None,
    };
    let report = prune(
        &bucket,
        &policy,
        chrono::Utc::now() + chrono::Duration::days(2),
    )
    .await
    .expect("retention pass");
    assert!(report.aborted_uploads > 0, "{report:?}");
    assert_eq!(
        open_uploads().await.expect("uploads"),
        Vec::<String>::new(),
        "no upload left open"
    );
    fixture.stop().await;
}

/// Sends `SIGNAL` (`STOP`, `CONT`, `KILL`) to process `pid` with kill(1).
fn signal(pid: u32, name: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill -{name} {pid}: {status}");
    Ok(())
}
