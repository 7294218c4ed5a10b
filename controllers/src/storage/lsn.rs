//! WAL locations and segment names, as PostgreSQL writes them (pure).

use std::fmt;

/// A WAL location, as PostgreSQL writes it: `0/2000028` (two hexadecimal halves).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    pub fn parse(text: &str) -> Option<Self> {
        let (high, low) = text.trim().split_once('/')?;
        let high = u32::from_str_radix(high, 16).ok()?;
        let low = u32::from_str_radix(low, 16).ok()?;
        Some(Self((u64::from(high) << 32) | u64::from(low)))
    }

    /// The number of the segment holding this location.
    pub fn segment(self, segment_size: u64) -> u64 {
        self.0 / segment_size
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// The file name of segment `segment` of `timeline` (`000000010000000A000000FF`).
pub fn segment_name(timeline: u32, segment: u64, segment_size: u64) -> String {
    let per_id = 0x1_0000_0000 / segment_size;
    format!(
        "{timeline:08X}{:08X}{:08X}",
        segment / per_id,
        segment % per_id
    )
}

/// The timeline and segment number of a segment's file name (`None` for anything else).
pub fn parse_segment_name(name: &str, segment_size: u64) -> Option<(u32, u64)> {
    if name.len() != 24 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let timeline = u32::from_str_radix(&name[..8], 16).ok()?;
    let log = u64::from_str_radix(&name[8..16], 16).ok()?;
    let seg = u64::from_str_radix(&name[16..], 16).ok()?;
    let per_id = 0x1_0000_0000 / segment_size;
    (seg < per_id).then_some((timeline, log * per_id + seg))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIXTEEN_MIB: u64 = 16 * 1024 * 1024;

    #[test]
    fn segment_names_read_back_as_they_were_made() {
        let name = segment_name(3, 0x1AFF, SIXTEEN_MIB);
        assert_eq!(name, "000000030000001A000000FF");
        assert_eq!(parse_segment_name(&name, SIXTEEN_MIB), Some((3, 0x1AFF)));
        assert_eq!(
            parse_segment_name("00000003000000010000FFFF", SIXTEEN_MIB),
            None
        );
        assert_eq!(parse_segment_name("00000002.history", SIXTEEN_MIB), None);
        let lsn = Lsn::parse("1A/FF000010").expect("an LSN");
        assert_eq!(lsn.segment(SIXTEEN_MIB), 0x1AFF);
    }
}
