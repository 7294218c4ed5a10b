//! End to end on the test bed's real node: continuous WAL archiving of a PostgreSQL 15 cluster
//! to the real Garage. The primary's instance manager stores every WAL file PostgreSQL
//! finishes; the cluster's status says how it goes.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use common::Running;
use common::real_node::{CLUSTER_TIMEOUT, Fixture, NEVER, RESYNC, S3_SECRET};
use pgkube_controllers::storage::wal::ArchiveOwner;
use pgkube_crds::{CONTINUOUS_ARCHIVING, PostgreSQLCluster, S3Storage};
use pgkube_testkit::proxy::Proxy;
use pgkube_testkit::wal::{
    archived_files, finish_segments, segment_name, segment_number, wait_archived_through,
};
use pgkube_testkit::{
    TestBucket, TestCluster, backup_config, condition, create_s3_secret, http_get,
    instance_manager_of, send_signal, server_started_at, test_storage, wait_until,
};
use sha2::{Digest, Sha256};

/// How long a finished WAL file may take to reach the archive, the manager's restart included.
const ARCHIVED_WITHIN: Duration = Duration::from_secs(240);

/// The archive's root of cluster `pg` with the default prefix in `namespace`.
fn default_root(namespace: &str) -> String {
    format!("{namespace}/pg/wal/pg/")
}

#[tokio::test]
async fn a_burst_of_wal_reaches_the_archive_without_a_gap_though_the_manager_is_killed_mid_way() {
    let Some(fixture) = Fixture::start("wal-burst").await else {
        return;
    };
    let root = default_root(fixture.namespace());
    let sql = fixture.cluster.sql().await.expect("SQL");
    finish_segments(&sql, 120).await.expect("first half");
    let started = server_started_at(&sql).await.expect("the start time");
    // Killed while it uploads what the first half finished: its children go with it.
    let primary = primary_of(&fixture.cluster).await;
    let manager = instance_manager_of(fixture.namespace(), &primary).expect("the manager runs");
    send_signal(manager, "KILL").expect("killed");
    drop(sql);
    // The old server may still accept a connection for a moment before the kill reaches it.
    let sql = wait_until("a new server is the primary", CLUSTER_TIMEOUT, || async {
        let Ok(sql) = fixture.cluster.sql().await else {
            return Ok(None);
        };
        let restarted = server_started_at(&sql).await.is_ok_and(|at| at != started);
        Ok(restarted.then_some(sql))
    })
    .await
    .expect("the primary is back");
    let last = finish_segments(&sql, 100).await.expect("second half");
    let last_number = segment_number(&last).expect("a segment");
    assert!(last_number >= 220, "{last}");

    wait_archived_through(&sql, &last, ARCHIVED_WITHIN)
        .await
        .expect("every segment archived");
    let s3 = fixture.bucket.client();
    let files = archived_files(&s3, fixture.bucket.name(), &root)
        .await
        .expect("the archive lists");
    let missing: Vec<String> = (1..=last_number)
        .map(|number| segment_name(1, number))
        .filter(|name| !files.contains(name))
        .collect();
    assert!(missing.is_empty(), "no gap in the archive: {missing:?}");

    let system_identifier = fixture_status(&fixture)
        .await
        .and_then(|status| status.system_identifier)
        .expect("the system identifier is recorded");
    let owner: ArchiveOwner = serde_json::from_slice(
        &fixture
            .bucket
            .object(&format!("{root}archive.json"))
            .await
            .expect("the owner record"),
    )
    .expect("an owner record");
    assert_eq!(owner.system_identifier, system_identifier);
    assert_eq!(owner.cluster_uid, fixture.cluster_uid);

    // What is stored is the segment, whole: 16 MiB once decompressed, with the digest recorded.
    let key = format!("{root}00000001/{last}.zst");
    let stored = fixture.bucket.object(&key).await.expect("the segment");
    let segment = zstd::decode_all(stored.as_slice()).expect("zstd");
    assert_eq!(segment.len(), 16 << 20);
    let head = s3
        .head_object()
        .bucket(fixture.bucket.name())
        .key(&key)
        .send()
        .await
        .expect("HEAD");
    let recorded = head
        .metadata()
        .and_then(|m| m.get("pgkube-sha256"))
        .cloned();
    assert_eq!(recorded, Some(hex::encode(Sha256::digest(&segment))));

    let cluster = wait_until(
        "the status names the last segment",
        ARCHIVED_WITHIN,
        || async {
            let cluster = fixture.cluster.get().await?;
            let archived = cluster
                .status
                .as_ref()
                .and_then(|s| s.wal_archiving.as_ref())
                .and_then(|w| w.last_archived.clone());
            Ok((archived >= Some(last.clone())).then_some(cluster))
        },
    )
    .await
    .expect("status.walArchiving");
    let archiving = condition(&cluster, CONTINUOUS_ARCHIVING).expect("the condition");
    assert_eq!(archiving.status, "True", "{archiving:?}");

    // The primary's manager counts what it archived since its restart, for Prometheus.
    let primary = primary_of(&fixture.cluster).await;
    let pods = fixture.cluster.pods().await.expect("pods");
    let address = pods
        .iter()
        .find(|pod| pod.name == primary)
        .and_then(|pod| pod.address)
        .expect("the primary's address");
    let (code, metrics) = http_get(SocketAddr::new(address, 8000), "/metrics")
        .await
        .expect("GET /metrics");
    assert_eq!(code, 200, "{metrics}");
    let archived: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("pgkube_wal_archived_files_total "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("the archived count in {metrics}"));
    assert!(archived >= 100, "the second half at least: {archived}");
    assert!(metrics.contains("pgkube_wal_waiting_files "), "{metrics}");
    fixture.stop().await;
}

