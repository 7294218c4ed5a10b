//! Which archived WAL a retention pass deletes (pure): the WAL no kept physical backup needs.
//!
//! The rules:
//! - the archive is pruned only when at least one physical backup is kept whose WAL is in this
//!   cluster's archive root; with none, nothing in the archive is deleted;
//! - the archive's owner record (`archive.json`) must record this cluster's uid, and every such
//!   kept backup must record the system identifier it records; anything else leaves the whole
//!   archive alone, with the reason;
//! - the oldest kept backup's first segment is where the archive is kept from: a segment or a
//!   partial segment before it is deleted, on its timeline and on every earlier one. A later
//!   timeline than every kept backup's may belong to a branch no kept backup leads to, and
//!   stays;
//! - timeline history files, backup history files, the owner record and anything that is not
//!   an archived WAL file's key are never deleted.

use std::collections::BTreeMap;

use super::layout::BackupId;
use super::reading::{ManifestReading, WalBase};
use crate::storage::wal::{ArchiveOwner, WalFileKind, WalFileName};

/// What reading the archive's owner record gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnerReading {
    Found(ArchiveOwner),
    Missing,
    Unreadable(String),
}

/// What a pass does to the WAL archive.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WalPlan {
    /// The first segment kept: the oldest kept physical backup's first segment.
    pub kept_from: Option<String>,
    /// Keys of the WAL files to delete, in listing order.
    pub delete: Vec<String>,
    /// Why the archive is left alone, when it is.
    pub left_alone: Option<String>,
}

impl WalPlan {
    pub fn left_alone(reason: impl Into<String>) -> Self {
        Self {
            left_alone: Some(reason.into()),
            ..Self::default()
        }
    }
}

/// Where the WAL of each kept physical backup starts, for those whose WAL is under `root`.
pub fn kept_bases<'a>(
    root: &str,
    kept: &[BackupId],
    manifests: &'a BTreeMap<BackupId, ManifestReading>,
) -> Vec<(&'a BackupId, &'a WalBase)> {
    manifests
        .iter()
        .filter(|(id, _)| kept.contains(id))
        .filter_map(|(id, reading)| match reading {
            ManifestReading::Finished(finished) => finished.wal_base.as_ref().map(|b| (id, b)),
            _ => None,
        })
        .filter(|(_, base)| base.wal_root == root)
        .collect()
}

/// Decides which of the archive's `keys` (listed under `root`) go.
pub fn plan_wal(
    root: &str,
    cluster_uid: &str,
    bases: &[(&BackupId, &WalBase)],
    owner: &OwnerReading,
    keys: &[String],
) -> WalPlan {
    if let Err(reason) = check_ownership(cluster_uid, bases, owner) {
        return WalPlan::left_alone(reason);
    }
    let cutoff = match oldest_start(bases) {
        Ok(cutoff) => cutoff,
        Err(reason) => return WalPlan::left_alone(reason),
    };
    let delete = keys
        .iter()
        .filter(|key| archived_file(root, key).is_some_and(|file| cutoff.covers(&file)))
        .cloned()
        .collect();
    WalPlan {
        kept_from: Some(cutoff.first_kept),
        delete,
        left_alone: None,
    }
}

fn check_ownership(
    cluster_uid: &str,
    bases: &[(&BackupId, &WalBase)],
    owner: &OwnerReading,
) -> Result<(), String> {
    let owner = match owner {
        OwnerReading::Found(owner) => owner,
        OwnerReading::Missing => return Err("the archive has no archive.json".to_owned()),
        OwnerReading::Unreadable(reason) => {
            return Err(format!("its archive.json is unreadable ({reason})"));
        }
    };
    if owner.cluster_uid != cluster_uid {
        return Err(format!(
            "its archive.json records cluster uid {}, not {cluster_uid}",
            owner.cluster_uid
        ));
    }
    for (id, base) in bases {
        if base.system_identifier.as_deref() != Some(owner.system_identifier.as_str()) {
            return Err(format!(
                "backup {id} records system identifier {}, the archive {}",
                base.system_identifier.as_deref().unwrap_or("none"),
                owner.system_identifier
            ));
        }
    }
    Ok(())
}

