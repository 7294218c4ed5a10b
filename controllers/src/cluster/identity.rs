//! The identity of a cluster's data (pure): the PostgreSQL system identifier of its database,
//! recorded in `status.systemIdentifier` from the first primary that reports it and passed to
//! the instances in `instance.json` with the cluster's uid; and what that identity says about
//! a bootstrap from a backup.
//!
//! Once recorded, the identifier never changes: an instance with an empty volume then waits for
//! a copy of this database instead of making a new one, and data is copied only from an
//! instance that holds it (the instance manager checks, see `src/instance/guarded.rs`).

use pgkube_crds::PostgreSQLClusterStatus;

use super::instances::{InstanceReport, ObservedInstance, ReportedRole};

/// The cluster's system identifier: the recorded one, else the one the designated primary
/// reports once it is a ready primary.
pub fn recorded_system_identifier(
    previous: Option<&PostgreSQLClusterStatus>,
    instances: &[ObservedInstance],
    primary: &str,
) -> Option<String> {
    if let Some(recorded) = previous.and_then(|status| status.system_identifier.clone()) {
        return Some(recorded);
    }
    instances
        .iter()
        .find(|instance| instance.pod == primary)
        .filter(|instance| instance.is_ready_primary())
        .and_then(ObservedInstance::reported)
        .and_then(|report| report.system_identifier.clone())
}

/// What the primary's data says about running the cluster's bootstrap restore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BootstrapGate {
    /// The database was made by this cluster (initdb for this uid): the restore may run.
    Proceed,
    /// The primary has not reported its data yet.
    Wait(String),
    /// The volumes hold a database that this cluster did not make (an earlier cluster of the
    /// same name, whose volumes outlived it): restoring would drop what was written since the
    /// backup, so the bootstrap is skipped.
    Skip(String),
}

/// Whether the bootstrap restore may run over the database of the designated primary,
/// `report` (none when it does not answer), for the cluster of uid `cluster_uid`.
pub fn bootstrap_gate(cluster_uid: Option<&str>, report: Option<&InstanceReport>) -> BootstrapGate {
    let Some(report) = report.filter(|r| r.role == ReportedRole::Primary && r.ready) else {
        return BootstrapGate::Wait(
            "waiting for the primary to report which database its volume holds".to_owned(),
        );
    };
    let database = report.system_identifier.as_deref().unwrap_or("unknown");
    match (cluster_uid, report.initialized_by.as_deref()) {
        (Some(uid), Some(made_by)) if uid == made_by => BootstrapGate::Proceed,
        (_, Some(made_by)) => BootstrapGate::Skip(format!(
            "the volumes already hold database {database}, made by an earlier cluster (uid {made_by}): the bootstrap restore is skipped so that nothing written since the backup is lost"
        )),
        (_, None) => BootstrapGate::Skip(format!(
            "the volumes already hold database {database}, which this cluster did not make: the bootstrap restore is skipped so that nothing written since the backup is lost"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::instances::Unavailable;

    fn report(role: ReportedRole, made_by: Option<&str>) -> InstanceReport {
        InstanceReport {
            pod: "db-0".to_owned(),
            role,
            ready: role != ReportedRole::Starting,
            timeline: Some(1),
            current_lsn: None,
            received_lsn: None,
            replayed_lsn: None,
            streaming: false,
            pending_restart: Vec::new(),
            following: None,
            system_identifier: Some("7".to_owned()),
            initialized_by: made_by.map(str::to_owned),
            message: None,
            restart_by_switchover: false,
            settings_digest: None,
            wal_archive: None,
            in_place: None,
            manager_digest: None,
            certificate_authorities: None,
        }
    }

    fn observed(report: Result<InstanceReport, Unavailable>) -> ObservedInstance {
        ObservedInstance {
            pod: "db-0".to_owned(),
            uid: None,
            role_label: None,
            report,
        }
    }

    #[test]
    fn the_identifier_is_recorded_from_a_ready_primary_and_then_kept() {
        let primary = [observed(Ok(report(ReportedRole::Primary, None)))];
        assert_eq!(
            recorded_system_identifier(None, &primary, "db-0").as_deref(),
            Some("7")
        );
        // Another pod, a replica or a silent instance records nothing.
        assert_eq!(recorded_system_identifier(None, &primary, "db-1"), None);
        let replica = [observed(Ok(report(ReportedRole::Replica, None)))];
        assert_eq!(recorded_system_identifier(None, &replica, "db-0"), None);
        let silent = [observed(Err(Unavailable::Unreachable))];
        assert_eq!(recorded_system_identifier(None, &silent, "db-0"), None);
        // A primary made anew later does not change what was recorded.
        let previous = PostgreSQLClusterStatus {
            system_identifier: Some("5".to_owned()),
            ..PostgreSQLClusterStatus::default()
        };
        assert_eq!(
            recorded_system_identifier(Some(&previous), &primary, "db-0").as_deref(),
            Some("5")
        );
    }

    #[test]
    fn the_bootstrap_runs_only_over_a_database_this_cluster_made() {
        let own = report(ReportedRole::Primary, Some("uid-2"));
        assert_eq!(
            bootstrap_gate(Some("uid-2"), Some(&own)),
            BootstrapGate::Proceed
        );
        let earlier = report(ReportedRole::Primary, Some("uid-1"));
        let BootstrapGate::Skip(why) = bootstrap_gate(Some("uid-2"), Some(&earlier)) else {
            panic!("an earlier cluster's data is kept");
        };
        assert!(why.contains("database 7") && why.contains("uid-1"), "{why}");
        let unmarked = report(ReportedRole::Primary, None);
        assert!(matches!(
            bootstrap_gate(Some("uid-2"), Some(&unmarked)),
            BootstrapGate::Skip(_)
        ));
        let starting = report(ReportedRole::Starting, Some("uid-2"));
        assert!(matches!(
            bootstrap_gate(Some("uid-2"), Some(&starting)),
            BootstrapGate::Wait(_)
        ));
        assert!(matches!(
            bootstrap_gate(Some("uid-2"), None),
            BootstrapGate::Wait(_)
        ));
    }
}