#[tokio::test]
async fn the_archive_stops_while_the_store_is_down_and_catches_up_after_with_nothing_missing() {
    let env = match pgkube_testkit::testbed() {
        Some(env) => env,
        None => return,
    };
    let proxy = Proxy::tcp(
        env.s3_endpoint
            .trim_start_matches("http://")
            .parse()
            .expect("the store's address"),
    )
    .await;
    let endpoint = format!("http://{}", proxy.address);
    let Some(fixture) =
        Fixture::start_with("wal-outage", |storage| storage.endpoint = Some(endpoint)).await
    else {
        return;
    };
    let root = default_root(fixture.namespace());
    let sql = fixture.cluster.sql().await.expect("SQL");
    let before = finish_segments(&sql, 3).await.expect("segments");
    wait_for_archiving(&fixture.cluster, "True").await;

    proxy.stop_server();
    let during = finish_segments(&sql, 5).await.expect("writes go on");
    let failing = wait_for_archiving(&fixture.cluster, "False").await;
    assert_eq!(failing.reason, "ArchiveFailing", "{failing:?}");
    // Two minutes of writes with the store down.
    let mut last = during;
    let outage = tokio::time::Instant::now();
    while outage.elapsed() < Duration::from_secs(120) {
        last = finish_segments(&sql, 2).await.expect("writes go on");
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    proxy.start_server();

    let recovered = wait_for_archiving(&fixture.cluster, "True").await;
    assert_eq!(recovered.reason, "Archiving");
    let s3 = fixture.bucket.client();
    wait_archived_through(&sql, &last, ARCHIVED_WITHIN)
        .await
        .expect("the backlog is archived");
    let files = archived_files(&s3, fixture.bucket.name(), &root)
        .await
        .expect("the archive lists");
    let first = segment_number(&before).expect("a segment");
    let missing: Vec<u64> = (first..=segment_number(&last).expect("a segment"))
        .filter(|number| !files.contains(&segment_name(1, *number)))
        .collect();
    assert!(missing.is_empty(), "nothing missing: {missing:?}");
    fixture.stop().await;
}

#[tokio::test]
async fn a_second_cluster_of_the_same_name_on_the_same_prefix_is_refused() {
    let shared = "shared-prefix";
    let Some(first) =
        Fixture::start_with("wal-first", |storage| storage.prefix = Some(shared.into())).await
    else {
        return;
    };
    let sql = first.cluster.sql().await.expect("SQL");
    finish_segments(&sql, 1).await.expect("a segment");
    wait_for_archiving(&first.cluster, "True").await;

    let Some(second) = Running::start("wal-second", RESYNC).await else {
        return;
    };
    let env = pgkube_testkit::testbed().expect("the test bed");
    create_s3_secret(
        &second.client,
        &env,
        second.namespace.name(),
        S3_SECRET,
        None,
    )
    .await
    .expect("S3 Secret");
    let storage = S3Storage {
        prefix: Some(shared.into()),
        ..test_storage(&env, first.bucket.name(), S3_SECRET)
    };
    let intruder = TestCluster::builder("pg")
        .spec(|spec| spec.backup = Some(backup_config(storage, NEVER)))
        .timeout(CLUSTER_TIMEOUT)
        .start(&second.namespace)
        .await
        .expect("the second cluster runs");
    let sql = intruder.sql().await.expect("SQL");
    finish_segments(&sql, 1).await.expect("a segment");
    let refused = wait_for_archiving(&intruder, "False").await;
    assert_eq!(refused.reason, "ArchiveOwnedByAnother", "{refused:?}");
    assert!(refused.message.contains("another prefix"), "{refused:?}");

    // The archive is still the first cluster's, and only its WAL is in it.
    let root = format!("{shared}/wal/pg/");
    let owner: ArchiveOwner = serde_json::from_slice(
        &first
            .bucket
            .object(&format!("{root}archive.json"))
            .await
            .expect("the owner record"),
    )
    .expect("an owner record");
    assert_eq!(owner.cluster_uid, first.cluster_uid);
    let sql = first.cluster.sql().await.expect("SQL");
    let last = finish_segments(&sql, 1).await.expect("a segment");
    let s3 = first.bucket.client();
    wait_until("the first cluster archives on", ARCHIVED_WITHIN, || async {
        let files: BTreeSet<String> = archived_files(&s3, first.bucket.name(), &root).await?;
        Ok(files.contains(&last).then_some(()))
    })
    .await
    .expect("the first cluster archives on");
    intruder
        .delete(Duration::from_secs(120))
        .await
        .expect("second cluster deleted");
    second.stop().await;
    first.stop().await;
}

/// A switchover loses nothing from the archive: the old primary's finished segments are there,
/// the new primary archives the old timeline's last segment as `.partial`, the new timeline's
/// history file and its segments, and the status names it.
#[tokio::test]
async fn after_a_switchover_the_new_primary_archives_and_nothing_is_lost() {
    let Some(running) = Running::start("wal-switchover", RESYNC).await else {
        return;
    };
    let env = pgkube_testkit::testbed().expect("the test bed");
    let bucket = TestBucket::create(&env, "wal-switchover").await;
    create_s3_secret(
        &running.client,
        &env,
        running.namespace.name(),
        S3_SECRET,
        None,
    )
    .await
    .expect("S3 Secret");
    let storage = test_storage(&env, bucket.name(), S3_SECRET);
    let (cluster, old) = TestCluster::builder("pg")
        .replicas(2)
        .spec(|spec| spec.backup = Some(backup_config(storage, NEVER)))
        .timeout(CLUSTER_TIMEOUT)
        .start_healthy(&running.namespace, "SELECT 1", CLUSTER_TIMEOUT)
        .await
        .expect("a healthy cluster");
    let sql = cluster.sql().await.expect("SQL");
    finish_segments(&sql, 3).await.expect("segments");
    let in_progress: String = sql
        .query_one("SELECT pg_walfile_name(pg_current_wal_lsn())", &[])
        .await
        .expect("the current segment")
        .get(0);
    drop(sql);
    wait_for_archiving(&cluster, "True").await;

    let target = if old.ends_with("-0") {
        old.replace("-0", "-1")
    } else {
        old.replace("-1", "-0")
    };
    cluster
        .api()
        .patch(
            "pg",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({
                "metadata": {"annotations": {"db.example.com/switchover-to": target}}
            })),
        )
        .await
        .expect("annotated");
    cluster
        .wait_healthy(Some(&target), CLUSTER_TIMEOUT)
        .await
        .expect("the switchover completes");
    let sql = cluster.sql().await.expect("SQL on the new primary");
    let last = finish_segments(&sql, 2).await.expect("segments");
    assert!(last.starts_with("00000002"), "a new timeline: {last}");

    let root = default_root(running.namespace.name());
    let s3 = bucket.client();
    wait_archived_through(&sql, &last, ARCHIVED_WITHIN)
        .await
        .expect("the new primary archives");
    let files = archived_files(&s3, bucket.name(), &root)
        .await
        .expect("the archive lists");
    // Where timeline 1 ended, as the archived history file says: `1<TAB>0/7000060<TAB>...`.
    let history = bucket
        .object(&format!("{root}00000002/00000002.history.zst"))
        .await
        .expect("the history file");
    let history =
        String::from_utf8(zstd::decode_all(history.as_slice()).expect("zstd")).expect("text");
    let switch = switch_segment(&history).expect("a switch point");
    assert!(switch >= segment_number(&in_progress).expect("a segment"));
    let missing: Vec<String> = (1..switch)
        .map(|number| segment_name(1, number))
        .chain(["00000002.history".to_owned()])
        .chain((switch..=segment_number(&last).expect("a segment")).map(|n| segment_name(2, n)))
        .filter(|name| !files.contains(name))
        .collect();
    assert!(missing.is_empty(), "{missing:?} missing from {files:?}");
    let old_timeline_end = segment_name(1, switch);
    assert!(
        files.contains(&old_timeline_end) || files.contains(&format!("{old_timeline_end}.partial")),
        "the old timeline's last segment: {files:?}"
    );
    let found = wait_until(
        "the status names the new primary",
        ARCHIVED_WITHIN,
        || async {
            let found = cluster.get().await?;
            let instance = found
                .status
                .as_ref()
                .and_then(|s| s.wal_archiving.as_ref())
                .and_then(|w| w.instance.clone());
            Ok((instance.as_deref() == Some(target.as_str())).then_some(found))
        },
    )
    .await
    .expect("status.walArchiving.instance");
    let archiving = condition(&found, CONTINUOUS_ARCHIVING).expect("the condition");
    assert_eq!(archiving.status, "True", "{archiving:?}");
    cluster
        .delete(Duration::from_secs(120))
        .await
        .expect("cluster deleted");
    running.stop().await;
    bucket.cleanup().await;
}

