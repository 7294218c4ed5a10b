//! The peer: postgres_exporter, Debian's `prometheus-postgres-exporter` package (installed with
//! `apt-get` when missing), run with its default collectors against the same server over the
//! same Unix socket as the instance manager, as the same superuser.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pgkube_testkit::{http_get, install_package};

use super::instance_common::{Bed, nix_is_root};

const BINARY: &str = "prometheus-postgres-exporter";
/// Its backends' `application_name`, to tell them apart in the server's log.
pub const APPLICATION: &str = "postgres_exporter";
const READY_WAIT: Duration = Duration::from_secs(60);

pub struct Exporter {
    child: Child,
    pub address: SocketAddr,
}

impl Exporter {
    /// Starts the exporter with `args` for instance `index`'s server, once it reports
    /// `pg_up 1`.
    pub async fn start(bed: &Bed, index: usize, args: &[&str]) -> Result<Exporter, String> {
        let address = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|e| format!("a free port: {e}"))?;
        let instance = &bed.instances[index];
        let dsn = format!(
            "host={} port={} user={} dbname=postgres sslmode=disable application_name={APPLICATION}",
            instance.seen_dir.join("socket").display(),
            instance.pg_port,
            bed.superuser,
        );
        // As the OS user whose name is the superuser's: the socket's `peer` authentication.
        let mut command = if nix_is_root() {
            let mut command = Command::new("setpriv");
            command.args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--",
                BINARY,
            ]);
            command
        } else {
            Command::new(BINARY)
        };
        let log = std::fs::File::create(bed.root.join("postgres_exporter.log"))
            .map_err(|e| format!("its log: {e}"))?;
        let child = command
            .arg(format!("--web.listen-address={address}"))
            .args(args)
            .env("DATA_SOURCE_NAME", dsn)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("{BINARY}: {e}"))?;
        let exporter = Exporter { child, address };
        exporter.wait_up().await?;
        Ok(exporter)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn wait_up(&self) -> Result<(), String> {
        let deadline = Instant::now() + READY_WAIT;
        loop {
            let last = match http_get(self.address, "/metrics").await {
                Ok((200, body)) if body.lines().any(|line| line == "pg_up 1") => return Ok(()),
                Ok((code, _)) => format!("HTTP {code}"),
                Err(error) => error.to_string(),
            };
            if Instant::now() > deadline {
                return Err(format!("{BINARY} never reported pg_up 1: {last}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Installs the exporter when it is missing; its version, as it prints it.
pub fn install() -> Result<String, String> {
    install_package(BINARY, BINARY)?;
    let output = Command::new(BINARY)
        .arg("--version")
        .output()
        .map_err(|e| format!("{BINARY} --version: {e}"))?;
    // kingpin prints it on stderr: `postgres_exporter, version 0.11.1 (branch: ...`.
    let text = String::from_utf8_lossy(&output.stderr).into_owned()
        + &String::from_utf8_lossy(&output.stdout);
    text.split_whitespace()
        .skip_while(|word| *word != "version")
        .nth(1)
        .map(str::to_owned)
        .ok_or_else(|| format!("no version in {text:?}"))
}
