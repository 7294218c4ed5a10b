use super::*;
use crate::cluster::validate::{LiveFacts, validate};
use crate::names::is_valid;
use k8s_openapi::api::core::v1::Container;
use pgkube_crds::PostgreSQLCluster;

/// The seed's sample cluster.
const SAMPLE: &str = include_str!("../../../../deploy/samples/postgresqlcluster.yaml");

fn validated(name: &str, replicas: i32) -> ValidatedCluster {
    let mut cluster: PostgreSQLCluster = serde_yaml::from_str(SAMPLE).expect("sample parses");
    cluster.metadata.name = Some(name.to_owned());
    cluster.metadata.namespace = Some("team-a".to_owned());
    cluster.metadata.uid = Some("0b5a5c2e-0000-4000-8000-000000000001".to_owned());
    cluster.spec.replicas = replicas;
    validate(&cluster, &LiveFacts::default())
        .expect("sample is valid")
        .effective
}

const PRIMARY: &str = "my-cluster-postgresql-0";

fn input(image_repository: &str) -> BuildInput<'_> {
    BuildInput {
        image_repository,
        instance_manager_image: "registry.local/pgkube:1.2",
        primary: PRIMARY,
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

/// `cluster` built with the default PostgreSQL repository.
fn built(cluster: &ValidatedCluster) -> DesiredChildren {
    build(cluster, &input("postgres"))
}

fn container(children: &DesiredChildren) -> &Container {
    let pod = children
        .statefulset
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref());
    &pod.expect("pod spec").containers[0]
}

#[test]
fn a_held_back_major_upgrade_builds_the_running_version_with_the_new_replicas() {
    let mut cluster: PostgreSQLCluster = serde_yaml::from_str(SAMPLE).expect("sample parses");
    cluster.metadata.namespace = Some("team-a".to_owned());
    cluster.metadata.uid = Some("0b5a5c2e-0000-4000-8000-000000000001".to_owned());
    cluster.spec.postgres_version = pgkube_crds::PostgresVersion::V17;
    cluster.spec.replicas = 4;
    let live = LiveFacts {
        running_version: Some(pgkube_crds::PostgresVersion::V16),
        claim_template_storage: Some("100Gi".to_owned()),
        largest_volume_gib: Some(100),
        ..LiveFacts::default()
    };
    let validation = validate(&cluster, &live).expect("valid");
    assert_eq!(validation.refusals.len(), 1);
    let children = build(&validation.effective, &input("mirror.example/postgres"));
    assert_eq!(
        container(&children).image.as_deref(),
        Some("mirror.example/postgres:16")
    );
    let sts = &children.statefulset;
    assert_eq!(
        sts.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(VERSION_ANNOTATION))
            .map(String::as_str),
        Some("16")
    );
    assert_eq!(sts.spec.as_ref().and_then(|s| s.replicas), Some(4));
}

#[test]
fn the_sample_builds_the_named_children_with_owner_and_labels() {
    let children = built(&validated("my-cluster", 3));
    let metas = [
        &children.statefulset.metadata,
        &children.headless_service.metadata,
        &children.rw_service.metadata,
        &children.ro_service.metadata,
        &children.r_service.metadata,
        &children.config_map.metadata,
        &children
            .pod_disruption_budget
            .as_ref()
            .expect("3 replicas get a PDB")
            .metadata,
    ];
    let names: Vec<_> = metas
        .iter()
        .map(|m| m.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        names,
        [
            "my-cluster-postgresql",
            "my-cluster-postgresql-headless",
            "my-cluster-rw",
            "my-cluster-ro",
            "my-cluster-r",
            "my-cluster-postgresql-config",
            "my-cluster-postgresql",
        ]
    );
    for meta in metas {
        let labels = meta.labels.as_ref().expect("labels");
        assert_eq!(labels["app.kubernetes.io/name"], "postgresql");
        assert_eq!(labels["app.kubernetes.io/instance"], "my-cluster");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "pgkube");
        let owner = &meta.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("PostgreSQLCluster", Some(true))
        );
        assert_eq!(meta.namespace.as_deref(), Some("team-a"));
    }
}

