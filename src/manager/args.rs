//! Command-line flags of `pgkube run`, each with an environment variable equivalent.
//!
//! Parsing is pure: values that depend on where the manager runs (the pod's namespace, its
//! host name) are resolved later by small functions that take their inputs explicitly, so
//! they can be unit-tested.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{ArgAction, Args, ValueEnum};

mod agent_resources;

/// Where a pod finds its own namespace (mounted by Kubernetes with the service account token).
pub const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Flags of `pgkube run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Elect a leader on a coordination.k8s.io Lease so that only one replica runs the
    /// controllers; the others stand by. `--leader-elect` alone means true.
    #[arg(long, env = "PGKUBE_LEADER_ELECT", action = ArgAction::Set, num_args = 0..=1,
        default_value_t = false, default_missing_value = "true", value_name = "BOOL")]
    pub leader_elect: bool,

    /// Name of the Lease used for leader election.
    #[arg(long, env = "PGKUBE_LEADER_ELECT_ID", default_value = "pgkube-leader")]
    pub leader_elect_id: String,

    /// Namespace of the Lease. Default: the pod's namespace (POD_NAMESPACE, or the service
    /// account's namespace file), else `default`.
    #[arg(long, env = "PGKUBE_LEADER_ELECT_NAMESPACE")]
    pub leader_elect_namespace: Option<String>,

    /// How long a Lease stays valid after its last renewal; a follower takes over a leader that
    /// died (kill -9, node loss) after at most this long. Whole seconds.
    #[arg(long, env = "PGKUBE_LEADER_ELECT_LEASE_DURATION", default_value = "15s",
        value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,

    /// The leader steps down (stops its controllers and exits) when it could not renew the
    /// Lease for this long, by its own clock; must be shorter than the lease duration (the
    /// difference absorbs clock drift and the time stepping down takes). Whole seconds.
    #[arg(long, env = "PGKUBE_LEADER_ELECT_RENEW_DEADLINE", default_value = "10s",
        value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,

    /// How often the leader renews the Lease and a follower checks whether it is free (a
    /// released Lease is taken over within about this long).
    #[arg(long, env = "PGKUBE_LEADER_ELECT_RETRY_PERIOD", default_value = "2s",
        value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,

    /// Address of the health probes: `/healthz` (live) and `/readyz` (caches synced, or
    /// standing by as a follower). `:PORT` means all interfaces; `0` disables.
    #[arg(long, env = "PGKUBE_HEALTH_PROBE_BIND_ADDRESS", default_value = ":8081",
        value_parser = parse_bind_address)]
    pub health_probe_bind_address: BindAddress,

    /// Address of the Prometheus `/metrics` endpoint. `:PORT` means all interfaces; `0`
    /// disables.
    #[arg(long, env = "PGKUBE_METRICS_BIND_ADDRESS", default_value = ":8080",
        value_parser = parse_bind_address)]
    pub metrics_bind_address: BindAddress,

    /// Address of the CRD conversion webhook (HTTPS, `POST /convert`), served by every replica,
    /// leader or not. `:PORT` means all interfaces; `0` disables.
    #[arg(long, env = "PGKUBE_WEBHOOK_BIND_ADDRESS", default_value = ":9443",
        value_parser = parse_bind_address)]
    pub webhook_bind_address: BindAddress,

    /// Directory of the webhook's serving certificate, `tls.crt` and `tls.key` (for example a
    /// cert-manager Secret's volume). The files are read again when they change. Without
    /// them the webhook is not served, and the manager says so.
    #[arg(
        long,
        env = "PGKUBE_WEBHOOK_CERT_DIR",
        default_value = "/tmp/k8s-webhook-server/serving-certs"
    )]
    pub webhook_cert_dir: std::path::PathBuf,

    /// Manage the webhook's CA and serving certificate in this Secret of the manager's
    /// namespace: made if missing, renewed before expiry, written into `--webhook-cert-dir`,
    /// and set as the `caBundle` of pgkube's CRDs that convert through a webhook. Empty: the
    /// certificate comes from `--webhook-cert-dir` (for example cert-manager's).
    #[arg(long, env = "PGKUBE_WEBHOOK_CERT_SECRET", default_value = "")]
    pub webhook_cert_secret: String,

    /// Host names and IP addresses of a managed serving certificate, comma-separated. Default:
    /// the `pgkube-webhook` Service of the manager's namespace.
    #[arg(long, env = "PGKUBE_WEBHOOK_CERT_HOSTS", value_delimiter = ',')]
    pub webhook_cert_hosts: Vec<String>,

    /// Largest request body the webhook reads, in bytes; a larger one gets a 413. A
    /// ConversionReview holds a page of a list: raise it if listing many objects in the version
    /// not stored fails.
    #[arg(long, env = "PGKUBE_WEBHOOK_MAX_BODY_BYTES",
        default_value_t = crate::manager::webhook::DEFAULT_BODY_LIMIT)]
    pub webhook_max_body_bytes: usize,

    /// Sustained rate of requests to the Kubernetes API server (requests per second, client
    /// side; requests beyond it wait). 50/100 by default: creating many clusters at once is
    /// bound by this rate (about 14 requests per cluster), while a settled manager makes no
    /// request at all, so the higher limit costs nothing at rest (see the README's figures).
    #[arg(long, env = "PGKUBE_KUBE_API_QPS", default_value_t = 50.0,
        value_parser = parse_positive_f64)]
    pub kube_api_qps: f64,

    /// Requests to the Kubernetes API server allowed at once above the sustained rate.
    #[arg(long, env = "PGKUBE_KUBE_API_BURST", default_value_t = 100,
        value_parser = clap::value_parser!(u32).range(1..))]
    pub kube_api_burst: u32,

    /// Namespaces to watch, comma-separated. Default: all namespaces.
    #[arg(
        long,
        env = "PGKUBE_WATCH_NAMESPACES",
        value_delimiter = ',',
        value_name = "NS,..."
    )]
    pub watch_namespaces: Vec<String>,

    /// Objects each controller reconciles at once.
    ///
    /// A reconcile sends its requests one after the other, so it takes 8 at once to use the
    /// whole default QPS (50) while the API server answers within 160 ms on average, which a
    /// busy one does not always do (see docs/benchmarks.md, "Convergence at scale"). The client
    /// limit, not this, bounds the load on the API server.
    #[arg(long, env = "PGKUBE_MAX_CONCURRENT_RECONCILES",
        default_value_t = pgkube_controllers::DEFAULT_MAX_CONCURRENT_RECONCILES,
        value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent_reconciles: u16,

    /// PostgreSQL image repository without tag; the tag is the cluster's major version.
    #[arg(
        long,
        env = "PGKUBE_POSTGRES_IMAGE_REPOSITORY",
        default_value = "postgres"
    )]
    pub postgres_image_repository: String,

    /// Image of pgkube itself, run by backup and restore Jobs (`pgkube agent`).
    #[arg(
        long,
        env = "PGKUBE_AGENT_IMAGE",
        default_value = "ghcr.io/pgkube/pgkube:latest"
    )]
    pub agent_image: String,

    /// The pgkube binary sent to instance managers that run another one: they exec it in
    /// place, and PostgreSQL keeps running (an operator upgrade restarts no database). This
    /// manager's own binary by default, which is the instance manager of its image.
    #[arg(long, env = "PGKUBE_INSTANCE_MANAGER_BINARY")]
    pub instance_manager_binary: Option<std::path::PathBuf>,

    /// Leave the instance managers as their pods started them: an operator upgrade then
    /// takes effect in each pod only when it is replaced.
    #[arg(long, env = "PGKUBE_NO_INSTANCE_MANAGER_UPGRADES")]
    pub no_instance_manager_upgrades: bool,

    /// How long a backup may wait for its cluster to be ready (or for the cluster's other
    /// backups) before it fails.
    #[arg(long, env = "PGKUBE_BACKUP_PENDING_DEADLINE", default_value = "1h",
        value_parser = parse_duration)]
    pub backup_pending_deadline: Duration,

    /// How long a backup Job may run (its `activeDeadlineSeconds`) before the backup fails.
    #[arg(long, env = "PGKUBE_BACKUP_ACTIVE_DEADLINE", default_value = "6h",
        value_parser = parse_duration)]
    pub backup_active_deadline: Duration,

    /// How long a backup Job's pod may take to start (be scheduled, pull its images, mount its
    /// Secrets) before the backup fails and its Job is deleted, so that the cluster's next
    /// backups are not blocked. Why it waits shows in the backup's status meanwhile.
    #[arg(long, env = "PGKUBE_BACKUP_START_TIMEOUT", default_value = "5m",
        value_parser = parse_duration)]
    pub backup_start_timeout: Duration,

    #[command(flatten)]
    pub agent: agent_resources::AgentResourceArgs,

    /// How long a restore may wait for its backup, its cluster (to exist, with a ready
    /// primary), or the cluster's other restores and running backup, before it fails.
    #[arg(long, env = "PGKUBE_RESTORE_PENDING_DEADLINE", default_value = "1h",
        value_parser = parse_duration)]
    pub restore_pending_deadline: Duration,

    /// How long a restore Job may run (its `activeDeadlineSeconds`) before the restore fails.
    #[arg(long, env = "PGKUBE_RESTORE_ACTIVE_DEADLINE", default_value = "6h",
        value_parser = parse_duration)]
    pub restore_active_deadline: Duration,

    /// How long a restore Job's pod may take to start (as `--backup-start-timeout`) before the
    /// restore fails and its Job is deleted, so that the cluster's scheduled backups, which
    /// wait for a running restore, go on.
    #[arg(long, env = "PGKUBE_RESTORE_START_TIMEOUT", default_value = "5m",
        value_parser = parse_duration)]
    pub restore_start_timeout: Duration,

    /// How long the server and client certificates pgkube issues for each cluster's
    /// PostgreSQL are valid. Each is renewed two thirds into it, and the servers reload it
    /// without a restart.
    #[arg(long, env = "PGKUBE_POSTGRES_CERTIFICATE_VALIDITY", default_value = "90d",
        value_parser = parse_duration)]
    pub postgres_certificate_validity: Duration,

    /// How long in-flight reconciles may take to finish after SIGTERM or SIGINT.
    #[arg(long, env = "PGKUBE_SHUTDOWN_GRACE_PERIOD", default_value = "30s",
        value_parser = parse_duration)]
    pub shutdown_grace_period: Duration,

    /// Log line format.
    #[arg(long, env = "PGKUBE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter in RUST_LOG syntax (`info`, `pgkube=debug,kube=info`, ...). Crates that could
    /// log credentials or signed requests (AWS SDK, HTTP clients) are always capped at `warn`.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log_filter: String,
}

/// Log line format.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object a line, with the fields of the enclosing spans (trace_id among them).
    Json,
    /// Human-readable lines.
    Text,
}

/// Where an HTTP endpoint listens; `Disabled` for `0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindAddress {
    Disabled,
    Listen(SocketAddr),
}

