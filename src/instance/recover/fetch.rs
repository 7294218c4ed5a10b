//! WAL for a recovering server: PostgreSQL's `restore_command` is `pgkube instance restore-wal
//! --socket <socket> %f %p`, a short-lived client that asks this manager for one file over a
//! Unix socket and exits with its answer.
//!
//! PostgreSQL asks for one segment at a time and waits for each. So when it asks for a segment,
//! the manager also starts fetching the next [`PREFETCH`] segments of that timeline, several at
//! once, into a spool directory beside the data: when PostgreSQL asks for them they are there,
//! decoded and checked, and the answer is a rename.
//!
//! Each file is checked against the SHA-256 and size the archiver stored with it. Answers:
//! - `found`: the file is at the path PostgreSQL gave;
//! - `missing`: not in the archive, which PostgreSQL takes for the end of the archive (or of a
//!   timeline it probes);
//! - `error: …`: a file that must be there is not (a gap: a later segment of the same timeline
//!   is stored; a missing history file of a timeline that has segments), or a file is corrupt.
//!   The client exits with 126, which PostgreSQL takes as fatal: recovery stops there instead
//!   of ending early at the gap and promoting with less than was archived.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgkube_controllers::storage::S3Bucket;
use pgkube_controllers::storage::lsn::{parse_segment_name, segment_name};
use pgkube_controllers::storage::wal::{self, FetchedFile, WalFileKind, WalFileName};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio::sync::{Semaphore, watch};

/// The socket's file name in the manager's directory.
pub const SOCKET_NAME: &str = "wal-restore.sock";
/// Segments fetched ahead of the one asked for.
pub const PREFETCH: u64 = 8;
/// Fetches at once.
const FETCHES_IN_FLIGHT: usize = 4;
/// WAL segments are 16 MiB unless initdb was told otherwise, which pgkube never does.
const SEGMENT_SIZE: u64 = 16 * 1024 * 1024;
/// The exit status PostgreSQL takes as fatal for its `restore_command` (above 125).
pub const FATAL_EXIT: i32 = 126;
/// How long the client waits for an answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(600);
/// The longest request line: a name and a path.
const MAX_REQUEST: u64 = 4096;

/// What a fetch came to, shared with everyone waiting for it.
type Outcome = Option<Result<bool, RestoreError>>;

/// Why a file was not restored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    /// The storage could not be read now; asking again may work.
    #[error("{0}")]
    Transient(String),
    /// The archive cannot serve this recovery: a gap, a corrupt file, a missing history file.
    #[error("{0}")]
    Broken(String),
}

/// Serves a recovering server's WAL from the archive at `root`.
pub struct Restorer {
    bucket: S3Bucket,
    root: String,
    spool: PathBuf,
    prefetch: u64,
    permits: Semaphore,
    fetches: Mutex<HashMap<String, watch::Receiver<Outcome>>>,
    /// Files fetched ahead and in the spool.
    spooled: Mutex<HashSet<String>>,
    /// The last error answered, for the recovery's failure.
    last_error: Mutex<Option<RestoreError>>,
}

impl Restorer {
    /// `prefetch`: segments fetched ahead (0 turns fetching ahead off).
    pub fn new(bucket: S3Bucket, root: &str, spool: &Path, prefetch: u64) -> Arc<Self> {
        Arc::new(Self {
            bucket,
            root: root.to_owned(),
            spool: spool.to_owned(),
            prefetch,
            permits: Semaphore::new(FETCHES_IN_FLIGHT),
            fetches: Mutex::default(),
            spooled: Mutex::default(),
            last_error: Mutex::default(),
        })
    }

    /// The last error answered, if any.
    pub fn last_error(&self) -> Option<RestoreError> {
        lock(&self.last_error).clone()
    }

    /// Puts the WAL file `name` at `destination`: `Ok(true)` when done, `Ok(false)` when the
    /// archive does not have it and need not.
    pub async fn restore(self: &Arc<Self>, name: &str, destination: &Path) -> Result<bool, String> {
        let result = self.restore_unrecorded(name, destination).await;
        if let Err(error) = &result {
            tracing::error!(file = name, %error, "WAL file not restored");
            *lock(&self.last_error) = Some(error.clone());
        }
        result.map_err(|error| error.to_string())
    }

