//! Point-in-time recovery by the first instance of a new cluster (`instance.json`'s
//! `recovery`, the operator's [`RecoveryOrder`]).
//!
//! 1. The base backup is restored into a side directory ([`base`]): parallel ranged GETs, its
//!    stored bytes checked against the manifest, zstd decoded, unpacked with every file checked
//!    against PostgreSQL's `backup_manifest` as it is written ([`unpack`]), and made durable.
//!    Its system identifier must be the one the order names. The marker records this cluster's uid (the database is now this cluster's) and `recovery.signal`
//!    asks for archive recovery; only then is the directory swapped in.
//! 2. The server starts with `restore_command` asking this manager for WAL ([`fetch`]), which
//!    fetches ahead, and with the order's target; at the target it promotes on a new timeline
//!    (`recovery_target_action = promote`). Until then the instance reports itself not ready,
//!    with the replayed location and time, so that the operator neither promotes it nor routes
//!    anything to it.
//! 3. When the server stops by itself during recovery, the recovery failed. A broken archive (a
//!    gap, a corrupt file, a missing history file) or a target never reached is for good: the
//!    reason is kept in the data directory ([`FAILED_FILE`]) and the instance waits, saying
//!    why, instead of starting over; the cluster is new, so nothing else is at stake. Anything
//!    else (the storage unreachable) makes the manager exit and the kubelet start it again, and
//!    recovery goes on from its last restartpoint.

pub mod backup_manifest;
mod base;
pub mod fetch;
pub mod in_place;
pub mod unpack;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use pgkube_controllers::storage::S3Bucket;
use pgkube_controllers::storage::recovery::{
    REPLAY_PROGRESS_PREFIX, RecoveryOrder, describe, target_settings,
};

use super::datadir;
use super::endpoint::InstanceStatus;
use super::identity::{self, Marker};
use super::server::Server;
use super::{Instance, sql};

/// Present in a data directory that the server recovers from the archive (PostgreSQL's own).
const RECOVERY_SIGNAL: &str = "recovery.signal";
/// Why the recovery of this data directory failed for good.
pub const FAILED_FILE: &str = "pgkube-recovery-failed";
/// How often progress is logged.
const LOG_EVERY: Duration = Duration::from_secs(30);

/// Whether the server will recover `pgdata` from the archive when it starts.
pub fn in_archive_recovery(pgdata: &Path) -> bool {
    pgdata.join(RECOVERY_SIGNAL).exists()
}

/// Why the recovery of `pgdata` failed for good, if it did.
pub fn failed(pgdata: &Path) -> Option<String> {
    std::fs::read_to_string(pgdata.join(FAILED_FILE)).ok()
}

/// The `postgresql.conf` lines of a server that recovers `order`: WAL through this manager,
/// replayed to the target.
pub fn settings(order: &RecoveryOrder, run_dir: &Path) -> String {
    let binary = std::env::current_exe().unwrap_or_else(|_| run_dir.join("pgkube"));
    format!(
        "# Point-in-time recovery from {}\nrestore_command = '{}'\n{}",
        order.backup.replace(['\n', '\''], "_"),
        fetch::restore_command(&binary, &run_dir.join(fetch::SOCKET_NAME)).replace('\'', "''"),
        target_settings(&order.target)
    )
}

/// The WAL restorer of a recovering instance and its socket.
pub struct Restoring {
    restorer: Arc<fetch::Restorer>,
    socket: tokio::task::JoinHandle<std::io::Result<()>>,
    pub(super) spool: std::path::PathBuf,
}

impl Drop for Restoring {
    fn drop(&mut self) {
        self.socket.abort();
    }
}

impl Instance {
    /// The order of this cluster's recovery.
    pub(super) fn recovery_order(&self) -> anyhow::Result<RecoveryOrder> {
        self.applied
            .topology
            .recovery
            .clone()
            .context("the operator's recovery order is gone from instance.json")
    }

    pub(super) async fn recovery_bucket(&self, order: &RecoveryOrder) -> anyhow::Result<S3Bucket> {
        // An in-place recovery reads the cluster's own archive, with the keys it archives with.
        let keys = match self.applied.topology.in_place {
            Some(_) => &self.args.s3_dir,
            None => &self.args.recovery_s3_dir,
        };
        let options = super::archive::s3_options(keys, &order.archive)?;
        Ok(S3Bucket::connect(&options).await?)
    }

    /// Restores the ordered base backup into the (empty) data directory, ready for archive
    /// recovery.
    pub(super) async fn restore_base_backup(&mut self) -> anyhow::Result<()> {
        let order = self.recovery_order()?;
        let _busy = self.board.busy("restoring the base backup");
        let pod = self.args.pod_name.clone();
        self.set_status(InstanceStatus::waiting(
            &pod,
            &format!("restoring the base backup {}", order.backup),
        ));
        let partial = base::partial_dir(&self.args.pgdata);
        datadir::remove_dir(&partial)?;
        create_private_dir(&partial)?;
        let bucket = self.recovery_bucket(&order).await?;
        let restored = match self.restore_into(&bucket, &order, &partial).await {
            Ok(restored) => restored,
            Err(error) => {
                datadir::remove_dir(&partial)?;
                return Err(error);
            }
        };
        tracing::info!(backup = %order.backup, stored_bytes = restored.stored_bytes, files = restored.files, bytes = restored.bytes, seconds = restored.seconds, "base backup restored and verified");
        datadir::swap_in(&partial, &self.args.pgdata)?;
        Ok(())
    }

