//! `pgkube instance run` as real processes on this machine, with PostgreSQL 15 and no
//! Kubernetes: the files the operator's ConfigMap and Secrets would mount are written into a
//! temporary directory per instance, and the test changes them as Kubernetes would.
//!
//! initdb refuses to run as root, so as root the manager runs as the machine's `postgres` user
//! (`setpriv`); otherwise as the current user. Peer authentication maps that OS user to the
//! superuser, so the superuser is named after it. Instance `it-<n>` has an address of its own,
//! 127.0.0.<n+1> (all of 127/8 is the loopback), and all use the same ports, as pods do; the
//! test's `instance.json` names their addresses (`hosts`), which a pod derives from the
//! primary's DNS name instead.
//!
//! The same manager runs in the clusters' pods on the test bed's real node; the tests of
//! `controllers/tests/cluster_on_real_node.rs` drive it through the operator.

mod instance_common;

use std::time::Duration;

use instance_common::*;
use serde_json::Value;

#[tokio::test]
async fn a_replica_clones_the_primary_streams_and_its_slot_goes_when_it_is_removed() {
    let mut bed = Bed::new();
    let primary = bed.start(0, 2);
    wait_status(&bed, primary, "a ready primary", |s| {
        s["role"] == "primary" && s["ready"] == true
    })
    .await;
    let writer = bed.sql(primary, "first").await.expect("primary answers");
    writer
        .batch_execute(
            "CREATE TABLE kept (id int PRIMARY KEY); INSERT INTO kept SELECT generate_series(1, 100)",
        )
        .await
        .expect("writes on the primary");

    let replica = bed.start(1, 2);
    wait_status(&bed, replica, "a streaming replica", |s| {
        s["role"] == "replica" && s["ready"] == true && s["streaming"] == true
    })
    .await;
    let reader = bed.sql(replica, "first").await.expect("replica answers");
    writer
        .execute("INSERT INTO kept VALUES (101)", &[])
        .await
        .expect("a row after the clone");
    let count: i64 = eventually("the replica replays the new row", || async {
        let count: i64 = reader
            .query_one("SELECT count(*) FROM kept", &[])
            .await?
            .get(0);
        Ok((count == 101).then_some(count))
    })
    .await;
    assert_eq!(count, 101);
    let refused = reader
        .execute("INSERT INTO kept VALUES (102)", &[])
        .await
        .expect_err("a replica refuses writes");
    assert!(
        refused.to_string().contains("read-only") || format!("{refused:?}").contains("read-only"),
        "{refused:?}"
    );
    assert_eq!(
        slots(&writer).await.expect("slots"),
        [("pgkube_it_1".to_owned(), true)]
    );

    // Scaling down: the replica stops, the primary learns there is one instance left.
    assert!(terminate(&mut bed, replica).success());
    bed.write_topology(&bed.instances[primary], 1);
    eventually("the removed replica's slot is dropped", || async {
        Ok(slots(&writer).await?.is_empty().then_some(()))
    })
    .await;

    // Scaling up again: the old copy's slot is gone, so the replica clones afresh.
    bed.write_topology(&bed.instances[primary], 2);
    writer
        .execute("INSERT INTO kept VALUES (102)", &[])
        .await
        .expect("a row while the replica was away");
    bed.spawn(replica);
    wait_status(&bed, replica, "streaming again", |s| {
        s["role"] == "replica" && s["streaming"] == true
    })
    .await;
    let reader = bed.sql(replica, "first").await.expect("replica answers");
    let count: i64 = reader
        .query_one("SELECT count(*) FROM kept", &[])
        .await
        .expect("reads")
        .get(0);
    assert_eq!(count, 102);
}

