//! End to end on the test bed's real node: a physical backup of a two-instance PostgreSQL 15
//! cluster, read from its standby while a writer commits on the primary, stored in the real
//! Garage; then proved restorable here: the base backup and the archived WAL are restored into a
//! scratch data directory, `pg_verifybackup` checks them, and a scratch server recovers them to
//! the backup's end and holds exactly what was committed before its stop LSN. The retention
//! pass that follows the backup has pruned the WAL before it by then, so the restore also
//! proves that pruning kept everything the backup needs.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use common::Running;
use common::real_node::{CLUSTER_TIMEOUT, NEVER, RESYNC, S3_SECRET};
use pgkube_controllers::storage::manifest::{Manifest, PhysicalBackup};
use pgkube_crds::{
    BackupMethod, BackupPhase, BackupSpec, BackupTarget, CONTINUOUS_ARCHIVING, DeletionPolicy,
    InstanceRole, LocalReference, PostgreSQLBackup, PostgreSQLBackupSpec, WalArchiving,
};
use pgkube_testkit::scratch::{ScratchServer, run_pg15};
use pgkube_testkit::tokio_postgres::Client;
use pgkube_testkit::wal::{archived_files, finish_segments, segment_number, wait_archived_through};
use pgkube_testkit::{
    TestBucket, TestCluster, TestEnv, backup_config, create_s3_secret, test_storage,
    wait_backup_ended, wait_until,
};
use sha2::{Digest, Sha256};

/// The backup waits for its WAL to be archived (a minute at most with `archive_timeout`, less
/// with the agent's `pg_switch_wal()`), on top of the base backup itself.
const BACKUP_TIMEOUT: Duration = Duration::from_secs(600);

/// One committed row of the writer: its id, and the primary's WAL insert position just before
/// its INSERT and just after its commit returned.
#[derive(Clone, Copy, Debug)]
struct Written {
    id: i64,
    before: i64,
    after: i64,
}

#[tokio::test]
async fn a_physical_backup_from_a_standby_under_writes_restores_to_its_stop_lsn_and_verifies() {
    let Some(running) = Running::start("phys-backup", RESYNC).await else {
        return;
    };
    let env = pgkube_testkit::testbed().expect("the test bed");
    let bucket = TestBucket::create(&env, "physical").await;
    let cluster = start_cluster(&running, &env, &bucket, 2, |_| {}).await;
    let sql = cluster.sql().await.expect("SQL");
    sql.batch_execute(
        "CREATE TABLE items (id int PRIMARY KEY, name text);
         INSERT INTO items SELECT i, 'item ' || i FROM generate_series(1, 5000) i;
         CREATE TABLE writes (id bigint PRIMARY KEY, payload text);",
    )
    .await
    .expect("data written");
    // The archive has its owner record once a file is stored; the standby must stream.
    cluster
        .wait_condition(CONTINUOUS_ARCHIVING, "True", CLUSTER_TIMEOUT)
        .await
        .expect("archiving works");
    let standby = streaming_standby(&cluster).await;
    // A finished, archived segment and a checkpoint after it: the backup starts past that
    // segment, which the retention pass after the backup then deletes.
    let before_backup = finish_segments(&sql, 1).await.expect("a segment");
    sql.batch_execute("CHECKPOINT").await.expect("a checkpoint");
    wait_archived_through(&sql, &before_backup, CLUSTER_TIMEOUT)
        .await
        .expect("archived");

    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicI64::new(0));
    let writer = tokio::spawn(write_until(
        cluster.sql().await.expect("SQL"),
        stop.clone(),
        count.clone(),
    ));
    rows_written(&count, 100).await;
    let backup = physical_backup(&running, cluster.name(), "physical", None).await;
    // Rows after the backup's end too: the restore must stop before them.
    rows_written(&count, count.load(Ordering::Relaxed) + 100).await;
    stop.store(true, Ordering::Relaxed);
    let written = writer
        .await
        .expect("the writer ran")
        .expect("the writer wrote");

    let status = backup.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Some(BackupPhase::Completed), "{status:?}");
    let key = status.object_key.clone().expect("the manifest's key");
    let manifest =
        Manifest::parse(&key, &bucket.object(&key).await.expect("manifest")).expect("readable");
    let physical = manifest.physical.clone().expect("a physical backup");
    assert!(physical.from_standby, "{physical:?}");
    assert_eq!(physical.source, standby, "read from the streaming replica");
    assert_eq!(status.size_bytes, Some(manifest.total_size() as i64));
    let recorded = cluster.get().await.expect("cluster").status;
    assert_eq!(
        manifest.system_identifier,
        recorded.and_then(|s| s.system_identifier),
        "the cluster's database"
    );

    assert!(before_backup < physical.first_wal, "{physical:?}");
    wait_wal_pruned_before(&bucket, &physical).await;

    let mut scratch = ScratchServer::create("phys-restore").expect("a scratch directory");
    restore_files(&bucket, &physical, &scratch).await;
    let verified = run_pg15(
        "pg_verifybackup",
        &[
            "--wal-directory".as_ref(),
            scratch.wal().as_os_str(),
            scratch.data().as_os_str(),
        ],
    )
    .unwrap_or_else(|error| panic!("pg_verifybackup: {error:#}"));
    assert!(verified.contains("successfully verified"), "{verified}");

    let restored = scratch
        .recover_to_consistency("postgres")
        .await
        .unwrap_or_else(|error| panic!("{error:#}\n{}", scratch.log()));
    compare_with_the_primary(&sql, &restored, &written, &physical).await;
    scratch.stop();

    // Asked for, the primary is read instead.
    let from_primary = physical_backup(
        &running,
        cluster.name(),
        "physical-primary",
        Some(BackupTarget::Primary),
    )
    .await;
    let status = from_primary.status.unwrap_or_default();
    assert_eq!(status.phase, Some(BackupPhase::Completed), "{status:?}");
    let key = status.object_key.expect("the manifest's key");
    let manifest =
        Manifest::parse(&key, &bucket.object(&key).await.expect("manifest")).expect("readable");
    let physical = manifest.physical.expect("a physical backup");
    assert!(!physical.from_standby, "{physical:?}");
    assert_eq!(
        Some(physical.source),
        cluster.current_primary().await.expect("the cluster")
    );
    cluster
        .delete(Duration::from_secs(120))
        .await
        .expect("cluster deleted");
    running.stop().await;
    bucket.cleanup().await;
}

