use super::super::desired::Topology;
use super::*;

fn desired() -> Desired {
    let credentials = |username: &str, password: &str| Credentials {
        username: username.to_owned(),
        password: password.to_owned(),
        password_file: PathBuf::from("/etc/pgkube/x/password"),
    };
    Desired {
        postgresql_conf: "port = 5432\nwork_mem = '8MB'\n".to_owned(),
        pg_hba_conf: "local all all peer\n".to_owned(),
        topology: Topology {
            primary: "db-postgresql-0".to_owned(),
            primary_host: "db-postgresql-0.db-postgresql-headless.ns.svc".to_owned(),
            port: 5432,
            replicas: 3,
            statefulset: "db-postgresql".to_owned(),
            hosts: Default::default(),
            cluster_uid: None,
            system_identifier: None,
            isolation_timeout_seconds: Some(3),
            restart_by_switchover: false,
            wal_archive: None,
            in_place: None,
            recovery: None,
            tls_only: false,
        },
        superuser: credentials("postgres", "super"),
        replication: credentials("streaming_replica", "pa:ss\\word"),
        application: None,
    }
}

#[test]
fn every_data_state_has_one_plan_and_only_the_designated_primary_takes_writes() {
    use DataState::*;
    use StartPlan::*;
    let cases = [
        ("a-0", Empty, Initdb),
        ("a-1", Empty, Clone),
        ("a-0", Primary, RunPrimary),
        ("a-1", Primary, Demote),
        ("a-0", Standby, Promote),
        ("a-1", Standby, Follow),
    ];
    for (pod, state, expected) in cases {
        let plan = plan(pod, "a-0", state, false);
        assert_eq!(plan, expected, "{pod} with {state:?}");
        // A designated standby waits for /control/promote: it starts as a replica.
        assert_eq!(
            plan.role() == Role::Primary,
            pod == "a-0" && state != Standby
        );
    }
}

#[test]
fn an_empty_volume_never_runs_initdb_once_the_cluster_has_its_database() {
    use DataState::*;
    use StartPlan::*;
    assert_eq!(plan("a-0", "a-0", Empty, true), WaitForData);
    assert_eq!(WaitForData.role(), Role::Replica);
    assert_eq!(plan("a-1", "a-0", Empty, true), Clone);
    // Existing data goes as before.
    assert_eq!(plan("a-0", "a-0", Primary, true), RunPrimary);
    assert_eq!(plan("a-1", "a-0", Standby, true), Follow);
}

#[test]
fn a_copy_replaces_data_only_once_complete_and_an_interrupted_swap_is_undone() {
    let root = std::env::temp_dir().join(format!("pgkube-swap-{}", std::process::id()));
    let pgdata = root.join("pgdata");
    let copy = root.join("pgdata.clone");
    for (dir, content) in [(&pgdata, "old"), (&copy, "new")] {
        std::fs::create_dir_all(dir).expect("dir");
        std::fs::write(dir.join(VERSION_FILE), "15\n").expect("version");
        std::fs::write(dir.join("data"), content).expect("data");
    }
    swap_in(&copy, &pgdata).expect("swapped");
    assert_eq!(
        std::fs::read_to_string(pgdata.join("data")).expect("read"),
        "new"
    );
    assert!(!copy.exists() && !previous_of(&pgdata).exists());
    // A crash after the old data went aside and before the copy came in.
    std::fs::rename(&pgdata, previous_of(&pgdata)).expect("aside");
    recover_interrupted_swap(&pgdata).expect("recovered");
    assert_eq!(
        std::fs::read_to_string(pgdata.join("data")).expect("read"),
        "new"
    );
    assert!(!previous_of(&pgdata).exists());
    // A crash after the copy came in: the old data aside is removed.
    std::fs::create_dir_all(previous_of(&pgdata)).expect("aside again");
    recover_interrupted_swap(&pgdata).expect("recovered");
    assert!(!previous_of(&pgdata).exists() && pgdata.join("data").exists());
    remove_dir(&root).expect("clean up");
}

