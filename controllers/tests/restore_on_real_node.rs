//! End to end on the test bed's real node: PostgreSQLRestores of real backups of a running
//! PostgreSQL 15 cluster, and new clusters bootstrapped from them. Backups and restores really
//! run (`pgkube agent backup` and `pgkube agent restore` Jobs on the real node) against the real
//! Garage. Each test has its own namespace, bucket and backed-up cluster; a restore's outcome
//! is checked on the data itself, by digests (row counts and content checksums of every table
//! of every database) taken before and after.

mod common;
mod restore_common;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{ListParams, LogParams, Patch, PatchParams};
use pgkube_crds::{
    Bootstrap, ClusterPhase, LocalReference, PostgreSQLBackup, PostgreSQLCluster,
    PostgreSQLRestore, RestorePhase, RestoreSource,
};
use pgkube_testkit::{
    RESTORE_CONDITION, RESTORE_LABEL, TestCluster, condition, describe_cluster, describe_restore,
    put_object, restore_condition, restore_jobs, restore_of_backup, restore_of_source,
    restore_reason, wait_for_cluster, wait_restore, wait_until,
};
use restore_common::{
    BOOTSTRAP_TIMEOUT, CLUSTER_TIMEOUT, Fixture, NEVER, TICK, assert_refused, digest_of, phase,
    with_drop_existing,
};

#[tokio::test]
async fn a_restore_brings_back_exactly_the_data_of_the_backup_time() {
    let Some(fixture) = Fixture::start("restore-e2e").await else {
        return;
    };
    let before = fixture.digest().await;
    // `app` is the cluster's application database, empty.
    assert_eq!(
        before.keys().map(String::as_str).collect::<Vec<_>>(),
        ["app", "postgres", "shop"],
        "{before:?}"
    );
    assert_eq!(before["postgres"]["public.items"].rows, 1000);
    let backup = fixture.backup("before-damage").await;
    let (manifest_key, manifest) = fixture.manifest(&backup).await;

    // Damage: a table dropped, rows changed, removed and added, a table added, in both
    // databases.
    fixture
        .cluster
        .sql()
        .await
        .expect("SQL")
        .batch_execute(
            "DROP TABLE notes;
             UPDATE items SET name = 'changed' WHERE id <= 10;
             DELETE FROM items WHERE id > 900;
             CREATE TABLE scratch (x int);",
        )
        .await
        .expect("damage in postgres");
    fixture
        .cluster
        .sql_to("shop")
        .await
        .expect("SQL to shop")
        .batch_execute(
            "INSERT INTO orders VALUES (1001, 'late', 1);
             UPDATE orders SET total = 0 WHERE id = 1;",
        )
        .await
        .expect("damage in shop");
    assert_ne!(fixture.digest().await, before, "the damage shows");

    fixture
        .restore(
            "undo",
            with_drop_existing(restore_of_backup("before-damage", "pg")),
        )
        .await;
    let restore = fixture.restore_ended("undo").await;
    assert_eq!(
        phase(&restore),
        Some(RestorePhase::Completed),
        "{}",
        describe_restore(&restore)
    );
    let shown = restore_condition(&restore, RESTORE_CONDITION).expect("Completed condition");
    assert_eq!(
        (shown.status.as_str(), shown.reason.as_str()),
        ("True", "Completed")
    );
    let status = restore.status.clone().expect("status");
    assert_eq!(
        status.restored_object_key.as_deref(),
        Some(manifest_key.as_str())
    );
    let mut restored = status.restored_databases.clone();
    restored.sort();
    let mut backed_up: Vec<String> = manifest.databases.iter().map(|d| d.name.clone()).collect();
    backed_up.sort();
    assert_eq!(restored, backed_up, "every database of the backup");
    let (started, completed) = (
        status.start_time.clone().expect("start time"),
        status.completion_time.clone().expect("completion time"),
    );
    assert!(
        started.0 <= completed.0,
        "started {started:?}, completed {completed:?}"
    );

    // The Job, as the restore controller makes it.
    assert_eq!(status.job_name.as_deref(), Some("undo-restore"));
    let job = fixture
        .running
        .api::<Job>()
        .get("undo-restore")
        .await
        .expect("job");
    let labels = job.labels();
    for (key, value) in [
        ("app.kubernetes.io/component", "restore"),
        ("db.example.com/restore", "undo"),
        ("db.example.com/cluster", "pg"),
    ] {
        assert_eq!(
            labels.get(key).map(String::as_str),
            Some(value),
            "{labels:?}"
        );
    }
    let owners = job.owner_references();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(
        (owners[0].kind.as_str(), owners[0].name.as_str()),
        ("PostgreSQLRestore", "undo")
    );
    assert_eq!(Some(&owners[0].uid), restore.metadata.uid.as_ref());

    // The data is the backup's, exactly: the dropped table back, the changes undone, the
    // table made after the backup gone.
    assert_eq!(fixture.digest().await, before);
    fixture
        .wait_cluster_condition("pg", "Restoring", "False", "RestoreCompleted")
        .await;
    fixture.stop().await;
}

