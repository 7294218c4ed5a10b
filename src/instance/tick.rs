//! One tick of the supervisor loop, every watch period, in two parts with a time budget each,
//! so that a server or a peer that hangs never holds the loop (and the status it shows) up:
//!
//! 1. **The server**, within [`OBSERVE_BUDGET`]: the mounted files re-read (a new primary named
//!    ends the tick: [`Next::Follow`]), a replica's floors, the manager's connection (made again
//!    when lost), what changed applied to the server (reload, passwords, slots); then, at once,
//!    the observation on that connection and a *new* connection ([`NEW_CONNECTION_TIMEOUT`]).
//!    The status is set: ready only when both answered ([`Admission::Accepted`]). A server whose
//!    postmaster hangs keeps answering on the manager's connection (its backend runs) while no
//!    client can connect: it reports the role it runs in, not ready, so that the operator fails
//!    over and orders it to follow the new primary; it is then killed, not shut down (it would
//!    handle no signal, [`Instance::stop_server`]). A server that does not answer at all keeps
//!    the role it was last seen in, not ready.
//! 2. **The peers**, within [`PEERS_BUDGET`], on a replica: its slot on its primary, and why it
//!    does not stream ([`super::repair`]).

use std::sync::Arc;
use std::time::Duration;

use super::datadir::Role;
use super::endpoint::InstanceStatus;
use super::planned::PendingRestart;
use super::roles::floors;
use super::sql::{self, Admission, ConnectError, ServerState};
use super::stream::Stuck;
use super::{Instance, Next};

/// How long a new connection to the local server may take before the server counts as not
/// accepting connections.
pub const NEW_CONNECTION_TIMEOUT: Duration = Duration::from_secs(3);
/// The time budget of a tick's look at the server.
pub const OBSERVE_BUDGET: Duration = Duration::from_secs(5);
/// The time budget of a tick's calls to other instances.
pub const PEERS_BUDGET: Duration = Duration::from_secs(4);

/// Why a running server is not ready; fixed texts, so that a server that stays so reports the
/// same status.
const NO_NEW_CONNECTION: &str = "the server accepts no new connection";
const NO_ANSWER: &str = "the server does not answer the instance manager";
const TOO_SLOW: &str = "the server did not answer the instance manager within 5 s";

/// What the server showed on the manager's connection.
struct Looked {
    client: Arc<tokio_postgres::Client>,
    state: ServerState,
    /// The server was told to re-read its files in this look: it may not have applied them.
    reloaded: bool,
    /// What to do about its settings pending a restart ([`super::planned`]).
    pending: PendingRestart,
}

/// What a tick's look at the server found.
struct Observation {
    client: Arc<tokio_postgres::Client>,
    in_recovery: bool,
    streaming: bool,
    /// Settings the manager changed need a restart, here and now ([`super::planned`]).
    restart: bool,
}

impl Instance {
    /// One look at the files, the server and the peers: what to do next.
    pub(super) async fn tick(&mut self) -> Next {
        if let Some(target) = self.apply_files() {
            return Next::Follow(target);
        }
        if self.in_place_due() != super::recover::in_place::Due::Nothing {
            return Next::InPlace;
        }
        let (socket_dir, port) = (self.args.socket_dir.clone(), self.args.port);
        let superuser = self.applied.superuser.username.clone();
        let (looked, admission) = tokio::join!(
            tokio::time::timeout(OBSERVE_BUDGET, self.look()),
            sql::new_connection(&socket_dir, port, &superuser, NEW_CONNECTION_TIMEOUT)
        );
        self.note_admission(&admission);
        let observation = match looked {
            Ok(Ok(looked)) => Some(self.show(looked)),
            Ok(Err(why)) => {
                self.report_not_ready(why);
                None
            }
            Err(_) => {
                tracing::warn!(budget = ?OBSERVE_BUDGET, "the server did not answer in time; reported not ready");
                self.client = None;
                self.report_not_ready(TOO_SLOW);
                None
            }
        };
        let peers = tokio::time::timeout(PEERS_BUDGET, self.consult_peers(observation.as_ref()));
        let stuck = peers.await.unwrap_or_else(|_| {
            tracing::debug!(budget = ?PEERS_BUDGET, "the other instances did not answer in time");
            None
        });
        match (stuck, observation) {
            (Some(stuck), _) => Next::Repair(stuck),
            (None, Some(observation)) if observation.restart => Next::Restart,
            (None, _) => Next::Continue,
        }
    }