#[tokio::test]
async fn a_physical_backup_of_a_cluster_that_does_not_archive_waits_with_the_reason_then_fails() {
    let Some(running) = Running::start_with("phys-no-archive", RESYNC, |settings| {
        settings.backup_pending_deadline = Duration::from_secs(20);
    })
    .await
    else {
        return;
    };
    let env = pgkube_testkit::testbed().expect("the test bed");
    let namespace = running.namespace.name().to_owned();
    let bucket = TestBucket::create(&env, "physical-off").await;
    let cluster = start_cluster(&running, &env, &bucket, 1, |settings| {
        settings.wal_archiving = Some(WalArchiving { enabled: false });
    })
    .await;
    create_physical_backup(&running, cluster.name(), "physical", None).await;
    let backups = running.api::<PostgreSQLBackup>();
    let reason_of = |backup: &PostgreSQLBackup| {
        let status = backup.status.clone().unwrap_or_default();
        let reason = status.conditions.first().map(|c| c.reason.clone());
        (status.phase, reason, status.message.unwrap_or_default())
    };
    let waiting = wait_until("the backup waits", Duration::from_secs(60), || async {
        let seen = reason_of(&backups.get("physical").await?);
        Ok((seen.0 == Some(BackupPhase::Pending)).then_some(seen))
    })
    .await
    .expect("Pending");
    assert_eq!(waiting.1.as_deref(), Some("WALArchivingOff"), "{waiting:?}");
    assert!(
        waiting.2.contains("does not archive its WAL"),
        "{waiting:?}"
    );
    let ended = wait_backup_ended(&running.client, &namespace, "physical", BACKUP_TIMEOUT)
        .await
        .unwrap_or_else(|error| panic!("{error:#}"));
    let failed = reason_of(&ended);
    assert_eq!(failed.0, Some(BackupPhase::Failed), "{failed:?}");
    assert_eq!(failed.1.as_deref(), Some("PendingTimeout"), "{failed:?}");
    assert!(failed.2.contains("does not archive its WAL"), "{failed:?}");
    let stored = pgkube_testkit::list_objects(&bucket.client(), bucket.name(), "")
        .await
        .expect("listing");
    assert!(stored.is_empty(), "nothing stored: {stored:?}");
    cluster
        .delete(Duration::from_secs(120))
        .await
        .expect("cluster deleted");
    running.stop().await;
    bucket.cleanup().await;
}

