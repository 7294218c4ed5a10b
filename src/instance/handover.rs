//! The instance manager's binary: its installation by the pod's init container ([`install`]),
//! and its in-place upgrades, in which a new pgkube binary takes over the running manager's
//! process and PostgreSQL goes on running (issue 44).
//!
//! 1. The operator sends its binary to `POST /control/upgrade` (the control bearer token, and
//!    the binary's SHA-256 in the `pgkube-binary-sha256` header). The endpoint writes it beside
//!    the installed binary (`<binary>.upgrade`), checks its digest and that it runs
//!    (`--version`), and hands it to the supervisor.
//! 2. The supervisor takes it between two turns of its loop, never during a long step, and not
//!    while its server restores WAL through it: it writes a [`Handover`] record, renames the
//!    new binary over the installed one and execs it in the same process. The postmaster is a
//!    child of that process; it keeps running, and its clients keep their connections.
//! 3. The new manager reads the record when it starts ([`take`]). It adopts the server only
//!    when the process the record names is its own child and the data directory's
//!    `postmaster.pid` names it too; otherwise it starts as after any restart.
//!
//! The status the old manager served goes with the record, so that the endpoint answers as
//! before until the new manager's first look at the server (a primary that reported itself
//! not ready would be failed over).

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context as _;
use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt as _;
use tokio::sync::oneshot;

use super::control::{self, Control, ControlRequest, Order, Target, Terms};
use super::datadir::Role;
use super::endpoint::InstanceStatus;
use super::roles::floors;
use super::server::Server;
use super::{Instance, sql};

/// The record's file name in the run directory.
const RECORD: &str = "handover.json";
/// The header with the SHA-256 (hex) of the binary sent.
pub const DIGEST_HEADER: &str = "pgkube-binary-sha256";
/// The largest binary taken.
const MAX_BINARY_BYTES: usize = 1 << 30;
/// How long the new binary may take to print its version.
const VERSION_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the endpoint waits for the supervisor to take the upgrade.
const TAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Between the answer to the operator and the exec: time for the answer to leave.
pub const ANSWER_GRACE: Duration = Duration::from_millis(200);

/// What the old manager knew that the data directory does not say.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Handover {
    pub postmaster_pid: u32,
    pub primary: bool,
    /// The primary a replica follows (pod and host).
    pub upstream: Option<(String, String)>,
    /// The highest term of the orders carried out.
    pub term: i64,
    pub initialized_by: Option<String>,
    /// Whether the manager rewrote the configuration since the server started (a pending
    /// restart is then its own to do).
    pub changed_since_start: bool,
    /// The status served last.
    pub status: InstanceStatus,
}

/// An upgrade handed to the supervisor: the checked binary and its digest.
#[derive(Debug)]
pub struct Upgrade {
    pub binary: PathBuf,
    pub digest: String,
    /// Whether the supervisor will exec it, or why not.
    pub reply: oneshot::Sender<Result<(), String>>,
}

/// The running manager's binary: where it is installed, and its digest once computed.
#[derive(Debug)]
pub struct ManagerBinary {
    pub installed: PathBuf,
    pub digest: OnceLock<String>,
    /// One upload at a time.
    receiving: tokio::sync::Mutex<()>,
}

impl ManagerBinary {
    /// The binary this process runs; its digest is computed in the background.
    pub fn current() -> std::io::Result<Arc<Self>> {
        let binary = Arc::new(Self {
            installed: std::env::current_exe()?,
            digest: OnceLock::new(),
            receiving: tokio::sync::Mutex::new(()),
        });
        let computing = binary.clone();
        tokio::task::spawn_blocking(move || match digest_of(&computing.installed) {
            Ok(digest) => {
                let _ = computing.digest.set(digest);
            }
            Err(error) => tracing::warn!(%error, "cannot compute the manager binary's digest"),
        });
        Ok(binary)
    }

    fn staged(&self) -> PathBuf {
        self.installed.with_extension("upgrade")
    }
}

