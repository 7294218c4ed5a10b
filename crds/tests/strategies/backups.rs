//! Generators of what backups and restores share in both versions: methods, targets,
//! compression, phases, a running transfer's progress, the restore status, sources and
//! recovery targets.

use super::*;

pub fn backup_method() -> impl Strategy<Value = BackupMethod> {
    prop_oneof![Just(BackupMethod::Logical), Just(BackupMethod::Physical)]
}

pub fn backup_target() -> impl Strategy<Value = BackupTarget> {
    prop_oneof![
        Just(BackupTarget::PreferStandby),
        Just(BackupTarget::Primary)
    ]
}

/// A compression the schema accepts: zstd at any level or none, gzip up to 9, none without one.
pub fn compression() -> impl Strategy<Value = BackupCompression> {
    prop_oneof![
        of(1i32..=19).prop_map(|level| (CompressionMethod::Zstd, level)),
        of(1i32..=9).prop_map(|level| (CompressionMethod::Gzip, level)),
        Just((CompressionMethod::None, None)),
    ]
    .prop_map(|(method, level)| BackupCompression { method, level })
}

pub fn deletion_policy() -> impl Strategy<Value = DeletionPolicy> {
    select(vec![DeletionPolicy::Retain, DeletionPolicy::Delete])
}

pub fn backup_phase() -> impl Strategy<Value = BackupPhase> {
    select(vec![
        BackupPhase::Pending,
        BackupPhase::Running,
        BackupPhase::Completed,
        BackupPhase::Failed,
    ])
}

fn restore_phase() -> impl Strategy<Value = RestorePhase> {
    select(vec![
        RestorePhase::Pending,
        RestorePhase::Running,
        RestorePhase::Completed,
        RestorePhase::Failed,
    ])
}

/// A running transfer's progress (the same type in both versions).
pub fn transfer_progress() -> impl Strategy<Value = TransferProgress> {
    (
        (
            "[A-Za-z]{1,15}",
            0i64..1 << 50,
            of(0i64..1 << 50),
            any::<bool>(),
        ),
        (
            of(0i64..1 << 40),
            of(0i32..1000),
            of(0i32..1000),
            of(name()),
        ),
        (text(), time()),
    )
        .prop_map(|(bytes, databases, report)| {
            let (step, bytes, total_bytes, total_is_estimate) = bytes;
            let (bytes_per_second, databases_done, database_count, current_database) = databases;
            let (summary, updated_at) = report;
            TransferProgress {
                step,
                bytes,
                total_bytes,
                total_is_estimate,
                bytes_per_second,
                databases_done,
                database_count,
                current_database,
                summary,
                updated_at,
            }
        })
}

/// A restore status (the same type in both versions).
pub fn restore_status() -> impl Strategy<Value = PostgreSQLRestoreStatus> {
    (
        (of(restore_phase()), of(time()), of(time())),
        (of("[a-z/.-]{1,30}"), vec(name(), 0..3), of(name())),
        (of(text()), conditions(), of("([0-9]{1,20}|Any)")),
        of(transfer_progress()),
    )
        .prop_map(|(state, result, detail, progress)| {
            let (phase, start_time, completion_time) = state;
            let (restored_object_key, restored_databases, job_name) = result;
            let (message, conditions, target_system_identifier) = detail;
            PostgreSQLRestoreStatus {
                phase,
                start_time,
                completion_time,
                target_system_identifier,
                restored_object_key,
                restored_databases,
                job_name,
                progress,
                message,
                conditions,
            }
        })
}

/// Exactly one of a backup reference and a source, as the schema requires.
pub fn backup_or_source<S: std::fmt::Debug + Clone + 'static>(
    source: impl Strategy<Value = S> + 'static,
) -> impl Strategy<Value = (Option<LocalReference>, Option<S>)> {
    prop_oneof![
        local_reference().prop_map(|backup| (Some(backup), None)),
        source.prop_map(|source| (None, Some(source))),
    ]
}

/// A recovery target: at most one of time, lsn, xid, name and immediate (the admission rule).
pub fn recovery_target() -> BoxedStrategy<pgkube_crds::RecoveryTarget> {
    let stop = prop_oneof![
        Just((None, None, None, None, None)),
        "2026-12-0[1-9]T1[0-9]:[0-5][0-9]:[0-5][0-9]Z".prop_map(|t| (
            Some(t),
            None,
            None,
            None,
            None
        )),
        "[0-9A-F]{1,8}/[0-9A-F]{1,8}".prop_map(|l| (None, Some(l), None, None, None)),
        "[0-9]{1,19}".prop_map(|x| (None, None, Some(x), None, None)),
        "[a-z0-9_ -]{1,63}".prop_map(|n| (None, None, None, Some(n), None)),
        any::<bool>().prop_map(|i| (None, None, None, None, Some(i))),
    ];
    let timeline = of(prop_oneof![
        Just("latest".to_owned()),
        Just("current".to_owned()),
        "[0-9]{1,10}"
    ]);
    (stop, of(any::<bool>()), timeline)
        .prop_map(|((time, lsn, xid, name, immediate), inclusive, timeline)| {
            pgkube_crds::RecoveryTarget {
                time,
                lsn,
                xid,
                name,
                immediate,
                inclusive,
                timeline,
            }
        })
        .boxed()
}
