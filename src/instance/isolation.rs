//! An isolated primary fences itself (issue 41).
//!
//! The operator fails over when it cannot reach the primary's instance manager for the failover
//! delay. If that primary is alive behind a partition, its clients would keep committing on
//! their open connections, writes that the promotion of another instance discards. So the
//! primary of a cluster of several instances watches its own contacts:
//!
//! - **the API server**: any HTTP answer to `GET /version` (once a second, one second to answer)
//!   shows that the pod's network reaches the control plane;
//! - **its replicas**: a standby answers its walsender at least every second
//!   (`wal_receiver_status_interval`); a `reply_time` in `pg_stat_replication` that moved since
//!   the last look (four times a second) is a replica heard from.
//!
//! When neither was heard from for the isolation timeout (`isolationTimeoutSeconds` in
//! `instance.json`), the guard writes a fence marker into the manager's run directory and stops
//! the server at once (SIGQUIT to the postmaster: an immediate shutdown, every backend and
//! every client connection ends). The supervisor then does not start the server again until
//! another instance answers ([`super::roles`]): then it starts as the primary only if no other
//! instance is one, else it rejoins the new primary. The marker outlives a restart of the
//! container, so that a manager started again behind the same partition does not take writes.
//!
//! The decision is pure ([`is_isolated`]); the probes and the guard are tasks of their own, so
//! that a supervisor busy with a long step never delays a fence.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use super::desired::Desired;
use super::endpoint::InstanceStatus;
use super::{Instance, sql};

/// How often the guard compares the last contact with the isolation timeout.
const GUARD_PERIOD: Duration = Duration::from_millis(250);
/// How often the replicas' answers are looked at (on the primary only).
const REPLICA_PERIOD: Duration = Duration::from_millis(250);
/// How often, and how long at most, the API server is asked.
const API_PERIOD: Duration = Duration::from_secs(1);
const API_TIMEOUT: Duration = Duration::from_secs(1);
/// The marker a fence leaves in the run directory.
const MARKER: &str = "pgkube-fenced.json";
/// The service account's CA: the API server's certificate is checked against it when mounted.
const SERVICE_ACCOUNT_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// What the supervisor says about the running server: watched only while it runs as the
/// primary of a cluster of several instances.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Watch {
    since: Instant,
    timeout: Duration,
}

#[derive(Debug, Default)]
struct State {
    watch: Option<Watch>,
    api: Option<Instant>,
    replicas: Option<Instant>,
    /// The replicas' `pid@reply_time` at the last look.
    replica_marks: String,
    fenced: bool,
}

/// Whether a primary watched since `since` has been cut off for `timeout`: the last contact
/// (or the start of the watch, if later) is that long ago.
pub fn is_isolated(
    now: Instant,
    since: Instant,
    timeout: Duration,
    contacts: [Option<Instant>; 2],
) -> bool {
    let last = contacts.into_iter().flatten().fold(since, Instant::max);
    now.saturating_duration_since(last) >= timeout
}

/// Why the primary fenced itself, as the marker records it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FenceMarker {
    pub reason: String,
    pub fenced_at: String,
}

/// The shared state of the probes, the guard and the supervisor.
pub struct Isolation {
    state: Mutex<State>,
    run_dir: PathBuf,
    pgdata: PathBuf,
}

