//! Roles (pure): which instance is the designated primary, and which role label each pod
//! should carry so that the `-rw` and `-ro` Services route to the right instances.
//!
//! The operator designates the primary (`status.targetPrimary` during a switchover or failover,
//! else `status.currentPrimary`, else the first instance of a new cluster, which runs initdb while every other one clones it); an instance manager reports
//! what its server actually is. A pod gets [`ROLE_LABEL`](super::build::ROLE_LABEL)`=primary`
//! only when it is the designated primary *and* reports itself as one, and `replica` when it
//! reports a replica. A pod that reports nothing (starting, unreachable) keeps its label, as
//! readiness already takes a pod that does not serve out of its Services; but a primary label
//! on any pod other than the designated primary is always removed, and removals are made before
//! the primary label is set, so no two pods ever carry it at once.

use pgkube_crds::PostgreSQLClusterStatus;

use super::build::ChildNames;
use super::instances::{ObservedInstance, ReportedRole};

/// Values of [`ROLE_LABEL`](super::build::ROLE_LABEL).
pub const PRIMARY: &str = "primary";
pub const REPLICA: &str = "replica";

/// Pod `ordinal` of StatefulSet `statefulset`.
pub fn pod_name(statefulset: &str, ordinal: i32) -> String {
    format!("{statefulset}-{ordinal}")
}

/// The ordinal of `pod` if it is one of the pods of StatefulSet `statefulset`.
pub fn ordinal(statefulset: &str, pod: &str) -> Option<i32> {
    pod.strip_prefix(statefulset)?
        .strip_prefix('-')?
        .parse()
        .ok()
        .filter(|ordinal| *ordinal >= 0)
}

/// The pod that should be the primary: the target of a switchover or failover under way, else
/// the primary the status names, else the first instance.
pub fn designated_primary(status: Option<&PostgreSQLClusterStatus>, names: &ChildNames) -> String {
    status
        .and_then(|status| {
            status
                .target_primary
                .clone()
                .or_else(|| status.current_primary.clone())
        })
        .filter(|pod| ordinal(&names.statefulset, pod).is_some())
        .unwrap_or_else(|| pod_name(&names.statefulset, 0))
}

/// A change of one pod's [`ROLE_LABEL`](super::build::ROLE_LABEL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelChange {
    pub pod: String,
    /// The pod this decision was made for; a new pod of the same name is not labelled.
    pub uid: Option<String>,
    /// The new value; `None` removes the label.
    pub value: Option<&'static str>,
}

/// The label changes that make the pods' labels match their reported roles, removals first and
/// the primary label last. Empty when every label is right.
pub fn label_changes(instances: &[ObservedInstance], primary: &str) -> Vec<LabelChange> {
    let mut changes: Vec<LabelChange> = instances
        .iter()
        .filter_map(|instance| {
            let value = desired_label(instance, primary)?;
            (instance.role_label.as_deref() != value).then(|| LabelChange {
                pod: instance.pod.clone(),
                uid: instance.uid.clone(),
                value,
            })
        })
        .collect();
    changes.sort_by_key(|change| match change.value {
        None => 0,
        Some(REPLICA) => 1,
        Some(_) => 2,
    });
    changes
}

/// `instances` as they are once `changes` are applied to their labels.
pub fn with_labels(
    instances: &[ObservedInstance],
    changes: &[LabelChange],
) -> Vec<ObservedInstance> {
    let mut after = instances.to_vec();
    for change in changes {
        if let Some(instance) = after.iter_mut().find(|i| i.pod == change.pod) {
            instance.role_label = change.value.map(str::to_owned);
        }
    }
    after
}

/// `instances` once the instances of `promoted` answered their promotion: primaries now.
pub fn with_promoted(instances: &mut [ObservedInstance], promoted: &[String]) {
    for instance in instances.iter_mut().filter(|i| promoted.contains(&i.pod)) {
        if let Ok(report) = instance.report.as_mut() {
            report.role = ReportedRole::Primary;
        }
    }
}

