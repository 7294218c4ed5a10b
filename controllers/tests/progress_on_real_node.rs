//! End to end on the test bed's real node: a running backup shows how far it got. Its agent
//! reports on its log; the backup controller copies the last report into `status.progress`,
//! which `kubectl get` shows in the Progress column, and removes it when the backup ends.
//!
//! The backup is held half way without sleeping: a transaction holds an exclusive lock on a
//! table of the last database, so `pg_dump` of that database waits for it, after the others
//! were dumped.

mod common;

use std::time::Duration;

use common::real_node::{BACKUP_TIMEOUT, Fixture, phase};
use kube::Api;
use pgkube_crds::{BackupPhase, DeletionPolicy, PostgreSQLBackup, TransferProgress};
use pgkube_testkit::{create_backup, wait_backup_ended, wait_until};

#[tokio::test]
async fn a_running_backup_shows_its_progress_and_an_ended_one_none() {
    let Some(fixture) = Fixture::start("progress").await else {
        return;
    };
    let shop = fixture.cluster.sql_to("shop").await.expect("SQL to shop");
    shop.batch_execute(
        "CREATE TABLE held (id int PRIMARY KEY);
         INSERT INTO held SELECT generate_series(1, 100);",
    )
    .await
    .expect("table made");
    let lock = fixture.cluster.sql_to("shop").await.expect("SQL to shop");
    lock.batch_execute("BEGIN; LOCK TABLE held IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("held locked");

    let namespace = fixture.namespace();
    let client = &fixture.running.client;
    create_backup(client, namespace, "slow", "pg", DeletionPolicy::Retain)
        .await
        .expect("backup created");
    let backups = Api::<PostgreSQLBackup>::namespaced(client.clone(), namespace);
    let progress = wait_until(
        "the backup to report shop",
        Duration::from_secs(120),
        || {
            let backups = backups.clone();
            async move {
                let backup = backups.get("slow").await?;
                let progress = backup.status.and_then(|s| s.progress);
                Ok(progress.filter(|p| p.current_database.as_deref() == Some("shop")))
            }
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));
    assert_dumping_the_second_database(&progress);

    let env = pgkube_testkit::testbed().expect("test bed");
    let shown = env
        .kubectl()
        .args([
            "get",
            "postgresqlbackups.db.example.com",
            "slow",
            "-n",
            namespace,
        ])
        .output()
        .expect("kubectl runs");
    let table = String::from_utf8_lossy(&shown.stdout);
    assert!(table.contains("PROGRESS"), "{table}");
    assert!(table.contains("Dumping 2/3 shop"), "{table}");

    lock.batch_execute("ROLLBACK").await.expect("lock released");
    let ended = wait_backup_ended(client, namespace, "slow", BACKUP_TIMEOUT)
        .await
        .unwrap_or_else(|error| panic!("{error:#}"));
    assert_eq!(phase(&ended), Some(BackupPhase::Completed));
    assert_eq!(
        ended.status.and_then(|s| s.progress),
        None,
        "an ended backup shows no progress"
    );
    fixture.stop().await;
}

fn assert_dumping_the_second_database(progress: &TransferProgress) {
    assert_eq!(progress.step, "Dumping", "{progress:?}");
    assert_eq!(
        progress.databases_done,
        Some(2),
        "app and postgres are done: {progress:?}"
    );
    assert_eq!(progress.database_count, Some(3), "{progress:?}");
    assert!(progress.bytes > 0, "the first dump's bytes: {progress:?}");
    assert!(
        progress.total_bytes.is_some_and(|total| total > 0) && progress.total_is_estimate,
        "the databases' size on disk: {progress:?}"
    );
    assert!(
        progress.summary.starts_with("Dumping 2/3 shop, "),
        "{progress:?}"
    );
}
