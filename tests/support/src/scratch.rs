//! A scratch PostgreSQL server on this machine, started from a restored data directory: for
//! tests that prove a physical backup restores (base backup plus archived WAL).
//!
//! The directory is under the system's temporary directory, so that the `postgres` user can
//! reach it. The server refuses to run as root: as root, it runs as the `postgres` system user
//! (`setpriv`, as the test bed's own server does). It listens on a free loopback port only,
//! trusts loopback connections and is stopped and removed on [`ScratchServer::stop`] (or on
//! drop, best effort).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio_postgres::{Client, NoTls};

use crate::names::unique_name;
use crate::wait::wait_until;

/// PostgreSQL 15's programs, from Debian's packages.
pub const PG15_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A directory of its own for one restore: `data/` (the data directory), `wal/` (the WAL a
/// restore replays) and the server's own settings beside them.
pub struct ScratchServer {
    root: PathBuf,
    port: u16,
    started: bool,
}

impl ScratchServer {
    /// Creates `<tmp>/<prefix>-<random>/` with empty `data/` and `wal/`.
    pub fn create(prefix: &str) -> anyhow::Result<Self> {
        let root = std::env::temp_dir().join(unique_name(prefix));
        for dir in ["data", "wal", "socket"] {
            std::fs::create_dir_all(root.join(dir))
                .with_context(|| format!("creating {}", root.join(dir).display()))?;
        }
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        Ok(Self {
            root,
            port,
            started: false,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    pub fn wal(&self) -> PathBuf {
        self.root.join("wal")
    }

    /// Starts the server on `data/` for an archive recovery that replays `wal/` up to the
    /// first consistent point (`recovery_target = 'immediate'`), then promotes, and returns a
    /// connection as `user` once it accepts writes. The data directory's own settings
    /// (`postgresql.auto.conf`, `standby.signal`) are the cluster's: they are replaced.
    pub async fn recover_to_consistency(&mut self, user: &str) -> anyhow::Result<Client> {
        let data = self.data();
        let _ = std::fs::remove_file(data.join("standby.signal"));
        std::fs::write(data.join("postgresql.auto.conf"), "")?;
        std::fs::write(data.join("recovery.signal"), "")?;
        let config = self.root.join("scratch.conf");
        std::fs::write(&config, self.settings())?;
        std::fs::write(
            self.root.join("pg_hba.conf"),
            "local all all trust\nhost all all 127.0.0.1/32 trust\n",
        )?;
        std::fs::write(self.root.join("pg_ident.conf"), "")?;
        as_postgres(
            Command::new("chown")
                .arg("-R")
                .arg("postgres:")
                .arg(&self.root),
            false,
        )?;
        as_postgres(Command::new("chmod").arg("0700").arg(&data), false)?;
        let log = self.root.join("server.log");
        self.started = true;
        let started = as_postgres(
            Command::new(format!("{PG15_BIN}/pg_ctl"))
                .arg("--pgdata")
                .arg(&data)
                .arg("--log")
                .arg(&log)
                .args(["--wait", "--timeout", "300", "--options"])
                .arg(format!("-c config_file={}", config.display()))
                .arg("start"),
            true,
        );
        if let Err(error) = started {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            bail!("{error:#}\nserver log:\n{log}");
        }
        let url = format!(
            "host=127.0.0.1 port={} user={user} dbname=postgres",
            self.port
        );
        wait_until(
            "the scratch server is promoted",
            Duration::from_secs(300),
            || async {
                let Ok((client, connection)) = tokio_postgres::connect(&url, NoTls).await else {
                    return Ok(None);
                };
                tokio::spawn(connection);
                let recovering: bool = client
                    .query_one("SELECT pg_is_in_recovery()", &[])
                    .await?
                    .get(0);
                Ok((!recovering).then_some(client))
            },
        )
        .await
    }

    fn settings(&self) -> String {
        let path = |name: &str| self.root.join(name).display().to_string();
        format!(
            "listen_addresses = '127.0.0.1'\n\
             port = {port}\n\
             unix_socket_directories = '{socket}'\n\
             hba_file = '{hba}'\n\
             ident_file = '{ident}'\n\
             shared_buffers = '32MB'\n\
             max_connections = 20\n\
             hot_standby = off\n\
             archive_mode = off\n\
             restore_command = 'cp {wal}/%f %p'\n\
             recovery_target = 'immediate'\n\
             recovery_target_action = 'promote'\n",
            port = self.port,
            socket = path("socket"),
            hba = path("pg_hba.conf"),
            ident = path("pg_ident.conf"),
            wal = path("wal"),
        )
    }

    /// The server's log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("server.log")).unwrap_or_default()
    }

    /// Stops the server (if started) and removes the directory.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        if std::mem::take(&mut self.started) {
            let stopped = as_postgres(
                Command::new(format!("{PG15_BIN}/pg_ctl"))
                    .arg("--pgdata")
                    .arg(self.data())
                    .args(["--mode", "immediate", "--wait", "stop"]),
                true,
            );
            if let Err(error) = stopped {
                eprintln!("warning: stopping the scratch server: {error:#}");
            }
        }
        if let Err(error) = std::fs::remove_dir_all(&self.root) {
            eprintln!("warning: removing {}: {error}", self.root.display());
        }
    }
}

impl Drop for ScratchServer {
    fn drop(&mut self) {
        if self.root.exists() {
            self.shut_down();
        }
    }
}

/// Runs `command` to its end and fails with its output unless it succeeds; as the `postgres`
/// user when `as_user` and this process is root.
fn as_postgres(command: &mut Command, as_user: bool) -> anyhow::Result<String> {
    let mut command = if as_user && is_root() {
        let mut wrapped = Command::new("setpriv");
        wrapped
            .args([
                "--reuid",
                "postgres",
                "--regid",
                "postgres",
                "--init-groups",
            ])
            .arg(command.get_program())
            .args(command.get_args())
            .current_dir("/");
        wrapped
    } else {
        std::mem::replace(command, Command::new("true"))
    };
    let output = command
        .output()
        .with_context(|| format!("running {:?}", command.get_program()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        bail!(
            "{:?} failed ({}): {text}",
            command.get_program(),
            output.status
        );
    }
    Ok(text)
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(1) == Some("0"))
    })
}

/// Runs one of PostgreSQL 15's programs (`pg_verifybackup`, `pg_waldump`...) with `args` and
/// returns its output, or fails with it.
pub fn run_pg15(program: &str, args: &[&std::ffi::OsStr]) -> anyhow::Result<String> {
    as_postgres(
        Command::new(format!("{PG15_BIN}/{program}")).args(args),
        false,
    )
}
