//! The globals script of a logical backup is SQL only: one that someone with write access to the
//! bucket turned into a shell command for `psql` (`\!`, with its manifest rewritten to match) is
//! refused before anything changes, and the command never runs.

mod agent_common;

use agent_common::{Agent, Scratch, connect, database_exists, get_object, put_object};
use pgkube_testkit::{testbed, unique_name};
use sha2::{Digest, Sha256};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_globals_script_with_a_shell_meta_command_is_refused_and_never_runs() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "globals").await;
    let (bucket, database, work) = (&scratch.bucket, &scratch.database, &scratch.work);
    let agent = Agent::new(&env, bucket.name(), "globals", work);
    database
        .connect()
        .await
        .batch_execute("CREATE TABLE t AS SELECT g AS id FROM generate_series(1, 100) g")
        .await
        .expect("filling the database");
    agent
        .backup("g1", &["--database", database.name()])
        .await
        .assert_completed();

    let pwned = std::env::temp_dir().join(unique_name("pwned"));
    let s3 = bucket.client();
    let manifest_key = agent.key("g1", "manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&get_object(&s3, bucket.name(), &manifest_key).await)
            .expect("a manifest");
    let globals_key = manifest["globals"]["key"]
        .as_str()
        .expect("a globals object")
        .to_owned();
    let zstd = manifest["globals"]["compression"] == "zstd";
    let stored = get_object(&s3, bucket.name(), &globals_key).await;
    let mut script = match zstd {
        true => zstd::decode_all(stored.as_slice()).expect("zstd"),
        false => stored,
    };
    script.extend_from_slice(format!("\\! touch {}\n", pwned.display()).as_bytes());
    let line = String::from_utf8_lossy(&script).lines().count();
    let tampered = match zstd {
        true => zstd::encode_all(script.as_slice(), 3).expect("zstd"),
        false => script,
    };
    manifest["globals"]["size"] = tampered.len().into();
    manifest["globals"]["sha256"] = hex::encode(Sha256::digest(&tampered)).into();
    put_object(&s3, bucket.name(), &globals_key, tampered).await;
    let manifest = serde_json::to_vec(&manifest).expect("JSON");
    put_object(&s3, bucket.name(), &manifest_key, manifest).await;

    let admin = connect(&agent.login, "postgres").await;
    admin
        .batch_execute(&format!(
            "DROP DATABASE \"{}\" WITH (FORCE)",
            database.name()
        ))
        .await
        .expect("dropping the database");
    let refused = agent.restore("g1", &[]).await;
    refused.assert_failed();
    let message = refused.message();
    assert!(
        message.contains(&globals_key)
            && message.contains(&format!(
                "line {line} of the globals script has a backslash, which psql could run as a meta-command"
            )),
        "{message}"
    );
    assert!(!pwned.exists(), "the shell command ran");
    assert!(
        !database_exists(&admin, database.name()).await,
        "a refused restore creates nothing"
    );
    scratch.cleanup().await;
}
