//! A PostgreSQL 15 server for the benches (`wal_archive`, `base_backup`), run as `postgres` on 127.0.0.1: either `postgres`
//! itself (for the peers, after an initdb) or pgkube's instance manager, which runs initdb and
//! `postgres` as in a pod.

use std::any::Any;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

pub const BIN: &str = "/usr/lib/postgresql/15/bin";

/// Settings every server of the bench runs with, whatever archives its WAL.
pub fn common_settings(dir: &Path, port: u16) -> String {
    format!(
        "listen_addresses = '127.0.0.1'\n\
         port = {port}\n\
         unix_socket_directories = '{}'\n\
         wal_level = replica\n\
         max_wal_size = 4GB\n\
         shared_buffers = 256MB\n\
         archive_mode = on\n\
         archive_timeout = 60s\n",
        dir.join("socket").display()
    )
}

/// Everyone may connect, replication too: the benches measure archiving and base backups, not
/// authentication.
pub const HBA: &str = "local all all trust\nhost all all 127.0.0.1/32 trust\n\
                       host replication all 127.0.0.1/32 trust\n";

pub struct Server {
    child: Child,
    pub port: u16,
    pgdata: PathBuf,
    #[allow(dead_code)] // read by the base_backup bench only
    socket: PathBuf,
    /// What must live as long as the server (a proxy in front of the store).
    _keep: Option<Box<dyn Any>>,
}

