//! Shared helpers of the `pgkube agent` integration tests: running the real binary against the
//! test bed's PostgreSQL and S3 server, and reading back what it stored.

#![allow(dead_code)] // Each test crate uses its own subset.

pub mod legacy;

use std::path::{Path, PathBuf};
use std::process::Output;

use pgkube_testkit::aws_sdk_s3::Client as S3Client;
use pgkube_testkit::tokio_postgres::{Client, NoTls};
use pgkube_testkit::{TestBucket, TestDatabase, TestEnv};
use sha2::{Digest, Sha256};

/// PostgreSQL connection parts of the test bed's superuser URL.
#[derive(Clone, Debug)]
pub struct PgLogin {
    pub host: String,
    pub port: String,
    pub user: String,
    pub password: String,
}

impl PgLogin {
    /// Parses `postgres://user:password@host:port/db`.
    pub fn from_url(url: &str) -> PgLogin {
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        let (credentials, location) = rest.rsplit_once('@').expect("URL has user@host");
        let (user, password) = credentials.split_once(':').expect("URL has user:password");
        let authority = location.split(['/', '?']).next().unwrap_or(location);
        let (host, port) = authority.rsplit_once(':').unwrap_or((authority, "5432"));
        PgLogin {
            host: host.to_string(),
            port: port.to_string(),
            user: percent_decode(user),
            password: percent_decode(password),
        }
    }

