//! How an instance takes its role: at start (from the data directory and `instance.json`,
//! [`datadir::plan`]) and on the operator's orders (`/control/promote`, `/control/follow`).
//!
//! - A designated standby (plan Promote) starts as a standby following no one and waits for
//!   `/control/promote`.
//! - A primary's data that is not the designated primary's (plan Demote), or whose instance
//!   finds another instance reporting itself primary at start, waits for that primary, rewinds
//!   to its history with pg_rewind (a new clone when that fails) and starts as its standby.
//! - A replica told to follow another primary rewrites its primary_conninfo and reloads, and
//!   makes its slot on the new primary (each tick until it exists: the new primary may still
//!   be a standby, where a slot can be made too and survives the promotion).
//! - A running primary told to follow shuts down cleanly; if the new primary already answers
//!   as a primary (failover) it rewinds to it, else (switchover: the target is promoted only
//!   once this one reports replica) it starts as a standby on its own data, which ends at its
//!   last WAL, sent to the target before the shutdown finished.
//!
//! A former primary's replication slots are removed before it starts as a standby: nobody
//! streams from a standby here, and they would keep WAL forever.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;

use super::control::Target;
use super::datadir::{self, DataState, Role, StartPlan};
use super::desired::slot_name;
use super::endpoint::InstanceStatus;
use super::endpoint::peer::PeerStatus;
use super::ha::{self, Rejoin, Wait};
use super::identity;
use super::server::{Server, Shutdown};
use super::{ControlRequest, Desired, Instance, Signals, sql};

/// How long a look at another instance (its `/status`, or a connection to it) may take.
const PEER_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a former primary asks again whether the new primary answers.
const REJOIN_RETRY: Duration = Duration::from_secs(2);
/// How long the manager waits for a statement of a promotion (the server cancels it at 10 s).
const SQL_TIMEOUT: Duration = Duration::from_secs(12);
/// How long the manager waits for `pg_promote`, which waits up to 60 s itself.
const PROMOTE_TIMEOUT: Duration = Duration::from_secs(75);

/// `work`, or an error once `limit` has passed.
async fn within<T, E: std::fmt::Display>(
    limit: Duration,
    work: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, work).await {
        Ok(result) => result.map_err(|error| error.to_string()),
        Err(_) => Err(format!("no answer within {limit:?}")),
    }
}

/// A replica's settings that must stay at what its primary ran with ([`datadir::standby_floors`]).
pub(super) async fn floors(
    role: Role,
    pgdata: &Path,
    desired: &Desired,
) -> Result<Vec<datadir::Floor>, datadir::DataDirError> {
    if role == Role::Primary {
        return Ok(Vec::new());
    }
    let recorded = datadir::recorded_settings(pgdata).await?;
    Ok(datadir::standby_floors(&desired.postgresql_conf, &recorded))
}

