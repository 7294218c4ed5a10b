//! `pgkube agent backup --method physical` and physical manifests, against the test bed's
//! PostgreSQL and Garage: a base backup is taken only for an archive that holds this database's
//! WAL for this cluster, and the restore agent refuses a physical backup before changing
//! anything. (The base backup itself, from a standby, is tested on the real node:
//! `controllers/tests/physical_backup_on_real_node.rs`.)

mod agent_common;

use agent_common::{Agent, Scratch, put_object};
use pgkube_controllers::storage::wal::ArchiveOwner;
use pgkube_testkit::{list_objects, testbed};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_backup_needs_an_archive_that_is_this_databases_and_stores_nothing_otherwise() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "phys-owner").await;
    let bucket = &scratch.bucket;
    let agent = Agent::new(&env, bucket.name(), "ns/main", &scratch.work);
    let root = "ns/main/wal/main/";
    let physical = ["--method", "physical", "--wal-root", root];

    let unclaimed = agent.backup("base", &physical).await;
    unclaimed.assert_failed();
    let message = unclaimed.message();
    assert!(
        message.contains(&format!(
            "the WAL archive at {root} cannot serve this backup"
        )) && message.contains("no owner record"),
        "{message}"
    );

    let other = ArchiveOwner {
        system_identifier: "1".to_owned(),
        cluster_uid: agent.cluster_uid.clone(),
        cluster: "agent-tests/main".to_owned(),
    };
    let s3 = bucket.client();
    let marker = format!("{root}archive.json");
    put_object(
        &s3,
        bucket.name(),
        &marker,
        serde_json::to_vec(&other).expect("JSON"),
    )
    .await;
    let refused = agent.backup("base", &physical).await;
    refused.assert_failed();
    let message = refused.message();
    assert!(
        message.contains("holds the WAL of system 1 of cluster uid"),
        "{message}"
    );
    let stored = list_objects(&s3, bucket.name(), "").await.expect("listing");
    assert_eq!(
        stored.keys().collect::<Vec<_>>(),
        [&marker],
        "nothing but the owner record"
    );
    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restore_agent_refuses_a_physical_backup_before_changing_anything() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "phys-restore").await;
    let bucket = &scratch.bucket;
    let agent = Agent::new(&env, bucket.name(), "ns/main", &scratch.work);
    let object = |name: &str, format: &str| {
        serde_json::json!({"key": agent.key("base", name), "size": 1, "sha256": "00".repeat(32),
                           "format": format})
    };
    let manifest = serde_json::json!({
        "manifestVersion": 3, "cluster": "main", "namespace": "agent-tests",
        "backupName": "base", "postgresqlVersion": "15", "startedAt": "2026-01-01T00:00:00Z",
        "finishedAt": "2026-01-01T00:01:00Z", "format": "pg_basebackup-tar",
        "physical": {
            "startLsn": "0/2000028", "startTimeline": 1, "stopLsn": "0/2000100",
            "stopTimeline": 1, "source": "main-postgresql-1", "fromStandby": true,
            "walRoot": "ns/main/wal/main/", "firstWal": "000000010000000000000002",
            "lastWal": "000000010000000000000002",
            "base": object("base.tar.zst", "pg_basebackup-tar"),
            "backupLabel": object("backup_label", "backup_label"),
            "backupManifest": object("backup_manifest", "pg_backup_manifest")
        }
    });
    let key = agent.key("base", "manifest.json");
    put_object(
        &bucket.client(),
        bucket.name(),
        &key,
        serde_json::to_vec(&manifest).expect("JSON"),
    )
    .await;
    let database = scratch.database.name();
    let refused = agent
        .restore_at("base", &key, &["--database", database])
        .await;
    refused.assert_failed();
    let message = refused.message();
    assert!(
        message.contains("physical base backup") && message.contains(&key),
        "{message}"
    );
    scratch.cleanup().await;
}
