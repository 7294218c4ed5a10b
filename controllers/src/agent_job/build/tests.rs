//! Tests of the backup and restore Jobs as built.

use super::*;
use k8s_openapi::api::core::v1::{EnvVar, SecretKeySelector};
use pgkube_crds::{
    CompressionMethod, LocalReference, PostgreSQLBackupSpec, PostgreSQLClusterSpec, S3Credentials,
};

fn selector(name: &str, key: &str) -> SecretKeySelector {
    SecretKeySelector {
        name: name.to_owned(),
        key: key.to_owned(),
        optional: None,
    }
}

fn storage() -> S3Storage {
    S3Storage {
        bucket: "backups".to_owned(),
        prefix: None,
        endpoint: Some("https://s3.example:9000".to_owned()),
        region: "garage".to_owned(),
        force_path_style: true,
        ca_bundle: Some(selector("s3-ca", "ca.pem")),
        credentials: Some(S3Credentials {
            access_key_id: selector("s3-keys", "id"),
            secret_access_key: selector("s3-keys", "secret"),
        }),
        server_side_encryption: None,
        allow_plain_http: false,
    }
}

fn cluster() -> PostgreSQLCluster {
    let mut spec: PostgreSQLClusterSpec = serde_json::from_value(
        serde_json::json!({"storage": {"size": "1Gi"}, "postgresVersion": "15"}),
    )
    .expect("spec");
    spec.node_selector = BTreeMap::from([("disk".to_owned(), "ssd".to_owned())]);
    let mut cluster = PostgreSQLCluster::new("main", spec);
    cluster.metadata.namespace = Some("db".to_owned());
    cluster.metadata.uid = Some("cluster-uid".to_owned());
    cluster
}

fn backup() -> PostgreSQLBackup {
    let mut backup = PostgreSQLBackup::new(
        "nightly",
        PostgreSQLBackupSpec {
            cluster: LocalReference {
                name: "main".to_owned(),
            },
            method: Default::default(),
            target: None,
            deletion_policy: Default::default(),
            compression: None,
        },
    );
    backup.metadata.namespace = Some("db".to_owned());
    backup.metadata.uid = Some("0000-uid".to_owned());
    backup
}

fn job() -> Job {
    job_compressed(BackupCompression::default())
}

fn job_compressed(compression: BackupCompression) -> Job {
    job_with(compression, &ResourceRequirements::default())
}

fn job_with(compression: BackupCompression, resources: &ResourceRequirements) -> Job {
    job_reading(compression, resources, None)
}

fn job_reading(
    compression: BackupCompression,
    resources: &ResourceRequirements,
    source: Option<crate::backup::physical::Source>,
) -> Job {
    job_of(compression, resources, source, &cluster(), &storage())
}

fn job_of(
    compression: BackupCompression,
    resources: &ResourceRequirements,
    source: Option<crate::backup::physical::Source>,
    cluster: &PostgreSQLCluster,
    storage: &S3Storage,
) -> Job {
    let backup = backup();
    let otel = [(
        "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
        "http://collector:4317".to_owned(),
    )];
    build(&JobInput {
        task: Task::Backup {
            backup: &backup,
            compression,
            source,
        },
        cluster,
        storage,
        prefix: "db/main",
        postgres_image_repository: "registry.local/postgres",
        agent_image: "registry.local/pgkube:1.2",
        active_deadline: Duration::from_secs(3600),
        trace_parent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned()),
        otel_env: &otel,
        resources,
    })
}

fn env_of(container: &Container) -> BTreeMap<String, EnvVar> {
    container
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|var| (var.name.clone(), var))
        .collect()
}

#[test]
fn the_job_is_owned_by_the_backup_and_never_retries_or_outlives_its_deadline() {
    let job = job();
    assert_eq!(job.metadata.name.as_deref(), Some("nightly-backup"));
    let owner = &job.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("PostgreSQLBackup", "nightly")
    );
    assert_eq!(owner.controller, Some(true));
    let spec = job.spec.expect("spec");
    assert_eq!(spec.backoff_limit, Some(0));
    assert_eq!(spec.active_deadline_seconds, Some(3600));
    assert_eq!(spec.ttl_seconds_after_finished, Some(86_400));
}

