//! The window, the choice of a base backup and the settings, on made-up manifests.

use super::*;
use crate::storage::manifest::{PhysicalBackup, StoredObject};

fn point(time: &str, lsn: &str) -> Point {
    Point {
        time: time.parse().expect("a time"),
        lsn: Lsn::parse(lsn).expect("an LSN"),
    }
}

fn window() -> Window {
    Window {
        first: point("2026-12-05T10:00:00Z", "0/5000000"),
        last: point("2026-12-05T12:00:00Z", "0/9000000"),
    }
}

fn at(time: &str) -> RecoveryTarget {
    RecoveryTarget {
        time: Some(time.to_owned()),
        ..RecoveryTarget::default()
    }
}

#[test]
fn a_time_or_lsn_outside_the_window_is_refused_naming_the_window() {
    assert_eq!(
        check_target(&at("2026-12-05T11:00:00+01:00"), &window()),
        Ok(())
    );
    let early = check_target(&at("2026-12-05T09:59:59Z"), &window()).expect_err("too early");
    assert!(
        early.to_string().contains("outside the recoverable window 2026-12-05T10:00:00Z (0/5000000) to 2026-12-05T12:00:00Z (0/9000000)"),
        "{early}"
    );
    check_target(&at("2026-12-05T12:00:01Z"), &window()).expect_err("too late");
    let lsn = |lsn: &str| RecoveryTarget {
        lsn: Some(lsn.to_owned()),
        ..RecoveryTarget::default()
    };
    assert_eq!(check_target(&lsn("0/6000000"), &window()), Ok(()));
    check_target(&lsn("0/4FFFFFF"), &window()).expect_err("before the backup");
    check_target(&lsn("0/9000001"), &window()).expect_err("after the archive");
    let name = RecoveryTarget {
        name: Some("before-migration".to_owned()),
        ..RecoveryTarget::default()
    };
    assert_eq!(check_target(&name, &window()), Ok(()));
}

#[test]
fn targets_the_admission_rules_refuse_are_refused_again() {
    let both = RecoveryTarget {
        time: Some("2026-12-05T11:00:00Z".to_owned()),
        lsn: Some("0/1".to_owned()),
        ..RecoveryTarget::default()
    };
    assert!(validate_target(&both).is_err());
    assert!(validate_target(&at("yesterday")).is_err());
    assert!(validate_target(&at("2026-12-05 11:00:00")).is_err());
    let timeline = RecoveryTarget {
        timeline: Some("newest".to_owned()),
        ..RecoveryTarget::default()
    };
    assert!(validate_target(&timeline).is_err());
    assert_eq!(validate_target(&at("2026-12-05T11:00:00Z")), Ok(()));
}

fn candidate(key: &str, finished: &str, stop_lsn: &str) -> Candidate {
    let object = StoredObject {
        key: format!("{key}/base.tar.zst"),
        size: 1,
        sha256: String::new(),
        format: "pg_basebackup-tar".to_owned(),
        compression: None,
    };
    let manifest = Manifest {
        manifest_version: 3,
        cluster: "db".to_owned(),
        namespace: "ns".to_owned(),
        cluster_uid: None,
        system_identifier: Some("7".to_owned()),
        backup_name: key.to_owned(),
        backup_uid: None,
        postgresql_version: "15".to_owned(),
        started_at: finished.to_owned(),
        finished_at: finished.to_owned(),
        format: "pg_basebackup-tar".to_owned(),
        globals: None,
        databases: Vec::new(),
        physical: Some(PhysicalBackup {
            start_lsn: stop_lsn.to_owned(),
            start_timeline: 1,
            stop_lsn: stop_lsn.to_owned(),
            stop_timeline: 1,
            source: "db-0".to_owned(),
            from_standby: false,
            wal_root: "ns/db/wal/db/".to_owned(),
            first_wal: String::new(),
            last_wal: String::new(),
            base: object.clone(),
            backup_label: object.clone(),
            tablespace_map: None,
            backup_manifest: object,
        }),
    };
    Candidate {
        manifest_key: format!("{key}/manifest.json"),
        manifest,
    }
}

#[test]
fn the_latest_backup_that_ends_before_the_target_is_picked() {
    let candidates = [
        candidate("a", "2026-12-05T10:00:00Z", "0/5000000"),
        candidate("b", "2026-12-05T11:00:00Z", "0/7000000"),
        candidate("c", "2026-12-05T12:00:00Z", "0/9000000"),
    ];
    let pick = |target: &RecoveryTarget| {
        pick_backup(&candidates, target)
            .expect("valid")
            .map(|c| c.manifest.backup_name.clone())
    };
    assert_eq!(pick(&at("2026-12-05T11:30:00Z")).as_deref(), Some("b"));
    assert_eq!(pick(&at("2026-12-05T11:00:00Z")).as_deref(), Some("b"));
    assert_eq!(pick(&at("2026-12-05T09:00:00Z")), None);
    assert_eq!(pick(&RecoveryTarget::default()).as_deref(), Some("c"));
    let lsn = RecoveryTarget {
        lsn: Some("0/6FFFFFF".to_owned()),
        ..RecoveryTarget::default()
    };
    assert_eq!(pick(&lsn).as_deref(), Some("a"));
}

#[test]
fn the_settings_replay_to_the_target_and_promote() {
    let target = RecoveryTarget {
        name: Some("it's".to_owned()),
        inclusive: Some(false),
        ..RecoveryTarget::default()
    };
    assert_eq!(
        target_settings(&target),
        "recovery_target_name = 'it''s'\nrecovery_target_inclusive = off\n\
         recovery_target_timeline = 'latest'\nrecovery_target_action = 'promote'\n"
    );
    let immediate = RecoveryTarget {
        immediate: Some(true),
        timeline: Some("current".to_owned()),
        ..RecoveryTarget::default()
    };
    assert_eq!(
        target_settings(&immediate),
        "recovery_target = 'immediate'\nrecovery_target_timeline = 'current'\n\
         recovery_target_action = 'promote'\n"
    );
    assert_eq!(
        describe(&RecoveryTarget::default()),
        "the end of the archive"
    );
}