#[test]
fn pods_get_an_in_memory_dev_shm_and_change_volume_ownership_only_on_mismatch() {
    let children = built(&validated("my-cluster", 1));
    let pod = pod_spec(&children);
    let shm = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == SHM_VOLUME)
        .expect("a shm volume");
    assert_eq!(
        shm.empty_dir.as_ref().and_then(|e| e.medium.as_deref()),
        Some("Memory")
    );
    let mounts = container(&children)
        .volume_mounts
        .clone()
        .unwrap_or_default();
    assert!(
        mounts
            .iter()
            .any(|m| m.name == SHM_VOLUME && m.mount_path == "/dev/shm")
    );
    assert_eq!(
        pod.security_context
            .and_then(|s| s.fs_group_change_policy)
            .as_deref(),
        Some("OnRootMismatch")
    );
}

#[test]
fn the_config_sizes_memory_from_the_container_s_memory() {
    let children = built(&validated("my-cluster", 1));
    let config = &children.config_map.data.as_ref().expect("data")[CONFIG_FILE];
    // The sample's memory limit is 2Gi.
    assert!(
        config.contains("shared_buffers = 512MB\neffective_cache_size = 1536MB\n"),
        "{config}"
    );
    assert_eq!(config.matches("shared_buffers").count(), 1, "{config}");
}

#[test]
fn user_parameters_come_last_quoted_and_a_change_leaves_the_pods_alone() {
    let mut cluster = validated("my-cluster", 1);
    let before = built(&cluster);
    cluster.parameters = BTreeMap::from([
        ("work_mem".to_owned(), "16MB".to_owned()),
        ("application_name".to_owned(), "it's".to_owned()),
        ("shared_buffers".to_owned(), "1GB".to_owned()),
        ("search_path".to_owned(), "a\\".to_owned()),
    ]);
    let after = built(&cluster);
    let config = &after.config_map.data.as_ref().expect("data")[CONFIG_FILE];
    assert!(
        config.ends_with(
            "# spec.postgresql.parameters\n\
             application_name = 'it''s'\n\
             search_path = 'a\\\\'\n\
             shared_buffers = '1GB'\n\
             work_mem = '16MB'\n"
        ),
        "{config}"
    );
    // The instance manager applies the new file itself: the pods do not roll.
    assert_ne!(before.config_map, after.config_map);
    assert_eq!(before.statefulset, after.statefulset);
    let template = &after.statefulset.spec.as_ref().expect("spec").template;
    let annotations = template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone());
    // No hash of the configuration: only the certificates' mark.
    let tls_only = BTreeMap::from([(TLS_ANNOTATION.to_owned(), "true".to_owned())]);
    assert_eq!(annotations, Some(tls_only));
}

#[test]
fn the_config_has_what_streaming_replication_needs_and_pgkube_manages_it() {
    let children = built(&validated("my-cluster", 3));
    let config = &children.config_map.data.as_ref().expect("data")[CONFIG_FILE];
    for line in [
        "wal_level = replica\n",
        "hot_standby = on\n",
        "max_wal_senders = 10\n",
        "max_replication_slots = 10\n",
        "wal_log_hints = on\n",
        "unix_socket_directories = '/var/run/postgresql'\n",
        "listen_addresses = '*'\n",
    ] {
        assert!(config.contains(line), "{line} missing from:\n{config}");
    }
    // Every setting pgkube writes that users may not override is a managed parameter.
    for line in config.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(" = ").next().unwrap_or_default();
        let user_tunable = [
            "max_connections",
            "shared_buffers",
            "effective_cache_size",
            "password_encryption",
            "archive_timeout",
        ];
        assert!(
            user_tunable.contains(&name) || pgkube_crds::MANAGED_PARAMETERS.contains(&name),
            "{name} is neither tunable nor managed"
        );
    }
}