/// The segment where the history file says timeline 1 ended.
fn switch_segment(history: &str) -> Option<u64> {
    let lsn = history
        .lines()
        .find(|l| l.starts_with('1'))?
        .split('\t')
        .nth(1)?;
    let (high, low) = lsn.split_once('/')?;
    let lsn = (u64::from_str_radix(high, 16).ok()? << 32) + u64::from_str_radix(low, 16).ok()?;
    Some(lsn / (16 << 20))
}

/// The bucket-level rules every archiver relies on, against the real Garage: a file stored
/// again with the same content is success, another content under its name is refused and the
/// stored one kept, and an archive is claimed by one owner.
#[tokio::test]
async fn a_stored_wal_file_is_never_overwritten_and_an_archive_has_one_owner() {
    use pgkube_controllers::storage::S3Bucket;
    use pgkube_controllers::storage::wal::{
        PreparedFile, Stored, WalArchiveError, WalFileName, claim, store_file,
    };
    let Some(env) = pgkube_testkit::testbed() else {
        return;
    };
    let bucket = TestBucket::create(&env, "wal-rules").await;
    let store = S3Bucket::with_client(bucket.client(), bucket.name());
    let prepared = |content: &[u8]| PreparedFile {
        compressed: zstd::encode_all(content, 1).expect("zstd").into(),
        sha256: hex::encode(Sha256::digest(content)),
        size: content.len() as u64,
    };
    let key = WalFileName::parse("000000010000000000000007")
        .expect("a WAL file")
        .key("rules/");
    let original = prepared(&[7u8; 4096]);
    assert_eq!(
        store_file(&store, &key, &original).await.expect("stored"),
        Stored::Written
    );
    assert_eq!(
        store_file(&store, &key, &original).await.expect("again"),
        Stored::AlreadyThere
    );
    let other = prepared(&[8u8; 4096]);
    let conflict = store_file(&store, &key, &other).await;
    assert!(
        matches!(conflict, Err(WalArchiveError::Conflict { .. })),
        "{conflict:?}"
    );
    let kept = bucket.object(&key).await.expect("the object");
    assert_eq!(
        zstd::decode_all(kept.as_slice()).expect("zstd"),
        [7u8; 4096]
    );

    let owner = ArchiveOwner {
        system_identifier: "7312345678901234567".into(),
        cluster_uid: "uid-1".into(),
        cluster: "ns/pg".into(),
    };
    claim(&store, "rules/", &owner).await.expect("claimed");
    claim(&store, "rules/", &owner)
        .await
        .expect("claimed again");
    let other_system = ArchiveOwner {
        system_identifier: "7399999999999999999".into(),
        ..owner.clone()
    };
    let refused = claim(&store, "rules/", &other_system).await;
    assert!(
        matches!(refused, Err(WalArchiveError::NotOurs { .. })),
        "{refused:?}"
    );
    bucket.cleanup().await;
}

