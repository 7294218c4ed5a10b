//! What the instance manager asks of PostgreSQL: the local server through its Unix socket as
//! the superuser (peer authentication: the manager runs as the server's own OS user), and the
//! primary over TCP as the replication role.
//!
//! Passwords are sent as SCRAM verifiers computed here, so the clear text never reaches the
//! server, its logs or `pg_stat_activity`.
//!
//! Nothing here waits without bound: a connection is ready within [`CONNECT_TIMEOUT`] or given
//! up, the server cancels any statement of the manager after 10 s (a promotion, which waits up
//! to a minute for the server: 90 s), and a connection to another instance notices within about
//! half a minute that its peer is gone from the network (TCP keepalives and user timeout).

use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, NoTls};

use crate::tls::ClientTls;

use super::desired::{Credentials, is_managed_slot};

/// How long a connection may take until it is ready for queries: the socket, the startup and
/// the authentication. (tokio-postgres's own `connect_timeout` covers only the socket, and a
/// postmaster that hangs accepts the socket but never answers the startup.)
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a statement of the manager may run before the server cancels it: the manager's
/// own waits are shorter, and a statement it gave up on must not go on running.
const STATEMENT_TIMEOUT: &str = "10s";
/// The statement timeout of a promotion, which waits up to 60 s for the server.
const PROMOTE_STATEMENT_TIMEOUT: &str = "90s";

/// Why a connection was not made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Postgres(#[from] tokio_postgres::Error),
    #[error("TLS settings: {0}")]
    Tls(#[from] crate::tls::TlsError),
}

/// What a new connection to the local server got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Connected; or refused only for lack of a free connection slot: the server is up, and
    /// another instance would not take those clients any better.
    Accepted,
    /// Refused by the server itself (starting up, shutting down, ...), or by the system (no
    /// server listens yet): no client gets in, but the postmaster is not known to hang.
    Refused,
    /// No answer from the server in time: its postmaster hangs.
    NoAnswer,
}

impl Admission {
    /// What the connection attempt `result` shows.
    pub fn of(result: &Result<(), ConnectError>) -> Self {
        match result {
            Ok(()) => Self::Accepted,
            Err(ConnectError::Postgres(error)) => error.code().map_or(Self::Refused, Self::refusal),
            Err(ConnectError::Timeout(_)) => Self::NoAnswer,
            // Only connections to other instances use TLS; none reached the server.
            Err(ConnectError::Tls(_)) => Self::Refused,
        }
    }

    /// The server refused a connection with `code`.
    fn refusal(code: &SqlState) -> Self {
        if *code == SqlState::TOO_MANY_CONNECTIONS {
            Self::Accepted
        } else {
            Self::Refused
        }
    }
}

/// A connection that drives itself in a background task, ready within `timeout`.
async fn connect(config: &Config, timeout: Duration) -> Result<Client, ConnectError> {
    connect_with(config, timeout, NoTls).await
}

/// As [`connect`], through `tls`.
async fn connect_with<T>(config: &Config, timeout: Duration, tls: T) -> Result<Client, ConnectError>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: Send + 'static,
{
    let connecting = config.connect(tls);
    let (client, connection) = tokio::time::timeout(timeout, connecting)
        .await
        .map_err(|_| ConnectError::Timeout(timeout))??;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "connection closed");
        }
    });
    Ok(client)
}

/// The local server's connection settings, as `superuser`, through the socket in `socket_dir`.
fn local_config(socket_dir: &Path, port: u16, superuser: &str) -> Config {
    let mut config = Config::new();
    config
        .host_path(socket_dir)
        .port(port)
        .user(superuser)
        .dbname("postgres")
        .application_name("pgkube-instance-manager")
        // The manager's own writes (passwords, slots) never wait for synchronous standbys:
        // on a new primary none exists yet, and waiting would keep it from ever being ready.
        .options(format!(
            "-c synchronous_commit=local -c statement_timeout={STATEMENT_TIMEOUT}"
        ));
    config
}

/// The local server, as `superuser`, through the socket in `socket_dir`.
pub async fn connect_local(
    socket_dir: &Path,
    port: u16,
    superuser: &str,
) -> Result<Client, ConnectError> {
    connect(&local_config(socket_dir, port, superuser), CONNECT_TIMEOUT).await
}

