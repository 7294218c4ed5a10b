//! Which database a restore may run into (pure): the PostgreSQL system identifier that its Job
//! checks the target's database against before it drops or restores anything.
//!
//! `spec.expectedSystemIdentifier` unset means the database the cluster has recorded
//! (`status.systemIdentifier` of the PostgreSQLCluster): until the cluster has recorded one the
//! restore waits rather than run unchecked. Digits mean exactly that database; `Any` means the
//! user accepts whatever database the cluster holds. The restore records what it will check in
//! `status.targetSystemIdentifier` before it creates its Job, and the Job is built from that.

use pgkube_crds::{ANY_SYSTEM_IDENTIFIER, PostgreSQLCluster, PostgreSQLRestore};

use crate::backup::decide::Reason;

/// The reason of a restore that found another database than it expected (the agent's report
/// carries it too, so that the restore's condition can say so).
pub const SYSTEM_IDENTIFIER_MISMATCH: &str = "SystemIdentifierMismatch";

/// What the restore checks its target against, or why it cannot know yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expectation {
    /// The value for `status.targetSystemIdentifier`: digits, or `Any`.
    Known(String),
    /// The spec leaves it to the cluster, which has not recorded an identifier yet: wait.
    Unknown(Reason),
    /// The spec's value is neither digits nor `Any` (the schema's pattern refuses it at
    /// admission; this is for an object that got past it).
    Invalid(Reason),
}

/// The identifier `restore` must find in `cluster`'s database.
pub fn expectation(restore: &PostgreSQLRestore, cluster: &PostgreSQLCluster) -> Expectation {
    match restore.spec.expected_system_identifier.as_deref() {
        Some(ANY_SYSTEM_IDENTIFIER) => Expectation::Known(ANY_SYSTEM_IDENTIFIER.to_owned()),
        Some(digits) if is_identifier(digits) => Expectation::Known(digits.to_owned()),
        Some(other) => Expectation::Invalid(Reason::new(
            "InvalidExpectedSystemIdentifier",
            format!(
                "spec.expectedSystemIdentifier {other:?} is neither a system identifier (digits) \
                 nor {ANY_SYSTEM_IDENTIFIER}"
            ),
        )),
        None => match cluster
            .status
            .as_ref()
            .and_then(|status| status.system_identifier.as_deref())
        {
            Some(recorded) => Expectation::Known(recorded.to_owned()),
            None => Expectation::Unknown(Reason::new(
                "SystemIdentifierUnknown",
                format!(
                    "PostgreSQLCluster {} has not recorded the system identifier of its \
                     database yet (status.systemIdentifier), so the restore cannot check that \
                     it replaces the right database; set spec.expectedSystemIdentifier to an \
                     identifier, or to {ANY_SYSTEM_IDENTIFIER} to accept any database",
                    restore.spec.cluster.name
                ),
            )),
        },
    }
}

/// The identifier to pass to the agent (`--expect-system-identifier`), from what the restore
/// recorded in `status.targetSystemIdentifier`: none for `Any`.
pub fn agent_expectation(restore: &PostgreSQLRestore) -> Option<&str> {
    restore
        .status
        .as_ref()
        .and_then(|status| status.target_system_identifier.as_deref())
        .filter(|target| *target != ANY_SYSTEM_IDENTIFIER)
}

/// What the status says while the Job is being created, for `target`.
pub fn starting_message(target: &str) -> String {
    if target == ANY_SYSTEM_IDENTIFIER {
        "starting the restore Job; any target database is accepted \
         (spec.expectedSystemIdentifier is Any)"
            .to_owned()
    } else {
        format!(
            "starting the restore Job; it restores only into the database of system \
             identifier {target}"
        )
    }
}

