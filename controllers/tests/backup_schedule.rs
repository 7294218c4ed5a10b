//! The cron engine against the test bed's API server, run in-process on its own namespace per
//! test, with real minute ticks. Clusters are plain objects (no cluster controller, no pods),
//! and no backup controller runs: the backups the engine creates stay without status, so a test
//! that needs the next minute to make a backup marks them Completed itself. The minute-tick
//! cases run concurrently in one test (about 3 to 4 minutes in all).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use pgkube_controllers::schedule::{BackupScheduler, CONDITION};
use pgkube_controllers::{Context, Metrics, Settings, ShutdownSignal};
use pgkube_crds::{
    CLUSTER_LABEL, PostgreSQLBackup, PostgreSQLCluster, PostgreSQLRestore, SCHEDULED_LABEL,
    SCHEDULED_TIME_ANNOTATION,
};
use pgkube_testkit::{TestEnv, TestNamespace, condition, install_crds, testbed, wait_until};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Longer than a minute tick plus the timer's and the watches' delays.
const TICK: Duration = Duration::from_secs(90);

/// A test's namespace and admin client.
struct Bed {
    env: TestEnv,
    client: Client,
    namespace: TestNamespace,
}

impl Bed {
    async fn new(prefix: &str) -> Option<Bed> {
        let env = testbed()?;
        let client = env.kube_client().await;
        install_crds(&client).await;
        let namespace = TestNamespace::create(&client, prefix).await;
        Some(Bed {
            env,
            client,
            namespace,
        })
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), self.namespace.name())
    }

    /// Starts an engine (a "manager") watching the test's namespace, with its own client.
    async fn engine(&self) -> Engine {
        let client = self.env.kube_client().await;
        let mut registry = Registry::default();
        let metrics = Arc::new(Metrics::register(&mut registry));
        let context = Context {
            events: client.clone(),
            client,
            settings: Arc::new(Settings {
                watch_namespaces: vec![self.namespace.name().to_owned()],
                resync_interval: Duration::from_secs(30),
                ..Settings::default()
            }),
            metrics,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = ShutdownSignal::from_future(async move {
            let _ = stopped.await;
        });
        let task = tokio::spawn(BackupScheduler::new(&context).run(shutdown));
        Engine {
            stop,
            task,
            registry,
        }
    }

    /// Creates cluster `name` backed up on `schedule` (with storage when `s3`).
    async fn cluster(&self, name: &str, backup: serde_json::Value, s3: bool) -> PostgreSQLCluster {
        let mut backup = backup;
        if s3 {
            backup["storage"] = json!({"s3": {
                "bucket": "backups",
                "credentials": {
                    "accessKeyId": {"name": "s3", "key": "id"},
                    "secretAccessKey": {"name": "s3", "key": "secret"},
                },
            }});
        }
        let cluster: PostgreSQLCluster = serde_json::from_value(json!({
            "apiVersion": "db.example.com/v1beta1",
            "kind": "PostgreSQLCluster",
            "metadata": {"name": name},
            "spec": {"replicas": 1, "storage": {"size": "1Gi"}, "backup": backup},
        }))
        .expect("a cluster");
        self.api::<PostgreSQLCluster>()
            .create(&PostParams::default(), &cluster)
            .await
            .expect("cluster created")
    }

    async fn get_cluster(&self, name: &str) -> PostgreSQLCluster {
        self.api::<PostgreSQLCluster>()
            .get(name)
            .await
            .expect("cluster")
    }

    /// The scheduled backups of cluster `cluster`, by name.
    async fn scheduled(&self, cluster: &str) -> Vec<PostgreSQLBackup> {
        let selector = format!("{SCHEDULED_LABEL}=true,{CLUSTER_LABEL}={cluster}");
        let mut backups = self
            .api::<PostgreSQLBackup>()
            .list(&ListParams::default().labels(&selector))
            .await
            .expect("backups")
            .items;
        backups.sort_by_key(ResourceExt::name_any);
        backups
    }

    /// Waits until cluster `cluster` has `count` scheduled backups, marking each Completed as
    /// it appears (as the backup controller would), so that the next minute makes one too.
    async fn wait_scheduled_completing(
        &self,
        cluster: &str,
        count: usize,
    ) -> Vec<PostgreSQLBackup> {
        let timeout = TICK * u32::try_from(count).expect("a small count");
        wait_until(
            &format!("{count} scheduled backups of {cluster}"),
            timeout,
            || async {
                let backups = self.scheduled(cluster).await;
                for backup in backups.iter().filter(|b| b.status.is_none()) {
                    self.set_phase(&backup.name_any(), "Completed").await;
                }
                Ok((backups.len() >= count).then_some(backups))
            },
        )
        .await
        .expect("scheduled backups made")
    }

    async fn set_phase(&self, backup: &str, phase: &str) {
        self.api::<PostgreSQLBackup>()
            .patch_status(
                backup,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": phase}})),
            )
            .await
            .expect("backup status patched");
    }

    /// Events with `reason` about `name`.
    async fn events(&self, name: &str, reason: &str) -> Vec<Event> {
        self.api::<Event>()
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect()
    }

    /// Waits until cluster `name` shows the engine's condition with `status` and `reason`.
    async fn wait_condition(&self, name: &str, status: &str, reason: &str) -> PostgreSQLCluster {
        let clusters = self.api::<PostgreSQLCluster>();
        wait_until(
            &format!("{name}: {CONDITION} {status} {reason}"),
            TICK,
            || async {
                let cluster = clusters.get(name).await?;
                let shown = condition(&cluster, CONDITION);
                let matches = shown.is_some_and(|c| c.status == status && c.reason == reason);
                Ok(matches.then_some(cluster))
            },
        )
        .await
        .expect("condition shown")
    }
}

