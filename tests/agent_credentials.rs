//! How `pgkube agent` finds its S3 credentials, against the test bed's S3 server through a
//! recording proxy ([`pgkube_testkit::proxy`]), which shows what really went over the wire:
//!
//! - temporary keys: the session token (`AWS_SESSION_TOKEN`, or the file named by
//!   `PGKUBE_S3_SESSION_TOKEN_FILE` beside the key files) goes with every request, signed, as
//!   `x-amz-security-token`. The test bed's Garage issues no temporary keys and does not check
//!   the token; it still verifies the signature, which covers the token header. What AWS or
//!   MinIO would do with the token (check it against STS) is theirs to test.
//! - no keys at all: the AWS SDK's default chain is in charge. Here it finds the keys (and a
//!   session token) in a shared credentials file, the chain's second source; web identity,
//!   container credentials and instance metadata need AWS and are not reached from loopback
//!   (the agent runs with `AWS_EC2_METADATA_DISABLED=true`).

mod agent_common;

use agent_common::{Agent, KeysVia, Scratch, fingerprint};
use pgkube_testkit::proxy::Proxy;
use pgkube_testkit::testbed;
use pgkube_testkit::tokio_postgres::Client;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temporary_keys_send_their_session_token_with_every_request() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "session-token").await;
    let (bucket, database, work) = (&scratch.bucket, &scratch.database, &scratch.work);
    let client = database.connect().await;
    fill(&client).await;
    let before = fingerprint(&client).await;

    for (keys_via, token) in [
        (KeysVia::Env, "session-token-from-env-0123456789"),
        (KeysVia::Files, "session-token-from-a-file-0123456789"),
    ] {
        let proxy = Proxy::recording(&env.s3_endpoint).await;
        let mut agent = Agent::new(&env, bucket.name(), "token", work);
        agent.s3_endpoint = proxy.endpoint.clone();
        agent.keys_via = keys_via;
        agent.session_token = Some(token.to_string());
        let name = format!("{keys_via:?}").to_lowercase();

        let backup = agent.backup(&name, &["--database", database.name()]).await;
        backup.assert_completed();
        let restore = agent
            .restore(&name, &["--database", database.name(), "--drop-existing"])
            .await;
        restore.assert_completed();

        assert_every_request_carries(&proxy, token, &format!("{keys_via:?}"));
        for outcome in [&backup, &restore] {
            outcome.assert_does_not_reveal(token);
            outcome.assert_does_not_reveal(&agent.secret_key);
        }
        assert_eq!(fingerprint(&database.connect().await).await, before);
    }

    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keys_the_default_chain_finds_them_in_a_shared_credentials_file() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "default-chain").await;
    let (bucket, database, work) = (&scratch.bucket, &scratch.database, &scratch.work);
    fill(&database.connect().await).await;
    let token = "session-token-from-a-profile-0123456789";
    let proxy = Proxy::recording(&env.s3_endpoint).await;
    let mut agent = Agent::new(&env, bucket.name(), "chain", work);
    agent.s3_endpoint = proxy.endpoint.clone();
    agent.keys_via = KeysVia::Profile;
    agent.session_token = Some(token.to_string());

    let backup = agent.backup("b1", &["--database", database.name()]).await;
    backup.assert_completed();
    assert_every_request_carries(&proxy, token, "profile");
    backup.assert_does_not_reveal(token);
    backup.assert_does_not_reveal(&agent.secret_key);

    // The same chain with a wrong secret in the file: refused by the store, named clearly.
    let proxy = Proxy::recording(&env.s3_endpoint).await;
    agent.s3_endpoint = proxy.endpoint.clone();
    agent.secret_key = "not-the-secret-key-0123456789".into();
    let refused = agent.backup("b2", &["--database", database.name()]).await;
    refused.assert_failed();
    assert!(
        refused.message().contains("HTTP 403"),
        "{}",
        refused.message()
    );
    refused.assert_does_not_reveal(&agent.secret_key);

    scratch.cleanup().await;
}

/// Every request the proxy saw names the token, and signs it.
fn assert_every_request_carries(proxy: &Proxy, token: &str, case: &str) {
    let heads = proxy.request_heads("");
    assert!(heads.len() >= 5, "{case}: only {} requests", heads.len());
    for head in heads {
        let lower = head.to_ascii_lowercase();
        assert!(
            lower.contains(&format!("\r\nx-amz-security-token: {token}\r\n")),
            "{case}: a request without the session token:\n{head}"
        );
        let signed = lower
            .lines()
            .find(|line| line.starts_with("authorization:"))
            .is_some_and(|line| line.contains("x-amz-security-token"));
        assert!(signed, "{case}: the token is not signed:\n{head}");
    }
}

async fn fill(client: &Client) {
    client
        .batch_execute(
            "CREATE TABLE notes (id bigint PRIMARY KEY, body text NOT NULL);
             INSERT INTO notes SELECT i, repeat(md5(i::text), 8) FROM generate_series(1, 2000) i;",
        )
        .await
        .expect("filling the database");
}
