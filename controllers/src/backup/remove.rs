//! Deleting a backup whose deletion policy is `Delete`: its stored objects go first (the
//! manifest before the rest, so that a half-deleted backup never looks complete), then the
//! finalizer, then the object. `Retain` backups have no finalizer: their data stays.
//!
//! What is deleted is only what is proven to be this backup's ([`ownership`]):
//! - its own directory `<prefix>/<cluster-uid>/<name>/<uid>/`, named by its uid, whose manifest
//!   (if there is one yet) must record that uid;
//! - for a backup from before the uids were in the keys, `<prefix>/<name>/`, only if the
//!   manifest there is the very one it recorded when it completed (its SHA-256 is the status's
//!   checksum). Otherwise (a reused name, a backup that never completed) nothing is deleted:
//!   a Warning Event says why and the finalizer is released, leaving the objects as `Retain`
//!   would.
//!
//! While an unfinished restore reads the backup ([`super::holds`]), nothing is deleted and
//! the finalizer stays; an Event says which restore, and the deletion is tried again.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Client, Resource, ResourceExt};
use pgkube_crds::{BACKUP_DATA_FINALIZER, PostgreSQLBackup};
use serde_json::json;

use super::ownership::{self, Target};
use super::{BackupContext, Error, access, holds, kube_error};
use crate::storage::guarded::{Scope, delete_in};
use crate::storage::{S3Bucket, StorageError, s3_error};

/// How soon to look again while the backup's Job is going away.
const JOB_GONE_REQUEUE: Duration = Duration::from_secs(2);
/// How soon to look again while a restore reads the backup.
const HELD_REQUEUE: Duration = Duration::from_secs(15);
/// S3's DeleteObjects takes at most this many keys.
const DELETE_BATCH: usize = 1000;

/// Adds the finalizer to a `Delete` backup that lacks it.
pub async fn ensure_finalizer(
    backup: &PostgreSQLBackup,
    client: &Client,
    namespace: &str,
) -> Result<(), Error> {
    if has_finalizer(backup) {
        return Ok(());
    }
    let mut finalizers = backup.finalizers().to_vec();
    finalizers.push(BACKUP_DATA_FINALIZER.to_owned());
    set_finalizers(backup, client, namespace, finalizers).await
}

fn has_finalizer(backup: &PostgreSQLBackup) -> bool {
    backup
        .finalizers()
        .iter()
        .any(|f| f == BACKUP_DATA_FINALIZER)
}

/// A merge patch of the finalizers, guarded by the resourceVersion so that a concurrent
/// change of the list is never overwritten.
async fn set_finalizers(
    backup: &PostgreSQLBackup,
    client: &Client,
    namespace: &str,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let name = backup.name_any();
    let patch = json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": backup.resource_version(),
        }
    });
    Api::<PostgreSQLBackup>::namespaced(client.clone(), namespace)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(kube_error(
            "update the finalizers of",
            "PostgreSQLBackup",
            &name,
        ))
}

/// A backup being deleted: with the finalizer, delete its data, then release it.
pub async fn on_deletion(
    backup: &PostgreSQLBackup,
    context: &BackupContext,
    namespace: &str,
) -> Result<Action, Error> {
    if !has_finalizer(backup) {
        return Ok(Action::await_change());
    }
    // A running agent could write more objects after they were deleted: stop its Job first.
    if job_still_there(backup, context, namespace).await? {
        return Ok(Action::requeue(JOB_GONE_REQUEUE));
    }
    let holds = super::current_holds(context).await?;
    if let Some(hold) = holds::holder(&holds, backup) {
        let note = format!(
            "the backup's data is kept until restore {}, which reads it, has ended",
            hold.restore
        );
        tracing::info!(restore = %hold.restore, "deletion waits for a restore");
        publish(context, backup, false, "DeletionWaitsForRestore", note).await;
        return Ok(Action::requeue(HELD_REQUEUE));
    }
    match delete_data(backup, context, namespace).await {
        Ok(Deleted::Done) => {}
        Ok(Deleted::Left(why)) => {
            let note = format!("the backup's objects were left in storage: {why}");
            publish(context, backup, true, "DataLeft", note).await;
        }
        Err(error) => {
            let note = format!(
                "the backup's data could not be deleted, so the PostgreSQLBackup stays until it is: {error}"
            );
            publish(context, backup, true, "DeleteFailed", note).await;
            return Err(error);
        }
    }
    let finalizers = backup
        .finalizers()
        .iter()
        .filter(|f| *f != BACKUP_DATA_FINALIZER)
        .cloned()
        .collect();
    set_finalizers(backup, &context.base.client, namespace, finalizers).await?;
    Ok(Action::await_change())
}

async fn publish(
    context: &BackupContext,
    backup: &PostgreSQLBackup,
    warning: bool,
    reason: &str,
    note: String,
) {
    let reference = backup.object_ref(&());
    crate::publish_event(
        &context.recorder,
        &reference,
        warning,
        reason,
        note,
        "Delete",
    )
    .await;
}

