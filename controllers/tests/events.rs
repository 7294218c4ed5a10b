//! pgkube's Event recorder against the test bed's real API server: a repeat becomes a series
//! of the first Event, and a different reason makes a new Event.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event as KubernetesEvent;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Api, Resource};
use pgkube_controllers::events::Recorder;
use pgkube_testkit::{TestNamespace, testbed};

fn warning(reason: &str, note: &str) -> Event {
    Event {
        type_: EventType::Warning,
        reason: reason.to_owned(),
        note: Some(note.to_owned()),
        action: "Reconcile".to_owned(),
        secondary: None,
    }
}

#[tokio::test]
async fn a_repeat_becomes_a_series_of_the_first_event_and_another_reason_a_new_event() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    let namespace = TestNamespace::create(&client, "events").await;
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), namespace.name());
    let regarding = config_maps
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("subject".to_owned()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            },
        )
        .await
        .expect("the object the Events are about")
        .object_ref(&());
    let reporter = Reporter {
        controller: "pgkube-test".to_owned(),
        instance: Some("events-test".to_owned()),
    };
    let recorder = Recorder::new(client.clone(), reporter);
    for note in ["first try", "second try", "third try"] {
        recorder
            .publish(&warning("ReconcileFailed", note), &regarding)
            .await
            .expect("published");
    }
    recorder
        .publish(&warning("BackupSkipped", "another reason"), &regarding)
        .await
        .expect("published");

    let events = Api::<KubernetesEvent>::namespaced(client.clone(), namespace.name());
    let mut listed = events
        .list(&ListParams::default())
        .await
        .expect("the Events")
        .items;
    listed.sort_by_key(|event| event.reason.clone());
    let reasons: Vec<_> = listed.iter().map(|e| e.reason.as_deref()).collect();
    assert_eq!(
        reasons,
        [Some("BackupSkipped"), Some("ReconcileFailed")],
        "{listed:?}"
    );
    let (skipped, failed) = (&listed[0], &listed[1]);
    assert_eq!(skipped.series, None, "{skipped:?}");
    let series = failed.series.as_ref().expect("the repeats made a series");
    assert_eq!(series.count, 3, "{failed:?}");
    assert_eq!(failed.note.as_deref(), Some("first try"), "{failed:?}");
    assert_eq!(failed.type_.as_deref(), Some("Warning"));
    assert_eq!(failed.reporting_controller.as_deref(), Some("pgkube-test"));
    assert_eq!(failed.reporting_instance.as_deref(), Some("events-test"));
    let about = failed.regarding.as_ref().expect("regarding");
    assert_eq!(about.name.as_deref(), Some("subject"));
    assert_eq!(about.kind.as_deref(), Some("ConfigMap"));
    namespace.cleanup().await;
}
