//! Reading a few files out of a tar stream as it passes on its way to storage (pure, no I/O of
//! its own).
//!
//! `pg_basebackup -Ft -D -` writes the data directory as one tar on stdout, with its
//! `backup_label`, `tablespace_map` (when there is one) and `backup_manifest` inside. The agent
//! stores those files as objects of their own too, and reads the WAL range from the manifest, so
//! a [`TarScanner`] follows the tar's headers over the bytes the compressor reads ([`TarTap`])
//! and keeps the members it is asked for, up to a size limit each. Nothing else is kept, so the
//! memory is the same whatever the size of the database.
//!
//! Headers are ustar (`pg_basebackup`'s own writer): name and prefix, size in octal or, above
//! 8 GiB, base-256. Other headers (pax, GNU long names) are skipped by their size like any
//! member.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::sync::{Arc, Mutex, PoisonError};

const BLOCK: usize = 512;

/// Follows a tar stream and keeps the regular files named in `wanted`.
#[derive(Debug)]
pub struct TarScanner {
    wanted: &'static [&'static str],
    limit: usize,
    header: Vec<u8>,
    /// Bytes of the current member's data still to come, then its padding.
    data_left: u64,
    padding_left: u64,
    /// The member being kept, if the current one is wanted.
    keeping: Option<&'static str>,
    kept: BTreeMap<&'static str, Vec<u8>>,
    zero_blocks: u8,
    error: Option<String>,
}

impl TarScanner {
    /// A scanner that keeps the members named in `wanted` (top-level names, as in the tar), each
    /// up to `limit` bytes: a larger one is an error.
    pub fn new(wanted: &'static [&'static str], limit: usize) -> Self {
        Self {
            wanted,
            limit,
            header: Vec::with_capacity(BLOCK),
            data_left: 0,
            padding_left: 0,
            keeping: None,
            kept: BTreeMap::new(),
            zero_blocks: 0,
            error: None,
        }
    }

    /// Takes the next bytes of the stream.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && self.error.is_none() {
            if self.data_left > 0 {
                let take = usize::try_from(self.data_left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                if let Some(name) = self.keeping {
                    self.kept.entry(name).or_default().extend(&bytes[..take]);
                }
                self.data_left -= take as u64;
                bytes = &bytes[take..];
            } else if self.padding_left > 0 {
                let take = usize::try_from(self.padding_left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                self.padding_left -= take as u64;
                bytes = &bytes[take..];
            } else {
                let take = (BLOCK - self.header.len()).min(bytes.len());
                self.header.extend(&bytes[..take]);
                bytes = &bytes[take..];
                if self.header.len() == BLOCK {
                    let header = std::mem::take(&mut self.header);
                    self.read_header(&header);
                }
            }
        }
    }

    fn read_header(&mut self, header: &[u8]) {
        self.keeping = None;
        if header.iter().all(|byte| *byte == 0) {
            self.zero_blocks = self.zero_blocks.saturating_add(1);
            return;
        }
        let Some(size) = member_size(header) else {
            self.error = Some(format!(
                "a tar header has an unreadable size after {} kept member(s)",
                self.kept.len()
            ));
            return;
        };
        let name = member_name(header);
        let regular = matches!(header[156], b'0' | 0);
        if regular && let Some(wanted) = self.wanted.iter().find(|wanted| **wanted == name) {
            if size > self.limit as u64 {
                self.error = Some(format!(
                    "{name} holds {size} bytes, more than the {} this agent keeps",
                    self.limit
                ));
                return;
            }
            self.keeping = Some(wanted);
            self.kept.insert(wanted, Vec::new());
        }
        self.data_left = size;
        self.padding_left = (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64;
    }

    /// The kept files by name, once the stream ended with the tar's end-of-archive blocks; an
    /// error if the stream was not a whole tar.
    pub fn finish(self) -> Result<BTreeMap<&'static str, Vec<u8>>, String> {
        if let Some(error) = self.error {
            return Err(error);
        }
        if self.zero_blocks < 2 || self.data_left > 0 || !self.header.is_empty() {
            return Err("the tar stream ended before its end-of-archive blocks".to_owned());
        }
        Ok(self.kept)
    }
}

/// `prefix/name` of a ustar header, or the name alone.
fn member_name(header: &[u8]) -> String {
    let field = |range: std::ops::Range<usize>| {
        let bytes = &header[range];
        let end = bytes
            .iter()
            .position(|byte| *byte == 0)
            .unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    };
    let name = field(0..100);
    let prefix = if &header[257..262] == b"ustar" {
        field(345..500)
    } else {
        String::new()
    };
    let joined = if prefix.is_empty() {
        name
    } else {
        format!("{prefix}/{name}")
    };
    joined.trim_start_matches("./").to_owned()
}

