//! The base-backup tools compared, each run once against the same running server: pgkube's
//! agent, `pgbackrest backup` and `pg_basebackup`. Each gives a [`Row`].

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pgkube_testkit::proxy::Proxy;
use pgkube_testkit::{TestBucket, TestEnv, list_objects};

use super::Row;
use super::server::{self, BIN, Server, as_postgres};

/// The uid `peers::pgkube` records as the archive's cluster.
const CLUSTER_UID: &str = "bench-uid";

/// `pgkube agent backup --method physical`: the base backup streamed into the bucket under
/// `pgkube/bench-uid/base/`, recorded once its WAL is in the archive `peers::pgkube` set up.
pub async fn pgkube(env: &TestEnv, bucket: &TestBucket, server: &Server, work: &Path) -> Row {
    let termination = work.join("termination-base");
    let path = format!("{BIN}:{}", std::env::var("PATH").unwrap_or_default());
    let mut command = Command::new(env!("CARGO_BIN_EXE_pgkube"));
    command
        .args([
            "agent",
            "backup",
            "--backup-name",
            "base",
            "--method",
            "physical",
        ])
        .args(["--wal-root", "pgkube/wal/bench/", "--cluster", "bench"])
        .args(["--namespace", "bench", "--cluster-uid", CLUSTER_UID])
        .args([
            "--backup-uid",
            "base-uid",
            "--s3-endpoint",
            &env.s3_endpoint,
        ])
        .args(["--s3-region", &env.s3_region, "--s3-bucket", bucket.name()])
        .args(["--s3-prefix", "pgkube", "--s3-force-path-style"])
        .arg("--termination-message-path")
        .arg(&termination)
        .env("PATH", path)
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", server.port.to_string())
        .env("PGUSER", "postgres")
        .env("PGPASSWORD", "bench")
        .env("AWS_ACCESS_KEY_ID", &env.s3_access_key)
        .env("AWS_SECRET_ACCESS_KEY", &env.s3_secret_key)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let (elapsed, peak_rss_kib, child) = run_measured(command);
    let output = child.wait_with_output().expect("the agent's output");
    let line = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && line.contains("\"Completed\""),
        "pgkube agent: {}: {line}",
        output.status
    );
    Row {
        tool: "pgkube agent (pg_basebackup tar, zstd, multipart)",
        elapsed,
        stored_bytes: stored_bytes(bucket, &format!("pgkube/{CLUSTER_UID}/base/")).await,
        peak_rss_kib,
    }
}

/// `pgbackrest backup --type=full`, process-max 2, zstd, to the store through an HTTPS proxy
/// (pgBackRest speaks only HTTPS to S3).
pub async fn pgbackrest(
    env: &TestEnv,
    bucket: &TestBucket,
    server: &Server,
    work: &Path,
) -> Result<Row, String> {
    super::peers::install("pgbackrest", "pgbackrest")?;
    let dir = work.join("pgbackrest");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let proxy = Proxy::https(&env.s3_endpoint, &dir).await;
    let config = dir.join("pgbackrest.conf");
    let text = format!(
        "{repo}\
         process-max=2\n\
         compress-type=zst\n\
         start-fast=y\n\
         archive-check=n\n\
         repo1-retention-full=1\n\
         log-path={dir}/log\n\
         lock-path={dir}/lock\n\
         log-level-console=warn\n\
         [bench]\n\
         pg1-path={pgdata}\n\
         pg1-port={port}\n\
         pg1-socket-path={socket}\n\
         pg1-user=postgres\n",
        repo = super::peers::pgbackrest_repository(env, bucket, &proxy, "/pgbackrest-base"),
        dir = dir.display(),
        pgdata = server.pgdata().display(),
        port = server.port,
        socket = server.socket_dir().display(),
    );
    std::fs::write(&config, text).map_err(|e| e.to_string())?;
    for sub in ["log", "lock"] {
        std::fs::create_dir_all(dir.join(sub)).map_err(|e| e.to_string())?;
    }
    server::give_to_postgres(&dir);
    let config_arg = format!("--config={}", config.display());
    let created = as_postgres("pgbackrest")
        .args([&config_arg, "--stanza=bench", "stanza-create"])
        .status()
        .map_err(|e| e.to_string())?;
    if !created.success() {
        return Err(format!("pgbackrest stanza-create: {created}"));
    }
    let mut command = as_postgres("pgbackrest");
    command.args([&config_arg, "--stanza=bench", "--type=full", "backup"]);
    let (elapsed, peak_rss_kib, mut child) = run_measured(command);
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("pgbackrest backup: {status}"));
    }
    Ok(Row {
        tool: "pgbackrest backup (full, process-max 2, zst)",
        elapsed,
        stored_bytes: stored_bytes(bucket, "pgbackrest-base/").await,
        peak_rss_kib,
    })
}

/// `pg_basebackup -Ft -z` (gzip, one thread) into a local directory.
pub fn pg_basebackup(server: &Server, work: &Path) -> Row {
    let dir = work.join("pg_basebackup");
    std::fs::create_dir_all(&dir).expect("a directory");
    server::give_to_postgres(&dir);
    let target = dir.join("backup");
    let mut command = as_postgres(&format!("{BIN}/pg_basebackup"));
    command
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &server.port.to_string(),
            "-U",
            "postgres",
        ])
        .args(["-Ft", "-z", "-X", "none", "--checkpoint=fast", "-D"])
        .arg(&target);
    let (elapsed, peak_rss_kib, mut child) = run_measured(command);
    let status = child.wait().expect("pg_basebackup ends");
    assert!(status.success(), "pg_basebackup: {status}");
    let stored_bytes = std::fs::read_dir(&target)
        .expect("the backup")
        .filter_map(|entry| entry.ok()?.metadata().ok())
        .map(|metadata| metadata.len())
        .sum();
    Row {
        tool: "pg_basebackup -Ft -z (gzip) to a local file",
        elapsed,
        stored_bytes,
        peak_rss_kib,
    }
}

/// Runs `command` to its end, sampling its peak resident set (`VmHWM`) as it goes; returns
/// the time it took, the last peak seen, and the child to collect.
fn run_measured(mut command: Command) -> (Duration, Option<u64>, Child) {
    let started = Instant::now();
    let mut child = command.spawn().expect("the tool starts");
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = None;
    while child.try_wait().expect("the tool's state").is_none() {
        if let Some(kib) = std::fs::read_to_string(&status_file)
            .ok()
            .and_then(|status| vm_hwm_kib(&status))
        {
            peak = Some(kib);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (started.elapsed(), peak, child)
}

fn vm_hwm_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

async fn stored_bytes(bucket: &TestBucket, prefix: &str) -> u64 {
    list_objects(&bucket.client(), bucket.name(), prefix)
        .await
        .map(|objects| objects.values().map(|size| *size as u64).sum())
        .unwrap_or(0)
}
