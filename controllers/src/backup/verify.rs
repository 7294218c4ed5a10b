//! A backup is Completed only once its storage shows it: the manifest the agent reported is
//! where the backup's status says it goes, with the checksum the agent reported, it records this
//! backup (its name, and its uid for a backup in the layout with uids), and every object it lists
//! is there with the size it lists.

use sha2::{Digest, Sha256};

use crate::agent_job::AgentResult;
use crate::storage::manifest::Manifest;
use crate::storage::{S3Bucket, StorageError};

/// What the controller records about a verified backup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    pub manifest_key: String,
    /// Bytes of all the objects the manifest lists.
    pub size: u64,
    /// `sha256:<hex>` of the manifest's bytes.
    pub checksum: String,
    pub postgresql_version: String,
    pub started_at: String,
    pub finished_at: String,
}

/// Why a backup the agent reported as done does not check out.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("the agent's result has no {0}")]
    Incomplete(&'static str),
    #[error("manifest {key} does not match the agent's result: {reason}")]
    Mismatch { key: String, reason: String },
    #[error("object {key} is missing from storage")]
    MissingObject { key: String },
    #[error("object {key} has {actual} bytes in storage, the manifest says {expected}")]
    WrongSize {
        key: String,
        expected: u64,
        actual: u64,
    },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// The backup a manifest must be of.
#[derive(Clone, Copy, Debug)]
pub struct Expected<'a> {
    /// Where the backup's status says its manifest goes.
    pub manifest_key: &'a str,
    pub backup_name: &'a str,
    /// The PostgreSQLBackup's uid that the manifest must record (`None` for a backup started
    /// before the uids were recorded, whose manifest has none).
    pub backup_uid: Option<&'a str>,
}

/// Checks the manifest and the objects of the backup the agent reported.
pub async fn verify(
    bucket: &S3Bucket,
    expected: Expected<'_>,
    result: &AgentResult,
) -> Result<Verified, VerifyError> {
    let key = result
        .manifest_key
        .clone()
        .ok_or(VerifyError::Incomplete("manifest key"))?;
    if key != expected.manifest_key {
        let expected = expected.manifest_key;
        return Err(VerifyError::Mismatch {
            key,
            reason: format!("the backup's manifest is {expected}"),
        });
    }
    let reported_sha256 = result
        .manifest_sha256
        .as_deref()
        .ok_or(VerifyError::Incomplete("manifest checksum"))?;
    let bytes = bucket
        .read_object(&key)
        .await?
        .ok_or_else(|| VerifyError::MissingObject { key: key.clone() })?;
    let sha256 = hex::encode(Sha256::digest(&bytes));
    let mismatch = |reason: String| VerifyError::Mismatch {
        key: key.clone(),
        reason,
    };
    if sha256 != reported_sha256 {
        return Err(mismatch(format!(
            "its SHA-256 is {sha256}, the agent wrote {reported_sha256}"
        )));
    }
    let manifest = Manifest::parse(&key, &bytes)?;
    let recorded_uid = manifest.backup_uid.as_deref();
    if manifest.backup_name != expected.backup_name
        || (expected.backup_uid.is_some() && recorded_uid != expected.backup_uid)
    {
        return Err(mismatch(format!(
            "it belongs to backup {} (uid {})",
            manifest.backup_name,
            recorded_uid.unwrap_or("none")
        )));
    }
    check_objects(bucket, &manifest).await?;
    if let Some(size) = result.size.filter(|size| *size != manifest.total_size()) {
        return Err(mismatch(format!(
            "it lists {} bytes, the agent reported {size}",
            manifest.total_size()
        )));
    }
    Ok(Verified {
        manifest_key: key,
        size: manifest.total_size(),
        checksum: format!("sha256:{sha256}"),
        postgresql_version: manifest.postgresql_version,
        started_at: manifest.started_at,
        finished_at: manifest.finished_at,
    })
}

/// Every object the manifest lists is stored with the size it lists.
async fn check_objects(bucket: &S3Bucket, manifest: &Manifest) -> Result<(), VerifyError> {
    for object in manifest.objects() {
        match bucket.object_size(&object.key).await? {
            None => {
                return Err(VerifyError::MissingObject {
                    key: object.key.clone(),
                });
            }
            Some(actual) if actual != object.size => {
                return Err(VerifyError::WrongSize {
                    key: object.key.clone(),
                    expected: object.size,
                    actual,
                });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};

    use super::*;

    /// A bucket that no request may reach: the checks tested here come before any.
    fn unreachable_bucket() -> S3Bucket {
        let config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url("http://127.0.0.1:9")
            .region(Region::new("test"))
            .credentials_provider(Credentials::new("AK", "SK", None, None, "test"))
            .build();
        S3Bucket::with_client(aws_sdk_s3::Client::from_conf(config), "backups")
    }

    #[tokio::test]
    async fn a_manifest_elsewhere_than_the_recorded_key_fails_the_backup() {
        // An agent from before the uids writes the legacy layout, not where the status says.
        let result = AgentResult {
            status: "Completed".to_owned(),
            manifest_key: Some("db/main/nightly/manifest.json".to_owned()),
            manifest_sha256: Some("ab".repeat(32)),
            ..AgentResult::default()
        };
        let expected = Expected {
            manifest_key: "db/main/c1/nightly/u1/manifest.json",
            backup_name: "nightly",
            backup_uid: Some("u1"),
        };
        let error = verify(&unreachable_bucket(), expected, &result)
            .await
            .expect_err("another key");
        assert!(
            matches!(&error, VerifyError::Mismatch { key, .. } if key == "db/main/nightly/manifest.json"),
            "{error}"
        );
        assert!(
            error
                .to_string()
                .ends_with("the backup's manifest is db/main/c1/nightly/u1/manifest.json"),
            "{error}"
        );
    }
}
