//! The flags of `pgkube instance run`, which the operator sets through the pod's environment.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

/// Flags of `pgkube instance run`; the operator sets them through the environment.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// This pod's name.
    #[arg(long, env = "POD_NAME")]
    pub(super) pod_name: String,

    /// The data directory.
    #[arg(long, env = "PGDATA")]
    pub(super) pgdata: PathBuf,

    /// The cluster's ConfigMap: postgresql.conf, pg_hba.conf, instance.json.
    #[arg(long, env = "PGKUBE_CONFIG_DIR", default_value = "/etc/pgkube/config")]
    pub(super) config_dir: PathBuf,

    /// The superuser's Secret: username, password.
    #[arg(
        long,
        env = "PGKUBE_SUPERUSER_DIR",
        default_value = "/etc/pgkube/superuser"
    )]
    pub(super) superuser_dir: PathBuf,

    /// The replication role's Secret: username, password.
    #[arg(
        long,
        env = "PGKUBE_REPLICATION_DIR",
        default_value = "/etc/pgkube/replication"
    )]
    pub(super) replication_dir: PathBuf,

    /// The application role's Secret: username, password, dbname. The role and its database
    /// are made on the primary once the Secret is there.
    #[arg(
        long,
        env = "PGKUBE_APPLICATION_DIR",
        default_value = "/etc/pgkube/application"
    )]
    pub(super) application_dir: PathBuf,

    /// The control Secret: `token`, which the operator's orders must bear. Without it the
    /// control endpoints are disabled.
    #[arg(
        long,
        env = "PGKUBE_CONTROL_DIR",
        default_value = "/etc/pgkube/control"
    )]
    pub(super) control_dir: PathBuf,

    /// The cluster's certificates: `ca.crt`, the server's `tls.crt` and `tls.key`, and the
    /// client certificates `replication.{crt,key}` and `superuser.{crt,key}`. Without `ca.crt`
    /// the server runs without TLS.
    #[arg(long, env = "PGKUBE_TLS_DIR", default_value = "/etc/pgkube/tls")]
    pub(super) tls_dir: PathBuf,

    /// Where the manager copies them, readable by its user only (as PostgreSQL and libpq
    /// require of a key).
    #[arg(
        long,
        env = "PGKUBE_TLS_RUNTIME_DIR",
        default_value = "/controller/tls"
    )]
    pub(super) tls_runtime_dir: PathBuf,

    /// A directory of the manager's own (the password files go there).
    #[arg(long, env = "PGKUBE_RUN_DIR", default_value = "/controller")]
    pub(super) run_dir: PathBuf,

    /// The S3 keys (`access-key-id`, `secret-access-key`) and CA bundle (`ca.crt`) of the
    /// cluster's backup storage, for WAL archiving.
    #[arg(long, env = "PGKUBE_S3_DIR", default_value = "/etc/pgkube/s3")]
    pub(super) s3_dir: PathBuf,

    /// The S3 keys and CA bundle of the storage a point-in-time recovery reads
    /// (`instance.json`'s `recovery`).
    #[arg(
        long,
        env = "PGKUBE_RECOVERY_S3_DIR",
        default_value = "/etc/pgkube/recovery-s3"
    )]
    pub(super) recovery_s3_dir: PathBuf,

    /// WAL segments a recovering server's manager fetches ahead of the one asked for; 0 turns
    /// fetching ahead off.
    #[arg(long, env = "PGKUBE_WAL_PREFETCH", default_value_t = super::recover::fetch::PREFETCH)]
    pub(super) wal_prefetch: u64,

    /// The server's port (as its postgresql.conf says), for the manager's own connection.
    #[arg(long, env = "PGKUBE_PORT", default_value_t = 5432)]
    pub(super) port: u16,

    /// Where the server puts its Unix socket (the `unix_socket_directories` of the config).
    #[arg(long, env = "PGKUBE_SOCKET_DIR", default_value = "/var/run/postgresql")]
    pub(super) socket_dir: PathBuf,

    /// Address of the status endpoint.
    #[arg(long, env = "PGKUBE_STATUS_ADDRESS", default_value = "0.0.0.0")]
    pub(super) status_address: IpAddr,

    /// Port of the status endpoint.
    #[arg(long, env = "PGKUBE_STATUS_PORT", default_value_t = 8000)]
    pub(super) status_port: u16,

    /// Port of PostgreSQL's metrics for Prometheus (`/metrics`), on the status endpoint's
    /// address.
    #[arg(long, env = "PGKUBE_METRICS_PORT", default_value_t = 9187)]
    pub(super) metrics_port: u16,

    /// A file of custom queries for the metrics port, in postgres_exporter's queries format,
    /// read again at each scrape (a mounted ConfigMap).
    #[arg(long, env = "PGKUBE_METRICS_QUERIES")]
    pub(super) metrics_queries: Option<PathBuf>,

    /// How long a fast shutdown may take before it becomes immediate. Keep it below the pod's
    /// termination grace period.
    #[arg(long, env = "PGKUBE_SHUTDOWN_TIMEOUT", default_value = "50s",
        value_parser = humantime::parse_duration)]
    pub(super) shutdown_timeout: Duration,

    /// How long the primary waits before it drops the slot of an instance no longer in the
    /// cluster: longer than a kubelet takes to refresh the mounted ConfigMap, so that the new
    /// replica of a scale-up keeps the slot it made before the primary learns of it.
    #[arg(long, env = "PGKUBE_SLOT_DROP_GRACE", default_value = "2m",
        value_parser = humantime::parse_duration)]
    pub(super) slot_drop_grace: Duration,

    /// How often the mounted files and the server are looked at.
    #[arg(long, env = "PGKUBE_WATCH_PERIOD", default_value = "2s",
        value_parser = humantime::parse_duration)]
    pub(super) watch_period: Duration,
}
