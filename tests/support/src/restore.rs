//! Restores in end-to-end tests: PostgreSQLRestores made and awaited, their Jobs, objects put
//! into the test's bucket, and digests of a cluster's data to compare before and after.
//!
//! A digest is what a restore must bring back: for every database that accepts connections
//! (templates excluded), every user table's row count and the MD5 of its rows' text, in a
//! stable order ([`cluster_digest`]). Two digests are equal when the data is.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use pgkube_crds::{
    BackupStorage, LocalReference, PostgreSQLRestore, PostgreSQLRestoreSpec, RestorePhase,
    RestoreSource, S3Storage,
};

use crate::TestCluster;
use crate::wait::wait_until;

/// Label on a restore's Job and its pod: the restore's name.
pub const RESTORE_LABEL: &str = "db.example.com/restore";
/// The one condition type of a restore's status.
pub const RESTORE_CONDITION: &str = "Completed";

/// A restore of PostgreSQLBackup `backup` into cluster `cluster`: every database, existing ones
/// left alone (set `drop_existing` or `databases` on the result to change that).
pub fn restore_of_backup(backup: &str, cluster: &str) -> PostgreSQLRestoreSpec {
    PostgreSQLRestoreSpec {
        backup: Some(LocalReference {
            name: backup.to_owned(),
        }),
        source: None,
        cluster: LocalReference {
            name: cluster.to_owned(),
        },
        databases: Vec::new(),
        drop_existing: false,
        expected_system_identifier: None,
        method: pgkube_crds::RestoreMethod::Logical,
        target: None,
    }
}

/// A restore of the backup whose manifest is `object_key` in `storage` into cluster `cluster`.
pub fn restore_of_source(
    storage: S3Storage,
    object_key: &str,
    cluster: &str,
) -> PostgreSQLRestoreSpec {
    PostgreSQLRestoreSpec {
        backup: None,
        source: Some(RestoreSource {
            storage: BackupStorage { s3: storage },
            object_key: object_key.to_owned(),
        }),
        cluster: LocalReference {
            name: cluster.to_owned(),
        },
        databases: Vec::new(),
        drop_existing: false,
        expected_system_identifier: None,
        method: pgkube_crds::RestoreMethod::Logical,
        target: None,
    }
}

/// Creates PostgreSQLRestore `name` in `namespace`.
pub async fn create_restore(
    client: &Client,
    namespace: &str,
    name: &str,
    spec: PostgreSQLRestoreSpec,
) -> anyhow::Result<PostgreSQLRestore> {
    Api::<PostgreSQLRestore>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &PostgreSQLRestore::new(name, spec))
        .await
        .with_context(|| format!("creating PostgreSQLRestore {name}"))
}

/// Condition `type_` of a restore's status.
pub fn restore_condition(restore: &PostgreSQLRestore, type_: &str) -> Option<Condition> {
    restore
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .cloned()
}

/// The reason of the restore's [`RESTORE_CONDITION`], if it has one.
pub fn restore_reason(restore: &PostgreSQLRestore) -> Option<String> {
    restore_condition(restore, RESTORE_CONDITION).map(|c| c.reason)
}

/// `phase P, Completed=S reason R, job J: message`, for a failure message.
pub fn describe_restore(restore: &PostgreSQLRestore) -> String {
    let status = restore.status.clone().unwrap_or_default();
    let condition = restore_condition(restore, RESTORE_CONDITION)
        .map(|c| format!("{}={} reason {}", c.type_, c.status, c.reason))
        .unwrap_or_else(|| "no condition".to_owned());
    format!(
        "restore {}: phase {:?}, {condition}, job {}: {}",
        restore.metadata.name.as_deref().unwrap_or("?"),
        status.phase,
        status.job_name.as_deref().unwrap_or("-"),
        status.message.unwrap_or_default()
    )
}

/// Waits until restore `name` in `namespace` satisfies `done` (`what` names it in the error,
/// which also shows the restore's last status), and returns it.
pub async fn wait_restore(
    client: &Client,
    namespace: &str,
    name: &str,
    what: &str,
    timeout: Duration,
    done: impl Fn(&PostgreSQLRestore) -> bool,
) -> anyhow::Result<PostgreSQLRestore> {
    let api = Api::<PostgreSQLRestore>::namespaced(client.clone(), namespace);
    wait_until(&format!("restore {name}: {what}"), timeout, || async {
        let restore = api.get(name).await?;
        if done(&restore) {
            return Ok(Some(restore));
        }
        anyhow::bail!("{}", describe_restore(&restore))
    })
    .await
}