#[tokio::test]
async fn a_corrupted_backup_object_fails_the_restore_naming_it_and_changes_nothing() {
    let Some(fixture) = Fixture::start("restore-corrupt").await else {
        return;
    };
    let backup = fixture.backup("good").await;
    let (_, manifest) = fixture.manifest(&backup).await;
    let shop_key = manifest
        .databases
        .iter()
        .find(|database| database.name == "shop")
        .map(|database| database.object.key.clone())
        .expect("shop is in the backup");
    // Same size, one byte changed: only the checksum can tell.
    let mut bytes = fixture.bucket.object(&shop_key).await.expect("shop dump");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    put_object(
        &fixture.bucket.client(),
        fixture.bucket.name(),
        &shop_key,
        bytes,
    )
    .await
    .expect("dump corrupted");
    // Changes after the backup, which a restore would undo.
    fixture
        .cluster
        .sql()
        .await
        .expect("SQL")
        .batch_execute("INSERT INTO items VALUES (1001, 'after the backup')")
        .await
        .expect("change in postgres");
    fixture
        .cluster
        .sql_to("shop")
        .await
        .expect("SQL to shop")
        .batch_execute("DELETE FROM orders WHERE id = 200")
        .await
        .expect("change in shop");
    let before = fixture.digest().await;

    fixture
        .restore(
            "from-corrupted",
            with_drop_existing(restore_of_backup("good", "pg")),
        )
        .await;
    let restore = fixture.restore_ended("from-corrupted").await;
    assert_eq!(
        phase(&restore),
        Some(RestorePhase::Failed),
        "{}",
        describe_restore(&restore)
    );
    assert_eq!(
        restore_reason(&restore).as_deref(),
        Some("JobFailed"),
        "{}",
        describe_restore(&restore)
    );
    let message = restore
        .status
        .clone()
        .and_then(|s| s.message)
        .unwrap_or_default();
    assert!(
        message.contains(&shop_key) && message.contains("does not match the manifest"),
        "the message names the corrupted object {shop_key}: {message}"
    );
    assert!(
        restore
            .status
            .as_ref()
            .is_some_and(|s| s.completion_time.is_some()),
        "{}",
        describe_restore(&restore)
    );
    assert_eq!(
        fixture.digest().await,
        before,
        "a restore that fails verification changes nothing"
    );
    fixture
        .wait_cluster_condition("pg", "Restoring", "False", "RestoreFailed")
        .await;
    fixture.stop().await;
}

/// The system identifier cluster `name` has recorded in its status.
async fn recorded_system_identifier(fixture: &Fixture, name: &str) -> String {
    let cluster = wait_for_cluster(
        fixture.client(),
        fixture.namespace(),
        name,
        "status.systemIdentifier recorded",
        Duration::from_secs(60),
        |cluster| {
            cluster
                .status
                .as_ref()
                .is_some_and(|s| s.system_identifier.is_some())
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));
    cluster
        .status
        .and_then(|s| s.system_identifier)
        .expect("recorded")
}

/// The arguments of the agent in restore `name`'s Job.
async fn restore_job_arguments(fixture: &Fixture, name: &str) -> Vec<String> {
    let job = fixture
        .running
        .api::<Job>()
        .get(&format!("{name}-restore"))
        .await
        .expect("the restore's Job");
    let pod = job.spec.and_then(|spec| spec.template.spec).expect("pod");
    pod.containers[0].args.clone().unwrap_or_default()
}

