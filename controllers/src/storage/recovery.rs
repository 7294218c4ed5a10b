//! Point-in-time recovery (pure): what the operator tells the first instance of a recovering
//! cluster (`instance.json`'s `recovery`, a [`RecoveryOrder`]), the window a recovery can reach
//! ([`Window`]), which base backup serves a target ([`pick_backup`]), and the PostgreSQL
//! settings that replay to the target ([`target_settings`]).

use k8s_openapi::jiff::Timestamp;
use pgkube_crds::RecoveryTarget;
use serde::{Deserialize, Serialize};

use super::lsn::Lsn;
use super::manifest::Manifest;
use super::wal::WalArchiveTarget;

/// What the first instance of a recovering cluster restores and replays.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryOrder {
    /// The source's archive (its root, bucket and endpoint; the keys are files of the pod):
    /// where the WAL is read from, and where the base backup is stored.
    pub archive: WalArchiveTarget,
    /// The base backup's manifest key, for messages.
    pub backup: String,
    /// `base.tar.zst`: the data directory as a tar, compressed with zstd.
    pub base: BaseObject,
    /// The system identifier of the backed-up database: the restored data must have it.
    pub system_identifier: String,
    /// Where the base backup becomes consistent.
    pub stop_lsn: String,
    pub target: RecoveryTarget,
}

/// How the message of an instance replaying WAL to a recovery target starts (its instance
/// manager's words, which the cluster controller publishes as RecoveryProgress Events).
pub const REPLAY_PROGRESS_PREFIX: &str = "recovering to ";

/// A stored object as the manifest recorded it: the stored bytes' size and SHA-256.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BaseObject {
    pub key: String,
    pub size: u64,
    pub sha256: String,
}

/// A point a recovery can stop at: a moment and a WAL location.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    pub time: Timestamp,
    pub lsn: Lsn,
}

/// The points a recovery can reach: from the end of a base backup to the last WAL archived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub first: Point,
    pub last: Point,
}

impl std::fmt::Display for Window {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "{} ({}) to {} ({})",
            self.first.time, self.first.lsn, self.last.time, self.last.lsn
        )
    }
}

/// Why a target cannot be reached; the message names the window.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("recovery target {0}")]
    Invalid(String),
    #[error("recovery target {target} is outside the recoverable window {window}")]
    OutsideWindow { target: String, window: String },
}

/// Checks a target against the window: a time or LSN before the base backup is consistent,
/// or after the last WAL archived, can never be reached. Transaction ids and restore point
/// names are not in the window's terms: PostgreSQL finds them while it replays.
pub fn check_target(target: &RecoveryTarget, window: &Window) -> Result<(), TargetError> {
    let outside = |target: String| TargetError::OutsideWindow {
        target,
        window: window.to_string(),
    };
    if let Some(time) = &target.time {
        let moment = parse_time(time)?;
        if moment < window.first.time || moment > window.last.time {
            return Err(outside(format!("time {time}")));
        }
    }
    if let Some(text) = &target.lsn {
        let lsn = parse_lsn(text)?;
        if lsn < window.first.lsn || lsn > window.last.lsn {
            return Err(outside(format!("lsn {text}")));
        }
    }
    Ok(())
}

/// A target time: RFC 3339, with its offset.
pub fn parse_time(text: &str) -> Result<Timestamp, TargetError> {
    text.parse::<Timestamp>().map_err(|error| {
        TargetError::Invalid(format!(
            "time {text:?} is not an RFC 3339 time with an offset (2026-12-05T14:03:27Z): {error}"
        ))
    })
}

fn parse_lsn(text: &str) -> Result<Lsn, TargetError> {
    Lsn::parse(text).ok_or_else(|| {
        TargetError::Invalid(format!("lsn {text:?} is not a WAL location (0/3000028)"))
    })
}

/// Checks what the admission rules check too, for a spec that got past them (an older CRD).
pub fn validate_target(target: &RecoveryTarget) -> Result<(), TargetError> {
    let stops = [
        target.time.is_some(),
        target.lsn.is_some(),
        target.xid.is_some(),
        target.name.is_some(),
        target.immediate == Some(true),
    ];
    if stops.iter().filter(|set| **set).count() > 1 {
        return Err(TargetError::Invalid(
            "sets more than one of time, lsn, xid, name and immediate".to_owned(),
        ));
    }
    if let Some(time) = &target.time {
        parse_time(time)?;
    }
    if let Some(lsn) = &target.lsn {
        parse_lsn(lsn)?;
    }
    if let Some(xid) = target.xid.as_deref().filter(|x| x.parse::<u64>().is_err()) {
        return Err(TargetError::Invalid(format!(
            "xid {xid:?} is not a transaction id"
        )));
    }
    if let Some(timeline) = target.timeline.as_deref()
        && !matches!(timeline, "latest" | "current")
        && timeline.parse::<u32>().is_err()
    {
        return Err(TargetError::Invalid(format!(
            "timeline {timeline:?} is not latest, current or a timeline number"
        )));
    }
    Ok(())
}