#[test]
fn a_replica_config_names_the_primary_and_its_slot_but_no_password() {
    let desired = desired();
    let config = server_config(
        &desired,
        "db-postgresql-2",
        Some(&desired.topology.primary_host),
        Path::new("/controller/pgpass"),
        &[],
        "",
        None,
    );
    assert!(config.contains("work_mem = '8MB'\n"));
    assert!(config.contains(
        "primary_conninfo = 'host=''db-postgresql-0.db-postgresql-headless.ns.svc'' port=5432 \
         user=''streaming_replica'' passfile=''/controller/pgpass'' \
         application_name=''db-postgresql-2'' sslmode=disable'\n"
    ));
    assert!(config.contains("primary_slot_name = 'pgkube_db_postgresql_2'\n"));
    assert!(!config.contains("pa:ss"));
}

#[test]
fn a_primary_config_has_no_primary_conninfo() {
    let config = server_config(
        &desired(),
        "db-postgresql-0",
        None,
        Path::new("/p"),
        &[],
        "",
        None,
    );
    assert!(config.contains("cluster_name = 'db-postgresql-0'\n"));
    assert!(!config.contains("primary_conninfo"));
}

#[test]
fn an_archiving_instance_runs_the_managers_archive_command_whatever_the_parameters_say() {
    let mut desired = desired();
    let command = "/controller/pgkube instance archive-wal --socket /controller/s %f";
    let config = server_config(
        &desired,
        "db-postgresql-0",
        None,
        Path::new("/p"),
        &[],
        command,
        None,
    );
    assert!(!config.contains("archive_command"), "{config}");
    desired
        .postgresql_conf
        .push_str("archive_command = 'cp %p /elsewhere'\n");
    desired.topology.wal_archive = Some(pgkube_controllers::storage::wal::WalArchiveTarget {
        bucket: "b".into(),
        region: "r".into(),
        endpoint: None,
        force_path_style: false,
        root: "wal/db/".into(),
        cluster: "ns/db".into(),
        ca_bundle: false,
        keys: true,
        server_side_encryption: None,
    });
    let config = server_config(
        &desired,
        "db-postgresql-0",
        None,
        Path::new("/p"),
        &[],
        command,
        None,
    );
    let last = config
        .lines()
        .rfind(|line| line.starts_with("archive_command"));
    assert_eq!(
        last,
        Some(format!("archive_command = '{command}'").as_str())
    );
}

#[test]
fn a_standby_keeps_the_primarys_higher_settings_until_it_replays_the_change() {
    let controldata = "wal_level setting:                    replica\n\
                       max_connections setting:              100\n\
                       max_worker_processes setting:         8\n\
                       max_wal_senders setting:              10\n\
                       max_prepared_xacts setting:           0\n\
                       max_locks_per_xact setting:           64\n";
    let recorded = parse_controldata(controldata);
    assert_eq!(recorded.len(), 5);
    let lowered = "max_connections = 100\n# spec\nmax_connections = '90'\n";
    let floors = standby_floors(lowered, &recorded);
    assert_eq!(floors, [("max_connections".to_owned(), 100)]);
    let config = server_config(
        &desired(),
        "db-postgresql-1",
        Some("h"),
        Path::new("/p"),
        &floors,
        "",
        None,
    );
    assert!(config.ends_with("max_connections = 100\n"), "{config}");
    // Once the standby replayed the primary's lower value, nothing is kept.
    let replayed = parse_controldata(&controldata.replace("100", "90"));
    assert!(standby_floors(lowered, &replayed).is_empty());
    // A setting left to its default counts as the default.
    assert!(standby_floors("work_mem = '8MB'\n", &recorded).is_empty());
}

#[test]
fn the_rewind_source_is_the_new_primary_as_the_superuser_with_a_passfile() {
    let conninfo = superuser_conninfo(
        "db-postgresql-1.h",
        5432,
        &desired().superuser,
        "db-postgresql-0",
        Path::new("/controller/pgpass-superuser"),
        None,
    );
    assert_eq!(
        conninfo,
        "host='db-postgresql-1.h' port=5432 user='postgres' dbname=postgres \
         passfile='/controller/pgpass-superuser' application_name='db-postgresql-0-rewind' \
         connect_timeout=10 sslmode=disable"
    );
    assert!(!conninfo.contains("super'"));
}

