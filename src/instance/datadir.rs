//! The data directory: what it holds, how it comes to be (initdb or a clone of the primary), and
//! the configuration files the instance manager writes into it.
//!
//! Deciding what to do at start ([`plan`]) and composing the files ([`server_config`],
//! [`pgpass`]) are pure; the rest runs the PostgreSQL tools.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use super::desired::{Credentials, Desired, slot_name};
use crate::tls::{ClientRole, ClientTls};

/// Present once a data directory is complete (initdb and pg_basebackup write it).
const VERSION_FILE: &str = "PG_VERSION";
/// Present in a standby's data directory: the server starts in recovery and follows the primary.
const STANDBY_SIGNAL: &str = "standby.signal";
const CONFIG_FILE: &str = "postgresql.conf";
const HBA_FILE: &str = "pg_hba.conf";

/// Errors of preparing the data directory.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot find {what} of {path}")]
    Unreadable { what: &'static str, path: PathBuf },
    #[error("{program} failed ({status}): {stderr}")]
    Tool {
        program: &'static str,
        status: std::process::ExitStatus,
        stderr: String,
    },
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DataDirError {
    let path = path.to_owned();
    move |source| DataDirError::Io {
        action,
        path,
        source,
    }
}

/// What the data directory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataState {
    Empty,
    /// A primary's data (no standby.signal).
    Primary,
    /// A standby's data.
    Standby,
}

impl DataState {
    pub fn of(pgdata: &Path) -> Self {
        if !pgdata.join(VERSION_FILE).exists() {
            DataState::Empty
        } else if pgdata.join(STANDBY_SIGNAL).exists() {
            DataState::Standby
        } else {
            DataState::Primary
        }
    }
}

/// How this instance starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartPlan {
    /// The first instance of a new cluster: a new database.
    Initdb,
    /// A new replica: a copy of the primary, then streaming.
    Clone,
    /// Existing data, this instance is the primary.
    RunPrimary,
    /// Existing standby data, following the primary.
    Follow,
    /// Standby data, but the operator designated this instance the primary: it starts as a
    /// standby following no one and waits for the operator's `/control/promote`, which comes
    /// once the operator has checked that nothing is lost by promoting it.
    Promote,
    /// A primary's data, but another instance is the primary: it must never take writes behind
    /// the primary's back. It waits for that primary, rewinds its data to the primary's history
    /// (pg_rewind; a new clone when that fails), and starts as its standby.
    Demote,
    /// The first instance of a cluster that recovers from a backup (point-in-time recovery):
    /// the base backup restored, then archive recovery to the target ([`super::recover`]).
    Recover,
    /// The designated primary's volume is empty, but the cluster's database exists (the
    /// operator recorded its system identifier): a new database would replace it. It waits,
    /// saying so, until the operator names another primary (a failover to an instance that has
    /// the data), then clones it.
    WaitForData,
}

/// What to do with `state` when the operator says `primary` is the primary; `initialized`
/// when the operator recorded the cluster's database (so that it exists somewhere).
pub fn plan(pod: &str, primary: &str, state: DataState, initialized: bool) -> StartPlan {
    let is_primary = pod == primary;
    match (state, is_primary) {
        (DataState::Empty, true) if initialized => StartPlan::WaitForData,
        (DataState::Empty, true) => StartPlan::Initdb,
        (DataState::Empty, false) => StartPlan::Clone,
        (DataState::Primary, true) => StartPlan::RunPrimary,
        (DataState::Primary, false) => StartPlan::Demote,
        (DataState::Standby, true) => StartPlan::Promote,
        (DataState::Standby, false) => StartPlan::Follow,
    }
}

/// [`plan`], for a cluster whose database comes from a recovery (`recovery_ordered`): its first
/// instance recovers instead of making a new database.
pub fn plan_start(
    pod: &str,
    primary: &str,
    state: DataState,
    initialized: bool,
    recovery_ordered: bool,
) -> StartPlan {
    match plan(pod, primary, state, initialized) {
        StartPlan::Initdb if recovery_ordered => StartPlan::Recover,
        other => other,
    }
}

/// Whether this instance serves as the primary or follows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Primary,
    Replica,
}

impl StartPlan {
    pub fn role(self) -> Role {
        match self {
            StartPlan::Initdb | StartPlan::Recover | StartPlan::RunPrimary => Role::Primary,
            StartPlan::Clone
            | StartPlan::Follow
            | StartPlan::Demote
            | StartPlan::Promote
            | StartPlan::WaitForData => Role::Replica,
        }
    }
}

