//! What a retention pass reads before it decides: every key under the cluster's root
//! `<prefix>/<cluster-uid>/` (ListObjectsV2, page by page), every backup's manifest (GetObject,
//! a few at a time) and the open multipart uploads under the root (ListMultipartUploads, page by
//! page), and, when physical backups are kept, the WAL archive's owner record and listing.
//!
//! Any failure here fails the pass before anything is deleted. A manifest that is gone by the
//! time it is read is not a failure: it is reported as [`ManifestReading::Vanished`].

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};

use super::layout::{BackupId, Layout};
use super::plan::Plan;
use super::reading::ManifestReading;
use super::uploads::OpenUpload;
use super::wal::{OwnerReading, WalPlan, kept_bases, plan_wal};
use super::{RequestCount, RetentionPolicy};
use crate::storage::wal::{WalArchiveError, owner};
use crate::storage::{S3Bucket, StorageError, s3_error};

/// Manifests read at once.
const CONCURRENT_MANIFEST_READS: usize = 16;

/// Every key under `root`, all pages.
pub async fn list_keys(
    bucket: &S3Bucket,
    root: &str,
    requests: &mut RequestCount,
) -> Result<Vec<String>, StorageError> {
    let objects = list_objects(bucket, root, requests).await?;
    Ok(objects.into_iter().map(|(key, _)| key).collect())
}

/// Every object under `root` with when it was stored, all pages.
pub async fn list_objects(
    bucket: &S3Bucket,
    root: &str,
    requests: &mut RequestCount,
) -> Result<Vec<(String, Option<aws_sdk_s3::primitives::DateTime>)>, StorageError> {
    let mut keys = Vec::new();
    let mut continuation: Option<String> = None;
    loop {
        requests.add(1);
        let page = bucket
            .client
            .list_objects_v2()
            .bucket(&bucket.name)
            .prefix(root)
            .set_continuation_token(continuation.take())
            .send()
            .await
            .map_err(|error| s3_error("ListObjectsV2", root, error))?;
        let listed = page
            .contents()
            .iter()
            .filter_map(|object| Some((object.key()?.to_owned(), object.last_modified().copied())));
        keys.extend(listed);
        continuation = next_token(page.is_truncated(), page.next_continuation_token())
            .map_err(|reason| truncated_listing("ListObjectsV2", root, reason))?;
        if continuation.is_none() {
            return Ok(keys);
        }
    }
}

/// The marker of the next page, when the store says there is one. A truncated page without
/// a marker is an error: going on with part of the listing could delete part of a backup.
fn next_token(truncated: Option<bool>, token: Option<&str>) -> Result<Option<String>, String> {
    match (truncated, token) {
        (Some(true), Some(token)) if !token.is_empty() => Ok(Some(token.to_owned())),
        (Some(true), _) => Err("the page is truncated but names no next page".to_owned()),
        _ => Ok(None),
    }
}

fn truncated_listing(operation: &'static str, root: &str, reason: String) -> StorageError {
    StorageError::S3 {
        operation,
        key: root.to_owned(),
        reason,
    }
}

/// Reads the manifest of every backup directory that has one, by backup.
pub async fn read_manifests(
    bucket: &S3Bucket,
    layout: &Layout,
    requests: &mut RequestCount,
) -> Result<BTreeMap<BackupId, ManifestReading>, StorageError> {
    // Owned ids and keys: a stream of futures borrowing `&str`s from an iterator is not
    // `Send` for every lifetime (a rustc limitation), and the controllers need a `Send` pass.
    let manifests: Vec<(BackupId, String)> = layout
        .manifest_keys()
        .map(|(id, key)| (id.clone(), key.to_owned()))
        .collect();
    let readings: BTreeMap<BackupId, ManifestReading> = futures::stream::iter(manifests)
        .map(|(id, key)| async move {
            let reading = read_manifest(bucket, &key).await?;
            Ok::<_, StorageError>((id, reading))
        })
        .buffer_unordered(CONCURRENT_MANIFEST_READS)
        .try_collect()
        .await?;
    requests.add(readings.len() as u64);
    Ok(readings)
}