/// The instance managers' settings file, as JSON.
fn json(children: &DesiredChildren) -> serde_json::Value {
    let data = children.config_map.data.as_ref().expect("data");
    serde_json::from_str(&data[INSTANCE_FILE]).expect("JSON")
}

#[test]
fn instance_json_names_the_primary_its_host_and_the_instances() {
    let cluster = validated("my-cluster", 3);
    assert_eq!(
        json(&built(&cluster)),
        serde_json::json!({
            "primary": "my-cluster-postgresql-0",
            "primaryHost": "my-cluster-postgresql-0.my-cluster-postgresql-headless.team-a.svc",
            "port": 5432,
            "replicas": 3,
            "statefulset": "my-cluster-postgresql",
            "clusterUid": "0b5a5c2e-0000-4000-8000-000000000001",
            "restartBySwitchover": true,
            "isolationTimeoutSeconds": 3,
            "tlsOnly": true,
            "walArchive": {
                "bucket": "pgkube-backups", "region": "us-east-1",
                "endpoint": "https://s3.example.com", "forcePathStyle": true,
                "root": "team-a/my-cluster/wal/my-cluster/", "cluster": "team-a/my-cluster", "caBundle": false,
                "keys": true,
            },
        })
    );
    // One instance restarts in place, and has nothing to fence for: nothing could take over.
    let single = json(&built(&validated("my-cluster", 1)));
    assert_eq!(single.get("restartBySwitchover"), None, "{single}");
    assert_eq!(single.get("isolationTimeoutSeconds"), None, "{single}");
    let recorded = build(
        &cluster,
        &BuildInput {
            system_identifier: Some("7312345678901234567"),
            ..input("postgres")
        },
    );
    assert_eq!(json(&recorded)["systemIdentifier"], "7312345678901234567");
    let moved = build(
        &cluster,
        &BuildInput {
            primary: "my-cluster-postgresql-2",
            ..input("postgres")
        },
    );
    assert_eq!(json(&moved)["primary"], "my-cluster-postgresql-2");
    assert_eq!(
        json(&moved)["primaryHost"],
        "my-cluster-postgresql-2.my-cluster-postgresql-headless.team-a.svc"
    );
    // The primary is the ConfigMap's business only: the pods do not roll for it.
    assert_eq!(moved.statefulset, built(&cluster).statefulset);
}

#[test]
fn both_secrets_have_labels_but_no_owner_so_they_outlive_the_cluster() {
    let children = built(&validated("my-cluster", 1));
    let secrets = [
        (
            &children.credentials,
            "my-cluster-postgresql-credentials",
            "postgres",
            "secret",
        ),
        (
            &children.replication_credentials,
            "my-cluster-postgresql-replication",
            "streaming_replica",
            "replication secret",
        ),
    ];
    for (secret, name, username, password) in secrets {
        let meta = &secret.metadata;
        assert_eq!(meta.name.as_deref(), Some(name));
        assert_eq!(meta.namespace.as_deref(), Some("team-a"));
        assert_eq!(
            meta.labels.as_ref().expect("labels")["app.kubernetes.io/instance"],
            "my-cluster"
        );
        assert_eq!(meta.owner_references, None, "{name}");
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/basic-auth"));
        let data = secret.string_data.as_ref().expect("data");
        assert_eq!(
            (data[USERNAME_KEY].as_str(), data[PASSWORD_KEY].as_str()),
            (username, password)
        );
    }
}