/// Segments before `first_kept` go, on timelines up to `last_timeline`.
struct Cutoff {
    first_kept: String,
    last_timeline: String,
}

impl Cutoff {
    fn covers(&self, file: &WalFileName) -> bool {
        matches!(file.kind, WalFileKind::Segment | WalFileKind::Partial)
            && file.timeline <= self.last_timeline
            && segment_position(&file.name) < segment_position(&self.first_kept)
    }
}

/// The oldest first segment of the kept backups, and the latest timeline they start on.
fn oldest_start(bases: &[(&BackupId, &WalBase)]) -> Result<Cutoff, String> {
    let mut starts = Vec::with_capacity(bases.len());
    for (id, base) in bases {
        match WalFileName::parse(&base.first_wal) {
            Some(file) if file.kind == WalFileKind::Segment => starts.push(file),
            _ => {
                return Err(format!(
                    "backup {id} records first WAL {:?}, not a segment",
                    base.first_wal
                ));
            }
        }
    }
    let oldest = starts
        .iter()
        .min_by(|a, b| segment_position(&a.name).cmp(segment_position(&b.name)));
    let latest_timeline = starts.iter().map(|file| &file.timeline).max();
    match (oldest, latest_timeline) {
        (Some(oldest), Some(timeline)) => Ok(Cutoff {
            first_kept: oldest.name.clone(),
            last_timeline: timeline.clone(),
        }),
        _ => Err("no physical backup is kept".to_owned()),
    }
}

/// The log and segment digits of a segment name: fixed-width upper-case hex, so they order as
/// the segments do whatever the segment size.
fn segment_position(name: &str) -> &str {
    name.get(8..24).unwrap_or_default()
}

