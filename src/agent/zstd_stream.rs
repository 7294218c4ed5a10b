//! zstd on the agent's streams: compressing pg_dump's output on its way to S3, decompressing an
//! object on its way to `pg_restore`.
//!
//! Compression runs on a blocking thread ([`compress`]): it reads pg_dump's stdout (a plain
//! blocking pipe) and feeds libzstd's multi-threaded encoder, whose workers compress jobs in
//! parallel; the compressed bytes come back to the async side through a small channel
//! ([`ChunkReader`], an `AsyncRead` for the multipart upload). Memory is bounded by libzstd's
//! jobs ([`JOB_SIZE`] of input per worker, plus their output and the window they overlap) and
//! [`CHANNEL_CHUNKS`] chunks in the channel; the upload's part buffers come on top. When the
//! upload stops reading, the channel closes, the thread's next write fails and it ends, closing
//! pg_dump's stdout.
//!
//! Frames carry zstd's own content checksum, so decoding proves the bytes decompress to what was
//! compressed. Decompression ([`Decompressor`]) is fast next to `pg_restore`, so it runs in place
//! on the async side, one downloaded chunk at a time, and refuses windows larger than the levels
//! the agent writes need ([`MAX_WINDOW_LOG`]), which bounds its memory too.

use std::io::{self, Read, Write};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zstd::stream::raw::{DParameter, Decoder, InBuffer, Operation, OutBuffer};
use zstd::zstd_safe::CParameter;

use super::compression::ZstdSettings;

/// Bytes read from pg_dump at a time.
const READ_SIZE: usize = 128 * 1024;
/// Compressed chunks waiting for the upload; the encoder writes chunks of up to 32 KiB.
pub const CHANNEL_CHUNKS: usize = 8;
/// Input of one compression job. libzstd's default is 4 windows (8 MiB at level 3, 32 MiB at
/// level 19) per worker, and each worker holds its input, its output and the overlap with the
/// job before it: a fixed size keeps the agent's memory the same at every level, for a ratio
/// within a percent of the default's.
pub const JOB_SIZE: u32 = 2 * 1024 * 1024;
/// The largest window a restore accepts: 8 MiB, what level 19 uses (lower levels use less).
pub const MAX_WINDOW_LOG: u32 = 23;

/// A compression running on its own thread.
pub struct Compressor {
    /// The compressed stream.
    pub output: ChunkReader,
    task: JoinHandle<io::Result<u64>>,
}

/// Starts compressing `input` to the end. Read [`Compressor::output`] to its end, then call
/// [`Compressor::finish`]: an end of output can also mean that compression failed.
pub fn compress<R: Read + Send + 'static>(input: R, settings: ZstdSettings) -> Compressor {
    let (sender, receiver) = mpsc::channel(CHANNEL_CHUNKS);
    let task = tokio::task::spawn_blocking(move || encode(input, ChunkWriter { sender }, settings));
    Compressor {
        output: ChunkReader {
            receiver,
            current: Bytes::new(),
        },
        task,
    }
}

impl Compressor {
    /// Waits for the thread; the number of uncompressed bytes it read, or why it failed.
    pub async fn finish(self) -> io::Result<u64> {
        drop(self.output);
        self.task.await.map_err(io::Error::other)?
    }
}

fn encode<R: Read>(mut input: R, output: ChunkWriter, settings: ZstdSettings) -> io::Result<u64> {
    let mut encoder = zstd::stream::write::Encoder::new(output, settings.level)?;
    encoder.include_checksum(true)?;
    encoder.multithread(settings.workers)?;
    encoder.set_parameter(CParameter::JobSize(JOB_SIZE))?;
    let mut buffer = vec![0u8; READ_SIZE];
    let mut total = 0u64;
    loop {
        let read = match input.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        encoder.write_all(&buffer[..read])?;
        total += read as u64;
    }
    encoder.finish()?;
    Ok(total)
}

/// The encoder's output, handed to the async side chunk by chunk.
struct ChunkWriter {
    sender: mpsc::Sender<Bytes>,
}

impl Write for ChunkWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sender
            .blocking_send(Bytes::copy_from_slice(buf))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the upload stopped reading"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The compressed stream, as an `AsyncRead` that ends when the compressing thread does.
pub struct ChunkReader {
    receiver: mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl AsyncRead for ChunkReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        while self.current.is_empty() {
            match ready!(self.receiver.poll_recv(context)) {
                Some(chunk) => self.current = chunk,
                None => return Poll::Ready(Ok(())),
            }
        }
        let length = self.current.len().min(buf.remaining());
        let chunk = self.current.split_to(length);
        buf.put_slice(&chunk);
        Poll::Ready(Ok(()))
    }
}

/// Why decompressing into a sink stopped.
#[derive(Debug)]
pub enum DecodeError {
    /// The bytes are not a valid zstd stream (or fail its checksum).
    Corrupt(io::Error),
    /// The sink refused the decompressed bytes.
    Sink(io::Error),
}

