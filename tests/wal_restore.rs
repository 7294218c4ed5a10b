//! The WAL a recovering server asks for, served from an archive in the real Garage by the
//! instance manager's restorer: files found are put in place as archived and the next segments
//! fetched ahead; a file the archive lacks at its end is "missing" (the end of the archive);
//! a gap, a corrupt file or a missing history file is an error naming the object, never
//! "missing" (PostgreSQL would end the recovery early there and promote).

use std::path::Path;

use bytes::Bytes;
use pgkube::instance::recover::fetch::Restorer;
use pgkube_controllers::storage::S3Bucket;
use pgkube_controllers::storage::wal::{PreparedFile, WalFileName, store_file};
use pgkube_testkit::TestBucket;
use sha2::{Digest, Sha256};

const ROOT: &str = "ns/old/wal/old/";

/// Stores `content` as the WAL file `name`, as the archiver does (zstd, with the SHA-256 and
/// size of the original); `recorded` replaces the SHA-256 recorded with it.
async fn archive(bucket: &S3Bucket, name: &str, content: &[u8], recorded: Option<&str>) {
    let file = WalFileName::parse(name).expect("a WAL file name");
    let prepared = PreparedFile {
        compressed: Bytes::from(zstd::encode_all(content, 3).expect("zstd")),
        sha256: recorded.map_or_else(|| hex::encode(Sha256::digest(content)), str::to_owned),
        size: content.len() as u64,
    };
    store_file(bucket, &file.key(ROOT), &prepared)
        .await
        .expect("stored");
}

fn segment(fill: u8) -> Vec<u8> {
    vec![fill; 64 * 1024]
}

#[tokio::test]
async fn the_restorer_serves_what_was_archived_and_refuses_gaps_corruption_and_missing_histories() {
    let Some(env) = pgkube_testkit::testbed() else {
        return;
    };
    let test_bucket = TestBucket::create(&env, "wal-restore").await;
    let bucket = S3Bucket::with_client(test_bucket.client(), test_bucket.name());
    for (name, fill) in [
        ("000000010000000000000001", 1),
        ("000000010000000000000002", 2),
        ("000000010000000000000003", 3),
        ("000000010000000000000005", 5),
    ] {
        archive(&bucket, name, &segment(fill), None).await;
    }
    archive(
        &bucket,
        "000000010000000000000006",
        &segment(6),
        Some(&"0".repeat(64)),
    )
    .await;
    archive(&bucket, "000000020000000000000007", &segment(7), None).await;
    let dir = tempfile::tempdir().expect("a directory");
    let spool = dir.path().join("spool");
    std::fs::create_dir(&spool).expect("spool");
    let restorer = Restorer::new(bucket, ROOT, &spool, 2);
    let destination = dir.path().join("RECOVERYXLOG");

    let found = restorer
        .restore("000000010000000000000001", &destination)
        .await;
    assert_eq!(found, Ok(true));
    assert_eq!(std::fs::read(&destination).expect("restored"), segment(1));
    wait_spooled(&spool, "000000010000000000000002").await;
    let found = restorer
        .restore("000000010000000000000002", &destination)
        .await;
    assert_eq!(found, Ok(true));
    assert_eq!(std::fs::read(&destination).expect("restored"), segment(2));
    assert!(
        !spool.join("000000010000000000000002").exists(),
        "moved, not copied"
    );

    let gap = restorer
        .restore("000000010000000000000004", &destination)
        .await
        .expect_err("a gap");
    assert!(
        gap.contains("gap") && gap.contains("ns/old/wal/old/00000001/000000010000000000000004.zst"),
        "{gap}"
    );
    let corrupt = restorer
        .restore("000000010000000000000006", &destination)
        .await
        .expect_err("corrupt");
    assert!(
        corrupt.contains("000000010000000000000006.zst is corrupt"),
        "{corrupt}"
    );
    let history = restorer
        .restore("00000002.history", &destination)
        .await
        .expect_err("a missing history file");
    assert!(
        history.contains("00000002.history.zst is missing"),
        "{history}"
    );

    // The end of the archive, and timelines probed that do not exist: missing, not errors.
    let end = restorer
        .restore("000000020000000000000008", &destination)
        .await;
    assert_eq!(end, Ok(false));
    assert_eq!(
        restorer.restore("00000001.history", &destination).await,
        Ok(false)
    );
    assert_eq!(
        restorer.restore("00000003.history", &destination).await,
        Ok(false)
    );
    assert!(
        restorer
            .restore("../../etc/passwd", &destination)
            .await
            .is_err()
    );
    test_bucket.cleanup().await;
}

/// Waits until the segment fetched ahead is in the spool.
async fn wait_spooled(spool: &Path, name: &str) {
    pgkube_testkit::wait_until(
        "the segment is fetched ahead",
        std::time::Duration::from_secs(30),
        || async { Ok(spool.join(name).exists().then_some(())) },
    )
    .await
    .expect("fetched ahead");
}
