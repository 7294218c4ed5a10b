//! The cron engine's promise, with real minute ticks and real processes: a cluster scheduled
//! every minute gets exactly one backup per scheduled minute while its managers change
//! hands, first by a graceful leader change (SIGTERM: the leader releases its Lease), then by
//! a manager killed with SIGKILL and replaced (its Lease expires, the new process catches up).
//!
//! The cluster runs on the test bed's real node and its backups really run against Garage, so
//! each minute's backup ends (Completed) before the next tick: a backup still running would
//! make the next tick a skip, not a backup.

mod manager_common;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::api::{Api, ListParams};
use manager_common::Manager;
use pgkube_crds::{BackupPhase, PostgreSQLBackup, SCHEDULED_LABEL, SCHEDULED_TIME_ANNOTATION};
use pgkube_testkit::{
    TestBucket, TestCluster, TestNamespace, backup_config, create_s3_secret, install_crds,
    test_storage, testbed, wait_until,
};

const LEASE_FLAGS: &[&str] = manager_common::SHORT_LEASE_FLAGS;
/// Two ticks and some: long enough for a tick, its backup and a takeover.
const NEXT_BACKUP_TIMEOUT: Duration = Duration::from_secs(150);

fn candidate(env: &pgkube_testkit::TestEnv, name: &str, namespace: &str, lease: &str) -> Manager {
    let mut flags = vec![
        "--watch-namespaces",
        namespace,
        "--leader-elect",
        "--leader-elect-id",
        lease,
        "--leader-elect-namespace",
        namespace,
    ];
    flags.extend_from_slice(LEASE_FLAGS);
    Manager::start(env, name, &flags)
}

/// The scheduled backups, by the scheduled time each stands for.
async fn scheduled(
    backups: &Api<PostgreSQLBackup>,
) -> BTreeMap<DateTime<Utc>, Vec<PostgreSQLBackup>> {
    let list = backups
        .list(&ListParams::default().labels(&format!("{SCHEDULED_LABEL}=true")))
        .await
        .expect("listing backups");
    let mut by_time: BTreeMap<DateTime<Utc>, Vec<PostgreSQLBackup>> = BTreeMap::new();
    for backup in list.items {
        let time = backup
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SCHEDULED_TIME_ANNOTATION))
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .expect("a scheduled time annotation")
            .with_timezone(&Utc);
        by_time.entry(time).or_default().push(backup);
    }
    by_time
}

/// Waits until there is a scheduled backup for a time after `after`, and returns that time.
async fn next_scheduled(
    backups: &Api<PostgreSQLBackup>,
    after: Option<DateTime<Utc>>,
) -> DateTime<Utc> {
    wait_until("the next scheduled backup", NEXT_BACKUP_TIMEOUT, || async {
        let times = scheduled(backups).await;
        Ok(times.keys().copied().filter(|t| Some(*t) > after).min())
    })
    .await
    .expect("a scheduled backup for the next minute")
}

/// The leader's process, by the Lease holder's host name.
async fn leader<'a>(
    managers: &'a mut [Manager],
    namespace: &str,
    lease: &str,
    client: &kube::Client,
) -> &'a mut Manager {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), namespace);
    let holder = wait_until("a leader", Duration::from_secs(30), || async {
        let lease = leases.get_opt(lease).await?;
        Ok(lease
            .and_then(|l| l.spec?.holder_identity)
            .and_then(|identity| identity.split('_').next().map(str::to_owned)))
    })
    .await
    .expect("a leader");
    managers
        .iter_mut()
        .find(|m| m.name == holder)
        .unwrap_or_else(|| panic!("the leader {holder} is one of ours"))
}

#[tokio::test]
async fn one_backup_per_scheduled_minute_across_a_leader_change_and_a_manager_restart() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "sched-managers").await;
    let ns = namespace.name().to_owned();
    let lease = format!("pgkube-sched-{}", std::process::id());
    let bucket = TestBucket::create(&env, "sched").await;
    create_s3_secret(&client, &env, &ns, "s3-keys", None)
        .await
        .expect("S3 Secret");
    let mut managers = vec![
        candidate(&env, "sched-a", &ns, &lease),
        candidate(&env, "sched-b", &ns, &lease),
    ];
    let storage = test_storage(&env, bucket.name(), "s3-keys");
    let cluster = TestCluster::builder("pg")
        .spec(|spec| spec.backup = Some(backup_config(storage, "* * * * *")))
        .timeout(Duration::from_secs(300))
        .start(&namespace)
        .await
        .unwrap_or_else(|error| panic!("the cluster becomes Running: {error:#}"));
    let backups: Api<PostgreSQLBackup> = Api::namespaced(client.clone(), &ns);

    let first = next_scheduled(&backups, None).await;
    // A graceful leader change: the leader releases its Lease, the other one takes over.
    let old = leader(&mut managers, &ns, &lease, &client).await;
    old.terminate();
    assert_eq!(old.exit_code(Duration::from_secs(60)).await, Some(0));
    let second = next_scheduled(&backups, Some(first)).await;
    // A restart: the leader is killed outright and a new process joins; the Lease expires.
    let killed = leader(&mut managers, &ns, &lease, &client).await;
    killed.kill_hard().await;
    managers.push(candidate(&env, "sched-c", &ns, &lease));
    let third = next_scheduled(&backups, Some(second)).await;
    let fourth = next_scheduled(&backups, Some(third)).await;

    // Every minute from the first to the last has exactly one backup, and they all ended well
    // or are still running (the last one).
    let by_time = scheduled(&backups).await;
    let last = *by_time.keys().last().expect("backups");
    assert!(last >= fourth);
    let minutes = (last - first).num_minutes();
    assert!(
        minutes >= 3,
        "at least four scheduled minutes: {:?}",
        by_time.keys()
    );
    for step in 0..=minutes {
        let time = first + chrono::Duration::minutes(step);
        let made = by_time.get(&time).map_or(0, Vec::len);
        assert_eq!(
            made,
            1,
            "one backup for {time}; all: {:?}",
            by_time.keys().collect::<Vec<_>>()
        );
    }
    assert_eq!(
        by_time.len() as i64,
        minutes + 1,
        "no backup for any other time"
    );
    for (time, made) in &by_time {
        let phase = made[0].status.as_ref().and_then(|s| s.phase);
        assert!(
            matches!(phase, Some(BackupPhase::Completed)) || *time == last,
            "the backup for {time} is {phase:?}: {:?}",
            made[0].status
        );
    }

    cluster
        .delete(Duration::from_secs(120))
        .await
        .expect("cluster deleted");
    for manager in &mut managers {
        if manager.is_running() {
            manager.terminate();
            assert_eq!(manager.exit_code(Duration::from_secs(60)).await, Some(0));
        }
    }
    namespace.cleanup().await;
    bucket.cleanup().await;
}
