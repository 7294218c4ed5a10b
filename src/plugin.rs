//! `kubectl pgkube`: the pgkube binary run under the name `kubectl-pgkube` (a link to it on the
//! `PATH` makes it a kubectl plugin). It reads kubeconfig as kubectl does (`--kubeconfig`,
//! `KUBECONFIG`, `~/.kube/config`), with `--context` and `-n`, and drives a cluster through
//! its objects: `status`, `switchover` (the `db.example.com/switchover-to` annotation),
//! `backup` (a PostgreSQLBackup), `restore` (a PostgreSQLRestore); and its pods: `psql` (through
//! `kubectl exec`) and `logs`; and shell completion.

pub mod complete;
mod objects;
mod pods;
mod progress;
mod status;

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Args, CommandFactory as _, Parser, Subcommand, ValueEnum};
use kube::api::{Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use pgkube_crds::{InstanceRole, PostgreSQLBackup, PostgreSQLCluster, PostgreSQLRestore};

/// The executable name under which the binary is the plugin.
pub const PLUGIN_NAME: &str = "kubectl-pgkube";

/// Whether this process was started as `kubectl-pgkube`.
pub fn invoked_as_plugin() -> bool {
    invoked_as(PLUGIN_NAME)
}

/// Whether this process was started as `kubectl_complete-pgkube`.
pub fn invoked_as_completion() -> bool {
    invoked_as(complete::COMPLETE_NAME)
}

fn invoked_as(executable: &str) -> bool {
    std::env::args_os()
        .next()
        .as_deref()
        .and_then(|program| {
            Path::new(program)
                .file_name()
                .map(|name| name == executable)
        })
        .unwrap_or(false)
}

#[derive(Parser)]
#[command(
    name = PLUGIN_NAME,
    bin_name = "kubectl pgkube",
    version,
    about = "Drive pgkube's PostgreSQL clusters: status, switchover, backup, restore, psql, logs"
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
    /// Restore a backup into the cluster (a new PostgreSQLRestore): a logical backup's
    /// databases, or with --point-in-time or --target-time the whole cluster from its WAL
    /// archive.
    Restore(RestoreArgs),
    /// Run psql as the superuser in the primary's pod (or a replica's), through kubectl exec;
    /// arguments after `--` go to psql.
    Psql {
        cluster: String,
        #[arg(long)]
        replica: bool,
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// The PostgreSQL logs of every instance, each line prefixed with its pod.
    Logs {
        cluster: String,
        #[arg(short = 'f', long)]
        follow: bool,
        /// Lines from the end of each pod's log.
        #[arg(long)]
        tail: Option<i64>,
    },
    /// Print a shell completion script for kubectl-pgkube.
    Completion { shell: clap_complete::Shell },
}

#[derive(Args)]
struct RestoreArgs {
    cluster: String,
    /// The PostgreSQLBackup to restore; for a point-in-time restore, the latest physical
    /// backup before the target unless named.
    #[arg(long)]
    backup: Option<String>,
    /// Recover the whole cluster in place to the end of its WAL archive.
    #[arg(long)]
    point_in_time: bool,
    /// Recover the whole cluster in place to this moment (RFC 3339).
    #[arg(long)]
    target_time: Option<String>,
    /// A logical restore's databases (all in the backup unless given).
    #[arg(long, value_delimiter = ',')]
    databases: Vec<String>,
    /// Replace databases that exist already (a logical restore otherwise refuses them).
    #[arg(long)]
    drop_existing: bool,
    /// Wait until the restore ends, showing its phase.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    timeout: Duration,
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
    let connection = Connection {
        kubeconfig: cli.kubeconfig.clone(),
        context: cli.context.clone(),
        namespace: cli.namespace.clone(),
    };
    let (client, namespace) = connect(&connection).await?;
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
            let method = match method {
                Method::Logical => "Logical",
                Method::Physical => "Physical",
            };
            objects::backup(&backups, &cluster, method, wait.then_some(timeout)).await
        }
        PluginCommand::Restore(args) => restore(&clusters, client, &namespace, args).await,
        PluginCommand::Psql {
            cluster,
            replica,
            args,
        } => {
            let found = get_cluster(&clusters, &cluster, &namespace).await?;
            let target = pods::KubectlTarget {
                kubeconfig: cli.kubeconfig.as_deref(),
                context: cli.context.as_deref(),
                namespace: &namespace,
            };
            psql(&target, &found, replica, &args)
        }
        PluginCommand::Logs {
            cluster,
            follow,
            tail,
        } => {
            get_cluster(&clusters, &cluster, &namespace).await?;
            let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client, &namespace);
            pods::logs(&pods, &cluster, follow, tail).await
        }
        PluginCommand::Completion { .. } => Ok(()),
    }
}

/// Restores into the cluster `args` names, if it exists.
async fn restore(
    clusters: &Api<PostgreSQLCluster>,
    client: Client,
    namespace: &str,
    args: RestoreArgs,
) -> anyhow::Result<()> {
    get_cluster(clusters, &args.cluster, namespace).await?;
    let request = objects::RestoreRequest {
        cluster: &args.cluster,
        backup: args.backup.as_deref(),
        point_in_time: args.point_in_time,
        target_time: args.target_time.as_deref(),
        databases: &args.databases,
        drop_existing: args.drop_existing,
    };
    let restores = Api::<PostgreSQLRestore>::namespaced(client, namespace);
    objects::restore(&restores, &request, args.wait.then_some(args.timeout)).await
}

/// Runs psql in the primary's pod of `cluster`, or a replica's.
fn psql(
    target: &pods::KubectlTarget<'_>,
    cluster: &PostgreSQLCluster,
    replica: bool,
    args: &[String],
) -> anyhow::Result<()> {
    let pod = pods::psql_pod(cluster, replica)?;
    let status = pods::psql(target, &pod, args)?;
    anyhow::ensure!(status.success(), "psql in {pod} ended with {status}");
    Ok(())
}

/// Where to connect: the kubeconfig, context and namespace flags.
struct Connection {
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
    namespace: Option<String>,
}

/// A client of the kubeconfig's cluster, and the namespace to act in.
async fn connect(cli: &Connection) -> anyhow::Result<(Client, String)> {
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
    best_replica(cluster)
        .with_context(|| format!("no ready replica to switch over to ({})", names(&replicas)))
}

/// The ready replica with the least lag, if any.
fn best_replica(cluster: &PostgreSQLCluster) -> Option<String> {
    cluster
        .status
        .iter()
        .flat_map(|status| &status.instances)
        .filter(|instance| instance.role == InstanceRole::Replica && instance.ready)
        .min_by_key(|instance| instance.lag_bytes.unwrap_or(i64::MAX))
        .map(|instance| instance.name.clone())
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