/// Deletes the backup's Job (and, in the foreground, its pods) if it still exists; true until it
/// is gone.
async fn job_still_there(
    backup: &PostgreSQLBackup,
    context: &BackupContext,
    namespace: &str,
) -> Result<bool, Error> {
    let name = crate::agent_job::job_name(&backup.name_any());
    let jobs = Api::<Job>::namespaced(context.base.client.clone(), namespace);
    let Some(job) = jobs
        .get_opt(&name)
        .await
        .map_err(kube_error("read", "Job", &name))?
    else {
        return Ok(false);
    };
    if job.metadata.deletion_timestamp.is_none() {
        tracing::info!(job = %name, "stopping the backup Job before deleting the data");
        jobs.delete(&name, &DeleteParams::foreground())
            .await
            .map_err(kube_error("delete", "Job", &name))?;
    }
    Ok(true)
}

/// Deletes the Job `name` and its pods (in the background), if it is still there.
pub async fn stop_job(context: &BackupContext, namespace: &str, name: &str) -> Result<(), Error> {
    tracing::info!(job = %name, "stopping the backup Job");
    let deleted = Api::<Job>::namespaced(context.base.client.clone(), namespace)
        .delete(name, &DeleteParams::background())
        .await;
    match deleted {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(response)) if response.code == 404 => Ok(()),
        Err(source) => Err(kube_error("delete", "Job", name)(source)),
    }
}

/// What deleting the data did.
enum Deleted {
    /// Deleted, or there was nothing to delete.
    Done,
    /// Left in storage, and why: they cannot be proven to be this backup's.
    Left(String),
}

/// Deletes every object under the backup's directory once it is proven to be the backup's own.
/// A backup that never started has none.
async fn delete_data(
    backup: &PostgreSQLBackup,
    context: &BackupContext,
    namespace: &str,
) -> Result<Deleted, Error> {
    let Some(storage) = backup
        .status
        .as_ref()
        .and_then(|s| s.storage.clone().map(|s| s.s3))
    else {
        tracing::info!("the backup never started: no data to delete");
        return Ok(Deleted::Done);
    };
    let bucket = access::connect(&context.base.client, namespace, &storage).await?;
    let target = ownership::target(backup);
    let keys = match &target {
        Target::Own(keys) | Target::Legacy(keys) => keys,
        Target::Unknown(why) => return Ok(Deleted::Left(why.clone())),
    };
    let manifest = bucket
        .read_object(&keys.manifest())
        .await
        .map_err(Error::Remove)?;
    if let Err(why) = ownership::prove(backup, &target, manifest.as_deref()) {
        return Ok(Deleted::Left(why));
    }
    let directory = keys.directory();
    let deleted = delete_directory(&bucket, &Scope::backup_directory(keys))
        .await
        .map_err(Error::Remove)?;
    tracing::info!(%directory, deleted, "backup data deleted");
    Ok(Deleted::Done)
}

/// Deletes every key under the directory of `scope`, `manifest.json` first; returns how many
/// keys were deleted.
async fn delete_directory(bucket: &S3Bucket, scope: &Scope) -> Result<usize, StorageError> {
    let mut keys = list_keys(bucket, scope.directory()).await?;
    // The manifest first: once it is gone, the rest is an incomplete backup nobody restores.
    keys.sort_by_key(|key| !key.ends_with("/manifest.json"));
    let (manifests, others): (Vec<String>, Vec<String>) = keys
        .into_iter()
        .partition(|key| key.ends_with("/manifest.json"));
    delete_keys(bucket, scope, &manifests).await?;
    delete_keys(bucket, scope, &others).await?;
    Ok(manifests.len() + others.len())
}

async fn list_keys(bucket: &S3Bucket, prefix: &str) -> Result<Vec<String>, StorageError> {
    let mut keys = Vec::new();
    let mut pages = bucket
        .client
        .list_objects_v2()
        .bucket(&bucket.name)
        .prefix(prefix)
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|error| s3_error("ListObjectsV2", prefix, error))?;
        keys.extend(
            page.contents()
                .iter()
                .filter_map(|o| o.key().map(str::to_owned)),
        );
    }
    Ok(keys)
}

async fn delete_keys(
    bucket: &S3Bucket,
    scope: &Scope,
    keys: &[String],
) -> Result<(), StorageError> {
    for batch in keys.chunks(DELETE_BATCH) {
        let failed = delete_in(bucket, scope, batch).await?;
        if let Some((key, reason)) = failed.first() {
            return Err(StorageError::S3 {
                operation: "DeleteObjects",
                key: key.clone(),
                reason: format!(
                    "{reason} ({} of {} keys not deleted)",
                    failed.len(),
                    batch.len()
                ),
            });
        }
    }
    Ok(())
}
