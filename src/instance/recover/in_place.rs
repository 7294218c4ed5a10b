//! In-place point-in-time recovery, on the instance's side (`instance.json`'s `inPlace`, the
//! operator's [`InPlaceOrder`]).
//!
//! - **The primary** stops its server, restores the base backup into a side directory (checked
//!   as for a new cluster, [`super::base`]), renames its data directory aside
//!   (`pgdata.before-<restore uid>`, never deleted by pgkube), renames the restored one in and
//!   replays the archive to the target, where the server promotes on a new timeline. If
//!   anything fails, the recovered directory goes and the old one is renamed back: the server
//!   starts on exactly the data it had.
//! - **A replica** stops its server while the primary recovers, then replaces its data with a
//!   clone of the recovered primary (the clone is complete before the old copy goes).
//!
//! Each instance keeps a record next to its data directory ([`record_path`]): the restore it
//! handled and how it ended. It is what the instance reports, and it makes every step happen
//! once: a manager that restarts in the middle of a recovery finds the record `Recovering` and
//! rolls back, and one that restarts after never starts over.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use pgkube_controllers::storage::recovery::in_place::{
    InPlaceOrder, InPlaceReport, InPlaceStage, InPlaceState,
};

use super::super::Instance;
use super::super::control::Target;
use super::super::datadir::{self, DataState, Role};
use super::super::desired::Desired;
use super::super::endpoint::InstanceStatus;
use super::super::server::Server;
use super::base;

/// What an instance has to do for the operator's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Due {
    Nothing,
    /// The primary recovers.
    Recover(String),
    /// A replica stops and waits for the primary.
    Wait(String),
    /// A replica clones the recovered primary.
    Reclone(String),
}

/// What `pod` does for `order`, given its record (pure): each step once per restore.
pub fn due(
    pod: &str,
    primary: &str,
    order: Option<&InPlaceOrder>,
    record: Option<&InPlaceReport>,
) -> Due {
    let Some(order) = order else {
        return Due::Nothing;
    };
    let done = record
        .filter(|record| record.id == order.id)
        .map(|record| record.state);
    let id = order.id.clone();
    if pod == primary {
        return match (order.stage, done) {
            (InPlaceStage::Recover, None) => Due::Recover(id),
            _ => Due::Nothing,
        };
    }
    match (order.stage, done) {
        (_, Some(InPlaceState::Recloned)) => Due::Nothing,
        (InPlaceStage::Recover, _) => Due::Wait(id),
        (InPlaceStage::Reclone, _) => Due::Reclone(id),
    }
}

/// The record of the last in-place recovery this instance handled.
pub fn record_path(pgdata: &Path) -> PathBuf {
    pgdata.with_extension("in-place.json")
}

/// Where the primary keeps its data directory from before the recovery `id`.
pub fn previous_data(pgdata: &Path, id: &str) -> PathBuf {
    pgdata.with_extension(format!("before-{id}"))
}

pub fn read_record(pgdata: &Path) -> Option<InPlaceReport> {
    let text = std::fs::read_to_string(record_path(pgdata)).ok()?;
    serde_json::from_str(&text)
        .inspect_err(|error| tracing::warn!(%error, "the in-place recovery record does not parse"))
        .ok()
}

impl Instance {
    /// What the files ask of this instance now.
    pub(in crate::instance) fn in_place_due(&self) -> Due {
        let topology = &self.applied.topology;
        due(
            &self.args.pod_name,
            &topology.primary,
            topology.in_place.as_ref(),
            self.in_place.as_ref(),
        )
    }

    /// Before the data directory is looked at: finishes what an in-place recovery asks of this
    /// instance. Returns the server when the primary recovered (it runs, promoted).
    pub(in crate::instance) async fn in_place_first(&mut self) -> anyhow::Result<Option<Server>> {
        self.roll_back_interrupted()?;
        if self.in_place_due() == Due::Nothing {
            return Ok(None);
        }
        // Long steps: the liveness probe must not restart the manager in the middle.
        let _busy = self.board.busy("in-place recovery");
        loop {
            match self.in_place_due() {
                Due::Nothing => return Ok(None),
                Due::Recover(id) => return self.recover_in_place(&id).await,
                Due::Reclone(id) => {
                    self.reclone_in_place(&id).await?;
                    return Ok(None);
                }
                Due::Wait(id) => self.wait_for_primary_recovery(&id).await?,
            }
        }
    }

