//! Tests of who may connect: `pg_hba.conf`, the application Secret, the NetworkPolicy.

use super::*;

#[test]
fn pg_hba_allows_local_peer_and_remote_logins_over_tls_only() {
    let rules = |children: &DesiredChildren| -> Vec<Vec<String>> {
        children.config_map.data.as_ref().expect("data")[HBA_FILE]
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .collect()
    };
    let line = |words: &[&str]| words.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
    let children = built(&validated("my-cluster", 3));
    let (local, replication, everyone) = (
        line(&["local", "all", "all", "peer"]),
        line(&["hostssl", "replication", "streaming_replica", "all", "cert"]),
        line(&["hostssl", "all", "all", "all", "scram-sha-256"]),
    );
    // The superuser's password does not log in remotely: only the operator's certificate.
    let superuser_by_certificate = line(&["hostssl", "all", "postgres", "all", "cert"]);
    assert_eq!(
        rules(&children),
        [
            local.clone(),
            replication.clone(),
            superuser_by_certificate,
            everyone.clone()
        ]
    );
    let superuser_access = ValidatedCluster {
        superuser_access: true,
        ..validated("my-cluster", 3)
    };
    let tls_only = [local, replication, everyone];
    assert_eq!(rules(&built(&superuser_access)), tls_only);
    // While pods without certificates remain, they keep their logins without TLS, the
    // superuser's password included.
    let mut input = input("postgres");
    input.tls_only = false;
    let transition = build(&validated("my-cluster", 3), &input);
    let mut expected = tls_only.to_vec();
    expected.push(line(&[
        "hostnossl",
        "replication",
        "streaming_replica",
        "all",
        "scram-sha-256",
    ]));
    expected.push(line(&["hostnossl", "all", "all", "all", "scram-sha-256"]));
    assert_eq!(rules(&transition), expected);
    let hba = &children.config_map.data.as_ref().expect("data")[HBA_FILE];
    assert!(hba.starts_with("# Managed by pgkube; edits are overwritten.\n"));
    // With the applications' client CA on every pod: a certificate naming the role as well.
    let with_client_certificates = build(
        &validated("my-cluster", 3),
        &BuildInput {
            client_certificates: true,
            ..super::input("postgres")
        },
    );
    assert_eq!(
        rules(&with_client_certificates).last().expect("a rule"),
        &line(&[
            "hostssl",
            "all",
            "all",
            "all",
            "scram-sha-256",
            "clientcert=verify-full"
        ])
    );
}

#[test]
fn the_application_secret_connects_the_owner_to_its_database_through_rw() {
    let mut cluster = validated("my-cluster", 3);
    let secret = &built(&cluster).application_credentials;
    assert_eq!(secret.metadata.name.as_deref(), Some("my-cluster-app"));
    assert_eq!(
        secret.metadata.owner_references, None,
        "it outlives the cluster"
    );
    let data = secret.string_data.as_ref().expect("data");
    let value = |key: &str| data.get(key).map(String::as_str);
    assert_eq!(value("username"), Some("app"));
    assert_eq!(value("password"), Some("app secret"));
    assert_eq!(value("host"), Some("my-cluster-rw.team-a.svc"));
    assert_eq!(value("port"), Some("5432"));
    assert_eq!(value("dbname"), Some("app"));
    cluster.application = pgkube_crds::Initdb {
        database: "shop".to_owned(),
        owner: "shopper".to_owned(),
    };
    let secret = build(
        &cluster,
        &BuildInput {
            application_password: "pw1",
            ..input("postgres")
        },
    )
    .application_credentials;
    let data = secret.string_data.expect("data");
    assert_eq!(
        data["uri"],
        "postgresql://shopper:pw1@my-cluster-rw.team-a.svc:5432/shop"
    );
    assert_eq!(
        data["jdbc-uri"],
        "jdbc:postgresql://my-cluster-rw.team-a.svc:5432/shop?password=pw1&user=shopper"
    );
}

#[test]
fn the_network_policy_opens_postgres_to_the_namespace_and_status_to_the_cluster_and_operator() {
    use k8s_openapi::api::networking::v1::{IPBlock, NetworkPolicyPeer};
    let cluster = validated("my-cluster", 3);
    let in_pod = BuildInput {
        manager_namespace: Some("pgkube-system"),
        ..input("postgres")
    };
    let policy = build(&cluster, &in_pod).network_policy.expect("a policy");
    assert_eq!(
        policy.metadata.name.as_deref(),
        Some("my-cluster-postgresql")
    );
    let spec = policy.spec.expect("spec");
    assert_eq!(
        spec.pod_selector.and_then(|s| s.match_labels),
        Some(selector_labels(&ChildNames::for_cluster("my-cluster")))
    );
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_owned()]));
    let rules: Vec<(i32, serde_json::Value)> = spec
        .ingress
        .into_iter()
        .flatten()
        .map(|rule| {
            let port = match rule.ports.as_deref() {
                Some([port]) => port.port.clone(),
                other => panic!("one port per rule: {other:?}"),
            };
            let Some(IntOrString::Int(port)) = port else {
                panic!("a numbered port")
            };
            (port, serde_json::to_value(rule.from).expect("JSON"))
        })
        .collect();
    let cluster_pods = serde_json::json!({"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "postgresql", "app.kubernetes.io/instance": "my-cluster"}}});
    let operator = serde_json::json!({"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "pgkube-system"}}});
    assert_eq!(
        rules,
        [
            (5432, serde_json::json!([{"podSelector": {}}])),
            (8000, serde_json::json!([cluster_pods, operator])),
            (9187, serde_json::json!([{"podSelector": {}}])),
        ]
    );

    // Peers of the spec are added to PostgreSQL's port; outside a pod, the operator's
    // namespace is not named.
    let peer = NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: "10.1.0.0/16".to_owned(),
            except: None,
        }),
        ..NetworkPolicyPeer::default()
    };
    let with_peer = ValidatedCluster {
        network_policy: Some(vec![peer]),
        ..validated("my-cluster", 3)
    };
    let spec = built(&with_peer)
        .network_policy
        .and_then(|p| p.spec)
        .expect("spec");
    let from = |index: usize| {
        serde_json::to_value(&spec.ingress.as_ref().expect("rules")[index].from).expect("JSON")
    };
    assert_eq!(
        from(0),
        serde_json::json!([{"podSelector": {}}, {"ipBlock": {"cidr": "10.1.0.0/16"}}])
    );
    assert_eq!(from(1), serde_json::json!([cluster_pods]));
    assert_eq!(from(2), from(0), "metrics: the same peers as PostgreSQL");

    let off = ValidatedCluster {
        network_policy: None,
        ..validated("my-cluster", 3)
    };
    assert_eq!(built(&off).network_policy, None);
}