/// Settings a hot standby needs at least as high as its primary had them, as its control file
/// records them (`pg_controldata`'s label), with PostgreSQL's defaults. A standby started with
/// less stops at once ("recovery aborted because of insufficient parameter settings").
const HOT_STANDBY_MINIMUMS: [(&str, &str, i64); 5] = [
    ("max_connections", "max_connections setting", 100),
    ("max_worker_processes", "max_worker_processes setting", 8),
    ("max_wal_senders", "max_wal_senders setting", 10),
    ("max_prepared_transactions", "max_prepared_xacts setting", 0),
    (
        "max_locks_per_transaction",
        "max_locks_per_xact setting",
        64,
    ),
];

/// A setting this instance runs with higher than the operator asked for.
pub type Floor = (String, i64);

/// The values of [`HOT_STANDBY_MINIMUMS`] recorded in a data directory's control file, from
/// `pg_controldata`'s output.
pub fn parse_controldata(output: &str) -> Vec<Floor> {
    HOT_STANDBY_MINIMUMS
        .iter()
        .filter_map(|(name, label, _)| {
            let line = output.lines().find(|line| line.starts_with(label))?;
            let value = line.rsplit(':').next()?.trim().parse().ok()?;
            Some(((*name).to_owned(), value))
        })
        .collect()
}

/// The settings a standby must run higher than `config` asks, because the primary ran with
/// more when the standby last replayed its settings (`recorded`). When the settings go down,
/// the standby keeps the higher ones until it has replayed the primary's change; they then
/// drop out, and the usual reload-or-restart applies the lower values.
pub fn standby_floors(config: &str, recorded: &[Floor]) -> Vec<Floor> {
    HOT_STANDBY_MINIMUMS
        .iter()
        .filter_map(|(name, _, default)| {
            let (_, needed) = recorded.iter().find(|(other, _)| other == name)?;
            let asked = integer_setting(config, name).unwrap_or(*default);
            (*needed > asked).then(|| ((*name).to_owned(), *needed))
        })
        .collect()
}

/// The last integer value `config` gives `name` (`name = 90` or `name = '90'`).
fn integer_setting(config: &str, name: &str) -> Option<i64> {
    config
        .lines()
        .filter_map(|line| {
            let (key, value) = line.split_once('=')?;
            let value = value.split('#').next()?.trim().trim_matches('\'');
            (key.trim() == name).then(|| value.parse().ok())?
        })
        .next_back()
}

/// What the control file of `pgdata` records (see [`parse_controldata`]).
pub async fn recorded_settings(pgdata: &Path) -> Result<Vec<Floor>, DataDirError> {
    Ok(parse_controldata(&controldata(pgdata).await?))
}