impl Isolation {
    pub fn new(run_dir: &Path, pgdata: &Path) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::default()),
            run_dir: run_dir.to_owned(),
            pgdata: pgdata.to_owned(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held leaves plain values behind: still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Watches the running primary with `timeout`, or nothing (`None`: a replica, a server
    /// that is not running, a single instance). The watch starts counting when it begins.
    pub fn watch_primary(&self, timeout: Option<Duration>) {
        let mut state = self.state();
        state.watch = match (state.watch, timeout) {
            (_, None) => None,
            (Some(watch), Some(timeout)) => Some(Watch { timeout, ..watch }),
            (None, Some(timeout)) => Some(Watch {
                since: Instant::now(),
                timeout,
            }),
        };
    }

    /// Whether the guard stopped the server since the supervisor last cleared the fence.
    pub fn fenced(&self) -> bool {
        self.state().fenced
    }

    /// The marker of a fence not lifted yet (it outlives a restart of the container).
    pub fn marker(&self) -> Option<FenceMarker> {
        let text = std::fs::read_to_string(self.run_dir.join(MARKER)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Lifts the fence: another instance answered, so the usual start decides the role.
    pub fn lift(&self) -> std::io::Result<()> {
        self.state().fenced = false;
        match std::fs::remove_file(self.run_dir.join(MARKER)) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }

    fn note_api_contact(&self) {
        self.state().api = Some(Instant::now());
    }

    /// Records the replicas' marks; a change (and some replica) is contact.
    fn note_replica_marks(&self, marks: String) {
        let mut state = self.state();
        if !marks.is_empty() && marks != state.replica_marks {
            state.replicas = Some(Instant::now());
        }
        state.replica_marks = marks;
    }

    fn watching(&self) -> bool {
        self.state().watch.is_some()
    }

    /// Fences when the watched primary is isolated: marker first, then the stop.
    fn check(&self) {
        let reason = {
            let mut state = self.state();
            let Some(watch) = state.watch else { return };
            let contacts = [state.api, state.replicas];
            if state.fenced || !is_isolated(Instant::now(), watch.since, watch.timeout, contacts) {
                return;
            }
            state.fenced = true;
            format!(
                "the primary reached neither the API server nor any replica for {}s: it stopped its server so that no client writes to it while another instance may be promoted",
                watch.timeout.as_secs()
            )
        };
        tracing::error!("{reason}");
        self.fence(reason);
    }

    fn fence(&self, reason: String) {
        let marker = FenceMarker {
            reason,
            fenced_at: k8s_openapi::jiff::Timestamp::now().to_string(),
        };
        let text = serde_json::to_string(&marker).unwrap_or_default();
        if let Err(error) = std::fs::write(self.run_dir.join(MARKER), text) {
            tracing::error!(%error, "cannot write the fence marker; stopping the server anyway");
        }
        match postmaster_pid(&self.pgdata) {
            Some(pid) => {
                if let Err(error) = kill(pid, Signal::SIGQUIT) {
                    tracing::error!(%error, %pid, "cannot stop the postmaster");
                }
            }
            None => tracing::warn!("no postmaster.pid: the server is not running"),
        }
    }
}

/// The postmaster's pid: the first line of `postmaster.pid`, if that process runs in `pgdata`
/// (a file left by a crash may name a pid that another process has since).
fn postmaster_pid(pgdata: &Path) -> Option<Pid> {
    let text = std::fs::read_to_string(pgdata.join("postmaster.pid")).ok()?;
    let pid: i32 = text.lines().next()?.trim().parse().ok()?;
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
    (pid > 1 && cwd == pgdata.canonicalize().ok()?).then(|| Pid::from_raw(pid))
}

/// Where the local server is, for the replica probe.
pub struct LocalServer {
    pub socket_dir: PathBuf,
    pub port: u16,
    pub superuser: String,
}

/// Starts the probes and the guard; they run as long as the manager.
pub fn spawn(isolation: &Arc<Isolation>, server: LocalServer) {
    tokio::spawn(probe_api(isolation.clone()));
    tokio::spawn(probe_replicas(isolation.clone(), server));
    tokio::spawn(guard(isolation.clone()));
}

async fn guard(isolation: Arc<Isolation>) {
    let mut ticker = tokio::time::interval(GUARD_PERIOD);
    loop {
        ticker.tick().await;
        isolation.check();
    }
}

/// Asks the API server once a second; any HTTP answer is contact.
async fn probe_api(isolation: Arc<Isolation>) {
    let Some((client, url)) = api_client() else {
        tracing::warn!(
            "not in a pod (KUBERNETES_SERVICE_HOST unset): the API server is never counted as reached"
        );
        return;
    };
    let mut ticker = tokio::time::interval(API_PERIOD);
    loop {
        ticker.tick().await;
        match client.get(&url).send().await {
            Ok(_) => isolation.note_api_contact(),
            Err(error) => tracing::debug!(%error, "the API server does not answer"),
        }
    }
}

/// A client for the API server named by the pod's environment, trusting the service account's
/// CA when it is mounted. Without it only reachability is shown, which is all that counts.
fn api_client() -> Option<(reqwest::Client, String)> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".to_owned());
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let builder = reqwest::Client::builder().timeout(API_TIMEOUT);
    let builder = match std::fs::read(SERVICE_ACCOUNT_CA)
        .ok()
        .and_then(|pem| reqwest::Certificate::from_pem(&pem).ok())
    {
        Some(ca) => builder.tls_certs_merge([ca]),
        None => builder.tls_danger_accept_invalid_certs(true),
    };
    let client = builder
        .build()
        .inspect_err(|error| tracing::error!(%error, "cannot make the API server client"))
        .ok()?;
    Some((client, format!("https://{host}:{port}/version")))
}

/// Looks at the replicas' answers while the primary is watched, on a connection of its own.
async fn probe_replicas(isolation: Arc<Isolation>, server: LocalServer) {
    let mut ticker = tokio::time::interval(REPLICA_PERIOD);
    let mut client = None;
    loop {
        ticker.tick().await;
        if !isolation.watching() {
            client = None;
            continue;
        }
        if client.is_none() {
            client = sql::connect_local(&server.socket_dir, server.port, &server.superuser)
                .await
                .ok();
        }
        let Some(connected) = &client else { continue };
        match sql::replica_marks(connected).await {
            Ok(marks) => isolation.note_replica_marks(marks),
            Err(error) => {
                tracing::debug!(%error, "cannot look at the replicas");
                client = None;
            }
        }
    }
}

/// How often a fenced instance asks the others whether they answer.
const FENCE_RETRY: Duration = Duration::from_secs(1);

impl Instance {
    /// After a fence (this run's, or one the marker shows from before a restart of the
    /// container), the server stays stopped until another instance answers: then the usual
    /// start decides, from `instance.json` read again and the others' answers, whether this one
    /// is still the primary or rejoins the new one.
    pub(super) async fn wait_out_fence(&mut self) {
        let Some(marker) = self.isolation.marker() else {
            return;
        };
        let why = format!(
            "fenced at {}: {}; waiting for another instance to answer",
            marker.fenced_at, marker.reason
        );
        tracing::warn!("{why}");
        self.set_status(InstanceStatus::waiting(&self.args.pod_name, &why));
        let _busy = self.board.busy("fenced");
        loop {
            self.read_files_again();
            // Scaled down to one instance since: no other could be promoted, none answers.
            if self.applied.topology.isolation_timeout_seconds.is_none() {
                tracing::info!("a single instance now: the fence is lifted");
                break;
            }
            if !self.peer_statuses().await.is_empty() {
                tracing::info!("another instance answers: the fence is lifted");
                break;
            }
            tokio::time::sleep(FENCE_RETRY).await;
        }
        if let Err(error) = self.isolation.lift() {
            tracing::error!(%error, "cannot remove the fence marker");
        }
    }

    /// `instance.json` and the rest, read again: the start that follows decides from them.
    fn read_files_again(&mut self) {
        match Desired::load(&self.sources) {
            Ok(desired) => self.applied = desired,
            Err(error) => tracing::warn!(%error, "keeping the settings last read"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(3);

    #[test]
    fn a_primary_heard_from_recently_is_not_isolated() {
        let start = Instant::now();
        let now = start + Duration::from_secs(10);
        let recent = Some(now - Duration::from_secs(1));
        assert!(!is_isolated(now, start, TIMEOUT, [recent, None]));
        assert!(!is_isolated(now, start, TIMEOUT, [None, recent]));
    }

    #[test]
    fn a_primary_heard_from_by_no_one_for_the_timeout_is_isolated() {
        let start = Instant::now();
        let now = start + Duration::from_secs(10);
        let old = Some(now - TIMEOUT);
        assert!(is_isolated(now, start, TIMEOUT, [old, None]));
        assert!(is_isolated(now, start, TIMEOUT, [old, old]));
        assert!(is_isolated(now, start, TIMEOUT, [None, None]));
    }

    #[test]
    fn the_watch_starts_the_clock() {
        let start = Instant::now();
        let long_ago = Some(start);
        let since = start + Duration::from_secs(60);
        let now = since + Duration::from_secs(2);
        assert!(!is_isolated(now, since, TIMEOUT, [long_ago, long_ago]));
        assert!(is_isolated(now + TIMEOUT, since, TIMEOUT, [long_ago, None]));
    }

    #[test]
    fn a_replica_counts_only_when_its_answer_moved() {
        let dir = std::env::temp_dir();
        let isolation = Isolation::new(&dir, &dir);
        isolation.note_replica_marks(String::new());
        assert!(isolation.state().replicas.is_none(), "no replica");
        isolation.note_replica_marks("17@t1".to_owned());
        let first = isolation.state().replicas.expect("a replica answered");
        isolation.note_replica_marks("17@t1".to_owned());
        assert_eq!(isolation.state().replicas, Some(first), "the same answer");
        std::thread::sleep(Duration::from_millis(2));
        isolation.note_replica_marks("17@t2".to_owned());
        assert!(isolation.state().replicas > Some(first), "a new answer");
    }

    #[test]
    fn the_watch_follows_the_supervisor() {
        let dir = std::env::temp_dir();
        let isolation = Isolation::new(&dir, &dir);
        isolation.watch_primary(Some(TIMEOUT));
        let since = isolation.state().watch.expect("watched").since;
        isolation.watch_primary(Some(Duration::from_secs(5)));
        let watch = isolation.state().watch.expect("still watched");
        assert_eq!(
            (watch.since, watch.timeout),
            (since, Duration::from_secs(5))
        );
        isolation.watch_primary(None);
        assert!(isolation.state().watch.is_none());
    }

    #[test]
    fn only_a_process_running_in_the_data_directory_is_the_postmaster() {
        let dir = std::env::temp_dir().join(format!("pgkube-pid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .current_dir(&dir)
            .spawn()
            .expect("sleep");
        let pid = i32::try_from(child.id()).expect("pid");
        std::fs::write(
            dir.join("postmaster.pid"),
            format!("{pid}\n{}\n", dir.display()),
        )
        .expect("pid file");
        assert_eq!(postmaster_pid(&dir), Some(Pid::from_raw(pid)));
        // This test's own process runs elsewhere: a stale file naming it is ignored.
        std::fs::write(
            dir.join("postmaster.pid"),
            format!("{}\n", std::process::id()),
        )
        .expect("pid file");
        assert_eq!(postmaster_pid(&dir), None);
        child.kill().expect("kill");
        child.wait().expect("wait");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_fence_leaves_a_marker_until_lifted() {
        let dir = std::env::temp_dir().join(format!("pgkube-fence-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let isolation = Isolation::new(&dir, &dir);
        isolation.state().watch = Some(Watch {
            since: Instant::now() - TIMEOUT,
            timeout: TIMEOUT,
        });
        isolation.check();
        assert!(isolation.fenced());
        let marker = isolation.marker().expect("a marker");
        assert!(marker.reason.contains("3s"), "{marker:?}");
        isolation.lift().expect("lifted");
        assert!(!isolation.fenced());
        assert_eq!(isolation.marker(), None);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
