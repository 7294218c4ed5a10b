use super::*;
use crate::cluster::instances::{InstanceReport, Unavailable};
use pgkube_crds::PostgreSQLCluster;
use serde_json::json;

fn instance(pod: &str, role: &str, ready: bool, digest: Option<&str>) -> ObservedInstance {
    let report: InstanceReport = serde_json::from_value(json!({
        "pod": pod, "role": role, "ready": ready, "managerDigest": digest,
    }))
    .expect("report");
    ObservedInstance {
        pod: pod.to_owned(),
        uid: None,
        role_label: None,
        report: Ok(report),
    }
}

#[test]
fn the_replicas_managers_are_replaced_before_the_primarys() {
    let instances = [
        instance("db-0", "primary", true, Some("old")),
        instance("db-1", "replica", true, Some("new")),
        instance("db-2", "replica", true, Some("old")),
    ];
    assert_eq!(next("new", &instances), Some("db-2"));
    let replicas_done = [
        instance("db-0", "primary", true, Some("old")),
        instance("db-1", "replica", true, Some("new")),
        instance("db-2", "replica", true, Some("new")),
    ];
    assert_eq!(next("new", &replicas_done), Some("db-0"));
    assert_eq!(next("old", &replicas_done), Some("db-1"));
}

#[test]
fn no_manager_is_replaced_that_is_current_unready_or_too_old_to_say() {
    let instances = [
        instance("db-0", "primary", true, Some("new")),
        instance("db-1", "replica", false, Some("old")),
        instance("db-2", "replica", true, None),
        instance("db-3", "starting", true, Some("old")),
        ObservedInstance {
            pod: "db-4".to_owned(),
            uid: None,
            role_label: None,
            report: Err(Unavailable::Unreachable),
        },
    ];
    assert_eq!(next("new", &instances), None);
    assert!(!all_ready(&instances));
    assert!(all_ready(&instances[..1]));
    assert!(!all_ready(&[]));
}

#[test]
fn only_a_new_pgkube_image_keeps_the_image_the_pods_were_made_with() {
    let current = "pgkube:2";
    // Nothing but the pgkube image changed: the template stays as applied.
    assert_eq!(
        install_image(current, Some("pgkube:1"), |_| true),
        "pgkube:1"
    );
    // Something else changed too: the pods roll anyway, onto the current image.
    assert_eq!(install_image(current, Some("pgkube:1"), |_| false), current);
    assert_eq!(install_image(current, None, |_| true), current);
    assert_eq!(install_image(current, Some(current), |_| true), current);
}

const SAMPLE: &str = include_str!("../../../../deploy/samples/postgresqlcluster.yaml");

fn validated(replicas: i32) -> ValidatedCluster {
    let mut cluster: PostgreSQLCluster = serde_yaml::from_str(SAMPLE).expect("sample parses");
    cluster.metadata.namespace = Some("team-a".to_owned());
    cluster.metadata.uid = Some("0b5a5c2e-0000-4000-8000-000000000001".to_owned());
    cluster.spec.replicas = replicas;
    crate::cluster::validate::validate(&cluster, &Default::default())
        .expect("sample is valid")
        .effective
}

fn input(installer: &str) -> BuildInput<'_> {
    BuildInput {
        image_repository: "postgres",
        instance_manager_image: installer,
        primary: "my-cluster-postgresql-0",
        superuser_password: "secret",
        replication_password: "replication secret",
        application_password: "app secret",
        control_token: "token",
        manager_namespace: None,
        synchronous_standbys: 0,
        tls_only: true,
        client_certificates: false,
        system_identifier: None,
        recovery: None,
        in_place: None,
    }
}

/// The StatefulSet as applied (its hash stamped) and then cached (its pod spec as text).
fn applied_and_cached(cluster: &ValidatedCluster, installer: &str) -> StatefulSet {
    let mut sts = build::build(cluster, &input(installer)).statefulset;
    let body = serde_json::to_value(&sts).expect("json");
    let mut body = body;
    body["apiVersion"] = json!("apps/v1");
    body["kind"] = json!("StatefulSet");
    let hash = crate::cluster::drift::desired_hash(&body);
    let pod_spec = sts.spec.as_mut().and_then(|s| s.template.spec.take());
    let annotations = sts.metadata.annotations.get_or_insert_default();
    annotations.insert(crate::cluster::drift::HASH_ANNOTATION.to_owned(), hash);
    annotations.insert(
        crate::cluster::cache::COMPACT_POD_SPEC_ANNOTATION.to_owned(),
        serde_json::to_string(&pod_spec).expect("text"),
    );
    sts
}

#[test]
fn an_operator_upgrade_alone_keeps_the_template_and_another_change_takes_the_new_image() {
    let cluster = validated(3);
    let live = applied_and_cached(&cluster, "pgkube:1");
    assert_eq!(
        installer_image(&cluster, &input("pgkube:2"), Some(&live)),
        "pgkube:1",
        "only the pgkube image changed"
    );
    let scaled = validated(5);
    assert_eq!(
        installer_image(&scaled, &input("pgkube:2"), Some(&live)),
        "pgkube:2",
        "the StatefulSet changes anyway"
    );
    assert_eq!(
        installer_image(&cluster, &input("pgkube:2"), None),
        "pgkube:2"
    );
}
