//! Continuous archiving in the cluster's status (pure): `status.walArchiving` and the
//! `ContinuousArchiving` and `WALDiskPressure` conditions, from what the primary's instance
//! manager reports (`walArchive` in its `/status`).
//!
//! The report counts from the manager's start, so a report that has not seen a file yet keeps
//! what the status said before. When the primary does not answer, the previous state stays:
//! nothing is known to have changed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use pgkube_crds::{
    CONTINUOUS_ARCHIVING, PostgreSQLClusterStatus, WAL_DISK_PRESSURE, WalArchivingStatus,
};
use serde::{Deserialize, Serialize};

use super::{Observation, condition, find};

/// `pg_wal` may take this share of the volume while archiving fails before `WALDiskPressure`
/// is raised: PostgreSQL keeps every file not archived, and a full volume stops the server.
pub const WAL_PRESSURE_PERCENT: u64 = 50;

/// `walArchive` in an instance manager's `/status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WalArchiveReport {
    /// The manager is told to archive (it may report past work after it was told to stop).
    #[serde(default)]
    pub enabled: bool,
    #[serde(default)]
    pub last_archived: Option<String>,
    /// RFC 3339.
    #[serde(default)]
    pub last_archived_at: Option<String>,
    #[serde(default)]
    pub last_failed: Option<String>,
    #[serde(default)]
    pub last_failed_at: Option<String>,
    #[serde(default)]
    pub last_error: Option<String>,
    /// The last request failed: nothing was archived since.
    #[serde(default)]
    pub failing: bool,
    /// Files archived, failed requests and content conflicts since the manager started.
    #[serde(default)]
    pub archived: u64,
    #[serde(default)]
    pub failed: u64,
    #[serde(default)]
    pub conflicts: u64,
    /// Files ready and not archived yet.
    #[serde(default)]
    pub waiting: Option<u64>,
    #[serde(default)]
    pub wal_bytes: Option<u64>,
    #[serde(default)]
    pub volume_bytes: Option<u64>,
    #[serde(default)]
    pub available_bytes: Option<u64>,
}

/// `status.walArchiving` and the archiving conditions; nothing when the primary does not
/// archive.
pub fn archiving(observation: Observation<'_>) -> (Option<WalArchivingStatus>, Vec<Condition>) {
    let previous = observation.previous;
    let primary = find(observation.instances, observation.primary);
    let report = match primary.map(|instance| instance.report.as_ref()) {
        Some(Ok(report)) => report.wal_archive.as_ref(),
        // No answer: what was known stays.
        _ => return kept(previous),
    };
    let Some(report) = report.filter(|report| report.enabled) else {
        return (None, Vec::new());
    };
    let before = previous.and_then(|status| status.wal_archiving.as_ref());
    let status = merged(observation.primary, report, before);
    let generation = observation.generation;
    let archiving = archiving_condition(report, &status, previous, generation);
    let pressure = pressure_condition(report, generation);
    (Some(status), vec![archiving, pressure])
}

fn kept(
    previous: Option<&PostgreSQLClusterStatus>,
) -> (Option<WalArchivingStatus>, Vec<Condition>) {
    let Some(previous) = previous else {
        return (None, Vec::new());
    };
    let conditions = previous
        .conditions
        .iter()
        .filter(|c| c.type_ == CONTINUOUS_ARCHIVING || c.type_ == WAL_DISK_PRESSURE)
        .cloned()
        .collect();
    (previous.wal_archiving.clone(), conditions)
}

