//! The cron engine at run time: watches, timers, backups created, status written.
//!
//! One loop owns every cluster's schedule state and handles, one at a time, a message per
//! cluster to look at: a cluster changed (its watch), its timer fired, or the periodic resync
//! (`Settings.resync_interval`, a safety net for a lost timer). Looking at a cluster
//! ([`Engine::sync`]) is level-based: from the cluster in the cache, the backups' and
//! restores' caches and the clock, it runs the due scheduled time if there is one (see
//! `plan`), arms the cluster's timer for its next time, and writes the engine's status fields
//! when they changed. Nothing is decided before every cache has synced, since a catch-up needs
//! to see the backups that exist.
//!
//! The timer is `tokio-cron-scheduler`, used only as a timer: one one-shot job per cluster at
//! its next occurrence, re-armed after each wake-up. Its own cron strings go through `croner`,
//! a second parser with other rules (day-of-week numbering, the day-of-month/day-of-week union,
//! DST); computing every occurrence with our parser alone keeps the time in
//! `nextScheduledBackup` exactly the time the engine wakes up at. Its jobs fire on a 500 ms
//! tick at whole seconds; a wake-up that comes early finds nothing due and re-arms.
//!
//! A failed create (or any API error) is retried with a backoff, and at the cluster's next
//! time at the latest, where the newest due time is tried.

use std::collections::HashMap;
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::{Api, Client, Resource, ResourceExt};
use pgkube_crds::{PostgreSQLBackup, PostgreSQLCluster, PostgreSQLRestore};
use tokio::sync::mpsc;
use tokio_cron_scheduler::{Job, JobScheduler};
use tracing::{Instrument, field, info_span};
use uuid::Uuid;

use super::name::backup_name;
use super::parse::Schedule;
use super::plan::{self, Decision, Plan, SchedulerStatus};
use crate::events::Recorder;
use crate::metrics::ClusterLabels;
use crate::{Context, ShutdownSignal};

mod caches;

use caches::Caches;

/// Field manager of the status fields the engine writes (`lastScheduledBackup`,
/// `nextScheduledBackup`, the `BackupScheduled` condition).
pub const FIELD_MANAGER: &str = "pgkube-scheduler";
/// First and longest retry delay after a failure.
const RETRY_BASE: Duration = Duration::seconds(5);
const RETRY_MAX: Duration = Duration::minutes(5);
/// How long to wait before trying to start the timer again.
const TIMER_RETRY: StdDuration = StdDuration::from_secs(10);

/// Errors of looking at one cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {action} {kind} {name}: {source}")]
    Kube {
        action: &'static str,
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot arm the timer: {0}")]
    Timer(#[source] tokio_cron_scheduler::JobSchedulerError),
}

/// A cluster, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterKey {
    pub namespace: String,
    pub name: String,
}

impl ClusterKey {
    fn of(cluster: &PostgreSQLCluster) -> Self {
        Self {
            namespace: cluster.namespace().unwrap_or_default(),
            name: cluster.name_any(),
        }
    }

    /// The cluster's labels in the metrics.
    fn labels(&self) -> ClusterLabels {
        ClusterLabels {
            namespace: self.namespace.clone(),
            cluster: self.name.clone(),
        }
    }
}

/// What the loop is asked to do.
#[derive(Debug)]
enum Message {
    /// The cluster changed (or was deleted).
    Changed(ClusterKey),
    /// The watch (re)listed every cluster.
    Relisted,
    /// The timer armed for the cluster at this time fired.
    Wake(ClusterKey, DateTime<Utc>),
}

/// The scheduled-backup engine: one per manager, leader-only like every controller in `run`.
pub struct BackupScheduler {
    context: Context,
}

impl BackupScheduler {
    pub fn new(context: &Context) -> Self {
        Self {
            context: context.clone(),
        }
    }

    /// Runs until `shutdown` fires (or the future is dropped, which stops the timer too).
    pub async fn run(self, shutdown: ShutdownSignal) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let mut caches = Caches::default();
        let mut watches = Vec::new();
        for namespace in namespaces(&self.context) {
            let client = &self.context.client;
            let namespace = namespace.as_deref();
            watches.push(caches.watch_clusters(client, namespace, sender.clone()));
            watches.push(caches.watch_backups(client, namespace));
            watches.push(caches.watch_restores(client, namespace));
        }
        let engine = Engine::new(self.context, caches, sender);
        let watches = futures::future::join_all(watches);
        // The watches run forever; the loop ends at shutdown, and with it the watches.
        futures::future::select(watches, Box::pin(engine.run(receiver, shutdown))).await;
    }
}