#[tokio::test]
async fn passwords_rotate_and_settings_reload_or_restart_without_the_pod_restarting() {
    let mut bed = Bed::new();
    let primary = bed.start(0, 1);
    wait_status(&bed, primary, "a ready primary", |s| {
        s["role"] == "primary" && s["ready"] == true
    })
    .await;
    let client = bed.sql(primary, "first").await.expect("first password");
    let first_start = started_at(&client).await.expect("start time");

    // Rotation: the new password works, the old one no longer does.
    write_credentials(
        &bed.instances[primary].dir.join("superuser"),
        &bed.superuser,
        "second",
    );
    eventually("the rotated password works", || async {
        Ok(bed.sql(primary, "second").await.ok().map(|_| ()))
    })
    .await;
    assert!(
        bed.sql(primary, "first").await.is_err(),
        "the old password still works"
    );

    // A reloadable setting: applied without a restart.
    let config_file = bed.instances[primary].dir.join("config/postgresql.conf");
    std::fs::write(
        &config_file,
        server_config(&bed.instances[primary], "work_mem = '7MB'\n"),
    )
    .expect("config");
    let client = bed.sql(primary, "second").await.expect("connects");
    eventually("work_mem is reloaded", || async {
        let value: String = client.query_one("SHOW work_mem", &[]).await?.get(0);
        Ok((value == "7MB").then_some(()))
    })
    .await;
    assert_eq!(started_at(&client).await.expect("start time"), first_start);

    // A setting that needs a restart: the manager restarts postgres, not the container.
    std::fs::write(
        &config_file,
        server_config(
            &bed.instances[primary],
            "work_mem = '7MB'\nmax_connections = 42\n",
        ),
    )
    .expect("config");
    let restarted = eventually("max_connections is applied by a restart", || async {
        let Ok(client) = bed.sql(primary, "second").await else {
            return Ok(None);
        };
        let value: String = client.query_one("SHOW max_connections", &[]).await?.get(0);
        Ok((value == "42").then_some(client))
    })
    .await;
    assert_ne!(
        started_at(&restarted).await.expect("start time"),
        first_start
    );
    assert!(
        bed.instances[primary].child.as_mut().is_some_and(|c| c
            .try_wait()
            .ok()
            .flatten()
            .is_none())
    );

    // SIGTERM: a clean stop, and no postgres left behind.
    drop((client, restarted));
    let pgdata = bed.instances[primary].dir.join("data/pgdata");
    let exit = terminate(&mut bed, primary);
    assert!(exit.success(), "the manager exits with {exit}");
    assert!(
        !pgdata.join("postmaster.pid").exists(),
        "a clean shutdown removes postmaster.pid"
    );
    assert_eq!(postgres_processes_of(&pgdata), Vec::<u32>::new());
}

#[tokio::test]
async fn control_needs_the_mounted_token() {
    let mut bed = Bed::new();
    let primary = bed.start(0, 1);
    wait_status(&bed, primary, "a ready primary", |s| {
        s["role"] == "primary" && s["ready"] == true && s["following"].is_null()
    })
    .await;
    let instance = &bed.instances[primary];
    for token in [None, Some("wrong"), Some(&TOKEN[1..])] {
        let (code, body) = post(instance, "/control/promote", token, "{}").await;
        assert_eq!(code, 401, "{token:?}: {body}");
        let follow = r#"{"primary":"it-1","primaryHost":"127.0.0.2"}"#;
        let (code, _) = post(instance, "/control/follow", token, follow).await;
        assert_eq!(code, 401, "{token:?}");
    }
    // Already the primary: promoting is idempotent and answers with the status.
    let (code, body) = post(instance, "/control/promote", Some(TOKEN), "{}").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["role"], "primary");
    assert_eq!(body["pod"], "it-0");
    // Bad orders are refused before they reach the server.
    for bad in ["{}", r#"{"primary":"it-0","primaryHost":"127.0.0.1"}"#] {
        let (code, body) = post(instance, "/control/follow", Some(TOKEN), bad).await;
        assert_eq!(code, 400, "{bad}: {body}");
    }
    // A primary outside the cluster, by host or by name, is never followed.
    for elsewhere in [
        r#"{"primary":"it-1","primaryHost":"192.0.2.10"}"#,
        r#"{"primary":"other-1","primaryHost":"127.0.0.2"}"#,
        r#"{"primary":"it-x","primaryHost":"127.0.0.2"}"#,
    ] {
        let (code, body) = post(instance, "/control/follow", Some(TOKEN), elsewhere).await;
        assert_eq!(code, 400, "{elsewhere}: {body}");
        assert!(
            body["message"]
                .as_str()
                .is_some_and(|text| text.contains("not an instance of this cluster")),
            "{body}"
        );
    }
    // No token mounted: control is disabled.
    std::fs::remove_file(instance.dir.join("control/token")).expect("token removed");
    let (code, body) = post(instance, "/control/promote", Some(TOKEN), "{}").await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|text| text.contains("disabled")),
        "{body}"
    );
    wait_status(&bed, primary, "still the primary", |s| {
        s["role"] == "primary"
    })
    .await;
}