#[test]
fn the_statefulset_runs_the_instance_manager_with_probes_storage_and_resources() {
    let children = build(
        &validated("my-cluster", 3),
        &input("registry.local/postgres"),
    );
    let spec = children.statefulset.spec.as_ref().expect("spec");
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(
        spec.service_name.as_deref(),
        Some("my-cluster-postgresql-headless")
    );
    let postgres = container(&children);
    assert_eq!(
        postgres.image.as_deref(),
        Some("registry.local/postgres:16")
    );
    assert_eq!(
        postgres.command.as_deref(),
        Some(&["/controller/pgkube", "instance", "run"].map(str::to_owned)[..])
    );
    assert_eq!(postgres.args, None);
    let ports: Vec<_> = postgres
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref().unwrap_or_default(), p.container_port))
        .collect();
    assert_eq!(
        ports,
        [("postgresql", 5432), ("status", 8000), ("metrics", 9187)]
    );
    // Every probe asks the instance manager; the startup probe allows an hour of crash
    // recovery or cloning, so the others need no initial delay.
    let probes = [
        ("startup", &postgres.startup_probe, "/readyz", 2, 1800),
        ("readiness", &postgres.readiness_probe, "/readyz", 2, 3),
        ("liveness", &postgres.liveness_probe, "/healthz", 10, 6),
    ];
    for (which, probe, path, period, failures) in probes {
        let probe = probe.as_ref().unwrap_or_else(|| panic!("{which} probe"));
        let get = probe.http_get.as_ref().expect("an HTTP probe");
        assert_eq!(get.path.as_deref(), Some(path), "{which}");
        assert_eq!(
            get.port,
            IntOrString::String("status".to_owned()),
            "{which}"
        );
        assert_eq!(probe.exec, None, "{which}");
        assert_eq!(probe.period_seconds, Some(period), "{which}");
        assert_eq!(probe.failure_threshold, Some(failures), "{which}");
        assert_eq!(probe.initial_delay_seconds, None, "{which}");
    }
    let resources = postgres
        .resources
        .as_ref()
        .expect("resources from the spec");
    assert_eq!(
        resources.requests.as_ref().expect("requests")["cpu"].0,
        "500m"
    );
    let claim = &spec.volume_claim_templates.as_ref().expect("claims")[0];
    assert_eq!(claim.metadata.name.as_deref(), Some("data"));
    let requests = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref()?.requests.clone());
    assert_eq!(requests.expect("storage request")["storage"].0, "100Gi");
    let class = claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone());
    assert_eq!(class, None, "no class named: the cluster's default");
    assert_eq!(
        pod_spec(&children).termination_grace_period_seconds,
        Some(60)
    );
}

#[test]
fn the_instance_manager_gets_its_environment_from_values_and_the_downward_api() {
    let children = built(&validated("my-cluster", 3));
    let env: BTreeMap<&str, String> = container(&children)
        .env
        .iter()
        .flatten()
        .map(|e| {
            let value = match (&e.value, &e.value_from) {
                (Some(value), None) => value.clone(),
                (None, Some(from)) => format!(
                    "fieldRef {}",
                    from.field_ref.as_ref().expect("a fieldRef").field_path
                ),
                other => panic!("{}: {other:?}", e.name),
            };
            (e.name.as_str(), value)
        })
        .collect();
    let expected: BTreeMap<&str, String> = [
        ("POD_NAME", "fieldRef metadata.name"),
        ("POD_NAMESPACE", "fieldRef metadata.namespace"),
        ("PGDATA", "/var/lib/postgresql/data/pgdata"),
        ("PGKUBE_CONFIG_DIR", "/etc/pgkube/config"),
        ("PGKUBE_SUPERUSER_DIR", "/etc/pgkube/superuser"),
        ("PGKUBE_REPLICATION_DIR", "/etc/pgkube/replication"),
        ("PGKUBE_CONTROL_DIR", "/etc/pgkube/control"),
        ("PGKUBE_APPLICATION_DIR", "/etc/pgkube/application"),
        ("PGKUBE_STATUS_PORT", "8000"),
        ("PGKUBE_SHUTDOWN_TIMEOUT", "50s"),
        ("PGKUBE_TLS_DIR", "/etc/pgkube/tls"),
        ("PGKUBE_TLS_RUNTIME_DIR", "/controller/tls"),
        ("PGKUBE_S3_DIR", "/etc/pgkube/s3"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_owned()))
    .collect();
    // No password in the environment: the instance manager reads the mounted Secrets.
    assert_eq!(env, expected);
}