/// An engine running in the test's process.
struct Engine {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
    registry: Registry,
}

impl Engine {
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("engine stops within 30 s")
            .expect("engine task");
    }

    fn metrics(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).expect("metrics");
        text
    }
}

fn scheduled_time(backup: &PostgreSQLBackup) -> DateTime<Utc> {
    let text = &backup.annotations()[SCHEDULED_TIME_ANNOTATION];
    DateTime::parse_from_rfc3339(text)
        .expect("an RFC 3339 scheduled time")
        .with_timezone(&Utc)
}

fn status_times(cluster: &PostgreSQLCluster) -> (Option<DateTime<Utc>>, Option<DateTime<Utc>>) {
    let status = cluster.status.clone().unwrap_or_default();
    let chrono = |t: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
        t.and_then(|t| DateTime::from_timestamp(t.0.as_second(), 0))
    };
    (
        chrono(status.last_scheduled_backup),
        chrono(status.next_scheduled_backup),
    )
}

/// Asserts that `backups` are the scheduled backups of `cluster` for consecutive minutes, each
/// named, labelled, annotated, owned and compressed as it should be.
fn assert_one_per_minute(cluster: &PostgreSQLCluster, backups: &[PostgreSQLBackup]) {
    let name = cluster.name_any();
    let compression = cluster.spec.backup.as_ref().and_then(|b| b.compression);
    let times: Vec<DateTime<Utc>> = backups.iter().map(scheduled_time).collect();
    let distinct: BTreeSet<_> = times.iter().collect();
    assert_eq!(
        distinct.len(),
        backups.len(),
        "one backup per time: {times:?}"
    );
    for pair in times.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            TimeDelta::minutes(1),
            "no minute missed: {times:?}"
        );
    }
    let created = cluster
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
        .expect("creation time");
    assert!(
        times[0].timestamp() > created,
        "no catch-up before a new cluster's creation"
    );
    for (backup, at) in backups.iter().zip(&times) {
        assert_eq!(
            backup.name_any(),
            format!("{name}-{}", at.format("%Y%m%d%H%M"))
        );
        assert_eq!(at.timestamp() % 60, 0, "a whole minute");
        assert_eq!(backup.labels()[CLUSTER_LABEL], name);
        assert_eq!(backup.labels()[SCHEDULED_LABEL], "true");
        assert_eq!(backup.spec.cluster.name, name);
        assert_eq!(
            serde_json::to_value(backup.spec.deletion_policy).expect("JSON"),
            "Retain"
        );
        assert_eq!(
            backup.spec.compression,
            Some(compression.unwrap_or_default()),
            "the cluster's compression (else the default), written into {}",
            backup.name_any()
        );
        let owners = backup.owner_references();
        assert_eq!(owners.len(), 1);
        assert_eq!(
            (owners[0].kind.as_str(), owners[0].name.as_str()),
            ("PostgreSQLCluster", name.as_str())
        );
        assert_eq!(Some(&owners[0].uid), cluster.metadata.uid.as_ref());
    }
}