impl Instance {
    /// Makes the data directory ready, decides the role and starts `postgres`.
    pub(super) async fn prepare(&mut self) -> anyhow::Result<Server> {
        if let Some(server) = self.adopt().await? {
            return Ok(server);
        }
        self.wait_out_fence().await;
        self.write_passfiles(&self.applied.clone())?;
        datadir::recover_interrupted_swap(&self.args.pgdata)?;
        if let Some(server) = self.in_place_first().await? {
            return Ok(server);
        }
        let topology = self.applied.topology.clone();
        if let Some(why) = super::recover::failed(&self.args.pgdata) {
            self.wait_after_failed_recovery(&why).await;
        }
        let state = DataState::of(&self.args.pgdata);
        let initialized = topology.system_identifier.is_some();
        let plan = datadir::plan_start(
            &self.args.pod_name,
            &topology.primary,
            state,
            initialized,
            topology.recovery.is_some(),
        );
        tracing::info!(?state, ?plan, primary = %topology.primary, "starting");
        let designated = Target {
            pod: topology.primary.clone(),
            host: topology.primary_host.clone(),
        };
        self.role = plan.role();
        match plan {
            StartPlan::Initdb => self.initdb().await?,
            StartPlan::Recover => self.restore_base_backup().await?,
            StartPlan::Clone => {
                self.upstream = Some(designated);
                self.clone_upstream().await?;
            }
            StartPlan::Follow => {
                self.upstream = Some(designated);
                self.reclone_if_slot_gone().await?;
                self.rewind_if_diverged().await?;
            }
            StartPlan::WaitForData => {
                self.upstream = Some(self.wait_for_another_primary().await);
                self.clone_upstream().await?;
            }
            StartPlan::Promote => tracing::warn!(
                "this standby is the designated primary: it starts as a standby and waits for the operator's /control/promote"
            ),
            StartPlan::RunPrimary => {
                // A stale instance.json may name this instance still: the operator may have
                // moved the primary while it was away.
                if let Some(peer) = self.primary_peer().await {
                    tracing::warn!(primary = %peer.pod, "another instance reports itself primary: this one does not start as a primary but rejoins as its standby");
                    self.rejoin_stopped(peer, Wait::ForPrimary).await?;
                }
            }
            StartPlan::Demote => {
                tracing::warn!(primary = %designated.pod, "this instance holds a primary's data but is not the primary: it rejoins as the primary's standby and never takes writes");
                self.rejoin_stopped(designated, Wait::ForPrimary).await?;
            }
        }
        let recovering =
            self.role == Role::Primary && super::recover::in_archive_recovery(&self.args.pgdata);
        if recovering {
            self.start_restoring().await?;
        }
        let mut server = self.start_server().await?;
        if recovering {
            self.await_recovery(&mut server).await?;
        }
        Ok(server)
    }

    /// The designated primary with an empty volume: waits until another instance is named the
    /// primary (the operator fails over to one that has the cluster's database).
    async fn wait_for_another_primary(&mut self) -> Target {
        let topology = &self.applied.topology;
        let why = format!(
            "the data directory is empty, but the cluster's database {} exists: no new one is made; waiting for another instance that has it to be named the primary",
            topology.system_identifier.as_deref().unwrap_or_default()
        );
        tracing::warn!("{why}");
        self.set_status(InstanceStatus::waiting(&self.args.pod_name, &why));
        let mut target = Target {
            pod: topology.primary.clone(),
            host: topology.primary_host.clone(),
        };
        while target.pod == self.args.pod_name {
            target = self.wait_for_orders(target).await;
        }
        tracing::info!(primary = %target.pod, "another instance is the primary: cloning it");
        target
    }

    /// Writes the standby marker, the floors and the configuration, and starts `postgres`.
    pub(super) async fn start_server(&mut self) -> anyhow::Result<Server> {
        let pgdata = &self.args.pgdata;
        datadir::set_standby(pgdata, self.role == Role::Replica)?;
        self.floors = floors(self.role, pgdata, &self.applied).await?;
        let desired = self.applied.clone();
        self.write_files(&desired)?;
        // The server reads the files as they are now: nothing to reload or restart for.
        self.changed_since_start = false;
        self.reload_pending = false;
        self.credentials_applied = false;
        self.client = None;
        self.admission = sql::Admission::Accepted;
        self.stall.reset();
        self.initialized_by =
            identity::read_marker(&self.args.pgdata).and_then(|marker| marker.cluster_uid);
        Server::start(&self.args.pgdata).context("cannot start postgres")
    }

    /// The replication and superuser password files; returns the replication one's path.
    pub(super) fn write_passfiles(
        &self,
        desired: &super::Desired,
    ) -> anyhow::Result<std::path::PathBuf> {
        let replication = self.args.run_dir.join("pgpass");
        datadir::write_file(&replication, &datadir::pgpass(&desired.replication), 0o600)?;
        let superuser = self.args.run_dir.join("pgpass-superuser");
        datadir::write_file(&superuser, &datadir::pgpass(&desired.superuser), 0o600)?;
        Ok(replication)
    }

