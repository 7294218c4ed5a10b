//! The agent's progress lines (pure): `pgkube agent` prints one on stderr every few seconds, the
//! controllers read the last one from the Job pod's log and copy it into the backup's or
//! restore's `status.progress`, at most every
//! [`PROGRESS_WRITE_INTERVAL_SECONDS`](pgkube_crds::PROGRESS_WRITE_INTERVAL_SECONDS).
//!
//! The log carries it, not the API: the agent's pod has no token for the API server, and reading
//! a pod's log is a read the manager can afford every few seconds per running Job.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use pgkube_crds::{PROGRESS_WRITE_INTERVAL_SECONDS, TransferProgress};
use serde::{Deserialize, Serialize};

/// Where the agent stands, as it prints it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AgentProgress {
    /// What the agent does now (see [`TransferProgress::step`]).
    pub step: String,
    /// Bytes done in this step.
    pub bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub total_is_estimate: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_second: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub databases_done: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database_count: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_database: Option<String>,
}

/// The line's envelope: `{"progress":{...}}`, which no log line of the agent's looks like.
#[derive(Serialize, Deserialize)]
struct ProgressLine {
    progress: AgentProgress,
}

impl AgentProgress {
    /// The line the agent prints.
    pub fn line(&self) -> String {
        let line = ProgressLine {
            progress: self.clone(),
        };
        // Plain strings and numbers always serialise.
        serde_json::to_string(&line).unwrap_or_default()
    }

    /// The last progress line in `log`, if any.
    pub fn last_in_log(log: &str) -> Option<Self> {
        log.lines()
            .rev()
            .filter(|line| line.starts_with("{\"progress\""))
            .find_map(|line| serde_json::from_str::<ProgressLine>(line).ok())
            .map(|line| line.progress)
    }

    /// The status field for this progress, reported at `now`.
    pub fn to_status(&self, now: Timestamp) -> TransferProgress {
        let signed = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let small = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
        TransferProgress {
            step: self.step.clone(),
            bytes: signed(self.bytes),
            total_bytes: self.total_bytes.map(signed),
            total_is_estimate: self.total_is_estimate,
            bytes_per_second: self.bytes_per_second.map(signed),
            databases_done: self.databases_done.map(small),
            database_count: self.database_count.map(small),
            current_database: self.current_database.clone(),
            summary: self.summary(),
            updated_at: Time(now),
        }
    }

    /// A few words for `kubectl get`: `Dumping 2/5 shop, 1.2 GiB of ~3.0 GiB at 40 MiB/s`.
    pub fn summary(&self) -> String {
        let mut summary = self.step.clone();
        if let (Some(done), Some(count)) = (self.databases_done, self.database_count) {
            summary.push_str(&format!(" {done}/{count}"));
        }
        if let Some(database) = &self.current_database {
            summary.push_str(&format!(" {database}"));
        }
        summary.push_str(&format!(", {}", human_bytes(self.bytes)));
        if let Some(total) = self.total_bytes {
            let about = if self.total_is_estimate { "~" } else { "" };
            summary.push_str(&format!(" of {about}{}", human_bytes(total)));
        }
        if let Some(rate) = self.bytes_per_second {
            summary.push_str(&format!(" at {}/s", human_bytes(rate)));
        }
        summary
    }
}

/// Whether a progress may be written now: none yet, or the last one is at least the interval
/// old.
pub fn progress_due(previous: Option<&TransferProgress>, now: Timestamp) -> bool {
    previous.is_none_or(|previous| {
        now.as_second() - previous.updated_at.0.as_second() >= PROGRESS_WRITE_INTERVAL_SECONDS
    })
}

/// Bytes in binary units with one decimal: `512 B`, `1.5 KiB`, `3.2 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumping() -> AgentProgress {
        AgentProgress {
            step: "Dumping".into(),
            bytes: 3 * 1024 * 1024 * 1024 / 2,
            total_bytes: Some(3 * 1024 * 1024 * 1024),
            total_is_estimate: true,
            bytes_per_second: Some(40 * 1024 * 1024),
            databases_done: Some(2),
            database_count: Some(5),
            current_database: Some("shop".into()),
        }
    }

    #[test]
    fn the_last_progress_line_of_a_log_is_read_among_other_lines() {
        let mut older = dumping();
        older.bytes = 10;
        let log = format!(
            "2026-12-07T10:00:00Z  INFO dumping database database=shop\n{}\n\
             {{\"status\":\"Completed\"}}\n{}\n2026-12-07T10:00:05Z  INFO still going\n",
            older.line(),
            dumping().line()
        );
        assert_eq!(AgentProgress::last_in_log(&log), Some(dumping()));
        assert_eq!(AgentProgress::last_in_log("no progress here\n"), None);
        assert_eq!(AgentProgress::last_in_log("{\"progress\": broken\n"), None);
    }

    #[test]
    fn the_summary_names_the_step_databases_bytes_and_rate() {
        assert_eq!(
            dumping().summary(),
            "Dumping 2/5 shop, 1.5 GiB of ~3.0 GiB at 40.0 MiB/s"
        );
        let streaming = AgentProgress {
            step: "Streaming".into(),
            bytes: 512,
            ..AgentProgress::default()
        };
        assert_eq!(streaming.summary(), "Streaming, 512 B");
    }

    #[test]
    fn a_progress_is_written_at_most_every_interval() {
        let then = Timestamp::from_second(1_000_000).expect("time");
        let written = dumping().to_status(then);
        let soon =
            Timestamp::from_second(1_000_000 + PROGRESS_WRITE_INTERVAL_SECONDS - 1).expect("time");
        let later =
            Timestamp::from_second(1_000_000 + PROGRESS_WRITE_INTERVAL_SECONDS).expect("time");
        assert!(progress_due(None, then));
        assert!(!progress_due(Some(&written), soon));
        assert!(progress_due(Some(&written), later));
    }

    #[test]
    fn the_status_carries_every_field() {
        let now = Timestamp::from_second(1_000_000).expect("time");
        let status = dumping().to_status(now);
        assert_eq!(status.bytes, 3 * 1024 * 1024 * 1024 / 2);
        assert_eq!(status.total_bytes, Some(3 * 1024 * 1024 * 1024));
        assert!(status.total_is_estimate);
        assert_eq!(status.databases_done, Some(2));
        assert_eq!(status.database_count, Some(5));
        assert_eq!(status.current_database.as_deref(), Some("shop"));
        assert_eq!(status.summary, dumping().summary());
        assert_eq!(status.updated_at, Time(now));
    }

    #[test]
    fn bytes_read_in_binary_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 * 1024 * 1024 * 1024 * 1024), "5.0 TiB");
    }
}