#[test]
fn the_backup_agent_gets_the_method_and_a_level_only_when_one_is_set() {
    let args = |method, level| {
        let job = job_compressed(BackupCompression { method, level });
        let pod = job.spec.expect("spec").template.spec.expect("pod");
        pod.containers[0].args.clone().unwrap_or_default().join(" ")
    };
    assert_eq!(args(CompressionMethod::Gzip, None), "--compression gzip");
    assert_eq!(
        args(CompressionMethod::Zstd, Some(7)),
        "--compression zstd --compression-level 7"
    );
    assert_eq!(args(CompressionMethod::None, None), "--compression none");
    let gzip = args(CompressionMethod::Gzip, Some(9));
    assert_eq!(gzip, "--compression gzip --compression-level 9");
    assert!(!gzip.contains("--dump-compression"));
}

#[test]
fn the_agent_runs_in_the_clusters_postgres_image_after_an_init_container_copies_it() {
    let pod = job().spec.expect("spec").template.spec.expect("pod");
    let init = pod.init_containers.expect("init");
    assert_eq!(init[0].image.as_deref(), Some("registry.local/pgkube:1.2"));
    assert_eq!(
        init[0].args.as_deref(),
        Some(
            &[
                "instance".to_owned(),
                "install".to_owned(),
                AGENT.to_owned()
            ][..]
        )
    );
    let main = &pod.containers[0];
    assert_eq!(main.image.as_deref(), Some("registry.local/postgres:15"));
    assert_eq!(
        main.command.as_deref(),
        Some(&[AGENT.to_owned(), "agent".to_owned(), "backup".to_owned()][..])
    );
    assert_eq!(
        main.args.as_deref(),
        Some(&["--compression".to_owned(), "zstd".to_owned()][..]),
        "nothing but the compression on the command line"
    );
    assert_eq!(
        main.termination_message_policy.as_deref(),
        Some("FallbackToLogsOnError")
    );
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    assert_eq!(
        pod.node_selector,
        Some(BTreeMap::from([("disk".to_owned(), "ssd".to_owned())]))
    );
}

#[test]
fn every_container_is_restricted() {
    let pod = job().spec.expect("spec").template.spec.expect("pod");
    let pod_context = pod.security_context.expect("pod security context");
    assert_eq!(pod_context.run_as_non_root, Some(true));
    for container in pod
        .init_containers
        .expect("init")
        .iter()
        .chain(&pod.containers)
    {
        let context = container
            .security_context
            .as_ref()
            .expect("security context");
        assert_eq!(
            context.allow_privilege_escalation,
            Some(false),
            "{}",
            container.name
        );
        assert_eq!(
            context.capabilities.as_ref().and_then(|c| c.drop.clone()),
            Some(vec!["ALL".to_owned()])
        );
        assert_eq!(context.run_as_non_root, Some(true));
        assert_eq!(context.read_only_root_filesystem, Some(true));
    }
    // What the agent writes (its copy of the certificates) goes to a volume.
    let agent = &pod.containers[0];
    let tmp = agent
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == "/tmp")
        .expect("/tmp is a volume");
    assert_eq!(tmp.read_only, None);
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == tmp.name)
        .expect("its volume");
    assert!(volume.empty_dir.is_some(), "{volume:?}");
}