    /// Connects to `target` as the replication role, retrying until it answers.
    pub(super) async fn wait_for(&self, target: &Target) -> tokio_postgres::Client {
        let mut attempts: u64 = 0;
        loop {
            match self.connect_replication(&target.host).await {
                Ok(client) => return client,
                Err(error) => {
                    // Once, then every minute or so: a primary that takes a while is not news.
                    if attempts.is_multiple_of(30) {
                        tracing::warn!(host = %target.host, %error, "waiting for the primary");
                    }
                    attempts += 1;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        }
    }

    async fn connect_replication(&self, host: &str) -> anyhow::Result<tokio_postgres::Client> {
        let connect = sql::connect_remote(
            host,
            self.applied.topology.port,
            &self.applied.replication,
            &self.args.pod_name,
            self.client_tls(crate::tls::ClientRole::Replication),
        );
        Ok(tokio::time::timeout(PEER_TIMEOUT * 3, connect).await??)
    }

    /// A replica whose slot is gone from the primary was removed from the cluster (scaled
    /// down) or the primary is a new one: its copy is stale and is cloned again. A primary that
    /// does not answer within a while proves nothing: the replica starts on its data.
    async fn reclone_if_slot_gone(&mut self) -> anyhow::Result<()> {
        let Some(target) = self.upstream.clone() else {
            return Ok(());
        };
        let wait = tokio::time::timeout(Duration::from_secs(30), self.wait_for(&target));
        let Ok(client) = wait.await else {
            tracing::warn!("the primary does not answer; starting on the existing data");
            return Ok(());
        };
        if sql::in_recovery(&client).await.unwrap_or(false) {
            // A stale instance.json names a former primary, now a standby, whose slots went
            // when it rejoined: that proves nothing about this copy.
            tracing::warn!(primary = %target.pod, "the instance named primary is a standby; starting on the existing data");
            return Ok(());
        }
        let slot = slot_name(&self.args.pod_name);
        match sql::slot_exists(&client, &slot).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                tracing::warn!(%slot, "this replica's slot is gone from the primary (the instance was removed, or the primary is a new one): its copy is stale and is cloned again");
                self.replace_with_clone(target).await
            }
            Err(error) => {
                tracing::warn!(%error, "cannot look up this replica's slot; starting on the existing data");
                Ok(())
            }
        }
    }

    /// Another instance whose `/status` says it is a primary (each asked for at most
    /// [`PEER_TIMEOUT`]).
    async fn primary_peer(&self) -> Option<Target> {
        let answers = self.peer_statuses().await;
        let (target, _) = answers
            .into_iter()
            .find(|(_, body)| ha::reports_primary(body))?;
        Some(target)
    }

    /// The other instances that answer `GET /status`, with their answers (each asked for at
    /// most [`PEER_TIMEOUT`]; over TLS with the control token when this pod has certificates,
    /// as theirs then require: [`PeerStatus`]).
    pub(super) async fn peer_statuses(&self) -> Vec<(Target, String)> {
        let Some(client) = PeerStatus::new(
            &self.args.tls_dir,
            &self.args.control_dir.join("token"),
            self.args.status_port,
            PEER_TIMEOUT,
        ) else {
            return Vec::new();
        };
        let topology = &self.applied.topology;
        let mut answers = Vec::new();
        for pod in topology.instances() {
            if pod == self.args.pod_name {
                continue;
            }
            let Some(host) = topology.host_of(&pod) else {
                tracing::warn!(%pod, "cannot tell this instance's host; not asking it");
                continue;
            };
            match client.get(&host).await {
                Ok(body) => answers.push((Target { pod, host }, body)),
                Err(error) => tracing::info!(%pod, %error, "no status from this instance"),
            }
        }
        answers
    }