#[test]
fn an_init_container_installs_the_instance_manager_into_the_shared_volume() {
    let children = built(&validated("my-cluster", 3));
    let pod = pod_spec(&children);
    let init = pod.init_containers.as_deref().expect("init containers");
    assert_eq!(init.len(), 1);
    let install = &init[0];
    assert_eq!(install.name, "install-instance-manager");
    assert_eq!(install.image.as_deref(), Some("registry.local/pgkube:1.2"));
    assert_eq!(install.command, None, "the image's entrypoint is pgkube");
    assert_eq!(
        install.args.as_deref(),
        Some(&["instance", "install", "/controller/pgkube"].map(str::to_owned)[..])
    );
    let mounts = |c: &Container| -> Vec<(String, String, Option<bool>)> {
        c.volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.name.clone(), m.mount_path.clone(), m.read_only))
            .collect()
    };
    let expect = |name: &str, path: &str, ro: Option<bool>| (name.to_owned(), path.to_owned(), ro);
    assert_eq!(mounts(install), [expect("controller", "/controller", None)]);
    assert_eq!(
        mounts(container(&children)),
        [
            expect("data", "/var/lib/postgresql/data", None),
            expect("controller", "/controller", None),
            expect("config", "/etc/pgkube/config", Some(true)),
            expect("superuser", "/etc/pgkube/superuser", Some(true)),
            expect("replication", "/etc/pgkube/replication", Some(true)),
            expect("control", "/etc/pgkube/control", Some(true)),
            expect("application", "/etc/pgkube/application", Some(true)),
            expect("shm", "/dev/shm", None),
            expect("socket", "/var/run/postgresql", None),
            expect("tmp", "/tmp", None),
            expect("tls", "/etc/pgkube/tls", Some(true)),
            expect("s3", "/etc/pgkube/s3", Some(true)),
        ]
    );
    let sources: Vec<(String, Option<String>)> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| {
            let source = v
                .config_map
                .as_ref()
                .map(|c| format!("configMap {}", c.name))
                .or_else(|| {
                    let secret = v.secret.as_ref()?.secret_name.as_deref()?;
                    Some(format!("secret {secret}"))
                });
            (v.name.clone(), source)
        })
        .collect();
    assert_eq!(
        sources,
        [
            ("controller".to_owned(), None),
            (
                "config".to_owned(),
                Some("configMap my-cluster-postgresql-config".to_owned())
            ),
            (
                "superuser".to_owned(),
                Some("secret my-cluster-postgresql-credentials".to_owned())
            ),
            (
                "replication".to_owned(),
                Some("secret my-cluster-postgresql-replication".to_owned())
            ),
            (
                "control".to_owned(),
                Some("secret my-cluster-postgresql-control".to_owned())
            ),
            (
                "application".to_owned(),
                Some("secret my-cluster-app".to_owned())
            ),
            ("shm".to_owned(), None),
            ("socket".to_owned(), None),
            ("tmp".to_owned(), None),
            ("tls".to_owned(), None),
            ("s3".to_owned(), None),
        ]
    );
}

#[test]
fn every_cluster_gets_a_control_token_secret_it_owns() {
    let sole = built(&validated("my-cluster", 1)).control_token;
    assert_eq!(sole, built(&validated("my-cluster", 3)).control_token);
    let secret = &sole;
    assert_eq!(
        secret.metadata.name.as_deref(),
        Some("my-cluster-postgresql-control")
    );
    assert!(
        secret.metadata.owner_references.is_some(),
        "deleted with the cluster"
    );
    assert_eq!(
        secret
            .string_data
            .as_ref()
            .map(|data| data[CONTROL_TOKEN_KEY].as_str()),
        Some("token")
    );
}

