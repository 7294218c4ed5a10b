//! `pgkube instance`: the instance manager, PID 1 of every PostgreSQL container.
//!
//! An init container runs `pgkube instance install /controller/pgkube` from the pgkube image,
//! which copies the binary into a volume shared with the PostgreSQL container; that container
//! runs the user's PostgreSQL image with `/controller/pgkube instance run` as its command. So the
//! PostgreSQL image stays the stock one. A new operator sends its binary to the running manager,
//! which execs it in its own process while PostgreSQL goes on running ([`handover`]).
//!
//! # What `run` does
//!
//! 1. Reads what the operator decided ([`desired`]): the ConfigMap's `postgresql.conf`,
//!    `pg_hba.conf` and `instance.json` (which pod is the primary, how many instances), and the
//!    superuser and replication Secrets.
//! 2. Prepares the data directory ([`datadir::plan`], carried out by [`roles`]): the designated
//!    primary of a new cluster runs initdb; every other instance makes its replication slot on
//!    the primary and clones it with pg_basebackup. A replica whose slot is gone was removed
//!    from the cluster (scaled down) or the primary is a new one: its copy is stale and is
//!    cloned again. A designated standby starts as a standby and waits for the operator's
//!    `/control/promote`. A primary's data starts as a primary only if it is the designated
//!    one and no other instance reports itself primary (`GET /status` of each, 2 s); else it
//!    waits until that primary answers as one, rewinds to its history with pg_rewind (a new
//!    clone if that fails) and starts as its standby.
//! 3. Writes `postgresql.conf` (with the instance's `primary_conninfo` and slot on a replica)
//!    and `pg_hba.conf` into the data directory, and starts `postgres` as its child.
//! 4. Every `--watch-period`: re-reads the files; reloads the server when its configuration
//!    changed and restarts it when a changed setting needs a restart; sets the role passwords
//!    when a Secret changed (on the primary, without a restart); drops the slots of instances no
//!    longer in the cluster, after a grace period ([`slots`]); on a replica told to follow a
//!    new primary, makes its slot there; refreshes the status served by the [`endpoint`]:
//!    ready only when the server answers and accepts a new connection. Each tick has a time
//!    budget ([`tick`]); the loop beats at every turn, and `/healthz` fails when it stops
//!    turning outside a long step ([`health`]). On the primary of a cluster with replicas, a
//!    restart for changed settings is left to the operator's switchover ([`planned`]). A
//!    primary of several instances that hears from neither the API server nor any replica for
//!    the isolation timeout stops its server at once and waits for another instance to answer
//!    ([`isolation`]).
//!    A replica that has not streamed for a few periods asks its primary why ([`stream`]):
//!    when its history diverged from the primary's (it replayed WAL beyond where the
//!    primary's timeline forked off) it stops, is rewound with pg_rewind (a new clone if that
//!    fails) and starts again; when the WAL it needs is gone from the primary it is cloned
//!    afresh, slot first ([`repair`]).
//! 5. Carries out the operator's orders ([`control`], bearer token from `--control-dir`), one
//!    at a time, in the same loop: `/control/promote` promotes (pg_promote, waiting up to 60 s)
//!    and answers with the status; `/control/follow` makes a replica follow another primary
//!    (new primary_conninfo, reload), and a primary stop cleanly and rejoin as that primary's
//!    standby (pg_rewind when it already is a primary; else, in a switchover, on its own data).
//!    An order is ahead of `instance.json`, which reaches the pod later: the manager acts on the
//!    file only when the primary it names changes, and then never promotes itself — it follows
//!    the named primary if that is another pod ([`ha`]).
//! 6. On `/control/upgrade` (a new binary, checked): between two turns of the loop, records what
//!    it knows and execs the new binary in its own process; the new manager adopts the running
//!    server ([`handover`]).
//! 7. On SIGTERM or SIGINT: a fast shutdown, immediate once `--shutdown-timeout` has passed,
//!    then exits (a server whose postmaster did not answer a new connection at the last look is
//!    killed at once, here as for any stop). SIGQUIT asks for an immediate shutdown; SIGHUP is
//!    passed on (reload). If postgres exits by itself, so does the manager, with an error: the
//!    kubelet restarts the container.