/// Copies the running binary to `destination`, whole or not at all.
pub fn install(destination: &Path) -> anyhow::Result<()> {
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

/// The hex SHA-256 of a file.
pub fn digest_of(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

/// `POST /control/upgrade`: 202 once the supervisor takes the binary (it execs it right
/// after), 200 when it already runs it; 400 for a missing digest or one the body does not
/// match, 409 when the binary does not run or the supervisor refuses now, 503 while another
/// upload is received.
pub async fn receive(
    control: &Control,
    binary: &ManagerBinary,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    if let Err((code, why)) = control::authorize(&control.token_file, headers) {
        return control::message(code, why);
    }
    let Some(expected) = headers
        .get(DIGEST_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(|value| value.trim().to_ascii_lowercase())
        .filter(|value| value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit()))
    else {
        return control::message(
            StatusCode::BAD_REQUEST,
            "the pgkube-binary-sha256 header must be the binary's SHA-256 in hex",
        );
    };
    if binary.digest.get() == Some(&expected) {
        return control::message(StatusCode::OK, "this binary runs already");
    }
    let Ok(_receiving) = binary.receiving.try_lock() else {
        return control::message(
            StatusCode::SERVICE_UNAVAILABLE,
            "another binary is being received",
        );
    };
    let staged = binary.staged();
    if let Err((code, why)) = stage(&staged, &expected, body).await {
        let _ = tokio::fs::remove_file(&staged).await;
        return control::message(code, &why);
    }
    let (reply, answer) = oneshot::channel();
    let upgrade = Upgrade {
        binary: staged.clone(),
        digest: expected,
        reply,
    };
    let order = Order {
        term: 0,
        request: ControlRequest::Upgrade(upgrade),
    };
    if control.requests.try_send(order).is_err() {
        let _ = tokio::fs::remove_file(&staged).await;
        return control::message(
            StatusCode::SERVICE_UNAVAILABLE,
            "the instance manager is busy",
        );
    }
    match tokio::time::timeout(TAKE_TIMEOUT, answer).await {
        Ok(Ok(Ok(()))) => control::message(
            StatusCode::ACCEPTED,
            "handing over to the new instance manager",
        ),
        Ok(Ok(Err(why))) => control::message(StatusCode::CONFLICT, &why),
        Ok(Err(_)) | Err(_) => control::message(
            StatusCode::CONFLICT,
            "the instance manager did not take the upgrade in time",
        ),
    }
}

impl Upgrade {
    /// Not taken now: the staged binary goes, the operator is told why (and tries again later).
    pub fn refuse(self, why: String) {
        tracing::warn!(%why, "the new instance manager is not taken");
        let _ = std::fs::remove_file(&self.binary);
        let _ = self.reply.send(Err(why));
    }
}

impl Instance {
    /// Execs the new binary, the server left running; returns the server only if the handover
    /// did not happen (refused, or the exec failed).
    pub(super) async fn hand_over(&mut self, server: Server, upgrade: Upgrade) -> Server {
        if self.restoring.is_some() {
            upgrade.refuse("the server restores WAL through this manager".to_owned());
            return server;
        }
        let Some(postmaster_pid) = server.pid() else {
            upgrade.refuse("the server is not running".to_owned());
            return server;
        };
        let record = Handover {
            postmaster_pid,
            primary: self.role == Role::Primary,
            upstream: self.upstream.clone().map(|t| (t.pod, t.host)),
            term: self.terms.highest(),
            initialized_by: self.initialized_by.clone(),
            changed_since_start: self.changed_since_start,
            status: self.board.status(),
        };
        let run_dir = self.args.run_dir.clone();
        if let Err(error) = write(&run_dir, &record) {
            upgrade.refuse(format!("cannot write the handover record: {error}"));
            return server;
        }
        if let Err(error) = std::fs::rename(&upgrade.binary, &self.binary.installed) {
            discard(&run_dir);
            upgrade.refuse(format!("cannot install the new binary: {error}"));
            return server;
        }
        let _ = upgrade.reply.send(Ok(()));
        tokio::time::sleep(ANSWER_GRACE).await;
        tracing::info!(digest = %upgrade.digest, postmaster = postmaster_pid, "handing over to the new instance manager; the server keeps running");
        let error = exec(&self.binary.installed);
        tracing::error!(%error, "cannot exec the new instance manager; this one goes on");
        discard(&run_dir);
        server
    }

    /// The server a previous manager of this process handed over, with what it knew.
    pub(super) async fn adopt(&mut self) -> anyhow::Result<Option<Server>> {
        let Some(handover) = take(&self.args.run_dir, &self.args.pgdata) else {
            // Whatever status a record carried is not this server's.
            self.set_status(InstanceStatus::starting(&self.args.pod_name));
            return Ok(None);
        };
        tracing::info!(
            pid = handover.postmaster_pid,
            "taking over the running server from the previous instance manager"
        );
        self.role = if handover.primary {
            Role::Primary
        } else {
            Role::Replica
        };
        self.upstream = handover.upstream.map(|(pod, host)| Target { pod, host });
        self.terms = Terms::at(handover.term);
        self.initialized_by = handover.initialized_by;
        self.floors = floors(self.role, &self.args.pgdata, &self.applied).await?;
        self.changed_since_start = handover.changed_since_start;
        self.credentials_applied = false;
        self.client = None;
        self.admission = sql::Admission::Accepted;
        self.stall.reset();
        // What changed in the files meanwhile is written, and reloaded with the next look.
        let desired = self.applied.clone();
        self.write_files(&desired)?;
        Ok(Some(Server::adopt(
            handover.postmaster_pid,
            &self.args.pgdata,
        )?))
    }
}

/// Writes the body to `staged`, durable and executable, and checks its digest and that it
/// runs.
async fn stage(staged: &Path, expected: &str, body: Body) -> Result<(), (StatusCode, String)> {
    let failed = |what: &str, error: &dyn std::fmt::Display| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot {what} {}: {error}", staged.display()),
        )
    };
    let mut file = tokio::fs::File::create(staged)
        .await
        .map_err(|e| failed("create", &e))?;
    let mut hasher = Sha256::new();
    let mut received = 0usize;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| (StatusCode::BAD_REQUEST, format!("body: {e}")))?;
        received += chunk.len();
        if received > MAX_BINARY_BYTES {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                "the binary is larger than 1 GiB".to_owned(),
            ));
        }
        hasher.write_all(&chunk).map_err(|e| failed("hash", &e))?;
        file.write_all(&chunk)
            .await
            .map_err(|e| failed("write", &e))?;
    }
    file.sync_all().await.map_err(|e| failed("sync", &e))?;
    drop(file);
    let digest = hex::encode(hasher.finalize());
    if digest != expected {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("the binary received has SHA-256 {digest}, not {expected}"),
        ));
    }
    tokio::fs::set_permissions(staged, std::fs::Permissions::from_mode(0o755))
        .await
        .map_err(|e| failed("make executable", &e))?;
    runs(staged)
        .await
        .map_err(|why| (StatusCode::CONFLICT, why))
}

