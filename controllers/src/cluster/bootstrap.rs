//! The cluster's bootstrap restore: made only over a database this cluster made (see
//! [`identity::bootstrap_gate`](super::identity::bootstrap_gate)), and restoring only into
//! that database: its `expectedSystemIdentifier` is the one the primary reported when the gate
//! let it run. So the restore never waits for the cluster's status to record the identifier
//! (written after the restore is made, in the same reconcile).

use kube::{Api, ResourceExt};
use pgkube_crds::{PostgreSQLCluster, PostgreSQLRestore};

use tracing::{Instrument, info_span};

use super::context::ClusterContext;
use super::pipeline::Outcome;
use super::{Error, identity, instances, restores};

/// Where the cluster's bootstrap stands; creates its restore once it may run.
pub(super) async fn step(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    instances: &[instances::ObservedInstance],
    primary: &str,
    restores: &[&PostgreSQLRestore],
    outcome: &Outcome,
) -> Result<Option<restores::Bootstrap>, Error> {
    let report = primary_report(instances, primary);
    let gate = identity::bootstrap_gate(cluster.metadata.uid.as_deref(), report);
    let bootstrap = restores::bootstrap(cluster, restores, cluster.status.as_ref(), &gate);
    if matches!(bootstrap, Some(restores::Bootstrap::InProgress(_)))
        && gate == identity::BootstrapGate::Proceed
        && outcome.issue.as_ref().is_none_or(|i| !i.invalid_spec)
    {
        let namespace = cluster.namespace().ok_or(Error::MissingNamespace)?;
        // The database the gate let the restore run over.
        let system_identifier = report.and_then(|r| r.system_identifier.as_deref());
        ensure_bootstrap_restore(context, cluster, system_identifier, restores, &namespace)
            .instrument(info_span!("bootstrap"))
            .await?;
    }
    Ok(bootstrap)
}

/// What the designated primary's data says about the cluster's bootstrap restore.
pub(super) fn bootstrap_gate(
    cluster: &PostgreSQLCluster,
    instances: &[instances::ObservedInstance],
    primary: &str,
) -> identity::BootstrapGate {
    identity::bootstrap_gate(
        cluster.metadata.uid.as_deref(),
        primary_report(instances, primary),
    )
}

/// What the designated primary reports, if it answers.
fn primary_report<'a>(
    instances: &'a [instances::ObservedInstance],
    primary: &str,
) -> Option<&'a instances::InstanceReport> {
    instances
        .iter()
        .find(|instance| instance.pod == primary)
        .and_then(instances::ObservedInstance::reported)
}

/// Creates the cluster's bootstrap restore, into the database of `system_identifier`, unless
/// the cache has it. One that exists already (the cache lags behind a create) is left as it is.
async fn ensure_bootstrap_restore(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    system_identifier: Option<&str>,
    restores: &[&PostgreSQLRestore],
    namespace: &str,
) -> Result<(), Error> {
    let Some(desired) = restores::bootstrap_restore(cluster, system_identifier) else {
        return Ok(());
    };
    let name = desired.name_any();
    if restores.iter().any(|r| r.name_any() == name) {
        return Ok(());
    }
    let created = Api::<PostgreSQLRestore>::namespaced(context.base.client.clone(), namespace)
        .create(&kube::api::PostParams::default(), &desired)
        .await;
    match created {
        Ok(_) => {
            tracing::info!(restore = %name, "bootstrap restore created");
            Ok(())
        }
        Err(kube::Error::Api(response)) if response.code == 409 => Ok(()),
        Err(source) => Err(Error::Kube {
            action: "create",
            kind: "PostgreSQLRestore".to_owned(),
            name,
            source,
        }),
    }
}
