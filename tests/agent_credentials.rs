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
//! - the pod's identity through a container credentials endpoint, as EKS Pod Identity sets a
//!   pod up: the chain asks the endpoint, with the pod's token, for temporary keys. The test bed
//!   has no AWS: a loopback server of the test speaks the endpoint's protocol and hands out the
//!   test bed's keys with a session token; the store (Garage) is real.

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
        agent.keys_via = keys_via.clone();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keys_the_default_chain_asks_the_pods_credentials_endpoint() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "pod-identity").await;
    let (bucket, database, work) = (&scratch.bucket, &scratch.database, &scratch.work);
    let client = database.connect().await;
    fill(&client).await;
    let before = fingerprint(&client).await;
    let session_token = "session-token-from-the-pod-identity-0123456789";
    let pod_token = "eks-pod-identity-token-0123456789";
    let mut agent = Agent::new(&env, bucket.name(), "identity", work);
    let endpoint = CredentialsEndpoint::start(
        pod_token,
        serde_json::json!({
            "AccessKeyId": agent.access_key,
            "SecretAccessKey": agent.secret_key,
            "Token": session_token,
            "Expiration": (chrono::Utc::now() + chrono::Duration::hours(1))
                .format("%Y-%m-%dT%H:%M:%SZ")
                .to_string(),
        }),
    )
    .await;
    let proxy = Proxy::recording(&env.s3_endpoint).await;
    agent.s3_endpoint = proxy.endpoint.clone();
    agent.keys_via = KeysVia::ContainerEndpoint {
        uri: endpoint.uri.clone(),
        authorization: pod_token.to_owned(),
    };

    let backup = agent.backup("b1", &["--database", database.name()]).await;
    backup.assert_completed();
    let restore = agent
        .restore("b1", &["--database", database.name(), "--drop-existing"])
        .await;
    restore.assert_completed();
    assert_every_request_carries(&proxy, session_token, "pod identity");
    assert_eq!(fingerprint(&database.connect().await).await, before);
    let asked = endpoint.authorizations();
    assert!(!asked.is_empty(), "the endpoint was never asked");
    assert!(
        asked.iter().all(|seen| seen == pod_token),
        "asked without the pod's token: {asked:?}"
    );
    for outcome in [&backup, &restore] {
        outcome.assert_does_not_reveal(session_token);
        outcome.assert_does_not_reveal(&agent.secret_key);
    }

    // An endpoint that refuses the pod: the agent fails and says where credentials failed.
    let refusing = CredentialsEndpoint::start("another-pods-token", serde_json::json!({})).await;
    agent.keys_via = KeysVia::ContainerEndpoint {
        uri: refusing.uri.clone(),
        authorization: pod_token.to_owned(),
    };
    let refused = agent.backup("b2", &["--database", database.name()]).await;
    refused.assert_failed();
    assert!(
        refused
            .message()
            .to_ascii_lowercase()
            .contains("credential"),
        "{}",
        refused.message()
    );

    scratch.cleanup().await;
}

/// A container credentials endpoint on loopback: answers a request carrying `token` in its
/// `Authorization` header with `credentials`, any other with 401; remembers what each request
/// carried.
struct CredentialsEndpoint {
    uri: String,
    authorizations: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    server: tokio::task::JoinHandle<()>,
}

impl CredentialsEndpoint {
    async fn start(token: &str, credentials: serde_json::Value) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the credentials endpoint");
        let uri = format!(
            "http://{}/v1/credentials",
            listener.local_addr().expect("address")
        );
        let authorizations = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (seen, token, body) = (
            authorizations.clone(),
            token.to_owned(),
            credentials.to_string(),
        );
        let server = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let authorization = head
                    .lines()
                    .find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("authorization")
                            .then(|| value.trim().to_owned())
                    })
                    .unwrap_or_default();
                let (status, body) = match authorization == token {
                    true => ("200 OK", body.clone()),
                    false => (
                        "401 Unauthorized",
                        r#"{"message":"unauthorized"}"#.to_owned(),
                    ),
                };
                seen.lock().expect("lock").push(authorization);
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            }
        });
        Self {
            uri,
            authorizations,
            server,
        }
    }

    fn authorizations(&self) -> Vec<String> {
        self.authorizations.lock().expect("lock").clone()
    }
}

impl Drop for CredentialsEndpoint {
    fn drop(&mut self) {
        self.server.abort();
    }
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
