//! Where `pgkube agent backup` stores a backup, against the test bed's PostgreSQL and Garage: in
//! a directory named by the cluster's uid and the PostgreSQLBackup's, so that a name used again
//! never touches the objects of the backup that had it; and `pgkube agent restore` of a backup
//! stored before the uids named the directory, at the manifest key the controller passes.

mod agent_common;

use std::collections::BTreeMap;

use agent_common::legacy::store_old_format_backup;
use agent_common::{Agent, Scratch, fingerprint, get_object};
use pgkube_testkit::aws_sdk_s3::Client as S3Client;
use pgkube_testkit::{list_objects, testbed};
use sha2::{Digest, Sha256};

/// Every object under `prefix`, by key, with the SHA-256 of its bytes.
async fn contents(s3: &S3Client, bucket: &str, prefix: &str) -> BTreeMap<String, String> {
    let mut contents = BTreeMap::new();
    let listed = list_objects(s3, bucket, prefix).await.expect("listing");
    for key in listed.into_keys() {
        let bytes = get_object(s3, bucket, &key).await;
        contents.insert(key, hex::encode(Sha256::digest(&bytes)));
    }
    contents
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_used_again_gets_a_directory_of_its_own_and_the_first_backup_stays_as_it_was() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "reuse").await;
    let (bucket, database, work) = (&scratch.bucket, &scratch.database, &scratch.work);
    let agent = Agent::new(&env, bucket.name(), "ns/main", work);
    let s3 = bucket.client();
    let client = database.connect().await;
    client
        .batch_execute("CREATE TABLE t AS SELECT g AS id FROM generate_series(1, 1000) g")
        .await
        .expect("filling");
    let first_data = fingerprint(&client).await;
    let only = ["--database", database.name()];

    let first = agent.backup_as("nightly", "uid-1", &only).await;
    first.assert_completed();
    let first_dir = format!("ns/main/{}/nightly/uid-1/", agent.cluster_uid);
    assert_eq!(
        first.report["manifestKey"],
        format!("{first_dir}manifest.json")
    );
    let manifest: serde_json::Value = serde_json::from_slice(
        &get_object(&s3, bucket.name(), &format!("{first_dir}manifest.json")).await,
    )
    .expect("manifest JSON");
    assert_eq!(manifest["clusterUid"], agent.cluster_uid.as_str());
    assert_eq!(manifest["backupUid"], "uid-1");
    assert_eq!(manifest["cluster"], "main");
    assert_eq!(manifest["namespace"], "agent-tests");
    assert_eq!(manifest["backupName"], "nightly");
    let system_identifier: String = client
        .query_one(
            "SELECT system_identifier::text FROM pg_control_system()",
            &[],
        )
        .await
        .expect("the server's system identifier")
        .get(0);
    assert_eq!(
        manifest["systemIdentifier"],
        system_identifier.as_str(),
        "the manifest records which database was backed up"
    );
    let before = contents(&s3, bucket.name(), &first_dir).await;
    assert_eq!(before.len(), 3, "{before:?}");

    client
        .batch_execute("INSERT INTO t SELECT g FROM generate_series(1001, 2000) g")
        .await
        .expect("more data");
    // The same PostgreSQLBackup again is refused; another one of the same name is not.
    let again = agent.backup_as("nightly", "uid-1", &only).await;
    again.assert_failed();
    assert!(
        again.message().contains("already exists"),
        "{}",
        again.message()
    );
    let second = agent.backup_as("nightly", "uid-2", &only).await;
    second.assert_completed();
    let second_dir = format!("ns/main/{}/nightly/uid-2/", agent.cluster_uid);
    assert_eq!(
        second.report["manifestKey"],
        format!("{second_dir}manifest.json")
    );
    assert_eq!(contents(&s3, bucket.name(), &second_dir).await.len(), 3);
    assert_eq!(
        contents(&s3, bucket.name(), &first_dir).await,
        before,
        "the first backup's objects are unchanged"
    );

    // The first backup still restores what it held.
    drop(client);
    let restore = agent
        .restore_at(
            "nightly",
            &format!("{first_dir}manifest.json"),
            &["--drop-existing", "--skip-globals"],
        )
        .await;
    restore.assert_completed();
    assert_eq!(fingerprint(&database.connect().await).await, first_data);
    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_stored_before_the_uids_restores_at_the_key_it_recorded() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "legacy").await;
    let (database, work) = (&scratch.database, &scratch.work);
    let agent = Agent::new(&env, scratch.bucket.name(), "ns/main", work);
    let s3 = scratch.bucket.client();
    let client = database.connect().await;
    client
        .batch_execute("CREATE TABLE t AS SELECT g AS id FROM generate_series(1, 500) g")
        .await
        .expect("filling");
    let before = fingerprint(&client).await;
    store_old_format_backup(&agent, &s3, "before-uids", &[database.name()]).await;
    client
        .batch_execute("DELETE FROM t WHERE id % 2 = 0")
        .await
        .expect("changing the database");
    drop(client);

    let key = agent.legacy_key("before-uids", "manifest.json");
    assert_eq!(key, "ns/main/before-uids/manifest.json");
    let restore = agent
        .restore_at(
            "before-uids",
            &key,
            &[
                "--database",
                database.name(),
                "--drop-existing",
                "--skip-globals",
            ],
        )
        .await;
    restore.assert_completed();
    assert_eq!(restore.report["manifestKey"], key.as_str());
    assert_eq!(fingerprint(&database.connect().await).await, before);

    let refused = agent
        .restore_at("before-uids", "ns/main/before-uids/globals.sql", &[])
        .await;
    refused.assert_failed();
    assert!(
        refused.message().contains("--manifest-key"),
        "{}",
        refused.message()
    );
    scratch.cleanup().await;
}
