//! The WAL a base backup needs (pure): the ranges PostgreSQL's `backup_manifest` lists
//! (`WAL-Ranges`: timeline, start and end LSN), and the names of the WAL segments that hold them.
//!
//! A range from `start` to `end` needs the segment holding `start` up to the segment holding the
//! byte before `end` (PostgreSQL's `XLByteToPrevSeg`, as `pg_backup_stop` waits for): a backup
//! that ends exactly on a segment boundary needs nothing of the next segment.

use serde::Deserialize;

pub use pgkube_controllers::storage::lsn::{Lsn, segment_name};

/// One `WAL-Ranges` entry of a `backup_manifest`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalRange {
    pub timeline: u32,
    pub start: Lsn,
    pub end: Lsn,
}

#[derive(Deserialize)]
struct BackupManifest {
    #[serde(rename = "WAL-Ranges")]
    wal_ranges: Vec<ListedRange>,
}

#[derive(Deserialize)]
struct ListedRange {
    #[serde(rename = "Timeline")]
    timeline: u32,
    #[serde(rename = "Start-LSN")]
    start: String,
    #[serde(rename = "End-LSN")]
    end: String,
}

/// The WAL ranges of a `backup_manifest`, oldest first (PostgreSQL lists the newest timeline
/// first). Other fields, the file list included, are skipped unread.
pub fn ranges_of_manifest(bytes: &[u8]) -> Result<Vec<WalRange>, String> {
    let manifest: BackupManifest = serde_json::from_slice(bytes)
        .map_err(|error| format!("backup_manifest is not readable: {error}"))?;
    let mut ranges = manifest
        .wal_ranges
        .into_iter()
        .map(|range| {
            let lsn = |text: &str| {
                Lsn::parse(text).ok_or_else(|| format!("backup_manifest has a bad LSN {text:?}"))
            };
            Ok(WalRange {
                timeline: range.timeline,
                start: lsn(&range.start)?,
                end: lsn(&range.end)?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    if ranges.is_empty() || ranges.iter().any(|range| range.end < range.start) {
        return Err("backup_manifest lists no usable WAL range".to_owned());
    }
    ranges.sort_by_key(|range| range.start);
    Ok(ranges)
}

/// Every segment the ranges need, in order, each on its range's timeline.
pub fn needed_segments(ranges: &[WalRange], segment_size: u64) -> Vec<String> {
    ranges
        .iter()
        .flat_map(|range| {
            let first = range.start.0 / segment_size;
            let last = range.end.0.saturating_sub(1) / segment_size;
            (first..=last.max(first))
                .map(move |segment| segment_name(range.timeline, segment, segment_size))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIXTEEN_MIB: u64 = 16 * 1024 * 1024;

    #[test]
    fn lsns_read_and_print_as_postgresql_writes_them() {
        let lsn = Lsn::parse("1A/2000028").expect("an LSN");
        assert_eq!(lsn.0, (0x1A << 32) | 0x2000028);
        assert_eq!(lsn.to_string(), "1A/2000028");
        assert_eq!(Lsn::parse("2000028"), None);
        assert_eq!(Lsn::parse("0/xyz"), None);
    }

    #[test]
    fn segment_names_follow_the_lsn_and_the_timeline() {
        assert_eq!(
            segment_name(1, 0x2000028 / SIXTEEN_MIB, SIXTEEN_MIB),
            "000000010000000000000002"
        );
        let lsn = Lsn::parse("1A/FF000000").expect("an LSN");
        assert_eq!(
            segment_name(3, lsn.0 / SIXTEEN_MIB, SIXTEEN_MIB),
            "000000030000001A000000FF"
        );
        assert_eq!(
            segment_name(1, 0x100, 64 * 1024 * 1024),
            "000000010000000400000000"
        );
    }

    #[test]
    fn a_backup_needs_the_segments_from_its_start_to_the_byte_before_its_end() {
        let manifest = br#"{"PostgreSQL-Backup-Manifest-Version": 1, "Files": [{"Path": "x"}],
            "WAL-Ranges": [
                {"Timeline": 2, "Start-LSN": "0/5000000", "End-LSN": "0/7000000"},
                {"Timeline": 1, "Start-LSN": "0/3FFFFF0", "End-LSN": "0/5000000"}
            ], "Manifest-Checksum": "00"}"#;
        let ranges = ranges_of_manifest(manifest).expect("ranges");
        assert_eq!(ranges[0].timeline, 1, "oldest first");
        assert_eq!(
            needed_segments(&ranges, SIXTEEN_MIB),
            [
                "000000010000000000000003",
                "000000010000000000000004",
                "000000020000000000000005",
                "000000020000000000000006",
            ]
        );
        let one = br#"{"WAL-Ranges": [{"Timeline": 1, "Start-LSN": "0/2000028", "End-LSN": "0/2000100"}]}"#;
        let ranges = ranges_of_manifest(one).expect("ranges");
        assert_eq!(
            needed_segments(&ranges, SIXTEEN_MIB),
            ["000000010000000000000002"]
        );
    }

    #[test]
    fn a_manifest_without_ranges_or_with_bad_lsns_is_refused() {
        for bad in [
            &br#"{"WAL-Ranges": []}"#[..],
            br#"{"WAL-Ranges": [{"Timeline": 1, "Start-LSN": "zz", "End-LSN": "0/1"}]}"#,
            br#"{"WAL-Ranges": [{"Timeline": 1, "Start-LSN": "0/9", "End-LSN": "0/1"}]}"#,
            b"not json",
        ] {
            assert!(ranges_of_manifest(bad).is_err());
        }
    }
}
