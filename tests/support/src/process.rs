//! This machine's processes, found through `/proc`: the test bed's real node runs pods as local
//! processes, so a test can check that a stopped instance left none behind; benches read a
//! process's CPU time and peak memory, and install the Debian packages of the peers they
//! compare with.

use std::time::Duration;

use anyhow::Context as _;

/// `USER_HZ`: the unit of the CPU times in /proc, 100 on every Linux architecture we run on.
const CLOCK_TICKS_PER_SECOND: u64 = 100;

/// CPU time a process has used so far, user + system (fields 14 and 15 of `/proc/<pid>/stat`,
/// in 10 ms ticks); zero when the process is gone.
pub fn cpu_time(pid: u32) -> Duration {
    let fields = stat_fields(pid).unwrap_or_default();
    // fields[0] is field 3 (state), so field N is fields[N - 3].
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&index| fields.get(index)?.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 1000 / CLOCK_TICKS_PER_SECOND)
}

/// The fields of `/proc/<pid>/stat` after the command name (field 2, which may hold spaces):
/// `[0]` is field 3 (state), so field N is `[N - 3]`. `None` when the process is gone.
pub fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// The live children of process `parent` (field 4 of their `/proc/<pid>/stat`).
pub fn children_of(parent: u32) -> Vec<u32> {
    processes_where("stat", |stat| {
        let stat = String::from_utf8_lossy(stat);
        let parent_field = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1));
        parent_field.and_then(|field| field.parse::<u32>().ok()) == Some(parent)
    })
}

/// The most resident memory a process has had, in bytes (`VmHWM` of `/proc/<pid>/status`);
/// `None` when the process is gone.
pub fn peak_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib * 1024)
}

/// The processes that have `variable` (`NAME=value`) in their environment (a pod's processes
/// inherit `POD_NAME=<pod>` from their container).
pub fn processes_with_env(variable: &str) -> Vec<u32> {
    processes_where("environ", |environ| {
        environ
            .split(|byte| *byte == 0)
            .any(|entry| entry == variable.as_bytes())
    })
}

/// The processes whose command line has every one of `words` among its arguments' text.
pub fn processes_with_args(words: &[&str]) -> Vec<u32> {
    processes_where("cmdline", |cmdline| {
        let text = String::from_utf8_lossy(cmdline).replace('\0', " ");
        words.iter().all(|word| text.contains(word))
    })
}

/// The processes of pod `pod` in `namespace` on the real node, with their arguments: those
/// whose environment has `POD_NAME=<pod>` and `POD_NAMESPACE=<namespace>`, as a pgkube
/// instance container's do (and every process it starts, which inherits them).
pub fn pod_processes(namespace: &str, pod: &str) -> Vec<(u32, Vec<String>)> {
    let name = format!("POD_NAME={pod}");
    let in_namespace = format!("POD_NAMESPACE={namespace}");
    processes_where("environ", |environ| {
        let has = |wanted: &str| {
            environ
                .split(|byte| *byte == 0)
                .any(|entry| entry == wanted.as_bytes())
        };
        has(&name) && has(&in_namespace)
    })
    .into_iter()
    .filter_map(|pid| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args = cmdline
            .split(|byte| *byte == 0)
            .filter(|arg| !arg.is_empty())
            .map(|arg| String::from_utf8_lossy(arg).into_owned())
            .collect();
        Some((pid, args))
    })
    .collect()
}

/// The postmaster of pod `pod` in `namespace` (`postgres -D <data>`, as the instance manager
/// starts it; its children rewrite their command lines to `postgres: ...`), if it runs.
pub fn postmaster_of(namespace: &str, pod: &str) -> Option<u32> {
    pod_processes(namespace, pod)
        .into_iter()
        .find(|(_, args)| {
            args.first()
                .is_some_and(|program| program.rsplit('/').next() == Some("postgres"))
                && args.get(1).map(String::as_str) == Some("-D")
        })
        .map(|(pid, _)| pid)
}

/// The instance manager of pod `pod` in `namespace` (`pgkube instance run`, PID 1 of its
/// container), if it runs.
pub fn instance_manager_of(namespace: &str, pod: &str) -> Option<u32> {
    pod_processes(namespace, pod)
        .into_iter()
        .find(|(_, args)| args.get(1..3) == Some(&["instance".to_owned(), "run".to_owned()][..]))
        .map(|(pid, _)| pid)
}