#[test]
fn a_physical_backup_reads_its_source_as_the_replication_role_and_knows_the_wal_root() {
    let standby = crate::backup::physical::Source {
        pod: "main-postgresql-1".to_owned(),
        standby: true,
    };
    let physical = job_reading(
        BackupCompression::default(),
        &ResourceRequirements::default(),
        Some(standby),
    );
    let pod = physical.spec.expect("spec").template.spec.expect("pod");
    let container = &pod.containers[0];
    let arguments = container.args.clone().unwrap_or_default();
    assert!(
        arguments
            .windows(2)
            .any(|pair| pair == ["--method", "physical"]),
        "{arguments:?}"
    );
    let env = env_of(container);
    let plain = |name: &str| env.get(name).and_then(|v| v.value.clone());
    assert_eq!(
        plain("PGHOST").as_deref(),
        Some("main-rw"),
        "checks and pg_switch_wal"
    );
    assert_eq!(
        plain("PGKUBE_SOURCE_HOST").as_deref(),
        Some("main-postgresql-1.main-postgresql-headless.db.svc")
    );
    assert_eq!(plain("PGKUBE_FROM_STANDBY").as_deref(), Some("true"));
    assert_eq!(
        plain("PGKUBE_REPLICATION_USER").as_deref(),
        Some("streaming_replica")
    );
    assert_eq!(
        plain("PGKUBE_REPLICATION_PASSWORD_FILE").as_deref(),
        Some("/etc/pgkube/replication/password")
    );
    assert_eq!(
        plain("PGKUBE_WAL_ROOT").as_deref(),
        Some("db/main/wal/main/")
    );
    let volume = pod
        .volumes
        .unwrap_or_default()
        .into_iter()
        .find(|volume| volume.name == "replication")
        .expect("the replication Secret's volume");
    assert_eq!(
        volume.secret.and_then(|s| s.secret_name).as_deref(),
        Some("main-postgresql-replication")
    );
    let logical = job().spec.expect("spec").template.spec.expect("pod");
    let logical_env = env_of(&logical.containers[0]);
    assert!(!logical_env.contains_key("PGKUBE_SOURCE_HOST"));
    assert!(
        !logical
            .volumes
            .unwrap_or_default()
            .iter()
            .any(|v| v.name == "replication"),
        "a logical backup gets no replication password"
    );
}

#[test]
fn it_connects_through_the_rw_service_with_secrets_as_files() {
    let pod = job().spec.expect("spec").template.spec.expect("pod");
    let env = env_of(&pod.containers[0]);
    let plain = |name: &str| env.get(name).and_then(|v| v.value.clone());
    assert_eq!(plain("PGHOST").as_deref(), Some("main-rw"));
    assert_eq!(plain("PGKUBE_S3_PREFIX").as_deref(), Some("db/main"));
    assert_eq!(plain("PGKUBE_APPLICATION_ROLE").as_deref(), Some("app"));
    // The backup's directory is named by both uids: <prefix>/<cluster-uid>/<name>/<uid>/.
    assert_eq!(plain("PGKUBE_CLUSTER_UID").as_deref(), Some("cluster-uid"));
    assert_eq!(plain("PGKUBE_BACKUP_UID").as_deref(), Some("0000-uid"));
    assert_eq!(plain("PGKUBE_BACKUP_NAME").as_deref(), Some("nightly"));
    assert!(!env.contains_key("PGKUBE_MANIFEST_KEY"));
    assert_eq!(
        plain("PGKUBE_S3_ENDPOINT").as_deref(),
        Some("https://s3.example:9000")
    );
    assert_eq!(plain("PGKUBE_S3_FORCE_PATH_STYLE").as_deref(), Some("true"));
    assert_eq!(
        plain("PGKUBE_PGPASSWORD_FILE").as_deref(),
        Some("/etc/pgkube/superuser/password")
    );
    assert_eq!(
        plain("TRACEPARENT").as_deref(),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    );
    assert_eq!(
        plain("OTEL_EXPORTER_OTLP_ENDPOINT").as_deref(),
        Some("http://collector:4317")
    );
    for name in ["PGPASSWORD", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        assert!(
            !env.contains_key(name),
            "{name} must not be in the environment"
        );
    }
    // The keys come from the Secret keys the storage names.
    assert_eq!(
        s3_files(&pod),
        [
            (
                "s3-keys".to_owned(),
                "id".to_owned(),
                ACCESS_KEY_ID_FILE.to_owned()
            ),
            (
                "s3-keys".to_owned(),
                "secret".to_owned(),
                SECRET_ACCESS_KEY_FILE.to_owned()
            ),
            (
                "s3-ca".to_owned(),
                "ca.pem".to_owned(),
                CA_BUNDLE_FILE.to_owned()
            ),
        ]
    );
}