/// The WAL file a key `<root><timeline>/<name>.zst` holds, when it is one.
fn archived_file(root: &str, key: &str) -> Option<WalFileName> {
    let (timeline, file) = key.strip_prefix(root)?.split_once('/')?;
    let file = WalFileName::parse(file.strip_suffix(".zst")?)?;
    (file.timeline == timeline).then_some(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: &str = "ns/a/wal/a/";

    fn owner(system_identifier: &str, cluster_uid: &str) -> OwnerReading {
        OwnerReading::Found(ArchiveOwner {
            system_identifier: system_identifier.into(),
            cluster_uid: cluster_uid.into(),
            cluster: "ns/a".into(),
        })
    }

    fn base(first_wal: &str) -> WalBase {
        WalBase {
            wal_root: ROOT.into(),
            first_wal: first_wal.into(),
            system_identifier: Some("7001".into()),
        }
    }

    fn key(name: &str) -> String {
        format!("{ROOT}{}/{name}.zst", &name[..8])
    }

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| key(name)).collect()
    }

    #[test]
    fn segments_before_the_oldest_kept_backup_go_and_history_files_stay() {
        let (p1, p2) = (BackupId::new("p1", "u1"), BackupId::new("p2", "u2"));
        let (old, new) = (
            base("000000010000000000000010"),
            base("000000020000000000000030"),
        );
        let listed = keys(&[
            "00000001000000000000000E",
            "00000001000000000000000F.partial",
            "00000001000000000000000F.00000028.backup",
            "000000010000000000000010",
            "00000002.history",
            "00000002000000000000000F",
            "000000020000000000000031",
            "00000003000000000000000F",
        ]);
        let mut all = listed.clone();
        all.push(format!("{ROOT}archive.json"));
        let plan = plan_wal(
            ROOT,
            "c1",
            &[(&p1, &old), (&p2, &new)],
            &owner("7001", "c1"),
            &all,
        );
        assert_eq!(plan.left_alone, None);
        assert_eq!(plan.kept_from.as_deref(), Some("000000010000000000000010"));
        assert_eq!(
            plan.delete,
            keys(&[
                "00000001000000000000000E",
                "00000001000000000000000F.partial",
                "00000002000000000000000F",
            ])
        );
    }

    #[test]
    fn segment_order_spans_log_files() {
        let p1 = BackupId::new("p1", "u1");
        let start = base("000000010000000200000000");
        let listed = keys(&["0000000100000001000000FF", "000000010000000200000000"]);
        let plan = plan_wal(ROOT, "c1", &[(&p1, &start)], &owner("7001", "c1"), &listed);
        assert_eq!(plan.delete, keys(&["0000000100000001000000FF"]));
    }

    #[test]
    fn an_archive_of_another_owner_or_without_one_is_left_alone() {
        let p1 = BackupId::new("p1", "u1");
        let start = base("000000010000000000000010");
        let listed = keys(&["000000010000000000000001"]);
        let cases = [
            (owner("7001", "c2"), "records cluster uid c2, not c1"),
            (
                owner("7002", "c1"),
                "records system identifier 7001, the archive 7002",
            ),
            (OwnerReading::Missing, "no archive.json"),
            (OwnerReading::Unreadable("eof".into()), "unreadable (eof)"),
        ];
        for (owner, reason) in cases {
            let plan = plan_wal(ROOT, "c1", &[(&p1, &start)], &owner, &listed);
            assert!(plan.delete.is_empty(), "{owner:?}");
            let left_alone = plan.left_alone.expect("left alone");
            assert!(left_alone.contains(reason), "{left_alone}");
        }
    }

    #[test]
    fn without_a_kept_physical_backup_nothing_goes() {
        let listed = keys(&["000000010000000000000001"]);
        let plan = plan_wal(ROOT, "c1", &[], &owner("7001", "c1"), &listed);
        assert!(plan.delete.is_empty());
        assert_eq!(
            plan.left_alone.as_deref(),
            Some("no physical backup is kept")
        );
    }

    #[test]
    fn keys_that_are_not_archived_wal_files_stay() {
        let p1 = BackupId::new("p1", "u1");
        let start = base("000000010000000000000010");
        let odd = [
            format!("{ROOT}00000001/000000010000000000000001"),
            format!("{ROOT}00000002/000000010000000000000001.zst"),
            format!("{ROOT}000000010000000000000001.zst"),
            format!("{ROOT}00000001/x/000000010000000000000001.zst"),
            "ns/a/wal/b/00000001/000000010000000000000001.zst".to_owned(),
        ];
        let plan = plan_wal(ROOT, "c1", &[(&p1, &start)], &owner("7001", "c1"), &odd);
        assert!(plan.delete.is_empty(), "{:?}", plan.delete);
    }

    #[test]
    fn only_kept_physical_backups_on_this_archive_count() {
        let reading = |first_wal: &str, wal_root: &str| {
            ManifestReading::Finished(super::super::reading::Finished {
                at: chrono::Utc::now(),
                cluster_uid: Some("c1".into()),
                backup_name: "b".into(),
                backup_uid: Some("u".into()),
                wal_base: Some(WalBase {
                    wal_root: wal_root.into(),
                    ..base(first_wal)
                }),
            })
        };
        let manifests = BTreeMap::from([
            (
                BackupId::new("kept", "u1"),
                reading("000000010000000000000010", ROOT),
            ),
            (
                BackupId::new("gone", "u2"),
                reading("000000010000000000000001", ROOT),
            ),
            (
                BackupId::new("moved", "u3"),
                reading("000000010000000000000002", "x/wal/a/"),
            ),
            (BackupId::new("logical", "u4"), ManifestReading::Vanished),
        ]);
        let kept = [
            BackupId::new("kept", "u1"),
            BackupId::new("moved", "u3"),
            BackupId::new("logical", "u4"),
        ];
        let bases = kept_bases(ROOT, &kept, &manifests);
        let names: Vec<&str> = bases.iter().map(|(id, _)| id.name.as_str()).collect();
        assert_eq!(names, ["kept"]);
    }
}