/// The options of the mount at `mount_point` as process `pid` sees it (the topmost one, from
/// `/proc/<pid>/mountinfo`): `ro` or `rw` first; `None` if nothing is mounted there.
pub fn mount_options(pid: u32, mount_point: &str) -> Option<Vec<String>> {
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).ok()?;
    // Fields: id, parent, major:minor, root, mount point, options, ...
    mountinfo
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            (fields.get(4) == Some(&mount_point)).then(|| fields.get(5).copied())?
        })
        .next_back()
        .map(|options| options.split(',').map(str::to_owned).collect())
}

/// Sends `signal` (`KILL`, `STOP`, `CONT`, ...) to process `pid`, with `kill -s`.
pub fn send_signal(pid: u32, signal: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .status()
        .with_context(|| format!("running kill -s {signal} {pid}"))?;
    anyhow::ensure!(status.success(), "kill -s {signal} {pid}: {status}");
    Ok(())
}

/// Installs Debian package `package` with `apt-get` unless `program` is already on the PATH
/// (benches install the peers they compare with this way).
pub fn install_package(program: &str, package: &str) -> Result<(), String> {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .map(|output| output.status.success())
        .unwrap_or(false);
    if found {
        return Ok(());
    }
    let status = std::process::Command::new("apt-get")
        .args(["install", "-y", "-q", package])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .map_err(|e| format!("apt-get: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("apt-get install {package}: {status}"))
    }
}

/// A process stopped with `SIGSTOP`, sent `SIGCONT` when this is dropped: a failing test must
/// not leave behind a stopped process (one that ignores its pod's SIGTERM, say).
#[derive(Debug)]
pub struct Frozen(u32);

impl Frozen {
    /// Sends `SIGSTOP` to `pid`.
    pub fn stop(pid: u32) -> anyhow::Result<Frozen> {
        send_signal(pid, "STOP")?;
        Ok(Frozen(pid))
    }

    pub fn pid(&self) -> u32 {
        self.0
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = send_signal(self.0, "CONT");
    }
}

/// The processes whose `/proc/<pid>/<file>` satisfies `matches`. Processes that end while
/// being read, or that this user may not read, are left out.
fn processes_where(file: &str, matches: impl Fn(&[u8]) -> bool) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/{file}")).is_ok_and(|content| matches(&content))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_found_under_its_parent_with_its_stat_fields() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep starts");
        let children = children_of(std::process::id());
        let fields = stat_fields(child.id()).expect("its stat");
        let _ = child.kill();
        let _ = child.wait();
        assert!(children.contains(&child.id()), "{children:?}");
        assert_eq!(
            fields[1],
            std::process::id().to_string(),
            "field 4, the parent"
        );
        assert!(!children_of(child.id()).contains(&std::process::id()));
    }

    #[test]
    fn this_test_process_is_found_by_its_environment_and_arguments() {
        let me = std::process::id();
        let path = std::env::var("PATH").expect("PATH is set");
        assert!(processes_with_env(&format!("PATH={path}")).contains(&me));
        let program = std::env::args().next().expect("argv[0]");
        assert!(processes_with_args(&[&program]).contains(&me));
        assert!(!processes_with_env("PGKUBE_NO_SUCH_VARIABLE=1").contains(&me));
    }

    #[test]
    fn a_signal_reaches_the_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        send_signal(child.id(), "KILL").expect("kill");
        let status = child.wait().expect("wait");
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(9));
        assert!(
            send_signal(u32::MAX / 2, "CONT").is_err(),
            "no such process"
        );
    }

    #[test]
    fn this_process_has_used_cpu_and_memory() {
        let me = std::process::id();
        let spin = std::time::Instant::now();
        while cpu_time(me).is_zero() && spin.elapsed() < Duration::from_secs(5) {}
        assert!(!cpu_time(me).is_zero());
        assert!(peak_rss_bytes(me).is_some_and(|bytes| bytes > 0));
        assert_eq!(peak_rss_bytes(u32::MAX), None);
    }
}