/// The (Secret, key, file) of each file of the Job's S3 volume.
fn s3_files(pod: &PodSpec) -> Vec<(String, String, String)> {
    let volumes = pod.volumes.as_ref().expect("volumes");
    let s3 = volumes
        .iter()
        .find(|v| v.name == S3_VOLUME)
        .expect("s3 volume");
    let sources = s3
        .projected
        .as_ref()
        .and_then(|p| p.sources.clone())
        .expect("sources");
    sources
        .iter()
        .filter_map(|source| source.secret.as_ref())
        .flat_map(|secret| {
            secret
                .items
                .iter()
                .flatten()
                .map(|item| (secret.name.clone(), item.key.clone(), item.path.clone()))
        })
        .collect()
}

#[test]
fn without_keys_the_agent_runs_as_the_clusters_account_and_gets_no_key_files() {
    let mut cluster = cluster();
    cluster.spec.service_account_name = Some("backup-writer".to_owned());
    let storage = S3Storage {
        credentials: None,
        ..storage()
    };
    let without_keys = job_of(
        BackupCompression::default(),
        &ResourceRequirements::default(),
        None,
        &cluster,
        &storage,
    );
    let pod = without_keys.spec.expect("spec").template.spec.expect("pod");
    assert_eq!(pod.service_account_name.as_deref(), Some("backup-writer"));
    // The identity's own token volume is added by its webhook; pgkube mounts no API token.
    assert_eq!(pod.automount_service_account_token, Some(false));
    let env = env_of(&pod.containers[0]);
    for name in [
        "PGKUBE_S3_ACCESS_KEY_ID_FILE",
        "PGKUBE_S3_SECRET_ACCESS_KEY_FILE",
    ] {
        assert!(!env.contains_key(name), "{name} is set without keys");
    }
    assert_eq!(
        s3_files(&pod),
        [(
            "s3-ca".to_owned(),
            "ca.pem".to_owned(),
            CA_BUNDLE_FILE.to_owned()
        )]
    );
    // With keys, the default account.
    let with_keys = job().spec.expect("spec").template.spec.expect("pod");
    assert_eq!(with_keys.service_account_name, None);
}

#[test]
fn a_restore_job_runs_agent_restore_with_what_to_restore_owned_by_the_restore() {
    let (cluster, storage) = (cluster(), storage());
    let mut restore = PostgreSQLRestore::new(
        "undo",
        pgkube_crds::PostgreSQLRestoreSpec {
            backup: Some(LocalReference {
                name: "nightly".to_owned(),
            }),
            source: None,
            cluster: LocalReference {
                name: "main".to_owned(),
            },
            databases: vec!["app".to_owned(), "shop".to_owned()],
            drop_existing: true,
            expected_system_identifier: None,
            method: pgkube_crds::RestoreMethod::Logical,
            target: None,
        },
    );
    restore.metadata.namespace = Some("db".to_owned());
    restore.metadata.uid = Some("1111-uid".to_owned());
    let job = build(&JobInput {
        task: Task::Restore {
            restore: &restore,
            backup_name: "nightly",
            manifest_key: "db/main/cluster-uid/nightly/0000-uid/manifest.json",
        },
        cluster: &cluster,
        storage: &storage,
        prefix: "db/main",
        postgres_image_repository: "registry.local/postgres",
        agent_image: "registry.local/pgkube:1.2",
        active_deadline: Duration::from_secs(7200),
        trace_parent: None,
        otel_env: &[],
        resources: &ResourceRequirements::default(),
    });
    assert_eq!(job.metadata.name.as_deref(), Some("undo-restore"));
    let owner = &job.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("PostgreSQLRestore", "1111-uid")
    );
    let labels = job.metadata.labels.clone().expect("labels");
    assert_eq!(labels["app.kubernetes.io/component"], "restore");
    assert_eq!(labels[RESTORE_LABEL], "undo");
    let spec = job.spec.expect("spec");
    assert_eq!(spec.active_deadline_seconds, Some(7200));
    let pod = spec.template.spec.expect("pod");
    let container = &pod.containers[0];
    assert_eq!(container.name, "restore");
    assert_eq!(
        container.command.as_deref(),
        Some(&["/pgkube/pgkube", "agent", "restore"].map(str::to_owned)[..])
    );
    assert_eq!(
        container.args.as_deref(),
        Some(
            &["--database", "app", "--database", "shop", "--drop-existing"].map(str::to_owned)[..]
        )
    );
    let env = env_of(container);
    assert_eq!(env["PGKUBE_BACKUP_NAME"].value.as_deref(), Some("nightly"));
    assert_eq!(env["PGKUBE_S3_PREFIX"].value.as_deref(), Some("db/main"));
    assert_eq!(
        env["PGKUBE_MANIFEST_KEY"].value.as_deref(),
        Some("db/main/cluster-uid/nightly/0000-uid/manifest.json")
    );
    assert!(!env.contains_key("PGKUBE_BACKUP_UID"));
    assert!(!env.contains_key("TRACEPARENT"));
}