    fn write_record(&mut self, report: InPlaceReport) -> anyhow::Result<()> {
        let text = serde_json::to_string(&report)?;
        datadir::write_file(&record_path(&self.args.pgdata), &text, 0o600)?;
        self.in_place = Some(report);
        Ok(())
    }

    /// A manager that stopped in the middle of a recovery: the old data goes back.
    fn roll_back_interrupted(&mut self) -> anyhow::Result<()> {
        let Some(record) = self.in_place.clone() else {
            return Ok(());
        };
        if record.state != InPlaceState::Recovering {
            return Ok(());
        }
        self.roll_back(
            &record.id,
            "the instance manager stopped during the recovery; the old data is back",
        )
    }

    /// The primary: the recovery, or the old data back with why it failed.
    async fn recover_in_place(&mut self, id: &str) -> anyhow::Result<Option<Server>> {
        self.write_record(InPlaceReport::new(id, InPlaceState::Recovering, None))?;
        self.role = Role::Primary;
        self.upstream = None;
        let previous = previous_data(&self.args.pgdata, id);
        match self.replace_by_recovery(&previous).await {
            Ok(server) => {
                let kept = previous.display().to_string();
                tracing::info!(previous = %kept, "in-place recovery complete; the data from before is kept");
                self.write_record(InPlaceReport::new(id, InPlaceState::Recovered, Some(kept)))?;
                Ok(Some(server))
            }
            Err(error) => {
                let why = format!("{error:#}");
                tracing::error!(%why, "the in-place recovery failed; the old data goes back");
                self.roll_back(id, &why)?;
                Ok(None)
            }
        }
    }

    /// Restores the base backup aside, swaps it in (the old data renamed, not removed) and
    /// replays to the target.
    async fn replace_by_recovery(&mut self, previous: &Path) -> anyhow::Result<Server> {
        let order = self.recovery_order()?;
        let partial = base::partial_dir(&self.args.pgdata);
        datadir::remove_dir(&partial)?;
        super::create_private_dir(&partial)?;
        self.set_status(InstanceStatus::waiting(
            &self.args.pod_name,
            &format!(
                "recovering in place: restoring the base backup {}",
                order.backup
            ),
        ));
        let bucket = self.recovery_bucket(&order).await?;
        let restored = self.restore_into(&bucket, &order, &partial).await?;
        tracing::info!(backup = %order.backup, bytes = restored.stored_bytes, seconds = restored.seconds, "base backup restored and verified");
        let pgdata = self.args.pgdata.clone();
        std::fs::rename(&pgdata, previous)
            .with_context(|| format!("cannot move the old data aside to {}", previous.display()))?;
        std::fs::rename(&partial, &pgdata)
            .with_context(|| format!("cannot move the recovered data to {}", pgdata.display()))?;
        self.start_restoring().await?;
        let mut server = self.start_server().await?;
        if let Err(error) = self.await_recovery(&mut server).await {
            let shutdown = self.stop_server(server, Duration::ZERO).await;
            tracing::info!(?shutdown, "the recovering server is stopped");
            return Err(error);
        }
        Ok(server)
    }

    /// Puts the old data back in place of a failed recovery and records why.
    fn roll_back(&mut self, id: &str, why: &str) -> anyhow::Result<()> {
        let pgdata = self.args.pgdata.clone();
        let previous = previous_data(&pgdata, id);
        // Only when the old data is aside is the directory in place a recovery's, never the
        // only copy of the cluster's data.
        if previous.exists() {
            datadir::remove_dir(&pgdata)?;
            std::fs::rename(&previous, &pgdata).with_context(|| {
                format!("cannot move the old data back to {}", pgdata.display())
            })?;
        }
        datadir::remove_dir(&base::partial_dir(&pgdata))?;
        if let Some(restoring) = self.restoring.take() {
            datadir::remove_dir(&restoring.spool)?;
        }
        self.write_record(InPlaceReport::new(
            id,
            InPlaceState::Failed,
            Some(why.to_owned()),
        ))
    }

