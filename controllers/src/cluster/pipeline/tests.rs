use super::*;
use serde_json::json;

#[test]
fn a_cluster_with_pods_is_looked_at_again_within_the_instance_refresh() {
    let outcome = |issue: Option<Issue>| Outcome {
        statefulset: None,
        issue,
        held_back: false,
        expansion_pending: false,
        desired_replicas: 3,
        certificate_renewal: None,
    };
    let running = PostgreSQLClusterStatus {
        phase: Some(ClusterPhase::Running),
        ..PostgreSQLClusterStatus::default()
    };
    let creating = PostgreSQLClusterStatus {
        phase: Some(ClusterPhase::Creating),
        ..PostgreSQLClusterStatus::default()
    };
    let resync = Duration::from_secs(300);
    assert_eq!(next_look(&outcome(None), &running, false, resync), resync);
    assert_eq!(
        next_look(&outcome(None), &running, true, resync),
        INSTANCE_REFRESH
    );
    // One running instance: its readiness comes through the StatefulSet's watch.
    let sole = Outcome {
        desired_replicas: 1,
        ..outcome(None)
    };
    let running_one = PostgreSQLClusterStatus {
        ready_replicas: 1,
        ..running.clone()
    };
    assert_eq!(
        next_look(&sole, &running_one, true, resync),
        SOLE_INSTANCE_REFRESH
    );
    let creating_one = PostgreSQLClusterStatus {
        phase: Some(ClusterPhase::Creating),
        ..running_one.clone()
    };
    assert_eq!(next_look(&sole, &creating_one, true, resync), WAIT_REQUEUE);
    assert_eq!(
        next_look(&outcome(None), &creating, true, resync),
        WAIT_REQUEUE
    );
    let invalid = Issue {
        reason: "InvalidSpec".to_owned(),
        message: "bad".to_owned(),
        invalid_spec: true,
    };
    assert_eq!(
        next_look(&outcome(Some(invalid)), &creating, false, resync),
        resync
    );
    // A short resync (tests) wins.
    let short = Duration::from_secs(2);
    assert_eq!(next_look(&outcome(None), &running, true, short), short);
}

#[test]
fn commits_wait_for_the_streaming_replicas_within_the_bounds() {
    use instances::{InstanceReport, ObservedInstance, ReportedRole};
    let cluster = |synchronous: serde_json::Value| -> PostgreSQLCluster {
        serde_json::from_value(json!({
            "apiVersion": "db.example.com/v1beta1", "kind": "PostgreSQLCluster",
            "metadata": {"name": "db"},
            "spec": {"replicas": 4, "storage": {"size": "1Gi"},
                     "highAvailability": {"synchronous": synchronous}}
        }))
        .expect("a cluster")
    };
    let instance = |ordinal: i32, streaming: bool| ObservedInstance {
        pod: format!("db-postgresql-{ordinal}"),
        uid: None,
        role_label: None,
        report: Ok(InstanceReport {
            pod: format!("db-postgresql-{ordinal}"),
            role: ReportedRole::Replica,
            ready: true,
            timeline: Some(1),
            current_lsn: None,
            received_lsn: None,
            replayed_lsn: None,
            streaming,
            pending_restart: Vec::new(),
            following: None,
            system_identifier: None,
            initialized_by: None,
            message: None,
            restart_by_switchover: false,
            settings_digest: None,
            wal_archive: None,
            in_place: None,
            manager_digest: None,
            certificate_authorities: None,
        }),
    };
    let primary = "db-postgresql-0";
    let none_stream = [instance(1, false), instance(2, false), instance(3, false)];
    let two_stream = [instance(1, true), instance(2, true), instance(3, false)];
    let all_stream = [instance(1, true), instance(2, true), instance(3, true)];
    let one_to_two = cluster(json!({"minStandbys": 1, "maxStandbys": 2}));
    // At least the minimum, even with none streaming: commits wait rather than go async.
    assert_eq!(synchronous_standbys(&one_to_two, &none_stream, primary), 1);
    assert_eq!(synchronous_standbys(&one_to_two, &two_stream, primary), 2);
    // At most the maximum.
    assert_eq!(synchronous_standbys(&one_to_two, &all_stream, primary), 2);
    let without: PostgreSQLCluster = serde_json::from_value(json!({
        "apiVersion": "db.example.com/v1beta1", "kind": "PostgreSQLCluster",
        "metadata": {"name": "db"}, "spec": {"replicas": 4, "storage": {"size": "1Gi"}}
    }))
    .expect("a cluster");
    assert_eq!(synchronous_standbys(&without, &all_stream, primary), 0);
}

#[test]
fn passwords_are_random_and_long() {
    let one = generate_password();
    assert_eq!(one.len(), 32);
    assert_ne!(one, generate_password());
}