#[tokio::test]
async fn a_restore_runs_only_into_the_database_it_expects() {
    let Some(fixture) = Fixture::start("restore-identity").await else {
        return;
    };
    let at_backup = fixture.digest().await;
    fixture.backup("before-writes").await;
    // Rows written after the backup: a restore that runs would remove them.
    fixture
        .cluster
        .sql()
        .await
        .expect("SQL")
        .batch_execute("INSERT INTO items VALUES (1001, 'after the backup')")
        .await
        .expect("row written after the backup");
    let after_writes = fixture.digest().await;
    assert_ne!(after_writes, at_backup, "the new row shows");
    let recorded = recorded_system_identifier(&fixture, "pg").await;
    let wrong = "1";
    assert_ne!(recorded, wrong);

    // Another database than the one expected: the agent refuses before it drops anything.
    let mut spec = with_drop_existing(restore_of_backup("before-writes", "pg"));
    spec.expected_system_identifier = Some(wrong.to_owned());
    fixture.restore("wrong-target", spec).await;
    let refused = fixture.restore_ended("wrong-target").await;
    assert_eq!(
        phase(&refused),
        Some(RestorePhase::Failed),
        "{}",
        describe_restore(&refused)
    );
    assert_eq!(
        restore_reason(&refused).as_deref(),
        Some("SystemIdentifierMismatch"),
        "{}",
        describe_restore(&refused)
    );
    let status = refused.status.clone().unwrap_or_default();
    assert_eq!(status.target_system_identifier.as_deref(), Some(wrong));
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains(&recorded) && message.contains(&format!("expected {wrong}")),
        "the message names both identifiers: {message}"
    );
    assert_eq!(
        restore_job_arguments(&fixture, "wrong-target").await,
        ["--drop-existing", "--expect-system-identifier", wrong]
    );
    assert_eq!(
        fixture.digest().await,
        after_writes,
        "a refused restore changes nothing: the row written after the backup is still there"
    );
    fixture
        .wait_cluster_condition("pg", "Restoring", "False", "RestoreFailed")
        .await;

    // Without an expectation: the database the cluster recorded, checked, then restored.
    fixture
        .restore(
            "recorded-target",
            with_drop_existing(restore_of_backup("before-writes", "pg")),
        )
        .await;
    let restored = fixture.restore_ended("recorded-target").await;
    assert_eq!(
        phase(&restored),
        Some(RestorePhase::Completed),
        "{}",
        describe_restore(&restored)
    );
    assert_eq!(
        restored
            .status
            .as_ref()
            .and_then(|s| s.target_system_identifier.as_deref()),
        Some(recorded.as_str()),
        "{}",
        describe_restore(&restored)
    );
    assert_eq!(
        restore_job_arguments(&fixture, "recorded-target").await,
        [
            "--drop-existing",
            "--expect-system-identifier",
            recorded.as_str()
        ]
    );
    assert_eq!(fixture.digest().await, at_backup, "the backup's data");
    fixture.stop().await;
}

#[tokio::test]
async fn a_restore_into_a_cluster_not_made_yet_waits_for_it_then_restores() {
    let Some(fixture) = Fixture::start("restore-later").await else {
        return;
    };
    let before = fixture.digest().await;
    fixture.backup("source").await;
    let mut spec = restore_of_backup("source", "later");
    spec.databases = vec!["shop".to_owned()];
    fixture.restore("into-later", spec).await;
    let waiting = wait_restore(
        fixture.client(),
        fixture.namespace(),
        "into-later",
        "Pending, reason ClusterNotFound",
        Duration::from_secs(60),
        |restore| {
            phase(restore) == Some(RestorePhase::Pending)
                && restore_reason(restore).as_deref() == Some("ClusterNotFound")
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));
    assert_eq!(
        restore_condition(&waiting, RESTORE_CONDITION).map(|c| c.status),
        Some("False".to_owned())
    );
    assert!(
        restore_jobs(fixture.client(), fixture.namespace(), "into-later")
            .await
            .expect("jobs")
            .is_empty(),
        "no Job while the cluster is missing"
    );

    let later = TestCluster::builder("later")
        .timeout(CLUSTER_TIMEOUT)
        .start(&fixture.running.namespace)
        .await
        .unwrap_or_else(|error| panic!("the cluster becomes Running: {error:#}"));
    let restore = fixture.restore_ended("into-later").await;
    assert_eq!(
        phase(&restore),
        Some(RestorePhase::Completed),
        "{}",
        describe_restore(&restore)
    );
    assert_eq!(
        restore
            .status
            .clone()
            .unwrap_or_default()
            .restored_databases,
        ["shop"],
        "only the database asked for"
    );
    let restored = digest_of(&later).await;
    assert_eq!(
        restored.get("shop"),
        before.get("shop"),
        "shop as backed up"
    );
    assert!(
        restored
            .get("postgres")
            .is_some_and(|tables| tables.is_empty()),
        "database postgres was not restored: {restored:?}"
    );
    fixture.stop().await;
}