/// Whether `binary` starts and prints its version.
async fn runs(binary: &Path) -> Result<(), String> {
    let output = tokio::process::Command::new(binary)
        .arg("--version")
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(VERSION_TIMEOUT, output).await {
        Ok(Ok(output)) if output.status.success() => Ok(()),
        Ok(Ok(output)) => Err(format!(
            "the binary received does not run: --version exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Ok(Err(error)) => Err(format!("the binary received does not run: {error}")),
        Err(_) => Err("the binary received did not print its version in time".to_owned()),
    }
}

fn record_path(run_dir: &Path) -> PathBuf {
    run_dir.join(RECORD)
}

/// Writes the record durably: a new file, then a rename.
pub fn write(run_dir: &Path, handover: &Handover) -> std::io::Result<()> {
    let path = record_path(run_dir);
    let partial = path.with_extension("partial");
    let mut file = std::fs::File::create(&partial)?;
    file.write_all(&serde_json::to_vec(handover).map_err(std::io::Error::other)?)?;
    file.sync_all()?;
    std::fs::rename(&partial, &path)
}

/// Removes the record (an exec that failed).
pub fn discard(run_dir: &Path) {
    if let Err(error) = std::fs::remove_file(record_path(run_dir))
        && error.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(%error, "cannot remove the handover record");
    }
}

/// The record, if one is there; it stays.
pub fn peek(run_dir: &Path) -> Option<Handover> {
    let text = std::fs::read(record_path(run_dir)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// The record, removed, when the server it names is this process's child and runs on
/// `pgdata`; none otherwise (the server, if any, is not this manager's to adopt).
pub fn take(run_dir: &Path, pgdata: &Path) -> Option<Handover> {
    let handover = peek(run_dir);
    discard(run_dir);
    let handover = handover?;
    let pid = handover.postmaster_pid;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let pid_file = std::fs::read_to_string(pgdata.join("postmaster.pid")).unwrap_or_default();
    match adoptable(pid, std::process::id(), &stat, &pid_file) {
        Ok(()) => Some(handover),
        Err(why) => {
            tracing::warn!(pid, "a handover record, but no server to adopt: {why}");
            None
        }
    }
}

/// Whether the process `pid`, whose `/proc/<pid>/stat` is `stat`, is a child of `own_pid` and
/// the postmaster `postmaster.pid` names (pure).
fn adoptable(pid: u32, own_pid: u32, stat: &str, pid_file: &str) -> Result<(), String> {
    let parent = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|parent| parent.parse::<u32>().ok())
        .ok_or_else(|| format!("process {pid} is gone"))?;
    if parent != own_pid {
        return Err(format!("process {pid} is not a child of this one"));
    }
    let named = pid_file.lines().next().and_then(|l| l.trim().parse().ok());
    if named != Some(pid) {
        return Err(format!("postmaster.pid names {named:?}, not process {pid}"));
    }
    Ok(())
}

/// Replaces this process's program with `binary`, same arguments and environment. Returns
/// only if that failed.
pub fn exec(binary: &Path) -> std::io::Error {
    std::process::Command::new(binary)
        .args(std::env::args_os().skip(1))
        .exec()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (postgres: main) S 17 4242 4242 0 -1 4194560 1 0 0 0";

    #[test]
    fn a_server_is_adopted_only_when_it_is_the_childs_postmaster() {
        assert_eq!(adoptable(4242, 17, STAT, "4242\n/var/lib/pg\n"), Ok(()));
        let not_ours = adoptable(4242, 18, STAT, "4242\n").expect_err("not a child");
        assert!(not_ours.contains("not a child"), "{not_ours}");
        let other = adoptable(4242, 17, STAT, "4300\n").expect_err("another postmaster");
        assert!(other.contains("names Some(4300)"), "{other}");
        assert!(
            adoptable(4242, 17, "", "4242\n").is_err(),
            "a process that is gone"
        );
        assert!(adoptable(4242, 17, STAT, "").is_err(), "a stopped server");
    }

    #[test]
    fn a_record_is_taken_once_and_only_for_a_living_child() {
        let run_dir = std::env::temp_dir().join(format!("pgkube-handover-{}", std::process::id()));
        std::fs::create_dir_all(&run_dir).expect("run dir");
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        std::fs::write(run_dir.join("postmaster.pid"), format!("{}\n", child.id()))
            .expect("pid file");
        let handover = Handover {
            postmaster_pid: child.id(),
            primary: false,
            upstream: Some(("db-0".to_owned(), "db-0.db".to_owned())),
            term: 7,
            initialized_by: None,
            changed_since_start: false,
            status: InstanceStatus::starting("db-1"),
        };
        write(&run_dir, &handover).expect("write");
        assert_eq!(peek(&run_dir), Some(handover.clone()));
        assert_eq!(take(&run_dir, &run_dir), Some(handover.clone()));
        assert_eq!(take(&run_dir, &run_dir), None, "taken once");
        // A record naming a process that is not this one's child is dropped.
        write(
            &run_dir,
            &Handover {
                postmaster_pid: 1,
                ..handover
            },
        )
        .expect("write");
        assert_eq!(take(&run_dir, &run_dir), None);
        assert_eq!(peek(&run_dir), None);
        child.kill().expect("kill");
        child.wait().expect("wait");
        std::fs::remove_dir_all(&run_dir).expect("clean up");
    }

    #[test]
    fn a_digest_is_the_files_sha256() {
        let path = std::env::temp_dir().join(format!("pgkube-digest-{}", std::process::id()));
        std::fs::write(&path, b"abc").expect("file");
        assert_eq!(
            digest_of(&path).expect("digest"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        std::fs::remove_file(&path).expect("clean up");
    }
}
