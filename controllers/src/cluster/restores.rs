//! What the cluster's status says about restores into it, and the restore that bootstraps a
//! new cluster from a backup (pure).
//!
//! The restore controller writes each restore's own status; the cluster controller only reads
//! them (from its watch cache) for two conditions:
//! - `Restoring`: True while a restore into the cluster runs, False with how the last one
//!   ended; absent until a restore has targeted the cluster.
//! - `Bootstrapped` (only with `spec.bootstrap`): the cluster's bootstrap restore, a
//!   PostgreSQLRestore named `<cluster>-bootstrap` that the cluster controller creates and
//!   owns. Until it completed the cluster is not Ready; if it failed the cluster is Failed and
//!   says why (deleting the failed restore makes the controller try again). Once True it stays
//!   True: the restore is never run again, even if its object is deleted later. The restore is
//!   made only once the primary reports a database this cluster made (see
//!   [`identity::bootstrap_gate`](super::identity::bootstrap_gate)): over volumes that already
//!   held the cluster's data (the cluster was deleted and applied again) it is skipped, and the
//!   condition is True with the reason `ExistingData`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::{Resource, ResourceExt};
use pgkube_crds::{
    CLUSTER_LABEL, LocalReference, PostgreSQLCluster, PostgreSQLClusterStatus, PostgreSQLRestore,
    PostgreSQLRestoreSpec, RestoreMethod, RestorePhase,
};

use super::identity::BootstrapGate;
use crate::names::{self, NameKind};

/// Condition type: whether a restore into the cluster is running.
pub const RESTORING: &str = "Restoring";
/// Condition type: whether the cluster's bootstrap restore has completed.
pub const BOOTSTRAPPED: &str = "Bootstrapped";
/// Label on a cluster's bootstrap restore.
pub const BOOTSTRAP_LABEL: &str = "db.example.com/bootstrap";

/// How far the bootstrap of a cluster with `spec.bootstrap` has come.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bootstrap {
    /// The backup is in: the cluster may be Ready.
    Restored(String),
    /// Not yet: the cluster is not Ready.
    InProgress(String),
    /// The restore failed: the cluster is Failed.
    Failed(String),
    /// Not run, for good: the volumes already held a database this cluster did not make (see
    /// [`BootstrapGate`]).
    Skipped(String),
}

/// The `Bootstrapped` condition's reason for a skipped bootstrap.
const EXISTING_DATA: &str = "ExistingData";

impl Bootstrap {
    /// The `Bootstrapped` condition (its transition time is set by the caller).
    pub fn condition(&self) -> Condition {
        let (status, reason, message) = match self {
            Self::Restored(message) => ("True", "Restored", message),
            Self::InProgress(message) => ("False", "Restoring", message),
            Self::Failed(message) => ("False", "RestoreFailed", message),
            Self::Skipped(message) => ("True", EXISTING_DATA, message),
        };
        Condition {
            type_: BOOTSTRAPPED.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: message.clone(),
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }
    }
}

/// The name of a cluster's bootstrap restore: `<cluster>-bootstrap`.
pub fn bootstrap_restore_name(cluster: &str) -> String {
    names::child_name(
        cluster,
        "-bootstrap",
        NameKind::DnsSubdomain,
        names::DNS_SUBDOMAIN_MAX,
    )
}

