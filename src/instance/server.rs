//! The `postgres` server, a child of the instance manager.
//!
//! PostgreSQL's own signals choose how it stops: SIGTERM waits for clients (smart), SIGINT
//! disconnects them and checkpoints (fast), SIGQUIT stops at once and recovers at the next
//! start (immediate). [`Server::stop`] asks for fast, then immediate when the time is up, then
//! kills, so that the pod's grace period is never exceeded. [`Server::kill`] kills at once: a
//! postmaster that hangs handles no signal, and its backends go on serving their clients until
//! it is gone.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// After an immediate shutdown, how long before the server is killed outright; after a kill,
/// how long before the manager gives up waiting for the postmaster to exit.
const IMMEDIATE_GRACE: Duration = Duration::from_secs(5);
/// After a kill, how long the postmaster's children may take to notice and exit.
const ORPHANS_GRACE: Duration = Duration::from_secs(10);

/// A running server.
pub struct Server {
    child: Child,
    pgdata: PathBuf,
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
            child,
            pgdata: pgdata.to_owned(),
        })
    }

    /// Sends `signal` to the postmaster (it relays to its own children as needed).
    pub fn signal(&self, signal: Signal) {
        let Some(pid) = self.child.id().and_then(|id| i32::try_from(id).ok()) else {
            return;
        };
        if let Err(error) = kill(Pid::from_raw(pid), signal) {
            tracing::warn!(%error, ?signal, "cannot signal postgres");
        }
    }

    /// Waits for the server to exit by itself.
    pub async fn exited(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Fast shutdown, immediate after `timeout`, a kill after a few more seconds. Returns how
    /// it ended: `Clean` only for a fast shutdown that completed (checkpoint written, no
    /// recovery at the next start).
    pub async fn stop(mut self, timeout: Duration) -> Shutdown {
        self.signal(Signal::SIGINT);
        if let Ok(status) = tokio::time::timeout(timeout, self.child.wait()).await {
            return Shutdown::from_status(status, Shutdown::Clean);
        }
        tracing::warn!(
            ?timeout,
            "fast shutdown did not finish in time; immediate shutdown"
        );
        self.signal(Signal::SIGQUIT);
        if let Ok(status) = tokio::time::timeout(IMMEDIATE_GRACE, self.child.wait()).await {
            return Shutdown::from_status(status, Shutdown::Immediate);
        }
        tracing::error!("immediate shutdown did not finish; killing postgres");
        self.kill().await
    }

    /// Kills the postmaster at once, then waits until its children, which notice its death,
    /// have exited: a new postmaster does not start while one of them still holds the old
    /// shared memory.
    pub async fn kill(mut self) -> Shutdown {
        if let Err(error) = self.child.start_kill() {
            tracing::error!(%error, "cannot kill postgres");
        }
        if tokio::time::timeout(IMMEDIATE_GRACE, self.child.wait())
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