/// The namespaces to watch: each of `Settings.watch_namespaces`, or all (`None`).
fn namespaces(context: &Context) -> Vec<Option<String>> {
    let watched = &context.settings.watch_namespaces;
    if watched.is_empty() {
        vec![None]
    } else {
        watched.iter().cloned().map(Some).collect()
    }
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

/// What the engine remembers of one cluster.
#[derive(Debug)]
struct ClusterState {
    /// The schedule this state is for: a change moves the floor to now.
    schedule_key: Option<(String, Option<String>, bool)>,
    /// Scheduled times at or before it never run.
    floor: DateTime<Utc>,
    /// The last scheduled time handled (a backup made, found or skipped).
    last: Option<DateTime<Utc>>,
    /// Consecutive failures, for the retry delay.
    failures: u32,
    /// The armed timer job and the time it fires at.
    timer: Option<(Uuid, DateTime<Utc>)>,
    /// The status last written, and the cluster's resourceVersion it was written over: while
    /// the cache still shows that version, the write is not in it yet.
    written: Option<(SchedulerStatus, Option<String>)>,
}

impl ClusterState {
    fn first_sight(cluster: &PostgreSQLCluster, now: DateTime<Utc>) -> Self {
        Self {
            schedule_key: plan::schedule_key(cluster),
            floor: plan::first_floor(cluster, now),
            last: plan::last_scheduled(cluster),
            failures: 0,
            timer: None,
            written: None,
        }
    }

    /// Follows the cluster: a changed schedule starts from now; a last time in the status
    /// (another manager's) counts as handled.
    fn observe(&mut self, cluster: &PostgreSQLCluster, now: DateTime<Utc>) {
        let key = plan::schedule_key(cluster);
        if key != self.schedule_key {
            self.schedule_key = key;
            self.floor = self.floor.max(now);
            self.failures = 0;
        }
        if let Some(shown) = plan::last_scheduled(cluster) {
            self.floor = self.floor.max(shown);
            self.last = self.last.max(Some(shown));
        }
    }

    /// When to try again after failures: `RETRY_BASE * 2^(failures - 1)`, at most `RETRY_MAX`.
    fn retry_at(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        if self.failures == 0 {
            return None;
        }
        let factor = 2i32.saturating_pow(self.failures.saturating_sub(1).min(16));
        Some(now + (RETRY_BASE * factor).min(RETRY_MAX))
    }
}

/// The loop's state.
struct Engine {
    context: Context,
    recorder: Recorder,
    caches: Caches,
    states: HashMap<ClusterKey, ClusterState>,
    timer: Option<Timer>,
    sender: mpsc::UnboundedSender<Message>,
}

impl Engine {
    fn new(context: Context, caches: Caches, sender: mpsc::UnboundedSender<Message>) -> Self {
        let recorder = Recorder::of_manager(context.events.clone());
        Self {
            context,
            recorder,
            caches,
            states: HashMap::new(),
            timer: None,
            sender,
        }
    }

    async fn run(
        mut self,
        mut receiver: mpsc::UnboundedReceiver<Message>,
        shutdown: ShutdownSignal,
    ) {
        let stop = shutdown.wait();
        tokio::pin!(stop);
        let started = async {
            self.caches.ready().await;
            self.timer = Some(Timer::start(self.sender.clone()).await);
        };
        tokio::select! {
            () = &mut stop => return,
            () = started => {}
        }
        tracing::info!("scheduled-backup engine started");
        let mut resync = tokio::time::interval(self.context.settings.resync_interval);
        loop {
            tokio::select! {
                () = &mut stop => break,
                // The first tick is immediate: every known cluster, catch-up included.
                _ = resync.tick() => self.sync_all().await,
                Some(message) = receiver.recv() => self.handle(message).await,
            }
        }
        if let Some(timer) = self.timer.take() {
            timer.shutdown().await;
        }
        tracing::info!("scheduled-backup engine stopped");
    }

    async fn handle(&mut self, message: Message) {
        match message {
            Message::Changed(key) => self.sync(&key).await,
            Message::Relisted => self.sync_all().await,
            Message::Wake(key, at) => {
                if let Some(state) = self.states.get_mut(&key)
                    && state.timer.is_some_and(|(_, armed)| armed == at)
                {
                    // That one-shot job is spent.
                    state.timer = None;
                }
                self.sync(&key).await;
            }
        }
    }

    /// Every cluster in the caches, and every one the engine remembers (it may be gone).
    async fn sync_all(&mut self) {
        let mut keys = self.caches.cluster_keys();
        keys.extend(self.states.keys().cloned());
        keys.sort();
        keys.dedup();
        for key in keys {
            self.sync(&key).await;
        }
    }

    /// Looks at one cluster: the due time, the timer, the status. In its own trace.
    async fn sync(&mut self, key: &ClusterKey) {
        let span = info_span!(
            parent: None,
            "schedule",
            namespace = %key.namespace,
            cluster = %key.name,
            due = field::Empty,
        );
        self.sync_in_span(key).instrument(span).await;
    }

    async fn sync_in_span(&mut self, key: &ClusterKey) {
        let now = Utc::now();
        let cluster = self.caches.cluster(key);
        let Some(cluster) = cluster.filter(|c| c.metadata.deletion_timestamp.is_none()) else {
            self.forget(key).await;
            return;
        };
        let plan = Plan::of(&cluster);
        let mut state = match self.states.remove(key) {
            Some(state) => state,
            None => ClusterState::first_sight(&cluster, now),
        };
        state.observe(&cluster, now);
        let (next, come) = match &plan {
            Plan::Active(schedule) => {
                self.run_due(&cluster, schedule, &mut state, now).await;
                let next = schedule.next_after(now);
                let wake = next.into_iter().chain(state.retry_at(now)).min();
                self.arm(key, &mut state, wake).await;
                (next, plan::last_come(schedule, state.floor, now))
            }
            Plan::None | Plan::Suspended | Plan::Invalid(_) => {
                self.disarm(&mut state).await;
                (None, None)
            }
        };
        self.context
            .metrics
            .observe_last_scheduled(&key.labels(), come.map(|at| at.timestamp()));
        if let Plan::Invalid(error) = &plan {
            tracing::debug!(%error, "schedule refused");
        }
        let status = SchedulerStatus::of(&plan, state.last, next);
        if let Err(error) = self.write_status(&cluster, &mut state, status, now).await {
            tracing::warn!(%error, "cannot write the schedule status; retrying");
            state.failures = state.failures.saturating_add(1);
            let wake = next.into_iter().chain(state.retry_at(now)).min();
            self.arm(key, &mut state, wake).await;
        }
        self.states.insert(key.clone(), state);
    }

    /// Runs the due scheduled time, if any; a failure is counted for the retry.
    async fn run_due(
        &self,
        cluster: &PostgreSQLCluster,
        schedule: &Schedule,
        state: &mut ClusterState,
        now: DateTime<Utc>,
    ) {
        let Some(at) = plan::due(schedule, state.floor, now) else {
            return;
        };
        tracing::Span::current().record("due", plan::rfc3339(at));
        match self.fire(cluster, at).await {
            Ok(()) => {
                state.floor = at;
                state.last = state.last.max(Some(at));
                state.failures = 0;
            }
            Err(error) => {
                state.failures = state.failures.saturating_add(1);
                tracing::warn!(%error, failures = state.failures, "scheduled backup not made; retrying");
            }
        }
    }

    /// Handles scheduled time `at`: a backup made, found, or skipped.
    async fn fire(&self, cluster: &PostgreSQLCluster, at: DateTime<Utc>) -> Result<(), Error> {
        let namespace = cluster.namespace().unwrap_or_default();
        let name = backup_name(&cluster.name_any(), at);
        let backups = self.caches.backups_in(&namespace);
        let restores = self.caches.restores_in(&namespace);
        let backups: Vec<&PostgreSQLBackup> = backups.iter().map(AsRef::as_ref).collect();
        let restores: Vec<&PostgreSQLRestore> = restores.iter().map(AsRef::as_ref).collect();
        let when = plan::rfc3339(at);
        match plan::decide(cluster, &name, &backups, &restores) {
            Decision::AlreadyMade => {
                tracing::info!(backup = %name, "the scheduled backup exists already");
            }
            Decision::Skip { reason, detail } => {
                let labels = ClusterLabels {
                    namespace,
                    cluster: cluster.name_any(),
                };
                self.context
                    .metrics
                    .observe_skipped_tick(&labels, reason.as_str());
                tracing::info!(reason = reason.as_str(), %detail, "scheduled backup skipped");
                let note = format!(
                    "Scheduled backup of {when} skipped ({}): {detail}",
                    reason.as_str()
                );
                self.publish(cluster, "BackupSkipped", note, None).await;
            }
            Decision::Create => {
                if let Some(backup) = self.create(cluster, &name, at).await? {
                    let note = format!("Created backup {name} for the scheduled time {when}");
                    // The backup as the related object: one Event per backup (the recorder
                    // folds Events that differ only in their note into one series).
                    let related = Some(backup.object_ref(&()));
                    self.publish(cluster, "BackupScheduled", note, related)
                        .await;
                }
            }
        }
        Ok(())
    }

    /// Creates the backup; `None` when it existed already (another try or manager made it).
    async fn create(
        &self,
        cluster: &PostgreSQLCluster,
        name: &str,
        at: DateTime<Utc>,
    ) -> Result<Option<PostgreSQLBackup>, Error> {
        let backup = plan::desired_backup(cluster, name, at);
        let namespace = cluster.namespace().unwrap_or_default();
        let api = Api::<PostgreSQLBackup>::namespaced(self.context.client.clone(), &namespace);
        match api.create(&PostParams::default(), &backup).await {
            Ok(created) => {
                tracing::info!(backup = %name, "scheduled backup created");
                Ok(Some(created))
            }
            Err(kube::Error::Api(status)) if status.is_already_exists() => {
                tracing::info!(backup = %name, "the scheduled backup exists already");
                Ok(None)
            }
            Err(source) => Err(Error::Kube {
                action: "create",
                kind: "PostgreSQLBackup",
                name: name.to_owned(),
                source,
            }),
        }
    }

    /// Writes the engine's status fields when they differ from what the cluster shows (and
    /// from what was just written, while the cache has not caught up yet).
    async fn write_status(
        &self,
        cluster: &PostgreSQLCluster,
        state: &mut ClusterState,
        status: SchedulerStatus,
        now: DateTime<Utc>,
    ) -> Result<(), Error> {
        let version = cluster.resource_version();
        let pending = state
            .written
            .as_ref()
            .is_some_and(|(written, over)| *written == status && *over == version);
        if pending || !status.differs_from(cluster) {
            return Ok(());
        }
        let name = cluster.name_any();
        let namespace = cluster.namespace().unwrap_or_default();
        let body = status.apply_body(cluster, now);
        Api::<PostgreSQLCluster>::namespaced(self.context.client.clone(), &namespace)
            .patch_status(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(|source| Error::Kube {
                action: "write the schedule status of",
                kind: "PostgreSQLCluster",
                name,
                source,
            })?;
        tracing::info!(last = ?status.last, next = ?status.next, "schedule status updated");
        state.written = Some((status, version));
        Ok(())
    }

    /// Publishes a Normal Event about the cluster, `related` to an object; a failure is only
    /// logged.
    async fn publish(
        &self,
        cluster: &PostgreSQLCluster,
        reason: &str,
        note: String,
        related: Option<ObjectReference>,
    ) {
        let event = KubeEvent {
            type_: EventType::Normal,
            reason: reason.to_owned(),
            note: Some(note),
            action: "ScheduleBackup".to_owned(),
            secondary: related,
        };
        if let Err(error) = self
            .recorder
            .publish(&event, &cluster.object_ref(&()))
            .await
        {
            tracing::warn!(%error, reason, "cannot publish an Event");
        }
    }

    /// Arms the cluster's timer for `at` (none: disarms it), unless it is armed for it already.
    async fn arm(&self, key: &ClusterKey, state: &mut ClusterState, at: Option<DateTime<Utc>>) {
        if state.timer.map(|(_, armed)| armed) == at {
            return;
        }
        self.disarm(state).await;
        let (Some(at), Some(timer)) = (at, &self.timer) else {
            return;
        };
        match timer.arm(key.clone(), at).await {
            Ok(id) => state.timer = Some((id, at)),
            // The periodic resync looks at the cluster again.
            Err(error) => tracing::warn!(%error, "cannot arm the timer"),
        }
    }

    async fn disarm(&self, state: &mut ClusterState) {
        if let (Some((id, _)), Some(timer)) = (state.timer.take(), &self.timer) {
            timer.disarm(id).await;
        }
    }

    /// The cluster is gone (or being deleted): its timer and state go.
    async fn forget(&mut self, key: &ClusterKey) {
        self.context
            .metrics
            .observe_last_scheduled(&key.labels(), None);
        if let Some(mut state) = self.states.remove(key) {
            self.disarm(&mut state).await;
            tracing::debug!("cluster gone; schedule removed");
        }
    }
}

/// One-shot wake-ups on `tokio-cron-scheduler`, delivered to the loop as messages.
struct Timer {
    scheduler: Option<JobScheduler>,
    sender: mpsc::UnboundedSender<Message>,
}

impl Timer {
    /// Starts the scheduler, trying again until it starts (it only fails to set up channels).
    async fn start(sender: mpsc::UnboundedSender<Message>) -> Self {
        loop {
            match Self::try_start().await {
                Ok(scheduler) => {
                    return Self {
                        scheduler: Some(scheduler),
                        sender,
                    };
                }
                Err(error) => {
                    tracing::error!(%error, "cannot start the timer; trying again");
                    tokio::time::sleep(TIMER_RETRY).await;
                }
            }
        }
    }

    async fn try_start() -> Result<JobScheduler, tokio_cron_scheduler::JobSchedulerError> {
        let scheduler = JobScheduler::new().await?;
        scheduler.start().await?;
        Ok(scheduler)
    }

    /// A one-shot job that sends `Wake(key, at)` at `at` or a little after, never before (the
    /// scheduler counts whole seconds, and scheduled times are whole minutes).
    async fn arm(&self, key: ClusterKey, at: DateTime<Utc>) -> Result<Uuid, Error> {
        let scheduler = self.scheduler.as_ref().ok_or(Error::Timer(
            tokio_cron_scheduler::JobSchedulerError::CantAdd,
        ))?;
        let wait = (at - Utc::now()).num_milliseconds().max(0);
        let seconds = u64::try_from(wait).unwrap_or(0).div_ceil(1000);
        let sender = self.sender.clone();
        let job = Job::new_one_shot_async(StdDuration::from_secs(seconds), move |_, _| {
            let (sender, key) = (sender.clone(), key.clone());
            Box::pin(async move {
                // No receiver means the engine stopped: nobody to wake.
                let _ = sender.send(Message::Wake(key, at));
            })
        })
        .map_err(Error::Timer)?;
        scheduler.add(job).await.map_err(Error::Timer)
    }

    async fn disarm(&self, id: Uuid) {
        if let Some(scheduler) = &self.scheduler
            && let Err(error) = scheduler.remove(&id).await
        {
            // A job that already fired is gone already.
            tracing::debug!(%error, "cannot remove a timer job");
        }
    }

    async fn shutdown(mut self) {
        if let Some(mut scheduler) = self.scheduler.take()
            && let Err(error) = scheduler.shutdown().await
        {
            tracing::warn!(%error, "cannot stop the timer");
        }
    }
}

impl Drop for Timer {
    /// When the engine is dropped without a shutdown (leadership lost aborts it), the
    /// scheduler's background tick must stop too.
    fn drop(&mut self) {
        if let Some(mut scheduler) = self.scheduler.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                let _ = scheduler.shutdown().await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(failures: u32) -> ClusterState {
        ClusterState {
            schedule_key: None,
            floor: DateTime::<Utc>::UNIX_EPOCH,
            last: None,
            failures,
            timer: None,
            written: None,
        }
    }

    #[test]
    fn failures_are_retried_sooner_than_the_next_time_up_to_a_maximum() {
        let now = DateTime::<Utc>::UNIX_EPOCH;
        assert_eq!(state(0).retry_at(now), None);
        assert_eq!(state(1).retry_at(now), Some(now + Duration::seconds(5)));
        assert_eq!(state(3).retry_at(now), Some(now + Duration::seconds(20)));
        assert_eq!(state(40).retry_at(now), Some(now + RETRY_MAX));
    }
}