async fn read_manifest(bucket: &S3Bucket, key: &str) -> Result<ManifestReading, StorageError> {
    Ok(match bucket.read_object(key).await? {
        Some(bytes) => ManifestReading::from_bytes(key, &bytes),
        None => ManifestReading::Vanished,
    })
}

/// Reads and lists the cluster's WAL archive when a kept physical backup's WAL is there, and
/// decides what of it goes ([`plan_wal`]). Reads nothing when no such backup is kept.
pub async fn plan_wal_pruning(
    bucket: &S3Bucket,
    policy: &RetentionPolicy,
    plan: &Plan,
    manifests: &BTreeMap<BackupId, ManifestReading>,
    requests: &mut RequestCount,
) -> Result<WalPlan, StorageError> {
    let Some(root) = policy.wal_root.as_deref() else {
        return Ok(WalPlan::left_alone("no WAL archive root"));
    };
    let bases = kept_bases(root, &plan.kept, manifests);
    if bases.is_empty() {
        return Ok(WalPlan::left_alone("no physical backup is kept"));
    }
    requests.add(1);
    let owner = match owner(bucket, root).await {
        Ok(Some(owner)) => OwnerReading::Found(owner),
        Ok(None) => OwnerReading::Missing,
        Err(WalArchiveError::BadMarker { reason, .. }) => OwnerReading::Unreadable(reason),
        Err(WalArchiveError::Storage(error)) => return Err(error),
        Err(other) => OwnerReading::Unreadable(other.to_string()),
    };
    let keys = match owner {
        OwnerReading::Found(_) => list_keys(bucket, root, requests).await?,
        _ => Vec::new(),
    };
    Ok(plan_wal(root, &policy.cluster_uid, &bases, &owner, &keys))
}

/// Every multipart upload under `root` that was started and neither completed nor aborted.
pub async fn list_open_uploads(
    bucket: &S3Bucket,
    root: &str,
    requests: &mut RequestCount,
) -> Result<Vec<OpenUpload>, StorageError> {
    let mut uploads = Vec::new();
    let (mut key_marker, mut upload_id_marker) = (None, None);
    loop {
        requests.add(1);
        let page = bucket
            .client
            .list_multipart_uploads()
            .bucket(&bucket.name)
            .prefix(root)
            .set_key_marker(key_marker.take())
            .set_upload_id_marker(upload_id_marker.take())
            .send()
            .await
            .map_err(|error| s3_error("ListMultipartUploads", root, error))?;
        uploads.extend(page.uploads().iter().filter_map(open_upload));
        key_marker = next_token(page.is_truncated(), page.next_key_marker())
            .map_err(|reason| truncated_listing("ListMultipartUploads", root, reason))?;
        if key_marker.is_none() {
            return Ok(uploads);
        }
        upload_id_marker = page.next_upload_id_marker().map(str::to_owned);
    }
}

fn open_upload(upload: &aws_sdk_s3::types::MultipartUpload) -> Option<OpenUpload> {
    Some(OpenUpload {
        key: upload.key()?.to_owned(),
        upload_id: upload.upload_id()?.to_owned(),
        initiated: upload
            .initiated()
            .and_then(|time| DateTime::<Utc>::from_timestamp(time.secs(), time.subsec_nanos())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_followed_only_when_the_store_says_there_is_more_and_where() {
        assert_eq!(next_token(Some(true), Some("t")), Ok(Some("t".into())));
        assert_eq!(next_token(Some(false), Some("t")), Ok(None));
        assert_eq!(next_token(None, Some("t")), Ok(None));
        assert!(next_token(Some(true), Some("")).is_err());
        assert!(next_token(Some(true), None).is_err());
    }
}
