//! Shared by the tests that run `pgkube instance run` as real processes on this machine
//! (`instance_manager.rs`, `instance_health.rs`): a bed of instances, each with the files the
//! operator's ConfigMap and Secrets would mount, and the helpers that drive and watch them.
//! The beds and what they need are described in `instance_manager.rs`. A bed may also run its
//! managers in a root filesystem of their own, as a pod's container does ([`Bed::in_root`]).

#![allow(dead_code)] // each test file uses a different part

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use pgkube_testkit::{http_get, processes_with_args, processes_with_env, unique_name};
use serde_json::Value;

/// The PostgreSQL major the tests run (Debian's).
pub const MAJOR: &str = "15";
pub const STATEFULSET: &str = "it";
pub const REPLICATION_USER: &str = "streaming_replica";
pub const WAIT: Duration = Duration::from_secs(60);

/// The OS user the managers run as, and so the superuser's name.
pub fn os_user() -> String {
    if nix_is_root() {
        "postgres".to_owned()
    } else {
        std::env::var("USER").unwrap_or_else(|_| "postgres".to_owned())
    }
}

pub fn nix_is_root() -> bool {
    // The uid of the files this process creates is the effective uid.
    let probe = std::env::temp_dir().join(unique_name("uid-probe"));
    std::fs::write(&probe, "").expect("temp file");
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&probe).expect("metadata"));
    std::fs::remove_file(&probe).expect("remove temp file");
    uid == 0
}

/// Instances a bed may have (each needs an address).
pub const MAX_INSTANCES: u8 = 4;
/// The control token the beds' instances accept.
pub const TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// The address of instance `ordinal`.
pub fn address_of(ordinal: usize) -> std::net::Ipv4Addr {
    let last = u8::try_from(ordinal + 1).expect("few instances");
    std::net::Ipv4Addr::new(127, 0, 0, last)
}

