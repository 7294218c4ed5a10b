//! Reading one object as a stream of chunks, resuming where a transfer breaks.
//!
//! The SDK retries a GET that fails before its body starts, but not a body that breaks half way
//! (a connection reset, a read timeout, a proxy restart). For a large dump that is the likely
//! failure, and starting over is not possible once the bytes already went into `pg_restore`. So
//! [`ObjectReader`] resumes with a ranged GET from the first byte it has not delivered, with
//! backoff, up to `--s3-max-attempts` times per object. Each resumed GET names the ETag of the
//! first response (`If-Match`), so a resume can never splice two versions of an object: if the
//! object changed in between, the store answers 412 and the read fails.

use std::time::Duration;

use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::operation::get_object::GetObjectOutput;
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use tracing::warn;

use super::error::AgentError;
use super::storage::{Store, error_chain, one_line, s3_error};

/// Backoff before the first resume; it doubles for each further one, up to [`MAX_BACKOFF`].
const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(20);

/// An object being read, chunk by chunk, in order.
pub struct ObjectReader<'a> {
    store: &'a Store,
    key: &'a str,
    body: ByteStream,
    /// Bytes delivered so far: where a resumed GET starts.
    offset: u64,
    /// The object's length and version, from the first response.
    length: Option<u64>,
    etag: Option<String>,
    resumes: u32,
}

impl<'a> ObjectReader<'a> {
    /// Starts reading `key`; `None` when the object does not exist.
    pub async fn open(store: &'a Store, key: &'a str) -> Result<Option<Self>, AgentError> {
        let response = store
            .s3
            .client
            .get_object()
            .bucket(&store.s3.name)
            .key(key)
            .send()
            .await;
        let response = match response {
            Ok(response) => response,
            Err(error) if error.as_service_error().is_some_and(|e| e.is_no_such_key()) => {
                return Ok(None);
            }
            Err(error) => return Err(s3_error("GetObject", key, error)),
        };
        Ok(Some(Self {
            store,
            key,
            length: response
                .content_length()
                .and_then(|length| u64::try_from(length).ok()),
            etag: response.e_tag().map(str::to_string),
            body: response.body,
            offset: 0,
            resumes: 0,
        }))
    }

    /// The next chunk, or `None` at the end of the object.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>, AgentError> {
        loop {
            match self.body.try_next().await {
                Ok(Some(chunk)) => {
                    self.offset += chunk.len() as u64;
                    return Ok(Some(chunk));
                }
                Ok(None) => return Ok(None),
                Err(error) => {
                    let reason = one_line(&error_chain(&error));
                    if self.length.is_some_and(|length| self.offset >= length) {
                        // Every byte arrived; only the end of the response was lost.
                        return Ok(None);
                    }
                    if self.resumes + 1 >= self.store.s3.max_attempts {
                        return Err(AgentError::S3 {
                            operation: "GetObject",
                            key: self.key.to_string(),
                            reason: format!(
                                "the download broke at byte {} after {} resumes: {reason}",
                                self.offset, self.resumes
                            ),
                        });
                    }
                    self.resumes += 1;
                    warn!(
                        key = %self.key,
                        offset = self.offset,
                        resume = self.resumes,
                        "download broke ({reason}); resuming from there"
                    );
                    tokio::time::sleep(backoff(self.resumes)).await;
                    self.body = self.resume().await?;
                }
            }
        }
    }

    /// The rest of the object, from `offset`, provided it is still the version first read.
    async fn resume(&self) -> Result<ByteStream, AgentError> {
        let mut request = self
            .store
            .s3
            .client
            .get_object()
            .bucket(&self.store.s3.name)
            .key(self.key)
            .range(format!("bytes={}-", self.offset));
        if let Some(etag) = &self.etag {
            request = request.if_match(etag);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) if error.code() == Some("PreconditionFailed") => {
                return Err(AgentError::Verification {
                    key: self.key.to_string(),
                    reason: "it changed in storage while it was being read".into(),
                });
            }
            Err(error) => return Err(s3_error("GetObject", self.key, error)),
        };
        self.check_range(&response)?;
        Ok(response.body)
    }

    /// A store that ignores `Range` sends the whole object again; appending that would corrupt
    /// the stream (the checksum would catch it, but only at the end, after `pg_restore` ran).
    fn check_range(&self, response: &GetObjectOutput) -> Result<(), AgentError> {
        let expected = format!("bytes {}-", self.offset);
        match response.content_range() {
            Some(range) if range.starts_with(&expected) => Ok(()),
            other => Err(AgentError::S3 {
                operation: "GetObject",
                key: self.key.to_string(),
                reason: format!(
                    "cannot resume the download at byte {}: the store answered the ranged GET \
                     with Content-Range {other:?}",
                    self.offset
                ),
            }),
        }
    }
}

/// `INITIAL_BACKOFF * 2^(resume - 1)`, at most `MAX_BACKOFF`.
fn backoff(resume: u32) -> Duration {
    INITIAL_BACKOFF
        .saturating_mul(2u32.saturating_pow(resume.saturating_sub(1)))
        .min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(2), Duration::from_millis(400));
        assert_eq!(backoff(5), Duration::from_millis(3200));
        assert_eq!(backoff(8), MAX_BACKOFF);
        assert_eq!(backoff(40), MAX_BACKOFF);
    }
}
