//! The archivers compared, each set up on a fresh server: pgkube's instance manager, pgBackRest
//! and Barman. Each returns the server, the key prefix its archive is under, and the proxy in
//! front of the store that it reaches the store through (which the bench may stop).

use std::path::Path;
use std::sync::Arc;

use pgkube_controllers::storage::wal::WalArchiveTarget;
pub use pgkube_testkit::install_package as install;
use pgkube_testkit::proxy::Proxy;
use pgkube_testkit::{TestBucket, TestEnv};

use super::server::{self, Server, as_postgres, common_settings, free_port};

type Started = Result<(Server, String, Arc<Proxy>), String>;

/// A plain proxy in front of the test bed's store.
async fn store_proxy(env: &TestEnv) -> Result<Arc<Proxy>, String> {
    let upstream = env
        .s3_endpoint
        .trim_start_matches("http://")
        .parse()
        .map_err(|e| format!("the store's address {}: {e}", env.s3_endpoint))?;
    Ok(Arc::new(Proxy::tcp(upstream).await))
}

/// `pgkube instance run`, told to archive to `pgkube/wal/bench/` by its `instance.json`, as the
/// operator's ConfigMap would.
pub async fn pgkube(env: &TestEnv, bucket: &TestBucket, dir: &Path) -> Started {
    server::prepare(dir);
    let port = free_port();
    let root = "pgkube/wal/bench/".to_owned();
    let proxy = store_proxy(env).await?;
    let target = WalArchiveTarget {
        bucket: bucket.name().to_owned(),
        region: env.s3_region.clone(),
        endpoint: Some(format!("http://{}", proxy.address)),
        force_path_style: true,
        root: root.clone(),
        cluster: "bench/bench".to_owned(),
        ca_bundle: false,
        keys: true,
        server_side_encryption: None,
    };
    let topology = serde_json::json!({
        "primary": "bench-0", "primaryHost": "127.0.0.1", "port": port, "replicas": 1,
        "statefulset": "bench", "clusterUid": "bench-uid", "walArchive": target,
    });
    write_instance_files(env, dir, port, &topology, &[])?;
    server::give_to_postgres(dir);
    let server = Server::instance_manager(dir, port, free_port()).keep(Box::new(proxy.clone()));
    Ok((server, root, proxy))
}

