//! Physical backups: whether one can start, and which instance it reads (pure).
//!
//! A base backup is useless without the WAL from its start to its end, so a physical backup of a
//! cluster that does not archive waits (`WALArchivingOff`) and fails after the pending deadline,
//! as a backup without storage does.
//!
//! `PreferStandby` (the default target) reads a streaming replica so that the primary carries
//! none of the backup's load: of the ready replicas whose WAL streams and whose lag is within
//! [`MAX_STANDBY_LAG_BYTES`], the one with the least lag (then the first by name). A cluster of
//! one instance has no replica and is backed up from its primary. A cluster with replicas, none
//! of them fit, waits (`NoStreamingStandby`, `StandbyLagging`) rather than load the primary:
//! ask for `target: Primary` to back up from the primary then.

use kube::ResourceExt;
use pgkube_crds::{BackupMethod, BackupTarget, InstanceRole, PostgreSQLBackup, PostgreSQLCluster};

use super::decide::Reason;

/// The most WAL a standby may have to replay for a backup to be read from it: a standby further
/// behind would give a backup older than asked for (1 GiB, 64 segments).
pub const MAX_STANDBY_LAG_BYTES: i64 = 1024 * 1024 * 1024;

/// The instance a physical backup reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// Its pod.
    pub pod: String,
    /// A streaming replica (else the primary).
    pub standby: bool,
}

/// Whether the cluster archives its WAL: it has storage and `walArchiving.enabled` is not false.
pub fn archives(cluster: &PostgreSQLCluster) -> bool {
    cluster.spec.backup.as_ref().is_some_and(|backup| {
        backup.storage.is_some()
            && backup
                .wal_archiving
                .as_ref()
                .is_none_or(|archiving| archiving.enabled)
    })
}

