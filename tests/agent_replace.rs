//! `pgkube agent restore --drop-existing` against the test bed's PostgreSQL and Garage: an
//! existing database is replaced only by a restore that completed; one that fails half way puts
//! the existing database back, unchanged and open, and keeps what it created aside.

mod agent_common;

use agent_common::{Agent, Scratch, connect, fingerprint};
use pgkube_testkit::testbed;
use pgkube_testkit::tokio_postgres::Client;

/// Databases whose name starts with `prefix`.
async fn databases_like(admin: &Client, prefix: &str) -> Vec<String> {
    admin
        .query(
            "SELECT datname FROM pg_database WHERE starts_with(datname, $1) ORDER BY datname",
            &[&prefix],
        )
        .await
        .expect("pg_database")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_replacement_puts_the_existing_database_back_unchanged() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "replace").await;
    let (bucket, database, work) = (&scratch.bucket, &scratch.database, &scratch.work);
    let agent = Agent::new(&env, bucket.name(), "", work);
    let name = database.name();
    let admin = connect(&agent.login, "postgres").await;
    let role = format!("{name}_owner");
    admin
        .batch_execute(&format!("CREATE ROLE \"{role}\""))
        .await
        .expect("a role");
    let client = database.connect().await;
    client
        .batch_execute(&format!(
            "CREATE TABLE kept (id int PRIMARY KEY, body text);
             INSERT INTO kept SELECT g, 'row ' || g FROM generate_series(1, 1000) g;
             ALTER TABLE kept OWNER TO \"{role}\";"
        ))
        .await
        .expect("filled");
    let at_backup = fingerprint(&client).await;
    agent
        .backup("owned", &["--database", name])
        .await
        .assert_completed();

    // The role goes: restoring the dump (without the globals) fails at `OWNER TO` it, after
    // pg_restore created the database and some of it.
    client
        .batch_execute("ALTER TABLE kept OWNER TO CURRENT_USER; INSERT INTO kept VALUES (0, 'new')")
        .await
        .expect("changed");
    drop(client);
    admin
        .batch_execute(&format!("DROP ROLE \"{role}\""))
        .await
        .expect("role dropped");
    let before = fingerprint(&database.connect().await).await;
    let replace = ["--database", name, "--drop-existing", "--skip-globals"];
    let failed = agent.restore("owned", &replace).await;
    failed.assert_failed();
    let message = failed.message();
    assert!(message.contains("pg_restore failed"), "{message}");
    assert!(
        message.contains(&format!(
            "the existing database {name} was put back unchanged"
        )),
        "{message}"
    );
    assert_eq!(
        fingerprint(&database.connect().await).await,
        before,
        "the existing database is back, open, with what it held"
    );
    let failed_copies = databases_like(&admin, &format!("{name}_pgkube_failed_")).await;
    assert_eq!(failed_copies.len(), 1, "{failed_copies:?}");
    assert!(message.contains(&failed_copies[0]), "{message}");
    assert!(
        databases_like(&admin, &format!("{name}_pgkube_old_"))
            .await
            .is_empty()
    );

    // The same when the database replaced is the agent's maintenance database: the renames go
    // through template1.
    let mut as_maintenance = replace.to_vec();
    as_maintenance.extend(["--maintenance-database", name]);
    agent
        .restore("owned", &as_maintenance)
        .await
        .assert_failed();
    assert_eq!(fingerprint(&database.connect().await).await, before);
    let failed_copies = databases_like(&admin, &format!("{name}_pgkube_failed_")).await;
    assert_eq!(failed_copies.len(), 2, "{failed_copies:?}");

    // With the role back, the replacement completes and the old database is gone.
    admin
        .batch_execute(&format!("CREATE ROLE \"{role}\""))
        .await
        .expect("the role again");
    agent.restore("owned", &replace).await.assert_completed();
    assert_eq!(fingerprint(&database.connect().await).await, at_backup);
    assert!(
        databases_like(&admin, &format!("{name}_pgkube_old_"))
            .await
            .is_empty()
    );

    for copy in failed_copies {
        let drop = format!("DROP DATABASE \"{copy}\" WITH (FORCE)");
        admin.batch_execute(&drop).await.expect("cleanup");
    }
    scratch.cleanup().await;
    admin
        .batch_execute(&format!("DROP ROLE IF EXISTS \"{role}\""))
        .await
        .expect("role dropped");
}