mod application;
mod archive;
mod args;
mod control;
mod datadir;
mod desired;
mod endpoint;
mod files;
mod guarded;
mod ha;
mod handover;
mod health;
mod identity;
mod isolation;
mod memory;
mod metrics;
mod planned;
pub mod recover;
mod repair;
mod roles;
mod server;
mod signals;
mod slots;
mod sql;
mod stream;
mod tick;
mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Subcommand;
use nix::sys::signal::Signal;

pub use args::RunArgs;
use control::{ControlRequest, Order, Target, Terms};
use datadir::Role;
use desired::{Desired, Sources};
use endpoint::InstanceStatus;
use server::{Server, Shutdown};
use signals::{Signals, StopRequest};

#[derive(Subcommand)]
pub enum InstanceCommand {
    /// Copy this binary to DESTINATION (run by the init container of PostgreSQL pods).
    Install {
        /// Where to put the binary, e.g. /controller/pgkube.
        destination: PathBuf,
    },
    /// Run PostgreSQL as the instance of a cluster (the container's command, as PID 1).
    Run(Box<RunArgs>),
    /// Archive one WAL file: PostgreSQL's `archive_command`, which asks the running instance
    /// manager over its socket and exits 0 once the file is stored.
    ArchiveWal {
        /// The instance manager's archive socket.
        #[arg(long)]
        socket: PathBuf,
        /// The WAL file's name in `pg_wal` (`%f`).
        name: String,
    },
    /// Restore one WAL file from the archive: a recovering server's `restore_command`, which
    /// asks the running instance manager over its socket. Exits 0 once the file is in place, 1
    /// when the archive does not have it, 126 (fatal for PostgreSQL) when the archive is broken.
    RestoreWal {
        /// The instance manager's restore socket.
        #[arg(long)]
        socket: PathBuf,
        /// The WAL file's name (`%f`).
        name: String,
        /// Where PostgreSQL wants it (`%p`), relative to the data directory.
        destination: PathBuf,
    },
}

/// Runs an instance command on its own Tokio runtime.
pub fn run(command: InstanceCommand) -> anyhow::Result<()> {
    crate::agent::init_logging();
    match command {
        InstanceCommand::Install { destination } => handover::install(&destination),
        InstanceCommand::ArchiveWal { socket, name } => {
            archive::socket::request(&socket, &name).map_err(anyhow::Error::msg)
        }
        InstanceCommand::RestoreWal {
            socket,
            name,
            destination,
        } => match recover::fetch::request(&socket, &name, &destination) {
            recover::fetch::Answer::Found => Ok(()),
            recover::fetch::Answer::Missing => std::process::exit(1),
            recover::fetch::Answer::Fatal(why) => {
                tracing::error!(file = %name, "{why}");
                std::process::exit(recover::fetch::FATAL_EXIT)
            }
        },
        InstanceCommand::Run(args) => {
            memory::keep_large_buffers_mapped();
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?
                .block_on(supervise(*args))
        }
    }
}

/// How often a server that was just (re)started is looked at until it answers, and for how
/// long at most.
const QUICK_LOOK: Duration = Duration::from_millis(200);
const QUICK_LOOKS_FOR: Duration = Duration::from_secs(10);

/// What woke the supervisor up.
enum Wakeup {
    Stop(StopRequest),
    Reload,
    ServerExited(std::io::Result<std::process::ExitStatus>),
    Order(Order),
    OrdersClosed,
    Tick,
}

/// What the supervisor does after handling a wakeup.
enum Next {
    Continue,
    /// Changed settings need a restart.
    Restart,
    /// Become a standby of this primary (an order, or instance.json).
    Follow(Target),
    /// This replica cannot stream from its primary: rewind or clone it ([`repair`]).
    Repair(stream::Stuck),
    /// Stop for an in-place recovery ([`recover::in_place`]).
    InPlace,
    /// Hand the process over to a new binary ([`handover`]).
    HandOver(handover::Upgrade),
}

