//! A base backup into a directory: `base.tar.zst` read with several ranged GETs at once, its
//! stored bytes checked against the manifest's SHA-256 and size, decoded and unpacked on a
//! blocking thread as the parts arrive in order; then `pg_verifybackup` checks every file
//! against PostgreSQL's own `backup_manifest` before anything starts on it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use pgkube_controllers::storage::recovery::BaseObject;
use pgkube_controllers::storage::{S3Bucket, error_chain, one_line, s3_error};
use sha2::{Digest, Sha256};
use tokio::process::Command;

/// Bytes of one ranged GET.
const PART_SIZE: u64 = 16 << 20;
/// Ranged GETs in flight at once.
const PARTS_IN_FLIGHT: usize = 4;
/// Parts queued for the unpacking thread.
const PARTS_QUEUED: usize = 2;

/// How far a restore came, for the log.
#[derive(Debug)]
pub struct Restored {
    pub stored_bytes: u64,
    pub seconds: f64,
}

/// Downloads `base` from `bucket`, unpacks it into `dir` (which must exist and be empty) and
/// verifies it. Any error leaves `dir` to the caller to remove.
pub async fn restore(bucket: &S3Bucket, base: &BaseObject, dir: &Path) -> Result<Restored, String> {
    let started = std::time::Instant::now();
    let (parts, unpacked) = sync_channel::<Bytes>(PARTS_QUEUED);
    let target = dir.to_owned();
    let unpacking = tokio::task::spawn_blocking(move || unpack(unpacked, &target));
    let downloaded = download(bucket, base, parts).await;
    let unpacked = unpacking
        .await
        .map_err(|error| format!("the unpacking thread failed: {error}"))?;
    // A download that failed closes the channel early: its error says why, not the tar's.
    downloaded?;
    unpacked?;
    verify(dir).await?;
    Ok(Restored {
        stored_bytes: base.size,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Sends the object's bytes in order, checking their size and SHA-256 against the manifest.
async fn download(
    bucket: &S3Bucket,
    base: &BaseObject,
    parts: SyncSender<Bytes>,
) -> Result<(), String> {
    let ranges: Vec<(u64, u64)> = (0..base.size.div_ceil(PART_SIZE))
        .map(|index| {
            let start = index * PART_SIZE;
            (start, (start + PART_SIZE).min(base.size) - 1)
        })
        .collect();
    let mut hasher = Sha256::new();
    let mut received = 0u64;
    let mut stream = futures::stream::iter(ranges)
        .map(|(first, last)| read_range(bucket, &base.key, first, last))
        .buffered(PARTS_IN_FLIGHT);
    while let Some(part) = stream.try_next().await? {
        hasher.update(&part);
        received += part.len() as u64;
        let sender = parts.clone();
        tokio::task::spawn_blocking(move || sender.send(part))
            .await
            .map_err(|error| format!("the unpacking thread failed: {error}"))?
            .map_err(|_| "the unpacking stopped before the end of the backup".to_owned())?;
    }
    drop(parts);
    let sha256 = hex::encode(hasher.finalize());
    if received != base.size || sha256 != base.sha256 {
        return Err(format!(
            "{} is corrupt: {received} bytes with SHA-256 {sha256} read, the manifest records {} bytes with {}",
            base.key, base.size, base.sha256
        ));
    }
    Ok(())
}

async fn read_range(bucket: &S3Bucket, key: &str, first: u64, last: u64) -> Result<Bytes, String> {
    let object = bucket
        .client
        .get_object()
        .bucket(&bucket.name)
        .key(key)
        .range(format!("bytes={first}-{last}"))
        .send()
        .await
        .map_err(|error| s3_error("GetObject", key, error).to_string())?;
    let bytes = object.body.collect().await.map_err(|error| {
        format!(
            "GetObject {key} (bytes {first}-{last}): {}",
            one_line(&error_chain(&error))
        )
    })?;
    Ok(bytes.into_bytes())
}

/// The parts, in order, as one reader.
struct PartReader {
    parts: Receiver<Bytes>,
    current: Bytes,
}

impl Read for PartReader {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.parts.recv() {
                Ok(part) => self.current = part,
                Err(_) => return Ok(0),
            }
        }
        let count = buffer.len().min(self.current.len());
        buffer[..count].copy_from_slice(&self.current.split_to(count));
        Ok(count)
    }
}

/// Decodes the zstd stream and unpacks the tar into `dir`.
fn unpack(parts: Receiver<Bytes>, dir: &Path) -> Result<(), String> {
    let reader = PartReader {
        parts,
        current: Bytes::new(),
    };
    let decoder = zstd::stream::read::Decoder::new(reader)
        .map_err(|error| format!("cannot start decoding the base backup: {error}"))?;
    let mut archive = tar::Archive::new(decoder);
    archive.set_preserve_permissions(true);
    archive.set_overwrite(false);
    archive.unpack(dir).map_err(|error| {
        format!(
            "cannot unpack the base backup into {}: {error}",
            dir.display()
        )
    })
}

/// `pg_verifybackup`: every file the backup's `backup_manifest` lists is there with its size
/// and checksum. WAL is not in a base backup without WAL (`-X none`); the archive serves it.
async fn verify(dir: &Path) -> Result<(), String> {
    let output = Command::new("pg_verifybackup")
        .arg("--no-parse-wal")
        .arg("--quiet")
        .arg(dir)
        .env("LC_ALL", "C")
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|error| format!("cannot run pg_verifybackup: {error}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "pg_verifybackup refuses the restored base backup: {}",
        one_line(String::from_utf8_lossy(&output.stderr).trim())
    ))
}

/// Where a restore is unpacked before it is swapped in.
pub fn partial_dir(pgdata: &Path) -> PathBuf {
    pgdata.with_extension("recover")
}