/// The cases that wait for real minute ticks run at once (test binaries run only as many tests
/// at a time as there are cores).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn minute_ticks() {
    tokio::join!(
        every_minute_makes_one_backup_per_minute_and_shows_last_and_next(),
        two_managers_make_one_backup_per_minute_between_them(),
        an_unfinished_backup_or_restore_or_no_storage_skips_the_minute(),
        suspend_stops_new_backups(),
    );
}

async fn every_minute_makes_one_backup_per_minute_and_shows_last_and_next() {
    let Some(bed) = Bed::new("schedule-minutes").await else {
        return;
    };
    let cluster = bed
        .cluster(
            "minutely",
            json!({"schedule": {"cron": "* * * * *"}, "compression": {"method": "gzip", "level": 3}}),
            true,
        )
        .await;
    let engine = bed.engine().await;
    let backups = bed.wait_scheduled_completing("minutely", 3).await;
    assert_eq!(
        backups.len(),
        3,
        "{:?}",
        backups
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>()
    );
    assert_one_per_minute(&cluster, &backups);
    let latest = scheduled_time(&backups[2]);
    let expected = (Some(latest), Some(latest + TimeDelta::minutes(1)));
    let shown = wait_until("last and next scheduled times", TICK, || async {
        let cluster = bed.get_cluster("minutely").await;
        let times = status_times(&cluster);
        // A fourth minute may have passed meanwhile; then the times moved on by one.
        let later = (
            times.0.map(|t| t - TimeDelta::minutes(1)),
            times.1.map(|t| t - TimeDelta::minutes(1)),
        );
        Ok((times == expected || later == expected).then_some(cluster))
    })
    .await
    .expect("status shows the schedule");
    let shown_condition = condition(&shown, CONDITION).expect("BackupScheduled condition");
    assert_eq!(
        (
            shown_condition.status.as_str(),
            shown_condition.reason.as_str()
        ),
        ("True", "Scheduled")
    );
    let next = status_times(&shown).1.expect("next");
    assert!(
        shown_condition
            .message
            .contains(&next.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        "{}",
        shown_condition.message
    );
    let events = bed.events("minutely", "BackupScheduled").await;
    for backup in &backups {
        let name = backup.name_any();
        let about: Vec<_> = events
            .iter()
            .filter(|e| e.related.as_ref().and_then(|r| r.name.as_deref()) == Some(&name))
            .collect();
        assert_eq!(
            about.len(),
            1,
            "a BackupScheduled Event for {name}: {events:?}"
        );
        let note = about[0].note.as_deref().unwrap_or_default();
        assert!(note.contains(&name), "{note}");
    }
    engine.stop().await;
    bed.namespace.cleanup().await;
}

async fn two_managers_make_one_backup_per_minute_between_them() {
    let Some(bed) = Bed::new("schedule-two").await else {
        return;
    };
    let cluster = bed
        .cluster("shared", json!({"schedule": {"cron": "* * * * *"}}), true)
        .await;
    let (one, two) = (bed.engine().await, bed.engine().await);
    let backups = bed.wait_scheduled_completing("shared", 2).await;
    assert_one_per_minute(&cluster, &backups);
    // Each backup was created by one engine only: the other found it there (AlreadyExists or
    // in its cache) and published nothing.
    let events = bed.events("shared", "BackupScheduled").await;
    for backup in &backups {
        let name = backup.name_any();
        let about: Vec<_> = events
            .iter()
            .filter(|e| e.related.as_ref().and_then(|r| r.name.as_deref()) == Some(&name))
            .collect();
        assert_eq!(about.len(), 1, "one creator of {name}: {about:?}");
        assert_eq!(about[0].series, None, "created once: {about:?}");
    }
    one.stop().await;
    two.stop().await;
    bed.namespace.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hours_of_downtime_are_caught_up_by_one_backup() {
    let Some(bed) = Bed::new("schedule-catchup").await else {
        return;
    };
    bed.cluster("hourly", json!({"schedule": {"cron": "0 * * * *"}}), true)
        .await;
    let hours_ago = Utc::now() - TimeDelta::hours(5);
    bed.api::<PostgreSQLCluster>()
        .patch_status(
            "hourly",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"lastScheduledBackup":
                hours_ago.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)}})),
        )
        .await
        .expect("last scheduled backup set");
    let floor_hour = |t: DateTime<Utc>| t.duration_trunc(TimeDelta::hours(1)).expect("an hour");
    let before = floor_hour(Utc::now());
    let engine = bed.engine().await;
    let backups = wait_until("the catch-up backup", TICK, || async {
        let backups = bed.scheduled("hourly").await;
        Ok((!backups.is_empty()).then_some(backups))
    })
    .await
    .expect("a catch-up backup");
    let after = floor_hour(Utc::now());
    assert_eq!(backups.len(), 1, "one catch-up, not five");
    let at = scheduled_time(&backups[0]);
    assert!(
        at == before || at == after,
        "{at} is the latest missed hour"
    );
    // The status moved on, and a restarted engine (or a new leader) makes no other backup.
    let shown = wait_until(
        "lastScheduledBackup at the caught-up hour",
        TICK,
        || async {
            let cluster = bed.get_cluster("hourly").await;
            Ok((status_times(&cluster).0 == Some(at)).then_some(cluster))
        },
    )
    .await
    .expect("status updated");
    assert_eq!(status_times(&shown).1, Some(at + TimeDelta::hours(1)));
    engine.stop().await;
    let engine = bed.engine().await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(bed.scheduled("hourly").await.len(), 1, "no second catch-up");
    engine.stop().await;
    bed.namespace.cleanup().await;
}