    async fn restore_unrecorded(
        self: &Arc<Self>,
        name: &str,
        destination: &Path,
    ) -> Result<bool, RestoreError> {
        let file = WalFileName::parse(name).ok_or_else(|| {
            RestoreError::Broken(format!("{name:?} is not the name of a WAL file"))
        })?;
        if file.kind == WalFileKind::Segment {
            self.prefetch_after(&file);
        }
        let mut outcome = self.start_fetch(&file);
        let found = loop {
            if let Some(result) = outcome.borrow_and_update().clone() {
                break result?;
            }
            if outcome.changed().await.is_err() {
                return Err(RestoreError::Transient(
                    "the fetch stopped without an answer".to_owned(),
                ));
            }
        };
        lock(&self.spooled).remove(name);
        if !found {
            self.check_not_needed(&file).await?;
            return Ok(false);
        }
        let spooled = self.spool.join(name);
        std::fs::rename(&spooled, destination).map_err(|error| {
            RestoreError::Transient(format!(
                "cannot move {} to {}: {error}",
                spooled.display(),
                destination.display()
            ))
        })?;
        tracing::debug!(file = name, "WAL file restored");
        Ok(true)
    }

    /// Starts fetching the segments after `file` on its timeline.
    fn prefetch_after(self: &Arc<Self>, file: &WalFileName) {
        let Some((timeline, segment)) = parse_segment_name(&file.name, SEGMENT_SIZE) else {
            return;
        };
        for next in (segment + 1)..=(segment + self.prefetch) {
            if let Some(next) = WalFileName::parse(&segment_name(timeline, next, SEGMENT_SIZE)) {
                self.start_fetch(&next);
            }
        }
    }

    /// The fetch of `file` into the spool: the one in flight or done, or a new one.
    fn start_fetch(self: &Arc<Self>, file: &WalFileName) -> watch::Receiver<Outcome> {
        let mut fetches = lock(&self.fetches);
        if let Some(outcome) = fetches.get(&file.name) {
            return outcome.clone();
        }
        let (sender, outcome) = watch::channel(None);
        if lock(&self.spooled).contains(&file.name) {
            let _ = sender.send(Some(Ok(true)));
            return outcome;
        }
        fetches.insert(file.name.clone(), outcome.clone());
        let restorer = self.clone();
        let file = file.clone();
        tokio::spawn(async move {
            let result = restorer.fetch(&file).await;
            lock(&restorer.fetches).remove(&file.name);
            if matches!(result, Ok(true)) {
                lock(&restorer.spooled).insert(file.name.clone());
            }
            let _ = sender.send(Some(result));
        });
        outcome
    }

    async fn fetch(&self, file: &WalFileName) -> Result<bool, RestoreError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| RestoreError::Transient("the restorer is closed".to_owned()))?;
        let key = file.key(&self.root);
        let Some(fetched) = wal::fetch_file(&self.bucket, &key)
            .await
            .map_err(|error| RestoreError::Transient(error.to_string()))?
        else {
            return Ok(false);
        };
        let path = self.spool.join(&file.name);
        tokio::task::spawn_blocking(move || decode_to(&key, &fetched, &path))
            .await
            .map_err(|error| RestoreError::Transient(format!("the decoding task failed: {error}")))?
            .map(|()| true)
    }

    /// A file the archive lacks is the end of the archive, unless something after it is
    /// stored: then it is a gap, and recovery must not end there.
    async fn check_not_needed(&self, file: &WalFileName) -> Result<(), RestoreError> {
        let transient = |error: pgkube_controllers::storage::StorageError| {
            RestoreError::Transient(error.to_string())
        };
        let timeline_dir = format!("{}{}/", self.root, file.timeline);
        match file.kind {
            WalFileKind::Segment => {
                let after = format!("{timeline_dir}{}", file.name);
                let later = wal::next_key(&self.bucket, &timeline_dir, &after)
                    .await
                    .map_err(transient)?
                    .filter(|key| !key.ends_with(".history.zst"));
                match later {
                    Some(later) => Err(RestoreError::Broken(format!(
                        "the archive has a gap: {after}.zst is missing while {later} is stored"
                    ))),
                    None => Ok(()),
                }
            }
            // Timeline 1 starts with the database: it has no history file.
            WalFileKind::TimelineHistory if file.timeline == "00000001" => Ok(()),
            WalFileKind::TimelineHistory => {
                let has_segments = wal::any_under(&self.bucket, &timeline_dir)
                    .await
                    .map_err(transient)?;
                match has_segments {
                    true => Err(RestoreError::Broken(format!(
                        "the history file {timeline_dir}{}.zst is missing while timeline {} has WAL in the archive",
                        file.name, file.timeline
                    ))),
                    false => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }
}

/// Decodes `fetched` into `path` (through a partial file), checking it against what the
/// archiver recorded.
fn decode_to(key: &str, fetched: &FetchedFile, path: &Path) -> Result<(), RestoreError> {
    let original = zstd::stream::decode_all(&fetched.compressed[..]).map_err(|error| {
        RestoreError::Broken(format!("{key} is corrupt: it does not decode ({error})"))
    })?;
    let sha256 = hex::encode(Sha256::digest(&original));
    if fetched
        .sha256
        .as_deref()
        .is_some_and(|stored| stored != sha256)
        || fetched
            .size
            .is_some_and(|size| size != original.len() as u64)
    {
        return Err(RestoreError::Broken(format!(
            "{key} is corrupt: its content ({} bytes, SHA-256 {sha256}) is not what was archived ({} bytes, {})",
            original.len(),
            fetched.size.map_or("?".to_owned(), |s| s.to_string()),
            fetched.sha256.as_deref().unwrap_or("?")
        )));
    }
    let partial = path.with_extension("partial");
    // No fsync: the spool is a cache that a restarted manager does not trust (it fetches
    // again), and PostgreSQL makes a restored file durable itself when it keeps it.
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&partial)?;
        file.write_all(&original)?;
        std::fs::rename(&partial, path)
    };
    write().map_err(|error| {
        RestoreError::Transient(format!("cannot write {}: {error}", path.display()))
    })
}