/// `pg_controldata`'s output for `pgdata`, with its labels untranslated.
pub async fn controldata(pgdata: &Path) -> Result<String, DataDirError> {
    let output = Command::new("pg_controldata")
        .arg(pgdata)
        // Its labels are translated otherwise.
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|source| DataDirError::Spawn {
            program: "pg_controldata",
            source,
        })?;
    if !output.status.success() {
        return Err(DataDirError::Tool {
            program: "pg_controldata",
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The `postgresql.conf` this instance runs with: the operator's settings, then this
/// instance's own. A replica gets how to reach its `upstream` (the primary's host; none for a
/// primary, or a standby waiting to be promoted) and its slot (the password is in
/// `pgpass_file`, never in the configuration), and its `floors`.
pub fn server_config(
    desired: &Desired,
    pod: &str,
    upstream: Option<&str>,
    pgpass_file: &Path,
    floors: &[Floor],
    archive_command: &str,
    tls: Option<&InstanceTls<'_>>,
) -> String {
    let mut config = format!(
        "# Written by pgkube's instance manager from the cluster's ConfigMap; edits are overwritten.\n\
         {}\n\
         # This instance\n\
         cluster_name = '{}'\n",
        desired.postgresql_conf.trim_end(),
        quote(pod),
    );
    if desired.topology.wal_archive.is_some() {
        // Always the manager's own: spec.postgresql.parameters may not set it.
        config.push_str(&format!("archive_command = '{}'\n", quote(archive_command)));
    }
    if let Some(tls) = tls {
        config.push_str(&server_tls(tls));
    }
    if let Some(host) = upstream {
        let client_tls = tls.map(|tls| tls.client(ClientRole::Replication));
        config.push_str(&format!(
            "primary_conninfo = '{}'\nprimary_slot_name = '{}'\n",
            quote(&primary_conninfo(
                host,
                desired.topology.port,
                &desired.replication,
                pod,
                pgpass_file,
                client_tls.as_ref(),
            )),
            slot_name(pod),
        ));
    }
    if !floors.is_empty() {
        config.push_str(
            "# Kept at what the primary last ran with until this standby replays its change\n",
        );
        for (name, value) in floors {
            config.push_str(&format!("{name} = {value}\n"));
        }
    }
    config
}

/// A string inside a single-quoted `postgresql.conf` value.
fn quote(text: &str) -> String {
    text.replace('\'', "''")
}

/// A password file line that matches any host, port and database for `credentials`.
pub fn pgpass(credentials: &Credentials) -> String {
    let field = |text: &str| text.replace('\\', "\\\\").replace(':', "\\:");
    format!(
        "*:*:*:{}:{}\n",
        field(&credentials.username),
        field(&credentials.password)
    )
}

/// Writes `content` to `path` with mode `mode`, replacing it whole (a reader sees the old file
/// or the new one).
pub fn write_file(path: &Path, content: &str, mode: u32) -> Result<(), DataDirError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let partial = path.with_extension("pgkube-partial");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&partial)
        .map_err(io_error("cannot create", &partial))?;
    file.write_all(content.as_bytes())
        .map_err(io_error("cannot write", &partial))?;
    std::fs::rename(&partial, path).map_err(io_error("cannot replace", path))
}

/// Writes the configuration files into the data directory; true when either changed.
pub fn write_config(pgdata: &Path, config: &str, hba: &str) -> Result<bool, DataDirError> {
    let mut changed = false;
    for (name, content) in [(CONFIG_FILE, config), (HBA_FILE, hba)] {
        let path = pgdata.join(name);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(content) {
            write_file(&path, content, 0o600)?;
            changed = true;
        }
    }
    Ok(changed)
}

/// Makes the data directory a standby's (or a primary's, with `standby` false).
pub fn set_standby(pgdata: &Path, standby: bool) -> Result<(), DataDirError> {
    let signal = pgdata.join(STANDBY_SIGNAL);
    if standby {
        write_file(&signal, "", 0o600)
    } else {
        match std::fs::remove_file(&signal) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                Err(io_error("cannot remove", &signal)(error))
            }
            _ => Ok(()),
        }
    }
}

/// A new database cluster, owned by `superuser` with the password from its Secret file.
pub async fn initdb(pgdata: &Path, superuser: &Credentials) -> Result<(), DataDirError> {
    let mut command = Command::new("initdb");
    command
        .arg(format!("--pgdata={}", pgdata.display()))
        .arg(format!("--username={}", superuser.username))
        .arg(format!("--pwfile={}", superuser.password_file.display()))
        .args([
            "--auth-local=peer",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            // Detects corruption of pages by the storage, as every production cluster should.
            "--data-checksums",
        ]);
    run_tool("initdb", command).await
}

/// A copy of the primary into `pgdata`, made in a side directory and swapped in only when
/// complete: an interrupted clone never looks like data, and data it replaces stays until the
/// copy is whole (see [`swap_in`]).
pub async fn clone_primary(
    pgdata: &Path,
    primary_host: &str,
    port: u16,
    pod: &str,
    pgpass_file: &Path,
    replication: &Credentials,
    tls: Option<&ClientTls>,
) -> Result<(), DataDirError> {
    let partial = pgdata.with_extension("clone");
    remove_dir(&partial)?;
    let mut command = Command::new("pg_basebackup");
    command
        .arg(format!("--pgdata={}", partial.display()))
        .arg(format!("--host={primary_host}"))
        .arg(format!("--port={port}"))
        .arg(format!("--username={}", replication.username))
        .arg(format!("--slot={}", slot_name(pod)))
        .args(["--wal-method=stream", "--checkpoint=fast", "--no-password"])
        .env("PGPASSFILE", pgpass_file)
        .env("PGAPPNAME", pod);
    match tls {
        Some(tls) => command.envs(tls.env()),
        None => command.env("PGSSLMODE", "disable"),
    };
    run_tool("pg_basebackup", command).await?;
    swap_in(&partial, pgdata)
}

