//! The server the scrapes read, given a realistic shape: databases with tables that have rows
//! and statistics, replication slots that retain WAL, and idle client connections.

use instance_common::Bed;
use tokio_postgres::Client;

use super::instance_common;

/// Databases made besides `postgres`.
pub const DATABASES: usize = 20;
/// Tables in each of them.
pub const TABLES_PER_DATABASE: usize = 20;
/// Physical slots made besides the replica's, each retaining WAL from its creation.
pub const EXTRA_SLOTS: usize = 3;
/// Client connections kept open and idle while the scrapes run.
pub const IDLE_CONNECTIONS: usize = 10;

/// What must stay open while the scrapes run.
pub struct Shape {
    _idle: Vec<Client>,
}

/// Makes the databases, tables and slots on instance `primary`, and opens the idle connections.
pub async fn make(bed: &Bed, primary: usize) -> Shape {
    let sql = connect(bed, primary, "postgres").await;
    for database in 1..=DATABASES {
        sql.batch_execute(&format!("CREATE DATABASE {}", database_name(database)))
            .await
            .expect("a database");
        let inside = connect(bed, primary, &database_name(database)).await;
        let tables: String = (1..=TABLES_PER_DATABASE)
            .map(|table| {
                format!(
                    "CREATE TABLE t{table:02} (id int PRIMARY KEY, payload text); \
                     INSERT INTO t{table:02} SELECT g, md5(g::text) FROM generate_series(1, 100) g;"
                )
            })
            .collect();
        inside
            .batch_execute(&format!("{tables} ANALYZE"))
            .await
            .expect("tables with rows");
    }
    sql.batch_execute(&format!(
        "SELECT pg_create_physical_replication_slot('bench_slot_' || i, true) \
         FROM generate_series(1, {EXTRA_SLOTS}) i"
    ))
    .await
    .expect("slots");
    let mut idle = Vec::new();
    for connection in 0..IDLE_CONNECTIONS {
        let database = match connection % 2 {
            0 => "postgres".to_owned(),
            _ => database_name(1 + connection % DATABASES),
        };
        idle.push(connect(bed, primary, &database).await);
    }
    Shape { _idle: idle }
}

fn database_name(number: usize) -> String {
    format!("bench_{number:02}")
}

/// A connection to `database` on instance `index` over TCP, as the superuser.
pub async fn connect(bed: &Bed, index: usize, database: &str) -> Client {
    let instance = &bed.instances[index];
    let (client, connection) = tokio_postgres::Config::new()
        .host(instance.address.to_string())
        .port(instance.pg_port)
        .user(&bed.superuser)
        .password("first")
        .dbname(database)
        .connect(tokio_postgres::NoTls)
        .await
        .expect("the primary answers");
    tokio::spawn(connection);
    client
}
