//! `kubectl pgkube`: the pgkube binary run under the name `kubectl-pgkube` (a link to it on the
//! `PATH` makes it a kubectl plugin). It reads kubeconfig as kubectl does (`--kubeconfig`,
//! `KUBECONFIG`, `~/.kube/config`), with `--context` and `-n`, and drives a cluster through
//! its objects only: `status`, `switchover` (the `db.example.com/switchover-to` annotation),
//! `backup` (a PostgreSQLBackup), and shell completion.

mod status;

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum};
use kube::api::{Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use pgkube_crds::{BackupPhase, InstanceRole, PostgreSQLBackup, PostgreSQLCluster};

/// The executable name under which the binary is the plugin.
pub const PLUGIN_NAME: &str = "kubectl-pgkube";

/// Whether this process was started as `kubectl-pgkube`.
pub fn invoked_as_plugin() -> bool {
    std::env::args_os()
        .next()
        .as_deref()
        .and_then(|program| {
            Path::new(program)
                .file_name()
                .map(|name| name == PLUGIN_NAME)
        })
        .unwrap_or(false)
}

#[derive(Parser)]
#[command(
    name = PLUGIN_NAME,
    bin_name = "kubectl pgkube",
    version,
    about = "Drive pgkube's PostgreSQL clusters: status, switchover, backup"
)]
struct PluginCli {
    /// The kubeconfig file; otherwise KUBECONFIG, then ~/.kube/config.
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context; otherwise its current one.
    #[arg(long, global = true)]
    context: Option<String>,
    /// The namespace; otherwise the context's.
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    #[command(subcommand)]
    command: PluginCommand,
}

