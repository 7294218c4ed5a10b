//! Retention for a cluster, as the controllers run it: after each completed backup and every
//! hour ([`crate::Settings::retention_interval`]), a [`retention::prune`](crate::retention::prune)
//! pass over the cluster's root `<prefix>/<cluster-uid>/` with its `retention.days`, holding the
//! backups that unfinished restores read (the restores are listed from the API server at the
//! start of each pass, see [`super::holds`]); then the PostgreSQLBackup objects of the backups it
//! deleted (the same name and uid) are removed, and an Event and the metrics tell what the pass
//! did.

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::Utc;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Resource, ResourceExt};
use pgkube_crds::{BackupPhase, PostgreSQLBackup, PostgreSQLCluster};
use tracing::{Instrument, info_span};

use super::{BackupContext, Error, access, holds, kube_error};
use crate::metrics::ClusterLabels;
use crate::retention::{self, BackupId, PruneReport, RetentionPolicy};
use crate::storage::wal::archive_root;

/// One pass for `cluster`, with an Event saying what it did or why it failed. A cluster
/// without `spec.backup.storage` has nothing to prune.
pub async fn run(context: &BackupContext, cluster: &PostgreSQLCluster) -> Option<PruneReport> {
    let span = info_span!("retention", cluster = %cluster.name_any());
    let outcome = pass(context, cluster).instrument(span).await;
    let (warning, reason, note) = match &outcome {
        Ok(None) => return None,
        Ok(Some(report)) => (false, "RetentionPass", describe(report)),
        Err(error) => (
            true,
            "RetentionFailed",
            format!("retention pass failed, nothing more was deleted: {error}"),
        ),
    };
    let reference = cluster.object_ref(&());
    crate::publish_event(
        &context.recorder,
        &reference,
        warning,
        reason,
        note,
        "Prune",
    )
    .await;
    if let Err(error) = &outcome {
        tracing::warn!(%error, "retention pass failed");
    }
    outcome.ok().flatten()
}

async fn pass(
    context: &BackupContext,
    cluster: &PostgreSQLCluster,
) -> Result<Option<PruneReport>, Error> {
    let Some(config) = cluster.spec.backup.as_ref() else {
        return Ok(None);
    };
    let Some(storage) = config.storage.as_ref().map(|s| &s.s3) else {
        return Ok(None);
    };
    let namespace = cluster.namespace().ok_or(Error::MissingNamespace)?;
    let name = cluster.name_any();
    let backups = backups_of(context, &namespace, &name);
    let holds = super::current_holds(context).await?;
    let prefix = super::decide::cluster_prefix(storage, &namespace, &name);
    let policy = RetentionPolicy {
        prefix: prefix.clone(),
        cluster_uid: cluster.metadata.uid.clone().unwrap_or_default(),
        retention_days: u32::try_from(config.retention.days).unwrap_or(1),
        failed_backups: backups
            .iter()
            .filter(|b| b.status.as_ref().and_then(|s| s.phase) == Some(BackupPhase::Failed))
            .filter_map(|b| b.metadata.uid.clone())
            .collect(),
        held: holds::held_manifests(&holds, &storage.bucket),
        wal_root: Some(archive_root(&prefix, &name)),
    };
    let bucket = access::connect(&context.base.client, &namespace, storage).await?;
    let report = retention::prune(&bucket, &policy, Utc::now())
        .await
        .map_err(Error::Storage)?;
    context.base.metrics.observe_pruned(
        &ClusterLabels {
            namespace: namespace.clone(),
            cluster: name.clone(),
        },
        report.deleted_objects,
    );
    remove_objects(context, &namespace, &backups, &report.deleted_backups).await?;
    Ok(Some(report))
}

/// The cluster's backups as the caches have them.
fn backups_of(
    context: &BackupContext,
    namespace: &str,
    cluster: &str,
) -> Vec<Arc<PostgreSQLBackup>> {
    context
        .backups
        .state()
        .into_iter()
        .filter(|b| b.namespace().as_deref() == Some(namespace) && b.spec.cluster.name == cluster)
        .collect()
}

/// Deletes the PostgreSQLBackup objects of the backups whose data the pass deleted: the same
/// name and uid, so that a backup that took the name again stays. Each delete is preconditioned
/// on that uid.
async fn remove_objects(
    context: &BackupContext,
    namespace: &str,
    backups: &[Arc<PostgreSQLBackup>],
    deleted: &[BackupId],
) -> Result<(), Error> {
    let deleted: BTreeSet<&BackupId> = deleted.iter().collect();
    let api = Api::<PostgreSQLBackup>::namespaced(context.base.client.clone(), namespace);
    for backup in backups.iter() {
        let name = backup.name_any();
        let Some(uid) = backup.metadata.uid.clone() else {
            continue;
        };
        if !deleted.contains(&BackupId::new(name.clone(), uid.clone())) {
            continue;
        }
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => tracing::info!(backup = %name, "expired backup removed"),
            // Gone, or another object of the same name now (uid precondition failed).
            Err(kube::Error::Api(response)) if matches!(response.code, 404 | 409) => {}
            Err(source) => return Err(kube_error("delete", "PostgreSQLBackup", &name)(source)),
        }
    }
    Ok(())
}