/// Timings of leader election, validated against each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTimings {
    /// Validity of the Lease after a renewal, whole seconds.
    pub duration_seconds: u64,
    /// How long the leader may go without renewing before it steps down.
    pub renew_deadline: Duration,
    /// How often the leader renews and a follower looks at the Lease.
    pub retry_period: Duration,
}

/// Flags that parse individually but don't fit together.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArgsError {
    #[error(
        "--leader-elect-lease-duration and --leader-elect-renew-deadline must be whole seconds of at least 1s"
    )]
    FractionalLeaseTiming,
    #[error(
        "--leader-elect-renew-deadline ({renew}s) must be shorter than --leader-elect-lease-duration ({duration}s)"
    )]
    RenewDeadlineNotShorter { renew: u64, duration: u64 },
    #[error(
        "--leader-elect-retry-period must be at least 100ms and shorter than the lease duration"
    )]
    RetryPeriodOutOfRange,
    #[error(
        "--agent-{resource}-request ({request}) must not be above --agent-{resource}-limit ({limit})"
    )]
    AgentRequestAboveLimit {
        resource: &'static str,
        request: String,
        limit: String,
    },
}

impl RunArgs {
    /// The leader election timings, checked for consistency.
    pub fn lease_timings(&self) -> Result<LeaseTimings, ArgsError> {
        let duration = whole_seconds(self.leader_elect_lease_duration)?;
        let renew = whole_seconds(self.leader_elect_renew_deadline)?;
        if renew >= duration {
            return Err(ArgsError::RenewDeadlineNotShorter { renew, duration });
        }
        let retry = self.leader_elect_retry_period;
        if retry < Duration::from_millis(100) || retry >= self.leader_elect_lease_duration {
            return Err(ArgsError::RetryPeriodOutOfRange);
        }
        Ok(LeaseTimings {
            duration_seconds: duration,
            renew_deadline: Duration::from_secs(renew),
            retry_period: retry,
        })
    }