#[tokio::test]
async fn a_switchover_demotes_the_primary_cleanly_and_every_replica_follows_the_new_one() {
    let mut bed = Bed::new();
    let (old, writer) = primary_with_kept_rows(&mut bed, 3).await;
    let new = bed.start(1, 3);
    let other = bed.start(2, 3);
    wait_replica_of(&bed, new, old, 100).await;
    wait_replica_of(&bed, other, old, 100).await;

    // The operator's order: demote the old primary first (a clean shutdown sends it all)...
    drop(writer);
    order_follow(&bed, old, new).await;
    wait_status(&bed, old, "a replica following the new primary", |s| {
        s["role"] == "replica" && s["following"] == "it-1"
    })
    .await;
    // ...then promote the target, which answers once it takes writes.
    let (code, status) = post(&bed.instances[new], "/control/promote", Some(TOKEN), "{}").await;
    assert_eq!(code, 200, "{status}");
    assert_eq!(status["role"], "primary");
    assert!(status["following"].is_null(), "{status}");
    // A second promotion is a no-op.
    let (code, again) = post(&bed.instances[new], "/control/promote", Some(TOKEN), "{}").await;
    assert_eq!((code, &again["role"]), (200, &Value::from("primary")));
    // The other replica is told to follow the new primary.
    order_follow(&bed, other, new).await;

    let writer = bed
        .sql(new, "first")
        .await
        .expect("the new primary answers");
    writer
        .execute("INSERT INTO kept SELECT generate_series(101, 110)", &[])
        .await
        .expect("the new primary takes writes");
    wait_replica_of(&bed, old, new, 110).await;
    wait_replica_of(&bed, other, new, 110).await;
    let streaming: Vec<(String, bool)> =
        eventually("both replicas stream with their slots", || async {
            let now = slots(&writer).await?;
            Ok((now.len() == 2 && now.iter().all(|(_, active)| *active)).then_some(now))
        })
        .await;
    assert_eq!(
        streaming,
        [
            ("pgkube_it_0".to_owned(), true),
            ("pgkube_it_2".to_owned(), true)
        ]
    );
    // The former primary keeps no slot of its own: nobody streams from a standby.
    let old_reader = bed
        .sql(old, "first")
        .await
        .expect("the old primary answers");
    assert_eq!(slots(&old_reader).await.expect("slots"), []);

    // instance.json catches up: nothing moves.
    for index in [old, new, other] {
        bed.write_topology_naming(&bed.instances[index], 3, new);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_status(&bed, new, "still the primary", |s| s["role"] == "primary").await;
    wait_replica_of(&bed, old, new, 110).await;
}

#[tokio::test]
async fn a_crashed_primary_with_unreplicated_writes_is_rewound_into_a_replica_of_the_new_one() {
    let mut bed = Bed::new();
    let (old, writer) = primary_with_kept_rows(&mut bed, 2).await;
    let new = bed.start(1, 2);
    wait_replica_of(&bed, new, old, 100).await;

    // The replica stops; the primary takes writes it never gets, then crashes.
    assert!(terminate(&mut bed, new).success());
    writer
        .execute("INSERT INTO kept SELECT generate_series(1001, 1100)", &[])
        .await
        .expect("writes only the old primary has");
    drop(writer);
    kill_postgres_of(&bed.instances[old].dir.join("data/pgdata"));
    let exit = bed.instances[old]
        .child
        .take()
        .expect("running")
        .wait()
        .expect("the manager exits");
    assert!(
        !exit.success(),
        "the manager exits with an error when postgres dies"
    );

    // Failover: the operator names the replica; it starts as a standby and waits for the order.
    bed.write_topology_naming(&bed.instances[new], 2, new);
    bed.spawn(new);
    wait_status(&bed, new, "a standby waiting to be promoted", |s| {
        s["role"] == "replica" && s["following"].is_null()
    })
    .await;
    let (code, status) = post(&bed.instances[new], "/control/promote", Some(TOKEN), "{}").await;
    assert_eq!(code, 200, "{status}");
    assert_eq!(status["role"], "primary");
    let writer = bed
        .sql(new, "first")
        .await
        .expect("the new primary answers");
    writer
        .execute("INSERT INTO kept SELECT generate_series(101, 110)", &[])
        .await
        .expect("the new primary takes writes");

    // The old primary comes back with a stale instance.json that still names it: it finds the
    // new primary among its peers, rewinds to its history and follows it.
    bed.spawn(old);
    wait_replica_of(&bed, old, new, 110).await;
    let reader = bed
        .sql(old, "first")
        .await
        .expect("the old primary answers");
    let lost: i64 = reader
        .query_one("SELECT count(*) FROM kept WHERE id > 1000", &[])
        .await
        .expect("reads")
        .get(0);
    assert_eq!(lost, 0, "the writes the new primary never had are rewound");
    let timeline: i32 = reader
        .query_one("SELECT received_tli FROM pg_stat_wal_receiver", &[])
        .await
        .expect("reads")
        .get(0);
    assert_eq!(
        timeline, 2,
        "the old primary streams the new primary's timeline"
    );
    writer
        .execute("INSERT INTO kept VALUES (111)", &[])
        .await
        .expect("a write after the rejoin");
    wait_replica_of(&bed, old, new, 111).await;
}

#[tokio::test]
async fn a_former_primary_not_designated_waits_for_the_new_primary_before_rejoining() {
    let mut bed = Bed::new();
    let (old, writer) = primary_with_kept_rows(&mut bed, 2).await;
    drop(writer);
    let new = bed.start(1, 2);
    wait_replica_of(&bed, new, old, 100).await;

    // The primary's pod goes away; the operator names the replica in instance.json.
    assert!(terminate(&mut bed, old).success());
    for index in [old, new] {
        bed.write_topology_naming(&bed.instances[index], 2, new);
    }
    // The file never promotes: the replica stays one, following whom it followed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_status(&bed, new, "still a replica", |s| {
        s["role"] == "replica" && s["following"] == "it-0"
    })
    .await;
    // The former primary comes back and waits: the designated one is no primary yet.
    bed.spawn(old);
    tokio::time::sleep(Duration::from_secs(3)).await;
    wait_status(&bed, old, "waiting, not serving", |s| {
        s["role"] == "starting"
    })
    .await;

    let (code, status) = post(&bed.instances[new], "/control/promote", Some(TOKEN), "{}").await;
    assert_eq!(code, 200, "{status}");
    let writer = bed
        .sql(new, "first")
        .await
        .expect("the new primary answers");
    writer
        .execute("INSERT INTO kept SELECT generate_series(101, 110)", &[])
        .await
        .expect("the new primary takes writes");
    wait_replica_of(&bed, old, new, 110).await;
}