/// The bootstrap restore of `cluster`, owned by it, when its spec asks for one. It replaces
/// the databases the backup holds: in a new cluster those are only the empty ones `initdb`
/// made. It restores only into `system_identifier`, the database the primary reported when the
/// bootstrap was allowed to run (see [`BootstrapGate`]): the restore needs nothing the cluster's
/// status may not have recorded yet. Without one, it expects the identifier the cluster records.
pub fn bootstrap_restore(
    cluster: &PostgreSQLCluster,
    system_identifier: Option<&str>,
) -> Option<PostgreSQLRestore> {
    let bootstrap = from_backup(cluster)?;
    // A point-in-time recovery is the first instance's own work, not a restore.
    if bootstrap.recovery.is_some() {
        return None;
    }
    let name = cluster.name_any();
    let spec = PostgreSQLRestoreSpec {
        backup: bootstrap.backup.clone(),
        source: bootstrap.source.clone(),
        cluster: LocalReference { name: name.clone() },
        databases: Vec::new(),
        drop_existing: true,
        expected_system_identifier: system_identifier.map(str::to_owned),
        method: RestoreMethod::Logical,
        target: None,
    };
    let mut restore = PostgreSQLRestore::new(&bootstrap_restore_name(&name), spec);
    restore.metadata = ObjectMeta {
        name: restore.metadata.name.take(),
        namespace: cluster.namespace(),
        labels: Some(BTreeMap::from([
            (CLUSTER_LABEL.to_owned(), names::label_value(&name)),
            (BOOTSTRAP_LABEL.to_owned(), "true".to_owned()),
        ])),
        owner_references: cluster.controller_owner_ref(&()).map(|owner| vec![owner]),
        ..ObjectMeta::default()
    };
    Some(restore)
}

/// `spec.bootstrap` when it starts the cluster from a backup (restored or recovered), not
/// with initdb.
fn from_backup(cluster: &PostgreSQLCluster) -> Option<&pgkube_crds::Bootstrap> {
    cluster
        .spec
        .bootstrap
        .as_ref()
        .filter(|bootstrap| bootstrap.initdb.is_none())
}

/// Where the bootstrap of `cluster` stands, from its restores, its previous status and what
/// the primary's data says (`gate`); `None` when the cluster does not bootstrap from a backup.
pub fn bootstrap(
    cluster: &PostgreSQLCluster,
    restores: &[&PostgreSQLRestore],
    previous: Option<&PostgreSQLClusterStatus>,
    gate: &BootstrapGate,
) -> Option<Bootstrap> {
    let spec = from_backup(cluster)?;
    let done = previous
        .into_iter()
        .flat_map(|status| &status.conditions)
        .find(|c| c.type_ == BOOTSTRAPPED && c.status == "True");
    if let Some(done) = done {
        return Some(if done.reason == EXISTING_DATA {
            Bootstrap::Skipped(done.message.clone())
        } else {
            Bootstrap::Restored(done.message.clone())
        });
    }
    if let Some(recovery) = &spec.recovery {
        return Some(recovery_progress(recovery, previous, gate));
    }
    let name = bootstrap_restore_name(&cluster.name_any());
    let Some(restore) = restores.iter().find(|r| r.name_any() == name) else {
        return Some(match gate {
            BootstrapGate::Proceed => {
                Bootstrap::InProgress(format!("creating the bootstrap restore {name}"))
            }
            BootstrapGate::Wait(why) => Bootstrap::InProgress(why.clone()),
            BootstrapGate::Skip(why) => Bootstrap::Skipped(why.clone()),
        });
    };
    let status = restore.status.clone().unwrap_or_default();
    let message = status.message.clone().unwrap_or_default();
    Some(match status.phase {
        Some(RestorePhase::Completed) => Bootstrap::Restored(format!(
            "restored from {} by restore {name}",
            source_of(restore)
        )),
        Some(RestorePhase::Failed) => Bootstrap::Failed(format!(
            "restore {name} of {} failed: {message}; delete it to try again",
            source_of(restore)
        )),
        phase => Bootstrap::InProgress(format!(
            "restore {name} of {} is {}{}",
            source_of(restore),
            phase.map_or("Pending".to_owned(), |p| format!("{p:?}")),
            if message.is_empty() {
                String::new()
            } else {
                format!(": {message}")
            }
        )),
    })
}