    /// The controllers' settings, checked for consistency.
    pub fn settings(&self) -> Result<pgkube_controllers::Settings, ArgsError> {
        Ok(pgkube_controllers::Settings {
            watch_namespaces: self
                .watch_namespaces
                .iter()
                .map(|namespace| namespace.trim().to_owned())
                .filter(|namespace| !namespace.is_empty())
                .collect(),
            max_concurrent_reconciles: self.max_concurrent_reconciles,
            postgres_image_repository: self.postgres_image_repository.clone(),
            agent_image: self.agent_image.clone(),
            backup_pending_deadline: self.backup_pending_deadline,
            backup_active_deadline: self.backup_active_deadline,
            backup_start_timeout: self.backup_start_timeout,
            agent_resources: self.agent.requirements()?,
            restore_pending_deadline: self.restore_pending_deadline,
            restore_active_deadline: self.restore_active_deadline,
            restore_start_timeout: self.restore_start_timeout,
            postgres_certificate_validity: self.postgres_certificate_validity,
            otel_env: otel_env(std::env::vars()),
            ..pgkube_controllers::Settings::default()
        })
    }

    /// The binary instance managers should run (read and hashed now), unless upgrades are off.
    pub fn instance_manager_binary(
        &self,
    ) -> std::io::Result<Option<pgkube_controllers::cluster::manager_upgrade::OwnBinary>> {
        if self.no_instance_manager_upgrades {
            return Ok(None);
        }
        let path = match &self.instance_manager_binary {
            Some(path) => path.clone(),
            None => std::env::current_exe()?,
        };
        pgkube_controllers::cluster::manager_upgrade::OwnBinary::read(&path).map(Some)
    }
}