    /// Applies what changed to the server and reads what it shows on the manager's connection;
    /// why not ready when it does not answer.
    async fn look(&mut self) -> Result<Looked, &'static str> {
        self.update_floors().await;
        let client = self.client().await.ok_or(NO_ANSWER)?;
        let reloaded = self.reload_pending;
        if let Err(error) = self.apply_to_server(&client).await {
            tracing::warn!(%error, "cannot apply the desired state to the server");
            self.client = None;
        }
        match sql::observe(&client).await {
            Ok(state) => Ok(Looked {
                pending: self.pending_restart(&state).await,
                client,
                state,
                reloaded,
            }),
            Err(error) => {
                tracing::debug!(%error, "cannot observe the server");
                self.client = None;
                Err(NO_ANSWER)
            }
        }
    }

    /// Sets the status from what the server showed.
    fn show(&mut self, looked: Looked) -> Observation {
        let Looked {
            client,
            state,
            reloaded,
            pending,
        } = looked;
        let restart = pending == PendingRestart::InPlace;
        if restart {
            tracing::info!(settings = ?state.pending_restart, "changed settings need a restart");
        }
        let (in_recovery, streaming) = (state.in_recovery, state.streaming);
        let status = self.shown(state);
        let status = self.mark_planned_restart(status, pending, reloaded);
        self.set_status(status);
        Observation {
            client,
            in_recovery,
            streaming,
            restart,
        }
    }

    /// After the status (asking the primary may take a few seconds): a replica's slot on its
    /// primary, and why it cannot stream, if it cannot.
    async fn consult_peers(&mut self, observation: Option<&Observation>) -> Option<Stuck> {
        self.ensure_upstream_slot().await;
        let observation = observation?;
        let (in_recovery, streaming) = (observation.in_recovery, observation.streaming);
        self.stuck(&observation.client, in_recovery, streaming)
            .await
    }

    /// A new connection to the local server ([`sql::new_connection`]).
    pub(super) async fn new_connection(&self) -> Result<(), ConnectError> {
        sql::new_connection(
            &self.args.socket_dir,
            self.args.port,
            &self.applied.superuser.username,
            NEW_CONNECTION_TIMEOUT,
        )
        .await
    }

    /// Records what a new connection got, telling when that changes.
    pub(super) fn note_admission(&mut self, result: &Result<(), ConnectError>) {
        let admission = Admission::of(result);
        match (self.admission, admission, result) {
            (before, after, _) if before == after => {}
            (_, Admission::NoAnswer, _) => tracing::warn!(
                "the server does not answer a new connection (its postmaster hangs); it is reported not ready"
            ),
            (Admission::NoAnswer, _, _) => {
                tracing::info!(?admission, "the server answers new connections again")
            }
            (_, _, Err(error)) => tracing::debug!(?admission, %error, "no new connection"),
            (_, _, Ok(())) => tracing::debug!("the server accepts new connections"),
        }
        self.admission = admission;
    }

    /// The status of a server that showed `state`: ready when it also accepts new connections.
    pub(super) fn shown(&self, state: ServerState) -> InstanceStatus {
        let mut status = InstanceStatus::observed(&self.args.pod_name, state, self.following());
        status.initialized_by = self.initialized_by.clone();
        if self.admission == Admission::Accepted {
            status
        } else {
            status.not_ready(NO_NEW_CONNECTION)
        }
    }

    /// The status shown, not ready for the reason `why`, observed now.
    fn report_not_ready(&self, why: &str) {
        self.set_status(self.board.status().not_ready(why));
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
            if let Some(application) = &self.applied.application {
                let outcome = super::application::apply(client, application).await?;
                log_application_role(outcome, &application.credentials.username);
            }
            // Once per start or promotion. The checkpointer starts while the server is still
            // starting, and then sleeps a whole checkpoint_timeout before it first looks at
            // archive_timeout: until a reload wakes it, a quiet primary's WAL would wait
            // minutes for the archive instead of seconds.
            sql::reload(client).await?;
            self.credentials_applied = true;
        }
        let wanted = self.applied.topology.slots_kept_by(&self.args.pod_name);
        let unwanted = sql::unwanted_slots(client, &wanted).await?;
        for slot in self.slot_reaper.due(&unwanted, std::time::Instant::now()) {
            sql::drop_slot(client, &slot).await?;
            self.slot_reaper.dropped(&slot);
        }
        Ok(())
    }

    /// The connection to the local server, made again when it was lost.
    pub(super) async fn client(&mut self) -> Option<Arc<tokio_postgres::Client>> {
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
}

fn log_application_role(outcome: super::application::RoleOutcome, role: &str) {
    use super::application::RoleOutcome;
    match outcome {
        RoleOutcome::Created => tracing::info!(%role, "application role created"),
        RoleOutcome::PasswordSet => {}
        RoleOutcome::NotManaged => tracing::warn!(
            %role,
            "a role of the application role's name exists that pgkube did not make; its password is left as it is, so the application Secret's does not log in"
        ),
    }
}
