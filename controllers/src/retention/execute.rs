//! Carries out a [`Plan`]: DeleteObjects batches (the expired manifests first, then the rest of
//! those backups) and AbortMultipartUpload for the stale uploads.
//!
//! DeleteObjects answers 200 even when some keys were not deleted: each batch's per-key errors
//! are collected, the remaining batches still run, and the pass then fails naming the keys. A
//! backup whose manifest could not be deleted keeps its data too. A request that fails as a
//! whole stops the deletes there.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_s3::error::SdkError;
use aws_sdk_s3::types::{Delete, ObjectIdentifier};

use super::RequestCount;
use super::plan::{ExpiredBackup, OpenUpload, Plan};
use crate::storage::{S3Bucket, StorageError, one_line, s3_error};

/// Keys named in the error of a pass that could not delete everything.
const KEYS_NAMED_IN_ERRORS: usize = 5;

/// What the deletes of a pass did.
#[derive(Debug, Default)]
pub struct Deletion {
    pub deleted_backups: Vec<String>,
    pub deleted_objects: u64,
}

/// Keys that a DeleteObjects answer said were not deleted, with the store's reason.
#[derive(Debug, Default)]
struct KeyFailures(BTreeMap<String, String>);

impl KeyFailures {
    fn contains(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    /// Whether any key of `backup` was not deleted.
    fn touch(&self, backup: &ExpiredBackup) -> bool {
        self.contains(&backup.manifest_key) || backup.data_keys.iter().any(|k| self.contains(k))
    }

    fn into_error(self) -> StorageError {
        let named: Vec<String> = self
            .0
            .iter()
            .take(KEYS_NAMED_IN_ERRORS)
            .map(|(key, reason)| format!("{key} ({reason})"))
            .collect();
        let more = self.0.len().saturating_sub(KEYS_NAMED_IN_ERRORS);
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        StorageError::S3 {
            operation: "DeleteObjects",
            key: self.0.keys().next().cloned().unwrap_or_default(),
            reason: format!(
                "{} keys not deleted: {}{tail}",
                self.0.len(),
                named.join(", ")
            ),
        }
    }
}

/// Deletes the expired backups of `plan`: their manifests first, then their other keys.
pub async fn delete_expired(
    bucket: &S3Bucket,
    plan: &Plan,
    requests: &mut RequestCount,
) -> Result<Deletion, StorageError> {
    let mut deletion = Deletion::default();
    let mut failures = KeyFailures::default();
    for batch in plan.manifest_batches() {
        delete_batch(bucket, &batch, requests, &mut deletion, &mut failures).await?;
    }
    let manifest_kept: BTreeSet<String> = plan
        .expired
        .iter()
        .filter(|backup| failures.contains(&backup.manifest_key))
        .map(|backup| backup.name.clone())
        .collect();
    for batch in plan.data_batches(&manifest_kept) {
        delete_batch(bucket, &batch, requests, &mut deletion, &mut failures).await?;
    }
    deletion.deleted_backups = plan
        .expired
        .iter()
        .filter(|backup| !failures.touch(backup))
        .map(|backup| backup.name.clone())
        .collect();
    if failures.0.is_empty() {
        Ok(deletion)
    } else {
        Err(failures.into_error())
    }
}

/// One DeleteObjects request (quiet: the answer lists only the keys not deleted).
async fn delete_batch(
    bucket: &S3Bucket,
    keys: &[String],
    requests: &mut RequestCount,
    deletion: &mut Deletion,
    failures: &mut KeyFailures,
) -> Result<(), StorageError> {
    let first_key = keys.first().map(String::as_str).unwrap_or_default();
    let objects = keys
        .iter()
        .map(|key| ObjectIdentifier::builder().key(key).build())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| delete_request_error(first_key, &error))?;
    let delete = Delete::builder()
        .set_objects(Some(objects))
        .quiet(true)
        .build()
        .map_err(|error| delete_request_error(first_key, &error))?;
    requests.add(1);
    let answer = bucket
        .client
        .delete_objects()
        .bucket(&bucket.name)
        .delete(delete)
        .send()
        .await
        .map_err(|error| s3_error("DeleteObjects", first_key, error))?;
    let failed: Vec<(String, String)> = answer.errors().iter().map(failed_key).collect();
    deletion.deleted_objects += (keys.len() - failed.len().min(keys.len())) as u64;
    failures.0.extend(failed);
    Ok(())
}

fn failed_key(error: &aws_sdk_s3::types::Error) -> (String, String) {
    let key = error.key().unwrap_or("?").to_owned();
    let reason = match (error.code(), error.message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_owned(),
        (None, message) => message.unwrap_or("no reason given").to_owned(),
    };
    (key, one_line(&reason))
}

fn delete_request_error(key: &str, error: &dyn std::error::Error) -> StorageError {
    StorageError::S3 {
        operation: "DeleteObjects",
        key: key.to_owned(),
        reason: format!("cannot build the request: {error}"),
    }
}

/// Aborts each upload; one that is already gone (completed or aborted meanwhile) is not an
/// error. Returns how many were aborted; on the first other failure, the rest stay open.
pub async fn abort_uploads(
    bucket: &S3Bucket,
    uploads: &[OpenUpload],
    requests: &mut RequestCount,
) -> Result<u64, StorageError> {
    let mut aborted = 0;
    for upload in uploads {
        requests.add(1);
        let answer = bucket
            .client
            .abort_multipart_upload()
            .bucket(&bucket.name)
            .key(&upload.key)
            .upload_id(&upload.upload_id)
            .send()
            .await;
        match answer {
            Ok(_) => aborted += 1,
            Err(SdkError::ServiceError(service)) if service.err().is_no_such_upload() => {}
            Err(error) => return Err(s3_error("AbortMultipartUpload", &upload.key, error)),
        }
    }
    Ok(aborted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failures(keys: &[&str]) -> KeyFailures {
        KeyFailures(
            keys.iter()
                .map(|key| (key.to_string(), "AccessDenied: no".to_string()))
                .collect(),
        )
    }

    #[test]
    fn a_backup_with_any_key_left_is_not_reported_deleted() {
        let failed = failures(&["ns/a/b1/manifest.json", "ns/a/b2/globals.sql"]);
        let backup = |name: &str| ExpiredBackup {
            name: name.into(),
            manifest_key: format!("ns/a/{name}/manifest.json"),
            data_keys: vec![format!("ns/a/{name}/globals.sql")],
        };
        assert!(failed.touch(&backup("b1")));
        assert!(failed.touch(&backup("b2")));
        assert!(!failed.touch(&backup("b3")));
    }

    #[test]
    fn the_error_names_the_first_keys_and_counts_the_rest() {
        let keys: Vec<String> = (0..7).map(|i| format!("ns/a/b1/k{i}")).collect();
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let error = failures(&key_refs).into_error().to_string();
        assert!(
            error.starts_with(
                "S3 DeleteObjects of ns/a/b1/k0 failed: 7 keys not deleted: \
                 ns/a/b1/k0 (AccessDenied: no), "
            ),
            "{error}"
        );
        assert!(error.contains("ns/a/b1/k4"), "{error}");
        assert!(!error.contains("ns/a/b1/k5"), "{error}");
        assert!(error.ends_with(" and 2 more"), "{error}");
    }
}
