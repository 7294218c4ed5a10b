//! Publishes Kubernetes Events (`events.k8s.io/v1`) as kube's `Recorder` does, remembering less.
//!
//! Like kube's `Recorder` (and client-go's), an Event that repeats one published less than
//! [`SERIES_TTL`] ago (same type, reason and action, about the same object and related object,
//! whatever its note) does not make a new Event: the first one becomes a series, whose count
//! and last time are patched. kube's `Recorder` keeps a whole copy of every Event it published
//! in the last 6 minutes to do that, over 3 KB each with its key; this one keeps a hash of the
//! Event's key and what a series patch needs (the Event's name, its count and last time). Why:
//! when a thousand clusters converge, each publishes Events that never repeat, and at 500
//! clusters the copies were 3.4 of the manager's 51 MB peak heap (heaptrack).

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as KubernetesEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use serde_json::json;

/// How long a published Event can still become a series (kube's and client-go's value).
pub const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);

/// Publishes Events on behalf of one reporter; clones share what they published.
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    reporter: Reporter,
    published: Arc<Mutex<Published>>,
}

impl Recorder {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            published: Arc::default(),
        }
    }

    /// The manager's recorder: reporting controller `pgkube`, reporting instance `POD_NAME`
    /// when that is set (else `pgkube` too), as every controller's recorder had.
    pub fn of_manager(client: Client) -> Self {
        let reporter = Reporter {
            controller: "pgkube".to_owned(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self::new(client, reporter)
    }

    /// Publishes `event` about `regarding`: a new Event, or the next count of the series of
    /// the same Event published less than [`SERIES_TTL`] ago.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = series_key(event, regarding);
        let repeat = self.lock().repeat_of(key, now);
        // Events of a cluster-scoped object go to `default`, as kube's Recorder does.
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let published = match repeat {
            Some(mut series) => {
                series.count = series.count.saturating_add(1);
                series.last = now;
                let patch = json!({"series": {
                    "count": series.count,
                    "lastObservedTime": MicroTime(now),
                }});
                Api::<KubernetesEvent>::namespaced(self.client.clone(), namespace)
                    .patch(&series.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                series
            }
            None => {
                let new = self.new_event(event, regarding, now);
                Api::<KubernetesEvent>::namespaced(self.client.clone(), namespace)
                    .create(&PostParams::default(), &new)
                    .await?;
                Series {
                    name: new.metadata.name.unwrap_or_default(),
                    count: 1,
                    last: now,
                }
            }
        };
        self.lock().record(key, published);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Published> {
        // What was published is only a memory of series: a panic elsewhere leaves it usable.
        self.published.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The Event kube's Recorder would create (the same fields, the same name).
    fn new_event(
        &self,
        event: &Event,
        regarding: &ObjectReference,
        now: Timestamp,
    ) -> KubernetesEvent {
        let controller = &self.reporter.controller;
        let object_name = regarding.name.as_ref().unwrap_or(controller);
        KubernetesEvent {
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(format!("{object_name}.{:x}", now.as_nanosecond())),
                ..ObjectMeta::default()
            },
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            type_: Some(
                match event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            ..KubernetesEvent::default()
        }
    }
}

/// What a later repeat of a published Event needs to patch its series.
#[derive(Clone, Debug, PartialEq)]
struct Series {
    name: String,
    count: i32,
    last: Timestamp,
}

/// The Events published less than [`SERIES_TTL`] ago, by the hash of their key.
#[derive(Default)]
struct Published {
    series: HashMap<u64, Series>,
}

impl Published {
    /// The series that an Event of `key` continues at `now`, forgetting the expired ones.
    fn repeat_of(&mut self, key: u64, now: Timestamp) -> Option<Series> {
        self.series
            .retain(|_, series| series.last + SERIES_TTL > now);
        self.series.get(&key).cloned()
    }

    fn record(&mut self, key: u64, series: Series) {
        self.series.insert(key, series);
    }
}

/// The hash of what makes two Events the same for a series: their type, action and reason, and
/// the objects they are about (every field of the references, as kube's Recorder compares
/// them), but not their note. The reporter is the same for all the Events of a Recorder.
fn series_key(event: &Event, regarding: &ObjectReference) -> u64 {
    let mut hasher = DefaultHasher::new();
    event.type_.hash(&mut hasher);
    event.action.hash(&mut hasher);
    event.reason.hash(&mut hasher);
    hash_reference(regarding, &mut hasher);
    match &event.secondary {
        Some(related) => {
            1u8.hash(&mut hasher);
            hash_reference(related, &mut hasher);
        }
        None => 0u8.hash(&mut hasher),
    }
    hasher.finish()
}

fn hash_reference(reference: &ObjectReference, hasher: &mut DefaultHasher) {
    reference.api_version.hash(hasher);
    reference.kind.hash(hasher);
    reference.namespace.hash(hasher);
    reference.name.hash(hasher);
    reference.uid.hash(hasher);
    reference.resource_version.hash(hasher);
    reference.field_path.hash(hasher);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(resource_version: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("db.example.com/v1beta1".to_owned()),
            kind: Some("PostgreSQLCluster".to_owned()),
            namespace: Some("team".to_owned()),
            name: Some("orders".to_owned()),
            uid: Some("0f8e".to_owned()),
            resource_version: Some(resource_version.to_owned()),
            field_path: None,
        }
    }

    fn event(reason: &str, note: &str) -> Event {
        Event {
            type_: EventType::Warning,
            reason: reason.to_owned(),
            note: Some(note.to_owned()),
            action: "Reconcile".to_owned(),
            secondary: None,
        }
    }

    #[test]
    fn the_key_ignores_the_note_but_not_the_reason_the_object_or_the_related_object() {
        let failed = series_key(&event("ReconcileFailed", "a"), &reference("7"));
        assert_eq!(
            failed,
            series_key(&event("ReconcileFailed", "b"), &reference("7"))
        );
        assert_ne!(
            failed,
            series_key(&event("BackupSkipped", "a"), &reference("7"))
        );
        assert_ne!(
            failed,
            series_key(&event("ReconcileFailed", "a"), &reference("8"))
        );
        let mut related = event("ReconcileFailed", "a");
        related.secondary = Some(reference("1"));
        assert_ne!(failed, series_key(&related, &reference("7")));
    }

    #[test]
    fn a_repeat_within_the_ttl_continues_the_series_and_a_later_one_starts_anew() {
        let start = Timestamp::UNIX_EPOCH;
        let mut published = Published::default();
        assert_eq!(published.repeat_of(1, start), None);
        let first = Series {
            name: "orders.1".to_owned(),
            count: 1,
            last: start,
        };
        published.record(1, first.clone());
        let soon = start + SignedDuration::from_mins(5);
        assert_eq!(published.repeat_of(1, soon), Some(first));
        assert_eq!(published.repeat_of(2, soon), None);
        let late = start + SERIES_TTL;
        assert_eq!(published.repeat_of(1, late), None);
        assert!(published.series.is_empty(), "expired series are forgotten");
    }
}
