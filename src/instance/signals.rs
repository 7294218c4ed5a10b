//! The signals the instance manager handles as PID 1, and how each asks it to stop.

use tokio::signal::unix::{SignalKind, signal};

/// How the manager was asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopRequest {
    /// SIGTERM (the kubelet) or SIGINT: fast, then immediate.
    Fast,
    /// SIGQUIT: immediate at once.
    Immediate,
}

/// The signals the manager handles, as PID 1 must (the kernel ignores unhandled ones for it).
pub struct Signals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn install() -> std::io::Result<Self> {
        Ok(Self {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
            quit: signal(SignalKind::quit())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal; a hangup is `None` (pass it on), the others ask to stop.
    pub async fn next(&mut self) -> Option<StopRequest> {
        tokio::select! {
            _ = self.terminate.recv() => Some(StopRequest::Fast),
            _ = self.interrupt.recv() => Some(StopRequest::Fast),
            _ = self.quit.recv() => Some(StopRequest::Immediate),
            _ = self.hangup.recv() => None,
        }
    }

    /// Waits for a signal that asks to stop.
    pub async fn stop_requested(&mut self) -> StopRequest {
        loop {
            if let Some(request) = self.next().await {
                return request;
            }
        }
    }
}
