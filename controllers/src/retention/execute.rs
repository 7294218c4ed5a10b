//! Carries out a [`Plan`]: DeleteObjects batches (the expired manifests first, then the rest of
//! those backups), the WAL a [`WalPlan`] lets go, and AbortMultipartUpload for the stale
//! uploads.
//!
//! DeleteObjects answers 200 even when some keys were not deleted: each batch's per-key errors
//! are collected, the remaining batches still run, and the pass then fails naming the keys. A
//! backup whose manifest could not be deleted keeps its data too. A request that fails as a
//! whole stops the deletes there.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_s3::error::SdkError;

use super::RequestCount;
use super::layout::BackupId;
use super::plan::{ExpiredBackup, MAX_KEYS_PER_DELETE, Plan};
use super::uploads::OpenUpload;
use super::wal::WalPlan;
use crate::storage::guarded::{Scope, delete_in};
use crate::storage::{S3Bucket, StorageError, s3_error};

/// Keys named in the error of a pass that could not delete everything.
const KEYS_NAMED_IN_ERRORS: usize = 5;

/// What the deletes of a pass did.
#[derive(Debug, Default)]
pub struct Deletion {
    pub deleted_backups: Vec<BackupId>,
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

/// Deletes the expired backups of `plan`, all under `scope` (the cluster's root): their
/// manifests first, then their other keys.
pub async fn delete_expired(
    bucket: &S3Bucket,
    scope: &Scope,
    plan: &Plan,
    requests: &mut RequestCount,
) -> Result<Deletion, StorageError> {
    let mut deletion = Deletion::default();
    let mut failures = KeyFailures::default();
    for batch in plan.manifest_batches() {
        delete_batch(
            bucket,
            scope,
            &batch,
            requests,
            &mut deletion,
            &mut failures,
        )
        .await?;
    }
    let manifest_kept: BTreeSet<BackupId> = plan
        .expired
        .iter()
        .filter(|backup| failures.contains(&backup.manifest_key))
        .map(|backup| backup.id.clone())
        .collect();
    for batch in plan.data_batches(&manifest_kept) {
        delete_batch(
            bucket,
            scope,
            &batch,
            requests,
            &mut deletion,
            &mut failures,
        )
        .await?;
    }
    deletion.deleted_backups = plan
        .expired
        .iter()
        .filter(|backup| !failures.touch(backup))
        .map(|backup| backup.id.clone())
        .collect();
    if failures.0.is_empty() {
        Ok(deletion)
    } else {
        Err(failures.into_error())
    }
}

/// Deletes the WAL files `wal` lets go, all under `scope` (the WAL archive); returns how many.
pub async fn delete_wal(
    bucket: &S3Bucket,
    scope: &Scope,
    wal: &WalPlan,
    requests: &mut RequestCount,
) -> Result<u64, StorageError> {
    let mut deletion = Deletion::default();
    let mut failures = KeyFailures::default();
    for batch in wal.delete.chunks(MAX_KEYS_PER_DELETE) {
        delete_batch(bucket, scope, batch, requests, &mut deletion, &mut failures).await?;
    }
    if failures.0.is_empty() {
        Ok(deletion.deleted_objects)
    } else {
        Err(failures.into_error())
    }
}

/// One DeleteObjects request (quiet: the answer lists only the keys not deleted).
async fn delete_batch(
    bucket: &S3Bucket,
    scope: &Scope,
    keys: &[String],
    requests: &mut RequestCount,
    deletion: &mut Deletion,
    failures: &mut KeyFailures,
) -> Result<(), StorageError> {
    requests.add(1);
    let failed = delete_in(bucket, scope, keys).await?;
    deletion.deleted_objects += (keys.len() - failed.len().min(keys.len())) as u64;
    failures.0.extend(failed);
    Ok(())
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
    use std::sync::{Arc, Mutex};

    use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// A loopback stand-in for a store's DeleteObjects, for what Garage cannot be made to do:
    /// refuse some keys. It answers each request with an error for every key in `refused` and
    /// records the keys of each request, in order.
    struct RefusingStore {
        endpoint: String,
        batches: Arc<Mutex<Vec<Vec<String>>>>,
    }

    impl RefusingStore {
        async fn start(refused: &[&str]) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding");
            let endpoint = format!("http://{}", listener.local_addr().expect("address"));
            let batches = Arc::new(Mutex::new(Vec::new()));
            let refused: Arc<BTreeSet<String>> =
                Arc::new(refused.iter().map(|key| key.to_string()).collect());
            let recorded = batches.clone();
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let (refused, recorded) = (refused.clone(), recorded.clone());
                    tokio::spawn(serve(stream, refused, recorded));
                }
            });
            Self { endpoint, batches }
        }

        fn bucket(&self) -> S3Bucket {
            let config = aws_sdk_s3::Config::builder()
                .behavior_version(BehaviorVersion::latest())
                .endpoint_url(&self.endpoint)
                .region(Region::new("test"))
                .credentials_provider(Credentials::new("AK", "SK", None, None, "test"))
                .force_path_style(true)
                .build();
            S3Bucket::with_client(aws_sdk_s3::Client::from_conf(config), "backups")
        }

        fn batches(&self) -> Vec<Vec<String>> {
            self.batches.lock().expect("batches").clone()
        }
    }

    async fn serve(
        mut stream: TcpStream,
        refused: Arc<BTreeSet<String>>,
        recorded: Arc<Mutex<Vec<Vec<String>>>>,
    ) {
        while let Some(body) = read_request(&mut stream).await {
            let keys = xml_values(&body, "Key");
            let errors: String = keys
                .iter()
                .filter(|key| refused.contains(*key))
                .map(|key| {
                    format!(
                        "<Error><Key>{key}</Key><Code>AccessDenied</Code>\
                         <Message>Access Denied</Message></Error>"
                    )
                })
                .collect();
            recorded.lock().expect("batches").push(keys);
            let answer = format!("<?xml version=\"1.0\"?><DeleteResult>{errors}</DeleteResult>");
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/xml\r\ncontent-length: {}\r\n\r\n{answer}",
                answer.len()
            );
            if stream.write_all(response.as_bytes()).await.is_err() {
                return;
            }
        }
    }

    /// The body of the next request on `stream`, `None` once the client closed it.
    async fn read_request(stream: &mut TcpStream) -> Option<String> {
        let mut buffer = Vec::new();
        let head_end = loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let mut chunk = [0u8; 4096];
            let read = stream.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
            buffer.extend_from_slice(&chunk[..read]);
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            let mut chunk = [0u8; 4096];
            let read = stream.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
            buffer.extend_from_slice(&chunk[..read]);
        }
        Some(String::from_utf8_lossy(&buffer[head_end..head_end + length]).into_owned())
    }

    fn xml_values(xml: &str, tag: &str) -> Vec<String> {
        let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
        xml.split(&open)
            .skip(1)
            .filter_map(|rest| rest.split_once(&close).map(|(value, _)| value.to_owned()))
            .collect()
    }

    /// The root of the test cluster: `ns/a/`.
    fn scope() -> Scope {
        Scope::cluster_root("ns", "a")
    }

    fn expired(name: &str) -> ExpiredBackup {
        ExpiredBackup {
            id: BackupId::new(name, "u1"),
            manifest_key: format!("ns/a/{name}/manifest.json"),
            data_keys: vec![
                format!("ns/a/{name}/globals.sql"),
                format!("ns/a/{name}/databases/app.dump"),
            ],
        }
    }

    #[tokio::test]
    async fn refused_keys_fail_the_pass_by_name_and_a_kept_manifest_keeps_its_data() {
        let store = RefusingStore::start(&["ns/a/b1/manifest.json", "ns/a/b3/globals.sql"]).await;
        let plan = Plan {
            expired: vec![expired("b1"), expired("b2"), expired("b3")],
            ..Plan::default()
        };
        let mut requests = RequestCount::default();

        let error = delete_expired(&store.bucket(), &scope(), &plan, &mut requests)
            .await
            .expect_err("two keys were refused");

        assert_eq!(
            error.to_string(),
            "S3 DeleteObjects of ns/a/b1/manifest.json failed: 2 keys not deleted: \
             ns/a/b1/manifest.json (AccessDenied: Access Denied), \
             ns/a/b3/globals.sql (AccessDenied: Access Denied)"
        );
        // The manifests first, then the data of b2 and b3 only: b1's manifest is still there.
        let batches = store.batches();
        assert_eq!(batches.len(), 2, "{batches:?}");
        assert_eq!(
            batches[0],
            [
                "ns/a/b1/manifest.json",
                "ns/a/b2/manifest.json",
                "ns/a/b3/manifest.json"
            ]
        );
        assert_eq!(
            batches[1],
            [
                "ns/a/b2/globals.sql",
                "ns/a/b2/databases/app.dump",
                "ns/a/b3/globals.sql",
                "ns/a/b3/databases/app.dump"
            ]
        );
        assert_eq!(requests.0, 2);
    }

    #[tokio::test]
    async fn a_pass_without_refusals_reports_what_it_deleted() {
        let store = RefusingStore::start(&[]).await;
        let plan = Plan {
            expired: vec![expired("b1"), expired("b2")],
            ..Plan::default()
        };
        let mut requests = RequestCount::default();

        let deletion = delete_expired(&store.bucket(), &scope(), &plan, &mut requests)
            .await
            .expect("nothing refused");

        let names: Vec<&str> = deletion
            .deleted_backups
            .iter()
            .map(|id| id.name.as_str())
            .collect();
        assert_eq!(names, ["b1", "b2"]);
        assert_eq!(deletion.deleted_objects, 6);
        assert_eq!(store.batches().len(), 2);
    }

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
            id: BackupId::new(name, "u1"),
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