/// Watches cluster `name`, bootstrapped from a backup, until it is Running and Ready: it must
/// never be Running or Ready while its bootstrap restore has not completed. Returns the cluster,
/// its bootstrap restore, and whether it was seen Bootstrapping (Ready False reason
/// Bootstrapping with Bootstrapped False reason Restoring).
async fn watch_bootstrap(
    fixture: &Fixture,
    name: &str,
) -> anyhow::Result<(PostgreSQLCluster, PostgreSQLRestore, bool)> {
    let clusters = fixture.running.clusters();
    let restores = fixture.running.api::<PostgreSQLRestore>();
    let restore_name = format!("{name}-bootstrap");
    let deadline = tokio::time::Instant::now() + BOOTSTRAP_TIMEOUT;
    let mut seen_bootstrapping = false;
    loop {
        // The cluster first: if it shows Running, its restore had completed before.
        let cluster = clusters.get(name).await?;
        let restore = restores.get_opt(&restore_name).await?;
        let restore_phase = restore.as_ref().and_then(phase);
        let cluster_phase = cluster.status.as_ref().and_then(|s| s.phase);
        let is = |type_: &str, status: &str, reason: &str| {
            condition(&cluster, type_).is_some_and(|c| c.status == status && c.reason == reason)
        };
        let ready = condition(&cluster, "Ready").is_some_and(|c| c.status == "True");
        let describe = || describe_bootstrap(fixture, name, restore.as_ref());
        if restore_phase != Some(RestorePhase::Completed) {
            anyhow::ensure!(
                cluster_phase != Some(ClusterPhase::Running) && !ready,
                "{name} is Running or Ready before its bootstrap restore completed: {}",
                describe().await
            );
            seen_bootstrapping |=
                is("Ready", "False", "Bootstrapping") && is("Bootstrapped", "False", "Restoring");
        }
        if cluster_phase == Some(ClusterPhase::Running) && ready {
            let restore =
                restore.ok_or_else(|| anyhow::anyhow!("{restore_name} does not exist"))?;
            return Ok((cluster, restore, seen_bootstrapping));
        }
        anyhow::ensure!(
            cluster_phase != Some(ClusterPhase::Failed)
                && restore_phase != Some(RestorePhase::Failed),
            "the bootstrap of {name} failed: {}",
            describe().await
        );
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{name} not Running and Ready after {}s: {}",
            BOOTSTRAP_TIMEOUT.as_secs(),
            describe().await
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Cluster `name`'s status and pods, and its bootstrap restore's status.
async fn describe_bootstrap(
    fixture: &Fixture,
    name: &str,
    restore: Option<&PostgreSQLRestore>,
) -> String {
    format!(
        "{}; {}",
        describe_cluster(fixture.client(), fixture.namespace(), name).await,
        restore
            .map(describe_restore)
            .unwrap_or_else(|| format!("no restore {name}-bootstrap"))
    )
}

/// Checks a cluster bootstrapped from the backup whose manifest is `manifest_key`: it went
/// through Bootstrapping, shows Bootstrapped True reason Restored naming the backup, and its
/// bootstrap restore is owned by it, replaces databases and restored `from`.
fn assert_bootstrapped(
    outcome: (PostgreSQLCluster, PostgreSQLRestore, bool),
    manifest_key: &str,
    from: &Bootstrap,
) {
    let (cluster, restore, seen_bootstrapping) = outcome;
    let name = cluster.name_any();
    assert!(
        seen_bootstrapping,
        "{name} showed Ready False Bootstrapping and Bootstrapped False Restoring while restoring"
    );
    let bootstrapped = condition(&cluster, "Bootstrapped").expect("Bootstrapped condition");
    assert_eq!(
        (bootstrapped.status.as_str(), bootstrapped.reason.as_str()),
        ("True", "Restored"),
        "{name}: {bootstrapped:?}"
    );
    assert!(
        bootstrapped.message.contains(manifest_key),
        "{name}: the message names the backup {manifest_key}: {}",
        bootstrapped.message
    );
    assert_eq!(restore.name_any(), format!("{name}-bootstrap"));
    assert!(restore.spec.drop_existing, "{:?}", restore.spec);
    assert_eq!(
        (&restore.spec.backup, &restore.spec.source),
        (&from.backup, &from.source)
    );
    assert_eq!(restore.spec.cluster.name, name);
    // It restored only into the database the cluster made and recorded.
    let recorded = cluster
        .status
        .as_ref()
        .and_then(|s| s.system_identifier.clone());
    assert!(recorded.is_some(), "{name} recorded its system identifier");
    assert_eq!(restore.spec.expected_system_identifier, recorded);
    assert_eq!(
        restore
            .status
            .as_ref()
            .and_then(|s| s.target_system_identifier.clone()),
        recorded
    );
    let owners = restore.owner_references();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(
        (owners[0].kind.as_str(), owners[0].name.as_str()),
        ("PostgreSQLCluster", name.as_str())
    );
    assert_eq!(Some(&owners[0].uid), cluster.metadata.uid.as_ref());
    assert_eq!(
        restore
            .status
            .as_ref()
            .and_then(|s| s.restored_object_key.as_deref()),
        Some(manifest_key)
    );
}

/// Whether `cluster`'s replication role logs in to its primary with its own Secret's password.
async fn replication_role_logs_in(cluster: &TestCluster) -> anyhow::Result<()> {
    let (user, password) = cluster.replication_credentials().await?;
    role_logs_in(cluster, &user, &password).await
}

/// Whether `cluster`'s application role logs in to its primary with its own Secret's password.
async fn application_role_logs_in(cluster: &TestCluster) -> anyhow::Result<()> {
    let application = cluster.application_secret().await?;
    role_logs_in(cluster, &application.username, &application.password).await
}

async fn role_logs_in(cluster: &TestCluster, user: &str, password: &str) -> anyhow::Result<()> {
    let address = *cluster
        .addresses()
        .await?
        .first()
        .ok_or_else(|| anyhow::anyhow!("no ready primary"))?;
    let client = cluster.log_in(address, user, password).await??;
    client.simple_query("SELECT 1").await?;
    Ok(())
}

#[tokio::test]
async fn new_clusters_bootstrapped_from_a_backup_or_its_storage_start_with_its_data() {
    let Some(fixture) = Fixture::start("restore-bootstrap").await else {
        return;
    };
    let before = fixture.digest().await;
    // What the end of the test checks on the new clusters holds for a cluster as made.
    replication_role_logs_in(&fixture.cluster)
        .await
        .unwrap_or_else(|error| panic!("the replication role logs in: {error:#}"));
    application_role_logs_in(&fixture.cluster)
        .await
        .unwrap_or_else(|error| panic!("the application role logs in: {error:#}"));
    let backup = fixture.backup("seed").await;
    let (manifest_key, _) = fixture.manifest(&backup).await;
    let from_backup = Bootstrap {
        backup: Some(LocalReference {
            name: "seed".to_owned(),
        }),
        source: None,
        recovery: None,
        initdb: None,
    };
    let from_source = Bootstrap {
        backup: None,
        source: Some(RestoreSource {
            storage: pgkube_crds::BackupStorage {
                s3: fixture.storage(),
            },
            object_key: manifest_key.clone(),
        }),
        recovery: None,
        initdb: None,
    };
    let from_nothing = Bootstrap {
        backup: Some(LocalReference {
            name: "no-such-backup".to_owned(),
        }),
        source: None,
        recovery: None,
        initdb: None,
    };
    let mut clusters = Vec::new();
    for (name, bootstrap) in [
        ("copy", &from_backup),
        ("copy-of-source", &from_source),
        ("orphan", &from_nothing),
    ] {
        let bootstrap = bootstrap.clone();
        let cluster = TestCluster::builder(name)
            .spec(|spec| spec.bootstrap = Some(bootstrap))
            .create(&fixture.running.namespace)
            .await
            .expect("cluster created");
        clusters.push(cluster);
    }
    let orphan_failed = async {
        wait_for_cluster(
            fixture.client(),
            fixture.namespace(),
            "orphan",
            "phase Failed",
            BOOTSTRAP_TIMEOUT,
            |cluster| cluster.status.as_ref().and_then(|s| s.phase) == Some(ClusterPhase::Failed),
        )
        .await
    };
    let (copy, copy_of_source, orphan) = tokio::join!(
        watch_bootstrap(&fixture, "copy"),
        watch_bootstrap(&fixture, "copy-of-source"),
        orphan_failed,
    );

    let copy = copy.unwrap_or_else(|error| panic!("{error:#}"));
    assert_bootstrapped(copy, &manifest_key, &from_backup);
    let copy_of_source = copy_of_source.unwrap_or_else(|error| panic!("{error:#}"));
    assert_bootstrapped(copy_of_source, &manifest_key, &from_source);
    for cluster in &clusters[..2] {
        assert_eq!(
            digest_of(cluster).await,
            before,
            "{} has the backup's data",
            cluster.name()
        );
        let granted = cluster
            .sql()
            .await
            .expect("SQL")
            .query_one(
                "SELECT has_table_privilege('reporter', 'public.items', 'SELECT')",
                &[],
            )
            .await
            .expect("the role restored with the globals");
        assert!(granted.get::<_, bool>(0), "{}: the grant", cluster.name());
    }

    // A bootstrap whose backup does not exist fails the cluster, with the restore's reason.
    let orphan = orphan.unwrap_or_else(|error| panic!("{error:#}"));
    let restore = fixture
        .running
        .api::<PostgreSQLRestore>()
        .get("orphan-bootstrap")
        .await
        .expect("the bootstrap restore");
    assert_eq!(
        (phase(&restore), restore_reason(&restore).as_deref()),
        (Some(RestorePhase::Failed), Some("BackupNotFound")),
        "{}",
        describe_restore(&restore)
    );
    let ready = condition(&orphan, "Ready").expect("Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "BootstrapFailed")
    );
    let bootstrapped = condition(&orphan, "Bootstrapped").expect("Bootstrapped");
    assert_eq!(
        (bootstrapped.status.as_str(), bootstrapped.reason.as_str()),
        ("False", "RestoreFailed")
    );
    let message = restore
        .status
        .clone()
        .and_then(|s| s.message)
        .unwrap_or_default();
    assert!(
        !message.is_empty() && bootstrapped.message.contains(&message),
        "Bootstrapped tells the restore's message {message:?}: {}",
        bootstrapped.message
    );

    // Restoring another cluster's globals must not take the new cluster's replication and
    // application roles from it: its replicas and applications log in with its own Secrets'
    // passwords.
    for cluster in &clusters[..2] {
        application_role_logs_in(cluster)
            .await
            .unwrap_or_else(|error| {
                panic!(
                    "{}: the application role no longer logs in with the cluster's own password                  after the bootstrap restore: {error:#}",
                    cluster.name()
                )
            });
        replication_role_logs_in(cluster)
            .await
            .unwrap_or_else(|error| {
                panic!(
                    "{}: the replication role no longer logs in with the cluster's own password \
                 after the bootstrap restore: {error:#}",
                    cluster.name()
                )
            });
    }
    fixture.stop().await;
}

/// Waits until a `BackupSkipped` Event about cluster `cluster` names `restore`.
async fn skip_event(fixture: &Fixture, cluster: &str, restore: &str) -> Event {
    let events = fixture.running.api::<Event>();
    wait_until(
        &format!("a BackupSkipped Event about {cluster} naming {restore}"),
        TICK,
        || async {
            let found = events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("BackupSkipped"))
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(cluster))
                .find(|e| e.note.as_deref().is_some_and(|note| note.contains(restore)));
            Ok(found)
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}"))
}

/// Waits until the agent of restore `restore` says, in its pod's log, that it waits for the
/// server to accept connections.
async fn agent_waits_for_the_server(fixture: &Fixture, restore: &str) {
    let pods = fixture.running.api::<Pod>();
    let selector = format!("{RESTORE_LABEL}={restore}");
    wait_until(
        &format!("the agent of {restore} to wait for the server"),
        Duration::from_secs(60),
        || async {
            for pod in pods
                .list(&ListParams::default().labels(&selector))
                .await?
                .items
            {
                let log = pods.logs(&pod.name_any(), &LogParams::default()).await?;
                if log.contains("waiting for the server to accept connections") {
                    return Ok(Some(()));
                }
            }
            Ok(None)
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));
}

async fn set_schedule(fixture: &Fixture, schedule: &str) {
    fixture
        .running
        .clusters()
        .patch(
            fixture.cluster.name(),
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"spec": {"backup": {"schedule": {"cron": schedule}}}}),
            ),
        )
        .await
        .expect("schedule set");
}