/// The `OTEL_*` variables among `vars`, sorted by name: backup Jobs get the same, so that the
/// agent exports its spans where the manager does.
fn otel_env(vars: impl Iterator<Item = (String, String)>) -> Vec<(String, String)> {
    let mut otel: Vec<_> = vars.filter(|(name, _)| name.starts_with("OTEL_")).collect();
    otel.sort();
    otel
}

fn whole_seconds(duration: Duration) -> Result<u64, ArgsError> {
    if duration.subsec_nanos() != 0 || duration.as_secs() == 0 {
        return Err(ArgsError::FractionalLeaseTiming);
    }
    Ok(duration.as_secs())
}

/// The namespace of the leader election Lease: the flag, else the pod's namespace from
/// `POD_NAMESPACE` or the service account file, else `default`.
pub fn lease_namespace(
    flag: Option<&str>,
    pod_namespace_env: Option<&str>,
    service_account_file: Option<&str>,
) -> String {
    [flag, pod_namespace_env, service_account_file]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|namespace| !namespace.is_empty())
        .unwrap_or("default")
        .to_owned()
}

/// The hosts of a managed webhook certificate: those asked for, else the `pgkube-webhook`
/// Service of `namespace` by every name a client in the cluster may use.
pub fn webhook_hosts(asked: &[String], namespace: &str) -> Vec<String> {
    let asked: Vec<String> = asked
        .iter()
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .collect();
    if !asked.is_empty() {
        return asked;
    }
    let service = "pgkube-webhook";
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// Accepts `30s`, `1m30s`, `500ms` and a bare number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    humantime::parse_duration(text).map_err(|error| format!("{error} (examples: 30s, 1m, 500ms)"))
}