/// The Event's note: what the pass deleted and kept.
fn describe(report: &PruneReport) -> String {
    let kept = report
        .newest_good
        .as_ref()
        .map_or_else(String::new, |id| format!("; newest good backup {id} kept"));
    let kept_physical = match (&report.newest_good_physical, &report.newest_good) {
        (Some(physical), newest) if newest.as_ref() != Some(physical) => {
            format!("; newest good physical backup {physical} kept")
        }
        _ => String::new(),
    };
    let held = if report.held.is_empty() {
        String::new()
    } else {
        format!("; kept for unfinished restores: {}", report.held.join(", "))
    };
    let skipped = if report.skipped.is_empty() {
        String::new()
    } else {
        format!("; left alone: {}", report.skipped.join(", "))
    };
    format!(
        "deleted {} expired backup(s) ({} objects), aborted {} stale upload(s), kept {}{kept}{kept_physical}{held}{skipped}; {}",
        report.deleted_backups.len(),
        report.deleted_objects,
        report.aborted_uploads,
        report.kept_backups,
        describe_wal(report),
    )
}

/// What the pass did to the WAL archive.
fn describe_wal(report: &PruneReport) -> String {
    match (&report.wal_kept_from, &report.wal_left_alone) {
        (Some(first), _) => format!(
            "deleted {} WAL file(s), WAL kept from {first}",
            report.deleted_wal
        ),
        (None, Some(reason)) => format!("WAL archive left alone: {reason}"),
        (None, None) => "WAL archive left alone".to_owned(),
    }
}

/// Every [`crate::Settings::retention_interval`] (an hour by default), a pass for each cluster
/// with backup storage in the watched namespaces. Runs only where the controllers run: on the
/// leader.
pub async fn hourly(context: Arc<BackupContext>, shutdown: crate::ShutdownSignal) {
    let stop = shutdown.wait();
    tokio::pin!(stop);
    let interval = context.base.settings.retention_interval;
    loop {
        tokio::select! {
            () = &mut stop => return,
            () = tokio::time::sleep(interval) => {}
        }
        for cluster in clusters_with_storage(&context).await {
            run(&context, &cluster).await;
        }
    }
}

async fn clusters_with_storage(context: &BackupContext) -> Vec<PostgreSQLCluster> {
    let mut clusters = Vec::new();
    for namespace in crate::watched_namespaces(&context.base.settings) {
        let api = crate::api::<PostgreSQLCluster>(&context.base.client, namespace.as_deref());
        match api.list(&ListParams::default()).await {
            Ok(list) => clusters.extend(list.items.into_iter().filter(|c| {
                c.spec.backup.as_ref().is_some_and(|b| b.storage.is_some())
                    && c.metadata.deletion_timestamp.is_none()
            })),
            Err(error) => {
                tracing::warn!(%error, "cannot list clusters for the hourly retention pass")
            }
        }
    }
    clusters
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_says_what_was_deleted_and_kept() {
        let report = PruneReport {
            newest_good: Some(BackupId::new("b9", "u9")),
            newest_good_physical: Some(BackupId::new("p8", "u8")),
            deleted_backups: vec![BackupId::new("b1", "u1"), BackupId::new("b2", "u2")],
            deleted_objects: 6,
            aborted_uploads: 1,
            kept_backups: 3,
            deleted_wal: 12,
            wal_kept_from: Some("000000010000000000000010".to_owned()),
            wal_left_alone: None,
            held: vec!["b3/u3: read by restore db/undo".to_owned()],
            skipped: vec!["b5/u5: no manifest.json (incomplete backup)".to_owned()],
            requests: 9,
        };
        assert_eq!(
            describe(&report),
            "deleted 2 expired backup(s) (6 objects), aborted 1 stale upload(s), kept 3; newest good backup b9/u9 kept; newest good physical backup p8/u8 kept; kept for unfinished restores: b3/u3: read by restore db/undo; left alone: b5/u5: no manifest.json (incomplete backup); deleted 12 WAL file(s), WAL kept from 000000010000000000000010"
        );
        let logical_only = PruneReport {
            newest_good: Some(BackupId::new("b9", "u9")),
            wal_left_alone: Some("no physical backup is kept".to_owned()),
            ..PruneReport::default()
        };
        assert_eq!(
            describe(&logical_only),
            "deleted 0 expired backup(s) (0 objects), aborted 0 stale upload(s), kept 0; newest good backup b9/u9 kept; WAL archive left alone: no physical backup is kept"
        );
    }
}