async fn supervise(args: RunArgs) -> anyhow::Result<()> {
    let mut signals = Signals::install().context("cannot handle signals")?;
    let binary = handover::ManagerBinary::current().context("cannot find the running binary")?;
    // After a handover, the status served last stays true until the first look at the server.
    let first_status = handover::peek(&args.run_dir)
        .map(|handover| handover.status)
        .filter(|status| status.pod == args.pod_name)
        .unwrap_or_else(|| InstanceStatus::starting(&args.pod_name));
    let board = health::Board::new(first_status, args.watch_period);
    let address = SocketAddr::new(args.status_address, args.status_port);
    let (requests, orders) = tokio::sync::mpsc::channel(control::QUEUE);
    let control = control::Control {
        token_file: args.control_dir.join("token"),
        topology_file: args.config_dir.join(desired::INSTANCE_JSON),
        pod: args.pod_name.clone(),
        requests,
    };
    let archiver = archive::Archiver::new(&args.pgdata, &args.s3_dir);
    let endpoint = tokio::spawn(endpoint::serve(
        address,
        board.clone(),
        control,
        archiver.clone(),
        binary.clone(),
        endpoint::EndpointTls {
            mounted: args.tls_dir.clone(),
            runtime: args.tls_runtime_dir.clone(),
        },
    ));
    let sources = Sources {
        config_dir: args.config_dir.clone(),
        superuser_dir: args.superuser_dir.clone(),
        replication_dir: args.replication_dir.clone(),
        application_dir: args.application_dir.clone(),
    };
    let desired = Desired::load(&sources)?;
    archiver.configure(archive::settings_of(&desired));
    let archive_socket = tokio::spawn(archive::socket::serve(
        args.run_dir.join(archive::socket::SOCKET_NAME),
        archiver.clone(),
    ));
    let postgres_metrics = Arc::new(
        metrics::PostgresMetrics::new(
            args.socket_dir.clone(),
            args.port,
            desired.superuser.username.clone(),
            archiver.clone(),
        )
        .with_custom_queries(args.metrics_queries.clone()),
    );
    let metrics_address = SocketAddr::new(args.status_address, args.metrics_port);
    tokio::spawn(async move {
        if let Err(error) = metrics::serve(metrics_address, postgres_metrics).await {
            tracing::warn!(%error, address = %metrics_address, "cannot serve PostgreSQL's metrics");
        }
    });
    let isolation = isolation::Isolation::new(&args.run_dir, &args.pgdata);
    isolation::spawn(
        &isolation,
        isolation::LocalServer {
            socket_dir: args.socket_dir.clone(),
            port: args.port,
            superuser: desired.superuser.username.clone(),
        },
    );
    let in_place = recover::in_place::read_record(&args.pgdata);
    let mut instance = Instance {
        in_place,
        isolation,
        slot_reaper: slots::SlotReaper::new(args.slot_drop_grace),
        args,
        sources,
        board,
        role: Role::Replica,
        upstream: None,
        slot_on_upstream: true,
        stall: stream::Stall::default(),
        floors: Vec::new(),
        applied: desired,
        credentials_applied: false,
        changed_since_start: false,
        reload_pending: false,
        client: None,
        admission: sql::Admission::Accepted,
        orders,
        terms: Terms::default(),
        orders_open: true,
        initialized_by: None,
        archiver,
        restoring: None,
        binary,
        tls: None,
    };
    // Before any connection to another instance: a clone first checks its source.
    instance.install_tls()?;

    let result = instance.start_and_run(&mut signals).await;
    endpoint.abort();
    archive_socket.abort();
    result
}

/// A running instance and what has been applied to it.
struct Instance {
    args: RunArgs,
    sources: Sources,
    /// The status served and the loop's heartbeat ([`health`]).
    board: Arc<health::Board>,
    role: Role,
    /// The primary a replica follows: whom its primary_conninfo names. None on a primary, and
    /// on a designated standby waiting for `/control/promote`. The operator's orders set it
    /// ahead of `instance.json`, which reaches the pod later.
    upstream: Option<Target>,
    /// Whether this replica's slot is known to exist on its upstream; made each tick until so.
    slot_on_upstream: bool,
    /// How long this replica has not streamed ([`repair`]).
    stall: stream::Stall,
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
    /// What a new connection to the server got at the last look ([`tick`]).
    admission: sql::Admission,
    /// The operator's orders, from the control endpoints.
    orders: tokio::sync::mpsc::Receiver<Order>,
    /// The highest term of the orders carried out: older ones are refused.
    terms: Terms,
    /// False once the endpoint is gone (it could not listen): no order comes any more.
    orders_open: bool,
    /// Who made this database, from its marker, read when the server starts.
    initialized_by: Option<String>,
    /// The primary's watch on its contacts, and the fence ([`isolation`]).
    isolation: Arc<isolation::Isolation>,
    /// Stores the WAL files PostgreSQL's `archive_command` hands over ([`archive`]).
    archiver: Arc<archive::Archiver>,
    /// Serves a recovering server's `restore_command` ([`recover`]).
    restoring: Option<recover::Restoring>,
    /// This instance's record of the last in-place recovery ([`recover::in_place`]).
    in_place: Option<pgkube_controllers::storage::recovery::in_place::InPlaceReport>,
    /// The binary this manager runs ([`handover`]).
    binary: Arc<handover::ManagerBinary>,
    /// The digest of the certificates copied for the server and the clients; none when the
    /// pod has none ([`tls`]).
    tls: Option<String>,
}