/// Where the data a clone replaces waits until the clone is in place.
fn previous_of(pgdata: &Path) -> PathBuf {
    pgdata.with_extension("previous")
}

/// Moves the complete copy `complete` to `pgdata`: the old data is renamed aside first, the
/// copy renamed in (durably), then the old data removed. Each step is a rename, so a crash
/// leaves either the old data in place or aside (see [`recover_interrupted_swap`]), never
/// nothing.
pub fn swap_in(complete: &Path, pgdata: &Path) -> Result<(), DataDirError> {
    let previous = previous_of(pgdata);
    remove_dir(&previous)?;
    if pgdata.exists() {
        std::fs::rename(pgdata, &previous)
            .map_err(io_error("cannot move the old data aside to", &previous))?;
    }
    std::fs::rename(complete, pgdata).map_err(io_error("cannot move the copy to", pgdata))?;
    // The renames reach the disk before the old data goes.
    let parent = pgdata
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    sync_directory(parent).map_err(io_error("cannot make the renames durable in", parent))?;
    remove_dir(&previous)
}

/// `fsync`s a directory, so that the entries made or renamed in it are on disk.
pub fn sync_directory(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path).and_then(|directory| directory.sync_all())
}

/// After a crash in the middle of [`swap_in`]: data moved aside while nothing took its place
/// goes back (the copy is made again). Run before the data directory is looked at.
pub fn recover_interrupted_swap(pgdata: &Path) -> Result<(), DataDirError> {
    let previous = previous_of(pgdata);
    if !previous.exists() {
        return Ok(());
    }
    if DataState::of(pgdata) == DataState::Empty {
        tracing::warn!(previous = %previous.display(), "a copy was interrupted while swapping in: the data it was to replace goes back");
        remove_dir(pgdata)?;
        std::fs::rename(&previous, pgdata)
            .map_err(io_error("cannot move the old data back to", pgdata))?;
        return Ok(());
    }
    remove_dir(&previous)
}

/// Rewinds `pgdata` (a former primary's data, stopped) to the history of the primary that
/// `source_conninfo` reaches, with pg_rewind. It says "no rewind required" and changes nothing
/// when the histories did not diverge; a target that was not shut down cleanly is first
/// recovered by pg_rewind itself (single-user mode, PostgreSQL 13 and later).
pub async fn rewind(pgdata: &Path, source_conninfo: &str) -> Result<(), DataDirError> {
    let mut command = Command::new("pg_rewind");
    command
        .arg(format!("--target-pgdata={}", pgdata.display()))
        .arg(format!("--source-server={source_conninfo}"))
        .arg("--progress")
        // Its messages are read by people, in the container's log.
        .env("LC_ALL", "C");
    run_tool("pg_rewind", command).await
}

/// Removes the replication slots kept in a stopped server's data directory. A former primary
/// that rejoins as a standby would otherwise keep the WAL its old replicas needed, forever:
/// nobody streams from a standby here. (pg_basebackup never copies slots; pg_rewind leaves
/// the target's in place.)
pub fn remove_slots(pgdata: &Path) -> Result<(), DataDirError> {
    let dir = pgdata.join("pg_replslot");
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(io_error("cannot read", &dir)(error)),
    };
    for entry in entries {
        let path = entry.map_err(io_error("cannot read", &dir))?.path();
        remove_dir(&path)?;
        tracing::info!(slot = %path.display(), "replication slot of the former primary removed");
    }
    Ok(())
}

/// Removes a directory and everything in it, if it exists.
pub fn remove_dir(path: &Path) -> Result<(), DataDirError> {
    match std::fs::remove_dir_all(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            Err(io_error("cannot remove", path)(error))
        }
        _ => Ok(()),
    }
}

async fn run_tool(program: &'static str, mut command: Command) -> Result<(), DataDirError> {
    tracing::info!(program, "running");
    let output = command
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|source| DataDirError::Spawn { program, source })?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    Err(DataDirError::Tool {
        program,
        status: output.status,
        stderr: stderr.trim().lines().last().unwrap_or_default().to_owned(),
    })
}

mod conninfo;
pub use conninfo::{InstanceTls, superuser_conninfo};
use conninfo::{primary_conninfo, server_tls};

#[cfg(test)]
mod tests;
