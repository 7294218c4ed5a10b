//! `pgkube instance run` as real processes on this machine, with PostgreSQL 15 and no
//! Kubernetes: the files the operator's ConfigMap and Secrets would mount are written into a
//! temporary directory per instance, and the test changes them as Kubernetes would.
//!
//! initdb refuses to run as root, so as root the manager runs as the machine's `postgres` user
//! (`setpriv`); otherwise as the current user. Peer authentication maps that OS user to the
//! superuser, so the superuser is named after it. Everything binds to 127.0.0.1.
//!
//! The same manager runs in the clusters' pods on the test bed's real node; the tests of
//! `controllers/tests/cluster_on_real_node.rs` drive it through the operator.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use pgkube_testkit::{http_get, processes_with_args, unique_name};
use serde_json::Value;

/// The PostgreSQL major the tests run (Debian's).
const MAJOR: &str = "15";
const STATEFULSET: &str = "it";
const REPLICATION_USER: &str = "streaming_replica";
const WAIT: Duration = Duration::from_secs(60);

/// The OS user the managers run as, and so the superuser's name.
fn os_user() -> String {
    if nix_is_root() {
        "postgres".to_owned()
    } else {
        std::env::var("USER").unwrap_or_else(|_| "postgres".to_owned())
    }
}

fn nix_is_root() -> bool {
    // The uid of the files this process creates is the effective uid.
    let probe = std::env::temp_dir().join(unique_name("uid-probe"));
    std::fs::write(&probe, "").expect("temp file");
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&probe).expect("metadata"));
    std::fs::remove_file(&probe).expect("remove temp file");
    uid == 0
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}

/// A cluster's files and processes under one temporary directory.
struct Bed {
    root: PathBuf,
    superuser: String,
    primary_port: u16,
    instances: Vec<Instance>,
}

/// One `pgkube instance run`.
struct Instance {
    pod: String,
    dir: PathBuf,
    pg_port: u16,
    status: SocketAddr,
    child: Option<Child>,
}

impl Bed {
    fn new() -> Self {
        let root = std::env::temp_dir().join(unique_name("pgkube-instance"));
        std::fs::create_dir_all(&root).expect("root dir");
        let bed = Self {
            root,
            superuser: os_user(),
            primary_port: free_port(),
            instances: Vec::new(),
        };
        bed.give_to_os_user(&bed.root);
        bed
    }