/// A physical base backup of the archive, as its manifest says.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub manifest_key: String,
    pub manifest: Manifest,
}

impl Candidate {
    /// Where and when the backup is consistent: its stop LSN, and when it finished (an upper
    /// bound of the moment).
    pub fn end(&self) -> Option<Point> {
        let physical = self.manifest.physical.as_ref()?;
        Some(Point {
            time: self.manifest.finished_at.parse().ok()?,
            lsn: Lsn::parse(&physical.stop_lsn)?,
        })
    }
}

/// The latest base backup that ends before the target: before its time or LSN; the latest of
/// all for any other target. `None` when every backup ends after the target.
pub fn pick_backup<'a>(
    candidates: &'a [Candidate],
    target: &RecoveryTarget,
) -> Result<Option<&'a Candidate>, TargetError> {
    let time = target.time.as_deref().map(parse_time).transpose()?;
    let lsn = target.lsn.as_deref().map(parse_lsn).transpose()?;
    Ok(candidates
        .iter()
        .filter_map(|candidate| Some((candidate, candidate.end()?)))
        .filter(|(_, end)| time.is_none_or(|time| end.time <= time))
        .filter(|(_, end)| lsn.is_none_or(|lsn| end.lsn <= lsn))
        .max_by_key(|(_, end)| end.lsn)
        .map(|(candidate, _)| candidate))
}

/// The `postgresql.conf` lines that make the server replay to `target` and promote there.
pub fn target_settings(target: &RecoveryTarget) -> String {
    let quote = |text: &str| text.replace('\'', "''");
    let mut lines = Vec::new();
    if let Some(time) = &target.time {
        lines.push(format!(
            "recovery_target_time = '{}'",
            quote(&server_time(time))
        ));
    } else if let Some(lsn) = &target.lsn {
        lines.push(format!("recovery_target_lsn = '{}'", quote(lsn)));
    } else if let Some(xid) = &target.xid {
        lines.push(format!("recovery_target_xid = '{}'", quote(xid)));
    } else if let Some(name) = &target.name {
        lines.push(format!("recovery_target_name = '{}'", quote(name)));
    } else if target.immediate == Some(true) {
        lines.push("recovery_target = 'immediate'".to_owned());
    }
    if let Some(inclusive) = target.inclusive {
        lines.push(format!(
            "recovery_target_inclusive = {}",
            if inclusive { "on" } else { "off" }
        ));
    }
    lines.push(format!(
        "recovery_target_timeline = '{}'",
        quote(target.timeline.as_deref().unwrap_or("latest"))
    ));
    // Without a target, the server promotes at the end of the archive by itself.
    lines.push("recovery_target_action = 'promote'".to_owned());
    lines.join("\n") + "\n"
}

/// A target time as the server reads it at start: UTC with a numeric offset. It parses a zone
/// abbreviation such as `Z` only once its abbreviation table is loaded, which is after it reads
/// `recovery_target_time`. A time that does not parse is left as it is (the server says why).
fn server_time(time: &str) -> String {
    let Ok(moment) = parse_time(time) else {
        return time.to_owned();
    };
    let utc = moment.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}+00:00",
        utc.year(),
        utc.month(),
        utc.day(),
        utc.hour(),
        utc.minute(),
        utc.second(),
        utc.subsec_nanosecond() / 1000
    )
}

/// A target for messages: `time 2026-…`, `lsn 0/…`, or `the end of the archive`.
pub fn describe(target: &RecoveryTarget) -> String {
    match (&target.time, &target.lsn, &target.xid, &target.name) {
        (Some(time), ..) => format!("time {time}"),
        (_, Some(lsn), ..) => format!("lsn {lsn}"),
        (_, _, Some(xid), _) => format!("xid {xid}"),
        (_, _, _, Some(name)) => format!("restore point {name:?}"),
        _ if target.immediate == Some(true) => "the end of the base backup".to_owned(),
        _ => "the end of the archive".to_owned(),
    }
}

pub mod in_place;

#[cfg(test)]
mod tests;
