//! Streaming a byte stream of unknown length into one S3 object through a multipart upload.
//!
//! Memory stays bounded whatever the stream's length: one part is being filled from the reader
//! while at most `parts_in_flight` earlier parts are being uploaded, so the agent holds at most
//! `(parts_in_flight + 1) x` the current part size. The part size grows with the part count
//! ([`PartSizes`]) so that any stream S3 can store fits in its 10,000 parts. The buffers come from
//! a [`PartBuffers`] pool and are reused from part to part and object to object, so the part
//! memory is allocated once per backup and part size, not once per part. The SHA-256 and the
//! byte count are computed on the fly, in stream order.
//!
//! A part whose upload still fails with a transient error after the SDK's retries is sent again a
//! few times, further apart ([`super::transient`]).
//!
//! The caller decides whether the upload is kept: [`MultipartUpload::send`] only uploads parts,
//! [`MultipartUpload::complete`] makes the object visible and checks its stored size, and
//! [`MultipartUpload::abort`] discards every uploaded part. That split lets the backup wait for
//! `pg_dump`'s exit status before completing: a dump that died mid-stream looks like a clean end
//! of file to the reader.

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::SdkError;
use aws_sdk_s3::operation::upload_part::{UploadPartError, UploadPartOutput};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::{BufMut, Bytes, BytesMut};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::task::JoinSet;
use tracing::{debug, warn};

use super::error::AgentError;
use super::part_size::{MAX_PARTS, PartSizes};
use super::storage::{Store, s3_error};
use super::transient;

pub use super::part_size::MIN_PART_SIZE;

/// The part buffers of a backup, reused from one part (and one object) to the next.
///
/// Why a pool: a fresh part-sized buffer per part is filled on one worker thread and freed on
/// another after its upload, which leaves it to the allocator (glibc keeps per-thread arenas)
/// whether peak memory stays flat over thousands of parts. With a pool the same
/// `parts_in_flight + 1` buffers carry every part of a given size. When the part size changes
/// (it doubled, or a new object starts small again), the buffers of the old size are dropped
/// as they come back, so the pool never holds more than `parts_in_flight + 1` buffers of the
/// current size.
pub struct PartBuffers {
    sizes: PartSizes,
    keep: usize,
    /// Free buffers, all fit for `current`.
    free: Vec<BytesMut>,
    /// The part size last asked for.
    current: usize,
    allocated: usize,
}

impl PartBuffers {
    /// A pool for parts of `part_size` (raised to S3's minimum) that double as
    /// [`PartSizes::new`] has them, enough for `parts_in_flight` uploads plus the part being
    /// filled.
    pub fn new(part_size: usize, parts_in_flight: usize) -> Self {
        Self::with_sizes(PartSizes::new(part_size), parts_in_flight)
    }

    /// A pool for parts of the given schedule.
    pub fn with_sizes(sizes: PartSizes, parts_in_flight: usize) -> Self {
        let keep = parts_in_flight.max(1) + 1;
        Self {
            sizes,
            keep,
            free: Vec::with_capacity(keep),
            current: sizes.first(),
            allocated: 0,
        }
    }

    /// The size of every part number.
    pub fn sizes(&self) -> PartSizes {
        self.sizes
    }

    /// How many buffers were allocated so far: with every buffer returned, never more than
    /// `parts_in_flight + 1` per part size used, however many parts went through.
    pub fn allocated(&self) -> usize {
        self.allocated
    }

    /// An empty buffer with room for one part of `size` bytes.
    fn take(&mut self, size: usize) -> BytesMut {
        if size != self.current {
            self.current = size;
            self.free.retain(|buffer| fits(buffer, size));
        }
        self.free.pop().unwrap_or_else(|| {
            self.allocated += 1;
            BytesMut::with_capacity(size)
        })
    }

    /// Takes an uploaded part back for reuse. The SDK has dropped its copies by the time the
    /// upload returns, so the part is normally unique; if something still holds it, it is left
    /// to be freed and a new buffer is allocated later. A part of another size than the current
    /// one is freed too.
    fn recycle(&mut self, part: Bytes) {
        if self.free.len() >= self.keep {
            return;
        }
        if let Ok(mut buffer) = part.try_into_mut()
            && fits(&buffer, self.current)
        {
            buffer.clear();
            self.free.push(buffer);
        }
    }
}