#[tokio::test]
async fn a_scheduled_backup_due_while_a_restore_runs_is_skipped_with_an_event() {
    let Some(fixture) = Fixture::start("restore-tick").await else {
        return;
    };
    let before = fixture.digest().await;
    fixture.backup("base").await;
    // Holds the restore in Running: while this transaction holds pg_authid exclusively, no new
    // session can log in, so the agent waits for the server to accept connections (up to its
    // --server-wait-seconds, 120 s), before it changes anything.
    let lock = fixture.cluster.sql().await.expect("SQL");
    lock.batch_execute("BEGIN; LOCK TABLE pg_catalog.pg_authid IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("pg_authid locked");

    fixture
        .restore("held", with_drop_existing(restore_of_backup("base", "pg")))
        .await;
    let running = wait_restore(
        fixture.client(),
        fixture.namespace(),
        "held",
        "Running",
        Duration::from_secs(120),
        |restore| phase(restore) == Some(RestorePhase::Running),
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));
    assert_eq!(
        restore_reason(&running).as_deref(),
        Some("Running"),
        "{}",
        describe_restore(&running)
    );
    assert_eq!(
        running.status.as_ref().and_then(|s| s.job_name.as_deref()),
        Some("held-restore")
    );
    fixture
        .running
        .api::<Job>()
        .get("held-restore")
        .await
        .expect("the restore's Job exists");
    fixture
        .wait_cluster_condition("pg", "Restoring", "True", "RestoreRunning")
        .await;
    agent_waits_for_the_server(&fixture, "held").await;

    // A schedule change moves the engine's floor to now: the first due time is the next
    // minute.
    set_schedule(&fixture, "* * * * *").await;
    let event = skip_event(&fixture, "pg", "held").await;
    let note = event.note.clone().unwrap_or_default();
    assert!(note.contains("RestoreRunning"), "{note}");
    // Still Running after the Event: it was Running when the time came.
    let restores = fixture.running.api::<PostgreSQLRestore>();
    let still = restores.get("held").await.expect("restore");
    assert_eq!(
        phase(&still),
        Some(RestorePhase::Running),
        "{}",
        describe_restore(&still)
    );
    let scheduled = fixture
        .running
        .api::<PostgreSQLBackup>()
        .list(&ListParams::default().labels("db.example.com/scheduled=true"))
        .await
        .expect("backups")
        .items;
    assert!(
        scheduled.is_empty(),
        "no scheduled backup while restoring: {:?}",
        scheduled
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>()
    );

    set_schedule(&fixture, NEVER).await;
    lock.batch_execute("ROLLBACK").await.expect("lock released");
    drop(lock);
    let restore = fixture.restore_ended("held").await;
    assert_eq!(
        phase(&restore),
        Some(RestorePhase::Completed),
        "{}",
        describe_restore(&restore)
    );
    assert_eq!(fixture.digest().await, before);
    fixture
        .wait_cluster_condition("pg", "Restoring", "False", "RestoreCompleted")
        .await;
    fixture.stop().await;
}