#[test]
fn synchronous_replication_names_every_instance_and_asks_for_the_given_count() {
    let cluster = validated("my-cluster", 3);
    let conf = |synchronous_standbys| {
        let input = BuildInput {
            synchronous_standbys,
            ..input("postgres")
        };
        build(&cluster, &input).config_map.data.expect("data")[CONFIG_FILE].clone()
    };
    assert!(!conf(0).contains("synchronous_standby_names"));
    assert!(conf(2).contains(
        "synchronous_standby_names = 'ANY 2 (\"my-cluster-postgresql-0\", \"my-cluster-postgresql-1\", \"my-cluster-postgresql-2\")'\n"
    ), "{}", conf(2));
}

#[test]
fn pods_meet_the_restricted_pod_security_standard() {
    let children = built(&validated("my-cluster", 1));
    let pod = pod_spec(&children);
    let pod_security = pod.security_context.expect("pod security context");
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert_eq!(pod_security.run_as_user, Some(999));
    let init = pod.init_containers.clone().unwrap_or_default();
    for container in init.iter().chain([container(&children)]) {
        let security = container
            .security_context
            .clone()
            .expect("container security");
        assert_eq!(security.allow_privilege_escalation, Some(false));
        assert_eq!(security.run_as_non_root, Some(true));
        assert_eq!(security.read_only_root_filesystem, Some(true));
        assert_eq!(
            security.capabilities.and_then(|c| c.drop),
            Some(vec!["ALL".to_owned()])
        );
        assert_eq!(
            security.seccomp_profile.map(|p| p.type_).as_deref(),
            Some("RuntimeDefault")
        );
    }
}

#[test]
fn services_select_all_pods_the_primary_or_the_replicas() {
    let children = built(&validated("my-cluster", 3));
    let headless = children.headless_service.spec.clone().expect("spec");
    assert_eq!(headless.cluster_ip.as_deref(), Some("None"));
    assert_eq!(headless.publish_not_ready_addresses, Some(true));
    let all_pods = headless.selector.clone().expect("selector");
    let with_role = |role: &str| {
        let mut selector = all_pods.clone();
        selector.insert("db.example.com/role".to_owned(), role.to_owned());
        Some(selector)
    };
    let services = [
        (&children.rw_service, with_role("primary")),
        (&children.ro_service, with_role("replica")),
        (&children.r_service, Some(all_pods.clone())),
    ];
    for (service, selector) in services {
        let spec = service.spec.clone().expect("spec");
        let name = service.metadata.name.clone().unwrap_or_default();
        // Ordinary Services: ready instances only.
        assert_eq!(spec.cluster_ip, None, "{name}");
        assert_eq!(spec.publish_not_ready_addresses, None, "{name}");
        assert_eq!(spec.selector, selector, "{name}");
        assert_eq!(spec.ports, headless.ports, "{name}");
    }
}

#[test]
fn a_single_replica_gets_no_disruption_budget() {
    assert!(
        built(&validated("my-cluster", 1))
            .pod_disruption_budget
            .is_none()
    );
}

/// The sample with scheduling fields, applied by the admission test.
const SCHEDULING_SAMPLE: &str =
    include_str!("../../../../deploy/samples/postgresqlcluster-scheduling.yaml");

fn pod_spec(children: &DesiredChildren) -> PodSpec {
    children
        .statefulset
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod spec")
}

#[test]
fn scheduling_fields_are_copied_verbatim_into_the_pod_template() {
    let mut cluster: PostgreSQLCluster =
        serde_yaml::from_str(SCHEDULING_SAMPLE).expect("sample parses");
    cluster.metadata.namespace = Some("team-a".to_owned());
    cluster.metadata.uid = Some("0b5a5c2e-0000-4000-8000-000000000001".to_owned());
    let spec = cluster.spec.clone();
    assert!(
        !spec.node_selector.is_empty() && !spec.tolerations.is_empty(),
        "the sample sets every scheduling field"
    );
    let valid = validate(&cluster, &LiveFacts::default()).expect("valid");
    let pod = pod_spec(&built(&valid.effective));
    assert_eq!(pod.node_selector, Some(spec.node_selector));
    assert_eq!(pod.tolerations, Some(spec.tolerations));
    assert_eq!(pod.affinity, spec.affinity);
    assert!(pod.affinity.is_some(), "the sample sets an affinity");
}

