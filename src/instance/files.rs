//! The mounted files applied to the data directory: the manager re-reads the ConfigMap, the
//! Secrets and the certificates, and writes the server's configuration when any changed (the
//! reload follows with the next connection use).

use super::datadir::{self, Role};
use super::desired::Desired;
use super::ha::{self, Designation};
use super::{Instance, Target, archive, recover};

impl Instance {
    /// Re-reads the mounted files and writes what changed into the data directory; the primary
    /// to follow when instance.json names another one ([`ha::on_new_designation`]).
    pub(super) fn apply_files(&mut self) -> Option<Target> {
        let desired = match Desired::load(&self.sources) {
            Ok(desired) => desired,
            Err(error) => {
                tracing::warn!(%error, "keeping the settings last read");
                return None;
            }
        };
        // A renewed certificate changes no other file: it is looked at on its own.
        let certificates_changed = self.install_tls().unwrap_or_else(|error| {
            tracing::warn!(%error, "keeping the certificates last installed");
            false
        });
        if desired == self.applied && !certificates_changed {
            return None;
        }
        if let Err(error) = self.write_files(&desired) {
            tracing::warn!(%error, "cannot write the new settings");
            return None;
        }
        let mut follow = None;
        if desired.topology.primary != self.applied.topology.primary {
            let pod = &self.args.pod_name;
            match ha::on_new_designation(pod, self.role, self.following(), &desired.topology) {
                Designation::Keep => {}
                Designation::WaitForPromote => tracing::info!(
                    "instance.json names this standby the primary; only /control/promote promotes it"
                ),
                Designation::Follow(target) => {
                    tracing::info!(primary = %target.pod, "instance.json names another primary");
                    follow = Some(target);
                }
            }
        }
        if desired.superuser != self.applied.superuser
            || desired.replication != self.applied.replication
            || desired.application != self.applied.application
        {
            self.credentials_applied = false;
        }
        self.archiver.configure(archive::settings_of(&desired));
        self.applied = desired;
        follow
    }

    pub(super) fn write_files(&mut self, desired: &Desired) -> anyhow::Result<()> {
        let pgpass_file = self.write_passfiles(desired)?;
        self.install_tls()?;
        let tls = self.server_tls(desired);
        let upstream = match self.role {
            Role::Primary => None,
            Role::Replica => self.upstream.as_ref().map(|target| target.host.as_str()),
        };
        let mut config = datadir::server_config(
            desired,
            &self.args.pod_name,
            upstream,
            &pgpass_file,
            &self.floors,
            &archive::command(&self.args.run_dir),
            tls.as_ref(),
        );
        if let Some(order) = desired.topology.recovery.as_ref()
            && recover::in_archive_recovery(&self.args.pgdata)
        {
            config.push_str(&recover::settings(order, &self.args.run_dir));
        }
        if datadir::write_config(&self.args.pgdata, &config, &desired.pg_hba_conf)? {
            tracing::info!("configuration files changed; reloading");
            self.changed_since_start = true;
            // The reload itself happens with the next connection use.
            self.reload_pending = true;
        }
        Ok(())
    }
}