/// The label `instance` should have: `None` to leave it as it is, `Some(None)` for none.
fn desired_label(instance: &ObservedInstance, primary: &str) -> Option<Option<&'static str>> {
    let designated = instance.pod == primary;
    match instance.reported().map(|report| report.role) {
        Some(ReportedRole::Primary) if designated => Some(Some(PRIMARY)),
        // Not the one the operator chose: never routed to as the primary.
        Some(ReportedRole::Primary) => Some(None),
        Some(ReportedRole::Replica) => Some(Some(REPLICA)),
        _ if !designated && instance.role_label.as_deref() == Some(PRIMARY) => Some(None),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::instances::{InstanceReport, Unavailable};

    #[test]
    fn a_promotion_answered_labels_the_new_primary_in_the_same_reconcile() {
        let observed = |pod: &str, role: &str, label: &str| ObservedInstance {
            pod: pod.to_owned(),
            uid: None,
            role_label: Some(label.to_owned()),
            report: Ok(serde_json::from_value(serde_json::json!({
                "pod": pod, "role": role, "ready": true
            }))
            .expect("report")),
        };
        // The old primary follows now; the target is still a replica when asked.
        let instances = [
            observed("db-0", "replica", PRIMARY),
            observed("db-1", "replica", REPLICA),
        ];
        let first = label_changes(&instances, "db-1");
        assert_eq!(first.len(), 1, "{first:?}");
        assert_eq!(
            (first[0].pod.as_str(), first[0].value),
            ("db-0", Some(REPLICA))
        );
        let mut after = with_labels(&instances, &first);
        assert_eq!(label_changes(&after, "db-1"), Vec::new(), "nothing left");
        with_promoted(&mut after, &["db-1".to_owned()]);
        let second = label_changes(&after, "db-1");
        assert_eq!(second.len(), 1, "{second:?}");
        assert_eq!(
            (second[0].pod.as_str(), second[0].value),
            ("db-1", Some(PRIMARY))
        );
    }

    fn names() -> ChildNames {
        ChildNames::for_cluster("db")
    }

    fn instance(pod: &str, label: Option<&str>, role: Option<ReportedRole>) -> ObservedInstance {
        ObservedInstance {
            pod: pod.to_owned(),
            uid: Some(format!("uid-{pod}")),
            role_label: label.map(str::to_owned),
            report: role
                .map(|role| InstanceReport {
                    pod: pod.to_owned(),
                    role,
                    ready: true,
                    timeline: Some(1),
                    current_lsn: None,
                    received_lsn: None,
                    replayed_lsn: None,
                    streaming: role == ReportedRole::Replica,
                    pending_restart: Vec::new(),
                    following: None,
                    system_identifier: None,
                    initialized_by: None,
                    message: None,
                    restart_by_switchover: false,
                    settings_digest: None,
                    wal_archive: None,
                    in_place: None,
                    manager_digest: None,
                    certificate_authorities: None,
                })
                .ok_or(Unavailable::Unreachable),
        }
    }

    fn summary(changes: &[LabelChange]) -> Vec<(&str, Option<&str>)> {
        changes.iter().map(|c| (c.pod.as_str(), c.value)).collect()
    }

    #[test]
    fn the_first_instance_is_the_primary_until_the_status_names_another() {
        assert_eq!(designated_primary(None, &names()), "db-postgresql-0");
        let status = PostgreSQLClusterStatus {
            current_primary: Some("db-postgresql-2".to_owned()),
            ..PostgreSQLClusterStatus::default()
        };
        assert_eq!(
            designated_primary(Some(&status), &names()),
            "db-postgresql-2"
        );
        // Not one of this cluster's pods (edited by hand): ignored.
        let stray = PostgreSQLClusterStatus {
            current_primary: Some("other-0".to_owned()),
            ..PostgreSQLClusterStatus::default()
        };
        assert_eq!(
            designated_primary(Some(&stray), &names()),
            "db-postgresql-0"
        );
        let statefulset = names().statefulset;
        assert_eq!(ordinal(&statefulset, "db-postgresql-12"), Some(12));
        assert_eq!(ordinal(&statefulset, "db-postgresql-headless"), None);
        assert_eq!(ordinal(&statefulset, "db-postgresql--1"), None);
        assert_eq!(pod_name(&statefulset, 3), "db-postgresql-3");
    }

    #[test]
    fn pods_are_labelled_by_their_reported_role_and_the_primary_only_when_designated() {
        let primary = "db-postgresql-0";
        let instances = [
            instance("db-postgresql-0", None, Some(ReportedRole::Primary)),
            instance("db-postgresql-1", None, Some(ReportedRole::Replica)),
            instance("db-postgresql-2", None, Some(ReportedRole::Starting)),
            instance("db-postgresql-3", None, None),
        ];
        assert_eq!(
            summary(&label_changes(&instances, primary)),
            [
                ("db-postgresql-1", Some(REPLICA)),
                ("db-postgresql-0", Some(PRIMARY))
            ]
        );
        let changes = label_changes(&instances, primary);
        assert_eq!(changes[1].uid.as_deref(), Some("uid-db-postgresql-0"));
    }

    #[test]
    fn labels_already_right_need_no_change() {
        let instances = [
            instance(
                "db-postgresql-0",
                Some(PRIMARY),
                Some(ReportedRole::Primary),
            ),
            instance(
                "db-postgresql-1",
                Some(REPLICA),
                Some(ReportedRole::Replica),
            ),
            // No report: the label stays.
            instance("db-postgresql-2", Some(REPLICA), None),
            instance(
                "db-postgresql-3",
                Some(REPLICA),
                Some(ReportedRole::Starting),
            ),
        ];
        assert!(label_changes(&instances, "db-postgresql-0").is_empty());
        // The designated primary keeps its label while it restarts.
        let restarting = [instance(
            "db-postgresql-0",
            Some(PRIMARY),
            Some(ReportedRole::Starting),
        )];
        assert!(label_changes(&restarting, "db-postgresql-0").is_empty());
    }

    #[test]
    fn a_primary_label_elsewhere_is_removed_before_the_designated_primary_gets_it() {
        let instances = [
            instance("db-postgresql-0", None, Some(ReportedRole::Primary)),
            // A second server calling itself primary is never routed to as one.
            instance(
                "db-postgresql-1",
                Some(PRIMARY),
                Some(ReportedRole::Primary),
            ),
            // Nor is a pod that still carries the label but does not answer.
            instance("db-postgresql-2", Some(PRIMARY), None),
        ];
        assert_eq!(
            summary(&label_changes(&instances, "db-postgresql-0")),
            [
                ("db-postgresql-1", None),
                ("db-postgresql-2", None),
                ("db-postgresql-0", Some(PRIMARY))
            ]
        );
    }

    #[test]
    fn a_designated_primary_that_reports_a_replica_is_labelled_a_replica() {
        let instances = [instance(
            "db-postgresql-0",
            Some(PRIMARY),
            Some(ReportedRole::Replica),
        )];
        assert_eq!(
            summary(&label_changes(&instances, "db-postgresql-0")),
            [("db-postgresql-0", Some(REPLICA))]
        );
    }
}