/// How the steady state ended.
enum RunEnd {
    /// Asked to stop, or the server is gone for good.
    Stopped,
    /// The primary fenced itself: the server starts again only once the fence is lifted.
    Fenced,
    /// The server stopped for an in-place recovery ([`recover::in_place`]).
    InPlace,
}

impl Instance {
    /// Prepares the data directory, starts the server and supervises it until asked to stop;
    /// prepares again after a fence.
    async fn start_and_run(&mut self, signals: &mut Signals) -> anyhow::Result<()> {
        loop {
            let server = tokio::select! {
                server = self.prepare() => server?,
                request = signals.stop_requested() => {
                    tracing::info!(?request, "stopping before the server started");
                    return Ok(());
                }
            };
            match self.run(server, signals).await? {
                RunEnd::Stopped => return Ok(()),
                RunEnd::Fenced => tracing::warn!(
                    "fenced: the server stays stopped until another instance answers"
                ),
                RunEnd::InPlace => tracing::warn!("stopped for an in-place recovery"),
            }
        }
    }

    /// The isolation timeout while this instance runs as the primary of several.
    fn isolation_watch(&self) -> Option<Duration> {
        let timeout = self.applied.topology.isolation_timeout_seconds?;
        (self.role == Role::Primary).then(|| Duration::from_secs(timeout))
    }

