//! WAL in tests: segment names, the segments a WAL archive holds, and making a server finish
//! segments.

use std::collections::BTreeSet;
use std::time::Duration;

/// Segments of 16 MiB (PostgreSQL's default): 256 to a log file.
const SEGMENTS_PER_LOG: u64 = 0x100;

/// The name of segment `number` (counted from 0) of `timeline`.
pub fn segment_name(timeline: u32, number: u64) -> String {
    format!(
        "{timeline:08X}{:08X}{:08X}",
        number / SEGMENTS_PER_LOG,
        number % SEGMENTS_PER_LOG
    )
}

/// The number of a segment name (`None` for anything else).
pub fn segment_number(name: &str) -> Option<u64> {
    if name.len() != 24 {
        return None;
    }
    let log = u64::from_str_radix(&name[8..16], 16).ok()?;
    let segment = u64::from_str_radix(&name[16..24], 16).ok()?;
    Some(log * SEGMENTS_PER_LOG + segment)
}

/// The WAL file names stored under `root` (`<root><timeline>/<name>.zst`).
pub async fn archived_files(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    root: &str,
) -> anyhow::Result<BTreeSet<String>> {
    let objects = crate::list_objects(s3, bucket, root).await?;
    Ok(objects
        .keys()
        .filter_map(|key| {
            key.strip_prefix(root)?
                .split_once('/')?
                .1
                .strip_suffix(".zst")
        })
        .map(str::to_owned)
        .collect())
}

/// Writes a little and switches to a new segment `count` times; returns the name of the last
/// segment finished.
pub async fn finish_segments(sql: &tokio_postgres::Client, count: u32) -> anyhow::Result<String> {
    sql.batch_execute("CREATE TABLE IF NOT EXISTS wal_burst (id serial, at timestamptz)")
        .await?;
    let mut last = String::new();
    for _ in 0..count {
        let row = sql
            .query_one(
                "WITH w AS (INSERT INTO wal_burst (at) VALUES (now()) RETURNING id) \
                 SELECT pg_walfile_name(pg_switch_wal()) FROM w",
                &[],
            )
            .await?;
        last = row.get(0);
    }
    Ok(last)
}

/// Waits until the server says it archived `segment` or a later one.
///
/// Uploads run in parallel, so a later segment can be in the store before an earlier one; only
/// the server's own record says that everything up to a segment is stored.
pub async fn wait_archived_through(
    sql: &tokio_postgres::Client,
    segment: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let description = format!("the server archived {segment}");
    crate::wait_until(&description, timeout, || async {
        let row = sql
            .query_one("SELECT last_archived_wal FROM pg_stat_archiver", &[])
            .await?;
        let last: Option<String> = row.get(0);
        Ok(last
            .as_deref()
            .and_then(archived_segment)
            .filter(|archived| *archived >= segment)
            .map(|_| ()))
    })
    .await
}

/// The segment an archived file name stands for: `None` for history files.
fn archived_segment(file: &str) -> Option<&str> {
    let segment = file.get(..24)?;
    segment_number(segment).map(|_| segment)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_and_numbers_round_trip() {
        assert_eq!(segment_name(1, 1), "000000010000000000000001");
        assert_eq!(segment_name(2, 0x1FF), "0000000200000001000000FF");
        assert_eq!(segment_number("0000000200000001000000FF"), Some(0x1FF));
        assert_eq!(segment_number("00000002.history"), None);
    }

    #[test]
    fn partial_segments_count_and_history_files_do_not() {
        assert_eq!(
            archived_segment("000000010000000000000005.partial"),
            Some("000000010000000000000005")
        );
        assert_eq!(archived_segment("00000002.history"), None);
    }
}