/// Decompresses a zstd stream given in pieces into a sink.
pub struct Decompressor {
    decoder: Decoder<'static>,
    buffer: Vec<u8>,
    /// Whether the last frame seen was complete (libzstd's hint was 0).
    frame_complete: bool,
}

impl Decompressor {
    pub fn new() -> io::Result<Self> {
        let mut decoder = Decoder::new()?;
        decoder.set_parameter(DParameter::WindowLogMax(MAX_WINDOW_LOG))?;
        Ok(Self {
            decoder,
            buffer: vec![0u8; READ_SIZE],
            frame_complete: false,
        })
    }

    /// Decompresses `input` and writes what it gives to `sink`.
    pub async fn write<W: AsyncWrite + Unpin>(
        &mut self,
        mut input: &[u8],
        sink: &mut W,
    ) -> Result<(), DecodeError> {
        loop {
            let (consumed, produced) = self.step(input)?;
            input = &input[consumed..];
            sink.write_all(&self.buffer[..produced])
                .await
                .map_err(DecodeError::Sink)?;
            // A full output buffer may leave decoded bytes inside libzstd.
            if input.is_empty() && produced < self.buffer.len() {
                return Ok(());
            }
        }
    }

    /// Checks that the stream ended at the end of a frame: a truncated object fails here.
    pub fn finish(&self) -> Result<(), DecodeError> {
        if self.frame_complete {
            return Ok(());
        }
        Err(DecodeError::Corrupt(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the zstd stream ends inside a frame",
        )))
    }

    /// One call into libzstd: (input bytes consumed, output bytes produced).
    fn step(&mut self, input: &[u8]) -> Result<(usize, usize), DecodeError> {
        let mut in_buffer = InBuffer::around(input);
        let mut out_buffer = OutBuffer::around(&mut self.buffer[..]);
        let hint = self
            .decoder
            .run(&mut in_buffer, &mut out_buffer)
            .map_err(DecodeError::Corrupt)?;
        let produced = out_buffer.pos();
        if hint == 0 {
            self.frame_complete = true;
        } else if in_buffer.pos() > 0 || produced > 0 {
            self.frame_complete = false;
        }
        Ok((in_buffer.pos(), produced))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(level: i32) -> ZstdSettings {
        ZstdSettings { level, workers: 2 }
    }

    /// Text that compresses, but not to nothing: 6 MiB, more than two jobs.
    fn sample() -> Vec<u8> {
        (0..200_000u32)
            .flat_map(|n| format!("row {n:08} {:x}\n", n.wrapping_mul(2_654_435_761)).into_bytes())
            .collect()
    }

    async fn compressed(data: Vec<u8>, level: i32) -> Vec<u8> {
        let mut compressor = compress(std::io::Cursor::new(data.clone()), settings(level));
        let mut output = Vec::new();
        tokio::io::copy(&mut compressor.output, &mut output)
            .await
            .expect("reading the compressed stream");
        let read = compressor.finish().await.expect("compression succeeds");
        assert_eq!(read, data.len() as u64);
        output
    }

    async fn decompressed(stream: &[u8], piece: usize) -> Result<Vec<u8>, DecodeError> {
        let mut decompressor = Decompressor::new().expect("decoder");
        let mut output = Vec::new();
        for chunk in stream.chunks(piece) {
            decompressor.write(chunk, &mut output).await?;
        }
        decompressor.finish()?;
        Ok(output)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_compressed_on_several_threads_decodes_to_the_same_bytes() {
        let data = sample();
        for level in [1, 3, 19] {
            let stream = compressed(data.clone(), level).await;
            assert!(
                stream.len() < data.len() / 2,
                "level {level}: {} of {} bytes",
                stream.len(),
                data.len()
            );
            let back = decompressed(&stream, 10_000).await.expect("decodes");
            assert!(back == data, "level {level}: the bytes differ");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_empty_stream_is_one_valid_frame() {
        let stream = compressed(Vec::new(), 3).await;
        assert!(!stream.is_empty());
        assert!(decompressed(&stream, 7).await.expect("decodes").is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_truncated_or_altered_stream_is_refused() {
        let stream = compressed(sample(), 3).await;
        let truncated = &stream[..stream.len() - 100];
        assert!(matches!(
            decompressed(truncated, 4096).await,
            Err(DecodeError::Corrupt(_))
        ));
        let mut altered = stream.clone();
        let middle = altered.len() / 2;
        altered[middle] ^= 0x40;
        assert!(matches!(
            decompressed(&altered, 4096).await,
            Err(DecodeError::Corrupt(_))
        ));
        assert!(matches!(
            decompressed(b"PGDMP plain custom archive", 4096).await,
            Err(DecodeError::Corrupt(_))
        ));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn compression_stops_when_the_reader_goes_away() {
        let compressor = compress(std::io::repeat(b'x'), settings(1));
        let error = compressor
            .finish()
            .await
            .expect_err("an endless input cannot be compressed to the end");
        assert_eq!(error.kind(), io::ErrorKind::BrokenPipe);
    }
}
