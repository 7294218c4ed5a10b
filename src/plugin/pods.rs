//! The plugin's commands that reach the instances' pods: `psql` (through `kubectl exec`, so that
//! a terminal works as with kubectl itself) and `logs` (the PostgreSQL containers' logs of every
//! instance, each line prefixed with its pod).

use std::process::ExitStatus;

use futures::{AsyncBufReadExt as _, StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, LogParams};
use pgkube_crds::PostgreSQLCluster;

/// The instances' PostgreSQL container.
const CONTAINER: &str = "postgresql";

/// The kubectl flags that pick the cluster and namespace the plugin was given.
pub struct KubectlTarget<'a> {
    pub kubeconfig: Option<&'a std::path::Path>,
    pub context: Option<&'a str>,
    pub namespace: &'a str,
}

/// The pod `psql` runs in: the primary, or with `replica` a ready replica.
pub fn psql_pod(cluster: &PostgreSQLCluster, replica: bool) -> anyhow::Result<String> {
    let status = cluster.status.as_ref();
    let name = cluster.metadata.name.as_deref().unwrap_or_default();
    if !replica {
        return status
            .and_then(|status| status.current_primary.clone())
            .ok_or_else(|| anyhow::anyhow!("cluster {name} has no primary yet"));
    }
    super::best_replica(cluster)
        .ok_or_else(|| anyhow::anyhow!("cluster {name} has no ready replica"))
}

/// The `kubectl` arguments that run `psql` as the superuser in `pod`, over its local socket,
/// with `args` after pgkube's; interactive when this process has a terminal.
pub fn psql_arguments(
    target: &KubectlTarget<'_>,
    pod: &str,
    terminal: bool,
    args: &[String],
) -> Vec<String> {
    let mut arguments = Vec::new();
    if let Some(kubeconfig) = target.kubeconfig {
        arguments.push(format!("--kubeconfig={}", kubeconfig.display()));
    }
    if let Some(context) = target.context {
        arguments.push(format!("--context={context}"));
    }
    arguments.extend(["--namespace".to_owned(), target.namespace.to_owned()]);
    arguments.extend(["exec".to_owned(), "-i".to_owned()]);
    if terminal {
        arguments.push("-t".to_owned());
    }
    arguments.extend([pod, "-c", CONTAINER, "--", "psql", "-U", "postgres"].map(str::to_owned));
    arguments.extend(args.iter().cloned());
    arguments
}

/// Runs `psql` in `pod` through `kubectl exec`, returning its exit status.
pub fn psql(target: &KubectlTarget<'_>, pod: &str, args: &[String]) -> anyhow::Result<ExitStatus> {
    use std::io::IsTerminal as _;
    let terminal = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let arguments = psql_arguments(target, pod, terminal, args);
    std::process::Command::new("kubectl")
        .args(&arguments)
        .status()
        .map_err(|error| anyhow::anyhow!("cannot run kubectl: {error}"))
}

/// Prints the PostgreSQL logs of every instance of `cluster`, each line as `[<pod>] <line>`;
/// with `follow`, until every stream ends.
pub async fn logs(
    pods: &Api<Pod>,
    cluster: &str,
    follow: bool,
    tail: Option<i64>,
) -> anyhow::Result<()> {
    let selector =
        format!("app.kubernetes.io/name=postgresql,app.kubernetes.io/instance={cluster}");
    let mut names: Vec<String> = pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        .filter_map(|pod| pod.metadata.name)
        .collect();
    anyhow::ensure!(!names.is_empty(), "cluster {cluster} has no pods");
    names.sort();
    let params = LogParams {
        container: Some(CONTAINER.to_owned()),
        follow,
        tail_lines: tail,
        ..LogParams::default()
    };
    let mut streams = Vec::new();
    for name in names {
        let lines = pods.log_stream(&name, &params).await?.lines();
        let prefix = format!("[{name}] ");
        streams.push(lines.map_ok(move |line| format!("{prefix}{line}")).boxed());
    }
    // Without follow each stream ends at once: one pod after another reads best.
    let mut merged = match follow {
        true => futures::stream::select_all(streams).boxed(),
        false => futures::stream::iter(streams).flatten().boxed(),
    };
    while let Some(line) = merged.try_next().await? {
        println!("{line}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psql_runs_as_the_superuser_in_the_postgresql_container_with_the_users_arguments() {
        let target = KubectlTarget {
            kubeconfig: Some(std::path::Path::new("/etc/kube.conf")),
            context: Some("prod"),
            namespace: "shop",
        };
        let arguments = psql_arguments(
            &target,
            "db-postgresql-1",
            false,
            &["-c".to_owned(), "SELECT 1".to_owned()],
        );
        assert_eq!(
            arguments,
            [
                "--kubeconfig=/etc/kube.conf",
                "--context=prod",
                "--namespace",
                "shop",
                "exec",
                "-i",
                "db-postgresql-1",
                "-c",
                "postgresql",
                "--",
                "psql",
                "-U",
                "postgres",
                "-c",
                "SELECT 1",
            ]
        );
        let local = KubectlTarget {
            kubeconfig: None,
            context: None,
            namespace: "shop",
        };
        assert!(psql_arguments(&local, "p", true, &[]).contains(&"-t".to_owned()));
    }

    #[test]
    fn psql_goes_to_the_primary_or_a_ready_replica() {
        let cluster: PostgreSQLCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "db.example.com/v1beta1",
            "kind": "PostgreSQLCluster",
            "metadata": {"name": "db"},
            "spec": {"storage": {"size": "1Gi"}},
            "status": {"currentPrimary": "db-postgresql-0", "instances": [
                {"name": "db-postgresql-0", "role": "primary", "ready": true},
                {"name": "db-postgresql-1", "role": "replica", "ready": false},
                {"name": "db-postgresql-2", "role": "replica", "ready": true, "lagBytes": 5},
            ]},
        }))
        .expect("a cluster");
        assert_eq!(
            psql_pod(&cluster, false).expect("primary"),
            "db-postgresql-0"
        );
        assert_eq!(
            psql_pod(&cluster, true).expect("replica"),
            "db-postgresql-2"
        );
        let mut alone = cluster.clone();
        if let Some(status) = alone.status.as_mut() {
            status.instances.truncate(2);
        }
        assert!(psql_pod(&alone, true).is_err());
    }
}