    /// The steady state: the loop turns at every wakeup, at least every watch period, and beats
    /// each time ([`health`]); the long steps it takes are marked busy.
    async fn run(&mut self, mut server: Server, signals: &mut Signals) -> anyhow::Result<RunEnd> {
        let mut ticker = tokio::time::interval(self.args.watch_period);
        // A server the loop just restarted (to follow, to repair, for settings) is looked at
        // often until it answers: the operator waits for its report to carry a switchover on.
        // Not at the start: a primary back from a crash is not hurried past the failover delay.
        let mut quick_until = None;
        self.board.steady();
        loop {
            self.board.beat();
            if self.isolation.fenced() && self.role == Role::Replica {
                // Told to follow while the guard fenced: a standby takes no writes.
                tracing::info!("a standby now: the fence is lifted");
                if let Err(error) = self.isolation.lift() {
                    tracing::error!(%error, "cannot remove the fence marker");
                }
            }
            if self.isolation.fenced() {
                // The guard stopped the postmaster; a server started meanwhile goes too.
                self.isolation.watch_primary(None);
                self.set_status(InstanceStatus::starting(&self.args.pod_name));
                let shutdown = self.stop_server(server, Duration::ZERO).await;
                tracing::warn!(?shutdown, "the server is stopped: fenced");
                return Ok(RunEnd::Fenced);
            }
            self.isolation.watch_primary(self.isolation_watch());
            let wakeup = tokio::select! {
                signal = signals.next() => match signal {
                    Some(request) => Wakeup::Stop(request),
                    None => Wakeup::Reload,
                },
                exit = server.exited() => Wakeup::ServerExited(exit),
                order = self.orders.recv(), if self.orders_open => match order {
                    Some(order) => Wakeup::Order(order),
                    None => Wakeup::OrdersClosed,
                },
                _ = ticker.tick() => Wakeup::Tick,
                _ = tokio::time::sleep(QUICK_LOOK), if quick_until
                    .is_some_and(|until| std::time::Instant::now() < until)
                    && !self.board.status().ready => Wakeup::Tick,
            };
            let next = match wakeup {
                Wakeup::Stop(request) => {
                    let _busy = self.board.busy("stopping");
                    return self.stop(server, request).await.map(|()| RunEnd::Stopped);
                }
                Wakeup::Reload => {
                    server.signal(Signal::SIGHUP);
                    Next::Continue
                }
                Wakeup::ServerExited(_) if self.isolation.fenced() => continue,
                Wakeup::ServerExited(exit) => {
                    self.set_status(InstanceStatus::starting(&self.args.pod_name));
                    anyhow::bail!("postgres exited by itself ({exit:?})");
                }
                Wakeup::OrdersClosed => {
                    tracing::error!("the control endpoint is gone; no order can come");
                    self.orders_open = false;
                    Next::Continue
                }
                Wakeup::Order(order) => match self.terms.admit(order) {
                    Some(ControlRequest::Promote(reply)) => {
                        let _busy = self.board.busy("promoting");
                        // The endpoint may have given up waiting; the promotion stands anyway.
                        let _ = reply.send(self.promote().await);
                        Next::Continue
                    }
                    Some(ControlRequest::Follow(target)) => Next::Follow(target),
                    Some(ControlRequest::Upgrade(upgrade)) => Next::HandOver(upgrade),
                    None => Next::Continue,
                },
                Wakeup::Tick => self.tick().await,
            };
            let restarts = !matches!(next, Next::Continue | Next::HandOver(_));
            if restarts {
                // The server stops for a while: nothing to fence meanwhile.
                self.isolation.watch_primary(None);
            }
            server = match next {
                Next::Continue => server,
                Next::HandOver(upgrade) => self.hand_over(server, upgrade).await,
                Next::InPlace => {
                    let _busy = self.board.busy("stopping for an in-place recovery");
                    self.set_status(InstanceStatus::starting(&self.args.pod_name));
                    let shutdown = self.stop_server(server, self.args.shutdown_timeout).await;
                    tracing::info!(?shutdown, "the server is stopped for an in-place recovery");
                    return Ok(RunEnd::InPlace);
                }
                Next::Restart => {
                    let _busy = self.board.busy("restarting");
                    self.restart(server).await?
                }
                Next::Follow(target) => {
                    let _busy = self.board.busy("taking the role ordered");
                    match self.follow(server, target, signals).await? {
                        Some(server) => server,
                        None => return Ok(RunEnd::Stopped),
                    }
                }
                Next::Repair(stuck) => {
                    let _busy = self.board.busy("repairing");
                    match self.repair(server, stuck, signals).await? {
                        Some(server) => server,
                        None => return Ok(RunEnd::Stopped),
                    }
                }
            };
            if restarts {
                quick_until = Some(std::time::Instant::now() + QUICK_LOOKS_FOR);
            }
        }
    }

    /// The pod this replica's primary_conninfo names.
    fn following(&self) -> Option<&str> {
        match self.role {
            Role::Primary => None,
            Role::Replica => self.upstream.as_ref().map(|target| target.pod.as_str()),
        }
    }

    fn set_status(&self, mut status: InstanceStatus) {
        status.in_place = self.in_place.clone();
        self.board.set(status);
    }

    /// Stops the server: a fast shutdown, immediate after `timeout`; a kill at once when a new
    /// connection got no answer at the last look (its postmaster hangs: it would handle no
    /// shutdown signal, while its backends go on serving their clients).
    async fn stop_server(&mut self, server: Server, timeout: Duration) -> Shutdown {
        self.client = None;
        let shutdown = if self.admission == sql::Admission::NoAnswer {
            tracing::warn!("the server's postmaster does not answer: it is killed, not shut down");
            server.kill().await
        } else {
            server.stop(timeout).await
        };
        self.admission = sql::Admission::Accepted;
        shutdown
    }

    async fn restart(&mut self, server: Server) -> anyhow::Result<Server> {
        self.set_status(InstanceStatus::starting(&self.args.pod_name));
        let shutdown = self.stop_server(server, self.args.shutdown_timeout).await;
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
        let timeout = match request {
            StopRequest::Fast => self.args.shutdown_timeout,
            StopRequest::Immediate => Duration::ZERO,
        };
        match self.stop_server(server, timeout).await {
            Shutdown::Clean => {
                tracing::info!("postgres stopped cleanly");
                Ok(())
            }
            Shutdown::Immediate if request == StopRequest::Immediate => Ok(()),
            other => anyhow::bail!("postgres did not stop cleanly ({other:?})"),
        }
    }
}