/// The size field: octal digits, or base-256 (high bit of the first byte set) for large files.
fn member_size(header: &[u8]) -> Option<u64> {
    let field = &header[124..136];
    if field[0] & 0x80 != 0 {
        return field[1..]
            .iter()
            .try_fold(u64::from(field[0] & 0x7f), |size, byte| {
                size.checked_mul(256)?.checked_add(u64::from(*byte))
            });
    }
    let text = std::str::from_utf8(field).ok()?;
    let digits = text.trim_matches(|c: char| c == '\0' || c == ' ');
    if digits.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(digits, 8).ok()
}

/// A reader that hands every byte it reads to a shared [`TarScanner`] on the way.
pub struct TarTap<R> {
    inner: R,
    scanner: Arc<Mutex<TarScanner>>,
}

impl<R: Read> TarTap<R> {
    pub fn new(inner: R, scanner: Arc<Mutex<TarScanner>>) -> Self {
        Self { inner, scanner }
    }
}

impl<R: Read> Read for TarTap<R> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buffer)?;
        self.scanner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .feed(&buffer[..read]);
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ustar archive of the given files, as `pg_basebackup` lays it out (header, data padded
    /// to 512 bytes, two zero blocks at the end).
    fn archive(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for (name, content) in files {
            let mut header = [0u8; BLOCK];
            header[..name.len()].copy_from_slice(name.as_bytes());
            header[100..108].copy_from_slice(b"0000600\0");
            let size = format!("{:011o}\0", content.len());
            header[124..136].copy_from_slice(size.as_bytes());
            header[156] = b'0';
            header[257..263].copy_from_slice(b"ustar\0");
            header[263..265].copy_from_slice(b"00");
            bytes.extend(header);
            bytes.extend(*content);
            bytes.resize(bytes.len().div_ceil(BLOCK) * BLOCK, 0);
        }
        bytes.resize(bytes.len() + 2 * BLOCK, 0);
        bytes
    }

    const WANTED: &[&str] = &["backup_label", "backup_manifest"];

    #[test]
    fn the_wanted_files_are_kept_whatever_the_chunks_the_stream_comes_in() {
        let big = vec![7u8; 5000];
        let manifest = br#"{"WAL-Ranges": []}"#;
        let bytes = archive(&[
            ("backup_label", b"START WAL LOCATION: 0/2000028\n"),
            ("base/1/1259", &big),
            ("global/backup_label", b"not this one"),
            ("backup_manifest", manifest),
        ]);
        for chunk in [1, 7, 511, 512, 513, 100_000] {
            let mut scanner = TarScanner::new(WANTED, 1024);
            for piece in bytes.chunks(chunk) {
                scanner.feed(piece);
            }
            let kept = scanner.finish().expect("a whole tar");
            assert_eq!(kept.len(), 2, "chunks of {chunk}");
            assert_eq!(kept["backup_label"], b"START WAL LOCATION: 0/2000028\n");
            assert_eq!(kept["backup_manifest"], manifest);
        }
    }

    #[test]
    fn a_truncated_stream_or_a_file_over_the_limit_is_an_error() {
        let bytes = archive(&[("backup_label", b"label"), ("base/1/1", &[1u8; 2000])]);
        let mut scanner = TarScanner::new(WANTED, 1024);
        scanner.feed(&bytes[..bytes.len() - 1024]);
        assert!(scanner.finish().is_err(), "no end-of-archive blocks");
        let mut scanner = TarScanner::new(WANTED, 4);
        scanner.feed(&bytes);
        let error = scanner.finish().expect_err("over the limit");
        assert!(error.contains("backup_label holds 5 bytes"), "{error}");
    }

    #[test]
    fn the_tap_passes_every_byte_through() {
        let bytes = archive(&[("backup_label", b"label")]);
        let scanner = Arc::new(Mutex::new(TarScanner::new(WANTED, 1024)));
        let mut out = Vec::new();
        TarTap::new(&bytes[..], scanner.clone())
            .read_to_end(&mut out)
            .expect("reads");
        assert_eq!(out, bytes);
        let scanner = Arc::try_unwrap(scanner).expect("one owner");
        let kept = scanner
            .into_inner()
            .expect("not poisoned")
            .finish()
            .expect("whole");
        assert_eq!(kept["backup_label"], b"label");
    }

    #[test]
    fn sizes_are_read_in_octal_and_base_256() {
        let mut header = [0u8; BLOCK];
        header[124..136].copy_from_slice(b"00000001750\0");
        assert_eq!(member_size(&header), Some(0o1750));
        let mut large = [0u8; BLOCK];
        large[124] = 0x80;
        large[131..136].copy_from_slice(&[0x02, 0x00, 0x00, 0x00, 0x01]);
        assert_eq!(member_size(&large), Some((2u64 << 32) + 1));
    }
}
