//! The recoveries compared, and what they need: the recovery order of pgkube's base backup, the
//! WAL written after the backups, and pgBackRest's repository with the same WAL in it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use pgkube_controllers::storage::manifest::Manifest;
use pgkube_controllers::storage::recovery::{BaseObject, RecoveryOrder};
use pgkube_controllers::storage::wal::WalArchiveTarget;
use pgkube_testkit::proxy::Proxy;
use pgkube_testkit::{TestBucket, TestEnv, list_objects};

use super::Recovered;
use super::server::{self, BIN, Server, as_postgres, free_port};

pub const DEFAULT_PREFETCH: u64 = pgkube::instance::recover::fetch::PREFETCH;
/// How long one recovery may take before the bench gives up.
const RECOVERY_LIMIT: Duration = Duration::from_secs(1800);

/// The source keeps its WAL since the backups, for pgBackRest's repository (read by the
/// instance manager at its next look, a reload).
pub fn keep_wal(source_dir: &Path) {
    let conf = source_dir.join("config/postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).expect("postgresql.conf");
    text.push_str("wal_keep_size = 8GB\n");
    std::fs::write(&conf, text).expect("postgresql.conf");
}

/// The order a recovering instance gets from the operator: pgkube's base backup (the one
/// manifest under `pgkube/`), the archive at `root`, to its end.
pub struct Order {
    pub order: RecoveryOrder,
    /// The backup's first WAL file: pgBackRest's repository needs every file from there on.
    pub first_wal: String,
}

pub async fn order_of(env: &TestEnv, bucket: &TestBucket, root: &str) -> Order {
    let keys = list_objects(&bucket.client(), bucket.name(), "pgkube/")
        .await
        .expect("the backups listed");
    let key = keys
        .keys()
        .find(|key| key.ends_with("/manifest.json") && !key.starts_with(root))
        .expect("pgkube's manifest")
        .clone();
    let bytes = bucket.object(&key).await.expect("the manifest");
    let manifest = Manifest::parse(&key, &bytes).expect("a manifest");
    let physical = manifest.physical.clone().expect("a physical backup");
    let order = RecoveryOrder {
        archive: WalArchiveTarget {
            bucket: bucket.name().to_owned(),
            region: env.s3_region.clone(),
            endpoint: Some(env.s3_endpoint.clone()),
            force_path_style: true,
            root: root.to_owned(),
            cluster: "bench/bench".to_owned(),
            ca_bundle: false,
            keys: true,
            server_side_encryption: None,
        },
        backup: key,
        base: BaseObject {
            key: physical.base.key.clone(),
            size: physical.base.size,
            sha256: physical.base.sha256.clone(),
        },
        system_identifier: manifest.system_identifier.clone().expect("its database"),
        stop_lsn: physical.stop_lsn.clone(),
        target: Default::default(),
    };
    Order {
        order,
        first_wal: physical.first_wal.clone(),
    }
}

/// Commits rows of random hex until `mb` MB of WAL were written, then finishes the last file
/// and waits until pgkube archived it; returns the bytes of WAL written.
pub async fn write_wal(sql: &tokio_postgres::Client, mb: u64) -> u64 {
    sql.batch_execute("CREATE TABLE noise (id bigint, hex text)")
        .await
        .expect("the table");
    let start = current_lsn(sql).await;
    let mut next = 0i64;
    loop {
        sql.execute(
            "INSERT INTO noise SELECT g, md5(random()::text) || md5(random()::text) \
             FROM generate_series($1::bigint, $1::bigint + 99999) g",
            &[&next],
        )
        .await
        .expect("rows");
        next += 100_000;
        let written = wal_between(sql, &start).await;
        if written >= mb << 20 {
            break;
        }
    }
    let last: String = sql
        .query_one("SELECT pg_walfile_name(pg_switch_wal())", &[])
        .await
        .expect("a switch")
        .get(0);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let archived: Option<String> = sql
            .query_one("SELECT last_archived_wal FROM pg_stat_archiver", &[])
            .await
            .expect("the archiver's state")
            .get(0);
        if archived.is_some_and(|archived| archived >= last) {
            break;
        }
        assert!(Instant::now() < deadline, "{last} was not archived");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wal_between(sql, &start).await
}

async fn current_lsn(sql: &tokio_postgres::Client) -> String {
    sql.query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("the WAL location")
        .get(0)
}

async fn wal_between(sql: &tokio_postgres::Client, start: &str) -> u64 {
    let bytes: f64 = sql
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::float8",
            &[&start],
        )
        .await
        .expect("WAL written")
        .get(0);
    bytes as u64
}