#[derive(Subcommand)]
enum PluginCommand {
    /// A cluster at a glance: instances with role, readiness, lag and timeline; backups; WAL
    /// archiving; conditions.
    Status {
        cluster: String,
        /// Print the object instead, as data.
        #[arg(short = 'o', long, value_enum)]
        output: Option<Output>,
    },
    /// Move the primary to a replica (the ready one with the least lag unless named).
    Switchover {
        cluster: String,
        pod: Option<String>,
        /// Wait until the new primary serves.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits.
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
    /// Back the cluster up now (a new PostgreSQLBackup).
    Backup {
        cluster: String,
        #[arg(long, value_enum, default_value_t = Method::Logical)]
        method: Method,
        /// Wait until the backup ends, showing its phase.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits.
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
    /// Print a shell completion script for kubectl-pgkube.
    Completion { shell: clap_complete::Shell },
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Json,
    Yaml,
}

#[derive(Clone, Copy, ValueEnum)]
enum Method {
    Logical,
    Physical,
}

/// Runs the plugin with the process's arguments.
pub fn main() -> ExitCode {
    let cli = PluginCli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let result = match runtime {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(error) => Err(error.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: PluginCli) -> anyhow::Result<()> {
    if let PluginCommand::Completion { shell } = cli.command {
        let mut command = PluginCli::command();
        clap_complete::generate(shell, &mut command, PLUGIN_NAME, &mut std::io::stdout());
        return Ok(());
    }
    let (client, namespace) = connect(&cli).await?;
    let clusters = Api::<PostgreSQLCluster>::namespaced(client.clone(), &namespace);
    match cli.command {
        PluginCommand::Status { cluster, output } => {
            let cluster = get_cluster(&clusters, &cluster, &namespace).await?;
            print_status(&cluster, output)
        }
        PluginCommand::Switchover {
            cluster,
            pod,
            wait,
            timeout,
        } => {
            switchover(
                &clusters,
                &namespace,
                &cluster,
                pod,
                wait.then_some(timeout),
            )
            .await
        }
        PluginCommand::Backup {
            cluster,
            method,
            wait,
            timeout,
        } => {
            get_cluster(&clusters, &cluster, &namespace).await?;
            let backups = Api::<PostgreSQLBackup>::namespaced(client, &namespace);
            backup(&backups, &cluster, method, wait.then_some(timeout)).await
        }
        PluginCommand::Completion { .. } => Ok(()),
    }
}

/// A client of the kubeconfig's cluster, and the namespace to act in.
async fn connect(cli: &PluginCli) -> anyhow::Result<(Client, String)> {
    let options = KubeConfigOptions {
        context: cli.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match &cli.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?
        }
        None => kube::Config::from_kubeconfig(&options)
            .await
            .context("cannot read the kubeconfig")?,
    };
    let namespace = cli
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    Ok((Client::try_from(config)?, namespace))
}

async fn get_cluster(
    clusters: &Api<PostgreSQLCluster>,
    name: &str,
    namespace: &str,
) -> anyhow::Result<PostgreSQLCluster> {
    clusters
        .get_opt(name)
        .await?
        .with_context(|| format!("no PostgreSQLCluster {name} in namespace {namespace}"))
}

fn print_status(cluster: &PostgreSQLCluster, output: Option<Output>) -> anyhow::Result<()> {
    match output {
        Some(Output::Json) => println!("{}", serde_json::to_string_pretty(cluster)?),
        Some(Output::Yaml) => print!("{}", serde_yaml::to_string(cluster)?),
        None => {
            let paint = status::Paint {
                enabled: std::io::stdout().is_terminal(),
            };
            print!("{}", status::render(cluster, paint));
        }
    }
    Ok(())
}

/// Asks for a switchover of `name` to `pod` (or the best replica), then waits for it if
/// `wait` says how long.
async fn switchover(
    clusters: &Api<PostgreSQLCluster>,
    namespace: &str,
    name: &str,
    pod: Option<String>,
    wait: Option<Duration>,
) -> anyhow::Result<()> {
    let cluster = get_cluster(clusters, name, namespace).await?;
    let target = switchover_target(&cluster, pod.as_deref())?;
    let annotation = pgkube_controllers::cluster::failover::SWITCHOVER_ANNOTATION;
    let patch = serde_json::json!({"metadata": {"annotations": {annotation: target}}});
    clusters
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    println!("asked for a switchover of {namespace}/{name} to {target}");
    let Some(timeout) = wait else {
        return Ok(());
    };
    let started = Instant::now();
    loop {
        let status = get_cluster(clusters, name, namespace).await?.status;
        let done = status.as_ref().is_some_and(|status| {
            status.current_primary.as_deref() == Some(target.as_str())
                && status
                    .primary_change
                    .as_ref()
                    .is_some_and(|change| change.to == target && change.completed_at.is_some())
        });
        if done {
            println!("{target} is the primary");
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < timeout,
            "{target} is not the primary after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The instance to move the primary to: `pod` if it is one of the cluster's replicas, else the
/// ready replica with the least lag.
fn switchover_target(cluster: &PostgreSQLCluster, pod: Option<&str>) -> anyhow::Result<String> {
    let instances = cluster
        .status
        .as_ref()
        .map(|status| status.instances.clone())
        .unwrap_or_default();
    let replicas: Vec<_> = instances
        .iter()
        .filter(|instance| instance.role == InstanceRole::Replica)
        .collect();
    if let Some(pod) = pod {
        anyhow::ensure!(
            replicas.iter().any(|replica| replica.name == pod),
            "{pod} is not a replica of this cluster; its replicas: {}",
            names(&replicas)
        );
        return Ok(pod.to_owned());
    }
    replicas
        .iter()
        .filter(|replica| replica.ready)
        .min_by_key(|replica| replica.lag_bytes.unwrap_or(i64::MAX))
        .map(|replica| replica.name.clone())
        .with_context(|| format!("no ready replica to switch over to ({})", names(&replicas)))
}

fn names(instances: &[&pgkube_crds::InstanceStatus]) -> String {
    if instances.is_empty() {
        return "none".to_owned();
    }
    instances
        .iter()
        .map(|instance| instance.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Makes a backup of `cluster` by `method`, and waits for its end if `wait` says how long.
async fn backup(
    backups: &Api<PostgreSQLBackup>,
    cluster: &str,
    method: Method,
    wait: Option<Duration>,
) -> anyhow::Result<()> {
    let method = match method {
        Method::Logical => "Logical",
        Method::Physical => "Physical",
    };
    let backup: PostgreSQLBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": "db.example.com/v1beta1",
        "kind": "PostgreSQLBackup",
        "metadata": {"generateName": format!("{cluster}-")},
        "spec": {"cluster": {"name": cluster}, "method": method},
    }))?;
    let made = backups.create(&PostParams::default(), &backup).await?;
    let name = made.metadata.name.unwrap_or_default();
    println!("backup {name} of {cluster} ({method}) created");
    let Some(timeout) = wait else {
        return Ok(());
    };
    let started = Instant::now();
    let mut shown = None;
    loop {
        let backup = backups.get(&name).await?;
        let status = backup.status.unwrap_or_default();
        if status.phase != shown {
            let phase = status
                .phase
                .map_or_else(|| "Pending".to_owned(), |phase| format!("{phase:?}"));
            println!("{:>6.0}s  {phase}", started.elapsed().as_secs_f64());
            shown = status.phase;
        }
        match status.phase {
            Some(BackupPhase::Completed) => {
                let size = status.size_bytes.map_or_else(String::new, |bytes| {
                    format!(", {}", status::bytes_text(bytes))
                });
                let key = status.object_key.unwrap_or_default();
                println!("completed{size}: {key}");
                return Ok(());
            }
            Some(BackupPhase::Failed) => {
                let why = status
                    .conditions
                    .iter()
                    .map(|condition| condition.message.clone())
                    .collect::<Vec<_>>()
                    .join("; ");
                anyhow::bail!("backup {name} failed: {why}");
            }
            _ => {}
        }
        anyhow::ensure!(
            started.elapsed() < timeout,
            "backup {name} has not ended after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(instances: serde_json::Value) -> PostgreSQLCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "db.example.com/v1beta1",
            "kind": "PostgreSQLCluster",
            "metadata": {"name": "db"},
            "spec": {"storage": {"size": "1Gi"}},
            "status": {"instances": instances},
        }))
        .expect("a cluster")
    }

    #[test]
    fn a_switchover_goes_to_the_named_replica_or_the_ready_one_with_least_lag() {
        let cluster = cluster(serde_json::json!([
            {"name": "db-postgresql-0", "role": "primary", "ready": true},
            {"name": "db-postgresql-1", "role": "replica", "ready": true, "lagBytes": 900},
            {"name": "db-postgresql-2", "role": "replica", "ready": true, "lagBytes": 10},
            {"name": "db-postgresql-3", "role": "replica", "ready": false, "lagBytes": 0},
        ]));
        let target = |pod| switchover_target(&cluster, pod).map_err(|error| error.to_string());
        assert_eq!(target(None), Ok("db-postgresql-2".to_owned()));
        assert_eq!(
            target(Some("db-postgresql-1")),
            Ok("db-postgresql-1".to_owned())
        );
        let refused = target(Some("db-postgresql-0")).expect_err("the primary");
        assert!(
            refused.contains("not a replica") && refused.contains("db-postgresql-1, "),
            "{refused}"
        );
        let alone = self::cluster(serde_json::json!([
            {"name": "db-postgresql-0", "role": "primary", "ready": true},
        ]));
        let refused = switchover_target(&alone, None).expect_err("no replica");
        assert!(
            refused.to_string().contains("no ready replica"),
            "{refused}"
        );
    }

    #[test]
    fn the_plugin_parses_kubectls_flags_anywhere() {
        let cli = PluginCli::try_parse_from([
            "kubectl-pgkube",
            "status",
            "db",
            "-n",
            "shop",
            "--context",
            "prod",
            "-o",
            "json",
        ])
        .expect("parses");
        assert_eq!(cli.namespace.as_deref(), Some("shop"));
        assert_eq!(cli.context.as_deref(), Some("prod"));
        assert!(matches!(
            cli.command,
            PluginCommand::Status {
                output: Some(Output::Json),
                ..
            }
        ));
        PluginCli::command().debug_assert();
    }
}
