//! `pgkube agent` over transports the test bed's S3 server does not offer by itself, through a
//! loopback proxy in front of it ([`pgkube_testkit::proxy`]):
//!
//! - HTTPS with a certificate from a private CA, as with an in-cluster MinIO or Ceph gateway:
//!   `--s3-ca-bundle` must make the agent trust it, and without it the agent must refuse the
//!   endpoint. The proxy sees the decrypted requests: over TLS, parts go as `UNSIGNED-PAYLOAD`.
//! - Server-side encryption: the test bed's store accepts and ignores the SSE headers, so what
//!   can be checked here is that every write that creates an object carries them and no part
//!   upload does (AWS refuses SSE headers on UploadPart).
//! - A part upload that breaks half way: the backup must send the part again and complete, or,
//!   with retries turned off, fail without a manifest and without an open multipart upload; a
//!   part that still fails after the client's own attempts is sent again seconds later.
//! - Downloads that break half way: a restore must resume them from where they broke, in the
//!   verification pass and while `pg_restore` is reading, and still restore the exact data.

mod agent_common;

use agent_common::{
    Agent, Scratch, fingerprint, get_object, object_digest, object_exists, open_multipart_uploads,
};
use pgkube_testkit::proxy::{Cut, Proxy};
use pgkube_testkit::testbed;
use pgkube_testkit::tokio_postgres::Client;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_https_the_agent_trusts_the_ca_bundle_and_round_trips() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "tls").await;
    let (bucket, database, work) = (&scratch.bucket, &scratch.database, &scratch.work);
    let proxy = Proxy::https(&env.s3_endpoint, work).await;
    let mut agent = Agent::new(&env, bucket.name(), "tls", work);
    agent.s3_endpoint = proxy.endpoint.clone();
    let ca_bundle = proxy
        .ca_bundle
        .as_ref()
        .expect("an HTTPS proxy has a CA")
        .to_string_lossy()
        .into_owned();

    let before = fill_notes(&database.connect().await, 20_000).await;

    let backup = agent
        .backup(
            "tls-1",
            &["--database", database.name(), "--s3-ca-bundle", &ca_bundle],
        )
        .await;
    backup.assert_completed();
    let part_line = format!(
        "/databases/{}.dump?x-id=UploadPart&partNumber=1&",
        database.name()
    );
    let part_heads = proxy.request_heads(&part_line);
    let part_headers = part_heads
        .first()
        .expect("the dump went through the proxy as a multipart upload");
    assert!(
        part_headers.contains("\r\nx-amz-content-sha256: UNSIGNED-PAYLOAD\r\n"),
        "over TLS the parts are sent unsigned: {part_headers}"
    );

    let restore = agent
        .restore(
            "tls-1",
            &[
                "--database",
                database.name(),
                "--drop-existing",
                "--skip-globals",
                "--s3-ca-bundle",
                &ca_bundle,
            ],
        )
        .await;
    restore.assert_completed();
    assert_eq!(fingerprint(&database.connect().await).await, before);

    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_ca_bundle_the_agent_refuses_the_endpoint_and_stores_nothing() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "tls-untrusted").await;
    let (bucket, database, work) = (&scratch.bucket, &scratch.database, &scratch.work);
    let proxy = Proxy::https(&env.s3_endpoint, work).await;
    let mut agent = Agent::new(&env, bucket.name(), "", work);
    agent.s3_endpoint = proxy.endpoint.clone();

    let backup = agent
        .backup(
            "tls-untrusted",
            &["--database", database.name(), "--s3-max-attempts", "1"],
        )
        .await;
    backup.assert_failed();
    let message = backup.message();
    assert!(
        message.to_lowercase().contains("certificate"),
        "the reason names the certificate: {message}"
    );
    backup.assert_does_not_reveal(&agent.secret_key);
    assert!(
        proxy.request_heads("").is_empty(),
        "no request got through an untrusted TLS session"
    );
    let stored = bucket
        .client()
        .list_objects_v2()
        .bucket(bucket.name())
        .send()
        .await
        .expect("listing the bucket");
    assert_eq!(stored.key_count(), Some(0));

    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_encryption_is_requested_on_every_object_created() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "sse").await;
    let (bucket, database, work) = (&scratch.bucket, &scratch.database, &scratch.work);
    let proxy = Proxy::recording(&env.s3_endpoint).await;
    let mut agent = Agent::new(&env, bucket.name(), "sse", work);
    agent.s3_endpoint = proxy.endpoint.clone();
    fill_notes(&database.connect().await, 1_000).await;

    let backup = agent
        .backup(
            "sse-1",
            &[
                "--database",
                database.name(),
                "--s3-sse",
                "aws:kms",
                "--s3-sse-kms-key-id",
                "backup-key-1",
            ],
        )
        .await;
    backup.assert_completed();
    let mut creating = proxy.request_heads("?uploads");
    creating.extend(proxy.request_heads("/manifest.json?x-id=PutObject"));
    assert_eq!(creating.len(), 3, "globals, the database and the manifest");
    for head in creating {
        assert!(
            head.contains("\r\nx-amz-server-side-encryption: aws:kms\r\n")
                && head
                    .contains("\r\nx-amz-server-side-encryption-aws-kms-key-id: backup-key-1\r\n"),
            "{head}"
        );
    }
    let parts = proxy.request_heads("x-id=UploadPart");
    assert_eq!(parts.len(), 2);
    assert!(
        parts
            .iter()
            .all(|head| !head.contains("x-amz-server-side-encryption")),
        "{parts:?}"
    );

    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_upload_that_breaks_half_way_is_sent_again() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "part-retry").await;
    let (bucket, database, work) = (&scratch.bucket, &scratch.database, &scratch.work);
    // About 9 MB of dump: two 5 MiB parts.
    fill_notes(&database.connect().await, 400_000).await;
    let second_part = "x-id=UploadPart&partNumber=2&";
    let proxy = Proxy::cutting(
        &env.s3_endpoint,
        Cut {
            method: "PUT",
            path_contains: second_part.to_string(),
            after_bytes: 1_000_000,
            ranged_too: false,
            times: 2,
        },
    )
    .await;
    let mut agent = Agent::new(&env, bucket.name(), "retry", work);
    agent.s3_endpoint = proxy.endpoint.clone();
    let s3 = bucket.client();

    // Without retries the broken part fails the backup, which cleans up after itself.
    let no_retry = agent
        .backup(
            "retry-0",
            &[
                "--database",
                database.name(),
                "--part-size-mib",
                "5",
                "--s3-max-attempts",
                "1",
                "--s3-part-retries",
                "0",
            ],
        )
        .await;
    no_retry.assert_failed();
    assert!(
        no_retry.message().contains("UploadPart"),
        "{}",
        no_retry.message()
    );
    assert!(!object_exists(&s3, bucket.name(), &agent.key("retry-0", "manifest.json")).await);
    assert!(
        open_multipart_uploads(&s3, bucket.name(), "retry/")
            .await
            .is_empty()
    );

    // With them (the default), the part is sent again and the backup completes.
    let backup = agent
        .backup(
            "retry-1",
            &["--database", database.name(), "--part-size-mib", "5"],
        )
        .await;
    backup.assert_completed();
    assert_eq!(proxy.cuts(), 2);
    assert_eq!(
        proxy.request_heads(second_part).len(),
        3,
        "once for the failed backup, twice for the retried part"
    );

    // What is stored is what the manifest says, and no upload is left open.
    let manifest: serde_json::Value = serde_json::from_slice(
        &get_object(&s3, bucket.name(), &agent.key("retry-1", "manifest.json")).await,
    )
    .expect("manifest is JSON");
    let dump = &manifest["databases"][0];
    let (size, sha256) =
        object_digest(&s3, bucket.name(), dump["key"].as_str().expect("key")).await;
    assert!(size > 5 * 1024 * 1024, "two parts: {size} bytes");
    assert_eq!(Some(size), dump["size"].as_u64());
    assert_eq!(Some(sha256.as_str()), dump["sha256"].as_str());
    assert!(
        open_multipart_uploads(&s3, bucket.name(), "retry/")
            .await
            .is_empty()
    );

    scratch.cleanup().await;
}

