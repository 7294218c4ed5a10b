//! Failure injection for `pgkube agent`: every failure exits non-zero with a one-line reason in
//! the result line and the termination message, leaves no manifest and no open multipart
//! upload, reveals no credential, and a restore refuses missing, corrupted or truncated objects
//! before changing anything.

mod agent_common;

use std::os::unix::fs::PermissionsExt;

use agent_common::{
    Agent, Scratch, connect, database_exists, fingerprint, get_object, object_exists,
    open_multipart_uploads, put_object,
};
use pgkube_testkit::testbed;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dump_killed_mid_stream_leaves_no_manifest_and_no_upload() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "killed").await;
    let (bucket, database, work) = (&scratch.bucket, &scratch.database, &scratch.work);
    // A pg_dump that writes 12 MB (more than two 5 MiB parts, so parts really get uploaded)
    // and is then killed, as the OOM killer or a node drain would.
    let fake_bin = work.join("bin");
    std::fs::create_dir_all(&fake_bin).expect("fake bin dir");
    let fake = fake_bin.join("pg_dump");
    std::fs::write(
        &fake,
        "#!/bin/sh\nhead -c 12000000 /dev/urandom\nkill -9 $$\n",
    )
    .expect("fake pg_dump");
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut agent = Agent::new(&env, bucket.name(), "killed", work);
    agent.path_first = Some(fake_bin);

    let outcome = agent
        .backup(
            "b1",
            &["--database", database.name(), "--part-size-mib", "5"],
        )
        .await;
    outcome.assert_failed();
    assert!(
        outcome
            .message()
            .contains("pg_dump failed: killed by signal 9"),
        "{}",
        outcome.message()
    );
    let s3 = bucket.client();
    assert!(!object_exists(&s3, bucket.name(), &agent.key("b1", "manifest.json")).await);
    assert!(
        !object_exists(
            &s3,
            bucket.name(),
            &agent.key("b1", &format!("databases/{}.dump", database.name()))
        )
        .await,
        "the partial dump must not become an object"
    );
    assert_eq!(
        open_multipart_uploads(&s3, bucket.name(), "killed/").await,
        Vec::<String>::new()
    );

    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_region_or_bucket_fail_clearly_without_revealing_secrets() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "credentials").await;
    let (bucket, database, work) = (&scratch.bucket, &scratch.database, &scratch.work);

    let mut wrong_secret = Agent::new(&env, bucket.name(), "creds", work);
    wrong_secret.secret_key = "not-the-secret-key-0123456789".into();
    let outcome = wrong_secret
        .backup("b1", &["--database", database.name()])
        .await;
    outcome.assert_failed();
    // The first request is a HEAD, whose refusal has no body: the status must still explain it.
    assert!(
        outcome.message().contains("HTTP 403") && outcome.message().contains("secret key"),
        "{}",
        outcome.message()
    );
    outcome.assert_does_not_reveal(&wrong_secret.secret_key);
    outcome.assert_does_not_reveal(&env.s3_secret_key);
    outcome.assert_does_not_reveal(&wrong_secret.login.password);

    let mut wrong_region = Agent::new(&env, bucket.name(), "creds", work);
    wrong_region.s3_region = format!("not-{}", env.s3_region);
    let outcome = wrong_region
        .backup("b1", &["--database", database.name()])
        .await;
    outcome.assert_failed();
    assert!(
        outcome.message().contains("HTTP 400") && outcome.message().contains("check the region"),
        "{}",
        outcome.message()
    );

    let missing_bucket = Agent::new(&env, &format!("{}-missing", bucket.name()), "creds", work);
    let outcome = missing_bucket
        .backup("b1", &["--database", database.name()])
        .await;
    outcome.assert_failed();
    assert!(
        outcome.message().contains("NoSuchBucket"),
        "{}",
        outcome.message()
    );
    outcome.assert_does_not_reveal(&env.s3_secret_key);

    let mut wrong_password = Agent::new(&env, bucket.name(), "creds", work);
    wrong_password.login.password = "wrong-pg-password-42".into();
    let outcome = wrong_password
        .backup("b1", &["--database", database.name()])
        .await;
    outcome.assert_failed();
    assert!(
        outcome.message().contains("password authentication failed"),
        "{}",
        outcome.message()
    );
    outcome.assert_does_not_reveal("wrong-pg-password-42");

    let s3 = bucket.client();
    assert!(!object_exists(&s3, bucket.name(), &wrong_secret.key("b1", "manifest.json")).await);
    assert!(
        open_multipart_uploads(&s3, bucket.name(), "creds/")
            .await
            .is_empty()
    );

    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_refuses_missing_corrupted_and_truncated_objects_before_changing_anything() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "corrupt").await;
    let (bucket, database, work) = (&scratch.bucket, &scratch.database, &scratch.work);
    let agent = Agent::new(&env, bucket.name(), "corrupt", work);
    database
        .connect()
        .await
        .batch_execute(
            "CREATE TABLE t AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, 50000) g",
        )
        .await
        .expect("filling the database");
    let admin = connect(&agent.login, "postgres").await;
    let before = fingerprint(&database.connect().await).await;

    agent
        .backup("b1", &["--database", database.name()])
        .await
        .assert_completed();
    // The same name again must not overwrite a completed backup.
    let again = agent.backup("b1", &["--database", database.name()]).await;
    again.assert_failed();
    assert!(
        again.message().contains("already exists"),
        "{}",
        again.message()
    );

    admin
        .batch_execute(&format!(
            "DROP DATABASE \"{}\" WITH (FORCE)",
            database.name()
        ))
        .await
        .expect("dropping the database");
    let s3 = bucket.client();
    let key = agent.key("b1", &format!("databases/{}.dump", database.name()));
    let original = get_object(&s3, bucket.name(), &key).await;

    let mut flipped = original.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x5a;
    let truncated = original[..original.len() / 2].to_vec();
    for (damage, bytes, expected) in [
        ("corrupted", Some(flipped), "SHA-256"),
        ("truncated", Some(truncated), "bytes stored"),
        ("missing", None, "missing from storage"),
    ] {
        match bytes {
            Some(bytes) => put_object(&s3, bucket.name(), &key, bytes).await,
            None => {
                s3.delete_object()
                    .bucket(bucket.name())
                    .key(&key)
                    .send()
                    .await
                    .expect("deleting the object");
            }
        }
        let outcome = agent.restore("b1", &[]).await;
        outcome.assert_failed();
        let message = outcome.message();
        assert!(
            message.contains(&key) && message.contains(expected),
            "{damage}: {message}"
        );
        assert!(
            !database_exists(&admin, database.name()).await,
            "{damage}: a refused restore must not create the database"
        );
    }

    // The intact object restores.
    put_object(&s3, bucket.name(), &key, original).await;
    agent.restore("b1", &[]).await.assert_completed();
    assert_eq!(fingerprint(&database.connect().await).await, before);

    scratch.cleanup().await;
}

#[tokio::test]
async fn a_server_that_never_accepts_connections_fails_the_backup_after_the_wait() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "no-server").await;
    let mut agent = Agent::new(&env, scratch.bucket.name(), "no-server", &scratch.work);
    // Port 1 on loopback: nothing listens there.
    agent.env = vec![
        ("PGPORT".to_owned(), "1".to_owned()),
        ("PGKUBE_SERVER_WAIT_SECONDS".to_owned(), "3".to_owned()),
    ];
    let started = std::time::Instant::now();
    let outcome = agent.backup("b1", &[]).await;
    outcome.assert_failed();
    assert!(
        outcome
            .message()
            .starts_with("pg_isready failed: the server did not accept connections within 3s: "),
        "{}",
        outcome.message()
    );
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(2),
        "it waited before giving up"
    );
    scratch.cleanup().await;
}