    /// Turns the stopped server's data (a primary's) into a standby's of `target`: waits as
    /// `wait` says, then rewinds or not ([`ha::rejoin_path`]). Orders that come meanwhile
    /// change the target.
    async fn rejoin_stopped(&mut self, mut target: Target, wait: Wait) -> anyhow::Result<()> {
        // Made on the new primary by the rewind or the clone, else by the ticks that follow.
        self.slot_on_upstream = false;
        let mut attempts: u64 = 0;
        let path = loop {
            // The mounted CAs may be newer than the last tick's copy, and verify the new primary.
            if let Err(error) = self.install_tls() {
                tracing::warn!(%error, "keeping the certificates last installed");
            }
            let answer = self.target_in_recovery(&target).await;
            if let Some(path) = ha::rejoin_path(answer, wait) {
                break path;
            }
            if attempts.is_multiple_of(15) {
                tracing::info!(primary = %target.pod, ?answer, ?wait, "waiting for the new primary before rejoining");
            }
            attempts += 1;
            target = self.wait_for_orders(target).await;
        };
        let pgdata = &self.args.pgdata;
        match path {
            Rejoin::Standby => {
                // Marked at once: a crash from here on restarts as a standby.
                datadir::set_standby(pgdata, true)?;
                tracing::info!(primary = %target.pod, "the new primary is still a standby (switchover): starting as its standby on this instance's data");
            }
            Rejoin::Rewind => target = self.rewind_to(&target).await?,
        }
        datadir::remove_slots(&self.args.pgdata)?;
        self.role = Role::Replica;
        self.upstream = Some(target);
        Ok(())
    }

    /// A connection to `target` as the superuser, if it answers in time.
    pub(super) async fn connect_as_superuser(
        &self,
        target: &Target,
    ) -> Option<tokio_postgres::Client> {
        let connect = sql::connect_remote(
            &target.host,
            self.applied.topology.port,
            &self.applied.superuser,
            &self.args.pod_name,
            self.client_tls(crate::tls::ClientRole::Superuser),
        );
        tokio::time::timeout(PEER_TIMEOUT * 3, connect)
            .await
            .ok()?
            .inspect_err(|error| tracing::debug!(%error, host = %target.host, "no answer"))
            .ok()
    }

    /// Whether `target` answers, as the superuser, and is in recovery.
    async fn target_in_recovery(&self, target: &Target) -> Option<bool> {
        let client = self.connect_as_superuser(target).await?;
        sql::in_recovery(&client).await.ok()
    }

    /// Waits [`REJOIN_RETRY`] for orders while the server is stopped: a follow order changes the
    /// target, a promotion is refused.
    pub(super) async fn wait_for_orders(&mut self, target: Target) -> Target {
        let sleep = tokio::time::sleep(REJOIN_RETRY);
        tokio::pin!(sleep);
        let mut target = target;
        loop {
            tokio::select! {
                _ = &mut sleep => return self.retarget_from_file(target),
                order = self.orders.recv(), if self.orders_open => match order {
                    None => self.orders_open = false,
                    Some(order) => match self.terms.admit(order) {
                        Some(ControlRequest::Follow(next)) => target = next,
                        Some(ControlRequest::Promote(reply)) => {
                            let _ = reply.send(Err("the server is not running: this instance is rejoining as a standby".to_owned()));
                        }
                        Some(ControlRequest::Upgrade(upgrade)) => {
                            upgrade.refuse("the server is not running".to_owned());
                        }
                        None => {}
                    },
                },
            }
        }
    }

    /// instance.json, read again while waiting: when it names another primary than before (and
    /// not this instance), that one is the target.
    fn retarget_from_file(&mut self, target: Target) -> Target {
        let Ok(desired) = super::Desired::load(&self.sources) else {
            return target;
        };
        let changed = desired.topology.primary != self.applied.topology.primary;
        let named = Target {
            pod: desired.topology.primary.clone(),
            host: desired.topology.primary_host.clone(),
        };
        // The files are written when the server starts.
        self.applied = desired;
        if changed && named.pod != self.args.pod_name && named != target {
            tracing::info!(primary = %named.pod, "instance.json names another primary");
            return named;
        }
        target
    }

    /// Makes this instance's slot on `host` unless it exists.
    pub(super) async fn make_slot_on(&self, host: &str) -> anyhow::Result<()> {
        let client = self.connect_replication(host).await?;
        let slot = slot_name(&self.args.pod_name);
        if !sql::slot_exists(&client, &slot).await? {
            sql::create_slot(&client, &slot).await?;
        }
        Ok(())
    }