/// A new connection to the local server, closed at once: whether it is ready within `timeout`
/// ([`Admission::of`] tells what a failure means). A postmaster that hangs leaves its backends
/// answering on their connections, the manager's own, while no client can connect.
pub async fn new_connection(
    socket_dir: &Path,
    port: u16,
    superuser: &str,
    timeout: Duration,
) -> Result<(), ConnectError> {
    connect(&local_config(socket_dir, port, superuser), timeout)
        .await
        .map(drop)
}

/// Another instance (the primary, or the one that is to be), as `credentials` (the replication
/// role, or the superuser for a look at its role).
pub async fn connect_remote(
    host: &str,
    port: u16,
    credentials: &Credentials,
    application_name: &str,
    tls: Option<ClientTls>,
) -> Result<Client, ConnectError> {
    let mut config = Config::new();
    config
        .host(host)
        .port(port)
        .user(&credentials.username)
        .password(&credentials.password)
        .dbname("postgres")
        .application_name(application_name)
        .options(format!("-c statement_timeout={STATEMENT_TIMEOUT}"))
        // A peer gone from the network (its node lost) is noticed within about half a minute,
        // not the system's two hours, by queries of the long steps that have no time limit.
        .keepalives_idle(Duration::from_secs(10))
        .keepalives_interval(Duration::from_secs(5))
        .keepalives_retries(3)
        .tcp_user_timeout(Duration::from_secs(30));
    let Some(tls) = tls else {
        config.ssl_mode(SslMode::Disable);
        return connect(&config, CONNECT_TIMEOUT).await;
    };
    config.ssl_mode(if tls.verify {
        SslMode::Require
    } else {
        SslMode::Prefer
    });
    connect_with(&config, CONNECT_TIMEOUT, tls.connector()?).await
}

/// The server as the status endpoint shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerState {
    pub in_recovery: bool,
    pub timeline: Option<i64>,
    /// Where the primary writes WAL; none on a replica.
    pub current_lsn: Option<String>,
    /// The last WAL a replica received and replayed; none on a primary.
    pub received_lsn: Option<String>,
    pub replayed_lsn: Option<String>,
    /// A replica's WAL receiver is connected and streaming.
    pub streaming: bool,
    /// Settings changed in the files that take effect only after a restart.
    pub pending_restart: Vec<String>,
    /// The database's system identifier.
    pub system_identifier: Option<String>,
}

/// Reads the server's role, timeline and WAL positions. A standby's timeline is the one its
/// WAL receiver receives, when it has one: its control file names a new timeline only at its
/// next restartpoint, which an idle cluster may not make for a long time.
pub async fn observe(client: &Client) -> Result<ServerState, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT pg_is_in_recovery(), \
                    greatest((SELECT timeline_id::int8 FROM pg_control_checkpoint()), \
                             (SELECT received_tli::int8 FROM pg_stat_wal_receiver)), \
                    CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_wal_lsn()::text END, \
                    pg_last_wal_receive_lsn()::text, \
                    pg_last_wal_replay_lsn()::text, \
                    EXISTS (SELECT 1 FROM pg_stat_wal_receiver WHERE status = 'streaming'), \
                    ARRAY(SELECT name::text FROM pg_settings WHERE pending_restart ORDER BY name), \
                    (SELECT system_identifier::text FROM pg_control_system())",
            &[],
        )
        .await?;
    Ok(ServerState {
        in_recovery: row.try_get(0)?,
        timeline: row.try_get(1)?,
        current_lsn: row.try_get(2)?,
        received_lsn: row.try_get(3)?,
        replayed_lsn: row.try_get(4)?,
        streaming: row.try_get(5)?,
        pending_restart: needing_restart(row.try_get(6)?),
        system_identifier: row.try_get(7)?,
    })
}

/// The system identifier of the database the server runs.
pub async fn system_identifier(client: &Client) -> Result<String, tokio_postgres::Error> {
    client
        .query_one(
            "SELECT system_identifier::text FROM pg_control_system()",
            &[],
        )
        .await?
        .try_get(0)
}

/// The standbys' last answers to their walsenders, as `pid@reply_time` joined by commas (empty
/// with none): when it changes, some standby was heard from ([`super::isolation`]).
pub async fn replica_marks(client: &Client) -> Result<String, tokio_postgres::Error> {
    client
        .query_one(
            "SELECT coalesce(string_agg(pid::text || '@' || reply_time::text, ',' ORDER BY pid), '') \
             FROM pg_stat_replication WHERE reply_time IS NOT NULL",
            &[],
        )
        .await?
        .try_get(0)
}