#[tokio::test]
async fn a_replica_ahead_of_the_promoted_one_is_rewound_onto_the_new_timeline() {
    let mut bed = Bed::new();
    let (old, writer) = primary_with_kept_rows(&mut bed, 3).await;
    let new = bed.start(1, 3);
    let ahead = bed.start(2, 3);
    wait_replica_of(&bed, new, old, 100).await;
    wait_replica_of(&bed, ahead, old, 100).await;

    // Replica `new` stops; the primary takes writes only `ahead` receives, then crashes.
    assert!(terminate(&mut bed, new).success());
    writer
        .execute("INSERT INTO kept SELECT generate_series(1001, 1100)", &[])
        .await
        .expect("writes only one replica gets");
    drop(writer);
    wait_replica_of(&bed, ahead, old, 200).await;
    kill_postgres_of(&bed.instances[old].dir.join("data/pgdata"));
    let exit = bed.instances[old]
        .child
        .take()
        .expect("running")
        .wait()
        .expect("the manager exits");
    assert!(!exit.success(), "{exit}");

    // Failover to the replica that is behind: it forks timeline 2 off before `ahead`'s
    // position, so `ahead` cannot stream from it as it is.
    bed.write_topology_naming(&bed.instances[new], 3, new);
    bed.spawn(new);
    wait_status(&bed, new, "a standby waiting to be promoted", |s| {
        s["role"] == "replica" && s["following"].is_null()
    })
    .await;
    let (code, status) = post(&bed.instances[new], "/control/promote", Some(TOKEN), "{}").await;
    assert_eq!(code, 200, "{status}");
    let writer = bed
        .sql(new, "first")
        .await
        .expect("the new primary answers");
    writer
        .execute("INSERT INTO kept SELECT generate_series(101, 110)", &[])
        .await
        .expect("the new primary takes writes");
    order_follow(&bed, ahead, new).await;

    // `ahead` finds its history diverged, is rewound and streams timeline 2.
    wait_replica_of(&bed, ahead, new, 110).await;
    let reader = bed.sql(ahead, "first").await.expect("the replica answers");
    let lost: i64 = reader
        .query_one("SELECT count(*) FROM kept WHERE id > 1000", &[])
        .await
        .expect("reads")
        .get(0);
    assert_eq!(lost, 0, "the rows beyond the fork are rewound");
    let timeline: i32 = reader
        .query_one("SELECT received_tli FROM pg_stat_wal_receiver", &[])
        .await
        .expect("reads")
        .get(0);
    assert_eq!(
        timeline, 2,
        "the replica streams the new primary's timeline"
    );
    writer
        .execute("INSERT INTO kept VALUES (111)", &[])
        .await
        .expect("a write after the rewind");
    wait_replica_of(&bed, ahead, new, 111).await;
    assert_eq!(
        slots(&writer).await.expect("slots"),
        [("pgkube_it_2".to_owned(), true)]
    );
}