/// A point-in-time recovery is done once the cluster recorded the database its primary
/// promoted with. Volumes that already held a database this cluster did not make (an earlier
/// cluster of the same name, `gate`) were not recovered over: the first instance recovers only
/// into an empty volume, so the recovery is skipped, and the condition says so.
fn recovery_progress(
    recovery: &pgkube_crds::Recovery,
    previous: Option<&PostgreSQLClusterStatus>,
    gate: &BootstrapGate,
) -> Bootstrap {
    let target = crate::storage::recovery::describe(&recovery.target.clone().unwrap_or_default());
    let from = match (&recovery.backup, &recovery.source) {
        (Some(backup), _) => format!("backup {}", backup.name),
        (None, Some(source)) => format!("the archive {}", source.archive),
        (None, None) => "an unnamed source".to_owned(),
    };
    match previous.and_then(|status| status.system_identifier.as_deref()) {
        Some(system) if matches!(gate, BootstrapGate::Skip(_)) => Bootstrap::Skipped(format!(
            "the volumes already held database {system}, which this cluster did not make: the recovery from {from} was not run, so that nothing written since is lost"
        )),
        Some(_) if matches!(gate, BootstrapGate::Wait(_)) => Bootstrap::InProgress(format!(
            "recovering from {from} to {target}: waiting for the primary to report which database its volume holds"
        )),
        Some(system) => Bootstrap::Restored(format!(
            "recovered from {from} to {target}; the primary promoted with database {system}"
        )),
        None => Bootstrap::InProgress(format!(
            "recovering from {from} to {target}: the first instance restores the base backup and replays the archive"
        )),
    }
}

/// `backup <name>` or `<bucket>/<key>`, with the manifest key once the restore recorded it.
fn source_of(restore: &PostgreSQLRestore) -> String {
    let key = restore
        .status
        .as_ref()
        .and_then(|s| s.restored_object_key.clone());
    match (&restore.spec.backup, &restore.spec.source) {
        (Some(backup), _) => match key {
            Some(key) => format!("backup {} ({key})", backup.name),
            None => format!("backup {}", backup.name),
        },
        (None, Some(source)) => format!("{}/{}", source.storage.s3.bucket, source.object_key),
        (None, None) => "an unnamed backup".to_owned(),
    }
}