/// The client's own attempts used up (one here), a part that broke is sent again after the first
/// of the agent's waits (5 s), and the backup completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_that_fails_after_the_clients_attempts_is_sent_again_later() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "part-later").await;
    let (bucket, database, work) = (&scratch.bucket, &scratch.database, &scratch.work);
    fill_notes(&database.connect().await, 400_000).await;
    let second_part = "x-id=UploadPart&partNumber=2&";
    let proxy = Proxy::cutting(
        &env.s3_endpoint,
        Cut {
            method: "PUT",
            path_contains: second_part.to_string(),
            after_bytes: 1_000_000,
            ranged_too: false,
            times: 1,
        },
    )
    .await;
    let mut agent = Agent::new(&env, bucket.name(), "later", work);
    agent.s3_endpoint = proxy.endpoint.clone();
    let started = std::time::Instant::now();
    let backup = agent
        .backup(
            "later-1",
            &[
                "--database",
                database.name(),
                "--part-size-mib",
                "5",
                "--s3-max-attempts",
                "1",
            ],
        )
        .await;
    backup.assert_completed();
    assert_eq!(proxy.cuts(), 1);
    assert_eq!(proxy.request_heads(second_part).len(), 2, "sent again once");
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(5),
        "after the agent's first wait"
    );
    let s3 = bucket.client();
    assert!(object_exists(&s3, bucket.name(), &agent.key("later-1", "manifest.json")).await);
    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_resumes_downloads_that_break_half_way() {
    let Some(env) = testbed() else { return };
    // Only whole GETs are cut: the verification pass and the restore pass both break once and
    // have to resume with a ranged GET.
    let case = CutDownloadCase::prepare(&env, "resume", false).await;
    let restore = case
        .agent
        .restore("backup-1", &case.restore_args(&[]))
        .await;
    restore.assert_completed();
    assert_eq!(case.proxy.cuts(), 2, "both passes were cut once");
    assert_eq!(
        restore.stderr.matches("resuming from there").count(),
        2,
        "each cut was resumed: {}",
        restore.stderr
    );
    let ranged = case
        .proxy
        .request_heads("GET ")
        .iter()
        .filter(|head| head.contains("\r\nrange: bytes="))
        .count();
    assert_eq!(ranged, 2, "one ranged GET per cut");
    assert_eq!(
        fingerprint(&case.scratch.database.connect().await).await,
        case.before
    );
    case.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_that_keeps_breaking_fails_the_restore_before_any_change() {
    let Some(env) = testbed() else { return };
    // Ranged GETs are cut too, so no resume can finish the object.
    let case = CutDownloadCase::prepare(&env, "resume-fail", true).await;
    let restore = case
        .agent
        .restore("backup-1", &case.restore_args(&["--s3-max-attempts", "3"]))
        .await;
    restore.assert_failed();
    let message = restore.message();
    assert!(
        message.contains("GetObject") && message.contains("after 2 resumes"),
        "{message}"
    );
    // The verification pass failed: the existing database was not dropped.
    assert_eq!(
        fingerprint(&case.scratch.database.connect().await).await,
        case.before
    );
    case.cleanup().await;
}

/// A database of 100,000 rows backed up as `backup-1`, and an agent that reads the backup
/// through a proxy breaking every GET of its dump after 300 kB.
struct CutDownloadCase {
    scratch: Scratch,
    before: Vec<(String, i64, String)>,
    proxy: Proxy,
    agent: Agent,
}

impl CutDownloadCase {
    async fn prepare(env: &pgkube_testkit::TestEnv, name: &str, ranged_too: bool) -> Self {
        let scratch = Scratch::create(env, name).await;
        let (bucket, database) = (&scratch.bucket, &scratch.database);
        let before = fill_notes(&database.connect().await, 100_000).await;
        let mut agent = Agent::new(env, bucket.name(), name, &scratch.work);
        agent
            .backup("backup-1", &["--database", database.name()])
            .await
            .assert_completed();
        let proxy = Proxy::cutting(
            &env.s3_endpoint,
            Cut {
                method: "GET",
                path_contains: format!("/databases/{}.dump", database.name()),
                after_bytes: 300_000,
                ranged_too,
                times: usize::MAX,
            },
        )
        .await;
        agent.s3_endpoint = proxy.endpoint.clone();
        CutDownloadCase {
            scratch,
            before,
            proxy,
            agent,
        }
    }

    /// Replace the existing database, no globals, plus `extra`.
    fn restore_args<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![
            "--database",
            self.scratch.database.name(),
            "--drop-existing",
            "--skip-globals",
        ];
        args.extend_from_slice(extra);
        args
    }

    async fn cleanup(self) {
        self.scratch.cleanup().await;
    }
}

/// A table of `rows` rows (md5 text, which compresses poorly); returns the database fingerprint.
async fn fill_notes(client: &Client, rows: i64) -> Vec<(String, i64, String)> {
    client
        .batch_execute(&format!(
            "CREATE TABLE notes (id bigint PRIMARY KEY, body text);
             INSERT INTO notes SELECT g, md5(g::text) FROM generate_series(1, {rows}) g;"
        ))
        .await
        .expect("filling the database");
    fingerprint(client).await
}