/// Rows in `noise`: every recovery must end with all of them.
pub async fn row_count(sql: &tokio_postgres::Client) -> i64 {
    sql.query_one("SELECT count(*) FROM noise", &[])
        .await
        .expect("rows counted")
        .get(0)
}

/// pgkube's instance manager as the first instance of a recovering cluster, fetching `prefetch`
/// WAL files ahead: from an empty volume to a promoted primary.
pub async fn pgkube(
    env: &TestEnv,
    order: &Order,
    work: &Path,
    prefetch: u64,
    rows: i64,
) -> Recovered {
    let dir = work.join(format!("pgkube-prefetch-{prefetch}"));
    server::prepare(&dir);
    let port = free_port();
    let mut own_archive = order.order.archive.clone();
    own_archive.root = format!("pgkube/wal/recovered-{prefetch}/");
    own_archive.cluster = format!("bench/recovered-{prefetch}");
    let topology = serde_json::json!({
        "primary": "bench-0", "primaryHost": "127.0.0.1", "port": port, "replicas": 1,
        "statefulset": "bench", "clusterUid": format!("recovered-{prefetch}"),
        "walArchive": own_archive, "recovery": order.order,
    });
    super::peers::write_instance_files(env, &dir, port, &topology, &["recovery-s3"])
        .expect("the instance manager's files");
    server::give_to_postgres(&dir);
    let started = Instant::now();
    let environment = [
        (
            "PGKUBE_RECOVERY_S3_DIR",
            dir.join("recovery-s3").display().to_string(),
        ),
        ("PGKUBE_WAL_PREFETCH", prefetch.to_string()),
    ];
    let mut manager = Server::instance_manager_with(&dir, port, free_port(), &environment);
    let version = dir.join("data/pgdata/PG_VERSION");
    let base = wait_for(started, || version.exists()).await;
    let total = promoted(&mut manager, started, rows).await;
    let peak_rss_kib = manager.peak_rss_kib();
    manager.stop();
    keep_log(&dir, &format!("pgkube-prefetch-{prefetch}"));
    // A copy of the whole database: the next recovery needs the room.
    let _ = std::fs::remove_dir_all(&dir);
    Recovered {
        tool: format!(
            "pgkube instance manager, WAL prefetch {}",
            if prefetch == 0 {
                "off".to_owned()
            } else {
                format!("{prefetch} files ahead")
            }
        ),
        base,
        total,
        peak_rss_kib,
    }
}

/// Keeps a recovery's `server.log` (the instance manager's and PostgreSQL's) after its directory
/// goes, in `pgkube-recovery-bench-logs` under the temporary directory.
fn keep_log(dir: &Path, name: &str) {
    let logs = std::env::temp_dir().join("pgkube-recovery-bench-logs");
    let kept = std::fs::create_dir_all(&logs)
        .and_then(|()| std::fs::copy(dir.join("server.log"), logs.join(format!("{name}.log"))));
    if let Err(error) = kept {
        println!("recovery: the log of {name} not kept: {error}");
    }
}