/// Whether `buffer` can carry a part of `size` bytes without wasting half its memory or more.
fn fits(buffer: &BytesMut, size: usize) -> bool {
    buffer.capacity() >= size && buffer.capacity() - size < size
}

/// How the stream was cut up and what it contained.
#[derive(Debug)]
pub struct SentStream {
    pub size: u64,
    pub sha256: String,
    parts: Vec<CompletedPart>,
}

impl SentStream {
    /// How many parts the stream was cut into.
    pub fn part_count(&self) -> usize {
        self.parts.len()
    }
}

/// An open multipart upload. Dropping it without `complete` or `abort` leaves the parts in the
/// store until a lifecycle rule removes them, so every path must end in one of the two.
pub struct MultipartUpload {
    store: Store,
    key: String,
    upload_id: String,
    parts_in_flight: usize,
}

impl MultipartUpload {
    pub async fn create(
        store: &Store,
        key: &str,
        parts_in_flight: usize,
    ) -> Result<Self, AgentError> {
        let created = store
            .s3
            .create_multipart_upload(key)
            .content_type("application/octet-stream")
            .send()
            .await
            .map_err(|error| s3_error("CreateMultipartUpload", key, error))?;
        let upload_id = created.upload_id().ok_or_else(|| AgentError::S3 {
            operation: "CreateMultipartUpload",
            key: key.to_string(),
            reason: "the store returned no upload id".into(),
        })?;
        Ok(Self {
            store: store.clone(),
            key: key.to_string(),
            upload_id: upload_id.to_string(),
            parts_in_flight: parts_in_flight.max(1),
        })
    }

    /// Uploads the whole stream as parts cut to the pool's part size. On error the parts still
    /// in flight are cancelled; the caller must then `abort`.
    pub async fn send<R: AsyncRead + Unpin>(
        &self,
        reader: &mut R,
        buffers: &mut PartBuffers,
    ) -> Result<SentStream, AgentError> {
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let mut parts = Vec::new();
        // Dropping the set (on an early return) cancels the uploads still running.
        let mut uploads = JoinSet::new();
        let mut part_number = 0u32;
        loop {
            let part_size = buffers.sizes().size_of(part_number + 1);
            let data = self
                .read_part(reader, &mut hasher, buffers.take(part_size), part_size)
                .await?;
            let at_end = data.len() < part_size;
            // An empty stream still needs one (empty) part; otherwise skip the empty tail.
            if data.is_empty() && part_number > 0 {
                buffers.recycle(data.freeze());
                break;
            }
            part_number += 1;
            self.check_part_count(part_number, buffers.sizes())?;
            size += data.len() as u64;
            while uploads.len() >= self.parts_in_flight {
                parts.push(self.next_finished(&mut uploads, buffers).await?);
            }
            uploads.spawn(upload_part(
                self.store.clone(),
                self.key.clone(),
                self.upload_id.clone(),
                // At most MAX_PARTS, checked above.
                i32::try_from(part_number).unwrap_or(i32::MAX),
                data.freeze(),
            ));
            if at_end {
                break;
            }
        }
        while !uploads.is_empty() {
            parts.push(self.next_finished(&mut uploads, buffers).await?);
        }
        parts.sort_by_key(|part| part.part_number());
        Ok(SentStream {
            size,
            sha256: hex::encode(hasher.finalize()),
            parts,
        })
    }

    /// Refuses a part beyond S3's 10,000: the stream is larger than an object can be.
    fn check_part_count(&self, part_number: u32, sizes: PartSizes) -> Result<(), AgentError> {
        if part_number <= MAX_PARTS {
            return Ok(());
        }
        Err(AgentError::Settings(format!(
            "{} needs more than {MAX_PARTS} parts: the stream is larger than S3 stores in one \
             object ({} bytes in {MAX_PARTS} parts of growing size)",
            self.key,
            sizes.capacity(MAX_PARTS)
        )))
    }

