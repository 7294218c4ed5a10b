//! The files of one upload, and what `pg_wal` holds: reading a WAL file and preparing it for
//! the store (its SHA-256, and its zstd compression, off the async threads), the files
//! PostgreSQL marked ready, and how much room WAL takes on the volume.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use pgkube_controllers::storage::wal::{PreparedFile, WalFileName};
use sha2::{Digest, Sha256};

/// zstd's level for WAL: fast, and most of a segment written by a busy server compresses well
/// at any level; a segment switched early by `archive_timeout` is mostly zeros.
const ZSTD_LEVEL: i32 = 3;

/// Bytes read from a WAL file at a time: memory holds the compressed file and this, never the
/// whole original.
const READ_CHUNK: usize = 256 << 10;

/// Reads `path` and prepares it: compressed, with the SHA-256 and size of the original.
pub async fn prepare(path: PathBuf) -> Result<PreparedFile, String> {
    tokio::task::spawn_blocking(move || {
        compress_file(&path).map_err(|error| format!("cannot prepare {}: {error}", path.display()))
    })
    .await
    .map_err(|error| format!("the compression task failed: {error}"))?
}

/// The file streamed through SHA-256 and zstd. The size PostgreSQL gave the file is pledged in
/// the zstd frame, so a file that changes size while it is read is an error.
fn compress_file(path: &Path) -> std::io::Result<PreparedFile> {
    let mut file = std::fs::File::open(path)?;
    let size = file.metadata()?.len();
    let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), ZSTD_LEVEL)?;
    encoder.include_contentsize(true)?;
    encoder.set_pledged_src_size(Some(size))?;
    let mut hasher = Sha256::new();
    let mut chunk = vec![0u8; READ_CHUNK];
    loop {
        let read = file.read(&mut chunk)?;
        if read == 0 {
            break;
        }
        hasher.update(&chunk[..read]);
        encoder.write_all(&chunk[..read])?;
    }
    let mut compressed = encoder.finish()?;
    // The buffer grew by doubling: what is kept until the upload ends is only the file.
    compressed.shrink_to_fit();
    Ok(PreparedFile {
        compressed: compressed.into(),
        sha256: hex::encode(hasher.finalize()),
        size,
    })
}

/// The first `limit` WAL files PostgreSQL marked ready to archive, oldest name first.
pub fn ready_files(pgdata: &Path, limit: usize) -> std::io::Result<Vec<WalFileName>> {
    let mut ready: Vec<WalFileName> = ready_names(pgdata)?
        .iter()
        .filter_map(|name| WalFileName::parse(name))
        .collect();
    // Timeline history files first, as PostgreSQL archives them: a restore needs them first.
    ready.sort_by_key(|file| (!file.name.ends_with(".history"), file.name.clone()));
    ready.truncate(limit);
    Ok(ready)
}

fn ready_names(pgdata: &Path) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(pgdata.join("pg_wal").join("archive_status"))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(file) = name.strip_suffix(".ready") {
            names.push(file.to_owned());
        }
    }
    Ok(names)
}

/// How much WAL waits, and how much room it takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalUsage {
    /// Files marked ready and not archived yet.
    pub waiting: Option<u64>,
    /// Bytes of the files in `pg_wal`.
    pub wal_bytes: Option<u64>,
    /// Size of the volume that holds `pg_wal`, and the bytes left on it.
    pub volume_bytes: Option<u64>,
    pub available_bytes: Option<u64>,
}

/// `pg_wal` now. A part that cannot be read is left out.
pub fn wal_usage(pgdata: &Path) -> WalUsage {
    let pg_wal = pgdata.join("pg_wal");
    let wal_bytes = std::fs::read_dir(&pg_wal).ok().map(|entries| {
        entries
            .filter_map(Result::ok)
            .filter_map(|entry| entry.metadata().ok())
            .filter(|metadata| metadata.is_file())
            .map(|metadata| metadata.len())
            .sum()
    });
    let volume = nix::sys::statvfs::statvfs(&pg_wal).ok();
    let fragment = |count: u64| volume.map(|v| count.saturating_mul(v.fragment_size()));
    WalUsage {
        waiting: ready_names(pgdata).ok().map(|names| names.len() as u64),
        wal_bytes,
        volume_bytes: volume.and_then(|v| fragment(v.blocks())),
        available_bytes: volume.and_then(|v| fragment(v.blocks_available())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_prepared_file_decompresses_to_the_original_and_names_its_digest() {
        let dir = tempfile::tempdir().expect("a directory");
        let path = dir.path().join("000000010000000000000001");
        let content: Vec<u8> = (0..1_000_000u32).map(|i| (i % 7) as u8).collect();
        std::fs::write(&path, &content).expect("written");
        let prepared = prepare(path).await.expect("prepared");
        assert_eq!(prepared.size, 1_000_000);
        assert_eq!(prepared.sha256, hex::encode(Sha256::digest(&content)));
        assert!(prepared.compressed.len() < content.len() / 10);
        let back = zstd::bulk::decompress(&prepared.compressed, content.len()).expect("zstd");
        assert_eq!(back, content);
    }

    #[test]
    fn ready_files_come_history_first_then_by_name_and_the_usage_counts_them() {
        let dir = tempfile::tempdir().expect("a directory");
        let status = dir.path().join("pg_wal/archive_status");
        std::fs::create_dir_all(&status).expect("made");
        for name in [
            "000000020000000000000004.ready",
            "000000010000000000000003.done",
            "00000002.history.ready",
            "000000010000000000000003.partial.ready",
            "not-wal.ready",
        ] {
            std::fs::write(status.join(name), b"").expect("written");
        }
        std::fs::write(
            dir.path().join("pg_wal/000000020000000000000004"),
            [0u8; 100],
        )
        .expect("written");
        let names: Vec<String> = ready_files(dir.path(), 10)
            .expect("listed")
            .into_iter()
            .map(|file| file.name)
            .collect();
        assert_eq!(
            names,
            [
                "00000002.history",
                "000000010000000000000003.partial",
                "000000020000000000000004"
            ]
        );
        assert_eq!(ready_files(dir.path(), 1).expect("listed").len(), 1);
        let usage = wal_usage(dir.path());
        assert_eq!(usage.waiting, Some(4));
        assert_eq!(usage.wal_bytes, Some(100));
        assert!(usage.volume_bytes.is_some_and(|bytes| bytes > 0));
    }
}