async fn an_unfinished_backup_or_restore_or_no_storage_skips_the_minute() {
    let Some(bed) = Bed::new("schedule-skip").await else {
        return;
    };
    let every_minute = json!({"schedule": {"cron": "* * * * *"}});
    bed.cluster("busy", every_minute.clone(), true).await;
    bed.cluster("restoring", every_minute.clone(), true).await;
    bed.cluster("nowhere", every_minute, false).await;
    // An on-demand backup of `busy` that has not finished (no status yet).
    let manual: PostgreSQLBackup = serde_json::from_value(json!({
        "apiVersion": "db.example.com/v1beta1", "kind": "PostgreSQLBackup",
        "metadata": {"name": "busy-manual"}, "spec": {"cluster": {"name": "busy"}},
    }))
    .expect("a backup");
    bed.api::<PostgreSQLBackup>()
        .create(&PostParams::default(), &manual)
        .await
        .expect("backup created");
    let restore: PostgreSQLRestore = serde_json::from_value(json!({
        "apiVersion": "db.example.com/v1beta1", "kind": "PostgreSQLRestore",
        "metadata": {"name": "into-restoring"},
        "spec": {"backup": {"name": "busy-manual"}, "cluster": {"name": "restoring"}},
    }))
    .expect("a restore");
    bed.api::<PostgreSQLRestore>()
        .create(&PostParams::default(), &restore)
        .await
        .expect("restore created");
    let engine = bed.engine().await;
    for (cluster, reason) in [
        ("busy", "BackupRunning"),
        ("restoring", "RestoreRunning"),
        ("nowhere", "NoStorage"),
    ] {
        let events = wait_until(&format!("BackupSkipped about {cluster}"), TICK, || async {
            let events = bed.events(cluster, "BackupSkipped").await;
            Ok((!events.is_empty()).then_some(events))
        })
        .await
        .expect("a skip Event");
        let note = events[0].note.clone().unwrap_or_default();
        assert!(note.contains(reason), "{note}");
        let metric = format!(
            "pgkube_backup_skipped_ticks_total{{namespace=\"{}\",cluster=\"{cluster}\",reason=\"{reason}\"}}",
            bed.namespace.name()
        );
        let metrics = engine.metrics();
        assert!(metrics.contains(&metric), "{metric} in:\n{metrics}");
        assert!(
            bed.scheduled(cluster).await.is_empty(),
            "{cluster}: no backup"
        );
        // A skipped time counts as handled.
        let (last, _) = status_times(&bed.get_cluster(cluster).await);
        assert!(last.is_some(), "{cluster}: lastScheduledBackup set");
    }
    // Once the on-demand backup finished, the next minute makes a backup.
    bed.set_phase("busy-manual", "Completed").await;
    let made = wait_until("a backup of busy once unblocked", TICK, || async {
        let backups = bed.scheduled("busy").await;
        Ok((!backups.is_empty()).then_some(backups))
    })
    .await
    .expect("a backup");
    assert_eq!(made.len(), 1);
    engine.stop().await;
    bed.namespace.cleanup().await;
}

