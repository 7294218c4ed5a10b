//! A base backup into a directory: `base.tar.zst` read with several ranged GETs at once, its
//! stored bytes checked against the manifest's SHA-256 and size, zstd decoded on one thread and
//! unpacked on another as the parts arrive in order, every file checked against PostgreSQL's
//! own `backup_manifest` as it is written and made durable ([`super::unpack`]) before anything
//! starts on it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use pgkube_controllers::storage::recovery::BaseObject;
use pgkube_controllers::storage::{S3Bucket, error_chain, one_line, s3_error};
use sha2::{Digest, Sha256};

use super::unpack::{self, NEXT_STEP_STOPPED};

/// Bytes of one ranged GET.
const PART_SIZE: u64 = 16 << 20;
/// Ranged GETs in flight at once.
const PARTS_IN_FLIGHT: usize = 4;
/// Parts queued for the decoding thread.
const PARTS_QUEUED: usize = 2;
/// Bytes of one decoded chunk, and chunks queued for the unpacking thread.
const CHUNK_SIZE: usize = 1 << 20;
const CHUNKS_QUEUED: usize = 8;

/// How far a restore came, for the log.
#[derive(Debug)]
pub struct Restored {
    pub stored_bytes: u64,
    pub files: usize,
    pub bytes: u64,
    pub seconds: f64,
}

/// Downloads `base` from `bucket`, unpacks it into `dir` (which must exist and be empty),
/// verified and durable. Any error leaves `dir` to the caller to remove.
pub async fn restore(bucket: &S3Bucket, base: &BaseObject, dir: &Path) -> Result<Restored, String> {
    let started = std::time::Instant::now();
    let (parts, compressed) = sync_channel::<Bytes>(PARTS_QUEUED);
    let (chunks, decoded) = sync_channel::<Bytes>(CHUNKS_QUEUED);
    let decoding = tokio::task::spawn_blocking(move || decode(PartReader::new(compressed), chunks));
    let target = dir.to_owned();
    let unpacking = tokio::task::spawn_blocking(move || {
        unpack::unpack_verified(PartReader::new(decoded), &target)
    });
    let downloaded = download(bucket, base, parts).await;
    let decoded = joined(decoding.await);
    let unpacked = joined(unpacking.await);
    // A step that fails stops the steps before it ("the next step stopped") and starves the
    // ones after it (a stream cut short): the first error that is not the former says why.
    let cause = [
        downloaded.as_ref().err(),
        decoded.as_ref().err(),
        unpacked.as_ref().err(),
    ]
    .into_iter()
    .flatten()
    .find(|error| *error != NEXT_STEP_STOPPED);
    if let Some(cause) = cause {
        return Err(cause.clone());
    }
    let unpacked = unpacked?;
    Ok(Restored {
        stored_bytes: base.size,
        files: unpacked.files,
        bytes: unpacked.bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn joined<T>(result: Result<Result<T, String>, tokio::task::JoinError>) -> Result<T, String> {
    result.map_err(|error| format!("a restoring thread failed: {error}"))?
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
            .map_err(|error| format!("a restoring thread failed: {error}"))?
            .map_err(|_| NEXT_STEP_STOPPED.to_owned())?;
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

impl PartReader {
    fn new(parts: Receiver<Bytes>) -> Self {
        Self {
            parts,
            current: Bytes::new(),
        }
    }
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

/// Decodes the zstd stream into chunks of the tar, in order.
fn decode(compressed: PartReader, chunks: SyncSender<Bytes>) -> Result<(), String> {
    let mut decoder = zstd::stream::read::Decoder::new(compressed)
        .map_err(|error| format!("cannot start decoding the base backup: {error}"))?;
    loop {
        let mut chunk = vec![0u8; CHUNK_SIZE];
        let mut filled = 0;
        while filled < CHUNK_SIZE {
            match decoder.read(&mut chunk[filled..]) {
                Ok(0) => break,
                Ok(count) => filled += count,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => return Err(format!("cannot decode the base backup: {error}")),
            }
        }
        if filled == 0 {
            return Ok(());
        }
        chunk.truncate(filled);
        chunks
            .send(Bytes::from(chunk))
            .map_err(|_| NEXT_STEP_STOPPED.to_owned())?;
    }
}

/// Where a restore is unpacked before it is swapped in.
pub fn partial_dir(pgdata: &Path) -> PathBuf {
    pgdata.with_extension("recover")
}
