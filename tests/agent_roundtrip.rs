//! Backup and restore round trip through the real `pgkube agent` binary, the test bed's
//! PostgreSQL and its S3 server: several databases, a role owning one of them, a large object
//! and a table of a few hundred MB, compared by row counts and content checksums; the progress
//! lines the agent prints on stderr count what was read.
//!
//! `PGKUBE_AGENT_TEST_BIG_ROWS` sets the size of the big table (default 2,000,000 rows, about
//! 300 MB on disk).

mod agent_common;

use agent_common::{
    Agent, Scratch, connect, database_exists, fingerprint, object_digest, open_multipart_uploads,
    work_dir,
};
use pgkube_controllers::agent_job::AgentProgress;
use pgkube_testkit::tokio_postgres::Client;
use pgkube_testkit::{TestBucket, TestDatabase, testbed};

const DEFAULT_BIG_ROWS: i64 = 2_000_000;

/// The progress lines the agent printed on stderr, in order.
fn progress_lines(stderr: &str) -> Vec<AgentProgress> {
    let lines: Vec<AgentProgress> = stderr
        .lines()
        .filter_map(AgentProgress::last_in_log)
        .collect();
    assert!(!lines.is_empty(), "no progress line: {stderr}");
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_then_restore_reproduces_databases_roles_and_large_objects() {
    let Some(env) = testbed() else { return };
    let bucket = TestBucket::create(&env, "agent-rt").await;
    let big = TestDatabase::create(&env, "agent_rt_big").await;
    let owned = TestDatabase::create(&env, "agent_rt_owned").await;
    let small = TestDatabase::create(&env, "agent_rt_small").await;
    let role = format!("{}_role", owned.name());
    let work = work_dir("roundtrip");
    let mut agent = Agent::new(&env, bucket.name(), "/clusters/main/", &work);
    agent.password_in_file = true;
    let admin = connect(&agent.login, "postgres").await;

    fill_big(&big.connect().await).await;
    admin
        .batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN PASSWORD 'role-password';
             ALTER DATABASE \"{}\" OWNER TO \"{role}\";",
            owned.name()
        ))
        .await
        .expect("creating the role");
    fill_owned(&owned.connect().await, &role).await;
    fill_small(&small.connect().await).await;
    let databases = [big.name(), owned.name(), small.name()];
    let mut before = Vec::new();
    for name in databases {
        before.push(fingerprint(&connect(&agent.login, name).await).await);
    }

    // Backup, in 5 MiB parts so the big dump needs many of them.
    let mut args = vec!["--part-size-mib", "5"];
    for name in databases {
        args.extend(["--database", name]);
    }
    let backup = agent.backup("full-1", &args).await;
    backup.assert_completed();
    assert_eq!(backup.termination, backup.report);
    assert_eq!(backup.report["databaseCount"], 3);
    backup.assert_does_not_reveal(&agent.login.password);
    backup.assert_does_not_reveal(&agent.secret_key);

    // The manifest lists every object with the size and checksum of what is really stored.
    let s3 = bucket.client();
    let manifest_key = agent.key("full-1", "manifest.json");
    assert_eq!(backup.report["manifestKey"], manifest_key.as_str());
    let manifest: serde_json::Value =
        serde_json::from_slice(&agent_common::get_object(&s3, bucket.name(), &manifest_key).await)
            .expect("manifest is JSON");
    assert_eq!(manifest["backupName"], "full-1");
    assert_eq!(manifest["cluster"], "main");
    assert!(
        manifest["postgresqlVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("15"))
    );
    let listed: Vec<&serde_json::Value> = std::iter::once(&manifest["globals"])
        .chain(manifest["databases"].as_array().expect("databases").iter())
        .collect();
    assert_eq!(listed.len(), 4);
    let mut total = 0;
    for object in listed {
        let key = object["key"].as_str().expect("key");
        let (size, sha256) = object_digest(&s3, bucket.name(), key).await;
        assert_eq!(object["size"], size, "{key}");
        assert_eq!(object["sha256"], sha256.as_str(), "{key}");
        total += size;
    }
    assert_eq!(backup.report["size"], total);
    assert!(
        total > 10 * 1024 * 1024,
        "the big table should dump to several parts"
    );
    let reported = progress_lines(&backup.stderr);
    let (first, last) = (&reported[0], &reported[reported.len() - 1]);
    assert_eq!(
        (first.step.as_str(), first.bytes),
        ("Dumping", 0),
        "{reported:?}"
    );
    assert_eq!(first.database_count, Some(3), "{reported:?}");
    assert!(
        first.total_is_estimate && first.total_bytes > Some(0),
        "{first:?}"
    );
    assert_eq!(
        last.databases_done,
        Some(3),
        "at the end, all three: {last:?}"
    );
    assert!(
        last.bytes > 10 * 1024 * 1024,
        "what pg_dump wrote, before zstd: {last:?}"
    );
    assert!(
        open_multipart_uploads(&s3, bucket.name(), "clusters/")
            .await
            .is_empty()
    );

    // Lose everything, then restore it all.
    for name in databases {
        admin
            .batch_execute(&format!("DROP DATABASE \"{name}\" WITH (FORCE)"))
            .await
            .expect("dropping a database");
    }
    admin
        .batch_execute(&format!("DROP ROLE \"{role}\""))
        .await
        .expect("dropping the role");
    let restore = agent.restore("full-1", &[]).await;
    restore.assert_completed();
    assert_eq!(restore.termination, restore.report);
    let dumps: u64 = manifest["databases"]
        .as_array()
        .expect("databases")
        .iter()
        .map(|database| database["size"].as_u64().expect("a size"))
        .sum();
    let reported = progress_lines(&restore.stderr);
    let steps: Vec<&str> = reported.iter().map(|p| p.step.as_str()).collect();
    assert!(
        steps.contains(&"Verifying") && steps.last() == Some(&"Restoring"),
        "{steps:?}"
    );
    let last = &reported[reported.len() - 1];
    assert_eq!(
        (last.bytes, last.total_bytes, last.total_is_estimate),
        (dumps, Some(dumps), false),
        "every stored dump read once more while restoring, of an exact total"
    );
    assert_eq!(
        (last.databases_done, last.database_count),
        (Some(3), Some(3))
    );
    restore.assert_does_not_reveal(&agent.login.password);
    for (name, expected) in databases.iter().zip(&before) {
        let after = fingerprint(&connect(&agent.login, name).await).await;
        assert_eq!(&after, expected, "database {name} differs after restore");
    }
    let owner: String = admin
        .query_one(
            "SELECT pg_get_userbyid(datdba)::text FROM pg_database WHERE datname = $1",
            &[&owned.name()],
        )
        .await
        .expect("owner query")
        .get(0);
    assert_eq!(owner, role, "the role and its ownership come back");

    // Existing databases stop a restore before anything changes...
    let small_client = connect(&agent.login, small.name()).await;
    small_client
        .batch_execute("INSERT INTO notes (body) VALUES ('written after the backup')")
        .await
        .expect("changing the small database");
    drop(small_client);
    let refused = agent.restore("full-1", &["--database", small.name()]).await;
    refused.assert_failed();
    assert!(
        refused.message().contains("already exist"),
        "{}",
        refused.message()
    );
    let changed = fingerprint(&connect(&agent.login, small.name()).await).await;
    assert_ne!(
        changed, before[2],
        "the refused restore must not touch the database"
    );

    // ...unless they are to be replaced.
    let replaced = agent
        .restore("full-1", &["--database", small.name(), "--drop-existing"])
        .await;
    replaced.assert_completed();
    assert_eq!(
        replaced.report["databases"],
        serde_json::json!([small.name()])
    );
    assert_eq!(
        fingerprint(&connect(&agent.login, small.name()).await).await,
        before[2]
    );
    assert!(database_exists(&admin, big.name()).await);

    for database in [big, owned, small] {
        database.cleanup().await;
    }
    let _ = admin
        .batch_execute(&format!("DROP ROLE IF EXISTS \"{role}\""))
        .await;
    bucket.cleanup().await;
    let _ = std::fs::remove_dir_all(work);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dump_compression_level_reaches_pg_dump_and_still_restores() {
    let Some(env) = testbed() else { return };
    let scratch = Scratch::create(&env, "compression").await;
    let (bucket, database, work) = (&scratch.bucket, &scratch.database, &scratch.work);
    let agent = Agent::new(&env, bucket.name(), "", work);
    let client = database.connect().await;
    client
        .batch_execute(
            "CREATE TABLE lines (id int PRIMARY KEY, body text);
             INSERT INTO lines SELECT g, repeat('compressible ', 20) FROM generate_series(1, 20000) g;",
        )
        .await
        .expect("filling the database");
    let before = fingerprint(&client).await;
    drop(client);

    let mut sizes = Vec::new();
    for level in ["0", "9"] {
        let name = format!("level-{level}");
        let backup = agent
            .backup(
                &name,
                &["--database", database.name(), "--dump-compression", level],
            )
            .await;
        backup.assert_completed();
        sizes.push(backup.report["size"].as_u64().expect("size"));
    }
    assert!(
        sizes[0] > 10 * sizes[1],
        "level 0 stores the text as is, level 9 compresses it: {sizes:?}"
    );
    let restore = agent
        .restore(
            "level-0",
            &[
                "--database",
                database.name(),
                "--drop-existing",
                "--skip-globals",
            ],
        )
        .await;
    restore.assert_completed();
    assert_eq!(fingerprint(&database.connect().await).await, before);

    // Out of range is refused before anything runs.
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_pgkube"))
        .args(["agent", "backup", "--backup-name", "x", "--cluster", "c"])
        .args(["--cluster-uid", "cu", "--backup-uid", "bu"])
        .args([
            "--namespace",
            "n",
            "--s3-bucket",
            "b",
            "--dump-compression",
            "10",
        ])
        .output()
        .expect("running pgkube");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--dump-compression"), "{stderr}");

    scratch.cleanup().await;
}

async fn fill_big(client: &Client) {
    let rows = std::env::var("PGKUBE_AGENT_TEST_BIG_ROWS")
        .ok()
        .and_then(|value| value.parse::<i64>().ok())
        .unwrap_or(DEFAULT_BIG_ROWS);
    client
        .batch_execute(&format!(
            "CREATE TABLE events AS
               SELECT g AS id, now() - g * interval '1 second' AS at,
                      md5(g::text) || md5((g * 7)::text) || repeat('x', 64) AS payload
               FROM generate_series(1, {rows}) g;
             ALTER TABLE events ADD PRIMARY KEY (id);"
        ))
        .await
        .expect("filling the big table");
}

async fn fill_owned(client: &Client, role: &str) {
    client
        .batch_execute(&format!(
            "CREATE TABLE customers (id serial PRIMARY KEY, name text NOT NULL, tags text[]);
             INSERT INTO customers (name, tags)
               SELECT 'customer ' || g, ARRAY['t' || g % 5, 'ü' || g % 3] FROM generate_series(1, 5000) g;
             CREATE TABLE orders (id bigint PRIMARY KEY, customer int REFERENCES customers,
                                  total numeric(12,2), doc jsonb);
             INSERT INTO orders
               SELECT g, 1 + g % 5000, g * 1.5, jsonb_build_object('n', g, 'even', g % 2 = 0)
               FROM generate_series(1, 20000) g;
             CREATE VIEW big_orders AS SELECT * FROM orders WHERE total > 1000;
             ALTER TABLE customers OWNER TO \"{role}\";
             ALTER TABLE orders OWNER TO \"{role}\";
             CREATE TABLE documents (name text PRIMARY KEY, content oid);
             INSERT INTO documents
               VALUES ('blob', lo_from_bytea(0, convert_to(repeat('large object ', 20000), 'UTF8')));"
        ))
        .await
        .expect("filling the owned database");
}

async fn fill_small(client: &Client) {
    client
        .batch_execute(
            "CREATE TABLE notes (id serial PRIMARY KEY, body text);
             INSERT INTO notes (body) VALUES ('héllo'), ('wörld'), (NULL), (E'tab\\tnew\\nline');",
        )
        .await
        .expect("filling the small database");
}
