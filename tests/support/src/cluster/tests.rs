//! Unit tests of the test cluster builder and of the report a failed wait prints.

use super::*;
use crate::describe::describe;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, PodCondition,
    PodStatus,
};
use kube::api::ObjectMeta;

#[test]
fn the_local_node_scheduling_is_its_label_and_taint() {
    let scheduling = local_node_scheduling();
    assert_eq!(
        scheduling.node_selector,
        BTreeMap::from([("pgkube.io/testbed-node".to_owned(), "local".to_owned())])
    );
    let toleration = &scheduling.tolerations[..];
    assert_eq!(toleration.len(), 1);
    assert_eq!(
        (
            toleration[0].key.as_deref(),
            toleration[0].operator.as_deref(),
            toleration[0].value.as_deref(),
            toleration[0].effect.as_deref()
        ),
        (
            Some("pgkube.io/testbed-node"),
            Some("Equal"),
            Some("local"),
            Some("NoSchedule")
        )
    );
}

#[test]
fn local_node_scheduling_adds_to_a_pod_without_losing_its_own() {
    let mut pod = PodSpec {
        node_selector: Some(BTreeMap::from([("disk".to_owned(), "ssd".to_owned())])),
        ..PodSpec::default()
    };
    local_node_scheduling().apply_to_pod(&mut pod);
    let selector = pod.node_selector.expect("node selector");
    assert_eq!(selector.len(), 2);
    assert_eq!(selector["pgkube.io/testbed-node"], "local");
    assert_eq!(pod.tolerations.map(|t| t.len()), Some(1));
}

#[test]
fn the_default_test_cluster_is_small_and_on_the_local_node() {
    let builder = TestCluster::builder("db");
    let json = serde_json::to_value(builder.cluster()).expect("json");
    assert_eq!(json["apiVersion"], "db.example.com/v1beta1");
    assert_eq!(json["kind"], "PostgreSQLCluster");
    assert_eq!(json["metadata"]["name"], "db");
    assert_eq!(
        json["spec"],
        serde_json::json!({
            "replicas": 1,
            "postgresVersion": "15",
            "storage": {"size": "1Gi"},
            "nodeSelector": {"pgkube.io/testbed-node": "local"},
            "tolerations": [{
                "key": "pgkube.io/testbed-node",
                "operator": "Equal",
                "value": "local",
                "effect": "NoSchedule"
            }],
        })
    );
    let bigger = TestCluster::builder("db")
        .replicas(3)
        .version(PostgresVersion::V16)
        .storage("2Gi")
        .spec(|spec| spec.resources = None);
    let spec = &bigger.cluster().spec;
    assert_eq!(
        (
            spec.replicas,
            spec.postgres_version,
            spec.storage.size.as_str()
        ),
        (3, PostgresVersion::V16, "2Gi")
    );
}

#[test]
fn extra_spec_fields_are_merged_into_the_spec_sent() {
    let builder = TestCluster::builder("db")
        .replicas(3)
        .extra_spec(serde_json::json!({"highAvailability": {"failoverDelaySeconds": 3}}))
        .extra_spec(serde_json::json!({
            "highAvailability": {"synchronous": {"minStandbys": 1, "maxStandbys": 1}},
            "nodeSelector": {"disk": "ssd"},
        }));
    let body = builder.body().expect("body");
    assert_eq!(
        body.types.as_ref().map(|t| t.kind.as_str()),
        Some("PostgreSQLCluster")
    );
    let spec = &body.data["spec"];
    assert_eq!(spec["replicas"], 3);
    assert_eq!(
        spec["highAvailability"],
        serde_json::json!({
            "failoverDelaySeconds": 3,
            "synchronous": {"minStandbys": 1, "maxStandbys": 1},
        })
    );
    assert_eq!(
        spec["nodeSelector"],
        serde_json::json!({"pgkube.io/testbed-node": "local", "disk": "ssd"})
    );
    let plain = TestCluster::builder("db").body().expect("body");
    assert_eq!(
        plain.data["spec"],
        serde_json::to_value(TestCluster::builder("db").cluster()).expect("json")["spec"]
    );
}

#[test]
#[should_panic(expected = "must be a DNS label")]
fn a_name_pgkube_would_shorten_is_refused() {
    TestCluster::builder(&"a".repeat(MAX_CLUSTER_NAME + 1));
}

#[test]
fn names_of_the_children_tests_use() {
    assert_eq!(ClusterService::ReadWrite.name("db"), "db-rw");
    assert_eq!(ClusterService::ReadOnly.name("db"), "db-ro");
    assert_eq!(ClusterService::Any.name("db"), "db-r");
    assert_eq!(credentials_secret_name("db"), "db-postgresql-credentials");
    assert_eq!(replication_secret_name("db"), "db-postgresql-replication");
    assert!(is_dns_label("db-1") && !is_dns_label("1db") && !is_dns_label("db-"));
    assert!(!is_dns_label("my.db") && !is_dns_label("DB"));
}

#[test]
fn a_failure_description_shows_status_conditions_and_container_states() {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("db-postgresql-0".to_owned()),
            ..ObjectMeta::default()
        },
        status: Some(PodStatus {
            phase: Some("Pending".to_owned()),
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".to_owned(),
                status: "False".to_owned(),
                message: Some("0/3 nodes are available".to_owned()),
                ..PodCondition::default()
            }]),
            container_statuses: Some(vec![ContainerStatus {
                name: "postgresql".to_owned(),
                restart_count: 2,
                state: Some(ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some("CrashLoopBackOff".to_owned()),
                        message: None,
                    }),
                    ..ContainerState::default()
                }),
                last_state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: 1,
                        reason: Some("Error".to_owned()),
                        ..ContainerStateTerminated::default()
                    }),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        }),
        ..Pod::default()
    };
    let cluster = TestCluster::builder("db").cluster().clone();
    let text = describe("db", Ok(cluster), Ok(vec![pod]));
    assert_eq!(
        text,
        "cluster db status null; pods: db-postgresql-0 Pending on unscheduled ip - \
         [PodScheduled=False 0/3 nodes are available] containers: postgresql ready=false \
         restarts=2 waiting CrashLoopBackOff (last: terminated exit 1 Error)"
    );
    let unreadable = describe("db", Err("gone".to_owned()), Ok(Vec::new()));
    assert_eq!(unreadable, "cluster db unreadable: gone; pods: none");
}
