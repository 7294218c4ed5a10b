//! Benchmark of point-in-time recovery: the time from nothing to a promoted primary, for a
//! PostgreSQL 15 database of a few GB and about 1 GB of WAL after its base backup, recovered by
//! pgkube's instance manager (as the first instance of a recovering cluster, from the test bed's
//! Garage), with its WAL prefetch on and off, side by side with `pgbackrest restore`
//! (process-max 2) followed by PostgreSQL replaying with pgBackRest's asynchronous
//! `archive-get` (process-max 2), from the same Garage.
//!
//! Not a test: it prints figures and asserts nothing but that each recovery ends with every row.
//! Needs the test bed (`tests/testbed/up`), PostgreSQL 15 and root (the servers run as
//! `postgres`); it installs the Debian package `pgbackrest` when it is missing, and leaves that
//! peer out if it cannot.
//!
//! ```text
//! cargo bench --bench recovery
//! PGKUBE_BENCH_RECOVERY_SCALE=20 PGKUBE_BENCH_RECOVERY_WAL_MB=256 \
//!     cargo bench --bench recovery     # a smaller one
//! ```
//!
//! 1. pgkube's instance manager runs the source server and archives its WAL; the database is
//!    filled (`pgbench -i -s <scale>`, default 150: about 2.2 GB) and backed up twice: by
//!    pgkube's agent (physical) and by `pgbackrest backup` (full).
//! 2. A writer commits rows of random hex until `<wal MB>` (default 1024) of WAL were written
//!    after both backups; the last file is archived by pgkube, and every file since the first
//!    backup's start is pushed to pgBackRest's repository (not timed). The source stops.
//! 3. Each recovery starts from an empty directory, after a `sync` and with the page cache
//!    dropped, and ends when the server promoted at the end of the archive. Its base-backup part ends when the data directory is in place (pgkube:
//!    when it is swapped in, after its checks; pgBackRest: when `restore` exits), the rest is
//!    the replay.

#[path = "../wal_archive/peers.rs"]
#[allow(dead_code)] // shared with the wal_archive bench, which uses all of it
mod peers;
mod recover;
#[path = "../wal_archive/server.rs"]
mod server;
#[path = "../base_backup/tools.rs"]
#[allow(dead_code)] // shared with the base_backup bench, which uses all of it
mod tools;

use std::time::Duration;

use pgkube_testkit::TestBucket;

const DEFAULT_SCALE: u32 = 150;
const DEFAULT_WAL_MB: u64 = 1024;

/// What one backup tool did (the base_backup bench's row, printed only in passing here).
pub struct Row {
    pub tool: &'static str,
    pub elapsed: Duration,
    pub stored_bytes: u64,
    pub peak_rss_kib: Option<u64>,
}

/// One recovery, timed.
pub struct Recovered {
    pub tool: String,
    pub base: Duration,
    pub total: Duration,
    /// Peak resident set of the recovering tool's own process: pgkube's instance manager.
    pub peak_rss_kib: Option<u64>,
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(bench());
}

async fn bench() {
    let Some(env) = pgkube_testkit::testbed() else {
        println!("recovery: test bed not running, nothing measured");
        return;
    };
    let scale = setting("PGKUBE_BENCH_RECOVERY_SCALE", DEFAULT_SCALE);
    let wal_mb = setting("PGKUBE_BENCH_RECOVERY_WAL_MB", DEFAULT_WAL_MB);
    let bucket = TestBucket::create(&env, "recovery-bench").await;
    let work = std::env::temp_dir().join(format!("pgkube-recovery-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("work dir");
    let source_dir = work.join("source");
    let (mut source, root, _proxy) = peers::pgkube(&env, &bucket, &source_dir)
        .await
        .expect("the instance manager starts");
    recover::keep_wal(&source_dir);
    let sql = source.connect().await;
    fill(&source, scale);
    let backup = tools::pgkube(&env, &bucket, &source, &work).await;
    println!(
        "recovery: pgkube's base backup took {:.1} s, {:.0} MB stored",
        backup.elapsed.as_secs_f64(),
        backup.stored_bytes as f64 / 1048576.0
    );
    let order = recover::order_of(&env, &bucket, &root).await;
    let pgbackrest = match recover::PgBackRest::back_up(&env, &bucket, &source, &work).await {
        Ok(pgbackrest) => Some(pgbackrest),
        Err(why) => {
            println!("pgbackrest: left out: {why}");
            None
        }
    };
    let written = recover::write_wal(&sql, wal_mb).await;
    let rows = recover::row_count(&sql).await;
    if let Some(pgbackrest) = &pgbackrest
        && let Err(why) = pgbackrest.push_wal(&source, &order.first_wal)
    {
        println!("pgbackrest: {why}");
    }
    source.stop();
    println!(
        "recovery: pgbench scale {scale}, then {:.0} MB of WAL after the backups ({rows} rows of random hex)",
        written as f64 / 1048576.0
    );

    let mut results = Vec::new();
    for prefetch in [recover::DEFAULT_PREFETCH, 0] {
        settle_disk();
        let done = recover::pgkube(&env, &order, &work, prefetch, rows).await;
        results.push(done);
    }
    if let Some(pgbackrest) = &pgbackrest {
        settle_disk();
        match pgbackrest.restore(&work, rows).await {
            Ok(done) => results.push(done),
            Err(why) => println!("pgbackrest: {why}"),
        }
    }
    print_rows(&results, written);
    bucket.cleanup().await;
    let _ = std::fs::remove_dir_all(&work);
}

/// Each recovery starts alike: nothing left to write back from the step before (the source's
/// gigabytes, the previous recovery), and no object of the store in the page cache.
fn settle_disk() {
    let synced = std::process::Command::new("sync").status();
    let dropped = std::fs::write("/proc/sys/vm/drop_caches", "3\n");
    if let (Ok(status), Ok(())) = (&synced, &dropped)
        && status.success()
    {
        return;
    }
    println!(
        "recovery: caches not dropped ({synced:?}, {dropped:?}): the first runs may be slower"
    );
}

/// A number from the environment, else `default`.
fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// `pgbench -i` at `scale`, then a checkpoint.
fn fill(server: &server::Server, scale: u32) {
    let status = server::as_postgres(&format!("{}/pgbench", server::BIN))
        .args(["-i", "-q", "-s", &scale.to_string(), "-h", "127.0.0.1"])
        .args(["-p", &server.port.to_string(), "-U", "postgres", "postgres"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("pgbench runs");
    assert!(status.success(), "pgbench -i: {status}");
}

fn print_rows(results: &[Recovered], wal_bytes: u64) {
    println!(
        "| recovery | base backup s | replay s | to a promoted primary s | replay MB of WAL/s | peak RSS MiB |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for result in results {
        let replay = result.total.saturating_sub(result.base).as_secs_f64();
        let rss = result.peak_rss_kib.map_or_else(
            || "-".to_owned(),
            |kib| format!("{:.1}", kib as f64 / 1024.0),
        );
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {rss} |",
            result.tool,
            result.base.as_secs_f64(),
            replay,
            result.total.as_secs_f64(),
            wal_bytes as f64 / 1048576.0 / replay.max(0.001),
        );
    }
}
