//! The `postgres` server, a child of the instance manager.
//!
//! PostgreSQL's own signals choose how it stops: SIGTERM waits for clients (smart), SIGINT
//! disconnects them and checkpoints (fast), SIGQUIT stops at once and recovers at the next
//! start (immediate). [`Server::stop`] asks for fast, then immediate when the time is up, then
//! kills, so that the pod's grace period is never exceeded. [`Server::kill`] kills at once: a
//! postmaster that hangs handles no signal, and its backends go on serving their clients until
//! it is gone.
//!
//! A server is either started by this manager or adopted from the manager that ran in this
//! process before an in-place upgrade ([`super::handover`]): the postmaster is then still this
//! process's child, but no [`Child`] handle survived the exec, so a thread waits for it.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// After an immediate shutdown, how long before the server is killed outright; after a kill,
/// how long before the manager gives up waiting for the postmaster to exit.
const IMMEDIATE_GRACE: Duration = Duration::from_secs(5);
/// After a kill, how long the postmaster's children may take to notice and exit.
const ORPHANS_GRACE: Duration = Duration::from_secs(10);

/// A running server.
pub struct Server {
    postmaster: Postmaster,
    pgdata: PathBuf,
}

/// The postmaster process, however it became this manager's.
enum Postmaster {
    Started(Child),
    Adopted(Adopted),
}

/// A postmaster started by the manager this process ran before its exec.
struct Adopted {
    pid: Pid,
    /// Set once, by the thread that waits for the process.
    exit: watch::Receiver<Option<Result<ExitStatus, std::io::ErrorKind>>>,
}

impl Server {
    /// Starts `postgres` on `pgdata`; its output goes to the container's log.
    pub fn start(pgdata: &Path) -> std::io::Result<Self> {
        let child = Command::new("postgres")
            .arg("-D")
            .arg(pgdata)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        tracing::info!(pid = child.id(), "postgres started");
        Ok(Self {
            postmaster: Postmaster::Started(child),
            pgdata: pgdata.to_owned(),
        })
    }

    /// Takes over the postmaster `pid`, a child of this process that a previous program of it
    /// started. Checked by the caller ([`super::handover`]).
    pub fn adopt(pid: u32, pgdata: &Path) -> std::io::Result<Self> {
        let raw = i32::try_from(pid).map_err(|_| std::io::Error::other("pid out of range"))?;
        let pid = Pid::from_raw(raw);
        let (sender, exit) = watch::channel(None);
        std::thread::Builder::new()
            .name("postmaster-wait".to_owned())
            .spawn(move || {
                let status = waitpid(pid, None)
                    .map(exit_status)
                    .map_err(|errno| std::io::Error::from(errno).kind());
                let _ = sender.send(Some(status));
            })?;
        tracing::info!(pid = raw, "postgres adopted");
        Ok(Self {
            postmaster: Postmaster::Adopted(Adopted { pid, exit }),
            pgdata: pgdata.to_owned(),
        })
    }

