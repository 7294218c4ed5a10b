//! What the archiver did, as `/status` shows it to the operator (`walArchive`) and `/metrics`
//! to Prometheus.

use std::time::SystemTime;

use pgkube_controllers::cluster::status::archiving::WalArchiveReport;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::upload::WalUsage;

/// Counts and the last outcomes since the manager started.
#[derive(Clone, Debug, Default)]
pub struct State {
    archived: u64,
    failed: u64,
    conflicts: u64,
    /// The last request failed.
    failing: bool,
    last_archived: Option<(String, SystemTime)>,
    last_failed: Option<(String, SystemTime, String)>,
}

impl State {
    pub fn record(&mut self, name: &str, result: &Result<(), String>) {
        let now = SystemTime::now();
        self.failing = result.is_err();
        match result {
            Ok(()) => {
                self.archived += 1;
                self.last_archived = Some((name.to_owned(), now));
            }
            Err(error) => {
                self.failed += 1;
                self.last_failed = Some((name.to_owned(), now, error.clone()));
            }
        }
    }

    pub fn conflict(&mut self) {
        self.conflicts += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.archived == 0 && self.failed == 0
    }

    pub fn report(&self, usage: &WalUsage, enabled: bool) -> WalArchiveReport {
        let time = |at: &SystemTime| humantime::format_rfc3339_seconds(*at).to_string();
        WalArchiveReport {
            enabled,
            last_archived: self.last_archived.as_ref().map(|(name, _)| name.clone()),
            last_archived_at: self.last_archived.as_ref().map(|(_, at)| time(at)),
            last_failed: self.last_failed.as_ref().map(|(name, _, _)| name.clone()),
            last_failed_at: self.last_failed.as_ref().map(|(_, at, _)| time(at)),
            last_error: self.last_failed.as_ref().map(|(_, _, error)| error.clone()),
            failing: self.failing,
            archived: self.archived,
            failed: self.failed,
            conflicts: self.conflicts,
            waiting: usage.waiting,
            wal_bytes: usage.wal_bytes,
            volume_bytes: usage.volume_bytes,
            available_bytes: usage.available_bytes,
        }
    }

    /// When the last file was archived, in Unix seconds.
    fn last_archived_unix(&self) -> Option<u64> {
        let (_, at) = self.last_archived.as_ref()?;
        at.duration_since(SystemTime::UNIX_EPOCH)
            .ok()
            .map(|since| since.as_secs())
    }
}

/// The archiver's metrics in Prometheus' text format; without `state` (an instance that does
/// not archive and never did) only `pg_wal`'s size and its volume's.
pub fn render_metrics(state: Option<&State>, usage: &WalUsage) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::with_prefix("pgkube_wal");
    if let Some(state) = state {
        register_archiving(&mut registry, state, usage);
    }
    register_usage(&mut registry, usage);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text)
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: Option<u64>) {
    if let Some(value) = value {
        let gauge = Gauge::<i64>::default();
        gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
        registry.register(name, help, gauge);
    }
}

/// What the archiver did, and the files waiting for it.
fn register_archiving(registry: &mut Registry, state: &State, usage: &WalUsage) {
    let counter = |registry: &mut Registry, name: &str, help: &str, value: u64| {
        let counter = Counter::<u64>::default();
        counter.inc_by(value);
        registry.register(name, help, counter);
    };
    counter(
        registry,
        "archived_files",
        "WAL files archived",
        state.archived,
    );
    counter(
        registry,
        "archive_failures",
        "archive requests that failed",
        state.failed,
    );
    counter(
        registry,
        "archive_conflicts",
        "WAL files found in the archive with other content",
        state.conflicts,
    );
    gauge(
        registry,
        "last_archived_timestamp_seconds",
        "when the last WAL file was archived (Unix time)",
        state.last_archived_unix(),
    );
    gauge(
        registry,
        "waiting_files",
        "WAL files ready and not archived",
        usage.waiting,
    );
}

/// `pg_wal` and the volume that holds it: what fills up when WAL is kept (archiving failing,
/// a replication slot behind), archiving or not.
fn register_usage(registry: &mut Registry, usage: &WalUsage) {
    gauge(
        registry,
        "bytes",
        "bytes of the files in pg_wal",
        usage.wal_bytes,
    );
    gauge(
        registry,
        "volume_size_bytes",
        "size of the volume that holds pg_wal",
        usage.volume_bytes,
    );
    gauge(
        registry,
        "volume_available_bytes",
        "bytes left for PostgreSQL on the volume that holds pg_wal",
        usage.available_bytes,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_after_a_success_is_failing_until_the_next_success() {
        let mut state = State::default();
        assert!(state.is_empty());
        state.record("000000010000000000000001", &Ok(()));
        assert!(!state.report(&WalUsage::default(), true).failing);
        state.record("000000010000000000000002", &Err("store down".into()));
        let report = state.report(&WalUsage::default(), true);
        assert!(report.failing);
        assert_eq!(report.last_error.as_deref(), Some("store down"));
        assert_eq!(
            report.last_archived.as_deref(),
            Some("000000010000000000000001")
        );
        state.record("000000010000000000000002", &Ok(()));
        let report = state.report(&WalUsage::default(), true);
        assert!(!report.failing);
        assert_eq!((report.archived, report.failed), (2, 1));
    }

    #[test]
    fn the_metrics_name_the_counts_and_the_waiting_files() {
        let mut state = State::default();
        state.record("000000010000000000000001", &Ok(()));
        state.conflict();
        let usage = WalUsage {
            waiting: Some(3),
            wal_bytes: Some(48 << 20),
            volume_bytes: Some(1 << 30),
            available_bytes: Some(900 << 20),
        };
        let text = render_metrics(Some(&state), &usage).expect("encoded");
        for line in [
            "pgkube_wal_archived_files_total 1",
            "pgkube_wal_archive_failures_total 0",
            "pgkube_wal_archive_conflicts_total 1",
            "pgkube_wal_waiting_files 3",
            "pgkube_wal_bytes 50331648",
            "pgkube_wal_volume_size_bytes 1073741824",
            "pgkube_wal_volume_available_bytes 943718400",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
        assert!(
            text.contains("pgkube_wal_last_archived_timestamp_seconds "),
            "{text}"
        );
    }

    #[test]
    fn without_archiving_only_the_usage_of_pg_wal_and_its_volume_is_shown() {
        let usage = WalUsage {
            waiting: Some(0),
            wal_bytes: Some(32 << 20),
            volume_bytes: Some(1 << 30),
            available_bytes: Some(100 << 20),
        };
        let text = render_metrics(None, &usage).expect("encoded");
        for line in [
            "pgkube_wal_bytes 33554432",
            "pgkube_wal_volume_size_bytes 1073741824",
            "pgkube_wal_volume_available_bytes 104857600",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
        for absent in ["archived_files", "archive_failures", "waiting_files"] {
            assert!(!text.contains(absent), "{absent} in:\n{text}");
        }
    }
}