#[test]
fn without_scheduling_fields_the_template_has_only_the_default_spread() {
    let pod = pod_spec(&built(&validated("my-cluster", 3)));
    assert_eq!((pod.node_selector, pod.tolerations), (None, None));
    let json = serde_json::to_value(built(&validated("my-cluster", 3)).statefulset).expect("json");
    let template = &json["spec"]["template"]["spec"];
    for field in ["nodeSelector", "tolerations", "topologySpreadConstraints"] {
        assert!(template.get(field).is_none(), "{field} in {template}");
    }
    let preferred =
        &template["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(
        preferred[0]["podAffinityTerm"]["labelSelector"]["matchLabels"],
        serde_json::json!({
            "app.kubernetes.io/name": "postgresql",
            "app.kubernetes.io/instance": "my-cluster",
        })
    );
    assert_eq!(
        template["affinity"]
            .as_object()
            .map(|affinity| affinity.len()),
        Some(1),
        "only the pod anti-affinity: {template}"
    );
}

#[test]
fn a_scheduling_change_is_drift_and_an_unchanged_one_is_not() {
    use crate::cluster::drift::{is_up_to_date, stamped};
    let stamped_statefulset = |node_selector: &[(&str, &str)]| {
        let mut cluster = validated("my-cluster", 3);
        cluster.scheduling.node_selector = node_selector
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let sts = built(&cluster).statefulset;
        stamped(serde_json::to_value(sts).expect("json"))
    };
    let live = stamped_statefulset(&[("disk", "ssd")]);
    assert!(is_up_to_date(
        &stamped_statefulset(&[("disk", "ssd")]),
        &live
    ));
    assert!(!is_up_to_date(
        &stamped_statefulset(&[("disk", "nvme")]),
        &live
    ));
    // Removing the field is a change too, although the live object still "contains" it.
    assert!(!is_up_to_date(&stamped_statefulset(&[]), &live));
}

#[test]
fn a_63_character_cluster_name_gives_valid_child_names() {
    let name = "c".repeat(63);
    let children = built(&validated(&name, 10));
    let sts = children.statefulset.metadata.name.clone().expect("name");
    assert!(
        sts.len() <= STATEFULSET_NAME_MAX && is_valid(&sts, NameKind::DnsLabel),
        "{sts}"
    );
    // The highest pod, its hostname and its revision label value.
    let pod = format!("{sts}-9");
    assert!(pod.len() <= DNS_LABEL_MAX, "{pod}");
    assert!(format!("{sts}-{}", "x".repeat(10)).len() <= DNS_LABEL_MAX);
    for service in [
        &children.headless_service,
        &children.rw_service,
        &children.ro_service,
        &children.r_service,
    ] {
        let name = service.metadata.name.clone().expect("name");
        assert!(
            name.len() <= DNS_LABEL_MAX && is_valid(&name, NameKind::DnsLabel),
            "{name}"
        );
    }
    for name in [
        &children.config_map.metadata.name,
        &children.credentials.metadata.name,
        &children.replication_credentials.metadata.name,
    ] {
        let name = name.clone().expect("name");
        assert!(name.len() <= DNS_SUBDOMAIN_MAX && is_valid(&name, NameKind::DnsSubdomain));
    }
    let labels = children.statefulset.metadata.labels.expect("labels");
    assert!(labels.values().all(|v| v.len() <= DNS_LABEL_MAX));
    let service_name = children.statefulset.spec.expect("spec").service_name;
    assert_eq!(service_name, children.headless_service.metadata.name);
}

mod security;
mod volumes;