    /// Makes the object visible, then checks that the store holds exactly the bytes sent.
    /// Aborts the upload if completing fails.
    pub async fn complete(self, sent: SentStream) -> Result<(u64, String), AgentError> {
        let completion = CompletedMultipartUpload::builder()
            .set_parts(Some(sent.parts))
            .build();
        let completed = self
            .store
            .s3
            .client
            .complete_multipart_upload()
            .bucket(&self.store.s3.name)
            .key(&self.key)
            .upload_id(&self.upload_id)
            .multipart_upload(completion)
            .send()
            .await;
        if let Err(error) = completed {
            let error = s3_error("CompleteMultipartUpload", &self.key, error);
            self.abort().await;
            return Err(error);
        }
        match self.store.object_size(&self.key).await? {
            Some(stored) if stored == sent.size => Ok((sent.size, sent.sha256)),
            Some(stored) => Err(AgentError::Verification {
                key: self.key,
                reason: format!("{stored} bytes stored, {} bytes sent", sent.size),
            }),
            None => Err(AgentError::Verification {
                key: self.key,
                reason: "missing right after the upload completed".into(),
            }),
        }
    }

    /// Discards the upload and its parts. Failure to abort is logged, not returned: the caller
    /// is already reporting the error that made it abort.
    pub async fn abort(self) {
        let aborted = self
            .store
            .s3
            .client
            .abort_multipart_upload()
            .bucket(&self.store.s3.name)
            .key(&self.key)
            .upload_id(&self.upload_id)
            .send()
            .await;
        match aborted {
            Ok(_) => debug!(key = %self.key, "multipart upload aborted"),
            Err(error) => warn!(
                "could not abort the multipart upload of {}; its parts stay until a lifecycle rule removes them: {}",
                self.key,
                s3_error("AbortMultipartUpload", &self.key, error)
            ),
        }
    }

    /// Fills `data` with one part, or less at the end of the stream, hashing each read as it
    /// arrives: the bytes are hashed while still in cache, and the reader never stops draining
    /// the pipe for a whole part's hash (the writer blocks as soon as the pipe's 64 KiB are full).
    async fn read_part<R: AsyncRead + Unpin>(
        &self,
        reader: &mut R,
        hasher: &mut Sha256,
        mut data: BytesMut,
        part_size: usize,
    ) -> Result<BytesMut, AgentError> {
        // `read_buf` fills the spare capacity; limiting it keeps a part at exactly part_size.
        while data.len() < part_size {
            let start = data.len();
            let read = reader
                .read_buf(&mut (&mut data).limit(part_size))
                .await
                .map_err(|source| AgentError::Stream {
                    key: self.key.clone(),
                    source,
                })?;
            if read == 0 {
                break;
            }
            hasher.update(&data[start..]);
        }
        Ok(data)
    }

    /// Waits for the next upload to end and takes its buffer back.
    async fn next_finished(
        &self,
        uploads: &mut JoinSet<Result<(CompletedPart, Bytes), AgentError>>,
        buffers: &mut PartBuffers,
    ) -> Result<CompletedPart, AgentError> {
        match uploads.join_next().await {
            Some(Ok(Ok((part, data)))) => {
                buffers.recycle(data);
                Ok(part)
            }
            Some(Ok(Err(error))) => Err(error),
            Some(Err(join_error)) => Err(AgentError::S3 {
                operation: "UploadPart",
                key: self.key.clone(),
                reason: format!("upload task ended abnormally: {join_error}"),
            }),
            None => Err(AgentError::S3 {
                operation: "UploadPart",
                key: self.key.clone(),
                reason: "no upload in flight".into(),
            }),
        }
    }
}

async fn upload_part(
    store: Store,
    key: String,
    upload_id: String,
    part_number: i32,
    data: Bytes,
) -> Result<(CompletedPart, Bytes), AgentError> {
    let length = data.len();
    // Beyond the SDK's retries: a part lost to a store outage of a minute would fail the whole
    // backup (see `transient`).
    let uploaded = transient::retried(
        "UploadPart",
        transient::part_waits(store.part_retries),
        transient::is_transient,
        || send_part(&store, &key, &upload_id, part_number, &data),
    )
    .await
    .map_err(|error| s3_error("UploadPart", &key, error))?;
    debug!(%key, part_number, length, "part uploaded");
    let part = CompletedPart::builder()
        .part_number(part_number)
        .set_e_tag(uploaded.e_tag().map(str::to_string))
        .build();
    // The request, and with it the SDK's copy of the body, is gone: hand the buffer back.
    Ok((part, data))
}