/// Cluster `pg` of `replicas` instances whose backups (and WAL) go to `bucket`, with `change`
/// applied to its backup settings, once Running.
async fn start_cluster(
    running: &Running,
    env: &TestEnv,
    bucket: &TestBucket,
    replicas: i32,
    change: impl FnOnce(&mut BackupSpec),
) -> TestCluster {
    let namespace = running.namespace.name();
    create_s3_secret(&running.client, env, namespace, S3_SECRET, None)
        .await
        .expect("S3 Secret");
    let mut settings = backup_config(test_storage(env, bucket.name(), S3_SECRET), NEVER);
    change(&mut settings);
    TestCluster::builder("pg")
        .replicas(replicas)
        .spec(|spec| spec.backup = Some(settings))
        .timeout(CLUSTER_TIMEOUT)
        .start(&running.namespace)
        .await
        .unwrap_or_else(|error| panic!("the cluster becomes Running: {error:#}"))
}

/// The name of a replica the cluster's status shows ready and streaming.
async fn streaming_standby(cluster: &TestCluster) -> String {
    wait_until("a replica streams", CLUSTER_TIMEOUT, || async {
        let status = cluster.get().await?.status.unwrap_or_default();
        Ok(status
            .instances
            .into_iter()
            .find(|i| i.role == InstanceRole::Replica && i.ready && i.streaming == Some(true))
            .map(|i| i.name))
    })
    .await
    .expect("a streaming replica")
}

/// Creates PostgreSQLBackup `name` of `cluster`: method Physical, target `target`.
async fn create_physical_backup(
    running: &Running,
    cluster: &str,
    name: &str,
    target: Option<BackupTarget>,
) {
    let spec = PostgreSQLBackupSpec {
        cluster: LocalReference {
            name: cluster.to_owned(),
        },
        method: BackupMethod::Physical,
        target,
        deletion_policy: DeletionPolicy::Retain,
        compression: None,
    };
    running
        .api::<PostgreSQLBackup>()
        .create(&Default::default(), &PostgreSQLBackup::new(name, spec))
        .await
        .expect("backup created");
}

/// [`create_physical_backup`], once ended.
async fn physical_backup(
    running: &Running,
    cluster: &str,
    name: &str,
    target: Option<BackupTarget>,
) -> PostgreSQLBackup {
    create_physical_backup(running, cluster, name, target).await;
    let namespace = running.namespace.name();
    wait_backup_ended(&running.client, namespace, name, BACKUP_TIMEOUT)
        .await
        .unwrap_or_else(|error| panic!("{error:#}"))
}

/// Waits until the writer has committed `rows` rows.
async fn rows_written(count: &AtomicI64, rows: i64) {
    wait_until("the writer commits", Duration::from_secs(120), || async {
        Ok((count.load(Ordering::Relaxed) >= rows).then_some(()))
    })
    .await
    .expect("the writer writes");
}

/// Commits one row at a time on the primary until told to stop, recording the WAL position
/// around each, and counting them in `count`.
async fn write_until(
    sql: Client,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicI64>,
) -> anyhow::Result<Vec<Written>> {
    let position = "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint";
    let mut written = Vec::new();
    let mut id = 0i64;
    while !stop.load(Ordering::Relaxed) {
        id += 1;
        let before: i64 = sql.query_one(position, &[]).await?.get(0);
        sql.execute(
            "INSERT INTO writes VALUES ($1, repeat(md5($2), 20))",
            &[&id, &id.to_string()],
        )
        .await?;
        let after: i64 = sql.query_one(position, &[]).await?.get(0);
        written.push(Written { id, before, after });
        count.store(id, Ordering::Relaxed);
    }
    Ok(written)
}

/// Waits until the operator's retention pass after the backup deleted every archived segment
/// of its timeline before the backup's first one (the backup is the only, so the oldest, kept
/// physical backup).
async fn wait_wal_pruned_before(bucket: &TestBucket, physical: &PhysicalBackup) {
    let timeline = &physical.first_wal[..8];
    wait_until("WAL before the backup pruned", CLUSTER_TIMEOUT, || async {
        let files = archived_files(&bucket.client(), bucket.name(), &physical.wal_root).await?;
        let older: Vec<&String> = files
            .iter()
            .filter(|name| segment_number(name).is_some() && name.starts_with(timeline))
            .filter(|name| **name < physical.first_wal)
            .collect();
        Ok(older.is_empty().then_some(()))
    })
    .await
    .expect("the retention pass prunes the WAL before the backup");
}

