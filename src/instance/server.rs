//! The `postgres` server, a child of the instance manager.
//!
//! PostgreSQL's own signals choose how it stops: SIGTERM waits for clients (smart), SIGINT
//! disconnects them and checkpoints (fast), SIGQUIT stops at once and recovers at the next
//! start (immediate). [`Server::stop`] asks for fast, then immediate when the time is up, then
//! kills, so that the pod's grace period is never exceeded.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// After an immediate shutdown, how long before the server is killed outright.
const IMMEDIATE_GRACE: Duration = Duration::from_secs(5);

/// A running server.
pub struct Server {
    child: Child,
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
        Ok(Self { child })
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
        if let Err(error) = self.child.kill().await {
            tracing::error!(%error, "cannot kill postgres");
        }
        Shutdown::Killed
    }
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
