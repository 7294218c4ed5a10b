//! The agent's own zstd compression against the test bed's PostgreSQL and S3 server: round trips
//! at two levels, a corrupted zstd object refused before anything changes, a backup stored the
//! old way (pg_dump's compression, no `compression` in the manifest) restored by this agent, and
//! the CLI's refusal of levels out of range. zstd backups carry manifest version 2, the rest 1.

mod agent_common;

use agent_common::legacy::store_old_format_backup;
use agent_common::{Agent, Scratch, fingerprint, get_object, object_digest, put_object};
use pgkube_testkit::aws_sdk_s3::Client as S3Client;
use pgkube_testkit::testbed;
use sha2::{Digest, Sha256};

/// The four bytes every zstd frame starts with.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// What a custom-format archive starts with.
const PG_DUMP_MAGIC: &[u8] = b"PGDMP";

/// Rows of text and a few other types: compressible, the more so at higher levels.
const FILL: &str = "CREATE TABLE lines (id int PRIMARY KEY, at timestamptz, body text, doc jsonb);
     INSERT INTO lines
       SELECT g, now() - g * interval '1 minute',
              'customer ' || (g::bigint * 7919 % 1000) || ' ordered item ' || (g::bigint * 104729 % 501)
                || repeat(' again', g % 5),
              jsonb_build_object('n', g, 'odd', g % 2 = 1)
       FROM generate_series(1, 60000) g;";

const RESTORE_ALL: [&str; 2] = ["--drop-existing", "--skip-globals"];

async fn manifest(agent: &Agent, s3: &S3Client, backup: &str) -> serde_json::Value {
    let bytes = get_object(s3, &agent.bucket, &agent.key(backup, "manifest.json")).await;
    serde_json::from_slice(&bytes).expect("manifest is JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zstd_backups_at_two_levels_restore_the_same_database() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "zstd-levels").await;
    let (database, work) = (&scratch.database, &scratch.work);
    let agent = Agent::new(&env, scratch.bucket.name(), "zstd", work);
    let s3 = scratch.bucket.client();
    let client = database.connect().await;
    client.batch_execute(FILL).await.expect("filling");
    let before = fingerprint(&client).await;
    drop(client);

    let mut stored_sizes = Vec::new();
    for level in ["1", "9"] {
        let name = format!("level-{level}");
        let args = ["--database", database.name(), "--compression-level", level];
        let backup = agent.backup(&name, &args).await;
        backup.assert_completed();
        let manifest = manifest(&agent, &s3, &name).await;
        // Version 2: agents from before zstd refuse it before changing anything.
        assert_eq!(manifest["manifestVersion"], 2);
        assert_eq!(manifest["globals"]["compression"], "none");
        let object = &manifest["databases"][0];
        assert_eq!(object["compression"], "zstd");
        let key = object["key"].as_str().expect("key");
        let stored = get_object(&s3, &agent.bucket, key).await;
        assert_eq!(
            stored[..4],
            ZSTD_MAGIC,
            "level {level}: a zstd frame is stored"
        );
        // Size and checksum are those of the stored (compressed) bytes.
        assert_eq!(object["size"], stored.len() as u64);
        assert_eq!(object["sha256"], hex::encode(Sha256::digest(&stored)));
        stored_sizes.push(stored.len());

        let restore = agent.restore(&name, &RESTORE_ALL).await;
        restore.assert_completed();
        let after = fingerprint(&database.connect().await).await;
        assert_eq!(
            after, before,
            "level {level}: the restored database differs"
        );
    }
    // The level reaches the encoder (on rows of random hex, level 1 can store less than 9).
    assert!(
        stored_sizes[1] < stored_sizes[0],
        "level 9 stores less than level 1 on these rows: {stored_sizes:?}"
    );

    // The previous choice, pg_dump's gzip, is still there and still restores.
    let gzip = agent
        .backup(
            "gzip",
            &["--database", database.name(), "--compression", "gzip"],
        )
        .await;
    gzip.assert_completed();
    let manifest = manifest(&agent, &s3, "gzip").await;
    // Nothing to decode: version 1, which every agent restores.
    assert_eq!(manifest["manifestVersion"], 1);
    assert_eq!(manifest["databases"][0]["compression"], "none");
    let key = manifest["databases"][0]["key"].as_str().expect("key");
    let stored = get_object(&s3, &agent.bucket, key).await;
    assert!(stored.starts_with(PG_DUMP_MAGIC), "pg_dump's archive as is");
    agent.restore("gzip", &RESTORE_ALL).await.assert_completed();
    assert_eq!(fingerprint(&database.connect().await).await, before);

    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_zstd_object_is_refused_before_anything_changes() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "zstd-corrupt").await;
    let (database, work) = (&scratch.database, &scratch.work);
    let agent = Agent::new(&env, scratch.bucket.name(), "", work);
    let s3 = scratch.bucket.client();
    let client = database.connect().await;
    client.batch_execute(FILL).await.expect("filling");
    agent
        .backup("good", &["--database", database.name()])
        .await
        .assert_completed();
    // Changed after the backup: a restore that went ahead would undo this.
    client
        .batch_execute("INSERT INTO lines (id, body) VALUES (0, 'written after the backup')")
        .await
        .expect("changing the database");
    let changed = fingerprint(&client).await;
    drop(client);

    let manifest_key = agent.key("good", "manifest.json");
    let manifest_bytes = get_object(&s3, &agent.bucket, &manifest_key).await;
    let manifest: serde_json::Value = serde_json::from_slice(&manifest_bytes).expect("JSON");
    let key = manifest["databases"][0]["key"].as_str().expect("key");
    let mut corrupted = get_object(&s3, &agent.bucket, key).await;
    let middle = corrupted.len() / 2;
    corrupted[middle] ^= 0x5a;

    // Bytes altered in storage: the checksum of the stored bytes catches it.
    put_object(&s3, &agent.bucket, key, corrupted.clone()).await;
    let refused = agent.restore("good", &RESTORE_ALL).await;
    refused.assert_failed();
    let message = refused.message();
    assert!(
        message.contains(key) && message.contains("SHA-256"),
        "{message}"
    );
    assert!(!message.contains("partly restored"), "{message}");
    assert_eq!(fingerprint(&database.connect().await).await, changed);

    // The same bytes with a manifest that vouches for them: zstd itself refuses them, still in
    // the verification pass.
    let (size, sha256) = object_digest(&s3, &agent.bucket, key).await;
    let mut vouching = manifest.clone();
    vouching["databases"][0]["size"] = size.into();
    vouching["databases"][0]["sha256"] = sha256.into();
    let vouching = serde_json::to_vec_pretty(&vouching).expect("JSON");
    put_object(&s3, &agent.bucket, &manifest_key, vouching).await;
    let refused = agent.restore("good", &RESTORE_ALL).await;
    refused.assert_failed();
    let message = refused.message();
    assert!(
        message.contains(key) && message.contains("not valid zstd"),
        "{message}"
    );
    assert!(!message.contains("partly restored"), "{message}");
    assert_eq!(fingerprint(&database.connect().await).await, changed);

    // A manifest naming a compression this agent does not know is refused as well.
    let unknown = String::from_utf8(manifest_bytes).expect("UTF-8").replacen(
        "\"compression\": \"zstd\"",
        "\"compression\": \"lz4\"",
        1,
    );
    put_object(&s3, &agent.bucket, &manifest_key, unknown.into_bytes()).await;
    let refused = agent.restore("good", &RESTORE_ALL).await;
    refused.assert_failed();
    assert!(refused.message().contains("lz4"), "{}", refused.message());
    assert_eq!(fingerprint(&database.connect().await).await, changed);

    // So is a manifest version it does not read: the check that makes agents from before zstd
    // (which read only version 1) refuse a zstd backup (version 2) before they drop anything.
    let mut future = manifest.clone();
    future["manifestVersion"] = 3.into();
    let future = serde_json::to_vec_pretty(&future).expect("JSON");
    put_object(&s3, &agent.bucket, &manifest_key, future).await;
    let refused = agent.restore("good", &RESTORE_ALL).await;
    refused.assert_failed();
    assert!(
        refused.message().contains("version 3"),
        "{}",
        refused.message()
    );
    assert_eq!(fingerprint(&database.connect().await).await, changed);

    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_stored_before_the_agent_compressed_still_restores() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "old-format").await;
    let (database, work) = (&scratch.database, &scratch.work);
    let agent = Agent::new(&env, scratch.bucket.name(), "old", work);
    let s3 = scratch.bucket.client();
    let client = database.connect().await;
    client.batch_execute(FILL).await.expect("filling");
    let before = fingerprint(&client).await;
    let manifest = store_old_format_backup(&agent, &s3, "before-zstd", &[database.name()]).await;
    assert!(!String::from_utf8_lossy(&manifest).contains("compression"));
    let key = agent.legacy_key(
        "before-zstd",
        &format!("databases/{}.dump", database.name()),
    );
    let stored = get_object(&s3, &agent.bucket, &key).await;
    assert!(stored.starts_with(PG_DUMP_MAGIC), "pg_dump's own archive");
    client
        .batch_execute("DELETE FROM lines WHERE id % 2 = 0")
        .await
        .expect("changing the database");
    drop(client);

    // Without a manifest key, as from before the uids named the directory: its legacy key.
    let restore = agent.restore_legacy("before-zstd", &RESTORE_ALL).await;
    restore.assert_completed();
    assert_eq!(
        restore.report["manifestKey"],
        agent.legacy_key("before-zstd", "manifest.json")
    );
    assert_eq!(fingerprint(&database.connect().await).await, before);

    scratch.cleanup().await;
}