/// The files a pod's instance manager reads, in `dir` (prepared), as the operator's ConfigMap
/// and Secrets give them: `instance.json` is `topology`, the store's keys are in `s3/` and in
/// each of `key_dirs` (the keys of a recovery's source).
pub fn write_instance_files(
    env: &TestEnv,
    dir: &Path,
    port: u16,
    topology: &serde_json::Value,
    key_dirs: &[&str],
) -> Result<(), String> {
    let dirs = [
        "config",
        "superuser",
        "replication",
        "control",
        "run",
        "data",
        "s3",
    ];
    for sub in dirs.iter().chain(key_dirs) {
        std::fs::create_dir_all(dir.join(sub)).map_err(|e| e.to_string())?;
    }
    let mut files = vec![
        (
            "config/postgresql.conf".to_owned(),
            common_settings(dir, port),
        ),
        ("config/pg_hba.conf".to_owned(), server::HBA.to_owned()),
        ("config/instance.json".to_owned(), topology.to_string()),
        ("superuser/username".to_owned(), "postgres".to_owned()),
        ("superuser/password".to_owned(), "bench".to_owned()),
        (
            "replication/username".to_owned(),
            "streaming_replica".to_owned(),
        ),
        ("replication/password".to_owned(), "bench".to_owned()),
    ];
    for keys in std::iter::once(&"s3").chain(key_dirs) {
        files.push((format!("{keys}/access-key-id"), env.s3_access_key.clone()));
        files.push((
            format!("{keys}/secret-access-key"),
            env.s3_secret_key.clone(),
        ));
    }
    for (file, content) in files {
        std::fs::write(dir.join(file), content).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// pgBackRest's `[global]` section up to its repository: the bucket at `path`, reached through
/// the HTTPS `proxy` (pgBackRest speaks only HTTPS to S3).
pub fn pgbackrest_repository(
    env: &TestEnv,
    bucket: &TestBucket,
    proxy: &Proxy,
    path: &str,
) -> String {
    format!(
        "[global]\n\
         repo1-type=s3\n\
         repo1-path={path}\n\
         repo1-s3-bucket={bucket}\n\
         repo1-s3-endpoint=127.0.0.1\n\
         repo1-storage-port={proxy_port}\n\
         repo1-storage-verify-tls=n\n\
         repo1-s3-key={key}\n\
         repo1-s3-key-secret={secret}\n\
         repo1-s3-region={region}\n\
         repo1-s3-uri-style=path\n",
        bucket = bucket.name(),
        proxy_port = proxy.address.port(),
        key = env.s3_access_key,
        secret = env.s3_secret_key,
        region = env.s3_region,
    )
}

/// pgBackRest's asynchronous archive-push, 2 processes, zstd, to the store through an HTTPS
/// proxy (pgBackRest speaks only HTTPS to S3).
pub async fn pgbackrest(env: &TestEnv, bucket: &TestBucket, dir: &Path) -> Started {
    install("pgbackrest", "pgbackrest")?;
    server::prepare(dir);
    let proxy = Arc::new(Proxy::https(&env.s3_endpoint, dir).await);
    let config = dir.join("pgbackrest.conf");
    let port = free_port();
    let text = format!(
        "{repo}\
         archive-async=y\n\
         process-max=2\n\
         compress-type=zst\n\
         spool-path={dir}/spool\n\
         log-path={dir}/log\n\
         lock-path={dir}/lock\n\
         log-level-console=warn\n\
         [bench]\n\
         pg1-path={dir}/pgdata\n\
         pg1-port={port}\n\
         pg1-socket-path={dir}/socket\n",
        repo = pgbackrest_repository(env, bucket, &proxy, "/pgbackrest"),
        dir = dir.display(),
    );
    std::fs::write(&config, text).map_err(|e| e.to_string())?;
    for sub in ["spool", "log", "lock"] {
        std::fs::create_dir_all(dir.join(sub)).map_err(|e| e.to_string())?;
    }
    server::give_to_postgres(dir);
    let command = format!(
        "archive_command = 'pgbackrest --config={} --stanza=bench archive-push %p'\n",
        config.display()
    );
    let mut server = Server::postgres(dir, port, &command, &[]);
    server.connect().await;
    let status = as_postgres("pgbackrest")
        .args([
            &format!("--config={}", config.display()),
            "--stanza=bench",
            "stanza-create",
        ])
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        server.stop();
        return Err(format!("pgbackrest stanza-create: {status}"));
    }
    let server = server.keep(Box::new(proxy.clone()));
    Ok((server, "pgbackrest/".to_owned(), proxy))
}

/// `barman-cloud-wal-archive` with gzip, one process per segment, as CloudNativePG runs it.
pub async fn barman(env: &TestEnv, bucket: &TestBucket, dir: &Path) -> Started {
    install("barman-cloud-wal-archive", "barman-cli-cloud")?;
    server::prepare(dir);
    let proxy = store_proxy(env).await?;
    let command = format!(
        "archive_command = 'barman-cloud-wal-archive --endpoint-url http://{} --gzip s3://{}/barman bench %p'\n",
        proxy.address,
        bucket.name()
    );
    let credentials = [
        ("AWS_ACCESS_KEY_ID", env.s3_access_key.clone()),
        ("AWS_SECRET_ACCESS_KEY", env.s3_secret_key.clone()),
        ("AWS_DEFAULT_REGION", env.s3_region.clone()),
    ];
    let server = Server::postgres(dir, free_port(), &command, &credentials);
    Ok((
        server.keep(Box::new(proxy.clone())),
        "barman/".to_owned(),
        proxy,
    ))
}