    /// A replica, stopped while the primary recovers: waits for the next stage.
    async fn wait_for_primary_recovery(&mut self, id: &str) -> anyhow::Result<()> {
        if self.in_place.as_ref().is_none_or(|record| record.id != id) {
            self.write_record(InPlaceReport::new(id, InPlaceState::Waiting, None))?;
        }
        let why = "stopped: the primary recovers in place; this replica is cloned again from it once it has";
        self.set_status(InstanceStatus::waiting(&self.args.pod_name, why));
        tokio::time::sleep(self.args.watch_period).await;
        match Desired::load(&self.sources) {
            Ok(desired) => {
                self.archiver
                    .configure(super::super::archive::settings_of(&desired));
                self.applied = desired;
            }
            Err(error) => tracing::warn!(%error, "keeping the settings last read"),
        }
        Ok(())
    }

    /// A replica: its data replaced by a clone of the recovered primary.
    async fn reclone_in_place(&mut self, id: &str) -> anyhow::Result<()> {
        let topology = &self.applied.topology;
        let target = Target {
            pod: topology.primary.clone(),
            host: topology.primary_host.clone(),
        };
        self.role = Role::Replica;
        self.set_status(InstanceStatus::waiting(
            &self.args.pod_name,
            "cloning the primary's recovered data",
        ));
        if DataState::of(&self.args.pgdata) == DataState::Empty {
            self.upstream = Some(target);
            self.clone_upstream().await?;
        } else {
            self.replace_with_clone(target).await?;
        }
        self.write_record(InPlaceReport::new(id, InPlaceState::Recloned, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(stage: InPlaceStage) -> InPlaceOrder {
        InPlaceOrder {
            id: "r1".to_owned(),
            stage,
        }
    }

    fn record(id: &str, state: InPlaceState) -> InPlaceReport {
        InPlaceReport::new(id, state, None)
    }

    #[test]
    fn the_primary_recovers_once_per_restore() {
        let recover = order(InPlaceStage::Recover);
        assert_eq!(
            due("c-0", "c-0", Some(&recover), None),
            Due::Recover("r1".to_owned())
        );
        assert_eq!(
            due(
                "c-0",
                "c-0",
                Some(&recover),
                Some(&record("r0", InPlaceState::Recovered))
            ),
            Due::Recover("r1".to_owned())
        );
        for state in [InPlaceState::Recovered, InPlaceState::Failed] {
            assert_eq!(
                due("c-0", "c-0", Some(&recover), Some(&record("r1", state))),
                Due::Nothing
            );
        }
        assert_eq!(
            due("c-0", "c-0", Some(&order(InPlaceStage::Reclone)), None),
            Due::Nothing
        );
    }

    #[test]
    fn a_replica_waits_then_clones_once() {
        let recover = order(InPlaceStage::Recover);
        let reclone = order(InPlaceStage::Reclone);
        assert_eq!(
            due("c-1", "c-0", Some(&recover), None),
            Due::Wait("r1".to_owned())
        );
        let waiting = record("r1", InPlaceState::Waiting);
        assert_eq!(
            due("c-1", "c-0", Some(&recover), Some(&waiting)),
            Due::Wait("r1".to_owned())
        );
        assert_eq!(
            due("c-1", "c-0", Some(&reclone), Some(&waiting)),
            Due::Reclone("r1".to_owned())
        );
        let recloned = record("r1", InPlaceState::Recloned);
        assert_eq!(
            due("c-1", "c-0", Some(&reclone), Some(&recloned)),
            Due::Nothing
        );
        assert_eq!(
            due("c-1", "c-0", Some(&recover), Some(&recloned)),
            Due::Nothing
        );
    }

    #[test]
    fn without_an_order_nothing_is_due() {
        let waiting = record("r1", InPlaceState::Waiting);
        assert_eq!(due("c-1", "c-0", None, Some(&waiting)), Due::Nothing);
        assert_eq!(due("c-0", "c-0", None, None), Due::Nothing);
    }

    #[test]
    fn old_data_and_the_record_sit_next_to_the_data_directory() {
        let pgdata = Path::new("/var/lib/postgresql/data/pgdata");
        assert_eq!(
            previous_data(pgdata, "0b9f"),
            Path::new("/var/lib/postgresql/data/pgdata.before-0b9f")
        );
        assert_eq!(
            record_path(pgdata),
            Path::new("/var/lib/postgresql/data/pgdata.in-place.json")
        );
    }
}
