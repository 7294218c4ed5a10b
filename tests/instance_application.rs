//! The application role and database that `pgkube instance run` makes on its primary from the
//! mounted `<cluster>-app` Secret, against a real PostgreSQL 15 (see `instance_manager.rs` for
//! how the instances run without Kubernetes).

mod instance_common;

use instance_common::*;

/// The role's comment that marks it as pgkube's (`src/instance/application.rs`).
const MANAGED_COMMENT: &str = "Application role, managed by pgkube";

/// Writes the application Secret's files as the kubelet would.
fn write_application(bed: &Bed, index: usize, username: &str, password: &str, database: &str) {
    let dir = bed.instances[index].dir.join("application");
    std::fs::write(dir.join("dbname"), database).expect("dbname");
    write_credentials(&dir, username, password);
}

/// Logs in as `user` with `password` to `database` of instance `index` over TCP.
async fn log_in(
    bed: &Bed,
    index: usize,
    user: &str,
    password: &str,
    database: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let instance = &bed.instances[index];
    let (client, connection) = tokio_postgres::Config::new()
        .host(instance.address.to_string())
        .port(instance.pg_port)
        .user(user)
        .password(password)
        .dbname(database)
        .connect(tokio_postgres::NoTls)
        .await?;
    tokio::spawn(connection);
    Ok(client)
}

#[tokio::test]
async fn the_primary_makes_the_application_role_and_database_and_leaves_a_role_it_did_not_make() {
    let mut bed = Bed::new();
    let primary = bed.start(0, 1);
    wait_status(&bed, primary, "a ready primary", |s| {
        s["role"] == "primary" && s["ready"] == true
    })
    .await;
    let superuser = bed.sql(primary, "first").await.expect("superuser");

    // The Secret appears after the pod started (an upgraded cluster): the role and its
    // database are made, and the role logs in to it with the Secret's password.
    write_application(&bed, primary, "app", "app-password", "appdb");
    let app = eventually("the application role logs in to its database", || async {
        Ok(log_in(&bed, primary, "app", "app-password", "appdb")
            .await
            .ok())
    })
    .await;
    let owner: String = app
        .query_one(
            "SELECT pg_get_userbyid(datdba)::text FROM pg_database WHERE datname = current_database()",
            &[],
        )
        .await
        .expect("owner")
        .get(0);
    assert_eq!(owner, "app");
    app.batch_execute("CREATE TABLE orders (id int); INSERT INTO orders VALUES (1)")
        .await
        .expect("the owner writes in its database");
    let comment: Option<String> = superuser
        .query_one(
            "SELECT shobj_description(oid, 'pg_authid') FROM pg_roles WHERE rolname = 'app'",
            &[],
        )
        .await
        .expect("comment")
        .get(0);
    assert_eq!(comment.as_deref(), Some(MANAGED_COMMENT));

    // A rotated password takes over; the database and its data stay.
    write_application(&bed, primary, "app", "rotated", "appdb");
    let rotated = eventually("the rotated application password logs in", || async {
        Ok(log_in(&bed, primary, "app", "rotated", "appdb").await.ok())
    })
    .await;
    let rows: i64 = rotated
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows, 1);
    assert!(
        log_in(&bed, primary, "app", "app-password", "appdb")
            .await
            .is_err(),
        "the old application password still logs in"
    );

    // A role of the Secret's name that pgkube did not make keeps its own password: its users
    // are not locked out. Its database is still made.
    superuser
        .batch_execute("CREATE ROLE someone WITH LOGIN PASSWORD 'their-own'")
        .await
        .expect("a role of the user's");
    write_application(&bed, primary, "someone", "the-secrets", "theirs");
    eventually("the database of the Secret is made", || async {
        let found = superuser
            .query_opt(
                "SELECT 1 FROM pg_database WHERE datname = 'theirs' AND pg_get_userbyid(datdba) = 'someone'",
                &[],
            )
            .await?;
        Ok(found.map(drop))
    })
    .await;
    log_in(&bed, primary, "someone", "their-own", "theirs")
        .await
        .expect("the role's own password still logs in");
    assert!(
        log_in(&bed, primary, "someone", "the-secrets", "theirs")
            .await
            .is_err(),
        "the Secret's password was set on a role pgkube did not make"
    );
}
