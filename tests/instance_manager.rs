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

/// Instances a bed may have (each needs an address).
const MAX_INSTANCES: u8 = 4;
/// The control token the beds' instances accept.
const TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// The address of instance `ordinal`.
fn address_of(ordinal: usize) -> std::net::Ipv4Addr {
    let last = u8::try_from(ordinal + 1).expect("few instances");
    std::net::Ipv4Addr::new(127, 0, 0, last)
}

/// A port free on the addresses of all instances.
fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|address| address.port())
            .expect("a free port");
        let free_everywhere = (1..usize::from(MAX_INSTANCES))
            .all(|ordinal| TcpListener::bind((address_of(ordinal), port)).is_ok());
        if free_everywhere {
            return port;
        }
    }
}

/// A cluster's files and processes under one temporary directory.
struct Bed {
    root: PathBuf,
    superuser: String,
    /// PostgreSQL's port, the same on every instance.
    port: u16,
    /// The status and control endpoint's port, the same on every instance.
    status_port: u16,
    instances: Vec<Instance>,
}

/// One `pgkube instance run`.
struct Instance {
    pod: String,
    dir: PathBuf,
    address: std::net::Ipv4Addr,
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
            port: free_port(),
            status_port: free_port(),
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
        assert!(ordinal < usize::from(MAX_INSTANCES));
        let pod = format!("{STATEFULSET}-{ordinal}");
        let dir = self.root.join(&pod);
        for sub in [
            "config",
            "superuser",
            "replication",
            "control",
            "run",
            "socket",
            "data",
        ] {
            std::fs::create_dir_all(dir.join(sub)).expect("instance dir");
        }
        std::fs::write(dir.join("control/token"), format!("{TOKEN}\n")).expect("token");
        let address = address_of(ordinal);
        let instance = Instance {
            pod,
            dir,
            address,
            pg_port: self.port,
            status: SocketAddr::from((address, self.status_port)),
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
                 host replication {REPLICATION_USER} 127.0.0.0/8 scram-sha-256\n\
                 host all all 127.0.0.0/8 scram-sha-256\n"
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
        self.write_topology_naming(instance, replicas, 0);
    }

    /// Writes `instance.json` naming instance `primary` the primary, as the kubelet would
    /// after the operator changed the ConfigMap.
    fn write_topology_naming(&self, instance: &Instance, replicas: u32, primary: usize) {
        let hosts: serde_json::Map<String, Value> = (0..usize::from(MAX_INSTANCES))
            .map(|ordinal| {
                let host = address_of(ordinal).to_string();
                (format!("{STATEFULSET}-{ordinal}"), Value::String(host))
            })
            .collect();
        let topology = serde_json::json!({
            "primary": format!("{STATEFULSET}-{primary}"),
            "primaryHost": address_of(primary).to_string(),
            "port": self.port, "replicas": replicas, "statefulset": STATEFULSET,
            "hosts": hosts,
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
            .env("PGKUBE_CONTROL_DIR", instance.dir.join("control"))
            .env("PGKUBE_RUN_DIR", instance.dir.join("run"))
            .env("PGKUBE_SOCKET_DIR", instance.dir.join("socket"))
            .env("PGKUBE_PORT", instance.pg_port.to_string())
            .env("PGKUBE_STATUS_ADDRESS", instance.address.to_string())
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
            .host(instance.address.to_string())
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
        "listen_addresses = '{}'\n\
         port = {}\n\
         unix_socket_directories = '{}'\n\
         wal_level = replica\n\
         hot_standby = on\n\
         max_wal_senders = 10\n\
         max_replication_slots = 10\n\
         wal_log_hints = on\n\
         {extra}",
        instance.address,
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

/// `POST <path>` with a JSON `body` to instance `index`'s control endpoint, with `token` as
/// the bearer token: the status code and the JSON body.
async fn post(instance: &Instance, path: &str, token: Option<&str>, body: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(instance.status)
        .await
        .expect("the endpoint answers");
    let authorization = token
        .map(|token| format!("Authorization: Bearer {token}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n{authorization}\r\n{body}",
        instance.status,
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("sends");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("reads");
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {response:?}"));
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Orders instance `index` to follow instance `primary`; it accepts at once.
async fn order_follow(bed: &Bed, index: usize, primary: usize) {
    let body = serde_json::json!({
        "primary": bed.instances[primary].pod,
        "primaryHost": bed.instances[primary].address.to_string(),
    });
    let (code, answer) = post(
        &bed.instances[index],
        "/control/follow",
        Some(TOKEN),
        &body.to_string(),
    )
    .await;
    assert_eq!(code, 202, "{answer}");
}

async fn count(client: &tokio_postgres::Client) -> anyhow::Result<i64> {
    Ok(client
        .query_one("SELECT count(*) FROM kept", &[])
        .await?
        .get(0))
}

/// Waits until instance `index` is a replica of `primary` that streams and has replayed
/// `rows` rows of `kept`.
async fn wait_replica_of(bed: &Bed, index: usize, primary: usize, rows: i64) {
    let pod = bed.instances[primary].pod.clone();
    wait_status(bed, index, &format!("a streaming replica of {pod}"), |s| {
        s["role"] == "replica" && s["streaming"] == true && s["following"] == pod.as_str()
    })
    .await;
    let reader = bed.sql(index, "first").await.expect("replica answers");
    eventually("the replica replays the primary's rows", || async {
        Ok((count(&reader).await? == rows).then_some(()))
    })
    .await;
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

/// Starts instance 0 of `replicas` as the primary and writes rows 1 to 100 of `kept` on it;
/// returns its index and the connection that wrote them.
async fn primary_with_kept_rows(bed: &mut Bed, replicas: u32) -> (usize, tokio_postgres::Client) {
    let old = bed.start(0, replicas);
    wait_status(bed, old, "a ready primary", |s| {
        s["role"] == "primary" && s["ready"] == true
    })
    .await;
    let writer = bed.sql(old, "first").await.expect("primary answers");
    writer
        .batch_execute(
            "CREATE TABLE kept (id int PRIMARY KEY); INSERT INTO kept SELECT generate_series(1, 100)",
        )
        .await
        .expect("writes on the primary");
    (old, writer)
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

/// Sends `signal` (`STOP`, `CONT`) to process `pid`.
fn signal_process(pid: i32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal} {pid}");
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