/// Whether the server is a standby (in recovery).
/// How far a recovering server has replayed.
#[derive(Clone, Debug)]
pub struct ReplayProgress {
    pub in_recovery: bool,
    pub replayed_lsn: Option<String>,
    /// The commit time of the last transaction replayed.
    pub replayed_at: Option<String>,
}

pub async fn replay_progress(client: &Client) -> Result<ReplayProgress, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text, \
             pg_last_xact_replay_timestamp()::text",
            &[],
        )
        .await?;
    Ok(ReplayProgress {
        in_recovery: row.try_get(0)?,
        replayed_lsn: row.try_get(1)?,
        replayed_at: row.try_get(2)?,
    })
}

pub async fn in_recovery(client: &Client) -> Result<bool, tokio_postgres::Error> {
    client
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await?
        .try_get(0)
}

/// On a standby: the timeline it replays as its control file knows it (the later of its last
/// restartpoint's and its minimum recovery point's), its last replayed and received WAL.
pub async fn standby_position(
    client: &Client,
) -> Result<(i64, Option<String>, Option<String>), tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT greatest((SELECT timeline_id FROM pg_control_checkpoint()), \
                             (SELECT min_recovery_end_timeline FROM pg_control_recovery()))::int8, \
                    pg_last_wal_replay_lsn()::text, pg_last_wal_receive_lsn()::text",
            &[],
        )
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
}

/// What a primary (as the superuser) tells of its WAL: its timeline, that timeline's history
/// file (none on timeline 1), the oldest segment file in `pg_wal`, the segment size.
pub struct PrimaryWal {
    pub timeline: i64,
    pub history: Option<String>,
    pub oldest_segment: Option<String>,
    pub segment_size: i64,
}

/// Reads [`PrimaryWal`]; none when the server is in recovery (not a primary).
pub async fn primary_wal(client: &Client) -> Result<Option<PrimaryWal>, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT pg_is_in_recovery(), \
                    CASE WHEN pg_is_in_recovery() THEN 0 \
                         ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8 END, \
                    (SELECT min(name) FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{24}$'), \
                    (SELECT setting::int8 FROM pg_settings WHERE name = 'wal_segment_size')",
            &[],
        )
        .await?;
    if row.try_get(0)? {
        return Ok(None);
    }
    let timeline: i64 = row.try_get(1)?;
    let history = if timeline > 1 {
        let file = format!("pg_wal/{timeline:08X}.history");
        client
            .query_one("SELECT pg_read_file($1, 0, 1048576, true)", &[&file])
            .await?
            .try_get(0)?
    } else {
        None
    };
    Ok(Some(PrimaryWal {
        timeline,
        history,
        oldest_segment: row.try_get(2)?,
        segment_size: row.try_get(3)?,
    }))
}

/// On the primary, as the replication role: whether `slot` exists, and whether the WAL it was
/// to keep is lost (`max_slot_wal_keep_size`): such a slot can serve no clone.
pub async fn slot_state(
    client: &Client,
    slot: &str,
) -> Result<Option<bool>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT coalesce(wal_status = 'lost', false) FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    row.map(|row| row.try_get(0)).transpose()
}

/// On the primary: drops this instance's own `slot` (lost, to be made again).
pub async fn drop_own_slot(client: &Client, slot: &str) -> Result<(), tokio_postgres::Error> {
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await?;
    tracing::info!(%slot, "lost replication slot dropped, to be made again");
    Ok(())
}

/// Promotes a standby and waits up to a minute for it to take writes; false when it did not
/// finish in that time (the server goes on with it).
pub async fn promote(client: &Client) -> Result<bool, tokio_postgres::Error> {
    client
        .batch_execute(&format!(
            "SET statement_timeout = '{PROMOTE_STATEMENT_TIMEOUT}'"
        ))
        .await?;
    let promoted = client
        .query_one("SELECT pg_promote(wait => true, wait_seconds => 60)", &[])
        .await;
    client.batch_execute("RESET statement_timeout").await?;
    promoted?.try_get(0)
}

/// Re-reads the configuration files.
pub async fn reload(client: &Client) -> Result<(), tokio_postgres::Error> {
    client.execute("SELECT pg_reload_conf()", &[]).await?;
    Ok(())
}