/// The restore agent's arguments for a restore whose status recorded `target`.
fn restore_arguments(target: Option<&str>) -> Vec<String> {
    let (cluster, storage) = (cluster(), storage());
    let mut restore: PostgreSQLRestore = serde_json::from_value(serde_json::json!({
        "apiVersion": "db.example.com/v1beta1",
        "kind": "PostgreSQLRestore",
        "metadata": {"name": "undo", "namespace": "db", "uid": "1111-uid"},
        "spec": {"backup": {"name": "nightly"}, "cluster": {"name": "main"}, "dropExisting": true},
    }))
    .expect("restore");
    restore.status = Some(pgkube_crds::PostgreSQLRestoreStatus {
        target_system_identifier: target.map(str::to_owned),
        ..Default::default()
    });
    let job = build(&JobInput {
        task: Task::Restore {
            restore: &restore,
            backup_name: "nightly",
            manifest_key: "db/main/cluster-uid/nightly/0000-uid/manifest.json",
        },
        cluster: &cluster,
        storage: &storage,
        prefix: "db/main",
        postgres_image_repository: "registry.local/postgres",
        agent_image: "registry.local/pgkube:1.2",
        active_deadline: Duration::from_secs(7200),
        trace_parent: None,
        otel_env: &[],
        resources: &ResourceRequirements::default(),
    });
    let pod = job.spec.expect("spec").template.spec.expect("pod");
    pod.containers[0].args.clone().unwrap_or_default()
}

#[test]
fn a_restore_job_expects_the_system_identifier_its_restore_recorded() {
    assert_eq!(
        restore_arguments(Some("7312345678901234567")),
        [
            "--drop-existing",
            "--expect-system-identifier",
            "7312345678901234567"
        ]
    );
    // Any: the user accepted any database, the agent checks none.
    assert_eq!(restore_arguments(Some("Any")), ["--drop-existing"]);
}

#[test]
fn the_agents_containers_get_the_resources_asked_for_and_none_when_none_are() {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let quantities = |pairs: &[(&str, &str)]| {
        Some(
            pairs
                .iter()
                .map(|(name, value)| ((*name).to_owned(), Quantity((*value).to_owned())))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    let resources = ResourceRequirements {
        requests: quantities(&[("cpu", "100m"), ("memory", "256Mi")]),
        limits: quantities(&[("memory", "1Gi")]),
        ..ResourceRequirements::default()
    };
    let pod_of = |job: Job| job.spec.and_then(|spec| spec.template.spec).expect("pod");
    let pod = pod_of(job_with(BackupCompression::default(), &resources));
    assert_eq!(pod.containers[0].resources.as_ref(), Some(&resources));
    let init = &pod.init_containers.expect("init containers")[0];
    assert_eq!(init.name, "install-agent");
    assert_eq!(init.resources.as_ref(), Some(&resources));

    let pod = pod_of(job());
    assert_eq!(pod.containers[0].resources, None);
    let empty = ResourceRequirements {
        requests: Some(BTreeMap::new()),
        ..ResourceRequirements::default()
    };
    let pod = pod_of(job_with(BackupCompression::default(), &empty));
    assert_eq!(pod.containers[0].resources, None, "an empty map is none");
}