    /// A replica told to follow a new primary makes its slot there; retried each tick.
    pub(super) async fn ensure_upstream_slot(&mut self) {
        if self.role != Role::Replica || self.slot_on_upstream {
            return;
        }
        let Some(target) = self.upstream.clone() else {
            return;
        };
        match self.make_slot_on(&target.host).await {
            Ok(()) => {
                tracing::info!(primary = %target.pod, "this replica's slot is on its primary");
                self.slot_on_upstream = true;
            }
            Err(error) => {
                tracing::debug!(%error, primary = %target.pod, "cannot make this replica's slot yet")
            }
        }
    }

    /// `/control/follow` or instance.json: become or stay a standby of `target`. A replica
    /// reloads with the new primary_conninfo; a primary stops and rejoins. Returns the server,
    /// or none when a signal asked to stop meanwhile.
    pub(super) async fn follow(
        &mut self,
        server: Server,
        target: Target,
        signals: &mut Signals,
    ) -> anyhow::Result<Option<Server>> {
        if self.role == Role::Replica {
            if self.upstream.as_ref() != Some(&target) {
                tracing::info!(primary = %target.pod, host = %target.host, "following a new primary");
            }
            // The slot first: a WAL receiver that finds none waits a retry interval (5 s)
            // before it asks again, and with synchronous replication commits wait meanwhile.
            self.slot_on_upstream = self.make_slot_on(&target.host).await.is_ok();
            self.upstream = Some(target);
            self.stall.reset();
            let desired = self.applied.clone();
            self.write_files(&desired)?;
            return Ok(Some(server));
        }
        tracing::warn!(primary = %target.pod, "told to follow another primary: this primary stops and rejoins as its standby");
        // It reports a primary until its server is down: the operator promotes no other before.
        let why = format!("stopping, to rejoin as a standby of {}", target.pod);
        self.set_status(self.board.status().not_ready(&why));
        let shutdown = self.stop_server(server, self.args.shutdown_timeout).await;
        self.set_status(InstanceStatus::starting(&self.args.pod_name));
        if shutdown != Shutdown::Clean {
            tracing::warn!(?shutdown, "the primary did not stop cleanly");
        }
        tokio::select! {
            rejoined = self.rejoin_stopped(target, Wait::ForAnswer) => rejoined?,
            request = signals.stop_requested() => {
                tracing::info!(?request, "stopping while rejoining");
                return Ok(None);
            }
        }
        Ok(Some(self.start_server().await?))
    }

    /// `/control/promote`: the status after the promotion, or why there was none.
    pub(super) async fn promote(&mut self) -> Result<InstanceStatus, String> {
        let Some(client) = self.client().await else {
            return Err("the server is not running".to_owned());
        };
        let in_recovery = within(SQL_TIMEOUT, sql::in_recovery(&client))
            .await
            .map_err(|error| format!("the server does not answer: {error}"))?;
        if in_recovery {
            tracing::warn!("promoting this standby (/control/promote)");
            match within(PROMOTE_TIMEOUT, sql::promote(&client)).await {
                Ok(true) => {}
                Ok(false) => return Err("the promotion did not finish within 60 s".to_owned()),
                Err(error) => return Err(format!("cannot promote: {error}")),
            }
        }
        if self.role != Role::Primary {
            self.become_primary();
        }
        let (state, admission) = tokio::join!(
            within(SQL_TIMEOUT, sql::observe(&client)),
            self.new_connection()
        );
        self.note_admission(&admission);
        let state =
            state.map_err(|error| format!("promoted, but the server does not answer: {error}"))?;
        let status = self.shown(state);
        self.set_status(status.clone());
        Ok(status)
    }

    /// After a promotion: the files of a primary, the passwords set again.
    fn become_primary(&mut self) {
        tracing::info!("this instance is the primary");
        self.role = Role::Primary;
        self.upstream = None;
        self.floors.clear();
        self.credentials_applied = false;
        // pg_promote removed standby.signal; make sure, so that a restart stays primary.
        if let Err(error) = datadir::set_standby(&self.args.pgdata, false) {
            tracing::warn!(%error, "cannot remove standby.signal");
        }
        let desired = self.applied.clone();
        if let Err(error) = self.write_files(&desired) {
            tracing::warn!(%error, "cannot write the primary's configuration");
        }
    }
}