async fn primary_of(cluster: &TestCluster) -> String {
    cluster
        .current_primary()
        .await
        .expect("the cluster")
        .expect("a primary")
}

async fn fixture_status(fixture: &Fixture) -> Option<pgkube_crds::PostgreSQLClusterStatus> {
    fixture.cluster.get().await.ok()?.status
}

/// The `ContinuousArchiving` condition once its status is `status`.
async fn wait_for_archiving(
    cluster: &TestCluster,
    status: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    wait_until(
        &format!("ContinuousArchiving {status}"),
        ARCHIVED_WITHIN,
        || async {
            let found: PostgreSQLCluster = cluster.get().await?;
            Ok(condition(&found, CONTINUOUS_ARCHIVING).filter(|c| c.status == status))
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}"))
}

/// A primary that just started switches and archives its first WAL file within
/// `archive_timeout` (60 s), not at its first checkpoint: PostgreSQL's checkpointer, started
/// while the server itself was starting, sleeps a whole `checkpoint_timeout` (5 min) before it
/// first looks at `archive_timeout`, unless something wakes it (the manager's reload does).
#[tokio::test]
async fn a_primary_that_just_started_archives_its_first_file_within_archive_timeout() {
    let Some(running) = Running::start("wal-first-file", RESYNC).await else {
        return;
    };
    let env = pgkube_testkit::testbed().expect("the test bed");
    let bucket = TestBucket::create(&env, "first-file").await;
    create_s3_secret(
        &running.client,
        &env,
        running.namespace.name(),
        S3_SECRET,
        None,
    )
    .await
    .expect("S3 Secret");
    let storage = test_storage(&env, bucket.name(), S3_SECRET);
    let cluster = TestCluster::builder("pg")
        .spec(|spec| spec.backup = Some(backup_config(storage, NEVER)))
        .timeout(CLUSTER_TIMEOUT)
        .start(&running.namespace)
        .await
        .expect("the cluster runs");
    let sql = cluster.sql().await.expect("SQL");
    sql.batch_execute("CREATE TABLE first (id int); INSERT INTO first VALUES (1)")
        .await
        .expect("a write");
    // Well under the 5 minutes the server alone takes, well over its 60 s.
    wait_until(
        "the first WAL file archived",
        Duration::from_secs(150),
        || async {
            let archived: i64 = sql
                .query_one("SELECT archived_count FROM pg_stat_archiver", &[])
                .await?
                .get(0);
            Ok((archived > 0).then_some(()))
        },
    )
    .await
    .expect("archived within archive_timeout");
    cluster
        .delete(Duration::from_secs(120))
        .await
        .expect("cluster deleted");
    running.stop().await;
    bucket.cleanup().await;
}

/// Storage without keys: the pods run as the cluster's ServiceAccount, get no key files, and
/// archive with their identity. The test bed gives pods no identity (no AWS), so the archiver
/// finds no credentials and the status says so, while the database runs on.
#[tokio::test]
async fn a_cluster_without_keys_runs_as_its_account_and_says_it_has_no_credentials() {
    use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
    use kube::api::{Api, PostParams};
    let Some(running) = Running::start("wal-identity", RESYNC).await else {
        return;
    };
    let env = pgkube_testkit::testbed().expect("the test bed");
    let bucket = TestBucket::create(&env, "identity").await;
    let namespace = running.namespace.name();
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "wal-writer"}}))
            .expect("a ServiceAccount");
    Api::<ServiceAccount>::namespaced(running.client.clone(), namespace)
        .create(&PostParams::default(), &account)
        .await
        .expect("the ServiceAccount");
    let storage = S3Storage {
        credentials: None,
        ..test_storage(&env, bucket.name(), S3_SECRET)
    };
    let cluster = TestCluster::builder("pg")
        .spec(|spec| {
            spec.backup = Some(backup_config(storage, NEVER));
            spec.service_account_name = Some("wal-writer".to_owned());
        })
        .timeout(CLUSTER_TIMEOUT)
        .start(&running.namespace)
        .await
        .expect("the cluster runs without keys");
    let pods = Api::<Pod>::namespaced(running.client.clone(), namespace);
    for instance in cluster.pods().await.expect("the pods") {
        let pod = pods.get(&instance.name).await.expect("the pod");
        let spec = pod.spec.expect("a pod spec");
        assert_eq!(spec.service_account_name.as_deref(), Some("wal-writer"));
        let s3 = spec
            .volumes
            .iter()
            .flatten()
            .find(|volume| volume.name == "s3")
            .and_then(|volume| volume.projected.clone())
            .expect("the S3 volume");
        assert_eq!(s3.sources.unwrap_or_default(), [], "no key files");
    }
    let sql = cluster.sql().await.expect("SQL");
    finish_segments(&sql, 1).await.expect("a segment");
    let refused = wait_for_archiving(&cluster, "False").await;
    assert!(
        refused.message.to_ascii_lowercase().contains("credential"),
        "{refused:?}"
    );
    sql.batch_execute("CREATE TABLE still_writable (id int)")
        .await
        .expect("the primary takes writes");
    cluster
        .delete(Duration::from_secs(120))
        .await
        .expect("cluster deleted");
    running.stop().await;
    bucket.cleanup().await;
}
