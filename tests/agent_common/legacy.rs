//! Backups as earlier agents stored them, made here with the PostgreSQL tools, to check that
//! today's agent still restores them.

use pgkube_testkit::aws_sdk_s3::Client as S3Client;
use sha2::{Digest, Sha256};

use super::{Agent, put_object};

/// Stores a backup exactly as the agent did before it compressed, and before the uids named its
/// directory: `pg_dumpall --globals-only` and `pg_dump -Fc` with pg_dump's own default
/// compression, uploaded as they are under `<prefix>/<name>/`, and the shared manifest type
/// written as is (no `compression` on any object, no uid).
pub async fn store_old_format_backup(
    agent: &Agent,
    s3: &S3Client,
    backup: &str,
    databases: &[&str],
) -> Vec<u8> {
    use pgkube_controllers::storage::manifest::{
        DATABASE_FORMAT, DatabaseObject, GLOBALS_FORMAT, MANIFEST_VERSION, Manifest, StoredObject,
    };
    let store = |key: String, bytes: Vec<u8>, format: &str| {
        let object = StoredObject {
            key: key.clone(),
            size: bytes.len() as u64,
            sha256: hex::encode(Sha256::digest(&bytes)),
            format: format.to_string(),
            compression: None,
        };
        async move {
            put_object(s3, &agent.bucket, &key, bytes).await;
            object
        }
    };
    let globals = run_pg_tool(agent, "pg_dumpall", &["--globals-only"]);
    let globals = store(
        agent.legacy_key(backup, "globals.sql"),
        globals,
        GLOBALS_FORMAT,
    )
    .await;
    let mut objects = Vec::new();
    for name in databases {
        let dump = run_pg_tool(agent, "pg_dump", &["--format=custom", "--dbname", name]);
        let key = agent.legacy_key(backup, &format!("databases/{name}.dump"));
        objects.push(DatabaseObject {
            name: name.to_string(),
            object: store(key, dump, DATABASE_FORMAT).await,
        });
    }
    let manifest = Manifest {
        manifest_version: MANIFEST_VERSION,
        cluster: "main".into(),
        namespace: "agent-tests".into(),
        cluster_uid: None,
        system_identifier: None,
        backup_name: backup.into(),
        backup_uid: None,
        postgresql_version: "15".into(),
        started_at: "2026-01-01T00:00:00Z".into(),
        finished_at: "2026-01-01T00:01:00Z".into(),
        format: DATABASE_FORMAT.into(),
        globals: Some(globals),
        databases: objects,
        physical: None,
    };
    let bytes = serde_json::to_vec_pretty(&manifest).expect("manifest JSON");
    put_object(
        s3,
        &agent.bucket,
        &agent.legacy_key(backup, "manifest.json"),
        bytes.clone(),
    )
    .await;
    bytes
}

/// Runs a PostgreSQL tool against the test bed as the agent's login; its stdout.
fn run_pg_tool(agent: &Agent, program: &str, args: &[&str]) -> Vec<u8> {
    let output = std::process::Command::new(program)
        .args(args)
        .env("PGHOST", &agent.login.host)
        .env("PGPORT", &agent.login.port)
        .env("PGUSER", &agent.login.user)
        .env("PGPASSWORD", &agent.login.password)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}