/// Serves restore requests on `path` until the task is dropped.
pub async fn serve(path: PathBuf, restorer: Arc<Restorer>) -> std::io::Result<()> {
    match std::fs::remove_file(&path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    let listener = UnixListener::bind(&path)?;
    tracing::info!(socket = %path.display(), "WAL restore socket listening");
    loop {
        let (stream, _) = listener.accept().await?;
        let restorer = restorer.clone();
        tokio::spawn(async move {
            if let Err(error) = answer(stream, &restorer).await {
                tracing::warn!(%error, "a restore request could not be answered");
            }
        });
    }
}

async fn answer(stream: tokio::net::UnixStream, restorer: &Arc<Restorer>) -> std::io::Result<()> {
    let (reader, mut writer) = stream.into_split();
    let mut line = String::new();
    tokio::io::BufReader::new(tokio::io::AsyncReadExt::take(reader, MAX_REQUEST))
        .read_line(&mut line)
        .await?;
    let reply = match line.trim_end().split_once(' ') {
        Some((name, destination)) => match restorer.restore(name, Path::new(destination)).await {
            Ok(true) => "found\n".to_owned(),
            Ok(false) => "missing\n".to_owned(),
            Err(error) => format!("error: {}\n", error.replace('\n', " ")),
        },
        None => "error: the request is not `<file> <path>`\n".to_owned(),
    };
    writer.write_all(reply.as_bytes()).await?;
    writer.shutdown().await
}

/// What the client tells PostgreSQL.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    Found,
    Missing,
    Fatal(String),
}

/// The client `restore_command` runs: asks the manager at `socket` for `name`, to be put at
/// `destination` (relative to the server's directory, as PostgreSQL gives it).
pub fn request(socket: &Path, name: &str, destination: &Path) -> Answer {
    let destination = match std::env::current_dir() {
        Ok(dir) => dir.join(destination),
        Err(error) => return Answer::Fatal(format!("cannot find the current directory: {error}")),
    };
    let exchange = || -> std::io::Result<String> {
        let mut stream = UnixStream::connect(socket)?;
        stream.set_read_timeout(Some(ANSWER_TIMEOUT))?;
        stream.write_all(format!("{name} {}\n", destination.display()).as_bytes())?;
        let mut reply = String::new();
        BufReader::new(stream).read_line(&mut reply)?;
        Ok(reply)
    };
    match exchange() {
        Ok(reply) => match reply.trim_end() {
            "found" => Answer::Found,
            "missing" => Answer::Missing,
            other => Answer::Fatal(other.strip_prefix("error: ").unwrap_or(other).to_owned()),
        },
        // Never "missing": PostgreSQL would end the recovery there, short of the archive.
        Err(error) => Answer::Fatal(format!(
            "cannot ask the instance manager at {}: {error}",
            socket.display()
        )),
    }
}

/// `restore_command` for a manager whose binary is `binary` and socket `socket`.
pub fn restore_command(binary: &Path, socket: &Path) -> String {
    format!(
        "{} instance restore-wal --socket {} %f %p",
        super::super::archive::socket::shell_quote(&binary.to_string_lossy()),
        super::super::archive::socket::shell_quote(&socket.to_string_lossy())
    )
}

/// A poisoned lock only means a panic elsewhere; the data is still consistent here.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