async fn suspend_stops_new_backups() {
    let Some(bed) = Bed::new("schedule-suspend").await else {
        return;
    };
    bed.cluster("paused", json!({"schedule": {"cron": "* * * * *"}}), true)
        .await;
    let engine = bed.engine().await;
    bed.wait_scheduled_completing("paused", 1).await;
    bed.api::<PostgreSQLCluster>()
        .patch(
            "paused",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"backup": {"schedule": {"suspend": true}}}})),
        )
        .await
        .expect("suspended");
    let suspended = bed.wait_condition("paused", "False", "Suspended").await;
    let (last, next) = status_times(&suspended);
    assert!(last.is_some(), "the last time stays");
    assert_eq!(next, None, "no next time while suspended");
    let count = bed.scheduled("paused").await.len();
    // Past the next minute boundary, with the backups Completed: nothing new.
    tokio::time::sleep(Duration::from_secs(75)).await;
    assert_eq!(
        bed.scheduled("paused").await.len(),
        count,
        "no backup while suspended"
    );
    engine.stop().await;
    bed.namespace.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_schedule_shows_in_the_condition() {
    let Some(bed) = Bed::new("schedule-invalid").await else {
        return;
    };
    bed.cluster(
        "mars",
        json!({"schedule": {"cron": "0 3 * * *", "timeZone": "Mars/Olympus_Mons"}}),
        true,
    )
    .await;
    bed.cluster("sixty", json!({"schedule": {"cron": "61 * * * *"}}), true)
        .await;
    let engine = bed.engine().await;
    let mars = bed.wait_condition("mars", "False", "InvalidSchedule").await;
    let message = condition(&mars, CONDITION).expect("condition").message;
    assert!(
        message.contains("unknown time zone \"Mars/Olympus_Mons\""),
        "{message}"
    );
    assert_eq!(status_times(&mars).1, None, "no next time");
    let sixty = bed
        .wait_condition("sixty", "False", "InvalidSchedule")
        .await;
    let message = condition(&sixty, CONDITION).expect("condition").message;
    assert!(
        message.contains("minute 61 is out of range 0-59"),
        "{message}"
    );
    // Fixed, the schedule runs in its time zone.
    bed.api::<PostgreSQLCluster>()
        .patch(
            "mars",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"backup": {"schedule": {"timeZone": "Europe/Paris"}}}})),
        )
        .await
        .expect("time zone fixed");
    let fixed = bed.wait_condition("mars", "True", "Scheduled").await;
    let next = status_times(&fixed).1.expect("a next time");
    let paris = next.with_timezone(&chrono_tz::Europe::Paris);
    assert_eq!(paris.format("%H:%M").to_string(), "03:00");
    engine.stop().await;
    bed.namespace.cleanup().await;
}