/// On the primary: the superuser's password is the Secret's, and the replication role exists
/// with its Secret's password.
pub async fn apply_credentials(
    client: &Client,
    superuser: &Credentials,
    replication: &Credentials,
) -> Result<(), tokio_postgres::Error> {
    let exists = client
        .query_opt(
            "SELECT 1 FROM pg_roles WHERE rolname = $1",
            &[&replication.username],
        )
        .await?
        .is_some();
    if !exists {
        client
            .batch_execute(&format!(
                "CREATE ROLE {} WITH LOGIN REPLICATION",
                quote_ident(&replication.username)
            ))
            .await?;
        tracing::info!(role = %replication.username, "replication role created");
    }
    for credentials in [superuser, replication] {
        client
            .batch_execute(&format!(
                "ALTER ROLE {} WITH PASSWORD {}",
                quote_ident(&credentials.username),
                quote_literal(&scram_verifier(&credentials.password)),
            ))
            .await?;
    }
    Ok(())
}

/// On the primary: the slots pgkube made that no instance uses now and that are not in
/// `wanted` (see [`super::slots`] for when they are dropped).
pub async fn unwanted_slots(
    client: &Client,
    wanted: &[String],
) -> Result<Vec<String>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT slot_name::text FROM pg_replication_slots WHERE slot_type = 'physical' AND NOT active",
            &[],
        )
        .await?;
    let mut unwanted = Vec::new();
    for row in rows {
        let slot: String = row.try_get(0)?;
        if is_managed_slot(&slot) && !wanted.contains(&slot) {
            unwanted.push(slot);
        }
    }
    Ok(unwanted)
}

/// On the primary: drops `slot`.
pub async fn drop_slot(client: &Client, slot: &str) -> Result<(), tokio_postgres::Error> {
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await?;
    tracing::info!(%slot, "replication slot of a removed instance dropped");
    Ok(())
}

/// On the primary, as the replication role: whether `slot` exists.
pub async fn slot_exists(client: &Client, slot: &str) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_opt(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?
        .is_some())
}

/// On the primary, as the replication role: makes `slot`, keeping WAL from now on.
pub async fn create_slot(client: &Client, slot: &str) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            "SELECT pg_create_physical_replication_slot($1, true)",
            &[&slot],
        )
        .await?;
    tracing::info!(%slot, "replication slot created");
    Ok(())
}

pub(super) fn scram_verifier(password: &str) -> String {
    postgres_protocol::password::scram_sha_256(password.as_bytes())
}

/// An SQL identifier, quoted.
pub(super) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// An SQL string literal (standard_conforming_strings is on since PostgreSQL 9.1).
pub(super) fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The settings whose change waits for a restart, but for the recovery targets: they count only
/// while a server recovers, and leave the configuration once a recovered server promoted, which
/// is no reason to restart it (or to move the primary).
fn needing_restart(pending: Vec<String>) -> Vec<String> {
    pending
        .into_iter()
        .filter(|name| !name.starts_with("recovery_target"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recovery_targets_left_after_a_promotion_need_no_restart() {
        let pending = [
            "max_connections",
            "recovery_target_action",
            "recovery_target_timeline",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(needing_restart(pending), ["max_connections"]);
    }

    #[test]
    fn identifiers_and_literals_are_quoted() {
        assert_eq!(quote_ident("streaming_replica"), "\"streaming_replica\"");
        assert_eq!(quote_ident("we\"ird"), "\"we\"\"ird\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
    }

    #[test]
    fn only_a_refusal_for_lack_of_slots_counts_as_accepted_and_no_answer_is_told_apart() {
        assert_eq!(
            Admission::refusal(&SqlState::TOO_MANY_CONNECTIONS),
            Admission::Accepted
        );
        // Starting up, shutting down, in recovery: no client gets in.
        assert_eq!(
            Admission::refusal(&SqlState::CANNOT_CONNECT_NOW),
            Admission::Refused
        );
        assert_eq!(
            Admission::refusal(&SqlState::INVALID_PASSWORD),
            Admission::Refused
        );
        assert_eq!(Admission::of(&Ok(())), Admission::Accepted);
        let silent = Err(ConnectError::Timeout(Duration::from_secs(3)));
        assert_eq!(Admission::of(&silent), Admission::NoAnswer);
    }

    #[test]
    fn passwords_become_scram_verifiers() {
        let verifier = scram_verifier("s3cret");
        assert!(verifier.starts_with("SCRAM-SHA-256$4096:"));
        assert!(!verifier.contains("s3cret"));
    }
}
