//! The cluster's bootstrap restore: made only over a database this cluster made (see
//! [`identity::bootstrap_gate`](super::identity::bootstrap_gate)).

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
    let gate = bootstrap_gate(cluster, instances, primary);
    let bootstrap = restores::bootstrap(cluster, restores, cluster.status.as_ref(), &gate);
    if matches!(bootstrap, Some(restores::Bootstrap::InProgress(_)))
        && gate == identity::BootstrapGate::Proceed
        && outcome.issue.as_ref().is_none_or(|i| !i.invalid_spec)
    {
        let namespace = cluster.namespace().ok_or(Error::MissingNamespace)?;
        ensure_bootstrap_restore(context, cluster, restores, &namespace)
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
    let report = instances
        .iter()
        .find(|instance| instance.pod == primary)
        .and_then(instances::ObservedInstance::reported);
    identity::bootstrap_gate(cluster.metadata.uid.as_deref(), report)
}

/// Creates the cluster's bootstrap restore unless the cache has it. One that exists already
/// (the cache lags behind a create) is left as it is.
async fn ensure_bootstrap_restore(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    restores: &[&PostgreSQLRestore],
    namespace: &str,
) -> Result<(), Error> {
    let Some(desired) = restores::bootstrap_restore(cluster) else {
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