#[test]
fn with_certificates_the_server_speaks_tls_and_replicas_verify_the_primary() {
    let mut desired = desired();
    desired.topology.tls_only = true;
    let tls = InstanceTls {
        dir: Path::new("/controller/tls"),
        digest: "0123456789abcdef0123",
        verify: desired.topology.tls_only,
        client_ca_file: crate::tls::CLIENT_CA_FILE,
    };
    let config = server_config(
        &desired,
        "db-postgresql-2",
        Some(&desired.topology.primary_host),
        Path::new("/controller/pgpass"),
        &[],
        "",
        Some(&tls),
    );
    for line in [
        "# TLS (certificates 0123456789abcdef)\n",
        "ssl = on\n",
        "ssl_cert_file = '/controller/tls/tls.crt'\n",
        "ssl_key_file = '/controller/tls/tls.key'\n",
        // Client certificates are verified with pgkube's CA, the server's with its own.
        "ssl_ca_file = '/controller/tls/client-ca.crt'\n",
    ] {
        assert!(config.contains(line), "{line} in {config}");
    }
    assert!(
        config.contains(
            "application_name=''db-postgresql-2'' sslmode=verify-full \
             sslrootcert=''/controller/tls/servers-ca.crt'' sslcert=''/controller/tls/replication.crt'' \
             sslkey=''/controller/tls/replication.key'''\n"
        ),
        "{config}"
    );
    // While some instances have no certificates yet, TLS is used when offered.
    let rewind = superuser_conninfo(
        "h",
        5432,
        &desired.superuser,
        "db-postgresql-0",
        Path::new("/p"),
        Some(
            &InstanceTls {
                verify: false,
                ..tls
            }
            .client(ClientRole::Superuser),
        ),
    );
    assert!(
        rewind.ends_with(
            "sslmode=prefer sslrootcert='/controller/tls/servers-ca.crt' \
             sslcert='/controller/tls/superuser.crt' sslkey='/controller/tls/superuser.key'"
        ),
        "{rewind}"
    );
}

#[test]
fn pgpass_escapes_colons_and_backslashes() {
    assert_eq!(
        pgpass(&desired().replication),
        "*:*:*:streaming_replica:pa\\:ss\\\\word\n"
    );
}

#[test]
fn data_state_follows_the_files() {
    let dir = std::env::temp_dir().join(format!("pgkube-datadir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    assert_eq!(DataState::of(&dir), DataState::Empty);
    std::fs::write(dir.join(VERSION_FILE), "15\n").expect("write");
    assert_eq!(DataState::of(&dir), DataState::Primary);
    set_standby(&dir, true).expect("standby");
    assert_eq!(DataState::of(&dir), DataState::Standby);
    set_standby(&dir, false).expect("primary");
    set_standby(&dir, false).expect("twice is fine");
    assert_eq!(DataState::of(&dir), DataState::Primary);
    assert!(write_config(&dir, "a = 1\n", "local all all peer\n").expect("first"));
    assert!(!write_config(&dir, "a = 1\n", "local all all peer\n").expect("same"));
    remove_slots(&dir).expect("no slots directory");
    std::fs::create_dir_all(dir.join("pg_replslot/pgkube_a_1")).expect("slot dir");
    std::fs::write(dir.join("pg_replslot/pgkube_a_1/state"), "x").expect("slot state");
    remove_slots(&dir).expect("slots removed");
    assert_eq!(
        std::fs::read_dir(dir.join("pg_replslot"))
            .expect("kept")
            .count(),
        0
    );
    remove_dir(&dir).expect("clean up");
    remove_dir(&dir).expect("already gone");
}

#[test]
fn the_first_instance_of_a_recovering_cluster_recovers_instead_of_initdb() {
    use DataState::*;
    use StartPlan::*;
    assert_eq!(plan_start("a-0", "a-0", Empty, false, true), Recover);
    assert_eq!(plan_start("a-0", "a-0", Empty, false, false), Initdb);
    // Once the cluster recorded its database, an empty volume never recovers again.
    assert_eq!(plan_start("a-0", "a-0", Empty, true, true), WaitForData);
    assert_eq!(plan_start("a-1", "a-0", Empty, false, true), Clone);
    assert_eq!(plan_start("a-0", "a-0", Primary, false, true), RunPrimary);
    assert_eq!(Recover.role(), Role::Primary);
}