#[tokio::test]
async fn restores_that_cannot_work_are_refused_before_any_job() {
    let Some(fixture) = Fixture::start("restore-refused").await else {
        return;
    };
    let backup = fixture.backup("real").await;
    let (manifest_key, _) = fixture.manifest(&backup).await;
    // The real backup's manifest, as if PostgreSQL 17 had written it.
    let bytes = fixture
        .bucket
        .object(&manifest_key)
        .await
        .expect("manifest");
    let mut future: serde_json::Value = serde_json::from_slice(&bytes).expect("manifest JSON");
    future["postgresqlVersion"] = "17.2 (Debian 17.2-1.pgdg120+1)".into();
    future["backupName"] = "future".into();
    let future_key = format!("{}/pg/future/manifest.json", fixture.namespace());
    put_object(
        &fixture.bucket.client(),
        fixture.bucket.name(),
        &future_key,
        serde_json::to_vec(&future).expect("JSON"),
    )
    .await
    .expect("manifest written");
    let missing_key = format!("{}/pg/never-made/manifest.json", fixture.namespace());

    let cases = [
        (
            "too-new",
            restore_of_source(fixture.storage(), &future_key, "pg"),
            "NewerMajor",
        ),
        (
            "no-backup",
            restore_of_backup("no-such-backup", "pg"),
            "BackupNotFound",
        ),
        (
            "no-manifest",
            restore_of_source(fixture.storage(), &missing_key, "pg"),
            "ManifestNotFound",
        ),
    ];
    for (name, spec, _) in &cases {
        fixture
            .restore(name, with_drop_existing(spec.clone()))
            .await;
    }
    for (name, _, reason) in &cases {
        let restore = fixture.restore_ended(name).await;
        assert_refused(&fixture, &restore, reason).await;
        let message = restore
            .status
            .clone()
            .and_then(|s| s.message)
            .unwrap_or_default();
        let named = match *name {
            "too-new" => message.contains("17") && message.contains("15"),
            "no-backup" => message.contains("no-such-backup"),
            _ => message.contains(&missing_key),
        };
        assert!(named, "{name}: {message}");
    }
    fixture.stop().await;
}