/// The instance `backup` reads, or why it waits. `None` for a logical backup.
pub fn source(
    backup: &PostgreSQLBackup,
    cluster: &PostgreSQLCluster,
) -> Result<Option<Source>, Reason> {
    if backup.spec.method != BackupMethod::Physical {
        return Ok(None);
    }
    let name = cluster.name_any();
    if !archives(cluster) {
        return Err(Reason::new(
            "WALArchivingOff",
            format!(
                "PostgreSQLCluster {name} does not archive its WAL (spec.backup.walArchiving.enabled \
                 is false): a physical backup cannot be restored without it"
            ),
        ));
    }
    let status = cluster.status.as_ref();
    let primary = status.and_then(|s| s.current_primary.clone());
    let target = backup.spec.target.unwrap_or_default();
    if target == BackupTarget::Primary || cluster.spec.replicas <= 1 {
        return primary
            .map(|pod| {
                Some(Source {
                    pod,
                    standby: false,
                })
            })
            .ok_or_else(|| {
                Reason::new(
                    "ClusterNotReady",
                    format!("PostgreSQLCluster {name} has no primary yet"),
                )
            });
    }
    let streaming: Vec<_> = status
        .map(|s| s.instances.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(|i| i.role == InstanceRole::Replica && i.ready && i.streaming == Some(true))
        .filter(|i| Some(&i.name) != primary.as_ref())
        .collect();
    let best = streaming
        .iter()
        .filter(|i| i.lag_bytes.unwrap_or(0) <= MAX_STANDBY_LAG_BYTES)
        .min_by_key(|i| (i.lag_bytes.unwrap_or(0), i.name.clone()));
    match best {
        Some(instance) => Ok(Some(Source {
            pod: instance.name.clone(),
            standby: true,
        })),
        None if streaming.is_empty() => Err(Reason::new(
            "NoStreamingStandby",
            format!(
                "no replica of PostgreSQLCluster {name} is ready and streaming; the backup reads \
                 a standby (target PreferStandby) and waits for one, or set target: Primary"
            ),
        )),
        None => Err(Reason::new(
            "StandbyLagging",
            format!(
                "every streaming replica of PostgreSQLCluster {name} lags more than {} MiB behind \
                 the primary; the backup waits for one to catch up, or set target: Primary",
                MAX_STANDBY_LAG_BYTES / (1024 * 1024)
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgkube_crds::{
        BackupSpec, InstanceStatus, PostgreSQLBackupSpec, PostgreSQLClusterStatus, WalArchiving,
    };

    fn cluster(replicas: i32, instances: Vec<InstanceStatus>) -> PostgreSQLCluster {
        let mut cluster: PostgreSQLCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "db.example.com/v1beta1",
            "kind": "PostgreSQLCluster",
            "metadata": {"name": "main", "namespace": "db"},
            "spec": {
                "replicas": replicas, "version": "15", "storage": {"size": "1Gi"},
                "backup": {
                    "schedule": {"cron": "0 3 * * *"},
                    "storage": {"s3": {"bucket": "b", "region": "r", "credentials": {
                        "accessKeyId": {"name": "s", "key": "a"},
                        "secretAccessKey": {"name": "s", "key": "k"}}}}
                }
            }
        }))
        .expect("a cluster");
        cluster.status = Some(PostgreSQLClusterStatus {
            current_primary: Some("main-postgresql-0".into()),
            instances,
            ..PostgreSQLClusterStatus::default()
        });
        cluster
    }

    fn replica(name: &str, streaming: bool, lag: Option<i64>) -> InstanceStatus {
        InstanceStatus {
            name: name.into(),
            role: InstanceRole::Replica,
            ready: true,
            timeline: Some(1),
            lag_bytes: lag,
            streaming: Some(streaming),
            message: None,
        }
    }

    fn backup(method: BackupMethod, target: Option<BackupTarget>) -> PostgreSQLBackup {
        let mut backup: PostgreSQLBackup = serde_json::from_value(serde_json::json!({
            "apiVersion": "db.example.com/v1beta1",
            "kind": "PostgreSQLBackup",
            "metadata": {"name": "b1", "namespace": "db"},
            "spec": {"cluster": {"name": "main"}}
        }))
        .expect("a backup");
        let spec: &mut PostgreSQLBackupSpec = &mut backup.spec;
        spec.method = method;
        spec.target = target;
        backup
    }

    fn reason(result: Result<Option<Source>, Reason>) -> &'static str {
        result.expect_err("waits").reason
    }

    #[test]
    fn a_logical_backup_has_no_source_and_a_physical_one_needs_archiving() {
        let mut main = cluster(1, Vec::new());
        assert_eq!(
            source(&backup(BackupMethod::Logical, None), &main),
            Ok(None)
        );
        let physical = backup(BackupMethod::Physical, None);
        if let Some(settings) = main.spec.backup.as_mut() {
            let settings: &mut BackupSpec = settings;
            settings.wal_archiving = Some(WalArchiving { enabled: false });
        }
        assert_eq!(reason(source(&physical, &main)), "WALArchivingOff");
        main.spec.backup = None;
        assert_eq!(reason(source(&physical, &main)), "WALArchivingOff");
    }

    #[test]
    fn prefer_standby_reads_the_least_lagging_streaming_replica() {
        let main = cluster(
            3,
            vec![
                replica("main-postgresql-1", true, Some(4096)),
                replica("main-postgresql-2", true, Some(0)),
            ],
        );
        let chosen = source(&backup(BackupMethod::Physical, None), &main);
        assert_eq!(
            chosen,
            Ok(Some(Source {
                pod: "main-postgresql-2".into(),
                standby: true
            }))
        );
        let primary = source(
            &backup(BackupMethod::Physical, Some(BackupTarget::Primary)),
            &main,
        );
        assert_eq!(
            primary,
            Ok(Some(Source {
                pod: "main-postgresql-0".into(),
                standby: false
            }))
        );
    }

    #[test]
    fn with_replicas_none_fit_the_backup_waits_and_one_instance_uses_its_primary() {
        let physical = backup(BackupMethod::Physical, None);
        let stopped = cluster(2, vec![replica("main-postgresql-1", false, None)]);
        assert_eq!(reason(source(&physical, &stopped)), "NoStreamingStandby");
        let behind = cluster(
            2,
            vec![replica(
                "main-postgresql-1",
                true,
                Some(MAX_STANDBY_LAG_BYTES + 1),
            )],
        );
        assert_eq!(reason(source(&physical, &behind)), "StandbyLagging");
        let single = cluster(1, Vec::new());
        assert_eq!(
            source(&physical, &single).map(|s| s.map(|s| s.standby)),
            Ok(Some(false))
        );
    }
}
