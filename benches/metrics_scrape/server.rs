//! What the bench reads from the primary beside the scrapes: its log (JSON, one object a line,
//! from the logging collector), the CPU time of all its processes, and its session count.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pgkube_testkit::{children_of, stat_fields};
use serde_json::Value;
use tokio_postgres::Client;

/// The log file, under the data directory.
const LOG_FILE: &str = "log/bench.json";
const LOG_WAIT: Duration = Duration::from_secs(30);
/// `USER_HZ`, the unit of the CPU times in `/proc/<pid>/stat`.
const TICKS_PER_SECOND: u64 = 100;

/// Settings that need a restart: every message goes to [`LOG_FILE`] as JSON.
pub async fn log_as_json(sql: &Client) {
    for (name, value) in [
        ("logging_collector", "on"),
        ("log_destination", "jsonlog"),
        ("log_directory", "log"),
        // The JSON file is named after this one, `.json` for `.log`.
        ("log_filename", "bench.log"),
        ("log_rotation_age", "0"),
        ("log_rotation_size", "0"),
    ] {
        sql.batch_execute(&format!("ALTER SYSTEM SET {name} = '{value}'"))
            .await
            .expect("ALTER SYSTEM");
    }
}

/// The primary: a connection to it, its postmaster and its log.
pub struct Primary {
    pub sql: Client,
    pub postmaster: u32,
    log: PathBuf,
    marks: u32,
}

impl Primary {
    pub fn new(sql: Client, pgdata: &Path) -> Self {
        let pid = std::fs::read_to_string(pgdata.join("postmaster.pid")).expect("postmaster.pid");
        let postmaster = pid
            .lines()
            .next()
            .and_then(|line| line.trim().parse().ok())
            .expect("the postmaster's pid");
        Self {
            sql,
            postmaster,
            log: pgdata.join(LOG_FILE),
            marks: 0,
        }
    }

    /// Logs every statement, connection and (at `debug2`) every Parse message from now on;
    /// returns once a new connection has these settings (the postmaster has then signalled
    /// every backend, which applies them before its next message).
    pub async fn log_statements(&self, on: bool) {
        let settings = [
            ("log_statement", "all"),
            ("log_min_messages", "debug2"),
            ("log_connections", "on"),
        ];
        for (name, value) in settings {
            let command = if on {
                format!("ALTER SYSTEM SET {name} = '{value}'")
            } else {
                format!("ALTER SYSTEM RESET {name}")
            };
            self.sql
                .batch_execute(&command)
                .await
                .expect("ALTER SYSTEM");
        }
        self.sql
            .batch_execute("SELECT pg_reload_conf()")
            .await
            .expect("reload");
        let wanted = if on { "all" } else { "none" };
        let deadline = Instant::now() + LOG_WAIT;
        loop {
            let setting: String = self
                .sql
                .query_one(
                    "SELECT setting FROM pg_settings WHERE name = 'log_statement'",
                    &[],
                )
                .await
                .expect("pg_settings")
                .get(0);
            // A backend applies a reload between its commands: this query's own backend shows
            // it once the postmaster has signalled everyone.
            if setting == wanted {
                return;
            }
            assert!(Instant::now() < deadline, "log_statement stays {setting}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Writes a mark into the log and waits until the collector has written it out: every
    /// message logged before it is then in the file. Returns the mark.
    pub async fn mark(&mut self) -> String {
        self.marks += 1;
        let mark = format!("pgkube-bench-mark-{}-{}-", std::process::id(), self.marks);
        self.sql
            .batch_execute(&format!("SELECT '{mark}'"))
            .await
            .expect("the mark");
        let deadline = Instant::now() + LOG_WAIT;
        while !std::fs::read_to_string(&self.log).is_ok_and(|text| text.contains(&mark)) {
            assert!(Instant::now() < deadline, "{mark} not in {:?}", self.log);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        mark
    }

    /// The log's messages between marks `from` and `to`.
    pub fn messages_between(&self, from: &str, to: &str) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.log).expect("the log");
        text.lines()
            .skip_while(|line| !line.contains(from))
            .skip(1)
            .take_while(|line| !line.contains(to))
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// CPU time of all the server's processes so far: the postmaster, the children it reaped
    /// (backends that ended) and those alive. Read again when a child was reaped while the
    /// live ones were read: it would be counted in neither or in both.
    pub fn cpu(&self) -> Duration {
        loop {
            let (_, reaped_before) = stat_ticks(self.postmaster).unwrap_or_default();
            let children: u64 = children_of(self.postmaster)
                .into_iter()
                .filter_map(|pid| stat_ticks(pid).map(|(own, _)| own))
                .sum();
            let (own, reaped) = stat_ticks(self.postmaster).unwrap_or_default();
            if reaped == reaped_before {
                return Duration::from_millis((own + reaped + children) * 1000 / TICKS_PER_SECOND);
            }
        }
    }

    /// Waits until no backend has `application` for its `application_name`.
    pub async fn wait_no_backends(&self, application: &str) {
        let deadline = Instant::now() + LOG_WAIT;
        loop {
            let left: i64 = self
                .sql
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                    &[&application],
                )
                .await
                .expect("pg_stat_activity")
                .get(0);
            if left == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{left} backends of {application} left"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sessions established to any database since the statistics were reset.
    pub async fn sessions(&self) -> i64 {
        self.sql
            .query_one("SELECT sum(sessions)::bigint FROM pg_stat_database", &[])
            .await
            .expect("pg_stat_database")
            .get(0)
    }

    /// The backends whose `application_name` is `application` that started after `since`
    /// (Unix time, seconds) and have run a query.
    pub async fn backends_since(&self, application: &str, since: f64) -> HashSet<i32> {
        self.sql
            .query(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1 \
                 AND backend_start >= to_timestamp($2) AND query <> ''",
                &[&application, &since],
            )
            .await
            .expect("pg_stat_activity")
            .iter()
            .map(|row| row.get(0))
            .collect()
    }

    /// Whether backend `pid` is still there.
    pub async fn has_backend(&self, pid: i32) -> bool {
        self.sql
            .query_one(
                "SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .expect("pg_stat_activity")
            .get(0)
    }

    /// The server's clock, as Unix time in seconds.
    pub async fn now(&self) -> f64 {
        self.sql
            .query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
            .await
            .expect("the time")
            .get(0)
    }
}

/// A process's own CPU ticks (user + system) and those of its reaped children.
fn stat_ticks(pid: u32) -> Option<(u64, u64)> {
    let fields = stat_fields(pid)?;
    // fields[0] is field 3 of proc(5); utime, stime, cutime, cstime are fields 14 to 17.
    let tick = |field: usize| fields.get(field - 3)?.parse::<u64>().ok();
    Some((tick(14)? + tick(15)?, tick(16)? + tick(17)?))
}