/// Waits until restore `name` is Completed or Failed, and returns it.
pub async fn wait_restore_ended(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<PostgreSQLRestore> {
    wait_restore(
        client,
        namespace,
        name,
        "Completed or Failed",
        timeout,
        |restore| {
            matches!(
                restore.status.as_ref().and_then(|s| s.phase),
                Some(RestorePhase::Completed | RestorePhase::Failed)
            )
        },
    )
    .await
}

/// The Jobs labelled as restore `restore`'s ([`RESTORE_LABEL`]).
pub async fn restore_jobs(
    client: &Client,
    namespace: &str,
    restore: &str,
) -> anyhow::Result<Vec<Job>> {
    let jobs = Api::<Job>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("{RESTORE_LABEL}={restore}")))
        .await
        .with_context(|| format!("listing the Jobs of restore {restore}"))?;
    Ok(jobs.items)
}

/// Writes `body` as object `key` of `bucket`, replacing what was there.
pub async fn put_object(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    body: Vec<u8>,
) -> anyhow::Result<()> {
    s3.put_object()
        .bucket(bucket)
        .key(key)
        .body(body.into())
        .send()
        .await
        .with_context(|| format!("putting {key} into {bucket}"))?;
    Ok(())
}

/// Row count and content checksum of one table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableDigest {
    pub rows: i64,
    /// MD5 of the rows' text (`t::text`), sorted, joined with commas.
    pub md5: String,
}

/// Every user table of one database, by `schema.table` (quoted as SQL needs it).
pub type DatabaseDigest = BTreeMap<String, TableDigest>;

/// Every database that accepts connections, templates excluded, by name.
pub type ClusterDigest = BTreeMap<String, DatabaseDigest>;

/// The digest of the database `sql` is connected to.
pub async fn database_digest(sql: &tokio_postgres::Client) -> anyhow::Result<DatabaseDigest> {
    let tables = sql
        .query(
            "SELECT format('%I.%I', table_schema, table_name) FROM information_schema.tables \
             WHERE table_type = 'BASE TABLE' \
             AND table_schema NOT IN ('pg_catalog', 'information_schema') \
             ORDER BY 1",
            &[],
        )
        .await
        .context("listing tables")?;
    let mut digest = DatabaseDigest::new();
    for row in tables {
        let table: String = row.try_get(0)?;
        let sums = sql
            .query_one(
                &format!(
                    "SELECT count(*), md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) \
                     FROM {table} t"
                ),
                &[],
            )
            .await
            .with_context(|| format!("digesting {table}"))?;
        digest.insert(
            table,
            TableDigest {
                rows: sums.try_get(0)?,
                md5: sums.try_get(1)?,
            },
        );
    }
    Ok(digest)
}

/// The digest of every database of `cluster`'s primary. Connections are retried for up to a
/// minute: right after a restore replaced database `postgres`, the primary may briefly be
/// reported not ready.
pub async fn cluster_digest(cluster: &TestCluster) -> anyhow::Result<ClusterDigest> {
    wait_until(
        &format!("the data of cluster {}", cluster.name()),
        Duration::from_secs(60),
        || async {
            let sql = cluster.sql().await?;
            let databases = sql
                .query(
                    "SELECT datname::text FROM pg_database \
                     WHERE NOT datistemplate AND datallowconn ORDER BY 1",
                    &[],
                )
                .await
                .context("listing databases")?;
            let mut digest = ClusterDigest::new();
            for row in databases {
                let database: String = row.try_get(0)?;
                let connection = cluster.sql_to(&database).await?;
                digest.insert(database, database_digest(&connection).await?);
            }
            Ok(Some(digest))
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_names_either_a_backup_or_a_source() {
        let of_backup = restore_of_backup("nightly", "db");
        let json = serde_json::to_value(PostgreSQLRestore::new("r", of_backup)).expect("json");
        assert_eq!(
            json["spec"],
            serde_json::json!({
                "backup": {"name": "nightly"},
                "cluster": {"name": "db"},
                "dropExisting": false,
            })
        );
        let storage = S3Storage {
            bucket: "backups".to_owned(),
            ..S3Storage::default()
        };
        let of_source = restore_of_source(storage, "ns/db/b1/manifest.json", "db");
        let json = serde_json::to_value(&of_source).expect("json");
        assert_eq!(json["source"]["objectKey"], "ns/db/b1/manifest.json");
        assert_eq!(json["source"]["storage"]["s3"]["bucket"], "backups");
        assert!(json.get("backup").is_none());
    }
}