/// The time from `started` until `done` holds, looked at every 50 ms.
async fn wait_for(started: Instant, done: impl Fn() -> bool) -> Duration {
    while !done() {
        assert!(
            started.elapsed() < RECOVERY_LIMIT,
            "no recovery within the limit"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

/// The time from `started` until the server answers as a primary; then checks it holds every
/// row.
async fn promoted(server: &mut Server, started: Instant, rows: i64) -> Duration {
    loop {
        assert!(
            started.elapsed() < RECOVERY_LIMIT,
            "no promotion within the limit"
        );
        assert!(
            !server.has_exited(),
            "the recovering server exited: see its server.log"
        );
        let failed = server.pgdata().join(pgkube::instance::recover::FAILED_FILE);
        assert!(
            !failed.exists(),
            "the recovery failed: {}",
            std::fs::read_to_string(&failed).unwrap_or_default()
        );
        let connected = tokio_postgres::Config::new()
            .host("127.0.0.1")
            .port(server.port)
            .user("postgres")
            .dbname("postgres")
            .connect_timeout(Duration::from_secs(1))
            .connect(tokio_postgres::NoTls)
            .await;
        if let Ok((client, connection)) = connected {
            tokio::spawn(connection);
            let in_recovery = client
                .query_one("SELECT pg_is_in_recovery()", &[])
                .await
                .map(|row| row.get::<_, bool>(0));
            if in_recovery.is_ok_and(|in_recovery| !in_recovery) {
                let elapsed = started.elapsed();
                assert_eq!(row_count(&client).await, rows, "every row recovered");
                return elapsed;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// pgBackRest's repository of the same database: a full backup and the WAL since pgkube's
/// backup, through an HTTPS proxy (pgBackRest speaks only HTTPS to S3).
pub struct PgBackRest {
    config: PathBuf,
    _proxy: Proxy,
}

impl PgBackRest {
    pub async fn back_up(
        env: &TestEnv,
        bucket: &TestBucket,
        source: &Server,
        work: &Path,
    ) -> Result<Self, String> {
        super::peers::install("pgbackrest", "pgbackrest")?;
        let dir = work.join("pgbackrest");
        for sub in ["log", "lock", "spool"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| e.to_string())?;
        }
        let proxy = Proxy::https(&env.s3_endpoint, &dir).await;
        let config = dir.join("pgbackrest.conf");
        let text = format!(
            "{repo}\
             process-max=2\n\
             compress-type=zst\n\
             start-fast=y\n\
             archive-check=n\n\
             archive-async=y\n\
             spool-path={dir}/spool\n\
             log-path={dir}/log\n\
             lock-path={dir}/lock\n\
             log-level-console=warn\n\
             [bench]\n\
             pg1-path={pgdata}\n\
             pg1-port={port}\n\
             pg1-socket-path={socket}\n\
             pg1-user=postgres\n",
            repo = super::peers::pgbackrest_repository(env, bucket, &proxy, "/pgbackrest-recovery"),
            dir = dir.display(),
            pgdata = source.pgdata().display(),
            port = source.port,
            socket = source.socket_dir().display(),
        );
        std::fs::write(&config, text).map_err(|e| e.to_string())?;
        server::give_to_postgres(&dir);
        let pgbackrest = Self {
            config,
            _proxy: proxy,
        };
        pgbackrest.run(&["stanza-create"])?;
        pgbackrest.run(&["--type=full", "backup"])?;
        Ok(pgbackrest)
    }

    fn run(&self, args: &[&str]) -> Result<(), String> {
        let status = as_postgres("pgbackrest")
            .arg(format!("--config={}", self.config.display()))
            .arg("--stanza=bench")
            .args(args)
            .stdout(Stdio::null())
            .status()
            .map_err(|e| e.to_string())?;
        match status.success() {
            true => Ok(()),
            false => Err(format!("pgbackrest {}: {status}", args.join(" "))),
        }
    }

    /// Pushes every WAL segment of the source's `pg_wal` from `first` on (synchronously).
    pub fn push_wal(&self, source: &Server, first: &str) -> Result<(), String> {
        let pg_wal = source.pgdata().join("pg_wal");
        let mut names: Vec<String> = std::fs::read_dir(&pg_wal)
            .map_err(|e| e.to_string())?
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| name.len() == 24 && name.as_str() >= first)
            .collect();
        names.sort();
        for name in names {
            let path = pg_wal.join(&name);
            self.run(&[
                "--archive-async=n",
                "archive-push",
                &path.display().to_string(),
            ])?;
        }
        Ok(())
    }

    /// `pgbackrest restore` into an empty directory, then PostgreSQL replaying with
    /// `archive-get` to the end of the archive.
    pub async fn restore(&self, work: &Path, rows: i64) -> Result<Recovered, String> {
        let dir = work.join("pgbackrest-restore");
        server::prepare(&dir);
        let pgdata = dir.join("pgdata");
        std::fs::create_dir_all(&pgdata).map_err(|e| e.to_string())?;
        server::give_to_postgres(&dir);
        let started = Instant::now();
        self.run(&[
            &format!("--pg1-path={}", pgdata.display()),
            "--type=default",
            "restore",
        ])?;
        let base = started.elapsed();
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&pgdata, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| e.to_string())?;
        }
        let port = free_port();
        let auto = pgdata.join("postgresql.auto.conf");
        let mut text = std::fs::read_to_string(&auto).map_err(|e| e.to_string())?;
        text.push_str(&server::common_settings(&dir, port));
        // The backed-up configuration archives with pgkube's socket, gone here.
        text.push_str("archive_mode = off\n");
        std::fs::write(&auto, text).map_err(|e| e.to_string())?;
        let child = as_postgres(&format!("{BIN}/postgres"))
            .arg("-D")
            .arg(&pgdata)
            .stderr(std::fs::File::create(dir.join("server.log")).map_err(|e| e.to_string())?)
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut server = Server::adopt(child, port, &pgdata, &dir);
        let total = promoted(&mut server, started, rows).await;
        server.stop();
        keep_log(&dir, "pgbackrest");
        let _ = std::fs::remove_dir_all(&dir);
        Ok(Recovered {
            tool: "pgbackrest restore (process-max 2), then archive-get (async, process-max 2)"
                .to_owned(),
            base,
            total,
            peak_rss_kib: None,
        })
    }
}
