//! `pgkube instance`: the instance manager, PID 1 of every PostgreSQL container.
//!
//! An init container runs `pgkube instance install /controller/pgkube` from the pgkube image,
//! which copies the binary into a volume shared with the PostgreSQL container; that container
//! runs the user's PostgreSQL image with `/controller/pgkube instance run` as its command. So the
//! PostgreSQL image stays the stock one, and the manager is always the operator's version.
//!
//! # What `run` does
//!
//! 1. Reads what the operator decided ([`desired`]): the ConfigMap's `postgresql.conf`,
//!    `pg_hba.conf` and `instance.json` (which pod is the primary, how many instances), and the
//!    superuser and replication Secrets.
//! 2. Prepares the data directory ([`datadir::plan`]): the designated primary of a new cluster
//!    runs initdb; every other instance makes its replication slot on the primary and clones it
//!    with pg_basebackup. A replica whose slot is gone was removed from the cluster (scaled
//!    down) or the primary is a new one: its copy is stale and is cloned again.
//! 3. Writes `postgresql.conf` (with the instance's `primary_conninfo` and slot on a replica)
//!    and `pg_hba.conf` into the data directory, and starts `postgres` as its child.
//! 4. Every `--watch-period`: re-reads the files; reloads the server when its configuration
//!    changed and restarts it when a changed setting needs a restart; sets the role passwords
//!    when a Secret changed (on the primary, without a restart); drops the slots of instances no
//!    longer in the cluster, after a grace period ([`slots`]); refreshes the status served by
//!    the [`endpoint`].
//! 5. On SIGTERM or SIGINT: a fast shutdown, immediate once `--shutdown-timeout` has passed,
//!    then exits. SIGQUIT asks for an immediate shutdown; SIGHUP is passed on (reload). If
//!    postgres exits by itself, so does the manager, with an error: the kubelet restarts the
//!    container.

mod datadir;
mod desired;
mod endpoint;
mod server;
mod slots;
mod sql;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

use datadir::{DataState, Role, StartPlan};
use desired::{Desired, Sources, slot_name};
use endpoint::{InstanceStatus, SharedStatus};
use server::{Server, Shutdown};

#[derive(Subcommand)]
pub enum InstanceCommand {
    /// Copy this binary to DESTINATION (run by the init container of PostgreSQL pods).
    Install {
        /// Where to put the binary, e.g. /controller/pgkube.
        destination: PathBuf,
    },
    /// Run PostgreSQL as the instance of a cluster (the container's command, as PID 1).
    Run(Box<RunArgs>),
}

/// Flags of `pgkube instance run`; the operator sets them through the environment.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// This pod's name.
    #[arg(long, env = "POD_NAME")]
    pod_name: String,

    /// The data directory.
    #[arg(long, env = "PGDATA")]
    pgdata: PathBuf,

    /// The cluster's ConfigMap: postgresql.conf, pg_hba.conf, instance.json.
    #[arg(long, env = "PGKUBE_CONFIG_DIR", default_value = "/etc/pgkube/config")]
    config_dir: PathBuf,

    /// The superuser's Secret: username, password.
    #[arg(
        long,
        env = "PGKUBE_SUPERUSER_DIR",
        default_value = "/etc/pgkube/superuser"
    )]
    superuser_dir: PathBuf,

    /// The replication role's Secret: username, password.
    #[arg(
        long,
        env = "PGKUBE_REPLICATION_DIR",
        default_value = "/etc/pgkube/replication"
    )]
    replication_dir: PathBuf,

    /// A directory of the manager's own (the replication password file goes there).
    #[arg(long, env = "PGKUBE_RUN_DIR", default_value = "/controller")]
    run_dir: PathBuf,

    /// The server's port (as its postgresql.conf says), for the manager's own connection.
    #[arg(long, env = "PGKUBE_PORT", default_value_t = 5432)]
    port: u16,

    /// Where the server puts its Unix socket (the `unix_socket_directories` of the config).
    #[arg(long, env = "PGKUBE_SOCKET_DIR", default_value = "/var/run/postgresql")]
    socket_dir: PathBuf,

    /// Address of the status endpoint.
    #[arg(long, env = "PGKUBE_STATUS_ADDRESS", default_value = "0.0.0.0")]
    status_address: IpAddr,

    /// Port of the status endpoint.
    #[arg(long, env = "PGKUBE_STATUS_PORT", default_value_t = 8000)]
    status_port: u16,

    /// How long a fast shutdown may take before it becomes immediate. Keep it below the pod's
    /// termination grace period.
    #[arg(long, env = "PGKUBE_SHUTDOWN_TIMEOUT", default_value = "50s",
        value_parser = humantime::parse_duration)]
    shutdown_timeout: Duration,

    /// How long the primary waits before it drops the slot of an instance no longer in the
    /// cluster: longer than a kubelet takes to refresh the mounted ConfigMap, so that the new
    /// replica of a scale-up keeps the slot it made before the primary learns of it.
    #[arg(long, env = "PGKUBE_SLOT_DROP_GRACE", default_value = "2m",
        value_parser = humantime::parse_duration)]
    slot_drop_grace: Duration,

    /// How often the mounted files and the server are looked at.
    #[arg(long, env = "PGKUBE_WATCH_PERIOD", default_value = "2s",
        value_parser = humantime::parse_duration)]
    watch_period: Duration,
}

