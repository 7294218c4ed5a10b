//! WAL in tests: segment names, the segments a WAL archive holds, and making a server finish
//! segments.

use std::collections::BTreeSet;

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
}