/// A port free on the addresses of all instances.
pub fn free_port() -> u16 {
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

/// The metrics' custom queries file of an instance, under its directory (absent unless a test
/// writes it).
pub const CUSTOM_QUERIES_FILE: &str = "config/queries.yaml";

/// A cluster's files and processes under one temporary directory.
pub struct Bed {
    pub root: PathBuf,
    pub superuser: String,
    /// PostgreSQL's port, the same on every instance.
    pub port: u16,
    /// The status and control endpoint's port, the same on every instance.
    pub status_port: u16,
    /// The PostgreSQL metrics' port, the same on every instance.
    pub metrics_port: u16,
    pub instances: Vec<Instance>,
    /// The root filesystem the managers run in; on this machine's when none.
    pub chroot: Option<Chroot>,
    /// When set, instances are named by host name, `<pod>.<domain>` (a headless Service's
    /// names, which something must resolve), not by address.
    pub domain: Option<String>,
}

/// A root filesystem that a bed's managers run in, each in new mount and PID namespaces
/// (`unshare --root`), with the manager as PID 1 and its own `/proc`, as in a pod's container.
/// An instance's child is then `unshare`, which [`terminate`] does not stop the manager through.
pub struct Chroot {
    /// Its directory on this machine; the bed's files are in it.
    pub root: PathBuf,
    /// The manager's path in it.
    pub binary: String,
    /// The user and group (the same number) that the managers run as, and that own their
    /// files. Its name there is `postgres`, the superuser's name.
    pub id: u32,
    /// The programs' search path in it.
    pub path: String,
    /// More environment for the managers.
    pub env: Vec<(String, String)>,
}

/// One `pgkube instance run`.
pub struct Instance {
    pub pod: String,
    pub dir: PathBuf,
    /// `dir` as the manager sees it (in its root filesystem).
    pub seen_dir: PathBuf,
    pub address: std::net::Ipv4Addr,
    pub pg_port: u16,
    pub status: SocketAddr,
    pub metrics: SocketAddr,
    pub child: Option<Child>,
}

impl Bed {
    pub fn new() -> Self {
        Self::with_root(
            std::env::temp_dir().join(unique_name("pgkube-instance")),
            os_user(),
            None,
        )
    }

    /// A bed whose managers run in `chroot` (as root only: namespaces).
    pub fn in_root(chroot: Chroot) -> Self {
        let root = chroot.root.join(unique_name("bed"));
        Self::with_root(root, "postgres".to_owned(), Some(chroot))
    }

    fn with_root(root: PathBuf, superuser: String, chroot: Option<Chroot>) -> Self {
        std::fs::create_dir_all(&root).expect("root dir");
        let bed = Self {
            root,
            superuser,
            port: free_port(),
            status_port: free_port(),
            metrics_port: free_port(),
            instances: Vec::new(),
            chroot,
            domain: None,
        };
        bed.give_to_os_user(&bed.root);
        bed
    }

    /// `path` (under the bed's directory) as the managers see it.
    pub fn seen(&self, path: &Path) -> PathBuf {
        match &self.chroot {
            None => path.to_owned(),
            Some(chroot) => Path::new("/").join(
                path.strip_prefix(&chroot.root)
                    .expect("the bed is in its root filesystem"),
            ),
        }
    }

    pub fn give_to_os_user(&self, path: &Path) {
        let owner = match &self.chroot {
            Some(chroot) => format!("{0}:{0}", chroot.id),
            None => "postgres:postgres".to_owned(),
        };
        if nix_is_root() {
            let status = Command::new("chown")
                .arg("-R")
                .arg(owner)
                .arg(path)
                .status()
                .expect("chown runs");
            assert!(status.success(), "chown {}", path.display());
        }
    }

    /// Writes the files of instance `ordinal` for a cluster of `replicas` instances and starts
    /// its manager.
    pub fn start(&mut self, ordinal: usize, replicas: u32) -> usize {
        assert!(ordinal < usize::from(MAX_INSTANCES));
        let pod = format!("{STATEFULSET}-{ordinal}");
        let dir = self.root.join(&pod);
        for sub in [
            "config",
            "superuser",
            "replication",
            "application",
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
            seen_dir: self.seen(&dir),
            dir,
            address,
            pg_port: self.port,
            status: SocketAddr::from((address, self.status_port)),
            metrics: SocketAddr::from((address, self.metrics_port)),
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

    pub fn write_topology(&self, instance: &Instance, replicas: u32) {
        self.write_topology_naming(instance, replicas, 0);
    }

    /// Writes `instance.json` naming instance `primary` the primary, as the kubelet would
    /// after the operator changed the ConfigMap.
    pub fn write_topology_naming(&self, instance: &Instance, replicas: u32, primary: usize) {
        let hosts: serde_json::Map<String, Value> = (0..usize::from(MAX_INSTANCES))
            .map(|ordinal| {
                let host = address_of(ordinal).to_string();
                (format!("{STATEFULSET}-{ordinal}"), Value::String(host))
            })
            .collect();
        let mut topology = serde_json::json!({
            "primary": format!("{STATEFULSET}-{primary}"),
            "primaryHost": address_of(primary).to_string(),
            "port": self.port, "replicas": replicas, "statefulset": STATEFULSET,
            "hosts": hosts,
        });
        if let Some(domain) = &self.domain {
            // As the operator writes it: the primary's name, the others' derived from it.
            topology["primaryHost"] = Value::String(format!("{STATEFULSET}-{primary}.{domain}"));
            topology.as_object_mut().expect("an object").remove("hosts");
        }
        std::fs::write(
            instance.dir.join("config/instance.json"),
            topology.to_string(),
        )
        .expect("topology");
    }

    pub fn spawn(&mut self, index: usize) {
        let mut command = self.manager_command();
        let instance = &self.instances[index];
        let seen = |sub: &str| instance.seen_dir.join(sub);
        command
            .args(["instance", "run"])
            .env("POD_NAME", &instance.pod)
            .env("PGDATA", seen("data/pgdata"))
            .env("PGKUBE_CONFIG_DIR", seen("config"))
            .env("PGKUBE_SUPERUSER_DIR", seen("superuser"))
            .env("PGKUBE_REPLICATION_DIR", seen("replication"))
            .env("PGKUBE_APPLICATION_DIR", seen("application"))
            .env("PGKUBE_CONTROL_DIR", seen("control"))
            .env("PGKUBE_RUN_DIR", seen("run"))
            .env("PGKUBE_SOCKET_DIR", seen("socket"))
            .env("PGKUBE_PORT", instance.pg_port.to_string())
            .env("PGKUBE_STATUS_ADDRESS", instance.address.to_string())
            .env("PGKUBE_STATUS_PORT", instance.status.port().to_string())
            .env("PGKUBE_METRICS_PORT", instance.metrics.port().to_string())
            .env("PGKUBE_METRICS_QUERIES", seen(CUSTOM_QUERIES_FILE))
            .env("PGKUBE_SHUTDOWN_TIMEOUT", "20s")
            .env("PGKUBE_WATCH_PERIOD", "500ms")
            .env("PGKUBE_SLOT_DROP_GRACE", "1s")
            .env("LANG", "C.UTF-8");
        let child = command.spawn().expect("pgkube instance run starts");
        self.instances[index].child = Some(child);
    }

    /// The manager's command line up to its arguments, with its search path: as the OS user
    /// on this machine, or in the bed's root filesystem.
    fn manager_command(&self) -> Command {
        if let Some(chroot) = &self.chroot {
            let mut command = Command::new(on_path("unshare"));
            command
                .args(["--pid", "--fork", "--mount-proc"])
                .arg(format!("--root={}", chroot.root.display()))
                .args(["--setuid", &chroot.id.to_string()])
                .args(["--setgid", &chroot.id.to_string()])
                .arg("--")
                .arg(&chroot.binary)
                // Only what the bed gives, as a container has.
                .env_clear()
                .env("PATH", &chroot.path)
                .envs(chroot.env.iter().map(|(name, value)| (name, value)));
            return command;
        }
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
        command.env("PATH", path);
        command
    }

    /// A SQL connection to instance `index` over TCP as the superuser.
    pub async fn sql(
        &self,
        index: usize,
        password: &str,
    ) -> anyhow::Result<tokio_postgres::Client> {
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
                // The manager's children die with it only when it stops them; make sure. A
                // manager in a root filesystem is unshare's child, which outlives it; it and
                // what it started have the instance's PGDATA in their environment.
                let pgdata = instance.seen_dir.join("data/pgdata");
                let variable = format!("PGDATA={}", pgdata.display());
                for pid in processes_with_env(&variable) {
                    let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
                }
                kill_postgres_of(&pgdata);
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Where `program` is on this process's search path (a command's own `PATH` is searched
/// otherwise, and a bed in a root filesystem gives its managers that filesystem's).
fn on_path(program: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("{program} is not on PATH"))
}

pub fn server_config(instance: &Instance, extra: &str) -> String {
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
        instance.seen_dir.join("socket").display(),
    )
}

pub fn write_credentials(dir: &Path, username: &str, password: &str) {
    std::fs::write(dir.join("username"), username).expect("username");
    // Replaced whole, as Kubernetes swaps a Secret volume's files.
    let partial = dir.join(".password.partial");
    std::fs::write(&partial, password).expect("password");
    std::fs::rename(&partial, dir.join("password")).expect("password in place");
}

/// The postgres processes of `pgdata` (the postmaster runs as `postgres -D <pgdata>`).
pub fn postgres_processes_of(pgdata: &Path) -> Vec<u32> {
    processes_with_args(&["postgres", &pgdata.to_string_lossy()])
}

pub fn kill_postgres_of(pgdata: &Path) {
    for pid in postgres_processes_of(pgdata) {
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
    }
}

pub async fn status(instance: &Instance) -> Option<Value> {
    let (code, body) = http_get(instance.status, "/status").await.ok()?;
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

/// `POST <path>` with a JSON `body` to instance `index`'s control endpoint, with `token` as
/// the bearer token: the status code and the JSON body.
pub async fn post(
    instance: &Instance,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, Value) {
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
pub async fn order_follow(bed: &Bed, index: usize, primary: usize) {
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

pub async fn count(client: &tokio_postgres::Client) -> anyhow::Result<i64> {
    Ok(client
        .query_one("SELECT count(*) FROM kept", &[])
        .await?
        .get(0))
}

/// Waits until instance `index` is a replica of `primary` that streams and has replayed
/// `rows` rows of `kept`.
pub async fn wait_replica_of(bed: &Bed, index: usize, primary: usize, rows: i64) {
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
pub async fn wait_status(bed: &Bed, index: usize, what: &str, condition: impl Fn(&Value) -> bool) {
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
pub fn terminate(bed: &mut Bed, index: usize) -> ExitStatus {
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
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
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

pub async fn started_at(client: &tokio_postgres::Client) -> Result<String, tokio_postgres::Error> {
    client
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .await
        .map(|row| row.get(0))
}

pub async fn slots(primary: &tokio_postgres::Client) -> anyhow::Result<Vec<(String, bool)>> {
    let rows = primary
        .query(
            "SELECT slot_name::text, active FROM pg_replication_slots ORDER BY 1",
            &[],
        )
        .await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

/// Starts instance 0 of `replicas` as the primary and writes rows 1 to 100 of `kept` on it;
/// returns its index and the connection that wrote them.
pub async fn primary_with_kept_rows(
    bed: &mut Bed,
    replicas: u32,
) -> (usize, tokio_postgres::Client) {
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

/// Sends `signal` (`STOP`, `CONT`) to process `pid`.
pub fn signal_process(pid: i32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal} {pid}");
}