/// A PostgreSQL system identifier as `pg_control_system()` gives it: up to 20 digits.
fn is_identifier(text: &str) -> bool {
    (1..=20).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use pgkube_crds::{
        LocalReference, PostgreSQLClusterSpec, PostgreSQLClusterStatus, PostgreSQLRestoreSpec,
        PostgreSQLRestoreStatus,
    };

    use super::*;

    fn restore(expected: Option<&str>) -> PostgreSQLRestore {
        PostgreSQLRestore::new(
            "r1",
            PostgreSQLRestoreSpec {
                backup: Some(LocalReference {
                    name: "nightly".to_owned(),
                }),
                source: None,
                cluster: LocalReference {
                    name: "main".to_owned(),
                },
                databases: Vec::new(),
                drop_existing: true,
                expected_system_identifier: expected.map(str::to_owned),
                method: pgkube_crds::RestoreMethod::Logical,
                target: None,
            },
        )
    }

    fn cluster(recorded: Option<&str>) -> PostgreSQLCluster {
        let spec: PostgreSQLClusterSpec =
            serde_json::from_value(serde_json::json!({"storage": {"size": "1Gi"}})).expect("spec");
        let mut cluster = PostgreSQLCluster::new("main", spec);
        cluster.status = Some(PostgreSQLClusterStatus {
            system_identifier: recorded.map(str::to_owned),
            ..PostgreSQLClusterStatus::default()
        });
        cluster
    }

    fn known(value: &str) -> Expectation {
        Expectation::Known(value.to_owned())
    }

    #[test]
    fn unset_means_the_database_the_cluster_recorded() {
        assert_eq!(
            expectation(&restore(None), &cluster(Some("7312345678901234567"))),
            known("7312345678901234567")
        );
    }

    #[test]
    fn unset_waits_while_the_cluster_has_recorded_none() {
        let Expectation::Unknown(reason) = expectation(&restore(None), &cluster(None)) else {
            panic!("waits");
        };
        assert_eq!(reason.reason, "SystemIdentifierUnknown");
        assert!(
            reason.message.contains("PostgreSQLCluster main")
                && reason.message.contains("expectedSystemIdentifier"),
            "{}",
            reason.message
        );
        let mut without_status = cluster(None);
        without_status.status = None;
        assert!(matches!(
            expectation(&restore(None), &without_status),
            Expectation::Unknown(_)
        ));
    }

    #[test]
    fn digits_in_the_spec_win_over_what_the_cluster_recorded() {
        assert_eq!(
            expectation(&restore(Some("42")), &cluster(Some("7312345678901234567"))),
            known("42")
        );
        // Known even before the cluster recorded anything.
        assert_eq!(
            expectation(&restore(Some("42")), &cluster(None)),
            known("42")
        );
    }

    #[test]
    fn any_accepts_every_database_and_passes_no_identifier_to_the_agent() {
        let expected = expectation(&restore(Some("Any")), &cluster(None));
        assert_eq!(expected, known("Any"));
        let mut recorded = restore(Some("Any"));
        recorded.status = Some(PostgreSQLRestoreStatus {
            target_system_identifier: Some("Any".to_owned()),
            ..PostgreSQLRestoreStatus::default()
        });
        assert_eq!(agent_expectation(&recorded), None);
        assert!(starting_message("Any").contains("any target database"));
    }

    #[test]
    fn the_agent_gets_the_identifier_the_status_recorded() {
        let mut recorded = restore(None);
        assert_eq!(agent_expectation(&recorded), None, "nothing recorded yet");
        recorded.status = Some(PostgreSQLRestoreStatus {
            target_system_identifier: Some("7312345678901234567".to_owned()),
            ..PostgreSQLRestoreStatus::default()
        });
        assert_eq!(agent_expectation(&recorded), Some("7312345678901234567"));
        assert!(starting_message("7312345678901234567").contains("7312345678901234567"));
    }

    #[test]
    fn a_value_past_the_schema_that_is_not_an_identifier_is_refused() {
        for bad in ["any", "", "-1", "12a", "123456789012345678901"] {
            assert!(
                matches!(
                    expectation(&restore(Some(bad)), &cluster(Some("7"))),
                    Expectation::Invalid(_)
                ),
                "{bad:?}"
            );
        }
    }
}
