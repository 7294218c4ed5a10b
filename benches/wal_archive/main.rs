//! Benchmark of continuous WAL archiving: a burst of WAL archived to the test bed's Garage by
//! pgkube's instance manager, side by side with pgBackRest's asynchronous `archive-push`
//! (process-max 2, zstd) and Barman's `barman-cloud-wal-archive` (CloudNativePG's archiver).
//!
//! Not a test: it prints figures and asserts nothing. Needs the test bed (`tests/testbed/up`),
//! PostgreSQL 15 and root (the servers run as `postgres`); it installs the Debian packages
//! `pgbackrest` and `barman-cli-cloud` when they are missing, and leaves out a peer whose
//! package cannot be installed.
//!
//! ```text
//! cargo bench --bench wal_archive
//! PGKUBE_BENCH_WAL_MB=512 cargo bench --bench wal_archive   # a smaller burst
//! PGKUBE_BENCH_ARCHIVERS=pgkube cargo bench --bench wal_archive   # some of the archivers
//! PGKUBE_BENCH_WAL_BACKLOG=1 cargo bench --bench wal_archive   # a backlog drained
//! ```
//!
//! For each archiver, one after the other, on a fresh server and bucket prefix:
//! 1. the server starts with `archive_mode = on` and the archiver's `archive_command` (pgkube:
//!    `pgkube instance run`, which sets its own);
//! 2. a writer inserts rows of random hex (`md5(random()::text)` twice: about half of it
//!    compressible) in batches until `PGKUBE_BENCH_WAL_MB` (default 2048) of WAL is written;
//! 3. the lag at the end of the writes is the segments finished and not archived yet;
//! 4. then a `pg_switch_wal()`, and the wait until `pg_stat_archiver` reports the last segment.
//!
//! With `PGKUBE_BENCH_WAL_BACKLOG=1`, the store is unreachable while the WAL is written (every
//! archiver reaches it through a proxy the bench stops), so the whole burst waits in `pg_wal`;
//! the catch-up then measures how fast each archiver drains a backlog, whatever the writer's
//! speed. Without it, an archiver that keeps up is bounded by the writer.
//!
//! It prints, per archiver: the segments archived, the seconds from the first write to the
//! last segment archived, segments per second over that time, the lag at the end of the writes
//! and how long it took to catch up, the bytes stored (the objects under its prefix), and for
//! pgkube the instance manager's peak resident memory.

mod peers;
mod server;

use std::time::{Duration, Instant};

use pgkube_testkit::proxy::Proxy;
use pgkube_testkit::{TestBucket, list_objects};

use server::Server;

/// 16 MiB segments.
const SEGMENT_BYTES: u64 = 16 << 20;
const DEFAULT_WAL_MB: u64 = 2048;
/// Rows per INSERT: about 40 MB of WAL each.
const BATCH_ROWS: u64 = 200_000;
/// Longest wait for an archiver to catch up.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(1800);

/// What one archiver did.
struct Row {
    archiver: &'static str,
    segments: u64,
    total: Duration,
    lag_segments: u64,
    catch_up: Duration,
    stored_bytes: i64,
    /// pgkube's instance manager's peak resident set (the peers archive from other processes).
    peak_rss_kib: Option<u64>,
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(bench());
}

