//! `kubectl pgkube` on the test bed: the pgkube binary, linked as `kubectl-pgkube` on the
//! `PATH`, is found by the test bed's real kubectl as a plugin. Against a two-instance cluster
//! on the real node (run by a manager process): `status` shows it at a glance, plain through a
//! pipe, and `-o json` gives the object; a switchover to the primary itself is refused with the
//! replicas named; `switchover --wait` without a pod moves the primary to the replica and
//! returns once it serves; `backup --wait` shows the phases, the progress while a lock holds the
//! dump of a database, and ends with the backup's size;
//! `restore --wait` restores it; `psql` runs in the primary's and a replica's pod; `logs` shows
//! each instance's lines; an unknown cluster is a clear error; `kubectl __complete pgkube ...`
//! completes through `kubectl_complete-pgkube`.

mod manager_common;

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use manager_common::Manager;
use pgkube_testkit::{
    TestBucket, TestCluster, TestEnv, TestNamespace, backup_config, create_s3_secret, install_crds,
    test_storage, testbed,
};

const TIMEOUT: Duration = Duration::from_secs(180);

/// A directory holding `kubectl-pgkube` and `kubectl_complete-pgkube`, links to the built
/// binary.
fn plugin_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pgkube-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    for name in ["kubectl-pgkube", "kubectl_complete-pgkube"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_pgkube"), &link).expect("the link");
    }
    dir
}