#[test]
fn compression_levels_out_of_range_are_refused_by_the_cli_naming_the_flag() {
    let run = |flags: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_pgkube"))
            .args(["agent", "backup", "--backup-name", "x", "--cluster", "c"])
            .args(["--cluster-uid", "cu", "--backup-uid", "bu"])
            .args(["--namespace", "n", "--s3-bucket", "b"])
            .args(flags)
            .env("PGKUBE_TERMINATION_MESSAGE_PATH", "/dev/null")
            .output()
            .expect("running pgkube")
    };
    for flags in [
        &["--compression-level", "20"][..],
        &["--compression-level", "0"],
        &["--compression", "zstd", "--compression-level", "100"],
    ] {
        let refused = run(flags);
        assert_eq!(refused.status.code(), Some(2), "{flags:?}: a usage error");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            stderr.contains("--compression-level"),
            "{flags:?}: {stderr}"
        );
        assert!(refused.stdout.is_empty(), "{flags:?}: nothing ran");
    }
    let refused = run(&["--compression", "brotli"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--compression"));

    // gzip stops at 9: refused before anything runs, in the result line.
    let refused = run(&["--compression", "gzip", "--compression-level", "12"]);
    assert!(!refused.status.success());
    let report: serde_json::Value = serde_json::from_slice(&refused.stdout).expect("JSON line");
    assert_eq!(report["status"], "Failed");
    let message = report["message"].as_str().unwrap_or_default();
    assert!(message.contains("--compression-level 12"), "{message}");
}