async fn bench() {
    let Some(env) = pgkube_testkit::testbed() else {
        println!("wal_archive: test bed not running, nothing measured");
        return;
    };
    let wal_mb = std::env::var("PGKUBE_BENCH_WAL_MB")
        .ok()
        .and_then(|mb| mb.parse().ok())
        .unwrap_or(DEFAULT_WAL_MB);
    let backlog = std::env::var("PGKUBE_BENCH_WAL_BACKLOG").is_ok_and(|value| value == "1");
    let chosen = std::env::var("PGKUBE_BENCH_ARCHIVERS")
        .unwrap_or_else(|_| "pgkube,pgbackrest,barman".to_owned());
    let bucket = TestBucket::create(&env, "wal-bench").await;
    let work = std::env::temp_dir().join(format!("pgkube-wal-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("work dir");
    println!(
        "wal_archive: {wal_mb} MB of WAL per archiver{}, bucket {}",
        if backlog {
            ", written while the store is down"
        } else {
            ""
        },
        bucket.name()
    );
    let mut rows = Vec::new();
    for archiver in chosen.split(',').map(str::trim) {
        let dir = work.join(archiver);
        let started = match archiver {
            "pgkube" => peers::pgkube(&env, &bucket, &dir).await,
            "pgbackrest" => peers::pgbackrest(&env, &bucket, &dir).await,
            "barman" => peers::barman(&env, &bucket, &dir).await,
            other => Err(format!("unknown archiver {other:?}")),
        };
        match started {
            Ok((server, prefix, store)) => {
                let stopped = backlog.then_some(store.as_ref());
                let row = measure(archiver_name(archiver), server, wal_mb << 20, stopped).await;
                let stored = stored_bytes(&bucket, &prefix).await;
                rows.push(Row {
                    stored_bytes: stored,
                    ..row
                });
            }
            Err(why) => println!("{archiver}: left out: {why}"),
        }
    }
    print_rows(&rows);
    bucket.cleanup().await;
    let _ = std::fs::remove_dir_all(&work);
}

fn archiver_name(name: &str) -> &'static str {
    match name {
        "pgkube" => "pgkube instance manager",
        "pgbackrest" => "pgbackrest archive-push (async, process-max 2, zst)",
        _ => "barman-cloud-wal-archive (gzip)",
    }
}

/// One archiver's burst; with `stopped`, the store is down until the writes are done.
async fn measure(
    archiver: &'static str,
    mut server: Server,
    wal_bytes: u64,
    stopped: Option<&Proxy>,
) -> Row {
    let sql = server.connect().await;
    sql.batch_execute("CREATE TABLE burst (id bigint, payload text)")
        .await
        .expect("table");
    let start_lsn = lsn(&sql, "SELECT pg_current_wal_lsn()").await;
    let start_archived = archived_count(&sql).await;
    if let Some(store) = stopped {
        store.stop_server();
    }
    let started = Instant::now();
    let mut next_id = 0u64;
    while lsn(&sql, "SELECT pg_current_wal_lsn()").await - start_lsn < wal_bytes {
        sql.execute(
            "INSERT INTO burst SELECT g, md5(random()::text) || md5(random()::text) \
             FROM generate_series($1::bigint, $1::bigint + $2::bigint - 1) g",
            &[&(next_id as i64), &(BATCH_ROWS as i64)],
        )
        .await
        .expect("insert");
        next_id += BATCH_ROWS;
    }
    let written = Instant::now();
    let end_lsn = lsn(&sql, "SELECT pg_current_wal_lsn()").await;
    let finished = end_lsn / SEGMENT_BYTES - start_lsn / SEGMENT_BYTES;
    let lag = finished.saturating_sub(archived_count(&sql).await - start_archived);
    let written = match stopped {
        Some(store) => {
            store.start_server();
            Instant::now()
        }
        None => written,
    };
    let last: String = sql
        .query_one("SELECT pg_walfile_name(pg_switch_wal())", &[])
        .await
        .expect("switch")
        .get(0);
    let deadline = Instant::now() + CATCH_UP_LIMIT;
    loop {
        let row = sql
            .query_one(
                "SELECT coalesce(last_archived_wal, ''), archived_count, failed_count \
                 FROM pg_stat_archiver",
                &[],
            )
            .await
            .expect("pg_stat_archiver");
        let archived: String = row.get(0);
        if archived.as_str() >= last.as_str() || Instant::now() > deadline {
            let failed: i64 = row.get(2);
            if failed > 0 {
                println!("{archiver}: {failed} failed archive_command calls (retried)");
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let done = Instant::now();
    let segments = archived_count(&sql).await.saturating_sub(start_archived);
    let peak_rss_kib = server
        .peak_rss_kib()
        .filter(|_| archiver.starts_with("pgkube"));
    server.stop();
    Row {
        archiver,
        segments,
        total: done - started,
        lag_segments: lag,
        catch_up: done - written,
        stored_bytes: 0,
        peak_rss_kib,
    }
}

async fn lsn(sql: &tokio_postgres::Client, query: &str) -> u64 {
    let text: String = sql
        .query_one(&format!("SELECT ({query})::text"), &[])
        .await
        .expect("an LSN")
        .get(0);
    let (high, low) = text.split_once('/').expect("an LSN");
    (u64::from_str_radix(high, 16).expect("hex") << 32) + u64::from_str_radix(low, 16).expect("hex")
}

async fn archived_count(sql: &tokio_postgres::Client) -> u64 {
    let count: i64 = sql
        .query_one("SELECT archived_count FROM pg_stat_archiver", &[])
        .await
        .map(|row| row.get(0))
        .unwrap_or(0);
    u64::try_from(count).unwrap_or(0)
}

async fn stored_bytes(bucket: &TestBucket, prefix: &str) -> i64 {
    list_objects(&bucket.client(), bucket.name(), prefix)
        .await
        .map(|objects| objects.values().sum())
        .unwrap_or(-1)
}

/// Segments a second while catching up, when there was a backlog worth timing.
fn catch_up_rate(row: &Row) -> String {
    if row.lag_segments < 10 {
        return "-".to_owned();
    }
    format!(
        "{:.2}",
        row.lag_segments as f64 / row.catch_up.as_secs_f64()
    )
}

fn print_rows(rows: &[Row]) {
    println!(
        "| archiver | segments | seconds | segments/s | lag at the end of the writes (segments) | catch-up s | catch-up segments/s | stored MB | stored / WAL | manager peak RSS MiB |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let seconds = row.total.as_secs_f64();
        let wal = (row.segments * SEGMENT_BYTES) as f64;
        let rss = row.peak_rss_kib.map_or_else(
            || "-".to_owned(),
            |kib| format!("{:.1}", kib as f64 / 1024.0),
        );
        println!(
            "| {} | {} | {:.1} | {:.2} | {} | {:.1} | {} | {:.1} | {:.3} | {rss} |",
            row.archiver,
            row.segments,
            seconds,
            row.segments as f64 / seconds,
            row.lag_segments,
            row.catch_up.as_secs_f64(),
            catch_up_rate(row),
            row.stored_bytes as f64 / f64::from(1u32 << 20),
            row.stored_bytes as f64 / wal.max(1.0),
        );
    }
}
