//! A PointInTime restore while it runs: the cluster controller carries the recovery out and
//! records each step in the cluster's `status.inPlaceRecovery`; the restore follows that record
//! (the step as its reason, then Completed or Failed with the cluster's message).

use std::time::Duration;

use kube::Api;
use kube::runtime::controller::Action;
use pgkube_crds::{InPlaceStep, PostgreSQLCluster, PostgreSQLRestore};

use super::status::{self, Change};
use super::{Error, RestoreContext, kube_error};
use crate::backup::decide::Reason;

/// How soon an in-place recovery's progress is read again from its cluster.
pub(super) const REQUEUE: Duration = Duration::from_secs(5);

/// Follows an in-place recovery through its cluster's `status.inPlaceRecovery`, read now: the
/// cluster controller carries it out and records each step there.
pub(super) async fn follow(
    context: &RestoreContext,
    restore: &PostgreSQLRestore,
    namespace: &str,
) -> Result<Action, Error> {
    let name = &restore.spec.cluster.name;
    let cluster = Api::<PostgreSQLCluster>::namespaced(context.base.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(kube_error("read", "PostgreSQLCluster", name))?;
    let Some(cluster) = cluster else {
        let reason = Reason::new(
            "ClusterNotFound",
            format!("PostgreSQLCluster {name} was deleted during the recovery"),
        );
        status::write(context, restore, Change::Failed(reason)).await?;
        return Ok(Action::await_change());
    };
    let change = in_place_change(restore, &cluster);
    let ended = matches!(change, Change::RecoveredInPlace(_) | Change::Failed(_));
    status::write(context, restore, change).await?;
    Ok(match ended {
        true => Action::await_change(),
        false => Action::requeue(REQUEUE),
    })
}

/// What the cluster's record of the recovery says of the restore (pure).
fn in_place_change(restore: &PostgreSQLRestore, cluster: &PostgreSQLCluster) -> Change {
    let uid = restore.metadata.uid.as_deref();
    let recorded = cluster
        .status
        .as_ref()
        .and_then(|s| s.in_place_recovery.as_ref())
        .filter(|recorded| Some(recorded.uid.as_str()) == uid);
    let Some(recorded) = recorded else {
        return Change::Progress(
            Reason::new("Recovering", "the cluster has not started the recovery yet"),
            None,
        );
    };
    let message = recorded.message.clone().unwrap_or_default();
    match recorded.step {
        InPlaceStep::Recovering => Change::Progress(Reason::new("Recovering", message), None),
        InPlaceStep::Recloning => Change::Progress(Reason::new("Recloning", message), None),
        InPlaceStep::Completed => Change::RecoveredInPlace(match &recorded.previous_data {
            Some(previous) => format!(
                "{message}; the data from before is kept in {previous} on the primary's volume"
            ),
            None => message,
        }),
        InPlaceStep::Failed => Change::Failed(Reason::new("RecoveryFailed", message)),
    }
}

#[cfg(test)]
mod tests {
    use pgkube_crds::{InPlaceRecovery, PostgreSQLClusterStatus};

    use super::*;

    fn restore() -> PostgreSQLRestore {
        let mut restore = PostgreSQLRestore::new(
            "to-t",
            serde_json::from_value(serde_json::json!({
                "cluster": {"name": "main"}, "method": "PointInTime"
            }))
            .expect("spec"),
        );
        restore.metadata.uid = Some("uid-1".to_owned());
        restore
    }

    fn cluster(recorded: Option<(&str, InPlaceStep)>) -> PostgreSQLCluster {
        let spec =
            serde_json::from_value(serde_json::json!({"storage": {"size": "1Gi"}})).expect("spec");
        let mut cluster = PostgreSQLCluster::new("main", spec);
        cluster.status = Some(PostgreSQLClusterStatus {
            in_place_recovery: recorded.map(|(uid, step)| InPlaceRecovery {
                restore: "to-t".to_owned(),
                uid: uid.to_owned(),
                step,
                message: Some("what the cluster says".to_owned()),
                previous_data: Some("/data/pgdata.before-uid-1".to_owned()),
            }),
            ..PostgreSQLClusterStatus::default()
        });
        cluster
    }

    fn reason_of(change: &Change) -> Option<&'static str> {
        match change {
            Change::Progress(reason, _) | Change::Failed(reason) => Some(reason.reason),
            _ => None,
        }
    }

    #[test]
    fn the_restore_shows_the_clusters_step_for_it_and_ends_with_it() {
        let restore = restore();
        let not_yet = in_place_change(&restore, &cluster(None));
        assert_eq!(reason_of(&not_yet), Some("Recovering"));
        let other = in_place_change(&restore, &cluster(Some(("uid-0", InPlaceStep::Completed))));
        assert_eq!(
            reason_of(&other),
            Some("Recovering"),
            "another restore's record"
        );
        let recloning =
            in_place_change(&restore, &cluster(Some(("uid-1", InPlaceStep::Recloning))));
        assert_eq!(reason_of(&recloning), Some("Recloning"));
        let failed = in_place_change(&restore, &cluster(Some(("uid-1", InPlaceStep::Failed))));
        assert_eq!(reason_of(&failed), Some("RecoveryFailed"));
        let Change::RecoveredInPlace(message) =
            in_place_change(&restore, &cluster(Some(("uid-1", InPlaceStep::Completed))))
        else {
            panic!("completed");
        };
        assert!(message.contains("what the cluster says"), "{message}");
        assert!(message.contains("/data/pgdata.before-uid-1"), "{message}");
    }
}