/// One UploadPart request (with the SDK's own retries).
async fn send_part(
    store: &Store,
    key: &str,
    upload_id: &str,
    part_number: i32,
    data: &Bytes,
) -> Result<UploadPartOutput, SdkError<UploadPartError, HttpResponse>> {
    // A `Bytes` body can be replayed, so the SDK's retries resend the part as is.
    let request = store
        .s3
        .client
        .upload_part()
        .bucket(&store.s3.name)
        .key(key)
        .upload_id(upload_id)
        .part_number(part_number)
        .content_length(i64::try_from(data.len()).unwrap_or(i64::MAX))
        .body(ByteStream::from(data.clone()));
    if store.s3.sign_payloads {
        request.send().await
    } else {
        request.customize().disable_payload_signing().send().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1024 * 1024;

    #[test]
    fn a_returned_part_is_reused_and_a_part_still_shared_is_not() {
        let mut buffers = PartBuffers::new(MIN_PART_SIZE, 1);
        let mut first = buffers.take(MIN_PART_SIZE);
        first.put_slice(b"part one");
        let address = first.as_ptr();
        buffers.recycle(first.freeze());
        let reused = buffers.take(MIN_PART_SIZE);
        assert_eq!(reused.as_ptr(), address, "the same allocation comes back");
        assert!(reused.is_empty());
        assert_eq!(buffers.allocated(), 1);

        let shared = reused.freeze();
        let still_held = shared.clone();
        buffers.recycle(shared);
        let fresh = buffers.take(MIN_PART_SIZE);
        assert_ne!(
            fresh.as_ptr(),
            still_held.as_ptr(),
            "a shared part is never handed out"
        );
        assert_eq!(buffers.allocated(), 2);
    }

    #[test]
    fn the_pool_keeps_no_more_than_it_can_use() {
        let mut buffers = PartBuffers::new(MIN_PART_SIZE, 2);
        let taken: Vec<Bytes> = (0..5)
            .map(|_| buffers.take(MIN_PART_SIZE).freeze())
            .collect();
        for part in taken {
            buffers.recycle(part);
        }
        assert_eq!(
            buffers.free.len(),
            3,
            "parts in flight plus the one being filled"
        );
    }

    /// Drives the pool as `send` does over a schedule that doubles every 3 parts, then over a
    /// second object that starts small again: the bytes held never exceed
    /// `(parts_in_flight + 1) x` the current part size.
    #[test]
    fn memory_stays_within_the_bound_as_the_part_size_grows() {
        let parts_in_flight = 2;
        let sizes = PartSizes::new(MIN_PART_SIZE).doubling_every(3);
        let mut buffers = PartBuffers::with_sizes(sizes, parts_in_flight);
        for object in 0..2 {
            let mut in_flight: Vec<Bytes> = Vec::new();
            for part_number in 1..=12 {
                let size = sizes.size_of(part_number);
                let filling = buffers.take(size);
                assert!(
                    filling.capacity() >= size,
                    "object {object} part {part_number}"
                );
                let held: usize = in_flight.iter().map(Bytes::len).sum::<usize>()
                    + buffers.free.iter().map(BytesMut::capacity).sum::<usize>()
                    + filling.capacity();
                assert!(
                    held <= (parts_in_flight + 1) * size,
                    "object {object} part {part_number}: {} MiB held",
                    held / MIB
                );
                while in_flight.len() >= parts_in_flight {
                    buffers.recycle(in_flight.remove(0));
                }
                let mut part = filling;
                part.resize(size, 0);
                in_flight.push(part.freeze());
            }
            for part in in_flight {
                buffers.recycle(part);
            }
        }
        // Each of the 4 sizes of each object needed its buffers once.
        assert!(buffers.allocated() <= 2 * 4 * (parts_in_flight + 1));
    }
}
