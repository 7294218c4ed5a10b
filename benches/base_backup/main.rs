//! Benchmark of physical base backups: one PostgreSQL 15 database of a few GB backed up by
//! pgkube's agent (`pgkube agent backup --method physical`) to the test bed's Garage, side by
//! side with `pgbackrest backup` (full, process-max 2, zstd) to the same Garage and
//! `pg_basebackup -Ft -z` to a local file.
//!
//! Not a test: it prints figures and asserts nothing. Needs the test bed (`tests/testbed/up`),
//! PostgreSQL 15 and root (the server runs as `postgres`); it installs the Debian package
//! `pgbackrest` when it is missing, and leaves that peer out if it cannot.
//!
//! ```text
//! cargo bench --bench base_backup
//! PGKUBE_BENCH_BASE_SCALE=20 PGKUBE_BENCH_BASE_NOISE_ROWS=1000000 \
//!     cargo bench --bench base_backup   # a smaller database
//! ```
//!
//! 1. pgkube's instance manager runs the server and archives its WAL (the agent records a
//!    backup only once the WAL it needs is archived, so the archive must work);
//! 2. the database is filled: `pgbench -i -s <scale>` (default 150: about 2.2 GB, very
//!    compressible) and a table of random hex (about 1 GB, half compressible);
//! 3. each tool backs the same running server up, one after the other, each starting with a
//!    fast checkpoint. pgkube's time ends when the backup is recorded: the base backup stored
//!    and checked, and its WAL found in the archive. pgBackRest runs with `archive-check=n`
//!    (the server archives with pgkube, not with pgBackRest), so it does not wait for WAL.
//!
//! It prints, per tool: seconds, the database's MB per second, the bytes stored, and the peak
//! resident memory of the tool's own process (pgkube's agent; pgBackRest's main process; not
//! `pg_basebackup`, which is the same program inside pgkube's agent).

#[path = "../wal_archive/peers.rs"]
#[allow(dead_code)] // shared with the wal_archive bench, which uses all of it
mod peers;
#[path = "../wal_archive/server.rs"]
mod server;
mod tools;

use std::time::Duration;

use pgkube_testkit::TestBucket;

const DEFAULT_SCALE: u32 = 150;
/// Rows of random hex: about 1 GB.
const DEFAULT_NOISE_ROWS: u64 = 8_000_000;

/// What one tool did.
pub struct Row {
    pub tool: &'static str,
    pub elapsed: Duration,
    pub stored_bytes: u64,
    /// Peak resident set of the tool's process, when measured.
    pub peak_rss_kib: Option<u64>,
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(bench());
}

async fn bench() {
    let Some(env) = pgkube_testkit::testbed() else {
        println!("base_backup: test bed not running, nothing measured");
        return;
    };
    let scale = setting("PGKUBE_BENCH_BASE_SCALE", DEFAULT_SCALE);
    let noise_rows = setting("PGKUBE_BENCH_BASE_NOISE_ROWS", DEFAULT_NOISE_ROWS);
    let bucket = TestBucket::create(&env, "base-bench").await;
    let work = std::env::temp_dir().join(format!("pgkube-base-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("work dir");
    let dir = work.join("server");
    let (mut server, _, _) = peers::pgkube(&env, &bucket, &dir)
        .await
        .expect("the instance manager starts");
    let sql = server.connect().await;
    fill(&server, &sql, scale, noise_rows).await;
    let database_bytes: i64 = sql
        .query_one(
            "SELECT sum(pg_database_size(datname))::bigint FROM pg_database",
            &[],
        )
        .await
        .expect("database size")
        .get(0);
    println!(
        "base_backup: pgbench scale {scale} and {noise_rows} random rows: {:.0} MB in all databases",
        database_bytes as f64 / f64::from(1u32 << 20)
    );

    let mut rows = Vec::new();
    rows.push(tools::pgkube(&env, &bucket, &server, &work).await);
    match tools::pgbackrest(&env, &bucket, &server, &work).await {
        Ok(row) => rows.push(row),
        Err(why) => println!("pgbackrest: left out: {why}"),
    }
    rows.push(tools::pg_basebackup(&server, &work));
    print_rows(&rows, database_bytes);
    if let Some(kib) = server.peak_rss_kib() {
        println!(
            "instance manager peak RSS (archiving the load's WAL, then the backups'): {:.1} MiB",
            kib as f64 / 1024.0
        );
    }
    server.stop();
    bucket.cleanup().await;
    let _ = std::fs::remove_dir_all(&work);
}

/// `pgbench -i` at `scale`, then the table of random hex, then a checkpoint.
/// A number from the environment, else `default`.
fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

async fn fill(server: &server::Server, sql: &tokio_postgres::Client, scale: u32, noise_rows: u64) {
    let status = server::as_postgres(&format!("{}/pgbench", server::BIN))
        .args(["-i", "-q", "-s", &scale.to_string(), "-h", "127.0.0.1"])
        .args(["-p", &server.port.to_string(), "-U", "postgres", "postgres"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("pgbench runs");
    assert!(status.success(), "pgbench -i: {status}");
    let noise = format!(
        "CREATE TABLE noise AS SELECT g AS id, md5(random()::text) || md5(random()::text) AS hex \
         FROM generate_series(1, {noise_rows}) g; CHECKPOINT"
    );
    sql.batch_execute(&noise).await.expect("the random table");
}

fn print_rows(rows: &[Row], database_bytes: i64) {
    println!(
        "| tool | seconds | MB/s of database | stored MB | stored / database | peak RSS MiB |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let mib = f64::from(1u32 << 20);
    for row in rows {
        let seconds = row.elapsed.as_secs_f64();
        let rss = row.peak_rss_kib.map_or_else(
            || "-".to_owned(),
            |kib| format!("{:.1}", kib as f64 / 1024.0),
        );
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.3} | {rss} |",
            row.tool,
            seconds,
            database_bytes as f64 / mib / seconds,
            row.stored_bytes as f64 / mib,
            row.stored_bytes as f64 / database_bytes.max(1) as f64,
        );
    }
}