/// `kubectl __complete pgkube <words>`: what kubectl's shell completion gets, through
/// `kubectl_complete-pgkube`.
fn completion(env: &TestEnv, dir: &std::path::Path, words: &[&str]) -> String {
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = env
        .kubectl()
        .env("PATH", path)
        .args(["__complete", "pgkube"])
        .args(words)
        .output()
        .expect("kubectl runs");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Subcommands, flags, the namespace's clusters and a cluster's replicas complete.
fn completes(env: &TestEnv, dir: &std::path::Path, ns: &str, replica: &str) {
    let subcommands = completion(env, dir, &["sw"]);
    assert!(subcommands.starts_with("switchover\t"), "{subcommands}");
    assert!(
        subcommands.ends_with(":4\n"),
        "no file names: {subcommands}"
    );
    let clusters = completion(env, dir, &["-n", ns, "status", ""]);
    assert_eq!(clusters, "pg\n:4\n", "the namespace's one cluster");
    let replicas = completion(env, dir, &["-n", ns, "switchover", "pg", ""]);
    assert_eq!(replicas, format!("{replica}\n:4\n"), "its one replica");
    let flags = completion(env, dir, &["backup", "pg", "--w"]);
    assert!(flags.starts_with("--wait\t"), "{flags}");
}

/// `kubectl pgkube <args>` in `namespace`, the plugin found on the `PATH`.
fn kubectl_pgkube(env: &TestEnv, dir: &std::path::Path, namespace: &str, args: &[&str]) -> Output {
    plugin_command(env, dir, namespace, args)
        .output()
        .expect("kubectl runs")
}

fn plugin_command(
    env: &TestEnv,
    dir: &std::path::Path,
    namespace: &str,
    args: &[&str],
) -> std::process::Command {
    // The test bed's kubectl too: `psql` runs `kubectl exec`.
    let path = format!(
        "{}:{}:{}",
        dir.display(),
        env.bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = env.kubectl();
    command
        .env("PATH", path)
        .args(["pgkube", "-n", namespace])
        .args(args);
    command
}

/// `backup pg --wait` through a pipe while the dump of database `postgres` is held by a lock:
/// the progress lines come while it waits; then the lock goes and the backup completes. What
/// the command printed, and whether it succeeded.
async fn backup_with_progress(
    env: &TestEnv,
    dir: &std::path::Path,
    namespace: &str,
    cluster: &TestCluster,
) -> (String, bool) {
    use std::io::BufRead as _;
    let sql = cluster.sql().await.expect("SQL");
    sql.batch_execute("CREATE TABLE held (id int); INSERT INTO held VALUES (1);")
        .await
        .expect("a table to hold");
    let lock = cluster.sql().await.expect("SQL");
    lock.batch_execute("BEGIN; LOCK TABLE held IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("held locked");
    let mut child = plugin_command(env, dir, namespace, &["backup", "pg", "--wait"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    let stdout = child.stdout.take().expect("stdout");
    let (lines, seen) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines.send(line);
        }
    });
    let mut said = String::new();
    loop {
        let line = seen
            .recv_timeout(TIMEOUT)
            .unwrap_or_else(|_| panic!("no progress line while the dump waits: {said}"));
        said.push_str(&line);
        said.push('\n');
        // The report that names the database the lock holds (an earlier one may be the
        // step's start, before any database).
        if line.contains("Dumping ") && line.contains(" postgres  ") {
            break;
        }
    }
    lock.batch_execute("ROLLBACK").await.expect("lock released");
    let status = child.wait().expect("the plugin ends");
    reader.join().expect("stdout read");
    said.extend(seen.try_iter().map(|line| line + "\n"));
    if let Some(mut stderr) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut stderr, &mut said);
    }
    (said, status.success())
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test]
async fn kubectl_pgkube_shows_a_cluster_and_switches_it_over() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "plugin").await;
    let ns = namespace.name().to_owned();
    let manager = Manager::start(&env, "plugin", &["--watch-namespaces", &ns]);
    let bucket = TestBucket::create(&env, "plugin").await;
    create_s3_secret(&client, &env, &ns, "s3-keys", None)
        .await
        .expect("S3 Secret");
    let storage = test_storage(&env, bucket.name(), "s3-keys");
    let cluster = TestCluster::builder("pg")
        .replicas(2)
        // Storage for the backup below; the schedule's own backups are a year away.
        .spec(|spec| spec.backup = Some(backup_config(storage, "0 3 1 1 *")))
        .start(&namespace)
        .await
        .expect("the cluster becomes Running");
    let primary = cluster.wait_healthy(None, TIMEOUT).await.expect("healthy");
    let replica = if primary == "pg-postgresql-0" {
        "pg-postgresql-1"
    } else {
        "pg-postgresql-0"
    };
    let dir = plugin_dir();
    completes(&env, &dir, &ns, replica);

    let status = kubectl_pgkube(&env, &dir, &ns, &["status", "pg"]);
    let shown = text(&status);
    assert!(status.status.success(), "{shown}");
    assert!(
        shown.starts_with(&format!(
            "Cluster {ns}/pg: Running, PostgreSQL 15, 2/2 ready\n"
        )),
        "{shown}"
    );
    assert!(shown.contains(&format!("Primary {primary}\n")), "{shown}");
    let replica_line = shown
        .lines()
        .find(|line| line.trim_start().starts_with(replica))
        .unwrap_or_else(|| panic!("a line for {replica}: {shown}"));
    assert!(replica_line.contains(" replica  yes"), "{replica_line}");
    assert!(!shown.contains('\x1b'), "no colours through a pipe");

    let json = kubectl_pgkube(&env, &dir, &ns, &["status", "pg", "-o", "json"]);
    let object: serde_json::Value =
        serde_json::from_slice(&json.stdout).unwrap_or_else(|_| panic!("JSON: {}", text(&json)));
    assert_eq!(object["status"]["currentPrimary"], primary.as_str());
    assert_eq!(
        object["status"]["instances"].as_array().map(Vec::len),
        Some(2)
    );

    let refused = kubectl_pgkube(&env, &dir, &ns, &["switchover", "pg", &primary]);
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains(&format!(
            "{primary} is not a replica of this cluster; its replicas: {replica}"
        )),
        "{}",
        text(&refused)
    );
    let moved = kubectl_pgkube(&env, &dir, &ns, &["switchover", "pg", "--wait"]);
    let said = text(&moved);
    assert!(moved.status.success(), "{said}");
    assert!(
        said.contains(&format!("asked for a switchover of {ns}/pg to {replica}"))
            && said.contains(&format!("{replica} is the primary")),
        "{said}"
    );
    assert_eq!(
        cluster.current_primary().await.expect("status").as_deref(),
        Some(replica)
    );

    let (said, succeeded) = backup_with_progress(&env, &dir, &ns, &cluster).await;
    assert!(succeeded, "{said}");
    assert!(
        said.contains("s  Running\n")
            && said.contains("s  Completed\n")
            && said.contains("completed, "),
        "the phases, then the size and key: {said}"
    );
    let progress = said
        .lines()
        .find(|line| line.contains("Dumping ") && line.contains(" postgres  "))
        .unwrap_or_default();
    assert!(
        progress.contains(" postgres  ") && progress.contains(" of ~") && progress.contains("/s"),
        "the database it waits on, bytes of the estimate and the rate: {said}"
    );

    let backup_name = said
        .split_whitespace()
        .skip_while(|word| *word != "backup")
        .nth(1)
        .unwrap_or_else(|| panic!("the backup's name: {said}"))
        .to_owned();
    restores_psql_and_logs(&env, &dir, &ns, &backup_name, &cluster).await;

    let unknown = kubectl_pgkube(&env, &dir, &ns, &["status", "nothing"]);
    assert!(!unknown.status.success());
    assert!(
        text(&unknown).contains(&format!("no PostgreSQLCluster nothing in namespace {ns}")),
        "{}",
        text(&unknown)
    );

    let _ = std::fs::remove_dir_all(&dir);
    cluster.delete(TIMEOUT).await.expect("the cluster goes");
    manager.terminate();
    namespace.cleanup().await;
    bucket.cleanup().await;
}

