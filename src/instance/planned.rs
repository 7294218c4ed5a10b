//! A planned restart of the primary (pgkube issue 41): when settings the operator changed need
//! a restart and the cluster has replicas, the primary does not restart in place (writes would
//! fail meanwhile); the operator moves the primary to a replica that already runs the new
//! settings, with a switchover, and the old primary comes back as a replica with them.
//!
//! The operator asks for it in `instance.json` (`restartBySwitchover`, set when the cluster has
//! more than one instance). Replicas restart for changed settings as before. The primary
//! reports `restartBySwitchover` with its `pendingRestart` and waits; every instance reports a
//! `settingsDigest` of the operator's `postgresql.conf` its server has read, so that the
//! operator knows which replica runs what the primary waits for (same digest, nothing pending):
//! a replica whose mounted ConfigMap is not refreshed yet (a kubelet takes up to a minute) does
//! not count.
//!
//! The restart stays in place (as before) for one instance (nothing could take over), with an
//! operator that does not ask, for a user's own `ALTER SYSTEM` (not ours to restart for), and
//! when a setting that a standby needs at least as high as its primary's (`max_connections`...)
//! is lowered: replicas keep the old value until they replay the primary's change, which only
//! a restart of the primary writes, so a replica promoted first would restart in place too.

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::Instance;
use super::datadir::{self, Floor};
use super::endpoint::InstanceStatus;
use super::sql::ServerState;

/// How long reading the control file may take (`pg_controldata`, a local file), within the
/// tick's look at the server ([`super::tick::OBSERVE_BUDGET`]).
const CONTROLDATA_TIMEOUT: Duration = Duration::from_secs(1);

/// What to do about settings pending a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PendingRestart {
    /// Nothing pending, or nothing the instance manager changed (a user's `ALTER SYSTEM`).
    None,
    /// Restart the server now.
    InPlace,
    /// The primary waits for the operator's switchover.
    BySwitchover,
}

/// What a server with settings `pending` a restart does: only a change of the files since it
/// started is ours (`changed_since_start`); a `primary` leaves it to a switchover when the
/// operator asks (`by_switchover`), unless the change `lowers` a standby's minimum.
pub fn decide(
    pending: &[String],
    changed_since_start: bool,
    primary: bool,
    by_switchover: bool,
    lowers: bool,
) -> PendingRestart {
    if pending.is_empty() || !changed_since_start {
        PendingRestart::None
    } else if primary && by_switchover && !lowers {
        PendingRestart::BySwitchover
    } else {
        PendingRestart::InPlace
    }
}

/// Whether `config` asks for less of a setting than the control file records (`recorded`):
/// on a primary, what it runs with, which its standbys must not go below.
pub fn lowers_standby_minimum(config: &str, recorded: &[Floor]) -> bool {
    !datadir::standby_floors(config, recorded).is_empty()
}

/// The digest of the operator's `postgresql.conf` (the same file on every instance; an
/// instance's own lines are not in it): 16 hexadecimal digits of its SHA-256.
pub fn settings_digest(postgresql_conf: &str) -> String {
    hex::encode(&Sha256::digest(postgresql_conf.as_bytes())[..8])
}

/// `status` as the operator reads it for a planned restart: the `digest` of the settings the
/// server runs, if known; on a primary that waits for a switchover, the flag and, on a ready
/// one, why it does not restart.
pub fn marked(
    mut status: InstanceStatus,
    restart: PendingRestart,
    digest: Option<String>,
) -> InstanceStatus {
    status.settings_digest = digest;
    status.restart_by_switchover = restart == PendingRestart::BySwitchover;
    if status.restart_by_switchover && status.ready && status.message.is_none() {
        status.message = Some(format!(
            "the settings {} need a restart: left to a switchover to a replica that runs them",
            status.pending_restart.join(", ")
        ));
    }
    status
}

impl Instance {
    /// What to do about the settings `state` shows pending a restart.
    pub(super) async fn pending_restart(&self, state: &ServerState) -> PendingRestart {
        let primary = !state.in_recovery;
        let by_switchover = self.applied.topology.restart_by_switchover;
        let (pending, changed) = (&state.pending_restart, self.changed_since_start);
        // The control file is read only when it matters.
        let lowers = decide(pending, changed, primary, by_switchover, false)
            == PendingRestart::BySwitchover
            && self.lowers_standby_minimum().await;
        decide(pending, changed, primary, by_switchover, lowers)
    }

    /// Whether the files lower a setting below what this server runs with, by its control
    /// file; when that cannot be read, no (a switchover then, and the new primary restarts in
    /// place if it must).
    async fn lowers_standby_minimum(&self) -> bool {
        let read = datadir::recorded_settings(&self.args.pgdata);
        match tokio::time::timeout(CONTROLDATA_TIMEOUT, read).await {
            Ok(Ok(recorded)) => lowers_standby_minimum(&self.applied.postgresql_conf, &recorded),
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot read the settings the control file records");
                false
            }
            Err(_) => {
                tracing::warn!(timeout = ?CONTROLDATA_TIMEOUT, "pg_controldata did not answer");
                false
            }
        }
    }

    /// `status` marked for the operator ([`marked`]): the digest only when the server has read
    /// the files before this tick (`reloaded` now: it may not have applied them yet) and runs
    /// no setting kept at its primary's.
    pub(super) fn mark_planned_restart(
        &self,
        status: InstanceStatus,
        restart: PendingRestart,
        reloaded: bool,
    ) -> InstanceStatus {
        let runs_the_files = !reloaded && self.floors.is_empty();
        let digest = runs_the_files.then(|| settings_digest(&self.applied.postgresql_conf));
        let waiting_before = self.board.status().restart_by_switchover;
        let status = marked(status, restart, digest);
        if status.restart_by_switchover && !waiting_before {
            tracing::info!(settings = ?status.pending_restart, "changed settings need a restart; the primary leaves it to the operator's switchover");
        }
        status
    }
}

#[cfg(test)]
mod tests;