impl Server {
    /// `initdb` in `dir/pgdata`, `extra` appended to its `postgresql.conf`, then `postgres`
    /// with `env` (which its `archive_command` inherits).
    /// `dir` must have been [`prepare`]d.
    pub fn postgres(dir: &Path, port: u16, extra: &str, env: &[(&str, String)]) -> Server {
        let pgdata = dir.join("pgdata");
        let status = as_postgres(&format!("{BIN}/initdb"))
            .args([
                "-D",
                &pgdata.to_string_lossy(),
                "-U",
                "postgres",
                "--auth=trust",
            ])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("initdb runs");
        assert!(status.success(), "initdb: {status}");
        let conf = pgdata.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).expect("postgresql.conf");
        text.push_str(&common_settings(dir, port));
        text.push_str(extra);
        std::fs::write(&conf, text).expect("postgresql.conf");
        std::fs::write(pgdata.join("pg_hba.conf"), HBA).expect("pg_hba.conf");
        let mut command = as_postgres(&format!("{BIN}/postgres"));
        command.args(["-D", &pgdata.to_string_lossy()]);
        for (name, value) in env {
            command.env(name, value);
        }
        let child = command
            .stderr(log_file(dir))
            .spawn()
            .expect("postgres starts");
        Server {
            child,
            port,
            pgdata,
            socket: dir.join("socket"),
            _keep: None,
        }
    }

    /// `pgkube instance run` with the files of `dir` (see `peers::pgkube`).
    pub fn instance_manager(dir: &Path, port: u16, status_port: u16) -> Server {
        Self::instance_manager_with(dir, port, status_port, &[])
    }

    /// [`Self::instance_manager`], with `env` added to its environment.
    pub fn instance_manager_with(
        dir: &Path,
        port: u16,
        status_port: u16,
        env: &[(&str, String)],
    ) -> Server {
        let path = format!("{BIN}:{}", std::env::var("PATH").unwrap_or_default());
        // A copy the `postgres` user may run (the build's directory may be root's alone), as
        // the pod's init container installs it: `archive_command` runs this binary too.
        let binary = dir.join("run/pgkube");
        std::fs::copy(env!("CARGO_BIN_EXE_pgkube"), &binary).expect("the pgkube binary copied");
        give_to_postgres(dir);
        let child = as_postgres(&binary.to_string_lossy())
            .args(["instance", "run"])
            .env("PATH", path)
            .env("POD_NAME", "bench-0")
            .env("PGDATA", dir.join("data/pgdata"))
            .env("PGKUBE_CONFIG_DIR", dir.join("config"))
            .env("PGKUBE_SUPERUSER_DIR", dir.join("superuser"))
            .env("PGKUBE_REPLICATION_DIR", dir.join("replication"))
            .env("PGKUBE_CONTROL_DIR", dir.join("control"))
            .env("PGKUBE_RUN_DIR", dir.join("run"))
            .env("PGKUBE_SOCKET_DIR", dir.join("socket"))
            .env("PGKUBE_S3_DIR", dir.join("s3"))
            .env("PGKUBE_PORT", port.to_string())
            .env("PGKUBE_STATUS_ADDRESS", "127.0.0.1")
            .env("PGKUBE_STATUS_PORT", status_port.to_string())
            .env("LANG", "C.UTF-8")
            .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
            .stderr(log_file(dir))
            .spawn()
            .expect("pgkube instance run starts");
        Server {
            child,
            port,
            pgdata: dir.join("data/pgdata"),
            socket: dir.join("socket"),
            _keep: None,
        }
    }

    /// A `postgres` the bench started itself on `pgdata`, with its socket in `dir`.
    #[allow(dead_code)] // used by the recovery bench only
    pub fn adopt(child: Child, port: u16, pgdata: &Path, dir: &Path) -> Server {
        Server {
            child,
            port,
            pgdata: pgdata.to_owned(),
            socket: dir.join("socket"),
            _keep: None,
        }
    }

    #[allow(dead_code)] // used by the base_backup and recovery benches only
    pub fn pgdata(&self) -> &Path {
        &self.pgdata
    }

    /// The directory of the server's Unix socket.
    #[allow(dead_code)] // used by the base_backup and recovery benches only
    pub fn socket_dir(&self) -> &Path {
        &self.socket
    }

    pub fn keep(mut self, value: Box<dyn Any>) -> Server {
        self._keep = Some(value);
        self
    }

    /// A connection as `postgres`, once the server accepts one (at most two minutes).
    pub async fn connect(&mut self) -> tokio_postgres::Client {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let connected = tokio_postgres::Config::new()
                .host("127.0.0.1")
                .port(self.port)
                .user("postgres")
                .dbname("postgres")
                .connect(tokio_postgres::NoTls)
                .await;
            match connected {
                Ok((client, connection)) => {
                    tokio::spawn(connection);
                    return client;
                }
                Err(error) if Instant::now() > deadline => panic!("no server: {error}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// The peak resident set (`VmHWM`) of the server's own process so far: the instance
    /// manager, or the postmaster.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// Whether the server's own process (the instance manager, or the postmaster) has exited.
    #[allow(dead_code)] // used by the recovery bench only
    pub fn has_exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// A fast shutdown, then the process is reaped.
    pub fn stop(&mut self) {
        let _ = as_postgres(&format!("{BIN}/pg_ctl"))
            .args(["stop", "-m", "fast", "-D", &self.pgdata.to_string_lossy()])
            .stdout(std::process::Stdio::null())
            .status();
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// A command run as `postgres` (the bench runs as root).
pub fn as_postgres(program: &str) -> Command {
    let mut command = Command::new("setpriv");
    command.args([
        "--reuid=postgres",
        "--regid=postgres",
        "--init-groups",
        "--",
        program,
    ]);
    command
}

/// `dir` made anew, with its socket directory, owned by `postgres`.
pub fn prepare(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("socket")).expect("bench dir");
    give_to_postgres(dir);
}

pub fn give_to_postgres(dir: &Path) {
    let status = Command::new("chown")
        .args(["-R", "postgres:postgres", &dir.to_string_lossy()])
        .status()
        .expect("chown");
    assert!(status.success(), "chown {}: {status}", dir.display());
}

fn log_file(dir: &Path) -> std::fs::File {
    std::fs::File::create(dir.join("server.log")).expect("log file")
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}
