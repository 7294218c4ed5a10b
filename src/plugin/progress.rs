//! How `backup --wait` and `restore --wait` show a running transfer: a bar redrawn in place on a
//! terminal, a plain line for each new report through a pipe (pure).
//!
//! The figures are the object's `status.progress`, which the controller writes at most every
//! 10 s from the agent's reports; the time left is worked out here from its rate.

use std::time::Duration;

use pgkube_controllers::agent_job::human_bytes;
use pgkube_crds::TransferProgress;

/// Width of the bar, in characters between its brackets.
const BAR_WIDTH: usize = 24;

/// The time left at the current rate, when the total is known and not yet reached.
pub fn time_left(progress: &TransferProgress) -> Option<Duration> {
    let total = progress.total_bytes?;
    let rate = progress.bytes_per_second.filter(|rate| *rate > 0)?;
    let left = total.checked_sub(progress.bytes).filter(|left| *left > 0)?;
    Some(Duration::from_secs(u64::try_from(left / rate).ok()?))
}

/// `1h02m`, `4m05s`, `12s`.
pub fn duration_text(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match (seconds / 3600, seconds % 3600 / 60, seconds % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// What is being done, bytes, rate and time left, in one line:
/// `Dumping 2/5 shop  1.2 GiB of ~3.0 GiB  40.0 MiB/s  ETA ~45s`.
pub fn figures(progress: &TransferProgress) -> String {
    let estimate = if progress.total_is_estimate { "~" } else { "" };
    let mut line = progress.step.clone();
    if let (Some(done), Some(count)) = (progress.databases_done, progress.database_count) {
        line.push_str(&format!(" {done}/{count}"));
    }
    if let Some(database) = &progress.current_database {
        line.push_str(&format!(" {database}"));
    }
    line.push_str(&format!("  {}", human_bytes(unsigned(progress.bytes))));
    if let Some(total) = progress.total_bytes {
        line.push_str(&format!(" of {estimate}{}", human_bytes(unsigned(total))));
    }
    if let Some(rate) = progress.bytes_per_second {
        line.push_str(&format!("  {}/s", human_bytes(unsigned(rate))));
    }
    if let Some(left) = time_left(progress) {
        line.push_str(&format!("  ETA {estimate}{}", duration_text(left)));
    }
    line
}

/// The bar and the figures, for a terminal: `[#########---------------]  38%  <figures>`. Without
/// a total, the figures alone.
pub fn bar(progress: &TransferProgress) -> String {
    let Some(total) = progress.total_bytes.filter(|total| *total > 0) else {
        return figures(progress);
    };
    let fraction = (progress.bytes as f64 / total as f64).clamp(0.0, 1.0);
    let filled = (fraction * BAR_WIDTH as f64).round() as usize;
    format!(
        "[{}{}] {:>3.0}%  {}",
        "#".repeat(filled),
        "-".repeat(BAR_WIDTH - filled),
        fraction * 100.0,
        figures(progress)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    const MIB: i64 = 1024 * 1024;

    fn dumping(bytes: i64) -> TransferProgress {
        TransferProgress {
            step: "Dumping".into(),
            bytes,
            total_bytes: Some(400 * MIB),
            total_is_estimate: true,
            bytes_per_second: Some(10 * MIB),
            databases_done: Some(1),
            database_count: Some(3),
            current_database: Some("shop".into()),
            summary: String::new(),
            updated_at: Time(Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn the_time_left_comes_from_the_rate_and_what_remains() {
        assert_eq!(
            time_left(&dumping(100 * MIB)),
            Some(Duration::from_secs(30))
        );
        assert_eq!(time_left(&dumping(400 * MIB)), None, "nothing left");
        assert_eq!(time_left(&dumping(500 * MIB)), None, "past the estimate");
        let mut no_rate = dumping(100 * MIB);
        no_rate.bytes_per_second = None;
        assert_eq!(time_left(&no_rate), None);
    }

    #[test]
    fn the_bar_fills_with_the_bytes_done() {
        assert_eq!(
            bar(&dumping(100 * MIB)),
            "[######------------------]  25%  Dumping 1/3 shop  100.0 MiB of ~400.0 MiB  \
             10.0 MiB/s  ETA ~30s"
        );
        assert!(bar(&dumping(800 * MIB)).starts_with("[########################] 100%"));
    }

    #[test]
    fn without_a_total_there_is_no_bar_and_no_time_left() {
        let waiting = TransferProgress {
            step: "WaitingForWal".into(),
            total_bytes: None,
            total_is_estimate: false,
            databases_done: None,
            database_count: None,
            current_database: None,
            ..dumping(0)
        };
        assert_eq!(bar(&waiting), "WaitingForWal  0 B  10.0 MiB/s");
    }

    #[test]
    fn durations_read_in_the_largest_units() {
        assert_eq!(duration_text(Duration::from_secs(12)), "12s");
        assert_eq!(duration_text(Duration::from_secs(245)), "4m05s");
        assert_eq!(duration_text(Duration::from_secs(3720)), "1h02m");
    }
}