/// Downloads the base backup into `data/` (checking its SHA-256 and that the files stored
/// beside it are those in the tar) and the WAL from the first segment to the last into `wal/`.
async fn restore_files(bucket: &TestBucket, physical: &PhysicalBackup, scratch: &ScratchServer) {
    let stored = bucket
        .object(&physical.base.key)
        .await
        .expect("base.tar.zst");
    assert_eq!(hex::encode(Sha256::digest(&stored)), physical.base.sha256);
    let tar = zstd::decode_all(stored.as_slice()).expect("zstd");
    let tar_path = scratch.root().join("base.tar");
    std::fs::write(&tar_path, tar).expect("base.tar written");
    let extracted = std::process::Command::new("tar")
        .arg("-xf")
        .arg(&tar_path)
        .arg("-C")
        .arg(scratch.data())
        .status()
        .expect("tar runs");
    assert!(extracted.success(), "tar -x");
    for object in [&physical.backup_label, &physical.backup_manifest] {
        let name = object.key.rsplit('/').next().expect("a name");
        let inside = std::fs::read(scratch.data().join(name)).expect("in the tar");
        let beside = bucket.object(&object.key).await.expect("stored");
        assert_eq!(inside, beside, "{name} as stored is the one in the tar");
        assert_eq!(hex::encode(Sha256::digest(&beside)), object.sha256);
    }
    let root = &physical.wal_root;
    let files = archived_files(&bucket.client(), bucket.name(), root)
        .await
        .expect("the archive");
    let timeline = &physical.first_wal[..8];
    let needed: Vec<&String> = files
        .iter()
        .filter(|name| name.len() == 24 && name.starts_with(timeline))
        .filter(|name| **name >= physical.first_wal && **name <= physical.last_wal)
        .collect();
    assert!(
        needed.first().is_some_and(|n| **n == physical.first_wal)
            && needed.last().is_some_and(|n| **n == physical.last_wal),
        "the archive holds {} to {}: {needed:?}",
        physical.first_wal,
        physical.last_wal
    );
    for name in needed {
        let key = format!("{root}{timeline}/{name}.zst");
        let segment =
            zstd::decode_all(bucket.object(&key).await.expect("segment").as_slice()).expect("zstd");
        std::fs::write(scratch.wal().join(name), segment).expect("segment written");
    }
}

/// Every table of the restore holds what the primary held at the backup's stop LSN: the static
/// table whole, and of the writer's rows exactly a prefix that contains every row committed
/// before the stop LSN and none begun after it, with the primary's content.
async fn compare_with_the_primary(
    primary: &Client,
    restored: &Client,
    written: &[Written],
    physical: &PhysicalBackup,
) {
    let items = digest_of(restored, "items", i64::MAX).await;
    assert_eq!(items, digest_of(primary, "items", i64::MAX).await);
    assert_eq!(items.0, 5000);

    let (count, last, restored_digest) = digest_of(restored, "writes", i64::MAX).await;
    assert_eq!(
        count, last,
        "the restored rows are 1 to {last}, with no gap"
    );
    let (_, _, primary_digest) = digest_of(primary, "writes", last).await;
    assert_eq!(
        restored_digest, primary_digest,
        "rows 1 to {last} as the primary has them"
    );
    let stop = lsn(&physical.stop_lsn);
    let committed_before = written
        .iter()
        .filter(|w| w.after <= stop)
        .map(|w| w.id)
        .max();
    let begun_after = written
        .iter()
        .filter(|w| w.before >= stop)
        .map(|w| w.id)
        .min();
    assert!(
        committed_before.is_some_and(|id| id <= last),
        "every row committed before the stop LSN is restored: {committed_before:?} > {last}"
    );
    assert!(
        begun_after.is_some_and(|id| id > last),
        "no row begun after the stop LSN is restored: {begun_after:?} <= {last}"
    );
    eprintln!(
        "restored rows 1 to {last} of {} written; stop LSN {}, WAL {} to {}",
        written.len(),
        physical.stop_lsn,
        physical.first_wal,
        physical.last_wal
    );
}

/// The rows of `table` with an id up to `limit`: how many, the largest id, and an MD5 of them
/// all in id order.
async fn digest_of(sql: &Client, table: &str, limit: i64) -> (i64, i64, String) {
    let query = format!(
        "SELECT count(*), coalesce(max(id)::bigint, 0), \
         coalesce(md5(string_agg(t::text, ',' ORDER BY id)), '') FROM {table} t \
         WHERE id::bigint <= $1"
    );
    let row = sql
        .query_one(&query, &[&limit])
        .await
        .unwrap_or_else(|error| panic!("digest of {table}: {error}"));
    (row.get(0), row.get(1), row.get(2))
}

/// An LSN as PostgreSQL prints it (`0/2000028`), as a number.
fn lsn(text: &str) -> i64 {
    let (high, low) = text.split_once('/').expect("an LSN");
    let high = i64::from_str_radix(high, 16).expect("hex");
    let low = i64::from_str_radix(low, 16).expect("hex");
    (high << 32) | low
}