#[tokio::test]
async fn a_replica_whose_wal_is_gone_from_the_primary_is_cloned_again() {
    let mut bed = Bed::new();
    let primary = bed.start(0, 2);
    wait_status(&bed, primary, "a ready primary", |s| {
        s["role"] == "primary" && s["ready"] == true
    })
    .await;
    let writer = bed.sql(primary, "first").await.expect("primary answers");
    writer
        .batch_execute(
            "CREATE TABLE kept (id int PRIMARY KEY); INSERT INTO kept SELECT generate_series(1, 100)",
        )
        .await
        .expect("writes on the primary");
    let replica = bed.start(1, 2);
    wait_replica_of(&bed, replica, primary, 100).await;
    // Gone with the data directory when it is cloned again.
    let marker = bed.instances[replica].dir.join("data/pgdata/test-marker");
    std::fs::write(&marker, "").expect("marker");

    // The replica's WAL receiver freezes (it still looks streaming); the primary cuts its
    // connection, loses its slot and moves its WAL on past what the replica has.
    let reader = bed.sql(replica, "first").await.expect("replica answers");
    let receiver: i32 = reader
        .query_one("SELECT pid FROM pg_stat_wal_receiver", &[])
        .await
        .expect("a WAL receiver")
        .get(0);
    drop(reader);
    signal_process(receiver, "STOP");
    writer
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_replication WHERE application_name = 'it-1'",
            &[],
        )
        .await
        .expect("the walsender is stopped");
    eventually("the slot is free and dropped", || async {
        let dropped = writer
            .execute("SELECT pg_drop_replication_slot('pgkube_it_1')", &[])
            .await;
        Ok(dropped.is_ok().then_some(()))
    })
    .await;
    for id in 101..=106 {
        writer
            .batch_execute(&format!(
                "INSERT INTO kept VALUES ({id}); SELECT pg_switch_wal(); CHECKPOINT"
            ))
            .await
            .expect("WAL moves on");
    }
    signal_process(receiver, "CONT");

    // The replica never streams again as it is: it is cloned afresh, and streams. (Its
    // status said streaming all along: the frozen receiver's state.)
    eventually("the replica is cloned again", || async {
        Ok((!marker.exists()).then_some(()))
    })
    .await;
    wait_replica_of(&bed, replica, primary, 106).await;
    writer
        .execute("INSERT INTO kept VALUES (107)", &[])
        .await
        .expect("a write after the clone");
    wait_replica_of(&bed, replica, primary, 107).await;
    assert_eq!(
        slots(&writer).await.expect("slots"),
        [("pgkube_it_1".to_owned(), true)]
    );
}