/// `span`'s attribute `key`, as text.
fn attribute(span: &opentelemetry_sdk::trace::SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

// The subscriber is the process's global one, not a thread-local one: tracing caches whether
// a span's call site is enabled when the call site is first hit, from the dispatcher of the
// thread that hits it, and the other tests of this binary (on other threads, without a
// subscriber) may hit the restore controller's `reconcile` first, which would then never be
// traced here. Their spans reach the exporter too; this test picks its own by namespace.
#[tokio::test]
async fn the_agents_restore_spans_join_the_trace_of_the_reconcile_that_made_its_job() {
    use opentelemetry::trace::{SpanId, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    use pgkube_testkit::otlp::{OtlpReceiver, decode_hex};
    use tracing_subscriber::layer::SubscriberExt;

    if pgkube_testkit::testbed().is_none() {
        return;
    }
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
    let collector = OtlpReceiver::http().await;
    let otel_env = vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
            collector.endpoint.clone(),
        ),
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL".to_owned(),
            "http/protobuf".to_owned(),
        ),
    ];
    let Some(fixture) = Fixture::start_with("restore-trace", otel_env).await else {
        return;
    };
    fixture.backup("traced-base").await;
    fixture
        .restore(
            "traced",
            with_drop_existing(restore_of_backup("traced-base", "pg")),
        )
        .await;
    let restore = fixture.restore_ended("traced").await;
    assert_eq!(
        phase(&restore),
        Some(RestorePhase::Completed),
        "{}",
        describe_restore(&restore)
    );

    // The Job names the reconcile's trace...
    let job = fixture
        .running
        .api::<Job>()
        .get("traced-restore")
        .await
        .expect("job");
    let env = job
        .spec
        .and_then(|spec| spec.template.spec)
        .map(|pod| pod.containers)
        .unwrap_or_default()
        .into_iter()
        .flat_map(|container| container.env.unwrap_or_default())
        .collect::<Vec<_>>();
    let traceparent = env
        .iter()
        .find(|var| var.name == "TRACEPARENT")
        .and_then(|var| var.value.clone())
        .expect("the Job has a TRACEPARENT");
    let trace_id = traceparent
        .split('-')
        .nth(1)
        .expect("a W3C traceparent")
        .to_owned();
    for (name, value) in [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
    ] {
        assert!(
            env.iter()
                .any(|var| var.name == name && var.value.as_deref() == Some(value)),
            "the Job has the manager's {name}: {env:?}"
        );
    }
    // ...a restore reconcile's trace, whose root is `reconcile`...
    provider.force_flush().expect("flush");
    let spans = exporter.get_finished_spans().expect("spans");
    let roots: Vec<_> = spans
        .iter()
        .filter(|span| span.name == "reconcile")
        .filter(|span| attribute(span, "controller").as_deref() == Some("restore"))
        .filter(|span| attribute(span, "namespace").as_deref() == Some(fixture.namespace()))
        .collect();
    assert!(
        !roots.is_empty(),
        "restore reconciles are traced; the {} spans were: {:?}",
        spans.len(),
        spans
            .iter()
            .map(|span| format!(
                "{} {}",
                span.name,
                attribute(span, "controller").unwrap_or_default()
            ))
            .collect::<std::collections::BTreeSet<_>>()
    );
    let root = roots
        .iter()
        .find(|span| span.span_context.trace_id().to_string() == trace_id)
        .unwrap_or_else(|| {
            panic!(
                "TRACEPARENT {traceparent} is not the trace of a restore reconcile: {:?}",
                roots
                    .iter()
                    .map(|span| span.span_context.trace_id().to_string())
                    .collect::<Vec<_>>()
            )
        });
    assert_eq!(
        root.parent_span_id,
        SpanId::INVALID,
        "reconcile is the root"
    );
    assert_eq!(attribute(root, "name").as_deref(), Some("traced"));
    // ...which the agent's spans joined.
    let trace_bytes = decode_hex(&trace_id);
    let joined = wait_until(
        "the agent's restore spans in the reconcile's trace",
        Duration::from_secs(30),
        || async {
            let found = collector
                .bodies()
                .iter()
                .any(|body| contains(body, b"agent.restore") && contains(body, &trace_bytes));
            Ok(found.then_some(()))
        },
    )
    .await;
    assert!(
        joined.is_ok(),
        "no export of agent.restore in trace {trace_id} ({} export requests; agent.restore \
         anywhere: {})",
        collector.requests(),
        collector.contains(b"agent.restore")
    );
    fixture.stop().await;
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}
