//! The test bed's second real node, `testbed-local-b`: pods that tolerate its taint land on
//! it as well as on `testbed-local` ([`second_node_toleration`]), and a test can lose it
//! ([`LostNode`]).
//!
//! A test can also freeze it ([`FrozenNode`]): every process of the node stopped, none gone.
//!
//! Losing the node kills its agent (`tests/testbed/up` started it as the component `node-b`).
//! The agent's container processes die with it (they get SIGKILL when their parent dies), so
//! the node's pods stop at once, as when a machine goes down; their objects stay in the API
//! server, bound to a node that no longer reports. [`LostNode::restore`] starts the agent again
//! with the same command line, as a machine that comes back.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Toleration;

use crate::env::TestEnv;

/// The test bed's second real node.
pub const SECOND_NODE: &str = "testbed-local-b";
/// The taint that keeps pods off [`SECOND_NODE`] unless they tolerate it.
pub const SECOND_NODE_TAINT: &str = "pgkube.io/testbed-node-b";
/// How long the agent's processes may take to die.
const DEATH_TIMEOUT: Duration = Duration::from_secs(10);

/// The toleration that lets a pod land on [`SECOND_NODE`] too (the test bed's clusters already
/// select and tolerate both real nodes' common label and taint).
pub fn second_node_toleration() -> Toleration {
    Toleration {
        key: Some(SECOND_NODE_TAINT.to_owned()),
        operator: Some("Equal".to_owned()),
        value: Some("true".to_owned()),
        effect: Some("NoSchedule".to_owned()),
        ..Toleration::default()
    }
}

/// The second node, lost until [`LostNode::restore`].
#[derive(Debug)]
pub struct LostNode {
    command: Vec<String>,
    pid_file: PathBuf,
    log_file: PathBuf,
    /// When its agent was killed.
    pub lost_at: Instant,
    restored: bool,
}

impl LostNode {
    /// Kills the second node's agent, and with it its pods' processes. Returns once all of
    /// them are gone.
    pub fn lose(env: &TestEnv) -> anyhow::Result<LostNode> {
        let state = env
            .bin_dir
            .parent()
            .context("the test bed's state directory")?;
        let pid_file = state.join("pids/node-b.pid");
        let pid = agent_pid(&pid_file)?;
        let command = command_line(pid)?;
        let processes = descendants(pid);
        crate::send_signal(pid, "KILL")?;
        let lost_at = Instant::now();
        for process in std::iter::once(pid).chain(processes) {
            wait_gone(process)?;
        }
        Ok(LostNode {
            command,
            pid_file,
            log_file: state.join("logs/node-b.log"),
            lost_at,
            restored: false,
        })
    }

    /// Starts the agent again, as `tests/testbed/up` did (its log continues).
    pub fn restore(mut self) -> anyhow::Result<()> {
        self.restart()
    }

    fn restart(&mut self) -> anyhow::Result<()> {
        use std::os::unix::process::CommandExt as _;
        self.restored = true;
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&self.log_file)
            .with_context(|| format!("opening {}", self.log_file.display()))?;
        let (program, arguments) = self
            .command
            .split_first()
            .context("the agent's command line is empty")?;
        let child = std::process::Command::new(program)
            .args(arguments)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {program}"))?;
        std::fs::write(&self.pid_file, format!("{}\n", child.id()))
            .with_context(|| format!("writing {}", self.pid_file.display()))?;
        Ok(())
    }
}

impl Drop for LostNode {
    /// A test that failed still gives the node back to the others.
    fn drop(&mut self) {
        if !self.restored
            && let Err(error) = self.restart()
        {
            eprintln!("the second node could not be started again: {error:#}");
        }
    }
}

/// The second node cut off while its pods keep running: its agent and every process it
/// started are stopped (`SIGSTOP`), so that none answers, as behind a network partition or on
/// a machine that hangs. They go on (`SIGCONT`) when this is dropped, or at [`FrozenNode::thaw`].
#[derive(Debug)]
pub struct FrozenNode {
    /// The agent first: it starts nothing new meanwhile.
    frozen: Vec<crate::Frozen>,
    /// When the agent was stopped.
    pub frozen_at: Instant,
}

impl FrozenNode {
    pub fn freeze(env: &TestEnv) -> anyhow::Result<FrozenNode> {
        let state = env
            .bin_dir
            .parent()
            .context("the test bed's state directory")?;
        let pid = agent_pid(&state.join("pids/node-b.pid"))?;
        let mut frozen = vec![crate::Frozen::stop(pid)?];
        let frozen_at = Instant::now();
        // Until no process is left running: a postmaster may have started a backend while
        // its siblings were being stopped.
        loop {
            let running: Vec<u32> = descendants(pid)
                .into_iter()
                .filter(|process| !frozen.iter().any(|f| f.pid() == *process))
                .collect();
            if running.is_empty() {
                break;
            }
            // A process that ended meanwhile is not there to stop.
            frozen.extend(
                running
                    .into_iter()
                    .filter_map(|p| crate::Frozen::stop(p).ok()),
            );
        }
        Ok(FrozenNode { frozen, frozen_at })
    }

    /// Lets the node's processes go on.
    pub fn thaw(self) {
        drop(self.frozen);
    }
}

/// The agent's pid, from the file `tests/testbed/up` wrote.
fn agent_pid(pid_file: &Path) -> anyhow::Result<u32> {
    std::fs::read_to_string(pid_file)
        .with_context(|| format!("reading {}", pid_file.display()))?
        .trim()
        .parse()
        .context("the second node's pid")
}

/// The processes started by `pid`, and by them, and so on.
fn descendants(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
                .filter_map(|child| Some((child, parent_of(child)?)))
                .collect()
        })
        .unwrap_or_default();
    let mut found = vec![pid];
    let mut next = 0;
    while let Some(&parent) = found.get(next) {
        found.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(child, _)| *child),
        );
        next += 1;
    }
    found.split_off(1)
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The command line of process `pid`.
fn command_line(pid: u32) -> anyhow::Result<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline"))
        .with_context(|| format!("the command line of process {pid}"))?;
    Ok(raw
        .split(|&byte| byte == 0)
        .filter(|part| !part.is_empty())
        .map(|part| String::from_utf8_lossy(part).into_owned())
        .collect())
}

fn wait_gone(pid: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + DEATH_TIMEOUT;
    let proc = PathBuf::from(format!("/proc/{pid}"));
    while is_running(&proc) {
        anyhow::ensure!(
            Instant::now() < deadline,
            "process {pid} still runs after SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Whether the process exists and is not a zombie waiting for its parent.
fn is_running(proc: &Path) -> bool {
    std::fs::read_to_string(proc.join("stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z")
    })
}