    pub fn url_for(&self, database: &str) -> String {
        format!(
            "host={} port={} user={} password={} dbname={}",
            self.host, self.port, self.user, self.password, database
        )
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = (bytes[index] == b'%' && index + 2 < bytes.len())
            .then(|| std::str::from_utf8(&bytes[index + 1..index + 3]).ok())
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        if let Some(byte) = escaped {
            out.push(byte);
            index += 3;
            continue;
        }
        out.push(bytes[index]);
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Removes the trace context and the `OTEL_*` variables the test process may have, so that a
/// test decides whether and where the agent exports spans.
pub fn clear_trace_variables(command: &mut tokio::process::Command) {
    command.env_remove("TRACEPARENT").env_remove("TRACESTATE");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("OTEL_") {
            command.env_remove(name);
        }
    }
}

/// How the agent is given its S3 keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeysVia {
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`).
    Env,
    /// Files named by `PGKUBE_S3_ACCESS_KEY_ID_FILE`, `PGKUBE_S3_SECRET_ACCESS_KEY_FILE` (and
    /// `PGKUBE_S3_SESSION_TOKEN_FILE`), as mounted Secrets are.
    Files,
    /// No key for the agent at all: the AWS SDK's default chain finds them in a shared
    /// credentials file (`AWS_SHARED_CREDENTIALS_FILE`, profile `default`).
    Profile,
    /// No key for the agent at all: the default chain asks a container credentials endpoint,
    /// as EKS Pod Identity's webhook sets a pod up to (`AWS_CONTAINER_CREDENTIALS_FULL_URI` and
    /// the token file named by `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`).
    ContainerEndpoint { uri: String, authorization: String },
}

/// Every variable through which the SDK's default chain could find credentials on the machine
/// running the tests; the agent gets none of them unless a test asks.
const AMBIENT_CREDENTIAL_VARIABLES: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "PGKUBE_S3_ACCESS_KEY_ID_FILE",
    "PGKUBE_S3_SECRET_ACCESS_KEY_FILE",
    "PGKUBE_S3_SESSION_TOKEN_FILE",
];

/// One invocation of `pgkube agent backup|restore` with the test bed's settings.
pub struct Agent {
    pub login: PgLogin,
    pub s3_endpoint: String,
    pub s3_region: String,
    pub access_key: String,
    pub secret_key: String,
    /// Sent with the keys, as temporary keys must be.
    pub session_token: Option<String>,
    pub keys_via: KeysVia,
    pub bucket: String,
    pub prefix: String,
    /// The cluster uid every backup of this agent is made for.
    pub cluster_uid: String,
    pub work_dir: PathBuf,
    /// Directory put first on PATH (for fake PostgreSQL tools).
    pub path_first: Option<PathBuf>,
    /// Pass the PostgreSQL password through PGKUBE_PGPASSWORD_FILE instead of PGPASSWORD.
    pub password_in_file: bool,
    /// More variables for the agent, set last (`TRACEPARENT`, `OTEL_*`...). Without them the
    /// agent gets no trace context and no `OTEL_*` variable from the machine running the tests.
    pub env: Vec<(String, String)>,
}

/// What one run produced.
#[derive(Debug)]
pub struct AgentOutcome {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
    /// The stdout line parsed as JSON.
    pub report: serde_json::Value,
    /// The termination-message file, parsed as JSON.
    pub termination: serde_json::Value,
}

impl AgentOutcome {
    pub fn message(&self) -> String {
        self.report["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub fn assert_completed(&self) {
        assert!(
            self.success && self.report["status"] == "Completed",
            "agent failed:\nstdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
    }

    /// Failed with a non-zero exit, a Failed report and the same report as termination message.
    pub fn assert_failed(&self) {
        assert!(
            !self.success,
            "agent should have failed:\nstdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        assert_eq!(self.report["status"], "Failed", "stdout: {}", self.stdout);
        assert_eq!(self.termination, self.report, "termination message differs");
        let message = self.message();
        assert!(
            !message.is_empty() && !message.contains('\n'),
            "{message:?}"
        );
    }

    /// Neither output mentions `secret`.
    pub fn assert_does_not_reveal(&self, secret: &str) {
        assert!(!self.stdout.contains(secret), "stdout reveals a secret");
        assert!(!self.stderr.contains(secret), "stderr reveals a secret");
    }
}

impl Agent {
    pub fn new(env: &TestEnv, bucket: &str, prefix: &str, work_dir: &Path) -> Agent {
        Agent {
            login: PgLogin::from_url(&env.pg_url),
            s3_endpoint: env.s3_endpoint.clone(),
            s3_region: env.s3_region.clone(),
            access_key: env.s3_access_key.clone(),
            secret_key: env.s3_secret_key.clone(),
            session_token: None,
            keys_via: KeysVia::Env,
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            cluster_uid: "agent-tests-cluster-uid".to_string(),
            work_dir: work_dir.to_path_buf(),
            path_first: None,
            password_in_file: false,
            env: Vec::new(),
        }
    }

    /// Backup `name` as the PostgreSQLBackup of uid [`Agent::uid_of`]`(name)`.
    pub async fn backup(&self, name: &str, extra: &[&str]) -> AgentOutcome {
        self.backup_as(name, &Self::uid_of(name), extra).await
    }

    /// Backup `name` as the PostgreSQLBackup of uid `backup_uid`.
    pub async fn backup_as(&self, name: &str, backup_uid: &str, extra: &[&str]) -> AgentOutcome {
        let mut args = vec!["--cluster", "main", "--namespace", "agent-tests"];
        args.extend([
            "--cluster-uid",
            &self.cluster_uid,
            "--backup-uid",
            backup_uid,
        ]);
        args.extend_from_slice(extra);
        self.run("backup", name, &args).await
    }

    /// Restores backup `name` made by [`Agent::backup`], from its manifest's key.
    pub async fn restore(&self, name: &str, extra: &[&str]) -> AgentOutcome {
        let manifest_key = self.key(name, "manifest.json");
        self.restore_at(name, &manifest_key, extra).await
    }

    /// Restores the backup whose manifest is `manifest_key`.
    pub async fn restore_at(&self, name: &str, manifest_key: &str, extra: &[&str]) -> AgentOutcome {
        let mut args = vec!["--manifest-key", manifest_key];
        args.extend_from_slice(extra);
        self.run("restore", name, &args).await
    }

    /// Restores backup `name` without a manifest key: the agent reads the legacy layout.
    pub async fn restore_legacy(&self, name: &str, extra: &[&str]) -> AgentOutcome {
        self.run("restore", name, extra).await
    }

    /// The uid [`Agent::backup`] gives backup `name`.
    pub fn uid_of(name: &str) -> String {
        format!("{name}-uid")
    }

    async fn run(&self, subcommand: &str, name: &str, extra: &[&str]) -> AgentOutcome {
        let termination = self
            .work_dir
            .join(format!("termination-{subcommand}-{name}"));
        let _ = std::fs::remove_file(&termination);
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgkube"));
        command
            .args(["agent", subcommand, "--backup-name", name])
            .args([
                "--s3-endpoint",
                &self.s3_endpoint,
                "--s3-region",
                &self.s3_region,
            ])
            .args(["--s3-bucket", &self.bucket, "--s3-prefix", &self.prefix])
            .arg("--s3-force-path-style")
            .arg("--termination-message-path")
            .arg(&termination)
            .args(extra)
            .env("PGHOST", &self.login.host)
            .env("PGPORT", &self.login.port)
            .env("PGUSER", &self.login.user)
            .env("RUST_LOG", "debug")
            .env_remove("PGPASSWORD")
            .env_remove("PGKUBE_PGPASSWORD_FILE")
            .env_remove("PGDATABASE");
        self.pass_s3_keys(&mut command);
        if self.password_in_file {
            let file = self.work_dir.join("pgpassword");
            std::fs::write(&file, format!("{}\n", self.login.password)).expect("password file");
            command.env("PGKUBE_PGPASSWORD_FILE", file);
        } else {
            command.env("PGPASSWORD", &self.login.password);
        }
        clear_trace_variables(&mut command);
        command.envs(self.env.iter().map(|(name, value)| (name, value)));
        if let Some(dir) = &self.path_first {
            let path = std::env::var("PATH").unwrap_or_default();
            command.env("PATH", format!("{}:{path}", dir.display()));
        }
        let Output {
            status,
            stdout,
            stderr,
        } = command.output().await.expect("running pgkube agent");
        let stdout = String::from_utf8_lossy(&stdout).into_owned();
        let stderr = String::from_utf8_lossy(&stderr).into_owned();
        let report = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not one JSON line ({e}): {stdout}\n{stderr}"));
        let termination = std::fs::read_to_string(&termination)
            .map(|text| serde_json::from_str(&text).expect("termination message is JSON"))
            .unwrap_or(serde_json::Value::Null);
        AgentOutcome {
            success: status.success(),
            stdout,
            stderr,
            report,
            termination,
        }
    }

    /// The keys as [`Agent::keys_via`] says, and nothing else the default chain could use (no
    /// instance metadata either: tests stay on loopback).
    fn pass_s3_keys(&self, command: &mut tokio::process::Command) {
        for variable in AMBIENT_CREDENTIAL_VARIABLES {
            command.env_remove(variable);
        }
        command.env("AWS_EC2_METADATA_DISABLED", "true");
        let token = self.session_token.as_deref();
        match &self.keys_via {
            KeysVia::Env => {
                command
                    .env("AWS_ACCESS_KEY_ID", &self.access_key)
                    .env("AWS_SECRET_ACCESS_KEY", &self.secret_key);
                if let Some(token) = token {
                    command.env("AWS_SESSION_TOKEN", token);
                }
            }
            KeysVia::Files => {
                let file = |name: &str, value: &str| {
                    let path = self.work_dir.join(name);
                    std::fs::write(&path, format!("{value}\n")).expect("writing a key file");
                    path
                };
                command
                    .env(
                        "PGKUBE_S3_ACCESS_KEY_ID_FILE",
                        file("access-key-id", &self.access_key),
                    )
                    .env(
                        "PGKUBE_S3_SECRET_ACCESS_KEY_FILE",
                        file("secret-access-key", &self.secret_key),
                    );
                if let Some(token) = token {
                    command.env("PGKUBE_S3_SESSION_TOKEN_FILE", file("session-token", token));
                }
            }
            KeysVia::Profile => {
                let mut profile = format!(
                    "[default]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
                    self.access_key, self.secret_key
                );
                if let Some(token) = token {
                    profile.push_str(&format!("aws_session_token = {token}\n"));
                }
                let credentials = self.work_dir.join("aws-credentials");
                std::fs::write(&credentials, profile).expect("writing the credentials file");
                command
                    .env("AWS_SHARED_CREDENTIALS_FILE", credentials)
                    .env("AWS_CONFIG_FILE", self.work_dir.join("no-aws-config"));
            }
            KeysVia::ContainerEndpoint { uri, authorization } => {
                let token_file = self.work_dir.join("pod-identity-token");
                std::fs::write(&token_file, authorization).expect("writing the token file");
                command
                    .env("AWS_CONTAINER_CREDENTIALS_FULL_URI", uri.as_str())
                    .env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", token_file)
                    .env("AWS_SHARED_CREDENTIALS_FILE", self.work_dir.join("none"))
                    .env("AWS_CONFIG_FILE", self.work_dir.join("no-aws-config"));
            }
        }
    }

    /// Key of `object` of backup `name` made by [`Agent::backup`]:
    /// `<prefix>/<cluster-uid>/<name>/<name>-uid/<object>`.
    pub fn key(&self, backup: &str, object: &str) -> String {
        self.key_as(backup, &Self::uid_of(backup), object)
    }

    /// Key of `object` of backup `name` made with uid `backup_uid`.
    pub fn key_as(&self, backup: &str, backup_uid: &str, object: &str) -> String {
        let directory = format!("{}/{backup}/{backup_uid}", self.cluster_uid);
        self.under_prefix(&format!("{directory}/{object}"))
    }

    /// Key of `object` of backup `name` in the layout from before the uids named the directory:
    /// `<prefix>/<name>/<object>`.
    pub fn legacy_key(&self, backup: &str, object: &str) -> String {
        self.under_prefix(&format!("{backup}/{object}"))
    }

    fn under_prefix(&self, rest: &str) -> String {
        let prefix = self.prefix.trim_matches('/');
        if prefix.is_empty() {
            rest.to_owned()
        } else {
            format!("{prefix}/{rest}")
        }
    }
}

pub async fn connect(login: &PgLogin, database: &str) -> Client {
    let (client, connection) =
        pgkube_testkit::tokio_postgres::connect(&login.url_for(database), NoTls)
            .await
            .unwrap_or_else(|e| panic!("connecting to {database}: {e}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

pub async fn database_exists(admin: &Client, name: &str) -> bool {
    let row = admin
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .await
        .expect("querying pg_database");
    row.get::<_, i64>(0) == 1
}

/// Row count and a content checksum of every table in `public`, plus the large objects: what a
/// faithful restore must reproduce.
pub async fn fingerprint(client: &Client) -> Vec<(String, i64, String)> {
    let tables = client
        .query(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename",
            &[],
        )
        .await
        .expect("listing tables");
    let mut prints = Vec::new();
    for table in tables {
        let name: String = table.get(0);
        // md5 of the sorted row md5s: independent of physical order, and small even for big tables.
        let sql = format!(
            "SELECT count(*), coalesce(md5(string_agg(h, '' ORDER BY h)), '') \
             FROM (SELECT md5(t::text) AS h FROM public.\"{name}\" t) rows"
        );
        let row = client.query_one(&sql, &[]).await.expect("table checksum");
        prints.push((name, row.get(0), row.get(1)));
    }
    let large_objects = client
        .query_one(
            "SELECT count(*), coalesce(md5(string_agg(oid::text || ':' || md5(lo_get(oid)), ',' ORDER BY oid)), '') \
             FROM pg_largeobject_metadata",
            &[],
        )
        .await
        .expect("large object checksum");
    prints.push((
        "<large objects>".into(),
        large_objects.get(0),
        large_objects.get(1),
    ));
    prints
}

/// Reads an object whole and returns its size and SHA-256.
pub async fn object_digest(s3: &S3Client, bucket: &str, key: &str) -> (u64, String) {
    let bytes = get_object(s3, bucket, key).await;
    (bytes.len() as u64, hex::encode(Sha256::digest(&bytes)))
}

pub async fn get_object(s3: &S3Client, bucket: &str, key: &str) -> Vec<u8> {
    s3.get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GetObject {key}: {e:?}"))
        .body
        .collect()
        .await
        .expect("reading object body")
        .into_bytes()
        .to_vec()
}

pub async fn put_object(s3: &S3Client, bucket: &str, key: &str, bytes: Vec<u8>) {
    s3.put_object()
        .bucket(bucket)
        .key(key)
        .body(bytes.into())
        .send()
        .await
        .unwrap_or_else(|e| panic!("PutObject {key}: {e:?}"));
}

pub async fn object_exists(s3: &S3Client, bucket: &str, key: &str) -> bool {
    match s3.head_object().bucket(bucket).key(key).send().await {
        Ok(_) => true,
        Err(error) if error.as_service_error().is_some_and(|e| e.is_not_found()) => false,
        Err(error) => panic!("HeadObject {key}: {error:?}"),
    }
}

/// Keys of the multipart uploads still open under `prefix`.
pub async fn open_multipart_uploads(s3: &S3Client, bucket: &str, prefix: &str) -> Vec<String> {
    let listed = s3
        .list_multipart_uploads()
        .bucket(bucket)
        .prefix(prefix)
        .send()
        .await
        .unwrap_or_else(|e| panic!("ListMultipartUploads: {e:?}"));
    listed
        .uploads()
        .iter()
        .filter_map(|upload| upload.key().map(str::to_string))
        .collect()
}

/// A fresh directory for files a test hands to the agent.
pub fn work_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pgkube-agent-test-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating the work dir");
    dir
}

/// What one agent test works in: a bucket, a database and a work directory of its own, all
/// removed by [`Scratch::cleanup`] (the bucket and database also on drop, if a test fails).
pub struct Scratch {
    pub bucket: TestBucket,
    pub database: TestDatabase,
    pub work: PathBuf,
}

impl Scratch {
    /// Bucket `agent-<name>-…`, database `agent_<name>_…`, work dir `…-<name>-<pid>`.
    pub async fn create(env: &TestEnv, name: &str) -> Scratch {
        Scratch {
            bucket: TestBucket::create(env, &format!("agent-{name}")).await,
            database: TestDatabase::create(env, &format!("agent_{}", name.replace('-', "_"))).await,
            work: work_dir(name),
        }
    }

    pub async fn cleanup(self) {
        self.database.cleanup().await;
        self.bucket.cleanup().await;
        let _ = std::fs::remove_dir_all(self.work);
    }
}
