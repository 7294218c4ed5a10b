//! The steps that make, replace or rewrite this instance's data, in one place, each after
//! checking which database it acts on ([`identity`]):
//!
//! - initdb, only when the plan says so: the designated primary of a cluster whose database the
//!   operator has not recorded yet. The new database's marker records the cluster's uid.
//! - a clone of another instance, into a side directory, swapped in only once complete
//!   ([`datadir::swap_in`]), and only from an instance that holds the cluster's database and,
//!   when it replaces data, the same database as that data;
//! - pg_rewind, only to an instance that holds the same database (pg_rewind would refuse
//!   another one, and its failure would otherwise lead to a clone that replaces the data).
//!
//! A refused step is not an error: the instance waits, reports why in its status (the operator
//! shows it in the cluster's conditions), and checks again when another primary is named (an
//! order, or `instance.json`) or every few seconds.

use anyhow::Context as _;

use super::control::Target;
use super::datadir;
use super::desired::slot_name;
use super::endpoint::InstanceStatus;
use super::identity::{self, Marker};
use super::{Instance, sql};

impl Instance {
    /// A new database for a new cluster, made aside and moved in place when complete, with its
    /// marker.
    pub(super) async fn initdb(&mut self) -> anyhow::Result<()> {
        let partial = self.args.pgdata.with_extension("initdb");
        datadir::remove_dir(&partial)?;
        datadir::initdb(&partial, &self.applied.superuser).await?;
        let marker = Marker {
            cluster_uid: self.applied.topology.cluster_uid.clone(),
            system_identifier: identity::system_identifier_of(&partial).await?,
        };
        identity::write_marker(&partial, &marker)?;
        tracing::info!(system_identifier = %marker.system_identifier, "new database made");
        std::fs::rename(&partial, &self.args.pgdata)
            .with_context(|| format!("cannot move {} in place", partial.display()))
    }

    /// The system identifier of this instance's data, none when it has none.
    async fn local_identity(&self) -> anyhow::Result<Option<String>> {
        if datadir::DataState::of(&self.args.pgdata) == datadir::DataState::Empty {
            return Ok(None);
        }
        Ok(Some(
            identity::system_identifier_of(&self.args.pgdata).await?,
        ))
    }

    /// The database `target` holds, if it answers.
    async fn identity_of(&self, target: &Target) -> Result<String, String> {
        let client = self
            .connect_as_superuser(target)
            .await
            .ok_or_else(|| format!("waiting for {} to answer", target.pod))?;
        sql::system_identifier(&client)
            .await
            .map_err(|error| format!("cannot read the database of {}: {error}", target.pod))
    }

    /// Waits until `target` (or the primary named meanwhile) answers and may replace data whose
    /// database is `local`; returns it.
    async fn checked_source(&mut self, mut target: Target, local: Option<&str>) -> Target {
        let mut reported: Option<String> = None;
        loop {
            let checked = match self.identity_of(&target).await {
                Ok(source) => identity::check_replacement(
                    self.applied.topology.system_identifier.as_deref(),
                    local,
                    &target.pod,
                    &source,
                )
                .map_err(|mismatch| mismatch.to_string()),
                Err(waiting) => Err(waiting),
            };
            let Err(why) = checked else {
                return target;
            };
            if reported.as_deref() != Some(why.as_str()) {
                tracing::warn!(primary = %target.pod, %why, "data not copied yet");
                self.set_status(InstanceStatus::waiting(&self.args.pod_name, &why));
                reported = Some(why);
            }
            target = self.wait_for_orders(target).await;
        }
    }

    /// A first copy of the upstream into the empty data directory.
    pub(super) async fn clone_upstream(&mut self) -> anyhow::Result<()> {
        let target = self.upstream.clone().context("no primary to clone")?;
        let target = self.checked_source(target, None).await;
        self.clone_from(target).await
    }

    /// Replaces this instance's data with a new copy of `target`'s, once `target` is known to
    /// hold the same database; the old data stays until the copy is complete.
    pub(super) async fn replace_with_clone(&mut self, target: Target) -> anyhow::Result<()> {
        let local = self.local_identity().await?;
        let target = self.checked_source(target, local.as_deref()).await;
        tracing::warn!(primary = %target.pod, "this instance's data is replaced with a new copy of the primary's, swapped in once complete");
        self.clone_from(target).await
    }

    /// pg_basebackup of `target`, with this instance's slot made there first so that it keeps
    /// the WAL the copy needs from its first byte on.
    async fn clone_from(&mut self, target: Target) -> anyhow::Result<()> {
        let client = self.wait_for(&target).await;
        let slot = slot_name(&self.args.pod_name);
        match sql::slot_state(&client, &slot).await? {
            Some(false) => {}
            Some(true) => {
                // A slot whose WAL is lost serves no clone; made again, it keeps WAL from now.
                sql::drop_own_slot(&client, &slot).await?;
                sql::create_slot(&client, &slot).await?;
            }
            None => sql::create_slot(&client, &slot).await?,
        }
        self.slot_on_upstream = true;
        self.upstream = Some(target.clone());
        datadir::clone_primary(
            &self.args.pgdata,
            &target.host,
            self.applied.topology.port,
            &self.args.pod_name,
            &self.args.run_dir.join("pgpass"),
            &self.applied.replication,
            self.client_tls(crate::tls::ClientRole::Replication)
                .as_ref(),
        )
        .await?;
        Ok(())
    }

    /// pg_rewind to `target`'s history once it is known to hold the same database, with this
    /// instance's slot made on it first so that it keeps the WAL from then on; a new clone
    /// (swapped in when complete) when the rewind fails. Returns the primary it now follows
    /// (another one when the operator named another while this one waited).
    pub(super) async fn rewind_to(&mut self, target: &Target) -> anyhow::Result<Target> {
        let local = self.local_identity().await?;
        let target = self.checked_source(target.clone(), local.as_deref()).await;
        self.slot_on_upstream = self.make_slot_on(&target.host).await.is_ok();
        self.write_passfiles(&self.applied.clone())?;
        let conninfo = datadir::superuser_conninfo(
            &target.host,
            self.applied.topology.port,
            &self.applied.superuser,
            &self.args.pod_name,
            &self.args.run_dir.join("pgpass-superuser"),
            self.client_tls(crate::tls::ClientRole::Superuser).as_ref(),
        );
        tracing::info!(primary = %target.pod, "rewinding to the new primary's history");
        match datadir::rewind(&self.args.pgdata, &conninfo).await {
            Ok(()) => {
                tracing::info!(primary = %target.pod, "rewound");
                // pg_rewind copies the source's files, standby.signal never among them.
                datadir::set_standby(&self.args.pgdata, true)?;
                Ok(target)
            }
            Err(error) => {
                // Its database was checked just before; a failed rewind may have left the
                // control file unreadable.
                tracing::warn!(%error, "pg_rewind failed; this instance is cloned afresh from the new primary, swapped in once complete");
                self.clone_from(target.clone()).await?;
                Ok(target)
            }
        }
    }
}