/// Accepts `:8080` (all interfaces), `127.0.0.1:8080`, `[::1]:8080`, and `0` (disabled).
fn parse_bind_address(text: &str) -> Result<BindAddress, String> {
    if text == "0" {
        return Ok(BindAddress::Disabled);
    }
    let full = match text.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => text.to_owned(),
    };
    full.parse()
        .map(BindAddress::Listen)
        .map_err(|_| format!("`{text}` is not an address like :8080 or 127.0.0.1:8080, or 0"))
}

fn parse_positive_f64(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() && value > 0.0 => Ok(value),
        _ => Err(format!("`{text}` is not a positive number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn backup_jobs_get_the_managers_otel_variables_only() {
        let vars = [
            ("PATH", "/usr/bin"),
            ("OTEL_SERVICE_NAME", "pgkube"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318"),
        ]
        .map(|(name, value)| (name.to_owned(), value.to_owned()));
        assert_eq!(
            otel_env(vars.into_iter()),
            [
                (
                    "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
                    "https://collector:4318".to_owned()
                ),
                ("OTEL_SERVICE_NAME".to_owned(), "pgkube".to_owned()),
            ]
        );
    }

    #[derive(Parser)]
    struct TestCli {
        #[command(flatten)]
        run: RunArgs,
    }

    pub(super) fn parse(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let argv = std::iter::once("pgkube-run").chain(args.iter().copied());
        TestCli::try_parse_from(argv).map(|cli| cli.run)
    }

    #[test]
    fn defaults_match_the_documented_ones() {
        let args = parse(&[]).expect("no flags parse");
        assert!(!args.leader_elect);
        assert_eq!(args.leader_elect_id, "pgkube-leader");
        assert_eq!(args.leader_elect_namespace, None);
        assert_eq!(
            args.health_probe_bind_address,
            BindAddress::Listen("0.0.0.0:8081".parse().expect("address"))
        );
        assert_eq!(
            args.metrics_bind_address,
            BindAddress::Listen("0.0.0.0:8080".parse().expect("address"))
        );
        assert_eq!(args.shutdown_grace_period, Duration::from_secs(30));
        assert_eq!(args.log_format, LogFormat::Text);
        let settings = args.settings().expect("consistent defaults");
        assert!(settings.watch_namespaces.is_empty());
        assert_eq!(settings.backup_start_timeout, Duration::from_secs(300));
        assert_eq!(settings.restore_start_timeout, Duration::from_secs(300));
        assert_eq!(
            args.lease_timings(),
            Ok(LeaseTimings {
                duration_seconds: 15,
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2)
            })
        );
    }

    #[test]
    fn flags_reach_the_controller_settings() {
        let args = parse(&[
            "--watch-namespaces",
            "team-a, team-b,,",
            "--max-concurrent-reconciles",
            "9",
            "--postgres-image-repository",
            "mirror.local/postgres",
            "--agent-image",
            "mirror.local/pgkube:1.2.3",
            "--backup-start-timeout",
            "90s",
            "--restore-start-timeout",
            "2m",
            "--agent-memory-limit",
            "4Gi",
        ])
        .expect("flags parse");
        let settings = args.settings().expect("consistent flags");
        assert_eq!(settings.backup_start_timeout, Duration::from_secs(90));
        assert_eq!(settings.restore_start_timeout, Duration::from_secs(120));
        let limits = settings.agent_resources.limits.clone().unwrap_or_default();
        assert_eq!(limits.get("memory").map(|q| q.0.as_str()), Some("4Gi"));
        assert_eq!(settings.watch_namespaces, ["team-a", "team-b"]);
        assert_eq!(settings.max_concurrent_reconciles, 9);
        assert_eq!(settings.postgres_image_repository, "mirror.local/postgres");
        assert_eq!(settings.agent_image, "mirror.local/pgkube:1.2.3");
    }

    #[test]
    fn leader_elect_takes_an_optional_boolean() {
        assert!(parse(&["--leader-elect"]).expect("bare flag").leader_elect);
        assert!(
            !parse(&["--leader-elect=false"])
                .expect("false")
                .leader_elect
        );
        assert!(parse(&["--leader-elect=true"]).expect("true").leader_elect);
    }

    #[test]
    fn bind_addresses_accept_port_only_full_and_disabled() {
        assert_eq!(
            parse_bind_address(":9000"),
            Ok(BindAddress::Listen(
                "0.0.0.0:9000".parse().expect("address")
            ))
        );
        assert_eq!(
            parse_bind_address("127.0.0.1:0"),
            Ok(BindAddress::Listen("127.0.0.1:0".parse().expect("address")))
        );
        assert_eq!(parse_bind_address("0"), Ok(BindAddress::Disabled));
        assert!(parse_bind_address("localhost").is_err());
        assert!(parse(&["--metrics-bind-address", "nonsense"]).is_err());
    }

    #[test]
    fn durations_accept_units_and_bare_seconds() {
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn qps_and_burst_reject_zero() {
        assert!(parse(&["--kube-api-qps", "0"]).is_err());
        assert!(parse(&["--kube-api-burst", "0"]).is_err());
        let args = parse(&["--kube-api-qps", "2.5", "--kube-api-burst", "7"]).expect("parse");
        assert_eq!((args.kube_api_qps, args.kube_api_burst), (2.5, 7));
    }

    #[test]
    fn inconsistent_lease_timings_are_rejected() {
        let args = parse(&[
            "--leader-elect-lease-duration",
            "10s",
            "--leader-elect-renew-deadline",
            "10s",
        ])
        .expect("parse");
        assert_eq!(
            args.lease_timings(),
            Err(ArgsError::RenewDeadlineNotShorter {
                renew: 10,
                duration: 10
            })
        );
        let args = parse(&["--leader-elect-lease-duration", "1500ms"]).expect("parse");
        assert_eq!(args.lease_timings(), Err(ArgsError::FractionalLeaseTiming));
        let args = parse(&["--leader-elect-retry-period", "20s"]).expect("parse");
        assert_eq!(args.lease_timings(), Err(ArgsError::RetryPeriodOutOfRange));
    }

    #[test]
    fn lease_namespace_prefers_flag_then_pod_then_default() {
        assert_eq!(
            lease_namespace(Some("ops"), Some("pod-ns"), Some("sa-ns")),
            "ops"
        );
        assert_eq!(
            lease_namespace(None, Some("pod-ns"), Some("sa-ns")),
            "pod-ns"
        );
        assert_eq!(lease_namespace(None, None, Some("sa-ns\n")), "sa-ns");
        assert_eq!(lease_namespace(None, Some(" "), None), "default");
        assert_eq!(lease_namespace(None, None, None), "default");
    }
}
