//! Where a backup or restore stands, printed on stderr as one JSON line
//! ([`AgentProgress::line`]) when a step starts, every [`REPORT_EVERY`] while it runs, and once
//! more at the end: the backup and restore controllers read the last one from the pod's log into
//! the object's `status.progress`.
//!
//! The steps count bytes as they pass ([`Progress::add`], [`CountingReader`]); the rate is the
//! step's average so far.

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use pgkube_controllers::agent_job::AgentProgress;

/// How often the agent prints where it stands.
pub const REPORT_EVERY: Duration = Duration::from_secs(5);

/// The progress of one agent run, shared by its steps and the task that prints it.
#[derive(Clone)]
pub struct Progress {
    bytes: Arc<AtomicU64>,
    state: Arc<Mutex<State>>,
}

struct State {
    step: &'static str,
    started: Instant,
    total: Option<u64>,
    total_is_estimate: bool,
    databases_done: Option<u32>,
    database_count: Option<u32>,
    current_database: Option<String>,
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

impl Progress {
    pub fn new() -> Self {
        Self {
            bytes: Arc::new(AtomicU64::new(0)),
            state: Arc::new(Mutex::new(State {
                step: "Starting",
                started: Instant::now(),
                total: None,
                total_is_estimate: false,
                databases_done: None,
                database_count: None,
                current_database: None,
            })),
        }
    }

    fn with_state<T>(&self, change: impl FnOnce(&mut State) -> T) -> T {
        change(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// A new step: its bytes count from zero. `total` is what it will read in all, if known,
    /// and `estimate` whether that is a guess.
    pub fn start_step(&self, step: &'static str, total: Option<u64>, estimate: bool) {
        self.with_state(|state| {
            state.step = step;
            state.started = Instant::now();
            state.total = total;
            state.total_is_estimate = estimate;
            state.databases_done = state.database_count.map(|_| 0);
            state.current_database = None;
        });
        self.bytes.store(0, Ordering::Relaxed);
        self.print();
    }

    fn print(&self) {
        eprintln!("{}", self.snapshot().line());
    }

    /// The step goes over `count` databases.
    pub fn set_database_count(&self, count: usize) {
        let count = u32::try_from(count).unwrap_or(u32::MAX);
        self.with_state(|state| {
            state.database_count = Some(count);
            state.databases_done = Some(0);
        });
    }

    /// The step works on `database` now.
    pub fn start_database(&self, database: &str) {
        self.with_state(|state| state.current_database = Some(database.to_owned()));
    }

    /// The current database is done.
    pub fn finish_database(&self) {
        self.with_state(|state| {
            state.current_database = None;
            state.databases_done = state.databases_done.map(|done| done.saturating_add(1));
        });
    }

    /// `bytes` more were read.
    pub fn add(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// `reader`, counting what is read from it into this progress.
    pub fn counting<R>(&self, reader: R) -> CountingReader<R> {
        CountingReader {
            inner: reader,
            bytes: self.bytes.clone(),
        }
    }

    /// Where the run stands now.
    pub fn snapshot(&self) -> AgentProgress {
        let bytes = self.bytes.load(Ordering::Relaxed);
        self.with_state(|state| {
            let elapsed = state.started.elapsed().as_secs_f64();
            AgentProgress {
                step: state.step.to_owned(),
                bytes,
                total_bytes: state.total,
                total_is_estimate: state.total_is_estimate,
                bytes_per_second: (elapsed >= 1.0).then(|| (bytes as f64 / elapsed) as u64),
                databases_done: state.databases_done,
                database_count: state.database_count,
                current_database: state.current_database.clone(),
            }
        })
    }

    /// Prints the progress on stderr every [`REPORT_EVERY`] until the returned guard is
    /// dropped, and then once more.
    pub fn report_periodically(&self) -> ReportGuard {
        let progress = self.clone();
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(REPORT_EVERY);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                progress.print();
            }
        });
        ReportGuard {
            task,
            progress: self.clone(),
        }
    }
}

/// Stops the periodic report when dropped, after a last one.
pub struct ReportGuard {
    task: tokio::task::JoinHandle<()>,
    progress: Progress,
}

impl Drop for ReportGuard {
    fn drop(&mut self) {
        self.task.abort();
        self.progress.print();
    }
}

/// A reader that adds what is read from it to a [`Progress`], synchronously (zstd's thread) or
/// asynchronously (an upload's read).
pub struct CountingReader<R> {
    inner: R,
    bytes: Arc<AtomicU64>,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buffer)?;
        self.bytes.fetch_add(read as u64, Ordering::Relaxed);
        Ok(read)
    }
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for CountingReader<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
        buffer: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buffer.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(context, buffer);
        let read = buffer.filled().len().saturating_sub(before);
        self.bytes.fetch_add(read as u64, Ordering::Relaxed);
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_counts_its_bytes_and_databases() {
        let progress = Progress::new();
        progress.set_database_count(2);
        progress.start_step("Dumping", Some(1000), true);
        progress.start_database("app");
        let mut reader = progress.counting(&b"0123456789"[..]);
        let mut read = Vec::new();
        reader.read_to_end(&mut read).expect("read");
        progress.add(5);
        let snapshot = progress.snapshot();
        assert_eq!(snapshot.step, "Dumping");
        assert_eq!(snapshot.bytes, 15);
        assert_eq!(snapshot.total_bytes, Some(1000));
        assert!(snapshot.total_is_estimate);
        assert_eq!(snapshot.databases_done, Some(0));
        assert_eq!(snapshot.database_count, Some(2));
        assert_eq!(snapshot.current_database.as_deref(), Some("app"));
        progress.finish_database();
        let snapshot = progress.snapshot();
        assert_eq!(snapshot.databases_done, Some(1));
        assert_eq!(snapshot.current_database, None);
    }

    #[test]
    fn a_new_step_counts_from_zero() {
        let progress = Progress::new();
        progress.set_database_count(1);
        progress.start_step("Verifying", Some(10), false);
        progress.add(10);
        progress.finish_database();
        progress.start_step("Restoring", Some(10), false);
        let snapshot = progress.snapshot();
        assert_eq!(snapshot.step, "Restoring");
        assert_eq!(snapshot.bytes, 0);
        assert_eq!(snapshot.databases_done, Some(0));
        assert!(!snapshot.total_is_estimate);
    }

    #[tokio::test]
    async fn an_async_read_is_counted() {
        use tokio::io::AsyncReadExt;
        let progress = Progress::new();
        let mut reader = progress.counting(&b"abcdef"[..]);
        let mut read = Vec::new();
        AsyncReadExt::read_to_end(&mut reader, &mut read)
            .await
            .expect("read");
        assert_eq!(progress.snapshot().bytes, 6);
    }
}