    /// The postmaster's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        match &self.postmaster {
            Postmaster::Started(child) => child.id(),
            Postmaster::Adopted(adopted) => u32::try_from(adopted.pid.as_raw()).ok(),
        }
    }

    /// Sends `signal` to the postmaster (it relays to its own children as needed).
    pub fn signal(&self, signal: Signal) {
        let Some(pid) = self.pid().and_then(|id| i32::try_from(id).ok()) else {
            return;
        };
        if let Err(error) = kill(Pid::from_raw(pid), signal) {
            tracing::warn!(%error, ?signal, "cannot signal postgres");
        }
    }

    /// Waits for the server to exit by itself.
    pub async fn exited(&mut self) -> std::io::Result<ExitStatus> {
        match &mut self.postmaster {
            Postmaster::Started(child) => child.wait().await,
            Postmaster::Adopted(adopted) => {
                let exit = adopted
                    .exit
                    .wait_for(Option::is_some)
                    .await
                    .map_err(|_| std::io::Error::other("the postmaster's waiter is gone"))?;
                match *exit {
                    Some(Ok(status)) => Ok(status),
                    Some(Err(kind)) => Err(kind.into()),
                    None => Err(std::io::Error::other("no exit status")),
                }
            }
        }
    }

    fn start_kill(&mut self) -> std::io::Result<()> {
        match &mut self.postmaster {
            Postmaster::Started(child) => child.start_kill(),
            Postmaster::Adopted(adopted) => {
                kill(adopted.pid, Signal::SIGKILL).map_err(std::io::Error::from)
            }
        }
    }

    /// Fast shutdown, immediate after `timeout`, a kill after a few more seconds. Returns how
    /// it ended: `Clean` only for a fast shutdown that completed (checkpoint written, no
    /// recovery at the next start).
    pub async fn stop(mut self, timeout: Duration) -> Shutdown {
        self.signal(Signal::SIGINT);
        if let Ok(status) = tokio::time::timeout(timeout, self.exited()).await {
            return Shutdown::from_status(status, Shutdown::Clean);
        }
        tracing::warn!(
            ?timeout,
            "fast shutdown did not finish in time; immediate shutdown"
        );
        self.signal(Signal::SIGQUIT);
        if let Ok(status) = tokio::time::timeout(IMMEDIATE_GRACE, self.exited()).await {
            return Shutdown::from_status(status, Shutdown::Immediate);
        }
        tracing::error!("immediate shutdown did not finish; killing postgres");
        self.kill().await
    }

    /// Kills the postmaster at once, then waits until its children, which notice its death,
    /// have exited: a new postmaster does not start while one of them still holds the old
    /// shared memory.
    pub async fn kill(mut self) -> Shutdown {
        if let Err(error) = self.start_kill() {
            tracing::error!(%error, "cannot kill postgres");
        }
        if tokio::time::timeout(IMMEDIATE_GRACE, self.exited())
            .await
            .is_err()
        {
            tracing::error!("postgres does not exit although killed");
        }
        let deadline = Instant::now() + ORPHANS_GRACE;
        let mut left = processes_in(&self.pgdata);
        while !left.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            left = processes_in(&self.pgdata);
        }
        if !left.is_empty() {
            tracing::warn!(pids = ?left, "processes of the killed postgres are still running");
        }
        Shutdown::Killed
    }
}

/// The exit status `wait` would have given for `status`.
fn exit_status(status: WaitStatus) -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    match status {
        WaitStatus::Exited(_, code) => ExitStatus::from_raw((code & 0xff) << 8),
        WaitStatus::Signaled(_, signal, core) => {
            ExitStatus::from_raw(signal as i32 | if core { 0x80 } else { 0 })
        }
        _ => ExitStatus::from_raw(0xff << 8),
    }
}

/// The processes whose working directory is `pgdata`: a postmaster and its children run there.
fn processes_in(pgdata: &Path) -> Vec<u32> {
    let (Ok(pgdata), Ok(entries)) = (pgdata.canonicalize(), std::fs::read_dir("/proc")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == pgdata))
        .collect()
}

/// How a stop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    Clean,
    Immediate,
    Killed,
    Failed,
}

impl Shutdown {
    fn from_status(status: std::io::Result<ExitStatus>, success: Shutdown) -> Shutdown {
        match status {
            Ok(status) if status.success() => success,
            Ok(status) => {
                tracing::warn!(%status, "postgres exited with an error while stopping");
                Shutdown::Failed
            }
            Err(error) => {
                tracing::error!(%error, "cannot wait for postgres");
                Shutdown::Failed
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    #[expect(
        clippy::zombie_processes,
        reason = "the adopted server waits for the children, as after a handover"
    )]
    async fn an_adopted_postmaster_is_signalled_and_its_exit_seen() {
        // Empty: no process runs there, so the kill does not wait for orphans.
        let pgdata = std::env::temp_dir().join(format!("pgkube-adopt-{}", std::process::id()));
        std::fs::create_dir_all(&pgdata).expect("temp dir");
        let exiting = std::process::Command::new("sh")
            .args(["-c", "exit 3"])
            .spawn()
            .expect("sh");
        let mut server = Server::adopt(exiting.id(), &pgdata).expect("adopt");
        let status = server.exited().await.expect("exit status");
        assert_eq!(status.code(), Some(3));
        // A second look at a finished server gives the same answer.
        assert_eq!(server.exited().await.expect("again").code(), Some(3));

        let running = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        let server = Server::adopt(running.id(), &pgdata).expect("adopt");
        assert_eq!(server.pid(), Some(running.id()));
        assert_eq!(server.kill().await, Shutdown::Killed);
        assert!(!std::path::Path::new(&format!("/proc/{}", running.id())).exists());
        std::fs::remove_dir_all(&pgdata).expect("clean up");
    }

    #[test]
    fn the_processes_running_in_a_directory_are_found() {
        let dir = std::env::temp_dir().join(format!("pgkube-cwd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .current_dir(&dir)
            .spawn()
            .expect("sleep");
        assert_eq!(processes_in(&dir), [child.id()]);
        child.kill().expect("kill");
        child.wait().expect("wait");
        assert_eq!(processes_in(&dir), Vec::<u32>::new());
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