/// `restore --wait` brings back a row deleted after the backup; `psql` runs a query in the
/// primary's pod and in a replica's; `logs` prefixes each instance's lines with its pod.
async fn restores_psql_and_logs(
    env: &TestEnv,
    dir: &std::path::Path,
    ns: &str,
    backup: &str,
    cluster: &TestCluster,
) {
    let app = cluster.application_secret().await.expect("the app Secret");
    let sql = cluster
        .sql_to(&app.dbname)
        .await
        .expect("SQL to the app database");
    sql.batch_execute("CREATE TABLE kept (id int)")
        .await
        .expect("a table after the backup");
    let restore = kubectl_pgkube(
        env,
        dir,
        ns,
        &[
            "restore",
            "pg",
            "--backup",
            backup,
            "--drop-existing",
            "--wait",
        ],
    );
    let said = text(&restore);
    assert!(restore.status.success(), "{said}");
    assert!(
        said.contains("s  Completed\n") && said.contains("completed"),
        "{said}"
    );
    let sql = cluster
        .sql_to(&app.dbname)
        .await
        .expect("SQL after the restore");
    let tables: i64 = sql
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename = 'kept'",
            &[],
        )
        .await
        .expect("a query")
        .get(0);
    assert_eq!(tables, 0, "the table made after the backup is gone: {said}");

    let query = ["-tAc", "SELECT pg_is_in_recovery()"];
    for (flags, expected) in [(&[][..], "f"), (&["--replica"][..], "t")] {
        let mut args = vec!["psql", "pg"];
        args.extend_from_slice(flags);
        args.push("--");
        args.extend_from_slice(&query);
        let psql = kubectl_pgkube(env, dir, ns, &args);
        assert!(psql.status.success(), "{}", text(&psql));
        assert_eq!(
            String::from_utf8_lossy(&psql.stdout).trim(),
            expected,
            "{flags:?}"
        );
    }
    let psql = kubectl_pgkube(env, dir, ns, &["psql", "pg", "--", "-c", "SELECT nonsense"]);
    assert!(!psql.status.success(), "a failed query fails the command");

    let logs = kubectl_pgkube(env, dir, ns, &["logs", "pg", "--tail", "20"]);
    let said = text(&logs);
    assert!(logs.status.success(), "{said}");
    for pod in ["pg-postgresql-0", "pg-postgresql-1"] {
        assert!(said.contains(&format!("[{pod}] ")), "{pod}'s lines: {said}");
    }
}