/// Runs an instance command on its own Tokio runtime.
pub fn run(command: InstanceCommand) -> anyhow::Result<()> {
    crate::agent::init_logging();
    match command {
        InstanceCommand::Install { destination } => install(&destination),
        InstanceCommand::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?
            .block_on(supervise(*args)),
    }
}

/// Copies the running binary to `destination`, whole or not at all.
fn install(destination: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let source = std::env::current_exe().context("cannot find the running binary")?;
    let partial = destination.with_extension("partial");
    std::fs::copy(&source, &partial)
        .with_context(|| format!("cannot copy {} to {}", source.display(), partial.display()))?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot make {} executable", partial.display()))?;
    std::fs::rename(&partial, destination)
        .with_context(|| format!("cannot move the binary to {}", destination.display()))?;
    tracing::info!(destination = %destination.display(), "instance manager installed");
    Ok(())
}

/// How the manager was asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StopRequest {
    /// SIGTERM (the kubelet) or SIGINT: fast, then immediate.
    Fast,
    /// SIGQUIT: immediate at once.
    Immediate,
}

/// What woke the supervisor up.
enum Wakeup {
    Stop(StopRequest),
    Reload,
    ServerExited(std::io::Result<std::process::ExitStatus>),
    Tick,
}

/// The signals the manager handles, as PID 1 must (the kernel ignores unhandled ones for it).
struct Signals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        Ok(Self {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
            quit: signal(SignalKind::quit())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal; a hangup is `None` (pass it on), the others ask to stop.
    async fn next(&mut self) -> Option<StopRequest> {
        tokio::select! {
            _ = self.terminate.recv() => Some(StopRequest::Fast),
            _ = self.interrupt.recv() => Some(StopRequest::Fast),
            _ = self.quit.recv() => Some(StopRequest::Immediate),
            _ = self.hangup.recv() => None,
        }
    }

    /// Waits for a signal that asks to stop.
    async fn stop_requested(&mut self) -> StopRequest {
        loop {
            if let Some(request) = self.next().await {
                return request;
            }
        }
    }
}

async fn supervise(args: RunArgs) -> anyhow::Result<()> {
    let mut signals = Signals::install().context("cannot handle signals")?;
    let status: SharedStatus = Arc::new(RwLock::new(InstanceStatus::starting(&args.pod_name)));
    let address = SocketAddr::new(args.status_address, args.status_port);
    let endpoint = tokio::spawn(endpoint::serve(address, status.clone()));
    let sources = Sources {
        config_dir: args.config_dir.clone(),
        superuser_dir: args.superuser_dir.clone(),
        replication_dir: args.replication_dir.clone(),
    };
    let desired = Desired::load(&sources)?;
    let prepared = tokio::select! {
        prepared = prepare(&args, &desired) => prepared?,
        request = signals.stop_requested() => {
            tracing::info!(?request, "stopping before the server started");
            return Ok(());
        }
    };
    let server = Server::start(&args.pgdata).context("cannot start postgres")?;
    let slot_reaper = slots::SlotReaper::new(args.slot_drop_grace);
    let mut instance = Instance {
        args,
        sources,
        status,
        role: prepared.role,
        floors: prepared.floors,
        applied: desired,
        credentials_applied: false,
        changed_since_start: false,
        reload_pending: false,
        slot_reaper,
        client: None,
    };
    let result = instance.run(server, &mut signals).await;
    endpoint.abort();
    result
}

/// Makes the data directory ready for `postgres` and returns the role it starts in.
async fn prepare(args: &RunArgs, desired: &Desired) -> anyhow::Result<Prepared> {
    let pgpass_file = args.run_dir.join("pgpass");
    datadir::write_file(&pgpass_file, &datadir::pgpass(&desired.replication), 0o600)?;
    let topology = &desired.topology;
    let state = DataState::of(&args.pgdata);
    let plan = datadir::plan(&args.pod_name, &topology.primary, state);
    tracing::info!(?state, ?plan, primary = %topology.primary, "starting");
    match plan {
        StartPlan::Initdb => {
            let partial = args.pgdata.with_extension("initdb");
            datadir::remove_dir(&partial)?;
            datadir::initdb(&partial, &desired.superuser).await?;
            std::fs::rename(&partial, &args.pgdata)
                .with_context(|| format!("cannot move {} in place", partial.display()))?;
        }
        StartPlan::Clone => clone(args, desired, &pgpass_file).await?,
        StartPlan::Follow => {
            if slot_is_gone(args, desired).await {
                tracing::warn!(
                    slot = %slot_name(&args.pod_name),
                    "this replica's slot is gone from the primary (the instance was removed, or the primary is a new one): its copy is stale and is cloned again"
                );
                datadir::remove_dir(&args.pgdata)?;
                clone(args, desired, &pgpass_file).await?;
            }
        }
        StartPlan::Demote => tracing::warn!(
            primary = %topology.primary,
            "this instance holds a primary's data but is not the primary: it starts as a standby and never takes writes"
        ),
        StartPlan::Promote => tracing::warn!("this standby is the designated primary: promoting"),
        StartPlan::RunPrimary => {}
    }
    let role = plan.role();
    datadir::set_standby(&args.pgdata, role == Role::Replica)?;
    let floors = floors(role, &args.pgdata, desired).await?;
    let config = datadir::server_config(desired, &args.pod_name, role, &pgpass_file, &floors);
    datadir::write_config(&args.pgdata, &config, &desired.pg_hba_conf)?;
    Ok(Prepared { role, floors })
}

/// The role an instance starts in, and the settings it keeps higher than asked.
struct Prepared {
    role: Role,
    floors: Vec<datadir::Floor>,
}

/// A replica's settings that must stay at what its primary ran with ([`datadir::standby_floors`]).
async fn floors(
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

/// A new copy of the primary, with this instance's slot made first so that the primary keeps
/// the WAL the copy needs from its first byte on.
async fn clone(args: &RunArgs, desired: &Desired, pgpass_file: &Path) -> anyhow::Result<()> {
    let slot = slot_name(&args.pod_name);
    let client = wait_for_primary(args, desired).await;
    if !sql::slot_exists(&client, &slot).await? {
        sql::create_slot(&client, &slot).await?;
    }
    datadir::clone_primary(
        &args.pgdata,
        &desired.topology,
        &args.pod_name,
        pgpass_file,
        &desired.replication,
    )
    .await?;
    Ok(())
}

/// Connects to the primary, retrying until it answers (it may still be starting).
async fn wait_for_primary(args: &RunArgs, desired: &Desired) -> tokio_postgres::Client {
    let mut attempts: u64 = 0;
    loop {
        match sql::connect_primary(&desired.topology, &desired.replication, &args.pod_name).await {
            Ok(client) => return client,
            Err(error) => {
                // Once, then every minute or so: a primary that takes a while is not news.
                if attempts.is_multiple_of(30) {
                    tracing::warn!(host = %desired.topology.primary_host, %error, "waiting for the primary");
                }
                attempts += 1;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

/// Whether the primary answered and has no slot for this replica. A primary that does not
/// answer within a while proves nothing: the replica starts on its data and streams later.
async fn slot_is_gone(args: &RunArgs, desired: &Desired) -> bool {
    let wait = tokio::time::timeout(Duration::from_secs(30), wait_for_primary(args, desired));
    let Ok(client) = wait.await else {
        tracing::warn!("the primary does not answer; starting on the existing data");
        return false;
    };
    match sql::slot_exists(&client, &slot_name(&args.pod_name)).await {
        Ok(exists) => !exists,
        Err(error) => {
            tracing::warn!(%error, "cannot look up this replica's slot; starting on the existing data");
            false
        }
    }
}

/// A running instance and what has been applied to it.
struct Instance {
    args: RunArgs,
    sources: Sources,
    status: SharedStatus,
    role: Role,
    /// Settings kept higher than the files ask ([`datadir::standby_floors`]).
    floors: Vec<datadir::Floor>,
    /// The files as last applied.
    applied: Desired,
    /// Whether the role passwords were set since the server started (primary only).
    credentials_applied: bool,
    /// Whether the configuration files were rewritten since the server started: only then is
    /// a pending restart ours to do (a user's ALTER SYSTEM is theirs).
    changed_since_start: bool,
    /// The files changed and the server has not re-read them yet.
    reload_pending: bool,
    /// On the primary: when the slots of removed instances go.
    slot_reaper: slots::SlotReaper,
    client: Option<Arc<tokio_postgres::Client>>,
}

impl Instance {
    async fn run(&mut self, mut server: Server, signals: &mut Signals) -> anyhow::Result<()> {
        let mut ticker = tokio::time::interval(self.args.watch_period);
        loop {
            let wakeup = tokio::select! {
                signal = signals.next() => match signal {
                    Some(request) => Wakeup::Stop(request),
                    None => Wakeup::Reload,
                },
                exit = server.exited() => Wakeup::ServerExited(exit),
                _ = ticker.tick() => Wakeup::Tick,
            };
            match wakeup {
                Wakeup::Stop(request) => return self.stop(server, request).await,
                Wakeup::Reload => server.signal(Signal::SIGHUP),
                Wakeup::ServerExited(exit) => {
                    self.set_status(InstanceStatus::starting(&self.args.pod_name));
                    anyhow::bail!("postgres exited by itself ({exit:?})");
                }
                Wakeup::Tick => {
                    if self.tick().await {
                        server = self.restart(server).await?;
                    }
                }
            }
        }
    }

    /// One look at the files and the server; true when the server must restart.
    async fn tick(&mut self) -> bool {
        self.apply_files();
        self.update_floors().await;
        let Some(client) = self.client().await else {
            self.set_status(InstanceStatus::starting(&self.args.pod_name));
            return false;
        };
        if let Err(error) = self.apply_to_server(&client).await {
            tracing::warn!(%error, "cannot apply the desired state to the server");
            self.client = None;
        }
        match sql::observe(&client).await {
            Ok(state) => {
                let restart = self.changed_since_start && !state.pending_restart.is_empty();
                if restart {
                    tracing::info!(settings = ?state.pending_restart, "changed settings need a restart");
                }
                self.set_status(InstanceStatus::observed(&self.args.pod_name, state));
                restart
            }
            Err(error) => {
                tracing::debug!(%error, "cannot observe the server");
                self.client = None;
                self.set_status(InstanceStatus::starting(&self.args.pod_name));
                false
            }
        }
    }

    /// A replica's floors follow what it has replayed; when they change, so does its file.
    async fn update_floors(&mut self) {
        let floors = match floors(self.role, &self.args.pgdata, &self.applied).await {
            Ok(floors) => floors,
            Err(error) => {
                tracing::warn!(%error, "cannot read the settings the control file records");
                return;
            }
        };
        if floors == self.floors {
            return;
        }
        tracing::info!(?floors, "settings kept at the primary's until replayed");
        self.floors = floors;
        let desired = self.applied.clone();
        if let Err(error) = self.write_files(&desired) {
            tracing::warn!(%error, "cannot write the new settings");
        }
    }

    /// Re-reads the mounted files and writes what changed into the data directory.
    fn apply_files(&mut self) {
        let desired = match Desired::load(&self.sources) {
            Ok(desired) => desired,
            Err(error) => {
                tracing::warn!(%error, "keeping the settings last read");
                return;
            }
        };
        if desired == self.applied {
            return;
        }
        if let Err(error) = self.write_files(&desired) {
            tracing::warn!(%error, "cannot write the new settings");
            return;
        }
        if desired.topology.primary != self.applied.topology.primary {
            // Moving the primary (switchover, failover) is not this manager's job yet.
            tracing::warn!(primary = %desired.topology.primary, "the designated primary changed; this instance keeps its role until it restarts");
        }
        if desired.superuser != self.applied.superuser
            || desired.replication != self.applied.replication
        {
            self.credentials_applied = false;
        }
        self.applied = desired;
    }

    fn write_files(&mut self, desired: &Desired) -> anyhow::Result<()> {
        let pgpass_file = self.args.run_dir.join("pgpass");
        datadir::write_file(&pgpass_file, &datadir::pgpass(&desired.replication), 0o600)?;
        let config = datadir::server_config(
            desired,
            &self.args.pod_name,
            self.role,
            &pgpass_file,
            &self.floors,
        );
        if datadir::write_config(&self.args.pgdata, &config, &desired.pg_hba_conf)? {
            tracing::info!("configuration files changed; reloading");
            self.changed_since_start = true;
            // The reload itself happens with the next connection use.
            self.reload_pending = true;
        }
        Ok(())
    }

    /// Reloads after a file change; on the primary, sets the passwords and drops the slots of
    /// removed instances.
    async fn apply_to_server(&mut self, client: &tokio_postgres::Client) -> anyhow::Result<()> {
        if self.reload_pending {
            sql::reload(client).await?;
            self.reload_pending = false;
            // The server applies a reload asynchronously; give it a moment before the
            // observation that follows looks for settings pending a restart.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if self.role != Role::Primary {
            return Ok(());
        }
        if !self.credentials_applied {
            sql::apply_credentials(client, &self.applied.superuser, &self.applied.replication)
                .await?;
            tracing::info!("role passwords set from the Secrets");
            self.credentials_applied = true;
        }
        let wanted = self.applied.topology.replica_slots();
        let unwanted = sql::unwanted_slots(client, &wanted).await?;
        for slot in self.slot_reaper.due(&unwanted, std::time::Instant::now()) {
            sql::drop_slot(client, &slot).await?;
            self.slot_reaper.dropped(&slot);
        }
        Ok(())
    }

    /// The connection to the local server, made again when it was lost.
    async fn client(&mut self) -> Option<Arc<tokio_postgres::Client>> {
        if let Some(client) = &self.client
            && !client.is_closed()
        {
            return Some(client.clone());
        }
        let connected = sql::connect_local(
            &self.args.socket_dir,
            self.args.port,
            &self.applied.superuser.username,
        )
        .await;
        match connected {
            Ok(client) => {
                let client = Arc::new(client);
                self.client = Some(client.clone());
                Some(client)
            }
            Err(error) => {
                tracing::debug!(%error, "the server does not answer yet");
                None
            }
        }
    }

    fn set_status(&self, status: InstanceStatus) {
        *self
            .status
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = status;
    }

    async fn restart(&mut self, server: Server) -> anyhow::Result<Server> {
        self.set_status(InstanceStatus::starting(&self.args.pod_name));
        self.client = None;
        let shutdown = server.stop(self.args.shutdown_timeout).await;
        tracing::info!(?shutdown, "postgres stopped for a restart");
        self.changed_since_start = false;
        // The passwords are in the data and survive; set them again anyway in case a change
        // raced the restart.
        self.credentials_applied = false;
        Server::start(&self.args.pgdata).context("cannot start postgres again")
    }

    async fn stop(&mut self, server: Server, request: StopRequest) -> anyhow::Result<()> {
        tracing::info!(?request, "stopping");
        self.set_status(InstanceStatus::starting(&self.args.pod_name));
        self.client = None;
        let timeout = match request {
            StopRequest::Fast => self.args.shutdown_timeout,
            StopRequest::Immediate => Duration::ZERO,
        };
        match server.stop(timeout).await {
            Shutdown::Clean => {
                tracing::info!("postgres stopped cleanly");
                Ok(())
            }
            Shutdown::Immediate if request == StopRequest::Immediate => Ok(()),
            other => anyhow::bail!("postgres did not stop cleanly ({other:?})"),
        }
    }
}
