//! Reading why a Job's pod has not started, from pods as the kubelet and scheduler write them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use super::*;

fn pod(status: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "b1-backup-x7k2p", "creationTimestamp": "2027-01-15T08:00:00Z"},
        "status": status,
    }))
    .expect("a pod")
}

fn waiting(reason: &str, message: Option<&str>) -> serde_json::Value {
    json!({"state": {"waiting": {"reason": reason, "message": message}}})
}

fn named(mut status: serde_json::Value, name: &str) -> serde_json::Value {
    status["name"] = json!(name);
    status
}

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + second).expect("time")
}

#[test]
fn a_job_without_a_pod_has_not_started_but_is_not_trouble_yet() {
    let why = not_started(&[]).expect("not started");
    assert_eq!((why.pod.as_deref(), why.reason.as_str()), (None, NO_POD));
    assert!(!why.is_trouble());
    assert!(
        !why.may_hide_a_mount_failure(at(600)),
        "no pod, no Events to read"
    );
    assert_eq!(why.describe(), "PodNotCreated: the Job has no pod yet");
}

#[test]
fn an_unschedulable_pod_says_why_the_scheduler_refused_it() {
    let unscheduled = pod(json!({
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient memory."}],
    }));
    let why = not_started(&[unscheduled]).expect("not started");
    assert_eq!(why.reason, "Unschedulable");
    assert!(why.is_trouble());
    assert_eq!(
        why.describe(),
        "pod b1-backup-x7k2p waits: Unschedulable: 0/3 nodes are available: 3 Insufficient memory."
    );
}

#[test]
fn a_container_that_cannot_start_is_named_with_the_kubelets_reason() {
    let missing_secret = pod(json!({
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "initContainerStatuses": [named(json!({"state": {"terminated": {"exitCode": 0}}}), "install-agent")],
        "containerStatuses": [named(waiting("CreateContainerConfigError",
            Some("secret \"pg-superuser\" not found")), "backup")],
    }));
    let why = not_started(&[missing_secret]).expect("not started");
    assert_eq!(why.reason, "CreateContainerConfigError");
    assert_eq!(why.message, "secret \"pg-superuser\" not found");
    assert!(why.is_trouble());

    // The agent's image, pulled by the init container, is the first to fail.
    let no_image = pod(json!({
        "phase": "Pending",
        "initContainerStatuses": [named(waiting("ImagePullBackOff",
            Some("Back-off pulling image \"mirror.local/pgkube:9\"")), "install-agent")],
        "containerStatuses": [named(waiting("PodInitializing", None), "backup")],
    }));
    let why = not_started(&[no_image]).expect("not started");
    assert_eq!(why.reason, "ImagePullBackOff");
}

#[test]
fn a_pod_on_its_way_is_not_trouble_but_may_hide_a_mount_failure() {
    let creating = pod(json!({
        "phase": "Pending",
        "initContainerStatuses": [named(waiting("PodInitializing", None), "install-agent")],
        "containerStatuses": [named(waiting("PodInitializing", None), "backup")],
    }));
    let why = not_started(std::slice::from_ref(&creating)).expect("not started");
    assert_eq!(why.reason, "PodInitializing");
    assert!(!why.is_trouble());
    assert!(
        !why.may_hide_a_mount_failure(at(20)),
        "volumes take a few seconds"
    );
    assert!(why.may_hide_a_mount_failure(at(30)));

    let event = |reason: &str, type_: &str, second: i64, message: &str| Event {
        type_: Some(type_.to_owned()),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_timestamp: Some(Time(at(second))),
        ..Event::default()
    };
    let events = [
        event("Scheduled", "Normal", 0, "assigned to node-1"),
        event("FailedMount", "Warning", 5, "old"),
        event(
            "FailedMount",
            "Warning",
            20,
            "MountVolume.SetUp failed for volume \"s3\" : secret \"s3-keys\" not found",
        ),
    ];
    let why = why.or_mount_failure(&events);
    assert_eq!(why.reason, "FailedMount");
    assert_eq!(
        why.message, "MountVolume.SetUp failed for volume \"s3\" : secret \"s3-keys\" not found",
        "the newest"
    );
    assert!(why.is_trouble());
    assert_eq!(mount_failure(&events[..1]), None, "only mount failures");

    // The test bed's node (and a kubelet that says so) puts the failure in the message.
    let with_message = pod(json!({
        "phase": "Pending",
        "containerStatuses": [named(waiting("ContainerCreating",
            Some("secret \"s3-keys\" not found")), "backup")],
    }));
    let why = not_started(&[with_message]).expect("not started");
    assert!(why.is_trouble());
    assert!(!why.may_hide_a_mount_failure(at(600)));
}

#[test]
fn a_pod_that_runs_or_ended_has_started() {
    for phase in ["Running", "Succeeded", "Failed"] {
        let started = pod(json!({
            "phase": phase,
            "containerStatuses": [named(json!({"state": {"running": {}}}), "backup")],
        }));
        assert_eq!(not_started(&[started]), None, "{phase}");
    }
}

#[test]
fn the_newest_pod_that_is_not_being_deleted_counts() {
    let mut old = pod(json!({"phase": "Pending", "containerStatuses": [
        named(waiting("ErrImagePull", Some("not found")), "backup")]}));
    old.metadata.name = Some("old".to_owned());
    let mut new = pod(json!({"phase": "Running"}));
    new.metadata.name = Some("new".to_owned());
    new.metadata.creation_timestamp = Some(Time(at(10)));
    assert_eq!(not_started(&[old.clone(), new.clone()]), None);
    new.metadata.deletion_timestamp = Some(Time(at(20)));
    let why = not_started(&[old, new]).expect("the old one waits");
    assert_eq!(why.pod.as_deref(), Some("old"));
}

#[test]
fn the_start_deadline_counts_from_the_jobs_creation() {
    let timeout = Duration::from_secs(300);
    assert_eq!(
        deadline(Some(at(0)), at(60), timeout),
        StartDeadline::Within(Duration::from_secs(240))
    );
    assert_eq!(
        deadline(Some(at(0)), at(300), timeout),
        StartDeadline::Passed
    );
    assert_eq!(
        deadline(Some(at(0)), at(9_000), timeout),
        StartDeadline::Passed
    );
    assert_eq!(
        deadline(Some(at(10)), at(0), timeout),
        StartDeadline::Within(timeout),
        "a clock behind the API server's gives the whole timeout"
    );
    assert_eq!(
        deadline(None, at(0), timeout),
        StartDeadline::Within(timeout)
    );
}
