//! How big each part of a multipart upload is.
//!
//! S3 takes at most 10,000 parts per object, each but the last at least 5 MiB and none above
//! 5 GiB, and objects up to 5 TiB. A dump streams from `pg_dump` without a known size, so the
//! part size cannot be chosen from the size up front. Instead it grows with the part count: the
//! first [`PARTS_PER_DOUBLING`] parts have the configured size (`--part-size-mib`, 8 MiB by
//! default), the next as many twice that, and so on, never above 5 GiB. Small dumps keep small
//! parts (and small buffers); a stream as large as S3 allows still fits in 10,000 parts from any
//! configured size (5 MiB parts reach 9.2 TiB, 8 MiB parts 11.9 TiB).
//!
//! Memory follows the part size: the upload holds at most `parts_in_flight + 1` part buffers,
//! none larger than the part being filled, so its bound is `(parts_in_flight + 1) x` the current
//! part size. With the defaults (8 MiB, 2 in flight) that is 24 MiB up to 7 GiB of dump, 48 MiB
//! up to 21 GiB, 96 MiB up to 49 GiB, 192 MiB up to 105 GiB, and 3 GiB by 1 TiB.

/// S3's smallest part (all but the last part of an upload).
pub const MIN_PART_SIZE: usize = 5 * 1024 * 1024;
/// S3's largest part.
pub const MAX_PART_SIZE: usize = 5 * 1024 * 1024 * 1024;
/// S3's most parts in one upload.
pub const MAX_PARTS: u32 = 10_000;
/// S3's largest object.
pub const MAX_OBJECT_SIZE: u64 = 5 * 1024 * 1024 * 1024 * 1024;
/// Parts after which the part size doubles. 1,000 would leave 5 MiB parts short of 5 TiB.
pub const PARTS_PER_DOUBLING: u32 = 900;

/// The part size of every part number of one upload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartSizes {
    first: usize,
    parts_per_doubling: u32,
}

impl PartSizes {
    /// Parts of `first` bytes (kept within S3's limits), doubling every [`PARTS_PER_DOUBLING`].
    pub fn new(first: usize) -> Self {
        Self {
            first: first.clamp(MIN_PART_SIZE, MAX_PART_SIZE),
            parts_per_doubling: PARTS_PER_DOUBLING,
        }
    }

    /// The same schedule, doubling every `parts` parts (at least 1) instead: lets a test see the
    /// part size grow without uploading gigabytes.
    pub fn doubling_every(self, parts: u32) -> Self {
        Self {
            parts_per_doubling: parts.max(1),
            ..self
        }
    }

    /// The size of the first parts.
    pub fn first(&self) -> usize {
        self.first
    }

    /// The size of part `part_number` (1-based, as S3 counts).
    pub fn size_of(&self, part_number: u32) -> usize {
        let mut doublings = part_number.saturating_sub(1) / self.parts_per_doubling;
        let mut size = self.first;
        while doublings > 0 && size < MAX_PART_SIZE {
            size = size.saturating_mul(2).min(MAX_PART_SIZE);
            doublings -= 1;
        }
        size
    }

    /// How many bytes the first `parts` parts hold together.
    pub fn capacity(&self, parts: u32) -> u64 {
        (1..=parts)
            .map(|part_number| self.size_of(part_number) as u64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1024 * 1024;

    #[test]
    fn the_part_size_doubles_every_900_parts() {
        let sizes = PartSizes::new(8 * MIB);
        assert_eq!(sizes.size_of(1), 8 * MIB);
        assert_eq!(sizes.size_of(900), 8 * MIB);
        assert_eq!(sizes.size_of(901), 16 * MIB);
        assert_eq!(sizes.size_of(1800), 16 * MIB);
        assert_eq!(sizes.size_of(1801), 32 * MIB);
        assert_eq!(sizes.size_of(8101), 4096 * MIB);
        assert_eq!(sizes.size_of(9001), MAX_PART_SIZE, "capped at 5 GiB");
        assert_eq!(sizes.size_of(MAX_PARTS), MAX_PART_SIZE);
    }

    #[test]
    fn every_configurable_size_reaches_5_tib_within_10000_parts() {
        for mib in [5, 6, 8, 16, 64, 100, 1024, 4096] {
            let sizes = PartSizes::new(mib * MIB);
            assert!(
                sizes.capacity(MAX_PARTS) >= MAX_OBJECT_SIZE,
                "{mib} MiB parts hold only {} bytes",
                sizes.capacity(MAX_PARTS)
            );
        }
        // The margin of the smallest parts, which the doubling interval was chosen for.
        let smallest = PartSizes::new(MIN_PART_SIZE).capacity(MAX_PARTS);
        assert!(smallest > MAX_OBJECT_SIZE * 18 / 10, "{smallest}");
    }

    #[test]
    fn every_part_is_within_s3_limits() {
        for first in [0, MIN_PART_SIZE, 8 * MIB, 4096 * MIB, 6 * 1024 * MIB] {
            let sizes = PartSizes::new(first);
            for part_number in 1..=MAX_PARTS {
                let size = sizes.size_of(part_number);
                assert!(size >= MIN_PART_SIZE, "part {part_number}: {size}");
                assert!(size <= MAX_PART_SIZE, "part {part_number}: {size}");
            }
        }
    }

    #[test]
    fn part_sizes_never_shrink() {
        let sizes = PartSizes::new(7 * MIB).doubling_every(3);
        let all: Vec<usize> = (1..=200).map(|n| sizes.size_of(n)).collect();
        assert!(all.windows(2).all(|pair| pair[0] <= pair[1]));
        assert_eq!(
            &all[..7],
            &[
                7 * MIB,
                7 * MIB,
                7 * MIB,
                14 * MIB,
                14 * MIB,
                14 * MIB,
                28 * MIB
            ]
        );
    }

    #[test]
    fn the_memory_bound_of_the_defaults_as_documented() {
        // (parts in flight + 1) x the part size reached at a given stream size.
        let sizes = PartSizes::new(8 * MIB);
        let part_at = |bytes: u64| {
            let mut sent = 0;
            (1..=MAX_PARTS).map(|n| sizes.size_of(n)).find(|&size| {
                sent += size as u64;
                sent >= bytes
            })
        };
        const GIB: u64 = 1024 * 1024 * 1024;
        assert_eq!(part_at(7 * GIB), Some(8 * MIB));
        assert_eq!(part_at(21 * GIB), Some(16 * MIB));
        assert_eq!(part_at(49 * GIB), Some(32 * MIB));
        assert_eq!(part_at(105 * GIB), Some(64 * MIB));
        assert_eq!(part_at(1024 * GIB), Some(1024 * MIB));
    }
}