    pub(super) async fn restore_into(
        &self,
        bucket: &S3Bucket,
        order: &RecoveryOrder,
        partial: &Path,
    ) -> anyhow::Result<base::Restored> {
        let restored = base::restore(bucket, &order.base, partial)
            .await
            .map_err(anyhow::Error::msg)?;
        let system = identity::system_identifier_of(partial).await?;
        anyhow::ensure!(
            system == order.system_identifier,
            "the base backup {} holds database {system}, not {} as its manifest says: it is not restored",
            order.backup,
            order.system_identifier
        );
        let marker = Marker {
            cluster_uid: self.applied.topology.cluster_uid.clone(),
            system_identifier: system,
        };
        identity::write_marker(partial, &marker)?;
        datadir::write_file(&partial.join(RECOVERY_SIGNAL), "", 0o600)?;
        Ok(restored)
    }

    /// Serves the recovering server's `restore_command`.
    pub(super) async fn start_restoring(&mut self) -> anyhow::Result<()> {
        let order = self.recovery_order()?;
        let bucket = self.recovery_bucket(&order).await?;
        let spool = self.args.pgdata.with_extension("wal-spool");
        datadir::remove_dir(&spool)?;
        create_private_dir(&spool)?;
        let restorer =
            fetch::Restorer::new(bucket, &order.archive.root, &spool, self.args.wal_prefetch);
        let socket = tokio::spawn(fetch::serve(
            self.args.run_dir.join(fetch::SOCKET_NAME),
            restorer.clone(),
        ));
        self.restoring = Some(Restoring {
            restorer,
            socket,
            spool,
        });
        Ok(())
    }

    /// Waits until the recovering server promoted, reporting its progress.
    pub(super) async fn await_recovery(&mut self, server: &mut Server) -> anyhow::Result<()> {
        let order = self.recovery_order()?;
        let _busy = self.board.busy("recovering");
        let target = describe(&order.target);
        let mut logged = Instant::now() - LOG_EVERY;
        loop {
            tokio::select! {
                exit = server.exited() => return Err(self.recovery_stopped(exit)),
                () = tokio::time::sleep(self.args.watch_period) => {}
            }
            let Some(progress) = self.replay_progress().await else {
                let why = format!(
                    "{REPLAY_PROGRESS_PREFIX}{target}: the server replays WAL, not yet consistent"
                );
                self.set_status(InstanceStatus::waiting(&self.args.pod_name, &why));
                continue;
            };
            if !progress.in_recovery {
                break;
            }
            let why = format!(
                "{REPLAY_PROGRESS_PREFIX}{target}: replayed to {} (last transaction at {})",
                progress.replayed_lsn.as_deref().unwrap_or("?"),
                progress.replayed_at.as_deref().unwrap_or("none yet")
            );
            if logged.elapsed() >= LOG_EVERY {
                tracing::info!("{why}");
                logged = Instant::now();
            }
            self.set_status(InstanceStatus::waiting(&self.args.pod_name, &why));
        }
        self.finish_recovery()
    }

    async fn replay_progress(&self) -> Option<sql::ReplayProgress> {
        let superuser = &self.applied.superuser.username;
        let client = sql::connect_local(&self.args.socket_dir, self.args.port, superuser)
            .await
            .ok()?;
        sql::replay_progress(&client).await.ok()
    }

    /// The server stopped by itself during recovery: why, kept for good unless it may pass.
    fn recovery_stopped(
        &mut self,
        exit: std::io::Result<std::process::ExitStatus>,
    ) -> anyhow::Error {
        let restored = self
            .restoring
            .as_ref()
            .and_then(|r| r.restorer.last_error());
        let why = match restored {
            Some(fetch::RestoreError::Transient(error)) => {
                return anyhow::anyhow!(
                    "the recovery stopped: {error}; it goes on when the manager starts again"
                );
            }
            Some(fetch::RestoreError::Broken(error)) => error,
            None => format!(
                "PostgreSQL stopped during recovery ({}); its log says why (a target beyond the archived WAL, or one the server does not accept)",
                match exit {
                    Ok(status) => status.to_string(),
                    Err(error) => error.to_string(),
                }
            ),
        };
        let text = format!("the recovery failed: {why}");
        if let Err(error) = datadir::write_file(&self.args.pgdata.join(FAILED_FILE), &text, 0o600) {
            tracing::error!(%error, "cannot record why the recovery failed");
        }
        anyhow::anyhow!(text)
    }

    /// After the promotion: the restorer goes, and the configuration loses the recovery
    /// settings (a later standby of this data must never read the source's archive).
    fn finish_recovery(&mut self) -> anyhow::Result<()> {
        if let Some(restoring) = self.restoring.take() {
            datadir::remove_dir(&restoring.spool)?;
        }
        let desired = self.applied.clone();
        self.write_files(&desired)?;
        tracing::info!("recovery complete: the server promoted");
        Ok(())
    }

    /// A data directory whose recovery failed for good: the instance waits, saying why.
    pub(super) async fn wait_after_failed_recovery(&mut self, why: &str) {
        tracing::error!("{why}");
        let _busy = self.board.busy("waiting: the recovery failed");
        let message = format!("{why}; delete the cluster and its volumes to recover again");
        self.set_status(InstanceStatus::waiting(&self.args.pod_name, &message));
        std::future::pending::<()>().await;
    }
}

pub(super) fn create_private_dir(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .with_context(|| format!("cannot create {}", path.display()))
}