/// The `Restoring` condition from the cluster's restores: True while one runs, else how the
/// last one to end ended; `None` when none has started.
pub fn restoring_condition(restores: &[&PostgreSQLRestore]) -> Option<Condition> {
    let phase = |r: &PostgreSQLRestore| r.status.as_ref().and_then(|s| s.phase);
    let message = |r: &PostgreSQLRestore| {
        r.status
            .as_ref()
            .and_then(|s| s.message.clone())
            .unwrap_or_default()
    };
    let (status, reason, text) = if let Some(running) = restores
        .iter()
        .filter(|r| phase(r) == Some(RestorePhase::Running))
        .min_by_key(|r| r.name_any())
    {
        (
            "True",
            "RestoreRunning",
            format!(
                "restore {} is running: {}",
                running.name_any(),
                message(running)
            ),
        )
    } else {
        let ended = |r: &&&PostgreSQLRestore| {
            matches!(
                phase(r),
                Some(RestorePhase::Completed | RestorePhase::Failed)
            )
        };
        let last = restores.iter().filter(ended).max_by_key(|r| {
            let finished = r.status.as_ref().and_then(|s| s.completion_time.clone());
            (finished.map(|t| t.0), r.name_any())
        })?;
        let (reason, verb) = if phase(last) == Some(RestorePhase::Completed) {
            ("RestoreCompleted", "completed")
        } else {
            ("RestoreFailed", "failed")
        };
        (
            "False",
            reason,
            format!("restore {} {verb}: {}", last.name_any(), message(last)),
        )
    };
    Some(Condition {
        type_: RESTORING.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: text,
        observed_generation: None,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;
    use pgkube_crds::{PostgreSQLClusterSpec, PostgreSQLRestoreStatus};

    use super::*;

    fn cluster(bootstrap: bool) -> PostgreSQLCluster {
        let spec: PostgreSQLClusterSpec = serde_json::from_value(serde_json::json!({
            "storage": {"size": "1Gi"},
            "bootstrap": if bootstrap { serde_json::json!({"backup": {"name": "nightly"}}) } else { serde_json::Value::Null },
        }))
        .expect("spec");
        let mut cluster = PostgreSQLCluster::new("main", spec);
        cluster.metadata.namespace = Some("db".to_owned());
        cluster.metadata.uid = Some("uid-1".to_owned());
        cluster
    }

    fn restore(name: &str, phase: Option<RestorePhase>, finished: i64) -> PostgreSQLRestore {
        let mut restore = PostgreSQLRestore::new(
            name,
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
                expected_system_identifier: None,
                method: RestoreMethod::Logical,
                target: None,
            },
        );
        restore.status = Some(PostgreSQLRestoreStatus {
            phase,
            message: Some(format!("{name} says")),
            completion_time: Some(Time(
                Timestamp::from_second(1_800_000_000 + finished).expect("time"),
            )),
            ..PostgreSQLRestoreStatus::default()
        });
        restore
    }

    #[test]
    fn the_bootstrap_restore_is_owned_by_the_cluster_and_replaces_the_empty_databases() {
        assert!(bootstrap_restore(&cluster(false), Some("7")).is_none());
        let mut initdb = cluster(false);
        initdb.spec.bootstrap = serde_json::from_value(
            serde_json::json!({"initdb": {"database": "shop", "owner": "shopper"}}),
        )
        .expect("bootstrap");
        assert!(bootstrap_restore(&initdb, Some("7")).is_none());
        assert!(bootstrap(&initdb, &[], None, &BootstrapGate::Proceed).is_none());
        let restore = bootstrap_restore(&cluster(true), Some("7")).expect("a restore");
        assert_eq!(restore.name_any(), "main-bootstrap");
        assert_eq!(restore.namespace().as_deref(), Some("db"));
        assert_eq!(restore.spec.cluster.name, "main");
        assert!(restore.spec.drop_existing);
        // Only into the database the primary reported, whatever the status has recorded yet.
        assert_eq!(
            restore.spec.expected_system_identifier.as_deref(),
            Some("7")
        );
        let unreported = bootstrap_restore(&cluster(true), None).expect("a restore");
        assert_eq!(unreported.spec.expected_system_identifier, None);
        let owner = &restore.owner_references()[0];
        assert_eq!(
            (owner.uid.as_str(), owner.controller),
            ("uid-1", Some(true))
        );
    }

    #[test]
    fn the_bootstrap_progresses_with_its_restore_and_stays_done() {
        let main = cluster(true);
        let go = BootstrapGate::Proceed;
        assert!(matches!(
            bootstrap(&main, &[], None, &go),
            Some(Bootstrap::InProgress(_))
        ));
        let running = restore("main-bootstrap", Some(RestorePhase::Running), 0);
        assert!(matches!(
            bootstrap(&main, &[&running], None, &go),
            Some(Bootstrap::InProgress(message)) if message.contains("is Running")
        ));
        let failed = restore("main-bootstrap", Some(RestorePhase::Failed), 0);
        let Some(Bootstrap::Failed(why)) = bootstrap(&main, &[&failed], None, &go) else {
            panic!("failed");
        };
        assert!(why.contains("main-bootstrap says"), "{why}");
        let completed = restore("main-bootstrap", Some(RestorePhase::Completed), 0);
        let done = bootstrap(&main, &[&completed], None, &go).expect("state");
        assert!(matches!(&done, Bootstrap::Restored(m) if m.contains("backup nightly")));
        // Recorded once, it holds even when the restore object is gone.
        let previous = PostgreSQLClusterStatus {
            conditions: vec![done.condition()],
            ..PostgreSQLClusterStatus::default()
        };
        assert_eq!(bootstrap(&main, &[], Some(&previous), &go), Some(done));
        assert_eq!(bootstrap(&cluster(false), &[], None, &go), None);
    }

    #[test]
    fn over_data_the_cluster_did_not_make_the_bootstrap_is_skipped_for_good() {
        let main = cluster(true);
        let wait = BootstrapGate::Wait("no report".to_owned());
        assert_eq!(
            bootstrap(&main, &[], None, &wait),
            Some(Bootstrap::InProgress("no report".to_owned()))
        );
        let skip = BootstrapGate::Skip("earlier data".to_owned());
        let skipped = bootstrap(&main, &[], None, &skip).expect("state");
        assert_eq!(skipped, Bootstrap::Skipped("earlier data".to_owned()));
        let condition = skipped.condition();
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("True", "ExistingData")
        );
        // Recorded once, it stays skipped whatever the primary reports later.
        let previous = PostgreSQLClusterStatus {
            conditions: vec![condition],
            ..PostgreSQLClusterStatus::default()
        };
        assert_eq!(
            bootstrap(&main, &[], Some(&previous), &BootstrapGate::Proceed),
            Some(skipped)
        );
    }

    #[test]
    fn a_recovery_over_volumes_that_held_an_earlier_clusters_database_is_skipped_for_good() {
        let spec: PostgreSQLClusterSpec = serde_json::from_value(serde_json::json!({
            "storage": {"size": "1Gi"},
            "bootstrap": {"recovery": {"backup": {"name": "base"}}},
        }))
        .expect("spec");
        let main = PostgreSQLCluster::new("main", spec);
        let recorded = PostgreSQLClusterStatus {
            system_identifier: Some("7312345678901234567".to_owned()),
            ..PostgreSQLClusterStatus::default()
        };
        let go = BootstrapGate::Proceed;
        assert!(matches!(
            bootstrap(&main, &[], None, &go),
            Some(Bootstrap::InProgress(_))
        ));
        let Some(Bootstrap::Restored(message)) = bootstrap(&main, &[], Some(&recorded), &go) else {
            panic!("recovered");
        };
        assert!(message.contains("recovered from backup base"), "{message}");
        let skip = BootstrapGate::Skip("earlier data".to_owned());
        let Some(Bootstrap::Skipped(message)) = bootstrap(&main, &[], Some(&recorded), &skip)
        else {
            panic!("skipped");
        };
        assert!(message.contains("was not run"), "{message}");
        let wait = BootstrapGate::Wait("no report".to_owned());
        assert!(matches!(
            bootstrap(&main, &[], Some(&recorded), &wait),
            Some(Bootstrap::InProgress(_))
        ));
        // Recorded once, it stays skipped whatever the primary reports later.
        let done = PostgreSQLClusterStatus {
            conditions: vec![Bootstrap::Skipped(message.clone()).condition()],
            ..recorded
        };
        assert_eq!(
            bootstrap(&main, &[], Some(&done), &go),
            Some(Bootstrap::Skipped(message))
        );
    }

    #[test]
    fn restoring_is_true_while_one_runs_then_tells_how_the_last_one_ended() {
        assert_eq!(restoring_condition(&[]), None);
        let pending = restore("r0", Some(RestorePhase::Pending), 0);
        assert_eq!(restoring_condition(&[&pending]), None);
        let done = restore("r1", Some(RestorePhase::Completed), 10);
        let failed = restore("r2", Some(RestorePhase::Failed), 20);
        let running = restore("r3", Some(RestorePhase::Running), 0);
        let now = restoring_condition(&[&done, &failed, &running]).expect("condition");
        assert_eq!(
            (now.status.as_str(), now.reason.as_str()),
            ("True", "RestoreRunning")
        );
        assert!(now.message.starts_with("restore r3 is running"));
        let after = restoring_condition(&[&done, &failed]).expect("condition");
        assert_eq!(
            (
                after.status.as_str(),
                after.reason.as_str(),
                after.message.as_str()
            ),
            ("False", "RestoreFailed", "restore r2 failed: r2 says")
        );
    }
}