/// The report over what the status said: a manager that restarted has not seen the files
/// archived before it.
fn merged(
    primary: &str,
    report: &WalArchiveReport,
    before: Option<&WalArchivingStatus>,
) -> WalArchivingStatus {
    let before = before.cloned().unwrap_or_default();
    let (last_archived, last_archived_time) = match &report.last_archived {
        Some(file) => (Some(file.clone()), time(report.last_archived_at.as_deref())),
        None => (before.last_archived, before.last_archived_time),
    };
    let (last_failed, last_failed_time, last_error) = match &report.last_failed {
        Some(file) => (
            Some(file.clone()),
            time(report.last_failed_at.as_deref()),
            report.last_error.clone(),
        ),
        None => (
            before.last_failed,
            before.last_failed_time,
            before.last_error,
        ),
    };
    WalArchivingStatus {
        instance: Some(primary.to_owned()),
        last_archived,
        last_archived_time,
        last_failed,
        last_failed_time,
        last_error,
        waiting: report.waiting.and_then(|n| i64::try_from(n).ok()),
        wal_bytes: report.wal_bytes.and_then(|n| i64::try_from(n).ok()),
    }
}

fn time(rfc3339: Option<&str>) -> Option<Time> {
    rfc3339?.parse::<Timestamp>().ok().map(Time)
}

fn archiving_condition(
    report: &WalArchiveReport,
    status: &WalArchivingStatus,
    previous: Option<&PostgreSQLClusterStatus>,
    generation: Option<i64>,
) -> Condition {
    if report.failing {
        let error = report.last_error.clone().unwrap_or_default();
        let file = report.last_failed.clone().unwrap_or_default();
        return condition(
            CONTINUOUS_ARCHIVING,
            "False",
            failure_reason(&error),
            format!("{file} was not archived: {error}"),
            generation,
        );
    }
    if report.last_archived.is_none()
        && let Some(before) = find_condition(previous, CONTINUOUS_ARCHIVING)
    {
        return before;
    }
    match (&status.last_archived, &report.last_archived_at) {
        (Some(file), at) => condition(
            CONTINUOUS_ARCHIVING,
            "True",
            "Archiving",
            match at {
                Some(at) => format!("{file} archived at {at}"),
                None => format!("{file} archived"),
            },
            generation,
        ),
        (None, _) => condition(
            CONTINUOUS_ARCHIVING,
            "Unknown",
            "WaitingForFirstFile",
            "No WAL file archived yet".to_owned(),
            generation,
        ),
    }
}

/// A reason a machine can act on: the archive is another cluster's, two primaries wrote the
/// same file, or the store fails.
fn failure_reason(error: &str) -> &'static str {
    if error.contains("archiving there is refused") {
        "ArchiveOwnedByAnother"
    } else if error.contains("two primaries wrote the same WAL file") {
        "WALConflict"
    } else {
        "ArchiveFailing"
    }
}

fn pressure_condition(report: &WalArchiveReport, generation: Option<i64>) -> Condition {
    let gib = |bytes: u64| bytes as f64 / f64::from(1u32 << 30);
    match (
        report.wal_bytes,
        report.volume_bytes,
        report.available_bytes,
    ) {
        (Some(wal), Some(volume), available)
            if report.failing && volume > 0 && wal * 100 >= volume * WAL_PRESSURE_PERCENT =>
        {
            condition(
                WAL_DISK_PRESSURE,
                "True",
                "WALNotArchived",
                format!(
                    "Archiving fails and pg_wal holds {:.1} GiB of the {:.1} GiB volume; {:.1} GiB left. PostgreSQL stops when the volume is full",
                    gib(wal),
                    gib(volume),
                    gib(available.unwrap_or(0)),
                ),
                generation,
            )
        }
        _ => condition(
            WAL_DISK_PRESSURE,
            "False",
            "WithinBounds",
            format!("pg_wal is below {WAL_PRESSURE_PERCENT}% of the volume, or archiving keeps up"),
            generation,
        ),
    }
}

fn find_condition(previous: Option<&PostgreSQLClusterStatus>, type_: &str) -> Option<Condition> {
    previous?
        .conditions
        .iter()
        .find(|condition| condition.type_ == type_)
        .cloned()
}

#[cfg(test)]
mod tests;