    fn give_to_os_user(&self, path: &Path) {
        if nix_is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(path)
                .status()
                .expect("chown runs");
            assert!(status.success(), "chown {}", path.display());
        }
    }

    /// Writes the files of instance `ordinal` for a cluster of `replicas` instances and starts
    /// its manager.
    fn start(&mut self, ordinal: usize, replicas: u32) -> usize {
        let pod = format!("{STATEFULSET}-{ordinal}");
        let dir = self.root.join(&pod);
        let pg_port = if ordinal == 0 {
            self.primary_port
        } else {
            free_port()
        };
        for sub in [
            "config",
            "superuser",
            "replication",
            "run",
            "socket",
            "data",
        ] {
            std::fs::create_dir_all(dir.join(sub)).expect("instance dir");
        }
        let instance = Instance {
            pod,
            dir,
            pg_port,
            status: SocketAddr::from(([127, 0, 0, 1], free_port())),
            child: None,
        };
        std::fs::write(
            instance.dir.join("config/postgresql.conf"),
            server_config(&instance, ""),
        )
        .expect("config");
        std::fs::write(
            instance.dir.join("config/pg_hba.conf"),
            format!(
                "local all all peer\n\
                 host replication {REPLICATION_USER} 127.0.0.1/32 scram-sha-256\n\
                 host all all 127.0.0.1/32 scram-sha-256\n"
            ),
        )
        .expect("hba");
        self.write_topology(&instance, replicas);
        write_credentials(&instance.dir.join("superuser"), &self.superuser, "first");
        write_credentials(
            &instance.dir.join("replication"),
            REPLICATION_USER,
            "replicate",
        );
        self.give_to_os_user(&instance.dir);
        self.instances.push(instance);
        let index = self.instances.len() - 1;
        self.spawn(index);
        index
    }

    fn write_topology(&self, instance: &Instance, replicas: u32) {
        let topology = serde_json::json!({
            "primary": format!("{STATEFULSET}-0"), "primaryHost": "127.0.0.1",
            "port": self.primary_port, "replicas": replicas, "statefulset": STATEFULSET,
        });
        std::fs::write(
            instance.dir.join("config/instance.json"),
            topology.to_string(),
        )
        .expect("topology");
    }

    fn spawn(&mut self, index: usize) {
        let instance = &mut self.instances[index];
        let binary = env!("CARGO_BIN_EXE_pgkube");
        let mut command = if nix_is_root() {
            let mut command = Command::new("setpriv");
            command
                .args([
                    "--reuid=postgres",
                    "--regid=postgres",
                    "--init-groups",
                    "--",
                ])
                .arg(binary);
            command
        } else {
            Command::new(binary)
        };
        let path = format!(
            "/usr/lib/postgresql/{MAJOR}/bin:{}",
            std::env::var("PATH").unwrap_or_default()
        );
        command
            .args(["instance", "run"])
            .env("PATH", path)
            .env("POD_NAME", &instance.pod)
            .env("PGDATA", instance.dir.join("data/pgdata"))
            .env("PGKUBE_CONFIG_DIR", instance.dir.join("config"))
            .env("PGKUBE_SUPERUSER_DIR", instance.dir.join("superuser"))
            .env("PGKUBE_REPLICATION_DIR", instance.dir.join("replication"))
            .env("PGKUBE_RUN_DIR", instance.dir.join("run"))
            .env("PGKUBE_SOCKET_DIR", instance.dir.join("socket"))
            .env("PGKUBE_PORT", instance.pg_port.to_string())
            .env("PGKUBE_STATUS_ADDRESS", "127.0.0.1")
            .env("PGKUBE_STATUS_PORT", instance.status.port().to_string())
            .env("PGKUBE_SHUTDOWN_TIMEOUT", "20s")
            .env("PGKUBE_WATCH_PERIOD", "500ms")
            .env("PGKUBE_SLOT_DROP_GRACE", "1s")
            .env("LANG", "C.UTF-8");
        instance.child = Some(command.spawn().expect("pgkube instance run starts"));
    }

    /// A SQL connection to instance `index` over TCP as the superuser.
    async fn sql(&self, index: usize, password: &str) -> anyhow::Result<tokio_postgres::Client> {
        let instance = &self.instances[index];
        let (client, connection) = tokio_postgres::Config::new()
            .host("127.0.0.1")
            .port(instance.pg_port)
            .user(&self.superuser)
            .password(password)
            .dbname("postgres")
            .connect(tokio_postgres::NoTls)
            .await?;
        tokio::spawn(connection);
        Ok(client)
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for instance in &mut self.instances {
            if let Some(mut child) = instance.child.take() {
                let _ = child.kill();
                let _ = child.wait();
                // The manager's children die with it only when it stops them; make sure.
                kill_postgres_of(&instance.dir.join("data/pgdata"));
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn server_config(instance: &Instance, extra: &str) -> String {
    format!(
        "listen_addresses = '127.0.0.1'\n\
         port = {}\n\
         unix_socket_directories = '{}'\n\
         wal_level = replica\n\
         hot_standby = on\n\
         max_wal_senders = 10\n\
         max_replication_slots = 10\n\
         {extra}",
        instance.pg_port,
        instance.dir.join("socket").display(),
    )
}

fn write_credentials(dir: &Path, username: &str, password: &str) {
    std::fs::write(dir.join("username"), username).expect("username");
    // Replaced whole, as Kubernetes swaps a Secret volume's files.
    let partial = dir.join(".password.partial");
    std::fs::write(&partial, password).expect("password");
    std::fs::rename(&partial, dir.join("password")).expect("password in place");
}

/// The postgres processes of `pgdata` (the postmaster runs as `postgres -D <pgdata>`).
fn postgres_processes_of(pgdata: &Path) -> Vec<u32> {
    processes_with_args(&["postgres", &pgdata.to_string_lossy()])
}

fn kill_postgres_of(pgdata: &Path) {
    for pid in postgres_processes_of(pgdata) {
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
    }
}

async fn status(instance: &Instance) -> Option<Value> {
    let (code, body) = http_get(instance.status, "/status").await.ok()?;
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

/// Waits until instance `index`'s `/status` satisfies `condition`.
async fn wait_status(bed: &Bed, index: usize, what: &str, condition: impl Fn(&Value) -> bool) {
    let instance = &bed.instances[index];
    let deadline = Instant::now() + WAIT;
    loop {
        let current = status(instance).await;
        if current.as_ref().is_some_and(&condition) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} never became {what}; last status: {current:?}",
            instance.pod
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Sends SIGTERM to instance `index`'s manager and waits for it to exit.
fn terminate(bed: &mut Bed, index: usize) -> ExitStatus {
    let instance = &mut bed.instances[index];
    let mut child = instance.child.take().expect("running");
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    child.wait().expect("the manager exits")
}

/// Retries `check` until it returns Some, for up to [`WAIT`].
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        let last = match check().await {
            Ok(Some(value)) => return value,
            Ok(None) => "not yet".to_owned(),
            Err(error) => format!("{error:#}"),
        };
        assert!(Instant::now() < deadline, "{what}: {last}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn started_at(client: &tokio_postgres::Client) -> Result<String, tokio_postgres::Error> {
    client
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .await
        .map(|row| row.get(0))
}

async fn slots(primary: &tokio_postgres::Client) -> anyhow::Result<Vec<(String, bool)>> {
    let rows = primary
        .query(
            "SELECT slot_name::text, active FROM pg_replication_slots ORDER BY 1",
            &[],
        )
        .await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

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
